//! Validation of the pod, its spec and updates (`ValidatePod`, `ValidatePodUpdate`).

use super::*;

/// `ValidatePodCreate`: every rule of [`validate_pod_update`]'s spec check plus the create-only
/// ones. Object metadata (name, labels, annotation syntax) is validated by the caller.
pub fn validate_pod(pod: &Pod) -> ErrorList {
    let mut out = validate_pod_common(pod);
    let default = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default);
    if !slice(&spec.ephemeral_containers).is_empty() {
        out.push(FieldError::forbidden("spec.ephemeralContainers", "cannot be set on create"));
    }
    if !opt(&spec.node_name).is_empty() && !slice(&spec.scheduling_gates).is_empty() {
        out.push(FieldError::forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"));
    }
    out
}

/// `ValidatePodUpdate`: the new pod must be valid, and its spec may differ from the old one only
/// in container images, a lowered or newly set `activeDeadlineSeconds`, added tolerations (or
/// changed `tolerationSeconds`), removed scheduling gates, a negative grace period raised to 1
/// and, while the pod is gated, added node selectors and node affinity requirements. `nodeName`
/// is set only through the binding subresource, which does not come through here.
pub fn validate_pod_update(new: &Pod, old: &Pod) -> ErrorList {
    let mut out = validate_pod_common(new);
    let default = PodSpec::default();
    let new_spec = new.spec.as_ref().unwrap_or(&default);
    let old_spec = old.spec.as_ref().unwrap_or(&default);

    for (field, new_list, old_list) in [
        ("containers", &new_spec.containers[..], &old_spec.containers[..]),
        ("initContainers", slice(&new_spec.init_containers), slice(&old_spec.init_containers)),
    ] {
        let path = format!("spec.{field}");
        if new_list.len() != old_list.len() {
            out.push(FieldError::forbidden(path, "pod updates may not add or remove containers"));
            return out;
        }
        for (i, c) in new_list.iter().enumerate() {
            let path = index(&path, i);
            if opt(&c.image).is_empty() {
                out.push(required(&format!("{path}.image")));
            }
            check_image_whitespace(opt(&c.image), &path, &mut out);
        }
    }

    let deadline = "spec.activeDeadlineSeconds";
    match (new_spec.active_deadline_seconds, old_spec.active_deadline_seconds) {
        (Some(n), _) if !(0..=MAX_INT32).contains(&n) => {
            out.push(invalid_raw(deadline, n, &range_error(0, MAX_INT32)));
            return out;
        }
        (Some(n), Some(o)) if o < n => {
            out.push(invalid_raw(deadline, n, "must be less than or equal to previous value"));
            return out;
        }
        (None, Some(_)) => {
            out.push(FieldError::invalid(deadline, "null", "must not update from a positive integer to nil value"))
        }
        _ => {}
    }

    let (new_tolerations, old_tolerations) = (slice(&new_spec.tolerations), slice(&old_spec.tolerations));
    let kept = old_tolerations.iter().all(|o| {
        new_tolerations.iter().any(|n| {
            let o = Toleration { toleration_seconds: n.toleration_seconds, ..o.clone() };
            same(&o, n)
        })
    });
    if kept {
        validate_tolerations(new_tolerations, "spec.tolerations", &mut out);
    } else {
        out.push(FieldError::forbidden(
            "spec.tolerations",
            "existing toleration can not be modified except its tolerationSeconds",
        ));
    }

    let new_gates = slice(&new_spec.scheduling_gates);
    for (i, gate) in new_gates.iter().enumerate() {
        let last = new_gates.iter().rposition(|g| g.name == gate.name) == Some(i);
        if last && !slice(&old_spec.scheduling_gates).iter().any(|g| g.name == gate.name) {
            out.push(FieldError::forbidden(
                format!("spec.schedulingGates[{i}].name"),
                format!("only deletion is allowed, but found new scheduling gate '{}'", gate.name),
            ));
        }
    }

    if same(new_spec, old_spec) {
        return out;
    }
    let munged = munge_updatable_fields(new_spec, old_spec, &mut out);
    if !same(&munged, old_spec) {
        let mut diff = Vec::new();
        diff_values(&normalized(old_spec), &normalized(&munged), "spec", &mut diff);
        out.push(FieldError::forbidden(
            "spec",
            format!(
                "pod updates may not change fields other than {}\n{}",
                UPDATABLE_POD_SPEC_FIELDS.join(","),
                diff.join("\n")
            ),
        ));
    }
    out
}

