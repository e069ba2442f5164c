//! Tiny OCI images built in memory: one layer from files, directories and symlinks, an image config,
//! a manifest and an OCI image layout tarball (`oci-layout`, `index.json`, `blobs/sha256/...`) that
//! containerd imports like `ctr images import` does.
//!
//! Output is byte-for-byte deterministic for the same inputs (sorted entries, fixed owners and mtimes,
//! JSON with sorted keys), so importing the same built-in image at every start changes nothing.
//!
//! The config, manifest and index are oci-spec's typed structures. Self-contained on purpose (no
//! `crate::` paths, no async) so integration tests can include it with `#[path]`. The reference,
//! digest and media-type helpers here are shared with the importer.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;

use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, PlatformBuilder, RootFsBuilder,
};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Docker's media types, which oci-spec leaves to `MediaType::Other`.
pub const MEDIA_DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const MEDIA_DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
pub const MEDIA_DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// containerd's annotation for the full image name on an index.json entry.
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation, usually just the tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// oci-spec's structures with sorted keys (see [`canonical_json`]). They always serialize: every map
/// in them has string keys.
pub fn canonical<T: Serialize>(value: &T) -> Vec<u8> {
    canonical_json(&serde_json::to_value(value).expect("OCI structures serialize to JSON"))
}

/// A descriptor of `size` bytes with `digest` (a `sha256:` digest this module computed).
fn descriptor(media_type: MediaType, digest: &str, size: usize) -> DescriptorBuilder {
    let digest: oci_spec::image::Digest = digest.parse().expect("a sha256 digest computed here");
    DescriptorBuilder::default().media_type(media_type).digest(digest).size(size as u64)
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// JSON with object keys sorted and no whitespace: the same bytes whatever serde_json's
/// `preserve_order` feature says, so digests never depend on how the crate was built.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    fn write(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(serde_json::to_string(k).expect("string").as_bytes());
                    out.push(b':');
                    write(out, &map[k]);
                }
                out.push(b'}');
            }
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(out, item);
                }
                out.push(b']');
            }
            scalar => out.extend_from_slice(serde_json::to_string(scalar).expect("scalar").as_bytes()),
        }
    }
    let mut out = Vec::new();
    write(&mut out, value);
    out
}

/// Normalizes an image reference the way containerd and docker do: `busybox` →
/// `docker.io/library/busybox:latest`, `foo/bar:1` → `docker.io/foo/bar:1`, `registry:5000/x:y` and
/// `localhost/x:y` unchanged; a reference without tag or digest gets `:latest`.
pub fn normalize_reference(reference: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("invalid image reference {reference:?}: {why}"));
    let r = reference.trim();
    if r.is_empty() {
        return bad("empty");
    }
    if r.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace");
    }
    let (name_tag, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let Some((alg, hexpart)) = d.split_once(':') else { return bad("digest without algorithm") };
        if alg.is_empty() || hexpart.len() < 32 || !hexpart.chars().all(|c| c.is_ascii_hexdigit()) {
            return bad("malformed digest");
        }
    }
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].rfind(':') {
        Some(i) => (&name_tag[..last_slash + i], Some(&name_tag[last_slash + i + 1..])),
        None => (name_tag, None),
    };
    if let Some(t) = tag {
        let valid = !t.is_empty()
            && t.len() <= 128
            && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            && !t.starts_with(['.', '-']);
        if !valid {
            return bad("malformed tag");
        }
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => ("docker.io".to_string(), name.to_string()),
    };
    let domain = if domain == "index.docker.io" { "docker.io".to_string() } else { domain };
    if domain.is_empty()
        || !domain.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
    {
        return bad("malformed registry host");
    }
    if path.is_empty() {
        return bad("no repository name");
    }
    for component in path.split('/') {
        let ok = !component.is_empty()
            && component.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
            && component.starts_with(|c: char| c.is_ascii_alphanumeric())
            && component.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return bad("repository names are lowercase letters, digits and separators");
        }
    }
    let path = if domain == "docker.io" && !path.contains('/') { format!("library/{path}") } else { path };
    let mut out = format!("{domain}/{path}");
    match (tag, digest) {
        (Some(t), _) => {
            out.push(':');
            out.push_str(t);
        }
        (None, None) => out.push_str(":latest"),
        (None, Some(_)) => {}
    }
    if let Some(d) = digest {
        out.push('@');
        out.push_str(d);
    }
    Ok(out)
}

