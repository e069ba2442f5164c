//! Scheduler benchmark of cairn in the style of upstream's scheduler_perf:
//! `cargo bench --bench scheduler`.
//!
//! For each scenario a fresh release `cairn server` gets N fake Node objects (32 CPU, 256 GiB,
//! 110 pods, 16 `nvidia.com/gpu`) through the API, then M pending pods (100m CPU, 128 MiB; in
//! `gpu` scenarios also one GPU) are created by 64 concurrent clients while a watch notes when each
//! pod is bound (the binding is a durable write). Reported: pods/s from the first create to the last
//! binding, the creation rate alone for comparison, p50/p99 of create→bound latency, and the
//! server's memory per node (RSS growth from adding the nodes). A `held` scenario times scheduling
//! alone: its nodes start cordoned, every pod is created and found unschedulable, then all nodes are
//! uncordoned and the clock (and latency) runs from there. Nothing is asserted; figures go to stdout
//! and `target/bench-scheduler.json`.
//!
//! Environment: `CAIRN_BENCH_SCENARIOS`
//! [`100x5000,1000x10000,5000x10000,1000x10000gpu,1000x10000held,5000x10000held`];
//! `CAIRN_BENCH_CLIENTS` [64]; `CAIRN_BENCH_TIMEOUT_SECS` [180] per scenario; `CAIRN_BENCH_BIN`, another
//! cairn binary to measure.

#[path = "common/api_server.rs"]
mod api_server;
#[path = "common/binary.rs"]
mod binary;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use api_server::Cairn;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

struct Scenario {
    nodes: usize,
    pods: usize,
    gpu: bool,
    /// Nodes start cordoned: every pod is created and found unschedulable first, then all nodes are
    /// uncordoned and the clock runs from there, so only scheduling and binding are timed.
    held: bool,
}

impl Scenario {
    fn parse(s: &str) -> Result<Self> {
        let held = s.ends_with("held");
        let s = s.trim_end_matches("held");
        let gpu = s.ends_with("gpu");
        let (n, p) =
            s.trim_end_matches("gpu").split_once('x').context("scenario must look like 1000x10000[gpu][held]")?;
        Ok(Scenario { nodes: n.parse()?, pods: p.parse()?, gpu, held })
    }

    fn label(&self) -> String {
        let gpu = if self.gpu { " (GPU)" } else { "" };
        let held = if self.held { ", scheduling only" } else { "" };
        format!("{} nodes / {} pods{gpu}{held}", self.nodes, self.pods)
    }
}

struct Outcome {
    label: String,
    bound: usize,
    pods: usize,
    total: Duration,
    create: Duration,
    p50: Duration,
    p99: Duration,
    kib_per_node: f64,
}

fn node(i: usize, cordoned: bool) -> Node {
    let resources = json!({"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "16"});
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i}"), "labels": {"kubernetes.io/hostname": format!("node-{i}"), "zone": format!("z{}", i % 3)}},
        "spec": {"unschedulable": cordoned},
        "status": {"capacity": resources, "allocatable": resources, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

fn pod(i: usize, gpu: bool) -> Pod {
    let mut requests = json!({"cpu": "100m", "memory": "128Mi"});
    let mut limits = json!({});
    if gpu {
        requests["nvidia.com/gpu"] = json!("1");
        limits["nvidia.com/gpu"] = json!("1");
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i}")},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": requests, "limits": limits}}]}
    }))
    .unwrap_or_default()
}

