//! The node's cgroup manager, as kubelet's container manager lays cgroups out: `kubepods` below
//! the `--cgroup-root` of each hierarchy (`/` by default, as kubelet's; agents sharing one machine
//! each take their own, or each would remove the others' pods as orphans), the `burstable` and `besteffort` QoS tiers
//! under it, and one cgroup per pod (`pod<uid>`) in the tier of its QoS class; Guaranteed pods sit
//! directly under `kubepods`. Containers go below their pod's cgroup: the runtime creates them from
//! the `cgroup_parent` given in the sandbox config and the limits of [`container_resources`].
//!
//! Works on cgroup v1 (one hierarchy per controller) and v2 (unified, controllers enabled in each
//! parent's `cgroup.subtree_control`), with either driver's naming. With the systemd driver the
//! slices are created and limited through the cgroup filesystem, not through systemd's D-Bus API:
//! the agent needs no bus connection, and the layout is the one kubelet and the runtime (which take
//! the slice from `cgroup_parent`) expect, though systemd does not track these slices as units.
//!
//! Every call is blocking (file-system writes; removal waits for killed processes): call it from
//! `spawn_blocking` in async code.

mod resources;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::hierarchies::{self, V1, V2};
use cgroups_rs::fs::hugetlb::HugeTlbController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Cgroup, Controller, Hierarchy, MaxValue};
use k8s_cri::v1::{HugepageLimit, LinuxContainerResources};
use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{debug, info, warn};

use resources::{MIN_SHARES, hugepage_size_name, milli_cpu_to_shares, pod_cpu_request, shares_to_weight};
pub use resources::{PodResources, QosClass, container_resources, is_critical_pod, pod_resources, qos_class};

/// The node-allocatable cgroup below `--cgroup-root` that holds every pod.
const KUBEPODS: &str = "kubepods";
const BURSTABLE: &str = "burstable";
const BEST_EFFORT: &str = "besteffort";
const POD_PREFIX: &str = "pod";
const SYSTEMD_SUFFIX: &str = ".slice";
const PROCS_FILE: &str = "cgroup.procs";
/// cgroup v1's memory+swap limit, present when swap accounting is on.
const MEMSW_LIMIT_FILE: &str = "memory.memsw.limit_in_bytes";
/// cgroup v2's swap limit, present when swap accounting is on.
const SWAP_MAX_FILE: &str = "memory.swap.max";
/// Kill the whole container cgroup on OOM (kubelet's `singleProcessOOMKill: false`, v2 only).
const OOM_GROUP_FILE: &str = "memory.oom.group";
/// How long `remove_pod` keeps killing before giving up on a busy cgroup.
const KILL_ROUNDS: u32 = 50;
const KILL_INTERVAL: Duration = Duration::from_millis(100);

/// The cgroup hierarchy the host mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller under `/sys/fs/cgroup/<controller>` (also the hybrid layout).
    V1,
    /// The unified hierarchy at `/sys/fs/cgroup`.
    V2,
}

impl Version {
    /// v2 when `/sys/fs/cgroup` is a cgroup2 file system (`CGROUP2_SUPER_MAGIC`), as runc decides.
    pub fn detect() -> Version {
        if hierarchies::is_cgroup2_unified_mode() { Version::V2 } else { Version::V1 }
    }
}

/// Fails, naming the kernel parameter to add, when the memory controller is off: pods' memory limits
/// and OOM handling need it (kubelet refuses to start without it too). Raspberry Pi OS boots with
/// `cgroup_disable=memory` unless its command line says otherwise.
pub fn check_memory_controller() -> Result<(), String> {
    let version = Version::detect();
    let text = match version {
        Version::V2 => fs::read_to_string("/sys/fs/cgroup/cgroup.controllers"),
        Version::V1 => fs::read_to_string("/proc/cgroups"),
    };
    // Unreadable: nothing is known, and the cgroup manager says what fails later.
    let Ok(text) = text else { return Ok(()) };
    if memory_controller_enabled(version, &text) {
        return Ok(());
    }
    Err("the kernel's cgroup memory controller is not enabled, and pods' memory limits need it: add \
         `cgroup_memory=1 cgroup_enable=memory` to the kernel command line and reboot (on Raspberry Pi OS, at the \
         end of the one line in /boot/firmware/cmdline.txt, or /boot/cmdline.txt on older releases)"
        .into())
}

