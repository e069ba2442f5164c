//! Resource arithmetic of kubelet: the QoS class (`v1/helper/qos.GetPodQOS`), the pod cgroup's
//! limits (`cm.ResourceConfigForPod`), a container's CRI resources
//! (`kuberuntime.generateLinuxContainerResources`) and its OOM score adjustment
//! (`qos.GetContainerOOMScoreAdjust`). The PodLevelResources and SidecarContainers features are on,
//! as in current Kubernetes.

use std::collections::BTreeMap;

use k8s_cri::v1::{HugepageLimit, LinuxContainerResources};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::registry::kinds::pod_rules::{self, parse_quantity};

/// The smallest CPU shares (and what BestEffort pods and the besteffort tier get).
pub const MIN_SHARES: u64 = 2;
/// The largest CPU shares the kernel accepts on cgroup v1.
pub const MAX_SHARES: u64 = 262_144;
/// The CFS period, in microseconds (100 ms).
pub const QUOTA_PERIOD: u64 = 100_000;
const MIN_QUOTA_PERIOD: i64 = 1000;
const SHARES_PER_CPU: i64 = 1024;
const MILLI_CPU_TO_CPU: i64 = 1000;
const MAX_WEIGHT: u64 = 10_000;

const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";
const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const API_SERVER_SOURCE: &str = "api";

const CPU: &str = "cpu";
const MEMORY: &str = "memory";
const HUGEPAGES_PREFIX: &str = "hugepages-";
const RESTART_ALWAYS: &str = "Always";

type Quantities = BTreeMap<String, Quantity>;
/// Amounts in milli-units, by resource name.
type Milli = BTreeMap<String, i128>;

pub use crate::registry::kinds::pod_rules::QosClass;

/// `GetPodQOS`: the class recorded in the status, computed from the spec when there is none.
pub fn qos_class(pod: &Pod) -> QosClass {
    pod.status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::parse)
        .unwrap_or_else(|| compute_qos_class(pod))
}

/// `ComputePodQOS`, from the spec alone.
pub fn compute_qos_class(pod: &Pod) -> QosClass {
    pod.spec.as_ref().map_or(QosClass::BestEffort, pod_rules::qos_class)
}

/// The pod cgroup's limits (`ResourceConfig` of `ResourceConfigForPod`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodResources {
    pub cpu_shares: u64,
    /// CFS quota in microseconds per `cpu_period`; `None` leaves the CPU unbounded.
    pub cpu_quota: Option<i64>,
    pub cpu_period: u64,
    /// Memory limit in bytes; `None` leaves memory unbounded.
    pub memory_limit: Option<i64>,
    /// Hugepage limits in bytes, by page size in bytes (from the hugepage requests).
    pub hugepage_limits: BTreeMap<u64, u64>,
    /// The pod's process limit (kubelet's `podPidsLimit`); `pod_resources` leaves it unset.
    pub pids_limit: Option<i64>,
}

/// `ResourceConfigForPod`: requests summed over the containers and maxed with the init containers
/// (sidecars counted as running alongside), pod-level resources and overhead included; a limit is
/// applied only when every container has one (or the pod sets it at pod level).
pub fn pod_resources(pod: &Pod) -> PodResources {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let requests = pod_requests(spec);
    let (mut cpu_limits_declared, mut memory_limits_declared) = (true, true);
    let limits = pod_limits(spec, |list| {
        cpu_limits_declared &= list.get(CPU).copied().unwrap_or(0) != 0;
        memory_limits_declared &= list.get(MEMORY).copied().unwrap_or(0) != 0;
    });
    if pod_level_resources_set(spec) {
        let pod_limits = spec.resources.as_ref().and_then(|r| r.limits.as_ref());
        cpu_limits_declared |= milli_of(pod_limits, CPU) != 0;
        memory_limits_declared |= milli_of(pod_limits, MEMORY) != 0;
    }
    let cpu_shares = milli_cpu_to_shares(milli_value(requests.get(CPU).copied().unwrap_or(0)));
    let cpu_quota = milli_cpu_to_quota(milli_value(limits.get(CPU).copied().unwrap_or(0)), QUOTA_PERIOD);
    let memory = value(limits.get(MEMORY).copied().unwrap_or(0));
    let positive = |v: i64| (v > 0).then_some(v);
    let (cpu_shares, cpu_quota, memory_limit) = match qos_class(pod) {
        QosClass::Guaranteed => (cpu_shares, positive(cpu_quota), positive(memory)),
        QosClass::Burstable => (
            cpu_shares,
            positive(cpu_quota).filter(|_| cpu_limits_declared),
            positive(memory).filter(|_| memory_limits_declared),
        ),
        QosClass::BestEffort => (MIN_SHARES, None, None),
    };
    PodResources {
        cpu_shares,
        cpu_quota,
        cpu_period: QUOTA_PERIOD,
        memory_limit,
        hugepage_limits: hugepage_limits(&requests),
        pids_limit: None,
    }
}

