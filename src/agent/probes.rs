//! Container probes and lifecycle hooks, as kubelet runs them: one probe attempt (`run_probe`), one
//! hook (`run_hook`), and the probe manager that keeps one worker per (pod, container, probe kind)
//! and caches their results. Messages follow kubelet's wording, so events read as upstream's.

mod grpc;
mod http;
mod manager;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, ExecAction, LifecycleHandler, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use manager::{Kind, ProbeEvent, ProbeManager, What};

/// The Kubernetes version in `User-Agent: kube-probe/<major>.<minor>`.
const KUBE_VERSION: &str = "1.37";
/// Most bytes of a command's output or a response body kept (kubelet's `maxReadLength`).
pub const MAX_OUTPUT: usize = 10 << 10;
/// How long past its own timeout an exec is given before it is abandoned; the runtime enforces the
/// timeout itself, this only bounds a runtime that does not answer.
const EXEC_GRACE: Duration = Duration::from_secs(1);
/// `timeoutSeconds` when unset.
const DEFAULT_TIMEOUT_SECONDS: i32 = 1;
/// How often kubelet retries a probe that errored, within one period (`maxProbeRetries`).
const MAX_PROBE_RETRIES: usize = 3;

/// What a command run in a container produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs a command in a running container (CRI `ExecSync`). An implementation that gives up because
/// `timeout` passed returns an error containing [`ExecTimeout`]; any other error means the command
/// could not be run at all.
pub trait Exec: Send + Sync + 'static {
    fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> BoxFuture<'_, anyhow::Result<ExecOutput>>;
}

/// The error an [`Exec`] returns when the command ran past its timeout (CRI's `DeadlineExceeded`).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("command timed out")]
pub struct ExecTimeout;

/// Where a probe or hook goes: the pod's IP, the container (for exec) and its declared ports (for
/// named ports).
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub pod_ip: Option<String>,
    pub container_id: String,
    pub ports: Vec<ContainerPort>,
    /// The container's `env`, for `$(VAR)` references in exec probe commands (only literal values
    /// expand; a `valueFrom` variable expands to the empty string, as upstream).
    pub env: Vec<EnvVar>,
}

impl Target {
    pub fn new(container: &Container, container_id: &str, pod_ip: Option<String>) -> Self {
        Target {
            pod_ip,
            container_id: container_id.to_string(),
            ports: container.ports.clone().unwrap_or_default(),
            env: container.env.clone().unwrap_or_default(),
        }
    }
}

/// The result of one probe attempt (upstream's `probe.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    /// A success worth an event: an HTTP probe stopped at a redirect to another host.
    Warning,
    Failure,
    /// The probe could not be run (a bad port, a runtime error); the attempt does not count.
    Unknown,
}

/// One probe attempt: the result and its output (a command's output, a response body, or why it
/// failed or errored), at most [`MAX_OUTPUT`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub result: ProbeResult,
    pub output: String,
}

impl Outcome {
    fn new(result: ProbeResult, output: impl Into<String>) -> Self {
        Outcome { result, output: output.into() }
    }
}

/// Runs one attempt of `probe` against `target`, within the probe's `timeoutSeconds`.
pub async fn run_probe(probe: &Probe, target: &Target, exec: &dyn Exec) -> Outcome {
    let timeout = seconds(probe.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS).max(1).into());
    if let Some(action) = &probe.exec {
        exec_probe(action, target, exec, timeout).await
    } else if let Some(action) = &probe.http_get {
        let request = match http::Request::new(action, target, "probe") {
            Ok(request) => request,
            Err(e) => return Outcome::new(ProbeResult::Unknown, e),
        };
        http::probe(request, timeout).await
    } else if let Some(action) = &probe.tcp_socket {
        let port = match resolve_port(&action.port, &target.ports) {
            Ok(port) => port,
            Err(e) => return Outcome::new(ProbeResult::Unknown, e),
        };
        let host = non_empty(&action.host).or(target.pod_ip.as_deref()).unwrap_or_default();
        match http::dial(host, port, Some(tokio::time::Instant::now() + timeout)).await {
            Ok(_) => Outcome::new(ProbeResult::Success, ""),
            Err(e) => Outcome::new(ProbeResult::Failure, e.to_string()),
        }
    } else if let Some(action) = &probe.grpc {
        let host = target.pod_ip.as_deref().unwrap_or_default();
        grpc::probe(host, action, timeout).await
    } else {
        Outcome::new(ProbeResult::Unknown, format!("missing probe handler for container {}", target.container_id))
    }
}

async fn exec_probe(action: &ExecAction, target: &Target, exec: &dyn Exec, timeout: Duration) -> Outcome {
    let cmd = expand_command(action.command.as_deref().unwrap_or_default(), &target.env);
    let timed_out = || Outcome::new(ProbeResult::Failure, format!("command {:?} timed out", cmd.join(" ")));
    match tokio::time::timeout(timeout + EXEC_GRACE, exec.exec(&target.container_id, cmd.clone(), timeout)).await {
        Err(_) => timed_out(),
        Ok(Err(e)) if e.downcast_ref::<ExecTimeout>().is_some() => timed_out(),
        Ok(Err(e)) => Outcome::new(ProbeResult::Unknown, format!("{e:#}")),
        Ok(Ok(out)) => {
            let result = if out.exit_code == 0 { ProbeResult::Success } else { ProbeResult::Failure };
            Outcome::new(result, combined_output(&out))
        }
    }
}

