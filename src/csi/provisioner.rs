//! external-provisioner and external-resizer for the drivers registered on this node, as they run in
//! their per-node deployment (`--node-deployment`): a claim of a class whose provisioner is such a
//! driver is provisioned by the node it was scheduled to (`volume.kubernetes.io/selected-node`; an
//! `Immediate` claim is taken by the first node that marks it so), through the driver's CreateVolume,
//! into a PersistentVolume pre-bound to the claim and pinned to the volume's topology; the PV
//! controller then binds the two. A released volume of a `Delete` class is deleted through
//! DeleteVolume, then its PersistentVolume. A bound claim asking for more storage is expanded through
//! ControllerExpandVolume.
//!
//! Crash safety: before CreateVolume the request is journaled (`<data-dir>/agent/provisioning/<claim
//! uid>.json`), and removed once the PersistentVolume exists. An entry whose claim is gone names a
//! volume that may exist without a PersistentVolume: it is created again (CreateVolume is idempotent)
//! to learn its ID, and deleted.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::client::{CsiError, Drivers};
use super::hostpath::{PV_NAME_PARAM, PVC_NAME_PARAM, PVC_NAMESPACE_PARAM};
use super::proto;
use crate::controllers::runtime::{self, Error, Reconciler};
use crate::events::{EventType, Recorder};
use crate::registry::kinds::storage::{
    BETA_STORAGE_PROVISIONER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER, claim_reference, storage_bytes,
};

/// external-provisioner's finalizer on the volumes it made with a `Delete` policy: the PersistentVolume
/// goes only after the driver deleted the volume.
pub const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Class parameters with this prefix are for the provisioner, not passed to the driver.
const RESERVED_PARAM_PREFIX: &str = "csi.storage.k8s.io/";
const FSTYPE_PARAM: &str = "csi.storage.k8s.io/fstype";

/// What the provisioner shares between its two loops.
struct Shared {
    client: Client,
    drivers: Drivers,
    node_name: String,
    classes: Store<StorageClass>,
    journal: PathBuf,
    recorder: Recorder,
}

/// Starts the claim and volume loops and the journal sweep; they stop with `shutdown`.
pub fn spawn(client: &Client, drivers: Drivers, node_name: &str, journal: PathBuf, shutdown: &CancellationToken) {
    let classes = crate::client::cache(Api::<StorageClass>::all(client.clone()), Default::default(), shutdown);
    let shared = Arc::new(Shared {
        client: client.clone(),
        drivers: drivers.clone(),
        node_name: node_name.to_string(),
        classes,
        journal,
        recorder: Recorder::spawn(client.clone(), "external-provisioner".into(), node_name.to_string()),
    });
    let claims = Controller::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default())
        .reconcile_all_on(drivers.changes());
    tokio::spawn(runtime::run(claims, Claims(shared.clone()), shutdown.clone()));
    let volumes = Controller::new(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default())
        .reconcile_all_on(drivers.changes());
    tokio::spawn(runtime::run(volumes, Volumes(shared.clone()), shutdown.clone()));
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut changes = std::pin::pin!(drivers.changes());
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                change = changes.next() => if change.is_none() { return },
            }
            shared.sweep_journal().await;
        }
    });
}

/// A journaled provisioning: enough to ask for the same volume again.
#[derive(Debug, Serialize, Deserialize)]
struct Pending {
    driver: String,
    namespace: String,
    claim: String,
    uid: String,
    volume: String,
    required_bytes: i64,
    parameters: HashMap<String, String>,
}

impl Pending {
    fn request(&self) -> proto::CreateVolumeRequest {
        proto::CreateVolumeRequest {
            name: self.volume.clone(),
            capacity_range: Some(proto::CapacityRange { required_bytes: self.required_bytes, limit_bytes: 0 }),
            volume_capabilities: vec![capability("ReadWriteOnce", "Filesystem", "", &[])],
            parameters: self.parameters.clone(),
            secrets: HashMap::new(),
            accessibility_requirements: None,
        }
    }
}

