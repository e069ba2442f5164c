//! What every pod worker of this node shares: the container runtime and the API behind narrow
//! traits ([`ContainerRuntime`], [`PodApi`]), the node-local set-up of a pod (its directory,
//! volumes and cgroup), probes, and the agent's bookkeeping of restart backoffs and failed probes.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::runtime::reflector::{self, Store};
use serde_json::Value;

use super::backoff::Backoff;
use super::cluster::PodApi;
use super::env::EnvError;
use super::objects::Wanted;
use super::probes::{self, Kind, ProbeManager};
use super::runtime::ContainerRuntime;
use super::spec;
use crate::cgroups;
use crate::events::EventType;
use crate::runtime::cri;
use crate::scheduler::types::NodeFacts;
use crate::volumes::{self, VolumeError};

/// PLEG is unhealthy when no relist succeeded for this long.
const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// Runtime health shared with the node heartbeat: the network's readiness and PLEG's last relist.
#[derive(Default)]
pub struct RuntimeHealth {
    network: Mutex<Option<String>>,
    relisted: AtomicU64,
}

impl RuntimeHealth {
    pub fn set_network_problem(&self, problem: Option<String>) {
        *self.network.lock().unwrap_or_else(|e| e.into_inner()) = problem;
    }

    fn network_problem(&self) -> Option<String> {
        self.network.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// PLEG relisted the runtime just now.
    pub fn relisted(&self) {
        self.relisted.store(super::unix_now(), Ordering::Relaxed);
    }

    /// kubelet's PLEG health message, when the last successful relist is too old.
    pub fn pleg_problem(&self) -> Option<String> {
        let last = self.relisted.load(Ordering::Relaxed);
        if last == 0 {
            return None;
        }
        let age = super::unix_now().saturating_sub(last);
        (age > RELIST_THRESHOLD.as_secs()).then(|| {
            format!("PLEG is not healthy: pleg was last seen active {}m{}s ago; threshold is 3m0s", age / 60, age % 60)
        })
    }
}

/// Why a pod's volumes or a container's inputs could not be set up: the message of the pod's
/// `FailedMount` event or of the container's `CreateContainerConfigError`.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("reading the ConfigMaps and Secrets the pod refers to: {0}")]
    Objects(#[from] kube::Error),
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("creating {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A device plugin could not give the container its devices.
    #[error("{0}")]
    Devices(String),
    /// No service account token for a projected volume (upstream's message for the volume).
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {why}")]
    Token { volume: String, why: String },
}

/// Where this node keeps its pods, and what it knows of itself.
pub struct Host {
    pub node_name: String,
    pub node_ip: Option<String>,
    /// `<data>/agent/pods`: one directory per pod UID (volumes, hosts file, termination logs).
    pub pods_dir: PathBuf,
    /// `<data>/agent/logs/pods`: the containers' CRI log files.
    pub logs_dir: PathBuf,
    /// This node's Node object, as the watch of it has it.
    pub node: Store<Node>,
    /// The Node as the local store last kept it: what pods are admitted against while the server
    /// cannot be reached.
    pub known_node: Option<Arc<Node>>,
    pub cgroups: Option<cgroups::Manager>,
    pub memory_capacity: u64,
    /// The runtime's name, the scheme of container IDs in the status (`containerd://<id>`).
    pub runtime_name: String,
    /// The CSI drivers registered on this node, and kubelet's plugin directories.
    pub csi_drivers: crate::csi::client::Drivers,
    pub plugin_dirs: crate::csi::PluginDirs,
    /// The device plugins' resources and what each container was given of them.
    pub devices: crate::devices::Manager,
    /// The cluster DNS pods are pointed at (kubelet's `--cluster-dns`, `--cluster-domain`).
    pub cluster_dns: super::dns::ClusterDns,
}

impl Host {
    /// This node's Node object, once it is registered (or as last known, while the server cannot
    /// be reached).
    pub fn node(&self) -> Option<Arc<Node>> {
        self.node.get(&reflector::ObjectRef::new(&self.node_name)).or_else(|| self.known_node.clone())
    }

    pub fn log_dir(&self, pod: &Pod) -> PathBuf {
        spec::log_dir(&self.logs_dir, pod)
    }

    fn pod_dir(&self, pod: &Pod) -> PathBuf {
        self.pods_dir.join(spec::uid(pod))
    }

    /// What publishing claims needs of the node.
    fn claims_node(&self) -> volumes::claims::Node<'_> {
        volumes::claims::Node {
            name: &self.node_name,
            drivers: &self.csi_drivers,
            dirs: &self.plugin_dirs,
            pods_dir: &self.pods_dir,
        }
    }

    /// Removes a pod's directory: its CSI volumes unpublished first (a volume that cannot be is left
    /// mounted, and the directory with it), then every other mount.
    pub async fn remove_pod_dir(&self, dir: PathBuf) -> Result<(), VolumeError> {
        volumes::claims::unpublish_all(&dir, &self.claims_node()).await?;
        tokio::task::spawn_blocking(move || volumes::teardown(&dir)).await.map_err(|e| VolumeError::Io {
            context: "removing a pod directory".into(),
            source: std::io::Error::other(e),
        })?
    }

    /// The Node's allocatable for the downward API's defaults.
    fn node_resources(&self) -> volumes::NodeResources {
        let allocatable = self.node().map(|n| NodeFacts::from_node(&n).allocatable).unwrap_or_default();
        volumes::NodeResources {
            cpu_milli: allocatable.milli_cpu,
            memory_bytes: allocatable.memory,
            ephemeral_storage_bytes: allocatable.ephemeral_storage,
            service_account_tokens: Default::default(),
        }
    }
}

/// What every worker shares.
pub struct Ctx {
    pub runtime: Arc<dyn ContainerRuntime>,
    pub api: Arc<dyn PodApi>,
    pub host: Host,
    pub probes: ProbeManager,
    /// Runs probe and hook commands.
    pub exec: Arc<dyn probes::Exec>,
    pub health: Arc<RuntimeHealth>,
    /// The pods' service account tokens.
    tokens: super::tokens::Tokens,
    backoff: Mutex<Backoff>,
    /// Containers whose liveness or startup probe failed, to be restarted by their worker.
    unhealthy: Mutex<HashMap<String, Kind>>,
}

impl Ctx {
    pub fn new(
        runtime: Arc<dyn ContainerRuntime>,
        api: Arc<dyn PodApi>,
        host: Host,
        probes: ProbeManager,
        exec: Arc<dyn probes::Exec>,
        health: Arc<RuntimeHealth>,
    ) -> Self {
        Ctx {
            runtime,
            api,
            host,
            probes,
            exec,
            health,
            tokens: Default::default(),
            backoff: Mutex::new(Backoff::default()),
            unhealthy: Mutex::new(HashMap::new()),
        }
    }

