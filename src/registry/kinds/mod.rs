//! One strategy per served kind. Adding a kind is: a file here with a [`Kind`] impl, and one line in
//! [`all`].

/// The strategic-merge list keys of a pod spec under `$spec` (`"spec."` for a pod,
/// `"spec.template.spec."` for a workload's template), followed by `$more`.
macro_rules! pod_spec_merge_keys {
    ($spec:literal, $($more:expr),* $(,)?) => {
        [
            merge(concat!($spec, "containers"), "name"),
            merge(concat!($spec, "containers.ports"), "containerPort"),
            merge(concat!($spec, "containers.env"), "name"),
            merge(concat!($spec, "containers.volumeMounts"), "mountPath"),
            merge(concat!($spec, "containers.volumeDevices"), "devicePath"),
            merge(concat!($spec, "containers.resizePolicy"), "resourceName"),
            merge(concat!($spec, "initContainers"), "name"),
            merge(concat!($spec, "initContainers.ports"), "containerPort"),
            merge(concat!($spec, "initContainers.env"), "name"),
            merge(concat!($spec, "initContainers.volumeMounts"), "mountPath"),
            merge(concat!($spec, "initContainers.volumeDevices"), "devicePath"),
            merge(concat!($spec, "initContainers.resizePolicy"), "resourceName"),
            merge(concat!($spec, "ephemeralContainers"), "name"),
            merge(concat!($spec, "ephemeralContainers.env"), "name"),
            merge(concat!($spec, "ephemeralContainers.volumeMounts"), "mountPath"),
            merge_retain(concat!($spec, "volumes"), "name"),
            merge(concat!($spec, "imagePullSecrets"), "name"),
            merge(concat!($spec, "hostAliases"), "ip"),
            merge(concat!($spec, "topologySpreadConstraints"), "topologyKey"),
            merge(concat!($spec, "schedulingGates"), "name"),
            merge(concat!($spec, "resourceClaims"), "name"),
            primitive(concat!($spec, "hostAliases.hostnames")),
            $($more),*
        ]
    };
}

mod apps;
mod autoscaling;
pub mod batch;
pub mod certificates;
pub mod config;
pub(crate) mod coordination;
mod discovery;
mod event;
mod job_policies;
mod namespace;
pub mod networking;
mod node;
pub mod pod;
pub mod pod_rules;
mod policy;
pub mod rbac;
mod runtime_class;
pub mod scheduling;
pub mod service;
pub mod storage;
mod workload_rules;

use std::sync::Arc;

use super::Resource;
use super::strategy::Typed;

pub use namespace::KUBERNETES_FINALIZER as NAMESPACE_FINALIZER;

/// Store prefix of nodes (the storage checks node existence for pod deletion).
pub const NODES_STORAGE: &str = "nodes";
/// Store prefix of namespaces (for the namespace lifecycle checks).
pub const NAMESPACES_STORAGE: &str = "namespaces";

/// Every served resource, in discovery order.
pub fn all() -> Vec<Resource> {
    vec![
        Arc::new(Typed::new(namespace::Namespaces)),
        Arc::new(Typed::new(node::Nodes)),
        Arc::new(Typed::new(pod::Pods)),
        Arc::new(Typed::new(config::ConfigMaps)),
        Arc::new(Typed::new(config::Secrets)),
        Arc::new(Typed::new(config::ServiceAccounts)),
        Arc::new(Typed::new(service::Services)),
        Arc::new(Typed::new(service::EndpointsKind)),
        Arc::new(Typed::new(event::CoreEvents)),
        Arc::new(Typed::new(storage::PersistentVolumes)),
        Arc::new(Typed::new(storage::PersistentVolumeClaims)),
        // Groups in kube-apiserver's priority order.
        Arc::new(Typed::new(apps::Deployments)),
        Arc::new(Typed::new(apps::ReplicaSets)),
        Arc::new(Typed::new(apps::StatefulSets)),
        Arc::new(Typed::new(apps::DaemonSets)),
        Arc::new(Typed::new(apps::ControllerRevisions)),
        Arc::new(Typed::new(event::Events)),
        Arc::new(Typed::new(autoscaling::HorizontalPodAutoscalers)),
        Arc::new(Typed::new(autoscaling::HorizontalPodAutoscalersV1)),
        Arc::new(Typed::new(batch::Jobs)),
        Arc::new(Typed::new(batch::CronJobs)),
        Arc::new(Typed::new(certificates::CertificateSigningRequests)),
        Arc::new(Typed::new(networking::IpAddresses)),
        Arc::new(Typed::new(policy::PodDisruptionBudgets)),
        Arc::new(Typed::new(rbac::ClusterRoleBindings)),
        Arc::new(Typed::new(rbac::ClusterRoles)),
        Arc::new(Typed::new(rbac::RoleBindings)),
        Arc::new(Typed::new(rbac::Roles)),
        Arc::new(Typed::new(storage::StorageClasses)),
        Arc::new(Typed::new(storage::CsiDrivers)),
        Arc::new(Typed::new(storage::CsiNodes)),
        Arc::new(Typed::new(storage::VolumeAttachments)),
        Arc::new(Typed::new(scheduling::PriorityClasses)),
        Arc::new(Typed::new(coordination::Leases)),
        Arc::new(Typed::new(runtime_class::RuntimeClasses)),
        Arc::new(Typed::new(discovery::EndpointSlices)),
    ]
}
