//! tmpfs mounts for memory-backed volumes, bind mounts for CSI volumes, and unmounting everything
//! under a pod directory.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// Whether `path` is the root of a mount: its device differs from its parent's.
pub(crate) fn is_mount_point(path: &Path) -> io::Result<bool> {
    let meta = std::fs::symlink_metadata(path)?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    Ok(meta.dev() != std::fs::metadata(parent)?.dev())
}

/// Mounts a tmpfs at `path` (an existing directory) unless a mount is already there. `size` in
/// bytes, as kubelet's `size=` option; the root keeps tmpfs's default mode 1777, as kubelet's.
pub(crate) fn ensure_tmpfs(path: &Path, size: Option<i128>) -> io::Result<()> {
    if is_mount_point(path)? {
        return Ok(());
    }
    let options = size.map(|s| format!("size={s}"));
    nix::mount::mount(Some("tmpfs"), path, Some("tmpfs"), MsFlags::empty(), options.as_deref())?;
    tracing::debug!(path = %path.display(), ?options, "mounted tmpfs");
    Ok(())
}

/// Whether something is mounted exactly at `path` (by `/proc/self/mountinfo`: a bind mount from the
/// same filesystem has its parent's device number).
pub(crate) fn is_mounted(path: &Path) -> io::Result<bool> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo.lines().filter_map(|line| line.split(' ').nth(4)).any(|p| Path::new(&unescape_octal(p)) == path))
}

/// Bind-mounts `source` at `target` (an existing directory) unless a mount is already there;
/// `read_only` remounts the bind read-only, as a bind's flags can only be changed by a remount.
pub(crate) fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    if is_mounted(target)? {
        return Ok(());
    }
    nix::mount::mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    if read_only {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        if let Err(e) = nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
            let _ = nix::mount::umount2(target, MntFlags::empty());
            return Err(e.into());
        }
    }
    tracing::debug!(source = %source.display(), target = %target.display(), read_only, "bind-mounted");
    Ok(())
}

/// Unmounts `path` if something is mounted there.
pub(crate) fn unmount(path: &Path) -> io::Result<()> {
    if !is_mounted(path)? {
        return Ok(());
    }
    match nix::mount::umount2(path, MntFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(io::Error::other(format!("unmounting {}: {e}", path.display()))),
    }
}

/// Unmounts every mount whose mount point is inside `dir`, deepest first.
pub(crate) fn unmount_all_under(dir: &Path) -> io::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut points = mount_points_under(&mountinfo, dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    for point in points {
        match nix::mount::umount2(&point, MntFlags::empty()) {
            Ok(()) => tracing::debug!(path = %point.display(), "unmounted"),
            // Already gone (a stacked mount unmounted with its parent).
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(io::Error::other(format!("unmounting {}: {e}", point.display()))),
        }
    }
    Ok(())
}

/// Mount points (field 5 of `/proc/self/mountinfo`, octal escapes decoded) strictly inside `dir`.
fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_octal(p)))
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect()
}

/// Decodes the `\040`-style escapes the kernel writes for spaces, tabs, newlines and backslashes.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    40 22 0:50 / /pods/a/volumes/kubernetes.io~secret/my\\040secret rw - tmpfs tmpfs rw\n\
                    41 22 0:51 / /pods/a rw - tmpfs tmpfs rw\n\
                    42 22 0:52 / /pods/ab/x rw - tmpfs tmpfs rw\n";
        let points = mount_points_under(info, Path::new("/pods/a"));
        assert_eq!(points, vec![PathBuf::from("/pods/a/volumes/kubernetes.io~secret/my secret")]);
        assert_eq!(unescape_octal("a\\011b\\134"), "a\tb\\");
    }
}
