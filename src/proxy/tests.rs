//! Kernel tests (root): the proxy's table applied inside network namespaces the tests create, with
//! real TCP traffic between them. Nothing touches the host's own rules or addresses.
//!
//! `node` holds the rules, a bridge with two pods (`pod1` local, `pod2` on "another node") and a
//! veth to `client`, which stands outside the cluster network:
//!
//! ```text
//! client 10.251.0.2 ── 10.251.0.1 node (br 10.250.0.1/24) ── pod1 10.250.0.11, pod2 10.250.0.12
//! ```

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::model::{Endpoint, Protocol, ServicePort};
use super::nft::{self, Host};
use super::rules;
use super::{Config, Proxier};

fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping {test}: needs root (CAP_NET_ADMIN, network namespaces)");
    }
    root
}

/// The programs the tests run; CI installs them (Debian: nftables, busybox-static, iproute2).
fn require_tools() {
    for (tool, package) in [("nft", "nftables"), ("busybox", "busybox-static"), ("ip", "iproute2")] {
        assert!(crate::net::system_binary(tool).is_absolute(), "{tool} is needed: apt-get install {package}");
    }
}

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn sh_ok(args: &[&str]) -> String {
    let out = sh(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted (with its links and rules) on drop.
struct Ns(String);

impl Ns {
    fn new(name: &str) -> Ns {
        let _ = sh(&["ip", "netns", "del", name]);
        sh_ok(&["ip", "netns", "add", name]);
        let ns = Ns(name.to_string());
        ns.ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["ip", "netns", "exec", &self.0];
        all.extend_from_slice(args);
        sh(&all)
    }

    fn ok(&self, args: &[&str]) -> String {
        let mut all = vec!["ip", "netns", "exec", &self.0];
        all.extend_from_slice(args);
        sh_ok(&all)
    }

    fn spawn(&self, args: &[&str], stdin: Stdio) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.0]);
    }
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The namespaces of one test: `<p>-node`, `<p>-pod1`, `<p>-pod2`, `<p>-client`.
struct Topology {
    node: Ns,
    pods: Vec<Ns>,
    client: Ns,
}

impl Topology {
    fn new(p: &str) -> Topology {
        let node = Ns::new(&format!("{p}-node"));
        node.ok(&["ip", "link", "add", "br0", "type", "bridge"]);
        node.ok(&["ip", "addr", "add", "10.250.0.1/24", "dev", "br0"]);
        node.ok(&["ip", "link", "set", "br0", "up"]);
        node.ok(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        let mut pods = Vec::new();
        for i in 1..=2 {
            let pod = Ns::new(&format!("{p}-pod{i}"));
            let veth = format!("vp{i}");
            node.ok(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &pod.0]);
            node.ok(&["ip", "link", "set", &veth, "master", "br0", "up"]);
            // As cairn's CNI does: with bridge-nf-call-iptables, a pod reaching itself through a
            // Service is DNATed at the bridge and sent back out of the port it came in by.
            node.ok(&["ip", "link", "set", &veth, "type", "bridge_slave", "hairpin", "on"]);
            pod.ok(&["ip", "addr", "add", &format!("10.250.0.1{i}/24"), "dev", "eth0"]);
            pod.ok(&["ip", "link", "set", "eth0", "up"]);
            pod.ok(&["ip", "route", "add", "default", "via", "10.250.0.1"]);
            pods.push(pod);
        }
        let client = Ns::new(&format!("{p}-client"));
        node.ok(&["ip", "link", "add", "vc", "type", "veth", "peer", "name", "eth0", "netns", &client.0]);
        node.ok(&["ip", "addr", "add", "10.251.0.1/24", "dev", "vc"]);
        node.ok(&["ip", "link", "set", "vc", "up"]);
        client.ok(&["ip", "addr", "add", "10.251.0.2/24", "dev", "eth0"]);
        client.ok(&["ip", "link", "set", "eth0", "up"]);
        client.ok(&["ip", "route", "add", "default", "via", "10.251.0.1"]);
        // Cluster IPs need a route so that packets not DNATed reach the forward hook (and are
        // rejected there); it leads only to the test's own client.
        node.ok(&["ip", "route", "add", "10.96.0.0/12", "via", "10.251.0.2"]);
        Topology { node, pods, client }
    }

