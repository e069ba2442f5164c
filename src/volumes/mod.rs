//! The host side of `pod.spec.volumes`, as kubelet's volume plugins lay it out under
//! `<data>/agent/pods/<uid>` (kubelet's `/var/lib/kubelet/pods/<uid>`):
//! `volumes/kubernetes.io~<plugin>/<name>` per volume, `etc-hosts` for the managed hosts file.
//!
//! `setup` is called on every pod sync: it creates what is missing and rewrites configMap, secret,
//! downwardAPI and projected contents only when they changed, with kubelet's atomic writer layout
//! (`..<timestamp>` directory, `..data` symlink, one symlink per top-level path), so a changed
//! ConfigMap shows up in running containers through the same paths. Secret, downwardAPI and
//! projected volumes (and emptyDir with medium `Memory`) live on tmpfs, so their contents never
//! reach the disk. Projected `serviceAccountToken` sources are written from
//! `NodeResources::service_account_tokens`, and skipped when there is none for them.

mod atomic;
pub mod claims;
pub(crate) mod downward;
mod hosts;
pub(crate) mod mount;
mod ownership;
mod subpath;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, HostPathVolumeSource, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
    Volume as PodVolume, VolumeProjection,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use crate::registry::kinds::pod_rules::parse_quantity;
use atomic::{FileProjection, Payload};

pub use hosts::{etc_hosts, wants_etc_hosts};
#[cfg(test)]
pub use subpath::mounts;
pub use subpath::mounts_expanded;

/// The kubelet's plugin directory names under `<pod_dir>/volumes`.
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
pub const SECRET: &str = "kubernetes.io~secret";
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
pub const PROJECTED: &str = "kubernetes.io~projected";

/// The Event reason the agent records for a `VolumeError::SetUp`.
pub const FAILED_MOUNT: &str = "FailedMount";

/// Mode of files in configMap, secret, downwardAPI and projected volumes without `defaultMode`.
const DEFAULT_MODE: u32 = 0o644;
/// emptyDir directories (and the directories wrapping configMap and secret contents).
const EMPTY_DIR_MODE: u32 = 0o777;

/// The ConfigMaps and Secrets of the cluster, and the pod's claims with their volumes, as the agent
/// sees them.
pub trait Objects {
    fn config_map(&self, ns: &str, name: &str) -> Option<ConfigMap>;
    fn secret(&self, ns: &str, name: &str) -> Option<Secret>;
    /// The Services a container's environment describes (its namespace's and `default/kubernetes`).
    fn services(&self) -> &[k8s_openapi::api::core::v1::Service] {
        &[]
    }
    /// A PersistentVolumeClaim of the pod's namespace.
    fn claim(&self, _name: &str) -> Option<PersistentVolumeClaim> {
        None
    }
    fn volume(&self, _name: &str) -> Option<PersistentVolume> {
        None
    }
    fn csi_driver(&self, _name: &str) -> Option<CSIDriver> {
        None
    }
    /// A VolumeAttachment (of a volume whose driver needs attaching).
    fn attachment(&self, _name: &str) -> Option<VolumeAttachment> {
        None
    }
}

/// What the downward API and memory-backed volumes need to know about the node (and the pod's token).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeResources {
    /// Allocatable CPU in millicores: the `limits.cpu` of containers without one.
    pub cpu_milli: i64,
    /// Allocatable memory in bytes: the `limits.memory` of containers without one, and the largest tmpfs.
    pub memory_bytes: i64,
    /// Allocatable ephemeral storage in bytes: the `limits.ephemeral-storage` of containers without one.
    pub ephemeral_storage_bytes: i64,
    /// The pod's service account tokens, written for projected `serviceAccountToken` sources.
    pub service_account_tokens: BTreeMap<TokenKey, String>,
}

/// What a projected `serviceAccountToken` source asks for: kubelet requests one token per pod,
/// audience and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenKey {
    /// Empty: the API's own audiences.
    pub audience: String,
    pub expiration_seconds: i64,
}

/// The tokens a pod's projected volumes ask for.
pub fn token_keys(pod: &Pod) -> std::collections::BTreeSet<TokenKey> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let sources = volumes.flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()));
    sources.filter_map(|s| s.service_account_token.as_ref()).map(token_key).collect()
}

