//! Container runtime and pod network benchmark: `cargo bench --bench runtime` (root, containerd,
//! runc, busybox-static and Debian's containernetworking-plugins needed).
//!
//! In one run, on one machine:
//! 1. Pod start-up through the raw CRI path (`cairn bench cri`: RunPodSandbox + PodSandboxStatus +
//!    CreateContainer + StartContainer; 50 pods one at a time, then 50 in batches of 10) against
//!    cairn's embedded containerd, once with cairn's own CNI plugin and once with Debian's reference
//!    `bridge` + `host-local` + `portmap` plugins (`--cni-bin-dir/--cni-conf-dir`); two rounds each,
//!    alternating, and the ratio cairn / reference.
//! 2. CNI ADD alone: the plugin executed as containerd does (env + stdin) into a fresh network
//!    namespace, 50 times each, cairn vs reference bridge + host-local.
//! 3. Importing a 100 MiB image tarball: `cairn images import` vs `ctr images import`.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-runtime.json`.
//! Environment: `CAIRN_BENCH_PODS` [50], `CAIRN_BENCH_PARALLEL` [10], `CAIRN_BENCH_ROUNDS` [2],
//! `CAIRN_BENCH_PARTS` [`startup,cni,import`].

#[path = "common/cri_floor.rs"]
mod cri_floor;
#[path = "common/figures.rs"]
mod figures;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cri_floor::bench_cri;
use figures::env_or;
use serde_json::{Value, json};

const BUSYBOX: &str = "docker.io/cairn-bench/busybox:1";
const REFERENCE_CNI: &str = "/usr/lib/cni";

fn busybox_image() -> Result<Vec<u8>> {
    let busybox = std::fs::read("/bin/busybox").context("busybox-static is needed")?;
    let mut image = oci_image::ImageBuilder::new(BUSYBOX).file("/bin/busybox", &busybox, 0o755);
    for applet in ["sh", "sleep"] {
        image = image.symlink(&format!("/bin/{applet}"), "busybox");
    }
    Ok(image.oci_layout_tar())
}

