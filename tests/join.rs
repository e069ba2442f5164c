//! End to end: nodes joining a server (`cairn agent --server URL --token-file F`). A server without
//! an agent of its own, and agents each in a network namespace the test makes (joined by veth
//! pairs to a bridge the test makes), each with its own data directory, containerd, cgroup root
//! and kubelet root: one machine standing in for a small site. One test runs two servers of one
//! cluster on an etcd member and an agent naming both.
//!
//! Needs root, containerd, runc, iproute2, util-linux's nsenter, busybox-static and etcd-server
//! (`.ci/run` installs them).

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

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Server, eventually};
use serde_json::Value;

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect("run a system tool");
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A bridge in the test's namespace and, per node, a network namespace joined to it by a veth
/// pair: `10.201.<net>.1` is the bridge (where the server listens), nodes get `.2`, `.3`, ...
/// Nodes added with [`Lab::add_routed_node`] sit on a second bridge, `10.201.<net + 100>.0/24`,
/// which the test's namespace routes to the first (one router between two sites). Everything is
/// removed when dropped.
struct Lab {
    net: u8,
    nodes: Vec<String>,
}

impl Lab {
    fn new(net: u8) -> Lab {
        let lab = Lab { net, nodes: Vec::new() };
        lab.remove();
        for net in [net, net + 100] {
            let bridge = format!("cjbr{net}");
            run("ip", &["link", "add", &bridge, "type", "bridge"]);
            run("ip", &["addr", "add", &format!("10.201.{net}.1/24"), "dev", &bridge]);
            run("ip", &["link", "set", &bridge, "up"]);
        }
        lab
    }

    fn gateway(&self) -> String {
        format!("10.201.{}.1", self.net)
    }
    fn netns(&self, node: &str) -> String {
        format!("cj{}-{node}", self.net)
    }
    /// The host side of a node's veth pair: downing it cuts the node off.
    fn veth(&self, node: &str) -> String {
        format!("cj{}{node}", self.net)
    }

    /// Makes the namespace of `node`, with the next address; returns that address.
    fn add_node(&mut self, node: &str) -> String {
        self.add_node_on(node, self.net)
    }

    /// As [`Lab::add_node`], on the second network: reached from the first only through a router.
    fn add_routed_node(&mut self, node: &str) -> String {
        // The test's namespace routes between the two bridges.
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
        self.add_node_on(node, self.net + 100)
    }

