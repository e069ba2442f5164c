//! The command line: flags, the config file, restarts and the certificates cairn creates.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use common::Server;

fn cairn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cairn")).args(args).output().expect("run cairn")
}

#[test]
fn version_and_help() {
    let v = cairn(&["--version"]);
    assert!(v.status.success());
    assert_eq!(String::from_utf8_lossy(&v.stdout).trim(), format!("cairn {}", env!("CARGO_PKG_VERSION")));
    let help = String::from_utf8_lossy(&cairn(&["server", "--help"]).stdout).into_owned();
    for flag in [
        "--data-dir",
        "--bind-address",
        "--https-listen-port",
        "--write-kubeconfig",
        "--write-kubeconfig-mode",
        "--tls-san",
        "--token",
        "--token-file",
        "--disable-agent",
        "--node-name",
        "--config",
        "--containerd-bin",
        "--container-runtime-endpoint",
        "--cni-bin-dir",
        "--system-reserved",
        "--healthz-port",
    ] {
        assert!(help.contains(flag), "{flag} missing from help:\n{help}");
    }
}

#[test]
fn bad_flags_fail_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let out =
        cairn(&["server", "--disable-agent", "--data-dir", data.to_str().unwrap(), "--write-kubeconfig-mode", "999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid write-kubeconfig-mode"));
    let out =
        cairn(&["server", "--disable-agent", "--data-dir", data.to_str().unwrap(), "--cluster-cidr", "10.42.0.0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid cluster-cidr"));
    for (flag, value, hint) in [
        ("--system-reserved", "gpu=1", "only cpu, memory, ephemeral-storage and pid"),
        ("--kube-reserved", "memory=lots", "not a quantity"),
    ] {
        let out = cairn(&["server", "--disable-agent", "--data-dir", data.to_str().unwrap(), flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("invalid {flag}")) && err.contains(hint), "{err}");
    }
    // With the agent, the pod network must be IPv4 and big enough for a subnet.
    let out = cairn(&[
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--disable-agent=false",
        "--cluster-cidr",
        "10.42.0.0/31",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/30 or larger"), "{err}");
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "no-such-flag: 1\n").unwrap();
    let out = cairn(&["server", "--disable-agent", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("no-such-flag"), "{err}");
}

#[test]
fn the_agent_without_root_says_how_to_run_without_it() {
    use std::os::unix::process::CommandExt as _;
    // A copy anyone may run, started as `nobody`.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = dir.path().join("cairn");
    std::fs::copy(env!("CARGO_BIN_EXE_cairn"), &exe).unwrap();
    let data = dir.path().join("data");
    let out = Command::new(&exe)
        .args(["server", "--https-listen-port", "0", "--data-dir"])
        .arg(&data)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("needs root") && err.contains("--disable-agent"), "{err}");
}

