//! Recording core/v1 Events for in-process components (scheduler, node agent, controllers), the way
//! client-go's recorder does: asynchronous and best effort, through client-go's `EventCorrelator`:
//! - repeats of one event are one object whose `count` and `lastTimestamp` advance (its event log);
//! - the 10th different message of one reason about one object within 10 minutes becomes one
//!   `(combined from similar events): ...` Event that later ones count into (its aggregator);
//! - each object gets 25 writes at once, then one per 5 minutes (its spam filter). Held-back
//!   occurrences are counted, and the next write carries their count.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Client, Resource as _};
use lru::LruCache;
use serde_json::json;
use tokio::sync::mpsc;

/// Events waiting to be written; more are dropped, as client-go's broadcaster drops them.
const QUEUE: usize = 1000;
/// Memory of each part of the correlator: the most recent keys (client-go's LRU size).
const REMEMBERED: usize = 4096;
/// Writes issued together.
const BATCH: usize = 64;
/// Different messages of one reason about one object that are combined into one Event, and the
/// window they count in (client-go's `defaultAggregateMaxEvents`, `defaultAggregateIntervalInSeconds`).
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// What a combined Event's message starts with.
const COMBINED: &str = "(combined from similar events): ";
/// Writes about one object at once, and the time it takes to earn one more (client-go's
/// `defaultSpamBurst` and `defaultSpamQPS` of 1/300).
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);

/// The object an event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    /// The reference to a typed object.
    pub fn of<K: k8s_openapi::Resource + kube::Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        ObjectRef {
            kind: K::KIND,
            api_version: K::API_VERSION,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What makes two events the same Event object. A combined event's `message` is empty: every
/// message of its reason counts into it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    object: ObjectRef,
    kind: EventType,
    reason: String,
    message: String,
}

/// One occurrence as the correlator passes it on: which Event it counts into, and what to write.
#[derive(Debug, PartialEq)]
struct Occurrence {
    key: Key,
    message: String,
}

/// The different messages seen of one reason about one object.
struct Similar {
    messages: HashSet<String>,
    last: Instant,
}

/// A token bucket per object.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// client-go's `EventCorrelator` less its event log (the writer keeps the counts).
struct Correlator {
    similar: LruCache<(ObjectRef, EventType, String), Similar>,
    buckets: LruCache<ObjectRef, Bucket>,
}

impl Correlator {
    fn new() -> Self {
        let size = NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN);
        Correlator { similar: LruCache::new(size), buckets: LruCache::new(size) }
    }

    /// client-go's `EventAggregate`: the occurrence, combined once its reason has shown
    /// `AGGREGATE_MAX_EVENTS` different messages about its object within the interval.
    fn aggregate(&mut self, key: Key, now: Instant) -> Occurrence {
        let group = (key.object.clone(), key.kind, key.reason.clone());
        let similar = self.similar.get_or_insert_mut(group, || Similar { messages: HashSet::new(), last: now });
        if now.duration_since(similar.last) > AGGREGATE_INTERVAL {
            similar.messages.clear();
        }
        similar.last = now;
        similar.messages.insert(key.message.clone());
        if similar.messages.len() < AGGREGATE_MAX_EVENTS {
            return Occurrence { message: key.message.clone(), key };
        }
        // As upstream, one remembered message is let go, so the set stays bounded.
        if let Some(any) = similar.messages.iter().next().cloned() {
            similar.messages.remove(&any);
        }
        let message = format!("{COMBINED}{}", key.message);
        Occurrence { key: Key { message: String::new(), ..key }, message }
    }

    /// client-go's `EventSourceObjectSpamFilter`: whether a write about `object` may go now.
    fn allow(&mut self, object: &ObjectRef, now: Instant) -> bool {
        let bucket = self.buckets.get_or_insert_mut(object.clone(), || Bucket { tokens: SPAM_BURST, at: now });
        let earned = now.duration_since(bucket.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + earned).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }
}

/// What was written of one Event, and what waits to be.
#[derive(Clone)]
struct Recorded {
    /// The Event's name once created.
    name: Option<String>,
    /// The count the Event has in the API.
    written: u64,
    /// Occurrences not written yet.
    pending: u64,
    message: String,
    action: &'static str,
}

/// Hands events to a background writer; cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<(Key, &'static str)>,
}

impl Recorder {
    /// Starts the writer for `component` (e.g. `default-scheduler`), reporting from `host`.
    pub fn spawn(client: Client, component: String, host: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let size = NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN);
        let writer = Writer { client, component, host, correlator: Correlator::new(), seen: LruCache::new(size) };
        tokio::spawn(writer.run(rx));
        Recorder { tx }
    }

    /// A recorder whose events go nowhere (unit tests).
    #[cfg(test)]
    pub fn discarding() -> Self {
        Recorder { tx: mpsc::channel(1).0 }
    }

    /// Records an event; never blocks. `action` is what the component was doing (`Scheduling`).
    pub fn record(&self, object: ObjectRef, kind: EventType, reason: &str, action: &'static str, message: String) {
        let key = Key { object, kind, reason: reason.to_string(), message };
        if self.tx.try_send((key, action)).is_err() {
            tracing::debug!("event queue full; dropping an event");
        }
    }
}

