//! The HTTPS API: routing, authentication, content negotiation, discovery, OpenAPI and watch streaming.
//!
//! **Architecture invariant:** only this module knows HTTP; the registry below it speaks in plain
//! values and [`StatusError`]s.

pub mod authz;
mod codec;
mod discovery;
mod handlers;
mod health;
pub mod join;
mod logs;
mod metrics;
pub mod node_client;
mod node_proxy;
pub mod openapi;
pub mod pki;
pub mod protobuf;
mod reviews;
pub mod sa_token;
pub mod shared_keys;
mod streams;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::registry::{Registry, StatusError};

/// Who made a request, as established by the client certificate or a bearer token (upstream's
/// `user.Info`).
#[derive(Debug, Clone, Default)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// A unique id, where the authenticator knows one (a service account's UID).
    pub uid: String,
    /// What else the authenticator knows, e.g. the pod a service account token is bound to.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn new(name: impl Into<String>, groups: Vec<String>) -> Self {
        User { name: name.into(), groups, ..Default::default() }
    }
}

/// The identity of a request made inside this process (see `crate::client`): only code here can attach
/// a request extension, so it is trusted as it is.
#[derive(Debug, Clone)]
pub struct InProcess(pub User);

/// The identity from the TLS client certificate of the connection, if any.
#[derive(Debug, Clone)]
pub(crate) struct PeerCert(pub Option<User>);

/// Bearer tokens accepted, each mapped to a user.
#[derive(Clone, Default)]
pub struct Tokens(Vec<(String, User)>);

impl Tokens {
    pub fn add(&mut self, token: String, user: User) {
        if !token.is_empty() {
            self.0.push((token, user));
        }
    }