/// Runs a `postStart` or `preStop` handler within `budget`. The error is the detail of upstream's
/// event message; [`hook_failure_message`] builds the whole message.
pub async fn run_hook(
    handler: &LifecycleHandler,
    target: &Target,
    exec: &dyn Exec,
    budget: Duration,
) -> Result<(), String> {
    if let Some(sleep) = &handler.sleep {
        let wanted = seconds(sleep.seconds);
        if wanted > budget {
            tokio::time::sleep(budget).await;
            return Err("container terminated before sleep hook finished".to_string());
        }
        tokio::time::sleep(wanted).await;
        return Ok(());
    }
    let run = async {
        if let Some(action) = &handler.exec {
            let cmd = action.command.clone().unwrap_or_default();
            let joined = cmd.join(" ");
            match exec.exec(&target.container_id, cmd, budget).await {
                Ok(out) if out.exit_code == 0 => Ok(()),
                Ok(out) => Err(format!(
                    "command '{joined}' exited with {}: {}, message: {:?}",
                    out.exit_code,
                    lossy(&out.stderr),
                    combined_output(&out)
                )),
                Err(e) if e.downcast_ref::<ExecTimeout>().is_some() => {
                    Err(format!("command {joined:?} timed out, message: \"\""))
                }
                Err(e) => Err(format!("{e:#}, message: \"\"")),
            }
        } else if let Some(action) = &handler.http_get {
            if non_empty(&action.host).is_none() && non_empty(&target.pod_ip).is_none() {
                return Err("failed to find networking container: the pod has no IP".to_string());
            }
            let request = http::Request::new(action, target, "lifecycle")?;
            http::hook(request).await
        } else {
            // tcpSocket is accepted by the API for compatibility but was never a working hook.
            Err(format!("invalid handler: {}", go_handler(handler)))
        }
    };
    match tokio::time::timeout(budget, run).await {
        Ok(result) => result,
        Err(_) => Err(format!("hook did not complete within {}", go_duration(budget))),
    }
}

/// Upstream's event message for a failed hook (`FailedPostStartHook`); `pod` is kubelet's
/// `format.Pod`: `name_namespace(uid)`.
pub fn hook_failure_message(handler: &LifecycleHandler, container: &str, pod: &str, error: &str) -> String {
    if let Some(action) = &handler.exec {
        let cmd = action.command.as_deref().unwrap_or_default().join(" ");
        format!("Exec lifecycle hook ([{cmd}]) for Container {container:?} in Pod {pod:?} failed - error: {error}")
    } else if let Some(action) = &handler.http_get {
        let path = action.path.as_deref().unwrap_or_default();
        format!("HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}")
    } else if let Some(sleep) = &handler.sleep {
        format!(
            "Sleep lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {error}",
            sleep.seconds
        )
    } else {
        format!("Cannot run handler: {error}")
    }
}

/// Upstream's `probe.ResolveContainerPort`: a number, or a name looked up in the container's ports,
/// or a number written as a string.
fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => match ports.iter().find(|p| p.name.as_deref() == Some(name.as_str())) {
            Some(p) => i64::from(p.container_port),
            None => atoi(name)?,
        },
    };
    match u16::try_from(number) {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(format!("invalid port number: {number}")),
    }
}

/// Go's `strconv.Atoi`, with its error text.
fn atoi(s: &str) -> Result<i64, String> {
    s.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        format!("strconv.Atoi: parsing {s:?}: {why}")
    })
}

/// Upstream's `ExpandContainerCommandOnlyStatic`: `$(VAR)` becomes the variable's literal value
/// (unknown names stay as written), `$$` becomes `$`.
fn expand_command(cmd: &[String], env: &[EnvVar]) -> Vec<String> {
    let values: HashMap<&str, &str> =
        env.iter().map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default())).collect();
    cmd.iter().map(|arg| expand(arg, &values)).collect()
}

fn expand(input: &str, values: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(reference) = after.strip_prefix('(') {
            match reference.find(')') {
                Some(end) => {
                    let name = &reference[..end];
                    match values.get(name) {
                        Some(value) => out.push_str(value),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &reference[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = reference;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// stdout then stderr, as kubelet's `RunInContainer` returns them, cut to [`MAX_OUTPUT`].
fn combined_output(out: &ExecOutput) -> String {
    let mut bytes = Vec::with_capacity((out.stdout.len() + out.stderr.len()).min(MAX_OUTPUT));
    bytes.extend_from_slice(&out.stdout[..out.stdout.len().min(MAX_OUTPUT)]);
    let room = MAX_OUTPUT - bytes.len();
    bytes.extend_from_slice(&out.stderr[..out.stderr.len().min(room)]);
    lossy(&bytes)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]).into_owned()
}

/// Cuts `s` to at most [`MAX_OUTPUT`] bytes, on a character boundary.
fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut end = MAX_OUTPUT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

fn seconds(n: i64) -> Duration {
    Duration::from_secs(n.max(0).unsigned_abs())
}

/// A duration as Go's `time.Duration` prints it: `1s`, `1.5s`, `1m30s`, `2h0m0s`.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    let mut secs = format!("{}", s % 60);
    if d.subsec_nanos() != 0 {
        let fraction = format!("{:09}", d.subsec_nanos());
        secs = format!("{secs}.{}", fraction.trim_end_matches('0'));
    }
    match (s / 3600, s / 60 % 60) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

/// A handler the way Go's `%v` prints it, for the invalid-handler message.
fn go_handler(h: &LifecycleHandler) -> String {
    let tcp = match &h.tcp_socket {
        Some(t) => {
            let port = match &t.port {
                IntOrString::Int(n) => format!("{{0 {n} }}"),
                IntOrString::String(s) => format!("{{1 0 {s}}}"),
            };
            format!("&TCPSocketAction{{Port:{port},Host:{},}}", t.host.as_deref().unwrap_or_default())
        }
        None => "nil".to_string(),
    };
    format!("&LifecycleHandler{{Exec:nil,HTTPGet:nil,TCPSocket:{tcp},Sleep:nil,}}")
}
