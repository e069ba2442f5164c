//! Field ownership and server-side apply (upstream: the apiserver's `managedfields` over
//! `sigs.k8s.io/structured-merge-diff`).
//!
//! Every write records in `metadata.managedFields` which manager set which fields. An update
//! (create, PUT, PATCH) takes the fields it changed from everyone else, without conflicts. An
//! apply owns exactly the fields of the configuration it sent: it conflicts with the other owners
//! of fields it would change (unless forced, which takes them over), shares fields it sets to the
//! value they already have, and removes the fields it applied before and applies no more, unless
//! someone else owns them.
//!
//! Upstream reads list and map types from the OpenAPI schema (`x-kubernetes-list-type`,
//! `-list-map-keys`, `-map-type`). Here they come from the kind's strategic-merge keys, which name
//! the same lists: a list merged by a key is a map list, a merged list of primitives a set, every
//! other list atomic, as in upstream's schema for the built-in kinds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::error::{Cause, StatusError};
use super::patch::{METADATA_MERGE_KEYS, MergeKey};

/// A set of field paths shaped as `fieldsV1`: children keyed by path element (`f:name`,
/// `k:{"name":"c"}`, `v:"x"`); `member` means the path to the node itself is in the set (`.` in
/// fieldsV1, or an empty object for a leaf). Nodes that are neither members nor have members below
/// are never kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    /// Reads a `fieldsV1` object; anything else is the empty set.
    pub fn from_fields_v1(v: &Value) -> Self {
        let mut set = Self::default();
        if let Some(map) = v.as_object() {
            for (k, child) in map.iter().filter(|(k, _)| *k != ".") {
                set.children.insert(k.clone(), Self::node_from(child));
            }
        }
        set.prune();
        set
    }

    fn node_from(v: &Value) -> Self {
        let Some(map) = v.as_object() else { return Self { member: true, ..Self::default() } };
        let mut node = Self { member: map.is_empty() || map.contains_key("."), ..Self::default() };
        for (k, child) in map.iter().filter(|(k, _)| *k != ".") {
            node.children.insert(k.clone(), Self::node_from(child));
        }
        node
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        if self.member && !self.children.is_empty() {
            map.insert(".".into(), json!({}));
        }
        for (k, child) in &self.children {
            map.insert(k.clone(), child.to_fields_v1());
        }
        Value::Object(map)
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    fn leaf() -> Self {
        Self { member: true, children: BTreeMap::new() }
    }

    /// Drops nodes with no members at or below them.
    fn prune(&mut self) {
        self.children.retain(|_, c| {
            c.prune();
            !c.is_empty()
        });
    }

    pub fn union(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (k, c) in &other.children {
            self.children.entry(k.clone()).or_default().union(c);
        }
    }

    /// Removes the members of `other` (not what lies below them).
    pub fn difference(&mut self, other: &FieldSet) {
        if other.member {
            self.member = false;
        }
        for (k, c) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.difference(c);
                if mine.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet { member: self.member && other.member, children: BTreeMap::new() };
        for (k, c) in &self.children {
            if let Some(o) = other.children.get(k) {
                let both = c.intersection(o);
                if !both.is_empty() {
                    out.children.insert(k.clone(), both);
                }
            }
        }
        out
    }

    /// Keeps only the members that none of `others` owns anything at or below.
    fn unowned_by(&mut self, others: &[&FieldSet]) {
        if self.member && others.iter().any(|o| !o.is_empty()) {
            self.member = false;
        }
        self.children.retain(|k, c| {
            let below: Vec<&FieldSet> = others.iter().filter_map(|o| o.children.get(k)).collect();
            c.unowned_by(&below);
            !c.is_empty()
        });
    }

    /// Removes the subtree at `path` (a path of `f:` elements).
    fn remove_subtree(&mut self, path: &[&str]) {
        match path {
            [] => *self = FieldSet::default(),
            [last] => {
                self.children.remove(*last);
            }
            [first, rest @ ..] => {
                if let Some(c) = self.children.get_mut(*first) {
                    c.remove_subtree(rest);
                    if c.is_empty() {
                        self.children.remove(*first);
                    }
                }
            }
        }
    }

    /// Clears the membership of the node at `path`, keeping what lies below.
    fn remove_member(&mut self, path: &[&str]) {
        let mut node = self;
        for p in path {
            match node.children.get_mut(*p) {
                Some(c) => node = c,
                None => return,
            }
        }
        node.member = false;
    }

    /// Keeps only the subtree at `path`.
    fn only(&mut self, path: &str) {
        self.member = false;
        self.children.retain(|k, _| k == path);
    }

    /// Every member path, in upstream's notation (`.spec.containers[name="c"].image`).
    pub fn paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_paths(&mut String::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut String, out: &mut Vec<String>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            let len = prefix.len();
            push_element(prefix, k);
            c.collect_paths(prefix, out);
            prefix.truncate(len);
        }
    }
}

