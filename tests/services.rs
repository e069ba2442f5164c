//! End to end: Services, their cluster IPs and node ports, Endpoints and EndpointSlices, against the
//! real cairn (API only) and kubectl. One server with the default ranges serves the API checks
//! (`kubectl expose`, columns, upstream's refusals, endpoints following pod readiness); a second one
//! with a tiny service CIDR and node port range shows a full range, 300 create/delete cycles that
//! leak nothing, and allocations that survive `kill -9` without being handed out twice.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use common::{Server, eventually};

fn get(s: &Server, what: &[&str], path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    let mut args = vec!["get"];
    args.extend(what);
    args.extend(["-o", &jsonpath]);
    s.ok(&args)
}

/// Gives every pod of `app` an address and the readiness asked (what the agent would report).
fn set_pod_status(s: &Server, pod: &str, ip: &str, ready: bool) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    s.ok(&["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
}

fn check_kubernetes_service(s: &Server) {
    let row = s.ok(&["get", "svc", "kubernetes", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[..5], ["kubernetes", "ClusterIP", "10.43.0.1", "<none>", "443/TCP"], "{row}");
    assert_eq!(
        get(
            s,
            &["ipaddress", "10.43.0.1"],
            "{.spec.parentRef.resource}/{.spec.parentRef.namespace}/{.spec.parentRef.name}"
        ),
        "services/default/kubernetes"
    );
    let info = s.ok(&["cluster-info"]);
    assert!(info.contains("Kubernetes control plane is running at https://127.0.0.1:"), "{info}");
}

fn check_expose_and_endpoints(s: &Server) {
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c",
                    "image": "busybox", "ports": [{"name": "http", "containerPort": 8080}]}]}}}}"#,
    );
    s.ok(&["expose", "deployment", "web", "--port=80", "--target-port=8080", "--name=web"]);
    let header = s.ok(&["get", "svc", "web"]);
    assert!(header.starts_with("NAME   TYPE        CLUSTER-IP"), "{header}");
    assert!(header.contains("EXTERNAL-IP   PORT(S)   AGE"), "{header}");
    let ip = get(s, &["svc", "web"], "{.spec.clusterIP}");
    assert!(ip.starts_with("10.43.") && ip != "10.43.0.1", "{ip}");
    assert_eq!(get(s, &["ipaddress", &ip], "{.spec.parentRef.name}"), "web");
    assert_eq!(
        get(s, &["svc", "web"], "{.spec.ipFamilies[0]} {.spec.sessionAffinity} {.spec.internalTrafficPolicy}"),
        "IPv4 None Cluster"
    );

    // A named target port, resolved per pod.
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "named"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}"#,
    );
    let pods: Vec<String> = eventually(20, || {
        Some(get(s, &["pods", "-l", "app=web"], "{.items[*].metadata.name}")).filter(|p| p.split(' ').count() == 2)
    })
    .split(' ')
    .map(str::to_string)
    .collect();
    // No pod is ready or has an address yet: the slice is the empty placeholder.
    let slices = s.ok(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web", "--no-headers"]);
    assert!(slices.contains("<unset>"), "{slices}");
    set_pod_status(s, &pods[0], "10.42.9.1", true);
    set_pod_status(s, &pods[1], "10.42.9.2", false);
    let ep = eventually(10, || {
        let ep = get(
            s,
            &["endpoints", "web"],
            "{.subsets[0].addresses[*].ip}|{.subsets[0].notReadyAddresses[*].ip}|{.subsets[0].ports[0].port}",
        );
        (ep == "10.42.9.1|10.42.9.2|8080").then_some(ep)
    });
    assert_eq!(ep, "10.42.9.1|10.42.9.2|8080");
    let conditions = |s: &Server| {
        get(
            s,
            &["endpointslices", "-l", "kubernetes.io/service-name=web"],
            r#"{range .items[*].endpoints[*]}{.addresses[0]}={.conditions.ready}/{.conditions.serving};{end}"#,
        )
    };
    eventually(10, || (conditions(s) == "10.42.9.1=true/true;10.42.9.2=false/false;").then_some(()));
    // The second pod turns ready: within a second it is in both.
    let start = Instant::now();
    set_pod_status(s, &pods[1], "10.42.9.2", true);
    eventually(10, || {
        (get(s, &["endpoints", "web"], "{.subsets[0].addresses[*].ip}") == "10.42.9.1 10.42.9.2").then_some(())
    });
    eventually(10, || (conditions(s) == "10.42.9.1=true/true;10.42.9.2=true/true;").then_some(()));
    assert!(start.elapsed() < Duration::from_secs(3), "endpoints took {:?} to follow readiness", start.elapsed());
    assert_eq!(
        get(
            s,
            &["endpointslices", "-l", "kubernetes.io/service-name=named"],
            "{.items[0].ports[0].name}:{.items[0].ports[0].port}"
        ),
        "http:8080"
    );
    let table = s.ok(&["get", "endpoints", "web"]);
    assert!(table.contains("10.42.9.1:8080,10.42.9.2:8080"), "{table}");
    // Deleting the Service takes its Endpoints, slices and cluster IP with it.
    s.ok(&["delete", "svc", "web"]);
    eventually(10, || s.fails(&["get", "endpoints", "web"]).contains("NotFound").then_some(()));
    eventually(10, || {
        get(s, &["endpointslices", "-l", "kubernetes.io/service-name=web"], "{.items}").eq("[]").then_some(())
    });
    assert!(s.fails(&["get", "ipaddress", &ip]).contains("NotFound"));
}

