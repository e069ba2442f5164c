use std::sync::Mutex;

use serde_json::json;

use super::*;

const MI: i128 = 1 << 20;

fn config(hard: &str, soft: &str, grace: &str) -> Config {
    Config {
        thresholds: thresholds::parse(hard, soft, grace, "").unwrap(),
        pressure_transition: Duration::from_secs(300),
        max_pod_grace: 0,
        local_storage_isolation: true,
    }
}

fn observed(signal: Signal, available: i128, capacity: i128, sample: u64) -> Observations {
    Observations::from([(signal, Observed { available, capacity, sample })])
}

fn pod(name: &str, memory: Option<&str>, priority: i32) -> Pod {
    let resources = match memory {
        Some(m) => json!({"requests": {"memory": m, "cpu": "100m"}, "limits": {"memory": m, "cpu": "100m"}}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"priority": priority, "containers": [{"name": "main", "image": "i", "resources": resources}]}
    }))
    .unwrap()
}

fn spec(pod: &mut Pod) -> &mut k8s_openapi::api::core::v1::PodSpec {
    pod.spec.as_mut().unwrap()
}

#[test]
fn a_hard_threshold_sets_the_condition_and_acts_once_per_reading() {
    let cfg = config("memory.available<100Mi", "", "");
    let mut state = State::default();
    let t0 = Instant::now();
    let round = state.round(&cfg, &observed(Signal::MemoryAvailable, 50 * MI, 1024 * MI, 1), t0);
    assert_eq!(round.conditions, BTreeSet::from([Condition::Memory]));
    assert_eq!(round.act.len(), 1);
    state.acted(Signal::MemoryAvailable, &observed(Signal::MemoryAvailable, 50 * MI, 1024 * MI, 1));
    // The same reading again: nothing to act on (kubelet's thresholdsUpdatedStats).
    let again = state.round(&cfg, &observed(Signal::MemoryAvailable, 50 * MI, 1024 * MI, 1), t0);
    assert!(again.act.is_empty());
    let fresh = state.round(&cfg, &observed(Signal::MemoryAvailable, 50 * MI, 1024 * MI, 2), t0);
    assert_eq!(fresh.act.len(), 1);
}

#[test]
fn a_soft_threshold_sets_the_condition_at_once_and_acts_after_its_grace_period() {
    let cfg = config("", "memory.available<1Gi", "memory.available=1m");
    let mut state = State::default();
    let t0 = Instant::now();
    let low = |n| observed(Signal::MemoryAvailable, 512 * MI, 4096 * MI, n);
    let first = state.round(&cfg, &low(1), t0);
    assert_eq!(first.conditions, BTreeSet::from([Condition::Memory]));
    assert!(first.act.is_empty());
    assert!(state.round(&cfg, &low(2), t0 + Duration::from_secs(30)).act.is_empty());
    assert_eq!(state.round(&cfg, &low(3), t0 + Duration::from_secs(61)).act.len(), 1);
}

#[test]
fn a_condition_holds_for_the_transition_period_after_the_pressure_is_gone() {
    let cfg = config("pid.available<100", "", "");
    let mut state = State::default();
    let t0 = Instant::now();
    state.round(&cfg, &observed(Signal::PidAvailable, 10, 1000, 1), t0);
    let fine = |n| observed(Signal::PidAvailable, 900, 1000, n);
    let later = state.round(&cfg, &fine(2), t0 + Duration::from_secs(299));
    assert_eq!(later.conditions, BTreeSet::from([Condition::Pid]));
    assert!(later.act.is_empty());
    assert!(state.round(&cfg, &fine(3), t0 + Duration::from_secs(300)).conditions.is_empty());
}

#[test]
fn minimum_reclaim_keeps_a_met_threshold_until_it_is_reclaimed_too() {
    let mut cfg = config("nodefs.available<10%", "", "");
    cfg.thresholds = thresholds::parse("nodefs.available<10%", "", "", "nodefs.available=5%").unwrap();
    let mut state = State::default();
    let t0 = Instant::now();
    assert_eq!(state.round(&cfg, &observed(Signal::NodefsAvailable, 5, 100, 1), t0).act.len(), 1);
    // 12% free is above the threshold but not above threshold + minimum reclaim (15%).
    let round = state.round(&cfg, &observed(Signal::NodefsAvailable, 12, 100, 2), t0);
    assert_eq!(round.act.len(), 1);
    assert!(state.round(&cfg, &observed(Signal::NodefsAvailable, 16, 100, 3), t0).act.is_empty());
}