    fn add_node_on(&mut self, node: &str, net: u8) -> String {
        self.nodes.push(node.to_string());
        let (ns, veth) = (self.netns(node), self.veth(node));
        let ip = format!("10.201.{net}.{}", self.nodes.len() + 1);
        run("ip", &["netns", "add", &ns]);
        run("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        run("ip", &["link", "set", &veth, "master", &format!("cjbr{net}"), "up"]);
        run("ip", &["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
        run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        run("ip", &["-n", &ns, "route", "add", "default", "via", &format!("10.201.{net}.1")]);
        ip
    }

    fn set_link(&self, node: &str, up: bool) {
        run("ip", &["link", "set", &self.veth(node), if up { "up" } else { "down" }]);
    }

    fn remove(&self) {
        for node in &self.nodes {
            let _ = Command::new("ip").args(["netns", "del", &self.netns(node)]).output();
            let _ = Command::new("ip").args(["link", "del", &self.veth(node)]).output();
        }
        for net in [self.net, self.net + 100] {
            let _ = Command::new("ip").args(["link", "del", &format!("cjbr{net}")]).output();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A `cairn agent` in its namespace. Dropping it removes its pods' sandboxes and stops it (and its
/// containerd).
struct Agent {
    name: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// How it was started, to start it again.
    netns: String,
    command: Command,
}

impl Agent {
    fn start(lab: &Lab, server: &Server, name: &str) -> Agent {
        Agent::start_on(lab, &[server], name)
    }

    /// An agent naming each of `servers` (of one cluster), with the first one's token.
    fn start_on(lab: &Lab, servers: &[&Server], name: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("data/agent/images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("busybox.tar"), busybox::busybox_image()).unwrap();
        let url = |s: &&Server| format!("https://{}:{}", lab.gateway(), s.url.rsplit(':').next().unwrap());
        let urls = servers.iter().map(url).collect::<Vec<_>>().join(",");
        let mut command = agent_command(&dir, name, &urls);
        command.arg("--token-file").arg(servers[0].dir.path().join("data/server/token"));
        let netns = lab.netns(name);
        let child = spawn_in(&netns, &command, &dir.path().join("agent.log"));
        Agent { name: name.to_string(), dir, child: Some(child), netns, command }
    }

    /// `kill -9`: its containerd and containers stay.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same data, its log continued in `agent-2.log`.
    fn start_again(&mut self) {
        self.child = Some(spawn_in(&self.netns, &self.command, &self.dir.path().join("agent-2.log")));
    }

    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("data/agent/containerd/containerd.sock")
    }

    fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        read("agent.log") + &read("agent-2.log")
    }
}

/// `cairn agent` for node `name` on data in `dir`, with the flags that keep agents sharing a
/// machine apart.
fn agent_command(dir: &tempfile::TempDir, name: &str, server: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.arg("agent")
        .args(["--server", server, "--node-name", name])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--kubelet-root-dir")
        .arg(dir.path().join("kubelet"))
        .args(["--cgroup-root".to_string(), common::cgroup_root(dir)])
        .stdout(Stdio::null());
    cmd
}

/// Spawns `cmd` inside the network namespace `netns` (only that: mounts and cgroups stay the
/// machine's, as for an agent on a host of its own), its stderr into `log`.
fn spawn_in(netns: &str, cmd: &Command, log: &std::path::Path) -> Child {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the agent's log"))
        .spawn()
        .expect("start cairn agent")
}

impl Drop for Agent {
    fn drop(&mut self) {
        node::remove_sandboxes(&self.socket());
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid (nsenter hands the signal on to cairn).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            for _ in 0..300 {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims whose containers are gone can outlive a containerd stopped right after their
        // sandboxes were removed.
        let shims = format!("containerd-shim.* -address {}/", self.dir.path().display());
        let _ = Command::new("pkill").args(["-KILL", "-f", &shims]).status();
        common::remove_cgroups(&self.dir);
    }
}

/// As `eventually`, with what `context` says when the condition is not met.
fn within<T>(secs: u64, mut f: impl FnMut() -> Option<T>, context: impl Fn() -> String) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "condition not met within {secs}s:\n{}", context());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The status of the Node's condition `kind`; empty while the Node is not there (an agent's
/// credentials are issued a moment before it registers its Node) or the condition not yet set.
fn node_condition(s: &Server, node: &str, kind: &str) -> String {
    let jsonpath = format!("jsonpath={{.status.conditions[?(@.type==\"{kind}\")].status}}");
    String::from_utf8_lossy(&s.kubectl(&["get", "node", node, "-o", &jsonpath]).stdout).into_owned()
}

fn pod(s: &Server, name: &str) -> Value {
    serde_json::from_str(&s.ok(&["get", "pod", name, "-o", "json"])).unwrap()
}

fn running(s: &Server, name: &str) -> Option<Value> {
    let p: Value = serde_json::from_slice(&s.kubectl(&["get", "pod", name, "-o", "json"]).stdout).ok()?;
    (p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["ready"] == true).then_some(p)
}

/// A pod pinned to `node` through the scheduler (a node selector), with `tolerations` and
/// `$GREETING` from the Secret `greeting`.
fn pod_yaml(name: &str, node: &str, command: &str, tolerations: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  tolerations: {tolerations}
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "{command}"]
    env:
    - name: GREETING
      valueFrom:
        secretKeyRef: {{name: greeting, key: word}}
    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
"#,
        image = busybox::BUSYBOX
    )
}

/// Two agents join; pods run on each and reach each other by pod IP across the nodes; logs and exec
/// reach pods on joined nodes; a wrong token and a token for another CA are refused on both sides;
/// then one node's network is cut: it goes Unknown and tainted, a pod tolerating that for 10 s is
/// evicted, the others keep running, and nothing restarts when the network is back.
#[test]
fn agents_join_run_pods_across_nodes_and_ride_out_a_network_cut() {
    let mut lab = Lab::new(1);
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        &[
            "--bind-address",
            "0.0.0.0",
            "--tls-san",
            &lab.gateway(),
            "--cluster-cidr",
            "10.58.0.0/16",
            "--node-monitor-grace-period",
            "20s",
        ],
    );
    let ip_a = lab.add_node("a");
    let ip_b = lab.add_node("b");
    let a = Agent::start(&lab, &server, "a");
    let b = Agent::start(&lab, &server, "b");
    for agent in [&a, &b] {
        eventually(60, || (node_condition(&server, &agent.name, "Ready") == "True").then_some(()));
    }
    let wide = server.ok(&["get", "nodes", "-o", "wide"]);
    assert!(wide.contains(&ip_a) && wide.contains(&ip_b), "{wide}");
    // Both start at once, so either may be given the first /24.
    let cidrs = server.ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"]);
    let mut cidrs: Vec<&str> = cidrs.split_whitespace().collect();
    cidrs.sort_unstable();
    assert_eq!(cidrs, ["10.58.0.0/24", "10.58.1.0/24"], "each node gets its own /24 of --cluster-cidr");
    // No node runs the control plane.
    assert!(!wide.contains("control-plane"), "{wide}");

    let none = "[]";
    server.ok(&["create", "secret", "generic", "greeting", "--from-literal=word=hello"]);
    server.ok(&["create", "secret", "generic", "lonely", "--from-literal=word=unread"]);
    server.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml(
            "web",
            "b",
            "mkdir /www && echo hello-from-b > /www/index.html && exec httpd -f -p 8080 -h /www",
            none,
        ),
    );
    server.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml("client", "a", "echo client-started-$GREETING && exec sleep 3600", none),
    );
    let tolerant = r#"[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]"#;
    server.ok_stdin(&["apply", "-f", "-"], &pod_yaml("tolerant", "a", "exec sleep 3600", tolerant));
    for name in ["web", "client", "tolerant"] {
        eventually(90, || running(&server, name));
    }
    let web = pod(&server, "web");
    assert_eq!(web["spec"]["nodeName"], "b");
    let web_ip = web["status"]["podIP"].as_str().unwrap().to_string();
    assert!(web_ip.starts_with("10.58."), "{web_ip}");
    let pods = server.ok(&["get", "pods", "-o", "wide"]);
    assert!(pods.lines().any(|l| l.starts_with("web ") && l.contains(" b ")), "{pods}");

