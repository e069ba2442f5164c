//! Jobs run pods to completion (upstream's job controller, `pkg/controller/job`): up to
//! `parallelism` pods at a time until `completions` succeed (NonIndexed), or one success per index
//! `0..completions` (Indexed: `JOB_COMPLETION_INDEX`, hostname `<job>-<index>`); failed pods are
//! replaced after an exponential backoff (10 s doubling, at most 10 minutes) until `backoffLimit`;
//! `activeDeadlineSeconds`, `suspend`, `podFailurePolicy` (a failed pod fails the Job, is ignored
//! or counts; see [`failure_policy`]) and `podReplacementPolicy` as upstream; the
//! SuccessCriteriaMet/Complete and FailureTarget/Failed conditions. Every pod carries the `batch.kubernetes.io/job-tracking`
//! finalizer: a finished pod is first recorded in `status.uncountedTerminatedPods`, then its
//! finalizer removed, then counted, so a restart neither loses nor double-counts a completion.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::join_all;
use k8s_openapi::api::batch::v1::{
    Job, JobCondition, JobStatus, PodFailurePolicy, SuccessPolicy, UncountedTerminatedPods,
};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::failure_policy::Verdict;
use super::expectations::Expectations;
use super::informer::{Cache, Informer, synced};
use super::ownership::{Claim, controller_of, controller_ref};
use super::pods::is_ready;
use super::runtime::{self, Error, Reconciler};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::labels::selector_matches;

mod failure_policy;

/// The finalizer that keeps a finished pod until its Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
const INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The failures of its index before a pod (with `backoffLimitPerIndex`).
const INDEX_FAILURES: &str = "batch.kubernetes.io/job-index-failure-count";
/// Upstream's `DefaultJobPodFailureBackOff` and `MaxJobPodFailureBackOff`.
const FAILURE_BACKOFF: Duration = Duration::from_secs(10);
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(600);
/// Upstream's `MaxUncountedPods`: finished pods recorded per status write.
const MAX_UNCOUNTED: usize = 500;
const BURST: usize = 500;

pub struct Jobs {
    client: Client,
    pods: Cache<Pod>,
    expectations: Expectations,
    memory: Arc<Memory>,
    recorder: Recorder,
}

/// What the controller remembers of each Job (keyed `namespace/name`) between syncs; forgotten
/// when the Job is deleted.
#[derive(Default)]
struct Memory {
    /// Per Job: failures since the last success and when the last one finished (upstream's
    /// backoff records), for the delay before a replacement.
    backoff: Mutex<HashMap<String, (u32, Timestamp)>>,
    /// Per Job: the resourceVersion of its last status write. A cached Job older than that is
    /// not synced (its counts would be stale); the watch brings the newer one.
    written: Mutex<HashMap<String, u64>>,
    /// Per Job: pods already counted whose finalizer removal the pod cache has not shown yet
    /// (upstream's finalizer expectations); they are never counted twice.
    unfinalized: Mutex<HashMap<String, HashSet<String>>>,
}

