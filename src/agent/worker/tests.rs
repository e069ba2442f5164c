use super::*;

fn deleting(grace: i64) -> Arc<Pod> {
    let mut pod = Pod::default();
    pod.metadata.deletion_grace_period_seconds = Some(grace);
    Arc::new(pod)
}

#[tokio::test]
async fn only_an_earlier_end_shortens_the_grace_period() {
    let (tx, rx) = watch::channel(Update::Pod(deleting(30)));
    let deadline = Instant::now() + Duration::from_secs(30);
    let sooner = tokio::spawn(sooner_deadline(rx.clone(), deadline));
    // The same or a longer period (a repeated delete, a label change) keeps the deadline.
    tx.send(Update::Pod(deleting(30))).unwrap();
    tx.send(Update::Pod(deleting(60))).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!sooner.is_finished());
    tx.send(Update::Pod(deleting(1))).unwrap();
    assert_eq!(sooner.await.unwrap(), 1);
    // A force delete: the pod is gone from the API.
    let forced = tokio::spawn(sooner_deadline(rx, deadline));
    tx.send(Update::Removed(deleting(30))).unwrap();
    assert_eq!(forced.await.unwrap(), 0);
}

// The pod worker against a fake runtime and a fake API.

use crate::agent::context::{Host, RuntimeHealth};
use crate::agent::fake::{FakeApi, FakeRuntime, Written};
use crate::agent::probes::{ProbeManager, What};
use crate::agent::runtime::RuntimeExec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use tokio::sync::mpsc;

const IMAGE: &str = "busybox:1.36";

struct Harness {
    ctx: Arc<Ctx>,
    runtime: Arc<FakeRuntime>,
    api: Arc<FakeApi>,
    tx: watch::Sender<Update>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn pod(container: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "6a3c1f0e-0000-4000-8000-000000000001",
                     "resourceVersion": "1"},
        "spec": {"nodeName": "node-1", "containers": [container]},
    }))
    .unwrap()
}

fn app() -> Value {
    json!({"name": "app", "image": IMAGE})
}

/// A worker for `pod` on `runtime`, as the pod manager starts one; probe failures are routed to
/// it as the manager routes them.
fn start(runtime: Arc<FakeRuntime>, pod: Pod) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(FakeApi::default());
    let exec: Arc<dyn crate::agent::probes::Exec> = Arc::new(RuntimeExec(runtime.clone()));
    let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
    let host = Host {
        known_node: None,
        node_name: "node-1".into(),
        node_ip: Some("192.0.2.10".into()),
        pods_dir: dir.path().join("pods"),
        logs_dir: dir.path().join("logs"),
        node: kube::runtime::reflector::store().0,
        cgroups: None,
        memory_capacity: 8 << 30,
        runtime_name: "containerd".into(),
        csi_drivers: Default::default(),
        plugin_dirs: crate::csi::PluginDirs { root: dir.path().join("kubelet") },
        devices: Default::default(),
        cluster_dns: Default::default(),
    };
    let probes = ProbeManager::new(exec.clone(), probe_tx);
    let health = Arc::new(RuntimeHealth::default());
    let ctx = Arc::new(Ctx::new(runtime.clone(), api.clone(), host, probes, exec, health));
    let (tx, rx) = watch::channel(Update::Pod(Arc::new(pod)));
    let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
    let worker =
        Worker::new(ctx.clone(), tx.borrow().pod().clone(), rx, wake.clone(), Arc::new(AtomicBool::new(false)));
    let task = tokio::spawn(worker.run(shutdown.clone()));
    let (routed, woken) = (ctx.clone(), wake.clone());
    tokio::spawn(async move {
        while let Some(event) = probe_rx.recv().await {
            if let What::Changed(false) = event.what {
                routed.mark_unhealthy(event.container_id, event.kind);
                woken.notify_one();
            }
        }
    });
    Harness { ctx, runtime, api, tx, wake, shutdown, task, _dir: dir }
}

