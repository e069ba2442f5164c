//! One pod's worker (kubelet's pod worker plus `SyncPod`, `SyncTerminatingPod` and
//! `SyncTerminatedPod`): it brings the runtime in line with the pod's spec, one step at a time, and
//! publishes the status. Updates for the pod replace each other (the newest wins); the runtime's
//! changes (PLEG), probe results and timers (backoff, deadlines) wake it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, PodStatus};
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::cluster::WriteError;
use super::context::Ctx;
use super::probes::{Kind, Target};
use super::spec;
use super::status::{self, RuntimeContainer, RuntimePod, keys};
use crate::events::EventType;
use crate::runtime::cri::{self, CriError};

/// The sandbox containers are started in; its CRI config (which reads the node's resolver) is built
/// only when a container is actually created.
struct SandboxRef<'a> {
    id: &'a str,
    attempt: u32,
    cgroup_parent: &'a str,
}

/// What the manager hands a worker: the pod as it is now, or its last state once it is gone from
/// the API.
#[derive(Debug, Clone)]
pub enum Update {
    Pod(Arc<Pod>),
    Removed(Arc<Pod>),
}

impl Update {
    /// The pod, whether or not it is gone from the API.
    pub fn pod(&self) -> &Arc<Pod> {
        match self {
            Update::Pod(p) | Update::Removed(p) => p,
        }
    }
}

/// How long a failed sync waits before it is tried again (kubelet's pod worker backoff).
const RETRY: Duration = Duration::from_secs(10);
/// The first retry of volumes that could not be set up (kubelet's volume manager looks at a pod's
/// volumes again every 100 ms): a claim is often a moment from Bound (its phase is written just after
/// the binding the scheduler waits for), or its volume from attached, when the pod arrives.
const VOLUME_RETRY: Duration = Duration::from_millis(100);
/// How often a quiet pod is looked at anyway (kubelet's `syncFrequency`).
const RESYNC: Duration = Duration::from_secs(60);
/// The shortest time a container is given to stop (kubelet's `minimumGracePeriodInSeconds`).
const MIN_GRACE: i64 = 2;
/// The instances of each container whose status is read: the current one and the one before
/// (its `lastState`).
const KEEP_EXITED: usize = 2;
/// Exited containers kept per container name, for `kubectl logs --previous` and `lastState`
/// (kubelet's container GC `MaxPerPodContainer`, `--maximum-dead-containers-per-container`).
const MAX_DEAD_PER_CONTAINER: usize = 1;
/// The most of a termination message file that is read (kubelet's limit).
const MAX_TERMINATION_MESSAGE: u64 = 4096;

/// Where a worker is in the pod's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Syncing,
    /// Everything is stopped; the status is final.
    Terminated,
}

/// The status a worker last generated for its pod, written to the API or not yet (what kubelet's
/// status manager holds): what the node endpoint answers by.
pub type Latest = Arc<std::sync::Mutex<Option<PodStatus>>>;

/// Where the eviction manager asks a worker to stop its pod for good.
pub type EvictionRequest = Arc<std::sync::Mutex<Option<super::eviction::Eviction>>>;

pub struct Worker {
    ctx: Arc<Ctx>,
    uid: String,
    pod: Arc<Pod>,
    latest: Latest,
    updates: watch::Receiver<Update>,
    /// Set once everything of the pod is stopped (admission stops counting it then).
    stopped: Arc<AtomicBool>,
    wake: Arc<Notify>,
    stage: Stage,
    /// Why each container waits (reason, message), shown in its status.
    waiting: HashMap<String, (String, String)>,
    /// ContainerStatus by container ID, as of the state it was asked in.
    statuses: HashMap<String, cri::ContainerStatus>,
    /// The sandbox whose IPs are known, and the IPs.
    ips: Option<(String, Vec<String>)>,
    /// Why the pod is finished for good (reason, message), when the agent decided it.
    terminal: Option<(String, String)>,
    /// Where an eviction request arrives.
    eviction: EvictionRequest,
    /// The eviction taken in.
    evicted: Option<super::eviction::Eviction>,
    /// The status last written and the resourceVersion it was written at: the base of the next
    /// status until the watch delivers that write, and what is not written twice.
    written: Option<(PodStatus, Value, u64)>,
    /// The last status write failed: the pod is not deleted until it succeeds.
    unpublished: bool,
    /// The earliest time something is due (a backoff ends).
    due: Option<Instant>,
    /// How long the next retry of a failed volume setup waits (doubling up to `RETRY`).
    volume_retry: Duration,
}

/// What a step of the worker asks for next.
enum Next {
    /// Wait for an update, an event or a timer.
    Wait,
    /// The pod is gone and everything is cleaned up: the worker ends.
    Done,
}

