//! The signals as this node measures them (kubelet's `makeSignalObservations`): memory from the
//! newest stats reading (the node's working set against its memory; the pods' working set against
//! node allocatable's memory, for `allocatableMemory.available`), the node and image filesystems
//! from statfs, and PIDs from the kernel's limits and `/proc/loadavg`; and what a pod with
//! local storage limits keeps on disk (its writable layers, its logs, its emptyDir volumes).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::rank::Usage;
use super::{LocalStorage, Observations, Observed, Signal};
use crate::agent::image_gc::{self, ImageGc};
use crate::agent::stats::{Stats, Summary};
use crate::runtime::cri::Cri;
use crate::volumes::EMPTY_DIR;

/// The node's sources of the signals.
pub struct Sources {
    pub stats: Arc<Stats>,
    pub cri: Cri,
    /// `<data-dir>/agent`: where pods' directories (`pods/`) and logs (`logs/pods/`) are, the nodefs.
    pub nodefs: PathBuf,
    /// Memory less `--system-reserved` and `--kube-reserved`: the pods' share (kubelet's
    /// `kubepods` cgroup limit).
    pub pods_memory: i128,
    pub image_gc: Arc<ImageGc>,
    /// The pods' cgroups, where their processes are counted.
    pub cgroups: Option<crate::cgroups::Manager>,
    /// Where the runtime keeps its images, asked once.
    pub image_fs: tokio::sync::OnceCell<String>,
}

/// Space and inodes of the filesystem holding `path`: ((available, capacity) bytes,
/// (free, total) inodes).
fn statfs(path: &std::path::Path) -> Option<((i128, i128), (i128, i128))> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let block = i128::from(s.fragment_size());
    let bytes = (i128::from(s.blocks_available()) * block, i128::from(s.blocks()) * block);
    Some((bytes, (i128::from(s.files_free()), i128::from(s.files()))))
}

/// PIDs: (available, the most there may be): the smaller of `pid_max` and `threads-max`, less
/// the tasks `/proc/loadavg` counts.
fn pids() -> Option<(i128, i128)> {
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<i128>().ok();
    let max = read("/proc/sys/kernel/pid_max")?.min(read("/proc/sys/kernel/threads-max")?);
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running: i128 = loadavg.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()?;
    Some((max - running, max))
}

/// Each pod's use, by UID.
pub fn usage(summary: &Summary) -> HashMap<String, Usage> {
    summary
        .pods
        .iter()
        .map(|p| {
            let rootfs = |f: fn(&crate::agent::stats::FsStats) -> Option<u64>| {
                p.containers.iter().filter_map(|c| c.rootfs.as_ref().and_then(f)).sum::<u64>()
            };
            let usage = Usage {
                memory: p.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap_or(0),
                disk: rootfs(|f| f.used_bytes),
                inodes: rootfs(|f| f.inodes_used),
                processes: 0,
                containers: p
                    .containers
                    .iter()
                    .map(|c| {
                        let memory = c.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap_or(0);
                        let disk = c.rootfs.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
                        (c.name.clone(), memory, disk)
                    })
                    .collect(),
            };
            (p.pod_ref.uid.clone(), usage)
        })
        .collect()
}

/// The memory signals of a reading.
pub fn memory(summary: &Summary, pods_memory: i128, sample: u64, out: &mut Observations) {
    let Some(node) = summary.node.memory.as_ref() else { return };
    if let (Some(available), Some(working_set)) = (node.available_bytes, node.working_set_bytes) {
        let (available, working_set) = (i128::from(available), i128::from(working_set));
        out.insert(Signal::MemoryAvailable, Observed { available, capacity: available + working_set, sample });
    }
    let pods: i128 = summary.pods.iter().filter_map(|p| p.memory.as_ref()?.working_set_bytes).map(i128::from).sum();
    let available = (pods_memory - pods).max(0);
    out.insert(Signal::AllocatableMemoryAvailable, Observed { available, capacity: pods_memory, sample });
}

impl super::Node for Sources {
    async fn observe(&self) -> (Observations, HashMap<String, Usage>) {
        let (sample, summary) = self.stats.sample();
        let mut out = Observations::new();
        memory(&summary, self.pods_memory, sample, &mut out);
        let mut fs = |bytes: Signal, inodes: Signal, stat: Option<((i128, i128), (i128, i128))>| {
            if let Some(((available, capacity), (free, total))) = stat {
                out.insert(bytes, Observed { available, capacity, sample });
                out.insert(inodes, Observed { available: free, capacity: total, sample });
            }
        };
        fs(Signal::NodefsAvailable, Signal::NodefsInodesFree, statfs(&self.nodefs));
        let imagefs = self.image_fs.get_or_try_init(|| image_gc::image_fs_mount(&self.cri)).await.ok();
        fs(Signal::ImagefsAvailable, Signal::ImagefsInodesFree, imagefs.and_then(|m| statfs(m.as_ref())));
        if let Some((available, capacity)) = pids() {
            out.insert(Signal::PidAvailable, Observed { available, capacity, sample });
        }
        (out, usage(&summary))
    }

    async fn delete_unused_images(&self) -> anyhow::Result<u64> {
        self.image_gc.delete_unused().await
    }

    async fn local_storage(&self, pod: &Pod, usage: &Usage) -> LocalStorage {
        let logs = crate::agent::spec::log_dir(&self.nodefs.join("logs").join("pods"), pod);
        let volumes = self.nodefs.join("pods").join(crate::agent::spec::uid(pod)).join("volumes").join(EMPTY_DIR);
        let spec = pod.spec.clone().unwrap_or_default();
        let rootfs: HashMap<String, u64> =
            usage.containers.iter().map(|(name, _, disk)| (name.clone(), *disk)).collect();
        let measure = move || {
            let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
            let containers = containers
                .map(|c| (c.name.clone(), rootfs.get(&c.name).copied().unwrap_or(0) + du(&logs.join(&c.name))))
                .collect();
            let disk_backed = spec
                .volumes
                .iter()
                .flatten()
                .filter(|v| v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref() != Some("Memory")));
            let empty_dirs = disk_backed.map(|v| (v.name.clone(), du(&volumes.join(&v.name)))).collect();
            LocalStorage { containers, empty_dirs }
        };
        tokio::task::spawn_blocking(measure).await.unwrap_or_default()
    }

    fn processes(&self, pod: &Pod) -> Option<u64> {
        let qos = crate::cgroups::qos_class(pod);
        self.cgroups.as_ref()?.pod_processes(crate::agent::spec::uid(pod), qos)
    }
}

/// The bytes of the files below `path` (not following links); 0 when it is missing.
fn du(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path).map_or(0, |entries| entries.flatten().map(|e| du(&e.path())).sum())
}
