//! Joined node benchmark: `cargo bench --bench join` (root, containerd, runc, iproute2 and
//! util-linux's nsenter needed).
//!
//! In one run, against one `cairn server --disable-agent`, with a `cairn agent` in a network
//! namespace joined to the server's by a veth pair (the bench makes and removes both):
//! 1. `cairn agent` start → its Node Ready, seen through the API: the first join (credentials,
//!    registration, pod range) and restarts on the kept credentials; against the same for an
//!    all-in-one `cairn server`'s own node (start → Node Ready) in the same run.
//! 2. The agent's idle RSS (containerd apart) and containerd's, with no pods.
//! 3. The bytes an idle node puts on the network (both directions of its veth) over a quiet
//!    window, extrapolated to an hour, with the requests that make them: kubelet's published
//!    defaults are a Lease renewal every 10 s (360/h) and a status report every 5 min when nothing
//!    changed (12/h), and cairn's agent keeps the same periods.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-join.json`.
//! Environment: `CAIRN_BENCH_SAMPLES` [5] restarts measured, `CAIRN_BENCH_IDLE_SECS` [120];
//! `CAIRN_BENCH_BIN`, another cairn binary to measure.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/figures.rs"]
mod figures;
#[path = "common/proc.rs"]
mod proc;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use figures::env_or;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

const NET: &str = "10.201.250";
const NETNS: &str = "cjbench-a";
const BRIDGE: &str = "cjbenchbr";
const VETH: &str = "cjbencha";

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The bridge, the namespace and the veth pair between them.
struct Lab;

impl Lab {
    fn new() -> Result<Lab> {
        Lab::remove();
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{NET}.1/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        ip(&["netns", "add", NETNS])?;
        ip(&["link", "add", VETH, "type", "veth", "peer", "name", "eth0", "netns", NETNS])?;
        ip(&["link", "set", VETH, "master", BRIDGE, "up"])?;
        ip(&["-n", NETNS, "addr", "add", &format!("{NET}.2/24"), "dev", "eth0"])?;
        ip(&["-n", NETNS, "link", "set", "eth0", "up"])?;
        ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
        Ok(Lab)
    }

    fn remove() {
        let _ = ip(&["netns", "del", NETNS]);
        let _ = ip(&["link", "del", VETH]);
        let _ = ip(&["link", "del", BRIDGE]);
    }

    /// Bytes through the node's veth, both directions.
    fn bytes() -> u64 {
        ["rx_bytes", "tx_bytes"]
            .iter()
            .filter_map(|c| std::fs::read_to_string(format!("/sys/class/net/{VETH}/statistics/{c}")).ok())
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum()
    }

    fn packets() -> u64 {
        ["rx_packets", "tx_packets"]
            .iter()
            .filter_map(|c| std::fs::read_to_string(format!("/sys/class/net/{VETH}/statistics/{c}")).ok())
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        Lab::remove();
    }
}

/// A child process, SIGTERMed and waited for when dropped.
struct Proc(Child);

