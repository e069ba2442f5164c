//! The pod's QoS class (upstream's `pkg/apis/core/helper/qos`).

use super::*;

/// A pod's QoS class (`status.qosClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// The class named `s` (as `as_str` spells it).
    pub fn parse(s: &str) -> Option<QosClass> {
        [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort].into_iter().find(|q| q.as_str() == s)
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(super) fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// Guaranteed / Burstable / BestEffort, as upstream's `ComputePodQOS`: pod-level resources decide
/// when set; otherwise every container (init containers included) must be Guaranteed for the pod
/// to be, or BestEffort for the pod to be, and any other mix is Burstable.
pub fn qos_class(spec: &PodSpec) -> QosClass {
    if let Some(resources) = &spec.resources {
        return resource_qos(resources);
    }
    let mut pod_qos = None;
    for c in slice(&spec.init_containers).iter().chain(&spec.containers) {
        let qos = c.resources.as_ref().map_or(QosClass::BestEffort, resource_qos);
        match pod_qos {
            _ if qos == QosClass::Burstable => return qos,
            None => pod_qos = Some(qos),
            Some(seen) if seen != qos => return QosClass::Burstable,
            Some(_) => {}
        }
    }
    pod_qos.unwrap_or(QosClass::BestEffort)
}

/// `resourceQOS`: the class of one set of requirements (cpu and memory only; zero is unset).
pub(super) fn resource_qos(resources: &ResourceRequirements) -> QosClass {
    let empty = |l: &Option<Quantities>| l.as_ref().is_none_or(|l| l.is_empty());
    if empty(&resources.requests) && empty(&resources.limits) {
        return QosClass::BestEffort;
    }
    let amount = |l: &Option<Quantities>, name: &str| {
        l.as_ref().and_then(|l| l.get(name)).and_then(|q| parse_quantity(&q.0)).unwrap_or(0)
    };
    let mut qos = None;
    for name in ["cpu", "memory"] {
        let request = amount(&resources.requests, name);
        if request != amount(&resources.limits, name) {
            return QosClass::Burstable;
        }
        let class = if request == 0 { QosClass::BestEffort } else { QosClass::Guaranteed };
        match qos {
            None => qos = Some(class),
            Some(q) if q != class => return QosClass::Burstable,
            Some(_) => {}
        }
    }
    qos.unwrap_or(QosClass::BestEffort)
}
