//! Validation of containers: names, images, ports, env, mounts, restart policies.

use super::*;

pub(super) fn validate_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
    let path = "spec.containers";
    if spec.containers.is_empty() {
        out.push(required(path));
        return;
    }
    let mut names = HashSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let path = index(path, i);
        validate_container_common(c, &path, ctx, out);
        if !names.insert(c.name.as_str()) {
            out.push(FieldError::duplicate(format!("{path}.name"), &c.name));
        }
        validate_lifecycle_and_probes(c, &path, ctx.grace_period, out);
        if c.restart_policy.is_some() {
            out.push(FieldError::forbidden(format!("{path}.restartPolicy"), "may not be set for non-init containers"));
        }
    }
    check_host_port_conflicts(&spec.containers, path, out);
}

pub(super) fn validate_init_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
    let mut names: HashSet<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    for (i, c) in slice(&spec.init_containers).iter().enumerate() {
        let path = index("spec.initContainers", i);
        validate_container_common(c, &path, ctx, out);
        if let Some(policy) = &c.restart_policy
            && policy != "Always"
        {
            out.push(FieldError::not_supported(format!("{path}.restartPolicy"), policy, &["Always"]));
        }
        if names.contains(c.name.as_str()) {
            out.push(FieldError::duplicate(format!("{path}.name"), &c.name));
        } else if !c.name.is_empty() {
            names.insert(&c.name);
        }
        // Init containers run one at a time, so ports only clash within one (reported at index 0).
        check_host_port_conflicts(std::slice::from_ref(c), "spec.initContainers", out);
        if c.restart_policy.as_deref() == Some("Always") {
            validate_lifecycle_and_probes(c, &path, ctx.grace_period, out);
            continue;
        }
        let set = [
            ("lifecycle", c.lifecycle.is_some()),
            ("livenessProbe", c.liveness_probe.is_some()),
            ("readinessProbe", c.readiness_probe.is_some()),
            ("startupProbe", c.startup_probe.is_some()),
        ];
        for (field, _) in set.into_iter().filter(|(_, set)| *set) {
            out.push(FieldError::forbidden(
                format!("{path}.{field}"),
                "may not be set for init containers without restartPolicy=Always",
            ));
        }
    }
}