/// Appends one path element as structured-merge-diff prints it.
fn push_element(out: &mut String, element: &str) {
    match element.split_at_checked(2) {
        Some(("f:", name)) => {
            out.push('.');
            out.push_str(name);
        }
        Some(("k:", key)) => {
            let fields: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(out, "[{}]", parts.join(","));
        }
        Some(("v:", value)) => {
            let _ = write!(out, "[={value}]");
        }
        Some(("i:", index)) => {
            let _ = write!(out, "[{index}]");
        }
        _ => out.push_str(element),
    }
}

/// How a value merges and is owned, by its place in the kind's schema.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// A scalar, an atomic list or an atomic map: owned and replaced as one.
    Leaf,
    /// An object whose fields are owned one by one.
    Map,
    /// A list of objects identified by these fields.
    Keyed(Vec<&'static str>),
    /// A list of distinct primitives.
    Set,
}

/// Objects upstream marks atomic (`+structType=atomic`, `+mapType=atomic`): label selectors,
/// a Service's selector, a pod's node selector.
const ATOMIC_OBJECTS: &[&str] = &["selector", "labelSelector", "namespaceSelector", "podSelector", "nodeSelector"];

/// The list and map types of one kind.
pub struct Schema<'a> {
    keys: &'a [MergeKey],
}

/// Fields changed, added or removed between two versions of an object.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Modified or added (added maps and list items are members themselves too).
    pub changed: FieldSet,
    pub removed: FieldSet,
}

impl<'a> Schema<'a> {
    /// `keys`: the kind's strategic-merge lists ([`METADATA_MERGE_KEYS`] apply to every kind).
    pub fn new(keys: &'a [MergeKey]) -> Self {
        Self { keys }
    }

    fn shape(&self, spath: &str, v: &Value) -> Shape {
        match v {
            Value::Object(_) => {
                let last = spath.rsplit('.').next().unwrap_or_default();
                if ATOMIC_OBJECTS.contains(&last) { Shape::Leaf } else { Shape::Map }
            }
            Value::Array(_) => match self.keys.iter().chain(METADATA_MERGE_KEYS).find(|k| k.path == spath) {
                Some(MergeKey { key: Some(key), .. }) => Shape::Keyed(map_keys(spath, key)),
                Some(MergeKey { key: None, .. }) => Shape::Set,
                None => Shape::Leaf,
            },
            _ => Shape::Leaf,
        }
    }