impl Harness {
    /// Waits (10 s at most) until `done` holds of the status written last.
    async fn status_until(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.until(what, || self.api.status().filter(|s| done(s))).await
    }

    async fn until<T>(&self, what: &str, found: impl Fn() -> Option<T>) -> T {
        for _ in 0..1000 {
            if let Some(t) = found() {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let events = self.api.events();
        let status = self.api.status();
        panic!(
            "{what}: not within 10 s; runtime calls {:?}; events {events:?}; last status {status:?}",
            self.runtime.calls()
        );
    }

    /// The runtime changed under the worker: PLEG would wake it.
    fn changed(&self) {
        self.wake.notify_one();
    }

    async fn stop(self) -> Arc<FakeRuntime> {
        self.shutdown.cancel();
        self.task.await.unwrap();
        self.runtime
    }
}

fn app_status(status: &Value) -> &Value {
    &status["containerStatuses"][0]
}

fn running(status: &Value) -> bool {
    status["phase"] == "Running" && app_status(status)["state"]["running"].is_object()
}

#[tokio::test]
async fn a_new_pod_gets_a_sandbox_and_a_running_container() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    let status = h.status_until("the pod running", running).await;
    let container = h.runtime.newest("app").unwrap();
    assert_eq!(
        h.runtime.calls(),
        ["RunPodSandbox sandbox-1", "CreateContainer app", &format!("StartContainer {}", container.id)]
    );
    let app = app_status(&status);
    assert_eq!(app["containerID"], format!("containerd://{}", container.id));
    assert_eq!((app["ready"].as_bool(), app["restartCount"].as_i64()), (Some(true), Some(0)));
    assert_eq!(status["podIP"], "10.42.0.7");
    assert_eq!(status["hostIP"], "192.0.2.10");
    let ready = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["status"], "True");
    let reasons: Vec<String> = h.api.events().into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons, ["Pulled", "Created", "Started"]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_image_with_pull_policy_never_is_tried_again() {
    let never = json!({"name": "app", "image": IMAGE, "imagePullPolicy": "Never"});
    let h = start(Arc::new(FakeRuntime::default()), pod(never));
    let status = h.status_until("ErrImageNeverPull", |s| app_status(s)["state"]["waiting"].is_object()).await;
    assert_eq!(app_status(&status)["state"]["waiting"]["reason"], "ErrImageNeverPull");
    assert_eq!(h.runtime.count("CreateContainer"), 0);
    // Imported later (the images directory): the next try, 10 s on as kubelet's, starts it.
    h.runtime.add_image(IMAGE);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.runtime.count("CreateContainer"), 0, "not before the back-off");
    h.status_until("the pod running", running).await;
    h.stop().await;
}

#[tokio::test]
async fn a_crashing_container_is_restarted_at_once_then_backs_off() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    h.status_until("the pod running", running).await;
    // The first crash restarts it at once.
    h.runtime.exit("app", 1);
    h.changed();
    let status = h.status_until("the restarted container", |s| running(s) && app_status(s)["restartCount"] == 1).await;
    assert_eq!(app_status(&status)["lastState"]["terminated"]["exitCode"], 1);
    assert_eq!(h.runtime.count("CreateContainer app"), 2);
    // The second within the backoff waits: CrashLoopBackOff, and no third container.
    h.runtime.exit("app", 1);
    h.changed();
    let status = h.status_until("CrashLoopBackOff", |s| app_status(s)["state"]["waiting"].is_object()).await;
    let waiting = &app_status(&status)["state"]["waiting"];
    assert_eq!(waiting["reason"], "CrashLoopBackOff");
    let message = waiting["message"].as_str().unwrap();
    assert!(message.starts_with("back-off 10s restarting failed container=app pod=web_default("), "{message}");
    assert!(
        h.api.events().iter().any(|(r, m)| r == "BackOff" && m.starts_with("Back-off restarting failed container app"))
    );
    // Woken again inside the backoff: it backs off again instead of starting a third container.
    let backoffs = || h.api.events().iter().filter(|(r, _)| r == "BackOff").count();
    let before = backoffs();
    h.changed();
    h.until("a second back-off", || (backoffs() > before).then_some(())).await;
    assert_eq!(h.runtime.count("CreateContainer app"), 2, "restarted inside its backoff");
    h.stop().await;
}

