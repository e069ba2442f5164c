//! kubelet's plugin registration, both ends. A plugin (the built-in driver, `cairn csi-hostpath`, or
//! an external driver's node-driver-registrar) serves `Registration` on a socket in
//! `plugins_registry/` ([`serve_registrar`]); the node's [`Watcher`] notices the socket (inotify, as
//! kubelet's plugin watcher), asks it what it is, connects to the driver, records it in [`Drivers`]
//! and in the node's CSINode, and tells the plugin it is registered. A socket that goes deregisters
//! its driver.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio_util::sync::CancellationToken;

use super::client::{Drivers, Entry, GrpcDriver};
use super::registration_proto::{self as rp, registration_client::RegistrationClient};

/// The plugin type of CSI drivers in `PluginInfo.type`.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The Node annotation kubelet keeps each driver's node ID in (a JSON map).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The plugin side: answers the node's GetInfo with `info` on `socket` until `shutdown`.
pub async fn serve_registrar(info: rp::PluginInfo, socket: PathBuf, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = super::bind_socket(&socket)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let server = rp::registration_server::RegistrationServer::new(Registrar { info });
    let result = tonic::transport::Server::builder()
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
        .await;
    let _ = std::fs::remove_file(&socket);
    Ok(result?)
}

struct Registrar {
    info: rp::PluginInfo,
}

#[tonic::async_trait]
impl rp::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: tonic::Request<rp::InfoRequest>,
    ) -> Result<tonic::Response<rp::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: tonic::Request<rp::RegistrationStatus>,
    ) -> Result<tonic::Response<rp::RegistrationStatusResponse>, tonic::Status> {
        let status = req.into_inner();
        if status.plugin_registered {
            tracing::info!("CSI driver {} registered with the node", self.info.name);
        } else {
            tracing::error!("the node refused to register CSI driver {}: {}", self.info.name, status.error);
        }
        Ok(tonic::Response::new(rp::RegistrationStatusResponse {}))
    }
}

/// One message per batch of entries made or removed in `dir` (inotify, read on a thread of its own,
/// which ends with the next event after the receiver is gone).
fn watch_dir(dir: &Path) -> std::io::Result<tokio::sync::mpsc::Receiver<()>> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
    let flags =
        AddWatchFlags::IN_CREATE | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_MOVED_FROM;
    inotify.add_watch(dir, flags)?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::Builder::new().name("plugin-watcher".into()).spawn(move || {
        while inotify.read_events().is_ok() {
            match tx.try_send(()) {
                // A scan is already due: it will see this change too.
                Ok(()) | Err(tokio::sync::mpsc::error::TrySendError::Full(())) => {}
                Err(tokio::sync::mpsc::error::TrySendError::Closed(())) => return,
            }
        }
    })?;
    Ok(rx)
}

/// A CSI PluginInfo for `driver` at `endpoint`.
pub fn csi_info(driver: &str, endpoint: &Path) -> rp::PluginInfo {
    rp::PluginInfo {
        r#type: CSI_PLUGIN.into(),
        name: driver.into(),
        endpoint: endpoint.display().to_string(),
        supported_versions: vec!["1.0.0".into()],
    }
}

/// The node side: watches `plugins_registry/` and keeps [`Drivers`] and the CSINode current.
pub struct Watcher {
    pub dir: PathBuf,
    pub drivers: Drivers,
    pub client: kube::Client,
    pub node_name: String,
}

/// A registered socket: which driver it brought.
struct Known {
    driver: String,
}

