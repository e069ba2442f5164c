//! external-attacher for the drivers registered on this node: a VolumeAttachment for this node whose
//! `attacher` is such a driver is attached through ControllerPublishVolume (its publish context goes
//! into `status.attachmentMetadata`, for the node's NodeStage and NodePublish calls), and detached
//! through ControllerUnpublishVolume when it is deleted; the `external-attacher/<driver>` finalizer
//! holds it until then. A driver without `PUBLISH_UNPUBLISH_VOLUME` is attached trivially (marked so),
//! as external-attacher does.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::client::Drivers;
use super::proto;
use crate::controllers::runtime::{self, Error, Reconciler};

pub struct Attacher {
    client: Client,
    drivers: Drivers,
    node_name: String,
}

/// external-attacher's finalizer on the attachments it handles: `external-attacher/` and the driver's
/// name with anything but letters, digits and `-` made `-`.
pub fn finalizer(driver: &str) -> String {
    let mut name: String =
        driver.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    if name.ends_with('-') {
        name.push('X');
    }
    format!("external-attacher/{name}")
}

/// Starts the attacher; it stops with `shutdown`.
pub fn spawn(client: &Client, drivers: Drivers, node_name: &str, shutdown: &CancellationToken) {
    let controller = Controller::new(Api::<VolumeAttachment>::all(client.clone()), watcher::Config::default())
        .reconcile_all_on(drivers.changes());
    let attacher = Attacher { client: client.clone(), drivers, node_name: node_name.to_string() };
    tokio::spawn(runtime::run(controller, attacher, shutdown.clone()));
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

impl Attacher {
    async fn volume(&self, va: &VolumeAttachment) -> Result<Option<PersistentVolume>, Error> {
        let Some(pv) = va.spec.source.persistent_volume_name.as_deref() else { return Ok(None) };
        Ok(Api::<PersistentVolume>::all(self.client.clone()).get_opt(pv).await?)
    }

    async fn patch_status(&self, va: &VolumeAttachment, status: serde_json::Value) -> Result<(), Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        api.patch_status(&va.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
        Ok(())
    }

    async fn set_finalizers(&self, va: &VolumeAttachment, finalizers: Vec<String>) -> Result<(), Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": va.resource_version()}});
        match api.patch(&va.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other.map(|_| ()).map_err(Error::from),
        }
    }
}

impl Reconciler for Attacher {
    type Object = VolumeAttachment;
    const NAME: &'static str = "csi-attacher";

    async fn reconcile(&self, va: Arc<VolumeAttachment>) -> Result<Action, Error> {
        if va.spec.node_name != self.node_name {
            return Ok(Action::await_change());
        }
        let driver = &va.spec.attacher;
        let Some(entry) = self.drivers.get(driver) else { return Ok(Action::await_change()) };
        let publishes = entry.driver.capabilities().publish_unpublish;
        let finalizer = finalizer(driver);
        let has_finalizer = va.finalizers().contains(&finalizer);
        let status = va.status.clone().unwrap_or_default();

        if va.metadata.deletion_timestamp.is_some() {
            if !has_finalizer {
                return Ok(Action::await_change());
            }
            if publishes && let Some(csi) = self.volume(&va).await?.and_then(|pv| pv.spec?.csi) {
                if let Err(e) =
                    entry.driver.controller_unpublish(csi.volume_handle.clone(), entry.node_id.clone()).await
                {
                    self.patch_status(&va, json!({"detachError": {"time": now(), "message": e.to_string()}})).await?;
                    return Err(Error::Failed(format!("detaching {}: {e}", va.name_any())));
                }
                tracing::info!("detached volume {} from node {}", csi.volume_handle, self.node_name);
            }
            self.patch_status(&va, json!({"attached": false, "attachmentMetadata": null, "detachError": null})).await?;
            let keep = va.finalizers().iter().filter(|f| **f != finalizer).cloned().collect();
            self.set_finalizers(&va, keep).await?;
            return Ok(Action::await_change());
        }
        if status.attached {
            return Ok(Action::await_change());
        }
        if !has_finalizer {
            let mut list = va.finalizers().to_vec();
            list.push(finalizer);
            // The change comes back through the watch and is attached then.
            self.set_finalizers(&va, list).await?;
            return Ok(Action::await_change());
        }
        let mut metadata = std::collections::HashMap::new();
        if publishes {
            let pv = self.volume(&va).await?;
            let Some(csi) = pv.as_ref().and_then(|pv| pv.spec.as_ref()?.csi.clone()) else {
                let message = format!(
                    "persistentvolume {:?} is not a CSI volume of this node",
                    va.spec.source.persistent_volume_name.as_deref().unwrap_or_default()
                );
                self.patch_status(&va, json!({"attachError": {"time": now(), "message": message}})).await?;
                return Err(Error::Failed(message));
            };
            let pv = pv.unwrap_or_default();
            let req = proto::ControllerPublishVolumeRequest {
                volume_id: csi.volume_handle.clone(),
                node_id: entry.node_id.clone(),
                volume_capability: Some(crate::volumes::claims::capability(&pv, &csi)),
                readonly: csi.read_only.unwrap_or(false),
                secrets: Default::default(),
                volume_context: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
            };
            match entry.driver.controller_publish(req).await {
                Ok(context) => metadata = context,
                Err(e) => {
                    self.patch_status(&va, json!({"attachError": {"time": now(), "message": e.to_string()}})).await?;
                    return Err(Error::Failed(format!("attaching {}: {e}", va.name_any())));
                }
            }
            tracing::info!("attached volume {} to node {}", csi.volume_handle, self.node_name);
        }
        self.patch_status(&va, json!({"attached": true, "attachmentMetadata": metadata, "attachError": null})).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_finalizer_names_the_driver_as_external_attacher_does() {
        assert_eq!(super::finalizer("ext.csi.test"), "external-attacher/ext-csi-test");
        assert_eq!(super::finalizer("a/b."), "external-attacher/a-b-X");
    }
}
