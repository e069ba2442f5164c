//! Who holds which RBAC rules (upstream's `rbac/validation.DefaultRuleResolver`): the rules of
//! the roles bound to a user, its groups and, for a namespace, that namespace's RoleBindings.
//!
//! Upstream walks every binding for each request (through informer caches). Here the bindings are
//! indexed by subject once, and the index is rebuilt only when a role or binding was written
//! (the store's per-resource last write), so a decision is a few hash lookups.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};
use serde::de::DeserializeOwned;

use serde_json::Value;

use super::kinds::rbac::GROUP;
use super::{Resource, Result, StatusError};
use crate::store::Store;

/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
const STORAGE: [&str; 4] = ["clusterroles", "clusterrolebindings", "roles", "rolebindings"];

/// A user as RBAC sees it.
#[derive(Debug, Clone, Copy)]
pub struct UserInfo<'a> {
    pub name: &'a str,
    pub groups: &'a [String],
}

/// Rules granted together by one binding.
pub type Rules = Arc<Vec<PolicyRule>>;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Who {
    User(String),
    Group(String),
}

#[derive(Default)]
struct Index {
    /// The stores' last writes to the four resources when this index was built.
    stamp: [u64; 4],
    cluster: HashMap<Who, Vec<Rules>>,
    namespaced: HashMap<(String, Who), Vec<Rules>>,
}

/// The rule resolver; one per registry.
#[derive(Default)]
pub struct RuleResolver {
    index: RwLock<Option<Arc<Index>>>,
}

impl RuleResolver {
    /// Every rule set `user` holds in `namespace` (cluster-wide ones included; `None`: only those).
    pub fn rules_for(&self, store: &Store, user: UserInfo<'_>, namespace: Option<&str>) -> Vec<Rules> {
        let index = self.current(store);
        let mut out = Vec::new();
        for who in subjects(user) {
            out.extend(index.cluster.get(&who).into_iter().flatten().cloned());
            if let Some(ns) = namespace.filter(|ns| !ns.is_empty()) {
                out.extend(index.namespaced.get(&(ns.to_string(), who)).into_iter().flatten().cloned());
            }
        }
        out
    }

    fn current(&self, store: &Store) -> Arc<Index> {
        let stamp = STORAGE.map(|s| store.last_write(s));
        if let Some(index) = self.index.read().unwrap_or_else(|e| e.into_inner()).as_ref()
            && index.stamp == stamp
        {
            return index.clone();
        }
        let index = Arc::new(build(store, stamp));
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = Some(index.clone());
        index
    }
}

/// The subjects a user matches: its name and its groups, `system:authenticated` always.
fn subjects(user: UserInfo<'_>) -> impl Iterator<Item = Who> + '_ {
    let implied = (!user.groups.iter().any(|g| g == AUTHENTICATED_GROUP)).then(|| AUTHENTICATED_GROUP.to_string());
    std::iter::once(Who::User(user.name.to_string())).chain(user.groups.iter().cloned().chain(implied).map(Who::Group))
}

fn who(subject: &Subject, binding_namespace: Option<&str>) -> Option<Who> {
    match subject.kind.as_str() {
        "User" => Some(Who::User(subject.name.clone())),
        "Group" => Some(Who::Group(subject.name.clone())),
        "ServiceAccount" => {
            let ns = subject.namespace.as_deref().filter(|n| !n.is_empty()).or(binding_namespace)?;
            Some(Who::User(format!("system:serviceaccount:{ns}:{}", subject.name)))
        }
        _ => None,
    }
}

fn objects<T: DeserializeOwned>(store: &Store, storage: &str) -> Vec<T> {
    let listing = store.list(&format!("{storage}/"), None);
    listing
        .items
        .iter()
        .filter_map(|(key, obj)| match serde_json::from_slice(&obj.data) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!("ignoring the unreadable {key}: {e}");
                None
            }
        })
        .collect()
}

fn build(store: &Store, stamp: [u64; 4]) -> Index {
    let cluster_roles: HashMap<String, Rules> = objects::<ClusterRole>(store, "clusterroles")
        .into_iter()
        .map(|r| (r.metadata.name.unwrap_or_default(), Arc::new(r.rules.unwrap_or_default())))
        .collect();
    let roles: HashMap<(String, String), Rules> = objects::<Role>(store, "roles")
        .into_iter()
        .map(|r| {
            let key = (r.metadata.namespace.unwrap_or_default(), r.metadata.name.unwrap_or_default());
            (key, Arc::new(r.rules.unwrap_or_default()))
        })
        .collect();
    let mut index = Index { stamp, ..Default::default() };
    for b in objects::<ClusterRoleBinding>(store, "clusterrolebindings") {
        // A binding to a role that does not exist grants nothing (upstream logs it per request).
        let Some(rules) = (b.role_ref.kind == "ClusterRole").then(|| cluster_roles.get(&b.role_ref.name)).flatten()
        else {
            continue;
        };
        for who in b.subjects.iter().flatten().filter_map(|s| who(s, None)) {
            index.cluster.entry(who).or_default().push(rules.clone());
        }
    }
    for b in objects::<RoleBinding>(store, "rolebindings") {
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        let rules = match b.role_ref.kind.as_str() {
            "ClusterRole" => cluster_roles.get(&b.role_ref.name),
            "Role" => roles.get(&(ns.clone(), b.role_ref.name.clone())),
            _ => None,
        };
        let Some(rules) = rules else { continue };
        for who in b.subjects.iter().flatten().filter_map(|s| who(s, Some(&ns))) {
            index.namespaced.entry((ns.clone(), who)).or_default().push(rules.clone());
        }
    }
    index
}

