//! A pod's claims (`persistentVolumeClaim` volumes and the claims of generic `ephemeral` ones), as
//! kubelet's volume manager mounts them: each claim must be Bound to a volume that points back at
//! it; a CSI volume is staged once per node (NodeStageVolume to
//! `plugins/kubernetes.io/csi/<driver>/<sha256 of the handle>/globalmount`, when the driver stages) and
//! published per pod (NodePublishVolume to `<pod>/volumes/kubernetes.io~csi/<pv>/mount`), with a
//! `vol_data.json` beside each so that teardown needs nothing but the disk (after a restart, or once
//! the pod object is gone). hostPath and local volumes are used in place. `fsGroup` ownership is
//! applied as the driver's `fsGroupPolicy` says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod};
use serde::{Deserialize, Serialize};

use super::{Objects, SetUpError, Volume, VolumeError, io_context};
use crate::csi::PluginDirs;
use crate::csi::client::Drivers;
use crate::csi::proto;

/// kubelet's plugin directory name of CSI volumes under `<pod_dir>/volumes`.
pub const CSI: &str = "kubernetes.io~csi";
const VOL_DATA: &str = "vol_data.json";

/// What publishing needs of the node.
pub struct Node<'a> {
    pub name: &'a str,
    pub drivers: &'a Drivers,
    pub dirs: &'a PluginDirs,
    /// Every pod's directory is under it (to know whether another pod still uses a staged volume).
    pub pods_dir: &'a Path,
}

/// kubelet's `vol_data.json`: which driver and handle a published (or staged) path belongs to.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolData {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    spec_vol_id: String,
    volume_handle: String,
    driver_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    node_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    volume_lifecycle_mode: String,
}

/// One of the pod's volumes backed by a claim, resolved to its PersistentVolume.
struct Resolved {
    volume: String,
    pv: PersistentVolume,
    read_only: bool,
}

/// The claim a pod volume names, and whether it is mounted read-only.
fn claim_of(pod: &Pod, v: &k8s_openapi::api::core::v1::Volume) -> Option<(String, bool)> {
    if let Some(c) = &v.persistent_volume_claim {
        return Some((c.claim_name.clone(), c.read_only.unwrap_or(false)));
    }
    v.ephemeral.as_ref().map(|_| (format!("{}-{}", pod.metadata.name.as_deref().unwrap_or(""), v.name), false))
}

/// kubelet's desired-state checks of one claim: the problem, in its words.
fn resolve(
    pod: &Pod,
    v: &k8s_openapi::api::core::v1::Volume,
    objects: &dyn Objects,
) -> Result<Option<Resolved>, String> {
    let Some((claim_name, read_only)) = claim_of(pod, v) else { return Ok(None) };
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let fail = |msg: String| Err(format!("error processing PVC {ns}/{claim_name}: {msg}"));
    let Some(pvc) = objects.claim(&claim_name) else {
        return fail(format!("failed to fetch PVC from API server: persistentvolumeclaims \"{claim_name}\" not found"));
    };
    if v.ephemeral.is_some()
        && let Err(e) = crate::controllers::ephemeral_is_for_pod(pod, &pvc)
    {
        return Err(e);
    }
    let protected =
        pvc.metadata.finalizers.iter().flatten().any(|f| f == crate::registry::kinds::storage::PVC_PROTECTION);
    if pvc.metadata.deletion_timestamp.is_some() && !protected {
        return fail("PVC is being deleted".into());
    }
    if phase(&pvc) != "Bound" {
        return fail("PVC is not bound".into());
    }
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    if pv_name.is_empty() {
        return fail("PVC has empty pvc.Spec.VolumeName".into());
    }
    let Some(pv) = objects.volume(&pv_name) else {
        return fail(format!(
            "failed to fetch PV {pv_name} from API server: persistentvolumes \"{pv_name}\" not found"
        ));
    };
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return fail(format!(
            "found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    if claim_ref.uid != pvc.metadata.uid {
        return fail(format!(
            "found PV object {pv_name} but its pv.Spec.ClaimRef.UID {} does not point to claim.UID {}",
            claim_ref.uid.clone().unwrap_or_default(),
            pvc.metadata.uid.clone().unwrap_or_default()
        ));
    }
    if pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return Err(format!("volume {} has volumeMode Block, but is specified in volumeMounts", v.name));
    }
    let read_only = read_only || pv.spec.as_ref().and_then(|s| s.csi.as_ref()).and_then(|c| c.read_only) == Some(true);
    Ok(Some(Resolved { volume: v.name.clone(), pv, read_only }))
}

