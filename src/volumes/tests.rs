use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use k8s_cri::v1::MountPropagation;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use serde_json::{Value, json};

use super::*;

#[derive(Default)]
struct Fake {
    config_maps: RefCell<BTreeMap<String, ConfigMap>>,
    secrets: RefCell<BTreeMap<String, Secret>>,
}

impl Fake {
    fn config_map(&self, name: &str, data: Value) {
        let cm = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "data": data})).unwrap();
        self.config_maps.borrow_mut().insert(name.to_string(), cm);
    }
    /// `data` values are plain strings, base64-encoded here.
    fn secret(&self, name: &str, data: &[(&str, &str)]) {
        let secret = Secret {
            data: Some(
                data.iter().map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.as_bytes().to_vec()))).collect(),
            ),
            ..Default::default()
        };
        self.secrets.borrow_mut().insert(name.to_string(), secret);
    }
}

impl Objects for Fake {
    fn config_map(&self, ns: &str, name: &str) -> Option<ConfigMap> {
        assert_eq!(ns, "ns");
        self.config_maps.borrow().get(name).cloned()
    }
    fn secret(&self, ns: &str, name: &str) -> Option<Secret> {
        assert_eq!(ns, "ns");
        self.secrets.borrow().get(name).cloned()
    }
}

fn node() -> NodeResources {
    NodeResources { cpu_milli: 4000, memory_bytes: 8 << 30, ephemeral_storage_bytes: 100 << 30, ..Default::default() }
}

fn pod(volumes: Value, containers: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "ns", "uid": "1234-abcd",
                     "labels": {"app": "web", "tier": "a \"quoted\"\nvalue"},
                     "annotations": {"example.com/note": "hi"}},
        "spec": {"volumes": volumes, "containers": containers}
    }))
    .unwrap()
}

fn c(mounts: Value) -> Value {
    json!([{"name": "app", "image": "busybox", "volumeMounts": mounts,
            "resources": {"limits": {"cpu": "250m"}, "requests": {"cpu": "100m", "memory": "100Mi"}}}])
}

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path).unwrap()
}

fn mode_of(path: impl AsRef<Path>) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// (path, mtime in ns, inode) of everything under `dir`, symlinks not followed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, i64, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path(), m.mtime() * 1_000_000_000 + m.mtime_nsec(), m.ino()));
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// A pod directory that is torn down (unmounting any tmpfs) even when the test fails.
struct PodDir {
    _tmp: tempfile::TempDir,
    path: PathBuf,
}

impl PodDir {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("agent/pods/1234-abcd");
        PodDir { _tmp: tmp, path }
    }
}

impl Drop for PodDir {
    fn drop(&mut self) {
        let _ = teardown(&self.path);
    }
}

fn setup_err(pod: &Pod, dir: &Path, objects: &Fake) -> String {
    setup(pod, dir, objects, &node()).unwrap_err().to_string()
}

