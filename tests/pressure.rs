//! End to end: when room runs out on a real node (the real cairn, its embedded containerd and
//! kubectl). A pod of a high PriorityClass on a node whose CPU is taken by a low-priority pod
//! preempts it: the victim is stopped gracefully and the preemptor runs in its place. An image
//! filesystem (a small tmpfs under containerd's root) filled past the image GC threshold loses its
//! unused image and keeps the one a pod uses. A pod holding memory past a test-lowered
//! `--eviction-hard memory.available` threshold is evicted while a Guaranteed pod runs on; pods
//! over their ephemeral-storage limit or an emptyDir's size limit are evicted; 50 crash-looping
//! containers leave one dead instance each.
//!
//! Needs root, containerd, runc and busybox-static (`.ci/run` installs them).

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::path::{Path, PathBuf};
use std::process::Command;

use busybox::BUSYBOX;
use common::{Server, eventually};
use node::{Node, node_ready};

const CIDR: &str = "10.63.0.0/16";

fn get(node: &Server, what: &str, path: &str) -> String {
    node.ok(&["get", what, "-o", &format!("jsonpath={path}")])
}

/// A busybox pod of `class` (none when empty) requesting `milli_cpu`, which stops at once on
/// SIGTERM.
fn pod(name: &str, class: &str, milli_cpu: i64) -> String {
    let class = if class.is_empty() { String::new() } else { format!("priorityClassName: {class}") };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  {class}
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait; done"]
    resources: {{requests: {{cpu: {milli_cpu}m}}}}
"#
    )
}

fn wait_running(node: &Server, name: &str) {
    eventually(60, || (get(node, &format!("pod/{name}"), "{.status.phase}") == "Running").then_some(()));
}

#[test]
fn a_high_priority_pod_preempts_a_low_priority_one_and_runs() {
    let node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    node.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: background}\nvalue: 10\n---\n\
         apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: important}\nvalue: 1000\n",
    );
    // Each pod asks for 60% of the node's CPU: two cannot run side by side.
    let allocatable = get(&node, "nodes", "{.items[0].status.allocatable.cpu}");
    let milli = match allocatable.strip_suffix('m') {
        Some(m) => m.parse::<i64>().unwrap(),
        None => allocatable.parse::<i64>().unwrap() * 1000,
    } * 6
        / 10;
    node.ok_stdin(&["apply", "-f", "-"], &pod("batch", "background", milli));
    wait_running(&node, "batch");
    let batch_uid = get(&node, "pod/batch", "{.metadata.uid}");

    node.ok_stdin(&["apply", "-f", "-"], &pod("urgent", "important", milli));
    wait_running(&node, "urgent");
    let urgent_uid = get(&node, "pod/urgent", "{.metadata.uid}");
    assert_eq!(
        get(&node, "pod/urgent", "{.status.nominatedNodeName}"),
        get(&node, "nodes", "{.items[0].metadata.name}")
    );
    // The victim went through a graceful stop and is gone.
    eventually(30, || node.ok(&["get", "pods", "-o", "name"]).lines().all(|l| l != "pod/batch").then_some(()));
    let preempted = node.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.uid={batch_uid},reason=Preempted"),
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(preempted.starts_with(&format!("Preempted by pod {urgent_uid} on node ")), "{preempted}");
    let killing = node.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.uid={batch_uid},reason=Killing"),
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(killing.contains("Stopping container main"), "{killing}");
}

/// A tmpfs mounted for a test; unmounted (and the test's directory removed) when dropped, after
/// the node that used it.
struct Tmpfs {
    path: PathBuf,
    top: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str, top: &Path) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status =
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(path).status();
        assert!(status.is_ok_and(|s| s.success()), "mounting a tmpfs at {}", path.display());
        Tmpfs { path: path.to_path_buf(), top: top.to_path_buf() }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

const SPARE: &str = "docker.io/cairn-test/spare:1";

/// The node's images, as its status lists them.
fn node_images(node: &Server) -> String {
    get(node, "nodes", "{.items[0].status.images[*].names}")
}

