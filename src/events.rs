//! Recording core/v1 Events for in-process components (scheduler, node agent), the way client-go's
//! recorder does: asynchronous and best effort, with repeats of the same event aggregated into one
//! object whose `count` and `lastTimestamp` advance.

use std::num::NonZeroUsize;

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
/// Aggregation memory: the most recent distinct events (client-go's LRU size).
const REMEMBERED: usize = 4096;
/// Writes issued together.
const BATCH: usize = 64;

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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    object: ObjectRef,
    kind: EventType,
    reason: String,
    message: String,
}

struct Recorded {
    name: String,
    count: u64,
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
        tokio::spawn(
            Writer {
                client,
                component,
                host,
                seen: LruCache::new(NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN)),
            }
            .run(rx),
        );
        Recorder { tx }
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
    seen: LruCache<Key, Recorded>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<(Key, &'static str)>) {
        let mut batch = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut batch, BATCH).await > 0 {
            // Repeats within one batch become one write.
            let mut merged: Vec<(Key, &'static str, u64)> = Vec::new();
            for (key, action) in batch.drain(..) {
                match merged.iter_mut().find(|(k, _, _)| *k == key) {
                    Some(m) => m.2 += 1,
                    None => merged.push((key, action, 1)),
                }
            }
            let jobs: Vec<_> = merged
                .into_iter()
                .map(|(key, action, n)| {
                    let prior = self.seen.get(&key).map(|r| (r.name.clone(), r.count));
                    (key, action, n, prior)
                })
                .collect();
            let this = &self;
            let writes = jobs.into_iter().map(|(key, action, n, prior)| async move {
                let result = this.write(&key, action, n, prior).await;
                (key, result)
            });
            let results = futures::future::join_all(writes).await;
            for (key, result) in results {
                match result {
                    Some(recorded) => {
                        self.seen.put(key, recorded);
                    }
                    None => {
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

    /// Creates the event, or bumps the existing one. `None` when nothing could be written.
    async fn write(&self, key: &Key, action: &str, n: u64, prior: Option<(String, u64)>) -> Option<Recorded> {
        // Events about cluster-scoped objects (nodes) go to `default`, as client-go's recorder puts them.
        let ns = Some(key.object.namespace.as_str()).filter(|n| !n.is_empty()).unwrap_or("default");
        let events = Request::new(Event::url_path(&(), Some(ns)));
        let now = Timestamp::now();
        if let Some((name, count)) = prior {
            let patch = json!({"count": count + n, "lastTimestamp": Time(now)});
            match self.send(events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(()) => return Some(Recorded { name, count: count + n }),
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
            message: Some(key.message.clone()),
            type_: Some(key.kind.as_str().into()),
            source: Some(EventSource { component: Some(self.component.clone()), host: Some(self.host.clone()) }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(i32::try_from(n).unwrap_or(i32::MAX)),
            action: Some(action.into()),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(format!("{}-{}", self.component, self.host)),
            ..Default::default()
        };
        let body = serde_json::to_vec(&event).ok()?;
        match self.send(events.create(&PostParams::default(), body)).await {
            Ok(()) => Some(Recorded { name, count: n }),
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

    #[tokio::test]
    async fn repeats_aggregate_into_one_event() {
        let (_dir, registry, client) = crate::client::for_tests().await;
        let rec = Recorder::spawn(client, "default-scheduler".into(), "node1".into());
        let pod = ObjectRef {
            kind: "Pod",
            api_version: "v1",
            namespace: "default".into(),
            name: "p".into(),
            uid: "u1".into(),
        };
        let events = registry.find("", "v1", "events").unwrap();
        let list = || {
            let page = registry.list(&events, Some("default"), &ListOptions::default()).unwrap();
            page.items.iter().map(|b| serde_json::from_slice::<serde_json::Value>(b).unwrap()).collect::<Vec<_>>()
        };
        for round in 0..3 {
            rec.record(pod.clone(), EventType::Warning, "FailedScheduling", "Scheduling", "no room".into());
            // Wait for this round to be written before the next one.
            for _ in 0..100 {
                if list().first().is_some_and(|e| e["count"] == round + 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        rec.record(
            pod.clone(),
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