/// The pod's CPU request in millicores (`PodRequests`: pod-level, sidecars, init containers and
/// overhead included).
pub fn pod_cpu_request(pod: &Pod) -> i64 {
    pod.spec.as_ref().map_or(0, |spec| milli_value(pod_requests(spec).get(CPU).copied().unwrap_or(0)))
}

/// `generateLinuxContainerResources` for what does not depend on the host: CPU shares (from the
/// request, else the limit), CFS quota and period, memory limit, OOM score adjustment and the
/// hugepage limits the container sets.
pub fn container_resources(pod: &Pod, container: &Container, memory_capacity: u64) -> LinuxContainerResources {
    let requests = container.resources.as_ref().and_then(|r| r.requests.as_ref());
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let cpu_request = requests.and_then(|r| r.get(CPU)).map(|q| parse_quantity(&q.0).unwrap_or(0));
    let cpu_limit = milli_value(milli_of(limits, CPU));
    let cpu_shares = match cpu_request {
        None if cpu_limit != 0 => milli_cpu_to_shares(cpu_limit),
        request => milli_cpu_to_shares(milli_value(request.unwrap_or(0))),
    };
    let hugepage_limits = to_milli(limits)
        .into_iter()
        .filter_map(|(name, amount)| {
            let page_size = hugepage_size(&name)?;
            Some(HugepageLimit { page_size: hugepage_size_name(page_size), limit: value(amount).max(0) as u64 })
        })
        .collect();
    LinuxContainerResources {
        cpu_period: QUOTA_PERIOD as i64,
        cpu_quota: milli_cpu_to_quota(cpu_limit, QUOTA_PERIOD),
        cpu_shares: cpu_shares as i64,
        memory_limit_in_bytes: value(milli_of(limits, MEMORY)),
        oom_score_adj: oom_score_adj(pod, container, memory_capacity),
        hugepage_limits,
        ..Default::default()
    }
}

/// `GetContainerOOMScoreAdjust`: -997 for Guaranteed and node-critical pods, 1000 for BestEffort,
/// and for Burstable `1000 - 1000 * request / capacity` (pod-level memory requests not given to
/// containers shared out equally; a sidecar never above the smallest regular container), kept
/// within 3..=999.
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i64 {
    if is_node_critical_pod(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos_class(pod) {
        QosClass::Guaranteed => return GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let capacity = i128::from(memory_capacity.max(1));
    let adjust = |request: i128| 1000 - (1000 * request) / capacity;
    let memory_request =
        |c: &Container| value(milli_of(c.resources.as_ref().and_then(|r| r.requests.as_ref()), MEMORY));
    let remaining = if pod_level_requests_set(spec) { remaining_pod_memory_per_container(spec) } else { 0 };
    let mut score = adjust(i128::from(memory_request(container)) + remaining);
    if is_sidecar_of(spec, container) {
        let smallest = spec.containers.iter().map(memory_request).min().unwrap_or(0);
        score = score.min(adjust(i128::from(smallest) + remaining));
    }
    let score = milli_value(score);
    if score < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if score == BEST_EFFORT_OOM_SCORE_ADJ {
        score - 1
    } else {
        score
    }
}

/// `MilliCPUToShares`: 1024 shares per CPU, within `MIN_SHARES..=MAX_SHARES`.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    let shares = i128::from(milli_cpu) * i128::from(SHARES_PER_CPU) / i128::from(MILLI_CPU_TO_CPU);
    shares.clamp(MIN_SHARES as i128, MAX_SHARES as i128) as u64
}

/// `MilliCPUToQuota`: the CFS quota for `milli_cpu` over `period` (0 for no limit, at least 1 ms).
pub fn milli_cpu_to_quota(milli_cpu: i64, period: u64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    let quota = i128::from(milli_cpu) * i128::from(period) / i128::from(MILLI_CPU_TO_CPU);
    quota.clamp(i128::from(MIN_QUOTA_PERIOD), i128::from(i64::MAX)) as i64
}

/// cgroup v2's `cpu.weight` for cgroup v1 shares, as runc converts them
/// (`ConvertCPUSharesToCgroupV2Value`: a quadratic in log2 that maps 2 → 1, 1024 → 100 and
/// 262144 → 10000). 0 stays 0 (unset).
pub fn shares_to_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        1 | 2 => 1,
        s if s >= MAX_SHARES => MAX_WEIGHT,
        s => {
            let l = (s as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            10f64.powf(exponent).ceil() as u64
        }
    }
}

