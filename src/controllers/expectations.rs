//! What a controller is waiting to see in its cache after its own creates and deletes (upstream's
//! `UIDTrackingControllerExpectations`): until the cache shows them, another sync would count
//! pods that are already on their way and create or delete too many. Checked against the cache
//! itself, by name and UID, so a missed watch event cannot leave a controller waiting forever;
//! expectations older than five minutes are dropped, as upstream.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;

use super::informer::Cache;

/// Upstream's `ExpectationsTimeout`.
const TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Default)]
struct Pending {
    /// Names of objects created but not yet seen.
    creates: HashSet<String>,
    /// Names and UIDs of objects deleted but still seen.
    deletes: HashSet<(String, String)>,
    since: Option<Instant>,
}

/// Pending creates and deletes per controller (keyed `namespace/name`).
#[derive(Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `name` was created for `key`.
    pub fn created(&self, key: &str, name: String) {
        let mut all = self.lock();
        let p = all.entry(key.to_string()).or_default();
        p.since.get_or_insert_with(Instant::now);
        p.creates.insert(name);
    }

    /// Records that the object `name` with `uid` was deleted for `key`.
    pub fn deleted(&self, key: &str, name: String, uid: String) {
        let mut all = self.lock();
        let p = all.entry(key.to_string()).or_default();
        p.since.get_or_insert_with(Instant::now);
        p.deletes.insert((name, uid));
    }

    /// Forgets the delete of `name` with `uid`, which failed (upstream's `DeletionObserved` on a
    /// failed delete): the next sync is not held up waiting for it.
    pub fn delete_failed(&self, key: &str, name: &str, uid: &str) {
        if let Some(p) = self.lock().get_mut(key) {
            p.deletes.retain(|(n, u)| n != name || u != uid);
        }
    }

    /// Whether every create and delete of `key` shows in the cache: `seen(name)` tells whether an
    /// object of that name is cached, `live(name, uid)` whether that one still is (and is not
    /// being deleted). Settled expectations are forgotten.
    pub fn satisfied(&self, key: &str, seen: impl Fn(&str) -> bool, live: impl Fn(&str, &str) -> bool) -> bool {
        let mut all = self.lock();
        let Some(p) = all.get_mut(key) else { return true };
        p.creates.retain(|n| !seen(n));
        p.deletes.retain(|(n, u)| live(n, u));
        let expired = p.since.is_some_and(|t| t.elapsed() > TIMEOUT);
        if expired && !(p.creates.is_empty() && p.deletes.is_empty()) {
            tracing::warn!("{key}: gave up waiting to see its own creates and deletes after 5 minutes");
        }
        if expired || (p.creates.is_empty() && p.deletes.is_empty()) {
            all.remove(key);
            return true;
        }
        false
    }

    /// [`Self::satisfied`] for pods of namespace `ns`, seen in `pods`.
    pub fn satisfied_in(&self, key: &str, pods: &Cache<Pod>, ns: &str) -> bool {
        let cached = |name: &str| pods.get(&ObjectRef::new(name).within(ns));
        self.satisfied(
            key,
            |name| cached(name).is_some(),
            |name, uid| {
                cached(name).is_some_and(|p| p.uid().as_deref() == Some(uid) && p.metadata.deletion_timestamp.is_none())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_settle_when_the_cache_shows_them() {
        let e = Expectations::default();
        assert!(e.satisfied("ns/a", |_| false, |_, _| true), "nothing expected");
        e.created("ns/a", "a-1".into());
        e.deleted("ns/a", "a-2".into(), "u2".into());
        assert!(!e.satisfied("ns/a", |_| false, |_, _| true));
        assert!(!e.satisfied("ns/a", |n| n == "a-1", |_, _| true), "the delete is still pending");
        assert!(e.satisfied("ns/a", |_| false, |_, _| false), "the create was seen before, the delete now");
        e.deleted("ns/a", "a-3".into(), "u3".into());
        assert!(!e.satisfied("ns/a", |_| true, |_, _| true));
        e.delete_failed("ns/a", "a-3", "u3");
        assert!(e.satisfied("ns/a", |_| true, |_, _| true), "a failed delete is not waited for");
        assert!(e.satisfied("ns/a", |_| false, |_, _| true), "settled expectations are forgotten");
    }
}
