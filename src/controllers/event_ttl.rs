//! Events expire an hour after they were last seen (kube-apiserver's `--event-ttl`).
//!
//! Upstream this is not a controller: etcd drops each Event when its lease runs out. Here it is a
//! sweep every few minutes through the client, listing Events page by page and deleting the expired
//! ones. A reconciler per Event (a watch and a cached copy of every Event) was measured to cost the
//! scheduler a fifth of its throughput when every bound pod records `Scheduled`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

/// kube-apiserver's `--event-ttl` default.
pub const EVENT_TTL: Duration = Duration::from_secs(3600);
/// How often expired events are looked for.
const SWEEP: Duration = Duration::from_secs(300);
/// Events read per list call.
const PAGE: u32 = 500;

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

/// Whether `e` has outlived `ttl` at `now`.
fn expired(e: &Event, ttl: Duration, now: Timestamp) -> bool {
    last_seen(e).is_some_and(|last| Duration::try_from(now.duration_since(last)).is_ok_and(|age| age >= ttl))
}

/// Sweeps until `shutdown`; a sweep that fails is logged and the next one tried.
pub async fn run(client: Client, ttl: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = sweep(&client, ttl).await {
            tracing::warn!("event-ttl: {e}; trying again in {SWEEP:?}");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP) => {}
        }
    }
}

async fn sweep(client: &Client, ttl: Duration) -> Result<(), kube::Error> {
    let all: Api<Event> = Api::all(client.clone());
    let now = Timestamp::now();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = all.list(&params).await?;
        for event in page.items.iter().filter(|e| expired(e, ttl, now)) {
            let events: Api<Event> = Api::namespaced(client.clone(), &event.namespace().unwrap_or_default());
            match events.delete(&event.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
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
        assert!(expired(&e, EVENT_TTL, now));
        // Seen again since: the newest time counts.
        e.last_timestamp = at("2026-01-01T11:30:00Z");
        assert!(!expired(&e, EVENT_TTL, now));
        assert!(!expired(&Event::default(), EVENT_TTL, now));
    }
}
