//! The etcd v3 backend (`--datastore-endpoint`, k3s's flag): objects under `/registry/<key>`, as
//! kube-apiserver lays them out, JSON without their resourceVersion (etcd's mod revision is it).
//!
//! A write is one transaction whose compare is the precondition (absent: create revision 0; a
//! revision: that mod revision); it is acknowledged once etcd committed it and the index shows it.
//! The index is fed by one etcd watch of the prefix from the revision it was loaded at, so writes of
//! other servers on the same etcd appear too, in revision order, with nothing missed or repeated.
//! Should the watch fall behind etcd's compaction, the index is loaded again and every subscription
//! ends, so clients re-list, as after a 410. Old revisions are compacted every five minutes by
//! whichever server wins the round (kube-apiserver's compactor and its `compact_rev_key`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType as EtcdEvent, GetOptions, Identity, KeyValue,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde_json::Value;
use tokio::sync::watch;

use super::{Backend, Error, Event, EventType, Inner, Object, Op, Options, Precondition, Result, State, Store};

/// Where kube-apiserver keeps objects.
pub const DEFAULT_PREFIX: &str = "/registry/";
/// Longest wait for etcd to answer one request (kube-apiserver's storage request timeout is of this
/// order; a request past it answers 504).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys read per request while loading.
const PAGE: i64 = 1000;
/// How often old revisions are compacted (kube-apiserver's `--etcd-compaction-interval`).
const COMPACTION_INTERVAL: Duration = Duration::from_secs(300);
/// The key the servers of one etcd agree on compaction rounds through.
const COMPACT_REV_KEY: &str = "compact_rev_key";
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long one lease serves the writes of an expiring prefix at most (kube-apiserver's
/// `leaseReuseDurationSeconds`).
const LEASE_REUSE: Duration = Duration::from_secs(60);

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct Config {
    /// `http://` or `https://` URLs of the members.
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub prefix: String,
}

impl Config {
    /// `--datastore-endpoint`'s comma-separated URLs, checked.
    pub fn parse_endpoints(value: &str) -> Result<Vec<String>, String> {
        let endpoints: Vec<String> =
            value.split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from).collect();
        if endpoints.is_empty() {
            return Err("no etcd endpoint given".into());
        }
        for e in &endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(format!("{e:?} is not an etcd endpoint: give http://HOST:PORT or https://HOST:PORT"));
            }
        }
        Ok(endpoints)
    }

    fn describe(&self) -> String {
        self.endpoints.join(",")
    }
}

/// The etcd side of a [`Store`].
pub(super) struct Etcd {
    members: Arc<Members>,
    config: Config,
    /// The newest revision the index shows.
    applied: watch::Sender<u64>,
    /// Objects this server wrote, by key and revision, until the watch brings their events: they
    /// are used as they are instead of being decoded again.
    written: Mutex<HashMap<(String, u64), Arc<Object>>>,
    /// Key prefixes that expire, with their time to live, and the lease each currently uses.
    expiring: Vec<(String, Duration)>,
    leases: tokio::sync::Mutex<HashMap<String, (i64, tokio::time::Instant)>>,
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// etcd's members, used one at a time: a member that cannot be reached is left for the next, as
/// clientv3 switches endpoints (a balanced channel would keep sending to a dead member).
struct Members {
    config: Config,
    options: ConnectOptions,
    /// The member in use, and its connection once made.
    current: Mutex<(usize, Option<Client>)>,
}

/// Whether etcd could not be reached at all, and whether the request surely never got there.
fn unreachable(e: &etcd_client::Error) -> Option<bool> {
    match e {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            Some(status.message().contains("connect"))
        }
        etcd_client::Error::TransportError(_) => Some(true),
        _ => None,
    }
}

