//! The pods of this node: the store's watch of pods bound here feeds one [`Worker`] per pod UID
//! (updates coalesced, newest wins); local admission (resources and host ports against the Node's
//! allocatable) runs before a pod gets a worker; PLEG relists the runtime every second and wakes the
//! workers of pods whose containers changed; probe results are routed to their pods; and orphans
//! (sandboxes, directories, cgroups of pods that are gone) are cleaned up.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::json;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::cluster::{ClientApi, WriteError};
use super::context::{Ctx, Host, RuntimeHealth};
use super::local_store::LocalStore;
use super::logs;
use super::probes::{self, Kind, ProbeEvent, ProbeManager, What};
use super::runtime::{ContainerRuntime, RuntimeExec};
use super::spec;
use super::static_pods;
use super::status::keys;
use super::worker::{EvictionRequest, Latest, Update, Worker};
use crate::cgroups;
use crate::events::EventType;
use crate::runtime::cri::{self, Cri};
use crate::scheduler::types::{NodeFacts, PodInfo};

/// How often the runtime is relisted (kubelet's PLEG period).
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How often orphaned sandboxes, directories and cgroups are looked for.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(60);

/// Settings of the pod side of the agent.
pub struct Settings {
    pub node_name: String,
    pub node_ip: Option<String>,
    pub data_dir: PathBuf,
    pub runtime_name: String,
    pub cgroups: Option<cgroups::Manager>,
    pub memory_capacity: u64,
    pub csi_drivers: crate::csi::client::Drivers,
    pub plugin_dirs: crate::csi::PluginDirs,
    pub devices: crate::devices::Manager,
    pub cluster_dns: super::dns::ClusterDns,
    /// The static pods of the node's manifest directory, as they change.
    pub static_pods: Option<watch::Receiver<Arc<Vec<Pod>>>>,
    /// Where a joined node keeps what it last knew, to start from while the server is away.
    pub local_store: Option<Arc<LocalStore>>,
    /// The node's pressure conditions, which admission consults.
    pub pressure: Arc<super::eviction::Pressure>,
}

struct Handle {
    tx: watch::Sender<Update>,
    wake: Arc<Notify>,
    /// What admission counts: requests and host ports, until the worker has stopped everything.
    info: Arc<PodInfo>,
    stopped: Arc<AtomicBool>,
    latest: Latest,
    eviction: EvictionRequest,
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
    client: kube::Client,
    ctx: Arc<Ctx>,
    workers: Mutex<HashMap<String, Handle>>,
    /// The static pods' source, taken by the intake.
    static_pods: Mutex<Option<watch::Receiver<Arc<Vec<Pod>>>>>,
    /// Held while mirror pods are brought in line, so that one pass runs at a time.
    mirroring: tokio::sync::Mutex<()>,
    local: Option<Arc<LocalStore>>,
    pressure: Arc<super::eviction::Pressure>,
    /// Told whenever a worker has ended (a static pod may be waiting for its name).
    ended: Notify,
    shutdown: CancellationToken,
}

/// How long a node waits for the server before it starts the pods it last knew (and admits them
/// against the Node it last knew).
pub const OFFLINE_AFTER: Duration = Duration::from_secs(10);
/// The local store's entry of the node's pods.
const PODS_ENTRY: &str = "pods";

/// A pod as the local store keeps it: what running it needs, not its changing status.
fn kept(pod: &Pod) -> Pod {
    let mut p = pod.clone();
    p.status = None;
    p.metadata.managed_fields = None;
    p.metadata.resource_version = None;
    p
}

/// How often mirror pods are checked against the static pods even without a change (kubelet
/// syncs each pod every 10 s or so).
const MIRROR_SYNC_PERIOD: Duration = Duration::from_secs(10);

/// `namespace/name`: what a static pod and its mirror pod share.
fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", spec::namespace(pod), spec::name(pod))
}

