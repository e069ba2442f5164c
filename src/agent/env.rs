//! A container's environment, as kubelet's `makeEnvironmentVariables`: `envFrom` first, then `env`
//! in order, each `value` expanded against what is defined so far; later definitions of a name
//! replace earlier ones (keeping the first one's position).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, ObjectFieldSelector, Pod, Secret};

use crate::volumes::downward::{field_path, resource_value};
use crate::volumes::{NodeResources, Objects};

/// Name and value, in definition order.
pub type EnvVars = Vec<(String, String)>;

/// The Event reason for `SkippedKeys`.
pub const INVALID_ENV_NAMES_REASON: &str = "InvalidEnvironmentVariableNames";

/// Why a container's environment cannot be built; `Display` is upstream's message, shown as the
/// `CreateContainerConfigError` waiting reason's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("configmap \"{0}\" not found")]
    ConfigMapNotFound(String),
    #[error("secret \"{0}\" not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKey { key: String, namespace: String, name: String },
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKey { key: String, namespace: String, name: String },
    /// An unsupported or invalid `fieldRef` / `resourceFieldRef`.
    #[error("{0}")]
    Selector(String),
}

/// Keys of one `envFrom` source left out because they are not valid variable names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedKeys {
    /// `configMap` or `secret`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Sorted, with the prefix applied.
    pub keys: Vec<String>,
}

impl SkippedKeys {
    /// The Warning Event's message (reason `INVALID_ENV_NAMES_REASON`).
    pub fn message(&self) -> String {
        format!(
            "Keys [{}] from the EnvFrom {} {}/{} were skipped since they are considered invalid environment variable names.",
            self.keys.join(", "),
            self.kind,
            self.namespace,
            self.name
        )
    }
}

/// The environment in definition order, and the `envFrom` keys that were skipped.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    objects: &dyn Objects,
    node: &NodeResources,
) -> Result<(EnvVars, Vec<SkippedKeys>), EnvError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env = Env::default();
    // Service variables first, so that `env` may refer to and override them (kubelet's mapping).
    for (name, value) in super::service_env::pod_service_env(pod, objects.services()) {
        env.set(name, value);
    }
    let mut skipped = Vec::new();
    let mut config_maps: HashMap<String, ConfigMap> = HashMap::new();
    let mut secrets: HashMap<String, Secret> = HashMap::new();

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, values): (_, _, Vec<(String, String)>) = if let Some(r) = &from.config_map_ref {
            let Some(cm) = cached(&mut config_maps, &r.name, r.optional, || objects.config_map(ns, &r.name))
                .map_err(|()| EnvError::ConfigMapNotFound(r.name.clone()))?
            else {
                continue;
            };
            ("configMap", &r.name, cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect())
        } else if let Some(r) = &from.secret_ref {
            let Some(s) = cached(&mut secrets, &r.name, r.optional, || objects.secret(ns, &r.name))
                .map_err(|()| EnvError::SecretNotFound(r.name.clone()))?
            else {
                continue;
            };
            let data = s.data.iter().flatten();
            ("secret", &r.name, data.map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned())).collect())
        } else {
            continue;
        };
        let mut invalid = Vec::new();
        for (key, value) in values {
            let key = format!("{prefix}{key}");
            if is_env_var_name(&key) {
                env.set(key, value);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            skipped.push(SkippedKeys { kind, namespace: ns.to_string(), name: name.clone(), keys: invalid });
        }
    }

    for var in container.env.iter().flatten() {
        let value = var.value.as_deref().unwrap_or("");
        let Some(from) = var.value_from.as_ref().filter(|_| value.is_empty()) else {
            let expanded =
                expand_with(value, |name| env.get(name).map_or_else(|| format!("$({name})"), str::to_string));
            env.set(var.name.clone(), expanded);
            continue;
        };
        let value = if let Some(f) = &from.field_ref {
            pod_field(pod, f).map_err(EnvError::Selector)?
        } else if let Some(r) = &from.resource_field_ref {
            resource_value(r, pod, Some(container), node).map_err(EnvError::Selector)?
        } else if let Some(r) = &from.config_map_key_ref {
            let Some(cm) = cached(&mut config_maps, &r.name, r.optional, || objects.config_map(ns, &r.name))
                .map_err(|()| EnvError::ConfigMapNotFound(r.name.clone()))?
            else {
                continue;
            };
            match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => v.clone(),
                None if r.optional == Some(true) => continue,
                None => {
                    return Err(EnvError::ConfigMapKey {
                        key: r.key.clone(),
                        namespace: ns.to_string(),
                        name: r.name.clone(),
                    });
                }
            }
        } else if let Some(r) = &from.secret_key_ref {
            let Some(s) = cached(&mut secrets, &r.name, r.optional, || objects.secret(ns, &r.name))
                .map_err(|()| EnvError::SecretNotFound(r.name.clone()))?
            else {
                continue;
            };
            match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                None if r.optional == Some(true) => continue,
                None => {
                    return Err(EnvError::SecretKey {
                        key: r.key.clone(),
                        namespace: ns.to_string(),
                        name: r.name.clone(),
                    });
                }
            }
        } else {
            String::new()
        };
        env.set(var.name.clone(), value);
    }
    Ok((env.vars, skipped))
}