impl Members {
    fn new(config: &Config) -> Result<Self> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if config.endpoints.iter().any(|e| e.starts_with("https://")) {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|e| Error::Unavailable {
                    endpoint: config.describe(),
                    why: format!("reading {}: {e}", path.display()),
                })
            };
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(tls);
        }
        Ok(Members { config: config.clone(), options, current: Mutex::new((0, None)) })
    }

    /// Puts `value` at `key` unless the key exists; returns what the key holds afterwards. Safe to
    /// repeat: a create whose answer was lost finds its own value.
    async fn create_if_absent(&self, key: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .run(true, |client| {
                let txn = txn.clone();
                async move { client.kv_client().txn(txn).await }
            })
            .await?;
        let held = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        Ok(held.unwrap_or(value))
    }

    /// The member in use and its client.
    async fn client(&self) -> Result<(usize, Client)> {
        let (index, client) = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(client) = client {
            return Ok((index, client));
        }
        let endpoint = &self.config.endpoints[index];
        let client = Client::connect([endpoint], Some(self.options.clone()))
            .await
            .map_err(|e| Error::Unavailable { endpoint: endpoint.clone(), why: e.to_string() })?;
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 == index {
            current.1 = Some(client.clone());
        }
        Ok((index, client))
    }

    /// Leaves member `index` for the next one.
    fn failed(&self, index: usize) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 == index {
            let next = (index + 1) % self.config.endpoints.len();
            if self.config.endpoints.len() > 1 {
                tracing::debug!(
                    "etcd member {} cannot be reached: trying {}",
                    self.config.endpoints[index],
                    self.config.endpoints[next]
                );
            }
            *current = (next, None);
        }
    }

    /// Runs `request` on the member in use, moving on to the next member when one cannot be
    /// reached: always for reads (`idempotent`), for writes only when the request surely never
    /// left (a write that may have been applied is not sent twice). At most [`REQUEST_TIMEOUT`].
    async fn run<T, F, Fut>(&self, idempotent: bool, mut request: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let mut last = None;
        for _ in 0..self.config.endpoints.len() * 3 {
            let (index, client) = match self.client().await {
                Ok(c) => c,
                Err(e) => {
                    let index = self.current.lock().unwrap_or_else(|e| e.into_inner()).0;
                    self.failed(index);
                    last = Some(e);
                    continue;
                }
            };
            match tokio::time::timeout_at(deadline, request(client)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => {
                    let error =
                        Error::Unavailable { endpoint: self.config.endpoints[index].clone(), why: e.to_string() };
                    match unreachable(&e) {
                        Some(not_sent) => {
                            self.failed(index);
                            if !(idempotent || not_sent) {
                                return Err(error);
                            }
                            last = Some(error);
                        }
                        None => return Err(error),
                    }
                }
                Err(_) => {
                    self.failed(index);
                    return Err(Error::Timeout { endpoint: self.config.describe() });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        Err(last.unwrap_or(Error::Timeout { endpoint: self.config.describe() }))
    }
}

/// An object as the index holds it: the stored JSON with `metadata.resourceVersion` set to `rv`.
fn stamped(mut value: Value, rv: u64) -> Result<Arc<Object>> {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    Ok(Arc::new(Object { rv, data: Bytes::from(serde_json::to_vec(&value)?) }))
}

fn decode(key: &str, bytes: &[u8], rv: u64) -> Result<Arc<Object>> {
    let value = serde_json::from_slice(bytes).map_err(|source| Error::Corrupt { key: key.into(), source })?;
    stamped(value, rv)
}

/// Every object under the prefix at one revision, and that revision.
async fn load(members: &Members) -> Result<(BTreeMap<String, Arc<Object>>, u64)> {
    let config = &members.config;
    let end = prefix_end(&config.prefix);
    let mut objects = BTreeMap::new();
    let mut from = config.prefix.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let key = from.clone();
        let resp = members
            .run(true, |client| {
                let (key, options) = (key.clone(), options.clone());
                async move { client.kv_client().get(key, Some(options)).await }
            })
            .await?;
        if revision == 0 {
            revision = resp.header().map_or(0, |h| h.revision());
        }
        for kv in resp.kvs() {
            if let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(&config.prefix)) {
                objects.insert(key.to_string(), decode(key, kv.value(), kv.mod_revision() as u64)?);
            }
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((objects, revision as u64))
}

/// Connects (retrying, with the endpoint and the reason in the log, until etcd answers), loads the
/// objects and starts following etcd's watch and compacting.
pub(super) async fn open(config: Config, options: Options) -> Result<Store> {
    let members = Arc::new(Members::new(&config)?);
    let mut backoff = Duration::from_secs(1);
    let (objects, revision) = loop {
        match load(&members).await {
            Ok(ready) => break ready,
            Err(e @ Error::Corrupt { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!("{e}; trying again in {}s", backoff.as_secs());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    };
    tracing::info!("etcd at {} holds {} objects at revision {revision}", config.describe(), objects.len());
    let state = State { objects, revision, ..Default::default() };
    let (applied, _) = watch::channel(revision);
    let etcd = Etcd {
        members: members.clone(),
        config: config.clone(),
        applied,
        written: Mutex::new(HashMap::new()),
        expiring: options.expiring.clone(),
        leases: tokio::sync::Mutex::new(HashMap::new()),
    };
    let store = Store::with(state, &options, Backend::Etcd(Box::new(etcd)));
    tokio::spawn(follow(Arc::downgrade(&store.inner), members.clone(), revision));
    tokio::spawn(compact(Arc::downgrade(&store.inner), members));
    Ok(store)
}

impl Etcd {
    /// Stores `value` at `key` (outside the objects' prefix) unless something is there already;
    /// returns what is there afterwards.
    pub(super) async fn create_shared(&self, key: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        self.members.create_if_absent(key, value).await
    }

    /// A linearizable read of the key `health`, as kube-apiserver's etcd health check.
    pub(super) async fn health(&self) -> Result<()> {
        self.members.run(true, |mut client| async move { client.get("health", None).await }).await.map(drop)
    }

    /// The bytes at `key` (outside the objects' prefix), if any.
    pub(super) async fn get_shared(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let resp = self
            .members
            .run(true, |mut client| {
                let key = key.to_string();
                async move { client.get(key, None).await }
            })
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The lease a write to `key` is attached to, when its prefix expires: as kube-apiserver's
    /// lease manager, one lease serves the writes of a short while (5 % of the TTL, a minute at
    /// most; each key then lives the TTL plus up to that while), so a burst of events costs one
    /// grant instead of one each.
    async fn lease_for(&self, key: &str) -> Result<Option<i64>> {
        let Some((prefix, ttl)) = self.expiring.iter().find(|(prefix, _)| key.starts_with(prefix.as_str())) else {
            return Ok(None);
        };
        let reuse = (*ttl / 20).min(LEASE_REUSE);
        let mut leases = self.leases.lock().await;
        if let Some((id, granted)) = leases.get(prefix)
            && granted.elapsed() < reuse
        {
            return Ok(Some(*id));
        }
        let seconds = (*ttl + reuse).as_secs_f64().ceil() as i64;
        let lease = self.members.run(true, |mut client| async move { client.lease_grant(seconds, None).await }).await?;
        leases.insert(prefix.clone(), (lease.id(), tokio::time::Instant::now()));
        Ok(Some(lease.id()))
    }

    /// One write as a transaction; acknowledged once the index shows it.
    pub(super) async fn write(&self, inner: &Inner, key: String, pre: Precondition, op: Op) -> Result<Arc<Object>> {
        let etcd_key = format!("{}{key}", self.config.prefix);
        let compare = match pre {
            Precondition::Absent => Compare::create_revision(etcd_key.clone(), CompareOp::Equal, 0),
            Precondition::Revision(rv) => Compare::mod_revision(etcd_key.clone(), CompareOp::Equal, rv as i64),
        };
        let (mut value, then) = match op {
            Op::Put(mut value) => {
                if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                let bytes = serde_json::to_vec(&value)?;
                let options = self.lease_for(&key).await?.map(|lease| PutOptions::new().with_lease(lease));
                (value, TxnOp::put(etcd_key.clone(), bytes, options))
            }
            Op::Delete(value) => (value, TxnOp::delete(etcd_key.clone(), None)),
        };
        let txn = Txn::new().when([compare]).and_then([then]).or_else([TxnOp::get(etcd_key, None)]);
        let resp = self
            .members
            .run(false, |client| {
                let txn = txn.clone();
                async move { client.kv_client().txn(txn).await }
            })
            .await?;
        if !resp.succeeded() {
            let current = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::mod_revision),
                _ => None,
            });
            return Err(match (pre, current) {
                (Precondition::Absent, _) => Error::AlreadyExists,
                (Precondition::Revision(_), None) => Error::NotFound,
                (Precondition::Revision(_), Some(rv)) => Error::Conflict { current: rv as u64 },
            });
        }
        let rv = resp.header().map_or(0, |h| h.revision()) as u64;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        let object = stamped(value, rv)?;
        self.written.lock().unwrap_or_else(|e| e.into_inner()).insert((key, rv), object.clone());
        inner.flushes.fetch_add(1, Ordering::Relaxed);
        inner.committed.fetch_add(1, Ordering::Relaxed);
        let mut applied = self.applied.subscribe();
        match tokio::time::timeout(REQUEST_TIMEOUT, applied.wait_for(|a| *a >= rv)).await {
            Ok(Ok(_)) => Ok(object),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::Timeout { endpoint: self.config.describe() }),
        }
    }

    /// The object of a watched change: this server's own as it was written, another's decoded.
    fn object_of(&self, key: &str, bytes: &[u8], rv: u64) -> Result<Arc<Object>> {
        match self.written.lock().unwrap_or_else(|e| e.into_inner()).remove(&(key.to_string(), rv)) {
            Some(object) => Ok(object),
            None => decode(key, bytes, rv),
        }
    }
}

fn etcd_of(inner: &Inner) -> Option<&Etcd> {
    match &inner.backend {
        Backend::Etcd(etcd) => Some(etcd),
        Backend::Sled(..) => None,
    }
}

/// Follows etcd's watch of the prefix from `revision` into the index, for as long as the store is
/// open: reconnecting with backoff, and loading everything again when etcd compacted past it.
async fn follow(inner: Weak<Inner>, members: Arc<Members>, mut revision: u64) {
    let config = &members.config;
    let mut backoff = Duration::from_secs(1);
    loop {
        if inner.upgrade().is_none() {
            return;
        }
        let options = WatchOptions::new()
            .with_range(prefix_end(&config.prefix))
            .with_progress_notify()
            .with_start_revision(revision as i64 + 1);
        let mut member = members.current.lock().unwrap_or_else(|e| e.into_inner()).0;
        let watched = match members.client().await {
            Ok((index, client)) => {
                member = index;
                let mut watcher = client.watch_client();
                watcher.watch(config.prefix.clone(), Some(options)).await.map_err(|e| {
                    members.failed(index);
                    Error::Unavailable { endpoint: config.endpoints[index].clone(), why: e.to_string() }
                })
            }
            Err(e) => {
                members.failed(member);
                Err(e)
            }
        };
        let mut stream = match watched {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("watching etcd: {e}; trying again in {}s", backoff.as_secs());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("the watch of etcd at {} ended: {e}; watching again", config.endpoints[member]);
                    members.failed(member);
                    break;
                }
            };
            backoff = Duration::from_secs(1);
            let Some(inner) = inner.upgrade() else { return };
            if resp.compact_revision() > 0 {
                tracing::warn!(
                    "etcd compacted past revision {revision} before this server saw it: loading every object again"
                );
                match load(&members).await {
                    Ok((objects, loaded)) => {
                        reset(&inner, objects, loaded);
                        revision = loaded;
                    }
                    Err(e) => tracing::warn!("loading from etcd again: {e}"),
                }
                break;
            }
            if resp.canceled() {
                break;
            }
            match events(&inner, resp.events()) {
                Ok(events) => {
                    let last = events.last().map(|e| e.rv);
                    if let Some(last) = last {
                        revision = last;
                        super::apply(&inner, events, last);
                    }
                }
                Err(e) => tracing::error!("an object in etcd cannot be read: {e}"),
            }
            if let Some(etcd) = etcd_of(&inner) {
                let header = resp.header().map_or(0, |h| h.revision()) as u64;
                // A progress notification says nothing changed up to its revision. The answer that
                // creates the watch does not: its header is etcd's revision, whose events may follow.
                if resp.events().is_empty() && !resp.created() && header > revision {
                    revision = header;
                    inner.state.write().unwrap_or_else(|e| e.into_inner()).revision = header;
                }
                etcd.applied.send_replace(revision);
                etcd.written.lock().unwrap_or_else(|e| e.into_inner()).retain(|(_, rv), _| *rv > revision);
            }
        }
    }
}

