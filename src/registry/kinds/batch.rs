//! `batch/v1` Jobs and CronJobs with upstream's defaults (`SetDefaults_Job`,
//! `SetDefaults_CronJob`), a Job's generated selector (`batch.kubernetes.io/controller-uid`),
//! validation (`pkg/apis/batch/validation`) and the `kubectl get` columns.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use super::workload_rules::{
    default_template, go_map, non_negative, selector_immutable, validate_template, wide_cells, wide_columns,
};
use crate::labels::{format_selector, selector_matches};
use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge, merge_retain, primitive};
use crate::registry::strategy::{
    AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, human_duration, name_cell, since_cell,
};
use crate::registry::validation::{ErrorList, FieldError};

pub struct Jobs;
pub struct CronJobs;

/// Labels the server puts on a Job's pod template (and the first in its selector).
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
const LEGACY_CONTROLLER_UID: &str = "controller-uid";
const LEGACY_JOB_NAME: &str = "job-name";
/// The most completions (and parallelism) an Indexed Job may have.
const MAX_INDEXED: i32 = 100_000;

const JOB_MERGE_KEYS: &[MergeKey] = &pod_spec_merge_keys!("spec.template.spec.", merge("status.conditions", "type"));

impl Kind for Jobs {
    type Obj = Job;
    const INFO: ResourceInfo = ResourceInfo {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        singular: "job",
        namespaced: true,
        short_names: &[],
        categories: &["all"],
        subresources: &[Subresource::Status],
        storage: "jobs.batch",
        return_deleted_object: false,
    };
    const GENERATION: bool = true;
    const MERGE_KEYS: &'static [MergeKey] = JOB_MERGE_KEYS;

