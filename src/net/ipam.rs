//! Host-local-style IP address management.
//!
//! Layout under `<stateDir>/ipam/<network>/`, as the reference `host-local` plugin keeps it:
//! one file per allocated address (named after the address, content `containerID\r\nifname`),
//! `last_reserved_ip.0` (where the round-robin search resumes) and `lock`, which is held with
//! `flock(LOCK_EX)` across every read-modify-write so that plugin processes running at the same
//! time never hand out one address twice. Files are replaced by write-then-rename and never
//! fsynced: a crash may lose the newest allocation, but never corrupts the others.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::spec::{Cidr, CniError, code};

const LAST_RESERVED: &str = "last_reserved_ip.0";

/// An exclusive `flock` on a file, held until dropped (closing the file releases it).
pub struct FileLock {
    _file: File,
}

impl FileLock {
    pub fn acquire(path: &Path) -> Result<FileLock> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(FileLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != ErrorKind::Interrupted {
                return Err(err).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
}

/// One network's allocation directory.
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating if needed) `<state_dir>/ipam/<network>`.
    pub fn open(state_dir: &Path, network: &str) -> Result<Store> {
        let dir = state_dir.join("ipam").join(network);
        fs::create_dir_all(&dir).with_context(|| format!("creating IPAM directory {}", dir.display()))?;
        Ok(Store { dir })
    }

    fn lock(&self) -> Result<FileLock> {
        FileLock::acquire(&self.dir.join("lock"))
    }

    /// All allocations as (address, owner) where owner is the file's content.
    fn entries(&self) -> Result<Vec<(Ipv4Addr, String)>> {
        let mut out = Vec::new();
        let rd = fs::read_dir(&self.dir).with_context(|| format!("reading {}", self.dir.display()))?;
        for entry in rd {
            let entry = entry.with_context(|| format!("reading {}", self.dir.display()))?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse::<Ipv4Addr>().ok()) else { continue };
            match fs::read_to_string(entry.path()) {
                Ok(owner) => out.push((ip, owner)),
                // Released by a process that does not hold the lock (it should not happen, but a
                // vanished file is simply not an allocation).
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", entry.path().display())),
            }
        }
        Ok(out)
    }

    /// Returns the address allocated to this container's interface, if any.
    pub fn find(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>> {
        let _l = self.lock()?;
        let owner = owner(container_id, ifname);
        Ok(self.entries()?.into_iter().find(|(_, o)| o.trim() == owner).map(|(ip, _)| ip))
    }

    /// Allocates an address of `subnet` for the container's interface: the one it already has, or
    /// the next free one after the last reserved, skipping network, gateway and broadcast.
    pub fn allocate(&self, subnet: Cidr, container_id: &str, ifname: &str) -> Result<Ipv4Addr> {
        let _l = self.lock()?;
        let owner = owner(container_id, ifname);
        let entries = self.entries()?;
        if let Some((ip, _)) = entries.iter().find(|(ip, o)| o.trim() == owner && subnet.contains(*ip)) {
            return Ok(*ip);
        }
        let first = u32::from(subnet.gateway()) + 1;
        let last = u32::from(subnet.broadcast()) - 1;
        let size = last - first + 1;
        // Resume after the last reserved address (if it is still in range) so that a released
        // address is not reused at once.
        let last_reserved = fs::read_to_string(self.dir.join(LAST_RESERVED))
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|ip| (first..=last).contains(ip));
        let start = last_reserved.map_or(0, |ip| ip - first + 1);
        for i in 0..size {
            let ip = Ipv4Addr::from(first + (start + i) % size);
            if entries.iter().any(|(taken, _)| *taken == ip) {
                continue;
            }
            self.write(&ip.to_string(), &owner)?;
            self.write(LAST_RESERVED, &ip.to_string())?;
            return Ok(ip);
        }
        Err(CniError::new(
            code::IPAM_EXHAUSTED,
            format!("no free address left in {subnet}"),
            format!("all {size} pod addresses of {subnet} are allocated (see {})", self.dir.display()),
        )
        .into())
    }

    /// Releases every address held by the container's interface; returns the released one.
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Option<Ipv4Addr>> {
        let _l = self.lock()?;
        let owner = owner(container_id, ifname);
        let mut released = None;
        for (ip, o) in self.entries()? {
            if o.trim() == owner {
                let path = self.dir.join(ip.to_string());
                match fs::remove_file(&path) {
                    Ok(()) => released = Some(ip),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
                }
            }
        }
        Ok(released)
    }

    /// Replaces `name` with `content` atomically (write a temporary file, rename it over).
    fn write(&self, name: &str, content: &str) -> Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let path = self.dir.join(name);
        fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }
}

/// What an allocation file holds: `containerID\r\nifname`, as host-local writes it.
fn owner(container_id: &str, ifname: &str) -> String {
    format!("{container_id}\r\n{ifname}")
}
