//! kube-controller-manager's persistent volume binder (`persistentvolume-controller`): binds claims
//! to volumes (static matching, pre-bound claims and volumes, the volumes provisioners make for a
//! claim), keeps both sides' phases (claims Pending/Bound/Lost, volumes Available/Bound/Released/
//! Failed), hands claims of a provisioner's class to it (`volume.kubernetes.io/storage-provisioner`),
//! assigns the default class to claims that have none, and reclaims released volumes (`Retain` keeps
//! them; `Delete` of a provisioned volume is its provisioner's; a static volume cannot be deleted and
//! fails, as upstream without an in-tree deleter).
//!
//! Two reconcilers over one set of caches: claims (triggered by their volumes) and volumes
//! (triggered by their claims; bound volumes also every sync period).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::synced;
use super::runtime::{self, Error, Reconciler};
use crate::events::{EventType, Recorder};
use crate::registry::kinds::storage::{
    BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER,
    claim_reference, is_default_class, storage_bytes,
};

/// The provisioner name of classes whose volumes are made by hand (local volumes).
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// How often a claim waiting on something no watch reports (a missing class) is looked at again
/// (upstream's `--pvclaimbinder-sync-period`).
const RESYNC: Duration = Duration::from_secs(15);

struct Shared {
    client: Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    recorder: Recorder,
}

impl Shared {
    async fn synced(&self) -> bool {
        synced(&self.claims).await && synced(&self.volumes).await && synced(&self.classes).await
    }
}

/// Starts both loops; they stop with `shutdown`.
pub fn spawn(client: &Client, shutdown: &CancellationToken) {
    let claims = Controller::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default())
        .watches(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default(), |pv| {
            let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
            Some(ObjectRef::new(claim.name.as_deref()?).within(claim.namespace.as_deref()?))
        });
    let volumes = Controller::new(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default()).watches(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
        |pvc| pvc.spec.as_ref()?.volume_name.as_deref().filter(|v| !v.is_empty()).map(ObjectRef::new),
    );
    let shared = Arc::new(Shared {
        client: client.clone(),
        claims: claims.store(),
        volumes: volumes.store(),
        classes: crate::client::cache(Api::<StorageClass>::all(client.clone()), Default::default(), shutdown),
        recorder: Recorder::spawn(client.clone(), "persistentvolume-controller".into(), String::new()),
    });
    tokio::spawn(runtime::run(claims, Claims(shared.clone()), shutdown.clone()));
    tokio::spawn(runtime::run(volumes, Volumes(shared), shutdown.clone()));
}

fn claim_phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn volume_phase(pv: &PersistentVolume) -> &str {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn class_of(pvc: &PersistentVolumeClaim) -> String {
    pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default()
}

fn volume_name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("")
}

/// Whether a volume's claimRef names this claim (by namespace and name, and UID when it has one).
fn points_at(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return false };
    r.name.as_deref() == pvc.metadata.name.as_deref()
        && r.namespace.as_deref() == pvc.metadata.namespace.as_deref()
        && r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == pvc.metadata.uid.as_deref())
}

