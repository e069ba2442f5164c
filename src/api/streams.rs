//! `pods/exec`, `pods/attach` and `pods/portforward`, as kube-apiserver serves them: the pod and
//! container are checked here (`pod.ExecLocation`, `AttachLocation`, `PortForwardLocation`), then
//! the session goes to the node endpoint of the pod's node. SPDY clients and WebSocket clients of
//! the older channel protocols are passed through as they are (`UpgradeAwareHandler`: the node's
//! runtime speaks them); `v5.channel.k8s.io` is translated onto SPDY (`StreamTranslatorHandler`)
//! and port-forward's WebSocket tunnel unwrapped to the SPDY it carries (`TunnelingHandler`).

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use super::AppState;
use super::logs::{container_name, get_pod};
use super::node_client::{NodeStream, error_of};
use crate::registry::{StatusError, Subresource};
use crate::streaming::proxy;
use crate::streaming::websocket::{self, SPDY_TUNNEL, Streams, V5_CHANNEL};

type Result<T> = std::result::Result<T, StatusError>;

/// How a session reaches the node.
enum Mode {
    /// Passed through: SPDY, or a WebSocket protocol the runtime speaks.
    Proxy,
    /// WebSocket `v5.channel.k8s.io` onto SPDY `v4.channel.k8s.io`.
    Translate(Streams),
    /// WebSocket-carried SPDY onto SPDY `portforward.k8s.io`.
    Tunnel,
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A boolean option of `PodExecOptions` / `PodAttachOptions` (absent: false).
fn flag(query: &[(String, String)], name: &str) -> Result<bool> {
    match param(query, name) {
        None => Ok(false),
        Some("true" | "1" | "True" | "TRUE") => Ok(true),
        Some("false" | "0" | "False" | "FALSE" | "") => Ok(false),
        Some(v) => Err(StatusError::bad_request(format!("invalid value {v:?} for {name}: not a boolean"))),
    }
}

pub async fn connect(
    state: &AppState,
    ns: &str,
    name: &str,
    sub: Subresource,
    query: &[(String, String)],
    req: Request,
) -> Result<Response> {
    if !proxy::is_upgrade(req.headers()) {
        return Err(StatusError::bad_request("Upgrade request required"));
    }
    let pod = get_pod(state, ns, name)?;
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    // The node's query, built where no await follows: the serializer is not Send.
    let (path, streams) = {
        let mut params = form_urlencoded::Serializer::new(String::new());
        let (path, streams) = match sub {
            Subresource::PortForward => {
                for port in query.iter().filter(|(k, _)| k == "ports").flat_map(|(_, v)| v.split(',')) {
                    params.append_pair("port", port.trim());
                }
                (format!("/portForward/{}/{}", enc(ns), enc(name)), Streams::default())
            }
            _ => {
                let container = container_name(&pod, param(query, "container"))?;
                let streams = Streams {
                    stdin: flag(query, "stdin")?,
                    stdout: flag(query, "stdout")?,
                    stderr: flag(query, "stderr")?,
                    tty: flag(query, "tty")?,
                };
                if !(streams.stdin || streams.stdout || streams.stderr) {
                    return Err(StatusError::bad_request("you must specify at least 1 of stdin, stdout, stderr"));
                }
                let verb = if sub == Subresource::Exec { "exec" } else { "attach" };
                if sub == Subresource::Exec {
                    let command: Vec<&str> =
                        query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.as_str()).collect();
                    if command.is_empty() {
                        return Err(StatusError::bad_request("you must specify at least 1 command"));
                    }
                    for c in command {
                        params.append_pair("command", c);
                    }
                }
                for (set, key) in [(streams.stdin, "input"), (streams.stdout, "output"), (streams.stderr, "error")] {
                    if set {
                        params.append_pair(key, "1");
                    }
                }
                if streams.tty {
                    params.append_pair("tty", "1");
                }
                (format!("/{verb}/{}/{}/{}", enc(ns), enc(name), enc(&container)), streams)
            }
        };
        (format!("{path}?{}", params.finish()), streams)
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
    if node.is_empty() {
        return Err(StatusError::bad_request(format!("pod {name} does not have a host assigned")));
    }
    let Some(nodes) = state.node_client.get() else {
        return Err(StatusError::service_unavailable("this server does not reach node endpoints"));
    };
    let offered = websocket::offered(req.headers());
    let mode = match sub {
        Subresource::PortForward if offered.iter().any(|p| p == SPDY_TUNNEL) => Mode::Tunnel,
        Subresource::Exec | Subresource::Attach if offered.iter().any(|p| p == V5_CHANNEL) => Mode::Translate(streams),
        _ => Mode::Proxy,
    };
    let (io, authority) = nodes.open(&state.registry, node).await?;
    let unreachable = |e: hyper::Error| {
        StatusError::service_unavailable(format!("the node endpoint of node {node} ({authority}): {e}"))
    };
    let mut upstream = http::Request::new(Empty::<Bytes>::new());
    *upstream.uri_mut() = path.parse().map_err(|e| StatusError::internal(format!("node path {path:?}: {e}")))?;
    let mut req = req;
    let on_client = hyper::upgrade::on(&mut req);
    match mode {
        Mode::Proxy => {
            *upstream.method_mut() = req.method().clone();
            *upstream.headers_mut() = proxy::forwarded_headers(req.headers());
            let resp = proxy::send(io, &authority, upstream).await.map_err(unreachable)?;
            Ok(proxy::join(on_client, resp).0)
        }
        Mode::Translate(_) | Mode::Tunnel => {
            let (protocol, version) = match mode {
                Mode::Tunnel => (SPDY_TUNNEL, "portforward.k8s.io"),
                _ => (V5_CHANNEL, "v4.channel.k8s.io"),
            };
            let accepted = websocket::accept(req.headers(), protocol)
                .ok_or_else(|| StatusError::bad_request("invalid WebSocket handshake"))?;
            *upstream.method_mut() = Method::POST;
            let h = upstream.headers_mut();
            h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            h.insert("x-stream-protocol-version", HeaderValue::from_static(version));
            let node_io = spdy_upgrade(io, &authority, upstream).await?;
            match mode {
                Mode::Translate(streams) => tokio::spawn(websocket::translate(on_client, node_io, streams)),
                _ => tokio::spawn(websocket::tunnel(on_client, node_io)),
            };
            Ok(accepted)
        }
    }
}

/// The node's connection once it switched to SPDY; its refusal as a Status otherwise.
async fn spdy_upgrade(
    io: NodeStream,
    authority: &str,
    req: http::Request<Empty<Bytes>>,
) -> Result<TokioIo<hyper::upgrade::Upgraded>> {
    let mut resp = proxy::send(io, authority, req)
        .await
        .map_err(|e| StatusError::service_unavailable(format!("the node endpoint: {e}")))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(error_of(resp).await);
    }
    let upgraded = hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| StatusError::service_unavailable(format!("upgrading the node endpoint's connection: {e}")))?;
    Ok(TokioIo::new(upgraded))
}