#[test]
fn admission_under_pressure_is_kubelets() {
    let pressure = Pressure::default();
    let best_effort = pod("be", None, 0);
    let guaranteed = pod("g", Some("64Mi"), 0);
    let mut tolerating = pod("t", None, 0);
    spec(&mut tolerating).tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("node.kubernetes.io/memory-pressure".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    let critical = pod("c", None, 2_000_000_000);
    assert_eq!(pressure.admit(&best_effort), None);
    pressure.set(BTreeSet::from([Condition::Memory]));
    let rejected = pressure.admit(&best_effort).unwrap();
    assert_eq!(rejected, ("Evicted".to_string(), "The node had condition: [MemoryPressure]. ".to_string()));
    assert_eq!(pressure.admit(&guaranteed), None);
    assert_eq!(pressure.admit(&tolerating), None);
    pressure.set(BTreeSet::from([Condition::Memory, Condition::Disk]));
    assert_eq!(pressure.admit(&guaranteed).unwrap().1, "The node had condition: [MemoryPressure DiskPressure]. ");
    assert_eq!(pressure.admit(&tolerating).unwrap().0, "Evicted");
    assert_eq!(pressure.admit(&critical), None);
}

/// A node whose observations and images a test sets.
#[derive(Default)]
struct FakeNode {
    observations: Mutex<Vec<Observations>>,
    usage: HashMap<String, rank::Usage>,
    images_deleted: Mutex<u32>,
    /// Each pod's emptyDir volumes, by UID.
    empty_dirs: HashMap<String, BTreeMap<String, u64>>,
    processes: HashMap<String, u64>,
}

impl Node for FakeNode {
    async fn observe(&self) -> (Observations, HashMap<String, rank::Usage>) {
        let mut all = self.observations.lock().unwrap();
        let next = if all.len() > 1 { all.remove(0) } else { all[0].clone() };
        (next, self.usage.clone())
    }

    async fn delete_unused_images(&self) -> anyhow::Result<u64> {
        *self.images_deleted.lock().unwrap() += 1;
        Ok(1 << 30)
    }

    fn processes(&self, pod: &Pod) -> Option<u64> {
        self.processes.get(pod.metadata.uid.as_deref()?).copied()
    }

    async fn local_storage(&self, pod: &Pod, usage: &rank::Usage) -> LocalStorage {
        let containers = usage.containers.iter().map(|(name, _, disk)| (name.clone(), *disk)).collect();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        LocalStorage { containers, empty_dirs: self.empty_dirs.get(&uid).cloned().unwrap_or_default() }
    }
}

#[derive(Default)]
struct FakePods {
    pods: Vec<Pod>,
    evicted: Mutex<Vec<(String, Eviction)>>,
}

impl Pods for FakePods {
    fn active(&self) -> Vec<Pod> {
        self.pods.clone()
    }

    fn evict(&self, pod: &Pod, eviction: Eviction) {
        self.evicted.lock().unwrap().push((pod.metadata.name.clone().unwrap(), eviction));
    }

    fn stopped(&self, _: &str) -> bool {
        true
    }
}

fn manager(cfg: Config) -> Manager {
    Manager {
        config: cfg,
        pressure: Arc::default(),
        recorder: Recorder::discarding(),
        node: ObjectRef {
            kind: "Node",
            api_version: "v1",
            namespace: String::new(),
            name: "n".into(),
            uid: "n".into(),
        },
    }
}

fn usage(memory_mi: u64) -> rank::Usage {
    rank::Usage { memory: memory_mi << 20, containers: vec![("main".into(), memory_mi << 20, 0)], ..Default::default() }
}

#[tokio::test]
async fn memory_pressure_evicts_the_pod_furthest_over_its_request_and_spares_critical_ones() {
    let m = manager(config("memory.available<300Mi", "", ""));
    let node = FakeNode {
        observations: Mutex::new(vec![observed(Signal::MemoryAvailable, 200 * MI, 1000 * MI, 1)]),
        usage: HashMap::from([
            ("uid-hog".to_string(), usage(400)),
            ("uid-guaranteed".to_string(), usage(10)),
            ("uid-static".to_string(), usage(900)),
        ]),
        ..Default::default()
    };
    let mut static_pod = pod("static", None, 0);
    static_pod.metadata.annotations = Some([("kubernetes.io/config.source".into(), "file".into())].into());
    let pods = FakePods {
        pods: vec![pod("guaranteed", Some("64Mi"), 0), static_pod, pod("hog", None, 0)],
        ..Default::default()
    };
    let mut state = State::default();
    assert_eq!(m.round(&mut state, &node, &pods).await, ["uid-hog"]);
    assert!(m.pressure.conditions().contains(&Condition::Memory));
    let evicted = pods.evicted.lock().unwrap().clone();
    let message = "The node was low on resource: memory. Threshold quantity: 300Mi, available: 200Mi. Container main was using 400Mi, request is 0, has larger consumption of memory. ";
    assert_eq!(evicted, [("hog".to_string(), Eviction { grace: 1, message: message.into(), disruption: true })]);
}

#[tokio::test]
async fn disk_pressure_removes_unused_images_before_it_evicts() {
    let m = manager(config("imagefs.available<15%", "", ""));
    let node = FakeNode {
        observations: Mutex::new(vec![
            observed(Signal::ImagefsAvailable, 10, 100, 1),
            observed(Signal::ImagefsAvailable, 40, 100, 1),
        ]),
        ..Default::default()
    };
    let pods = FakePods { pods: vec![pod("p", None, 0)], ..Default::default() };
    assert!(m.round(&mut State::default(), &node, &pods).await.is_empty());
    assert_eq!(*node.images_deleted.lock().unwrap(), 1);
    assert!(pods.evicted.lock().unwrap().is_empty());
    assert!(m.pressure.conditions().contains(&Condition::Disk));
}

#[tokio::test]
async fn disk_pressure_ranks_pods_by_all_they_store_and_names_the_resource() {
    let m = manager(config("nodefs.available<10%", "", ""));
    let disk = |mib: u64| rank::Usage { containers: vec![("main".into(), 0, mib << 20)], ..Default::default() };
    let node = FakeNode {
        // Removing images frees nothing.
        observations: Mutex::new(vec![observed(Signal::NodefsAvailable, 5, 100, 1)]),
        usage: HashMap::from([("uid-layer".to_string(), disk(40)), ("uid-volume".to_string(), disk(1))]),
        empty_dirs: HashMap::from([("uid-volume".to_string(), BTreeMap::from([("cache".to_string(), 100 << 20)]))]),
        ..Default::default()
    };
    let pods = FakePods { pods: vec![pod("layer", None, 0), pod("volume", None, 0)], ..Default::default() };
    assert_eq!(m.round(&mut State::default(), &node, &pods).await, ["uid-volume"]);
    assert_eq!(*node.images_deleted.lock().unwrap(), 1);
    let evicted = pods.evicted.lock().unwrap().clone();
    // The container's own use (its writable layer and logs) is named; the volume is the pod's.
    let message = "The node was low on resource: ephemeral-storage. Threshold quantity: 10, available: 5. Container main was using 1Mi, request is 0, has larger consumption of ephemeral-storage. ";
    assert_eq!(evicted[0].1.message, message);
}

#[tokio::test]
async fn pid_pressure_evicts_the_lower_priority_pod_with_the_most_processes() {
    let m = manager(config("pid.available<100", "", ""));
    let seen = rank::Usage::default();
    let node = FakeNode {
        observations: Mutex::new(vec![observed(Signal::PidAvailable, 50, 4096, 1)]),
        usage: ["few", "many", "important"].map(|n| (format!("uid-{n}"), seen.clone())).into(),
        processes: HashMap::from([
            ("uid-few".to_string(), 3),
            ("uid-many".to_string(), 900),
            ("uid-important".to_string(), 3000),
        ]),
        ..Default::default()
    };
    let pods = FakePods {
        pods: vec![pod("few", None, 0), pod("important", None, 10), pod("many", None, 0)],
        ..Default::default()
    };
    assert_eq!(m.round(&mut State::default(), &node, &pods).await, ["uid-many"]);
    assert_eq!(*node.images_deleted.lock().unwrap(), 0, "PIDs are not reclaimed by removing images");
    assert!(m.pressure.conditions().contains(&Condition::Pid));
}

#[test]
fn soft_evictions_take_the_pods_own_grace_period_unless_a_smaller_maximum_is_set() {
    let mut m = manager(config("", "memory.available<1Gi", "memory.available=1m"));
    let mut own = pod("p", None, 0);
    spec(&mut own).termination_grace_period_seconds = Some(45);
    assert_eq!(m.soft_grace(&own), 45);
    m.config.max_pod_grace = 10;
    assert_eq!(m.soft_grace(&own), 10);
    m.config.max_pod_grace = -1;
    assert_eq!(m.soft_grace(&own), 1);
}

#[tokio::test]
async fn pods_over_their_local_storage_limits_are_evicted_without_a_disruption_condition() {
    let m = manager(config("memory.available<100Mi", "", ""));
    let disk = |mib: u64| rank::Usage { containers: vec![("main".into(), 0, mib << 20)], ..Default::default() };
    let node = FakeNode {
        observations: Mutex::new(vec![observed(Signal::MemoryAvailable, 900 * MI, 1000 * MI, 1)]),
        usage: HashMap::from([
            ("uid-over".to_string(), disk(30)),
            ("uid-within".to_string(), disk(5)),
            ("uid-unlimited".to_string(), disk(500)),
        ]),
        ..Default::default()
    };
    let limited = |name: &str| {
        let mut p = pod(name, None, 0);
        spec(&mut p).containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(
                [(
                    "ephemeral-storage".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("20Mi".into()),
                )]
                .into(),
            ),
            ..Default::default()
        });
        p
    };
    let pods =
        FakePods { pods: vec![limited("over"), limited("within"), pod("unlimited", None, 0)], ..Default::default() };
    let mut off = manager(config("memory.available<100Mi", "", ""));
    off.config.local_storage_isolation = false;
    assert!(off.round(&mut State::default(), &node, &pods).await.is_empty());
    assert_eq!(m.round(&mut State::default(), &node, &pods).await, ["uid-over"]);
    let evicted = pods.evicted.lock().unwrap().clone();
    let message = "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ";
    assert_eq!(evicted, [("over".to_string(), Eviction { grace: 1, message: message.into(), disruption: false })]);
}

