//! The Scheduling Framework: statuses, per-cycle state, the plugin trait with one method per
//! extension point, and a profile (an ordered, weighted set of plugins) that runs them.

use std::any::Any;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rayon::prelude::*;

use super::types::{NodeInfo, PodInfo};

/// Highest score a Score plugin may give after normalization.
pub const MAX_NODE_SCORE: i64 = 100;
/// From this many nodes on, per-node plugin calls run in parallel (when the profile has a pool).
pub const PARALLEL_FROM: usize = 256;
/// Longest a Permit plugin may make a pod wait.
pub const MAX_PERMIT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The outcome class of a plugin call (upstream's `framework.Code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Success,
    /// An internal failure; the attempt ends and the pod takes error backoff.
    Error,
    /// The pod does not fit now; a cluster change or preemption may help.
    Unschedulable,
    /// The pod does not fit and preemption cannot help.
    UnschedulableAndUnresolvable,
    /// Permit: hold the pod until allowed or timed out.
    Wait,
    /// PreFilter/PreScore: this plugin has nothing to do for the pod.
    Skip,
}

/// A plugin's verdict: a code, human-readable reasons and the plugin that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// Mostly fixed texts, borrowed: statuses are made for every rejected node of every attempt.
    pub reasons: Vec<Cow<'static, str>>,
    pub plugin: &'static str,
}

impl Status {
    pub fn new(code: Code, reason: impl Into<Cow<'static, str>>) -> Self {
        Status { code, reasons: vec![reason.into()], plugin: "" }
    }

    pub fn success() -> Self {
        Status { code: Code::Success, reasons: Vec::new(), plugin: "" }
    }

    pub fn skip() -> Self {
        Status { code: Code::Skip, reasons: Vec::new(), plugin: "" }
    }

    pub fn unschedulable(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::Unschedulable, reason)
    }

    pub fn unresolvable(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::UnschedulableAndUnresolvable, reason)
    }

    pub fn error(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::Error, message)
    }

    pub fn with_plugin(mut self, plugin: &'static str) -> Self {
        self.plugin = plugin;
        self
    }

    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    /// Unschedulable or UnschedulableAndUnresolvable.
    pub fn is_rejected(&self) -> bool {
        matches!(self.code, Code::Unschedulable | Code::UnschedulableAndUnresolvable)
    }

    /// The reasons joined as upstream's `Status.Message()`.
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message())
    }
}

/// Data plugins share within one scheduling attempt; created fresh for every attempt.
#[derive(Default)]
pub struct CycleState {
    data: HashMap<&'static str, Box<dyn Any + Send + Sync>>,
    /// Plugins whose PreFilter returned Skip: their Filter is not run.
    pub skip_filter: BTreeSet<&'static str>,
    /// Plugins whose PreScore returned Skip: their Score is not run.
    pub skip_score: BTreeSet<&'static str>,
}

impl CycleState {
    pub fn write<T: Any + Send + Sync>(&mut self, key: &'static str, value: T) {
        self.data.insert(key, Box::new(value));
    }

    pub fn read<T: Any>(&self, key: &'static str) -> Option<&T> {
        self.data.get(key).and_then(|v| v.downcast_ref())
    }
}

/// A node's score from one plugin, or the weighted total.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeScore<'a> {
    pub name: &'a str,
    pub score: i64,
}

/// The extension points of the framework.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    PreEnqueue,
    QueueSort,
    PreFilter,
    Filter,
    PostFilter,
    PreScore,
    Score,
    Reserve,
    Permit,
    PreBind,
    Bind,
    PostBind,
}

impl Point {
    /// The field name in `KubeSchedulerConfiguration.profiles[].plugins`.
    pub fn config_name(self) -> &'static str {
        match self {
            Point::PreEnqueue => "preEnqueue",
            Point::QueueSort => "queueSort",
            Point::PreFilter => "preFilter",
            Point::Filter => "filter",
            Point::PostFilter => "postFilter",
            Point::PreScore => "preScore",
            Point::Score => "score",
            Point::Reserve => "reserve",
            Point::Permit => "permit",
            Point::PreBind => "preBind",
            Point::Bind => "bind",
            Point::PostBind => "postBind",
        }
    }

    pub const ALL: [Point; 12] = [
        Point::PreEnqueue,
        Point::QueueSort,
        Point::PreFilter,
        Point::Filter,
        Point::PostFilter,
        Point::PreScore,
        Point::Score,
        Point::Reserve,
        Point::Permit,
        Point::PreBind,
        Point::Bind,
        Point::PostBind,
    ];
}

