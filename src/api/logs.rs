//! `GET /api/v1/namespaces/{ns}/pods/{name}/log`: a container's log, read from the CRI log files the
//! node agent keeps, with kubelet's rules for choosing the container (`validateContainerLogStatus`).

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::AppState;
use crate::agent::logs::{self, LogOptions, LogOptionsError};
use crate::agent::spec;
use crate::registry::StatusError;

type Result<T> = std::result::Result<T, StatusError>;

fn get_pod(state: &AppState, ns: &str, name: &str) -> Result<Pod> {
    let pods = state.registry.find("", "v1", "pods").ok_or_else(StatusError::no_route)?;
    let value = state.registry.get_value(&pods, Some(ns), name)?;
    serde_json::from_value(value).map_err(|e| StatusError::internal(format!("stored pod {ns}/{name}: {e}")))
}

/// The container whose log is wanted: the one named, the default-container annotation's, or the
/// only one.
fn container_name(pod: &Pod, asked: Option<&str>) -> Result<String> {
    let name = spec::name(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let apps: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let inits: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    let chosen = match asked.filter(|a| !a.is_empty()) {
        Some(c) => c.to_string(),
        None => {
            let default = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
                .filter(|d| apps.contains(&d.as_str()));
            match (default, apps.as_slice()) {
                (Some(d), _) => d.clone(),
                (None, [only]) => only.to_string(),
                _ => {
                    let mut message = format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        apps.join(" ")
                    );
                    if !inits.is_empty() {
                        message.push_str(&format!(" or one of the init containers: [{}]", inits.join(" ")));
                    }
                    return Err(StatusError::bad_request(message));
                }
            }
        }
    };
    if !apps.contains(&chosen.as_str()) && !inits.contains(&chosen.as_str()) {
        return Err(StatusError::bad_request(format!("container {chosen} is not valid for pod {name}")));
    }
    Ok(chosen)
}

fn status_of<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .flatten()
        .find(|s| s.name == container)
}

/// Which run of the container to read (its restart count names the log file), as kubelet picks it:
/// the running or finished one; while it waits to restart, the last one that ran; `previous` asks
/// for the run before.
fn which_run(pod: &Pod, container: &str, previous: bool) -> Result<i32> {
    let name = spec::name(pod);
    let status = status_of(pod, container);
    let state = status.and_then(|s| s.state.clone()).unwrap_or_default();
    let last_ran = status.and_then(|s| s.last_state.as_ref()).and_then(|l| l.terminated.as_ref()).is_some();
    let count = status.map_or(0, |s| s.restart_count);
    if previous {
        if !last_ran {
            return Err(StatusError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            )));
        }
        // While waiting, lastState is the newest run; otherwise the one before the current.
        return Ok(if state.waiting.is_some() { count } else { count - 1 });
    }
    if state.running.is_some() || state.terminated.is_some() || (state.waiting.is_some() && last_ran) {
        return Ok(count);
    }
    let reason = state.waiting.and_then(|w| w.reason).unwrap_or_else(|| "ContainerCreating".into());
    Err(StatusError::bad_request(format!("container \"{container}\" in pod \"{name}\" is waiting to start: {reason}")))
}

pub fn pod_log(state: &AppState, ns: &str, name: &str, query: &[(String, String)]) -> Result<Response> {
    let pod = get_pod(state, ns, name)?;
    let opts = LogOptions::from_query(query, chrono::Utc::now()).map_err(|e| match e {
        LogOptionsError::BadRequest(message) => StatusError::bad_request(message),
        LogOptionsError::Invalid(errs) => StatusError::invalid("PodLogOptions", "", name, &errs),
    })?;
    let container = container_name(&pod, opts.container.as_deref())?;
    let Some(root) = state.pod_logs.get() else {
        return Err(StatusError::bad_request(format!(
            "no node agent runs in this server (--disable-agent): the logs of pod {name} are not available"
        )));
    };
    let run = which_run(&pod, &container, opts.previous)?;
    let path: PathBuf = spec::log_dir(root, &pod).join(spec::log_path(&container, run));
    if !path.exists() {
        return Err(StatusError::bad_request(format!(
            "the log of container \"{container}\" in pod \"{name}\" is not available (it may have been removed)"
        )));
    }
    // Following ends once that run of the container is no longer running.
    let (registry, pods) = (state.registry.clone(), state.registry.find("", "v1", "pods"));
    let (ns, name, uid) = (ns.to_string(), name.to_string(), spec::uid(&pod).to_string());
    let container_id = status_of(&pod, &container).and_then(|s| s.container_id.clone());
    let previous = opts.previous;
    let alive = move || {
        // A previous run has ended already.
        let Some(pods) = pods.as_ref().filter(|_| !previous) else { return false };
        let Ok(current) = registry.get_value(pods, Some(&ns), &name) else { return false };
        let Ok(current) = serde_json::from_value::<Pod>(current) else { return false };
        spec::uid(&current) == uid
            && status_of(&current, &container).is_some_and(|s| {
                s.container_id == container_id && s.state.as_ref().is_some_and(|st| st.running.is_some())
            })
    };
    let stream = logs::read(path, opts, alive);
    let mut resp = Response::new(Body::from_stream(stream.boxed()));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(resp)
}