/// A request for `verb` on one object, as the escalation checks ask it.
struct Ask<'a> {
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    name: &'a str,
}

fn has(list: Option<&Vec<String>>, want: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|v| v == "*" || v == want))
}

/// Whether `rule` allows `ask` (a resource request; a rule's `*/sub` covers every `r/sub`).
fn allows(rule: &PolicyRule, ask: &Ask<'_>) -> bool {
    let resource_ok = rule.resources.iter().flatten().any(|r| {
        r == "*"
            || r == ask.resource
            || r.strip_prefix("*/").is_some_and(|sub| ask.resource.split_once('/').is_some_and(|(_, s)| s == sub))
    });
    rule.verbs.iter().any(|v| v == "*" || v == ask.verb)
        && has(rule.api_groups.as_ref(), ask.group)
        && resource_ok
        && rule.resource_names.as_ref().is_none_or(|n| n.is_empty() || n.iter().any(|n| n == ask.name))
}

/// The parts of `servant` that no rule of `owner` covers (upstream's `validation.Covers`): every
/// rule is broken into one verb on one group, resource and name (or one URL), each of which some
/// owner rule must allow.
pub fn uncovered(owner: &[PolicyRule], servant: &[PolicyRule]) -> Vec<PolicyRule> {
    let one = |v: &String| Some(vec![v.clone()]);
    let mut missing = Vec::new();
    for rule in servant {
        for verb in &rule.verbs {
            for url in rule.non_resource_urls.iter().flatten() {
                let covered = owner.iter().any(|o| {
                    o.verbs.iter().any(|v| v == "*" || v == verb)
                        && o.non_resource_urls
                            .iter()
                            .flatten()
                            .any(|u| u == "*" || u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p)))
                });
                if !covered {
                    missing.push(PolicyRule {
                        verbs: vec![verb.clone()],
                        non_resource_urls: one(url),
                        ..Default::default()
                    });
                }
            }
            let names: Vec<&str> = match rule.resource_names.as_deref() {
                Some(n) if !n.is_empty() => n.iter().map(String::as_str).collect(),
                _ => vec![""],
            };
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for name in &names {
                        let ask = Ask { verb, group, resource, name };
                        // A servant rule for every name needs an owner rule for every name: an
                        // owner's resourceNames never list "".
                        let covered = owner.iter().any(|o| allows(o, &ask));
                        if !covered {
                            missing.push(PolicyRule {
                                verbs: vec![verb.clone()],
                                api_groups: one(group),
                                resources: one(resource),
                                resource_names: (!name.is_empty()).then(|| vec![name.to_string()]),
                                ..Default::default()
                            });
                        }
                    }
                }
            }
        }
    }
    missing
}

/// A rule as upstream's `CompactString` writes it: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`.
pub fn compact(rule: &PolicyRule) -> String {
    let list = |v: &[String]| v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" ");
    let mut parts = Vec::new();
    for (label, values) in [
        ("APIGroups", rule.api_groups.as_deref()),
        ("Resources", rule.resources.as_deref()),
        ("ResourceNames", rule.resource_names.as_deref()),
        ("NonResourceURLs", rule.non_resource_urls.as_deref()),
    ] {
        if let Some(v) = values.filter(|v| !v.is_empty()) {
            parts.push(format!("{label}:[{}]", list(v)));
        }
    }
    parts.push(format!("Verbs:[{}]", list(&rule.verbs)));
    format!("{{{}}}", parts.join(", "))
}

