//! The resource endpoints: path resolution, query parameters, and one function per verb.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::AppState;
use super::codec::{self, Format};
use crate::registry::patch::PatchType;
use crate::registry::selector::{FieldSelector, LabelSelector};
use crate::registry::validation::FieldError;
use crate::registry::{
    DeleteOptions, Deleted, FieldValidation, ListOptions, Resource, StatusError, Subresource, Watch, WatchItem,
    WatchOptions, WriteOptions,
};

type Result<T, E = StatusError> = std::result::Result<T, E>;

/// Query parameters kube-apiserver understands on resource paths; anything else is rejected.
const KNOWN_PARAMS: &[&str] = &[
    "pretty",
    // pods/log
    "container",
    "follow",
    "previous",
    "timestamps",
    "tailLines",
    "sinceSeconds",
    "sinceTime",
    "limitBytes",
    "insecureSkipTLSVerifyBackend",
    // pods/exec, pods/attach, pods/portforward
    "stdin",
    "stdout",
    "stderr",
    "tty",
    "command",
    "ports",
    "stream",
    "labelSelector",
    "fieldSelector",
    "watch",
    "allowWatchBookmarks",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "limit",
    "continue",
    "sendInitialEvents",
    "dryRun",
    "fieldManager",
    "fieldValidation",
    "force",
    "gracePeriodSeconds",
    "orphanDependents",
    "propagationPolicy",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "includeObject",
    "timeout",
];

/// Longest a watch runs before the server ends it (clients re-establish), as upstream's
/// `--min-request-timeout` default.
/// The longest `fieldManager` (upstream's `FieldManagerMaxLength`).
const FIELD_MANAGER_MAX: usize = 128;

const WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// A resolved resource path.
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<Subresource>,
    /// Legacy `/watch/` path prefix.
    watch: bool,
    /// What follows `proxy/` in a node proxy path.
    proxy_path: String,
    /// The node making the request, when a node makes it: the registry's NodeRestriction applies.
    node: Option<String>,
    /// Who makes the request, for RBAC's escalation checks.
    requester: Option<crate::registry::rbac::Requester>,
    /// The client's `User-Agent` up to its first `/`: the field manager of a write naming none.
    agent: String,
}

/// Parsed query string.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(uri: &Uri) -> Result<Self> {
        let pairs: Vec<(String, String)> =
            form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
        if let Some((k, _)) = pairs.iter().find(|(k, _)| !KNOWN_PARAMS.contains(&k.as_str())) {
            return Err(StatusError::bad_request(format!("unknown query parameter {k:?}")));
        }
        Ok(Self(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn int<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|_| StatusError::bad_request(format!("invalid value for {key}: {s:?} is not a number"))),
        }
    }

    fn dry_run(&self) -> Result<bool> {
        match self.0.iter().filter(|(k, _)| k == "dryRun").map(|(_, v)| v.as_str()).collect::<Vec<_>>().as_slice() {
            [] => Ok(false),
            values if values.iter().all(|v| *v == "All") => Ok(true),
            values => Err(StatusError::bad_request(format!(
                "invalid dryRun value {:?}: the only supported value is \"All\"",
                values.join(",")
            ))),
        }
    }

    /// The options of a create, update or patch; `kind` (`CreateOptions`, `UpdateOptions`,
    /// `PatchOptions`) names them in errors.
    fn write_options(&self, t: &Target, kind: &str) -> Result<WriteOptions> {
        let field_validation = match self.get("fieldValidation") {
            None | Some("") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Warn") => FieldValidation::Warn,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                return Err(StatusError::bad_request(format!(
                    "invalid fieldValidation directive {other:?}: use Ignore, Warn or Strict"
                )));
            }
        };
        let manager = self.get("fieldManager").unwrap_or_default();
        let mut errs = Vec::new();
        if manager.len() > FIELD_MANAGER_MAX {
            errs.push(FieldError::too_long("fieldManager", FIELD_MANAGER_MAX));
        }
        if let Some((i, c)) = manager.chars().enumerate().find(|(_, c)| c.is_control()) {
            errs.push(FieldError::invalid(
                "fieldManager",
                manager,
                format!("invalid character {:?} (at position {i})", c),
            ));
        }
        if !errs.is_empty() {
            return Err(StatusError::invalid(kind, "meta.k8s.io", "", &errs));
        }
        let field_manager = if manager.is_empty() { &t.agent } else { manager };
        Ok(WriteOptions {
            dry_run: self.dry_run()?,
            field_validation,
            node: t.node.clone(),
            requester: t.requester.clone(),
            field_manager: (!field_manager.is_empty()).then(|| field_manager.to_string()),
        })
    }

    fn selectors(&self) -> Result<(LabelSelector, FieldSelector)> {
        selectors(&self.0)
    }
}

