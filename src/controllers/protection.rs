//! Storage object in-use protection (upstream's `pvc-protection` and `pv-protection` controllers):
//! a claim being deleted keeps its `kubernetes.io/pvc-protection` finalizer while a scheduled pod
//! uses it; a volume being deleted keeps `kubernetes.io/pv-protection` while it is Bound. Objects
//! made before the admission added the finalizers get them here.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt as _};
use serde_json::json;

use super::informer::Informer;
use super::runtime::{Error, Reconciler};
use crate::registry::kinds::storage::{PV_PROTECTION, PVC_PROTECTION};

pub struct ClaimProtection {
    pub client: Client,
}

pub struct VolumeProtection {
    pub client: Client,
}

/// The claims a pod's volumes name: `persistentVolumeClaim` ones, and the `<pod>-<volume>` claim of
/// each generic ephemeral volume.
pub fn claims_of(pod: &Pod) -> Vec<String> {
    let name = pod.name_any();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{name}-{}", v.name)),
            _ => None,
        })
        .collect()
}

/// Claims, and the claims of pods that change (a pod leaving may free a claim).
pub fn claim_controller(client: &Client, pods: &mut Informer<Pod>) -> Controller<PersistentVolumeClaim> {
    Controller::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default())
        .watches_shared_stream(pods.subscribe(), |pod| {
            let ns = pod.namespace().unwrap_or_default();
            claims_of(&pod).into_iter().map(move |c| ObjectRef::new(&c).within(&ns))
        })
}

pub fn volume_controller(client: &Client) -> Controller<PersistentVolume> {
    Controller::new(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default())
}

/// Sets the object's finalizers (with its resourceVersion, so a concurrent change is not lost).
async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    match api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether the object needs `finalizer` added (not deleting, not there), or removed (deleting and
/// free), and the list to write.
fn change(meta: &kube::api::ObjectMeta, finalizer: &str, in_use: impl FnOnce() -> bool) -> Option<Vec<String>> {
    let list = meta.finalizers.clone().unwrap_or_default();
    let has = list.iter().any(|f| f == finalizer);
    match (meta.deletion_timestamp.is_some(), has) {
        (false, false) => Some(list.into_iter().chain([finalizer.to_string()]).collect()),
        (true, true) if !in_use() => Some(list.into_iter().filter(|f| f != finalizer).collect()),
        _ => None,
    }
}

impl Reconciler for ClaimProtection {
    type Object = PersistentVolumeClaim;
    const NAME: &'static str = "pvc-protection";

    async fn reconcile(&self, pvc: Arc<PersistentVolumeClaim>) -> Result<Action, Error> {
        let ns = pvc.namespace().unwrap_or_default();
        let deleting = pvc.metadata.deletion_timestamp.is_some();
        let has = pvc.finalizers().iter().any(|f| f == PVC_PROTECTION);
        // A live list, as upstream asks the API server before letting a claim go.
        let users = if deleting && has {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let name = pvc.name_any();
            pods.list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty()))
                .filter(|p| claims_of(p).contains(&name))
                .count()
        } else {
            0
        };
        if let Some(finalizers) = change(&pvc.metadata, PVC_PROTECTION, || users > 0) {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
            set_finalizers(&api, &*pvc, finalizers).await?;
            if deleting {
                tracing::info!("claim {ns}/{} is no longer used by any pod: its deletion proceeds", pvc.name_any());
            }
        }
        Ok(Action::await_change())
    }
}

impl Reconciler for VolumeProtection {
    type Object = PersistentVolume;
    const NAME: &'static str = "pv-protection";

    async fn reconcile(&self, pv: Arc<PersistentVolume>) -> Result<Action, Error> {
        let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if let Some(finalizers) = change(&pv.metadata, PV_PROTECTION, || bound) {
            set_finalizers(&Api::<PersistentVolume>::all(self.client.clone()), &*pv, finalizers).await?;
        }
        Ok(Action::await_change())
    }
}
