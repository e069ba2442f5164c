//! Events expire an hour after they were last seen (kube-apiserver's `--event-ttl`, which it keeps
//! as an etcd lease): each Event is requeued for the moment it expires, and deleted then.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};

/// kube-apiserver's `--event-ttl` default.
pub const EVENT_TTL: Duration = Duration::from_secs(3600);

pub struct EventTtl {
    pub client: Client,
    pub ttl: Duration,
}

pub fn controller(client: &Client) -> Controller<Event> {
    Controller::new(Api::all(client.clone()), watcher::Config::default())
}

/// When an event was last written: its newest timestamp of any kind.
fn last_seen(e: &Event) -> Option<Timestamp> {
    [
        e.last_timestamp.as_ref().map(|t| t.0),
        e.event_time.as_ref().map(|t| t.0),
        e.first_timestamp.as_ref().map(|t| t.0),
        e.series.as_ref().and_then(|s| s.last_observed_time.as_ref()).map(|t| t.0),
        e.metadata.creation_timestamp.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// How long `e` has left at `now`, or `None` once it has expired.
fn remaining(e: &Event, ttl: Duration, now: Timestamp) -> Option<Duration> {
    let Some(last) = last_seen(e) else { return Some(ttl) };
    let age = Duration::try_from(now.duration_since(last)).unwrap_or_default();
    ttl.checked_sub(age).filter(|d| !d.is_zero())
}

impl Reconciler for EventTtl {
    type Object = Event;
    const NAME: &'static str = "event-ttl";

    async fn reconcile(&self, event: Arc<Event>) -> Result<Action, Error> {
        if let Some(left) = remaining(&event, self.ttl, Timestamp::now()) {
            return Ok(Action::requeue(left));
        }
        let events: Api<Event> = Api::namespaced(self.client.clone(), &event.namespace().unwrap_or_default());
        match events.delete(&event.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn an_event_lives_an_hour_from_when_it_was_last_seen() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let at = |s: &str| Some(Time(s.parse().unwrap()));
        let mut e = Event { first_timestamp: at("2026-01-01T10:00:00Z"), ..Default::default() };
        assert_eq!(remaining(&e, EVENT_TTL, now), None);
        // Seen again since: the newest time counts.
        e.last_timestamp = at("2026-01-01T11:30:00Z");
        assert_eq!(remaining(&e, EVENT_TTL, now), Some(Duration::from_secs(1800)));
        assert_eq!(remaining(&Event::default(), EVENT_TTL, now), Some(EVENT_TTL));
    }
}
