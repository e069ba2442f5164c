//! Node agent benchmark: `cargo bench --bench agent` (root, containerd, runc and busybox-static
//! needed).
//!
//! In one run, against one `cairn server` with its agent:
//! 1. Pod start-up latency as upstream's SLO defines it, from the create request to `Running`
//!    observed through a watch: one pod at a time, 10 at once and 100 at once (p50, p99, and the
//!    time until all 100 run).
//! 2. The raw CRI floor in the same run: `cairn bench cri` (RunPodSandbox + CreateContainer +
//!    StartContainer by a direct client) against the same containerd, one at a time, 10 at once
//!    and 100 at once.
//! 3. Idle RSS of the cairn process (containerd excluded) with 0 and with 50 pods.
//! 4. Bytes cairn writes to disk at idle (`/proc/<pid>/io` write_bytes over a quiet window), with
//!    0 and with 50 pods, extrapolated to an hour; containerd's for comparison.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-agent.json`.
//! Environment: `CAIRN_BENCH_SINGLE` [20] single-pod samples, `CAIRN_BENCH_IDLE_SECS` [120];
//! `CAIRN_BENCH_BIN`, another cairn binary to measure.

#[path = "common/binary.rs"]
mod binary;
#[path = "../tests/common/busybox.rs"]
mod busybox;
#[path = "common/cri_floor.rs"]
mod cri_floor;
#[path = "common/figures.rs"]
mod figures;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;
#[path = "common/proc.rs"]
mod proc;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use busybox::BUSYBOX;
use cri_floor::bench_cri;
use figures::{env_or, summary};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use node::Cairn;
use serde_json::json;

fn write_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "agent"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent", "command": ["/bin/sleep", "3600"]}]}
    }))?)
}

