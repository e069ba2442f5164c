//! Reading image tarballs: OCI layouts and `docker save` archives (plain, gzip or zstd), collected
//! into blobs and image records, with progress.

use oci_spec::image::{
    Descriptor, DescriptorBuilder, ImageConfiguration, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType,
};

use super::*;

pub(super) trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

/// How a tarball (or a layer inside one) is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// By magic bytes.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
    fn name(self) -> &'static str {
        match self {
            Compression::None => "tar",
            Compression::Gzip => "gzip-compressed tar",
            Compression::Zstd => "zstd-compressed tar",
        }
    }
}

/// Whether `block` (the first 512 bytes of a stream) is a tar header.
pub fn is_tar_header(block: &[u8]) -> bool {
    if block.len() < 512 {
        return false;
    }
    if &block[257..262] == b"ustar" {
        return true;
    }
    // Old v7 archives have no magic: check the header checksum.
    let stored = std::str::from_utf8(&block[148..156]).ok().map(|s| s.trim_matches(|c: char| c == '\0' || c == ' '));
    let Some(stored) = stored.and_then(|s| u32::from_str_radix(s, 8).ok()) else { return false };
    let sum: u32 = block.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { b as u32 }).sum();
    sum == stored && block[0] != 0
}

/// What a file holds, from its first bytes: a (compressed) tarball or something else.
pub fn sniff_tarball(head: &[u8]) -> Option<Compression> {
    match Compression::sniff(head) {
        Compression::None if is_tar_header(head) => Some(Compression::None),
        Compression::None => None,
        c => Some(c),
    }
}