#[tokio::test]
async fn a_failed_liveness_probe_restarts_the_container() {
    let probed = json!({"name": "app", "image": IMAGE, "livenessProbe": {
        "exec": {"command": ["cat", "/tmp/healthy"]}, "periodSeconds": 1, "failureThreshold": 1}});
    let runtime = Arc::new(FakeRuntime::with_images(&[IMAGE]));
    runtime.set_exec_exit_code(1);
    let h = start(runtime, pod(probed));
    // The restarted container fails its probe too: look for its first status among all written.
    let restarted = |s: &Value| running(s) && app_status(s)["restartCount"] == 1;
    let status = h.until("the restarted container", || h.api.statuses().into_iter().find(restarted)).await;
    let calls = h.runtime.calls();
    let first = calls.iter().find_map(|c| c.strip_prefix("StartContainer ")).unwrap();
    assert!(calls.contains(&format!("ExecSync {first} cat /tmp/healthy")), "{calls:?}");
    // Stopped with the pod's grace period, then created again.
    assert!(calls.contains(&format!("StopContainer {first} 30s")), "{calls:?}");
    assert_eq!(app_status(&status)["lastState"]["terminated"]["exitCode"], 143);
    let events = h.api.events();
    assert!(
        events.iter().any(|(r, m)| r == "Killing" && m == "Container app failed liveness probe, will be restarted"),
        "{events:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_deleted_pod_is_stopped_with_its_grace_period_then_removed_from_the_api() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    h.status_until("the pod running", running).await;
    let id = h.runtime.newest("app").unwrap().id;
    let mut deleting = Pod::clone(h.tx.borrow().pod());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    deleting.metadata.deletion_grace_period_seconds = Some(20);
    h.tx.send(Update::Pod(Arc::new(deleting))).unwrap();
    let uid = h
        .until("the pod deleted", || {
            h.api.written().iter().find_map(|w| match w {
                Written::Deleted(uid) => Some(uid.clone()),
                _ => None,
            })
        })
        .await;
    assert_eq!(uid, "6a3c1f0e-0000-4000-8000-000000000001");
    let calls = h.runtime.calls();
    let stop =
        calls.iter().position(|c| *c == format!("StopContainer {id} 20s")).expect("stopped with the grace period");
    let sandbox = calls.iter().position(|c| c == "StopPodSandbox sandbox-1").expect("sandbox stopped");
    assert!(stop < sandbox, "{calls:?}");
    assert_eq!(h.runtime.count("CreateContainer"), 1);
    // The final status (container terminated) is written before the pod object goes.
    let written = h.api.written();
    let deleted = written.iter().position(|w| matches!(w, Written::Deleted(_))).unwrap();
    let Some(Written::Status(last)) = written[..deleted].iter().rev().find(|w| matches!(w, Written::Status(_))) else {
        panic!("no status before the deletion: {written:?}");
    };
    assert_eq!(app_status(last)["state"]["terminated"]["exitCode"], 143);
    assert!(h.api.events().iter().any(|(r, m)| r == "Killing" && m == "Stopping container app"));
    h.stop().await;
}

#[tokio::test]
async fn a_restarted_agent_adopts_the_running_containers() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    h.status_until("the pod running", running).await;
    let id = h.runtime.newest("app").unwrap().id;
    let before = h.runtime.calls().len();
    // cairn stops: containers are left running.
    let runtime = h.stop().await;
    assert_eq!(runtime.calls().len(), before, "stopping the agent touched the runtime");
    // A new agent's worker for the same pod finds them and starts nothing.
    let h = start(runtime, pod(app()));
    let status = h.status_until("the adopted pod", running).await;
    assert_eq!(app_status(&status)["containerID"], format!("containerd://{id}"));
    assert_eq!(app_status(&status)["restartCount"], 0);
    let after: Vec<String> = h.runtime.calls()[before..].to_vec();
    assert!(after.is_empty(), "the adopting worker changed the runtime: {after:?}");
    assert!(h.ctx.take_unhealthy(&id).is_none());
    h.stop().await;
}