/// An object looked up once per call: `Ok(None)` when missing and optional, `Err(())` when missing.
fn cached<T: Clone>(
    cache: &mut HashMap<String, T>,
    name: &str,
    optional: Option<bool>,
    get: impl FnOnce() -> Option<T>,
) -> Result<Option<T>, ()> {
    if let Some(obj) = cache.get(name) {
        return Ok(Some(obj.clone()));
    }
    match get() {
        Some(obj) => {
            cache.insert(name.to_string(), obj.clone());
            Ok(Some(obj))
        }
        None if optional == Some(true) => Ok(None),
        None => Err(()),
    }
}

/// Variables in first-definition order; a redefinition replaces the value in place.
#[derive(Default)]
struct Env {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Env {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }
    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }
}

/// Relaxed environment variable names (GA since 1.34): printable ASCII other than `=`.
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|c| (0x20..=0x7e).contains(&c) && c != b'=')
}

/// `podFieldSelectorRuntimeValue`: pod metadata, spec and status fields for `fieldRef`. The IPs
/// come from `pod.status`, which the agent fills before building the environment.
fn pod_field(pod: &Pod, sel: &ObjectFieldSelector) -> Result<String, String> {
    let version = sel.api_version.as_deref().unwrap_or("v1");
    if version != "v1" && !version.is_empty() {
        return Err(format!("unsupported pod version: {version}"));
    }
    let path = sel.field_path.as_str();
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let pod_ips: Vec<String> =
        status.and_then(|s| s.pod_ips.as_ref()).into_iter().flatten().map(|ip| ip.ip.clone()).collect();
    let host_ips: Vec<String> =
        status.and_then(|s| s.host_ips.as_ref()).into_iter().flatten().map(|ip| ip.ip.clone()).collect();
    Ok(match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" => {
            host_ips.first().cloned().or_else(|| status.and_then(|s| s.host_ip.clone())).unwrap_or_default()
        }
        "status.hostIPs" if host_ips.is_empty() => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.hostIPs" => host_ips.join(","),
        "status.podIP" => {
            pod_ips.first().cloned().or_else(|| status.and_then(|s| s.pod_ip.clone())).unwrap_or_default()
        }
        "status.podIPs" if pod_ips.is_empty() => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        _ => return field_path(pod, path),
    })
}

/// Expands `$(VAR)` references in `s` (command and args) against `env`, as upstream: `$$` is an
/// escaped `$`, references to undefined variables and unterminated ones are kept literally.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    expand_with(s, |name| match env.iter().rev().find(|(k, _)| k == name) {
        Some((_, v)) => v.clone(),
        None => format!("$({name})"),
    })
}