    pub fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String) {
        self.api.event(pod, kind, reason, message);
    }

    pub fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A container's liveness or startup probe failed: its worker restarts it.
    pub fn mark_unhealthy(&self, container_id: String, kind: Kind) {
        self.unhealthy.lock().unwrap_or_else(|e| e.into_inner()).insert(container_id, kind);
    }

    /// Forgets probe failures of containers that are gone.
    pub fn forget_unhealthy(&self, live: &HashSet<&str>) {
        self.unhealthy.lock().unwrap_or_else(|e| e.into_inner()).retain(|id, _| live.contains(id.as_str()));
    }

    /// A container whose liveness or startup probe failed, once.
    pub fn take_unhealthy(&self, container_id: &str) -> Option<Kind> {
        self.unhealthy.lock().unwrap_or_else(|e| e.into_inner()).remove(container_id)
    }

    pub fn network_problem(&self) -> Option<String> {
        self.health.network_problem()
    }

    pub fn log_dir(&self, pod: &Pod) -> PathBuf {
        self.host.log_dir(pod)
    }

    /// Creates the pod's cgroup; returns the cgroup parent for its sandbox.
    pub fn ensure_pod_cgroup(&self, pod: &Pod) -> anyhow::Result<String> {
        let Some(cg) = &self.host.cgroups else { return Ok(String::new()) };
        let qos = cgroups::qos_class(pod);
        cg.ensure_pod(spec::uid(pod), qos, &cgroups::pod_resources(pod))?;
        Ok(cg.pod_parent(spec::uid(pod), qos))
    }

