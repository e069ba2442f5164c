//! End to end: cairn on etcd (Debian's `etcd-server`, three members on loopback).
//!
//! - etcd not there yet at start: cairn says which endpoint it cannot reach, keeps trying, and comes
//!   up once it answers;
//! - eight concurrent writers while the member cairn talks to is killed with SIGKILL: cairn moves on
//!   to another and writes go on (40 more acknowledged within 30 s), and every acknowledged create
//!   is there afterwards, through cairn and read back after cairn's own restart;
//! - the objects are where kube-apiserver keeps them (`/registry/<resource>/<namespace>/<name>`),
//!   without a resourceVersion in the value;
//! - `cairn datastore migrate` copies a cluster of the embedded store into etcd: the server started
//!   on etcd has the same objects, UIDs and Service addresses, and a second copy is refused;
//! - two servers on one etcd: a second server without the first one's token is refused; with it
//!   (`--server A --token T`) it shares the CA and service account key (a token minted through A
//!   works on B); a pod created through A is seen by a watch on B and bound by the leading
//!   scheduler; the leader killed with SIGKILL, the other takes its Leases over and binds a new pod
//!   within 20 s;
//! - quorum lost while cairn runs: a write is refused (503, `etcdserver: request timed out`), reads
//!   answer from the index, and once the members are back writes go on with nothing lost.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use common::Server;

const WRITERS: usize = 8;

/// A three-member etcd cluster on loopback, each member killed when dropped.
struct Cluster {
    members: Vec<Option<Child>>,
    clients: Vec<String>,
    ports: Vec<(u16, u16)>,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    fn ports() -> Vec<(u16, u16)> {
        (0..3).map(|_| (free_port(), free_port())).collect()
    }

    /// Starts the members.
    fn start(ports: &[(u16, u16)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clients = ports.iter().map(|(client, _)| format!("http://127.0.0.1:{client}")).collect();
        let mut cluster = Cluster { members: Vec::new(), clients, ports: ports.to_vec(), dir };
        for i in 0..ports.len() {
            let child = cluster.spawn(i);
            cluster.members.push(Some(child));
        }
        cluster
    }

    /// Starts member `i` (again, on its data, after [`Cluster::kill9`]).
    fn spawn(&self, i: usize) -> Child {
        let peers: Vec<String> =
            self.ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}")).collect();
        let (client, peer) = self.ports[i];
        let (client_url, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
        let log =
            std::fs::File::options().create(true).append(true).open(self.dir.path().join(format!("m{i}.log"))).unwrap();
        Command::new(std::env::var_os("ETCD").unwrap_or_else(|| "/usr/bin/etcd".into()))
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &peers.join(","), "--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd-server is needed (/usr/bin/etcd, or $ETCD)")
    }

    fn restart(&mut self, member: usize) {
        if self.members[member].is_none() {
            self.members[member] = Some(self.spawn(member));
        }
    }

    fn endpoints(&self) -> String {
        self.clients.join(",")
    }

