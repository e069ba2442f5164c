//! The baseline and restricted checks of the Pod Security Standards and the versions each one
//! comes in: upstream's `policy` package (`k8s.io/pod-security-admission/policy`).

use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EphemeralContainer, Lifecycle, LifecycleHandler, PodSpec, Probe, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Level, LevelVersion, Violation, go_quote};

// ---------------------------------------------------------------------------------------------
// The check registry (upstream `policy/registry.go` over `policy.DefaultChecks()`).

type CheckFn = fn(&ObjectMeta, &PodSpec) -> Option<Violation>;

struct VersionedCheck {
    min_minor: u64,
    check: CheckFn,
    overrides: &'static [&'static str],
}

pub(super) struct Check {
    pub(super) id: &'static str,
    pub(super) level: Level,
    versions: &'static [VersionedCheck],
}

const fn v(min_minor: u64, check: CheckFn) -> VersionedCheck {
    VersionedCheck { min_minor, check, overrides: &[] }
}

const fn v_over(min_minor: u64, check: CheckFn, overrides: &'static [&'static str]) -> VersionedCheck {
    VersionedCheck { min_minor, check, overrides }
}

/// All checks: baseline IDs sorted, then restricted IDs sorted (byte order, as upstream).
pub(super) static CHECKS: &[Check] = &[
    Check { id: "appArmorProfile", level: Level::Baseline, versions: &[v(0, app_armor_profile)] },
    Check { id: "capabilities_baseline", level: Level::Baseline, versions: &[v(0, capabilities_baseline)] },
    Check { id: "hostNamespaces", level: Level::Baseline, versions: &[v(0, host_namespaces)] },
    Check { id: "hostPathVolumes", level: Level::Baseline, versions: &[v(0, host_path_volumes)] },
    Check { id: "hostPorts", level: Level::Baseline, versions: &[v(0, host_ports)] },
    Check { id: "hostProbesAndHostLifecycle", level: Level::Baseline, versions: &[v(34, host_probes_and_lifecycle)] },
    Check { id: "privileged", level: Level::Baseline, versions: &[v(0, privileged)] },
    Check { id: "procMount", level: Level::Baseline, versions: &[v(0, proc_mount), v(35, proc_mount_baseline_1_35)] },
    Check {
        id: "seLinuxOptions",
        level: Level::Baseline,
        versions: &[v(0, se_linux_options_1_0), v(31, se_linux_options_1_31)],
    },
    Check {
        id: "seccompProfile_baseline",
        level: Level::Baseline,
        versions: &[v(0, seccomp_profile_baseline_1_0), v(19, seccomp_profile_baseline_1_19)],
    },
    Check {
        id: "sysctls",
        level: Level::Baseline,
        versions: &[
            v(0, sysctls_1_0),
            v(27, sysctls_1_27),
            v(29, sysctls_1_29),
            v(32, sysctls_1_32),
            v(37, sysctls_1_37),
        ],
    },
    Check { id: "windowsHostProcess", level: Level::Baseline, versions: &[v(0, windows_host_process)] },
    Check {
        id: "allowPrivilegeEscalation",
        level: Level::Restricted,
        versions: &[v(8, allow_privilege_escalation_1_8), v(25, allow_privilege_escalation_1_25)],
    },
    Check {
        id: "capabilities_restricted",
        level: Level::Restricted,
        versions: &[
            v_over(22, capabilities_restricted_1_22, &["capabilities_baseline"]),
            v_over(25, capabilities_restricted_1_25, &["capabilities_baseline"]),
        ],
    },
    Check { id: "procMount_restricted", level: Level::Restricted, versions: &[v_over(35, proc_mount, &["procMount"])] },
    Check {
        id: "restrictedVolumes",
        level: Level::Restricted,
        versions: &[v_over(0, restricted_volumes, &["hostPathVolumes"])],
    },
    Check {
        id: "runAsNonRoot",
        level: Level::Restricted,
        versions: &[v(0, run_as_non_root_1_0), v(35, run_as_non_root_1_35)],
    },
    Check { id: "runAsUser", level: Level::Restricted, versions: &[v(23, run_as_user_1_23), v(35, run_as_user_1_35)] },
    Check {
        id: "seccompProfile_restricted",
        level: Level::Restricted,
        versions: &[
            v_over(19, seccomp_profile_restricted_1_19, &["seccompProfile_baseline"]),
            v_over(25, seccomp_profile_restricted_1_25, &["seccompProfile_baseline"]),
        ],
    },
];

