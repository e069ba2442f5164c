//! The node's resource usage, as kubelet's CRI stats provider measures it: each container's CPU
//! and memory from the runtime (`ListContainerStats`), the node's from `/proc`, a pod's as the sum
//! of its containers. A sampler reads them every [`PERIOD`] (cadvisor's housekeeping interval);
//! CPU rates (`usageNanoCores`) are the change since the reading before. The node endpoint serves
//! the newest as the Summary API (`/stats/summary`) and as `/metrics/resource`, which
//! metrics.k8s.io and metrics-server read.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::runtime::ContainerRuntime;
use super::status::keys;
use crate::runtime::cri::{self, CriError};

/// How often the sampler reads: the window of every CPU rate.
pub const PERIOD: Duration = Duration::from_secs(10);

/// kubelet's Summary API (`stats/v1alpha1`), the parts cairn measures: CPU and memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The container's writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
}

/// A filesystem's use by one container (the Summary API's `FsStats`, the parts cairn measures).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    /// The rate over the last window, in billionths of a core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage less inactive file pages: what the kernel cannot easily reclaim (what
    /// `kubectl top` and eviction look at).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
}

/// One reading of cumulative counters and gauges, at wall-clock nanoseconds.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub node: NodeReading,
    pub containers: Vec<ContainerReading>,
}

#[derive(Debug, Clone, Default)]
pub struct NodeReading {
    pub at_ns: i64,
    pub boot_time_s: i64,
    pub cpu_ns: u64,
    pub memory: ProcMemory,
}

#[derive(Debug, Clone)]
pub struct ContainerReading {
    pub id: String,
    pub name: String,
    pub pod: PodReference,
    pub pod_started_ns: i64,
    pub started_ns: i64,
    /// CPU: (reading time, cumulative nanoseconds).
    pub cpu: Option<(i64, u64)>,
    pub memory: Option<cri::MemoryUsage>,
    pub writable_layer: Option<cri::FilesystemUsage>,
}

/// `/proc/meminfo` in bytes, as kubelet's node memory: usage counts page cache, the working set
/// does not count inactive file pages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcMemory {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
}

impl ProcMemory {
    pub fn parse(meminfo: &str) -> Self {
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        ProcMemory { total: field("MemTotal"), free: field("MemFree"), inactive_file: field("Inactive(file)") }
    }

    fn stats(&self, at_ns: i64) -> MemoryStats {
        let usage = self.total.saturating_sub(self.free);
        let working_set = usage.saturating_sub(self.inactive_file);
        MemoryStats {
            time: time_of(at_ns),
            available_bytes: Some(self.total.saturating_sub(working_set)),
            usage_bytes: Some(usage),
            working_set_bytes: Some(working_set),
            rss_bytes: None,
        }
    }
}

/// The busy CPU time of all CPUs in `/proc/stat` (user, nice, system, irq, softirq, steal; guest
/// time is inside user), in nanoseconds, and the boot time in seconds since the epoch.
pub fn parse_proc_stat(stat: &str, ticks_per_second: u64) -> (u64, i64) {
    let busy: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .map(|l| {
            let v: Vec<u64> = l.split_whitespace().filter_map(|f| f.parse().ok()).collect();
            [0, 1, 2, 5, 6, 7].iter().filter_map(|i| v.get(*i)).sum()
        })
        .unwrap_or(0);
    let boot = stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok()).unwrap_or(0);
    (busy.saturating_mul(1_000_000_000) / ticks_per_second.max(1), boot)
}

fn time_of(ns: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(ns.div_euclid(1_000_000_000)).unwrap_or_default())
}

/// The rate of a cumulative nanosecond counter between two readings, in nanocores; none when the
/// counter went back (a restarted container) or no time passed.
fn rate(before: (i64, u64), now: (i64, u64)) -> Option<u64> {
    let elapsed = u64::try_from(now.0 - before.0).ok().filter(|e| *e > 0)?;
    let used = now.1.checked_sub(before.1)?;
    Some((u128::from(used) * 1_000_000_000 / u128::from(elapsed)) as u64)
}