/// The name cgroup v1 and CRI give a hugepage size (`2MB`, `1GB`).
pub fn hugepage_size_name(mut bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut unit = 0;
    while bytes != 0 && bytes.is_multiple_of(1024) && unit < UNITS.len() - 1 {
        bytes /= 1024;
        unit += 1;
    }
    format!("{bytes}{}", UNITS[unit])
}

/// kubelet's `IsCriticalPod`: a static pod, a mirror pod, or a pod of system-critical priority.
pub fn is_critical_pod(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let is_static = annotations.and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION)).is_some_and(|s| s != API_SERVER_SOURCE);
    let is_mirror = annotations.is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION));
    let critical_priority = pod.spec.as_ref().and_then(|s| s.priority).is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    is_static || is_mirror || critical_priority
}

/// `IsNodeCriticalPod`: a critical pod of the `system-node-critical` priority class.
fn is_node_critical_pod(pod: &Pod) -> bool {
    is_critical_pod(pod)
        && pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()) == Some(SYSTEM_NODE_CRITICAL)
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some(RESTART_ALWAYS)
}

/// Whether `container` is one of the pod's restartable init containers.
fn is_sidecar_of(spec: &PodSpec, container: &Container) -> bool {
    is_sidecar(container) && spec.init_containers.iter().flatten().any(|c| c.name == container.name)
}

/// `remainingPodMemReqPerContainer`: the pod-level memory request not claimed by the containers,
/// shared equally among them.
fn remaining_pod_memory_per_container(spec: &PodSpec) -> i128 {
    let pod_request = value(milli_of(spec.resources.as_ref().and_then(|r| r.requests.as_ref()), MEMORY));
    if pod_request == 0 {
        return 0;
    }
    let containers = spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len);
    let claimed = value(aggregate(spec, requests_of, |_| {}).get(MEMORY).copied().unwrap_or(0));
    (i128::from(pod_request) - i128::from(claimed)) / containers.max(1) as i128
}

fn is_pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

fn has_pod_level_resource(list: Option<&Quantities>) -> bool {
    list.into_iter().flatten().any(|(name, _)| is_pod_level_resource(name))
}