/// The checks (ID and the variant for the version) that run for a level and version, in order.
pub(super) fn active_checks(lv: &LevelVersion) -> Vec<(&'static str, CheckFn)> {
    if lv.level == Level::Privileged {
        return Vec::new();
    }
    let minor = lv.version.effective_minor();
    let applicable = |c: &'static Check| c.versions.iter().rev().find(|vc| vc.min_minor <= minor);
    let in_level = |c: &&'static Check| c.level == Level::Baseline || lv.level == Level::Restricted;
    let overridden: HashSet<&str> = CHECKS
        .iter()
        .filter(|c| lv.level == Level::Restricted && c.level == Level::Restricted)
        .filter_map(applicable)
        .flat_map(|vc| vc.overrides.iter().copied())
        .collect();
    CHECKS
        .iter()
        .filter(in_level)
        .filter(|c| !overridden.contains(c.id))
        .filter_map(|c| applicable(c).map(|vc| (c.id, vc.check)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers (upstream `policy/helpers.go`, `policy/visitor.go`).

/// The fields of a container or an ephemeral container the checks read.
struct ContainerView<'a> {
    name: &'a str,
    security_context: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    liveness_probe: Option<&'a Probe>,
    readiness_probe: Option<&'a Probe>,
    startup_probe: Option<&'a Probe>,
    lifecycle: Option<&'a Lifecycle>,
}

impl<'a> From<&'a Container> for ContainerView<'a> {
    fn from(c: &'a Container) -> Self {
        Self {
            name: &c.name,
            security_context: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
            liveness_probe: c.liveness_probe.as_ref(),
            readiness_probe: c.readiness_probe.as_ref(),
            startup_probe: c.startup_probe.as_ref(),
            lifecycle: c.lifecycle.as_ref(),
        }
    }
}

impl<'a> From<&'a EphemeralContainer> for ContainerView<'a> {
    fn from(c: &'a EphemeralContainer) -> Self {
        Self {
            name: &c.name,
            security_context: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
            liveness_probe: c.liveness_probe.as_ref(),
            readiness_probe: c.readiness_probe.as_ref(),
            startup_probe: c.startup_probe.as_ref(),
            lifecycle: c.lifecycle.as_ref(),
        }
    }
}

/// Upstream `visitContainers`: init containers, containers, then ephemeral containers.
fn containers(spec: &PodSpec) -> impl Iterator<Item = ContainerView<'_>> {
    let init = spec.init_containers.as_deref().unwrap_or_default().iter().map(ContainerView::from);
    let regular = spec.containers.iter().map(ContainerView::from);
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or_default().iter().map(ContainerView::from);
    init.chain(regular).chain(ephemeral)
}

fn pluralize<'a>(singular: &'a str, plural: &'a str, count: usize) -> &'a str {
    if count == 1 { singular } else { plural }
}

