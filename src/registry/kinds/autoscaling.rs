//! HorizontalPodAutoscalers, stored as `autoscaling/v2` and served as v2 and v1: upstream's
//! defaults (`minReplicas` 1, CPU at 80 % when no metric is given, the default scaling rules of
//! a `behavior` given), validation (`ValidateHorizontalPodAutoscaler`), the status subresource
//! and the `kubectl get hpa` columns. v1 shows the CPU utilization target as
//! `targetCPUUtilizationPercentage` and carries what it cannot say (other metrics, behavior,
//! current metrics, conditions) in upstream's `autoscaling.alpha.kubernetes.io/*` annotations,
//! so an object read and written back through v1 loses nothing. No controller acts on them:
//! there is no metrics API to scale by.

use k8s_openapi::api::autoscaling::{v1, v2};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};

use super::pod_rules::{canonical_quantity, parse_quantity};
use crate::registry::Subresource;
use crate::registry::error::{Result, StatusError};
use crate::registry::patch::{MergeKey, merge};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, NameRule, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

pub struct HorizontalPodAutoscalers;
pub struct HorizontalPodAutoscalersV1;

const STORAGE: &str = "horizontalpodautoscalers.autoscaling";
const MERGE_KEYS: &[MergeKey] = &[merge("status.conditions", "type")];
/// Upstream's `MaxPeriodSeconds` and `MaxStabilizationWindowSeconds`.
const MAX_PERIOD_SECONDS: i32 = 1800;
const MAX_STABILIZATION_WINDOW_SECONDS: i32 = 3600;
/// Upstream's `DefaultCPUUtilization`.
const DEFAULT_CPU_UTILIZATION: i32 = 80;

/// The v1 annotations of what v1 has no field for (`autoscaling.alpha.kubernetes.io/...`).
const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";

const fn info(version: &'static str) -> ResourceInfo {
    ResourceInfo {
        group: "autoscaling",
        version,
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        singular: "horizontalpodautoscaler",
        namespaced: true,
        short_names: &["hpa"],
        categories: &["all"],
        subresources: &[Subresource::Status],
        storage: STORAGE,
        return_deleted_object: false,
    }
}

impl Kind for HorizontalPodAutoscalers {
    type Obj = v2::HorizontalPodAutoscaler;
    const INFO: ResourceInfo = info("v2");
    const GENERATION: bool = true;
    const MERGE_KEYS: &'static [MergeKey] = MERGE_KEYS;

    fn prepare_create(&self, hpa: &mut v2::HorizontalPodAutoscaler) {
        hpa.status = None;
        default_v2(hpa);
    }

    fn prepare_update(&self, new: &mut v2::HorizontalPodAutoscaler, old: &v2::HorizontalPodAutoscaler) {
        new.status = old.status.clone();
        default_v2(new);
    }

    fn prepare_status_update(&self, new: &mut v2::HorizontalPodAutoscaler, old: &v2::HorizontalPodAutoscaler) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, hpa: &v2::HorizontalPodAutoscaler) -> ErrorList {
        validate_spec(&hpa.spec)
    }

    fn validate_status_update(
        &self,
        new: &v2::HorizontalPodAutoscaler,
        _old: &v2::HorizontalPodAutoscaler,
    ) -> ErrorList {
        validate_status(new.status.as_ref())
    }

    fn columns(&self) -> Vec<Column> {
        columns()
    }

    fn cells(&self, hpa: &v2::HorizontalPodAutoscaler) -> Vec<Value> {
        cells(hpa)
    }
}

impl Kind for HorizontalPodAutoscalersV1 {
    type Obj = v1::HorizontalPodAutoscaler;
    const INFO: ResourceInfo = info("v1");
    const GENERATION: bool = true;

    fn prepare_create(&self, hpa: &mut v1::HorizontalPodAutoscaler) {
        hpa.status = None;
        if let Some(a) = hpa.metadata.annotations.as_mut() {
            a.remove(CURRENT_METRICS);
            a.remove(CONDITIONS);
        }
        default_v1(hpa);
    }

    fn prepare_update(&self, new: &mut v1::HorizontalPodAutoscaler, old: &v1::HorizontalPodAutoscaler) {
        new.status = old.status.clone();
        // The status v1 keeps in annotations stays the stored one too.
        let kept = old.metadata.annotations.iter().flatten().filter(|(k, _)| *k == CURRENT_METRICS || *k == CONDITIONS);
        let kept: Vec<(String, String)> = kept.map(|(k, v)| (k.clone(), v.clone())).collect();
        let annotations = new.metadata.annotations.get_or_insert_with(Default::default);
        annotations.remove(CURRENT_METRICS);
        annotations.remove(CONDITIONS);
        annotations.extend(kept);
        if annotations.is_empty() {
            new.metadata.annotations = None;
        }
        default_v1(new);
    }

