//! Workloads benchmark: `cargo bench --bench workloads`.
//!
//! Against one release `cairn server` without its agent, with N fake Nodes (API only, as the
//! scheduler benchmark has them), in one run:
//! 1. the baseline: M pods created straight through the API by 64 clients, from the first create to
//!    the last one bound;
//! 2. a Deployment of M replicas: from its create to the last of its pods created, and to the last
//!    one bound (its ReplicaSet controller makes them in slow-start batches of up to 500 per sync).
//!
//! Reported: pods/s of both, their ratio, and the server's CPU time per pod in each; the
//! difference is what the Deployment and ReplicaSet controllers cost per pod. (Upstream's
//! kube-controller-manager is held to 20 QPS, burst 30, by its client.) Nothing is asserted;
//! figures go to stdout and `target/bench-workloads.json`.
//! Environment: `CAIRN_BENCH_NODES` [30], `CAIRN_BENCH_REPLICAS` [3000], `CAIRN_BENCH_BIN`.

#[path = "common/api_server.rs"]
mod api_server;
#[path = "common/binary.rs"]
mod binary;
#[path = "common/figures.rs"]
mod figures;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use api_server::Cairn;
use figures::env_or;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

fn node(i: usize) -> Node {
    let resources = json!({"cpu": "32", "memory": "256Gi", "pods": "110"});
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i}"), "labels": {"kubernetes.io/hostname": format!("node-{i}")}},
        "status": {"capacity": resources, "allocatable": resources, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

fn template(app: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}},
           "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}})
}

/// When each pod was first seen, by name.
type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// When each pod of `app` was first seen created and first seen bound, from a watch opened now.
struct Seen {
    created: Times,
    bound: Times,
    task: tokio::task::JoinHandle<()>,
}

impl Seen {
    async fn start(pods: &Api<Pod>, app: &str) -> Result<Seen> {
        let rv = pods.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
        let (created, bound): (Times, Times) = (Arc::default(), Arc::default());
        let (c, b, pods, selector) = (created.clone(), bound.clone(), pods.clone(), format!("app={app}"));
        let task = tokio::spawn(async move {
            let note = |p: &Pod| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let now = Instant::now();
                c.lock().unwrap_or_else(|e| e.into_inner()).entry(name.clone()).or_insert(now);
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    b.lock().unwrap_or_else(|e| e.into_inner()).entry(name).or_insert(now);
                }
            };
            api_server::follow_pods(pods, "", &selector, rv, note).await;
        });
        Ok(Seen { created, bound, task })
    }

    fn count(map: &Mutex<HashMap<String, Instant>>) -> usize {
        map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn last(map: &Mutex<HashMap<String, Instant>>) -> Option<Instant> {
        map.lock().unwrap_or_else(|e| e.into_inner()).values().max().copied()
    }

    /// Waits until `n` pods are bound; returns (last created, last bound).
    async fn all_bound(self, n: usize, deadline: Instant) -> Result<(Instant, Instant)> {
        while Self::count(&self.bound) < n {
            if Instant::now() > deadline {
                bail!(
                    "only {} of {n} pods bound in time ({} created)",
                    Self::count(&self.bound),
                    Self::count(&self.created)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.task.abort();
        let now = Instant::now();
        Ok((Self::last(&self.created).unwrap_or(now), Self::last(&self.bound).unwrap_or(now)))
    }
}

struct Run {
    pods_per_sec: f64,
    created_after: Duration,
    bound_after: Duration,
    cpu_per_pod: Duration,
}

impl Run {
    /// Waits for all `n` pods to be bound and sums up the run that began at `start` with the
    /// server's CPU time at `cpu`.
    async fn measured(cairn: &Cairn, seen: Seen, n: usize, start: Instant, cpu: Duration) -> Result<Run> {
        let (created, bound) = seen.all_bound(n, start + Duration::from_secs(300)).await?;
        let cpu = cairn.cpu()? - cpu;
        Ok(Run {
            pods_per_sec: n as f64 / (bound - start).as_secs_f64(),
            created_after: created - start,
            bound_after: bound - start,
            cpu_per_pod: cpu / n as u32,
        })
    }

    fn json(&self) -> Value {
        json!({"pods_per_sec": self.pods_per_sec, "all_created_s": self.created_after.as_secs_f64(),
               "all_bound_s": self.bound_after.as_secs_f64(), "cpu_us_per_pod": self.cpu_per_pod.as_secs_f64() * 1e6})
    }
}

async fn direct(cairn: &Cairn, pods: &Api<Pod>, n: usize) -> Result<Run> {
    let seen = Seen::start(pods, "direct").await?;
    let cpu = cairn.cpu()?;
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let mut pod: Value =
                    json!({"metadata": {"name": format!("direct-{i}")}, "spec": template("direct")["spec"]});
                pod["metadata"]["labels"] = json!({"app": "direct"});
                pods.create(&PostParams::default(), &serde_json::from_value::<Pod>(pod)?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await?;
    Run::measured(cairn, seen, n, start, cpu).await
}

async fn deployment(cairn: &Cairn, client: &kube::Client, pods: &Api<Pod>, n: usize) -> Result<Run> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let seen = Seen::start(pods, "deployed").await?;
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "deployed"},
        "spec": {"replicas": n, "selector": {"matchLabels": {"app": "deployed"}}, "template": template("deployed")}}))?;
    let cpu = cairn.cpu()?;
    let start = Instant::now();
    deployments.create(&PostParams::default(), &d).await?;
    Run::measured(cairn, seen, n, start, cpu).await
}

