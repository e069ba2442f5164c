//! What varies per kind: a typed [`Kind`] implemented once per resource, erased to a JSON-level
//! [`Strategy`] that the generic storage in [`super::Registry`] drives.

use std::marker::PhantomData;

use k8s_openapi::Metadata as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::{GroupResource, Result, StatusError};
use super::patch::MergeKey;
use super::subresource::Subresource;
use super::validation::{self, ErrorList, FieldError};

/// Static facts about one served resource, used for routing, discovery and OpenAPI.
#[derive(Debug, Clone, Copy)]
pub struct ResourceInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// URL segment, e.g. `pods`.
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources served besides the main resource.
    pub subresources: &'static [Subresource],
    /// Key prefix in the store; two resources sharing it are two views of the same objects.
    pub storage: &'static str,
    /// Whether a successful immediate DELETE answers with the deleted object (as pods and
    /// namespaces do upstream) instead of a `Status`.
    pub return_deleted_object: bool,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }

    pub fn group_resource(&self) -> GroupResource {
        GroupResource { group: self.group.to_string(), resource: self.plural.to_string() }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// One column of a server-side Table, as `TableColumnDefinition`.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: i32,
}

impl Column {
    pub const fn new(name: &'static str, kind: &'static str, description: &'static str) -> Self {
        Self { name, kind, format: "", description, priority: 0 }
    }
    pub const fn wide(self) -> Self {
        Self { priority: 1, ..self }
    }
    pub const fn format(self, format: &'static str) -> Self {
        Self { format, ..self }
    }
}

/// The NAME column every table starts with.
pub const NAME_COLUMN: Column = Column::new(
    "Name",
    "string",
    "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
)
.format("name");

/// The AGE column most tables end with.
pub const AGE_COLUMN: Column = Column::new(
    "Age",
    "string",
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
);

/// How a DELETE of an existing object proceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// Remove at once (subject to finalizers).
    Immediate,
    /// Mark with `deletionTimestamp` and this grace period; someone else finishes the deletion.
    Graceful(i64),
}

/// Which rule an object's name must satisfy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS subdomain (most kinds).
    Subdomain,
    /// A DNS label (namespaces).
    Label,
    /// An RFC 1035 label (services: their names become DNS labels and environment variables).
    Dns1035Label,
    /// Anything usable as one URL path segment (events).
    PathSegment,
}

impl NameRule {
    /// Problems with `name` under this rule, in upstream's words.
    pub fn errors(self, name: &str) -> Vec<String> {
        match self {
            NameRule::Subdomain => validation::is_dns1123_subdomain(name),
            NameRule::Label => validation::is_dns1123_label(name),
            NameRule::Dns1035Label => validation::is_dns1035_label(name),
            NameRule::PathSegment => {
                if name == "." || name == ".." {
                    vec![format!("may not be '{name}'")]
                } else if let Some(c) = name.chars().find(|c| *c == '/' || *c == '%') {
                    vec![format!("may not contain '{c}'")]
                } else {
                    Vec::new()
                }
            }
        }
    }
}

/// Facts the storage hands to a [`Kind`] when it decides how a delete proceeds.
pub struct DeleteContext<'a> {
    /// `gracePeriodSeconds` from the request.
    pub requested_grace: Option<i64>,
    /// Whether a node of this name exists (for objects bound to nodes).
    pub node_exists: &'a (dyn Fn(&str) -> bool + Send + Sync),
}

