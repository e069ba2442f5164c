//! Pod Security Standards, as upstream's `k8s.io/pod-security-admission` evaluates them.
//!
//! This module holds the namespace labels and their parsing (upstream's `api` package) and the
//! decisions and texts of the admission controller (upstream's `admission` package); the baseline
//! and restricted checks and their versioning (upstream's `policy` package) are in `checks`, the
//! registry glue in `admission`. All pure, over the k8s-openapi types. Reading namespaces and pods
//! is the caller's business.

mod admission;
mod checks;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::validation::FieldError;
use checks::active_checks;

/// `pod-security.kubernetes.io/enforce` (upstream `api.EnforceLevelLabel`).
pub const ENFORCE_LEVEL_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// `pod-security.kubernetes.io/enforce-version` (upstream `api.EnforceVersionLabel`).
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
/// `pod-security.kubernetes.io/audit` (upstream `api.AuditLevelLabel`).
pub const AUDIT_LEVEL_LABEL: &str = "pod-security.kubernetes.io/audit";
/// `pod-security.kubernetes.io/audit-version` (upstream `api.AuditVersionLabel`).
pub const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
/// `pod-security.kubernetes.io/warn` (upstream `api.WarnLevelLabel`).
pub const WARN_LEVEL_LABEL: &str = "pod-security.kubernetes.io/warn";
/// `pod-security.kubernetes.io/warn-version` (upstream `api.WarnVersionLabel`).
pub const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

/// The newest policy version with checks of its own; later versions evaluate as this one
/// (upstream's `checkRegistry.maxVersion` for the default checks).
pub const MAX_POLICY_MINOR: u64 = 37;

/// How many existing pods a stricter enforce label is checked against (upstream
/// `defaultNamespaceMaxPodsToCheck`).
pub const NAMESPACE_MAX_PODS_TO_CHECK: usize = 3000;

/// A Pod Security Standards level (upstream `api.Level`), ordered from least to most strict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// Upstream `api.ParseLevel`; the error is the field error's detail.
    pub fn parse(value: &str) -> Result<Level, &'static str> {
        match value {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            _ => Err("must be one of privileged, baseline, restricted"),
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy version (upstream `api.Version`): `v1.N`, or `latest`, which is newer than any `v1.N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// `v1.<minor>`.
    V1(u64),
    Latest,
}

impl Version {
    /// Upstream `api.ParseVersion`: `latest` or `v1.N` (no leading zeros); the error is the field
    /// error's detail.
    pub fn parse(value: &str) -> Result<Version, &'static str> {
        const ERR: &str = r#"must be "latest" or "v1.x""#;
        if value == "latest" {
            return Ok(Version::Latest);
        }
        let minor = value.strip_prefix("v1.").ok_or(ERR)?;
        let well_formed = !minor.is_empty()
            && minor.bytes().all(|b| b.is_ascii_digit())
            && (minor.len() == 1 || !minor.starts_with('0'));
        if !well_formed {
            return Err(ERR);
        }
        // Upstream parses into a Go int: anything past i64 is rejected.
        minor.parse::<i64>().ok().and_then(|m| u64::try_from(m).ok()).map(Version::V1).ok_or(ERR)
    }

    /// The minor version whose checks apply: `latest` and anything newer than
    /// [`MAX_POLICY_MINOR`] evaluate as the newest checks.
    fn effective_minor(self) -> u64 {
        match self {
            Version::V1(minor) => minor.min(MAX_POLICY_MINOR),
            Version::Latest => MAX_POLICY_MINOR,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::V1(minor) => write!(f, "v1.{minor}"),
            Version::Latest => f.write_str("latest"),
        }
    }
}

/// A level at a version (upstream `api.LevelVersion`); displays as `restricted:latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    pub level: Level,
    pub version: Version,
}

impl LevelVersion {
    pub fn latest(level: Level) -> Self {
        Self { level, version: Version::Latest }
    }
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level, self.version)
    }
}

/// A namespace's effective policy (upstream `api.Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    pub enforce: LevelVersion,
    pub audit: LevelVersion,
    pub warn: LevelVersion,
}

impl Default for Policy {
    /// `privileged:latest` for all three modes: the defaults of an unconfigured PodSecurity
    /// admission plugin.
    fn default() -> Self {
        let privileged = LevelVersion::latest(Level::Privileged);
        Self { enforce: privileged, audit: privileged, warn: privileged }
    }
}

impl Policy {
    /// The policy a namespace's labels select over the default policy; see [`policy_to_evaluate`].
    pub fn from_labels(labels: Option<&BTreeMap<String, String>>) -> (Policy, Vec<LabelError>) {
        policy_to_evaluate(labels, &Policy::default())
    }