/// The first projected volume with a token source.
pub fn token_volume_name(pod: &Pod) -> Option<String> {
    let mut volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let with_token = |v: &&PodVolume| {
        v.projected.iter().flat_map(|p| p.sources.iter().flatten()).any(|s| s.service_account_token.is_some())
    };
    volumes.find(with_token).map(|v| v.name.clone())
}

fn token_key(t: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection) -> TokenKey {
    TokenKey {
        audience: t.audience.clone().unwrap_or_default(),
        expiration_seconds: t.expiration_seconds.unwrap_or(3600),
    }
}

/// One materialized volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub host_path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always mounted read-only.
    pub read_only: bool,
}

/// The pod's volumes by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volumes(pub BTreeMap<String, Volume>);

impl Volumes {
    pub fn get(&self, name: &str) -> Option<&Volume> {
        self.0.get(name)
    }
}

/// Why one volume could not be set up; `Display` is upstream's message.
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    #[error("configmap \"{0}\" not found")]
    ConfigMapNotFound(String),
    #[error("secret \"{0}\" not found")]
    SecretNotFound(String),
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    SecretKey(String),
    /// hostPath type checks, downward API field errors, invalid payload paths.
    #[error("{0}")]
    Invalid(String),
    #[error("no volume plugin matched")]
    Unsupported,
    /// Several sources of one projected or downwardAPI volume failed (upstream's aggregate).
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Aggregate(Vec<SetUpError>),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

/// Errors of this module. `SetUp` displays as the message of kubelet's `FailedMount` Event; the
/// others are container-level and become the `CreateContainerConfigError` message.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {source}")]
    SetUp { volume: String, source: SetUpError },
    /// A CSI volume that must be attached first is not attached to this node (yet).
    #[error("MountVolume.WaitForAttach failed for volume \"{volume}\" : {message}")]
    WaitForAttach { volume: String, message: String },
    /// Staging a CSI volume (kubelet's `MountDevice`) failed.
    #[error("MountVolume.MountDevice failed for volume \"{volume}\" : {message}")]
    MountDevice { volume: String, message: String },
    /// Claims that cannot be used yet (kubelet's desired-state populator errors).
    #[error("Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}], failed to process volumes=[{}]: {}", .volumes.join(" "), .volumes.join(" "), .volumes.join(" "), .errors.join("; "))]
    Claims { volumes: Vec<String>, errors: Vec<String> },
    #[error("cannot find volume \"{volume}\" to mount into container \"{container}\"")]
    NotFound { volume: String, container: String },
    #[error("error SubPath `{0}` must not be an absolute path")]
    SubPathAbsolute(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    SubPathBacksteps(String),
    #[error("missing value for {0}")]
    SubPathExpr(String),
    #[error("failed to create subPath directory for volumeMount \"{mount}\" of container \"{container}\"")]
    SubPathCreate { mount: String, container: String },
    #[error("failed to prepare subPath for volumeMount \"{mount}\" of container \"{container}\"")]
    SubPathPrepare { mount: String, container: String },
    #[error("invalid MountPropagation mode: \"{0}\"")]
    Propagation(String),
    #[error("Bidirectional mount propagation is available only to privileged containers")]
    BidirectionalUnprivileged,
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

/// The `hostPath` type check and path of a static PersistentVolume's hostPath source.
pub(crate) fn host_path_volume(src: &HostPathVolumeSource) -> Result<PathBuf, SetUpError> {
    host_path(src)?;
    Ok(PathBuf::from(&src.path))
}

pub(crate) fn io_context(context: impl Into<String>) -> impl FnOnce(io::Error) -> SetUpError {
    let context = context.into();
    move |source| SetUpError::Io { context, source }
}

/// Materializes every volume of the pod under `pod_dir` (idempotent; unchanged files are not
/// rewritten) but for claims, which [`claims`] publishes. Every volume is attempted; the first
/// failure is returned.
pub fn setup(pod: &Pod, pod_dir: &Path, objects: &dyn Objects, node: &NodeResources) -> Result<Volumes, VolumeError> {
    let mut volumes = Volumes::default();
    let mut first_error = None;
    let volumes_of_claims = |v: &&PodVolume| v.persistent_volume_claim.is_none() && v.ephemeral.is_none();
    for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).filter(volumes_of_claims) {
        match setup_volume(pod, pod_dir, vol, objects, node) {
            Ok(v) => {
                volumes.0.insert(vol.name.clone(), v);
            }
            Err(source) => {
                tracing::warn!(pod = ?pod.metadata.name, volume = %vol.name, "MountVolume.SetUp failed: {source}");
                first_error.get_or_insert(VolumeError::SetUp { volume: vol.name.clone(), source });
            }
        }
    }
    first_error.map_or(Ok(volumes), Err)
}

