//! Pods: defaulting, validation, status subresource, graceful deletion and the `kubectl get pods` table.

use chrono::Utc;
use k8s_openapi::api::core::v1::{ContainerState, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::pod_rules;
use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge, merge_retain, primitive};
use crate::registry::strategy::{
    AGE_COLUMN, Column, DeleteContext, Deletion, Kind, NAME_COLUMN, ResourceInfo, age_cell, field_at, human_duration,
    name_cell,
};
use crate::registry::timestamp;
use crate::registry::validation::ErrorList;

pub struct Pods;

/// Strategic-merge list keys of a pod, as upstream's struct tags declare them.
const POD_MERGE_KEYS: &[MergeKey] = &pod_spec_merge_keys!(
    "spec.",
    merge("status.conditions", "type"),
    merge("status.podIPs", "ip"),
    merge("status.hostIPs", "ip"),
);

impl Kind for Pods {
    type Obj = Pod;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        singular: "pod",
        namespaced: true,
        short_names: &["po"],
        categories: &["all"],
        subresources: &[
            Subresource::Status,
            Subresource::Binding,
            Subresource::Eviction,
            Subresource::Log,
            Subresource::Exec,
            Subresource::Attach,
            Subresource::PortForward,
            Subresource::EphemeralContainers,
        ],
        storage: "pods",
        return_deleted_object: true,
    };
    const GENERATION: bool = true;
    const MERGE_KEYS: &'static [MergeKey] = POD_MERGE_KEYS;
    const FIELDS: &'static [&'static str] = &[
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ];

    fn prepare_create(&self, pod: &mut Pod) {
        pod_rules::default_pod(pod);
        let conditions = pod.status.as_mut().and_then(|s| s.conditions.as_mut());
        for c in conditions.into_iter().flatten() {
            c.last_transition_time.get_or_insert(Time(now()));
        }
    }

    fn validate(&self, pod: &Pod) -> ErrorList {
        pod_rules::validate_pod(pod)
    }

    fn prepare_update(&self, new: &mut Pod, old: &Pod) {
        if let Some(spec) = new.spec.as_mut() {
            pod_rules::default_pod_spec(spec);
        }
        new.status = old.status.clone();
    }

    fn validate_update(&self, new: &Pod, old: &Pod) -> ErrorList {
        pod_rules::validate_pod_update(new, old)
    }

    fn prepare_status_update(&self, new: &mut Pod, old: &Pod) {
        new.spec = old.spec.clone();
    }

    /// `ephemeralcontainers`: the stored pod with the new ephemeral containers (upstream's
    /// `dropNonEphemeralContainerUpdates`), defaulted.
    fn prepare_subresource_update(&self, _sub: Subresource, new: &mut Pod, old: &Pod) {
        let ephemeral = new.spec.as_mut().and_then(|s| s.ephemeral_containers.take());
        let mut kept = old.clone();
        kept.metadata.resource_version = new.metadata.resource_version.take();
        if let Some(spec) = kept.spec.as_mut() {
            spec.ephemeral_containers = ephemeral;
            pod_rules::default_pod_spec(spec);
        }
        *new = kept;
    }

    fn validate_subresource_update(&self, _sub: Subresource, new: &Pod, old: &Pod) -> ErrorList {
        pod_rules::validate_ephemeral_containers_update(new, old)
    }

    fn field(&self, pod: &Value, field: &str) -> Option<String> {
        Some(match field {
            "spec.hostNetwork" => pod["spec"].get("hostNetwork").and_then(Value::as_bool).unwrap_or(false).to_string(),
            "status.podIPs" => field_at(&pod["status"]["podIPs"][0], "ip"),
            other => field_at(pod, other),
        })
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
            Column::new("Status", "string", "The aggregate status of the containers in this pod."),
            Column::new(
                "Restarts",
                "string",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            AGE_COLUMN,
            Column::new("IP", "string", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.").wide(),
            Column::new("Node", "string", "NodeName is a request to schedule this pod onto a specific node. If it is non-empty, the scheduler simply schedules this pod onto that node, assuming that it fits resource requirements.").wide(),
            Column::new("Nominated Node", "string", "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.").wide(),
            Column::new("Readiness Gates", "string", "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates").wide(),
        ]
    }

    fn cells(&self, pod: &Pod) -> Vec<Value> {
        let row = print_pod(pod);
        let (spec, status) = (pod.spec.as_ref(), pod.status.as_ref());
        let or_none = |s: Option<&str>| json!(s.filter(|s| !s.is_empty()).unwrap_or("<none>"));
        let ip = status.and_then(|s| s.pod_ips.as_ref()).and_then(|ips| ips.first()).map(|ip| ip.ip.as_str());
        let gates = spec.and_then(|s| s.readiness_gates.as_ref()).filter(|g| !g.is_empty()).map(|gates| {
            let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
            let ok = gates
                .iter()
                .filter(|g| conditions.iter().any(|c| c.type_ == g.condition_type && c.status == "True"))
                .count();
            format!("{ok}/{}", gates.len())
        });
        vec![
            name_cell(&pod.metadata),
            json!(row.ready),
            json!(row.reason),
            json!(row.restarts),
            age_cell(&pod.metadata),
            or_none(ip),
            or_none(spec.and_then(|s| s.node_name.as_deref())),
            or_none(status.and_then(|s| s.nominated_node_name.as_deref())),
            or_none(gates.as_deref()),
        ]
    }

    fn deletion(&self, pod: &Pod, ctx: &DeleteContext<'_>) -> Deletion {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
        // Unscheduled, finished, or on a node that no longer exists: nobody would finish a graceful delete.
        if node.is_empty() || phase == "Succeeded" || phase == "Failed" || !(ctx.node_exists)(&node) {
            return Deletion::Immediate;
        }
        let spec_grace = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
        match ctx.requested_grace.unwrap_or(spec_grace) {
            g if g <= 0 => Deletion::Immediate,
            g => Deletion::Graceful(g),
        }
    }
}