/// Reads up to `buf.len()` bytes (fewer only at the end of the stream).
pub(super) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Counts what has been read (the import's progress).
pub(super) struct Counted {
    inner: Box<dyn ReadSeek>,
    pos: u64,
    report: Option<Arc<AtomicU64>>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        if let Some(r) = &self.report {
            r.store(self.pos, Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl Seek for Counted {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        if let Some(r) = &self.report {
            r.store(self.pos, Ordering::Relaxed);
        }
        Ok(self.pos)
    }
}

/// Explains an I/O error while reading a tarball.
pub(super) fn io_context(e: io::Error, what: &str) -> anyhow::Error {
    // The tar crate's word for a header cut short.
    if e.kind() == io::ErrorKind::UnexpectedEof || e.to_string().contains("failed to read entire block") {
        anyhow!("{what}: the file is truncated (unexpected end of data)")
    } else {
        anyhow!("{what}: {e}")
    }
}

/// A tar path as a clean relative path: no `./`, no leading or trailing `/`, `..` resolved.
pub(super) fn clean_path(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out.join("/")
}

/// The digest named by a `blobs/<alg>/<hex>` path.
pub(super) fn blob_path_digest(path: &str) -> Result<Option<String>> {
    let mut parts = path.split('/');
    let (Some("blobs"), Some(alg), Some(hex), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Ok(None);
    };
    if alg != "sha256" {
        bail!("{path}: unsupported digest algorithm {alg}");
    }
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(None);
    }
    Ok(Some(format!("sha256:{hex}")))
}

pub(super) fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A descriptor's annotations, in order.
fn annotations(desc: &Descriptor) -> BTreeMap<String, String> {
    desc.annotations().iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// One entry of a `docker save` manifest.json.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct DockerSaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

pub(super) fn parse_docker_manifest(bytes: &[u8]) -> Result<Vec<DockerSaveEntry>> {
    serde_json::from_slice(bytes).context("manifest.json is not a docker save manifest")
}

/// The image name an index.json entry gives: `io.containerd.image.name`, else
/// `org.opencontainers.image.ref.name` when it is a whole reference rather than just a tag.
pub(super) fn image_name(annotations: &BTreeMap<String, String>) -> Result<Option<String>> {
    if let Some(name) = annotations.get(oci_image::ANNOTATION_IMAGE_NAME).filter(|n| !n.is_empty()) {
        return normalize_reference(name).map(Some).map_err(|e| anyhow!(e));
    }
    match annotations.get(oci_image::ANNOTATION_REF_NAME) {
        Some(r) if r.contains(['/', ':', '@']) => Ok(normalize_reference(r).ok()),
        _ => Ok(None),
    }
}

/// A regular file met in the tarball.
pub(super) struct FileEntry {
    digest: String,
    size: u64,
    compression: Compression,
    /// Kept for files not (yet) in the store and for JSON blobs.
    data: Option<Vec<u8>>,
}

/// Walks the tar, moving blobs into the store as they come, and remembers the rest.
pub(super) struct Collector<'a> {
    store: &'a dyn Store,
    /// Digests the prescan expects at these paths (uncompressed docker save layers).
    hints: HashMap<String, String>,
    files: HashMap<String, FileEntry>,
    /// Digest → path of `blobs/sha256/...` files.
    blobs: HashMap<String, String>,
    links: HashMap<String, String>,
    /// Digests known to be in the store.
    stored: HashSet<String>,
    memory: u64,
    index_json: Option<Vec<u8>>,
    manifest_json: Option<Vec<u8>>,
    entries: usize,
}

impl<'a> Collector<'a> {
    fn new(store: &'a dyn Store, hints: HashMap<String, String>) -> Self {
        Collector {
            store,
            hints,
            files: HashMap::new(),
            blobs: HashMap::new(),
            links: HashMap::new(),
            stored: HashSet::new(),
            memory: 0,
            index_json: None,
            manifest_json: None,
            entries: 0,
        }
    }

    fn run<R: Read>(&mut self, entries: tar::Entries<'_, R>) -> Result<()> {
        for entry in entries {
            if self.store.cancelled() {
                bail!("import cancelled");
            }
            let entry = entry.map_err(|e| io_context(e, "reading the tar stream"))?;
            self.entries += 1;
            self.entry(entry)?;
        }
        Ok(())
    }

    fn present(&mut self, digest: &str) -> Result<bool> {
        if self.stored.contains(digest) {
            return Ok(true);
        }
        if self.store.info(digest)?.is_some() {
            self.stored.insert(digest.to_string());
            return Ok(true);
        }
        Ok(false)
    }

    fn entry<R: Read>(&mut self, mut e: tar::Entry<'_, R>) -> Result<()> {
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let path = clean_path(&raw);
        match e.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink => {
                if let Some(target) = e.link_name_bytes() {
                    let target = String::from_utf8_lossy(&target).into_owned();
                    let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                    let resolved = if target.starts_with('/') {
                        clean_path(&target)
                    } else {
                        clean_path(&format!("{parent}/{target}"))
                    };
                    self.links.insert(path, resolved);
                }
                return Ok(());
            }
            tar::EntryType::Link => {
                if let Some(target) = e.link_name_bytes() {
                    self.links.insert(path, clean_path(&String::from_utf8_lossy(&target)));
                }
                return Ok(());
            }
            _ => return Ok(()),
        }
        let size = e.size();
        if path == "index.json" || path == "manifest.json" {
            if size > JSON_LIMIT {
                bail!("{path} is too large ({size} bytes)");
            }
            let data = read_entry(&mut e, size, &path)?;
            if path == "index.json" {
                self.index_json = Some(data);
            } else {
                self.manifest_json = Some(data);
            }
            return Ok(());
        }
        let named = blob_path_digest(&path)?;
        let mut head = vec![0u8; size.min(512) as usize];
        e.read_exact(&mut head).map_err(|err| io_context(err, &path))?;
        let compression = Compression::sniff(&head);

        if size <= SMALL && self.memory + size <= MEMORY_BUDGET {
            let mut data = head;
            data.reserve_exact((size as usize).saturating_sub(data.len()));
            e.read_to_end(&mut data).map_err(|err| io_context(err, &path))?;
            if data.len() as u64 != size {
                bail!("{path}: the file is truncated (unexpected end of data)");
            }
            let digest = sha256_digest(&data);
            if let Some(named) = &named {
                if *named != digest {
                    bail!("{path}: content does not match its digest (it hashes to {digest}): the tarball is corrupt");
                }
                if !self.present(&digest)? {
                    write_all(self.store, &digest, &data)?;
                    self.stored.insert(digest.clone());
                } else {
                    self.store.count_skipped();
                }
                self.blobs.insert(digest.clone(), path.clone());
                // Only JSON (manifests, indexes, configs) is needed again.
                if !data.starts_with(b"{") {
                    self.files.insert(path, FileEntry { digest, size, compression, data: None });
                    return Ok(());
                }
            }
            self.memory += size;
            self.files.insert(path, FileEntry { digest, size, compression, data: Some(data) });
            return Ok(());
        }

        // Large: skip it when the store has it, stream it into the store otherwise.
        let known =
            named.clone().or_else(|| self.hints.get(&path).cloned().filter(|_| compression == Compression::None));
        if let Some(digest) = known
            && self.present(&digest)?
        {
            self.store.count_skipped();
            if named.is_some() {
                self.blobs.insert(digest.clone(), path.clone());
            }
            self.files.insert(path, FileEntry { digest, size, compression, data: None });
            return Ok(());
        }
        let Some(mut writer) = self.store.begin(named.as_deref().map(|d| (d, size)))? else {
            // Someone else wrote it meanwhile.
            let digest = named.expect("only named writes find their blob present");
            self.stored.insert(digest.clone());
            self.blobs.insert(digest.clone(), path.clone());
            self.files.insert(path, FileEntry { digest, size, compression, data: None });
            return Ok(());
        };
        let mut hasher = Sha256::new();
        hasher.update(&head);
        writer.write(&head)?;
        let mut written = head.len() as u64;
        let mut buf = vec![0u8; CHUNK];
        loop {
            if self.store.cancelled() {
                writer.abort();
                bail!("import cancelled");
            }
            let n = match read_up_to(&mut e, &mut buf) {
                Ok(n) => n,
                Err(err) => {
                    writer.abort();
                    return Err(io_context(err, &path));
                }
            };
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            writer.write(&buf[..n])?;
            written += n as u64;
        }
        if written != size {
            writer.abort();
            bail!("{path}: the file is truncated (unexpected end of data)");
        }
        let digest = format!("sha256:{}", oci_image::hex(&hasher.finalize()));
        if let Some(named) = &named
            && *named != digest
        {
            writer.abort();
            bail!("{path}: content does not match its digest (it hashes to {digest}): the tarball is corrupt");
        }
        if named.is_none() && self.present(&digest)? {
            writer.abort();
            self.store.count_skipped();
        } else if !writer.commit(&digest, size)? {
            self.store.count_skipped();
        }
        self.stored.insert(digest.clone());
        if named.is_some() {
            self.blobs.insert(digest.clone(), path.clone());
        }
        self.files.insert(path, FileEntry { digest, size, compression, data: None });
        Ok(())
    }

    /// After the last entry: the images the tarball names, with their content in the store and labelled.
    fn finish(mut self) -> Result<Vec<(String, Target)>> {
        if let Some(index) = self.index_json.take() {
            let images = self.images_from_index(&index).context("index.json")?;
            if !images.is_empty() {
                return Ok(images);
            }
            if self.manifest_json.is_none() {
                bail!(
                    "index.json names no image (no {} annotation, nor an {} that is a full reference)",
                    oci_image::ANNOTATION_IMAGE_NAME,
                    oci_image::ANNOTATION_REF_NAME
                );
            }
        }
        if let Some(manifest) = self.manifest_json.take() {
            return self.images_from_docker_save(&manifest).context("manifest.json");
        }
        if self.entries == 0 {
            bail!("the tar archive is empty");
        }
        bail!("no index.json or manifest.json in the archive: neither an OCI image layout nor a docker save tarball")
    }

    fn images_from_index(&mut self, bytes: &[u8]) -> Result<Vec<(String, Target)>> {
        let index: serde_json::Value = serde_json::from_slice(bytes).context("invalid JSON")?;
        let index: ImageIndex = serde_json::from_value(index).context("not an OCI image index")?;
        let mut images = Vec::new();
        for (i, desc) in index.manifests().iter().enumerate() {
            let annotations = annotations(desc);
            let Some(name) = image_name(&annotations).with_context(|| format!("manifests[{i}]"))? else {
                continue;
            };
            self.walk(desc, 0, true).with_context(|| format!("image {name} ({})", desc.digest()))?;
            let target = Target {
                media_type: desc.media_type().to_string(),
                digest: desc.digest().to_string(),
                size: desc.size() as i64,
                annotations,
            };
            images.push((name, target));
        }
        Ok(images)
    }

    /// The bytes of a manifest or index: from the tarball, else from the store.
    fn json_blob(&mut self, desc: &Descriptor, required: bool) -> Result<Option<Vec<u8>>> {
        let digest = desc.digest().to_string();
        let in_tar = self.blobs.get(&digest).and_then(|p| self.files.get(p)).and_then(|f| f.data.clone());
        let bytes = match in_tar {
            Some(b) => b,
            None if self.present(&digest)? => self.store.read(&digest, JSON_LIMIT)?,
            None if required => bail!("{digest} is missing from the tarball"),
            None => return Ok(None),
        };
        if bytes.len() as u64 != desc.size() {
            bail!("{digest} is {} bytes, its descriptor says {}", bytes.len(), desc.size());
        }
        Ok(Some(bytes))
    }

    /// Checks that a manifest (or an index and what it lists) is complete, and labels it so GC keeps
    /// its children. `required`: missing content is an error rather than a platform left out.
    fn walk(&mut self, desc: &Descriptor, depth: usize, required: bool) -> Result<bool> {
        let digest = desc.digest().to_string();
        if depth > 8 {
            bail!("indexes nested too deeply");
        }
        if !valid_digest(&digest) {
            bail!("unsupported digest {digest:?}: only sha256 is");
        }
        let Some(bytes) = self.json_blob(desc, required)? else {
            tracing::debug!("{digest} ({}) is not in the tarball; skipped", desc.media_type());
            return Ok(false);
        };
        match desc.media_type() {
            MediaType::ImageIndex => self.walk_index(&digest, &bytes, depth),
            MediaType::Other(m) if m == oci_image::MEDIA_DOCKER_MANIFEST_LIST => {
                self.walk_index(&digest, &bytes, depth)
            }
            MediaType::ImageManifest => self.walk_manifest(&digest, &bytes, required),
            MediaType::Other(m) if m == oci_image::MEDIA_DOCKER_MANIFEST => {
                self.walk_manifest(&digest, &bytes, required)
            }
            other if required => bail!("{digest}: unsupported media type {:?}", other.to_string()),
            _ => Ok(false),
        }
    }

    /// An index (or Docker manifest list): the manifests of it that are in the tarball.
    fn walk_index(&mut self, digest: &str, bytes: &[u8], depth: usize) -> Result<bool> {
        let index: ImageIndex = serde_json::from_slice(bytes).with_context(|| format!("index {digest}"))?;
        let children = index.manifests();
        let mut labels = BTreeMap::new();
        let mut present = 0;
        for (i, child) in children.iter().enumerate() {
            labels.insert(format!("containerd.io/gc.ref.content.m.{i}"), child.digest().to_string());
            if self.walk(child, depth + 1, false).with_context(|| format!("index {digest}"))? {
                present += 1;
            }
        }
        if present == 0 && !children.is_empty() {
            bail!("none of the {} manifests of index {digest} is in the tarball", children.len());
        }
        self.label(digest, labels)?;
        Ok(true)
    }

    /// A manifest: complete when its config and layers are all in the store.
    fn walk_manifest(&mut self, digest: &str, bytes: &[u8], required: bool) -> Result<bool> {
        let manifest: ImageManifest = serde_json::from_slice(bytes).with_context(|| format!("manifest {digest}"))?;
        let config = manifest.config().digest().to_string();
        let mut labels = BTreeMap::from([(LABEL_GC_CONFIG.to_string(), config.clone())]);
        let mut missing = Vec::new();
        if !valid_digest(&config) || !self.present(&config)? {
            missing.push(format!("config {config}"));
        }
        let layers = manifest.layers();
        for (i, layer) in layers.iter().enumerate() {
            let layer = layer.digest().to_string();
            labels.insert(format!("containerd.io/gc.ref.content.l.{i}"), layer.clone());
            if !valid_digest(&layer) || !self.present(&layer)? {
                missing.push(format!("layer {layer} ({} of {})", i + 1, layers.len()));
            }
        }
        self.label(digest, labels)?;
        if !missing.is_empty() {
            if required {
                bail!("manifest {digest}: {} missing from the tarball", missing.join(", "));
            }
            tracing::debug!("manifest {digest} is incomplete in the tarball; skipped");
            return Ok(false);
        }
        Ok(true)
    }

    /// Sets the GC labels a blob lacks (nothing when they are all there already).
    fn label(&mut self, digest: &str, wanted: BTreeMap<String, String>) -> Result<()> {
        let have = self.store.info(digest)?.ok_or_else(|| anyhow!("{digest} vanished from the content store"))?;
        let missing: BTreeMap<String, String> = wanted.into_iter().filter(|(k, v)| have.get(k) != Some(v)).collect();
        if !missing.is_empty() {
            self.store.set_labels(digest, &missing)?;
        }
        Ok(())
    }

    fn resolve(&self, listed: &str) -> Result<&FileEntry> {
        let mut path = clean_path(listed);
        for _ in 0..16 {
            if let Some(f) = self.files.get(&path) {
                return Ok(f);
            }
            match self.links.get(&path) {
                Some(next) => path = next.clone(),
                None => break,
            }
        }
        bail!("{listed} is missing from the tarball")
    }

    /// Makes sure a file met in the tarball is in the store.
    fn store_file(&mut self, listed: &str) -> Result<(String, u64, Compression)> {
        let f = self.resolve(listed)?;
        let (digest, size, compression, data) = (f.digest.clone(), f.size, f.compression, f.data.clone());
        if !self.present(&digest)? {
            let Some(data) = data else { bail!("{listed} ({digest}) was not stored") };
            write_all(self.store, &digest, &data)?;
            self.stored.insert(digest.clone());
        }
        Ok((digest, size, compression))
    }

    fn images_from_docker_save(&mut self, bytes: &[u8]) -> Result<Vec<(String, Target)>> {
        let entries = parse_docker_manifest(bytes)?;
        let mut images = Vec::new();
        for (n, entry) in entries.iter().enumerate() {
            let (config_digest, config_size, _) =
                self.store_file(&entry.config).with_context(|| format!("[{n}].Config"))?;
            let mut labels = BTreeMap::from([(LABEL_GC_CONFIG.to_string(), config_digest.clone())]);
            let mut layers = Vec::new();
            for (i, layer) in entry.layers.iter().enumerate() {
                let (digest, size, compression) =
                    self.store_file(layer).with_context(|| format!("[{n}].Layers[{i}]"))?;
                let media_type = match compression {
                    Compression::None => MediaType::Other(oci_image::MEDIA_DOCKER_LAYER.into()),
                    Compression::Gzip => MediaType::Other(oci_image::MEDIA_DOCKER_LAYER_GZIP.into()),
                    Compression::Zstd => MediaType::ImageLayerZstd,
                };
                labels.insert(format!("containerd.io/gc.ref.content.l.{i}"), digest.clone());
                layers.push(descriptor(media_type, &digest, size)?);
            }
            let config =
                descriptor(MediaType::Other(oci_image::MEDIA_DOCKER_CONFIG.into()), &config_digest, config_size)?;
            let manifest = ImageManifestBuilder::default()
                .schema_version(2u32)
                .media_type(MediaType::Other(oci_image::MEDIA_DOCKER_MANIFEST.into()))
                .config(config)
                .layers(layers)
                .build()?;
            // Serialized in field order, as Go's json.Marshal writes containerd's struct: byte for
            // byte what its importer writes, so the digest is the one `ctr images import` gives.
            let manifest = serde_json::to_vec(&manifest)?;
            let digest = sha256_digest(&manifest);
            if !self.present(&digest)? {
                write_all(self.store, &digest, &manifest)?;
                self.stored.insert(digest.clone());
            }
            self.label(&digest, labels)?;
            for tag in entry.repo_tags.iter().flatten() {
                let name =
                    normalize_reference(tag).map_err(|e| anyhow!(e)).with_context(|| format!("[{n}].RepoTags"))?;
                // The annotations containerd's importer puts on the target.
                let annotations = BTreeMap::from([
                    (oci_image::ANNOTATION_IMAGE_NAME.to_string(), name.clone()),
                    (oci_image::ANNOTATION_REF_NAME.to_string(), oci_ref_name(&name).to_string()),
                ]);
                let target = Target {
                    media_type: oci_image::MEDIA_DOCKER_MANIFEST.into(),
                    digest: digest.clone(),
                    size: manifest.len() as i64,
                    annotations,
                };
                images.push((name, target));
            }
        }
        if images.is_empty() {
            bail!("no RepoTags: the images have no names");
        }
        Ok(images)
    }
}

/// A descriptor of a blob in the store.
fn descriptor(media_type: MediaType, digest: &str, size: u64) -> Result<Descriptor> {
    let digest: oci_spec::image::Digest = digest.parse().with_context(|| format!("digest {digest:?}"))?;
    Ok(DescriptorBuilder::default().media_type(media_type).digest(digest).size(size).build()?)
}

/// What follows the repository in a normalized reference (`latest`, `1.0@sha256:...`): containerd's
/// `org.opencontainers.image.ref.name` for an image from a docker save.
pub(super) fn oci_ref_name(normalized: &str) -> &str {
    let name_end = normalized.find('@').unwrap_or(normalized.len());
    let last_slash = normalized[..name_end].rfind('/').map_or(0, |i| i + 1);
    match normalized[last_slash..name_end].find(':') {
        Some(i) => &normalized[last_slash + i + 1..],
        None => &normalized[name_end..],
    }
}

pub(super) fn read_entry(r: &mut impl Read, size: u64, path: &str) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(size as usize);
    r.read_to_end(&mut data).map_err(|e| io_context(e, path))?;
    if data.len() as u64 != size {
        bail!("{path}: the file is truncated (unexpected end of data)");
    }
    Ok(data)
}

