//! The review APIs, answered at once and stored nowhere (upstream's `authorization.k8s.io` and
//! `authentication.k8s.io` REST storage): SelfSubjectAccessReview (`kubectl auth can-i`),
//! SubjectAccessReview and LocalSubjectAccessReview (for another user), SelfSubjectRulesReview
//! (`kubectl auth can-i --list`), SelfSubjectReview (`kubectl auth whoami`) and TokenReview (who a
//! bearer token stands for, as webhook token authenticators ask).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::post;
use k8s_openapi::api::authorization::v1::{
    NonResourceRule, ResourceAttributes as ReviewResource, ResourceRule, SubjectAccessReviewSpec,
    SubjectAccessReviewStatus, SubjectRulesReviewStatus,
};
use serde_json::{Value, json};

use super::authz::{self, Attributes, Decision, request_info::ResourceAttributes};
use super::discovery::Listed;
use super::{AppState, User, codec};
use crate::registry::rbac::AUTHENTICATED_GROUP;
use crate::registry::validation::FieldError;
use crate::registry::{ResourceInfo, StatusError};

const AUTHORIZATION: &str = "authorization.k8s.io";
const AUTHENTICATION: &str = "authentication.k8s.io";

const fn info(group: &'static str, kind: &'static str, plural: &'static str, namespaced: bool) -> ResourceInfo {
    ResourceInfo {
        group,
        version: "v1",
        kind,
        plural,
        singular: "",
        namespaced,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "",
        return_deleted_object: false,
    }
}

const SELF_SUBJECT_REVIEW: ResourceInfo = info(AUTHENTICATION, "SelfSubjectReview", "selfsubjectreviews", false);
const LOCAL_SAR: ResourceInfo = info(AUTHORIZATION, "LocalSubjectAccessReview", "localsubjectaccessreviews", true);
const SSAR: ResourceInfo = info(AUTHORIZATION, "SelfSubjectAccessReview", "selfsubjectaccessreviews", false);
const SSRR: ResourceInfo = info(AUTHORIZATION, "SelfSubjectRulesReview", "selfsubjectrulesreviews", false);
const SAR: ResourceInfo = info(AUTHORIZATION, "SubjectAccessReview", "subjectaccessreviews", false);
const TOKEN_REVIEW: ResourceInfo = info(AUTHENTICATION, "TokenReview", "tokenreviews", false);

/// What discovery lists for the two groups.
pub const LISTED: [Listed<'static>; 6] = [
    Listed { info: &SELF_SUBJECT_REVIEW, verbs: &["create"] },
    Listed { info: &TOKEN_REVIEW, verbs: &["create"] },
    Listed { info: &LOCAL_SAR, verbs: &["create"] },
    Listed { info: &SSAR, verbs: &["create"] },
    Listed { info: &SSRR, verbs: &["create"] },
    Listed { info: &SAR, verbs: &["create"] },
];

/// Each review kind with its schema, for the OpenAPI documents (kubectl validates with them).
pub fn schemas() -> Vec<(&'static ResourceInfo, super::SchemaFn)> {
    use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenReview};
    use k8s_openapi::api::authorization::v1::{
        LocalSubjectAccessReview, SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview,
    };
    fn of<T: schemars::JsonSchema>() -> super::SchemaFn {
        Box::new(|g: &mut schemars::SchemaGenerator| g.subschema_for::<T>())
    }
    vec![
        (&SELF_SUBJECT_REVIEW, of::<SelfSubjectReview>()),
        (&TOKEN_REVIEW, of::<TokenReview>()),
        (&LOCAL_SAR, of::<LocalSubjectAccessReview>()),
        (&SSAR, of::<SelfSubjectAccessReview>()),
        (&SSRR, of::<SelfSubjectRulesReview>()),
        (&SAR, of::<SubjectAccessReview>()),
    ]
}

pub fn routes() -> axum::Router<Arc<AppState>> {
    let authn = format!("/apis/{AUTHENTICATION}/v1");
    let authz = format!("/apis/{AUTHORIZATION}/v1");
    axum::Router::new()
        .route(&format!("{authn}/selfsubjectreviews"), post(self_subject_review))
        .route(&format!("{authn}/tokenreviews"), post(token_review))
        .route(&format!("{authz}/selfsubjectaccessreviews"), post(self_subject_access_review))
        .route(&format!("{authz}/subjectaccessreviews"), post(subject_access_review))
        .route(
            &format!("{authz}/namespaces/{{namespace}}/localsubjectaccessreviews"),
            post(local_subject_access_review),
        )
        .route(&format!("{authz}/selfsubjectrulesreviews"), post(self_subject_rules_review))
}

