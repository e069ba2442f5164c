use super::dir::*;
use super::*;
use oci_image::{ImageBuilder, canonical_json};
use serde_json::json;
use std::io::Write as _;

/// A blob's bytes and labels.
type Blob = (Vec<u8>, HashMap<String, String>);

/// containerd's content store and image records, in memory.
#[derive(Default)]
struct MemStore {
    blobs: Mutex<HashMap<String, Blob>>,
    images: Mutex<HashMap<String, Target>>,
    bytes_written: AtomicU64,
    commits: AtomicU64,
    label_updates: AtomicU64,
}

struct MemWriter<'a> {
    store: &'a MemStore,
    buf: Vec<u8>,
}

impl Store for MemStore {
    fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>> {
        Ok(self.blobs.lock().unwrap().get(digest).map(|b| b.1.clone()))
    }
    fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>> {
        if let Some((d, _)) = expected
            && self.blobs.lock().unwrap().contains_key(d)
        {
            return Ok(None);
        }
        Ok(Some(Box::new(MemWriter { store: self, buf: Vec::new() })))
    }
    fn read(&self, digest: &str, _limit: u64) -> Result<Vec<u8>> {
        self.blobs.lock().unwrap().get(digest).map(|b| b.0.clone()).ok_or_else(|| anyhow!("{digest} not found"))
    }
    fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let mut blobs = self.blobs.lock().unwrap();
        let blob = blobs.get_mut(digest).ok_or_else(|| anyhow!("{digest} not found"))?;
        blob.1.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.label_updates.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange> {
        let mut images = self.images.lock().unwrap();
        Ok(match images.insert(name.to_string(), target.clone()) {
            None => ImageChange::Created,
            Some(old) if old == *target => ImageChange::Unchanged,
            Some(_) => ImageChange::Updated,
        })
    }
    fn cancelled(&self) -> bool {
        false
    }
}

impl BlobWriter for MemWriter<'_> {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(data);
        self.store.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn commit(self: Box<Self>, digest: &str, size: u64) -> Result<bool> {
        if sha256_digest(&self.buf) != digest || self.buf.len() as u64 != size {
            bail!("unexpected commit digest");
        }
        let mut blobs = self.store.blobs.lock().unwrap();
        if blobs.contains_key(digest) {
            return Ok(false);
        }
        blobs.insert(digest.to_string(), (self.buf, HashMap::new()));
        self.store.commits.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
    fn abort(self: Box<Self>) {}
}

impl MemStore {
    fn labels(&self, digest: &str) -> HashMap<String, String> {
        self.blobs.lock().unwrap()[digest].1.clone()
    }
    fn has(&self, digest: &str) -> bool {
        self.blobs.lock().unwrap().contains_key(digest)
    }
    fn written(&self) -> (u64, u64) {
        (self.bytes_written.load(Ordering::Relaxed), self.commits.load(Ordering::Relaxed))
    }
}

fn import(store: &MemStore, tar: &[u8]) -> Result<Vec<Imported>> {
    import_sync(store, Box::new(io::Cursor::new(tar.to_vec())), &Arc::default())
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 1).unwrap()
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

fn image(tag: &str, big: usize) -> ImageBuilder {
    ImageBuilder::new(&format!("busybox:{tag}"))
        .file("/bin/busybox", b"binary", 0o755)
        .symlink("/bin/sh", "busybox")
        .file("/data", &noise(big, 7), 0o644)
        .cmd(&["/bin/sh"])
}