/// A change in the cluster that may make an unschedulable pod schedulable.
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    /// A node was added; its current state.
    NodeAdded(Arc<NodeInfo>),
    /// A node's labels, taints, allocatable, images or schedulability changed; its new state.
    NodeChanged(Arc<NodeInfo>),
    /// A node was deleted (topology domains may have shrunk).
    NodeRemoved(Arc<NodeInfo>),
    /// A pod bound to a node was added or changed (labels, placement).
    AssignedPodAdded { pod: Arc<PodInfo> },
    /// A pod bound to a node left it (deleted, finished or forgotten); the node as it is now.
    AssignedPodRemoved { pod: Arc<PodInfo>, node: Arc<NodeInfo> },
    /// A PersistentVolumeClaim, PersistentVolume, StorageClass, CSINode or VolumeAttachment changed.
    StorageChanged,
}

/// The node set a PreFilter plugin narrows the search to; `None` means all nodes.
pub type PreFilterResult = Option<BTreeSet<String>>;

/// Pods nominated to each node (by an earlier preemption) that a pod's Filter must leave room for:
/// those of at least its priority, itself excluded.
pub type Nominated = HashMap<String, Vec<Arc<PodInfo>>>;

/// What PostFilter plugins see of the failed attempt.
pub struct PostFilterInput<'a> {
    /// The profile, to filter again on changed copies of nodes.
    pub profile: &'a Profile,
    pub nodes: &'a [Arc<NodeInfo>],
    /// The nodes the Filters found `Unschedulable` (not `UnschedulableAndUnresolvable`): only these
    /// may take the pod once others leave.
    pub helpful: Vec<Arc<NodeInfo>>,
    /// Whether the pod's nominated node was rejected as unresolvable.
    pub nominated_node_unresolvable: bool,
    pub nominated: &'a Nominated,
}

/// A node made free for a pod (upstream's `NominatingInfo` with the candidate's victims).
#[derive(Clone, Debug, PartialEq)]
pub struct Nomination {
    /// The node; empty clears an earlier nomination.
    pub node: String,
    /// The pods to delete so that the pod fits there, most important first.
    pub victims: Vec<Arc<PodInfo>>,
}

/// A PostFilter answer: a status, and with Success the nomination.
pub type PostFilterResult = (Status, Option<Nomination>);

/// A scheduling plugin. Each method is one extension point; a plugin implements those named by
/// [`Plugin::points`] and inherits no-op defaults for the rest.
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// The extension points this plugin implements (what `multiPoint` expands to).
    fn points(&self) -> &'static [Point];

    /// Whether the pod may enter the active queue at all.
    fn pre_enqueue(&self, _pod: &PodInfo) -> Status {
        Status::success()
    }

    /// Once per attempt, before any node is filtered.
    fn pre_filter(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
    ) -> (Status, PreFilterResult) {
        (Status::success(), None)
    }

    /// Whether the pod fits `node`. Called for many nodes in parallel.
    fn filter(&self, _state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> Status {
        Status::success()
    }

    /// After every node rejected the pod: whether some change (a preemption) can make room, and
    /// where. Only Success carries a nomination.
    fn post_filter(&self, _state: &CycleState, _pod: &PodInfo, _input: &PostFilterInput<'_>) -> PostFilterResult {
        (Status::unschedulable(""), None)
    }

    /// Once per attempt with more than one feasible node, before scoring: `nodes` are the feasible
    /// nodes, `all_nodes` the whole snapshot.
    fn pre_score(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _nodes: &[Arc<NodeInfo>],
        _all_nodes: &[Arc<NodeInfo>],
    ) -> Status {
        Status::success()
    }

    /// The raw score of a feasible node.
    fn score(&self, _state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> Result<i64, Status> {
        Ok(0)
    }

    /// Rescales all raw scores (into 0..=100) once they are known.
    fn normalize_score(&self, _state: &CycleState, _pod: &PodInfo, _scores: &mut [NodeScore<'_>]) -> Status {
        Status::success()
    }

    fn reserve(&self, _state: &mut CycleState, _pod: &PodInfo, _node: &str) -> Status {
        Status::success()
    }

    /// Undoes `reserve`; must tolerate running when `reserve` never did.
    fn unreserve(&self, _state: &mut CycleState, _pod: &PodInfo, _node: &str) {}

    /// Success, Wait (with a timeout, capped at 15 minutes) or a rejection.
    fn permit(&self, _state: &mut CycleState, _pod: &PodInfo, _node: &str) -> (Status, Duration) {
        (Status::success(), Duration::ZERO)
    }

    /// Before binding, in the binding cycle: may wait (volumes being provisioned).
    fn pre_bind<'a>(&'a self, _state: &'a CycleState, _pod: &'a PodInfo, _node: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async { Status::success() })
    }

    /// Binds the pod; Skip passes to the next Bind plugin.
    fn bind<'a>(&'a self, _pod: &'a PodInfo, _node: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async { Status::skip() })
    }

    fn post_bind(&self, _pod: &PodInfo, _node: &str) {}

    /// QueueingHint: whether `event` may make `pod`, which this plugin rejected, schedulable.
    /// The default, true, requeues on every event.
    fn requeue(&self, _pod: &PodInfo, _event: &ClusterEvent) -> bool {
        true
    }
}

