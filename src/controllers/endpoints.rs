//! The Endpoints controller (upstream's `pkg/controller/endpoint`): for each Service with a
//! selector, an Endpoints object of the same name listing the selected pods' addresses, ready or
//! not, with the Service's ports resolved per pod. Also what it shares with the EndpointSlice
//! controller (`endpointslice.rs`): which pods a Service selects, how a port is resolved, and the
//! pod → Services trigger.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer, synced};
use super::pods::is_ready;
use super::runtime::{self, Error, Reconciler};

/// Upstream's `maxCapacity`: addresses an Endpoints object holds at most.
const MAX_ADDRESSES: usize = 1000;
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// The label marking headless Services' endpoints (`v1.IsHeadlessService`).
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Endpoints kept by someone else (leader election records) are never deleted.
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// The Service's selector, when it has one: Services without are someone else's to fill.
pub(super) fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

pub(super) fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

pub(super) fn publishes_not_ready(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses) == Some(true)
}

/// The pods of the Service's namespace its selector picks.
pub(super) fn selected_pods(svc: &Service, pods: &Cache<Pod>) -> Vec<Arc<Pod>> {
    let Some(sel) = selector(svc) else { return Vec::new() };
    let ns = svc.namespace();
    let mut found: Vec<Arc<Pod>> = pods
        .state()
        .into_iter()
        .filter(|p| p.namespace() == ns && sel.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
        .collect();
    found.sort_by_key(|p| p.name_any());
    found
}

/// `ShouldPodBeInEndpoints`: not finished, has an address, and (unless terminating pods are
/// wanted) not being deleted.
pub(super) fn pod_ip(pod: &Pod, include_terminating: bool) -> Option<String> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    status.pod_ip.clone().filter(|ip| !ip.is_empty())
}

/// `FindPort`: a target port by number, or the pod's container port of that name and protocol.
pub(super) fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    match port.target_port.as_ref() {
        None => Some(port.port),
        Some(IntOrString::Int(p)) => Some(*p),
        Some(IntOrString::String(name)) => {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let spec = pod.spec.as_ref()?;
            spec.containers.iter().flat_map(|c| c.ports.iter().flatten()).find_map(|p| {
                (p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
                    .then_some(p.container_port)
            })
        }
    }
}

/// `ShouldSetHostname`: the pod's hostname, when its subdomain is this Service.
pub(super) fn hostname(pod: &Pod, svc: &Service) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let hostname = spec.hostname.clone().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == svc.metadata.name.as_deref() && pod.namespace() == svc.namespace())
        .then_some(hostname)
}

pub(super) fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.namespace(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The labels of what a controller makes for `svc`: the Service's own, plus the headless mark.
pub(super) fn derived_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.labels().clone();
    if is_headless(svc) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    } else {
        labels.remove(HEADLESS_LABEL);
    }
    labels
}

type ServiceRefs = Vec<ObjectRef<Service>>;

/// The trigger from a pod's change to the Services it concerns: those selecting it now, and those
/// that selected it at its previous change (its labels may have moved away from them).
pub(super) fn pod_to_services(
    services: Cache<Service>,
) -> impl Fn(Arc<Pod>) -> Vec<ObjectRef<Service>> + Send + 'static {
    let last: Mutex<HashMap<(String, String), ServiceRefs>> = Mutex::new(HashMap::new());
    move |pod| {
        let ns = pod.namespace().unwrap_or_default();
        let now: Vec<ObjectRef<Service>> = services
            .state()
            .iter()
            .filter(|s| s.namespace().as_deref() == Some(&ns))
            .filter(|s| selector(s).is_some_and(|sel| sel.iter().all(|(k, v)| pod.labels().get(k) == Some(v))))
            .map(|s| ObjectRef::from_obj(&**s))
            .collect();
        let key = (ns, pod.name_any());
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = if pod.metadata.deletion_timestamp.is_some() && pod.status.is_none() {
            last.remove(&key).unwrap_or_default()
        } else {
            last.insert(key, now.clone()).unwrap_or_default()
        };
        all.extend(now);
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.dedup();
        all
    }
}

pub struct EndpointsController {
    client: Client,
    pods: Cache<Pod>,
    endpoints: Cache<Endpoints>,
}

