//! The `token` subresource of ServiceAccounts (upstream's `TokenREST`): a posted TokenRequest asks
//! for a token of the service account, bound to a pod, a secret or a node when it names one. The
//! registry checks the request and the objects it names and says what the token may claim; the API
//! signs it (`api::sa_token`).

use serde_json::{Value, json};

use super::error::GroupResource;
use super::validation::FieldError;
use super::{Registry, Result, StatusError, strategy};

/// `TokenRequestSpec`'s default lifetime.
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// The lifetime ServiceAccount admission asks for in `kube-api-access-*` volumes
/// (`WarnOnlyBoundTokenExpirationSeconds`): such tokens are extended, with a warning time.
pub const KUBE_API_ACCESS_EXPIRATION_SECONDS: i64 = 3607;
/// How long an extended token lives (`ExpirationExtensionSeconds`: a year).
const EXTENDED_EXPIRATION_SECONDS: i64 = 365 * 24 * 3600;

/// What TokenRequests are held to (kube-apiserver's `--api-audiences`,
/// `--service-account-max-token-expiration`, `--service-account-extend-token-expiration`).
#[derive(Debug, Clone, Default)]
pub struct TokenPolicy {
    /// The audiences the API accepts, and the default of a request naming none.
    pub audiences: Vec<String>,
    pub max_expiration_seconds: Option<i64>,
    pub extend_expiration: bool,
}

/// A service account or an object a token is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub name: String,
    pub uid: String,
}

/// What a token may claim, once its request was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    pub namespace: String,
    pub service_account: Bound,
    pub audiences: Vec<String>,
    /// From issue to expiry.
    pub lifetime_seconds: i64,
    /// For an extended token: when, after its issue, its holder should have a fresh one.
    pub warn_after_seconds: Option<i64>,
    pub pod: Option<Bound>,
    pub secret: Option<Bound>,
    /// The Node a token is bound to, or its pod's node.
    pub node: Option<Bound>,
}

fn resource(plural: &str) -> GroupResource {
    GroupResource { group: String::new(), resource: plural.into() }
}

impl Registry {
    /// A core object as stored, or 404.
    pub(super) fn live(&self, plural: &str, ns: Option<&str>, name: &str) -> Result<Value> {
        let r = self.find("", "v1", plural).ok_or_else(|| StatusError::internal(format!("{plural} are not served")))?;
        self.get_value(&r, ns, name)
    }

