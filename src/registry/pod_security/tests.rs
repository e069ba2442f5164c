//! Unit tests of the Pod Security Standards: label parsing, the checks and their versions, the
//! messages and the admission decisions (upstream's `api`, `policy` and `admission` package tests).

use serde_json::{Value, json};

use super::checks::{CHECKS, join_quote};
use super::*;

fn spec(v: Value) -> PodSpec {
    serde_json::from_value(v).expect("pod spec")
}

fn meta(v: Value) -> ObjectMeta {
    serde_json::from_value(v).expect("object meta")
}

fn lv(s: &str) -> LevelVersion {
    let (level, version) = s.split_once(':').expect("level:version");
    LevelVersion { level: Level::parse(level).expect("level"), version: Version::parse(version).expect("version") }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn ids(level: &str) -> Vec<&'static str> {
    active_checks(&lv(level)).into_iter().map(|(id, _)| id).collect()
}

/// Runs the variant of check `id` that `level` selects; panics if that check does not run there.
fn run(id: &str, level: &str, meta: &ObjectMeta, spec: &PodSpec) -> Option<(String, String)> {
    let (_, check) = active_checks(&lv(level))
        .into_iter()
        .find(|(i, _)| *i == id)
        .unwrap_or_else(|| panic!("{id} does not run at {level}"));
    check(meta, spec).map(|v| (v.reason, v.detail))
}

fn container(name: &str, security_context: Value) -> Value {
    json!({"name": name, "image": "busybox", "securityContext": security_context})
}

struct Case {
    id: &'static str,
    level: &'static str,
    meta: Value,
    spec: Value,
    /// `None`: the check passes.
    expect: Option<(&'static str, &'static str)>,
}

fn case(id: &'static str, level: &'static str, spec: Value, expect: Option<(&'static str, &'static str)>) -> Case {
    Case { id, level, meta: json!({}), spec, expect }
}

fn run_cases(cases: Vec<Case>) {
    for (i, c) in cases.into_iter().enumerate() {
        let got = run(c.id, c.level, &meta(c.meta), &spec(c.spec));
        let want = c.expect.map(|(r, d)| (r.to_string(), d.to_string()));
        assert_eq!(got, want, "case {i} ({} at {})", c.id, c.level);
    }
}

#[test]
fn check_order_and_overrides_per_version() {
    let sorted_within_levels = CHECKS.windows(2).all(|w| w[0].level < w[1].level || w[0].id < w[1].id);
    assert!(sorted_within_levels, "CHECKS must be sorted by ID within each level");

    assert!(ids("privileged:latest").is_empty());
    assert_eq!(
        ids("baseline:latest"),
        [
            "appArmorProfile",
            "capabilities_baseline",
            "hostNamespaces",
            "hostPathVolumes",
            "hostPorts",
            "hostProbesAndHostLifecycle",
            "privileged",
            "procMount",
            "seLinuxOptions",
            "seccompProfile_baseline",
            "sysctls",
            "windowsHostProcess",
        ]
    );
    assert_eq!(
        ids("restricted:latest"),
        [
            "appArmorProfile",
            "hostNamespaces",
            "hostPorts",
            "hostProbesAndHostLifecycle",
            "privileged",
            "seLinuxOptions",
            "sysctls",
            "windowsHostProcess",
            "allowPrivilegeEscalation",
            "capabilities_restricted",
            "procMount_restricted",
            "restrictedVolumes",
            "runAsNonRoot",
            "runAsUser",
            "seccompProfile_restricted",
        ]
    );
    assert_eq!(
        ids("restricted:v1.0"),
        [
            "appArmorProfile",
            "capabilities_baseline",
            "hostNamespaces",
            "hostPorts",
            "privileged",
            "procMount",
            "seLinuxOptions",
            "seccompProfile_baseline",
            "sysctls",
            "windowsHostProcess",
            "restrictedVolumes",
            "runAsNonRoot",
        ]
    );
    assert_eq!(
        ids("restricted:v1.22"),
        [
            "appArmorProfile",
            "hostNamespaces",
            "hostPorts",
            "privileged",
            "procMount",
            "seLinuxOptions",
            "sysctls",
            "windowsHostProcess",
            "allowPrivilegeEscalation",
            "capabilities_restricted",
            "restrictedVolumes",
            "runAsNonRoot",
            "seccompProfile_restricted",
        ]
    );
    assert!(ids("restricted:v1.18").contains(&"seccompProfile_baseline"));
    assert!(!ids("restricted:v1.19").contains(&"seccompProfile_baseline"));
    assert!(!ids("baseline:v1.33").contains(&"hostProbesAndHostLifecycle"));
    assert!(ids("baseline:v1.34").contains(&"hostProbesAndHostLifecycle"));
    assert!(ids("restricted:v1.34").contains(&"procMount"));
    assert!(!ids("restricted:v1.34").contains(&"procMount_restricted"));
    assert_eq!(ids("restricted:v1.1000"), ids("restricted:latest"));
    assert_eq!(ids("baseline:v1.37"), ids("baseline:latest"));
}

