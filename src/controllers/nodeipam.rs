//! Node IPAM (kube-controller-manager's `nodeipam` controller with its range allocator): a Node
//! without `spec.podCIDR` gets the next free /24 of `--cluster-cidr` (all of it when that is
//! smaller). What is taken is read from the Nodes themselves, as upstream rebuilds its CIDR set
//! from them at start: a deleted Node's range is free again, and a restart never hands out a range
//! a Node holds. Ranges written but not yet seen in the cache are remembered until they are, so
//! two Nodes made at once never get the same one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::informer::{Cache, Informer};
use super::runtime::{self, Error, Reconciler};
use crate::events::{EventType, ObjectRef as EventObject, Recorder};
use crate::net::Cidr;

/// `--node-cidr-mask-size` for IPv4.
const NODE_MASK: u8 = 24;
/// How soon a Node that found no free range asks again (a Node deleted meanwhile wakes it sooner).
const RETRY: Duration = Duration::from_secs(30);

pub struct NodeIpam {
    client: Client,
    nodes: Cache<Node>,
    recorder: Recorder,
    cluster: Cidr,
    /// Ranges in use that no Node names yet (the in-process agent's, until it registers).
    reserved: Vec<Cidr>,
    state: Mutex<Allocations>,
}

#[derive(Default)]
struct Allocations {
    /// Where the next search starts (upstream's `nextCandidate`), as an index of a range.
    next: u32,
    /// Node name → the range written to it, until the cache shows it.
    pending: HashMap<String, Cidr>,
    /// Nodes told that no range is free (told once until one is).
    waiting: HashSet<String>,
}

/// Starts the controller on the shared node watch. `reserved` are ranges taken outside the API.
pub fn spawn(
    client: &Client,
    nodes: &mut Informer<Node>,
    cluster: Cidr,
    reserved: Vec<Cidr>,
    shutdown: &CancellationToken,
) {
    let waiting = nodes.cache();
    // A Node going away may free a range for one that waits.
    let controller = Controller::for_shared_stream(nodes.subscribe(), nodes.cache()).watches_shared_stream(
        nodes.subscribe(),
        move |_| {
            waiting
                .state()
                .iter()
                .filter(|n| pod_cidr(n).is_none())
                .map(|n| ObjectRef::from_obj(&**n))
                .collect::<Vec<_>>()
        },
    );
    let reconciler = NodeIpam {
        client: client.clone(),
        nodes: nodes.cache(),
        recorder: Recorder::spawn(client.clone(), "cidrAllocator".into(), String::new()),
        cluster: cluster.net(),
        reserved,
        state: Mutex::new(Allocations::default()),
    };
    tokio::spawn(runtime::run(controller, reconciler, shutdown.clone()));
}

fn pod_cidr(node: &Node) -> Option<Cidr> {
    node.spec.as_ref()?.pod_cidr.as_deref()?.parse().ok()
}

/// The ranges of `mask` bits `cluster` holds, and the `i`th of them.
fn range_count(cluster: Cidr, mask: u8) -> u32 {
    1u32.checked_shl(u32::from(mask - cluster.prefix)).unwrap_or(u32::MAX)
}

fn nth(cluster: Cidr, mask: u8, i: u32) -> Cidr {
    let base = u32::from(cluster.network());
    let step = 1u32.checked_shl(32 - u32::from(mask)).unwrap_or(0);
    Cidr { addr: std::net::Ipv4Addr::from(base.wrapping_add(i.wrapping_mul(step))), prefix: mask }
}

/// Two ranges share an address.
fn overlap(a: Cidr, b: Cidr) -> bool {
    a.contains(b.network()) || b.contains(a.network())
}

/// The first range of `cluster` from index `start` on (wrapping) that none of `used` overlaps.
fn free(cluster: Cidr, start: u32, used: &[Cidr]) -> Option<(u32, Cidr)> {
    let mask = NODE_MASK.max(cluster.prefix);
    let count = range_count(cluster, mask);
    (0..count)
        .map(|k| (start.wrapping_add(k)) % count)
        .map(|i| (i, nth(cluster, mask, i)))
        .find(|(_, c)| !used.iter().any(|u| overlap(*u, *c)))
}

impl Reconciler for NodeIpam {
    type Object = Node;
    const NAME: &'static str = "node-ipam";

    async fn reconcile(&self, node: Arc<Node>) -> Result<Action, Error> {
        let name = node.name_any();
        let (index, cidr) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            // Read under the lock: a later reconcile never sees an older cache than an earlier one
            // did, so a range dropped from `pending` below is in the cache it reads.
            let nodes = self.nodes.state();
            state.pending.retain(|n, _| nodes.iter().any(|node| node.name_any() == *n && pod_cidr(node).is_none()));
            state.waiting.retain(|n| nodes.iter().any(|node| node.name_any() == *n));
            if pod_cidr(&node).is_some() || state.pending.contains_key(&name) {
                return Ok(Action::await_change());
            }
            let mut used: Vec<Cidr> = nodes.iter().filter_map(|n| pod_cidr(n)).collect();
            used.extend(state.pending.values().copied());
            used.extend(self.reserved.iter().copied());
            match free(self.cluster, state.next, &used) {
                Some((index, cidr)) => {
                    state.waiting.remove(&name);
                    state.pending.insert(name.clone(), cidr);
                    state.next = index.wrapping_add(1);
                    (index, cidr)
                }
                None => {
                    if state.waiting.insert(name.clone()) {
                        tracing::warn!("node {name}: no free pod range is left in {}", self.cluster);
                        let message = format!("Node {name} status is now: CIDRNotAvailable");
                        self.recorder.record(
                            EventObject::of(&*node),
                            EventType::Normal,
                            "CIDRNotAvailable",
                            "",
                            message,
                        );
                    }
                    return Ok(Action::requeue(RETRY));
                }
            }
        };
        let patch = json!({"spec": {"podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()]}});
        let api: Api<Node> = Api::all(self.client.clone());
        if let Err(e) = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).pending.remove(&name);
            return Err(e.into());
        }
        tracing::info!("node {name}: pod range {cidr} (range {index} of {})", self.cluster);
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_are_handed_out_in_order_skipping_those_in_use() {
        let cluster = cidr("10.42.0.0/16");
        assert_eq!(free(cluster, 0, &[]), Some((0, cidr("10.42.0.0/24"))));
        assert_eq!(free(cluster, 0, &[cidr("10.42.0.0/24"), cidr("10.42.1.0/24")]), Some((2, cidr("10.42.2.0/24"))));
        assert_eq!(free(cluster, 255, &[cidr("10.42.255.0/24")]), Some((0, cidr("10.42.0.0/24"))), "wraps");
        // A range outside the cluster CIDR takes nothing from it; one overlapping two does.
        assert_eq!(free(cluster, 0, &[cidr("10.99.0.0/24")]), Some((0, cidr("10.42.0.0/24"))));
        assert_eq!(free(cluster, 0, &[cidr("10.42.0.0/23")]), Some((2, cidr("10.42.2.0/24"))));
        // A cluster CIDR smaller than a /24 is one range.
        let small = cidr("10.42.0.0/26");
        assert_eq!(free(small, 0, &[]), Some((0, small)));
        assert_eq!(free(small, 0, &[small]), None);
        let full: Vec<Cidr> = (0..4).map(|i| nth(cidr("10.42.0.0/22"), 24, i)).collect();
        assert_eq!(free(cidr("10.42.0.0/22"), 1, &full), None);
    }
}
