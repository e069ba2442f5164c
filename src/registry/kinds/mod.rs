//! One strategy per served kind. Adding a kind is: a file here with a [`Kind`] impl, and one line in
//! [`all`].

mod config;
mod coordination;
mod event;
mod namespace;
mod node;
pub mod pod;
pub mod pod_rules;
mod runtime_class;
pub mod storage;

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
        Arc::new(Typed::new(event::CoreEvents)),
        Arc::new(Typed::new(coordination::Leases)),
        Arc::new(Typed::new(event::Events)),
        Arc::new(Typed::new(storage::PersistentVolumes)),
        Arc::new(Typed::new(storage::PersistentVolumeClaims)),
        Arc::new(Typed::new(storage::StorageClasses)),
        Arc::new(Typed::new(storage::CsiDrivers)),
        Arc::new(Typed::new(storage::CsiNodes)),
        Arc::new(Typed::new(storage::VolumeAttachments)),
        Arc::new(Typed::new(runtime_class::RuntimeClasses)),
    ]
}
