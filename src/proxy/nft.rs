//! The kernel side: reads the proxy's table (`nft list table`), works out the few commands that
//! turn it into the desired [`Ruleset`], and applies them as one `nft -f -` transaction.
//!
//! Text rather than the `nftables` crate's JSON: kube-proxy's own library (knftables) drives
//! `nft -f -` with text too, the listing compares line for line with what we write (rules are
//! kept in the form `nft list` prints), and the scripts stay readable in logs and errors.
//!
//! A plan never flushes the table: it adds new chains and sets, flushes and refills only the
//! chains whose rules differ, deletes and adds only the map elements that differ, then removes
//! what is no longer wanted. Established connections keep their NAT in conntrack throughout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Stdio;

use tokio::io::AsyncWriteExt as _;

use super::rules::{Chain, FAMILY, Ruleset, Set, TABLE};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Failed { program: String, status: std::process::ExitStatus, stderr: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where commands run: this network namespace, or a named one (`ip netns exec`, for tests and
/// benchmarks).
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub netns: Option<String>,
}

impl Host {
    /// A command for `program`, inside the namespace if there is one.
    pub fn command(&self, program: &str) -> tokio::process::Command {
        let program = crate::net::system_binary(program);
        match &self.netns {
            Some(ns) => {
                let mut c = tokio::process::Command::new(crate::net::system_binary("ip"));
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => tokio::process::Command::new(program),
        }
    }

    /// Runs `program args` with `input` on stdin; returns stdout.
    pub async fn run(&self, program: &str, args: &[&str], input: Option<&str>) -> Result<String> {
        let mut cmd = self.command(program);
        cmd.args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawn_err = |source| Error::Spawn { program: program.to_string(), source };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).await.map_err(spawn_err)?;
        }
        let out = child.wait_with_output().await.map_err(spawn_err)?;
        if !out.status.success() {
            return Err(Error::Failed {
                program: program.to_string(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Reads the proxy's table; an empty ruleset when there is none.
    pub async fn read(&self) -> Result<Ruleset> {
        match self.run("nft", &["list", "table", FAMILY, TABLE], None).await {
            Ok(text) => Ok(parse(&text)),
            Err(Error::Failed { stderr, .. }) if stderr.contains("No such file or directory") => Ok(Ruleset::default()),
            Err(e) => Err(e),
        }
    }

    /// Applies a script as one transaction.
    pub async fn apply(&self, script: &str) -> Result<()> {
        self.run("nft", &["-f", "-"], Some(script)).await.map(drop)
    }

    /// Removes the proxy's table, if there is one.
    pub async fn delete_table(&self) -> Result<()> {
        self.apply(&format!("add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")).await
    }
}

/// Parses `nft list table` output into a [`Ruleset`].
pub fn parse(text: &str) -> Ruleset {
    enum In {
        Table,
        Chain(String),
        Set(String),
        /// Element text of a set collected so far, across lines.
        Elements(String, String),
    }
    let mut rs = Ruleset::default();
    let mut at = In::Table;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        at = match at {
            In::Table => {
                let open = |kw: &str| line.strip_prefix(kw).and_then(|l| l.strip_suffix(" {")).map(str::to_string);
                if let Some(name) = open("chain ") {
                    rs.chains.insert(name.clone(), Chain::default());
                    In::Chain(name)
                } else if let Some((name, map)) =
                    open("set ").map(|n| (n, false)).or_else(|| open("map ").map(|n| (n, true)))
                {
                    rs.sets.insert(name.clone(), Set { map, decl: vec![], elements: Some(BTreeMap::new()) });
                    In::Set(name)
                } else {
                    In::Table
                }
            }
            In::Chain(name) => {
                if line == "}" {
                    In::Table
                } else {
                    if let Some(c) = rs.chains.get_mut(&name) {
                        if c.base.is_none()
                            && c.rules.is_empty()
                            && line.starts_with("type ")
                            && line.contains(" hook ")
                        {
                            c.base = Some(line.to_string());
                        } else {
                            c.rules.push(line.to_string());
                        }
                    }
                    In::Chain(name)
                }
            }
            In::Set(name) => {
                if line == "}" {
                    In::Table
                } else if let Some(rest) = line.strip_prefix("elements = {") {
                    collect(&mut rs, name, String::new(), rest)
                } else {
                    if let Some(s) = rs.sets.get_mut(&name) {
                        s.decl.push(line.to_string());
                    }
                    In::Set(name)
                }
            }
            In::Elements(name, acc) => collect(&mut rs, name, acc, line),
        };
    }
    return rs;

    /// Adds `line` to the element text; at the closing brace, stores the elements.
    fn collect(rs: &mut Ruleset, name: String, mut acc: String, line: &str) -> In {
        acc.push(' ');
        acc.push_str(line);
        let Some(body) = acc.trim_end().strip_suffix('}') else {
            return In::Elements(name, acc);
        };
        if let Some(e) = rs.sets.get_mut(&name).and_then(|s| s.elements.as_mut()) {
            for el in body.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let (k, v) = el.split_once(" : ").unwrap_or((el, ""));
                e.insert(k.to_string(), v.to_string());
            }
        }
        In::Set(name)
    }
}

/// What a plan does, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub chains_written: usize,
    pub chains_deleted: usize,
    pub sets_added: usize,
    pub sets_deleted: usize,
    pub elements_changed: usize,
}

impl Counts {
    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }
}

/// A transaction turning `current` into `desired`, or `None` when they are equal already.
/// A set whose declaration differs (someone else changed it) cannot be altered in place: the plan
/// is then a rebuild of the whole table (see [`full_script`]).
pub fn plan(current: &Ruleset, desired: &Ruleset) -> Option<(String, Counts)> {
    let t = format!("{FAMILY} {TABLE}");
    let mut n = Counts::default();
    let mut s = format!("add table {t}\n");
    for (name, set) in &desired.sets {
        match current.sets.get(name) {
            None => {
                n.sets_added += 1;
                let _ = writeln!(s, "add {} {t} {name} {{ {}; }}", kind(set), set.decl.join("; "));
            }
            Some(c) if c.decl != set.decl || c.map != set.map => {
                return Some((full_script(desired), Counts::all(desired)));
            }
            Some(_) => {}
        }
    }
    // Every new chain first, so that rules may jump to any of them.
    let mut rules = String::new();
    for (name, chain) in &desired.chains {
        match current.chains.get(name) {
            Some(c) if c == chain => continue,
            Some(c) if c.base != chain.base => {
                let _ = writeln!(rules, "flush chain {t} {name}\ndelete chain {t} {name}");
                add_chain(&mut rules, &t, name, chain);
            }
            Some(_) => {
                let _ = writeln!(rules, "flush chain {t} {name}");
            }
            None => add_chain(&mut s, &t, name, chain),
        }
        n.chains_written += 1;
        for r in &chain.rules {
            let _ = writeln!(rules, "add rule {t} {name} {r}");
        }
    }
    s.push_str(&rules);
    let empty = BTreeMap::new();
    for (name, set) in &desired.sets {
        let Some(want) = &set.elements else { continue };
        let have = current.sets.get(name).and_then(|s| s.elements.as_ref()).unwrap_or(&empty);
        let gone: Vec<&str> = have.iter().filter(|(k, v)| want.get(*k) != Some(v)).map(|(k, _)| k.as_str()).collect();
        let new: Vec<String> =
            want.iter().filter(|(k, v)| have.get(*k) != Some(v)).map(|(k, v)| element(k, v)).collect();
        n.elements_changed += gone.len() + new.len();
        if !gone.is_empty() {
            let _ = writeln!(s, "delete element {t} {name} {{ {} }}", gone.join(", "));
        }
        if !new.is_empty() {
            let _ = writeln!(s, "add element {t} {name} {{ {} }}", new.join(", "));
        }
    }
    // Removals last, once nothing refers to them: every stale chain emptied first, then deleted.
    let stale: Vec<&String> = current.chains.keys().filter(|c| !desired.chains.contains_key(*c)).collect();
    for c in &stale {
        let _ = writeln!(s, "flush chain {t} {c}");
    }
    for c in &stale {
        let _ = writeln!(s, "delete chain {t} {c}");
    }
    n.chains_deleted = stale.len();
    for (name, set) in &current.sets {
        if !desired.sets.contains_key(name) {
            n.sets_deleted += 1;
            let _ = writeln!(s, "delete {} {t} {name}", kind(set));
        }
    }
    (!n.is_empty()).then_some((s, n))
}

impl Counts {
    fn all(rs: &Ruleset) -> Counts {
        Counts {
            chains_written: rs.chains.len(),
            sets_added: rs.sets.len(),
            elements_changed: rs.sets.values().filter_map(|s| s.elements.as_ref()).map(BTreeMap::len).sum(),
            ..Counts::default()
        }
    }
}

/// A transaction that replaces the whole table with `desired` (what a non-incremental proxy does
/// on every sync; here only for a tampered set declaration, and as the benchmark's baseline).
pub fn full_script(desired: &Ruleset) -> String {
    let t = format!("{FAMILY} {TABLE}");
    let mut s = format!("add table {t}\ndelete table {t}\n");
    let none = Ruleset::default();
    if let Some((rest, _)) = plan(&none, desired) {
        s.push_str(&rest);
    }
    s
}

fn kind(s: &Set) -> &'static str {
    if s.map { "map" } else { "set" }
}

