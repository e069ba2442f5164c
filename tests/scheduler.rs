//! End-to-end: the scheduler inside the real `cairn server`, with Node objects created through the
//! API (no agent) and pods created with the real kubectl.

mod common;

use std::time::Duration;

use common::{Server, eventually};

/// A Node with the given allocatable CPU (cores), memory and GPUs, labels and taints (YAML flow).
fn node(name: &str, cpu: &str, memory: &str, gpus: u32, labels: &str, taints: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/hostname: {name}, {labels}}}
spec:
  taints: [{taints}]
status:
  capacity: {{cpu: "{cpu}", memory: {memory}, pods: "110", nvidia.com/gpu: "{gpus}"}}
  allocatable: {{cpu: "{cpu}", memory: {memory}, pods: "110", nvidia.com/gpu: "{gpus}"}}
  conditions: [{{type: Ready, status: "True"}}]
"#
    )
}

/// A pod with the given requests and extra spec lines (YAML, indented two spaces under spec).
fn pod(name: &str, cpu: &str, memory: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: c
    image: busybox
    resources:
      requests: {{cpu: "{cpu}", memory: "{memory}"}}
{extra}
"#
    )
}

fn node_of(s: &Server, pod: &str) -> String {
    s.ok(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"])
}

fn wait_bound(s: &Server, pod: &str) -> String {
    eventually(20, || Some(node_of(s, pod)).filter(|n| !n.is_empty()))
}

/// The message of the pod's `PodScheduled` condition once it is False with `reason`.
fn wait_unscheduled(s: &Server, pod: &str, reason: &str) -> String {
    let path = "jsonpath={range .status.conditions[?(@.type==\"PodScheduled\")]}{.status}|{.reason}|{.message}{end}";
    eventually(20, || {
        let c = s.ok(&["get", "pod", pod, "-o", path]);
        let parts: Vec<&str> = c.splitn(3, '|').collect();
        (parts.len() == 3 && parts[0] == "False" && parts[1] == reason).then(|| parts[2].to_string())
    })
}

/// Messages of the pod's events with `reason`.
fn events(s: &Server, pod: &str, reason: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={pod},reason={reason}");
    let out = s.ok(&[
        "get",
        "events",
        "--field-selector",
        &selector,
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    out.lines().map(str::to_string).collect()
}

#[test]
fn selectors_affinity_and_taints_place_pods_like_upstream() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], &node("n1", "4", "8Gi", 0, "zone: a", ""));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &node("n2", "4", "8Gi", 0, "zone: b", "{key: dedicated, value: gpu, effect: NoSchedule}"),
    );
    s.ok_stdin(&["apply", "-f", "-"], &node("n3", "4", "8Gi", 0, "zone: c", ""));

    let tolerate = "  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]";
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("tolerant", "100m", "64Mi", &format!("  nodeSelector: {{zone: b}}\n{tolerate}")),
    );
    assert_eq!(wait_bound(&s, "tolerant"), "n2");

    let affinity = r#"  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: zone, operator: In, values: [c, x]}]"#;
    s.ok_stdin(&["apply", "-f", "-"], &pod("affine", "100m", "64Mi", affinity));
    assert_eq!(wait_bound(&s, "affine"), "n3");

    // The taint and the selector rule out every node.
    s.ok_stdin(&["apply", "-f", "-"], &pod("stuck", "100m", "64Mi", "  nodeSelector: {zone: b}"));
    let msg = wait_unscheduled(&s, "stuck", "Unschedulable");
    assert_eq!(
        msg,
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, \
         2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    );
    let failed = eventually(10, || Some(events(&s, "stuck", "FailedScheduling")).filter(|e| !e.is_empty()));
    assert_eq!(failed, std::slice::from_ref(&msg));
    let describe = s.ok(&["describe", "pod", "stuck"]);
    assert!(describe.contains("FailedScheduling") && describe.contains("default-scheduler"), "{describe}");
    assert!(s.ok(&["get", "pod", "stuck"]).contains("Pending"));

    // Tolerations may be added to a pending pod; the update requeues it.
    s.ok(&[
        "patch",
        "pod",
        "stuck",
        "--type=json",
        "-p",
        r#"[{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "dedicated", "operator": "Exists"}}]"#,
    ]);
    assert_eq!(wait_bound(&s, "stuck"), "n2");
    let scheduled = eventually(10, || Some(events(&s, "stuck", "Scheduled")).filter(|e| !e.is_empty()));
    assert_eq!(scheduled, ["Successfully assigned default/stuck to n2"]);
    let cond =
        s.ok(&["get", "pod", "stuck", "-o", "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].status}"]);
    assert_eq!(cond, "True");

    // A node gaining the required label takes the waiting pod.
    s.ok_stdin(&["apply", "-f", "-"], &pod("ssd", "100m", "64Mi", "  nodeSelector: {storage: ssd}"));
    wait_unscheduled(&s, "ssd", "Unschedulable");
    s.ok(&["label", "node", "n3", "storage=ssd"]);
    assert_eq!(wait_bound(&s, "ssd"), "n3");
}