fn wall_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The `Instant` of a wall-clock time in nanoseconds (for backoff bookkeeping).
fn instant_of(ns: i64) -> Instant {
    let ago = Duration::from_nanos(wall_ns().saturating_sub(ns).max(0) as u64);
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

impl Worker {
    /// The status it last generated, as it changes.
    pub fn latest(&self) -> Latest {
        self.latest.clone()
    }

    pub fn new(
        ctx: Arc<Ctx>,
        pod: Arc<Pod>,
        updates: watch::Receiver<Update>,
        wake: Arc<Notify>,
        stopped: Arc<AtomicBool>,
    ) -> Self {
        Worker {
            uid: spec::uid(&pod).to_string(),
            ctx,
            pod,
            latest: Latest::default(),
            updates,
            stopped,
            wake,
            stage: Stage::Syncing,
            waiting: HashMap::new(),
            statuses: HashMap::new(),
            ips: None,
            terminal: None,
            eviction: EvictionRequest::default(),
            evicted: None,
            written: None,
            unpublished: false,
            due: None,
            volume_retry: VOLUME_RETRY,
        }
    }

    /// Where the eviction manager asks this pod to stop for good (the worker must be woken).
    pub fn eviction(&self) -> EvictionRequest {
        self.eviction.clone()
    }

    /// Runs until the pod is gone (or cairn stops: then containers are left running).
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let latest = self.updates.borrow_and_update().clone();
            let next = match latest {
                Update::Pod(pod) => {
                    self.pod = pod;
                    self.step().await
                }
                Update::Removed(pod) => {
                    self.pod = pod;
                    self.removed().await
                }
            };
            if matches!(next, Next::Done) {
                return;
            }
            let sleep = self.due.take().map_or(RESYNC, |t| t.saturating_duration_since(Instant::now()).min(RESYNC));
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                changed = self.updates.changed() => {
                    if changed.is_err() {
                        // The manager is gone (cairn is stopping).
                        return;
                    }
                }
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    fn due_at(&mut self, t: Instant) {
        self.due = Some(self.due.map_or(t, |d| d.min(t)));
    }

    fn event(&self, kind: EventType, reason: &str, message: String) {
        self.ctx.event(&self.pod, kind, reason, message);
    }

    async fn step(&mut self) -> Next {
        let pod = self.pod.clone();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let finished = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let eviction = self.eviction.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(eviction) = eviction.filter(|_| self.stage == Stage::Syncing && !finished) {
            self.terminal = Some((super::eviction::REASON.into(), eviction.message.clone()));
            self.evicted = Some(eviction);
        }
        if self.stage == Stage::Syncing && !deleting && !finished && self.terminal.is_none() {
            if let Some(deadline) = self.deadline_exceeded() {
                self.event(EventType::Normal, "DeadlineExceeded", deadline.clone());
                self.terminal = Some(("DeadlineExceeded".into(), deadline));
            } else {
                match self.sync().await {
                    Ok(true) => {}
                    Ok(false) => return Next::Wait,
                    Err(e) => {
                        tracing::warn!("pod {}: {e:#}", spec::full_name(&pod));
                        self.due_at(Instant::now() + RETRY);
                        return Next::Wait;
                    }
                }
            }
        }
        // The pod is finished, deleted or past its deadline: stop it.
        if self.stage == Stage::Syncing {
            let grace = if deleting {
                pod.metadata.deletion_grace_period_seconds.unwrap_or_else(|| self.spec_grace())
            } else {
                self.spec_grace()
            };
            let grace = self.evicted.as_ref().map_or(grace, |e| grace.min(e.grace));
            // A pod that was already finished keeps the status it finished with.
            if let Err(e) = self.terminate(grace, !finished).await {
                tracing::warn!("pod {}: stopping: {e:#}", spec::full_name(&pod));
                self.due_at(Instant::now() + RETRY);
                return Next::Wait;
            }
            self.stage = Stage::Terminated;
            self.stopped.store(true, Ordering::Relaxed);
            // Nothing runs any more: its devices are free.
            self.ctx.host.devices.release(&self.uid);
        }
        if deleting && self.unpublished {
            // The final status must be written before the pod object goes.
            let rt = self.runtime_pod().await.unwrap_or_default();
            self.publish(&rt).await;
        }
        if deleting && !self.unpublished {
            match self.ctx.api.delete(&pod).await {
                Ok(()) | Err(WriteError::Gone) => {}
                Err(e) => {
                    tracing::warn!("pod {}: deleting: {e}", spec::full_name(&pod));
                    self.due_at(Instant::now() + RETRY);
                }
            }
        }
        Next::Wait
    }

    /// Whether an update that deletes the pod is waiting: the sync stops starting containers.
    fn deletion_pending(&self) -> bool {
        self.updates.has_changed().unwrap_or(true)
            && match &*self.updates.borrow() {
                Update::Pod(p) => p.metadata.deletion_timestamp.is_some(),
                Update::Removed(_) => true,
            }
    }

    fn spec_grace(&self) -> i64 {
        self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30)
    }

    /// `activeDeadlineSeconds` passed since the pod started: the message to fail it with.
    fn deadline_exceeded(&mut self) -> Option<String> {
        let secs = self.pod.spec.as_ref()?.active_deadline_seconds?;
        let start = self.pod.status.as_ref()?.start_time.as_ref()?.0;
        let elapsed = chrono::Utc::now().timestamp() - start.as_second();
        if elapsed >= secs {
            return Some("Pod was active on the node longer than the specified deadline".into());
        }
        self.due_at(Instant::now() + Duration::from_secs((secs - elapsed) as u64));
        None
    }

    /// The pod vanished from the API (deleted for good): stop everything and clean up.
    async fn removed(&mut self) -> Next {
        if self.stage == Stage::Syncing {
            // Gone from the API while still running: force-deleted, so no grace period is left.
            if let Err(e) = self.terminate(0, false).await {
                tracing::warn!("pod {}: stopping: {e:#}", spec::full_name(&self.pod));
            }
        }
        self.cleanup().await;
        Next::Done
    }

    /// Lists the pod's sandboxes and containers, with the details of the newest ones.
    async fn runtime_pod(&mut self) -> Result<RuntimePod, CriError> {
        let cri = &self.ctx.runtime;
        let selector = spec::uid_selector(&self.uid);
        let mut sandboxes = cri
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }),
            })
            .await?
            .items;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut listed = cri
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter { label_selector: selector, ..Default::default() }),
            })
            .await?
            .containers;
        listed.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let mut containers = Vec::with_capacity(listed.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for c in listed {
            let name = c.labels.get(keys::CONTAINER_NAME).cloned().unwrap_or_default();
            let nth = seen.entry(name.clone()).or_default();
            *nth += 1;
            let state = cri::ContainerState::try_from(c.state).unwrap_or(cri::ContainerState::ContainerUnknown);
            // A container's status changes only with its state: ask once per state.
            let status = if let Some(s) = self.statuses.get(&c.id).filter(|s| s.state == c.state) {
                Some(s.clone())
            } else if *nth <= KEEP_EXITED {
                match cri
                    .container_status(cri::ContainerStatusRequest { container_id: c.id.clone(), verbose: false })
                    .await
                {
                    Ok(r) => r.status.map(|mut s| {
                        if state == cri::ContainerState::ContainerExited {
                            s.message = termination_message(&s, &c.annotations).unwrap_or(s.message);
                        }
                        s.state = c.state;
                        self.statuses.insert(c.id.clone(), s.clone());
                        s
                    }),
                    Err(CriError::NotFound { .. }) => continue,
                    Err(e) => return Err(e),
                }
            } else {
                None
            };
            containers.push(RuntimeContainer {
                id: c.id.clone(),
                name,
                sandbox_id: c.pod_sandbox_id.clone(),
                restart_count: c.annotations.get(keys::RESTART_COUNT).and_then(|r| r.parse().ok()).unwrap_or(0),
                hash: c.annotations.get(keys::CONTAINER_HASH).cloned().unwrap_or_default(),
                state,
                status,
                annotations: c.annotations,
            });
        }
        let ids: std::collections::HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        self.statuses.retain(|id, _| ids.contains(id.as_str()));
        Ok(RuntimePod { sandboxes, containers })
    }

    /// One round of `SyncPod`. Returns whether the pod has reached a terminal phase.
    async fn sync(&mut self) -> anyhow::Result<bool> {
        let pod = self.pod.clone();
        let spec = pod.spec.clone().unwrap_or_default();
        if !spec::host_network(&pod)
            && let Some(problem) = self.ctx.network_problem()
        {
            anyhow::bail!("network is not ready: {problem}");
        }
        let cgroup_parent = self.ctx.ensure_pod_cgroup(&pod)?;
        let volumes = match self.ctx.setup_volumes(&pod).await {
            Ok(v) => {
                self.volume_retry = VOLUME_RETRY;
                v
            }
            Err(e) => {
                self.event(EventType::Warning, crate::volumes::FAILED_MOUNT, e.to_string());
                let rt = self.runtime_pod().await?;
                self.publish(&rt).await;
                let delay = self.volume_retry;
                self.volume_retry = (delay * 2).min(RETRY);
                self.due_at(Instant::now() + delay);
                return Ok(false);
            }
        };

        let mut rt = self.runtime_pod().await?;
        // Containers to stop: changed specs, failed liveness or startup probes, names no longer in the spec.
        let ephemeral = spec::ephemeral_containers(&pod);
        let all_specs: Vec<&Container> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .chain(ephemeral.iter().map(|(c, _)| c))
            .collect();
        for c in rt.running().cloned().collect::<Vec<_>>() {
            let wanted = all_specs.iter().find(|s| s.name == c.name);
            let why = match wanted {
                None => Some(format!("Container {} is not in the pod's spec any more", c.name)),
                Some(s) if spec::container_hash(s) != c.hash && !c.hash.is_empty() => {
                    Some(format!("Container {} definition changed, will be restarted", c.name))
                }
                Some(s) => self
                    .ctx
                    .take_unhealthy(&c.id)
                    .and_then(|kind| kind.kill_message(&c.name, status::should_restart(&pod, s, 137))),
            };
            if let Some(why) = why {
                self.kill_container(&c, wanted.copied(), self.spec_grace(), Some(why)).await;
                rt = self.runtime_pod().await?;
            }
        }

        // The sandbox: reuse the ready one, or make a new one.
        let sandbox = match rt.ready_sandbox() {
            Some(s) => s.clone(),
            None => {
                let ran = !rt.containers.is_empty();
                let policy = spec.restart_policy.as_deref().unwrap_or("Always");
                if ran && policy == "Never" {
                    // Its sandbox died after the containers ran: nothing is restarted.
                    self.publish(&rt).await;
                    return Ok(true);
                }
                for c in rt.running().cloned().collect::<Vec<_>>() {
                    self.kill_container(&c, None, 0, None).await;
                }
                let attempt =
                    rt.sandboxes.iter().filter_map(|s| s.metadata.as_ref()).map(|m| m.attempt + 1).max().unwrap_or(0);
                if attempt > 0 {
                    self.event(
                        EventType::Normal,
                        "SandboxChanged",
                        "Pod sandbox changed, it will be killed and re-created.".into(),
                    );
                }
                let config = spec::sandbox_config(
                    &pod,
                    attempt,
                    &self.ctx.log_dir(&pod),
                    cgroup_parent.clone(),
                    &self.ctx.host.cluster_dns,
                );
                let handler = match spec.runtime_class_name.as_deref().filter(|c| !c.is_empty()) {
                    None => Ok(String::new()),
                    Some(class) => self.ctx.api.runtime_handler(class).await,
                };
                let (metadata, labels) = (config.metadata.clone(), config.labels.clone());
                let created = match handler {
                    Ok(runtime_handler) => self
                        .ctx
                        .runtime
                        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config), runtime_handler })
                        .await
                        .map(|r| r.pod_sandbox_id)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                match created {
                    // The new sandbox leads the view; its containers are yet to come (no relist).
                    Ok(id) => rt.sandboxes.insert(
                        0,
                        cri::PodSandbox {
                            id,
                            metadata,
                            state: cri::PodSandboxState::SandboxReady as i32,
                            created_at: wall_ns(),
                            labels,
                            ..Default::default()
                        },
                    ),
                    Err(e) => {
                        self.event(
                            EventType::Warning,
                            "FailedCreatePodSandBox",
                            format!("Failed to create pod sandbox: {e}"),
                        );
                        self.publish(&rt).await;
                        self.due_at(Instant::now() + RETRY);
                        return Ok(false);
                    }
                }
                rt.sandboxes[0].clone()
            }
        };
        let target = SandboxRef {
            id: &sandbox.id,
            attempt: sandbox.metadata.as_ref().map_or(0, |m| m.attempt),
            cgroup_parent: &cgroup_parent,
        };
        let pod_ips = self.pod_ips(&sandbox.id).await?;
        // Status as seen before starting anything (PodReadyToStartContainers, Pending).
        self.publish(&rt).await;

        // Containers adopted after a restart of cairn get their probes back (a no-op for those
        // already probed).
        let statuses = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()));
        let was: HashMap<&str, (bool, bool)> = statuses
            .filter_map(|s| Some((s.container_id.as_deref()?, (s.started.unwrap_or(false), s.ready))))
            .collect();
        for c in rt.current().filter(|c| c.running()) {
            if let Some(s) = all_specs.iter().find(|s| s.name == c.name) {
                let target = Target::new(s, &c.id, pod_ips.first().cloned());
                let previous = was.get(format!("{}://{}", self.ctx.host.runtime_name, c.id).as_str()).copied();
                self.ctx.probes.adopt_container(&self.uid, s, &c.id, target, previous.unwrap_or((false, false)));
            }
        }

        // Ephemeral containers run once and are never restarted; upstream starts them before init
        // containers, so that a pod stuck initializing can still be debugged.
        for (c, _) in &ephemeral {
            if self.deletion_pending() {
                return Ok(false);
            }
            if rt.latest(&c.name).is_none() {
                self.start(&pod, c, &target, &rt, &pod_ips, &volumes).await;
            }
        }

        // Init containers, in order, in this sandbox (a new sandbox runs them again); then app
        // containers. Restart counts and backoff follow every earlier run.
        let mut initialized = true;
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if self.deletion_pending() {
                return Ok(false);
            }
            let started = self.ctx.probes.result(&self.uid, &c.name, Kind::Startup);
            let current = rt.current_latest(&c.name);
            if status::init_done(&spec, i, &rt, started) {
                if status::is_sidecar(c) && current.is_some_and(|l| l.exited()) {
                    self.start(&pod, c, &target, &rt, &pod_ips, &volumes).await;
                }
                continue;
            }
            initialized = false;
            match current {
                Some(l) if l.running() => {}
                Some(l) if l.exited() && !status::should_restart(&pod, c, l.exit_code().unwrap_or(1)) => {
                    // A regular init container failed under restartPolicy Never: the pod fails.
                    self.publish(&rt).await;
                    return Ok(true);
                }
                _ => self.start(&pod, c, &target, &rt, &pod_ips, &volumes).await,
            }
            break;
        }
        if initialized {
            for c in &spec.containers {
                if self.deletion_pending() {
                    return Ok(false);
                }
                let start = match rt.current_latest(&c.name) {
                    // New in this sandbox: unless an earlier run completed for good.
                    None => rt
                        .latest(&c.name)
                        .and_then(|l| l.exit_code())
                        .is_none_or(|code| status::should_restart(&pod, c, code)),
                    Some(l) if l.exited() => status::should_restart(&pod, c, l.exit_code().unwrap_or(1)),
                    Some(l) => !l.running() && !l.exited(),
                };
                if start {
                    self.start(&pod, c, &target, &rt, &pod_ips, &volumes).await;
                }
            }
        }
        let rt = self.runtime_pod().await?;
        self.remove_old_containers(&pod, &rt).await;
        let phase = self.publish(&rt).await;
        Ok(matches!(phase.as_deref(), Some("Succeeded" | "Failed")))
    }

    /// The sandbox's IPs (asked once per sandbox).
    async fn pod_ips(&mut self, sandbox_id: &str) -> Result<Vec<String>, CriError> {
        if let Some((id, ips)) = &self.ips
            && id == sandbox_id
        {
            return Ok(ips.clone());
        }
        let status = self
            .ctx
            .runtime
            .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose: false })
            .await?;
        let ips: Vec<String> = status
            .status
            .and_then(|s| s.network)
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|i| i.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        self.ips = Some((sandbox_id.to_string(), ips.clone()));
        Ok(ips)
    }

    /// Starts (or restarts) one container, honouring its backoff; failures are recorded as its
    /// waiting reason and events, not returned.
    async fn start(
        &mut self,
        pod: &Pod,
        c: &Container,
        sandbox: &SandboxRef<'_>,
        rt: &RuntimePod,
        pod_ips: &[String],
        volumes: &crate::volumes::Volumes,
    ) {
        let key = format!("{}/container/{}", self.uid, c.name);
        let last = rt.latest(&c.name);
        if let Some(finished) = last.and_then(|l| l.finished_at()) {
            let event_at = instant_of(finished);
            let blocked = self.ctx.backoff().blocked_until(&key, event_at, Instant::now());
            if let Some(until) = blocked {
                let delay = self.ctx.backoff().delay(&key);
                self.waiting.insert(
                    c.name.clone(),
                    (
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {} restarting failed container={} pod={}",
                            go_duration(delay),
                            c.name,
                            spec::full_name(pod)
                        ),
                    ),
                );
                self.event(
                    EventType::Warning,
                    "BackOff",
                    format!("Back-off restarting failed container {} in pod {}", c.name, spec::full_name(pod)),
                );
                self.due_at(until);
                return;
            }
            self.ctx.backoff().next(&key, event_at, Instant::now());
        }
        let Some(image_user) = self.ensure_image(pod, c).await else { return };
        if let Err(message) = spec::verify_run_as_non_root(pod, c, (image_user.0, &image_user.1)) {
            self.waiting.insert(c.name.clone(), ("CreateContainerConfigError".into(), message.clone()));
            self.event(EventType::Warning, "Failed", format!("Error: {message}"));
            return;
        }
        // Without an earlier container (the runtime lost them, as in a reboot), past the log files
        // there are, so that none is written over (kubelet's `calcRestartCountByLogDir`).
        let restart_count = last.map_or_else(
            || spec::restart_count_by_log_dir(&self.ctx.log_dir(pod).join(&c.name)),
            |l| l.restart_count + 1,
        );
        let mut pod_with_ips = pod.clone();
        {
            let status = pod_with_ips.status.get_or_insert_with(Default::default);
            status.pod_ip = pod_ips.first().cloned();
            status.pod_ips =
                Some(pod_ips.iter().map(|ip| k8s_openapi::api::core::v1::PodIP { ip: ip.clone() }).collect());
            status.host_ip = self.ctx.host.node_ip.clone();
            status.host_ips = self.ctx.host.node_ip.clone().map(|ip| vec![k8s_openapi::api::core::v1::HostIP { ip }]);
        }
        let config = match self.ctx.container_inputs(&pod_with_ips, c, restart_count, pod_ips, volumes).await {
            Ok(inputs) => Ok(spec::container_config(pod, c, inputs)),
            Err(e) => Err(e.to_string()),
        };
        // An ephemeral container with a target joins that container's process namespace
        // (kubelet's `getTargetID`: the target's newest run).
        let ephemeral = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or_default();
        let target = ephemeral.iter().find(|e| e.name == c.name).and_then(|e| e.target_container_name.clone());
        let config = config.and_then(|mut config| {
            if let Some(target) = target.filter(|t| !t.is_empty()) {
                let run = rt.latest(&target).ok_or(format!("unable to find target container {target}"))?;
                spec::join_pid_namespace(&mut config, &run.id);
            }
            Ok(config)
        });
        let config = match config {
            Ok(config) => config,
            Err(message) => {
                self.waiting.insert(c.name.clone(), ("CreateContainerConfigError".into(), message.clone()));
                self.event(EventType::Warning, "Failed", format!("Error: {message}"));
                self.due_at(Instant::now() + RETRY);
                return;
            }
        };
        let created = self
            .ctx
            .runtime
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.id.into(),
                config: Some(config),
                sandbox_config: Some(spec::sandbox_config(
                    pod,
                    sandbox.attempt,
                    &self.ctx.log_dir(pod),
                    sandbox.cgroup_parent.to_string(),
                    &self.ctx.host.cluster_dns,
                )),
            })
            .await;
        let id = match created {
            Ok(r) => r.container_id,
            Err(e) => {
                self.waiting.insert(c.name.clone(), ("CreateContainerError".into(), e.to_string()));
                self.event(EventType::Warning, "Failed", format!("Error: {e}"));
                self.due_at(Instant::now() + RETRY);
                return;
            }
        };
        self.event(EventType::Normal, "Created", format!("Created container: {}", c.name));
        if let Err(e) = self.ctx.runtime.start_container(cri::StartContainerRequest { container_id: id.clone() }).await
        {
            self.waiting.insert(c.name.clone(), ("RunContainerError".into(), e.to_string()));
            self.event(EventType::Warning, "Failed", format!("Error: {e}"));
            self.due_at(Instant::now() + RETRY);
            return;
        }
        self.event(EventType::Normal, "Started", format!("Started container {}", c.name));
        self.waiting.remove(&c.name);
        let target = Target::new(c, &id, pod_ips.first().cloned());
        self.ctx.probes.add_container(&self.uid, c, &id, target.clone());
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let budget = Duration::from_secs(self.spec_grace().max(MIN_GRACE) as u64);
            if let Err(error) = super::probes::run_hook(hook, &target, self.ctx.exec.as_ref(), budget).await {
                let message = super::probes::hook_failure_message(hook, &c.name, &spec::full_name(pod), &error);
                self.event(EventType::Warning, "FailedPostStartHook", message.clone());
                let rc = RuntimeContainer {
                    id: id.clone(),
                    name: c.name.clone(),
                    sandbox_id: sandbox.id.into(),
                    restart_count,
                    hash: String::new(),
                    state: cri::ContainerState::ContainerRunning,
                    status: None,
                    annotations: HashMap::new(),
                };
                self.kill_container(&rc, Some(c), self.spec_grace(), Some(format!("FailedPostStartHook: {message}")))
                    .await;
            }
        }
    }

    /// `EnsureImageExists`: pulls per `imagePullPolicy` (with the pod's `imagePullSecrets`), with
    /// ImagePullBackOff. Returns the image's user (uid or name) when the image is there.
    async fn ensure_image(&mut self, pod: &Pod, c: &Container) -> Option<(Option<i64>, String)> {
        let image = c.image.clone().unwrap_or_default();
        let spec = || Some(cri::ImageSpec { image: image.clone(), ..Default::default() });
        let user = |i: &cri::Image| (i.uid.as_ref().map(|u| u.value), i.username.clone());
        let present =
            match self.ctx.runtime.image_status(cri::ImageStatusRequest { image: spec(), verbose: false }).await {
                Ok(r) => r.image.as_ref().map(user),
                Err(e) => {
                    self.waiting.insert(
                        c.name.clone(),
                        ("ErrImageInspect".into(), format!("Failed to inspect image \"{image}\": {e}")),
                    );
                    self.due_at(Instant::now() + RETRY);
                    return None;
                }
            };
        let policy = c.image_pull_policy.clone().unwrap_or_else(|| {
            let tagged = image.rsplit('/').next().is_some_and(|last| last.contains(':') || last.contains('@'));
            if !tagged || image.ends_with(":latest") { "Always".into() } else { "IfNotPresent".into() }
        });
        match (policy.as_str(), present) {
            ("Never", None) => {
                let message = format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(EventType::Warning, "ErrImageNeverPull", message.clone());
                self.waiting.insert(c.name.clone(), ("ErrImageNeverPull".into(), message));
                // kubelet retries a failed sync after its 10 s back-off: the image may be imported.
                self.due_at(Instant::now() + RETRY);
                return None;
            }
            ("Never" | "IfNotPresent", Some(user)) => {
                self.event(
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                );
                return Some(user);
            }
            _ => {}
        }
        let key = format!("{}/image/{image}", self.uid);
        let blocked = self.ctx.backoff().blocked_since_update(&key, Instant::now());
        if let Some(until) = blocked {
            let message = format!("Back-off pulling image \"{image}\"");
            self.event(EventType::Normal, "BackOff", message.clone());
            self.waiting.insert(c.name.clone(), ("ImagePullBackOff".into(), message));
            self.due_at(until);
            return None;
        }
        self.event(EventType::Normal, "Pulling", format!("Pulling image \"{image}\""));
        let started = Instant::now();
        let auth = self.ctx.pull_auth(pod, &image).await;
        let pull = self.ctx.runtime.pull_image(cri::PullImageRequest { image: spec(), auth, ..Default::default() });
        // A pull can take minutes: a deletion meanwhile abandons it (the runtime finishes or drops it).
        let pulled = tokio::select! {
            r = pull => r,
            () = deleted(self.updates.clone()) => {
                tracing::info!("pod {}: stopped pulling {image}: the pod is being deleted", spec::full_name(pod));
                return None;
            }
        };
        match pulled {
            Ok(_) => {
                let took = format!("{:.3}s", started.elapsed().as_secs_f64());
                self.event(
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {took} ({took} including waiting)"),
                );
                let status =
                    self.ctx.runtime.image_status(cri::ImageStatusRequest { image: spec(), verbose: false }).await;
                Some(status.ok().and_then(|r| r.image).as_ref().map(user).unwrap_or_default())
            }
            Err(e) => {
                self.ctx.backoff().next(&key, Instant::now(), Instant::now());
                let message = match &e {
                    CriError::Runtime { message, .. } | CriError::NotFound { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                self.event(EventType::Warning, "Failed", format!("Failed to pull image \"{image}\": {message}"));
                self.event(EventType::Warning, "Failed", "Error: ErrImagePull".into());
                self.waiting.insert(c.name.clone(), ("ErrImagePull".into(), message));
                self.due_at(Instant::now() + super::backoff::INITIAL);
                None
            }
        }
    }

    /// Stops one container: preStop hook, then SIGTERM, then SIGKILL once `grace` (shared with
    /// the hook) runs out.
    async fn kill_container(&self, c: &RuntimeContainer, spec: Option<&Container>, grace: i64, why: Option<String>) {
        let message = why.unwrap_or_else(|| format!("Stopping container {}", c.name));
        self.event(EventType::Normal, "Killing", message);
        self.ctx.probes.remove_container(&self.uid, &c.name);
        let started = Instant::now();
        let pre_stop: Option<LifecycleHandler> = spec
            .and_then(|s| s.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.clone())
            .or_else(|| c.annotations.get(keys::PRE_STOP).and_then(|j| serde_json::from_str(j).ok()));
        if let Some(hook) = pre_stop.filter(|_| grace > 0) {
            let pod_ip = self.ips.as_ref().and_then(|(_, ips)| ips.first().cloned());
            let target = match spec {
                Some(s) => Target::new(s, &c.id, pod_ip),
                None => Target { pod_ip, container_id: c.id.clone(), ..Default::default() },
            };
            let budget = Duration::from_secs(grace as u64);
            match tokio::time::timeout(budget, super::probes::run_hook(&hook, &target, self.ctx.exec.as_ref(), budget))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(error)) => self.event(
                    EventType::Warning,
                    "FailedPreStopHook",
                    super::probes::hook_failure_message(&hook, &c.name, &spec::full_name(&self.pod), &error),
                ),
                Err(_) => self.event(
                    EventType::Warning,
                    "FailedPreStopHook",
                    format!("PreStopHook failed: the hook did not finish within the grace period of {grace}s"),
                ),
            }
        }
        let left = (grace - started.elapsed().as_secs() as i64).max(MIN_GRACE);
        match self.ctx.runtime.stop_container(&c.id, Duration::from_secs(left as u64)).await {
            Ok(()) | Err(CriError::NotFound { .. }) => {}
            Err(e) => tracing::warn!("pod {}: stopping container {}: {e}", spec::full_name(&self.pod), c.name),
        }
    }

    /// `SyncTerminatingPod`: stops every container (app containers first, then sidecars, in
    /// reverse order) and the sandbox, and publishes the final status.
    async fn terminate(&mut self, grace: i64, publish: bool) -> anyhow::Result<()> {
        let pod = self.pod.clone();
        let spec = pod.spec.clone().unwrap_or_default();
        self.ctx.probes.stop_liveness_and_startup(&self.uid);
        let rt = self.runtime_pod().await?;
        let is_sidecar =
            |name: &str| spec.init_containers.iter().flatten().any(|c| c.name == name && status::is_sidecar(c));
        let find = |name: &str| spec.init_containers.iter().flatten().chain(&spec.containers).find(|c| c.name == name);
        let (sidecars, regular): (Vec<_>, Vec<_>) = rt.running().partition(|c| is_sidecar(&c.name));
        // One grace period for the whole pod: sidecars get what the app containers left.
        let deadline = Instant::now() + Duration::from_secs(grace.max(0) as u64);
        let kill = async {
            futures::future::join_all(regular.iter().map(|c| self.kill_container(c, find(&c.name), grace, None))).await;
            for c in sidecars.iter().rev() {
                let left = deadline.saturating_duration_since(Instant::now()).as_secs() as i64;
                self.kill_container(c, find(&c.name), left, None).await;
            }
        };
        let mut shorter = tokio::select! {
            () = kill => None,
            g = sooner_deadline(self.updates.clone(), deadline) => Some(g),
        };
        // A second delete with a shorter grace period, or a force delete, cuts the wait (kubelet
        // kills again with the shorter period; the first stop calls are abandoned).
        while let Some(g) = shorter.take() {
            tracing::info!("pod {}: stopping with a shorter grace period of {g}s", spec::full_name(&pod));
            let deadline = Instant::now() + Duration::from_secs(g.max(0) as u64);
            let rt = self.runtime_pod().await?;
            let timeout = Duration::from_secs(g.max(MIN_GRACE) as u64);
            let stops =
                futures::future::join_all(rt.running().map(|c| self.ctx.runtime.stop_container(&c.id, timeout)));
            tokio::select! {
                _ = stops => {}
                g = sooner_deadline(self.updates.clone(), deadline) => shorter = Some(g),
            }
        }
        for s in rt.sandboxes.iter().filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32) {
            match self.ctx.runtime.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: s.id.clone() }).await {
                Ok(_) | Err(CriError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.ctx.probes.remove_pod(&self.uid);
        let rt = self.runtime_pod().await?;
        if rt.running().next().is_some() {
            anyhow::bail!("containers are still running after being stopped");
        }
        if self.terminal.is_none() {
            self.terminal = Some((String::new(), String::new()));
        }
        if publish {
            self.publish(&rt).await;
        }
        // SyncTerminatedPod: volumes and the pod cgroup go.
        self.ctx.release(&pod).await;
        Ok(())
    }

    /// The pod is gone from the API: remove its sandboxes (and with them its containers), logs and
    /// directories.
    async fn cleanup(&mut self) {
        if let Ok(rt) = self.runtime_pod().await {
            for s in &rt.sandboxes {
                if let Err(e) = self
                    .ctx
                    .runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() })
                    .await
                {
                    tracing::warn!("pod {}: removing sandbox {}: {e}", spec::full_name(&self.pod), s.id);
                }
            }
        }
        self.ctx.release(&self.pod).await;
        self.ctx.forget(&self.pod);
    }

    /// Container GC of a live pod (kubelet's `evictContainers` and `evictSandboxes`): exited
    /// containers beyond the newest `MAX_DEAD_PER_CONTAINER` of each name go, with their logs (a
    /// running container is never touched); then sandboxes older than the newest that are no longer
    /// ready and hold no container.
    async fn remove_old_containers(&mut self, pod: &Pod, rt: &RuntimePod) {
        let mut dead: HashMap<&str, usize> = HashMap::new();
        let mut removed = HashSet::new();
        for c in rt.containers.iter().filter(|c| c.exited()) {
            let n = dead.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n <= MAX_DEAD_PER_CONTAINER {
                continue;
            }
            match self.ctx.runtime.remove_container(cri::RemoveContainerRequest { container_id: c.id.clone() }).await {
                Ok(_) | Err(CriError::NotFound { .. }) => {
                    let log = self.ctx.log_dir(pod).join(spec::log_path(&c.name, c.restart_count));
                    let _ = std::fs::remove_file(log);
                    self.statuses.remove(&c.id);
                    removed.insert(c.id.as_str());
                }
                Err(e) => tracing::debug!("removing exited container {}: {e}", c.id),
            }
        }
        let ready = cri::PodSandboxState::SandboxReady as i32;
        for s in rt.sandboxes.iter().skip(1).filter(|s| s.state != ready) {
            if rt.containers.iter().any(|c| c.sandbox_id == s.id && !removed.contains(c.id.as_str())) {
                continue;
            }
            let request = cri::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() };
            match self.ctx.runtime.remove_pod_sandbox(request).await {
                Ok(_) | Err(CriError::NotFound { .. }) => {
                    tracing::debug!("pod {}: removed the old sandbox {}", spec::full_name(pod), s.id);
                }
                Err(e) => tracing::debug!("removing the old sandbox {}: {e}", s.id),
            }
        }
    }

    /// Computes the status from `rt` and writes it when it changed. Returns the phase.
    async fn publish(&mut self, rt: &RuntimePod) -> Option<String> {
        let probes: HashMap<String, (Option<bool>, Option<bool>)> = self
            .pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .map(|c| {
                let r = |k| self.ctx.probes.result(&self.uid, &c.name, k);
                (c.name.clone(), (r(Kind::Startup), r(Kind::Readiness)))
            })
            .collect();
        let sandbox_ready = rt.ready_sandbox().is_some();
        let ips = match (&self.ips, rt.ready_sandbox()) {
            (Some((id, ips)), Some(s)) if *id == s.id => ips.clone(),
            (Some((_, ips)), None) => ips.clone(),
            _ => vec![],
        };
        let terminal = self.terminal.as_ref().map(|(r, m)| (r.as_str(), m.as_str()));
        let inputs = status::Inputs {
            waiting: &self.waiting,
            probes: &probes,
            pod_ips: &ips,
            host_ip: self.ctx.host.node_ip.as_deref(),
            sandbox_ready,
            runtime_name: &self.ctx.host.runtime_name,
            terminal,
            evicted: self.evicted.as_ref().map(|e| (e.message.as_str(), e.disruption)),
        };
        // Until the watch brings our last write back, that write is the status to build on.
        let mut base = (*self.pod).clone();
        let seen_rv: u64 = base.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
        if let Some((written, _, rv)) = &self.written
            && *rv > seen_rv
        {
            base.status = Some(written.clone());
        }
        let status = status::generate(&base, rt, &inputs);
        *self.latest.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status.clone());
        let phase = status.phase.clone();
        let value = serde_json::to_value(&status).unwrap_or(Value::Null);
        let current = base.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
        // A static pod's mirror may be made again, empty, after the write: only what it shows counts.
        let written =
            !super::static_pods::is_static(&self.pod) && self.written.as_ref().is_some_and(|(_, v, _)| *v == value);
        if current.as_ref() == Some(&value) || written {
            self.unpublished = false;
            return phase;
        }
        if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) && rt.running().next().is_none() {
            // The scheduler places the next pod as soon as it reads a terminal phase: by then this
            // one must no longer count in the node's admission, nor hold devices.
            self.stopped.store(true, Ordering::Relaxed);
            self.ctx.host.devices.release(&self.uid);
        }
        match self.ctx.api.write_status(&self.pod, value.clone()).await {
            Ok(rv) => {
                self.written = Some((status, value, rv));
                self.unpublished = false;
            }
            Err(e) => {
                tracing::warn!("pod {}: writing status: {e}", spec::full_name(&self.pod));
                self.unpublished = true;
                self.due_at(Instant::now() + RETRY);
            }
        }
        phase
    }
}

