//! End to end: cairn on etcd (Debian's `etcd-server`, three members on loopback).
//!
//! - etcd not there yet at start: cairn says which endpoint it cannot reach, keeps trying, and comes
//!   up once it answers;
//! - eight concurrent writers while the member cairn talks to is killed with SIGKILL: cairn moves on
//!   to another and writes go on (40 more acknowledged within 30 s), and every acknowledged create is there afterwards, through cairn and
//!   read back after cairn's own restart;
//! - the objects are where kube-apiserver keeps them (`/registry/<resource>/<namespace>/<name>`),
//!   without a resourceVersion in the value.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    fn ports() -> Vec<(u16, u16)> {
        (0..3).map(|_| (free_port(), free_port())).collect()
    }

    /// Starts the members (the first `delay` later, in the background, when given).
    fn start(ports: &[(u16, u16)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let peers: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}")).collect();
        let clients = ports.iter().map(|(client, _)| format!("http://127.0.0.1:{client}")).collect();
        let mut cluster = Cluster { members: Vec::new(), clients, dir };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let (client_url, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
            let log = std::fs::File::create(cluster.dir.path().join(format!("m{i}.log"))).unwrap();
            let child = Command::new(std::env::var_os("ETCD").unwrap_or_else(|| "/usr/bin/etcd".into()))
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(cluster.dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &peers.join(","), "--initial-cluster-state", "new"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("etcd-server is needed (/usr/bin/etcd, or $ETCD)");
            cluster.members.push(Some(child));
        }
        cluster
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
        let mut client = etcd_client::Client::connect(&self.clients[2..], None).await.ok()?;
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