/// Now, at the second precision of Kubernetes times.
fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_second(Utc::now().timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// Sets (or updates) a pod condition on a pod in JSON form, moving `lastTransitionTime` only when the
/// status changes.
pub fn set_condition(pod: &mut Value, type_: &str, status: &str, reason: Option<&str>, message: Option<&str>) {
    if !pod.get("status").is_some_and(Value::is_object) {
        pod["status"] = json!({});
    }
    let conditions = &mut pod["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else { return };
    let mut cond =
        json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": timestamp(Utc::now())});
    if let Some(r) = reason {
        cond["reason"] = json!(r);
    }
    if let Some(m) = message {
        cond["message"] = json!(m);
    }
    match list.iter_mut().find(|c| c["type"] == type_) {
        Some(existing) => {
            if existing["status"] == status {
                cond["lastTransitionTime"] = existing["lastTransitionTime"].clone();
            }
            *existing = cond;
        }
        None => list.push(cond),
    }
}

/// The READY, STATUS and RESTARTS cells of `kubectl get pods`.
struct PodRow {
    ready: String,
    reason: String,
    restarts: String,
}

/// Upstream's `printPod`, step for step.
fn print_pod(pod: &Pod) -> PodRow {
    let (no_spec, no_status) = (PodSpec::default(), PodStatus::default());
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let status = pod.status.as_ref().unwrap_or(&no_status);
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    let is_sidecar =
        |name: &str| init_specs.iter().any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"));
    let total =
        spec.containers.len() + init_specs.iter().filter(|c| c.restart_policy.as_deref() == Some("Always")).count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart: Option<i64> = None;
    let mut last_sidecar_restart: Option<i64> = None;
    let mut reason = status.reason.clone().filter(|r| !r.is_empty()).or(status.phase.clone()).unwrap_or_default();
    let conditions = status.conditions.as_deref().unwrap_or_default();
    if conditions.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated")) {
        reason = "SchedulingGated".into();
    }
    let terminated_at = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
        c.last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0.as_second())
    };
    let mut initializing = false;
    let init_statuses = status.init_container_statuses.as_deref().unwrap_or_default();
    for (i, c) in init_statuses.iter().enumerate() {
        restarts += c.restart_count;
        if let Some(t) = terminated_at(c) {
            last_restart = last_restart.max(Some(t));
        }
        let sidecar = is_sidecar(&c.name);
        if sidecar {
            sidecar_restarts += c.restart_count;
            if let Some(t) = terminated_at(c) {
                last_sidecar_restart = last_sidecar_restart.max(Some(t));
            }
        }
        let no_state = ContainerState::default();
        let state = c.state.as_ref().unwrap_or(&no_state);
        match (&state.terminated, &state.waiting) {
            (Some(t), _) if t.exit_code == 0 => continue,
            _ if sidecar && c.started == Some(true) => {
                if c.ready {
                    ready += 1;
                }
                continue;
            }
            (Some(t), _) => {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => format!("Init:{r}"),
                    None if t.signal.unwrap_or(0) != 0 => format!("Init:Signal:{}", t.signal.unwrap_or(0)),
                    None => format!("Init:ExitCode:{}", t.exit_code),
                };
            }
            (None, Some(w)) if w.reason.as_deref().is_some_and(|r| !r.is_empty() && r != "PodInitializing") => {
                reason = format!("Init:{}", w.reason.clone().unwrap_or_default());
            }
            _ => reason = format!("Init:{i}/{}", init_specs.len()),
        }
        initializing = true;
        break;
    }
    let initialized = conditions.iter().any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for c in status.container_statuses.as_deref().unwrap_or_default().iter().rev() {
            restarts += c.restart_count;
            if let Some(t) = terminated_at(c) {
                last_restart = last_restart.max(Some(t));
            }
            let no_state = ContainerState::default();
            let state = c.state.as_ref().unwrap_or(&no_state);
            if let Some(r) = state.waiting.as_ref().and_then(|w| w.reason.clone()).filter(|r| !r.is_empty()) {
                reason = r;
            } else if let Some(t) = &state.terminated {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None if t.signal.unwrap_or(0) != 0 => format!("Signal:{}", t.signal.unwrap_or(0)),
                    None => format!("ExitCode:{}", t.exit_code),
                };
            } else if c.ready && state.running.is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let ready_cond = conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            reason = if ready_cond { "Running".into() } else { "NotReady".into() };
        }
    }
    let phase = status.phase.as_deref().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }
    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration(Utc::now().timestamp() - t)),
        _ => restarts.to_string(),
    };
    PodRow { ready: format!("{ready}/{total}"), reason, restarts: restarts_cell }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).expect("valid pod")
    }

    #[test]
    fn pending_pod_row() {
        let p = pod(
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Pending"}}),
        );
        let row = print_pod(&p);
        assert_eq!((row.ready.as_str(), row.reason.as_str(), row.restarts.as_str()), ("0/1", "Pending", "0"));
    }

    #[test]
    fn running_ready_and_waiting_reasons() {
        let p = pod(json!({
            "metadata": {"name": "a"},
            "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
                {"name": "b", "image": "i", "imageID": "", "ready": false, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ]}
        }));
        let row = print_pod(&p);
        assert_eq!(row.ready, "1/2");
        assert_eq!(row.reason, "CrashLoopBackOff");
        assert_eq!(row.restarts, "3");
    }

    #[test]
    fn init_progress_and_terminating() {
        let p = pod(json!({
            "metadata": {"name": "a", "deletionTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"initContainers": [{"name": "i", "image": "i"}], "containers": [{"name": "a", "image": "i"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}
            ]}
        }));
        assert_eq!(print_pod(&p).reason, "Terminating");
        let mut p2 = p.clone();
        p2.metadata.deletion_timestamp = None;
        assert_eq!(print_pod(&p2).reason, "Init:0/1");
    }

    #[test]
    fn scheduling_gated() {
        let mut p = pod(
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": "g"}]}}),
        );
        Pods.prepare_create(&mut p);
        assert_eq!(print_pod(&p).reason, "SchedulingGated");
    }

    #[test]
    fn condition_transition_time_moves_only_on_change() {
        let mut p = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}});
        set_condition(&mut p, "PodScheduled", "True", None, None);
        assert_eq!(p["status"]["conditions"][0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        set_condition(&mut p, "PodScheduled", "False", Some("Unschedulable"), None);
        assert_ne!(p["status"]["conditions"][0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert_eq!(p["status"]["conditions"][0]["reason"], "Unschedulable");
    }
}
