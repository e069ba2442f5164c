//! End-to-end: the real `cairn server` driven by the real kubectl 1.37.

mod common;

use common::{Server, eventually};

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: c
    image: busybox
    ports: [{containerPort: 80}]
    env: [{name: A, value: "1"}]
"#;

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {node-role.kubernetes.io/control-plane: "true"}
status:
  conditions: [{type: Ready, status: "True"}]
  addresses: [{type: InternalIP, address: 192.0.2.10}]
  nodeInfo: {kubeletVersion: v1.37.0, machineID: "", systemUUID: "", bootID: "", kernelVersion: "6.1.0",
    osImage: "Debian GNU/Linux 12", containerRuntimeVersion: "containerd://1.6.20", kubeProxyVersion: "",
    operatingSystem: linux, architecture: amd64}
"#;

fn header(out: &str) -> Vec<&str> {
    out.lines().next().unwrap_or_default().split_whitespace().collect()
}

#[test]
fn version_discovery_and_explain() {
    let s = Server::start();
    let v = s.ok(&["version"]);
    assert!(v.contains("Server Version: v1.37.0+cairn"), "{v}");
    let r = s.ok(&["api-resources"]);
    for line in ["pods ", "nodes ", "namespaces ", "leases ", "configmaps ", "secrets ", "serviceaccounts ", "events "]
    {
        assert!(r.contains(line), "{line} missing from api-resources:\n{r}");
    }
    assert!(r.lines().any(|l| l.starts_with("pods") && l.contains("po") && l.contains("true") && l.contains("Pod")));
    let e = s.ok(&["explain", "pod.spec.containers"]);
    assert!(e.contains("FIELD: containers <[]Container>"), "{e}");
    assert!(e.contains("image\t<string>"), "{e}");
    let ns = s.ok(&["get", "namespaces"]);
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.lines().any(|l| l.starts_with(n) && l.contains("Active")), "{n} missing:\n{ns}");
    }
    assert_eq!(header(&ns), ["NAME", "STATUS", "AGE"]);

    // Health checks as kube-apiserver's: every check listed when verbose, one by one, some excluded.
    assert_eq!(
        s.ok(&["get", "--raw", "/readyz?verbose"]),
        "[+]ping ok\n[+]log ok\n[+]etcd ok\n[+]etcd-readiness ok\n[+]informer-sync ok\nreadyz check passed\n"
    );
    assert_eq!(
        s.ok(&["get", "--raw", "/livez?verbose&exclude=etcd"]),
        "[+]ping ok\n[+]log ok\n[+]etcd excluded: ok\nlivez check passed\n"
    );
    assert_eq!(s.ok(&["get", "--raw", "/healthz"]), "ok");
    assert_eq!(s.ok(&["get", "--raw", "/readyz/etcd"]), "ok");
    assert!(s.fails(&["get", "--raw", "/livez/informer-sync"]).contains("NotFound"));
}