/// The Summary of `now`, its CPU rates against `before`.
pub fn summarize(node_name: &str, before: Option<&Reading>, now: &Reading) -> Summary {
    let node_rate = before.and_then(|b| rate((b.node.at_ns, b.node.cpu_ns), (now.node.at_ns, now.node.cpu_ns)));
    let node = NodeStats {
        node_name: node_name.to_string(),
        start_time: (now.node.boot_time_s > 0).then(|| time_of(now.node.boot_time_s * 1_000_000_000)),
        cpu: Some(CpuStats {
            time: time_of(now.node.at_ns),
            usage_nano_cores: node_rate,
            usage_core_nano_seconds: Some(now.node.cpu_ns),
        }),
        memory: Some(now.node.memory.stats(now.node.at_ns)),
    };
    let previous: HashMap<&str, (i64, u64)> =
        before.into_iter().flat_map(|b| &b.containers).filter_map(|c| Some((c.id.as_str(), c.cpu?))).collect();
    let mut pods: BTreeMap<(String, String, String), PodStats> = BTreeMap::new();
    for c in &now.containers {
        let key = (c.pod.namespace.clone(), c.pod.name.clone(), c.pod.uid.clone());
        let pod = pods.entry(key).or_insert_with(|| PodStats {
            pod_ref: c.pod.clone(),
            start_time: (c.pod_started_ns > 0).then(|| time_of(c.pod_started_ns)),
            ..Default::default()
        });
        let cpu = c.cpu.map(|(at, total)| CpuStats {
            time: time_of(at),
            usage_nano_cores: previous.get(c.id.as_str()).and_then(|b| rate(*b, (at, total))),
            usage_core_nano_seconds: Some(total),
        });
        let memory = c.memory.as_ref().map(|m| MemoryStats {
            time: time_of(m.timestamp),
            available_bytes: m.available_bytes.as_ref().map(|v| v.value).filter(|v| *v > 0),
            usage_bytes: m.usage_bytes.as_ref().map(|v| v.value),
            working_set_bytes: m.working_set_bytes.as_ref().map(|v| v.value),
            rss_bytes: m.rss_bytes.as_ref().map(|v| v.value),
        });
        let rootfs = c.writable_layer.as_ref().map(|w| FsStats {
            time: time_of(w.timestamp),
            used_bytes: w.used_bytes.as_ref().map(|v| v.value),
            inodes_used: w.inodes_used.as_ref().map(|v| v.value),
        });
        pod.containers.push(ContainerStats {
            name: c.name.clone(),
            start_time: (c.started_ns > 0).then(|| time_of(c.started_ns)),
            cpu,
            memory,
            rootfs,
        });
    }
    let pods = pods
        .into_values()
        .map(|mut p| {
            p.cpu = sum_cpu(&p.containers);
            p.memory = sum_memory(&p.containers);
            p
        })
        .collect();
    Summary { node, pods }
}

/// A pod's CPU: its containers' added up (a rate only when every container has one).
fn sum_cpu(containers: &[ContainerStats]) -> Option<CpuStats> {
    let all: Vec<&CpuStats> = containers.iter().filter_map(|c| c.cpu.as_ref()).collect();
    let time = all.iter().map(|c| c.time.clone()).max()?;
    let rates: Option<Vec<u64>> = all.iter().map(|c| c.usage_nano_cores).collect();
    Some(CpuStats {
        time,
        usage_nano_cores: rates.map(|r| r.iter().sum()),
        usage_core_nano_seconds: Some(all.iter().filter_map(|c| c.usage_core_nano_seconds).sum()),
    })
}