/// `validateEphemeralContainers`: the container rules, names unique across the pod, a target
/// among the regular and init containers, and none of what the pod's services would rely on
/// (ports, resources, probes, lifecycle, restart rules) nor subPaths.
pub(super) fn validate_ephemeral_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
    let others: HashSet<&str> =
        spec.containers.iter().chain(slice(&spec.init_containers)).map(|c| c.name.as_str()).collect();
    let mut names = others.clone();
    for (i, ec) in slice(&spec.ephemeral_containers).iter().enumerate() {
        let path = index("spec.ephemeralContainers", i);
        let c = ephemeral_as_container(ec);
        validate_container_common(&c, &path, ctx, out);
        check_image_whitespace(opt(&c.image), &path, out);
        if !names.insert(ec.name.as_str()) {
            out.push(FieldError::duplicate(format!("{path}.name"), &ec.name));
        }
        let target = opt(&ec.target_container_name);
        if !target.is_empty() && !others.contains(target) {
            out.push(not_found(&format!("{path}.targetContainerName"), target, ""));
        }
        let disallowed = [
            ("ports", ec.ports.is_some()),
            ("resources", ec.resources.as_ref().is_some_and(|r| !same(r, &ResourceRequirements::default()))),
            ("resizePolicy", ec.resize_policy.is_some()),
            ("restartPolicy", ec.restart_policy.is_some()),
            ("restartPolicyRules", ec.restart_policy_rules.is_some()),
            ("livenessProbe", ec.liveness_probe.is_some()),
            ("readinessProbe", ec.readiness_probe.is_some()),
            ("startupProbe", ec.startup_probe.is_some()),
            ("lifecycle", ec.lifecycle.is_some()),
        ];
        for (field, _) in disallowed.into_iter().filter(|(_, set)| *set) {
            out.push(FieldError::forbidden(format!("{path}.{field}"), "cannot be set for an Ephemeral Container"));
        }
        for (j, m) in slice(&ec.volume_mounts).iter().enumerate() {
            for (field, value) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
                if !opt(value).is_empty() {
                    out.push(FieldError::forbidden(
                        format!("{path}.volumeMounts[{j}].{field}"),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
}

/// An ephemeral container as the container it runs as (upstream converts
/// `EphemeralContainerCommon` to `Container` the same way); `targetContainerName` has no place there.
pub fn ephemeral_as_container(ec: &EphemeralContainer) -> Container {
    let ec = ec.clone();
    Container {
        args: ec.args,
        command: ec.command,
        env: ec.env,
        env_from: ec.env_from,
        image: ec.image,
        image_pull_policy: ec.image_pull_policy,
        lifecycle: ec.lifecycle,
        liveness_probe: ec.liveness_probe,
        name: ec.name,
        ports: ec.ports,
        readiness_probe: ec.readiness_probe,
        resize_policy: ec.resize_policy,
        resources: ec.resources,
        restart_policy: ec.restart_policy,
        restart_policy_rules: ec.restart_policy_rules,
        security_context: ec.security_context,
        startup_probe: ec.startup_probe,
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path,
        termination_message_policy: ec.termination_message_policy,
        tty: ec.tty,
        volume_devices: ec.volume_devices,
        volume_mounts: ec.volume_mounts,
        working_dir: ec.working_dir,
    }
}

/// `AccumulateUniqueHostPorts` over the given containers.
pub(super) fn check_host_port_conflicts(containers: &[Container], path: &str, out: &mut ErrorList) {
    let mut seen = HashSet::new();
    for (ci, c) in containers.iter().enumerate() {
        for (pi, p) in slice(&c.ports).iter().enumerate() {
            let host_port = p.host_port.unwrap_or(0);
            if host_port == 0 {
                continue;
            }
            let key = format!("{}/{}/{host_port}", opt(&p.protocol), opt(&p.host_ip));
            if !seen.insert(key.clone()) {
                out.push(FieldError::duplicate(format!("{path}[{ci}].ports[{pi}].hostPort"), key));
            }
        }
    }
}

/// `validateContainerCommon`: the rules shared by regular, init and ephemeral containers.
pub(super) fn validate_container_common(c: &Container, path: &str, ctx: &PodContext, out: &mut ErrorList) {
    let name_path = format!("{path}.name");
    if c.name.is_empty() {
        out.push(required(&name_path));
    } else {
        dns_label(&c.name, &name_path, out);
    }
    if opt(&c.image).is_empty() {
        out.push(required(&format!("{path}.image")));
    }
    let field = format!("{path}.terminationMessagePolicy");
    check_enum(opt(&c.termination_message_policy), &field, TERMINATION_MESSAGE_POLICIES, out);
    validate_ports(slice(&c.ports), &format!("{path}.ports"), out);
    validate_env(slice(&c.env), &format!("{path}.env"), out);
    validate_env_from(slice(&c.env_from), &format!("{path}.envFrom"), out);
    validate_volume_mounts(c, &format!("{path}.volumeMounts"), &ctx.volumes, out);
    validate_volume_devices(c, &format!("{path}.volumeDevices"), &ctx.volumes, out);
    check_enum(opt(&c.image_pull_policy), &format!("{path}.imagePullPolicy"), PULL_POLICIES, out);
    if let Some(res) = &c.resources {
        let path = format!("{path}.resources");
        validate_requirements(res.limits.as_ref(), res.requests.as_ref(), &path, false, out);
    }
    let field = format!("{path}.resizePolicy");
    validate_resize_policy(slice(&c.resize_policy), &field, ctx.restart_policy, out);
    if let Some(sc) = &c.security_context {
        validate_security_context(sc, &format!("{path}.securityContext"), ctx.host_users, out);
    }
}

pub(super) fn validate_ports(ports: &[ContainerPort], path: &str, out: &mut ErrorList) {
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let path = index(path, i);
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            let name_path = format!("{path}.name");
            let errs = port_name_errors(name);
            if !errs.is_empty() {
                push_msgs(out, &name_path, name, errs);
            } else if !names.insert(name) {
                out.push(FieldError::duplicate(name_path, name));
            }
        }
        let field = format!("{path}.containerPort");
        if port.container_port == 0 {
            out.push(required(&field));
        } else if let Some(e) = port_num_error(port.container_port.into()) {
            out.push(invalid_raw(&field, port.container_port, &e));
        }
        let host_port = port.host_port.unwrap_or(0);
        if let Some(e) = port_num_error(host_port.into()).filter(|_| host_port != 0) {
            out.push(invalid_raw(&format!("{path}.hostPort"), host_port, &e));
        }
        check_enum(opt(&port.protocol), &format!("{path}.protocol"), PROTOCOLS, out);
    }
}

pub(super) fn validate_env(vars: &[EnvVar], path: &str, out: &mut ErrorList) {
    for (i, var) in vars.iter().enumerate() {
        let path = index(path, i);
        let name_path = format!("{path}.name");
        if var.name.is_empty() {
            out.push(required(&name_path));
        } else {
            push_msgs(out, &name_path, &var.name, env_var_name_errors(&var.name));
        }
        if let Some(source) = &var.value_from {
            validate_env_source(source, opt(&var.value), &format!("{path}.valueFrom"), out);
        }
    }
}

/// `validateEnvVarValueFrom`: exactly one source, and no literal value beside it.
pub(super) fn validate_env_source(source: &EnvVarSource, value: &str, path: &str, out: &mut ErrorList) {
    let mut count = 0;
    if let Some(f) = &source.field_ref {
        count += 1;
        validate_field_selector(f, ENV_FIELD_PATHS, &format!("{path}.fieldRef"), out);
    }
    if let Some(r) = &source.resource_field_ref {
        count += 1;
        validate_resource_selector(r, false, &format!("{path}.resourceFieldRef"), out);
    }
    let keyed = [
        ("configMapKeyRef", source.config_map_key_ref.as_ref().map(|s| (&s.name, &s.key))),
        ("secretKeyRef", source.secret_key_ref.as_ref().map(|s| (&s.name, &s.key))),
    ];
    for (field, selector) in keyed {
        let Some((name, key)) = selector else {
            continue;
        };
        count += 1;
        let path = format!("{path}.{field}");
        dns_subdomain(name, &format!("{path}.name"), out);
        let key_path = format!("{path}.key");
        if key.is_empty() {
            out.push(required(&key_path));
        } else {
            push_msgs(out, &key_path, key, config_map_key_errors(key));
        }
    }
    let problem = match count {
        0 => "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        _ if !value.is_empty() => "may not be specified when `value` is not empty",
        1 => return,
        _ => "may not have more than one field specified at a time",
    };
    out.push(FieldError::invalid(path, "", problem));
}

/// `validateObjectFieldSelector` with the downward API paths allowed at the call site.
pub(super) fn validate_field_selector(f: &ObjectFieldSelector, allowed: &[&str], path: &str, out: &mut ErrorList) {
    let version = opt(&f.api_version);
    let field_path = format!("{path}.fieldPath");
    let label = if version.is_empty() {
        Err(required(&format!("{path}.apiVersion")))
    } else if f.field_path.is_empty() {
        Err(required(&field_path))
    } else {
        convert_field_label(version, &f.field_path).map_err(|e| {
            let detail = format!("error converting fieldPath: {e}");
            FieldError::invalid(&field_path, &f.field_path, detail)
        })
    };
    let label = match label {
        Ok(label) => label,
        Err(e) => {
            out.push(e);
            return;
        }
    };
    match split_subscript(label) {
        Some(("metadata.annotations", key)) => qualified_name(&key.to_lowercase(), path, out),
        Some((_, key)) => qualified_name(key, path, out),
        None if !allowed.contains(&label) => {
            out.push(FieldError::not_supported(field_path, label, allowed));
        }
        None => {}
    }
}

/// `ConvertDownwardAPIFieldLabel` for v1 pods.
pub(super) fn convert_field_label<'a>(version: &str, label: &'a str) -> Result<&'a str, String> {
    if version != "v1" {
        return Err(format!("unsupported pod version: {version}"));
    }
    match split_subscript(label) {
        Some(("metadata.annotations" | "metadata.labels", _)) => Ok(label),
        Some(_) => Err(format!("field label does not support subscript: {label}")),
        None if label == "spec.host" => Ok("spec.nodeName"),
        None if CONVERTIBLE_FIELD_PATHS.contains(&label) => Ok(label),
        None => Err(format!("field label not supported: {label}")),
    }
}

