//! kubelet's `AtomicWriter`: the files of a volume live in a `..<timestamp>` directory, `..data`
//! points at the current one, and each top-level path is a symlink through `..data`. A new version
//! is written beside the old one and swapped in by renaming a new `..data` over the old, so readers
//! see either version whole. Nothing is written when the contents and modes are unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path};

const DATA_DIR: &str = "..data";
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path → file.
pub(crate) type Payload = BTreeMap<String, FileProjection>;

#[derive(Debug)]
pub(crate) enum WriteError {
    Invalid(String),
    Io(io::Error),
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> Self {
        WriteError::Io(e)
    }
}

/// Writes `payload` into `target` (which must exist). Returns whether a new version was written.
pub(crate) fn write(target: &Path, payload: &Payload) -> Result<bool, WriteError> {
    let payload = clean_payload(payload)?;
    let old = fs::read_link(target.join(DATA_DIR)).ok().and_then(|p| p.to_str().map(str::to_string));
    let unchanged = match &old {
        Some(old) => read_tree(&target.join(old))? == payload,
        None => false,
    };
    if !unchanged {
        let ts_dir = new_timestamp_dir(target)?;
        let ts_name = ts_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if let Err(e) = write_files(&ts_dir, &payload).and_then(|()| swap_data_link(target, &ts_name)) {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(e.into());
        }
    }
    let top_level: BTreeSet<&str> = payload.keys().map(|p| p.split('/').next().unwrap_or(p)).collect();
    create_visible_links(target, &top_level)?;
    remove_stale_links(target, &top_level)?;
    if !unchanged && let Some(old) = old {
        fs::remove_dir_all(target.join(old))?;
    }
    Ok(!unchanged)
}

/// upstream's `validatePayload`: relative, no `..` component, not starting with `..`; cleaned.
fn clean_payload(payload: &Payload) -> Result<Payload, WriteError> {
    let mut clean = Payload::new();
    for (path, file) in payload {
        let invalid = |why: &str| Err(WriteError::Invalid(format!("invalid path: {why}: {path}")));
        if path.len() > MAX_PATH_LENGTH {
            return Err(WriteError::Invalid(format!(
                "invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters"
            )));
        }
        if path.starts_with('/') {
            return invalid("must be relative path");
        }
        let mut parts = Vec::new();
        for c in Path::new(path).components() {
            match c {
                Component::Normal(p) => {
                    let p = p.to_str().unwrap_or_default();
                    if p.len() > MAX_FILE_NAME_LENGTH {
                        return Err(WriteError::Invalid(format!(
                            "invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
                        )));
                    }
                    parts.push(p);
                }
                Component::ParentDir => return invalid("must not contain '..'"),
                _ => {}
            }
        }
        if parts.first().is_some_and(|p| p.starts_with("..")) {
            return invalid("must not start with '..'");
        }
        if parts.is_empty() {
            return invalid("must not be empty");
        }
        clean.insert(parts.join("/"), file.clone());
    }
    Ok(clean)
}

/// The files under `dir` (relative path → contents and mode); empty if `dir` is missing.
fn read_tree(dir: &Path) -> io::Result<Payload> {
    let mut out = Payload::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, rel)) = stack.pop() {
        let entries = match fs::read_dir(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            other => other?,
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push((entry.path(), rel));
            } else {
                let file = FileProjection { data: fs::read(entry.path())?, mode: meta.permissions().mode() & 0o7777 };
                out.insert(rel, file);
            }
        }
    }
    Ok(out)
}

/// `..<UTC timestamp>.<random>`, mode 0755.
fn new_timestamp_dir(target: &Path) -> io::Result<std::path::PathBuf> {
    let stamp = chrono::Utc::now().format("..%Y_%m_%d_%H_%M_%S.");
    for attempt in 0u32..100 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let suffix = nanos.wrapping_mul(2_654_435_761).wrapping_add(std::process::id()).wrapping_add(attempt);
        let dir = target.join(format!("{stamp}{suffix}"));
        match fs::create_dir(&dir) {
            Ok(()) => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free timestamp directory name"))
}

fn write_files(dir: &Path, payload: &Payload) -> io::Result<()> {
    for (rel, file) in payload {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o755).create(parent)?;
        }
        fs::write(&path, &file.data)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(file.mode))?;
    }
    Ok(())
}

/// Points `..data` at `ts_name` by renaming a fresh `..data_tmp` symlink over it.
fn swap_data_link(target: &Path, ts_name: &str) -> io::Result<()> {
    let tmp = target.join(NEW_DATA_DIR);
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    symlink(ts_name, &tmp)?;
    fs::rename(&tmp, target.join(DATA_DIR)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// `<top> -> ..data/<top>` for each top-level path that has no link yet.
fn create_visible_links(target: &Path, top_level: &BTreeSet<&str>) -> io::Result<()> {
    for top in top_level {
        let link = target.join(top);
        match fs::symlink_metadata(&link) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => symlink(Path::new(DATA_DIR).join(top), &link)?,
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the top-level symlinks of paths no longer in the payload.
fn remove_stale_links(target: &Path, top_level: &BTreeSet<&str>) -> io::Result<()> {
    for entry in fs::read_dir(target)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || top_level.contains(name.as_str()) {
            continue;
        }
        if entry.file_type()?.is_symlink() {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}
