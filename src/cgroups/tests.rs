use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use cgroups_rs::CgroupPid;
use serde_json::{Value, json};

use super::resources::*;
use super::*;

fn pod(spec: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap()
}

fn c(name: &str, resources: Value) -> Value {
    json!({"name": name, "image": "busybox", "resources": resources})
}

fn rl(cpu: &str, memory: &str) -> Value {
    let mut m = serde_json::Map::new();
    if !cpu.is_empty() {
        m.insert("cpu".into(), json!(cpu));
    }
    if !memory.is_empty() {
        m.insert("memory".into(), json!(memory));
    }
    Value::Object(m)
}

fn containers(list: &[Value]) -> Value {
    json!({"containers": list})
}

// Upstream TestComputePodQOS: container-level cases, 2-container and mixed cases, their
// init-container variants and the pod-level-resources variants.
#[test]
fn qos_class_matches_upstream_table() {
    let guaranteed = json!({"requests": {"cpu": "100m", "memory": "100Mi", "ephemeral-storage": "10Gi"}, "limits": rl("100m", "100Mi")});
    let best_effort =
        [json!({}), json!({"requests": rl("0", "0")}), json!({"requests": {"ephemeral-storage": "10Gi"}})];
    let burstable = [
        json!({"requests": rl("100m", "100Mi"), "limits": rl("200m", "200Mi")}),
        json!({"requests": rl("100m", "100Mi"), "limits": rl("100m", "200Mi")}),
        json!({"requests": rl("100m", "100Mi"), "limits": rl("200m", "100Mi")}),
        json!({"requests": rl("100m", "100Mi")}),
        json!({"requests": rl("100m", "100Mi"), "limits": rl("100m", "")}),
    ];
    let mut single = vec![(guaranteed.clone(), QosClass::Guaranteed)];
    single.extend(best_effort.iter().map(|r| (r.clone(), QosClass::BestEffort)));
    single.extend(burstable.iter().map(|r| (r.clone(), QosClass::Burstable)));
    for (res, want) in &single {
        assert_eq!(qos_class(&pod(containers(&[c("a", res.clone())]))), *want, "{res}");
        // Pod-level resources decide over (guaranteed) container resources.
        let plr = json!({"resources": res, "containers": [c("a", guaranteed.clone())]});
        assert_eq!(qos_class(&pod(plr)), *want, "pod-level {res}");
    }
    let mut pairs = vec![
        (guaranteed.clone(), guaranteed.clone(), QosClass::Guaranteed),
        (best_effort[0].clone(), best_effort[1].clone(), QosClass::BestEffort),
        (burstable[0].clone(), burstable[1].clone(), QosClass::Burstable),
    ];
    let firsts = [guaranteed.clone(), best_effort[0].clone(), burstable[0].clone()];
    let seconds = [guaranteed.clone(), best_effort[1].clone(), burstable[1].clone()];
    for (i, a) in firsts.iter().enumerate() {
        for (j, b) in seconds.iter().enumerate() {
            if i != j {
                pairs.push((a.clone(), b.clone(), QosClass::Burstable));
            }
        }
    }
    for (a, b, want) in pairs {
        assert_eq!(qos_class(&pod(containers(&[c("a", a.clone()), c("b", b.clone())]))), want, "{a} {b}");
        let with_init = json!({"containers": [c("a", a.clone())], "initContainers": [c("b", b.clone())]});
        assert_eq!(qos_class(&pod(with_init)), want, "init {a} {b}");
    }
}

#[test]
fn qos_class_prefers_the_recorded_status() {
    let mut p = pod(containers(&[c("a", json!({}))]));
    assert_eq!(qos_class(&p), QosClass::BestEffort);
    p.status = Some(serde_json::from_value(json!({"qosClass": "Burstable"})).unwrap());
    assert_eq!(qos_class(&p), QosClass::Burstable);
    assert_eq!(compute_qos_class(&p), QosClass::BestEffort);
    assert_eq!(QosClass::Guaranteed.as_str(), "Guaranteed");
    assert_eq!(QosClass::parse("BestEffort"), Some(QosClass::BestEffort));
}

