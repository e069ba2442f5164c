//! The OpenAPI documents kube-apiserver publishes, for the resources this server serves:
//! `/openapi/v2` (Swagger 2.0) and `/openapi/v3` (an index plus one OpenAPI 3.0 document per
//! group-version).
//!
//! Object schemas come from k8s-openapi. On top of them go what clients read:
//! - `x-kubernetes-group-version-kind` on kind schemas and on operations (`kubectl explain`
//!   finds a resource's schema through them);
//! - a `fieldValidation` query parameter on create, update and patch operations (kubectl then
//!   leaves `--validate=strict` to the server instead of validating client-side);
//! - `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key` on merge lists (kubectl
//!   computes strategic merge patches for `apply` and `edit` from them).

pub mod gnostic;
pub mod gnostic_v3;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::Binding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta, Patch, Status, WatchEvent};
use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::registry::Subresource;
use crate::registry::patch::{METADATA_MERGE_KEYS, MergeKey};
use crate::registry::strategy::ResourceInfo;

/// One served resource as OpenAPI needs it.
pub struct ResourceDoc<'a> {
    pub info: &'a ResourceInfo,
    /// The kind's own strategic-merge lists; [`METADATA_MERGE_KEYS`] apply to every kind anyway.
    pub merge_keys: &'a [MergeKey],
    /// Registers the kind's schema, e.g. `|g| g.subschema_for::<Pod>()`.
    pub schema: &'a dyn Fn(&mut SchemaGenerator) -> schemars::Schema,
    /// Only posted, answered at once and stored nowhere (the review kinds).
    pub create_only: bool,
}

/// The `/openapi/v3` discovery index and the documents it points to.
#[derive(Debug, Clone)]
pub struct V3 {
    /// `{"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=..."}, ...}}`.
    pub index: Value,
    /// Each document with its path below `/openapi/v3/`, e.g. `api/v1`, `apis/events.k8s.io/v1`.
    pub documents: Vec<(String, Value)>,
}

/// The `/openapi/v2` document (Swagger 2.0, schemas under `#/definitions/`).
pub fn v2(resources: &[ResourceDoc<'_>]) -> Value {
    let spec = Spec::V2;
    let schemas = Schemas::generate(resources, spec);
    let mut paths = Map::new();
    for (doc, kind) in resources.iter().zip(&schemas.kinds) {
        resource_paths(&mut paths, spec, doc, kind);
    }
    let roots = Schemas::roots(schemas.kinds.iter());
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths,
        "definitions": schemas.reachable(&paths, roots),
        "securityDefinitions": {"BearerToken": bearer_token()},
        "security": [{"BearerToken": []}],
    })
}

