//! `rbac.authorization.k8s.io/v1`: Roles and ClusterRoles (rules) and their bindings to users,
//! groups and service accounts, validated as upstream's `pkg/apis/rbac/validation`. Who holds
//! which rules is resolved in [`crate::registry::rbac`]; the checks that a writer does not grant
//! more than it holds are there too.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use serde_json::{Value, json};

use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, NameRule, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

pub const GROUP: &str = "rbac.authorization.k8s.io";

pub struct Roles;
pub struct ClusterRoles;
pub struct RoleBindings;
pub struct ClusterRoleBindings;

const fn info(kind: &'static str, plural: &'static str, singular: &'static str, namespaced: bool) -> ResourceInfo {
    ResourceInfo {
        group: GROUP,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: plural,
        return_deleted_object: false,
    }
}

/// `ValidatePolicyRule`.
fn validate_rules(rules: &[PolicyRule], namespaced: bool, out: &mut ErrorList) {
    for (i, rule) in rules.iter().enumerate() {
        let field = validation::index("rules", i);
        if rule.verbs.is_empty() {
            out.push(FieldError::required(validation::child(&field, "verbs"), "verbs must contain at least one value"));
        }
        let urls = rule.non_resource_urls.as_deref().unwrap_or_default();
        let groups = rule.api_groups.as_deref().unwrap_or_default();
        let resources = rule.resources.as_deref().unwrap_or_default();
        if !urls.is_empty() {
            let shown = format!("[]string{{{}}}", urls.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", "));
            if namespaced {
                out.push(FieldError::invalid_raw(
                    validation::child(&field, "nonResourceURLs"),
                    &shown,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if !groups.is_empty() || !resources.is_empty() {
                out.push(FieldError::invalid_raw(
                    validation::child(&field, "nonResourceURLs"),
                    &shown,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if groups.is_empty() {
            out.push(FieldError::required(
                validation::child(&field, "apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if resources.is_empty() {
            out.push(FieldError::required(
                validation::child(&field, "resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// `ValidateRoleBindingSubject` and the roleRef checks of `ValidateRoleBinding`.
fn validate_binding(role_ref: &RoleRef, subjects: &[Subject], kinds: &[&str], namespaced: bool) -> ErrorList {
    let mut out = ErrorList::new();
    let api_group = role_ref.api_group.as_deref().unwrap_or_default();
    if api_group != GROUP {
        out.push(FieldError::not_supported("roleRef.apiGroup", api_group, &[GROUP]));
    }
    if !kinds.contains(&role_ref.kind.as_str()) {
        out.push(FieldError::not_supported("roleRef.kind", &role_ref.kind, kinds));
    }
    if role_ref.name.is_empty() {
        out.push(FieldError::required("roleRef.name", ""));
    } else {
        for e in NameRule::PathSegment.errors(&role_ref.name) {
            out.push(FieldError::invalid("roleRef.name", &role_ref.name, e));
        }
    }
    for (i, s) in subjects.iter().enumerate() {
        let field = validation::index("subjects", i);
        if s.name.is_empty() {
            out.push(FieldError::required(validation::child(&field, "name"), ""));
        }
        let group = s.api_group.as_deref().unwrap_or_default();
        match s.kind.as_str() {
            "ServiceAccount" => {
                if !s.name.is_empty() {
                    for e in validation::is_dns1123_subdomain(&s.name) {
                        out.push(FieldError::invalid(validation::child(&field, "name"), &s.name, e));
                    }
                }
                if !group.is_empty() {
                    out.push(FieldError::not_supported(validation::child(&field, "apiGroup"), group, &[""]));
                }
                if !namespaced && s.namespace.as_deref().unwrap_or_default().is_empty() {
                    out.push(FieldError::required(validation::child(&field, "namespace"), ""));
                }
            }
            "User" | "Group" => {
                if group != GROUP {
                    out.push(FieldError::not_supported(validation::child(&field, "apiGroup"), group, &[GROUP]));
                }
            }
            other => out.push(FieldError::not_supported(
                validation::child(&field, "kind"),
                other,
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
    out
}

fn role_ref_immutable(new: &RoleRef, old: &RoleRef, out: &mut ErrorList) {
    if new != old {
        out.push(FieldError::invalid_raw(
            "roleRef",
            format!(
                "rbac.RoleRef{{APIGroup:{:?}, Kind:{:?}, Name:{:?}}}",
                new.api_group.as_deref().unwrap_or_default(),
                new.kind,
                new.name
            ),
            "cannot change roleRef",
        ));
    }
}

/// Upstream's "Created At" column of roles: the creation time in RFC 3339, UTC.
const CREATED_AT_COLUMN: Column = Column::new(
    "Created At",
    "date",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);

fn created_at(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Value {
    json!(meta.creation_timestamp.as_ref().map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default())
}

fn binding_columns() -> Vec<Column> {
    vec![
        NAME_COLUMN,
        Column::new("Role", "string", "Role of the binding."),
        AGE_COLUMN,
        Column::new("Users", "string", "Users in the binding.").wide(),
        Column::new("Groups", "string", "Groups in the binding.").wide(),
        Column::new("ServiceAccounts", "string", "ServiceAccounts in the binding.").wide(),
    ]
}

/// The cells after the name of a binding's row, as upstream's printer.
fn binding_cells(role_ref: &RoleRef, subjects: &[Subject]) -> [Value; 4] {
    let of = |kind: &str| {
        let names: Vec<String> = subjects
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| match (kind, s.namespace.as_deref()) {
                ("ServiceAccount", ns) => format!("{}/{}", ns.unwrap_or_default(), s.name),
                _ => s.name.clone(),
            })
            .collect();
        json!(names.join(", "))
    };
    [json!(format!("{}/{}", role_ref.kind, role_ref.name)), of("User"), of("Group"), of("ServiceAccount")]
}

impl Kind for Roles {
    type Obj = Role;
    const INFO: ResourceInfo = info("Role", "roles", "role", true);
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, role: &Role) -> ErrorList {
        let mut out = ErrorList::new();
        validate_rules(role.rules.as_deref().unwrap_or_default(), true, &mut out);
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, CREATED_AT_COLUMN]
    }

    fn cells(&self, role: &Role) -> Vec<Value> {
        vec![name_cell(&role.metadata), created_at(&role.metadata)]
    }
}

impl Kind for ClusterRoles {
    type Obj = ClusterRole;
    const INFO: ResourceInfo = info("ClusterRole", "clusterroles", "clusterrole", false);
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, role: &ClusterRole) -> ErrorList {
        let mut out = ErrorList::new();
        validate_rules(role.rules.as_deref().unwrap_or_default(), false, &mut out);
        if let Some(aggregation) = &role.aggregation_rule {
            let selectors = aggregation.cluster_role_selectors.as_deref().unwrap_or_default();
            if selectors.is_empty() {
                out.push(FieldError::required(
                    "aggregationRule.clusterRoleSelectors",
                    "at least one clusterRoleSelector required if aggregationRule is non-nil",
                ));
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, CREATED_AT_COLUMN]
    }

    fn cells(&self, role: &ClusterRole) -> Vec<Value> {
        vec![name_cell(&role.metadata), created_at(&role.metadata)]
    }
}

impl Kind for RoleBindings {
    type Obj = RoleBinding;
    const INFO: ResourceInfo = info("RoleBinding", "rolebindings", "rolebinding", true);
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, b: &RoleBinding) -> ErrorList {
        validate_binding(&b.role_ref, b.subjects.as_deref().unwrap_or_default(), &["Role", "ClusterRole"], true)
    }

    fn validate_update(&self, new: &RoleBinding, old: &RoleBinding) -> ErrorList {
        let mut out = self.validate(new);
        role_ref_immutable(&new.role_ref, &old.role_ref, &mut out);
        out
    }

    fn columns(&self) -> Vec<Column> {
        binding_columns()
    }

    fn cells(&self, b: &RoleBinding) -> Vec<Value> {
        let [role, users, groups, sas] = binding_cells(&b.role_ref, b.subjects.as_deref().unwrap_or_default());
        vec![name_cell(&b.metadata), role, age_cell(&b.metadata), users, groups, sas]
    }
}

impl Kind for ClusterRoleBindings {
    type Obj = ClusterRoleBinding;
    const INFO: ResourceInfo = info("ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", false);
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, b: &ClusterRoleBinding) -> ErrorList {
        validate_binding(&b.role_ref, b.subjects.as_deref().unwrap_or_default(), &["ClusterRole"], false)
    }

    fn validate_update(&self, new: &ClusterRoleBinding, old: &ClusterRoleBinding) -> ErrorList {
        let mut out = self.validate(new);
        role_ref_immutable(&new.role_ref, &old.role_ref, &mut out);
        out
    }

    fn columns(&self) -> Vec<Column> {
        binding_columns()
    }

    fn cells(&self, b: &ClusterRoleBinding) -> Vec<Value> {
        let [role, users, groups, sas] = binding_cells(&b.role_ref, b.subjects.as_deref().unwrap_or_default());
        vec![name_cell(&b.metadata), role, age_cell(&b.metadata), users, groups, sas]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn rules_need_verbs_and_either_resources_or_urls() {
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "r"},
            "rules": [
                {"verbs": [], "apiGroups": [""], "resources": ["pods"]},
                {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
                {"verbs": ["get"]},
            ],
        }))
        .unwrap();
        let errs = messages(&Roles.validate(&role));
        assert_eq!(
            errs,
            [
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[2].resources: Required value: resource rules must supply at least one resource",
            ]
        );
        let cluster: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}],
        }))
        .unwrap();
        assert!(ClusterRoles.validate(&cluster).is_empty());
    }

    #[test]
    fn bindings_refer_to_roles_and_name_known_subjects() {
        let b: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "view"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "default"},
                {"kind": "Robot", "name": "r2"},
                {"kind": "User", "apiGroup": GROUP, "name": "jane"},
            ],
        }))
        .unwrap();
        let errs = messages(&ClusterRoleBindings.validate(&b));
        assert_eq!(
            errs,
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value",
                "subjects[1].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
        let mut changed = b.clone();
        changed.role_ref.kind = "ClusterRole".into();
        changed.subjects = None;
        let mut old = changed.clone();
        old.role_ref.name = "edit".into();
        assert_eq!(
            messages(&ClusterRoleBindings.validate_update(&changed, &old)),
            [
                "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"view\"}: cannot change roleRef"
            ]
        );
    }
}