/// Writes a small blob in one message.
pub(super) fn write_all(store: &dyn Store, digest: &str, data: &[u8]) -> Result<()> {
    match store.begin(Some((digest, data.len() as u64)))? {
        None => {
            store.count_skipped();
            Ok(())
        }
        Some(mut w) => {
            w.write(data)?;
            if !w.commit(digest, data.len() as u64)? {
                store.count_skipped();
            }
            Ok(())
        }
    }
}

/// Where each docker save layer is expected to land, from manifest.json and the configs'
/// `rootfs.diff_ids` (an uncompressed layer's digest is its diff ID). Needs a seekable plain tar: it
/// reads the headers and the few JSON files only. Lets a re-import skip layers without rewriting them.
pub(super) fn prescan(src: &mut (impl Read + Seek)) -> Result<HashMap<String, String>> {
    let mut regular: HashMap<String, (u64, u64)> = HashMap::new();
    let mut links: HashMap<String, String> = HashMap::new();
    {
        let mut ar = tar::Archive::new(&mut *src);
        for e in ar.entries_with_seek()? {
            let e = e?;
            let path = clean_path(&String::from_utf8_lossy(&e.path_bytes()));
            match e.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    regular.insert(path, (e.raw_file_position(), e.size()));
                }
                tar::EntryType::Symlink => {
                    if let Some(t) = e.link_name_bytes() {
                        let t = String::from_utf8_lossy(&t).into_owned();
                        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                        let r = if t.starts_with('/') { clean_path(&t) } else { clean_path(&format!("{parent}/{t}")) };
                        links.insert(path, r);
                    }
                }
                tar::EntryType::Link => {
                    if let Some(t) = e.link_name_bytes() {
                        links.insert(path, clean_path(&String::from_utf8_lossy(&t)));
                    }
                }
                _ => {}
            }
        }
    }
    let mut hints = HashMap::new();
    if regular.contains_key("index.json") {
        return Ok(hints);
    }
    let resolve = |p: &str| {
        let mut p = clean_path(p);
        for _ in 0..16 {
            if regular.contains_key(&p) {
                return Some(p);
            }
            p = links.get(&p)?.clone();
        }
        None
    };
    fn read_at(src: &mut (impl Read + Seek), at: (u64, u64), limit: u64) -> Result<Vec<u8>> {
        src.seek(SeekFrom::Start(at.0))?;
        let mut buf = vec![0u8; at.1.min(limit) as usize];
        src.read_exact(&mut buf)?;
        Ok(buf)
    }
    let Some(&manifest_at) = regular.get("manifest.json") else { return Ok(hints) };
    if manifest_at.1 > JSON_LIMIT {
        return Ok(hints);
    }
    let entries = parse_docker_manifest(&read_at(src, manifest_at, JSON_LIMIT)?)?;
    for entry in entries {
        let Some(config_at) = resolve(&entry.config).and_then(|p| regular.get(&p).copied()) else { continue };
        if config_at.1 > JSON_LIMIT {
            continue;
        }
        let Ok(config) = serde_json::from_slice::<ImageConfiguration>(&read_at(src, config_at, JSON_LIMIT)?) else {
            continue;
        };
        let diff_ids = config.rootfs().diff_ids().clone();
        if diff_ids.len() != entry.layers.len() {
            continue;
        }
        for (layer, diff_id) in entry.layers.iter().zip(diff_ids) {
            let Some(path) = resolve(layer) else { continue };
            let at = regular[&path];
            let head = read_at(src, at, 8)?;
            if Compression::sniff(&head) == Compression::None && valid_digest(&diff_id) {
                hints.insert(path, diff_id);
            }
        }
    }
    Ok(hints)
}