#[test]
fn a_full_image_filesystem_sheds_unused_images_and_keeps_used_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data/agent/containerd/root");
    let _tmpfs = Tmpfs::mount(&root, "64m", dir.path());
    // A second image with a few MiB of its own, from the air-gap folder, which this node lets go.
    let spare = oci_image::ImageBuilder::new(SPARE)
        .file("/spare", &(0..6u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect::<Vec<u8>>(), 0o644)
        .oci_layout_tar();
    std::fs::create_dir_all(dir.path().join("data/agent/images")).unwrap();
    std::fs::write(dir.path().join("data/agent/images/spare.tar"), spare).unwrap();
    let flags = [
        "--image-gc-high-threshold=60",
        "--image-gc-low-threshold=50",
        "--image-minimum-gc-age=0s",
        "--image-gc-period=1s",
        "--image-gc-air-gapped-images",
    ];
    let node = Node::start_in(dir, "10.64.0.0/16", &flags);
    eventually(60, || node_ready(&node));
    eventually(60, || (node_images(&node).contains(SPARE) && node_images(&node).contains(BUSYBOX)).then_some(()));
    node.ok_stdin(&["apply", "-f", "-"], &pod("user", "", 10));
    wait_running(&node, "user");
    assert!(node_images(&node).contains(SPARE), "nothing goes below the threshold");

    // Fill the image filesystem to 70%.
    let stat = nix::sys::statvfs::statvfs(&root).unwrap();
    let (capacity, available) = (stat.blocks() * stat.fragment_size(), stat.blocks_available() * stat.fragment_size());
    let fill = (capacity * 7 / 10).saturating_sub(capacity - available);
    std::fs::write(root.join("filler"), vec![1u8; fill as usize]).unwrap();

    eventually(60, || (!node_images(&node).contains(SPARE)).then_some(()));
    assert!(node_images(&node).contains(BUSYBOX), "the image a pod uses stays: {}", node_images(&node));
    let failed = eventually(30, || {
        let e = node.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=Node,reason=FreeDiskSpaceFailed",
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        (!e.is_empty()).then_some(e)
    });
    assert!(failed.starts_with("Failed to garbage collect required amount of images. Attempted to free "), "{failed}");
}

/// The machine's memory as cairn reads it (`MemTotal`), in bytes.
fn mem_total() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")).unwrap();
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

fn events(node: &Server, selector: &str) -> String {
    node.ok(&["get", "events", "--field-selector", selector, "-o", "jsonpath={.items[*].message}"])
}

#[test]
fn a_pod_eating_memory_past_the_threshold_is_evicted_and_a_guaranteed_pod_is_spared() {
    // Pods get 600Mi (everything else is reserved for the system); under 300Mi of it left is
    // memory pressure: a pod holding 400Mi brings the node there on its own.
    let reserved = format!("--system-reserved=memory={}", mem_total() - (600 << 20));
    let flags =
        [reserved.as_str(), "--eviction-hard=memory.available<300Mi", "--eviction-pressure-transition-period=30s"];
    let node = Node::start_with("10.65.0.0/16", &flags);
    eventually(60, || node_ready(&node));
    let node_name = get(&node, "nodes", "{.items[0].metadata.name}");
    node.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: steady}}
spec:
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources:
      requests: {{cpu: 100m, memory: 64Mi}}
      limits: {{cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: hog}}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: hog
    image: {BUSYBOX}
    imagePullPolicy: Never
    # tail keeps the whole newline-free input in memory while it waits for more.
    command: ["sh", "-c", "(head -c 419430400 /dev/zero; sleep 3600) | tail > /dev/null"]
"#
        ),
    );
    wait_running(&node, "steady");
    let hog_uid = get(&node, "pod/hog", "{.metadata.uid}");
    eventually(120, || (get(&node, "pod/hog", "{.status.phase}") == "Failed").then_some(()));
    assert_eq!(get(&node, "pod/hog", "{.status.reason}"), "Evicted");
    let message = get(&node, "pod/hog", "{.status.message}");
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: 300Mi, available: "),
        "{message}"
    );
    assert!(
        message.contains("Container hog was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = get(&node, "pod/hog", r#"{.status.conditions[?(@.type=="DisruptionTarget")].reason}"#);
    assert_eq!(disruption, "TerminationByKubelet");
    let evicted = events(&node, &format!("involvedObject.uid={hog_uid},reason=Evicted"));
    assert_eq!(evicted, message);
    assert!(!events(&node, "involvedObject.kind=Node,reason=NodeHasInsufficientMemory").is_empty());
    assert_eq!(events(&node, "involvedObject.kind=Node,reason=EvictionThresholdMet"), "Attempting to reclaim memory");

    // The Guaranteed pod kept running, never restarted.
    assert_eq!(get(&node, "pod/steady", "{.status.phase}"), "Running");
    assert_eq!(get(&node, "pod/steady", "{.status.containerStatuses[0].restartCount}"), "0");

    // The condition holds for the transition period: a BestEffort pod sent straight to the node
    // (the scheduler would keep it off the tainted node) is turned away meanwhile.
    let pressure = r#"{.items[0].status.conditions[?(@.type=="MemoryPressure")].status}"#;
    assert_eq!(get(&node, "nodes", pressure), "True");
    let taints = || get(&node, "nodes", "{.items[0].spec.taints[*].key}");
    eventually(30, || taints().contains("node.kubernetes.io/memory-pressure").then_some(()));
    node.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: late}}\nspec:\n  nodeName: {node_name}\n  containers:\n  - {{name: main, image: {BUSYBOX}, imagePullPolicy: Never, command: [sleep, '3600']}}\n"
        ),
    );
    eventually(30, || (get(&node, "pod/late", "{.status.phase}") == "Failed").then_some(()));
    assert_eq!(get(&node, "pod/late", "{.status.reason}"), "Evicted");
    assert_eq!(
        get(&node, "pod/late", "{.status.message}"),
        "Pod was rejected: The node had condition: [MemoryPressure]. "
    );
    // The pressure is gone: after the transition period the condition is False again.
    eventually(90, || (get(&node, "nodes", pressure) == "False").then_some(()));
    eventually(30, || (!taints().contains("node.kubernetes.io/memory-pressure")).then_some(()));
    assert!(!events(&node, "involvedObject.kind=Node,reason=NodeHasSufficientMemory").is_empty());
}