    // Across nodes by pod IP, through the routes each node keeps to the other's pods; exec and
    // logs reach pods on joined nodes through their node endpoints.
    let mut page = String::new();
    for _ in 0..15 {
        let out = server.kubectl(&["exec", "client", "--", "wget", "-qO-", &format!("http://{web_ip}:8080/")]);
        page = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            break;
        }
    }
    assert_eq!(page.trim(), "hello-from-b", "{}\n{}", a.log(), b.log());
    assert_eq!(server.ok(&["logs", "client"]).trim(), "client-started-hello");

    // A node's identity reads what its pods refer to and nothing else, and writes only its own
    // (the Node authorizer and NodeRestriction): as node a, with its own credentials.
    let creds = a.dir.path().join("data/agent");
    let as_node_a = |args: &[&str]| {
        let out = Command::new(common::kubectl_path())
            .arg("--server")
            .arg(&server.url)
            .arg("--certificate-authority")
            .arg(creds.join("server-ca.crt"))
            .arg("--client-certificate")
            .arg(creds.join("client-kubelet.crt"))
            .arg("--client-key")
            .arg(creds.join("client-kubelet.key"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (read, out) = as_node_a(&["get", "secret", "greeting", "-o", "jsonpath={.data.word}"]);
    assert!(read && out == "aGVsbG8=", "a Secret its pod refers to: {out}");
    for (args, says) in [
        (
            &["get", "secret", "lonely"][..],
            "secrets \"lonely\" is forbidden: User \"system:node:a\" cannot get resource \"secrets\" in API group \"\" \
             in the namespace \"default\": no relationship found between node 'a' and this object",
        ),
        (&["get", "nodes"][..], "node 'a' cannot read all nodes, only its own Node object"),
        (
            &["patch", "node", "a", "-p", r#"{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}"#][..],
            "node \"a\" is not allowed to modify taints",
        ),
        (&["delete", "pod", "web"][..], "node \"a\" can only delete pods with spec.nodeName set to itself"),
    ] {
        let (ok, out) = as_node_a(args);
        assert!(!ok && out.contains("(Forbidden)") && out.contains(says), "{args:?}: {out}");
    }
    let routes = String::from_utf8_lossy(
        &Command::new("ip").args(["-n", &lab.netns("a"), "route", "show", "proto", "202"]).output().unwrap().stdout,
    )
    .into_owned();
    let b_cidr = server.ok(&["get", "node", "b", "-o", "jsonpath={.spec.podCIDR}"]);
    assert_eq!(routes.trim(), format!("{b_cidr} via {ip_b} dev eth0"), "node a's routes to other nodes' pods");

    // A wrong token, and a token pinning another CA, are refused with words saying so.
    let port = server.url.rsplit(':').next().unwrap().to_string();
    let url = format!("https://{}:{port}", lab.gateway());
    let token = std::fs::read_to_string(server.dir.path().join("data/server/token")).unwrap().trim().to_string();
    let secret = token.rsplit(':').next().unwrap();
    let foreign = format!("K10{}::server:{secret}", "0".repeat(64));
    for (given, says) in [
        ("not-the-token", "refused the join token (401 Unauthorized)"),
        (foreign.as_str(), "it is not the server the token was made for"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out =
            agent_command(&dir, "intruder", &url).args(["--token", given]).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
    assert!(server.log().contains("refused a node joining with a token that is not this server's join token"));
    assert!(!server.ok(&["get", "nodes", "-o", "name"]).contains("intruder"));

    let started_at = |s: &Server, name: &str| {
        pod(s, name)["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone()
    };
    // A static pod: a manifest in node b's directory runs there without the scheduler, with a
    // mirror pod in the API, owned by the Node; deleting the mirror brings it back (the pod keeps
    // running), editing the manifest restarts the pod, removing it stops the pod.
    let manifests = b.dir.path().join("data/agent/pod-manifests");
    let manifest = |says: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: beacon\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    imagePullPolicy: Never\n    command: [sh, -c, 'echo {says} && exec sleep 3600']\n",
            busybox::BUSYBOX
        )
    };
    std::fs::write(manifests.join("beacon.yaml"), manifest("first")).unwrap();
    let mirror = within(60, || running(&server, "beacon-b"), || b.log());
    let annotations = mirror["metadata"]["annotations"].clone();
    assert_eq!(annotations["kubernetes.io/config.source"], "file", "{mirror}");
    assert_eq!(annotations["kubernetes.io/config.mirror"], annotations["kubernetes.io/config.hash"], "{mirror}");
    assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(mirror["metadata"]["ownerReferences"][0]["name"], "b");
    assert_eq!(mirror["spec"]["nodeName"], "b");
    let logs = server.kubectl(&["logs", "beacon-b"]);
    assert_eq!(
        String::from_utf8_lossy(&logs.stdout).trim(),
        "first",
        "{}\n{}",
        String::from_utf8_lossy(&logs.stderr),
        b.log()
    );
    let started = started_at(&server, "beacon-b");
    let first_uid = mirror["metadata"]["uid"].clone();
    server.ok(&["delete", "pod", "beacon-b", "--wait=false"]);
    let again = within(
        60,
        || {
            let p = running(&server, "beacon-b")?;
            (p["metadata"]["uid"] != first_uid).then_some(p)
        },
        || {
            format!(
                "{}\n{}",
                String::from_utf8_lossy(&server.kubectl(&["get", "pod", "beacon-b", "-o", "yaml"]).stdout),
                b.log()
            )
        },
    );
    assert_eq!(
        again["metadata"]["annotations"]["kubernetes.io/config.mirror"],
        annotations["kubernetes.io/config.mirror"]
    );
    assert_eq!(started_at(&server, "beacon-b"), started, "deleting the mirror pod does not restart the static pod");
    std::fs::write(manifests.join("beacon.yaml"), manifest("second")).unwrap();
    eventually(60, || (server.kubectl(&["logs", "beacon-b"]).stdout == b"second\n").then_some(()));
    let edited = pod(&server, "beacon-b");
    assert_ne!(
        edited["metadata"]["annotations"]["kubernetes.io/config.mirror"],
        annotations["kubernetes.io/config.mirror"]
    );
    std::fs::remove_file(manifests.join("beacon.yaml")).unwrap();
    eventually(60, || (!server.kubectl(&["get", "pod", "beacon-b"]).status.success()).then_some(()));

    // The network of node a is cut: past the grace period it is Unknown and tainted, the pod that
    // tolerates that for 10 s is evicted, the others stay.
    let client_started = started_at(&server, "client");
    lab.set_link("a", false);
    eventually(60, || (node_condition(&server, "a", "Ready") == "Unknown").then_some(()));
    let taints = server.ok(&["get", "node", "a", "-o", "jsonpath={.spec.taints[*].key}"]);
    assert!(taints.contains("node.kubernetes.io/unreachable"), "{taints}");
    eventually(60, || {
        let out = server.kubectl(&["get", "pod", "tolerant", "-o", "jsonpath={.metadata.deletionTimestamp}"]);
        (!out.status.success() || !out.stdout.is_empty()).then_some(())
    });
    assert!(server.kubectl(&["get", "pod", "client"]).status.success(), "client tolerates 300 s and stays");

    // Back: Ready again, untainted, the evicted pod gone for good, and the others never restarted.
    lab.set_link("a", true);
    eventually(60, || (node_condition(&server, "a", "Ready") == "True").then_some(()));
    eventually(30, || {
        let taints = server.ok(&["get", "node", "a", "-o", "jsonpath={.spec.taints[*].key}"]);
        (!taints.contains("unreachable")).then_some(())
    });
    eventually(60, || (!server.kubectl(&["get", "pod", "tolerant"]).status.success()).then_some(()));
    let client = pod(&server, "client");
    assert_eq!(client["status"]["containerStatuses"][0]["restartCount"], 0, "{client}");
    assert_eq!(started_at(&server, "client"), client_started, "the client's container kept running");
    assert_eq!(server.ok(&["exec", "client", "--", "echo", "still-here"]).trim(), "still-here");
    drop((a, b));
    drop(lab);
}

/// The IDs of the running containers of pod `pod`, as the node's own runtime has them.
fn running_containers(socket: &std::path::Path, pod: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listed = cri::Cri::new(socket).list_containers(Default::default()).await;
        listed
            .map(|r| r.containers)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .filter(|c| c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod))
            .map(|c| c.id)
            .collect()
    })
}

/// Edge autonomy: a joined node cut off from the server that restarts with its containers gone (as
/// after a reboot) runs its pods again from its local store, their Secret and ConfigMap included
/// (sealed on its disk), and the server sees them Running once the node is back.
#[test]
fn a_node_restarted_while_cut_off_runs_its_pods_from_what_it_last_knew() {
    let mut lab = Lab::new(2);
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        &["--bind-address", "0.0.0.0", "--tls-san", &lab.gateway(), "--cluster-cidr", "10.60.0.0/16"],
    );
    lab.add_node("c");
    let mut c = Agent::start(&lab, &server, "c");
    eventually(60, || (node_condition(&server, "c", "Ready") == "True").then_some(()));
    server.ok(&["create", "secret", "generic", "greeting", "--from-literal=word=hello"]);
    server.ok(&["create", "configmap", "motd", "--from-literal=line=kept-locally"]);
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: autonomous
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: motd
    configMap: {{name: motd}}
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo $GREETING-$(cat /etc/motd/line) && exec sleep 3600"]
    env:
    - name: GREETING
      valueFrom:
        secretKeyRef: {{name: greeting, key: word}}
    volumeMounts:
    - {{name: motd, mountPath: /etc/motd}}
"#,
        image = busybox::BUSYBOX
    );
    server.ok_stdin(&["apply", "-f", "-"], &manifest);
    eventually(90, || running(&server, "autonomous"));
    assert_eq!(server.ok(&["logs", "autonomous"]).trim(), "hello-kept-locally");
    let before = running_containers(&c.socket(), "autonomous");
    assert_eq!(before.len(), 1, "{before:?}");

    // What the node keeps is sealed: neither the Secret nor the ConfigMap is readable on its disk.
    let store = c.dir.path().join("data/agent/local-store");
    let entries: Vec<String> =
        std::fs::read_dir(&store).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(entries.iter().any(|e| e == "pods") && entries.iter().any(|e| e.starts_with("objects-")), "{entries:?}");
    for entry in &entries {
        let bytes = String::from_utf8_lossy(&std::fs::read(store.join(entry)).unwrap()).into_owned();
        assert!(
            !bytes.contains("hello") && !bytes.contains("kept-locally") && !bytes.contains("autonomous"),
            "{entry}"
        );
    }

    // Cut off, killed, and its containers gone, as after a reboot; then started again, the
    // server still out of reach.
    lab.set_link("c", false);
    c.kill9();
    node::remove_sandboxes(&c.socket());
    assert!(running_containers(&c.socket(), "autonomous").is_empty());
    c.start_again();
    let after =
        within(90, || Some(running_containers(&c.socket(), "autonomous")).filter(|ids| !ids.is_empty()), || c.log());
    assert_ne!(after, before, "a new container");
    assert!(c.log().contains("starting the 1 pods node c last knew, from its local store"), "{}", c.log());

    // Back: the server sees the pod run in that very container, with what the local store gave it.
    lab.set_link("c", true);
    eventually(90, || (node_condition(&server, "c", "Ready") == "True").then_some(()));
    let id = within(
        60,
        || {
            let p = running(&server, "autonomous")?;
            let id = p["status"]["containerStatuses"][0]["containerID"].as_str()?.to_string();
            id.ends_with(&after[0]).then_some(id)
        },
        || c.log(),
    );
    assert!(id.starts_with("containerd://"), "{id}");
    // Its log is a file of its own, past the one the lost container wrote (kubelet's restart count
    // from the log directory).
    let logs = server.kubectl(&["logs", "autonomous"]);
    assert_eq!(
        String::from_utf8_lossy(&logs.stdout).trim(),
        "hello-kept-locally",
        "{}\n{}\n{}",
        String::from_utf8_lossy(&logs.stderr),
        server.ok(&["get", "pod", "autonomous", "-o", "yaml"]),
        c.log()
    );
    assert_eq!(pod(&server, "autonomous")["status"]["containerStatuses"][0]["restartCount"], 1);
    drop(c);
    drop(lab);
}

