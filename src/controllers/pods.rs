//! What controllers read from their pods (upstream's `podutil` and `controller.FilterActivePods`).

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Neither finished nor being deleted.
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.metadata.deletion_timestamp.is_none()
}

fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

/// The pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Since when the pod has been ready, if it is.
pub fn ready_since(pod: &Pod) -> Option<Timestamp> {
    ready_condition(pod).filter(|c| c.status == "True").and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0)
}

/// `IsPodAvailable`: ready for at least `min_ready_seconds`.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    ready_since(pod).is_some_and(|t| t + SignedDuration::from_secs(i64::from(min_ready_seconds)) < now)
}
