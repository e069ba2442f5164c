//! A joined node's trust and identity (what k3s's agent keeps under `agent/`): the server's CA,
//! fetched once from `/cacerts` and trusted only when it hashes to the join token's pin; the node's
//! client certificate (`system:node:<name>`), its endpoint's serving certificate and its
//! controllers' client certificate (`system:cairn-controller`), for keys made here that never leave
//! the node, signed by the server (`POST /v1-cairn/node-certificates`) and renewed before they
//! expire; and the HTTPS [`kube::Client`]s the node reaches the API with.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use tokio_util::sync::CancellationToken;

use crate::api::join::{NodeCertificateRequest, NodeCertificates, ServerBootstrap};
use crate::api::pki::{self, JoinToken, SwappableCert};

/// How long one call to the server may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// TCP keepalive on the API connection: a silently dead server (a cut network) is noticed within
/// about half a minute, and watches reconnect, instead of after the kernel's two hours.
const KEEPALIVE: Duration = Duration::from_secs(15);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// HTTP/2 pings on the API connection, and how long one may go unanswered.
const PING_INTERVAL: Duration = Duration::from_secs(15);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The server refused the node (a wrong token, a CA that is not the token's, a bad request):
/// trying again cannot help.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Where and as whom a node joins.
#[derive(Debug, Clone)]
pub struct Join {
    /// `--server`: the API's URL, `https://host:6443`.
    pub server: String,
    pub token: JoinToken,
    pub node_name: String,
    /// The node's addresses, for its serving certificate.
    pub addresses: Vec<IpAddr>,
    /// `<data-dir>/agent`.
    pub dir: PathBuf,
}

/// The node's credentials, current (certificates are swapped in place when renewed).
pub struct Credentials {
    pub roots: Arc<RootCertStore>,
    pub client: Arc<SwappableCert>,
    pub serving: Arc<SwappableCert>,
    pub controller: Arc<SwappableCert>,
}

/// The files, named as k3s names them under its agent directory.
struct Files {
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    controller_cert: PathBuf,
    controller_key: PathBuf,
}

/// The node's private keys, PEM-encoded.
struct Keys {
    client: String,
    serving: String,
    controller: String,
}

impl Files {
    fn new(dir: &Path) -> Self {
        Files {
            ca: dir.join("server-ca.crt"),
            client_cert: dir.join("client-kubelet.crt"),
            client_key: dir.join("client-kubelet.key"),
            serving_cert: dir.join("serving-kubelet.crt"),
            serving_key: dir.join("serving-kubelet.key"),
            controller_cert: dir.join("client-cairn-controller.crt"),
            controller_key: dir.join("client-cairn-controller.key"),
        }
    }

    /// The keys, made where missing.
    fn keys(&self) -> Result<Keys> {
        Ok(Keys {
            client: load_or_create_key(&self.client_key)?,
            serving: load_or_create_key(&self.serving_key)?,
            controller: load_or_create_key(&self.controller_key)?,
        })
    }
}

impl Join {
    /// Loads the node's credentials, fetching the CA and asking the server for certificates where
    /// what is on disk is missing, expiring or not for this server.
    pub async fn credentials(&self) -> Result<Credentials> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let files = Files::new(&self.dir);
        let ca = self.trusted_ca(&files).await?;
        let roots = pki::roots_of(&ca).map_err(|e| anyhow!("the server's CA: {e}"))?;
        let keys = files.keys()?;
        if let Some(why) = self.why_renew(&files, &roots) {
            tracing::info!("asking {} for the credentials of node {}: {why}", self.server, self.node_name);
            let certs = self.request(&roots, None, &keys).await?;
            write_certs(&files, &certs)?;
        }
        let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
        let key = |cert: &Path, key: &str| {
            pki::certified_key_of(&read(cert)?, key).map_err(|e| anyhow!("{}: {e}", cert.display()))
        };
        Ok(Credentials {
            client: Arc::new(SwappableCert::new(key(&files.client_cert, &keys.client)?)),
            serving: Arc::new(SwappableCert::new(key(&files.serving_cert, &keys.serving)?)),
            controller: Arc::new(SwappableCert::new(key(&files.controller_cert, &keys.controller)?)),
            roots,
        })
    }

    /// Checks the certificates every `every` and renews them (with the node's own identity) when
    /// they near their end, swapping them into the running client and endpoint.
    pub fn spawn_renewal(self, creds: Arc<Credentials>, every: Duration, shutdown: CancellationToken) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.tick().await;
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = shutdown.cancelled() => return,
                }
                if let Err(e) = self.renew(&creds).await {
                    tracing::warn!("renewing the credentials of node {}: {e:#}", self.node_name);
                }
            }
        });
    }

    async fn renew(&self, creds: &Credentials) -> Result<()> {
        let files = Files::new(&self.dir);
        let Some(why) = self.why_renew(&files, &creds.roots) else { return Ok(()) };
        tracing::info!("renewing the credentials of node {}: {why}", self.node_name);
        let keys = files.keys()?;
        let certs = self.request(&creds.roots, Some(creds.client.clone()), &keys).await?;
        write_certs(&files, &certs)?;
        let key = |cert: &str, key: &str| pki::certified_key_of(cert, key).map_err(anyhow::Error::msg);
        creds.client.set(key(&certs.client_certificate, &keys.client)?);
        creds.serving.set(key(&certs.serving_certificate, &keys.serving)?);
        creds.controller.set(key(&certs.controller_certificate, &keys.controller)?);
        Ok(())
    }

    /// Why the certificates on disk must be issued again, if they must.
    fn why_renew(&self, files: &Files, roots: &Arc<RootCertStore>) -> Option<String> {
        let check = |path: &Path, serving: Option<&[IpAddr]>| match std::fs::read_to_string(path) {
            Ok(pem) => pki::check_issued(&pem, roots, serving).err().map(|e| format!("{}: {e}", path.display())),
            Err(_) => Some(format!("{} does not exist yet", path.display())),
        };
        check(&files.client_cert, None)
            .or_else(|| check(&files.serving_cert, Some(&self.addresses)))
            .or_else(|| check(&files.controller_cert, None))
    }

    /// The server's CA: the one kept from an earlier join when the token's pin still matches it,
    /// else `/cacerts`, fetched without trust and trusted only when it hashes to the pin. A token
    /// without a pin (a bare secret) trusts what the server first presents, as k3s does.
    async fn trusted_ca(&self, files: &Files) -> Result<String> {
        let pinned = |pem: &str| self.token.ca_hash.as_ref().is_none_or(|h| *h == pki::ca_hash(pem));
        if let Ok(kept) = std::fs::read_to_string(&files.ca)
            && pinned(&kept)
        {
            return Ok(kept);
        }
        let pem = pinned_ca(&self.server, &self.token).await?;
        pki::write_atomic(&files.ca, 0o644, pem.as_bytes())?;
        Ok(pem)
    }

    /// Asks the server to sign the node's keys, authenticated by `identity` (renewal) or the token.
    async fn request(
        &self,
        roots: &Arc<RootCertStore>,
        identity: Option<Arc<SwappableCert>>,
        keys: &Keys,
    ) -> Result<NodeCertificates> {
        let user = format!("system:node:{}", self.node_name);
        let csr = |key: &str, user: &str| pki::request_for(key, user).map_err(anyhow::Error::msg);
        let ask = NodeCertificateRequest {
            node_name: self.node_name.clone(),
            addresses: self.addresses.clone(),
            client_csr: csr(&keys.client, &user)?,
            serving_csr: csr(&keys.serving, &user)?,
            controller_csr: csr(&keys.controller, crate::api::authz::CONTROLLER_USER)?,
        };
        let builder = rustls::ClientConfig::builder_with_provider(pki::provider())
            .with_safe_default_protocol_versions()
            .context("TLS configuration")?
            .with_root_certificates(roots.clone());
        let mut req = Request::post(format!("{}/v1-cairn/node-certificates", self.server))
            .header(http::header::CONTENT_TYPE, "application/json");
        let tls = match identity {
            Some(identity) => builder.with_client_cert_resolver(identity),
            None => {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {}", self.token.secret));
                builder.with_no_client_auth()
            }
        };
        let req = req.body(Full::new(Bytes::from(serde_json::to_vec(&ask)?)))?;
        let (status, body) = call(tls, req).await.with_context(|| format!("joining {}", self.server))?;
        match status {
            StatusCode::OK => serde_json::from_slice(&body).context("reading the server's answer to the join"),
            StatusCode::UNAUTHORIZED => bail!(Refused(format!(
                "the server at {} refused the join token (401 Unauthorized): give the token from the server's \
                 <data-dir>/server/token",
                self.server
            ))),
            other if other.is_client_error() => bail!(Refused(format!(
                "the server at {} refused to join node {}: {other}: {}",
                self.server,
                self.node_name,
                message(&body)
            ))),
            other => bail!(
                "the server at {} could not join node {}: {other}: {}",
                self.server,
                self.node_name,
                message(&body)
            ),
        }
    }
}

