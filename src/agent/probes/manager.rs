//! The probe manager (kubelet's prober manager and workers): one task per (pod, container, probe
//! kind) that probes every `periodSeconds` and flips the cached result after `successThreshold` or
//! `failureThreshold` consecutive outcomes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use super::{Exec, MAX_PROBE_RETRIES, Outcome, ProbeResult, Target, run_probe, truncate};

const DEFAULT_PERIOD_SECONDS: i32 = 10;
const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// A probe kind (upstream's `probeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Startup, Kind::Liveness, Kind::Readiness];

    fn index(self) -> usize {
        self as usize
    }

    /// The name upstream puts in messages: `Liveness`, `Readiness`, `Startup`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }

    fn probe(self, container: &Container) -> Option<&Probe> {
        match self {
            Kind::Startup => container.startup_probe.as_ref(),
            Kind::Liveness => container.liveness_probe.as_ref(),
            Kind::Readiness => container.readiness_probe.as_ref(),
        }
    }

    /// The result a new container starts with: not ready, alive, not started.
    fn initial(self) -> Slot {
        match self {
            Kind::Startup => Slot::Unknown,
            Kind::Liveness => Slot::Value(true),
            Kind::Readiness => Slot::Value(false),
        }
    }

    /// The event message of an attempt (reason `Unhealthy`, or `ProbeWarning` for a warning);
    /// `None` for a plain success.
    pub fn event_message(self, outcome: &Outcome) -> Option<String> {
        let name = self.name();
        let output = &outcome.output;
        match outcome.result {
            ProbeResult::Success => None,
            ProbeResult::Warning => Some(format!("{name} probe warning: {output}")),
            ProbeResult::Failure => Some(format!("{name} probe failed: {output}")),
            ProbeResult::Unknown => Some(format!("{name} probe errored and resulted in unknown state: {output}")),
        }
    }

    /// The `Killing` event message when this probe's failure kills the container (reasons
    /// `LivenessProbe` and `StartupProbe`); `None` for readiness, which never kills.
    pub fn kill_message(self, container: &str, restart: bool) -> Option<String> {
        let what = match self {
            Kind::Liveness => "liveness",
            Kind::Startup => "startup",
            Kind::Readiness => return None,
        };
        let suffix = if restart { ", will be restarted" } else { "" };
        Some(format!("Container {container} failed {what} probe{suffix}"))
    }
}

/// Something a probe worker reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeEvent {
    pub uid: String,
    pub container: String,
    pub container_id: String,
    pub kind: Kind,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// An attempt failed or errored: a Warning event, reason `Unhealthy`, with this message.
    Failed { message: String },
    /// An attempt succeeded with a warning: a Warning event, reason `ProbeWarning`.
    Warning { message: String },
    /// The cached result flipped to this value.
    Changed(bool),
}

/// A cached result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// No probe of that kind, or its worker was stopped.
    Absent,
    /// Not known yet (a startup probe that has neither succeeded nor failed).
    Unknown,
    Value(bool),
}

/// What the workers of one container share.
struct Shared {
    slots: Mutex<[Slot; 3]>,
    /// Whether the container has started (no startup probe, or it succeeded); liveness and
    /// readiness wait for it.
    started: watch::Sender<bool>,
}

/// One container's workers.
struct Entry {
    container_id: String,
    shared: Arc<Shared>,
    workers: Vec<(Kind, AbortHandle)>,
}

impl Entry {
    /// Stops the workers of `kinds` and forgets their results.
    fn stop(&self, kinds: &[Kind]) {
        let mut slots = lock(&self.shared.slots);
        for (kind, worker) in &self.workers {
            if kinds.contains(kind) {
                worker.abort();
                slots[kind.index()] = Slot::Absent;
            }
        }
    }
}

struct Inner {
    exec: Arc<dyn Exec>,
    events: mpsc::UnboundedSender<ProbeEvent>,
    /// Pod UID → container name → workers.
    pods: Mutex<HashMap<String, HashMap<String, Entry>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.pods).values().flat_map(HashMap::values) {
            entry.stop(&Kind::ALL);
        }
    }
}

/// Runs the probes of the node's containers and caches their results. Cheap to clone; the workers
/// stop when the last clone is dropped.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

impl ProbeManager {
    pub fn new(exec: Arc<dyn Exec>, events: mpsc::UnboundedSender<ProbeEvent>) -> Self {
        ProbeManager { inner: Arc::new(Inner { exec, events, pods: Mutex::default() }) }
    }