    fn kill9(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The value etcd keeps at `key`, read with etcd's own client.
    async fn get(&self, key: &str) -> Option<serde_json::Value> {
        // The last member: the first is the one killed.
        let mut client = etcd_client::Client::connect(&self.clients[self.clients.len() - 1..], None).await.ok()?;
        let resp = client.get(key, None).await.ok()?;
        serde_json::from_slice(resp.kvs().first()?.value()).ok()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in 0..self.members.len() {
            self.kill9(member);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cairn_on_etcd_rides_out_a_lost_member_and_waits_for_etcd() {
    // cairn first, etcd two seconds later.
    let ports = Cluster::ports();
    let endpoints = ports.iter().map(|(client, _)| format!("http://127.0.0.1:{client}")).collect::<Vec<_>>().join(",");
    let late = {
        let ports = ports.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            Cluster::start(&ports)
        })
    };
    let server = tokio::task::block_in_place(|| {
        Server::start_with(tempfile::tempdir().unwrap(), &["--datastore-endpoint", &endpoints])
    });
    let mut etcd = late.join().unwrap();
    let log = server.log();
    let named = ports
        .iter()
        .any(|(client, _)| log.contains(&format!("the datastore http://127.0.0.1:{client} cannot be reached")));
    assert!(named && log.contains("trying again"), "{log}");

    // Eight writers; one member is killed a second in.
    let client = server.client().await;
    let maps: Api<ConfigMap> = Api::default_namespaced(client);
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let after_kill = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Until 40 creates went through after the kill (a new etcd leader may take seconds), 30 s at most.
    const AFTER_KILL: usize = 40;
    let deadline = Instant::now() + Duration::from_secs(30);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (maps, acked, after_kill, killed) = (maps.clone(), acked.clone(), after_kill.clone(), killed.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < deadline && after_kill.load(std::sync::atomic::Ordering::SeqCst) < AFTER_KILL {
                    let name = format!("w{w}-{i}");
                    let cm: ConfigMap =
                        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"n": i.to_string()}}))
                            .unwrap();
                    let was_killed = killed.load(std::sync::atomic::Ordering::SeqCst);
                    if maps.create(&PostParams::default(), &cm).await.is_ok() {
                        acked.lock().unwrap().insert(name);
                        if was_killed {
                            after_kill.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first member: the one cairn talks to, unless it already moved on.
    etcd.kill9(0);
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 50, "only {} creates were acknowledged", acked.len());
    let after_kill = after_kill.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        after_kill >= AFTER_KILL,
        "only {after_kill} creates were acknowledged after the member was killed\n{}",
        server.log()
    );
    let listed: BTreeSet<String> =
        maps.list(&ListParams::default()).await.unwrap().iter().map(|c| c.name_any()).collect();
    let lost: Vec<&String> = acked.difference(&listed).collect();
    assert!(lost.is_empty(), "acknowledged but gone: {lost:?}");

    // Where kube-apiserver keeps it, without its resourceVersion.
    let first = acked.iter().next().unwrap();
    let stored = etcd.get(&format!("/registry/configmaps/default/{first}")).await.expect("the object in etcd");
    assert_eq!(stored["metadata"]["name"], first.as_str());
    assert!(stored["metadata"].get("resourceVersion").is_none(), "{stored}");

    // Read back by a new cairn from the two members left.
    let dir = tokio::task::block_in_place(|| server.kill9());
    let server = tokio::task::block_in_place(|| Server::start_with(dir, &["--datastore-endpoint", &etcd.endpoints()]));
    let maps: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let listed: BTreeSet<String> =
        maps.list(&ListParams::default()).await.unwrap().iter().map(|c| c.name_any()).collect();
    assert!(acked.is_subset(&listed), "{} acknowledged, {} listed after the restart", acked.len(), listed.len());
}