/// v2: `memory` among the root's `cgroup.controllers`; v1: `/proc/cgroups` lists it enabled.
fn memory_controller_enabled(version: Version, text: &str) -> bool {
    match version {
        Version::V2 => text.split_whitespace().any(|c| c == "memory"),
        Version::V1 => text.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"memory") && cols.get(3) == Some(&"1")
        }),
    }
}

/// How cgroups are named: plain directories, or systemd slices (`kubepods.slice/...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cgroup {path} ({controller}): {source}")]
    Cgroup {
        path: PathBuf,
        controller: String,
        #[source]
        source: cgroups_rs::fs::error::Error,
    },
    #[error("cgroup {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {path}: processes {pids:?} still running after SIGKILL")]
    Busy { path: PathBuf, pids: Vec<i32> },
    #[error("invalid cgroup name component {0:?}")]
    InvalidName(String),
    #[error("no cgroup controllers are mounted under /sys/fs/cgroup")]
    NoControllers,
}

/// A cgroup named by its components below the hierarchy root (kubelet's `CgroupName`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct CgroupName(Vec<String>);

impl CgroupName {
    /// A cgroup given in the driver's form: `ParseCgroupfsToCgroupName` (`/a/b`) or
    /// `ParseSystemdToCgroupName` (`/a.slice/a-b.slice`, or `a-b.slice`: the last slice names it).
    fn parse(driver: Driver, name: &str) -> Result<CgroupName, Error> {
        let parts: Vec<String> = match driver {
            Driver::Cgroupfs => name.split('/').filter(|p| !p.is_empty()).map(str::to_string).collect(),
            Driver::Systemd => {
                let last = name.rsplit('/').next().unwrap_or_default();
                let slice = last.strip_suffix(SYSTEMD_SUFFIX).unwrap_or(last);
                if slice.is_empty() || slice == "-" {
                    Vec::new()
                } else {
                    slice.split('-').map(|p| p.replace('_', "-")).collect()
                }
            }
        };
        for part in &parts {
            valid_component(part)?;
        }
        Ok(CgroupName(parts))
    }

    fn child(&self, part: &str) -> CgroupName {
        let mut parts = self.0.clone();
        parts.push(part.to_string());
        CgroupName(parts)
    }

    /// `ToCgroupfs`: `/kubepods/burstable/pod<uid>`.
    fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// `ToSystemd`: `-` escaped to `_` in each component, the components joined with `-` into one
    /// slice name and expanded into its path of parent slices:
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
    fn to_systemd(&self) -> String {
        let mut path = String::new();
        let mut prefix = String::new();
        for part in &self.0 {
            if !prefix.is_empty() {
                prefix.push('-');
            }
            prefix.push_str(&part.replace('-', "_"));
            path.push('/');
            path.push_str(&prefix);
            path.push_str(SYSTEMD_SUFFIX);
        }
        if path.is_empty() { "/".to_string() } else { path }
    }
}

/// Limits written to one cgroup; `None` leaves the current value.
#[derive(Default)]
struct Limits {
    cpu_shares: Option<u64>,
    cpu_quota: Option<(i64, u64)>,
    memory: Option<i64>,
    pids: Option<i64>,
    /// Hugepage limits in bytes by page size name (`2MB`); other sizes the host has get 0.
    hugepages: Option<BTreeMap<String, u64>>,
}

/// Creates, limits, lists and removes the `kubepods` hierarchy and the pod cgroups in it.
#[derive(Clone, Debug)]
pub struct Manager {
    driver: Driver,
    version: Version,
    root: CgroupName,
}

impl Manager {
    /// Detects the cgroup version and creates `kubepods` below `cgroup_root` (kubelet's
    /// `--cgroup-root`, `/` by default, in the driver's form: `/a/b` or `/a.slice`) with its
    /// `burstable` and `besteffort` tiers in every controller; besteffort gets the minimum CPU
    /// shares, as kubelet's QoS container manager sets.
    pub fn new(driver: Driver, cgroup_root: &str) -> Result<Manager, Error> {
        let root = CgroupName::parse(driver, cgroup_root)?.child(KUBEPODS);
        let manager = Manager { driver, version: Version::detect(), root };
        if manager.hierarchy().subsystems().is_empty() {
            return Err(Error::NoControllers);
        }
        manager.create(&manager.root)?;
        manager.create(&manager.root.child(BURSTABLE))?;
        let best_effort = manager.create(&manager.root.child(BEST_EFFORT))?;
        manager.apply(&best_effort, &Limits { cpu_shares: Some(MIN_SHARES), ..Limits::default() })?;
        info!(version = ?manager.version, driver = ?driver, root = %manager.name(&manager.root), "cgroup hierarchy ready");
        Ok(manager)
    }

