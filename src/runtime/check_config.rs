//! `cairn check-config`: what this machine lacks to run cairn, in plain words (k3s's
//! `check-config`). It runs the checks `cairn server` runs before it starts the agent (root, the
//! cgroup memory controller, containerd and runc, iptables, nft), then reads the kernel's
//! configuration for what the pod network, the service proxy and containerd's overlay snapshots
//! use. The kernel's configuration comes from `/proc/config.gz` or `/boot/config-<release>`;
//! without either, a module that is loaded or listed in `/lib/modules/<release>` still counts, and
//! the rest is reported as unknown rather than missing.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// One line of the report: what is checked, whether cairn cannot run without it, and what was
/// found (`Ok`: a detail; `Err`: what to do).
#[derive(Debug)]
pub struct Item {
    pub name: String,
    pub required: bool,
    pub outcome: Outcome,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(String),
    Missing(String),
    Unknown(String),
}

/// Kernel features: (what, config option, module name, required, what it is for).
const KERNEL: &[(&str, &str, &str, bool, &str)] = &[
    ("bridge", "CONFIG_BRIDGE", "bridge", true, "the pod network's bridge"),
    ("veth", "CONFIG_VETH", "veth", true, "a link per pod"),
    ("overlay", "CONFIG_OVERLAY_FS", "overlay", true, "containerd's image snapshots"),
    ("conntrack", "CONFIG_NF_CONNTRACK", "nf_conntrack", true, "NAT and Services"),
    ("nat", "CONFIG_NF_NAT", "nf_nat", true, "masquerade and hostPorts"),
    ("nftables", "CONFIG_NF_TABLES", "nf_tables", true, "the service proxy"),
    ("nftables nat", "CONFIG_NFT_NAT", "nft_nat", true, "the service proxy's DNAT"),
    ("nftables numgen", "CONFIG_NFT_NUMGEN", "nft_numgen", true, "spreading a Service over its endpoints"),
    ("bridge netfilter", "CONFIG_BRIDGE_NETFILTER", "br_netfilter", false, "Service traffic between pods of one node"),
    ("vxlan", "CONFIG_VXLAN", "vxlan", false, "pod traffic between nodes on different networks"),
];

/// The kernel's build configuration and its modules, read under `root` (`/` on a real machine).
pub struct Kernel {
    root: PathBuf,
    config: Option<String>,
    release: String,
}

impl Kernel {
    pub fn read(root: &Path) -> Kernel {
        let release =
            std::fs::read_to_string(root.join("proc/sys/kernel/osrelease")).unwrap_or_default().trim().to_string();
        let gz = std::fs::read(root.join("proc/config.gz")).ok().and_then(|bytes| {
            let mut text = String::new();
            flate2::read::GzDecoder::new(bytes.as_slice()).read_to_string(&mut text).ok().map(|_| text)
        });
        let config = gz.or_else(|| std::fs::read_to_string(root.join(format!("boot/config-{release}"))).ok());
        Kernel { root: root.to_path_buf(), config, release }
    }

    /// `y` or `m` in the configuration; `None` when there is no configuration to read.
    fn configured(&self, option: &str) -> Option<bool> {
        let config = self.config.as_ref()?;
        let prefix = format!("{option}=");
        Some(config.lines().any(|l| l.strip_prefix(&prefix).is_some_and(|v| v == "y" || v == "m")))
    }

    /// Loaded (`/sys/module`), built in or loadable (`/lib/modules/<release>`).
    fn has_module(&self, module: &str) -> bool {
        if self.root.join("sys/module").join(module).exists() {
            return true;
        }
        let dir = self.root.join("lib/modules").join(&self.release);
        let named = |line: &str| {
            let path = line.split(':').next().unwrap_or_default();
            let file = path.rsplit('/').next().unwrap_or_default();
            file.split(".ko").next() == Some(module) || file.split(".ko").next() == Some(&module.replace('_', "-"))
        };
        ["modules.builtin", "modules.dep"]
            .iter()
            .any(|f| std::fs::read_to_string(dir.join(f)).is_ok_and(|text| text.lines().any(named)))
    }

    fn check(&self, option: &str, module: &str) -> Outcome {
        match self.configured(option) {
            Some(true) => Outcome::Ok(option.to_string()),
            _ if self.has_module(module) => Outcome::Ok(format!("module {module}")),
            Some(false) => Outcome::Missing(format!(
                "the kernel lacks {option}: use a kernel built with it (as a module, `modprobe {module}` loads it)"
            )),
            None => Outcome::Unknown(format!(
                "no kernel configuration (/proc/config.gz, /boot/config-{}) and no module {module} found",
                self.release
            )),
        }
    }
}

fn outcome(result: anyhow::Result<String>) -> Outcome {
    match result {
        Ok(detail) => Outcome::Ok(detail),
        Err(e) => Outcome::Missing(format!("{e:#}")),
    }
}

