//! Taint-based eviction (kube-controller-manager's `taint-eviction-controller`): a pod on a node
//! with `NoExecute` taints it does not tolerate is deleted at once; one that tolerates them all for
//! a while (`tolerationSeconds`, the smallest of the tolerations used) is deleted once that time
//! has passed since the controller saw it so, unless the taints go first; one that tolerates them
//! for ever stays. A deleted pod gets the `DisruptionTarget` condition first, as upstream's.
//!
//! The pending deletions live in memory, as upstream's timed queue: after a restart a pod's time
//! starts again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::runtime::{self, Error, Reconciler};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::scheduling::toleration_matches;

pub struct TaintEviction {
    client: Client,
    nodes: Cache<Node>,
    recorder: Recorder,
    /// Pod uid → when its deletion is due.
    pending: Mutex<HashMap<String, Instant>>,
}

/// Starts the controller on the shared pod and node watches.
pub fn spawn(client: &Client, pods: &mut Informer<Pod>, nodes: &mut Informer<Node>, shutdown: &CancellationToken) {
    let all = pods.cache();
    // A node's taints changing concerns every pod on it.
    let controller = Controller::for_shared_stream(pods.subscribe(), pods.cache()).watches_shared_stream(
        nodes.subscribe(),
        move |node| {
            let name = node.name_any();
            all.state()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
                .map(|p| ObjectRef::from_obj(&**p))
                .collect::<Vec<_>>()
        },
    );
    let reconciler = TaintEviction {
        client: client.clone(),
        nodes: nodes.cache(),
        recorder: Recorder::spawn(client.clone(), "taint-eviction-controller".into(), String::new()),
        pending: Mutex::new(HashMap::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// What the NoExecute taints mean for a pod with `tolerations`.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No NoExecute taint, or all tolerated for ever.
    Stay,
    Evict,
    /// Tolerated for this long (`getMinTolerationTime`).
    EvictAfter(Duration),
}

/// upstream's `GetMatchingTolerations` and `getMinTolerationTime`: each taint's first matching
/// toleration; the smallest `tolerationSeconds` among them (negative counts as zero).
fn verdict(taints: &[Taint], tolerations: &[Toleration]) -> Verdict {
    let mut least: Option<i64> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let Some(used) = tolerations.iter().find(|t| toleration_matches(t, taint)) else {
            return Verdict::Evict;
        };
        if let Some(secs) = used.toleration_seconds {
            least = Some(least.map_or(secs, |l| l.min(secs)));
        }
    }
    match least {
        None => Verdict::Stay,
        Some(secs) => Verdict::EvictAfter(Duration::from_secs(secs.max(0) as u64)),
    }
}

impl TaintEviction {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the pod's scheduled deletion; true if there was one.
    fn forget(&self, pod: &Pod) -> bool {
        self.pending().remove(&pod.uid().unwrap_or_default()).is_some()
    }

    fn cancel(&self, pod: &Pod) {
        if self.forget(pod) {
            let message =
                format!("Cancelling deletion of Pod {}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            self.recorder.record(EventObject::of(pod), EventType::Normal, "TaintManagerEviction", "", message);
        }
    }

    /// `addConditionAndDeletePod`, after the `TaintManagerEviction` event. A pending deletion
    /// stays scheduled until the pod is gone, so a failed call is retried without a new wait.
    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        tracing::info!("pod {ns}/{name}: deleted for a NoExecute taint of its node");
        let message = format!("Marking for deletion Pod {ns}/{name}");
        self.recorder.record(EventObject::of(pod), EventType::Normal, "TaintManagerEviction", "", message);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let condition = PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByTaintManager".into()),
            message: Some("Taint manager: deleting due to NoExecute taint".into()),
            last_transition_time: Some(Time(Timestamp::now())),
            ..Default::default()
        };
        let patch = json!({"metadata": {"uid": pod.uid()}, "status": {"conditions": [condition]}});
        let gone =
            |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409 || s.code == 422);
        match api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let params = DeleteParams {
            preconditions: pod.uid().map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Err(e) if !gone(&e) => return Err(e.into()),
            _ => {}
        }
        self.forget(pod);
        Ok(())
    }
}

impl Reconciler for TaintEviction {
    type Object = Pod;
    const NAME: &'static str = "taint-eviction";

    async fn synced(&self) -> bool {
        synced(&self.nodes).await
    }

    async fn reconcile(&self, pod: Arc<Pod>) -> Result<Action, Error> {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let taints = match self.nodes.get(&ObjectRef::new(&node)) {
            Some(n) if !node.is_empty() => n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default(),
            _ => Vec::new(),
        };
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            self.forget(&pod);
            return Ok(Action::await_change());
        }
        let now = Instant::now();
        let after = match verdict(&taints, &tolerations) {
            Verdict::Stay => {
                self.cancel(&pod);
                return Ok(Action::await_change());
            }
            Verdict::Evict => {
                // Deleted at once: whatever was scheduled is called off first, as upstream says.
                self.cancel(&pod);
                Duration::ZERO
            }
            Verdict::EvictAfter(d) => d,
        };
        // Tolerated for longer than this process can count: for ever.
        let Some(wanted) = now.checked_add(after) else {
            self.cancel(&pod);
            return Ok(Action::await_change());
        };
        // A deletion already scheduled keeps its time (upstream keeps the first timer).
        let due = *self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(pod.uid().unwrap_or_default())
            .or_insert(wanted);
        if due > now {
            return Ok(Action::requeue(due - now));
        }
        self.evict(&pod).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taints(value: serde_json::Value) -> Vec<Taint> {
        serde_json::from_value(value).unwrap()
    }
    fn tolerations(value: serde_json::Value) -> Vec<Toleration> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn tolerations_decide_when_a_pod_goes() {
        let unreachable = taints(json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]));
        assert_eq!(verdict(&unreachable, &[]), Verdict::Evict);
        let defaults = tolerations(json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]));
        assert_eq!(verdict(&unreachable, &defaults), Verdict::EvictAfter(Duration::from_secs(300)));
        assert_eq!(verdict(&unreachable, &tolerations(json!([{"operator": "Exists"}]))), Verdict::Stay);
        let both = taints(json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]));
        let some = tolerations(json!([
            {"key": "dedicated", "operator": "Equal", "value": "gpu", "tolerationSeconds": -5},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 30}]));
        assert_eq!(verdict(&both, &some), Verdict::EvictAfter(Duration::ZERO));
        assert_eq!(verdict(&both, &defaults), Verdict::Evict, "dedicated=gpu is not tolerated");
        assert_eq!(verdict(&taints(json!([{"key": "x", "effect": "NoSchedule"}])), &[]), Verdict::Stay);
    }
}
