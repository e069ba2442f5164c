//! Watch: the store's event stream narrowed to one resource, namespace and selector.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::selector::{FieldSelector, LabelSelector};
use super::{Registry, Resource, Result, StatusError, matches, parse_stored};
use crate::store::{self, EventType, Object, Store, Subscription};

/// What a client asked of a watch.
#[derive(Debug, Default)]
pub struct WatchOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `resourceVersion`: unset or "0" starts with the current state as ADDED events.
    pub resource_version: Option<String>,
    /// `sendInitialEvents=true`: the current state first, then a bookmark marking its end.
    pub send_initial_events: bool,
}

/// One item of a watch stream, objects already in the resource's representation.
#[derive(Debug)]
pub enum WatchItem {
    Added(Bytes),
    Modified(Bytes),
    Deleted(Bytes),
    /// Progress marker; `initial_end` marks the end of the initial events.
    Bookmark {
        revision: u64,
        initial_end: bool,
    },
}

impl WatchItem {
    /// The event type on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            WatchItem::Added(_) => "ADDED",
            WatchItem::Modified(_) => "MODIFIED",
            WatchItem::Deleted(_) => "DELETED",
            WatchItem::Bookmark { .. } => "BOOKMARK",
        }
    }
}

/// A running watch.
pub struct Watch {
    resource: Resource,
    prefix: String,
    labels: LabelSelector,
    fields: FieldSelector,
    initial: VecDeque<Arc<Object>>,
    /// Revision of the initial snapshot, announced by a bookmark once it has been sent.
    initial_end: Option<u64>,
    sub: Subscription,
}

impl Watch {
    pub(super) fn start(store: &Store, resource: Resource, prefix: String, opts: WatchOptions) -> Result<Self> {
        let from = match opts.resource_version.as_deref() {
            None | Some("") | Some("0") => None,
            Some(s) => Some(
                s.parse::<u64>().map_err(|_| StatusError::bad_request(format!("invalid resource version: {s:?}")))?,
            ),
        };
        let (initial, initial_end, sub) = match from {
            Some(rv) if !opts.send_initial_events => {
                let sub = store.watch(rv).map_err(|e| match e {
                    store::Error::TooOld { requested, oldest } => {
                        StatusError::gone(format!("too old resource version: {requested} ({oldest})"))
                    }
                    other => StatusError::internal(other),
                })?;
                (VecDeque::new(), None, sub)
            }
            _ => {
                let (listing, sub) = store.list_and_watch(&prefix);
                let items = listing.items.into_iter().map(|(_, o)| o).collect();
                (items, opts.send_initial_events.then_some(listing.revision), sub)
            }
        };
        Ok(Self { resource, prefix, labels: opts.labels, fields: opts.fields, initial, initial_end, sub })
    }

    fn filtering(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    fn passes(&self, obj: &Object) -> Result<bool> {
        if !self.filtering() {
            return Ok(true);
        }
        let v: Value = self.resource.decode_stored(parse_stored(obj)?)?;
        Ok(matches(&self.resource, &v, &self.labels, &self.fields))
    }

    /// The newest revision this watch has fully observed, for bookmarks.
    pub fn revision(&self) -> u64 {
        self.sub.last_revision()
    }

    /// The next event for this watch. Fails with 410 Gone when the watcher fell behind.
    pub async fn next(&mut self) -> Result<WatchItem> {
        while let Some(obj) = self.initial.pop_front() {
            if self.passes(&obj)? {
                return Ok(WatchItem::Added(Registry::present(&self.resource, &obj)?));
            }
        }
        if let Some(revision) = self.initial_end.take() {
            return Ok(WatchItem::Bookmark { revision, initial_end: true });
        }
        loop {
            let event = self.sub.next().await.map_err(|e| match e {
                store::Error::TooOld { .. } => {
                    StatusError::gone("the watch fell too far behind; restart it from a fresh list")
                }
                other => StatusError::internal(other),
            })?;
            if !event.key.starts_with(&self.prefix) {
                continue;
            }
            let now = self.passes(&event.object)?;
            let before = match &event.prev {
                Some(p) if event.kind == EventType::Modified => self.passes(p)?,
                _ => false,
            };
            let present = || Registry::present(&self.resource, &event.object);
            let item = match (event.kind, before, now) {
                (EventType::Added, _, true) => WatchItem::Added(present()?),
                (EventType::Modified, true, true) => WatchItem::Modified(present()?),
                (EventType::Modified, false, true) => WatchItem::Added(present()?),
                (EventType::Modified, true, false) => WatchItem::Deleted(present()?),
                (EventType::Deleted, _, true) => WatchItem::Deleted(present()?),
                _ => continue,
            };
            return Ok(item);
        }
    }
}
