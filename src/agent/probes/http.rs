//! The HTTP client of httpGet probes and hooks, and the TCP dialer of tcpSocket probes: HTTP/1.1 over
//! one connection per request (hyper), TLS without certificate verification (as kubelet), redirects
//! followed only to the same host, and errors worded as Go's `net/http` words them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONNECTION, HOST, HeaderMap, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::HTTPGetAction;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::{KUBE_VERSION, MAX_OUTPUT, Outcome, ProbeResult, Target, non_empty, resolve_port};

/// Redirects followed before giving up (Go's default `CheckRedirect`).
const MAX_REDIRECTS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    Http,
    Https,
}

/// One GET request, resolved from an `HTTPGetAction`.
#[derive(Debug, Clone)]
pub(super) struct Request {
    scheme: Scheme,
    /// Host name or IP address (without brackets).
    host: String,
    port: u16,
    /// Path and query as written (may be empty).
    path: String,
    headers: HeaderMap,
    /// A `Host` header given in `httpHeaders`, which replaces the URL's.
    host_header: Option<String>,
    /// kubelet's probe transport disables keep-alives (`Connection: close`); the hook client does not.
    close: bool,
}

impl Request {
    /// Upstream's `NewRequestForHTTPGetAction`; `purpose` is `probe` or `lifecycle` (the User-Agent).
    pub(super) fn new(action: &HTTPGetAction, target: &Target, purpose: &str) -> Result<Self, String> {
        let scheme = match action.scheme.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("") | Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some(other) => return Err(format!("unsupported protocol scheme {other:?}")),
        };
        let host = non_empty(&action.host).or(target.pod_ip.as_deref()).unwrap_or_default().to_string();
        let port = resolve_port(&action.port, &target.ports)?;
        let mut headers = HeaderMap::new();
        for h in action.http_headers.iter().flatten() {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("net/http: invalid header field name {:?}", h.name))?;
            let value = HeaderValue::from_str(&h.value)
                .map_err(|_| format!("net/http: invalid header field value for {:?}", h.name))?;
            headers.append(name, value);
        }
        if !headers.contains_key(USER_AGENT) {
            let agent = format!("kube-{purpose}/{KUBE_VERSION}");
            headers.insert(USER_AGENT, HeaderValue::from_str(&agent).map_err(|e| e.to_string())?);
        }
        match headers.get(ACCEPT) {
            None => drop(headers.insert(ACCEPT, HeaderValue::from_static("*/*"))),
            Some(v) if v.is_empty() => drop(headers.remove(ACCEPT)),
            Some(_) => {}
        }
        let host_header = headers.get(HOST).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).map(String::from);
        headers.remove(HOST);
        let path = action.path.clone().unwrap_or_default();
        Ok(Request { scheme, host, port, path, headers, host_header, close: purpose == "probe" })
    }

    fn authority(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// The URL as Go prints it in errors.
    fn url(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let slash = if self.path.is_empty() || self.path.starts_with('/') { "" } else { "/" };
        format!("{scheme}://{}{slash}{}", self.authority(), escape(&self.path))
    }

    /// The request target: the path (at least `/`) and query, escaped where needed.
    fn target(&self) -> String {
        let path = self.path.split('#').next().unwrap_or_default();
        match path {
            "" => "/".to_string(),
            p if p.starts_with('/') => escape(p),
            p => format!("/{}", escape(p)),
        }
    }

    /// The request a redirect to `location` leads to.
    fn redirect(&self, location: &str) -> Result<Request, String> {
        let mut next = self.clone();
        let lower = location.to_ascii_lowercase();
        let absolute = if lower.starts_with("//") {
            Some(format!("{}:{location}", if self.scheme == Scheme::Https { "https" } else { "http" }))
        } else if lower.contains("://") {
            Some(location.to_string())
        } else {
            None
        };
        match absolute {
            Some(url) => {
                let uri: http::Uri =
                    url.parse().map_err(|e| format!("failed to parse Location header {location:?}: {e}"))?;
                next.scheme = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
                    Some("http") => Scheme::Http,
                    Some("https") => Scheme::Https,
                    other => return Err(format!("unsupported protocol scheme {:?}", other.unwrap_or_default())),
                };
                next.host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
                next.port = uri.port_u16().unwrap_or(if next.scheme == Scheme::Https { 443 } else { 80 });
                next.path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
                // A Host header given by the user survives only relative redirects (as Go).
                next.host_header = None;
            }
            None if location.starts_with('/') => next.path = location.to_string(),
            None => {
                let current = self.target();
                let dir = &current[..current.rfind('/').map_or(0, |i| i + 1)];
                next.path = format!("{dir}{location}");
            }
        }
        Ok(next)
    }
}

