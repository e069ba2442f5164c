//! Validation of probes and lifecycle hooks.

use super::*;

/// The actions a probe or lifecycle hook may take; exactly one must be set.
pub(super) struct Handler<'a> {
    exec: Option<&'a Option<Vec<String>>>,
    http_get: Option<&'a HTTPGetAction>,
    tcp_port: Option<&'a IntOrString>,
    grpc_port: Option<i32>,
    sleep_seconds: Option<i64>,
}

impl<'a> Handler<'a> {
    fn of_probe(p: &'a Probe) -> Self {
        Handler {
            exec: p.exec.as_ref().map(|e| &e.command),
            http_get: p.http_get.as_ref(),
            tcp_port: p.tcp_socket.as_ref().map(|t| &t.port),
            grpc_port: p.grpc.as_ref().map(|g| g.port),
            sleep_seconds: None,
        }
    }

    fn of_hook(h: &'a LifecycleHandler) -> Self {
        Handler {
            exec: h.exec.as_ref().map(|e| &e.command),
            http_get: h.http_get.as_ref(),
            tcp_port: h.tcp_socket.as_ref().map(|t| &t.port),
            grpc_port: None,
            sleep_seconds: h.sleep.as_ref().map(|s| s.seconds),
        }
    }
}

pub(super) fn validate_handler(h: Handler, path: &str, grace_period: Option<i64>, out: &mut ErrorList) {
    let mut count = 0;
    let mut first = |field: &str, out: &mut ErrorList| {
        count += 1;
        if count > 1 {
            let detail = "may not specify more than 1 handler type";
            out.push(FieldError::forbidden(format!("{path}.{field}"), detail));
        }
        count == 1
    };
    if let Some(command) = h.exec
        && first("exec", out)
        && slice(command).is_empty()
    {
        out.push(required(&format!("{path}.exec.command")));
    }
    if let Some(get) = h.http_get
        && first("httpGet", out)
    {
        validate_http_get(get, &format!("{path}.httpGet"), out);
    }
    if let Some(port) = h.tcp_port
        && first("tcpSocket", out)
    {
        validate_port_num_or_name(port, &format!("{path}.tcpSocket.port"), out);
    }
    if let Some(port) = h.grpc_port
        && first("grpc", out)
    {
        validate_port_num_or_name(&IntOrString::Int(port), &format!("{path}.grpc.port"), out);
    }
    if let Some(seconds) = h.sleep_seconds
        && first("sleep", out)
        && let Some(grace) = grace_period
        && !(0..=grace).contains(&seconds)
    {
        let detail = format!("must be non-negative and less than terminationGracePeriodSeconds ({grace})");
        out.push(invalid_raw(&format!("{path}.sleep"), seconds, &detail));
    }
    if count == 0 {
        out.push(FieldError::required(path, "must specify a handler type"));
    }
}

pub(super) fn validate_http_get(get: &HTTPGetAction, path: &str, out: &mut ErrorList) {
    if opt(&get.path).is_empty() {
        out.push(required(&format!("{path}.path")));
    }
    validate_port_num_or_name(&get.port, &format!("{path}.port"), out);
    let scheme = opt(&get.scheme);
    if !HTTP_SCHEMES.contains(&scheme) {
        out.push(FieldError::not_supported(format!("{path}.scheme"), scheme, HTTP_SCHEMES));
    }
    for header in slice(&get.http_headers) {
        let valid = !header.name.is_empty() && header.name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
        if !valid {
            let msg = "a valid HTTP header must consist of alphanumeric characters or '-'";
            let detail = regex_error(msg, "[-A-Za-z0-9]+", &["X-Header-Name"]);
            out.push(FieldError::invalid(format!("{path}.httpHeaders"), &header.name, detail));
        }
    }
}

pub(super) fn validate_port_num_or_name(port: &IntOrString, path: &str, out: &mut ErrorList) {
    match port {
        IntOrString::Int(n) => {
            if let Some(e) = port_num_error((*n).into()) {
                out.push(invalid_raw(path, n, &e));
            }
        }
        IntOrString::String(name) => push_msgs(out, path, name, port_name_errors(name)),
    }
}

/// Lifecycle hooks and probes of a regular or restartable init container.
pub(super) fn validate_lifecycle_and_probes(c: &Container, path: &str, grace_period: Option<i64>, out: &mut ErrorList) {
    if let Some(lifecycle) = &c.lifecycle {
        for (hook, field) in [(&lifecycle.post_start, "postStart"), (&lifecycle.pre_stop, "preStop")] {
            if let Some(hook) = hook {
                let path = format!("{path}.lifecycle.{field}");
                validate_handler(Handler::of_hook(hook), &path, grace_period, out);
            }
        }
    }
    let probes = [
        (&c.liveness_probe, "livenessProbe"),
        (&c.readiness_probe, "readinessProbe"),
        (&c.startup_probe, "startupProbe"),
    ];
    for (probe, field) in probes {
        let Some(probe) = probe else { continue };
        let path = format!("{path}.{field}");
        validate_handler(Handler::of_probe(probe), &path, grace_period, out);
        let counters = [
            (probe.initial_delay_seconds, "initialDelaySeconds"),
            (probe.timeout_seconds, "timeoutSeconds"),
            (probe.period_seconds, "periodSeconds"),
            (probe.success_threshold, "successThreshold"),
            (probe.failure_threshold, "failureThreshold"),
        ];
        for (value, name) in counters {
            check_nonnegative(value.unwrap_or(0).into(), &format!("{path}.{name}"), out);
        }
        let grace_path = format!("{path}.terminationGracePeriodSeconds");
        if let Some(grace) = probe.termination_grace_period_seconds
            && grace <= 0
        {
            out.push(invalid_raw(&grace_path, grace, "must be greater than 0"));
        }
        if field == "readinessProbe" {
            if let Some(grace) = probe.termination_grace_period_seconds {
                out.push(invalid_raw(&grace_path, grace, "must not be set for readinessProbes"));
            }
        } else if probe.success_threshold.unwrap_or(0) != 1 {
            let value = probe.success_threshold.unwrap_or(0);
            out.push(invalid_raw(&format!("{path}.successThreshold"), value, "must be 1"));
        }
    }
}
