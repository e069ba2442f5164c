//! The subresources a kind serves, each with its own rules (upstream registers one REST storage
//! per subresource: `StatusREST`, `BindingREST`, `FinalizeREST`, `LogREST`): its name in URLs,
//! the verbs and response kind that discovery and OpenAPI show, and what an update through it may
//! change. A kind lists the ones it serves in its [`super::ResourceInfo`].

use serde_json::Value;

use super::strategy::ResourceInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// `status`: read, replace and patch of the object where only the status changes.
    Status,
    /// `binding`: a `Binding` posted to assign a pod to a node.
    Binding,
    /// `finalize`: a replace that changes only `spec.finalizers` (namespaces).
    Finalize,
    /// `log`: a container's log, read from its node.
    Log,
    /// `exec`, `attach`, `portforward`: streaming sessions with a pod's node (upstream's connect
    /// verbs, served as GET or POST upgrades).
    Exec,
    Attach,
    PortForward,
    /// `ephemeralcontainers`: read, replace and patch of a pod where only
    /// `spec.ephemeralContainers` changes (upstream's `EphemeralContainersREST`).
    EphemeralContainers,
    /// `proxy`: a request passed on to a node's endpoint (`nodes/{name}/proxy/{path}`).
    Proxy,
    /// `scale`: an `autoscaling/v1` Scale view of a workload's `spec.replicas` (see `scale.rs`).
    Scale,
    /// `eviction`: a `policy/v1` Eviction posted to delete a pod within its disruption budget
    /// (see `eviction.rs`).
    Eviction,
    /// `token`: an `authentication.k8s.io/v1` TokenRequest posted for a service account's token
    /// (see `token_request.rs`).
    Token,
    /// `approval`: read, replace and patch of a CertificateSigningRequest where only its Approved
    /// and Denied conditions change.
    Approval,
}

impl Subresource {
    const ALL: [Subresource; 13] = [
        Subresource::Status,
        Subresource::Binding,
        Subresource::Finalize,
        Subresource::Log,
        Subresource::Exec,
        Subresource::Attach,
        Subresource::PortForward,
        Subresource::EphemeralContainers,
        Subresource::Proxy,
        Subresource::Scale,
        Subresource::Eviction,
        Subresource::Token,
        Subresource::Approval,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Subresource::Status => "status",
            Subresource::Binding => "binding",
            Subresource::Finalize => "finalize",
            Subresource::Log => "log",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
            Subresource::EphemeralContainers => "ephemeralcontainers",
            Subresource::Proxy => "proxy",
            Subresource::Scale => "scale",
            Subresource::Eviction => "eviction",
            Subresource::Token => "token",
            Subresource::Approval => "approval",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The verbs discovery lists for it.
    pub fn verbs(self) -> &'static [&'static str] {
        match self {
            Subresource::Status | Subresource::EphemeralContainers | Subresource::Scale | Subresource::Approval => {
                &["get", "patch", "update"]
            }
            Subresource::Binding | Subresource::Eviction | Subresource::Token => &["create"],
            Subresource::Finalize => &["update"],
            Subresource::Log => &["get"],
            Subresource::Proxy => &["create", "delete", "get", "patch", "update"],
            Subresource::Exec | Subresource::Attach | Subresource::PortForward => &["create", "get"],
        }
    }

    /// Group, version and kind of what it answers with.
    pub fn response_kind(self, info: &ResourceInfo) -> (&'static str, &'static str, &'static str) {
        match self {
            Subresource::Binding => ("", "v1", "Binding"),
            Subresource::Log => ("", "v1", "Pod"),
            Subresource::Proxy => ("", "v1", "NodeProxyOptions"),
            Subresource::Scale => ("autoscaling", "v1", "Scale"),
            Subresource::Eviction => ("policy", "v1", "Eviction"),
            Subresource::Token => ("authentication.k8s.io", "v1", "TokenRequest"),
            Subresource::Exec => ("", "v1", "PodExecOptions"),
            Subresource::Attach => ("", "v1", "PodAttachOptions"),
            Subresource::PortForward => ("", "v1", "PodPortForwardOptions"),
            Subresource::Status | Subresource::Finalize | Subresource::EphemeralContainers | Subresource::Approval => {
                (info.group, info.version, info.kind)
            }
        }
    }

    /// Whether the kind's strategy judges an update through it (`status` as a status-only update,
    /// `ephemeralcontainers` by the kind's own rule); otherwise [`Self::updated`] alone decides what
    /// changes.
    pub fn uses_update_strategy(self) -> bool {
        matches!(self, Subresource::Status | Subresource::EphemeralContainers | Subresource::Approval)
    }

    /// The object an update through a subresource that does not use the update strategy writes:
    /// `finalize` takes only `spec.finalizers` from `new`; `binding` writes what the registry built.
    pub fn updated(self, new: Value, old: &Value) -> Value {
        match self {
            Subresource::Finalize => {
                let mut kept = old.clone();
                match new.get("spec").and_then(|s| s.get("finalizers")) {
                    Some(f) => kept["spec"]["finalizers"] = f.clone(),
                    None => {
                        if let Some(spec) = kept.get_mut("spec").and_then(Value::as_object_mut) {
                            spec.remove("finalizers");
                        }
                    }
                }
                kept
            }
            Subresource::Binding
            | Subresource::Status
            | Subresource::Log
            | Subresource::Exec
            | Subresource::Attach
            | Subresource::PortForward
            | Subresource::EphemeralContainers
            | Subresource::Proxy
            | Subresource::Scale
            | Subresource::Eviction
            | Subresource::Token
            | Subresource::Approval => new,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_round_trip() {
        for sub in Subresource::ALL {
            assert_eq!(Subresource::parse(sub.name()), Some(sub));
        }
        assert_eq!(Subresource::parse("scales"), None);
    }

    #[test]
    fn finalize_changes_only_the_finalizers() {
        let old = json!({"metadata": {"name": "ns", "labels": {"a": "1"}}, "spec": {"finalizers": ["kubernetes"]},
                         "status": {"phase": "Terminating"}});
        let new = json!({"metadata": {"name": "ns", "labels": {"a": "2"}}, "spec": {"finalizers": []},
                         "status": {"phase": "Active"}});
        let kept = Subresource::Finalize.updated(new, &old);
        assert_eq!(kept["spec"]["finalizers"], json!([]));
        assert_eq!(kept["metadata"]["labels"]["a"], "1");
        assert_eq!(kept["status"]["phase"], "Terminating");
        let dropped = Subresource::Finalize.updated(json!({"spec": {}}), &old);
        assert!(dropped["spec"].get("finalizers").is_none());
    }
}