/// Nodes on different networks, with a router between them: the pod network reaches across
/// through VXLAN (`--flannel-backend` auto), and the overlay goes when the far node does.
#[test]
fn nodes_on_different_networks_reach_each_others_pods_through_vxlan() {
    let mut lab = Lab::new(3);
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        &["--bind-address", "0.0.0.0", "--tls-san", &lab.gateway(), "--cluster-cidr", "10.61.0.0/16"],
    );
    lab.add_node("near");
    let far_ip = lab.add_routed_node("far");
    let near = Agent::start(&lab, &server, "near");
    let far = Agent::start(&lab, &server, "far");
    for agent in [&near, &far] {
        within(60, || (node_condition(&server, &agent.name, "Ready") == "True").then_some(()), || agent.log());
    }
    server.ok(&["create", "secret", "generic", "greeting", "--from-literal=word=hello"]);
    let none = "[]";
    server.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml(
            "web",
            "far",
            "mkdir /www && echo hello-from-far > /www/index.html && exec httpd -f -p 8080 -h /www",
            none,
        ),
    );
    server.ok_stdin(&["apply", "-f", "-"], &pod_yaml("client", "near", "exec sleep 3600", none));
    for name in ["web", "client"] {
        eventually(90, || running(&server, name));
    }
    let web_ip = pod(&server, "web")["status"]["podIP"].as_str().unwrap().to_string();
    let mut page = String::new();
    for _ in 0..15 {
        let out = server.kubectl(&["exec", "client", "--", "wget", "-qO-", &format!("http://{web_ip}:8080/")]);
        page = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            break;
        }
    }
    assert_eq!(page.trim(), "hello-from-far", "{}\n{}", near.log(), far.log());

    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(["-n", &lab.netns("near")]).args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let far_cidr = server.ok(&["get", "node", "far", "-o", "jsonpath={.spec.podCIDR}"]);
    let far_gateway = far_cidr.trim_end_matches("/24");
    let (_, routes) = ip(&["route", "show", "proto", "202"]);
    assert_eq!(routes.trim(), format!("{far_cidr} via {far_gateway} dev cairn.1 onlink"), "near's routes");
    let (_, device) = ip(&["-d", "link", "show", "cairn.1"]);
    assert!(device.contains("vxlan id 1 ") && device.contains("dstport 8472"), "{device}");
    let (_, fdb) = ip(&["neigh", "show", "dev", "cairn.1"]);
    assert!(fdb.contains(far_gateway) && fdb.contains("PERMANENT"), "{fdb}");
    let (_, forwarding) = Command::new("bridge")
        .args(["-n", &lab.netns("near"), "fdb", "show", "dev", "cairn.1"])
        .output()
        .map(|o| (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned()))
        .unwrap();
    assert!(forwarding.contains(&format!("dst {far_ip}")), "{forwarding}");

    // The far node leaves: near's route, entries and device go with it.
    drop(far);
    server.ok(&["delete", "node", "far"]);
    within(30, || (!ip(&["link", "show", "cairn.1"]).0).then_some(()), || near.log());
    assert_eq!(ip(&["route", "show", "proto", "202"]).1.trim(), "");
}