/// The whole import, on a blocking thread: returns the image records written.
pub(super) fn import_sync(
    store: &dyn Store,
    source: Box<dyn ReadSeek>,
    done: &Arc<AtomicU64>,
) -> Result<Vec<Imported>> {
    let mut src = Counted { inner: source, pos: 0, report: None };
    let mut head = [0u8; 512];
    let n = read_up_to(&mut src, &mut head).context("reading the file")?;
    if n == 0 {
        bail!("the file is empty");
    }
    if n == 512 && head.iter().all(|&b| b == 0) {
        bail!("the tar archive is empty (it starts with an end-of-archive block)");
    }
    let Some(compression) = sniff_tarball(&head[..n]) else {
        bail!("not a tar archive, nor gzip or zstd (it starts with {})", oci_image::hex(&head[..n.min(8)]));
    };
    src.seek(SeekFrom::Start(0))?;
    let hints = if compression == Compression::None {
        let hints = prescan(&mut src).unwrap_or_else(|e| {
            tracing::debug!("tar prescan: {e:#}");
            HashMap::new()
        });
        src.seek(SeekFrom::Start(0))?;
        hints
    } else {
        HashMap::new()
    };
    src.report = Some(done.clone());
    let mut collector = Collector::new(store, hints);
    let what = compression.name();
    match compression {
        Compression::None => {
            let mut ar = tar::Archive::new(io::BufReader::with_capacity(CHUNK, src));
            collector
                .run(ar.entries_with_seek().map_err(|e| io_context(e, what))?)
                .with_context(|| format!("reading the {what}"))?;
        }
        Compression::Gzip => {
            let decoder = flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(CHUNK, src));
            decompressed(&mut collector, decoder, what)?;
        }
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(src).context("starting zstd decompression")?;
            decompressed(&mut collector, decoder, what)?;
        }
    }
    let images = collector.finish()?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (name, target) in images {
        if !seen.insert(name.clone()) {
            continue;
        }
        let change = store.put_image(&name, &target)?;
        out.push(Imported { reference: name, digest: target.digest, change });
    }
    Ok(out)
}

