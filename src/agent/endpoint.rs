//! The node's own endpoint (kubelet's server on `--port`, 10250): HTTPS with a certificate from the
//! cluster CA, answering only the API server's client certificate. It serves `containerLogs`; the
//! API's `pods/log` comes here, so logs are read where the files are.

/// The endpoint's listener and TLS, made before the agent starts (the Node reports the port).
pub struct Listener {
    pub listener: tokio::net::TcpListener,
    pub tls: Arc<rustls::ServerConfig>,
}

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{Extensions, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use futures::StreamExt as _;

use super::logs::{self, LogOptions};
use super::pods::Pods;
use super::spec;
use crate::api::PeerCert;
use crate::api::pki::KUBELET_CLIENT_USER;

pub fn router(pods: Arc<Pods>) -> Router {
    Router::new()
        .route("/containerLogs/{namespace}/{pod}/{container}", axum::routing::get(container_logs))
        .fallback(|ext: Extensions| async move {
            refusal(&ext).unwrap_or_else(|| text(StatusCode::NOT_FOUND, "404 page not found".into()))
        })
        .with_state(pods)
}

fn text(code: StatusCode, message: String) -> Response {
    let mut resp = (code, message).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

/// kubelet's authentication (anonymous requests refused, as k3s runs it) and authorization (only
/// the API server's identity may proxy): the answer to a request refused.
fn refusal(ext: &Extensions) -> Option<Response> {
    match ext.get::<PeerCert>().and_then(|p| p.0.as_ref()) {
        None => Some(text(StatusCode::UNAUTHORIZED, "Unauthorized".into())),
        Some(user) if user.name == KUBELET_CLIENT_USER => None,
        Some(user) => Some(text(
            StatusCode::FORBIDDEN,
            format!("Forbidden (user={}, verb=get, resource=nodes, subresource=proxy)", user.name),
        )),
    }
}

/// `GET /containerLogs/{namespace}/{pod}/{container}` with `PodLogOptions` as query parameters.
async fn container_logs(
    State(pods): State<Arc<Pods>>,
    Path((namespace, name, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    ext: Extensions,
) -> Response {
    if let Some(refused) = refusal(&ext) {
        return refused;
    }
    let bad = |m: String| text(StatusCode::BAD_REQUEST, m);
    let Some(pod) = pods.find(&namespace, &name) else {
        return text(StatusCode::NOT_FOUND, format!("pod {name:?} does not exist"));
    };
    let spec = pod.spec.clone().unwrap_or_default();
    if !spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| c.name == container) {
        return text(StatusCode::NOT_FOUND, format!("container {container:?} not found in pod {name:?}"));
    }
    let opts = match LogOptions::from_query(&query, chrono::Utc::now()) {
        Ok(o) => o,
        Err(e) => return bad(e.to_string()),
    };
    let run = match logs::which_run(&pod, &container, opts.previous) {
        Ok(run) => run,
        Err(m) => return bad(m),
    };
    let path = pods.log_dir(&pod).join(spec::log_path(&container, run));
    if !path.exists() {
        return bad(format!(
            "the log of container \"{container}\" in pod \"{name}\" is not available (it may have been removed)"
        ));
    }
    // Following ends once that run of the container is no longer running (a previous run has).
    let (uid, id, previous) = (spec::uid(&pod).to_string(), logs::container_id(&pod, &container), opts.previous);
    let alive = move || {
        !previous
            && pods
                .find(&namespace, &name)
                .is_some_and(|now| logs::still_running(&now, &uid, &container, id.as_deref()))
    };
    let mut resp = Response::new(Body::from_stream(logs::read(path, opts, alive).boxed()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}