/// Kind, name and UID of each object the migrate test makes.
const IDENTITIES: &[&str] = &[
    "get",
    "namespace/shop",
    "-n",
    "shop",
    "configmap/settings",
    "deployment/web",
    "service/web",
    "-o",
    "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.uid} {end}",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datastore_migrate_moves_a_sled_cluster_into_etcd() {
    // A cluster on the embedded store, with objects of several kinds.
    let server = tokio::task::block_in_place(Server::start);
    server.ok(&["create", "namespace", "shop"]);
    server.ok(&["-n", "shop", "create", "configmap", "settings", "--from-literal=colour=blue"]);
    server.ok(&["-n", "shop", "create", "deployment", "web", "--image=busybox", "--replicas=2"]);
    server.ok(&["-n", "shop", "create", "service", "clusterip", "web", "--tcp=80:8080"]);
    let before = server.ok(IDENTITIES);
    let cluster_ip = server.ok(&["-n", "shop", "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let dir = tokio::task::block_in_place(|| server.stop());

    // Copied into a fresh etcd; a second copy refuses to overwrite.
    let etcd = Cluster::start(&Cluster::ports()[..1]);
    let migrate = |to: &str| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["datastore", "migrate", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--to", to])
            .output()
            .unwrap()
    };
    let to = etcd.endpoints().replace("http://", "etcd://");
    let out = common::eventually(20, || {
        let out = migrate(&to);
        out.status.success().then_some(out)
    });
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("copied ") && said.contains("objects from"), "{said}");
    let again = migrate(&to);
    let why = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && why.contains("migrate into an etcd cairn has not used"), "{why}");

    // The same cluster, now on etcd: the same objects with the same UIDs and the same Service address.
    let server = tokio::task::block_in_place(|| Server::start_with(dir, &["--datastore-endpoint", &etcd.endpoints()]));
    let after = server.ok(IDENTITIES);
    assert_eq!(before, after);
    assert_eq!(server.ok(&["-n", "shop", "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]), cluster_ip);
    assert_eq!(server.ok(&["-n", "shop", "get", "configmap", "settings", "-o", "jsonpath={.data.colour}"]), "blue");
    // ... and it takes writes: resourceVersions are etcd's now.
    server.ok(&["-n", "shop", "scale", "deployment", "web", "--replicas=3"]);
    assert!(etcd.get("/registry/configmaps/shop/settings").await.is_some());
}

/// A Ready node the scheduler can bind to (no agent runs it: binding is all this test needs).
const NODE: &str = r#"apiVersion: v1
kind: Node
metadata: {name: n1, labels: {kubernetes.io/hostname: n1}}
status:
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
  allocatable: {cpu: "4", memory: 8Gi, pods: "110"}
  conditions: [{type: Ready, status: "True"}]
"#;

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{containers: [{{name: c, image: busybox}}]}}\n"
    )
}

fn node_of(server: &Server, pod: &str) -> Option<String> {
    let out = server.kubectl(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"]);
    let node = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !node.is_empty()).then_some(node)
}

fn leads(server: &Server) -> bool {
    server.log().contains("successfully acquired lease kube-system/kube-scheduler")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_share_one_cluster_and_hand_over_when_the_leader_dies() {
    let etcd = Cluster::start(&Cluster::ports());
    let endpoints = etcd.endpoints();
    let a = tokio::task::block_in_place(|| {
        Server::start_with(tempfile::tempdir().unwrap(), &["--datastore-endpoint", &endpoints])
    });
    let token = std::fs::read_to_string(a.dir.path().join("data/server/token")).unwrap();

    // Without the first server's token a second one is refused: it cannot open the cluster's keys.
    let refused = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["server", "--disable-agent", "--bind-address", "127.0.0.1", "--https-listen-port", "0"])
        .arg("--data-dir")
        .arg(tempfile::tempdir().unwrap().path())
        .args(["--datastore-endpoint", &endpoints])
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("start this server with --token"), "{why}");

    // The second joins the first: it learns the datastore from it and takes the cluster's keys.
    let b = tokio::task::block_in_place(|| {
        Server::start_with(tempfile::tempdir().unwrap(), &["--server", &a.url, "--token", token.trim()])
    });
    // One CA and one service account key: a token minted through A is good on B.
    let ca = |s: &Server| std::fs::read_to_string(s.dir.path().join("data/server/tls/server-ca.crt")).unwrap();
    assert_eq!(ca(&a), ca(&b));
    let sa_token = a.ok(&["create", "token", "default"]);
    let ca_file = a.dir.path().join("data/server/tls/server-ca.crt");
    let whoami = Command::new(common::kubectl_path())
        .args(["--kubeconfig", "/dev/null", "--server", &b.url, "--token", sa_token.trim()])
        .arg(format!("--certificate-authority={}", ca_file.display()))
        .args(["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&whoami.stdout), "system:serviceaccount:default:default", "{whoami:?}");

    // A pod created through A is seen by a watch on B and bound by whichever server leads.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(b.client().await);
    let mut events = kube::runtime::watcher(pods, kube::runtime::watcher::Config::default()).boxed();
    a.ok_stdin(&["apply", "-f", "-"], NODE);
    a.ok_stdin(&["apply", "-f", "-"], &pod("first"));
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(event)) = events.next().await {
            if let kube::runtime::watcher::Event::Apply(p) | kube::runtime::watcher::Event::InitApply(p) = event
                && p.name_any() == "first"
            {
                return true;
            }
        }
        false
    });
    assert!(seen.await.unwrap_or(false), "B's watch did not deliver the pod created through A");
    assert_eq!(common::eventually(10, || node_of(&b, "first")), "n1");
    let (leader, follower) = match (leads(&a), leads(&b)) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        other => panic!("one server should lead, not {other:?}\n--- A ---\n{}\n--- B ---\n{}", a.log(), b.log()),
    };

    // The leader dies: the other takes over and binds a new pod within 20 s.
    let killed = Instant::now();
    drop(tokio::task::block_in_place(|| leader.kill9()));
    follower.ok_stdin(&["apply", "-f", "-"], &pod("second"));
    assert_eq!(common::eventually(40, || node_of(&follower, "second")), "n1");
    let took = killed.elapsed();
    eprintln!("the survivor bound a new pod {took:?} after the leader was killed");
    assert!(leads(&follower), "{}", follower.log());
    assert!(took <= Duration::from_secs(20), "the new pod was bound {took:?} after the leader died");
    let lease = follower.ok(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        "kube-scheduler",
        "-o",
        "jsonpath={.spec.leaseTransitions}",
    ]);
    assert_eq!(lease, "1");
    drop(etcd);
}