/// Every check, in the order they are reported.
pub fn report(kernel: &Kernel) -> Vec<Item> {
    let item = |name: &str, required: bool, outcome: Outcome| Item { name: name.to_string(), required, outcome };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut items = vec![
        item(
            "root",
            true,
            if root {
                Outcome::Ok("running as root".into())
            } else {
                Outcome::Missing(
                    "the node agent runs containerd and sets up cgroups and the network: run as root".into(),
                )
            },
        ),
        item(
            "cgroup memory controller",
            true,
            outcome(crate::cgroups::check_memory_controller().map(|()| "enabled".into()).map_err(anyhow::Error::msg)),
        ),
        item("containerd", true, outcome(super::containerd::find_binaries(None).map(|p| p.display().to_string()))),
        item("iptables", true, outcome(crate::net::check_host().map(|()| "iptables-save, iptables-restore".into()))),
        item("nft", true, outcome(crate::proxy::check_host().map(|()| "for the service proxy".into()))),
        item(
            "conntrack",
            false,
            match crate::net::find_system_binary("conntrack") {
                Some(p) => Outcome::Ok(p.display().to_string()),
                None => Outcome::Missing(
                    "stale UDP flows of Services are not cleared without it (Debian/Ubuntu: apt-get install conntrack)"
                        .into(),
                ),
            },
        ),
    ];
    for (name, option, module, required, purpose) in KERNEL {
        let mut i = item(&format!("kernel: {name} ({purpose})"), *required, kernel.check(option, module));
        if let Outcome::Unknown(_) = i.outcome {
            i.required = false;
        }
        items.push(i);
    }
    items
}

/// Prints the report; true when nothing required is missing.
pub fn print(items: &[Item]) -> bool {
    println!("What cairn needs from this machine:");
    for (title, required) in [("Required", true), ("Optional", false)] {
        println!("\n{title}:");
        for i in items.iter().filter(|i| i.required == required) {
            match &i.outcome {
                Outcome::Ok(detail) => println!("  ok       {}: {detail}", i.name),
                Outcome::Missing(what) => println!("  missing  {}: {what}", i.name),
                Outcome::Unknown(why) => println!("  unknown  {}: {why}", i.name),
            }
        }
    }
    let missing: Vec<&str> = items
        .iter()
        .filter(|i| i.required && matches!(i.outcome, Outcome::Missing(_)))
        .map(|i| i.name.as_str())
        .collect();
    if missing.is_empty() {
        println!("\nEverything cairn needs is here.");
    } else {
        println!("\ncairn cannot run its node agent here until these are fixed: {}.", missing.join(", "));
    }
    missing.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn the_kernel_configuration_decides_and_modules_fill_in() {
        let dir = host(&[
            ("proc/sys/kernel/osrelease", "6.1.0-rpi\n"),
            ("boot/config-6.1.0-rpi", "CONFIG_BRIDGE=m\nCONFIG_VETH=y\n# CONFIG_VXLAN is not set\n"),
            (
                "lib/modules/6.1.0-rpi/modules.dep",
                "kernel/drivers/net/vxlan/vxlan.ko.xz: kernel/net/ipv4/udp_tunnel.ko.xz\n",
            ),
        ]);
        let k = Kernel::read(dir.path());
        assert_eq!(k.check("CONFIG_BRIDGE", "bridge"), Outcome::Ok("CONFIG_BRIDGE".into()));
        assert_eq!(k.check("CONFIG_VXLAN", "vxlan"), Outcome::Ok("module vxlan".into()), "a module built apart");
        assert!(
            matches!(k.check("CONFIG_OVERLAY_FS", "overlay"), Outcome::Missing(m) if m.contains("modprobe overlay"))
        );
    }

    #[test]
    fn without_a_configuration_loaded_modules_count_and_the_rest_is_unknown() {
        let dir = host(&[("proc/sys/kernel/osrelease", "6.18.0\n"), ("sys/module/br_netfilter/refcnt", "1\n")]);
        let k = Kernel::read(dir.path());
        assert_eq!(k.check("CONFIG_BRIDGE_NETFILTER", "br_netfilter"), Outcome::Ok("module br_netfilter".into()));
        assert!(matches!(k.check("CONFIG_VETH", "veth"), Outcome::Unknown(m) if m.contains("/boot/config-6.18.0")));
        let items = report(&k);
        let veth = items.iter().find(|i| i.name.starts_with("kernel: veth")).unwrap();
        assert!(!veth.required, "what cannot be told is not counted as missing");
    }

    #[test]
    fn a_gzipped_configuration_is_read() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"CONFIG_OVERLAY_FS=y\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/config.gz"), gz.finish().unwrap()).unwrap();
        let k = Kernel::read(dir.path());
        assert_eq!(k.check("CONFIG_OVERLAY_FS", "overlay"), Outcome::Ok("CONFIG_OVERLAY_FS".into()));
        assert!(matches!(k.check("CONFIG_VETH", "veth"), Outcome::Missing(_)));
    }
}