/// A tar from (path, contents) pairs, plus symlinks as (path, "->target").
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        if let Some(target) = std::str::from_utf8(data).ok().and_then(|s| s.strip_prefix("->")) {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, target).unwrap();
        } else {
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, *data).unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// A legacy `docker save` archive of `img` (manifest.json last, layer under a v1 id directory).
fn docker_save(img: &oci_image::BuiltImage, tags: &[&str], layer: &[u8]) -> Vec<u8> {
    let config_name = format!("{}.json", img.config_digest.trim_start_matches("sha256:"));
    let manifest =
        serde_json::to_vec(&json!([{"Config": config_name, "RepoTags": tags, "Layers": ["0123abcd/layer.tar"]}]))
            .unwrap();
    tar_of(&[
        ("0123abcd/VERSION", b"1.0"),
        ("0123abcd/json", b"{}"),
        ("0123abcd/layer.tar", layer),
        (&config_name, &img.config),
        ("repositories", b"{}"),
        ("manifest.json", &manifest),
    ])
}

#[test]
fn sniffs_formats_by_magic() {
    let tar = image("x", 10).oci_layout_tar();
    assert_eq!(sniff_tarball(&tar[..512]), Some(Compression::None));
    assert_eq!(sniff_tarball(&gzip(&tar)[..16]), Some(Compression::Gzip));
    assert_eq!(sniff_tarball(&zstd(&tar)[..16]), Some(Compression::Zstd));
    assert_eq!(sniff_tarball(b""), None);
    assert_eq!(sniff_tarball(b"hello world"), None);
    assert_eq!(sniff_tarball(&[b'x'; 512]), None);
    // An old v7 header has no magic, only a checksum.
    let mut h = tar::Header::new_old();
    h.set_path("a").unwrap();
    h.set_size(0);
    h.set_cksum();
    assert!(is_tar_header(h.as_bytes()));
    assert!(!is_tar_header(&[0u8; 512]));
}

