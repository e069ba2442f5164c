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
    assert_eq!(keys(not_ready), [(NOT_READY_TAINT.to_string(), Some(60)), (UNREACHABLE_TAINT.to_string(), Some(300))]);
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
    assert_error(&p, "spec.containers[0].ports[1].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive");
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
    let spec =
        |port: Value| json!({"hostNetwork": true, "containers": [{"name": "app", "image": "nginx", "ports": [port]}]});
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
    assert!(errs.iter().any(|e| {
        e.starts_with(&format!("{env}[5].valueFrom.secretKeyRef.key: Invalid value: \"bad key\": a valid config key"))
    }));
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
    assert_error(&p, &format!("{path}.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"));
    let p = res(json!({"requests": {"memory": "-1Gi"}}));
    assert_error(&p, &format!("{path}.requests[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0"));
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
    assert_error(&p, &format!("{path}.requests: Invalid value: \"1\": must be equal to example.com/gpu limit of 2"));
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
        errs.iter().any(|e| { e.starts_with("spec.nodeSelector: Invalid value: \"bad key\": name part must consist") })
    );
    assert!(
        errs.iter().any(|e| e.starts_with("spec.hostname: Invalid value: \"Bad_Host\": a lowercase RFC 1123 label"))
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
    assert_error(&p, "spec.securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive");
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
    assert_forbidden_change(&errs, "- spec.containers[0].command[1]: \"1\"\n+ spec.containers[0].command[1]: \"2\"");
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
        s.tolerations.as_mut().unwrap().push(Toleration { operator: Some("Exists".into()), ..Toleration::default() });
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
        ["spec.activeDeadlineSeconds: Invalid value: \"null\": must not update from a positive integer to nil value"]
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
    assert_forbidden_change(&errs, "- spec.terminationGracePeriodSeconds: 30\n+ spec.terminationGracePeriodSeconds: 1");
}

#[test]
fn update_validates_the_new_pod() {
    let errs = update(&running(), |s| s.containers[0].image = Some("nginx ".into()));
    let expected = "spec.containers[0].image: Invalid value: \"nginx \": must not have leading or trailing whitespace";
    assert_eq!(errs, [expected; 2]);
}

#[test]
fn ephemeral_containers_are_added_but_never_changed_or_removed() {
    let old = running();
    let debugged = |ec: Value| {
        let mut p = old.clone();
        spec_mut(&mut p).ephemeral_containers = Some(vec![serde_json::from_value(ec).unwrap()]);
        default_pod_spec(spec_mut(&mut p));
        p
    };
    let debug = json!({"name": "debug", "image": "busybox", "targetContainerName": "app"});
    let added = debugged(debug.clone());
    assert_eq!(messages(&validate_ephemeral_containers_update(&added, &old)), Vec::<String>::new());
    let changed = debugged(json!({"name": "debug", "image": "busybox:2", "targetContainerName": "app"}));
    let errs = messages(&validate_ephemeral_containers_update(&changed, &added));
    assert!(
        errs.iter().any(|e| e.starts_with(
            "spec.ephemeralContainers[debug]: Forbidden: existing ephemeral containers \"debug\" may not be changed"
        )),
        "{errs:?}"
    );
    let errs = messages(&validate_ephemeral_containers_update(&old, &added));
    assert!(
        errs.iter().any(|e| e.starts_with(
            "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debug\" may not be removed"
        )),
        "{errs:?}"
    );
    let busy = debugged(json!({"name": "debug", "image": "busybox", "ports": [{"containerPort": 80}],
        "readinessProbe": {"exec": {"command": ["true"]}}, "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "x"}]}));
    let errs = messages(&validate_ephemeral_containers_update(&busy, &old));
    for field in ["ports", "readinessProbe", "volumeMounts[0].subPath"] {
        let expected =
            format!("spec.ephemeralContainers[0].{field}: Forbidden: cannot be set for an Ephemeral Container");
        assert!(errs.contains(&expected), "{expected}: {errs:?}");
    }
    let clash = debugged(json!({"name": "app", "image": "busybox"}));
    let errs = messages(&validate_ephemeral_containers_update(&clash, &old));
    assert!(errs.contains(&"spec.ephemeralContainers[0].name: Duplicate value: \"app\"".to_string()), "{errs:?}");
}
