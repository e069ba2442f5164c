//! The EndpointSlice controller (upstream's `pkg/controller/endpointslice`): for each Service with
//! a selector, `discovery.k8s.io/v1` slices of at most 100 endpoints, one set per list of resolved
//! ports, owned by the Service. Endpoints carry upstream's conditions: `serving` is the pod's
//! readiness, `terminating` its deletion, `ready` serving and not terminating (or always, with
//! `publishNotReadyAddresses`). A Service selecting nothing keeps one empty placeholder slice.
//! Writes go creates and updates first, deletes last, so a Service never shows no endpoints
//! between two states that both have some.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use super::endpoints::{
    derived_labels, find_port, hostname, pod_ip, pod_ref, pod_to_services, publishes_not_ready, selected_pods, selector,
};
use super::informer::{Cache, Informer, synced};
use super::ownership::{controlled_by, controller_ref};
use super::pods::is_ready;
use super::runtime::{self, Error, Reconciler};

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Upstream's `--max-endpoints-per-slice` default.
const MAX_PER_SLICE: usize = 100;

pub struct EndpointSlices {
    client: Client,
    pods: Cache<Pod>,
    slices: Cache<EndpointSlice>,
}

/// Starts the controller on the shared Service, pod and slice watches.
pub fn spawn(
    client: &Client,
    services: &mut Informer<Service>,
    pods: &mut Informer<Pod>,
    slices: &mut Informer<EndpointSlice>,
    shutdown: &CancellationToken,
) {
    let controller = Controller::for_shared_stream(services.subscribe(), services.cache())
        .watches_shared_stream(pods.subscribe(), pod_to_services(services.cache()))
        .watches_shared_stream(slices.subscribe(), slice_to_service(MANAGED_BY));
    let reconciler = EndpointSlices { client: client.clone(), pods: pods.cache(), slices: slices.cache() };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

/// `podToEndpoint`.
fn endpoint(pod: &Pod, svc: &Service, ip: String) -> Endpoint {
    let serving = publishes_not_ready(svc) || is_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(publishes_not_ready(svc) || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: hostname(pod, svc),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        target_ref: Some(pod_ref(pod)),
        ..Default::default()
    }
}

/// A slice's ports as (name, port, protocol, appProtocol), sorted: the key slices are grouped by.
pub(super) type PortList = Vec<(String, i32, String, Option<String>)>;

fn to_ports(list: &PortList) -> Option<Vec<EndpointPort>> {
    Some(
        list.iter()
            .map(|(name, port, protocol, app)| EndpointPort {
                name: Some(name.clone()),
                port: Some(*port),
                protocol: Some(protocol.clone()),
                app_protocol: app.clone(),
            })
            .collect(),
    )
}

fn port_list(ports: Option<&Vec<EndpointPort>>) -> Option<PortList> {
    ports.map(|ports| {
        let mut list: PortList = ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.port.unwrap_or(0),
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.app_protocol.clone(),
                )
            })
            .collect();
        list.sort();
        list
    })
}

/// The endpoints a Service wants, grouped by their resolved ports (`None`: the placeholder).
fn desired(svc: &Service, pods: &[Arc<Pod>]) -> BTreeMap<Option<PortList>, Vec<Endpoint>> {
    let ports = svc.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
    let mut groups: BTreeMap<Option<PortList>, Vec<Endpoint>> = BTreeMap::new();
    for pod in pods {
        let Some(ip) = pod_ip(pod, true) else { continue };
        let mut list: PortList = ports
            .iter()
            .filter_map(|p| {
                let number = find_port(pod, p)?;
                Some((
                    p.name.clone().unwrap_or_default(),
                    number,
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.app_protocol.clone(),
                ))
            })
            .collect();
        list.sort();
        groups.entry(Some(list)).or_default().push(endpoint(pod, svc, ip));
    }
    for endpoints in groups.values_mut() {
        endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    }
    if groups.is_empty() {
        groups.insert(None, Vec::new());
    }
    groups
}

impl Reconciler for EndpointSlices {
    type Object = Service;
    const NAME: &'static str = "endpointslice";

    async fn synced(&self) -> bool {
        synced(&self.pods).await && synced(&self.slices).await
    }

    async fn reconcile(&self, svc: Arc<Service>) -> Result<Action, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let uid = svc.uid().unwrap_or_default();
        let existing = managed(&self.slices, &ns, &name, MANAGED_BY);
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        if selector(&svc).is_none() {
            // An ExternalName Service, or one whose selector was removed: its slices go.
            for s in existing.iter().filter(|s| controlled_by(&s.metadata, &uid)) {
                delete(&api, s).await?;
            }
            return Ok(Action::await_change());
        }
        let mut labels = derived_labels(&svc);
        labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
        labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        let template = ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: Some(ns.clone()),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref(&*svc)]),
            ..Default::default()
        };
        let desired = desired(&svc, &selected_pods(&svc, &self.pods));
        write(&api, existing, desired, template, MAX_PER_SLICE).await?;
        Ok(Action::await_change())
    }
}

/// The slices of Service `ns/name` that `manager` manages, by name.
pub(super) fn managed(slices: &Cache<EndpointSlice>, ns: &str, name: &str, manager: &str) -> Vec<Arc<EndpointSlice>> {
    let mut found: Vec<Arc<EndpointSlice>> = slices
        .state()
        .into_iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(ns)
                && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
                && s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(manager)
        })
        .collect();
    found.sort_by_key(|s| s.name_any());
    found
}

