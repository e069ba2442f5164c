//! Pod defaulting, QoS classification and validation, following kube-apiserver.
//!
//! Mirrors `pkg/apis/core/v1/defaults.go`, the pod admission plugins that mutate on create
//! (ServiceAccount, Priority, DefaultTolerationSeconds), the pod strategy's create preparation,
//! `pkg/apis/core/helper/qos` and the pod parts of `pkg/apis/core/validation`, with upstream's
//! field paths and messages.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Affinity, AppArmorProfile, Container, ContainerPort, ContainerResizePolicy, DownwardAPIVolumeFile, EnvFromSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler, NodeAffinity, NodeSelectorTerm,
    ObjectFieldSelector, Pod, PodAffinityTerm, PodCondition, PodSecurityContext, PodSpec, PodStatus, Probe,
    ProjectedVolumeSource, ResourceFieldSelector, ResourceRequirements, SeccompProfile, SecurityContext, Toleration,
    TopologySpreadConstraint, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::Serialize;
use serde_json::{Map, Value};

use crate::registry::validation::{
    ErrorList, ErrorType, FieldError, child, index, is_dns1123_label, is_dns1123_subdomain, is_label_value,
    is_qualified_name, key, validate_labels,
};

type Quantities = BTreeMap<String, Quantity>;

const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
const MAX_INT32: i64 = i32::MAX as i64;

const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
const PREEMPTION_POLICIES: &[&str] = &["PreemptLowerPriority", "Never"];
const TOLERATION_OPERATORS: &[&str] = &["Equal", "Exists"];
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const HTTP_SCHEMES: &[&str] = &["HTTP", "HTTPS"];
const HOST_PATH_TYPES: &[&str] =
    &["", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"];
const MOUNT_PROPAGATIONS: &[&str] = &["Bidirectional", "HostToContainer", "None"];
const RECURSIVE_READ_ONLY_MODES: &[&str] = &["Disabled", "Enabled", "IfPossible"];
/// Seccomp and AppArmor profile types.
const PROFILE_TYPES: &[&str] = &["Localhost", "RuntimeDefault", "Unconfined"];
const PROC_MOUNT_TYPES: &[&str] = &["Default", "Unmasked"];
const FS_GROUP_CHANGE_POLICIES: &[&str] = &["Always", "OnRootMismatch"];
const SUPPLEMENTAL_GROUPS_POLICIES: &[&str] = &["Merge", "Strict"];
const SELINUX_CHANGE_POLICIES: &[&str] = &["MountOption", "Recursive"];
const RESIZE_RESOURCES: &[&str] = &["cpu", "memory"];
const RESIZE_RESTART_POLICIES: &[&str] = &["NotRequired", "RestartContainer"];
const SCHEDULE_ACTIONS: &[&str] = &["DoNotSchedule", "ScheduleAnyway"];
const NODE_INCLUSION_POLICIES: &[&str] = &["Honor", "Ignore"];
const OS_NAMES: &[&str] = &["linux", "windows"];
const POD_LEVEL_RESOURCES: &[&str] = &["cpu", "hugepages-", "memory"];

/// Downward API field paths usable in environment variables.
const ENV_FIELD_PATHS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];
/// Downward API field paths usable in volumes.
const VOLUME_FIELD_PATHS: &[&str] =
    &["metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace", "metadata.uid"];
/// Field labels the v1 downward API conversion accepts.
const CONVERTIBLE_FIELD_PATHS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "spec.schedulerName",
    "status.phase",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];
const CONTAINER_RESOURCE_FIELDS: &[&str] = &[
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
];
const STANDARD_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "storage",
    "requests.storage",
    "services.nodeports",
    "services.loadbalancers",
];
const INTEGER_RESOURCES: &[&str] = &[
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
];
const UPDATABLE_POD_SPEC_FIELDS: &[&str] = &[
    "`spec.containers[*].image`",
    "`spec.initContainers[*].image`",
    "`spec.activeDeadlineSeconds`",
    "`spec.tolerations` (only additions to existing tolerations)",
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
];

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

fn opt(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("")
}

fn set_default(s: &mut Option<String>, value: &str) {
    if opt(s).is_empty() {
        *s = Some(value.to_string());
    }
}

fn set_default_num<T: Copy + PartialEq + Default>(n: &mut Option<T>, value: T) {
    if n.is_none_or(|v| v == T::default()) {
        *n = Some(value);
    }
}

fn slice<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or(&[])
}

/// `Invalid value: 5: detail`: upstream prints numbers and booleans unquoted.
fn invalid_raw(field: &str, value: impl std::fmt::Display, detail: &str) -> FieldError {
    FieldError {
        kind: ErrorType::Invalid,
        field: field.to_string(),
        detail: format!("Invalid value: {value}: {detail}"),
    }
}

/// An invalid structured value, rendered as JSON.
fn invalid_json(field: &str, value: &impl Serialize, detail: &str) -> FieldError {
    let rendered = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    FieldError {
        kind: ErrorType::Invalid,
        field: field.to_string(),
        detail: format!("Invalid value: {rendered}: {detail}"),
    }
}

/// Upstream's `field.NotFound`; reported with the closest reason available.
fn not_found(field: &str, value: &str, detail: &str) -> FieldError {
    let mut text = format!("Not found: {value:?}");
    if !detail.is_empty() {
        text = format!("{text}: {detail}");
    }
    FieldError { kind: ErrorType::Invalid, field: field.to_string(), detail: text }
}

fn required(field: &str) -> FieldError {
    FieldError::required(field, "")
}

fn range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// Upstream's `RegexError`, including its examples formatting.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{example}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn check_nonnegative(value: i64, field: &str, out: &mut ErrorList) {
    if value < 0 {
        out.push(invalid_raw(field, value, "must be greater than or equal to 0"));
    }
}

fn check_enum(value: &str, field: &str, valid: &[&str], out: &mut ErrorList) {
    if value.is_empty() {
        out.push(required(field));
    } else if !valid.contains(&value) {
        out.push(FieldError::not_supported(field, value, valid));
    }
}

fn push_msgs(out: &mut ErrorList, field: &str, value: &str, msgs: Vec<String>) {
    out.extend(msgs.into_iter().map(|m| FieldError::invalid(field, value, m)));
}

fn dns_label(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_dns1123_label(value));
}

fn dns_subdomain(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_dns1123_subdomain(value));
}

fn qualified_name(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_qualified_name(value));
}

/// `NameIsDNSSubdomain`; a generateName prefix may end in '-'.
fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    // Same masking as upstream: the last two characters become "a". A name whose cut falls
    // inside a multi-byte character is not ASCII and fails either way.
    match name.get(..name.len().saturating_sub(2)) {
        Some(head) if prefix && name.len() > 1 && name.ends_with('-') => is_dns1123_subdomain(&format!("{head}a")),
        _ => is_dns1123_subdomain(name),
    }
}

fn port_num_error(port: i64) -> Option<String> {
    (!(1..=65535).contains(&port)).then(|| range_error(1, 65535))
}

/// `IsValidPortName`.
fn port_name_errors(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if port.is_empty() || !port.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string());
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

/// Environment variable names: any printable ASCII except '=' (relaxed validation, GA since 1.34).
fn env_var_name_errors(name: &str) -> Vec<String> {
    if name.bytes().any(|c| !(0x20..=0x7e).contains(&c) || c == b'=') {
        return vec![
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_string(),
        ];
    }
    Vec::new()
}

fn chdir_prefix_errors(value: &str) -> Option<String> {
    match value {
        "." => Some("must not be '.'".to_string()),
        ".." => Some("must not be '..'".to_string()),
        v if v.starts_with("..") => Some("must not start with '..'".to_string()),
        _ => None,
    }
}

/// `IsConfigMapKey`.
fn config_map_key_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if value.is_empty() || !value.bytes().all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c)) {
        errs.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(chdir_prefix_errors(value));
    errs
}

/// `IsDNS1123SubdomainWithUnderscore`.
fn dns_subdomain_with_underscore_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    let label_ok = |l: &str| {
        let l = l.strip_prefix('_').unwrap_or(l);
        let b = l.as_bytes();
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty() && alnum(b[0]) && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-' || c == b'_')
    };
    if !value.split('.').all(label_ok) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '_', '-' or '.', and must start and end with an alphanumeric character",
            r"_?[a-z0-9]([-_a-z0-9]*[a-z0-9])?(\._?[a-z0-9]([-_a-z0-9]*[a-z0-9])?)*",
            &["example.com"],
        ));
    }
    errs
}

fn valid_ip(value: &str, field: &str, out: &mut ErrorList) {
    if value.parse::<std::net::IpAddr>().is_err() {
        out.push(FieldError::invalid(field, value, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"));
    }
}

// ---------------------------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------------------------

const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const QUANTITY_SUFFIX_ERROR: &str = "unable to parse quantity's suffix";
/// Quantities are capped at 2^63-1 units; kept here in milli-units.
const MAX_MILLI: u128 = (i64::MAX as u128) * 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuantityFormat {
    BinarySI,
    DecimalSI,
    DecimalExponent,
}

/// Parses a quantity into milli-units (rounded up away from zero, as the API server does for
/// resource lists) and the suffix family that decides its canonical spelling.
fn parse_quantity_full(input: &str) -> Result<(i128, QuantityFormat), &'static str> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QUANTITY_FORMAT_ERROR);
    }
    let b = s.as_bytes();
    let mut pos = 0;
    let negative = b[0] == b'-';
    if b[0] == b'-' || b[0] == b'+' {
        pos = 1;
    }
    let int_start = pos;
    while pos < b.len() && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &s[int_start..pos];
    let mut frac_digits = "";
    if pos < b.len() && b[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &s[frac_start..pos];
    }
    let suffix = &s[pos..];
    let mut i = 0;
    let sb = suffix.as_bytes();
    while i < sb.len() && b"eEinumkKMGTP".contains(&sb[i]) {
        i += 1;
    }
    if i < sb.len() && (sb[i] == b'-' || sb[i] == b'+') {
        i += 1;
    }
    while i < sb.len() && sb[i].is_ascii_digit() {
        i += 1;
    }
    if i != sb.len() {
        return Err(QUANTITY_FORMAT_ERROR);
    }
    let (dec_exp, bin_exp, format) = match suffix {
        "n" => (-9, 0, QuantityFormat::DecimalSI),
        "u" => (-6, 0, QuantityFormat::DecimalSI),
        "m" => (-3, 0, QuantityFormat::DecimalSI),
        "" => (0, 0, QuantityFormat::DecimalSI),
        "k" => (3, 0, QuantityFormat::DecimalSI),
        "M" => (6, 0, QuantityFormat::DecimalSI),
        "G" => (9, 0, QuantityFormat::DecimalSI),
        "T" => (12, 0, QuantityFormat::DecimalSI),
        "P" => (15, 0, QuantityFormat::DecimalSI),
        "E" => (18, 0, QuantityFormat::DecimalSI),
        "Ki" => (0, 1, QuantityFormat::BinarySI),
        "Mi" => (0, 2, QuantityFormat::BinarySI),
        "Gi" => (0, 3, QuantityFormat::BinarySI),
        "Ti" => (0, 4, QuantityFormat::BinarySI),
        "Pi" => (0, 5, QuantityFormat::BinarySI),
        "Ei" => (0, 6, QuantityFormat::BinarySI),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            let exp: i64 = s[1..].parse().map_err(|_| QUANTITY_SUFFIX_ERROR)?;
            (exp.clamp(-1000, 1000), 0, QuantityFormat::DecimalExponent)
        }
        _ => return Err(QUANTITY_SUFFIX_ERROR),
    };

    // Significant digits (at most 36 kept), a decimal shift and whether anything nonzero was dropped.
    let mut mantissa: u128 = 0;
    let mut kept = 0;
    let mut shift: i64 = 0;
    let mut sticky = false;
    for (digit, fractional) in
        int_digits.bytes().map(|d| (d - b'0', false)).chain(frac_digits.bytes().map(|d| (d - b'0', true)))
    {
        if kept < 36 {
            mantissa = mantissa * 10 + u128::from(digit);
            if mantissa > 0 {
                kept += 1;
            }
            if fractional {
                shift -= 1;
            }
        } else {
            sticky |= digit != 0;
            if !fractional {
                shift += 1;
            }
        }
    }
    let multiplier = 1024u128.pow(bin_exp);
    let p = shift + dec_exp + 3;
    let magnitude = if p >= 0 {
        u32::try_from(p)
            .ok()
            .and_then(|p| 10u128.checked_pow(p))
            .and_then(|scale| mantissa.checked_mul(scale))
            .and_then(|v| v.checked_mul(multiplier))
            .map_or(if mantissa == 0 { 0 } else { MAX_MILLI }, |v| v + u128::from(sticky))
    } else {
        let numerator = mantissa.checked_mul(multiplier);
        let denominator = u32::try_from(-p).ok().and_then(|q| 10u128.checked_pow(q));
        match (numerator, denominator) {
            (Some(n), Some(d)) => n / d + u128::from(n % d != 0 || sticky),
            (Some(n), None) => u128::from(n != 0 || sticky),
            _ => (mantissa as f64 * multiplier as f64 * 10f64.powi(p as i32)).ceil() as u128,
        }
    };
    let magnitude = magnitude.min(MAX_MILLI) as i128;
    Ok((if negative { -magnitude } else { magnitude }, format))
}

