//! Cluster DNS benchmark: `cargo bench --bench dns` (needs `dnsmasq`, Debian `dnsmasq-base`).
//!
//! In one run, the same service names (`svc-<i>.bench.svc.cluster.local`, A) asked of:
//! 1. cairn's DNS server (`dns::serve` on loopback, from a record set of the Services), and
//! 2. `dnsmasq` answering them from a hosts file on loopback,
//!
//! by N concurrent UDP clients (one socket each, one query in flight each) for a bounded time.
//! Prints queries/s, p50 and p99 latency for each, and cairn's ratios to dnsmasq. Nothing is asserted.
//! Environment: `CAIRN_BENCH_DNS_CLIENTS` [16], `CAIRN_BENCH_DNS_SECS` [5], `CAIRN_BENCH_DNS_SERVICES` [1000].

// Compiled with cfg(test) here, without a test harness: its tests' helpers go unused.
#[allow(dead_code, unused_imports)]
#[path = "../src/dns/mod.rs"]
mod dns;
#[path = "common/figures.rs"]
mod figures;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use arc_swap::ArcSwap;
use figures::env_or;
use hickory_server::proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::Service;
use serde_json::json;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

fn ip(i: usize) -> String {
    format!("10.43.{}.{}", 1 + i / 250, 1 + i % 250)
}

fn name(i: usize) -> String {
    format!("svc-{i}.bench.svc.cluster.local")
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p / 100.0).round() as usize]
}

struct Figures {
    qps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

/// `clients` clients asking `queries` round-robin of `server` for `secs` seconds.
async fn load(server: SocketAddr, queries: Arc<Vec<Vec<u8>>>, clients: usize, secs: u64) -> Result<Figures> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let queries = queries.clone();
        tasks.push(tokio::spawn(async move {
            let sock = UdpSocket::bind("127.0.0.1:0").await?;
            sock.connect(server).await?;
            let mut buf = vec![0u8; 4096];
            let (mut lat, mut errors, mut i) = (Vec::new(), 0usize, c);
            while Instant::now() < deadline {
                let mut q = queries[i % queries.len()].clone();
                let id = (i as u16).to_be_bytes();
                q[0..2].copy_from_slice(&id);
                i += clients;
                let start = Instant::now();
                sock.send(&q).await?;
                match tokio::time::timeout(Duration::from_secs(1), async {
                    loop {
                        let n = sock.recv(&mut buf).await?;
                        if n >= 12 && buf[0..2] == id {
                            return Ok::<usize, std::io::Error>(n);
                        }
                    }
                })
                .await
                {
                    // An answer with at least one record (ANCOUNT > 0).
                    Ok(Ok(n)) if n >= 12 && (buf[6] != 0 || buf[7] != 0) => {
                        lat.push(start.elapsed().as_secs_f64() * 1e3)
                    }
                    _ => errors += 1,
                }
            }
            Ok::<_, std::io::Error>((lat, errors))
        }));
    }
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        let (lat, e) = t.await??;
        all.extend(lat);
        errors += e;
    }
    all.sort_by(f64::total_cmp);
    Ok(Figures { qps: all.len() as f64 / secs as f64, p50_ms: pct(&all, 50.0), p99_ms: pct(&all, 99.0), errors })
}

async fn wait_answers(server: SocketAddr, query: &[u8]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let sock = UdpSocket::bind("127.0.0.1:0").await?;
    let mut buf = vec![0u8; 4096];
    while Instant::now() < deadline {
        sock.send_to(query, server).await?;
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), sock.recv(&mut buf)).await
            && n >= 12
            && (buf[6] != 0 || buf[7] != 0)
        {
            return Ok(());
        }
    }
    bail!("{server} did not answer within 10 s")
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:<10} {:>10.0} q/s   p50 {:>7.3} ms   p99 {:>7.3} ms   errors {}",
        f.qps, f.p50_ms, f.p99_ms, f.errors
    );
}

fn main() -> Result<()> {
    let clients = env_or("CAIRN_BENCH_DNS_CLIENTS", 16);
    let secs = env_or("CAIRN_BENCH_DNS_SECS", 5) as u64;
    let n = env_or("CAIRN_BENCH_DNS_SERVICES", 1000).clamp(1, 60_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let services: Vec<Service> = (0..n)
            .map(|i| {
                serde_json::from_value(json!({"metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
                    "spec": {"clusterIP": ip(i), "ports": [{"name": "http", "port": 80}]}}))
            })
            .collect::<Result<_, _>>()?;
        let set = dns::records::RecordSet::build("cluster.local", 1, [], &services, [])?;
        let snapshot = Arc::new(ArcSwap::from_pointee(set));
        let mut cfg = dns::Config::new(vec!["127.0.0.1:0".parse()?], "cluster.local");
        cfg.upstreams = Vec::new();
        let listeners = dns::server::Listeners::bind(&cfg.listen).await?;
        let cairn = listeners.local_addrs()[0];
        let shutdown = CancellationToken::new();
        let served = tokio::spawn({
            let (cfg, snapshot, shutdown) = (cfg.clone(), snapshot.clone(), shutdown.clone());
            async move { dns::serve(listeners, &cfg, snapshot, shutdown).await }
        });

        let dir = tempfile::tempdir()?;
        let hosts: String = (0..n).map(|i| format!("{} {}\n", ip(i), name(i))).collect();
        std::fs::write(dir.path().join("hosts"), hosts)?;
        let port = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let _dnsmasq = Killed(
            Command::new("dnsmasq")
                .args(["--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1"])
                .arg(format!("--addn-hosts={}", dir.path().join("hosts").display()))
                .arg(format!("--port={port}"))
                .arg(format!("--pid-file={}", dir.path().join("pid").display()))
                .arg("--local-ttl=5")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting dnsmasq (Debian: apt-get install dnsmasq-base)")?,
        );
        let dnsmasq: SocketAddr = ([127, 0, 0, 1], port).into();

        let queries: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let name = Name::from_ascii(format!("{}.", name(i)))?;
                Ok(dns::forward::query_message(&name, RecordType::A).to_vec()?)
            })
            .collect::<Result<_>>()?;
        let queries = Arc::new(queries);
        wait_answers(cairn, &queries[0]).await?;
        wait_answers(dnsmasq, &queries[0]).await?;

        println!("cluster DNS: {n} services, {clients} concurrent UDP clients, {secs} s each, A queries");
        // A short warm-up for both, then the measured runs.
        load(cairn, queries.clone(), clients, 1).await?;
        load(dnsmasq, queries.clone(), clients, 1).await?;
        let c = load(cairn, queries.clone(), clients, secs).await?;
        let d = load(dnsmasq, queries.clone(), clients, secs).await?;
        print("cairn", &c);
        print("dnsmasq", &d);
        println!(
            "ratio cairn/dnsmasq: {:.2}x queries/s, {:.2}x p50, {:.2}x p99",
            c.qps / d.qps,
            c.p50_ms / d.p50_ms,
            c.p99_ms / d.p99_ms
        );
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
        Ok(())
    })
}
