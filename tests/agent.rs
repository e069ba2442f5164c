//! End to end: the node agent. The real cairn runs its embedded containerd (real containerd + runc)
//! and the pods are made, watched, read and deleted with the real kubectl, exactly as a user would.
//! The busybox image is built by the test from Debian's busybox-static and dropped into the
//! air-gapped images directory.
//!
//! These tests need root, containerd, runc and busybox-static (`.ci/run` installs them). They share
//! the host's `cni0` bridge and netfilter tables, so they take turns.

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use busybox::BUSYBOX;
use common::{Server, eventually};
use node::{Node, https_request, node_ready};
use serde_json::Value;

static HOST: Mutex<()> = Mutex::new(());

const CIDR: &str = "10.46.0.0/16";

trait Pods {
    fn pod(&self, name: &str) -> Value;
    fn wait_pod(&self, name: &str, secs: u64, what: &str, ok: impl Fn(&Value) -> bool) -> Value;
    fn events(&self, name: &str) -> Vec<(String, String)>;
}

impl Pods for Server {
    fn pod(&self, name: &str) -> Value {
        let out = self.kubectl(&["get", "pod", name, "-o", "json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Polls the pod until `ok` holds; panics with the pod and the server log when it does not.
    fn wait_pod(&self, name: &str, secs: u64, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let pod = self.pod(name);
            if ok(&pod) {
                return pod;
            }
            if Instant::now() > deadline {
                let log = self.log();
                let tail: String =
                    log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                panic!("pod {name}: {what} not seen within {secs}s\n{pod:#}\n--- server log ---\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// (reason, message) of the pod's events.
    fn events(&self, name: &str) -> Vec<(String, String)> {
        let out =
            self.kubectl(&["get", "events", "--field-selector", &format!("involvedObject.name={name}"), "-o", "json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn container(pod: &Value, i: usize) -> &Value {
    &pod["status"]["containerStatuses"][i]
}

fn running(pod: &Value) -> bool {
    phase(pod) == "Running" && container(pod, 0)["state"]["running"].is_object()
}

fn ready(pod: &Value) -> bool {
    container(pod, 0)["ready"] == true
}

fn restarts(pod: &Value) -> i64 {
    container(pod, 0)["restartCount"].as_i64().unwrap_or(0)
}

fn pod_yaml(name: &str, extra_spec: &str, container_extra: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{extra_spec}
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["/bin/sh", "-c", {script:?}]
{container_extra}
"#
    )
}

/// Follows a pod in the background through a watch (for at most 150 s) and records when each run
/// of its first container started and finished, by restart count, until `runs` runs are known. A
/// watch sees every status written: polling could miss a run that lasted less than its interval.
type Runs = std::collections::BTreeMap<i64, (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>;
fn record_runs(node: &Server, name: &str, runs: usize) -> std::thread::JoinHandle<Runs> {
    let mut watch = std::process::Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["get", "pods", "-w", "-o", "json", "--field-selector", &format!("metadata.name={name}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let watch = std::sync::Arc::new(Mutex::new(watch));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stopper, stop) = (watch.clone(), done.clone());
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(150);
        while Instant::now() < deadline && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = stopper.lock().unwrap().kill();
    });
    std::thread::spawn(move || {
        let mut seen = Runs::new();
        let pods = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout)).into_iter::<Value>();
        for pod in pods {
            let Ok(pod) = pod else { break };
            let c = container(&pod, 0);
            // While waiting to restart, lastState is the newest run; otherwise the one before it.
            let last_offset = if c["state"]["waiting"].is_object() { 0 } else { 1 };
            for (state, offset) in [(&c["state"], 0), (&c["lastState"], last_offset)] {
                let t = &state["terminated"];
                let (Some(start), Some(end)) = (t["startedAt"].as_str(), t["finishedAt"].as_str()) else { continue };
                let n = c["restartCount"].as_i64().unwrap_or(0) - offset;
                seen.insert(n, (time_of(&Value::from(start)), time_of(&Value::from(end))));
            }
            if seen.len() >= runs {
                break;
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut watch = watch.lock().unwrap();
        let _ = watch.kill();
        let _ = watch.wait();
        seen
    })
}

/// Starts `kubectl get pods -w` for `name`, creates the pod from `yaml`, and collects the waiting
/// reasons of its first container until all of `want` were seen (at most 60 s).
fn watch_waiting_reasons(node: &Server, name: &str, yaml: &str, want: &[&str]) -> Vec<String> {
    use std::io::BufRead as _;
    let mut watch = std::process::Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["get", "pods", "-w", "--field-selector", &format!("metadata.name={name}")])
        .args(["-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}{\"\\n\"}"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // kubectl lists (nothing yet), then watches: give it time to be watching before the pod exists.
    std::thread::sleep(Duration::from_secs(3));
    node.ok_stdin(&["apply", "-f", "-"], yaml);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: Vec<String> = vec![];
    while !want.iter().all(|w| seen.iter().any(|s| s == w)) && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500))
            && !line.is_empty()
            && seen.last() != Some(&line)
        {
            seen.push(line);
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    seen
}

fn time_of(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a time: {v}"))
}

#[test]
fn pods_run_restart_probe_stop_and_report_like_a_kubelet() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let mut node = Node::start(CIDR);
    eventually(60, || node.ok(&["get", "nodes", "-o", "name"]).contains("node/").then_some(()));
    eventually(60, || node_ready(&node));
    let node_name = node.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    // The first start leaves a note in the air-gap folder saying what it is for, not read as a pull list.
    let images = node.dir.path().join("data/agent/images");
    let readme = std::fs::read_to_string(images.join("README.txt")).unwrap_or_default();
    assert!(readme.contains("docker save") && readme.contains("*.txt"), "{readme}");
    let state = images.with_file_name("images.imported.json");
    let imported = eventually(60, || std::fs::read_to_string(&state).ok().filter(|s| s.contains("busybox.tar")));
    assert!(!imported.contains("README"), "{imported}");

    // Everything is created at once; the checks below overlap in time.
    let pods = [
        pod_yaml(
            "web",
            "",
            "    readinessProbe:\n      httpGet: {path: /, port: 8080}\n      periodSeconds: 1",
            "echo hello from web; echo to stderr >&2; mkdir -p /tmp/www && echo served-by-web > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
        ),
        pod_yaml("crash", "", "", "echo crashing; exit 3"),
        pod_yaml(
            "liveness",
            "",
            "    livenessProbe:\n      exec: {command: [test, -f, /tmp/healthy]}\n      periodSeconds: 1\n      failureThreshold: 2",
            "touch /tmp/healthy; sleep 4; rm /tmp/healthy; sleep 3600",
        ),
        pod_yaml(
            "readiness",
            "",
            "    readinessProbe:\n      exec: {command: [test, -f, /tmp/ready]}\n      periodSeconds: 1",
            "while true; do touch /tmp/ready; sleep 5; rm /tmp/ready; sleep 5; done",
        ),
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: init
spec:
  volumes:
  - name: work
    emptyDir: {{}}
  initContainers:
  - name: first
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "echo one >> /work/order"]
    volumeMounts: [{{name: work, mountPath: /work}}]
  - name: second
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "sleep 1; echo two >> /work/order"]
    volumeMounts: [{{name: work, mountPath: /work}}]
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "cat /work/order; sleep 3600"]
    volumeMounts: [{{name: work, mountPath: /work}}]
"#
        ),
        pod_yaml(
            "hog",
            "  restartPolicy: Never",
            "    resources:\n      limits: {memory: 32Mi}",
            "exec dd if=/dev/zero of=/dev/null bs=200M count=1",
        ),
        pod_yaml(
            "greedy",
            &format!("  nodeName: {node_name}"),
            "    resources:\n      requests: {cpu: \"500\"}",
            "sleep 3600",
        ),
        pod_yaml("stubborn", "  terminationGracePeriodSeconds: 4", "", "trap '' TERM; while true; do sleep 1; done"),
        pod_yaml("polite", "", "", "trap 'exit 0' TERM; while true; do sleep 1; done"),
        pod_yaml(
            "done",
            "  restartPolicy: Never",
            "    env:\n    - {name: WHO, valueFrom: {fieldRef: {fieldPath: metadata.name}}}",
            "echo bye from $WHO",
        ),
    ];
    node.ok_stdin(&["apply", "-f", "-"], &pods.join("---\n"));
    let crash_runs = record_runs(&node, "crash", 4);
    let noimage_yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: noimage\nspec:\n  containers:\n  - name: main\n    image: localhost:1/cairn-test/missing:1\n";

    // An image that cannot be pulled: ErrImagePull, then ImagePullBackOff (seen through a watch, as
    // `kubectl get pods -w` shows them).
    let waiting = |p: &Value, reason: &str| container(p, 0)["state"]["waiting"]["reason"] == reason;
    let reasons = watch_waiting_reasons(&node, "noimage", noimage_yaml, &["ErrImagePull", "ImagePullBackOff"]);
    let first = |r: &str| reasons.iter().position(|x| x == r);
    assert!(
        first("ErrImagePull").is_some_and(|e| first("ImagePullBackOff").is_some_and(|b| e < b)),
        "ErrImagePull, then ImagePullBackOff: {reasons:?}"
    );
    assert_eq!(phase(&node.pod("noimage")), "Pending");
    let events = node.events("noimage");
    assert!(
        events.iter().any(|(r, m)| r == "Failed" && m.starts_with("Failed to pull image \"localhost:1/")),
        "{events:?}"
    );
    assert!(events.iter().any(|(r, m)| r == "BackOff" && m.starts_with("Back-off pulling image")), "{events:?}");

    // A pod goes Running with an IP in the pod network and serves another pod.
    let web = node.wait_pod("web", 90, "Running and Ready", |p| running(p) && ready(p));
    let web_ip = web["status"]["podIP"].as_str().unwrap().to_string();
    assert!(web_ip.starts_with("10.46.0."), "pod IP {web_ip} is in the node's pod CIDR");
    assert!(web["status"]["hostIP"].is_string());
    assert_eq!(web["status"]["qosClass"], "BestEffort");
    let types: Vec<&str> =
        web["status"]["conditions"].as_array().unwrap().iter().filter_map(|c| c["type"].as_str()).collect();
    for t in ["PodScheduled", "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"] {
        assert!(types.contains(&t), "condition {t} in {types:?}");
    }
    assert!(container(&web, 0)["containerID"].as_str().unwrap().starts_with("containerd://"));
    node.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml("client", "  restartPolicy: Never", "", &format!("wget -q -O- http://{web_ip}:8080/")),
    );
    node.wait_pod("client", 60, "Succeeded", |p| phase(p) == "Succeeded");
    assert_eq!(node.ok(&["logs", "client"]).trim(), "served-by-web");
    let logs = node.ok(&["logs", "web"]);
    assert!(logs.contains("hello from web") && logs.contains("to stderr"), "kubectl logs web: {logs}");
    let stamped = node.ok(&["logs", "web", "--timestamps", "--tail", "1"]);
    assert_eq!(stamped.lines().count(), 1, "--tail 1: {stamped}");
    assert!(
        stamped.split(' ').next().unwrap().parse::<chrono::DateTime<chrono::Utc>>().is_ok(),
        "--timestamps: {stamped}"
    );
    // kubectl logs went API → node endpoint; the endpoint answers the API server alone.
    let port: u16 = node
        .ok(&["get", "nodes", "-o", "jsonpath={.items[0].status.daemonEndpoints.kubeletEndpoint.Port}"])
        .parse()
        .unwrap();
    assert!(port > 0, "the Node reports its endpoint's port");
    let path = "/containerLogs/default/web/main";
    assert_eq!(https_get(&node, port, path, None), (401, "Unauthorized".to_string()));
    assert_eq!(
        https_get(&node, port, path, Some("client-admin")),
        (403, "Forbidden (user=system:admin, verb=get, resource=nodes, subresource=proxy)".to_string())
    );
    let (code, body) = https_get(&node, port, path, Some("client-kube-apiserver-kubelet"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("hello from web"), "{body}");
    let reasons: Vec<String> = node.events("web").into_iter().map(|(r, _)| r).collect();
    for r in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(reasons.iter().any(|x| x == r), "event {r} in {reasons:?}");
    }

    // Downward API env and a finished pod.
    let done = node.wait_pod("done", 60, "Succeeded", |p| phase(p) == "Succeeded");
    assert_eq!(container(&done, 0)["state"]["terminated"]["reason"], "Completed");
    assert_eq!(node.ok(&["logs", "done"]).trim(), "bye from done");

    // Admission: more CPU than the node has.
    let greedy = node.wait_pod("greedy", 30, "Failed", |p| phase(p) == "Failed");
    assert_eq!(greedy["status"]["reason"], "OutOfcpu");
    assert!(
        greedy["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod was rejected: Node didn't have enough resource: cpu")
    );
    assert_eq!(greedy["spec"]["nodeName"], node_name.as_str());

    // Init containers ran in order before the app.
    let init = node.wait_pod("init", 60, "Running", running);
    let inits = init["status"]["initContainerStatuses"].as_array().unwrap();
    assert!(inits.iter().all(|s| s["state"]["terminated"]["reason"] == "Completed"), "{inits:#?}");
    let first_done = time_of(&inits[0]["state"]["terminated"]["finishedAt"]);
    let second_start = time_of(&inits[1]["state"]["terminated"]["startedAt"]);
    assert!(first_done <= second_start, "the second init container started after the first finished");
    eventually(10, || (node.ok(&["logs", "init"]) == "one\ntwo\n").then_some(()));

    // A memory hog is OOMKilled.
    let hog = node.wait_pod("hog", 60, "Failed", |p| phase(p) == "Failed");
    let t = &container(&hog, 0)["state"]["terminated"];
    assert_eq!((t["reason"].as_str(), t["exitCode"].as_i64()), (Some("OOMKilled"), Some(137)), "{hog:#}");

    // Readiness toggles READY 1/1 <-> 0/1 while the container keeps running.
    node.wait_pod("readiness", 60, "ready", |p| running(p) && ready(p));
    node.wait_pod("readiness", 20, "not ready", |p| running(p) && !ready(p));
    let r = node.wait_pod("readiness", 20, "ready again", |p| running(p) && ready(p));
    assert_eq!(restarts(&r), 0);
    assert!(node.events("readiness").iter().any(|(r, m)| r == "Unhealthy" && m.starts_with("Readiness probe failed")));

    // A failing liveness probe restarts the container.
    let l = node.wait_pod("liveness", 60, "restarted", |p| restarts(p) >= 1 && running(p));
    assert!(l["status"]["containerStatuses"][0]["lastState"]["terminated"].is_object());
    let events = node.events("liveness");
    assert!(events.iter().any(|(r, m)| r == "Unhealthy" && m.starts_with("Liveness probe failed")), "{events:?}");
    assert!(events.iter().any(|(r, m)| r == "Killing" && m.contains("failed liveness probe")), "{events:?}");

    // A crashing container: CrashLoopBackOff with growing delays, phase stays Running.
    let crash = node.wait_pod("crash", 120, "three restarts", |p| restarts(p) >= 3);
    assert_eq!(phase(&crash), "Running");
    node.wait_pod("crash", 60, "CrashLoopBackOff", |p| waiting(p, "CrashLoopBackOff"));
    let events = node.events("crash");
    assert!(
        events.iter().any(|(r, m)| r == "BackOff" && m.starts_with("Back-off restarting failed container main")),
        "{events:?}"
    );
    assert_eq!(node.ok(&["logs", "crash", "--previous"]).trim(), "crashing");
    let last = &container(&crash, 0)["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3);
    assert_eq!(last["reason"], "Error");

    // Delays grow: no back-off before the first restart (only noticing the exit and creating the
    // container, which a busy machine can stretch to a few seconds), then 10 s, then 20 s.
    let runs = crash_runs.join().unwrap();
    let gap = |n: i64| Some(runs.get(&n)?.0 - runs.get(&(n - 1))?.1).map(|d| d.num_seconds());
    let gaps: Vec<Option<i64>> = (1..=3).map(gap).collect();
    assert!(
        matches!(gaps.as_slice(), [Some(a), Some(b), Some(c)] if *a < 8 && (9..=13).contains(b) && (19..=24).contains(c)),
        "restart delays 0, 10, 20 s: {gaps:?} from {runs:?}"
    );

    // Graceful deletion: a pod that ignores SIGTERM is killed after its grace period; one that
    // honours it goes at once.
    node.wait_pod("stubborn", 60, "Running", running);
    node.wait_pod("polite", 60, "Running", running);
    let started = Instant::now();
    node.ok(&["delete", "pod", "polite"]);
    let polite = started.elapsed();
    let started = Instant::now();
    node.ok(&["delete", "pod", "stubborn"]);
    let stubborn = started.elapsed();
    // Its grace period is the default 30 s; it goes as soon as its shell sees the signal.
    assert!(polite < Duration::from_secs(10), "a pod that exits on SIGTERM is gone at once ({polite:?})");
    assert!(
        stubborn >= Duration::from_secs(4) && stubborn < Duration::from_secs(15),
        "a pod ignoring SIGTERM is killed after its 4 s grace period ({stubborn:?})"
    );
    assert!(node.events("stubborn").iter().any(|(r, m)| r == "Killing" && m == "Stopping container main"));

    // kill -9 cairn and start it again: running containers keep their IDs and restart counts.
    let before: Vec<(String, Value, Value)> = ["web", "init", "liveness"]
        .iter()
        .map(|n| {
            let p = node.pod(n);
            (n.to_string(), container(&p, 0)["containerID"].clone(), container(&p, 0)["restartCount"].clone())
        })
        .collect();
    node.restart_after_kill9();
    eventually(60, || node_ready(&node));
    std::thread::sleep(Duration::from_secs(5));
    for (name, id, count) in &before {
        let p = node.wait_pod(name, 30, "Running after the restart", running);
        assert_eq!(&container(&p, 0)["containerID"], id, "{name} kept its container");
        assert_eq!(&container(&p, 0)["restartCount"], count, "{name} kept its restart count");
    }
    let nodes = node.ok(&["get", "nodes"]);
    assert!(nodes.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(1) == Some("Ready")), "{nodes}");

    // Deleting everything leaves no sandbox behind.
    node.ok(&["delete", "pods", "--all", "--grace-period", "1"]);
    eventually(60, || node.ok(&["get", "pods", "-o", "name"]).trim().is_empty().then_some(()));
    let cairn = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .arg("--data-dir")
            .arg(node.dir.path().join("data"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    eventually(30, || (cairn(&["ctr", "pods"]).lines().count() <= 1).then_some(()));
}

#[test]
fn volumes_hooks_sidecars_sandboxes_and_deadlines() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    let host_dir = tempfile::tempdir().unwrap();
    let host = host_dir.path().display().to_string();
    node.ok(&["create", "configmap", "settings", "--from-literal=color=blue", "--from-literal=size=10"]);
    node.ok(&["create", "secret", "generic", "creds", "--from-literal=password=s3cret"]);
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: config
  labels: {{tier: demo}}
spec:
  restartPolicy: Never
  volumes:
  - {{name: settings, configMap: {{name: settings}}}}
  - {{name: creds, secret: {{secretName: creds}}}}
  - name: info
    downwardAPI:
      items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "echo $COLOR $PASSWORD $(cat /etc/settings/size) $(cat /etc/creds/password) $(cat /etc/info/labels)"]
    env:
    - {{name: COLOR, valueFrom: {{configMapKeyRef: {{name: settings, key: color}}}}}}
    - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
    volumeMounts:
    - {{name: settings, mountPath: /etc/settings}}
    - {{name: creds, mountPath: /etc/creds}}
    - {{name: info, mountPath: /etc/info}}
---
apiVersion: v1
kind: Pod
metadata:
  name: hooks
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - {{name: host, hostPath: {{path: {host}, type: Directory}}}}
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts: [{{name: host, mountPath: /host}}]
    lifecycle:
      postStart: {{exec: {{command: ["/bin/sh", "-c", "echo started > /host/poststart"]}}}}
      preStop: {{exec: {{command: ["/bin/sh", "-c", "echo stopping > /host/prestop"]}}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: pair
spec:
  containers:
  - name: steady
    image: {BUSYBOX}
    command: ["/bin/sleep", "3600"]
  - name: flaky
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "sleep 1; exit 1"]
---
apiVersion: v1
kind: Pod
metadata:
  name: phoenix
spec:
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: deadline
spec:
  activeDeadlineSeconds: 3
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: ticker
spec:
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done"]
---
apiVersion: v1
kind: Pod
metadata:
  name: chatty
spec:
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "yes chatter | head -c 12000000; echo; while true; do echo the end; sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata:
  name: sidecar
spec:
  volumes: [{{name: shared, emptyDir: {{medium: Memory}}}}]
  initContainers:
  - name: helper
    image: {BUSYBOX}
    restartPolicy: Always
    command: ["/bin/sh", "-c", "echo ready > /shared/flag; sleep 3600"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["/bin/sh", "-c", "cat /shared/flag; sleep 3600"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
"#
    );
    let patient = ["shortened", "forced"]
        .map(|n| pod_yaml(n, "  terminationGracePeriodSeconds: 120", "", "trap '' TERM; while true; do sleep 1; done"));
    node.ok_stdin(&["apply", "-f", "-"], &[manifest, patient.join("---\n")].join("---\n"));

    // ConfigMap and Secret as env and files, and the downward API.
    node.wait_pod("config", 60, "Succeeded", |p| phase(p) == "Succeeded");
    assert_eq!(node.ok(&["logs", "config"]).trim(), "blue s3cret 10 s3cret tier=\"demo\"");

    // postStart ran after the start, preStop before the stop.
    node.wait_pod("hooks", 60, "Running", running);
    eventually(10, || std::fs::read_to_string(host_dir.path().join("poststart")).ok().filter(|s| s == "started\n"));
    assert!(!host_dir.path().join("prestop").exists());
    node.ok(&["delete", "pod", "hooks"]);
    assert_eq!(std::fs::read_to_string(host_dir.path().join("prestop")).unwrap(), "stopping\n");

    // A failing container restarts alone: its sibling and the sandbox stay.
    let before =
        node.wait_pod("pair", 60, "both running", |p| running(p) && container(p, 1)["state"]["running"].is_object());
    let after = node.wait_pod("pair", 60, "flaky restarted", |p| container(p, 1)["restartCount"].as_i64() >= Some(2));
    assert_eq!(container(&after, 0)["containerID"], container(&before, 0)["containerID"]);
    assert_eq!(container(&after, 0)["restartCount"], 0);
    assert_eq!(after["status"]["podIP"], before["status"]["podIP"]);

    // A sandbox that dies is made again, and its containers restarted in it.
    let p = node.wait_pod("phoenix", 60, "Running", running);
    let old_id = container(&p, 0)["containerID"].clone();
    let socket = node.dir.path().join("data/agent/containerd/containerd.sock");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cri = cri::Cri::new(&socket);
        let mut labels = std::collections::HashMap::new();
        labels.insert("io.kubernetes.pod.name".to_string(), "phoenix".to_string());
        let filter = cri::PodSandboxFilter { label_selector: labels, ..Default::default() };
        let sandboxes = cri.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await.unwrap();
        for s in sandboxes.items {
            cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: s.id }).await.unwrap();
        }
    });
    let p = node.wait_pod("phoenix", 60, "running in a new sandbox", |p| {
        running(p) && container(p, 0)["containerID"] != old_id
    });
    assert_eq!(restarts(&p), 1);
    assert!(node.events("phoenix").iter().any(|(r, _)| r == "SandboxChanged"));

    // A pod deleted with a long grace period: a second delete with a shorter one cuts the wait, and
    // so does a force delete (the object is gone at once; the agent still stops the container).
    node.wait_pod("shortened", 60, "Running", running);
    node.wait_pod("forced", 60, "Running", running);
    node.ok(&["delete", "pod", "shortened", "forced", "--wait=false"]);
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    node.ok(&["delete", "pod", "shortened", "--grace-period", "1"]);
    let shortened = started.elapsed();
    assert!(shortened < Duration::from_secs(20), "a shorter grace period is honoured ({shortened:?}, not 120 s)");
    let running_containers = |pod: &str| {
        rt.block_on(async {
            let mut labels = std::collections::HashMap::new();
            labels.insert("io.kubernetes.pod.name".to_string(), pod.to_string());
            let state = Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 });
            let filter = cri::ContainerFilter { label_selector: labels, state, ..Default::default() };
            let req = cri::ListContainersRequest { filter: Some(filter) };
            cri::Cri::new(&socket).list_containers(req).await.unwrap().containers.len()
        })
    };
    assert_eq!(running_containers("forced"), 1, "still in its grace period");
    node.ok(&["delete", "pod", "forced", "--force", "--grace-period", "0"]);
    eventually(20, || (running_containers("forced") == 0).then_some(()));

    // activeDeadlineSeconds.
    let p = node.wait_pod("deadline", 60, "Failed", |p| phase(p) == "Failed");
    assert_eq!(p["status"]["reason"], "DeadlineExceeded");

    // A native sidecar runs next to the app, which saw what it prepared.
    let p = node.wait_pod("sidecar", 60, "Running", |p| running(p) && ready(p));
    let helper = &p["status"]["initContainerStatuses"][0];
    assert!(helper["state"]["running"].is_object() && helper["started"] == true, "{helper}");
    assert_eq!(node.ok(&["logs", "sidecar"]).trim(), "ready");
    assert_eq!(node.ok(&["logs", "sidecar", "-c", "helper"]), "");

    // A log past 10 MiB is rotated; kubectl logs reads the live file.
    let chatty = node.wait_pod("chatty", 60, "Running", running);
    let uid = chatty["metadata"]["uid"].as_str().unwrap();
    let dir = node.dir.path().join(format!("data/agent/logs/pods/default_chatty_{uid}/main"));
    let files = eventually(40, || {
        let names: Vec<String> =
            std::fs::read_dir(&dir).ok()?.map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        (names.len() >= 2).then_some(names)
    });
    assert!(files.iter().any(|f| f.starts_with("0.log.")), "a rotated file next to 0.log: {files:?}");
    assert!(std::fs::metadata(dir.join("0.log")).unwrap().len() < 10 << 20);
    eventually(10, || (node.ok(&["logs", "chatty", "--tail", "1"]).trim() == "the end").then_some(()));

    // Deleting a pod whose image pull hangs (a registry on loopback that never answers) does not wait
    // for the pull.
    let registry = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: slowpull\nspec:\n  containers:\n  - name: main\n    image: 127.0.0.1:{}/cairn-test/slow:1\n",
        registry.local_addr().unwrap().port()
    );
    node.ok_stdin(&["apply", "-f", "-"], &slow);
    eventually(60, || node.events("slowpull").iter().any(|(r, _)| r == "Pulling").then_some(()));
    node.ok(&["delete", "pod", "slowpull", "--wait=false"]);
    let gone = |_: &Value| node.kubectl(&["get", "pod", "slowpull"]).status.code() == Some(1);
    node.wait_pod("slowpull", 15, "deleted while its image was being pulled", gone);
    drop(registry);

    // kubectl logs -f follows new lines.
    node.wait_pod("ticker", 60, "Running", running);
    let mut follow = std::process::Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["logs", "-f", "ticker", "--tail", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines: Vec<String> = {
        use std::io::BufRead as _;
        let out = std::io::BufReader::new(follow.stdout.take().unwrap());
        out.lines().take(5).map(|l| l.unwrap()).collect()
    };
    let _ = follow.kill();
    let _ = follow.wait();
    let numbers: Vec<u32> = lines.iter().filter_map(|l| l.strip_prefix("tick ")?.parse().ok()).collect();
    assert!(numbers.len() == 5 && numbers.windows(2).all(|w| w[1] == w[0] + 1), "followed lines: {lines:?}");
    // kubectl picks the first container itself; the API asks for one.
    let err = node.fails(&["get", "--raw", "/api/v1/namespaces/default/pods/pair/log"]);
    assert!(err.contains("a container name must be specified for pod pair, choose one of: [steady flaky]"), "{err}");
    let err = node.fails(&["logs", "ticker", "--previous"]);
    assert!(err.contains("previous terminated container \"main\" in pod \"ticker\" not found"), "{err}");

    // A RuntimeClass names the CRI handler its pods run under; one containerd lacks is reported.
    let classes = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: standard}\nhandler: runc\n---\napiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: absent}\nhandler: nvidia\n";
    node.ok_stdin(&["apply", "-f", "-"], classes);
    let listed = node.ok(&["get", "runtimeclass"]);
    assert!(listed.starts_with("NAME") && listed.contains("HANDLER") && listed.contains("standard   runc"), "{listed}");
    let refused = node
        .kubectl_stdin(&["apply", "-f", "-"], &pod_yaml("classless", "  runtimeClassName: nope\n", "", "sleep 3600"));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("pods \"classless\" is forbidden: pod rejected: RuntimeClass \"nope\" not found"), "{err}");
    node.ok_stdin(&["apply", "-f", "-"], &pod_yaml("classy", "  runtimeClassName: standard\n", "", "sleep 3600"));
    node.wait_pod("classy", 60, "Running", running);
    node.ok_stdin(&["apply", "-f", "-"], &pod_yaml("unhandled", "  runtimeClassName: absent\n", "", "sleep 3600"));
    eventually(30, || {
        let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=unhandled"]);
        (events.contains("FailedCreatePodSandBox") && events.contains("nvidia")).then_some(())
    });
    node.ok(&["delete", "pod", "classy", "unhandled", "--wait=false"]);
}

