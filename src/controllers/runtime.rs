//! The one controller pattern, kube-controller-manager's, through kube-runtime's `Controller`: a
//! reflector cache fed by the list → watch → relist-on-410 loop, triggers from the main kind and any
//! related kind, requests for one object merged while it waits, one reconcile per object at a time,
//! and a failed reconcile retried with upstream's per-item exponential backoff.
//!
//! A controller is a [`Reconciler`] (what to do for one object) and the `Controller` that says when
//! (what it watches). The smallest one, to copy, is `serviceaccount.rs`.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::Resource;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// What goes wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("discovering the served resources: {0}")]
    Discovery(#[source] kube::Error),
    /// Something besides the API failed (a CSI driver's call); the message says what.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    /// What went wrong in words for a person: the API's own message when it answered.
    pub fn message(&self) -> String {
        match self {
            Error::Api(e) => api_message(e),
            other => other.to_string(),
        }
    }

    /// The API's status code, when the API answered with one.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }
}

/// The message of an API error as the API gave it (for events and conditions).
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Brings one object to its wanted state. Called again when it changes (or a related object
/// does), after the `Action`'s requeue, or after a backoff when it failed.
pub trait Reconciler: Send + Sync + 'static {
    type Object: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static;
    /// The controller's name in logs (upstream's, where there is one).
    const NAME: &'static str;
    fn reconcile(&self, obj: Arc<Self::Object>) -> impl Future<Output = Result<Action, Error>> + Send;
    /// Waits until the caches it reads besides its own kind's are filled (client-go's
    /// `WaitForCacheSync`; kube-runtime waits for the main kind's only). A reconcile on a
    /// half-filled pod cache would create pods that already exist. False when a watch has
    /// stopped (shutdown): the reconcile is skipped.
    fn synced(&self) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }
}

/// Upstream's `DefaultControllerRateLimiter` per-item part: 5 ms, doubled per consecutive failure, at
/// most 1000 s.
pub fn backoff(failures: u32) -> Duration {
    const BASE: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1000);
    BASE.saturating_mul(1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX)).min(MAX)
}

struct Ctx<R: Reconciler> {
    reconciler: R,
    /// Consecutive failures per object, forgotten on success or once the object is gone.
    failures: Mutex<HashMap<ObjectRef<R::Object>, u32>>,
}