/// One enabled plugin at one extension point with its weight (Score only).
#[derive(Clone)]
pub struct Enabled {
    pub plugin: Arc<dyn Plugin>,
    pub weight: i64,
}

/// A scheduling profile: a `schedulerName` and the plugins it runs at each extension point.
pub struct Profile {
    pub name: String,
    pub points: HashMap<Point, Vec<Enabled>>,
    /// `percentageOfNodesToScore`; 0 means adaptive.
    pub percentage_of_nodes_to_score: u32,
    /// Threads that filter and score nodes in parallel; `None` runs them on the scheduling thread.
    pub pool: Option<Arc<rayon::ThreadPool>>,
}

impl Profile {
    fn at(&self, point: Point) -> &[Enabled] {
        self.points.get(&point).map(Vec::as_slice).unwrap_or_default()
    }

    /// The plugins enabled at `point`, in order.
    pub fn plugins(&self, point: Point) -> impl Iterator<Item = &Arc<dyn Plugin>> {
        self.at(point).iter().map(|e| &e.plugin)
    }

    /// The plugin of this name enabled at any point.
    pub fn plugin(&self, name: &str) -> Option<&Arc<dyn Plugin>> {
        self.points.values().flatten().map(|e| &e.plugin).find(|p| p.name() == name)
    }

    /// PreEnqueue: the first plugin that does not admit the pod, with its status.
    pub fn run_pre_enqueue(&self, pod: &PodInfo) -> Status {
        for p in self.plugins(Point::PreEnqueue) {
            let s = p.pre_enqueue(pod);
            if !s.is_success() {
                return s.with_plugin(p.name());
            }
        }
        Status::success()
    }