/// The pod's containers in containerd, by name: (exited, all).
fn containers_by_name(socket: &Path, pod: &str) -> std::collections::BTreeMap<String, (usize, usize)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let labels = [("io.kubernetes.pod.name".to_string(), pod.to_string())].into();
        let filter = cri::ContainerFilter { label_selector: labels, ..Default::default() };
        let listed = cri::Cri::new(socket).list_containers(cri::ListContainersRequest { filter: Some(filter) }).await;
        let mut out = std::collections::BTreeMap::new();
        for c in listed.unwrap().containers {
            let name = c.labels.get("io.kubernetes.container.name").cloned().unwrap_or_default();
            let entry: &mut (usize, usize) = out.entry(name).or_default();
            entry.0 += usize::from(c.state == cri::ContainerState::ContainerExited as i32);
            entry.1 += 1;
        }
        out
    })
}

#[test]
fn crash_looping_containers_leave_one_dead_instance_each() {
    const CONTAINERS: usize = 50;
    let node = Node::start("10.66.0.0/16");
    eventually(60, || node_ready(&node));
    let containers: String = (0..CONTAINERS)
        .map(|i| {
            format!(
                "  - {{name: c{i}, image: {BUSYBOX}, imagePullPolicy: Never, command: [sh, -c, 'echo run; exit 1']}}\n"
            )
        })
        .collect();
    node.ok_stdin(
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: crashy}}\nspec:\n  containers:\n{containers}"),
    );
    let socket = node.dir.path().join("data/agent/containerd/containerd.sock");
    // Every container has run at least three times (two restarts, 10 s and 20 s of back-off), and
    // of the instances before the newest only the last dead one is left (kubelet's
    // `MaxPerPodContainer` of 1), with its log.
    let restarts = || get(&node, "pod/crashy", "{.status.containerStatuses[*].restartCount}");
    eventually(240, || {
        let counts: Vec<u32> = restarts().split_whitespace().filter_map(|r| r.parse().ok()).collect();
        (counts.len() == CONTAINERS && counts.iter().all(|r| *r >= 2)).then_some(())
    });
    let by_name = eventually(60, || {
        let by_name = containers_by_name(&socket, "crashy");
        (by_name.len() == CONTAINERS && by_name.values().all(|(exited, all)| *exited <= 1 && *all <= 2))
            .then_some(by_name)
    });
    assert!(by_name.values().all(|(exited, _)| *exited == 1), "{by_name:?}");
    assert_eq!(node.ok(&["logs", "crashy", "-c", "c7", "--previous"]).trim(), "run");
    let uid = get(&node, "pod/crashy", "{.metadata.uid}");
    let logs = node.dir.path().join(format!("data/agent/logs/pods/default_crashy_{uid}/c7"));
    let files = std::fs::read_dir(&logs).unwrap().count();
    assert!((1..=2).contains(&files), "{files} log files in {}", logs.display());
}

#[test]
fn pods_over_their_local_storage_limits_are_evicted() {
    let node = Node::start("10.67.0.0/16");
    eventually(60, || node_ready(&node));
    let pod = |name: &str, limit: &str, volumes: &str, write: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "{write}; sleep 3600"]
    resources: {{limits: {{ephemeral-storage: {limit}}}}}
{volumes}"#
        )
    };
    let scratch = "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n  volumes:\n  - name: scratch\n    emptyDir: {sizeLimit: 5Mi}\n";
    let pods = [
        pod("filler", "10Mi", "", "dd if=/dev/zero of=/big bs=1048576 count=20"),
        pod("scratchy", "100Mi", scratch, "dd if=/dev/zero of=/scratch/big bs=1048576 count=8"),
        pod("calm", "10Mi", scratch, "dd if=/dev/zero of=/scratch/small bs=1048576 count=1"),
    ];
    node.ok_stdin(&["apply", "-f", "-"], &pods.join("---\n"));
    let failed = |name: &str| {
        eventually(120, || (get(&node, &format!("pod/{name}"), "{.status.phase}") == "Failed").then_some(()))
    };
    failed("scratchy");
    assert_eq!(get(&node, "pod/scratchy", "{.status.reason}"), "Evicted");
    assert_eq!(
        get(&node, "pod/scratchy", "{.status.message}"),
        r#"Usage of EmptyDir volume "scratch" exceeds the limit "5Mi". "#
    );
    // The writable layer's use is what containerd last measured (every 10 s).
    failed("filler");
    assert_eq!(get(&node, "pod/filler", "{.status.reason}"), "Evicted");
    // One container: the pod's total limit is its limit, and the pod's total is checked first.
    assert_eq!(
        get(&node, "pod/filler", "{.status.message}"),
        "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
    );
    // Limits are not node pressure: no DisruptionTarget condition, as kubelet.
    assert_eq!(get(&node, "pod/filler", r#"{.status.conditions[?(@.type=="DisruptionTarget")].type}"#), "");
    assert_eq!(get(&node, "pod/calm", "{.status.phase}"), "Running");
}
