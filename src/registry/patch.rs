//! Server-side application of the PATCH bodies kube-apiserver accepts: JSON patch (RFC 6902),
//! JSON merge patch (RFC 7386) and Kubernetes strategic merge patch.
//!
//! Strategic merge patch follows `k8s.io/apimachinery/pkg/util/strategicpatch` (`mergeMap`,
//! `mergeSlice`, `mergePatchIntoOriginal`), with list strategies taken from a table of
//! [`MergeKey`]s instead of Go struct tags. Deliberate differences from upstream:
//! - values added where the original has nothing (or a value of another type) are applied to an
//!   empty value rather than copied verbatim, so nulls and directives inside them never reach the
//!   stored object;
//! - `$patch: merge` is accepted as an explicit no-op instead of being rejected;
//! - `$deleteFromPrimitiveList` on an absent list is a no-op, and `$setElementOrder` for a field
//!   that is not a merge list is ignored.
//!
//! Stack depth: every recursion here follows the nesting of the patch body, and `serde_json`
//! refuses to parse documents nested deeper than 128 levels, which bounds it.

use serde_json::{Map, Value};

/// One list field with strategic-merge behaviour, addressed by its dotted path from the object
/// root with list indices omitted, e.g. `"spec.containers"`, `"spec.containers.ports"`,
/// `"spec.initContainers.env"`. Lists not in the table are replaced wholesale by a patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeKey {
    pub path: &'static str,
    /// Field identifying elements of a list of objects; `None` for a list of primitives merged
    /// as a set.
    pub key: Option<&'static str>,
    /// The field's strategy includes `retainKeys`. Informational: like kube-apiserver, a
    /// `$retainKeys` directive is honoured wherever a patch carries it.
    pub retain_keys: bool,
}

/// A list of objects merged by `key`.
pub const fn merge(path: &'static str, key: &'static str) -> MergeKey {
    MergeKey { path, key: Some(key), retain_keys: false }
}

/// A list of primitives merged as an ordered set (e.g. `metadata.finalizers`).
pub const fn primitive(path: &'static str) -> MergeKey {
    MergeKey { path, key: None, retain_keys: false }
}

/// A list of objects merged by `key` whose elements use the `retainKeys` strategy
/// (e.g. pod `spec.volumes`).
pub const fn merge_retain(path: &'static str, key: &'static str) -> MergeKey {
    MergeKey { path, key: Some(key), retain_keys: true }
}

/// Merge keys shared by every kind; [`apply`] always consults them after the kind's own table.
pub const METADATA_MERGE_KEYS: &[MergeKey] =
    &[primitive("metadata.finalizers"), merge("metadata.ownerReferences", "uid")];

/// The PATCH content types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    StrategicMerge,
}

impl PatchType {
    /// Parses a `Content-Type` header value; parameters such as `; charset=utf-8` are ignored.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let media = ct.split(';').next().unwrap_or_default().trim();
        [Self::Json, Self::Merge, Self::StrategicMerge]
            .into_iter()
            .find(|pt| media.eq_ignore_ascii_case(pt.content_type()))
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json-patch+json",
            Self::Merge => "application/merge-patch+json",
            Self::StrategicMerge => "application/strategic-merge-patch+json",
        }
    }
}