impl Watcher {
    /// Runs until `shutdown`: an initial scan, then one per change in the directory.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut changes = watch_dir(&self.dir)?;
        self.init_csi_node().await;
        let mut known: HashMap<PathBuf, Known> = HashMap::new();
        // Sockets that failed to register are retried on the next change or after a while.
        let retry = std::time::Duration::from_secs(5);
        let mut first = true;
        loop {
            let failed = self.scan(&mut known).await;
            if std::mem::take(&mut first) {
                // Drivers whose sockets went while the node was down leave the CSINode.
                let live: Vec<String> = known.values().map(|k| k.driver.clone()).collect();
                if let Err(e) = self.update_csi_node(|drivers| drivers.retain(|d| live.contains(&d.name))).await {
                    tracing::warn!("pruning CSINode {}: {e}", self.node_name);
                }
            }
            let wait = async { if failed { tokio::time::sleep(retry).await } else { std::future::pending().await } };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                changed = changes.recv() => if changed.is_none() {
                    anyhow::bail!("the watch of {} ended", self.dir.display());
                },
                _ = wait => {}
            }
        }
    }

    /// Registers new sockets and deregisters gone ones; whether any failed.
    async fn scan(&self, known: &mut HashMap<PathBuf, Known>) -> bool {
        let present: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.file_type().is_ok_and(|t| {
                            use std::os::unix::fs::FileTypeExt as _;
                            t.is_socket()
                        })
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        let gone: Vec<PathBuf> = known.keys().filter(|p| !present.contains(p)).cloned().collect();
        for path in gone {
            if let Some(k) = known.remove(&path) {
                self.deregister(&k.driver).await;
            }
        }
        let mut failed = false;
        let new: Vec<PathBuf> = present.into_iter().filter(|p| !known.contains_key(p)).collect();
        for path in new {
            match self.register(&path).await {
                Ok(driver) => {
                    known.insert(path, Known { driver });
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!("registering the plugin at {}: {e:#}", path.display());
                }
            }
        }
        failed
    }

    /// kubelet's `RegisterPlugin` for a CSI driver.
    async fn register(&self, socket: &Path) -> anyhow::Result<String> {
        let channel = crate::runtime::cri::connect(socket).await?;
        let mut reg = RegistrationClient::new(channel);
        let info = reg.get_info(rp::InfoRequest {}).await?.into_inner();
        let refuse = |reg: &mut RegistrationClient<_>, error: String| {
            let mut reg = reg.clone();
            async move {
                let _ = reg
                    .notify_registration_status(rp::RegistrationStatus {
                        plugin_registered: false,
                        error: error.clone(),
                    })
                    .await;
                anyhow::anyhow!(error)
            }
        };
        if info.r#type != CSI_PLUGIN {
            return Err(refuse(&mut reg, format!("plugin type {:?} is not supported by this node", info.r#type)).await);
        }
        if !info.supported_versions.iter().any(|v| v.trim_start_matches('v').starts_with("1.")) {
            return Err(refuse(
                &mut reg,
                format!(
                    "none of the versions {:?} of CSI driver {} is supported (1.x is)",
                    info.supported_versions, info.name
                ),
            )
            .await);
        }
        let endpoint =
            if info.endpoint.is_empty() { socket.to_path_buf() } else { super::endpoint_path(&info.endpoint)? };
        let registered = match GrpcDriver::connect(&endpoint).await {
            Ok(r) => r,
            Err(e) => {
                return Err(refuse(
                    &mut reg,
                    format!("connecting to CSI driver {} at {}: {e}", info.name, endpoint.display()),
                )
                .await);
            }
        };
        if registered.name != info.name {
            return Err(refuse(
                &mut reg,
                format!("the driver at {} calls itself {}, not {}", endpoint.display(), registered.name, info.name),
            )
            .await);
        }
        if let Err(e) = self.record(&info.name, &registered.node_id, registered.max_volumes, &registered.topology).await
        {
            return Err(refuse(
                &mut reg,
                format!("recording CSI driver {} in CSINode {}: {e}", info.name, self.node_name),
            )
            .await);
        }
        self.drivers.insert(
            info.name.clone(),
            Entry {
                driver: Arc::new(registered.driver),
                node_id: registered.node_id.clone(),
                topology: registered.topology,
            },
        );
        reg.notify_registration_status(rp::RegistrationStatus { plugin_registered: true, error: String::new() })
            .await?;
        tracing::info!("registered CSI driver {} at {}", info.name, endpoint.display());
        Ok(info.name)
    }

    async fn deregister(&self, driver: &str) {
        self.drivers.remove(driver);
        tracing::info!("CSI driver {driver} deregistered: its registration socket is gone");
        if let Err(e) = self.update_csi_node(|drivers| drivers.retain(|d| d.name != driver)).await {
            tracing::warn!("removing CSI driver {driver} from CSINode {}: {e}", self.node_name);
        }
    }

    /// Creates the node's CSINode if missing (kubelet does at start, owned by the Node).
    async fn init_csi_node(&self) {
        if let Err(e) = self.update_csi_node(|_| {}).await {
            tracing::warn!("creating CSINode {}: {e}", self.node_name);
        }
    }

    /// The driver's entry in the CSINode, its node ID annotation and its topology labels on the Node.
    async fn record(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get(&self.node_name).await?;
        let mut ids: BTreeMap<String, String> = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        ids.insert(driver.into(), node_id.into());
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> = topology.iter().filter(|(k, v)| labels.get(*k) != Some(v)).collect();
        let patch = serde_json::json!({
            "metadata": {
                "annotations": {NODE_ID_ANNOTATION: serde_json::to_string(&ids).unwrap_or_default()},
                "labels": missing,
            }
        });
        nodes.patch(&self.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let entry = CSINodeDriver {
            name: driver.into(),
            node_id: node_id.into(),
            topology_keys: (!topology.is_empty()).then(|| topology.keys().cloned().collect()),
            allocatable: (max_volumes > 0)
                .then_some(VolumeNodeResources { count: Some(max_volumes.min(i64::from(i32::MAX)) as i32) }),
        };
        self.update_csi_node(move |drivers| {
            drivers.retain(|d| d.name != entry.name);
            drivers.push(entry.clone());
        })
        .await
    }

    /// Read-modify-write of the node's CSINode, created when missing.
    async fn update_csi_node(&self, change: impl Fn(&mut Vec<CSINodeDriver>)) -> Result<(), kube::Error> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        for _ in 0..5 {
            let result = match api.get_opt(&self.node_name).await? {
                Some(mut current) => {
                    let before = current.spec.drivers.clone();
                    change(&mut current.spec.drivers);
                    if current.spec.drivers == before {
                        return Ok(());
                    }
                    api.replace(&self.node_name, &PostParams::default(), &current).await.map(drop)
                }
                None => {
                    let node: Api<Node> = Api::all(self.client.clone());
                    let uid = node.get(&self.node_name).await?.metadata.uid.unwrap_or_default();
                    let mut drivers = Vec::new();
                    change(&mut drivers);
                    let csi_node = CSINode {
                        metadata: ObjectMeta {
                            name: Some(self.node_name.clone()),
                            owner_references: Some(vec![OwnerReference {
                                api_version: "v1".into(),
                                kind: "Node".into(),
                                name: self.node_name.clone(),
                                uid,
                                ..Default::default()
                            }]),
                            ..Default::default()
                        },
                        spec: CSINodeSpec { drivers },
                        status: None,
                    };
                    api.create(&PostParams::default(), &csi_node).await.map(drop)
                }
            };
            match result {
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                other => return other,
            }
        }
        Ok(())
    }
}