    /// The children of a map, keyed list or set, by path element, with their schema paths.
    fn children<'v>(&self, shape: &Shape, spath: &str, v: &'v Value) -> Vec<(String, &'v Value, String)> {
        match (shape, v) {
            (Shape::Map, Value::Object(map)) => map
                .iter()
                .filter(|(k, _)| !(spath == "metadata" && *k == "managedFields"))
                .map(|(k, child)| (format!("f:{k}"), child, child_path(spath, k, child)))
                .collect(),
            (Shape::Keyed(keys), Value::Array(items)) => {
                items.iter().map(|item| (key_element(keys, item), item, spath.to_string())).collect()
            }
            (Shape::Set, Value::Array(items)) => {
                items.iter().map(|item| (format!("v:{item}"), item, spath.to_string())).collect()
            }
            _ => Vec::new(),
        }
    }

    /// What changed from `old` to `new` (upstream `TypedValue.Compare`).
    pub fn compare(&self, old: &Value, new: &Value) -> Comparison {
        let (mut changed, mut removed) = self.diff(Some(old), Some(new), "");
        changed.prune();
        removed.prune();
        Comparison { changed, removed }
    }

    fn diff(&self, old: Option<&Value>, new: Option<&Value>, spath: &str) -> (FieldSet, FieldSet) {
        match (old, new) {
            (None, None) => Default::default(),
            (None, Some(n)) => (self.everything(n, spath), FieldSet::default()),
            (Some(o), None) => (FieldSet::default(), self.everything(o, spath)),
            // Most of an updated object is unchanged: equal subtrees are passed over whole.
            (Some(o), Some(n)) if o == n => Default::default(),
            (Some(o), Some(n)) => {
                let shape = self.shape(spath, n);
                if shape == Shape::Leaf || shape != self.shape(spath, o) {
                    return (FieldSet::leaf(), FieldSet::default());
                }
                let mut changed = FieldSet::default();
                let mut removed = FieldSet::default();
                if let (Value::Object(om), Value::Object(nm)) = (o, n) {
                    for (k, nv) in nm.iter().filter(|(k, nv)| om.get(*k) != Some(*nv)) {
                        if spath == "metadata" && k == "managedFields" {
                            continue;
                        }
                        let (c, r) = self.diff(om.get(k), Some(nv), &child_path(spath, k, nv));
                        insert_child(&mut changed, || format!("f:{k}"), c);
                        insert_child(&mut removed, || format!("f:{k}"), r);
                    }
                    for (k, ov) in om.iter().filter(|(k, _)| !nm.contains_key(*k)) {
                        if !(spath == "metadata" && k == "managedFields") {
                            removed.children.insert(format!("f:{k}"), self.everything(ov, &child_path(spath, k, ov)));
                        }
                    }
                    return (changed, removed);
                }
                let olds: std::collections::HashMap<String, &Value> =
                    self.children(&shape, spath, o).into_iter().map(|(k, v, _)| (k, v)).collect();
                let news = self.children(&shape, spath, n);
                for (k, nv, path) in &news {
                    let (c, r) = self.diff(olds.get(k).copied(), Some(nv), path);
                    insert_child(&mut changed, || k.clone(), c);
                    insert_child(&mut removed, || k.clone(), r);
                }
                for (k, ov) in olds.iter().filter(|(k, _)| !news.iter().any(|(n, ..)| n == *k)) {
                    removed.children.insert(k.clone(), self.everything(ov, spath));
                }
                (changed, removed)
            }
        }
    }

    /// Every path at and below `v`.
    fn everything(&self, v: &Value, spath: &str) -> FieldSet {
        let shape = self.shape(spath, v);
        let mut set = FieldSet { member: !always_present(spath, v), children: BTreeMap::new() };
        for (k, child, path) in self.children(&shape, spath, v) {
            set.children.insert(k, self.everything(child, &path));
        }
        set
    }

    /// The fields an applied configuration sets (upstream `ToFieldSet`): leaves and list items,
    /// not the maps holding them.
    pub fn fields_of(&self, config: &Value) -> Result<FieldSet, StatusError> {
        let mut set = self.owned(config, "")?;
        set.member = false;
        set.prune();
        Ok(set)
    }

    fn owned(&self, v: &Value, spath: &str) -> Result<FieldSet, StatusError> {
        let shape = self.shape(spath, v);
        if shape == Shape::Leaf {
            return Ok(FieldSet::leaf());
        }
        if let (Shape::Keyed(keys), Value::Array(items)) = (&shape, v) {
            check_keys(spath, keys, items)?;
        }
        let mut set = FieldSet::default();
        for (k, child, path) in self.children(&shape, spath, v) {
            let c = match shape {
                Shape::Set => FieldSet::leaf(),
                Shape::Keyed(_) => FieldSet { member: true, ..self.owned(child, &path)? },
                _ => self.owned(child, &path)?,
            };
            set.children.insert(k, c);
        }
        Ok(set)
    }

    /// `config` merged into `live` (upstream `TypedValue.Merge`): maps field by field, keyed lists
    /// item by item (new items after the live ones), sets as a union, anything else replaced.
    pub fn merge(&self, live: &Value, config: &Value) -> Value {
        self.merge_at(live, config, "")
    }

    fn merge_at(&self, live: &Value, config: &Value, spath: &str) -> Value {
        let shape = self.shape(spath, config);
        if shape != self.shape(spath, live) {
            return config.clone();
        }
        match (&shape, live, config) {
            (Shape::Map, Value::Object(l), Value::Object(c)) => {
                let mut out = l.clone();
                for (k, cv) in c {
                    let path = join(spath, k);
                    let merged = match l.get(k) {
                        Some(lv) => self.merge_at(lv, cv, &path),
                        None => cv.clone(),
                    };
                    out.insert(k.clone(), merged);
                }
                Value::Object(out)
            }
            (Shape::Keyed(keys), Value::Array(l), Value::Array(c)) => {
                let mut out = l.clone();
                for item in c {
                    let key = key_element(keys, item);
                    match out.iter_mut().find(|x| key_element(keys, x) == key) {
                        Some(existing) => *existing = self.merge_at(existing, item, spath),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
            (Shape::Set, Value::Array(l), Value::Array(c)) => {
                let mut out = l.clone();
                for item in c {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            _ => config.clone(),
        }
    }

    /// Removes the members of `set` from `obj` (map fields, list items, set values).
    pub fn remove(&self, obj: &mut Value, set: &FieldSet) {
        self.remove_at(obj, set, "");
    }

    fn remove_at(&self, obj: &mut Value, set: &FieldSet, spath: &str) {
        let shape = self.shape(spath, obj);
        match (&shape, obj) {
            (Shape::Map, Value::Object(map)) => {
                for (k, sub) in &set.children {
                    let Some(name) = k.strip_prefix("f:") else { continue };
                    if sub.member {
                        map.remove(name);
                    } else if let Some(child) = map.get_mut(name) {
                        self.remove_at(child, sub, &join(spath, name));
                    }
                }
            }
            (Shape::Keyed(keys), Value::Array(items)) => {
                items.retain(|item| !set.children.get(&key_element(keys, item)).is_some_and(|s| s.member));
                for item in items.iter_mut() {
                    if let Some(sub) = set.children.get(&key_element(keys, item)) {
                        self.remove_at(item, sub, spath);
                    }
                }
            }
            (Shape::Set, Value::Array(items)) => {
                items.retain(|item| !set.children.get(&format!("v:{item}")).is_some_and(|s| s.member));
            }
            _ => {}
        }
    }
}

/// Fields upstream's typed objects always have, empty or not (struct fields, a pod's container
/// list): adding their content does not add them.
fn always_present(spath: &str, v: &Value) -> bool {
    match v {
        Value::Array(_) => spath.ends_with("spec.containers"),
        Value::Object(_) => ["template", "template.spec", "template.metadata", "jobTemplate", "jobTemplate.spec"]
            .iter()
            .any(|p| spath.ends_with(p)),
        _ => false,
    }
}

fn insert_child(set: &mut FieldSet, k: impl FnOnce() -> String, child: FieldSet) {
    if !child.is_empty() {
        set.children.insert(k(), child);
    }
}

/// [`join`] for a field whose schema path matters (an object or a list); scalars need none.
fn child_path(spath: &str, k: &str, child: &Value) -> String {
    if child.is_object() || child.is_array() { join(spath, k) } else { String::new() }
}

/// The schema path of field `k` below `spath` (`spec.containers`: list levels are not counted).
fn join(spath: &str, k: &str) -> String {
    if spath.is_empty() { k.to_string() } else { format!("{spath}.{k}") }
}

/// The key fields of a map list: the strategic-merge key, or upstream's `listMapKeys` where they
/// are several (ports are told apart by protocol too).
fn map_keys(spath: &str, key: &'static str) -> Vec<&'static str> {
    match key {
        "containerPort" => vec!["containerPort", "protocol"],
        "port" if spath.ends_with("spec.ports") => vec!["port", "protocol"],
        "topologyKey" => vec!["topologyKey", "whenUnsatisfiable"],
        _ => vec![key],
    }
}

/// `k:{"name":"c"}`: the item's key fields, sorted by name; a missing protocol is upstream's
/// default key value, TCP.
fn key_element(keys: &[&str], item: &Value) -> String {
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_unstable();
    let mut fields = Map::new();
    for k in sorted {
        match item.get(k) {
            Some(v) if !v.is_null() => {
                fields.insert(k.to_string(), v.clone());
            }
            _ if k == "protocol" => {
                fields.insert(k.to_string(), json!("TCP"));
            }
            _ => {}
        }
    }
    format!("k:{}", Value::Object(fields))
}

/// An applied keyed list must name each item's key, once.
fn check_keys(spath: &str, keys: &[&str], items: &[Value]) -> Result<(), StatusError> {
    let mut seen = std::collections::HashSet::new();
    for item in items {
        let first = keys.first().copied().unwrap_or_default();
        if item.get(first).is_none_or(Value::is_null) {
            return Err(StatusError::bad_request(format!(
                ".{spath}: associative list with keys has an element that omits key field {first:?}"
            )));
        }
        let key = key_element(keys, item);
        if !seen.insert(key.clone()) {
            let mut path = format!(".{spath}");
            push_element(&mut path, &key);
            return Err(StatusError::bad_request(format!(".{spath}: duplicate entries for key {path}")));
        }
    }
    Ok(())
}

/// `metadata.managedFields[].operation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    /// Empty for the main resource.
    pub subresource: String,
    pub fields: FieldSet,
}

/// Who writes, and through what.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    /// Empty for the main resource.
    pub subresource: &'a str,
    /// The kind has a status subresource: status belongs to it, not to the main resource.
    pub has_status: bool,
}

impl Writer<'_> {
    fn is(&self, e: &Entry, op: Operation) -> bool {
        e.manager == self.manager
            && e.operation == op
            && e.subresource == self.subresource
            && (op == Operation::Apply || e.api_version == self.api_version)
    }

    /// Drops what no manager owns (upstream's stripped metadata) and what this endpoint does not
    /// write (a status subresource's status from the main resource, the rest from `/status`).
    fn owned_here(&self, set: &mut FieldSet) {
        for top in ["f:apiVersion", "f:kind"] {
            set.children.remove(top);
        }
        for m in ["f:metadata", "f:spec", "f:status"] {
            set.remove_member(&[m]);
        }
        for m in ["name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "resourceVersion"] {
            set.remove_subtree(&["f:metadata", &format!("f:{m}")]);
        }
        if self.subresource == "status" {
            set.only("f:status");
        } else if self.has_status && self.subresource.is_empty() {
            set.remove_subtree(&["f:status"]);
        }
    }
}

/// The most Update entries kept; older ones are merged into one `ancient-changes` entry, as upstream.
const MAX_UPDATE_MANAGERS: usize = 10;

/// Reads `metadata.managedFields`; malformed entries are dropped.
pub fn decode(managed: Option<&Value>) -> Vec<Entry> {
    let Some(items) = managed.and_then(Value::as_array) else { return Vec::new() };
    items
        .iter()
        .filter_map(|e| {
            let operation = match e.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            Some(Entry {
                manager: s("manager").unwrap_or_default(),
                operation,
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time"),
                subresource: s("subresource").unwrap_or_default(),
                fields: FieldSet::from_fields_v1(e.get("fieldsV1")?),
            })
        })
        .collect()
}

/// Writes `metadata.managedFields` in upstream's order: Apply before Update, then oldest first.
pub fn encode(entries: &mut [Entry]) -> Value {
    entries.sort_by(|a, b| {
        (a.operation, &a.time, &a.manager, &a.api_version, &a.subresource).cmp(&(
            b.operation,
            &b.time,
            &b.manager,
            &b.api_version,
            &b.subresource,
        ))
    });
    Value::Array(
        entries
            .iter()
            .map(|e| {
                let mut m = Map::new();
                m.insert("manager".into(), json!(e.manager));
                m.insert("operation".into(), json!(if e.operation == Operation::Apply { "Apply" } else { "Update" }));
                m.insert("apiVersion".into(), json!(e.api_version));
                if let Some(t) = &e.time {
                    m.insert("time".into(), json!(t));
                }
                m.insert("fieldsType".into(), json!("FieldsV1"));
                m.insert("fieldsV1".into(), e.fields.to_fields_v1());
                if !e.subresource.is_empty() {
                    m.insert("subresource".into(), json!(e.subresource));
                }
                Value::Object(m)
            })
            .collect(),
    )
}

/// Records an update by `w` (upstream `FieldManager.Update`): what it changed becomes its own and
/// no one else's; what it removed, no one's.
pub fn update(entries: &mut Vec<Entry>, cmp: Comparison, w: &Writer<'_>, now: &str) {
    let Comparison { mut changed, removed } = cmp;
    w.owned_here(&mut changed);
    for e in entries.iter_mut() {
        e.fields.difference(&changed);
        e.fields.difference(&removed);
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| w.is(e, Operation::Update)) {
            Some(e) => {
                e.fields.union(&changed);
                e.time = Some(now.to_string());
            }
            None => entries.push(Entry {
                manager: w.manager.to_string(),
                operation: Operation::Update,
                api_version: w.api_version.to_string(),
                time: Some(now.to_string()),
                subresource: w.subresource.to_string(),
                fields: changed,
            }),
        }
    }
    finish(entries);
}

/// Forgets fields that no longer exist, for a write no manager is known for.
pub fn forget_removed(entries: &mut Vec<Entry>, cmp: &Comparison) {
    for e in entries.iter_mut() {
        e.fields.difference(&cmp.removed);
    }
    finish(entries);
}

/// The fields `w` applied last time, to be compared with what it applies now.
fn applied_before(entries: &[Entry], w: &Writer<'_>) -> FieldSet {
    entries.iter().find(|e| w.is(e, Operation::Apply)).map(|e| e.fields.clone()).unwrap_or_default()
}

/// What an apply of `applied` removes from the object: the fields `w` applied before and applies
/// no more, which no other manager owns (upstream `Updater.prune`).
pub fn to_remove(entries: &[Entry], w: &Writer<'_>, applied: &FieldSet) -> FieldSet {
    let mut gone = applied_before(entries, w);
    let mut applied = applied.clone();
    w.owned_here(&mut applied);
    gone.difference(&applied);
    let others: Vec<&FieldSet> = entries.iter().filter(|e| !w.is(e, Operation::Apply)).map(|e| &e.fields).collect();
    gone.unowned_by(&others);
    gone
}

/// Records an apply by `w` of the fields `applied` (upstream `FieldManager.Apply`): a conflict
/// where another manager owns a field the apply changes, unless `force`, which takes it over.
pub fn apply(
    entries: &mut Vec<Entry>,
    cmp: &Comparison,
    applied: &FieldSet,
    w: &Writer<'_>,
    force: bool,
    now: &str,
) -> Result<(), StatusError> {
    let mut applied = applied.clone();
    w.owned_here(&mut applied);
    let contested = applied.intersection(&cmp.changed);
    let mut conflicts = Vec::new();
    for e in entries.iter_mut().filter(|e| !w.is(e, Operation::Apply)) {
        let theirs = e.fields.intersection(&contested);
        if theirs.is_empty() {
            continue;
        }
        if force {
            e.fields.difference(&theirs);
        } else {
            conflicts.extend(theirs.paths().into_iter().map(|p| (describe(e), p)));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflict_error(conflicts));
    }
    for e in entries.iter_mut() {
        e.fields.difference(&cmp.removed);
    }
    let changed = !cmp.changed.is_empty() || !cmp.removed.is_empty();
    match entries.iter_mut().find(|e| w.is(e, Operation::Apply)) {
        Some(e) => {
            if changed || e.fields != applied {
                e.time = Some(now.to_string());
            }
            e.fields = applied;
            e.api_version = w.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: Operation::Apply,
            api_version: w.api_version.to_string(),
            time: Some(now.to_string()),
            subresource: w.subresource.to_string(),
            fields: applied,
        }),
    }
    finish(entries);
    Ok(())
}