/// Why a patch could not be applied. Every variant is the client's fault except
/// [`PatchError::OriginalNotObject`].
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("patch body is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("the {content_type} patch body must be a JSON {expected}, but it is {found}")]
    WrongBodyType { content_type: &'static str, expected: &'static str, found: &'static str },
    #[error("invalid JSON patch operation list: {0}")]
    InvalidJsonPatch(#[source] serde_json::Error),
    #[error("JSON patch operation at index {index} ({op} {path:?}) failed: {reason}")]
    JsonPatchFailed { index: usize, op: &'static str, path: String, reason: String },
    #[error("the object being patched is not a JSON object")]
    OriginalNotObject,
    #[error("an element of list {path:?} has no merge key {key:?}")]
    MissingMergeKey { path: String, key: &'static str },
    #[error("invalid strategic merge patch at {path:?}: {reason}")]
    InvalidStrategicPatch { path: String, reason: String },
}

/// Applies `patch` (raw request body bytes) of type `pt` to `original`; `keys` is the per-kind
/// merge-key table (only used for [`PatchType::StrategicMerge`]).
pub fn apply(original: &Value, patch: &[u8], pt: PatchType, keys: &[MergeKey]) -> Result<Value, PatchError> {
    let body: Value = serde_json::from_slice(patch).map_err(PatchError::InvalidJson)?;
    let wrong = |expected, found: &Value| PatchError::WrongBodyType {
        content_type: pt.content_type(),
        expected,
        found: type_name(found),
    };
    match pt {
        PatchType::Json => {
            if !body.is_array() {
                return Err(wrong("array", &body));
            }
            let ops: json_patch::Patch = serde_json::from_value(body).map_err(PatchError::InvalidJsonPatch)?;
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| json_patch_error(&ops, e))?;
            Ok(doc)
        }
        PatchType::Merge => {
            if !body.is_object() {
                return Err(wrong("object", &body));
            }
            let mut doc = original.clone();
            json_patch::merge(&mut doc, &body);
            Ok(doc)
        }
        PatchType::StrategicMerge => {
            let Value::Object(patch) = body else {
                return Err(wrong("object", &body));
            };
            let Value::Object(original) = original else {
                return Err(PatchError::OriginalNotObject);
            };
            let merged = Strategic { keys }.merge_map(original.clone(), patch, "")?;
            Ok(Value::Object(merged))
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn json_patch_error(ops: &json_patch::Patch, e: json_patch::PatchError) -> PatchError {
    use json_patch::{PatchErrorKind as K, PatchOperation as Op};
    let op = match ops.0.get(e.operation) {
        Some(Op::Add(_)) => "add",
        Some(Op::Remove(_)) => "remove",
        Some(Op::Replace(_)) => "replace",
        Some(Op::Move(_)) => "move",
        Some(Op::Copy(_)) => "copy",
        Some(Op::Test(_)) => "test",
        None => "operation",
    };
    let reason = match e.kind {
        K::TestFailed => "the value at the path does not equal the expected value".to_owned(),
        K::InvalidPointer => "the path does not exist in the object".to_owned(),
        K::InvalidFromPointer => "the \"from\" path does not exist in the object".to_owned(),
        K::CannotMoveInsideItself => "a value cannot be moved into itself".to_owned(),
        other => other.to_string(),
    };
    PatchError::JsonPatchFailed { index: e.operation, op, path: e.path.to_string(), reason }
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

fn invalid(path: &str, reason: impl Into<String>) -> PatchError {
    let path = if path.is_empty() { "(root)" } else { path };
    PatchError::InvalidStrategicPatch { path: path.to_owned(), reason: reason.into() }
}

/// The field named by a parallel-list directive key such as `$setElementOrder/containers`.
fn directive_field<'k>(key: &'k str, prefix: &str, path: &str) -> Result<&'k str, PatchError> {
    match key.split_once('/') {
        Some((p, field)) if p == prefix && !field.is_empty() => Ok(field),
        _ => Err(invalid(path, format!("malformed directive {key:?}; expected \"{prefix}/<field>\""))),
    }
}

/// Scalar equality as Go's `==` on decoded JSON: all numbers compare as floats.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// What identifies a list element: its merge key's value for objects, the value itself otherwise.
fn ident<'v>(v: &'v Value, key: Option<&str>) -> Option<&'v Value> {
    match (key, v) {
        (Some(k), Value::Object(m)) => m.get(k),
        _ => Some(v),
    }
}

fn position(ids: &[Value], v: &Value, key: Option<&str>) -> Option<usize> {
    let id = ident(v, key)?;
    ids.iter().position(|x| same(x, id))
}

fn ids(list: &[Value], key: Option<&str>) -> Vec<Value> {
    list.iter().filter_map(|v| ident(v, key)).cloned().collect()
}

/// Orders a merged list as upstream's `normalizeElementOrder` does: elements named by
/// `patch_order` follow that order, the rest keep their `server_order`, and the two runs are
/// interleaved so server-only elements stay ahead of patch elements that came after them.
fn order(merged: Vec<Value>, patch_order: &[Value], server_order: &[Value], key: Option<&str>) -> Vec<Value> {
    let sorted = |mut items: Vec<Value>, by: &[Value]| {
        items.sort_by_cached_key(|v| position(by, v, key).unwrap_or(usize::MAX));
        items
    };
    let (from_patch, server_only): (Vec<_>, Vec<_>) =
        merged.into_iter().partition(|v| position(patch_order, v, key).is_some());
    let mut right = sorted(from_patch, patch_order).into_iter().peekable();
    let mut left = sorted(server_only, server_order).into_iter().peekable();
    let mut out = Vec::new();
    while let (Some(l), Some(r)) = (left.peek(), right.peek()) {
        let (li, ri) = (position(server_order, l, key), position(server_order, r, key));
        let next = if matches!((li, ri), (Some(a), Some(b)) if a < b) { left.next() } else { right.next() };
        out.extend(next);
    }
    out.extend(left);
    out.extend(right);
    out
}

struct Strategic<'a> {
    keys: &'a [MergeKey],
}

impl Strategic<'_> {
    fn lookup(&self, path: &str) -> Option<&MergeKey> {
        self.keys.iter().chain(METADATA_MERGE_KEYS).find(|k| k.path == path)
    }

    /// Upstream `mergeMap`: merges `patch` into `original`, both found at `path`.
    fn merge_map(
        &self,
        mut original: Map<String, Value>,
        mut patch: Map<String, Value>,
        path: &str,
    ) -> Result<Map<String, Value>, PatchError> {
        if let Some(directive) = patch.shift_remove(DIRECTIVE) {
            match directive.as_str() {
                Some("replace") => return self.merge_map(Map::new(), patch, path),
                Some("delete") => return Ok(Map::new()),
                Some("merge") => {}
                _ => {
                    return Err(invalid(
                        path,
                        format!("unknown $patch directive {directive} (use replace, delete or merge)"),
                    ));
                }
            }
        }
        if let Some(retain) = patch.shift_remove(RETAIN_KEYS) {
            retain_keys(&mut original, &patch, retain, path)?;
        }
        let orders: Vec<String> = patch.keys().filter(|k| k.starts_with(SET_ELEMENT_ORDER)).cloned().collect();
        for directive in orders {
            let field = directive_field(&directive, SET_ELEMENT_ORDER, path)?;
            let order = patch.shift_remove(&directive).unwrap_or_default();
            self.set_element_order(&mut original, &mut patch, field, order, path)?;
        }
        for (k, v) in patch {
            if k.starts_with(DELETE_FROM_PRIMITIVE_LIST) {
                let field = directive_field(&k, DELETE_FROM_PRIMITIVE_LIST, path)?;
                delete_from_list(&mut original, field, v, path)?;
                continue;
            }
            let child = join(path, &k);
            if v.is_null() {
                original.shift_remove(&k);
                continue;
            }
            match original.get_mut(&k) {
                Some(slot) => *slot = self.merge_value(std::mem::take(slot), v, &child)?,
                None => {
                    let fresh = self.fresh(v, &child)?;
                    original.insert(k, fresh);
                }
            }
        }
        Ok(original)
    }

    fn merge_value(&self, original: Value, patch: Value, path: &str) -> Result<Value, PatchError> {
        Ok(match (original, patch) {
            (Value::Object(o), Value::Object(p)) => Value::Object(self.merge_map(o, p, path)?),
            (Value::Array(o), Value::Array(p)) => match self.lookup(path) {
                Some(mk) => Value::Array(self.merge_list(o, p, mk, path)?),
                None => self.fresh(Value::Array(p), path)?,
            },
            (_, p) => self.fresh(p, path)?,
        })
    }

    /// A patch value applied where the original has nothing. Upstream copies it verbatim; here
    /// directives are resolved and nulls dropped on the way, so none reach the result.
    fn fresh(&self, patch: Value, path: &str) -> Result<Value, PatchError> {
        Ok(match patch {
            Value::Object(p) => Value::Object(self.merge_map(Map::new(), p, path)?),
            Value::Array(p) => {
                let merging = self.lookup(path).is_some();
                let mut out = Vec::with_capacity(p.len());
                for v in p {
                    // In a merge list, `$patch` elements are directives with nothing to act on.
                    if merging && let Some(directive) = v.get(DIRECTIVE) {
                        list_directive(directive, path)?;
                        continue;
                    }
                    out.push(self.fresh(v, path)?);
                }
                Value::Array(out)
            }
            scalar => scalar,
        })
    }

    /// Upstream `mergeSlice` for a list with merge strategy.
    fn merge_list(
        &self,
        original: Vec<Value>,
        patch: Vec<Value>,
        mk: &MergeKey,
        path: &str,
    ) -> Result<Vec<Value>, PatchError> {
        if original.is_empty() && patch.is_empty() {
            return Ok(original);
        }
        let all = || original.iter().chain(&patch);
        if all().any(Value::is_array) {
            return Err(invalid(path, "lists of lists cannot be merged"));
        }
        if !all().any(Value::is_object) {
            // A set of primitives: union keeping the first occurrence of each value.
            let server_order = original.clone();
            let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
            for v in original.into_iter().chain(patch.iter().cloned()) {
                if !merged.iter().any(|m| same(m, &v)) {
                    merged.push(v);
                }
            }
            return Ok(order(merged, &patch, &server_order, None));
        }
        if !all().all(Value::is_object) {
            return Err(invalid(path, "list mixes objects with other values"));
        }
        let Some(key) = mk.key else {
            return Err(invalid(path, "list of objects has no merge key and cannot be merged"));
        };
        let missing = || PatchError::MissingMergeKey { path: path.to_owned(), key };
        if original.iter().any(|v| v.get(key).is_none()) {
            return Err(missing());
        }

        let mut original = original;
        let mut plain = Vec::with_capacity(patch.len());
        let mut replace = false;
        for el in patch {
            let Some(directive) = el.get(DIRECTIVE) else {
                plain.push(el);
                continue;
            };
            match list_directive(directive, path)? {
                "delete" => {
                    let id = el.get(key).ok_or_else(missing)?;
                    original.retain(|o| !o.get(key).is_some_and(|v| same(v, id)));
                }
                "replace" => replace = true,
                _ => {}
            }
        }
        if replace {
            return plain.into_iter().map(|v| self.fresh(v, path)).collect();
        }

        let server_order = ids(&original, Some(key));
        let mut patch_order = Vec::with_capacity(plain.len());
        for el in plain {
            let id = el.get(key).ok_or_else(missing)?.clone();
            match original.iter().position(|o| o.get(key).is_some_and(|v| same(v, &id))) {
                Some(i) => original[i] = self.merge_value(std::mem::take(&mut original[i]), el, path)?,
                None => original.push(self.fresh(el, path)?),
            }
            patch_order.push(id);
        }
        Ok(order(original, &patch_order, &server_order, Some(key)))
    }

    /// Upstream `mergePatchIntoOriginal` for one `$setElementOrder/<field>` directive: merges the
    /// field's patch list (if any) and orders the result by the directive's list.
    fn set_element_order(
        &self,
        original: &mut Map<String, Value>,
        patch: &mut Map<String, Value>,
        field: &str,
        order_list: Value,
        path: &str,
    ) -> Result<(), PatchError> {
        let child = join(path, field);
        let Value::Array(order_list) = order_list else {
            return Err(invalid(&child, format!("{SET_ELEMENT_ORDER}/{field} must be a list")));
        };
        let Some(mk) = self.lookup(&child) else {
            return Ok(());
        };
        let current = match original.get_mut(field) {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => Some(std::mem::take(list)),
            Some(_) => return Err(invalid(&child, "the object's value is not a list")),
        };
        let patch_list = match patch.shift_remove(field) {
            None => None,
            Some(Value::Array(list)) => Some(list),
            Some(_) => {
                return Err(invalid(&child, format!("must be a list when {SET_ELEMENT_ORDER} is given")));
            }
        };
        if let Some(list) = &patch_list {
            check_order(list, &order_list, mk.key, &child)?;
        }
        let server_order = current.as_deref().map(|l| ids(l, mk.key)).unwrap_or_default();
        let merged = match (current, patch_list) {
            (None, None) => return Ok(()),
            (Some(current), None) => current,
            (current, Some(p)) => self.merge_list(current.unwrap_or_default(), p, mk, &child)?,
        };
        let wanted = ids(&order_list, mk.key);
        original.insert(field.to_owned(), Value::Array(order(merged, &wanted, &server_order, mk.key)));
        Ok(())
    }
}

/// Validates a `$patch` directive carried by a list element.
fn list_directive<'d>(directive: &'d Value, path: &str) -> Result<&'d str, PatchError> {
    match directive.as_str() {
        Some(d @ ("delete" | "replace" | "merge")) => Ok(d),
        _ => Err(invalid(
            path,
            format!("unknown $patch directive {directive} on a list element (use delete, replace or merge)"),
        )),
    }
}