/// The `/openapi/v3` index and one OpenAPI 3.0 document per served group-version (schemas under
/// `#/components/schemas/`). Each index entry carries a hash of its document's compact JSON
/// serialization, so clients may cache documents by URL.
pub fn v3(resources: &[ResourceDoc<'_>]) -> V3 {
    let spec = Spec::V3;
    let schemas = Schemas::generate(resources, spec);
    let mut by_gv: BTreeMap<String, Vec<(&ResourceDoc<'_>, &String)>> = BTreeMap::new();
    for (doc, kind) in resources.iter().zip(&schemas.kinds) {
        by_gv.entry(group_version_path(doc.info)).or_default().push((doc, kind));
    }
    let mut index = Map::new();
    let mut documents = Vec::new();
    for (gv, members) in by_gv {
        let mut paths = Map::new();
        for (doc, kind) in &members {
            resource_paths(&mut paths, spec, doc, kind);
        }
        let roots = Schemas::roots(members.iter().map(|(_, kind)| *kind));
        let document = json!({
            "openapi": "3.0.0",
            "info": info(),
            "paths": paths,
            "components": {
                "schemas": schemas.reachable(&paths, roots),
                "securitySchemes": {"BearerToken": bearer_token()},
            },
        });
        let hash = content_hash(&serde_json::to_vec(&document).unwrap_or_default());
        index.insert(gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")}));
        documents.push((gv, document));
    }
    V3 { index: json!({ "paths": index }), documents }
}

/// The release whose schemas k8s-openapi's `v1_37` feature provides.
fn info() -> Value {
    json!({"title": "Kubernetes", "version": "v1.37.0"})
}

/// The security scheme kube-apiserver declares.
fn bearer_token() -> Value {
    json!({"type": "apiKey", "name": "authorization", "in": "header", "description": "Bearer Token authentication"})
}

const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const BINDING: &str = "io.k8s.api.core.v1.Binding";
const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
/// Kinds whose `metadata` upstream declares required; k8s-openapi marks it required everywhere.
const METADATA_REQUIRED: &[&str] = &["io.k8s.api.core.v1.Event"];

/// The document flavour: where schemas live and how references to them may be annotated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spec {
    V2,
    V3,
}

impl Spec {
    fn definitions_path(self) -> &'static str {
        match self {
            Spec::V2 => "/definitions",
            Spec::V3 => "/components/schemas",
        }
    }

    fn reference(self, name: &str) -> Value {
        json!({ "$ref": format!("#{}/{name}", self.definitions_path()) })
    }

    /// The schema name a `$ref` points to.
    fn ref_target(self, schema: &Value) -> Option<&str> {
        let reference = schema.get("$ref")?.as_str()?;
        reference.strip_prefix('#')?.strip_prefix(self.definitions_path())?.strip_prefix('/')
    }
}

/// Every schema the documents may need, keyed by name, with the Kubernetes extensions applied.
struct Schemas {
    spec: Spec,
    definitions: Map<String, Value>,
    /// The kind schema's name for each resource, in order.
    kinds: Vec<String>,
}

impl Schemas {
    fn generate(resources: &[ResourceDoc<'_>], spec: Spec) -> Self {
        let mut generator = SchemaSettings::draft07()
            .with(|s| {
                s.definitions_path = spec.definitions_path().into();
                s.meta_schema = None;
                s.transforms.clear();
            })
            .into_generator();
        let mut inline = Vec::new();
        let kinds: Vec<String> = resources
            .iter()
            .map(|doc| {
                let root = (doc.schema)(&mut generator).to_value();
                match spec.ref_target(&root) {
                    Some(name) => name.to_string(),
                    None => {
                        let name = format!("{}.{}", doc.info.api_version().replace('/', "."), doc.info.kind);
                        inline.push((name.clone(), root));
                        name
                    }
                }
            })
            .collect();
        generator.subschema_for::<Status>();
        generator.subschema_for::<DeleteOptions>();
        generator.subschema_for::<WatchEvent<Status>>();
        generator.subschema_for::<Patch>();
        generator.subschema_for::<ListMeta>();
        generator.subschema_for::<Binding>();
        generator.subschema_for::<Scale>();
        let mut definitions = generator.take_definitions(false);
        definitions.extend(inline);

        let mut schemas = Schemas { spec, definitions, kinds: Vec::new() };
        schemas.upstream_quirks();
        for (doc, kind) in resources.iter().zip(&kinds) {
            for key in METADATA_MERGE_KEYS.iter().chain(doc.merge_keys) {
                schemas.annotate_merge_list(kind, key);
            }
            schemas.add_gvk(kind, doc.info.group, doc.info.version, doc.info.kind);
            if !doc.create_only {
                schemas.add_list(kind, doc.info);
            }
        }
        let mut group_versions: Vec<(&str, &str)> = resources.iter().map(|d| (d.info.group, d.info.version)).collect();
        group_versions.push(("", "v1"));
        group_versions.sort_unstable();
        group_versions.dedup();
        for (group, version) in group_versions {
            schemas.add_gvk(DELETE_OPTIONS, group, version, "DeleteOptions");
            schemas.add_gvk(WATCH_EVENT, group, version, "WatchEvent");
        }
        schemas.add_gvk(STATUS, "", "v1", "Status");
        schemas.add_gvk(BINDING, "", "v1", "Binding");
        schemas.add_gvk(SCALE, "autoscaling", "v1", "Scale");
        if spec == Spec::V3 {
            for schema in schemas.definitions.values_mut() {
                wrap_annotated_refs(schema);
            }
        }
        schemas.definitions.sort_keys();
        schemas.kinds = kinds;
        schemas
    }

    /// Brings k8s-openapi's schemas in line with what kube-apiserver publishes.
    fn upstream_quirks(&mut self) {
        for (name, schema) in &mut self.definitions {
            let Some(object) = schema.as_object_mut() else {
                continue;
            };
            if !METADATA_REQUIRED.contains(&name.as_str())
                && let Some(Value::Array(required)) = object.get_mut("required")
            {
                required.retain(|field| field != "metadata");
                if required.is_empty() {
                    object.remove("required");
                }
            }
        }
        let (int_or_string, quantity) = match self.spec {
            Spec::V2 => (json!({"type": "string", "format": "int-or-string"}), json!({"type": "string"})),
            Spec::V3 => (
                json!({"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]}),
                json!({"oneOf": [{"type": "string"}, {"type": "number"}]}),
            ),
        };
        for (name, shape) in [(INT_OR_STRING, int_or_string), (QUANTITY, quantity)] {
            if let Some(schema) = self.definitions.get_mut(name) {
                let mut replacement = Map::new();
                if let Some(description) = schema.get("description") {
                    replacement.insert("description".into(), description.clone());
                }
                if let Value::Object(shape) = shape {
                    replacement.extend(shape);
                }
                *schema = replacement.into();
            }
        }
    }

    /// Marks the list field `key.path` below the schema `root` with its patch strategy and merge
    /// key. Returns false when the path does not lead to a property.
    fn annotate_merge_list(&mut self, root: &str, key: &MergeKey) -> bool {
        let mut owner = root.to_string();
        let mut fields = key.path.split('.').peekable();
        while let Some(field) = fields.next() {
            let Some(property) = self
                .definitions
                .get_mut(&owner)
                .and_then(|schema| schema.get_mut("properties"))
                .and_then(|properties| properties.get_mut(field))
            else {
                return false;
            };
            if fields.peek().is_some() {
                let element = property.get("items").unwrap_or(property);
                let element = element.pointer("/allOf/0").unwrap_or(element);
                match self.spec.ref_target(element) {
                    Some(next) => owner = next.to_string(),
                    None => return false,
                }
                continue;
            }
            let Some(property) = property.as_object_mut() else {
                return false;
            };
            let strategy = if key.retain_keys { "merge,retainKeys" } else { "merge" };
            property.insert("x-kubernetes-patch-strategy".into(), strategy.into());
            if let Some(merge_key) = key.key {
                property.insert("x-kubernetes-patch-merge-key".into(), merge_key.into());
            }
            return true;
        }
        false
    }

    /// Adds `{group, kind, version}` to the schema's `x-kubernetes-group-version-kind` list.
    fn add_gvk(&mut self, name: &str, group: &str, version: &str, kind: &str) {
        let Some(Value::Object(schema)) = self.definitions.get_mut(name) else {
            return;
        };
        let gvk = json!({"group": group, "kind": kind, "version": version});
        let list = schema.entry("x-kubernetes-group-version-kind").or_insert_with(|| json!([]));
        if let Value::Array(list) = list
            && !list.contains(&gvk)
        {
            list.push(gvk);
        }
    }

    /// Adds the `<Kind>List` schema next to the kind's, as upstream publishes it.
    fn add_list(&mut self, kind: &str, info: &ResourceInfo) {
        let name = format!("{kind}List");
        if self.definitions.contains_key(&name) {
            return;
        }
        let common = |field: &str| {
            self.definitions
                .get(kind)
                .and_then(|schema| schema.get("properties")?.get(field))
                .cloned()
                .unwrap_or_else(|| json!({"type": "string"}))
        };
        let mut metadata = self.spec.reference(LIST_META);
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert(
                "description".into(),
                "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds".into(),
            );
        }
        let list = json!({
            "description": format!("{}List is a list of {}.", info.kind, info.plural),
            "type": "object",
            "properties": {
                "apiVersion": common("apiVersion"),
                "items": {
                    "description": format!("List of {}.", info.plural),
                    "type": "array",
                    "items": self.spec.reference(kind),
                },
                "kind": common("kind"),
                "metadata": metadata,
            },
            "required": ["items"],
        });
        self.definitions.insert(name.clone(), list);
        self.add_gvk(&name, info.group, info.version, &format!("{}List", info.kind));
    }

    /// The schemas a group-version's document always carries besides what its paths reference.
    fn roots<'a>(kinds: impl Iterator<Item = &'a String>) -> Vec<String> {
        let mut roots: Vec<String> = [STATUS, DELETE_OPTIONS, WATCH_EVENT, PATCH].map(String::from).into();
        for kind in kinds {
            roots.push(kind.clone());
            roots.push(format!("{kind}List"));
        }
        roots
    }

    /// The schemas referenced, directly or not, from `paths` and `roots`.
    fn reachable(&self, paths: &Map<String, Value>, roots: Vec<String>) -> Map<String, Value> {
        let mut pending = roots;
        for path in paths.values() {
            collect_refs(self.spec, path, &mut pending);
        }
        let mut seen = BTreeSet::new();
        while let Some(name) = pending.pop() {
            if let Some(schema) = self.definitions.get(&name)
                && seen.insert(name)
            {
                collect_refs(self.spec, schema, &mut pending);
            }
        }
        self.definitions
            .iter()
            .filter(|(name, _)| seen.contains(*name))
            .map(|(name, schema)| (name.clone(), schema.clone()))
            .collect()
    }
}

/// Pushes the name of every schema `value` references.
fn collect_refs(spec: Spec, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(name) = spec.ref_target(value) {
                out.push(name.to_string());
            }
            object.values().for_each(|child| collect_refs(spec, child, out));
        }
        Value::Array(items) => items.iter().for_each(|child| collect_refs(spec, child, out)),
        _ => {}
    }
}

