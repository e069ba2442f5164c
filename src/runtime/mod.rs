//! The container runtime side of the node: an embedded containerd (or an external CRI runtime), the
//! CRI client, the built-in sandbox image, air-gapped image import, and the pod network's CNI files.

pub mod bench;
pub mod check_config;
pub mod containerd;
pub mod cri;
pub mod ctr;
pub mod images;
pub mod oci_image;
pub mod tasks;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::net;
pub use cri::Cri;

/// The sandbox image every pod's pause container runs, built from `embedded/pause.c`. A
/// `localhost/` name cannot collide with anything pulled from a registry.
pub const PAUSE_IMAGE: &str = concat!("localhost/cairn/pause:", env!("CARGO_PKG_VERSION"));
static PAUSE_BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pause"));
/// How often the images directory is looked at for new files.
const IMAGE_DIR_POLL: Duration = Duration::from_secs(5);

/// The built-in sandbox image as an OCI layout tarball (the same bytes every time).
pub fn pause_image_tar() -> Vec<u8> {
    oci_image::ImageBuilder::new(PAUSE_IMAGE)
        .file("/pause", PAUSE_BINARY, 0o755)
        .entrypoint(&["/pause"])
        .user("65535:65535")
        .oci_layout_tar()
}

/// Settings of the node's runtime.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// `--containerd-bin`.
    pub containerd_bin: Option<PathBuf>,
    /// `--container-runtime-endpoint`: use this runtime instead of starting containerd.
    pub endpoint: Option<String>,
    /// `--cni-bin-dir` / `--cni-conf-dir`: someone else's CNI plugins and configuration instead of cairn's.
    pub cni_bin_dir: Option<PathBuf>,
    pub cni_conf_dir: Option<PathBuf>,
    /// The cluster's pod network (`--cluster-cidr`).
    pub cluster_cidr: net::Cidr,
    /// This node's pod range (its Node's `spec.podCIDR`); `None` on the server's own node, which
    /// takes the cluster CIDR's first /24.
    pub pod_cidr: Option<net::Cidr>,
    /// Runtime handlers beside runc (NVIDIA's container runtimes): name → binary.
    pub runtimes: Vec<(String, PathBuf)>,
}

impl Config {
    fn agent_dir(&self) -> PathBuf {
        self.data_dir.join("agent")
    }
    pub fn containerd_layout(&self) -> containerd::Layout {
        containerd::Layout::new(&self.data_dir)
    }
    pub fn images_dir(&self) -> PathBuf {
        self.agent_dir().join("images")
    }
    fn cni_bin_dir(&self) -> PathBuf {
        self.cni_bin_dir.clone().unwrap_or_else(|| self.agent_dir().join("cni").join("bin"))
    }
    fn cni_conf_dir(&self) -> PathBuf {
        self.cni_conf_dir.clone().unwrap_or_else(|| self.agent_dir().join("cni").join("net.d"))
    }
    /// cairn's own pod network on this node.
    pub fn network(&self) -> net::NetworkConfig {
        net::NetworkConfig {
            name: "cairn".into(),
            bridge: "cni0".into(),
            subnet: self.pod_cidr.unwrap_or_else(|| self.cluster_cidr.first_subnet(24)),
            cluster_cidr: self.cluster_cidr,
            mtu: 1500,
            hairpin: true,
            ip_masq: true,
            state_dir: self.agent_dir().join("cni"),
        }
    }
    /// Fails fast when the runtime cannot be started at all (no containerd, no runc).
    pub fn check(&self) -> Result<()> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            anyhow::bail!(
                "the node agent needs root (it runs containerd and sets up cgroups, volumes and the pod network): \
                 run cairn as root, or pass --disable-agent to run only the API server and scheduler"
            );
        }
        crate::cgroups::check_memory_controller().map_err(anyhow::Error::msg)?;
        if self.cni_bin_dir.is_none() {
            net::check_host()?;
        }
        match &self.endpoint {
            Some(endpoint) => cri::socket_path(endpoint).map(drop),
            None => containerd::find_binaries(self.containerd_bin.as_deref()).map(drop),
        }
    }
}

/// A running runtime.
pub struct Runtime {
    pub cri: Cri,
    /// Resolves once the runtime side has stopped after shutdown.
    pub done: tokio::task::JoinHandle<()>,
}