/// The caller; every request that reaches a handler has been authenticated.
fn caller(headers_user: Option<&User>) -> Result<User, StatusError> {
    headers_user.cloned().ok_or_else(StatusError::unauthorized)
}

fn body(headers: &HeaderMap, bytes: &[u8], info: &ResourceInfo) -> Result<Value, StatusError> {
    let v = codec::parse_body(headers, bytes)?;
    if v["kind"].as_str().is_some_and(|k| k != info.kind) {
        return Err(StatusError::bad_request(format!(
            "the body is a {} but {} takes a {}",
            v["kind"].as_str().unwrap_or_default(),
            info.plural,
            info.kind
        )));
    }
    Ok(v)
}

/// The object as sent, with its `status`, as `201 Created`.
fn answer(info: &ResourceInfo, mut obj: Value, status: Value) -> Response {
    obj["apiVersion"] = json!(info.api_version());
    obj["kind"] = json!(info.kind);
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["status"] = status;
    codec::json_value(StatusCode::CREATED, &obj)
}

fn invalid(info: &ResourceInfo, errs: &[FieldError]) -> StatusError {
    StatusError::invalid(info.kind, info.group, "", errs)
}

/// The attributes a review asks about, or why it cannot be read.
fn review_attributes(spec: &SubjectAccessReviewSpec, info: &ResourceInfo) -> Result<Attributes, StatusError> {
    match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(r), None) => Ok(attributes_of(r)),
        (None, Some(n)) => Ok(Attributes {
            verb: n.verb.clone().unwrap_or_default(),
            resource: None,
            path: n.path.clone().unwrap_or_default(),
        }),
        (Some(_), Some(_)) => Err(invalid(
            info,
            &[FieldError::invalid_raw(
                "spec.nonResourceAttributes",
                "&authorization.NonResourceAttributes{...}",
                "cannot be specified in combination with resourceAttributes",
            )],
        )),
        (None, None) => Err(invalid(
            info,
            &[FieldError::invalid_raw(
                "spec.resourceAttributes",
                "nil",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        )),
    }
}

fn attributes_of(r: &ReviewResource) -> Attributes {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    Attributes {
        verb: text(&r.verb),
        resource: Some(ResourceAttributes {
            group: text(&r.group),
            resource: text(&r.resource),
            subresource: text(&r.subresource),
            namespace: text(&r.namespace),
            name: text(&r.name),
            field_equals: Vec::new(),
        }),
        path: String::new(),
    }
}

fn decision_status(decision: Decision) -> Value {
    let status = match decision {
        Decision::Allow => SubjectAccessReviewStatus { allowed: true, ..Default::default() },
        Decision::Deny(why) => {
            SubjectAccessReviewStatus { allowed: false, denied: Some(true), reason: Some(why), ..Default::default() }
        }
        Decision::NoOpinion(why) => {
            SubjectAccessReviewStatus { allowed: false, reason: (!why.is_empty()).then_some(why), ..Default::default() }
        }
    };
    serde_json::to_value(status).unwrap_or_default()
}

fn spec_of(obj: &Value, info: &ResourceInfo) -> Result<SubjectAccessReviewSpec, StatusError> {
    serde_json::from_value(obj["spec"].clone())
        .map_err(|e| StatusError::bad_request(format!("the {}'s spec is not valid: {e}", info.kind)))
}

async fn self_subject_access_review(
    State(state): State<Arc<AppState>>,
    user: Option<axum::Extension<User>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let run = || -> Result<Response, StatusError> {
        let user = caller(user.as_deref())?;
        let obj = body(&headers, &bytes, &SSAR)?;
        let spec = spec_of(&obj, &SSAR)?;
        let attrs = review_attributes(&spec, &SSAR)?;
        let decision = authz::decide(&state.registry, &state.authorization, &user, &attrs);
        Ok(answer(&SSAR, obj, decision_status(decision)))
    };
    run().unwrap_or_else(|e| e.into_response())
}

/// Decides for the user the spec names.
fn review_for(
    state: &AppState,
    info: &ResourceInfo,
    obj: Value,
    namespace: Option<&str>,
) -> Result<Response, StatusError> {
    let spec = spec_of(&obj, info)?;
    if spec.user.as_deref().unwrap_or_default().is_empty() && spec.groups.as_deref().unwrap_or_default().is_empty() {
        return Err(invalid(
            info,
            &[FieldError::invalid("spec.user", "", "at least one of user or group must be specified")],
        ));
    }
    let attrs = review_attributes(&spec, info)?;
    if let Some(ns) = namespace {
        let asked = attrs.resource.as_ref().map(|r| r.namespace.as_str());
        if asked != Some(ns) {
            return Err(invalid(
                info,
                &[FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    asked.unwrap_or_default(),
                    "must match metadata.namespace",
                )],
            ));
        }
    }
    let subject = User::new(spec.user.clone().unwrap_or_default(), spec.groups.clone().unwrap_or_default());
    let decision = authz::decide(&state.registry, &state.authorization, &subject, &attrs);
    Ok(answer(info, obj, decision_status(decision)))
}