/// OpenAPI 3.0 ignores the siblings of `$ref`; like kube-apiserver, wrap such references in a
/// one-element `allOf` so a field keeps its own description and extensions.
fn wrap_annotated_refs(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if object.len() > 1
                && let Some(reference) = object.remove("$ref")
            {
                object.insert("allOf".into(), json!([{ "$ref": reference }]));
            }
            object.values_mut().for_each(wrap_annotated_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(wrap_annotated_refs),
        _ => {}
    }
}

/// `api/v1` or `apis/<group>/<version>`.
fn group_version_path(info: &ResourceInfo) -> String {
    if info.group.is_empty() {
        format!("api/{}", info.version)
    } else {
        format!("apis/{}/{}", info.group, info.version)
    }
}

/// FNV-1a (128 bit) as uppercase hex.
fn content_hash(bytes: &[u8]) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let hash = bytes.iter().fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    format!("{hash:032X}")
}

/// Type and description of a query parameter.
fn query_parameter_doc(name: &str) -> (&'static str, &'static str) {
    match name {
        "allowWatchBookmarks" => ("boolean", "Requests watch events of type BOOKMARK."),
        "continue" => ("string", "Continues a paginated list."),
        "dryRun" => ("string", "All: process without persisting."),
        "fieldManager" => ("string", "The actor making these changes."),
        "fieldSelector" => ("string", "Selects objects by their fields."),
        "fieldValidation" => ("string", "Ignore, Warn or Strict."),
        "force" => ("boolean", "Forces Apply requests."),
        "gracePeriodSeconds" => ("integer", "Seconds before deletion."),
        "labelSelector" => ("string", "Selects objects by their labels."),
        "limit" => ("integer", "Maximum number of items to return."),
        "orphanDependents" => ("boolean", "Deprecated: use propagationPolicy."),
        "propagationPolicy" => ("string", "Orphan, Background or Foreground."),
        "resourceVersion" => ("string", "Resource versions that may serve it."),
        "resourceVersionMatch" => ("string", "How resourceVersion applies."),
        "sendInitialEvents" => ("boolean", "Starts a watch with current state."),
        "timeoutSeconds" => ("integer", "Timeout for the list/watch call."),
        "watch" => ("boolean", "Streams changes instead of a list."),
        _ => ("string", "If 'true', the output is pretty printed."),
    }
}

