//! End to end: Services, their cluster IPs and node ports, Endpoints and EndpointSlices, against the
//! real cairn (API only) and kubectl. One server with the default ranges serves the API checks
//! (`kubectl expose`, columns, upstream's refusals, endpoints following pod readiness); a second one
//! with a tiny service CIDR and node port range shows a full range, 300 create/delete cycles that
//! leak nothing, and allocations that survive `kill -9` without being handed out twice. A node
//! with the service proxy and the cluster DNS carries real traffic between busybox pods (root,
//! containerd, nftables, dnsmasq: `.ci/run` installs them).

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

/// A Service without a selector takes its endpoints from an Endpoints written by hand, mirrored into
/// a slice the proxy and the DNS read; the slice follows the Endpoints and goes with it.
fn check_mirroring(s: &Server) {
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "legacy"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}"#,
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "legacy", "labels": {"tier": "db"}},
            "subsets": [{"addresses": [{"ip": "192.0.2.20"}], "notReadyAddresses": [{"ip": "192.0.2.21"}],
                "ports": [{"name": "http", "port": 8080}]}]}"#,
    );
    let mirrored = |s: &Server| {
        get(
            s,
            &["endpointslices", "-l", "kubernetes.io/service-name=legacy,tier=db"],
            r#"{range .items[*]}{.metadata.labels.endpointslice\.kubernetes\.io/managed-by} {.metadata.ownerReferences[0].kind} {.ports[0].port}:{range .endpoints[*]}{.addresses[0]}={.conditions.ready};{end}{end}"#,
        )
    };
    let want = "endpointslicemirroring-controller.k8s.io Endpoints 8080:192.0.2.20=true;192.0.2.21=false;";
    eventually(10, || (mirrored(s) == want).then_some(()));
    s.ok(&[
        "patch",
        "endpoints",
        "legacy",
        "--type=merge",
        "-p",
        r#"{"subsets": [{"addresses": [{"ip": "192.0.2.21"}], "ports": [{"name": "http", "port": 8080}]}]}"#,
    ]);
    let want = "endpointslicemirroring-controller.k8s.io Endpoints 8080:192.0.2.21=true;";
    eventually(10, || (mirrored(s) == want).then_some(()));
    // The hand-written Endpoints is left as written (no controller owns it).
    assert_eq!(get(s, &["endpoints", "legacy"], "{.subsets[0].addresses[0].ip}"), "192.0.2.21");
    s.ok(&["delete", "endpoints", "legacy"]);
    eventually(10, || mirrored(s).is_empty().then_some(()));
    s.ok(&["delete", "svc", "legacy"]);
}

#[test]
fn services_endpoints_and_their_refusals() {
    let s = Server::start();
    check_kubernetes_service(&s);
    check_refusals(&s);
    check_load_balancer(&s);
    check_expose_and_endpoints(&s);
    check_mirroring(&s);
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
    // Without the kube-dns Service, which would hold one of the 14 addresses.
    let extra = ["--service-cidr", "10.96.0.0/28", "--service-node-port-range", "30000-30005", "--disable=coredns"];
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

/// A loopback dnsmasq, the host's "upstream" resolver in the traffic test; killed on drop.
struct Upstream(std::process::Child);

impl Upstream {
    /// Answers `ext.example.test` with 192.0.2.7 on `addr`:53, nothing else.
    fn start(addr: &str) -> Upstream {
        let child = std::process::Command::new("dnsmasq")
            .args(["--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces", "--port=53"])
            .arg(format!("--listen-address={addr}"))
            .args(["--address=/ext.example.test/192.0.2.7", "--pid-file=", "--user=root"])
            .spawn()
            .expect("dnsmasq is needed: apt-get install dnsmasq-base");
        Upstream(child)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the host-wide state the proxy and the cluster DNS keep across restarts (on purpose).
struct HostState;

impl Drop for HostState {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft").args(["delete", "table", "ip", "cairn-proxy"]).output();
        let _ = std::process::Command::new("ip").args(["addr", "del", "10.43.0.10/32", "dev", "lo"]).output();
    }
}

/// A busybox httpd pod labelled app=web answering its own name; Ready while /tmp/ready exists.
fn web_pod(node: &Server, name: &str) {
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: web}}}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /www && echo {name} > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www"]
    ports: [{{containerPort: 8080, name: http}}]
    readinessProbe:
      exec: {{command: [cat, /tmp/ready]}}
      periodSeconds: 1
      failureThreshold: 1
"#,
        image = busybox::BUSYBOX
    );
    node.ok_stdin(&["apply", "-f", "-"], &yaml);
}