#[test]
fn pod_resources_follow_resource_config_for_pod() {
    let both = |cpu: &str, mem: &str| json!({"requests": rl(cpu, mem), "limits": rl(cpu, mem)});
    // Guaranteed: requests summed, every limit applied.
    let r = pod_resources(&pod(containers(&[c("a", both("100m", "100Mi")), c("b", both("200m", "100Mi"))])));
    assert_eq!(
        (r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit),
        (307, Some(30_000), 100_000, Some(200 << 20))
    );
    // Burstable with limits in every container.
    let burst = json!({"requests": rl("100m", "64Mi"), "limits": rl("500m", "128Mi")});
    let r = pod_resources(&pod(containers(&[c("a", burst.clone())])));
    assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit), (102, Some(50_000), Some(128 << 20)));
    // A container without a CPU limit (or an init container without one) drops the pod's quota.
    let no_cpu_limit = json!({"requests": rl("100m", ""), "limits": rl("", "128Mi")});
    let r = pod_resources(&pod(containers(&[c("a", burst.clone()), c("b", no_cpu_limit)])));
    assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit), (204, None, Some(256 << 20)));
    let r = pod_resources(&pod(json!({"containers": [c("a", burst.clone())], "initContainers": [c("i", json!({}))]})));
    assert_eq!((r.cpu_quota, r.memory_limit), (None, None));
    // BestEffort: minimum shares only.
    let r = pod_resources(&pod(containers(&[c("a", json!({}))])));
    assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit), (MIN_SHARES, None, None));
    // Init containers: the larger of the app sum and any init container.
    let init = json!({"containers": [c("a", json!({"requests": rl("100m", "")}))], "initContainers": [c("i", json!({"requests": rl("500m", "")}))]});
    assert_eq!(pod_resources(&pod(init)).cpu_shares, 512);
    // Sidecars run alongside: app 100m + sidecar 200m; the later init container needs 250m + 200m.
    let mut sidecar = c("s", json!({"requests": rl("200m", "")}));
    sidecar["restartPolicy"] = json!("Always");
    let spec = json!({"containers": [c("a", json!({"requests": rl("100m", "")}))],
        "initContainers": [sidecar, c("i", json!({"requests": rl("250m", "")}))]});
    assert_eq!(pod_resources(&pod(spec.clone())).cpu_shares, 460);
    assert_eq!(pod_cpu_request(&pod(spec)), 450);
    // Pod-level resources and overhead.
    let spec = json!({"resources": {"requests": rl("1", "1Gi"), "limits": rl("2", "2Gi")}, "overhead": rl("100m", "10Mi"),
        "containers": [c("a", json!({}))]});
    let r = pod_resources(&pod(spec));
    assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit), (1126, Some(210_000), Some((2 << 30) + (10 << 20))));
    // Hugepages from the requests, by page size.
    let huge = json!({"requests": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "4Mi"}, "limits": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "4Mi"}});
    assert_eq!(pod_resources(&pod(containers(&[c("a", huge)]))).hugepage_limits, BTreeMap::from([(2 << 20, 4 << 20)]));
}

#[test]
fn cpu_conversions_match_kubelet_and_runc() {
    assert_eq!(milli_cpu_to_shares(0), 2);
    assert_eq!(milli_cpu_to_shares(1), 2);
    assert_eq!(milli_cpu_to_shares(1000), 1024);
    assert_eq!(milli_cpu_to_shares(300_000), MAX_SHARES);
    assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
    assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD), 1000);
    assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD), 25_000);
    assert_eq!(milli_cpu_to_quota(2000, QUOTA_PERIOD), 200_000);
    let weights: Vec<u64> = [0, 2, 1024, 262_144, 300_000].into_iter().map(shares_to_weight).collect();
    assert_eq!(weights, [0, 1, 100, 10_000, 10_000]);
    assert!(shares_to_weight(512) < 100 && shares_to_weight(2048) > 100);
    assert_eq!(hugepage_size_name(2 << 20), "2MB");
    assert_eq!(hugepage_size_name(1 << 30), "1GB");
}

