//! `cairn bench cri`: pod start-up through the raw CRI path (RunPodSandbox + CreateContainer +
//! StartContainer by a direct client), sequentially and in parallel batches. It measures whatever
//! runtime and CNI the socket leads to, so the same command compares pod networks side by side.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::future::join_all;

use super::cri::{self, Cri};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Image of the one container each pod runs; it must be present already.
    pub image: String,
    /// Its command, e.g. `["/bin/sleep", "3600"]`.
    pub command: Vec<String>,
    pub pods: usize,
    pub parallel: usize,
}

/// Latencies of one scenario.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figures {
    pub scenario: String,
    pub pods: usize,
    pub sandbox_p50_ms: f64,
    pub sandbox_p99_ms: f64,
    pub total_p50_ms: f64,
    pub total_p99_ms: f64,
}

pub async fn run(cri: &Cri, plan: &Plan) -> Result<Vec<Figures>> {
    cri.image_status(cri::ImageStatusRequest {
        image: Some(cri::ImageSpec { image: plan.image.clone(), ..Default::default() }),
        verbose: false,
    })
    .await?
    .image
    .with_context(|| format!("the image {} is not in the runtime; import it first", plan.image))?;
    let run_id = std::process::id();
    // A fresh directory (create_dir fails rather than reuse something planted there).
    let logs = std::env::temp_dir().join(format!("cairn-bench-{run_id}"));
    std::fs::create_dir(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut results = Vec::new();
    let parallel = plan.parallel.max(1);
    for (scenario, batch_size) in [("sequential".to_string(), 1), (format!("{parallel} in parallel"), parallel)] {
        let mut started = Vec::new();
        let mut failure = None;
        while started.len() < plan.pods && failure.is_none() {
            let batch = batch_size.min(plan.pods - started.len());
            let names: Vec<String> = (0..batch).map(|i| format!("bench-{run_id}-{}-{i}", started.len())).collect();
            for result in join_all(names.iter().map(|n| start_pod(cri, plan, n, &logs))).await {
                match result {
                    Ok(pod) => started.push(pod),
                    Err(e) => failure = Some(e),
                }
            }
        }
        cleanup(cri, &started).await;
        if let Some(e) = failure {
            let _ = std::fs::remove_dir_all(&logs);
            return Err(e);
        }
        results.push(figures(&scenario, &started));
    }
    let _ = std::fs::remove_dir_all(&logs);
    Ok(results)
}

/// One started pod: its sandbox and how long the sandbox and the whole start took.
struct Started {
    sandbox_id: String,
    sandbox: Duration,
    total: Duration,
}

async fn start_pod(cri: &Cri, plan: &Plan, name: &str, logs: &std::path::Path) -> Result<Started> {
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "cairn-bench".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.join(name).display().to_string(),
        ..Default::default()
    };
    let begin = Instant::now();
    let sandbox_id = cri
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
        .await
        .with_context(|| format!("RunPodSandbox {name}"))?
        .pod_sandbox_id;
    match start_container(cri, plan, name, &sandbox_id, config).await {
        Ok(sandbox) => Ok(Started { sandbox_id, sandbox: sandbox - begin, total: begin.elapsed() }),
        Err(e) => {
            cleanup(cri, &[Started { sandbox_id, sandbox: Duration::ZERO, total: Duration::ZERO }]).await;
            Err(e)
        }
    }
}

/// The rest of a pod's start in its sandbox; returns when the sandbox's address was known.
async fn start_container(
    cri: &Cri,
    plan: &Plan,
    name: &str,
    sandbox_id: &str,
    config: cri::PodSandboxConfig,
) -> Result<Instant> {
    // As kubelet does, ask for the sandbox's address before starting containers.
    let status = cri
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose: false })
        .await?;
    if status.status.and_then(|s| s.network).is_none_or(|n| n.ip.is_empty()) {
        anyhow::bail!("sandbox {name} got no IP address");
    }
    let addressed = Instant::now();
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "main".into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: plan.image.clone(), ..Default::default() }),
        command: plan.command.clone(),
        log_path: "main.log".into(),
        ..Default::default()
    };
    let created = cri
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(container),
            sandbox_config: Some(config),
        })
        .await
        .with_context(|| format!("CreateContainer in {name}"))?;
    cri.start_container(cri::StartContainerRequest { container_id: created.container_id })
        .await
        .with_context(|| format!("StartContainer in {name}"))?;
    Ok(addressed)
}

async fn cleanup(cri: &Cri, pods: &[Started]) {
    for pod in pods {
        let id = pod.sandbox_id.clone();
        let _ = cri.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await;
        if let Err(e) = cri.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id }).await {
            tracing::warn!("removing bench sandbox {}: {e}", pod.sandbox_id);
        }
    }
}

fn figures(scenario: &str, pods: &[Started]) -> Figures {
    let ms = |f: fn(&Started) -> Duration| {
        let mut v: Vec<f64> = pods.iter().map(|p| f(p).as_secs_f64() * 1000.0).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (sandbox, total) = (ms(|p| p.sandbox), ms(|p| p.total));
    Figures {
        scenario: scenario.into(),
        pods: pods.len(),
        sandbox_p50_ms: percentile(&sandbox, 50.0),
        sandbox_p99_ms: percentile(&sandbox, 99.0),
        total_p50_ms: percentile(&total, 50.0),
        total_p99_ms: percentile(&total, 99.0),
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
