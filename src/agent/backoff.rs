//! Per-key exponential backoff, as client-go's `flowcontrol.Backoff` that kubelet uses for container
//! restarts (CrashLoopBackOff) and image pulls (ImagePullBackOff): 10 s doubling to 300 s, forgotten
//! after twice the cap without a new failure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// Backoff per key (`<pod uid>/<container>` or `<pod uid>/<image>`).
#[derive(Debug, Default)]
pub struct Backoff {
    entries: HashMap<String, Entry>,
}

fn expired(event: Instant, last_update: Instant) -> bool {
    event.saturating_duration_since(last_update) > MAX * 2
}

impl Backoff {
    /// Records a retry of something that failed at `event`: the first (or the first after a long
    /// quiet spell) waits `INITIAL` from now, each further one twice as long, up to `MAX`.
    pub fn next(&mut self, key: &str, event: Instant, now: Instant) {
        match self.entries.get_mut(key) {
            Some(e) if !expired(event, e.last_update) => {
                e.backoff = (e.backoff * 2).min(MAX);
                e.last_update = now;
            }
            _ => {
                self.entries.insert(key.to_string(), Entry { backoff: INITIAL, last_update: now });
            }
        }
    }

    /// When something that happened at `event` (a container's exit) may be retried, if that is
    /// still in the future; `None` when no backoff applies.
    pub fn blocked_until(&self, key: &str, event: Instant, now: Instant) -> Option<Instant> {
        let e = self.entries.get(key)?;
        if expired(event, e.last_update) {
            return None;
        }
        let until = event + e.backoff;
        (now < until).then_some(until)
    }

    /// When `key` may be tried again, counting from its last failure (image pulls), if that is
    /// still in the future.
    pub fn blocked_since_update(&self, key: &str, now: Instant) -> Option<Instant> {
        let e = self.entries.get(key)?;
        let until = e.last_update + e.backoff;
        (!expired(now, e.last_update) && now < until).then_some(until)
    }

    /// The current delay for `key` (for messages such as "back-off 20s restarting failed container").
    pub fn delay(&self, key: &str) -> Duration {
        self.entries.get(key).map_or(INITIAL, |e| e.backoff)
    }

    /// Forgets every key starting with `prefix` (a pod's keys when it goes away).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }

    /// Drops entries nobody failed for twice the cap (keeps the map bounded).
    pub fn gc(&mut self, now: Instant) {
        self.entries.retain(|_, e| !expired(now, e.last_update));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_after_quiet() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        assert_eq!(b.blocked_until("k", t0, t0), None, "the first restart is immediate");
        b.next("k", t0, t0);
        assert_eq!(b.blocked_until("k", t0, t0 + Duration::from_secs(3)), Some(t0 + INITIAL));
        assert_eq!(b.blocked_until("k", t0, t0 + Duration::from_secs(11)), None);
        let mut t = t0;
        let mut seen = vec![];
        for _ in 0..7 {
            t += Duration::from_secs(1);
            b.next("k", t, t);
            seen.push(b.delay("k").as_secs());
        }
        assert_eq!(seen, [20, 40, 80, 160, 300, 300, 300]);
        // Ten quiet minutes: back to the start.
        let later = t + Duration::from_secs(601);
        assert_eq!(b.blocked_until("k", later, later), None);
        b.next("k", later, later);
        assert_eq!(b.delay("k"), INITIAL);
        assert_eq!(b.blocked_since_update("k", later), Some(later + INITIAL));
        assert_eq!(b.blocked_since_update("k", later + INITIAL), None);
        b.forget_prefix("k");
        assert_eq!(b.delay("k"), INITIAL);
        assert!(b.entries.is_empty());
    }
}