/// `metadata.labels['key']` → `("metadata.labels", "key")`.
pub(super) fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let (head, key) = path.strip_suffix("']")?.split_once("['")?;
    (!head.is_empty()).then_some((head, key))
}

pub(super) fn validate_resource_selector(r: &ResourceFieldSelector, volume: bool, path: &str, out: &mut ErrorList) {
    let hugepages = |r: &str| r.starts_with("requests.hugepages-") || r.starts_with("limits.hugepages-");
    if volume && opt(&r.container_name).is_empty() {
        out.push(required(&format!("{path}.containerName")));
    } else if r.resource.is_empty() {
        out.push(required(&format!("{path}.resource")));
    } else if !CONTAINER_RESOURCE_FIELDS.contains(&r.resource.as_str()) && !hugepages(&r.resource) {
        let field = format!("{path}.resource");
        out.push(FieldError::not_supported(field, &r.resource, CONTAINER_RESOURCE_FIELDS));
    }
    let Some(divisor) = &r.divisor else { return };
    let canonical = canonical_quantity(&divisor.0);
    if canonical.as_deref() == Some("0") {
        return;
    }
    const SIZES: &[&str] = &["1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"];
    let what = match r.resource.as_str() {
        "limits.cpu" | "requests.cpu" => "cpu",
        "limits.memory" | "requests.memory" => "memory",
        "limits.ephemeral-storage" | "requests.ephemeral-storage" => "local ephemeral storage",
        resource if hugepages(resource) => "hugepages",
        _ => return,
    };
    let valid = if what == "cpu" { &["1m", "1"][..] } else { SIZES };
    if !canonical.is_some_and(|c| valid.contains(&c.as_str())) {
        let listed = if what == "cpu" { "1m and 1".to_string() } else { SIZES.join(", ") };
        let detail = format!("only divisor's values {listed} are supported with the {what} resource");
        out.push(FieldError::invalid(format!("{path}.divisor"), &r.resource, detail));
    }
}

