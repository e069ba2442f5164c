//! The pods of this node: the store's watch of pods bound here feeds one [`Worker`] per pod UID
//! (updates coalesced, newest wins); local admission (resources and host ports against the Node's
//! allocatable) runs before a pod gets a worker; PLEG relists the runtime every second and wakes the
//! workers of pods whose containers changed; probe results are routed to their pods; and orphans
//! (sandboxes, directories, cgroups of pods that are gone) are cleaned up.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::logs;
use super::objects;
use super::probes::{self, Kind, ProbeEvent, ProbeManager, What};
use super::spec;
use super::status::keys;
use super::worker::{Update, Worker};
use crate::cgroups;
use crate::events::{EventType, ObjectRef, Recorder};
use crate::runtime::cri::{self, Cri, CriError};
use crate::scheduler::types::{NodeFacts, PodInfo};
use crate::volumes;

/// How often the runtime is relisted (kubelet's PLEG period).
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// PLEG is unhealthy when no relist succeeded for this long.
const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// How often orphaned sandboxes, directories and cgroups are looked for.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(60);

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

/// What every worker shares.
pub struct Ctx {
    pub client: kube::Client,
    pub cri: Cri,
    /// This node's Node object, as the watch of it has it.
    node: Store<Node>,
    pub node_name: String,
    pub node_ip: Option<String>,
    /// `<data>/agent/pods`: one directory per pod UID (volumes, hosts file, termination logs).
    pods_dir: PathBuf,
    /// `<data>/agent/logs/pods`: the containers' CRI log files.
    logs_dir: PathBuf,
    pub runtime_name: String,
    recorder: Recorder,
    cgroups: Option<cgroups::Manager>,
    pub probes: ProbeManager,
    pub exec: Arc<dyn probes::Exec>,
    backoff: Mutex<Backoff>,
    unhealthy: Mutex<HashMap<String, Kind>>,
    pub health: Arc<RuntimeHealth>,
    memory_capacity: u64,
}

/// Why a status write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The pod is gone from the API, or another pod of that name replaced it.
    #[error("the pod is gone or was replaced")]
    Gone,
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Runs probe and hook commands through CRI ExecSync.
struct CriExec(Cri);

impl probes::Exec for CriExec {
    fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'_, anyhow::Result<probes::ExecOutput>> {
        let request =
            cri::ExecSyncRequest { container_id: container_id.into(), cmd, timeout: timeout.as_secs() as i64 };
        Box::pin(async move {
            let r = match self.0.exec_sync(request).await {
                Ok(r) => r,
                Err(CriError::Timeout { .. }) => return Err(probes::ExecTimeout.into()),
                Err(e) => return Err(e.into()),
            };
            Ok(probes::ExecOutput { exit_code: r.exit_code, stdout: r.stdout, stderr: r.stderr })
        })
    }
}

/// Settings of the pod side of the agent.
pub struct Settings {
    pub node_name: String,
    pub node_ip: Option<String>,
    pub data_dir: PathBuf,
    pub runtime_name: String,
    pub cgroups: Option<cgroups::Manager>,
    pub memory_capacity: u64,
}

