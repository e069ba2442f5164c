//! Authorization: who may do what, decided once per request from its [`Attributes`] before it is
//! served (upstream's `WithAuthorization` filter over a chain of authorizers).
//!
//! `system:masters` may do everything. A node's identity (`system:node:<name>` in `system:nodes`)
//! goes through the Node authorizer ([`node`]); a joined node's controllers (`system:cairn-controller`)
//! through their fixed rules ([`rules::CONTROLLER_RULES`]). Every other authenticated identity is
//! allowed for now: cairn has no RBAC yet. Discovery, health, version and OpenAPI paths are open to
//! every authenticated identity, as upstream's `system:discovery` and `system:public-info-viewer`
//! roles make them.

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

/// An authorizer's answer (upstream has Deny too; none of cairn's needs it).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Not allowed by this authorizer, with why (may be empty).
    NoOpinion(String),
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
pub fn authorize(registry: &Registry, user: &User, attrs: &Attributes) -> Result<(), StatusError> {
    if user.groups.iter().any(|g| g == MASTERS_GROUP) {
        return Ok(());
    }
    if attrs.resource.is_none() && rules::rules_allow(attrs, &PUBLIC_PATHS) {
        return Ok(());
    }
    let decision = if let Some(node) = node_of(user) {
        node::authorize(registry, node, attrs)
    } else if user.name == CONTROLLER_USER {
        if rules::rules_allow(attrs, &rules::CONTROLLER_RULES) { Decision::Allow } else { Decision::no("") }
    } else {
        Decision::Allow
    };
    let Decision::NoOpinion(why) = decision else { return Ok(()) };
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