impl<R: Reconciler> Ctx<R> {
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<R::Object>, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `reconciler` on what `controller` watches until `shutdown` (reconciles in flight finish).
pub async fn run<R: Reconciler>(controller: Controller<R::Object>, reconciler: R, shutdown: CancellationToken) {
    let ctx = Arc::new(Ctx { reconciler, failures: Mutex::new(HashMap::new()) });
    let results =
        controller.graceful_shutdown_on(shutdown.cancelled_owned()).run(reconcile::<R>, error_policy::<R>, ctx.clone());
    results
        .for_each(|result| {
            match result {
                Ok(_) => {}
                // A retry for an object deleted meanwhile.
                Err(controller::Error::ObjectNotFound(gone)) => {
                    ctx.failures().retain(|key, _| key.name != gone.name || key.namespace != gone.namespace);
                }
                // Failed reconciles are logged by the error policy.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                // The watch fails while the API is away; the watcher retries with backoff.
                Err(e) => tracing::debug!("{} controller: {e}", R::NAME),
            }
            std::future::ready(())
        })
        .await;
}

async fn reconcile<R: Reconciler>(obj: Arc<R::Object>, ctx: Arc<Ctx<R>>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(&*obj);
    if !ctx.reconciler.synced().await {
        return Ok(Action::await_change());
    }
    let result = ctx.reconciler.reconcile(obj).await;
    if result.is_ok() {
        ctx.failures().remove(&key);
    }
    result
}

fn error_policy<R: Reconciler>(obj: Arc<R::Object>, error: &Error, ctx: Arc<Ctx<R>>) -> Action {
    let key = ObjectRef::from_obj(&*obj);
    let mut failures = ctx.failures();
    let count = failures.entry(key.clone()).or_default();
    *count += 1;
    let delay = backoff(*count);
    // A conflict is someone else's newer write, and a 404 mostly an object deleted meanwhile (the
    // retry finds it gone): retried, not worth a warning.
    if matches!(error.code(), Some(409 | 404)) {
        tracing::debug!("{} controller: {key}: {error}; retrying in {delay:?}", R::NAME);
    } else {
        tracing::warn!("{} controller: {key}: {error}; retrying in {delay:?}", R::NAME);
    }
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
    use kube::runtime::watcher;
    use kube::{Api, ResourceExt as _};

    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_1000s() {
        assert_eq!(backoff(1), Duration::from_millis(5));
        assert_eq!(backoff(2), Duration::from_millis(10));
        assert_eq!(backoff(4), Duration::from_millis(40));
        assert_eq!(backoff(19), Duration::from_secs(1000));
        assert_eq!(backoff(200), Duration::from_secs(1000));
    }

    /// When each object was reconciled, and the most reconciles of one object ever running at once.
    #[derive(Default)]
    struct Probe {
        calls: Mutex<BTreeMap<String, Vec<Instant>>>,
        in_flight: Mutex<BTreeMap<String, usize>>,
        most_in_flight: AtomicUsize,
    }

    struct Flaky(Arc<Probe>);

    impl Reconciler for Flaky {
        type Object = ConfigMap;
        const NAME: &'static str = "test";

        async fn reconcile(&self, cm: Arc<ConfigMap>) -> Result<Action, Error> {
            let probe = &self.0;
            let name = cm.name_any();
            let running = {
                let mut in_flight = probe.in_flight.lock().unwrap();
                let n = in_flight.entry(name.clone()).or_default();
                *n += 1;
                *n
            };
            probe.most_in_flight.fetch_max(running, Ordering::SeqCst);
            let calls = {
                let mut calls = probe.calls.lock().unwrap();
                let seen = calls.entry(name.clone()).or_default();
                seen.push(Instant::now());
                seen.len()
            };
            // Long enough for the updates below to arrive while it runs.
            tokio::time::sleep(Duration::from_millis(30)).await;
            *probe.in_flight.lock().unwrap().entry(name.clone()).or_default() -= 1;
            if name == "flaky" && calls <= 4 {
                let status = kube::core::Status::failure("not yet", "InternalError").with_code(500);
                return Err(Error::Api(kube::Error::Api(status.boxed())));
            }
            Ok(Action::await_change())
        }
    }

    #[tokio::test]
    async fn failures_are_retried_with_backoff_and_one_object_is_reconciled_once_at_a_time() {
        let (_dir, _registry, client) = crate::client::for_tests().await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let probe = Arc::new(Probe::default());
        let shutdown = CancellationToken::new();
        let controller = Controller::new(api.clone(), watcher::Config::default());
        let running = tokio::spawn(run(controller, Flaky(probe.clone()), shutdown.clone()));

        for name in ["flaky", "busy"] {
            let cm = ConfigMap {
                metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
        // Updates to one object while its reconcile runs: merged, never run side by side.
        for i in 0..20 {
            let patch = serde_json::json!({"data": {"n": i.to_string()}});
            api.patch("busy", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let deadline = Instant::now() + Duration::from_secs(10);
        let flaky = loop {
            let calls = probe.calls.lock().unwrap().get("flaky").cloned().unwrap_or_default();
            if calls.len() >= 5 || Instant::now() > deadline {
                break calls;
            }
            drop(calls);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        shutdown.cancel();
        running.await.unwrap();

        assert_eq!(flaky.len(), 5, "four failures, then the success that ends the retries: {flaky:?}");
        // Each retry waits at least its backoff (5, 10, 20, 40 ms) after the failed reconcile (30 ms) ended.
        for (i, pair) in flaky.windows(2).enumerate() {
            let gap = pair[1] - pair[0];
            let least = Duration::from_millis(30) + backoff(i as u32 + 1);
            assert!(gap >= least, "retry {} came after {gap:?}, before its backoff {least:?}", i + 1);
        }
        let busy = probe.calls.lock().unwrap().get("busy").map_or(0, Vec::len);
        assert!((1..20).contains(&busy), "20 quick updates are merged into fewer reconciles: {busy}");
        assert_eq!(probe.most_in_flight.load(Ordering::SeqCst), 1, "one object's reconciles overlapped");
    }
}