/// The `labelSelector` and `fieldSelector` of a query, with upstream's text for a bad one.
pub(super) fn selectors(query: &[(String, String)]) -> Result<(LabelSelector, FieldSelector)> {
    let get = |k: &str| query.iter().rev().find(|(n, _)| n == k).map_or("", |(_, v)| v.as_str());
    let labels = LabelSelector::parse(get("labelSelector"))
        .map_err(|e| StatusError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    let fields = FieldSelector::parse(get("fieldSelector"))
        .map_err(|e| StatusError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
    Ok((labels, fields))
}

/// Resolves `/api/v1/...` and `/apis/{group}/{version}/...` to a resource.
fn resolve(state: &AppState, path: &str) -> Result<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(StatusError::no_route()),
    };
    let (watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let find = |plural: &str| state.registry.find(group, version, plural).ok_or_else(StatusError::no_route);
    // `/api/v1/namespaces/{name}/{sub}` is a namespace's own subresource, not a namespaced list.
    let ns_has_sub = |s: &str| {
        Subresource::parse(s).is_some_and(|sub| {
            state.registry.find("", "v1", "namespaces").is_some_and(|r| r.info().subresources.contains(&sub))
        })
    };
    let mut proxy_path = String::new();
    let (resource, namespace, name, sub) = match rest {
        ["nodes", name, "proxy", path @ ..] if group.is_empty() => {
            proxy_path = path.join("/");
            (find("nodes")?, None, Some(*name), Some("proxy"))
        }
        [res] => (find(res)?, None, None, None),
        ["namespaces", ns, sub] if group.is_empty() && ns_has_sub(sub) => {
            (find("namespaces")?, None, Some(*ns), Some(*sub))
        }
        ["namespaces", ns, res] => (find(res)?, Some(*ns), None, None),
        ["namespaces", ns, res, name] => (find(res)?, Some(*ns), Some(*name), None),
        ["namespaces", ns, res, name, sub] => (find(res)?, Some(*ns), Some(*name), Some(*sub)),
        [res, name] => (find(res)?, None, Some(*name), None),
        [res, name, sub] => (find(res)?, None, Some(*name), Some(*sub)),
        _ => return Err(StatusError::no_route()),
    };
    let info = resource.info();
    if namespace.is_some() && !info.namespaced {
        return Err(StatusError::no_route());
    }
    if name.is_some() && info.namespaced && namespace.is_none() {
        return Err(StatusError::no_route());
    }
    let sub = match sub {
        None => None,
        Some(s) => {
            Some(Subresource::parse(s).filter(|s| info.subresources.contains(s)).ok_or_else(StatusError::no_route)?)
        }
    };
    let (namespace, name) = (namespace.map(str::to_string), name.map(str::to_string));
    Ok(Target { resource, namespace, name, sub, watch, proxy_path, node: None, requester: None, agent: String::new() })
}

/// Entry point for every resource path.
pub async fn dispatch(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    match serve(&state, req).await {
        Ok(resp) => resp,
        Err(e) => codec::error(&e),
    }
}

async fn serve(state: &AppState, req: axum::extract::Request) -> Result<Response> {
    let mut target = resolve(state, req.uri().path())?;
    let user = req.extensions().get::<super::User>();
    target.node = user.and_then(super::authz::node_of).map(str::to_string);
    target.requester = user.map(|u| crate::registry::rbac::Requester {
        name: u.name.clone(),
        groups: u.groups.clone(),
        uid: u.uid.clone(),
        extra: u.extra.clone(),
    });
    target.agent = agent_prefix(req.headers());
    let query = Query::parse(req.uri())?;
    if let (Some(name), Some(sub @ (Subresource::Exec | Subresource::Attach | Subresource::PortForward))) =
        (target.name.as_deref(), target.sub)
    {
        if !matches!(*req.method(), Method::GET | Method::POST) {
            return Err(StatusError::method_not_allowed());
        }
        let ns = target.namespace.as_deref().unwrap_or_default();
        return super::streams::connect(state, ns, name, sub, &query.0, req).await;
    }
    if let (Some(name), Some(Subresource::Proxy)) = (target.name.as_deref(), target.sub) {
        return super::node_proxy::node_proxy(state, name, &target.proxy_path, req).await;
    }
    let (parts, body) = req.into_parts();
    let (method, headers) = (parts.method, parts.headers);
    let body = axum::body::to_bytes(body, codec::MAX_BODY_BYTES)
        .await
        .map_err(|_| StatusError::too_large(codec::MAX_BODY_BYTES))?;
    let t = &target;
    match (&method, t.name.as_deref(), t.sub) {
        (&Method::GET, None, None) if t.watch || query.flag("watch") => watch(state, t, &query, &headers).await,
        (&Method::GET, None, None) => list(state, t, &query, &headers).await,
        (
            &Method::GET,
            Some(name),
            None | Some(Subresource::Status | Subresource::EphemeralContainers | Subresource::Approval),
        ) => {
            let format = codec::negotiate(&headers, query.get("includeObject"))?;
            let obj = state.registry.get(&t.resource, t.namespace.as_deref(), name)?;
            Ok(codec::object(&t.resource, StatusCode::OK, format, obj, &[]))
        }
        (&Method::GET, Some(name), Some(Subresource::Scale)) => {
            let scale = state.registry.get_scale(&t.resource, t.namespace.as_deref(), name)?;
            Ok(codec::json_bytes(StatusCode::OK, scale))
        }
        (&Method::PUT, Some(name), Some(Subresource::Scale)) => {
            let scale = codec::parse_body(&headers, &body)?;
            let opts = query.write_options(t, "UpdateOptions")?;
            let scale = state.registry.update_scale(&t.resource, t.namespace.as_deref(), name, scale, &opts).await?;
            Ok(codec::json_bytes(StatusCode::OK, scale))
        }
        (&Method::PATCH, Some(name), Some(Subresource::Scale)) => {
            let opts = query.write_options(t, "PatchOptions")?;
            let pt = patch_type(&codec::content_type(&headers))?;
            let scale = state.registry.patch_scale(&t.resource, t.namespace.as_deref(), name, &body, pt, &opts).await?;
            Ok(codec::json_bytes(StatusCode::OK, scale))
        }
        (&Method::GET, Some(name), Some(Subresource::Log)) => {
            super::logs::pod_log(state, t.namespace.as_deref().unwrap_or_default(), name, &query.0).await
        }
        (&Method::POST, None, None) => create(state, t, &query, &headers, &body).await,
        (&Method::POST, Some(name), Some(Subresource::Binding)) => bind(state, t, name, &headers, &body).await,
        (&Method::POST, Some(name), Some(Subresource::Token)) => {
            let request = codec::parse_body(&headers, &body)?;
            let issuer =
                state.sa_tokens.get().ok_or_else(|| StatusError::internal("no service account key is loaded"))?;
            let ns = t.namespace.as_deref().unwrap_or("default");
            let (mut answer, grant) =
                state.registry.token_request(ns, name, &request, issuer.policy(), t.node.as_deref())?;
            let (token, expires) = issuer.issue(&grant)?;
            answer["status"] = serde_json::json!({"token": token, "expirationTimestamp": expires.to_string()});
            Ok(codec::json_value(StatusCode::CREATED, &answer))
        }
        (&Method::POST, Some(name), Some(Subresource::Eviction)) => {
            let eviction = codec::parse_body(&headers, &body)?;
            state
                .registry
                .evict(t.namespace.as_deref().unwrap_or("default"), name, &eviction, t.node.as_deref())
                .await?;
            Ok(codec::success(StatusCode::CREATED, None))
        }
        (
            &Method::PUT,
            Some(name),
            None
            | Some(
                Subresource::Status | Subresource::Finalize | Subresource::EphemeralContainers | Subresource::Approval,
            ),
        ) => {
            let format = codec::negotiate(&headers, None)?;
            let obj = codec::parse_body(&headers, &body)?;
            let opts = query.write_options(t, "UpdateOptions")?;
            let w = state.registry.update(&t.resource, t.namespace.as_deref(), name, obj, t.sub, &opts).await?;
            Ok(codec::object(&t.resource, StatusCode::OK, format, w.object, &w.warnings))
        }
        (
            &Method::PATCH,
            Some(name),
            None | Some(Subresource::Status | Subresource::EphemeralContainers | Subresource::Approval),
        ) => patch(state, t, name, &query, &headers, &body).await,
        (&Method::DELETE, Some(name), None) => delete(state, t, name, &query, &headers, &body).await,
        (&Method::DELETE, None, None) => delete_collection(state, t, &query, &headers, &body).await,
        _ => Err(StatusError::method_not_allowed()),
    }
}

/// Upstream's `prefixFromUserAgent`: the `User-Agent` up to its first `/`, printable characters
/// only, at most 128 bytes.
fn agent_prefix(headers: &HeaderMap) -> String {
    let ua = headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut out = String::new();
    for c in ua.split('/').next().unwrap_or_default().chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX {
            break;
        }
        out.push(c);
    }
    out
}

