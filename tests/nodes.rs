//! End to end: the node lifecycle. The real cairn runs its agent (a node that keeps sending
//! heartbeats) beside a Node made through the API that posts one status and goes silent, as a
//! machine that lost its network does; the real kubectl watches what the control plane makes of it.
//!
//! Needs root, containerd, runc and busybox-static (`.ci/run` installs them).

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

use chrono::{SecondsFormat, Utc};
use common::{Server, eventually};
use node::{Node, node_ready};

fn get(s: &Server, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jsonpath = format!("jsonpath={path}");
    args.extend(["-o", jsonpath.as_str()]);
    s.ok(&args)
}

fn ready_condition(s: &Server, node: &str) -> String {
    get(s, &["node", node], r#"{range .status.conditions[?(@.type=="Ready")]}{.status}|{.reason}|{.message}{end}"#)
}

fn taints(s: &Server, node: &str) -> String {
    get(s, &["node", node], "{range .spec.taints[*]}{.key}:{.effect} {end}")
}

fn events(s: &Server, name: &str) -> String {
    s.ok(&["get", "events", "--field-selector", &format!("involvedObject.name={name}"), "-o", "wide"])
}

/// A pod bound to `node` (no scheduler, no kubelet), with extra tolerations (JSON).
fn bound_pod(name: &str, node: &str, tolerations: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}"}},
          "spec": {{"nodeName": "{node}", "tolerations": {tolerations},
            "containers": [{{"name": "c", "image": "{image}"}}]}}}}"#,
        image = busybox::BUSYBOX
    )
}

/// The kubelet's part, posted by hand: the node Ready now, its Lease renewed now.
fn heartbeat(s: &Server, node: &str) {
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let status = format!(
        r#"{{"status": {{"conditions": [{{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": "{now}", "lastTransitionTime": "{now}"}}]}}}}"#
    );
    s.ok(&["patch", "node", node, "--subresource=status", "--type=merge", "-p", &status]);
    let renewed = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    let lease = format!(
        r#"{{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {{"name": "{node}", "namespace": "kube-node-lease"}},
          "spec": {{"holderIdentity": "{node}", "leaseDurationSeconds": 40, "renewTime": "{renewed}"}}}}"#
    );
    s.ok_stdin(&["apply", "-f", "-"], &lease);
}

