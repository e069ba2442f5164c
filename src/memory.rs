//! The process's own memory: the allocator, and the code pages that only start-up ran.

use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

// jemalloc replaces glibc's malloc for the whole process (its `malloc`, `free`, ... symbols win at
// link time; Rust's default allocator calls them). Under create load glibc malloc and the waits on
// its arena locks took about 40 % of the server's CPU. Not a `#[global_allocator]`: through
// `malloc` itself the compiler still turns an allocation that is then zeroed into `calloc`, which
// leaves fresh pages untouched (sled allocates 20 MiB of metric histograms that way, and pays no
// RSS for them), and C code uses the same allocator.
use tikv_jemalloc_sys as _;

/// jemalloc's options, read at its first allocation: one background thread hands memory that a burst
/// freed back to the system after the decay time (10 s), even when the process then sits idle.
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: &[u8; 48] = b"background_thread:true,max_background_threads:1\0";

/// How long after start-up ends its code pages are handed back: the first rounds of the
/// controllers and the node's first heartbeat run in the meantime.
const STARTUP_SETTLE: Duration = Duration::from_secs(5);

/// Hands back, `STARTUP_SETTLE` after now, the code pages start-up left resident.
pub fn release_startup_code_later(shutdown: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(STARTUP_SETTLE) => {}
            () = shutdown.cancelled() => return,
        }
        match tokio::task::spawn_blocking(release_startup_code).await.map_err(std::io::Error::other).flatten() {
            Ok(r) => tracing::info!(
                "start-up is over: handed back {:.1} MiB of code pages, {:.1} MiB of code stay resident",
                mib(r.before.saturating_sub(r.after)),
                mib(r.after)
            ),
            Err(e) => tracing::debug!("start-up code pages stay resident: {e}"),
        }
    });
}

/// File-backed resident memory, in bytes, before and after a release.
#[derive(Debug)]
pub struct Released {
    pub before: u64,
    pub after: u64,
}

/// Reclaims the resident pages of this binary's read-only mappings (machine code, constants) that
/// no other process maps, as the kernel frees its `__init` sections once booted.
///
/// Start-up runs code spread over most of the binary once (every kind's registration, the default
/// RBAC policy, each controller's first sync), and with the kernel's readahead and fault-around
/// those clean pages stay in the resident set until memory runs short: about 30 MiB, against about
/// 4 MiB that an idle server keeps running. `MADV_PAGEOUT` (Linux 5.4) reclaims them now; a page
/// used again later faults back in from the page cache or the disk.
pub fn release_startup_code() -> std::io::Result<Released> {
    let inode = std::fs::metadata("/proc/self/exe")?.ino();
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let before = rss_file()?;
    for (start, end) in code_ranges(&maps, inode) {
        // SAFETY: the range is one of this process's mappings of its own executable, which stay
        // mapped for its lifetime; paging out clean read-only file pages never changes what a
        // later read of them returns.
        if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(Released { before, after: rss_file()? })
}

/// The read-only mappings of the file with `inode` in a `/proc/<pid>/maps` listing.
fn code_ranges(maps: &str, inode: u64) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (_offset, _dev, ino) = (f.next()?, f.next()?, f.next()?);
            if ino.parse::<u64>().ok()? != inode || perms.contains('w') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?))
        })
        .collect()
}

/// `RssFile` of this process, in bytes.
fn rss_file() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| std::io::Error::other("no RssFile in /proc/self/status"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_ranges_are_the_binarys_read_only_mappings() {
        let maps = "\
55d0b4b7000-55d0c043000 r--p 00000000 fe:00 5963778    /usr/local/bin/cairn
55d0c043000-55d0eab4000 r-xp 00b8b000 fe:00 5963778    /usr/local/bin/cairn
55d0ebb1000-55d0ebb9000 rw-p 036f7000 fe:00 5963778    /usr/local/bin/cairn
55d0ebb9000-55d0edc4000 rw-p 00000000 00:00 0          [heap]
7f00000000-7f00001000 r-xp 00000000 fe:00 1234        /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd000000-7ffd001000 r-xp 00000000 00:00 0          [vdso]
";
        let ranges = code_ranges(maps, 5963778);
        assert_eq!(ranges, vec![(0x55d0b4b7000, 0x55d0c043000), (0x55d0c043000, 0x55d0eab4000)]);
        assert!(code_ranges(maps, 42).is_empty());
    }

    #[test]
    fn releasing_start_up_code_shrinks_the_resident_code() {
        let r = release_startup_code().expect("MADV_PAGEOUT on this binary's code");
        assert!(r.before > 0, "{r:?}");
        assert!(r.after < r.before, "nothing was reclaimed: {r:?}");
    }
}
