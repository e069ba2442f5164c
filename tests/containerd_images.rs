//! Image import against a real, private containerd started for each test (root only). Skipped, with
//! a message, where containerd or root is missing.

// The modules as they are in the binary (`images` reaches `oci_image` as `super::oci_image`).
#[allow(dead_code, unused_imports)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[allow(dead_code, unused_imports)]
#[path = "../src/runtime/images/mod.rs"]
mod images;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use containerd_client::services::v1 as api;
use futures::future::BoxFuture;
use images::{ImageChange, ImageDir, Importer};
use oci_image::ImageBuilder;

/// A containerd of our own: config, root, state and socket in a temporary directory.
struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Containerd {
    fn start(test: &str) -> Option<Containerd> {
        if Command::new("containerd").arg("--version").output().is_err()
            || Command::new("ctr").arg("--version").output().is_err()
        {
            eprintln!("SKIP {test}: containerd/ctr not installed");
            return None;
        }
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP {test}: needs root to run containerd");
            return None;
        }
        let dir = tempfile::Builder::new().prefix("ctrd-").tempdir().unwrap();
        let d = dir.path();
        let socket = d.join("c.sock");
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\n[grpc]\n  address = \"{sock}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = socket.display()
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let child = Self::spawn(d);
        let mut c = Containerd { child, dir, socket };
        c.wait_ready();
        Some(c)
    }

    fn spawn(d: &Path) -> Child {
        let log = std::fs::File::options().create(true).append(true).open(d.join("containerd.log")).unwrap();
        Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["version"]).0 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("containerd exited ({status}): {}", self.log());
            }
            assert!(Instant::now() < deadline, "containerd did not come up: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.dir.path());
        self.wait_ready();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -a <sock> -n k8s.io <args>`: (success, stdout, stderr).
    fn ctr(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ctr_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.ctr(args);
        assert!(ok, "ctr {args:?} failed: {err}{out}");
        out
    }

    fn image_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ctr_ok(&["images", "ls", "-q"]).lines().map(str::to_string).collect();
        v.sort();
        v
    }

    fn content(&self) -> Vec<String> {
        let mut v: Vec<String> = self.ctr_ok(&["content", "ls", "-q"]).lines().map(str::to_string).collect();
        v.sort();
        v
    }

    fn leases(&self) -> String {
        self.ctr_ok(&["leases", "ls", "-q"])
    }

    /// A synchronous garbage collection (deleting a lease with --sync runs one).
    fn gc(&self) {
        self.ctr_ok(&["leases", "create", "--id", "gc-trigger"]);
        self.ctr_ok(&["leases", "delete", "--sync", "gc-trigger"]);
    }

    /// `ctr run --rm <reference> <id> <argv>`: stdout.
    fn run(&self, reference: &str, argv: &[&str]) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let id = format!("t{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let mut args = vec!["run", "--rm", reference, &id];
        args.extend_from_slice(argv);
        self.ctr_ok(&args)
    }

    async fn importer(&self) -> Importer {
        Importer::new(images::connect(&self.socket).await.unwrap())
    }

    async fn image_record(&self, name: &str) -> api::Image {
        let channel = images::connect(&self.socket).await.unwrap();
        let mut req = tonic::Request::new(api::GetImageRequest { name: name.into() });
        req.metadata_mut().insert("containerd-namespace", "k8s.io".parse().unwrap());
        api::images_client::ImagesClient::new(channel).get(req).await.unwrap().into_inner().image.unwrap()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Snapshot mounts left behind would keep the directory from being removed.
        let root = self.dir.path().to_string_lossy().into_owned();
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            for target in mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|t| t.starts_with(&root)) {
                let c = std::ffi::CString::new(target).unwrap();
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// busybox from the host as a one-layer image; `extra` makes each variant distinct.
fn busybox(reference: &str, extra: &str) -> ImageBuilder {
    let bin = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static) is needed");
    ImageBuilder::new(reference)
        .file("/bin/busybox", &bin, 0o755)
        .symlink("/bin/sh", "busybox")
        .symlink("/bin/echo", "busybox")
        .symlink("/bin/cat", "busybox")
        .file("/etc/variant", extra.as_bytes(), 0o644)
        .env("PATH=/bin")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

/// A legacy `docker save` archive: `<id>/layer.tar`, `<config>.json`, `manifest.json`, `repositories`.
fn docker_save(img: &oci_image::BuiltImage, tag: &str, layer: &[u8]) -> Vec<u8> {
    let config_name = format!("{}.json", img.config_digest.trim_start_matches("sha256:"));
    let manifest = serde_json::to_vec(
        &serde_json::json!([{"Config": config_name, "RepoTags": [tag], "Layers": ["5f3c0e/layer.tar"]}]),
    )
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("manifest.json", manifest.as_slice()),
        ("5f3c0e/VERSION", b"1.0".as_slice()),
        ("5f3c0e/json", b"{\"id\":\"5f3c0e\"}".as_slice()),
        ("5f3c0e/layer.tar", layer),
        (config_name.as_str(), img.config.as_slice()),
        ("repositories", b"{}".as_slice()),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// Sets a file's mtime `secs` seconds into the past (so it counts as settled).
fn age(path: &Path, secs: u64) {
    let f = std::fs::File::options().append(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs)).unwrap();
}

fn no_pull() -> impl Fn(String) -> BoxFuture<'static, anyhow::Result<()>> + Sync {
    |_| Box::pin(async { Ok(()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_layouts_import_run_and_survive_gc() {
    let Some(ctrd) = Containerd::start("oci_layouts_import_run_and_survive_gc") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();

    let plain = busybox("busybox:plain", "plain");
    let gz = busybox("busybox:gz", "gz");
    let zst = busybox("busybox:zst", "zst");
    let gzlayer = busybox("busybox:gzlayer", "gzlayer").gzip(true);
    let cases = [
        ("plain.tar", plain.oci_layout_tar(), &plain),
        ("gz.tar.gz", gzip(&gz.oci_layout_tar()), &gz),
        ("zst.tar.zst", zstd(&zst.oci_layout_tar()), &zst),
        ("gzlayer.tar", gzlayer.oci_layout_tar(), &gzlayer),
    ];
    for (name, bytes, builder) in &cases {
        let path = write_file(files.path(), name, bytes);
        let calls = Mutex::new(Vec::new());
        let progress = |done: u64, total: u64| calls.lock().unwrap().push((done, total));
        let imported = importer.import_file(&path, &progress).await.unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(imported.len(), 1);
        assert_eq!(imported[0].reference, builder.reference());
        assert_eq!(imported[0].digest, builder.manifest_digest());
        assert_eq!(imported[0].change, ImageChange::Created);
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.last(), Some(&(bytes.len() as u64, bytes.len() as u64)), "{name}: progress ends at 100%");
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{name}: progress only grows");
    }
    assert_eq!(
        ctrd.image_names(),
        [
            "docker.io/library/busybox:gz",
            "docker.io/library/busybox:gzlayer",
            "docker.io/library/busybox:plain",
            "docker.io/library/busybox:zst"
        ]
    );
    assert_eq!(ctrd.leases(), "", "the import leases are gone");

    // Everything stays after a garbage collection: the gc.ref labels hold the layers and configs.
    let wanted: Vec<String> = cases
        .iter()
        .flat_map(|(_, _, b)| {
            let built = b.build();
            [built.manifest_digest, built.config_digest, built.layer_digest]
        })
        .collect();
    ctrd.gc();
    let content = ctrd.content();
    for d in &wanted {
        assert!(content.contains(d), "{d} survived GC; content: {content:?}");
    }
    let labels = ctrd.ctr_ok(&["content", "ls"]);
    assert!(labels.contains("containerd.io/gc.ref.content.config="), "{labels}");
    assert!(labels.contains("containerd.io/gc.ref.content.l.0="), "{labels}");

    // The images run (ctr run unpacks them).
    for (_, _, b) in &cases {
        let out = ctrd.run(b.reference(), &["/bin/echo", "hello"]);
        assert_eq!(out.trim(), "hello", "{}", b.reference());
    }
    assert_eq!(ctrd.run("docker.io/library/busybox:zst", &["/bin/cat", "/etc/variant"]), "zst");

    // Re-import: nothing written, the image record not rewritten.
    let before = importer.stats();
    let record = ctrd.image_record("docker.io/library/busybox:plain").await;
    let content_before = ctrd.content();
    let started = Instant::now();
    for (name, _, _) in &cases {
        let again = importer.import_file(&files.path().join(name), &|_, _| {}).await.unwrap();
        assert_eq!(again[0].change, ImageChange::Unchanged, "{name}");
    }
    eprintln!("re-importing 4 unchanged tarballs took {:?}", started.elapsed());
    let after = importer.stats();
    assert_eq!(after.blobs_written, before.blobs_written, "no blob written: {before:?} → {after:?}");
    assert_eq!(after.bytes_written, before.bytes_written, "no byte written: {before:?} → {after:?}");
    assert_eq!((after.images_created, after.images_updated), (before.images_created, before.images_updated));
    assert_eq!(after.labels_updated, before.labels_updated);
    let record_after = ctrd.image_record("docker.io/library/busybox:plain").await;
    assert_eq!(record_after.updated_at, record.updated_at, "image record untouched");
    assert_eq!(ctrd.content(), content_before);

    // A new build under the same name moves the record.
    let changed = busybox("busybox:plain", "plain v2");
    let imported = importer.import_bytes(&changed.oci_layout_tar()).await.unwrap();
    assert_eq!(imported[0].change, ImageChange::Updated);
    let record_after = ctrd.image_record("docker.io/library/busybox:plain").await;
    assert_eq!(record_after.target.unwrap().digest, changed.manifest_digest());
    assert_ne!(record_after.updated_at, record.updated_at);
    assert_eq!(ctrd.run("docker.io/library/busybox:plain", &["/bin/cat", "/etc/variant"]), "plain v2");
}

#[tokio::test]
async fn docker_save_imports_and_runs() {
    let Some(ctrd) = Containerd::start("docker_save_imports_and_runs") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();

    let plain = busybox("unused", "docker plain").build();
    let compressed = busybox("unused", "docker gz").build();
    let save_plain = docker_save(&plain, "busybox:docker", &plain.layer);
    // Some tools gzip the layers, and the whole archive may be compressed too.
    let save_gz = gzip(&docker_save(&compressed, "registry.local:5000/tools/busybox:gz", &gzip(&compressed.layer)));
    let p1 = write_file(files.path(), "saved.tar", &save_plain);
    let p2 = write_file(files.path(), "saved-gz.tgz", &save_gz);

    let a = importer.import_file(&p1, &|_, _| {}).await.unwrap();
    let b = importer.import_file(&p2, &|_, _| {}).await.unwrap();
    assert_eq!(a[0].reference, "docker.io/library/busybox:docker");
    assert_eq!(b[0].reference, "registry.local:5000/tools/busybox:gz");
    let record = ctrd.image_record("docker.io/library/busybox:docker").await;
    let target = record.target.clone().unwrap();
    assert_eq!(target.media_type, oci_image::MEDIA_DOCKER_MANIFEST);
    assert_eq!(target.digest, a[0].digest);
    let manifest = ctrd.ctr_ok(&["content", "get", &a[0].digest]);
    assert!(manifest.contains(oci_image::MEDIA_DOCKER_LAYER), "{manifest}");
    assert!(manifest.contains(&plain.layer_digest), "{manifest}");

    ctrd.gc();
    assert_eq!(ctrd.run("docker.io/library/busybox:docker", &["/bin/cat", "/etc/variant"]), "docker plain");
    assert_eq!(ctrd.run("registry.local:5000/tools/busybox:gz", &["/bin/cat", "/etc/variant"]), "docker gz");

    // A plain docker save re-imports without writing: its layers are recognized from the configs' diff IDs.
    let before = importer.stats();
    let again = importer.import_file(&p1, &|_, _| {}).await.unwrap();
    assert_eq!(again[0].change, ImageChange::Unchanged);
    let after = importer.stats();
    assert_eq!((after.blobs_written, after.bytes_written), (before.blobs_written, before.bytes_written));
    assert_eq!(ctrd.image_record("docker.io/library/busybox:docker").await.updated_at, record.updated_at);
}

#[tokio::test]
async fn bad_tarballs_leave_nothing_behind() {
    let Some(ctrd) = Containerd::start("bad_tarballs_leave_nothing_behind") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();

    // A 2 MiB layer streamed into containerd before the corrupt config is met.
    let noise: Vec<u8> = (0..2u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let builder = busybox("busybox:bad", "bad").file("/noise", &noise, 0o644);
    let built = builder.build();
    let good = builder.oci_layout_tar();
    let mut bad_digest = good.clone();
    let config_at =
        bad_digest.windows(64).position(|w| w == built.config_digest.trim_start_matches("sha256:").as_bytes()).unwrap();
    bad_digest[config_at + 512 + 10] ^= 0x20;
    let gz = gzip(&good);
    let without_index: Vec<u8> = {
        let mut b = tar::Builder::new(Vec::new());
        let mut ar = tar::Archive::new(good.as_slice());
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let mut h = e.header().clone();
            if e.path().unwrap().to_str() != Some("index.json") {
                let path = e.path().unwrap().into_owned();
                b.append_data(&mut h, path, e).unwrap();
            }
        }
        b.into_inner().unwrap()
    };
    let cases: [(&str, Vec<u8>, &str); 6] = [
        ("truncated.tar.gz", gz[..gz.len() * 2 / 3].to_vec(), "truncated"),
        ("bad-digest.tar", bad_digest, "content does not match its digest"),
        ("no-index.tar", without_index, "no index.json or manifest.json"),
        ("empty.tar", Vec::new(), "the file is empty"),
        ("text.tar", b"not a tarball\n".to_vec(), "not a tar archive"),
        ("truncated.tar", good[..good.len() - 3000].to_vec(), "truncated"),
    ];
    for (name, bytes, why) in &cases {
        let path = write_file(files.path(), name, bytes);
        let err = importer.import_file(&path, &|_, _| {}).await.unwrap_err();
        let msg = format!("{err:#}");
        eprintln!("{name}: {msg}");
        assert!(msg.starts_with(&path.display().to_string()), "names the file: {msg}");
        assert!(msg.contains(why), "{name}: {msg}");
    }
    assert!(ctrd.image_names().is_empty());
    assert_eq!(ctrd.leases(), "", "no lease left behind");
    ctrd.gc();
    assert_eq!(ctrd.content(), Vec::<String>::new(), "what failed imports wrote is collected");
    let missing = importer.import_file(&files.path().join("nope.tar"), &|_, _| {}).await.unwrap_err();
    assert!(format!("{missing:#}").contains("nope.tar: opening the file"), "{missing:#}");
}

/// Collects formatted log lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
    fn count(&self, level: &str) -> usize {
        self.text().lines().filter(|l| l.contains(level)).count()
    }
}

#[tokio::test]
async fn image_dir_imports_once_and_again_when_changed() {
    let Some(ctrd) = Containerd::start("image_dir_imports_once_and_again_when_changed") else { return };
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _log_guard = tracing::subscriber::set_default(subscriber);

    let importer = ctrd.importer().await;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    std::fs::create_dir(&dir).unwrap();
    let state_file = root.path().join("images.imported.json");

    let one = busybox("busybox:one", "one");
    let two = busybox("busybox:two", "two").build();
    let settled = |p: PathBuf| {
        age(&p, 60);
        p
    };
    settled(write_file(&dir, "one.tar", &one.oci_layout_tar()));
    settled(write_file(&dir, "two.tar.zst", &zstd(&docker_save(&two, "busybox:two", &two.layer))));
    settled(write_file(&dir, "broken.tar.gz", &gzip(&one.oci_layout_tar())[..3000]));
    settled(write_file(
        &dir,
        "pull.txt",
        b"# pulled through CRI\nbusybox:1.36\n\nregistry.k8s.io/pause:3.10 # trailing\n",
    ));
    settled(write_file(&dir, ".hidden.tar", b"junk"));
    settled(write_file(&dir, "upload.tar.part", b"junk"));
    settled(write_file(&dir, "README", b"some notes"));
    write_file(&dir, "fresh.tar", &busybox("busybox:fresh", "fresh").oci_layout_tar());

    let pulled = Arc::new(Mutex::new(Vec::new()));
    let recorder = pulled.clone();
    let pull = move |r: String| -> BoxFuture<'static, anyhow::Result<()>> {
        recorder.lock().unwrap().push(r);
        Box::pin(async { Ok(()) })
    };

    let mut watcher = ImageDir::new(dir.clone(), state_file.clone());
    let n = watcher.scan(&importer, &pull).await;
    assert_eq!(n, 4, "one.tar, two.tar.zst, broken.tar.gz, pull.txt (fresh.tar is still settling): {}", logs.text());
    assert_eq!(ctrd.image_names(), ["docker.io/library/busybox:one", "docker.io/library/busybox:two"]);
    assert_eq!(logs.count("WARN"), 1, "{}", logs.text());
    let text = logs.text();
    assert!(text.contains("images/broken.tar.gz") && text.contains("truncated"), "{text}");
    assert!(
        text.contains("imported docker.io/library/busybox:one (sha256:") && text.contains("from images/one.tar in"),
        "{text}"
    );
    assert_eq!(*pulled.lock().unwrap(), ["busybox:1.36", "registry.k8s.io/pause:3.10"]);
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let recorded: Vec<&String> = state["files"].as_object().unwrap().keys().collect();
    assert_eq!(recorded, ["broken.tar.gz", "one.tar", "pull.txt", "two.tar.zst"]);
    assert_eq!(state["files"]["broken.tar.gz"]["ok"], false);
    assert_eq!(state["files"]["one.tar"]["images"][0]["digest"], one.manifest_digest());
    eprintln!("state file:\n{}", std::fs::read_to_string(&state_file).unwrap());

    // Nothing new: nothing done, nothing written (the state file keeps its mtime).
    let state_mtime = std::fs::metadata(&state_file).unwrap().modified().unwrap();
    age(&dir.join("fresh.tar"), 60);
    assert_eq!(watcher.scan(&importer, &pull).await, 1, "fresh.tar settled");
    let state_mtime2 = std::fs::metadata(&state_file).unwrap().modified().unwrap();
    assert_ne!(state_mtime, state_mtime2);
    assert_eq!(watcher.scan(&importer, &pull).await, 0);
    assert_eq!(std::fs::metadata(&state_file).unwrap().modified().unwrap(), state_mtime2);
    assert_eq!(logs.count("WARN"), 1, "the broken file is not retried");

    // A restart remembers.
    let stats = importer.stats();
    let mut watcher = ImageDir::new(dir.clone(), state_file.clone());
    assert_eq!(watcher.scan(&importer, &pull).await, 0);
    assert_eq!(importer.stats(), stats);
    assert_eq!(pulled.lock().unwrap().len(), 2);

    // Replaced by a bigger file: left alone while its size changes between passes, then imported.
    let one_v2 = busybox("busybox:one", "one, second edition").file("/etc/more", &[b'x'; 5000], 0o644);
    settled(write_file(&dir, "one.tar", &one_v2.oci_layout_tar()));
    assert_eq!(watcher.scan(&importer, &pull).await, 0, "size changed since the last pass");
    assert_eq!(watcher.scan(&importer, &pull).await, 1);
    assert_eq!(
        ctrd.image_record("docker.io/library/busybox:one").await.target.unwrap().digest,
        one_v2.manifest_digest()
    );
    // Touched: re-read once it has settled; the record does not change.
    let touched = dir.join("one.tar");
    std::fs::File::options().append(true).open(&touched).unwrap().set_modified(SystemTime::now()).unwrap();
    assert_eq!(watcher.scan(&importer, &pull).await, 0, "modified within the last 2 s");
    age(&touched, 30);
    let updated_at = ctrd.image_record("docker.io/library/busybox:one").await.updated_at;
    assert_eq!(watcher.scan(&importer, &pull).await, 1);
    assert_eq!(ctrd.image_record("docker.io/library/busybox:one").await.updated_at, updated_at);
    // The broken file fixed: imported.
    settled(write_file(&dir, "broken.tar.gz", &gzip(&busybox("busybox:fixed", "fixed").oci_layout_tar())));
    watcher.scan(&importer, &pull).await;
    watcher.scan(&importer, &pull).await;
    assert!(ctrd.image_names().contains(&"docker.io/library/busybox:fixed".to_string()));
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    assert_eq!(state["files"]["broken.tar.gz"]["ok"], true);
    // Removed files are forgotten.
    std::fs::remove_file(dir.join("pull.txt")).unwrap();
    watcher.scan(&importer, &pull).await;
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    assert!(state["files"].get("pull.txt").is_none());
    assert_eq!(ctrd.run("docker.io/library/busybox:two", &["/bin/cat", "/etc/variant"]), "two");

    // watch(): picks up a new file, stops on shutdown.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn(ImageDir::new(dir.clone(), state_file.clone()).watch(
        importer.clone(),
        no_pull(),
        Duration::from_millis(200),
        async move {
            let _ = stop_rx.await;
        },
    ));
    settled(write_file(&dir, "late.tar", &busybox("busybox:late", "late").oci_layout_tar()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ctrd.image_names().contains(&"docker.io/library/busybox:late".to_string()) {
        assert!(Instant::now() < deadline, "watch imported late.tar");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch).await.expect("watch stops on shutdown").unwrap();

    // A fresh file (modified just now) is imported as soon as it has settled, well before the next
    // 60 s poll.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    write_file(&dir, "fresh2.tar", &busybox("busybox:fresh2", "fresh2").oci_layout_tar());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let watch = tokio::spawn(ImageDir::new(dir.clone(), state_file.clone()).watch(
        importer.clone(),
        no_pull(),
        Duration::from_secs(60),
        async move {
            let _ = stop_rx.await;
        },
    ));
    while !ctrd.image_names().contains(&"docker.io/library/busybox:fresh2".to_string()) {
        assert!(Instant::now() < deadline, "watch imported fresh2.tar");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "imported after {took:?}");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch).await.expect("watch stops on shutdown").unwrap();
}

/// Deterministic incompressible bytes.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_of_100_mib() {
    let Some(ctrd) = Containerd::start("import_of_100_mib") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();
    let builder = busybox("busybox:big", "big").file("/random.bin", &noise(100 << 20, 42), 0o644);
    let tar = builder.oci_layout_tar();
    let path = write_file(files.path(), "big.tar", &tar);
    drop(tar);
    let calls = Arc::new(Mutex::new(Vec::<(Instant, u64, u64)>::new()));
    let recorder = calls.clone();
    let progress = move |done: u64, total: u64| recorder.lock().unwrap().push((Instant::now(), done, total));
    let started = Instant::now();
    let imported = importer.import_file(&path, &progress).await.unwrap();
    let took = started.elapsed();
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "IMPORT 100 MiB: {} ({:.1} MiB) imported in {took:.2?} ({:.0} MiB/s), {} progress calls",
        imported[0].reference,
        size as f64 / 1048576.0,
        size as f64 / 1048576.0 / took.as_secs_f64(),
        calls.lock().unwrap().len()
    );
    let calls = calls.lock().unwrap().clone();
    // Often enough to print a line a second: no gap over 1 s between calls.
    for w in calls.windows(2) {
        assert!(w[1].0 - w[0].0 < Duration::from_millis(1000), "progress gap {:?}", w[1].0 - w[0].0);
    }
    let started = Instant::now();
    let again = importer.import_file(&path, &|_, _| {}).await.unwrap();
    assert_eq!(again[0].change, ImageChange::Unchanged);
    eprintln!("IMPORT 100 MiB again (nothing to write): {:.2?}", started.elapsed());
    let stored = ctrd.content();
    assert!(stored.contains(&builder.build().layer_digest));
    let started = Instant::now();
    let out = ctrd.run("docker.io/library/busybox:big", &["/bin/busybox", "wc", "-c", "/random.bin"]);
    assert_eq!(out.split_whitespace().next(), Some((100u64 << 20).to_string().as_str()), "{out}");
    eprintln!("ctr run (unpacking 100 MiB) took {:.2?}", started.elapsed());
}

/// An OCI layout whose index.json names an image index (as multi-platform images are) listing the
/// manifest for this platform.
fn multi_platform_layout(img: &oci_image::BuiltImage, name: &str) -> Vec<u8> {
    let inner = oci_image::canonical_json(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": img.manifest_digest, "size": img.manifest.len(),
                       "platform": {"os": "linux", "architecture": oci_image::host_architecture()}}],
    }));
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": oci_image::sha256_digest(&inner), "size": inner.len(),
                       "annotations": {oci_image::ANNOTATION_IMAGE_NAME: name}}],
    }))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let blobs = [&img.layer, &img.config, &img.manifest, &inner];
    for data in blobs {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        let path = format!("blobs/sha256/{}", oci_image::sha256_digest(data).trim_start_matches("sha256:"));
        b.append_data(&mut h, path, data.as_slice()).unwrap();
    }
    for (path, data) in [("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice()), ("index.json", &index)] {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// The same archives through `ctr images import` (into another namespace) give the same image
/// records and the same GC labels.
#[tokio::test]
async fn same_result_as_ctr_import() {
    let Some(ctrd) = Containerd::start("same_result_as_ctr_import") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();
    let oci = busybox("busybox:oci", "oci");
    let multi = busybox("localhost/cairn/pause:3.10", "pause").gzip(true);
    let saved = busybox("unused", "saved").build();
    let saved_gz = busybox("unused", "saved gz").build();
    // (file, tarball); ctr 1.6 reads only uncompressed archives: it gets the tar inside.
    let cases = [
        (
            "multi.tar",
            multi_platform_layout(&busybox("busybox:multi", "multi").build(), "docker.io/library/busybox:multi"),
        ),
        ("oci.tar", oci.oci_layout_tar()),
        ("pause.tar.gz", gzip(&multi.oci_layout_tar())),
        ("saved.tar", docker_save(&saved, "busybox:saved", &saved.layer)),
        ("saved-gz.tar.zst", zstd(&docker_save(&saved_gz, "example.com:5000/x/y", &gzip(&saved_gz.layer)))),
    ];
    let channel = images::connect(&ctrd.socket).await.unwrap();
    let get = |ns: &'static str, name: String| {
        let channel = channel.clone();
        async move {
            let mut req = tonic::Request::new(api::GetImageRequest { name });
            req.metadata_mut().insert("containerd-namespace", ns.parse().unwrap());
            api::images_client::ImagesClient::new(channel).get(req).await.unwrap().into_inner().image.unwrap()
        }
    };
    let labels = |ns: &str, digest: &str| -> Vec<String> {
        let out = Command::new("ctr").arg("-a").arg(&ctrd.socket).args(["-n", ns, "content", "ls"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with(digest))
            .unwrap_or_else(|| panic!("{digest} in {ns}: {text}"))
            .to_string();
        let mut labels: Vec<String> = line.split_whitespace().last().unwrap().split(',').map(str::to_string).collect();
        labels.sort();
        labels
    };
    for (name, bytes) in &cases {
        let path = write_file(files.path(), name, bytes);
        let ours = importer.import_file(&path, &|_, _| {}).await.unwrap();
        let mut plain = Vec::new();
        match name.rsplit('.').next() {
            Some("gz") => {
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes.as_slice()), &mut plain).unwrap()
            }
            Some("zst") => {
                std::io::Read::read_to_end(&mut zstd::Decoder::new(bytes.as_slice()).unwrap(), &mut plain).unwrap()
            }
            _ => std::io::Read::read_to_end(&mut bytes.as_slice(), &mut plain).unwrap(),
        };
        let ctr_path = write_file(files.path(), &format!("ctr-{name}.tar"), &plain);
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&ctrd.socket)
            .args(["-n", "reference", "images", "import", "--no-unpack", "--all-platforms"])
            .arg(&ctr_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "ctr import {name}: {}", String::from_utf8_lossy(&out.stderr));
        for imported in &ours {
            let mine = get("k8s.io", imported.reference.clone()).await;
            let theirs = get("reference", imported.reference.clone()).await;
            assert_eq!(mine.target, theirs.target, "{name}: same target as ctr import");
            assert_eq!(mine.labels, theirs.labels, "{name}: same image labels");
            let digest = &imported.digest;
            assert_eq!(labels("k8s.io", digest), labels("reference", digest), "{name}: same gc labels");
            eprintln!("{name}: {} → {digest} {:?} matches ctr import", imported.reference, labels("k8s.io", digest));
        }
    }
    assert_eq!(
        ctrd.image_record("docker.io/library/busybox:multi").await.target.unwrap().media_type,
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(ctrd.run("docker.io/library/busybox:multi", &["/bin/cat", "/etc/variant"]), "multi");
}

/// containerd away: the file is not marked bad, one warning, imported once containerd is back
/// (the same channel reconnects).
#[tokio::test]
async fn image_dir_retries_when_containerd_is_away() {
    let Some(mut ctrd) = Containerd::start("image_dir_retries_when_containerd_is_away") else { return };
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _log_guard = tracing::subscriber::set_default(subscriber);
    let importer = ctrd.importer().await;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images");
    std::fs::create_dir(&dir).unwrap();
    let state_file = root.path().join("state.json");
    let file = write_file(&dir, "one.tar", &busybox("busybox:away", "away").oci_layout_tar());
    age(&file, 60);

    ctrd.stop();
    let mut watcher = ImageDir::new(dir.clone(), state_file.clone());
    assert_eq!(watcher.scan(&importer, &no_pull()).await, 1);
    assert_eq!(watcher.scan(&importer, &no_pull()).await, 1);
    assert_eq!(logs.count("WARN"), 1, "{}", logs.text());
    assert!(logs.text().contains("images/one.tar") && logs.text().contains("trying again"), "{}", logs.text());
    assert!(!state_file.exists(), "nothing recorded");

    ctrd.restart();
    assert_eq!(watcher.scan(&importer, &no_pull()).await, 1);
    assert_eq!(ctrd.image_names(), ["docker.io/library/busybox:away"]);
    assert_eq!(watcher.scan(&importer, &no_pull()).await, 0);
}

/// Dropping an import midway stops it, drops its lease and leaves no image behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_import_cleans_up() {
    let Some(ctrd) = Containerd::start("cancelled_import_cleans_up") else { return };
    let importer = ctrd.importer().await;
    let files = tempfile::tempdir().unwrap();
    let builder = busybox("busybox:cancelled", "c").file("/random.bin", &noise(64 << 20, 9), 0o644);
    let path = write_file(files.path(), "big.tar", &builder.oci_layout_tar());
    let started = Instant::now();
    let res = tokio::time::timeout(Duration::from_millis(300), importer.import_file(&path, &|_, _| {})).await;
    assert!(res.is_err(), "still importing after 300 ms");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let active = ctrd.ctr_ok(&["content", "active"]);
        if ctrd.leases().is_empty() && active.lines().count() <= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "lease or ingest left: {} / {active}", ctrd.leases());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("cancelled import cleaned up {:?} after it started", started.elapsed());
    assert!(ctrd.image_names().is_empty());
    ctrd.gc();
    assert!(!ctrd.content().contains(&builder.build().layer_digest));
    // And a full import afterwards works.
    importer.import_file(&path, &|_, _| {}).await.unwrap();
    assert_eq!(ctrd.image_names(), ["docker.io/library/busybox:cancelled"]);
}

#[test]
fn progress_lines_at_most_once_a_second() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let total = 100u64 << 20;
    let progress = images::progress_logger_named("images/big.tar".into());
    progress(0, total);
    progress(total / 10, total);
    assert_eq!(logs.count("importing"), 0, "nothing in the first second");
    std::thread::sleep(Duration::from_millis(1100));
    progress(total * 2 / 5, total);
    progress(total / 2, total);
    assert_eq!(logs.count("importing"), 1, "{}", logs.text());
    assert!(logs.text().contains("importing images/big.tar: 40% (40.0 MiB of 100.0 MiB)"), "{}", logs.text());
    std::thread::sleep(Duration::from_millis(1100));
    progress(total, total);
    assert_eq!(logs.count("importing"), 1, "no line at 100%");
    // Small files: no lines at all.
    let small = images::progress_logger_named("images/small.tar".into());
    std::thread::sleep(Duration::from_millis(1100));
    small(1, 2 << 20);
    assert_eq!(logs.count("small.tar"), 0);
}