/// Unmounts every mount under `pod_dir` (memory-backed volumes, secrets), then removes it. hostPath
/// volumes live outside `pod_dir` and are never touched. Missing `pod_dir` is not an error.
pub fn teardown(pod_dir: &Path) -> Result<(), VolumeError> {
    mount::unmount_all_under(pod_dir).map_err(|source| VolumeError::Io {
        context: format!("unmounting volumes under {}", pod_dir.display()),
        source,
    })?;
    match std::fs::remove_dir_all(pod_dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(VolumeError::Io { context: format!("removing {}", pod_dir.display()), source: e })
        }
        _ => Ok(()),
    }
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn setup_volume(
    pod: &Pod,
    pod_dir: &Path,
    vol: &PodVolume,
    objects: &dyn Objects,
    node: &NodeResources,
) -> Result<Volume, SetUpError> {
    let dir = |plugin: &str| pod_dir.join("volumes").join(plugin).join(&vol.name);
    let read_only = |host_path: PathBuf| Ok(Volume { host_path, read_only: true });
    if let Some(ed) = &vol.empty_dir {
        let path = dir(EMPTY_DIR);
        match ed.medium.as_deref().unwrap_or("") {
            "" => ensure_dir(&path, EMPTY_DIR_MODE)?,
            "Memory" => {
                let limit =
                    ed.size_limit.as_ref().and_then(|q| parse_quantity(&q.0)).map(|m| downward::ceil_div(m, 1000));
                ensure_tmpfs(&path, tmpfs_size(pod, limit, node))?;
            }
            other => return Err(SetUpError::Invalid(format!("unsupported emptyDir medium {other:?}"))),
        }
        return Ok(Volume { host_path: path, read_only: false });
    }
    if let Some(hp) = &vol.host_path {
        host_path(hp)?;
        return Ok(Volume { host_path: PathBuf::from(&hp.path), read_only: false });
    }
    let ns = namespace(pod);
    if let Some(src) = &vol.config_map {
        let optional = src.optional.unwrap_or(false);
        let payload = config_map_payload(objects, ns, &src.name, src.items.as_deref(), src.default_mode, optional)?;
        let path = dir(CONFIG_MAP);
        ensure_dir(&path, EMPTY_DIR_MODE)?;
        write_payload(&path, &payload)?;
        return read_only(path);
    }
    if let Some(src) = &vol.secret {
        let name = src.secret_name.as_deref().unwrap_or("");
        let optional = src.optional.unwrap_or(false);
        let payload = secret_payload(objects, ns, name, src.items.as_deref(), src.default_mode, optional)?;
        let path = dir(SECRET);
        ensure_tmpfs(&path, tmpfs_size(pod, None, node))?;
        write_payload(&path, &payload)?;
        return read_only(path);
    }
    if let Some(src) = &vol.downward_api {
        let payload = downward::payload(pod, src.items.as_deref().unwrap_or_default(), src.default_mode, node)?;
        let path = dir(DOWNWARD_API);
        ensure_tmpfs(&path, tmpfs_size(pod, None, node))?;
        write_payload(&path, &payload)?;
        return read_only(path);
    }
    if let Some(src) = &vol.projected {
        let payload =
            projected_payload(pod, src.sources.as_deref().unwrap_or_default(), src.default_mode, objects, node)?;
        let path = dir(PROJECTED);
        ensure_tmpfs(&path, tmpfs_size(pod, None, node))?;
        write_payload(&path, &payload)?;
        return read_only(path);
    }
    Err(SetUpError::Unsupported)
}