/// A response: its status, where it redirects to, and at most [`MAX_OUTPUT`] bytes of body.
struct Response {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

/// Why a GET failed, worded as Go's client.
enum GetError {
    /// The request failed (`Get "url": ...`).
    Request(String),
    /// An HTTPS request reached a plain-HTTP server.
    HttpToHttps(String),
    /// The response came but its body could not be read.
    Body(String),
}

/// One httpGet probe within `timeout`: 2xx succeeds, 3xx succeeds with a warning (a redirect to
/// another host is not followed), anything else fails.
pub(super) async fn probe(request: Request, timeout: Duration) -> Outcome {
    match get(request, Some(Instant::now() + timeout)).await {
        Err(GetError::Request(e) | GetError::HttpToHttps(e)) => Outcome::new(ProbeResult::Failure, e),
        // Upstream reports an unreadable body as an error, not as a failure.
        Err(GetError::Body(e)) => Outcome::new(ProbeResult::Unknown, e),
        Ok(response) => {
            let body = String::from_utf8_lossy(&response.body).into_owned();
            match response.status {
                200..=299 => Outcome::new(ProbeResult::Success, body),
                300..=399 => {
                    Outcome::new(ProbeResult::Warning, format!("Probe terminated redirects, Response body: {body}"))
                }
                status => Outcome::new(ProbeResult::Failure, format!("HTTP probe failed with statuscode: {status}")),
            }
        }
    }
}

/// One httpGet hook: any response succeeds. An HTTPS request answered in plain HTTP is retried
/// over HTTP without the `Authorization` header, as kubelet does.
pub(super) async fn hook(request: Request) -> Result<(), String> {
    match get(request.clone(), None).await {
        Ok(_) | Err(GetError::Body(_)) => Ok(()),
        Err(GetError::Request(e)) => Err(e),
        Err(GetError::HttpToHttps(e)) => {
            let authority = request.authority();
            let mut plain = request;
            plain.scheme = Scheme::Http;
            plain.headers.remove(AUTHORIZATION);
            match get(plain, None).await {
                Ok(_) | Err(GetError::Body(_)) => {
                    tracing::warn!(
                        "request to HTTPS lifecycle hook {authority} got HTTP response, retry with HTTP succeeded"
                    );
                    Ok(())
                }
                Err(_) => Err(e),
            }
        }
    }
}

/// GET with Go's redirect policy for probes: follow redirects to the same host name (up to 10),
/// stop at a redirect to another host and return that response.
async fn get(request: Request, deadline: Option<Instant>) -> Result<Response, GetError> {
    let first_host = request.host.clone();
    let mut current = request;
    let mut followed = 0;
    loop {
        let response = fetch(&current, deadline).await?;
        let location = match (response.status, &response.location) {
            (301 | 302 | 303 | 307 | 308, Some(location)) => location.clone(),
            _ => return Ok(response),
        };
        let next =
            current.redirect(&location).map_err(|e| GetError::Request(format!("Get {:?}: {e}", current.url())))?;
        if next.host != first_host {
            return Ok(response);
        }
        followed += 1;
        if followed >= MAX_REDIRECTS {
            return Err(GetError::Request(format!("Get {:?}: stopped after {MAX_REDIRECTS} redirects", next.url())));
        }
        tracing::debug!("probe: following redirect from {} to {}", current.url(), next.url());
        current = next;
    }
}

/// One request on a new connection.
async fn fetch(request: &Request, deadline: Option<Instant>) -> Result<Response, GetError> {
    let url = request.url();
    let fail = |e: String| GetError::Request(format!("Get {url:?}: {e}"));
    let awaiting = |timed_out: bool| {
        if timed_out { " (Client.Timeout exceeded while awaiting headers)" } else { "" }
    };
    let deadline_exceeded = || fail(format!("context deadline exceeded{}", awaiting(true)));

    let stream = dial(&request.host, request.port, deadline)
        .await
        .map_err(|e| fail(format!("{}{}", e.message, awaiting(e.timed_out))))?;
    let local = stream.local_addr().ok();
    let remote = stream.peer_addr().ok();
    let read_error = |e: hyper::Error| {
        if e.is_incomplete_message() {
            return "EOF".to_string();
        }
        match (std::error::Error::source(&e).and_then(|s| s.downcast_ref::<io::Error>()), local, remote) {
            (Some(io), Some(local), Some(remote)) => format!("read tcp {local}->{remote}: read: {}", errno_text(io)),
            _ => e.to_string(),
        }
    };

    let io: Box<dyn Io> = match request.scheme {
        Scheme::Http => Box::new(stream),
        Scheme::Https => {
            let config = tls_config().map_err(fail)?;
            let name = ServerName::try_from(request.host.clone())
                .map_err(|e| fail(format!("tls: invalid server name {:?}: {e}", request.host)))?;
            let connect = tokio_rustls::TlsConnector::from(config).connect(name, stream);
            match within(deadline, connect).await {
                None => return Err(deadline_exceeded()),
                Some(Ok(tls)) => Box::new(tls),
                Some(Err(e)) if is_plain_http(&e) => {
                    return Err(GetError::HttpToHttps(format!(
                        "Get {url:?}: http: server gave HTTP response to HTTPS client"
                    )));
                }
                Some(Err(e)) => return Err(fail(format!("tls: {e}"))),
            }
        }
    };

    let (mut sender, connection) = match within(deadline, hyper::client::conn::http1::handshake(TokioIo::new(io))).await
    {
        None => return Err(deadline_exceeded()),
        Some(Ok(handshake)) => handshake,
        Some(Err(e)) => return Err(fail(read_error(e))),
    };
    let _connection = AbortOnDropHandle::new(tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("probe connection closed: {e}");
        }
    }));

    let mut builder = http::Request::get(request.target());
    let host = request.host_header.clone().unwrap_or_else(|| request.authority());
    builder = builder.header(HOST, host);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if request.close {
        builder = builder.header(CONNECTION, "close");
    }
    let req = builder.body(Empty::<Bytes>::new()).map_err(|e| fail(format!("net/http: {e}")))?;
    let response = match within(deadline, sender.send_request(req)).await {
        None => return Err(deadline_exceeded()),
        Some(Ok(response)) => response,
        Some(Err(e)) => return Err(fail(read_error(e))),
    };

    let status = response.status().as_u16();
    let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(String::from);
    let mut body = Vec::new();
    let mut incoming = response.into_body();
    while body.len() < MAX_OUTPUT {
        match within(deadline, incoming.frame()).await {
            None => {
                return Err(GetError::Body(
                    "context deadline exceeded (Client.Timeout or context cancellation while reading body)".to_string(),
                ));
            }
            Some(None) => break,
            Some(Some(Err(e))) => return Err(GetError::Body(read_error(e))),
            Some(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(&data[..data.len().min(MAX_OUTPUT - body.len())]);
                }
            }
        }
    }
    Ok(Response { status, location, body })
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Why a dial failed, as Go's `net.Dial` words it.
#[derive(Debug)]
pub(super) struct DialError {
    message: String,
    timed_out: bool,
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Connects to `host:port` before `deadline`. An empty host is the local system, as in Go.
pub(super) async fn dial(host: &str, port: u16, deadline: Option<Instant>) -> Result<TcpStream, DialError> {
    let shown = join_host_port(host, port);
    let addr = if host.is_empty() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        SocketAddr::new(ip, port)
    } else {
        let lookup = within(deadline, tokio::net::lookup_host((host, port))).await;
        let timed_out = lookup.is_none();
        match lookup.and_then(|r| r.ok()).and_then(|mut addrs| addrs.next()) {
            Some(addr) => addr,
            None => {
                let why = if timed_out { "i/o timeout" } else { "no such host" };
                return Err(DialError { message: format!("dial tcp: lookup {host}: {why}"), timed_out });
            }
        }
    };
    let shown = if host.is_empty() { shown } else { addr.to_string() };
    match within(deadline, TcpStream::connect(addr)).await {
        None => Err(DialError { message: format!("dial tcp {shown}: i/o timeout"), timed_out: true }),
        Some(Err(e)) => {
            Err(DialError { message: format!("dial tcp {shown}: connect: {}", errno_text(&e)), timed_out: false })
        }
        Some(Ok(stream)) => Ok(stream),
    }
}

/// Awaits `f` until `deadline` (if any); `None` when the deadline passed first.
async fn within<F: Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, f).await.ok(),
        None => Some(f.await),
    }
}

/// An OS error as Go prints it: `connection refused`, `no route to host`.
fn errno_text(e: &io::Error) -> String {
    let Some(code) = e.raw_os_error() else { return e.to_string() };
    let text = io::Error::from_raw_os_error(code).to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    let mut chars = text.chars();
    chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
}

/// Go's `net.JoinHostPort`.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Percent-escapes the bytes that cannot appear in a request target.
fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b <= b' ' || b >= 0x7f || b"\"<>\\^`{|}".contains(&b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

/// Whether a TLS handshake failed because the server answered in plain text.
fn is_plain_http(e: &io::Error) -> bool {
    matches!(
        e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType))
    )
}

/// The TLS client configuration: any certificate is accepted (kubelet's `InsecureSkipVerify`).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut config = rustls::ClientConfig::builder_with_provider(crate::api::pki::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("tls: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(crate::api::pki::AnyServerCert::new())
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}