    fn find(&self, presented: &str) -> Option<&User> {
        self.0.iter().find(|(t, _)| constant_time_eq(t.as_bytes(), presented.as_bytes())).map(|(_, u)| u)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Everything the handlers need.
pub struct AppState {
    pub registry: Registry,
    pub tokens: Tokens,
    /// `host:port` advertised in `/api`.
    pub server_address: String,
    /// Set once start-up has finished; `/readyz` answers 503 before.
    pub ready: AtomicBool,
    /// How node endpoints are called (`pods/log`); set once the certificates are loaded.
    pub node_client: OnceLock<node_client::NodeClient>,
    /// The certificates: the CA joining nodes check against their token's hash (k3s's
    /// `/cacerts`), which also signs their credentials.
    pub pki: OnceLock<Arc<pki::Pki>>,
    /// What joined nodes learn of the cluster.
    pub cluster: OnceLock<join::ClusterConfig>,
    /// `--datastore-endpoint`, told to servers joining this one.
    pub datastore_endpoint: OnceLock<String>,
    /// `--authorization-mode`.
    pub authorization: authz::Modes,
    /// Signs and checks service account tokens; set once the key is loaded.
    pub sa_tokens: OnceLock<Arc<sa_token::ServiceAccountTokens>>,
    openapi: OnceLock<OpenApiDocs>,
}

/// Adds one kind's schema to an OpenAPI generator.
type SchemaFn = Box<dyn Fn(&mut schemars::SchemaGenerator) -> schemars::Schema>;

/// The JSON documents, and the protobuf ones made from them on first request (few clients ask).
struct OpenApiDocs {
    v2: Document,
    v2_proto: OnceLock<Document>,
    v3_index: Document,
    v3: Vec<(String, Document, OnceLock<Document>)>,
}

/// One OpenAPI document, encoded once, with its ETag.
struct Document {
    body: Bytes,
    etag: String,
}

impl Document {
    fn new(body: Vec<u8>) -> Self {
        use sha2::Digest as _;
        let etag = format!("\"{:X}\"", sha2::Sha512::digest(&body));
        Self { body: Bytes::from(body), etag }
    }

    /// The same document re-encoded (the JSON one as protobuf): `encode` gets it parsed.
    fn converted(&self, encode: fn(&Value) -> Vec<u8>) -> Self {
        Self::new(encode(&serde_json::from_slice(&self.body).unwrap_or_default()))
    }

    /// The document as `content_type`, or 304 when the client's copy (`If-None-Match`) is current.
    fn respond(&self, headers: &HeaderMap, content_type: &'static str) -> Response {
        let cached = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(self.etag.as_str());
        let etag = (header::ETAG, self.etag.clone());
        if cached {
            return (StatusCode::NOT_MODIFIED, [etag]).into_response();
        }
        (StatusCode::OK, [(header::CONTENT_TYPE, content_type.to_string()), etag], self.body.clone()).into_response()
    }
}

impl AppState {
    /// Every resource discovery lists: the registry's, and metrics.k8s.io's.
    fn listed(&self) -> Vec<discovery::Listed<'_>> {
        discovery::listed(self.registry.resources(), metrics::LISTED.into_iter().chain(reviews::LISTED))
    }

    pub fn new(registry: Registry, tokens: Tokens, server_address: String) -> Self {
        Self {
            registry,
            tokens,
            server_address,
            ready: AtomicBool::new(false),
            node_client: OnceLock::new(),
            pki: OnceLock::new(),
            cluster: OnceLock::new(),
            datastore_endpoint: OnceLock::new(),
            authorization: authz::Modes::default(),
            sa_tokens: OnceLock::new(),
            openapi: OnceLock::new(),
        }
    }

    /// The same state deciding requests with `modes`.
    pub fn with_authorization(self, modes: authz::Modes) -> Self {
        Self { authorization: modes, ..self }
    }

    /// OpenAPI documents, generated on first use (they are large and most clients never ask).
    fn openapi(&self) -> &OpenApiDocs {
        self.openapi.get_or_init(|| {
            let resources = self.registry.resources();
            let schema_fns: Vec<SchemaFn> = resources
                .iter()
                .map(|r| {
                    let r = r.clone();
                    Box::new(move |g: &mut schemars::SchemaGenerator| r.schema(g)) as SchemaFn
                })
                .collect();
            let mut docs: Vec<openapi::ResourceDoc<'_>> = resources
                .iter()
                .zip(&schema_fns)
                .map(|(r, s)| openapi::ResourceDoc {
                    info: r.info(),
                    merge_keys: r.merge_keys(),
                    schema: s.as_ref(),
                    create_only: false,
                })
                .collect();
            let reviews = reviews::schemas();
            docs.extend(reviews.iter().map(|(info, schema)| openapi::ResourceDoc {
                info,
                merge_keys: &[],
                schema: schema.as_ref(),
                create_only: true,
            }));
            let encode = |v: &Value| Document::new(serde_json::to_vec(v).unwrap_or_default());
            let v3 = openapi::v3(&docs);
            OpenApiDocs {
                v2: encode(&openapi::v2(&docs)),
                v2_proto: OnceLock::new(),
                v3_index: encode(&v3.index),
                v3: v3.documents.iter().map(|(p, d)| (p.clone(), encode(d), OnceLock::new())).collect(),
            }
        })
    }
}

/// The version cairn reports as its Kubernetes version.
pub const KUBERNETES_VERSION: &str = "v1.37.0";

pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": format!("{KUBERNETES_VERSION}+cairn-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, goarch()),
    })
}

fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}

/// The router; `oneshot`-testable without a socket.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/version", get(|| async { axum::Json(version_info()) }))
        .route("/healthz", get(health::healthz))
        .route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        .route("/healthz/{check}", get(health::healthz_check))
        .route("/livez/{check}", get(health::livez_check))
        .route("/readyz/{check}", get(health::readyz_check))
        .route("/api", get(api_root))
        .route("/apis", get(apis_root))
        .route("/api/v1", get(core_resources))
        .route("/apis/{group}", get(group_root))
        .route("/apis/{group}/{version}", get(group_resources))
        .route("/metrics", get(metrics))
        .route("/cacerts", get(cacerts))
        .route("/.well-known/openid-configuration", get(openid_configuration))
        .route("/openid/v1/jwks", get(openid_jwks))
        .route("/v1-cairn/node-certificates", axum::routing::post(join::node_certificates))
        .route("/v1-cairn/config", get(join::cluster_config))
        .route("/v1-cairn/server-bootstrap", get(join::server_bootstrap))
        .route("/openapi/v2", get(openapi_v2))
        .route("/openapi/v3", get(openapi_v3_index))
        .route("/openapi/v3/{*path}", get(openapi_v3_doc))
        .merge(metrics::routes())
        .merge(reviews::routes())
        .fallback(handlers::dispatch)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            codec::error(&StatusError::internal("the server hit an unexpected error; see its log"))
        }))
        .with_state(state)
}