#[test]
fn imports_an_oci_layout_and_reimports_for_free() {
    let store = MemStore::default();
    let builder = image("test", 100);
    let built = builder.build();
    let imported = import(&store, &builder.oci_layout_tar()).unwrap();
    assert_eq!(
        imported,
        [Imported {
            reference: "docker.io/library/busybox:test".into(),
            digest: built.manifest_digest.clone(),
            change: ImageChange::Created
        }]
    );
    for d in [&built.manifest_digest, &built.config_digest, &built.layer_digest] {
        assert!(store.has(d), "{d} stored");
    }
    let labels = store.labels(&built.manifest_digest);
    assert_eq!(labels[LABEL_GC_CONFIG], built.config_digest);
    assert_eq!(labels["containerd.io/gc.ref.content.l.0"], built.layer_digest);
    let target = store.images.lock().unwrap()["docker.io/library/busybox:test"].clone();
    assert_eq!(target.media_type, "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(target.size, built.manifest.len() as i64);

    let before = store.written();
    let labels_before = store.label_updates.load(Ordering::Relaxed);
    let again = import(&store, &builder.oci_layout_tar()).unwrap();
    assert_eq!(again[0].change, ImageChange::Unchanged);
    assert_eq!(store.written(), before, "nothing written on re-import");
    assert_eq!(store.label_updates.load(Ordering::Relaxed), labels_before, "labels not rewritten");
}

#[test]
fn compressed_layouts_and_streamed_blobs() {
    // 3 MiB of noise: streamed (not held in memory), in a gzip'd layer too.
    for gz_layer in [false, true] {
        let builder = image("big", 3 << 20).gzip(gz_layer);
        let built = builder.build();
        let tar = builder.oci_layout_tar();
        for (what, bytes) in [("plain", tar.clone()), ("gzip", gzip(&tar)), ("zstd", zstd(&tar))] {
            let store = MemStore::default();
            let imported = import(&store, &bytes).unwrap_or_else(|e| panic!("{what}: {e:#}"));
            assert_eq!(imported[0].digest, built.manifest_digest, "{what}");
            assert_eq!(store.read(&built.layer_digest, u64::MAX).unwrap(), built.layer, "{what}");
            let before = store.written();
            assert_eq!(import(&store, &bytes).unwrap()[0].change, ImageChange::Unchanged);
            assert_eq!(store.written(), before, "{what}: re-import writes nothing");
        }
    }
}

#[test]
fn changed_image_updates_the_record() {
    let store = MemStore::default();
    import(&store, &image("t", 10).oci_layout_tar()).unwrap();
    let imported = import(&store, &image("t", 11).oci_layout_tar()).unwrap();
    assert_eq!(imported[0].change, ImageChange::Updated);
    assert_eq!(store.images.lock().unwrap()["docker.io/library/busybox:t"].digest, image("t", 11).manifest_digest());
}

#[test]
fn imports_docker_save() {
    for big in [100, 3 << 20] {
        let built = image("x", big).build();
        let save = docker_save(&built, &["busybox:saved", "registry:5000/team/app"], &built.layer);
        for (what, bytes) in [("plain", save.clone()), ("gzip", gzip(&save))] {
            let store = MemStore::default();
            let imported = import(&store, &bytes).unwrap_or_else(|e| panic!("{what}: {e:#}"));
            let names: Vec<&str> = imported.iter().map(|i| i.reference.as_str()).collect();
            assert_eq!(names, ["docker.io/library/busybox:saved", "registry:5000/team/app:latest"]);
            assert_eq!(imported[0].digest, imported[1].digest);
            let manifest: serde_json::Value =
                serde_json::from_slice(&store.read(&imported[0].digest, u64::MAX).unwrap()).unwrap();
            assert_eq!(manifest["mediaType"], oci_image::MEDIA_DOCKER_MANIFEST);
            assert_eq!(manifest["config"]["mediaType"], oci_image::MEDIA_DOCKER_CONFIG);
            assert_eq!(manifest["config"]["digest"], built.config_digest);
            assert_eq!(manifest["layers"][0]["mediaType"], oci_image::MEDIA_DOCKER_LAYER);
            assert_eq!(manifest["layers"][0]["digest"], built.layer_digest);
            assert_eq!(manifest["layers"][0]["size"], built.layer.len());
            let labels = store.labels(&imported[0].digest);
            assert_eq!(labels[LABEL_GC_CONFIG], built.config_digest);
            assert_eq!(labels["containerd.io/gc.ref.content.l.0"], built.layer_digest);
            assert!(store.has(&built.layer_digest));
            let target = store.images.lock().unwrap()["docker.io/library/busybox:saved"].clone();
            assert_eq!(target.media_type, oci_image::MEDIA_DOCKER_MANIFEST);
            // Junk files of the archive (VERSION, json, repositories) are not stored.
            assert_eq!(store.blobs.lock().unwrap().len(), 3, "{what}");
            let before = store.written();
            let again = import(&store, &bytes).unwrap();
            assert!(again.iter().all(|i| i.change == ImageChange::Unchanged));
            if what == "plain" || big <= SMALL as usize {
                assert_eq!(store.written(), before, "{what}/{big}: a plain docker save re-imports without writes");
            } else {
                // Compressed, large and unknown until hashed: streamed again, but nothing committed.
                assert_eq!(store.written().1, before.1, "{what}/{big}: no new blob");
            }
        }
    }
}

#[test]
fn docker_save_variants() {
    let built = image("x", 10).build();
    // A gzip-compressed layer gets the gzip media type.
    let save = docker_save(&built, &["gz:1"], &gzip(&built.layer));
    let store = MemStore::default();
    let imported = import(&store, &save).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&store.read(&imported[0].digest, u64::MAX).unwrap()).unwrap();
    assert_eq!(manifest["layers"][0]["mediaType"], oci_image::MEDIA_DOCKER_LAYER_GZIP);

    // Layers behind symlinks (docker save de-duplicates that way), manifest.json first.
    let config_name = format!("{}.json", built.config_digest.trim_start_matches("sha256:"));
    let manifest = serde_json::to_vec(&json!([
        {"Config": config_name, "RepoTags": ["a:1"], "Layers": ["aaa/layer.tar"]},
        {"Config": config_name, "RepoTags": ["b:1"], "Layers": ["./bbb/layer.tar"]},
    ]))
    .unwrap();
    let save = tar_of(&[
        ("manifest.json", &manifest),
        ("bbb/layer.tar", b"->../aaa/layer.tar"),
        ("aaa/layer.tar", &built.layer),
        (&config_name, &built.config),
    ]);
    let store = MemStore::default();
    let imported = import(&store, &save).unwrap();
    assert_eq!(imported.len(), 2);
    assert_eq!(imported[0].digest, imported[1].digest);

    // Untagged images cannot be named.
    let untagged =
        serde_json::to_vec(&json!([{"Config": config_name, "RepoTags": null, "Layers": ["aaa/layer.tar"]}])).unwrap();
    let save = tar_of(&[("manifest.json", &untagged), ("aaa/layer.tar", &built.layer), (&config_name, &built.config)]);
    let err = format!("{:#}", import(&MemStore::default(), &save).unwrap_err());
    assert!(err.contains("no RepoTags"), "{err}");

    // A layer listed but absent.
    let save = tar_of(&[("manifest.json", &manifest), (&config_name, &built.config)]);
    let err = format!("{:#}", import(&MemStore::default(), &save).unwrap_err());
    assert!(err.contains("aaa/layer.tar is missing from the tarball"), "{err}");
}