#[test]
fn pods_apply_get_patch_describe_delete() {
    let s = Server::start();
    assert!(s.ok_stdin(&["apply", "-f", "-"], POD).contains("pod/web created"));
    let wide = s.ok(&["get", "pods", "-o", "wide"]);
    assert_eq!(
        header(&wide),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    );
    let row: Vec<&str> = wide.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!((row[0], row[1], row[2], row[3]), ("web", "0/1", "Pending", "0"));
    assert_eq!(&row[5..], ["<none>", "<none>", "<none>", "<none>"]);

    // Applying again with a change goes through a strategic merge patch.
    let changed = POD.replace("image: busybox", "image: busybox:1.36");
    assert!(s.ok_stdin(&["apply", "-f", "-"], &changed).contains("pod/web configured"));
    assert_eq!(s.ok(&["get", "pod", "web", "-o", "jsonpath={.spec.containers[0].image}"]), "busybox:1.36");

    s.ok(&["label", "pod", "web", "tier=front"]);
    s.ok(&["annotate", "pod", "web", "note=hello"]);
    s.ok(&["patch", "pod", "web", "--type=merge", "-p", r#"{"metadata":{"labels":{"m":"1"}}}"#]);
    s.ok(&["patch", "pod", "web", "--type=json", "-p", r#"[{"op":"add","path":"/metadata/labels/j","value":"2"}]"#]);
    s.ok(&["patch", "pod", "web", "-p", r#"{"spec":{"containers":[{"name":"c","image":"busybox:1.37"}]}}"#]);
    let labels = s.ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.labels}"]);
    for l in [r#""tier":"front""#, r#""m":"1""#, r#""j":"2""#, r#""app":"web""#] {
        assert!(labels.contains(l), "{l} missing from {labels}");
    }
    // The strategic merge kept the container's other fields and bumped the generation.
    assert_eq!(
        s.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.containers[0].image} {.spec.containers[0].env[0].name} {.metadata.generation}"
        ]),
        "busybox:1.37 A 3"
    );
    assert_eq!(s.ok(&["get", "pods", "-l", "tier=front", "-o", "name"]).trim(), "pod/web");
    assert_eq!(s.ok(&["get", "pods", "-l", "tier notin (front)", "-o", "name"]).trim(), "");
    let cc =
        s.ok(&["get", "pods", "-o", "custom-columns=NAME:.metadata.name,PHASE:.status.phase,QOS:.status.qosClass"]);
    assert!(cc.contains("web    Pending   BestEffort"), "{cc}");
    let yaml = s.ok(&["get", "pod", "web", "-o", "yaml"]);
    assert!(yaml.contains("schedulerName: default-scheduler") && yaml.contains("tolerationSeconds: 300"), "{yaml}");

    let d = s.ok(&["describe", "pod", "web"]);
    let field = |name: &str| d.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_default();
    assert_eq!(field("Status:"), "Pending", "{d}");
    assert_eq!(field("QoS Class:"), "BestEffort", "{d}");
    assert_eq!(field("Node:"), "<none>", "{d}");
    assert!(d.contains("node.kubernetes.io/not-ready:NoExecute op=Exists for 300s"), "{d}");

    // kubectl edit, with a non-interactive editor.
    let edit = s.kubectl_edit(&["edit", "pod", "web"], "s/busybox:1.37/busybox:1.38/");
    assert!(edit.contains("pod/web edited"), "{edit}");
    assert_eq!(s.ok(&["get", "pod", "web", "-o", "jsonpath={.spec.containers[0].image}"]), "busybox:1.38");

    // An unscheduled pod goes at once.
    assert!(s.ok(&["delete", "pod", "web"]).contains("pod \"web\" deleted"));
    assert!(s.fails(&["get", "pod", "web"]).contains("pods \"web\" not found"));
}

#[test]
fn nodes_binding_and_graceful_deletion() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], NODE);
    let nodes = s.ok(&["get", "nodes"]);
    assert_eq!(header(&nodes), ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    let row: Vec<&str> = nodes.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!((row[0], row[1], row[2], row[4]), ("n1", "Ready", "control-plane", "v1.37.0"));
    let wide = s.ok(&["get", "nodes", "-o", "wide"]);
    assert!(wide.contains("192.0.2.10") && wide.contains("containerd://1.6.20"), "{wide}");
    s.ok(&["cordon", "n1"]);
    assert!(s.ok(&["get", "nodes"]).contains("Ready,SchedulingDisabled"));

    s.ok_stdin(&["apply", "-f", "-"], POD);
    let binding =
        r#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"web"},"target":{"kind":"Node","name":"n1"}}"#;
    let path = s.dir.path().join("binding.json");
    std::fs::write(&path, binding).unwrap();
    let raw = "/api/v1/namespaces/default/pods/web/binding";
    s.ok(&["create", "--raw", raw, "-f", path.to_str().unwrap()]);
    let again = s.fails(&["create", "--raw", raw, "-f", path.to_str().unwrap()]);
    assert!(again.contains("already assigned to node"), "{again}");
    assert_eq!(s.ok(&["get", "pod", "web", "-o", "jsonpath={.spec.nodeName}"]), "n1");
    s.ok(&["wait", "--for=condition=PodScheduled", "pod/web", "--timeout=10s"]);

    // A pod on a live node waits for the node to confirm: it shows Terminating.
    s.ok(&["delete", "pod", "web", "--wait=false"]);
    let pods = s.ok(&["get", "pods"]);
    assert!(pods.contains("Terminating"), "{pods}");
    assert_eq!(s.ok(&["get", "pod", "web", "-o", "jsonpath={.metadata.deletionGracePeriodSeconds}"]), "30");
    // Deleting the node removes its pods.
    s.ok(&["delete", "node", "n1"]);
    eventually(10, || s.fails(&["get", "pod", "web"]).contains("not found").then_some(()));
}

