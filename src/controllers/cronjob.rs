//! CronJobs start Jobs on a schedule (upstream's cronjob controller v2,
//! `pkg/controller/cronjob`): each sync settles the active list against the Jobs there are,
//! finds the most recent scheduled time not yet run (giving up on one older than
//! `startingDeadlineSeconds`), applies the concurrency policy (Allow, Forbid, Replace), creates
//! the Job named after its scheduled minute (so a restart cannot start it twice), trims the
//! finished Jobs to the history limits, and sleeps until the next scheduled time.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::ownership::{controlled_by, controller_of, controller_ref};
use super::runtime::{self, Error, Reconciler, api_message};
use crate::cron::Schedule;
use crate::events::{EventType, ObjectRef as EventObject, Recorder};

/// The annotation with the time a Job was scheduled for.
const SCHEDULED_AT: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Upstream's `nextScheduleDelta`: wake a little after the scheduled time, never before it.
const NEXT_DELTA: Duration = Duration::from_millis(100);
/// More missed start times than this get a warning (upstream's limit).
const MANY_MISSED: i64 = 100;
/// The most scheduled times one search steps through.
const MAX_STEPS: usize = 100_000;

pub struct CronJobs {
    client: Client,
    jobs: Cache<Job>,
    recorder: Recorder,
}