/// Upstream `joinQuote`: `"a", "b"`.
pub(super) fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let joined = items.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(r#"", ""#);
    format!("\"{joined}\"")
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase<S: AsRef<str>>(names: &[S]) -> String {
    format!("{} {}", pluralize("container", "containers", names.len()), join_quote(names))
}

/// `pod`, `containers "a", "b"`, in that order, for the `... and ...` subjects of a detail.
fn setters(pod: bool, containers: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    if pod {
        out.push("pod".to_string());
    }
    if !containers.is_empty() {
        out.push(containers_phrase(containers));
    }
    out
}

fn is_windows(spec: &PodSpec) -> bool {
    spec.os.as_ref().is_some_and(|os| os.name == "windows")
}

/// Upstream `relaxPolicyForUserNamespacePod`: `hostUsers: false`.
fn in_user_namespace(spec: &PodSpec) -> bool {
    spec.host_users == Some(false)
}

fn sorted<I: IntoIterator<Item = String>>(items: I) -> Vec<String> {
    items.into_iter().collect::<BTreeSet<_>>().into_iter().collect()
}

// ---------------------------------------------------------------------------------------------
// Baseline checks.

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Upstream `appArmorProfile_1_0`: AppArmor profile types other than `RuntimeDefault` and
/// `Localhost`, and the deprecated annotations with values other than `runtime/default`,
/// `localhost/*` or empty.
fn app_armor_profile(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let allowed_type = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    let mut bad_values = BTreeSet::new();
    let pod_bad = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.app_armor_profile.as_ref())
        .filter(|p| !allowed_type(&p.type_))
        .map(|p| bad_values.insert(p.type_.clone()))
        .is_some();
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(p) = c.security_context.and_then(|sc| sc.app_armor_profile.as_ref())
            && !allowed_type(&p.type_)
        {
            bad_containers.push(c.name);
            bad_values.insert(p.type_.clone());
        }
    }
    let mut bad_setters = setters(pod_bad, &bad_containers);

    let forbidden_annotations = sorted(
        meta.annotations
            .iter()
            .flatten()
            .filter(|(k, v)| {
                k.starts_with(APPARMOR_ANNOTATION_PREFIX)
                    && !(v.is_empty() || v.as_str() == "runtime/default" || v.starts_with("localhost/"))
            })
            .map(|(k, v)| format!("{k}={}", go_quote(v))),
    );
    let mut bad_value_list: Vec<String> = bad_values.into_iter().collect();
    if !forbidden_annotations.is_empty() {
        bad_setters.push(pluralize("annotation", "annotations", forbidden_annotations.len()).to_string());
        bad_value_list.extend(forbidden_annotations);
    }
    if bad_setters.is_empty() {
        return None;
    }
    Some(Violation::new(
        pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", bad_value_list.len()),
        format!("{} must not set AppArmor profile type to {}", bad_setters.join(" and "), join_quote(&bad_value_list)),
    ))
}

const CAPABILITIES_ALLOWED_BASELINE: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Upstream `capabilitiesBaseline_1_0`: added capabilities beyond the default set.
fn capabilities_baseline(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut non_default = BTreeSet::new();
    for c in containers(spec) {
        let Some(caps) = c.security_context.and_then(|sc| sc.capabilities.as_ref()) else {
            continue;
        };
        let mut valid = true;
        for cap in caps.add.iter().flatten() {
            if !CAPABILITIES_ALLOWED_BASELINE.contains(&cap.as_str()) {
                valid = false;
                non_default.insert(cap.clone());
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let non_default: Vec<String> = non_default.into_iter().collect();
    Some(Violation::new(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad_containers),
            join_quote(&non_default)
        ),
    ))
}

/// Upstream `hostNamespaces_1_0`: hostNetwork, hostPID, hostIPC.
fn host_namespaces(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let set: Vec<&str> =
        [(spec.host_network, "hostNetwork=true"), (spec.host_pid, "hostPID=true"), (spec.host_ipc, "hostIPC=true")]
            .into_iter()
            .filter(|(on, _)| *on == Some(true))
            .map(|(_, text)| text)
            .collect();
    if set.is_empty() {
        return None;
    }
    Some(Violation::new("host namespaces", set.join(", ")))
}

/// Upstream `hostPathVolumes_1_0`.
fn host_path_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let names: Vec<&str> =
        spec.volumes.iter().flatten().filter(|v| v.host_path.is_some()).map(|v| v.name.as_str()).collect();
    if names.is_empty() {
        return None;
    }
    Some(Violation::new(
        "hostPath volumes",
        format!("{} {}", pluralize("volume", "volumes", names.len()), join_quote(&names)),
    ))
}

