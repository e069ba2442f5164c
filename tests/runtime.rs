//! End to end: cairn's embedded containerd (real containerd + runc), its CRI client path, air-gapped
//! image import and cairn's own CNI bridge plugin. Pods are driven through CRI directly; the node
//! agent that turns Pod objects into these calls is tested elsewhere.
//!
//! These tests need root, containerd, runc and busybox-static (`.ci/run` installs them). They share
//! the host's `cni0` bridge and netfilter tables, so they take turns.

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use busybox::{BUSYBOX, busybox_image};
use common::{Server, eventually};
use cri::Cri;

/// One test at a time touches the host's network and containerd.
static HOST: Mutex<()> = Mutex::new(());

/// A cairn server with its node runtime, and a CRI client to its containerd. Dropping it removes
/// every pod sandbox it made and stops cairn (and so containerd) with SIGTERM.
struct Node {
    server: Option<Server>,
    cri: Cri,
    rt: tokio::runtime::Runtime,
    data: PathBuf,
    subnet: Ipv4Addr,
}

impl Node {
    /// Starts cairn on `cluster_cidr` (a /16) with `images` placed in its images directory first.
    fn start(cluster_cidr: &str, images: &[(&str, &[u8])]) -> Node {
        Node::start_with(cluster_cidr, images, &[])
    }

    fn start_with(cluster_cidr: &str, images: &[(&str, &[u8])], extra: &[&str]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let images_dir = data.join("agent/images");
        std::fs::create_dir_all(&images_dir).unwrap();
        for (name, bytes) in images {
            std::fs::write(images_dir.join(name), bytes).unwrap();
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let cri = rt.block_on(async { Cri::new(&data.join("agent/containerd/containerd.sock")) });
        let args = [
            &["--disable-agent=false", "--disable-kube-proxy", "--disable=coredns", "--cluster-cidr", cluster_cidr][..],
            extra,
        ]
        .concat();
        let server = Server::start_with(dir, &args);
        let base: Ipv4Addr = cluster_cidr.split('/').next().unwrap().parse().unwrap();
        Node { server: Some(server), cri, rt, data, subnet: base }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    fn in_subnet(&self, ip: &str) -> bool {
        let ip: Ipv4Addr = ip.parse().unwrap();
        ip.octets()[..3] == self.subnet.octets()[..3] && ip.octets()[3] > 1
    }

    fn has_image(&self, reference: &str) -> bool {
        let images = self.block_on(self.cri.list_images(Default::default())).map(|r| r.images).unwrap_or_default();
        images.iter().any(|i| i.repo_tags.iter().any(|t| t == reference))
    }

    fn wait_image(&self, reference: &str) {
        eventually(60, || self.has_image(reference).then_some(()));
    }

    fn sandbox_config(&self, name: &str, ports: &[(i32, i32)]) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "test".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.data.join("pod-logs").join(name).display().to_string(),
            port_mappings: ports
                .iter()
                .map(|&(host, container)| cri::PortMapping {
                    protocol: cri::Protocol::Tcp as i32,
                    container_port: container,
                    host_port: host,
                    host_ip: String::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Runs a sandbox; returns its ID and IP.
    fn sandbox(&self, name: &str, ports: &[(i32, i32)]) -> (String, String) {
        let config = self.sandbox_config(name, ports);
        let id = self
            .block_on(
                self.cri.run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                }),
            )
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"))
            .pod_sandbox_id;
        (id.clone(), self.sandbox_ip(&id))
    }

    fn sandbox_ip(&self, id: &str) -> String {
        let status = self
            .block_on(
                self.cri.pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: false }),
            )
            .unwrap();
        status.status.and_then(|s| s.network).map(|n| n.ip).unwrap_or_default()
    }

