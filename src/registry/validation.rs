//! Field-level validation errors and the name validators upstream applies everywhere.
//!
//! Messages follow `k8s.io/apimachinery/pkg/util/validation` so that users see the same text as on
//! upstream Kubernetes.

use std::fmt;

/// The kind of a field error; maps to the `reason` of a `StatusCause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Forbidden,
    Duplicate,
    TooLong,
    TooMany,
}

impl ErrorType {
    /// The `StatusCause.reason` upstream uses for this error type.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
        }
    }
}

/// One invalid field, as in upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorType,
    /// Dotted path with indices, e.g. `spec.containers[0].image`.
    pub field: String,
    /// Human-readable detail (already includes the offending value where upstream shows it).
    pub detail: String,
}

pub type ErrorList = Vec<FieldError>;

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: ErrorType::Required, field: field.into(), detail: detail.into() }
    }
    /// `Invalid value: "x": detail`, as upstream renders it.
    pub fn invalid(field: impl Into<String>, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        let value = value.to_string();
        Self { kind: ErrorType::Invalid, field: field.into(), detail: format!("Invalid value: {value:?}: {detail}") }
    }
    /// `Invalid value: 5: detail`: a value upstream prints unquoted (numbers, Go maps).
    pub fn invalid_raw(field: impl Into<String>, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorType::Invalid,
            field: field.into(),
            detail: format!("Invalid value: {value}: {}", detail.into()),
        }
    }
    pub fn not_supported(field: impl Into<String>, value: impl fmt::Display, valid: &[&str]) -> Self {
        let valid: Vec<String> = valid.iter().map(|v| format!("{v:?}")).collect();
        Self {
            kind: ErrorType::NotSupported,
            field: field.into(),
            detail: format!("Unsupported value: {:?}: supported values: {}", value.to_string(), valid.join(", ")),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { kind: ErrorType::Forbidden, field: field.into(), detail: format!("Forbidden: {}", detail.into()) }
    }
    pub fn duplicate(field: impl Into<String>, value: impl fmt::Display) -> Self {
        Self {
            kind: ErrorType::Duplicate,
            field: field.into(),
            detail: format!("Duplicate value: {:?}", value.to_string()),
        }
    }
    /// `Duplicate value: 11`: a value upstream prints unquoted.
    pub fn duplicate_raw(field: impl Into<String>, value: impl fmt::Display) -> Self {
        Self { kind: ErrorType::Duplicate, field: field.into(), detail: format!("Duplicate value: {value}") }
    }
    /// `Too many: 21: must have at most 20 items`.
    pub fn too_many(field: impl Into<String>, count: usize, max: usize) -> Self {
        Self {
            kind: ErrorType::TooMany,
            field: field.into(),
            detail: format!("Too many: {count}: must have at most {max} items"),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self {
            kind: ErrorType::TooLong,
            field: field.into(),
            detail: format!("Too long: may not be more than {max} bytes"),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorType::Required => write!(f, "{}: Required value", self.field)?,
            _ => write!(f, "{}: {}", self.field, self.detail)?,
        }
        if self.kind == ErrorType::Required && !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Joins field paths: `path("spec", "containers")` → `spec.containers`.
pub fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}.{name}") }
}

/// Indexes a field path: `index("spec.containers", 0)` → `spec.containers[0]`.
pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// Keys a field path: `key("metadata.labels", "app")` → `metadata.labels[app]`.
pub fn key(parent: &str, k: &str) -> String {
    format!("{parent}[{k}]")
}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const LABEL_VALUE_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// RFC 1123 label: lower-case alphanumerics and '-', starting and ending alphanumeric, ≤ 63 chars.
/// Returns the problems found (empty when valid), with upstream's wording.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    let ok = !value.is_empty()
        && value.chars().all(|c| is_lower_alnum(c) || c == '-')
        && value.starts_with(is_lower_alnum)
        && value.ends_with(is_lower_alnum);
    if !ok {
        errs.push(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    errs
}

/// RFC 1035 label (Service names): as an RFC 1123 label, but starting with a letter.
pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    let ok = !value.is_empty()
        && value.chars().all(|c| is_lower_alnum(c) || c == '-')
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && value.ends_with(is_lower_alnum);
    if !ok {
        errs.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    errs
}

/// RFC 1123 subdomain: dot-separated RFC 1123 labels, ≤ 253 chars.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!("must be no more than {DNS1123_SUBDOMAIN_MAX} characters"));
    }
    let ok = !value.is_empty()
        && value.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| is_lower_alnum(c) || c == '-')
                && l.starts_with(is_lower_alnum)
                && l.ends_with(is_lower_alnum)
        });
    if !ok {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                .to_string(),
        );
    }
    errs
}