    fn prepare_create(&self, job: &mut Job) {
        job.status = None;
        let spec = job.spec.get_or_insert_with(JobSpec::default);
        default_job(spec);
        if spec.manual_selector != Some(true) {
            generate_selector(job);
        }
        // A Job without labels takes its template's (upstream's defaulting, which it applies again
        // when the stored Job is read back, after the generated labels are in).
        let template_labels =
            job.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.clone());
        if job.metadata.labels.as_ref().is_none_or(BTreeMap::is_empty) {
            job.metadata.labels = template_labels;
        }
    }

    fn prepare_update(&self, new: &mut Job, old: &Job) {
        new.status = old.status.clone();
        default_job(new.spec.get_or_insert_with(JobSpec::default));
    }

    fn prepare_status_update(&self, new: &mut Job, old: &Job) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, job: &Job) -> ErrorList {
        let mut out = Vec::new();
        let spec = job.spec.clone().unwrap_or_default();
        validate_spec(&spec, &mut out);
        if spec.manual_selector != Some(true) {
            let uid = job.metadata.uid.clone().unwrap_or_default();
            let generated = LabelSelector {
                match_labels: Some([(CONTROLLER_UID.to_string(), uid)].into()),
                ..LabelSelector::default()
            };
            if spec.selector.as_ref() != Some(&generated) {
                out.push(FieldError::invalid(
                    "spec.selector",
                    format_selector(spec.selector.as_ref()),
                    "`selector` not auto-generated",
                ));
            }
        }
        out
    }

    fn validate_update(&self, new: &Job, old: &Job) -> ErrorList {
        let mut out = Vec::new();
        let (n, o) = (new.spec.clone().unwrap_or_default(), old.spec.clone().unwrap_or_default());
        validate_spec(&n, &mut out);
        selector_immutable(n.selector.as_ref(), o.selector.as_ref(), &mut out);
        let immutable = |field: &str, changed: bool, value: String, out: &mut ErrorList| {
            if changed {
                out.push(FieldError::invalid(format!("spec.{field}"), value, "field is immutable"));
            }
        };
        immutable(
            "completionMode",
            n.completion_mode != o.completion_mode,
            n.completion_mode.clone().unwrap_or_default(),
            &mut out,
        );
        immutable("podFailurePolicy", n.pod_failure_policy != o.pod_failure_policy, "{...}".into(), &mut out);
        immutable(
            "backoffLimitPerIndex",
            n.backoff_limit_per_index != o.backoff_limit_per_index,
            format!("{:?}", n.backoff_limit_per_index),
            &mut out,
        );
        // Indexed Jobs are elastic: completions may change together with parallelism.
        let elastic = n.completion_mode.as_deref() == Some("Indexed") && n.completions == n.parallelism;
        if n.completions != o.completions && !elastic {
            out.push(FieldError::invalid(
                "spec.completions",
                n.completions.map_or("null".into(), |c| c.to_string()),
                "field is immutable",
            ));
        }
        // The template may change only while the Job is suspended and has not started.
        let unstarted = o.suspend == Some(true) && old.status.as_ref().and_then(|s| s.start_time.as_ref()).is_none();
        if n.template != o.template && !unstarted {
            out.push(FieldError::invalid("spec.template", "{...}", "field is immutable"));
        }
        out
    }

    fn validate_status_update(&self, new: &Job, _old: &Job) -> ErrorList {
        let mut out = Vec::new();
        if let Some(s) = &new.status {
            for (field, v) in [
                ("active", s.active),
                ("succeeded", s.succeeded),
                ("failed", s.failed),
                ("ready", s.ready),
                ("terminating", s.terminating),
            ] {
                non_negative(v.map(i64::from), &format!("status.{field}"), &mut out);
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![
            NAME_COLUMN,
            Column::new("Status", "string", "Status of the job."),
            Column::new(
                "Completions",
                "string",
                "The desired number of successfully finished pods the job should be run with.",
            ),
            Column::new("Duration", "string", "Time required to complete the job."),
            AGE_COLUMN,
        ];
        cols.extend(wide_columns(true));
        cols
    }

    fn cells(&self, job: &Job) -> Vec<Value> {
        let spec = job.spec.clone().unwrap_or_default();
        let status = job.status.clone().unwrap_or_default();
        let succeeded = status.succeeded.unwrap_or(0);
        let completions = match (spec.completions, spec.parallelism) {
            (Some(c), _) => format!("{succeeded}/{c}"),
            (None, Some(p)) if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        };
        let duration = match (&status.start_time, &status.completion_time) {
            (None, _) => String::new(),
            (Some(s), None) => human_duration(k8s_openapi::jiff::Timestamp::now().as_second() - s.0.as_second()),
            (Some(s), Some(c)) => human_duration(c.0.as_second() - s.0.as_second()),
        };
        let has = |kind: &str| status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True");
        let state = if has("Complete") {
            "Complete"
        } else if has("Failed") {
            "Failed"
        } else if job.metadata.deletion_timestamp.is_some() {
            "Terminating"
        } else if has("Suspended") {
            "Suspended"
        } else if has("FailureTarget") {
            "FailureTarget"
        } else if has("SuccessCriteriaMet") {
            "SuccessCriteriaMet"
        } else {
            "Running"
        };
        let mut cells =
            vec![name_cell(&job.metadata), json!(state), json!(completions), json!(duration), age_cell(&job.metadata)];
        cells.extend(wide_cells(Some(&spec.template), Some(spec.selector.as_ref())));
        cells
    }
}

const CRON_JOB_MERGE_KEYS: &[MergeKey] =
    &pod_spec_merge_keys!("spec.jobTemplate.spec.template.spec.", merge("status.active", "uid"));
/// A CronJob's name is at most 52 characters: its Jobs add 11 (`-<minutes since 1970>`).
const MAX_CRON_JOB_NAME: usize = 52;

impl Kind for CronJobs {
    type Obj = CronJob;
    const INFO: ResourceInfo = ResourceInfo {
        group: "batch",
        version: "v1",
        kind: "CronJob",
        plural: "cronjobs",
        singular: "cronjob",
        namespaced: true,
        short_names: &["cj"],
        categories: &["all"],
        subresources: &[Subresource::Status],
        storage: "cronjobs.batch",
        return_deleted_object: false,
    };
    const GENERATION: bool = true;
    const MERGE_KEYS: &'static [MergeKey] = CRON_JOB_MERGE_KEYS;

    fn prepare_create(&self, cj: &mut CronJob) {
        cj.status = None;
        default_cron_job(&mut cj.spec);
    }

    fn prepare_update(&self, new: &mut CronJob, old: &CronJob) {
        new.status = old.status.clone();
        default_cron_job(&mut new.spec);
    }

    fn prepare_status_update(&self, new: &mut CronJob, old: &CronJob) {
        new.spec = old.spec.clone();
    }

    /// `ValidateCronJobCreate`.
    fn validate(&self, cj: &CronJob) -> ErrorList {
        let mut out = Vec::new();
        let name = cj.metadata.name.as_deref().unwrap_or_default();
        if name.len() > MAX_CRON_JOB_NAME {
            out.push(FieldError::invalid(
                "metadata.name",
                name,
                format!("must be no more than {MAX_CRON_JOB_NAME} characters"),
            ));
        }
        let spec = cj.spec.clone();
        let zone = spec.time_zone.as_deref();
        if let Some(z) = zone
            && let Err(e) = crate::cron::zone(z)
        {
            out.push(FieldError::invalid("spec.timeZone", z, e));
        }
        if spec.schedule.is_empty() {
            out.push(FieldError::required("spec.schedule", ""));
        } else if zone.is_some() && crate::cron::split_zone(&spec.schedule).0.is_some() {
            out.push(FieldError::invalid(
                "spec.schedule",
                &spec.schedule,
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        } else if let Err(e) =
            crate::cron::Schedule::parse(&spec.schedule, zone.filter(|z| crate::cron::zone(z).is_ok()))
        {
            out.push(FieldError::invalid("spec.schedule", &spec.schedule, e));
        }
        match spec.concurrency_policy.as_deref().unwrap_or_default() {
            "Allow" | "Forbid" | "Replace" => {}
            other => {
                out.push(FieldError::not_supported("spec.concurrencyPolicy", other, &["Allow", "Forbid", "Replace"]))
            }
        }
        non_negative(spec.starting_deadline_seconds, "spec.startingDeadlineSeconds", &mut out);
        non_negative(spec.successful_jobs_history_limit.map(i64::from), "spec.successfulJobsHistoryLimit", &mut out);
        non_negative(spec.failed_jobs_history_limit.map(i64::from), "spec.failedJobsHistoryLimit", &mut out);
        // `ValidateJobTemplateSpec`: the Jobs get generated selectors.
        let job = spec.job_template.spec.clone().unwrap_or_default();
        validate_spec_at(&job, "spec.jobTemplate.spec", &mut out);
        if job.selector.is_some() {
            out.push(FieldError::invalid(
                "spec.jobTemplate.spec.selector",
                "{...}",
                "`selector` will be auto-generated",
            ));
        }
        if job.manual_selector == Some(true) {
            out.push(FieldError::not_supported("spec.jobTemplate.spec.manualSelector", "true", &["nil", "false"]));
        }
        out
    }

    fn validate_update(&self, new: &CronJob, _old: &CronJob) -> ErrorList {
        self.validate(new).into_iter().filter(|e| e.field != "metadata.name").collect()
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![
            NAME_COLUMN,
            Column::new("Schedule", "string", "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
            Column::new(
                "Timezone",
                "string",
                "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones.",
            ),
            Column::new("Suspend", "boolean", "This flag tells the controller to suspend subsequent executions."),
            Column::new("Active", "integer", "A list of pointers to currently running jobs."),
            Column::new(
                "Last Schedule",
                "string",
                "Information when was the last time the job was successfully scheduled.",
            ),
            AGE_COLUMN,
        ];
        cols.extend(wide_columns(true));
        cols
    }

    fn cells(&self, cj: &CronJob) -> Vec<Value> {
        let spec = cj.spec.clone();
        let status = cj.status.clone().unwrap_or_default();
        let mut cells = vec![
            name_cell(&cj.metadata),
            json!(spec.schedule),
            json!(spec.time_zone.unwrap_or_else(|| "<none>".into())),
            json!(spec.suspend.unwrap_or(false)),
            json!(status.active.map_or(0, |a| a.len())),
            match &status.last_schedule_time {
                Some(t) => since_cell(Some(t)),
                None => json!("<none>"),
            },
            age_cell(&cj.metadata),
        ];
        let job = spec.job_template.spec.unwrap_or_default();
        cells.extend(wide_cells(Some(&job.template), Some(job.selector.as_ref())));
        cells
    }
}

/// `SetDefaults_CronJob`; the job template's pod template gets the pod defaults.
fn default_cron_job(spec: &mut CronJobSpec) {
    spec.concurrency_policy.get_or_insert_with(|| "Allow".into());
    spec.suspend.get_or_insert(false);
    spec.successful_jobs_history_limit.get_or_insert(3);
    spec.failed_jobs_history_limit.get_or_insert(1);
    if let Some(job) = spec.job_template.spec.as_mut() {
        default_template(&mut job.template);
    }
}

/// `SetDefaults_Job`.
fn default_job(spec: &mut JobSpec) {
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
        spec.parallelism = Some(1);
    }
    spec.parallelism.get_or_insert(1);
    let backoff = if spec.backoff_limit_per_index.is_some() { i32::MAX } else { 6 };
    spec.backoff_limit.get_or_insert(backoff);
    spec.completion_mode.get_or_insert_with(|| "NonIndexed".into());
    spec.suspend.get_or_insert(false);
    if let Some(policy) = &mut spec.pod_failure_policy {
        for rule in &mut policy.rules {
            for pattern in rule.on_pod_conditions.iter_mut().flatten() {
                if pattern.status.as_deref().is_none_or(str::is_empty) {
                    pattern.status = Some("True".into());
                }
            }
        }
    }
    let replacement = if spec.pod_failure_policy.is_some() { "Failed" } else { "TerminatingOrFailed" };
    spec.pod_replacement_policy.get_or_insert_with(|| replacement.into());
    spec.manual_selector.get_or_insert(false);
    default_template(&mut spec.template);
}

/// `generateSelector`: the template gets the Job's name and UID as labels (unless set), and the
/// selector selects the UID.
fn generate_selector(job: &mut Job) {
    let name = job.metadata.name.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let Some(spec) = job.spec.as_mut() else { return };
    let labels = spec.template.metadata.get_or_insert_with(Default::default).labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in [(LEGACY_JOB_NAME, &name), (JOB_NAME, &name), (LEGACY_CONTROLLER_UID, &uid), (CONTROLLER_UID, &uid)] {
        labels.entry(k.to_string()).or_insert_with(|| v.clone());
    }
    let selector = spec.selector.get_or_insert_with(LabelSelector::default);
    selector.match_labels.get_or_insert_with(BTreeMap::new).entry(CONTROLLER_UID.to_string()).or_insert(uid);
}

/// `ValidateJobSpec`, with the selector a Job must have.
fn validate_spec(spec: &JobSpec, out: &mut ErrorList) {
    validate_spec_at(spec, "spec", out);
    match &spec.selector {
        None => out.push(FieldError::required("spec.selector", "")),
        Some(s) => {
            super::pod_rules::validate_label_selector(Some(s), "spec.selector", out);
            let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
            if !selector_matches(Some(s), &labels) {
                out.push(FieldError::invalid_raw(
                    "spec.template.metadata.labels",
                    go_map(&labels),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
}

/// `validateJobSpec` of the spec at `path` (a Job's, or a CronJob's job template's).
fn validate_spec_at(spec: &JobSpec, path: &str, out: &mut ErrorList) {
    let at = |field: &str| format!("{path}.{field}");
    non_negative(spec.parallelism.map(i64::from), &at("parallelism"), out);
    non_negative(spec.completions.map(i64::from), &at("completions"), out);
    non_negative(spec.active_deadline_seconds, &at("activeDeadlineSeconds"), out);
    non_negative(spec.backoff_limit.map(i64::from), &at("backoffLimit"), out);
    non_negative(spec.ttl_seconds_after_finished.map(i64::from), &at("ttlSecondsAfterFinished"), out);
    let indexed = match spec.completion_mode.as_deref().unwrap_or("NonIndexed") {
        "NonIndexed" => false,
        "Indexed" => true,
        other => {
            out.push(FieldError::not_supported(at("completionMode"), other, &["NonIndexed", "Indexed"]));
            false
        }
    };
    if indexed {
        match spec.completions {
            None => out.push(FieldError::required(at("completions"), "when completion mode is Indexed")),
            Some(c) if c > MAX_INDEXED => out.push(FieldError::invalid_raw(
                at("completions"),
                c,
                format!("must be less than or equal to {MAX_INDEXED} when completion mode is Indexed"),
            )),
            Some(_) => {}
        }
        if let Some(p) = spec.parallelism
            && p > MAX_INDEXED
        {
            out.push(FieldError::invalid_raw(
                at("parallelism"),
                p,
                format!("must be less than or equal to {MAX_INDEXED} when completion mode is Indexed"),
            ));
        }
    }
    super::job_policies::validate(spec, path, out);
    validate_template(&spec.template, &at("template"), out);
    let restart = spec.template.spec.as_ref().and_then(|s| s.restart_policy.clone()).unwrap_or_default();
    if restart != "OnFailure" && restart != "Never" {
        out.push(FieldError::not_supported(at("template.spec.restartPolicy"), restart, &["OnFailure", "Never"]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(v: Value) -> Job {
        let mut j: Job = serde_json::from_value(v).unwrap();
        j.metadata.uid = Some("u1".into());
        Jobs.prepare_create(&mut j);
        j
    }

    #[test]
    fn jobs_get_a_generated_selector_and_defaults() {
        let j = job(json!({"metadata": {"name": "pi"}, "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}}));
        let spec = j.spec.as_ref().unwrap();
        assert_eq!((spec.completions, spec.parallelism, spec.backoff_limit), (Some(1), Some(1), Some(6)));
        assert_eq!(spec.completion_mode.as_deref(), Some("NonIndexed"));
        let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels.get(CONTROLLER_UID).map(String::as_str), Some("u1"));
        assert_eq!(labels.get(JOB_NAME).map(String::as_str), Some("pi"));
        assert_eq!(j.metadata.labels.as_ref().and_then(|l| l.get("job-name")).map(String::as_str), Some("pi"));
        assert!(Jobs.validate(&j).is_empty(), "{:?}", Jobs.validate(&j));
    }

    #[test]
    fn job_errors_are_upstreams() {
        let j = job(json!({"metadata": {"name": "pi"}, "spec": {"completionMode": "Indexed", "parallelism": -1,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "busybox"}]}}}}));
        let errs: Vec<String> = Jobs.validate(&j).iter().map(|e| format!("{}: {}", e.field, e.detail)).collect();
        for want in [
            "spec.parallelism: Invalid value: -1",
            "spec.completions: when completion mode is Indexed",
            "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\"",
            "spec.selector: Invalid value",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(want)), "{want} not in {errs:?}");
        }
        let ok = job(json!({"metadata": {"name": "pi"}, "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}}));
        let mut changed = ok.clone();
        changed.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].image = Some("other".into());
        let errs = Jobs.validate_update(&changed, &ok);
        assert!(errs.iter().any(|e| e.field == "spec.template" && e.detail.contains("field is immutable")));
    }
}