fn write_payload(dir: &Path, payload: &Payload) -> Result<(), SetUpError> {
    match atomic::write(dir, payload) {
        Ok(true) => {
            tracing::debug!(dir = %dir.display(), files = payload.len(), "volume contents updated");
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(atomic::WriteError::Invalid(msg)) => Err(SetUpError::Invalid(msg)),
        Err(atomic::WriteError::Io(e)) => Err(io_context(format!("writing payload to {}", dir.display()))(e)),
    }
}

/// Creates `path` (and its parents) with `mode`, correcting the mode if the umask changed it.
fn ensure_dir(path: &Path, mode: u32) -> Result<(), SetUpError> {
    let ctx = || io_context(format!("creating {}", path.display()));
    std::fs::create_dir_all(path).map_err(ctx())?;
    let meta = std::fs::metadata(path).map_err(ctx())?;
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(ctx())?;
    }
    Ok(())
}

/// A tmpfs at `path` unless one is already mounted there (kubelet's memory-backed emptyDir).
fn ensure_tmpfs(path: &Path, size: Option<i128>) -> Result<(), SetUpError> {
    let ctx = || io_context(format!("mounting tmpfs at {}", path.display()));
    std::fs::create_dir_all(path).map_err(ctx())?;
    if mount::is_mount_point(path).map_err(ctx())? {
        return Ok(());
    }
    ensure_dir(path, EMPTY_DIR_MODE)?;
    mount::ensure_tmpfs(path, size).map_err(io_context(format!("mounting tmpfs at {}", path.display())))
}

/// The size of a memory-backed volume (kubelet's `calculateEmptyDirMemorySize`): node allocatable
/// memory, lowered to the pod's memory limit and then to the volume's `sizeLimit` when those are
/// positive and smaller.
fn tmpfs_size(pod: &Pod, size_limit: Option<i128>, node: &NodeResources) -> Option<i128> {
    let mut size = i128::from(node.memory_bytes);
    if let Some(pod_limit) = pod_memory_limit(pod).filter(|l| *l > 0 && (size <= 0 || *l <= size)) {
        size = pod_limit;
    }
    if let Some(limit) = size_limit.filter(|l| *l > 0 && (size <= 0 || *l <= size)) {
        size = limit;
    }
    (size > 0).then_some(size)
}

/// The pod's memory limit in bytes, only when every container has one: the larger of the sum over
/// app containers and the largest init container.
fn pod_memory_limit(pod: &Pod) -> Option<i128> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        parse_quantity(&q.0).map(|m| downward::ceil_div(m, 1000))
    };
    let mut sum = 0;
    for c in &spec.containers {
        sum += limit(c)?;
    }
    let mut init_max = 0;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(limit(c)?);
    }
    Some(sum.max(init_max))
}

/// kubelet's hostPath type check, creating the path for the `*OrCreate` types.
fn host_path(src: &HostPathVolumeSource) -> Result<(), SetUpError> {
    use std::os::unix::fs::FileTypeExt;
    let path = Path::new(&src.path);
    let meta = std::fs::metadata(path).ok();
    let ty = meta.as_ref().map(|m| m.file_type());
    let fail = |what: &str| Err(SetUpError::Invalid(format!("hostPath type check failed: {} is not {what}", src.path)));
    match src.type_.as_deref().unwrap_or("") {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_none() => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .map_err(io_context(format!("creating {}", src.path))),
        "DirectoryOrCreate" | "Directory" if !ty.is_some_and(|t| t.is_dir()) => fail("a directory"),
        "DirectoryOrCreate" | "Directory" => Ok(()),
        "FileOrCreate" if meta.is_none() => {
            if let Some(parent) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .map_err(io_context(format!("creating {}", parent.display())))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o644)
                .open(path)
                .map(drop)
                .map_err(io_context(format!("creating {}", src.path)))
        }
        "FileOrCreate" | "File" if !ty.is_some_and(|t| t.is_file()) => fail("a file"),
        "FileOrCreate" | "File" => Ok(()),
        "Socket" if !ty.is_some_and(|t| t.is_socket()) => fail("a socket file"),
        "CharDevice" if !ty.is_some_and(|t| t.is_char_device()) => fail("a character device"),
        "BlockDevice" if !ty.is_some_and(|t| t.is_block_device()) => fail("a block device"),
        "Socket" | "CharDevice" | "BlockDevice" => Ok(()),
        other => Err(SetUpError::Invalid(format!("{other} is an invalid volume type"))),
    }
}