/// The tag of a normalized reference (`latest` when it has only a digest).
pub fn reference_tag(normalized: &str) -> &str {
    let name = normalized.split('@').next().unwrap_or(normalized);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[last_slash..].rfind(':') {
        Some(i) => &name[last_slash + i + 1..],
        None => "latest",
    }
}

/// The Go name of this machine's architecture, as image configs and platforms spell it.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[allow(dead_code, reason = "a general builder: the binary uses part of it, tests the rest")]
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File { contents: Vec<u8>, mode: u32 },
    Symlink(String),
    Dir(u32),
}

/// Builds a one-layer image in memory. Paths are absolute or relative to the image root; `..` is
/// rejected (a panic: the inputs are the program's own constants). A later entry for the same path
/// replaces the earlier one.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    reference: String,
    entries: BTreeMap<Vec<String>, Node>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Vec<String>,
    working_dir: Option<String>,
    user: Option<String>,
    labels: BTreeMap<String, String>,
    os: String,
    architecture: String,
    gzip: bool,
}

/// Everything an image is made of, with digests.
#[allow(dead_code, reason = "a general builder: the binary uses part of it, tests the rest")]
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The normalized reference (`io.containerd.image.name`).
    pub reference: String,
    /// The layer blob as stored (uncompressed, or gzip when asked for).
    pub layer: Vec<u8>,
    pub layer_digest: String,
    pub layer_media_type: MediaType,
    /// Digest of the uncompressed layer tar (the config's `rootfs.diff_ids[0]`).
    pub diff_id: String,
    pub config: Vec<u8>,
    pub config_digest: String,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
    pub index: Vec<u8>,
}

fn components(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => panic!("image path {path:?} must not contain '..'"),
            c => out.push(c.to_string()),
        }
    }
    assert!(!out.is_empty(), "image path {path:?} names the root");
    out
}