const LIST: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
const PATCH_QUERY: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "force"];
const DELETE: &[&str] = &["dryRun", "gracePeriodSeconds", "orphanDependents", "propagationPolicy"];
const DELETE_COLLECTION: &[&str] = &[
    "continue",
    "dryRun",
    "fieldSelector",
    "gracePeriodSeconds",
    "labelSelector",
    "limit",
    "orphanDependents",
    "propagationPolicy",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
];
const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// One operation to describe.
struct Operation<'a> {
    method: &'static str,
    /// `x-kubernetes-action`.
    action: &'static str,
    operation_id: String,
    /// Kind in the operation's `x-kubernetes-group-version-kind`.
    kind: &'a str,
    query: &'static [&'static str],
    /// Request body schema and the media types it is accepted as.
    body: Option<(&'a str, &'static [&'static str])>,
    /// Status codes and the schema each answers with.
    responses: Vec<(&'static str, &'a str)>,
}

impl<'a> Operation<'a> {
    fn new(method: &'static str, action: &'static str, operation_id: String, kind: &'a str) -> Self {
        Operation { method, action, operation_id, kind, query: &[], body: None, responses: Vec::new() }
    }

    fn query(self, query: &'static [&'static str]) -> Self {
        Operation { query, ..self }
    }

    fn body(self, schema: &'a str, media: &'static [&'static str]) -> Self {
        Operation { body: Some((schema, media)), ..self }
    }

    fn responds(self, codes: &[&'static str], schema: &'a str) -> Self {
        let responses = codes.iter().map(|code| (*code, schema)).collect();
        Operation { responses, ..self }
    }
}

/// Where a path sits: whether it has `{namespace}` and `{name}` segments.
#[derive(Clone, Copy)]
struct Scope {
    namespace: bool,
    name: bool,
}

/// Adds the paths of one resource, laid out as kube-apiserver does.
fn resource_paths(paths: &mut Map<String, Value>, spec: Spec, doc: &ResourceDoc<'_>, kind: &str) {
    let info = doc.info;
    let root = format!("/{}", group_version_path(info));
    let id = OperationIds::new(info);
    let list = format!("{kind}List");
    let deleted = if info.return_deleted_object { kind } else { STATUS };
    let (scope, watch_scope) = if info.namespaced {
        (format!("{root}/namespaces/{{namespace}}/"), format!("{root}/watch/namespaces/{{namespace}}/"))
    } else {
        (format!("{root}/"), format!("{root}/watch/"))
    };
    let collection = Scope { namespace: info.namespaced, name: false };
    let object = Scope { namespace: info.namespaced, name: true };
    let mut add = |path: String, scope: Scope, operations: Vec<Operation<'_>>| {
        paths.insert(path, path_item(spec, info, &id.tag, scope, &operations));
    };
    let read = |suffix: &str| Operation::new("get", "get", id.of("read", suffix), info.kind).responds(&["200"], kind);
    let replace = |suffix: &str| {
        Operation::new("put", "put", id.of("replace", suffix), info.kind)
            .query(WRITE)
            .body(kind, &["*/*"])
            .responds(&["200", "201"], kind)
    };
    let patch = |suffix: &str| {
        Operation::new("patch", "patch", id.of("patch", suffix), info.kind)
            .query(PATCH_QUERY)
            .body(PATCH, PATCH_TYPES)
            .responds(&["200", "201"], kind)
    };
    let list_op = |operation_id: String| {
        Operation::new("get", "list", operation_id, info.kind).query(LIST).responds(&["200"], &list)
    };
    let watch = |action: &'static str, operation_id: String| {
        Operation::new("get", action, operation_id, info.kind).query(LIST).responds(&["200"], WATCH_EVENT)
    };

    let create = Operation::new("post", "post", id.of("create", ""), info.kind)
        .query(WRITE)
        .body(kind, &["*/*"])
        .responds(&["200", "201", "202"], kind);
    if doc.create_only {
        add(format!("{scope}{}", info.plural), collection, vec![create]);
        return;
    }
    let delete_collection = Operation::new("delete", "deletecollection", id.collection("delete"), info.kind)
        .query(DELETE_COLLECTION)
        .body(DELETE_OPTIONS, &["*/*"])
        .responds(&["200"], STATUS);
    add(format!("{scope}{}", info.plural), collection, vec![list_op(id.of("list", "")), create, delete_collection]);

    let delete = Operation::new("delete", "delete", id.of("delete", ""), info.kind)
        .query(DELETE)
        .body(DELETE_OPTIONS, &["*/*"])
        .responds(&["200", "202"], deleted);
    add(format!("{scope}{}/{{name}}", info.plural), object, vec![read(""), replace(""), delete, patch("")]);

    for sub in info.subresources {
        let suffix = capitalize(sub.name());
        let operations = match sub {
            Subresource::Status | Subresource::EphemeralContainers | Subresource::Approval => {
                vec![read(&suffix), replace(&suffix), patch(&suffix)]
            }
            Subresource::Binding => vec![
                Operation::new("post", "post", id.of("create", &suffix), "Binding")
                    .query(WRITE)
                    .body(BINDING, &["*/*"])
                    .responds(&["200", "201", "202"], BINDING),
            ],
            Subresource::Finalize => vec![replace(&suffix)],
            Subresource::Scale => vec![
                Operation::new("get", "get", id.of("read", &suffix), "Scale").responds(&["200"], SCALE),
                Operation::new("put", "put", id.of("replace", &suffix), "Scale")
                    .query(WRITE)
                    .body(SCALE, &["*/*"])
                    .responds(&["200", "201"], SCALE),
                Operation::new("patch", "patch", id.of("patch", &suffix), "Scale")
                    .query(PATCH_QUERY)
                    .body(PATCH, PATCH_TYPES)
                    .responds(&["200", "201"], SCALE),
            ],
            // Plain text, protocol upgrades, and an Eviction posted for its effect: not described here.
            Subresource::Log
            | Subresource::Exec
            | Subresource::Attach
            | Subresource::PortForward
            | Subresource::Proxy
            | Subresource::Eviction
            | Subresource::Token => continue,
        };
        add(format!("{scope}{}/{{name}}/{}", info.plural, sub.name()), object, operations);
    }

    if info.namespaced {
        let everywhere = Scope { namespace: false, name: false };
        add(format!("{root}/{}", info.plural), everywhere, vec![list_op(id.all_namespaces("list", ""))]);
        let operation = watch("watchlist", id.all_namespaces("watch", "List"));
        add(format!("{root}/watch/{}", info.plural), everywhere, vec![operation]);
    }
    add(format!("{watch_scope}{}", info.plural), collection, vec![watch("watchlist", id.of("watch", "List"))]);
    add(format!("{watch_scope}{}/{{name}}", info.plural), object, vec![watch("watch", id.of("watch", ""))]);
}