/// Mode from `item.mode`, else `defaultMode`, else 0644.
fn mode(item: Option<i32>, default_mode: Option<i32>) -> u32 {
    item.or(default_mode).map_or(DEFAULT_MODE, |m| m as u32 & 0o7777)
}

/// configMap `MakePayload`: every key (data and binaryData) or only `items`.
fn config_map_payload(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, SetUpError> {
    let cm = match objects.config_map(ns, name) {
        Some(cm) => cm,
        None if optional => ConfigMap::default(),
        None => return Err(SetUpError::ConfigMapNotFound(name.to_string())),
    };
    let lookup = |key: &str| {
        cm.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.as_bytes().to_vec())
            .or_else(|| cm.binary_data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone()))
    };
    let keys = || {
        let data = cm.data.iter().flat_map(|d| d.keys());
        data.chain(cm.binary_data.iter().flat_map(|d| d.keys())).cloned().collect::<Vec<_>>()
    };
    key_payload(keys(), lookup, items, default_mode, optional, SetUpError::ConfigMapKey)
}

/// secret `MakePayload`.
fn secret_payload(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, SetUpError> {
    let secret = match objects.secret(ns, name) {
        Some(s) => s,
        None if optional => Secret::default(),
        None => return Err(SetUpError::SecretNotFound(name.to_string())),
    };
    let lookup = |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone());
    let keys = secret.data.iter().flat_map(|d| d.keys()).cloned().collect();
    key_payload(keys, lookup, items, default_mode, optional, SetUpError::SecretKey)
}

fn key_payload(
    keys: Vec<String>,
    lookup: impl Fn(&str) -> Option<Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    missing: fn(String) -> SetUpError,
) -> Result<Payload, SetUpError> {
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for key in keys {
                if let Some(data) = lookup(&key) {
                    payload.insert(key, FileProjection { data, mode: mode(None, default_mode) });
                }
            }
        }
        Some(items) => {
            for item in items {
                match lookup(&item.key) {
                    Some(data) => {
                        payload.insert(item.path.clone(), FileProjection { data, mode: mode(item.mode, default_mode) });
                    }
                    None if optional => {}
                    None => return Err(missing(item.key.clone())),
                }
            }
        }
    }
    Ok(payload)
}

/// projected `collectData`: every source in order; later sources win on path conflicts.
fn projected_payload(
    pod: &Pod,
    sources: &[VolumeProjection],
    default_mode: Option<i32>,
    objects: &dyn Objects,
    node: &NodeResources,
) -> Result<Payload, SetUpError> {
    let ns = namespace(pod);
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for source in sources {
        let part = if let Some(cm) = &source.config_map {
            let optional = cm.optional.unwrap_or(false);
            config_map_payload(objects, ns, cm.name.as_str(), cm.items.as_deref(), default_mode, optional)
        } else if let Some(s) = &source.secret {
            let optional = s.optional.unwrap_or(false);
            secret_payload(objects, ns, s.name.as_str(), s.items.as_deref(), default_mode, optional)
        } else if let Some(d) = &source.downward_api {
            downward::payload(pod, d.items.as_deref().unwrap_or_default(), default_mode, node)
        } else if let Some(t) = &source.service_account_token {
            match node.service_account_tokens.get(&token_key(t)) {
                Some(token) => {
                    let file = FileProjection { data: token.clone().into_bytes(), mode: mode(None, default_mode) };
                    Ok(Payload::from([(t.path.clone(), file)]))
                }
                None => {
                    tracing::debug!(path = %t.path, "no service account token given; projected source skipped");
                    Ok(Payload::new())
                }
            }
        } else {
            continue;
        };
        match part {
            Ok(part) => payload.extend(part),
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(payload),
        1 => Err(errors.remove(0)),
        _ => Err(SetUpError::Aggregate(errors)),
    }
}