impl Proc {
    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn server(dir: &Path, agent: bool) -> Result<Proc> {
    let mut cmd = Command::new(binary::cairn_bin());
    cmd.args(["server", "--https-listen-port", "0", "--log", "warn", "--bind-address", "0.0.0.0"])
        .args(["--tls-san", &format!("{NET}.1"), "--cluster-cidr", "10.60.0.0/16", "--node-name", "allinone"])
        .args(["--disable-kube-proxy", "--disable=coredns,servicelb", "--kubelet-port", "0", "--healthz-port", "0"])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--kubelet-root-dir")
        .arg(dir.join("kubelet"))
        .args(["--cgroup-root", &format!("/cairn-bench-{}", dir.file_name().unwrap_or_default().to_string_lossy())])
        .arg("--write-kubeconfig")
        .arg(dir.join("kubeconfig.yaml"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if !agent {
        cmd.arg("--disable-agent");
    }
    Ok(Proc(cmd.spawn().context("starting cairn server")?))
}

fn agent(dir: &Path, server_url: &str, token: &Path) -> Result<Proc> {
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{NETNS}"))
        .arg("--")
        .arg(binary::cairn_bin())
        .args(["agent", "--server", server_url, "--node-name", "joined", "--log", "warn"])
        .arg("--token-file")
        .arg(token)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--kubelet-root-dir")
        .arg(dir.join("kubelet"))
        .args(["--cgroup-root", &format!("/cairn-bench-{}", dir.file_name().unwrap_or_default().to_string_lossy())])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting cairn agent")?;
    Ok(Proc(child))
}

async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubeconfig.exists() {
        if Instant::now() > deadline {
            bail!("the server wrote no kubeconfig within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Polls (every 10 ms) until the Node `name` is Ready; the time since `since`.
async fn until_ready(nodes: &Api<Node>, name: &str, since: Instant) -> Result<Duration> {
    let deadline = since + Duration::from_secs(120);
    loop {
        if let Ok(Some(node)) = nodes.get_opt(name).await
            && ready(&node)
        {
            return Ok(since.elapsed());
        }
        if Instant::now() > deadline {
            bail!("node {name} was not Ready within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the Node `name` is no longer Ready (its agent stopped), so the next start is timed
/// from a node that is not Ready.
async fn mark_not_ready(nodes: &Api<Node>, name: &str) -> Result<()> {
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "BenchRestart",
        "message": "restarted by the benchmark", "lastHeartbeatTime": null, "lastTransitionTime": null}]}});
    nodes
        .patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(&patch))
        .await
        .context("marking the node not ready")?;
    Ok(())
}

/// Removes the (empty) cgroups the bench's nodes left.
fn remove_cgroups() {
    fn remove_tree(path: &Path) {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
        let _ = std::fs::remove_dir(path);
    }
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten().map(|e| e.path());
    for hierarchy in hierarchies.chain([PathBuf::from("/sys/fs/cgroup")]) {
        for entry in std::fs::read_dir(&hierarchy).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("cairn-bench-") {
                remove_tree(&entry.path());
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

async fn run() -> Result<serde_json::Value> {
    let samples = env_or("CAIRN_BENCH_SAMPLES", 5);
    let idle = Duration::from_secs(env_or("CAIRN_BENCH_IDLE_SECS", 120));

    // Baseline: an all-in-one server's own node, start → Ready.
    let mut allinone = Vec::new();
    for _ in 0..samples {
        let dir = tempfile::tempdir()?;
        let started = Instant::now();
        let mut s = server(dir.path(), true)?;
        let nodes: Api<Node> = Api::all(client(&dir.path().join("kubeconfig.yaml")).await?);
        allinone.push(ms(until_ready(&nodes, "allinone", started).await?));
        s.stop();
    }

    let _lab = Lab::new()?;
    let sdir = tempfile::tempdir()?;
    let _server = server(sdir.path(), false)?;
    let kube = client(&sdir.path().join("kubeconfig.yaml")).await?;
    let nodes: Api<Node> = Api::all(kube.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = loop {
        let text = std::fs::read_to_string(sdir.path().join("kubeconfig.yaml"))?;
        if let Some(port) = text.lines().find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
            && kube.apiserver_version().await.is_ok()
        {
            break format!("https://{NET}.1:{}", port.trim());
        }
        if Instant::now() > deadline {
            bail!("the server did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let token = sdir.path().join("data/server/token");
    let adir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut a = agent(adir.path(), &url, &token)?;
    let first = ms(until_ready(&nodes, "joined", started).await?);
    let mut restarts = Vec::new();
    for _ in 0..samples {
        a.stop();
        mark_not_ready(&nodes, "joined").await?;
        let started = Instant::now();
        a = agent(adir.path(), &url, &token)?;
        restarts.push(ms(until_ready(&nodes, "joined", started).await?));
    }

    // Idle: settle, then count what crosses the node's link.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (bytes0, packets0, t0) = (Lab::bytes(), Lab::packets(), Instant::now());
    tokio::time::sleep(idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let bytes_per_hour = (Lab::bytes() - bytes0) as f64 * 3600.0 / secs;
    let packets_per_hour = (Lab::packets() - packets0) as f64 * 3600.0 / secs;
    // nsenter execs cairn (it forks only to enter a PID namespace).
    let agent_pid = a.0.id();
    let containerd = std::fs::read_to_string(adir.path().join("data/agent/containerd/containerd.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    let figures = json!({
        "allinone_start_to_ready_ms_median": median(allinone.clone()),
        "allinone_start_to_ready_ms": allinone,
        "agent_first_join_to_ready_ms": first,
        "agent_restart_to_ready_ms_median": median(restarts.clone()),
        "agent_restart_to_ready_ms": restarts,
        "agent_idle_rss_kib": proc::rss_kib(agent_pid),
        "containerd_idle_rss_kib": containerd.map(proc::rss_kib),
        "idle_window_s": secs,
        "idle_network_bytes_per_hour": bytes_per_hour,
        "idle_network_packets_per_hour": packets_per_hour,
        "kubelet_defaults_requests_per_hour": {"lease_renewals": 360, "status_reports_unchanged": 12},
    });
    a.stop();
    Ok(figures)
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let figures = rt.block_on(run());
    remove_cgroups();
    let figures = figures?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-join.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&figures)?)?;
    println!("wrote {}", out.display());
    Ok(())
}