    /// Runs a busybox container with `script` in a new sandbox; returns (sandbox, container, IP).
    fn pod(&self, name: &str, ports: &[(i32, i32)], script: &str) -> (String, String, String) {
        let (sandbox, ip) = self.sandbox(name, ports);
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "main".into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: BUSYBOX.into(), ..Default::default() }),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            log_path: "main.log".into(),
            ..Default::default()
        };
        let create = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(config),
            sandbox_config: Some(self.sandbox_config(name, ports)),
        };
        let container = self.block_on(self.cri.create_container(create)).expect("CreateContainer").container_id;
        self.block_on(self.cri.start_container(cri::StartContainerRequest { container_id: container.clone() }))
            .expect("StartContainer");
        (sandbox, container, ip)
    }

    fn exec(&self, container: &str, cmd: &[&str]) -> (i32, String) {
        let req = cri::ExecSyncRequest {
            container_id: container.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        };
        let out = self.block_on(self.cri.exec_sync(req)).expect("ExecSync");
        (out.exit_code, String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    }

    fn container_state(&self, id: &str) -> i32 {
        let req = cri::ContainerStatusRequest { container_id: id.into(), verbose: false };
        self.block_on(self.cri.container_status(req)).ok().and_then(|r| r.status).map_or(-1, |s| s.state)
    }

    fn remove_sandbox(&self, id: &str) {
        self.block_on(self.cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.into() }))
            .expect("StopPodSandbox");
        self.block_on(self.cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id.into() }))
            .expect("RemovePodSandbox");
    }

    fn remove_all(&self) {
        let pods = self.block_on(self.cri.list_pod_sandbox(Default::default())).map(|r| r.items).unwrap_or_default();
        for pod in pods {
            let _ =
                self.block_on(self.cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: pod.id.clone() }));
            let _ = self.block_on(self.cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: pod.id }));
        }
    }

    /// Kills cairn with SIGKILL (containerd and the containers stay) and starts it again on the same data.
    fn restart_after_kill9(&mut self) {
        let dir = self.server.take().expect("running").kill9();
        let cidr = format!("{}/16", self.subnet);
        self.server = Some(Server::start_with(
            dir,
            &["--disable-agent=false", "--disable-kube-proxy", "--disable=coredns", "--cluster-cidr", &cidr],
        ));
        eventually(30, || self.block_on(self.cri.version(Default::default())).ok());
    }

    fn containerd_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("agent/containerd/containerd.pid")).ok()?.trim().parse().ok()
    }

    fn cairn(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_cairn")).args(args).arg("--data-dir").arg(&self.data).output().unwrap()
    }

    fn ipam_files(&self) -> BTreeSet<String> {
        let dir = self.data.join("agent/cni/ipam/cairn");
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.parse::<Ipv4Addr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.remove_all();
        if let Some(server) = self.server.take() {
            let (_dir, status) = server.terminate(Duration::from_secs(30));
            if status.is_none() && !std::thread::panicking() {
                panic!("cairn did not stop within 30s of SIGTERM");
            }
        }
    }
}

/// Whether `pid` is a live process (an exited but unreaped one counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn http_get(addr: &str) -> std::io::Result<String> {
    http(addr, "/")
}

fn http(addr: &str, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(3))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// A one-page HTTP server: `sh -c` script for a busybox container.
fn httpd(body: &str, port: u16) -> String {
    format!("mkdir -p /tmp/www && echo {body} > /tmp/www/index.html && exec httpd -f -p {port} -h /tmp/www")
}

fn retry<T>(secs: u64, mut f: impl FnMut() -> std::io::Result<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("still failing after {secs}s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// netfilter rules that mention `needle`, as `iptables-save` prints them (counters stripped).
fn rules_mentioning(needle: &str) -> Vec<String> {
    let mut rules = Vec::new();
    for table in ["nat", "filter"] {
        let out = Command::new("iptables-save").args(["-t", table]).output().expect("iptables-save");
        rules.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains(needle) || l.contains("CAIRN-HP-"))
                .filter(|l| !l.starts_with('#'))
                .map(|l| l.split(" [").next().unwrap_or(l).to_string()),
        );
    }
    rules.sort();
    rules
}

fn links() -> BTreeSet<String> {
    std::fs::read_dir("/sys/class/net").unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
}