    /// Upstream `Policy.FullyPrivileged`.
    pub fn fully_privileged(&self) -> bool {
        self.enforce.level == Level::Privileged
            && self.audit.level == Level::Privileged
            && self.warn.level == Level::Privileged
    }
}

/// An invalid pod-security label on a namespace: upstream's `field.Invalid` at
/// `metadata.labels[<label>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelError {
    /// `metadata.labels[pod-security.kubernetes.io/enforce]`.
    pub field: String,
    pub value: String,
    pub detail: String,
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: Invalid value: {}: {}", self.field, go_quote(&self.value), self.detail)
    }
}

impl From<LabelError> for FieldError {
    fn from(e: LabelError) -> Self {
        FieldError::invalid(e.field, e.value, e.detail)
    }
}

fn label_error(label: &str, value: &str, detail: &str) -> LabelError {
    LabelError { field: format!("metadata.labels[{label}]"), value: value.to_string(), detail: detail.to_string() }
}

/// Upstream `api.PolicyToEvaluate`: the labels over `defaults`. A usable policy comes back even
/// with errors: an invalid enforce level enforces `restricted`, an invalid audit or warn level is
/// `privileged`, an invalid version is `latest`. Without an explicit warn level, warn follows an
/// explicit enforce level that is stricter than it.
pub fn policy_to_evaluate(labels: Option<&BTreeMap<String, String>>, defaults: &Policy) -> (Policy, Vec<LabelError>) {
    let mut policy = *defaults;
    let mut errs = Vec::new();
    let Some(labels) = labels.filter(|l| !l.is_empty()) else {
        return (policy, errs);
    };

    // A level label's value (or `fail_to` when invalid) and whether it parsed.
    let level = |label: &str, fail_to: Level, errs: &mut Vec<LabelError>| {
        labels.get(label).map(|value| match Level::parse(value) {
            Ok(level) => (level, true),
            Err(detail) => {
                errs.push(label_error(label, value, detail));
                (fail_to, false)
            }
        })
    };
    let version = |label: &str, errs: &mut Vec<LabelError>| {
        labels.get(label).map(|value| {
            Version::parse(value).unwrap_or_else(|detail| {
                errs.push(label_error(label, value, detail));
                Version::Latest
            })
        })
    };

    let enforce_level = level(ENFORCE_LEVEL_LABEL, Level::Restricted, &mut errs);
    if let Some((level, _)) = enforce_level {
        policy.enforce.level = level;
    }
    let has_enforce_level = enforce_level.is_some_and(|(_, ok)| ok);
    if let Some(version) = version(ENFORCE_VERSION_LABEL, &mut errs) {
        policy.enforce.version = version;
    }
    if let Some((level, _)) = level(AUDIT_LEVEL_LABEL, Level::Privileged, &mut errs) {
        policy.audit.level = level;
    }
    if let Some(version) = version(AUDIT_VERSION_LABEL, &mut errs) {
        policy.audit.version = version;
    }
    let warn_level = level(WARN_LEVEL_LABEL, Level::Privileged, &mut errs);
    if let Some((level, _)) = warn_level {
        policy.warn.level = level;
    }
    let warn_version = version(WARN_VERSION_LABEL, &mut errs);
    if let Some(version) = warn_version {
        policy.warn.version = version;
    }

    if warn_level.is_none() && has_enforce_level && policy.enforce.level > policy.warn.level {
        policy.warn.level = policy.enforce.level;
        if warn_version.is_none() {
            policy.warn.version = policy.enforce.version;
        }
    }
    (policy, errs)
}

/// Upstream `policy.CheckResult` for a failed check: `ForbiddenReason` and `ForbiddenDetail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    pub detail: String,
}

impl Violation {
    fn new(reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { reason: reason.into(), detail: detail.into() }
    }
}

/// Upstream `checkRegistry.EvaluatePod`, keeping only the failed checks: every baseline check for
/// `baseline`, baseline and restricted checks for `restricted` (a restricted check replacing the
/// baseline check it overrides), nothing for `privileged`. Each check runs in the variant valid
/// for the version; the order is upstream's (baseline check IDs sorted, then restricted).
pub fn evaluate(level: &LevelVersion, meta: &ObjectMeta, spec: &PodSpec) -> Vec<Violation> {
    active_checks(level).into_iter().filter_map(|(_, check)| check(meta, spec)).collect()
}

/// Upstream `AggregateCheckResult.ForbiddenReason`: the reasons, comma-separated.
pub fn forbidden_reason(violations: &[Violation]) -> String {
    violations.iter().map(reason_or_unknown).collect::<Vec<_>>().join(", ")
}

