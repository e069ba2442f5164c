//! Upgrade requests passed on to a backend and, once it switches protocols, the two connections
//! joined byte for byte: apimachinery's `UpgradeAwareHandler`, as kube-apiserver uses it towards a
//! kubelet and kubelet towards the runtime's streaming server.

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode, header};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::task::JoinHandle;

/// Request headers a streaming upgrade needs end to end; nothing else (credentials above all)
/// is passed on.
const FORWARDED: [HeaderName; 7] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    HeaderName::from_static("x-stream-protocol-version"),
    header::ORIGIN,
];

/// Whether a request asks to switch protocols.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
        && headers.contains_key(header::UPGRADE)
}

/// The upgrade headers of `from`, for a request to the backend.
pub fn forwarded_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in &FORWARDED {
        for v in from.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// Sends `req` over `io` (HTTP/1.1) to `authority` (its `Host`) and returns the backend's answer;
/// a 101's connection is then taken with [`hyper::upgrade::on`].
pub async fn send<S>(io: S, authority: &str, mut req: Request<Empty<Bytes>>) -> Result<Response<Incoming>, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if let Ok(host) = http::HeaderValue::from_str(authority) {
        req.headers_mut().insert(header::HOST, host);
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("backend connection ended: {e}");
        }
    });
    sender.send_request(req).await
}

/// The answer to a client whose upgrade request was passed on: the backend's 101 with its
/// protocol headers, after which the two connections are joined until both directions are over
/// (the task returned); any other answer is handed back as it came.
pub fn join(client: OnUpgrade, mut backend: Response<Incoming>) -> (Response<Body>, Option<JoinHandle<()>>) {
    if backend.status() != StatusCode::SWITCHING_PROTOCOLS {
        return (backend.map(Body::new), None);
    }
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *resp.headers_mut() = backend.headers().clone();
    let upstream = hyper::upgrade::on(&mut backend);
    let session = tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => return tracing::debug!("streaming upgrade failed: {e}"),
        };
        let (client_rd, client_wr) = tokio::io::split(TokioIo::new(client));
        let (upstream_rd, upstream_wr) = tokio::io::split(TokioIo::new(upstream));
        let (up, down) = (pipe(client_rd, upstream_wr), pipe(upstream_rd, client_wr));
        tokio::pin!(up, down);
        // Streaming clients never half-close: a client's end of stream means it is gone, and the
        // backend's session (a command still running, say) is dropped with it. When the backend
        // ends first, the client reads what is left and closes.
        tokio::select! {
            () = &mut up => {}
            () = &mut down => up.await,
        }
    });
    (resp, Some(session))
}

/// Copies one direction until its end (or an error), then closes the writer cleanly (a TLS
/// close_notify): what is in flight still arrives, and the other direction goes on until its end.
async fn pipe<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(mut from: R, mut to: W) {
    if let Err(e) = tokio::io::copy(&mut from, &mut to).await {
        tracing::debug!("streaming session: {e}");
    }
    let _ = to.shutdown().await;
}
