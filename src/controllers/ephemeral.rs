//! Generic ephemeral volumes (upstream's `ephemeral-volume` controller): each `ephemeral` volume of a
//! pod gets its claim `<pod>-<volume>` from the volume's template, owned by the pod (so the garbage
//! collector deletes it with the pod).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Client, ResourceExt as _};

use super::informer::Informer;
use super::runtime::{Error, Reconciler};
use crate::events::{EventType, ObjectRef, Recorder};

pub struct EphemeralVolumes {
    pub client: Client,
    pub recorder: Recorder,
}

/// Pods, from the shared pod watch.
pub fn controller(pods: &mut Informer<Pod>) -> Controller<Pod> {
    Controller::for_shared_stream(pods.subscribe(), pods.cache())
}

/// `VolumeIsForPod`: the claim of that name was made for this pod.
pub fn is_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> Result<(), String> {
    let owned =
        pvc.owner_references().iter().any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref());
    if owned && pvc.namespace() == pod.namespace() {
        return Ok(());
    }
    Err(format!(
        "PVC {}/{} was not created for pod {}/{} (pod is not owner)",
        pvc.namespace().unwrap_or_default(),
        pvc.name_any(),
        pod.namespace().unwrap_or_default(),
        pod.name_any()
    ))
}

impl Reconciler for EphemeralVolumes {
    type Object = Pod;
    const NAME: &'static str = "ephemeral-volume";

    async fn reconcile(&self, pod: Arc<Pod>) -> Result<Action, Error> {
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let ns = pod.namespace().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(template) = vol.ephemeral.as_ref().and_then(|e| e.volume_claim_template.as_ref()) else {
                continue;
            };
            let name = format!("{}-{}", pod.name_any(), vol.name);
            let event = |message: String| {
                self.recorder.record(ObjectRef::of(&*pod), EventType::Warning, "FailedBinding", "", message);
            };
            if let Some(existing) = claims.get_opt(&name).await? {
                if let Err(e) = is_for_pod(&pod, &existing) {
                    event(format!("ephemeral volume {}: {e}", vol.name));
                }
                continue;
            }
            let meta = template.metadata.clone().unwrap_or_default();
            let claim = PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: meta.labels,
                    annotations: meta.annotations,
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: pod.name_any(),
                        uid: pod.uid().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    ..Default::default()
                },
                spec: Some(template.spec.clone()),
                status: None,
            };
            match claims.create(&PostParams::default(), &claim).await {
                Ok(_) => tracing::debug!("created claim {ns}/{name} for the ephemeral volume {} of its pod", vol.name),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    event(format!("ephemeral volume {}: create PVC {name}: {e}", vol.name));
                    return Err(e.into());
                }
            }
        }
        Ok(Action::await_change())
    }
}