pub(super) fn decompressed(collector: &mut Collector<'_>, mut decoder: impl Read, what: &str) -> Result<()> {
    let mut head = [0u8; 512];
    let n = read_up_to(&mut decoder, &mut head).map_err(|e| io_context(e, what))?;
    if n == 0 {
        bail!("the {what} is empty");
    }
    if n == 512 && head.iter().all(|&b| b == 0) {
        bail!("the {what} is an empty tar archive");
    }
    if !is_tar_header(&head[..n]) {
        bail!("the {what} does not hold a tar archive");
    }
    let mut ar = tar::Archive::new(io::Cursor::new(head[..n].to_vec()).chain(decoder));
    collector.run(ar.entries().map_err(|e| io_context(e, what))?).with_context(|| format!("reading the {what}"))?;
    // Read to the end so the compressed stream's own checks (gzip CRC, zstd frame) run too.
    io::copy(&mut ar.into_inner(), &mut io::sink()).map_err(|e| io_context(e, &format!("reading the {what}")))?;
    Ok(())
}

pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// A progress callback that logs `importing <name>: 40% (41.9 MiB of 104.9 MiB)` at most once a
/// second, for files over 16 MiB (small ones finish before a line would be worth it).
pub fn progress_logger_named(name: String) -> impl Fn(u64, u64) + Sync {
    let last = Mutex::new(Instant::now());
    move |done, total| {
        if total < PROGRESS_MIN_SIZE || done >= total {
            return;
        }
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= Duration::from_secs(1) {
            *last = Instant::now();
            tracing::info!(
                "importing {name}: {}% ({:.1} MiB of {:.1} MiB)",
                done * 100 / total.max(1),
                mib(done),
                mib(total)
            );
        }
    }
}

/// [`progress_logger_named`] for a file.
pub fn progress_logger(path: &Path) -> impl Fn(u64, u64) + Sync {
    progress_logger_named(path.display().to_string())
}
