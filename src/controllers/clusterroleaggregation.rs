//! A ClusterRole with an `aggregationRule` holds the rules of every ClusterRole its selectors
//! match (upstream's clusterrole-aggregation controller): how `admin`, `edit` and `view` gain the
//! rules of roles labelled `rbac.authorization.k8s.io/aggregate-to-<name>: "true"`.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};
use crate::labels::selector_matches;

pub struct Aggregation {
    pub client: Client,
    pub roles: Store<ClusterRole>,
}

/// Every ClusterRole; any change to one brings every aggregating role up to date.
pub fn controller(client: &Client) -> (Controller<ClusterRole>, Store<ClusterRole>) {
    let controller = Controller::new(Api::<ClusterRole>::all(client.clone()), watcher::Config::default());
    let roles = controller.store();
    let all = roles.clone();
    let controller =
        controller.watches(Api::<ClusterRole>::all(client.clone()), watcher::Config::default(), move |_| {
            all.state()
                .iter()
                .filter(|r| r.aggregation_rule.is_some())
                .map(|r| ObjectRef::from_obj(&**r))
                .collect::<Vec<_>>()
        });
    (controller, roles)
}

/// The rules `role` aggregates from `roles`: those of every other role a selector matches, by role
/// name, each rule once.
pub fn aggregated(role: &ClusterRole, roles: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let selectors = role.aggregation_rule.as_ref()?.cluster_role_selectors.as_deref().unwrap_or_default();
    let mut sources: Vec<&Arc<ClusterRole>> = roles
        .iter()
        .filter(|r| r.name_any() != role.name_any())
        .filter(|r| selectors.iter().any(|s| selector_matches(Some(s), r.labels())))
        .collect();
    sources.sort_by_key(|r| r.name_any());
    let mut rules: Vec<PolicyRule> = Vec::new();
    for rule in sources.iter().flat_map(|r| r.rules.iter().flatten()) {
        if !rules.contains(rule) {
            rules.push(rule.clone());
        }
    }
    Some(rules)
}

impl Reconciler for Aggregation {
    type Object = ClusterRole;
    const NAME: &'static str = "clusterrole-aggregation";

    async fn synced(&self) -> bool {
        self.roles.wait_until_ready().await.is_ok()
    }

    async fn reconcile(&self, role: Arc<ClusterRole>) -> Result<Action, Error> {
        let Some(rules) = aggregated(&role, &self.roles.state()) else { return Ok(Action::await_change()) };
        if role.rules.as_deref().unwrap_or_default() == rules.as_slice() {
            return Ok(Action::await_change());
        }
        let api: Api<ClusterRole> = Api::all(self.client.clone());
        let patch = serde_json::json!({"rules": rules});
        match api.patch(&role.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => tracing::debug!("aggregated {} rules into clusterrole {}", rules.len(), role.name_any()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(v: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn rules_of_matching_roles_are_gathered_once_by_name() {
        let view = role(json!({
            "metadata": {"name": "view"},
            "aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]},
        }));
        let pods = json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]});
        let widgets = json!({"verbs": ["list"], "apiGroups": ["example.com"], "resources": ["widgets"]});
        let roles = [
            view.clone(),
            role(json!({"metadata": {"name": "z-widgets",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}, "rules": [widgets, pods]})),
            role(json!({"metadata": {"name": "a-pods",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}, "rules": [pods]})),
            role(
                json!({"metadata": {"name": "other"}, "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}),
            ),
        ];
        let rules = aggregated(&view, &roles).unwrap();
        assert_eq!(serde_json::to_value(&rules).unwrap(), json!([pods, widgets]));
        assert_eq!(aggregated(&roles[3], &roles), None, "a role without an aggregationRule keeps its rules");
    }
}