/// `wget` in `pod`: the body, or `None` when it failed.
fn fetch_in(node: &Server, pod: &str, url: &str) -> Option<String> {
    // (busybox 1.35's wget crashes with -T.)
    let out = node.kubectl(&["exec", pod, "--", "wget", "-qO-", url]);
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `GET /` on 127.0.0.1:`port` from the host: the body.
fn fetch_host(port: u16) -> Option<String> {
    fetch_at("127.0.0.1", port)
}

/// `GET /` on `ip`:`port` from the host: the body.
fn fetch_at(ip: &str, port: u16) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let addr = std::net::SocketAddr::new(ip.parse().ok()?, port);
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split("\r\n\r\n").nth(1).map(|b| b.trim().to_string())
}

/// The names answering `fetch` in up to `tries` attempts, stopping once `want` are seen.
fn answers(tries: usize, want: usize, mut fetch: impl FnMut() -> Option<String>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..tries {
        seen.extend(fetch());
        if seen.len() >= want {
            break;
        }
    }
    seen
}

fn names(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The proxy's table, less the affinity sets' countdowns (`expires 2h59m57s`), which tick on their own.
fn nft_table() -> String {
    let out = std::process::Command::new("nft").args(["list", "table", "ip", "cairn-proxy"]).output().expect("nft");
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split(' ').collect();
    let mut kept = Vec::with_capacity(words.len());
    let mut skip = false;
    for w in words {
        if std::mem::take(&mut skip) {
            continue;
        }
        skip = w == "expires";
        if !skip {
            kept.push(w);
        }
    }
    kept.join(" ")
}

/// One node with the proxy and the cluster DNS: names resolve (Services, headless pods, the host's
/// upstream), a ClusterIP spreads over its ready pods and drops an unready one, a pod reaches itself
/// through its Service, a node port answers on 127.0.0.1 and keeps answering while cairn is killed
/// and restarted, and a deleted Service leaves no rule behind.
#[test]
fn traffic_through_cluster_ips_node_ports_and_the_cluster_dns() {
    let _host = HostState;
    let upstream_addr = "127.0.0.77";
    let _upstream = Upstream::start(upstream_addr);
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {upstream_addr}\n")).unwrap();
    let resolv = resolv.to_str().unwrap().to_string();
    let mut node = node::Node::start_with("10.55.0.0/16", &["--disable-kube-proxy=false", "--resolv-conf", &resolv]);
    eventually(60, || node::node_ready(&node));
    web_pod(&node, "web-1");
    web_pod(&node, "web-2");
    node.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: client}}\nspec:\n  terminationGracePeriodSeconds: 0\n  \
             containers:\n  - {{name: main, image: {}, imagePullPolicy: Never, command: [sleep, '3600']}}\n",
            busybox::BUSYBOX
        ),
    );
    for pod in ["web-1", "web-2", "client"] {
        node.ok(&["wait", "--for=condition=Ready", &format!("pod/{pod}"), "--timeout=60s"]);
    }
    node.ok(&["expose", "pod", "web-1", "--name=web", "--port=80", "--target-port=http", "--type=NodePort"]);
    node.ok(&["create", "service", "clusterip", "pods", "--clusterip=None", "--tcp=8080"]);
    node.ok(&["patch", "svc", "pods", "--type=merge", "-p", r#"{"spec":{"selector":{"app":"web"}}}"#]);
    let node_port: u16 = get(&node, &["svc", "web"], "{.spec.ports[0].nodePort}").parse().unwrap();

    // The cluster DNS: the Service by its short and full names, the API, the host's upstream.
    let both = names(&["web-1", "web-2"]);
    // busybox's static wget cannot resolve names (static glibc has no NSS): nslookup, then the IP.
    let lookup = |name: &str| {
        let out = node.kubectl(&["exec", "client", "--", "nslookup", name]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let web_ip = get(&node, &["svc", "web"], "{.spec.clusterIP}");
    for name in ["web", "web.default.svc.cluster.local"] {
        let out = lookup(name);
        assert!(out.contains(&format!("Address: {web_ip}")), "{name}: {out}");
    }
    let out = lookup("kubernetes.default.svc.cluster.local");
    assert!(out.contains("Address: 10.43.0.1"), "{out}");
    let out = lookup("ext.example.test");
    assert!(out.contains("Address: 192.0.2.7"), "forwarded upstream: {out}");
    let out = lookup("nothing.default.svc.cluster.local");
    assert!(out.contains("NXDOMAIN"), "{out}");
    let web1_ip = get(&node, &["pod", "web-1"], "{.status.podIP}");
    let out = lookup("pods.default.svc.cluster.local");
    assert!(out.contains(&format!("Address: {web1_ip}")), "headless: {out}");

    // Service environment variables, as kubelet sets them.
    let env = node.ok(&["exec", "client", "--", "sh", "-c", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"]);
    assert_eq!(env.trim(), "10.43.0.1:443");

    // The cluster IP spreads over both pods.
    let url = format!("http://{web_ip}/");
    assert_eq!(answers(30, 2, || fetch_in(&node, "client", &url)), both, "spread over both pods");

    // Hairpin: a pod reaches itself through its Service.
    assert!(answers(30, 1, || fetch_in(&node, "web-1", &url).filter(|n| n == "web-1")).contains("web-1"));

    // A node port on 127.0.0.1 from the host.
    assert_eq!(answers(30, 2, || fetch_host(node_port)), both, "node port spreads too");

    // ClientIP session affinity pins the client to one pod.
    node.ok(&["create", "service", "clusterip", "sticky", "--tcp=80:8080"]);
    node.ok(&[
        "patch",
        "svc",
        "sticky",
        "--type=merge",
        "-p",
        r#"{"spec":{"selector":{"app":"web"},"sessionAffinity":"ClientIP"}}"#,
    ]);
    let sticky = format!("http://{}/", get(&node, &["svc", "sticky"], "{.spec.clusterIP}"));
    let first = eventually(30, || fetch_in(&node, "client", &sticky));
    for _ in 0..10 {
        assert_eq!(fetch_in(&node, "client", &sticky).as_deref(), Some(first.as_str()), "affinity did not pin");
    }

    // A LoadBalancer gets the node's address and answers on it.
    node.ok(&["create", "service", "loadbalancer", "lb", "--tcp=8081:8080"]);
    node.ok(&["patch", "svc", "lb", "--type=merge", "-p", r#"{"spec":{"selector":{"app":"web"}}}"#]);
    let lb_ip = eventually(30, || {
        Some(get(&node, &["svc", "lb"], "{.status.loadBalancer.ingress[0].ip}")).filter(|ip| !ip.is_empty())
    });
    let node_ip = get(&node, &["node"], r#"{.items[0].status.addresses[?(@.type=="InternalIP")].address}"#);
    assert_eq!(lb_ip, node_ip, "the load balancer's address");
    assert_eq!(answers(30, 2, || fetch_at(&lb_ip, 8081)), both, "the load balancer spreads");
    assert_eq!(answers(30, 2, || fetch_at(&node_ip, node_port)), both, "a node port on the node's address");

    // kubectl port-forward to a Service (kubectl picks one of its pods).
    let local = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut forward = std::process::Command::new(common::kubectl_path())
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["port-forward", "svc/web", &format!("{local}:80")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let got = eventually(20, || fetch_host(local));
    let _ = forward.kill();
    let _ = forward.wait();
    assert!(both.contains(&got), "port-forward svc/web answered {got:?}");

    // An unready pod leaves the Service's traffic.
    node.ok(&["exec", "web-2", "--", "rm", "/tmp/ready"]);
    let unready = || get(&node, &["endpoints", "web"], "{.subsets[0].notReadyAddresses[0].ip}");
    eventually(30, || (!unready().is_empty()).then_some(()));
    eventually(10, || (answers(10, 2, || fetch_host(node_port)) == names(&["web-1"])).then_some(()));
    node.ok(&["exec", "web-2", "--", "touch", "/tmp/ready"]);
    eventually(30, || (answers(10, 2, || fetch_host(node_port)) == both).then_some(()));

    // kill -9: the rules stay in the kernel, so traffic flows while cairn is down and after. The
    // table is taken once all three Services of the two pods (web, sticky, lb) have both back:
    // web-2's return reaches each Service's EndpointSlice in its own reconcile.
    let before = eventually(30, || Some(nft_table()).filter(|t| t.matches("dnat to ").count() == 6));
    let dir = node.kill9_keep();
    let down = answers(20, 2, || fetch_host(node_port));
    node.start_again(dir);
    assert_eq!(down, both, "traffic while cairn was down");
    eventually(60, || node::node_ready(&node));
    assert_eq!(answers(30, 2, || fetch_host(node_port)), both, "traffic after the restart");
    assert_eq!(nft_table(), before, "a restart changed the rules");

    // A deleted Service leaves nothing in the table.
    node.ok(&["delete", "svc", "web", "pods", "sticky", "lb"]);
    eventually(10, || (!nft_table().contains("default/web/")).then_some(()));
    assert!(fetch_host(node_port).is_none(), "the node port still answers");
}
