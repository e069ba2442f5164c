//! End to end: `packaging/install.sh` into a throwaway root, run twice, then the uninstall script,
//! which (through `cairn-killall.sh`) also removes what a node leaves in its network namespace:
//! the pod bridge and the pods' veths, the iptables chains, the proxy's nftables table, the routes
//! to other nodes' pods and the cluster DNS address. The network part runs in a namespace the test
//! makes, so nothing of the machine's is touched.
//!
//! Needs root, iproute2, iptables, nftables and util-linux's nsenter (`.ci/run` installs them).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn project(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn install(root: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(project("packaging/install.sh"));
    // Only what the test gives: the environment file takes every CAIRN_* variable.
    cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
    cmd.args(["--root".as_ref(), root.as_os_str(), "--binary".as_ref(), env!("CARGO_BIN_EXE_cairn").as_ref()]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    sh(&mut cmd)
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_server_install_is_its_service_binary_and_scripts() {
    let root = tempfile::tempdir().unwrap();
    let out = install(root.path(), &[("CAIRN_NODE_NAME", "edge-1")]);
    assert!(out.contains("installed cairn into"), "{out}");
    let listed = files(root.path());
    assert_eq!(
        listed,
        [
            "etc/default/cairn",
            "etc/systemd/system/cairn.service",
            "usr/local/bin/cairn",
            "usr/local/bin/cairn-killall.sh",
            "usr/local/bin/cairn-uninstall.sh",
        ]
    );
    let unit = std::fs::read_to_string(root.path().join("etc/systemd/system/cairn.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/cairn server") && unit.contains("EnvironmentFile=-/etc/default/cairn")
    );
    let env = std::fs::read_to_string(root.path().join("etc/default/cairn")).unwrap();
    assert_eq!(env, "CAIRN_NODE_NAME=edge-1\n");
    // The installed binary is the one given, and runs.
    let version = sh(Command::new(root.path().join("usr/local/bin/cairn")).arg("--version"));
    assert!(version.starts_with("cairn "), "{version}");
    // CAIRN_ROOT is what the installed script defaults to anyway; given, a mistake there cannot
    // reach the machine's own files.
    sh(Command::new(root.path().join("usr/local/bin/cairn-uninstall.sh")).env("CAIRN_ROOT", root.path()));
    assert_eq!(files(root.path()), Vec::<String>::new());
}

#[test]
fn an_agent_install_runs_twice_and_uninstalls_without_a_trace() {
    let root = tempfile::tempdir().unwrap();
    let token = format!("K10{}::server:secret", "a".repeat(64));
    let env = [("CAIRN_URL", "https://192.0.2.1:6443"), ("CAIRN_TOKEN", token.as_str())];
    // A joining node needs the token.
    let out = Command::new(project("packaging/install.sh"))
        .args(["--root".as_ref(), root.path().as_os_str()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CAIRN_URL", "https://192.0.2.1:6443")
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("give the server's token too"));
    install(root.path(), &env);
    let first = files(root.path());
    install(root.path(), &env);
    assert_eq!(files(root.path()), first, "a second run changes nothing");
    assert_eq!(
        first,
        [
            "etc/default/cairn",
            "etc/systemd/system/cairn-agent.service",
            "usr/local/bin/cairn",
            "usr/local/bin/cairn-agent-uninstall.sh",
            "usr/local/bin/cairn-killall.sh",
        ]
    );
    let unit = std::fs::read_to_string(root.path().join("etc/systemd/system/cairn-agent.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/cairn agent"), "{unit}");
    let env_file = root.path().join("etc/default/cairn");
    assert_eq!(mode(&env_file), 0o600, "the token is root's only");
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap(),
        format!("CAIRN_TOKEN={token}\nCAIRN_URL=https://192.0.2.1:6443\n")
    );

    // What a node leaves in its network namespace, made in one of the test's own.
    let ns = format!("cji-{}", std::process::id());
    sh(Command::new("ip").args(["netns", "add", &ns]));
    let in_ns = |args: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns]).args(args);
        sh(&mut cmd)
    };
    in_ns(&["ip", "link", "set", "lo", "up"]);
    in_ns(&["ip", "link", "add", "cni0", "type", "bridge"]);
    in_ns(&["ip", "link", "add", "vethpod1", "type", "veth", "peer", "name", "vethpod1p"]);
    in_ns(&["ip", "link", "set", "vethpod1", "master", "cni0"]);
    in_ns(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]);
    in_ns(&["ip", "addr", "add", "10.202.0.2/24", "dev", "eth0"]);
    in_ns(&["ip", "link", "set", "eth0", "up"]);
    in_ns(&["ip", "route", "add", "10.59.1.0/24", "via", "10.202.0.3", "proto", "202"]);
    in_ns(&["ip", "link", "add", "cairn.1", "type", "vxlan", "id", "1", "dstport", "8472", "dev", "eth0"]);
    in_ns(&["ip", "addr", "add", "10.43.0.10/32", "dev", "lo"]);
    in_ns(&["iptables", "-t", "nat", "-N", "CAIRN-POSTRTG"]);
    in_ns(&["iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "CAIRN-POSTRTG"]);
    in_ns(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "CAIRN-POSTRTG",
        "-s",
        "10.59.0.0/16",
        "!",
        "-d",
        "10.59.0.0/16",
        "-j",
        "MASQUERADE",
    ]);
    in_ns(&["nft", "add", "table", "ip", "cairn-proxy"]);

    // The uninstall script, run in that namespace (nsenter: only the network is switched).
    let out = sh(Command::new("nsenter")
        .arg(format!("--net=/run/netns/{ns}"))
        .arg(root.path().join("usr/local/bin/cairn-agent-uninstall.sh"))
        .env("CAIRN_ROOT", root.path()));
    let links = in_ns(&["ip", "-o", "link"]);
    let routes = in_ns(&["ip", "route", "show", "proto", "202"]);
    let lo = in_ns(&["ip", "-o", "addr", "show", "dev", "lo"]);
    let chains = in_ns(&["iptables-save", "-t", "nat"]);
    let tables = in_ns(&["nft", "list", "tables"]);
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    assert_eq!(files(root.path()), Vec::<String>::new(), "{out}");
    assert!(!links.contains("cni0") && !links.contains("vethpod1") && !links.contains("cairn.1"), "{links}");
    assert!(links.contains("eth0"), "only cairn's links go: {links}");
    assert_eq!(routes.trim(), "", "{routes}");
    assert!(!lo.contains("10.43.0.10"), "{lo}");
    assert!(!chains.contains("CAIRN-"), "{chains}");
    assert!(!tables.contains("cairn-proxy"), "{tables}");
}

