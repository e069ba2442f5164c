//! `metrics.k8s.io/v1beta1` served by cairn itself, as metrics-server serves it (so `kubectl top`
//! works with no add-on): NodeMetrics and PodMetrics built, at each request, from the Summary API of
//! the nodes concerned (`/stats/summary` on their node endpoints: usage over the node's last
//! sampling window). A node that does not answer, and a pod not every container of which has a
//! rate yet, is left out, as metrics-server leaves them out.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse as _, Response};
use futures::future::join_all;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use super::AppState;
use super::codec;
use super::discovery::Listed;
use super::handlers::selectors;
use crate::agent::stats::{self, PodStats, Summary};
use crate::registry::selector::{FieldSelector, LabelSelector};
use crate::registry::{GroupResource, ListOptions, ResourceInfo, StatusError};

type Result<T> = std::result::Result<T, StatusError>;

const GROUP: &str = "metrics.k8s.io";
const VERSION: &str = "v1beta1";
/// How long a node has to answer (metrics-server's scrape timeout is 10 s).
const NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a Summary read from a node.
const MAX_SUMMARY: usize = 16 << 20;

const fn info(kind: &'static str, plural: &'static str, namespaced: bool) -> ResourceInfo {
    ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind,
        plural,
        singular: "",
        namespaced,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "",
        return_deleted_object: false,
    }
}

const NODES: ResourceInfo = info("NodeMetrics", "nodes", false);
const PODS: ResourceInfo = info("PodMetrics", "pods", true);