fn phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn write_json(path: &Path, data: &VolData) -> Result<(), SetUpError> {
    let bytes = serde_json::to_vec(data).map_err(|e| SetUpError::Invalid(e.to_string()))?;
    std::fs::write(path, bytes).map_err(io_context(format!("writing {}", path.display())))
}

/// Mounts every claim of the pod (idempotent: published volumes are left as they are). All claims
/// must be usable before any is mounted, as kubelet waits for all of a pod's volumes.
pub async fn publish(
    pod: &Pod,
    pod_dir: &Path,
    objects: &(dyn Objects + Sync),
    node: &Node<'_>,
) -> Result<BTreeMap<String, Volume>, VolumeError> {
    let mut resolved = Vec::new();
    let (mut failed, mut errors) = (Vec::new(), Vec::new());
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        match resolve(pod, v, objects) {
            Ok(Some(r)) => resolved.push(r),
            Ok(None) => {}
            Err(e) => {
                failed.push(v.name.clone());
                errors.push(e);
            }
        }
    }
    if !errors.is_empty() {
        return Err(VolumeError::Claims { volumes: failed, errors });
    }
    let mut out = BTreeMap::new();
    for r in resolved {
        let pv_name = r.pv.metadata.name.clone().unwrap_or_default();
        let spec = r.pv.spec.clone().unwrap_or_default();
        let set_up = |source: SetUpError| VolumeError::SetUp { volume: pv_name.clone(), source };
        let (path, ownership) = if let Some(hp) = &spec.host_path {
            (super::host_path_volume(hp).map_err(set_up)?, false)
        } else if let Some(local) = &spec.local {
            let path = PathBuf::from(&local.path);
            if !path.exists() {
                return Err(set_up(SetUpError::Invalid(format!("path \"{}\" does not exist", local.path))));
            }
            (path, true)
        } else if let Some(csi) = &spec.csi {
            let driver = objects.csi_driver(&csi.driver);
            let pod_info = driver.as_ref().and_then(|d| d.spec.pod_info_on_mount) == Some(true);
            // Ownership is applied when the volume is first published to the pod, not on every sync.
            let published = super::mount::is_mounted(&target_path(pod_dir, &pv_name)).unwrap_or(false);
            let publish_context = attached(&pv_name, csi, driver.as_ref(), objects, node)?;
            let target = publish_csi(pod, pod_dir, &r, csi, pod_info, publish_context, node).await?;
            let policy =
                driver.and_then(|d| d.spec.fs_group_policy).unwrap_or_else(|| "ReadWriteOnceWithFSType".into());
            let rwo = spec.access_modes.iter().flatten().any(|m| m == "ReadWriteOnce");
            let applies = match policy.as_str() {
                "File" => true,
                "None" => false,
                _ => rwo && csi.fs_type.as_deref().is_some_and(|t| !t.is_empty()),
            };
            (target, applies && !published)
        } else {
            return Err(set_up(SetUpError::Unsupported));
        };
        let security = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
        if ownership && let Some(gid) = security.and_then(|s| s.fs_group) {
            let on_mismatch = security.and_then(|s| s.fs_group_change_policy.as_deref()) == Some("OnRootMismatch");
            let target = path.clone();
            let read_only = r.read_only;
            tokio::task::spawn_blocking(move || super::ownership::set(&target, gid as u32, read_only, on_mismatch))
                .await
                .map_err(|e| set_up(SetUpError::Invalid(e.to_string())))?
                .map_err(|e| {
                    set_up(SetUpError::Io {
                        context: format!("applying fsGroup {gid} to {}", path.display()),
                        source: e,
                    })
                })?;
        }
        out.insert(r.volume.clone(), Volume { host_path: path, read_only: r.read_only });
    }
    Ok(out)
}