#[tokio::test]
async fn an_ephemeral_container_joins_its_target_and_is_never_restarted() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    h.status_until("the pod running", running).await;
    let app_id = h.runtime.newest("app").unwrap().id;
    let mut debugged = Pod::clone(h.tx.borrow().pod());
    let debugger =
        json!({"name": "debugger", "image": IMAGE, "targetContainerName": "app", "stdin": true, "tty": true});
    debugged.spec.as_mut().unwrap().ephemeral_containers = Some(vec![serde_json::from_value(debugger).unwrap()]);
    h.tx.send(Update::Pod(Arc::new(debugged))).unwrap();
    let ephemeral = |s: &Value| s["ephemeralContainerStatuses"][0].clone();
    let status = h.status_until("the debugger running", |s| ephemeral(s)["state"]["running"].is_object()).await;
    assert!(
        h.runtime.calls().contains(&format!("CreateContainer debugger pid-of={app_id}")),
        "{:?}",
        h.runtime.calls()
    );
    assert_eq!(
        (ephemeral(&status)["name"].as_str(), ephemeral(&status)["ready"].as_bool()),
        (Some("debugger"), Some(false))
    );
    let ready = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["status"], "True", "an ephemeral container does not count for readiness");
    // It ends: it stays ended, and the app container is left alone.
    h.runtime.exit("debugger", 0);
    h.changed();
    h.status_until("the debugger terminated", |s| ephemeral(s)["state"]["terminated"].is_object()).await;
    h.changed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.runtime.count("CreateContainer debugger"), 1, "an ephemeral container was restarted");
    assert_eq!(h.runtime.count("CreateContainer app"), 1);
    assert!(running(&h.api.status().unwrap()));
    h.stop().await;
}

#[tokio::test]
async fn old_sandboxes_and_containers_beyond_the_kept_ones_are_removed() {
    let h = start(Arc::new(FakeRuntime::with_images(&[IMAGE])), pod(app()));
    h.status_until("the pod running", running).await;
    // The sandbox dies: a new one is made, with the container started again in it.
    let request = cri::StopPodSandboxRequest { pod_sandbox_id: "sandbox-1".into() };
    crate::agent::runtime::ContainerRuntime::stop_pod_sandbox(&*h.runtime, request).await.unwrap();
    h.changed();
    h.until("a second sandbox", || (h.runtime.count("RunPodSandbox") == 2).then_some(())).await;
    h.status_until("the pod running again", running).await;
    // The dead container of the old sandbox is the one kept for `logs --previous`: it stays.
    assert_eq!(h.runtime.count("RemovePodSandbox"), 0);
    // The new sandbox dies too: the dead container of the second sandbox is now the one kept, and
    // the first sandbox, emptied, goes.
    let request = cri::StopPodSandboxRequest { pod_sandbox_id: "sandbox-3".into() };
    crate::agent::runtime::ContainerRuntime::stop_pod_sandbox(&*h.runtime, request).await.unwrap();
    h.changed();
    // Its container starts again after its 10 s back-off (the harness waits 10 s at most).
    h.until("the back-off", || h.api.events().iter().any(|(r, _)| r == "BackOff").then_some(())).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.until("the old sandbox removed", || (h.runtime.count("RemovePodSandbox sandbox-1") == 1).then_some(())).await;
    assert_eq!(h.runtime.count("RemoveContainer"), 1);
    assert_eq!(h.runtime.count("RemovePodSandbox"), 1, "the current sandbox stays");
    h.stop().await;
}