/// Starts the controller on the shared Service and pod watches, with its own watch of Endpoints.
pub fn spawn(
    client: &Client,
    services: &mut Informer<Service>,
    pods: &mut Informer<Pod>,
    endpoints: &mut Informer<Endpoints>,
    shutdown: &CancellationToken,
) {
    let controller = Controller::for_shared_stream(services.subscribe(), services.cache())
        .watches_shared_stream(pods.subscribe(), pod_to_services(services.cache()))
        .watches_shared_stream(endpoints.subscribe(), |ep| {
            Some(ObjectRef::<Service>::new(&ep.name_any()).within(&ep.namespace().unwrap_or_default()))
        });
    let reconciler = EndpointsController { client: client.clone(), pods: pods.cache(), endpoints: endpoints.cache() };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
    tokio::spawn(sweep_leftovers(client.clone(), services.subscribe(), services.cache(), endpoints.cache()));
}

/// Deletes the Endpoints of Services that are gone (upstream's `syncService` for a missing Service,
/// and `checkLeftoverEndpoints` at start).
async fn sweep_leftovers(
    client: Client,
    changes: impl futures::Stream<Item = Arc<Service>> + Send + 'static,
    services: Cache<Service>,
    endpoints: Cache<Endpoints>,
) {
    use futures::StreamExt as _;
    if !synced(&services).await || !synced(&endpoints).await {
        return;
    }
    let gone = |ep: &Endpoints| {
        services.get(&ObjectRef::new(&ep.name_any()).within(&ep.namespace().unwrap_or_default())).is_none()
            && !ep.annotations().contains_key(LEADER_ANNOTATION)
    };
    for ep in endpoints.state().iter().filter(|e| gone(e)) {
        delete_endpoints(&client, ep).await;
    }
    let mut changes = std::pin::pin!(changes);
    while let Some(svc) = changes.next().await {
        let key = ObjectRef::new(&svc.name_any()).within(&svc.namespace().unwrap_or_default());
        if services.get(&key).is_none()
            && let Some(ep) =
                endpoints.get(&ObjectRef::new(&svc.name_any()).within(&svc.namespace().unwrap_or_default()))
            && gone(&ep)
        {
            delete_endpoints(&client, &ep).await;
        }
    }
}

async fn delete_endpoints(client: &Client, ep: &Endpoints) {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), &ep.namespace().unwrap_or_default());
    match api.delete(&ep.name_any(), &DeleteParams::default()).await {
        Ok(_) => tracing::debug!(
            "deleted endpoints {}/{} of a service that is gone",
            ep.namespace().unwrap_or_default(),
            ep.name_any()
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!("deleting endpoints {}: {e}", ep.name_any()),
    }
}

/// The subsets of a Service's Endpoints (`syncService` then `RepackSubsets`): addresses grouped by
/// the ports they have, sorted.
fn subsets(svc: &Service, pods: &[Arc<Pod>]) -> (Vec<EndpointSubset>, bool) {
    let tolerate = publishes_not_ready(svc);
    let ports: &[ServicePort] = svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or(&[]);
    // address (ip, ready) → its ports
    let mut by_address: BTreeMap<(String, bool), (EndpointAddress, BTreeSet<PortKey>)> = BTreeMap::new();
    for pod in pods {
        let Some(ip) = pod_ip(pod, tolerate) else { continue };
        let address = EndpointAddress {
            ip: ip.clone(),
            hostname: hostname(pod, svc),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(pod_ref(pod)),
        };
        let ready = tolerate || is_ready(pod);
        let mut found = BTreeSet::new();
        for port in ports {
            if let Some(number) = find_port(pod, port) {
                found.insert(PortKey {
                    name: port.name.clone().unwrap_or_default(),
                    port: number,
                    protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    app_protocol: port.app_protocol.clone(),
                });
            }
        }
        if !ports.is_empty() && found.is_empty() {
            continue;
        }
        by_address.insert((ip, ready), (address, found));
    }
    let mut groups: BTreeMap<BTreeSet<PortKey>, (Vec<EndpointAddress>, Vec<EndpointAddress>)> = BTreeMap::new();
    let truncated = by_address.len() > MAX_ADDRESSES;
    for ((_, ready), (address, ports)) in by_address.into_iter().take(MAX_ADDRESSES) {
        let group = groups.entry(ports).or_default();
        if ready { group.0.push(address) } else { group.1.push(address) }
    }
    let subsets = groups
        .into_iter()
        .map(|(ports, (ready, not_ready))| EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: (!ports.is_empty()).then(|| ports.into_iter().map(PortKey::into_port).collect()),
        })
        .collect();
    (subsets, truncated)
}