/// The index's events for etcd's, in order.
fn events(inner: &Inner, changes: &[etcd_client::Event]) -> Result<Vec<Arc<Event>>> {
    let Some(etcd) = etcd_of(inner) else { return Ok(Vec::new()) };
    let prefix = etcd.config.prefix.as_str();
    let mut out: Vec<Arc<Event>> = Vec::with_capacity(changes.len());
    for change in changes {
        let Some(kv) = change.kv() else { continue };
        let Some(key) = kv.key_str().ok().and_then(|k| k.strip_prefix(prefix)) else { continue };
        let rv = kv.mod_revision() as u64;
        // Earlier events of this response come first, then the index.
        let prev = out.iter().rev().find(|e| e.key.as_ref() == key).map(|e| match e.kind {
            EventType::Deleted => None,
            _ => Some(e.object.clone()),
        });
        let prev =
            prev.unwrap_or_else(|| inner.state.read().unwrap_or_else(|e| e.into_inner()).objects.get(key).cloned());
        let event = match change.event_type() {
            EtcdEvent::Put => {
                let kind =
                    if kv.create_revision() == kv.mod_revision() { EventType::Added } else { EventType::Modified };
                Event { rv, kind, key: key.into(), object: etcd.object_of(key, kv.value(), rv)?, prev }
            }
            EtcdEvent::Delete => {
                // The final state: as this server wrote it, else the last value the index holds (the
                // watch carries no previous values: the index has them all), at the delete's revision.
                let written = etcd.written.lock().unwrap_or_else(|e| e.into_inner()).remove(&(key.to_string(), rv));
                let object = match (written, &prev) {
                    (Some(object), _) => object,
                    (None, Some(cached)) => decode(key, &cached.data, rv)?,
                    (None, None) => continue,
                };
                Event { rv, kind: EventType::Deleted, key: key.into(), object, prev }
            }
        };
        out.push(Arc::new(event));
    }
    Ok(out)
}