/// Anonymous requests may only see health, version and the CA certificate (k3s's `/cacerts`), as
/// with upstream's public-info-viewer role.
fn is_public(path: &str) -> bool {
    matches!(path, "/version" | "/healthz" | "/livez" | "/readyz" | "/cacerts")
        || ["/healthz/", "/livez/", "/readyz/"].iter().any(|p| path.starts_with(p))
}

async fn authenticate(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    if let Some(InProcess(user)) = req.extensions().get::<InProcess>().cloned() {
        if let Err(e) = authorize(&state, &user, &req) {
            return e.into_response();
        }
        req.extensions_mut().insert(user);
        return next.run(req).await;
    }
    let cert = req.extensions().get::<PeerCert>().and_then(|p| p.0.clone());
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let user = match bearer {
        Some(token) => match authenticate_token(&state, token) {
            Ok(u) => Some(u),
            // A wrong token is refused even on public paths, as upstream does.
            Err(why) => {
                if req.uri().path().starts_with("/v1-cairn/") {
                    tracing::warn!("refused a node joining with a token that is not this server's join token");
                } else {
                    tracing::debug!("refused a bearer token: {why}");
                }
                return StatusError::unauthorized().into_response();
            }
        },
        None => cert,
    };
    match user {
        Some(u) => {
            let u = match impersonate(&state, u, req.headers()) {
                Ok(u) => u,
                Err(e) => return e.into_response(),
            };
            if let Err(e) = authorize(&state, &u, &req) {
                return e.into_response();
            }
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let (name, groups) = (u.name.clone(), u.groups.clone());
            req.extensions_mut().insert(u);
            let resp = next.run(req).await;
            tracing::debug!(user = %name, ?groups, %method, %path, status = resp.status().as_u16(), "request");
            resp
        }
        None if is_public(req.uri().path()) => next.run(req).await,
        None => StatusError::unauthorized().into_response(),
    }
}

/// The user of a bearer token: a static one (the join token, the node's own), else a service
/// account token; why not, for the log.
pub(super) fn authenticate_token(state: &AppState, token: &str) -> Result<User, String> {
    if let Some(u) = state.tokens.find(token) {
        return Ok(u.clone());
    }
    match state.sa_tokens.get() {
        Some(issuer) if sa_token::looks_like_jwt(token) => {
            issuer.authenticate(&state.registry, token).map_err(|e| e.to_string())
        }
        _ => Err("not a token this server knows".into()),
    }
}

/// The user a request acts as: the one its `Impersonate-User` (and `Impersonate-Group`) headers
/// name, when its own user may `impersonate` them (upstream's `WithImpersonation`: users, groups
/// and service accounts are resources of the core group), else the user itself.
fn impersonate(state: &AppState, user: User, headers: &HeaderMap) -> Result<User, StatusError> {
    let values = |name: &str| -> Vec<String> {
        headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
    };
    let (names, groups) = (values("impersonate-user"), values("impersonate-group"));
    let Some(name) = names.first() else {
        if groups.is_empty() {
            return Ok(user);
        }
        return Err(StatusError::bad_request(format!(
            "requested [{}] without impersonating a user",
            groups.iter().map(|g| format!("{{Group {g}}}")).collect::<Vec<_>>().join(" ")
        )));
    };
    let may = |resource: &str, namespace: &str, name: &str| {
        let attrs = authz::Attributes {
            verb: "impersonate".into(),
            resource: Some(authz::request_info::ResourceAttributes {
                resource: resource.into(),
                namespace: namespace.into(),
                name: name.into(),
                ..Default::default()
            }),
            path: String::new(),
        };
        authz::authorize(&state.registry, &state.authorization, &user, &attrs)
    };
    let mut as_groups = groups.clone();
    match name.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':')) {
        Some((ns, sa)) => {
            may("serviceaccounts", ns, sa)?;
            if groups.is_empty() {
                as_groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")];
            }
        }
        None => may("users", "", name)?,
    }
    for group in &groups {
        may("groups", "", group)?;
    }
    tracing::debug!(user = %user.name, "acting as {name}");
    Ok(User::new(name.clone(), as_groups))
}

