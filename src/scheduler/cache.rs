//! The scheduler cache: every node with the pods bound or assumed to it, and the per-cycle
//! snapshot taken from it.
//!
//! Node entries are `Arc`s shared with the snapshot; a change clones the one node it touches
//! (copy on write) and marks it dirty, so refreshing the snapshot costs only what changed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::types::{NodeFacts, NodeInfo, PodInfo};

/// A pod the cache accounts on a node.
struct CachedPod {
    pod: Arc<PodInfo>,
    /// Placed by this scheduler and not yet seen bound through the watch.
    assumed: bool,
}

struct NodeEntry {
    info: Arc<NodeInfo>,
    /// False while only pods refer to the node (its object is gone or not yet seen).
    exists: bool,
}

#[derive(Default)]
pub struct Cache {
    nodes: HashMap<String, NodeEntry>,
    pods: HashMap<String, CachedPod>,
    /// Nodes changed since the last snapshot.
    dirty: HashSet<String>,
    /// A node was added or removed since the last snapshot.
    membership_changed: bool,
}

/// The nodes one scheduling cycle sees, in a stable order.
#[derive(Default)]
pub struct Snapshot {
    pub nodes: Vec<Arc<NodeInfo>>,
    index: HashMap<String, usize>,
}

impl Snapshot {
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }
}

/// The outcome of a change: the node it touched as it is now, for queueing hints.
pub type Touched = Option<Arc<NodeInfo>>;

impl Cache {
    fn entry(&mut self, name: &str) -> &mut NodeEntry {
        self.nodes.entry(name.to_string()).or_insert_with(|| NodeEntry {
            info: Arc::new(NodeInfo::new(NodeFacts { name: name.to_string(), ..Default::default() })),
            exists: false,
        })
    }

    /// Adds or updates a node. Returns the node and whether it is new, or `None` when nothing the
    /// scheduler looks at changed.
    pub fn upsert_node(&mut self, facts: NodeFacts) -> Option<(Arc<NodeInfo>, bool)> {
        let name = facts.name.clone();
        let e = self.entry(&name);
        let added = !e.exists;
        if !added && e.info.node == facts {
            return None;
        }
        e.exists = true;
        Arc::make_mut(&mut e.info).node = facts;
        let info = e.info.clone();
        self.dirty.insert(name);
        self.membership_changed |= added;
        Some((info, added))
    }

    /// Removes a node; its pods stay accounted until they go. Returns its last state.
    pub fn remove_node(&mut self, name: &str) -> Option<Arc<NodeInfo>> {
        let e = self.nodes.get_mut(name)?;
        let last = e.info.clone();
        if e.info.pods.is_empty() {
            self.nodes.remove(name);
        } else {
            e.exists = false;
        }
        self.dirty.insert(name.to_string());
        self.membership_changed = true;
        Some(last)
    }

    /// Accounts a bound pod as seen through the watch, confirming it if it was assumed. Returns the
    /// node it is on when that is news (not a confirmation of an unchanged assumed pod).
    pub fn upsert_pod(&mut self, pod: Arc<PodInfo>) -> Touched {
        if let Some(old) = self.pods.get(&pod.uid) {
            let same_place = old.pod.node_name == pod.node_name;
            let unchanged = same_place && old.pod.labels == pod.labels && old.pod.requests == pod.requests;
            if old.assumed && unchanged {
                let uid = pod.uid.clone();
                self.pods.insert(uid, CachedPod { pod, assumed: false });
                return None;
            }
            if !old.assumed && *old.pod == *pod {
                return None;
            }
            self.remove_pod(&pod.uid);
        }
        let node = pod.node_name.clone();
        self.pods.insert(pod.uid.clone(), CachedPod { pod: pod.clone(), assumed: false });
        Some(self.add_to_node(&node, pod))
    }

    fn add_to_node(&mut self, node: &str, pod: Arc<PodInfo>) -> Arc<NodeInfo> {
        let e = self.entry(node);
        Arc::make_mut(&mut e.info).add_pod(pod);
        let info = e.info.clone();
        self.dirty.insert(node.to_string());
        info
    }

    /// Removes a pod (deleted, finished, or an assumption forgotten). Returns it with its node.
    pub fn remove_pod(&mut self, uid: &str) -> Option<(Arc<PodInfo>, Arc<NodeInfo>)> {
        let cached = self.pods.remove(uid)?;
        let name = cached.pod.node_name.clone();
        let e = self.nodes.get_mut(&name)?;
        Arc::make_mut(&mut e.info).remove_pod(uid);
        let info = e.info.clone();
        if !e.exists && info.pods.is_empty() {
            self.nodes.remove(&name);
        }
        self.dirty.insert(name);
        Some((cached.pod, info))
    }

    /// Accounts `pod` on `node` before it is bound (upstream's AssumePod). `None` when the cache
    /// already has the pod: it was bound meanwhile (by someone else) or is assumed already.
    pub fn assume(&mut self, pod: &PodInfo, node: &str) -> Option<Arc<PodInfo>> {
        if self.pods.contains_key(&pod.uid) {
            return None;
        }
        let placed = Arc::new(pod.on_node(node));
        self.pods.insert(pod.uid.clone(), CachedPod { pod: placed.clone(), assumed: true });
        self.add_to_node(node, placed.clone());
        Some(placed)
    }