/// Upstream `hostPorts_1_0`: any non-zero hostPort, on any kind of container. The ports are listed
/// in string order, as upstream does.
fn host_ports(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut ports = BTreeSet::new();
    for c in containers(spec) {
        let mut valid = true;
        for port in c.ports {
            if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
                valid = false;
                ports.insert(host_port.to_string());
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    Some(Violation::new(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.into_iter().collect::<Vec<_>>().join(", ")
        ),
    ))
}

/// Upstream `hostProbesAndHostLifecycleV1Dot34`: a `host` in httpGet or tcpSocket probes and
/// lifecycle handlers. Containers and hosts are listed sorted and deduplicated.
fn host_probes_and_lifecycle(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    fn probe_hosts(p: Option<&Probe>) -> Vec<&str> {
        p.map(|p| {
            [p.http_get.as_ref().and_then(|a| a.host.as_deref()), p.tcp_socket.as_ref().and_then(|a| a.host.as_deref())]
                .into_iter()
                .flatten()
                .filter(|h| !h.is_empty())
                .collect()
        })
        .unwrap_or_default()
    }
    fn handler_hosts(h: Option<&LifecycleHandler>) -> Vec<&str> {
        h.map(|h| {
            [h.http_get.as_ref().and_then(|a| a.host.as_deref()), h.tcp_socket.as_ref().and_then(|a| a.host.as_deref())]
                .into_iter()
                .flatten()
                .filter(|h| !h.is_empty())
                .collect()
        })
        .unwrap_or_default()
    }
    let mut bad_containers = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for c in containers(spec) {
        let mut found = probe_hosts(c.liveness_probe);
        found.extend(probe_hosts(c.readiness_probe));
        found.extend(probe_hosts(c.startup_probe));
        if let Some(l) = c.lifecycle {
            found.extend(handler_hosts(l.post_start.as_ref()));
            found.extend(handler_hosts(l.pre_stop.as_ref()));
        }
        if !found.is_empty() {
            bad_containers.insert(c.name);
            hosts.extend(found);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let bad_containers: Vec<&str> = bad_containers.into_iter().collect();
    let hosts: Vec<&str> = hosts.into_iter().collect();
    Some(Violation::new(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize("probe or lifecycle host", "probe or lifecycle hosts", hosts.len()),
            join_quote(&hosts)
        ),
    ))
}

/// Upstream `privileged_1_0`.
fn privileged(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad: Vec<&str> = containers(spec)
        .filter(|c| c.security_context.and_then(|sc| sc.privileged) == Some(true))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    Some(Violation::new(
        "privileged",
        format!("{} must not set securityContext.privileged=true", containers_phrase(&bad)),
    ))
}

/// Upstream `procMount_1_0`: a procMount other than `Default` (the baseline check before v1.35 and
/// the restricted check from v1.35).
fn proc_mount(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut types = BTreeSet::new();
    for c in containers(spec) {
        if let Some(pm) = c.security_context.and_then(|sc| sc.proc_mount.as_ref())
            && pm != "Default"
        {
            bad_containers.push(c.name);
            types.insert(pm.clone());
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let types: Vec<String> = types.into_iter().collect();
    Some(Violation::new(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad_containers),
            join_quote(&types)
        ),
    ))
}

/// Upstream `procMount1_35baseline`: any procMount in a user namespace.
fn proc_mount_baseline_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) { None } else { proc_mount(meta, spec) }
}

const SELINUX_TYPES_1_0: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t"];
const SELINUX_TYPES_1_31: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];

fn se_linux_options_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    se_linux_options(spec, SELINUX_TYPES_1_0)
}

fn se_linux_options_1_31(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    se_linux_options(spec, SELINUX_TYPES_1_31)
}

/// Upstream `seLinuxOptions`: a type outside the allowed set, or any user or role.
fn se_linux_options(spec: &PodSpec, allowed_types: &[&str]) -> Option<Violation> {
    let mut bad_types = BTreeSet::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |opts: &k8s_openapi::api::core::v1::SELinuxOptions| {
        let mut ok = true;
        let ty = opts.type_.as_deref().unwrap_or("");
        if !allowed_types.contains(&ty) {
            ok = false;
            bad_types.insert(ty.to_string());
        }
        if !opts.user.as_deref().unwrap_or("").is_empty() {
            ok = false;
            set_user = true;
        }
        if !opts.role.as_deref().unwrap_or("").is_empty() {
            ok = false;
            set_role = true;
        }
        ok
    };
    let pod_bad = spec.security_context.as_ref().and_then(|sc| sc.se_linux_options.as_ref()).is_some_and(|o| !valid(o));
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(o) = c.security_context.and_then(|sc| sc.se_linux_options.as_ref())
            && !valid(o)
        {
            bad_containers.push(c.name);
        }
    }
    let bad_setters = setters(pod_bad, &bad_containers);
    if bad_setters.is_empty() {
        return None;
    }
    let mut bad_data = Vec::new();
    if !bad_types.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        bad_data.push(format!("{} {}", pluralize("type", "types", types.len()), join_quote(&types)));
    }
    if set_user {
        bad_data.push("user may not be set".to_string());
    }
    if set_role {
        bad_data.push("role may not be set".to_string());
    }
    Some(Violation::new(
        "seLinuxOptions",
        format!("{} set forbidden securityContext.seLinuxOptions: {}", bad_setters.join(" and "), bad_data.join("; ")),
    ))
}

const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

