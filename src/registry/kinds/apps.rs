//! `apps/v1`: Deployments, ReplicaSets, StatefulSets, DaemonSets and ControllerRevisions, with
//! upstream's defaults (`pkg/apis/apps/v1/defaults.go`), validation (`pkg/apis/apps/validation`),
//! status and scale subresources and `kubectl get` columns (`pkg/printers/internalversion`).

use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStrategy, ReplicaSet, ReplicaSetSpec, RollingUpdateDaemonSet, RollingUpdateDeployment,
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use serde_json::{Value, json};

use super::workload_rules::{
    default_template, int_or_percent_value, non_negative, selector_immutable, validate_int_or_percent,
    validate_selector, validate_template_for_controller, wide_cells, wide_columns,
};
use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge, merge_retain, primitive};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

/// `deprecated.daemonset.template.generation`: counts a DaemonSet's template changes.
pub const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

pub struct Deployments;
pub struct ReplicaSets;
pub struct StatefulSets;
pub struct DaemonSets;
pub struct ControllerRevisions;

const SCALABLE: &[Subresource] = &[Subresource::Status, Subresource::Scale];

/// The template's pod-spec lists, and the status conditions, merged by key (`kubectl set env`).
const TEMPLATE_MERGE_KEYS: &[MergeKey] =
    &pod_spec_merge_keys!("spec.template.spec.", merge("status.conditions", "type"));

/// An `apps/v1` resource stored under `<plural>.apps`.
const fn info(
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short: &'static [&'static str],
    storage: &'static str,
    scale: bool,
) -> ResourceInfo {
    ResourceInfo {
        group: "apps",
        version: "v1",
        kind,
        plural,
        singular,
        namespaced: true,
        short_names: short,
        categories: &["all"],
        subresources: if scale { SCALABLE } else { &[Subresource::Status] },
        storage,
        return_deleted_object: false,
    }
}

fn percent(p: &str) -> Option<IntOrString> {
    Some(IntOrString::String(p.to_string()))
}

fn count(v: Option<i32>) -> Value {
    json!(v.unwrap_or(0))
}

const READY: Column = Column::new("Ready", "string", "Number of the pod with ready state");
const AVAILABLE: Column = Column::new(
    "Available",
    "string",
    "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
);

impl Kind for Deployments {
    const MERGE_KEYS: &'static [MergeKey] = TEMPLATE_MERGE_KEYS;
    type Obj = Deployment;
    const INFO: ResourceInfo = info("Deployment", "deployments", "deployment", &["deploy"], "deployments.apps", true);
    const GENERATION: bool = true;
    // The revision annotation is written with the status, as the deployment controller does.
    const STATUS_WRITES_ANNOTATIONS: bool = true;

    fn prepare_create(&self, d: &mut Deployment) {
        d.status = None;
        default_deployment(&mut d.spec);
    }

    fn prepare_update(&self, new: &mut Deployment, old: &Deployment) {
        new.status = old.status.clone();
        default_deployment(&mut new.spec);
        // Annotations are copied to the ReplicaSets: a change is a new generation, as upstream.
        if new.metadata.annotations != old.metadata.annotations && new.spec == old.spec {
            new.metadata.generation = Some(old.metadata.generation.unwrap_or(0) + 1);
        }
    }