/// Parses a Kubernetes quantity (`100m`, `1Gi`, `2`, `1e3`, `0.5`) into milli-units, rounded
/// up away from zero to whole milli-units. `None` when the string is not a quantity.
pub fn parse_quantity(s: &str) -> Option<i128> {
    parse_quantity_full(s).ok().map(|(milli, _)| milli)
}

/// The canonical spelling the API server serializes a quantity with (`1.5Gi` → `1536Mi`,
/// `0.5` → `500m`, `1000m` → `1`).
pub fn canonical_quantity(s: &str) -> Option<String> {
    parse_quantity_full(s).ok().map(|(milli, format)| format_quantity(milli, format))
}

fn format_quantity(milli: i128, format: QuantityFormat) -> String {
    if milli == 0 {
        return "0".to_string();
    }
    let sign = if milli < 0 { "-" } else { "" };
    let magnitude = milli.unsigned_abs();
    if format == QuantityFormat::BinarySI && magnitude >= 1_024_000 && magnitude.is_multiple_of(1000) {
        let mut n = magnitude / 1000;
        let mut exp = 0;
        while exp < 6 && n.is_multiple_of(1024) {
            n /= 1024;
            exp += 1;
        }
        return format!("{sign}{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp]);
    }
    let mut m = magnitude;
    let mut exp: i32 = -3;
    while m.is_multiple_of(10) {
        m /= 10;
        exp += 1;
    }
    match exp.rem_euclid(3) {
        1 => {
            m *= 10;
            exp -= 1;
        }
        2 => {
            m *= 100;
            exp -= 2;
        }
        _ => {}
    }
    let suffix = match (format, exp) {
        (QuantityFormat::DecimalExponent, 0) => String::new(),
        (QuantityFormat::DecimalExponent, e) => format!("e{e}"),
        (_, -3) => "m".to_string(),
        (_, 0) => String::new(),
        (_, 3) => "k".to_string(),
        (_, 6) => "M".to_string(),
        (_, 9) => "G".to_string(),
        (_, 12) => "T".to_string(),
        (_, 15) => "P".to_string(),
        (_, 18) => "E".to_string(),
        (_, e) => format!("e{e}"),
    };
    format!("{sign}{m}{suffix}")
}

fn canonicalize(q: &mut Quantity) {
    if let Some(c) = canonical_quantity(&q.0) {
        q.0 = c;
    }
}

fn canonicalize_list(list: &mut Option<Quantities>) {
    list.iter_mut().flat_map(|l| l.values_mut()).for_each(canonicalize);
}

// ---------------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------------

/// Container defaults shared by regular, init and ephemeral containers.
macro_rules! default_container {
    ($c:expr) => {{
        let c = $c;
        if opt(&c.image_pull_policy).is_empty() {
            c.image_pull_policy = Some(default_pull_policy(opt(&c.image)).to_string());
        }
        set_default(&mut c.termination_message_path, "/dev/termination-log");
        set_default(&mut c.termination_message_policy, "File");
        for p in c.ports.iter_mut().flatten() {
            set_default(&mut p.protocol, "TCP");
        }
        for probe in [&mut c.liveness_probe, &mut c.readiness_probe, &mut c.startup_probe].into_iter().flatten() {
            default_probe(probe);
        }
        if let Some(lifecycle) = &mut c.lifecycle {
            default_lifecycle(lifecycle);
        }
        for e in c.env.iter_mut().flatten() {
            if let Some(source) = &mut e.value_from {
                if let Some(f) = &mut source.field_ref {
                    set_default(&mut f.api_version, "v1");
                }
                if let Some(d) = source.resource_field_ref.as_mut().and_then(|r| r.divisor.as_mut()) {
                    canonicalize(d);
                }
            }
        }
        if let Some(res) = &mut c.resources {
            canonicalize_list(&mut res.limits);
            canonicalize_list(&mut res.requests);
        }
    }};
}

/// Fills defaults exactly as kube-apiserver does on create: the scheme defaults of
/// [`default_pod_spec`], the ServiceAccount, Priority and DefaultTolerationSeconds admission
/// defaults, generation 1, a fresh `Pending` status with the computed QoS class, the
/// `SchedulingGated` condition for gated pods and the matchLabelKeys expansion of pod affinity.
pub fn default_pod(pod: &mut Pod) {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    default_pod_spec(spec);

    // ServiceAccount admission (mirror pods are left alone).
    if opt(&spec.service_account_name).is_empty() && !annotations.contains_key(MIRROR_POD_ANNOTATION) {
        spec.service_account_name = Some("default".to_string());
        spec.service_account = spec.service_account_name.clone();
    }

    // Priority admission: no default PriorityClass exists, the system classes are built in.
    let priority = match opt(&spec.priority_class_name) {
        "" => Some(0),
        "system-cluster-critical" => Some(2_000_000_000),
        "system-node-critical" => Some(2_000_001_000),
        _ => None,
    };
    if let Some(priority) = priority {
        spec.priority.get_or_insert(priority);
        set_default(&mut spec.preemption_policy, "PreemptLowerPriority");
    }

    add_default_tolerations(spec);
    expand_match_label_keys(spec, &labels);

    pod.metadata.generation = Some(1);
    let mut status = PodStatus {
        phase: Some("Pending".to_string()),
        qos_class: Some(qos_class(spec).to_string()),
        ..PodStatus::default()
    };
    if !slice(&spec.scheduling_gates).is_empty() {
        status.conditions = Some(vec![PodCondition {
            type_: "PodScheduled".to_string(),
            status: "False".to_string(),
            reason: Some("SchedulingGated".to_string()),
            message: Some("Scheduling is blocked due to non-empty scheduling gates".to_string()),
            ..PodCondition::default()
        }]);
    }
    pod.status = Some(status);
}

/// The scheme defaults applied whenever a pod is decoded (create and update): pod-spec and
/// container defaults, probes, ports, volumes, downward API versions, requests from limits,
/// canonical quantities and the deprecated `serviceAccount` alias.
pub fn default_pod_spec(spec: &mut PodSpec) {
    set_default(&mut spec.dns_policy, "ClusterFirst");
    set_default(&mut spec.restart_policy, "Always");
    spec.security_context.get_or_insert_with(PodSecurityContext::default);
    spec.termination_grace_period_seconds.get_or_insert(30);
    set_default(&mut spec.scheduler_name, "default-scheduler");
    spec.enable_service_links.get_or_insert(true);

    // `serviceAccount` is a deprecated alias; the canonical name wins and is mirrored back.
    if opt(&spec.service_account_name).is_empty() && !opt(&spec.service_account).is_empty() {
        spec.service_account_name = spec.service_account.clone();
    }
    spec.service_account = spec.service_account_name.clone().filter(|s| !s.is_empty());

    let host_network = spec.host_network == Some(true);
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        default_container!(&mut *c);
        if let Some(res) = &mut c.resources
            && let Some(limits) = &res.limits
        {
            let requests = res.requests.get_or_insert_with(BTreeMap::new);
            for (name, limit) in limits {
                requests.entry(name.clone()).or_insert_with(|| limit.clone());
            }
        }
        if host_network {
            for p in c.ports.iter_mut().flatten() {
                if p.host_port.unwrap_or(0) == 0 {
                    p.host_port = Some(p.container_port);
                }
            }
        }
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        default_container!(c);
    }
    for v in spec.volumes.iter_mut().flatten() {
        default_volume(v);
    }
    canonicalize_list(&mut spec.overhead);
    if let Some(res) = &mut spec.resources {
        canonicalize_list(&mut res.limits);
        canonicalize_list(&mut res.requests);
        default_pod_level_requests(res, &spec.containers, slice(&spec.init_containers));
    }
}

fn default_probe(p: &mut Probe) {
    set_default_num(&mut p.timeout_seconds, 1);
    set_default_num(&mut p.period_seconds, 10);
    set_default_num(&mut p.success_threshold, 1);
    set_default_num(&mut p.failure_threshold, 3);
    if let Some(g) = &mut p.http_get {
        default_http_get(g);
    }
    if let Some(g) = &mut p.grpc {
        g.service.get_or_insert_with(String::new);
    }
}

fn default_lifecycle(l: &mut Lifecycle) {
    for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
        if let Some(g) = &mut h.http_get {
            default_http_get(g);
        }
    }
}

fn default_http_get(g: &mut HTTPGetAction) {
    set_default(&mut g.path, "/");
    set_default(&mut g.scheme, "HTTP");
}

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise (a digest counts as a tag).
fn default_pull_policy(image: &str) -> &'static str {
    if image_tag(image) == Some("latest") { "Always" } else { "IfNotPresent" }
}

/// The tag an image reference names: `latest` when it has neither tag nor digest, `""` when it
/// only has a digest, `None` when the reference does not parse.
fn image_tag(image: &str) -> Option<&str> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if digest.is_some_and(|d| !valid_digest(d)) {
        return None;
    }
    let last = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last..].rfind(':') {
        Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !valid_tag(t)) || !valid_repository(name) {
        return None;
    }
    match (tag, digest) {
        (Some(t), _) => Some(t),
        (None, None) => Some("latest"),
        (None, Some(_)) => Some(""),
    }
}

fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == len && hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn valid_tag(t: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !t.is_empty() && t.len() <= 128 && word(t.as_bytes()[0]) && t.bytes().all(|c| word(c) || c == b'.' || c == b'-')
}