/// Replaces the index with a fresh load; every subscription ends (clients re-list).
fn reset(inner: &Inner, objects: BTreeMap<String, Arc<Object>>, revision: u64) {
    {
        let mut state = inner.state.write().unwrap_or_else(|e| e.into_inner());
        let resources: Vec<String> = objects
            .keys()
            .chain(state.objects.keys())
            .map(|key| key.split('/').next().unwrap_or_default().to_string())
            .collect();
        for resource in resources {
            state.last_writes.insert(resource, revision);
        }
        state.objects = objects;
        state.revision = revision;
    }
    inner.hub.reset(revision);
    if let Some(etcd) = etcd_of(inner) {
        etcd.applied.send_replace(revision);
    }
}

/// kube-apiserver's compactor: every interval, the server that wins the round on `compact_rev_key`
/// compacts etcd to the revision the previous round saw, so watches have an interval's history.
async fn compact(inner: Weak<Inner>, members: Arc<Members>) {
    let (mut version, mut previous) = (0i64, 0i64);
    loop {
        tokio::time::sleep(COMPACTION_INTERVAL).await;
        if inner.upgrade().is_none() {
            return;
        }
        let txn = Txn::new()
            .when([Compare::version(COMPACT_REV_KEY, CompareOp::Equal, version)])
            .and_then([TxnOp::put(COMPACT_REV_KEY, previous.to_string(), None)])
            .or_else([TxnOp::get(COMPACT_REV_KEY, None)]);
        let resp = match members
            .run(false, |client| {
                let txn = txn.clone();
                async move { client.kv_client().txn(txn).await }
            })
            .await
        {
            Ok(resp) => resp,
            Err(e) => {
                tracing::debug!("compaction round skipped: {e}");
                continue;
            }
        };
        let current = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            // Another server won this round: take its count and try the next.
            version = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::version),
                    _ => None,
                })
                .unwrap_or(0);
            previous = current;
            continue;
        }
        version += 1;
        if previous > 0 {
            match members.run(true, |client| async move { client.kv_client().compact(previous, None).await }).await {
                Ok(_) => tracing::debug!("compacted etcd to revision {previous}"),
                Err(e) => tracing::debug!("compacting etcd to revision {previous}: {e}"),
            }
        }
        previous = current;
    }
}

