//! Eviction signals and thresholds, as kubelet parses them (`pkg/kubelet/eviction/api` and
//! `ParseThresholdConfig`): `--eviction-hard memory.available<100Mi,nodefs.available<10%`,
//! `--eviction-soft` with `--eviction-soft-grace-period memory.available=1m30s`, and
//! `--eviction-minimum-reclaim nodefs.available=500Mi`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::registry::kinds::pod_rules::parse_quantity;

/// What the node measures to decide it is short of something.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    /// memory.available of the pods' share (node allocatable): added for each memory.available
    /// threshold, as kubelet does while it enforces node allocatable on pods.
    AllocatableMemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
    PidAvailable,
}

/// The node condition a signal drives: MemoryPressure, DiskPressure, PIDPressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    Memory,
    Disk,
    Pid,
}

impl Condition {
    pub fn name(self) -> &'static str {
        match self {
            Condition::Memory => "MemoryPressure",
            Condition::Disk => "DiskPressure",
            Condition::Pid => "PIDPressure",
        }
    }
}

impl Signal {
    const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Condition::Memory,
            Signal::PidAvailable => Condition::Pid,
            _ => Condition::Disk,
        }
    }

    /// The resource a pod is evicted to reclaim (what eviction messages name).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodefsAvailable | Signal::ImagefsAvailable => "ephemeral-storage",
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }
}

/// A threshold's amount: a quantity (bytes, inodes or PIDs) or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Quantity(i128),
    Percent(f64),
}

impl Amount {
    /// The amount as a quantity of `capacity`.
    pub fn of(self, capacity: i128) -> i128 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Percent(p) => (capacity as f64 * p / 100.0) as i128,
        }
    }

    /// Parses a threshold's value; `None` for `0%` and `100%`, which kubelet ignores.
    fn parse(signal: Signal, value: &str) -> Result<Option<Amount>, String> {
        let name = signal.name();
        if let Some(percent) = value.strip_suffix('%') {
            let p: f64 = percent.parse().map_err(|_| format!("invalid percentage {value:?} for {name}"))?;
            if p < 0.0 {
                return Err(format!("eviction percentage threshold {name} must be >= 0%: {value}"));
            }
            if p > 100.0 {
                return Err(format!("eviction percentage threshold {name} must be <= 100%: {value}"));
            }
            return Ok((p != 0.0 && p != 100.0).then_some(Amount::Percent(p)));
        }
        let milli = parse_quantity(value).ok_or_else(|| format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value:?} for {name}"))?;
        if milli <= 0 {
            return Err(format!("eviction threshold {name} must be positive: {value}"));
        }
        Ok(Some(Amount::Quantity((milli + 999) / 1000)))
    }
}

/// One threshold: the signal is short when what is available falls below `value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Amount,
    /// How long the signal must stay short first; zero for a hard threshold.
    pub grace: Duration,
    /// Reclaimed beyond the threshold once it is met (`--eviction-minimum-reclaim`).
    pub min_reclaim: Option<Amount>,
    pub hard: bool,
}

impl Threshold {
    /// The quantity below which a signal of `capacity` is short, minimum reclaim included when
    /// `with_reclaim`.
    pub fn floor(&self, capacity: i128, with_reclaim: bool) -> i128 {
        let reclaim = self.min_reclaim.filter(|_| with_reclaim).map_or(0, |r| r.of(capacity));
        self.value.of(capacity) + reclaim
    }
}

/// kubelet's default hard thresholds on Linux (`DefaultEvictionHard`).
pub const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%";

/// Parses `signal<value,...` (`--eviction-hard`, `--eviction-soft`).
fn parse_map(flag: &str, s: &str) -> Result<BTreeMap<Signal, Amount>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) =
            pair.split_once('<').ok_or_else(|| format!("{flag}: malformed pair, expect string<string"))?;
        let signal = known(flag, name)?;
        if let Some(amount) = Amount::parse(signal, value.trim()).map_err(|e| format!("{flag}: {e}"))? {
            out.insert(signal, amount);
        }
    }
    Ok(out)
}

/// Parses `signal=value,...` (`--eviction-soft-grace-period`, `--eviction-minimum-reclaim`).
fn parse_pairs(flag: &str, s: &str) -> Result<BTreeMap<Signal, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("{flag}: {pair:?} is not signal=value"))?;
        out.insert(known(flag, name)?, value.trim().to_string());
    }
    Ok(out)
}

fn known(flag: &str, name: &str) -> Result<Signal, String> {
    Signal::parse(name.trim())
        .filter(|s| *s != Signal::AllocatableMemoryAvailable)
        .ok_or_else(|| format!("{flag}: unsupported eviction signal {}", name.trim()))
}