/// The CA the server at `server` presents at `/cacerts` (fetched without trust), trusted only
/// when it hashes to the token's pin; a token without a pin trusts it, as k3s does, with a warning.
async fn pinned_ca(server: &str, token: &JoinToken) -> Result<String> {
    let tls = rustls::ClientConfig::builder_with_provider(pki::provider())
        .with_safe_default_protocol_versions()
        .context("TLS configuration")?
        .dangerous()
        .with_custom_certificate_verifier(pki::AnyServerCert::new())
        .with_no_client_auth();
    let req = Request::get(format!("{server}/cacerts")).body(Full::default())?;
    let (status, body) = call(tls, req).await.with_context(|| format!("fetching the CA from {server}"))?;
    if status != StatusCode::OK {
        bail!("fetching the CA from {server}/cacerts: the server answered {status}");
    }
    let pem = String::from_utf8(body.to_vec()).context("the server's /cacerts is not text")?;
    let hash = pki::ca_hash(&pem);
    match &token.ca_hash {
        Some(pin) if *pin != hash => bail!(Refused(format!(
            "the server at {server} presents a CA whose sha256 is {hash}, but the token pins {pin}: it is not the \
             server the token was made for"
        ))),
        Some(_) => {}
        None => tracing::warn!(
            "the token has no CA pin: trusting the CA {server} presents (sha256 {hash}); give the full K10... token \
             from the server's <data-dir>/server/token to verify it"
        ),
    }
    Ok(pem)
}