#[test]
fn resources_exhausted_then_freed_and_cordon() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], &node("small", "1", "2Gi", 0, "zone: a", ""));
    s.ok_stdin(&["apply", "-f", "-"], &pod("big", "800m", "1Gi", ""));
    assert_eq!(wait_bound(&s, "big"), "small");

    s.ok_stdin(&["apply", "-f", "-"], &pod("waiting", "500m", "1536Mi", ""));
    let msg = wait_unscheduled(&s, "waiting", "Unschedulable");
    assert_eq!(
        msg,
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory. \
         preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    );

    // A label change that frees nothing does not help; deleting the big pod does.
    s.ok(&["label", "node", "small", "unrelated=yes"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(node_of(&s, "waiting"), "");
    s.ok(&["delete", "pod", "big", "--grace-period=0", "--force"]);
    assert_eq!(wait_bound(&s, "waiting"), "small");

    // A cordoned node takes no new pods until it is uncordoned.
    s.ok(&["cordon", "small"]);
    s.ok_stdin(&["apply", "-f", "-"], &pod("late", "100m", "64Mi", ""));
    let msg = wait_unscheduled(&s, "late", "Unschedulable");
    assert_eq!(
        msg,
        "0/1 nodes are available: 1 node(s) were unschedulable. \
         preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    );
    s.ok(&["uncordon", "small"]);
    assert_eq!(wait_bound(&s, "late"), "small");

    // Pods tolerating the cordon taint may still go there.
    s.ok(&["cordon", "small"]);
    let tolerate = "  tolerations: [{key: node.kubernetes.io/unschedulable, operator: Exists, effect: NoSchedule}]";
    s.ok_stdin(&["apply", "-f", "-"], &pod("tolerant", "100m", "64Mi", tolerate));
    assert_eq!(wait_bound(&s, "tolerant"), "small");
}

#[test]
fn scheduling_gates_hold_pods_until_removed() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], &node("n1", "2", "4Gi", 0, "zone: a", ""));
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("gated", "100m", "64Mi", "  schedulingGates: [{name: example.com/foo}, {name: example.com/bar}]"),
    );
    let get = || s.ok(&["get", "pod", "gated"]);
    assert!(get().contains("SchedulingGated"), "{}", get());
    s.ok(&["patch", "pod", "gated", "--type=json", "-p", r#"[{"op": "remove", "path": "/spec/schedulingGates/0"}]"#]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(node_of(&s, "gated"), "");
    assert!(get().contains("SchedulingGated"), "{}", get());
    s.ok(&["patch", "pod", "gated", "--type=json", "-p", r#"[{"op": "remove", "path": "/spec/schedulingGates"}]"#]);
    assert_eq!(wait_bound(&s, "gated"), "n1");
    assert!(events(&s, "gated", "FailedScheduling").is_empty());
}

const GPU_PROFILES: &str = r#"apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
- schedulerName: gpu-binpack-scheduler
  plugins:
    score:
      disabled: [{name: ImageLocality}]
      enabled: [{name: NodeResourcesFit, weight: 5}, {name: PodTopologySpread, weight: 3}]
    postFilter:
      disabled: [{name: DefaultPreemption}]
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}, {name: nvidia.com/gpu, weight: 5}]
"#;

#[test]
fn a_second_profile_bin_packs_gpus_and_unknown_schedulers_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scheduler.yaml");
    std::fs::write(&config, GPU_PROFILES).unwrap();
    let s = Server::start_with(dir, &["--scheduler-config", config.to_str().unwrap()]);
    for n in ["n1", "n2"] {
        s.ok_stdin(&["apply", "-f", "-"], &node(n, "4", "8Gi", 2, "zone: a", ""));
    }
    let gpu = |name: &str, extra: &str| {
        let limits = "    resources:\n      requests: {cpu: 1, memory: 2Gi, nvidia.com/gpu: 1}\n      limits: {nvidia.com/gpu: 1}";
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: busybox\n{limits}\n{extra}\n"
        )
    };
    // Already running on n1: placed by hand.
    s.ok_stdin(&["apply", "-f", "-"], &gpu("running", "  nodeName: n1"));
    s.ok_stdin(&["apply", "-f", "-"], &gpu("packed", "  schedulerName: gpu-binpack-scheduler"));
    assert_eq!(wait_bound(&s, "packed"), "n1", "MostAllocated with GPU weight 5 packs onto n1");
    let from = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=packed",
        "-o",
        "jsonpath={.items[0].source.component}",
    ]);
    assert_eq!(from, "gpu-binpack-scheduler");

    s.ok(&["delete", "pod", "packed", "--grace-period=0", "--force"]);
    s.ok_stdin(&["apply", "-f", "-"], &gpu("spread", ""));
    assert_eq!(wait_bound(&s, "spread"), "n2", "LeastAllocated spreads onto n2");

    // With no room anywhere, the profile without preemption leaves lower-priority pods alone.
    s.ok_stdin(&["apply", "-f", "-"], &gpu("fill-1", ""));
    s.ok_stdin(&["apply", "-f", "-"], &gpu("fill-2", ""));
    wait_bound(&s, "fill-1");
    wait_bound(&s, "fill-2");
    s.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: top}\nvalue: 100\n",
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &gpu("no-preempt", "  schedulerName: gpu-binpack-scheduler\n  priorityClassName: top"),
    );
    let msg = wait_unscheduled(&s, "no-preempt", "Unschedulable");
    assert_eq!(msg, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
    let preempted = s.ok(&["get", "pods", "-o", "jsonpath={.items[*].metadata.deletionTimestamp}"]);
    assert_eq!(preempted, "", "no pod was preempted");

    s.ok_stdin(&["apply", "-f", "-"], &gpu("orphan", "  schedulerName: nobody"));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(node_of(&s, "orphan"), "");
    assert!(events(&s, "orphan", "FailedScheduling").is_empty());
}