    /// `POST serviceaccounts/{name}/token`: the request with its defaults, and what its token may
    /// claim. `node` is the node asking, if one is (NodeRestriction: only for its own pods).
    pub fn token_request(
        &self,
        ns: &str,
        name: &str,
        request: &Value,
        policy: &TokenPolicy,
        node: Option<&str>,
    ) -> Result<(Value, TokenGrant)> {
        if let Some(kind) = request.get("kind").and_then(Value::as_str)
            && kind != "TokenRequest"
        {
            return Err(StatusError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind (TokenRequest)"
            )));
        }
        let spec = &request["spec"];
        let expiration = match spec.get("expirationSeconds").filter(|v| !v.is_null()) {
            None => DEFAULT_EXPIRATION_SECONDS,
            Some(v) => v.as_i64().ok_or_else(|| {
                StatusError::bad_request(format!("spec.expirationSeconds must be a whole number of seconds, not {v}"))
            })?,
        };
        let invalid = |detail: &str| {
            let error = FieldError::invalid_raw("spec.expirationSeconds", expiration, detail);
            StatusError::invalid("TokenRequest", "authentication.k8s.io", name, &[error])
        };
        if expiration < MIN_EXPIRATION_SECONDS {
            return Err(invalid("may not specify a duration less than 10 minutes"));
        }
        if expiration > MAX_EXPIRATION_SECONDS {
            return Err(invalid("may not specify a duration larger than 2^32 seconds"));
        }
        let mut audiences: Vec<String> =
            spec["audiences"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)).collect();
        if audiences.is_empty() {
            audiences = policy.audiences.clone();
        }

        let sa = self.live("serviceaccounts", Some(ns), name)?;
        let uid_of = |v: &Value| strategy::str_at(v, &["metadata", "uid"]).unwrap_or_default();
        let mut grant = TokenGrant {
            namespace: ns.to_string(),
            service_account: Bound { name: name.to_string(), uid: uid_of(&sa) },
            audiences: audiences.clone(),
            lifetime_seconds: expiration,
            warn_after_seconds: None,
            pod: None,
            secret: None,
            node: None,
        };

        let bound = &spec["boundObjectRef"];
        let forbid = |why: &str| Err(StatusError::forbidden(&resource("serviceaccounts"), name, why));
        let kind = bound["kind"].as_str().unwrap_or_default();
        let bound_name = bound["name"].as_str().unwrap_or_default();
        let bound_uid = bound["uid"].as_str().unwrap_or_default();
        if node.is_some() && (kind != "Pod" || bound["apiVersion"] != "v1" || bound_name.is_empty()) {
            return forbid("node requested token not bound to a pod");
        }
        if node.is_some() && bound_uid.is_empty() {
            return forbid("node requested token with a pod binding without a uid");
        }
        if !bound.is_null() {
            let api_version = bound["apiVersion"].as_str().unwrap_or_default();
            let (plural, namespaced) = match (api_version, kind) {
                ("v1", "Pod") => ("pods", true),
                ("v1", "Secret") => ("secrets", true),
                ("v1", "Node") => ("nodes", false),
                _ => {
                    let group_version = if api_version.contains('/') { api_version } else { "/v1" };
                    return Err(StatusError::bad_request(format!(
                        "cannot bind token to object of type {group_version}, Kind={kind}"
                    )));
                }
            };
            let object = self.live(plural, namespaced.then_some(ns), bound_name)?;
            let uid = uid_of(&object);
            if !bound_uid.is_empty() && bound_uid != uid {
                let why = format!(
                    "the UID in the bound object reference ({bound_uid}) does not match the UID in record. The object might have been deleted and then recreated"
                );
                return match node {
                    Some(_) => forbid(&why),
                    None => Err(StatusError::conflict(&resource(kind), bound_name, why)),
                };
            }
            let reference = Bound { name: bound_name.to_string(), uid };
            match plural {
                "pods" => {
                    let runs_as = strategy::str_at(&object, &["spec", "serviceAccountName"]).unwrap_or_default();
                    if runs_as != name {
                        return Err(StatusError::bad_request(format!(
                            "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                        )));
                    }
                    let pod_node = strategy::str_at(&object, &["spec", "nodeName"]).unwrap_or_default();
                    if node.is_some_and(|n| n != pod_node) {
                        return forbid("node requested token bound to a pod scheduled on a different node");
                    }
                    if !pod_node.is_empty()
                        && let Ok(n) = self.live("nodes", None, &pod_node)
                    {
                        grant.node = Some(Bound { name: pod_node, uid: uid_of(&n) });
                    }
                    grant.pod = Some(reference);
                }
                "secrets" => grant.secret = Some(reference),
                _ => grant.node = Some(reference),
            }
        }

        let mut expiration = expiration;
        if let Some(max) = policy.max_expiration_seconds.filter(|m| *m > 0 && expiration > *m) {
            expiration = max;
            grant.lifetime_seconds = max;
        }
        // Tokens of kube-api-access volumes live a year, for clients that never reread them; the
        // token says when it should have been replaced.
        let for_the_api = audiences.iter().all(|a| policy.audiences.contains(a));
        if policy.extend_expiration
            && grant.pod.is_some()
            && expiration == KUBE_API_ACCESS_EXPIRATION_SECONDS
            && for_the_api
        {
            grant.warn_after_seconds = Some(expiration);
            grant.lifetime_seconds = EXTENDED_EXPIRATION_SECONDS;
        }

        let mut answer = json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
            "spec": {"audiences": audiences, "expirationSeconds": expiration},
        });
        if !bound.is_null() {
            answer["spec"]["boundObjectRef"] = bound.clone();
        }
        Ok((answer, grant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{WriteOptions, store_for_tests};

    async fn registry() -> (tempfile::TempDir, Registry) {
        let (dir, reg) = store_for_tests();
        crate::registry::bootstrap::system_namespaces(&reg).await.expect("namespaces");
        crate::registry::service_account_admission::default_accounts(&reg).await;
        for obj in [
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                "spec": {"nodeName": "a", "containers": [{"name": "c", "image": "busybox"}]}}),
        ] {
            let plural = if obj["kind"] == "Node" { "nodes" } else { "pods" };
            let r = reg.find("", "v1", plural).unwrap();
            let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
            reg.create(&r, ns.as_deref(), obj, &WriteOptions::default()).await.unwrap();
        }
        (dir, reg)
    }

    fn policy() -> TokenPolicy {
        TokenPolicy {
            audiences: vec!["https://kubernetes.default.svc.cluster.local".into()],
            extend_expiration: true,
            ..Default::default()
        }
    }

    fn uid(reg: &Registry, plural: &str, ns: Option<&str>, name: &str) -> String {
        reg.live(plural, ns, name).unwrap()["metadata"]["uid"].as_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn requests_are_defaulted_bound_and_checked() {
        let (_d, reg) = registry().await;
        let (answer, grant) = reg.token_request("default", "default", &json!({}), &policy(), None).unwrap();
        assert_eq!(answer["spec"]["expirationSeconds"], 3600);
        assert_eq!(answer["spec"]["audiences"], json!(["https://kubernetes.default.svc.cluster.local"]));
        assert_eq!((grant.lifetime_seconds, grant.pod.as_ref()), (3600, None));
        assert_eq!(grant.service_account.uid, uid(&reg, "serviceaccounts", Some("default"), "default"));

        // Bound to a pod: the pod and its node are in the grant; the kube-api-access lifetime is extended.
        let pod_uid = uid(&reg, "pods", Some("default"), "p");
        let bound = json!({"spec": {"expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod_uid}}});
        let (_, grant) = reg.token_request("default", "default", &bound, &policy(), Some("a")).unwrap();
        assert_eq!(grant.pod, Some(Bound { name: "p".into(), uid: pod_uid.clone() }));
        assert_eq!(grant.node.as_ref().map(|n| n.name.as_str()), Some("a"));
        assert_eq!((grant.lifetime_seconds, grant.warn_after_seconds), (EXTENDED_EXPIRATION_SECONDS, Some(3607)));

        let message = |body: Value, node: Option<&str>| {
            reg.token_request("default", "default", &body, &policy(), node).map(|_| ()).unwrap_err().message
        };
        assert_eq!(
            message(json!({"spec": {"expirationSeconds": 60}}), None),
            "TokenRequest.authentication.k8s.io \"default\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"
        );
        assert!(message(json!({"spec": {}}), Some("a")).ends_with("node requested token not bound to a pod"));
        assert!(
            message(bound.clone(), Some("b"))
                .ends_with("node requested token bound to a pod scheduled on a different node")
        );
        let stale = json!({"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "old"}}});
        assert!(message(stale, None).contains("the UID in the bound object reference (old) does not match"));
        let odd = json!({"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x"}}});
        assert_eq!(message(odd, None), "cannot bind token to object of type /v1, Kind=ConfigMap");
        assert_eq!(
            reg.token_request("default", "ghost", &json!({}), &policy(), None).unwrap_err().message,
            "serviceaccounts \"ghost\" not found"
        );
    }
}