async fn subject_access_review(State(state): State<Arc<AppState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    body(&headers, &bytes, &SAR)
        .and_then(|obj| review_for(&state, &SAR, obj, None))
        .unwrap_or_else(|e| e.into_response())
}

async fn local_subject_access_review(
    State(state): State<Arc<AppState>>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    body(&headers, &bytes, &LOCAL_SAR)
        .and_then(|mut obj| {
            obj["metadata"]["namespace"] = json!(namespace);
            review_for(&state, &LOCAL_SAR, obj, Some(&namespace))
        })
        .unwrap_or_else(|e| e.into_response())
}

async fn self_subject_rules_review(
    State(state): State<Arc<AppState>>,
    user: Option<axum::Extension<User>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let run = || -> Result<Response, StatusError> {
        let user = caller(user.as_deref())?;
        let obj = body(&headers, &bytes, &SSRR)?;
        let namespace = obj["spec"]["namespace"].as_str().unwrap_or_default().to_string();
        let rules = authz::rules_of(&state.registry, &user, &namespace);
        let mut status = SubjectRulesReviewStatus::default();
        for rule in rules {
            let text = |v: Option<Vec<String>>| v.filter(|v| !v.is_empty());
            match rule.non_resource_urls.clone().filter(|u| !u.is_empty()) {
                Some(urls) => {
                    status.non_resource_rules.push(NonResourceRule { verbs: rule.verbs, non_resource_urls: Some(urls) })
                }
                None => status.resource_rules.push(ResourceRule {
                    verbs: rule.verbs,
                    api_groups: text(rule.api_groups),
                    resources: text(rule.resources),
                    resource_names: text(rule.resource_names),
                }),
            }
        }
        Ok(answer(&SSRR, obj, serde_json::to_value(status).unwrap_or_default()))
    };
    run().unwrap_or_else(|e| e.into_response())
}

async fn self_subject_review(user: Option<axum::Extension<User>>, headers: HeaderMap, bytes: Bytes) -> Response {
    let run = || -> Result<Response, StatusError> {
        let user = caller(user.as_deref())?;
        let obj = body(&headers, &bytes, &SELF_SUBJECT_REVIEW)?;
        let status = json!({"userInfo": user_info(&user)});
        Ok(answer(&SELF_SUBJECT_REVIEW, obj, status))
    };
    run().unwrap_or_else(|e| e.into_response())
}

/// The user info of a review's answer, as upstream's `UserInfo`.
fn user_info(user: &User) -> Value {
    let mut groups = user.groups.clone();
    if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        groups.push(AUTHENTICATED_GROUP.into());
    }
    let mut info = json!({"username": user.name, "groups": groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

/// `TokenReview`: who `spec.token` stands for, if anyone, for one of `spec.audiences` (the API's
/// own when none are named). A token that does not authenticate is an answer, not an error.
async fn token_review(State(state): State<Arc<AppState>>, headers: HeaderMap, bytes: Bytes) -> Response {
    let run = || -> Result<Response, StatusError> {
        let obj = body(&headers, &bytes, &TOKEN_REVIEW)?;
        let token = obj["spec"]["token"].as_str().unwrap_or_default().trim().to_string();
        if token.is_empty() {
            return Err(invalid(&TOKEN_REVIEW, &[FieldError::required("spec.token", "")]));
        }
        let api_audiences = state.sa_tokens.get().map(|t| t.policy().audiences.clone()).unwrap_or_default();
        let asked: Vec<String> = obj["spec"]["audiences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let audiences: Vec<String> = if asked.is_empty() {
            api_audiences.clone()
        } else {
            asked.iter().filter(|a| api_audiences.contains(a)).cloned().collect()
        };
        let status = if audiences.is_empty() {
            json!({"authenticated": false, "user": {}, "error": format!(
                "token audiences {api_audiences:?} is invalid for the target audiences {asked:?}")})
        } else {
            match super::authenticate_token(&state, &token) {
                Ok(user) => json!({"authenticated": true, "user": user_info(&user), "audiences": audiences}),
                Err(_) => {
                    json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token lookup failed]"})
                }
            }
        };
        Ok(answer(&TOKEN_REVIEW, obj, status))
    };
    run().unwrap_or_else(|e| e.into_response())
}
