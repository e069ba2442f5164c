//! The default plugins, and building a plugin by its upstream name.

pub mod balanced;
pub mod basic;
pub mod default_preemption;
pub mod fit;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_volume_limits;
pub mod topology_spread;
pub mod volume_binding;
pub mod volume_restrictions;

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Binding, Namespace, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::framework::{ClusterEvent, CycleState, Plugin, Point, Status};
use super::types::PodInfo;

/// Upstream v1.36's default `multiPoint` plugins, in order, with their score weights.
pub const DEFAULT_PLUGINS: &[(&str, i64)] = &[
    ("SchedulingGates", 0),
    ("PrioritySort", 0),
    ("NodeUnschedulable", 0),
    ("NodeName", 0),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", 0),
    ("NodeVolumeLimits", 0),
    ("VolumeBinding", 0),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DefaultPreemption", 0),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("DefaultBinder", 0),
];

/// Upstream plugins for features this cluster does not serve (cloud zones, dynamic resource
/// allocation): configurations may name them; they are left out.
pub const NOT_SERVED: &[&str] = &["VolumeZone", "DynamicResources", "NodeDeclaredFeatures"];

/// What plugins may use from the rest of the process (upstream's framework `Handle`): the client,
/// and caches of namespaces, PodDisruptionBudgets and of claims, volumes and classes (the listers).
#[derive(Clone)]
pub struct Handle {
    client: kube::Client,
    namespaces: Store<Namespace>,
    pdbs: Store<PodDisruptionBudget>,
    pub storage: volume_binding::Storage,
    /// Changes of the storage objects besides claims (whose signal is in `storage`).
    pub storage_changed: [tokio::sync::watch::Receiver<u64>; 4],
}

impl Handle {
    /// Starts the caches; they follow the API until `shutdown`.
    pub fn start(client: kube::Client, shutdown: &CancellationToken) -> Self {
        use crate::client::{cache, notified_cache};
        let namespaces = cache(Api::<Namespace>::all(client.clone()), Default::default(), shutdown);
        let pdbs = cache(Api::<PodDisruptionBudget>::all(client.clone()), Default::default(), shutdown);
        let (claims, claims_changed) = notified_cache(Api::all(client.clone()), Default::default(), shutdown);
        let (volumes, volumes_changed) = notified_cache(Api::all(client.clone()), Default::default(), shutdown);
        let (classes, classes_changed) = notified_cache(Api::all(client.clone()), Default::default(), shutdown);
        let (csi_nodes, csi_nodes_changed) = notified_cache(Api::all(client.clone()), Default::default(), shutdown);
        let (attachments, attachments_changed) = notified_cache(Api::all(client.clone()), Default::default(), shutdown);
        let storage = volume_binding::Storage { claims, volumes, classes, csi_nodes, attachments, claims_changed };
        let storage_changed = [volumes_changed, classes_changed, csi_nodes_changed, attachments_changed];
        Handle { client, namespaces, pdbs, storage, storage_changed }
    }

    /// The labels of a namespace, for pod affinity terms with a `namespaceSelector`.
    fn namespace_labels(&self) -> inter_pod_affinity::NamespaceLabels {
        let namespaces = self.namespaces.clone();
        Arc::new(move |ns: &str| namespaces.get(&ObjectRef::new(ns))?.metadata.labels.clone())
    }
}

fn args<T: DeserializeOwned + Default>(args: Option<Value>) -> Result<T, String> {
    match args {
        None => Ok(T::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| e.to_string()),
    }
}

/// Builds the plugin called `name` from its `pluginConfig` args (defaults when `None`). `Ok(None)`
/// for an upstream plugin this cluster leaves out; an error names what is wrong.
pub fn build(name: &str, config: Option<Value>, handle: &Handle) -> Result<Option<Arc<dyn Plugin>>, String> {
    let plugin: Arc<dyn Plugin> = match name {
        "SchedulingGates" => Arc::new(basic::SchedulingGates),
        "PrioritySort" => Arc::new(basic::PrioritySort),
        "NodeUnschedulable" => Arc::new(basic::NodeUnschedulable),
        "NodeName" => Arc::new(basic::NodeName),
        "NodePorts" => Arc::new(basic::NodePorts),
        "TaintToleration" => Arc::new(basic::TaintToleration),
        node_affinity::NAME => Arc::new(node_affinity::NodeAffinity::new(args(config)?)?),
        fit::NAME => Arc::new(fit::Fit::new(args(config)?)?),
        balanced::NAME => Arc::new(balanced::BalancedAllocation::new(args(config)?)?),
        image_locality::NAME => Arc::new(image_locality::ImageLocality),
        inter_pod_affinity::NAME => Arc::new(
            inter_pod_affinity::InterPodAffinity::new(args(config)?)?.with_namespace_labels(handle.namespace_labels()),
        ),
        topology_spread::NAME => Arc::new(topology_spread::PodTopologySpread::new(args(config)?)?),
        volume_binding::NAME => {
            Arc::new(volume_binding::VolumeBinding::new(args(config)?, handle.storage.clone(), handle.client.clone())?)
        }
        volume_restrictions::NAME => {
            Arc::new(volume_restrictions::VolumeRestrictions { claims: handle.storage.claims.clone() })
        }
        node_volume_limits::NAME => Arc::new(node_volume_limits::NodeVolumeLimits::new(handle.storage.clone())),
        default_preemption::NAME => {
            Arc::new(default_preemption::DefaultPreemption::new(args(config)?, handle.pdbs.clone())?)
        }
        "DefaultBinder" => Arc::new(DefaultBinder { client: handle.client.clone() }),
        n if NOT_SERVED.contains(&n) => return Ok(None),
        n => return Err(format!("unknown plugin {n:?}")),
    };
    Ok(Some(plugin))
}

/// QueueingHint for plugins whose Filter looks at one node only: an event helps when the filter now
/// passes on the node it touched. Pods leaving a node count only for plugins that look at the pods
/// on it (`pod_removal`).
pub fn node_hint(p: &dyn Plugin, pod: &PodInfo, event: &ClusterEvent, pod_removal: bool) -> bool {
    match event {
        ClusterEvent::NodeAdded(n) | ClusterEvent::NodeChanged(n) => {
            p.filter(&CycleState::default(), pod, n).is_success()
        }
        ClusterEvent::AssignedPodRemoved { node, .. } if pod_removal => {
            p.filter(&CycleState::default(), pod, node).is_success()
        }
        _ => false,
    }
}

/// Binds through the API's `pods/{name}/binding`, which sets `spec.nodeName` once.
pub struct DefaultBinder {
    client: kube::Client,
}

impl Plugin for DefaultBinder {
    fn name(&self) -> &'static str {
        "DefaultBinder"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Bind]
    }

    fn bind<'a>(&'a self, pod: &'a PodInfo, node: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let binding = Binding {
                metadata: kube::api::ObjectMeta {
                    name: Some(pod.name.clone()),
                    namespace: Some(pod.namespace.clone()),
                    uid: Some(pod.uid.clone()),
                    ..Default::default()
                },
                target: ObjectReference { kind: Some("Node".into()), name: Some(node.into()), ..Default::default() },
            };
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
            // The answer is a Status: only whether it succeeded matters.
            match pods.create_subresource::<_, Value>("binding", &pod.name, &PostParams::default(), &binding).await {
                Ok(_) => Status::success(),
                Err(kube::Error::Api(s)) => Status::error(s.message),
                Err(e) => Status::error(e.to_string()),
            }
        })
    }
}
