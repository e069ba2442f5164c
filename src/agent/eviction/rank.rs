//! The order pods are evicted in, as kubelet's `rankMemoryPressure`, `rankDiskPressureFunc` and
//! `rankPIDPressure`: first the pods using more than they asked for, then the lower priority, then
//! the larger use beyond the request (for PIDs: priority, then the most processes).

use std::cmp::Reverse;

use k8s_openapi::api::core::v1::Pod;

use super::thresholds::Signal;
use crate::scheduler::types::PodInfo;

/// What a pod uses now, as the stats measured it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Memory working set, bytes.
    pub memory: u64,
    /// Local ephemeral storage (the containers' writable layers), bytes.
    pub disk: u64,
    pub inodes: u64,
    pub processes: u64,
    /// Each container's (name, memory, disk).
    pub containers: Vec<(String, u64, u64)>,
}

/// A pod the eviction manager may choose, with its use (none when the stats have not seen it).
pub struct Candidate {
    pub pod: Pod,
    pub usage: Option<Usage>,
}

impl Candidate {
    fn priority(&self) -> i32 {
        self.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
    }

    /// The pod's request of `resource` (kubelet's `podRequest`: init containers' largest or the
    /// containers' sum, whichever is more).
    fn request(&self, resource: &str) -> i128 {
        match resource {
            "memory" | "ephemeral-storage" => i128::from(PodInfo::from_pod(&self.pod).requests.get(resource)),
            _ => 0,
        }
    }

    /// Use beyond the request of the resource `signal` reclaims.
    fn excess(&self, signal: Signal) -> Option<i128> {
        let u = self.usage.as_ref()?;
        let used = match signal.resource() {
            "memory" => u.memory,
            "ephemeral-storage" => u.disk,
            "inodes" => u.inodes,
            _ => u.processes,
        };
        Some(i128::from(used) - self.request(signal.resource()))
    }
}

/// Sorts `pods` into the order kubelet evicts them in to relieve `signal` (each pod's request is
/// worked out once, not per comparison).
pub fn rank(pods: &mut [Candidate], signal: Signal) {
    pods.sort_by_cached_key(|c| key(c, signal));
}

/// What kubelet's comparators amount to, as a key sorted ascending: for PIDs, priority then the
/// most processes; otherwise first a pod the stats have not seen (kubelet: "prioritize evicting
/// the pod for which no stats were found"), then those over their request, then priority, then the
/// larger excess.
fn key(c: &Candidate, signal: Signal) -> (bool, bool, i32, Reverse<Option<i128>>) {
    let excess = c.excess(signal);
    if signal == Signal::PidAvailable {
        return (false, false, c.priority(), Reverse(excess));
    }
    match excess {
        None => (false, false, 0, Reverse(None)),
        Some(e) => (true, e <= 0, c.priority(), Reverse(Some(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str, priority: i32, request_mi: u64, used_mi: Option<u64>) -> Candidate {
        let resources = if request_mi > 0 {
            serde_json::json!({"requests": {"memory": format!("{request_mi}Mi")}})
        } else {
            serde_json::json!({})
        };
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"priority": priority, "containers": [{"name": "c", "image": "i", "resources": resources}]}
        }))
        .unwrap();
        let usage = used_mi.map(|m| Usage { memory: m << 20, processes: m, ..Usage::default() });
        Candidate { pod, usage }
    }

    fn names(pods: &[Candidate]) -> Vec<&str> {
        pods.iter().map(|c| c.pod.metadata.name.as_deref().unwrap()).collect()
    }

    #[test]
    fn memory_ranks_usage_over_requests_then_priority_then_excess() {
        let mut pods = vec![
            candidate("within-request", 0, 500, Some(400)),
            candidate("over-high-priority", 1000, 100, Some(900)),
            candidate("over-small", 0, 0, Some(50)),
            candidate("over-large", 0, 100, Some(300)),
            candidate("unmeasured", 1000, 0, None),
        ];
        rank(&mut pods, Signal::MemoryAvailable);
        assert_eq!(names(&pods), ["unmeasured", "over-large", "over-small", "over-high-priority", "within-request"]);
    }

    #[test]
    fn pids_rank_priority_then_processes() {
        let mut pods = vec![
            candidate("few", 0, 0, Some(2)),
            candidate("important", 10, 0, Some(90)),
            candidate("many", 0, 0, Some(50)),
        ];
        rank(&mut pods, Signal::PidAvailable);
        assert_eq!(names(&pods), ["many", "few", "important"]);
    }
}