impl Memory {
    fn forget(&self, key: &str) {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        self.written.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        self.unfinalized.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// Starts the controller on the shared pod watch, and the sweeper that lets go of the pods of
/// Jobs that are gone.
pub fn spawn(client: &Client, jobs: &mut Informer<Job>, pods: &mut Informer<Pod>, shutdown: &CancellationToken) {
    let controller = Controller::for_shared_stream(jobs.subscribe(), jobs.cache())
        .watches_shared_stream(pods.subscribe(), |pod| owner(&pod));
    let changes = futures::stream::select(pods.subscribe().map(Change::Pod), jobs.subscribe().map(Change::Job));
    let memory = Arc::new(Memory::default());
    let caches = (jobs.cache(), pods.cache());
    tokio::spawn(release_orphans(client.clone(), caches, memory.clone(), changes, shutdown.clone()));
    let reconciler = Jobs {
        client: client.clone(),
        pods: pods.cache(),
        expectations: Expectations::default(),
        memory,
        recorder: Recorder::spawn(client.clone(), "job-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

fn owner(pod: &Pod) -> Option<ObjectRef<Job>> {
    let r = controller_of(&pod.metadata).filter(|r| r.kind == "Job" && r.api_version == "batch/v1")?;
    Some(ObjectRef::new(&r.name).within(&pod.namespace()?))
}

fn has_finalizer(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == TRACKING_FINALIZER)
}

/// Removes the tracking finalizer from `pod` (with its UID as precondition); a pod gone is fine.
async fn remove_finalizer(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let kept: Vec<&String> = pod.finalizers().iter().filter(|f| *f != TRACKING_FINALIZER).collect();
    let kept = if kept.is_empty() { serde_json::Value::Null } else { json!(kept) };
    let patch = json!({"metadata": {"finalizers": kept, "uid": pod.uid(), "resourceVersion": pod.resource_version()}});
    match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// What the orphan sweeper hears of.
enum Change {
    Pod(Arc<Pod>),
    Job(Arc<Job>),
}

/// Upstream's orphan-pod handling: a pod keeping the tracking finalizer whose Job is gone is let
/// go. Looked for when a pod changes, over a Job's pods when the Job is deleted (`deleteJob`, which
/// also drops the controller's memory of it), and over every pod once both caches are first filled.
async fn release_orphans(
    client: Client,
    (jobs, pods): (Cache<Job>, Cache<Pod>),
    memory: Arc<Memory>,
    changes: impl futures::Stream<Item = Change>,
    shutdown: CancellationToken,
) {
    let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled_owned()));
    // The changes are taken meanwhile (ignored) so that the shared watches never wait on this.
    let mut ready = std::pin::pin!(async { synced(&jobs).await && synced(&pods).await });
    let mut filled = false;
    loop {
        tokio::select! {
            ok = &mut ready, if !filled => {
                if !ok {
                    return;
                }
                filled = true;
                for pod in pods.state() {
                    release_if_orphan(&client, &jobs, &pod).await;
                }
            }
            change = changes.next() => match change {
                None => return,
                Some(_) if !filled => {}
                Some(Change::Pod(pod)) => release_if_orphan(&client, &jobs, &pod).await,
                Some(Change::Job(job)) => {
                    let uid = job.uid();
                    if jobs.get(&ObjectRef::from_obj(&job)).is_some_and(|j| j.uid() == uid) {
                        continue;
                    }
                    memory.forget(&format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any()));
                    let orphans = pods.state().into_iter().filter(|p| controller_of(&p.metadata).map(|r| &r.uid) == uid.as_ref());
                    for pod in orphans {
                        release_if_orphan(&client, &jobs, &pod).await;
                    }
                }
            },
        }
    }
}

/// Removes the tracking finalizer of `pod` when its Job is gone: not in the cache, and not in
/// the API either (the cache may lag behind a Job just created).
async fn release_if_orphan(client: &Client, jobs: &Cache<Job>, pod: &Pod) {
    let Some(job) = owner(pod).filter(|_| has_finalizer(pod)) else { return };
    let uid = controller_of(&pod.metadata).map(|r| r.uid.clone());
    if jobs.get(&job).is_some_and(|j| j.uid() == uid) {
        return;
    }
    let api: Api<Job> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    match api.get_opt(&job.name).await {
        Ok(Some(j)) if j.uid() == uid => return,
        Ok(_) => {}
        Err(e) => {
            tracing::debug!("job controller: looking for the Job of pod {}: {e}", pod.name_any());
            return;
        }
    }
    if let Err(e) = remove_finalizer(client, pod).await {
        tracing::debug!("job controller: releasing orphan pod {}: {e}", pod.name_any());
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// A pod that is over for its Job: it finished, or it is being deleted and not running
/// (upstream counts a deleted unfinished pod as failed, except under a `podFailurePolicy`, which
/// judges a pod by its final state).
fn finished(pod: &Pod, policy: bool) -> Option<bool> {
    match phase(pod) {
        "Succeeded" => Some(true),
        "Failed" => Some(false),
        _ if !policy && pod.metadata.deletion_timestamp.is_some() && !running_containers(pod) => Some(false),
        _ => None,
    }
}

/// The finished pods still holding the tracking finalizer and not in `seen` (recorded as
/// uncounted, or counted with their finalizer removal not yet in the cache): (UID, succeeded),
/// at most [`MAX_UNCOUNTED`].
fn newly_finished<'a>(pods: &'a [Arc<Pod>], seen: &HashSet<String>, policy: bool) -> Vec<(&'a Arc<Pod>, bool)> {
    pods.iter()
        .filter(|p| has_finalizer(p) && p.uid().is_some_and(|u| !seen.contains(&u)))
        .filter_map(|p| Some((p, finished(p, policy)?)))
        .take(MAX_UNCOUNTED)
        .collect()
}

fn running_containers(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn index_of(pod: &Pod) -> Option<i32> {
    pod.annotations().get(INDEX).and_then(|i| i.parse().ok())
}

/// The failures of a pod's index before it (`batch.kubernetes.io/job-index-failure-count`).
fn index_failures_before(pod: &Pod) -> i32 {
    pod.annotations().get(INDEX_FAILURES).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Per index with failed pods: its failures so far (the failures before its latest failed pod,
/// and that one's unless the policy ignores it) and when its latest failed pod finished.
fn index_failures(pods: &[Arc<Pod>], policy: Option<&PodFailurePolicy>) -> HashMap<i32, (i32, Timestamp)> {
    let mut out: HashMap<i32, (i32, Timestamp)> = HashMap::new();
    for pod in pods.iter().filter(|p| finished(p, policy.is_some()) == Some(false)) {
        let Some(i) = index_of(pod) else { continue };
        let counted = i32::from(failure_policy::judge(policy, pod) != Verdict::Ignore);
        let failures = index_failures_before(pod) + counted;
        let at = finish_time(pod);
        let entry = out.entry(i).or_insert((failures, at));
        if failures > entry.0 || (failures == entry.0 && at > entry.1) {
            *entry = (failures, at);
        }
    }
    out
}

/// When a pod's last container stopped (its creation when none says).
fn finish_time(pod: &Pod) -> Timestamp {
    let statuses = pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten());
    statuses
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0))
        .max()
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The first success policy rule the completed indexes meet (upstream's `matchSuccessPolicy`).
fn matched_success_rule(policy: &SuccessPolicy, completed: &BTreeSet<i32>) -> Option<usize> {
    policy.rules.iter().position(|rule| match (&rule.succeeded_indexes, rule.succeeded_count) {
        (Some(indexes), count) => {
            let wanted = parse_indexes(indexes);
            let done = wanted.intersection(completed).count();
            count.map_or(done == wanted.len(), |c| done >= c.max(0) as usize)
        }
        (None, Some(c)) => completed.len() >= c.max(0) as usize,
        (None, None) => false,
    })
}

fn condition_true(status: &JobStatus, kind: &str) -> bool {
    status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True")
}

fn set_condition(status: &mut JobStatus, kind: &str, value: &str, reason: &str, message: &str, now: Timestamp) -> bool {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == kind) {
        if c.status == value && c.reason.as_deref() == Some(reason) {
            return false;
        }
        if c.status != value {
            c.last_transition_time = Some(Time(now));
        }
        c.status = value.into();
        c.reason = Some(reason.into());
        c.message = Some(message.into());
        c.last_probe_time = Some(Time(now));
        return true;
    }
    conditions.push(JobCondition {
        type_: kind.into(),
        status: value.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    });
    true
}

/// Indexes as `status.completedIndexes` writes them: `0-2,5`.
pub fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(",")
}

/// Parses `status.completedIndexes`.
pub fn parse_indexes(text: &str) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<i32>().ok()),
        }
    }
    out
}

