//! The embedded containerd: cairn writes its configuration, starts it as a child process with its own
//! root, state and socket under the data directory, forwards its log to a file, restarts it with
//! backoff when it dies, and stops it on shutdown. Containers survive all of that: their shims are
//! separate processes, as with k3s.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::cri::Cri;

/// The built-in configuration template.
const TEMPLATE: &str = include_str!("../../embedded/containerd-config.toml");
/// How long containerd may take to answer after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long containerd gets to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The log is moved aside to `containerd.log.1` when it grows past this at a (re)start.
const LOG_ROTATE_BYTES: u64 = 10 << 20;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A containerd that ran this long before dying restarts without delay.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Where the embedded containerd keeps its files, all under `<data-dir>/agent/containerd`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    /// The layout of the data directory `data_dir`.
    pub fn new(data_dir: &Path) -> Layout {
        Layout { dir: data_dir.join("agent").join("containerd") }
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    /// A user's own template, used instead of the built-in one when present.
    pub fn template(&self) -> PathBuf {
        self.dir.join("config.toml.tmpl")
    }
    /// Registry hosts configuration (`certs.d/<registry>/hosts.toml`: mirrors, CAs, credentials).
    pub fn registries(&self) -> PathBuf {
        self.dir.join("certs.d")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// containerd's state (task bundles, FIFOs): on tmpfs under `/run` when cairn runs as root, so
    /// container starts do not wear the flash, in a folder named after the data directory so that
    /// several cairns never share one; under the data directory otherwise.
    pub fn state(&self) -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && Path::new("/run").is_dir() {
            use sha2::Digest as _;
            let hash = sha2::Sha256::digest(self.dir.as_os_str().as_encoded_bytes());
            let id: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return PathBuf::from("/run/cairn/containerd").join(id);
        }
        self.dir.join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("containerd.pid")
    }
}

/// What the configuration needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    pub layout: Layout,
    /// `--containerd-bin`; otherwise `containerd` is looked up in PATH.
    pub bin: Option<PathBuf>,
    pub sandbox_image: String,
    pub cni_bin_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    /// Runtime handlers beside runc, each a runc-compatible binary (NVIDIA's container runtime).
    pub runtimes: Vec<(String, PathBuf)>,
}

/// The configuration of runtime handlers beside runc (the `{{runtimes}}` placeholder): each runs
/// through the runc shim with its own binary, as k3s configures NVIDIA's runtimes.
fn runtimes(runtimes: &[(String, PathBuf)], systemd_cgroup: bool) -> String {
    let cri = r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes"#;
    runtimes
        .iter()
        .map(|(name, binary)| {
            format!(
                "{cri}.{name:?}]\n  runtime_type = \"io.containerd.runc.v2\"\n\n{cri}.{name:?}.options]\n  BinaryName = {:?}\n  SystemdCgroup = {systemd_cgroup}\n\n",
                binary.display().to_string()
            )
        })
        .collect()
}

/// The cgroup driver containerd and the agent agree on: systemd where systemd runs the unified (v2)
/// hierarchy, cgroupfs otherwise (as k3s decides).
pub fn systemd_cgroup_driver() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists() && Path::new("/run/systemd/system").is_dir()
}

/// Whether this process holds CAP_SYS_RESOURCE; without it containerd must not lower sandboxes'
/// `oom_score_adj`, or runc fails every sandbox.
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Looks `name` up in PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Finds containerd and the programs it runs containers with, or names the package to install.
pub fn find_binaries(bin: Option<&Path>) -> Result<PathBuf> {
    const OR: &str = "or use a running CRI runtime with --container-runtime-endpoint \
                      unix:///run/containerd/containerd.sock";
    let containerd = match bin {
        Some(path) if path.is_file() => path.to_path_buf(),
        Some(path) => bail!(
            "--containerd-bin {}: no such file; install containerd and runc (Debian/Ubuntu: apt-get install \
             containerd runc) and give containerd's path, {OR}",
            path.display()
        ),
        None => which("containerd").with_context(|| {
            format!(
                "containerd was not found in PATH: install it (Debian/Ubuntu: apt-get install containerd), point \
                 cairn at one with --containerd-bin, {OR}"
            )
        })?,
    };
    // The shim lives beside containerd or in PATH; runc must be in PATH.
    let beside = containerd.parent().map(|d| d.join("containerd-shim-runc-v2"));
    if !beside.is_some_and(|p| p.is_file()) && which("containerd-shim-runc-v2").is_none() {
        bail!(
            "containerd-shim-runc-v2 was not found beside {} or in PATH: it comes with containerd (Debian/Ubuntu: \
             apt-get install containerd), {OR}",
            containerd.display()
        );
    }
    if which("runc").is_none() {
        bail!(
            "runc was not found in PATH: containerd runs containers with it; install it (Debian/Ubuntu: apt-get install runc), {OR}"
        );
    }
    Ok(containerd)
}

