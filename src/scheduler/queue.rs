//! The scheduling queue: upstream's `PriorityQueue` (`pkg/scheduler/backend/queue/scheduling_queue.go`,
//! `active_queue.go`, `backoff_queue.go`) with queueing hints and `SchedulerPopFromBackoffQ`.
//!
//! Every pod the queue knows waits in exactly one of activeQ, podBackoffQ, podErrorBackoffQ or
//! unschedulablePods, or is in flight (popped, attempt not yet ended). Keys are pod UIDs. All state sits
//! behind one mutex (upstream's `p.lock`, which it takes before the activeQ and backoffQ locks);
//! [`QueueHooks`] run under it and must not call back into the queue.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::scheduler::framework::ClusterEvent;
use crate::scheduler::types::PodInfo;

/// The most cluster events kept for in-flight pods; past it every in-flight pod counts as moved.
const MAX_IN_FLIGHT_EVENTS: usize = 10_000;
/// How often `run_flushes` flushes the backoff queues (upstream `backoffQOrderingWindowDuration`).
const BACKOFF_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How often `run_flushes` flushes unschedulablePods leftovers (upstream's `wait.Until` period).
const LEFTOVER_FLUSH_INTERVAL: Duration = Duration::from_secs(30);

/// Backoff and flush settings (upstream defaults in Default).
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// `podInitialBackoffSeconds`.
    pub initial_backoff: Duration,
    /// `podMaxBackoffSeconds`; zero disables backoff, as upstream.
    pub max_backoff: Duration,
    /// `podMaxInUnschedulablePodsDuration`.
    pub max_unschedulable: Duration,
    /// `SchedulerPopFromBackoffQ` (beta, on in v1.36): pop podBackoffQ's head when activeQ is empty.
    pub pop_from_backoff: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_unschedulable: Duration::from_secs(5 * 60),
            pop_from_backoff: true,
        }
    }
}

/// A pod in the queue with its scheduling history (upstream's `QueuedPodInfo`).
#[derive(Clone, Debug)]
pub struct QueuedPod {
    pub pod: Arc<PodInfo>,
    /// When (re)queued; QueueSort tie-break and the start of backoff.
    pub timestamp: Instant,
    /// First time popped; never changes.
    pub initial_attempt: Option<Instant>,
    pub attempts: u32,
    /// Plugin rejections (drives podBackoffQ).
    pub unschedulable_count: u32,
    /// Scheduler errors in a row (drives podErrorBackoffQ).
    pub consecutive_errors: u32,
    /// Plugins that rejected it last attempt (Unschedulable).
    pub rejected_by: BTreeSet<&'static str>,
    /// Plugins that returned Pending.
    pub pending_by: BTreeSet<&'static str>,
    /// PreEnqueue plugin holding it.
    pub gated_by: Option<&'static str>,
}

impl QueuedPod {
    fn new(pod: Arc<PodInfo>, now: Instant) -> Self {
        QueuedPod {
            pod,
            timestamp: now,
            initial_attempt: None,
            attempts: 0,
            unschedulable_count: 0,
            consecutive_errors: 0,
            rejected_by: BTreeSet::new(),
            pending_by: BTreeSet::new(),
            gated_by: None,
        }
    }
}

/// What the queue asks of the scheduler.
pub trait QueueHooks: Send + Sync {
    /// The pod's profile's PreEnqueue plugins: Err(plugin name) keeps it out of activeQ/backoffQ.
    fn pre_enqueue(&self, pod: &PodInfo) -> Result<(), &'static str>;
    /// QueueingHint: whether `event` may make `qp` schedulable (consulting qp.rejected_by / pending_by / gated_by).
    fn hint(&self, qp: &QueuedPod, event: &ClusterEvent) -> bool;
}

/// How many pods wait where.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub active: usize,
    pub backoff: usize,
    pub error_backoff: usize,
    pub unschedulable: usize,
    pub in_flight: usize,
}

/// upstream's `queueingStrategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// Back to unschedulablePods.
    Skip,
    /// podBackoffQ while backing off, else activeQ.
    AfterBackoff,
    /// activeQ regardless of backoff.
    Immediately,
}

/// One of the waiting areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Active,
    Backoff,
    ErrorBackoff,
    Unschedulable,
}

/// activeQ order, upstream's PrioritySort: higher priority first, then earlier timestamp. `seq` keeps
/// keys unique (and ties in insertion order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ActiveKey {
    priority: Reverse<i32>,
    timestamp: Instant,
    seq: u64,
}

/// Backoff queue order: earlier expiry first, then activeQ order (upstream's
/// `lessBackoffCompletedWithPriority`; podErrorBackoffQ's order only looks at expiry, ties are arbitrary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct BackoffKey {
    expiry: Instant,
    order: ActiveKey,
}

/// Where a waiting pod is, with its key there.
#[derive(Clone, Copy, Debug)]
enum Place {
    Active(ActiveKey),
    Backoff(BackoffKey),
    ErrorBackoff(BackoffKey),
    Unschedulable,
}

impl Place {
    fn target(self) -> Target {
        match self {
            Place::Active(_) => Target::Active,
            Place::Backoff(_) => Target::Backoff,
            Place::ErrorBackoff(_) => Target::ErrorBackoff,
            Place::Unschedulable => Target::Unschedulable,
        }
    }
}

struct Waiting {
    qp: QueuedPod,
    place: Place,
}

/// A popped pod whose attempt has not ended (upstream's `inFlightPods` entry).
struct InFlight {
    /// Sequence number at pop: events with a larger one happened during the attempt.
    start: u64,
    /// The newest PodInfo seen (the popped one unless updated meanwhile).
    latest: Arc<PodInfo>,
    /// Its spec or labels changed while in flight.
    changed: bool,
    /// The event log overflowed while it was in flight.
    moved: bool,
    /// Deleted while in flight: dropped when the attempt ends.
    deleted: bool,
}