    fn prepare_status_update(&self, new: &mut Deployment, old: &Deployment) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, d: &Deployment) -> ErrorList {
        let mut out = Vec::new();
        let spec = d.spec.clone();
        non_negative(spec.replicas.map(i64::from), "spec.replicas", &mut out);
        validate_selector(Some(&spec.selector), "deployment", &mut out);
        validate_template_for_controller(&spec.template, Some(&spec.selector), "ReplicaSet", "spec.template", &mut out);
        validate_strategy(spec.strategy.as_ref(), &mut out);
        let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
        non_negative(Some(min_ready), "spec.minReadySeconds", &mut out);
        non_negative(spec.revision_history_limit.map(i64::from), "spec.revisionHistoryLimit", &mut out);
        if let Some(p) = spec.progress_deadline_seconds {
            non_negative(Some(i64::from(p)), "spec.progressDeadlineSeconds", &mut out);
            if i64::from(p) <= min_ready {
                out.push(FieldError::invalid(
                    "spec.progressDeadlineSeconds",
                    p,
                    "must be greater than minReadySeconds",
                ));
            }
        }
        out
    }

    fn validate_update(&self, new: &Deployment, old: &Deployment) -> ErrorList {
        let mut out = self.validate(new);
        selector_immutable(Some(&new.spec.selector), Some(&old.spec.selector), &mut out);
        out
    }

    fn validate_status_update(&self, new: &Deployment, _old: &Deployment) -> ErrorList {
        let mut out = Vec::new();
        if let Some(s) = &new.status {
            for (field, v) in [
                ("replicas", s.replicas),
                ("updatedReplicas", s.updated_replicas),
                ("readyReplicas", s.ready_replicas),
                ("availableReplicas", s.available_replicas),
                ("unavailableReplicas", s.unavailable_replicas),
                ("collisionCount", s.collision_count),
            ] {
                non_negative(v.map(i64::from), &format!("status.{field}"), &mut out);
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![
            NAME_COLUMN,
            READY,
            Column::new(
                "Up-to-date",
                "string",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            AVAILABLE,
            AGE_COLUMN,
        ];
        cols.extend(wide_columns(true));
        cols
    }

    fn cells(&self, d: &Deployment) -> Vec<Value> {
        let status = d.status.clone().unwrap_or_default();
        let spec = Some(&d.spec);
        let desired = spec.and_then(|s| s.replicas).unwrap_or(0);
        let mut cells = vec![
            name_cell(&d.metadata),
            json!(format!("{}/{desired}", status.ready_replicas.unwrap_or(0))),
            count(status.updated_replicas),
            count(status.available_replicas),
            age_cell(&d.metadata),
        ];
        cells.extend(wide_cells(spec.map(|s| &s.template), Some(spec.map(|s| &s.selector))));
        cells
    }
}

/// `SetDefaults_Deployment`.
fn default_deployment(spec: &mut DeploymentSpec) {
    spec.replicas.get_or_insert(1);
    let strategy = spec.strategy.get_or_insert_with(DeploymentStrategy::default);
    let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".to_string());
    if kind == "RollingUpdate" {
        let ru = strategy.rolling_update.get_or_insert_with(RollingUpdateDeployment::default);
        if ru.max_unavailable.is_none() {
            ru.max_unavailable = percent("25%");
        }
        if ru.max_surge.is_none() {
            ru.max_surge = percent("25%");
        }
    }
    spec.revision_history_limit.get_or_insert(10);
    spec.progress_deadline_seconds.get_or_insert(600);
    default_template(&mut spec.template);
}

/// `ValidateDeploymentStrategy` and `ValidateRollingUpdateDeployment`.
fn validate_strategy(strategy: Option<&DeploymentStrategy>, out: &mut ErrorList) {
    let Some(s) = strategy else { return };
    match s.type_.as_deref().unwrap_or_default() {
        "Recreate" => {
            if s.rolling_update.is_some() {
                out.push(FieldError::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => match &s.rolling_update {
            None => out
                .push(FieldError::required("spec.strategy.rollingUpdate", "this should be defaulted and never be nil")),
            Some(ru) => {
                let (unavailable, surge) = (ru.max_unavailable.as_ref(), ru.max_surge.as_ref());
                validate_int_or_percent(unavailable, "spec.strategy.rollingUpdate.maxUnavailable", true, out);
                validate_int_or_percent(surge, "spec.strategy.rollingUpdate.maxSurge", false, out);
                if int_or_percent_value(unavailable) == 0 && int_or_percent_value(surge) == 0 {
                    out.push(FieldError::invalid_raw(
                        "spec.strategy.rollingUpdate.maxUnavailable",
                        int_or_percent_text(unavailable),
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
            }
        },
        other => out.push(FieldError::not_supported("spec.strategy.type", other, &["Recreate", "RollingUpdate"])),
    }
}

fn int_or_percent_text(v: Option<&IntOrString>) -> String {
    match v {
        Some(IntOrString::Int(i)) => i.to_string(),
        Some(IntOrString::String(s)) => format!("{s:?}"),
        None => "null".into(),
    }
}

impl Kind for ReplicaSets {
    const MERGE_KEYS: &'static [MergeKey] = TEMPLATE_MERGE_KEYS;
    type Obj = ReplicaSet;
    const INFO: ResourceInfo = info("ReplicaSet", "replicasets", "replicaset", &["rs"], "replicasets.apps", true);
    const GENERATION: bool = true;

    fn prepare_create(&self, rs: &mut ReplicaSet) {
        rs.status = None;
        default_replica_set(&mut rs.spec);
    }

    fn prepare_update(&self, new: &mut ReplicaSet, old: &ReplicaSet) {
        new.status = old.status.clone();
        default_replica_set(&mut new.spec);
    }

    fn prepare_status_update(&self, new: &mut ReplicaSet, old: &ReplicaSet) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, rs: &ReplicaSet) -> ErrorList {
        let mut out = Vec::new();
        let spec = rs.spec.clone();
        non_negative(spec.replicas.map(i64::from), "spec.replicas", &mut out);
        non_negative(spec.min_ready_seconds.map(i64::from), "spec.minReadySeconds", &mut out);
        // Upstream's message names deployments here too.
        validate_selector(Some(&spec.selector), "deployment", &mut out);
        match &spec.template {
            Some(t) => {
                validate_template_for_controller(t, Some(&spec.selector), "ReplicaSet", "spec.template", &mut out)
            }
            None => out.push(FieldError::required("spec.template", "")),
        }
        out
    }

    fn validate_update(&self, new: &ReplicaSet, old: &ReplicaSet) -> ErrorList {
        let mut out = self.validate(new);
        selector_immutable(Some(&new.spec.selector), Some(&old.spec.selector), &mut out);
        out
    }

    fn validate_status_update(&self, new: &ReplicaSet, _old: &ReplicaSet) -> ErrorList {
        let mut out = Vec::new();
        let Some(s) = &new.status else { return out };
        let replicas = s.replicas;
        non_negative(Some(i64::from(replicas)), "status.replicas", &mut out);
        for (field, v) in [
            ("fullyLabeledReplicas", s.fully_labeled_replicas),
            ("readyReplicas", s.ready_replicas),
            ("availableReplicas", s.available_replicas),
        ] {
            let path = format!("status.{field}");
            non_negative(v.map(i64::from), &path, &mut out);
            if v.unwrap_or(0) > replicas {
                out.push(FieldError::invalid_raw(path, v.unwrap_or(0), "cannot be greater than status.replicas"));
            }
        }
        if s.available_replicas.unwrap_or(0) > s.ready_replicas.unwrap_or(0) {
            out.push(FieldError::invalid_raw(
                "status.availableReplicas",
                s.available_replicas.unwrap_or(0),
                "cannot be greater than readyReplicas",
            ));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![
            NAME_COLUMN,
            Column::new("Desired", "integer", "Number of desired pods."),
            Column::new("Current", "integer", "Number of actual pods."),
            Column::new("Ready", "integer", "Number of ready pods."),
            AGE_COLUMN,
        ];
        cols.extend(wide_columns(true));
        cols
    }

    fn cells(&self, rs: &ReplicaSet) -> Vec<Value> {
        let status = rs.status.clone().unwrap_or_default();
        let spec = Some(&rs.spec);
        let mut cells = vec![
            name_cell(&rs.metadata),
            count(spec.and_then(|s| s.replicas)),
            json!(status.replicas),
            count(status.ready_replicas),
            age_cell(&rs.metadata),
        ];
        cells.extend(wide_cells(spec.and_then(|s| s.template.as_ref()), Some(spec.map(|s| &s.selector))));
        cells
    }
}

fn default_replica_set(spec: &mut ReplicaSetSpec) {
    spec.replicas.get_or_insert(1);
    if let Some(t) = &mut spec.template {
        default_template(t);
    }
}

impl Kind for StatefulSets {
    const MERGE_KEYS: &'static [MergeKey] = TEMPLATE_MERGE_KEYS;
    type Obj = StatefulSet;
    const INFO: ResourceInfo = info("StatefulSet", "statefulsets", "statefulset", &["sts"], "statefulsets.apps", true);
    const GENERATION: bool = true;

    fn prepare_create(&self, sts: &mut StatefulSet) {
        sts.status = None;
        default_stateful_set(&mut sts.spec);
    }

    fn prepare_update(&self, new: &mut StatefulSet, old: &StatefulSet) {
        new.status = old.status.clone();
        default_stateful_set(&mut new.spec);
    }

    fn prepare_status_update(&self, new: &mut StatefulSet, old: &StatefulSet) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, sts: &StatefulSet) -> ErrorList {
        let mut out = Vec::new();
        let spec = sts.spec.clone();
        match spec.pod_management_policy.as_deref().unwrap_or_default() {
            "OrderedReady" | "Parallel" => {}
            other => {
                out.push(FieldError::not_supported("spec.podManagementPolicy", other, &["OrderedReady", "Parallel"]))
            }
        }
        let strategy = spec.update_strategy.clone().unwrap_or_default();
        match strategy.type_.as_deref().unwrap_or_default() {
            "RollingUpdate" => {
                if let Some(ru) = &strategy.rolling_update {
                    non_negative(ru.partition.map(i64::from), "spec.updateStrategy.rollingUpdate.partition", &mut out);
                    validate_int_or_percent(
                        ru.max_unavailable.as_ref(),
                        "spec.updateStrategy.rollingUpdate.maxUnavailable",
                        true,
                        &mut out,
                    );
                }
            }
            "OnDelete" => {
                if strategy.rolling_update.is_some() {
                    out.push(FieldError::invalid(
                        "spec.updateStrategy.rollingUpdate",
                        "{...}",
                        "only allowed for updateStrategy 'RollingUpdate'",
                    ));
                }
            }
            other => out.push(FieldError::not_supported("spec.updateStrategy", other, &["OnDelete", "RollingUpdate"])),
        }
        non_negative(spec.replicas.map(i64::from), "spec.replicas", &mut out);
        non_negative(spec.min_ready_seconds.map(i64::from), "spec.minReadySeconds", &mut out);
        if let Some(o) = &spec.ordinals {
            non_negative(o.start.map(i64::from), "spec.ordinals.start", &mut out);
        }
        if let Some(p) = &spec.persistent_volume_claim_retention_policy {
            for (field, v) in [("whenDeleted", &p.when_deleted), ("whenScaled", &p.when_scaled)] {
                let v = v.as_deref().unwrap_or_default();
                if !matches!(v, "Retain" | "Delete") {
                    out.push(FieldError::not_supported(
                        format!("spec.persistentVolumeClaimRetentionPolicy.{field}"),
                        v,
                        &["Retain", "Delete"],
                    ));
                }
            }
        }
        validate_selector(Some(&spec.selector), "statefulset", &mut out);
        validate_template_for_controller(
            &with_claim_volumes(&spec),
            Some(&spec.selector),
            "StatefulSet",
            "spec.template",
            &mut out,
        );
        out
    }

    fn validate_update(&self, new: &StatefulSet, old: &StatefulSet) -> ErrorList {
        let mut out = self.validate(new);
        // Only these may change (`ValidateStatefulSetUpdate`).
        let (mut a, mut b) = (new.spec.clone(), old.spec.clone());
        for s in [&mut a, &mut b] {
            s.replicas = None;
            s.ordinals = None;
            s.template = Default::default();
            s.update_strategy = None;
            s.revision_history_limit = None;
            s.persistent_volume_claim_retention_policy = None;
            s.min_ready_seconds = None;
        }
        if a != b {
            out.push(FieldError::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![NAME_COLUMN, READY, AGE_COLUMN];
        cols.extend(wide_columns(false));
        cols
    }

    fn cells(&self, sts: &StatefulSet) -> Vec<Value> {
        let status = sts.status.clone().unwrap_or_default();
        let spec = Some(&sts.spec);
        let desired = spec.and_then(|s| s.replicas).unwrap_or(0);
        let mut cells = vec![
            name_cell(&sts.metadata),
            json!(format!("{}/{desired}", status.ready_replicas.unwrap_or(0))),
            age_cell(&sts.metadata),
        ];
        cells.extend(wide_cells(spec.map(|s| &s.template), None));
        cells
    }
}

/// `SetDefaults_StatefulSet`.
/// The template as its pods will be, with a volume per claim template: upstream leaves the pod
/// spec of a StatefulSet unchecked because mounts of claim templates would fail; checked with
/// them, a bad template is refused here instead of at every pod creation.
fn with_claim_volumes(spec: &StatefulSetSpec) -> PodTemplateSpec {
    let mut template = spec.template.clone();
    let claims: Vec<String> =
        spec.volume_claim_templates.iter().flatten().filter_map(|c| c.metadata.name.clone()).collect();
    if let Some(pod) = template.spec.as_mut() {
        let volumes = pod.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| !claims.contains(&v.name));
        volumes.extend(claims.iter().map(|name| Volume {
            name: name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.clone(),
                read_only: None,
            }),
            ..Volume::default()
        }));
    }
    template
}

fn default_stateful_set(spec: &mut StatefulSetSpec) {
    spec.replicas.get_or_insert(1);
    spec.pod_management_policy.get_or_insert_with(|| "OrderedReady".into());
    let strategy = spec.update_strategy.get_or_insert_with(StatefulSetUpdateStrategy::default);
    let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
    if kind == "RollingUpdate" {
        let ru = strategy.rolling_update.get_or_insert_with(RollingUpdateStatefulSetStrategy::default);
        ru.partition.get_or_insert(0);
    }
    spec.revision_history_limit.get_or_insert(10);
    let policy = spec
        .persistent_volume_claim_retention_policy
        .get_or_insert_with(StatefulSetPersistentVolumeClaimRetentionPolicy::default);
    policy.when_deleted.get_or_insert_with(|| "Retain".into());
    policy.when_scaled.get_or_insert_with(|| "Retain".into());
    for claim in spec.volume_claim_templates.iter_mut().flatten() {
        if let Some(s) = &mut claim.spec {
            s.volume_mode.get_or_insert_with(|| "Filesystem".into());
        }
    }
    default_template(&mut spec.template);
}

impl Kind for DaemonSets {
    const MERGE_KEYS: &'static [MergeKey] = TEMPLATE_MERGE_KEYS;
    type Obj = DaemonSet;
    const INFO: ResourceInfo = info("DaemonSet", "daemonsets", "daemonset", &["ds"], "daemonsets.apps", false);
    const GENERATION: bool = true;

    fn prepare_create(&self, ds: &mut DaemonSet) {
        ds.status = None;
        default_daemon_set(&mut ds.spec);
        ds.annotations_mut().insert(TEMPLATE_GENERATION.into(), "1".into());
    }

    /// A changed template is a new template generation (`spec.templateGeneration` inside
    /// upstream, this annotation outside).
    fn prepare_update(&self, new: &mut DaemonSet, old: &DaemonSet) {
        new.status = old.status.clone();
        default_daemon_set(&mut new.spec);
        let generation = old.annotations().get(TEMPLATE_GENERATION).and_then(|g| g.parse::<i64>().ok()).unwrap_or(1);
        let generation = if new.spec.template != old.spec.template { generation + 1 } else { generation };
        new.annotations_mut().insert(TEMPLATE_GENERATION.into(), generation.to_string());
    }

    fn prepare_status_update(&self, new: &mut DaemonSet, old: &DaemonSet) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, ds: &DaemonSet) -> ErrorList {
        let mut out = Vec::new();
        let spec = ds.spec.clone();
        validate_selector(Some(&spec.selector), "daemonset", &mut out);
        validate_template_for_controller(&spec.template, Some(&spec.selector), "DaemonSet", "spec.template", &mut out);
        non_negative(spec.min_ready_seconds.map(i64::from), "spec.minReadySeconds", &mut out);
        non_negative(spec.revision_history_limit.map(i64::from), "spec.revisionHistoryLimit", &mut out);
        let strategy = spec.update_strategy.clone().unwrap_or_default();
        match strategy.type_.as_deref().unwrap_or_default() {
            "OnDelete" => {}
            "RollingUpdate" => {
                if let Some(ru) = &strategy.rolling_update {
                    let path = "spec.updateStrategy.rollingUpdate";
                    let (unavailable, surge) = (ru.max_unavailable.as_ref(), ru.max_surge.as_ref());
                    validate_int_or_percent(unavailable, &format!("{path}.maxUnavailable"), true, &mut out);
                    validate_int_or_percent(surge, &format!("{path}.maxSurge"), true, &mut out);
                    let (u, s) = (int_or_percent_value(unavailable), int_or_percent_value(surge));
                    if u == 0 && s == 0 {
                        out.push(FieldError::invalid_raw(
                            format!("{path}.maxUnavailable"),
                            int_or_percent_text(unavailable),
                            "may not be 0 when `maxSurge` is 0",
                        ));
                    }
                    if u != 0 && s != 0 {
                        out.push(FieldError::invalid_raw(
                            format!("{path}.maxSurge"),
                            int_or_percent_text(surge),
                            "may not be set when maxUnavailable is non-zero",
                        ));
                    }
                }
            }
            other => {
                out.push(FieldError::not_supported("spec.updateStrategy.type", other, &["OnDelete", "RollingUpdate"]))
            }
        }
        out
    }

    fn validate_update(&self, new: &DaemonSet, old: &DaemonSet) -> ErrorList {
        let mut out = self.validate(new);
        selector_immutable(Some(&new.spec.selector), Some(&old.spec.selector), &mut out);
        out
    }

    fn columns(&self) -> Vec<Column> {
        let mut cols = vec![
            NAME_COLUMN,
            Column::new("Desired", "integer", "The total number of nodes that should be running the daemon pod."),
            Column::new(
                "Current",
                "integer",
                "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            ),
            Column::new(
                "Ready",
                "integer",
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            ),
            Column::new("Up-to-date", "integer", "The total number of nodes that are running updated daemon pod"),
            Column::new(
                "Available",
                "integer",
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
            ),
            Column::new(
                "Node Selector",
                "string",
                "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
            ),
            AGE_COLUMN,
        ];
        cols.extend(wide_columns(true));
        cols
    }

    fn cells(&self, ds: &DaemonSet) -> Vec<Value> {
        let s = ds.status.clone().unwrap_or_default();
        let spec = Some(&ds.spec);
        let node_selector = spec
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.node_selector.as_ref())
            .filter(|m| !m.is_empty())
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "<none>".into());
        let mut cells = vec![
            name_cell(&ds.metadata),
            json!(s.desired_number_scheduled),
            json!(s.current_number_scheduled),
            json!(s.number_ready),
            count(s.updated_number_scheduled),
            count(s.number_available),
            json!(node_selector),
            age_cell(&ds.metadata),
        ];
        cells.extend(wide_cells(spec.map(|s| &s.template), Some(spec.map(|s| &s.selector))));
        cells
    }
}

/// `SetDefaults_DaemonSet`.
fn default_daemon_set(spec: &mut DaemonSetSpec) {
    let strategy = spec.update_strategy.get_or_insert_with(DaemonSetUpdateStrategy::default);
    let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
    if kind == "RollingUpdate" {
        let ru = strategy.rolling_update.get_or_insert_with(RollingUpdateDaemonSet::default);
        ru.max_unavailable.get_or_insert(IntOrString::Int(1));
        ru.max_surge.get_or_insert(IntOrString::Int(0));
    }
    spec.revision_history_limit.get_or_insert(10);
    default_template(&mut spec.template);
}

impl Kind for ControllerRevisions {
    type Obj = ControllerRevision;
    const INFO: ResourceInfo = ResourceInfo {
        categories: &[],
        subresources: &[],
        ..info(
            "ControllerRevision",
            "controllerrevisions",
            "controllerrevision",
            &[],
            "controllerrevisions.apps",
            false,
        )
    };

    fn validate(&self, cr: &ControllerRevision) -> ErrorList {
        let mut out = Vec::new();
        non_negative(cr.revision, "revision", &mut out);
        out
    }

    fn validate_update(&self, new: &ControllerRevision, old: &ControllerRevision) -> ErrorList {
        let mut out = self.validate(new);
        if new.data != old.data {
            out.push(FieldError::invalid("data", "{...}", "field is immutable"));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Controller", "string", "Controller of the object"),
            Column::new("Revision", "string", "Revision indicates the revision of the state represented by Data."),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, cr: &ControllerRevision) -> Vec<Value> {
        let controller = cr
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| {
                let group = o.api_version.split_once('/').map(|(g, _)| g).unwrap_or_default();
                let kind = o.kind.to_lowercase();
                if group.is_empty() { format!("{kind}/{}", o.name) } else { format!("{kind}.{group}/{}", o.name) }
            })
            .unwrap_or_else(|| "<none>".into());
        vec![name_cell(&cr.metadata), json!(controller), json!(cr.revision.unwrap_or(0)), age_cell(&cr.metadata)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(v: Value) -> Deployment {
        let mut d: Deployment = serde_json::from_value(v).unwrap();
        Deployments.prepare_create(&mut d);
        d
    }

    fn fields(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| format!("{}: {}", e.field, e.detail)).collect()
    }

    #[test]
    fn deployments_get_upstream_defaults() {
        let d = deployment(json!({"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}));
        let spec = &d.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.revision_history_limit, Some(10));
        assert_eq!(spec.progress_deadline_seconds, Some(600));
        let ru = spec.strategy.as_ref().unwrap().rolling_update.as_ref().unwrap();
        assert_eq!(ru.max_surge, percent("25%"));
        assert_eq!(spec.template.spec.as_ref().unwrap().restart_policy.as_deref(), Some("Always"));
        assert!(Deployments.validate(&d).is_empty(), "{:?}", fields(&Deployments.validate(&d)));
    }

    #[test]
    fn deployment_errors_are_upstreams() {
        let d = deployment(json!({"metadata": {"name": "web"}, "spec": {
            "replicas": -1,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}},
            "minReadySeconds": 10, "progressDeadlineSeconds": 5,
            "template": {"metadata": {"labels": {"app": "other"}},
                         "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}));
        let errs = fields(&Deployments.validate(&d));
        for want in [
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
            "spec.template.metadata.labels",
            "spec.template.spec.restartPolicy: Unsupported value",
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
            "spec.progressDeadlineSeconds: Invalid value: 5: must be greater than minReadySeconds",
        ] {
            assert!(
                errs.iter().any(|e| e.starts_with(want.split(": ").next().unwrap())
                    && e.contains(want.rsplit(": ").next().unwrap())),
                "{want} not in {errs:?}"
            );
        }
        let mut moved = d.clone();
        moved.spec.selector.match_labels = Some([("app".to_string(), "x".to_string())].into());
        assert!(
            fields(&Deployments.validate_update(&moved, &d))
                .iter()
                .any(|e| e.starts_with("spec.selector") && e.contains("field is immutable"))
        );
        let empty = deployment(json!({"metadata": {"name": "web"}, "spec": {"selector": {},
            "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}));
        assert!(
            fields(&Deployments.validate(&empty))
                .iter()
                .any(|e| e.contains("empty selector is invalid for deployment"))
        );
    }

    #[test]
    fn a_template_pod_spec_is_checked_under_its_path() {
        let d = deployment(json!({"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "C_", "image": ""}]}}}}));
        let errs = fields(&Deployments.validate(&d));
        assert!(errs.iter().any(|e| e.starts_with("spec.template.spec.containers[0].name")), "{errs:?}");
    }
}
