//! The downward API shared by downwardAPI volumes and container env: pod field paths
//! (`fieldpath.ExtractFieldPathAsString`) and container resources (`ExtractContainerResourceValue`,
//! with limits defaulted to node allocatable as kubelet's `MergeContainerResourceLimits`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector};

use super::atomic::{FileProjection, Payload};
use super::{NodeResources, SetUpError, mode};
use crate::registry::kinds::pod_rules::parse_quantity;

/// downwardAPI `CollectData`: one file per item; failing items are left out and reported together.
pub(crate) fn payload(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    node: &NodeResources,
) -> Result<Payload, SetUpError> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_path(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            resource_value(r, pod, None, node)
        } else {
            continue;
        };
        match value {
            Ok(v) => {
                payload.insert(
                    item.path.clone(),
                    FileProjection { data: v.into_bytes(), mode: mode(item.mode, default_mode) },
                );
            }
            Err(e) => errors.push(SetUpError::Invalid(e)),
        }
    }
    match errors.len() {
        0 => Ok(payload),
        1 => Err(errors.remove(0)),
        _ => Err(SetUpError::Aggregate(errors)),
    }
}

/// `ExtractFieldPathAsString`: metadata fields, and `labels['k']` / `annotations['k']`.
pub(crate) fn field_path(pod: &Pod, path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if let Some((base, key)) = split_subscript(path) {
        let map = match base {
            "metadata.annotations" => annotations,
            "metadata.labels" => labels,
            _ => return Err(format!("fieldPath {path:?} does not support subscript")),
        };
        if !is_qualified_name(&key.to_lowercase()) {
            return Err(format!("invalid key subscript in {path}: {key:?} is not a valid qualified name"));
        }
        return Ok(map.get(key).cloned().unwrap_or_default());
    }
    Ok(match path {
        "metadata.annotations" => format_map(annotations),
        "metadata.labels" => format_map(labels),
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        _ => return Err(format!("unsupported fieldPath: {path}")),
    })
}

/// `metadata.labels['key']` → (`metadata.labels`, `key`).
pub(crate) fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let (base, key) = path.strip_suffix("']")?.split_once("['")?;
    (!base.is_empty()).then_some((base, key))
}

/// kubelet's `FormatMap`: sorted `key="value"` lines (Go `%q` quoting), no trailing newline.
pub(crate) fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter().map(|(k, v)| format!("{k}={}", go_quote(v))).collect::<Vec<_>>().join("\n")
}

/// Go's `strconv.Quote`.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() && (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\U{:08x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `IsQualifiedName`: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// A container resource for `resourceFieldRef`, divided by `divisor` and rounded up. `container`
/// is the env's own container, used when the selector names none; limits the container does not
/// set (or sets to zero) are the node's allocatable.
pub(crate) fn resource_value(
    sel: &ResourceFieldSelector,
    pod: &Pod,
    container: Option<&Container>,
    node: &NodeResources,
) -> Result<String, String> {
    let name = sel.container_name.as_deref().unwrap_or("");
    let container = match container {
        Some(c) if name.is_empty() => c,
        _ => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .find(|c| c.name == name)
            .ok_or_else(|| format!("container {name} not found"))?,
    };
    let (kind, resource) =
        sel.resource.split_once('.').ok_or_else(|| format!("unsupported container resource : {}", sel.resource))?;
    let resources = container.resources.as_ref();
    let list = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err(format!("unsupported container resource : {}", sel.resource)),
    };
    let set = list.and_then(|l| l.get(resource)).and_then(|q| parse_quantity(&q.0));
    let allocatable = match resource {
        "cpu" => i128::from(node.cpu_milli),
        "memory" => i128::from(node.memory_bytes) * 1000,
        "ephemeral-storage" => i128::from(node.ephemeral_storage_bytes) * 1000,
        _ => return Err(format!("unsupported container resource : {}", sel.resource)),
    };
    let milli = match set {
        Some(v) if v != 0 || kind == "requests" => v,
        _ if kind == "limits" => allocatable,
        _ => 0,
    };
    let divisor = sel.divisor.as_ref().and_then(|q| parse_quantity(&q.0)).filter(|d| *d != 0).unwrap_or(1000);
    let value = if resource == "cpu" {
        ceil_div(milli, divisor)
    } else {
        // Bytes: both quantities rounded up to whole units first, as `Quantity.Value()`.
        ceil_div(ceil_div(milli, 1000), ceil_div(divisor, 1000).max(1))
    };
    Ok(value.to_string())
}

pub(crate) fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) == (b < 0)) { q + 1 } else { q }
}
