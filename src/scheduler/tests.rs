//! The scheduler against a real registry and store (no HTTP): binding, rollback of failed
//! reserves and binds, and requeueing when room is freed.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::framework::{Enabled, Plugin, Point, Status};
use super::plugins::Handle;
use super::queue::QueueOptions;
use super::types::PodInfo;
use super::{Config, Scheduler};
use crate::registry::{DeleteOptions, Registry, WriteOptions};
use crate::store::{Options, Store};

/// Fails Reserve for pods named `doomed-*` and Bind for pods named `unbindable-*`.
struct Saboteur;

impl Plugin for Saboteur {
    fn name(&self) -> &'static str {
        "Saboteur"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Reserve, Point::Bind]
    }

    fn reserve(&self, _: &mut super::framework::CycleState, pod: &PodInfo, _: &str) -> Status {
        if pod.name.starts_with("doomed") { Status::unschedulable("reserve refused") } else { Status::success() }
    }

    fn bind<'a>(&'a self, pod: &'a PodInfo, _: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            if pod.name.starts_with("unbindable") { Status::error("the API refused") } else { Status::skip() }
        })
    }
}

async fn setup() -> (tempfile::TempDir, Registry, CancellationToken) {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new(Store::open(dir.path(), Options::default()).unwrap());
    crate::registry::bootstrap::system_namespaces(&registry).await.unwrap();
    crate::registry::service_account_admission::default_accounts(&registry).await;
    let shutdown = CancellationToken::new();
    let client = crate::client::on_registry(&registry);
    let handle = Handle::start(client.clone(), &shutdown);
    let mut profiles = Config::default().build(&handle).unwrap();
    let saboteur: Arc<dyn Plugin> = Arc::new(Saboteur);
    for point in [Point::Reserve, Point::Bind] {
        // Before DefaultBinder, so that it decides first.
        profiles[0].points.entry(point).or_default().insert(0, Enabled { plugin: saboteur.clone(), weight: 1 });
    }
    let opts = QueueOptions {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(200),
        ..Default::default()
    };
    Scheduler::launch(client, profiles, opts, "test", shutdown.clone());
    (dir, registry, shutdown)
}

async fn create(registry: &Registry, plural: &str, obj: Value) {
    let r = registry.find("", "v1", plural).unwrap();
    let ns = (plural == "pods").then_some("default");
    registry.create(&r, ns, obj, &WriteOptions::default()).await.unwrap();
}

async fn node(registry: &Registry, name: &str, cpu: &str) {
    let res = json!({"cpu": cpu, "memory": "4Gi", "pods": "110"});
    create(registry, "nodes", json!({"metadata": {"name": name}, "status": {"capacity": res, "allocatable": res}}))
        .await;
}

async fn pod(registry: &Registry, name: &str, cpu: &str) {
    create(
        registry,
        "pods",
        json!({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}),
    )
    .await;
}

fn get_pod(registry: &Registry, name: &str) -> Value {
    registry.get_value(&registry.find("", "v1", "pods").unwrap(), Some("default"), name).unwrap()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

fn scheduled_condition(p: &Value) -> (String, String) {
    let c = p["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "PodScheduled");
    let get = |f: &str| c.and_then(|c| c[f].as_str()).unwrap_or_default().to_string();
    (get("status"), get("reason"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reserve_and_bind_roll_back_and_free_the_node() {
    let (_dir, registry, shutdown) = setup().await;
    node(&registry, "n1", "1").await;

    pod(&registry, "doomed", "800m").await;
    wait_for("doomed to be unschedulable", || scheduled_condition(&get_pod(&registry, "doomed")).1 == "Unschedulable")
        .await;
    pod(&registry, "unbindable", "800m").await;
    wait_for("a scheduler error", || scheduled_condition(&get_pod(&registry, "unbindable")).1 == "SchedulerError")
        .await;

    // Neither attempt kept the node's CPU: a pod that needs most of it still fits.
    pod(&registry, "next", "800m").await;
    wait_for("next to be bound", || get_pod(&registry, "next")["spec"]["nodeName"] == "n1").await;
    assert_eq!(scheduled_condition(&get_pod(&registry, "next")), ("True".into(), String::new()));
    assert!(get_pod(&registry, "doomed")["spec"]["nodeName"].is_null());
    assert!(get_pod(&registry, "unbindable")["spec"]["nodeName"].is_null());
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_room_requeues_and_nothing_is_bound_twice() {
    let (_dir, registry, shutdown) = setup().await;
    node(&registry, "n1", "1").await;
    for i in 0..5 {
        pod(&registry, &format!("p{i}"), "300m").await;
    }
    // Three fit; two wait.
    let bound = || (0..5).filter(|i| get_pod(&registry, &format!("p{i}"))["spec"]["nodeName"] == "n1").count();
    wait_for("three pods bound", || bound() == 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(bound(), 3);

    // Deleting a bound pod frees room for exactly one more.
    let first = (0..5).map(|i| format!("p{i}")).find(|n| get_pod(&registry, n)["spec"]["nodeName"] == "n1").unwrap();
    let pods = registry.find("", "v1", "pods").unwrap();
    let opts = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
    registry.delete(&pods, Some("default"), &first, &opts).await.unwrap();
    let remaining = || {
        (0..5)
            .map(|i| format!("p{i}"))
            .filter(|n| *n != first)
            .filter(|n| get_pod(&registry, n)["spec"]["nodeName"] == "n1")
            .count()
    };
    wait_for("a waiting pod to take the room", || remaining() == 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(remaining(), 3);

    // A node added later takes the last one.
    node(&registry, "n2", "1").await;
    wait_for("the last pod on n2", || {
        (0..5)
            .map(|i| format!("p{i}"))
            .filter(|n| *n != first)
            .any(|n| get_pod(&registry, &n)["spec"]["nodeName"] == "n2")
    })
    .await;
    shutdown.cancel();
}