#[allow(dead_code, reason = "a general builder: the binary uses part of it, tests the rest")]
impl ImageBuilder {
    /// `reference` is normalized (`busybox:test` → `docker.io/library/busybox:test`); one that does not
    /// parse is kept as given.
    pub fn new(reference: &str) -> Self {
        ImageBuilder {
            reference: normalize_reference(reference).unwrap_or_else(|_| reference.to_string()),
            entries: BTreeMap::new(),
            entrypoint: None,
            cmd: None,
            env: Vec::new(),
            working_dir: None,
            user: None,
            labels: BTreeMap::new(),
            os: "linux".into(),
            architecture: host_architecture().into(),
            gzip: false,
        }
    }
    /// A regular file; missing parent directories are created (0755).
    pub fn file(mut self, path_in_image: &str, contents: &[u8], mode: u32) -> Self {
        self.entries.insert(components(path_in_image), Node::File { contents: contents.to_vec(), mode: mode & 0o7777 });
        self
    }
    pub fn symlink(mut self, path_in_image: &str, target: &str) -> Self {
        self.entries.insert(components(path_in_image), Node::Symlink(target.to_string()));
        self
    }
    pub fn dir(mut self, path_in_image: &str, mode: u32) -> Self {
        self.entries.insert(components(path_in_image), Node::Dir(mode & 0o7777));
        self
    }
    pub fn entrypoint(mut self, argv: &[&str]) -> Self {
        self.entrypoint = Some(argv.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn cmd(mut self, argv: &[&str]) -> Self {
        self.cmd = Some(argv.iter().map(|s| s.to_string()).collect());
        self
    }
    /// `KEY=value`.
    pub fn env(mut self, kv: &str) -> Self {
        self.env.push(kv.to_string());
        self
    }
    pub fn working_dir(mut self, d: &str) -> Self {
        self.working_dir = Some(d.to_string());
        self
    }
    pub fn user(mut self, u: &str) -> Self {
        self.user = Some(u.to_string());
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }
    /// Architecture in the config and index (default: this machine's, e.g. `amd64`).
    pub fn architecture(mut self, arch: &str) -> Self {
        self.architecture = arch.to_string();
        self
    }
    /// Store the layer gzip-compressed (default: uncompressed).
    pub fn gzip(mut self, on: bool) -> Self {
        self.gzip = on;
        self
    }
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The uncompressed layer tar: entries sorted by path, parents first, owned by 0:0, mtime 0.
    pub fn layer_tar(&self) -> Vec<u8> {
        let mut all = self.entries.clone();
        for key in self.entries.keys() {
            for i in 1..key.len() {
                all.entry(key[..i].to_vec()).or_insert(Node::Dir(0o755));
            }
        }
        let mut tar = tar::Builder::new(Vec::new());
        for (key, node) in &all {
            let path = key.join("/");
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            let res = match node {
                Node::Dir(mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    tar.append_data(&mut h, format!("{path}/"), std::io::empty())
                }
                Node::File { contents, mode } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(contents.len() as u64);
                    tar.append_data(&mut h, &path, contents.as_slice())
                }
                Node::Symlink(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    tar.append_link(&mut h, &path, target)
                }
            };
            res.expect("writing a tar to memory");
        }
        tar.into_inner().expect("writing a tar to memory")
    }

    // The builders below fail only when a required field is missing; every one is set.
    fn config_json(&self, diff_id: &str) -> Vec<u8> {
        let mut config = ConfigBuilder::default();
        if let Some(e) = &self.entrypoint {
            config = config.entrypoint(e.clone());
        }
        if let Some(c) = &self.cmd {
            config = config.cmd(c.clone());
        }
        if !self.env.is_empty() {
            config = config.env(self.env.clone());
        }
        if let Some(w) = &self.working_dir {
            config = config.working_dir(w.clone());
        }
        if let Some(u) = &self.user {
            config = config.user(u.clone());
        }
        if !self.labels.is_empty() {
            config = config.labels(self.labels.clone().into_iter().collect::<HashMap<_, _>>());
        }
        let rootfs = RootFsBuilder::default().typ("layers").diff_ids(vec![diff_id.to_string()]);
        let image = ImageConfigurationBuilder::default()
            .architecture(Arch::from(self.architecture.as_str()))
            .os(Os::from(self.os.as_str()))
            .config(config.build().expect("an image config"))
            .rootfs(rootfs.build().expect("an image rootfs"))
            .build()
            .expect("an image configuration");
        canonical(&image)
    }

    /// Layer, config, manifest and index with their digests.
    pub fn build(&self) -> BuiltImage {
        let tar = self.layer_tar();
        let diff_id = sha256_digest(&tar);
        let (layer, layer_media_type) = if self.gzip {
            // No file name and mtime 0 in the gzip header: the same bytes every time.
            let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
            gz.write_all(&tar).expect("compressing in memory");
            (gz.finish().expect("compressing in memory"), MediaType::ImageLayerGzip)
        } else {
            (tar, MediaType::ImageLayer)
        };
        let layer_digest = sha256_digest(&layer);
        let config = self.config_json(&diff_id);
        let config_digest = sha256_digest(&config);
        let built = |d: DescriptorBuilder| -> Descriptor { d.build().expect("a descriptor") };
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(built(descriptor(MediaType::ImageConfig, &config_digest, config.len())))
            .layers(vec![built(descriptor(layer_media_type.clone(), &layer_digest, layer.len()))])
            .build()
            .expect("an image manifest");
        let manifest = canonical(&manifest);
        let manifest_digest = sha256_digest(&manifest);
        let platform = PlatformBuilder::default()
            .architecture(Arch::from(self.architecture.as_str()))
            .os(Os::from(self.os.as_str()))
            .build()
            .expect("a platform");
        let annotations = HashMap::from([
            (ANNOTATION_IMAGE_NAME.to_string(), self.reference.clone()),
            (ANNOTATION_REF_NAME.to_string(), reference_tag(&self.reference).to_string()),
        ]);
        let entry = descriptor(MediaType::ImageManifest, &manifest_digest, manifest.len())
            .annotations(annotations)
            .platform(platform);
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![built(entry)])
            .build()
            .expect("an image index");
        let index = canonical(&index);
        BuiltImage {
            reference: self.reference.clone(),
            layer,
            layer_digest,
            layer_media_type,
            diff_id,
            config,
            config_digest,
            manifest,
            manifest_digest,
            index,
        }
    }