/// A `cairn server` with its node runtime, stopped with SIGTERM (pods removed by the bench itself).
struct Cairn {
    child: Child,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cairn {
    fn start(cluster_cidr: &str, reference_cni: Option<&Path>, image: &[u8]) -> Result<Cairn> {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("agent/images"))?;
        std::fs::write(data.join("agent/images/busybox.tar"), image)?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
        cmd.args(["server", "--disable-agent=false", "--bind-address", "127.0.0.1", "--https-listen-port", "0"])
            .args(["--log", "warn", "--cluster-cidr", cluster_cidr, "--disable-kube-proxy", "--disable=coredns"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--write-kubeconfig")
            .arg(&kubeconfig);
        if let Some(conf) = reference_cni {
            cmd.args(["--cni-bin-dir", REFERENCE_CNI]).arg("--cni-conf-dir").arg(conf);
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().context("starting cairn")?;
        let cairn = Cairn { child, data, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !cairn.has_image(BUSYBOX) {
            if Instant::now() > deadline {
                bail!("cairn did not import the bench image within 90 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(cairn)
    }

    fn cairn(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(Command::new(env!("CARGO_BIN_EXE_cairn")).args(args).arg("--data-dir").arg(&self.data).output()?)
    }

    fn has_image(&self, reference: &str) -> bool {
        let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
        self.cairn(&["ctr", "images"]).is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).lines().any(|l| l.split_whitespace().take(2).eq([repo, tag]))
        })
    }

    fn socket(&self) -> PathBuf {
        self.data.join("agent/containerd/containerd.sock")
    }
}

impl Drop for Cairn {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The reference plugin chain, configured as close to cairn's network as they allow.
fn reference_conflist(dir: &Path, subnet: &str, bridge: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "reference",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": dir.join("ipam").display().to_string()}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    });
    std::fs::write(dir.join("10-reference.conflist"), serde_json::to_vec_pretty(&conf)?)?;
    Ok(())
}

fn sorted_ms(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs one CNI command the way containerd does; returns how long it took.
fn cni_exec(plugin: &Path, command: &str, netns: &str, id: &str, config: &Value, bin_dir: &Path) -> Result<Duration> {
    let begin = Instant::now();
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", format!("/var/run/netns/{netns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(&serde_json::to_vec(config)?)?;
    let out = child.wait_with_output()?;
    let took = begin.elapsed();
    if !out.status.success() {
        bail!(
            "{} {command}: {}{}",
            plugin.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

/// CNI ADD latency of one plugin configuration over `n` fresh network namespaces.
fn cni_add_latency(label: &str, plugin: &Path, bin_dir: &Path, config: &Value, n: usize) -> Result<Vec<f64>> {
    let mut adds = Vec::new();
    for i in 0..n {
        let netns = format!("cairn-bench-{}-{i}", std::process::id());
        let id = format!("bench-{label}-{i}");
        Command::new("ip").args(["netns", "add", &netns]).status()?;
        let add = cni_exec(plugin, "ADD", &netns, &id, config, bin_dir);
        let del = cni_exec(plugin, "DEL", &netns, &id, config, bin_dir);
        Command::new("ip").args(["netns", "delete", &netns]).status()?;
        adds.push(add?.as_secs_f64() * 1000.0);
        del?;
    }
    Ok(sorted_ms(adds))
}

fn main() -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!("the runtime benchmark needs root (it runs containerd and creates network namespaces)");
    }
    let pods = env_or("CAIRN_BENCH_PODS", 50);
    let parallel = env_or("CAIRN_BENCH_PARALLEL", 10);
    let rounds = env_or("CAIRN_BENCH_ROUNDS", 2);
    let image = busybox_image()?;
    let scratch = tempfile::tempdir()?;
    let parts = std::env::var("CAIRN_BENCH_PARTS").unwrap_or_else(|_| "startup,cni,import".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
    let mut report = json!({"pods": pods, "parallel": parallel, "rounds": rounds});

    if part("startup") {
        report["startup"] = startup(pods, parallel, rounds, &image, scratch.path())?;
    }
    if part("cni") {
        report["cni_add"] = cni_add(pods, scratch.path())?;
    }
    if part("import") {
        report["import_100mib_s"] = import(&image, scratch.path())?;
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-runtime.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("\nfigures written to {}", out.display());
    Ok(())
}

/// Pod start-up, cairn's CNI vs the reference plugins, alternating rounds.
fn startup(pods: usize, parallel: usize, rounds: usize, image: &[u8], scratch: &Path) -> Result<Value> {
    let ref_conf = scratch.join("reference-net.d");
    reference_conflist(&ref_conf, "10.61.0.0/24", "cnibench0")?;
    let mut figures: Vec<(String, Vec<Value>)> = Vec::new();
    for round in 0..rounds {
        for (label, reference) in [("cairn", None), ("reference", Some(ref_conf.as_path()))] {
            let cidr = if reference.is_some() { "10.61.0.0/16" } else { "10.60.0.0/16" };
            let node = Cairn::start(cidr, reference, image)?;
            let f = bench_cri(|a| node.cairn(a), BUSYBOX, pods, parallel)?;
            println!("round {round} {label}: {}", serde_json::to_string(&f)?);
            figures.push((label.to_string(), f));
        }
    }
    println!("\npod start-up through CRI ({pods} pods; p50/p99 averaged over {rounds} rounds, ms)");
    println!("{:<28} {:>12} {:>12} {:>12} {:>12}", "scenario", "cairn p50", "ref p50", "cairn p99", "ref p99");
    let mut startup = Vec::new();
    for scenario in ["sequential", &format!("{parallel} in parallel")] {
        let pick = |label: &str, key: &str| {
            let v: Vec<f64> = figures
                .iter()
                .filter(|(l, _)| l == label)
                .flat_map(|(_, f)| {
                    f.iter().filter(|x| x["scenario"] == *scenario).map(|x| x[key].as_f64().unwrap_or(0.0))
                })
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let row = [
            pick("cairn", "total_p50_ms"),
            pick("reference", "total_p50_ms"),
            pick("cairn", "total_p99_ms"),
            pick("reference", "total_p99_ms"),
        ];
        println!(
            "{scenario:<28} {:>12.1} {:>12.1} {:>12.1} {:>12.1}   ratio p50 {:.2}, p99 {:.2}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[0] / row[1],
            row[2] / row[3]
        );
        let sandbox = [pick("cairn", "sandbox_p50_ms"), pick("reference", "sandbox_p50_ms")];
        println!("{:<28} {:>12.1} {:>12.1}   (RunPodSandbox + status alone)", "", sandbox[0], sandbox[1]);
        startup.push(
            json!({"scenario": scenario, "cairn_p50_ms": row[0], "reference_p50_ms": row[1], "cairn_p99_ms": row[2],
            "reference_p99_ms": row[3], "ratio_p50": row[0] / row[1], "ratio_p99": row[2] / row[3],
            "sandbox_cairn_p50_ms": sandbox[0], "sandbox_reference_p50_ms": sandbox[1]}),
        );
    }
    Ok(json!(startup))
}

/// CNI ADD alone, cairn's plugin vs the reference bridge + host-local.
fn cni_add(n: usize, scratch: &Path) -> Result<Value> {
    let bin = scratch.join("cni-bin");
    std::fs::create_dir_all(&bin)?;
    let cairn_plugin = bin.join("cairn-cni");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cairn"), &cairn_plugin)?;
    let cairn_conf = json!({"cniVersion": "1.0.0", "name": "cbench", "type": "cairn-cni", "bridge": "cnibench1",
        "subnet": "10.62.0.0/24", "clusterCIDR": "10.62.0.0/16", "mtu": 1500, "hairpinMode": true, "ipMasq": true,
        "stateDir": scratch.join("cairn-cni").display().to_string()});
    let ref_plugin_conf = json!({"cniVersion": "1.0.0", "name": "refbench", "type": "bridge", "bridge": "cnibench2",
        "isGateway": true, "ipMasq": true, "hairpinMode": true,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.63.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
                 "dataDir": scratch.join("ref-ipam").display().to_string()}});
    let cairn_add = cni_add_latency("cairn", &cairn_plugin, &bin, &cairn_conf, n)?;
    let ref_add = cni_add_latency(
        "reference",
        &Path::new(REFERENCE_CNI).join("bridge"),
        Path::new(REFERENCE_CNI),
        &ref_plugin_conf,
        n,
    )?;
    println!("\nCNI ADD, exec'd as containerd does ({n} namespaces, ms)");
    println!("cairn-cni:           p50 {:.2}  p99 {:.2}", pct(&cairn_add, 50.0), pct(&cairn_add, 99.0));
    println!(
        "bridge + host-local: p50 {:.2}  p99 {:.2}   ratio p50 {:.2}",
        pct(&ref_add, 50.0),
        pct(&ref_add, 99.0),
        pct(&cairn_add, 50.0) / pct(&ref_add, 50.0)
    );
    for bridge in ["cnibench0", "cnibench1", "cnibench2"] {
        let _ = Command::new("ip").args(["link", "delete", bridge]).status();
    }
    Ok(json!({"cairn_p50_ms": pct(&cairn_add, 50.0), "cairn_p99_ms": pct(&cairn_add, 99.0),
        "reference_p50_ms": pct(&ref_add, 50.0), "reference_p99_ms": pct(&ref_add, 99.0)}))
}

/// Importing a 100 MiB image: `cairn images import` vs `ctr images import` into the same containerd.
fn import(image: &[u8], scratch: &Path) -> Result<Value> {
    let node = Cairn::start("10.60.0.0/16", None, image)?;
    let mut noise = vec![0u8; 100 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in noise.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut imports = json!({});
    for (i, label) in ["cairn", "ctr"].iter().enumerate() {
        let reference = format!("docker.io/cairn-bench/big:{label}");
        let tar = oci_image::ImageBuilder::new(&reference).file(&format!("/data-{i}"), &noise, 0o644).oci_layout_tar();
        let path = scratch.join(format!("big-{label}.tar"));
        std::fs::write(&path, &tar)?;
        let begin = Instant::now();
        let status = if *label == "cairn" {
            node.cairn(&["images", "import", &path.display().to_string()])?.status
        } else {
            Command::new("ctr")
                .arg("-a")
                .arg(node.socket())
                .args(["-n", "k8s.io", "images", "import"])
                .arg(&path)
                .output()?
                .status
        };
        let took = begin.elapsed().as_secs_f64();
        if !status.success() {
            bail!("{label} import of {} failed", path.display());
        }
        println!("import of a {:.0} MiB tarball with {label}: {took:.2} s", tar.len() as f64 / 1048576.0);
        imports[label] = json!(took);
    }
    Ok(imports)
}
