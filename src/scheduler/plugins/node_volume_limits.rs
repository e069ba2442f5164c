//! NodeVolumeLimits (upstream's `CSILimits`): a node takes no more volumes of a CSI driver than its
//! CSINode entry's `allocatable.count`. A volume counts once per node however many pods use it;
//! volumes come from the pods on the node (bound claims by their PV's handle, unbound ones by their
//! class's provisioner) and from the node's VolumeAttachments.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;

use super::volume_binding::Storage;
use crate::scheduler::framework::{ClusterEvent, CycleState, Plugin, Point, PreFilterResult, Status};
use crate::scheduler::types::{NodeInfo, PodClaim, PodInfo};

pub const NAME: &str = "NodeVolumeLimits";
pub const ERR_MAX_VOLUME_COUNT: &str = "node(s) exceed max volume count";

pub struct NodeVolumeLimits {
    storage: Storage,
    /// Stands in for the handle of a volume not provisioned yet, so that it never equals a real one.
    unbound_prefix: String,
}

/// Volume unique name (`<driver>/<handle>`) → driver.
type Volumes = HashMap<String, String>;

impl NodeVolumeLimits {
    pub fn new(storage: Storage) -> Self {
        NodeVolumeLimits { storage, unbound_prefix: uuid::Uuid::new_v4().simple().to_string() }
    }

    /// The driver and handle a claim's volume has (or will have, from its class's provisioner).
    fn driver_and_handle(&self, pvc: &PersistentVolumeClaim) -> Option<(String, String)> {
        let spec = pvc.spec.as_ref()?;
        let pv = spec
            .volume_name
            .as_deref()
            .filter(|v| !v.is_empty())
            .and_then(|v| self.storage.volumes.get(&ObjectRef::new(v)));
        if let Some(pv) = pv {
            let csi = pv.spec.as_ref()?.csi.as_ref()?;
            return Some((csi.driver.clone(), csi.volume_handle.clone()));
        }
        let class = spec.storage_class_name.as_deref().filter(|c| !c.is_empty())?;
        let class = self.storage.classes.get(&ObjectRef::new(class))?;
        let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        Some((class.provisioner.clone(), format!("{}-{ns}/{name}", self.unbound_prefix)))
    }

    /// Adds the pod's CSI volumes to `out`. For the pod being placed a missing claim is an error
    /// (it cannot run without it); for pods already there it is not counted.
    fn pod_volumes(&self, pod: &PodInfo, new_pod: bool, out: &mut Volumes) -> Result<(), Status> {
        for PodClaim { name, ephemeral } in &pod.claims {
            let Some(pvc) = self.storage.claims.get(&ObjectRef::new(name).within(&pod.namespace)) else {
                if new_pod {
                    return Err(Status::unresolvable(format!(
                        "looking up PVC {}/{name}: persistentvolumeclaims \"{name}\" not found",
                        pod.namespace
                    )));
                }
                continue;
            };
            if *ephemeral
                && !pvc
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && o.uid == pod.uid)
            {
                if new_pod {
                    return Err(Status::unresolvable(format!(
                        "PVC {}/{name} was not created for pod {}/{} (pod is not owner)",
                        pod.namespace, pod.namespace, pod.name
                    )));
                }
                continue;
            }
            if let Some((driver, handle)) = self.driver_and_handle(&pvc)
                && !driver.is_empty()
                && !handle.is_empty()
            {
                out.insert(format!("{driver}/{handle}"), driver);
            }
        }
        Ok(())
    }

    /// The volumes the node's VolumeAttachments hold.
    fn attached(&self, node: &str, out: &mut Volumes) {
        for va in self.storage.attachments.state() {
            if va.spec.node_name != node {
                continue;
            }
            let Some(pv) = va.spec.source.persistent_volume_name.as_deref() else { continue };
            let Some(csi) = self.storage.volumes.get(&ObjectRef::new(pv)).and_then(|pv| pv.spec.clone()?.csi) else {
                continue;
            };
            out.entry(format!("{}/{}", csi.driver, csi.volume_handle)).or_insert(csi.driver);
        }
    }
}