/// The per-kind behaviour, written against typed `k8s-openapi` objects. Every method has the
/// behaviour of a kind with no special rules as its default.
pub trait Kind: Send + Sync + 'static {
    type Obj: k8s_openapi::Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned + schemars::JsonSchema + Clone;

    const INFO: ResourceInfo;
    /// Whether `metadata.generation` tracks spec changes.
    const GENERATION: bool = false;
    /// List fields with strategic-merge behaviour, beyond the metadata ones.
    const MERGE_KEYS: &'static [MergeKey] = &[];
    /// Field-selector fields beyond `metadata.name` and `metadata.namespace`.
    const FIELDS: &'static [&'static str] = &[];
    const NAME_RULE: NameRule = NameRule::Subdomain;
    /// Whether a `/status` update may change annotations (a Deployment's revision, which its
    /// controller writes with the status); otherwise the stored metadata is kept.
    const STATUS_WRITES_ANNOTATIONS: bool = false;

    /// Defaulting and resetting of server-owned fields on create.
    fn prepare_create(&self, _obj: &mut Self::Obj) {}
    fn validate(&self, _obj: &Self::Obj) -> ErrorList {
        Vec::new()
    }
    /// Resets what a main-resource update may not change (typically status).
    fn prepare_update(&self, _new: &mut Self::Obj, _old: &Self::Obj) {}
    fn validate_update(&self, new: &Self::Obj, _old: &Self::Obj) -> ErrorList {
        self.validate(new)
    }
    /// Resets everything but status on a `/status` update.
    fn prepare_status_update(&self, _new: &mut Self::Obj, _old: &Self::Obj) {}
    fn validate_status_update(&self, _new: &Self::Obj, _old: &Self::Obj) -> ErrorList {
        Vec::new()
    }
    /// An update through another subresource the kind judges itself (its [`ResourceInfo`] lists
    /// it and [`Subresource::uses_update_strategy`] says so): resets what it may not change.
    fn prepare_subresource_update(&self, _sub: Subresource, _new: &mut Self::Obj, _old: &Self::Obj) {}
    fn validate_subresource_update(&self, sub: Subresource, _new: &Self::Obj, _old: &Self::Obj) -> ErrorList {
        vec![FieldError::forbidden("", format!("updates through {} are not served", sub.name()))]
    }
    /// The value of a field-selector field of [`Kind::FIELDS`], read from the object's JSON (no typed
    /// decode: selectors run over every object of a list or watch). By default the field is the JSON
    /// path of the same name.
    fn field(&self, obj: &Value, field: &str) -> Option<String> {
        Some(field_at(obj, field))
    }
    /// Server-side table columns (all of them; kubectl hides priority 1 unless `-o wide`).
    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, AGE_COLUMN]
    }
    /// Cells for [`Kind::columns`].
    fn cells(&self, obj: &Self::Obj) -> Vec<Value> {
        vec![name_cell(obj.metadata()), age_cell(obj.metadata())]
    }
    fn deletion(&self, _obj: &Self::Obj, _ctx: &DeleteContext<'_>) -> Deletion {
        Deletion::Immediate
    }
    /// Whether something besides `metadata.finalizers` must finish before the object goes
    /// (a namespace's `spec.finalizers`).
    fn pending_finalizers(&self, _obj: &Self::Obj) -> bool {
        false
    }
    /// Marks an object whose deletion has begun (a namespace turns `Terminating`).
    fn mark_deleting(&self, _obj: &mut Self::Obj) {}
    /// Converts a stored object into this resource's representation (for two views of one storage).
    fn decode_stored(&self, stored: Value) -> Result<Value> {
        Ok(stored)
    }
    /// Converts this resource's representation into the stored one.
    fn encode_stored(&self, obj: Value) -> Result<Value> {
        Ok(obj)
    }
    /// Whether [`Kind::decode_stored`] changes anything (if not, stored bytes are served as they are).
    fn converts(&self) -> bool {
        false
    }
}

/// The JSON-level face of a [`Kind`], used by the generic storage and the API layer.
pub trait Strategy: Send + Sync {
    fn info(&self) -> &ResourceInfo;
    fn generation(&self) -> bool;
    fn merge_keys(&self) -> &'static [MergeKey];
    fn fields(&self) -> &'static [&'static str];
    fn name_rule(&self) -> NameRule;
    fn status_writes_annotations(&self) -> bool;
    fn pending_finalizers(&self, obj: &Value) -> Result<bool>;
    fn mark_deleting(&self, obj: &mut Value) -> Result<()>;
    /// Decodes an object to be created, defaults and validates it, in one typed pass.
    fn admit_create(&self, obj: Value) -> Result<Admitted>;
    /// The same for an update, against the stored object: of the main resource, or through a
    /// subresource whose rules the kind has (status, ephemeral containers).
    fn admit_update(&self, new: Value, old: &Value, sub: Option<Subresource>) -> Result<Admitted>;
    fn field(&self, obj: &Value, field: &str) -> Option<String>;
    fn columns(&self) -> Vec<Column>;
    /// The table row of one object given as JSON bytes: its cells and its metadata.
    fn row(&self, object: &[u8]) -> Result<Row>;
    fn deletion(&self, obj: &Value, ctx: &DeleteContext<'_>) -> Result<Deletion>;
    fn decode_stored(&self, stored: Value) -> Result<Value>;
    fn encode_stored(&self, obj: Value) -> Result<Value>;
    fn converts(&self) -> bool;
    /// Adds this kind's schema to an OpenAPI generator and returns the reference to it.
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema;
}