async fn run_scenario(sc: &Scenario, clients: usize, timeout: Duration) -> Result<Outcome> {
    let cairn = Cairn::start().await?;
    let client = cairn.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = cairn.rss_kib()?;
    eprintln!("  creating {} nodes", sc.nodes);
    futures::stream::iter(0..sc.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            async move { nodes.create(&PostParams::default(), &node(i, sc.held)).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kib_per_node = (cairn.rss_kib()?.saturating_sub(rss_before)) as f64 / sc.nodes as f64;

    // Note the bind time of every pod, from a watch of bound pods opened before the first create.
    // Should the watch fall behind (410), a list catches up and the watch resumes from it.
    let bound_only = ListParams::default().fields("spec.nodeName!=");
    let rv = pods.list(&bound_only).await?.metadata.resource_version.unwrap_or_default();
    let bound: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watcher = {
        let bound = bound.clone();
        let pods = pods.clone();
        tokio::spawn(async move {
            let note = |p: &Pod| {
                let name = p.metadata.name.clone().unwrap_or_default();
                bound.lock().unwrap_or_else(|e| e.into_inner()).entry(name).or_insert_with(Instant::now);
            };
            api_server::follow_pods(pods, "spec.nodeName!=", "", rv, note).await;
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    eprintln!("  creating {} pods with {clients} clients", sc.pods);
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    futures::stream::iter(0..sc.pods)
        .map(|i| {
            let (pods, sent) = (pods.clone(), sent.clone());
            async move {
                sent.lock().unwrap_or_else(|e| e.into_inner()).insert(format!("pod-{i}"), Instant::now());
                pods.create(&PostParams::default(), &pod(i, sc.gpu)).await
            }
        })
        .buffer_unordered(clients)
        .try_collect::<Vec<_>>()
        .await?;
    let create = start.elapsed();
    let start = if sc.held { release(&pods, &nodes, sc, timeout).await? } else { start };
    let deadline = start + timeout;
    loop {
        let n = bound.lock().unwrap_or_else(|e| e.into_inner()).len();
        if n >= sc.pods || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watcher.abort();
    let bound = bound.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut latencies: Vec<Duration> = bound
        .iter()
        .filter_map(|(name, t)| sent.get(name).map(|s| t.saturating_duration_since((*s).max(start))))
        .collect();
    latencies.sort_unstable();
    let last = bound.values().max().copied().unwrap_or(start);
    let pct =
        |q: f64| latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1))).copied();
    Ok(Outcome {
        label: sc.label(),
        bound: bound.len(),
        pods: sc.pods,
        total: last.saturating_duration_since(start),
        create,
        p50: pct(0.5).unwrap_or_default(),
        p99: pct(0.99).unwrap_or_default(),
        kib_per_node,
    })
}

/// Waits until every pod was found unschedulable, then uncordons all nodes; returns when that began.
async fn release(pods: &Api<Pod>, nodes: &Api<Node>, sc: &Scenario, timeout: Duration) -> Result<Instant> {
    eprintln!("  waiting for {} pods to be found unschedulable", sc.pods);
    let deadline = Instant::now() + timeout;
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let rejected = list
            .items
            .iter()
            .filter(|p| {
                let conds = p.status.as_ref().and_then(|s| s.conditions.as_ref());
                conds
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            })
            .count();
        if rejected >= sc.pods {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {rejected} of {} pods were found unschedulable", sc.pods);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("  uncordoning {} nodes", sc.nodes);
    let start = Instant::now();
    let patch = kube::api::Patch::Merge(json!({"spec": {"unschedulable": false}}));
    futures::stream::iter(0..sc.nodes)
        .map(|i| {
            let (nodes, patch) = (nodes.clone(), &patch);
            async move { nodes.patch(&format!("node-{i}"), &Default::default(), patch).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(start)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn main() -> Result<()> {
    let scenarios: Vec<Scenario> = std::env::var("CAIRN_BENCH_SCENARIOS")
        .unwrap_or_else(|_| "100x5000,1000x10000,5000x10000,1000x10000gpu,1000x10000held,5000x10000held".into())
        .split(',')
        .map(Scenario::parse)
        .collect::<Result<_>>()?;
    let clients = std::env::var("CAIRN_BENCH_CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let timeout =
        Duration::from_secs(std::env::var("CAIRN_BENCH_TIMEOUT_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(180));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut outcomes = Vec::new();
    for sc in &scenarios {
        eprintln!("scenario: {}", sc.label());
        outcomes.push(runtime.block_on(run_scenario(sc, clients, timeout))?);
    }
    println!("\n| scenario | bound | pods/s (create→last bound) | create-only pods/s | p50 | p99 | KiB/node |");
    println!("|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for o in &outcomes {
        let rate = o.bound as f64 / o.total.as_secs_f64().max(1e-9);
        let create_rate = o.pods as f64 / o.create.as_secs_f64().max(1e-9);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {} | {}/{} | {rate:.0} | {create_rate:.0} | {:.0} ms | {:.0} ms | {:.1} |",
            o.label,
            o.bound,
            o.pods,
            ms(o.p50),
            ms(o.p99),
            o.kib_per_node
        );
        json.push(json!({"scenario": o.label, "bound": o.bound, "pods": o.pods, "pods_per_sec": rate,
            "create_only_pods_per_sec": create_rate, "p50_ms": ms(o.p50), "p99_ms": ms(o.p99), "kib_per_node": o.kib_per_node}));
    }
    let out = target_dir().join("bench-scheduler.json");
    std::fs::create_dir_all(target_dir())?;
    std::fs::write(&out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("\nJSON: {}", out.display());
    Ok(())
}