#[test]
fn container_resources_follow_kubelet() {
    let spec = containers(&[c("a", json!({"requests": rl("250m", "64Mi"), "limits": rl("500m", "128Mi")}))]);
    let p = pod(spec);
    let res = container_resources(&p, &p.spec.as_ref().unwrap().containers[0], 8_000_000_000);
    assert_eq!((res.cpu_shares, res.cpu_quota, res.cpu_period), (256, 50_000, 100_000));
    assert_eq!(res.memory_limit_in_bytes, 128 << 20);
    assert_eq!(res.oom_score_adj, 1000 - 1000 * (64 << 20) / 8_000_000_000);
    // A limit without a request: shares from the limit.
    let p = pod(containers(&[c("a", json!({"limits": {"cpu": "1", "hugepages-2Mi": "4Mi"}}))]));
    let res = container_resources(&p, &p.spec.as_ref().unwrap().containers[0], 8_000_000_000);
    assert_eq!((res.cpu_shares, res.cpu_quota, res.memory_limit_in_bytes), (1024, 100_000, 0));
    assert_eq!(res.hugepage_limits, [HugepageLimit { page_size: "2MB".into(), limit: 4 << 20 }]);
    // Nothing set: minimum shares, no quota, no memory limit, BestEffort score.
    let p = pod(containers(&[c("a", json!({}))]));
    let res = container_resources(&p, &p.spec.as_ref().unwrap().containers[0], 8_000_000_000);
    assert_eq!((res.cpu_shares, res.cpu_quota, res.cpu_period, res.oom_score_adj), (2, 0, 100_000, 1000));
}

/// Upstream TestGetContainerOOMScoreAdjust: (pod spec, capacity, container → (low, high)).
#[test]
fn oom_score_adj_matches_upstream_table() {
    const STD: u64 = 8_000_000_000;
    let single = |res: Value| containers(&[c("x", res)]);
    let mem_req = |bytes: u64| json!(bytes.to_string());
    let sample = json!({"requests": {"memory": mem_req(STD / 8)}, "limits": {"memory": mem_req(1000 + STD / 8)}});
    let sidecar = |name: &str, req: u64| {
        json!({"name": name, "image": "i", "restartPolicy": "Always",
            "resources": {"requests": {"memory": mem_req(req)}, "limits": {"memory": mem_req(1000 + STD / 8)}}})
    };
    let mixed = |side: Option<Value>| {
        let mut init = vec![c("init-container", sample.clone())];
        init.extend(side);
        json!({"initContainers": init, "containers": [c("main-1", sample.clone())]})
    };
    let pod_level = |req: u64, lim: u64, list: Value| {
        let mut spec = list;
        spec["resources"] =
            json!({"requests": {"cpu": "5m", "memory": mem_req(req)}, "limits": {"cpu": "5m", "memory": mem_req(lim)}});
        spec
    };
    let guaranteed_c = |mem: u64| json!({"requests": {"cpu": "5m", "memory": mem_req(mem)}, "limits": {"cpu": "5m", "memory": mem_req(mem)}});
    /// Containers by name with the bounds of their expected score.
    type Expected = Vec<(&'static str, i64, i64)>;
    let cases: Vec<(Value, u64, Expected)> = vec![
        (single(json!({"limits": {"cpu": "10"}})), 4_000_000_000, vec![("x", 999, 999)]),
        (single(json!({"requests": {"cpu": "0"}, "limits": {"memory": "10G"}})), STD, vec![("x", 999, 999)]),
        (single(json!({"limits": {"memory": "0"}})), 7_230_457_451, vec![("x", 1000, 1000)]),
        (single(json!({})), 4_000_000_000, vec![("x", 1000, 1000)]),
        (single(json!({"requests": rl("5m", "10G"), "limits": rl("5m", "10G")})), 123_456_789, vec![("x", -997, -997)]),
        (
            single(json!({"requests": {"memory": mem_req(STD / 2), "cpu": "5m"}, "limits": {"memory": "10G"}})),
            STD,
            vec![("x", 495, 505)],
        ),
        (single(json!({"requests": {"memory": mem_req(STD - 1), "cpu": "5m"}})), STD, vec![("x", 3, 3)]),
        (single(sample.clone()), STD, vec![("x", 875, 880)]),
        (mixed(None), STD, vec![("init-container", 875, 880), ("main-1", 875, 880)]),
        (
            mixed(Some(sidecar("small", STD / 20))),
            STD,
            vec![("init-container", 875, 880), ("small", 875, 875), ("main-1", 875, 875)],
        ),
        (mixed(Some(sidecar("same", STD / 8))), STD, vec![("same", 875, 875), ("main-1", 875, 875)]),
        (mixed(Some(sidecar("big", STD / 2))), STD, vec![("big", 500, 500), ("main-1", 875, 875)]),
        (
            pod_level(STD / 4, STD / 4, containers(&[c("n1", json!({})), c("n2", json!({}))])),
            4_000_000_000,
            vec![("n1", -997, -997)],
        ),
        (
            pod_level(STD / 4, 1000 + STD / 4, containers(&[c("n1", json!({})), c("n2", json!({}))])),
            4_000_000_000,
            vec![("n1", 750, 750), ("n2", 750, 750)],
        ),
        (
            pod_level(
                STD / 4,
                1000 + STD / 4,
                containers(&[c("g1", guaranteed_c(STD / 8)), c("g2", guaranteed_c(STD / 8))]),
            ),
            4_000_000_000,
            vec![("g1", 750, 750), ("g2", 750, 750)],
        ),
        (
            pod_level(
                STD / 4,
                1000 + STD / 4,
                containers(&[
                    c(
                        "b",
                        json!({"requests": {"cpu": "3m", "memory": mem_req(STD / 8)}, "limits": {"cpu": "5m", "memory": mem_req(STD / 8)}}),
                    ),
                    c("e", json!({})),
                ]),
            ),
            4_000_000_000,
            vec![("b", 625, 625), ("e", 875, 875)],
        ),
        (
            pod_level(
                2_000_000_000,
                1000 + STD / 4,
                json!({
                "containers": [c("c1", guaranteed_c(1_000_000_000)), c("c2", guaranteed_c(500_000_000))],
                "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always", "resources": guaranteed_c(200_000_000)}]}),
            ),
            4_000_000_000,
            vec![("c1", 725, 725), ("c2", 850, 850), ("s", 850, 850)],
        ),
    ];
    for (spec, capacity, expected) in cases {
        let p = pod(spec.clone());
        let s = p.spec.as_ref().unwrap();
        for (name, low, high) in expected {
            let container =
                s.containers.iter().chain(s.init_containers.iter().flatten()).find(|c| c.name == name).unwrap();
            let adj = oom_score_adj(&p, container, capacity);
            assert!((low..=high).contains(&adj), "{name}: {adj} not in {low}..={high} for {spec}");
        }
    }
    // Critical pods: only node-critical ones are protected like Guaranteed.
    let critical = |class: &str, priority: i64| {
        let mut spec = containers(&[c("x", json!({}))]);
        spec["priorityClassName"] = json!(class);
        spec["priority"] = json!(priority);
        pod(spec)
    };
    let cluster = critical("system-cluster-critical", 2_000_000_000);
    assert_eq!(oom_score_adj(&cluster, &cluster.spec.as_ref().unwrap().containers[0], 4_000_000_000), 1000);
    let node = critical("system-node-critical", 2_000_001_000);
    assert_eq!(oom_score_adj(&node, &node.spec.as_ref().unwrap().containers[0], 4_000_000_000), -997);
}