/// Upstream `AggregateCheckResult.ForbiddenDetail`: `reason (detail), reason (detail)`.
pub fn forbidden_detail(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| {
            let reason = reason_or_unknown(v);
            if v.detail.is_empty() { reason.to_string() } else { format!("{reason} ({})", v.detail) }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn reason_or_unknown(v: &Violation) -> &str {
    if v.reason.is_empty() { "unknown forbidden reason" } else { &v.reason }
}

/// The enforce denial: `violates PodSecurity "restricted:latest": ...`. The caller prefixes it
/// with `pods "name" is forbidden: `.
pub fn forbidden_message(level: &LevelVersion, violations: &[Violation]) -> String {
    format!("violates PodSecurity {}: {}", go_quote(&level.to_string()), forbidden_detail(violations))
}

/// The warn (and audit) text: `would violate PodSecurity "restricted:latest": ...`.
pub fn warning_message(level: &LevelVersion, violations: &[Violation]) -> String {
    format!("would violate PodSecurity {}: {}", go_quote(&level.to_string()), forbidden_detail(violations))
}

/// What the three modes of a namespace's policy make of a pod (upstream `Admission.EvaluatePod`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDecision {
    /// The enforce denial ([`forbidden_message`]), for a 403.
    pub forbidden: Option<String>,
    /// Warnings for the response; none when the request is denied.
    pub warnings: Vec<String>,
    /// The `pod-security.kubernetes.io/audit-violations` audit annotation.
    pub audit_violations: Option<String>,
}

/// Upstream `Admission.EvaluatePod` over a namespace's policy: `enforce` is true for pods (and
/// their evaluated subresources), false for workload resources with a pod template, which only
/// get warnings and audit annotations.
pub fn evaluate_pod(policy: &Policy, meta: &ObjectMeta, spec: &PodSpec, enforce: bool) -> PodDecision {
    let mut decision = PodDecision::default();
    if enforce {
        let violations = evaluate(&policy.enforce, meta, spec);
        if !violations.is_empty() {
            decision.forbidden = Some(forbidden_message(&policy.enforce, &violations));
        }
    }
    let audit = evaluate(&policy.audit, meta, spec);
    if !audit.is_empty() {
        decision.audit_violations = Some(warning_message(&policy.audit, &audit));
    }
    if decision.forbidden.is_none() {
        let warn = evaluate(&policy.warn, meta, spec);
        if !warn.is_empty() {
            decision.warnings.push(warning_message(&policy.warn, &warn));
        }
    }
    decision
}

/// Pod subresources upstream never evaluates (`ignoredPodSubresources`); any other pod
/// subresource (e.g. `ephemeralcontainers`) is evaluated like the pod.
pub fn is_ignored_pod_subresource(subresource: &str) -> bool {
    matches!(subresource, "exec" | "attach" | "binding" | "eviction" | "log" | "portforward" | "proxy" | "status")
}

/// The resources whose pod templates get warnings and audit annotations, as `(group, resource)`
/// (upstream `defaultPodSpecResources`, pods aside).
pub const POD_TEMPLATE_RESOURCES: &[(&str, &str)] = &[
    ("", "replicationcontrollers"),
    ("", "podtemplates"),
    ("apps", "replicasets"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
];

/// Upstream `isSignificantPodUpdate`: whether a pod update is evaluated at all. Only a different
/// number of containers or init containers, a changed image, an added ephemeral container or a
/// changed ephemeral container image counts; anything else is allowed unevaluated.
pub fn is_significant_pod_update(new: &PodSpec, old: &PodSpec) -> bool {
    let init = |s: &PodSpec| s.init_containers.as_deref().unwrap_or_default().len();
    if new.containers.len() != old.containers.len() || init(new) != init(old) {
        return true;
    }
    let image_changed =
        |a: &Option<String>, b: &Option<String>| a.as_deref().unwrap_or("") != b.as_deref().unwrap_or("");
    if new.containers.iter().zip(&old.containers).any(|(n, o)| image_changed(&n.image, &o.image)) {
        return true;
    }
    let old_init = old.init_containers.as_deref().unwrap_or_default();
    if new
        .init_containers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .zip(old_init)
        .any(|(n, o)| image_changed(&n.image, &o.image))
    {
        return true;
    }
    let old_ephemeral = old.ephemeral_containers.as_deref().unwrap_or_default();
    new.ephemeral_containers.as_deref().unwrap_or_default().iter().any(|n| {
        match old_ephemeral.iter().find(|o| o.name == n.name) {
            None => true,
            Some(o) => image_changed(&n.image, &o.image),
        }
    })
}

/// What a namespace create or update means for Pod Security (upstream `ValidateNamespace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceCheck {
    /// Reject with 422 (`Namespace "x" is invalid: ...`).
    Invalid(Vec<LabelError>),
    /// Allow; nothing more to do.
    Allowed,
    /// Allow, with the warnings of [`existing_pods_warnings`] for the namespace's pods at this
    /// enforce level.
    CheckPods(LevelVersion),
}

/// Upstream `ValidateNamespace` for a create: the labels must be valid. (Namespace subresources
/// are never checked.)
pub fn check_namespace_create(labels: Option<&BTreeMap<String, String>>) -> NamespaceCheck {
    let (_, errs) = Policy::from_labels(labels);
    if errs.is_empty() { NamespaceCheck::Allowed } else { NamespaceCheck::Invalid(errs) }
}

/// Upstream `ValidateNamespace` for an update: invalid labels are rejected unless they are the
/// same errors the old labels already had; existing pods are checked only when the enforce level
/// or version changed to something not privileged and not merely more permissive at the same
/// version.
pub fn check_namespace_update(
    old_labels: Option<&BTreeMap<String, String>>,
    new_labels: Option<&BTreeMap<String, String>>,
) -> NamespaceCheck {
    let (new_policy, new_errs) = Policy::from_labels(new_labels);
    let (old_policy, old_errs) = Policy::from_labels(old_labels);
    if !new_errs.is_empty() && (old_errs.is_empty() || new_errs != old_errs) {
        return NamespaceCheck::Invalid(new_errs);
    }
    let (new, old) = (new_policy.enforce, old_policy.enforce);
    if new == old || new.level == Level::Privileged || (new.version == old.version && new.level <= old.level) {
        return NamespaceCheck::Allowed;
    }
    NamespaceCheck::CheckPods(new)
}

/// Upstream `EvaluatePodsInNamespace`: the warnings for a namespace whose enforce level became
/// stricter. Pods are checked one per controller first, then the other pods of each controller,
/// up to `max_pods` (upstream [`NAMESPACE_MAX_PODS_TO_CHECK`]). Pods with the same reasons share
/// one line, named after the lexically first of them: `name (and 2 other pods): reason, reason`.
pub fn existing_pods_warnings(namespace: &str, enforce: &LevelVersion, pods: &[Pod], max_pods: usize) -> Vec<String> {
    let mut prioritized: Vec<&Pod> = Vec::with_capacity(pods.len());
    let mut duplicates: Vec<&Pod> = Vec::new();
    let mut controllers: HashSet<&str> = HashSet::new();
    for pod in pods {
        let controller = pod
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| r.uid.as_str());
        match controller {
            Some(uid) if !controllers.insert(uid) => duplicates.push(pod),
            _ => prioritized.push(pod),
        }
    }
    prioritized.extend(duplicates);
    let total = prioritized.len();
    prioritized.truncate(max_pods);
    let checked = prioritized.len();

    // reason -> (lexically first pod name, pod count), in first-seen order.
    let mut by_reason: Vec<(String, String, usize)> = Vec::new();
    let empty_spec = PodSpec::default();
    for pod in prioritized {
        let violations = evaluate(enforce, &pod.metadata, pod.spec.as_ref().unwrap_or(&empty_spec));
        if violations.is_empty() {
            continue;
        }
        let reason = forbidden_reason(&violations);
        let name = pod.metadata.name.as_deref().unwrap_or("");
        match by_reason.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, first, count)) => {
                if name < first.as_str() {
                    *first = name.to_string();
                }
                *count += 1;
            }
            None => by_reason.push((reason, name.to_string(), 1)),
        }
    }

    let mut warnings = Vec::new();
    if checked < total {
        warnings.push(format!(
            "new PodSecurity enforce level only checked against the first {checked} of {total} existing pods"
        ));
    }
    if !by_reason.is_empty() {
        warnings.push(format!(
            "existing pods in namespace {} violate the new PodSecurity enforce level {}",
            go_quote(namespace),
            go_quote(&enforce.to_string())
        ));
    }
    let mut pod_warnings: Vec<String> = by_reason
        .into_iter()
        .map(|(reason, name, count)| match count {
            1 => format!("{name}: {reason}"),
            2 => format!("{name} (and 1 other pod): {reason}"),
            n => format!("{name} (and {} other pods): {reason}", n - 1),
        })
        .collect();
    pod_warnings.sort();
    warnings.extend(pod_warnings);
    warnings
}

/// Go's `%q` of a string: double quotes, with `\`, `"` and non-printable characters escaped.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