#[test]
fn baseline_checks() {
    run_cases(vec![
        // hostNamespaces
        case(
            "hostNamespaces",
            "baseline:latest",
            json!({"hostNetwork": true, "hostPID": true, "hostIPC": true, "containers": [{"name": "a"}]}),
            Some(("host namespaces", "hostNetwork=true, hostPID=true, hostIPC=true")),
        ),
        case(
            "hostNamespaces",
            "baseline:latest",
            json!({"hostNetwork": false, "hostPID": false, "containers": [{"name": "a"}]}),
            None,
        ),
        // privileged
        case(
            "privileged",
            "baseline:latest",
            json!({"containers": [
                container("a", json!({})),
                container("b", json!({"privileged": false})),
                container("d", json!({"privileged": true})),
                container("e", json!({"privileged": true})),
            ]}),
            Some(("privileged", r#"containers "d", "e" must not set securityContext.privileged=true"#)),
        ),
        case(
            "privileged",
            "baseline:latest",
            json!({"initContainers": [container("i", json!({"privileged": true}))], "containers": [{"name": "a"}]}),
            Some(("privileged", r#"container "i" must not set securityContext.privileged=true"#)),
        ),
        case(
            "privileged",
            "baseline:latest",
            json!({"containers": [container("a", json!({"privileged": false}))]}),
            None,
        ),
        // capabilities_baseline
        case(
            "capabilities_baseline",
            "baseline:latest",
            json!({"containers": [
                container("a", json!({"capabilities": {"add": ["FOO", "BAR"]}})),
                container("b", json!({"capabilities": {"add": ["BAR", "BAZ"]}})),
            ]}),
            Some((
                "non-default capabilities",
                r#"containers "a", "b" must not include "BAR", "BAZ", "FOO" in securityContext.capabilities.add"#,
            )),
        ),
        case(
            "capabilities_baseline",
            "baseline:latest",
            json!({"containers": [container(
                "a",
                json!({"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE", "SYS_CHROOT"], "drop": ["ALL"]}}),
            )]}),
            None,
        ),
        // hostPathVolumes
        case(
            "hostPathVolumes",
            "baseline:latest",
            json!({"containers": [{"name": "c"}], "volumes": [
                {"name": "a", "hostPath": {"path": "/a"}},
                {"name": "ok", "emptyDir": {}},
                {"name": "b", "hostPath": {"path": "/b"}},
            ]}),
            Some(("hostPath volumes", r#"volumes "a", "b""#)),
        ),
        case(
            "hostPathVolumes",
            "baseline:latest",
            json!({"containers": [{"name": "c"}], "volumes": [{"name": "x", "hostPath": {"path": "/x"}}]}),
            Some(("hostPath volumes", r#"volume "x""#)),
        ),
        case(
            "hostPathVolumes",
            "baseline:latest",
            json!({"containers": [{"name": "c"}], "volumes": [{"name": "ok", "emptyDir": {}}]}),
            None,
        ),
        // hostPorts
        case(
            "hostPorts",
            "baseline:latest",
            json!({"containers": [
                {"name": "a", "ports": [{"containerPort": 10}]},
                {"name": "b", "ports": [{"containerPort": 20, "hostPort": 20}]},
            ]}),
            Some(("hostPort", r#"container "b" uses hostPort 20"#)),
        ),
        case(
            "hostPorts",
            "baseline:latest",
            json!({"containers": [
                {"name": "a", "ports": [{"containerPort": 10, "hostPort": 0}]},
                {"name": "b", "ports": [
                    {"containerPort": 10, "hostPort": 10},
                    {"containerPort": 20, "hostPort": 20},
                ]},
                {"name": "c", "ports": [{"containerPort": 30, "hostPort": 30}]},
            ]}),
            Some(("hostPort", r#"containers "b", "c" use hostPorts 10, 20, 30"#)),
        ),
        case(
            "hostPorts",
            "baseline:latest",
            json!({
                "initContainers": [{"name": "init", "ports": [{"containerPort": 8080, "hostPort": 8080}]}],
                "containers": [{"name": "a"}],
                "ephemeralContainers": [{"name": "debug", "ports": [{"containerPort": 443, "hostPort": 443}]}],
            }),
            Some(("hostPort", r#"containers "init", "debug" use hostPorts 443, 8080"#)),
        ),
        case(
            "hostPorts",
            "baseline:latest",
            json!({"containers": [{"name": "a", "ports": [
                {"containerPort": 100, "hostPort": 100},
                {"containerPort": 20, "hostPort": 20},
            ]}]}),
            Some(("hostPort", r#"container "a" uses hostPorts 100, 20"#)),
        ),
        case(
            "hostPorts",
            "baseline:latest",
            json!({"containers": [{"name": "a", "ports": [{"containerPort": 80}]}]}),
            None,
        ),
        // hostProbesAndHostLifecycle
        case(
            "hostProbesAndHostLifecycle",
            "baseline:latest",
            json!({"containers": [{
                "name": "a",
                "livenessProbe": {"httpGet": {"host": "127.0.0.1", "port": 80}},
                "readinessProbe": {"tcpSocket": {"host": "::1", "port": 80}},
                "lifecycle": {"postStart": {"httpGet": {"host": "localhost", "port": 80}}},
            }]}),
            Some((
                "probe or lifecycle host",
                r#"container "a" uses probe or lifecycle hosts "127.0.0.1", "::1", "localhost""#,
            )),
        ),
        case(
            "hostProbesAndHostLifecycle",
            "baseline:latest",
            json!({"containers": [
                {"name": "invalid2", "startupProbe": {"httpGet": {"host": "b.com", "port": 80}}},
                {"name": "valid", "livenessProbe": {"httpGet": {"host": "", "port": 80}}},
                {"name": "invalid1", "lifecycle": {"preStop": {"tcpSocket": {"host": "a.com", "port": 80}}}},
            ]}),
            Some((
                "probe or lifecycle host",
                r#"containers "invalid1", "invalid2" use probe or lifecycle hosts "a.com", "b.com""#,
            )),
        ),
        case(
            "hostProbesAndHostLifecycle",
            "baseline:latest",
            json!({
                "initContainers": [
                    {"name": "init", "livenessProbe": {"tcpSocket": {"host": "invalid.init.host", "port": 1}}},
                ],
                "containers": [{"name": "a"}],
            }),
            Some(("probe or lifecycle host", r#"container "init" uses probe or lifecycle host "invalid.init.host""#)),
        ),
        case(
            "hostProbesAndHostLifecycle",
            "baseline:latest",
            json!({"containers": [{"name": "a", "livenessProbe": {"httpGet": {"path": "/healthz", "port": 80}}}]}),
            None,
        ),
        // appArmorProfile
        case(
            "appArmorProfile",
            "baseline:latest",
            json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}]}),
            Some(("forbidden AppArmor profile", r#"pod must not set AppArmor profile type to "Unconfined""#)),
        ),
        case(
            "appArmorProfile",
            "baseline:latest",
            json!({
                "initContainers": [container("bar", json!({"appArmorProfile": {"type": "Unconfined"}}))],
                "containers": [container("foo", json!({"appArmorProfile": {"type": "RuntimeDefault"}}))],
            }),
            Some((
                "forbidden AppArmor profile",
                r#"container "bar" must not set AppArmor profile type to "Unconfined""#,
            )),
        ),
        case(
            "appArmorProfile",
            "baseline:latest",
            json!({
                "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    container("a", json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}})),
                ],
            }),
            None,
        ),
        // seLinuxOptions
        case(
            "seLinuxOptions",
            "baseline:latest",
            json!({
                "securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}},
                "containers": [
                    container("a", json!({"seLinuxOptions": {"type": "container_t"}})),
                    container("b", json!({"seLinuxOptions": {"type": "container_init_t"}})),
                    container("c", json!({"seLinuxOptions": {"type": "container_kvm_t"}})),
                    container("d", json!({"seLinuxOptions": {"type": "container_engine_t"}})),
                    container("e", json!({"seLinuxOptions": {"type": "bar"}})),
                    container("f", json!({"seLinuxOptions": {"user": "bar"}})),
                    container("g", json!({"seLinuxOptions": {"role": "baz"}})),
                ],
            }),
            Some((
                "seLinuxOptions",
                r#"pod and containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: types "bar", "foo"; user may not be set; role may not be set"#,
            )),
        ),
        case(
            "seLinuxOptions",
            "baseline:latest",
            json!({"securityContext": {"seLinuxOptions": {"type": "bad"}}, "containers": [{"name": "a"}]}),
            Some(("seLinuxOptions", r#"pod set forbidden securityContext.seLinuxOptions: type "bad""#)),
        ),
        case(
            "seLinuxOptions",
            "baseline:v1.30",
            json!({"containers": [container("d", json!({"seLinuxOptions": {"type": "container_engine_t"}}))]}),
            Some((
                "seLinuxOptions",
                r#"container "d" set forbidden securityContext.seLinuxOptions: type "container_engine_t""#,
            )),
        ),
        case(
            "seLinuxOptions",
            "baseline:latest",
            json!({
                "securityContext": {"seLinuxOptions": {"level": "s0:c1"}},
                "containers": [container("d", json!({"seLinuxOptions": {"type": "container_engine_t"}}))],
            }),
            None,
        ),
        // procMount
        case(
            "procMount",
            "baseline:latest",
            json!({"containers": [
                container("a", json!({})),
                container("b", json!({"procMount": "Default"})),
                container("d", json!({"procMount": "Unmasked"})),
                container("e", json!({"procMount": "other"})),
            ]}),
            Some(("procMount", r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#)),
        ),
        case(
            "procMount",
            "baseline:latest",
            json!({"hostUsers": false, "containers": [container("d", json!({"procMount": "Unmasked"}))]}),
            None,
        ),
        case(
            "procMount",
            "baseline:v1.34",
            json!({"hostUsers": false, "containers": [container("d", json!({"procMount": "Unmasked"}))]}),
            Some(("procMount", r#"container "d" must not set securityContext.procMount to "Unmasked""#)),
        ),
        // seccompProfile_baseline
        case(
            "seccompProfile_baseline",
            "baseline:latest",
            json!({
                "securityContext": {"seccompProfile": {"type": "Unconfined"}},
                "containers": [
                    container("a", json!({"seccompProfile": {"type": "RuntimeDefault"}})),
                    container("c", json!({"seccompProfile": {"type": "Unconfined"}})),
                    container("d", json!({"seccompProfile": {"type": "Unconfined"}})),
                ],
            }),
            Some((
                "seccompProfile",
                r#"pod and containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#,
            )),
        ),
        case(
            "seccompProfile_baseline",
            "baseline:latest",
            json!({"containers": [
                container("a", json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})),
                {"name": "b"},
            ]}),
            None,
        ),
        // sysctls
        case(
            "sysctls",
            "baseline:latest",
            json!({"securityContext": {"sysctls": [
                {"name": "a", "value": "1"},
                {"name": "kernel.shm_rmid_forced", "value": "0"},
                {"name": "b", "value": "1"},
            ]}, "containers": [{"name": "c"}]}),
            Some(("forbidden sysctls", "a, b")),
        ),
        case(
            "sysctls",
            "baseline:latest",
            json!({"securityContext": {"sysctls": [
                {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
                {"name": "net.ipv4.ip_local_reserved_ports", "value": "8080"},
                {"name": "net.ipv4.tcp_keepalive_time", "value": "60"},
                {"name": "net.ipv4.tcp_rmem", "value": "4096 87380 16777216"},
                {"name": "net.ipv4.tcp_slow_start_after_idle", "value": "0"},
                {"name": "net.ipv4.tcp_notsent_lowat", "value": "16384"},
            ]}, "containers": [{"name": "c"}]}),
            None,
        ),
        // windowsHostProcess
        case(
            "windowsHostProcess",
            "baseline:latest",
            json!({
                "securityContext": {"windowsOptions": {"hostProcess": true}},
                "containers": [
                    container("a", json!({"windowsOptions": {"hostProcess": true}})),
                    container("b", json!({"windowsOptions": {"hostProcess": false}})),
                ],
            }),
            Some((
                "hostProcess",
                r#"pod and container "a" must not set securityContext.windowsOptions.hostProcess=true"#,
            )),
        ),
        case(
            "windowsHostProcess",
            "baseline:latest",
            json!({"securityContext": {"windowsOptions": {"hostProcess": false}}, "containers": [{"name": "a"}]}),
            None,
        ),
    ]);
}

#[test]
fn annotation_checks() {
    let apparmor = Case {
        id: "appArmorProfile",
        level: "baseline:latest",
        meta: json!({"annotations": {
            "container.apparmor.security.beta.kubernetes.io/": "bogus",
            "container.apparmor.security.beta.kubernetes.io/a": "",
            "container.apparmor.security.beta.kubernetes.io/b": "runtime/default",
            "container.apparmor.security.beta.kubernetes.io/c": "localhost/",
            "container.apparmor.security.beta.kubernetes.io/d": "localhost/foo",
            "container.apparmor.security.beta.kubernetes.io/e": "unconfined",
            "container.apparmor.security.beta.kubernetes.io/f": "unknown",
        }}),
        spec: json!({"containers": [{"name": "a"}]}),
        expect: Some((
            "forbidden AppArmor profiles",
            concat!(
                r#"annotations must not set AppArmor profile type to "#,
                r#""container.apparmor.security.beta.kubernetes.io/="bogus"", "#,
                r#""container.apparmor.security.beta.kubernetes.io/e="unconfined"", "#,
                r#""container.apparmor.security.beta.kubernetes.io/f="unknown"""#,
            ),
        )),
    };
    let apparmor_mixed = Case {
        id: "appArmorProfile",
        level: "baseline:latest",
        meta: json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "unconfined"}}),
        spec: json!({"containers": [container("a", json!({"appArmorProfile": {"type": "Unconfined"}}))]}),
        expect: Some((
            "forbidden AppArmor profiles",
            r#"container "a" and annotation must not set AppArmor profile type to "Unconfined", "container.apparmor.security.beta.kubernetes.io/a="unconfined"""#,
        )),
    };
    let seccomp_annotations = Case {
        id: "seccompProfile_baseline",
        level: "baseline:v1.18",
        meta: json!({"annotations": {
            "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
            "container.seccomp.security.alpha.kubernetes.io/a": "unconfined",
            "container.seccomp.security.alpha.kubernetes.io/b": "unknown",
            "container.seccomp.security.alpha.kubernetes.io/c": "localhost/p.json",
            "container.seccomp.security.alpha.kubernetes.io/notacontainer": "unconfined",
        }}),
        spec: json!({"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}),
        expect: Some((
            "seccompProfile",
            concat!(
                r#"forbidden annotations container.seccomp.security.alpha.kubernetes.io/a="unconfined", "#,
                r#"container.seccomp.security.alpha.kubernetes.io/b="unknown", "#,
                r#"seccomp.security.alpha.kubernetes.io/pod="unconfined""#,
            ),
        )),
    };
    let seccomp_pod_annotation = Case {
        id: "seccompProfile_baseline",
        level: "restricted:v1.18",
        meta: json!({"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}),
        spec: json!({"containers": [{"name": "a"}]}),
        expect: Some((
            "seccompProfile",
            r#"forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined""#,
        )),
    };
    let seccomp_annotations_ok = Case {
        id: "seccompProfile_baseline",
        level: "baseline:v1.18",
        meta: json!({"annotations": {
            "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
            "container.seccomp.security.alpha.kubernetes.io/a": "docker/default",
        }}),
        spec: json!({"containers": [container("a", json!({"seccompProfile": {"type": "Unconfined"}}))]}),
        expect: None,
    };
    run_cases(vec![apparmor, apparmor_mixed, seccomp_annotations, seccomp_pod_annotation, seccomp_annotations_ok]);
}

#[test]
fn sysctls_by_version() {
    let with = |name: &str| {
        let sysctls = json!([{"name": name, "value": "1"}]);
        json!({"securityContext": {"sysctls": sysctls}, "containers": [{"name": "c"}]})
    };
    let detail = |name: &'static str| Some(("forbidden sysctls", name));
    run_cases(vec![
        case(
            "sysctls",
            "baseline:v1.26",
            with("net.ipv4.ip_local_reserved_ports"),
            detail("net.ipv4.ip_local_reserved_ports"),
        ),
        case("sysctls", "baseline:v1.27", with("net.ipv4.ip_local_reserved_ports"), None),
        case("sysctls", "baseline:v1.28", with("net.ipv4.tcp_fin_timeout"), detail("net.ipv4.tcp_fin_timeout")),
        case("sysctls", "baseline:v1.29", with("net.ipv4.tcp_fin_timeout"), None),
        case("sysctls", "baseline:v1.31", with("net.ipv4.tcp_wmem"), detail("net.ipv4.tcp_wmem")),
        case("sysctls", "baseline:v1.32", with("net.ipv4.tcp_wmem"), None),
        case("sysctls", "baseline:v1.36", with("net.ipv4.tcp_notsent_lowat"), detail("net.ipv4.tcp_notsent_lowat")),
        case("sysctls", "baseline:v1.37", with("net.ipv4.tcp_notsent_lowat"), None),
        case("sysctls", "restricted:latest", with("net.ipv4.tcp_slow_start_after_idle"), None),
        case("sysctls", "baseline:latest", with("kernel.msgmax"), detail("kernel.msgmax")),
    ]);
}

#[test]
fn restricted_checks() {
    let windows = |c: Value| json!({"os": {"name": "windows"}, "containers": [c]});
    run_cases(vec![
        // restrictedVolumes
        case(
            "restrictedVolumes",
            "restricted:latest",
            json!({"containers": [{"name": "c"}], "volumes": [
                {"name": "a1", "emptyDir": {}},
                {"name": "a2", "secret": {}},
                {"name": "a3", "persistentVolumeClaim": {"claimName": "x"}},
                {"name": "a4", "downwardAPI": {}},
                {"name": "a5", "configMap": {}},
                {"name": "a6", "projected": {}},
                {"name": "a7", "csi": {"driver": "d"}},
                {"name": "a8", "ephemeral": {}},
                {"name": "a9", "image": {}},
                {"name": "b1", "hostPath": {"path": "/"}},
                {"name": "b4", "gitRepo": {"repository": "r"}},
                {"name": "b5", "nfs": {"server": "s", "path": "/"}},
                {"name": "c1"},
            ]}),
            Some((
                "restricted volume types",
                r#"volumes "b1", "b4", "b5", "c1" use restricted volume types "gitRepo", "hostPath", "nfs", "unknown""#,
            )),
        ),
        case(
            "restrictedVolumes",
            "restricted:latest",
            json!({"containers": [{"name": "c"}], "volumes": [{"name": "b1", "hostPath": {"path": "/"}}]}),
            Some(("restricted volume types", r#"volume "b1" uses restricted volume type "hostPath""#)),
        ),
        case(
            "restrictedVolumes",
            "restricted:latest",
            json!({"containers": [{"name": "c"}], "volumes": [
                {"name": "a", "emptyDir": {}},
                {"name": "b", "configMap": {"name": "x"}},
            ]}),
            None,
        ),
        // allowPrivilegeEscalation
        case(
            "allowPrivilegeEscalation",
            "restricted:latest",
            json!({"containers": [
                container("a", json!({})),
                container("b", json!({"allowPrivilegeEscalation": true})),
                container("c", json!({"allowPrivilegeEscalation": null})),
                container("d", json!({"allowPrivilegeEscalation": false})),
            ]}),
            Some((
                "allowPrivilegeEscalation != false",
                r#"containers "a", "b", "c" must set securityContext.allowPrivilegeEscalation=false"#,
            )),
        ),
        case("allowPrivilegeEscalation", "restricted:latest", windows(json!({"name": "a"})), None),
        case(
            "allowPrivilegeEscalation",
            "restricted:v1.24",
            windows(json!({"name": "a"})),
            Some((
                "allowPrivilegeEscalation != false",
                r#"container "a" must set securityContext.allowPrivilegeEscalation=false"#,
            )),
        ),
        // capabilities_restricted
        case(
            "capabilities_restricted",
            "restricted:latest",
            json!({"containers": [
                container("a", json!({"capabilities": {"add": ["FOO", "BAR"]}})),
                container("b", json!({"capabilities": {"add": ["BAR", "BAZ"]}})),
                container(
                    "c",
                    json!({"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL", "FOO"]}}),
                ),
            ]}),
            Some((
                "unrestricted capabilities",
                r#"containers "a", "b" must set securityContext.capabilities.drop=["ALL"]; containers "a", "b", "c" must not include "BAR", "BAZ", "CHOWN", "FOO" in securityContext.capabilities.add"#,
            )),
        ),
        case(
            "capabilities_restricted",
            "restricted:latest",
            json!({"containers": [{"name": "a"}]}),
            Some(("unrestricted capabilities", r#"container "a" must set securityContext.capabilities.drop=["ALL"]"#)),
        ),
        case(
            "capabilities_restricted",
            "restricted:latest",
            json!({"containers": [
                container("a", json!({"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}})),
            ]}),
            None,
        ),
        case("capabilities_restricted", "restricted:latest", windows(json!({"name": "a"})), None),
        // procMount_restricted
        case(
            "procMount_restricted",
            "restricted:latest",
            json!({"hostUsers": false, "containers": [
                container("d", json!({"procMount": "Unmasked"})),
                container("e", json!({"procMount": "other"})),
            ]}),
            Some(("procMount", r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#)),
        ),
        case(
            "procMount_restricted",
            "restricted:latest",
            json!({"containers": [container("d", json!({"procMount": "Default"}))]}),
            None,
        ),
        // runAsNonRoot
        case(
            "runAsNonRoot",
            "restricted:latest",
            json!({"containers": [{"name": "a"}]}),
            Some(("runAsNonRoot != true", r#"pod or container "a" must set securityContext.runAsNonRoot=true"#)),
        ),
        case(
            "runAsNonRoot",
            "restricted:latest",
            json!({
                "securityContext": {"runAsNonRoot": false},
                "containers": [container("a", json!({"runAsNonRoot": true}))],
            }),
            Some(("runAsNonRoot != true", "pod must not set securityContext.runAsNonRoot=false")),
        ),
        case(
            "runAsNonRoot",
            "restricted:latest",
            json!({"securityContext": {"runAsNonRoot": true}, "containers": [
                {"name": "a"},
                container("b", json!({"runAsNonRoot": true})),
                container("c", json!({"runAsNonRoot": false})),
                container("d", json!({"runAsNonRoot": false})),
            ]}),
            Some(("runAsNonRoot != true", r#"containers "c", "d" must not set securityContext.runAsNonRoot=false"#)),
        ),
        case(
            "runAsNonRoot",
            "restricted:latest",
            json!({"containers": [{"name": "a"}, {"name": "b"}, container("c", json!({"runAsNonRoot": true}))]}),
            Some(("runAsNonRoot != true", r#"pod or containers "a", "b" must set securityContext.runAsNonRoot=true"#)),
        ),
        case("runAsNonRoot", "restricted:latest", json!({"hostUsers": false, "containers": [{"name": "a"}]}), None),
        case(
            "runAsNonRoot",
            "restricted:v1.34",
            json!({"hostUsers": false, "containers": [{"name": "a"}]}),
            Some(("runAsNonRoot != true", r#"pod or container "a" must set securityContext.runAsNonRoot=true"#)),
        ),
        case(
            "runAsNonRoot",
            "restricted:latest",
            json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a"}]}),
            None,
        ),
        // runAsUser
        case(
            "runAsUser",
            "restricted:latest",
            json!({"securityContext": {"runAsUser": 0}, "containers": [{"name": "a"}]}),
            Some(("runAsUser=0", "pod must not set runAsUser=0")),
        ),
        case(
            "runAsUser",
            "restricted:latest",
            json!({"securityContext": {"runAsUser": 1000}, "containers": [
                container("a", json!({"runAsUser": 1})),
                container("c", json!({"runAsUser": 0})),
                container("d", json!({"runAsUser": 0})),
            ]}),
            Some(("runAsUser=0", r#"containers "c", "d" must not set runAsUser=0"#)),
        ),
        case(
            "runAsUser",
            "restricted:latest",
            json!({"securityContext": {"runAsUser": 0}, "containers": [container("c", json!({"runAsUser": 0}))]}),
            Some(("runAsUser=0", r#"pod and container "c" must not set runAsUser=0"#)),
        ),
        case(
            "runAsUser",
            "restricted:latest",
            json!({"hostUsers": false, "securityContext": {"runAsUser": 0}, "containers": [{"name": "a"}]}),
            None,
        ),
        case("runAsUser", "restricted:latest", json!({"containers": [{"name": "a"}]}), None),
        // seccompProfile_restricted
        case(
            "seccompProfile_restricted",
            "restricted:latest",
            json!({"containers": [{"name": "a"}]}),
            Some((
                "seccompProfile",
                r#"pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            )),
        ),
        case("seccompProfile_restricted", "restricted:latest", windows(json!({"name": "a"})), None),
        case(
            "seccompProfile_restricted",
            "restricted:latest",
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}]}),
            Some(("seccompProfile", r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#)),
        ),
        case(
            "seccompProfile_restricted",
            "restricted:latest",
            json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}, "containers": [
                {"name": "a"},
                container("c", json!({"seccompProfile": {"type": "Unconfined"}})),
                container("d", json!({"seccompProfile": {"type": "Unconfined"}})),
            ]}),
            Some((
                "seccompProfile",
                r#"containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#,
            )),
        ),
        case(
            "seccompProfile_restricted",
            "restricted:latest",
            json!({"containers": [
                {"name": "a"},
                {"name": "b"},
                container("c", json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p"}})),
            ]}),
            Some((
                "seccompProfile",
                r#"pod or containers "a", "b" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            )),
        ),
        case(
            "seccompProfile_restricted",
            "restricted:latest",
            json!({
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "a"}],
            }),
            None,
        ),
    ]);
}

fn busybox() -> PodSpec {
    spec(json!({"containers": [{"name": "c", "image": "busybox"}]}))
}

fn privileged_pod() -> PodSpec {
    spec(json!({
        "hostNetwork": true,
        "containers": [{
            "name": "c",
            "image": "busybox",
            "ports": [{"containerPort": 80, "hostPort": 80}],
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
        }],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    }))
}

fn restricted_pod() -> PodSpec {
    spec(json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "c",
            "image": "busybox",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        }],
    }))
}

#[test]
fn full_messages() {
    let m = ObjectMeta::default();
    let baseline = lv("baseline:latest");
    let violations = evaluate(&baseline, &m, &privileged_pod());
    assert_eq!(
        forbidden_message(&baseline, &violations),
        concat!(
            r#"violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), "#,
            r#"hostPath volumes (volume "host"), hostPort (container "c" uses hostPort 80), "#,
            r#"privileged (container "c" must not set securityContext.privileged=true)"#,
        )
    );

    let restricted = lv("restricted:latest");
    let violations = evaluate(&restricted, &m, &busybox());
    assert_eq!(
        forbidden_message(&restricted, &violations),
        concat!(
            r#"violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false "#,
            r#"(container "c" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities "#,
            r#"(container "c" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true "#,
            r#"(pod or container "c" must set securityContext.runAsNonRoot=true), seccompProfile "#,
            r#"(pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
        )
    );
    assert!(warning_message(&restricted, &violations).starts_with(
        r#"would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "c" must"#
    ));
    assert_eq!(
        forbidden_reason(&violations),
        "allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile"
    );

    let violations = evaluate(&restricted, &m, &privileged_pod());
    assert_eq!(
        forbidden_reason(&violations),
        concat!(
            "host namespaces, hostPort, privileged, allowPrivilegeEscalation != false, unrestricted capabilities, ",
            "restricted volume types, runAsNonRoot != true, seccompProfile"
        )
    );

    // Versions past the newest policy evaluate as it, but keep their name.
    let future = lv("restricted:v1.99");
    assert_eq!(evaluate(&future, &m, &busybox()), evaluate(&restricted, &m, &busybox()));
    assert!(forbidden_message(&future, &violations).starts_with(r#"violates PodSecurity "restricted:v1.99": "#));

    assert!(evaluate(&lv("privileged:latest"), &m, &privileged_pod()).is_empty());
    assert!(evaluate(&baseline, &m, &busybox()).is_empty());
    assert!(evaluate(&restricted, &m, &restricted_pod()).is_empty());
    // Before v1.8 restricted had none of allowPrivilegeEscalation, capabilities, runAsUser, seccomp.
    let v1_0 = evaluate(&lv("restricted:v1.0"), &m, &busybox());
    assert_eq!(forbidden_reason(&v1_0), "runAsNonRoot != true");

    let unknown = [Violation::new("", "x"), Violation::new("r", "")];
    assert_eq!(forbidden_detail(&unknown), "unknown forbidden reason (x), r");
}

#[test]
fn pod_decisions() {
    let m = ObjectMeta::default();
    let policy =
        Policy { enforce: lv("baseline:latest"), audit: lv("restricted:v1.30"), warn: lv("restricted:latest") };
    let decision = evaluate_pod(&policy, &m, &busybox(), true);
    assert_eq!(decision.forbidden, None);
    assert_eq!(decision.warnings.len(), 1);
    assert!(
        decision.warnings[0].starts_with(r#"would violate PodSecurity "restricted:latest": allowPrivilegeEscalation"#)
    );
    assert!(
        decision
            .audit_violations
            .as_deref()
            .is_some_and(|a| a.starts_with(r#"would violate PodSecurity "restricted:v1.30": "#))
    );

    let decision = evaluate_pod(&policy, &m, &privileged_pod(), true);
    assert!(
        decision.forbidden.as_deref().is_some_and(|f| f.starts_with(r#"violates PodSecurity "baseline:latest": host"#))
    );
    assert!(decision.warnings.is_empty());

    let decision = evaluate_pod(&policy, &m, &privileged_pod(), false);
    assert_eq!(decision.forbidden, None);
    assert_eq!(decision.warnings.len(), 1);

    assert_eq!(evaluate_pod(&Policy::default(), &m, &privileged_pod(), true), PodDecision::default());

    assert!(is_ignored_pod_subresource("status"));
    assert!(is_ignored_pod_subresource("exec"));
    assert!(!is_ignored_pod_subresource("ephemeralcontainers"));
    assert!(!is_ignored_pod_subresource(""));
}

#[test]
fn versions_and_levels() {
    for (input, want) in [
        ("latest", Some(Version::Latest)),
        ("v1.0", Some(Version::V1(0))),
        ("v1.25", Some(Version::V1(25))),
        ("v1.100", Some(Version::V1(100))),
        ("v1.9223372036854775807", Some(Version::V1(9_223_372_036_854_775_807))),
        ("v1.9223372036854775808", None),
        ("v1.025", None),
        ("v1.", None),
        ("v1", None),
        ("1.25", None),
        ("v2.0", None),
        ("v1.x", None),
        ("v1.-1", None),
        ("v1.+1", None),
        ("Latest", None),
        ("", None),
        (" v1.25", None),
    ] {
        assert_eq!(Version::parse(input).ok(), want, "{input:?}");
    }
    assert_eq!(Version::parse("v1.2x"), Err(r#"must be "latest" or "v1.x""#));
    assert_eq!(Version::V1(25).to_string(), "v1.25");
    assert!(Version::V1(1000) < Version::Latest);
    assert!(Version::V1(9) < Version::V1(10));

    assert_eq!(Level::parse("baseline"), Ok(Level::Baseline));
    assert_eq!(Level::parse("Baseline"), Err("must be one of privileged, baseline, restricted"));
    assert!(Level::Privileged < Level::Baseline && Level::Baseline < Level::Restricted);
    assert_eq!(lv("restricted:v1.25").to_string(), "restricted:v1.25");
}

#[test]
fn policy_from_labels() {
    let (policy, errs) = Policy::from_labels(None);
    assert_eq!((policy, errs.len()), (Policy::default(), 0));
    assert!(policy.fully_privileged());

    let all = labels(&[
        (ENFORCE_LEVEL_LABEL, "baseline"),
        (ENFORCE_VERSION_LABEL, "v1.25"),
        (AUDIT_LEVEL_LABEL, "restricted"),
        (AUDIT_VERSION_LABEL, "latest"),
        (WARN_LEVEL_LABEL, "restricted"),
        (WARN_VERSION_LABEL, "v1.30"),
        ("unrelated", "x"),
    ]);
    let (policy, errs) = Policy::from_labels(Some(&all));
    assert!(errs.is_empty());
    assert_eq!(
        policy,
        Policy { enforce: lv("baseline:v1.25"), audit: lv("restricted:latest"), warn: lv("restricted:v1.30") }
    );

    // Warn follows an explicit, stricter enforce level (and its version unless warn-version is set).
    let (policy, _) = Policy::from_labels(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "restricted")])));
    assert_eq!((policy.warn, policy.audit), (lv("restricted:latest"), lv("privileged:latest")));
    let (policy, _) =
        Policy::from_labels(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "baseline"), (ENFORCE_VERSION_LABEL, "v1.20")])));
    assert_eq!(policy.warn, lv("baseline:v1.20"));
    let (policy, _) =
        Policy::from_labels(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "baseline"), (WARN_VERSION_LABEL, "v1.22")])));
    assert_eq!(policy.warn, lv("baseline:v1.22"));
    let (policy, _) =
        Policy::from_labels(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "restricted"), (WARN_LEVEL_LABEL, "baseline")])));
    assert_eq!(policy.warn, lv("baseline:latest"));
    let (policy, _) = Policy::from_labels(Some(&labels(&[(ENFORCE_VERSION_LABEL, "v1.20")])));
    assert_eq!(policy.warn, lv("privileged:latest"));
    let defaults = Policy { warn: lv("restricted:latest"), ..Policy::default() };
    let (policy, _) = policy_to_evaluate(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "baseline")])), &defaults);
    assert_eq!(policy.warn, lv("restricted:latest"));

    // Invalid values: enforce fails closed, audit and warn fail open, versions become latest.
    let (policy, errs) = Policy::from_labels(Some(&labels(&[(ENFORCE_LEVEL_LABEL, "foo")])));
    assert_eq!(policy.enforce, lv("restricted:latest"));
    assert_eq!(policy.warn, lv("privileged:latest"));
    assert_eq!(
        errs,
        [LabelError {
            field: "metadata.labels[pod-security.kubernetes.io/enforce]".into(),
            value: "foo".into(),
            detail: "must be one of privileged, baseline, restricted".into(),
        }]
    );
    assert_eq!(
        errs[0].to_string(),
        r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "foo": must be one of privileged, baseline, restricted"#
    );

    let bad = labels(&[
        (ENFORCE_LEVEL_LABEL, "baseline"),
        (ENFORCE_VERSION_LABEL, "v1.x"),
        (AUDIT_LEVEL_LABEL, "strict"),
        (AUDIT_VERSION_LABEL, "1.2"),
        (WARN_LEVEL_LABEL, ""),
        (WARN_VERSION_LABEL, "v1.20"),
    ]);
    let (policy, errs) = Policy::from_labels(Some(&bad));
    assert_eq!(
        policy,
        Policy { enforce: lv("baseline:latest"), audit: lv("privileged:latest"), warn: lv("privileged:v1.20") }
    );
    let rendered: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        [
            r#"metadata.labels[pod-security.kubernetes.io/enforce-version]: Invalid value: "v1.x": must be "latest" or "v1.x""#,
            r#"metadata.labels[pod-security.kubernetes.io/audit]: Invalid value: "strict": must be one of privileged, baseline, restricted"#,
            r#"metadata.labels[pod-security.kubernetes.io/audit-version]: Invalid value: "1.2": must be "latest" or "v1.x""#,
            r#"metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: "": must be one of privileged, baseline, restricted"#,
        ]
    );
    let field: FieldError = errs[0].clone().into();
    assert_eq!(field.field, "metadata.labels[pod-security.kubernetes.io/enforce-version]");
    assert_eq!(field.detail, r#"Invalid value: "v1.x": must be "latest" or "v1.x""#);
}

#[test]
fn namespace_checks() {
    let l = |pairs: &[(&str, &str)]| labels(pairs);
    let restricted_v1_0 = l(&[(ENFORCE_LEVEL_LABEL, "restricted"), (ENFORCE_VERSION_LABEL, "v1.0")]);

    assert_eq!(check_namespace_create(None), NamespaceCheck::Allowed);
    assert_eq!(check_namespace_create(Some(&restricted_v1_0)), NamespaceCheck::Allowed);
    let NamespaceCheck::Invalid(errs) = check_namespace_create(Some(&l(&[(ENFORCE_LEVEL_LABEL, "foo")]))) else {
        panic!("expected invalid");
    };
    assert_eq!(errs[0].detail, "must be one of privileged, baseline, restricted");

    let update = |old: &[(&str, &str)], new: &[(&str, &str)]| check_namespace_update(Some(&l(old)), Some(&l(new)));
    let r10 = [(ENFORCE_LEVEL_LABEL, "restricted"), (ENFORCE_VERSION_LABEL, "v1.0")];
    assert_eq!(update(&r10, &r10), NamespaceCheck::Allowed);
    let unknown = [(ENFORCE_LEVEL_LABEL, "unknown")];
    assert_eq!(update(&unknown, &unknown), NamespaceCheck::Allowed);
    let bad_version = [(ENFORCE_LEVEL_LABEL, "baseline"), (ENFORCE_VERSION_LABEL, "unknown")];
    assert_eq!(update(&bad_version, &bad_version), NamespaceCheck::Allowed);
    assert_eq!(
        update(&r10, &[(ENFORCE_LEVEL_LABEL, "baseline"), (ENFORCE_VERSION_LABEL, "v1.0")]),
        NamespaceCheck::Allowed
    );
    assert_eq!(
        update(&[(ENFORCE_LEVEL_LABEL, "restricted")], &[(ENFORCE_LEVEL_LABEL, "baseline")]),
        NamespaceCheck::Allowed
    );
    assert_eq!(update(&r10, &[(ENFORCE_LEVEL_LABEL, "privileged")]), NamespaceCheck::Allowed);
    assert_eq!(update(&r10, &[]), NamespaceCheck::Allowed);
    assert!(matches!(update(&r10, &unknown), NamespaceCheck::Invalid(_)));
    assert!(matches!(
        update(&r10, &[(ENFORCE_LEVEL_LABEL, "privileged"), (ENFORCE_VERSION_LABEL, "unknown")]),
        NamespaceCheck::Invalid(_)
    ));
    assert!(matches!(update(&unknown, &[(ENFORCE_LEVEL_LABEL, "bogus")]), NamespaceCheck::Invalid(_)));
    assert_eq!(
        update(&[(ENFORCE_LEVEL_LABEL, "baseline")], &[(ENFORCE_LEVEL_LABEL, "restricted")]),
        NamespaceCheck::CheckPods(lv("restricted:latest"))
    );
    assert_eq!(update(&r10, &[(ENFORCE_LEVEL_LABEL, "baseline")]), NamespaceCheck::CheckPods(lv("baseline:latest")));
    assert_eq!(check_namespace_update(None, Some(&restricted_v1_0)), NamespaceCheck::CheckPods(lv("restricted:v1.0")));
}

fn pod(name: &str, controller: Option<&str>, spec: Value) -> Pod {
    let mut meta = json!({"name": name, "namespace": "test"});
    if let Some(uid) = controller {
        meta["ownerReferences"] = json!([
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "not-a-controller"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true},
        ]);
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec})).expect("pod")
}

#[test]
fn existing_pod_warnings() {
    let host_network = || json!({"hostNetwork": true, "containers": [{"name": "c"}]});
    let privileged = || json!({"containers": [{"name": "c", "securityContext": {"privileged": true}}]});
    let host_path = || json!({"containers": [{"name": "c"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]});
    let both = || json!({"hostNetwork": true, "containers": [{"name": "c", "securityContext": {"privileged": true}}]});
    let pods = vec![
        pod("replicaset1pod1", Some("1"), host_network()),
        pod("replicaset1pod2", Some("1"), host_network()),
        pod("replicaset1pod3", Some("1"), host_network()),
        pod("replicaset2pod1", Some("2"), privileged()),
        pod("replicaset2pod2", Some("2"), privileged()),
        pod("uniquepod1", None, host_path()),
        pod("uniquepod2", None, both()),
    ];
    let baseline = lv("baseline:latest");
    assert_eq!(
        existing_pods_warnings("test", &baseline, &pods, 4),
        [
            "new PodSecurity enforce level only checked against the first 4 of 7 existing pods",
            r#"existing pods in namespace "test" violate the new PodSecurity enforce level "baseline:latest""#,
            "replicaset1pod1: host namespaces",
            "replicaset2pod1: privileged",
            "uniquepod1: hostPath volumes",
            "uniquepod2: host namespaces, privileged",
        ]
    );
    assert_eq!(
        existing_pods_warnings("test", &baseline, &pods, NAMESPACE_MAX_PODS_TO_CHECK),
        [
            r#"existing pods in namespace "test" violate the new PodSecurity enforce level "baseline:latest""#,
            "replicaset1pod1 (and 2 other pods): host namespaces",
            "replicaset2pod1 (and 1 other pod): privileged",
            "uniquepod1: hostPath volumes",
            "uniquepod2: host namespaces, privileged",
        ]
    );

    let pods = vec![
        pod("zeta", None, json!({"containers": [{"name": "c", "image": "busybox"}]})),
        pod("alpha", None, json!({"containers": [{"name": "c", "image": "busybox"}]})),
        pod("fine", None, serde_json::to_value(restricted_pod()).expect("spec")),
    ];
    assert_eq!(
        existing_pods_warnings("ns", &lv("restricted:latest"), &pods, NAMESPACE_MAX_PODS_TO_CHECK),
        [
            r#"existing pods in namespace "ns" violate the new PodSecurity enforce level "restricted:latest""#,
            concat!(
                "alpha (and 1 other pod): allowPrivilegeEscalation != false, unrestricted capabilities, ",
                "runAsNonRoot != true, seccompProfile"
            ),
        ]
    );
    assert!(existing_pods_warnings("ns", &baseline, &pods, NAMESPACE_MAX_PODS_TO_CHECK).is_empty());
    assert!(existing_pods_warnings("ns", &baseline, &[], NAMESPACE_MAX_PODS_TO_CHECK).is_empty());
}

#[test]
fn significant_pod_updates() {
    let base = json!({
        "initContainers": [{"name": "i", "image": "init:1"}],
        "containers": [{"name": "c", "image": "app:1"}],
        "ephemeralContainers": [{"name": "e", "image": "debug:1"}],
    });
    let old = spec(base.clone());
    let changed = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        is_significant_pod_update(&spec(v), &old)
    };
    assert!(!changed(&|_| {}));
    assert!(!changed(&|v| v["activeDeadlineSeconds"] = json!(30)));
    assert!(!changed(&|v| v["containers"][0]["securityContext"] = json!({"privileged": true})));
    assert!(!changed(&|v| v["ephemeralContainers"] = json!([])));
    assert!(changed(&|v| v["containers"][0]["image"] = json!("app:2")));
    assert!(changed(&|v| v["initContainers"][0]["image"] = json!("init:2")));
    assert!(changed(&|v| v["initContainers"] = json!([])));
    assert!(changed(&|v| v["containers"] = json!([{"name": "c", "image": "app:1"}, {"name": "d"}])));
    assert!(changed(&|v| v["ephemeralContainers"][0]["image"] = json!("debug:2")));
    assert!(changed(&|v| v["ephemeralContainers"] = json!([{"name": "e", "image": "debug:1"}, {"name": "f"}])));
}

#[test]
fn go_quoting() {
    assert_eq!(go_quote("plain"), r#""plain""#);
    assert_eq!(go_quote("a\"b\\c\nd\te\u{1}f\u{85}g é"), r#""a\"b\\c\nd\te\x01f\u0085g é""#);
    assert_eq!(join_quote::<&str>(&[]), "");
    assert_eq!(join_quote(&["a", "b"]), r#""a", "b""#);
}