    /// (Re)starts the workers for a running container; a new container_id resets them, the same
    /// one changes nothing. Results start as: readiness false, liveness true, startup unknown
    /// (reported as false); no `Changed` event is sent for these. Must run inside a tokio runtime.
    pub fn add_container(&self, uid: &str, container: &Container, container_id: &str, target: Target) {
        self.add(uid, container, container_id, target, None);
    }

    /// Like [`add_container`](Self::add_container) for a running container the agent adopts after
    /// a restart: it keeps the `started` and `ready` it had until its probes say otherwise (kubelet
    /// does not turn running pods unready because it restarted).
    pub fn adopt_container(
        &self,
        uid: &str,
        container: &Container,
        container_id: &str,
        target: Target,
        was: (bool, bool),
    ) {
        self.add(uid, container, container_id, target, Some(was));
    }

    fn add(&self, uid: &str, container: &Container, container_id: &str, target: Target, was: Option<(bool, bool)>) {
        let mut pods = lock(&self.inner.pods);
        let containers = pods.entry(uid.to_string()).or_default();
        if containers.get(&container.name).is_some_and(|e| e.container_id == container_id) {
            return;
        }
        if let Some(old) = containers.remove(&container.name) {
            old.stop(&Kind::ALL);
        }
        let slots = Kind::ALL.map(|kind| match (kind.probe(container), was, kind) {
            (None, ..) => Slot::Absent,
            (Some(_), Some((started, _)), Kind::Startup) if started => Slot::Value(true),
            (Some(_), Some((_, ready)), Kind::Readiness) => Slot::Value(ready),
            (Some(_), ..) => kind.initial(),
        });
        if slots.iter().all(|s| *s == Slot::Absent) {
            if containers.is_empty() {
                pods.remove(uid);
            }
            return;
        }
        let (started, _) = watch::channel(container.startup_probe.is_none() || was.is_some_and(|(started, _)| started));
        let shared = Arc::new(Shared { slots: Mutex::new(slots), started });
        let workers = Kind::ALL
            .into_iter()
            .filter_map(|kind| {
                let worker = Worker {
                    uid: uid.to_string(),
                    container: container.name.clone(),
                    container_id: container_id.to_string(),
                    kind,
                    probe: kind.probe(container)?.clone(),
                    target: target.clone(),
                    exec: self.inner.exec.clone(),
                    events: self.inner.events.clone(),
                    shared: shared.clone(),
                };
                Some((kind, tokio::spawn(worker.run()).abort_handle()))
            })
            .collect();
        tracing::debug!("probes: started for container {} ({container_id}) of pod {uid}", container.name);
        containers.insert(container.name.clone(), Entry { container_id: container_id.to_string(), shared, workers });
    }

    /// Stops the workers of one container and forgets its results.
    pub fn remove_container(&self, uid: &str, name: &str) {
        let mut pods = lock(&self.inner.pods);
        let Some(containers) = pods.get_mut(uid) else { return };
        if let Some(entry) = containers.remove(name) {
            entry.stop(&Kind::ALL);
        }
        if containers.is_empty() {
            pods.remove(uid);
        }
    }

    /// Stops the workers of every container of a pod.
    pub fn remove_pod(&self, uid: &str) {
        if let Some(containers) = lock(&self.inner.pods).remove(uid) {
            for entry in containers.values() {
                entry.stop(&Kind::ALL);
            }
        }
    }

    /// Current cached result; `None` when the container has no probe of that kind (or it was
    /// stopped). A startup probe that has not yet succeeded reads `Some(false)`.
    pub fn result(&self, uid: &str, name: &str, kind: Kind) -> Option<bool> {
        let pods = lock(&self.inner.pods);
        let entry = pods.get(uid)?.get(name)?;
        match lock(&entry.shared.slots)[kind.index()] {
            Slot::Absent => None,
            Slot::Unknown => Some(false),
            Slot::Value(v) => Some(v),
        }
    }