/// `ValidatePodEphemeralContainersUpdate`: the new pod must be valid, and the ephemeral
/// containers it had stay as they were (order aside: a patch does not keep it). The pods differ
/// only in `spec.ephemeralContainers` (the strategy took everything else from the old one).
pub fn validate_ephemeral_containers_update(new: &Pod, old: &Pod) -> ErrorList {
    let mut out = validate_pod_common(new);
    let annotations = old.metadata.annotations.as_ref();
    if annotations.is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION)) {
        return vec![FieldError::forbidden("", "static pods do not support ephemeral containers")];
    }
    let default = PodSpec::default();
    let (new_spec, old_spec) = (new.spec.as_ref().unwrap_or(&default), old.spec.as_ref().unwrap_or(&default));
    let path = "spec.ephemeralContainers";
    for was in slice(&old_spec.ephemeral_containers) {
        match slice(&new_spec.ephemeral_containers).iter().find(|c| c.name == was.name) {
            None => out.push(FieldError::forbidden(
                path,
                format!("existing ephemeral containers {:?} may not be removed\n", was.name),
            )),
            Some(now) if !same(was, now) => {
                let mut diff = Vec::new();
                diff_values(&normalized(was), &normalized(now), &key(path, &was.name), &mut diff);
                out.push(FieldError::forbidden(
                    key(path, &was.name),
                    format!("existing ephemeral containers {:?} may not be changed\n{}", was.name, diff.join("\n")),
                ));
            }
            Some(_) => {}
        }
    }
    out
}

/// The new spec with every change the update rules allow reverted to the old value; reports
/// the node selector and node affinity changes a gated pod may not make.
pub(super) fn munge_updatable_fields(new: &PodSpec, old: &PodSpec, out: &mut ErrorList) -> PodSpec {
    let mut munged = new.clone();
    for (c, o) in munged.containers.iter_mut().zip(&old.containers) {
        c.image.clone_from(&o.image);
    }
    for (c, o) in munged.init_containers.iter_mut().flatten().zip(slice(&old.init_containers)) {
        c.image.clone_from(&o.image);
    }
    munged.active_deadline_seconds = old.active_deadline_seconds;
    munged.scheduling_gates.clone_from(&old.scheduling_gates);
    munged.tolerations.clone_from(&old.tolerations);
    if old.termination_grace_period_seconds.is_some_and(|g| g < 0) && munged.termination_grace_period_seconds == Some(1)
    {
        munged.termination_grace_period_seconds = old.termination_grace_period_seconds;
    }
    if slice(&old.scheduling_gates).is_empty() {
        return munged;
    }

    if !same(&munged.node_selector, &old.node_selector) {
        let selector = munged.node_selector.take().unwrap_or_default();
        if old.node_selector.iter().flatten().any(|(k, v)| selector.get(k) != Some(v)) {
            out.push(invalid_json(
                "spec.nodeSelector",
                &selector,
                "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
            ));
        }
        munged.node_selector.clone_from(&old.node_selector);
    }
    let old_affinity = old.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
    let new_affinity = munged.affinity.as_ref().and_then(|a| a.node_affinity.clone());
    if !same(&old_affinity, &new_affinity.as_ref()) {
        validate_node_affinity_mutation(new_affinity.as_ref(), old_affinity, out);
        match &mut munged.affinity {
            None => {
                munged.affinity =
                    old_affinity.map(|na| Affinity { node_affinity: Some(na.clone()), ..Affinity::default() });
            }
            Some(a) if old.affinity.is_none() && a.pod_affinity.is_none() && a.pod_anti_affinity.is_none() => {
                munged.affinity = None;
            }
            Some(a) => a.node_affinity = old_affinity.cloned(),
        }
    }
    munged
}