#[test]
fn storage_limits_are_checked_in_kubelets_order_with_its_messages() {
    let q = |s: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.into());
    let mut p = pod("p", None, 0);
    spec(&mut p).volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
        name: "scratch".into(),
        empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
            size_limit: Some(q("5Mi")),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    assert!(has_storage_limits(&p));
    let used = |container: u64, scratch: u64| LocalStorage {
        containers: [("main".to_string(), container << 20)].into(),
        empty_dirs: [("scratch".to_string(), scratch << 20)].into(),
    };
    assert_eq!(over_storage_limit(&p, &used(100, 4)), None, "no container limit");
    assert_eq!(
        over_storage_limit(&p, &used(0, 6)).as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"5Mi\". ")
    );
    spec(&mut p).containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some([("ephemeral-storage".to_string(), q("10Mi"))].into()),
        ..Default::default()
    });
    let mut side = spec(&mut p).containers[0].clone();
    side.name = "side".into();
    spec(&mut p).containers.push(side);
    // Within the pod's 20Mi, but one container is over its own 10Mi.
    assert_eq!(
        over_storage_limit(&p, &used(12, 1)).as_deref(),
        Some("Container main exceeded its local ephemeral storage limit \"10Mi\". ")
    );
    assert_eq!(over_storage_limit(&p, &used(9, 1)), None);
    assert!(!has_storage_limits(&pod("plain", None, 0)));
}