/// The release tarball carries the binary, the installer, the scripts, the units and air-gap
/// images; its installer installs its own binary and puts the images where cairn imports them.
#[test]
fn a_release_tarball_installs_itself_with_its_air_gap_images() {
    let work = tempfile::tempdir().unwrap();
    // The debug build without its debug information, so that packing it takes seconds.
    let binary = work.path().join("cairn");
    sh(Command::new("strip").args(["--strip-debug", "-o"]).arg(&binary).arg(env!("CARGO_BIN_EXE_cairn")));
    let images = work.path().join("images");
    std::fs::create_dir(&images).unwrap();
    std::fs::write(images.join("app.tar"), b"an image tarball").unwrap();
    let out = work.path().join("dist");
    sh(Command::new(project("packaging/release.sh"))
        .arg("--binary")
        .arg(&binary)
        .arg("--images")
        .arg(&images)
        .arg("--out")
        .arg(&out));
    let tarball = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).next().expect("a tarball");
    let name = tarball.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("cairn-{}-linux-", env!("CARGO_PKG_VERSION"))) && name.ends_with(".tar.gz"),
        "{name}"
    );
    let unpacked = work.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    sh(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(&unpacked));
    let top = std::fs::read_dir(&unpacked).unwrap().flatten().next().unwrap().path();
    let mut listed = files(&top);
    listed.retain(|f| !f.ends_with(".md"));
    assert_eq!(
        listed,
        [
            "bin/cairn",
            "images/app.tar",
            "packaging/cairn-killall.sh",
            "packaging/cairn-uninstall.sh",
            "packaging/install.sh",
            "systemd/cairn-agent.service",
            "systemd/cairn.service",
        ]
    );
    let root = work.path().join("root");
    let out = sh(Command::new(top.join("packaging/install.sh"))
        .arg("--root")
        .arg(&root)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default()));
    assert!(out.contains("installed cairn into"), "{out}");
    assert_eq!(std::fs::read(root.join("usr/local/bin/cairn")).unwrap(), std::fs::read(&binary).unwrap());
    assert_eq!(std::fs::read(root.join("var/lib/cairn/agent/images/app.tar")).unwrap(), b"an image tarball");
}