/// A node that stops sending heartbeats turns Unknown after the grace period, is tainted
/// unreachable, its pods turn unready and those that tolerate the taint only briefly are evicted;
/// the node that keeps its heartbeats is left alone, and a node that comes back loses its taints.
#[test]
fn a_silent_node_is_marked_unknown_tainted_and_evicted_from() {
    let node = Node::start_with("10.54.0.0/16", &["--node-monitor-grace-period=20s"]);
    eventually(60, || node_ready(&node));
    let local = get(&node, &["nodes", "-l", "node-role.kubernetes.io/control-plane"], "{.items[0].metadata.name}");
    assert_eq!(get(&node, &["node", &local], "{.spec.podCIDR}"), "10.54.0.0/24");

    node.ok_stdin(&["create", "-f", "-"], r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}}"#);
    heartbeat(&node, "edge-1");
    // Node IPAM gives it the next /24, past the one the server's own node uses.
    eventually(10, || (get(&node, &["node", "edge-1"], "{.spec.podCIDR}") == "10.54.1.0/24").then_some(()));
    let brief = r#"[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]"#;
    let forever = r#"[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]"#;
    for (name, tolerations) in [("brief", brief), ("patient", "[]"), ("steadfast", forever)] {
        node.ok_stdin(&["create", "-f", "-"], &bound_pod(name, "edge-1", tolerations));
        let status = r#"{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}"#;
        node.ok(&["patch", "pod", name, "--subresource=status", "--type=merge", "-p", status]);
    }
    // The default tolerations (DefaultTolerationSeconds admission) give "patient" 300 s.
    let seconds = r#"{.spec.tolerations[?(@.key=="node.kubernetes.io/unreachable")].tolerationSeconds}"#;
    assert_eq!(get(&node, &["pod", "patient"], seconds), "300");

    // Silent past the grace period: Unknown, as upstream words it, and tainted.
    let unknown = eventually(60, || Some(ready_condition(&node, "edge-1")).filter(|c| c.starts_with("Unknown")));
    assert_eq!(unknown, "Unknown|NodeStatusUnknown|Kubelet stopped posting node status.");
    let pressure = r#"{range .status.conditions[?(@.type=="DiskPressure")]}{.status}|{.reason}{end}"#;
    assert_eq!(get(&node, &["node", "edge-1"], pressure), "Unknown|NodeStatusNeverUpdated");
    eventually(30, || {
        let t = taints(&node, "edge-1");
        (t.contains("node.kubernetes.io/unreachable:NoSchedule")
            && t.contains("node.kubernetes.io/unreachable:NoExecute"))
        .then_some(())
    });
    assert!(!get(&node, &["node", "edge-1"], "{.spec.taints[?(@.effect==\"NoExecute\")].timeAdded}").is_empty());
    let not_ready = r#"{.status.conditions[?(@.type=="Ready")].status}"#;
    eventually(30, || (get(&node, &["pod", "patient"], not_ready) == "False").then_some(()));
    eventually(30, || events(&node, "patient").contains("Node is not ready").then_some(()));
    eventually(30, || events(&node, "edge-1").contains("Node edge-1 status is now: NodeNotReady").then_some(()));

    // The pod that tolerates the taint for 2 s is evicted, marked as the taint manager marks it.
    eventually(30, || (!get(&node, &["pod", "brief"], "{.metadata.deletionTimestamp}").is_empty()).then_some(()));
    let target = r#"{range .status.conditions[?(@.type=="DisruptionTarget")]}{.status}|{.reason}|{.message}{end}"#;
    assert_eq!(
        get(&node, &["pod", "brief"], target),
        "True|DeletionByTaintManager|Taint manager: deleting due to NoExecute taint"
    );
    eventually(30, || events(&node, "brief").contains("Marking for deletion Pod default/brief").then_some(()));
    for stays in ["patient", "steadfast"] {
        assert_eq!(get(&node, &["pod", stays], "{.metadata.deletionTimestamp}"), "", "{stays} was evicted");
    }

    // The node with heartbeats is untouched, and the controller registered it.
    assert!(ready_condition(&node, &local).starts_with("True|KubeletReady"), "{}", ready_condition(&node, &local));
    assert_eq!(taints(&node, &local), "");
    assert!(events(&node, &local).contains(&format!("Node {local} event: Registered Node {local} in Controller")));

    // Back: the kubelet posts again, and the taints go.
    heartbeat(&node, "edge-1");
    eventually(30, || {
        (ready_condition(&node, "edge-1").starts_with("True") && taints(&node, "edge-1").is_empty()).then_some(())
    });
    assert_eq!(get(&node, &["pod", "steadfast"], "{.metadata.deletionTimestamp}"), "");

    // Cordoning is a taint too (TaintNodesByCondition), and uncordoning removes it.
    node.ok(&["cordon", "edge-1"]);
    eventually(30, || (taints(&node, "edge-1") == "node.kubernetes.io/unschedulable:NoSchedule ").then_some(()));
    node.ok(&["uncordon", "edge-1"]);
    eventually(30, || taints(&node, "edge-1").is_empty().then_some(()));

    // A deleted node takes its pods along (PodGC).
    node.ok(&["delete", "node", "edge-1"]);
    eventually(60, || node.ok(&["get", "pods", "-o", "name"]).trim().is_empty().then_some(()));
}

/// Node IPAM: each Node gets a /24 of `--cluster-cidr` of its own; when they run out a Node waits
/// (`CIDRNotAvailable`) until a deleted Node frees one; a restart takes what Nodes hold as taken.
#[test]
fn nodes_get_pod_ranges_of_their_own() {
    let server = Server::start_with(tempfile::tempdir().unwrap(), &["--cluster-cidr", "10.98.0.0/23"]);
    let create = |name: &str| {
        let node = format!(r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{name}"}}}}"#);
        server.ok_stdin(&["create", "-f", "-"], &node);
    };
    let range = |s: &Server, name: &str| get(s, &["node", name], "{.spec.podCIDR}|{.spec.podCIDRs[*]}");
    create("n1");
    create("n2");
    eventually(10, || (range(&server, "n1") == "10.98.0.0/24|10.98.0.0/24").then_some(()));
    eventually(10, || (range(&server, "n2") == "10.98.1.0/24|10.98.1.0/24").then_some(()));
    create("n3");
    eventually(10, || events(&server, "n3").contains("Node n3 status is now: CIDRNotAvailable").then_some(()));
    assert_eq!(range(&server, "n3"), "|");
    server.ok(&["delete", "node", "n1"]);
    eventually(10, || (range(&server, "n3") == "10.98.0.0/24|10.98.0.0/24").then_some(()));
    // A set range is the Node's for good.
    let err = server.fails(&["patch", "node", "n3", "--type=merge", "-p", r#"{"spec": {"podCIDR": "10.98.1.0/24"}}"#]);
    assert!(err.contains("node updates may not change podCIDR"), "{err}");

    // After a restart the ranges Nodes hold stay theirs.
    let dir = server.kill9();
    let server = Server::start_with(dir, &["--cluster-cidr", "10.98.0.0/23"]);
    server.ok(&["delete", "node", "n2"]);
    server.ok_stdin(&["create", "-f", "-"], r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n4"}}"#);
    eventually(10, || (range(&server, "n4") == "10.98.1.0/24|10.98.1.0/24").then_some(()));
    assert_eq!(range(&server, "n3"), "10.98.0.0/24|10.98.0.0/24");
}
