//! Generic REST storage over the store, plus a [`Strategy`] per kind.
//!
//! Everything kube-apiserver's generic registry does lives here once: object metadata (names,
//! `generateName`, uid, timestamps, generation), optimistic concurrency, no-op update elision,
//! status subresources, graceful deletion with finalizers, selectors, pagination and watch
//! filtering. What differs per kind is in `kinds/`.

mod admission;
pub mod bootstrap;
mod certificates;
pub mod error;
mod eviction;
pub mod fieldmanager;
pub mod kinds;
mod noderestriction;
pub mod patch;
pub mod pod_security;
pub mod rbac;
mod scale;
pub mod selector;
pub mod service_account_admission;
mod services;
pub mod strategy;
pub mod subresource;
pub mod token_request;
pub mod validation;
mod watch;

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use chrono::{SecondsFormat, Utc};
use serde_json::{Map, Value, json};

use crate::store::{self, Object, Op, Precondition, Store};
pub use error::{GroupResource, Result, StatusError};
use patch::PatchType;
use selector::{FieldSelector, LabelSelector};
pub use services::ServiceRanges;
pub use strategy::{Admitted, DeleteContext, Deletion, ResourceInfo, Strategy};
pub use subresource::Subresource;
use validation::{ErrorList, FieldError};
pub use watch::{Watch, WatchItem, WatchOptions};

/// How unknown fields in a request body are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// Options shared by create, update and patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// The node making the write, when a node makes it: NodeRestriction applies.
    pub node: Option<String>,
    /// Who makes the write (for RBAC's escalation checks); `None` inside the server.
    pub requester: Option<rbac::Requester>,
    /// The manager `metadata.managedFields` records the write under (`fieldManager`, or the
    /// client's user agent); `None`: no one is recorded.
    pub field_manager: Option<String>,
}

/// A server-side apply's configuration, as the fields it sets.
struct Applied {
    fields: fieldmanager::FieldSet,
    force: bool,
}

/// The outcome of a write: the object as stored and any warnings for the client.
#[derive(Debug)]
pub struct Written {
    pub object: Bytes,
    pub warnings: Vec<String>,
    /// True when a create stored a new object (HTTP 201).
    pub created: bool,
}

/// `DeleteOptions` as far as the storage cares.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Option<String>,
    pub dry_run: bool,
    /// The node deleting, when a node does: NodeRestriction applies.
    pub node: Option<String>,
}

/// What a DELETE produced.
#[derive(Debug)]
pub enum Deleted {
    /// The object is gone; its final state.
    Gone(Bytes),
    /// The object still exists, marked for deletion (grace period or finalizers pending).
    Pending(Bytes),
}

/// `ListOptions` as far as the storage cares.
#[derive(Debug, Default, Clone)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// One page of a list, with items already in this resource's representation.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Bytes>,
    pub revision: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// One served resource: its strategy plus the storage it uses.
pub type Resource = Arc<dyn Strategy>;

/// The generic storage for every served resource.
#[derive(Clone)]
pub struct Registry {
    store: Store,
    resources: Arc<Vec<Resource>>,
    ranges: Arc<ServiceRanges>,
    rbac: Arc<rbac::RuleResolver>,
}

const GENERATE_NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