/// Prepares the pod network files, starts containerd (unless an external runtime is named), imports
/// the sandbox image and the air-gapped images, and keeps watching the images directory.
pub async fn start(cfg: &Config, shutdown: CancellationToken) -> Result<Runtime> {
    images::ImageDir::prepare(&cfg.images_dir())
        .with_context(|| format!("creating the images folder {}", cfg.images_dir().display()))?;
    if cfg.cni_bin_dir.is_none() && cfg.cni_conf_dir.is_none() {
        let exe = std::env::current_exe().context("finding cairn's own executable for the CNI plugin")?;
        net::install(&cfg.network(), &exe, &cfg.cni_bin_dir(), &cfg.cni_conf_dir())
            .context("installing cairn's CNI plugin")?;
    }
    let (socket, supervisor) = match &cfg.endpoint {
        Some(endpoint) => (cri::socket_path(endpoint)?, None),
        None => {
            let layout = cfg.containerd_layout();
            let settings = containerd::Settings {
                layout: layout.clone(),
                bin: cfg.containerd_bin.clone(),
                sandbox_image: PAUSE_IMAGE.into(),
                cni_bin_dir: cfg.cni_bin_dir(),
                cni_conf_dir: cfg.cni_conf_dir(),
                runtimes: cfg.runtimes.clone(),
            };
            let supervisor = containerd::start(&settings, shutdown.clone()).await?;
            (layout.socket(), Some(supervisor))
        }
    };
    let cri = Cri::new(&socket);
    let importer = match prepare(cfg, &cri, &socket).await {
        Ok(importer) => importer,
        Err(e) => {
            // containerd must not outlive a runtime that failed to come up.
            if let Some(s) = supervisor {
                shutdown.cancel();
                let _ = s.done.await;
            }
            return Err(e);
        }
    };

    let watcher = importer.map(|importer| {
        let dir = images::ImageDir::new(cfg.images_dir(), imported_state_file(&cfg.data_dir));
        let puller = cri.clone();
        let pull = move |reference: String| {
            let cri = puller.clone();
            Box::pin(async move { cri.ensure_image(&reference).await.map(drop).map_err(anyhow::Error::from) })
                as futures::future::BoxFuture<'static, Result<()>>
        };
        let stop = shutdown.clone();
        tokio::spawn(async move { dir.watch(importer, pull, IMAGE_DIR_POLL, stop.cancelled_owned()).await })
    });
    let done = tokio::spawn(async move {
        if let Some(w) = watcher {
            let _ = w.await;
        }
        if let Some(s) = supervisor {
            let _ = s.done.await;
        }
    });
    Ok(Runtime { cri, done })
}

/// Checks the runtime's readiness and imports the sandbox image; returns the importer for the
/// images directory when the runtime is containerd.
async fn prepare(cfg: &Config, cri: &Cri, socket: &Path) -> Result<Option<images::Importer>> {
    let readiness =
        cri.readiness().await.with_context(|| format!("asking the runtime at {} for its status", cri.endpoint()))?;
    tracing::info!("container runtime {} (CRI {}) at {}", readiness.runtime, readiness.api_version, cri.endpoint());
    if let Some(problem) = &readiness.problem {
        tracing::warn!("the container runtime is not ready yet: {problem}");
    }

    // Images are imported through containerd's own API; another CRI runtime brings its own.
    let importer = if readiness.runtime.starts_with("containerd") {
        let importer = images::Importer::new(images::connect(socket).await?);
        let imported =
            importer.import_bytes(&pause_image_tar()).await.context("importing the built-in sandbox image")?;
        for image in imported.iter().filter(|i| i.change != images::ImageChange::Unchanged) {
            tracing::info!("imported the built-in sandbox image {} ({})", image.reference, image.digest);
        }
        Some(importer)
    } else {
        tracing::warn!(
            "{} is not containerd: air-gapped images in {} are not imported",
            readiness.runtime,
            cfg.images_dir().display()
        );
        None
    };
    Ok(importer)
}

/// What the images directory's watcher has imported (see [`images::imported_references`]).
pub fn imported_state_file(data_dir: &Path) -> PathBuf {
    data_dir.join("agent").join("images.imported.json")
}

/// The containerd socket for helper commands: the embedded one under `data_dir` unless an endpoint is given.
pub fn helper_socket(data_dir: &Path, endpoint: Option<&str>) -> Result<PathBuf> {
    match endpoint {
        Some(e) => cri::socket_path(e),
        None => Ok(containerd::Layout::new(data_dir).socket()),
    }
}
