//! Crash safety: every acknowledged write survives SIGKILL, and SIGTERM shuts down cleanly.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams, WatchParams};
use serde_json::json;

use common::Server;

const TASKS: usize = 8;
const PER_TASK: usize = 100;
const SUITE: &str = "suite=crash";

/// A create the server answered with 201.
#[derive(Debug, Clone)]
struct Acked {
    name: String,
    resource_version: u64,
    data: BTreeMap<String, String>,
}

fn name(cycle: usize, task: usize, item: usize) -> String {
    format!("crash-{cycle}-{task}-{item}")
}

/// The data of the object called `name`: distinct for every object, and large enough (about 2 KiB)
/// that a torn write would show.
fn payload(name: &str) -> BTreeMap<String, String> {
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let body: String = (0..128u64).map(|i| format!("{:016x}", seed.rotate_left((i % 64) as u32) ^ i)).collect();
    BTreeMap::from([("owner".to_string(), name.to_string()), ("body".to_string(), body)])
}

fn config_map(name: &str) -> ConfigMap {
    let mut cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"suite": "crash"}}}))
        .expect("a valid ConfigMap");
    cm.data = Some(payload(name));
    cm
}

fn version(cm: &ConfigMap) -> u64 {
    cm.resource_version().expect("a resourceVersion").parse().expect("a numeric resourceVersion")
}

/// Creates `TASKS` × `PER_TASK` ConfigMaps concurrently and SIGKILLs the server once `kill_after` of
/// them have been acknowledged, while the rest are still being sent. Returns the data directory and
/// every acknowledged create.
async fn create_until_killed(server: Server, cycle: usize, kill_after: usize) -> (tempfile::TempDir, Vec<Acked>) {
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let killed = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (api, acked, killed) = (api.clone(), acked.clone(), killed.clone());
        tasks.push(tokio::spawn(async move {
            for item in 0..PER_TASK {
                let name = name(cycle, task, item);
                match api.create(&PostParams::default(), &config_map(&name)).await {
                    Ok(cm) => {
                        let data = cm.data.clone().unwrap_or_default();
                        acked.lock().unwrap().push(Acked { name, resource_version: version(&cm), data });
                    }
                    // Once the server is gone every request fails; before that none may.
                    Err(_) if killed.load(Ordering::SeqCst) => return Ok(()),
                    Err(e) => return Err(format!("creating {name} failed before the kill: {e}")),
                }
            }
            Ok(())
        }));
    }

    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.lock().unwrap().len() < kill_after {
        assert!(Instant::now() < deadline, "only {} creates acknowledged in 120s", acked.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    killed.store(true, Ordering::SeqCst);
    let dir = tokio::task::block_in_place(|| server.kill9());

    for task in tasks {
        let outcome = tokio::time::timeout(Duration::from_secs(60), task).await;
        outcome.expect("a create task hung after the kill").expect("a create task panicked").unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.len() < TASKS * PER_TASK,
        "all {} creates finished before the kill, so none was in flight; lower kill_after",
        acked.len()
    );
    (dir, acked)
}

/// Checks that every acknowledged object is stored unchanged, that every stored object is whole, and
/// that a new write gets a newer resourceVersion than all of them. Returns that new version.
async fn verify(server: &Server, acked: &[Acked], probe: &str) -> u64 {
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let list = api.list(&ListParams::default().labels(SUITE)).await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.as_deref().unwrap().parse().unwrap();
    let stored: BTreeMap<String, ConfigMap> = list.items.into_iter().map(|cm| (cm.name_any(), cm)).collect();

    for a in acked {
        let cm = stored.get(&a.name).unwrap_or_else(|| panic!("acknowledged {} is missing after the crash", a.name));
        assert_eq!(version(cm), a.resource_version, "{} changed its resourceVersion", a.name);
        assert_eq!(cm.data.as_ref(), Some(&a.data), "{} changed its data", a.name);
    }
    // Unacknowledged creates may or may not have landed, but whatever landed is whole.
    for (name, cm) in &stored {
        assert_eq!(cm.data.as_ref(), Some(&payload(name)), "{name} is damaged");
        assert!(version(cm) <= list_rv, "{name} is newer than the list it came in");
    }

    let newest = acked.iter().map(|a| a.resource_version).max().unwrap_or_default();
    assert!(list_rv >= newest, "the store's revision {list_rv} went back behind {newest}");
    let created = api.create(&PostParams::default(), &config_map(probe)).await.unwrap();
    assert!(version(&created) > newest, "a write after the restart got {} <= {newest}", version(&created));
    version(&created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_creates_survive_sigkill() {
    let mut server = Server::start();
    let mut all: Vec<Acked> = Vec::new();
    let mut last_probe = 0;
    // Different thresholds hit the store at different moments of its group commits.
    for (cycle, kill_after) in [150, 320, 530].into_iter().enumerate() {
        let (dir, acked) = create_until_killed(server, cycle, kill_after).await;
        assert!(acked.len() >= kill_after);
        let versions: BTreeSet<u64> = acked.iter().map(|a| a.resource_version).collect();
        assert_eq!(versions.len(), acked.len(), "two creates were acknowledged with the same resourceVersion");
        assert!(
            versions.first().is_some_and(|v| *v > last_probe),
            "cycle {cycle} reused a resourceVersion from before the restart"
        );
        for a in &acked {
            assert_eq!(a.data, payload(&a.name), "the server answered {} with other data", a.name);
        }
        all.extend(acked);

        server = Server::start_with(dir, &[]);
        last_probe = verify(&server, &all, &format!("probe-{cycle}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_shuts_down_cleanly_and_keeps_everything() {
    let server = Server::start();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let mut acked = Vec::new();
    for item in 0..50 {
        let name = name(0, 0, item);
        let cm = api.create(&PostParams::default(), &config_map(&name)).await.unwrap();
        acked.push(Acked { name, resource_version: version(&cm), data: cm.data.unwrap_or_default() });
    }
    // An open watch must not hold the shutdown up.
    let watch = api.watch(&WatchParams::default().labels(SUITE), "0").await.unwrap();
    let watcher = tokio::spawn(watch.count());

    let (dir, status) = tokio::task::block_in_place(|| server.terminate(Duration::from_secs(20)));
    let status = status.expect("the server did not exit within 20s of SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
    assert!(status.success(), "the server exited with {status}:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    let events = tokio::time::timeout(Duration::from_secs(10), watcher).await.expect("the watch stayed open").unwrap();
    assert!(events >= acked.len(), "the watch delivered {events} events");

    let server = Server::start_with(dir, &[]);
    verify(&server, &acked, "after-sigterm").await;
    assert!(!server.log().contains("panicked"), "{}", server.log());
}