impl Registry {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            resources: Arc::new(kinds::all()),
            ranges: Arc::new(ServiceRanges::default()),
            rbac: Default::default(),
        }
    }

    /// The same registry allocating Services' cluster IPs and node ports from `ranges`.
    pub fn with_service_ranges(self, ranges: ServiceRanges) -> Self {
        Self { ranges: Arc::new(ranges), ..self }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The RBAC rules `user` holds in `namespace` (and cluster-wide).
    pub fn rbac_rules(&self, user: rbac::UserInfo<'_>, namespace: Option<&str>) -> Vec<rbac::Rules> {
        self.rbac.rules_for(&self.store, user, namespace)
    }

    /// Every served resource, in discovery order.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// The resource at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Resource> {
        self.resources
            .iter()
            .find(|r| {
                let i = r.info();
                i.group == group && i.version == version && i.plural == plural
            })
            .cloned()
    }

    fn key(r: &Resource, ns: Option<&str>, name: &str) -> String {
        match (r.info().namespaced, ns) {
            (true, Some(ns)) => format!("{}/{ns}/{name}", r.info().storage),
            _ => format!("{}/{name}", r.info().storage),
        }
    }

    fn prefix(r: &Resource, ns: Option<&str>) -> String {
        match (r.info().namespaced, ns) {
            (true, Some(ns)) => format!("{}/{ns}/", r.info().storage),
            _ => format!("{}/", r.info().storage),
        }
    }

    /// Converts stored bytes into `r`'s representation.
    fn present(r: &Resource, obj: &Object) -> Result<Bytes> {
        if !r.converts() {
            return Ok(obj.data.clone());
        }
        let v = r.decode_stored(parse_stored(obj)?)?;
        Ok(Bytes::from(serde_json::to_vec(&v).map_err(StatusError::internal)?))
    }

    fn current(&self, r: &Resource, ns: Option<&str>, name: &str) -> Result<(Arc<Object>, Value)> {
        let obj = self
            .store
            .get(&Self::key(r, ns, name))
            .ok_or_else(|| StatusError::not_found(&r.info().group_resource(), name))?;
        let value = r.decode_stored(parse_stored(&obj)?)?;
        Ok((obj, value))
    }

    /// GET one object.
    pub fn get(&self, r: &Resource, ns: Option<&str>, name: &str) -> Result<Bytes> {
        let obj = self
            .store
            .get(&Self::key(r, ns, name))
            .ok_or_else(|| StatusError::not_found(&r.info().group_resource(), name))?;
        Self::present(r, &obj)
    }

    /// Parsed current object, for in-process callers (controllers).
    pub fn get_value(&self, r: &Resource, ns: Option<&str>, name: &str) -> Result<Value> {
        self.current(r, ns, name).map(|(_, v)| v)
    }

    /// Whether a node of this name exists.
    pub fn node_exists(&self, name: &str) -> bool {
        self.store.get(&format!("{}/{name}", kinds::NODES_STORAGE)).is_some()
    }

    /// LIST with selectors and pagination.
    pub fn list(&self, r: &Resource, ns: Option<&str>, opts: &ListOptions) -> Result<ListPage> {
        check_fields(r, &opts.fields)?;
        let prefix = Self::prefix(r, ns);
        let after = match &opts.continue_token {
            Some(tok) => Some(decode_continue(tok, &prefix)?),
            None => None,
        };
        let filtering = !opts.labels.is_empty() || !opts.fields.is_empty();
        // Selecting one name needs no scan.
        if let (Some(name), Some(ns)) =
            (opts.fields.exact("metadata.name"), ns.or((!r.info().namespaced).then_some("")))
        {
            let ns = (!ns.is_empty()).then_some(ns);
            let revision = self.store.revision();
            let mut items = Vec::new();
            if let Some(obj) = self.store.get(&Self::key(r, ns, name)) {
                let v = r.decode_stored(parse_stored(&obj)?)?;
                if matches(r, &v, &opts.labels, &opts.fields) {
                    items.push(Self::present(r, &obj)?);
                }
            }
            return Ok(ListPage { items, revision, continue_token: None, remaining: None });
        }
        let listing = self.store.list(&prefix, after.as_deref());
        let mut items = Vec::new();
        let mut continue_token = None;
        let mut remaining = None;
        for (i, (key, obj)) in listing.items.iter().enumerate() {
            if filtering {
                let v = r.decode_stored(parse_stored(obj)?)?;
                if !matches(r, &v, &opts.labels, &opts.fields) {
                    continue;
                }
            }
            items.push(Self::present(r, obj)?);
            if opts.limit.is_some_and(|l| items.len() >= l) && i + 1 < listing.items.len() {
                continue_token = Some(encode_continue(listing.revision, key, &prefix));
                // Like upstream, the count is only known when no selector filters the rest.
                remaining = (!filtering).then(|| listing.items.len() - i - 1);
                break;
            }
        }
        Ok(ListPage { items, revision: listing.revision, continue_token, remaining })
    }

    /// Starts a watch.
    pub fn watch(&self, r: &Resource, ns: Option<&str>, opts: WatchOptions) -> Result<Watch> {
        check_fields(r, &opts.fields)?;
        Watch::start(&self.store, r.clone(), Self::prefix(r, ns), opts)
    }

    /// Parses a request body into a JSON object and checks apiVersion and kind against `r`.
    fn check_body(r: &Resource, body: Value) -> Result<Value> {
        let info = r.info();
        let Value::Object(mut map) = body else {
            return Err(StatusError::bad_request(format!(
                "the request body must be a JSON or YAML object of kind {}",
                info.kind
            )));
        };
        let want = info.api_version();
        match map.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v != want => {
                return Err(StatusError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({want})"
                )));
            }
            _ => {}
        }
        match map.get("kind").and_then(Value::as_str) {
            Some(k) if k != info.kind => {
                return Err(StatusError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    info.kind
                )));
            }
            _ => {}
        }
        map.insert("apiVersion".into(), Value::String(want));
        map.insert("kind".into(), Value::String(info.kind.into()));
        Ok(Value::Object(map))
    }

    /// Applies `fieldValidation` to the unknown fields of an admitted object: an error when strict,
    /// warnings otherwise.
    fn unknown_fields(admitted: &Admitted, opts: &WriteOptions) -> Result<Vec<String>> {
        let found = || admitted.unknown_fields.iter().map(|f| format!("unknown field \"{f}\""));
        match opts.field_validation {
            _ if admitted.unknown_fields.is_empty() => Ok(Vec::new()),
            FieldValidation::Strict => Err(StatusError::bad_request(format!(
                "strict decoding error: {}",
                found().collect::<Vec<_>>().join(", ")
            ))),
            FieldValidation::Warn => Ok(found().collect()),
            FieldValidation::Ignore => Ok(Vec::new()),
        }
    }

    /// POST: create an object in `ns`.
    pub async fn create(&self, r: &Resource, ns: Option<&str>, body: Value, opts: &WriteOptions) -> Result<Written> {
        self.create_with(r, ns, body, opts, None).await
    }

    /// A create, made by an update or by an apply of `applied`.
    async fn create_with(
        &self,
        r: &Resource,
        ns: Option<&str>,
        body: Value,
        opts: &WriteOptions,
        applied: Option<&Applied>,
    ) -> Result<Written> {
        let info = *r.info();
        let mut obj = Self::check_body(r, body)?;
        let meta = strategy::meta_mut(&mut obj);
        let ns = if info.namespaced {
            let body_ns = meta.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty());
            match (ns, body_ns) {
                (Some(a), Some(b)) if a != b => {
                    return Err(StatusError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(a), _) => a.to_string(),
                (None, Some(b)) => b.to_string(),
                (None, None) => "default".to_string(),
            }
        } else {
            String::new()
        };
        if info.namespaced {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        } else {
            meta.remove("namespace");
        }
        let generated =
            match (meta.get("name").and_then(Value::as_str), meta.get("generateName").and_then(Value::as_str)) {
                (Some(n), _) if !n.is_empty() => false,
                (_, Some(g)) if !g.is_empty() => {
                    let name = generate_name(g);
                    meta.insert("name".into(), Value::String(name));
                    true
                }
                _ => false,
            };
        reset_server_meta(meta, r.generation());
        self.admit_create_with_others(r, &mut obj)?;
        let pod = info.group.is_empty() && info.plural == "pods";
        if pod {
            // Before the service account's admission, which would otherwise report a missing
            // namespace as a missing account.
            self.check_namespace_open(
                r,
                &ns,
                strategy::str_at(&obj, &["metadata", "name"]).as_deref().unwrap_or_default(),
            )?;
            self.admit_service_account(&mut obj).await?;
        }
        if info.group == kinds::certificates::GROUP {
            self.admit_csr_create(&mut obj, opts.requester.as_ref())?;
        }
        let admitted = r.admit_create(obj)?;
        let mut warnings = Self::unknown_fields(&admitted, opts)?;
        let obj = admitted.object;
        let name = strategy::str_at(&obj, &["metadata", "name"]).unwrap_or_default();
        let mut errs = validate_meta(r, &obj, true);
        errs.extend(admitted.errors);
        if !errs.is_empty() {
            return Err(StatusError::invalid(info.kind, info.group, &name, &errs));
        }
        if let Some(node) = &opts.node {
            self.restrict_node(node, r, None, noderestriction::Write::Create(&obj))?;
        }
        if let Some(who) = &opts.requester {
            self.confirm_no_escalation(r, &obj, who)?;
        }
        if info.namespaced && !pod {
            self.check_namespace_open(r, &ns, &name)?;
        }
        let mut obj = obj;
        warnings.extend(self.admit_pod_security(r, &obj, None, None)?);
        manage_fields(r, None, &mut obj, None, opts, Vec::new(), applied)?;
        let key = Self::key(r, info.namespaced.then_some(ns.as_str()), &name);
        let reserved = if is_service(r) {
            if self.store.get(&key).is_some() {
                return Err(StatusError::already_exists(&info.group_resource(), &name));
            }
            Some(self.reserve_for_service(&mut obj, None, opts.dry_run).await?)
        } else {
            None
        };
        if opts.dry_run {
            return Ok(Written { object: to_bytes(&obj)?, warnings, created: true });
        }
        let stored = r.encode_stored(obj)?;
        let result = self.store.write(key, Precondition::Absent, Op::Put(stored)).await;
        if let (Err(_), Some(reserved)) = (&result, reserved) {
            self.release(reserved).await;
        }
        match result {
            Ok(o) => Ok(Written { object: Self::present(r, &o)?, warnings, created: true }),
            Err(store::Error::AlreadyExists) if generated => {
                Err(StatusError::already_exists(&info.group_resource(), &name))
            }
            Err(e) => Err(store_error(r, &name, e)),
        }
    }

    /// NamespaceLifecycle: the namespace must exist and not be terminating.
    fn check_namespace_open(&self, r: &Resource, ns: &str, name: &str) -> Result<()> {
        let Some(nsobj) = self.store.get(&format!("{}/{ns}", kinds::NAMESPACES_STORAGE)) else {
            return Err(StatusError::not_found(
                &GroupResource { group: String::new(), resource: "namespaces".into() },
                ns,
            ));
        };
        let v = parse_stored(&nsobj)?;
        if v["metadata"].get("deletionTimestamp").is_some_and(|t| !t.is_null()) {
            return Err(StatusError::forbidden(
                &r.info().group_resource(),
                name,
                format!("unable to create new content in namespace {ns} because it is being terminated"),
            ));
        }
        Ok(())
    }

    /// PUT: replace an object (or its status, or another subresource handled as an update).
    pub async fn update(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        body: Value,
        subresource: Option<Subresource>,
        opts: &WriteOptions,
    ) -> Result<Written> {
        let new = Self::check_body(r, body)?;
        if let Some(n) = strategy::str_at(&new, &["metadata", "name"]).filter(|n| !n.is_empty())
            && n != name
        {
            return Err(StatusError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if r.info().namespaced
            && let (Some(b), Some(u)) =
                (strategy::str_at(&new, &["metadata", "namespace"]).filter(|s| !s.is_empty()), ns)
            && b != u
        {
            return Err(StatusError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let wanted_rv = parse_rv(strategy::str_at(&new, &["metadata", "resourceVersion"]).as_deref())?;
        // A uid in the body is a precondition (upstream's `defaultUpdatedObjectInfo.Preconditions`).
        let uid = strategy::str_at(&new, &["metadata", "uid"]).filter(|u| !u.is_empty());
        self.guaranteed_update(r, ns, name, wanted_rv, subresource, opts, None, |current| {
            let stored = strategy::str_at(current, &["metadata", "uid"]).unwrap_or_default();
            match &uid {
                Some(uid) if *uid != stored => Err(StatusError::conflict(
                    &r.info().group_resource(),
                    name,
                    format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {stored}"),
                )),
                _ => Ok(new.clone()),
            }
        })
        .await
    }

    /// PATCH in any of the three patch formats.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        patch: &[u8],
        pt: PatchType,
        subresource: Option<Subresource>,
        opts: &WriteOptions,
    ) -> Result<Written> {
        let keys: Vec<patch::MergeKey> = patch::METADATA_MERGE_KEYS.iter().chain(r.merge_keys()).copied().collect();
        self.guaranteed_update(r, ns, name, None, subresource, opts, None, |current| {
            let patched =
                patch::apply(current, patch, pt, &keys).map_err(|e| StatusError::bad_request(e.to_string()))?;
            let obj = Self::check_body(r, patched)?;
            check_name(&obj, name, ns)?;
            // A resourceVersion in the patch is a precondition.
            let asked = strategy::str_at(&obj, &["metadata", "resourceVersion"]);
            let have = strategy::str_at(current, &["metadata", "resourceVersion"]);
            if asked.is_some() && asked != have {
                return Err(StatusError::modified(&r.info().group_resource(), name));
            }
            Ok(obj)
        })
        .await
    }

    /// PATCH with `application/apply-patch+yaml`: server-side apply of `config` by
    /// `opts.field_manager`, creating the object if it does not exist (upstream's apply patcher).
    #[allow(clippy::too_many_arguments)]
    pub async fn apply(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        config: Value,
        subresource: Option<Subresource>,
        opts: &WriteOptions,
        force: bool,
    ) -> Result<Written> {
        let mut config = Self::check_body(r, config)?;
        let meta = strategy::meta_mut(&mut config);
        if meta.get("managedFields").is_some_and(|m| !m.is_null()) {
            return Err(StatusError::bad_request("metadata.managedFields must be nil"));
        }
        match meta.get("name").and_then(Value::as_str) {
            Some(n) if n != name => {
                return Err(StatusError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            Some(_) => {}
            None => {
                meta.insert("name".into(), json!(name));
            }
        }
        let schema = fieldmanager::Schema::new(r.merge_keys());
        let applied = Applied { fields: schema.fields_of(&config)?, force };
        match self.get(r, ns, name) {
            Err(e) if e.code == 404 && subresource.is_none() => {
                let mut w = self.create_with(r, ns, config, opts, Some(&applied)).await?;
                w.created = true;
                return Ok(w);
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let writer_api = r.info().api_version();
        self.guaranteed_update(r, ns, name, None, subresource, opts, Some(&applied), |current| {
            let asked = strategy::str_at(&config, &["metadata", "resourceVersion"]);
            if asked.is_some() && asked != strategy::str_at(current, &["metadata", "resourceVersion"]) {
                return Err(StatusError::modified(&r.info().group_resource(), name));
            }
            let entries = fieldmanager::decode(current["metadata"].get("managedFields"));
            let mut merged = schema.merge(current, &config);
            if let Some(w) = writer(r, &writer_api, subresource, opts) {
                schema.remove(&mut merged, &fieldmanager::to_remove(&entries, &w, &applied.fields));
            }
            Ok(merged)
        })
        .await
    }

    /// Read-modify-write with optimistic concurrency. `wanted_rv` set means the client asked for
    /// that exact revision (409 if stale); otherwise conflicts from concurrent writers are retried.
    #[allow(clippy::too_many_arguments)]
    async fn guaranteed_update(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        wanted_rv: Option<u64>,
        subresource: Option<Subresource>,
        opts: &WriteOptions,
        applied: Option<&Applied>,
        mut mutate: impl FnMut(&Value) -> Result<Value>,
    ) -> Result<Written> {
        let info = *r.info();
        let gr = info.group_resource();
        let status = subresource == Some(Subresource::Status);
        for _ in 0..16 {
            let (cur, old) = self.current(r, ns, name)?;
            if wanted_rv.is_some_and(|rv| rv != cur.rv) {
                return Err(StatusError::modified(&gr, name));
            }
            let mut new = mutate(&old)?;
            // A uid in the new object must be the stored one (upstream's immutable-field rule: how
            // a patch names the object it was made for); an empty one is filled in.
            let given_uid = strategy::str_at(&new, &["metadata", "uid"]).filter(|u| !u.is_empty());
            let requested_fields = strategy::meta_mut(&mut new).remove("managedFields");
            let asked_deletion =
                ["deletionTimestamp", "deletionGracePeriodSeconds"].map(|k| new["metadata"].get(k).cloned());
            keep_server_meta(&mut new, &old, r.generation());
            let other_uid = given_uid.filter(|u| Some(u) != strategy::str_at(&old, &["metadata", "uid"]).as_ref());
            let mut warnings = Vec::new();
            let mut errs = Vec::new();
            match subresource {
                Some(sub) if !sub.uses_update_strategy() => new = sub.updated(new, &old),
                _ => {
                    let admitted = r.admit_update(new, &old, subresource)?;
                    warnings = Self::unknown_fields(&admitted, opts)?;
                    errs = admitted.errors;
                    new = admitted.object;
                }
            }
            if status {
                reset_meta_for_status(&mut new, &old, r.status_writes_annotations());
            }
            if r.generation() && new.get("spec") != old.get("spec") {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
                strategy::meta_mut(&mut new).insert("generation".into(), json!(g));
            }
            if let Some(uid) = other_uid {
                errs.push(FieldError::invalid("metadata.uid", uid, "field is immutable"));
            }
            if subresource.is_none() {
                errs.extend(changed_deletion(&asked_deletion, &old));
            }
            errs.extend(validate_meta(r, &new, false));
            errs.extend(validate_meta_update(&new, &old));
            if !errs.is_empty() {
                return Err(StatusError::invalid(info.kind, info.group, name, &errs));
            }
            match subresource {
                None => self.admit_update_with_others(r, &new, &old)?,
                Some(Subresource::Approval) => self.admit_csr_approval(&new, opts.requester.as_ref())?,
                Some(_) => {}
            }
            if let Some(node) = &opts.node {
                self.restrict_node(node, r, subresource, noderestriction::Write::Update { old: &old, new: &new })?;
            }
            if subresource == Some(Subresource::Binding) {
                // Upstream's BindingREST writes the pod in storage, past the field manager: the
                // pod's managed fields stay as stored (and no diff of the whole pod is paid).
                if let Some(stored) = old["metadata"].get("managedFields") {
                    strategy::meta_mut(&mut new).insert("managedFields".into(), stored.clone());
                }
            } else {
                let base = base_fields(&old, requested_fields.as_ref(), subresource);
                manage_fields(r, Some(&old), &mut new, subresource, opts, base, applied)?;
            }
            if new == old {
                return Ok(Written { object: Self::present(r, &cur)?, warnings, created: false });
            }
            warnings.extend(self.admit_pod_security(r, &new, Some(&old), subresource)?);
            if let Some(who) = opts
                .requester
                .as_ref()
                .filter(|_| new.get("rules") != old.get("rules") || new.get("subjects") != old.get("subjects"))
            {
                self.confirm_no_escalation(r, &new, who)?;
            }
            let service = is_service(r) && subresource.is_none();
            let reserved =
                if service { Some(self.reserve_for_service(&mut new, Some(&old), opts.dry_run).await?) } else { None };
            if opts.dry_run {
                return Ok(Written { object: to_bytes(&new)?, warnings, created: false });
            }
            // Removing the last finalizer of an object whose deletion is due finishes the delete.
            let finishing =
                is_terminating(&new) && !has_finalizers(&new) && grace_elapsed(&new) && !r.pending_finalizers(&new)?;
            let key = Self::key(r, ns, name);
            let stored = r.encode_stored(new.clone())?;
            let op = if finishing { Op::Delete(stored) } else { Op::Put(stored) };
            let result = self.store.write(key, Precondition::Revision(cur.rv), op).await;
            match (&result, reserved) {
                (Err(_), Some(reserved)) => self.release(reserved).await,
                (Ok(_), _) if is_service(r) => self.release_unused(&old, (!finishing).then_some(&new)).await,
                _ => {}
            }
            match result {
                Ok(o) => return Ok(Written { object: Self::present(r, &o)?, warnings, created: false }),
                Err(store::Error::Conflict { .. }) if wanted_rv.is_none() => continue,
                Err(store::Error::Conflict { .. }) => return Err(StatusError::modified(&gr, name)),
                Err(e) => return Err(store_error(r, name, e)),
            }
        }
        Err(StatusError::conflict(&gr, name, "too many concurrent updates; please try again"))
    }

    /// DELETE one object, honouring grace periods, preconditions, propagation and finalizers.
    pub async fn delete(&self, r: &Resource, ns: Option<&str>, name: &str, opts: &DeleteOptions) -> Result<Deleted> {
        let info = *r.info();
        let gr = info.group_resource();
        let wanted_rv = parse_rv(opts.resource_version.as_deref())?;
        Self::admit_delete(r, name)?;
        for _ in 0..16 {
            let (cur, old) = self.current(r, ns, name)?;
            if let Some(uid) = &opts.uid {
                let have = strategy::str_at(&old, &["metadata", "uid"]).unwrap_or_default();
                if *uid != have {
                    return Err(StatusError::conflict(
                        &gr,
                        name,
                        format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                    ));
                }
            }
            if let Some(rv) = wanted_rv
                && rv != cur.rv
            {
                return Err(StatusError::conflict(
                    &gr,
                    name,
                    format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        cur.rv
                    ),
                ));
            }
            if let Some(node) = &opts.node {
                self.restrict_node(node, r, None, noderestriction::Write::Delete(&old))?;
            }
            let node_exists = |n: &str| self.node_exists(n);
            let ctx = DeleteContext { requested_grace: opts.grace_period_seconds, node_exists: &node_exists };
            let deletion = match opts.grace_period_seconds {
                Some(g) if g <= 0 => Deletion::Immediate,
                _ => r.deletion(&old, &ctx)?,
            };
            let mut new = old.clone();
            let pending = r.pending_finalizers(&old)?;
            if pending && !is_terminating(&old) {
                r.mark_deleting(&mut new)?;
            }
            let meta = strategy::meta_mut(&mut new);
            add_propagation_finalizer(meta, opts.propagation.as_deref())?;
            let finalizers = pending || meta.get("finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
            let already = meta.get("deletionTimestamp").is_some_and(|t| !t.is_null());
            let now = Utc::now();
            let op = match deletion {
                Deletion::Graceful(grace) => {
                    let due = now + chrono::Duration::seconds(grace);
                    let current_due = meta
                        .get("deletionTimestamp")
                        .and_then(Value::as_str)
                        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
                    // A shorter grace period than the pending one moves the deadline earlier.
                    if !already || current_due.is_some_and(|d| due < d) {
                        meta.insert("deletionTimestamp".into(), json!(timestamp(due)));
                        meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                    }
                    None
                }
                Deletion::Immediate if finalizers => {
                    if !already {
                        meta.insert("deletionTimestamp".into(), json!(timestamp(now)));
                    }
                    meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                    None
                }
                Deletion::Immediate => Some(Op::Delete(r.encode_stored(new.clone())?)),
            };
            if opts.dry_run {
                return Ok(match op {
                    Some(_) => Deleted::Gone(to_bytes(&new)?),
                    None => Deleted::Pending(to_bytes(&new)?),
                });
            }
            let key = Self::key(r, ns, name);
            let gone = op.is_some();
            let op = match op {
                Some(op) => op,
                None if new == old => return Ok(Deleted::Pending(Self::present(r, &cur)?)),
                None => Op::Put(r.encode_stored(new)?),
            };
            match self.store.write(key, Precondition::Revision(cur.rv), op).await {
                Ok(o) => {
                    if gone && is_service(r) {
                        self.release_unused(&old, None).await;
                    }
                    let bytes = Self::present(r, &o)?;
                    return Ok(if gone { Deleted::Gone(bytes) } else { Deleted::Pending(bytes) });
                }
                Err(store::Error::Conflict { .. }) if wanted_rv.is_none() => continue,
                Err(e) => return Err(store_error(r, name, e)),
            }
        }
        Err(StatusError::conflict(&gr, name, "too many concurrent updates; please try again"))
    }

    /// DELETE a collection: every object matching the list options.
    pub async fn delete_collection(
        &self,
        r: &Resource,
        ns: Option<&str>,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<ListPage> {
        let page = self.list(r, ns, &ListOptions { limit: None, continue_token: None, ..list.clone() })?;
        let mut items = Vec::new();
        for item in &page.items {
            let v: Value = serde_json::from_slice(item).map_err(StatusError::internal)?;
            let name = strategy::str_at(&v, &["metadata", "name"]).unwrap_or_default();
            let obj_ns = strategy::str_at(&v, &["metadata", "namespace"]);
            match self.delete(r, obj_ns.as_deref(), &name, opts).await {
                Ok(Deleted::Gone(b) | Deleted::Pending(b)) => items.push(b),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ListPage { items, revision: self.store.revision(), continue_token: None, remaining: None })
    }

    /// `POST pods/{name}/binding`: assigns a pod to a node once.
    pub async fn bind(&self, ns: &str, name: &str, binding: &Value) -> Result<()> {
        let pods = self.find("", "v1", "pods").ok_or_else(|| StatusError::internal("pods are not served"))?;
        let target = binding.get("target").cloned().unwrap_or(Value::Null);
        let node = target.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if node.is_empty() {
            return Err(StatusError::invalid("Binding", "", name, &[FieldError::required("target.name", "")]));
        }
        if let Some(kind) = target.get("kind").and_then(Value::as_str)
            && !kind.is_empty()
            && kind != "Node"
        {
            return Err(StatusError::invalid(
                "Binding",
                "",
                name,
                &[FieldError::not_supported("target.kind", kind, &["Node"])],
            ));
        }
        let uid = binding["metadata"].get("uid").and_then(Value::as_str).map(str::to_string);
        let gr = GroupResource { group: String::new(), resource: "pods/binding".into() };
        self.guaranteed_update(
            &pods,
            Some(ns),
            name,
            None,
            Some(Subresource::Binding),
            &WriteOptions::default(),
            None,
            |pod| {
                if let Some(uid) = &uid
                    && strategy::str_at(pod, &["metadata", "uid"]).as_deref() != Some(uid)
                {
                    return Err(StatusError::conflict(&gr, name, "the UID in the binding does not match the pod"));
                }
                if is_terminating(pod) {
                    return Err(StatusError::conflict(
                        &gr,
                        name,
                        format!("pod {name} is being deleted, cannot be assigned to a host"),
                    ));
                }
                if let Some(n) = strategy::str_at(pod, &["spec", "nodeName"]).filter(|n| !n.is_empty()) {
                    return Err(StatusError::conflict(
                        &gr,
                        name,
                        format!("pod {name} is already assigned to node \"{n}\""),
                    ));
                }
                let mut pod = pod.clone();
                pod["spec"]["nodeName"] = json!(node);
                kinds::pod::set_condition(&mut pod, "PodScheduled", "True", None, None);
                Ok(pod)
            },
        )
        .await
        .map(|_| ())
    }
}

/// Rejects field selectors on fields the resource does not index, with upstream's message.
/// Services get cluster IPs and node ports around their writes (`services.rs`).
fn is_service(r: &Resource) -> bool {
    r.info().storage == "services"
}

fn check_fields(r: &Resource, fields: &FieldSelector) -> Result<()> {
    for f in fields.fields() {
        if f != "metadata.name" && f != "metadata.namespace" && !r.fields().contains(&f) {
            return Err(StatusError::bad_request(format!("field label not supported: {f}")));
        }
    }
    Ok(())
}

/// Whether an object passes label and field selectors.
/// Keys whose updates the embedded store may take to disk with the next flush (see
/// [`store::Options::deferred`]).
pub fn deferred_keys() -> Vec<String> {
    vec![kinds::coordination::node_heartbeat_keys()]
}

pub fn matches(r: &Resource, obj: &Value, labels: &LabelSelector, fields: &FieldSelector) -> bool {
    labels.matches(obj["metadata"].get("labels").and_then(Value::as_object)) && fields.matches(|f| r.field(obj, f))
}

fn parse_stored(obj: &Object) -> Result<Value> {
    serde_json::from_slice(&obj.data).map_err(|e| StatusError::internal(format!("stored object is damaged: {e}")))
}

fn to_bytes(v: &Value) -> Result<Bytes> {
    serde_json::to_vec(v).map(Bytes::from).map_err(StatusError::internal)
}

fn parse_rv(rv: Option<&str>) -> Result<Option<u64>> {
    match rv {
        None | Some("") => Ok(None),
        Some(s) => {
            s.parse().map(Some).map_err(|_| StatusError::bad_request(format!("invalid resource version: {s:?}")))
        }
    }
}

fn store_error(r: &Resource, name: &str, e: store::Error) -> StatusError {
    let gr = r.info().group_resource();
    match e {
        store::Error::AlreadyExists => StatusError::already_exists(&gr, name),
        store::Error::NotFound => StatusError::not_found(&gr, name),
        store::Error::Conflict { .. } => StatusError::modified(&gr, name),
        store::Error::TooOld { requested, oldest } => {
            StatusError::gone(format!("too old resource version: {requested} ({oldest})"))
        }
        store::Error::Timeout { endpoint } => {
            tracing::warn!("the datastore {endpoint} did not answer a write to {gr} {name:?} in time");
            StatusError::storage_timeout()
        }
        e @ store::Error::Unavailable { .. } => StatusError::service_unavailable(e.to_string()),
        other => StatusError::internal(other),
    }
}

/// RFC 3339 with seconds, as Kubernetes serialises `metav1.Time`.
pub fn timestamp(t: chrono::DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn generate_name(prefix: &str) -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    let suffix: String =
        (0..5).map(|_| GENERATE_NAME_CHARS[rng.random_range(0..GENERATE_NAME_CHARS.len())] as char).collect();
    // Upstream trims the prefix so the result stays a valid name length.
    let max = 63 - 5;
    let prefix = if prefix.len() > max { &prefix[..max] } else { prefix };
    format!("{prefix}{suffix}")
}

/// A patched object must keep the name and namespace of its URL (upstream's `checkName`).
fn check_name(obj: &Value, name: &str, ns: Option<&str>) -> Result<()> {
    let got = strategy::str_at(obj, &["metadata", "name"]).unwrap_or_default();
    if got != name {
        return Err(StatusError::bad_request(format!(
            "the name of the object ({got}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(want), Some(got)) = (ns, strategy::str_at(obj, &["metadata", "namespace"]).filter(|n| !n.is_empty()))
        && got != want
    {
        return Err(StatusError::bad_request(format!(
            "the namespace of the object ({got}) does not match the namespace on the URL ({want})"
        )));
    }
    Ok(())
}

/// Only the server sets `deletionTimestamp` and `deletionGracePeriodSeconds`: a write naming other
/// values than the stored ones is invalid (`ValidateObjectMetaUpdate`); leaving them out keeps them.
fn changed_deletion(asked: &[Option<Value>; 2], old: &Value) -> ErrorList {
    ["deletionTimestamp", "deletionGracePeriodSeconds"]
        .iter()
        .zip(asked)
        .filter_map(|(k, v)| {
            let v = v.as_ref().filter(|v| !v.is_null())?;
            let field = format!("metadata.{k}");
            (old["metadata"].get(*k) != Some(v)).then(|| match v {
                Value::String(s) => FieldError::invalid(field, s, "field is immutable"),
                other => FieldError::invalid_raw(field, other, "field is immutable"),
            })
        })
        .collect()
}

/// The writer `metadata.managedFields` records, if the write names a manager.
fn writer<'a>(
    r: &Resource,
    api_version: &'a str,
    sub: Option<Subresource>,
    opts: &'a WriteOptions,
) -> Option<fieldmanager::Writer<'a>> {
    Some(fieldmanager::Writer {
        manager: opts.field_manager.as_deref()?,
        api_version,
        subresource: sub.map_or("", Subresource::name),
        has_status: r.info().subresources.contains(&Subresource::Status),
    })
}

/// The managed fields a write starts from (upstream `decodeLiveOrNew`): those the request sets
/// itself (`[]` or `[{}]` clears them), else the stored ones; a subresource always the stored ones.
fn base_fields(old: &Value, requested: Option<&Value>, sub: Option<Subresource>) -> Vec<fieldmanager::Entry> {
    let stored = old["metadata"].get("managedFields");
    let Some(requested) = requested.filter(|_| sub.is_none()) else { return fieldmanager::decode(stored) };
    match requested.as_array().map(Vec::as_slice) {
        Some([]) => Vec::new(),
        Some([only]) if only.as_object().is_some_and(Map::is_empty) => Vec::new(),
        _ => match fieldmanager::decode(Some(requested)) {
            entries if entries.is_empty() => fieldmanager::decode(stored),
            entries => entries,
        },
    }
}

/// Records the write of `new` (over `old`, `None` for a create) in its `metadata.managedFields`
/// (upstream's field manager): an update by `opts.field_manager`, or the apply of `applied`.
fn manage_fields(
    r: &Resource,
    old: Option<&Value>,
    new: &mut Value,
    sub: Option<Subresource>,
    opts: &WriteOptions,
    mut entries: Vec<fieldmanager::Entry>,
    applied: Option<&Applied>,
) -> Result<()> {
    let schema = fieldmanager::Schema::new(r.merge_keys());
    // Admission may have copied the stored ones back (a status update starts from the stored object).
    strategy::meta_mut(new).remove("managedFields");
    let cmp = schema.compare(old.unwrap_or(&json!({})), new);
    let api_version = r.info().api_version();
    let now = timestamp(Utc::now());
    match (writer(r, &api_version, sub, opts), applied) {
        (Some(w), Some(a)) => fieldmanager::apply(&mut entries, &cmp, &a.fields, &w, a.force, &now)?,
        (Some(w), None) => fieldmanager::update(&mut entries, cmp, &w, &now),
        (None, _) => fieldmanager::forget_removed(&mut entries, &cmp),
    }
    if !entries.is_empty() {
        strategy::meta_mut(new).insert("managedFields".into(), fieldmanager::encode(&mut entries));
    }
    Ok(())
}

/// Sets the fields the server owns on create.
fn reset_server_meta(meta: &mut Map<String, Value>, generation: bool) {
    for k in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"] {
        meta.remove(k);
    }
    meta.insert("uid".into(), Value::String(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), Value::String(timestamp(Utc::now())));
    if generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
}

/// Copies the fields a client may not change on update from the stored object.
fn keep_server_meta(new: &mut Value, old: &Value, generation: bool) {
    let old_meta = old.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let meta = strategy::meta_mut(new);
    for k in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "name"] {
        match old_meta.get(k) {
            Some(v) => meta.insert(k.into(), v.clone()),
            None => meta.remove(k),
        };
    }
    if generation {
        if let Some(g) = old_meta.get("generation") {
            meta.insert("generation".into(), g.clone());
        }
    } else {
        meta.remove("generation");
    }
    match old_meta.get("resourceVersion") {
        Some(v) => meta.insert("resourceVersion".into(), v.clone()),
        None => meta.remove("resourceVersion"),
    };
    meta.remove("managedFields");
    meta.remove("selfLink");
}

/// A status update may not change metadata beyond what the server manages (`ResetObjectMetaForStatus`).
fn reset_meta_for_status(new: &mut Value, old: &Value, keep_annotations: bool) {
    let old_meta = old.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let meta = strategy::meta_mut(new);
    for k in ["labels", "annotations", "finalizers", "ownerReferences", "generation"] {
        if keep_annotations && k == "annotations" {
            continue;
        }
        match old_meta.get(k) {
            Some(v) => meta.insert(k.into(), v.clone()),
            None => meta.remove(k),
        };
    }
}

/// Adds the finalizer a propagation policy asks for.
fn add_propagation_finalizer(meta: &mut Map<String, Value>, policy: Option<&str>) -> Result<()> {
    let finalizer = match policy {
        None | Some("") | Some("Background") => return Ok(()),
        Some("Orphan") => "orphan",
        Some("Foreground") => "foregroundDeletion",
        Some(other) => {
            return Err(StatusError::invalid(
                "DeleteOptions",
                "",
                "",
                &[FieldError::not_supported("propagationPolicy", other, &["Foreground", "Background", "Orphan"])],
            ));
        }
    };
    let list = meta.entry("finalizers").or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(items) = list
        && !items.iter().any(|f| f == finalizer)
    {
        items.push(Value::String(finalizer.into()));
    }
    Ok(())
}

pub fn is_terminating(obj: &Value) -> bool {
    obj["metadata"].get("deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn has_finalizers(obj: &Value) -> bool {
    obj["metadata"].get("finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty())
}

/// Whether a terminating object's grace period is zero (nobody else must finish its deletion).
fn grace_elapsed(obj: &Value) -> bool {
    obj["metadata"].get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0) == 0
}

/// Validation every object gets (`ValidateObjectMeta`).
fn validate_meta(r: &Resource, obj: &Value, create: bool) -> ErrorList {
    let mut errs = Vec::new();
    let meta = &obj["metadata"];
    let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        if create {
            errs.push(FieldError::required("metadata.name", "name or generateName is required"));
        }
    } else {
        for e in r.name_rule().errors(name) {
            errs.push(FieldError::invalid("metadata.name", name, e));
        }
    }
    if r.info().namespaced {
        let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or_default();
        for e in validation::is_dns1123_label(ns) {
            errs.push(FieldError::invalid("metadata.namespace", ns, e));
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        let pairs: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect();
        errs.extend(validation::validate_labels(pairs.iter().map(|(k, v)| (k, v)), "metadata.labels"));
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (k, v) in annotations {
            total += k.len() + v.as_str().map_or(0, str::len);
            for e in validation::is_qualified_name(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", k, e));
            }
        }
        if total > ANNOTATIONS_MAX_BYTES {
            errs.push(FieldError::too_long("metadata.annotations", ANNOTATIONS_MAX_BYTES));
        }
    }
    if let Some(finalizers) = meta.get("finalizers").and_then(Value::as_array) {
        for (i, f) in finalizers.iter().enumerate() {
            let f = f.as_str().unwrap_or_default();
            for e in validation::is_qualified_name(f) {
                errs.push(FieldError::invalid(validation::index("metadata.finalizers", i), f, e));
            }
        }
        let orphan = finalizers.iter().any(|f| f == "orphan");
        let foreground = finalizers.iter().any(|f| f == "foregroundDeletion");
        if orphan && foreground {
            errs.push(FieldError::invalid(
                "metadata.finalizers",
                "foregroundDeletion",
                "finalizer foregroundDeletion and orphan cannot be both set",
            ));
        }
    }
    if let Some(owners) = meta.get("ownerReferences").and_then(Value::as_array) {
        for (i, o) in owners.iter().enumerate() {
            let path = validation::index("metadata.ownerReferences", i);
            for f in ["apiVersion", "kind", "name", "uid"] {
                if o.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                    errs.push(FieldError::invalid(validation::child(&path, f), "", format!("{f} must not be empty")));
                }
            }
        }
    }
    errs
}

/// `ValidateObjectMetaUpdate`: what must not change.
fn validate_meta_update(new: &Value, old: &Value) -> ErrorList {
    let mut errs = Vec::new();
    // Finalizers may not be added to an object that is being deleted.
    if is_terminating(old) {
        let olds: Vec<&Value> =
            old["metadata"].get("finalizers").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
        if let Some(news) = new["metadata"].get("finalizers").and_then(Value::as_array) {
            for f in news {
                if !olds.contains(&f) {
                    errs.push(FieldError::forbidden(
                        "metadata.finalizers",
                        format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {f}"
                        ),
                    ));
                }
            }
        }
    }
    errs
}

fn encode_continue(rv: u64, key: &str, prefix: &str) -> String {
    let start = key.strip_prefix(prefix).unwrap_or(key);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

/// Decodes a continue token into the store key to resume after.
fn decode_continue(token: &str, prefix: &str) -> Result<String> {
    let bad = || StatusError::bad_request("continue key is not valid: the token is malformed; re-list without it");
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if v.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad());
    }
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    if start.contains("..") {
        return Err(bad());
    }
    Ok(format!("{prefix}{start}"))
}

/// A registry on a store in a fresh temporary directory.
#[cfg(test)]
pub fn store_for_tests() -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = store::Options { cache_bytes: 1 << 20, history: 1000, ..Default::default() };
    let store = Store::open(dir.path(), options).expect("store");
    (dir, Registry::new(store))
}

#[cfg(test)]
mod tests;