#[test]
fn bad_scheduler_config_fails_at_startup_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("profiles:\n- schedulerName: a\n- schedulerName: a\n", "profiles[1].schedulerName: Duplicate value"),
        (
            "profiles:\n- schedulerName: a\n  plugins:\n    score:\n      enabled: [{name: Nope}]\n",
            "unknown plugin \"Nope\"",
        ),
        (
            "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args: {scoringStrategy: {type: MostAllocated, resources: [{name: cpu, weight: 101}]}}\n",
            "resource weight of cpu not in valid range (0, 100]",
        ),
        ("percentageOfNodesToScore: 120\n", "percentageOfNodesToScore: Invalid value: 120"),
        ("profiles: [{schedulerName: a, bogus: 1}]\n", "bogus"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&path, text).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["server", "--data-dir"])
            .arg(dir.path().join(format!("data{i}")))
            .args(["--disable-agent", "--https-listen-port", "0", "--bind-address", "127.0.0.1", "--write-kubeconfig"])
            .arg(dir.path().join("kc.yaml"))
            .arg("--scheduler-config")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A configuration that is wrongly accepted leaves a running server: stop it and fail.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let started = child.try_wait().unwrap().is_none();
        if started {
            let _ = child.kill();
        }
        assert!(!started, "case {i} started");
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} succeeded");
        assert!(err.contains(expected) && err.contains("scheduler"), "case {i}: {err}");
    }
}