pub(crate) fn capability(pv: &PersistentVolume, csi: &CSIPersistentVolumeSource) -> proto::VolumeCapability {
    use proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    let spec = pv.spec.clone().unwrap_or_default();
    let mode = match spec.access_modes.iter().flatten().next().map(String::as_str) {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        Some("ReadWriteOncePod") => Mode::SingleNodeSingleWriter,
        _ => Mode::SingleNodeWriter,
    };
    proto::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            mount_flags: spec.mount_options.unwrap_or_default(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// The publish context of a volume whose driver attaches (its VolumeAttachment to this node's
/// `attachmentMetadata`), or an error while it is not attached; empty for other drivers.
fn attached(
    pv_name: &str,
    csi: &CSIPersistentVolumeSource,
    driver: Option<&k8s_openapi::api::storage::v1::CSIDriver>,
    objects: &(dyn Objects + Sync),
    node: &Node<'_>,
) -> Result<std::collections::HashMap<String, String>, VolumeError> {
    if !crate::csi::attach_required(driver) {
        return Ok(Default::default());
    }
    let name = crate::csi::attachment_name(&csi.volume_handle, &csi.driver, node.name);
    let status = objects.attachment(&name).and_then(|va| va.status);
    match status {
        Some(s) if s.attached => Ok(s.attachment_metadata.unwrap_or_default().into_iter().collect()),
        status => {
            let why = status.and_then(|s| s.attach_error?.message);
            Err(VolumeError::WaitForAttach {
                volume: pv_name.to_string(),
                message: match why {
                    Some(e) => format!("volume attachment {name} failed: {e}"),
                    None => format!("volume {} is not attached to node {} yet ({name})", csi.volume_handle, node.name),
                },
            })
        }
    }
}

/// The publish target of a CSI volume in a pod directory.
fn target_path(pod_dir: &Path, pv_name: &str) -> PathBuf {
    pod_dir.join("volumes").join(CSI).join(pv_name).join("mount")
}

async fn publish_csi(
    pod: &Pod,
    pod_dir: &Path,
    r: &Resolved,
    csi: &CSIPersistentVolumeSource,
    pod_info: bool,
    publish_context: std::collections::HashMap<String, String>,
    node: &Node<'_>,
) -> Result<PathBuf, VolumeError> {
    let pv_name = r.pv.metadata.name.clone().unwrap_or_default();
    let set_up = |message: String| VolumeError::SetUp { volume: pv_name.clone(), source: SetUpError::Invalid(message) };
    let Some(entry) = node.drivers.get(&csi.driver) else {
        return Err(set_up(format!(
            "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {} not found in the list of registered CSI drivers",
            csi.driver
        )));
    };
    let cap = capability(&r.pv, csi);
    let context: std::collections::HashMap<String, String> =
        csi.volume_attributes.clone().unwrap_or_default().into_iter().collect();
    let staging = node.dirs.staging(&csi.driver, &csi.volume_handle);
    let staged = entry.driver.capabilities().stage_unstage;
    if staged {
        let data = VolData {
            spec_vol_id: String::new(),
            volume_handle: csi.volume_handle.clone(),
            driver_name: csi.driver.clone(),
            node_name: String::new(),
            volume_lifecycle_mode: String::new(),
        };
        let parent = staging.parent().unwrap_or(&staging).to_path_buf();
        let io = |e: SetUpError| VolumeError::MountDevice { volume: pv_name.clone(), message: e.to_string() };
        std::fs::create_dir_all(&parent).map_err(io_context(format!("creating {}", parent.display()))).map_err(io)?;
        write_json(&parent.join(VOL_DATA), &data).map_err(io)?;
        let req = proto::NodeStageVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            secrets: Default::default(),
            volume_context: context.clone(),
        };
        entry
            .driver
            .stage(req)
            .await
            .map_err(|e| VolumeError::MountDevice { volume: pv_name.clone(), message: e.to_string() })?;
    }
    let target = target_path(pod_dir, &pv_name);
    let parent = target.parent().unwrap_or(&target).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(|e| set_up(format!("creating {}: {e}", parent.display())))?;
    let data = VolData {
        spec_vol_id: pv_name.clone(),
        volume_handle: csi.volume_handle.clone(),
        driver_name: csi.driver.clone(),
        node_name: node.name.to_string(),
        volume_lifecycle_mode: "Persistent".into(),
    };
    write_json(&parent.join(VOL_DATA), &data).map_err(|e| set_up(e.to_string()))?;
    let mut volume_context = context;
    if pod_info {
        // CSIDriver `podInfoOnMount`: who the volume is published for.
        let m = &pod.metadata;
        let sa = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default();
        for (k, v) in [
            ("csi.storage.k8s.io/pod.name", m.name.clone().unwrap_or_default()),
            ("csi.storage.k8s.io/pod.namespace", m.namespace.clone().unwrap_or_default()),
            ("csi.storage.k8s.io/pod.uid", m.uid.clone().unwrap_or_default()),
            ("csi.storage.k8s.io/serviceAccount.name", sa),
            ("csi.storage.k8s.io/ephemeral", "false".into()),
        ] {
            volume_context.insert(k.into(), v);
        }
    }
    let req = proto::NodePublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        publish_context,
        staging_target_path: if staged { staging.display().to_string() } else { String::new() },
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly: r.read_only,
        secrets: Default::default(),
        volume_context,
    };
    entry.driver.publish(req).await.map_err(|e| set_up(e.to_string()))?;
    Ok(target)
}

