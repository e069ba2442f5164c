//! Pods nominated to nodes by a preemption (upstream's `nominator` in the scheduling queue): the
//! room their victims free is kept for them, so that pods of lower priority do not take it while
//! the victims leave.

use std::collections::HashMap;
use std::sync::Arc;

use super::framework::Nominated;
use super::types::PodInfo;

#[derive(Default)]
pub struct Nominator {
    by_node: HashMap<String, Vec<Arc<PodInfo>>>,
    node_of: HashMap<String, String>,
}

impl Nominator {
    /// Nominates `pod` to `node`, replacing an earlier nomination; an empty `node` removes it.
    pub fn nominate(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.remove(&pod.uid);
        if node.is_empty() {
            return;
        }
        self.node_of.insert(pod.uid.clone(), node.to_string());
        self.by_node.entry(node.to_string()).or_default().push(pod);
    }

    pub fn remove(&mut self, uid: &str) {
        let Some(node) = self.node_of.remove(uid) else { return };
        if let Some(pods) = self.by_node.get_mut(&node) {
            pods.retain(|p| p.uid != uid);
            if pods.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    /// A pending pod as the API now shows it: nominated where its status says, or, when the status
    /// does not say yet, where this scheduler nominated it.
    pub fn update(&mut self, pod: &Arc<PodInfo>) {
        let node = match (pod.nominated_node.as_str(), self.node_of.get(&pod.uid)) {
            ("", None) => return,
            ("", Some(node)) => node.clone(),
            (node, _) => node.to_string(),
        };
        self.nominate(pod.clone(), &node);
    }

    pub fn node_of(&self, uid: &str) -> Option<&str> {
        self.node_of.get(uid).map(String::as_str)
    }

    /// The nominated pods `pod` must leave room for: those of at least its priority, not itself.
    pub fn for_pod(&self, pod: &PodInfo) -> Nominated {
        self.by_node
            .iter()
            .filter_map(|(node, pods)| {
                let pods: Vec<_> =
                    pods.iter().filter(|p| p.priority >= pod.priority && p.uid != pod.uid).cloned().collect();
                (!pods.is_empty()).then(|| (node.clone(), pods))
            })
            .collect()
    }

    /// The pods nominated to `node` with a priority below `priority` (a preemption there takes
    /// their nomination away).
    pub fn lower_on(&self, node: &str, priority: i32) -> Vec<Arc<PodInfo>> {
        self.by_node.get(node).into_iter().flatten().filter(|p| p.priority < priority).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, priority: i32, nominated: &str) -> Arc<PodInfo> {
        Arc::new(PodInfo { uid: uid.into(), priority, nominated_node: nominated.into(), ..Default::default() })
    }

    #[test]
    fn nominations_follow_the_status_and_local_choices() {
        let mut n = Nominator::default();
        n.nominate(pod("a", 10, ""), "n1");
        n.update(&pod("b", 5, "n1"));
        // The API has not caught up with a's nomination yet: it is kept.
        n.update(&pod("a", 10, ""));
        assert_eq!(n.node_of("a"), Some("n1"));
        let seen = n.for_pod(&pod("c", 5, ""));
        let mut uids: Vec<&str> = seen["n1"].iter().map(|p| p.uid.as_str()).collect();
        uids.sort();
        assert_eq!(uids, ["a", "b"]);
        // Higher-priority pods ignore lower nominations, and a pod never counts itself.
        assert!(n.for_pod(&pod("a", 10, "")).is_empty());
        assert_eq!(n.lower_on("n1", 10).iter().map(|p| p.uid.as_str()).collect::<Vec<_>>(), ["b"]);
        n.update(&pod("a", 10, "n2"));
        assert_eq!(n.node_of("a"), Some("n2"));
        n.nominate(pod("a", 10, ""), "");
        n.remove("b");
        assert!(n.for_pod(&pod("c", 0, "")).is_empty());
    }
}
