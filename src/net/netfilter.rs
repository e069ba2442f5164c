//! iptables rules, applied with the `iptables-save` / `iptables-restore --noflush` binaries.
//!
//! Each network (`<P>` = its upper-cased name, `CAIRN`) owns these chains:
//! - nat `<P>-POSTRTG`, jumped to from POSTROUTING: masquerades packets marked by a host-port
//!   chain, and (with `ipMasq`) pod traffic leaving the cluster network.
//! - nat `<P>-HOSTPORTS`, jumped to from PREROUTING and OUTPUT for local destinations: one jump per
//!   container with host ports, to that container's `<P>-HP-<hash>` chain, which DNATs its ports
//!   and marks for masquerading the connections that need it (from the node's own pods, including
//!   the pod itself, and from 127.0.0.0/8).
//! - filter `<P>-FORWARD`, jumped to first from FORWARD: accepts traffic from and to the cluster
//!   network, so that a FORWARD policy of DROP does not cut pods off.
//! - filter `<P>-INPUT`, jumped to first from INPUT: drops packets from the bridge for 127.0.0.0/8
//!   that are not replies or DNATed; `route_localnet`, needed for `127.0.0.1:<hostPort>`, would
//!   otherwise let pods reach services bound to the node's loopback (CVE-2020-8558).
//!
//! ADD reads the rules once (`iptables-save`, in parallel with the netlink work) and only writes
//! when something is missing or when the container has host ports, in one atomic
//! `iptables-restore --noflush` transaction. Rule text is kept in the exact form `iptables-save`
//! prints, so that "present" is a string comparison.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncWriteExt;

use super::ipam::FileLock;
use super::spec::{BridgeConf, CniError, PortMapping, code};

/// The packet mark bit that asks `<P>-POSTRTG` to masquerade (the portmap plugin's default).
const MASQ_MARK: &str = "0x2000/0x2000";
const LOCAL: &str = "-m addrtype --dst-type LOCAL ";

/// One table of an `iptables-save` dump.
#[derive(Debug, Default)]
pub struct Table {
    chains: Vec<String>,
    rules: Vec<String>,
}

impl Table {
    fn has_chain(&self, chain: &str) -> bool {
        self.chains.iter().any(|c| c == chain)
    }

    /// The `-A <chain> ...` lines of a chain, in order.
    fn rules_of<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules.iter().map(String::as_str).filter(move |r| {
            r.strip_prefix("-A ").and_then(|r| r.strip_prefix(chain)).is_some_and(|r| r.starts_with(' '))
        })
    }

    /// The rules of any chain that jump to `target`.
    fn jumps_to<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules
            .iter()
            .map(String::as_str)
            .filter(move |r| r.strip_suffix(target).is_some_and(|r| r.ends_with(" -j ")))
    }

    fn has_jump(&self, from: &str, target: &str) -> bool {
        self.jumps_to(target)
            .any(|r| r.strip_prefix("-A ").and_then(|r| r.strip_prefix(from)).is_some_and(|r| r.starts_with(' ')))
    }
}

/// The tables of an `iptables-save` dump that we use.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nat: Table,
    pub filter: Table,
}

impl Snapshot {
    pub fn parse(dump: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut table = None;
        for line in dump.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = match name.trim() {
                    "nat" => Some(&mut snap.nat),
                    "filter" => Some(&mut snap.filter),
                    _ => None,
                };
            } else if let Some(t) = table.as_deref_mut() {
                if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next()) {
                    t.chains.push(chain.to_string());
                } else if line.starts_with("-A ") {
                    t.rules.push(line.trim_end().to_string());
                }
            }
        }
        snap
    }
}

/// Lines for one `iptables-restore --noflush` transaction.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub nat: Vec<String>,
    pub filter: Vec<String>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.nat.is_empty() && self.filter.is_empty()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, lines) in [("nat", &self.nat), ("filter", &self.filter)] {
            if !lines.is_empty() {
                let _ = writeln!(out, "*{name}\n{}\nCOMMIT", lines.join("\n"));
            }
        }
        out
    }
}

fn chain(c: &BridgeConf, suffix: &str) -> String {
    format!("{}-{suffix}", c.chain_prefix)
}