#[test]
fn watch_prints_changes() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], POD);
    let watch = std::process::Command::new(common::kubectl_path())
        .args(["--kubeconfig", s.kubeconfig.to_str().unwrap(), "get", "pods", "-w", "--request-timeout=6s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    s.ok(&["label", "pod", "web", "x=y"]);
    s.ok(&["delete", "pod", "web"]);
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(header(&text), ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{text}");
    assert!(lines.len() >= 3, "expected the initial row and the changes:\n{text}");
    assert!(lines[1..].iter().all(|l| l.starts_with("web ")), "{text}");
}

#[test]
fn namespace_deletion_removes_contents() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n");
    eventually(10, || s.kubectl(&["get", "sa", "default", "-n", "team"]).status.success().then_some(()));
    s.ok_stdin(&["apply", "-n", "team", "-f", "-"], POD);
    s.ok_stdin(
        &["apply", "-n", "team", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n",
    );
    s.ok_stdin(
        &["apply", "-n", "team", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, finalizers: [example.com/hold]}\n",
    );
    s.ok(&["delete", "namespace", "team", "--wait=false"]);
    // The finalizer holds the namespace in Terminating, and its conditions say so.
    let message = |t: &str| format!("jsonpath={{.status.conditions[?(@.type==\"{t}\")].message}}");
    let held = eventually(20, || {
        let m = s.ok(&["get", "namespace", "team", "-o", &message("NamespaceFinalizersRemaining")]);
        (m == "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances")
            .then_some(m)
    });
    assert!(!held.is_empty());
    assert_eq!(s.ok(&["get", "namespace", "team", "-o", "jsonpath={.status.phase}"]), "Terminating");
    assert_eq!(
        s.ok(&["get", "namespace", "team", "-o", &message("NamespaceContentRemaining")]),
        "Some resources are remaining: configmaps has 1 resource instances"
    );
    assert_eq!(
        s.ok(&["get", "namespace", "team", "-o", &message("NamespaceDeletionDiscoveryFailure")]),
        "All resources successfully discovered"
    );
    assert_eq!(s.ok(&["get", "pods,cm", "-n", "team", "-o", "name"]).trim(), "configmap/held");
    s.ok(&["patch", "configmap", "held", "-n", "team", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    s.ok(&["wait", "--for=delete", "namespace/team", "--timeout=20s"]);
    assert!(s.fails(&["get", "namespace", "team"]).contains("not found"));
    // Recreating it starts empty, but for the cluster CA every namespace gets.
    s.ok_stdin(&["apply", "-f", "-"], "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n");
    let left = s.ok(&["get", "cm,pods", "-n", "team", "-o", "name"]);
    assert!(left.lines().all(|l| l == "configmap/kube-root-ca.crt"), "{left}");
}

#[test]
fn configmaps_secrets_and_service_accounts() {
    let s = Server::start();
    s.ok(&["create", "namespace", "apps"]);
    s.ok(&["create", "configmap", "settings", "-n", "apps", "--from-literal=mode=fast", "--from-literal=level=3"]);
    s.ok(&["create", "secret", "generic", "creds", "-n", "apps", "--from-literal=password=s3cret"]);
    s.ok(&["create", "serviceaccount", "robot", "-n", "apps"]);
    let cm = s.ok(&["get", "cm", "-n", "apps"]);
    assert_eq!(header(&cm), ["NAME", "DATA", "AGE"]);
    assert!(cm.lines().any(|l| l.starts_with("settings") && l.split_whitespace().nth(1) == Some("2")), "{cm}");
    let sec = s.ok(&["get", "secrets", "-n", "apps"]);
    assert_eq!(header(&sec), ["NAME", "TYPE", "DATA", "AGE"]);
    assert!(sec.contains("creds") && sec.contains("Opaque"), "{sec}");
    assert_eq!(s.ok(&["get", "secret", "creds", "-n", "apps", "-o", "jsonpath={.data.password}"]), "czNjcmV0");
    let sa = s.ok(&["get", "sa", "-n", "apps", "-o", "name"]);
    assert!(sa.contains("serviceaccount/robot") && sa.contains("serviceaccount/default"), "{sa}");
    let dup = s.fails(&["create", "configmap", "settings", "-n", "apps"]);
    assert!(dup.contains("AlreadyExists") || dup.contains("already exists"), "{dup}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let s = Server::start();
    let no_image = POD.replace("    image: busybox\n", "");
    let err = String::from_utf8_lossy(&s.kubectl_stdin(&["apply", "-f", "-"], &no_image).stderr).into_owned();
    assert!(err.contains("spec.containers[0].image: Required value"), "{err}");
    let unknown = POD.replace("  containers:", "  bogusField: 1\n  containers:");
    let err = String::from_utf8_lossy(&s.kubectl_stdin(&["apply", "-f", "-"], &unknown).stderr).into_owned();
    assert!(err.contains("unknown field \"spec.bogusField\""), "{err}");
    assert!(s.fails(&["get", "pods", "-l", "a in (b"]).contains("unable to parse"));
    assert!(s.fails(&["get", "pods", "--field-selector", "spec.bogus=1"]).contains("field label not supported"));
    assert!(s.fails(&["get", "nosuchthings"]).contains("the server doesn't have a resource type"));
    // A kind nobody serves: kubectl's validation reads the OpenAPI v2 document (as protobuf), finds
    // nothing, and the mapping says what is wrong.
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n";
    let err = String::from_utf8_lossy(&s.kubectl_stdin(&["apply", "-f", "-"], widget).stderr).into_owned();
    assert!(err.contains(r#"no matches for kind "Widget" in version "example.com/v1""#), "{err}");
    // Nothing was stored by the failures.
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "");
    // A List is applied item by item.
    let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: listed}\n";
    assert!(s.ok_stdin(&["apply", "-f", "-"], list).contains("configmap/listed created"));
}

#[test]
fn wrong_credentials_are_refused() {
    let s = Server::start();
    let out = std::process::Command::new(common::kubectl_path())
        .args(["--server", &s.url, "--insecure-skip-tls-verify", "--token", "not-the-token", "get", "pods"])
        .env("KUBECONFIG", s.dir.path().join("absent.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Unauthorized") || err.contains("provide credentials"), "{err}");
}

/// A ConfigMap owned by another through `ownerReferences`.
fn dependent(name: &str, owner_uid: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {owner_uid}\n    blockOwnerDeletion: true\n"
    )
}

#[test]
fn deletion_propagates_to_dependents() {
    let s = Server::start();
    let owner = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: owner}\n";
    let uid_of = |s: &Server| s.ok(&["get", "cm", "owner", "-o", "jsonpath={.metadata.uid}"]);

    // Background (the default): the dependent goes after the owner.
    s.ok_stdin(&["apply", "-f", "-"], owner);
    s.ok_stdin(&["apply", "-f", "-"], &dependent("dep", &uid_of(&s)));
    s.ok(&["delete", "cm", "owner"]);
    eventually(10, || s.fails(&["get", "cm", "dep"]).contains("not found").then_some(()));

    // Orphan: the dependent stays and loses its owner reference.
    s.ok_stdin(&["apply", "-f", "-"], owner);
    s.ok_stdin(&["apply", "-f", "-"], &dependent("kept", &uid_of(&s)));
    s.ok(&["delete", "cm", "owner", "--cascade=orphan"]);
    eventually(10, || s.fails(&["get", "cm", "owner"]).contains("not found").then_some(()));
    assert_eq!(s.ok(&["get", "cm", "kept", "-o", "jsonpath={.metadata.ownerReferences}"]), "");

    // Foreground: the owner waits for its dependents, then goes.
    s.ok_stdin(&["apply", "-f", "-"], owner);
    s.ok_stdin(&["apply", "-f", "-"], &dependent("fg", &uid_of(&s)));
    s.ok(&["delete", "cm", "owner", "--cascade=foreground", "--timeout=20s"]);
    assert!(s.fails(&["get", "cm", "fg"]).contains("not found"));
    assert!(s.fails(&["get", "cm", "owner"]).contains("not found"));
}

#[test]
fn metrics_count_store_flushes() {
    let s = Server::start();
    for i in 0..3 {
        s.ok_stdin(&["apply", "-f", "-"], &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: m{i}}}\n"));
    }
    let m = s.ok(&["get", "--raw", "/metrics"]);
    let value = |name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    assert!(value("cairn_store_writes_total ") >= 3, "{m}");
    assert!(value("cairn_store_flushes_total ") >= 1, "{m}");
    assert!(value("cairn_store_revision ") >= 3, "{m}");
}

/// HorizontalPodAutoscalers through `kubectl autoscale`, served as autoscaling/v2 and v1 views of
/// one stored object, with upstream's columns, defaults and validation messages.
#[test]
fn horizontal_pod_autoscalers_in_v2_and_v1() {
    let s = Server::start();
    s.ok(&["create", "deployment", "web", "--image=busybox", "--replicas=2"]);
    s.ok(&["autoscale", "deployment", "web", "--min=2", "--max=5", "--cpu=50%", "--memory=200Mi"]);
    let hpa = s.ok(&["get", "hpa"]);
    assert_eq!(header(&hpa), ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]);
    let row = hpa.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with("web") && row.contains("Deployment/web"), "{hpa}");
    assert!(row.contains("cpu: <unknown>/50%, memory: <unknown>/200Mi"), "{hpa}");
    assert_eq!(row.split_whitespace().skip(6).take(3).collect::<Vec<_>>(), ["2", "5", "0"], "{hpa}");
    // The v1 view shows the CPU target as a field and keeps the memory metric in an annotation.
    let v1 = |path: &str| {
        s.ok(&["get", "horizontalpodautoscalers.v1.autoscaling", "web", "-o", &format!("jsonpath={path}")])
    };
    assert_eq!(v1("{.apiVersion} {.spec.targetCPUUtilizationPercentage}"), "autoscaling/v1 50");
    assert!(v1("{.metadata.annotations}").contains("200Mi"));
    // A v1 object without a target gets CPU at 80 %, seen through v2.
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "old"},
          "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 3}}"#,
    );
    let v2 = s.ok(&[
        "get",
        "horizontalpodautoscalers.v2.autoscaling",
        "old",
        "-o",
        "jsonpath={.spec.minReplicas} {.spec.metrics[0].resource}",
    ]);
    assert_eq!(v2, r#"1 {"name":"cpu","target":{"averageUtilization":80,"type":"Utilization"}}"#);
    // Bumping the v1 target through a patch changes the one stored metric.
    s.ok(&[
        "patch",
        "horizontalpodautoscalers.v1.autoscaling",
        "old",
        "--type=merge",
        "-p",
        r#"{"spec":{"targetCPUUtilizationPercentage":65}}"#,
    ]);
    let metrics = s.ok(&["get", "hpa", "old", "-o", "jsonpath={.spec.metrics[*].resource.target.averageUtilization}"]);
    assert_eq!(metrics, "65");
    // Invalid specs are refused with upstream's messages, through either version, and nothing is stored.
    let refused = |version: &str, spec: &str| {
        let hpa = format!(
            r#"{{"apiVersion": "autoscaling/{version}", "kind": "HorizontalPodAutoscaler", "metadata": {{"name": "bad"}},
              "spec": {{"scaleTargetRef": {{"kind": "Deployment", "name": "web"}}, {spec}}}}}"#
        );
        String::from_utf8_lossy(&s.kubectl_stdin(&["apply", "-f", "-"], &hpa).stderr).into_owned()
    };
    let err = refused("v2", r#""minReplicas": 4, "maxReplicas": 3"#);
    assert!(
        err.contains("spec.maxReplicas: Invalid value: 3: must be greater than or equal to `minReplicas`"),
        "{err}"
    );
    let err = refused("v1", r#""maxReplicas": 3, "targetCPUUtilizationPercentage": 0"#);
    assert!(err.contains("averageUtilization: Invalid value: 0: must be greater than 0"), "{err}");
    assert!(s.fails(&["get", "hpa", "bad"]).contains("NotFound"));
}

/// A ConfigMap `owned` with the given data lines.
fn config_map(data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\ndata:\n{data}")
}

#[test]
fn server_side_apply_tracks_owners_conflicts_forces_and_prunes() {
    let s = Server::start();
    let applied = s.ok_stdin(&["apply", "--server-side", "-f", "-"], &config_map("  a: \"1\"\n  b: \"2\"\n"));
    assert!(applied.contains("configmap/owned serverside-applied"), "{applied}");
    s.ok(&["label", "configmap", "owned", "tier=front"]);
    let yaml = s.ok(&["get", "configmap", "owned", "-o", "yaml", "--show-managed-fields"]);
    for want in ["manager: kubectl\n", "operation: Apply", "f:a: {}", "f:b: {}", "manager: kubectl-label", "f:tier: {}"]
    {
        assert!(yaml.contains(want), "{want} missing:\n{yaml}");
    }
    assert!(!s.ok(&["get", "configmap", "owned", "-o", "yaml"]).contains("managedFields"));

    // Another manager changing a field kubectl applied conflicts, naming the field and its owner.
    let theirs = config_map("  a: \"9\"\n");
    let out = s.kubectl_stdin(&["apply", "--server-side", "--field-manager=other", "-f", "-"], &theirs);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the apply should conflict");
    assert!(err.contains(r#"Apply failed with 1 conflict: conflict with "kubectl": .data.a"#), "{err}");
    assert_eq!(s.ok(&["get", "configmap", "owned", "-o", "jsonpath={.data.a}"]), "1");
    // Forced, it takes the field over.
    s.ok_stdin(&["apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-"], &theirs);
    assert_eq!(s.ok(&["get", "configmap", "owned", "-o", "jsonpath={.data.a}"]), "9");

    // kubectl applies again without a and b: b, which only it owned, goes; a stays with its owner.
    s.ok_stdin(&["apply", "--server-side", "-f", "-"], &config_map("  c: \"3\"\n"));
    assert_eq!(s.ok(&["get", "configmap", "owned", "-o", "jsonpath={.data}"]), r#"{"a":"9","c":"3"}"#);
    let fields = |manager: &str| {
        let path = format!("jsonpath={{.metadata.managedFields[?(@.manager==\"{manager}\")].fieldsV1}}");
        s.ok(&["get", "configmap", "owned", "--show-managed-fields", "-o", &path])
    };
    assert_eq!(fields("other"), r#"{"f:data":{"f:a":{}}}"#);
    assert_eq!(fields("kubectl"), r#"{"f:data":{"f:c":{}}}"#);
}

#[test]
fn future_resource_versions_and_bad_list_options_are_refused_as_upstream() {
    let s = Server::start();
    // A revision this server has not reached: after waiting for it, a Timeout informers relist on.
    for path in ["/api/v1/pods?resourceVersion=99999999", "/api/v1/pods?watch=1&resourceVersion=99999999"] {
        let err = s.fails(&["get", "--raw", path]);
        assert!(err.contains("Error from server (Timeout): Too large resource version: 99999999, current: "), "{err}");
    }
    let err = s.fails(&["get", "--raw", "/api/v1/pods?resourceVersion=1&resourceVersionMatch=Newest"]);
    assert!(err.contains(r#"resourceVersionMatch: Unsupported value: "Newest""#), "{err}");
    let err = s.fails(&["get", "--raw", "/api/v1/pods?resourceVersionMatch=Exact"]);
    assert!(err.contains("resourceVersionMatch is forbidden unless resourceVersion is provided"), "{err}");
    let err = s.fails(&["get", "--raw", "/api/v1/pods?sendInitialEvents=true"]);
    assert!(err.contains("sendInitialEvents is only supported on watch requests"), "{err}");
}

#[test]
fn immutable_metadata_changes_are_refused_as_upstream() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], &config_map("  a: \"1\"\n"));
    let err = s.fails(&["patch", "configmap", "owned", "--type=merge", "-p", r#"{"metadata":{"name":"other"}}"#]);
    assert!(err.contains("the name of the object (other) does not match the name on the URL (owned)"), "{err}");
    let err =
        s.fails(&["patch", "configmap", "owned", "--type=merge", "-p", r#"{"metadata":{"namespace":"kube-system"}}"#]);
    assert!(
        err.contains("the namespace of the object (kube-system) does not match the namespace on the URL (default)"),
        "{err}"
    );
    let err = s.fails(&["patch", "configmap", "owned", "--type=merge", "-p", r#"{"metadata":{"uid":"1234"}}"#]);
    assert!(err.contains(r#"metadata.uid: Invalid value: "1234": field is immutable"#), "{err}");
    let when = r#"{"metadata":{"deletionTimestamp":"2030-01-01T00:00:00Z"}}"#;
    let err = s.fails(&["patch", "configmap", "owned", "--type=merge", "-p", when]);
    assert!(
        err.contains(r#"metadata.deletionTimestamp: Invalid value: "2030-01-01T00:00:00Z": field is immutable"#),
        "{err}"
    );
    // A replace naming another uid fails its precondition.
    let mut body: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "configmap", "owned", "-o", "json"])).expect("json");
    let uid = body["metadata"]["uid"].as_str().expect("uid").to_string();
    body["metadata"]["uid"] = "1234".into();
    let out = s.kubectl_stdin(&["replace", "-f", "-"], &body.to_string());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("Precondition failed: UID in precondition: 1234, UID in object meta: {uid}")),
        "{err}"
    );
    assert_eq!(s.ok(&["get", "configmap", "owned", "-o", "jsonpath={.data.a}"]), "1");
}