/// One etcd member on free loopback ports (Debian's `etcd-server`), for servers sharing a cluster;
/// killed when dropped.
struct Etcd {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (client, peer) = (format!("http://127.0.0.1:{}", port()), format!("http://127.0.0.1:{}", port()));
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(std::env::var_os("ETCD").unwrap_or_else(|| "/usr/bin/etcd".into()))
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd-server is needed (/usr/bin/etcd, or $ETCD)");
        Etcd { child, url: client, _dir: dir }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two servers of one cluster (on one etcd) and an agent naming both: the kubernetes Service lists
/// both servers; the server the agent talks to is killed with SIGKILL; the node moves on to the
/// other (its load balancer says so), stays Ready, and runs a pod created through the survivor; the
/// dead server leaves the kubernetes Service. Each server's admin kubeconfig names the other live one.
#[test]
fn an_agent_naming_two_servers_moves_to_the_other_when_one_dies() {
    let mut lab = Lab::new(4);
    let etcd = Etcd::start();
    let common = ["--bind-address", "0.0.0.0", "--tls-san", &lab.gateway(), "--cluster-cidr", "10.62.0.0/16"];
    let first = [&common[..], &["--datastore-endpoint", &etcd.url]].concat();
    let a = Server::start_with(tempfile::tempdir().unwrap(), &first);
    let token = std::fs::read_to_string(a.dir.path().join("data/server/token")).unwrap();
    let second = [&common[..], &["--server", &a.url, "--token", token.trim()]].concat();
    let b = Server::start_with(tempfile::tempdir().unwrap(), &second);
    lab.add_node("d");
    let d = Agent::start_on(&lab, &[&a, &b], "d");
    let ready = |s: &Server| {
        let out = s.kubectl(&["get", "node", "d", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
        String::from_utf8_lossy(&out.stdout) == "True"
    };
    within(60, || ready(&b).then_some(()), || d.log());
    // In-cluster clients reach both servers: the kubernetes Service lists each.
    let port = |s: &Server| s.url.rsplit(':').next().unwrap().to_string();
    let api_ports = |s: &Server| {
        let out = s.kubectl(&["get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[*].ports[*].port}"]);
        let mut ports: Vec<String> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect();
        ports.sort();
        ports
    };
    let mut both = vec![port(&a), port(&b)];
    both.sort();
    within(30, || (api_ports(&b) == both).then_some(()), || b.log());
    // B's admin kubeconfig names A too: a context per other live server, by its address.
    let contexts = |s: &Server| {
        let mut names: Vec<String> =
            s.ok(&["config", "get-contexts", "-o", "name"]).lines().map(String::from).collect();
        names.sort();
        names
    };
    let other = within(30, || contexts(&b).into_iter().find(|c| c != "default"), || b.log());
    assert!(other.ends_with(&format!(":{}", port(&a))), "{other}");
    let through_a = b.ok(&["--context", &other, "get", "--raw", "/readyz"]);
    assert_eq!(through_a.trim(), "ok");
    a.ok(&["create", "secret", "generic", "greeting", "--from-literal=word=hello"]);
    a.ok_stdin(&["apply", "-f", "-"], &pod_yaml("before", "d", "echo $GREETING && exec sleep 3600", "[]"));
    within(90, || running(&a, "before"), || d.log());

    let a_port = port(&a);
    drop(a.kill9());
    b.ok_stdin(&["apply", "-f", "-"], &pod_yaml("after", "d", "echo $GREETING-again && exec sleep 3600", "[]"));
    within(90, || running(&b, "after"), || d.log() + "\n--- server ---\n" + &b.log());
    assert!(d.log().contains("cannot be reached: using"), "{}", d.log());
    assert_eq!(b.ok(&["logs", "after"]).trim(), "hello-again");
    assert!(ready(&b), "{}", d.log());
    assert!(running(&b, "before").is_some(), "the first pod kept running");
    // The dead server leaves the kubernetes Service once its Lease has run out.
    within(40, || (api_ports(&b) == [port(&b)]).then_some(()), || b.log());
    assert!(!api_ports(&b).contains(&a_port));
    // ... and B's kubeconfig names only B again.
    within(30, || (contexts(&b) == ["default"]).then_some(()), || b.log());
}