async fn run(nodes: usize, replicas: usize) -> Result<Value> {
    let cairn = Cairn::start().await?;
    let client = cairn.client().await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eprintln!("creating {nodes} nodes");
    for i in 0..nodes {
        node_api.create(&PostParams::default(), &node(i)).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    eprintln!("{replicas} pods created directly by 64 clients");
    let direct = direct(&cairn, &pods, replicas).await?;
    pods.delete_collection(
        &DeleteParams { grace_period_seconds: Some(0), ..Default::default() },
        &ListParams::default(),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pods.list(&ListParams::default().limit(1)).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("the baseline's pods were not gone in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    eprintln!("a Deployment of {replicas} replicas");
    let deployed = deployment(&cairn, &client, &pods, replicas).await?;
    let controllers = deployed.cpu_per_pod.saturating_sub(direct.cpu_per_pod);
    println!(
        "\n| {replicas} pods on {nodes} nodes | pods/s (to last bound) | all created | all bound | server CPU/pod |"
    );
    println!("|---|---|---|---|---|");
    for (label, r) in [("created by 64 clients", &direct), ("a Deployment", &deployed)] {
        println!(
            "| {label} | {:.0} | {:.2} s | {:.2} s | {:.0} µs |",
            r.pods_per_sec,
            r.created_after.as_secs_f64(),
            r.bound_after.as_secs_f64(),
            r.cpu_per_pod.as_secs_f64() * 1e6
        );
    }
    let ratio = deployed.pods_per_sec / direct.pods_per_sec;
    println!(
        "\nDeployment vs direct: {ratio:.2}x pods/s; controllers' CPU per pod ≈ {:.0} µs",
        controllers.as_secs_f64() * 1e6
    );
    Ok(json!({"nodes": nodes, "replicas": replicas, "direct": direct.json(), "deployment": deployed.json(),
              "deployment_vs_direct": ratio, "controller_cpu_us_per_pod": controllers.as_secs_f64() * 1e6}))
}

fn main() -> Result<()> {
    let (nodes, replicas) = (env_or("CAIRN_BENCH_NODES", 30), env_or("CAIRN_BENCH_REPLICAS", 3000));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let figures = runtime.block_on(run(nodes, replicas))?;
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-workloads.json");
    std::fs::write(&out, serde_json::to_string_pretty(&figures)? + "\n")?;
    println!("JSON: {}", out.display());
    Ok(())
}