fn manager(driver: Driver, root: &str) -> Manager {
    Manager { driver, version: Version::V1, root: CgroupName(vec![root.to_string()]) }
}

#[test]
fn pod_parent_names_like_kubelet() {
    let uid = "4c0b2f5e-1a2b-4c3d-8e9f-0123456789ab";
    let fs = manager(Driver::Cgroupfs, "kubepods");
    assert_eq!(fs.pod_parent(uid, QosClass::Guaranteed), format!("/kubepods/pod{uid}"));
    assert_eq!(fs.pod_parent(uid, QosClass::Burstable), format!("/kubepods/burstable/pod{uid}"));
    assert_eq!(fs.pod_parent(uid, QosClass::BestEffort), format!("/kubepods/besteffort/pod{uid}"));
    let sd = manager(Driver::Systemd, "kubepods");
    let esc = uid.replace('-', "_");
    assert_eq!(sd.pod_parent(uid, QosClass::Guaranteed), format!("/kubepods.slice/kubepods-pod{esc}.slice"));
    assert_eq!(
        sd.pod_parent(uid, QosClass::Burstable),
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{esc}.slice")
    );
    assert_eq!(
        sd.pod_parent(uid, QosClass::BestEffort),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{esc}.slice")
    );
    // Directory names map back to the UID, and only in their own tier.
    assert_eq!(sd.pod_uid(&format!("kubepods-burstable-pod{esc}.slice"), QosClass::Burstable).as_deref(), Some(uid));
    assert_eq!(sd.pod_uid(&format!("kubepods-burstable-pod{esc}.slice"), QosClass::BestEffort), None);
    assert_eq!(sd.pod_uid("kubepods-burstable.slice", QosClass::Guaranteed), None);
    assert_eq!(fs.pod_uid(&format!("pod{uid}"), QosClass::Guaranteed).as_deref(), Some(uid));
    assert_eq!(fs.pod_uid("burstable", QosClass::Guaranteed), None);
    assert!(matches!(valid_component("../x"), Err(Error::InvalidName(_))));
}