fn check_refusals(s: &Server) {
    s.ok(&["create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080"]);
    let row = s.ok(&["get", "svc", "np", "--no-headers"]);
    assert!(row.contains("80:30080/TCP") && row.contains("NodePort"), "{row}");
    let err = s.fails(&["create", "service", "nodeport", "np2", "--tcp=80:8080", "--node-port=30080"]);
    assert!(err.contains("spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated"), "{err}");
    let err = s.fails(&["create", "service", "nodeport", "np3", "--tcp=80:8080", "--node-port=29999"]);
    assert!(err.contains("provided port is not in the valid range. The range of valid ports is 30000-32767"), "{err}");
    let err = s.fails(&["create", "service", "clusterip", "taken", "--tcp=80", "--clusterip=10.43.0.1"]);
    assert!(err.contains("failed to allocate IP 10.43.0.1: provided IP is already allocated"), "{err}");
    let err = s.fails(&["create", "service", "clusterip", "away", "--tcp=80", "--clusterip=10.0.0.1"]);
    assert!(err.contains("The range of valid IPs is 10.43.0.0/16"), "{err}");
    let err = s.fails(&["create", "service", "clusterip", "1st", "--tcp=80"]);
    assert!(err.contains("a DNS-1035 label must consist of lower case alphanumeric characters"), "{err}");
    let bad = r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"},
        "spec": {"ports": [{"port": 70000}, {"port": 80, "protocol": "ICMP"}]}}"#;
    let out = s.kubectl_stdin(&["create", "-f", "-"], bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive"), "{err}");
    assert!(err.contains("spec.ports[0].name: Required value"), "{err}");
    assert!(err.contains("spec.ports[1].protocol: Unsupported value: \"ICMP\""), "{err}");
    // A requested free address is honoured; the type may change, keeping it.
    s.ok(&["create", "service", "clusterip", "fixed", "--tcp=80", "--clusterip=10.43.200.7"]);
    assert_eq!(get(s, &["svc", "fixed"], "{.spec.clusterIP}"), "10.43.200.7");
    s.ok(&["patch", "svc", "fixed", "-p", r#"{"spec": {"type": "NodePort"}}"#]);
    let port = get(s, &["svc", "fixed"], "{.spec.ports[0].nodePort}");
    assert!((30000..=32767).contains(&port.parse::<i32>().unwrap()), "{port}");
    assert_eq!(get(s, &["svc", "fixed"], "{.spec.clusterIP}"), "10.43.200.7");
    let err = s.fails(&[
        "patch",
        "svc",
        "fixed",
        "-p",
        r#"{"spec": {"clusterIP": "10.43.200.8", "clusterIPs": ["10.43.200.8"]}}"#,
    ]);
    assert!(err.contains("may not change once set"), "{err}");
    // ExternalName has no cluster IP.
    s.ok(&["create", "service", "externalname", "ext", "--external-name=example.com"]);
    let row = s.ok(&["get", "svc", "ext", "--no-headers"]);
    assert!(row.contains("ExternalName") && row.contains("<none>") && row.contains("example.com"), "{row}");
    assert_eq!(
        get(s, &["ipaddresses"], "{.items[*].spec.parentRef.name}").split(' ').filter(|n| *n == "ext").count(),
        0
    );
}

/// LoadBalancer Services get the Ready nodes' addresses; a port already balanced stays pending.
fn check_load_balancer(s: &Server) {
    s.ok_stdin(&["create", "-f", "-"], r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "lb-node"}}"#);
    let status = r#"{"status": {"conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}, {"type": "Hostname", "address": "lb-node"}]}}"#;
    s.ok(&["patch", "node", "lb-node", "--subresource=status", "--type=merge", "-p", status]);
    s.ok(&["create", "service", "loadbalancer", "lb", "--tcp=8081:8080"]);
    let ingress = |name: &str| get(s, &["svc", name], "{.status.loadBalancer.ingress[*].ip}");
    eventually(10, || (ingress("lb") == "192.0.2.10").then_some(()));
    let row = s.ok(&["get", "svc", "lb", "--no-headers"]);
    assert!(row.contains("LoadBalancer") && row.contains("192.0.2.10") && row.contains("8081:3"), "{row}");
    s.ok(&["create", "service", "loadbalancer", "lb2", "--tcp=8081:8080"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.ok(&["get", "svc", "lb2", "--no-headers"]).contains("<pending>"));
    s.ok(&["delete", "svc", "lb"]);
    eventually(10, || (ingress("lb2") == "192.0.2.10").then_some(()));
    s.ok(&["delete", "svc", "lb2"]);
    s.ok(&["delete", "node", "lb-node"]);
}

#[test]
fn services_endpoints_and_their_refusals() {
    let s = Server::start();
    check_kubernetes_service(&s);
    check_refusals(&s);
    check_load_balancer(&s);
    check_expose_and_endpoints(&s);
}

fn service(name: &str, ty: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"type": ty, "ports": [{"port": 80}]}}))
    .unwrap()
}