#[test]
fn newer_docker_save_prefers_index_json() {
    // docker 25+: an OCI layout plus manifest.json pointing into blobs/.
    let built = image("new", 10).build();
    let hexname = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let manifest_json = serde_json::to_vec(&json!([{
        "Config": hexname(&built.config_digest), "RepoTags": ["busybox:from-manifest-json"],
        "Layers": [hexname(&built.layer_digest)]
    }]))
    .unwrap();
    let files = [
        (hexname(&built.layer_digest), built.layer.clone()),
        (hexname(&built.config_digest), built.config.clone()),
        (hexname(&built.manifest_digest), built.manifest.clone()),
        ("index.json".to_string(), built.index.clone()),
        ("manifest.json".to_string(), manifest_json),
    ];
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
    let store = MemStore::default();
    let imported = import(&store, &tar_of(&refs)).unwrap();
    assert_eq!(imported.len(), 1);
    assert_eq!(imported[0].reference, "docker.io/library/busybox:new");
    assert_eq!(imported[0].digest, built.manifest_digest);
}

#[test]
fn names_from_annotations() {
    let a =
        |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
    assert_eq!(
        image_name(&a(&[(oci_image::ANNOTATION_IMAGE_NAME, "busybox:1")])).unwrap().as_deref(),
        Some("docker.io/library/busybox:1")
    );
    assert_eq!(image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "latest")])).unwrap(), None);
    assert_eq!(image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "3.10")])).unwrap(), None);
    assert_eq!(
        image_name(&a(&[(oci_image::ANNOTATION_REF_NAME, "foo/bar:1")])).unwrap().as_deref(),
        Some("docker.io/foo/bar:1")
    );
    assert_eq!(
        image_name(&a(&[(oci_image::ANNOTATION_IMAGE_NAME, "quay.io/x/y:2"), (oci_image::ANNOTATION_REF_NAME, "2")]))
            .unwrap()
            .as_deref(),
        Some("quay.io/x/y:2")
    );
    assert!(image_name(&a(&[(oci_image::ANNOTATION_IMAGE_NAME, "Not Valid")])).is_err());
}

/// Rebuilds a layout tar with index.json replaced.
fn with_index(tar: &[u8], index: &serde_json::Value, extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut ar = tar::Archive::new(tar);
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        if path != "index.json" {
            files.push((path, data));
        }
    }
    for (p, d) in extra {
        files.push((p.to_string(), d.to_vec()));
    }
    files.push(("index.json".into(), serde_json::to_vec(index).unwrap()));
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
    tar_of(&refs)
}