#[test]
fn empty_dir_on_disk() {
    let dir = PodDir::new();
    let p = pod(json!([{"name": "scratch", "emptyDir": {}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &Fake::default(), &node()).unwrap();
    let v = vols.get("scratch").unwrap();
    assert_eq!(v.host_path, dir.path.join("volumes/kubernetes.io~empty-dir/scratch"));
    assert!(!v.read_only);
    assert_eq!(mode_of(&v.host_path), 0o777);
    assert!(!mount::is_mount_point(&v.host_path).unwrap());
}

#[test]
fn memory_empty_dir_is_a_sized_tmpfs_and_teardown_unmounts_it() {
    let dir = PodDir::new();
    let p = pod(json!([{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &Fake::default(), &node()).unwrap();
    let path = &vols.get("cache").unwrap().host_path;
    assert!(mount::is_mount_point(path).unwrap());
    let stat = nix::sys::statfs::statfs(path).unwrap();
    assert_eq!(stat.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
    assert_eq!(stat.blocks() as u64 * stat.block_size() as u64, 1 << 20);
    assert_eq!(mode_of(path), 0o1777);
    // A second setup neither remounts nor changes the mode.
    fs::write(path.join("f"), "x").unwrap();
    setup(&p, &dir.path, &Fake::default(), &node()).unwrap();
    assert_eq!(read(path.join("f")), "x");
    assert_eq!(mode_of(path), 0o1777);

    teardown(&dir.path).unwrap();
    assert!(!dir.path.exists());
    assert!(!read("/proc/self/mountinfo").contains(dir.path.to_str().unwrap()));
    teardown(&dir.path).unwrap();
}

#[test]
fn tmpfs_size_follows_kubelet() {
    let n = node();
    let p = pod(json!([]), c(json!([])));
    assert_eq!(tmpfs_size(&p, None, &n), Some(8 << 30));
    assert_eq!(tmpfs_size(&p, Some(1 << 20), &n), Some(1 << 20));
    assert_eq!(tmpfs_size(&p, Some(16 << 30), &n), Some(8 << 30));
    let limited: Pod = serde_json::from_value(json!({"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"memory": "64Mi"}}},
        {"name": "b", "resources": {"limits": {"memory": "64Mi"}}}]}}))
    .unwrap();
    assert_eq!(tmpfs_size(&limited, None, &n), Some(128 << 20));
    assert_eq!(tmpfs_size(&limited, Some(1 << 20), &n), Some(1 << 20));
}

#[test]
fn host_path_types() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = PodDir::new();
    let t = tmp.path().display();
    let check = |ty: &str, path: String| {
        let p = pod(json!([{"name": "h", "hostPath": {"path": path, "type": ty}}]), c(json!([])));
        setup(&p, &dir.path, &Fake::default(), &node()).map(|v| v.get("h").unwrap().clone())
    };
    let v = check("DirectoryOrCreate", format!("{t}/d/e")).unwrap();
    assert_eq!(v, Volume { host_path: tmp.path().join("d/e"), read_only: false });
    assert!(tmp.path().join("d/e").is_dir());
    assert_eq!(mode_of(tmp.path().join("d/e")), 0o755);
    check("Directory", format!("{t}/d")).unwrap();
    check("FileOrCreate", format!("{t}/p/q/file")).unwrap();
    assert_eq!(mode_of(tmp.path().join("p/q/file")), 0o644);
    assert_eq!(mode_of(tmp.path().join("p/q")), 0o755);
    check("File", format!("{t}/p/q/file")).unwrap();
    check("", format!("{t}/missing")).unwrap();
    check("CharDevice", "/dev/null".into()).unwrap();

    let err = |ty: &str, path: String| check(ty, path).unwrap_err().to_string();
    assert_eq!(
        err("Directory", format!("{t}/p/q/file")),
        format!(
            "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {t}/p/q/file is not a directory"
        )
    );
    assert!(err("DirectoryOrCreate", format!("{t}/p/q/file")).ends_with("is not a directory"));
    assert!(err("File", format!("{t}/d")).ends_with(&format!("{t}/d is not a file")));
    assert!(err("FileOrCreate", format!("{t}/d")).ends_with("is not a file"));
    assert!(err("Socket", format!("{t}/p/q/file")).ends_with("is not a socket file"));
    assert!(err("CharDevice", format!("{t}/d")).ends_with("is not a character device"));
    assert!(err("BlockDevice", "/dev/null".into()).ends_with("/dev/null is not a block device"));
    assert!(err("Directory", format!("{t}/nope")).ends_with("is not a directory"));
    assert!(err("Weird", format!("{t}/d")).ends_with(": Weird is an invalid volume type"));

    let sock = tmp.path().join("s.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    check("Socket", sock.display().to_string()).unwrap();
}

#[test]
fn config_map_layout_modes_and_items() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.config_map("cfg", json!({"a.conf": "A", "b": "B"}));
    objects.config_maps.borrow_mut().get_mut("cfg").unwrap().binary_data =
        Some([("bin".to_string(), k8s_openapi::ByteString(vec![0, 1, 2]))].into());
    let p = pod(
        json!([
            {"name": "all", "configMap": {"name": "cfg"}},
            {"name": "some", "configMap": {"name": "cfg", "defaultMode": 0o600,
                "items": [{"key": "a.conf", "path": "sub/dir/a"}, {"key": "b", "path": "b", "mode": 0o400}]}}
        ]),
        c(json!([])),
    );
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    let all = vols.get("all").unwrap();
    assert_eq!(all.host_path, dir.path.join("volumes/kubernetes.io~configmap/all"));
    assert!(all.read_only);
    assert_eq!(read(all.host_path.join("a.conf")), "A");
    assert_eq!(fs::read(all.host_path.join("bin")).unwrap(), vec![0, 1, 2]);
    assert_eq!(mode_of(all.host_path.join("b")), 0o644);
    // kubelet's layout: `key -> ..data/key`, `..data -> ..<timestamp>`.
    assert_eq!(fs::read_link(all.host_path.join("b")).unwrap(), Path::new("..data/b"));
    let ts = fs::read_link(all.host_path.join("..data")).unwrap();
    let ts = ts.to_str().unwrap();
    assert!(ts.starts_with("..") && ts.len() > "..2024_01_01_00_00_00.".len(), "{ts}");
    assert!(all.host_path.join(ts).join("b").is_file());
    assert_eq!(mode_of(all.host_path.join(ts)), 0o755);

    let some = &vols.get("some").unwrap().host_path;
    assert_eq!(read(some.join("sub/dir/a")), "A");
    assert_eq!(fs::read_link(some.join("sub")).unwrap(), Path::new("..data/sub"));
    assert_eq!(mode_of(some.join("sub/dir/a")), 0o600);
    assert_eq!(mode_of(some.join("b")), 0o400);
    assert!(!some.join("a.conf").exists());
}

#[test]
fn config_map_errors_and_optional() {
    let dir = PodDir::new();
    let objects = Fake::default();
    let p = pod(json!([{"name": "cfg", "configMap": {"name": "missing"}}]), c(json!([])));
    let err = setup(&p, &dir.path, &objects, &node()).unwrap_err();
    assert!(matches!(err, VolumeError::SetUp { source: SetUpError::ConfigMapNotFound(_), .. }));
    assert_eq!(err.to_string(), "MountVolume.SetUp failed for volume \"cfg\" : configmap \"missing\" not found");

    let p = pod(json!([{"name": "cfg", "configMap": {"name": "missing", "optional": true}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    let path = &vols.get("cfg").unwrap().host_path;
    let entries: Vec<_> = fs::read_dir(path).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries.len(), 2, "only ..data and its timestamp directory: {entries:?}");

    objects.config_map("cfg", json!({"a": "1"}));
    let p =
        pod(json!([{"name": "v", "configMap": {"name": "cfg", "items": [{"key": "zz", "path": "z"}]}}]), c(json!([])));
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"v\" : configmap references non-existent config key: zz"
    );
    let p = pod(
        json!([{"name": "v", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "../x"}]}}]),
        c(json!([])),
    );
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"v\" : invalid path: must not contain '..': ../x"
    );
    let p = pod(json!([{"name": "v", "nfs": {"server": "nfs.example", "path": "/x"}}]), c(json!([])));
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"v\" : no volume plugin matched"
    );
}

#[test]
fn secret_on_tmpfs() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.secret("creds", &[("password", "hunter2"), ("user", "admin")]);
    let p = pod(json!([{"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o400}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    let s = vols.get("s").unwrap();
    assert_eq!(s.host_path, dir.path.join("volumes/kubernetes.io~secret/s"));
    assert!(s.read_only);
    assert!(mount::is_mount_point(&s.host_path).unwrap());
    assert_eq!(nix::sys::statfs::statfs(&s.host_path).unwrap().filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
    assert_eq!(read(s.host_path.join("password")), "hunter2");
    assert_eq!(mode_of(s.host_path.join("user")), 0o400);

    let p = pod(json!([{"name": "s", "secret": {"secretName": "nope"}}]), c(json!([])));
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"s\" : secret \"nope\" not found"
    );
    let p = pod(
        json!([{"name": "s", "secret": {"secretName": "creds", "items": [{"key": "token", "path": "t"}]}}]),
        c(json!([])),
    );
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"s\" : references non-existent secret key: token"
    );
    let p = pod(json!([{"name": "o", "secret": {"secretName": "nope", "optional": true}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    assert!(mount::is_mount_point(&vols.get("o").unwrap().host_path).unwrap());

    teardown(&dir.path).unwrap();
    assert!(!dir.path.exists());
}

fn all_kinds_pod() -> Pod {
    pod(
        json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "sec", "secret": {"secretName": "sec"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"name": "proj", "projected": {"sources": [
                {"configMap": {"name": "cfg"}},
                {"serviceAccountToken": {"path": "token"}}]}}
        ]),
        c(json!([])),
    )
}

#[test]
fn second_setup_writes_nothing() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.config_map("cfg", json!({"a": "1", "b": "2"}));
    objects.secret("sec", &[("k", "v")]);
    let tokens = [(TokenKey { audience: String::new(), expiration_seconds: 3600 }, "tok".to_string())];
    let node = NodeResources { service_account_tokens: tokens.into(), ..node() };
    let p = all_kinds_pod();
    let first = setup(&p, &dir.path, &objects, &node).unwrap();
    let before = snapshot(&dir.path);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = setup(&p, &dir.path, &objects, &node).unwrap();
    assert_eq!(first, second);
    assert_eq!(before, snapshot(&dir.path));
}

#[test]
fn config_map_update_shows_through_the_same_path() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.config_map("cfg", json!({"a": "1", "b": "2"}));
    objects.secret("sec", &[("k", "v")]);
    let p = all_kinds_pod();
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    let cfg = vols.get("cfg").unwrap().host_path.clone();
    let old_ts = fs::read_link(cfg.join("..data")).unwrap();
    assert_eq!(read(cfg.join("a")), "1");

    objects.config_map("cfg", json!({"a": "one", "c": "3"}));
    setup(&p, &dir.path, &objects, &node()).unwrap();
    assert_eq!(read(cfg.join("a")), "one");
    assert_eq!(read(cfg.join("c")), "3");
    assert!(fs::symlink_metadata(cfg.join("b")).is_err(), "removed key's link is gone");
    assert!(!cfg.join(&old_ts).exists(), "old version removed");
    assert_ne!(fs::read_link(cfg.join("..data")).unwrap(), old_ts);
    // The projected copy follows too.
    assert_eq!(read(vols.get("proj").unwrap().host_path.join("a")), "one");
}

#[test]
fn downward_api_files() {
    let dir = PodDir::new();
    let p = pod(
        json!([{"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}, "mode": 0o400},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "cpu_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "mem_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "mem_request", "resourceFieldRef": {"containerName": "app", "resource": "requests.memory"}}
        ]}}]),
        c(json!([])),
    );
    let vols = setup(&p, &dir.path, &Fake::default(), &node()).unwrap();
    let d = &vols.get("info").unwrap().host_path;
    assert_eq!(d, &dir.path.join("volumes/kubernetes.io~downward-api/info"));
    assert!(mount::is_mount_point(d).unwrap());
    assert_eq!(read(d.join("labels")), "app=\"web\"\ntier=\"a \\\"quoted\\\"\\nvalue\"");
    assert_eq!(read(d.join("annotations")), "example.com/note=\"hi\"");
    assert_eq!(read(d.join("name")), "web-0");
    assert_eq!(read(d.join("ns")), "ns");
    assert_eq!(read(d.join("uid")), "1234-abcd");
    assert_eq!(mode_of(d.join("uid")), 0o400);
    assert_eq!(mode_of(d.join("name")), 0o644);
    assert_eq!(read(d.join("app")), "web");
    assert_eq!(read(d.join("cpu_limit")), "250");
    assert_eq!(read(d.join("mem_limit")), "8192", "node allocatable in MiB");
    assert_eq!(read(d.join("mem_request")), "104857600");

    let p = pod(
        json!([{"name": "info", "downwardAPI": {"items": [
            {"path": "x", "fieldRef": {"fieldPath": "spec.nodeName"}},
            {"path": "y", "resourceFieldRef": {"containerName": "nope", "resource": "limits.cpu"}}]}}]),
        c(json!([])),
    );
    assert_eq!(
        setup_err(&p, &dir.path, &Fake::default()),
        "MountVolume.SetUp failed for volume \"info\" : [unsupported fieldPath: spec.nodeName, container nope not found]"
    );
}

#[test]
fn go_quoting() {
    use downward::go_quote;
    assert_eq!(go_quote("plain"), "\"plain\"");
    assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
    assert_eq!(go_quote("\t\r\n\x07\x01\x7f"), "\"\\t\\r\\n\\a\\x01\\x7f\"");
    assert_eq!(go_quote("héllo ☃"), "\"héllo ☃\"");
    assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
}

#[test]
fn projected_sources_and_token() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.config_map("kube-root-ca.crt", json!({"ca.crt": "CA"}));
    objects.secret("sec", &[("k", "v")]);
    let p = pod(
        json!([{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"secret": {"name": "sec"}},
            {"secret": {"name": "absent", "optional": true}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}}]),
        c(json!([])),
    );
    let keys = token_keys(&p);
    assert_eq!(keys.iter().collect::<Vec<_>>(), [&TokenKey { audience: String::new(), expiration_seconds: 3607 }]);
    let tokens = keys.into_iter().map(|k| (k, "eyJ.token".to_string()));
    let with_token = NodeResources { service_account_tokens: tokens.collect(), ..node() };
    let vols = setup(&p, &dir.path, &objects, &with_token).unwrap();
    let d = &vols.get("kube-api-access").unwrap().host_path;
    assert_eq!(d, &dir.path.join("volumes/kubernetes.io~projected/kube-api-access"));
    assert!(mount::is_mount_point(d).unwrap());
    assert_eq!(read(d.join("token")), "eyJ.token");
    assert_eq!(read(d.join("ca.crt")), "CA");
    assert_eq!(read(d.join("k")), "v");
    assert_eq!(read(d.join("namespace")), "ns");
    assert_eq!(mode_of(d.join("ca.crt")), 0o644);

    // Without a token the source is skipped (and the old token file goes away).
    setup(&p, &dir.path, &objects, &node()).unwrap();
    assert!(fs::symlink_metadata(d.join("token")).is_err());
    assert_eq!(read(d.join("ca.crt")), "CA");

    let p = pod(
        json!([{"name": "p", "projected": {"sources": [{"configMap": {"name": "gone"}}, {"secret": {"name": "gone"}}]}}]),
        c(json!([])),
    );
    assert_eq!(
        setup_err(&p, &dir.path, &objects),
        "MountVolume.SetUp failed for volume \"p\" : [configmap \"gone\" not found, secret \"gone\" not found]"
    );
}

