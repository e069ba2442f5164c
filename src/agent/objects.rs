//! The ConfigMaps and Secrets one pod refers to, read through the client when its volumes or a
//! container are set up (kubelet's configmap and secret managers with the `Get` strategy): each
//! sync sees the objects as they are now, and a pod that refers to none costs no request. A
//! container's start also lists the Services its environment describes (kubelet reads them from
//! its Service informer).

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Api;

use crate::registry::kinds::pod_rules::Referenced;
use crate::volumes::Objects;

/// The objects a pod refers to, fetched; a missing one is absent.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct Fetched {
    config_maps: HashMap<String, ConfigMap>,
    secrets: HashMap<String, Secret>,
    claims: HashMap<String, PersistentVolumeClaim>,
    volumes: HashMap<String, PersistentVolume>,
    csi_drivers: HashMap<String, CSIDriver>,
    attachments: HashMap<String, VolumeAttachment>,
    services: Vec<Service>,
}

impl Fetched {
    /// What `self` knew and `newer` did not, with `newer`'s objects over `self`'s.
    pub fn merge(&mut self, newer: &Fetched) {
        extend_map(&mut self.config_maps, &newer.config_maps);
        extend_map(&mut self.secrets, &newer.secrets);
        extend_map(&mut self.claims, &newer.claims);
        extend_map(&mut self.volumes, &newer.volumes);
        extend_map(&mut self.csi_drivers, &newer.csi_drivers);
        extend_map(&mut self.attachments, &newer.attachments);
        if !newer.services.is_empty() {
            self.services = newer.services.clone();
        }
    }
}

fn extend_map<T: Clone>(into: &mut HashMap<String, T>, from: &HashMap<String, T>) {
    into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
}

impl Objects for Fetched {
    fn config_map(&self, _ns: &str, name: &str) -> Option<ConfigMap> {
        self.config_maps.get(name).cloned()
    }
    fn secret(&self, _ns: &str, name: &str) -> Option<Secret> {
        self.secrets.get(name).cloned()
    }
    fn claim(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.claims.get(name).cloned()
    }
    fn volume(&self, name: &str) -> Option<PersistentVolume> {
        self.volumes.get(name).cloned()
    }
    fn csi_driver(&self, name: &str) -> Option<CSIDriver> {
        self.csi_drivers.get(name).cloned()
    }
    fn attachment(&self, name: &str) -> Option<VolumeAttachment> {
        self.attachments.get(name).cloned()
    }
    fn services(&self) -> &[Service] {
        &self.services
    }
}

/// What to fetch: the volumes' sources (`containers: None`), or those of the given containers'
/// `env` and `envFrom`, and the pod's `imagePullSecrets` (`pull_secrets`).
pub struct Wanted<'a> {
    pub volumes: bool,
    pub containers: &'a [&'a Container],
    pub pull_secrets: bool,
}

/// The names of the ConfigMaps and Secrets `wanted` refers to.
fn referenced(pod: &Pod, wanted: &Wanted) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut refs = Referenced::default();
    let Some(spec) = pod.spec.as_ref() else { return (refs.config_maps, refs.secrets) };
    if wanted.volumes {
        refs.add_volumes(spec);
    }
    for c in wanted.containers {
        refs.add_env(c.env.as_deref(), c.env_from.as_deref());
    }
    if wanted.pull_secrets {
        refs.add_pull_secrets(spec);
    }
    (refs.config_maps, refs.secrets)
}