/// The delay before a replacement after `failures` failures in a row.
fn failure_backoff(failures: u32) -> Duration {
    FAILURE_BACKOFF
        .saturating_mul(1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX))
        .min(MAX_FAILURE_BACKOFF)
}

impl Reconciler for Jobs {
    type Object = Job;
    const NAME: &'static str = "job";

    async fn synced(&self) -> bool {
        synced(&self.pods).await
    }

    async fn reconcile(&self, job: Arc<Job>) -> Result<Action, Error> {
        let ns = job.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", job.name_any());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let spec = job.spec.clone().unwrap_or_default();
        let rv = |j: &Job| j.resource_version().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let mut version = rv(&job);
        {
            let mut written = self.memory.written.lock().unwrap_or_else(|e| e.into_inner());
            match written.get(&key) {
                Some(w) if *w > version => return Ok(Action::await_change()),
                Some(_) => {
                    written.remove(&key);
                }
                None => {}
            }
        }
        let satisfied = self.expectations.satisfied_in(&key, &self.pods, &ns);
        let candidates = self.pods.state().into_iter().filter(|p| p.namespace().as_deref() == Some(&ns));
        let claim = Claim { owner: &*job, adopting: job.metadata.deletion_timestamp.is_none() };
        let pods = claim.claim(&api, candidates, |p| selector_matches(spec.selector.as_ref(), p.labels())).await?;

        let now = Timestamp::now();
        let old = job.status.clone().unwrap_or_default();
        let mut status = old.clone();
        let done = condition_true(&status, "Complete") || condition_true(&status, "Failed");
        let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let (mut new_succeeded, mut new_failed) =
            (uncounted.succeeded.clone().unwrap_or_default(), uncounted.failed.clone().unwrap_or_default());
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        let policy = spec.pod_failure_policy.as_ref();
        let per_index = spec.backoff_limit_per_index.filter(|_| indexed);
        let mut completed = parse_indexes(status.completed_indexes.as_deref().unwrap_or_default());
        let mut failed_indexes = parse_indexes(status.failed_indexes.as_deref().unwrap_or_default());

        // Pods counted earlier whose cached copy still shows the finalizer are left alone.
        let counted: HashSet<String> = {
            let mut unfinalized = self.memory.unfinalized.lock().unwrap_or_else(|e| e.into_inner());
            let entry = unfinalized.entry(key.clone()).or_default();
            entry.retain(|uid| pods.iter().any(|p| has_finalizer(p) && p.uid().as_ref() == Some(uid)));
            let counted = entry.clone();
            if counted.is_empty() {
                unfinalized.remove(&key);
            }
            counted
        };

        // 1. Finished pods still holding the finalizer are recorded as uncounted, with the Job's
        // failure when the pod failure policy calls for it; failures it ignores are not recorded.
        let seen: HashSet<String> =
            counted.into_iter().chain(new_succeeded.iter().chain(&new_failed).cloned()).collect();
        let newly = newly_finished(&pods, &seen, policy.is_some());
        let mut ignored = Vec::new();
        for (pod, ok) in &newly {
            let uid = pod.uid().unwrap_or_default();
            let mut backoff = self.memory.backoff.lock().unwrap_or_else(|e| e.into_inner());
            if *ok {
                new_succeeded.push(uid);
                backoff.remove(&key);
                continue;
            }
            let verdict = failure_policy::judge(policy, pod);
            match &verdict {
                Verdict::Ignore => {
                    ignored.push(uid);
                    continue;
                }
                Verdict::FailJob(message) if !done && !condition_true(&status, "FailureTarget") => {
                    set_condition(&mut status, "FailureTarget", "True", "PodFailurePolicy", message, now);
                }
                _ => {}
            }
            // With a backoff limit per index, an index that has failed that often (or that the
            // policy fails) is not tried again.
            if let (Some(limit), Some(i)) = (per_index, index_of(pod))
                && (verdict == Verdict::FailIndex || index_failures_before(pod) >= limit)
            {
                failed_indexes.insert(i);
            }
            new_failed.push(uid);
            let entry = backoff.entry(key.clone()).or_insert((0, now));
            *entry = (entry.0 + 1, now);
        }
        if per_index.is_some() {
            status.failed_indexes = Some(format_indexes(&failed_indexes));
        }
        if newly.len() > ignored.len() {
            status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
                succeeded: Some(new_succeeded.clone()),
                failed: Some(new_failed.clone()),
            });
            self.write_status(&jobs, &key, &mut version, &old, &status).await?;
        }
        // 2. Their finalizers go, 3. then they count.
        let recorded: Vec<&Arc<Pod>> = pods
            .iter()
            .filter(|p| {
                has_finalizer(p)
                    && p.uid()
                        .is_some_and(|u| new_succeeded.contains(&u) || new_failed.contains(&u) || ignored.contains(&u))
            })
            .collect();
        let removed = join_all(recorded.iter().map(|p| remove_finalizer(&self.client, p))).await;
        if let Some(e) = removed.into_iter().find_map(Result::err) {
            return Err(e.into());
        }
        if !recorded.is_empty() {
            let mut unfinalized = self.memory.unfinalized.lock().unwrap_or_else(|e| e.into_inner());
            unfinalized.entry(key.clone()).or_default().extend(recorded.iter().filter_map(|p| p.uid()));
        }
        let by_uid: HashMap<String, &Arc<Pod>> = pods.iter().filter_map(|p| Some((p.uid()?, p))).collect();
        let succeeded_now = new_succeeded.len() as i32;
        for uid in &new_succeeded {
            if indexed && let Some(i) = by_uid.get(uid).and_then(|p| index_of(p)) {
                completed.insert(i);
            }
        }
        if indexed {
            status.succeeded = Some(completed.len() as i32);
            status.completed_indexes = Some(format_indexes(&completed));
        } else {
            status.succeeded = Some(old.succeeded.unwrap_or(0) + succeeded_now);
        }
        status.failed = Some(old.failed.unwrap_or(0) + new_failed.len() as i32);
        status.uncounted_terminated_pods = Some(UncountedTerminatedPods::default());

        // The pods still running for the Job, and those on their way out: under podReplacementPolicy
        // Failed these keep their place until they have failed.
        let (active, terminating): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = pods
            .iter()
            .filter(|p| finished(p, policy.is_some()).is_none())
            .partition(|p| p.metadata.deletion_timestamp.is_none());
        status.active = Some(active.len() as i32);
        status.ready = Some(active.iter().filter(|p| is_ready(p)).count() as i32);
        status.terminating = Some(terminating.len() as i32);
        let holding = if spec.pod_replacement_policy.as_deref() == Some("Failed") { &terminating[..] } else { &[] };
        let occupied: Vec<&Arc<Pod>> = active.iter().chain(holding).copied().collect();

        let mut requeue = None;
        if done {
            self.memory.backoff.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        } else if satisfied {
            let pods = JobPods { all: &pods, active: &active, occupied: &occupied, completed: &completed };
            requeue = self.manage(&job, &key, &api, &mut status, pods, now).await?;
        }
        self.write_status(&jobs, &key, &mut version, &old, &status).await?;
        Ok(requeue.map_or_else(Action::await_change, Action::requeue))
    }
}

