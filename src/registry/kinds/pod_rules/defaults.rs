//! Defaulting of pods and pod specs (`pkg/apis/core/v1/defaults.go`, the mutating admission
//! plugins and the pod strategy's create preparation).

use super::*;

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

    // The API's Priority admission (`registry/admission.rs`) has set the priority of a pod made
    // through it; a static pod read from a file gets that of a system class, or 0.
    let priority = match opt(&spec.priority_class_name) {
        "" => Some(0),
        class => super::super::scheduling::system_class_value(class),
    };
    if let Some(priority) = priority {
        spec.priority.get_or_insert(priority);
    }
    set_default(&mut spec.preemption_policy, "PreemptLowerPriority");

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

pub(super) fn default_probe(p: &mut Probe) {
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

pub(super) fn default_lifecycle(l: &mut Lifecycle) {
    for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
        if let Some(g) = &mut h.http_get {
            default_http_get(g);
        }
    }
}

pub(super) fn default_http_get(g: &mut HTTPGetAction) {
    set_default(&mut g.path, "/");
    set_default(&mut g.scheme, "HTTP");
}

/// Names of the volume sources set on a volume, in upstream's checking order. The names are the
/// field-path segments upstream reports (`downwarAPI` is spelled that way in its error path).
pub(super) fn volume_sources(v: &Volume) -> Vec<&'static str> {
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

pub(super) fn default_volume(v: &mut Volume) {
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

pub(super) fn default_downward_file(f: &mut DownwardAPIVolumeFile) {
    if let Some(r) = &mut f.field_ref {
        set_default(&mut r.api_version, "v1");
    }
    if let Some(d) = f.resource_field_ref.as_mut().and_then(|r| r.divisor.as_mut()) {
        canonicalize(d);
    }
}

/// Pod-level requests default to pod-level limits for resources no container requests.
pub(super) fn default_pod_level_requests(res: &mut ResourceRequirements, containers: &[Container], init: &[Container]) {
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
pub(super) fn add_default_tolerations(spec: &mut PodSpec) {
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
pub(super) fn expand_match_label_keys(spec: &mut PodSpec, labels: &BTreeMap<String, String>) {
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