    /// Stops the liveness and startup workers of a pod that is terminating (upstream's
    /// `StopLivenessAndStartup`); their results read `None` from then on, and readiness, if it
    /// waited for the startup probe, starts.
    pub fn stop_liveness_and_startup(&self, uid: &str) {
        if let Some(containers) = lock(&self.inner.pods).get(uid) {
            for entry in containers.values() {
                entry.stop(&[Kind::Liveness, Kind::Startup]);
                entry.shared.started.send_if_modified(|started| !std::mem::replace(started, true));
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn seconds(value: Option<i32>, default: i32, min: i32) -> Duration {
    Duration::from_secs(value.unwrap_or(default).max(min).unsigned_abs().into())
}

/// Consecutive identical outcomes.
#[derive(Default)]
struct Run {
    last: Option<bool>,
    count: i32,
}

struct Worker {
    uid: String,
    container: String,
    container_id: String,
    kind: Kind,
    probe: Probe,
    target: Target,
    exec: Arc<dyn Exec>,
    events: mpsc::UnboundedSender<ProbeEvent>,
    shared: Arc<Shared>,
}

impl Worker {
    async fn run(self) {
        let mut started = self.shared.started.subscribe();
        tokio::time::sleep(seconds(self.probe.initial_delay_seconds, 0, 0)).await;
        let mut ticker = tokio::time::interval(seconds(self.probe.period_seconds, DEFAULT_PERIOD_SECONDS, 1));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut run = Run::default();
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                // A container that has just started is probed for readiness at once (kubelet's
                // manual trigger).
                Ok(()) = started.changed(), if self.kind == Kind::Readiness => {}
            }
            if self.kind != Kind::Startup && !*started.borrow_and_update() {
                continue;
            }
            if !self.probe_once(&mut run).await {
                break;
            }
        }
        tracing::debug!(
            "probes: {} worker of container {} ({}) of pod {} stopped",
            self.kind.name(),
            self.container,
            self.container_id,
            self.uid
        );
    }

    /// One period's attempt (retried while it errors); `false` once this worker has nothing more
    /// to do for this container: startup succeeded, or liveness or startup failed.
    async fn probe_once(&self, run: &mut Run) -> bool {
        let mut outcome = run_probe(&self.probe, &self.target, &*self.exec).await;
        for _ in 1..MAX_PROBE_RETRIES {
            if outcome.result != ProbeResult::Unknown {
                break;
            }
            outcome = run_probe(&self.probe, &self.target, &*self.exec).await;
        }
        if let Some(message) = self.kind.event_message(&outcome) {
            let message = truncate(message);
            tracing::debug!("probes: container {} of pod {}: {message}", self.container, self.uid);
            let what = match outcome.result {
                ProbeResult::Warning => What::Warning { message },
                _ => What::Failed { message },
            };
            self.emit(&lock(&self.shared.slots), what);
        }
        let success = match outcome.result {
            ProbeResult::Success | ProbeResult::Warning => true,
            ProbeResult::Failure => false,
            // An attempt that errored is thrown away.
            ProbeResult::Unknown => return true,
        };
        if run.last == Some(success) {
            run.count = run.count.saturating_add(1);
        } else {
            *run = Run { last: Some(success), count: 1 };
        }
        let threshold = if success {
            self.probe.success_threshold.unwrap_or(DEFAULT_SUCCESS_THRESHOLD)
        } else {
            self.probe.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD)
        };
        if run.count < threshold {
            return true;
        }
        self.set(success);
        match (self.kind, success) {
            (Kind::Startup, true) => {
                self.shared.started.send_replace(true);
                false
            }
            // The container will be killed: probe no more until it is replaced.
            (Kind::Startup | Kind::Liveness, false) => false,
            _ => true,
        }
    }

    /// Caches `value` and reports it if it flipped; a stopped worker changes nothing.
    fn set(&self, value: bool) {
        let mut slots = lock(&self.shared.slots);
        let slot = slots[self.kind.index()];
        if slot == Slot::Absent || slot == Slot::Value(value) {
            return;
        }
        slots[self.kind.index()] = Slot::Value(value);
        tracing::info!(
            "probes: {} of container {} of pod {} is now {value}",
            self.kind.name(),
            self.container,
            self.uid
        );
        self.emit(&slots, What::Changed(value));
    }

    /// Sends an event unless this worker was stopped (checked under the slots' lock).
    fn emit(&self, slots: &[Slot; 3], what: What) {
        if slots[self.kind.index()] == Slot::Absent {
            return;
        }
        let event = ProbeEvent {
            uid: self.uid.clone(),
            container: self.container.clone(),
            container_id: self.container_id.clone(),
            kind: self.kind,
            what,
        };
        // The receiver is gone only when the agent is shutting down.
        let _ = self.events.send(event);
    }
}
