//! The node agent (kubelet's job inside cairn). It registers this machine as a Node, keeps the
//! Node's status current (every 10 s, written on change or every 5 minutes), renews the node's
//! Lease in `kube-node-lease` every 10 s whether or not the node is Ready, answers `/healthz` on
//! 127.0.0.1 (kubelet's port 10248) while that heartbeat keeps going, and runs the pods bound to
//! this node ([`pods`]).

pub mod backoff;
pub mod cluster;
pub mod context;
pub mod credentials;
pub mod dns;
pub mod endpoint;
pub mod env;
pub mod eviction;
#[cfg(test)]
pub mod fake;
pub mod image_gc;
pub mod local_store;
pub mod logs;
pub mod node;
pub mod objects;
pub mod pods;
pub mod portforward;
pub mod probes;
pub mod runtime;
pub mod service_env;
pub mod sessions;
pub mod spec;
pub mod static_pods;
pub mod stats;
pub mod status;
pub mod tokens;
pub mod worker;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::net::Cidr;
use crate::runtime::Cri;
use node::{Inputs, Machine, Reserved};

/// How often the status is computed (kubelet's `nodeStatusUpdateFrequency`).
const STATUS_PERIOD: Duration = Duration::from_secs(10);
/// How often an unchanged status is written anyway (kubelet's `nodeStatusReportFrequency`).
const REPORT_PERIOD: Duration = Duration::from_secs(300);
/// The Lease's duration; it is renewed every quarter of it.
const LEASE_SECONDS: i32 = 40;
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// What the agent needs to know about its node.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub data_dir: std::path::PathBuf,
    pub node_ip: Option<IpAddr>,
    pub pod_cidr: Cidr,
    /// `--system-reserved` plus `--kube-reserved`.
    pub reserved: Reserved,
    /// Port of `/healthz` on 127.0.0.1; 0 turns it off.
    pub healthz_port: u16,
    /// Port of the node endpoint (kubelet's `--port`, 10250).
    pub kubelet_port: u16,
    /// Where CSI plugins register and volumes are staged, and where the built-in driver keeps volumes.
    pub storage: crate::csi::NodeStorage,
    /// `--device RESOURCE=GLOB`: device nodes offered through the built-in generic device plugin.
    pub devices: Vec<crate::devices::generic::DeviceGlob>,
    /// The NVIDIA GPUs found at start (none with `--disable-gpu`), offered as `nvidia.com/gpu`.
    pub gpus: Option<crate::devices::nvidia::Gpus>,
    /// The cluster DNS pods are pointed at (k3s: 10.43.0.10, cluster.local).
    pub cluster_dns: dns::ClusterDns,
    /// kubelet's `--cgroup-root`: pods go under `<cgroup_root>/kubepods`.
    pub cgroup_root: String,
    /// Whether this node runs the control plane too (`cairn server`).
    pub control_plane: bool,
    /// kubelet's `--pod-manifest-path`: the static pods' manifests.
    pub pod_manifest_path: std::path::PathBuf,
    /// kubelet's `--image-gc-*` flags.
    pub image_gc: image_gc::Policy,
    /// kubelet's `--eviction-*` flags.
    pub eviction: eviction::Config,
}

/// The local store's entry of the Node.
pub const NODE_ENTRY: &str = "node";

/// `/healthz` fails once the heartbeat has not completed for this long.
const HEALTHZ_STALE: Duration = Duration::from_secs(60);

/// When the heartbeat last completed (seconds since the epoch).
#[derive(Default)]
struct Health(AtomicU64);

impl Health {
    fn beat(&self) {
        self.0.store(unix_now(), Ordering::Relaxed);
    }
    /// `None` when healthy, else how long since the last completed heartbeat.
    fn stale_for(&self) -> Option<u64> {
        let age = unix_now().saturating_sub(self.0.load(Ordering::Relaxed));
        (age > HEALTHZ_STALE.as_secs()).then_some(age)
    }
}