fn valid_repository(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    if name.len() == 64 && name.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return false;
    }
    let path = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first => {
            if !valid_registry(first) {
                return false;
            }
            rest
        }
        _ => name,
    };
    path.split('/').all(valid_path_component)
}

fn valid_registry(host: &str) -> bool {
    let (host, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host.starts_with('[') => (h, Some(p)),
        _ => (host, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if host.starts_with('[') && host.ends_with(']') {
        return host[1..host.len() - 1].parse::<std::net::Ipv6Addr>().is_ok();
    }
    host.split('.').all(|l| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
    })
}

fn valid_path_component(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

/// Names of the volume sources set on a volume, in upstream's checking order. The names are the
/// field-path segments upstream reports (`downwarAPI` is spelled that way in its error path).
fn volume_sources(v: &Volume) -> Vec<&'static str> {
    [
        ("emptyDir", v.empty_dir.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("secret", v.secret.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("flocker", v.flocker.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("rbd", v.rbd.is_some()),
        ("cinder", v.cinder.is_some()),
        ("cephFS", v.cephfs.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("downwarAPI", v.downward_api.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("configMap", v.config_map.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("storageos", v.storageos.is_some()),
        ("projected", v.projected.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("csi", v.csi.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("image", v.image.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

fn default_volume(v: &mut Volume) {
    if volume_sources(v).is_empty() {
        v.empty_dir = Some(Default::default());
    }
    if let Some(e) = &mut v.empty_dir {
        e.size_limit.iter_mut().for_each(canonicalize);
    }
    if let Some(h) = &mut v.host_path {
        h.type_.get_or_insert_with(String::new);
    }
    if let Some(s) = &mut v.secret {
        s.default_mode.get_or_insert(0o644);
    }
    if let Some(c) = &mut v.config_map {
        c.default_mode.get_or_insert(0o644);
    }
    if let Some(d) = &mut v.downward_api {
        d.default_mode.get_or_insert(0o644);
        d.items.iter_mut().flatten().for_each(default_downward_file);
    }
    if let Some(p) = &mut v.projected {
        p.default_mode.get_or_insert(0o644);
        for s in p.sources.iter_mut().flatten() {
            if let Some(t) = &mut s.service_account_token {
                t.expiration_seconds.get_or_insert(3600);
            }
            if let Some(d) = &mut s.downward_api {
                d.items.iter_mut().flatten().for_each(default_downward_file);
            }
        }
    }
    if let Some(i) = &mut v.iscsi {
        set_default(&mut i.iscsi_interface, "default");
    }
    if let Some(r) = &mut v.rbd {
        set_default(&mut r.pool, "rbd");
        set_default(&mut r.user, "admin");
        set_default(&mut r.keyring, "/etc/ceph/keyring");
    }
    if let Some(a) = &mut v.azure_disk {
        set_default(&mut a.caching_mode, "ReadWrite");
        set_default(&mut a.fs_type, "ext4");
        a.read_only.get_or_insert(false);
        set_default(&mut a.kind, "Shared");
    }
    if let Some(s) = &mut v.scale_io {
        set_default(&mut s.storage_mode, "ThinProvisioned");
        set_default(&mut s.fs_type, "xfs");
    }
    if let Some(t) = v.ephemeral.as_mut().and_then(|e| e.volume_claim_template.as_mut()) {
        set_default(&mut t.spec.volume_mode, "Filesystem");
    }
    if let Some(i) = &mut v.image
        && opt(&i.pull_policy).is_empty()
    {
        i.pull_policy = Some(default_pull_policy(opt(&i.reference)).to_string());
    }
}

fn default_downward_file(f: &mut DownwardAPIVolumeFile) {
    if let Some(r) = &mut f.field_ref {
        set_default(&mut r.api_version, "v1");
    }
    if let Some(d) = f.resource_field_ref.as_mut().and_then(|r| r.divisor.as_mut()) {
        canonicalize(d);
    }
}

/// Pod-level requests default to pod-level limits for resources no container requests.
fn default_pod_level_requests(res: &mut ResourceRequirements, containers: &[Container], init: &[Container]) {
    let Some(limits) = res.limits.clone().filter(|l| !l.is_empty()) else {
        return;
    };
    let requested = |name: &str| {
        containers
            .iter()
            .chain(init)
            .any(|c| c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some_and(|r| r.contains_key(name)))
    };
    let requests = res.requests.get_or_insert_with(BTreeMap::new);
    for (name, limit) in limits {
        if is_pod_level_resource(&name) && !requests.contains_key(&name) && !requested(&name) {
            requests.insert(name, limit);
        }
    }
}

/// The DefaultTolerationSeconds admission: tolerate not-ready/unreachable nodes for 300s.
fn add_default_tolerations(spec: &mut PodSpec) {
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    let tolerates = |taint: &str| {
        tolerations.iter().any(|t| {
            (opt(&t.key) == taint || opt(&t.key).is_empty())
                && (opt(&t.effect) == "NoExecute" || opt(&t.effect).is_empty())
        })
    };
    let missing: Vec<&str> = [NOT_READY_TAINT, UNREACHABLE_TAINT].into_iter().filter(|t| !tolerates(t)).collect();
    for taint in missing {
        tolerations.push(Toleration {
            key: Some(taint.to_string()),
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            toleration_seconds: Some(300),
            value: None,
        });
    }
}

/// Adds `In`/`NotIn` expressions for pod (anti-)affinity `matchLabelKeys`/`mismatchLabelKeys`.
fn expand_match_label_keys(spec: &mut PodSpec, labels: &BTreeMap<String, String>) {
    let Some(affinity) = &mut spec.affinity else {
        return;
    };
    let mut terms: Vec<&mut PodAffinityTerm> = Vec::new();
    for (required, preferred) in [
        affinity.pod_affinity.as_mut().map(|a| {
            (
                &mut a.required_during_scheduling_ignored_during_execution,
                &mut a.preferred_during_scheduling_ignored_during_execution,
            )
        }),
        affinity.pod_anti_affinity.as_mut().map(|a| {
            (
                &mut a.required_during_scheduling_ignored_during_execution,
                &mut a.preferred_during_scheduling_ignored_during_execution,
            )
        }),
    ]
    .into_iter()
    .flatten()
    {
        terms.extend(required.iter_mut().flatten());
        terms.extend(preferred.iter_mut().flatten().map(|w| &mut w.pod_affinity_term));
    }
    for term in terms {
        let Some(selector) = &mut term.label_selector else {
            continue;
        };
        for (keys, operator) in [(&term.match_label_keys, "In"), (&term.mismatch_label_keys, "NotIn")] {
            for k in slice(keys) {
                if let Some(value) = labels.get(k) {
                    selector.match_expressions.get_or_insert_with(Vec::new).push(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                            key: k.clone(),
                            operator: operator.to_string(),
                            values: Some(vec![value.clone()]),
                        },
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// QoS
// ---------------------------------------------------------------------------------------------

fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// Guaranteed / Burstable / BestEffort, as upstream's `ComputePodQOS`: pod-level resources decide
/// when set; otherwise every container (init containers included) must be Guaranteed for the pod
/// to be, or BestEffort for the pod to be, and any other mix is Burstable.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    if let Some(resources) = &spec.resources {
        return resource_qos(resources);
    }
    let mut pod_qos = None;
    for c in slice(&spec.init_containers).iter().chain(&spec.containers) {
        let qos = c.resources.as_ref().map_or("BestEffort", resource_qos);
        match pod_qos {
            _ if qos == "Burstable" => return qos,
            None => pod_qos = Some(qos),
            Some(seen) if seen != qos => return "Burstable",
            Some(_) => {}
        }
    }
    pod_qos.unwrap_or("BestEffort")
}

/// `resourceQOS`: the class of one set of requirements (cpu and memory only; zero is unset).
fn resource_qos(resources: &ResourceRequirements) -> &'static str {
    let empty = |l: &Option<Quantities>| l.as_ref().is_none_or(|l| l.is_empty());
    if empty(&resources.requests) && empty(&resources.limits) {
        return "BestEffort";
    }
    let amount = |l: &Option<Quantities>, name: &str| {
        l.as_ref().and_then(|l| l.get(name)).and_then(|q| parse_quantity(&q.0)).unwrap_or(0)
    };
    let mut qos = None;
    for name in ["cpu", "memory"] {
        let request = amount(&resources.requests, name);
        if request != amount(&resources.limits, name) {
            return "Burstable";
        }
        let class = if request == 0 { "BestEffort" } else { "Guaranteed" };
        match qos {
            None => qos = Some(class),
            Some(q) if q != class => return "Burstable",
            Some(_) => {}
        }
    }
    qos.unwrap_or("BestEffort")
}

// ---------------------------------------------------------------------------------------------
// Validation: pod and spec
// ---------------------------------------------------------------------------------------------

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

/// The new spec with every change the update rules allow reverted to the old value; reports
/// the node selector and node affinity changes a gated pod may not make.
fn munge_updatable_fields(new: &PodSpec, old: &PodSpec, out: &mut ErrorList) -> PodSpec {
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
fn validate_node_affinity_mutation(new: Option<&NodeAffinity>, old: Option<&NodeAffinity>, out: &mut ErrorList) {
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

fn term_only_adds(new: &NodeSelectorTerm, old: &NodeSelectorTerm) -> bool {
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
fn normalized<T: Serialize + ?Sized>(value: &T) -> Value {
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

fn same<T: Serialize + ?Sized>(a: &T, b: &T) -> bool {
    normalized(a) == normalized(b)
}

/// `- path: old` / `+ path: new` lines for every leaf that differs.
fn diff_values(old: &Value, new: &Value, path: &str, lines: &mut Vec<String>) {
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
fn validate_pod_common(pod: &Pod) -> ErrorList {
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

fn check_image_whitespace(image: &str, container_path: &str, out: &mut ErrorList) {
    if image.trim() != image {
        out.push(FieldError::invalid(
            format!("{container_path}.image"),
            image,
            "must not have leading or trailing whitespace",
        ));
    }
}

/// The pod-specific annotations: a mirror pod must be bound, a deletion cost is an int32.
fn validate_pod_annotations(annotations: Option<&BTreeMap<String, String>>, spec: &PodSpec, out: &mut ErrorList) {
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
struct PodContext<'a> {
    /// The volumes that passed validation, by name.
    volumes: HashMap<&'a str, &'a Volume>,
    grace_period: Option<i64>,
    restart_policy: &'a str,
    host_users: bool,
}

/// `ValidatePodSpec`, in upstream's order.
fn validate_pod_spec(spec: &PodSpec, out: &mut ErrorList) {
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

fn validate_dns_config(spec: &PodSpec, out: &mut ErrorList) {
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

fn validate_tolerations(tolerations: &[Toleration], path: &str, out: &mut ErrorList) {
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

fn validate_topology_spread(constraints: &[TopologySpreadConstraint], out: &mut ErrorList) {
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

fn check_supported(value: Option<&str>, field: &str, valid: &[&str], out: &mut ErrorList) {
    if let Some(value) = value
        && !valid.contains(&value)
    {
        out.push(FieldError::not_supported(field, value, valid));
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: scheduling constraints
// ---------------------------------------------------------------------------------------------

fn validate_affinity(affinity: &Affinity, out: &mut ErrorList) {
    const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";
    const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
    if let Some(na) = &affinity.node_affinity {
        let path = "spec.affinity.nodeAffinity";
        if let Some(selector) = &na.required_during_scheduling_ignored_during_execution {
            let terms_path = format!("{path}.{REQUIRED}.nodeSelectorTerms");
            if selector.node_selector_terms.is_empty() {
                let detail = "must have at least one node selector term";
                out.push(FieldError::required(&terms_path, detail));
            }
            for (i, term) in selector.node_selector_terms.iter().enumerate() {
                validate_node_selector_term(term, false, &index(&terms_path, i), out);
            }
        }
        let preferred = slice(&na.preferred_during_scheduling_ignored_during_execution);
        for (i, term) in preferred.iter().enumerate() {
            let path = format!("{path}.{PREFERRED}[{i}]");
            check_weight(term.weight, &path, out);
            // Preferred terms may name label values no node has yet.
            validate_node_selector_term(&term.preference, true, &format!("{path}.preference"), out);
        }
    }
    let pod_terms = [
        (
            "podAffinity",
            affinity.pod_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            affinity.pod_anti_affinity.as_ref().map(|a| {
                (
                    &a.required_during_scheduling_ignored_during_execution,
                    &a.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ];
    for (field, terms) in pod_terms {
        let Some((required, preferred)) = terms else {
            continue;
        };
        let path = format!("spec.affinity.{field}");
        for (i, term) in slice(required).iter().enumerate() {
            validate_pod_affinity_term(term, &format!("{path}.{REQUIRED}[{i}]"), out);
        }
        for (i, weighted) in slice(preferred).iter().enumerate() {
            let path = format!("{path}.{PREFERRED}[{i}]");
            check_weight(weighted.weight, &path, out);
            validate_pod_affinity_term(&weighted.pod_affinity_term, &format!("{path}.podAffinityTerm"), out);
        }
    }
}

fn check_weight(weight: i32, path: &str, out: &mut ErrorList) {
    if !(1..=100).contains(&weight) {
        out.push(invalid_raw(&format!("{path}.weight"), weight, "must be in the range 1-100"));
    }
}

fn validate_pod_affinity_term(term: &PodAffinityTerm, path: &str, out: &mut ErrorList) {
    validate_label_selector(term.label_selector.as_ref(), &format!("{path}.labelSelector"), out);
    let namespace_selector = term.namespace_selector.as_ref();
    validate_label_selector(namespace_selector, &format!("{path}.namespaceSelector"), out);
    for namespace in slice(&term.namespaces) {
        // Upstream reports these on `namespace`, not `namespaces[i]`.
        dns_label(namespace, &format!("{path}.namespace"), out);
    }
    let key_path = format!("{path}.topologyKey");
    if term.topology_key.is_empty() {
        out.push(FieldError::required(&key_path, "can not be empty"));
    }
    qualified_name(&term.topology_key, &key_path, out);
}

fn validate_node_selector_term(term: &NodeSelectorTerm, any_value: bool, path: &str, out: &mut ErrorList) {
    for (i, req) in slice(&term.match_expressions).iter().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        validate_requirement(&req.key, &req.operator, slice(&req.values), true, any_value, &path, out);
    }
    for (i, req) in slice(&term.match_fields).iter().enumerate() {
        let path = format!("{path}.matchFields[{i}]");
        let values = slice(&req.values);
        match req.operator.as_str() {
            "In" | "NotIn" if values.len() != 1 => out.push(FieldError::required(
                format!("{path}.values"),
                "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            )),
            "In" | "NotIn" => {}
            op => out.push(FieldError::invalid(format!("{path}.operator"), op, "not a valid selector operator")),
        }
        if req.key == "metadata.name" {
            for (j, value) in values.iter().enumerate() {
                dns_subdomain(value, &format!("{path}.values[{j}]"), out);
            }
        } else {
            let field = format!("{path}.key");
            out.push(FieldError::invalid(field, &req.key, "not a valid field selector key"));
        }
    }
}

/// `metav1.ValidateLabelSelector`.
fn validate_label_selector(selector: Option<&LabelSelector>, path: &str, out: &mut ErrorList) {
    let Some(selector) = selector else { return };
    let labels = selector.match_labels.iter().flatten();
    out.extend(validate_labels(labels, &format!("{path}.matchLabels")));
    for (i, req) in slice(&selector.match_expressions).iter().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        validate_requirement(&req.key, &req.operator, slice(&req.values), false, false, &path, out);
    }
}

/// A label (or node) selector requirement; `node` admits the `Gt`/`Lt` operators.
fn validate_requirement(
    key: &str,
    operator: &str,
    values: &[String],
    node: bool,
    any_value: bool,
    path: &str,
    out: &mut ErrorList,
) {
    let values_path = format!("{path}.values");
    match operator {
        "In" | "NotIn" if values.is_empty() => {
            out.push(FieldError::required(&values_path, "must be specified when `operator` is 'In' or 'NotIn'"))
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => out.push(FieldError::forbidden(
            &values_path,
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if node && values.len() != 1 => out
            .push(FieldError::required(&values_path, "must be specified single value when `operator` is 'Lt' or 'Gt'")),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        "Gt" | "Lt" if node => {}
        _ => out.push(FieldError::invalid(format!("{path}.operator"), operator, "not a valid selector operator")),
    }
    qualified_name(key, &format!("{path}.key"), out);
    if !any_value {
        for (i, value) in values.iter().enumerate() {
            push_msgs(out, &index(&values_path, i), value, is_label_value(value));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: security contexts
// ---------------------------------------------------------------------------------------------

const SYSCTL_REGEX: &str = r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";

fn validate_pod_security_context(spec: &PodSpec, out: &mut ErrorList) {
    let path = "spec.securityContext";
    let sc = spec.security_context.as_ref();
    if let Some(sc) = sc {
        for (id, field) in [(sc.fs_group, "fsGroup"), (sc.run_as_user, "runAsUser"), (sc.run_as_group, "runAsGroup")] {
            check_id(id, &format!("{path}.{field}"), out);
        }
        for (i, gid) in slice(&sc.supplemental_groups).iter().enumerate() {
            check_id(Some(*gid), &format!("{path}.supplementalGroups[{i}]"), out);
        }
    }
    if spec.share_process_namespace == Some(true) && spec.host_pid == Some(true) {
        out.push(invalid_raw(
            &format!("{path}.shareProcessNamespace"),
            true,
            "ShareProcessNamespace and HostPID cannot both be enabled",
        ));
    }
    let Some(sc) = sc else { return };
    let mut names = HashSet::new();
    for (i, sysctl) in slice(&sc.sysctls).iter().enumerate() {
        let field = format!("{path}.sysctls[{i}].name");
        let name = sysctl.name.as_str();
        if name.is_empty() {
            out.push(required(&field));
        } else if !valid_sysctl_name(name) {
            let detail = format!("must have at most 253 characters and match regex {SYSCTL_REGEX}");
            out.push(FieldError::invalid(field, name, detail));
        } else if names.contains(name) {
            out.push(FieldError::duplicate(field, name));
        }
        names.insert(name);
    }
    let policy = sc.fs_group_change_policy.as_deref();
    check_supported(policy, &format!("{path}.fsGroupChangePolicy"), FS_GROUP_CHANGE_POLICIES, out);
    validate_seccomp(sc.seccomp_profile.as_ref(), &format!("{path}.seccompProfile"), out);
    validate_app_armor(sc.app_armor_profile.as_ref(), &format!("{path}.appArmorProfile"), out);
    let policy = sc.supplemental_groups_policy.as_deref();
    let field = format!("{path}.supplementalGroupsPolicy");
    check_supported(policy, &field, SUPPLEMENTAL_GROUPS_POLICIES, out);
    let policy = sc.se_linux_change_policy.as_deref();
    check_supported(policy, &format!("{path}.seLinuxChangePolicy"), SELINUX_CHANGE_POLICIES, out);
}

fn valid_sysctl_name(name: &str) -> bool {
    let segment = |s: &str| {
        let b = s.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'_')
    };
    name.len() <= 253 && name.split(['.', '/']).all(segment)
}

/// User and group IDs are 0..=2^31-1.
fn check_id(id: Option<i64>, field: &str, out: &mut ErrorList) {
    if let Some(id) = id
        && !(0..=MAX_INT32).contains(&id)
    {
        out.push(invalid_raw(field, id, &range_error(0, MAX_INT32)));
    }
}

fn validate_security_context(sc: &SecurityContext, path: &str, host_users: bool, out: &mut ErrorList) {
    check_id(sc.run_as_user, &format!("{path}.runAsUser"), out);
    check_id(sc.run_as_group, &format!("{path}.runAsGroup"), out);
    if let Some(proc_mount) = &sc.proc_mount {
        let field = format!("{path}.procMount");
        check_supported(Some(proc_mount.as_str()), &field, PROC_MOUNT_TYPES, out);
        if host_users && proc_mount == "Unmasked" {
            let detail = "`hostUsers` must be false to use `Unmasked`";
            out.push(FieldError::invalid(field, proc_mount, detail));
        }
    }
    validate_seccomp(sc.seccomp_profile.as_ref(), &format!("{path}.seccompProfile"), out);
    if sc.allow_privilege_escalation == Some(false) {
        if sc.privileged == Some(true) {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `privileged` to true";
            out.push(invalid_json(path, sc, detail));
        }
        let added = sc.capabilities.as_ref().map(|c| slice(&c.add)).unwrap_or_default();
        for _ in added.iter().filter(|c| *c == "CAP_SYS_ADMIN") {
            let detail = "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN";
            out.push(invalid_json(path, sc, detail));
        }
    }
    validate_app_armor(sc.app_armor_profile.as_ref(), &format!("{path}.appArmorProfile"), out);
}

fn validate_seccomp(profile: Option<&SeccompProfile>, path: &str, out: &mut ErrorList) {
    let Some(profile) = profile else { return };
    let (kind, local) = (profile.type_.as_str(), profile.localhost_profile.as_deref());
    let type_path = format!("{path}.type");
    if kind.is_empty() {
        out.push(FieldError::required(type_path, "type is required when seccompProfile is set"));
    } else {
        check_supported(Some(kind), &type_path, PROFILE_TYPES, out);
    }
    let local_path = format!("{path}.localhostProfile");
    match local {
        None if kind == "Localhost" => {
            out.push(FieldError::required(local_path, "must be set when seccomp type is Localhost"))
        }
        Some(local) if kind == "Localhost" => local_descending_path(local, &local_path, out),
        Some(_) => out.push(invalid_json(&local_path, profile, "can only be set when seccomp type is Localhost")),
        None => {}
    }
}

fn validate_app_armor(profile: Option<&AppArmorProfile>, path: &str, out: &mut ErrorList) {
    let Some(profile) = profile else { return };
    let local_path = format!("{path}.localhostProfile");
    let local = profile.localhost_profile.as_deref();
    match profile.type_.as_str() {
        "Localhost" => {
            let missing = "must be set when AppArmor type is Localhost";
            match local {
                None => out.push(FieldError::required(&local_path, missing)),
                Some(p) if p.trim() != p => {
                    out.push(FieldError::invalid(&local_path, p, "must not be padded with whitespace"))
                }
                Some("") => out.push(FieldError::required(&local_path, missing)),
                Some(_) => {}
            }
            if local.is_some_and(|p| p.len() > 4095) {
                out.push(FieldError::too_long(local_path, 4095));
            }
        }
        "RuntimeDefault" | "Unconfined" => {
            if let Some(local) = local {
                let detail = "can only be set when AppArmor type is Localhost";
                out.push(FieldError::invalid(local_path, local, detail));
            }
        }
        "" => out.push(FieldError::required(format!("{path}.type"), "type is required when appArmorProfile is set")),
        other => out.push(FieldError::not_supported(format!("{path}.type"), other, PROFILE_TYPES)),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: volumes
// ---------------------------------------------------------------------------------------------

const FILE_MODE_ERROR: &str = "must be a number between 0 and 0777 (octal), both inclusive";

/// `ValidateVolumes`: returns the volumes that passed, by name, for the mounts to refer to.
fn validate_volumes<'a>(volumes: &'a [Volume], out: &mut ErrorList) -> HashMap<&'a str, &'a Volume> {
    let mut valid = HashMap::new();
    for (i, volume) in volumes.iter().enumerate() {
        let path = index("spec.volumes", i);
        let name_path = format!("{path}.name");
        let mut errs = validate_volume_source(volume, &path);
        if volume.name.is_empty() {
            errs.push(required(&name_path));
        } else {
            dns_label(&volume.name, &name_path, &mut errs);
        }
        if valid.contains_key(volume.name.as_str()) {
            errs.push(FieldError::duplicate(&name_path, &volume.name));
        }
        if errs.is_empty() {
            valid.insert(volume.name.as_str(), volume);
        }
        out.extend(errs);
    }
    valid
}

/// Exactly one source, plus the checks of the sources an edge cluster serves.
fn validate_volume_source(v: &Volume, path: &str) -> ErrorList {
    let mut out = Vec::new();
    let sources = volume_sources(v);
    let Some(first) = sources.first() else {
        out.push(FieldError::required(path, "must specify a volume type"));
        return out;
    };
    match *first {
        "emptyDir" => {
            let size = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref());
            if size.and_then(|q| parse_quantity(&q.0)).is_some_and(|q| q < 0) {
                out.push(FieldError::forbidden(
                    format!("{path}.emptyDir.sizeLimit"),
                    "SizeLimit field must be a valid resource quantity",
                ));
            }
        }
        "hostPath" => {
            if let Some(h) = &v.host_path {
                let field = format!("{path}.hostPath.path");
                if h.path.is_empty() {
                    out.push(required(&field));
                } else {
                    check_backsteps(&h.path, &field, &mut out);
                    let field = format!("{path}.hostPath.type");
                    check_supported(h.type_.as_deref(), &field, HOST_PATH_TYPES, &mut out);
                }
            }
        }
        "secret" => {
            if let Some(s) = &v.secret {
                let path = format!("{path}.secret");
                if opt(&s.secret_name).is_empty() {
                    out.push(required(&format!("{path}.secretName")));
                }
                check_mode(s.default_mode, &format!("{path}.defaultMode"), &mut out);
                validate_items(slice(&s.items), &path, &mut out);
            }
        }
        "configMap" => {
            if let Some(c) = &v.config_map {
                let path = format!("{path}.configMap");
                if c.name.is_empty() {
                    out.push(required(&format!("{path}.name")));
                }
                check_mode(c.default_mode, &format!("{path}.defaultMode"), &mut out);
                validate_items(slice(&c.items), &path, &mut out);
            }
        }
        "persistentVolumeClaim" if v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name.is_empty()) => {
            out.push(required(&format!("{path}.persistentVolumeClaim.claimName")));
        }
        "nfs" => {
            if let Some(nfs) = &v.nfs {
                if nfs.server.is_empty() {
                    out.push(required(&format!("{path}.nfs.server")));
                }
                let field = format!("{path}.nfs.path");
                if nfs.path.is_empty() {
                    out.push(required(&field));
                }
                if !nfs.path.starts_with('/') {
                    out.push(FieldError::invalid(field, &nfs.path, "must be an absolute path"));
                }
            }
        }
        "downwarAPI" => {
            if let Some(d) = &v.downward_api {
                let path = format!("{path}.downwardAPI");
                check_mode(d.default_mode, &format!("{path}.defaultMode"), &mut out);
                for file in slice(&d.items) {
                    validate_downward_file(file, &path, &mut out);
                }
            }
        }
        "projected" => {
            if let Some(p) = &v.projected {
                validate_projected(p, &format!("{path}.projected"), &mut out);
            }
        }
        "image" => {
            if let Some(image) = &v.image {
                if opt(&image.reference).is_empty() {
                    out.push(required(&format!("{path}.image.reference")));
                }
                let field = format!("{path}.image.pullPolicy");
                check_enum(opt(&image.pull_policy), &field, PULL_POLICIES, &mut out);
            }
        }
        _ => {}
    }
    for extra in &sources[1..] {
        out.push(FieldError::forbidden(format!("{path}.{extra}"), "may not specify more than 1 volume type"));
    }
    out
}

fn check_mode(mode: Option<i32>, field: &str, out: &mut ErrorList) {
    if let Some(mode) = mode
        && !(0..=0o777).contains(&mode)
    {
        out.push(invalid_raw(field, mode, FILE_MODE_ERROR));
    }
}

fn validate_items(items: &[KeyToPath], path: &str, out: &mut ErrorList) {
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}.items[{i}]");
        if item.key.is_empty() {
            out.push(required(&format!("{path}.key")));
        }
        let path_field = format!("{path}.path");
        if item.path.is_empty() {
            out.push(required(&path_field));
        }
        local_non_reserved_path(&item.path, &path_field, out);
        check_mode(item.mode, &format!("{path}.mode"), out);
    }
}

/// Upstream reports the errors of every file on the volume's own path, without an index.
fn validate_downward_file(file: &DownwardAPIVolumeFile, path: &str, out: &mut ErrorList) {
    let path_field = format!("{path}.path");
    if file.path.is_empty() {
        out.push(required(&path_field));
    }
    local_non_reserved_path(&file.path, &path_field, out);
    match (&file.field_ref, &file.resource_field_ref) {
        (Some(f), resource) => {
            validate_field_selector(f, VOLUME_FIELD_PATHS, &format!("{path}.fieldRef"), out);
            if resource.is_some() {
                out.push(FieldError::invalid(
                    path,
                    "resource",
                    "fieldRef and resourceFieldRef can not be specified simultaneously",
                ));
            }
        }
        (None, Some(r)) => validate_resource_selector(r, true, &format!("{path}.resourceFieldRef"), out),
        (None, None) => {
            out.push(FieldError::required(path, "one of fieldRef and resourceFieldRef is required"));
        }
    }
    check_mode(file.mode, &format!("{path}.mode"), out);
}

fn validate_projected(projected: &ProjectedVolumeSource, path: &str, out: &mut ErrorList) {
    check_mode(projected.default_mode, &format!("{path}.defaultMode"), out);
    let mut paths = HashSet::new();
    let mut claim = |file_path: &str, value: &str, out: &mut ErrorList| {
        if !file_path.is_empty() && !paths.insert(file_path.to_string()) {
            out.push(FieldError::invalid(path, value, "conflicting duplicate paths"));
        }
    };
    for (i, source) in slice(&projected.sources).iter().enumerate() {
        let source_path = format!("{path}.sources[{i}]");
        let keyed = [
            ("secret", source.secret.as_ref().map(|s| (&s.name, slice(&s.items)))),
            ("configMap", source.config_map.as_ref().map(|c| (&c.name, slice(&c.items)))),
        ];
        for (field, keyed) in keyed {
            let Some((name, items)) = keyed else { continue };
            let path = format!("{source_path}.{field}");
            if name.is_empty() {
                out.push(required(&format!("{path}.name")));
            }
            validate_items(items, &path, out);
            for item in items {
                claim(&item.path, name, out);
            }
        }
        if let Some(d) = &source.downward_api {
            for file in slice(&d.items) {
                validate_downward_file(file, &format!("{source_path}.downwardAPI"), out);
                claim(&file.path, &file.path, out);
            }
        }
        if let Some(token) = &source.service_account_token {
            let field = format!("{source_path}.serviceAccountToken.expirationSeconds");
            let expiration = token.expiration_seconds.unwrap_or(0);
            if expiration < 600 {
                let detail = "may not specify a duration less than 10 minutes";
                out.push(invalid_raw(&field, expiration, detail));
            }
            if expiration > 1 << 32 {
                let detail = "may not specify a duration larger than 2^32 seconds";
                out.push(invalid_raw(&field, expiration, detail));
            }
            // Upstream reports the token path on the projection itself.
            if token.path.is_empty() {
                out.push(required(&format!("{path}.path")));
            } else {
                local_non_reserved_path(&token.path, &format!("{path}.path"), out);
            }
        }
        let count = [
            source.secret.is_some(),
            source.config_map.is_some(),
            source.downward_api.is_some(),
            source.service_account_token.is_some(),
            source.cluster_trust_bundle.is_some(),
            source.pod_certificate.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        if count > 1 {
            out.push(FieldError::forbidden(source_path, "may not specify more than 1 volume type per source"));
        }
    }
}

/// A relative path without `..` elements (`validateLocalDescendingPath`).
fn local_descending_path(target: &str, field: &str, out: &mut ErrorList) {
    if target.starts_with('/') {
        out.push(FieldError::invalid(field, target, "must be a relative path"));
    }
    check_backsteps(target, field, out);
}

/// `ValidateLocalNonReservedPath`: also rejects names starting with `..`.
fn local_non_reserved_path(target: &str, field: &str, out: &mut ErrorList) {
    local_descending_path(target, field, out);
    if target.starts_with("..") && !target.starts_with("../") {
        out.push(FieldError::invalid(field, target, "must not start with '..'"));
    }
}

fn has_backsteps(target: &str) -> bool {
    target.split('/').any(|part| part == "..")
}

fn check_backsteps(target: &str, field: &str, out: &mut ErrorList) {
    if has_backsteps(target) {
        out.push(FieldError::invalid(field, target, "must not contain '..'"));
    }
}

// ---------------------------------------------------------------------------------------------
// Validation: containers
// ---------------------------------------------------------------------------------------------

fn validate_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
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

fn validate_init_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
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

/// Ephemeral containers share the container rules and need names unique across the pod.
fn validate_ephemeral_containers(spec: &PodSpec, ctx: &PodContext, out: &mut ErrorList) {
    let others: HashSet<&str> =
        spec.containers.iter().chain(slice(&spec.init_containers)).map(|c| c.name.as_str()).collect();
    let mut names = others.clone();
    for (i, ec) in slice(&spec.ephemeral_containers).iter().enumerate() {
        let path = index("spec.ephemeralContainers", i);
        let as_container = serde_json::to_value(ec).and_then(serde_json::from_value::<Container>);
        if let Ok(c) = as_container {
            validate_container_common(&c, &path, ctx, out);
            check_image_whitespace(opt(&c.image), &path, out);
        }
        if !names.insert(ec.name.as_str()) {
            out.push(FieldError::duplicate(format!("{path}.name"), &ec.name));
        }
        let target = opt(&ec.target_container_name);
        if !target.is_empty() && !others.contains(target) {
            out.push(not_found(&format!("{path}.targetContainerName"), target, ""));
        }
    }
}

/// `AccumulateUniqueHostPorts` over the given containers.
fn check_host_port_conflicts(containers: &[Container], path: &str, out: &mut ErrorList) {
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
fn validate_container_common(c: &Container, path: &str, ctx: &PodContext, out: &mut ErrorList) {
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

fn validate_ports(ports: &[ContainerPort], path: &str, out: &mut ErrorList) {
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

fn validate_env(vars: &[EnvVar], path: &str, out: &mut ErrorList) {
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
fn validate_env_source(source: &EnvVarSource, value: &str, path: &str, out: &mut ErrorList) {
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
fn validate_field_selector(f: &ObjectFieldSelector, allowed: &[&str], path: &str, out: &mut ErrorList) {
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
fn convert_field_label<'a>(version: &str, label: &'a str) -> Result<&'a str, String> {
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
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let (head, key) = path.strip_suffix("']")?.split_once("['")?;
    (!head.is_empty()).then_some((head, key))
}

fn validate_resource_selector(r: &ResourceFieldSelector, volume: bool, path: &str, out: &mut ErrorList) {
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

fn validate_env_from(sources: &[EnvFromSource], path: &str, out: &mut ErrorList) {
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
fn validate_volume_mounts(c: &Container, path: &str, volumes: &HashMap<&str, &Volume>, out: &mut ErrorList) {
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

fn validate_volume_devices(c: &Container, path: &str, volumes: &HashMap<&str, &Volume>, out: &mut ErrorList) {
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

fn validate_resize_policy(policies: &[ContainerResizePolicy], path: &str, pod_restart: &str, out: &mut ErrorList) {
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

// ---------------------------------------------------------------------------------------------
// Validation: probes and lifecycle hooks
// ---------------------------------------------------------------------------------------------

/// The actions a probe or lifecycle hook may take; exactly one must be set.
struct Handler<'a> {
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

fn validate_handler(h: Handler, path: &str, grace_period: Option<i64>, out: &mut ErrorList) {
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

fn validate_http_get(get: &HTTPGetAction, path: &str, out: &mut ErrorList) {
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

fn validate_port_num_or_name(port: &IntOrString, path: &str, out: &mut ErrorList) {
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
fn validate_lifecycle_and_probes(c: &Container, path: &str, grace_period: Option<i64>, out: &mut ErrorList) {
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

// ---------------------------------------------------------------------------------------------
// Validation: resources
// ---------------------------------------------------------------------------------------------

/// `validateResourceRequirements` for containers, the pod level (`pod_level`) and the overhead.
fn validate_requirements(
    limits: Option<&Quantities>,
    requests: Option<&Quantities>,
    path: &str,
    pod_level: bool,
    out: &mut ErrorList,
) {
    let (limits_path, requests_path) = (format!("{path}.limits"), format!("{path}.requests"));
    for (name, quantity) in limits.into_iter().flatten() {
        let path = key(&limits_path, name);
        validate_resource_name(name, &path, pod_level, out);
        validate_quantity(name, quantity, &path, out);
    }
    for (name, quantity) in requests.into_iter().flatten() {
        let path = key(&requests_path, name);
        validate_resource_name(name, &path, pod_level, out);
        validate_quantity(name, quantity, &path, out);
        // Extended resources and hugepages cannot be overcommitted: request == limit.
        let overcommit = is_native_resource(name) && !name.starts_with("hugepages-");
        match limits.and_then(|l| l.get(name)) {
            Some(limit) => {
                let (Some(req), Some(lim)) = (parse_quantity(&quantity.0), parse_quantity(&limit.0)) else {
                    continue;
                };
                let (req_text, lim_text) = (shown(quantity), shown(limit));
                if !overcommit && req != lim {
                    let detail = format!("must be equal to {name} limit of {lim_text}");
                    out.push(FieldError::invalid(&requests_path, req_text, detail));
                } else if req > lim {
                    let detail = format!("must be less than or equal to {name} limit of {lim_text}");
                    out.push(FieldError::invalid(&requests_path, req_text, detail));
                }
            }
            None if !overcommit => {
                out.push(FieldError::required(&limits_path, "Limit must be set for non overcommitable resources"))
            }
            None => {}
        }
    }
}

/// A quantity as the API server prints it.
fn shown(q: &Quantity) -> String {
    canonical_quantity(&q.0).unwrap_or_else(|| q.0.clone())
}

fn validate_quantity(name: &str, q: &Quantity, path: &str, out: &mut ErrorList) {
    match parse_quantity_full(&q.0) {
        Err(e) => out.push(FieldError::invalid(path, &q.0, e)),
        Ok((milli, _)) => {
            if milli < 0 {
                out.push(FieldError::invalid(path, shown(q), "must be greater than or equal to 0"));
            }
            let integer = INTEGER_RESOURCES.contains(&name) || is_extended_resource(name);
            if integer && milli % 1000 != 0 {
                out.push(FieldError::invalid(path, shown(q), "must be an integer"));
            }
        }
    }
}

/// Container (or pod-level) resource names: standard names, or qualified extended resources.
fn validate_resource_name(name: &str, path: &str, pod_level: bool, out: &mut ErrorList) {
    let unqualified = !name.contains('/');
    let mut errs = is_qualified_name(name);
    let standard =
        STANDARD_RESOURCES.contains(&name) || name.starts_with("hugepages-") || name.starts_with("requests.hugepages-");
    if errs.is_empty() && unqualified && !standard {
        errs.push("must be a standard resource type or fully qualified".to_string());
    }
    if pod_level {
        let supported = name == "cpu" || name == "memory" || name.starts_with("hugepages-");
        if errs.is_empty() && !supported {
            out.push(FieldError::not_supported(path, name, POD_LEVEL_RESOURCES));
        }
        push_msgs(out, path, name, errs);
        return;
    }
    if unqualified {
        let container = matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-");
        if !container {
            errs.push("must be a standard resource for containers".to_string());
        }
    } else if !is_native_resource(name) && !is_extended_resource(name) {
        errs.push("doesn't follow extended resource name standard".to_string());
    }
    push_msgs(out, path, name, errs);
}

fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

fn is_extended_resource(name: &str) -> bool {
    !is_native_resource(name)
        && !name.starts_with("requests.")
        && is_qualified_name(&format!("requests.{name}")).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A pod with the given spec, decoded and defaulted as on create.
    fn pod(spec: Value) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap();
        default_pod(&mut pod);
        pod
    }

    /// A pod whose single container is `container` merged over a valid one.
    fn with_container(container: Value) -> Pod {
        let mut c = json!({"name": "app", "image": "nginx:1.27"});
        c.as_object_mut().unwrap().extend(container.as_object().unwrap().clone());
        pod(json!({"containers": [c]}))
    }

    fn spec_mut(pod: &mut Pod) -> &mut PodSpec {
        pod.spec.as_mut().unwrap()
    }

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[track_caller]
    fn assert_error(pod: &Pod, expected: &str) {
        let errs = messages(&validate_pod(pod));
        assert!(errs.iter().any(|e| e == expected), "missing {expected:?} in {errs:#?}");
    }

    #[track_caller]
    fn assert_valid(pod: &Pod) {
        assert_eq!(messages(&validate_pod(pod)), Vec::<String>::new());
    }

    // ----- defaulting ------------------------------------------------------------------------

    #[test]
    fn defaults_a_minimal_pod() {
        let p = pod(json!({"containers": [{"name": "app", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.enable_service_links, Some(true));
        assert_eq!(spec.security_context, Some(PodSecurityContext::default()));
        assert_eq!(spec.service_account_name.as_deref(), Some("default"));
        assert_eq!(spec.service_account.as_deref(), Some("default"));
        assert_eq!(spec.priority, Some(0));
        assert_eq!(spec.preemption_policy.as_deref(), Some("PreemptLowerPriority"));

        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(slice(&c.ports)[0].protocol.as_deref(), Some("TCP"));

        let tolerations = slice(&spec.tolerations);
        let keys: Vec<&str> = tolerations.iter().map(|t| opt(&t.key)).collect();
        assert_eq!(keys, [NOT_READY_TAINT, UNREACHABLE_TAINT]);
        for t in tolerations {
            assert_eq!((opt(&t.operator), opt(&t.effect)), ("Exists", "NoExecute"));
            assert_eq!(t.toleration_seconds, Some(300));
        }

        assert_eq!(p.metadata.generation, Some(1));
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(status.conditions, None);
        assert_valid(&p);
    }

    #[test]
    fn defaults_probes_and_limits() {
        let p = with_container(json!({
            "livenessProbe": {"httpGet": {"port": 8080}},
            "resources": {"limits": {"cpu": "500m", "memory": "1.5Gi"}},
        }));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let probe = c.liveness_probe.as_ref().unwrap();
        let counters = (probe.timeout_seconds, probe.period_seconds, probe.success_threshold, probe.failure_threshold);
        assert_eq!(counters, (Some(1), Some(10), Some(1), Some(3)));
        let get = probe.http_get.as_ref().unwrap();
        assert_eq!((opt(&get.path), opt(&get.scheme)), ("/", "HTTP"));
        let res = c.resources.as_ref().unwrap();
        assert_eq!(res.requests, res.limits);
        assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "1536Mi");
        assert_eq!(p.status.as_ref().unwrap().qos_class.as_deref(), Some("Guaranteed"));
    }

    #[test]
    fn defaults_image_pull_policy() {
        let cases = [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("registry.local:5000/team/app", "Always"),
            ("registry.local:5000/team/app:v2", "IfNotPresent"),
            (&format!("nginx@{DIGEST}"), "IfNotPresent"),
            (&format!("nginx:latest@{DIGEST}"), "Always"),
            ("Not A Reference", "IfNotPresent"),
        ];
        for (image, expected) in cases {
            let p = with_container(json!({"image": image}));
            let policy = p.spec.as_ref().unwrap().containers[0].image_pull_policy.clone();
            assert_eq!(policy.as_deref(), Some(expected), "{image}");
        }
        let p = with_container(json!({"image": "nginx", "imagePullPolicy": "Never"}));
        assert_eq!(p.spec.as_ref().unwrap().containers[0].image_pull_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn classifies_qos() {
        let qos = |spec: Value| pod(spec).status.unwrap().qos_class.unwrap();
        let app = |resources: Value| json!({"name": "app", "image": "nginx", "resources": resources});
        let full = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos(json!({"containers": [app(json!({}))]})), "BestEffort");
        assert_eq!(qos(json!({"containers": [app(json!({"requests": {"cpu": "100m"}}))]})), "Burstable");
        assert_eq!(qos(json!({"containers": [app(full.clone())]})), "Guaranteed");
        let init = |resources: Value| json!({"name": "init", "image": "busybox", "resources": resources});
        let spec = json!({"containers": [app(full.clone())], "initContainers": [init(json!({}))]});
        assert_eq!(qos(spec), "Burstable");
        let spec = json!({"containers": [app(full.clone())], "initContainers": [init(full.clone())]});
        assert_eq!(qos(spec), "Guaranteed");
        let uneven = json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
        let spec = json!({"containers": [app(full)], "initContainers": [init(uneven)]});
        assert_eq!(qos(spec), "Burstable");
    }

    #[test]
    fn adds_default_tolerations_only_when_missing() {
        let keys = |tolerations: Value| {
            let p = pod(json!({"containers": [{"name": "app", "image": "nginx"}], "tolerations": tolerations}));
            slice(&p.spec.unwrap().tolerations)
                .iter()
                .map(|t| (opt(&t.key).to_string(), t.toleration_seconds))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(json!([{"operator": "Exists"}])), [(String::new(), None)]);
        let not_ready =
            json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]);
        assert_eq!(
            keys(not_ready),
            [(NOT_READY_TAINT.to_string(), Some(60)), (UNREACHABLE_TAINT.to_string(), Some(300))]
        );
        let no_schedule = json!([{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
        assert_eq!(keys(no_schedule).len(), 3);
    }

    // ----- create validation -----------------------------------------------------------------

    #[test]
    fn accepts_a_realistic_pod() {
        let p = pod(json!({
            "containers": [{
                "name": "app",
                "image": "registry.local:5000/app:v1",
                "ports": [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}],
                "env": [
                    {"name": "MODE", "value": "edge"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "ZONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['zone']"}}},
                    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/app", "readOnly": true},
                    {"name": "data", "mountPath": "/data", "subPath": "app"},
                ],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 5},
                "startupProbe": {"exec": {"command": ["true"]}, "failureThreshold": 30},
                "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": false},
            }],
            "initContainers": [
                {"name": "setup", "image": "busybox", "command": ["sh", "-c", "true"]},
                {"name": "proxy", "image": "envoy", "restartPolicy": "Always", "readinessProbe": {"grpc": {"port": 9901}}},
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "settings", "items": [{"key": "app.yaml", "path": "app.yaml"}]}},
                {"name": "data", "hostPath": {"path": "/var/lib/app", "type": "DirectoryOrCreate"}},
                {"name": "cache"},
            ],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}]},
            ]}}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}],
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["10.0.0.10"], "searches": ["svc.cluster.local."]},
            "securityContext": {"fsGroup": 2000, "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}]},
            "schedulingGates": [{"name": "example.com/ready"}],
            "hostname": "web-0",
            "subdomain": "web",
            "activeDeadlineSeconds": 3600,
        }));
        assert_valid(&p);
    }

    #[test]
    fn requires_containers_names_and_images() {
        assert_error(&pod(json!({"containers": []})), "spec.containers: Required value");
        let p = pod(json!({"containers": [{"name": "app"}]}));
        assert_error(&p, "spec.containers[0].image: Required value");
        let p = with_container(json!({"name": ""}));
        assert_error(&p, "spec.containers[0].name: Required value");
        let p = with_container(json!({"name": "App_1"}));
        let errs = messages(&validate_pod(&p));
        assert!(
            errs[0].starts_with("spec.containers[0].name: Invalid value: \"App_1\": a lowercase RFC 1123 label"),
            "{errs:?}"
        );
        let p = with_container(json!({"image": " nginx"}));
        assert_error(
            &p,
            "spec.containers[0].image: Invalid value: \" nginx\": must not have leading or trailing whitespace",
        );
    }

    #[test]
    fn container_names_are_unique_across_kinds() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx"}, {"name": "app", "image": "nginx"}],
            "initContainers": [{"name": "app", "image": "busybox"}],
        }));
        assert_error(&p, "spec.containers[1].name: Duplicate value: \"app\"");
        assert_error(&p, "spec.initContainers[0].name: Duplicate value: \"app\"");
    }

    #[test]
    fn validates_ports() {
        let p = with_container(json!({"ports": [
            {"name": "web", "containerPort": 70000, "protocol": "HTTP"},
            {"name": "web", "containerPort": 80, "hostPort": -1},
            {"name": "Bad--", "containerPort": 81},
        ]}));
        assert_error(
            &p,
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        );
        assert_error(
            &p,
            "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
        );
        assert_error(&p, "spec.containers[0].ports[1].name: Duplicate value: \"web\"");
        assert_error(
            &p,
            "spec.containers[0].ports[1].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive",
        );
        assert_error(
            &p,
            "spec.containers[0].ports[2].name: Invalid value: \"Bad--\": must not contain consecutive hyphens",
        );
        let p = pod(json!({"containers": [
            {"name": "a", "image": "nginx", "ports": [{"containerPort": 80, "hostPort": 8080}]},
            {"name": "b", "image": "nginx", "ports": [{"containerPort": 81, "hostPort": 8080}]},
        ]}));
        assert_error(&p, "spec.containers[1].ports[0].hostPort: Duplicate value: \"TCP//8080\"");
    }

    #[test]
    fn host_network_requires_matching_host_ports() {
        let spec = |port: Value| json!({"hostNetwork": true, "containers": [{"name": "app", "image": "nginx", "ports": [port]}]});
        assert_valid(&pod(spec(json!({"containerPort": 80}))));
        let p = pod(spec(json!({"containerPort": 80, "hostPort": 8080})));
        assert_error(
            &p,
            "spec.containers[0].ports[0].hostPort: Invalid value: 8080: must match `containerPort` when `hostNetwork` is true",
        );
    }

    #[test]
    fn validates_env() {
        let p = with_container(json!({"env": [
            {"name": "A=B", "value": "x"},
            {"name": "EMPTY", "valueFrom": {}},
            {"name": "LABELS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
            {"name": "BOGUS", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}},
            {"name": "BOTH", "value": "x", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "bad key"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1m"}}},
        ]}));
        let env = "spec.containers[0].env";
        assert_error(
            &p,
            &format!(
                "{env}[0].name: Invalid value: \"A=B\": a valid environment variable name must consist only of printable ASCII characters other than '='"
            ),
        );
        assert_error(
            &p,
            &format!(
                "{env}[1].valueFrom: Invalid value: \"\": must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
            ),
        );
        assert_error(
            &p,
            &format!(
                "{env}[2].valueFrom.fieldRef.fieldPath: Unsupported value: \"metadata.labels\": supported values: \"metadata.name\", \"metadata.namespace\", \"metadata.uid\", \"spec.nodeName\", \"spec.serviceAccountName\", \"status.hostIP\", \"status.hostIPs\", \"status.podIP\", \"status.podIPs\""
            ),
        );
        assert_error(
            &p,
            &format!(
                "{env}[3].valueFrom.fieldRef.fieldPath: Invalid value: \"spec.bogus\": error converting fieldPath: field label not supported: spec.bogus"
            ),
        );
        assert_error(
            &p,
            &format!("{env}[4].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"),
        );
        let errs = messages(&validate_pod(&p));
        assert!(errs.iter().any(|e| e.starts_with(&format!(
            "{env}[5].valueFrom.secretKeyRef.key: Invalid value: \"bad key\": a valid config key"
        ))));
        assert_error(
            &p,
            &format!(
                "{env}[6].valueFrom.resourceFieldRef.divisor: Invalid value: \"limits.memory\": only divisor's values 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the memory resource"
            ),
        );
    }

    #[test]
    fn validates_resources() {
        let res = |resources: Value| with_container(json!({"resources": resources}));
        let path = "spec.containers[0].resources";
        let p = res(json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}));
        assert_error(
            &p,
            &format!("{path}.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"),
        );
        let p = res(json!({"requests": {"memory": "-1Gi"}}));
        assert_error(
            &p,
            &format!("{path}.requests[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0"),
        );
        let p = res(json!({"requests": {"cpu": "lots"}}));
        assert_error(&p, &format!("{path}.requests[cpu]: Invalid value: \"lots\": {QUANTITY_FORMAT_ERROR}"));
        let p = res(json!({"limits": {"gpu": "1"}}));
        assert_error(
            &p,
            &format!("{path}.limits[gpu]: Invalid value: \"gpu\": must be a standard resource type or fully qualified"),
        );
        assert_error(
            &p,
            &format!("{path}.limits[gpu]: Invalid value: \"gpu\": must be a standard resource for containers"),
        );
        let p = res(json!({"requests": {"example.com/gpu": "1"}}));
        assert_error(&p, &format!("{path}.limits: Required value: Limit must be set for non overcommitable resources"));
        let p = res(json!({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}));
        assert_error(
            &p,
            &format!("{path}.requests: Invalid value: \"1\": must be equal to example.com/gpu limit of 2"),
        );
        let p = res(json!({"limits": {"example.com/gpu": "500m"}}));
        assert_error(&p, &format!("{path}.limits[example.com/gpu]: Invalid value: \"500m\": must be an integer"));
    }

    #[test]
    fn validates_volumes_and_mounts() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx", "volumeMounts": [
                {"name": "missing", "mountPath": "/a"},
                {"name": "data", "mountPath": "/data"},
                {"name": "data", "mountPath": "/data", "subPath": "../up"},
                {"name": "data", "mountPath": "/b", "subPath": "/abs"},
            ]}],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "data", "emptyDir": {}},
                {"name": "Bad", "emptyDir": {}},
                {"name": "two", "emptyDir": {}, "hostPath": {"path": "/x"}},
                {"name": "cm", "configMap": {"name": "", "defaultMode": 1000}},
            ],
        }));
        assert_error(&p, "spec.volumes[1].name: Duplicate value: \"data\"");
        let errs = messages(&validate_pod(&p));
        assert!(errs.iter().any(|e| e.starts_with("spec.volumes[2].name: Invalid value: \"Bad\"")), "{errs:#?}");
        assert_error(&p, "spec.volumes[3].hostPath: Forbidden: may not specify more than 1 volume type");
        assert_error(&p, "spec.volumes[4].configMap.name: Required value");
        assert_error(
            &p,
            "spec.volumes[4].configMap.defaultMode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
        );
        let mounts = "spec.containers[0].volumeMounts";
        assert_error(&p, &format!("{mounts}[0].name: Not found: \"missing\""));
        assert_error(&p, &format!("{mounts}[2].mountPath: Invalid value: \"/data\": must be unique"));
        assert_error(&p, &format!("{mounts}.subPath: Invalid value: \"../up\": must not contain '..'"));
        assert_error(&p, &format!("{mounts}.subPath: Invalid value: \"/abs\": must be a relative path"));
    }

    #[test]
    fn validates_pod_level_enums() {
        let base = |extra: Value| {
            let mut spec = json!({"containers": [{"name": "app", "image": "nginx"}]});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            pod(spec)
        };
        let p = base(json!({"restartPolicy": "Sometimes"}));
        assert_error(
            &p,
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
        );
        let p = base(json!({"dnsPolicy": "Bogus"}));
        assert_error(
            &p,
            "spec.dnsPolicy: Unsupported value: \"Bogus\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
        );
        let p = base(json!({"dnsPolicy": "None"}));
        assert_error(&p, "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None");
        let p = base(json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["x"]}}));
        assert_error(
            &p,
            "spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when `dnsPolicy` is None",
        );
        let p = with_container(json!({"imagePullPolicy": "Sometimes", "terminationMessagePolicy": "Bogus"}));
        assert_error(
            &p,
            "spec.containers[0].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
        );
        assert_error(
            &p,
            "spec.containers[0].terminationMessagePolicy: Unsupported value: \"Bogus\": supported values: \"File\", \"FallbackToLogsOnError\"",
        );
        let p = base(json!({"activeDeadlineSeconds": 0}));
        assert_error(&p, "spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive");
        // A negative grace period is accepted (the kubelet treats it as 1).
        assert_valid(&base(json!({"terminationGracePeriodSeconds": -5})));
        let p = base(json!({"nodeSelector": {"bad key": "v"}, "hostname": "Bad_Host"}));
        let errs = messages(&validate_pod(&p));
        assert!(
            errs.iter()
                .any(|e| { e.starts_with("spec.nodeSelector: Invalid value: \"bad key\": name part must consist") })
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.hostname: Invalid value: \"Bad_Host\": a lowercase RFC 1123 label"))
        );
    }

    #[test]
    fn validates_probes() {
        let p = with_container(json!({
            "livenessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}, "successThreshold": 2},
            "readinessProbe": {"periodSeconds": -1},
            "startupProbe": {"httpGet": {"port": 0}},
        }));
        let c = "spec.containers[0]";
        assert_error(&p, &format!("{c}.livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"));
        assert_error(&p, &format!("{c}.livenessProbe.successThreshold: Invalid value: 2: must be 1"));
        assert_error(&p, &format!("{c}.readinessProbe: Required value: must specify a handler type"));
        assert_error(
            &p,
            &format!("{c}.readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0"),
        );
        assert_error(
            &p,
            &format!("{c}.startupProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive"),
        );
    }

    #[test]
    fn validates_tolerations() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx"}],
            "tolerations": [
                {"operator": "Exists", "value": "x"},
                {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 5},
                {"key": "k", "operator": "Bogus", "effect": "Bad"},
                {"value": "v"},
            ],
        }));
        let t = "spec.tolerations";
        assert_error(
            &p,
            &format!("{t}[0].operator: Invalid value: \"x\": value must be empty when `operator` is 'Exists'"),
        );
        assert_error(
            &p,
            &format!(
                "{t}[1].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set"
            ),
        );
        assert_error(
            &p,
            &format!("{t}[2].operator: Unsupported value: \"Bogus\": supported values: \"Equal\", \"Exists\""),
        );
        assert_error(
            &p,
            &format!(
                "{t}[2].effect: Unsupported value: \"Bad\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
            ),
        );
        assert_error(
            &p,
            &format!(
                "{t}[3].operator: Invalid value: \"\": operator must be Exists when `key` is empty, which means \"match all values and all keys\""
            ),
        );
    }

    #[test]
    fn validates_init_container_rules() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx", "restartPolicy": "Always"}],
            "initContainers": [
                {"name": "once", "image": "busybox", "restartPolicy": "OnFailure"},
                {"name": "probe", "image": "busybox", "livenessProbe": {"exec": {"command": ["true"]}}},
            ],
        }));
        assert_error(&p, "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers");
        assert_error(
            &p,
            "spec.initContainers[0].restartPolicy: Unsupported value: \"OnFailure\": supported values: \"Always\"",
        );
        assert_error(
            &p,
            "spec.initContainers[1].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
        );
    }

    #[test]
    fn validates_scheduling_gates_and_create_only_rules() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx"}],
            "schedulingGates": [{"name": "example.com/gate"}, {"name": "example.com/gate"}, {"name": "bad gate"}],
            "nodeName": "node-1",
        }));
        assert_error(&p, "spec.schedulingGates[1]: Duplicate value: \"example.com/gate\"");
        let errs = messages(&validate_pod(&p));
        assert!(errs.iter().any(|e| e.starts_with("spec.schedulingGates[2]: Invalid value: \"bad gate\"")));
        assert_error(&p, "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared");
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx"}],
            "ephemeralContainers": [{"name": "debug", "image": "busybox", "targetContainerName": "nope"}],
        }));
        assert_error(&p, "spec.ephemeralContainers: Forbidden: cannot be set on create");
        assert_error(&p, "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"");
    }

    #[test]
    fn validates_security_contexts() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "nginx", "securityContext": {"runAsGroup": -2, "procMount": "Unmasked"}}],
            "securityContext": {"runAsUser": -1, "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}, {"name": "kernel.shm_rmid_forced", "value": "0"}], "seccompProfile": {"type": "Localhost"}},
        }));
        assert_error(
            &p,
            "spec.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
        );
        assert_error(&p, "spec.securityContext.sysctls[1].name: Duplicate value: \"kernel.shm_rmid_forced\"");
        assert_error(
            &p,
            "spec.securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost",
        );
        let c = "spec.containers[0].securityContext";
        assert_error(&p, &format!("{c}.runAsGroup: Invalid value: -2: must be between 0 and 2147483647, inclusive"));
        assert_error(
            &p,
            &format!("{c}.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"),
        );
    }

    #[test]
    fn validates_pod_annotations() {
        let annotated = |key: &str, value: &str| {
            let mut p = pod(json!({"containers": [{"name": "app", "image": "nginx"}]}));
            p.metadata.annotations = Some(BTreeMap::from([(key.to_string(), value.to_string())]));
            p
        };
        let cost = DELETION_COST_ANNOTATION;
        assert_valid(&annotated(cost, "-5"));
        for bad in ["+5", "007", "abc", "3000000000"] {
            let expected = format!("metadata.annotations[{cost}]: Invalid value: \"{bad}\": must be a 32bit integer");
            assert_error(&annotated(cost, bad), &expected);
        }
        let expected = format!(
            "metadata.annotations[{MIRROR_POD_ANNOTATION}]: Invalid value: \"x\": must set spec.nodeName if mirror pod annotation is set"
        );
        assert_error(&annotated(MIRROR_POD_ANNOTATION, "x"), &expected);
    }

    // ----- update validation -----------------------------------------------------------------

    fn running() -> Pod {
        pod(json!({
            "containers": [{"name": "app", "image": "nginx:1.27", "command": ["sleep", "1"]}],
            "initContainers": [{"name": "init", "image": "busybox:1"}],
            "activeDeadlineSeconds": 100,
        }))
    }

    fn update(old: &Pod, change: impl FnOnce(&mut PodSpec)) -> Vec<String> {
        let mut new = old.clone();
        change(spec_mut(&mut new));
        messages(&validate_pod_update(&new, old))
    }

    #[track_caller]
    fn assert_forbidden_change(errs: &[String], diff: &str) {
        let expected = format!(
            "spec: Forbidden: pod updates may not change fields other than {}\n",
            UPDATABLE_POD_SPEC_FIELDS.join(",")
        );
        assert_eq!(errs.len(), 1, "{errs:#?}");
        assert!(errs[0].starts_with(&expected), "{errs:#?}");
        assert!(errs[0].contains(diff), "{errs:#?}");
    }

    #[test]
    fn allows_image_changes() {
        let old = running();
        let errs = update(&old, |s| {
            s.containers[0].image = Some("nginx:1.28".into());
            s.init_containers.as_mut().unwrap()[0].image = Some("busybox:2".into());
        });
        assert!(errs.is_empty(), "{errs:#?}");
        assert_eq!(update(&old, |s| s.containers[0].image = None), ["spec.containers[0].image: Required value"; 2]);
    }

    #[test]
    fn forbids_other_spec_changes() {
        let old = running();
        let errs = update(&old, |s| s.containers[0].command = Some(vec!["sleep".into(), "2".into()]));
        assert_forbidden_change(
            &errs,
            "- spec.containers[0].command[1]: \"1\"\n+ spec.containers[0].command[1]: \"2\"",
        );
        let mut bound = old.clone();
        spec_mut(&mut bound).node_name = Some("node-1".into());
        let errs = update(&bound, |s| s.node_name = Some("node-2".into()));
        assert_forbidden_change(&errs, "- spec.nodeName: \"node-1\"\n+ spec.nodeName: \"node-2\"");
        assert_forbidden_change(&update(&bound, |s| s.node_name = None), "- spec.nodeName: \"node-1\"");
        let errs = update(&old, |s| {
            let extra = Container { name: "extra".into(), ..s.containers[0].clone() };
            s.containers.push(extra);
        });
        assert_eq!(errs, ["spec.containers: Forbidden: pod updates may not add or remove containers"]);
        // An empty list and an absent one are the same value.
        assert!(update(&old, |s| s.volumes = Some(Vec::new())).is_empty());
    }

    #[test]
    fn node_name_changes_only_through_binding() {
        let errs = update(&running(), |s| s.node_name = Some("node-1".into()));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("spec: Forbidden: pod updates may not change fields"), "{errs:?}");
    }

    #[test]
    fn allows_only_added_tolerations() {
        let old = running();
        let added = update(&old, |s| {
            s.tolerations
                .as_mut()
                .unwrap()
                .push(Toleration { operator: Some("Exists".into()), ..Toleration::default() });
        });
        assert!(added.is_empty(), "{added:#?}");
        let shortened = update(&old, |s| s.tolerations.as_mut().unwrap()[0].toleration_seconds = Some(10));
        assert!(shortened.is_empty(), "{shortened:#?}");
        let removed = update(&old, |s| {
            s.tolerations.as_mut().unwrap().pop();
        });
        assert_eq!(
            removed,
            ["spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds"]
        );
    }

    #[test]
    fn allows_only_lowering_active_deadline() {
        let old = running();
        assert!(update(&old, |s| s.active_deadline_seconds = Some(50)).is_empty());
        assert_eq!(
            update(&old, |s| s.active_deadline_seconds = Some(200)),
            ["spec.activeDeadlineSeconds: Invalid value: 200: must be less than or equal to previous value"]
        );
        assert_eq!(
            update(&old, |s| s.active_deadline_seconds = None),
            [
                "spec.activeDeadlineSeconds: Invalid value: \"null\": must not update from a positive integer to nil value"
            ]
        );
        let mut unset = running();
        spec_mut(&mut unset).active_deadline_seconds = None;
        assert!(update(&unset, |s| s.active_deadline_seconds = Some(30)).is_empty());
    }

    #[test]
    fn allows_only_removing_scheduling_gates() {
        let gate = |name: &str| json!({"name": name});
        let old = pod(json!({
            "containers": [{"name": "app", "image": "nginx"}],
            "schedulingGates": [gate("example.com/a"), gate("example.com/b")],
            "nodeSelector": {"disk": "ssd"},
        }));
        let gates = |names: &[&str]| {
            let gates = names.iter().map(|n| serde_json::from_value(gate(n)).unwrap()).collect();
            move |s: &mut PodSpec| s.scheduling_gates = Some(gates)
        };
        assert!(update(&old, gates(&["example.com/a"])).is_empty());
        assert!(update(&old, gates(&[])).is_empty());
        assert_eq!(
            update(&old, gates(&["example.com/a", "example.com/b", "example.com/c"])),
            [
                "spec.schedulingGates[2].name: Forbidden: only deletion is allowed, but found new scheduling gate 'example.com/c'"
            ]
        );

        // While gated, node selectors may be added but not changed.
        let add = |s: &mut PodSpec| {
            s.node_selector.as_mut().unwrap().insert("zone".into(), "a".into());
        };
        assert!(update(&old, add).is_empty());
        let errs = update(&old, |s| {
            s.node_selector.as_mut().unwrap().insert("disk".into(), "hdd".into());
        });
        assert_eq!(
            errs,
            [
                "spec.nodeSelector: Invalid value: {\"disk\":\"hdd\"}: only additions to spec.nodeSelector are allowed (no mutations or deletions)"
            ]
        );
        let mut ungated = old.clone();
        spec_mut(&mut ungated).scheduling_gates = None;
        assert_forbidden_change(&update(&ungated, add), "+ spec.nodeSelector.zone: \"a\"");
    }

    #[test]
    fn allows_negative_grace_period_to_become_one() {
        let mut old = running();
        spec_mut(&mut old).termination_grace_period_seconds = Some(-1);
        assert!(update(&old, |s| s.termination_grace_period_seconds = Some(1)).is_empty());
        let errs = update(&running(), |s| s.termination_grace_period_seconds = Some(1));
        assert_forbidden_change(
            &errs,
            "- spec.terminationGracePeriodSeconds: 30\n+ spec.terminationGracePeriodSeconds: 1",
        );
    }

    #[test]
    fn update_validates_the_new_pod() {
        let errs = update(&running(), |s| s.containers[0].image = Some("nginx ".into()));
        let expected =
            "spec.containers[0].image: Invalid value: \"nginx \": must not have leading or trailing whitespace";
        assert_eq!(errs, [expected; 2]);
    }
}