async fn create(state: &AppState, t: &Target, q: &Query, headers: &HeaderMap, body: &[u8]) -> Result<Response> {
    let format = codec::negotiate(headers, None)?;
    let obj = codec::parse_body(headers, body)?;
    let opts = q.write_options(t, "CreateOptions")?;
    let w = state.registry.create(&t.resource, t.namespace.as_deref(), obj, &opts).await?;
    Ok(codec::object(&t.resource, StatusCode::CREATED, format, w.object, &w.warnings))
}

async fn bind(state: &AppState, t: &Target, name: &str, headers: &HeaderMap, body: &[u8]) -> Result<Response> {
    let binding = codec::parse_body(headers, body)?;
    if let Some(kind) = binding.get("kind").and_then(Value::as_str)
        && kind != "Binding"
    {
        return Err(StatusError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind (Binding)"
        )));
    }
    let ns = t.namespace.as_deref().unwrap_or("default");
    state.registry.bind(ns, name, &binding).await?;
    Ok(codec::success(StatusCode::CREATED, None))
}

async fn patch(
    state: &AppState,
    t: &Target,
    name: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response> {
    let format = codec::negotiate(headers, None)?;
    let opts = q.write_options(t, "PatchOptions")?;
    let ct = codec::content_type(headers);
    let ns = t.namespace.as_deref();
    let r = &t.resource;
    if body.len() > codec::MAX_BODY_BYTES {
        return Err(StatusError::too_large(codec::MAX_BODY_BYTES));
    }
    let apply = ct.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case("application/apply-patch+yaml");
    let force = match q.get("force") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => return Err(StatusError::bad_request(format!("invalid value for force: {other:?}"))),
    };
    let invalid = |e: FieldError| StatusError::invalid("PatchOptions", "meta.k8s.io", "", &[e]);
    let w = if apply {
        if q.get("fieldManager").is_none_or(str::is_empty) {
            return Err(invalid(FieldError::required("fieldManager", "is required for apply patch")));
        }
        let config = codec::parse_yaml(body)?;
        state.registry.apply(r, ns, name, config, t.sub, &opts, force.unwrap_or(false)).await?
    } else {
        if force.is_some() {
            return Err(invalid(FieldError::forbidden("force", "may not be specified for non-apply patch")));
        }
        let pt = patch_type(&ct)?;
        state.registry.patch(r, ns, name, body, pt, t.sub, &opts).await?
    };
    let code = if w.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(codec::object(r, code, format, w.object, &w.warnings))
}