/// Authorizes an authenticated request (see [`authz`]).
fn authorize(state: &AppState, user: &User, req: &Request) -> Result<(), StatusError> {
    if user.groups.iter().any(|g| g == authz::MASTERS_GROUP) {
        return Ok(());
    }
    let attrs = authz::Attributes::of(req.method(), req.uri().path(), req.uri().query());
    authz::authorize(&state.registry, &state.authorization, user, &attrs)
}

/// The CA certificate, for anyone: a joining node hashes it and compares with its token's pin.
async fn cacerts(State(state): State<Arc<AppState>>) -> Response {
    match state.pki.get() {
        Some(pki) => ([(header::CONTENT_TYPE, "text/plain")], pki.ca_pem().to_string()).into_response(),
        None => StatusError::service_unavailable("the server's CA is not loaded yet").into_response(),
    }
}

/// The service account issuer's OIDC discovery document (for whom RBAC lets read it:
/// `system:service-account-issuer-discovery` binds every service account).
async fn openid_configuration(State(state): State<Arc<AppState>>) -> Response {
    match state.sa_tokens.get() {
        Some(issuer) => {
            let jwks_uri = format!("https://{}/openid/v1/jwks", state.server_address);
            ([(header::CACHE_CONTROL, "public, max-age=3600")], axum::Json(issuer.discovery(&jwks_uri))).into_response()
        }
        None => StatusError::service_unavailable("the service account issuer is not set up yet").into_response(),
    }
}

/// The public key that verifies service account tokens, as a JSON Web Key Set.
async fn openid_jwks(State(state): State<Arc<AppState>>) -> Response {
    match state.sa_tokens.get() {
        Some(issuer) => (
            [(header::CONTENT_TYPE, "application/jwk-set+json"), (header::CACHE_CONTROL, "public, max-age=3600")],
            issuer.jwks().to_string(),
        )
            .into_response(),
        None => StatusError::service_unavailable("the service account issuer is not set up yet").into_response(),
    }
}