fn valid_seccomp_type(t: &str) -> bool {
    matches!(t, "RuntimeDefault" | "Localhost")
}

/// Upstream `seccompProfileBaseline_1_0`: the deprecated seccomp annotations, allowing
/// `runtime/default`, `docker/default` and `localhost/*`.
fn seccomp_profile_baseline_1_0(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let valid = |v: &str| v == "runtime/default" || v == "docker/default" || v.starts_with("localhost/");
    let annotations = meta.annotations.as_ref();
    let lookup = |key: &str| annotations.and_then(|a| a.get(key));
    let mut forbidden = BTreeSet::new();
    if let Some(val) = lookup(SECCOMP_POD_ANNOTATION).filter(|v| !valid(v)) {
        forbidden.insert(format!("{SECCOMP_POD_ANNOTATION}={}", go_quote(val)));
    }
    for c in containers(spec) {
        let key = format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}", c.name);
        if let Some(val) = lookup(&key).filter(|v| !valid(v)) {
            forbidden.insert(format!("{key}={}", go_quote(val)));
        }
    }
    if forbidden.is_empty() {
        return None;
    }
    Some(Violation::new(
        "seccompProfile",
        format!(
            "forbidden {} {}",
            pluralize("annotation", "annotations", forbidden.len()),
            forbidden.into_iter().collect::<Vec<_>>().join(", ")
        ),
    ))
}

/// Upstream `seccompProfileBaseline_1_19`: seccomp profile types other than `RuntimeDefault` and
/// `Localhost`.
fn seccomp_profile_baseline_1_19(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_values = BTreeSet::new();
    let pod_bad = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
        .filter(|p| !valid_seccomp_type(&p.type_))
        .map(|p| bad_values.insert(p.type_.clone()))
        .is_some();
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(p) = c.security_context.and_then(|sc| sc.seccomp_profile.as_ref())
            && !valid_seccomp_type(&p.type_)
        {
            bad_containers.push(c.name);
            bad_values.insert(p.type_.clone());
        }
    }
    let bad_setters = setters(pod_bad, &bad_containers);
    if bad_setters.is_empty() {
        return None;
    }
    let bad_values: Vec<String> = bad_values.into_iter().collect();
    Some(Violation::new(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            bad_setters.join(" and "),
            join_quote(&bad_values)
        ),
    ))
}

const SYSCTLS_1_0: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];
const SYSCTLS_1_27: &[&str] = &["net.ipv4.ip_local_reserved_ports"];
const SYSCTLS_1_29: &[&str] = &[
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];
const SYSCTLS_1_32: &[&str] = &["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"];
const SYSCTLS_1_37: &[&str] = &["net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"];

fn sysctls_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0])
}

fn sysctls_1_27(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27])
}

fn sysctls_1_29(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29])
}

fn sysctls_1_32(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29, SYSCTLS_1_32])
}

fn sysctls_1_37(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29, SYSCTLS_1_32, SYSCTLS_1_37])
}

/// Upstream `sysctls`: pod sysctls outside the safe set, in pod order.
fn sysctls(spec: &PodSpec, allowed: &[&[&str]]) -> Option<Violation> {
    let forbidden: Vec<&str> = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|s| s.name.as_str())
        .filter(|name| !allowed.iter().any(|set| set.contains(name)))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    Some(Violation::new("forbidden sysctls", forbidden.join(", ")))
}

/// Upstream `windowsHostProcess_1_0`.
fn windows_host_process(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad_containers: Vec<&str> = containers(spec)
        .filter(|c| {
            c.security_context.and_then(|sc| sc.windows_options.as_ref()).and_then(|w| w.host_process) == Some(true)
        })
        .map(|c| c.name)
        .collect();
    let pod_bad =
        spec.security_context.as_ref().and_then(|sc| sc.windows_options.as_ref()).and_then(|w| w.host_process)
            == Some(true);
    let bad_setters = setters(pod_bad, &bad_containers);
    if bad_setters.is_empty() {
        return None;
    }
    Some(Violation::new(
        "hostProcess",
        format!("{} must not set securityContext.windowsOptions.hostProcess=true", bad_setters.join(" and ")),
    ))
}

// ---------------------------------------------------------------------------------------------
// Restricted checks.