/// The Service a slice managed by `manager` belongs to.
pub(super) fn slice_to_service(manager: &'static str) -> impl Fn(Arc<EndpointSlice>) -> Option<ObjectRef<Service>> {
    move |s| {
        let labels = s.labels();
        (labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(manager))
            .then(|| labels.get(SERVICE_NAME_LABEL))
            .flatten()
            .map(|svc| ObjectRef::<Service>::new(svc).within(&s.namespace().unwrap_or_default()))
    }
}

/// Brings a Service's `existing` slices to `desired` (endpoints grouped by their ports, at most
/// `max` to a slice; the `None` group is the empty placeholder), each slice with `template`'s
/// metadata: slices are reused for the same ports, then for any, creates and updates go first,
/// deletes last.
pub(super) async fn write(
    api: &Api<EndpointSlice>,
    existing: Vec<Arc<EndpointSlice>>,
    desired: BTreeMap<Option<PortList>, Vec<Endpoint>>,
    template: ObjectMeta,
    max: usize,
) -> Result<(), Error> {
    let labels = template.labels.clone().unwrap_or_default();
    // Existing slices by their ports, for reuse.
    let mut reusable: BTreeMap<Option<PortList>, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    for s in existing {
        let endpoints_empty = s.endpoints.as_ref().is_none_or(Vec::is_empty);
        let key =
            if endpoints_empty && s.ports.is_none() { None } else { port_list(s.ports.as_ref()).or(Some(Vec::new())) };
        reusable.entry(key).or_default().push(s);
    }
    // Slices whose ports no group has any more are reused before new ones are made.
    let mut pool: Vec<Arc<EndpointSlice>> = Vec::new();
    reusable.retain(|ports, slices| {
        let keep = desired.contains_key(ports);
        if !keep {
            pool.append(slices);
        }
        keep
    });
    for (ports, endpoints) in desired {
        let chunks: Vec<Vec<Endpoint>> = if endpoints.is_empty() {
            vec![Vec::new()]
        } else {
            endpoints.chunks(max).map(<[Endpoint]>::to_vec).collect()
        };
        let mut mine = reusable.remove(&ports).unwrap_or_default().into_iter();
        for chunk in chunks {
            let wanted = EndpointSlice {
                metadata: template.clone(),
                address_type: "IPv4".into(),
                endpoints: Some(chunk),
                ports: ports.as_ref().and_then(to_ports),
            };
            match mine.next().or_else(|| pool.pop()) {
                Some(current) => {
                    let same = current.endpoints.clone().unwrap_or_default()
                        == wanted.endpoints.clone().unwrap_or_default()
                        && port_list(current.ports.as_ref()) == port_list(wanted.ports.as_ref())
                        && current.labels() == &labels
                        && current.metadata.owner_references == wanted.metadata.owner_references;
                    if !same {
                        let mut replaced = wanted;
                        replaced.metadata.name = current.metadata.name.clone();
                        replaced.metadata.generate_name = current.metadata.generate_name.clone();
                        replaced.metadata.resource_version = current.resource_version();
                        api.replace(&current.name_any(), &PostParams::default(), &replaced).await?;
                    }
                }
                None => {
                    api.create(&PostParams::default(), &wanted).await?;
                }
            }
        }
        for extra in mine {
            delete(api, &extra).await?;
        }
    }
    for s in pool.iter().chain(reusable.values().flatten()) {
        delete(api, s).await?;
    }
    Ok(())
}

async fn delete(api: &Api<EndpointSlice>, s: &EndpointSlice) -> Result<(), Error> {
    match api.delete(&s.name_any(), &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::endpoints::tests::{pod, service};
    use super::*;

    #[test]
    fn conditions_follow_readiness_and_deletion() {
        let svc = service(json!({}));
        let pods = [
            pod("a", "10.42.0.5", true, json!({})),
            pod("b", "10.42.0.6", false, json!({})),
            pod("c", "10.42.0.7", true, json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            pod("d", "10.42.0.8", true, json!({"status": {"phase": "Failed"}})),
        ];
        let groups = desired(&svc, &pods);
        assert_eq!(groups.len(), 1);
        let (ports, endpoints) = groups.into_iter().next().unwrap();
        assert_eq!(ports.unwrap(), vec![("http".to_string(), 8080, "TCP".to_string(), None)]);
        let conds: Vec<(bool, bool, bool)> = endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap();
                (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
            })
            .collect();
        assert_eq!(conds, [(true, true, false), (false, false, false), (false, true, true)]);
    }

    #[test]
    fn pods_with_different_ports_get_different_slices_and_nothing_gets_a_placeholder() {
        let svc = service(json!({}));
        let pods = [
            pod("a", "10.42.0.5", true, json!({})),
            pod(
                "b",
                "10.42.0.6",
                true,
                json!({"spec": {"containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 9090}]}]}}),
            ),
        ];
        assert_eq!(desired(&svc, &pods).len(), 2);
        let empty = desired(&svc, &[]);
        assert_eq!(empty.len(), 1);
        assert!(empty.contains_key(&None));
        let ready_anyway = service(json!({"publishNotReadyAddresses": true}));
        let e = &desired(&ready_anyway, &[pod("b", "10.42.0.6", false, json!({}))]).into_values().next().unwrap()[0];
        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(true));
    }
}