struct Inner {
    opts: QueueOptions,
    closed: bool,
    /// Source of key and event sequence numbers.
    seq: u64,
    waiting: HashMap<String, Waiting>,
    active: BTreeMap<ActiveKey, String>,
    backoff: BTreeMap<BackoffKey, String>,
    error_backoff: BTreeMap<BackoffKey, String>,
    unschedulable: BTreeSet<String>,
    in_flight: HashMap<String, InFlight>,
    /// `start` of every in-flight pod, to prune events no in-flight pod needs.
    in_flight_starts: BTreeSet<u64>,
    /// Events received while any pod was in flight (upstream's `inFlightEvents`), by sequence number.
    events: VecDeque<(u64, ClusterEvent)>,
}

/// Backoff after `count` failures: initial·2^(count−1), capped at max; none for 0 or when max is 0
/// (upstream `calculateBackoffDuration` and `getBackoffTime`).
fn backoff_duration(opts: &QueueOptions, count: u32) -> Duration {
    if count == 0 || opts.max_backoff.is_zero() {
        return Duration::ZERO;
    }
    1u32.checked_shl(count - 1)
        .and_then(|factor| opts.initial_backoff.checked_mul(factor))
        .map_or(opts.max_backoff, |d| d.min(opts.max_backoff))
}

/// Whether two versions of a pod are the same as far as scheduling goes (a status-only write is).
fn same_spec(a: &PodInfo, b: &PodInfo) -> bool {
    a == b
}

impl Inner {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// When the pod's backoff ends: the last failure time plus the backoff for its error count, or
    /// for its rejection count when it has no errors (upstream `getBackoffTime`). Upstream also rounds
    /// it down to a 1 s ordering window; cairn does not.
    fn expiry(&self, qp: &QueuedPod) -> Option<Instant> {
        let count = if qp.consecutive_errors > 0 { qp.consecutive_errors } else { qp.unschedulable_count };
        let d = backoff_duration(&self.opts, count);
        if d.is_zero() { None } else { qp.timestamp.checked_add(d) }
    }

    fn backing_off(&self, qp: &QueuedPod, now: Instant) -> bool {
        self.expiry(qp).is_some_and(|e| e > now)
    }

    fn insert(&mut self, qp: QueuedPod, target: Target) {
        let uid = qp.pod.uid.clone();
        let old = self.remove(&uid);
        debug_assert!(old.is_none(), "pod {uid} queued twice");
        let order = ActiveKey { priority: Reverse(qp.pod.priority), timestamp: qp.timestamp, seq: self.next_seq() };
        let backoff_key = || BackoffKey { expiry: self.expiry(&qp).unwrap_or(qp.timestamp), order };
        let place = match target {
            Target::Active => Place::Active(order),
            Target::Backoff => Place::Backoff(backoff_key()),
            Target::ErrorBackoff => Place::ErrorBackoff(backoff_key()),
            Target::Unschedulable => Place::Unschedulable,
        };
        match place {
            Place::Active(k) => self.active.insert(k, uid.clone()),
            Place::Backoff(k) => self.backoff.insert(k, uid.clone()),
            Place::ErrorBackoff(k) => self.error_backoff.insert(k, uid.clone()),
            Place::Unschedulable => {
                self.unschedulable.insert(uid.clone());
                None
            }
        };
        self.waiting.insert(uid, Waiting { qp, place });
    }

    fn remove(&mut self, uid: &str) -> Option<QueuedPod> {
        let w = self.waiting.remove(uid)?;
        match w.place {
            Place::Active(k) => {
                self.active.remove(&k);
            }
            Place::Backoff(k) => {
                self.backoff.remove(&k);
            }
            Place::ErrorBackoff(k) => {
                self.error_backoff.remove(&k);
            }
            Place::Unschedulable => {
                self.unschedulable.remove(uid);
            }
        }
        Some(w.qp)
    }

    /// upstream `requeuePodWithQueueingStrategy` with `moveToActiveQ` / `moveToBackoffQ`: PreEnqueue
    /// runs before the pod enters activeQ or a backoff queue; a failure parks it in unschedulablePods
    /// with `gated_by` set. Returns whether `pop` may now find it.
    fn requeue(&mut self, hooks: &dyn QueueHooks, mut qp: QueuedPod, strategy: Strategy, now: Instant) -> bool {
        if strategy == Strategy::Skip {
            self.insert(qp, Target::Unschedulable);
            return false;
        }
        if let Err(plugin) = hooks.pre_enqueue(&qp.pod) {
            qp.gated_by = Some(plugin);
            self.insert(qp, Target::Unschedulable);
            return false;
        }
        qp.gated_by = None;
        if strategy == Strategy::AfterBackoff && self.backing_off(&qp, now) {
            // upstream `backoffQueue.add`: no rejecting plugin means the attempt failed with an error.
            let errored = qp.rejected_by.is_empty() && qp.pending_by.is_empty();
            self.insert(qp, if errored { Target::ErrorBackoff } else { Target::Backoff });
            return !errored && self.opts.pop_from_backoff;
        }
        self.insert(qp, Target::Active);
        true
    }

    /// The strategy a positive hint earns: Pending plugins skip backoff (upstream `isPodWorthRequeuing`).
    fn hinted_strategy(qp: &QueuedPod) -> Strategy {
        if qp.pending_by.is_empty() { Strategy::AfterBackoff } else { Strategy::Immediately }
    }

    /// upstream `determineSchedulingHintForInFlightPod`: the best hint any event received during the
    /// attempt gives. A pod not in flight gets AfterBackoff, as upstream does when it finds no record.
    fn in_flight_strategy(&self, hooks: &dyn QueueHooks, qp: &QueuedPod) -> Strategy {
        let Some(rec) = self.in_flight.get(&qp.pod.uid) else { return Strategy::AfterBackoff };
        let from = self.events.partition_point(|(seq, _)| *seq < rec.start);
        if self.events.range(from..).any(|(_, e)| hooks.hint(qp, e)) {
            Self::hinted_strategy(qp)
        } else if rec.moved || rec.changed {
            Strategy::AfterBackoff
        } else {
            Strategy::Skip
        }
    }