/// Reads what `wanted` refers to in the pod's namespace. A read that fails for another reason than
/// absence is an error: the sync is retried rather than run on a partial picture.
pub async fn fetch(client: &kube::Client, pod: &Pod, wanted: &Wanted<'_>) -> Result<Fetched, kube::Error> {
    let (cm_names, secret_names) = referenced(pod, wanted);
    let mut out = Fetched::default();
    if wanted.volumes {
        fetch_claims(client, pod, &mut out).await?;
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    if !wanted.containers.is_empty() {
        out.services = fetch_services(client, pod, ns).await?;
    }
    if cm_names.is_empty() && secret_names.is_empty() {
        return Ok(out);
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let (found_cms, found_secrets) = futures::join!(
        futures::future::try_join_all(cm_names.iter().map(|n| cms.get_opt(n))),
        futures::future::try_join_all(secret_names.iter().map(|n| secrets.get_opt(n))),
    );
    for (name, cm) in cm_names.into_iter().zip(found_cms?) {
        out.config_maps.extend(cm.map(|cm| (name, cm)));
    }
    for (name, s) in secret_names.into_iter().zip(found_secrets?) {
        out.secrets.extend(s.map(|s| (name, s)));
    }
    Ok(out)
}

/// The Services of the pod's namespace (when `enableServiceLinks`) and `default/kubernetes`.
async fn fetch_services(client: &kube::Client, pod: &Pod, ns: &str) -> Result<Vec<Service>, kube::Error> {
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let mut out = Vec::new();
    if links {
        out = Api::<Service>::namespaced(client.clone(), ns).list(&Default::default()).await?.items;
    }
    if !(links && ns == "default") {
        out.extend(Api::<Service>::namespaced(client.clone(), "default").get_opt("kubernetes").await?);
    }
    Ok(out)
}

/// How long a sync waits for a volume to be attached (kubelet's WaitForAttach, shorter: the sync is
/// retried).
const ATTACH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn is_attached(va: Option<&VolumeAttachment>) -> bool {
    va.and_then(|va| va.status.as_ref()).is_some_and(|s| s.attached)
}

/// The claims the pod's volumes name, their bound volumes, those volumes' CSIDrivers and, for drivers
/// that attach, their VolumeAttachments to this node (waited for a while until attached).
async fn fetch_claims(client: &kube::Client, pod: &Pod, out: &mut Fetched) -> Result<(), kube::Error> {
    let names = crate::controllers::protection::claims_of(pod);
    if names.is_empty() {
        return Ok(());
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let found = futures::future::try_join_all(names.iter().map(|n| claims.get_opt(n))).await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    for (name, claim) in names.into_iter().zip(found) {
        let Some(claim) = claim else { continue };
        if let Some(pv_name) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty())
            && let Some(pv) = volumes.get_opt(&pv_name).await?
        {
            if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                let driver = drivers.get_opt(&csi.driver).await?;
                if crate::csi::attach_required(driver.as_ref()) {
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
                    let name = crate::csi::attachment_name(&csi.volume_handle, &csi.driver, node);
                    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
                    let mut va = attachments.get_opt(&name).await?;
                    if !is_attached(va.as_ref()) {
                        let attached = kube::runtime::wait::await_condition(
                            attachments,
                            &name,
                            |va: Option<&VolumeAttachment>| is_attached(va),
                        );
                        if let Ok(Ok(found)) = tokio::time::timeout(ATTACH_WAIT, attached).await {
                            va = found;
                        }
                    }
                    out.attachments.extend(va.map(|va| (name, va)));
                }
                out.csi_drivers.extend(driver.map(|d| (csi.driver.clone(), d)));
            }
            out.volumes.insert(pv_name, pv);
        }
        out.claims.insert(name, claim);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn references_come_from_volumes_env_and_pull_secrets() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "secret-vol"}},
                    {"name": "c", "projected": {"sources": [{"configMap": {"name": "cm-proj"}}, {"secret": {"name": "secret-proj"}}]}},
                ],
                "containers": [{
                    "name": "c",
                    "envFrom": [{"configMapRef": {"name": "cm-from"}}, {"secretRef": {"name": "secret-from"}}],
                    "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "secret-key", "key": "k"}}}],
                }],
            }
        }))
        .unwrap();
        let names = |s: BTreeSet<String>| s.into_iter().collect::<Vec<_>>();
        let (cms, secrets) = referenced(&pod, &Wanted { volumes: true, containers: &[], pull_secrets: false });
        assert_eq!(names(cms), ["cm-proj", "cm-vol"]);
        assert_eq!(names(secrets), ["secret-proj", "secret-vol"]);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let (cms, secrets) = referenced(&pod, &Wanted { volumes: false, containers: &[c], pull_secrets: true });
        assert_eq!(names(cms), ["cm-from"]);
        assert_eq!(names(secrets), ["pull", "secret-from", "secret-key"]);
    }
}