fn is_qualified_name_part(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= QUALIFIED_NAME_MAX
        && name.chars().all(|c| is_alnum(c) || c == '-' || c == '_' || c == '.')
        && name.starts_with(is_alnum)
        && name.ends_with(is_alnum)
}

/// A qualified name such as a label or annotation key: `[prefix/]name`, where the prefix is a DNS
/// subdomain and the name ≤ 63 chars of alphanumerics, '-', '_' and '.', alphanumeric at both ends.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            errs.extend(is_dns1123_subdomain(prefix).into_iter().map(|e| format!("prefix part {e}")));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part must be no more than {QUALIFIED_NAME_MAX} characters"));
    } else if !is_qualified_name_part(name) || name.contains('/') {
        errs.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
                .to_string(),
        );
    }
    errs
}

/// A label value: empty, or ≤ 63 chars of alphanumerics, '-', '_' and '.', alphanumeric at both ends.
pub fn is_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(format!("must be no more than {LABEL_VALUE_MAX} characters"));
    }
    let well_formed = value.chars().all(|c| is_alnum(c) || c == '-' || c == '_' || c == '.')
        && value.starts_with(is_alnum)
        && value.ends_with(is_alnum);
    if !value.is_empty() && !well_formed {
        errs.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
                .to_string(),
        );
    }
    errs
}

/// Validates a map of labels the way `ValidateLabels` does.
pub fn validate_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>, field: &str) -> ErrorList {
    let mut out = Vec::new();
    for (k, v) in labels {
        for e in is_qualified_name(k) {
            out.push(FieldError::invalid(field, k, e));
        }
        for e in is_label_value(v) {
            out.push(FieldError::invalid(key(field, k), v, e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns1123_label("my-name").is_empty());
        assert!(is_dns1123_label("a").is_empty());
        assert!(!is_dns1123_label("My-name").is_empty());
        assert!(!is_dns1123_label("-a").is_empty());
        assert!(!is_dns1123_label("").is_empty());
        assert!(!is_dns1123_label(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn subdomains() {
        assert!(is_dns1123_subdomain("example.com").is_empty());
        assert!(!is_dns1123_subdomain("example..com").is_empty());
        assert!(!is_dns1123_subdomain("Example.com").is_empty());
    }

    #[test]
    fn qualified_names() {
        assert!(is_qualified_name("app").is_empty());
        assert!(is_qualified_name("app.kubernetes.io/name").is_empty());
        assert!(is_qualified_name("My_Key.x").is_empty());
        assert!(!is_qualified_name("/name").is_empty());
        assert!(!is_qualified_name("a/b/c").is_empty());
        assert!(!is_qualified_name("-bad").is_empty());
        assert!(!is_qualified_name("").is_empty());
    }

    #[test]
    fn label_values() {
        assert!(is_label_value("").is_empty());
        assert!(is_label_value("v1.2_x-y").is_empty());
        assert!(!is_label_value("bad value").is_empty());
        assert!(!is_label_value(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn renders_like_upstream() {
        let e = FieldError::invalid("metadata.name", "Bad", "must be lowercase");
        assert_eq!(e.to_string(), "metadata.name: Invalid value: \"Bad\": must be lowercase");
        assert_eq!(FieldError::required("spec.containers", "").to_string(), "spec.containers: Required value");
    }
}
