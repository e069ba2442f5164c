//! `--device RESOURCE=GLOB`: each device node matching the glob is one unit of the resource, handed
//! to the container as a device node at the same path. An in-process device plugin serves it over
//! the device-plugin API and registers through `kubelet.sock`, the path an external plugin takes.
//! Devices that appear or go (USB) are found by looking at the directory every few seconds: one
//! directory read, no write, and no inotify watch to keep on a `/dev` that udev rewrites.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::plugin;
use super::proto;
use crate::registry::kinds::pod_rules::is_extended_resource;

/// How often the directory is looked at.
pub(super) const SCAN_PERIOD: Duration = Duration::from_secs(2);

/// A `--device` flag: the resource, and the directory and file-name pattern of its device nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceGlob {
    pub resource: String,
    dir: PathBuf,
    pattern: String,
}

impl std::str::FromStr for DeviceGlob {
    type Err = String;

    fn from_str(flag: &str) -> Result<Self, String> {
        let usage = || format!("invalid --device {flag:?}: expected RESOURCE=GLOB, e.g. cairn.io/serial=/dev/ttyUSB*");
        let (resource, glob) = flag.split_once('=').ok_or_else(usage)?;
        if !is_extended_resource(resource) {
            return Err(format!(
                "invalid --device {flag:?}: {resource:?} is not an extended resource name (a domain-qualified name like cairn.io/serial)"
            ));
        }
        let path = Path::new(glob);
        let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Err(usage());
        };
        if !path.is_absolute() || dir.to_string_lossy().contains(['*', '?']) {
            return Err(format!(
                "invalid --device {flag:?}: the glob must be an absolute path with wildcards (* ?) in its last part only"
            ));
        }
        Ok(DeviceGlob { resource: resource.to_string(), dir: dir.to_path_buf(), pattern: name.to_string() })
    }
}

/// Whether `name` matches `pattern` (`*`: any run of characters, `?`: one character). Written here:
/// a device glob is one file-name pattern, less than a glob crate is for.
pub(super) fn matches(pattern: &[char], name: &[char]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some(('*', rest)) => (0..=name.len()).any(|i| matches(rest, &name[i..])),
        Some(('?', rest)) => !name.is_empty() && matches(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && matches(rest, &name[1..]),
    }
}

impl DeviceGlob {
    /// The device nodes (character or block) matching now, sorted.
    fn scan(&self) -> Vec<String> {
        use std::os::unix::fs::FileTypeExt as _;
        let pattern: Vec<char> = self.pattern.chars().collect();
        let mut found: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name: Vec<char> = e.file_name().to_string_lossy().chars().collect();
                matches(&pattern, &name)
            })
            .filter(|e| {
                std::fs::metadata(e.path())
                    .is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
            })
            .map(|e| e.path().display().to_string())
            .collect();
        found.sort();
        found
    }
}

/// Serves the plugin for `glob` in the device-plugins directory `dir` and registers it, until
/// `shutdown`.
pub async fn run(glob: DeviceGlob, dir: PathBuf, shutdown: CancellationToken) -> anyhow::Result<()> {
    let healthy = |paths: Vec<String>| paths.into_iter().map(|p| (p, true)).collect::<Vec<_>>();
    let (tx, devices) = watch::channel(healthy(glob.scan()));
    plugin::serve_and_register(devices.clone(), Nodes(devices), &glob.resource, &dir, &shutdown).await?;
    tracing::info!("--device {}: {} device(s) matching {}", glob.resource, tx.borrow().len(), glob.pattern);
    let mut tick = tokio::time::interval(SCAN_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let now = healthy(glob.scan());
        tx.send_if_modified(|old| {
            let changed = *old != now;
            if changed {
                tracing::info!("--device {}: now {} device(s)", glob.resource, now.len());
                *old = now;
            }
            changed
        });
    }
}

/// Each device node at its own path, readable and writable, while it is there.
struct Nodes(plugin::Devices);

impl plugin::Allocator for Nodes {
    fn allocate(&self, ids: &[String]) -> Result<proto::ContainerAllocateResponse, Status> {
        let present = self.0.borrow();
        let devices = ids
            .iter()
            .map(|id| match present.iter().any(|(p, _)| p == id) {
                true => Ok(proto::DeviceSpec {
                    container_path: id.clone(),
                    host_path: id.clone(),
                    permissions: "rw".into(),
                }),
                false => Err(Status::not_found(format!("device {id} is gone"))),
            })
            .collect::<Result<_, _>>()?;
        Ok(proto::ContainerAllocateResponse { devices, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_flags_parse_and_globs_match_file_names() {
        let g: DeviceGlob = "cairn.io/serial=/dev/ttyUSB*".parse().unwrap();
        assert_eq!(
            (g.resource.as_str(), g.dir.as_path(), g.pattern.as_str()),
            ("cairn.io/serial", Path::new("/dev"), "ttyUSB*")
        );
        assert_eq!(plugin::socket_name(&g.resource), "cairn-cairn-io-serial.sock");
        let m = |p: &str, n: &str| matches(&p.chars().collect::<Vec<_>>(), &n.chars().collect::<Vec<_>>());
        assert!(m("ttyUSB*", "ttyUSB0") && m("ttyUSB*", "ttyUSB") && m("video?", "video1"));
        assert!(!m("ttyUSB*", "ttyS0") && !m("video?", "video10") && !m("video?", "video"));
        assert!("serial=/dev/ttyUSB*".parse::<DeviceGlob>().unwrap_err().contains("is not an extended resource name"));
        assert!("cairn.io/x=/dev/*/y".parse::<DeviceGlob>().unwrap_err().contains("in its last part only"));
        assert!("cairn.io/x".parse::<DeviceGlob>().unwrap_err().contains("expected RESOURCE=GLOB"));
        assert!("cairn.io/x=dev/tty*".parse::<DeviceGlob>().is_err());
    }

    #[test]
    fn only_device_nodes_that_match_are_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fake0"), "").unwrap();
        let g: DeviceGlob = format!("cairn.io/fake={}/fake*", dir.path().display()).parse().unwrap();
        assert!(g.scan().is_empty(), "a plain file is not a device");
        // /dev/null is a character device in any root: link it in under a matching name.
        std::os::unix::fs::symlink("/dev/null", dir.path().join("fake1")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("other")).unwrap();
        assert_eq!(g.scan(), [dir.path().join("fake1").display().to_string()]);
    }
}