/// One row of a server-side table.
pub struct Row {
    pub cells: Vec<Value>,
    pub metadata: Value,
}

/// An object after decoding, defaulting and validation.
pub struct Admitted {
    /// The object in the kind's canonical JSON, with defaults.
    pub object: Value,
    /// Paths present in the request that the kind does not know.
    pub unknown_fields: Vec<String>,
    /// Validation failures (the object must not be stored if any).
    pub errors: ErrorList,
}

/// Erases a [`Kind`] into a [`Strategy`].
pub struct Typed<K: Kind>(pub K, PhantomData<fn() -> K::Obj>);

impl<K: Kind> Typed<K> {
    pub fn new(kind: K) -> Self {
        Self(kind, PhantomData)
    }

    fn typed(&self, v: &Value) -> Result<K::Obj> {
        K::Obj::deserialize(v).map_err(|e| {
            let kind = K::INFO.kind;
            StatusError::bad_request(format!(
                "{kind} in version \"{}\" cannot be handled as a {kind}: {e}",
                K::INFO.version
            ))
        })
    }

    fn value(obj: &K::Obj) -> Result<Value> {
        serde_json::to_value(obj).map_err(StatusError::internal)
    }

    /// Encodes the prepared object and finds what the input had that the kind does not know.
    fn admitted(&self, input: &Value, typed: &K::Obj, errors: ErrorList) -> Result<Admitted> {
        let object = Self::value(typed)?;
        let mut unknown_fields = Vec::new();
        unknown(input, &object, &mut unknown_fields);
        // What preparing dropped (a status reset on create) was known: judge those paths against
        // the object as decoded. Only a request that seems to have unknown fields pays for it.
        if !unknown_fields.is_empty() {
            let decoded = Self::value(&self.typed(input)?)?;
            unknown_fields.clear();
            unknown(input, &decoded, &mut unknown_fields);
        }
        Ok(Admitted { object, unknown_fields, errors })
    }
}

use serde::Deserialize as _;

impl<K: Kind> Strategy for Typed<K> {
    fn info(&self) -> &ResourceInfo {
        &K::INFO
    }
    fn generation(&self) -> bool {
        K::GENERATION
    }
    fn merge_keys(&self) -> &'static [MergeKey] {
        K::MERGE_KEYS
    }
    fn fields(&self) -> &'static [&'static str] {
        K::FIELDS
    }
    fn name_rule(&self) -> NameRule {
        K::NAME_RULE
    }
    fn status_writes_annotations(&self) -> bool {
        K::STATUS_WRITES_ANNOTATIONS
    }
    fn pending_finalizers(&self, obj: &Value) -> Result<bool> {
        Ok(self.0.pending_finalizers(&self.typed(obj)?))
    }
    fn mark_deleting(&self, obj: &mut Value) -> Result<()> {
        let mut t = self.typed(obj)?;
        self.0.mark_deleting(&mut t);
        *obj = Self::value(&t)?;
        Ok(())
    }

    fn admit_create(&self, obj: Value) -> Result<Admitted> {
        let mut t = self.typed(&obj)?;
        self.0.prepare_create(&mut t);
        let errors = self.0.validate(&t);
        self.admitted(&obj, &t, errors)
    }

    fn admit_update(&self, new: Value, old: &Value, sub: Option<Subresource>) -> Result<Admitted> {
        let mut t = self.typed(&new)?;
        let o = self.typed(old)?;
        let errors = match sub {
            None => {
                self.0.prepare_update(&mut t, &o);
                self.0.validate_update(&t, &o)
            }
            Some(Subresource::Status) => {
                self.0.prepare_status_update(&mut t, &o);
                self.0.validate_status_update(&t, &o)
            }
            Some(sub) => {
                self.0.prepare_subresource_update(sub, &mut t, &o);
                self.0.validate_subresource_update(sub, &t, &o)
            }
        };
        self.admitted(&new, &t, errors)
    }

    fn field(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "metadata.name" => str_at(obj, &["metadata", "name"]),
            "metadata.namespace" => str_at(obj, &["metadata", "namespace"]),
            f if K::FIELDS.contains(&f) => self.0.field(obj, f),
            _ => None,
        }
    }

    fn columns(&self) -> Vec<Column> {
        self.0.columns()
    }

    fn row(&self, object: &[u8]) -> Result<Row> {
        let t: K::Obj = serde_json::from_slice(object).map_err(StatusError::internal)?;
        let metadata = serde_json::to_value(t.metadata()).map_err(StatusError::internal)?;
        Ok(Row { cells: self.0.cells(&t), metadata })
    }

    fn deletion(&self, obj: &Value, ctx: &DeleteContext<'_>) -> Result<Deletion> {
        Ok(self.0.deletion(&self.typed(obj)?, ctx))
    }

    fn decode_stored(&self, stored: Value) -> Result<Value> {
        self.0.decode_stored(stored)
    }
    fn encode_stored(&self, obj: Value) -> Result<Value> {
        self.0.encode_stored(obj)
    }
    fn converts(&self) -> bool {
        self.0.converts()
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        generator.subschema_for::<K::Obj>()
    }
}

