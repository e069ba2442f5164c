//! The built-in load balancer (k3s's ServiceLB, without its helper pods): a LoadBalancer Service
//! with no `loadBalancerClass` gets the addresses of the Ready, schedulable nodes as
//! `status.loadBalancer.ingress` (each node's ExternalIP, else its InternalIP), and every node's
//! proxy answers on them. As with ServiceLB, a port is one Service's on a node address: a Service
//! asking for a port and protocol an older LoadBalancer Service already has stays `<pending>`.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::runtime::{self, Error, Reconciler};

pub struct ServiceLb {
    client: Client,
    services: Cache<Service>,
    nodes: Cache<Node>,
}

/// Starts the controller on the shared Service and node watches.
pub fn spawn(
    client: &Client,
    services: &mut Informer<Service>,
    nodes: &mut Informer<Node>,
    shutdown: &CancellationToken,
) {
    let all = services.cache();
    let for_services = services.cache();
    let controller = Controller::for_shared_stream(services.subscribe(), services.cache())
        // A node coming or going changes every Service's addresses.
        .watches_shared_stream(nodes.subscribe(), move |_node| {
            balanced(&all).map(|s| ObjectRef::from_obj(&*s)).collect::<Vec<_>>()
        })
        // A Service going away may free its ports for a pending one.
        .watches_shared_stream(services.subscribe(), move |_svc| {
            balanced(&for_services).map(|s| ObjectRef::from_obj(&*s)).collect::<Vec<_>>()
        });
    let reconciler = ServiceLb { client: client.clone(), services: services.cache(), nodes: nodes.cache() };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// Whether this balancer serves the Service.
fn served(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none())
        && svc.metadata.deletion_timestamp.is_none()
}

fn balanced(services: &Cache<Service>) -> impl Iterator<Item = Arc<Service>> {
    services.state().into_iter().filter(|s| served(s))
}

fn ports(svc: &Service) -> BTreeSet<(i32, String)> {
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
    ports.into_iter().flatten().map(|p| (p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into()))).collect()
}

/// The address a node is reached at from outside: its ExternalIP, else its InternalIP.
fn node_address(node: &Node) -> Option<String> {
    let status = node.status.as_ref()?;
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let schedulable = node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
    if !ready || !schedulable {
        return None;
    }
    let addresses = status.addresses.as_ref()?;
    let of = |ty: &str| addresses.iter().find(|a| a.type_ == ty).map(|a| a.address.clone());
    of("ExternalIP").or_else(|| of("InternalIP"))
}

impl Reconciler for ServiceLb {
    type Object = Service;
    const NAME: &'static str = "service-lb";

    async fn synced(&self) -> bool {
        synced(&self.nodes).await && synced(&self.services).await
    }

    async fn reconcile(&self, svc: Arc<Service>) -> Result<Action, Error> {
        if !served(&svc) {
            return Ok(Action::await_change());
        }
        // Older Services (then by name) keep their ports.
        let key = |s: &Service| (s.metadata.creation_timestamp.clone().map(|t| t.0), s.namespace(), s.name_any());
        let mine = ports(&svc);
        let taken = balanced(&self.services)
            .filter(|o| o.uid() != svc.uid() && key(o) < key(&svc))
            .any(|o| !ports(&o).is_disjoint(&mine));
        let mut ips: Vec<String> =
            if taken { Vec::new() } else { self.nodes.state().iter().filter_map(|n| node_address(n)).collect() };
        ips.sort();
        ips.dedup();
        let ingress: Vec<LoadBalancerIngress> = ips
            .into_iter()
            .map(|ip| LoadBalancerIngress { ip: Some(ip), ip_mode: Some("VIP".into()), ..Default::default() })
            .collect();
        let wanted = LoadBalancerStatus { ingress: (!ingress.is_empty()).then_some(ingress) };
        let current = svc.status.as_ref().and_then(|s| s.load_balancer.clone()).unwrap_or_default();
        if current == wanted {
            return Ok(Action::await_change());
        }
        let api: Api<Service> = Api::namespaced(self.client.clone(), &svc.namespace().unwrap_or_default());
        // An explicit null takes the addresses away when there are none any more.
        let patch = json!({"metadata": {"uid": svc.uid()}, "status": {"loadBalancer": {"ingress": wanted.ingress}}});
        api.patch_status(&svc.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_schedulable_node_is_reached_at_its_external_address_first() {
        let node = |ready: &str, unschedulable: bool, addresses: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": unschedulable},
                "status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addresses}}))
            .unwrap()
        };
        let internal = json!([{"type": "InternalIP", "address": "192.0.2.1"}]);
        let both =
            json!([{"type": "InternalIP", "address": "192.0.2.1"}, {"type": "ExternalIP", "address": "198.51.100.1"}]);
        assert_eq!(node_address(&node("True", false, internal.clone())).as_deref(), Some("192.0.2.1"));
        assert_eq!(node_address(&node("True", false, both)).as_deref(), Some("198.51.100.1"));
        assert_eq!(node_address(&node("False", false, internal.clone())), None);
        assert_eq!(node_address(&node("True", true, internal)), None);
    }
}