/// A gated pod may only add requirements to its existing required node selector terms.
pub(super) fn validate_node_affinity_mutation(
    new: Option<&NodeAffinity>,
    old: Option<&NodeAffinity>,
    out: &mut ErrorList,
) {
    let terms = |na: Option<&NodeAffinity>| {
        na.and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|s| s.node_selector_terms.clone())
    };
    let Some(old_terms) = terms(old) else { return };
    let new_terms = terms(new).unwrap_or_default();
    let path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    if !old_terms.is_empty() && old_terms.len() != new_terms.len() {
        out.push(invalid_json(
            path,
            &new_terms,
            "no additions/deletions to non-empty NodeSelectorTerms list are allowed",
        ));
        return;
    }
    for (i, (o, n)) in old_terms.iter().zip(&new_terms).enumerate() {
        if !term_only_adds(n, o) {
            out.push(invalid_json(&index(path, i), n, "only additions are allowed (no mutations or deletions)"));
        }
    }
}

pub(super) fn term_only_adds(new: &NodeSelectorTerm, old: &NodeSelectorTerm) -> bool {
    let extends = |n: &[_], o: &[_]| n.len() >= o.len() && same(&n[..o.len()], o);
    let (ne, oe) = (slice(&new.match_expressions), slice(&old.match_expressions));
    let (nf, of) = (slice(&new.match_fields), slice(&old.match_fields));
    if oe.is_empty() && of.is_empty() {
        return ne.is_empty() && nf.is_empty();
    }
    extends(ne, oe) && extends(nf, of)
}

/// A value as JSON without nulls and empty lists or maps, so that values Go's semantic equality
/// treats as equal (an absent list and an empty one, say) compare equal.
pub(super) fn normalized<T: Serialize + ?Sized>(value: &T) -> Value {
    fn prune(value: Value) -> Option<Value> {
        match value {
            Value::Null => None,
            Value::Array(items) => {
                let items: Vec<Value> = items.into_iter().map(|v| prune(v).unwrap_or(Value::Null)).collect();
                (!items.is_empty()).then_some(Value::Array(items))
            }
            Value::Object(map) => {
                let map: Map<String, Value> = map.into_iter().filter_map(|(k, v)| prune(v).map(|v| (k, v))).collect();
                (!map.is_empty()).then_some(Value::Object(map))
            }
            v => Some(v),
        }
    }
    serde_json::to_value(value).ok().and_then(prune).unwrap_or(Value::Null)
}

pub(super) fn same<T: Serialize + ?Sized>(a: &T, b: &T) -> bool {
    normalized(a) == normalized(b)
}

/// `- path: old` / `+ path: new` lines for every leaf that differs.
pub(super) fn diff_values(old: &Value, new: &Value, path: &str, lines: &mut Vec<String>) {
    match (old, new) {
        _ if old == new => {}
        (Value::Object(o), Value::Object(n)) => {
            let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
            for k in keys {
                let (a, b) = (o.get(k).unwrap_or(&Value::Null), n.get(k).unwrap_or(&Value::Null));
                diff_values(a, b, &child(path, k), lines);
            }
        }
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
            for (i, (a, b)) in o.iter().zip(n).enumerate() {
                diff_values(a, b, &index(path, i), lines);
            }
        }
        _ => {
            for (sign, value) in [("-", old), ("+", new)] {
                if !value.is_null() {
                    lines.push(format!("{sign} {path}: {value}"));
                }
            }
        }
    }
}

/// `validatePodMetadataAndSpec` without the object metadata.
pub(super) fn validate_pod_common(pod: &Pod) -> ErrorList {
    let mut out = Vec::new();
    let default = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default);
    validate_pod_annotations(pod.metadata.annotations.as_ref(), spec, &mut out);
    validate_pod_spec(spec, &mut out);
    if opt(&spec.service_account_name).is_empty() {
        for (vi, volume) in slice(&spec.volumes).iter().enumerate() {
            let sources = volume.projected.as_ref().map(|p| slice(&p.sources)).unwrap_or_default();
            for (si, source) in sources.iter().enumerate() {
                if source.service_account_token.is_some() {
                    out.push(FieldError::forbidden(
                        format!("spec.volumes[{vi}].projected.sources[{si}].serviceAccountToken"),
                        "must not be specified when serviceAccountName is not set",
                    ));
                }
            }
        }
    }
    for (field, containers) in [("containers", &spec.containers[..]), ("initContainers", slice(&spec.init_containers))]
    {
        for (i, c) in containers.iter().enumerate() {
            check_image_whitespace(opt(&c.image), &format!("spec.{field}[{i}]"), &mut out);
        }
    }
    out
}