/// A CSI capability for one access mode (external-provisioner's mapping).
fn capability(mode: &str, volume_mode: &str, fs_type: &str, mount_flags: &[String]) -> proto::VolumeCapability {
    use proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode};
    let mode = match mode {
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        _ => Mode::SingleNodeWriter,
    };
    let access_type = if volume_mode == "Block" {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: String::new(),
        })
    };
    proto::VolumeCapability { access_type: Some(access_type), access_mode: Some(AccessMode { mode: mode as i32 }) }
}

fn failed(e: CsiError) -> Error {
    Error::Failed(e.to_string())
}

/// The quantity cairn writes for a byte count: in Gi or Mi when exact, bytes otherwise.
pub fn bytes_quantity(bytes: i128) -> Quantity {
    const GI: i128 = 1 << 30;
    const MI: i128 = 1 << 20;
    Quantity(if bytes % GI == 0 && bytes > 0 {
        format!("{}Gi", bytes / GI)
    } else if bytes % MI == 0 && bytes > 0 {
        format!("{}Mi", bytes / MI)
    } else {
        bytes.to_string()
    })
}

impl Shared {
    fn journal_path(&self, uid: &str) -> PathBuf {
        self.journal.join(format!("{uid}.json"))
    }

    fn journal_write(&self, pending: &Pending) -> Result<(), Error> {
        let path = self.journal_path(&pending.uid);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.journal)?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(pending).map_err(std::io::Error::other)?)?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| Error::Failed(format!("journaling the provisioning in {}: {e}", path.display())))
    }

    fn journal_remove(&self, uid: &str) {
        let _ = std::fs::remove_file(self.journal_path(uid));
    }

    /// Deletes the volumes of journaled provisionings whose claim is gone without a PersistentVolume.
    async fn sweep_journal(&self) {
        let Ok(entries) = std::fs::read_dir(&self.journal) else { return };
        for path in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")) {
            let Some(pending) = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Pending>(&b).ok())
            else {
                tracing::warn!("ignoring the unreadable provisioning journal entry {}", path.display());
                continue;
            };
            if let Err(e) = self.sweep_one(&pending).await {
                tracing::warn!(
                    "cleaning up after the provisioning of claim {}/{}: {e}",
                    pending.namespace,
                    pending.claim
                );
            }
        }
    }

    async fn sweep_one(&self, pending: &Pending) -> Result<(), Error> {
        let Some(entry) = self.drivers.get(&pending.driver) else { return Ok(()) };
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &pending.namespace);
        if claims.get_opt(&pending.claim).await?.is_some_and(|c| c.metadata.uid.as_deref() == Some(&pending.uid)) {
            // Still wanted: the claim loop finishes it.
            return Ok(());
        }
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        if volumes.get_opt(&pending.volume).await?.is_none() {
            tracing::info!(
                "deleting volume {} of claim {}/{}, which went away while it was being provisioned",
                pending.volume,
                pending.namespace,
                pending.claim
            );
            let volume = entry.driver.create_volume(pending.request()).await.map_err(failed)?;
            entry.driver.delete_volume(volume.volume_id).await.map_err(failed)?;
        }
        self.journal_remove(&pending.uid);
        Ok(())
    }

    /// Whether a volume's node affinity admits this node (a volume without one is anywhere).
    fn on_this_node(&self, pv: &PersistentVolume) -> bool {
        let Some(terms) = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
        else {
            return true;
        };
        terms.node_selector_terms.iter().any(|t| {
            t.match_expressions.iter().flatten().all(|r| {
                r.key == super::HOSTNAME_KEY
                    && r.operator == "In"
                    && r.values.iter().flatten().any(|v| *v == self.node_name)
            })
        })
    }
}

/// The claim loop: provisioning and expansion.
struct Claims(Arc<Shared>);

