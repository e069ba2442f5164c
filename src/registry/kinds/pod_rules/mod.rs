//! Pod defaulting, QoS classification and validation, following kube-apiserver.
//!
//! Mirrors `pkg/apis/core/v1/defaults.go`, the pod admission plugins that mutate on create
//! (ServiceAccount, Priority, DefaultTolerationSeconds), the pod strategy's create preparation,
//! `pkg/apis/core/helper/qos` and the pod parts of `pkg/apis/core/validation`, with upstream's
//! field paths and messages.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Affinity, AppArmorProfile, Container, ContainerPort, ContainerResizePolicy, DownwardAPIVolumeFile, EnvFromSource,
    EnvVar, EnvVarSource, EphemeralContainer, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler, NodeAffinity,
    NodeSelectorTerm, ObjectFieldSelector, Pod, PodAffinityTerm, PodCondition, PodSecurityContext, PodSpec, PodStatus,
    Probe, ProjectedVolumeSource, ResourceFieldSelector, ResourceRequirements, SeccompProfile, SecurityContext,
    Toleration, TopologySpreadConstraint, Volume,
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

mod defaults;
mod image;
mod qos;
mod quantity;
mod refs;
#[cfg(test)]
mod tests;
mod validate_containers;
mod validate_pod;
mod validate_probes;
mod validate_resources;
mod validate_scheduling;
mod validate_security;
mod validate_volumes;

use defaults::*;
pub use defaults::{default_pod, default_pod_spec};
use image::*;
use qos::*;
pub use qos::{QosClass, qos_class};
use quantity::*;
pub use quantity::{binary_quantity, canonical_quantity, parse_quantity};
pub use refs::Referenced;
pub use validate_containers::ephemeral_as_container;
use validate_containers::*;
use validate_pod::*;
pub use validate_pod::{validate_ephemeral_containers_update, validate_pod, validate_pod_update, validate_tolerations};
use validate_probes::*;
pub use validate_resources::{is_extended_resource, validate_requirements};
use validate_scheduling::*;
pub use validate_scheduling::{validate_label_selector, validate_node_selector_term};
use validate_security::*;
use validate_volumes::*;

pub(super) fn opt(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("")
}

pub(super) fn set_default(s: &mut Option<String>, value: &str) {
    if opt(s).is_empty() {
        *s = Some(value.to_string());
    }
}

pub(super) fn set_default_num<T: Copy + PartialEq + Default>(n: &mut Option<T>, value: T) {
    if n.is_none_or(|v| v == T::default()) {
        *n = Some(value);
    }
}

pub(super) fn slice<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or(&[])
}

/// `Invalid value: 5: detail`: upstream prints numbers and booleans unquoted.
pub(super) fn invalid_raw(field: &str, value: impl std::fmt::Display, detail: &str) -> FieldError {
    FieldError::invalid_raw(field, value, detail)
}

/// An invalid structured value, rendered as JSON.
pub(super) fn invalid_json(field: &str, value: &impl Serialize, detail: &str) -> FieldError {
    let rendered = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    FieldError {
        kind: ErrorType::Invalid,
        field: field.to_string(),
        detail: format!("Invalid value: {rendered}: {detail}"),
    }
}

/// Upstream's `field.NotFound`; reported with the closest reason available.
pub(super) fn not_found(field: &str, value: &str, detail: &str) -> FieldError {
    let mut text = format!("Not found: {value:?}");
    if !detail.is_empty() {
        text = format!("{text}: {detail}");
    }
    FieldError { kind: ErrorType::Invalid, field: field.to_string(), detail: text }
}

pub(super) fn required(field: &str) -> FieldError {
    FieldError::required(field, "")
}

pub(super) fn range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// Upstream's `RegexError`, including its examples formatting.
pub(super) fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
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

pub(super) fn check_nonnegative(value: i64, field: &str, out: &mut ErrorList) {
    if value < 0 {
        out.push(invalid_raw(field, value, "must be greater than or equal to 0"));
    }
}

pub(super) fn check_enum(value: &str, field: &str, valid: &[&str], out: &mut ErrorList) {
    if value.is_empty() {
        out.push(required(field));
    } else if !valid.contains(&value) {
        out.push(FieldError::not_supported(field, value, valid));
    }
}

pub(super) fn push_msgs(out: &mut ErrorList, field: &str, value: &str, msgs: Vec<String>) {
    out.extend(msgs.into_iter().map(|m| FieldError::invalid(field, value, m)));
}

pub(super) fn dns_label(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_dns1123_label(value));
}

pub(super) fn dns_subdomain(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_dns1123_subdomain(value));
}

pub(super) fn qualified_name(value: &str, field: &str, out: &mut ErrorList) {
    push_msgs(out, field, value, is_qualified_name(value));
}

/// `NameIsDNSSubdomain`; a generateName prefix may end in '-'.
pub(super) fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    // Same masking as upstream: the last two characters become "a". A name whose cut falls
    // inside a multi-byte character is not ASCII and fails either way.
    match name.get(..name.len().saturating_sub(2)) {
        Some(head) if prefix && name.len() > 1 && name.ends_with('-') => is_dns1123_subdomain(&format!("{head}a")),
        _ => is_dns1123_subdomain(name),
    }
}

pub(super) fn port_num_error(port: i64) -> Option<String> {
    (!(1..=65535).contains(&port)).then(|| range_error(1, 65535))
}

/// `IsValidPortName`.
pub(super) fn port_name_errors(port: &str) -> Vec<String> {
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
pub(super) fn env_var_name_errors(name: &str) -> Vec<String> {
    if name.bytes().any(|c| !(0x20..=0x7e).contains(&c) || c == b'=') {
        return vec![
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_string(),
        ];
    }
    Vec::new()
}

pub(super) fn chdir_prefix_errors(value: &str) -> Option<String> {
    match value {
        "." => Some("must not be '.'".to_string()),
        ".." => Some("must not be '..'".to_string()),
        v if v.starts_with("..") => Some("must not start with '..'".to_string()),
        _ => None,
    }
}

/// `IsConfigMapKey`.
pub(super) fn config_map_key_errors(value: &str) -> Vec<String> {
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
pub(super) fn dns_subdomain_with_underscore_errors(value: &str) -> Vec<String> {
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

pub(super) fn valid_ip(value: &str, field: &str, out: &mut ErrorList) {
    if value.parse::<std::net::IpAddr>().is_err() {
        out.push(FieldError::invalid(field, value, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"));
    }
}