/// Starts the controller and its watch of Jobs.
pub fn spawn(client: &Client, jobs: &mut Informer<Job>, shutdown: &CancellationToken) {
    let controller = Controller::new(Api::<CronJob>::all(client.clone()), watcher::Config::default())
        .watches_shared_stream(jobs.subscribe(), |job| {
            let r = controller_of(&job.metadata).filter(|r| r.kind == "CronJob" && r.api_version == "batch/v1")?;
            Some(ObjectRef::<CronJob>::new(&r.name).within(&job.namespace()?))
        });
    let reconciler = CronJobs {
        client: client.clone(),
        jobs: jobs.cache(),
        recorder: Recorder::spawn(client.clone(), "cronjob-controller".into(), String::new()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// `getFinishedStatus`: the condition that ended a Job, if one did.
fn finished(job: &Job) -> Option<&str> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
        .map(|c| c.type_.as_str())
}

fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// `mostRecentScheduleTime`: the latest scheduled time after the last one run (or the CronJob's
/// creation, or the starting deadline) up to `now`, and how many were missed.
fn most_recent(cj: &CronJob, schedule: &Schedule, now: Timestamp) -> (Option<Timestamp>, i64) {
    let spec = &cj.spec;
    let status = cj.status.clone().unwrap_or_default();
    let created = cj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let mut earliest = status.last_schedule_time.map_or(created, |t| t.0);
    if let Some(deadline) = spec.starting_deadline_seconds {
        let floor = now.checked_sub(SignedDuration::from_secs(deadline)).unwrap_or(Timestamp::MIN);
        earliest = earliest.max(floor);
    }
    let Some(t1) = schedule.next(earliest).filter(|t| *t <= now) else { return (None, 0) };
    let Some(t2) = schedule.next(t1).filter(|t| *t <= now) else { return (Some(t1), 1) };
    // Many missed: count them by the period between the first two, jump to two periods short
    // of the last, and step from there through real scheduled times only. A schedule whose gaps
    // vary (weekdays, months) may find none after the jump: then it steps from the first.
    let period = (t2.as_second() - t1.as_second()).max(1);
    let missed = (now.as_second() - t1.as_second()) / period + 1;
    let last_until_now = |from: Timestamp| {
        let mut found = None;
        let mut t = from;
        for _ in 0..MAX_STEPS {
            match schedule.next(t).filter(|n| *n <= now) {
                Some(n) => (found, t) = (Some(n), n),
                None => break,
            }
        }
        found
    };
    let jump = Timestamp::from_second(t1.as_second() + (missed - 2).max(0) * period).unwrap_or(t1);
    let recent = last_until_now(jump).or_else(|| last_until_now(t1)).unwrap_or(t2);
    (Some(recent), missed)
}

/// The Job of `cj` for `scheduled` (`getJobFromTemplate2`): named after the minute it was
/// scheduled for.
fn job_for(cj: &CronJob, schedule: &Schedule, scheduled: Timestamp) -> Job {
    let template = cj.spec.job_template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(SCHEDULED_AT.into(), schedule.local(scheduled));
    Job {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", cj.name_any(), scheduled.as_second() / 60)),
            namespace: cj.namespace(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

impl Reconciler for CronJobs {
    type Object = CronJob;
    const NAME: &'static str = "cronjob";

    async fn synced(&self) -> bool {
        synced(&self.jobs).await
    }

    async fn reconcile(&self, cj: Arc<CronJob>) -> Result<Action, Error> {
        let ns = cj.namespace().unwrap_or_default();
        let uid = cj.uid().unwrap_or_default();
        let jobs_api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let jobs: Vec<Arc<Job>> = self
            .jobs
            .state()
            .into_iter()
            .filter(|j| j.namespace().as_deref() == Some(&ns) && controlled_by(&j.metadata, &uid))
            .collect();
        let old = cj.status.clone().unwrap_or_default();
        let mut status = old.clone();
        let result = self.sync(&cj, &jobs_api, &jobs, &mut status).await;
        let cleaned = self.cleanup(&cj, &jobs_api, &jobs, &status).await;
        if status != old {
            let api: Api<CronJob> = Api::namespaced(self.client.clone(), &ns);
            let mut body = json!({"status": status});
            if status.active.as_ref().is_none_or(Vec::is_empty) {
                body["status"]["active"] = serde_json::Value::Null;
            }
            api.patch_status(&cj.name_any(), &PatchParams::default(), &Patch::Merge(&body)).await?;
        }
        cleaned?;
        Ok(result?.map_or_else(Action::await_change, |wait| Action::requeue(wait + NEXT_DELTA)))
    }
}

impl CronJobs {
    fn event(&self, cj: &CronJob, kind: EventType, reason: &str, action: &'static str, message: String) {
        self.recorder.record(EventObject::of(cj), kind, reason, action, message);
    }

    /// `syncCronJob`: how long until the next scheduled time, if there is one to wait for.
    async fn sync(
        &self,
        cj: &CronJob,
        api: &Api<Job>,
        jobs: &[Arc<Job>],
        status: &mut CronJobStatus,
    ) -> Result<Option<Duration>, Error> {
        let mut active = status.active.take().unwrap_or_default();
        for job in jobs {
            let listed = active.iter().any(|r| r.uid == job.metadata.uid);
            match finished(job) {
                None if !listed => {
                    // The cache may not show the status write that listed it yet: ask the API.
                    let fresh = Api::<CronJob>::namespaced(self.client.clone(), &cj.namespace().unwrap_or_default())
                        .get_opt(&cj.name_any())
                        .await?;
                    let known = fresh
                        .and_then(|c| c.status)
                        .and_then(|s| s.active)
                        .is_some_and(|a| a.iter().any(|r| r.uid == job.metadata.uid));
                    if known {
                        active.push(reference(job));
                    } else {
                        self.event(
                            cj,
                            EventType::Warning,
                            "UnexpectedJob",
                            "Sync",
                            format!("Saw a job that the controller did not create or forgot: {}", job.name_any()),
                        );
                    }
                }
                Some(condition) if listed => {
                    active.retain(|r| r.uid != job.metadata.uid);
                    self.event(
                        cj,
                        EventType::Normal,
                        "SawCompletedJob",
                        "Sync",
                        format!("Saw completed job: {}, condition: {condition}", job.name_any()),
                    );
                }
                _ => {}
            }
            if finished(job) == Some("Complete")
                && let Some(done) = job.status.as_ref().and_then(|s| s.completion_time.clone())
                && status.last_successful_time.as_ref().is_none_or(|t| t.0 < done.0)
            {
                status.last_successful_time = Some(done);
            }
        }
        // Jobs listed but gone (asked of the API: the cache may lag).
        let mut kept = Vec::new();
        for r in active {
            let cached = jobs.iter().any(|j| j.metadata.uid == r.uid);
            let name = r.name.clone().unwrap_or_default();
            if cached || api.get_opt(&name).await?.is_some() {
                kept.push(r);
            } else {
                self.event(cj, EventType::Normal, "MissingJob", "Sync", format!("Active job went missing: {name}"));
            }
        }
        status.active = (!kept.is_empty()).then_some(kept);

        let spec = &cj.spec;
        if cj.metadata.deletion_timestamp.is_some() || spec.suspend == Some(true) {
            return Ok(None);
        }
        let schedule = match Schedule::parse(&spec.schedule, spec.time_zone.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                let reason = if e.starts_with("unknown time zone") { "UnknownTimeZone" } else { "UnparseableSchedule" };
                self.event(cj, EventType::Warning, reason, "Sync", format!("invalid schedule: {}: {e}", spec.schedule));
                return Ok(None);
            }
        };
        let now = Timestamp::now();
        let until_next = |from: Timestamp| {
            schedule
                .next(from)
                .map(|t| Duration::from_millis((t.as_millisecond() - now.as_millisecond()).max(0) as u64))
        };
        let (scheduled, missed) = most_recent(cj, &schedule, now);
        let Some(scheduled) = scheduled else { return Ok(until_next(now)) };
        if missed > MANY_MISSED {
            self.event(cj, EventType::Warning, "TooManyMissedTimes", "Sync", format!(
                "too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew"
            ));
        }
        if let Some(deadline) = spec.starting_deadline_seconds
            && scheduled.checked_add(SignedDuration::from_secs(deadline)).is_ok_and(|t| t < now)
        {
            self.event(
                cj,
                EventType::Warning,
                "MissSchedule",
                "Sync",
                format!("Missed scheduled time to start a job: {}", scheduled.strftime("%a, %d %b %Y %H:%M:%S +0000")),
            );
            return Ok(until_next(now));
        }
        let job = job_for(cj, &schedule, scheduled);
        let listed = status.active.iter().flatten().any(|r| r.name == job.metadata.name);
        if listed || status.last_schedule_time.as_ref().is_some_and(|t| t.0 == scheduled) {
            return Ok(until_next(now));
        }
        let running = status.active.iter().flatten().count();
        match spec.concurrency_policy.as_deref() {
            Some("Forbid") if running > 0 => {
                self.event(
                    cj,
                    EventType::Normal,
                    "JobAlreadyActive",
                    "Sync",
                    "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
                );
                return Ok(until_next(now));
            }
            Some("Replace") => {
                for r in status.active.clone().into_iter().flatten() {
                    let name = r.name.clone().unwrap_or_default();
                    let params = DeleteParams {
                        propagation_policy: Some(PropagationPolicy::Background),
                        ..DeleteParams::default()
                    };
                    match api.delete(&name, &params).await {
                        Ok(_) => self.event(
                            cj,
                            EventType::Normal,
                            "SuccessfulDelete",
                            "Delete",
                            format!("Deleted job {name}"),
                        ),
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                    if let Some(active) = status.active.as_mut() {
                        active.retain(|a| a.uid != r.uid);
                    }
                }
                if status.active.as_ref().is_some_and(Vec::is_empty) {
                    status.active = None;
                }
            }
            _ => {}
        }
        let created = match api.create(&PostParams::default(), &job).await {
            Ok(created) => {
                self.event(
                    cj,
                    EventType::Normal,
                    "SuccessfulCreate",
                    "Create",
                    format!("Created job {}", created.name_any()),
                );
                created
            }
            // Made before a restart, or by a sync whose status write was lost: ours if we control it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(&job.name_any()).await?;
                if !controlled_by(&existing.metadata, &cj.uid().unwrap_or_default())
                    || status.active.iter().flatten().any(|r| r.uid == existing.metadata.uid)
                {
                    return Ok(until_next(now));
                }
                existing
            }
            Err(e) => {
                self.event(
                    cj,
                    EventType::Warning,
                    "FailedCreate",
                    "Create",
                    format!("Error creating job: {}", api_message(&e)),
                );
                return Err(e.into());
            }
        };
        status.active.get_or_insert_with(Vec::new).push(reference(&created));
        status.last_schedule_time = Some(Time(scheduled));
        Ok(until_next(now))
    }

    /// `cleanupFinishedJobs`: finished Jobs beyond the history limits go, oldest first.
    async fn cleanup(
        &self,
        cj: &CronJob,
        api: &Api<Job>,
        jobs: &[Arc<Job>],
        status: &CronJobStatus,
    ) -> Result<(), Error> {
        let active: Vec<_> = status.active.iter().flatten().filter_map(|r| r.uid.clone()).collect();
        for (condition, limit) in
            [("Complete", cj.spec.successful_jobs_history_limit), ("Failed", cj.spec.failed_jobs_history_limit)]
        {
            let Some(limit) = limit else { continue };
            let mut done: Vec<&Arc<Job>> = jobs
                .iter()
                .filter(|j| finished(j) == Some(condition) && !j.uid().is_some_and(|u| active.contains(&u)))
                .filter(|j| j.metadata.deletion_timestamp.is_none())
                .collect();
            // Oldest first; Jobs not started yet last (`byJobStartTime`).
            done.sort_by_key(|j| {
                j.status.as_ref().and_then(|s| s.start_time.clone()).map_or((1, None), |t| (0, Some(t.0)))
            });
            let surplus = done.len().saturating_sub(limit.max(0) as usize);
            for job in done.into_iter().take(surplus) {
                let params =
                    DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..DeleteParams::default() };
                match api.delete(&job.name_any(), &params).await {
                    Ok(_) => self.event(
                        cj,
                        EventType::Normal,
                        "SuccessfulDelete",
                        "Delete",
                        format!("Deleted job {}", job.name_any()),
                    ),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron_job(created: &str, last: Option<&str>, deadline: Option<i64>) -> CronJob {
        serde_json::from_value(json!({"metadata": {"name": "tick", "namespace": "default", "uid": "u", "creationTimestamp": created},
            "spec": {"schedule": "*/5 * * * *", "startingDeadlineSeconds": deadline, "jobTemplate": {"spec": {"template": {}}}},
            "status": {"lastScheduleTime": last}}))
        .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_most_recent_missed_time_is_run_once() {
        let schedule = Schedule::parse("*/5 * * * *", None).unwrap();
        let cj = cron_job("2026-01-01T10:00:00Z", None, None);
        assert_eq!(most_recent(&cj, &schedule, at("2026-01-01T10:04:00Z")), (None, 0));
        assert_eq!(most_recent(&cj, &schedule, at("2026-01-01T10:06:00Z")), (Some(at("2026-01-01T10:05:00Z")), 1));
        // Cairn was down for an hour: only the latest time is run.
        let (t, missed) = most_recent(&cj, &schedule, at("2026-01-01T11:02:00Z"));
        assert_eq!((t, missed), (Some(at("2026-01-01T11:00:00Z")), 12));
        let after_last = cron_job("2026-01-01T10:00:00Z", Some("2026-01-01T10:05:00Z"), None);
        assert_eq!(most_recent(&after_last, &schedule, at("2026-01-01T10:07:00Z")), (None, 0));
        // Gaps that vary: the latest real time, never one the schedule does not have.
        let weekdays = Schedule::parse("0 9 * * 1-5", None).unwrap();
        let monday = cron_job("2026-01-01T00:00:00Z", Some("2026-01-05T09:00:00Z"), None);
        assert_eq!(most_recent(&monday, &weekdays, at("2026-01-11T10:00:00Z")).0, Some(at("2026-01-09T09:00:00Z")));
        let monthly = Schedule::parse("0 0 1 * *", None).unwrap();
        let january = cron_job("2025-12-01T00:00:00Z", Some("2026-01-01T00:00:00Z"), None);
        assert_eq!(most_recent(&january, &monthly, at("2026-04-28T00:00:00Z")).0, Some(at("2026-04-01T00:00:00Z")));
        let huge = cron_job("2026-01-01T10:00:00Z", None, Some(i64::MAX / 2));
        assert_eq!(most_recent(&huge, &schedule, at("2026-01-01T10:06:00Z")).0, Some(at("2026-01-01T10:05:00Z")));
        // A starting deadline bounds how far back it looks.
        let bounded = cron_job("2026-01-01T10:00:00Z", None, Some(60));
        assert_eq!(most_recent(&bounded, &schedule, at("2026-01-01T10:08:00Z")), (None, 0));
    }

    #[test]
    fn jobs_are_named_after_their_minute() {
        let schedule = Schedule::parse("*/5 * * * *", None).unwrap();
        let cj = cron_job("2026-01-01T10:00:00Z", None, None);
        let job = job_for(&cj, &schedule, at("2026-01-01T10:05:00Z"));
        assert_eq!(job.name_any(), format!("tick-{}", at("2026-01-01T10:05:00Z").as_second() / 60));
        assert_eq!(job.annotations()[SCHEDULED_AT], "2026-01-01T10:05:00Z");
        let owner = &job.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("CronJob", Some(true)));
    }
}