// ---- Root tests: real cgroups under a unique root, removed at the end. ----

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn read(dir: &Path, file: &str) -> String {
    fs::read_to_string(dir.join(file)).unwrap().trim().to_string()
}

fn controller_dir<C>(m: &Manager, name: &CgroupName) -> PathBuf
where
    C: Controller,
    for<'a> &'a C: From<&'a cgroups_rs::fs::Subsystem>,
    C: cgroups_rs::fs::ControllIdentifier,
{
    m.cgroup(name).controller_of::<C>().unwrap().path().to_path_buf()
}

/// A `sleep` placed in the pod cgroup of every controller.
fn spawn_in(m: &Manager, name: &CgroupName) -> std::process::Child {
    let child = Command::new("sleep").arg("600").spawn().unwrap();
    m.cgroup(name).add_task_by_tgid(CgroupPid::from(&child)).unwrap();
    child
}

#[test]
fn manager_creates_limits_lists_and_removes_pod_cgroups() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let root = format!("cairntest-life-{}", std::process::id());
    let m = Manager::new(Driver::Cgroupfs, &root).unwrap();
    let result = std::panic::catch_unwind(|| {
        for tier in [m.root.clone(), m.root.child(BURSTABLE), m.root.child(BEST_EFFORT)] {
            let dirs = m.dirs(&tier);
            assert!(!dirs.is_empty() && dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
        }
        let best_effort = controller_dir::<CpuController>(&m, &m.root.child(BEST_EFFORT));
        match m.version {
            Version::V1 => assert_eq!(read(&best_effort, "cpu.shares"), "2"),
            Version::V2 => assert_eq!(read(&best_effort, "cpu.weight"), "1"),
        }

        let uid = "0b7e7e7e-1111-2222-3333-444455556666";
        let res = PodResources {
            cpu_shares: 256,
            cpu_quota: Some(50_000),
            memory_limit: Some(64 << 20),
            ..pod_resources(&pod(containers(&[])))
        };
        m.ensure_pod(uid, QosClass::Burstable, &res).unwrap();
        m.ensure_pod(uid, QosClass::Burstable, &res).unwrap();
        let name = m.pod_name(uid, QosClass::Burstable);
        let cpu = controller_dir::<CpuController>(&m, &name);
        let memory = controller_dir::<MemController>(&m, &name);
        match m.version {
            Version::V1 => {
                assert_eq!(read(&cpu, "cpu.shares"), "256");
                assert_eq!(read(&cpu, "cpu.cfs_quota_us"), "50000");
                assert_eq!(read(&cpu, "cpu.cfs_period_us"), "100000");
                assert_eq!(read(&memory, "memory.limit_in_bytes"), (64u64 << 20).to_string());
                if let Some(cpuset) = m.cgroup(&name).controller_of::<cgroups_rs::fs::cpuset::CpuSetController>() {
                    assert!(!read(cpuset.path(), "cpuset.cpus").is_empty());
                }
            }
            Version::V2 => {
                assert_eq!(read(&cpu, "cpu.weight"), shares_to_weight(256).to_string());
                assert_eq!(read(&cpu, "cpu.max"), "50000 100000");
                assert_eq!(read(&memory, "memory.max"), (64u64 << 20).to_string());
            }
        }
        assert_eq!(m.pods().unwrap(), vec![(uid.to_string(), QosClass::Burstable)]);

        assert_eq!(m.pod_processes(uid, QosClass::Burstable), Some(0));
        let mut child = spawn_in(&m, &name);
        assert_eq!(m.pod_processes(uid, QosClass::Burstable), Some(1));
        m.remove_pod(uid, QosClass::Burstable).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(m.dirs(&name).iter().all(|d| !d.exists()));
        assert!(m.pods().unwrap().is_empty());
        m.remove_pod(uid, QosClass::Burstable).unwrap();
    });
    m.remove_all().unwrap();
    assert!(m.dirs(&m.root).iter().all(|d| !d.exists()));
    result.unwrap();
}

