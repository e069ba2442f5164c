//! End to end: PersistentVolumes, claims and classes against the real cairn, its embedded containerd
//! and kubectl. The built-in `local-path` class provisions through cairn's own CSI driver; a second
//! driver runs as a separate process (`cairn csi-hostpath`) and registers through the plugin socket
//! directory, as an external driver does: it attaches its volumes (VolumeAttachments), takes one
//! volume per node, and starts on a full disk. One node serves every check (each uses its own claims
//! and pods); the last check kills cairn with SIGKILL under a running pod with a claim.
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
use std::process::{Child, Command, Stdio};

use busybox::BUSYBOX;
use common::{Server, eventually};
use node::{Node, node_ready};

const CIDR: &str = "10.46.0.0/16";

fn get(node: &Server, what: &str, path: &str) -> String {
    let out = node.kubectl(&["get", what, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `kubectl get <what> -o jsonpath=<path>` prints `want`.
fn wait_for(node: &Server, what: &str, path: &str, want: &str) {
    let mut last = String::new();
    for _ in 0..600 {
        last = get(node, what, path);
        if last == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!(
        "{what} {path}: wanted {want:?}, still {last:?}\n{}\n--- server log ---\n{}",
        node.ok(&["get", "pv,pvc,pods", "-o", "wide"]),
        node.log()
    );
}

fn gone(node: &Server, what: &str) -> bool {
    let out = node.kubectl(&["get", what, "--ignore-not-found", "-o", "name"]);
    out.status.success() && out.stdout.is_empty()
}

fn events_of(node: &Server, name: &str) -> String {
    node.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "custom-columns=R:.reason,M:.message",
    ])
}

fn claim(name: &str, class: Option<&str>, size: &str) -> String {
    claim_with_mode(name, class, size, "ReadWriteOnce")
}

fn claim_with_mode(name: &str, class: Option<&str>, size: &str, mode: &str) -> String {
    let class = class.map(|c| format!("  storageClassName: {c:?}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n  accessModes: [{mode}]\n  resources: {{requests: {{storage: {size}}}}}\n{class}"
    )
}

/// A busybox pod mounting `claim` at /data and running `script`.
fn pod(name: &str, claim: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 0
  securityContext: {{fsGroup: 2000}}
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", {script:?}]
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]
"#
    )
}

fn running(node: &Server, name: &str) {
    wait_for(node, &format!("pod/{name}"), "{.status.phase}", "Running");
}

fn exec(node: &Server, pod: &str, script: &str) -> String {
    node.ok(&["exec", pod, "--", "sh", "-c", script])
}

/// The directories the built-in driver has made.
fn local_volumes(node: &Server) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(node.dir.path().join("data/storage"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// How many mounts there are under `dir`.
fn mounted_under(dir: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| Path::new(p).starts_with(dir)).count()
}

/// The default class: a claim waits for its first consumer, is provisioned on the pod's node, keeps
/// its data across pods, grows on request, stays while in use, and takes its directory with it.
fn check_default_class(node: &Server) {
    let classes = node.ok(&["get", "storageclass"]);
    assert!(classes.contains("local-path (default)"), "{classes}");
    assert!(classes.contains("hostpath.csi.cairn.io") && classes.contains("WaitForFirstConsumer"), "{classes}");
    assert!(node.ok(&["get", "csinode"]).contains(" 1 "), "the built-in driver is registered");

    node.ok_stdin(&["apply", "-f", "-"], &claim("data", None, "1Gi"));
    assert_eq!(get(node, "pvc/data", "{.spec.storageClassName}"), "local-path", "the default class is assigned");
    eventually(30, || {
        events_of(node, "data").contains("waiting for first consumer to be created before binding").then_some(())
    });
    assert_eq!(get(node, "pvc/data", "{.status.phase}"), "Pending", "no consumer, no volume");

    node.ok_stdin(&["apply", "-f", "-"], &pod("writer", "data", "echo kept > /data/file; sleep 3600"));
    running(node, "writer");
    wait_for(node, "pvc/data", "{.status.phase}", "Bound");
    let pv = get(node, "pvc/data", "{.spec.volumeName}");
    let host = get(node, "pod/writer", "{.spec.nodeName}");
    assert_eq!(
        get(
            node,
            &format!("pv/{pv}"),
            "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"
        ),
        host
    );
    assert_eq!(get(node, &format!("pv/{pv}"), "{.spec.persistentVolumeReclaimPolicy}"), "Delete");
    let events = events_of(node, "data");
    assert!(
        events.contains("ProvisioningSucceeded") && events.contains(&format!("Successfully provisioned volume {pv}")),
        "{events}"
    );
    assert_eq!(exec(node, "writer", "cat /data/file"), "kept\n");
    // fsGroup owns the volume.
    assert!(exec(node, "writer", "ls -ldn /data").contains(" 2000 "), "{}", exec(node, "writer", "ls -ldn /data"));
    assert_eq!(local_volumes(node), [format!("{pv}_default_data")]);
    let listed = node.ok(&["get", "pvc", "data"]);
    assert!(
        listed.contains("Bound") && listed.contains("1Gi") && listed.contains("RWO") && listed.contains("local-path"),
        "{listed}"
    );

    // Expansion.
    node.ok(&["patch", "pvc", "data", "-p", r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#]);
    wait_for(node, "pvc/data", "{.status.capacity.storage}", "2Gi");
    assert_eq!(get(node, &format!("pv/{pv}"), "{.spec.capacity.storage}"), "2Gi");
    let shrink =
        node.fails(&["patch", "pvc", "data", "-p", r#"{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}"#]);
    assert!(shrink.contains("field can not be less than status.capacity"), "{shrink}");

    // The data outlives the pod.
    node.ok(&["delete", "pod", "writer"]);
    node.ok_stdin(&["apply", "-f", "-"], &pod("reader", "data", "sleep 3600"));
    running(node, "reader");
    assert_eq!(exec(node, "reader", "cat /data/file"), "kept\n");

    // A claim in use stays until its pod is gone; then the volume and its directory go.
    node.ok(&["delete", "pvc", "data", "--wait=false"]);
    eventually(10, || node.ok(&["get", "pvc", "data"]).contains("Terminating").then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(!gone(node, "pvc/data"), "a claim in use is kept");
    assert_eq!(exec(node, "reader", "cat /data/file"), "kept\n", "the volume stays mounted");
    node.ok(&["delete", "pod", "reader"]);
    eventually(60, || (gone(node, "pvc/data") && gone(node, &format!("pv/{pv}"))).then_some(()));
    eventually(30, || local_volumes(node).is_empty().then_some(()));
    let kubelet = node.dir.path().join("kubelet");
    eventually(10, || (mounted_under(&kubelet) == 0).then_some(()));
}

/// A Retain class keeps the volume and its data once the claim is gone; an Immediate class binds
/// without a consumer; a class without allowVolumeExpansion refuses growth.
fn check_retain(node: &Server) {
    let class = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: keep}\nprovisioner: hostpath.csi.cairn.io\nreclaimPolicy: Retain\nvolumeBindingMode: Immediate\n";
    node.ok_stdin(&["apply", "-f", "-"], class);
    let changed = node.fails(&["patch", "sc", "keep", "-p", r#"{"provisioner":"other.example.com"}"#]);
    assert!(changed.contains("provisioner: Invalid value") && changed.contains("field is immutable"), "{changed}");
    node.ok_stdin(&["apply", "-f", "-"], &claim("kept", Some("keep"), "64Mi"));
    wait_for(node, "pvc/kept", "{.status.phase}", "Bound");
    let pv = get(node, "pvc/kept", "{.spec.volumeName}");
    let grow = node.fails(&["patch", "pvc", "kept", "-p", r#"{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}"#]);
    assert!(grow.contains("only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"), "{grow}");
    node.ok_stdin(&["apply", "-f", "-"], &pod("keeper", "kept", "echo retained > /data/file; sleep 3600"));
    running(node, "keeper");
    eventually(10, || (exec(node, "keeper", "cat /data/file") == "retained\n").then_some(()));

    // A bound volume waits for its claim.
    node.ok(&["delete", "pv", &pv, "--wait=false"]);
    assert!(node.ok(&["get", "pv", &pv]).contains("Terminating"));
    node.ok(&["delete", "pod", "keeper"]);
    node.ok(&["delete", "pvc", "kept"]);
    eventually(60, || gone(node, &format!("pv/{pv}")).then_some(()));
    let kept = local_volumes(node);
    assert_eq!(kept, [format!("{pv}_default_kept")], "Retain keeps the directory");
    let file = node.dir.path().join("data/storage").join(&kept[0]).join("file");
    assert_eq!(std::fs::read_to_string(file).unwrap(), "retained\n");
}

/// A static volume binds by selector (the smallest fitting, of the claim's class); a claim's errors
/// are reported in upstream's words.
fn check_static_and_errors(node: &Server, scratch: &Path) {
    let mut yaml = String::new();
    for (name, tier, size) in [("gold-big", "gold", "5Gi"), ("gold-small", "gold", "1Gi"), ("silver", "silver", "1Gi")]
    {
        let path = scratch.join(name);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("label"), name).unwrap();
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {name}, labels: {{tier: {tier}}}}}\nspec:\n  capacity: {{storage: {size}}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: \"\"\n  hostPath: {{path: {}}}\n---\n",
            path.display()
        ));
    }
    node.ok_stdin(&["apply", "-f", "-"], &yaml);
    wait_for(node, "pv/gold-small", "{.status.phase}", "Available");
    let selecting = format!("{}  selector: {{matchLabels: {{tier: gold}}}}\n", claim("golden", Some(""), "512Mi"));
    node.ok_stdin(&["apply", "-f", "-"], &selecting);
    wait_for(node, "pvc/golden", "{.spec.volumeName}", "gold-small");
    wait_for(node, "pv/gold-small", "{.status.phase}", "Bound");
    assert!(node.ok(&["get", "pv", "gold-small"]).contains("default/golden"));
    node.ok_stdin(&["apply", "-f", "-"], &pod("static", "golden", "sleep 3600"));
    running(node, "static");
    assert_eq!(exec(node, "static", "cat /data/label"), "gold-small");

    // Released, not deleted: a static volume of the default Retain policy.
    node.ok(&["delete", "pod", "static"]);
    node.ok(&["delete", "pvc", "golden"]);
    wait_for(node, "pv/gold-small", "{.status.phase}", "Released");

    let invalid = node.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: bad}\nspec: {resources: {requests: {storage: 1Gi}}}\n",
    );
    let err = String::from_utf8_lossy(&invalid.stderr);
    assert!(err.contains("spec.accessModes: Required value: at least 1 access mode is required"), "{err}");
    let no_size = node.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: bad}\nspec: {accessModes: [ReadWriteOnce], hostPath: {path: /tmp}}\n",
    );
    assert!(String::from_utf8_lossy(&no_size.stderr).contains("spec.capacity: Required value"));

    node.ok_stdin(&["apply", "-f", "-"], &claim("lost-class", Some("nope"), "1Gi"));
    eventually(30, || {
        events_of(node, "lost-class").contains("storageclass.storage.k8s.io \"nope\" not found").then_some(())
    });
    assert_eq!(get(node, "pvc/lost-class", "{.status.phase}"), "Pending");

    node.ok_stdin(&["apply", "-f", "-"], &pod("orphan", "missing", "sleep 3600"));
    eventually(30, || events_of(node, "orphan").contains("persistentvolumeclaim \"missing\" not found").then_some(()));
    node.ok(&["delete", "pod", "orphan"]);
    node.ok(&["delete", "pvc", "lost-class"]);
}

/// A ReadWriteOncePod claim serves one pod at a time; the second waits, refused in upstream's words,
/// until the first is gone.
fn check_read_write_once_pod(node: &Server) {
    node.ok_stdin(&["apply", "-f", "-"], &claim_with_mode("solo", None, "8Mi", "ReadWriteOncePod"));
    node.ok_stdin(&["apply", "-f", "-"], &pod("solo-a", "solo", "sleep 3600"));
    running(node, "solo-a");
    assert!(node.ok(&["get", "pvc", "solo"]).contains("RWOP"));
    node.ok_stdin(&["apply", "-f", "-"], &pod("solo-b", "solo", "sleep 3600"));
    eventually(30, || {
        events_of(node, "solo-b")
            .contains("0/1 nodes are available: 1 node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod.")
            .then_some(())
    });
    assert_eq!(get(node, "pod/solo-b", "{.status.phase}"), "Pending");
    node.ok(&["delete", "pod", "solo-a"]);
    running(node, "solo-b");
    node.ok(&["delete", "pod", "solo-b"]);
    node.ok(&["delete", "pvc", "solo"]);
    eventually(60, || gone(node, "pvc/solo").then_some(()));
}

/// A generic ephemeral volume: a claim per pod, owned by it, gone with it.
fn check_ephemeral(node: &Server) {
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: eph}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo scratch > /scratch/f; sleep 3600"]
    volumeMounts: [{{name: scratch, mountPath: /scratch}}]
  volumes:
  - name: scratch
    ephemeral:
      volumeClaimTemplate:
        spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 16Mi}}}}}}