/// The thresholds of the four flags, with an `allocatableMemory.available` threshold beside each
/// `memory.available` one (kubelet's `addAllocatableThresholds`).
pub fn parse(hard: &str, soft: &str, soft_grace: &str, min_reclaim: &str) -> Result<Vec<Threshold>, String> {
    let graces = parse_pairs("--eviction-soft-grace-period", soft_grace)?;
    let mut reclaims = BTreeMap::new();
    for (signal, value) in parse_pairs("--eviction-minimum-reclaim", min_reclaim)? {
        let name = signal.name();
        let amount = match value.strip_suffix('%') {
            Some(p) => match p.parse::<f64>() {
                Ok(p) if p > 0.0 => Amount::Percent(p),
                _ => return Err(format!("eviction percentage minimum reclaim {name} must be positive: {value}")),
            },
            None => match parse_quantity(&value) {
                Some(m) if m >= 0 => Amount::Quantity((m + 999) / 1000),
                Some(_) => return Err(format!("negative eviction minimum reclaim specified for {name}")),
                None => return Err(format!("--eviction-minimum-reclaim: {value:?} is not a quantity for {name}")),
            },
        };
        reclaims.insert(signal, amount);
    }
    let mut out = Vec::new();
    for (signal, value) in parse_map("--eviction-hard", hard)? {
        let min_reclaim = reclaims.get(&signal).copied();
        out.push(Threshold { signal, value, grace: Duration::ZERO, min_reclaim, hard: true });
    }
    for (signal, value) in parse_map("--eviction-soft", soft)? {
        let grace = graces.get(&signal).ok_or_else(|| {
            format!("grace period must be specified for the soft eviction threshold {}", signal.name())
        })?;
        let grace = grace
            .parse::<k8s_openapi::jiff::SignedDuration>()
            .ok()
            .and_then(|d| Duration::try_from(d).ok())
            .ok_or_else(|| format!("--eviction-soft-grace-period: {grace:?} is not a duration (e.g. 1m30s)"))?;
        if grace.is_zero() {
            return Err(format!(
                "invalid eviction grace period specified: {}, must be a positive value",
                signal.name()
            ));
        }
        let min_reclaim = reclaims.get(&signal).copied();
        out.push(Threshold { signal, value, grace, min_reclaim, hard: false });
    }
    let allocatable: Vec<Threshold> = out
        .iter()
        .filter(|t| t.hard && t.signal == Signal::MemoryAvailable)
        .map(|t| Threshold { signal: Signal::AllocatableMemoryAvailable, ..t.clone() })
        .collect();
    out.extend(allocatable);
    Ok(out)
}

/// The hard `memory.available` and `nodefs.available` thresholds, which node allocatable holds
/// back (kubelet's `hardEvictionReservation`), as quantities of `memory` and `disk` bytes.
pub fn hard_reservation(thresholds: &[Threshold], memory: i128, disk: i128) -> (i128, i128) {
    let of = |signal: Signal, capacity: i128| {
        thresholds.iter().filter(|t| t.hard && t.signal == signal).map(|t| t.floor(capacity, true)).max().unwrap_or(0)
    };
    (of(Signal::MemoryAvailable, memory), of(Signal::NodefsAvailable, disk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_add_the_allocatable_memory_threshold() {
        let t = parse(DEFAULT_HARD, "", "", "").unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.signal.name()).collect();
        assert_eq!(
            names,
            [
                "memory.available",
                "nodefs.available",
                "nodefs.inodesFree",
                "imagefs.available",
                "imagefs.inodesFree",
                "allocatableMemory.available"
            ]
        );
        assert_eq!(t[0].value, Amount::Quantity(100 << 20));
        assert_eq!(t[1].value, Amount::Percent(10.0));
        assert!(t.iter().all(|t| t.hard && t.grace.is_zero()));
        assert_eq!(hard_reservation(&t, 8 << 30, 1000), (100 << 20, 100));
    }

    #[test]
    fn soft_thresholds_need_a_grace_period_and_take_minimum_reclaim() {
        let err = parse("", "memory.available<1Gi", "", "").unwrap_err();
        assert_eq!(err, "grace period must be specified for the soft eviction threshold memory.available");
        let t = parse("", "memory.available<1Gi", "memory.available=1m30s", "memory.available=500Mi").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].hard, t[0].grace), (false, Duration::from_secs(90)));
        assert_eq!(t[0].floor(0, true), (1 << 30) + (500 << 20));
        assert_eq!(t[0].floor(0, false), 1 << 30);
    }

    #[test]
    fn bad_thresholds_are_refused_with_what_is_wrong() {
        let err = |s| parse(s, "", "", "").unwrap_err();
        assert_eq!(err("memory.free<1Gi"), "--eviction-hard: unsupported eviction signal memory.free");
        assert_eq!(
            err("nodefs.available<110%"),
            "--eviction-hard: eviction percentage threshold nodefs.available must be <= 100%: 110%"
        );
        assert_eq!(
            err("memory.available<-1Gi"),
            "--eviction-hard: eviction threshold memory.available must be positive: -1Gi"
        );
        assert_eq!(err("memory.available=1Gi"), "--eviction-hard: malformed pair, expect string<string");
        // As kubelet: 0% and 100% set no threshold.
        assert_eq!(parse("nodefs.available<0%,imagefs.available<100%", "", "", "").unwrap(), vec![]);
    }
}