/// Upstream `allowPrivilegeEscalation_1_8`: every container must set it to false.
fn allow_privilege_escalation_1_8(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad: Vec<&str> = containers(spec)
        .filter(|c| c.security_context.and_then(|sc| sc.allow_privilege_escalation) != Some(false))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    Some(Violation::new(
        "allowPrivilegeEscalation != false",
        format!("{} must set securityContext.allowPrivilegeEscalation=false", containers_phrase(&bad)),
    ))
}

/// Upstream `allowPrivilegeEscalation_1_25`: Windows pods are exempt.
fn allow_privilege_escalation_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) { None } else { allow_privilege_escalation_1_8(meta, spec) }
}

/// Upstream `capabilitiesRestricted_1_22`: drop `ALL`, add nothing but `NET_BIND_SERVICE`.
fn capabilities_restricted_1_22(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut missing_drop_all = Vec::new();
    let mut adding_forbidden = Vec::new();
    let mut forbidden_caps = BTreeSet::new();
    for c in containers(spec) {
        let Some(caps) = c.security_context.and_then(|sc| sc.capabilities.as_ref()) else {
            missing_drop_all.push(c.name);
            continue;
        };
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            missing_drop_all.push(c.name);
        }
        let mut added_forbidden = false;
        for cap in caps.add.iter().flatten().filter(|a| *a != "NET_BIND_SERVICE") {
            added_forbidden = true;
            forbidden_caps.insert(cap.clone());
        }
        if added_forbidden {
            adding_forbidden.push(c.name);
        }
    }
    let mut details = Vec::new();
    if !missing_drop_all.is_empty() {
        details.push(format!(
            r#"{} must set securityContext.capabilities.drop=["ALL"]"#,
            containers_phrase(&missing_drop_all)
        ));
    }
    if !adding_forbidden.is_empty() {
        let caps: Vec<String> = forbidden_caps.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding_forbidden),
            join_quote(&caps)
        ));
    }
    if details.is_empty() {
        return None;
    }
    Some(Violation::new("unrestricted capabilities", details.join("; ")))
}

/// Upstream `capabilitiesRestricted_1_25`: Windows pods are exempt.
fn capabilities_restricted_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) { None } else { capabilities_restricted_1_22(meta, spec) }
}

/// Upstream `restrictedVolumes_1_0`: only configMap, csi, downwardAPI, emptyDir, ephemeral, image,
/// persistentVolumeClaim, projected and secret volumes.
fn restricted_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_volumes = Vec::new();
    let mut bad_types = BTreeSet::new();
    for vol in spec.volumes.iter().flatten() {
        let allowed = vol.config_map.is_some()
            || vol.csi.is_some()
            || vol.downward_api.is_some()
            || vol.empty_dir.is_some()
            || vol.ephemeral.is_some()
            || vol.image.is_some()
            || vol.persistent_volume_claim.is_some()
            || vol.projected.is_some()
            || vol.secret.is_some();
        if allowed {
            continue;
        }
        bad_volumes.push(vol.name.as_str());
        let kinds = [
            (vol.host_path.is_some(), "hostPath"),
            (vol.gce_persistent_disk.is_some(), "gcePersistentDisk"),
            (vol.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
            (vol.git_repo.is_some(), "gitRepo"),
            (vol.nfs.is_some(), "nfs"),
            (vol.iscsi.is_some(), "iscsi"),
            (vol.glusterfs.is_some(), "glusterfs"),
            (vol.rbd.is_some(), "rbd"),
            (vol.flex_volume.is_some(), "flexVolume"),
            (vol.cinder.is_some(), "cinder"),
            (vol.cephfs.is_some(), "cephfs"),
            (vol.flocker.is_some(), "flocker"),
            (vol.fc.is_some(), "fc"),
            (vol.azure_file.is_some(), "azureFile"),
            (vol.vsphere_volume.is_some(), "vsphereVolume"),
            (vol.quobyte.is_some(), "quobyte"),
            (vol.azure_disk.is_some(), "azureDisk"),
            (vol.photon_persistent_disk.is_some(), "photonPersistentDisk"),
            (vol.portworx_volume.is_some(), "portworxVolume"),
            (vol.scale_io.is_some(), "scaleIO"),
            (vol.storageos.is_some(), "storageos"),
        ];
        let kind = kinds.iter().find(|(set, _)| *set).map_or("unknown", |(_, name)| name);
        bad_types.insert(kind);
    }
    if bad_volumes.is_empty() {
        return None;
    }
    let bad_types: Vec<&str> = bad_types.into_iter().collect();
    Some(Violation::new(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad_volumes.len()),
            join_quote(&bad_volumes),
            pluralize("uses", "use", bad_volumes.len()),
            pluralize("restricted volume type", "restricted volume types", bad_types.len()),
            join_quote(&bad_types)
        ),
    ))
}

