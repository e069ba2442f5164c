//! The node's own endpoint (kubelet's server on `--port`, 10250): HTTPS with a certificate from the
//! cluster CA, answering only the API server's client certificate. It serves `containerLogs` (the
//! API's `pods/log` comes here, so logs are read where the files are), the streaming sessions
//! `exec`, `attach` and `portForward`, which it asks CRI for and passes through to the runtime's
//! streaming server, as kubelet does, and resource usage (`/stats/summary`, `/metrics/resource`).

/// The endpoint's listener and TLS, made before the agent starts (the Node reports the port).
pub struct Listener {
    pub listener: tokio::net::TcpListener,
    pub tls: Arc<rustls::ServerConfig>,
    /// Given the endpoint's router once it is built: the in-process API serves this node from it.
    pub local: Option<Box<dyn FnOnce(Router) + Send>>,
}

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, Request, State};
use axum::http::{Extensions, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use futures::StreamExt as _;
use tokio::task::JoinHandle;

use super::logs::{self, LogOptions};
use super::pods::Pods;
use super::portforward;
use super::sessions::ExecSessions;
use super::spec;
use super::stats::Stats;
use super::status::keys;
use crate::api::PeerCert;
use crate::api::pki::KUBELET_CLIENT_USER;
use crate::runtime::cri::{self, CriError};
use crate::streaming::proxy;

pub fn router(pods: Arc<Pods>, stats: Arc<Stats>, sessions: Arc<ExecSessions>) -> Router {
    let resource_usage = Router::new()
        .route("/stats/summary", axum::routing::get(summary))
        .route("/metrics/resource", axum::routing::get(resource_metrics))
        .with_state(stats);
    Router::new()
        .route("/containerLogs/{namespace}/{pod}/{container}", axum::routing::get(container_logs))
        .route("/exec/{namespace}/{pod}/{container}", axum::routing::any(exec))
        .route("/attach/{namespace}/{pod}/{container}", axum::routing::any(attach))
        .route("/portForward/{namespace}/{pod}", axum::routing::any(port_forward))
        .with_state(pods)
        .layer(Extension(sessions))
        .merge(resource_usage)
        .fallback(|ext: Extensions| async move {
            refusal(&ext).unwrap_or_else(|| text(StatusCode::NOT_FOUND, "404 page not found".into()))
        })
}

/// `GET /stats/summary`: the Summary API (the newest reading of [`Stats`]).
async fn summary(State(stats): State<Arc<Stats>>, ext: Extensions) -> Response {
    if let Some(refused) = refusal(&ext) {
        return refused;
    }
    match serde_json::to_vec(&*stats.summary()) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the summary: {e}")),
    }
}

