//! ImageLocality: favors nodes that already hold the pod's images, scaled by how widely each image
//! has spread (kube-scheduler v1.36 `imagelocality/image_locality.go`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::scheduler::framework::{CycleState, MAX_NODE_SCORE, Plugin, Point, PreFilterResult, Status};
use crate::scheduler::types::{NodeInfo, PodInfo};

/// The plugin name in profiles.
pub const NAME: &str = "ImageLocality";

const STATE_KEY: &str = "PreFilterImageLocality";
const MB: i64 = 1024 * 1024;
/// Image sums below this score 0.
const MIN_THRESHOLD: i64 = 23 * MB;
/// Image sums at or above this times the pod's image count score 100.
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

/// How widely the pod's images have spread, counted over every node in the snapshot.
struct Spread {
    total_nodes: usize,
    /// Image → number of nodes holding it (pod images only).
    nodes_with: HashMap<String, usize>,
}

/// ImageLocality. Upstream counts image spread over all nodes of the snapshot, which only PreFilter
/// sees here, so the counts are taken there and Score reads them from the cycle state.
#[derive(Clone, Copy, Debug, Default)]
pub struct ImageLocality;

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        NAME
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Score]
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[Arc<NodeInfo>]) -> (Status, PreFilterResult) {
        let nodes_with = pod
            .images
            .iter()
            .map(|image| (image.clone(), nodes.iter().filter(|n| n.node.images.contains_key(image)).count()))
            .collect();
        state.write(STATE_KEY, Spread { total_nodes: nodes.len(), nodes_with });
        (Status::success(), None)
    }

    /// `100 · (sum − 23 MiB) / (1000 MiB · images − 23 MiB)`, where `sum` (clamped to that range)
    /// adds `size · nodes holding the image / all nodes` for each of the pod's images on the node.
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let Some(spread) = state.read::<Spread>(STATE_KEY) else {
            return Err(Status::error(format!("reading {STATE_KEY:?} from cycleState: not found")));
        };
        let mut sum = 0i64;
        for image in &pod.images {
            if let Some(&size) = node.node.images.get(image) {
                let holders = spread.nodes_with.get(image).copied().unwrap_or(0);
                let ratio = holders as f64 / spread.total_nodes.max(1) as f64;
                sum = sum.saturating_add((size as f64 * ratio) as i64);
            }
        }
        let max_threshold = MAX_CONTAINER_THRESHOLD.saturating_mul(pod.container_count as i64);
        let sum = if sum < MIN_THRESHOLD { MIN_THRESHOLD } else { sum.min(max_threshold) };
        Ok(MAX_NODE_SCORE * (sum - MIN_THRESHOLD) / (max_threshold - MIN_THRESHOLD))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(images: &[&str]) -> PodInfo {
        let containers: Vec<Value> =
            images.iter().enumerate().map(|(i, image)| json!({"name": format!("c{i}"), "image": image})).collect();
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": containers}});
        PodInfo::from_json(p)
    }

    /// A node holding `images` (name, size in MiB).
    fn node(name: &str, images: &[(&str, i64)]) -> Arc<NodeInfo> {
        let images: Vec<Value> = images.iter().map(|(n, mb)| json!({"names": [n], "sizeBytes": mb * MB})).collect();
        let n = json!({"metadata": {"name": name}, "status": {"images": images}});
        Arc::new(NodeInfo::from_json(n))
    }

    fn scores(p: &PodInfo, nodes: &[Arc<NodeInfo>]) -> Vec<i64> {
        let mut state = CycleState::default();
        assert!(ImageLocality.pre_filter(&mut state, p, nodes).0.is_success());
        nodes.iter().map(|n| ImageLocality.score(&state, p, n).unwrap()).collect()
    }

    #[test]
    fn scores_by_size_scaled_by_spread() {
        let nodes = [
            node("n1", &[("app:v1", 500), ("side:latest", 300)]),
            node("n2", &[("app:v1", 500)]),
            node("n3", &[]),
            node("n4", &[]),
        ];
        // n1: app 500 MiB · 2/4 = 250 MiB, side 300 MiB · 1/4 = 75 MiB → 325 MiB;
        // 100 · (325 − 23) / (2000 − 23) = 15.
        // n2: 250 MiB → 100 · 227 / 1977 = 11. n3, n4 hold nothing → 0.
        assert_eq!(scores(&pod(&["app:v1", "side"]), &nodes), [15, 11, 0, 0]);
    }

    #[test]
    fn clamps_to_thresholds() {
        let nodes = [node("n1", &[("big:latest", 3000)]), node("n2", &[("small:latest", 20)])];
        // n1: 3000 · 1/2 = 1500 MiB ≥ 1000 MiB · 1 → 100; n2: 10 MiB < 23 MiB → 0.
        assert_eq!(scores(&pod(&["big"]), &nodes), [100, 0]);
        assert_eq!(scores(&pod(&["small"]), &nodes), [0, 0]);
        // The spread counts every node of the snapshot given to PreFilter, not only feasible ones.
        let nodes = [node("n1", &[("app:latest", 800)]), node("n2", &[("app:latest", 800)])];
        // 800 MiB · 2/2: 100 · (800 − 23) / (1000 − 23) = 79.
        assert_eq!(scores(&pod(&["app"]), &nodes), [79, 79]);
    }

    #[test]
    fn score_needs_prefilter_state() {
        let s = ImageLocality.score(&CycleState::default(), &pod(&["app"]), &node("n", &[])).unwrap_err();
        assert!(s.message().contains(STATE_KEY));
    }
}