#[test]
fn pods_get_addresses_talk_and_survive_a_containerd_crash() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let image = busybox_image();
    let node = Node::start("10.43.0.0/16", &[("busybox.tar", &image), ("corrupt.tar", b"this is not a tarball")]);

    // The built-in sandbox image and the air-gapped one are there; the corrupt file is named in the log.
    node.wait_image(BUSYBOX);
    assert!(node.has_image(&format!("localhost/cairn/pause:{}", env!("CARGO_PKG_VERSION"))));
    let log = eventually(10, || {
        let log = node.server().log();
        log.lines().any(|l| l.contains("corrupt.tar") && l.contains("WARN")).then_some(log)
    });
    assert!(!log.contains("panicked"), "{log}");

    // Two pods talk over TCP; the node reaches a pod and a pod reaches the node.
    let (_sa, a, ip_a) = node.pod("a", &[], &httpd("hello-from-a", 8080));
    let (_sb, b, ip_b) = node.pod("b", &[], "exec sleep 3600");
    assert!(node.in_subnet(&ip_a) && node.in_subnet(&ip_b) && ip_a != ip_b, "{ip_a} {ip_b}");
    let body = retry(10, || http_get(&format!("{ip_a}:8080")));
    assert!(body.contains("hello-from-a"), "{body}");
    let (code, out) = node.exec(&b, &["wget", "-q", "-O", "-", &format!("http://{ip_a}:8080/")]);
    assert_eq!((code, out.trim()), (0, "hello-from-a"));

    let gateway = format!("{}.{}.{}.1", node.subnet.octets()[0], node.subnet.octets()[1], node.subnet.octets()[2]);
    let listener = TcpListener::bind(format!("{gateway}:0")).expect("listen on the bridge's address");
    let port = listener.local_addr().unwrap().port();
    let serve = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        // Read the request first: closing with unread data would reset the connection.
        let mut request = [0u8; 1024];
        let _ = conn.read(&mut request).unwrap();
        conn.write_all(b"HTTP/1.0 200 OK\r\n\r\nhello-from-node\n").unwrap();
    });
    let (code, out) = node.exec(&b, &["wget", "-q", "-O", "-", &format!("http://{gateway}:{port}/")]);
    assert_eq!((code, out.trim()), (0, "hello-from-node"));
    serve.join().unwrap();

    // A hostPort reaches the pod from the node, on loopback and on the node's own address.
    let (_sc, c, _ip_c) = node.pod("c", &[(31080, 8080)], &httpd("hello-from-c", 8080));
    let body = retry(10, || http_get("127.0.0.1:31080"));
    assert!(body.contains("hello-from-c"), "{body}");
    let node_ip = if_addrs::get_if_addrs()
        .unwrap()
        .into_iter()
        .find(|i| !i.is_loopback() && i.ip().is_ipv4() && !i.name.starts_with("cni") && !i.name.starts_with("veth"))
        .map(|i| i.ip());
    if let Some(node_ip) = node_ip {
        let body = retry(10, || http_get(&format!("{node_ip}:31080")));
        assert!(body.contains("hello-from-c"), "{body}");
    }

    // The helper commands see the same runtime.
    let pods = String::from_utf8(node.cairn(&["ctr", "pods"]).stdout).unwrap();
    assert!(pods.lines().filter(|l| l.contains("Ready")).count() >= 3, "{pods}");
    let ps = String::from_utf8(node.cairn(&["ctr", "ps"]).stdout).unwrap();
    assert!(ps.contains(&a[..13]) && ps.contains("Running"), "{ps}");
    let images = String::from_utf8(node.cairn(&["ctr", "images"]).stdout).unwrap();
    assert!(images.contains("docker.io/cairn-test/busybox") && images.contains("localhost/cairn/pause"), "{images}");
    let bad = node.cairn(&["images", "import", &node.data.join("agent/images/corrupt.tar").display().to_string()]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("corrupt.tar"), "{bad:?}");
    // Importing what is already there writes nothing.
    let again = node.cairn(&["images", "import", &node.data.join("agent/images/busybox.tar").display().to_string()]);
    let out = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success() && out.contains(&format!("imported {BUSYBOX}")), "{again:?}");
    assert!(out.contains("0 blobs written (0.0 MiB), 3 already present"), "{out}");

    // containerd killed with SIGKILL: cairn restarts it; the containers keep running untouched.
    let old = node.containerd_pid().expect("containerd pid file");
    // SAFETY: kill(2) on a process this test's cairn started.
    unsafe { libc::kill(old as i32, libc::SIGKILL) };
    let new = eventually(30, || node.containerd_pid().filter(|&p| p != old));
    eventually(30, || node.block_on(node.cri.version(Default::default())).ok());
    for id in [&a, &b, &c] {
        assert_eq!(node.container_state(id), cri::ContainerState::ContainerRunning as i32, "container {id}");
    }
    let body = http_get(&format!("{ip_a}:8080")).expect("pod a still serves after the containerd restart");
    assert!(body.contains("hello-from-a"));
    let log = node.server().log();
    assert!(log.contains("containerd exited") && log.contains(&format!("containerd restarted (pid {new})")), "{log}");

    // Another cairn pointed at this containerd as an external runtime uses it and, stopping, leaves it be.
    let socket = format!("unix://{}", node.data.join("agent/containerd/containerd.sock").display());
    let other = Server::start_with(
        tempfile::tempdir().unwrap(),
        &[
            "--disable-agent=false",
            "--disable-kube-proxy",
            "--disable=coredns",
            "--container-runtime-endpoint",
            &socket,
            "--cluster-cidr",
            "10.49.0.0/16",
        ],
    );
    assert!(other.log().contains("containerd://1.") && other.log().contains(&socket), "{}", other.log());
    let (_, status) = other.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()));
    assert_eq!(node.containerd_pid(), Some(new));
    assert!(node.block_on(node.cri.version(Default::default())).is_ok());

    // cairn killed with SIGKILL leaves containerd orphaned; the next cairn replaces it, and the
    // containers keep running with the same IDs.
    let mut node = node;
    node.restart_after_kill9();
    let newer = node.containerd_pid().expect("containerd pid file");
    assert_ne!(newer, new);
    assert!(!alive(new), "the orphaned containerd was stopped");
    for id in [&a, &b, &c] {
        assert_eq!(node.container_state(id), cri::ContainerState::ContainerRunning as i32, "container {id}");
    }
    assert!(http_get(&format!("{ip_a}:8080")).expect("pod a serves after cairn's restart").contains("hello-from-a"));
}

