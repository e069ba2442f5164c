//! Storage benchmark: `cargo bench --bench storage` (root, containerd, runc and busybox-static needed).
//!
//! In one run, against one `cairn server` with its agent:
//! 1. Claim created → Bound on an `Immediate` class of the built-in driver (provisioning through CSI
//!    and binding), one at a time.
//! 2. Pod start-up, create → Running through a watch, one at a time: a pod with an emptyDir (the
//!    baseline) and a pod with a claim of the default `local-path` class (WaitForFirstConsumer:
//!    scheduling, provisioning, binding, staging and publishing on the way), alternated so that both
//!    see the same machine.
//! 3. 200 claims created at once on the `Immediate` class: time until all are Bound.
//!
//! Nothing is asserted; figures go to stdout and `target/bench-storage.json`.
//! Environment: `CAIRN_BENCH_RUNS` [50] samples of 1 and 2; `CAIRN_BENCH_CLAIMS` [200];
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

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use busybox::BUSYBOX;
use figures::{env_or, summary};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::NamespaceResourceScope;
use node::Cairn;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn claim(name: &str, class: &str) -> Result<PersistentVolumeClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "storage"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": "16Mi"}}}
    }))?)
}

fn pod(name: &str, volume: Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "storage"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "main", "image": BUSYBOX,
            "imagePullPolicy": "IfNotPresent", "command": ["/bin/sleep", "3600"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [volume]}
    }))?)
}

/// Creates the objects at once and returns each one's create-to-`done` latency (ms), observed
/// through a watch opened before the creates.
async fn timed<K>(api: &Api<K>, objects: Vec<K>, done: impl Fn(&K) -> bool) -> Result<Vec<f64>>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let version = api.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
    let mut watch = api.watch(&WatchParams::default().labels("bench=storage").timeout(290), &version).await?.boxed();
    let creates = futures::future::try_join_all(objects.iter().map(|o| async move {
        let at = Instant::now();
        api.create(&PostParams::default(), o).await?;
        anyhow::Ok((o.meta().name.clone().unwrap_or_default(), at))
    }))
    .await?;
    let created: HashMap<String, Instant> = creates.into_iter().collect();
    let mut latencies = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(280);
    while latencies.len() < created.len() {
        let event =
            tokio::time::timeout_at(deadline, watch.try_next()).await.context("not all were done in time")??;
        let Some(WatchEvent::Added(o) | WatchEvent::Modified(o)) = event else { continue };
        let name = o.meta().name.clone().unwrap_or_default();
        if let (true, Some(at)) = (done(&o), created.get(&name))
            && !latencies.contains_key(&name)
        {
            latencies.insert(name, at.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(latencies.into_values().collect())
}

fn bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Deletes every benchmark pod and claim and waits until the claims' volumes are gone too.
async fn clean(client: &kube::Client) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let selected = ListParams::default().labels("bench=storage");
    pods.delete_collection(&DeleteParams::default(), &selected).await?;
    claims.delete_collection(&DeleteParams::default(), &selected).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !(pods.list(&selected).await?.items.is_empty()
        && claims.list(&selected).await?.items.is_empty()
        && volumes.list(&ListParams::default()).await?.items.is_empty())
    {
        if Instant::now() > deadline {
            bail!("pods, claims and volumes were not gone within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let runs = env_or("CAIRN_BENCH_RUNS", 50);
    let many = env_or("CAIRN_BENCH_CLAIMS", 200);
    let cairn = Cairn::start("10.45.0.0/16")?;
    let client = cairn.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "now"}, "provisioner": "hostpath.csi.cairn.io", "volumeBindingMode": "Immediate"
    }))?;
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await?;
    // Let start-up settle (first heartbeat, driver registration) before measuring.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let mut to_bound = vec![];
    for i in 0..runs {
        to_bound.extend(timed(&claims, vec![claim(&format!("bound-{i}"), "now")?], bound).await?);
    }
    let to_bound = summary(to_bound);
    println!("claim created -> Bound (Immediate): {to_bound}");
    clean(&client).await?;

    let (mut empty_dir, mut with_claim) = (vec![], vec![]);
    for i in 0..runs {
        let scratch = pod(&format!("empty-{i}"), json!({"name": "data", "emptyDir": {}}))?;
        empty_dir.extend(timed(&pods, vec![scratch], running).await?);
        claims.create(&PostParams::default(), &claim(&format!("claim-{i}"), "local-path")?).await?;
        let claimed = pod(
            &format!("claimed-{i}"),
            json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("claim-{i}")}}),
        )?;
        with_claim.extend(timed(&pods, vec![claimed], running).await?);
    }
    let (empty_dir, with_claim) = (summary(empty_dir), summary(with_claim));
    let ratio = |k: &str| with_claim[k].as_f64().unwrap_or(f64::NAN) / empty_dir[k].as_f64().unwrap_or(f64::NAN);
    let (ratio_p50, ratio_p99) = (ratio("p50_ms"), ratio("p99_ms"));
    println!("pod with an emptyDir -> Running: {empty_dir}");
    println!("pod with a local-path claim -> Running: {with_claim} ({ratio_p50:.2}x p50, {ratio_p99:.2}x p99)");
    clean(&client).await?;

    let started = Instant::now();
    let batch: Vec<PersistentVolumeClaim> =
        (0..many).map(|i| claim(&format!("many-{i}"), "now")).collect::<Result<_>>()?;
    let many_bound = summary(timed(&claims, batch, bound).await?);
    let all_bound_s = started.elapsed().as_secs_f64();
    println!("{many} claims at once: all Bound after {all_bound_s:.1} s ({many_bound})");
    clean(&client).await?;

    let report = json!({
        "claim_to_bound_immediate": to_bound,
        "pod_empty_dir_to_running": empty_dir,
        "pod_with_claim_to_running": with_claim,
        "pod_with_claim_vs_empty_dir": {"p50": ratio_p50, "p99": ratio_p99},
        "claims_at_once": many,
        "claims_at_once_all_bound_s": all_bound_s,
        "claims_at_once_latency": many_bound,
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-storage.json");
    std::fs::write(&out, serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