/// Quorum lost while cairn runs: a write is answered 503 or 504 (never acknowledged without
/// quorum), reads still answer from the index, and once the members are back writes go on and
/// nothing acknowledged before is missing; an informer watching throughout (kube-rs's watcher,
/// re-listing whenever its watch ends) sees the write made after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_writes_fail_cleanly_and_resume_when_it_is_back() {
    let mut etcd = Cluster::start(&Cluster::ports());
    let server = tokio::task::block_in_place(|| {
        Server::start_with(tempfile::tempdir().unwrap(), &["--datastore-endpoint", &etcd.endpoints()])
    });
    server.ok(&["create", "configmap", "before", "--from-literal=a=1"]);
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let informer = tokio::spawn(async move {
        let mut events = kube::runtime::watcher(configmaps, kube::runtime::watcher::Config::default()).boxed();
        // Errors (the watch ending while etcd has no quorum) are passed over: the watcher re-lists.
        while let Some(event) = events.next().await {
            if let Ok(kube::runtime::watcher::Event::Apply(c) | kube::runtime::watcher::Event::InitApply(c)) = event {
                let _ = seen_tx.send(c.name_any());
            }
        }
    });
    assert!(saw(&mut seen, "before").await, "the informer never listed the first ConfigMap");
    etcd.kill9(1);
    etcd.kill9(2);
    let started = Instant::now();
    let out = tokio::task::block_in_place(|| server.kubectl(&["create", "configmap", "during", "--from-literal=a=2"]));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "a write without quorum was acknowledged");
    assert!(
        said.contains("the datastore") || said.contains("Timeout") || said.contains("timed out"),
        "after {:?}: {said}",
        started.elapsed()
    );
    let listed = tokio::task::block_in_place(|| server.ok(&["get", "configmap", "before", "-o", "name"]));
    assert_eq!(listed.trim(), "configmap/before", "reads answer from the index");

    etcd.restart(1);
    etcd.restart(2);
    tokio::task::block_in_place(|| {
        common::eventually(60, || {
            server.kubectl(&["create", "configmap", "after", "--from-literal=a=3"]).status.success().then_some(())
        })
    });
    let names = tokio::task::block_in_place(|| server.ok(&["get", "configmaps", "-o", "name"]));
    assert!(names.contains("configmap/before") && names.contains("configmap/after"), "{names}");
    assert!(saw(&mut seen, "after").await, "the informer missed the write made after quorum returned");
    informer.abort();
}

/// Whether `name` comes through `seen` within 30 s.
async fn saw(seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>, name: &str) -> bool {
    let wait = async {
        while let Some(n) = seen.recv().await {
            if n == name {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(30), wait).await.unwrap_or(false)
}
