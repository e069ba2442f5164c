//! When room runs out: `cargo bench --bench pressure` (root, containerd, runc and busybox-static
//! needed).
//!
//! In one run, against one `cairn server` with its agent: a pod of a high PriorityClass asking
//! for 60% of the node's CPU, created → Running through a watch, on a node where a low-priority
//! pod holds that CPU (the scheduler preempts it; it stops at once on SIGTERM), against the same
//! pod on the free node, alternated so that both see the same machine.
//!
//! Then the cost of watching for pressure at idle: the CPU time cairn and its containerd use per
//! minute on a node running `CAIRN_BENCH_IDLE_PODS` sleeping pods, with the eviction manager and
//! image GC as they come (a round per 10 s stats reading; images looked at every 5 minutes) against
//! the same node with both off (`--eviction-hard=`, `--local-storage-capacity-isolation=false` and
//! an image GC period of a year), in alternating windows of `CAIRN_BENCH_IDLE_SECS` on fresh nodes.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-pressure.json`.
//! Environment: `CAIRN_BENCH_RUNS` [20] samples of each; `CAIRN_BENCH_IDLE_PODS` [10];
//! `CAIRN_BENCH_IDLE_SECS` [60]; `CAIRN_BENCH_IDLE_ROUNDS` [2] windows of each;
//! `CAIRN_BENCH_BIN`, another cairn binary.

#[path = "common/binary.rs"]
mod binary;
#[path = "../tests/common/busybox.rs"]
mod busybox;
#[path = "common/figures.rs"]
mod figures;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;
#[path = "common/proc.rs"]
mod proc;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use busybox::BUSYBOX;
use figures::{env_or, summary};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, PostParams};
use node::{Cairn, delete_and_wait, start_up};
use serde_json::json;

/// A busybox pod of `class` (none when empty) asking for `milli_cpu`, which exits at once on SIGTERM.
fn pod(name: &str, class: &str, milli_cpu: i64) -> Result<Pod> {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "pressure"}},
        "spec": {"priorityClassName": class, "terminationGracePeriodSeconds": 10, "containers": [{
            "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait; done"],
            "resources": {"requests": {"cpu": format!("{milli_cpu}m")}}}]}
    }))?;
    if let Some(spec) = pod.spec.as_mut().filter(|_| class.is_empty()) {
        spec.priority_class_name = None;
    }
    Ok(pod)
}

/// The CPU time (seconds per minute) a fresh node started with `flags` and running `pods` sleeping
/// pods uses, cairn and its containerd together, over `secs` once they settled.
async fn idle_cpu_per_minute(flags: &[String], pods: usize, secs: usize) -> Result<f64> {
    let cairn = Cairn::start_with("10.45.0.0/16", flags)?;
    let client = cairn.client().await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..pods {
        start_up(&api, pod(&format!("idle-{i}"), "", 10)?).await?;
    }
    // Past start-up, and past a stats reading with every pod in it.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let pids = [Some(cairn.child.id()), cairn.containerd_pid()];
    let cpu = || pids.iter().flatten().map(|p| proc::cpu_seconds(*p)).sum::<f64>();
    let before = cpu();
    tokio::time::sleep(Duration::from_secs(secs as u64)).await;
    Ok((cpu() - before) * 60.0 / secs as f64)
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

    drop(cairn);

    let (idle_pods, secs, rounds) = (
        env_or("CAIRN_BENCH_IDLE_PODS", 10),
        env_or("CAIRN_BENCH_IDLE_SECS", 60),
        env_or("CAIRN_BENCH_IDLE_ROUNDS", 2),
    );
    let off =
        ["--eviction-hard=", "--local-storage-capacity-isolation=false", "--image-gc-period=8760h"].map(String::from);
    let (mut on_cpu, mut off_cpu) = (vec![], vec![]);
    for round in 0..rounds {
        for (flags, out) in [(&[][..], &mut on_cpu), (&off[..], &mut off_cpu)] {
            let per_minute = idle_cpu_per_minute(flags, idle_pods, secs).await?;
            println!(
                "idle round {round}, eviction and image GC {}: {:.3} CPU-seconds per minute",
                if flags.is_empty() { "on" } else { "off" },
                per_minute
            );
            out.push(per_minute);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (on_mean, off_mean) = (mean(&on_cpu), mean(&off_cpu));
    println!(
        "idle CPU per minute with {idle_pods} pods: monitoring on {on_mean:.3} s, off {off_mean:.3} s, difference {:.3} s ({:.2}x)",
        on_mean - off_mean,
        on_mean / off_mean
    );

    let report = json!({
        "pod_on_free_node_to_running": free,
        "pod_preempting_to_running": preempting,
        "preempting_vs_free": {"p50": ratio_p50, "p99": ratio_p99},
        "idle_cpu_seconds_per_minute": {
            "pods": idle_pods,
            "monitoring_on": on_cpu,
            "monitoring_off": off_cpu,
            "difference": on_mean - off_mean,
            "on_vs_off": on_mean / off_mean,
        },
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-pressure.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