/// Creates `names` at once and returns each pod's create-to-Running latency (ms), Running observed
/// through a watch opened before the creates.
async fn start_pods(pods: &Api<Pod>, names: &[String]) -> Result<Vec<f64>> {
    let version = pods.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
    let mut watch = pods.watch(&WatchParams::default().labels("bench=agent").timeout(290), &version).await?.boxed();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let creates = futures::future::try_join_all(names.iter().map(|n| async move {
        let at = Instant::now();
        pods.create(&PostParams::default(), &pod(n)?).await?;
        anyhow::Ok((n.clone(), at))
    }))
    .await?;
    created.extend(creates);
    let mut latencies = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(280);
    while latencies.len() < names.len() {
        let event = tokio::time::timeout_at(deadline, watch.try_next()).await.context("pods did not all run")??;
        let Some(WatchEvent::Added(p) | WatchEvent::Modified(p)) = event else { continue };
        let name = p.metadata.name.clone().unwrap_or_default();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if let (true, Some(at)) = (running, created.get(&name))
            && !latencies.contains_key(&name)
        {
            latencies.insert(name, at.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(latencies.into_values().collect())
}

async fn delete_all(pods: &Api<Pod>) -> Result<()> {
    pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("bench=agent")).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    while !pods.list(&ListParams::default().labels("bench=agent")).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("pods were not deleted within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Bytes `pid` writes to disk over `secs` of idling, per hour, and the bytes of each 10 s step (so
/// a burst shows apart from a steady rate).
async fn idle_writes_per_hour(pid: u32, secs: u64) -> (f64, Vec<u64>) {
    let before = write_bytes(pid);
    let mut steps = vec![];
    let mut last = before;
    for _ in 0..secs.div_ceil(10) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = write_bytes(pid);
        steps.push(now.saturating_sub(last));
        last = now;
    }
    (last.saturating_sub(before) as f64 * 3600.0 / (steps.len() as f64 * 10.0), steps)
}

#[tokio::main]
async fn main() -> Result<()> {
    let singles = env_or("CAIRN_BENCH_SINGLE", 20);
    let idle_secs = env_or("CAIRN_BENCH_IDLE_SECS", 120) as u64;
    let cairn = Cairn::start("10.48.0.0/16")?;
    let pid = cairn.child.id();
    let client = cairn.client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    // Let start-up settle (first heartbeat, node registration) before measuring.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut report = json!({});

    let rss_0 = proc::rss(pid);
    let (writes_0, steps_0) = idle_writes_per_hour(pid, idle_secs).await;
    let containerd_writes_0 = cairn.containerd_pid().map(write_bytes);
    println!("idle, 0 pods: RSS {rss_0}, writes {:.2} MiB/h", writes_0 / 1048576.0);

    // Raw CRI floor, then the agent path, one pod at a time.
    let floor = bench_cri(|a| cairn.cairn(a), BUSYBOX, singles, 10)?;
    println!("raw CRI floor: {}", serde_json::to_string(&floor)?);
    let mut single = vec![];
    for i in 0..singles {
        single.extend(start_pods(&pods, &[format!("single-{i}")]).await?);
    }
    let single = summary(single);
    println!("agent, 1 pod at a time: {single}");
    delete_all(&pods).await?;

    let mut ten = vec![];
    for round in 0..2 {
        let names: Vec<String> = (0..10).map(|i| format!("ten-{round}-{i}")).collect();
        ten.extend(start_pods(&pods, &names).await?);
        delete_all(&pods).await?;
    }
    let ten = summary(ten);
    println!("agent, 10 at once: {ten}");

    // The floor for 100 at once: its "100 in parallel" total p99 is when the last one ran.
    let floor_100 = bench_cri(|a| cairn.cairn(a), BUSYBOX, 100, 100)?;
    println!("raw CRI floor, 100: {}", serde_json::to_string(&floor_100)?);
    let started = Instant::now();
    let names: Vec<String> = (0..100).map(|i| format!("hundred-{i}")).collect();
    let hundred = start_pods(&pods, &names).await?;
    let all_running_s = started.elapsed().as_secs_f64();
    let hundred = summary(hundred);
    println!("agent, 100 at once: {hundred}, all Running after {all_running_s:.1} s");
    delete_all(&pods).await?;

    let names: Vec<String> = (0..50).map(|i| format!("fifty-{i}")).collect();
    start_pods(&pods, &names).await?;
    // Let the store settle after the churn of the runs above (sled compacts what they deleted).
    tokio::time::sleep(Duration::from_secs(60)).await;
    let rss_50 = proc::rss(pid);
    let (writes_50, steps_50) = idle_writes_per_hour(pid, idle_secs).await;
    println!("idle, 50 pods: RSS {rss_50}, writes {:.2} MiB/h", writes_50 / 1048576.0);
    println!("idle writes per 10 s, 0 pods: {steps_0:?}; 50 pods: {steps_50:?}");
    delete_all(&pods).await?;

    report["raw_cri_floor"] = json!(floor);
    report["raw_cri_floor_100"] = json!(floor_100);
    report["agent_single"] = single;
    report["agent_10_at_once"] = ten;
    report["agent_100_at_once"] = hundred;
    report["agent_100_all_running_s"] = json!(all_running_s);
    let mib = |kib: u64| kib as f64 / 1024.0;
    report["idle_rss_mib"] = json!({"pods_0": mib(rss_0.total), "pods_50": mib(rss_50.total)});
    report["idle_rss_parts_mib"] = json!({
        "pods_0": {"anon": mib(rss_0.anon), "file": mib(rss_0.file)},
        "pods_50": {"anon": mib(rss_50.anon), "file": mib(rss_50.file)},
    });
    report["idle_writes_mib_per_hour"] = json!({"pods_0": writes_0 / 1048576.0, "pods_50": writes_50 / 1048576.0,
        "idle_window_s": idle_secs, "bytes_per_10s_pods_0": steps_0, "bytes_per_10s_pods_50": steps_50, "containerd_total_written_mib": containerd_writes_0.map(|b| b as f64 / 1048576.0)});
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-agent.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
