//! kubelet's `SetVolumeOwnership`: a volume of a pod with `fsGroup` is made the group's, recursively
//! (files group read-write, directories group read-write-search with set-group-ID so new files
//! inherit the group). `OnRootMismatch` skips the walk when the root already has that group and mode.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

const FILE_BITS: u32 = 0o660;
const DIR_BITS: u32 = 0o2770;
const READ_ONLY_FILE_BITS: u32 = 0o440;
const READ_ONLY_DIR_BITS: u32 = 0o2550;

/// Gives `root` and everything under it to group `gid`.
pub fn set(root: &Path, gid: u32, read_only: bool, on_root_mismatch: bool) -> std::io::Result<()> {
    let (file_bits, dir_bits) =
        if read_only { (READ_ONLY_FILE_BITS, READ_ONLY_DIR_BITS) } else { (FILE_BITS, DIR_BITS) };
    if on_root_mismatch {
        let meta = std::fs::metadata(root)?;
        if meta.gid() == gid && meta.mode() & dir_bits == dir_bits {
            return Ok(());
        }
    }
    walk(root, gid, file_bits, dir_bits)
}

fn walk(path: &Path, gid: u32, file_bits: u32, dir_bits: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.gid() != gid {
        std::os::unix::fs::lchown(path, None, Some(gid))?;
    }
    let bits = if meta.is_dir() { dir_bits } else { file_bits };
    let mode = meta.mode() & 0o7777;
    if mode & bits != bits {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | bits))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), gid, file_bits, dir_bits)?;
        }
    }
    Ok(())
}