#[test]
fn sandbox_cycles_leak_nothing_and_concurrent_adds_get_distinct_addresses() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::start("10.44.0.0/16", &[]);
    node.wait_image(&format!("localhost/cairn/pause:{}", env!("CARGO_PKG_VERSION")));

    // One sandbox first, so the bridge and the network-wide rules exist before the baseline.
    let (first, _) = node.sandbox("warmup", &[]);
    node.remove_sandbox(&first);
    let rules = rules_mentioning("10.44.");
    let links_before = links();
    assert!(node.ipam_files().is_empty());

    for i in 0..300 {
        // Every tenth sandbox has a hostPort, so its netfilter chain is created and removed too.
        let ports: &[(i32, i32)] = if i % 10 == 0 { &[(32000, 80)] } else { &[] };
        let (id, ip) = node.sandbox(&format!("cycle-{i}"), ports);
        assert!(node.in_subnet(&ip), "cycle {i}: {ip}");
        node.remove_sandbox(&id);
    }
    assert!(node.ipam_files().is_empty(), "{:?}", node.ipam_files());
    assert_eq!(links(), links_before);
    assert_eq!(rules_mentioning("10.44."), rules);

    // Ten sandboxes at once: ten different addresses.
    let ids: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let config = node.sandbox_config(&format!("burst-{i}"), &[]);
                let socket = node.data.join("agent/containerd/containerd.sock");
                s.spawn(move || {
                    // A client of its own: a channel is served by the runtime it was made on.
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    let req = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
                    rt.block_on(async { Cri::new(&socket).run_pod_sandbox(req).await })
                        .expect("RunPodSandbox")
                        .pod_sandbox_id
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).map(|id| (id.clone(), node.sandbox_ip(&id))).collect()
    });
    let ips: BTreeSet<&String> = ids.iter().map(|(_, ip)| ip).collect();
    assert_eq!(ips.len(), 10, "{ids:?}");
    assert_eq!(node.ipam_files().len(), 10);
    for (id, _) in &ids {
        node.remove_sandbox(id);
    }
    assert!(node.ipam_files().is_empty());
}

#[test]
fn the_node_registers_ready_and_renews_its_lease() {
    let _host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let healthz = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let node = Node::start_with("10.45.0.0/16", &[], &["--healthz-port", &healthz.to_string()]);
    let server = node.server();
    let health = retry(10, || http(&format!("127.0.0.1:{healthz}"), "/healthz"));
    assert!(health.starts_with("HTTP/1.0 200") && health.ends_with("ok"), "{health}");
    let name = eventually(30, || {
        let out = server.ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]);
        (!out.trim().is_empty()).then(|| out.trim().to_string())
    });
    let get = |path: &str| server.ok(&["get", "node", &name, "-o", &format!("jsonpath={path}")]);
    let ready = eventually(30, || {
        let status = get("{.status.conditions[?(@.type==\"Ready\")].status}");
        (status == "True").then(|| get("{.status.conditions[?(@.type==\"Ready\")].reason}"))
    });
    assert_eq!(ready, "KubeletReady");
    let table = server.ok(&["get", "nodes"]);
    assert!(table.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(1) == Some("Ready")), "{table}");
    assert_eq!(get("{.status.capacity.pods}"), "110");
    assert_eq!(get("{.spec.podCIDR}"), "10.45.0.0/24");
    assert!(get("{.status.nodeInfo.containerRuntimeVersion}").starts_with("containerd://"));
    assert!(get("{.status.images[*].names}").contains("localhost/cairn/pause"));
    for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(get(&format!("{{.status.conditions[?(@.type==\"{t}\")].status}}")), "False", "{t}");
    }

    // The Lease is owned by the Node and renewed every 10 s.
    let lease =
        |path: &str| server.ok(&["get", "lease", "-n", "kube-node-lease", &name, "-o", &format!("jsonpath={path}")]);
    let first = eventually(30, || Some(lease("{.spec.renewTime}")).filter(|t| !t.is_empty()));
    assert_eq!(lease("{.spec.leaseDurationSeconds}"), "40");
    assert_eq!(lease("{.metadata.ownerReferences[0].kind}"), "Node");
    let renewed = eventually(25, || Some(lease("{.spec.renewTime}")).filter(|t| *t != first));
    assert!(renewed > first, "{renewed} after {first}");
}

#[test]
fn a_missing_containerd_is_named_with_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "server",
            "--disable-agent=false",
            "--https-listen-port",
            "0",
            "--containerd-bin",
            "/nonexistent/containerd",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/containerd") && err.contains("apt-get install containerd runc"), "{err}");
    assert!(err.contains("--container-runtime-endpoint"), "{err}");
}