/// Copies every object of `from` into etcd under the prefix, keys in order, each created only if
/// absent; an etcd that already holds keys under the prefix is refused, so nothing is overwritten.
/// The objects' new resourceVersions are etcd's revisions. Returns how many were copied.
pub async fn migrate(from: &Store, to: &Config, mut progress: impl FnMut(usize, usize)) -> Result<usize> {
    let members = Members::new(to)?;
    let prefix = to.prefix.clone();
    let held = members
        .run(true, |mut client| {
            let (prefix, end) = (prefix.clone(), prefix_end(&prefix));
            async move { client.get(prefix, Some(GetOptions::new().with_range(end).with_count_only())).await }
        })
        .await?
        .count();
    if held > 0 {
        return Err(Error::NotEmpty {
            endpoint: to.describe(),
            why: format!("already holds {held} keys under {prefix}: migrate into an etcd cairn has not used"),
        });
    }
    let listing = from.list("", None);
    let total = listing.items.len();
    for (done, (key, object)) in listing.items.iter().enumerate() {
        let mut value: Value =
            serde_json::from_slice(&object.data).map_err(|source| Error::Corrupt { key: key.clone(), source })?;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        let etcd_key = format!("{prefix}{key}");
        let bytes = serde_json::to_vec(&value)?;
        if members.create_if_absent(&etcd_key, bytes.clone()).await? != bytes {
            return Err(Error::NotEmpty {
                endpoint: to.describe(),
                why: format!("had {key} written by someone else during the copy"),
            });
        }
        progress(done + 1, total);
    }
    Ok(total)
}
