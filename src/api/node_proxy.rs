//! `nodes/{name}/proxy/{path}`, as kube-apiserver's node proxy: the request goes to the node's
//! endpoint and its answer comes back as it is (`kubectl get --raw
//! /api/v1/nodes/NODE/proxy/stats/summary`). The node endpoint serves reads, so only GET is passed on.

use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use http::header;

use super::AppState;
use crate::registry::StatusError;

type Result<T> = std::result::Result<T, StatusError>;

pub async fn node_proxy(state: &AppState, node: &str, path: &str, req: Request) -> Result<Response> {
    if req.method() != Method::GET {
        return Err(StatusError::method_not_allowed());
    }
    let client =
        state.node_client.get().ok_or_else(|| StatusError::service_unavailable("node endpoints are not set up yet"))?;
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut upstream = http::Request::get(format!("/{path}{query}"))
        .body(http_body_util::Empty::new())
        .map_err(|e| StatusError::bad_request(format!("proxy path {path:?}: {e}")))?;
    if let Some(accept) = req.headers().get(header::ACCEPT) {
        upstream.headers_mut().insert(header::ACCEPT, accept.clone());
    }
    let resp = client.send(&state.registry, node, upstream).await?;
    Ok(resp.map(Body::new))
}
