//! Built-in NVIDIA GPUs, found with no configuration: discrete GPUs (`/dev/nvidia<N>` with the
//! control nodes, UUID and model from `/proc/driver/nvidia/gpus/*/information`, memory from
//! `nvidia-smi` when the driver ships it) and Jetson/Tegra boards (`nvhost-*`, `nvmap`, `nvgpu`; the
//! board from the device tree). An in-process plugin offers them as `nvidia.com/gpu` over the
//! device-plugin API, the NVIDIA device plugin's way: the GPU's UUID as the device ID,
//! `NVIDIA_VISIBLE_DEVICES`, and the device nodes themselves (its `--pass-device-specs`), so that a
//! container gets exactly its GPUs with or without the NVIDIA container runtime. The driver's
//! user-space libraries and tools go in at `/usr/local/nvidia/{lib64,bin}`, where CUDA images look
//! (their `LD_LIBRARY_PATH` and `PATH` name them); a runtime with CDI and an NVIDIA CDI spec gets the
//! CDI device names instead. A GPU whose device node goes turns unhealthy.
//!
//! `nvidia-container-runtime` on the host becomes containerd's `nvidia` runtime handler (and
//! `nvidia-container-runtime.cdi` the `nvidia-cdi` one), with a RuntimeClass of that name, as k3s does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::plugin;
use super::proto;

/// The resource GPUs are offered as (the NVIDIA device plugin's).
pub const RESOURCE: &str = "nvidia.com/gpu";
/// Where a container finds the driver's libraries and tools (CUDA images' `LD_LIBRARY_PATH`/`PATH`).
const CONTAINER_LIB_DIR: &str = "/usr/local/nvidia/lib64";
const CONTAINER_BIN_DIR: &str = "/usr/local/nvidia/bin";
/// The control nodes of a discrete GPU driver, given with every GPU.
const CONTROL_NODES: &[&str] = &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];
/// Where the driver's user-space libraries are (under the root), and their names.
const LIB_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "usr/lib/aarch64-linux-gnu/tegra",
];
const LIB_PATTERNS: &[&str] = &["libcuda.so*", "libnvidia-*.so*", "libnvcuvid.so*", "libcudadebugger.so*"];
const TOOLS: &[&str] = &["nvidia-smi", "nvidia-debugdump"];
/// Where NVIDIA's container toolkit installs its runtimes, besides PATH (k3s looks there too).
const RUNTIME_DIRS: &[&str] = &["usr/local/nvidia/toolkit", "usr/local/bin", "usr/bin"];
/// containerd runtime handlers and the toolkit binary each runs.
const RUNTIMES: &[(&str, &str)] =
    &[("nvidia", "nvidia-container-runtime"), ("nvidia-cdi", "nvidia-container-runtime.cdi")];
/// Where CDI specs are (the CDI spec's default directories).
const CDI_DIRS: &[&str] = &["etc/cdi", "var/run/cdi"];
/// How long `nvidia-smi` may take to say how much memory the GPUs have.
const SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// One GPU: its device ID, what is known of it, and its device nodes (host paths).
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub id: String,
    pub uuid: Option<String>,
    pub model: Option<String>,
    nodes: Vec<PathBuf>,
}

/// The GPUs of this machine and what a container needs to use them.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpus {
    /// `/`, or the directory discovery was pointed at (its paths are the container's without it).
    root: PathBuf,
    pub tegra: bool,
    pub gpus: Vec<Gpu>,
    /// Control device nodes every GPU container gets.
    control: Vec<PathBuf>,
    /// The driver's user-space libraries (regular files, links followed) and tools.
    libraries: Vec<PathBuf>,
    tools: Vec<PathBuf>,
    pub memory_mib: Option<u64>,
    /// containerd runtime handlers of NVIDIA's container toolkit: name → binary.
    pub runtimes: Vec<(String, PathBuf)>,
    /// An NVIDIA CDI spec exists.
    cdi_spec: bool,
}

fn is_char_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

/// The names in `dir` matching `pattern` (a file-name wildcard), sorted.
fn matching(dir: &Path, pattern: &str) -> Vec<PathBuf> {
    let pattern: Vec<char> = pattern.chars().collect();
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| super::generic::matches(&pattern, &e.file_name().to_string_lossy().chars().collect::<Vec<_>>()))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// `information` of one GPU: its minor number, UUID and model.
fn parse_information(text: &str) -> (Option<u32>, Option<String>, Option<String>) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name).map(|(_, v)| v.trim().to_string()))
            .filter(|v| !v.is_empty())
    };
    (field("Device Minor").and_then(|m| m.parse().ok()), field("GPU UUID"), field("Model"))
}

/// A label value from free text (upstream's GPU feature discovery turns spaces into `-`).
fn label_value(text: &str) -> String {
    let value: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).take(63).collect();
    value.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