    fn prepare_status_update(&self, new: &mut v1::HorizontalPodAutoscaler, old: &v1::HorizontalPodAutoscaler) {
        new.spec = old.spec.clone();
    }

    /// Upstream validates the internal object, so the errors name the v2 fields.
    fn validate(&self, hpa: &v1::HorizontalPodAutoscaler) -> ErrorList {
        match as_v2(hpa) {
            Ok(v2) => validate_spec(&v2.spec),
            Err(e) => vec![FieldError::invalid(format!("metadata.annotations[{METRICS}]"), "", e.to_string())],
        }
    }

    fn validate_status_update(
        &self,
        new: &v1::HorizontalPodAutoscaler,
        _old: &v1::HorizontalPodAutoscaler,
    ) -> ErrorList {
        let status = new.status.as_ref().map(|s| v2::HorizontalPodAutoscalerStatus {
            current_replicas: Some(s.current_replicas),
            desired_replicas: s.desired_replicas,
            ..Default::default()
        });
        validate_status(status.as_ref())
    }

    fn columns(&self) -> Vec<Column> {
        columns()
    }

    fn cells(&self, hpa: &v1::HorizontalPodAutoscaler) -> Vec<Value> {
        as_v2(hpa).map(|v2| cells(&v2)).unwrap_or_default()
    }

    fn decode_stored(&self, stored: Value) -> Result<Value> {
        v2_to_v1(stored)
    }

    fn encode_stored(&self, obj: Value) -> Result<Value> {
        let mut v2 = v1_to_v2(obj)?;
        if let Some(spec) = v2.get_mut("spec") {
            default_metrics(spec);
        }
        serde_json::from_value::<v2::HorizontalPodAutoscaler>(v2.clone()).map_err(StatusError::internal)?;
        Ok(v2)
    }

    fn converts(&self) -> bool {
        true
    }
}

/// `SetDefaults_HorizontalPodAutoscaler` (v2).
fn default_v2(hpa: &mut v2::HorizontalPodAutoscaler) {
    let spec = &mut hpa.spec;
    spec.min_replicas.get_or_insert(1);
    if spec.metrics.as_ref().is_none_or(Vec::is_empty) {
        spec.metrics = Some(vec![cpu_utilization(DEFAULT_CPU_UTILIZATION)]);
    }
    if let Some(b) = spec.behavior.as_mut() {
        b.scale_up = Some(scaling_rules(b.scale_up.take(), Some(0), &[("Pods", 4), ("Percent", 100)]));
        b.scale_down = Some(scaling_rules(b.scale_down.take(), None, &[("Percent", 100)]));
    }
}

/// `SetDefaults_HorizontalPodAutoscaler` (v1): only `minReplicas`; the metric is defaulted in
/// the stored v2 form.
fn default_v1(hpa: &mut v1::HorizontalPodAutoscaler) {
    hpa.spec.min_replicas.get_or_insert(1);
}

/// The default metric, in JSON, on a v2 spec without one.
fn default_metrics(spec: &mut Value) {
    if spec.get("metrics").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        spec["metrics"] = json!([cpu_utilization(DEFAULT_CPU_UTILIZATION)]);
    }
}

fn cpu_utilization(percent: i32) -> v2::MetricSpec {
    v2::MetricSpec {
        type_: "Resource".into(),
        resource: Some(v2::ResourceMetricSource {
            name: "cpu".into(),
            target: v2::MetricTarget {
                type_: "Utilization".into(),
                average_utilization: Some(percent),
                ..Default::default()
            },
        }),
        ..Default::default()
    }
}

/// `GenerateHPAScaleUpRules` / `GenerateHPAScaleDownRules`: what the user left out, from the defaults
/// (policies of 15 s periods, the `Max` select policy).
fn scaling_rules(
    given: Option<v2::HPAScalingRules>,
    window: Option<i32>,
    policies: &[(&str, i32)],
) -> v2::HPAScalingRules {
    let given = given.unwrap_or_default();
    let default_policies = policies
        .iter()
        .map(|(t, v)| v2::HPAScalingPolicy { type_: (*t).into(), value: *v, period_seconds: 15 })
        .collect();
    v2::HPAScalingRules {
        stabilization_window_seconds: given.stabilization_window_seconds.or(window),
        select_policy: given.select_policy.or_else(|| Some("Max".into())),
        policies: given.policies.or(Some(default_policies)),
        tolerance: given.tolerance,
    }
}

