//! Controller references (upstream's `ControllerRefManager`): which objects a controller owns, and
//! adopting the orphans its selector matches and releasing its own that no longer match, each as a
//! patch with the object's UID and resourceVersion as preconditions.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::informer::Cache;
use super::runtime::Error;
use crate::labels::selector_matches;

/// The owner reference that marks `obj`'s controller (`metav1.GetControllerOf`).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|o| o.controller == Some(true))
}

/// Whether `meta` is controlled by the object with `uid`.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    controller_of(meta).is_some_and(|o| o.uid == uid)
}

/// A controller reference to `owner` (`metav1.NewControllerRef`): controller and blocking the
/// owner's foreground deletion.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The controllers of kind `K` a pod's change concerns (upstream's `resolveControllerRef` and
/// `getPodXs`): its controller if that is a `K`, and for an orphan every `K` of its namespace
/// whose selector (`selector`) picks it.
pub fn pod_owners<K>(cache: &Cache<K>, pod: &Pod, selector: impl Fn(&K) -> &LabelSelector) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let ns = pod.namespace().unwrap_or_default();
    match controller_of(&pod.metadata) {
        Some(r) if r.kind == K::kind(&()) && r.api_version == K::api_version(&()) => {
            vec![ObjectRef::new(&r.name).within(&ns)]
        }
        Some(_) => Vec::new(),
        None => cache
            .state()
            .iter()
            .filter(|o| o.namespace().as_deref() == Some(&ns) && selector_matches(Some(selector(o)), pod.labels()))
            .map(|o| ObjectRef::from_obj(&**o))
            .collect(),
    }
}

/// Claims objects for a controller: those it controls and still selects, and orphans it selects
/// (adopted). Those it controls but no longer selects are released, unless it is being deleted.
pub struct Claim<'a, O: Resource<DynamicType = ()>> {
    pub owner: &'a O,
    /// Whether the owner may still adopt (it is not being deleted).
    pub adopting: bool,
}

impl<O: Resource<DynamicType = ()>> Claim<'_, O> {
    /// The objects of `candidates` (one namespace's) that belong to the owner after adopting and
    /// releasing; `selects` is the owner's selector.
    pub async fn claim<K>(
        &self,
        api: &Api<K>,
        candidates: impl IntoIterator<Item = Arc<K>>,
        selects: impl Fn(&K) -> bool,
    ) -> Result<Vec<Arc<K>>, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let uid = self.owner.uid().unwrap_or_default();
        let mut claimed = Vec::new();
        for obj in candidates {
            let meta = obj.meta();
            match controller_of(meta) {
                Some(r) if r.uid == uid => {
                    if selects(&obj) {
                        claimed.push(obj);
                    } else if self.adopting {
                        self.release(api, &obj, &uid).await?;
                    }
                }
                Some(_) => {}
                None => {
                    if self.adopting && meta.deletion_timestamp.is_none() && selects(&obj) {
                        match self.adopt(api, &obj).await {
                            Ok(adopted) => claimed.push(Arc::new(adopted)),
                            // Gone, or changed meanwhile: the next sync sees it as it is.
                            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
        }
        Ok(claimed)
    }

    async fn adopt<K>(&self, api: &Api<K>, obj: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let mut refs = obj.owner_references().to_vec();
        refs.push(controller_ref(self.owner));
        tracing::debug!("{} adopts {} {}", self.owner.name_any(), K::kind(&()), obj.name_any());
        patch_owners(api, obj, refs).await
    }

    async fn release<K>(&self, api: &Api<K>, obj: &K, uid: &str) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let refs: Vec<OwnerReference> = obj.owner_references().iter().filter(|o| o.uid != uid).cloned().collect();
        tracing::debug!("{} releases {} {}", self.owner.name_any(), K::kind(&()), obj.name_any());
        match patch_owners(api, obj, refs).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Replaces `obj`'s owner references, if it is still the same object at the same version.
async fn patch_owners<K>(api: &Api<K>, obj: &K, refs: Vec<OwnerReference>) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let refs = if refs.is_empty() { serde_json::Value::Null } else { json!(refs) };
    let patch = json!({"metadata": {
        "ownerReferences": refs,
        "uid": obj.uid(),
        "resourceVersion": obj.resource_version(),
    }});
    api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await
}
