//! Streaming benchmark: `cargo bench --bench interactive` (root, containerd, runc, busybox-static
//! and kubectl 1.37 in `.venv` or `$KUBECTL` needed).
//!
//! In one run, against one `cairn server` with its agent and one busybox pod:
//! 1. `kubectl exec POD -- true` round trips (kubectl's WebSocket protocol, and SPDY forced), p50
//!    and p99, against the node's raw CRI `ExecSync` floor, `cairn ctr exec ID true`, each a fresh
//!    process as kubectl is.
//! 2. A 100 MiB HTTP download from the pod through `kubectl port-forward` (WebSocket tunnel, and
//!    SPDY forced) against the same download straight from the pod's IP, alternating.
//!
//! Nothing is asserted; figures go to stdout. Environment: `CAIRN_BENCH_EXECS` [100],
//! `CAIRN_BENCH_ROUNDS` [3] downloads per path; `CAIRN_BENCH_BIN`, another cairn binary.

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

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use busybox::BUSYBOX;
use figures::env_or;
use node::{Cairn, kubectl_path};
use serde_json::Value;

const SIZE_MIB: usize = 100;

fn kubectl(cairn: &Cairn, env: &[(&str, &str)], args: &[&str]) -> Result<Output> {
    let out = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(&cairn.kubeconfig)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// Runs `f` `n` times; (p50, p99) in ms.
fn timed(n: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    Ok((pct(&ms, 50.0), pct(&ms, 99.0)))
}

/// Downloads `/big` from `addr`; MiB/s.
fn download(addr: (&str, u16)) -> Result<f64> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr:?}"))?;
    s.write_all(b"GET /big HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0usize;
    loop {
        match s.read(&mut buf)? {
            0 => break,
            n => total += n,
        }
    }
    if total < SIZE_MIB << 20 {
        bail!("only {total} bytes came from {addr:?}");
    }
    Ok(total as f64 / 1048576.0 / t.elapsed().as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let execs = env_or("CAIRN_BENCH_EXECS", 100);
    let rounds = env_or("CAIRN_BENCH_ROUNDS", 3);
    let cairn = Cairn::start("10.49.0.0/16")?;
    let script = format!(
        "mkdir -p /www && dd if=/dev/zero of=/www/big bs=1048576 count={SIZE_MIB} && exec httpd -f -p 80 -h /www"
    );
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: bench}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [\"/bin/sh\", \"-c\", {script:?}]\n"
    );
    let mut apply = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(&cairn.kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    apply.stdin.take().context("stdin")?.write_all(yaml.as_bytes())?;
    apply.wait()?;
    kubectl(&cairn, &[], &["wait", "--for=condition=Ready", "pod/bench", "--timeout=120s"])?;
    let pod: Value = serde_json::from_slice(&kubectl(&cairn, &[], &["get", "pod", "bench", "-o", "json"])?.stdout)?;
    let ip = pod["status"]["podIP"].as_str().context("no pod IP")?.to_string();
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("containerd://"))
        .context("no container ID")?
        .to_string();
    // httpd listens once the file is written.
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect((ip.as_str(), 80)).is_err() {
        if Instant::now() > deadline {
            bail!("the bench pod's httpd did not listen in 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    println!("exec round trip, {execs} runs (p50 / p99 ms):");
    let floor = timed(execs, || {
        let out = Command::new(binary::cairn_bin())
            .args(["ctr", "--data-dir"])
            .arg(&cairn.data)
            .args(["exec", &id, "--", "true"])
            .output()?;
        if !out.status.success() {
            bail!("cairn ctr exec: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    })?;
    println!("  raw CRI ExecSync (cairn ctr exec): {:.1} / {:.1}", floor.0, floor.1);
    for (label, env) in [("websocket", vec![]), ("spdy", vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")])] {
        let t = timed(execs, || kubectl(&cairn, &env, &["exec", "bench", "--", "true"]).map(drop))?;
        println!("  kubectl exec ({label}): {:.1} / {:.1}  ({:.2}x the floor at p50)", t.0, t.1, t.0 / floor.0);
    }

    println!("{SIZE_MIB} MiB download, {rounds} rounds (median MiB/s):");
    for (label, env) in [("websocket", vec![]), ("spdy", vec![("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")])] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut pf = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&cairn.kubeconfig)
            .args(["port-forward", "pod/bench", &format!("{port}:80")])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("kubectl port-forward did not listen in 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (mut direct, mut forwarded) = (vec![], vec![]);
        for _ in 0..rounds {
            direct.push(download((&ip, 80))?);
            forwarded.push(download(("127.0.0.1", port))?);
        }
        let _ = pf.kill();
        let _ = pf.wait();
        let (d, f) = (median(direct), median(forwarded));
        println!("  direct to the pod IP: {d:.0}; port-forward ({label}): {f:.0}  ({:.2}x direct)", f / d);
    }
    // Waiting for the pod to be gone lets the agent tear its sandbox and network namespace down
    // before cairn stops.
    let _ = kubectl(&cairn, &[], &["delete", "pod", "bench", "--grace-period=1", "--timeout=60s"]);
    Ok(())
}