/// `validateHorizontalPodAutoscalerSpec`.
fn validate_spec(spec: &v2::HorizontalPodAutoscalerSpec) -> ErrorList {
    let mut out = Vec::new();
    if let Some(min) = spec.min_replicas
        && min < 1
    {
        out.push(FieldError::invalid_raw("spec.minReplicas", min, "must be greater than or equal to 1"));
    }
    if spec.max_replicas < 1 {
        out.push(FieldError::invalid_raw("spec.maxReplicas", spec.max_replicas, "must be greater than 0"));
    }
    if spec.min_replicas.is_some_and(|min| spec.max_replicas < min) {
        out.push(FieldError::invalid_raw(
            "spec.maxReplicas",
            spec.max_replicas,
            "must be greater than or equal to `minReplicas`",
        ));
    }
    validate_reference(&spec.scale_target_ref, "spec.scaleTargetRef", &mut out);
    for (i, metric) in spec.metrics.iter().flatten().enumerate() {
        validate_metric(metric, &format!("spec.metrics[{i}]"), &mut out);
    }
    if let Some(b) = &spec.behavior {
        validate_rules(b.scale_up.as_ref(), "spec.behavior.scaleUp", &mut out);
        validate_rules(b.scale_down.as_ref(), "spec.behavior.scaleDown", &mut out);
    }
    out
}

fn validate_status(status: Option<&v2::HorizontalPodAutoscalerStatus>) -> ErrorList {
    let mut out = Vec::new();
    let status = status.cloned().unwrap_or_default();
    for (field, v) in [
        ("status.currentReplicas", status.current_replicas.unwrap_or(0)),
        ("status.desiredReplicas", status.desired_replicas),
    ] {
        if v < 0 {
            out.push(FieldError::invalid_raw(field, v, "must be greater than or equal to 0"));
        }
    }
    out
}

/// `ValidateCrossVersionObjectReference`.
fn validate_reference(r: &v2::CrossVersionObjectReference, path: &str, out: &mut ErrorList) {
    for (field, value) in [("kind", &r.kind), ("name", &r.name)] {
        if value.is_empty() {
            out.push(FieldError::required(format!("{path}.{field}"), ""));
        }
        for msg in if value.is_empty() { Vec::new() } else { NameRule::PathSegment.errors(value) } {
            out.push(FieldError::invalid(format!("{path}.{field}"), value, msg));
        }
    }
}

