//! Calls from the API server to node endpoints (the kubelet API every node serves on its
//! `status.daemonEndpoints.kubeletEndpoint.Port`), as kube-apiserver makes them for `pods/log`,
//! the streaming subresources, node proxy and metrics: HTTPS verified against the cluster CA, with
//! the API server's own client certificate, to the Node's address (k3s's preferred order:
//! InternalIP, ExternalIP, Hostname). The node this process runs is called in memory once its
//! endpoint hands its router over (a loopback TLS leg would encrypt every log, exec and
//! port-forward byte twice more), and on loopback before.

use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::ServiceExt as _;

use super::pki::{KUBELET_CLIENT_USER, Pki};
use super::{PeerCert, User};
use crate::registry::{Registry, StatusError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a node's error answer that is read into the Status message.
const MAX_ERROR_BODY: usize = 64 << 10;

pub struct NodeClient {
    pki: Arc<Pki>,
    /// The node whose agent runs in this process, when one does.
    local_node: OnceLock<String>,
    /// That node's endpoint, served in memory.
    local_endpoint: OnceLock<axum::Router>,
}

/// The in-memory connection's buffer per direction.
const LOCAL_BUFFER: usize = 256 << 10;

type Result<T> = std::result::Result<T, StatusError>;

/// A connection to a node endpoint: TLS over TCP, or in memory to this process's own.
pub enum NodeStream {
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    Local(tokio::io::DuplexStream),
}

impl AsyncRead for NodeStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
            NodeStream::Local(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            NodeStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
            NodeStream::Local(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Tls(s) => Pin::new(s).poll_flush(cx),
            NodeStream::Local(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            NodeStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
            NodeStream::Local(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A node's answer other than the one asked for, as a Status with its code and text.
pub async fn error_of(resp: Response<Incoming>) -> StatusError {
    let code = resp.status();
    let body = http_body_util::Limited::new(resp.into_body(), MAX_ERROR_BODY).collect().await;
    let text = body.map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string()).unwrap_or_default();
    StatusError::from_node(code.as_u16(), text)
}

impl NodeClient {
    pub fn new(pki: Arc<Pki>) -> Self {
        Self { pki, local_node: OnceLock::new(), local_endpoint: OnceLock::new() }
    }

    /// This process's node endpoint, to be called in memory from now on.
    pub fn set_local_endpoint(&self, router: axum::Router) {
        let _ = self.local_endpoint.set(router);
    }

    /// An in-memory connection to this process's node endpoint, as the API server's identity.
    fn open_local(&self, router: &axum::Router) -> NodeStream {
        let (client, server) = tokio::io::duplex(LOCAL_BUFFER);
        let (router, caller) = (router.clone(), PeerCert(Some(User::new(KUBELET_CLIENT_USER, vec![]))));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(caller.clone());
                router.clone().oneshot(req.map(axum::body::Body::new))
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service);
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("in-memory node endpoint connection: {e}");
            }
        });
        NodeStream::Local(client)
    }

    /// Marks `node` as the one this process runs (reached on loopback until its router is set).
    pub fn set_local_node(&self, node: &str) {
        let _ = self.local_node.set(node.to_string());
    }

    /// A TLS connection to `node`'s endpoint, and the authority to name in requests on it.
    pub async fn open(&self, registry: &Registry, node: &str) -> Result<(NodeStream, String)> {
        let (ip, port) = self.locate(registry, node)?;
        if let Some(router) = self.local_endpoint.get().filter(|_| self.local_node.get().is_some_and(|l| l == node)) {
            return Ok((self.open_local(router), format!("{ip}:{port}")));
        }
        let unreachable = |e: String| {
            StatusError::service_unavailable(format!("the node endpoint of node {node} ({ip}:{port}): {e}"))
        };
        let tls = self.pki.kubelet_client_config().map_err(|e| StatusError::internal(e.to_string()))?;
        let connect = async {
            let tcp = tokio::net::TcpStream::connect((ip, port)).await?;
            let _ = tcp.set_nodelay(true);
            tokio_rustls::TlsConnector::from(tls).connect(ServerName::IpAddress(ip.into()), tcp).await
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| unreachable("timed out connecting".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        Ok((NodeStream::Tls(Box::new(stream)), format!("{ip}:{port}")))
    }

    /// `GET path_and_query` on `node`'s endpoint. A 200 answer is returned to stream on; any other
    /// becomes a Status with the node's code and its text as the message (upstream's
    /// `GenericHttpResponseChecker`).
    pub async fn get(&self, registry: &Registry, node: &str, path_and_query: &str) -> Result<Response<Incoming>> {
        let req = Request::get(path_and_query)
            .body(http_body_util::Empty::new())
            .map_err(|e| StatusError::internal(e.to_string()))?;
        let resp = self.send(registry, node, req).await?;
        if resp.status() == StatusCode::OK {
            return Ok(resp);
        }
        Err(error_of(resp).await)
    }

    /// Sends `req` to `node`'s endpoint; its answer, whatever the status.
    pub async fn send(
        &self,
        registry: &Registry,
        node: &str,
        req: Request<http_body_util::Empty<bytes::Bytes>>,
    ) -> Result<Response<Incoming>> {
        let (stream, authority) = self.open(registry, node).await?;
        crate::streaming::proxy::send(stream, &authority, req).await.map_err(|e| {
            StatusError::service_unavailable(format!("the node endpoint of node {node} ({authority}): {e}"))
        })
    }

    /// The address and port of `node`'s endpoint.
    fn locate(&self, registry: &Registry, node: &str) -> Result<(IpAddr, u16)> {
        let nodes = registry.find("", "v1", "nodes").ok_or_else(StatusError::no_route)?;
        let value = registry.get_value(&nodes, None, node)?;
        let n: Node =
            serde_json::from_value(value).map_err(|e| StatusError::internal(format!("stored node {node}: {e}")))?;
        let status = n.status.unwrap_or_default();
        let port = status.daemon_endpoints.and_then(|d| d.kubelet_endpoint).map_or(0, |e| e.port);
        let port = u16::try_from(port).ok().filter(|p| *p > 0).ok_or_else(|| {
            StatusError::service_unavailable(format!("node {node} does not serve its endpoint (no kubelet port)"))
        })?;
        if self.local_node.get().is_some_and(|l| l == node) {
            return Ok((Ipv4Addr::LOCALHOST.into(), port));
        }
        let addresses = status.addresses.unwrap_or_default();
        let ip = ["InternalIP", "ExternalIP", "Hostname"]
            .iter()
            .find_map(|t| addresses.iter().filter(|a| a.type_ == *t).find_map(|a| a.address.parse::<IpAddr>().ok()))
            .ok_or_else(|| StatusError::service_unavailable(format!("node {node} has no address to reach it at")))?;
        Ok((ip, port))
    }
}