    /// Common start of both requeues: false when the pod must not come back (queue closed, deleted
    /// while in flight, or already queued); otherwise takes the newest PodInfo seen in flight.
    fn reclaim(&mut self, qp: &mut QueuedPod) -> bool {
        if self.closed {
            return false;
        }
        match self.in_flight.get(&qp.pod.uid) {
            Some(rec) if rec.deleted => {
                let uid = qp.pod.uid.clone();
                self.done(&uid);
                false
            }
            Some(rec) => {
                qp.pod = rec.latest.clone();
                true
            }
            None => !self.waiting.contains_key(&qp.pod.uid),
        }
    }

    /// upstream `activeQueue.done`: forgets the in-flight record and the events only it needed.
    fn done(&mut self, uid: &str) {
        let Some(rec) = self.in_flight.remove(uid) else { return };
        self.in_flight_starts.remove(&rec.start);
        match self.in_flight_starts.first() {
            None => self.events.clear(),
            Some(&oldest) => {
                while self.events.front().is_some_and(|(seq, _)| *seq < oldest) {
                    self.events.pop_front();
                }
            }
        }
    }

    /// upstream `addEventIfAnyInFlight`, bounded: on overflow the log is dropped and every in-flight pod
    /// is treated as if an event had moved it.
    fn record_event(&mut self, event: &ClusterEvent) {
        if self.in_flight.is_empty() {
            return;
        }
        if self.events.len() >= MAX_IN_FLIGHT_EVENTS {
            self.events.clear();
            self.in_flight.values_mut().for_each(|rec| rec.moved = true);
            return;
        }
        let seq = self.next_seq();
        self.events.push_back((seq, event.clone()));
    }

    /// activeQ's head, else (with pop_from_backoff) podBackoffQ's head, marked in flight.
    fn pop_head(&mut self, now: Instant) -> Option<QueuedPod> {
        let uid = match self.active.first_key_value() {
            Some((_, uid)) => uid.clone(),
            None if self.opts.pop_from_backoff => self.backoff.first_key_value()?.1.clone(),
            None => return None,
        };
        let mut qp = self.remove(&uid)?;
        qp.attempts += 1;
        qp.initial_attempt.get_or_insert(now);
        let start = self.next_seq();
        self.in_flight_starts.insert(start);
        let rec = InFlight { start, latest: qp.pod.clone(), changed: false, moved: false, deleted: false };
        self.in_flight.insert(uid, rec);
        Some(qp)
    }
}

/// The scheduling queue (upstream `PriorityQueue`). Send + Sync; share it behind an `Arc`.
pub struct SchedulingQueue {
    hooks: Arc<dyn QueueHooks>,
    inner: Mutex<Inner>,
    /// Wakes `pop` callers (upstream's `cond.Broadcast`).
    ready: Notify,
    /// Becomes true on `close`; stops `run_flushes`.
    closed: watch::Sender<bool>,
}

impl SchedulingQueue {
    pub fn new(hooks: Arc<dyn QueueHooks>, opts: QueueOptions) -> Self {
        let inner = Inner {
            opts,
            closed: false,
            seq: 0,
            waiting: HashMap::new(),
            active: BTreeMap::new(),
            backoff: BTreeMap::new(),
            error_backoff: BTreeMap::new(),
            unschedulable: BTreeSet::new(),
            in_flight: HashMap::new(),
            in_flight_starts: BTreeSet::new(),
            events: VecDeque::new(),
        };
        SchedulingQueue { hooks, inner: Mutex::new(inner), ready: Notify::new(), closed: watch::channel(false).0 }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self, wake: bool) {
        if wake {
            self.ready.notify_waiters();
        }
    }

    /// A new unassigned pod: PreEnqueue → activeQ, or unschedulablePods with gated_by set (upstream
    /// `Add`). A pod already known is handled as `update`.
    pub fn add(&self, pod: Arc<PodInfo>) {
        self.update(pod);
    }

    /// The pod object changed. In activeQ/backoffQ: replace it (re-sort if priority changed). In
    /// unschedulablePods: replace it and, if its spec/labels changed (a status-only write is not), re-run
    /// PreEnqueue; if it passes, move it to activeQ (backoff expired) or backoffQ (upstream `Update`
    /// with `isPodUpdated`). In flight: remember the newest PodInfo, and a spec/label change, for when
    /// the attempt ends (where upstream records a Pod/Update event). Unknown: like `add`.
    pub fn update(&self, pod: Arc<PodInfo>) {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.closed {
            return;
        }
        if let Some(rec) = inner.in_flight.get_mut(&pod.uid) {
            rec.changed |= !same_spec(&rec.latest, &pod);
            rec.latest = pod;
            return;
        }
        let Some(w) = inner.waiting.get_mut(&pod.uid) else {
            let wake = inner.requeue(&*self.hooks, QueuedPod::new(pod, now), Strategy::Immediately, now);
            drop(guard);
            return self.wake(wake);
        };
        let target = w.place.target();
        let moves = target == Target::Unschedulable && !same_spec(&w.qp.pod, &pod);
        if !moves && (target == Target::Unschedulable || w.qp.pod.priority == pod.priority) {
            w.qp.pod = pod;
            return;
        }
        let Some(mut qp) = inner.remove(&pod.uid) else { return };
        qp.pod = pod;
        if moves {
            let wake = inner.requeue(&*self.hooks, qp, Strategy::AfterBackoff, now);
            drop(guard);
            self.wake(wake);
        } else {
            inner.insert(qp, target);
        }
    }