/// `validateMetricSpec` with the source it names.
fn validate_metric(m: &v2::MetricSpec, path: &str, out: &mut ErrorList) {
    const TYPES: [&str; 5] = ["ContainerResource", "External", "Object", "Pods", "Resource"];
    if m.type_.is_empty() {
        out.push(FieldError::required(format!("{path}.type"), "must specify a metric source type"));
    }
    if !TYPES.contains(&m.type_.as_str()) {
        out.push(FieldError::not_supported(format!("{path}.type"), &m.type_, &TYPES));
    }
    let present: Vec<&str> = [
        ("object", m.object.is_some()),
        ("pods", m.pods.is_some()),
        ("resource", m.resource.is_some()),
        ("external", m.external.is_some()),
        ("containerResource", m.container_resource.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    // Upstream checks only the first source given.
    match present.first() {
        Some(&"object") => {
            let o = m.object.as_ref().expect("present");
            let p = format!("{path}.object");
            validate_reference(&o.described_object, &format!("{p}.describedObject"), out);
            validate_identifier(&o.metric, &p, out);
            validate_target(&o.target, &p, out);
            if o.target.value.is_none() && o.target.average_value.is_none() {
                out.push(FieldError::required(
                    format!("{p}.target.averageValue"),
                    "must set either a target value or averageValue",
                ));
            }
        }
        Some(&"pods") => {
            let s = m.pods.as_ref().expect("present");
            let p = format!("{path}.pods");
            validate_identifier(&s.metric, &p, out);
            validate_target(&s.target, &p, out);
            if s.target.average_value.is_none() {
                out.push(FieldError::required(
                    format!("{p}.target.averageValue"),
                    "must specify a positive target averageValue",
                ));
            }
        }
        Some(&"resource") => {
            let s = m.resource.as_ref().expect("present");
            validate_resource(&s.name, &s.target, &format!("{path}.resource"), out);
        }
        Some(&"external") => {
            let s = m.external.as_ref().expect("present");
            let p = format!("{path}.external");
            validate_identifier(&s.metric, &p, out);
            validate_target(&s.target, &p, out);
            match (&s.target.value, &s.target.average_value) {
                (None, None) => out.push(FieldError::required(
                    format!("{p}.target.averageValue"),
                    "must set either a target value for metric or a per-pod target",
                )),
                (Some(_), Some(_)) => out.push(FieldError::forbidden(
                    format!("{p}.target.value"),
                    "may not set both a target value for metric and a per-pod target",
                )),
                _ => {}
            }
        }
        Some(_) => {
            let s = m.container_resource.as_ref().expect("present");
            let p = format!("{path}.containerResource");
            if s.container.is_empty() {
                out.push(FieldError::required(format!("{p}.container"), "must specify a container"));
            }
            for msg in if s.container.is_empty() {
                Vec::new()
            } else {
                crate::registry::validation::is_dns1123_label(&s.container)
            } {
                out.push(FieldError::invalid(format!("{p}.container"), &s.container, msg));
            }
            validate_resource(&s.name, &s.target, &p, out);
        }
        None => {}
    }
    let expected =
        if m.type_ == "ContainerResource" { "containerResource".to_string() } else { m.type_.to_lowercase() };
    if !present.contains(&expected.as_str()) {
        out.push(FieldError::required(
            format!("{path}.{expected}"),
            "must populate information for the given metric source",
        ));
    }
    if present.len() > 1 {
        for other in present.iter().filter(|p| **p != expected) {
            out.push(FieldError::forbidden(format!("{path}.{other}"), "must populate the given metric source only"));
        }
    }
}

fn validate_resource(name: &str, target: &v2::MetricTarget, path: &str, out: &mut ErrorList) {
    if name.is_empty() {
        out.push(FieldError::required(format!("{path}.name"), "must specify a resource name"));
    }
    validate_target(target, path, out);
    match (target.average_utilization, &target.average_value) {
        (None, None) => out.push(FieldError::required(
            format!("{path}.target.averageUtilization"),
            "must set either a target raw value or a target utilization",
        )),
        (Some(_), Some(_)) => out.push(FieldError::forbidden(
            format!("{path}.target.averageValue"),
            "may not set both a target raw value and a target utilization",
        )),
        _ => {}
    }
}

fn validate_identifier(id: &v2::MetricIdentifier, path: &str, out: &mut ErrorList) {
    let p = format!("{path}.metric.name");
    if id.name.is_empty() {
        out.push(FieldError::required(p, "must specify a metric name"));
    } else {
        for msg in NameRule::PathSegment.errors(&id.name) {
            out.push(FieldError::invalid(&p, &id.name, msg));
        }
    }
}

/// `validateMetricTarget`.
fn validate_target(t: &v2::MetricTarget, path: &str, out: &mut ErrorList) {
    let p = format!("{path}.target");
    if t.type_.is_empty() {
        out.push(FieldError::required(format!("{p}.type"), "must specify a metric target type"));
    } else if !matches!(t.type_.as_str(), "Utilization" | "Value" | "AverageValue") {
        out.push(FieldError::invalid(
            format!("{p}.type"),
            &t.type_,
            "must be either Utilization, Value, or AverageValue",
        ));
    }
    if let Some(u) = t.average_utilization
        && u < 1
    {
        out.push(FieldError::invalid_raw(format!("{p}.averageUtilization"), u, "must be greater than 0"));
    }
    for (field, q) in [("value", &t.value), ("averageValue", &t.average_value)] {
        if let Some(q) = q
            && !positive(q)
        {
            out.push(FieldError::invalid(format!("{p}.{field}"), &q.0, "must be positive"));
        }
    }
}

fn positive(q: &Quantity) -> bool {
    parse_quantity(&q.0).is_some_and(|m| m > 0)
}

/// `validateScalingRules`.
fn validate_rules(rules: Option<&v2::HPAScalingRules>, path: &str, out: &mut ErrorList) {
    let Some(rules) = rules else { return };
    if let Some(w) = rules.stabilization_window_seconds {
        if w < 0 {
            out.push(FieldError::invalid_raw(
                format!("{path}.stabilizationWindowSeconds"),
                w,
                "must be greater than or equal to zero",
            ));
        }
        if w > MAX_STABILIZATION_WINDOW_SECONDS {
            out.push(FieldError::invalid_raw(
                format!("{path}.stabilizationWindowSeconds"),
                w,
                format!("must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}"),
            ));
        }
    }
    if let Some(s) = rules.select_policy.as_deref()
        && !matches!(s, "Max" | "Min" | "Disabled")
    {
        out.push(FieldError::not_supported(format!("{path}.selectPolicy"), s, &["Disabled", "Max", "Min"]));
    }
    let policies = rules.policies.clone().unwrap_or_default();
    if policies.is_empty() {
        out.push(FieldError::required(format!("{path}.policies"), "must specify at least one Policy"));
    }
    for (i, p) in policies.iter().enumerate() {
        let at = format!("{path}.policies[{i}]");
        if !matches!(p.type_.as_str(), "Pods" | "Percent") {
            out.push(FieldError::not_supported(format!("{at}.type"), &p.type_, &["Percent", "Pods"]));
        }
        if p.value <= 0 {
            out.push(FieldError::invalid_raw(format!("{at}.value"), p.value, "must be greater than zero"));
        }
        if p.period_seconds <= 0 {
            out.push(FieldError::invalid_raw(
                format!("{at}.periodSeconds"),
                p.period_seconds,
                "must be greater than zero",
            ));
        }
        if p.period_seconds > MAX_PERIOD_SECONDS {
            out.push(FieldError::invalid_raw(
                format!("{at}.periodSeconds"),
                p.period_seconds,
                format!("must be less than or equal to {MAX_PERIOD_SECONDS}"),
            ));
        }
    }
    if let Some(t) = &rules.tolerance
        && parse_quantity(&t.0).is_some_and(|m| m < 0)
    {
        out.push(FieldError::invalid(format!("{path}.tolerance"), &t.0, "must be greater than or equal to zero"));
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME_COLUMN,
        Column::new(
            "Reference",
            "string",
            "reference to scaled resource; horizontal pod autoscaler will learn the current resource consumption and will set the desired number of pods by using its Scale subresource.",
        ),
        Column::new(
            "Targets",
            "string",
            "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).",
        ),
        Column::new(
            "MinPods",
            "string",
            "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.",
        ),
        Column::new(
            "MaxPods",
            "string",
            "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up.",
        ),
        Column::new(
            "Replicas",
            "string",
            "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler.",
        ),
        AGE_COLUMN,
    ]
}

fn cells(hpa: &v2::HorizontalPodAutoscaler) -> Vec<Value> {
    let spec = &hpa.spec;
    let status = hpa.status.clone().unwrap_or_default();
    let r = &spec.scale_target_ref;
    vec![
        name_cell(&hpa.metadata),
        json!(format!("{}/{}", r.kind, r.name)),
        json!(format_metrics(
            spec.metrics.as_deref().unwrap_or_default(),
            status.current_metrics.as_deref().unwrap_or_default()
        )),
        json!(spec.min_replicas.map_or_else(|| "<unset>".to_string(), |m| m.to_string())),
        json!(spec.max_replicas.to_string()),
        json!(status.current_replicas.unwrap_or(0).to_string()),
        age_cell(&hpa.metadata),
    ]
}

/// The TARGETS cell (upstream's `formatHPAMetrics`): `current/target` per metric, two at most.
fn format_metrics(specs: &[v2::MetricSpec], statuses: &[v2::MetricStatus]) -> String {
    const MAX: usize = 2;
    if specs.is_empty() {
        return "<none>".into();
    }
    let q = |q: Option<&Quantity>| q.map(|q| canonical_quantity(&q.0).unwrap_or_else(|| q.0.clone()));
    let unknown = || "<unknown>".to_string();
    let percent = |p: Option<i32>| p.map(|p| format!("{p}%"));
    let list: Vec<String> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let status = statuses.get(i);
            let value_or_average = |target: &v2::MetricTarget, current: Option<&v2::MetricValueStatus>| {
                if target.average_value.is_some() {
                    let now = q(current.and_then(|c| c.average_value.as_ref())).unwrap_or_else(unknown);
                    format!("{now}/{} (avg)", q(target.average_value.as_ref()).unwrap_or_default())
                } else {
                    let now =
                        current.map(|c| q(c.value.as_ref()).unwrap_or_else(|| "0".into())).unwrap_or_else(unknown);
                    format!("{now}/{}", q(target.value.as_ref()).unwrap_or_else(|| "0".into()))
                }
            };
            let resource = |name: &str, target: &v2::MetricTarget, current: Option<&v2::MetricValueStatus>| {
                if target.average_value.is_some() {
                    let now = current
                        .map(|c| q(c.average_value.as_ref()).unwrap_or_else(|| "0".into()))
                        .unwrap_or_else(unknown);
                    format!("{name}: {now}/{}", q(target.average_value.as_ref()).unwrap_or_default())
                } else {
                    let now = percent(current.and_then(|c| c.average_utilization)).unwrap_or_else(unknown);
                    let target = percent(target.average_utilization).unwrap_or_else(|| "<auto>".into());
                    format!("{name}: {now}/{target}")
                }
            };
            match (spec.type_.as_str(), spec) {
                ("External", v2::MetricSpec { external: Some(s), .. }) => {
                    value_or_average(&s.target, status.and_then(|s| s.external.as_ref()).map(|s| &s.current))
                }
                ("Object", v2::MetricSpec { object: Some(s), .. }) => {
                    value_or_average(&s.target, status.and_then(|s| s.object.as_ref()).map(|s| &s.current))
                }
                ("Pods", v2::MetricSpec { pods: Some(s), .. }) => {
                    let now = status
                        .and_then(|s| s.pods.as_ref())
                        .map(|s| q(s.current.average_value.as_ref()).unwrap_or_else(|| "0".into()))
                        .unwrap_or_else(unknown);
                    format!("{now}/{}", q(s.target.average_value.as_ref()).unwrap_or_else(|| "0".into()))
                }
                ("Resource", v2::MetricSpec { resource: Some(s), .. }) => {
                    resource(&s.name, &s.target, status.and_then(|s| s.resource.as_ref()).map(|s| &s.current))
                }
                ("ContainerResource", v2::MetricSpec { container_resource: Some(s), .. }) => {
                    resource(&s.name, &s.target, status.and_then(|s| s.container_resource.as_ref()).map(|s| &s.current))
                }
                _ => "<unknown type>".into(),
            }
        })
        .collect();
    if list.len() > MAX {
        format!("{} + {} more...", list[..MAX].join(", "), list.len() - MAX)
    } else {
        list.join(", ")
    }
}