impl Reconciler for Claims {
    type Object = PersistentVolumeClaim;
    const NAME: &'static str = "csi-provisioner";

    async fn reconcile(&self, pvc: Arc<PersistentVolumeClaim>) -> Result<Action, Error> {
        let s = &self.0;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let spec = pvc.spec.clone().unwrap_or_default();
        if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
            return self.expand(&pvc).await;
        }
        let annotations = pvc.annotations();
        let Some(driver) = annotations.get(STORAGE_PROVISIONER).or_else(|| annotations.get(BETA_STORAGE_PROVISIONER))
        else {
            return Ok(Action::await_change());
        };
        if !s.drivers.provisions(driver) {
            return Ok(Action::await_change());
        }
        let class_name = spec.storage_class_name.clone().unwrap_or_default();
        let Some(class) = s.classes.get(&ObjectRef::new(&class_name)) else {
            // The PV controller reports a missing class; look again once the cache has it.
            return Ok(Action::requeue(Duration::from_secs(5)));
        };
        if class.provisioner != *driver {
            return Ok(Action::await_change());
        }
        let delayed = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        match annotations.get(SELECTED_NODE) {
            Some(node) if *node != s.node_name => return Ok(Action::await_change()),
            Some(_) => {}
            None if delayed => return Ok(Action::await_change()),
            None => {
                // An Immediate claim: this node takes it by marking it (the write fails with a conflict
                // if another node marked it first).
                let mut taken = (*pvc).clone();
                taken.annotations_mut().insert(SELECTED_NODE.into(), s.node_name.clone());
                let claims: Api<PersistentVolumeClaim> =
                    Api::namespaced(s.client.clone(), &pvc.namespace().unwrap_or_default());
                match claims.replace(&pvc.name_any(), &PostParams::default(), &taken).await {
                    Ok(_) | Err(kube::Error::Api(_)) => return Ok(Action::await_change()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        self.provision(&pvc, &class, driver).await
    }
}

impl Claims {
    async fn provision(
        &self,
        pvc: &PersistentVolumeClaim,
        class: &StorageClass,
        driver: &str,
    ) -> Result<Action, Error> {
        let s = &self.0;
        let Some(entry) = s.drivers.get(driver) else { return Ok(Action::await_change()) };
        let (ns, name, uid) = (pvc.namespace().unwrap_or_default(), pvc.name_any(), pvc.uid().unwrap_or_default());
        let volume_name = format!("pvc-{uid}");
        let volumes: Api<PersistentVolume> = Api::all(s.client.clone());
        if volumes.get_opt(&volume_name).await?.is_some() {
            s.journal_remove(&uid);
            return Ok(Action::await_change());
        }
        let spec = pvc.spec.clone().unwrap_or_default();
        let resources = spec.resources.clone().unwrap_or_default();
        let required = storage_bytes(resources.requests.as_ref()).unwrap_or(0);
        let limit = storage_bytes(resources.limits.as_ref()).unwrap_or(0);
        let class_params = class.parameters.clone().unwrap_or_default();
        let mut parameters: HashMap<String, String> = class_params
            .iter()
            .filter(|(k, _)| !k.starts_with(RESERVED_PARAM_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        parameters.insert(PVC_NAME_PARAM.into(), name.clone());
        parameters.insert(PVC_NAMESPACE_PARAM.into(), ns.clone());
        parameters.insert(PV_NAME_PARAM.into(), volume_name.clone());
        let fs_type = class_params.get(FSTYPE_PARAM).cloned().unwrap_or_default();
        let volume_mode = spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into());
        let mount_flags = class.mount_options.clone().unwrap_or_default();
        let modes = spec.access_modes.clone().unwrap_or_default();
        let here = proto::Topology { segments: entry.topology.clone().into_iter().collect() };
        let request = proto::CreateVolumeRequest {
            name: volume_name.clone(),
            capacity_range: Some(proto::CapacityRange { required_bytes: required as i64, limit_bytes: limit as i64 }),
            volume_capabilities: modes.iter().map(|m| capability(m, &volume_mode, &fs_type, &mount_flags)).collect(),
            parameters: parameters.clone(),
            secrets: HashMap::new(),
            accessibility_requirements: (!entry.topology.is_empty())
                .then(|| proto::TopologyRequirement { requisite: vec![here.clone()], preferred: vec![here] }),
        };
        let claim_ref = crate::events::ObjectRef::of(pvc);
        s.recorder.record(
            claim_ref.clone(),
            EventType::Normal,
            "Provisioning",
            "Provisioning",
            format!("External provisioner is provisioning volume for claim \"{ns}/{name}\""),
        );
        s.journal_write(&Pending {
            driver: driver.to_string(),
            namespace: ns.clone(),
            claim: name.clone(),
            uid: uid.clone(),
            volume: volume_name.clone(),
            required_bytes: required as i64,
            parameters,
        })?;
        let volume = match entry.driver.create_volume(request).await {
            Ok(v) => v,
            Err(e) => {
                let class_name = class.name_any();
                s.recorder.record(
                    claim_ref,
                    EventType::Warning,
                    "ProvisioningFailed",
                    "Provisioning",
                    format!("failed to provision volume with StorageClass \"{class_name}\": {e}"),
                );
                return Err(failed(e));
            }
        };
        let capacity = if volume.capacity_bytes > 0 { i128::from(volume.capacity_bytes) } else { required };
        let reclaim = class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into());
        let node_affinity = (!volume.accessible_topology.is_empty()).then(|| VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: volume
                    .accessible_topology
                    .iter()
                    .map(|t| NodeSelectorTerm {
                        match_expressions: Some(
                            t.segments
                                .iter()
                                .collect::<BTreeMap<_, _>>()
                                .into_iter()
                                .map(|(k, v)| NodeSelectorRequirement {
                                    key: k.clone(),
                                    operator: "In".into(),
                                    values: Some(vec![v.clone()]),
                                })
                                .collect(),
                        ),
                        match_fields: None,
                    })
                    .collect(),
            }),
        });
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(volume_name.clone()),
                annotations: Some(BTreeMap::from([(PROVISIONED_BY.to_string(), driver.to_string())])),
                finalizers: (reclaim == "Delete").then(|| vec![PROVISIONER_FINALIZER.to_string()]),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes),
                capacity: Some(BTreeMap::from([("storage".to_string(), bytes_quantity(capacity))])),
                claim_ref: Some(claim_reference(pvc)),
                csi: Some(CSIPersistentVolumeSource {
                    driver: driver.to_string(),
                    volume_handle: volume.volume_id.clone(),
                    fs_type: (!fs_type.is_empty()).then_some(fs_type),
                    volume_attributes: (!volume.volume_context.is_empty())
                        .then(|| volume.volume_context.clone().into_iter().collect()),
                    ..Default::default()
                }),
                persistent_volume_reclaim_policy: Some(reclaim),
                storage_class_name: Some(class.name_any()),
                mount_options: class.mount_options.clone(),
                volume_mode: Some(volume_mode),
                node_affinity,
                ..Default::default()
            }),
            status: None,
        };
        match volumes.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        s.journal_remove(&uid);
        tracing::info!("provisioned volume {volume_name} for claim {ns}/{name} with {driver}");
        s.recorder.record(
            claim_ref,
            EventType::Normal,
            "ProvisioningSucceeded",
            "Provisioning",
            format!("Successfully provisioned volume {volume_name}"),
        );
        Ok(Action::await_change())
    }

    /// external-resizer: a bound claim asking for more than its volume has.
    async fn expand(&self, pvc: &PersistentVolumeClaim) -> Result<Action, Error> {
        let s = &self.0;
        let spec = pvc.spec.clone().unwrap_or_default();
        let wanted = storage_bytes(spec.resources.as_ref().and_then(|r| r.requests.as_ref()));
        let has = storage_bytes(pvc.status.as_ref().and_then(|st| st.capacity.as_ref()));
        let (Some(wanted), Some(has)) = (wanted, has) else { return Ok(Action::await_change()) };
        if wanted <= has {
            return Ok(Action::await_change());
        }
        let volume_name = spec.volume_name.clone().unwrap_or_default();
        let volumes: Api<PersistentVolume> = Api::all(s.client.clone());
        let Some(pv) = volumes.get_opt(&volume_name).await? else { return Ok(Action::await_change()) };
        let Some(csi) = pv.spec.as_ref().and_then(|sp| sp.csi.clone()) else { return Ok(Action::await_change()) };
        let Some(entry) = s.drivers.get(&csi.driver) else { return Ok(Action::await_change()) };
        if !entry.driver.capabilities().expand || !s.on_this_node(&pv) {
            return Ok(Action::await_change());
        }
        let claim_ref = crate::events::ObjectRef::of(pvc);
        s.recorder.record(
            claim_ref.clone(),
            EventType::Normal,
            "Resizing",
            "Resizing",
            format!("External resizer is resizing volume {volume_name}"),
        );
        let request = proto::ControllerExpandVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            capacity_range: Some(proto::CapacityRange { required_bytes: wanted as i64, limit_bytes: 0 }),
            secrets: HashMap::new(),
            volume_capability: None,
        };
        let resp = match entry.driver.expand_volume(request).await {
            Ok(r) => r,
            Err(e) => {
                s.recorder.record(
                    claim_ref,
                    EventType::Warning,
                    "VolumeResizeFailed",
                    "Resizing",
                    format!("resize volume \"{volume_name}\" by resizer \"{}\" failed: {e}", csi.driver),
                );
                return Err(failed(e));
            }
        };
        let size = bytes_quantity(if resp.capacity_bytes > 0 { i128::from(resp.capacity_bytes) } else { wanted });
        let pv_patch = serde_json::json!({"spec": {"capacity": {"storage": size}}});
        volumes.patch(&volume_name, &PatchParams::default(), &Patch::Merge(&pv_patch)).await?;
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(s.client.clone(), &pvc.namespace().unwrap_or_default());
        let status = serde_json::json!({"status": {
            "capacity": {"storage": size},
            "allocatedResources": {"storage": size},
            "conditions": null,
        }});
        claims.patch_status(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
        s.recorder.record(
            claim_ref,
            EventType::Normal,
            "VolumeResizeSuccessful",
            "Resizing",
            "Resize volume succeeded".into(),
        );
        Ok(Action::await_change())
    }
}