fn sum_memory(containers: &[ContainerStats]) -> Option<MemoryStats> {
    let all: Vec<&MemoryStats> = containers.iter().filter_map(|c| c.memory.as_ref()).collect();
    let time = all.iter().map(|m| m.time.clone()).max()?;
    let sum = |f: fn(&MemoryStats) -> Option<u64>| Some(all.iter().filter_map(|m| f(m)).sum());
    Some(MemoryStats {
        time,
        available_bytes: None,
        usage_bytes: sum(|m| m.usage_bytes),
        working_set_bytes: sum(|m| m.working_set_bytes),
        rss_bytes: sum(|m| m.rss_bytes),
    })
}

/// kubelet's `/metrics/resource` (Prometheus text, its STABLE metrics) from a Summary.
pub fn resource_metrics(summary: &Summary) -> String {
    let ms = |t: &Time| t.0.as_millisecond();
    let seconds = |ns: u64| ns as f64 / 1e9;
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64, i64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}");
        for (labels, value, at) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {at}");
        }
    };
    let containers = || {
        summary.pods.iter().flat_map(|p| {
            p.containers.iter().map(move |c| {
                let labels =
                    format!("{{container={:?},namespace={:?},pod={:?}}}", c.name, p.pod_ref.namespace, p.pod_ref.name);
                (labels, c)
            })
        })
    };
    let pods = || {
        summary.pods.iter().map(|p| (format!("{{namespace={:?},pod={:?}}}", p.pod_ref.namespace, p.pod_ref.name), p))
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        containers()
            .filter_map(|(l, c)| {
                c.cpu.as_ref().and_then(|u| Some((l, seconds(u.usage_core_nano_seconds?), ms(&u.time))))
            })
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        containers()
            .filter_map(|(l, c)| c.memory.as_ref().and_then(|m| Some((l, m.working_set_bytes? as f64, ms(&m.time)))))
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        containers()
            .filter_map(|(l, c)| {
                let start = c.start_time.as_ref()?;
                Some((l, start.0.as_second() as f64, c.cpu.as_ref().map_or(ms(start), |u| ms(&u.time))))
            })
            .collect(),
    );
    let node = &summary.node;
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        node.cpu
            .iter()
            .filter_map(|u| Some((String::new(), seconds(u.usage_core_nano_seconds?), ms(&u.time))))
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        node.memory.iter().filter_map(|m| Some((String::new(), m.working_set_bytes? as f64, ms(&m.time)))).collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods()
            .filter_map(|(l, p)| {
                p.cpu.as_ref().and_then(|u| Some((l, seconds(u.usage_core_nano_seconds?), ms(&u.time))))
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods()
            .filter_map(|(l, p)| p.memory.as_ref().and_then(|m| Some((l, m.working_set_bytes? as f64, ms(&m.time)))))
            .collect(),
    );
    out.push_str("# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error 0\n");
    out
}

/// The sampler and the newest Summary.
pub struct Stats {
    runtime: Arc<dyn ContainerRuntime>,
    node_name: String,
    proc_dir: PathBuf,
    state: Mutex<(Option<Reading>, Arc<Summary>)>,
    /// Counts the readings taken.
    sampled: tokio::sync::watch::Sender<u64>,
}

