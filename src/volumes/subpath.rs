//! Container mounts of the pod's volumes (kubelet's `makeMounts`), with `subPath` kept inside its
//! volume.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1::{Mount, MountPropagation};
use k8s_openapi::api::core::v1::{Container, VolumeMount};

use super::{VolumeError, Volumes};
use crate::agent::env::expand_with;

/// One CRI mount per `volumeMount` of the container. `subPathExpr` references that cannot be
/// resolved fail (see `mounts_expanded`).
#[cfg(test)]
pub fn mounts(container: &Container, volumes: &Volumes) -> Result<Vec<Mount>, VolumeError> {
    mounts_expanded(container, volumes, &[])
}

/// `mounts`, expanding `subPathExpr` against the container's environment `env`.
pub fn mounts_expanded(
    container: &Container,
    volumes: &Volumes,
    env: &[(String, String)],
) -> Result<Vec<Mount>, VolumeError> {
    let privileged = container.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    let mut out = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let vol = volumes
            .get(&vm.name)
            .ok_or_else(|| VolumeError::NotFound { volume: vm.name.clone(), container: container.name.clone() })?;
        let sub_path = match vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => expand_sub_path(expr, env)?,
            None => vm.sub_path.clone().unwrap_or_default(),
        };
        let host_path = if sub_path.is_empty() {
            vol.host_path.clone()
        } else {
            prepare_sub_path(&vol.host_path, &sub_path, vm, &container.name)?
        };
        let container_path =
            if vm.mount_path.starts_with('/') { vm.mount_path.clone() } else { format!("/{}", vm.mount_path) };
        let propagation = match vm.mount_propagation.as_deref() {
            None | Some("None") => MountPropagation::PropagationPrivate,
            Some("HostToContainer") => MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") if !privileged => return Err(VolumeError::BidirectionalUnprivileged),
            Some("Bidirectional") => MountPropagation::PropagationBidirectional,
            Some(other) => return Err(VolumeError::Propagation(other.to_string())),
        };
        out.push(Mount {
            container_path,
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: vm.read_only.unwrap_or(false) || vol.read_only,
            propagation: propagation.into(),
            recursive_read_only: vm.recursive_read_only.as_deref() == Some("Enabled"),
            ..Default::default()
        });
    }
    Ok(out)
}

/// `ExpandContainerVolumeMounts`: every reference must name a non-empty variable.
fn expand_sub_path(expr: &str, env: &[(String, String)]) -> Result<String, VolumeError> {
    let mut missing = BTreeSet::new();
    let expanded = expand_with(expr, |name| match env.iter().rev().find(|(k, _)| k == name) {
        Some((_, v)) if !v.is_empty() => v.clone(),
        _ => {
            missing.insert(name.to_string());
            String::new()
        }
    });
    if !missing.is_empty() {
        return Err(VolumeError::SubPathExpr(missing.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(expanded)
}

/// Validates `sub_path`, creates it inside the volume when missing (with the volume's mode), and
/// returns its resolved host path, refused when symlinks lead it out of the volume.
fn prepare_sub_path(volume: &Path, sub_path: &str, vm: &VolumeMount, container: &str) -> Result<PathBuf, VolumeError> {
    if sub_path.starts_with('/') {
        return Err(VolumeError::SubPathAbsolute(sub_path.to_string()));
    }
    if sub_path.split('/').any(|p| p == "..") {
        return Err(VolumeError::SubPathBacksteps(sub_path.to_string()));
    }
    let target = volume.join(sub_path);
    if std::fs::metadata(&target).is_err()
        && let Err(e) = safe_make_dir(volume, sub_path)
    {
        tracing::warn!(volume = %volume.display(), sub_path, container, "failed to create subPath directory: {e}");
        return Err(VolumeError::SubPathCreate { mount: vm.name.clone(), container: container.to_string() });
    }
    let prepare_error = || VolumeError::SubPathPrepare { mount: vm.name.clone(), container: container.to_string() };
    let base = volume.canonicalize().map_err(|_| prepare_error())?;
    let resolved = target.canonicalize().map_err(|_| prepare_error())?;
    if !resolved.starts_with(&base) {
        tracing::warn!(sub_path, resolved = %resolved.display(), "subPath is not within volume path {}", base.display());
        return Err(prepare_error());
    }
    Ok(resolved)
}

/// Creates the missing directories of `sub_path` under `volume` with the volume's permission bits,
/// following existing symlinks only while they stay inside the volume.
fn safe_make_dir(volume: &Path, sub_path: &str) -> io::Result<()> {
    let base = volume.canonicalize()?;
    let perm = std::fs::metadata(&base)?.permissions().mode() & 0o777;
    let mut current = base.clone();
    for component in Path::new(sub_path).components() {
        let Component::Normal(name) = component else { continue };
        let next = current.join(name);
        match std::fs::symlink_metadata(&next) {
            Ok(_) => {
                let resolved = next.canonicalize()?;
                if !resolved.starts_with(&base) {
                    return Err(io::Error::other(format!("{} is not within {}", resolved.display(), base.display())));
                }
                if !resolved.is_dir() {
                    return Err(io::Error::other(format!("{} is not a directory", resolved.display())));
                }
                current = resolved;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&next)?;
                std::fs::set_permissions(&next, std::fs::Permissions::from_mode(perm))?;
                current = next;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