/// The static pods next time their manifests change; never when there is no source.
async fn next_static_pods(source: &mut Option<watch::Receiver<Arc<Vec<Pod>>>>) -> Option<Arc<Vec<Pod>>> {
    if let Some(rx) = source
        && rx.changed().await.is_ok()
    {
        return Some(rx.borrow_and_update().clone());
    }
    std::future::pending().await
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
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(cri);
    let exec: Arc<dyn probes::Exec> = Arc::new(RuntimeExec(runtime.clone()));
    let agent_dir = settings.data_dir.join("agent");
    let own_node = watcher::Config::default().fields(&format!("metadata.name={}", settings.node_name));
    let known_node = settings.local_store.as_ref().and_then(|l| l.get::<Node>(super::NODE_ENTRY)).map(Arc::new);
    let host = Host {
        node: crate::client::cache(Api::<Node>::all(client.clone()), own_node, &shutdown),
        known_node,
        node_name: settings.node_name.clone(),
        node_ip: settings.node_ip,
        pods_dir: agent_dir.join("pods"),
        logs_dir: agent_dir.join("logs").join("pods"),
        cgroups: settings.cgroups,
        memory_capacity: settings.memory_capacity,
        runtime_name: settings.runtime_name,
        csi_drivers: settings.csi_drivers,
        plugin_dirs: settings.plugin_dirs,
        devices: settings.devices,
        cluster_dns: settings.cluster_dns,
    };
    let api = Arc::new(ClientApi::new(client.clone(), settings.node_name, settings.local_store.clone()));
    let probes = ProbeManager::new(exec.clone(), probe_tx);
    let ctx = Arc::new(Ctx::new(runtime, api, host, probes, exec, health));
    let manager = Arc::new(Pods {
        client,
        ctx,
        workers: Mutex::new(HashMap::new()),
        static_pods: Mutex::new(settings.static_pods),
        mirroring: tokio::sync::Mutex::new(()),
        local: settings.local_store,
        pressure: settings.pressure,
        ended: Notify::new(),
        shutdown: shutdown.clone(),
    });
    tokio::spawn(manager.clone().intake());
    tokio::spawn(manager.clone().relist());
    tokio::spawn(manager.clone().route_probes(probe_rx));
    tokio::spawn(manager.clone().rotate_logs());
    manager
}

impl crate::devices::podresources::ActivePods for Pods {
    fn active_pods(&self) -> Vec<Pod> {
        self.active()
    }
}

impl super::eviction::Pods for Pods {
    fn active(&self) -> Vec<Pod> {
        Pods::active(self)
    }

    /// kubelet's `killPodNow` for an eviction: the pod's worker stops it within its grace period
    /// and fails it with reason `Evicted`; the event says why.
    fn evict(&self, pod: &Pod, eviction: super::eviction::Eviction) {
        self.ctx.event(pod, EventType::Warning, super::eviction::REASON, eviction.message.clone());
        if let Some(h) = self.workers().get(spec::uid(pod)) {
            *h.eviction.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(eviction);
            h.wake.notify_one();
        }
    }

    fn stopped(&self, uid: &str) -> bool {
        self.workers().get(uid).is_none_or(|h| !h.active())
    }
}

fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

impl Pods {
    fn workers(&self) -> MutexGuard<'_, HashMap<String, Handle>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod `namespace/name` among this node's, as its worker has it (gone ones too, until
    /// their worker ends), with the status the worker last generated (kubelet's status manager's,
    /// which may be ahead of the API's, or the only one while the server is away).
    pub fn find(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.workers().values().find_map(|h| {
            let update = h.tx.borrow();
            let p = update.pod();
            (spec::namespace(p) == namespace && spec::name(p) == name).then(|| {
                let mut pod = (**p).clone();
                if let Some(status) = h.latest.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone() {
                    pod.status = Some(status);
                }
                pod
            })
        })
    }

    /// The pods that hold node resources now, as their workers have them.
    pub fn active(&self) -> Vec<Pod> {
        self.workers().values().filter(|h| h.active()).filter_map(Handle::pod).collect()
    }

    /// The runtime the pods run on (the node endpoint's streaming sessions ask it).
    pub fn runtime(&self) -> &Arc<dyn ContainerRuntime> {
        &self.ctx.runtime
    }

    /// Where the pod's container logs are.
    pub fn log_dir(&self, pod: &Pod) -> PathBuf {
        self.ctx.log_dir(pod)
    }

    fn mine(&self, pod: &Pod) -> bool {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.ctx.host.node_name.as_str())
    }