    /// Drops an assumption after a failed reserve, permit or bind (upstream's ForgetPod). A pod
    /// already confirmed by the watch stays.
    pub fn forget(&mut self, uid: &str) -> Option<(Arc<PodInfo>, Arc<NodeInfo>)> {
        if self.pods.get(uid).is_some_and(|p| p.assumed) { self.remove_pod(uid) } else { None }
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|p| p.assumed)
    }

    /// Names of the nodes with a Node object.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().filter(|(_, e)| e.exists).map(|(n, _)| n.as_str())
    }

    /// Number of nodes with a Node object.
    pub fn node_count(&self) -> usize {
        self.nodes.values().filter(|e| e.exists).count()
    }

    /// Brings `snap` up to date: replaces the nodes that changed; rebuilds the order when nodes
    /// came or went.
    pub fn update_snapshot(&mut self, snap: &mut Snapshot) {
        if self.membership_changed {
            let mut nodes: Vec<Arc<NodeInfo>> =
                self.nodes.values().filter(|e| e.exists).map(|e| e.info.clone()).collect();
            nodes.sort_by(|a, b| a.name().cmp(b.name()));
            snap.index = nodes.iter().enumerate().map(|(i, n)| (n.name().to_string(), i)).collect();
            snap.nodes = nodes;
            self.membership_changed = false;
        } else {
            for name in &self.dirty {
                if let (Some(&i), Some(e)) = (snap.index.get(name), self.nodes.get(name)) {
                    snap.nodes[i] = e.info.clone();
                }
            }
        }
        self.dirty.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::types::Resources;

    fn facts(name: &str, cpu: i64) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            allocatable: Resources { milli_cpu: cpu, pods: 110, ..Default::default() },
            ..Default::default()
        }
    }

    fn pod(uid: &str, node: &str, cpu: i64) -> Arc<PodInfo> {
        Arc::new(PodInfo {
            uid: uid.into(),
            node_name: node.into(),
            requests: Resources { milli_cpu: cpu, ..Default::default() },
            ..Default::default()
        })
    }

    #[test]
    fn snapshot_follows_nodes_and_pods() {
        let mut c = Cache::default();
        let mut snap = Snapshot::default();
        c.upsert_node(facts("b", 1000));
        c.upsert_node(facts("a", 1000));
        c.update_snapshot(&mut snap);
        assert_eq!(snap.nodes.iter().map(|n| n.name()).collect::<Vec<_>>(), ["a", "b"]);
        let before = snap.nodes[1].clone();

        c.upsert_pod(pod("p1", "b", 300));
        c.update_snapshot(&mut snap);
        assert_eq!(snap.get("b").unwrap().requested.milli_cpu, 300);
        // The snapshot taken before is untouched (copy on write).
        assert_eq!(before.requested.milli_cpu, 0);
        assert!(c.upsert_node(facts("a", 1000)).is_none(), "an unchanged node is not news");

        c.remove_pod("p1");
        c.remove_node("a");
        c.update_snapshot(&mut snap);
        assert_eq!(snap.nodes.len(), 1);
        assert_eq!(snap.get("b").unwrap().requested.milli_cpu, 0);
    }

    #[test]
    fn assume_confirm_and_forget() {
        let mut c = Cache::default();
        let mut snap = Snapshot::default();
        c.upsert_node(facts("n", 1000));
        let p = pod("p1", "", 400);
        assert!(c.assume(&p, "n").is_some());
        assert!(c.assume(&p, "n").is_none(), "assumed once");
        assert!(c.is_assumed("p1"));
        c.update_snapshot(&mut snap);
        assert_eq!(snap.get("n").unwrap().requested.milli_cpu, 400);

        // The watch shows it bound: confirmed, not counted twice, no news.
        assert!(c.upsert_pod(pod("p1", "n", 400)).is_none());
        assert!(!c.is_assumed("p1"));
        assert!(c.forget("p1").is_none(), "a confirmed pod is not forgotten");
        c.update_snapshot(&mut snap);
        assert_eq!(snap.get("n").unwrap().requested.milli_cpu, 400);

        // A pod the watch shows bound cannot be assumed elsewhere.
        assert!(c.assume(&pod("p1", "", 400), "other").is_none());
        // A failed binding releases what was assumed.
        c.assume(&pod("p2", "", 500), "n");
        c.forget("p2");
        c.update_snapshot(&mut snap);
        assert_eq!(snap.get("n").unwrap().requested.milli_cpu, 400);
        assert_eq!(snap.get("n").unwrap().pods.len(), 1);
    }

    #[test]
    fn pods_on_unknown_nodes_are_kept_out_of_the_snapshot() {
        let mut c = Cache::default();
        let mut snap = Snapshot::default();
        c.upsert_pod(pod("p1", "ghost", 100));
        c.update_snapshot(&mut snap);
        assert!(snap.nodes.is_empty());
        // The node appears later with the pod already accounted.
        c.upsert_node(facts("ghost", 1000));
        c.update_snapshot(&mut snap);
        assert_eq!(snap.get("ghost").unwrap().requested.milli_cpu, 100);
        c.remove_node("ghost");
        c.remove_pod("p1");
        assert_eq!(c.node_count(), 0);
    }
}