fn as_v2(hpa: &v1::HorizontalPodAutoscaler) -> Result<v2::HorizontalPodAutoscaler> {
    let v = serde_json::to_value(hpa).map_err(StatusError::internal)?;
    serde_json::from_value(v1_to_v2(v)?).map_err(|e| StatusError::bad_request(e.to_string()))
}

/// Whether a v2 metric is what v1's `targetCPUUtilizationPercentage` says.
fn is_cpu_utilization(m: &Value) -> bool {
    m["type"] == "Resource" && m["resource"]["name"] == "cpu" && m["resource"]["target"]["type"] == "Utilization"
}

/// Takes `key` out of the metadata's annotations, parsed as JSON.
fn take_annotation(obj: &mut Value, key: &str) -> Result<Option<Value>> {
    let Some(annotations) = obj.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) else {
        return Ok(None);
    };
    let Some(text) = annotations.remove(key) else { return Ok(None) };
    if annotations.is_empty() {
        obj["metadata"].as_object_mut().map(|m| m.remove("annotations"));
    }
    let text = text.as_str().unwrap_or_default();
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| StatusError::bad_request(format!("annotation {key} is not valid JSON: {e}")))
}

fn put_annotation(obj: &mut Value, key: &str, value: &Value) {
    let meta = obj.as_object_mut().map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    if let Some(meta) = meta.and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        annotations[key] = Value::String(value.to_string());
    }
}