impl Gpus {
    /// The NVIDIA GPUs under `root` (`/` on a real machine), if any.
    pub fn discover(root: &Path) -> Option<Gpus> {
        let dev = root.join("dev");
        let mut found = Gpus {
            root: root.to_path_buf(),
            tegra: false,
            gpus: Vec::new(),
            control: Vec::new(),
            libraries: Vec::new(),
            tools: Vec::new(),
            memory_mib: None,
            runtimes: Vec::new(),
            cdi_spec: false,
        };
        let discrete: Vec<(u32, PathBuf)> = matching(&dev, "nvidia*")
            .into_iter()
            .filter_map(|p| {
                let minor = p.file_name()?.to_str()?.strip_prefix("nvidia")?.parse().ok()?;
                is_char_device(&p).then_some((minor, p))
            })
            .collect();
        if !discrete.is_empty() {
            let infos: Vec<_> = matching(&root.join("proc/driver/nvidia/gpus"), "*")
                .into_iter()
                .filter_map(|d| std::fs::read_to_string(d.join("information")).ok())
                .map(|t| parse_information(&t))
                .collect();
            let mut discrete = discrete;
            discrete.sort();
            for (minor, node) in discrete {
                let info = infos.iter().find(|(m, _, _)| *m == Some(minor));
                let uuid = info.and_then(|(_, u, _)| u.clone());
                found.gpus.push(Gpu {
                    id: uuid.clone().unwrap_or_else(|| format!("nvidia{minor}")),
                    uuid,
                    model: info.and_then(|(_, _, m)| m.clone()),
                    nodes: vec![node],
                });
            }
            found.control = CONTROL_NODES.iter().map(|n| dev.join(n)).filter(|p| is_char_device(p)).collect();
            found.memory_mib = found.smi_memory();
        } else if is_char_device(&dev.join("nvmap")) {
            // Jetson/Tegra: one integrated GPU behind the nvhost/nvgpu nodes.
            let mut nodes: Vec<PathBuf> = matching(&dev, "nvhost-*");
            nodes.extend(matching(&dev.join("nvgpu/igpu0"), "*"));
            nodes.retain(|p| is_char_device(p));
            if nodes.is_empty() {
                return None;
            }
            nodes.push(dev.join("nvmap"));
            let board = std::fs::read_to_string(root.join("proc/device-tree/model"))
                .ok()
                .map(|m| m.trim_matches(|c: char| c == '\0' || c.is_whitespace()).to_string())
                .filter(|m| !m.is_empty());
            found.tegra = true;
            found.gpus.push(Gpu { id: "igpu0".into(), uuid: None, model: board, nodes });
        } else {
            return None;
        }
        for dir in LIB_DIRS {
            for pattern in LIB_PATTERNS {
                for lib in matching(&root.join(dir), pattern).into_iter().filter(|p| p.is_file()) {
                    // One of each name: /usr/lib64 is /usr/lib on some machines.
                    if !found.libraries.iter().any(|l| l.file_name() == lib.file_name()) {
                        found.libraries.push(lib);
                    }
                }
            }
        }
        found.tools = TOOLS.iter().map(|t| root.join("usr/bin").join(t)).filter(|p| p.is_file()).collect();
        found.runtimes = RUNTIMES
            .iter()
            .filter_map(|(handler, binary)| {
                let in_root = RUNTIME_DIRS.iter().map(|d| root.join(d).join(binary)).find(|p| p.is_file());
                let in_path = || (root == Path::new("/")).then(|| crate::runtime::containerd::which(binary)).flatten();
                Some((handler.to_string(), in_root.or_else(in_path)?))
            })
            .collect();
        found.cdi_spec = CDI_DIRS
            .iter()
            .flat_map(|d| matching(&root.join(d), "*"))
            .any(|spec| std::fs::read_to_string(spec).is_ok_and(|t| t.contains(RESOURCE)));
        Some(found)
    }

