//! Pod defaulting, QoS classification and validation, following kube-apiserver.
//!
//! Mirrors `pkg/apis/core/v1/defaults.go`, the pod admission plugins that mutate on create
//! (ServiceAccount, Priority, DefaultTolerationSeconds), the pod strategy's create preparation,
//! `pkg/apis/core/helper/qos` and the pod parts of `pkg/apis/core/validation`, with upstream's
//! field paths and messages.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Affinity, AppArmorProfile, Container, ContainerPort, DownwardAPIVolumeFile, EnvFromSource,
    EnvVar, HTTPGetAction, Lifecycle, LifecycleHandler, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, Pod, PodAffinityTerm,
    PodCondition, PodDNSConfig, PodSecurityContext, PodSpec, PodStatus, Probe,
    ProjectedVolumeSource, ResourceFieldSelector, ResourceRequirements, SeccompProfile,
    SecurityContext, Toleration, TopologySpreadConstraint, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::registry::validation::{
    ErrorList, ErrorType, FieldError, child, index, is_dns1123_label, is_dns1123_subdomain,
    is_label_value, is_qualified_name, key, validate_labels,
};

type Quantities = BTreeMap<String, Quantity>;

const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
const MAX_INT32: i64 = i32::MAX as i64;
const MAX_ID: i64 = u32::MAX as i64;

const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
const PREEMPTION_POLICIES: &[&str] = &["PreemptLowerPriority", "Never"];
const TOLERATION_OPERATORS: &[&str] = &["Equal", "Exists"];
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const HTTP_SCHEMES: &[&str] = &["HTTP", "HTTPS"];
const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];
const MOUNT_PROPAGATIONS: &[&str] = &["Bidirectional", "HostToContainer", "None"];
const RECURSIVE_READ_ONLY_MODES: &[&str] = &["Disabled", "Enabled", "IfPossible"];
const SECCOMP_TYPES: &[&str] = &["Localhost", "RuntimeDefault", "Unconfined"];
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
const VOLUME_FIELD_PATHS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];
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

/// `Invalid value: 5: detail` — upstream prints numbers unquoted.
fn invalid_num(field: &str, value: i64, detail: &str) -> FieldError {
    FieldError {
        kind: ErrorType::Invalid,
        field: field.to_string(),
        detail: format!("Invalid value: {value}: {detail}"),
    }
}

