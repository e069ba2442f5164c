//! Authorization: who may do what, decided once per request from its [`Attributes`] before it is
//! served (upstream's `WithAuthorization` filter over a chain of authorizers).
//!
//! `system:masters` may do everything. Then the authorizers of `--authorization-mode` are asked
//! in order (`Node,RBAC` by default) and the first that allows decides: `Node` for a node's
//! identity (`system:node:<name>` in `system:nodes`, [`node`]), `RBAC` for the rules of the roles
//! bound to the user and its groups (resolved in [`crate::registry::rbac`]). A joined node's
//! controllers (`system:cairn-controller`) have their fixed rules ([`rules::CONTROLLER_RULES`]),
//! as k3s's bootstrap binds `system:k3s-controller`. Discovery, health, version and OpenAPI paths
//! are open to every authenticated identity, as upstream's `system:discovery` and
//! `system:public-info-viewer` roles make them.

mod node;
pub mod request_info;
mod rules;
#[cfg(test)]
mod tests;

use k8s_openapi::api::rbac::v1::PolicyRule;

pub use request_info::Attributes;

use super::User;
use crate::registry::{GroupResource, Registry, StatusError};

/// The group whose members may do everything.
pub const MASTERS_GROUP: &str = "system:masters";
/// The identity a joined node's controllers act as.
pub const CONTROLLER_USER: &str = "system:cairn-controller";
const NODE_USER_PREFIX: &str = "system:node:";

/// An authorizer's answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, with no later authorizer asked (`AlwaysDeny`).
    Deny(String),
    /// Not allowed by this authorizer, with why (may be empty).
    NoOpinion(String),
}

/// One authorizer of `--authorization-mode` (kube-apiserver's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AlwaysAllow,
    AlwaysDeny,
    Node,
    Rbac,
}

/// The authorizers in order, as `--authorization-mode` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Modes(Vec<Mode>);

impl Default for Modes {
    fn default() -> Self {
        Modes(vec![Mode::Node, Mode::Rbac])
    }
}

impl std::str::FromStr for Modes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut modes = Vec::new();
        for name in s.split(',').map(str::trim) {
            let mode = match name {
                "AlwaysAllow" => Mode::AlwaysAllow,
                "AlwaysDeny" => Mode::AlwaysDeny,
                "Node" => Mode::Node,
                "RBAC" => Mode::Rbac,
                other => {
                    return Err(format!(
                        "authorization mode {other:?} is not supported: use AlwaysAllow, AlwaysDeny, Node or RBAC"
                    ));
                }
            };
            if modes.contains(&mode) {
                return Err(format!("authorization mode {name:?} is listed twice"));
            }
            modes.push(mode);
        }
        Ok(Modes(modes))
    }
}

impl Decision {
    fn no(why: impl Into<String>) -> Self {
        Decision::NoOpinion(why.into())
    }
}

/// The node a user is, when it is one and not also a master (upstream's `NodeIdentifier`; the
/// server's own node agent holds `system:masters` too, in process).
pub fn node_of(user: &User) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    let in_group = |g: &str| user.groups.iter().any(|x| x == g);
    (in_group(crate::api::pki::NODES_GROUP) && !in_group(MASTERS_GROUP)).then_some(name)
}

