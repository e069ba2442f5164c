//! A `cairn server` with its node agent for the benchmarks that run pods (root, containerd, runc
//! and busybox-static needed): the busybox image is in its images directory and imported before
//! `start` returns. Include beside `binary` and `busybox`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::wait::{await_condition, conditions};

use super::binary;
use super::busybox::{BUSYBOX, busybox_image};

/// The kubectl the benches drive: `KUBECTL`, or the one the setup script put in `.venv`.
pub fn kubectl_path() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubectl"))
}

/// The running server; SIGTERMed when dropped.
pub struct Cairn {
    pub child: Child,
    pub data: PathBuf,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cairn {
    pub fn start(cluster_cidr: &str) -> Result<Cairn> {
        Self::start_with(cluster_cidr, &[])
    }

    /// With more flags.
    pub fn start_with(cluster_cidr: &str, extra: &[String]) -> Result<Cairn> {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("agent/images"))?;
        std::fs::write(data.join("agent/images/busybox.tar"), busybox_image())?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let child = Command::new(binary::cairn_bin())
            .args(["server", "--bind-address", "127.0.0.1", "--https-listen-port", "0", "--log", "warn"])
            // Host-wide parts a benchmark of pods does not use, unless it asks for the proxy.
            .args(extra.iter().all(|a| !a.starts_with("--disable-kube-proxy")).then_some("--disable-kube-proxy"))
            .arg("--disable=coredns")
            .args(["--cluster-cidr", cluster_cidr])
            .arg("--data-dir")
            .arg(&data)
            .arg("--kubelet-root-dir")
            .arg(dir.path().join("kubelet"))
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting cairn")?;
        let cairn = Cairn { child, data, kubeconfig, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(90);
        // `cairn ctr images` prints the repository and the tag in separate columns.
        let repo = BUSYBOX.rsplit_once(':').map_or(BUSYBOX, |(repo, _)| repo).as_bytes();
        while !cairn.cairn(&["ctr", "images"])?.stdout.windows(repo.len()).any(|w| w == repo) {
            if Instant::now() > deadline {
                bail!("cairn did not import the bench image within 90 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(cairn)
    }

    pub fn cairn(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(Command::new(binary::cairn_bin()).args(args).arg("--data-dir").arg(&self.data).output()?)
    }

    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    pub fn containerd_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("agent/containerd/containerd.pid")).ok()?.trim().parse().ok()
    }
}

impl Drop for Cairn {
    fn drop(&mut self) {
        // Containers outlive cairn by design: a bench that stopped half way removes its pods first
        // (for at most a minute), or they would keep running and skew the next measurement.
        let _ = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "pods", "--all", "--all-namespaces", "--force", "--grace-period=0", "--wait=false"])
            .output();
        let deadline = Instant::now() + Duration::from_secs(60);
        let sandboxes = |c: &Cairn| {
            c.cairn(&["ctr", "pods"])
                .map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count().saturating_sub(1))
        };
        while sandboxes(self) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Creates the pod and returns its create → Running latency (ms), seen through a watch opened before.
pub async fn start_up(pods: &Api<Pod>, pod: Pod) -> Result<f64> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let version = pods.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
    let params = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(120);
    let mut watch = pods.watch(&params, &version).await?.boxed();
    let at = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(110);
    loop {
        let event = tokio::time::timeout_at(deadline, watch.try_next()).await.context("not Running in time")??;
        if let Some(WatchEvent::Added(p) | WatchEvent::Modified(p)) = event
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        {
            return Ok(at.elapsed().as_secs_f64() * 1000.0);
        }
    }
}

/// Deletes the pod and waits until it is gone from the API.
pub async fn delete_and_wait(pods: &Api<Pod>, name: &str) -> Result<()> {
    let uid = pods.get(name).await?.metadata.uid;
    pods.delete(name, &DeleteParams::default()).await?;
    let gone = await_condition(pods.clone(), name, conditions::is_deleted(uid.as_deref().unwrap_or_default()));
    tokio::time::timeout(Duration::from_secs(60), gone).await.context("pod not gone in time")??;
    Ok(())
}