/// Collects paths present (and non-null) in `input` but absent from the typed round trip. The path
/// is kept as a stack of segments and only rendered for a field that is reported.
fn unknown(input: &Value, known: &Value, out: &mut Vec<String>) {
    walk_unknown(input, known, &mut Vec::new(), out);
}

enum Segment<'a> {
    Name(&'a str),
    Index(usize),
}

fn walk_unknown<'a>(input: &'a Value, known: &Value, stack: &mut Vec<Segment<'a>>, out: &mut Vec<String>) {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => {
            for (name, v) in i {
                stack.push(Segment::Name(name));
                match k.get(name) {
                    Some(kv) => walk_unknown(v, kv, stack, out),
                    None if !v.is_null() && !is_empty_container(v) => out.push(render(stack)),
                    None => {}
                }
                stack.pop();
            }
        }
        (Value::Array(i), Value::Array(k)) => {
            for (n, (iv, kv)) in i.iter().zip(k).enumerate() {
                stack.push(Segment::Index(n));
                walk_unknown(iv, kv, stack, out);
                stack.pop();
            }
        }
        _ => {}
    }
}

fn render(stack: &[Segment<'_>]) -> String {
    let mut s = String::new();
    for seg in stack {
        match seg {
            Segment::Name(n) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(n);
            }
            Segment::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn is_empty_container(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.is_empty())
}

/// The value at a dotted JSON path as a field selector sees it: strings as they are, numbers and
/// booleans in their JSON form, missing fields as the empty string.
pub fn field_at(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for p in path.split('.') {
        match cur.get(p) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A string at a JSON path.
pub fn str_at(v: &Value, path: &[&str]) -> Option<String> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str().map(str::to_string)
}

/// The metadata object of a JSON object, created if missing.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Upstream's human age: `45s`, `12m`, `3h4m`, `5d` (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    if secs < 60 * 2 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{d}d", hours / 24 / 365) };
    }
    format!("{}y", hours / 24 / 365)
}

/// The name cell of a table row.
pub fn name_cell(meta: &ObjectMeta) -> Value {
    Value::String(meta.name.clone().unwrap_or_default())
}

/// `translateTimestampSince`: the age of a time for tables, `<unknown>` when unset.
pub fn since_cell(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Value {
    since(t.map(|t| t.0))
}

/// The human age of an instant, `<unknown>` when unset.
pub fn since(t: Option<k8s_openapi::jiff::Timestamp>) -> Value {
    Value::String(match t {
        Some(t) => human_duration(chrono::Utc::now().timestamp() - t.as_second()),
        None => "<unknown>".to_string(),
    })
}

/// Age of an object for tables; `<unknown>` without a creation time, as upstream.
pub fn age_cell(meta: &ObjectMeta) -> Value {
    since_cell(meta.creation_timestamp.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn human_durations_match_upstream() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 4 * 60), "3h4m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86400), "30d");
    }

    #[test]
    fn field_paths_read_like_field_sets() {
        let v = json!({"spec": {"nodeName": "n1", "hostNetwork": true, "priority": 5}, "status": {}});
        assert_eq!(field_at(&v, "spec.nodeName"), "n1");
        assert_eq!(field_at(&v, "spec.hostNetwork"), "true");
        assert_eq!(field_at(&v, "spec.priority"), "5");
        assert_eq!(field_at(&v, "status.phase"), "");
        assert_eq!(field_at(&v, "metadata.name"), "");
    }

    #[test]
    fn unknown_fields_are_reported_with_paths() {
        let input = json!({"metadata": {"name": "a", "bogus": 1}, "spec": {"x": null, "list": [{"y": 1}]}});
        let known = json!({"metadata": {"name": "a"}, "spec": {"list": [{}]}});
        let mut out = Vec::new();
        unknown(&input, &known, &mut out);
        assert_eq!(out, vec!["metadata.bogus".to_string(), "spec.list[0].y".to_string()]);
    }
}
