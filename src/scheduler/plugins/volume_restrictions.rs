//! VolumeRestrictions (upstream's plugin of that name): a `ReadWriteOncePod` claim is used by one pod
//! in the whole cluster at a time, and two pods on one node may not mount the same in-tree disk
//! (GCE PD, EBS, iSCSI, RBD) unless every mount is read-only.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::scheduler::framework::{ClusterEvent, CycleState, Plugin, Point, PreFilterResult, Status};
use crate::scheduler::types::{NodeInfo, PodInfo};

pub const NAME: &str = "VolumeRestrictions";
const STATE: &str = "PreFilterVolumeRestrictions";

pub const ERR_DISK_CONFLICT: &str = "node(s) had no available disk";
pub const ERR_RWOP_CONFLICT: &str =
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod";

pub struct VolumeRestrictions {
    pub claims: Store<PersistentVolumeClaim>,
}

/// PreFilter's finding: how many pods already use the pod's `ReadWriteOncePod` claims.
struct Conflicts(usize);

fn is_rwop(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec.as_ref().and_then(|s| s.access_modes.as_ref()).is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
}

/// The pod's claims named by `persistentVolumeClaim` volumes (generic ephemeral claims are the pod's own).
fn named_claims(pod: &PodInfo) -> impl Iterator<Item = &str> {
    pod.claims.iter().filter(|c| !c.ephemeral).map(|c| c.name.as_str())
}

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter]
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> (Status, PreFilterResult) {
        let mut rwop = Vec::new();
        for name in named_claims(pod) {
            let Some(pvc) = self.claims.get(&ObjectRef::new(name).within(&pod.namespace)) else {
                return (Status::unresolvable(format!("persistentvolumeclaim \"{name}\" not found")), None);
            };
            if is_rwop(&pvc) {
                rwop.push(name);
            }
        }
        // upstream's `IsPVCUsedByPods`: any pod bound or assumed anywhere that still holds it.
        let conflicts = rwop
            .iter()
            .filter(|name| {
                nodes.iter().flat_map(|n| &n.pods).any(|other| {
                    other.uid != pod.uid
                        && !other.finished
                        && other.namespace == pod.namespace
                        && named_claims(other).any(|c| c == **name)
                })
            })
            .count();
        if pod.disks.is_empty() && conflicts == 0 {
            return (Status::skip(), None);
        }
        state.write(STATE, Conflicts(conflicts));
        (Status::success(), None)
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let on_node = node.pods.iter().filter(|p| p.uid != pod.uid).flat_map(|p| &p.disks);
        if on_node.clone().any(|d| pod.disks.iter().any(|mine| mine.conflicts(d))) {
            return Status::unschedulable(ERR_DISK_CONFLICT);
        }
        match state.read::<Conflicts>(STATE) {
            Some(Conflicts(n)) if *n > 0 => Status::unschedulable(ERR_RWOP_CONFLICT),
            _ => Status::success(),
        }
    }

    fn requeue(&self, pod: &PodInfo, event: &ClusterEvent) -> bool {
        match event {
            ClusterEvent::NodeAdded(_) | ClusterEvent::StorageChanged => true,
            ClusterEvent::AssignedPodRemoved { pod: gone, .. } => {
                gone.namespace == pod.namespace
                    && (named_claims(gone).any(|c| named_claims(pod).any(|m| m == c))
                        || gone.disks.iter().any(|d| pod.disks.iter().any(|mine| mine.conflicts(d))))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher;
    use serde_json::json;

    use super::*;
    use crate::scheduler::framework::Code;
    use crate::scheduler::types::NodeFacts;

    fn pod(name: &str, volumes: serde_json::Value) -> PodInfo {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes},
        }))
        .unwrap();
        PodInfo::from_pod(&pod)
    }

    fn claims(modes: &[(&str, &str)]) -> Store<PersistentVolumeClaim> {
        let (reader, mut writer) = store::<PersistentVolumeClaim>();
        for (name, mode) in modes {
            let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"accessModes": [mode]},
            }))
            .unwrap();
            writer.apply_watcher_event(&watcher::Event::Apply(pvc));
        }
        reader
    }

    fn node_with(pods: Vec<PodInfo>) -> Arc<NodeInfo> {
        let mut n = NodeInfo::new(NodeFacts { name: "n".into(), ..Default::default() });
        for p in pods {
            n.add_pod(Arc::new(p.on_node("n")));
        }
        Arc::new(n)
    }

    fn run(plugin: &VolumeRestrictions, pod: &PodInfo, node: &Arc<NodeInfo>) -> Status {
        let mut state = CycleState::default();
        let (s, _) = plugin.pre_filter(&mut state, pod, std::slice::from_ref(node));
        match s.code {
            Code::Skip => return Status::success(),
            Code::Success => {}
            _ => return s,
        }
        plugin.filter(&state, pod, node)
    }

    fn claim_volume(claim: &str) -> serde_json::Value {
        json!([{"name": "v", "persistentVolumeClaim": {"claimName": claim}}])
    }

    #[test]
    fn a_read_write_once_pod_claim_is_used_by_one_pod_at_a_time() {
        let plugin =
            VolumeRestrictions { claims: claims(&[("solo", "ReadWriteOncePod"), ("shared", "ReadWriteOnce")]) };
        let holder = pod("a", claim_volume("solo"));
        let node = node_with(vec![holder.clone(), pod("b", claim_volume("shared"))]);
        let s = run(&plugin, &pod("c", claim_volume("solo")), &node);
        assert!(!s.is_success());
        assert_eq!(s.message(), ERR_RWOP_CONFLICT);
        // ReadWriteOnce claims are shared freely on a node.
        let mut state = CycleState::default();
        let (s, _) = plugin.pre_filter(&mut state, &pod("d", claim_volume("shared")), std::slice::from_ref(&node));
        assert_eq!(s.code, Code::Skip);
        // The holder leaving wakes the waiting pod; a pod without the claim leaving does not.
        let waiting = pod("c", claim_volume("solo"));
        let gone = |p: PodInfo| ClusterEvent::AssignedPodRemoved { pod: Arc::new(p), node: node.clone() };
        assert!(plugin.requeue(&waiting, &gone(holder)));
        assert!(!plugin.requeue(&waiting, &gone(pod("b", claim_volume("shared")))));
        // A finished holder no longer holds it.
        let mut finished = pod("a", claim_volume("solo"));
        finished.finished = true;
        assert!(run(&plugin, &pod("c", claim_volume("solo")), &node_with(vec![finished])).is_success());
    }

    #[test]
    fn a_missing_claim_is_unresolvable() {
        let plugin = VolumeRestrictions { claims: claims(&[]) };
        let s = run(&plugin, &pod("c", claim_volume("nope")), &node_with(vec![]));
        assert!(s.is_rejected());
        assert_eq!(s.message(), "persistentvolumeclaim \"nope\" not found");
    }

    #[test]
    fn the_same_disk_conflicts_unless_every_mount_is_read_only() {
        let plugin = VolumeRestrictions { claims: claims(&[]) };
        let gce = |ro: bool| json!([{"name": "d", "gcePersistentDisk": {"pdName": "disk-1", "readOnly": ro}}]);
        let node = node_with(vec![pod("a", gce(true))]);
        assert!(run(&plugin, &pod("b", gce(true)), &node).is_success());
        let s = run(&plugin, &pod("b", gce(false)), &node);
        assert_eq!(s.message(), ERR_DISK_CONFLICT);
        let ebs = json!([{"name": "d", "awsElasticBlockStore": {"volumeID": "vol-1", "readOnly": true}}]);
        let node = node_with(vec![pod("a", ebs.clone())]);
        assert_eq!(run(&plugin, &pod("b", ebs), &node).message(), ERR_DISK_CONFLICT);
        let rbd = |mons: &[&str], image: &str| json!([{"name": "d", "rbd": {"monitors": mons, "image": image}}]);
        let node = node_with(vec![pod("a", rbd(&["m1", "m2"], "img"))]);
        assert_eq!(run(&plugin, &pod("b", rbd(&["m2"], "img")), &node).message(), ERR_DISK_CONFLICT);
        assert!(run(&plugin, &pod("b", rbd(&["m3"], "img")), &node).is_success());
        assert!(run(&plugin, &pod("b", rbd(&["m1"], "other")), &node).is_success());
    }
}
