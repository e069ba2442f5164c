//! The real server on loopback, from a fixed record set (no API), asked over UDP and TCP, with a real
//! `dnsmasq` on loopback as its upstream answering from a hosts file. Needs `dnsmasq`
//! (Debian `dnsmasq-base`).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_server::proto::op::{Message, ResponseCode};
use hickory_server::proto::rr::{Name, RData, RecordType};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::forward::{exchange_tcp, exchange_udp, query_message};
use super::records::SERVICE_NAME_LABEL;
use super::records::tests::{fixture_with, slice, svc};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A dnsmasq on 127.0.0.1 answering from a hosts file; killed on drop.
pub(crate) struct Dnsmasq {
    child: Child,
    pub addr: SocketAddr,
}

impl Dnsmasq {
    /// Starts dnsmasq with `hosts` and waits (bounded) until it answers `probe`.
    pub(crate) async fn start(dir: &Path, hosts: &str, probe: &str) -> Dnsmasq {
        let file = dir.join("hosts");
        std::fs::write(&file, hosts).expect("writing the hosts file");
        // A free port: bound, learnt and released (dnsmasq binds it a moment later).
        let port = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("free port").port();
        let child = Command::new("dnsmasq")
            .args(["--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1"])
            .arg(format!("--addn-hosts={}", file.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .arg("--cache-size=1000")
            // Hosts-file answers carry TTL 0 otherwise, which nothing caches.
            .arg("--local-ttl=60")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq is needed for this test (Debian: apt-get install dnsmasq-base)");
        let d = Dnsmasq { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) };
        let name = Name::from_str(probe).expect("probe name");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reply = exchange_udp(d.addr, &query_message(&name, RecordType::A), Duration::from_millis(200)).await;
            if reply.is_ok_and(|r| !r.answers.is_empty()) {
                return d;
            }
            assert!(Instant::now() < deadline, "dnsmasq did not answer on {} within 10 s", d.addr);
        }
    }

    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

fn big_headless(
    n: u8,
) -> (Vec<k8s_openapi::api::core::v1::Service>, Vec<k8s_openapi::api::discovery::v1::EndpointSlice>) {
    let endpoints: Vec<_> = (1..=n).map(|i| json!({"addresses": [format!("10.42.9.{i}")]})).collect();
    (
        vec![svc(json!({"metadata": {"name": "big", "namespace": "default"}, "spec": {"clusterIP": "None"}}))],
        vec![slice(
            json!({"metadata": {"name": "big-x", "namespace": "default", "labels": {SERVICE_NAME_LABEL: "big"}},
            "addressType": "IPv4", "endpoints": endpoints}),
        )],
    )
}

async fn ask(server: SocketAddr, tcp: bool, name: &str, qtype: RecordType) -> Message {
    let msg = query_message(&Name::from_str(name).expect("name"), qtype);
    let reply = if tcp { exchange_tcp(server, &msg, TIMEOUT).await } else { exchange_udp(server, &msg, TIMEOUT).await };
    reply.unwrap_or_else(|e| panic!("{name} {qtype} over {}: {e}", if tcp { "TCP" } else { "UDP" }))
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_udp_and_tcp_and_forwards_to_dnsmasq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut upstream =
        Dnsmasq::start(dir.path(), "192.0.2.10 db.example.org\n192.0.2.11 www.example.test\n", "www.example.test.")
            .await;

    let (services, slices) = big_headless(100);
    let snapshot = Arc::new(ArcSwap::from_pointee(fixture_with(services, slices)));
    let mut cfg = Config::new(vec!["127.0.0.1:0".parse().expect("addr")], DEFAULT_DOMAIN);
    cfg.upstreams = vec![upstream.addr];
    let listeners = server::Listeners::bind(&cfg.listen).await.expect("bind");
    let addr = listeners.local_addrs()[0];
    let shutdown = CancellationToken::new();
    let served = tokio::spawn({
        let (cfg, snapshot, shutdown) = (cfg.clone(), snapshot.clone(), shutdown.clone());
        async move { serve(listeners, &cfg, snapshot, shutdown).await }
    });

    for tcp in [false, true] {
        let m = ask(addr, tcp, "web.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert_eq!(addresses(&m), ["10.43.0.20".parse::<IpAddr>().expect("ip")]);
        assert_eq!(m.answers[0].ttl, records::TTL);

        let m = ask(addr, tcp, "nope.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.authorities.first().map(|r| r.record_type()), Some(RecordType::SOA));

        let m = ask(addr, tcp, "web.default.svc.cluster.local.", RecordType::AAAA).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty());
        assert_eq!(m.authorities.first().map(|r| r.record_type()), Some(RecordType::SOA));

        let m = ask(addr, tcp, "_pg._tcp.db.data.svc.cluster.local.", RecordType::SRV).await;
        assert_eq!(m.answers.len(), 2);
        assert_eq!(m.additionals.len(), 2);

        let m = ask(addr, tcp, "20.0.43.10.in-addr.arpa.", RecordType::PTR).await;
        assert_eq!(m.answers[0].data.to_string(), "web.default.svc.cluster.local.");

        // Outside names go to dnsmasq.
        let m = ask(addr, tcp, "www.example.test.", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(!m.metadata.authoritative);
        assert_eq!(addresses(&m), ["192.0.2.11".parse::<IpAddr>().expect("ip")]);

        // An ExternalName: the CNAME, then its target's address from dnsmasq.
        let m = ask(addr, tcp, "ext.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(m.answers[0].record_type(), RecordType::CNAME);
        assert_eq!(m.answers[0].data.to_string(), "db.example.org.");
        assert_eq!(addresses(&m), ["192.0.2.10".parse::<IpAddr>().expect("ip")]);
    }

    // 100 endpoints do not fit 512 bytes of plain UDP: truncated; TCP carries them all.
    let m = ask(addr, false, "big.default.svc.cluster.local.", RecordType::A).await;
    assert!(m.metadata.truncation, "a large answer over UDP is truncated");
    let m = ask(addr, true, "big.default.svc.cluster.local.", RecordType::A).await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 100);

    // Garbage and a query without a question are survived, and the next query is answered.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    sock.send_to(&[0xde, 0xad, 0xbe], addr).await.expect("send");
    sock.send_to(&[0u8; 12], addr).await.expect("send");
    sock.send_to(&[0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff, 0xff], addr).await.expect("send");
    let m = ask(addr, false, "web.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&m).len(), 1);

    // A new snapshot is answered from at once.
    snapshot.store(Arc::new(records::RecordSet::empty(DEFAULT_DOMAIN).expect("empty")));
    let m = ask(addr, false, "web.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    // Upstream answers are cached: dnsmasq gone, the name still resolves; a new one fails.
    upstream.stop();
    let m = ask(addr, false, "www.example.test.", RecordType::A).await;
    assert_eq!(addresses(&m), ["192.0.2.11".parse::<IpAddr>().expect("ip")]);
    let m = ask(addr, false, "other.example.test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the server stops on shutdown")
        .expect("server task")
        .expect("server result");
}