/// Upstream `runAsNonRoot1_0`: runAsNonRoot=true on the pod, or on every container that does not
/// inherit it.
fn run_as_non_root_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let pod_value = spec.security_context.as_ref().and_then(|sc| sc.run_as_non_root);
    let pod_bad = pod_value == Some(false);
    let pod_non_root = pod_value == Some(true);
    let mut explicitly_bad = Vec::new();
    let mut implicitly_bad = Vec::new();
    for c in containers(spec) {
        match c.security_context.and_then(|sc| sc.run_as_non_root) {
            Some(false) => explicitly_bad.push(c.name),
            Some(true) => {}
            None if !pod_non_root => implicitly_bad.push(c.name),
            None => {}
        }
    }
    let bad_setters = setters(pod_bad, &explicitly_bad);
    if !bad_setters.is_empty() {
        return Some(Violation::new(
            "runAsNonRoot != true",
            format!("{} must not set securityContext.runAsNonRoot=false", bad_setters.join(" and ")),
        ));
    }
    if !implicitly_bad.is_empty() {
        return Some(Violation::new(
            "runAsNonRoot != true",
            format!("pod or {} must set securityContext.runAsNonRoot=true", containers_phrase(&implicitly_bad)),
        ));
    }
    None
}

/// Upstream `runAsNonRoot1_35`: pods in a user namespace are exempt.
fn run_as_non_root_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) { None } else { run_as_non_root_1_0(meta, spec) }
}

/// Upstream `runAsUser1_23`: runAsUser=0 on the pod or a container.
fn run_as_user_1_23(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let pod_bad = spec.security_context.as_ref().and_then(|sc| sc.run_as_user) == Some(0);
    let bad_containers: Vec<&str> = containers(spec)
        .filter(|c| c.security_context.and_then(|sc| sc.run_as_user) == Some(0))
        .map(|c| c.name)
        .collect();
    let bad_setters = setters(pod_bad, &bad_containers);
    if bad_setters.is_empty() {
        return None;
    }
    Some(Violation::new("runAsUser=0", format!("{} must not set runAsUser=0", bad_setters.join(" and "))))
}

/// Upstream `runAsUser1_35`: pods in a user namespace are exempt.
fn run_as_user_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) { None } else { run_as_user_1_23(meta, spec) }
}

/// Upstream `seccompProfileRestricted_1_19`: `RuntimeDefault` or `Localhost` on the pod, or on
/// every container that does not inherit it.
fn seccomp_profile_restricted_1_19(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_values = BTreeSet::new();
    let pod_profile = spec.security_context.as_ref().and_then(|sc| sc.seccomp_profile.as_ref());
    let pod_bad =
        pod_profile.filter(|p| !valid_seccomp_type(&p.type_)).map(|p| bad_values.insert(p.type_.clone())).is_some();
    let pod_set = pod_profile.is_some() && !pod_bad;
    let mut explicitly_bad = Vec::new();
    let mut implicitly_bad = Vec::new();
    for c in containers(spec) {
        match c.security_context.and_then(|sc| sc.seccomp_profile.as_ref()) {
            Some(p) if !valid_seccomp_type(&p.type_) => {
                explicitly_bad.push(c.name);
                bad_values.insert(p.type_.clone());
            }
            Some(_) => {}
            None if !pod_set => implicitly_bad.push(c.name),
            None => {}
        }
    }
    let bad_setters = setters(pod_bad, &explicitly_bad);
    if !bad_setters.is_empty() {
        let bad_values: Vec<String> = bad_values.into_iter().collect();
        return Some(Violation::new(
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                bad_setters.join(" and "),
                join_quote(&bad_values)
            ),
        ));
    }
    if !implicitly_bad.is_empty() {
        return Some(Violation::new(
            "seccompProfile",
            format!(
                r#"pod or {} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
                containers_phrase(&implicitly_bad)
            ),
        ));
    }
    None
}

/// Upstream `seccompProfileRestricted_1_25`: Windows pods are exempt.
fn seccomp_profile_restricted_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) { None } else { seccomp_profile_restricted_1_19(meta, spec) }
}