/// What a server joining the one at `server` (`cairn server --server URL --token T`) learns of the
/// cluster, asked with the join token over TLS checked against the token's CA pin.
pub async fn server_bootstrap(server: &str, token: &JoinToken) -> Result<ServerBootstrap> {
    let ca = pinned_ca(server, token).await?;
    let roots = pki::roots_of(&ca).map_err(anyhow::Error::msg)?;
    let tls = rustls::ClientConfig::builder_with_provider(pki::provider())
        .with_safe_default_protocol_versions()
        .context("TLS configuration")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let req = Request::get(format!("{server}/v1-cairn/server-bootstrap"))
        .header(http::header::AUTHORIZATION, format!("Bearer {}", token.secret))
        .body(Full::default())?;
    let (status, body) = call(tls, req).await.with_context(|| format!("asking {server} how to join it"))?;
    match status {
        StatusCode::OK => serde_json::from_slice(&body).context("reading the server's answer"),
        StatusCode::UNAUTHORIZED => bail!(Refused(format!(
            "the server at {server} refused the token (401 Unauthorized): give the token from its \
             <data-dir>/server/token"
        ))),
        other => bail!("the server at {server} answered {other}: {}", message(&body)),
    }
}

/// An API client of a joined node: HTTPS to `server`, trusting only the cluster CA, presenting
/// `identity`'s current client certificate.
pub fn api_client(server: &str, creds: &Credentials, identity: &Arc<SwappableCert>) -> Result<kube::Client> {
    use kube::client::ConfigExt as _;
    let tls = pki::client_tls(creds.roots.clone(), identity.clone())?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_keepalive(Some(KEEPALIVE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
    http.set_connect_timeout(Some(REQUEST_TIMEOUT));
    http.set_nodelay(true);
    // HTTP/2, as client-go: every watch of the node shares one connection, and its pings notice a
    // dead server within seconds even while a watch is quiet.
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls).clone())
        .https_only()
        .enable_all_versions()
        .wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(Some(PING_INTERVAL))
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let config = kube::Config::new(server.parse().with_context(|| format!("invalid --server URL {server:?}"))?);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        // A node's writes are recorded in managedFields as a kubelet's.
        .map_request(|mut req: Request<kube::client::Body>| {
            req.headers_mut()
                .entry(http::header::USER_AGENT)
                .or_insert_with(|| http::HeaderValue::from_static(crate::client::KUBELET_AGENT));
            req
        })
        // Until the response's head: a watch's body streams on beyond it.
        .layer(tower::timeout::TimeoutLayer::new(REQUEST_TIMEOUT))
        .service(hyper);
    Ok(kube::Client::new(service, "default"))
}

/// One HTTPS request with its own connection; the status and the whole body.
async fn call(tls: rustls::ClientConfig, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes)> {
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http1().build();
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let exchange = async {
        let resp = client.request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("no answer within {REQUEST_TIMEOUT:?}"))?
}

/// The message of a Status body, or the body as text.
fn message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

fn load_or_create_key(path: &Path) -> Result<String> {
    if let Ok(pem) = std::fs::read_to_string(path) {
        return Ok(pem);
    }
    let pem = pki::new_key_pem().map_err(|e| anyhow!("generating {}: {e}", path.display()))?;
    pki::write_atomic(path, 0o600, pem.as_bytes())?;
    Ok(pem)
}

fn write_certs(files: &Files, certs: &NodeCertificates) -> Result<()> {
    pki::write_atomic(&files.client_cert, 0o644, certs.client_certificate.as_bytes())?;
    pki::write_atomic(&files.serving_cert, 0o644, certs.serving_certificate.as_bytes())?;
    Ok(pki::write_atomic(&files.controller_cert, 0o644, certs.controller_certificate.as_bytes())?)
}