/// What discovery lists for the group.
pub const LISTED: [Listed<'static>; 2] =
    [Listed { info: &NODES, verbs: &["get", "list"] }, Listed { info: &PODS, verbs: &["get", "list"] }];

pub fn routes() -> axum::Router<Arc<AppState>> {
    use axum::routing::any;
    let root = format!("/apis/{GROUP}/{VERSION}");
    axum::Router::new()
        .route(&format!("{root}/nodes"), any(nodes))
        .route(&format!("{root}/nodes/{{name}}"), any(node))
        .route(&format!("{root}/pods"), any(all_pods))
        .route(&format!("{root}/namespaces/{{namespace}}/pods"), any(pods))
        .route(&format!("{root}/namespaces/{{namespace}}/pods/{{name}}"), any(pod))
}

fn answer(method: &Method, result: impl FnOnce() -> Result<Value>) -> Response {
    if method != Method::GET {
        return StatusError::method_not_allowed().into_response();
    }
    match result() {
        Ok(v) => codec::json_value(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": format!("{GROUP}/{VERSION}"), "metadata": {}, "items": items})
}

async fn nodes(State(state): State<Arc<AppState>>, method: Method, Query(q): Query<Vec<(String, String)>>) -> Response {
    let found = match selectors(&q) {
        Ok((labels, fields)) => node_metrics(&state, None, labels, fields).await,
        Err(e) => Err(e),
    };
    answer(&method, || Ok(list("NodeMetrics", found?)))
}

async fn node(State(state): State<Arc<AppState>>, method: Method, Path(name): Path<String>) -> Response {
    let found = node_metrics(&state, Some(&name), LabelSelector::default(), FieldSelector::default()).await;
    answer(&method, || found?.pop().ok_or_else(|| StatusError::not_found(&group_resource("nodemetrics"), &name)))
}

async fn all_pods(State(state): State<Arc<AppState>>, method: Method, q: Query<Vec<(String, String)>>) -> Response {
    pod_list(&state, method, None, q).await
}

async fn pods(
    State(state): State<Arc<AppState>>,
    method: Method,
    Path(namespace): Path<String>,
    q: Query<Vec<(String, String)>>,
) -> Response {
    pod_list(&state, method, Some(namespace), q).await
}

async fn pod_list(
    state: &AppState,
    method: Method,
    ns: Option<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let found = match selectors(&q) {
        Ok((labels, fields)) => pod_metrics(state, ns.as_deref(), None, labels, fields).await,
        Err(e) => Err(e),
    };
    answer(&method, || Ok(list("PodMetrics", found?)))
}

async fn pod(
    State(state): State<Arc<AppState>>,
    method: Method,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let found = pod_metrics(&state, Some(&namespace), Some(&name), LabelSelector::default(), FieldSelector::default());
    let found = found.await;
    answer(&method, || found?.pop().ok_or_else(|| StatusError::not_found(&group_resource("podmetrics"), &name)))
}

fn group_resource(resource: &str) -> GroupResource {
    GroupResource { group: GROUP.into(), resource: resource.into() }
}

/// The stored objects of `resource` selected (one by `name`, if given).
fn objects(
    state: &AppState,
    resource: &str,
    ns: Option<&str>,
    name: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
) -> Result<Vec<Value>> {
    let r = state.registry.find("", "v1", resource).ok_or_else(StatusError::no_route)?;
    if let Some(name) = name {
        return match state.registry.get_value(&r, ns, name) {
            Ok(v) => Ok(vec![v]),
            Err(e) if e.code == 404 => Ok(vec![]),
            Err(e) => Err(e),
        };
    }
    let page = state.registry.list(&r, ns, &ListOptions { labels, fields, limit: None, continue_token: None })?;
    page.items.iter().map(|b| serde_json::from_slice(b).map_err(StatusError::internal)).collect()
}

/// The Summary of each node named, fetched concurrently; a node that fails is logged and left out.
async fn summaries(state: &AppState, nodes: Vec<String>) -> Vec<(String, Summary)> {
    let Some(client) = state.node_client.get() else { return vec![] };
    let fetch = |node: String| async move {
        let read = async {
            let resp = client.get(&state.registry, &node, "/stats/summary").await?;
            let body = http_body_util::Limited::new(resp.into_body(), MAX_SUMMARY)
                .collect()
                .await
                .map_err(|e| StatusError::service_unavailable(format!("reading the summary: {e}")))?;
            serde_json::from_slice::<Summary>(&body.to_bytes())
                .map_err(|e| StatusError::service_unavailable(format!("decoding the summary: {e}")))
        };
        match tokio::time::timeout(NODE_TIMEOUT, read).await {
            Ok(Ok(summary)) => Some((node, summary)),
            Ok(Err(e)) => {
                tracing::debug!("metrics: node {node}: {}", e.message);
                None
            }
            Err(_) => {
                tracing::debug!("metrics: node {node} did not answer within {NODE_TIMEOUT:?}");
                None
            }
        }
    };
    join_all(nodes.into_iter().map(fetch)).await.into_iter().flatten().collect()
}

/// The metadata of a metrics object: the name, namespace and labels of what it measures.
fn metadata(obj: &Value) -> Value {
    let mut meta =
        json!({"name": obj["metadata"]["name"], "creationTimestamp": crate::registry::timestamp(chrono::Utc::now())});
    if let Some(ns) = obj["metadata"].get("namespace") {
        meta["namespace"] = ns.clone();
    }
    if let Some(labels) = obj["metadata"].get("labels") {
        meta["labels"] = labels.clone();
    }
    meta
}

fn window() -> String {
    format!("{}s", stats::PERIOD.as_secs())
}

async fn node_metrics(
    state: &AppState,
    name: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
) -> Result<Vec<Value>> {
    let nodes = objects(state, "nodes", None, name, labels, fields)?;
    let names = nodes.iter().filter_map(|n| n["metadata"]["name"].as_str().map(String::from)).collect();
    let summaries = summaries(state, names).await;
    Ok(nodes
        .iter()
        .filter_map(|n| {
            let (_, s) = summaries.iter().find(|(name, _)| n["metadata"]["name"] == *name)?;
            let (cpu, memory) = (s.node.cpu.as_ref()?, s.node.memory.as_ref()?);
            Some(json!({
                "metadata": metadata(n),
                "timestamp": cpu.time,
                "window": window(),
                "usage": {"cpu": cpu_quantity(cpu.usage_nano_cores?), "memory": memory_quantity(memory.working_set_bytes?)},
            }))
        })
        .collect())
}

async fn pod_metrics(
    state: &AppState,
    ns: Option<&str>,
    name: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
) -> Result<Vec<Value>> {
    let pods = objects(state, "pods", ns, name, labels, fields)?;
    let mut nodes: Vec<String> = pods.iter().filter_map(|p| p["spec"]["nodeName"].as_str().map(String::from)).collect();
    nodes.sort();
    nodes.dedup();
    let summaries = summaries(state, nodes).await;
    let by_uid = |uid: &str| summaries.iter().flat_map(|(_, s)| &s.pods).find(|p| p.pod_ref.uid == uid);
    Ok(pods
        .iter()
        .filter_map(|p| {
            let measured = by_uid(p["metadata"]["uid"].as_str()?)?;
            let (timestamp, containers) = container_usage(measured)?;
            Some(json!({"metadata": metadata(p), "timestamp": timestamp, "window": window(), "containers": containers}))
        })
        .collect())
}

/// Each container's usage, and the newest time among them; none unless every container has a
/// CPU rate and a working set (metrics-server drops such a pod).
fn container_usage(pod: &PodStats) -> Option<(Value, Vec<Value>)> {
    let mut newest = None;
    let mut out = Vec::new();
    for c in &pod.containers {
        let (cpu, memory) = (c.cpu.as_ref()?, c.memory.as_ref()?);
        newest = newest.max(Some(cpu.time.clone()));
        out.push(json!({"name": c.name, "usage": {
            "cpu": cpu_quantity(cpu.usage_nano_cores?),
            "memory": memory_quantity(memory.working_set_bytes?),
        }}));
    }
    Some((serde_json::to_value(newest?).ok()?, out))
}

/// Nanocores as a canonical decimal quantity (`250m`, `1`, `1234n`), as metrics-server's
/// `NewScaledQuantity(n, Nano)` prints.
fn cpu_quantity(nanocores: u64) -> String {
    match nanocores {
        0 => "0".into(),
        n if n.is_multiple_of(1_000_000_000) => (n / 1_000_000_000).to_string(),
        n if n.is_multiple_of(1_000_000) => format!("{}m", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}u", n / 1_000),
        n => format!("{n}n"),
    }
}

/// Bytes as a canonical binary quantity (`1536Ki`, `2Gi`, or plain bytes).
fn memory_quantity(bytes: u64) -> String {
    let suffixes = [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    match suffixes.iter().find(|(_, shift)| bytes != 0 && bytes.is_multiple_of(1u64 << shift)) {
        Some((suffix, shift)) => format!("{}{suffix}", bytes >> shift),
        None => bytes.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stats::{ContainerStats, CpuStats, MemoryStats};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
        assert_eq!(cpu_quantity(250_000_000), "250m");
        assert_eq!(cpu_quantity(3_000), "3u");
        assert_eq!(cpu_quantity(123_456_789), "123456789n");
        assert_eq!(memory_quantity(1536 * 1024), "1536Ki");
        assert_eq!(memory_quantity(2 << 30), "2Gi");
        assert_eq!(memory_quantity(1000), "1000");
        assert_eq!(memory_quantity(0), "0");
    }

    #[test]
    fn a_pod_needs_a_rate_for_every_container() {
        let time = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let container = |name: &str, rate: Option<u64>| ContainerStats {
            name: name.into(),
            start_time: None,
            cpu: Some(CpuStats { time: time.clone(), usage_nano_cores: rate, usage_core_nano_seconds: Some(5) }),
            memory: Some(MemoryStats {
                time: time.clone(),
                available_bytes: None,
                usage_bytes: None,
                working_set_bytes: Some(4096),
                rss_bytes: None,
            }),
            rootfs: None,
        };
        let pod =
            PodStats { containers: vec![container("a", Some(5_000_000)), container("b", None)], ..Default::default() };
        assert!(container_usage(&pod).is_none());
        let pod = PodStats { containers: vec![container("a", Some(5_000_000))], ..Default::default() };
        let (timestamp, containers) = container_usage(&pod).unwrap();
        assert_eq!(timestamp, "2023-11-14T22:13:20Z");
        assert_eq!(containers, [json!({"name": "a", "usage": {"cpu": "5m", "memory": "4Ki"}})]);
    }
}