#[test]
fn cgroup_roots_parse_as_kubelet_parses_them() {
    let parse = |driver, name| CgroupName::parse(driver, name).unwrap().0;
    assert!(parse(Driver::Cgroupfs, "/").is_empty());
    assert_eq!(parse(Driver::Cgroupfs, "/edge/agent-1/"), ["edge", "agent-1"]);
    assert!(parse(Driver::Systemd, "/").is_empty());
    assert!(parse(Driver::Systemd, "-.slice").is_empty());
    assert_eq!(parse(Driver::Systemd, "/edge.slice/edge-agent_1.slice"), ["edge", "agent-1"]);
    assert!(matches!(CgroupName::parse(Driver::Cgroupfs, "/a/../b"), Err(Error::InvalidName(_))));
    let m = |driver, root| Manager { driver, version: Version::V2, root: CgroupName::parse(driver, root).unwrap() };
    assert_eq!(
        m(Driver::Cgroupfs, "/edge/kubepods").pod_parent("u", QosClass::Burstable),
        "/edge/kubepods/burstable/podu"
    );
    assert_eq!(
        m(Driver::Systemd, "edge-kubepods.slice").pod_parent("u-1", QosClass::BestEffort),
        "/edge.slice/edge-kubepods.slice/edge-kubepods-besteffort.slice/edge-kubepods-besteffort-podu_1.slice"
    );
}

#[test]
fn systemd_driver_lays_out_slices() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let root = format!("/cairntest_sd_{}.slice", std::process::id());
    let m = Manager::new(Driver::Systemd, &root).unwrap();
    let result = std::panic::catch_unwind(|| {
        let uid = "aaaa-bbbb";
        let res =
            pod_resources(&pod(containers(&[c("a", json!({"requests": rl("1", "32Mi"), "limits": rl("1", "32Mi")}))])));
        m.ensure_pod(uid, QosClass::Guaranteed, &res).unwrap();
        let escaped = format!("cairntest_sd_{}-kubepods", std::process::id());
        let dir = controller_dir::<MemController>(&m, &m.pod_name(uid, QosClass::Guaranteed));
        assert!(dir.ends_with(format!("{escaped}.slice/{escaped}-podaaaa_bbbb.slice")), "{dir:?}");
        assert!(dir.is_dir());
        assert_eq!(m.pods().unwrap(), vec![(uid.to_string(), QosClass::Guaranteed)]);
        m.remove_pod(uid, QosClass::Guaranteed).unwrap();
        assert!(!dir.exists());
    });
    m.remove_all().unwrap();
    result.unwrap();
}

#[test]
fn memory_limit_oom_kills_the_process() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let root = format!("cairntest-oom-{}", std::process::id());
    let m = Manager::new(Driver::Cgroupfs, &root).unwrap();
    let result = std::panic::catch_unwind(|| {
        let uid = "oom";
        let res = pod_resources(&pod(containers(&[c(
            "a",
            json!({"requests": rl("100m", "32Mi"), "limits": rl("100m", "32Mi")}),
        )])));
        assert_eq!(res.memory_limit, Some(32 << 20));
        m.ensure_pod(uid, QosClass::Guaranteed, &res).unwrap();
        let name = m.pod_name(uid, QosClass::Guaranteed);
        // The shell joins the cgroup, then waits for a line before turning into a 128 MiB allocation.
        let mut child = Command::new("sh")
            .args(["-c", "read x; exec dd if=/dev/zero of=/dev/null bs=128M count=1"])
            .stdin(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        m.cgroup(&name).add_task_by_tgid(CgroupPid::from(&child)).unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        m.remove_pod(uid, QosClass::Guaranteed).unwrap();
    });
    m.remove_all().unwrap();
    result.unwrap();
}

#[test]
fn the_memory_controller_is_found_or_missed() {
    let v1 = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t3\t1\t1\nmemory\t4\t25\t1\n";
    assert!(memory_controller_enabled(Version::V1, v1));
    // Raspberry Pi OS without cgroup_enable=memory: listed, disabled.
    assert!(!memory_controller_enabled(Version::V1, &v1.replace("25\t1", "25\t0")));
    assert!(memory_controller_enabled(Version::V2, "cpuset cpu io memory hugetlb pids rdma misc\n"));
    assert!(!memory_controller_enabled(Version::V2, "cpuset cpu io pids\n"));
}