struct Writer {
    client: Client,
    component: String,
    host: String,
    correlator: Correlator,
    /// client-go's event log: what was written of each Event.
    seen: LruCache<Key, Recorded>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<(Key, &'static str)>) {
        let mut batch = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut batch, BATCH).await > 0 {
            let now = Instant::now();
            // Every occurrence is counted. Repeats within one batch become one write, and the spam
            // filter meters writes (upstream meters occurrences, each its own write): so a burst of
            // repeats is one Event with its full count, not one stopped at the burst size.
            let mut due: Vec<Key> = Vec::new();
            for (key, action) in batch.drain(..) {
                let Occurrence { key, message } = self.correlator.aggregate(key, now);
                let blank = || Recorded { name: None, written: 0, pending: 0, message: String::new(), action };
                let entry = self.seen.get_or_insert_mut(key.clone(), blank);
                entry.pending += 1;
                (entry.message, entry.action) = (message, action);
                if !due.contains(&key) && self.correlator.allow(&key.object, now) {
                    due.push(key);
                }
            }
            let jobs: Vec<_> = due.into_iter().filter_map(|key| Some((self.seen.peek(&key)?.clone(), key))).collect();
            let this = &self;
            let writes = jobs.into_iter().map(|(recorded, key)| async move {
                let name = this.write(&key, &recorded).await;
                (key, recorded.pending, name)
            });
            let results = futures::future::join_all(writes).await;
            for (key, sent, name) in results {
                match (name, self.seen.get_mut(&key)) {
                    (Some(name), Some(entry)) => {
                        entry.name = Some(name);
                        entry.written += sent;
                        entry.pending -= sent.min(entry.pending);
                    }
                    _ => {
                        self.seen.pop(&key);
                    }
                }
            }
        }
    }

    /// Sends a write and checks its outcome. The answer is not decoded into an Event: nothing here
    /// needs it, and decoding it was a measurable part of what each bound pod costs the scheduler.
    async fn send(&self, request: Result<http::Request<Vec<u8>>, kube::core::request::Error>) -> kube::Result<()> {
        let request = request.map_err(kube::Error::BuildRequest)?;
        self.client.request_text(request).await.map(drop)
    }

    /// Creates the event, or counts into the existing one; its name, `None` when nothing could be
    /// written.
    async fn write(&self, key: &Key, recorded: &Recorded) -> Option<String> {
        // Events about cluster-scoped objects (nodes) go to `default`, as client-go's recorder puts them.
        let ns = Some(key.object.namespace.as_str()).filter(|n| !n.is_empty()).unwrap_or("default");
        let events = Request::new(Event::url_path(&(), Some(ns)));
        let now = Timestamp::now();
        let count = recorded.written + recorded.pending;
        if let Some(name) = &recorded.name {
            let patch = json!({"count": count, "lastTimestamp": Time(now), "message": recorded.message});
            match self.send(events.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(()) => return Some(name.clone()),
                // Expired or deleted meanwhile: start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::debug!("updating event {ns}/{name}: {e}");
                    return None;
                }
            }
        }
        let o = &key.object;
        let name = format!("{}.{:x}", o.name, Utc::now().timestamp_nanos_opt().unwrap_or_default());
        let event = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(ns.into()), ..Default::default() },
            involved_object: ObjectReference {
                kind: Some(o.kind.into()),
                api_version: Some(o.api_version.into()),
                namespace: Some(o.namespace.clone()),
                name: Some(o.name.clone()),
                uid: Some(o.uid.clone()),
                ..Default::default()
            },
            reason: Some(key.reason.clone()),
            message: Some(recorded.message.clone()),
            type_: Some(key.kind.as_str().into()),
            source: Some(EventSource { component: Some(self.component.clone()), host: Some(self.host.clone()) }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(i32::try_from(count).unwrap_or(i32::MAX)),
            action: Some(recorded.action.into()),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(format!("{}-{}", self.component, self.host)),
            ..Default::default()
        };
        let body = serde_json::to_vec(&event).ok()?;
        match self.send(events.create(&PostParams::default(), body)).await {
            Ok(()) => Some(name),
            Err(e) => {
                // A namespace being deleted refuses new events; nothing to do about it.
                tracing::debug!("recording event {:?} for {}/{}: {e}", key.reason, o.namespace, o.name);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::registry::ListOptions;

    fn pod(name: &str) -> ObjectRef {
        ObjectRef { kind: "Pod", api_version: "v1", namespace: "default".into(), name: name.into(), uid: "u1".into() }
    }

    /// The Events in `default`, as stored.
    fn events_in_default(registry: &crate::registry::Registry) -> Vec<serde_json::Value> {
        let events = registry.find("", "v1", "events").unwrap();
        let page = registry.list(&events, Some("default"), &ListOptions::default()).unwrap();
        page.items.iter().map(|b| serde_json::from_slice(b).unwrap()).collect()
    }

    fn key(object: ObjectRef, message: &str) -> Key {
        Key { object, kind: EventType::Warning, reason: "FailedMount".into(), message: message.into() }
    }

    #[test]
    fn the_tenth_different_message_of_a_reason_is_combined() {
        let mut c = Correlator::new();
        let now = Instant::now();
        for i in 0..9 {
            let seen = c.aggregate(key(pod("p"), &format!("volume {i} missing")), now);
            assert_eq!(
                seen,
                Occurrence { key: key(pod("p"), &format!("volume {i} missing")), message: seen.message.clone() }
            );
            assert_eq!(seen.message, format!("volume {i} missing"));
        }
        // A repeat is not a different message.
        assert_eq!(c.aggregate(key(pod("p"), "volume 0 missing"), now).message, "volume 0 missing");
        let tenth = c.aggregate(key(pod("p"), "volume 9 missing"), now);
        assert_eq!(tenth.message, "(combined from similar events): volume 9 missing");
        assert_eq!(tenth.key, key(pod("p"), ""));
        // Later ones count into the same combined Event.
        assert_eq!(c.aggregate(key(pod("p"), "volume 10 missing"), now).key, key(pod("p"), ""));
        // Another object, or another reason, is apart.
        assert_eq!(c.aggregate(key(pod("q"), "volume 10 missing"), now).message, "volume 10 missing");
        // Once the interval has passed quietly, messages stand alone again.
        let later = now + AGGREGATE_INTERVAL + Duration::from_secs(1);
        assert_eq!(c.aggregate(key(pod("p"), "volume 11 missing"), later).message, "volume 11 missing");
    }

    #[test]
    fn an_object_gets_25_writes_then_one_per_5_minutes() {
        let mut c = Correlator::new();
        let now = Instant::now();
        assert!((0..25).all(|_| c.allow(&pod("p"), now)));
        assert!(!c.allow(&pod("p"), now));
        assert!(c.allow(&pod("q"), now), "another object has its own budget");
        assert!(!c.allow(&pod("p"), now + Duration::from_secs(299)));
        assert!(c.allow(&pod("p"), now + Duration::from_secs(300)));
        assert!(!c.allow(&pod("p"), now + Duration::from_secs(301)));
        // A long quiet spell refills the burst, no more.
        let much_later = now + Duration::from_secs(300 * 100);
        assert!((0..25).all(|_| c.allow(&pod("p"), much_later)));
        assert!(!c.allow(&pod("p"), much_later));
    }

    #[tokio::test]
    async fn a_hundred_repeats_are_one_event_with_count_100() {
        let (_dir, registry, client) = crate::client::for_tests().await;
        let rec = Recorder::spawn(client, "kubelet".into(), "node1".into());
        let list = || events_in_default(&registry);
        for _ in 0..100 {
            rec.record(
                pod("p"),
                EventType::Warning,
                "BackOff",
                "Syncing",
                "Back-off restarting failed container".into(),
            );
        }
        for _ in 0..250 {
            if list().first().is_some_and(|e| e["count"] == 100) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = list();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0]["count"], 100, "{all:?}");
    }

    #[tokio::test]
    async fn repeats_aggregate_into_one_event() {
        let (_dir, registry, client) = crate::client::for_tests().await;
        let rec = Recorder::spawn(client, "default-scheduler".into(), "node1".into());
        let object = pod("p");
        let list = || events_in_default(&registry);
        for round in 0..3 {
            rec.record(object.clone(), EventType::Warning, "FailedScheduling", "Scheduling", "no room".into());
            // Wait for this round to be written before the next one.
            for _ in 0..100 {
                if list().first().is_some_and(|e| e["count"] == round + 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        rec.record(
            object.clone(),
            EventType::Normal,
            "Scheduled",
            "Binding",
            "Successfully assigned default/p to n".into(),
        );
        for _ in 0..100 {
            if list().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = list();
        assert_eq!(all.len(), 2, "{all:?}");
        let failed = all.iter().find(|e| e["reason"] == "FailedScheduling").unwrap();
        assert_eq!(failed["count"], 3);
        assert_eq!(failed["type"], "Warning");
        assert_eq!(failed["source"]["component"], "default-scheduler");
        assert_eq!(failed["involvedObject"]["uid"], "u1");
        assert!(failed["lastTimestamp"].as_str() >= failed["firstTimestamp"].as_str());
    }
}