/// Builds operationIds such as `listCoreV1NamespacedPod` or `watchCoreV1PodListForAllNamespaces`.
struct OperationIds {
    /// `CoreV1`, `CoordinationV1`, `EventsV1`.
    group_version: String,
    /// The operations' tag: `core_v1`, `coordination_v1`.
    tag: String,
    namespaced: bool,
    kind: String,
}

impl OperationIds {
    fn new(info: &ResourceInfo) -> Self {
        let group: String = match info.group {
            "" => "Core".into(),
            group => group.trim_end_matches(".k8s.io").split('.').map(capitalize).collect(),
        };
        let mut tag: String = group.chars().take(1).flat_map(char::to_lowercase).collect();
        tag.extend(group.chars().skip(1));
        OperationIds {
            group_version: format!("{group}{}", capitalize(info.version)),
            tag: format!("{tag}_{}", info.version),
            namespaced: info.namespaced,
            kind: info.kind.to_string(),
        }
    }

    /// `<verb><GroupVersion>[Namespaced]<Kind><suffix>`.
    fn of(&self, verb: &str, suffix: &str) -> String {
        let scope = if self.namespaced { "Namespaced" } else { "" };
        format!("{verb}{}{scope}{}{suffix}", self.group_version, self.kind)
    }

    /// `<verb><GroupVersion>Collection[Namespaced]<Kind>`.
    fn collection(&self, verb: &str) -> String {
        let scope = if self.namespaced { "Namespaced" } else { "" };
        format!("{verb}{}Collection{scope}{}", self.group_version, self.kind)
    }

    /// `<verb><GroupVersion><Kind><suffix>ForAllNamespaces`.
    fn all_namespaces(&self, verb: &str, suffix: &str) -> String {
        format!("{verb}{}{}{suffix}ForAllNamespaces", self.group_version, self.kind)
    }
}

/// `status` → `Status`.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// A path item: its path parameters plus one entry per operation.
fn path_item(spec: Spec, info: &ResourceInfo, tag: &str, scope: Scope, operations: &[Operation<'_>]) -> Value {
    let mut parameters = Vec::new();
    if scope.name {
        parameters.push(parameter(spec, "name", "path", "string", &format!("name of the {}", info.kind)));
    }
    if scope.namespace {
        parameters.push(parameter(
            spec,
            "namespace",
            "path",
            "string",
            "object name and auth scope, such as for teams and projects",
        ));
    }
    parameters.push(query_parameter(spec, "pretty"));
    let mut item = Map::new();
    for op in operations {
        item.insert(op.method.into(), operation(spec, info, tag, op));
    }
    item.insert("parameters".into(), parameters.into());
    item.into()
}

/// One operation object, with its parameters, body, responses and Kubernetes extensions.
fn operation(spec: Spec, info: &ResourceInfo, tag: &str, op: &Operation<'_>) -> Value {
    let mut parameters: Vec<Value> = op.query.iter().map(|name| query_parameter(spec, name)).collect();
    let produces: &[&str] = if matches!(op.action, "list" | "watch" | "watchlist") {
        &["application/json", "application/yaml", "application/json;stream=watch"]
    } else {
        &["application/json", "application/yaml"]
    };
    let content = |media: &[&str], schema: &str| -> Map<String, Value> {
        media.iter().map(|media| (media.to_string(), json!({"schema": spec.reference(schema)}))).collect()
    };
    let mut responses = Map::new();
    for (code, schema) in &op.responses {
        let description = match *code {
            "201" => "Created",
            "202" => "Accepted",
            _ => "OK",
        };
        let response = match spec {
            Spec::V2 => json!({"description": description, "schema": spec.reference(schema)}),
            Spec::V3 => json!({"description": description, "content": content(produces, schema)}),
        };
        responses.insert(code.to_string(), response);
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));

    let mut operation = Map::new();
    operation.insert("tags".into(), json!([tag]));
    operation.insert("description".into(), describe(op.action, op.kind).into());
    operation.insert("operationId".into(), op.operation_id.clone().into());
    let body_required = !op.action.starts_with("delete");
    match (spec, op.body) {
        (Spec::V2, body) => {
            if let Some((schema, _)) = body {
                let body =
                    json!({"name": "body", "in": "body", "required": body_required, "schema": spec.reference(schema)});
                parameters.insert(0, body);
            }
            let consumes: &[&str] = body.map_or(&["*/*"], |(_, media)| media);
            operation.insert("consumes".into(), json!(consumes));
            operation.insert("produces".into(), json!(produces));
            operation.insert("schemes".into(), json!(["https"]));
        }
        (Spec::V3, Some((schema, media))) => {
            let mut body = Map::new();
            body.insert("content".into(), content(media, schema).into());
            if body_required {
                body.insert("required".into(), true.into());
            }
            operation.insert("requestBody".into(), body.into());
        }
        (Spec::V3, None) => {}
    }
    if !parameters.is_empty() {
        operation.insert("parameters".into(), parameters.into());
    }
    operation.insert("responses".into(), responses.into());
    operation.insert("x-kubernetes-action".into(), op.action.into());
    let gvk = json!({"group": info.group, "kind": op.kind, "version": info.version});
    operation.insert("x-kubernetes-group-version-kind".into(), gvk);
    operation.into()
}