"#
    );
    node.ok_stdin(&["apply", "-f", "-"], &yaml);
    running(node, "eph");
    assert_eq!(get(node, "pvc/eph-scratch", "{.metadata.ownerReferences[0].name}"), "eph");
    assert_eq!(exec(node, "eph", "cat /scratch/f"), "scratch\n");
    let pv = get(node, "pvc/eph-scratch", "{.spec.volumeName}");
    node.ok(&["delete", "pod", "eph"]);
    eventually(60, || (gone(node, "pvc/eph-scratch") && gone(node, &format!("pv/{pv}"))).then_some(()));
}

/// A driver in a process of its own, registered through `plugins_registry/`: it provisions,
/// publishes and deletes exactly as the built-in one. It attaches (its CSIDriver says
/// `attachRequired`), so each volume a pod uses gets a VolumeAttachment, attached through the
/// driver before it is mounted and detached once unmounted; it takes one volume per node (CSINode
/// allocatable), so a second pod waits for the first; and its disk starts full, which fails
/// provisioning with an event until there is room.
fn check_external_driver(node: &Server, scratch: &Path) {
    let kubelet = node.dir.path().join("kubelet");
    let storage = scratch.join("external");
    std::fs::create_dir_all(&storage).unwrap();
    // A disk with no inode left: no directory can be made.
    let disk = Tmpfs::mount(&storage, "nr_inodes=1");
    let node_name = get(node, "nodes", "{.items[0].metadata.name}");
    let csi_driver = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: ext.csi.test}\nspec: {attachRequired: true}\n";
    node.ok_stdin(&["apply", "-f", "-"], csi_driver);
    let socket = kubelet.join("plugins/ext.csi.test/csi.sock");
    let mut driver = ExternalDriver(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["csi-hostpath", "--driver-name", "ext.csi.test", "--node-id", &node_name])
            .args(["--enable-attach", "--max-volumes-per-node", "1"])
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--storage-path")
            .arg(&storage)
            .arg("--registration-dir")
            .arg(kubelet.join("plugins_registry"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start cairn csi-hostpath"),
    );
    wait_for(node, &format!("csinode/{node_name}"), "{.spec.drivers[*].name}", "hostpath.csi.cairn.io ext.csi.test");
    assert_eq!(
        get(node, &format!("csinode/{node_name}"), "{.spec.drivers[?(@.name=='ext.csi.test')].allocatable.count}"),
        "1"
    );
    let class = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: ext}\nprovisioner: ext.csi.test\nvolumeBindingMode: Immediate\n";
    node.ok_stdin(&["apply", "-f", "-"], class);

    // The full disk: a failure event, no volume, and a retry that succeeds once there is room.
    node.ok_stdin(&["apply", "-f", "-"], &claim("outside", Some("ext"), "32Mi"));
    eventually(30, || {
        let events = events_of(node, "outside");
        (events.contains("ProvisioningFailed")
            && events
                .contains("failed to provision volume with StorageClass \"ext\": rpc error: code = ResourceExhausted"))
        .then_some(())
    });
    assert_eq!(get(node, "pvc/outside", "{.status.phase}"), "Pending");
    assert!(!node.ok(&["get", "pv"]).contains("default/outside"), "no half-made volume");
    disk.remount("nr_inodes=1000");
    wait_for(node, "pvc/outside", "{.status.phase}", "Bound");
    let pv = get(node, "pvc/outside", "{.spec.volumeName}");
    assert_eq!(get(node, &format!("pv/{pv}"), "{.spec.csi.driver}"), "ext.csi.test");
    let handle = get(node, &format!("pv/{pv}"), "{.spec.csi.volumeHandle}");

    // Attached before it is mounted.
    node.ok_stdin(&["apply", "-f", "-"], &pod("outsider", "outside", "echo external > /data/f; sleep 3600"));
    running(node, "outsider");
    let attachments = node.ok(&["get", "volumeattachment"]);
    assert!(
        attachments.contains("ext.csi.test") && attachments.contains(&pv) && attachments.contains("true"),
        "{attachments}"
    );
    assert_eq!(get(node, "volumeattachments", "{.items[0].metadata.finalizers[0]}"), "external-attacher/ext-csi-test");
    assert_eq!(get(node, "volumeattachments", "{.items[0].status.attachmentMetadata.attachedTo}"), node_name);
    let unique = format!("kubernetes.io/csi/ext.csi.test^{handle}");
    wait_for(node, &format!("node/{node_name}"), "{.status.volumesAttached[*].name}", &unique);
    wait_for(node, &format!("node/{node_name}"), "{.status.volumesInUse[*]}", &unique);
    eventually(30, || {
        events_of(node, "outsider")
            .contains(&format!("AttachVolume.Attach succeeded for volume \"{pv}\""))
            .then_some(())
    });
    eventually(10, || (exec(node, "outsider", "cat /data/f") == "external\n").then_some(()));
    let dir = storage.join(format!("{pv}_default_outside"));
    assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "external\n");

    // One volume per node: a second pod with another volume of the driver waits for the first.
    node.ok_stdin(&["apply", "-f", "-"], &claim("outside-2", Some("ext"), "32Mi"));
    wait_for(node, "pvc/outside-2", "{.status.phase}", "Bound");
    node.ok_stdin(&["apply", "-f", "-"], &pod("outsider-2", "outside-2", "sleep 3600"));
    eventually(30, || {
        events_of(node, "outsider-2")
            .contains("0/1 nodes are available: 1 node(s) exceed max volume count.")
            .then_some(())
    });
    assert_eq!(get(node, "pod/outsider-2", "{.status.phase}"), "Pending");
    // The first pod goes: its volume is unmounted, then detached, and the second pod gets the room.
    node.ok(&["delete", "pod", "outsider"]);
    running(node, "outsider-2");
    let pv2 = get(node, "pvc/outside-2", "{.spec.volumeName}");
    eventually(30, || {
        let attachments = node.ok(&["get", "volumeattachment"]);
        (!attachments.contains(&format!("{pv} ")) && attachments.contains(&pv2)).then_some(())
    });

    node.ok(&["delete", "pod", "outsider-2"]);
    node.ok(&["delete", "pvc", "outside", "outside-2"]);
    eventually(60, || {
        (gone(node, &format!("pv/{pv}")) && gone(node, &format!("pv/{pv2}")) && !dir.exists()).then_some(())
    });
    eventually(60, || gone(node, "volumeattachments").then_some(()));
    wait_for(node, &format!("node/{node_name}"), "{.status.volumesAttached}", "");
    // The pods' teardown (unpublish, unstage) goes through the driver: it must be done before the
    // driver is stopped.
    let staged = kubelet.join("plugins/kubernetes.io/csi/ext.csi.test");
    eventually(30, || (mounted_under(&staged) == 0).then_some(()));

    driver.0.kill().unwrap();
    driver.0.wait().unwrap();
    // Its registration socket stays behind a killed process; the node drops it once it is gone.
    let _ = std::fs::remove_file(kubelet.join("plugins_registry/ext.csi.test-reg.sock"));
    wait_for(node, &format!("csinode/{node_name}"), "{.spec.drivers[*].name}", "hostpath.csi.cairn.io");
    drop(disk);
}

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, options: &str) -> Self {
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).status().unwrap();
        assert!(status.success(), "mounting a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount").args(["-o", &format!("remount,{options}")]).arg(&self.0).status().unwrap();
        assert!(status.success(), "remounting {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

struct ExternalDriver(Child);

impl Drop for ExternalDriver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGKILL under a running pod with a claim: the container keeps running, its volume stays mounted
/// and readable, and cairn does not unmount it when it comes back.
fn check_kill9(node: &mut Node) {
    node.ok_stdin(&["apply", "-f", "-"], &claim("durable", None, "8Mi"));
    node.ok_stdin(&["apply", "-f", "-"], &pod("durable", "durable", "echo before > /data/f; sleep 3600"));
    running(node, "durable");
    eventually(10, || (exec(node, "durable", "cat /data/f") == "before\n").then_some(()));
    let container = get(node, "pod/durable", "{.status.containerStatuses[0].containerID}");
    let uid = get(node, "pod/durable", "{.metadata.uid}");
    let pod_dir: PathBuf = node.dir.path().join("data/agent/pods").join(&uid);
    // The claim's publish mount (the pod's token volume is a tmpfs of its own beside it).
    let claim_mounts = pod_dir.join("volumes/kubernetes.io~csi");
    assert_eq!(mounted_under(&claim_mounts), 1);
    node.restart_after_kill9();
    eventually(60, || node_ready(node));
    running(node, "durable");
    // Synced again after the restart, and still the same container.
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(get(node, "pod/durable", "{.status.containerStatuses[0].containerID}"), container);
    assert_eq!(get(node, "pod/durable", "{.status.containerStatuses[0].restartCount}"), "0");
    assert_eq!(mounted_under(&claim_mounts), 1, "the volume is neither unmounted nor mounted twice");
    exec(node, "durable", "echo after >> /data/f");
    assert_eq!(exec(node, "durable", "cat /data/f"), "before\nafter\n");
    node.ok(&["delete", "pod", "durable"]);
    node.ok(&["delete", "pvc", "durable"]);
    eventually(60, || gone(node, "pvc/durable").then_some(()));
    eventually(30, || (mounted_under(&pod_dir) == 0).then_some(()));
}

#[test]
fn claims_are_provisioned_mounted_and_reclaimed_like_kubernetes() {
    let mut node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    eventually(60, || {
        node.ok(&["get", "nodes", "-o", "jsonpath={.items[0].status.images}"]).contains(BUSYBOX).then_some(())
    });
    let scratch = tempfile::tempdir().unwrap();
    check_default_class(&node);
    check_retain(&node);
    check_static_and_errors(&node, scratch.path());
    check_ephemeral(&node);
    check_read_write_once_pod(&node);
    check_external_driver(&node, scratch.path());
    check_kill9(&mut node);
}