/// The name of a container's host-port chain; `key` is the container's hex hash.
pub fn hostport_chain(c: &BridgeConf, key: &str) -> String {
    chain(c, &format!("HP-{}", &key[..16]))
}

/// What must change so that the network's shared chains and jumps are as they should be. Owned
/// chains whose rules differ are rewritten (declaring a chain in `--noflush` mode flushes it);
/// missing jumps are inserted first in their built-in chain.
pub fn global_plan(c: &BridgeConf, snap: &Snapshot) -> Plan {
    let (postrtg, hostports, forward, input) =
        (chain(c, "POSTRTG"), chain(c, "HOSTPORTS"), chain(c, "FORWARD"), chain(c, "INPUT"));
    let cluster = c.cluster;
    let mut masq = vec![format!("-A {postrtg} -m mark --mark {MASQ_MARK} -j MASQUERADE")];
    if c.ip_masq {
        masq.push(format!("-A {postrtg} -s {cluster} ! -d {cluster} -j MASQUERADE"));
    }
    let fwd = vec![format!("-A {forward} -s {cluster} -j ACCEPT"), format!("-A {forward} -d {cluster} -j ACCEPT")];
    let inp = vec![format!(
        "-A {input} -d 127.0.0.0/8 -i {} -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        c.bridge
    )];

    let mut plan = Plan::default();
    let owned = |table: &Table, lines: &mut Vec<String>, name: &str, rules: Vec<String>| {
        if !table.has_chain(name) || !table.rules_of(name).eq(rules.iter().map(String::as_str)) {
            lines.push(format!(":{name} - [0:0]"));
            lines.extend(rules);
        }
    };
    let jump = |table: &Table, lines: &mut Vec<String>, from: &str, matches: &str, to: &str| {
        if !table.has_jump(from, to) {
            lines.push(format!("-I {from} 1 {matches}-j {to}"));
        }
    };
    owned(&snap.nat, &mut plan.nat, &postrtg, masq);
    if !snap.nat.has_chain(&hostports) {
        // Not owned like the others: it holds the containers' jumps and must never be flushed.
        plan.nat.push(format!(":{hostports} - [0:0]"));
    }
    jump(&snap.nat, &mut plan.nat, "POSTROUTING", "", &postrtg);
    jump(&snap.nat, &mut plan.nat, "PREROUTING", LOCAL, &hostports);
    jump(&snap.nat, &mut plan.nat, "OUTPUT", LOCAL, &hostports);
    owned(&snap.filter, &mut plan.filter, &forward, fwd);
    owned(&snap.filter, &mut plan.filter, &input, inp);
    jump(&snap.filter, &mut plan.filter, "FORWARD", "", &forward);
    jump(&snap.filter, &mut plan.filter, "INPUT", "", &input);
    plan
}

/// nat lines that (re)create a container's host-port chain and its jump, replacing any earlier one.
pub fn hostport_lines(
    c: &BridgeConf,
    hp_chain: &str,
    pod_ip: Ipv4Addr,
    maps: &[PortMapping],
    nat: &Table,
) -> Vec<String> {
    let mut lines = removal_lines(hp_chain, nat);
    lines.retain(|l| !l.starts_with("-X ") && !l.starts_with("-F "));
    lines.push(format!(":{hp_chain} - [0:0]"));
    for m in maps {
        let dst = if m.host_ip.is_empty() { String::new() } else { format!("-d {}/32 ", m.host_ip) };
        let port = format!("-p {0} -m {0} --dport {1}", m.protocol, m.host_port);
        // Masquerade what could not otherwise come back the way it went: connections from the
        // node's pods (the reply would bypass the host, or arrive at the pod from itself) and
        // from the node's loopback addresses.
        for src in [c.subnet.to_string(), "127.0.0.0/8".into()] {
            lines.push(format!("-A {hp_chain} -s {src} {dst}{port} -j MARK --set-xmark {MASQ_MARK}"));
        }
        lines.push(format!("-A {hp_chain} {dst}{port} -j DNAT --to-destination {pod_ip}:{}", m.container_port));
    }
    lines.push(format!("-A {} -j {hp_chain}", chain(c, "HOSTPORTS")));
    lines
}