/// The CSI volumes published to any pod under `pods_dir`, by unique name: kubelet's `volumesInUse`,
/// which keeps a volume attached until the node is done with it.
pub fn in_use(pods_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(pods_dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|pod| std::fs::read_dir(pod.path().join("volumes").join(CSI)).into_iter().flatten().flatten())
        .filter_map(|v| read_vol_data(&v.path().join(VOL_DATA)))
        .map(|d| crate::csi::unique_volume_name(&d.driver_name, &d.volume_handle))
        .collect();
    names.sort();
    names.dedup();
    names
}

fn read_vol_data(path: &Path) -> Option<VolData> {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// Whether any pod directory other than `except` still has `handle` of `driver` published.
fn published_elsewhere(pods_dir: &Path, except: &Path, driver: &str, handle: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(pods_dir) else { return false };
    pods.flatten().map(|p| p.path()).filter(|p| p != except).any(|pod| {
        std::fs::read_dir(pod.join("volumes").join(CSI)).into_iter().flatten().flatten().any(|v| {
            read_vol_data(&v.path().join(VOL_DATA))
                .is_some_and(|d| d.driver_name == driver && d.volume_handle == handle)
        })
    })
}

/// Unpublishes the pod's CSI volumes (and unstages those no other pod uses), from what
/// `vol_data.json` records. A volume whose driver is not registered stays, and is an error.
pub async fn unpublish_all(pod_dir: &Path, node: &Node<'_>) -> Result<(), VolumeError> {
    let dir = pod_dir.join("volumes").join(CSI);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(data) = read_vol_data(&path.join(VOL_DATA)) else { continue };
        let io = |context: String, message: String| VolumeError::Io { context, source: std::io::Error::other(message) };
        let Some(driver) = node.drivers.get(&data.driver_name) else {
            return Err(io(
                format!("UnmountVolume.TearDown failed for volume \"{}\"", data.spec_vol_id),
                format!("CSI driver {} is not registered on this node", data.driver_name),
            ));
        };
        let target = path.join("mount");
        driver.driver.unpublish(data.volume_handle.clone(), target.display().to_string()).await.map_err(|e| {
            io(format!("UnmountVolume.TearDown failed for volume \"{}\"", data.spec_vol_id), e.to_string())
        })?;
        if super::mount::is_mounted(&target).unwrap_or(false) {
            return Err(io(
                format!("UnmountVolume.TearDown of volume \"{}\"", data.spec_vol_id),
                format!("{} is still mounted", target.display()),
            ));
        }
        let _ = std::fs::remove_dir(&target);
        let _ = std::fs::remove_file(path.join(VOL_DATA));
        let _ = std::fs::remove_dir(&path);
        tracing::debug!(volume = %data.spec_vol_id, "unpublished from {}", pod_dir.display());
        if driver.driver.capabilities().stage_unstage
            && !published_elsewhere(node.pods_dir, pod_dir, &data.driver_name, &data.volume_handle)
        {
            let staging = node.dirs.staging(&data.driver_name, &data.volume_handle);
            driver
                .driver
                .unstage(data.volume_handle.clone(), staging.display().to_string())
                .await
                .map_err(|e| io(format!("UnmountDevice failed for volume \"{}\"", data.spec_vol_id), e.to_string()))?;
            if let Some(parent) = staging.parent() {
                let _ = std::fs::remove_file(parent.join(VOL_DATA));
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
    Ok(())
}