/// Who makes a write, for the escalation checks and what records its author.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub name: String,
    pub groups: Vec<String>,
    pub uid: String,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl super::Registry {
    /// Whether RBAC's cluster-wide rules let `who` do `verb` on one object (`system:masters` may
    /// do anything).
    pub(super) fn may(&self, who: &Requester, verb: &str, group: &str, resource: &str, name: &str) -> bool {
        if who.groups.iter().any(|g| g == "system:masters") {
            return true;
        }
        let user = UserInfo { name: &who.name, groups: &who.groups };
        let ask = Ask { verb, group, resource, name };
        self.rbac_rules(user, None).iter().any(|rules| rules.iter().any(|r| allows(r, &ask)))
    }

    /// Refuses a role or binding that grants more than its writer holds (upstream's RBAC storage
    /// `ConfirmNoEscalation`): a role's rules, or for a binding its role's, must all be the
    /// writer's own, unless RBAC lets the writer `escalate` that role or `bind` it.
    pub(super) fn confirm_no_escalation(&self, r: &Resource, obj: &Value, who: &Requester) -> Result<()> {
        let info = r.info();
        if info.group != GROUP || who.groups.iter().any(|g| g == "system:masters") {
            return Ok(());
        }
        let text = |path: &str| obj.pointer(path).and_then(Value::as_str).unwrap_or_default();
        let (name, ns) = (text("/metadata/name"), text("/metadata/namespace"));
        let user = UserInfo { name: &who.name, groups: &who.groups };
        let owner: Vec<PolicyRule> =
            self.rbac_rules(user, info.namespaced.then_some(ns)).iter().flat_map(|r| r.iter().cloned()).collect();
        let may = |verb: &str, resource: &str, name: &str| {
            owner.iter().any(|o| allows(o, &Ask { verb, group: GROUP, resource, name }))
        };
        let rules_at = |key: String| -> Vec<PolicyRule> {
            let rules = self.store.get(&key).and_then(|o| serde_json::from_slice::<Value>(&o.data).ok());
            rules.and_then(|v| serde_json::from_value(v["rules"].clone()).ok()).unwrap_or_default()
        };
        let wanted: Vec<PolicyRule> = match info.plural {
            "roles" | "clusterroles" => {
                if may("escalate", info.plural, name) {
                    return Ok(());
                }
                if obj.get("aggregationRule").is_some_and(|a| !a.is_null()) {
                    // An aggregating role may gather anything: only a writer holding everything may
                    // make one.
                    let all = || Some(vec!["*".to_string()]);
                    vec![PolicyRule {
                        verbs: vec!["*".into()],
                        api_groups: all(),
                        resources: all(),
                        ..Default::default()
                    }]
                } else {
                    serde_json::from_value(obj["rules"].clone()).unwrap_or_default()
                }
            }
            _ => {
                let (kind, role) = (text("/roleRef/kind"), text("/roleRef/name"));
                let plural = if kind == "Role" { "roles" } else { "clusterroles" };
                if may("bind", plural, role) {
                    return Ok(());
                }
                if kind == "Role" {
                    rules_at(format!("roles/{ns}/{role}"))
                } else {
                    rules_at(format!("clusterroles/{role}"))
                }
            }
        };
        let missing = uncovered(&owner, &wanted);
        if missing.is_empty() {
            return Ok(());
        }
        let mut groups = who.groups.clone();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.into());
        }
        let groups: Vec<String> = groups.iter().map(|g| format!("{g:?}")).collect();
        let missing: Vec<String> = missing.iter().map(compact).collect();
        let message = format!(
            "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
            who.name,
            groups.join(" "),
            missing.join("\n")
        );
        Err(StatusError::forbidden(&info.group_resource(), name, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        PolicyRule {
            verbs: owned(verbs),
            api_groups: Some(owned(groups)),
            resources: Some(owned(resources)),
            resource_names: (!names.is_empty()).then(|| owned(names)),
            ..Default::default()
        }
    }

    #[test]
    fn a_writer_covers_only_what_its_own_rules_allow() {
        let owner = [
            rule(&["get", "list"], &[""], &["pods", "configmaps"], &[]),
            rule(&["*"], &["apps"], &["deployments"], &[]),
            rule(&["get"], &[""], &["secrets"], &["mine"]),
            rule(&["update"], &["*"], &["*/scale"], &[]),
        ];
        let covered = [
            rule(&["get"], &[""], &["pods"], &[]),
            rule(&["delete", "create"], &["apps"], &["deployments"], &[]),
            rule(&["get"], &[""], &["secrets"], &["mine"]),
            rule(&["update"], &["apps"], &["deployments/scale", "statefulsets/scale"], &[]),
        ];
        assert_eq!(uncovered(&owner, &covered), Vec::<PolicyRule>::new());
        let wider = [
            rule(&["get", "delete"], &[""], &["pods"], &[]),
            rule(&["get"], &[""], &["secrets"], &[]),
            rule(&["get"], &["*"], &["pods"], &[]),
        ];
        let missing: Vec<String> = uncovered(&owner, &wider).iter().map(compact).collect();
        assert_eq!(
            missing,
            [
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}"#,
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}"#,
                r#"{APIGroups:["*"], Resources:["pods"], Verbs:["get"]}"#,
            ]
        );
        let urls = [PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(vec!["/healthz".into(), "/metrics".into()]),
            ..Default::default()
        }];
        let url_owner = [PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(vec!["/healthz*".into()]),
            ..Default::default()
        }];
        let missing: Vec<String> = uncovered(&url_owner, &urls).iter().map(compact).collect();
        assert_eq!(missing, [r#"{NonResourceURLs:["/metrics"], Verbs:["get"]}"#]);
    }
}