    /// The pod was deleted or bound elsewhere: drop it from wherever it is (in flight: forget it on
    /// `done`/requeue).
    pub fn delete(&self, uid: &str) {
        let mut inner = self.lock();
        match inner.in_flight.get_mut(uid) {
            Some(rec) => rec.deleted = true,
            None => {
                inner.remove(uid);
            }
        }
    }

    /// Waits until a pod is available, or returns None once the queue is closed. Pops activeQ's head
    /// (higher priority first, then earlier timestamp); if activeQ is empty and pop_from_backoff,
    /// podBackoffQ's head early, never podErrorBackoffQ's (upstream `activeQueue.unlockedPop` with
    /// `backoffQPopper`). Marks it in flight, increments attempts, sets initial_attempt once.
    pub async fn pop(&self) -> Option<QueuedPod> {
        loop {
            let mut notified = std::pin::pin!(self.ready.notified());
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                if let Some(qp) = inner.pop_head(Instant::now()) {
                    return Some(qp);
                }
            }
            notified.await;
        }
    }

    /// The attempt ended without requeue (bound, or the pod is gone): forget the in-flight record.
    pub fn done(&self, uid: &str) {
        self.lock().done(uid);
    }

    /// A plugin rejected the pod (upstream `AddUnschedulableIfNotPresent`). Uses the newest PodInfo
    /// seen while in flight; drops it if deleted meanwhile. Sets rejected_by/pending_by (as given),
    /// increments unschedulable_count, resets consecutive_errors, refreshes timestamp. If an event
    /// received while it was in flight gets a positive hint: → activeQ if pending_by is set, else
    /// backoffQ/activeQ by remaining backoff; otherwise → unschedulablePods. With neither rejected_by
    /// nor pending_by set this is an error, as upstream counts it: see `requeue_error`.
    pub fn requeue_unschedulable(&self, mut qp: QueuedPod) {
        if qp.rejected_by.is_empty() && qp.pending_by.is_empty() {
            return self.requeue_error(qp);
        }
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.reclaim(&mut qp) {
            return;
        }
        qp.unschedulable_count += 1;
        qp.consecutive_errors = 0;
        qp.timestamp = now;
        qp.gated_by = None;
        let strategy = inner.in_flight_strategy(&*self.hooks, &qp);
        inner.done(&qp.pod.uid);
        let wake = inner.requeue(&*self.hooks, qp, strategy, now);
        drop(guard);
        self.wake(wake);
    }

    /// A scheduler error (no plugin rejected it): clears rejected_by/pending_by, increments
    /// consecutive_errors, refreshes timestamp → podErrorBackoffQ (activeQ once its backoff is over),
    /// which `pop` never takes early.
    pub fn requeue_error(&self, mut qp: QueuedPod) {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.reclaim(&mut qp) {
            return;
        }
        qp.consecutive_errors += 1;
        qp.timestamp = now;
        qp.rejected_by.clear();
        qp.pending_by.clear();
        qp.gated_by = None;
        inner.done(&qp.pod.uid);
        let wake = inner.requeue(&*self.hooks, qp, Strategy::AfterBackoff, now);
        drop(guard);
        self.wake(wake);
    }

    /// A cluster event (upstream `MoveAllToActiveOrBackoffQueue`): every unschedulable pod with a
    /// positive hint moves (pending_by set → activeQ, else backoffQ or activeQ by remaining backoff,
    /// after PreEnqueue passes). Gated pods are only re-checked by `update` (upstream skips them unless
    /// the gating plugin registered the event; SchedulingGates registers only pod updates). The event
    /// is also recorded for in-flight pods, at most 10,000 of them; past that the log is dropped and
    /// every in-flight pod is treated as moved.
    pub fn on_event(&self, event: &ClusterEvent) {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.closed {
            return;
        }
        let moving: Vec<(String, Strategy)> = inner
            .unschedulable
            .iter()
            .filter_map(|uid| {
                let qp = &inner.waiting.get(uid)?.qp;
                (qp.gated_by.is_none() && self.hooks.hint(qp, event)).then(|| (uid.clone(), Inner::hinted_strategy(qp)))
            })
            .collect();
        let mut wake = false;
        for (uid, strategy) in moving {
            if let Some(qp) = inner.remove(&uid) {
                wake |= inner.requeue(&*self.hooks, qp, strategy, now);
            }
        }
        inner.record_event(event);
        drop(guard);
        self.wake(wake);
    }

    /// Moves pods whose backoff expired from both backoff queues to activeQ (upstream
    /// `flushBackoffQCompleted`). With pop_from_backoff PreEnqueue already ran when they entered the
    /// backoff queue; without, it runs now. Call every second.
    pub fn flush_backoff(&self) {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.closed {
            return;
        }
        let mut expired = Vec::new();
        for queue in [&inner.backoff, &inner.error_backoff] {
            expired.extend(queue.iter().take_while(|(k, _)| k.expiry <= now).map(|(_, uid)| uid.clone()));
        }
        let mut wake = false;
        for uid in expired {
            let Some(qp) = inner.remove(&uid) else { continue };
            if inner.opts.pop_from_backoff {
                inner.insert(qp, Target::Active);
                wake = true;
            } else {
                wake |= inner.requeue(&*self.hooks, qp, Strategy::Immediately, now);
            }
        }
        drop(guard);
        self.wake(wake);
    }

    /// Moves pods that have been unschedulable longer than max_unschedulable to activeQ/backoffQ once
    /// PreEnqueue passes (upstream `flushUnschedulablePodsLeftover`: a wildcard event, which gated
    /// pods' gating plugins do not register). Call every 30 s.
    pub fn flush_unschedulable_leftover(&self) {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if inner.closed {
            return;
        }
        let max = inner.opts.max_unschedulable;
        let leftover: Vec<String> = inner
            .unschedulable
            .iter()
            .filter(|uid| {
                inner
                    .waiting
                    .get(*uid)
                    .is_some_and(|w| w.qp.gated_by.is_none() && now.saturating_duration_since(w.qp.timestamp) > max)
            })
            .cloned()
            .collect();
        let mut wake = false;
        for uid in leftover {
            if let Some(qp) = inner.remove(&uid) {
                wake |= inner.requeue(&*self.hooks, qp, Strategy::AfterBackoff, now);
            }
        }
        drop(guard);
        self.wake(wake);
    }

    /// Runs flush_backoff every 1 s and flush_unschedulable_leftover every 30 s (the first at once,
    /// as upstream's `wait.Until`) until `close`.
    pub async fn run_flushes(&self) {
        let mut closed = self.closed.subscribe();
        let mut backoff = tokio::time::interval_at(Instant::now() + BACKOFF_FLUSH_INTERVAL, BACKOFF_FLUSH_INTERVAL);
        let mut leftover = tokio::time::interval(LEFTOVER_FLUSH_INTERVAL);
        backoff.set_missed_tick_behavior(MissedTickBehavior::Delay);
        leftover.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = closed.wait_for(|c| *c) => return,
                _ = backoff.tick() => self.flush_backoff(),
                _ = leftover.tick() => self.flush_unschedulable_leftover(),
            }
        }
    }

    /// Wakes `pop` callers with None (later calls too, even with pods queued) and stops `run_flushes`;
    /// later adds, updates, requeues and events are ignored. Forgets in-flight records, as upstream.
    pub fn close(&self) {
        {
            let mut inner = self.lock();
            inner.closed = true;
            inner.in_flight.clear();
            inner.in_flight_starts.clear();
            inner.events.clear();
        }
        self.closed.send_replace(true);
        self.ready.notify_waiters();
    }

    /// Counts (active, backoff, error_backoff, unschedulable, in_flight).
    #[cfg(test)]
    pub fn counts(&self) -> QueueCounts {
        let inner = self.lock();
        QueueCounts {
            active: inner.active.len(),
            backoff: inner.backoff.len(),
            error_backoff: inner.error_backoff.len(),
            unschedulable: inner.unschedulable.len(),
            in_flight: inner.in_flight.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::types::NodeInfo;
    use futures::FutureExt;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;
    use tokio::time::{advance, timeout};

    /// PreEnqueue gates pods that have scheduling gates; only NodeAdded gets a positive hint.
    struct Hooks;

    impl QueueHooks for Hooks {
        fn pre_enqueue(&self, pod: &PodInfo) -> Result<(), &'static str> {
            if pod.scheduling_gates.is_empty() { Ok(()) } else { Err("SchedulingGates") }
        }

        fn hint(&self, _qp: &QueuedPod, event: &ClusterEvent) -> bool {
            matches!(event, ClusterEvent::NodeAdded(_))
        }
    }

    fn queue() -> SchedulingQueue {
        SchedulingQueue::new(Arc::new(Hooks), QueueOptions::default())
    }

    fn pod_info(uid: &str, priority: i32) -> PodInfo {
        PodInfo { uid: uid.into(), namespace: "default".into(), name: uid.into(), priority, ..Default::default() }
    }

    fn pod(uid: &str, priority: i32) -> Arc<PodInfo> {
        Arc::new(pod_info(uid, priority))
    }

    fn node_added() -> ClusterEvent {
        ClusterEvent::NodeAdded(Arc::new(NodeInfo::default()))
    }

    fn node_changed() -> ClusterEvent {
        ClusterEvent::NodeChanged(Arc::new(NodeInfo::default()))
    }

    fn rejected(mut qp: QueuedPod, plugin: &'static str) -> QueuedPod {
        qp.rejected_by = [plugin].into();
        qp
    }

    fn place(q: &SchedulingQueue, uid: &str) -> Option<Target> {
        q.lock().waiting.get(uid).map(|w| w.place.target())
    }

    /// Pops without waiting.
    fn try_pop(q: &SchedulingQueue) -> Option<QueuedPod> {
        q.pop().now_or_never().flatten()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn pops_higher_priority_first_then_earlier() {
        let q = queue();
        q.add(pod("b", 5));
        q.add(pod("c", 10));
        advance(ms(5)).await;
        q.add(pod("a", 10));
        let order: Vec<String> = (0..3).filter_map(|_| try_pop(&q)).map(|qp| qp.pod.uid.clone()).collect();
        assert_eq!(order, ["c", "a", "b"]);
        assert_eq!(q.counts(), QueueCounts { in_flight: 3, ..Default::default() });
        assert!(try_pop(&q).is_none());
    }

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let opts = QueueOptions::default();
        let secs: Vec<u64> = (1..=6).map(|n| backoff_duration(&opts, n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff_duration(&opts, 0), Duration::ZERO);
        assert_eq!(backoff_duration(&opts, 40), Duration::from_secs(10));
        let disabled = QueueOptions { max_backoff: Duration::ZERO, ..Default::default() };
        assert_eq!(backoff_duration(&disabled, 3), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn rejected_pod_waits_out_its_backoff() {
        let q = queue();
        q.add(pod("p", 0));
        let first = Instant::now();
        for (round, wait) in [(1, 1000), (2, 2000), (3, 4000)] {
            let qp = try_pop(&q).expect("pod in activeQ");
            assert_eq!((qp.attempts, qp.unschedulable_count), (round, round - 1));
            assert_eq!(qp.initial_attempt, Some(first));
            q.on_event(&node_added());
            q.requeue_unschedulable(rejected(qp, "Fit"));
            assert_eq!(place(&q, "p"), Some(Target::Backoff));
            advance(ms(wait - 1)).await;
            q.flush_backoff();
            assert_eq!(place(&q, "p"), Some(Target::Backoff), "round {round}: still backing off");
            advance(ms(1)).await;
            q.flush_backoff();
            assert_eq!(place(&q, "p"), Some(Target::Active), "round {round}: backoff over");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn error_backoff_is_never_popped_early_but_backoff_is() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = q.pop().await.expect("pod");
        q.requeue_error(qp);
        assert_eq!(q.counts(), QueueCounts { error_backoff: 1, ..Default::default() });
        assert!(timeout(ms(900), q.pop()).await.is_err(), "popped from podErrorBackoffQ early");
        advance(ms(100)).await;
        q.flush_backoff();
        let qp = try_pop(&q).expect("backoff over");
        assert_eq!((qp.consecutive_errors, qp.unschedulable_count), (1, 0));

        q.on_event(&node_added());
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(q.counts(), QueueCounts { backoff: 1, ..Default::default() });
        let qp = try_pop(&q).expect("popped from podBackoffQ early");
        assert_eq!((qp.consecutive_errors, qp.unschedulable_count, qp.attempts), (0, 1, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn without_pop_from_backoff_pop_waits_for_the_flush() {
        let opts = QueueOptions { pop_from_backoff: false, ..Default::default() };
        let q = SchedulingQueue::new(Arc::new(Hooks), opts);
        q.add(pod("p", 0));
        let qp = q.pop().await.expect("pod");
        q.on_event(&node_added());
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(place(&q, "p"), Some(Target::Backoff));
        assert!(timeout(ms(999), q.pop()).await.is_err());
        advance(ms(1)).await;
        q.flush_backoff();
        assert!(try_pop(&q).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn hints_decide_whether_events_move_unschedulable_pods() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(place(&q, "p"), Some(Target::Unschedulable));
        q.on_event(&node_changed());
        assert_eq!(place(&q, "p"), Some(Target::Unschedulable), "negative hint");
        q.on_event(&node_added());
        assert_eq!(place(&q, "p"), Some(Target::Backoff), "positive hint, backoff not over");

        let qp = try_pop(&q).expect("early pop from podBackoffQ");
        q.requeue_unschedulable(rejected(qp, "Fit"));
        advance(Duration::from_secs(2)).await;
        q.on_event(&node_added());
        assert_eq!(place(&q, "p"), Some(Target::Active), "positive hint, backoff over");
    }

    #[tokio::test(start_paused = true)]
    async fn events_during_the_attempt_decide_the_requeue() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        q.on_event(&node_changed());
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(place(&q, "p"), Some(Target::Unschedulable));

        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        q.on_event(&node_added());
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(place(&q, "p"), Some(Target::Backoff));

        let q = queue();
        q.add(pod("p", 0));
        let mut qp = try_pop(&q).expect("pod");
        q.on_event(&node_added());
        qp.pending_by.insert("Claims");
        q.requeue_unschedulable(qp);
        assert_eq!(place(&q, "p"), Some(Target::Active), "hinted Pending plugin skips backoff");
        assert!(q.lock().events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn events_before_the_pop_do_not_count_and_are_pruned() {
        let q = queue();
        q.add(pod("a", 1));
        q.add(pod("b", 0));
        let a = try_pop(&q).expect("a");
        q.on_event(&node_added());
        let b = try_pop(&q).expect("b");
        q.on_event(&node_changed());
        assert_eq!(q.lock().events.len(), 2);
        q.done(&a.pod.uid);
        assert_eq!(q.lock().events.len(), 1, "only b still needs an event");
        q.requeue_unschedulable(rejected(b, "Fit"));
        assert_eq!(place(&q, "b"), Some(Target::Unschedulable), "NodeAdded came before b's attempt");
        assert!(q.lock().events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_event_log_is_bounded() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        for _ in 0..MAX_IN_FLIGHT_EVENTS + 5 {
            q.on_event(&node_changed());
            assert!(q.lock().events.len() <= MAX_IN_FLIGHT_EVENTS);
        }
        q.requeue_unschedulable(rejected(qp, "Fit"));
        assert_eq!(place(&q, "p"), Some(Target::Backoff), "overflow counts as a move");
        assert!(q.lock().events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn gated_pods_wait_for_their_gates() {
        let q = queue();
        let gated = PodInfo { scheduling_gates: vec!["example.com/gate".into()], ..pod_info("g", 0) };
        q.add(Arc::new(gated.clone()));
        assert_eq!(place(&q, "g"), Some(Target::Unschedulable));
        assert_eq!(q.lock().waiting["g"].qp.gated_by, Some("SchedulingGates"));
        q.on_event(&node_added());
        advance(Duration::from_secs(600)).await;
        q.flush_unschedulable_leftover();
        assert_eq!(place(&q, "g"), Some(Target::Unschedulable));

        let mut relabeled = gated.clone();
        relabeled.labels.insert("app".into(), "web".into());
        q.update(Arc::new(relabeled.clone()));
        assert_eq!(place(&q, "g"), Some(Target::Unschedulable), "still gated");
        assert_eq!(q.lock().waiting["g"].qp.pod.labels["app"], "web");

        q.update(Arc::new(PodInfo { scheduling_gates: Vec::new(), ..relabeled }));
        assert_eq!(place(&q, "g"), Some(Target::Active));
        let qp = try_pop(&q).expect("ungated pod");
        assert_eq!((qp.attempts, qp.gated_by), (1, None));
    }

    #[tokio::test(start_paused = true)]
    async fn unchanged_update_leaves_unschedulable_pod_alone() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        q.requeue_unschedulable(rejected(qp, "Fit"));
        q.update(Arc::new(pod_info("p", 0)));
        assert_eq!(place(&q, "p"), Some(Target::Unschedulable));
        q.update(Arc::new(PodInfo { node_selector: [("a".into(), "b".into())].into(), ..pod_info("p", 0) }));
        assert_eq!(place(&q, "p"), Some(Target::Backoff), "spec change, backoff not over");
    }

    #[tokio::test(start_paused = true)]
    async fn leftover_flush_after_max_unschedulable() {
        let q = queue();
        q.add(pod("p", 0));
        let qp = try_pop(&q).expect("pod");
        q.requeue_unschedulable(rejected(qp, "Fit"));
        advance(Duration::from_secs(300)).await;
        q.flush_unschedulable_leftover();
        assert_eq!(place(&q, "p"), Some(Target::Unschedulable));
        advance(Duration::from_secs(1)).await;
        q.flush_unschedulable_leftover();
        assert_eq!(place(&q, "p"), Some(Target::Active));
    }

    #[tokio::test(start_paused = true)]
    async fn update_resorts_and_is_remembered_in_flight() {
        let q = queue();
        q.add(pod("x", 0));
        advance(ms(1)).await;
        q.add(pod("y", 0));
        q.update(pod("y", 5));
        let y = try_pop(&q).expect("y");
        assert_eq!((y.pod.uid.as_str(), y.pod.priority), ("y", 5));

        let mut labeled = pod_info("y", 5);
        labeled.labels.insert("app".into(), "web".into());
        q.update(Arc::new(labeled));
        assert_eq!(q.counts(), QueueCounts { active: 1, in_flight: 1, ..Default::default() });
        q.requeue_unschedulable(rejected(y, "Fit"));
        assert_eq!(place(&q, "y"), Some(Target::Backoff), "changed while in flight");
        assert_eq!(q.lock().waiting["y"].qp.pod.labels["app"], "web");
    }

    #[tokio::test(start_paused = true)]
    async fn delete_removes_pod_from_every_place() {
        let q = queue();
        q.add(pod("b", 0));
        let qp = try_pop(&q).expect("b");
        q.on_event(&node_added());
        q.requeue_unschedulable(rejected(qp, "Fit"));
        q.add(pod("e", 0));
        let qp = try_pop(&q).expect("e");
        q.requeue_error(qp);
        q.add(pod("u", 0));
        let qp = try_pop(&q).expect("u");
        q.requeue_unschedulable(rejected(qp, "Fit"));
        q.add(pod("f", 0));
        let f = try_pop(&q).expect("f");
        q.add(pod("a", 0));
        let all = QueueCounts { active: 1, backoff: 1, error_backoff: 1, unschedulable: 1, in_flight: 1 };
        assert_eq!(q.counts(), all);
        for (uid, target) in
            [("a", Target::Active), ("b", Target::Backoff), ("e", Target::ErrorBackoff), ("u", Target::Unschedulable)]
        {
            assert_eq!(place(&q, uid), Some(target));
            q.delete(uid);
            assert_eq!(place(&q, uid), None);
        }
        q.delete("f");
        assert_eq!(q.counts(), QueueCounts { in_flight: 1, ..Default::default() });
        q.requeue_unschedulable(rejected(f, "Fit"));
        assert_eq!(q.counts(), QueueCounts::default(), "deleted in flight: dropped");

        q.add(pod("g", 0));
        let g = try_pop(&q).expect("g");
        q.delete("g");
        q.done(&g.pod.uid);
        assert_eq!(q.counts(), QueueCounts::default());
    }

    #[tokio::test]
    async fn close_wakes_waiting_pop() {
        let q = Arc::new(queue());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "pop waits on an empty queue");
        q.close();
        assert!(waiter.await.expect("join").is_none());
        q.add(pod("late", 0));
        assert_eq!(q.counts(), QueueCounts::default());
        assert!(q.pop().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn run_flushes_moves_pods_until_closed() {
        let q = Arc::new(queue());
        let flusher = tokio::spawn({
            let q = q.clone();
            async move { q.run_flushes().await }
        });
        q.add(pod("p", 0));
        let qp = q.pop().await.expect("pod");
        q.requeue_error(qp);
        tokio::time::sleep(ms(2500)).await;
        assert_eq!(place(&q, "p"), Some(Target::Active));
        q.close();
        timeout(ms(10), flusher).await.expect("flusher stops").expect("join");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_poppers_get_each_pod_once() {
        let q = Arc::new(queue());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let poppers: Vec<_> = (0..4)
            .map(|_| {
                let (q, tx) = (q.clone(), tx.clone());
                tokio::spawn(async move {
                    while let Some(qp) = q.pop().await {
                        q.done(&qp.pod.uid);
                        tx.send(qp.pod.uid.clone()).expect("receiver alive");
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..2)
            .map(|t| {
                let q = q.clone();
                tokio::spawn(async move {
                    for i in 0..100 {
                        q.add(pod(&format!("{t}-{i}"), i % 7));
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.expect("producer");
        }
        let mut seen = HashSet::new();
        while seen.len() < 200 {
            let uid = timeout(Duration::from_secs(10), rx.recv()).await.expect("no pod lost").expect("open");
            assert!(seen.insert(uid), "popped twice");
        }
        q.close();
        for p in poppers {
            p.await.expect("popper");
        }
        assert_eq!(q.counts(), QueueCounts::default());
    }

    /// The queue's structure is consistent and matches the model: every live pod not held by the
    /// "scheduler" waits in exactly one place with its newest object, every held pod is in flight.
    fn check(q: &SchedulingQueue, alive: &BTreeMap<String, PodInfo>, held: &BTreeMap<String, QueuedPod>) {
        let inner = q.lock();
        let queued = inner.active.len() + inner.backoff.len() + inner.error_backoff.len() + inner.unschedulable.len();
        assert_eq!(inner.waiting.len(), queued);
        for (uid, w) in &inner.waiting {
            let found = match w.place {
                Place::Active(k) => inner.active.get(&k),
                Place::Backoff(k) => inner.backoff.get(&k),
                Place::ErrorBackoff(k) => inner.error_backoff.get(&k),
                Place::Unschedulable => inner.unschedulable.get(uid),
            };
            assert_eq!(found, Some(uid));
            assert_eq!(&w.qp.pod.uid, uid);
            assert!(!inner.in_flight.contains_key(uid) && !held.contains_key(uid), "{uid} waiting and in flight");
            assert_eq!(Some(&*w.qp.pod), alive.get(uid), "{uid}: deleted or stale");
            if w.place.target() != Target::Unschedulable {
                assert!(w.qp.gated_by.is_none() && w.qp.pod.scheduling_gates.is_empty(), "{uid} gated but queued");
            }
        }
        assert_eq!(inner.in_flight.len(), held.len());
        assert_eq!(inner.in_flight_starts.len(), held.len());
        for uid in held.keys() {
            let rec = &inner.in_flight[uid];
            assert_eq!(rec.deleted, !alive.contains_key(uid));
            if let Some(p) = alive.get(uid) {
                assert_eq!(&*rec.latest, p);
            }
        }
        assert_eq!(inner.waiting.len(), alive.keys().filter(|uid| !held.contains_key(*uid)).count(), "pod lost");
        assert!(inner.events.len() <= MAX_IN_FLIGHT_EVENTS);
        assert!(!inner.in_flight.is_empty() || inner.events.is_empty());
    }

    fn pick<V>(rng: &mut StdRng, map: &BTreeMap<String, V>) -> Option<String> {
        (!map.is_empty()).then(|| map.keys().nth(rng.random_range(0..map.len())).cloned()).flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn random_operations_never_lose_or_duplicate_pods() {
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let q = queue();
        let mut alive: BTreeMap<String, PodInfo> = BTreeMap::new();
        let mut held: BTreeMap<String, QueuedPod> = BTreeMap::new();
        let mut next = 0;
        let mut peak = QueueCounts::default();
        for _ in 0..20_000 {
            match rng.random_range(0..15) {
                0 | 1 if alive.len() < 80 => {
                    next += 1;
                    let mut p = pod_info(&format!("p{next}"), rng.random_range(0..3));
                    if rng.random_bool(0.3) {
                        p.scheduling_gates.push("gate".into());
                    }
                    alive.insert(p.uid.clone(), p.clone());
                    q.add(Arc::new(p));
                }
                2 => {
                    let Some(uid) = pick(&mut rng, &alive) else { continue };
                    let p = alive.get_mut(&uid).expect("picked");
                    match rng.random_range(0..4) {
                        0 => p.scheduling_gates.clear(),
                        1 => p.priority = rng.random_range(0..3),
                        2 => {
                            p.labels.insert("n".into(), rng.random_range(0..3).to_string());
                        }
                        // A status-only write: the same facts again.
                        _ => {}
                    }
                    q.update(Arc::new(p.clone()));
                }
                0 | 1 | 3 => {
                    let Some(uid) = pick(&mut rng, &alive) else { continue };
                    alive.remove(&uid);
                    q.delete(&uid);
                }
                4 | 5 => {
                    if let Some(qp) = try_pop(&q) {
                        assert!(qp.attempts >= 1 && qp.initial_attempt.is_some());
                        assert!(held.insert(qp.pod.uid.clone(), qp).is_none(), "popped twice");
                    }
                }
                6 | 7 => {
                    let Some(uid) = pick(&mut rng, &held) else { continue };
                    let mut qp = held.remove(&uid).expect("picked");
                    match rng.random_range(0..6) {
                        0 => {}
                        1 => {
                            qp.pending_by.insert("Claims");
                        }
                        _ => {
                            qp.rejected_by.insert("Fit");
                        }
                    }
                    q.requeue_unschedulable(qp);
                }
                8 => {
                    let Some(uid) = pick(&mut rng, &held) else { continue };
                    q.requeue_error(held.remove(&uid).expect("picked"));
                }
                9 => {
                    let Some(uid) = pick(&mut rng, &held) else { continue };
                    held.remove(&uid);
                    alive.remove(&uid);
                    q.done(&uid);
                }
                10 => q.on_event(&if rng.random_bool(0.5) { node_added() } else { node_changed() }),
                11 => q.flush_backoff(),
                12 => q.flush_unschedulable_leftover(),
                13 => {
                    // A repeated add (informer resync) is an update.
                    let Some(uid) = pick(&mut rng, &alive) else { continue };
                    q.add(Arc::new(alive[&uid].clone()));
                }
                _ => advance(ms(rng.random_range(0..4000))).await,
            }
            check(&q, &alive, &held);
            let c = q.counts();
            let m = &mut peak;
            (m.active, m.backoff, m.error_backoff) =
                (m.active.max(c.active), m.backoff.max(c.backoff), m.error_backoff.max(c.error_backoff));
            (m.unschedulable, m.in_flight) = (m.unschedulable.max(c.unschedulable), m.in_flight.max(c.in_flight));
        }
        let exercised = [peak.active, peak.backoff, peak.error_backoff, peak.unschedulable, peak.in_flight];
        assert!(exercised.iter().all(|n| *n >= 3), "every area used: {peak:?}");

        // Liveness: once gates are gone and time passes, every live pod pops.
        for (_, qp) in std::mem::take(&mut held) {
            q.requeue_unschedulable(rejected(qp, "Fit"));
        }
        for p in alive.values_mut() {
            p.scheduling_gates.clear();
            q.update(Arc::new(p.clone()));
        }
        advance(Duration::from_secs(301)).await;
        q.flush_unschedulable_leftover();
        advance(Duration::from_secs(11)).await;
        q.flush_backoff();
        let mut popped = BTreeSet::new();
        while let Some(qp) = try_pop(&q) {
            q.done(&qp.pod.uid);
            assert!(popped.insert(qp.pod.uid.clone()));
        }
        assert_eq!(popped, alive.keys().cloned().collect());
        assert_eq!(q.counts(), QueueCounts::default());
    }
}
