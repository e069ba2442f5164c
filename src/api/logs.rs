//! `GET /api/v1/namespaces/{ns}/pods/{name}/log`, as kube-apiserver serves it: the options are
//! validated and the container chosen here (`pod.LogLocation`), then the request goes to the node
//! endpoint of the pod's node (`containerLogs`), whose answer is streamed back.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use k8s_openapi::api::core::v1::Pod;

use super::AppState;
use crate::agent::logs::{LogOptions, LogOptionsError};
use crate::agent::spec;
use crate::registry::StatusError;

type Result<T> = std::result::Result<T, StatusError>;

pub(super) fn get_pod(state: &AppState, ns: &str, name: &str) -> Result<Pod> {
    let pods = state.registry.find("", "v1", "pods").ok_or_else(StatusError::no_route)?;
    let value = state.registry.get_value(&pods, Some(ns), name)?;
    serde_json::from_value(value).map_err(|e| StatusError::internal(format!("stored pod {ns}/{name}: {e}")))
}

/// The container a request means, as kube-apiserver's `validateContainer`: the one named (of any
/// kind, ephemeral ones included), or the only regular one. (kubectl resolves the
/// default-container annotation itself and always names one.)
pub(super) fn container_name(pod: &Pod, asked: Option<&str>) -> Result<String> {
    let name = spec::name(pod);
    let all: Vec<&str> = spec::container_names(pod).collect();
    let apps = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    match asked.filter(|a| !a.is_empty()) {
        Some(c) if all.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(StatusError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None => match apps {
            [only] => Ok(only.name.clone()),
            [] => Err(StatusError::bad_request(format!("a container name must be specified for pod {name}"))),
            _ => Err(StatusError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                all.join(" ")
            ))),
        },
    }
}

pub async fn pod_log(state: &AppState, ns: &str, name: &str, query: &[(String, String)]) -> Result<Response> {
    let pod = get_pod(state, ns, name)?;
    LogOptions::from_query(query, chrono::Utc::now()).map_err(|e| match e {
        LogOptionsError::BadRequest(message) => StatusError::bad_request(message),
        LogOptionsError::Invalid(errs) => StatusError::invalid("PodLogOptions", "", name, &errs),
    })?;
    let asked = query.iter().find(|(k, _)| k == "container").map(|(_, v)| v.as_str());
    let container = container_name(&pod, asked)?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
    let text = |body: Body| {
        let mut resp = Response::new(body);
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        resp
    };
    // A pod not yet placed has no log (upstream answers an empty one).
    if node.is_empty() {
        return Ok(text(Body::empty()));
    }
    let Some(nodes) = state.node_client.get() else {
        return Err(StatusError::service_unavailable("this server does not reach node endpoints"));
    };
    let path = {
        let mut params = form_urlencoded::Serializer::new(String::new());
        for (k, v) in query.iter().filter(|(k, _)| k != "container") {
            params.append_pair(k, v);
        }
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        format!("/containerLogs/{}/{}/{}?{}", enc(ns), enc(name), enc(&container), params.finish())
    };
    let resp = nodes.get(&state.registry, node, &path).await?;
    let mut out = text(Body::new(resp.into_body()));
    *out.status_mut() = StatusCode::OK;
    Ok(out)
}
