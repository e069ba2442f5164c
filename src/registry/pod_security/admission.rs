//! Pod Security admission on the registry's writes (upstream's `PodSecurity` admission plugin):
//! a namespace's `pod-security.kubernetes.io/*` labels must be valid, and a stricter enforce level
//! warns about the pods already there; a pod is refused when it breaks its namespace's enforce
//! level and warned about its warn level; workloads with pod templates only get the warnings.
//! Audit annotations are logged at debug level: cairn keeps no audit log.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use serde_json::Value;

use super::{NamespaceCheck, POD_TEMPLATE_RESOURCES, Policy};
use crate::registry::kinds::NAMESPACES_STORAGE;
use crate::registry::{Registry, Resource, Result, StatusError, Subresource, parse_stored, strategy};

/// Labels of an object as JSON.
fn labels(obj: &Value) -> Option<std::collections::BTreeMap<String, String>> {
    serde_json::from_value(obj["metadata"]["labels"].clone()).ok()
}

/// The pod template of a workload object (`spec.template`, or a CronJob's job's).
fn template(plural: &str, obj: &Value) -> Option<PodTemplateSpec> {
    let t = match plural {
        "cronjobs" => &obj["spec"]["jobTemplate"]["spec"]["template"],
        "podtemplates" => &obj["template"],
        _ => &obj["spec"]["template"],
    };
    serde_json::from_value(t.clone()).ok()
}

impl Registry {
    /// The Pod Security policy of namespace `ns` (privileged when it has no labels, or is gone).
    fn pod_security_policy(&self, ns: &str) -> Policy {
        let stored = self.store.get(&format!("{NAMESPACES_STORAGE}/{ns}"));
        let namespace = stored.and_then(|o| parse_stored(&o).ok());
        Policy::from_labels(namespace.and_then(|n| labels(&n)).as_ref()).0
    }

    /// Admits a create (`old` is `None`) or update of `r`: the warnings for the response, or the
    /// refusal.
    pub(in crate::registry) fn admit_pod_security(
        &self,
        r: &Resource,
        new: &Value,
        old: Option<&Value>,
        subresource: Option<Subresource>,
    ) -> Result<Vec<String>> {
        let info = r.info();
        let name = strategy::str_at(new, &["metadata", "name"]).unwrap_or_default();
        match (info.group, info.plural) {
            ("", "namespaces") if subresource.is_none() => {
                let check = match old {
                    None => super::check_namespace_create(labels(new).as_ref()),
                    Some(old) => super::check_namespace_update(labels(old).as_ref(), labels(new).as_ref()),
                };
                match check {
                    NamespaceCheck::Allowed => Ok(Vec::new()),
                    NamespaceCheck::Invalid(errs) => {
                        let errs: Vec<_> = errs.into_iter().map(Into::into).collect();
                        Err(StatusError::invalid(info.kind, info.group, &name, &errs))
                    }
                    NamespaceCheck::CheckPods(level) => {
                        let listing = self.store.list(&format!("pods/{name}/"), None);
                        let pods: Vec<Pod> =
                            listing.items.iter().filter_map(|(_, o)| serde_json::from_slice(&o.data).ok()).collect();
                        Ok(super::existing_pods_warnings(&name, &level, &pods, super::NAMESPACE_MAX_PODS_TO_CHECK))
                    }
                }
            }
            ("", "pods") => {
                if subresource.is_some_and(|s| super::is_ignored_pod_subresource(s.name())) {
                    return Ok(Vec::new());
                }
                let ns = strategy::str_at(new, &["metadata", "namespace"]).unwrap_or_default();
                let policy = self.pod_security_policy(&ns);
                if policy.fully_privileged() {
                    return Ok(Vec::new());
                }
                let pod: Pod = serde_json::from_value(new.clone())
                    .map_err(|e| StatusError::bad_request(format!("the pod cannot be read: {e}")))?;
                let spec = pod.spec.clone().unwrap_or_default();
                if let Some(old) = old {
                    let old_spec: PodSpec = serde_json::from_value(old["spec"].clone()).unwrap_or_default();
                    if !super::is_significant_pod_update(&spec, &old_spec) {
                        return Ok(Vec::new());
                    }
                }
                let decision = super::evaluate_pod(&policy, &pod.metadata, &spec, true);
                if let Some(audit) = &decision.audit_violations {
                    tracing::debug!("pod {ns}/{name}: {audit}");
                }
                match decision.forbidden {
                    Some(why) => Err(StatusError::forbidden(&info.group_resource(), &name, why)),
                    None => Ok(decision.warnings),
                }
            }
            (group, plural) if subresource.is_none() && POD_TEMPLATE_RESOURCES.contains(&(group, plural)) => {
                let ns = strategy::str_at(new, &["metadata", "namespace"]).unwrap_or_default();
                let policy = self.pod_security_policy(&ns);
                let Some(t) = template(plural, new).filter(|_| !policy.fully_privileged()) else {
                    return Ok(Vec::new());
                };
                if old.is_some_and(|old| template(plural, old).as_ref() == Some(&t)) {
                    return Ok(Vec::new());
                }
                let decision =
                    super::evaluate_pod(&policy, &t.metadata.unwrap_or_default(), &t.spec.unwrap_or_default(), false);
                Ok(decision.warnings)
            }
            _ => Ok(Vec::new()),
        }
    }
}