    /// Follows the pods bound to this node (a watch with the `spec.nodeName` field selector, as
    /// kubelet's). A relist is taken whole: its pods in creation order (admission order), and
    /// workers of pods it no longer shows told they are gone.
    async fn intake(self: Arc<Self>) {
        let shutdown = self.shutdown.clone();
        // Admission reads the Node: start once its watch has listed it, or, when the server
        // cannot be reached, on the Node this node last knew.
        let known_node = self.ctx.host.known_node.is_some();
        let offline_at = tokio::time::Instant::now() + OFFLINE_AFTER;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.ctx.host.node.wait_until_ready() => {}
            _ = tokio::time::sleep_until(offline_at), if known_node => {}
        }
        // Without a listing by then, the pods this node last knew start from the local store.
        let mut offline = std::pin::pin!(tokio::time::sleep_until(offline_at));
        let mut started_offline = self.local.is_none();
        // The pods the API last showed as this node's, as the local store keeps them.
        let mut known: HashMap<String, Pod> = HashMap::new();
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Housekeeping removes what no worker knows: never before the first listing made the workers.
        let mut ready = false;
        let mine = watcher::Config::default().fields(&format!("spec.nodeName={}", self.ctx.host.node_name));
        let mut pods = std::pin::pin!(watcher(Api::<Pod>::all(self.client.clone()), mine).default_backoff());
        let mut listing: Vec<Pod> = Vec::new();
        // Static pods by UID, and the mirror pods the API shows by namespace/name.
        let mut source = self.static_pods.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut statics: HashMap<String, Pod> = HashMap::new();
        let mut mirrors: HashMap<String, Pod> = HashMap::new();
        if let Some(rx) = source.as_mut() {
            let current = rx.borrow_and_update().clone();
            self.on_static_pods(&current, &mut statics).await;
        }
        let mut mirror_sync = tokio::time::interval(MIRROR_SYNC_PERIOD);
        mirror_sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = housekeeping.tick(), if ready => {
                    self.housekeeping().await;
                    continue;
                }
                Some(current) = next_static_pods(&mut source) => {
                    self.on_static_pods(&current, &mut statics).await;
                    if ready {
                        self.sync_mirrors(&statics, &mirrors);
                    }
                    continue;
                }
                _ = self.ended.notified(), if !statics.is_empty() => {
                    self.start_statics(&statics).await;
                    continue;
                }
                _ = mirror_sync.tick(), if ready && !statics.is_empty() => {
                    self.sync_mirrors(&statics, &mirrors);
                    continue;
                }
                _ = &mut offline, if !ready && !started_offline => {
                    started_offline = true;
                    self.start_known_pods().await;
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
                    let (mirrored, mut pods): (Vec<Pod>, Vec<Pod>) =
                        std::mem::take(&mut listing).into_iter().partition(|p| static_pods::mirror_hash(p).is_some());
                    mirrors = mirrored.into_iter().map(|p| (pod_key(&p), p)).collect();
                    pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
                    let mut listed: HashSet<String> = pods.iter().map(|p| spec::uid(p).to_string()).collect();
                    // Static pods are not the API's to end.
                    listed.extend(statics.keys().cloned());
                    known = pods
                        .iter()
                        .filter(|p| self.mine(p) && !is_finished(p))
                        .map(|p| (spec::uid(p).to_string(), kept(p)))
                        .collect();
                    self.keep_pods(&known);
                    for pod in pods.into_iter().filter(|p| self.mine(p)) {
                        self.on_pod(pod).await;
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
                    // Devices checkpointed for pods deleted while the node was away are free.
                    self.ctx.host.devices.retain(&listed);
                    if !ready {
                        ready = true;
                        self.housekeeping().await;
                        housekeeping.reset();
                    }
                    self.sync_mirrors(&statics, &mirrors);
                }
                // A mirror pod is the API's picture of a static pod, never run itself.
                Event::Apply(pod) if static_pods::mirror_hash(&pod).is_some() => {
                    // The status written there is the static pod's latest (kubelet's status
                    // manager's), which its worker and node endpoint read.
                    if let Some(own) = static_pods::mirror_hash(&pod).and_then(|h| statics.get(h)) {
                        let mut own = own.clone();
                        own.status = pod.status.clone();
                        own.metadata.resource_version = pod.metadata.resource_version.clone();
                        let uid = spec::uid(&own).to_string();
                        self.on_pod(own).await;
                        // A mirror made again starts without a status: the worker writes it anew.
                        if mirrors.get(&pod_key(&pod)).map(spec::uid) != Some(spec::uid(&pod)) {
                            self.wake(&uid);
                        }
                    }
                    mirrors.insert(pod_key(&pod), pod);
                    self.sync_mirrors(&statics, &mirrors);
                }
                Event::Delete(pod) if static_pods::mirror_hash(&pod).is_some() => {
                    mirrors.remove(&pod_key(&pod));
                    self.sync_mirrors(&statics, &mirrors);
                }
                Event::Apply(pod) if self.mine(&pod) => {
                    let uid = spec::uid(&pod).to_string();
                    let changed = if is_finished(&pod) {
                        known.remove(&uid).is_some()
                    } else {
                        let k = kept(&pod);
                        if known.get(&uid) == Some(&k) {
                            false
                        } else {
                            known.insert(uid, k);
                            true
                        }
                    };
                    if changed {
                        self.keep_pods(&known);
                    }
                    self.on_pod(pod).await
                }
                Event::Apply(_) => {}
                Event::Delete(pod) => {
                    if known.remove(spec::uid(&pod)).is_some() {
                        self.keep_pods(&known);
                    }
                    self.on_removed(pod)
                }
            }
        }
    }

    async fn on_pod(self: &Arc<Self>, pod: Pod) {
        let uid = spec::uid(&pod).to_string();
        let active = !is_finished(&pod) && pod.metadata.deletion_timestamp.is_none();
        let info = Arc::new(PodInfo::from_pod(&pod));
        {
            let workers = self.workers();
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
            if is_finished(&pod) {
                // Finished while the node was away: what it held is free.
                self.ctx.host.devices.release(&uid);
            }
        }
        // Devices first, then the rest, in kubelet's order of admit handlers: the node's devices
        // may have grown before this agent's view of its Node did. Only this task admits pods:
        // none is admitted while a device plugin is asked.
        let rejected = match active {
            false => None,
            true if let Some(pressure) = self.pressure.admit(&pod) => Some(pressure),
            true => match self.ctx.host.devices.admit(&pod).await {
                Err(message) => Some(("UnexpectedAdmissionError".to_string(), message)),
                Ok(()) => self.admit(&info, &self.workers()).inspect(|_| self.ctx.host.devices.release(&uid)),
            },
        };
        if let Some((reason, message)) = rejected {
            self.reject(pod, reason, message);
            return;
        }
        let pod = Arc::new(pod);
        let (tx, rx) = watch::channel(Update::Pod(pod.clone()));
        let wake = Arc::new(Notify::new());
        let stopped = Arc::new(AtomicBool::new(!active));
        let worker = Worker::new(self.ctx.clone(), pod, rx, wake.clone(), stopped.clone());
        let (latest, eviction) = (worker.latest(), worker.eviction());
        let (manager, shutdown, key) = (self.clone(), self.shutdown.clone(), uid.clone());
        tokio::spawn(async move {
            worker.run(shutdown).await;
            // Only now is the pod forgotten: housekeeping leaves a terminating pod alone.
            manager.workers().remove(&key);
            manager.ctx.host.devices.release(&key);
            manager.ended.notify_one();
        });
        self.workers().insert(uid, Handle { tx, wake, info, stopped, latest, eviction });
        self.update_qos();
    }

    /// The manifests changed: new static pods start (an edited manifest is a new pod), those whose
    /// manifest went stop.
    async fn on_static_pods(self: &Arc<Self>, current: &[Pod], statics: &mut HashMap<String, Pod>) {
        let wanted: HashMap<String, Pod> = current.iter().map(|p| (spec::uid(p).to_string(), p.clone())).collect();
        for (uid, pod) in statics.iter() {
            if !wanted.contains_key(uid) {
                tracing::info!("static pod {}: its manifest changed or went; stopping it", spec::full_name(pod));
                self.on_removed(pod.clone());
            }
        }
        *statics = wanted;
        self.start_statics(statics).await;
    }

    /// Starts the static pods that have no worker yet, each only once no other pod of its name
    /// has one (kubelet's `allowStaticPodStart`: the pod of an edited manifest waits until the one
    /// it replaces has stopped, so that they never hold its ports or volumes together).
    async fn start_statics(self: &Arc<Self>, statics: &HashMap<String, Pod>) {
        for (uid, pod) in statics {
            let key = pod_key(pod);
            let (started, blocked) = {
                let workers = self.workers();
                let blocked = workers.iter().any(|(u, h)| u != uid && pod_key(h.tx.borrow().pod()) == key);
                (workers.contains_key(uid), blocked)
            };
            if started {
                continue;
            }
            if blocked {
                tracing::info!("static pod {}: waiting for the pod it replaces to stop", spec::full_name(pod));
                continue;
            }
            tracing::info!("static pod {}: starting it from its manifest", spec::full_name(pod));
            self.on_pod(pod.clone()).await;
        }
    }

    /// Brings the mirror pods in line with the static pods (kubelet's mirror pod client), in the
    /// background: a missing mirror is created, one of another manifest or being deleted is
    /// deleted (it is created again once gone), one whose static pod went is deleted.
    fn sync_mirrors(self: &Arc<Self>, statics: &HashMap<String, Pod>, mirrors: &HashMap<String, Pod>) {
        let (me, statics, mirrors) = (self.clone(), statics.clone(), mirrors.clone());
        tokio::spawn(async move {
            let Ok(_pass) = me.mirroring.try_lock() else { return };
            let Some(node) = me.ctx.host.node() else { return };
            let by_name: HashMap<String, &Pod> = statics.values().map(|p| (pod_key(p), p)).collect();
            for (name, mirror) in &mirrors {
                let current = by_name.get(name).is_some_and(|s| static_pods::mirror_hash(mirror) == Some(spec::uid(s)));
                if !current || mirror.metadata.deletion_timestamp.is_some() {
                    me.delete_mirror(mirror).await;
                }
            }
            for (name, pod) in by_name {
                if !mirrors.contains_key(&name) {
                    me.create_mirror(pod, &node).await;
                }
            }
        });
    }

    async fn create_mirror(&self, pod: &Pod, node: &Node) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), spec::namespace(pod));
        let mirror = static_pods::mirror_of(pod, node);
        match api.create(&kube::api::PostParams::default(), &mirror).await {
            Ok(_) => tracing::info!("static pod {}: created its mirror pod", spec::full_name(pod)),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => tracing::warn!("static pod {}: creating its mirror pod: {e}", spec::full_name(pod)),
        }
    }

    /// Deletes a mirror pod at once (grace 0, that very pod), as kubelet's `DeleteMirrorPod`.
    async fn delete_mirror(&self, mirror: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), spec::namespace(mirror));
        let params = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(spec::uid(mirror).into()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(spec::name(mirror), &params).await {
            Ok(_) => tracing::info!("deleted the mirror pod {}", spec::full_name(mirror)),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => tracing::warn!("deleting the mirror pod {}: {e}", spec::full_name(mirror)),
        }
    }

    /// The pod is gone from the API: its worker stops what still runs and cleans up.
    /// Keeps the node's pods in the local store, and the objects of those pods only.
    fn keep_pods(&self, known: &HashMap<String, Pod>) {
        let Some(local) = &self.local else { return };
        let mut pods: Vec<&Pod> = known.values().collect();
        pods.sort_by(|a, b| {
            a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp).then(spec::uid(a).cmp(spec::uid(b)))
        });
        local.put(PODS_ENTRY, &pods);
        let wanted: HashSet<String> =
            pods.iter().flat_map(|p| [super::cluster::objects_entry(p), super::cluster::tokens_entry(p)]).collect();
        let per_pod = |n: &String| n.starts_with("objects-") || n.starts_with("tokens-");
        for name in local.names().into_iter().filter(|n| per_pod(n) && !wanted.contains(n)) {
            local.remove(&name);
        }
    }

    /// Edge autonomy: the server has not listed this node's pods in time, so the pods the local
    /// store kept start (or are adopted, where their containers still run) as they were last known.
    async fn start_known_pods(self: &Arc<Self>) {
        let Some(local) = &self.local else { return };
        let pods: Vec<Pod> = local.get(PODS_ENTRY).unwrap_or_default();
        if pods.is_empty() {
            return;
        }
        tracing::info!(
            "node agent: the server has not answered for {OFFLINE_AFTER:?}: starting the {} pods node {} last knew, from its local store",
            pods.len(),
            self.ctx.host.node_name
        );
        for pod in pods {
            self.on_pod(pod).await;
        }
    }

    fn on_removed(&self, pod: Pod) {
        let uid = spec::uid(&pod).to_string();
        let found = self.workers().get(&uid).map(|h| h.tx.send_replace(Update::Removed(Arc::new(pod)))).is_some();
        if found {
            self.update_qos();
        }
    }

    /// kubelet's `UpdateQOSCgroups`: the burstable tier's CPU shares follow its pods' requests.
    fn update_qos(&self) {
        let Some(cg) = self.ctx.host.cgroups.clone() else { return };
        let active = self.active();
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
        let node = self.ctx.host.node()?;
        let mut allocatable = NodeFacts::from_node(&node).allocatable;
        let admitted: Vec<&Arc<PodInfo>> = workers.values().filter(|h| h.active()).map(|h| &h.info).collect();
        let used = |name: &str| admitted.iter().map(|p| p.requests.get(name)).sum::<i64>();
        if allocatable.pods > 0 && admitted.len() as i64 + 1 > allocatable.pods {
            return Some(insufficient("pods", 1, admitted.len() as i64, allocatable.pods));
        }
        // upstream's `sanitizeNodeAllocatable`: a device resource has at least the devices handed out.
        for (name, held) in self.ctx.host.devices.held() {
            let have = allocatable.scalar.entry(name).or_default();
            *have = (*have).max(held);
        }
        let mut names = vec!["cpu".to_string(), "memory".into(), "ephemeral-storage".into()];
        // upstream's `removeMissingExtendedResources`: a resource the Node does not list (a device
        // plugin not registered again yet after a restart) was the scheduler's to check.
        names.extend(pod.requests.scalar.keys().filter(|n| allocatable.scalar.contains_key(*n)).cloned());
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
                match ctx.api.write_status(&pod, status.clone()).await {
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
            let cri = &self.ctx.runtime;
            let (containers, sandboxes) = tokio::join!(
                cri.list_containers(cri::ListContainersRequest::default()),
                cri.list_pod_sandbox(cri::ListPodSandboxRequest::default())
            );
            let (Ok(containers), Ok(sandboxes)) = (containers, sandboxes) else { continue };
            self.ctx.health.relisted();
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
                    let pod = self.workers().get(&event.uid).map(|h| h.tx.borrow().pod().clone());
                    if let Some(pod) = pod {
                        self.ctx.event(&pod, EventType::Warning, reason, message);
                    }
                }
                What::Changed(ok) => {
                    if !ok && matches!(event.kind, Kind::Liveness | Kind::Startup) {
                        self.ctx.mark_unhealthy(event.container_id, event.kind);
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
            let Ok(list) = self.ctx.runtime.list_containers(cri::ListContainersRequest { filter: Some(running) }).await
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
                    self.ctx.host.logs_dir.join(format!("{ns}_{name}_{uid}")).join(spec::log_path(container, restarts));
                let cri = &self.ctx.runtime;
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
        let Ok(sandboxes) = self.ctx.runtime.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await else {
            return;
        };
        for s in sandboxes.items {
            let Some(uid) = s.labels.get(keys::POD_UID) else { continue };
            if known.contains(uid) {
                continue;
            }
            tracing::info!("removing the sandbox {} of pod {uid}, which this node no longer runs", s.id);
            let id = s.id.clone();
            let _ = self.ctx.runtime.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await;
            let _ = self.ctx.runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id }).await;
        }
        if let Ok(dirs) = std::fs::read_dir(&self.ctx.host.pods_dir) {
            for dir in dirs.flatten() {
                let uid = dir.file_name().to_string_lossy().to_string();
                if !known.contains(&uid)
                    && let Err(e) = self.ctx.host.remove_pod_dir(dir.path()).await
                {
                    tracing::warn!("removing the directory of gone pod {uid}: {e}");
                }
            }
        }
        if let Some(cg) = &self.ctx.host.cgroups
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
    fn admission_messages_are_upstreams() {
        let (reason, message) = insufficient("cpu", 4000, 500, 2000);
        assert_eq!(reason, "OutOfcpu");
        assert_eq!(message, "Node didn't have enough resource: cpu, requested: 4000, used: 500, capacity: 2000");
    }
}