/// Two agents on one machine, each under its own `--cgroup-root`: one that restarts (and at start
/// removes the cgroups of pods it does not run, as kubelet's housekeeping does) leaves the other's
/// pods running, in their own cgroups.
#[test]
fn agents_sharing_a_machine_leave_each_others_pods_alone() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let first = Node::start("10.52.0.0/16");
    let mut second = Node::start("10.53.0.0/16");
    for node in [&first, &second] {
        eventually(60, || node_ready(node));
    }
    first.ok_stdin(&["apply", "-f", "-"], &pod_yaml("stays", "", "", "sleep 3600"));
    let pod = first.wait_pod("stays", 60, "Running", running);
    let (uid, id) = (pod["metadata"]["uid"].as_str().unwrap().to_string(), container(&pod, 0)["containerID"].clone());
    let root = common::cgroup_root(&first.dir);
    let pod_cgroup = format!("/sys/fs/cgroup/memory{root}/kubepods/besteffort/pod{uid}");
    let unified = format!("/sys/fs/cgroup{root}/kubepods/besteffort/pod{uid}");
    let exists = || std::path::Path::new(&pod_cgroup).is_dir() || std::path::Path::new(&unified).is_dir();
    assert!(exists(), "no cgroup for the pod at {pod_cgroup} or {unified}");

    second.restart_after_kill9();
    eventually(60, || node_ready(&second));
    // A pod of its own running after the restart: its start-up housekeeping has run by then.
    second.ok_stdin(&["apply", "-f", "-"], &pod_yaml("own", "", "", "sleep 3600"));
    second.wait_pod("own", 60, "Running", running);
    let pod = first.pod("stays");
    assert!(running(&pod) && restarts(&pod) == 0 && container(&pod, 0)["containerID"] == id, "{pod:#}");
    assert!(exists(), "the pod's cgroup was removed by the other agent");
    first.ok(&["delete", "pod", "stays", "--wait=false"]);
    second.ok(&["delete", "pod", "own", "--wait=false"]);
}

/// `GET path` on the node endpoint at 127.0.0.1:`port` (see [`https_request`]).
fn https_get(node: &Server, port: u16, path: &str, client: Option<&str>) -> (u16, String) {
    https_request(node, port, "GET", path, client, &[])
}
