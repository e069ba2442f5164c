//! kube-apiserver's health endpoints: `/healthz`, `/livez` and `/readyz` run their checks and answer
//! `ok` (or, with `?verbose`, one `[+]name ok` line per check); `?exclude=name` skips a check; each
//! check also answers on its own path (`/readyz/etcd`). A failed check is a 500 that lists every
//! check, its reason withheld, as upstream (the endpoints are public).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// How long the datastore check waits (upstream's `--etcd-healthcheck-timeout`).
const DATASTORE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Healthz,
    Livez,
    Readyz,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Healthz => "healthz",
            Endpoint::Livez => "livez",
            Endpoint::Readyz => "readyz",
        }
    }

    /// The checks, in upstream's order.
    fn checks(self) -> &'static [&'static str] {
        match self {
            Endpoint::Readyz => &["ping", "log", "etcd", "etcd-readiness", "informer-sync"],
            Endpoint::Healthz | Endpoint::Livez => &["ping", "log", "etcd"],
        }
    }
}

/// Runs one check; the error is for the check's own path only.
async fn run(state: &AppState, check: &str) -> Result<(), String> {
    match check {
        "etcd" | "etcd-readiness" => {
            match tokio::time::timeout(DATASTORE_TIMEOUT, state.registry.store().healthy()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("the datastore did not answer within {DATASTORE_TIMEOUT:?}")),
            }
        }
        "informer-sync" if !state.ready.load(Ordering::Acquire) => Err("start-up has not finished".into()),
        _ => Ok(()),
    }
}

fn text(code: StatusCode, body: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], body)
        .into_response()
}

async fn all(state: &AppState, endpoint: Endpoint, query: Option<String>) -> Response {
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect();
    let mut excluded: Vec<&str> = pairs.iter().filter(|(k, _)| k == "exclude").map(|(_, v)| v.as_str()).collect();
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let mut out = String::new();
    let mut failed = false;
    for check in endpoint.checks() {
        if let Some(i) = excluded.iter().position(|e| e == check) {
            excluded.remove(i);
            out.push_str(&format!("[+]{check} excluded: ok\n"));
        } else if run(state, check).await.is_ok() {
            out.push_str(&format!("[+]{check} ok\n"));
        } else {
            failed = true;
            out.push_str(&format!("[-]{check} failed: reason withheld\n"));
        }
    }
    if !excluded.is_empty() {
        let names: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
        out.push_str(&format!("warn: some health checks cannot be excluded: no matches for {}\n", names.join(",")));
    }
    let name = endpoint.name();
    if failed {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{out}{name} check failed\n"));
    }
    if !verbose {
        return text(StatusCode::OK, "ok".into());
    }
    text(StatusCode::OK, format!("{out}{name} check passed\n"))
}

async fn one(state: &AppState, endpoint: Endpoint, check: &str) -> Response {
    if !endpoint.checks().contains(&check) {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    }
    match run(state, check).await {
        Ok(()) => text(StatusCode::OK, "ok".into()),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {e}\n")),
    }
}

pub async fn healthz(State(state): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    all(&state, Endpoint::Healthz, q).await
}

pub async fn livez(State(state): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    all(&state, Endpoint::Livez, q).await
}

pub async fn readyz(State(state): State<Arc<AppState>>, RawQuery(q): RawQuery) -> Response {
    all(&state, Endpoint::Readyz, q).await
}

pub async fn healthz_check(State(state): State<Arc<AppState>>, Path(check): Path<String>) -> Response {
    one(&state, Endpoint::Healthz, &check).await
}

pub async fn livez_check(State(state): State<Arc<AppState>>, Path(check): Path<String>) -> Response {
    one(&state, Endpoint::Livez, &check).await
}

pub async fn readyz_check(State(state): State<Arc<AppState>>, Path(check): Path<String>) -> Response {
    one(&state, Endpoint::Readyz, &check).await
}
