//! Lease-based leader election, as client-go's `tools/leaderelection` with a `LeaseLock`: the
//! scheduler and the controllers of several servers on one datastore run on one server at a time.
//!
//! Written here because kube-rs has none, and the rules below must be upstream's exactly, since
//! they are what make two holders impossible:
//! - a candidate takes the Lease only when it is free or its record has not changed for
//!   `leaseDurationSeconds`, measured on the candidate's own clock from when it saw the record
//!   change (client-go's `observedTime`: clocks of different machines are never compared);
//! - every take and renewal is an update carrying the resourceVersion it read, so of two candidates
//!   racing for the same record one fails (the fencing);
//! - the holder renews every retry period and gives up, stopping what it runs, when it could not
//!   renew for the renew deadline (10 s), before anyone else may take over (15 s).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt as _};
use rand::Rng as _;
use tokio_util::sync::CancellationToken;

use crate::events::{EventType, ObjectRef, Recorder};

/// Upstream's defaults (`--leader-elect-lease-duration`, `-renew-deadline`, `-retry-period`).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Waits between attempts to take the Lease are up to this much longer than the retry period, so
/// candidates spread out (client-go's `JitterFactor` is 1.2; a candidate here also wakes when the
/// Lease it saw runs out, instead of up to 4.4 s later, so a dead leader is replaced sooner).
const JITTER: f64 = 0.2;
/// Woken this long after a Lease's expiry, so that it has surely run out.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

/// One election: a Lease in `kube-system` and who this candidate is.
#[derive(Debug, Clone)]
pub struct Election {
    pub name: String,
    pub namespace: String,
    /// `holderIdentity` while this process leads (upstream: `<hostname>_<uuid>`).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Election {
    /// The election of `name` in `kube-system` with upstream's timings.
    pub fn new(name: &str, host: &str) -> Self {
        Election {
            name: name.into(),
            namespace: "kube-system".into(),
            identity: format!("{host}_{}", uuid::Uuid::new_v4()),
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
        }
    }
}

/// Runs `lead` each time this process becomes the leader, until `shutdown`. `lead` gets a token
/// that is cancelled when leadership is lost (or at shutdown): what it starts must stop with it.
/// At shutdown a held Lease is released, so another server takes over at once.
pub async fn run(
    client: Client,
    election: Election,
    shutdown: CancellationToken,
    mut lead: impl FnMut(CancellationToken),
) {
    let recorder = Recorder::spawn(client.clone(), election.name.clone(), String::new());
    let mut elector =
        Elector { api: Api::namespaced(client, &election.namespace), election, observed: None, expires: None };
    let who = format!("{}/{}", elector.election.namespace, elector.election.name);
    loop {
        tracing::info!("attempting to acquire leader lease {who}");
        loop {
            if elector.try_acquire_or_renew().await {
                break;
            }
            let mut wait = elector.election.retry_period.mul_f64(1.0 + rand::rng().random_range(0.0..JITTER));
            if let Some(expires) = elector.expires {
                wait = wait.min(expires.saturating_duration_since(Instant::now()) + EXPIRY_MARGIN);
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            }
        }
        tracing::info!("successfully acquired lease {who}: {} leads", elector.election.identity);
        if let Some(lease) = elector.observed.as_ref().map(|(lease, _)| lease) {
            let message = format!("{} became leader", elector.election.identity);
            recorder.record(ObjectRef::of(lease), EventType::Normal, "LeaderElection", "", message);
        }
        let term = shutdown.child_token();
        lead(term.clone());
        let lost = elector.renew_until_lost(&shutdown).await;
        term.cancel();
        if !lost {
            elector.release().await;
            return;
        }
        tracing::error!("failed to renew lease {who}: timed out; leaderelection lost, stopping what it ran");
    }
}

struct Elector {
    api: Api<Lease>,
    election: Election,
    /// The last record read or written, and when (this process's clock) it was first seen so.
    observed: Option<(Lease, Instant)>,
    /// When another holder's Lease runs out unless it is renewed (this process's clock).
    expires: Option<Instant>,
}

impl Elector {
    /// Renews every retry period; returns `true` once renewing failed for the renew deadline, or
    /// `false` at shutdown.
    async fn renew_until_lost(&mut self, shutdown: &CancellationToken) -> bool {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.election.retry_period) => {}
                () = shutdown.cancelled() => return false,
            }
            let attempt = tokio::time::timeout(self.election.renew_deadline, self.try_acquire_or_renew());
            if attempt.await.unwrap_or(false) {
                renewed = Instant::now();
            } else if renewed.elapsed() >= self.election.renew_deadline {
                return true;
            }
        }
    }

    fn holder(lease: &Lease) -> Option<&str> {
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty())
    }

    /// client-go's `tryAcquireOrRenew`: `true` when this process holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let now = MicroTime(Timestamp::now());
        let e = &self.election;
        let current = match self.api.get_opt(&e.name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(e.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(e.identity.clone()),
                        lease_duration_seconds: Some(e.lease_duration.as_secs() as i32),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.observed = Some((created, Instant::now()));
                        true
                    }
                    Err(why) => {
                        tracing::debug!("creating lease {}/{}: {why}", e.namespace, e.name);
                        false
                    }
                };
            }
            Err(why) => {
                tracing::warn!("error retrieving resource lock {}/{}: {why}", e.namespace, e.name);
                return false;
            }
        };
        // A record that changed restarts the clock: its holder is alive.
        let seen_before = self.observed.as_ref().is_some_and(|(lease, _)| lease.spec == current.spec);
        if !seen_before {
            self.observed = Some((current.clone(), Instant::now()));
        }
        let holder = Self::holder(&current).map(str::to_string);
        let mine = holder.as_deref() == Some(e.identity.as_str());
        let since = self.observed.as_ref().map_or_else(Instant::now, |(_, at)| *at);
        let duration = current
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(e.lease_duration, |s| Duration::from_secs(s.max(0) as u64));
        if holder.is_some() && !mine && since.elapsed() < duration {
            self.expires = Some(since + duration);
            return false;
        }
        self.expires = None;
        let old = current.spec.clone().unwrap_or_default();
        let spec = LeaseSpec {
            holder_identity: Some(e.identity.clone()),
            lease_duration_seconds: Some(e.lease_duration.as_secs() as i32),
            acquire_time: if mine { old.acquire_time } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(old.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..old
        };
        let mut next = current;
        next.spec = Some(spec);
        // Carries the resourceVersion read above: a concurrent writer makes this a conflict.
        match self.api.replace(&e.name, &PostParams::default(), &next).await {
            Ok(written) => {
                self.observed = Some((written, Instant::now()));
                true
            }
            Err(why) => {
                tracing::debug!("updating lease {}/{}: {why}", e.namespace, e.name);
                false
            }
        }
    }

    /// client-go's `release` (`ReleaseOnCancel`): the Lease is left free, so the next candidate
    /// need not wait out its duration.
    async fn release(&mut self) {
        let Some((mut lease, _)) = self.observed.take() else { return };
        if Self::holder(&lease) != Some(self.election.identity.as_str()) {
            return;
        }
        let now = MicroTime(Timestamp::now());
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
        }
        match self.api.replace(&lease.name_any(), &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!("released lease {}/{}", self.election.namespace, self.election.name),
            Err(why) => tracing::warn!("releasing lease {}/{}: {why}", self.election.namespace, self.election.name),
        }
    }
}