/// Checks that the patch list's elements appear in `$setElementOrder` in the same relative order
/// (upstream `validatePatchWithSetOrderList`); directive elements are ignored.
fn check_order(patch: &[Value], order_list: &[Value], key: Option<&'static str>, path: &str) -> Result<(), PatchError> {
    let mut wanted = order_list.iter();
    for el in patch.iter().filter(|v| v.get(DIRECTIVE).is_none()) {
        let id = ident(el, key)
            .ok_or_else(|| PatchError::MissingMergeKey { path: path.to_owned(), key: key.unwrap_or_default() })?;
        if !wanted.any(|w| ident(w, key).is_some_and(|w| same(w, id))) {
            return Err(invalid(path, format!("the order of the patch list does not match {SET_ELEMENT_ORDER}")));
        }
    }
    Ok(())
}

/// Upstream `applyRetainKeysDirective`: drops fields of `original` not named in `$retainKeys`,
/// after checking that the patch sets no field outside it.
fn retain_keys(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    retain: Value,
    path: &str,
) -> Result<(), PatchError> {
    let Value::Array(retain) = retain else {
        return Err(invalid(path, format!("{RETAIN_KEYS} must be a list of field names")));
    };
    let keep = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    let parallel = |k: &str| k.starts_with(SET_ELEMENT_ORDER) || k.starts_with(DELETE_FROM_PRIMITIVE_LIST);
    if let Some((k, _)) = patch.iter().find(|&(k, v)| !v.is_null() && !parallel(k) && !keep(k)) {
        return Err(invalid(path, format!("the patch sets {k:?}, which is not listed in {RETAIN_KEYS}")));
    }
    original.retain(|k, _| keep(k));
    Ok(())
}