/// Resolves with the grace period of a newer deletion request that ends before `deadline`: a
/// second delete with a shorter grace period, or the pod gone from the API (forced: zero).
async fn sooner_deadline(mut updates: watch::Receiver<Update>, deadline: Instant) -> i64 {
    while updates.changed().await.is_ok() {
        let grace = match &*updates.borrow_and_update() {
            Update::Pod(p) => p.metadata.deletion_grace_period_seconds,
            Update::Removed(_) => Some(0),
        };
        if let Some(g) = grace
            && Instant::now() + Duration::from_secs(g.max(0) as u64) < deadline
        {
            return g;
        }
    }
    // The manager is gone (cairn is stopping): nothing shortens the wait any more.
    std::future::pending().await
}

/// Resolves once an update deletes the pod (or the pod is gone).
async fn deleted(mut updates: watch::Receiver<Update>) {
    loop {
        let gone = match &*updates.borrow_and_update() {
            Update::Pod(p) => p.metadata.deletion_timestamp.is_some(),
            Update::Removed(_) => true,
        };
        if gone || updates.changed().await.is_err() {
            return;
        }
    }
}

/// Go's `time.Duration` formatting for whole seconds and minutes (`10s`, `5m0s`).
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 { format!("{}m{}s", s / 60, s % 60) } else { format!("{s}s") }
}

/// The termination message an exited container left in the file mounted at its
/// `terminationMessagePath`.
fn termination_message(status: &cri::ContainerStatus, annotations: &HashMap<String, String>) -> Option<String> {
    let path = annotations.get("io.kubernetes.container.terminationMessagePath")?;
    let mount = status.mounts.iter().find(|m| &m.container_path == path)?;
    let mut buf = Vec::new();
    use std::io::Read as _;
    std::fs::File::open(PathBuf::from(&mount.host_path))
        .ok()?
        .take(MAX_TERMINATION_MESSAGE)
        .read_to_end(&mut buf)
        .ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests;