    /// PreFilter: runs every plugin; the intersection of the node sets they return, and the plugins
    /// that returned one.
    pub fn run_pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
    ) -> (Status, PreFilterResult, Vec<&'static str>) {
        let mut result: PreFilterResult = None;
        let mut narrowed_by = Vec::new();
        for p in self.plugins(Point::PreFilter) {
            let (s, r) = p.pre_filter(state, pod, nodes);
            match s.code {
                Code::Success => {}
                Code::Skip => {
                    state.skip_filter.insert(p.name());
                    continue;
                }
                Code::Error => {
                    let msg = format!("running PreFilter plugin {:?}: {}", p.name(), s.message());
                    return (Status::error(msg), None, narrowed_by);
                }
                _ => return (s.with_plugin(p.name()), None, narrowed_by),
            }
            if let Some(set) = r {
                narrowed_by.push(p.name());
                let set = match result {
                    None => set,
                    Some(prev) => prev.intersection(&set).cloned().collect(),
                };
                if set.is_empty() {
                    let msg = format!("node(s) didn't satisfy plugin(s) [{}] simultaneously", narrowed_by.join(" "));
                    return (Status::unresolvable(msg).with_plugin(p.name()), None, narrowed_by);
                }
                result = Some(set);
            }
        }
        (Status::success(), result, narrowed_by)
    }

    /// The Filter plugins that run this attempt (those whose PreFilter did not skip).
    pub fn active_filters(&self, state: &CycleState) -> Vec<&Arc<dyn Plugin>> {
        self.plugins(Point::Filter).filter(|p| !state.skip_filter.contains(p.name())).collect()
    }

    /// Filter: the first of `filters` (see [`Profile::active_filters`]) that rejects the pod on `node`.
    pub fn run_filter(filters: &[&Arc<dyn Plugin>], state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        for p in filters {
            let s = p.filter(state, pod, node);
            if !s.is_success() {
                if s.code == Code::Error {
                    return Status::error(format!("running {:?} filter plugin: {}", p.name(), s.message()))
                        .with_plugin(p.name());
                }
                return s.with_plugin(p.name());
            }
        }
        Status::success()
    }

    /// Filter on `node` with the pods nominated to it counted as if placed (upstream's
    /// `RunFilterPluginsWithNominatedPods`): the pod must fit both with and without them. Plugins'
    /// PreFilter state is not told about the nominated pods.
    pub fn run_filter_with_nominated(
        filters: &[&Arc<dyn Plugin>],
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        nominated: &Nominated,
    ) -> Status {
        // Mostly there are none: skip hashing the node's name then.
        let pods = if nominated.is_empty() { None } else { nominated.get(node.name()) };
        if let Some(pods) = pods.filter(|p| !p.is_empty()) {
            let mut with = node.clone();
            for p in pods {
                with.add_pod(Arc::new(p.on_node(node.name())));
            }
            let s = Self::run_filter(filters, state, pod, &with);
            if !s.is_success() {
                return s;
            }
        }
        Self::run_filter(filters, state, pod, node)
    }

    /// PostFilter: the first plugin that succeeds (or finds the pod unresolvable) decides; otherwise
    /// the pod stays unschedulable with every plugin's reasons.
    pub fn run_post_filter(&self, state: &CycleState, pod: &PodInfo, input: &PostFilterInput<'_>) -> PostFilterResult {
        let mut rejected = Status { code: Code::Unschedulable, reasons: Vec::new(), plugin: "" };
        let mut nomination = None;
        for p in self.plugins(Point::PostFilter) {
            let (s, n) = p.post_filter(state, pod, input);
            match s.code {
                Code::Success | Code::UnschedulableAndUnresolvable => return (s.with_plugin(p.name()), n),
                Code::Unschedulable => {
                    if rejected.plugin.is_empty() {
                        rejected.plugin = p.name();
                    }
                    rejected.reasons.extend(s.reasons.into_iter().filter(|r| !r.is_empty()));
                    nomination = n.or(nomination);
                }
                _ => {
                    let msg = format!("running PostFilter plugin {:?}: {}", p.name(), s.message());
                    return (Status::error(msg).with_plugin(p.name()), None);
                }
            }
        }
        (rejected, nomination)
    }

    pub fn run_pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[Arc<NodeInfo>],
        all_nodes: &[Arc<NodeInfo>],
    ) -> Status {
        for p in self.plugins(Point::PreScore) {
            let s = p.pre_score(state, pod, nodes, all_nodes);
            match s.code {
                Code::Success => {}
                Code::Skip => {
                    state.skip_score.insert(p.name());
                }
                _ => return Status::error(format!("running PreScore plugin {:?}: {}", p.name(), s.message())),
            }
        }
        Status::success()
    }

    /// Score + NormalizeScore + weights: the weighted total per node, in `nodes` order. Fails when a
    /// plugin errs or a normalized score is outside 0..=100. Nodes are scored in parallel.
    pub fn run_score(&self, state: &CycleState, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> Result<Vec<i64>, Status> {
        let active: Vec<&Enabled> =
            self.at(Point::Score).iter().filter(|e| !state.skip_score.contains(e.plugin.name())).collect();
        let k = active.len().max(1);
        // raw[node * k + plugin]
        let mut raw = vec![0i64; nodes.len() * k];
        let score_node = |(n, out): (&Arc<NodeInfo>, &mut [i64])| -> Result<(), Status> {
            for (e, slot) in active.iter().zip(out) {
                *slot = e.plugin.score(state, pod, n).map_err(|s| {
                    let name = e.plugin.name();
                    Status::error(format!("running Score plugin {name:?} on node {:?}: {}", n.name(), s.message()))
                })?;
            }
            Ok(())
        };
        if let Some(pool) = self.pool.as_ref().filter(|_| nodes.len() >= PARALLEL_FROM) {
            pool.install(|| nodes.par_iter().zip(raw.par_chunks_mut(k)).try_for_each(score_node))?;
        } else {
            nodes.iter().zip(raw.chunks_mut(k)).try_for_each(score_node)?;
        }
        let mut totals = vec![0i64; nodes.len()];
        for (i, e) in active.iter().enumerate() {
            let p = &e.plugin;
            let mut scores: Vec<NodeScore> =
                nodes.iter().zip(raw.chunks(k)).map(|(n, r)| NodeScore { name: n.name(), score: r[i] }).collect();
            let s = p.normalize_score(state, pod, &mut scores);
            if !s.is_success() {
                return Err(Status::error(format!("running Normalize plugin {:?}: {}", p.name(), s.message())));
            }
            for (total, ns) in totals.iter_mut().zip(&scores) {
                if !(0..=MAX_NODE_SCORE).contains(&ns.score) {
                    return Err(Status::error(format!(
                        "plugin {:?} returns an invalid score {}, it should in the range of [0, {MAX_NODE_SCORE}] after normalizing",
                        p.name(),
                        ns.score
                    )));
                }
                *total += ns.score * e.weight;
            }
        }
        Ok(totals)
    }

    /// Reserve in order; on the first failure every plugin is unreserved in reverse order.
    pub fn run_reserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> Status {
        for p in self.plugins(Point::Reserve) {
            let s = p.reserve(state, pod, node);
            if !s.is_success() {
                self.run_unreserve(state, pod, node);
                return s.with_plugin(p.name());
            }
        }
        Status::success()
    }

    /// Unreserve, in reverse order of Reserve.
    pub fn run_unreserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) {
        let plugins: Vec<_> = self.plugins(Point::Reserve).collect();
        for p in plugins.into_iter().rev() {
            p.unreserve(state, pod, node);
        }
    }

    /// Permit: Success, or Wait with the shortest plugin timeout (each capped at 15 minutes), or
    /// the first rejection.
    pub fn run_permit(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> (Status, Duration) {
        let mut wait: Option<(Duration, &'static str)> = None;
        for p in self.plugins(Point::Permit) {
            let (s, timeout) = p.permit(state, pod, node);
            match s.code {
                Code::Success => {}
                Code::Wait => {
                    let t = timeout.min(MAX_PERMIT_TIMEOUT);
                    if wait.is_none_or(|(w, _)| t < w) {
                        wait = Some((t, p.name()));
                    }
                }
                _ => return (s.with_plugin(p.name()), Duration::ZERO),
            }
        }
        match wait {
            Some((t, plugin)) => (Status::new(Code::Wait, "waiting on permit").with_plugin(plugin), t),
            None => (Status::success(), Duration::ZERO),
        }
    }

    /// Bind: the first plugin that does not Skip decides.
    pub async fn run_pre_bind(&self, state: &CycleState, pod: &PodInfo, node: &str) -> Status {
        for p in self.plugins(Point::PreBind) {
            let s = p.pre_bind(state, pod, node).await;
            if !s.is_success() {
                return s.with_plugin(p.name());
            }
        }
        Status::success()
    }

    pub async fn run_bind(&self, pod: &PodInfo, node: &str) -> Status {
        for p in self.plugins(Point::Bind) {
            let s = p.bind(pod, node).await;
            if s.code != Code::Skip {
                return s.with_plugin(p.name());
            }
        }
        Status::error("no bind plugin bound the pod")
    }

    pub fn run_post_bind(&self, pod: &PodInfo, node: &str) {
        for p in self.plugins(Point::PostBind) {
            p.post_bind(pod, node);
        }
    }

    /// Whether any plugin in `rejected_by` (names) says `event` may help `pod`.
    pub fn requeue(&self, pod: &PodInfo, rejected_by: &BTreeSet<&'static str>, event: &ClusterEvent) -> bool {
        rejected_by.iter().any(|name| self.plugin(name).is_none_or(|p| p.requeue(pod, event)))
    }
}

/// upstream's `DefaultNormalizeScore`: scales to `max` = 100 and optionally reverses.
pub fn default_normalize(scores: &mut [NodeScore], reverse: bool) {
    let max = scores.iter().map(|s| s.score).max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| s.score = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores {
        s.score = MAX_NODE_SCORE * s.score / max;
        if reverse {
            s.score = MAX_NODE_SCORE - s.score;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(v: &[i64]) -> Vec<NodeScore<'static>> {
        v.iter().map(|s| NodeScore { name: "n", score: *s }).collect()
    }

    #[test]
    fn default_normalize_scales_and_reverses() {
        let mut s = scores(&[2, 6, 10]);
        default_normalize(&mut s, false);
        assert_eq!(s.iter().map(|s| s.score).collect::<Vec<_>>(), [20, 60, 100]);
        let mut s = scores(&[2, 6, 10]);
        default_normalize(&mut s, true);
        assert_eq!(s.iter().map(|s| s.score).collect::<Vec<_>>(), [80, 40, 0]);
        let mut s = scores(&[0, 0]);
        default_normalize(&mut s, true);
        assert_eq!(s.iter().map(|s| s.score).collect::<Vec<_>>(), [100, 100]);
    }
}
