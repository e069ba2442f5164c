//! Devices benchmark: `cargo bench --bench devices` (root, containerd, runc and busybox-static needed).
//!
//! In one run, against one `cairn server` started with `--device cairn.io/fake=<dir>/fake*` over fake
//! device nodes (mknod 1:3, as /dev/null):
//! 1. Pod start-up, create → Running through a watch, one at a time: a pod asking for nothing (the
//!    baseline), a pod asking for one `cairn.io/fake` (admission, Allocate, the device node in its
//!    container) and a pod asking for one `nvidia.com/gpu` of the built-in NVIDIA plugin (a fake
//!    driver tree under `--gpu-discovery-root`: the GPU and control nodes and a library mounted),
//!    alternated so that all see the same machine. Device pods stay until the end, so every one gets
//!    a device of its own; each plain pod is deleted (and gone) before the next round, so that the
//!    node's 110 pods (kubelet's `--max-pods`) hold all of them.
//! 2. A device node appearing → the Node's allocatable showing it, one node at a time.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-devices.json`.
//! Environment: `CAIRN_BENCH_RUNS` [50, at most 54] samples of 1; `CAIRN_BENCH_APPEAR` [10] samples of 2;
//! `CAIRN_BENCH_BIN`, another cairn binary to measure.

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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use busybox::BUSYBOX;
use figures::{env_or, summary};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use node::{Cairn, delete_and_wait, start_up};
use serde_json::{Value, json};

const RESOURCE: &str = "cairn.io/fake";

fn mknod(path: &Path) -> Result<()> {
    let status = std::process::Command::new("mknod").arg(path).args(["c", "1", "3"]).status()?;
    if !status.success() {
        bail!("mknod {} failed", path.display());
    }
    Ok(())
}

/// A fake NVIDIA driver tree with `gpus` GPUs under `root`.
fn fake_gpus(root: &Path, gpus: usize) -> Result<()> {
    std::fs::create_dir_all(root.join("dev"))?;
    for i in 0..gpus {
        mknod(&root.join(format!("dev/nvidia{i}")))?;
    }
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"] {
        mknod(&root.join("dev").join(n))?;
    }
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib)?;
    std::fs::write(lib.join("libcuda.so.1"), "fake")?;
    Ok(())
}

fn pod(name: &str, resource: Option<&str>) -> Result<Pod> {
    let resources = match resource {
        Some(r) => json!({"limits": {r: "1"}}),
        None => json!({}),
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "devices"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "main", "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent", "command": ["/bin/sleep", "3600"], "resources": resources}]}
    }))?)
}

fn allocatable(node: &Node) -> i64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(RESOURCE))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

/// Makes one more device node and returns the time until the Node's allocatable counts it (ms).
async fn appear(nodes: &Api<Node>, path: &Path) -> Result<f64> {
    let before = allocatable(&nodes.list(&ListParams::default()).await?.items[0]);
    let at = Instant::now();
    mknod(path)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if nodes.list(&ListParams::default()).await?.items.iter().any(|n| allocatable(n) > before) {
            return Ok(at.elapsed().as_secs_f64() * 1000.0);
        }
        if Instant::now() > deadline {
            bail!("{} was not allocatable within 60 s", path.display());
        }
        // The Node changes once per status write: a short poll measures it to within 10 ms.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let runs = env_or("CAIRN_BENCH_RUNS", 50);
    // Device pods stay until the end: two per run and the plain one must fit kubelet's 110 pods.
    if 2 * runs + 1 > 110 {
        bail!("CAIRN_BENCH_RUNS={runs}: at most 54, as the node's 110 pods hold two device pods per run");
    }
    let appearances = env_or("CAIRN_BENCH_APPEAR", 10);
    let fakes = tempfile::tempdir()?;
    for i in 0..runs {
        mknod(&fakes.path().join(format!("fake{i}")))?;
    }
    let flag = format!("{RESOURCE}={}/fake*", fakes.path().display());
    let gpu_root = tempfile::tempdir()?;
    fake_gpus(gpu_root.path(), runs)?;
    let gpu_flag = gpu_root.path().display().to_string();
    let cairn = Cairn::start_with("10.44.0.0/16", &["--device".into(), flag, "--gpu-discovery-root".into(), gpu_flag])?;
    let client = cairn.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    // Let start-up settle (first heartbeat, the plugin's registration) before measuring.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let (mut plain, mut device, mut gpu) = (vec![], vec![], vec![]);
    for i in 0..runs {
        let name = format!("plain-{i}");
        plain.push(start_up(&pods, pod(&name, None)?).await?);
        delete_and_wait(&pods, &name).await?;
        device.push(start_up(&pods, pod(&format!("device-{i}"), Some(RESOURCE))?).await?);
        gpu.push(start_up(&pods, pod(&format!("gpu-{i}"), Some("nvidia.com/gpu"))?).await?);
    }
    let (plain, device, gpu) = (summary(plain), summary(device), summary(gpu));
    let ratio = |of: &Value, k: &str| of[k].as_f64().unwrap_or(f64::NAN) / plain[k].as_f64().unwrap_or(f64::NAN);
    let (ratio_p50, ratio_p99) = (ratio(&device, "p50_ms"), ratio(&device, "p99_ms"));
    let (gpu_p50, gpu_p99) = (ratio(&gpu, "p50_ms"), ratio(&gpu, "p99_ms"));
    println!("pod asking for nothing -> Running: {plain}");
    println!("pod asking for one {RESOURCE} -> Running: {device} ({ratio_p50:.2}x p50, {ratio_p99:.2}x p99)");
    println!("pod asking for one nvidia.com/gpu -> Running: {gpu} ({gpu_p50:.2}x p50, {gpu_p99:.2}x p99)");
    pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("bench=devices")).await?;

    let mut appeared = vec![];
    for i in 0..appearances {
        appeared.push(appear(&nodes, &fakes.path().join(format!("fake-new{i}"))).await?);
    }
    let appeared = summary(appeared);
    println!("device node made -> allocatable: {appeared}");

    let report = json!({
        "pod_plain_to_running": plain,
        "pod_with_device_to_running": device,
        "pod_with_device_vs_plain": {"p50": ratio_p50, "p99": ratio_p99},
        "pod_with_gpu_to_running": gpu,
        "pod_with_gpu_vs_plain": {"p50": gpu_p50, "p99": gpu_p99},
        "device_node_to_allocatable": appeared,
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-devices.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