/// The patch format a PATCH's content type names.
fn patch_type(ct: &str) -> Result<PatchType> {
    PatchType::from_content_type(ct).ok_or_else(|| {
        StatusError::unsupported_media_type(
            ct,
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "application/strategic-merge-patch+json",
            ],
        )
    })
}

/// Reads `DeleteOptions` from the body (if any) and the query.
fn delete_options(q: &Query, t: &Target, headers: &HeaderMap, body: &[u8]) -> Result<DeleteOptions> {
    let mut opts = DeleteOptions { dry_run: q.dry_run()?, node: t.node.clone(), ..Default::default() };
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v = codec::parse_body(headers, body)?;
        if let Some(kind) = v.get("kind").and_then(Value::as_str)
            && kind != "DeleteOptions"
        {
            return Err(StatusError::bad_request(format!("the request body must be DeleteOptions, not {kind}")));
        }
        opts.grace_period_seconds = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.propagation = v.get("propagationPolicy").and_then(Value::as_str).map(str::to_string);
        if opts.propagation.is_none() {
            opts.propagation = orphan_policy(v.get("orphanDependents").and_then(Value::as_bool));
        }
        opts.uid = v["preconditions"].get("uid").and_then(Value::as_str).map(str::to_string);
        opts.resource_version = v["preconditions"].get("resourceVersion").and_then(Value::as_str).map(str::to_string);
        if v.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All")) {
            opts.dry_run = true;
        }
    }
    if let Some(g) = q.int::<i64>("gracePeriodSeconds")? {
        opts.grace_period_seconds = Some(g);
    }
    if let Some(p) = q.get("propagationPolicy") {
        opts.propagation = Some(p.to_string());
    } else if let Some(o) = q.get("orphanDependents") {
        opts.propagation = orphan_policy(Some(o == "true"));
    }
    Ok(opts)
}