impl Stats {
    pub fn new(runtime: Arc<dyn ContainerRuntime>, node_name: String) -> Arc<Self> {
        let summary = Summary { node: NodeStats { node_name: node_name.clone(), ..Default::default() }, pods: vec![] };
        Arc::new(Stats {
            runtime,
            node_name,
            proc_dir: "/proc".into(),
            state: Mutex::new((None, Arc::new(summary))),
            sampled: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The newest Summary (the node's name only, before the first reading).
    pub fn summary(&self) -> Arc<Summary> {
        self.state.lock().map(|s| s.1.clone()).unwrap_or_default()
    }

    /// The newest Summary and the number of its reading.
    pub fn sample(&self) -> (u64, Arc<Summary>) {
        (*self.sampled.borrow(), self.summary())
    }

    /// Ticks with the number of each new reading.
    pub fn samples(&self) -> tokio::sync::watch::Receiver<u64> {
        self.sampled.subscribe()
    }

    /// Reads every [`PERIOD`] until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            match self.read().await {
                Ok(now) => {
                    if let Ok(mut state) = self.state.lock() {
                        let summary = summarize(&self.node_name, state.0.as_ref(), &now);
                        *state = (Some(now), Arc::new(summary));
                    }
                    self.sampled.send_modify(|n| *n += 1);
                }
                Err(e) => tracing::debug!("node stats: {e}"),
            }
            tokio::select! {
                () = tokio::time::sleep(PERIOD) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    async fn read(&self) -> Result<Reading, CriError> {
        let sandboxes = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
                    ..Default::default()
                }),
            })
            .await?
            .items;
        let running = self
            .runtime
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
                    ..Default::default()
                }),
            })
            .await?
            .containers;
        let stats = self.runtime.list_container_stats(cri::ListContainerStatsRequest::default()).await?.stats;
        let node = self.read_node().await;
        let started: HashMap<&str, i64> = sandboxes.iter().map(|s| (s.id.as_str(), s.created_at)).collect();
        let stats: HashMap<&str, &cri::ContainerStats> =
            stats.iter().filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s))).collect();
        let containers = running
            .iter()
            .filter_map(|c| {
                let pod_started = *started.get(c.pod_sandbox_id.as_str())?;
                let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
                let s = stats.get(c.id.as_str());
                Some(ContainerReading {
                    id: c.id.clone(),
                    name: label(keys::CONTAINER_NAME),
                    pod: PodReference {
                        name: label(keys::POD_NAME),
                        namespace: label(keys::POD_NAMESPACE),
                        uid: label(keys::POD_UID),
                    },
                    pod_started_ns: pod_started,
                    started_ns: c.created_at,
                    cpu: s
                        .and_then(|s| s.cpu.as_ref())
                        .and_then(|u| Some((u.timestamp, u.usage_core_nano_seconds?.value))),
                    memory: s.and_then(|s| s.memory),
                    writable_layer: s.and_then(|s| s.writable_layer.clone()),
                })
            })
            .collect();
        Ok(Reading { node, containers })
    }

    async fn read_node(&self) -> NodeReading {
        let (stat, meminfo) = tokio::join!(
            tokio::fs::read_to_string(self.proc_dir.join("stat")),
            tokio::fs::read_to_string(self.proc_dir.join("meminfo")),
        );
        // SAFETY: sysconf only reads a configuration value.
        let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
        let (cpu_ns, boot_time_s) = parse_proc_stat(&stat.unwrap_or_default(), ticks);
        let at_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
        NodeReading { at_ns, boot_time_s, cpu_ns, memory: ProcMemory::parse(&meminfo.unwrap_or_default()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000_000;

    fn container(id: &str, pod: &str, at: i64, cpu: u64, memory: u64) -> ContainerReading {
        ContainerReading {
            id: id.into(),
            name: format!("c-{id}"),
            pod: PodReference { name: pod.into(), namespace: "default".into(), uid: format!("uid-{pod}") },
            pod_started_ns: SECOND,
            started_ns: 2 * SECOND,
            cpu: Some((at, cpu)),
            memory: Some(cri::MemoryUsage {
                timestamp: at,
                working_set_bytes: Some(cri::UInt64Value { value: memory }),
                ..Default::default()
            }),
            writable_layer: None,
        }
    }

    fn reading(at: i64, node_cpu: u64, containers: Vec<ContainerReading>) -> Reading {
        let memory = ProcMemory { total: 8 << 30, free: 5 << 30, inactive_file: 1 << 30 };
        Reading { node: NodeReading { at_ns: at, boot_time_s: 100, cpu_ns: node_cpu, memory }, containers }
    }

    #[test]
    fn parses_proc() {
        let stat = "cpu  100 20 30 4000 50 6 7 8 9 10\ncpu0 1 2 3 4\nbtime 1700000000\n";
        // user + nice + system + irq + softirq + steal = 171 ticks at 100/s.
        assert_eq!(parse_proc_stat(stat, 100), (1_710_000_000, 1_700_000_000));
        let meminfo =
            "MemTotal:       16384 kB\nMemFree:         4096 kB\nMemAvailable:   8192 kB\nInactive(file):   1024 kB\n";
        let m = ProcMemory::parse(meminfo);
        assert_eq!(m, ProcMemory { total: 16 << 20, free: 4 << 20, inactive_file: 1 << 20 });
        let s = m.stats(0);
        assert_eq!(
            (s.usage_bytes, s.working_set_bytes, s.available_bytes),
            (Some(12 << 20), Some(11 << 20), Some(5 << 20))
        );
    }

    #[test]
    fn rates_come_from_two_readings_and_pods_add_their_containers_up() {
        let first =
            reading(10 * SECOND, 5 * SECOND as u64, vec![container("a", "web", 10 * SECOND, SECOND as u64, 100)]);
        let alone = summarize("n1", None, &first);
        assert_eq!(alone.node.cpu.as_ref().unwrap().usage_nano_cores, None, "no rate from one reading");
        assert_eq!(alone.pods[0].cpu.as_ref().unwrap().usage_nano_cores, None);
        // 10 s later: the node used 5 s of CPU (half a core), container a 2.5 s, and b is new.
        let second = reading(
            20 * SECOND,
            10 * SECOND as u64,
            vec![
                container("a", "web", 20 * SECOND, 3_500_000_000, 300),
                container("b", "web", 20 * SECOND, 1_000, 50),
                container("c", "db", 20 * SECOND, 7, 10),
            ],
        );
        let s = summarize("n1", Some(&first), &second);
        assert_eq!(s.node.node_name, "n1");
        assert_eq!(s.node.cpu.as_ref().unwrap().usage_nano_cores, Some(500_000_000));
        assert_eq!(s.node.memory.as_ref().unwrap().working_set_bytes, Some(2 << 30));
        let names: Vec<&str> = s.pods.iter().map(|p| p.pod_ref.name.as_str()).collect();
        assert_eq!(names, ["db", "web"]);
        let web = &s.pods[1];
        assert_eq!(web.containers[0].cpu.as_ref().unwrap().usage_nano_cores, Some(250_000_000));
        assert_eq!(web.containers[1].cpu.as_ref().unwrap().usage_nano_cores, None, "b has no earlier reading");
        assert_eq!(web.cpu.as_ref().unwrap().usage_nano_cores, None, "a pod's rate needs all of its containers'");
        assert_eq!(web.memory.as_ref().unwrap().working_set_bytes, Some(350));
        // A container whose counter went back (restarted under the same ID) has no rate.
        let back = reading(30 * SECOND, 11 * SECOND as u64, vec![container("a", "web", 30 * SECOND, 5, 1)]);
        let s = summarize("n1", Some(&second), &back);
        assert_eq!(s.pods[0].containers[0].cpu.as_ref().unwrap().usage_nano_cores, None);
        // The wire form is the Summary API's.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["node"]["cpu"]["usageCoreNanoSeconds"], 11 * SECOND);
        assert_eq!(json["pods"][0]["podRef"]["uid"], "uid-web");
        assert_eq!(serde_json::from_value::<Summary>(json).unwrap(), s);
    }

    #[test]
    fn resource_metrics_are_kubelets() {
        let first = reading(10 * SECOND, 0, vec![container("a", "web", 10 * SECOND, 1_500_000_000, 4096)]);
        let text = resource_metrics(&summarize("n1", None, &first));
        for line in [
            "# TYPE container_cpu_usage_seconds_total counter",
            r#"container_cpu_usage_seconds_total{container="c-a",namespace="default",pod="web"} 1.5 10000"#,
            r#"container_memory_working_set_bytes{container="c-a",namespace="default",pod="web"} 4096 10000"#,
            r#"container_start_time_seconds{container="c-a",namespace="default",pod="web"} 2 10000"#,
            r#"pod_memory_working_set_bytes{namespace="default",pod="web"} 4096 10000"#,
            "node_memory_working_set_bytes 2147483648 10000",
            "resource_scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
        }
    }
}
