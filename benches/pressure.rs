//! When room runs out: `cargo bench --bench pressure` (root, containerd, runc and busybox-static
//! needed).
//!
//! In one run, against one `cairn server` with its agent: a pod of a high PriorityClass asking
//! for 60% of the node's CPU, created → Running through a watch, on a node where a low-priority
//! pod holds that CPU (the scheduler preempts it; it stops at once on SIGTERM), against the same
//! pod on the free node, alternated so that both see the same machine.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-pressure.json`.
//! Environment: `CAIRN_BENCH_RUNS` [20] samples of each; `CAIRN_BENCH_BIN`, another cairn binary.

#[path = "common/binary.rs"]
mod binary;
#[path = "../tests/common/busybox.rs"]
mod busybox;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use busybox::BUSYBOX;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, PostParams};
use node::{Cairn, delete_and_wait, start_up};
use serde_json::{Value, json};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms.get(((ms.len().max(1) - 1) as f64 * p / 100.0).round() as usize).copied();
    json!({"n": ms.len(), "p50_ms": pct(50.0), "p99_ms": pct(99.0), "max_ms": ms.last().copied()})
}

/// A busybox pod of `class` asking for `milli_cpu`, which exits at once on SIGTERM.
fn pod(name: &str, class: &str, milli_cpu: i64) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "pressure"}},
        "spec": {"priorityClassName": class, "terminationGracePeriodSeconds": 10, "containers": [{
            "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait; done"],
            "resources": {"requests": {"cpu": format!("{milli_cpu}m")}}}]}
    }))?)
}

fn milli_cpu(node: &Node) -> Option<i64> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get("cpu")?.0.clone();
    match q.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => q.parse::<i64>().ok().map(|c| c * 1000),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let runs = env_or("CAIRN_BENCH_RUNS", 20);
    let cairn = Cairn::start("10.45.0.0/16")?;
    let client = cairn.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let classes: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [("background", 10), ("important", 1000)] {
        let class = serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))?;
        classes.create(&PostParams::default(), &class).await?;
    }
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await?;
    let cpu = nodes.items.first().and_then(milli_cpu).context("the node has no allocatable CPU")? * 6 / 10;
    // Let start-up settle (first heartbeat) before measuring.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let (mut free, mut preempting) = (vec![], vec![]);
    for i in 0..runs {
        let name = format!("free-{i}");
        free.push(start_up(&pods, pod(&name, "important", cpu)?).await?);
        delete_and_wait(&pods, &name).await?;
        let victim = format!("victim-{i}");
        start_up(&pods, pod(&victim, "background", cpu)?).await?;
        let name = format!("preempting-{i}");
        preempting.push(start_up(&pods, pod(&name, "important", cpu)?).await?);
        delete_and_wait(&pods, &name).await?;
    }
    let (free, preempting) = (summary(free), summary(preempting));
    let ratio = |k: &str| preempting[k].as_f64().unwrap_or(f64::NAN) / free[k].as_f64().unwrap_or(f64::NAN);
    let (ratio_p50, ratio_p99) = (ratio("p50_ms"), ratio("p99_ms"));
    println!("high-priority pod on a free node -> Running: {free}");
    println!(
        "high-priority pod preempting a low-priority one -> Running: {preempting} ({ratio_p50:.2}x p50, {ratio_p99:.2}x p99)"
    );

    let report = json!({
        "pod_on_free_node_to_running": free,
        "pod_preempting_to_running": preempting,
        "preempting_vs_free": {"p50": ratio_p50, "p99": ratio_p99},
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-pressure.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