/// The volume loop: deleting released volumes of a `Delete` policy.
struct Volumes(Arc<Shared>);

impl Reconciler for Volumes {
    type Object = PersistentVolume;
    const NAME: &'static str = "csi-provisioner-deleter";

    async fn reconcile(&self, pv: Arc<PersistentVolume>) -> Result<Action, Error> {
        let s = &self.0;
        let Some(driver) = pv.annotations().get(PROVISIONED_BY).cloned() else { return Ok(Action::await_change()) };
        let Some(entry) = s.drivers.get(&driver).filter(|_| s.drivers.provisions(&driver)) else {
            return Ok(Action::await_change());
        };
        if !s.on_this_node(&pv) {
            return Ok(Action::await_change());
        }
        let spec = pv.spec.clone().unwrap_or_default();
        let phase = pv.status.as_ref().and_then(|st| st.phase.clone()).unwrap_or_default();
        let deleting = pv.metadata.deletion_timestamp.is_some();
        let ours = pv.finalizers().iter().any(|f| f == PROVISIONER_FINALIZER);
        let delete_policy = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
        let volumes: Api<PersistentVolume> = Api::all(s.client.clone());
        let delete_volume = || async {
            let handle = spec.csi.as_ref().map(|c| c.volume_handle.clone()).unwrap_or_default();
            if let Err(e) = entry.driver.delete_volume(handle).await {
                s.recorder.record(
                    crate::events::ObjectRef::of(&*pv),
                    EventType::Warning,
                    "VolumeFailedDelete",
                    "Deleting",
                    e.to_string(),
                );
                return Err(failed(e));
            }
            tracing::info!("deleted volume {} with {driver}", pv.name_any());
            Ok(())
        };
        if !deleting && phase == "Released" && delete_policy {
            delete_volume().await?;
            match volumes.delete(&pv.name_any(), &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e.into()),
            }
        } else if deleting && ours && phase != "Bound" {
            if delete_policy {
                delete_volume().await?;
            }
            let keep: Vec<String> = pv.finalizers().iter().filter(|f| *f != PROVISIONER_FINALIZER).cloned().collect();
            let patch = serde_json::json!({"metadata": {"finalizers": keep, "resourceVersion": pv.resource_version()}});
            match volumes.patch(&pv.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::client::{Entry, GrpcDriver};
    use crate::csi::hostpath::HostPath;

    /// A kill -9 between CreateVolume and the PersistentVolume's creation, and the claim deleted
    /// meanwhile: the next sweep deletes the volume; a journaled claim that still exists is left to
    /// the claim loop.
    #[tokio::test]
    async fn the_journal_sweep_deletes_volumes_whose_claim_went_away_mid_provisioning() {
        let (_store, _registry, client) = crate::client::for_tests().await;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let driver = HostPath {
            name: "test.csi".into(),
            node_id: "n1".into(),
            root: dir.path().join("storage"),
            attach: false,
            max_volumes: 0,
        };
        let shutdown = CancellationToken::new();
        crate::csi::hostpath::serve_with_registration(driver, socket.clone(), None, shutdown.clone()).unwrap();
        let registered = GrpcDriver::connect(&socket).await.unwrap();
        let drivers = Drivers::default();
        let entry = Entry {
            driver: Arc::new(registered.driver),
            node_id: registered.node_id.clone(),
            topology: registered.topology,
        };
        drivers.insert("test.csi".into(), entry.clone());
        let shared = Shared {
            client: client.clone(),
            drivers,
            node_name: "n1".into(),
            classes: kube::runtime::reflector::store().0,
            journal: dir.path().join("provisioning"),
            recorder: Recorder::spawn(client.clone(), "external-provisioner".into(), "n1".into()),
        };
        let pending = |claim: &str, uid: &str| Pending {
            driver: "test.csi".into(),
            namespace: "default".into(),
            claim: claim.into(),
            uid: uid.into(),
            volume: format!("pvc-{uid}"),
            required_bytes: 1 << 20,
            parameters: HashMap::from([
                (PVC_NAME_PARAM.to_string(), claim.to_string()),
                (PVC_NAMESPACE_PARAM.to_string(), "default".to_string()),
            ]),
        };
        // The claim that went away: journaled, its volume made, no PersistentVolume.
        let gone = pending("gone", "uid-gone");
        shared.journal_write(&gone).unwrap();
        let made = entry.driver.create_volume(gone.request()).await.unwrap();
        let volume_dir = dir.path().join("storage").join(&made.volume_id);
        assert!(volume_dir.is_dir());
        // A claim that still exists, journaled.
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
        let kept: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kept"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
        }))
        .unwrap();
        let kept = claims.create(&PostParams::default(), &kept).await.unwrap();
        let kept_uid = kept.metadata.uid.clone().unwrap();
        shared.journal_write(&pending("kept", &kept_uid)).unwrap();

        shared.sweep_journal().await;
        assert!(!volume_dir.exists(), "the orphaned volume is deleted");
        assert!(!shared.journal_path("uid-gone").exists(), "and its journal entry");
        assert!(shared.journal_path(&kept_uid).exists(), "a claim that still exists keeps its entry");
        shutdown.cancel();
    }
}
