//! The one error type of the registry: a Kubernetes `Status` in plain data.
//!
//! Constructors mirror `k8s.io/apimachinery/pkg/api/errors` so codes, reasons and messages match
//! upstream. Only `api` turns it into an HTTP response.

use std::fmt;

use super::validation::{ErrorType, FieldError};

/// Identifies the resource an error is about, as upstream's `GroupResource`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() { f.write_str(&self.resource) } else { write!(f, "{}.{}", self.resource, self.group) }
    }
}

/// One cause of a failure (`StatusCause`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// `StatusDetails`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub uid: String,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<i32>,
}

/// A failed request, rendered by `api` as a `meta/v1 Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<Details>>,
}

pub type Result<T, E = StatusError> = std::result::Result<T, E>;

impl fmt::Display for StatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StatusError {}

fn details(gr: &GroupResource, name: &str) -> Option<Box<Details>> {
    Some(Box::new(Details {
        name: name.to_string(),
        group: gr.group.clone(),
        kind: gr.resource.clone(),
        ..Default::default()
    }))
}

impl StatusError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        Self { details: details(gr, name), ..Self::new(404, "NotFound", format!("{gr} \"{name}\" not found")) }
    }

    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        Self {
            details: details(gr, name),
            ..Self::new(409, "AlreadyExists", format!("{gr} \"{name}\" already exists"))
        }
    }

    pub fn conflict(gr: &GroupResource, name: &str, why: impl fmt::Display) -> Self {
        Self {
            details: details(gr, name),
            ..Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {gr} \"{name}\": {why}"))
        }
    }

    /// A list or watch from a revision the store has not reached (`NewTooLargeResourceVersionError`):
    /// clients relist.
    pub fn too_large_resource_version(asked: u64, current: u64) -> Self {
        Self {
            details: Some(Box::new(Details {
                causes: vec![Cause {
                    reason: "ResourceVersionTooLarge".into(),
                    message: "Too large resource version".into(),
                    field: String::new(),
                }],
                retry_after_seconds: Some(1),
                ..Default::default()
            })),
            ..Self::new(504, "Timeout", format!("Too large resource version: {asked}, current: {current}"))
        }
    }

    /// A server-side apply that would change fields other managers own (`NewApplyConflict`).
    pub fn apply_conflict(message: String, causes: Vec<Cause>) -> Self {
        Self {
            details: Some(Box::new(Details { causes, ..Default::default() })),
            ..Self::new(409, "Conflict", message)
        }
    }

    /// The optimistic-concurrency failure clients retry on.
    pub fn modified(gr: &GroupResource, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per field error: `Pod "x" is invalid: [a: ..., b: ...]`,
    /// `Deployment.apps "x" is invalid: ...` for a kind of a named group.
    pub fn invalid(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> Self {
        let rendered: Vec<String> = errs.iter().map(ToString::to_string).collect();
        let summary = match rendered.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let causes = errs
            .iter()
            .map(|e| Cause {
                reason: e.kind.reason().to_string(),
                message: match e.kind {
                    ErrorType::Required if e.detail.is_empty() => "Required value".to_string(),
                    ErrorType::Required => format!("Required value: {}", e.detail),
                    _ => e.detail.clone(),
                },
                field: e.field.clone(),
            })
            .collect();
        Self {
            details: Some(Box::new(Details {
                name: name.to_string(),
                group: group.to_string(),
                kind: kind.to_string(),
                causes,
                ..Default::default()
            })),
            // Upstream's `GroupKind.String()`: `Deployment.apps`, plain `Pod` for the core group.
            ..Self::new(422, "Invalid", {
                let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
                format!("{qualified} \"{name}\" is invalid: {summary}")
            })
        }
    }

    /// 429 with one cause (`NewTooManyRequests`, as the eviction subresource sends it).
    pub fn too_many_requests(message: impl Into<String>, cause: Cause) -> Self {
        Self {
            details: Some(Box::new(Details { causes: vec![cause], ..Default::default() })),
            ..Self::new(429, "TooManyRequests", message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(gr: &GroupResource, name: &str, why: impl fmt::Display) -> Self {
        let message = if name.is_empty() {
            format!("{gr} is forbidden: {why}")
        } else {
            format!("{gr} \"{name}\" is forbidden: {why}")
        };
        Self { details: details(gr, name), ..Self::new(403, "Forbidden", message) }
    }

    /// 403 about something that is not a resource (upstream's `NewForbidden` without a group resource).
    pub fn forbidden_plain(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 410 Gone for a watch or list from a compacted revision.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit}"))
    }

    pub fn unsupported_media_type(got: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({got}) - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 404 for a path that names no resource (upstream's plain "the server could not find the requested resource").
    pub fn no_route() -> Self {
        Self {
            details: Some(Box::default()),
            ..Self::new(404, "NotFound", "the server could not find the requested resource")
        }
    }

    pub fn internal(message: impl fmt::Display) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {message}"))
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 504 for a storage request that did not finish in time (upstream's `NewTimeoutError` text).
    pub fn storage_timeout() -> Self {
        Self::new(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )
    }

    /// A node endpoint's error answer passed on (upstream's `NewGenericServerResponse`): its code,
    /// the reason for that code, and its text as the message.
    pub fn from_node(code: u16, text: String) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        let text = if text.is_empty() {
            format!("the server responded with the status code {code} but did not return more information")
        } else {
            text
        };
        Self::new(code, reason, text)
    }
}