fn orphan_policy(orphan: Option<bool>) -> Option<String> {
    orphan.map(|o| if o { "Orphan".to_string() } else { "Background".to_string() })
}

async fn delete(
    state: &AppState,
    t: &Target,
    name: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response> {
    let format = codec::negotiate(headers, None)?;
    let opts = delete_options(q, t, headers, body)?;
    let r = &t.resource;
    match state.registry.delete(r, t.namespace.as_deref(), name, &opts).await? {
        Deleted::Pending(obj) => Ok(codec::object(r, StatusCode::OK, format, obj, &[])),
        Deleted::Gone(obj) if r.info().return_deleted_object => Ok(codec::object(r, StatusCode::OK, format, obj, &[])),
        Deleted::Gone(obj) => {
            let v: Value = serde_json::from_slice(&obj).map_err(StatusError::internal)?;
            let info = r.info();
            let mut details = json!({"name": name, "kind": info.plural});
            if !info.group.is_empty() {
                details["group"] = json!(info.group);
            }
            if let Some(uid) = v["metadata"].get("uid") {
                details["uid"] = uid.clone();
            }
            Ok(codec::success(StatusCode::OK, Some(details)))
        }
    }
}

async fn delete_collection(
    state: &AppState,
    t: &Target,
    q: &Query,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response> {
    let format = codec::negotiate(headers, None)?;
    let opts = delete_options(q, t, headers, body)?;
    let (labels, fields) = q.selectors()?;
    let list_opts = ListOptions { labels, fields, ..Default::default() };
    let page = state.registry.delete_collection(&t.resource, t.namespace.as_deref(), &list_opts, &opts).await?;
    list_response(&t.resource, format, page.items, list_meta(page.revision, None, None))
}

fn list_meta(revision: u64, continue_token: Option<String>, remaining: Option<usize>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("resourceVersion".into(), json!(revision.to_string()));
    if let Some(c) = continue_token {
        m.insert("continue".into(), json!(c));
    }
    if let Some(r) = remaining {
        m.insert("remainingItemCount".into(), json!(r));
    }
    m
}

/// How long a list or watch from a revision this server has not seen yet waits for it (upstream's
/// watch cache `blockTimeout`).
const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Waits for the store to reach the revision a list or watch names, if it names one; upstream's
/// `Too large resource version` Timeout if it does not within [`FRESHNESS_WAIT`].
async fn fresh_enough(state: &AppState, rv: Option<&str>) -> Result<Option<u64>> {
    let Some(rv) = rv.filter(|s| !s.is_empty() && *s != "0") else { return Ok(None) };
    let rv: u64 = rv.parse().map_err(|_| StatusError::bad_request(format!("invalid resource version: {rv:?}")))?;
    let store = state.registry.store();
    if !store.wait_for(rv, FRESHNESS_WAIT).await {
        return Err(StatusError::too_large_resource_version(rv, store.revision()));
    }
    Ok(Some(rv))
}

/// Upstream's `ValidateListOptions`, for a list (`watch` false) or a watch.
fn validate_list_options(q: &Query, watch: bool) -> Result<()> {
    let mut errs = Vec::new();
    let matching = q.get("resourceVersionMatch").filter(|m| !m.is_empty());
    let path = "resourceVersionMatch";
    if watch {
        if let Some(m) = matching.filter(|m| *m != "NotOlderThan") {
            errs.push(FieldError::not_supported(path, m, &["NotOlderThan"]));
        }
    } else {
        if let Some(m) = matching {
            if q.get("resourceVersion").is_none_or(str::is_empty) {
                errs.push(FieldError::forbidden(
                    path,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if q.get("continue").is_some_and(|c| !c.is_empty()) {
                errs.push(FieldError::forbidden(path, "resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(FieldError::not_supported(path, m, &["Exact", "NotOlderThan", ""]));
            }
            if m == "Exact" && q.get("resourceVersion") == Some("0") {
                errs.push(FieldError::forbidden(
                    path,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if q.get("sendInitialEvents").is_some() {
            errs.push(FieldError::forbidden(
                "sendInitialEvents",
                "sendInitialEvents is only supported on watch requests",
            ));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(StatusError::invalid("ListOptions", "meta.k8s.io", "", &errs)) }
}

async fn list(state: &AppState, t: &Target, q: &Query, headers: &HeaderMap) -> Result<Response> {
    let format = codec::negotiate(headers, q.get("includeObject"))?;
    let (labels, fields) = q.selectors()?;
    validate_list_options(q, false)?;
    let limit = q.int::<i64>("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    if let Some(rv) = fresh_enough(state, q.get("resourceVersion")).await? {
        // Only the newest state is kept: an exact older revision is gone.
        if q.get("resourceVersionMatch") == Some("Exact") && rv != state.registry.store().revision() {
            return Err(StatusError::gone(format!("too old resource version: {rv}")));
        }
    }
    let opts = ListOptions { labels, fields, limit, continue_token: q.get("continue").map(str::to_string) };
    let page = state.registry.list(&t.resource, t.namespace.as_deref(), &opts)?;
    list_response(&t.resource, format, page.items, list_meta(page.revision, page.continue_token, page.remaining))
}

fn list_response(r: &Resource, format: Format, items: Vec<Bytes>, meta: Map<String, Value>) -> Result<Response> {
    let info = r.info();
    match format {
        Format::Table(include) => Ok(codec::json_bytes(StatusCode::OK, codec::table(r, &items, include, meta)?)),
        Format::Json | Format::Yaml | Format::Metadata => {
            let (kind, api_version, items) = if format == Format::Metadata {
                let items = items.iter().map(|i| codec::partial_metadata(i)).collect::<Result<Vec<_>>>()?;
                ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1".to_string(), items)
            } else {
                (info.list_kind(), info.api_version(), items)
            };
            // Items are already encoded; splice them instead of re-encoding the whole list.
            let head = json!({"kind": kind, "apiVersion": api_version, "metadata": meta}).to_string();
            let mut out = BytesMut::with_capacity(head.len() + items.iter().map(|i| i.len() + 1).sum::<usize>() + 16);
            out.put_slice(&head.as_bytes()[..head.len() - 1]);
            out.put_slice(b",\"items\":[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put_u8(b',');
                }
                out.put_slice(item);
            }
            out.put_slice(b"]}");
            let bytes = out.freeze();
            if format == Format::Yaml {
                let v: Value = serde_json::from_slice(&bytes).map_err(StatusError::internal)?;
                return Ok(codec::yaml(StatusCode::OK, &v));
            }
            Ok(codec::json_bytes(StatusCode::OK, bytes))
        }
    }
}

struct WatchStream {
    watch: Watch,
    resource: Resource,
    format: Format,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    done: bool,
}

async fn watch(state: &AppState, t: &Target, q: &Query, headers: &HeaderMap) -> Result<Response> {
    let format = codec::negotiate(headers, q.get("includeObject"))?;
    let (labels, mut fields) = q.selectors()?;
    validate_list_options(q, true)?;
    fresh_enough(state, q.get("resourceVersion")).await?;
    if let Some(name) = &t.name {
        fields = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(|e| StatusError::bad_request(e.to_string()))?;
    }
    let send_initial_events = q.flag("sendInitialEvents");
    let bookmarks = q.flag("allowWatchBookmarks");
    if send_initial_events && !bookmarks {
        return Err(StatusError::bad_request("sendInitialEvents requires allowWatchBookmarks=true"));
    }
    let timeout = q.int::<u64>("timeoutSeconds")?.map(Duration::from_secs).unwrap_or(WATCH_TIMEOUT).min(WATCH_TIMEOUT);
    let opts = WatchOptions {
        labels,
        fields,
        resource_version: q.get("resourceVersion").map(str::to_string),
        send_initial_events,
    };
    let w = match state.registry.watch(&t.resource, t.namespace.as_deref(), opts) {
        Ok(w) => w,
        // As upstream's watch cache: a revision outside the history is an ERROR event in a 200 stream.
        Err(e) if e.code == 410 => {
            let line = event_line("ERROR", &serde_json::to_vec(&codec::status_body(&e)).unwrap_or_default());
            return Ok(codec::json_bytes(StatusCode::OK, line));
        }
        Err(e) => return Err(e),
    };
    let now = Instant::now();
    let st = WatchStream {
        watch: w,
        resource: t.resource.clone(),
        format,
        deadline: now + timeout,
        bookmarks,
        next_bookmark: now + BOOKMARK_EVERY,
        done: false,
    };
    let stream = futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let chunk = next_chunk(&mut st).await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), st))
    });
    let mut resp = Response::new(Body::from_stream(stream.boxed()));
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(codec::JSON));
    Ok(resp)
}

/// The next encoded line of a watch, or `None` when the watch ends.
async fn next_chunk(st: &mut WatchStream) -> Option<Bytes> {
    let bookmark_at = if st.bookmarks { st.next_bookmark } else { st.deadline };
    tokio::select! {
        item = st.watch.next() => Some(match item {
            Ok(item) => encode_event(st, item),
            Err(e) => {
                st.done = true;
                event_line("ERROR", &serde_json::to_vec(&codec::status_body(&e)).unwrap_or_default())
            }
        }),
        _ = tokio::time::sleep_until(st.deadline) => None,
        _ = tokio::time::sleep_until(bookmark_at), if st.bookmarks => {
            st.next_bookmark = Instant::now() + BOOKMARK_EVERY;
            let revision = st.watch.revision();
            Some(encode_event(st, WatchItem::Bookmark { revision, initial_end: false }))
        }
    }
}

fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.put_slice(b"{\"type\":\"");
    out.put_slice(kind.as_bytes());
    out.put_slice(b"\",\"object\":");
    out.put_slice(object);
    out.put_slice(b"}\n");
    out.freeze()
}

fn encode_event(st: &WatchStream, item: WatchItem) -> Bytes {
    let kind = item.kind();
    let info = st.resource.info();
    let object = match item {
        WatchItem::Added(o) | WatchItem::Modified(o) | WatchItem::Deleted(o) => o,
        WatchItem::Bookmark { revision, initial_end } => {
            let mut meta = json!({"resourceVersion": revision.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            let v = if st.format == Format::Metadata {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            } else {
                json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": meta})
            };
            return event_line(kind, &serde_json::to_vec(&v).unwrap_or_default());
        }
    };
    match st.format {
        Format::Table(include) => {
            let rv = serde_json::from_slice::<Value>(&object)
                .ok()
                .and_then(|v| v["metadata"]["resourceVersion"].as_str().map(str::to_string))
                .unwrap_or_default();
            let mut meta = Map::new();
            meta.insert("resourceVersion".into(), json!(rv));
            match codec::table(&st.resource, std::slice::from_ref(&object), include, meta) {
                Ok(t) => event_line(kind, &t),
                Err(e) => event_line("ERROR", &serde_json::to_vec(&codec::status_body(&e)).unwrap_or_default()),
            }
        }
        Format::Metadata => match codec::partial_metadata(&object) {
            Ok(m) => event_line(kind, &m),
            Err(e) => event_line("ERROR", &serde_json::to_vec(&codec::status_body(&e)).unwrap_or_default()),
        },
        Format::Json | Format::Yaml => event_line(kind, &object),
    }
}
