//! The EndpointSlice mirroring controller (upstream's `pkg/controller/endpointslicemirroring`): a
//! Service without a selector gets its endpoints from an Endpoints object someone wrote by hand;
//! the proxy and the cluster DNS read slices, so that Endpoints is mirrored into slices managed by
//! `endpointslicemirroring-controller.k8s.io` and owned by the Endpoints (the garbage collector
//! takes them with it). Each subset's `addresses` become ready endpoints, its `notReadyAddresses`
//! unready ones, keeping hostname, nodeName and targetRef; the Endpoints' labels are copied.
//! Nothing is mirrored for a Service with a selector (the EndpointSlice controller serves it),
//! without a Service, or with `endpointslice.kubernetes.io/skip-mirror: "true"`.
//!
//! Left out: IPv6 addresses (cairn's Services are IPv4), upstream's annotation copying.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use kube::api::{Api, ObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use super::endpointslice::{MANAGED_BY_LABEL, PortList, SERVICE_NAME_LABEL, managed, slice_to_service, write};
use super::informer::{Cache, Informer, synced};
use super::ownership::controller_ref;
use super::runtime::{self, Error, Reconciler};

pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Upstream's `--mirroring-max-endpoints-per-subset` default, also the slice size it mirrors into.
const MAX_PER_SUBSET: usize = 1000;

pub struct Mirroring {
    client: Client,
    endpoints: Cache<Endpoints>,
    slices: Cache<EndpointSlice>,
}

/// Starts the controller on the shared Service, Endpoints and slice watches.
pub fn spawn(
    client: &Client,
    services: &mut Informer<Service>,
    endpoints: &mut Informer<Endpoints>,
    slices: &mut Informer<EndpointSlice>,
    shutdown: &CancellationToken,
) {
    let controller = Controller::for_shared_stream(services.subscribe(), services.cache())
        .watches_shared_stream(endpoints.subscribe(), |ep| {
            Some(ObjectRef::<Service>::new(&ep.name_any()).within(&ep.namespace().unwrap_or_default()))
        })
        .watches_shared_stream(slices.subscribe(), slice_to_service(MANAGED_BY));
    let reconciler = Mirroring { client: client.clone(), endpoints: endpoints.cache(), slices: slices.cache() };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// Whether `svc`'s endpoints are written by hand (upstream: a nil selector).
fn mirrored(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(BTreeMap::is_empty)
}

/// `addressToEndpoint`: only `ready` is set, as upstream does.
fn endpoint(address: &EndpointAddress, ready: bool) -> Option<Endpoint> {
    if address.ip.parse::<Ipv4Addr>().is_err() {
        return None;
    }
    Some(Endpoint {
        addresses: vec![address.ip.clone()],
        conditions: Some(EndpointConditions { ready: Some(ready), ..Default::default() }),
        hostname: address.hostname.clone().filter(|h| !h.is_empty()),
        node_name: address.node_name.clone(),
        target_ref: address.target_ref.clone(),
        ..Default::default()
    })
}

/// The endpoints of `ep`'s subsets grouped by their ports, at most [`MAX_PER_SUBSET`] a subset.
fn desired(ep: &Endpoints) -> BTreeMap<Option<PortList>, Vec<Endpoint>> {
    let mut groups: BTreeMap<Option<PortList>, Vec<Endpoint>> = BTreeMap::new();
    for subset in ep.subsets.iter().flatten() {
        let mut ports: PortList = subset
            .ports
            .iter()
            .flatten()
            .map(|p| {
                let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                (p.name.clone().unwrap_or_default(), p.port, protocol, p.app_protocol.clone())
            })
            .collect();
        ports.sort();
        let ready = subset.addresses.iter().flatten().filter_map(|a| endpoint(a, true));
        let unready = subset.not_ready_addresses.iter().flatten().filter_map(|a| endpoint(a, false));
        let mine: Vec<Endpoint> = ready.chain(unready).take(MAX_PER_SUBSET).collect();
        if !mine.is_empty() {
            groups.entry(Some(ports)).or_default().extend(mine);
        }
    }
    groups
}

impl Reconciler for Mirroring {
    type Object = Service;
    const NAME: &'static str = "endpointslicemirroring";

    async fn synced(&self) -> bool {
        synced(&self.endpoints).await && synced(&self.slices).await
    }

    async fn reconcile(&self, svc: Arc<Service>) -> Result<Action, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let existing = managed(&self.slices, &ns, &name, MANAGED_BY);
        let ep = self
            .endpoints
            .get(&ObjectRef::new(&name).within(&ns))
            .filter(|ep| mirrored(&svc) && ep.labels().get(SKIP_MIRROR_LABEL).map(String::as_str) != Some("true"));
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let Some(ep) = ep else {
            // Nothing to mirror: the slices made earlier go.
            write(&api, existing, BTreeMap::new(), ObjectMeta::default(), MAX_PER_SUBSET).await?;
            return Ok(Action::await_change());
        };
        let mut labels = ep.labels().clone();
        labels.remove(SKIP_MIRROR_LABEL);
        labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
        labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        let template = ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: Some(ns.clone()),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref(&*ep)]),
            ..Default::default()
        };
        write(&api, existing, desired(&ep), template, MAX_PER_SUBSET).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn subsets_become_ready_and_unready_endpoints_grouped_by_ports() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "subsets": [
                {"addresses": [{"ip": "192.0.2.10", "hostname": "db-0", "nodeName": "n1"}],
                 "notReadyAddresses": [{"ip": "192.0.2.11"}],
                 "ports": [{"name": "pg", "port": 5432}]},
                {"addresses": [{"ip": "192.0.2.12"}, {"ip": "2001:db8::1"}, {"ip": "not-an-ip"}],
                 "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]},
                {"addresses": [{"ip": "192.0.2.13"}], "ports": [{"port": 53, "protocol": "UDP"}]},
                {"ports": [{"port": 1}]},
            ]
        }))
        .unwrap();
        let groups = desired(&ep);
        let pg = &groups[&Some(vec![("pg".into(), 5432, "TCP".into(), None)])];
        let summary: Vec<(&str, bool)> =
            pg.iter().map(|e| (e.addresses[0].as_str(), e.conditions.as_ref().unwrap().ready.unwrap())).collect();
        assert_eq!(summary, [("192.0.2.10", true), ("192.0.2.11", false), ("192.0.2.12", true)]);
        assert_eq!(pg[0].hostname.as_deref(), Some("db-0"));
        assert_eq!(pg[0].node_name.as_deref(), Some("n1"));
        assert_eq!(pg[0].conditions.as_ref().unwrap().serving, None, "upstream sets only ready");
        assert_eq!(groups[&Some(vec![(String::new(), 53, "UDP".into(), None)])].len(), 1);
        assert_eq!(groups.len(), 2, "a subset without addresses mirrors nothing");
    }

    #[test]
    fn only_services_without_a_selector_are_mirrored() {
        let svc = |spec| serde_json::from_value::<Service>(json!({"metadata": {"name": "s"}, "spec": spec})).unwrap();
        assert!(mirrored(&svc(json!({"ports": [{"port": 80}]}))));
        assert!(mirrored(&svc(json!({"selector": {}}))));
        assert!(!mirrored(&svc(json!({"selector": {"app": "web"}}))));
    }
}
