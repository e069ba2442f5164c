//! Service proxy benchmark: `cargo bench --bench services` (root, containerd, runc, nftables,
//! busybox-static and kubectl 1.37 in `.venv` or `$KUBECTL` needed).
//!
//! In one run, against one `cairn server` with its agent and service proxy, one busybox httpd pod
//! and a ClusterIP Service in front of it: from the host, `CAIRN_BENCH_REQUESTS` [2000] fresh TCP
//! connections each to the pod's IP directly and to the cluster IP (DNATed by the proxy's rules),
//! alternating. Each connection is timed twice: its setup (`connect`, the handshake, where the NAT
//! rules are evaluated) and its request (`GET /` until the server closes). Prints p50 and p99 of
//! both for each path and the cluster IP's ratios to the pod IP. Nothing is asserted.
//! `CAIRN_BENCH_BIN`, another cairn binary. The proxy's table is removed at the end.

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
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use busybox::BUSYBOX;
use figures::env_or;
use node::{Cairn, kubectl_path};

fn kubectl(cairn: &Cairn, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let mut child = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(&cairn.kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    let mut input = child.stdin.take().context("kubectl's stdin")?;
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

fn jsonpath(cairn: &Cairn, what: &str, path: &str) -> Result<String> {
    let out = kubectl(cairn, &["get", what, "-o", &format!("jsonpath={path}")], None)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One connection to `addr`: (setup, request) in ms.
fn fetch(addr: SocketAddr) -> Result<(f64, f64)> {
    let t = Instant::now();
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).with_context(|| format!("connecting to {addr}"))?;
    let setup = t.elapsed();
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    let total = t.elapsed();
    if !body.windows(5).any(|w| w == b"bench") {
        bail!("{addr} answered {:?}", String::from_utf8_lossy(&body));
    }
    Ok((setup.as_secs_f64() * 1000.0, (total - setup).as_secs_f64() * 1000.0))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p / 100.0).round() as usize]
}

#[derive(Default)]
struct Path {
    setup: Vec<f64>,
    request: Vec<f64>,
}

impl Path {
    fn figures(&mut self) -> [f64; 4] {
        self.setup.sort_by(f64::total_cmp);
        self.request.sort_by(f64::total_cmp);
        [pct(&self.setup, 50.0), pct(&self.setup, 99.0), pct(&self.request, 50.0), pct(&self.request, 99.0)]
    }
}

fn main() -> Result<()> {
    let requests = env_or("CAIRN_BENCH_REQUESTS", 2000);
    let result = run(requests);
    // The proxy leaves its rules in the kernel when cairn stops (on purpose): remove them.
    let _ = Command::new("nft").args(["delete", "table", "ip", "cairn-proxy"]).output();
    result
}

fn run(requests: usize) -> Result<()> {
    let cairn = Cairn::start_with("10.56.0.0/16", &["--disable-kube-proxy=false".to_string()])?;
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: bench, labels: {{app: bench}}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  \
         containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: Never\n    \
         command: [/bin/sh, -c, 'mkdir -p /www && echo bench > /www/index.html && exec httpd -f -p 8080 -h /www']\n"
    );
    kubectl(&cairn, &["apply", "-f", "-"], Some(&pod))?;
    kubectl(&cairn, &["wait", "--for=condition=Ready", "pod/bench", "--timeout=120s"], None)?;
    kubectl(&cairn, &["expose", "pod", "bench", "--port=80", "--target-port=8080"], None)?;
    let pod_ip: SocketAddr = format!("{}:8080", jsonpath(&cairn, "pod/bench", "{.status.podIP}")?).parse()?;
    let cluster_ip: SocketAddr = format!("{}:80", jsonpath(&cairn, "svc/bench", "{.spec.clusterIP}")?).parse()?;
    // Both answer once httpd listens and the proxy has synced.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fetch(pod_ip).is_err() || fetch(cluster_ip).is_err() {
        if Instant::now() > deadline {
            bail!("{pod_ip} and {cluster_ip} did not both answer within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..50 {
        fetch(pod_ip)?;
        fetch(cluster_ip)?;
    }

    let (mut direct, mut service) = (Path::default(), Path::default());
    for i in 0..requests {
        let order =
            if i % 2 == 0 { [(pod_ip, true), (cluster_ip, false)] } else { [(cluster_ip, false), (pod_ip, true)] };
        for (addr, is_direct) in order {
            let (setup, request) = fetch(addr)?;
            let path = if is_direct { &mut direct } else { &mut service };
            path.setup.push(setup);
            path.request.push(request);
        }
    }
    let (d, s) = (direct.figures(), service.figures());
    println!("{requests} connections each, alternating, from the host (p50 / p99 ms):");
    println!("  pod IP {pod_ip}:     setup {:.3} / {:.3}  request {:.3} / {:.3}", d[0], d[1], d[2], d[3]);
    println!("  cluster IP {cluster_ip}: setup {:.3} / {:.3}  request {:.3} / {:.3}", s[0], s[1], s[2], s[3]);
    println!(
        "  cluster IP / pod IP: setup {:.2}x / {:.2}x  request {:.2}x / {:.2}x",
        s[0] / d[0],
        s[1] / d[1],
        s[2] / d[2],
        s[3] / d[3]
    );
    // Waiting for the pod to be gone lets the agent tear its sandbox and network namespace down
    // before cairn stops.
    let _ = kubectl(&cairn, &["delete", "svc,pod", "bench", "--grace-period=1", "--timeout=60s"], None);
    Ok(())
}