impl Plugin for NodeVolumeLimits {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter]
    }

    fn pre_filter(
        &self,
        _state: &mut CycleState,
        pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
    ) -> (Status, PreFilterResult) {
        if pod.claims.is_empty() { (Status::skip(), None) } else { (Status::success(), None) }
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let mut new = Volumes::new();
        if let Err(s) = self.pod_volumes(pod, true, &mut new) {
            return s;
        }
        if new.is_empty() {
            return Status::success();
        }
        let Some(csi_node) = self.storage.csi_nodes.get(&ObjectRef::new(node.name())) else {
            return Status::success();
        };
        let limits: HashMap<&str, i64> = csi_node
            .spec
            .drivers
            .iter()
            .filter_map(|d| Some((d.name.as_str(), i64::from(d.allocatable.as_ref()?.count?))))
            .collect();
        if limits.is_empty() {
            return Status::success();
        }
        let mut existing = Volumes::new();
        for other in node.pods.iter().filter(|p| p.uid != pod.uid) {
            // Only what a pod on the node is known to use counts; nothing to fail on here.
            let _ = self.pod_volumes(other, false, &mut existing);
        }
        self.attached(node.name(), &mut existing);
        let mut counts: HashMap<&str, (i64, i64)> = HashMap::new();
        for (unique, driver) in &existing {
            new.remove(unique);
            counts.entry(driver.as_str()).or_default().0 += 1;
        }
        for driver in new.values() {
            counts.entry(driver.as_str()).or_default().1 += 1;
        }
        let exceeded = counts.iter().any(|(driver, (attached, adding))| {
            *adding > 0 && limits.get(driver).is_some_and(|max| attached + adding > *max)
        });
        if exceeded { Status::unschedulable(ERR_MAX_VOLUME_COUNT) } else { Status::success() }
    }

    fn requeue(&self, _pod: &PodInfo, event: &ClusterEvent) -> bool {
        match event {
            ClusterEvent::StorageChanged => true,
            ClusterEvent::AssignedPodRemoved { pod: gone, .. } => !gone.claims.is_empty(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
    use kube::runtime::reflector::store;
    use kube::runtime::watcher;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    use super::*;
    use crate::scheduler::types::NodeFacts;

    fn cache<K>(objects: Vec<Value>) -> kube::runtime::reflector::Store<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned + Clone + 'static,
    {
        let (reader, mut writer) = store::<K>();
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value::<K>(o).unwrap()));
        }
        reader
    }

    fn claim(name: &str, volume: Option<&str>) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "ext", "volumeName": volume}})
    }

    fn volume(name: &str, handle: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"csi": {"driver": "ext.csi", "volumeHandle": handle}}})
    }

    fn storage(attachments: Vec<Value>) -> Storage {
        Storage {
            claims: cache::<PersistentVolumeClaim>(vec![
                claim("a", Some("pv-a")),
                claim("b", Some("pv-b")),
                claim("c", None),
            ]),
            volumes: cache::<PersistentVolume>(vec![volume("pv-a", "h-a"), volume("pv-b", "h-b")]),
            classes: cache::<StorageClass>(vec![json!({"metadata": {"name": "ext"}, "provisioner": "ext.csi"})]),
            csi_nodes: cache::<CSINode>(vec![json!({
                "metadata": {"name": "n"},
                "spec": {"drivers": [{"name": "ext.csi", "nodeID": "n", "allocatable": {"count": 2}},
                                     {"name": "other.csi", "nodeID": "n"}]},
            })]),
            attachments: cache::<VolumeAttachment>(attachments),
            claims_changed: tokio::sync::watch::channel(0).1,
        }
    }

    fn pod(name: &str, claims: &[&str]) -> PodInfo {
        let volumes: Vec<Value> =
            claims.iter().map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}})).collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes},
        }))
        .unwrap();
        PodInfo::from_pod(&pod)
    }

    fn node(pods: Vec<PodInfo>) -> NodeInfo {
        let mut n = NodeInfo::new(NodeFacts { name: "n".into(), ..Default::default() });
        for p in pods {
            n.add_pod(Arc::new(p.on_node("n")));
        }
        n
    }

    #[test]
    fn a_node_takes_no_more_volumes_of_a_driver_than_its_csinode_allows() {
        let plugin = NodeVolumeLimits::new(storage(Vec::new()));
        let state = CycleState::default();
        let n = node(vec![pod("p1", &["a"])]);
        // One attached, one more allowed: a bound claim and an unbound one (counted by its class).
        assert!(plugin.filter(&state, &pod("new", &["b"]), &n).is_success());
        assert!(plugin.filter(&state, &pod("new", &["c"]), &n).is_success());
        let s = plugin.filter(&state, &pod("new", &["b", "c"]), &n);
        assert_eq!(s.message(), ERR_MAX_VOLUME_COUNT);
        // A volume already on the node counts once.
        assert!(plugin.filter(&state, &pod("new", &["a", "b"]), &n).is_success());
        // The pod cannot run without its claim.
        let s = plugin.filter(&state, &pod("new", &["gone"]), &n);
        assert!(s.is_rejected());
        assert_eq!(s.message(), "looking up PVC default/gone: persistentvolumeclaims \"gone\" not found");
    }

    #[test]
    fn volume_attachments_of_the_node_count_too() {
        let va = json!({"metadata": {"name": "csi-1"},
                        "spec": {"attacher": "ext.csi", "nodeName": "n", "source": {"persistentVolumeName": "pv-b"}}});
        let plugin = NodeVolumeLimits::new(storage(vec![va]));
        let n = node(vec![pod("p1", &["a"])]);
        let s = plugin.filter(&CycleState::default(), &pod("new", &["c"]), &n);
        assert_eq!(s.message(), ERR_MAX_VOLUME_COUNT);
        // A pod leaving with claims may free room; one without does not.
        let gone = |p: PodInfo| ClusterEvent::AssignedPodRemoved { pod: Arc::new(p), node: Arc::new(node(vec![])) };
        assert!(plugin.requeue(&pod("new", &["c"]), &gone(pod("p1", &["a"]))));
        assert!(!plugin.requeue(&pod("new", &["c"]), &gone(pod("p2", &[]))));
    }
}
