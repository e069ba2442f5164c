//! Finished Jobs with `ttlSecondsAfterFinished` are deleted that long after they finished, with
//! their pods (upstream's ttl-after-finished controller: foreground deletion, UID precondition).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};

pub struct TtlAfterFinished {
    pub client: Client,
}

pub fn controller(client: &Client) -> Controller<Job> {
    Controller::new(Api::all(client.clone()), watcher::Config::default())
}

/// When the Job finished: its Complete or Failed condition's transition.
fn finished_at(job: &Job) -> Option<Timestamp> {
    job.status.as_ref()?.conditions.iter().flatten().find_map(|c| {
        (matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
            .then(|| c.last_transition_time.as_ref().map(|t| t.0))
            .flatten()
    })
}

impl Reconciler for TtlAfterFinished {
    type Object = Job;
    const NAME: &'static str = "ttl-after-finished";

    async fn reconcile(&self, job: Arc<Job>) -> Result<Action, Error> {
        let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
        let (Some(ttl), Some(at)) = (ttl, finished_at(&job)) else { return Ok(Action::await_change()) };
        if job.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let due = at + SignedDuration::from_secs(i64::from(ttl));
        let now = Timestamp::now();
        if due > now {
            return Ok(Action::requeue(due.duration_since(now).unsigned_abs().max(Duration::from_millis(100))));
        }
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions { uid: job.uid(), resource_version: None }),
            ..DeleteParams::default()
        };
        tracing::info!("deleting job {}/{}: finished {ttl} s ago", job.namespace().unwrap_or_default(), job.name_any());
        match jobs.delete(&job.name_any(), &params).await {
            Ok(_) => Ok(Action::await_change()),
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(Action::await_change()),
            Err(e) => Err(e.into()),
        }
    }
}