#[test]
fn runtime_helpers_without_a_runtime_say_where_they_looked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for args in
        [&["ctr", "pods"][..], &["ctr", "ps", "-a"], &["ctr", "images"], &["images", "import", "/nonexistent.tar"]]
    {
        let out = cairn(&[args, &["--data-dir", data]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("containerd.sock") && !err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_missing_containerd_or_runc_names_the_package_to_install() {
    use std::os::unix::fs::PermissionsExt as _;
    // PATH is a folder of our own: first empty, then with containerd and its shim but no runc.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let serve = |want: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["server", "--https-listen-port", "0", "--healthz-port", "0", "--data-dir"])
            .arg(dir.path().join("data"))
            // Someone else's CNI plugins: the pod network's own iptables check is not what is tested.
            .args(["--cni-bin-dir", "/nonexistent", "--cni-conf-dir", "/nonexistent"])
            .env("PATH", &bin)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && err.contains(want) && !err.contains("panicked"), "{err}");
    };
    serve("containerd was not found in PATH: install it (Debian/Ubuntu: apt-get install containerd)");
    for name in ["containerd", "containerd-shim-runc-v2"] {
        std::fs::write(bin.join(name), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    serve(
        "runc was not found in PATH: containerd runs containers with it; install it (Debian/Ubuntu: apt-get install runc)",
    );
}

/// `cairn check-config` on this machine (CI installs what cairn needs) finds everything required;
/// with an empty PATH it names what is missing and what to install, and fails.
#[test]
fn check_config_reports_what_the_machine_lacks() {
    let out = cairn(&["check-config"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    for line in
        ["ok       containerd: ", "ok       cgroup memory controller: enabled", "kernel: veth (a link per pod): "]
    {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    assert!(
        text.contains("Required:") && text.contains("Optional:") && text.ends_with("Everything cairn needs is here.\n")
    );

    let out =
        Command::new(env!("CARGO_BIN_EXE_cairn")).arg("check-config").env("PATH", "/nonexistent").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("missing  containerd: containerd was not found in PATH: install it (Debian/Ubuntu: apt-get install containerd)"), "{text}");
    // Tools the agent finds in sbin directories do not depend on PATH.
    assert!(text.contains("ok       conntrack: /usr/sbin/conntrack") && text.contains("ok       nft: "), "{text}");
    assert!(text.ends_with("cairn cannot run its node agent here until these are fixed: containerd.\n"), "{text}");
}

/// `packaging/install.sh --check` against a package database that has nothing: it names every package
/// it would install, and installs nothing.
#[test]
fn the_setup_script_says_what_it_would_install_and_ci_uses_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let fakes = tempfile::tempdir().unwrap();
    let calls = fakes.path().join("apt-get.calls");
    for (name, script) in [
        ("dpkg-query", "#!/bin/sh\nexit 1\n".to_string()),
        ("apt-get", format!("#!/bin/sh\necho \"$@\" >> {}\n", calls.display())),
    ] {
        std::fs::write(fakes.path().join(name), script).unwrap();
        std::fs::set_permissions(fakes.path().join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!("{}:{}", fakes.path().display(), std::env::var("PATH").unwrap_or_default());
    let check = |args: &[&str]| {
        let out = Command::new(root.join("packaging/install.sh")).args(args).env("PATH", &path).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    let text = check(&["--check"]);
    assert!(text.contains("would install containerd runc iptables nftables conntrack gcc libc6-dev"), "{text}");
    assert!(!text.contains("busybox-static"), "test packages only when asked: {text}");
    assert!(text.contains("would run cargo build --release") && text.contains("would run "), "{text}");
    let text = check(&["--check", "--packages-only", "--with-test-packages"]);
    assert!(text.contains("iproute2 busybox-static containernetworking-plugins"), "{text}");
    assert!(!text.contains("cargo build"), "--packages-only stops after the packages: {text}");
    assert!(!calls.exists(), "--check ran apt-get: {:?}", std::fs::read_to_string(&calls));

    // CI installs its system packages through the same script.
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "packaging/install.sh --packages-only --with-test-packages"),
        ".ci/run does not call the set-up script:\n{ci}"
    );
}

#[test]
fn config_file_sets_flags_and_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "write-kubeconfig-mode: \"0640\"\ntls-san:\n  - cairn.test\n").unwrap();
    let s = Server::start_with(dir, &["--config", cfg.to_str().unwrap()]);
    let mode = std::fs::metadata(&s.kubeconfig).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    // The extra SAN is in the serving certificate: TLS verification by that name succeeds.
    s.ok(&["--tls-server-name", "cairn.test", "get", "ns", "default"]);
    let err = s.fails(&["--tls-server-name", "other.test", "get", "ns", "default"]);
    assert!(err.contains("x509") || err.contains("certificate"), "{err}");

    let dir = s.stop();
    let s = Server::start_with(dir, &["--config", cfg.to_str().unwrap(), "--write-kubeconfig-mode", "0600"]);
    let mode = std::fs::metadata(&s.kubeconfig).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the command line overrides the config file");
}

/// The token file holds k3s's full token, `K10<sha256 of the CA>::server:<secret>`: `/cacerts`
/// (public) hashes to its pin, the secret and the full token both authenticate, a wrong one does
/// not, and a `--token` pinning another CA is refused at start.
#[test]
fn the_join_token_pins_the_servers_ca() {
    let s = Server::start();
    let token = std::fs::read_to_string(s.dir.path().join("data/server/token")).unwrap().trim().to_string();
    let (hash, credentials) = token.strip_prefix("K10").and_then(|t| t.split_once("::")).expect(&token);
    let secret = credentials.strip_prefix("server:").expect(&token);
    assert!(hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()) && secret.len() == 48, "{token}");

    // Anyone may fetch the CA (no credentials, no trust yet), and it hashes to the token's pin.
    let fetch = format!(
        "import hashlib, ssl, sys, urllib.request\n\
         body = urllib.request.urlopen('{}/cacerts', context=ssl._create_unverified_context()).read()\n\
         sys.stdout.write(hashlib.sha256(body).hexdigest() + ' ' + body.decode())",
        s.url
    );
    let out = Command::new("python3").args(["-c", &fetch]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let (sum, body) = text.split_once(' ').unwrap_or_default();
    assert_eq!(sum, hash);
    assert_eq!(body.as_bytes(), std::fs::read(s.dir.path().join("data/server/tls/server-ca.crt")).unwrap());

    // The secret and the full token authenticate; another one does not.
    let config = s.dir.path().join("token-kubeconfig.yaml");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\", insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: node, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: node}}}}]\ncurrent-context: c\n",
        s.url
    );
    std::fs::write(&config, yaml).unwrap();
    let anonymous = |args: &[&str]| {
        Command::new(common::kubectl_path()).arg("--kubeconfig").arg(&config).args(args).output().unwrap()
    };
    for good in [secret, token.as_str()] {
        let out = anonymous(&["--token", good, "get", "ns", "default", "-o", "name"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "namespace/default");
    }
    let out = anonymous(&["--token", "not-the-token", "get", "ns"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("You must be logged in to the server (Unauthorized)"), "{err}");

    // The same token after a restart; a --token made for another CA is refused with both named.
    let dir = s.stop();
    let s = Server::start_with(dir, &["--token", secret]);
    assert_eq!(std::fs::read_to_string(s.dir.path().join("data/server/token")).unwrap().trim(), token);
    let other = format!("K10{}::server:{secret}", "0".repeat(64));
    let data = tempfile::tempdir().unwrap();
    let mut refused = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["server", "--disable-agent", "--https-listen-port", "0", "--token", &other, "--data-dir"])
        .arg(data.path().join("data"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = common::eventually(20, || refused.try_wait().ok().flatten()).success();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!exited && err.contains("the token belongs to another server"), "{err}");
}

#[test]
fn restart_reuses_ca_and_keeps_keys_private() {
    let s = Server::start();
    let tls = s.dir.path().join("data/server/tls");
    let ca = std::fs::read(tls.join("server-ca.crt")).unwrap();
    for key in ["server-ca.key", "serving.key", "client-admin.key"] {
        let mode = std::fs::metadata(tls.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
    let token = s.dir.path().join("data/server/token");
    assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);
    let old_kubeconfig = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let dir = s.stop();
    let s = Server::start_with(dir, &[]);
    assert_eq!(std::fs::read(tls.join("server-ca.crt")).unwrap(), ca, "the CA must survive a restart");
    // A kubeconfig handed out before the restart still works.
    let copy = s.dir.path().join("old.yaml");
    std::fs::write(&copy, &old_kubeconfig).unwrap();
    let url_line = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let server_line = url_line.lines().find(|l| l.trim().starts_with("server:")).unwrap().to_string();
    let patched: String = std::fs::read_to_string(&copy)
        .unwrap()
        .lines()
        .map(|l| if l.trim().starts_with("server:") { server_line.clone() } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&copy, patched).unwrap();
    let out = Command::new(common::kubectl_path())
        .args(["--kubeconfig", copy.to_str().unwrap(), "get", "ns"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn token_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(dir, &["--token", "join-secret-123"]);
    let out = Command::new(common::kubectl_path())
        .args([
            "--server",
            &s.url,
            "--insecure-skip-tls-verify",
            "--token",
            "join-secret-123",
            "get",
            "ns",
            "default",
            "-o",
            "name",
        ])
        .env("KUBECONFIG", s.dir.path().join("absent.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "namespace/default");
}
