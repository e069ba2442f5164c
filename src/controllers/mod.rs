//! The control loops a single-node cluster needs from kube-controller-manager: namespace lifecycle,
//! default service accounts, garbage collection by owner, and event expiry.
//!
//! Each is a [`runtime::Reconciler`] over typed objects, run by [`runtime::run`] on the in-process
//! client (`crate::client`); none reaches into another. Event expiry is a periodic sweep instead (see
//! `event_ttl.rs`). A new controller is a file here with a reconciler and the `Controller` that
//! triggers it (copy `serviceaccount.rs`), started in [`spawn_all`]. The garbage collector still follows the store through the registry.

mod event_ttl;
mod gc;
mod namespace;
pub mod runtime;
mod serviceaccount;

use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::registry::{Registry, StatusError};

/// Starts every controller; they stop when `shutdown` fires.
pub fn spawn_all(client: &Client, registry: &Registry, shutdown: &CancellationToken) {
    tokio::spawn(runtime::run(
        namespace::controller(client),
        namespace::Namespaces { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        serviceaccount::controller(client),
        serviceaccount::ServiceAccounts { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(event_ttl::run(client.clone(), event_ttl::EVENT_TTL, shutdown.clone()));
    let r = registry.clone();
    tokio::spawn(supervise("garbage-collector", shutdown.clone(), move || gc::run(r.clone())));
}

/// Runs a controller loop, restarting it after a pause if it fails, until shutdown.
async fn supervise<F, Fut>(name: &'static str, shutdown: CancellationToken, run: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), StatusError>>,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = run() => {
                if let Err(e) = result {
                    // 410 only means the watch must be restarted from a fresh list.
                    if e.code != 410 {
                        tracing::warn!("{name} controller stopped: {e}; restarting");
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