    /// Sets up the pod's volumes.
    pub async fn setup_volumes(&self, pod: &Pod) -> Result<volumes::Volumes, SetupError> {
        let objects = self.api.objects(pod, Wanted { volumes: true, containers: &[], pull_secrets: false }).await?;
        let dir = self.host.pod_dir(pod);
        std::fs::create_dir_all(&dir).map_err(|source| SetupError::Io { path: dir.clone(), source })?;
        let mut resources = self.host.node_resources();
        resources.service_account_tokens = self
            .tokens
            .for_pod(self.api.as_ref(), pod)
            .await
            .map_err(|why| SetupError::Token { volume: volumes::token_volume_name(pod).unwrap_or_default(), why })?;
        let mut vols = volumes::setup(pod, &dir, &objects, &resources)?;
        vols.0.extend(volumes::claims::publish(pod, &dir, &objects, &self.host.claims_node()).await?);
        Ok(vols)
    }

    /// Environment, mounts and resources of one container.
    pub async fn container_inputs(
        &self,
        pod: &Pod,
        c: &Container,
        restart_count: i32,
        pod_ips: &[String],
        vols: &volumes::Volumes,
    ) -> Result<spec::ContainerInputs, SetupError> {
        let objects = self.api.objects(pod, Wanted { volumes: false, containers: &[c], pull_secrets: false }).await?;
        let (env, skipped) = super::env::container_env(pod, c, &objects, &self.host.node_resources())?;
        for s in skipped {
            self.event(pod, EventType::Warning, super::env::INVALID_ENV_NAMES_REASON, s.message());
        }
        let mut mounts = volumes::mounts_expanded(c, vols, &env)?;
        let pod_dir = self.host.pod_dir(pod);
        let has = |mounts: &[cri::Mount], path: &str| mounts.iter().any(|m| m.container_path == path);
        if volumes::wants_etc_hosts(c)
            && let Some(hosts) = volumes::etc_hosts(pod, pod_ips, &pod_dir)?
        {
            mounts.push(hosts);
        }
        // The termination message file, fresh for each run of the container.
        let message_path = c.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
        if !has(&mounts, &message_path) {
            let dir = pod_dir.join("containers").join(&c.name);
            let file = dir.join(restart_count.to_string());
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, b""))
                .map_err(|source| SetupError::Io { path: file.clone(), source })?;
            mounts.push(cri::Mount {
                container_path: message_path,
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        let resources = match &self.host.cgroups {
            Some(cg) => cg.container_resources(pod, c, self.host.memory_capacity),
            None => cgroups::container_resources(pod, c, self.host.memory_capacity),
        };
        let devices =
            self.host.devices.container_devices(spec::uid(pod), &c.name).await.map_err(SetupError::Devices)?;
        let mut env = env;
        env.extend(devices.envs);
        mounts.extend(devices.mounts);
        Ok(spec::ContainerInputs {
            restart_count,
            env,
            mounts,
            resources,
            devices: devices.devices,
            annotations: devices.annotations,
            cdi_devices: devices.cdi_devices,
        })
    }

    /// Registry credentials for `image` from the pod's `imagePullSecrets` (`.dockerconfigjson` or
    /// the older `.dockercfg`), as kubelet's keyring matches them: by registry host.
    pub async fn pull_auth(&self, pod: &Pod, image: &str) -> Option<cri::AuthConfig> {
        let host = image_registry(image);
        let secrets = pod.spec.as_ref()?.image_pull_secrets.clone().unwrap_or_default();
        if secrets.is_empty() {
            return None;
        }
        let wanted = Wanted { volumes: false, containers: &[], pull_secrets: true };
        let objects = self
            .api
            .objects(pod, wanted)
            .await
            .map_err(|e| tracing::warn!("pod {}: reading its image pull secrets: {e}", spec::full_name(pod)))
            .ok()?;
        for name in secrets.iter().filter_map(|s| (!s.name.is_empty()).then_some(s.name.as_str())) {
            let Some(secret) = volumes::Objects::secret(&objects, spec::namespace(pod), name) else { continue };
            let data = secret.data.unwrap_or_default();
            let auths = if let Some(json) = data.get(".dockerconfigjson") {
                serde_json::from_slice::<Value>(&json.0).ok().and_then(|v| v.get("auths").cloned())
            } else {
                data.get(".dockercfg").and_then(|json| serde_json::from_slice::<Value>(&json.0).ok())
            };
            let Some(Value::Object(auths)) = auths else { continue };
            for (server, entry) in auths {
                if config_host(&server) != host {
                    continue;
                }
                let field = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                return Some(cri::AuthConfig {
                    username: field("username"),
                    password: field("password"),
                    auth: field("auth"),
                    server_address: server.clone(),
                    identity_token: field("identitytoken"),
                    registry_token: field("registrytoken"),
                });
            }
        }
        None
    }

    /// `SyncTerminatedPod`: the pod's volumes and cgroup go once its containers are stopped.
    pub async fn release(&self, pod: &Pod) {
        let (dir, cg, name) = (self.host.pod_dir(pod), self.host.cgroups.clone(), spec::full_name(pod));
        let (uid, qos) = (spec::uid(pod).to_string(), cgroups::qos_class(pod));
        if let Err(e) = self.host.remove_pod_dir(dir).await {
            tracing::warn!("pod {name}: removing volumes: {e}");
        }
        let released = tokio::task::spawn_blocking(move || {
            if let Some(cg) = cg
                && let Err(e) = cg.remove_pod(&uid, qos)
            {
                tracing::warn!("pod {name}: removing its cgroup: {e}");
            }
        });
        let _ = released.await;
    }

    /// Forgets a pod that is gone: its logs and backoff.
    pub fn forget(&self, pod: &Pod) {
        let _ = std::fs::remove_dir_all(self.log_dir(pod));
        self.tokens.forget(spec::uid(pod));
        self.backoff().forget_prefix(&format!("{}/", spec::uid(pod)));
    }
}

/// The registry host of an image reference (`docker.io` for short names such as `busybox:1.36`).
fn image_registry(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => normalize_host(first),
        _ => "docker.io".into(),
    }
}