    /// The total memory of the first GPU in MiB, as `nvidia-smi` says (bounded in time).
    fn smi_memory(&self) -> Option<u64> {
        let smi = self.root.join("usr/bin/nvidia-smi");
        if !smi.is_file() {
            return None;
        }
        let mut child = std::process::Command::new(&smi)
            .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let started = std::time::Instant::now();
        while child.try_wait().ok()?.is_none() {
            if started.elapsed() > SMI_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("{} did not answer in {SMI_TIMEOUT:?}; the GPU memory is not labelled", smi.display());
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
        out.lines().next()?.trim().parse().ok()
    }

    /// The Node labels of upstream's GPU feature discovery that cairn knows.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            ("nvidia.com/gpu.count".to_string(), self.gpus.len().to_string()),
        ]);
        if let Some(model) = self.gpus.iter().find_map(|g| g.model.as_deref()).map(label_value) {
            labels.insert("nvidia.com/gpu.product".into(), model);
        }
        if let Some(mib) = self.memory_mib {
            labels.insert("nvidia.com/gpu.memory".into(), mib.to_string());
        }
        labels
    }

    /// A host path as the container sees it (without the discovery root).
    fn in_container(&self, host: &Path) -> String {
        Path::new("/").join(host.strip_prefix(&self.root).unwrap_or(host)).display().to_string()
    }

    /// Whether each GPU's device nodes are all there.
    fn health(&self) -> Vec<(String, bool)> {
        self.gpus.iter().map(|g| (g.id.clone(), g.nodes.iter().all(|n| is_char_device(n)))).collect()
    }

    /// What a container with the GPUs `ids` gets; `cdi`: the runtime passes CDI devices on.
    fn allocate(&self, ids: &[String], cdi: bool) -> Result<proto::ContainerAllocateResponse, Status> {
        let gpus = ids
            .iter()
            .map(|id| self.gpus.iter().find(|g| g.id == *id).ok_or_else(|| Status::not_found(format!("no GPU {id}"))))
            .collect::<Result<Vec<&Gpu>, Status>>()?;
        let visible = if self.tegra { "all".to_string() } else { ids.join(",") };
        let nodes = gpus.iter().flat_map(|g| &g.nodes).chain(&self.control);
        let mut answer = proto::ContainerAllocateResponse {
            envs: [("NVIDIA_VISIBLE_DEVICES".to_string(), visible)].into(),
            devices: nodes
                .map(|n| proto::DeviceSpec {
                    container_path: self.in_container(n),
                    host_path: n.display().to_string(),
                    permissions: "rw".into(),
                })
                .collect(),
            ..Default::default()
        };
        if cdi && self.cdi_spec {
            let name = |g: &Gpu| format!("{RESOURCE}={}", if self.tegra { "all" } else { g.id.as_str() });
            answer.cdi_devices = gpus.iter().map(|g| proto::CdiDevice { name: name(g) }).collect();
            return Ok(answer);
        }
        let mount = |host: &PathBuf, dir: &str| proto::Mount {
            container_path: format!("{dir}/{}", host.file_name().unwrap_or_default().to_string_lossy()),
            host_path: host.display().to_string(),
            read_only: true,
        };
        answer.mounts = self.libraries.iter().map(|l| mount(l, CONTAINER_LIB_DIR)).collect();
        answer.mounts.extend(self.tools.iter().map(|t| mount(t, CONTAINER_BIN_DIR)));
        Ok(answer)
    }
}

/// Whether the CRI runtime `name` at `version` passes CDI device names on (CRI-O always; containerd
/// from 2.0, where CDI is on by default).
pub fn runtime_supports_cdi(name: &str, version: &str) -> bool {
    let major = version.trim_start_matches('v').split('.').next().and_then(|m| m.parse::<u32>().ok());
    match name {
        "cri-o" => true,
        "containerd" => major.is_some_and(|m| m >= 2),
        _ => false,
    }
}

/// Serves the GPUs as `nvidia.com/gpu` in the device-plugins directory `dir` and registers them,
/// then looks at their device nodes every few seconds until `shutdown`.
pub async fn run(gpus: Gpus, cdi: bool, dir: PathBuf, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (tx, devices) = watch::channel(gpus.health());
    let count = gpus.gpus.len();
    let gpus = std::sync::Arc::new(gpus);
    plugin::serve_and_register(devices, Allocator { gpus: gpus.clone(), cdi }, RESOURCE, &dir, &shutdown).await?;
    tracing::info!("offering {count} NVIDIA GPU(s) as {RESOURCE}");
    let mut tick = tokio::time::interval(super::generic::SCAN_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let now = gpus.health();
        tx.send_if_modified(|old| {
            let changed = *old != now;
            if changed {
                for ((id, healthy), (_, was)) in now.iter().zip(old.iter()) {
                    if healthy != was {
                        let state = if *healthy { "is back" } else { "is gone: unhealthy" };
                        tracing::warn!("NVIDIA GPU {id} {state}");
                    }
                }
                *old = now;
            }
            changed
        });
    }
}

/// The GPUs' Allocate answers; `cdi`: the runtime passes CDI devices on.
struct Allocator {
    gpus: std::sync::Arc<Gpus>,
    cdi: bool,
}

