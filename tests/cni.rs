//! Runs the built binary the way containerd does: exec with CNI_* variables and the config on
//! stdin. Tests that touch the network need root and skip, saying so, otherwise. They use
//! bridges `cntest<N>` (N = 5..7), subnets `10.199.<N>.0/24`, namespaces `cntest<N>-*` and chains
//! `CNTEST<N>-*`, and remove them.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping {test}: needs root (CAP_NET_ADMIN, iptables)");
    }
    root
}

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().unwrap()
}

/// Runs the plugin; returns its exit code, stdout (parsed, or Null when empty) and the wall time.
fn plugin(vars: &[(&str, &str)], stdin: &[u8]) -> (i32, Value, Duration) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .env_remove("CNI_COMMAND")
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let took = start.elapsed();
    assert!(out.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let value = if stdout.trim().is_empty() { Value::Null } else { serde_json::from_str(&stdout).unwrap() };
    (out.status.code().unwrap(), value, took)
}

fn cni(cmd: &str, id: &str, netns: &str, conf: &[u8]) -> (i32, Value, Duration) {
    plugin(
        &[
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p"),
        ],
        conf,
    )
}

struct Ns(String);

impl Ns {
    fn new(name: &str) -> Ns {
        let _ = sh(&["ip", "netns", "del", name]);
        assert!(sh(&["ip", "netns", "add", name]).status.success());
        Ns(name.into())
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.0]);
    }
}

/// Bridge `cntest<n>` with its chains and a temporary state dir, all removed on drop.
struct Net {
    n: u8,
    state: tempfile::TempDir,
}

impl Net {
    fn new(n: u8) -> Net {
        let net = Net { n, state: tempfile::tempdir().unwrap() };
        net.cleanup();
        net
    }

    fn conf(&self, ports: Value) -> Vec<u8> {
        json!({
            "cniVersion": "1.0.0", "name": format!("cntest{}", self.n), "type": "cairn-cni",
            "bridge": format!("cntest{}", self.n), "subnet": format!("10.199.{}.0/24", self.n),
            "clusterCIDR": "10.199.0.0/16", "mtu": 1500, "hairpinMode": true, "ipMasq": true,
            "stateDir": self.state.path(), "runtimeConfig": { "portMappings": ports },
        })
        .to_string()
        .into_bytes()
    }

    fn ip_files(&self) -> usize {
        let dir = self.state.path().join(format!("ipam/cntest{}", self.n));
        std::fs::read_dir(dir).map_or(0, |d| {
            d.filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().parse::<Ipv4Addr>().is_ok()).count()
        })
    }

    fn bridge_ports(&self) -> usize {
        String::from_utf8_lossy(&sh(&["ip", "-o", "link", "show", "master", &format!("cntest{}", self.n)]).stdout)
            .lines()
            .count()
    }

    /// Deletes the bridge and every `CNTEST<n>-` chain and jump to it.
    fn cleanup(&self) {
        let _ = sh(&["ip", "link", "del", &format!("cntest{}", self.n)]);
        let prefix = format!("CNTEST{}-", self.n);
        let dump = String::from_utf8(sh(&["iptables-save"]).stdout).unwrap();
        let mut restore = String::new();
        for table in dump.split("\n*").skip(1) {
            let name = table.lines().next().unwrap().trim_start_matches('*');
            let chains: Vec<&str> = table
                .lines()
                .filter_map(|l| l.strip_prefix(':')?.split(' ').next())
                .filter(|c| c.starts_with(&prefix))
                .collect();
            if chains.is_empty() {
                continue;
            }
            restore.push_str(&format!("*{name}\n"));
            for rule in table.lines().filter(|l| l.starts_with("-A ")) {
                let chain = rule.split(' ').nth(1).unwrap();
                if !chain.starts_with(&prefix) && chains.iter().any(|c| rule.ends_with(&format!("-j {c}"))) {
                    restore.push_str(&format!("-D {}\n", &rule[3..]));
                }
            }
            chains.iter().for_each(|c| restore.push_str(&format!("-F {c}\n")));
            chains.iter().for_each(|c| restore.push_str(&format!("-X {c}\n")));
            restore.push_str("COMMIT\n");
        }
        if !restore.is_empty() {
            let mut child =
                Command::new("iptables-restore").args(["-w", "--noflush"]).stdin(Stdio::piped()).spawn().unwrap();
            child.stdin.take().unwrap().write_all(restore.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success(), "cleanup failed:\n{restore}");
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.cleanup();
    }
}