/// The host of a docker config `auths` key (`https://index.docker.io/v1/`, `registry.local:5000`).
fn config_host(key: &str) -> String {
    let s = key.trim_start_matches("https://").trim_start_matches("http://");
    normalize_host(s.split('/').next().unwrap_or_default())
}

fn normalize_host(host: &str) -> String {
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        h => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_of_images_and_docker_config_keys() {
        assert_eq!(image_registry("busybox"), "docker.io");
        assert_eq!(image_registry("busybox:1.36"), "docker.io");
        assert_eq!(image_registry("library/busybox"), "docker.io");
        assert_eq!(image_registry("registry.local:5000/team/app:1"), "registry.local:5000");
        assert_eq!(image_registry("localhost/app"), "localhost");
        assert_eq!(config_host("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(config_host("registry.local:5000"), "registry.local:5000");
    }

    #[test]
    fn a_stale_relist_is_reported_as_kubelet_does() {
        let health = RuntimeHealth::default();
        assert_eq!(health.pleg_problem(), None, "no relist yet: nothing to report");
        health.relisted();
        assert_eq!(health.pleg_problem(), None);
        health.relisted.store(crate::agent::unix_now() - 200, Ordering::Relaxed);
        let problem = health.pleg_problem().unwrap();
        assert!(problem.starts_with("PLEG is not healthy: pleg was last seen active 3m2"), "{problem}");
        assert!(problem.ends_with("; threshold is 3m0s"), "{problem}");
    }
}