/// A Job's pods as one sync sees them.
struct JobPods<'a> {
    all: &'a [Arc<Pod>],
    /// Running, not being deleted.
    active: &'a [&'a Arc<Pod>],
    /// Those holding a place a replacement would take: the active ones, and under
    /// podReplacementPolicy Failed the terminating ones too.
    occupied: &'a [&'a Arc<Pod>],
    completed: &'a BTreeSet<i32>,
}

impl Jobs {
    /// Writes the status if it changed, at resourceVersion `version` (a precondition: counts are
    /// never written over a Job this sync did not see), which becomes the written one.
    async fn write_status(
        &self,
        jobs: &Api<Job>,
        key: &str,
        version: &mut u64,
        old: &JobStatus,
        status: &JobStatus,
    ) -> Result<(), Error> {
        if old == status {
            return Ok(());
        }
        let name = key.split_once('/').map_or(key, |(_, n)| n);
        let mut body = json!({"metadata": {"resourceVersion": version.to_string()}, "status": status});
        // A merge patch keeps what it does not mention: cleared fields are sent as null.
        for (field, empty) in [
            ("completedIndexes", status.completed_indexes.is_none()),
            ("completionTime", status.completion_time.is_none()),
            ("startTime", status.start_time.is_none()),
        ] {
            if empty {
                body["status"][field] = serde_json::Value::Null;
            }
        }
        let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
        for (field, uids) in [("succeeded", uncounted.succeeded), ("failed", uncounted.failed)] {
            let uids = uids.filter(|u| !u.is_empty()).map_or(serde_json::Value::Null, |u| json!(u));
            body["status"]["uncountedTerminatedPods"][field] = uids;
        }
        let written = jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(&body)).await?;
        *version = written.resource_version().and_then(|v| v.parse().ok()).unwrap_or(*version);
        self.memory.written.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), *version);
        Ok(())
    }

    fn event(&self, job: &Job, kind: EventType, reason: &str, message: String) {
        self.recorder.record(EventObject::of(job), kind, reason, "Sync", message);
    }

    /// Suspends, fails, completes, or creates and deletes pods; returns when to look again.
    async fn manage(
        &self,
        job: &Job,
        key: &str,
        api: &Api<Pod>,
        status: &mut JobStatus,
        pods: JobPods<'_>,
        now: Timestamp,
    ) -> Result<Option<Duration>, Error> {
        let JobPods { all, active, occupied, completed } = pods;
        let spec = job.spec.clone().unwrap_or_default();
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        let per_index = spec.backoff_limit_per_index.filter(|_| indexed);
        let failed_indexes = parse_indexes(status.failed_indexes.as_deref().unwrap_or_default());

        if spec.suspend == Some(true) {
            if set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended", now) {
                self.event(job, EventType::Normal, "Suspended", "Job suspended".into());
            }
            status.start_time = None;
            self.delete_pods(job, key, api, active).await?;
            status.active = Some(0);
            return Ok(None);
        }
        if condition_true(status, "Suspended") {
            set_condition(status, "Suspended", "False", "JobResumed", "Job resumed", now);
            self.event(job, EventType::Normal, "Resumed", "Job resumed".into());
        }
        let start = status.start_time.get_or_insert(Time(now)).clone();

        // Failure: decided before (a pod failure policy's FailJob), the backoff limit, or the deadline.
        let failed = status.failed.unwrap_or(0);
        let deadline = spec.active_deadline_seconds.map(|s| start.0 + SignedDuration::from_secs(s));
        let target = status.conditions.iter().flatten().find(|c| c.type_ == "FailureTarget" && c.status == "True");
        let failure = if let Some(c) = target {
            Some((c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
        } else if failed > spec.backoff_limit.unwrap_or(6) {
            Some(("BackoffLimitExceeded".into(), "Job has reached the specified backoff limit".into()))
        } else if deadline.is_some_and(|d| d <= now) {
            Some(("DeadlineExceeded".into(), "Job was active longer than specified deadline".into()))
        } else if spec.max_failed_indexes.is_some_and(|m| failed_indexes.len() > m.max(0) as usize) {
            let message = "Job has exceeded the specified maximal number of failed indexes";
            Some(("MaxFailedIndexesExceeded".into(), message.into()))
        } else if !failed_indexes.is_empty()
            && completed.len() + failed_indexes.len() >= spec.completions.unwrap_or(0).max(0) as usize
        {
            Some(("FailedIndexes".into(), "Job has failed indexes".into()))
        } else {
            None
        };
        if let Some((reason, message)) = failure {
            set_condition(status, "FailureTarget", "True", &reason, &message, now);
            self.delete_pods(job, key, api, active).await?;
            if status.terminating.unwrap_or(0) == 0 && active.is_empty() {
                if set_condition(status, "Failed", "True", &reason, &message, now) {
                    self.event(job, EventType::Warning, &reason, message);
                }
                status.active = Some(0);
            }
            return Ok(None);
        }

        // Success: decided before, a success policy rule, or every completion (or, with no
        // completions, one success and nothing running).
        let succeeded = status.succeeded.unwrap_or(0);
        let met = match spec.completions {
            Some(c) => succeeded >= c,
            None => succeeded > 0,
        };
        let criteria =
            status.conditions.iter().flatten().find(|c| c.type_ == "SuccessCriteriaMet" && c.status == "True");
        let success = if let Some(c) = criteria {
            Some((c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
        } else if let Some(rule) = spec.success_policy.as_ref().and_then(|p| matched_success_rule(p, completed)) {
            Some(("SuccessPolicy".to_string(), format!("Matched rules at index {rule}")))
        } else {
            met.then(|| ("CompletionsReached".to_string(), "Reached expected number of succeeded pods".to_string()))
        };
        if let Some((reason, message)) = success {
            set_condition(status, "SuccessCriteriaMet", "True", &reason, &message, now);
            self.delete_pods(job, key, api, active).await?;
            if active.is_empty() && status.terminating.unwrap_or(0) == 0 {
                status.completion_time.get_or_insert(Time(now));
                if set_condition(status, "Complete", "True", &reason, &message, now) {
                    self.event(job, EventType::Normal, "Completed", "Job completed".into());
                }
            }
            return Ok(None);
        }

        // Replacements wait out the failure backoff: the Job's, or with a backoff limit per index
        // each index's own (below).
        let backoff = self
            .memory
            .backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .filter(|_| per_index.is_none());
        if let Some((failures, at)) = backoff {
            let due = at + SignedDuration::try_from(failure_backoff(failures)).unwrap_or(SignedDuration::ZERO);
            if due > now {
                let wait = due.duration_since(now).unsigned_abs();
                return Ok(Some(deadline.map_or(wait, |d| wait.min(d.duration_since(now).unsigned_abs()))));
            }
        }

        let parallelism = spec.parallelism.unwrap_or(1).max(0) as usize;
        let mut requeue = deadline.map(|d| d.duration_since(now).unsigned_abs());
        let wanted = if indexed {
            let running: BTreeSet<i32> = occupied.iter().filter_map(|p| index_of(p)).collect();
            let failures = if per_index.is_some() {
                index_failures(all, spec.pod_failure_policy.as_ref())
            } else {
                HashMap::new()
            };
            let pending: Vec<(i32, i32)> = (0..spec.completions.unwrap_or(0))
                .filter(|i| !completed.contains(i) && !running.contains(i) && !failed_indexes.contains(i))
                .filter_map(|i| {
                    let Some(&(count, at)) = failures.get(&i) else {
                        return Some((i, 0));
                    };
                    let due =
                        at + SignedDuration::try_from(failure_backoff(count as u32)).unwrap_or(SignedDuration::ZERO);
                    if due <= now {
                        return Some((i, count));
                    }
                    let wait = due.duration_since(now).unsigned_abs();
                    requeue = Some(requeue.map_or(wait, |r: Duration| r.min(wait)));
                    None
                })
                .collect();
            let room = parallelism.saturating_sub(occupied.len());
            pending
                .into_iter()
                .take(room.min(BURST))
                .map(|(i, count)| Some((i, per_index.map(|_| count))))
                .collect::<Vec<_>>()
        } else {
            let left = spec.completions.map_or(parallelism, |c| (c - succeeded).max(0) as usize);
            let want = parallelism.min(left);
            if active.len() > want {
                let surplus: Vec<&Arc<Pod>> = active.iter().rev().take(active.len() - want).copied().collect();
                self.delete_pods(job, key, api, &surplus).await?;
            }
            vec![None; want.saturating_sub(occupied.len()).min(BURST)]
        };
        self.create_pods(job, key, api, &wanted).await?;
        Ok(requeue)
    }

    /// Creates pods: of no index, or of an index with (under a backoff limit per index) the
    /// failures it had so far.
    async fn create_pods(
        &self,
        job: &Job,
        key: &str,
        api: &Api<Pod>,
        indexes: &[Option<(i32, Option<i32>)>],
    ) -> Result<(), Error> {
        let params = PostParams::default();
        let mut batch = 1;
        let mut left = indexes;
        while !left.is_empty() {
            let (now, rest) = left.split_at(batch.min(left.len()));
            let pods: Vec<Pod> = now.iter().map(|slot| pod_from_template(job, *slot)).collect();
            let created = join_all(pods.iter().map(|p| api.create(&params, p))).await;
            let mut failed = None;
            for result in created {
                match result {
                    Ok(p) => {
                        self.expectations.created(key, p.name_any());
                        self.event(
                            job,
                            EventType::Normal,
                            "SuccessfulCreate",
                            format!("Created pod: {}", p.name_any()),
                        );
                    }
                    Err(e) => {
                        self.event(
                            job,
                            EventType::Warning,
                            "FailedCreate",
                            format!("Error creating: {}", runtime::api_message(&e)),
                        );
                        failed = Some(e);
                    }
                }
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            left = rest;
            batch *= 2;
        }
        Ok(())
    }

    async fn delete_pods(&self, job: &Job, key: &str, api: &Api<Pod>, pods: &[&Arc<Pod>]) -> Result<(), Error> {
        let live: Vec<&&Arc<Pod>> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        for p in &live {
            self.expectations.deleted(key, p.name_any(), p.uid().unwrap_or_default());
        }
        let params = DeleteParams::default();
        let names: Vec<String> = live.iter().map(|p| p.name_any()).collect();
        let mut failed = None;
        for ((name, p), result) in
            names.iter().zip(&live).zip(join_all(names.iter().map(|n| api.delete(n, &params))).await)
        {
            match result {
                Ok(_) => self.event(job, EventType::Normal, "SuccessfulDelete", format!("Deleted pod: {name}")),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    self.expectations.delete_failed(key, name, p.uid().as_deref().unwrap_or_default());
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), |e| Err(e.into()))
    }
}

/// A pod of the Job's template, with the tracking finalizer; an Indexed Job's carries its index
/// (annotation, label, `JOB_COMPLETION_INDEX`, hostname `<job>-<index>`) and, under a backoff
/// limit per index, the failures of that index so far.
fn pod_from_template(job: &Job, slot: Option<(i32, Option<i32>)>) -> Pod {
    let index = slot.map(|(i, _)| i);
    let spec = job.spec.clone().unwrap_or_default();
    let meta = spec.template.metadata.unwrap_or_default();
    let name = job.name_any();
    let mut pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some(match index {
                Some(i) => format!("{name}-{i}-"),
                None => format!("{name}-"),
            }),
            labels: meta.labels,
            annotations: meta.annotations,
            finalizers: Some(
                meta.finalizers.unwrap_or_default().into_iter().chain([TRACKING_FINALIZER.to_string()]).collect(),
            ),
            owner_references: Some(vec![controller_ref(job)]),
            ..ObjectMeta::default()
        },
        spec: spec.template.spec,
        status: None,
    };
    if let Some((_, Some(failures))) = slot {
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(INDEX_FAILURES.into(), failures.to_string());
    }
    if let Some(i) = index {
        let text = i.to_string();
        pod.metadata.annotations.get_or_insert_with(Default::default).insert(INDEX.into(), text.clone());
        pod.metadata.labels.get_or_insert_with(Default::default).insert(INDEX.into(), text);
        if let Some(s) = pod.spec.as_mut() {
            s.hostname.get_or_insert_with(|| format!("{name}-{i}"));
            let env = EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{INDEX}']"),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            for c in s.containers.iter_mut().chain(s.init_containers.iter_mut().flatten()) {
                c.env.get_or_insert_with(Vec::new).push(env.clone());
            }
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_round_trip_as_intervals() {
        let set: BTreeSet<i32> = [0, 1, 2, 5, 7, 8].into();
        assert_eq!(format_indexes(&set), "0-2,5,7-8");
        assert_eq!(parse_indexes("0-2,5,7-8"), set);
        assert!(parse_indexes("").is_empty());
    }

    #[test]
    fn failures_back_off_from_10s_to_10_minutes() {
        assert_eq!(failure_backoff(1), Duration::from_secs(10));
        assert_eq!(failure_backoff(3), Duration::from_secs(40));
        assert_eq!(failure_backoff(30), Duration::from_secs(600));
    }

    #[test]
    fn a_pod_is_counted_once_while_the_cache_lags() {
        let pod = |uid: &str, phase: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(
                    json!({"metadata": {"name": uid, "uid": uid, "finalizers": [TRACKING_FINALIZER]},
                    "status": {"phase": phase}}),
                )
                .unwrap(),
            )
        };
        let pods = [pod("a", "Failed"), pod("b", "Succeeded"), pod("c", "Running")];
        let uids = |seen: &HashSet<String>| -> Vec<(String, bool)> {
            newly_finished(&pods, seen, false).into_iter().map(|(p, ok)| (p.uid().unwrap_or_default(), ok)).collect()
        };
        assert_eq!(uids(&HashSet::new()), [("a".into(), false), ("b".into(), true)]);
        // "a" was counted and its finalizer removed; the cache still shows the old copy.
        assert_eq!(uids(&HashSet::from(["a".to_string()])), [("b".into(), true)]);
    }

    #[test]
    fn success_policy_rules_match_as_upstream() {
        let policy: SuccessPolicy = serde_json::from_value(json!({"rules": [
            {"succeededIndexes": "0-2", "succeededCount": 2}, {"succeededIndexes": "4"}, {"succeededCount": 3}]}))
        .unwrap();
        let matched = |done: &[i32]| matched_success_rule(&policy, &done.iter().copied().collect());
        assert_eq!(matched(&[0, 3]), None);
        assert_eq!(matched(&[0, 2]), Some(0));
        assert_eq!(matched(&[4]), Some(1));
        assert_eq!(matched(&[3, 5, 6]), Some(2));
    }

    #[test]
    fn an_index_counts_the_failures_of_its_pods() {
        let pod = |index: i32, before: i32, code: i32, at: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "p", "annotations": {
                    INDEX: index.to_string(), INDEX_FAILURES: before.to_string()}},
                    "status": {"phase": "Failed", "containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                        "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": at}}}]}}))
                .unwrap(),
            )
        };
        let policy: PodFailurePolicy = serde_json::from_value(json!({"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]}))
        .unwrap();
        let pods = [
            pod(0, 0, 1, "2026-01-01T00:00:00Z"),
            pod(0, 1, 1, "2026-01-01T00:01:00Z"),
            pod(1, 0, 3, "2026-01-01T00:02:00Z"),
        ];
        let failures = index_failures(&pods, Some(&policy));
        assert_eq!(failures[&0], (2, "2026-01-01T00:01:00Z".parse().unwrap()));
        // An ignored failure is not one.
        assert_eq!(failures[&1].0, 0);
        assert_eq!(index_failures_before(&pods[1]), 1);
    }

    #[test]
    fn indexed_pods_carry_their_index() {
        let job: Job = serde_json::from_value(json!({"metadata": {"name": "work", "uid": "u"},
            "spec": {"completionMode": "Indexed", "completions": 3, "template": {"metadata": {"labels": {"a": "b"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}}}))
        .unwrap();
        assert_eq!(
            pod_from_template(&job, Some((2, Some(1)))).annotations().get(INDEX_FAILURES).map(String::as_str),
            Some("1")
        );
        let pod = pod_from_template(&job, Some((2, None)));
        assert!(!pod.annotations().contains_key(INDEX_FAILURES));
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("work-2-"));
        assert_eq!(pod.annotations().get(INDEX).map(String::as_str), Some("2"));
        assert!(has_finalizer(&pod));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("work-2"));
        assert_eq!(spec.containers[0].env.as_ref().unwrap()[0].name, "JOB_COMPLETION_INDEX");
    }
}
