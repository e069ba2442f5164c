//! A release `cairn server` without its node agent (API, scheduler and controllers), in a temporary
//! data directory, for benchmarks that work through the API alone (include with
//! `#[path = "common/api_server.rs"] mod api_server;` beside `binary`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use super::binary;

pub struct Cairn {
    child: Child,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Drop for Cairn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cairn {
    pub async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let child = Command::new(binary::cairn_bin())
            .args([
                "server",
                "--disable-agent",
                "--bind-address",
                "127.0.0.1",
                "--https-listen-port",
                "0",
                "--log",
                "warn",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting cairn")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.exists() {
            if Instant::now() > deadline {
                bail!("cairn did not write its kubeconfig in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Cairn { child, _dir: dir, kubeconfig })
    }

    /// A client, once the API answers.
    pub async fn client(&self) -> Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let client = kube::Client::try_from(config)?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = nodes.list(&kube::api::ListParams::default().limit(1)).await {
            if Instant::now() > deadline {
                bail!("cairn did not answer in 30 s: {e}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(client)
    }

    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")
    }

    /// CPU time the server has used so far (user + system).
    pub fn cpu(&self) -> Result<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed /proc stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
            .context("no utime/stime")?;
        // SAFETY: sysconf only reads a constant of the running system.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Ok(Duration::from_millis(ticks * 1000 / hz))
    }
}

/// Calls `note` for every pod added or changed from resourceVersion `rv` on, among those a field
/// selector and a label selector (either may be empty) pick. Should the watch fall behind (410), a
/// list catches up and the watch resumes from it. Runs until the task is aborted.
pub async fn follow_pods(pods: Api<Pod>, fields: &str, labels: &str, mut rv: String, note: impl Fn(&Pod)) {
    let (mut list, mut watch) = (ListParams::default(), WatchParams::default().timeout(290));
    if !fields.is_empty() {
        (list, watch) = (list.fields(fields), watch.fields(fields));
    }
    if !labels.is_empty() {
        (list, watch) = (list.labels(labels), watch.labels(labels));
    }
    loop {
        if let Ok(stream) = pods.watch(&watch, &rv).await {
            let mut stream = stream.boxed();
            while let Some(Ok(ev)) = stream.next().await {
                match ev {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) => note(&p),
                    WatchEvent::Error(_) => break,
                    _ => {}
                }
            }
        }
        let Ok(items) = pods.list(&list).await else { return };
        items.items.iter().for_each(&note);
        rv = items.metadata.resource_version.unwrap_or_default();
    }
}