#[test]
fn multi_platform_index_is_the_target() {
    let built = image("multi", 10).build();
    let other = format!("sha256:{}", "e".repeat(64));
    let inner = canonical_json(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": built.manifest_digest, "size": built.manifest.len(),
             "platform": {"os": "linux", "architecture": "amd64"}},
            // Another platform, left out of the tarball.
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": other, "size": 100,
             "platform": {"os": "linux", "architecture": "arm64"}},
        ]
    }));
    let inner_digest = sha256_digest(&inner);
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": inner_digest, "size": inner.len(),
        "annotations": {oci_image::ANNOTATION_REF_NAME: "docker.io/library/multi:1"}
    }]});
    let path = format!("blobs/sha256/{}", inner_digest.trim_start_matches("sha256:"));
    let tar = with_index(&image("multi", 10).oci_layout_tar(), &index, &[(&path, &inner)]);
    let store = MemStore::default();
    let imported = import(&store, &tar).unwrap();
    assert_eq!(imported[0].reference, "docker.io/library/multi:1");
    assert_eq!(imported[0].digest, inner_digest);
    let labels = store.labels(&inner_digest);
    assert_eq!(labels["containerd.io/gc.ref.content.m.0"], built.manifest_digest);
    assert_eq!(labels["containerd.io/gc.ref.content.m.1"], other);
    assert_eq!(
        store.images.lock().unwrap()["docker.io/library/multi:1"].media_type,
        "application/vnd.oci.image.index.v1+json"
    );
}

fn err_of(tar: &[u8]) -> String {
    let store = MemStore::default();
    let err = format!("{:#}", import(&store, tar).unwrap_err());
    eprintln!("error: {err}");
    assert!(store.images.lock().unwrap().is_empty(), "no image record after: {err}");
    err
}

#[test]
fn corrupt_inputs_give_clear_errors() {
    let builder = image("bad", 3 << 20);
    let built = builder.build();
    let good = builder.oci_layout_tar();

    assert!(err_of(b"").contains("the file is empty"));
    let e = err_of(b"this is not an image at all, just some text");
    assert!(e.contains("not a tar archive, nor gzip or zstd"), "{e}");
    let e = err_of(&gzip(b"plain text, gzipped"));
    assert!(e.contains("gzip-compressed tar does not hold a tar archive"), "{e}");
    let e = err_of(&[0u8; 10240]);
    assert!(e.contains("the tar archive is empty"), "{e}");
    let e = err_of(&tar_of(&[]));
    assert!(e.contains("the tar archive is empty"), "{e}");
    let e = err_of(&zstd(&tar_of(&[])));
    assert!(e.contains("the zstd-compressed tar is an empty tar archive"), "{e}");
    let e = err_of(&[0x1f, 0x8b, 8, 0, 0]);
    assert!(e.contains("truncated"), "{e}");
    let e = err_of(&tar_of(&[("hello.txt", b"hi")]));
    assert!(e.contains("no index.json or manifest.json"), "{e}");

    // Truncated: plain, gzip and zstd, in the big layer.
    let cut = good.len() / 2;
    let e = err_of(&good[..cut]);
    assert!(e.contains("truncated"), "{e}");
    let gz = gzip(&good);
    let e = err_of(&gz[..gz.len() - 100]);
    assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
    let e = err_of(&gz[..gz.len() / 2]);
    assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
    let zs = zstd(&good);
    let e = err_of(&zs[..zs.len() / 2]);
    assert!(e.contains("truncated") || e.contains("corrupt") || e.contains("zstd"), "{e}");

    // A blob whose bytes do not match its name: a big one (streamed) and a small one (config).
    for digest in [&built.layer_digest, &built.config_digest] {
        let hexname = digest.trim_start_matches("sha256:");
        let mut bad = good.clone();
        let at = find(&bad, format!("blobs/sha256/{hexname}").as_bytes()) + 512 + 100;
        bad[at] ^= 0xff;
        let e = err_of(&bad);
        assert!(e.contains(&format!("blobs/sha256/{hexname}: content does not match its digest")), "{e}");
    }

    // index.json names a manifest that is not there.
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "a".repeat(64)), "size": 10,
        "annotations": {oci_image::ANNOTATION_IMAGE_NAME: "x:1"}}]});
    let e = err_of(&with_index(&good, &index, &[]));
    assert!(e.contains("is missing from the tarball"), "{e}");
    // Broken index.json.
    let mut files = vec![];
    let mut ar = tar::Archive::new(good.as_slice());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().to_string_lossy().into_owned();
        let mut d = vec![];
        e.read_to_end(&mut d).unwrap();
        if p == "index.json" {
            d = b"{not json".to_vec();
        }
        if e.header().entry_type() == tar::EntryType::Regular {
            files.push((p, d));
        }
    }
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
    let e = err_of(&tar_of(&refs));
    assert!(e.contains("index.json: invalid JSON"), "{e}");
    // No name anywhere.
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": built.manifest_digest, "size": built.manifest.len(),
        "annotations": {oci_image::ANNOTATION_REF_NAME: "latest"}}]});
    let e = err_of(&with_index(&good, &index, &[]));
    assert!(e.contains("index.json names no image"), "{e}");
    // A layer missing from the layout.
    let layer_path = format!("blobs/sha256/{}", built.layer_digest.trim_start_matches("sha256:"));
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .filter(|(p, _)| *p != layer_path && p != "index.json")
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .chain([("index.json", built.index.as_slice())])
        .collect();
    let e = err_of(&tar_of(&refs));
    assert!(
        e.contains(&format!("layer {} (1 of 1)", built.layer_digest)) && e.contains("missing from the tarball"),
        "{e}"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("present")
}