/// The Node as kubelet names it in its events (its UID is its name, as kubelet's `nodeRef`).
fn node_ref(name: &str) -> crate::events::ObjectRef {
    crate::events::ObjectRef {
        kind: "Node",
        api_version: "v1",
        namespace: String::new(),
        name: name.to_string(),
        uid: name.to_string(),
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Starts the node's heartbeat (status and lease) and the pod workers; they run until `shutdown`.
/// `endpoint` is the node endpoint's listener (its port is `cfg.kubelet_port`), when it could be bound.
/// `controller` is the client of the node's CSI provisioner and attacher.
pub fn start(
    client: kube::Client,
    controller: kube::Client,
    cri: Cri,
    cfg: Config,
    endpoint: Option<endpoint::Listener>,
    shutdown: CancellationToken,
) {
    let machine = Machine::read(&cfg.data_dir);
    tracing::info!(
        "node agent: registering node {} ({} CPUs, {} MiB memory, pod CIDR {})",
        cfg.node_name,
        machine.cpus,
        machine.memory_bytes >> 20,
        cfg.pod_cidr
    );
    let health = Arc::new(Health::default());
    health.beat();
    if cfg.healthz_port != 0 {
        tokio::spawn(serve_healthz(cfg.healthz_port, health.clone(), shutdown.clone()));
    }
    let runtime_health = Arc::new(context::RuntimeHealth::default());
    let driver = if crate::runtime::containerd::systemd_cgroup_driver() {
        crate::cgroups::Driver::Systemd
    } else {
        crate::cgroups::Driver::Cgroupfs
    };
    let cgroups = match crate::cgroups::Manager::new(driver, &cfg.cgroup_root) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!("node agent: pods run without pod cgroups: {e}");
            None
        }
    };
    let pod_cgroups = cgroups.clone();
    let csi_drivers = crate::csi::client::Drivers::default();
    let storage = cfg.storage.clone();
    let device_dir = crate::devices::plugins_dir(&storage.kubelet_root_dir);
    if let Err(e) = std::fs::create_dir_all(&device_dir) {
        tracing::error!("node agent: creating {}: {e}", device_dir.display());
    }
    let devices = crate::devices::Manager::new(&device_dir);
    if let Err(e) = crate::devices::registration::serve(&device_dir, devices.clone(), shutdown.clone()) {
        tracing::error!("node agent: device plugins cannot register: {e:#}");
    }
    for glob in cfg.devices.clone() {
        let (dir, stop) = (device_dir.clone(), shutdown.clone());
        tokio::spawn(async move {
            let resource = glob.resource.clone();
            if let Err(e) = crate::devices::generic::run(glob, dir, stop).await {
                tracing::error!("node agent: --device {resource}: {e:#}");
            }
        });
    }
    let labels = cfg.gpus.as_ref().map(crate::devices::nvidia::Gpus::labels).unwrap_or_default();
    if let Some(gpus) = cfg.gpus.clone() {
        tokio::spawn(offer_gpus(client.clone(), cri.clone(), gpus, device_dir.clone(), shutdown.clone()));
    }
    // A joined node keeps what it last knew, to start from while the server is away; the server's
    // own node always reaches its API.
    let local_store = if cfg.control_plane {
        None
    } else {
        let agent_dir = cfg.data_dir.join("agent");
        match local_store::LocalStore::open(&agent_dir.join("local-store"), &agent_dir.join("local-store.key")) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                tracing::warn!("node agent: no local store, pods cannot start while the server is away: {e:#}");
                None
            }
        }
    };
    let pressure = Arc::new(eviction::Pressure::default());
    let mut settings = pods::Settings {
        node_name: cfg.node_name.clone(),
        node_ip: cfg.node_ip.map(|ip| ip.to_string()),
        data_dir: cfg.data_dir.clone(),
        runtime_name: String::new(),
        cgroups,
        memory_capacity: machine.memory_bytes,
        csi_drivers: csi_drivers.clone(),
        plugin_dirs: storage.plugin_dirs(),
        devices: devices.clone(),
        cluster_dns: cfg.cluster_dns.clone(),
        static_pods: Some(static_pods::watch_dir(
            cfg.pod_manifest_path.clone(),
            cfg.node_name.clone(),
            shutdown.clone(),
        )),
        local_store: local_store.clone(),
        pressure: pressure.clone(),
    };
    let heartbeat = Heartbeat {
        nodes: Api::all(client.clone()),
        leases: Api::namespaced(client.clone(), LEASE_NAMESPACE),
        cri: cri.clone(),
        cfg,
        machine,
        health,
        runtime_health: runtime_health.clone(),
        devices: devices.clone(),
        pressure: pressure.clone(),
        labels,
        lease: std::sync::Mutex::new(None),
        local: local_store,
    };
    let image_gc = image_gc::ImageGc::new(
        cri.clone(),
        heartbeat.cfg.image_gc.clone(),
        image_gc::Protected {
            sandbox_image: crate::runtime::PAUSE_IMAGE.into(),
            imported_state: (!heartbeat.cfg.image_gc.air_gapped)
                .then(|| crate::runtime::imported_state_file(&heartbeat.cfg.data_dir)),
        },
    );
    let recorder = crate::events::Recorder::spawn(client.clone(), "kubelet".into(), heartbeat.cfg.node_name.clone());
    tokio::spawn(image_gc.clone().run(recorder.clone(), node_ref(&heartbeat.cfg.node_name), shutdown.clone()));
    let evictions = eviction::Manager {
        config: heartbeat.cfg.eviction.clone(),
        pressure,
        recorder,
        node: node_ref(&heartbeat.cfg.node_name),
    };
    let nodefs = heartbeat.cfg.data_dir.join("agent");
    let pods_memory = i128::from(heartbeat.machine.memory_bytes) - heartbeat.cfg.reserved.get("memory") / 1000;
    let image_cri = cri.clone();
    let first = Arc::new(tokio::sync::Notify::new());
    let registered = first.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move { heartbeat.run(shutdown, registered).await });
    tokio::spawn(async move {
        // Pods are admitted against the Node's allocatable: wait for the first heartbeat, or, on a
        // node that kept its Node, for a while (the server may not be reachable at all).
        let known = settings.local_store.as_ref().is_some_and(|l| l.has(NODE_ENTRY));
        tokio::select! {
            _ = first.notified() => {}
            _ = tokio::time::sleep(pods::OFFLINE_AFTER), if known => {}
            _ = stop.cancelled() => return,
        }
        // Container IDs are reported as `<runtime>://<id>`.
        let runtime = cri.readiness().await.map(|r| r.runtime).unwrap_or_default();
        settings.runtime_name =
            runtime.split("://").next().filter(|n| !n.is_empty()).unwrap_or("containerd").to_string();
        let node_name = settings.node_name.clone();
        // Volumes of running pods are published again at their first sync: the built-in
        // driver registers first.
        crate::csi::start_node(&client, &controller, &storage, &node_name, csi_drivers, &stop).await;
        let socket = std::path::PathBuf::from(cri.endpoint().trim_start_matches("unix://"));
        let sessions = sessions::ExecSessions::new(crate::runtime::tasks::Tasks::new(&socket));
        let pods = pods::start(client, cri, settings, runtime_health, stop.clone());
        let pod_resources = crate::devices::podresources::dir(&storage.kubelet_root_dir);
        if let Err(e) = crate::devices::podresources::serve(&pod_resources, devices, pods.clone(), stop.clone()) {
            tracing::error!("node agent: the pod resources API is not served: {e:#}");
        }
        let stats = stats::Stats::new(pods.runtime().clone(), node_name);
        tokio::spawn(stats.clone().run(stop.clone()));
        let sources = eviction::observe::Sources {
            stats: stats.clone(),
            cri: image_cri,
            nodefs,
            pods_memory,
            image_gc,
            cgroups: pod_cgroups,
            image_fs: Default::default(),
        };
        tokio::spawn(evictions.run(sources, pods.clone(), stats.samples(), stop.clone()));
        if let Some(e) = endpoint {
            let router = endpoint::router(pods, stats, sessions);
            if let Some(local) = e.local {
                local(router.clone());
            }
            tokio::spawn(crate::api::serve(e.listener, e.tls, router, stop));
        }
    });
}