    /// The `cgroup_parent` of the pod's sandbox (kubelet's `GetPodCgroupParent`): cgroupfs
    /// `/kubepods/burstable/pod<uid>` (Guaranteed: `/kubepods/pod<uid>`); systemd
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice`.
    pub fn pod_parent(&self, uid: &str, qos: QosClass) -> String {
        self.name(&self.pod_name(uid, qos))
    }

    /// Creates the pod cgroup (before the sandbox) and writes the pod-level limits.
    pub fn ensure_pod(&self, uid: &str, qos: QosClass, res: &PodResources) -> Result<(), Error> {
        valid_component(uid)?;
        let name = self.pod_name(uid, qos);
        let cgroup = self.create(&name)?;
        let hugepages = res.hugepage_limits.iter().map(|(size, limit)| (hugepage_size_name(*size), *limit)).collect();
        let limits = Limits {
            cpu_shares: Some(res.cpu_shares),
            cpu_quota: res.cpu_quota.map(|quota| (quota, res.cpu_period)),
            memory: res.memory_limit,
            pids: res.pids_limit,
            hugepages: Some(hugepages),
        };
        self.apply(&cgroup, &limits)?;
        debug!(cgroup = %self.name(&name), ?res, "pod cgroup ensured");
        Ok(())
    }

    /// Kills whatever still runs in the pod cgroup (containers' cgroups below it included) and
    /// removes it from every controller. A missing cgroup is not an error.
    pub fn remove_pod(&self, uid: &str, qos: QosClass) -> Result<(), Error> {
        valid_component(uid)?;
        let name = self.pod_name(uid, qos);
        self.destroy(&name)?;
        debug!(cgroup = %self.name(&name), "pod cgroup removed");
        Ok(())
    }

    /// How many tasks the pod's cgroup holds now (`pids.current`), where the pids controller is.
    pub fn pod_processes(&self, uid: &str, qos: QosClass) -> Option<u64> {
        valid_component(uid).ok()?;
        self.cgroup(&self.pod_name(uid, qos)).controller_of::<PidController>()?.get_pid_current().ok()
    }

    /// The pods that have a cgroup now, with their QoS class (to clean up after a restart).
    pub fn pods(&self) -> Result<Vec<(String, QosClass)>, Error> {
        let mut found = BTreeSet::new();
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            for dir in self.dirs(&self.qos_name(qos)) {
                let entries = match fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(source) => return Err(Error::Io { path: dir, source }),
                };
                for entry in entries {
                    let entry = entry.map_err(|source| Error::Io { path: dir.clone(), source })?;
                    if let Some(uid) = self.pod_uid(&entry.file_name().to_string_lossy(), qos)
                        && entry.file_type().is_ok_and(|t| t.is_dir())
                    {
                        found.insert((uid, qos));
                    }
                }
            }
        }
        Ok(found.into_iter().collect())
    }

    /// kubelet's `UpdateQOSCgroups` for CPU: the burstable tier's shares follow the CPU requests of
    /// the active Burstable pods; besteffort keeps the minimum.
    pub fn update_qos(&self, active_pods: &[Pod]) -> Result<(), Error> {
        let burstable_milli: i64 = active_pods
            .iter()
            .filter(|pod| qos_class(pod) == QosClass::Burstable)
            .map(pod_cpu_request)
            .fold(0, i64::saturating_add);
        let burstable = self.cgroup(&self.root.child(BURSTABLE));
        self.apply(
            &burstable,
            &Limits { cpu_shares: Some(milli_cpu_to_shares(burstable_milli)), ..Limits::default() },
        )?;
        let best_effort = self.cgroup(&self.root.child(BEST_EFFORT));
        self.apply(&best_effort, &Limits { cpu_shares: Some(MIN_SHARES), ..Limits::default() })
    }

    /// [`container_resources`] completed for this host as kubelet does: swap kept off (v1: the
    /// memory+swap limit equals the memory limit; v2: `memory.swap.max` 0) where swap is accounted,
    /// `memory.oom.group` on v2 so an OOM kills the whole container, and a zero limit for every
    /// hugepage size the host has that the container does not ask for.
    pub fn container_resources(
        &self,
        pod: &Pod,
        container: &Container,
        memory_capacity: u64,
    ) -> LinuxContainerResources {
        let mut res = container_resources(pod, container, memory_capacity);
        let root_dirs = self.dirs(&self.root);
        let has_file = |file: &str| root_dirs.iter().any(|dir| dir.join(file).exists());
        match self.version {
            Version::V1 if has_file(MEMSW_LIMIT_FILE) => res.memory_swap_limit_in_bytes = res.memory_limit_in_bytes,
            Version::V1 => {}
            Version::V2 => {
                if has_file(SWAP_MAX_FILE) {
                    res.unified.insert(SWAP_MAX_FILE.to_string(), "0".to_string());
                }
                res.unified.insert(OOM_GROUP_FILE.to_string(), "1".to_string());
            }
        }
        if let Some(hugetlb) = self.cgroup(&self.root).controller_of::<HugeTlbController>() {
            for size in hugetlb.get_sizes() {
                if !res.hugepage_limits.iter().any(|l| l.page_size == size) {
                    res.hugepage_limits.push(HugepageLimit { page_size: size, limit: 0 });
                }
            }
        }
        res
    }

    /// Kills everything in the whole hierarchy under the root and removes it, with the parents
    /// of the root that are left empty (tests).
    #[cfg(test)]
    pub fn remove_all(&self) -> Result<(), Error> {
        self.destroy(&self.root)?;
        for depth in (1..self.root.0.len()).rev() {
            for dir in self.dirs(&CgroupName(self.root.0[..depth].to_vec())) {
                let _ = fs::remove_dir(dir);
            }
        }
        Ok(())
    }

    /// kubelet's `cgroupManager.Name`: the cgroup's path from the hierarchy root for the driver.
    fn name(&self, name: &CgroupName) -> String {
        match self.driver {
            Driver::Cgroupfs => name.to_cgroupfs(),
            Driver::Systemd => name.to_systemd(),
        }
    }

    fn qos_name(&self, qos: QosClass) -> CgroupName {
        match qos {
            QosClass::Guaranteed => self.root.clone(),
            QosClass::Burstable => self.root.child(BURSTABLE),
            QosClass::BestEffort => self.root.child(BEST_EFFORT),
        }
    }

    fn pod_name(&self, uid: &str, qos: QosClass) -> CgroupName {
        self.qos_name(qos).child(&format!("{POD_PREFIX}{uid}"))
    }

    /// The pod UID a directory named `dir_name` in the `qos` tier stands for, if it is a pod's.
    fn pod_uid(&self, dir_name: &str, qos: QosClass) -> Option<String> {
        let component = match self.driver {
            Driver::Cgroupfs => dir_name.to_string(),
            Driver::Systemd => dir_name.strip_suffix(SYSTEMD_SUFFIX)?.rsplit('-').next()?.replace('_', "-"),
        };
        let uid = component.strip_prefix(POD_PREFIX).filter(|uid| !uid.is_empty())?;
        let expected = self.name(&self.pod_name(uid, qos));
        (Path::new(&expected).file_name()? == dir_name).then(|| uid.to_string())
    }

    fn hierarchy(&self) -> Box<dyn Hierarchy> {
        match self.version {
            Version::V1 => Box::new(V1::new()),
            Version::V2 => Box::new(V2::new()),
        }
    }

    /// A handle on the cgroup in every controller (nothing is created).
    fn cgroup(&self, name: &CgroupName) -> Cgroup {
        Cgroup::load(self.hierarchy(), self.name(name).trim_start_matches('/'))
    }

    /// The cgroup's directory in each hierarchy (one on v2).
    fn dirs(&self, name: &CgroupName) -> Vec<PathBuf> {
        let dirs: BTreeSet<PathBuf> =
            self.cgroup(name).subsystems().iter().map(|s| s.to_controller().path().to_path_buf()).collect();
        dirs.into_iter().collect()
    }

    /// Creates the cgroup (and its parents) in every controller. On v1 cgroups-rs copies
    /// `cpuset.cpus` and `cpuset.mems` from the parent so the cpuset can hold tasks; on v2 it
    /// enables the controllers in each parent's `cgroup.subtree_control`.
    fn create(&self, name: &CgroupName) -> Result<Cgroup, Error> {
        let cgroup = self.cgroup(name);
        match self.version {
            Version::V2 => cgroup.create().map_err(|source| Error::Cgroup {
                path: self.dirs(name).into_iter().next().unwrap_or_default(),
                controller: "unified".to_string(),
                source,
            })?,
            Version::V1 => {
                for subsystem in cgroup.subsystems() {
                    let controller = subsystem.to_controller();
                    controller.create().map_err(|source| Error::Cgroup {
                        path: controller.path().to_path_buf(),
                        controller: subsystem.controller_name(),
                        source,
                    })?;
                }
            }
        }
        Ok(cgroup)
    }

    fn apply(&self, cgroup: &Cgroup, limits: &Limits) -> Result<(), Error> {
        let v2 = self.version == Version::V2;
        if let Some(cpu) = cgroup.controller_of::<CpuController>() {
            let err = controller_error(cpu, "cpu");
            if let Some(shares) = limits.cpu_shares {
                cpu.set_shares(if v2 { shares_to_weight(shares) } else { shares }).map_err(&err)?;
            }
            if let Some((quota, period)) = limits.cpu_quota {
                cpu.set_cfs_quota_and_period(Some(quota), Some(period)).map_err(&err)?;
            }
        }
        if let (Some(memory), Some(bytes)) = (cgroup.controller_of::<MemController>(), limits.memory) {
            memory.set_limit(bytes).map_err(controller_error(memory, "memory"))?;
        }
        if let (Some(pids), Some(max)) = (cgroup.controller_of::<PidController>(), limits.pids) {
            let max = if max > 0 { MaxValue::Value(max) } else { MaxValue::Max };
            pids.set_pid_max(max).map_err(controller_error(pids, "pids"))?;
        }
        if let (Some(hugetlb), Some(hugepages)) = (cgroup.controller_of::<HugeTlbController>(), &limits.hugepages) {
            for size in hugetlb.get_sizes() {
                let limit = hugepages.get(&size).copied().unwrap_or(0);
                hugetlb.set_limit_in_bytes(&size, limit).map_err(controller_error(hugetlb, "hugetlb"))?;
            }
        }
        Ok(())
    }

    /// Kills the processes in the cgroup and below, then removes it from every controller.
    fn destroy(&self, name: &CgroupName) -> Result<(), Error> {
        let dirs: Vec<PathBuf> = self.dirs(name).into_iter().filter(|d| d.exists()).collect();
        if dirs.is_empty() {
            return Ok(());
        }
        kill_all(&dirs)?;
        let cgroup = self.cgroup(name);
        let mut removed = BTreeSet::new();
        for subsystem in cgroup.subsystems() {
            let controller = subsystem.to_controller();
            if removed.insert(controller.path().to_path_buf()) {
                controller.delete().map_err(|source| Error::Cgroup {
                    path: controller.path().to_path_buf(),
                    controller: subsystem.controller_name(),
                    source,
                })?;
            }
        }
        Ok(())
    }
}

fn controller_error<C: Controller>(controller: &C, name: &str) -> impl Fn(cgroups_rs::fs::error::Error) -> Error {
    let path = controller.path().to_path_buf();
    let name = name.to_string();
    move |source| Error::Cgroup { path: path.clone(), controller: name.clone(), source }
}

/// A name component must be a plain directory name: letters, digits, `-`, `_` and `.`, not only dots.
fn valid_component(part: &str) -> Result<&str, Error> {
    let plain = part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if part.is_empty() || !plain || part.chars().all(|c| c == '.') {
        return Err(Error::InvalidName(part.to_string()));
    }
    Ok(part)
}

/// SIGKILLs every process in the directories and their sub-cgroups until none is left.
fn kill_all(dirs: &[PathBuf]) -> Result<(), Error> {
    let mut pids = BTreeSet::new();
    for round in 0..KILL_ROUNDS {
        pids.clear();
        for dir in dirs {
            collect_pids(dir, &mut pids)?;
        }
        if pids.is_empty() {
            return Ok(());
        }
        if round == 0 {
            info!(cgroup = %dirs[0].display(), ?pids, "killing processes left in cgroup");
        }
        for pid in &pids {
            // SAFETY: kill(2) has no memory effects; a vanished pid only yields ESRCH.
            if unsafe { libc::kill(*pid, libc::SIGKILL) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ESRCH) {
                    warn!(pid, error = %e, "cannot kill process in cgroup");
                }
            }
        }
        std::thread::sleep(KILL_INTERVAL);
    }
    Err(Error::Busy { path: dirs[0].clone(), pids: pids.into_iter().collect() })
}

fn collect_pids(dir: &Path, pids: &mut BTreeSet<i32>) -> Result<(), Error> {
    let procs = dir.join(PROCS_FILE);
    match fs::read_to_string(&procs) {
        Ok(text) => pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()).filter(|p| *p > 0)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::Io { path: procs, source }),
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::Io { path: dir.to_path_buf(), source }),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), pids)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