impl plugin::Allocator for Allocator {
    fn allocate(&self, ids: &[String]) -> Result<proto::ContainerAllocateResponse, Status> {
        self.gpus.allocate(ids, self.cdi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake device node: a link to /dev/null, a character device in any root.
    fn node(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/dev/null", path).unwrap();
    }

    fn file(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const INFORMATION: &str = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1111\nBus Location: \t 0000:01:00.0\nDevice Minor: \t 1\n";

    #[test]
    fn nothing_is_found_on_a_machine_without_nvidia_devices() {
        let root = tempfile::tempdir().unwrap();
        file(&root.path().join("dev/nvidia0"), "not a device");
        node(&root.path().join("dev/null"));
        assert_eq!(Gpus::discover(root.path()), None);
    }

    #[test]
    fn discrete_gpus_are_found_with_their_uuids_models_and_control_nodes() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for n in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset"] {
            node(&r.join("dev").join(n));
        }
        file(&r.join("proc/driver/nvidia/gpus/0000:01:00.0/information"), INFORMATION);
        file(&r.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"), "");
        file(&r.join("usr/lib/x86_64-linux-gnu/libc.so.6"), "");
        file(&r.join("usr/bin/nvidia-smi"), "#!/bin/sh\necho 143771\n");
        std::fs::set_permissions(r.join("usr/bin/nvidia-smi"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        file(&r.join("usr/bin/nvidia-container-runtime"), "");
        let gpus = Gpus::discover(r).expect("two GPUs");
        let ids: Vec<&str> = gpus.gpus.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(ids, ["nvidia0", "GPU-1111"], "the UUID where the driver says it");
        assert_eq!(gpus.runtimes, [("nvidia".to_string(), r.join("usr/bin/nvidia-container-runtime"))]);
        let labels = gpus.labels();
        assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-H200");
        assert_eq!(labels["nvidia.com/gpu.count"], "2");
        assert_eq!(labels["nvidia.com/gpu.memory"], "143771");
        assert_eq!(labels["nvidia.com/gpu.present"], "true");

        let got = gpus.allocate(&["GPU-1111".into()], false).unwrap();
        assert_eq!(got.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-1111");
        let devices: Vec<&str> = got.devices.iter().map(|d| d.container_path.as_str()).collect();
        assert_eq!(devices, ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset"]);
        assert_eq!(got.devices[0].host_path, r.join("dev/nvidia1").display().to_string());
        let mounts: Vec<&str> = got.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(mounts, ["/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/bin/nvidia-smi"]);
        assert!(got.mounts.iter().all(|m| m.read_only) && got.cdi_devices.is_empty());
        assert_eq!(gpus.allocate(&["GPU-9".into()], false).unwrap_err().code(), tonic::Code::NotFound);

        // CDI where the runtime passes it on and a spec names the GPUs: no mounts then.
        assert_eq!(gpus.allocate(&["nvidia0".into()], true).unwrap().cdi_devices, []);
        file(&r.join("etc/cdi/nvidia.yaml"), "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n");
        let gpus = Gpus::discover(r).unwrap();
        let got = gpus.allocate(&["nvidia0".into()], true).unwrap();
        assert_eq!(got.cdi_devices, [proto::CdiDevice { name: "nvidia.com/gpu=nvidia0".into() }]);
        assert!(got.mounts.is_empty() && got.devices.len() == 4);

        // A GPU whose node goes is unhealthy.
        std::fs::remove_file(r.join("dev/nvidia0")).unwrap();
        assert_eq!(gpus.health(), [("nvidia0".to_string(), false), ("GPU-1111".to_string(), true)]);
    }

    #[test]
    fn a_jetson_board_is_one_gpu_with_all_its_nodes() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for n in ["nvmap", "nvhost-ctrl-gpu", "nvhost-gpu", "nvgpu/igpu0/ctrl"] {
            node(&r.join("dev").join(n));
        }
        file(&r.join("proc/device-tree/model"), "NVIDIA Jetson AGX Orin Developer Kit\0");
        let gpus = Gpus::discover(r).expect("a Jetson");
        assert!(gpus.tegra);
        assert_eq!(gpus.labels()["nvidia.com/gpu.product"], "NVIDIA-Jetson-AGX-Orin-Developer-Kit");
        let got = gpus.allocate(&["igpu0".into()], false).unwrap();
        assert_eq!(got.envs["NVIDIA_VISIBLE_DEVICES"], "all");
        let devices: Vec<&str> = got.devices.iter().map(|d| d.container_path.as_str()).collect();
        assert_eq!(devices, ["/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu", "/dev/nvgpu/igpu0/ctrl", "/dev/nvmap"]);
    }

    #[test]
    fn runtimes_with_cdi_are_named() {
        assert!(runtime_supports_cdi("containerd", "2.0.4") && runtime_supports_cdi("containerd", "v2.1.0"));
        assert!(!runtime_supports_cdi("containerd", "1.6.20~ds1") && !runtime_supports_cdi("containerd", ""));
        assert!(runtime_supports_cdi("cri-o", "1.30.0"));
        assert_eq!(label_value("NVIDIA GeForce RTX 4090 (rev a1)"), "NVIDIA-GeForce-RTX-4090--rev-a1");
    }
}