pub(super) fn validate_env_from(sources: &[EnvFromSource], path: &str, out: &mut ErrorList) {
    for (i, source) in sources.iter().enumerate() {
        let item = index(path, i);
        if let Some(prefix) = source.prefix.as_deref().filter(|p| !p.is_empty()) {
            push_msgs(out, &format!("{item}.prefix"), prefix, env_var_name_errors(prefix));
        }
        let refs = [
            ("configMapRef", source.config_map_ref.as_ref().map(|r| &r.name)),
            ("secretRef", source.secret_ref.as_ref().map(|r| &r.name)),
        ];
        let mut count = 0;
        for (field, name) in refs {
            let Some(name) = name else { continue };
            count += 1;
            let name_path = format!("{item}.{field}.name");
            if name.is_empty() {
                out.push(required(&name_path));
            } else {
                push_msgs(out, &name_path, name, name_is_dns_subdomain(name, true));
            }
        }
        match count {
            0 => out.push(FieldError::invalid(path, "", "must specify one of: `configMapRef` or `secretRef`")),
            1 => {}
            _ => out.push(FieldError::invalid(path, "", "may not have more than one field specified at a time")),
        }
    }
}

/// `ValidateVolumeMounts`; upstream reports subPath and propagation errors on the list path.
pub(super) fn validate_volume_mounts(c: &Container, path: &str, volumes: &HashMap<&str, &Volume>, out: &mut ErrorList) {
    let devices = slice(&c.volume_devices);
    let mut mount_points = HashSet::new();
    for (i, m) in slice(&c.volume_mounts).iter().enumerate() {
        let item = index(path, i);
        let (name_path, mount_path) = (format!("{item}.name"), format!("{item}.mountPath"));
        if m.name.is_empty() {
            out.push(required(&name_path));
        }
        if !volumes.contains_key(m.name.as_str()) {
            out.push(not_found(&name_path, &m.name, ""));
        }
        if m.mount_path.is_empty() {
            out.push(required(&mount_path));
        }
        if !mount_points.insert(m.mount_path.as_str()) {
            out.push(FieldError::invalid(&mount_path, &m.mount_path, "must be unique"));
        }
        if devices.iter().any(|d| d.name == m.name) {
            let detail = "must not already exist in volumeDevices";
            out.push(FieldError::invalid(&name_path, &m.name, detail));
        }
        if devices.iter().any(|d| d.device_path == m.mount_path) {
            let detail = "must not already exist as a path in volumeDevices";
            out.push(FieldError::invalid(&mount_path, &m.mount_path, detail));
        }
        let (sub, expr) = (opt(&m.sub_path), opt(&m.sub_path_expr));
        if volumes.get(m.name.as_str()).is_some_and(|v| v.image.is_some()) {
            for (value, field) in [(sub, "subPath"), (expr, "subPathExpr")] {
                if !value.is_empty() {
                    let detail = "not allowed in image volume sources";
                    out.push(FieldError::invalid(format!("{item}.{field}"), value, detail));
                }
            }
        }
        if !sub.is_empty() {
            local_descending_path(sub, &format!("{path}.subPath"), out);
        }
        if !expr.is_empty() {
            if !sub.is_empty() {
                let detail = "subPathExpr and subPath are mutually exclusive";
                out.push(FieldError::invalid(format!("{item}.subPathExpr"), expr, detail));
            }
            local_descending_path(expr, &format!("{path}.subPathExpr"), out);
        }
        let propagation = m.mount_propagation.as_deref();
        if let Some(mode) = propagation {
            let field = format!("{path}.mountPropagation");
            check_supported(Some(mode), &field, MOUNT_PROPAGATIONS, out);
            let privileged = c.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
            if mode == "Bidirectional" && !privileged {
                let detail = "Bidirectional mount propagation is available only to privileged containers";
                out.push(FieldError::forbidden(field, detail));
            }
        }
        let field = format!("{path}.recursiveReadOnly");
        match m.recursive_read_only.as_deref() {
            None | Some("Disabled") => {}
            Some("Enabled" | "IfPossible") => {
                if m.read_only != Some(true) {
                    out.push(FieldError::forbidden(&field, "may only be specified when readOnly is true"));
                }
                if propagation.is_some_and(|p| p != "None") {
                    let detail = "may only be specified when mountPropagation is None or not specified";
                    out.push(FieldError::forbidden(&field, detail));
                }
            }
            Some(mode) => out.push(FieldError::not_supported(field, mode, RECURSIVE_READ_ONLY_MODES)),
        }
    }
}