/// `IsPodLevelRequestsSet`.
fn pod_level_requests_set(spec: &PodSpec) -> bool {
    has_pod_level_resource(spec.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

/// `IsPodLevelResourcesSet`.
fn pod_level_resources_set(spec: &PodSpec) -> bool {
    spec.resources
        .as_ref()
        .is_some_and(|r| has_pod_level_resource(r.requests.as_ref()) || has_pod_level_resource(r.limits.as_ref()))
}

/// `PodRequests`: container requests aggregated, pod-level requests over them, plus overhead.
fn pod_requests(spec: &PodSpec) -> Milli {
    let mut requests = aggregate(spec, requests_of, |_| {});
    if pod_level_requests_set(spec) {
        override_pod_level(&mut requests, spec.resources.as_ref().and_then(|r| r.requests.as_ref()));
    }
    add(&mut requests, &to_milli(spec.overhead.as_ref()));
    requests
}

/// `PodLimits`: container limits aggregated (`each` sees every container's effective limits),
/// pod-level limits over them, plus overhead on the nonzero ones.
fn pod_limits(spec: &PodSpec, each: impl FnMut(&Milli)) -> Milli {
    let mut limits = aggregate(spec, limits_of, each);
    if pod_level_resources_set(spec) {
        override_pod_level(&mut limits, spec.resources.as_ref().and_then(|r| r.limits.as_ref()));
    }
    for (name, overhead) in to_milli(spec.overhead.as_ref()) {
        if let Some(limit) = limits.get_mut(&name).filter(|l| **l != 0) {
            *limit += overhead;
        }
    }
    limits
}

fn override_pod_level(list: &mut Milli, pod_level: Option<&Quantities>) {
    list.extend(to_milli(pod_level).into_iter().filter(|(name, _)| is_pod_level_resource(name)));
}

fn requests_of(r: &ResourceRequirements) -> Option<&Quantities> {
    r.requests.as_ref()
}

fn limits_of(r: &ResourceRequirements) -> Option<&Quantities> {
    r.limits.as_ref()
}

/// `AggregateContainerRequests` / `AggregateContainerLimits`: the sum over app containers and
/// sidecars, maxed with what each init container needs while it runs (itself plus the sidecars
/// started before it). `each` is called with every container's effective list.
fn aggregate(
    spec: &PodSpec,
    pick: fn(&ResourceRequirements) -> Option<&Quantities>,
    mut each: impl FnMut(&Milli),
) -> Milli {
    let list = |c: &Container| to_milli(c.resources.as_ref().and_then(pick));
    let mut total = Milli::new();
    for c in &spec.containers {
        let own = list(c);
        each(&own);
        add(&mut total, &own);
    }
    let (mut sidecars, mut init) = (Milli::new(), Milli::new());
    for c in spec.init_containers.iter().flatten() {
        let own = list(c);
        let effective = if is_sidecar(c) {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut running = own;
            add(&mut running, &sidecars);
            running
        };
        each(&effective);
        max_into(&mut init, &effective);
    }
    max_into(&mut total, &init);
    total
}

/// `HugePageLimits`: hugepage requests in bytes, by page size in bytes.
fn hugepage_limits(requests: &Milli) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for (name, amount) in requests {
        if let Some(size) = hugepage_size(name) {
            *out.entry(size).or_insert(0) += value(*amount).max(0) as u64;
        }
    }
    out
}

/// The page size in bytes of a `hugepages-<size>` resource name.
fn hugepage_size(name: &str) -> Option<u64> {
    let size = value(parse_quantity(name.strip_prefix(HUGEPAGES_PREFIX)?)?);
    u64::try_from(size).ok().filter(|s| *s > 0)
}

fn to_milli(list: Option<&Quantities>) -> Milli {
    list.into_iter().flatten().filter_map(|(name, q)| Some((name.clone(), parse_quantity(&q.0)?))).collect()
}

/// The named amount in milli-units; 0 when absent or unparsable.
fn milli_of(list: Option<&Quantities>, name: &str) -> i128 {
    list.and_then(|l| l.get(name)).and_then(|q| parse_quantity(&q.0)).unwrap_or(0)
}

fn add(into: &mut Milli, from: &Milli) {
    for (name, v) in from {
        *into.entry(name.clone()).or_insert(0) += v;
    }
}

fn max_into(into: &mut Milli, from: &Milli) {
    for (name, v) in from {
        let current = into.entry(name.clone()).or_insert(*v);
        *current = (*current).max(*v);
    }
}

/// `Quantity.MilliValue`, saturated to i64.
fn milli_value(milli: i128) -> i64 {
    milli.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// `Quantity.Value`: whole units, rounded up away from zero.
fn value(milli: i128) -> i64 {
    let units = milli / 1000 + i128::from(milli % 1000 != 0) * milli.signum();
    milli_value(units)
}