const PRIORITY_CLASSES: &str = r#"apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
description: urgent work
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high-waits}
value: 1000
preemptionPolicy: Never
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: guarded}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: guarded}}
"#;

fn pod_status(s: &Server, pod: &str, path: &str) -> String {
    s.ok(&["get", "pod", pod, "-o", &format!("jsonpath={path}")])
}

#[test]
fn higher_priority_pods_preempt_lower_ones_as_upstream() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], PRIORITY_CLASSES);
    let classes = s.ok(&["get", "priorityclasses"]);
    let header: Vec<&str> = classes.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]);
    assert!(classes.contains("system-node-critical") && classes.contains("2000001000"), "{classes}");
    let refused = s.fails(&["delete", "priorityclass", "system-node-critical"]);
    assert!(refused.contains("this is a system priority class and cannot be deleted"), "{refused}");
    let unknown = s.kubectl_stdin(&["apply", "-f", "-"], &pod("lost", "100m", "64Mi", "  priorityClassName: nope"));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("no PriorityClass with name nope was found"), "{stderr}");

    // A full node: two low-priority pods, one of them guarded by a PodDisruptionBudget.
    s.ok_stdin(&["apply", "-f", "-"], &node("full", "2", "4Gi", 0, "zone: a", ""));
    let low = "  priorityClassName: low\n  terminationGracePeriodSeconds: 30";
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod("guarded", "1", "1Gi", low).replace("name: guarded", "name: guarded\n  labels: {app: guarded}"),
    );
    s.ok_stdin(&["apply", "-f", "-"], &pod("plain", "1", "1Gi", low));
    assert_eq!(wait_bound(&s, "guarded"), "full");
    assert_eq!(wait_bound(&s, "plain"), "full");
    assert_eq!(pod_status(&s, "plain", "{.spec.priority}"), "10");

    // The high-priority pod preempts the unguarded one, is nominated and waits for it to go.
    s.ok_stdin(&["apply", "-f", "-"], &pod("urgent", "1", "1Gi", "  priorityClassName: high"));
    eventually(20, || (pod_status(&s, "urgent", "{.status.nominatedNodeName}") == "full").then_some(()));
    let msg = wait_unscheduled(&s, "urgent", "Unschedulable");
    assert!(msg.starts_with("0/1 nodes are available: 1 Insufficient cpu."), "{msg}");
    let condition = eventually(20, || {
        let c = pod_status(&s, "plain", "{.status.conditions[?(@.type==\"DisruptionTarget\")]}");
        (!c.is_empty()).then_some(c)
    });
    let condition: serde_json::Value = serde_json::from_str(&condition).unwrap();
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "PreemptionByScheduler");
    assert_eq!(condition["message"], "default-scheduler: preempting to accommodate a higher priority pod");
    assert!(!pod_status(&s, "plain", "{.metadata.deletionTimestamp}").is_empty(), "deleted gracefully");
    let uid = pod_status(&s, "urgent", "{.metadata.uid}");
    assert_eq!(events(&s, "plain", "Preempted"), [format!("Preempted by pod {uid} on node full")]);
    assert!(pod_status(&s, "guarded", "{.metadata.deletionTimestamp}").is_empty(), "the budget kept it");
    assert_eq!(node_of(&s, "urgent"), "", "never bound straight from preemption");

    // A pod of the same priority that may not preempt waits, and leaves the nominated room alone.
    s.ok_stdin(&["apply", "-f", "-"], &pod("patient", "1", "1Gi", "  priorityClassName: high-waits"));
    let msg = wait_unscheduled(&s, "patient", "Unschedulable");
    assert_eq!(
        msg,
        "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never."
    );

    // Once the victim is gone (here its node has no agent to finish the deletion), the
    // preemptor takes its place; the patient pod keeps waiting.
    s.ok(&["delete", "pod", "plain", "--grace-period=0", "--force"]);
    assert_eq!(wait_bound(&s, "urgent"), "full");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(node_of(&s, "patient"), "");
    assert!(events(&s, "guarded", "Preempted").is_empty());
}