impl Ctx {
    pub fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String) {
        let object = ObjectRef {
            kind: "Pod",
            api_version: "v1",
            namespace: spec::namespace(pod).into(),
            name: spec::name(pod).into(),
            uid: spec::uid(pod).into(),
        };
        self.recorder.record(object, kind, reason, "", message);
    }

    pub fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
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
        self.health.network.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn log_dir(&self, pod: &Pod) -> PathBuf {
        spec::log_dir(&self.logs_dir, pod)
    }

    fn pod_dir(&self, pod: &Pod) -> PathBuf {
        self.pods_dir.join(spec::uid(pod))
    }

    /// This node's Node object, once it is registered.
    fn node(&self) -> Option<Arc<Node>> {
        self.node.get(&reflector::ObjectRef::new(&self.node_name))
    }

    /// The Node's allocatable for the downward API's defaults.
    fn node_resources(&self) -> volumes::NodeResources {
        let allocatable = self.node().map(|n| NodeFacts::from_node(&n).allocatable).unwrap_or_default();
        volumes::NodeResources {
            cpu_milli: allocatable.milli_cpu,
            memory_bytes: allocatable.memory,
            ephemeral_storage_bytes: allocatable.ephemeral_storage,
            service_account_token: None,
        }
    }

    /// The ConfigMaps and Secrets `wanted` refers to; the error is a message for the pod's event.
    async fn objects(&self, pod: &Pod, wanted: objects::Wanted<'_>) -> Result<objects::Fetched, String> {
        objects::fetch(&self.client, pod, &wanted)
            .await
            .map_err(|e| format!("reading the ConfigMaps and Secrets the pod refers to: {e}"))
    }

    /// Creates the pod's cgroup; returns the cgroup parent for its sandbox.
    pub fn ensure_pod_cgroup(&self, pod: &Pod) -> anyhow::Result<String> {
        let Some(cg) = &self.cgroups else { return Ok(String::new()) };
        let qos = cgroups::qos_class(pod);
        cg.ensure_pod(spec::uid(pod), qos, &cgroups::pod_resources(pod))?;
        Ok(cg.pod_parent(spec::uid(pod), qos))
    }

    /// Sets up the pod's volumes; the error is the `FailedMount` event's message.
    pub async fn setup_volumes(&self, pod: &Pod) -> Result<volumes::Volumes, String> {
        let objects =
            self.objects(pod, objects::Wanted { volumes: true, containers: &[], pull_secrets: false }).await?;
        let dir = self.pod_dir(pod);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        volumes::setup(pod, &dir, &objects, &self.node_resources()).map_err(|e| e.to_string())
    }

    /// Environment, mounts and resources of one container; the error is its
    /// `CreateContainerConfigError` message.
    pub async fn container_inputs(
        &self,
        pod: &Pod,
        c: &Container,
        restart_count: i32,
        pod_ips: &[String],
        vols: &volumes::Volumes,
    ) -> Result<spec::ContainerInputs, String> {
        let objects =
            self.objects(pod, objects::Wanted { volumes: false, containers: &[c], pull_secrets: false }).await?;
        let (env, skipped) =
            super::env::container_env(pod, c, &objects, &self.node_resources()).map_err(|e| e.to_string())?;
        for s in skipped {
            self.event(pod, EventType::Warning, super::env::INVALID_ENV_NAMES_REASON, s.message());
        }
        let mut mounts = volumes::mounts_expanded(c, vols, &env).map_err(|e| e.to_string())?;
        let pod_dir = self.pod_dir(pod);
        let has = |mounts: &[cri::Mount], path: &str| mounts.iter().any(|m| m.container_path == path);
        if volumes::wants_etc_hosts(c)
            && let Some(hosts) = volumes::etc_hosts(pod, pod_ips, &pod_dir).map_err(|e| e.to_string())?
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
                .map_err(|e| format!("creating {}: {e}", file.display()))?;
            mounts.push(cri::Mount {
                container_path: message_path,
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        let resources = match &self.cgroups {
            Some(cg) => cg.container_resources(pod, c, self.memory_capacity),
            None => cgroups::container_resources(pod, c, self.memory_capacity),
        };
        Ok(spec::ContainerInputs { restart_count, env, mounts, resources })
    }

    /// Registry credentials for `image` from the pod's `imagePullSecrets` (`.dockerconfigjson` or
    /// the older `.dockercfg`), as kubelet's keyring matches them: by registry host.
    pub async fn pull_auth(&self, pod: &Pod, image: &str) -> Option<cri::AuthConfig> {
        let host = image_registry(image);
        let secrets = pod.spec.as_ref()?.image_pull_secrets.clone().unwrap_or_default();
        if secrets.is_empty() {
            return None;
        }
        let wanted = objects::Wanted { volumes: false, containers: &[], pull_secrets: true };
        let objects =
            self.objects(pod, wanted).await.map_err(|e| tracing::warn!("pod {}: {e}", spec::full_name(pod))).ok()?;
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

    /// Writes the pod's status if it is still the same pod (UID); returns the resourceVersion
    /// written. A merge patch, as kubelet's status manager sends (with the UID, which the API
    /// refuses to change, so a replaced pod is left alone): fields other components own in the
    /// status (nominatedNodeName, resize, ...) stay.
    pub async fn write_status(&self, pod: &Pod, status: Value) -> Result<u64, WriteError> {
        let patch = json!({"metadata": {"uid": spec::uid(pod)}, "status": status});
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), spec::namespace(pod));
        match pods.patch_status(spec::name(pod), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(written) => Ok(written.metadata.resource_version.and_then(|v| v.parse().ok()).unwrap_or(0)),
            Err(kube::Error::Api(s)) if s.code == 404 || (s.code == 422 && s.message.contains("metadata.uid")) => {
                Err(WriteError::Gone)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `SyncTerminatedPod`: the pod's volumes and cgroup go once its containers are stopped.
    pub async fn release(&self, pod: &Pod) {
        let (dir, cg, name) = (self.pod_dir(pod), self.cgroups.clone(), spec::full_name(pod));
        let (uid, qos) = (spec::uid(pod).to_string(), cgroups::qos_class(pod));
        let released = tokio::task::spawn_blocking(move || {
            if let Err(e) = volumes::teardown(&dir) {
                tracing::warn!("pod {name}: removing volumes: {e}");
            }
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
        self.backoff().forget_prefix(&format!("{}/", spec::uid(pod)));
    }
}

struct Handle {
    tx: watch::Sender<Update>,
    wake: Arc<Notify>,
    /// What admission counts: requests and host ports, until the worker has stopped everything.
    info: Arc<PodInfo>,
    stopped: Arc<AtomicBool>,
}

impl Handle {
    /// The pod as the worker has it, unless it is gone from the API.
    fn pod(&self) -> Option<Pod> {
        match &*self.tx.borrow() {
            Update::Pod(p) => Some((**p).clone()),
            Update::Removed(_) => None,
        }
    }

    /// Whether the pod still holds node resources (admission counts it).
    fn active(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed)
    }
}

/// Whether two versions of a pod differ in what a worker acts on (not only in status).
fn needs_sync(old: &Pod, new: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut meta = p.metadata.clone();
        meta.resource_version = None;
        meta.managed_fields = None;
        meta
    };
    old.spec != new.spec || strip(old) != strip(new)
}

/// The pod side of the agent.
pub struct Pods {
    ctx: Arc<Ctx>,
    workers: Mutex<HashMap<String, Handle>>,
    shutdown: CancellationToken,
}

/// Starts the pod workers, PLEG, probe routing and housekeeping; they run until `shutdown`.
pub fn start(
    client: kube::Client,
    cri: Cri,
    settings: Settings,
    health: Arc<RuntimeHealth>,
    shutdown: CancellationToken,
) -> Arc<Pods> {
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let exec: Arc<dyn probes::Exec> = Arc::new(CriExec(cri.clone()));
    let agent_dir = settings.data_dir.join("agent");
    let own_node = watcher::Config::default().fields(&format!("metadata.name={}", settings.node_name));
    let node = crate::client::cache(Api::<Node>::all(client.clone()), own_node, &shutdown);
    let ctx = Arc::new(Ctx {
        recorder: Recorder::spawn(client.clone(), "kubelet".into(), settings.node_name.clone()),
        client,
        cri,
        node,
        node_name: settings.node_name,
        node_ip: settings.node_ip,
        pods_dir: agent_dir.join("pods"),
        logs_dir: agent_dir.join("logs").join("pods"),
        runtime_name: settings.runtime_name,
        cgroups: settings.cgroups,
        probes: ProbeManager::new(exec.clone(), probe_tx),
        exec,
        backoff: Mutex::new(Backoff::default()),
        unhealthy: Mutex::new(HashMap::new()),
        health,
        memory_capacity: settings.memory_capacity,
    });
    let manager = Arc::new(Pods { ctx, workers: Mutex::new(HashMap::new()), shutdown: shutdown.clone() });
    tokio::spawn(manager.clone().intake());
    tokio::spawn(manager.clone().relist());
    tokio::spawn(manager.clone().route_probes(probe_rx));
    tokio::spawn(manager.clone().rotate_logs());
    manager
}

fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

impl Pods {
    fn workers(&self) -> MutexGuard<'_, HashMap<String, Handle>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod `namespace/name` among this node's, as its worker has it (gone ones too, until
    /// their worker ends).
    pub fn find(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.workers().values().find_map(|h| match &*h.tx.borrow() {
            Update::Pod(p) | Update::Removed(p) if spec::namespace(p) == namespace && spec::name(p) == name => {
                Some((**p).clone())
            }
            _ => None,
        })
    }

    /// Where the pod's container logs are.
    pub fn log_dir(&self, pod: &Pod) -> PathBuf {
        self.ctx.log_dir(pod)
    }

    fn mine(&self, pod: &Pod) -> bool {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.ctx.node_name.as_str())
    }

    /// Follows the pods bound to this node (a watch with the `spec.nodeName` field selector, as
    /// kubelet's). A relist is taken whole: its pods in creation order (admission order), and
    /// workers of pods it no longer shows told they are gone.
    async fn intake(self: Arc<Self>) {
        let shutdown = self.shutdown.clone();
        // Admission reads the Node: start once its watch has listed it.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.ctx.node.wait_until_ready() => {}
        }
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Housekeeping removes what no worker knows: never before the first listing made the workers.
        let mut ready = false;
        let mine = watcher::Config::default().fields(&format!("spec.nodeName={}", self.ctx.node_name));
        let mut pods = std::pin::pin!(watcher(Api::<Pod>::all(self.ctx.client.clone()), mine).default_backoff());
        let mut listing: Vec<Pod> = Vec::new();
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = housekeeping.tick(), if ready => {
                    self.housekeeping().await;
                    continue;
                }
                event = pods.next() => match event {
                    Some(Ok(e)) => e,
                    Some(Err(e)) => {
                        tracing::debug!("node agent: pod watch: {e}");
                        continue;
                    }
                    None => return,
                },
            };
            match event {
                Event::Init => listing.clear(),
                Event::InitApply(pod) => listing.push(pod),
                Event::InitDone => {
                    let mut pods = std::mem::take(&mut listing);
                    pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
                    let listed: HashSet<String> = pods.iter().map(|p| spec::uid(p).to_string()).collect();
                    for pod in pods.into_iter().filter(|p| self.mine(p)) {
                        self.on_pod(pod);
                    }
                    let gone: Vec<Pod> = self
                        .workers()
                        .iter()
                        .filter(|(u, _)| !listed.contains(*u))
                        .filter_map(|(_, h)| h.pod())
                        .collect();
                    for pod in gone {
                        self.on_removed(pod);
                    }
                    if !ready {
                        ready = true;
                        self.housekeeping().await;
                        housekeeping.reset();
                    }
                }
                Event::Apply(pod) if self.mine(&pod) => self.on_pod(pod),
                Event::Apply(_) => {}
                Event::Delete(pod) => self.on_removed(pod),
            }
        }
    }

    fn on_pod(self: &Arc<Self>, pod: Pod) {
        let uid = spec::uid(&pod).to_string();
        let mut workers = self.workers();
        if let Some(h) = workers.get(&uid) {
            // A change the pod's own status write caused does not wake the worker.
            h.tx.send_if_modified(|cur| {
                let wake = match cur {
                    Update::Pod(old) => needs_sync(old, &pod),
                    Update::Removed(_) => false,
                };
                if matches!(cur, Update::Pod(_)) {
                    *cur = Update::Pod(Arc::new(pod));
                }
                wake
            });
            return;
        }
        let active = !is_finished(&pod) && pod.metadata.deletion_timestamp.is_none();
        let info = Arc::new(PodInfo::from_pod(&pod));
        if active && let Some((reason, message)) = self.admit(&info, &workers) {
            drop(workers);
            self.reject(pod, reason, message);
            return;
        }
        let pod = Arc::new(pod);
        let (tx, rx) = watch::channel(Update::Pod(pod.clone()));
        let wake = Arc::new(Notify::new());
        let stopped = Arc::new(AtomicBool::new(!active));
        let worker = Worker::new(self.ctx.clone(), pod, rx, wake.clone(), stopped.clone());
        let (manager, shutdown, key) = (self.clone(), self.shutdown.clone(), uid.clone());
        tokio::spawn(async move {
            worker.run(shutdown).await;
            // Only now is the pod forgotten: housekeeping leaves a terminating pod alone.
            manager.workers().remove(&key);
        });
        workers.insert(uid, Handle { tx, wake, info, stopped });
        drop(workers);
        self.update_qos();
    }

    /// The pod is gone from the API: its worker stops what still runs and cleans up.
    fn on_removed(&self, pod: Pod) {
        let uid = spec::uid(&pod).to_string();
        let found = self.workers().get(&uid).map(|h| h.tx.send_replace(Update::Removed(Arc::new(pod)))).is_some();
        if found {
            self.update_qos();
        }
    }

    /// kubelet's `UpdateQOSCgroups`: the burstable tier's CPU shares follow its pods' requests.
    fn update_qos(&self) {
        let Some(cg) = self.ctx.cgroups.clone() else { return };
        let active: Vec<Pod> = self.workers().values().filter(|h| h.active()).filter_map(Handle::pod).collect();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = cg.update_qos(&active) {
                tracing::warn!("updating the QoS cgroups: {e}");
            }
        });
    }

    fn wake(&self, uid: &str) {
        if let Some(h) = self.workers().get(uid) {
            h.wake.notify_one();
        }
    }

    /// kubelet's local admission: the pod's requests and host ports against the Node's allocatable
    /// and the pods already admitted. Returns the reason and message of a rejection.
    fn admit(&self, pod: &PodInfo, workers: &HashMap<String, Handle>) -> Option<(String, String)> {
        let node = self.ctx.node()?;
        let allocatable = NodeFacts::from_node(&node).allocatable;
        let admitted: Vec<&Arc<PodInfo>> = workers.values().filter(|h| h.active()).map(|h| &h.info).collect();
        let used = |name: &str| admitted.iter().map(|p| p.requests.get(name)).sum::<i64>();
        if allocatable.pods > 0 && admitted.len() as i64 + 1 > allocatable.pods {
            return Some(insufficient("pods", 1, admitted.len() as i64, allocatable.pods));
        }
        let mut names = vec!["cpu".to_string(), "memory".into(), "ephemeral-storage".into()];
        names.extend(pod.requests.scalar.keys().cloned());
        for name in &names {
            let requested = pod.requests.get(name);
            if requested == 0 {
                continue;
            }
            let (used, capacity) = (used(name), allocatable.get(name));
            if used + requested > capacity {
                return Some(insufficient(name, requested, used, capacity));
            }
        }
        let taken: HashSet<(&str, i32)> =
            admitted.iter().flat_map(|p| p.host_ports.iter().map(|h| (h.protocol.as_str(), h.port))).collect();
        if pod.host_ports.iter().any(|h| taken.contains(&(h.protocol.as_str(), h.port))) {
            return Some((
                "NodePorts".into(),
                "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".into(),
            ));
        }
        None
    }

    /// Fails a pod that admission rejected, as kubelet's `rejectPod`.
    fn reject(&self, pod: Pod, reason: String, message: String) {
        tracing::info!("pod {} rejected: {message}", spec::full_name(&pod));
        self.ctx.event(&pod, EventType::Warning, &reason, message.clone());
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let status =
                json!({"phase": "Failed", "reason": reason, "message": format!("Pod was rejected: {message}")});
            for _ in 0..10 {
                match ctx.write_status(&pod, status.clone()).await {
                    // Written, or gone or replaced: nothing to reject any more.
                    Ok(_) | Err(WriteError::Gone) => return,
                    Err(e) => tracing::warn!("pod {}: writing status: {e}", spec::full_name(&pod)),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    /// PLEG: relists sandboxes and containers every second and wakes the workers of pods whose
    /// sandboxes or containers changed state (or appeared, or vanished).
    async fn relist(self: Arc<Self>) {
        let mut known: HashMap<String, (i32, String)> = HashMap::new();
        let mut tick = tokio::time::interval(RELIST_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let cri = &self.ctx.cri;
            let (containers, sandboxes) = tokio::join!(
                cri.list_containers(cri::ListContainersRequest::default()),
                cri.list_pod_sandbox(cri::ListPodSandboxRequest::default())
            );
            let (Ok(containers), Ok(sandboxes)) = (containers, sandboxes) else { continue };
            self.ctx.health.relisted.store(super::unix_now(), Ordering::Relaxed);
            let mut now: HashMap<String, (i32, String)> = HashMap::with_capacity(known.len());
            for c in containers.containers {
                let uid = c.labels.get(keys::POD_UID).cloned().unwrap_or_default();
                now.insert(c.id, (c.state, uid));
            }
            for s in sandboxes.items {
                let uid = s.labels.get(keys::POD_UID).cloned().unwrap_or_default();
                now.insert(s.id, (s.state + 100, uid));
            }
            let mut changed: HashSet<&str> = HashSet::new();
            for (id, (state, uid)) in &now {
                if known.get(id).is_none_or(|(old, _)| old != state) {
                    changed.insert(uid);
                }
            }
            for (id, (_, uid)) in &known {
                if !now.contains_key(id) {
                    changed.insert(uid);
                }
            }
            for uid in changed.into_iter().filter(|u| !u.is_empty()) {
                self.wake(uid);
            }
            let running: HashSet<&str> = now
                .iter()
                .filter(|(_, (state, _))| *state == cri::ContainerState::ContainerRunning as i32)
                .map(|(id, _)| id.as_str())
                .collect();
            self.ctx.forget_unhealthy(&running);
            known = now;
        }
    }

    /// Probe results: every failure becomes an `Unhealthy` event; a flip wakes the pod's worker
    /// (a failed liveness or startup probe marks the container for restart first).
    async fn route_probes(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<ProbeEvent>) {
        loop {
            let event = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                e = rx.recv() => match e { Some(e) => e, None => return },
            };
            let reason = if matches!(event.what, What::Warning { .. }) { "ProbeWarning" } else { "Unhealthy" };
            match event.what {
                What::Failed { message } | What::Warning { message } => {
                    let pod = self.workers().get(&event.uid).map(|h| match &*h.tx.borrow() {
                        Update::Pod(p) | Update::Removed(p) => p.clone(),
                    });
                    if let Some(pod) = pod {
                        self.ctx.event(&pod, EventType::Warning, reason, message);
                    }
                }
                What::Changed(ok) => {
                    if !ok && matches!(event.kind, Kind::Liveness | Kind::Startup) {
                        self.ctx
                            .unhealthy
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(event.container_id, event.kind);
                    }
                    self.wake(&event.uid);
                }
            }
        }
    }

    /// Rotates the log of every running container past `logs::DEFAULT_MAX_SIZE` (kubelet's
    /// `containerLogMaxSize` 10Mi, `containerLogMaxFiles` 5), so a chatty pod cannot fill the disk.
    async fn rotate_logs(self: Arc<Self>) {
        let mut tick = tokio::time::interval(logs::MONITOR_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let running = cri::ContainerFilter {
                state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
                ..Default::default()
            };
            let Ok(list) = self.ctx.cri.list_containers(cri::ListContainersRequest { filter: Some(running) }).await
            else {
                continue;
            };
            for c in list.containers {
                let label = |k: &str| c.labels.get(k).map(String::as_str).unwrap_or_default();
                let (ns, name, uid, container) = (
                    label(keys::POD_NAMESPACE),
                    label(keys::POD_NAME),
                    label(keys::POD_UID),
                    label(keys::CONTAINER_NAME),
                );
                if uid.is_empty() {
                    continue;
                }
                let restarts: i32 = c.annotations.get(keys::RESTART_COUNT).and_then(|r| r.parse().ok()).unwrap_or(0);
                let path =
                    self.ctx.logs_dir.join(format!("{ns}_{name}_{uid}")).join(spec::log_path(container, restarts));
                let cri = &self.ctx.cri;
                let id = c.id.clone();
                let reopen = move || {
                    Box::pin(async move {
                        cri.reopen_container_log(cri::ReopenContainerLogRequest { container_id: id }).await?;
                        Ok(())
                    }) as futures::future::BoxFuture<'_, anyhow::Result<()>>
                };
                match logs::rotate(&path, logs::DEFAULT_MAX_SIZE, logs::DEFAULT_MAX_FILES, reopen).await {
                    Ok(true) => tracing::debug!("rotated {}", path.display()),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("rotating the log of container {container} of pod {ns}/{name}: {e:#}"),
                }
            }
        }
    }

    /// Stops and removes sandboxes of pods this node no longer has, and removes their directories
    /// and cgroups (kubelet's `HandlePodCleanups`).
    async fn housekeeping(&self) {
        let known: HashSet<String> = self.workers().keys().cloned().collect();
        let Ok(sandboxes) = self.ctx.cri.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await else { return };
        for s in sandboxes.items {
            let Some(uid) = s.labels.get(keys::POD_UID) else { continue };
            if known.contains(uid) {
                continue;
            }
            tracing::info!("removing the sandbox {} of pod {uid}, which this node no longer runs", s.id);
            let id = s.id.clone();
            let _ = self.ctx.cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await;
            let _ = self.ctx.cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id }).await;
        }
        if let Ok(dirs) = std::fs::read_dir(&self.ctx.pods_dir) {
            for dir in dirs.flatten() {
                let uid = dir.file_name().to_string_lossy().to_string();
                if !known.contains(&uid)
                    && let Err(e) = volumes::teardown(&dir.path())
                {
                    tracing::warn!("removing the directory of gone pod {uid}: {e}");
                }
            }
        }
        if let Some(cg) = &self.ctx.cgroups
            && let Ok(pods) = cg.pods()
        {
            for (uid, qos) in pods.into_iter().filter(|(u, _)| !known.contains(u)) {
                if let Err(e) = cg.remove_pod(&uid, qos) {
                    tracing::warn!("removing the cgroup of gone pod {uid}: {e}");
                }
            }
        }
        self.ctx.backoff().gc(std::time::Instant::now());
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

/// upstream's `InsufficientResourceError` as kubelet reports it: reason `OutOf<resource>`.
fn insufficient(name: &str, requested: i64, used: i64, capacity: i64) -> (String, String) {
    (
        format!("OutOf{name}"),
        format!("Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"),
    )
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
    fn only_spec_and_metadata_changes_wake_a_worker() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
        .unwrap();
        let mut status_only = pod.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(Default::default());
        assert!(!needs_sync(&pod, &status_only));
        let mut deleted = status_only.clone();
        deleted.metadata.deletion_grace_period_seconds = Some(30);
        assert!(needs_sync(&pod, &deleted));
    }

    #[test]
    fn a_stale_relist_is_reported_as_kubelet_does() {
        let health = RuntimeHealth::default();
        assert_eq!(health.pleg_problem(), None, "no relist yet: nothing to report");
        health.relisted.store(crate::agent::unix_now(), Ordering::Relaxed);
        assert_eq!(health.pleg_problem(), None);
        health.relisted.store(crate::agent::unix_now() - 200, Ordering::Relaxed);
        let problem = health.pleg_problem().unwrap();
        assert!(problem.starts_with("PLEG is not healthy: pleg was last seen active 3m2"), "{problem}");
        assert!(problem.ends_with("; threshold is 3m0s"), "{problem}");
    }

    #[test]
    fn admission_messages_are_upstreams() {
        let (reason, message) = insufficient("cpu", 4000, 500, 2000);
        assert_eq!(reason, "OutOfcpu");
        assert_eq!(message, "Node didn't have enough resource: cpu, requested: 4000, used: 500, capacity: 2000");
    }
}