/// A few store figures in the Prometheus text format, as kube-apiserver's `/metrics` serves its own.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let store = state.registry.store();
    let stats = store.stats();
    let body = format!(
        "# HELP cairn_store_flushes_total Flushes of the store to disk; concurrent writes share one.\n\
         # TYPE cairn_store_flushes_total counter\n\
         cairn_store_flushes_total {}\n\
         # HELP cairn_store_writes_total Writes committed to the store.\n\
         # TYPE cairn_store_writes_total counter\n\
         cairn_store_writes_total {}\n\
         # HELP cairn_store_revision The newest resourceVersion.\n\
         # TYPE cairn_store_revision gauge\n\
         cairn_store_revision {}\n",
        stats.flushes,
        stats.writes,
        store.revision()
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn discovery_response(headers: &HeaderMap, state: &AppState, core: bool, legacy: Value) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    match discovery::wants_aggregated(accept) {
        Some(ct) => {
            let body = discovery::aggregated(&state.listed(), core, ct);
            let mut resp = codec::json_value(StatusCode::OK, &body);
            if let Ok(v) = header::HeaderValue::from_str(ct) {
                resp.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            resp
        }
        None => codec::json_value(StatusCode::OK, &legacy),
    }
}

async fn api_root(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let legacy = discovery::api_versions(&state.server_address);
    discovery_response(&headers, &state, true, legacy)
}

async fn apis_root(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let legacy = discovery::api_group_list(&state.listed());
    discovery_response(&headers, &state, false, legacy)
}

async fn core_resources(State(state): State<Arc<AppState>>) -> Response {
    match discovery::resource_list(&state.listed(), "", "v1") {
        Some(v) => codec::json_value(StatusCode::OK, &v),
        None => StatusError::no_route().into_response(),
    }
}

async fn group_root(State(state): State<Arc<AppState>>, Path(group): Path<String>) -> Response {
    match discovery::api_group(&state.listed(), &group) {
        Some(v) => codec::json_value(StatusCode::OK, &v),
        None => StatusError::no_route().into_response(),
    }
}

async fn group_resources(
    State(state): State<Arc<AppState>>,
    Path((group, version)): Path<(String, String)>,
) -> Response {
    match discovery::resource_list(&state.listed(), &group, &version) {
        Some(v) => codec::json_value(StatusCode::OK, &v),
        None => StatusError::no_route().into_response(),
    }
}

/// The content types the OpenAPI documents are served as, as kube-openapi's handlers: JSON, or
/// gnostic's protobuf (asked for under its current or its deprecated name, answered under the
/// current one).
const OPENAPI_JSON: &str = "application/json";
const OPENAPI_V2_PROTO: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
const OPENAPI_V2_PROTO_DEPRECATED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const OPENAPI_V3_PROTO: &str = "application/com.github.proto-openapi.spec.v3.v1.0+protobuf";
const OPENAPI_V3_PROTO_DEPRECATED: &str = "application/com.github.proto-openapi.spec.v3@v1.0+protobuf";

/// The first media type of `Accept` (in the client's order of preference) that `offered` has;
/// JSON for no `Accept` or a wildcard; `None` when nothing offered is acceptable.
fn openapi_format(headers: &HeaderMap, offered: &[&'static str]) -> Option<&'static str> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    let mut ranges: Vec<(f32, &str)> = accept
        .split(',')
        .map(|part| {
            let mut fields = part.split(';');
            let media = fields.next().unwrap_or_default().trim();
            let q = fields.filter_map(|p| p.trim().strip_prefix("q=")).find_map(|q| q.parse().ok()).unwrap_or(1.0);
            (q, media)
        })
        .filter(|(q, _)| *q > 0.0)
        .collect();
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranges.iter().find_map(|(_, media)| match *media {
        "*/*" | "application/*" => Some(OPENAPI_JSON),
        m => offered.iter().find(|o| o.eq_ignore_ascii_case(m)).copied(),
    })
}

fn not_acceptable(offered: &[&str]) -> Response {
    StatusError::not_acceptable(format!("only the following media types are accepted: {}", offered.join(", ")))
        .into_response()
}

async fn openapi_v2(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let offered = [OPENAPI_JSON, OPENAPI_V2_PROTO, OPENAPI_V2_PROTO_DEPRECATED];
    let Some(format) = openapi_format(&headers, &offered) else { return not_acceptable(&offered) };
    let docs = blocking_docs(state).await;
    if format == OPENAPI_JSON {
        return docs.v2.respond(&headers, OPENAPI_JSON);
    }
    let proto = docs.v2_proto.get_or_init(|| docs.v2.converted(openapi::gnostic::encode));
    proto.respond(&headers, OPENAPI_V2_PROTO)
}

async fn openapi_v3_index(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let docs = blocking_docs(state).await;
    docs.v3_index.respond(&headers, OPENAPI_JSON)
}

async fn openapi_v3_doc(State(state): State<Arc<AppState>>, Path(path): Path<String>, headers: HeaderMap) -> Response {
    let offered = [OPENAPI_JSON, OPENAPI_V3_PROTO, OPENAPI_V3_PROTO_DEPRECATED];
    let Some(format) = openapi_format(&headers, &offered) else { return not_acceptable(&offered) };
    let docs = blocking_docs(state).await;
    let Some((_, json, proto)) = docs.v3.iter().find(|(p, ..)| *p == path) else {
        return StatusError::no_route().into_response();
    };
    if format == OPENAPI_JSON {
        return json.respond(&headers, OPENAPI_JSON);
    }
    proto.get_or_init(|| json.converted(openapi::gnostic_v3::encode)).respond(&headers, OPENAPI_V3_PROTO)
}

/// The OpenAPI documents, generated off the async threads the first time.
async fn blocking_docs(state: Arc<AppState>) -> DocsRef {
    let s = state.clone();
    let _ = tokio::task::spawn_blocking(move || {
        s.openapi();
    })
    .await;
    DocsRef(state)
}

struct DocsRef(Arc<AppState>);

impl std::ops::Deref for DocsRef {
    type Target = OpenApiDocs;
    fn deref(&self) -> &OpenApiDocs {
        self.0.openapi()
    }
}

/// Serves HTTPS on `listener` until `shutdown` fires, then drains open connections for a few seconds.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router, shutdown: CancellationToken) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let identity = tls.get_ref().1.peer_certificates().and_then(pki::client_identity);
            let peer_cert = PeerCert(identity.map(|(name, groups)| User::new(name, groups)));
            let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer_cert.clone());
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                app.clone().oneshot(req.map(axum::body::Body::new))
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, "connection ended with an error: {e}");
            }
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => tracing::info!("closing connections still open after 5s"),
    }
}

/// Binds the listener, naming the address in the error.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context as _;
    TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))
}
