//! The raw CRI floor the benchmarks compare against: `cairn bench cri` (RunPodSandbox +
//! PodSandboxStatus + CreateContainer + StartContainer by a direct client), one pod at a time and
//! `parallel` at once, each pod running `/bin/sleep 3600` from `image`.

use anyhow::{Result, bail};
use serde_json::Value;

/// Runs `cairn bench cri` through `cairn` (a runner that points it at the right containerd) and
/// returns its figures, one JSON object per scenario.
pub fn bench_cri(
    cairn: impl FnOnce(&[&str]) -> Result<std::process::Output>,
    image: &str,
    pods: usize,
    parallel: usize,
) -> Result<Vec<Value>> {
    let (pods, parallel) = (pods.to_string(), parallel.to_string());
    let out = cairn(&[
        "bench",
        "cri",
        "--image",
        image,
        "--pods",
        &pods,
        "--parallel",
        &parallel,
        "--command",
        "/bin/sleep",
        "3600",
    ])?;
    if !out.status.success() {
        bail!("cairn bench cri failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| Ok(serde_json::from_str(l)?)).collect()
}
