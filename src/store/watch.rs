//! The watch hub: a bounded history of committed events plus a live broadcast.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::broadcast;

use super::{Error, Object, Result};

/// Capacity of the live channel. A watcher that falls further behind catches up from the history,
/// and is ended with [`Error::TooOld`] only when the history no longer reaches back to it.
pub(super) const LIVE_CAPACITY: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: Arc<str>,
    /// The new object, or for a delete its final state (carrying the deletion revision).
    pub object: Arc<Object>,
    /// The object before this change, if it existed.
    pub prev: Option<Arc<Object>>,
}

type Live = broadcast::Receiver<Arc<Event>>;

struct HubState {
    history: VecDeque<Arc<Event>>,
    capacity: usize,
    /// Bytes of the objects the history holds, and the bound on them.
    bytes: usize,
    max_bytes: usize,
    /// Every event with a revision above this one is in `history`.
    complete_after: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

pub(super) struct Hub {
    state: Mutex<HubState>,
}

impl Hub {
    pub(super) fn new(revision: u64, capacity: usize, max_bytes: usize) -> Self {
        let (tx, _) = broadcast::channel(LIVE_CAPACITY);
        Self {
            state: Mutex::new(HubState {
                history: VecDeque::with_capacity(capacity.min(1024)),
                capacity: capacity.max(1),
                bytes: 0,
                max_bytes,
                complete_after: revision,
                tx,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn publish(&self, events: Vec<Arc<Event>>) {
        let mut st = self.lock();
        for event in events {
            st.bytes += event.object.data.len();
            st.history.push_back(event.clone());
            while st.history.len() > st.capacity || (st.bytes > st.max_bytes && st.history.len() > 1) {
                let Some(old) = st.history.pop_front() else { break };
                st.bytes -= old.object.data.len();
                st.complete_after = old.rv;
            }
            // No receivers is fine.
            let _ = st.tx.send(event);
        }
    }

    /// Forgets the history (the index was loaded again at `revision`) and ends every subscription:
    /// their next call fails with [`Error::Closed`], and their clients re-list.
    pub(super) fn reset(&self, revision: u64) {
        let mut st = self.lock();
        st.history.clear();
        st.bytes = 0;
        st.complete_after = revision;
        st.tx = broadcast::channel(LIVE_CAPACITY).0;
    }

    /// Subscribes to events after `from`, replaying history first.
    pub(super) fn subscribe(self: &Arc<Self>, from: u64) -> Result<Subscription> {
        let (backlog, rx) = self.replay(from)?;
        Ok(Subscription { backlog, rx, last: from, at_last: 0, hub: Arc::downgrade(self) })
    }

    /// Subscribes to events from now on.
    pub(super) fn subscribe_now(self: &Arc<Self>) -> Subscription {
        let st = self.lock();
        Subscription { backlog: VecDeque::new(), rx: st.tx.subscribe(), last: 0, at_last: 0, hub: Arc::downgrade(self) }
    }

    /// The history after `from` and a live receiver taken under one lock, so that together they
    /// miss nothing (the receiver may repeat what the history holds; revisions tell them apart).
    fn replay(&self, from: u64) -> Result<(VecDeque<Arc<Event>>, Live)> {
        let st = self.lock();
        if from < st.complete_after {
            return Err(Error::TooOld { requested: from, oldest: st.complete_after });
        }
        let backlog = st.history.iter().filter(|e| e.rv > from).cloned().collect();
        Ok((backlog, st.tx.subscribe()))
    }
}

/// A stream of committed events in revision order, without gaps or duplicates.
pub struct Subscription {
    backlog: VecDeque<Arc<Event>>,
    rx: Live,
    last: u64,
    /// How many events of revision `last` were delivered: one etcd revision may hold several (the
    /// keys of an expired lease go together). 0 when `last` is a snapshot's or a start point, which
    /// covers all of them.
    at_last: usize,
    /// Where a subscriber that lagged behind the live channel catches up. Weak, so that the store
    /// closing still ends every subscription.
    hub: Weak<Hub>,
}

impl Subscription {
    /// Skips events up to and including `rv` (they are already reflected in a snapshot).
    pub fn skip_through(&mut self, rv: u64) {
        if rv >= self.last {
            self.last = rv;
            self.at_last = 0;
        }
        self.backlog.retain(|e| e.rv > rv);
    }

    /// The revision of the last event delivered (or skipped).
    pub fn last_revision(&self) -> u64 {
        self.last
    }

    /// The next event. Fails with [`Error::TooOld`] when this subscriber fell so far behind that the
    /// history no longer holds the events it missed, and with [`Error::Closed`] when the store is gone.
    pub async fn next(&mut self) -> Result<Arc<Event>> {
        loop {
            let event = match self.backlog.pop_front() {
                Some(e) => e,
                None => match self.rx.recv().await {
                    Ok(e) => e,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let hub = self.hub.upgrade().ok_or(Error::Closed)?;
                        // From the start of the revision last delivered in part, without what of it
                        // was delivered already (a revision's events keep their order).
                        let partial = self.at_last > 0;
                        (self.backlog, self.rx) = hub.replay(self.last - u64::from(partial))?;
                        let (last, mut delivered) = (self.last, if partial { self.at_last } else { 0 });
                        self.backlog.retain(|e| match e.rv == last && delivered > 0 {
                            true => {
                                delivered -= 1;
                                false
                            }
                            false => true,
                        });
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Err(Error::Closed),
                },
            };
            if event.rv > self.last {
                self.last = event.rv;
                self.at_last = 1;
                return Ok(event);
            }
            if event.rv == self.last && self.at_last > 0 {
                self.at_last += 1;
                return Ok(event);
            }
        }
    }
}