/// An invalid structured value, rendered as JSON.
fn invalid_json(field: &str, value: &impl serde::Serialize, detail: &str) -> FieldError {
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
        out.push(invalid_num(field, value, "must be greater than or equal to 0"));
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
    if prefix && name.len() > 1 && name.ends_with('-') {
        // Same masking as upstream: the last two characters become "a".
        let masked = format!("{}a", &name[..name.len() - 2]);
        return is_dns1123_subdomain(&masked);
    }
    is_dns1123_subdomain(name)
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
        return vec!["a valid environment variable name must consist only of printable ASCII characters other than '='".to_string()];
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
        !b.is_empty()
            && alnum(b[0])
            && alnum(b[b.len() - 1])
            && b.iter().all(|&c| alnum(c) || c == b'-' || c == b'_')
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
        out.push(FieldError::invalid(
            field,
            value,
            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ));
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
    for (digit, fractional) in int_digits
        .bytes()
        .map(|d| (d - b'0', false))
        .chain(frac_digits.bytes().map(|d| (d - b'0', true)))
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
    if format == QuantityFormat::BinarySI && magnitude >= 1_024_000 && magnitude % 1000 == 0 {
        let mut n = magnitude / 1000;
        let mut exp = 0;
        while exp < 6 && n % 1024 == 0 {
            n /= 1024;
            exp += 1;
        }
        return format!("{sign}{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp]);
    }
    let mut m = magnitude;
    let mut exp: i32 = -3;
    while m % 10 == 0 {
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
        for probe in [&mut c.liveness_probe, &mut c.readiness_probe, &mut c.startup_probe]
            .into_iter()
            .flatten()
        {
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
        if let Some(res) = &mut c.resources {
            if let Some(limits) = &res.limits {
                let requests = res.requests.get_or_insert_with(BTreeMap::new);
                for (name, limit) in limits {
                    requests.entry(name.clone()).or_insert_with(|| limit.clone());
                }
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
    let Some((alg, hex)) = d.split_once(':') else { return false };
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
    !t.is_empty()
        && t.len() <= 128
        && word(t.as_bytes()[0])
        && t.bytes().all(|c| word(c) || c == b'.' || c == b'-')
}

fn valid_repository(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    if name.len() == 64 && name.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return false;
    }
    let path = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first =>
        {
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
    if let Some(i) = &mut v.image {
        if opt(&i.pull_policy).is_empty() {
            let always = image_tag(opt(&i.reference)) == Some("latest");
            i.pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.to_string());
        }
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
    let Some(limits) = res.limits.clone().filter(|l| !l.is_empty()) else { return };
    let requested = |name: &str| {
        containers.iter().chain(init).any(|c| {
            c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some_and(|r| r.contains_key(name))
        })
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
    let Some(affinity) = &mut spec.affinity else { return };
    let mut terms: Vec<&mut PodAffinityTerm> = Vec::new();
    for (required, preferred) in [
        affinity.pod_affinity.as_mut().map(|a| {
            (&mut a.required_during_scheduling_ignored_during_execution, &mut a.preferred_during_scheduling_ignored_during_execution)
        }),
        affinity.pod_anti_affinity.as_mut().map(|a| {
            (&mut a.required_during_scheduling_ignored_during_execution, &mut a.preferred_during_scheduling_ignored_during_execution)
        }),
    ]
    .into_iter()
    .flatten()
    {
        terms.extend(required.iter_mut().flatten());
        terms.extend(preferred.iter_mut().flatten().map(|w| &mut w.pod_affinity_term));
    }
    for term in terms {
        let Some(selector) = &mut term.label_selector else { continue };
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

/// Guaranteed / Burstable / BestEffort, upstream's algorithm (init containers included,
/// pod-level resources if set).
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    // Adds the positive cpu/memory quantities and reports which resources were present.
    fn add<'a>(into: &mut BTreeMap<&'a str, i128>, list: Option<&'a Quantities>) -> HashSet<&'a str> {
        let mut found = HashSet::new();
        for (name, q) in list.into_iter().flatten() {
            if name != "cpu" && name != "memory" {
                continue;
            }
            if let Some(v) = parse_quantity(&q.0).filter(|v| *v > 0) {
                found.insert(name.as_str());
                let sum = into.entry(name.as_str()).or_insert(0);
                *sum = sum.saturating_add(v);
            }
        }
        found
    }
    let pod_level = spec.resources.as_ref().filter(|r| {
        r.requests.iter().chain(r.limits.iter()).flat_map(|l| l.keys()).any(|k| is_pod_level_resource(k))
    });
    if let Some(res) = pod_level {
        add(&mut requests, res.requests.as_ref());
        if res.limits.as_ref().is_some_and(|l| !l.is_empty()) && add(&mut limits, res.limits.as_ref()).len() != 2 {
            guaranteed = false;
        }
    } else {
        for c in spec.containers.iter().chain(slice(&spec.init_containers)) {
            let res = c.resources.as_ref();
            add(&mut requests, res.and_then(|r| r.requests.as_ref()));
            if add(&mut limits, res.and_then(|r| r.limits.as_ref())).len() != 2 {
                guaranteed = false;
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed && requests.len() == limits.len() && requests.iter().all(|(k, v)| limits.get(k) == Some(v)) {
        return "Guaranteed";
    }
    "Burstable"
}

pub fn validate_pod(_pod: &Pod) -> ErrorList {
    Vec::new()
}

pub fn validate_pod_update(_new: &Pod, _old: &Pod) -> ErrorList {
    Vec::new()
}