pub(super) fn validate_volume_devices(
    c: &Container,
    path: &str,
    volumes: &HashMap<&str, &Volume>,
    out: &mut ErrorList,
) {
    let mounts = slice(&c.volume_mounts);
    let (mut paths, mut names) = (HashSet::new(), HashSet::new());
    for (i, d) in slice(&c.volume_devices).iter().enumerate() {
        let item = index(path, i);
        let (name_path, device_path) = (format!("{item}.name"), format!("{item}.devicePath"));
        if d.name.is_empty() {
            out.push(required(&name_path));
        }
        if names.contains(d.name.as_str()) {
            out.push(FieldError::invalid(&name_path, &d.name, "must be unique"));
        }
        match volumes.get(d.name.as_str()) {
            Some(v) if v.persistent_volume_claim.is_none() && v.ephemeral.is_none() => {
                let detail = "can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode";
                out.push(FieldError::invalid(&name_path, &d.name, detail));
            }
            Some(_) => {}
            None => out.push(not_found(&name_path, &d.name, "")),
        }
        if d.device_path.is_empty() {
            out.push(required(&device_path));
        }
        if paths.contains(d.device_path.as_str()) {
            out.push(FieldError::invalid(&device_path, &d.device_path, "must be unique"));
        }
        if !d.device_path.is_empty() && has_backsteps(&d.device_path) {
            let detail = "can not contain backsteps ('..')";
            out.push(FieldError::invalid(&device_path, &d.device_path, detail));
        } else {
            paths.insert(d.device_path.as_str());
        }
        if mounts.iter().any(|m| m.name == d.name) {
            let detail = "must not already exist in volumeMounts";
            out.push(FieldError::invalid(&name_path, &d.name, detail));
        }
        if mounts.iter().any(|m| m.mount_path == d.device_path) {
            let detail = "must not already exist as a path in volumeMounts";
            out.push(FieldError::invalid(&device_path, &d.device_path, detail));
        }
        if !d.name.is_empty() {
            names.insert(d.name.as_str());
        }
    }
}

pub(super) fn validate_resize_policy(
    policies: &[ContainerResizePolicy],
    path: &str,
    pod_restart: &str,
    out: &mut ErrorList,
) {
    let mut seen = HashSet::new();
    for (i, policy) in policies.iter().enumerate() {
        if !seen.insert(policy.resource_name.as_str()) {
            out.push(FieldError::duplicate(index(path, i), &policy.resource_name));
        }
        // Upstream reports these on the list path.
        check_enum(&policy.resource_name, path, RESIZE_RESOURCES, out);
        check_enum(&policy.restart_policy, path, RESIZE_RESTART_POLICIES, out);
        if pod_restart == "Never" && policy.restart_policy != "NotRequired" {
            let detail = "must be 'NotRequired' when `restartPolicy` is 'Never'";
            out.push(FieldError::invalid(path, &policy.restart_policy, detail));
        }
    }
}