/// nat lines that delete a container's host-port chain and every jump to it.
pub fn removal_lines(hp_chain: &str, nat: &Table) -> Vec<String> {
    let mut lines: Vec<String> = nat.jumps_to(hp_chain).map(|r| format!("-D {}", &r[3..])).collect();
    if nat.has_chain(hp_chain) {
        lines.push(format!("-F {hp_chain}"));
        lines.push(format!("-X {hp_chain}"));
    }
    lines
}

/// ADD's rule work: repairs the shared rules if `snap` (taken at the start of ADD) shows anything
/// missing, and installs the container's host ports, all in one transaction. Repairs happen under
/// `lock` with a fresh snapshot, so concurrent ADDs do not insert a jump twice.
pub async fn setup(c: &BridgeConf, lock: &Path, snap: Snapshot, hostports: Option<(&str, Ipv4Addr)>) -> Result<()> {
    let mut snap = snap;
    let mut plan = global_plan(c, &snap);
    let _lock = if plan.is_empty() {
        None
    } else {
        let l = FileLock::acquire(lock)?;
        snap = snapshot().await?;
        plan = global_plan(c, &snap);
        Some(l)
    };
    if let Some((hp_chain, pod_ip)) = hostports {
        plan.nat.extend(hostport_lines(c, hp_chain, pod_ip, &c.port_mappings, &snap.nat));
    }
    if plan.is_empty() { Ok(()) } else { restore(&plan).await }
}

/// DEL's rule work: removes a container's host-port chain and its jumps, if there are any.
pub async fn teardown_hostports(hp_chain: &str) -> Result<()> {
    let mut retried = false;
    loop {
        let snap = snapshot().await?;
        let plan = Plan { nat: removal_lines(hp_chain, &snap.nat), filter: vec![] };
        if plan.is_empty() {
            return Ok(());
        }
        match restore(&plan).await {
            // The rules may have changed between the dump and the restore: look again, once.
            Err(_) if !retried => retried = true,
            r => return r,
        }
    }
}

/// Dumps the nat and filter tables.
pub async fn snapshot() -> Result<Snapshot> {
    let out = tokio::process::Command::new(binary("iptables-save"))
        .stdin(Stdio::null())
        .output()
        .await
        .context("running iptables-save")?;
    if !out.status.success() {
        bail!("iptables-save failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(Snapshot::parse(&String::from_utf8_lossy(&out.stdout)))
}

async fn restore(plan: &Plan) -> Result<()> {
    let text = plan.render();
    let mut child = tokio::process::Command::new(binary("iptables-restore"))
        .args(["-w", "5", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running iptables-restore")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).await.context("writing to iptables-restore")?;
    }
    let out = child.wait_with_output().await.context("waiting for iptables-restore")?;
    if !out.status.success() {
        let msg = format!("iptables-restore failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        // Exit status 4 is a resource problem, such as the xtables lock not coming free in time.
        let code = if out.status.code() == Some(4) { code::TRY_AGAIN } else { code::FAILED };
        return Err(CniError::new(code, msg, format!("input:\n{text}")).into());
    }
    Ok(())
}

/// System tools (iptables, nft, ip) may live in an sbin directory that a service's PATH lacks.
pub fn binary(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Where a system tool is, in an sbin directory or in PATH; `None` when it is in neither.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    Some(binary(name)).filter(|p| p.is_absolute()).or_else(|| crate::runtime::containerd::which(name))
}

/// Removes every chain of a network and the jumps to them (tests clean up with it).
#[cfg(test)]
pub async fn teardown_network(prefix: &str) -> Result<()> {
    let snap = snapshot().await?;
    let ours = |t: &Table| {
        let chains: Vec<&String> = t.chains.iter().filter(|c| c.starts_with(&format!("{prefix}-"))).collect();
        let mut lines: Vec<String> =
            chains.iter().flat_map(|c| t.jumps_to(c)).map(|r| format!("-D {}", &r[3..])).collect();
        lines.sort();
        lines.dedup();
        lines.extend(chains.iter().map(|c| format!("-F {c}")));
        lines.extend(chains.iter().map(|c| format!("-X {c}")));
        lines
    };
    let plan = Plan { nat: ours(&snap.nat), filter: ours(&snap.filter) };
    if plan.is_empty() { Ok(()) } else { restore(&plan).await }
}