#[test]
fn version_and_errors() {
    let (code, v, _) = plugin(&[("CNI_COMMAND", "VERSION")], b"");
    assert_eq!(code, 0);
    assert_eq!(v, json!({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}));

    let state = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "0.4.0", "name": "cntest0", "type": "cairn-cni", "subnet": "10.199.0.0/24",
                      "stateDir": state.path().join("s")})
    .to_string();
    let cases: Vec<(&str, &str, &[u8], u64)> = vec![
        ("ADD", "ctr", b"this is not json", 6),
        ("ADD", "ctr", b"", 6),
        ("ADD", "", conf.as_bytes(), 4),
        ("FROB", "ctr", conf.as_bytes(), 4),
        ("ADD", "ctr", br#"{"cniVersion":"0.2.0","name":"x","type":"cairn-cni"}"#, 1),
        ("ADD", "ctr", br#"{"cniVersion":"1.0.0","name":"x","type":"cairn-cni","subnet":"10.0.0.0/40"}"#, 7),
    ];
    for (cmd, id, stdin, want) in cases {
        let (code, v, _) = cni(cmd, id, "/var/run/netns/cntest0-none", stdin);
        assert_eq!(code, 1, "{cmd} {stdin:?}");
        assert_eq!(v["code"], want, "{cmd} {stdin:?}: {v}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["cniVersion"].is_string() && v.get("details").is_some(), "{v}");
    }
    // Errors are written in the config's version; nothing was created.
    let (_, v, _) = cni("ADD", "", "/x", conf.as_bytes());
    assert_eq!(v["cniVersion"], "0.4.0");
    assert!(!Path::new(&state.path().join("s")).exists());
}

#[test]
fn loopback() {
    if !is_root("loopback") {
        return;
    }
    let ns = Ns::new("cntest5-lo");
    let conf = br#"{"cniVersion":"1.0.0","name":"cni-loopback","type":"loopback"}"#;
    let (code, v, _) = plugin(
        &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c"), ("CNI_NETNS", &ns.path()), ("CNI_IFNAME", "lo")],
        conf,
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["interfaces"][0]["name"], "lo");
    let ips: Vec<&str> = v["ips"].as_array().unwrap().iter().map(|i| i["address"].as_str().unwrap()).collect();
    assert!(ips.contains(&"127.0.0.1/8"), "{v}");
    let (code, v, _) =
        plugin(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_NETNS", ""), ("CNI_IFNAME", "lo")], conf);
    assert_eq!((code, v), (0, Value::Null));
}

#[test]
fn concurrent_adds_get_distinct_addresses() {
    if !is_root("concurrent_adds_get_distinct_addresses") {
        return;
    }
    let net = Arc::new(Net::new(6));
    let namespaces: Vec<Ns> = (0..10).map(|i| Ns::new(&format!("cntest6-{i}"))).collect();
    let barrier = Arc::new(Barrier::new(namespaces.len()));
    let run_all = |cmd: &'static str| -> Vec<(i32, Value)> {
        let threads: Vec<_> = namespaces
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let (net, barrier, path) = (net.clone(), barrier.clone(), ns.path());
                std::thread::spawn(move || {
                    barrier.wait();
                    // Half of them with a host port: concurrent iptables-restore transactions.
                    let ports =
                        if i % 2 == 0 { json!([{"hostPort": 31600 + i, "containerPort": 80}]) } else { json!([]) };
                    let (code, v, _) = cni(cmd, &format!("ctr-{i}"), &path, &net.conf(ports));
                    (code, v)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };
    let added = run_all("ADD");
    let mut ips: Vec<String> = added
        .iter()
        .map(|(code, v)| {
            assert_eq!(*code, 0, "{v}");
            v["ips"][0]["address"].as_str().unwrap().to_string()
        })
        .collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 10, "{ips:?}");
    assert_eq!(net.ip_files(), 10);
    assert_eq!(net.bridge_ports(), 10);
    let nat = String::from_utf8(sh(&["iptables-save", "-t", "nat"]).stdout).unwrap();
    assert_eq!(nat.lines().filter(|l| l.starts_with("-A CNTEST6-HOSTPORTS -j CNTEST6-HP-")).count(), 5, "{nat}");
    assert_eq!(nat.lines().filter(|l| l.starts_with("-A POSTROUTING -j CNTEST6-POSTRTG")).count(), 1, "{nat}");
    for (code, v) in run_all("DEL") {
        assert_eq!((code, v), (0, Value::Null));
    }
    assert_eq!(net.ip_files(), 0);
    assert_eq!(net.bridge_ports(), 0);
    let nat = String::from_utf8(sh(&["iptables-save", "-t", "nat"]).stdout).unwrap();
    assert!(!nat.contains("CNTEST6-HP-"), "{nat}");
}