#[test]
fn container_mounts() {
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.config_map("cfg", json!({"app.yaml": "x: 1"}));
    let p = pod(json!([{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cfg"}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &objects, &node()).unwrap();
    let data = vols.get("data").unwrap().host_path.clone();
    let container: Container = serde_json::from_value(json!({"name": "app", "volumeMounts": [
        {"name": "data", "mountPath": "/data"},
        {"name": "data", "mountPath": "logs", "subPath": "a/logs", "mountPropagation": "HostToContainer"},
        {"name": "cfg", "mountPath": "/etc/app/app.yaml", "subPath": "app.yaml"},
        {"name": "data", "mountPath": "/ro", "readOnly": true, "mountPropagation": "None"}
    ]}))
    .unwrap();
    let m = mounts(&container, &vols).unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!((m[0].container_path.as_str(), m[0].host_path.as_str()), ("/data", data.to_str().unwrap()));
    assert!(!m[0].readonly);
    assert_eq!(m[0].propagation(), MountPropagation::PropagationPrivate);
    assert_eq!(m[1].container_path, "/logs");
    assert_eq!(m[1].host_path, data.join("a/logs").to_str().unwrap());
    assert!(data.join("a/logs").is_dir(), "subPath created");
    assert_eq!(mode_of(data.join("a/logs")), 0o777, "with the volume's mode");
    assert_eq!(m[1].propagation(), MountPropagation::PropagationHostToContainer);
    // A configMap subPath resolves to the file itself, read-only.
    let cfg_dir = vols.get("cfg").unwrap().host_path.clone();
    let ts = fs::read_link(cfg_dir.join("..data")).unwrap();
    assert_eq!(Path::new(&m[2].host_path), cfg_dir.canonicalize().unwrap().join(ts).join("app.yaml"));
    assert!(m[2].readonly);
    assert!(m[3].readonly);

    let one = |vm: Value, privileged: bool| {
        let c: Container = serde_json::from_value(
            json!({"name": "app", "volumeMounts": [vm], "securityContext": {"privileged": privileged}}),
        )
        .unwrap();
        mounts(&c, &vols)
    };
    let err = |vm: Value| one(vm, false).unwrap_err().to_string();
    assert_eq!(
        err(json!({"name": "x", "mountPath": "/x"})),
        "cannot find volume \"x\" to mount into container \"app\""
    );
    assert_eq!(
        err(json!({"name": "data", "mountPath": "/x", "subPath": "/etc"})),
        "error SubPath `/etc` must not be an absolute path"
    );
    assert_eq!(
        err(json!({"name": "data", "mountPath": "/x", "subPath": "a/../../etc"})),
        "unable to provision SubPath `a/../../etc`: must not contain '..'"
    );
    assert_eq!(
        err(json!({"name": "data", "mountPath": "/x", "mountPropagation": "Bidirectional"})),
        "Bidirectional mount propagation is available only to privileged containers"
    );
    let bidi = one(json!({"name": "data", "mountPath": "/x", "mountPropagation": "Bidirectional"}), true).unwrap();
    assert_eq!(bidi[0].propagation(), MountPropagation::PropagationBidirectional);

    // Symlinks leading out of the volume are refused; those staying inside are followed.
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), data.join("escape")).unwrap();
    symlink("a", data.join("inside")).unwrap();
    assert_eq!(
        err(json!({"name": "data", "mountPath": "/x", "subPath": "escape"})),
        "failed to prepare subPath for volumeMount \"data\" of container \"app\""
    );
    assert_eq!(
        err(json!({"name": "data", "mountPath": "/x", "subPath": "escape/new"})),
        "failed to create subPath directory for volumeMount \"data\" of container \"app\""
    );
    assert!(!outside.path().join("new").exists());
    let ok = one(json!({"name": "data", "mountPath": "/x", "subPath": "inside/logs"}), false).unwrap();
    assert_eq!(ok[0].host_path, data.canonicalize().unwrap().join("a/logs").to_str().unwrap());
}

#[test]
fn sub_path_expr() {
    let dir = PodDir::new();
    let p = pod(json!([{"name": "data", "emptyDir": {}}]), c(json!([])));
    let vols = setup(&p, &dir.path, &Fake::default(), &node()).unwrap();
    let container: Container = serde_json::from_value(json!({"name": "app", "volumeMounts": [
        {"name": "data", "mountPath": "/logs", "subPathExpr": "$(POD_NAME)/logs"}]}))
    .unwrap();
    let env = vec![("POD_NAME".to_string(), "web-0".to_string())];
    let m = mounts_expanded(&container, &vols, &env).unwrap();
    let data = &vols.get("data").unwrap().host_path;
    assert_eq!(m[0].host_path, data.join("web-0/logs").to_str().unwrap());
    assert_eq!(mounts(&container, &vols).unwrap_err().to_string(), "missing value for POD_NAME");
    let empty = vec![("POD_NAME".to_string(), String::new())];
    assert_eq!(mounts_expanded(&container, &vols, &empty).unwrap_err().to_string(), "missing value for POD_NAME");
}

#[test]
fn managed_etc_hosts() {
    let dir = PodDir::new();
    fs::create_dir_all(&dir.path).unwrap();
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "ns"},
        "spec": {"containers": [], "hostname": "web-0", "subdomain": "web",
                 "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}]}
    }))
    .unwrap();
    assert!(etc_hosts(&p, &[], &dir.path).unwrap().is_none());
    let ips = vec!["10.42.0.7".to_string(), "fd00::7".to_string()];
    let m = etc_hosts(&p, &ips, &dir.path).unwrap().unwrap();
    assert_eq!(m.container_path, "/etc/hosts");
    assert_eq!(m.host_path, dir.path.join("etc-hosts").to_str().unwrap());
    assert!(!m.readonly);
    assert_eq!(
        read(dir.path.join("etc-hosts")),
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n\
         10.42.0.7\tweb-0.web.ns.svc.cluster.local\tweb-0\n\
         fd00::7\tweb-0.web.ns.svc.cluster.local\tweb-0\n\
         \n\
         # Entries added by HostAliases.\n\
         10.1.2.3\tfoo.local\tbar.local\n"
    );
    assert_eq!(mode_of(dir.path.join("etc-hosts")), 0o644);
    let before = snapshot(&dir.path);
    std::thread::sleep(std::time::Duration::from_millis(20));
    etc_hosts(&p, &ips, &dir.path).unwrap();
    assert_eq!(before, snapshot(&dir.path), "unchanged file not rewritten");

    let spec = p.spec.as_mut().unwrap();
    spec.subdomain = None;
    spec.host_aliases = None;
    spec.hostname = Some(format!("{}-.x", "h".repeat(61)));
    etc_hosts(&p, &ips[..1], &dir.path).unwrap();
    assert!(
        read(dir.path.join("etc-hosts"))
            .ends_with(&format!("fe00::2\tip6-allrouters\n10.42.0.7\t{}\n", "h".repeat(61)))
    );

    p.spec.as_mut().unwrap().host_network = Some(true);
    etc_hosts(&p, &[], &dir.path).unwrap().unwrap();
    let content = read(dir.path.join("etc-hosts"));
    assert_eq!(content, format!("# Kubernetes-managed hosts file (host network).\n{}", read("/etc/hosts")));

    let c: Container =
        serde_json::from_value(json!({"name": "a", "volumeMounts": [{"name": "h", "mountPath": "/etc/hosts"}]}))
            .unwrap();
    assert!(!wants_etc_hosts(&c));
    assert!(wants_etc_hosts(&Container::default()));
}

#[test]
fn teardown_leaves_host_paths_alone() {
    let host = tempfile::tempdir().unwrap();
    fs::write(host.path().join("keep"), "x").unwrap();
    let dir = PodDir::new();
    let objects = Fake::default();
    objects.secret("sec", &[("k", "v")]);
    let p = pod(
        json!([{"name": "h", "hostPath": {"path": host.path()}}, {"name": "sec", "secret": {"secretName": "sec"}},
               {"name": "m", "emptyDir": {"medium": "Memory"}}]),
        c(json!([])),
    );
    setup(&p, &dir.path, &objects, &node()).unwrap();
    teardown(&dir.path).unwrap();
    assert!(!dir.path.exists());
    assert_eq!(read(host.path().join("keep")), "x");
    teardown(&dir.path).unwrap();
}
