//! The images directory (`<data-dir>/agent/images/`): what is imported, retried and kept, as k3s
//! watches its directory.

use super::*;

/// What the directory watcher remembers about a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileRecord {
    size: u64,
    mtime_ns: i64,
    kind: FileKind,
    ok: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    images: Vec<ImageRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ImageRecord {
    reference: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum FileKind {
    Tarball,
    PullList,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct DirState {
    #[serde(default)]
    files: BTreeMap<String, FileRecord>,
}

/// Watches a directory of image tarballs and pull lists the k3s way (`<data-dir>/agent/images/`):
/// every new or changed `*.tar`, `*.tar.gz`, `*.tgz`, `*.tar.zst`, `*.tar.zstd` (or any file that
/// sniffs as one) is imported, every `*.txt` is read as image references to pull. What was done is
/// remembered in a small state file, so an unchanged file is not imported again, even after a restart.
pub struct ImageDir {
    dir: PathBuf,
    state_file: PathBuf,
    /// How files are named in the log, e.g. `images/x.tar`.
    label: String,
    state: DirState,
    /// Size and mtime of each file at the previous pass.
    seen: HashMap<String, (u64, i64)>,
    /// Files that turned out to be neither tarballs nor pull lists (not persisted).
    ignored: HashMap<String, (u64, i64)>,
    /// Files whose import failed for a passing reason, with the reason last logged.
    retrying: HashMap<String, String>,
    /// When the last pass left a file to settle: how soon it will have.
    settles_in: Option<Duration>,
}

/// The note [`ImageDir::prepare`] leaves in the folder, so that a newcomer finds what it is for.
pub(super) const README_NAME: &str = "README.txt";
pub(super) const README: &str = "\
Images dropped here are imported into the node's containerd (namespace k8s.io) at start and whenever
a file appears or changes, so pods can run them without a registry (air-gapped, as k3s's agent/images).

  *.tar *.tar.gz *.tgz *.tar.zst   an OCI layout or `docker save` tarball, e.g.
                                   docker save nginx:1.27 -o nginx.tar   (on a machine with a registry)
  *.txt                            image references to pull, one per line (# starts a comment)

A file is imported once: images.imported.json beside this folder remembers what was done. A file that
cannot be imported is logged and skipped until it changes. By hand: cairn images import FILE...
";

/// The references of every image imported or pulled from the images directory, as its state file
/// records them (an air-gapped node could not get them back, so image garbage collection keeps them).
pub fn imported_references(state_file: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(state_file) else { return Vec::new() };
    let state: DirState = serde_json::from_slice(&bytes).unwrap_or_default();
    state.files.into_values().filter(|f| f.ok).flat_map(|f| f.images).map(|i| i.reference).collect()
}

impl ImageDir {
    /// Creates the folder with its README (left alone once there, so an edited one survives).
    pub fn prepare(dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let readme = dir.join(README_NAME);
        if !readme.exists() {
            std::fs::write(readme, README)?;
        }
        Ok(())
    }

    pub fn new(dir: PathBuf, state_file: PathBuf) -> Self {
        let label = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut state = match std::fs::read(&state_file) {
            Ok(bytes) => serde_json::from_slice::<DirState>(&bytes).unwrap_or_else(|e| {
                tracing::warn!("ignoring unreadable image import state {}: {e}", state_file.display());
                DirState::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => DirState::default(),
            Err(e) => {
                tracing::warn!("ignoring unreadable image import state {}: {e}", state_file.display());
                DirState::default()
            }
        };
        // Pulls fail for passing reasons (no network yet): a failed pull list is tried again once per start.
        state.files.retain(|_, r| r.ok || r.kind != FileKind::PullList);
        ImageDir {
            dir,
            state_file,
            label,
            state,
            seen: HashMap::new(),
            ignored: HashMap::new(),
            retrying: HashMap::new(),
            settles_in: None,
        }
    }

    /// One pass: imports new or changed tarballs and pulls what new or changed pull lists name.
    /// Returns how many files were processed (successfully or not). One bad file does not stop the
    /// others: it is logged once and not tried again until it changes.
    pub async fn scan(
        &mut self,
        importer: &Importer,
        pull: &(dyn Fn(String) -> BoxFuture<'static, Result<()>> + Sync),
    ) -> usize {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return 0,
            Err(e) => {
                tracing::debug!("reading {}: {e}", self.dir.display());
                return 0;
            }
        };
        let mut files = Vec::new();
        for entry in listing.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if name.starts_with('.') || name.ends_with(".tmp") || name.ends_with(".part") {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: a link to a tarball elsewhere counts.
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            files.push((name, path, file_stamp(&meta), meta.modified().ok()));
        }
        files.sort();
        let present: HashSet<String> = files.iter().map(|f| f.0.clone()).collect();
        let mut dirty = false;
        let before = self.state.files.len();
        self.state.files.retain(|name, _| present.contains(name));
        dirty |= self.state.files.len() != before;
        self.ignored.retain(|name, _| present.contains(name));
        self.retrying.retain(|name, _| present.contains(name));
        let previous = std::mem::take(&mut self.seen);
        self.seen = files.iter().map(|f| (f.0.clone(), f.2)).collect();

        let mut processed = 0;
        self.settles_in = None;
        for (name, path, stamp, modified) in files {
            let (size, mtime_ns) = stamp;
            if self.state.files.get(&name).is_some_and(|r| (r.size, r.mtime_ns) == stamp)
                || self.ignored.get(&name) == Some(&stamp)
            {
                continue;
            }
            let settling = modified.and_then(|m| match SystemTime::now().duration_since(m) {
                Ok(age) => SETTLE_TIME.checked_sub(age),
                Err(ahead) => (ahead.duration() < SETTLE_TIME).then_some(SETTLE_TIME + ahead.duration()),
            });
            if let Some(left) = settling {
                let left = left + Duration::from_millis(100);
                self.settles_in = Some(self.settles_in.map_or(left, |d| d.min(left)));
            }
            let growing = previous.get(&name).is_some_and(|&(s, _)| s != size);
            if settling.is_some() || growing {
                tracing::debug!("{}/{name} may still be being written; next pass", self.label);
                continue;
            }
            let Some(kind) = classify(&name, &path) else {
                tracing::debug!("{}/{name} is neither an image tarball nor a pull list; ignored", self.label);
                self.ignored.insert(name, stamp);
                continue;
            };
            processed += 1;
            let shown = format!("{}/{name}", self.label);
            let record = match kind {
                FileKind::Tarball => match self.import_one(importer, &path, &shown, size, mtime_ns).await {
                    Ok(record) => record,
                    Err(e) => {
                        // containerd is away: not the file's fault, so not remembered; one line per reason.
                        let reason = format!("{e:#}");
                        if self.retrying.get(&name) != Some(&reason) {
                            tracing::warn!("could not import {shown}: {reason} (trying again)");
                            self.retrying.insert(name, reason);
                        }
                        continue;
                    }
                },
                FileKind::PullList => self.pull_list(pull, &path, &shown, size, mtime_ns).await,
            };
            self.retrying.remove(&name);
            // Changed while it was being read: look at it again next pass.
            let now = std::fs::metadata(&path).ok().map(|m| file_stamp(&m));
            if now != Some(stamp) {
                tracing::debug!("{shown} changed while it was being read; next pass");
                continue;
            }
            self.state.files.insert(name, record);
            dirty = true;
        }
        if dirty && let Err(e) = self.save() {
            tracing::warn!("saving image import state {}: {e:#}", self.state_file.display());
        }
        processed
    }

    /// The record to keep, or the error when it was containerd's (then the file is tried again).
    async fn import_one(
        &self,
        importer: &Importer,
        path: &Path,
        shown: &str,
        size: u64,
        mtime_ns: i64,
    ) -> Result<FileRecord> {
        let started = Instant::now();
        let progress = progress_logger_named(shown.to_string());
        match importer.import_path(path, &progress).await {
            Ok(images) => {
                let secs = started.elapsed().as_secs_f64();
                for i in &images {
                    match i.change {
                        ImageChange::Unchanged => {
                            tracing::info!("{} ({}) from {shown} was already imported", i.reference, i.digest)
                        }
                        _ => tracing::info!("imported {} ({}) from {shown} in {secs:.1}s", i.reference, i.digest),
                    }
                }
                let images =
                    images.into_iter().map(|i| ImageRecord { reference: i.reference, digest: i.digest }).collect();
                Ok(FileRecord { size, mtime_ns, kind: FileKind::Tarball, ok: true, images, error: None })
            }
            Err(e) if is_transient(&e) => Err(e),
            Err(e) => {
                tracing::warn!("could not import {shown}: {e:#} (it is tried again when the file changes)");
                Ok(FileRecord {
                    size,
                    mtime_ns,
                    kind: FileKind::Tarball,
                    ok: false,
                    images: vec![],
                    error: Some(format!("{e:#}")),
                })
            }
        }
    }

    async fn pull_list(
        &self,
        pull: &(dyn Fn(String) -> BoxFuture<'static, Result<()>> + Sync),
        path: &Path,
        shown: &str,
        size: u64,
        mtime_ns: i64,
    ) -> FileRecord {
        let failed = |error: String| {
            tracing::warn!("could not pull the images listed in {shown}: {error}");
            FileRecord { size, mtime_ns, kind: FileKind::PullList, ok: false, images: vec![], error: Some(error) }
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => return failed(format!("reading it: {e}")),
        };
        let mut pulled = Vec::new();
        let mut errors = Vec::new();
        for reference in parse_pull_list(&text) {
            if let Err(e) = normalize_reference(&reference) {
                errors.push(e);
                continue;
            }
            let started = Instant::now();
            match pull(reference.clone()).await {
                Ok(()) => {
                    tracing::info!("pulled {reference} (listed in {shown}) in {:.1}s", started.elapsed().as_secs_f64());
                    pulled.push(ImageRecord { reference, digest: String::new() });
                }
                Err(e) => errors.push(format!("{reference}: {e:#}")),
            }
        }
        if !errors.is_empty() {
            let total = errors.len() + pulled.len();
            let mut rec = failed(format!("{} of {total} failed: {}", errors.len(), errors.join("; ")));
            rec.images = pulled;
            return rec;
        }
        FileRecord { size, mtime_ns, kind: FileKind::PullList, ok: true, images: pulled, error: None }
    }

    /// Writes the state file atomically (temporary file, fsync, rename).
    fn save(&self) -> Result<()> {
        use std::io::Write as _;
        if let Some(parent) = self.state_file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut tmp = self.state_file.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&self.state)?)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.state_file)?;
        Ok(())
    }

    /// Runs [`scan`](Self::scan) now and then every `interval` until `shutdown` resolves (an import
    /// in progress is abandoned; it is redone at the next start). A file left alone because it was
    /// modified in the last 2 s is looked at again as soon as it has settled, not a whole interval later.
    pub async fn watch<P>(mut self, importer: Importer, pull: P, interval: Duration, shutdown: impl Future<Output = ()>)
    where
        P: Fn(String) -> BoxFuture<'static, Result<()>> + Sync,
    {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = self.scan(&importer, &pull) => {}
            }
            // A file that was too fresh is looked at again as soon as it has settled.
            let wait = self.settles_in.map_or(interval, |d| d.min(interval));
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

pub(super) fn file_stamp(meta: &std::fs::Metadata) -> (u64, i64) {
    use std::os::unix::fs::MetadataExt as _;
    (meta.len(), meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()))
}

/// By name first, then by content. The folder's own [`README`] is neither.
pub(super) fn classify(name: &str, path: &Path) -> Option<FileKind> {
    if name == README_NAME {
        return None;
    }
    if name.ends_with(".txt") {
        return Some(FileKind::PullList);
    }
    const TARBALLS: [&str; 6] = [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst"];
    if TARBALLS.iter().any(|ext| name.ends_with(ext)) {
        return Some(FileKind::Tarball);
    }
    let mut head = [0u8; 512];
    let n = std::fs::File::open(path).and_then(|mut f| read_up_to(&mut f, &mut head)).ok()?;
    sniff_tarball(&head[..n]).map(|_| FileKind::Tarball)
}

/// Image references, one per line; `#` starts a comment.
pub(super) fn parse_pull_list(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}