/// A stored v2 object as v1 shows it.
fn v2_to_v1(mut obj: Value) -> Result<Value> {
    obj["apiVersion"] = json!("autoscaling/v1");
    let spec = obj.get_mut("spec").and_then(Value::as_object_mut).map(std::mem::take).unwrap_or_default();
    let status = obj.get_mut("status").and_then(Value::as_object_mut).map(std::mem::take);
    let mut v1_spec = Map::new();
    for key in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(key) {
            v1_spec.insert(key.into(), v.clone());
        }
    }
    let mut other = spec.get("metrics").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(i) = other.iter().position(is_cpu_utilization) {
        let cpu = other.remove(i);
        if let Some(target) = cpu["resource"]["target"].get("averageUtilization") {
            v1_spec.insert("targetCPUUtilizationPercentage".into(), target.clone());
        }
    }
    if !other.is_empty() {
        put_annotation(&mut obj, METRICS, &Value::Array(other));
    }
    if let Some(b) = spec.get("behavior").filter(|b| !b.is_null()) {
        put_annotation(&mut obj, BEHAVIOR, b);
    }
    obj["spec"] = Value::Object(v1_spec);
    if let Some(status) = status {
        let mut v1_status = Map::new();
        for key in ["observedGeneration", "lastScaleTime", "desiredReplicas"] {
            if let Some(v) = status.get(key) {
                v1_status.insert(key.into(), v.clone());
            }
        }
        v1_status.insert("currentReplicas".into(), status.get("currentReplicas").cloned().unwrap_or(json!(0)));
        v1_status.entry("desiredReplicas").or_insert(json!(0));
        let current = status.get("currentMetrics").and_then(Value::as_array).cloned().unwrap_or_default();
        let cpu = current.iter().find(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu");
        if let Some(u) = cpu.and_then(|m| m["resource"]["current"].get("averageUtilization")) {
            v1_status.insert("currentCPUUtilizationPercentage".into(), u.clone());
        }
        if !current.is_empty() {
            put_annotation(&mut obj, CURRENT_METRICS, &Value::Array(current));
        }
        if let Some(c) = status.get("conditions").filter(|c| c.as_array().is_some_and(|c| !c.is_empty())) {
            put_annotation(&mut obj, CONDITIONS, c);
        }
        obj["status"] = Value::Object(v1_status);
    }
    Ok(obj)
}