/// Drops entries left with no fields and merges the oldest Update entries past the cap.
fn finish(entries: &mut Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    let updates = entries.iter().filter(|e| e.operation == Operation::Update).count();
    if updates <= MAX_UPDATE_MANAGERS {
        return;
    }
    entries.sort_by(|a, b| (a.operation, &a.time).cmp(&(b.operation, &b.time)));
    let first = entries.iter().position(|e| e.operation == Operation::Update).unwrap_or(entries.len());
    let excess = updates - MAX_UPDATE_MANAGERS + 1;
    let merged: Vec<Entry> = entries.drain(first..first + excess).collect();
    let mut ancient = Entry {
        manager: "ancient-changes".into(),
        operation: Operation::Update,
        api_version: merged.last().map(|e| e.api_version.clone()).unwrap_or_default(),
        time: merged.last().and_then(|e| e.time.clone()),
        subresource: String::new(),
        fields: FieldSet::default(),
    };
    for e in &merged {
        ancient.fields.union(&e.fields);
    }
    entries.push(ancient);
}

/// Upstream's `printManager` of a manager identifier (which has no time): `"kubectl"`,
/// `"kubelet" with subresource "status" using v1`, `"kubectl-edit" using apps/v1`.
fn describe(e: &Entry) -> String {
    let mut s = format!("{:?}", e.manager);
    if !e.subresource.is_empty() {
        let _ = write!(s, " with subresource {:?}", e.subresource);
    }
    if e.operation == Operation::Update {
        let _ = write!(s, " using {}", e.api_version);
    }
    s
}

/// Upstream's apply conflict: 409, one `FieldManagerConflict` cause per field.
fn conflict_error(conflicts: Vec<(String, String)>) -> StatusError {
    let message = if let [(manager, path)] = conflicts.as_slice() {
        format!("Apply failed with 1 conflict: conflict with {manager}: {path}")
    } else {
        let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (m, p) in &conflicts {
            by_manager.entry(m).or_default().push(p);
        }
        let mut lines = Vec::new();
        for (m, paths) in by_manager {
            lines.push(format!("conflicts with {m}:"));
            lines.extend(paths.iter().map(|p| format!("- {p}")));
        }
        format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
    };
    let causes = conflicts
        .into_iter()
        .map(|(m, p)| Cause { reason: "FieldManagerConflict".into(), message: format!("conflict with {m}"), field: p })
        .collect();
    StatusError::apply_conflict(message, causes)
}

#[cfg(test)]
mod tests;