/// Paths every authenticated identity may read.
static PUBLIC_PATHS: std::sync::LazyLock<Vec<PolicyRule>> = std::sync::LazyLock::new(|| {
    let urls = [
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/healthz/*",
        "/livez",
        "/livez/*",
        "/readyz",
        "/readyz/*",
        "/version",
        "/version/",
        "/openapi",
        "/openapi/*",
        "/cacerts",
        "/v1-cairn/*",
    ];
    vec![PolicyRule {
        verbs: vec!["get".into(), "post".into()],
        non_resource_urls: Some(urls.iter().map(|u| u.to_string()).collect()),
        ..Default::default()
    }]
});

/// Decides a request; a refusal is upstream's 403 Status.
pub fn authorize(registry: &Registry, modes: &Modes, user: &User, attrs: &Attributes) -> Result<(), StatusError> {
    let decision = decide(registry, modes, user, attrs);
    let why = match decision {
        Decision::Allow => return Ok(()),
        Decision::Deny(why) | Decision::NoOpinion(why) => why,
    };
    let mut message = attrs.forbidden_message(user);
    if !why.is_empty() {
        message = format!("{message}: {why}");
    }
    tracing::debug!(user = %user.name, "forbidden: {message}");
    Err(match &attrs.resource {
        Some(r) => {
            let gr = GroupResource { group: r.group.clone(), resource: r.resource.clone() };
            StatusError::forbidden(&gr, &r.name, message)
        }
        None => StatusError::forbidden_plain(format!("forbidden: {message}")),
    })
}

/// What the authorizers say, in order (upstream's union authorizer: the first to allow or deny
/// decides; the reasons of those without an opinion are joined).
pub fn decide(registry: &Registry, modes: &Modes, user: &User, attrs: &Attributes) -> Decision {
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        return Decision::Allow;
    }
    if attrs.resource.is_none() && rules::rules_allow(attrs, &PUBLIC_PATHS) {
        return Decision::Allow;
    }
    if user.name == CONTROLLER_USER && rules::rules_allow(attrs, &rules::CONTROLLER_RULES) {
        return Decision::Allow;
    }
    let mut reasons = Vec::new();
    for mode in &modes.0 {
        let decision = match mode {
            Mode::AlwaysAllow => Decision::Allow,
            Mode::AlwaysDeny => {
                Decision::Deny("the server denies every request (--authorization-mode AlwaysDeny)".into())
            }
            Mode::Node => match node_of(user) {
                Some(node) => node::authorize(registry, node, attrs),
                None => Decision::no(""),
            },
            Mode::Rbac => rbac(registry, user, attrs),
        };
        match decision {
            Decision::NoOpinion(why) => reasons.extend((!why.is_empty()).then_some(why)),
            decided => return decided,
        }
    }
    Decision::NoOpinion(reasons.join(", "))
}

/// Every rule `user` holds in `namespace` (upstream's rules review: what the RBAC rules grant,
/// everything for `system:masters`, and the fixed rules of nodes and of cairn's controllers).
pub fn rules_of(registry: &Registry, user: &User, namespace: &str) -> Vec<PolicyRule> {
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        let all = |v: &str| Some(vec![v.to_string()]);
        return vec![
            PolicyRule { verbs: vec!["*".into()], api_groups: all("*"), resources: all("*"), ..Default::default() },
            PolicyRule { verbs: vec!["*".into()], non_resource_urls: all("*"), ..Default::default() },
        ];
    }
    let mut rules: Vec<PolicyRule> = PUBLIC_PATHS.clone();
    if user.name == CONTROLLER_USER {
        rules.extend(rules::CONTROLLER_RULES.iter().cloned());
    }
    if node_of(user).is_some() {
        rules.extend(rules::NODE_RULES.iter().cloned());
    }
    let info = crate::registry::rbac::UserInfo { name: &user.name, groups: &user.groups };
    for set in registry.rbac_rules(info, Some(namespace)) {
        rules.extend(set.iter().filter(|r| !rules.contains(r)).cloned().collect::<Vec<_>>());
    }
    rules
}

/// RBAC: whether a rule of a role bound to the user (cluster-wide, or in the request's namespace)
/// allows the request.
fn rbac(registry: &Registry, user: &User, attrs: &Attributes) -> Decision {
    let namespace = attrs.resource.as_ref().map(|r| r.namespace.as_str());
    let info = crate::registry::rbac::UserInfo { name: &user.name, groups: &user.groups };
    if registry.rbac_rules(info, namespace).iter().any(|rules| rules::rules_allow(attrs, rules)) {
        Decision::Allow
    } else {
        Decision::no("")
    }
}