    /// `busybox nc` in each pod answering its name on every connection to `port`.
    fn serve(&self, port: u16) -> Vec<Proc> {
        let port = port.to_string();
        let servers: Vec<Proc> = (0..2)
            .map(|i| {
                let name = format!("pod{}", i + 1);
                Proc(self.pods[i].spawn(&["busybox", "nc", "-ll", "-p", &port, "-e", "echo", &name], Stdio::null()))
            })
            .collect();
        // Ready when each answers directly.
        for i in 0..2 {
            let addr = format!("10.250.0.1{}", i + 1);
            assert_eq!(self.connect(&self.node, &addr, port.parse().unwrap()), format!("pod{}", i + 1));
        }
        servers
    }

    /// Connects from `ns` until an answer comes or 5 s pass; the answer ("" if none).
    fn connect(&self, ns: &Ns, addr: &str, port: u16) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = once(ns, addr, port);
            if !text.is_empty() || Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One connection from `ns`: what the server said.
fn once(ns: &Ns, addr: &str, port: u16) -> String {
    let out = ns.exec(&["busybox", "nc", "-w", "2", addr, &port.to_string()]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ep(last: u8, port: u16, local: bool) -> Endpoint {
    Endpoint { ip: Ipv4Addr::new(10, 250, 0, last), port, ready: true, serving: true, terminating: false, local }
}

fn service(name: &str, ip: [u8; 4], port: u16, endpoints: Vec<Endpoint>) -> ServicePort {
    ServicePort {
        namespace: "test".into(),
        service: name.into(),
        port_name: "p".into(),
        protocol: Protocol::Tcp,
        cluster_ip: Ipv4Addr::from(ip),
        port,
        node_port: None,
        external_ips: vec![],
        affinity_timeout: None,
        external_local: false,
        internal_local: false,
        endpoints,
    }
}

fn config(netns: &str) -> Config {
    let mut cfg = Config::new("n1", vec!["10.251.0.1".parse().unwrap()], "10.250.0.0/16".parse().unwrap());
    cfg.netns = Some(netns.to_string());
    cfg
}

/// The kernel's table equals what `ports` should give (the listing round-trips exactly).
async fn assert_in_sync(cfg: &Config, ports: &[ServicePort]) {
    let kernel = Host { netns: cfg.netns.clone() }.read().await.unwrap();
    let desired = rules::desired(&cfg.settings(), ports);
    if let Some((script, _)) = nft::plan(&kernel, &desired) {
        panic!("kernel differs from the model; plan:\n{script}");
    }
}

/// Deletes the table in `netns` on drop (the namespace goes too, but say it explicitly).
struct TableGuard(String);

impl Drop for TableGuard {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "exec", &self.0, "nft", "delete", "table", "ip", rules::TABLE]);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn it_cluster_ip_traffic_affinity_reject_and_restart() {
    if !is_root("it_cluster_ip_traffic_affinity_reject_and_restart") {
        return;
    }
    require_tools();
    let t = Topology::new("cpxt");
    let _table = TableGuard(t.node.0.clone());
    let _servers = t.serve(8080);
    let cfg = config(&t.node.0);
    let mut proxier = Proxier::new(&cfg);

    // ClusterIP → both endpoints, from outside the cluster network (masqueraded) and from the node.
    let web = service("web", [10, 96, 0, 10], 80, vec![ep(11, 8080, true), ep(12, 8080, false)]);
    let mut ports = vec![web.clone()];
    let n = proxier.sync(ports.clone(), false).await.unwrap();
    assert!(n.chains_written > 0);
    assert_in_sync(&cfg, &ports).await;
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        seen.insert(t.connect(&t.client, "10.96.0.10", 80));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, BTreeSet::from(["pod1".to_string(), "pod2".to_string()]), "spread over both endpoints");
    assert!(["pod1", "pod2"].contains(&t.connect(&t.node, "10.96.0.10", 80).as_str()), "from the node itself");

    // A pod reaching itself through its Service (hairpin, masqueraded).
    let solo = service("solo", [10, 96, 0, 11], 80, vec![ep(11, 8080, true)]);
    ports.push(solo);
    proxier.sync(ports.clone(), false).await.unwrap();
    assert_eq!(t.connect(&t.pods[0], "10.96.0.11", 80), "pod1", "hairpin");

    // ClientIP affinity pins a client to one endpoint.
    let mut sticky = service("sticky", [10, 96, 0, 12], 80, vec![ep(11, 8080, true), ep(12, 8080, false)]);
    sticky.affinity_timeout = Some(60);
    ports.push(sticky);
    proxier.sync(ports.clone(), false).await.unwrap();
    assert_in_sync(&cfg, &ports).await;
    let first = t.connect(&t.client, "10.96.0.12", 80);
    for _ in 0..10 {
        assert_eq!(once(&t.client, "10.96.0.12", 80), first, "affinity");
    }

    // NodePort with externalTrafficPolicy Local: only the local endpoint answers.
    let mut np = service("np", [10, 96, 0, 13], 80, vec![ep(11, 8080, true), ep(12, 8080, false)]);
    np.node_port = Some(30080);
    np.external_local = true;
    ports.push(np);
    proxier.sync(ports.clone(), false).await.unwrap();
    for _ in 0..8 {
        assert_eq!(t.connect(&t.client, "10.251.0.1", 30080), "pod1", "Local: this node's endpoint only");
    }

    // No endpoints: rejected at once (not a time-out).
    ports[0].endpoints.clear();
    proxier.sync(ports.clone(), false).await.unwrap();
    assert_in_sync(&cfg, &ports).await;
    let started = Instant::now();
    let out = t.client.exec(&["busybox", "nc", "-w", "3", "10.96.0.10", "80"]);
    assert!(!out.status.success() && out.stdout.is_empty(), "no endpoints: the connection must fail");
    assert!(started.elapsed() < Duration::from_millis(1500), "rejected, not dropped: {:?}", started.elapsed());
    ports[0] = web.clone();
    proxier.sync(ports.clone(), false).await.unwrap();

    // An established flow survives a restart of the syncer: a new instance reads the kernel,
    // changes nothing, and the connection still carries data afterwards.
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    // The sink's stdin stays open, or busybox nc would close the connection at once.
    let sink = format!("sleep 10 | busybox nc -l -p 9000 > {}", received.display());
    let _sink = Proc(t.pods[0].spawn(&["sh", "-c", &sink], Stdio::null()));
    let long = service("long", [10, 96, 0, 14], 90, vec![ep(11, 9000, true)]);
    ports.push(long);
    proxier.sync(ports.clone(), false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.pods[0].exec(&["busybox", "netstat", "-ltn"]).stdout.windows(5).any(|w| w == b":9000") {
        assert!(Instant::now() < deadline, "the sink did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut flow = Proc(t.client.spawn(&["busybox", "nc", "10.96.0.14", "90"], Stdio::piped()));
    let mut stdin = flow.0.stdin.take().unwrap();
    stdin.write_all(b"before\n").unwrap();
    drop(proxier);
    let mut restarted = Proxier::new(&cfg);
    let n = restarted.sync(ports.clone(), false).await.unwrap();
    assert!(n.is_empty(), "a restarted syncer found differences in an intact table: {n:?}");
    // A change after the restart is incremental too: the flow is untouched by it.
    ports[1].endpoints.push(ep(12, 8080, false));
    restarted.sync(ports.clone(), false).await.unwrap();
    if let Err(e) = stdin.write_all(b"after\n") {
        let status = flow.0.try_wait();
        let got = std::fs::read_to_string(&received).unwrap_or_default();
        panic!("the flow ended across the restart ({e}): client {status:?}, the sink received {got:?}");
    }
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = std::fs::read_to_string(&received).unwrap_or_default();
        if got.contains("after") {
            assert_eq!(got, "before\nafter\n");
            break;
        }
        assert!(Instant::now() < deadline, "the flow stopped carrying data across the restart: {got:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(flow);

    // Foreign rules in our table are repaired by a resync.
    t.node.ok(&["nft", "add", "rule", "ip", rules::TABLE, "services", "ip", "daddr", "10.96.0.99", "drop"]);
    t.node.ok(&["nft", "add", "chain", "ip", rules::TABLE, "intruder"]);
    t.node.ok(&["nft", "flush", "chain", "ip", rules::TABLE, "ep-test/solo/tcp/p__10.250.0.11/8080"]);
    let n = restarted.sync(ports.clone(), true).await.unwrap();
    assert!(n.chains_written == 2 && n.chains_deleted == 1, "{n:?}");
    assert_in_sync(&cfg, &ports).await;
    // The repaired chain carries traffic again (solo spreads over both pods since the restart).
    assert!((0..30).any(|_| t.connect(&t.client, "10.96.0.11", 80) == "pod1"), "the repaired endpoint chain");

    super::cleanup(Some(&t.node.0)).await.unwrap();
    assert!(!t.node.ok(&["nft", "list", "tables"]).contains(rules::TABLE));
}

#[tokio::test(flavor = "current_thread")]
async fn it_create_delete_cycles_leave_nothing() {
    if !is_root("it_create_delete_cycles_leave_nothing") {
        return;
    }
    require_tools();
    let node = Ns::new("cpxc-node");
    let _table = TableGuard(node.0.clone());
    let cfg = config(&node.0);
    let mut proxier = Proxier::new(&cfg);
    proxier.sync(vec![], false).await.unwrap();
    let base = Host { netns: cfg.netns.clone() }.read().await.unwrap();
    for i in 0..300u16 {
        let mut sp =
            service(&format!("s{i}"), [10, 96, 1, (i % 250) as u8], 80, vec![ep(11, 8080, true), ep(12, 8080, false)]);
        sp.node_port = Some(30000 + i);
        sp.affinity_timeout = Some(30);
        sp.external_ips = vec![Ipv4Addr::new(192, 168, 77, 1)];
        let n = proxier.sync(vec![sp], false).await.unwrap();
        assert!(n.chains_written > 0);
        proxier.sync(vec![], false).await.unwrap();
    }
    let after = Host { netns: cfg.netns.clone() }.read().await.unwrap();
    assert_eq!(after, base, "300 create/delete cycles left something behind");
}

/// The figure of the design: time from one endpoint change to the rule being in the kernel, with
/// 1,000 Services × 10 endpoints loaded, incremental against a full rewrite, in one run.
/// `cargo test --release --bin cairn proxy::tests::measure -- --ignored --nocapture`
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement, run by hand (root)"]
async fn measure_endpoint_change_with_1000_services() {
    if !is_root("measure_endpoint_change_with_1000_services") {
        return;
    }
    require_tools();
    let node = Ns::new("cpxm-node");
    let _table = TableGuard(node.0.clone());
    let cfg = config(&node.0);
    let host = Host { netns: cfg.netns.clone() };
    let mut ports: Vec<ServicePort> = (0..1000u32)
        .map(|i| {
            let eps = (0..10u32)
                .map(|j| {
                    let n = i * 10 + j;
                    Endpoint {
                        ip: Ipv4Addr::new(10, 42, (n / 250) as u8, (n % 250 + 1) as u8),
                        port: 8080,
                        ready: true,
                        serving: true,
                        terminating: false,
                        local: j % 2 == 0,
                    }
                })
                .collect();
            let mut sp = service(&format!("s{i}"), [10, 96, (i / 250) as u8, (i % 250 + 1) as u8], 80, eps);
            sp.node_port = Some(30000 + i as u16);
            sp
        })
        .collect();
    let mut proxier = Proxier::new(&cfg);
    let t = Instant::now();
    proxier.sync(ports.clone(), false).await.unwrap();
    println!(
        "initial load (1000 services x 10 endpoints, {} chains): {:?}",
        rules::desired(&cfg.settings(), &ports).chains.len(),
        t.elapsed()
    );

    let rounds = 20;
    let (mut inc, mut full, mut read, mut plan) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        // One endpoint of one Service replaced.
        let sp = &mut ports[(r * 37) % 1000];
        sp.endpoints[r % 10].ip = Ipv4Addr::new(10, 43, (r / 250) as u8, (r % 250 + 1) as u8);
        let t = Instant::now();
        let n = proxier.sync(ports.clone(), false).await.unwrap();
        inc.push(t.elapsed());
        assert_eq!((n.chains_written, n.chains_deleted), (2, 1), "{n:?}");

        // The same state written the non-incremental way (what a full sync costs).
        let desired = rules::desired(&cfg.settings(), &ports);
        let t = Instant::now();
        host.apply(&nft::full_script(&desired)).await.unwrap();
        full.push(t.elapsed());

        // Of the incremental sync, the part in cairn: the rules wanted and the difference.
        let t = Instant::now();
        let wanted = rules::desired(&cfg.settings(), &ports);
        let _ = nft::plan(&desired, &wanted);
        plan.push(t.elapsed());

        let t = Instant::now();
        let _ = host.read().await.unwrap();
        read.push(t.elapsed());
    }
    assert_in_sync(&cfg, &ports).await;
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (i, f, r, p) = (med(&mut inc), med(&mut full), med(&mut read), med(&mut plan));
    let max = inc.iter().max().copied().unwrap_or_default();
    println!("endpoint change -> in kernel, incremental: median {i:?} (max {max:?}), of which planning {p:?}");
    println!(
        "same change as a full rewrite: median {f:?}; ratio full/incremental {:.1}x",
        f.as_secs_f64() / i.as_secs_f64()
    );
    println!("reading the table back (resync): median {r:?}");
}