/// `GET /metrics/resource`: the same figures as Prometheus metrics.
async fn resource_metrics(State(stats): State<Arc<Stats>>, ext: Extensions) -> Response {
    if let Some(refused) = refusal(&ext) {
        return refused;
    }
    let mut resp = super::stats::resource_metrics(&stats.summary()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    resp
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
    if !spec::container_names(&pod).any(|c| c == container) {
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

/// kubelet's streaming options: `input`, `output`, `error`, `tty` and repeated `command`.
struct StreamOptions {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    command: Vec<String>,
}

impl StreamOptions {
    fn from_query(query: &[(String, String)]) -> Self {
        let flag = |name: &str| query.iter().any(|(k, v)| k == name && matches!(v.as_str(), "1" | "true"));
        StreamOptions {
            stdin: flag("input"),
            stdout: flag("output"),
            stderr: flag("error"),
            tty: flag("tty"),
            command: query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect(),
        }
    }
}

/// The ID of the running container `container` of `pod` (kubelet's `findContainer` sees only
/// running ones).
async fn running_container(pods: &Pods, pod: &k8s_openapi::api::core::v1::Pod, container: &str) -> Option<String> {
    let mut labels = spec::uid_selector(spec::uid(pod));
    labels.insert(keys::CONTAINER_NAME.to_string(), container.to_string());
    let filter = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
        label_selector: labels,
        ..Default::default()
    };
    let found = pods.runtime().list_containers(cri::ListContainersRequest { filter: Some(filter) }).await.ok()?;
    found.containers.into_iter().next().map(|c| c.id)
}

/// A CRI error as kubelet's `streaming.WriteError` answers it.
fn runtime_error(e: &CriError) -> Response {
    let code = match e {
        CriError::NotFound { .. } => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(code, e.to_string())
}

/// Passes `req` on to the session the runtime serves at `url` (`http://host:port/path`); the
/// session's task, once it is under way.
async fn stream_to(url: &str, mut req: Request) -> (Response, Option<JoinHandle<()>>) {
    let failed = |m: String| (text(StatusCode::INTERNAL_SERVER_ERROR, m), None);
    let Some((authority, path)) = url.strip_prefix("http://").and_then(|u| u.split_once('/')) else {
        return failed(format!("the runtime's streaming URL {url:?} is not an http:// URL"));
    };
    let tcp = match tokio::net::TcpStream::connect(authority).await {
        Ok(t) => t,
        Err(e) => return failed(format!("connecting to the runtime's streaming server at {authority}: {e}")),
    };
    let _ = tcp.set_nodelay(true);
    let mut upstream = http::Request::new(http_body_util::Empty::new());
    *upstream.method_mut() = req.method().clone();
    *upstream.uri_mut() = match format!("/{path}").parse() {
        Ok(u) => u,
        Err(e) => return failed(format!("the runtime's streaming URL {url:?}: {e}")),
    };
    *upstream.headers_mut() = proxy::forwarded_headers(req.headers());
    let on_upgrade = hyper::upgrade::on(&mut req);
    match proxy::send(tcp, authority, upstream).await {
        Ok(resp) => proxy::join(on_upgrade, resp),
        Err(e) => failed(format!("the runtime's streaming server at {authority}: {e}")),
    }
}

/// A session with one running container.
enum Session {
    /// With what watches exec sessions for processes their clients left behind.
    Exec(Arc<ExecSessions>),
    Attach,
}

/// `/exec/{namespace}/{pod}/{container}`: CRI `Exec`, then its stream.
async fn exec(
    State(pods): State<Arc<Pods>>,
    Extension(sessions): Extension<Arc<ExecSessions>>,
    Path(at): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    container_session(Session::Exec(sessions), &pods, at, &query, req).await
}

/// `/attach/{namespace}/{pod}/{container}`: CRI `Attach`, then its stream.
async fn attach(
    State(pods): State<Arc<Pods>>,
    Path(at): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    container_session(Session::Attach, &pods, at, &query, req).await
}

async fn container_session(
    kind: Session,
    pods: &Pods,
    (namespace, name, container): (String, String, String),
    query: &[(String, String)],
    req: Request,
) -> Response {
    if let Some(refused) = refusal(req.extensions()) {
        return refused;
    }
    let Some(pod) = pods.find(&namespace, &name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist".into());
    };
    let Some(id) = running_container(pods, &pod, &container).await else {
        // kubelet's texts (`GetExec`, `GetAttach`).
        let message = match kind {
            Session::Exec(_) => format!("container not found ({container:?})"),
            Session::Attach => format!("container {container} not found in pod {name}_{namespace}"),
        };
        return text(StatusCode::INTERNAL_SERVER_ERROR, message);
    };
    let o = StreamOptions::from_query(query);
    let (stdin, tty, stdout, stderr) = (o.stdin, o.tty, o.stdout, o.stderr);
    match kind {
        Session::Exec(sessions) => {
            let starting = sessions.starting(&id).await;
            let cmd = o.command.clone();
            let r = cri::ExecRequest { container_id: id, cmd, tty, stdin, stdout, stderr };
            let url = match pods.runtime().exec(r).await {
                Ok(r) => r.url,
                Err(e) => return runtime_error(&e),
            };
            let (resp, session) = stream_to(&url, req).await;
            if let (Some(session), Some(starting)) = (session, starting) {
                let what = format!("pod {namespace}/{name} container {container}");
                sessions.watch(starting, o.command, what, session);
            }
            resp
        }
        Session::Attach => {
            let r = cri::AttachRequest { container_id: id, stdin, tty, stdout, stderr };
            match pods.runtime().attach(r).await {
                Ok(r) => stream_to(&r.url, req).await.0,
                Err(e) => runtime_error(&e),
            }
        }
    }
}

/// `/portForward/{namespace}/{pod}`: served here over SPDY (see `portforward.rs`), into the network
/// namespace of the pod's ready sandbox.
async fn port_forward(
    State(pods): State<Arc<Pods>>,
    Path((namespace, name)): Path<(String, String)>,
    mut req: Request,
) -> Response {
    if let Some(refused) = refusal(req.extensions()) {
        return refused;
    }
    let Some(pod) = pods.find(&namespace, &name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist".into());
    };
    let headers = req.headers();
    let wants = |name: header::HeaderName, value: &str| {
        headers.get_all(name).iter().any(|v| v.to_str().is_ok_and(|v| v.to_ascii_lowercase().contains(value)))
    };
    if !wants(header::UPGRADE, "spdy/3.1") || !wants(HeaderName::from_static("x-stream-protocol-version"), PROTOCOL) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("port-forward needs an upgrade to SPDY/3.1 with protocol {PROTOCOL}"),
        );
    }
    let filter = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
        label_selector: spec::uid_selector(spec::uid(&pod)),
        ..Default::default()
    };
    let sandboxes = pods.runtime().list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await;
    let Some(sandbox) = sandboxes.ok().and_then(|s| s.items.into_iter().next()) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("pod not found (\"{name}_{namespace}\")"));
    };
    let netns = match sandbox_netns(&pods, &sandbox.id).await {
        Ok(path) => path,
        Err(m) => return text(StatusCode::INTERNAL_SERVER_ERROR, m),
    };
    let target = portforward::Target { netns, sandbox_id: sandbox.id };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => portforward::serve(hyper_util::rt::TokioIo::new(io), target).await,
            Err(e) => tracing::debug!("port-forward upgrade failed: {e}"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    h.insert(HeaderName::from_static("x-stream-protocol-version"), HeaderValue::from_static(PROTOCOL));
    resp
}

/// The port-forward protocol kubectl speaks over SPDY.
const PROTOCOL: &str = "portforward.k8s.io";

/// The network namespace of a sandbox: containerd's runtime spec names it (the verbose status).
async fn sandbox_netns(pods: &Pods, id: &str) -> Result<std::path::PathBuf, String> {
    let status = pods
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true })
        .await
        .map_err(|e| e.to_string())?;
    let info: serde_json::Value =
        status.info.get("info").and_then(|i| serde_json::from_str(i).ok()).unwrap_or_default();
    let namespaces = info["runtimeSpec"]["linux"]["namespaces"].as_array().cloned().unwrap_or_default();
    if let Some(path) = namespaces.iter().find(|n| n["type"] == "network").and_then(|n| n["path"].as_str()) {
        return Ok(path.into());
    }
    match info["pid"].as_u64() {
        Some(pid) if pid > 0 => Ok(format!("/proc/{pid}/ns/net").into()),
        _ => Err(format!("the runtime does not say where the network namespace of sandbox {id} is")),
    }
}
