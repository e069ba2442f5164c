//! A failed pod against its Job's `podFailurePolicy` (upstream's `matchPodFailurePolicy`): the
//! first rule whose exit codes or pod conditions match decides whether the failure fails the
//! Job, is ignored, counts toward `backoffLimit` or fails the pod's index.

use k8s_openapi::api::batch::v1::{PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt as _;

/// What a matching rule says of a failed pod.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Counted toward `backoffLimit` (no rule matched, or a `Count` rule).
    Count,
    /// Not counted, and replaced as if it had not run.
    Ignore,
    /// The Job fails at once, with this message.
    FailJob(String),
    /// The pod's index fails (with `backoffLimitPerIndex`).
    FailIndex,
}

pub fn judge(policy: Option<&PodFailurePolicy>, pod: &Pod) -> Verdict {
    let Some(policy) = policy else { return Verdict::Count };
    let status = pod.status.clone().unwrap_or_default();
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    for (index, rule) in policy.rules.iter().enumerate() {
        let message = if let Some(codes) = &rule.on_exit_codes {
            let container = matching_container(status.container_statuses.iter().flatten(), codes)
                .or_else(|| matching_container(status.init_container_statuses.iter().flatten(), codes));
            container.map(|(c, code)| {
                format!(
                    "Container {c} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                    rule.action
                )
            })
        } else {
            let patterns = rule.on_pod_conditions.iter().flatten();
            let matched = status.conditions.iter().flatten().find(|c| {
                patterns.clone().any(|p| p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status)
            });
            matched.map(|c| {
                format!("Pod {ns}/{name} has condition {} matching {} rule at index {index}", c.type_, rule.action)
            })
        };
        let Some(message) = message else { continue };
        return match rule.action.as_str() {
            "Ignore" => Verdict::Ignore,
            "FailJob" => Verdict::FailJob(message),
            "FailIndex" => Verdict::FailIndex,
            _ => Verdict::Count,
        };
    }
    Verdict::Count
}

/// The first terminated container with a non-zero exit code the requirement matches.
fn matching_container<'a>(
    statuses: impl Iterator<Item = &'a ContainerStatus>,
    codes: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(&'a str, i32)> {
    statuses
        .filter(|c| codes.container_name.as_ref().is_none_or(|n| *n == c.name))
        .filter_map(|c| Some((c.name.as_str(), c.state.as_ref()?.terminated.as_ref()?.exit_code)))
        .find(|(_, code)| {
            *code != 0
                && match codes.operator.as_str() {
                    "In" => codes.values.contains(code),
                    "NotIn" => !codes.values.contains(code),
                    _ => false,
                }
        })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "status": status})).unwrap()
    }

    fn exited(name: &str, code: i32) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code}}})
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let policy: PodFailurePolicy = serde_json::from_value(json!({"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1, 2]}},
            {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}},
        ]}))
        .unwrap();
        let judge = |status: Value| judge(Some(&policy), &pod(status));
        let disrupted = json!({"conditions": [{"type": "DisruptionTarget", "status": "True"}],
            "containerStatuses": [exited("main", 42)]});
        assert_eq!(judge(disrupted), Verdict::Ignore);
        assert_eq!(
            judge(json!({"containerStatuses": [exited("side", 1), exited("main", 42)]})),
            Verdict::FailJob(
                "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 1".into()
            )
        );
        // Another container's 42 is not main's; NotIn [1, 2] takes it.
        assert_eq!(judge(json!({"containerStatuses": [exited("side", 42)]})), Verdict::Count);
        assert_eq!(judge(json!({"initContainerStatuses": [exited("init", 1)]})), Verdict::FailIndex);
        // A zero exit code never matches; nothing matching counts.
        assert_eq!(judge(json!({"containerStatuses": [exited("main", 0), exited("side", 2)]})), Verdict::Count);
        assert_eq!(super::judge(None, &pod(json!({}))), Verdict::Count);
    }
}