/// A v1 object in the stored v2 form.
fn v1_to_v2(mut obj: Value) -> Result<Value> {
    obj["apiVersion"] = json!("autoscaling/v2");
    let metrics = take_annotation(&mut obj, METRICS)?;
    let behavior = take_annotation(&mut obj, BEHAVIOR)?;
    let current = take_annotation(&mut obj, CURRENT_METRICS)?;
    let conditions = take_annotation(&mut obj, CONDITIONS)?;
    let mut spec = obj.get_mut("spec").and_then(Value::as_object_mut).map(std::mem::take).unwrap_or_default();
    let cpu = spec.remove("targetCPUUtilizationPercentage");
    let mut all: Vec<Value> = Vec::new();
    if let Some(cpu) = cpu.and_then(|c| c.as_i64()) {
        all.push(
            serde_json::to_value(cpu_utilization(cpu.clamp(i32::MIN.into(), i32::MAX.into()) as i32))
                .map_err(StatusError::internal)?,
        );
    }
    all.extend(metrics.and_then(|m| m.as_array().cloned()).unwrap_or_default());
    if !all.is_empty() {
        spec.insert("metrics".into(), Value::Array(all));
    }
    if let Some(b) = behavior {
        spec.insert("behavior".into(), b);
    }
    obj["spec"] = Value::Object(spec);
    if let Some(mut status) = obj.get_mut("status").and_then(Value::as_object_mut).map(std::mem::take) {
        status.remove("currentCPUUtilizationPercentage");
        if let Some(c) = current {
            status.insert("currentMetrics".into(), c);
        }
        if let Some(c) = conditions {
            status.insert("conditions".into(), c);
        }
        obj["status"] = Value::Object(status);
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(spec: Value) -> v2::HorizontalPodAutoscaler {
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).unwrap()
    }

    fn errors(spec: Value) -> Vec<String> {
        let mut hpa = v2(spec);
        HorizontalPodAutoscalers.prepare_create(&mut hpa);
        HorizontalPodAutoscalers.validate(&hpa).iter().map(ToString::to_string).collect()
    }

    const TARGET: &str = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}"#;

    fn target() -> Value {
        serde_json::from_str(TARGET).unwrap()
    }

    #[test]
    fn defaults_as_upstream() {
        let mut hpa = v2(
            json!({"scaleTargetRef": target(), "maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}),
        );
        HorizontalPodAutoscalers.prepare_create(&mut hpa);
        let spec = serde_json::to_value(hpa.spec).unwrap();
        assert_eq!(spec["minReplicas"], 1);
        assert_eq!(
            spec["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}])
        );
        assert_eq!(
            spec["behavior"]["scaleUp"],
            json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
                {"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}]})
        );
        assert_eq!(
            spec["behavior"]["scaleDown"],
            json!({"stabilizationWindowSeconds": 60, "selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]})
        );
    }

    #[test]
    fn specs_are_checked_as_upstream() {
        assert!(errors(json!({"scaleTargetRef": target(), "maxReplicas": 3})).is_empty());
        assert_eq!(
            errors(json!({"scaleTargetRef": {"kind": "", "name": "a/b"}, "minReplicas": 0, "maxReplicas": 0})),
            [
                "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1",
                "spec.maxReplicas: Invalid value: 0: must be greater than 0",
                "spec.scaleTargetRef.kind: Required value",
                "spec.scaleTargetRef.name: Invalid value: \"a/b\": may not contain '/'",
            ]
        );
        assert_eq!(
            errors(json!({"scaleTargetRef": target(), "minReplicas": 4, "maxReplicas": 3})),
            ["spec.maxReplicas: Invalid value: 3: must be greater than or equal to `minReplicas`"]
        );
        let metric = |m: Value| errors(json!({"scaleTargetRef": target(), "maxReplicas": 3, "metrics": [m]}));
        assert_eq!(
            metric(
                json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 0}}})
            ),
            ["spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"]
        );
        assert_eq!(
            metric(
                json!({"type": "Pods", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 5}}})
            ),
            ["spec.metrics[0].pods: Required value: must populate information for the given metric source"]
        );
        assert_eq!(
            metric(json!({"type": "Pods",
                "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1"}},
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 5}}})),
            ["spec.metrics[0].resource: Forbidden: must populate the given metric source only"]
        );
        assert_eq!(
            metric(json!({"type": "Memory"})),
            [
                "spec.metrics[0].type: Unsupported value: \"Memory\": supported values: \"ContainerResource\", \"External\", \"Object\", \"Pods\", \"Resource\"",
                "spec.metrics[0].memory: Required value: must populate information for the given metric source",
            ]
        );
        assert_eq!(
            metric(
                json!({"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "Value", "value": "-1"}}})
            ),
            [
                "spec.metrics[0].pods.target.value: Invalid value: \"-1\": must be positive",
                "spec.metrics[0].pods.target.averageValue: Required value: must specify a positive target averageValue",
            ]
        );
        let rules = errors(json!({"scaleTargetRef": target(), "maxReplicas": 3, "behavior": {"scaleUp": {
            "stabilizationWindowSeconds": 4000, "selectPolicy": "Most", "policies": [{"type": "Pods", "value": 0, "periodSeconds": 2000}]}}}));
        assert_eq!(
            rules,
            [
                "spec.behavior.scaleUp.stabilizationWindowSeconds: Invalid value: 4000: must be less than or equal to 3600",
                "spec.behavior.scaleUp.selectPolicy: Unsupported value: \"Most\": supported values: \"Disabled\", \"Max\", \"Min\"",
                "spec.behavior.scaleUp.policies[0].value: Invalid value: 0: must be greater than zero",
                "spec.behavior.scaleUp.policies[0].periodSeconds: Invalid value: 2000: must be less than or equal to 1800",
            ]
        );
    }

    #[test]
    fn v1_round_trips_what_it_cannot_show() {
        let stored = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": target(), "minReplicas": 1, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30, "selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}}},
            "status": {"currentReplicas": 2, "desiredReplicas": 3,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40}}}],
                "conditions": [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"}]}});
        let v1 = v2_to_v1(stored.clone()).unwrap();
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(
            v1["spec"],
            json!({"scaleTargetRef": target(), "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50})
        );
        assert_eq!(
            v1["status"],
            json!({"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 40})
        );
        let typed: v1::HorizontalPodAutoscaler = serde_json::from_value(v1.clone()).unwrap();
        assert_eq!(typed.metadata.annotations.as_ref().map(|a| a.len()), Some(4));
        assert_eq!(v1_to_v2(v1).unwrap(), stored);
        let cells = HorizontalPodAutoscalersV1.cells(&typed);
        assert_eq!(cells[1], "Deployment/web");
        assert_eq!(cells[2], "cpu: 40%/50%, <unknown>/10");
    }

    #[test]
    fn the_targets_cell_as_kubectl_shows_it() {
        let m = |v: Value| -> v2::MetricSpec { serde_json::from_value(v).unwrap() };
        let cpu = m(
            json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}),
        );
        let mem = m(
            json!({"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}}}),
        );
        let ext = m(
            json!({"type": "External", "external": {"metric": {"name": "q"}, "target": {"type": "Value", "value": "5"}}}),
        );
        assert_eq!(format_metrics(&[], &[]), "<none>");
        assert_eq!(format_metrics(std::slice::from_ref(&cpu), &[]), "cpu: <unknown>/80%");
        assert_eq!(format_metrics(&[cpu, mem, ext], &[]), "cpu: <unknown>/80%, memory: <unknown>/1Gi + 1 more...");
    }
}