    /// The manifest digest the image record will point at after import.
    pub fn manifest_digest(&self) -> String {
        self.build().manifest_digest
    }

    /// The OCI image layout as a tar: `blobs/sha256/<hex>` (sorted by digest), then `oci-layout` and
    /// `index.json` last. Deterministic bytes for the same inputs.
    pub fn oci_layout_tar(&self) -> Vec<u8> {
        let img = self.build();
        let mut blobs: Vec<(&str, &[u8])> = vec![
            (&img.layer_digest, &img.layer),
            (&img.config_digest, &img.config),
            (&img.manifest_digest, &img.manifest),
        ];
        blobs.sort();
        blobs.dedup_by(|a, b| a.0 == b.0);
        let mut tar = tar::Builder::new(Vec::new());
        let dir = |tar: &mut tar::Builder<Vec<u8>>, path: &str| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_mtime(0);
            h.set_size(0);
            tar.append_data(&mut h, path, std::io::empty()).expect("writing a tar to memory");
        };
        let file = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_size(data.len() as u64);
            tar.append_data(&mut h, path, data).expect("writing a tar to memory");
        };
        dir(&mut tar, "blobs/");
        dir(&mut tar, "blobs/sha256/");
        for (digest, data) in blobs {
            file(&mut tar, &format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")), data);
        }
        let layout = OciLayoutBuilder::default().image_layout_version("1.0.0").build().expect("an image layout");
        file(&mut tar, "oci-layout", &canonical(&layout));
        file(&mut tar, "index.json", &img.index);
        tar.into_inner().expect("writing a tar to memory")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn busybox_like() -> ImageBuilder {
        ImageBuilder::new("busybox:test")
            .file("/bin/busybox", b"\x7fELF not really", 0o755)
            .symlink("/bin/sh", "busybox")
            .symlink("/bin/echo", "/bin/busybox")
            .dir("/tmp", 0o1777)
            .file("/etc/deep/nested/dir/file.conf", b"x=1\n", 0o644)
            .entrypoint(&["/bin/sh", "-c"])
            .cmd(&["echo hi"])
            .env("PATH=/bin")
            .working_dir("/")
            .user("0:0")
    }

    type Untarred = (String, tar::EntryType, Vec<u8>, u32, Option<String>);

    fn untar(bytes: &[u8]) -> Vec<Untarred> {
        let mut out = Vec::new();
        let mut ar = tar::Archive::new(bytes);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().trim_end_matches('/').to_string();
            let kind = e.header().entry_type();
            let mode = e.header().mode().unwrap();
            let link = e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned());
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            out.push((path, kind, data, mode, link));
        }
        out
    }

    #[test]
    fn normalizes_references_like_containerd() {
        let n = |s: &str| normalize_reference(s).unwrap();
        assert_eq!(n("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("busybox:latest"), "docker.io/library/busybox:latest");
        assert_eq!(n("foo/bar:1"), "docker.io/foo/bar:1");
        assert_eq!(n("docker.io/busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(n("index.docker.io/library/busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("registry:5000/x:y"), "registry:5000/x:y");
        assert_eq!(n("registry:5000/x"), "registry:5000/x:latest");
        assert_eq!(n("localhost/cairn/pause:3.10"), "localhost/cairn/pause:3.10");
        assert_eq!(n("quay.io/a/b/c:v1.2-rc_3"), "quay.io/a/b/c:v1.2-rc_3");
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(n(&format!("busybox@{d}")), format!("docker.io/library/busybox@{d}"));
        assert_eq!(n(&format!("busybox:1@{d}")), format!("docker.io/library/busybox:1@{d}"));
        for bad in ["", " ", "Busybox", "busybox:", "a b", "foo//bar", "busybox:-x", "busybox@sha256:zz", "/x"] {
            assert!(normalize_reference(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(reference_tag("docker.io/library/busybox:1.36"), "1.36");
        assert_eq!(reference_tag("registry:5000/x:y"), "y");
        assert_eq!(reference_tag(&format!("docker.io/library/busybox@{d}")), "latest");
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = serde_json::json!({"b": 1, "a": {"d": [1, "x"], "c": null}});
        assert_eq!(canonical_json(&v), br#"{"a":{"c":null,"d":[1,"x"]},"b":1}"#);
    }

    #[test]
    fn builder_is_deterministic() {
        let a = busybox_like().oci_layout_tar();
        let b = busybox_like().oci_layout_tar();
        assert_eq!(a, b);
        assert_eq!(sha256_digest(&a), sha256_digest(&b));
        // The order the entries were given in does not matter.
        let c = ImageBuilder::new("busybox:test")
            .file("/etc/deep/nested/dir/file.conf", b"x=1\n", 0o644)
            .dir("/tmp", 0o1777)
            .symlink("/bin/echo", "/bin/busybox")
            .symlink("/bin/sh", "busybox")
            .file("/bin/busybox", b"\x7fELF not really", 0o755)
            .entrypoint(&["/bin/sh", "-c"])
            .cmd(&["echo hi"])
            .env("PATH=/bin")
            .working_dir("/")
            .user("0:0")
            .oci_layout_tar();
        assert_eq!(a, c);
        let gz1 = busybox_like().gzip(true).oci_layout_tar();
        let gz2 = busybox_like().gzip(true).oci_layout_tar();
        assert_eq!(gz1, gz2);
        assert_ne!(a, gz1);
        // Any change shows.
        assert_ne!(a, busybox_like().env("X=1").oci_layout_tar());
    }

    #[test]
    fn layer_has_parents_sorted_fixed_metadata() {
        let layer = busybox_like().layer_tar();
        let entries = untar(&layer);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            paths,
            [
                "bin",
                "bin/busybox",
                "bin/echo",
                "bin/sh",
                "etc",
                "etc/deep",
                "etc/deep/nested",
                "etc/deep/nested/dir",
                "etc/deep/nested/dir/file.conf",
                "tmp"
            ]
        );
        let mut ar = tar::Archive::new(layer.as_slice());
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(e.header().mtime().unwrap(), 0);
            assert_eq!(e.header().uid().unwrap(), 0);
            assert_eq!(e.header().gid().unwrap(), 0);
        }
        let find = |p: &str| entries.iter().find(|e| e.0 == p).unwrap();
        assert_eq!(find("bin").1, tar::EntryType::Directory);
        assert_eq!(find("bin").3, 0o755);
        assert_eq!(find("tmp").3, 0o1777);
        assert_eq!(find("bin/busybox").2, b"\x7fELF not really");
        assert_eq!(find("bin/busybox").3, 0o755);
        assert_eq!(find("bin/sh").1, tar::EntryType::Symlink);
        assert_eq!(find("bin/sh").4.as_deref(), Some("busybox"));
        assert_eq!(find("bin/echo").4.as_deref(), Some("/bin/busybox"));
        // Long paths survive (GNU long names).
        let long = format!("/{}/f", "d".repeat(150));
        let layer = ImageBuilder::new("x").file(&long, b"1", 0o644).layer_tar();
        assert!(untar(&layer).iter().any(|e| e.0 == long[1..]));
    }

    #[test]
    fn layout_is_consistent() {
        for gzip in [false, true] {
            let builder = busybox_like().gzip(gzip);
            let tar = builder.oci_layout_tar();
            let entries = untar(&tar);
            let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(names.last(), Some(&"index.json"), "index.json comes last");
            assert!(names.contains(&"oci-layout"));
            let file = |p: &str| entries.iter().find(|e| e.0 == p).unwrap_or_else(|| panic!("{p} missing")).2.clone();
            let blob = |d: &str| {
                let data = file(&format!("blobs/sha256/{}", d.strip_prefix("sha256:").unwrap()));
                assert_eq!(sha256_digest(&data), d, "blob named by its digest");
                data
            };
            let layout: Value = serde_json::from_slice(&file("oci-layout")).unwrap();
            assert_eq!(layout["imageLayoutVersion"], "1.0.0");
            let index: Value = serde_json::from_slice(&file("index.json")).unwrap();
            assert_eq!(index["schemaVersion"], 2);
            let m = &index["manifests"][0];
            assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
            assert_eq!(m["annotations"][ANNOTATION_IMAGE_NAME], "docker.io/library/busybox:test");
            assert_eq!(m["annotations"][ANNOTATION_REF_NAME], "test");
            assert_eq!(m["platform"]["os"], "linux");
            let manifest_bytes = blob(m["digest"].as_str().unwrap());
            assert_eq!(m["size"], manifest_bytes.len());
            assert_eq!(m["digest"], builder.manifest_digest());
            let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
            assert_eq!(manifest["schemaVersion"], 2);
            let config_bytes = blob(manifest["config"]["digest"].as_str().unwrap());
            assert_eq!(manifest["config"]["size"], config_bytes.len());
            assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
            let layer_bytes = blob(manifest["layers"][0]["digest"].as_str().unwrap());
            assert_eq!(manifest["layers"][0]["size"], layer_bytes.len());
            let config: Value = serde_json::from_slice(&config_bytes).unwrap();
            let uncompressed = if gzip {
                assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(layer_bytes.as_slice()).read_to_end(&mut out).unwrap();
                out
            } else {
                assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
                layer_bytes
            };
            assert_eq!(config["rootfs"]["diff_ids"][0], sha256_digest(&uncompressed));
            assert_eq!(config["rootfs"]["type"], "layers");
            assert_eq!(config["architecture"], host_architecture());
            assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/bin/sh", "-c"]));
            assert_eq!(config["config"]["Cmd"], serde_json::json!(["echo hi"]));
            assert_eq!(config["config"]["Env"], serde_json::json!(["PATH=/bin"]));
            assert_eq!(config["config"]["User"], "0:0");
            assert_eq!(config["config"]["WorkingDir"], "/");
        }
    }

    /// umoci (when installed) unpacks the layout into a runtime bundle with the right files.
    #[test]
    fn umoci_unpacks_layout() {
        if std::process::Command::new("umoci").arg("--version").output().is_err() {
            eprintln!("SKIP umoci_unpacks_layout: umoci is not installed");
            return;
        }
        let tmp = std::env::temp_dir().join(format!("oci-image-umoci-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let layout = tmp.join("layout");
        std::fs::create_dir_all(&layout).unwrap();
        tar::Archive::new(busybox_like().oci_layout_tar().as_slice()).unpack(&layout).unwrap();
        // umoci looks images up by org.opencontainers.image.ref.name.
        let out = std::process::Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(format!("{}:test", layout.display()))
            .arg(tmp.join("bundle"))
            .output()
            .unwrap();
        assert!(out.status.success(), "umoci unpack: {}", String::from_utf8_lossy(&out.stderr));
        let rootfs = tmp.join("bundle/rootfs");
        assert_eq!(std::fs::read(rootfs.join("bin/busybox")).unwrap(), b"\x7fELF not really");
        assert_eq!(std::fs::read_link(rootfs.join("bin/sh")).unwrap().to_str(), Some("busybox"));
        assert_eq!(std::fs::read(rootfs.join("etc/deep/nested/dir/file.conf")).unwrap(), b"x=1\n");
        let config: Value = serde_json::from_slice(&std::fs::read(tmp.join("bundle/config.json")).unwrap()).unwrap();
        assert_eq!(config["process"]["args"], serde_json::json!(["/bin/sh", "-c", "echo hi"]));
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