/// upstream's `expansion.Expand` with a mapping function.
pub(crate) fn expand_with(input: &str, mut mapping: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let Some(next) = after.chars().next() else {
            // A trailing `$` is kept.
            out.push('$');
            rest = after;
            break;
        };
        match next {
            '$' => {
                out.push('$');
                rest = &after[1..];
            }
            '(' => match after.find(')') {
                Some(end) => {
                    out.push_str(&mapping(&after[1..end]));
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            c => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
    use serde_json::{Value, json};

    use super::*;

    #[derive(Default)]
    struct Fake {
        config_maps: BTreeMap<String, ConfigMap>,
        secrets: BTreeMap<String, Secret>,
    }

    impl Objects for Fake {
        fn config_map(&self, ns: &str, name: &str) -> Option<ConfigMap> {
            assert_eq!(ns, "ns");
            self.config_maps.get(name).cloned()
        }
        fn secret(&self, ns: &str, name: &str) -> Option<Secret> {
            assert_eq!(ns, "ns");
            self.secrets.get(name).cloned()
        }
    }

    fn fake() -> Fake {
        let cm = |data: Value| serde_json::from_value(json!({"data": data})).unwrap();
        let secret = |data: &[(&str, &str)]| Secret {
            data: Some(
                data.iter().map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.as_bytes().to_vec()))).collect(),
            ),
            ..Default::default()
        };
        Fake {
            config_maps: [
                ("cfg".to_string(), cm(json!({"HOST": "db", "PORT": "5432", "1BAD": "x", "has=eq": "y"}))),
                ("other".to_string(), cm(json!({"HOST": "other-db"}))),
            ]
            .into(),
            secrets: [("creds".to_string(), secret(&[("PASSWORD", "hunter2"), ("user", "admin")]))].into(),
        }
    }

    fn node() -> NodeResources {
        NodeResources {
            cpu_milli: 2000,
            memory_bytes: 4 << 30,
            ephemeral_storage_bytes: 10 << 30,
            ..Default::default()
        }
    }

    fn pod_with(container: Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "u-1",
                         "labels": {"app": "web"}, "annotations": {"example.com/a": "b"}},
            "spec": {"nodeName": "edge-1", "serviceAccountName": "sa", "containers": [container]},
            "status": {"podIP": "10.42.0.7", "podIPs": [{"ip": "10.42.0.7"}, {"ip": "fd00::7"}],
                       "hostIP": "192.168.1.10", "hostIPs": [{"ip": "192.168.1.10"}, {"ip": "fd01::10"}]}
        }))
        .unwrap();
        let container = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, container)
    }

    fn env_of(container: Value) -> Result<(EnvVars, Vec<SkippedKeys>), EnvError> {
        let (pod, c) = pod_with(container);
        container_env(&pod, &c, &fake(), &node())
    }

    fn vars(container: Value) -> Vec<(String, String)> {
        env_of(container).unwrap().0
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn expansion_as_upstream() {
        let env = pairs(&[("VAR_A", "A"), ("VAR_B", "B"), ("VAR_C", "C"), ("VAR_REF", "$(VAR_A)"), ("VAR_EMPTY", "")]);
        let cases = [
            ("$(VAR_A)", "A"),
            ("$(VAR_A)-$(VAR_A)", "A-A"),
            ("$(VAR_A)-$(VAR_B)-$(VAR_B)-$(VAR_B)-$(VAR_A)", "A-B-B-B-A"),
            ("$(VAR_A)-1", "A-1"),
            ("___$(VAR_B)___", "___B___"),
            ("___$(VAR_C)", "___C"),
            ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
            ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
            ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
            ("f000-$$VAR_A", "f000-$VAR_A"),
            ("foo\\$(VAR_C)bar", "foo\\Cbar"),
            ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
            ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
            ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
            ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
            ("$(VAR_REF)", "$(VAR_A)"),
            ("%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"),
            ("foo$(VAR_EMPTY)bar", "foobar"),
            ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),
            ("f00__(VAR_A)__", "f00__(VAR_A)__"),
            ("$?_boo_$!", "$?_boo_$!"),
            ("$VAR_A", "$VAR_A"),
            ("$(VAR_DNE)", "$(VAR_DNE)"),
            ("$(VAR_DNE)$(VAR_DNE2)", "$(VAR_DNE)$(VAR_DNE2)"),
            ("$(foo$$var)", "$(foo$$var)"),
            ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
            ("$$$$$$(VAR_A)", "$$$(VAR_A)"),
            ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
            ("$$$$$$$(VAR_A)", "$$$A"),
            ("$$$$$$$$(VAR_A)", "$$$$(VAR_A)"),
            ("$(VAR_A)$(VAR_B)$(VAR_C)", "ABC"),
            ("$()", "$()"),
            ("trailing$", "trailing$"),
            ("$", "$"),
            ("$é", "$é"),
            ("\n", "\n"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &env), want, "input {input:?}");
        }
    }

    #[test]
    fn env_from_then_env_with_overrides_and_expansion() {
        let (env, skipped) = env_of(json!({"name": "app",
        "envFrom": [{"configMapRef": {"name": "cfg"}}, {"prefix": "S_", "secretRef": {"name": "creds"}},
                    {"configMapRef": {"name": "absent", "optional": true}}],
        "env": [
            {"name": "URL", "value": "postgres://$(S_user)@$(HOST):$(PORT)/$(LATER)"},
            {"name": "HOST", "value": "override"},
            {"name": "LATER", "value": "x"},
            {"name": "AGAIN", "value": "$(HOST) $$(HOST) $(URL)"},
            {"name": "EMPTY", "value": ""}
        ]}))
        .unwrap();
        assert_eq!(
            env,
            pairs(&[
                ("1BAD", "x"),
                ("HOST", "override"),
                ("PORT", "5432"),
                ("S_PASSWORD", "hunter2"),
                ("S_user", "admin"),
                ("URL", "postgres://admin@db:5432/$(LATER)"),
                ("LATER", "x"),
                ("AGAIN", "override $(HOST) postgres://admin@db:5432/$(LATER)"),
                ("EMPTY", ""),
            ])
        );
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].keys, vec!["has=eq".to_string()]);
        assert_eq!(
            skipped[0].message(),
            "Keys [has=eq] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names."
        );
    }

    #[test]
    fn field_refs() {
        let field = |path: &str| {
            let v =
                vars(json!({"name": "app", "env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": path}}}]}));
            v[0].1.clone()
        };
        assert_eq!(field("metadata.name"), "web-0");
        assert_eq!(field("metadata.namespace"), "ns");
        assert_eq!(field("metadata.uid"), "u-1");
        assert_eq!(field("metadata.labels['app']"), "web");
        assert_eq!(field("metadata.labels['missing']"), "");
        assert_eq!(field("metadata.annotations['example.com/a']"), "b");
        assert_eq!(field("spec.nodeName"), "edge-1");
        assert_eq!(field("spec.serviceAccountName"), "sa");
        assert_eq!(field("status.hostIP"), "192.168.1.10");
        assert_eq!(field("status.hostIPs"), "192.168.1.10,fd01::10");
        assert_eq!(field("status.podIP"), "10.42.0.7");
        assert_eq!(field("status.podIPs"), "10.42.0.7,fd00::7");
        let err = env_of(
            json!({"name": "app", "env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]}),
        );
        assert_eq!(err.unwrap_err().to_string(), "unsupported fieldPath: spec.bogus");
    }

    #[test]
    fn resource_field_refs() {
        let container = |resource: &str, divisor: Option<&str>| {
            json!({"name": "app",
                   "resources": {"limits": {"cpu": "1500m", "memory": "0"}, "requests": {"cpu": "250m", "memory": "100Mi"}},
                   "env": [{"name": "V", "valueFrom": {"resourceFieldRef": {"resource": resource, "divisor": divisor}}}]})
        };
        let value = |resource: &str, divisor: Option<&str>| vars(container(resource, divisor))[0].1.clone();
        assert_eq!(value("limits.cpu", None), "2", "1.5 cores rounded up");
        assert_eq!(value("limits.cpu", Some("1m")), "1500");
        assert_eq!(value("requests.cpu", Some("1m")), "250");
        assert_eq!(value("requests.cpu", Some("0")), "1");
        assert_eq!(value("requests.memory", None), "104857600");
        assert_eq!(value("requests.memory", Some("1Mi")), "100");
        assert_eq!(value("requests.memory", Some("1Gi")), "1");
        assert_eq!(value("limits.memory", Some("1Mi")), "4096", "zero limit defaults to node allocatable");
        assert_eq!(value("limits.ephemeral-storage", Some("1Gi")), "10");
        assert_eq!(value("requests.ephemeral-storage", None), "0");
        let err = env_of(container("limits.gpu", None)).unwrap_err();
        assert_eq!(err.to_string(), "unsupported container resource : limits.gpu");
    }

    #[test]
    fn key_refs_and_errors() {
        let key_ref = |kind: &str, name: &str, key: &str, optional: bool| {
            env_of(json!({"name": "app", "env": [
                {"name": "V", "valueFrom": {kind: {"name": name, "key": key, "optional": optional}}}]}))
        };
        assert_eq!(key_ref("configMapKeyRef", "cfg", "HOST", false).unwrap().0, pairs(&[("V", "db")]));
        assert_eq!(key_ref("secretKeyRef", "creds", "PASSWORD", false).unwrap().0, pairs(&[("V", "hunter2")]));
        let msg = |r: Result<_, EnvError>| r.unwrap_err().to_string();
        assert_eq!(msg(key_ref("configMapKeyRef", "x", "k", false)), "configmap \"x\" not found");
        assert_eq!(msg(key_ref("secretKeyRef", "x", "k", false)), "secret \"x\" not found");
        assert_eq!(msg(key_ref("configMapKeyRef", "cfg", "k", false)), "couldn't find key k in ConfigMap ns/cfg");
        assert_eq!(msg(key_ref("secretKeyRef", "creds", "k", false)), "couldn't find key k in Secret ns/creds");
        for (kind, name) in
            [("configMapKeyRef", "x"), ("configMapKeyRef", "cfg"), ("secretKeyRef", "x"), ("secretKeyRef", "creds")]
        {
            assert!(key_ref(kind, name, "k", true).unwrap().0.is_empty(), "{kind} {name} optional");
        }
        let from = |kind: &str| env_of(json!({"name": "app", "envFrom": [{kind: {"name": "x"}}]}));
        assert_eq!(msg(from("configMapRef")), "configmap \"x\" not found");
        assert_eq!(msg(from("secretRef")), "secret \"x\" not found");
    }
}