/// Cluster IPs and node ports held by the Services of `default`, and whether any is held twice.
fn holdings(s: &Server) -> (Vec<String>, Vec<String>) {
    let out = s.ok(&["get", "svc", "-o", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap();
    let mut ips = Vec::new();
    let mut ports = Vec::new();
    for svc in list["items"].as_array().unwrap() {
        if let Some(ip) = svc["spec"]["clusterIP"].as_str() {
            ips.push(ip.to_string());
        }
        for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(np) = p["nodePort"].as_i64() {
                ports.push(np.to_string());
            }
        }
    }
    (ips, ports)
}

fn distinct(v: &[String]) -> bool {
    v.iter().collect::<BTreeSet<_>>().len() == v.len()
}

#[test]
fn small_ranges_fill_up_recycle_and_survive_kill9() {
    // 14 usable addresses (the kubernetes Service takes the first) and 6 node ports.
    let extra = ["--service-cidr", "10.96.0.0/28", "--service-node-port-range", "30000-30005"];
    let s = Server::start_with(tempfile::tempdir().unwrap(), &extra);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(s.client());
    let api: Api<Service> = Api::default_namespaced(client);

    // 300 create/delete cycles of a NodePort Service: with 6 ports, one leak would show.
    rt.block_on(async {
        for i in 0..300 {
            let name = format!("cycle-{}", i % 7);
            api.create(&PostParams::default(), &service(&name, "NodePort")).await.expect("create in a cycle");
            api.delete(&name, &DeleteParams::default()).await.expect("delete in a cycle");
        }
    });
    assert_eq!(get(&s, &["ipaddresses"], "{.items[*].metadata.name}"), "10.96.0.1");

    // Six NodePort Services take every port; the seventh is refused as upstream does.
    for i in 0..6 {
        s.ok(&["create", "service", "nodeport", &format!("np-{i}"), "--tcp=80"]);
    }
    let err = s.fails(&["create", "service", "nodeport", "np-6", "--tcp=80"]);
    assert!(err.contains("Internal error occurred: failed to allocate a nodePort: range is full"), "{err}");
    // The remaining addresses go to ClusterIP Services, then the range is full.
    for i in 0..7 {
        s.ok(&["create", "service", "clusterip", &format!("c-{i}"), "--tcp=80"]);
    }
    let err = s.fails(&["create", "service", "clusterip", "c-7", "--tcp=80"]);
    assert!(err.contains("Internal error occurred: failed to allocate a serviceIP: range is full"), "{err}");
    let (ips, ports) = holdings(&s);
    assert_eq!((ips.len(), ports.len()), (14, 6));
    assert!(distinct(&ips) && distinct(&ports), "{ips:?} {ports:?}");

    // Free some, then kill -9 while creates and deletes are in flight.
    for i in 0..3 {
        s.ok(&["delete", "svc", &format!("np-{i}"), &format!("c-{i}")]);
    }
    let pid = s.pid();
    let creates = std::thread::spawn({
        let kubeconfig = s.ok(&["config", "view", "--raw"]);
        move || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("kc");
            std::fs::write(&path, kubeconfig).unwrap();
            for i in 0..6 {
                let _ = std::process::Command::new(common::kubectl_path())
                    .env("KUBECONFIG", &path)
                    .args([
                        "create",
                        "service",
                        if i % 2 == 0 { "nodeport" } else { "clusterip" },
                        &format!("k-{i}"),
                        "--tcp=80",
                    ])
                    .output();
            }
        }
    });
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    creates.join().unwrap();
    let dir = s.kill9();
    let s = Server::start_with(dir, &extra);
    // Fill what is left: nothing is handed out twice, whatever was in flight.
    for i in 0..8 {
        let _ = s.kubectl(&["create", "service", "nodeport", &format!("after-{i}"), "--tcp=80"]);
    }
    let (ips, ports) = holdings(&s);
    assert!(distinct(&ips), "a cluster IP was handed out twice: {ips:?}");
    assert!(distinct(&ports), "a node port was handed out twice: {ports:?}");
    // Every address a Service holds has its IPAddress pointing back at it.
    for ip in ips.iter().filter(|ip| *ip != "10.96.0.1") {
        let parent = get(&s, &["ipaddress", ip], "{.spec.parentRef.name}");
        assert_eq!(get(&s, &["svc", &parent], "{.spec.clusterIP}"), *ip);
    }
}