/// Applies `$deleteFromPrimitiveList/<field>`: removes the listed values from the field's list.
fn delete_from_list(
    original: &mut Map<String, Value>,
    field: &str,
    values: Value,
    path: &str,
) -> Result<(), PatchError> {
    let child = join(path, field);
    let Value::Array(values) = values else {
        return Err(invalid(&child, format!("{DELETE_FROM_PRIMITIVE_LIST}/{field} must be a list")));
    };
    match original.get_mut(field) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(list)) => {
            list.retain(|v| !values.iter().any(|d| same(d, v)));
            Ok(())
        }
        Some(_) => Err(invalid(&child, "the object's value is not a list")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const POD: &[MergeKey] = &[
        merge("spec.containers", "name"),
        merge("spec.initContainers", "name"),
        merge("spec.containers.env", "name"),
        merge("spec.containers.ports", "containerPort"),
        merge("spec.containers.volumeMounts", "mountPath"),
        merge_retain("spec.volumes", "name"),
        merge("status.conditions", "type"),
    ];

    const DEPLOYMENT: &[MergeKey] = &[
        merge("spec.template.spec.containers", "name"),
        merge("spec.template.spec.containers.volumeMounts", "mountPath"),
        merge_retain("spec.template.spec.volumes", "name"),
    ];

    /// The struct tags of upstream's `MergeItem` test type.
    const ITEM: &[MergeKey] = &[
        merge("mergingList", "name"),
        primitive("mergingIntList"),
        merge("mergeItemPtr", "name"),
        merge_retain("retainKeysMergingList", "name"),
        merge("retainKeysMap.mergingList", "name"),
        primitive("retainKeysMap.mergingIntList"),
    ];

    fn smp(original: Value, patch: Value, keys: &[MergeKey]) -> Value {
        let body = patch.to_string();
        let out = apply(&original, body.as_bytes(), PatchType::StrategicMerge, keys)
            .unwrap_or_else(|e| panic!("patch {body} failed: {e}"));
        assert_no_directives(&out);
        out
    }

    fn smp_err(original: Value, patch: Value, keys: &[MergeKey]) -> PatchError {
        let body = patch.to_string();
        match apply(&original, body.as_bytes(), PatchType::StrategicMerge, keys) {
            Ok(v) => panic!("patch {body} unexpectedly gave {v}"),
            Err(e) => e,
        }
    }

    fn assert_no_directives(v: &Value) {
        match v {
            Value::Object(m) => m.iter().for_each(|(k, v)| {
                assert!(!k.starts_with('$'), "directive {k} leaked");
                assert_no_directives(v);
            }),
            Value::Array(a) => a.iter().for_each(assert_no_directives),
            _ => {}
        }
    }

    fn names(list: &Value) -> Vec<&str> {
        list.as_array().expect("a list").iter().map(|c| c["name"].as_str().expect("a name")).collect()
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}, "finalizers": ["a", "b", "c"]},
            "spec": {
                "containers": [
                    {"name": "app", "image": "app:1", "args": ["--a", "--b"],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                     "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                    {"name": "sidecar", "image": "side:1"},
                    {"name": "injected", "image": "mesh:1"}
                ],
                "tolerations": [{"key": "k1", "operator": "Exists"}],
                "volumes": [{"name": "data", "emptyDir": {}}]
            },
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}
        })
    }

    #[test]
    fn content_types() {
        use PatchType::*;
        for pt in [Json, Merge, StrategicMerge] {
            assert_eq!(PatchType::from_content_type(pt.content_type()), Some(pt));
        }
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json; charset=utf-8"),
            Some(StrategicMerge)
        );
        assert_eq!(PatchType::from_content_type(" Application/JSON-Patch+JSON "), Some(Json));
        assert_eq!(PatchType::from_content_type("application/apply-patch+yaml"), None);
        assert_eq!(PatchType::from_content_type("application/json"), None);
        assert_eq!(PatchType::from_content_type(""), None);
    }

    #[test]
    fn containers_merge_by_name() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "app", "image": "app:2"}, {"name": "debug", "image": "busybox"}]}}),
            POD,
        );
        let containers = &out["spec"]["containers"];
        // Patch elements keep the patch's order; server-only ones are placed after them.
        assert_eq!(names(containers), ["app", "debug", "sidecar", "injected"]);
        assert_eq!(containers[0]["image"], "app:2");
        assert_eq!(containers[0]["args"], json!(["--a", "--b"]));
        assert_eq!(containers[1], json!({"name": "debug", "image": "busybox"}));

        // A new element alone goes first, as kubectl patch users see upstream.
        let out = smp(pod(), json!({"spec": {"containers": [{"name": "debug", "image": "busybox"}]}}), POD);
        assert_eq!(names(&out["spec"]["containers"]), ["debug", "app", "sidecar", "injected"]);
    }

    #[test]
    fn env_by_name_and_null_removes_field() {
        let patch = json!({"spec": {"containers": [{"name": "app", "env": [
            {"name": "B", "value": "2", "valueFrom": null},
            {"name": "C", "value": "3"}
        ]}]}});
        let out = smp(pod(), patch, POD);
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}])
        );
    }

    #[test]
    fn ports_by_container_port() {
        let patch = json!({"spec": {"containers": [{"name": "app", "ports": [
            {"containerPort": 80, "name": "http"},
            {"containerPort": 443, "name": "https"}
        ]}]}});
        let out = smp(pod(), patch, POD);
        assert_eq!(
            out["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443, "name": "https"}])
        );
    }

    #[test]
    fn conditions_by_type() {
        let out = smp(pod(), json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}), POD);
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}])
        );
        // Server-only elements that came first stay first.
        let out = smp(pod(), json!({"status": {"conditions": [{"type": "Initialized", "status": "False"}]}}), POD);
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "False"}])
        );
    }

    #[test]
    fn delete_directive() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}, {"name": "gone", "$patch": "delete"}]}}),
            POD,
        );
        assert_eq!(names(&out["spec"]["containers"]), ["app", "injected"]);

        let err = smp_err(pod(), json!({"spec": {"containers": [{"$patch": "delete"}]}}), POD);
        assert!(
            matches!(err, PatchError::MissingMergeKey { ref path, key: "name" } if path == "spec.containers"),
            "{err}"
        );

        // `$patch: delete` on a map empties it.
        let out = smp(pod(), json!({"metadata": {"labels": {"$patch": "delete"}}}), POD);
        assert_eq!(out["metadata"]["labels"], json!({}));
    }

    #[test]
    fn replace_directive() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "only", "image": "x", "env": [{"name": "A", "value": null}]}, {"$patch": "replace"}]}}),
            POD,
        );
        assert_eq!(out["spec"]["containers"], json!([{"name": "only", "image": "x", "env": [{"name": "A"}]}]));

        let out = smp(pod(), json!({"metadata": {"labels": {"$patch": "replace", "new": "1"}}}), POD);
        assert_eq!(out["metadata"]["labels"], json!({"new": "1"}));
        assert_eq!(out["metadata"]["name"], "web");
    }

    #[test]
    fn set_element_order_as_sent_by_kubectl_apply() {
        // Reorder app/sidecar, add "extra", delete nothing; "injected" is server-only.
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}, {"name": "extra"}],
            "containers": [{"name": "extra", "image": "extra:1"}]
        }});
        let out = smp(pod(), patch, POD);
        assert_eq!(names(&out["spec"]["containers"]), ["sidecar", "app", "extra", "injected"]);

        // Removing a container the last apply created.
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "app"}],
            "containers": [{"$patch": "delete", "name": "sidecar"}]
        }});
        let out = smp(pod(), patch, POD);
        assert_eq!(names(&out["spec"]["containers"]), ["app", "injected"]);

        // Nested: ports of one container reordered without content changes.
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}, {"name": "injected"}],
            "containers": [{"name": "app", "$setElementOrder/ports": [{"containerPort": 443}, {"containerPort": 80}],
                            "ports": [{"containerPort": 443}]}]
        }});
        let out = smp(pod(), patch, POD);
        assert_eq!(
            out["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 443}, {"containerPort": 80, "protocol": "TCP"}])
        );
    }

    #[test]
    fn finalizers_are_a_primitive_set() {
        // As upstream: patch values keep their relative order and land ahead of server-only
        // values that followed them ("c" here).
        let out = smp(pod(), json!({"metadata": {"finalizers": ["b", "d", "b"]}}), &[]);
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "d", "c"]));
        let out = smp(pod(), json!({"metadata": {"finalizers": ["d"]}}), &[]);
        assert_eq!(out["metadata"]["finalizers"], json!(["d", "a", "b", "c"]));
    }

    #[test]
    fn delete_from_primitive_list() {
        let patch = json!({"metadata": {
            "$setElementOrder/finalizers": ["a", "c"],
            "$deleteFromPrimitiveList/finalizers": ["b"]
        }});
        let out = smp(pod(), patch, &[]);
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));

        let out =
            smp(json!({"metadata": {}}), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}), &[]);
        assert_eq!(out, json!({"metadata": {}}));
    }

    #[test]
    fn retain_keys_switches_volume_source_and_strategy() {
        let original = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "old"}},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {"spec": {
                    "containers": [{"name": "web", "image": "nginx", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cfg"}}]
                }}
            }
        });
        // What `kubectl apply` sends after emptyDir -> hostPath and RollingUpdate -> Recreate.
        let patch = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "new"}},
            "spec": {
                "strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"},
                "template": {"spec": {
                    "$setElementOrder/volumes": [{"name": "data"}, {"name": "cfg"}],
                    "volumes": [{"$retainKeys": ["hostPath", "name"], "emptyDir": null,
                                 "hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}, "name": "data"}]
                }}
            }
        });
        let out = smp(original, patch, DEPLOYMENT);
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
        assert_eq!(
            out["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "data", "hostPath": {"path": "/srv/data", "type": "DirectoryOrCreate"}},
                   {"name": "cfg", "configMap": {"name": "cfg"}}])
        );
        assert_eq!(out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"], "new");
        assert_eq!(out["spec"]["template"]["spec"]["containers"][0]["image"], "nginx");

        // A field set by the patch must be listed in $retainKeys.
        let bad = json!({"spec": {"volumes": [{"$retainKeys": ["name"], "name": "data", "hostPath": {"path": "/x"}}]}});
        let err = smp_err(pod(), bad, POD);
        assert!(err.to_string().contains("hostPath"), "{err}");
    }

    #[test]
    fn null_deletes_keys() {
        let out = smp(pod(), json!({"metadata": {"labels": {"app": null, "env": "prod", "missing": null}}}), POD);
        assert_eq!(out["metadata"]["labels"], json!({"tier": "front", "env": "prod"}));
        let out = smp(json!({"metadata": {}}), json!({"metadata": {"labels": {"x": null, "y": "1"}}}), POD);
        assert_eq!(out["metadata"]["labels"], json!({"y": "1"}));
        let out = smp(pod(), json!({"status": null}), POD);
        assert!(out.get("status").is_none());
    }

    #[test]
    fn lists_without_merge_key_are_replaced() {
        let patch = json!({"spec": {
            "tolerations": [{"key": "k2", "operator": "Exists"}],
            "containers": [{"name": "app", "args": ["--c"]}]
        }});
        let out = smp(pod(), patch, POD);
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "k2", "operator": "Exists"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["--c"]));
        // Type changes replace the value.
        let out = smp(pod(), json!({"spec": {"tolerations": "none"}}), POD);
        assert_eq!(out["spec"]["tolerations"], "none");
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let original = json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}});
        let out = smp(
            original,
            json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "name": "b"}]}}),
            &[],
        );
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "1", "name": "a", "controller": true}, {"uid": "2", "name": "b"}])
        );
    }

    #[test]
    fn directives_never_leak_into_new_values() {
        let patch = json!({"spec": {
            "containers": [{"name": "new", "$setElementOrder/env": [{"name": "X"}],
                            "env": [{"name": "X", "value": "1"}, {"name": "Y", "$patch": "delete"}],
                            "securityContext": {"$retainKeys": ["runAsUser"], "runAsUser": 1}}],
            "initContainers": [{"name": "init"}, {"$patch": "replace"}],
            "$setElementOrder/volumes": [{"name": "v"}],
            "volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]
        }});
        let out = smp(json!({"spec": {}}), patch, POD);
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "new", "env": [{"name": "X", "value": "1"}], "securityContext": {"runAsUser": 1}}])
        );
        assert_eq!(out["spec"]["initContainers"], json!([{"name": "init"}]));
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v", "emptyDir": {}}]));

        // A merge list the object lacks is taken as given, like upstream's verbatim copy.
        let out = smp(json!({"spec": {}}), json!({"spec": {"containers": [{"image": "a"}, {"image": "b"}]}}), POD);
        assert_eq!(out["spec"]["containers"], json!([{"image": "a"}, {"image": "b"}]));
    }

    #[test]
    fn malformed_strategic_patches() {
        let err = smp_err(pod(), json!({"metadata": {"labels": {"$patch": "explode"}}}), POD);
        assert!(err.to_string().contains("explode"), "{err}");
        let err = smp_err(pod(), json!({"spec": {"containers": [{"name": "app", "$patch": "frobnicate"}]}}), POD);
        assert!(err.to_string().contains("frobnicate"), "{err}");
        let err = smp_err(pod(), json!({"metadata": {"$setElementOrder": ["a"]}}), POD);
        assert!(err.to_string().contains("malformed directive"), "{err}");
        let err = smp_err(pod(), json!({"metadata": {"$retainKeys": "name"}}), POD);
        assert!(err.to_string().contains("$retainKeys"), "{err}");
        let err = smp_err(pod(), json!({"spec": {"containers": [{"image": "x"}]}}), POD);
        assert!(matches!(err, PatchError::MissingMergeKey { .. }), "{err}");
        let err = smp_err(pod(), json!({"spec": {"containers": ["app"]}}), POD);
        assert!(err.to_string().contains("mixes objects"), "{err}");

        let err = apply(&pod(), b"[1]", PatchType::StrategicMerge, POD).expect_err("array body");
        assert_eq!(
            err.to_string(),
            "the application/strategic-merge-patch+json patch body must be a JSON object, but it is an array"
        );
        let err = apply(&json!([1]), b"{}", PatchType::StrategicMerge, POD).expect_err("array original");
        assert!(matches!(err, PatchError::OriginalNotObject));
    }

    #[test]
    fn hostile_nesting_is_rejected_not_overflowed() {
        let depth = 100_000;
        let body = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for pt in [PatchType::Merge, PatchType::StrategicMerge] {
            let err = apply(&json!({}), body.as_bytes(), pt, POD).expect_err("too deep");
            assert!(matches!(err, PatchError::InvalidJson(_)), "{err}");
        }
        let list = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let err = apply(&json!({}), list.as_bytes(), PatchType::Json, POD).expect_err("too deep");
        assert!(matches!(err, PatchError::InvalidJson(_)), "{err}");
    }

    #[test]
    fn json_patch() {
        let ops = json!([
            {"op": "test", "path": "/metadata/name", "value": "web"},
            {"op": "add", "path": "/metadata/labels/env", "value": "prod"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "app:3"},
            {"op": "remove", "path": "/metadata/finalizers/1"},
            {"op": "move", "from": "/metadata/labels/tier", "path": "/metadata/labels/layer"},
            {"op": "copy", "from": "/metadata/name", "path": "/metadata/generateName"}
        ]);
        let out = apply(&pod(), ops.to_string().as_bytes(), PatchType::Json, &[]).expect("applies");
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "env": "prod", "layer": "front"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
        assert_eq!(out["metadata"]["generateName"], "web");
        assert_eq!(out["spec"]["containers"][0]["image"], "app:3");
    }

    #[test]
    fn json_patch_failures() {
        let run = |ops: Value| apply(&pod(), ops.to_string().as_bytes(), PatchType::Json, &[]);
        let err = run(json!([{"op": "test", "path": "/metadata/name", "value": "db"}])).expect_err("test fails");
        assert!(
            matches!(&err, PatchError::JsonPatchFailed { index: 0, op: "test", path, .. } if path == "/metadata/name"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "JSON patch operation at index 0 (test \"/metadata/name\") failed: the value at the path does not equal the expected value"
        );

        let err = run(json!([
            {"op": "add", "path": "/metadata/labels/x", "value": "1"},
            {"op": "remove", "path": "/metadata/nope"}
        ]))
        .expect_err("remove fails");
        assert!(matches!(err, PatchError::JsonPatchFailed { index: 1, op: "remove", .. }), "{err:?}");
        assert!(err.to_string().contains("does not exist"), "{err}");

        let err = run(json!([{"op": "add", "path": "/no/such/parent", "value": 1}])).expect_err("add fails");
        assert!(matches!(err, PatchError::JsonPatchFailed { op: "add", .. }), "{err:?}");

        let err = run(json!([{"op": "frobnicate", "path": "/a"}])).expect_err("unknown op");
        assert!(matches!(err, PatchError::InvalidJsonPatch(_)), "{err:?}");
        let err = run(json!({"op": "add"})).expect_err("object body");
        assert!(err.to_string().contains("must be a JSON array, but it is an object"), "{err}");
        let err = apply(&pod(), b"[{", PatchType::Json, &[]).expect_err("bad json");
        assert!(matches!(err, PatchError::InvalidJson(_)), "{err:?}");
    }

    #[test]
    fn merge_patch() {
        // RFC 7386 section 3.
        let original = json!({"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},
                              "tags": ["example", "sample"], "content": "This will be unchanged"});
        let patch = json!({"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": null}, "tags": ["example"]});
        let out = apply(&original, patch.to_string().as_bytes(), PatchType::Merge, &[]).expect("applies");
        assert_eq!(
            out,
            json!({"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
                   "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890"})
        );
        // Lists are always replaced, merge keys notwithstanding.
        let patch = json!({"spec": {"containers": [{"name": "x"}]}});
        let out = apply(&pod(), patch.to_string().as_bytes(), PatchType::Merge, POD).expect("applies");
        assert_eq!(out["spec"]["containers"], json!([{"name": "x"}]));

        let err = apply(&pod(), b"[]", PatchType::Merge, &[]).expect_err("array body");
        assert!(matches!(err, PatchError::WrongBodyType { expected: "object", found: "an array", .. }), "{err:?}");
        let err = apply(&pod(), b"nope", PatchType::Merge, &[]).expect_err("bad json");
        assert!(matches!(err, PatchError::InvalidJson(_)), "{err:?}");
    }

    // Cases from upstream strategicpatch/patch_test.go (original/current, patch, expected result).

    #[test]
    fn upstream_order_preservation() {
        let original = json!({"mergingList": [{"name": 1}, {"name": 2, "value": "b"}, {"name": 3}]});
        let out = smp(
            original.clone(),
            json!({"mergingList": [{"name": 3, "value": "c"}, {"name": 1, "value": "a"}, {"name": 2, "other": "x"}]}),
            ITEM,
        );
        assert_eq!(
            out,
            json!({"mergingList": [{"name": 3, "value": "c"}, {"name": 1, "value": "a"}, {"name": 2, "value": "b", "other": "x"}]})
        );
        let out = smp(original, json!({"mergingList": [{"name": 3, "value": "c"}, {"name": 1, "value": "a"}]}), ITEM);
        assert_eq!(
            out,
            json!({"mergingList": [{"name": 2, "value": "b"}, {"name": 3, "value": "c"}, {"name": 1, "value": "a"}]})
        );
        let ints = json!({"mergingIntList": [1, 2, 3]});
        assert_eq!(smp(ints.clone(), json!({"mergingIntList": [3, 1, 2]}), ITEM), json!({"mergingIntList": [3, 1, 2]}));
        assert_eq!(smp(ints, json!({"mergingIntList": [3, 1]}), ITEM), json!({"mergingIntList": [2, 3, 1]}));
        assert_eq!(
            smp(json!({"mergingIntList": [1, 2]}), json!({"mergingIntList": [2, 3]}), ITEM),
            json!({"mergingIntList": [1, 2, 3]})
        );
    }

    #[test]
    fn upstream_directives() {
        let out = smp(
            json!({"mergingList": [{"name": 1}, {"name": 2}]}),
            json!({"mergingList": [{"$patch": "replace"}]}),
            ITEM,
        );
        assert_eq!(out, json!({"mergingList": []}));
        let out = smp(json!({"name": 1, "value": 1}), json!({"other": "a", "$patch": "replace"}), ITEM);
        assert_eq!(out, json!({"other": "a"}));
        let out = smp(json!({"simpleMap": {"key1": 1, "key2": 1}}), json!({"simpleMap": {"$patch": "delete"}}), ITEM);
        assert_eq!(out, json!({"simpleMap": {}}));
        let dup =
            json!({"mergingList": [{"name": 1}, {"name": 1}, {"name": 2, "value": "a"}, {"name": 3}, {"name": 3}]});
        let out =
            smp(dup, json!({"mergingList": [{"name": 1, "$patch": "delete"}, {"name": 3, "$patch": "delete"}]}), ITEM);
        assert_eq!(out, json!({"mergingList": [{"name": 2, "value": "a"}]}));
        let out = smp(json!({"name": "a", "other": "a"}), json!({"name": 1, "value": 1, "other": null}), ITEM);
        assert_eq!(out, json!({"name": 1, "value": 1}));
    }

    #[test]
    fn upstream_set_element_order() {
        // "merge lists of maps" (three-way result).
        let current = json!({"mergingList": [{"name": 1, "other": "a"}, {"name": 2, "value": 2, "other": "b"}]});
        let patch = json!({
            "$setElementOrder/mergingList": [{"name": 4}, {"name": 1}, {"name": 2}, {"name": 3}],
            "mergingList": [{"name": 4, "value": 4}, {"name": 3, "value": 3}]
        });
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"mergingList": [{"name": 4, "value": 4}, {"name": 1, "other": "a"},
                                   {"name": 2, "value": 2, "other": "b"}, {"name": 3, "value": 3}]})
        );

        // "$setElementOrder contains item that is not present in the list to be merged".
        let patch = json!({
            "$setElementOrder/mergingList": [{"name": 3}, {"name": 2}, {"name": 1}],
            "mergingList": [{"name": 3, "value": 3}, {"name": 1, "value": 1}]
        });
        assert_eq!(
            smp(json!({"mergingList": [{"name": 1}, {"name": 3}]}), patch, ITEM),
            json!({"mergingList": [{"name": 3, "value": 3}, {"name": 1, "value": 1}]})
        );

        // "delete items in lists of scalars" (three-way result).
        let patch = json!({"$setElementOrder/mergingIntList": [1, 2], "$deleteFromPrimitiveList/mergingIntList": [3]});
        assert_eq!(smp(json!({"mergingIntList": [1, 2, 3, 4]}), patch, ITEM), json!({"mergingIntList": [1, 2, 4]}));

        // "behavior of set element order for a merging int list with duplicate".
        let patch = json!({"$setElementOrder/mergingIntList": [2, 1, 4, 3, 2]});
        assert_eq!(
            smp(json!({"mergingIntList": [1, 2, 3, 2, 4]}), patch, ITEM),
            json!({"mergingIntList": [2, 2, 1, 4, 3]})
        );

        // "delete and reorder in one list, reorder in another".
        let current = json!({
            "mergingList": [{"name": "a", "value": "a"}, {"name": "b", "value": "b"}],
            "mergeItemPtr": [{"name": "c", "value": "c"}, {"name": "d", "value": "d"}]
        });
        let patch = json!({
            "$setElementOrder/mergingList": [{"name": "b"}],
            "$setElementOrder/mergeItemPtr": [{"name": "d"}, {"name": "c"}],
            "mergingList": [{"$patch": "delete", "name": "a"}]
        });
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"mergingList": [{"name": "b", "value": "b"}],
                   "mergeItemPtr": [{"name": "d", "value": "d"}, {"name": "c", "value": "c"}]})
        );

        // "should check if order in $setElementOrder and patch list match".
        let patch = json!({
            "$setElementOrder/mergingList": [{"name": 1}, {"name": 2}, {"name": 3}],
            "mergingList": [{"name": 3, "value": 3}, {"name": 1, "value": 1}]
        });
        let err = smp_err(json!({"mergingList": [{"name": 1}, {"name": 3}, {"name": 2}]}), patch, ITEM);
        assert!(err.to_string().contains("does not match"), "{err}");
        let patch = json!({"$setElementOrder/mergingIntList": [1, 2, 3], "mergingIntList": [3, 1]});
        let err = smp_err(json!({"mergingIntList": [1, 3, 2]}), patch, ITEM);
        assert!(err.to_string().contains("does not match"), "{err}");

        // "missing merge key should error out".
        let err = smp_err(
            json!({"mergingList": [{"name": 1, "value": "a"}]}),
            json!({"mergingList": [{"value": "b"}]}),
            ITEM,
        );
        assert!(matches!(err, PatchError::MissingMergeKey { key: "name", .. }), "{err}");
    }

    #[test]
    fn upstream_retain_keys() {
        // "retainKeys map should clear defaulted field with conflict (discriminated union)".
        let out = smp(
            json!({"retainKeysMap": {"name": "type1", "value": "foo"}}),
            json!({"retainKeysMap": {"$retainKeys": ["name", "other"], "name": "type2", "other": "bar"}}),
            ITEM,
        );
        assert_eq!(out, json!({"retainKeysMap": {"name": "type2", "other": "bar"}}));

        // "retainKeys map adds an item in nested merging list".
        let patch = json!({"retainKeysMap": {
            "$retainKeys": ["mergingList", "name"],
            "$setElementOrder/mergingList": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "mergingList": [{"name": "c"}]
        }});
        let current =
            json!({"retainKeysMap": {"name": "foo", "mergingList": [{"name": "a"}, {"name": "b"}, {"name": "x"}]}});
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"retainKeysMap": {"name": "foo", "mergingList": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "x"}]}})
        );

        // "retainKeys map adds an item in nested merging int list".
        let patch = json!({"retainKeysMap": {
            "$setElementOrder/mergingIntList": [1, 2, 4],
            "$retainKeys": ["mergingIntList", "name"],
            "mergingIntList": [4]
        }});
        let current = json!({"retainKeysMap": {"name": "foo", "mergingIntList": [1, 2, 3]}});
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"retainKeysMap": {"name": "foo", "mergingIntList": [1, 2, 4, 3]}})
        );

        // "retainKeys map adds an item and deletes an item in nested merging int list".
        let patch = json!({"retainKeysMap": {
            "$retainKeys": ["mergingIntList", "name"],
            "mergingIntList": [5],
            "$deleteFromPrimitiveList/mergingIntList": [2],
            "$setElementOrder/mergingIntList": [1, 3, 5]
        }});
        let current = json!({"retainKeysMap": {"name": "foo", "mergingIntList": [1, 2, 3, 4]}});
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"retainKeysMap": {"name": "foo", "mergingIntList": [1, 3, 5, 4]}})
        );

        // "retainKeys list of maps clears a field".
        let patch = json!({
            "$setElementOrder/retainKeysMergingList": [{"name": "bar"}, {"name": "foo"}],
            "retainKeysMergingList": [{"$retainKeys": ["name", "value"], "name": "foo"}]
        });
        let current = json!({"retainKeysMergingList": [{"name": "bar"}, {"name": "foo", "value": "a", "other": "x"}]});
        assert_eq!(
            smp(current, patch, ITEM),
            json!({"retainKeysMergingList": [{"name": "bar"}, {"name": "foo", "value": "a"}]})
        );
    }
}