/// Fills `{{name}}` placeholders; an unknown placeholder is an error naming it.
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").context("a `{{` without its `}}`")?;
        let name = after[..end].trim();
        let value = vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
            .with_context(|| format!("unknown placeholder {{{{{name}}}}}"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Writes containerd's configuration from the user's template or the built-in one; the file is only
/// rewritten when its contents change.
pub fn write_config(settings: &Settings) -> Result<PathBuf> {
    let layout = &settings.layout;
    for dir in [layout.dir.clone(), layout.registries(), layout.root(), layout.state()] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let path_str = |p: PathBuf| p.display().to_string();
    let vars = [
        ("root", path_str(layout.root())),
        ("state", path_str(layout.state())),
        ("address", path_str(layout.socket())),
        ("registry_dir", path_str(layout.registries())),
        ("sandbox_image", settings.sandbox_image.clone()),
        ("restrict_oom_score_adj", (!has_cap_sys_resource()).to_string()),
        ("systemd_cgroup", systemd_cgroup_driver().to_string()),
        ("cni_bin_dir", path_str(settings.cni_bin_dir.clone())),
        ("cni_conf_dir", path_str(settings.cni_conf_dir.clone())),
        ("runtimes", runtimes(&settings.runtimes, systemd_cgroup_driver())),
    ];
    let template_path = layout.template();
    let (template, origin) = match std::fs::read_to_string(&template_path) {
        Ok(t) => (t, template_path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (TEMPLATE.to_string(), "the built-in template".into()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", template_path.display())),
    };
    let config = render(&template, &vars).with_context(|| format!("rendering {origin}"))?;
    let path = layout.config();
    if std::fs::read_to_string(&path).ok().as_deref() != Some(config.as_str()) {
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, &config).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming {} into place", path.display()))?;
        tracing::info!("wrote the containerd configuration {} from {origin}", path.display());
    }
    Ok(path)
}

/// A supervised containerd.
pub struct Supervisor {
    /// Resolves once containerd has been stopped after shutdown.
    pub done: tokio::task::JoinHandle<()>,
}

/// Writes the configuration, starts containerd and waits until it answers CRI calls, then keeps it
/// running until `shutdown`.
pub async fn start(settings: &Settings, shutdown: CancellationToken) -> Result<Supervisor> {
    let bin = find_binaries(settings.bin.as_deref())?;
    let config = write_config(settings)?;
    let layout = settings.layout.clone();
    stop_leftover(&layout).await;

    let mut child = spawn(&bin, &config, &layout)?;
    let cri = Cri::new(&layout.socket());
    let started = Instant::now();
    let mut last_note = Instant::now();
    loop {
        if cri.version(Default::default()).await.is_ok() {
            break;
        }
        if let Some(status) = child.try_wait().context("checking on containerd")? {
            bail!(
                "containerd exited at start ({status}); its log {} ends with:\n{}",
                layout.log().display(),
                log_tail(&layout)
            );
        }
        if shutdown.is_cancelled() {
            stop(&mut child).await;
            bail!("shut down while containerd was starting");
        }
        if started.elapsed() > START_TIMEOUT {
            let _ = child.start_kill();
            bail!(
                "containerd did not answer on {} within {START_TIMEOUT:?}; see {}",
                layout.socket().display(),
                layout.log().display()
            );
        }
        if last_note.elapsed() >= Duration::from_secs(5) {
            tracing::info!(
                "waiting for containerd to answer on {} ({}s)",
                layout.socket().display(),
                started.elapsed().as_secs()
            );
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!(
        "containerd is running (pid {}) after {:.1?}; log in {}",
        child.id().unwrap_or(0),
        started.elapsed(),
        layout.log().display()
    );
    let done = tokio::spawn(supervise(child, bin, config, layout, shutdown));
    Ok(Supervisor { done })
}

fn spawn(bin: &Path, config: &Path, layout: &Layout) -> Result<Child> {
    let log_path = layout.log();
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let _ = std::fs::rename(&log_path, log_path.with_extension("log.1"));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let log2 = log.try_clone().context("duplicating the containerd log handle")?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(config)
        // containerd must not answer systemd on cairn's behalf.
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a Ctrl-C meant for cairn must not reach containerd directly.
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    if let Some(pid) = child.id() {
        std::fs::write(layout.pid_file(), pid.to_string())
            .with_context(|| format!("writing {}", layout.pid_file().display()))?;
    }
    Ok(child)
}

/// Keeps containerd running: restarts it with backoff when it dies, stops it on shutdown.
async fn supervise(mut child: Child, bin: PathBuf, config: PathBuf, layout: Layout, shutdown: CancellationToken) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let since = Instant::now();
        let status = tokio::select! {
            status = child.wait() => status,
            _ = shutdown.cancelled() => {
                stop(&mut child).await;
                let _ = std::fs::remove_file(layout.pid_file());
                return;
            }
        };
        let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
        if since.elapsed() > HEALTHY_RUN {
            backoff = Duration::from_secs(1);
        }
        tracing::error!(
            "containerd exited ({status}); restarting it in {backoff:?}; its log {} ends with:\n{}",
            layout.log().display(),
            log_tail(&layout)
        );
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match spawn(&bin, &config, &layout) {
                Ok(c) => {
                    tracing::info!("containerd restarted (pid {})", c.id().unwrap_or(0));
                    child = c;
                    break;
                }
                Err(e) => tracing::error!("restarting containerd failed: {e:#}; next try in {backoff:?}"),
            }
        }
    }
}

/// SIGTERM, then SIGKILL after `STOP_TIMEOUT`. Shims and containers keep running.
async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        signal(pid, libc::SIGTERM);
        if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_ok() {
            tracing::info!("containerd stopped; pod containers keep running");
            return;
        }
        tracing::warn!("containerd did not stop within {STOP_TIMEOUT:?} of SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

/// Stops a containerd a previous cairn started and could not stop (it was killed itself), so the new
/// one can take the socket and the state. Only a process running our config file is touched.
async fn stop_leftover(layout: &Layout) {
    let Some(pid) = std::fs::read_to_string(layout.pid_file()).ok().and_then(|s| s.trim().parse::<u32>().ok()) else {
        return;
    };
    let ours = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(&*layout.config().to_string_lossy()))
    };
    if !ours(pid) {
        return;
    }
    tracing::info!("stopping containerd (pid {pid}) left running by an earlier cairn; containers keep running");
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while ours(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if ours(pid) {
        signal(pid, libc::SIGKILL);
        while ours(pid) && Instant::now() < deadline + Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The last lines of containerd's log, for error messages.
fn log_tail(layout: &Layout) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut text = Vec::new();
    if let Ok(mut file) = std::fs::File::open(layout.log()) {
        let len = file.metadata().map_or(0, |m| m.len());
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(2048))).and_then(|_| file.read_to_end(&mut text));
    }
    let tail = String::from_utf8_lossy(&text);
    tail.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_and_unknown_ones_named() {
        let vars = [("root", "/r".to_string()), ("state", "/s".to_string())];
        assert_eq!(render("a={{root}} b={{ state }}", &vars).unwrap(), "a=/r b=/s");
        let err = render("x={{nope}}", &vars).unwrap_err();
        assert!(err.to_string().contains("{{nope}}"), "{err}");
        assert!(render("x={{root", &vars).is_err());
    }

    #[test]
    fn the_built_in_template_renders_to_valid_config() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            layout: Layout { dir: dir.path().join("containerd") },
            bin: None,
            sandbox_image: "localhost/cairn/pause:1".into(),
            cni_bin_dir: dir.path().join("bin"),
            cni_conf_dir: dir.path().join("conf"),
            runtimes: vec![("nvidia".into(), "/usr/bin/nvidia-container-runtime".into())],
        };
        let path = write_config(&settings).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("{{"), "{text}");
        let nvidia = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\".options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"";
        assert!(text.contains(nvidia), "{text}");
        assert!(text.contains("sandbox_image = \"localhost/cairn/pause:1\""), "{text}");
        assert!(text.contains(&format!("address = \"{}\"", settings.layout.socket().display())), "{text}");
        let restrict = format!("restrict_oom_score_adj = {}", !has_cap_sys_resource());
        assert!(text.contains(&restrict), "{text}");
        // A user's template wins, with the same placeholders.
        std::fs::write(settings.layout.template(), "version = 2\nroot = \"{{root}}\"\n# mine\n").unwrap();
        write_config(&settings).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("# mine\n") && text.contains(&*settings.layout.root().to_string_lossy()), "{text}");
    }

    #[test]
    fn a_missing_binary_says_what_to_install() {
        let err = find_binaries(Some(Path::new("/nonexistent/containerd"))).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/containerd: no such file"), "{err}");
        assert!(err.contains("apt-get install containerd runc"), "{err}");
        assert!(err.contains("--container-runtime-endpoint"), "{err}");
    }
}