/// A short summary of an operation, after upstream's wording.
fn describe(action: &str, kind: &str) -> String {
    match action {
        "get" => format!("read the specified {kind}"),
        "list" => format!("list or watch objects of kind {kind}"),
        "post" => format!("create a {kind}"),
        "put" => format!("replace the specified {kind}"),
        "patch" => format!("partially update the specified {kind}"),
        "delete" => format!("delete a {kind}"),
        "deletecollection" => format!("delete collection of {kind}"),
        "watchlist" => format!("watch individual changes to a list of {kind}"),
        _ => format!("watch changes to an object of kind {kind}"),
    }
}

/// A query parameter from [`query_parameter_doc`].
fn query_parameter(spec: Spec, name: &str) -> Value {
    let (kind, description) = query_parameter_doc(name);
    parameter(spec, name, "query", kind, description)
}

/// A non-body parameter, in the flavour's shape (v2 inline type, v3 `schema`).
fn parameter(spec: Spec, name: &str, location: &str, kind: &str, description: &str) -> Value {
    let mut parameter = Map::new();
    parameter.insert("name".into(), name.into());
    parameter.insert("in".into(), location.into());
    parameter.insert("description".into(), description.into());
    if location == "path" {
        parameter.insert("required".into(), true.into());
    }
    let schema = json!({"type": kind, "uniqueItems": true});
    match (spec, schema) {
        (Spec::V2, Value::Object(schema)) => parameter.extend(schema),
        (_, schema) => {
            parameter.insert("schema".into(), schema);
        }
    }
    parameter.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::patch::{merge, merge_retain, primitive};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod};
    use k8s_openapi::api::events::v1::Event;

    const fn resource(
        group: &'static str,
        kind: &'static str,
        plural: &'static str,
        namespaced: bool,
        subresources: &'static [Subresource],
    ) -> ResourceInfo {
        ResourceInfo {
            group,
            version: "v1",
            kind,
            plural,
            singular: "",
            namespaced,
            short_names: &[],
            categories: &[],
            subresources,
            storage: plural,
            return_deleted_object: false,
        }
    }

    const POD: ResourceInfo = ResourceInfo {
        return_deleted_object: true,
        ..resource("", "Pod", "pods", true, &[Subresource::Status, Subresource::Binding])
    };
    const NAMESPACE: ResourceInfo = resource("", "Namespace", "namespaces", false, &[Subresource::Finalize]);
    const LEASE: ResourceInfo = resource("coordination.k8s.io", "Lease", "leases", true, &[]);
    const CORE_EVENT: ResourceInfo = resource("", "Event", "events", true, &[]);
    const EVENT: ResourceInfo = resource("events.k8s.io", "Event", "events", true, &[]);
    const POD_KEYS: &[MergeKey] = &[
        merge("spec.containers", "name"),
        merge("spec.containers.ports", "containerPort"),
        merge_retain("spec.volumes", "name"),
        merge("status.conditions", "type"),
        primitive("spec.hostAliases.hostnames"),
    ];

    fn doc<'a>(
        info: &'a ResourceInfo,
        merge_keys: &'a [MergeKey],
        schema: &'a dyn Fn(&mut SchemaGenerator) -> schemars::Schema,
    ) -> ResourceDoc<'a> {
        ResourceDoc { info, merge_keys, schema, create_only: false }
    }

    fn with_docs<T>(f: impl FnOnce(&[ResourceDoc<'_>]) -> T) -> T {
        let pod = |g: &mut SchemaGenerator| g.subschema_for::<Pod>();
        let namespace = |g: &mut SchemaGenerator| g.subschema_for::<Namespace>();
        let lease = |g: &mut SchemaGenerator| g.subschema_for::<Lease>();
        let core_event = |g: &mut SchemaGenerator| g.subschema_for::<CoreEvent>();
        let event = |g: &mut SchemaGenerator| g.subschema_for::<Event>();
        f(&[
            doc(&POD, POD_KEYS, &pod),
            doc(&NAMESPACE, &[], &namespace),
            doc(&LEASE, &[], &lease),
            doc(&CORE_EVENT, &[], &core_event),
            doc(&EVENT, &[], &event),
        ])
    }

    fn document<'a>(v3: &'a V3, path: &str) -> &'a Value {
        &v3.documents.iter().find(|(p, _)| p == path).expect("document").1
    }

    /// Every `$ref` in `doc` names a schema present in it.
    fn assert_refs_resolve(spec: Spec, doc: &Value, schemas: &Value) {
        let mut refs = Vec::new();
        collect_refs(spec, doc, &mut refs);
        assert!(!refs.is_empty());
        for name in refs {
            assert!(schemas.get(&name).is_some(), "unresolved {name}");
        }
        let mut raw = Vec::new();
        fn all_refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::String(r)) = o.get("$ref") {
                        out.push(r.clone());
                    }
                    o.values().for_each(|c| all_refs(c, out));
                }
                Value::Array(a) => a.iter().for_each(|c| all_refs(c, out)),
                _ => {}
            }
        }
        all_refs(doc, &mut raw);
        let prefix = format!("#{}/", spec.definitions_path());
        assert!(raw.iter().all(|r| r.starts_with(&prefix)), "foreign ref");
    }

    #[test]
    fn v3_index_and_documents() {
        let docs = with_docs(v3);
        let paths = docs.index["paths"].as_object().unwrap();
        assert_eq!(
            paths.keys().collect::<Vec<_>>(),
            ["api/v1", "apis/coordination.k8s.io/v1", "apis/events.k8s.io/v1"]
        );
        for (path, doc) in &docs.documents {
            let url = paths[path]["serverRelativeURL"].as_str().unwrap();
            let hash = content_hash(&serde_json::to_vec(doc).unwrap());
            assert_eq!(url, format!("/openapi/v3/{path}?hash={hash}"));
            assert_refs_resolve(Spec::V3, doc, &doc["components"]["schemas"]);
        }
        // Stable across runs.
        assert_eq!(with_docs(v3).index, docs.index);
    }

    #[test]
    fn v3_kind_schemas() {
        let v3 = with_docs(v3);
        let core = &document(&v3, "api/v1")["components"]["schemas"];
        assert_eq!(
            core["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"],
            json!([{"group": "", "kind": "Pod", "version": "v1"}])
        );
        assert!(core["io.k8s.api.core.v1.Pod"].get("required").is_none());
        let list = &core["io.k8s.api.core.v1.PodList"];
        assert_eq!(list["x-kubernetes-group-version-kind"], json!([{"group": "", "kind": "PodList", "version": "v1"}]));
        assert_eq!(list["properties"]["items"]["items"]["$ref"], "#/components/schemas/io.k8s.api.core.v1.Pod");
        assert!(list["properties"]["metadata"]["allOf"].is_array());
        // Fields keep their description beside the reference.
        let spec = &core["io.k8s.api.core.v1.Pod"]["properties"]["spec"];
        assert_eq!(spec["allOf"][0]["$ref"], "#/components/schemas/io.k8s.api.core.v1.PodSpec");
        assert!(spec["description"].as_str().unwrap().starts_with("Specification"));
        for name in [STATUS, DELETE_OPTIONS, WATCH_EVENT, PATCH, BINDING, "io.k8s.api.core.v1.Container"] {
            assert!(core.get(name).is_some(), "{name}");
        }
        let gvks = core[DELETE_OPTIONS]["x-kubernetes-group-version-kind"].as_array().unwrap();
        assert!(gvks.contains(&json!({"group": "coordination.k8s.io", "kind": "DeleteOptions", "version": "v1"})));
        assert_eq!(core[INT_OR_STRING]["format"], "int-or-string");
        let core_event = &core["io.k8s.api.core.v1.Event"];
        assert_eq!(core_event["required"], json!(["involvedObject", "metadata"]));
        let events = &document(&v3, "apis/events.k8s.io/v1")["components"]["schemas"];
        assert_eq!(
            events["io.k8s.api.events.v1.Event"]["x-kubernetes-group-version-kind"],
            json!([{"group": "events.k8s.io", "kind": "Event", "version": "v1"}])
        );
        assert!(events.get("io.k8s.api.core.v1.Event").is_none());
        // Only what the group-version uses.
        let coordination = &document(&v3, "apis/coordination.k8s.io/v1")["components"]["schemas"];
        assert!(coordination.get("io.k8s.api.coordination.v1.LeaseList").is_some());
        assert!(coordination.get("io.k8s.api.core.v1.Pod").is_none());
    }

    #[test]
    fn merge_key_extensions() {
        let v3 = with_docs(v3);
        let core = &document(&v3, "api/v1")["components"]["schemas"];
        let containers = &core["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        let ports = &core["io.k8s.api.core.v1.Container"]["properties"]["ports"];
        assert_eq!(ports["x-kubernetes-patch-merge-key"], "containerPort");
        assert_eq!(
            core["io.k8s.api.core.v1.PodSpec"]["properties"]["volumes"]["x-kubernetes-patch-strategy"],
            "merge,retainKeys"
        );
        let hostnames = &core["io.k8s.api.core.v1.HostAlias"]["properties"]["hostnames"];
        assert_eq!(hostnames["x-kubernetes-patch-strategy"], "merge");
        assert!(hostnames.get("x-kubernetes-patch-merge-key").is_none());
        let meta = &core["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"];
        assert_eq!(meta["finalizers"]["x-kubernetes-patch-strategy"], "merge");
        assert_eq!(meta["ownerReferences"]["x-kubernetes-patch-merge-key"], "uid");
    }

    #[test]
    fn unknown_merge_paths_are_skipped() {
        let pod = |g: &mut SchemaGenerator| g.subschema_for::<Pod>();
        let docs = [ResourceDoc { info: &POD, merge_keys: &[], schema: &pod, create_only: false }];
        let mut schemas = Schemas::generate(&docs, Spec::V3);
        let kind = schemas.kinds[0].clone();
        for key in POD_KEYS.iter().chain(METADATA_MERGE_KEYS) {
            assert!(schemas.annotate_merge_list(&kind, key), "{}", key.path);
        }
        for path in ["spec.nope", "spec.nodeName.x", "spec.containers.name.x", ""] {
            assert!(!schemas.annotate_merge_list(&kind, &merge(path, "name")), "{path}");
        }
    }

    #[test]
    fn v3_operations() {
        let v3 = with_docs(v3);
        let core = document(&v3, "api/v1");
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["operationId"], "patchCoreV1NamespacedPod");
        assert_eq!(patch["x-kubernetes-action"], "patch");
        assert_eq!(patch["x-kubernetes-group-version-kind"], json!({"group": "", "kind": "Pod", "version": "v1"}));
        let names: Vec<&str> =
            patch["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"fieldValidation") && names.contains(&"dryRun"), "{names:?}");
        assert!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_object());
        // Every write carries fieldValidation, whichever PATCH a client looks at first.
        for (path, item) in core["paths"].as_object().unwrap() {
            for method in ["post", "put", "patch"] {
                if let Some(op) = item.get(method) {
                    let has = op["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation");
                    assert!(has, "{method} {path}");
                }
            }
        }
        let ids = |path: &str| -> Vec<String> {
            let item = core["paths"][path].as_object().unwrap_or_else(|| panic!("{path}"));
            item.values().filter_map(|op| op.get("operationId")).map(|id| id.as_str().unwrap().to_string()).collect()
        };
        assert_eq!(
            ids("/api/v1/namespaces/{namespace}/pods"),
            ["listCoreV1NamespacedPod", "createCoreV1NamespacedPod", "deleteCoreV1CollectionNamespacedPod"]
        );
        assert_eq!(ids("/api/v1/pods"), ["listCoreV1PodForAllNamespaces"]);
        assert_eq!(
            ids("/api/v1/namespaces/{namespace}/pods/{name}/status"),
            ["readCoreV1NamespacedPodStatus", "replaceCoreV1NamespacedPodStatus", "patchCoreV1NamespacedPodStatus"]
        );
        assert_eq!(ids("/api/v1/namespaces/{namespace}/pods/{name}/binding"), ["createCoreV1NamespacedPodBinding"]);
        assert_eq!(ids("/api/v1/namespaces/{name}/finalize"), ["replaceCoreV1NamespaceFinalize"]);
        assert_eq!(
            ids("/api/v1/namespaces"),
            ["listCoreV1Namespace", "createCoreV1Namespace", "deleteCoreV1CollectionNamespace"]
        );
        assert_eq!(ids("/api/v1/watch/pods"), ["watchCoreV1PodListForAllNamespaces"]);
        assert_eq!(ids("/api/v1/watch/namespaces/{namespace}/pods/{name}"), ["watchCoreV1NamespacedPod"]);
        let lease = document(&v3, "apis/coordination.k8s.io/v1");
        let list = &lease["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"]["get"];
        assert_eq!(list["operationId"], "listCoordinationV1NamespacedLease");
        assert_eq!(
            list["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/io.k8s.api.coordination.v1.LeaseList"
        );
        let delete = &lease["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"]["delete"];
        assert_eq!(
            delete["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/{STATUS}")
        );
        let all = &lease["paths"]["/apis/coordination.k8s.io/v1/leases"]["parameters"];
        assert!(all.as_array().unwrap().iter().all(|p| p["name"] != "namespace"));
    }

    #[test]
    fn v2_document() {
        let doc = with_docs(v2);
        assert_eq!(doc["swagger"], "2.0");
        let defs = &doc["definitions"];
        assert_refs_resolve(Spec::V2, &doc, defs);
        let spec = &defs["io.k8s.api.core.v1.Pod"]["properties"]["spec"];
        assert_eq!(spec["$ref"], "#/definitions/io.k8s.api.core.v1.PodSpec");
        assert!(spec["description"].is_string());
        assert_eq!(
            defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]["x-kubernetes-patch-merge-key"],
            "name"
        );
        assert_eq!(defs[INT_OR_STRING]["type"], "string");
        assert!(defs["io.k8s.api.coordination.v1.LeaseList"].is_object());
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert!(patch["consumes"].as_array().unwrap().contains(&json!("application/strategic-merge-patch+json")));
        let names: Vec<&str> =
            patch["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["body", "dryRun", "fieldManager", "fieldValidation", "force"]);
    }

    #[test]
    fn helpers() {
        assert_eq!(content_hash(b""), "6C62272E07BB014262B821756295C58D");
        let ids = OperationIds::new(&ResourceInfo { group: "rbac.authorization.k8s.io", version: "v1beta1", ..LEASE });
        assert_eq!(ids.of("list", ""), "listRbacAuthorizationV1beta1NamespacedLease");
        assert_eq!(group_version_path(&LEASE), "apis/coordination.k8s.io/v1");
    }
}