#[test]
fn oci_ref_names() {
    assert_eq!(oci_ref_name("docker.io/library/busybox:latest"), "latest");
    assert_eq!(oci_ref_name("registry:5000/x:y"), "y");
    let d = format!("sha256:{}", "a".repeat(64));
    assert_eq!(oci_ref_name(&format!("registry:5000/x:1@{d}")), format!("1@{d}"));
    assert_eq!(oci_ref_name(&format!("registry:5000/x@{d}")), format!("@{d}"));
}

#[test]
fn paths_and_pull_lists() {
    assert_eq!(clean_path("./a/b/"), "a/b");
    assert_eq!(clean_path("/a/../b/./c"), "b/c");
    assert_eq!(
        blob_path_digest(&format!("blobs/sha256/{}", "a".repeat(64))).unwrap(),
        Some(format!("sha256:{}", "a".repeat(64)))
    );
    assert_eq!(blob_path_digest("blobs/sha256/short").unwrap(), None);
    assert!(blob_path_digest(&format!("blobs/sha512/{}", "a".repeat(128))).is_err());
    assert_eq!(
        parse_pull_list("# images\nbusybox:1.36\n\n  quay.io/x/y:2  # inline\n#nothing\n"),
        ["busybox:1.36", "quay.io/x/y:2"]
    );
    let dir = std::env::temp_dir().join(format!("images-classify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let w = |name: &str, data: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    assert_eq!(classify("a.txt", &w("a.txt", b"x")), Some(FileKind::PullList));
    assert_eq!(classify(README_NAME, &w(README_NAME, README.as_bytes())), None);
    assert_eq!(classify("a.tar.zst", &w("a.tar.zst", b"x")), Some(FileKind::Tarball));
    assert_eq!(classify("a.tgz", &w("a.tgz", b"x")), Some(FileKind::Tarball));
    assert_eq!(classify("noext", &w("noext", &gzip(b"x"))), Some(FileKind::Tarball));
    assert_eq!(classify("image.oci", &w("image.oci", &tar_of(&[("a", b"1")]))), Some(FileKind::Tarball));
    assert_eq!(classify("README", &w("README", b"hello")), None);
    let _ = std::fs::remove_dir_all(&dir);
}