pub(super) fn check_image_whitespace(image: &str, container_path: &str, out: &mut ErrorList) {
    if image.trim() != image {
        out.push(FieldError::invalid(
            format!("{container_path}.image"),
            image,
            "must not have leading or trailing whitespace",
        ));
    }
}

/// The pod-specific annotations: a mirror pod must be bound, a deletion cost is an int32.
pub(super) fn validate_pod_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    spec: &PodSpec,
    out: &mut ErrorList,
) {
    let Some(annotations) = annotations else {
        return;
    };
    let path = "metadata.annotations";
    if let Some(value) = annotations.get(MIRROR_POD_ANNOTATION)
        && opt(&spec.node_name).is_empty()
    {
        out.push(FieldError::invalid(
            key(path, MIRROR_POD_ANNOTATION),
            value,
            "must set spec.nodeName if mirror pod annotation is set",
        ));
    }
    if let Some(cost) = annotations.get(DELETION_COST_ANNOTATION) {
        // No leading '+' or zeros, as upstream requires.
        let canonical_start = cost.starts_with(['-', '1', '2', '3', '4', '5', '6', '7', '8', '9']) || cost == "0";
        if !canonical_start || cost.parse::<i32>().is_err() {
            out.push(FieldError::invalid(key(path, DELETION_COST_ANNOTATION), cost, "must be a 32bit integer"));
        }
    }
}

/// Pod-wide facts the container rules depend on.
pub(super) struct PodContext<'a> {
    /// The volumes that passed validation, by name.
    pub(super) volumes: HashMap<&'a str, &'a Volume>,
    pub(super) grace_period: Option<i64>,
    pub(super) restart_policy: &'a str,
    pub(super) host_users: bool,
}