/// Why a volume cannot serve a claim (`checkVolumeSatisfyClaim`), in upstream's words.
fn mismatch(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Option<String> {
    let (vs, cs) = (pv.spec.clone().unwrap_or_default(), pvc.spec.clone().unwrap_or_default());
    if pv.metadata.deletion_timestamp.is_some() {
        return Some(format!("the volume is marked for deletion \"{}\"", pv.name_any()));
    }
    let want = storage_bytes(cs.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap_or(0);
    if storage_bytes(vs.capacity.as_ref()).unwrap_or(0) < want {
        return Some("requested PV is too small".into());
    }
    if vs.storage_class_name.unwrap_or_default() != cs.storage_class_name.unwrap_or_default() {
        return Some("storageClassName does not match".into());
    }
    if vs.volume_mode.as_deref().unwrap_or("Filesystem") != cs.volume_mode.as_deref().unwrap_or("Filesystem") {
        return Some("incompatible volumeMode".into());
    }
    let have = vs.access_modes.unwrap_or_default();
    if !cs.access_modes.unwrap_or_default().iter().all(|m| have.contains(m)) {
        return Some("incompatible accessMode".into());
    }
    None
}

/// `FindMatchingVolume` without a node: the smallest available volume that fits, or a volume
/// pre-bound to the claim.
fn best_match(
    volumes: &[Arc<PersistentVolume>],
    pvc: &PersistentVolumeClaim,
    delayed: bool,
) -> Option<Arc<PersistentVolume>> {
    let cs = pvc.spec.clone().unwrap_or_default();
    let want = storage_bytes(cs.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap_or(0);
    let modes = cs.access_modes.clone().unwrap_or_default();
    let labels = BTreeMap::new();
    let mut best: Option<(i128, Arc<PersistentVolume>)> = None;
    for pv in volumes {
        let vs = pv.spec.clone().unwrap_or_default();
        let pre_bound = points_at(pv, pvc);
        if vs.claim_ref.is_some() && !pre_bound {
            continue;
        }
        let size = storage_bytes(vs.capacity.as_ref()).unwrap_or(0);
        if size < want
            || vs.volume_mode.as_deref().unwrap_or("Filesystem") != cs.volume_mode.as_deref().unwrap_or("Filesystem")
            || pv.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        if pre_bound {
            return Some(pv.clone());
        }
        if delayed || volume_phase(pv) != "Available" {
            continue;
        }
        let pv_labels = pv.metadata.labels.as_ref().unwrap_or(&labels);
        if cs.selector.is_some() && !crate::labels::selector_matches(cs.selector.as_ref(), pv_labels) {
            continue;
        }
        if vs.storage_class_name.unwrap_or_default() != cs.storage_class_name.clone().unwrap_or_default() {
            continue;
        }
        let have = vs.access_modes.unwrap_or_default();
        if !modes.iter().all(|m| have.contains(m)) {
            continue;
        }
        if best.as_ref().is_none_or(|(s, _)| size < *s) {
            best = Some((size, pv.clone()));
        }
    }
    best.map(|(_, pv)| pv)
}

impl Shared {
    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    fn claim_api(&self, pvc: &PersistentVolumeClaim) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default())
    }

    fn volume_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn event(&self, object: crate::events::ObjectRef, kind: EventType, reason: &str, message: impl Into<String>) {
        self.recorder.record(object, kind, reason, "", message.into());
    }

    async fn set_claim_phase(&self, pvc: &PersistentVolumeClaim, phase: &str) -> Result<(), Error> {
        if claim_phase(pvc) == phase {
            return Ok(());
        }
        let patch = json!({"status": {"phase": phase}});
        self.claim_api(pvc).patch_status(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    async fn set_volume_phase(&self, pv: &PersistentVolume, phase: &str, message: Option<&str>) -> Result<(), Error> {
        if volume_phase(pv) == phase {
            return Ok(());
        }
        let patch = json!({"status": {"phase": phase, "message": message}});
        self.volume_api().patch_status(&pv.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        tracing::debug!("volume {} is {phase}", pv.name_any());
        Ok(())
    }

    /// `bind`: both sides point at each other and are Bound (each write only when something differs).
    async fn bind(&self, pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Result<(), Error> {
        let (pv_name, claim_name) = (pv.name_any(), pvc.name_any());
        let wanted_ref = claim_reference(pvc);
        let current_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.clone());
        let same_uid = current_ref.as_ref().and_then(|r| r.uid.clone()) == wanted_ref.uid;
        let mut pv = pv.clone();
        if !same_uid {
            let was_pointing = points_at(&pv, pvc);
            let spec = pv.spec.get_or_insert_with(Default::default);
            spec.claim_ref = Some(wanted_ref);
            if !was_pointing {
                pv.annotations_mut().insert(BOUND_BY_CONTROLLER.into(), "yes".into());
            }
            pv = self.volume_api().replace(&pv_name, &PostParams::default(), &pv).await?;
        }
        self.set_volume_phase(&pv, "Bound", None).await?;
        let mut claim = pvc.clone();
        let annotations = claim.annotations().clone();
        let set_by_us = volume_name(&claim).is_empty();
        if set_by_us || annotations.get(BIND_COMPLETED).map(String::as_str) != Some("yes") {
            claim.spec.get_or_insert_with(Default::default).volume_name = Some(pv_name.clone());
            claim.annotations_mut().insert(BIND_COMPLETED.into(), "yes".into());
            if set_by_us {
                claim.annotations_mut().insert(BOUND_BY_CONTROLLER.into(), "yes".into());
            }
            claim = self.claim_api(pvc).replace(&claim_name, &PostParams::default(), &claim).await?;
        }
        let spec = pv.spec.clone().unwrap_or_default();
        let status = claim.status.clone().unwrap_or_default();
        if status.phase.as_deref() != Some("Bound")
            || status.access_modes != spec.access_modes
            || status.capacity.is_none()
        {
            let patch = json!({"status": {
                "phase": "Bound",
                "accessModes": spec.access_modes,
                "capacity": spec.capacity,
            }});
            self.claim_api(&claim).patch_status(&claim_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            tracing::info!("bound claim {}/{claim_name} to volume {pv_name}", claim.namespace().unwrap_or_default());
        }
        Ok(())
    }
}

struct Claims(Arc<Shared>);

impl Reconciler for Claims {
    type Object = PersistentVolumeClaim;
    const NAME: &'static str = "persistentvolume-binder";

    async fn synced(&self) -> bool {
        self.0.synced().await
    }

    async fn reconcile(&self, pvc: Arc<PersistentVolumeClaim>) -> Result<Action, Error> {
        let s = &self.0;
        if pvc.metadata.deletion_timestamp.is_some() && volume_name(&pvc).is_empty() {
            return Ok(Action::await_change());
        }
        if pvc.annotations().get(BIND_COMPLETED).is_some() {
            return self.sync_bound(&pvc).await;
        }
        let wanted = volume_name(&pvc).to_string();
        if !wanted.is_empty() {
            return self.sync_prebound(&pvc, &wanted).await;
        }
        let class_name = class_of(&pvc);
        let class = s.class(&class_name);
        let delayed = class.as_ref().is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        if let Some(pv) = best_match(&s.volumes.state(), &pvc, delayed) {
            s.bind(&pv, &pvc).await?;
            return Ok(Action::await_change());
        }
        // The volume a provisioner made for the claim (`pvc-<uid>`, external-provisioner's name) may
        // have triggered this sync before the volumes' cache holds it: it is read live.
        if pvc.annotations().contains_key(STORAGE_PROVISIONER)
            && let Some(pv) = s.volume_api().get_opt(&format!("pvc-{}", pvc.uid().unwrap_or_default())).await?
            && points_at(&pv, &pvc)
        {
            s.bind(&pv, &pvc).await?;
            return Ok(Action::await_change());
        }
        if pvc.spec.as_ref().is_some_and(|sp| sp.storage_class_name.is_none())
            && let Some(default) = default_class(&s.classes)
        {
            // Retroactive default class assignment.
            let mut claim = (*pvc).clone();
            claim.spec.get_or_insert_with(Default::default).storage_class_name = Some(default.name_any());
            s.claim_api(&pvc).replace(&pvc.name_any(), &PostParams::default(), &claim).await?;
            return Ok(Action::await_change());
        }
        let ev = crate::events::ObjectRef::of(&*pvc);
        let selected = pvc.annotations().contains_key(SELECTED_NODE);
        if delayed && !selected {
            s.event(
                ev,
                EventType::Normal,
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            );
            s.set_claim_phase(&pvc, "Pending").await?;
            return Ok(Action::await_change());
        }
        if class_name.is_empty() {
            s.event(
                ev,
                EventType::Normal,
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
            );
            s.set_claim_phase(&pvc, "Pending").await?;
            return Ok(Action::await_change());
        }
        let Some(class) = class else {
            s.event(
                ev,
                EventType::Warning,
                "ProvisioningFailed",
                format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
            );
            s.set_claim_phase(&pvc, "Pending").await?;
            return Ok(Action::requeue(RESYNC));
        };
        let provisioner = class.provisioner.clone();
        if provisioner == NO_PROVISIONER || provisioner.starts_with("kubernetes.io/") {
            s.event(
                ev,
                EventType::Warning,
                "ProvisioningFailed",
                format!("no volume plugin matched name: {provisioner}"),
            );
            return Ok(Action::await_change());
        }
        let annotations = pvc.annotations();
        if annotations.get(STORAGE_PROVISIONER) != Some(&provisioner)
            || annotations.get(BETA_STORAGE_PROVISIONER) != Some(&provisioner)
        {
            let mut claim = (*pvc).clone();
            claim.annotations_mut().insert(STORAGE_PROVISIONER.into(), provisioner.clone());
            claim.annotations_mut().insert(BETA_STORAGE_PROVISIONER.into(), provisioner.clone());
            if let Err(e) = s.claim_api(&pvc).replace(&pvc.name_any(), &PostParams::default(), &claim).await {
                s.event(ev, EventType::Warning, "ProvisioningFailed", format!("Error saving claim: {e}"));
                return Err(e.into());
            }
        }
        s.event(
            ev,
            EventType::Normal,
            "ExternalProvisioning",
            format!(
                "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
            ),
        );
        // Looked at again every sync period while the provisioner works, as upstream resyncs.
        Ok(Action::requeue(RESYNC))
    }
}

fn default_class(classes: &Store<StorageClass>) -> Option<Arc<StorageClass>> {
    let mut defaults: Vec<Arc<StorageClass>> =
        classes.state().into_iter().filter(|c| is_default_class(&c.metadata)).collect();
    // The newest default wins, ties by name (upstream's `GetDefaultClass`).
    defaults.sort_by(|a, b| {
        b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp).then_with(|| a.name_any().cmp(&b.name_any()))
    });
    defaults.into_iter().next()
}

impl Claims {
    /// A claim whose `volumeName` the user set: bind when the volume is free and fits.
    async fn sync_prebound(&self, pvc: &PersistentVolumeClaim, wanted: &str) -> Result<Action, Error> {
        let s = &self.0;
        let Some(pv) = s.volumes.get(&ObjectRef::new(wanted)) else {
            s.set_claim_phase(pvc, "Pending").await?;
            return Ok(Action::await_change());
        };
        let claim_ref = pv.spec.as_ref().and_then(|sp| sp.claim_ref.as_ref());
        if claim_ref.is_none() {
            if let Some(why) = mismatch(&pv, pvc) {
                s.event(
                    crate::events::ObjectRef::of(pvc),
                    EventType::Warning,
                    "VolumeMismatch",
                    format!("Cannot bind to requested volume \"{wanted}\": {why}"),
                );
                s.set_claim_phase(pvc, "Pending").await?;
                return Ok(Action::await_change());
            }
        } else if !points_at(&pv, pvc) {
            s.event(
                crate::events::ObjectRef::of(pvc),
                EventType::Warning,
                "FailedBinding",
                format!("volume \"{wanted}\" already bound to a different claim."),
            );
            s.set_claim_phase(pvc, "Pending").await?;
            return Ok(Action::await_change());
        }
        s.bind(&pv, pvc).await?;
        Ok(Action::await_change())
    }

    /// `syncBoundClaim`: a bound claim keeps its volume, or is Lost.
    async fn sync_bound(&self, pvc: &PersistentVolumeClaim) -> Result<Action, Error> {
        let s = &self.0;
        let lost = |reason: &'static str, message: &'static str| async move {
            if claim_phase(pvc) != "Lost" {
                s.event(crate::events::ObjectRef::of(pvc), EventType::Warning, reason, message);
            }
            s.set_claim_phase(pvc, "Lost").await
        };
        let name = volume_name(pvc);
        if name.is_empty() {
            lost("ClaimLost", "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
                .await?;
            return Ok(Action::await_change());
        }
        let pv = match s.volumes.get(&ObjectRef::new(name)) {
            Some(pv) => pv,
            // The cache may not have it yet: only a live read says it is gone.
            None => match s.volume_api().get_opt(name).await? {
                Some(pv) => Arc::new(pv),
                None => {
                    lost("ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!").await?;
                    return Ok(Action::await_change());
                }
            },
        };
        let claim_ref = pv.spec.as_ref().and_then(|sp| sp.claim_ref.as_ref());
        if claim_ref.is_none() || claim_ref.and_then(|r| r.uid.as_deref()) == pvc.metadata.uid.as_deref() {
            s.bind(&pv, pvc).await?;
        } else {
            lost("ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly").await?;
        }
        Ok(Action::await_change())
    }
}

struct Volumes(Arc<Shared>);

impl Reconciler for Volumes {
    type Object = PersistentVolume;
    const NAME: &'static str = "persistentvolume-reclaimer";

    async fn synced(&self) -> bool {
        self.0.synced().await
    }

    async fn reconcile(&self, pv: Arc<PersistentVolume>) -> Result<Action, Error> {
        let s = &self.0;
        let Some(claim_ref) = pv.spec.as_ref().and_then(|sp| sp.claim_ref.clone()) else {
            if pv.metadata.deletion_timestamp.is_none() {
                s.set_volume_phase(&pv, "Available", None).await?;
            }
            return Ok(Action::await_change());
        };
        if claim_ref.uid.as_deref().unwrap_or("").is_empty() {
            // Pre-bound by name: the claim's sync binds it.
            s.set_volume_phase(&pv, "Available", None).await?;
            return Ok(Action::await_change());
        }
        let (ns, name) = (claim_ref.namespace.clone().unwrap_or_default(), claim_ref.name.clone().unwrap_or_default());
        // The claims' cache may lag this loop's trigger: a claim it lacks or shows going is read live.
        let claim = match s.claims.get(&ObjectRef::new(&name).within(&ns)) {
            Some(c) if c.metadata.deletion_timestamp.is_none() => Some(c),
            _ => Api::<PersistentVolumeClaim>::namespaced(s.client.clone(), &ns).get_opt(&name).await?.map(Arc::new),
        };
        let claim = claim.filter(|c| c.metadata.uid == claim_ref.uid);
        let Some(claim) = claim else {
            return self.release(&pv).await;
        };
        let bound_to = volume_name(&claim);
        if bound_to.is_empty() {
            // The claim's sync binds it.
            return Ok(Action::await_change());
        }
        if bound_to == pv.name_any() {
            s.set_volume_phase(&pv, "Bound", None).await?;
            // Looked at again every sync period, as upstream resyncs (nothing is written unless the
            // claim went away unseen).
            return Ok(Action::requeue(RESYNC));
        }
        // The claim is bound to another volume.
        let provisioned = pv.annotations().contains_key(PROVISIONED_BY);
        let policy = pv.spec.as_ref().and_then(|sp| sp.persistent_volume_reclaim_policy.clone()).unwrap_or_default();
        if provisioned && policy == "Delete" {
            return self.release(&pv).await;
        }
        let mut unbound = (*pv).clone();
        if unbound.annotations().contains_key(BOUND_BY_CONTROLLER) {
            unbound.annotations_mut().remove(BOUND_BY_CONTROLLER);
            unbound.spec.get_or_insert_with(Default::default).claim_ref = None;
        } else if let Some(r) = unbound.spec.as_mut().and_then(|sp| sp.claim_ref.as_mut()) {
            r.uid = None;
        }
        let written = s.volume_api().replace(&pv.name_any(), &PostParams::default(), &unbound).await?;
        s.set_volume_phase(&written, "Available", None).await?;
        Ok(Action::await_change())
    }
}

impl Volumes {
    /// Its claim is gone: the volume is Released and reclaimed by its policy.
    async fn release(&self, pv: &PersistentVolume) -> Result<Action, Error> {
        let s = &self.0;
        if matches!(volume_phase(pv), "Released" | "Failed") {
            return Ok(Action::await_change());
        }
        s.set_volume_phase(pv, "Released", None).await?;
        let policy = pv.spec.as_ref().and_then(|sp| sp.persistent_volume_reclaim_policy.clone()).unwrap_or_default();
        let external =
            pv.annotations().contains_key(PROVISIONED_BY) || pv.spec.as_ref().is_some_and(|sp| sp.csi.is_some());
        let fail = |reason: &'static str, message: String| async move {
            s.event(crate::events::ObjectRef::of(pv), EventType::Warning, reason, message.clone());
            let mut released = pv.clone();
            if let Some(st) = released.status.as_mut() {
                st.phase = Some("Released".into());
            }
            s.set_volume_phase(&released, "Failed", Some(&message)).await
        };
        match policy.as_str() {
            "Retain" => {}
            // Its provisioner deletes it.
            "Delete" if external => {}
            "Delete" => {
                let msg = format!(
                    "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                    pv.name_any()
                );
                fail("VolumeFailedDelete", msg).await?;
            }
            "Recycle" => fail("VolumeFailedRecycle", "No recycler plugin found for the volume!".into()).await?,
            _ => {
                fail("VolumeUnknownReclaimPolicy", "Volume has unrecognized PersistentVolumeReclaimPolicy".into())
                    .await?
            }
        }
        Ok(Action::await_change())
    }
}