fn element(k: &str, v: &str) -> String {
    if v.is_empty() { k.to_string() } else { format!("{k} : {v}") }
}

fn add_chain(s: &mut String, t: &str, name: &str, chain: &Chain) {
    match &chain.base {
        Some(base) => writeln!(s, "add chain {t} {name} {{ {base} }}"),
        None => writeln!(s, "add chain {t} {name}"),
    }
    .unwrap_or(());
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "table ip cairn-proxy {
\tset aff60-ns/web/tcp/http__10.42.0.1/8080 {
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 1m
\t\telements = { 10.251.0.2 timeout 1m expires 59s }
\t}

\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 10.96.0.12 . sctp . 9 : drop,
\t\t\t     10.96.0.10 . tcp . 80 : goto svc-ns/web/tcp/http }
\t}

\tchain nat-prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tjump services
\t}

\tchain svc-ns/web/tcp/http {
\t\tnumgen random mod 2 vmap { 0 : goto ep-a, 1 : goto ep-b }
\t}
}
";

    #[test]
    fn parses_a_listing() {
        let rs = parse(LISTING);
        let m = &rs.sets["service-ips"];
        assert!(m.map);
        assert_eq!(m.decl, ["type ipv4_addr . inet_proto . inet_service : verdict"]);
        let e = m.elements.as_ref().unwrap();
        assert_eq!(e["10.96.0.12 . sctp . 9"], "drop");
        assert_eq!(e["10.96.0.10 . tcp . 80"], "goto svc-ns/web/tcp/http");
        assert_eq!(rs.sets["aff60-ns/web/tcp/http__10.42.0.1/8080"].decl.len(), 4);
        let c = &rs.chains["nat-prerouting"];
        assert_eq!(c.base.as_deref(), Some("type nat hook prerouting priority dstnat; policy accept;"));
        assert_eq!(c.rules, ["jump services"]);
        assert_eq!(rs.chains["svc-ns/web/tcp/http"].rules.len(), 1);
    }

    #[test]
    fn plans_only_the_difference() {
        let current = parse(LISTING);
        let mut desired = current.clone();
        // The kernel fills affinity sets: their elements are not ours to compare.
        desired.sets.get_mut("aff60-ns/web/tcp/http__10.42.0.1/8080").unwrap().elements = None;
        assert_eq!(plan(&current, &desired), None);

        let e = desired.sets.get_mut("service-ips").unwrap().elements.as_mut().unwrap();
        e.remove("10.96.0.12 . sctp . 9");
        e.insert("10.96.0.10 . tcp . 80".into(), "goto svc-x".into());
        desired.chains.insert("svc-x".into(), Chain { base: None, rules: vec!["goto ep-a".into()] });
        desired.chains.remove("svc-ns/web/tcp/http");
        let (script, n) = plan(&current, &desired).unwrap();
        assert_eq!(
            script,
            "add table ip cairn-proxy
add chain ip cairn-proxy svc-x
add rule ip cairn-proxy svc-x goto ep-a
delete element ip cairn-proxy service-ips { 10.96.0.10 . tcp . 80, 10.96.0.12 . sctp . 9 }
add element ip cairn-proxy service-ips { 10.96.0.10 . tcp . 80 : goto svc-x }
flush chain ip cairn-proxy svc-ns/web/tcp/http
delete chain ip cairn-proxy svc-ns/web/tcp/http
"
        );
        assert_eq!((n.chains_written, n.chains_deleted, n.elements_changed), (1, 1, 3));
    }

    #[test]
    fn repairs_foreign_rules_and_sets() {
        let desired = parse(LISTING);
        let mut current = desired.clone();
        current.chains.get_mut("nat-prerouting").unwrap().rules.push("ip daddr 1.2.3.4 drop".into());
        current.chains.insert("intruder".into(), Chain::default());
        let (script, _) = plan(&current, &desired).unwrap();
        assert!(script.contains(
            "flush chain ip cairn-proxy nat-prerouting\nadd rule ip cairn-proxy nat-prerouting jump services\n"
        ));
        assert!(script.ends_with("flush chain ip cairn-proxy intruder\ndelete chain ip cairn-proxy intruder\n"));

        current = desired.clone();
        current.sets.get_mut("service-ips").unwrap().decl = vec!["type ipv4_addr : verdict".into()];
        let (script, _) = plan(&current, &desired).unwrap();
        assert!(script.starts_with("add table ip cairn-proxy\ndelete table ip cairn-proxy\n"), "{script}");
    }
}