/// `ValidatePodSpec`, in upstream's order.
pub(super) fn validate_pod_spec(spec: &PodSpec, out: &mut ErrorList) {
    if spec.termination_grace_period_seconds.is_none() {
        out.push(required("spec.terminationGracePeriodSeconds"));
    }
    let ctx = PodContext {
        volumes: validate_volumes(slice(&spec.volumes), out),
        grace_period: spec.termination_grace_period_seconds,
        restart_policy: opt(&spec.restart_policy),
        host_users: spec.host_users != Some(false),
    };
    validate_containers(spec, &ctx, out);
    validate_init_containers(spec, &ctx, out);
    validate_ephemeral_containers(spec, &ctx, out);
    if let Some(res) = &spec.resources {
        if res.claims.is_some() {
            out.push(FieldError::forbidden("spec.resources.claims", "claims cannot be set for Resources at pod-level"));
        }
        validate_requirements(res.limits.as_ref(), res.requests.as_ref(), "spec.resources", true, out);
    }
    if spec.host_network == Some(true) {
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, p) in slice(&c.ports).iter().enumerate() {
                let host_port = p.host_port.unwrap_or(0);
                if host_port != p.container_port {
                    out.push(invalid_raw(
                        &format!("spec.containers[{i}].ports[{j}].hostPort"),
                        host_port,
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    check_enum(opt(&spec.restart_policy), "spec.restartPolicy", RESTART_POLICIES, out);
    check_enum(opt(&spec.dns_policy), "spec.dnsPolicy", DNS_POLICIES, out);
    out.extend(validate_labels(spec.node_selector.iter().flatten(), "spec.nodeSelector"));
    validate_pod_security_context(spec, out);
    if let Some(affinity) = &spec.affinity {
        validate_affinity(affinity, out);
    }
    validate_dns_config(spec, out);
    for (i, gate) in slice(&spec.readiness_gates).iter().enumerate() {
        let path = format!("spec.readinessGates[{i}].conditionType");
        qualified_name(&gate.condition_type, &path, out);
    }
    let mut gates = HashSet::new();
    for (i, gate) in slice(&spec.scheduling_gates).iter().enumerate() {
        let path = index("spec.schedulingGates", i);
        qualified_name(&gate.name, &path, out);
        if !gates.insert(gate.name.as_str()) {
            out.push(FieldError::duplicate(path, &gate.name));
        }
    }
    validate_topology_spread(slice(&spec.topology_spread_constraints), out);
    if spec.host_users == Some(false) {
        // Upstream spells the last two paths this way.
        for (set, field) in [(spec.host_network, "hostNetwork"), (spec.host_pid, "HostPID"), (spec.host_ipc, "HostIPC")]
        {
            if set == Some(true) {
                out.push(FieldError::forbidden(format!("spec.{field}"), "when `pod.Spec.HostUsers` is false"));
            }
        }
    }
    for (value, field) in [(&spec.service_account_name, "serviceAccountName"), (&spec.node_name, "nodeName")] {
        if !opt(value).is_empty() {
            dns_subdomain(opt(value), &format!("spec.{field}"), out);
        }
    }
    if let Some(deadline) = spec.active_deadline_seconds
        && !(1..=MAX_INT32).contains(&deadline)
    {
        out.push(invalid_raw("spec.activeDeadlineSeconds", deadline, &range_error(1, MAX_INT32)));
    }
    for (value, field) in [(&spec.hostname, "hostname"), (&spec.subdomain, "subdomain")] {
        if !opt(value).is_empty() {
            dns_label(opt(value), &format!("spec.{field}"), out);
        }
    }
    validate_tolerations(slice(&spec.tolerations), "spec.tolerations", out);
    for (i, alias) in slice(&spec.host_aliases).iter().enumerate() {
        valid_ip(&alias.ip, &format!("spec.hostAliases[{i}].ip"), out);
        for (j, hostname) in slice(&alias.hostnames).iter().enumerate() {
            dns_subdomain(hostname, &format!("spec.hostAliases[{i}].hostnames[{j}]"), out);
        }
    }
    if !opt(&spec.priority_class_name).is_empty() {
        dns_subdomain(opt(&spec.priority_class_name), "spec.priorityClassName", out);
    }
    if let Some(class) = &spec.runtime_class_name {
        dns_subdomain(class, "spec.runtimeClassName", out);
    }
    if let Some(policy) = &spec.preemption_policy {
        check_enum(policy, "spec.preemptionPolicy", PREEMPTION_POLICIES, out);
    }
    if let Some(overhead) = &spec.overhead {
        validate_requirements(Some(overhead), None, "spec.overhead", false, out);
    }
    if let Some(os) = &spec.os {
        if os.name.is_empty() {
            out.push(FieldError::required("spec.os.name", "cannot be empty"));
        } else if !OS_NAMES.contains(&os.name.as_str()) {
            out.push(FieldError::not_supported("spec.os", &os.name, OS_NAMES));
        }
    }
}

pub(super) fn validate_dns_config(spec: &PodSpec, out: &mut ErrorList) {
    let path = "spec.dnsConfig";
    if opt(&spec.dns_policy) == "None" {
        match &spec.dns_config {
            None => {
                let detail = "must provide `dnsConfig` when `dnsPolicy` is None";
                out.push(FieldError::required(path, detail));
                return;
            }
            Some(c) if slice(&c.nameservers).is_empty() => {
                let detail = "must provide at least one DNS nameserver when `dnsPolicy` is None";
                out.push(FieldError::required(format!("{path}.nameservers"), detail));
                return;
            }
            Some(_) => {}
        }
    }
    let Some(config) = &spec.dns_config else {
        return;
    };
    let nameservers = slice(&config.nameservers);
    let ns_path = format!("{path}.nameservers");
    if nameservers.len() > 3 {
        out.push(invalid_json(&ns_path, &nameservers, "must not have more than 3 nameservers"));
    }
    for (i, ns) in nameservers.iter().enumerate() {
        valid_ip(ns, &index(&ns_path, i), out);
    }
    let searches = slice(&config.searches);
    let search_path = format!("{path}.searches");
    if searches.len() > 32 {
        out.push(invalid_json(&search_path, &searches, "must not have more than 32 search paths"));
    }
    if searches.join(" ").len() > 2048 {
        out.push(invalid_json(
            &search_path,
            &searches,
            "must not have more than 2048 characters (including spaces) in the search list",
        ));
    }
    for (i, search) in searches.iter().enumerate().filter(|(_, s)| *s != ".") {
        let search = search.strip_suffix('.').unwrap_or(search);
        let errs = dns_subdomain_with_underscore_errors(search);
        push_msgs(out, &index(&search_path, i), search, errs);
    }
    for (i, option) in slice(&config.options).iter().enumerate() {
        if opt(&option.name).is_empty() {
            out.push(FieldError::required(format!("{path}.options[{i}]"), "must not be empty"));
        }
    }
}

pub fn validate_tolerations(tolerations: &[Toleration], path: &str, out: &mut ErrorList) {
    for (i, t) in tolerations.iter().enumerate() {
        let path = index(path, i);
        let (key, operator) = (opt(&t.key), opt(&t.operator));
        let (value, effect) = (opt(&t.value), opt(&t.effect));
        let op_path = format!("{path}.operator");
        if !key.is_empty() {
            qualified_name(key, &format!("{path}.key"), out);
        }
        if key.is_empty() && operator != "Exists" {
            out.push(FieldError::invalid(
                &op_path,
                operator,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            out.push(FieldError::invalid(
                format!("{path}.effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match operator {
            "Equal" | "" => {
                let errs = is_label_value(value);
                if !errs.is_empty() {
                    out.push(FieldError::invalid(&op_path, value, errs.join(";")));
                }
            }
            "Exists" if !value.is_empty() => {
                out.push(FieldError::invalid(&op_path, value, "value must be empty when `operator` is 'Exists'"))
            }
            "Exists" => {}
            _ => out.push(FieldError::not_supported(&op_path, operator, TOLERATION_OPERATORS)),
        }
        if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
            out.push(FieldError::not_supported(format!("{path}.effect"), effect, TAINT_EFFECTS));
        }
    }
}

pub(super) fn validate_topology_spread(constraints: &[TopologySpreadConstraint], out: &mut ErrorList) {
    for (i, c) in constraints.iter().enumerate() {
        let path = index("spec.topologySpreadConstraints", i);
        let when = c.when_unsatisfiable.as_str();
        if c.max_skew <= 0 {
            out.push(invalid_raw(&format!("{path}.maxSkew"), c.max_skew, "must be greater than zero"));
        }
        if c.topology_key.is_empty() {
            out.push(FieldError::required(format!("{path}.topologyKey"), "can not be empty"));
        }
        if !SCHEDULE_ACTIONS.contains(&when) {
            let field = format!("{path}.whenUnsatisfiable");
            out.push(FieldError::not_supported(field, when, SCHEDULE_ACTIONS));
        }
        let repeated = constraints[i + 1..]
            .iter()
            .any(|o| o.topology_key == c.topology_key && o.when_unsatisfiable == c.when_unsatisfiable);
        if repeated {
            out.push(FieldError::duplicate(
                format!("{path}.{{topologyKey, whenUnsatisfiable}}"),
                format!("{{{}, {when}}}", c.topology_key),
            ));
        }
        if let Some(min) = c.min_domains {
            let field = format!("{path}.minDomains");
            if min <= 0 {
                out.push(invalid_raw(&field, min, "must be greater than zero"));
            }
            if when != "DoNotSchedule" {
                let detail = format!("can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {when}");
                out.push(invalid_raw(&field, min, &detail));
            }
        }
        for (policy, field) in
            [(&c.node_affinity_policy, "nodeAffinityPolicy"), (&c.node_taints_policy, "nodeTaintsPolicy")]
        {
            let field = format!("{path}.{field}");
            check_supported(policy.as_deref(), &field, NODE_INCLUSION_POLICIES, out);
        }
        validate_label_selector(c.label_selector.as_ref(), &format!("{path}.labelSelector"), out);
    }
}

pub(super) fn check_supported(value: Option<&str>, field: &str, valid: &[&str], out: &mut ErrorList) {
    if let Some(value) = value
        && !valid.contains(&value)
    {
        out.push(FieldError::not_supported(field, value, valid));
    }
}