/// Offers the GPUs through the built-in NVIDIA plugin (CDI names where the runtime passes them on),
/// and makes the RuntimeClass of each NVIDIA runtime handler containerd was given, as k3s does.
async fn offer_gpus(
    client: kube::Client,
    cri: Cri,
    gpus: crate::devices::nvidia::Gpus,
    dir: std::path::PathBuf,
    shutdown: CancellationToken,
) {
    use k8s_openapi::api::node::v1::RuntimeClass;
    let runtime = cri.readiness().await.map(|r| r.runtime).unwrap_or_default();
    let (name, version) = runtime.split_once("://").unwrap_or_default();
    let cdi = crate::devices::nvidia::runtime_supports_cdi(name, version);
    let classes: Api<RuntimeClass> = Api::all(client);
    for (handler, _) in &gpus.runtimes {
        let class = RuntimeClass {
            metadata: ObjectMeta { name: Some(handler.clone()), ..Default::default() },
            handler: handler.clone(),
            ..Default::default()
        };
        match classes.create(&PostParams::default(), &class).await {
            Ok(_) => tracing::info!("node agent: created the RuntimeClass {handler} for NVIDIA's container runtime"),
            Err(e) if is_conflict(&e) => {}
            Err(e) => tracing::warn!("node agent: creating the RuntimeClass {handler}: {e}"),
        }
    }
    if let Err(e) = crate::devices::nvidia::run(gpus, cdi, dir, shutdown).await {
        tracing::error!("node agent: the NVIDIA GPUs are not offered: {e:#}");
    }
}