/// A resolved port, ordered so that groups and their ports come out sorted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PortKey {
    name: String,
    port: i32,
    protocol: String,
    app_protocol: Option<String>,
}

impl PortKey {
    fn into_port(self) -> EndpointPort {
        EndpointPort {
            name: (!self.name.is_empty()).then_some(self.name),
            port: self.port,
            protocol: Some(self.protocol),
            app_protocol: self.app_protocol,
        }
    }
}

impl Reconciler for EndpointsController {
    type Object = Service;
    const NAME: &'static str = "endpoints";

    async fn synced(&self) -> bool {
        synced(&self.pods).await && synced(&self.endpoints).await
    }

    async fn reconcile(&self, svc: Arc<Service>) -> Result<Action, Error> {
        if selector(&svc).is_none() {
            return Ok(Action::await_change());
        }
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let pods = selected_pods(&svc, &self.pods);
        let (subsets, truncated) = subsets(&svc, &pods);
        let subsets = (!subsets.is_empty()).then_some(subsets);
        let current = self.endpoints.get(&ObjectRef::new(&name).within(&ns));
        let labels = derived_labels(&svc);
        let mut annotations = current.as_ref().map(|c| c.annotations().clone()).unwrap_or_default();
        if truncated {
            annotations.insert(OVER_CAPACITY.into(), "truncated".into());
        } else {
            annotations.remove(OVER_CAPACITY);
        }
        if let Some(c) = &current
            && c.subsets == subsets
            && *c.labels() == labels
            && *c.annotations() == annotations
        {
            return Ok(Action::await_change());
        }
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
        let wanted = Endpoints {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                resource_version: current.as_ref().and_then(|c| c.resource_version()),
                ..Default::default()
            },
            subsets,
        };
        match current {
            Some(_) => api.replace(&name, &PostParams::default(), &wanted).await?,
            None => match api.create(&PostParams::default(), &wanted).await {
                // Made meanwhile; the watch brings it, and the next pass compares.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Ok(Action::requeue(std::time::Duration::from_millis(50)));
                }
                other => other?,
            },
        };
        Ok(Action::await_change())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;

    pub fn pod(name: &str, ip: &str, ready: bool, extra: serde_json::Value) -> Arc<Pod> {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox",
                "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        });
        json_merge(&mut v, extra);
        Arc::new(serde_json::from_value(v).unwrap())
    }

    pub fn service(spec: serde_json::Value) -> Service {
        let mut v = json!({"metadata": {"name": "web", "namespace": "default", "uid": "svc-uid"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
        json_merge(&mut v["spec"], spec);
        serde_json::from_value(v).unwrap()
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn ready_and_unready_pods_with_their_named_ports() {
        let svc = service(json!({}));
        let pods = [
            pod("a", "10.42.0.6", true, json!({})),
            pod("b", "10.42.0.5", false, json!({})),
            pod("done", "10.42.0.7", true, json!({"status": {"phase": "Succeeded"}})),
            pod("going", "10.42.0.8", true, json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            pod("noip", "", true, json!({})),
        ];
        let (subsets, truncated) = subsets(&svc, &pods);
        assert!(!truncated);
        assert_eq!(subsets.len(), 1);
        let s = &subsets[0];
        assert_eq!(s.addresses.as_ref().unwrap().iter().map(|a| a.ip.as_str()).collect::<Vec<_>>(), ["10.42.0.6"]);
        assert_eq!(s.not_ready_addresses.as_ref().unwrap()[0].ip, "10.42.0.5");
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(s.addresses.as_ref().unwrap()[0].target_ref.as_ref().unwrap().name.as_deref(), Some("a"));
    }

    #[test]
    fn a_pod_without_the_named_port_is_left_out_and_hostnames_follow_the_subdomain() {
        let svc = service(json!({"clusterIP": "None", "publishNotReadyAddresses": true}));
        let pods = [
            pod("a", "10.42.0.5", false, json!({"spec": {"hostname": "a", "subdomain": "web"}})),
            pod("b", "10.42.0.6", true, json!({"spec": {"containers": [{"name": "c", "image": "x"}]}})),
        ];
        let (subsets, _) = subsets(&svc, &pods);
        assert_eq!(subsets.len(), 1);
        let addrs = subsets[0].addresses.as_ref().unwrap();
        assert_eq!(addrs.len(), 1);
        assert_eq!(addrs[0].hostname.as_deref(), Some("a"));
        assert!(derived_labels(&svc).contains_key(HEADLESS_LABEL));
    }
}