/// Answers `GET /healthz` with `ok`, or 500 when the heartbeat is stale. Another process on the port
/// only costs this endpoint, with a warning.
async fn serve_healthz(port: u16, health: Arc<Health>, shutdown: CancellationToken) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("node agent: cannot serve /healthz on {addr}: {e}");
            return;
        }
    };
    let app = axum::Router::new().route(
        "/healthz",
        axum::routing::get(move || {
            let health = health.clone();
            async move {
                match health.stale_for() {
                    None => (axum::http::StatusCode::OK, "ok".to_string()),
                    Some(age) => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the node heartbeat last completed {age}s ago"),
                    ),
                }
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::warn!("node agent: /healthz stopped: {e}");
    }
}

struct Heartbeat {
    nodes: Api<Node>,
    leases: Api<Lease>,
    cri: Cri,
    cfg: Config,
    machine: Machine,
    health: Arc<Health>,
    runtime_health: Arc<context::RuntimeHealth>,
    /// The device plugins' resources; a change is reported at once.
    devices: crate::devices::Manager,
    /// The eviction manager's conditions; a change is reported at once.
    pressure: Arc<eviction::Pressure>,
    /// Labels of what the node found on itself (its GPUs).
    labels: std::collections::BTreeMap<String, String>,
    /// The Lease as last written.
    lease: std::sync::Mutex<Option<Lease>>,
    local: Option<Arc<local_store::LocalStore>>,
}

/// Now, in whole seconds (as the API's `Time` is serialized).
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

impl Heartbeat {
    async fn run(self, shutdown: CancellationToken, registered: Arc<tokio::sync::Notify>) {
        let mut tick = tokio::time::interval(STATUS_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reported: Option<(NodeStatus, Instant)> = None;
        let mut devices = self.devices.changes();
        let mut pressure = self.pressure.changes();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = devices.changed() => {}
                _ = pressure.changed() => {}
                _ = shutdown.cancelled() => return,
            }
            let mut healthy = true;
            match self.sync_status(reported.as_ref()).await {
                Ok(Some(status)) => reported = Some((status, Instant::now())),
                Ok(None) => {}
                Err(e) => {
                    healthy = false;
                    tracing::warn!("node agent: updating node {}: {e}", self.cfg.node_name);
                }
            }
            if let Err(e) = self.renew_lease().await {
                healthy = false;
                tracing::warn!("node agent: renewing the lease of node {}: {e}", self.cfg.node_name);
            }
            if healthy {
                self.health.beat();
            }
            registered.notify_one();
        }
    }

    /// Computes the status; creates the Node or writes its status when something changed or the
    /// report is due. Returns the status written, if any.
    async fn sync_status(&self, reported: Option<&(NodeStatus, Instant)>) -> anyhow::Result<Option<NodeStatus>> {
        let (runtime_version, mut not_ready) = match self.cri.readiness().await {
            Ok(r) => (r.runtime, r.problem.map(|p| format!("container runtime network not ready: {p}"))),
            Err(e) => (String::new(), Some(format!("container runtime is down: {e}"))),
        };
        self.runtime_health.set_network_problem(not_ready.clone());
        if let Some(pleg) = self.runtime_health.pleg_problem() {
            not_ready = Some(not_ready.map_or(pleg.clone(), |n| format!("{n}, {pleg}")));
        }
        let images = self.cri.list_images(Default::default()).await.map(|r| r.images).unwrap_or_default();
        let inputs = Inputs {
            name: &self.cfg.node_name,
            machine: &self.machine,
            reserved: &self.cfg.reserved,
            node_ip: self.cfg.node_ip,
            pod_cidr: self.cfg.pod_cidr,
            kubelet_port: self.cfg.kubelet_port,
            runtime_version: &runtime_version,
            not_ready,
            images: &images,
            volumes_in_use: crate::volumes::claims::in_use(&self.cfg.data_dir.join("agent").join("pods")),
            devices: self.devices.capacity(),
            labels: &self.labels,
            control_plane: self.cfg.control_plane,
            eviction: &self.cfg.eviction.thresholds,
            pressure: self.pressure.conditions(),
            now: now(),
        };
        // Written on the version read; another writer in between means reading again.
        for _ in 0..3 {
            let Some(mut current) = self.nodes.get_opt(&self.cfg.node_name).await? else {
                let node = node::new_node(&inputs);
                let created = self.nodes.create(&PostParams::default(), &node).await?;
                tracing::info!("node agent: registered node {}", self.cfg.node_name);
                self.keep(&created);
                return Ok(created.status);
            };
            let labels = node::missing_labels(&current, &self.labels);
            if !labels.is_empty() {
                let patch = serde_json::json!({ "metadata": { "labels": labels } });
                current = self.nodes.patch(&self.cfg.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            let status = node::status(&inputs, current.status.as_ref());
            let due = reported.is_none_or(|(_, at)| at.elapsed() >= REPORT_PERIOD);
            if !due && !current.status.as_ref().is_none_or(|old| node::changed(old, &status)) {
                return Ok(None);
            }
            current.status = Some(status);
            match self.nodes.replace_status(&self.cfg.node_name, &PostParams::default(), &current).await {
                Ok(written) => {
                    self.keep(&written);
                    return Ok(written.status);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!("the Node kept changing while its status was written")
    }

    /// Keeps the Node in the local store without what changes with every report.
    fn keep(&self, node: &Node) {
        let Some(local) = &self.local else { return };
        let mut node = node.clone();
        node.metadata.managed_fields = None;
        node.metadata.resource_version = None;
        if let Some(s) = node.status.as_mut() {
            (s.conditions, s.images, s.volumes_in_use, s.volumes_attached) = (None, None, None, None);
        }
        local.put(NODE_ENTRY, &node);
    }

    /// Renews (or creates) the node's Lease, owned by its Node.
    async fn renew_lease(&self) -> anyhow::Result<()> {
        let name = &self.cfg.node_name;
        let spec = LeaseSpec {
            holder_identity: Some(name.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        };
        // The Lease last written is renewed as it is (kubelet's lease controller): one PUT per
        // renewal, read again only when someone else changed it.
        let cached = self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(mut lease) = cached {
            lease.spec = Some(spec.clone());
            match self.leases.replace(name, &PostParams::default(), &lease).await {
                Ok(written) => {
                    *self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(written);
                    return Ok(());
                }
                Err(e) if is_conflict(&e) || matches!(&e, kube::Error::Api(s) if s.code == 404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for _ in 0..3 {
            let Some(mut lease) = self.leases.get_opt(name).await? else { break };
            lease.spec = Some(spec.clone());
            match self.leases.replace(name, &PostParams::default(), &lease).await {
                Ok(written) => {
                    *self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(written);
                    return Ok(());
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let node = self.nodes.get_opt(name).await?;
        let uid =
            node.and_then(|n| n.metadata.uid).ok_or_else(|| anyhow::anyhow!("node {name} is not registered yet"))?;
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(LEASE_NAMESPACE.into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.clone(),
                    uid,
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(spec),
        };
        let written = self.leases.create(&PostParams::default(), &lease).await?;
        *self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(written);
        Ok(())
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_goes_stale_without_heartbeats() {
        let health = Health::default();
        health.beat();
        assert_eq!(health.stale_for(), None);
        health.0.store(unix_now() - 120, Ordering::Relaxed);
        assert!(health.stale_for().is_some_and(|age| age >= 120));
    }
}
