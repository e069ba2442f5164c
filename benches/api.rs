//! API benchmark of cairn: `cargo bench --bench api`.
//!
//! Starts the release `cairn server` and, as the baseline of the same run, Debian's etcd 3.4
//! (`/usr/bin/etcd`, default durability: fsync per commit), then measures:
//! - durable pod creates (`POST /api/v1/namespaces/default/pods`, ~1 KiB pods, unique names) with 1, 16
//!   and 64 concurrent clients, against etcd puts of the same pod JSON through its v3 JSON gateway
//!   (`POST /v3/kv/put`) with as many clients, with the CPU time per request of each server and of
//!   this load generator (from `/proc`) and cairn's writes per disk flush and per pod (from its
//!   `/metrics`), on three servers: the control plane only (`--disable-scheduler`), the scheduler
//!   on without nodes (every pod unschedulable), and the scheduler on with 100 Ready nodes without
//!   agents (every pod bound); the later runs use the second;
//! - LIST of 10,000 pods as JSON and as a `meta.k8s.io/v1` Table (median of 5, full body received);
//! - delivery latency of one write to 100 concurrent pod watchers, from just before the write is sent
//!   to the receipt of the event line: on the idle server, then again while 16 clients create pods
//!   in another namespace that the scheduler finds unschedulable (the scheduler busy);
//! - idle RSS of a fresh `cairn server --disable-agent` 3 s after it became ready and 10 s after (once
//!   it has handed back start-up's code pages), and the size of the release binary;
//! - the cost of authorization: pod creates (16 clients) by a user allowed through a RoleBinding to
//!   `edit`, among `CAIRN_BENCH_AUTHZ_BINDINGS` bindings of other users, on a server deciding with
//!   RBAC (the default `Node,RBAC`) against the same on a server with `--authorization-mode
//!   AlwaysAllow`, alternated twice.
//!
//! Every client is a task with its own keep-alive HTTP/1.1 connection, opened before the clock
//! starts: TLS with the admin client certificate from the kubeconfig for cairn, plain TCP for etcd.
//! Nothing is asserted; timings on a shared machine only compare within one run, hence the ratios
//! to etcd. The table goes to stdout and the same figures as JSON to `target/bench-api.json`.
//!
//! Environment (defaults in brackets):
//! - `CAIRN_BENCH_BIN` [the release build]: the cairn binary measured (another build, to compare two
//!   in one sitting);
//! - `CAIRN_BENCH_CLIENTS` [`1,16,64`]: concurrency levels of the create runs;
//! - `CAIRN_BENCH_CREATES_SINGLE` [2000]: requests of a one-client run;
//! - `CAIRN_BENCH_CREATES` [10000]: requests of every other run;
//! - `CAIRN_BENCH_LEVEL_SECS` [40]: time limit of one create run (a run cut short reports what it did);
//! - `CAIRN_BENCH_LIST_PODS` [10000], `CAIRN_BENCH_LIST_RUNS` [5];
//! - `CAIRN_BENCH_WATCHERS` [100], `CAIRN_BENCH_WATCH_WRITES` [20];
//! - `CAIRN_BENCH_AUTHZ_CREATES` [5000] per run, `CAIRN_BENCH_AUTHZ_BINDINGS` [1000];
//! - `CAIRN_BENCH_ETCD` [`/usr/bin/etcd`]: the baseline binary; empty skips the baseline;
//! - `CAIRN_BENCH_DATASTORE` [`sled`]: `etcd` runs the measured cairn on an etcd of its own (the
//!   same binary as the baseline, another instance), so the creates compare the API on etcd with
//!   raw puts into etcd.

use std::fmt::Write as _;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;

#[path = "common/binary.rs"]
mod binary;
#[path = "common/proc.rs"]
mod proc;

/// Longest wait for one request before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a started process to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for every watcher to receive one write.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between the writes of the watch run, so that their deliveries do not overlap.
const WATCH_WRITE_GAP: Duration = Duration::from_millis(50);
/// When the idle server's memory is read, after it became ready: while start-up's code pages are
/// still resident, and once the server has handed them back (5 s after ready).
const IDLE_READS: [Duration; 2] = [Duration::from_secs(3), Duration::from_secs(10)];
/// Clients that fill the namespace listed by the LIST runs.
const FILL_CLIENTS: usize = 16;
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const JSON: &str = "application/json";
const LIST_NAMESPACE: &str = "bench-list";

fn main() -> Result<()> {
    let config = Config::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(run(&config))?;
    let json = report.to_json(&config);
    print!("{}", report.table(&config));
    let out = target_dir().join("bench-api.json");
    std::fs::create_dir_all(out.parent().context("target directory")?)?;
    std::fs::write(&out, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    println!("\nJSON: {}", out.display());
    Ok(())
}

/// Runs every measurement in turn; the baseline runs right after each cairn create run.
async fn run(config: &Config) -> Result<Report> {
    progress("footprint: idle RSS of a fresh server");
    let footprint = footprint().await?;
    let etcd = start_baseline(config).await;
    if let Err(why) = &etcd {
        eprintln!("*** etcd baseline SKIPPED: {why} ***");
    }
    let pod = PodTemplate::new();
    let mut creates = Vec::new();
    let mut etcd_loads = Vec::new();
    // The later runs use the server of the case users have: the scheduler on, every pod pending.
    let mut cairn = None;
    for setup in Setup::ALL {
        // On etcd, each server has one of its own (a cluster of its own), kept as long as it runs.
        let datastore = match config.datastore_etcd {
            true => {
                let bin = config.etcd.as_ref().context("CAIRN_BENCH_DATASTORE=etcd needs CAIRN_BENCH_ETCD")?;
                Some(Etcd::start(bin).await?)
            }
            false => None,
        };
        let endpoint = datastore.as_ref().map(|e| format!("http://{}", e.endpoint.addr));
        let mut args = vec!["--disable-agent"];
        if let Some(endpoint) = &endpoint {
            args.extend(["--datastore-endpoint", endpoint.as_str()]);
        }
        let server = Cairn::start(&[&args[..], setup.args()].concat()).await?;
        if setup == Setup::Nodes {
            progress(&format!("creates: registering {FAKE_NODES} nodes"));
            add_fake_nodes(&server.endpoint).await?;
        }
        for &clients in &config.clients {
            let requests = if clients == 1 { config.creates_single } else { config.creates };
            progress(&format!("creates, {}: {clients} client(s), {requests} requests", setup.label()));
            let tag = setup.tag();
            let names: Names = Arc::new(move |i| format!("bench-{tag}-{clients}-{i}"));
            let counters = store_counters(&server.endpoint).await;
            let cairn_load = run_load(
                &server.endpoint,
                clients,
                requests,
                config.level_limit,
                cairn_create(&pod, "default", names.clone()),
            )
            .await?;
            let writes_per_flush = match (counters, store_counters(&server.endpoint).await) {
                (Some((w0, f0)), Some((w1, f1))) if f1 > f0 => Some((w1 - w0) as f64 / (f1 - f0) as f64),
                _ => None,
            };
            // What each create cost the store in the end, once the scheduler has caught up.
            let writes_per_pod = match (counters, settled_writes(&server.endpoint).await) {
                (Some((w0, _)), Some(w1)) if cairn_load.ok() > 0 => Some((w1 - w0) as f64 / cairn_load.ok() as f64),
                _ => None,
            };
            if let (Ok(etcd), Setup::ControlPlane) = (&etcd, setup) {
                let names = Arc::new(move |i| format!("bench-{clients}-{i}"));
                let load =
                    run_load(&etcd.endpoint, clients, requests, config.level_limit, etcd_put(&pod, names)).await?;
                etcd_loads.push(load);
            }
            creates.push(CreateLevel { setup, cairn: cairn_load, writes_per_flush, writes_per_pod });
        }
        if setup == Setup::Unschedulable {
            cairn = Some((server, datastore));
        }
    }
    let (cairn, _datastore) = cairn.context("the scheduler's server")?;
    let baseline = etcd.as_ref().map(|e| e.version.clone()).map_err(Clone::clone);
    drop(etcd);
    let apply = apply(&cairn.endpoint, &pod, config).await?;
    progress(&format!("list: filling {LIST_NAMESPACE} with {} pods", config.list_pods));
    let lists = list(&cairn.endpoint, &pod, config).await?;
    progress(&format!("watch: {} watchers, {} writes", config.watchers, config.watch_writes));
    let watch = watch(&cairn.endpoint, &pod, config, "idle").await?;
    progress(&format!("watch, scheduler busy: {BUSY_CLIENTS} clients creating unschedulable pods meanwhile"));
    let watch_busy = watch_busy(&cairn.endpoint, &pod, config).await?;
    drop(cairn);
    let authz = authorization(&pod, config).await?;
    let pod_bytes = pod.render("bench-1-0").len();
    let watches = [watch, watch_busy];
    Ok(Report { pod_bytes, footprint, creates, etcd_loads, apply, lists, watches, baseline, authz })
}

/// Starts the etcd baseline, or says why there is none.
async fn start_baseline(config: &Config) -> Result<Etcd, String> {
    let Some(bin) = &config.etcd else { return Err("CAIRN_BENCH_ETCD is empty".into()) };
    if !bin.exists() {
        return Err(format!("{} not found (apt-get install etcd-server)", bin.display()));
    }
    Etcd::start(bin).await.map_err(|e| format!("{} did not start: {e:#}", bin.display()))
}

fn progress(what: &str) {
    eprintln!("[bench] {what}");
}

/// The target directory: `$CARGO_TARGET_DIR`, else `target/` of the package.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

// ----------------------------------------------------------------------------------------------
// Configuration

/// Sizes of the runs, from the environment.
struct Config {
    clients: Vec<usize>,
    creates_single: usize,
    creates: usize,
    level_limit: Duration,
    list_pods: usize,
    list_runs: usize,
    watchers: usize,
    watch_writes: usize,
    etcd: Option<PathBuf>,
    datastore_etcd: bool,
    authz_creates: usize,
    authz_bindings: usize,
}

impl Config {
    fn from_env() -> Result<Self> {
        let clients = env_or("CAIRN_BENCH_CLIENTS", "1,16,64")
            .split(',')
            .map(|c| {
                c.trim().parse::<usize>().ok().filter(|&c| c > 0).context("CAIRN_BENCH_CLIENTS: positive integers")
            })
            .collect::<Result<_>>()?;
        let etcd = env_or("CAIRN_BENCH_ETCD", "/usr/bin/etcd");
        Ok(Self {
            clients,
            creates_single: env_num("CAIRN_BENCH_CREATES_SINGLE", 2000)?,
            creates: env_num("CAIRN_BENCH_CREATES", 10_000)?,
            level_limit: Duration::from_secs(env_num("CAIRN_BENCH_LEVEL_SECS", 40)? as u64),
            list_pods: env_num("CAIRN_BENCH_LIST_PODS", 10_000)?,
            list_runs: env_num("CAIRN_BENCH_LIST_RUNS", 5)?.max(1),
            watchers: env_num("CAIRN_BENCH_WATCHERS", 100)?.max(1),
            watch_writes: env_num("CAIRN_BENCH_WATCH_WRITES", 20)?.max(1),
            etcd: (!etcd.is_empty()).then(|| PathBuf::from(etcd)),
            datastore_etcd: match env_or("CAIRN_BENCH_DATASTORE", "sled").as_str() {
                "sled" => false,
                "etcd" => true,
                other => bail!("CAIRN_BENCH_DATASTORE={other:?}: give sled or etcd"),
            },
            authz_creates: env_num("CAIRN_BENCH_AUTHZ_CREATES", 5000)?.max(1),
            authz_bindings: env_num("CAIRN_BENCH_AUTHZ_BINDINGS", 1000)?,
        })
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_num(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

// ----------------------------------------------------------------------------------------------
// HTTP client

/// Where requests go: cairn over TLS with a client certificate, or etcd over plain HTTP.
#[derive(Clone)]
struct Endpoint {
    addr: SocketAddr,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// The serving process, for its CPU time.
    pid: u32,
}

impl Endpoint {
    fn plain(addr: SocketAddr, pid: u32) -> Self {
        Self { addr, tls: None, pid }
    }

    /// The server and admin credentials of a kubeconfig written by `cairn server`.
    fn from_kubeconfig(path: &Path, pid: u32) -> Result<Self> {
        let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
        let cluster = &doc["clusters"][0]["cluster"];
        let user = &doc["users"][0]["user"];
        let pem = |v: &serde_yaml::Value, key: &str| -> Result<Vec<u8>> {
            Ok(B64.decode(v[key].as_str().with_context(|| format!("kubeconfig lacks {key}"))?)?)
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut pem(cluster, "certificate-authority-data")?.as_slice()) {
            roots.add(cert?)?;
        }
        let chain = rustls_pemfile::certs(&mut pem(user, "client-certificate-data")?.as_slice())
            .collect::<Result<Vec<_>, _>>()?;
        let key = rustls_pemfile::private_key(&mut pem(user, "client-key-data")?.as_slice())?
            .context("kubeconfig holds no client key")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server = cluster["server"].as_str().context("kubeconfig lacks server")?;
        let addr: SocketAddr =
            server.trim_start_matches("https://").trim_end_matches('/').parse().context("server is not IP:port")?;
        let name = ServerName::IpAddress(addr.ip().into());
        Ok(Self { addr, tls: Some((TlsConnector::from(Arc::new(tls)), name)), pid })
    }

    /// Opens a keep-alive HTTP/1.1 connection.
    async fn connect(&self) -> Result<Conn> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let sender = match &self.tls {
            Some((connector, name)) => handshake(connector.connect(name.clone(), tcp).await?).await?,
            None => handshake(tcp).await?,
        };
        Ok(Conn { sender, host: self.addr.to_string() })
    }
}

async fn handshake<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> Result<SendRequest<Full<Bytes>>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request, independent of the connection that carries it.
struct Req {
    method: Method,
    path: String,
    accept: &'static str,
    content_type: &'static str,
    body: Bytes,
}

impl Req {
    fn get(path: impl Into<String>, accept: &'static str) -> Self {
        Self { method: Method::GET, path: path.into(), accept, content_type: JSON, body: Bytes::new() }
    }

    fn post(path: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self { method: Method::POST, path: path.into(), accept: JSON, content_type: JSON, body: body.into() }
    }

    fn patch(path: impl Into<String>, content_type: &'static str, body: impl Into<Bytes>) -> Self {
        Self { method: Method::PATCH, path: path.into(), accept: JSON, content_type, body: body.into() }
    }
}

/// One keep-alive connection.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    /// Sends a request and returns once the response head has arrived.
    async fn start(&mut self, req: Req) -> Result<Response<Incoming>> {
        self.sender.ready().await?;
        let mut builder = Request::builder()
            .method(req.method)
            .uri(req.path)
            .header(header::HOST, &self.host)
            .header(header::ACCEPT, req.accept);
        if !req.body.is_empty() {
            builder = builder.header(header::CONTENT_TYPE, req.content_type);
        }
        Ok(self.sender.send_request(builder.body(Full::new(req.body))?).await?)
    }

    /// Sends a request and reads the whole response.
    async fn send(&mut self, req: Req) -> Result<(StatusCode, Bytes)> {
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, self.start(req)).await.context("request timed out")??;
        let status = resp.status();
        let body = tokio::time::timeout(REQUEST_TIMEOUT, resp.into_body().collect())
            .await
            .context("response body timed out")??;
        Ok((status, body.to_bytes()))
    }

    /// Sends a request that must be answered with `expect`; returns the body.
    async fn expect(&mut self, req: Req, expect: StatusCode) -> Result<Bytes> {
        let what = format!("{} {}", req.method, req.path);
        let (status, body) = self.send(req).await?;
        if status != expect {
            bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

// ----------------------------------------------------------------------------------------------
// Servers

/// A child process, killed and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Fails if the process has exited, showing the end of its log.
    fn check_alive(&mut self, name: &str, log: &Path) -> Result<()> {
        if let Some(status) = self.0.try_wait()? {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            bail!("{name} exited with {status}:\n{}", lines[lines.len().saturating_sub(20)..].join("\n"));
        }
        Ok(())
    }
}

/// Whether `GET path` answers 200.
async fn answers_ok(endpoint: &Endpoint, path: &str) -> bool {
    match endpoint.connect().await {
        Ok(mut conn) => matches!(conn.send(Req::get(path, JSON)).await, Ok((StatusCode::OK, _))),
        Err(_) => false,
    }
}

/// A `cairn server` on a free loopback port with an empty data directory of its own.
struct Cairn {
    proc: Proc,
    endpoint: Endpoint,
    dir: tempfile::TempDir,
}

impl Cairn {
    /// Starts the release binary and waits until `/readyz` answers 200.
    async fn start(extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig.yaml");
        let log = dir.path().join("server.log");
        let child = Command::new(binary::cairn_bin())
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--bind-address", "127.0.0.1", "--https-listen-port", "0", "--write-kubeconfig"])
            .arg(&kubeconfig)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting cairn")?;
        let mut proc = Proc(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            proc.check_alive("cairn", &log)?;
            if let Ok(endpoint) = Endpoint::from_kubeconfig(&kubeconfig, proc.0.id())
                && answers_ok(&endpoint, "/readyz").await
            {
                return Ok(Self { proc, endpoint, dir });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("cairn did not become ready within {START_TIMEOUT:?}")
    }

    fn pid(&self) -> u32 {
        self.proc.0.id()
    }
}

/// A single-member etcd on free loopback ports with its own data directory.
struct Etcd {
    _proc: Proc,
    endpoint: Endpoint,
    version: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd with default durability and waits until `/health` answers 200.
    async fn start(bin: &Path) -> Result<Self> {
        let version = Command::new(bin).arg("--version").output().context("running etcd --version")?;
        let version = String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or("etcd").trim().to_string();
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("etcd.log");
        let (client, peer) = free_ports()?;
        let client_url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let child = Command::new(bin)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--name", "bench", "--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting etcd")?;
        let mut proc = Proc(child);
        let endpoint = Endpoint::plain(client, proc.0.id());
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            proc.check_alive("etcd", &log)?;
            if answers_ok(&endpoint, "/health").await {
                return Ok(Self { _proc: proc, endpoint, version, _dir: dir });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("etcd did not become healthy within {START_TIMEOUT:?}")
    }
}

/// Two distinct free loopback ports.
fn free_ports() -> Result<(SocketAddr, SocketAddr)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?, b.local_addr()?))
}

// ----------------------------------------------------------------------------------------------
// Load

/// A pod of about 1 KiB (one container with ports, env, resources and a probe; labels and
/// annotations), split around its name.
struct PodTemplate {
    head: String,
    tail: String,
}

impl PodTemplate {
    const MARK: &str = "@NAME@";

    fn new() -> Self {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": Self::MARK,
                "labels": {
                    "app.kubernetes.io/name": "storefront",
                    "app.kubernetes.io/component": "web",
                    "app.kubernetes.io/version": "2.14.1",
                    "pod-template-hash": "7d9f5c8b6d",
                },
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": "9102",
                    "kubectl.kubernetes.io/default-container": "web",
                },
            },
            "spec": {
                "containers": [{
                    "name": "web",
                    "image": "registry.example.com/shop/storefront:2.14.1",
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["--listen=:8080", "--metrics=:9102", "--log-level=info"],
                    "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9102, "protocol": "TCP"},
                    ],
                    "env": [
                        {"name": "STORE_REGION", "value": "eu-central"},
                        {"name": "CACHE_SIZE", "value": "256Mi"},
                    ],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "256Mi"},
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": 8080},
                        "initialDelaySeconds": 5,
                        "periodSeconds": 10,
                    },
                }],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "dnsPolicy": "ClusterFirst",
                "nodeSelector": {"kubernetes.io/os": "linux"},
            },
        })
        .to_string();
        let (head, tail) = pod.split_once(Self::MARK).expect("the template holds the name mark");
        Self { head: head.to_string(), tail: tail.to_string() }
    }

    fn render(&self, name: &str) -> String {
        [self.head.as_str(), name, self.tail.as_str()].concat()
    }
}

/// Request `i` of a load run.
type MakeReq = Arc<dyn Fn(usize) -> Req + Send + Sync>;
/// Name of object `i` of a load run.
type Names = Arc<dyn Fn(usize) -> String + Send + Sync>;

/// Creates pod `names(i)` in `namespace`; succeeds with 201.
fn cairn_create(pod: &PodTemplate, namespace: &str, names: Names) -> (MakeReq, StatusCode) {
    let (head, tail) = (pod.head.clone(), pod.tail.clone());
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    let make = move |i| Req::post(path.clone(), [head.as_str(), &names(i), tail.as_str()].concat());
    (Arc::new(make), StatusCode::CREATED)
}

/// Puts pod `names(i)` under its kube-apiserver key through etcd's JSON gateway; succeeds with 200.
fn etcd_put(pod: &PodTemplate, names: Names) -> (MakeReq, StatusCode) {
    let (head, tail) = (pod.head.clone(), pod.tail.clone());
    let make = move |i| {
        let name = names(i);
        let value = [head.as_str(), &name, tail.as_str()].concat();
        let key = format!("/registry/pods/default/{name}");
        Req::post("/v3/kv/put", json!({"key": B64.encode(key), "value": B64.encode(value)}).to_string())
    };
    (Arc::new(make), StatusCode::OK)
}

/// Outcome of a load run.
struct Load {
    clients: usize,
    requests: usize,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
    /// Latencies of the successful requests, sorted.
    latencies: Vec<Duration>,
    /// CPU time of the server process and of this load generator during the run.
    server_cpu: Duration,
    client_cpu: Duration,
}

impl Load {
    fn ok(&self) -> usize {
        self.latencies.len()
    }

    fn per_sec(&self) -> f64 {
        self.ok() as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU microseconds per successful request.
    fn cpu_us(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / self.ok().max(1) as f64
    }

    fn to_json(&self) -> Value {
        json!({
            "clients": self.clients,
            "requests": self.requests,
            "ok": self.ok(),
            "errors": self.errors,
            "first_error": self.first_error,
            "seconds": self.elapsed.as_secs_f64(),
            "per_sec": self.per_sec(),
            "p50_ms": ms(percentile(&self.latencies, 0.50)),
            "p99_ms": ms(percentile(&self.latencies, 0.99)),
            "max_ms": ms(self.latencies.last().copied().unwrap_or_default()),
            "server_cpu_us_per_request": self.cpu_us(self.server_cpu),
            "client_cpu_us_per_request": self.cpu_us(self.client_cpu),
        })
    }
}

/// What every client of a load run shares.
struct Job {
    endpoint: Endpoint,
    make: MakeReq,
    expect: StatusCode,
    requests: usize,
    next: AtomicUsize,
    deadline: Instant,
    /// Set to end the run before its requests or its time limit are used up.
    stop: AtomicBool,
}

/// Sends `requests` requests from `clients` concurrent connections, each taking the next request
/// number until all are taken or `limit` has passed. Only answers with the expected status count.
async fn run_load(
    endpoint: &Endpoint,
    clients: usize,
    requests: usize,
    limit: Duration,
    req: (MakeReq, StatusCode),
) -> Result<Load> {
    start_load(endpoint, clients, requests, limit, req).await?.finish().await
}

/// A load run under way.
struct Running {
    job: Arc<Job>,
    tasks: Vec<tokio::task::JoinHandle<ClientStats>>,
    clients: usize,
    start: Instant,
    /// CPU time of the server and of this process when the run started.
    cpu_before: (Duration, Duration),
}

/// Opens the connections of a load run and starts its clients.
async fn start_load(
    endpoint: &Endpoint,
    clients: usize,
    requests: usize,
    limit: Duration,
    (make, expect): (MakeReq, StatusCode),
) -> Result<Running> {
    let conns = futures::future::try_join_all((0..clients).map(|_| endpoint.connect())).await?;
    let cpu_before = (process_cpu(endpoint.pid), process_cpu(std::process::id()));
    let start = Instant::now();
    let job = Arc::new(Job {
        endpoint: endpoint.clone(),
        make,
        expect,
        requests,
        next: AtomicUsize::new(0),
        deadline: start + limit,
        stop: AtomicBool::new(false),
    });
    let tasks = conns.into_iter().map(|conn| tokio::spawn(client(conn, job.clone()))).collect();
    Ok(Running { job, tasks, clients, start, cpu_before })
}

impl Running {
    /// Ends the run early: each client stops after its request in flight.
    fn stop(&self) {
        self.job.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for every client and sums up the run.
    async fn finish(self) -> Result<Load> {
        let mut load = Load {
            clients: self.clients,
            requests: self.job.requests,
            errors: 0,
            first_error: None,
            elapsed: Duration::ZERO,
            latencies: Vec::new(),
            server_cpu: Duration::ZERO,
            client_cpu: Duration::ZERO,
        };
        for task in self.tasks {
            let stats = task.await?;
            load.latencies.extend(stats.latencies);
            load.errors += stats.errors;
            load.first_error = load.first_error.or(stats.first_error);
        }
        load.elapsed = self.start.elapsed();
        if self.job.stop.load(Ordering::Relaxed) {
            // A stopped run made as many requests as it sent.
            load.requests = load.latencies.len() + load.errors;
        }
        load.server_cpu = process_cpu(self.job.endpoint.pid).saturating_sub(self.cpu_before.0);
        load.client_cpu = process_cpu(std::process::id()).saturating_sub(self.cpu_before.1);
        load.latencies.sort_unstable();
        if let Some(e) = &load.first_error {
            eprintln!("[bench]   {} failed request(s); first: {e}", load.errors);
        }
        Ok(load)
    }
}

/// User plus system CPU time a process has used so far (zero if unreadable).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime are fields 14 and 15; the fields after the `(comm)` field start at 3.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64((field(11) + field(12)) as f64 / hz)
}

#[derive(Default)]
struct ClientStats {
    latencies: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// One client of a load run: requests one after another on its connection, reconnecting after a
/// transport error.
async fn client(mut conn: Conn, job: Arc<Job>) -> ClientStats {
    let mut stats = ClientStats::default();
    while Instant::now() < job.deadline && !job.stop.load(Ordering::Relaxed) {
        let i = job.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.requests {
            break;
        }
        let req = (job.make)(i);
        let sent = Instant::now();
        let error = match conn.send(req).await {
            Ok((status, _)) if status == job.expect => {
                stats.latencies.push(sent.elapsed());
                continue;
            }
            Ok((status, body)) => format!("{status}: {}", String::from_utf8_lossy(&body)),
            Err(e) => {
                let msg = format!("{e:#}");
                match job.endpoint.connect().await {
                    Ok(c) => conn = c,
                    Err(_) => return stats,
                }
                msg
            }
        };
        stats.errors += 1;
        stats.first_error.get_or_insert(error);
    }
    stats
}

// ----------------------------------------------------------------------------------------------
// Measurements

/// The store's `(writes, flushes)` counters from `/metrics`, if the server exports them.
async fn store_counters(endpoint: &Endpoint) -> Option<(u64, u64)> {
    let mut conn = endpoint.connect().await.ok()?;
    let body = conn.expect(Req::get("/metrics", "text/plain"), StatusCode::OK).await.ok()?;
    let text = String::from_utf8_lossy(&body);
    let counter = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok());
    Some((counter("cairn_store_writes_total ")?, counter("cairn_store_flushes_total ")?))
}

/// Idle memory and binary size.
struct Footprint {
    binary_bytes: u64,
    /// At each of `IDLE_READS`.
    idle: Vec<proc::Rss>,
}

/// Reads the binary size, then starts a fresh server and reads its RSS as it idles.
async fn footprint() -> Result<Footprint> {
    let binary_bytes = std::fs::metadata(binary::cairn_bin())?.len();
    let cairn = Cairn::start(&["--disable-agent"]).await?;
    let ready = Instant::now();
    let mut idle = Vec::new();
    for at in IDLE_READS {
        tokio::time::sleep(at.saturating_sub(ready.elapsed())).await;
        idle.push(proc::rss(cairn.pid()));
    }
    Ok(Footprint { binary_bytes, idle })
}

/// What runs beside the API during a create run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// `--disable-scheduler`: the API and the controllers.
    ControlPlane,
    /// The scheduler on and no nodes: every pod is found unschedulable (a status write and a
    /// FailedScheduling event on top of its create).
    Unschedulable,
    /// The scheduler on and `FAKE_NODES` Ready nodes (no agents): every pod is bound.
    Nodes,
}

/// Nodes of the `Setup::Nodes` runs.
const FAKE_NODES: usize = 100;

impl Setup {
    const ALL: [Setup; 3] = [Setup::ControlPlane, Setup::Unschedulable, Setup::Nodes];

    fn label(self) -> &'static str {
        match self {
            Setup::ControlPlane => "control plane only",
            Setup::Unschedulable => "scheduler, no nodes",
            Setup::Nodes => "scheduler, 100 nodes",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Setup::ControlPlane => "cp",
            Setup::Unschedulable => "unsched",
            Setup::Nodes => "bound",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Setup::ControlPlane => &["--disable-scheduler"],
            Setup::Unschedulable => &[],
            // Nodes without agents: their heartbeats never come, and must not be missed meanwhile.
            Setup::Nodes => &["--node-monitor-grace-period", "24h"],
        }
    }
}

/// Registers `FAKE_NODES` Ready nodes with room for every pod of the runs.
async fn add_fake_nodes(endpoint: &Endpoint) -> Result<()> {
    let mut conn = endpoint.connect().await?;
    for i in 0..FAKE_NODES {
        let name = format!("fake-{i}");
        let capacity = json!({"cpu": "1000", "memory": "4Ti", "pods": "10000"});
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": name}},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        });
        conn.expect(Req::post("/api/v1/nodes", node.to_string()), StatusCode::CREATED).await?;
    }
    Ok(())
}

/// The store's write counter once it has stopped moving for half a second (at most 30 s).
async fn settled_writes(endpoint: &Endpoint) -> Option<u64> {
    let mut last = store_counters(endpoint).await?.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = store_counters(endpoint).await?.0;
        if now == last {
            break;
        }
        last = now;
    }
    Some(last)
}

/// A create run against cairn.
struct CreateLevel {
    setup: Setup,
    cairn: Load,
    /// cairn's writes per disk flush (group commit), from its `/metrics`.
    writes_per_flush: Option<f64>,
    /// Store writes per successful create, counted until the scheduler has caught up.
    writes_per_pod: Option<f64>,
}

/// Times of the LIST runs of one format.
struct ListRuns {
    format: &'static str,
    items: usize,
    bytes: usize,
    times: Vec<Duration>,
}

impl ListRuns {
    fn median(&self) -> Duration {
        let mut t = self.times.clone();
        t.sort_unstable();
        t[t.len() / 2]
    }
}

/// Fills a namespace of its own with `list_pods` pods, then times LIST as JSON and as Table.
async fn list(endpoint: &Endpoint, pod: &PodTemplate, config: &Config) -> Result<Vec<ListRuns>> {
    let mut conn = endpoint.connect().await?;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LIST_NAMESPACE}});
    conn.expect(Req::post("/api/v1/namespaces", ns.to_string()), StatusCode::CREATED).await?;
    let names: Names = Arc::new(|i| format!("list-{i}"));
    let fill = cairn_create(pod, LIST_NAMESPACE, names);
    let filled = run_load(endpoint, FILL_CLIENTS, config.list_pods, Duration::from_secs(120), fill).await?;
    progress(&format!(
        "list: filled at {:.0} creates/s; timing {} runs per format",
        filled.per_sec(),
        config.list_runs
    ));
    let path = format!("/api/v1/namespaces/{LIST_NAMESPACE}/pods");
    let mut out = Vec::new();
    for (format, accept, items_key) in [("JSON", JSON, "items"), ("Table", TABLE, "rows")] {
        let mut runs = ListRuns { format, items: 0, bytes: 0, times: Vec::new() };
        for _ in 0..config.list_runs {
            let start = Instant::now();
            let body = conn.expect(Req::get(&path, accept), StatusCode::OK).await?;
            runs.times.push(start.elapsed());
            runs.bytes = body.len();
        }
        let body = conn.expect(Req::get(&path, accept), StatusCode::OK).await?;
        let v: Value = serde_json::from_slice(&body)?;
        runs.items = v[items_key].as_array().map_or(0, Vec::len);
        out.push(runs);
    }
    Ok(out)
}

/// Delivery latencies of the watch run.
struct WatchRun {
    watchers: usize,
    writes: usize,
    /// From just before each write was sent to each watcher's receipt of its event, sorted.
    delivery: Vec<Duration>,
    /// Latency of the writes themselves, sorted.
    write: Vec<Duration>,
    /// The creates that kept the scheduler busy meanwhile, if any.
    background: Option<Load>,
}

impl WatchRun {
    fn label(&self) -> &'static str {
        match self.background {
            None => "idle server",
            Some(_) => "scheduler busy",
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "watchers": self.watchers,
            "writes": self.writes,
            "delivered": self.delivery.len(),
            "p50_ms": ms(percentile(&self.delivery, 0.5)),
            "p99_ms": ms(percentile(&self.delivery, 0.99)),
            "max_ms": ms(self.delivery.last().copied().unwrap_or_default()),
            "write_p50_ms": ms(percentile(&self.write, 0.5)),
            "background_creates": self.background.as_ref().map(Load::to_json),
        })
    }
}

/// One event line received by a watcher.
struct Receipt {
    name: String,
    at: Instant,
}

/// Opens the watchers from the current revision, then makes one write at a time and waits until
/// every watcher has received it.
async fn watch(endpoint: &Endpoint, pod: &PodTemplate, config: &Config, tag: &str) -> Result<WatchRun> {
    let mut writer = endpoint.connect().await?;
    let head = writer.expect(Req::get("/api/v1/namespaces/default/pods?limit=1", JSON), StatusCode::OK).await?;
    let head: Value = serde_json::from_slice(&head)?;
    let rv = head["metadata"]["resourceVersion"].as_str().context("list without resourceVersion")?.to_string();
    let path = format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}");
    let streams = futures::future::try_join_all((0..config.watchers).map(|_| open_watch(endpoint, &path))).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let readers: Vec<_> =
        streams.into_iter().map(|(conn, body)| tokio::spawn(read_watch(conn, body, tx.clone()))).collect();
    let mut run = WatchRun {
        watchers: config.watchers,
        writes: config.watch_writes,
        delivery: Vec::new(),
        write: Vec::new(),
        background: None,
    };
    for k in 0..config.watch_writes {
        let name = format!("bench-watch-{tag}-{k}");
        let sent = Instant::now();
        writer.expect(Req::post("/api/v1/namespaces/default/pods", pod.render(&name)), StatusCode::CREATED).await?;
        run.write.push(sent.elapsed());
        let deadline = tokio::time::Instant::now() + DELIVERY_TIMEOUT;
        let mut seen = 0;
        while seen < config.watchers {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) if r.name == name => {
                    run.delivery.push(r.at - sent);
                    seen += 1;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        if seen < config.watchers {
            eprintln!("[bench]   write {k}: only {seen}/{} watchers received it", config.watchers);
        }
        tokio::time::sleep(WATCH_WRITE_GAP).await;
    }
    readers.iter().for_each(|r| r.abort());
    run.delivery.sort_unstable();
    run.write.sort_unstable();
    Ok(run)
}

/// Namespace of the pods that keep the scheduler busy during the second watch run.
const BUSY_NAMESPACE: &str = "bench-busy";
/// Clients creating those pods.
const BUSY_CLIENTS: usize = 16;
/// How long the busy load runs before the watch run starts, to reach its steady state.
const BUSY_WARMUP: Duration = Duration::from_secs(2);

/// The watch run again while `BUSY_CLIENTS` clients create pods in another namespace, each found
/// unschedulable by the scheduler (its status and a `FailedScheduling` event written on top).
async fn watch_busy(endpoint: &Endpoint, pod: &PodTemplate, config: &Config) -> Result<WatchRun> {
    let mut conn = endpoint.connect().await?;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BUSY_NAMESPACE}});
    conn.expect(Req::post("/api/v1/namespaces", ns.to_string()), StatusCode::CREATED).await?;
    let names: Names = Arc::new(|i| format!("busy-{i}"));
    let creates = cairn_create(pod, BUSY_NAMESPACE, names);
    let busy = start_load(endpoint, BUSY_CLIENTS, usize::MAX, config.level_limit, creates).await?;
    tokio::time::sleep(BUSY_WARMUP).await;
    let run = watch(endpoint, pod, config, "busy").await;
    busy.stop();
    let background = busy.finish().await?;
    Ok(WatchRun { background: Some(background), ..run? })
}

/// Opens one watch on a connection of its own; returns once the server has answered 200.
async fn open_watch(endpoint: &Endpoint, path: &str) -> Result<(Conn, Incoming)> {
    let mut conn = endpoint.connect().await?;
    let resp = conn.start(Req::get(path, JSON)).await?;
    if resp.status() != StatusCode::OK {
        bail!("watch answered {}", resp.status());
    }
    Ok((conn, resp.into_body()))
}

/// Reports the object name of every event line with the time its last chunk arrived; holds the
/// watch's connection until the stream ends.
async fn read_watch(_conn: Conn, mut body: Incoming, tx: mpsc::UnboundedSender<Receipt>) {
    let mut buf = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let at = Instant::now();
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<Value>(&line) else { continue };
            let name = event["object"]["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if tx.send(Receipt { name, at }).is_err() {
                return;
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Report

struct Report {
    pod_bytes: usize,
    footprint: Footprint,
    creates: Vec<CreateLevel>,
    /// The etcd run of each concurrency level, when the baseline ran.
    etcd_loads: Vec<Load>,
    apply: ApplyRun,
    lists: Vec<ListRuns>,
    /// On the idle server, then with the scheduler busy.
    watches: [WatchRun; 2],
    /// The etcd version, or why the baseline was skipped.
    baseline: Result<String, String>,
    authz: AuthzRun,
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Report {
    fn table(&self, config: &Config) -> String {
        let mut t = String::new();
        let baseline = match &self.baseline {
            Ok(version) => format!("{version}, puts of the same pod JSON via POST /v3/kv/put"),
            Err(why) => format!("SKIPPED ({why})"),
        };
        let store = if config.datastore_etcd { "etcd (an instance of its own)" } else { "sled" };
        let _ = writeln!(
            t,
            "\ncairn API benchmark: {} CPU(s), pod JSON {} bytes, cairn's datastore: {store}",
            cpus(),
            self.pod_bytes
        );
        let _ = writeln!(t, "clients: one task with its own keep-alive HTTP/1.1 connection each (TLS for cairn)");
        let _ = writeln!(t, "baseline: {baseline}");
        self.creates_table(&mut t);
        self.cpu_table(&mut t);
        self.apply.table(&mut t);
        self.list_table(&mut t, config);
        self.watch_table(&mut t);
        self.authz.table(&mut t, config);
        let f = &self.footprint;
        let _ = writeln!(t, "\nfootprint");
        for (at, rss) in IDLE_READS.iter().zip(&f.idle) {
            let _ = writeln!(t, "  idle RSS (--disable-agent, {:>2} s after ready)  {rss}", at.as_secs());
        }
        let _ = writeln!(t, "  release binary {}  {:.1} MiB", binary::cairn_bin().display(), mib(f.binary_bytes));
        t
    }

    /// The etcd run with as many clients as `level`.
    fn etcd_of(&self, level: &CreateLevel) -> Option<&Load> {
        self.etcd_loads.iter().find(|e| e.clients == level.cairn.clients)
    }

    fn ratio(&self, level: &CreateLevel) -> Option<f64> {
        self.etcd_of(level).map(|e| level.cairn.per_sec() / e.per_sec())
    }

    fn creates_table(&self, t: &mut String) {
        for setup in Setup::ALL {
            let _ = writeln!(
                t,
                "\ndurable creates, {:<21}---------- cairn ----------   ---------- etcd -----------",
                setup.label()
            );
            let _ = writeln!(
                t,
                "clients  requests     ok   per s  p50 ms  p99 ms  err     ok   per s  p50 ms  p99 ms  err  cairn/etcd"
            );
            for level in self.creates.iter().filter(|l| l.setup == setup) {
                let c = &level.cairn;
                let etcd = match (self.etcd_of(level), self.ratio(level)) {
                    (Some(e), Some(r)) => format!("{}  {r:>9.2}x", load_cells(e)),
                    _ => format!("{:>41}  {:>10}", "-", "-"),
                };
                let _ = writeln!(t, "{:>7}  {:>8}  {}  {etcd}", c.clients, c.requests, load_cells(c));
            }
        }
    }

    fn cpu_table(&self, t: &mut String) {
        let _ = writeln!(t, "\nCPU per successful request, us (server process / load generator); cairn group commit");
        let _ = writeln!(t, "setup                  clients          cairn           etcd  writes/flush  writes/pod");
        for level in &self.creates {
            let cells = |l: &Load| format!("{:>5.0} / {:<5.0}", l.cpu_us(l.server_cpu), l.cpu_us(l.client_cpu));
            let etcd = self.etcd_of(level).map_or(format!("{:>13}", "-"), cells);
            let batch = level.writes_per_flush.map_or("-".to_string(), |b| format!("{b:.1}"));
            let per_pod = level.writes_per_pod.map_or("-".to_string(), |w| format!("{w:.2}"));
            let _ = writeln!(
                t,
                "{:<21}  {:>7}  {}  {etcd}  {batch:>12}  {per_pod:>10}",
                level.setup.label(),
                level.cairn.clients,
                cells(&level.cairn)
            );
        }
    }

    fn list_table(&self, t: &mut String, config: &Config) {
        let _ = writeln!(t, "\nLIST {} pods, median of {}, time to full body", config.list_pods, config.list_runs);
        for l in &self.lists {
            let times = l.times.iter().map(|d| format!("{:.0}", ms(*d))).collect::<Vec<_>>().join(" ");
            let _ = writeln!(
                t,
                "  {:<6} {:>8.1} ms  ({} items, {:.1} MiB; runs ms: {times})",
                l.format,
                ms(l.median()),
                l.items,
                mib(l.bytes as u64)
            );
        }
    }

    fn watch_table(&self, t: &mut String) {
        let w = &self.watches[0];
        let _ = writeln!(
            t,
            "\nwatch: {} watchers x {} writes, delivery from just before the write is sent",
            w.watchers, w.writes
        );
        for w in &self.watches {
            let _ = writeln!(
                t,
                "  {:<15} delivery p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({}/{} events); write p50 {:.2} ms",
                w.label(),
                ms(percentile(&w.delivery, 0.5)),
                ms(percentile(&w.delivery, 0.99)),
                ms(w.delivery.last().copied().unwrap_or_default()),
                w.delivery.len(),
                w.watchers * w.writes,
                ms(percentile(&w.write, 0.5)),
            );
            if let Some(b) = &w.background {
                let _ = writeln!(
                    t,
                    "  {:<15} meanwhile {} clients created {} unschedulable pods in {BUSY_NAMESPACE}: {:.0}/s, p99 {:.2} ms",
                    "",
                    b.clients,
                    b.ok(),
                    b.per_sec(),
                    ms(percentile(&b.latencies, 0.99)),
                );
            }
        }
    }

    fn to_json(&self, config: &Config) -> Value {
        let creates: Vec<Value> = self
            .creates
            .iter()
            .map(|l| {
                json!({
                    "setup": l.setup.label(),
                    "clients": l.cairn.clients,
                    "cairn": l.cairn.to_json(),
                    "etcd": self.etcd_of(l).map(Load::to_json),
                    "ratio_to_etcd": self.ratio(l),
                    "cairn_writes_per_flush": l.writes_per_flush,
                    "cairn_store_writes_per_pod": l.writes_per_pod,
                })
            })
            .collect();
        let lists: Vec<Value> = self
            .lists
            .iter()
            .map(|l| {
                json!({
                    "format": l.format,
                    "items": l.items,
                    "bytes": l.bytes,
                    "median_ms": ms(l.median()),
                    "runs_ms": l.times.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "cpus": cpus(),
            "datastore": if config.datastore_etcd { "etcd" } else { "sled" },
            "pod_json_bytes": self.pod_bytes,
            "connections": "one keep-alive HTTP/1.1 connection per client (TLS with client certificate for cairn)",
            "baseline": self.baseline.as_ref().ok(),
            "baseline_skipped": self.baseline.as_ref().err(),
            "creates": creates,
            "apply": self.apply.to_json(),
            "list": {"pods": config.list_pods, "runs": config.list_runs, "formats": lists},
            "watch": self.watches[0].to_json(),
            "watch_scheduler_busy": self.watches[1].to_json(),
            "authorization": self.authz.to_json(config),
            "idle_rss_kib": IDLE_READS
                .iter()
                .zip(&self.footprint.idle)
                .map(|(at, r)| json!({"after_ready_s": at.as_secs(), "total": r.total, "anon": r.anon, "file": r.file}))
                .collect::<Vec<_>>(),
            "binary_bytes": self.footprint.binary_bytes,
        })
    }
}

// ----------------------------------------------------------------------------------------------
// Server-side apply

/// Pods the apply runs spread their requests over (few enough to be hot, enough that 16 clients
/// rarely write one pod at once).
const APPLY_PODS: usize = 256;
const APPLY: &str = "application/apply-patch+yaml";
const MERGE_PATCH: &str = "application/merge-patch+json";

/// Server-side apply against a JSON merge patch of the same change (one label's value).
struct ApplyRun {
    apply: Load,
    merge: Load,
    /// `GET /openapi/v2` as protobuf, from memory once generated.
    openapi_v2_proto: Load,
}

impl ApplyRun {
    fn ratio(&self) -> f64 {
        self.apply.per_sec() / self.merge.per_sec().max(f64::MIN_POSITIVE)
    }

    fn table(&self, t: &mut String) {
        let _ = writeln!(
            t,
            "\nserver-side apply of the whole pod vs JSON merge patch of the same change, {APPLY_PODS} pods"
        );
        let _ = writeln!(t, "clients  requests     ok   per s  p50 ms  p99 ms  err");
        for (what, l) in [("apply", &self.apply), ("merge", &self.merge)] {
            let _ = writeln!(t, "{:>7}  {:>8}  {}  {what}", l.clients, l.requests, load_cells(l));
        }
        let _ = writeln!(t, "  apply/merge {:.2}x", self.ratio());
        let o = &self.openapi_v2_proto;
        let _ = writeln!(
            t,
            "GET /openapi/v2 as protobuf: p50 {:.2} ms, p99 {:.2} ms ({} requests)",
            ms(percentile(&o.latencies, 0.5)),
            ms(percentile(&o.latencies, 0.99)),
            o.ok()
        );
    }

    fn to_json(&self) -> Value {
        json!({
            "pods": APPLY_PODS,
            "apply": self.apply.to_json(),
            "merge_patch": self.merge.to_json(),
            "apply_to_merge": self.ratio(),
            "openapi_v2_protobuf": self.openapi_v2_proto.to_json(),
        })
    }
}

async fn apply(endpoint: &Endpoint, pod: &PodTemplate, config: &Config) -> Result<ApplyRun> {
    let clients = 16;
    let requests = config.creates;
    progress(&format!(
        "apply: {APPLY_PODS} pods, then {requests} applies and as many merge patches, {clients} clients"
    ));
    let path = |i: usize| format!("/api/v1/namespaces/default/pods/apply-{}?fieldManager=bench", i % APPLY_PODS);
    // The whole pod, with label `rev` set to the request's number: the object changes every time.
    let base: Value = serde_json::from_str(&pod.render("apply"))?;
    let applied = move |i: usize| {
        let mut v = base.clone();
        v["metadata"]["name"] = json!(format!("apply-{}", i % APPLY_PODS));
        v["metadata"]["labels"]["rev"] = json!(i.to_string());
        v.to_string()
    };
    let seed: MakeReq = {
        let applied = applied.clone();
        Arc::new(move |i| Req::patch(path(i), APPLY, applied(i)))
    };
    run_load(endpoint, clients, APPLY_PODS, config.level_limit, (seed, StatusCode::CREATED)).await?;
    let apply_req: MakeReq = Arc::new(move |i| Req::patch(path(i), APPLY, applied(i + APPLY_PODS)));
    let apply = run_load(endpoint, clients, requests, config.level_limit, (apply_req, StatusCode::OK)).await?;
    let merge_req: MakeReq = Arc::new(move |i| {
        let body = json!({"metadata": {"labels": {"rev": format!("m{i}")}}}).to_string();
        Req::patch(format!("/api/v1/namespaces/default/pods/apply-{}", i % APPLY_PODS), MERGE_PATCH, body)
    });
    let merge = run_load(endpoint, clients, requests, config.level_limit, (merge_req, StatusCode::OK)).await?;
    let proto = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let openapi: MakeReq = Arc::new(move |_| Req::get("/openapi/v2", proto));
    // The first request generates the documents; the measured ones are served from memory.
    run_load(endpoint, 1, 1, config.level_limit, (openapi.clone(), StatusCode::OK)).await?;
    let openapi_v2_proto = run_load(endpoint, 1, 50, config.level_limit, (openapi, StatusCode::OK)).await?;
    Ok(ApplyRun { apply, merge, openapi_v2_proto })
}

/// `ok  per s  p50  p99  err` of one load run.
fn load_cells(l: &Load) -> String {
    format!(
        "{:>5}  {:>6.0}  {:>6.2}  {:>6.2}  {:>3}",
        l.ok(),
        l.per_sec(),
        ms(percentile(&l.latencies, 0.5)),
        ms(percentile(&l.latencies, 0.99)),
        l.errors
    )
}

// ----------------------------------------------------------------------------------------------
// Authorization

const AUTHZ_NAMESPACE: &str = "bench-authz";
const AUTHZ_CLIENTS: usize = 16;

/// Creates by a user allowed through RBAC, against the same with authorization switched off.
struct AuthzRun {
    rbac: Vec<Load>,
    allow: Vec<Load>,
}

impl AuthzRun {
    fn per_sec(loads: &[Load]) -> f64 {
        let ok: usize = loads.iter().map(Load::ok).sum();
        let secs: f64 = loads.iter().map(|l| l.elapsed.as_secs_f64()).sum();
        ok as f64 / secs.max(f64::EPSILON)
    }

    fn server_cpu_us(loads: &[Load]) -> f64 {
        let ok: usize = loads.iter().map(Load::ok).sum();
        loads.iter().map(|l| l.server_cpu.as_secs_f64()).sum::<f64>() * 1e6 / ok.max(1) as f64
    }

    fn ratio(&self) -> f64 {
        Self::per_sec(&self.rbac) / Self::per_sec(&self.allow).max(f64::EPSILON)
    }

    fn table(&self, t: &mut String, config: &Config) {
        let _ = writeln!(
            t,
            "\nauthorization: {AUTHZ_CLIENTS} clients creating pods as a user bound to `edit`, {} other bindings",
            config.authz_bindings
        );
        let _ = writeln!(t, "                      ok   per s  p50 ms  p99 ms  err   server CPU us/req");
        for (name, loads) in [("RBAC", &self.rbac), ("AlwaysAllow", &self.allow)] {
            for l in loads.iter() {
                let _ = writeln!(t, "  {name:<12}  {}   {:>8.0}", load_cells(l), l.cpu_us(l.server_cpu));
            }
        }
        let _ = writeln!(
            t,
            "  RBAC / AlwaysAllow throughput {:.3}x; server CPU per request {:.0} / {:.0} us",
            self.ratio(),
            Self::server_cpu_us(&self.rbac),
            Self::server_cpu_us(&self.allow)
        );
    }

    fn to_json(&self, config: &Config) -> Value {
        json!({
            "clients": AUTHZ_CLIENTS,
            "other_bindings": config.authz_bindings,
            "rbac": self.rbac.iter().map(Load::to_json).collect::<Vec<_>>(),
            "always_allow": self.allow.iter().map(Load::to_json).collect::<Vec<_>>(),
            "rbac_per_sec": Self::per_sec(&self.rbac),
            "always_allow_per_sec": Self::per_sec(&self.allow),
            "ratio": self.ratio(),
        })
    }
}

/// A server ready for the authorization runs: the namespace with its `default` service account,
/// `other` bindings of other users to `view`, and the endpoint of user `bench`, bound to `edit`.
async fn authz_server(mode: &str, others: usize) -> Result<(Cairn, Endpoint)> {
    let cairn = Cairn::start(&["--disable-agent", "--authorization-mode", mode]).await?;
    let mut admin = cairn.endpoint.connect().await?;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AUTHZ_NAMESPACE}});
    admin.expect(Req::post("/api/v1/namespaces", namespace.to_string()), StatusCode::CREATED).await?;
    let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{AUTHZ_NAMESPACE}/rolebindings");
    let binding = |name: String, user: String, role: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        })
        .to_string()
    };
    let filler = {
        let path = path.clone();
        move |i| Req::post(path.clone(), binding(format!("other-{i}"), format!("someone-{i}"), "view"))
    };
    let made =
        run_load(&cairn.endpoint, AUTHZ_CLIENTS, others, START_TIMEOUT * 4, (Arc::new(filler), StatusCode::CREATED))
            .await?;
    if made.ok() != others {
        bail!("made {} of {others} bindings: {:?}", made.ok(), made.first_error);
    }
    admin.expect(Req::post(path, binding("bench-edit".into(), "bench".into(), "edit")), StatusCode::CREATED).await?;

    let kubeconfig = cairn.dir.path().join("bench-user.yaml");
    let out = Command::new(binary::cairn_bin())
        .args(["kubeconfig", "--user", "bench", "--server", &format!("https://{}", cairn.endpoint.addr)])
        .arg("--data-dir")
        .arg(cairn.dir.path().join("data"))
        .output()?;
    if !out.status.success() {
        bail!("cairn kubeconfig: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write(&kubeconfig, &out.stdout)?;
    let user = Endpoint::from_kubeconfig(&kubeconfig, cairn.pid())?;
    // Ready once the namespace's service account exists and `edit` has its aggregated rules.
    let mut conn = user.connect().await?;
    let deadline = Instant::now() + START_TIMEOUT;
    let account = format!("/api/v1/namespaces/{AUTHZ_NAMESPACE}/serviceaccounts/default");
    while !(conn.send(Req::get(account.clone(), JSON)).await?.0.is_success()) {
        if Instant::now() > deadline {
            bail!("user bench cannot read {account} on the {mode} server");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((cairn, user))
}

async fn authorization(pod: &PodTemplate, config: &Config) -> Result<AuthzRun> {
    progress(&format!("authorization: two servers, {} bindings each", config.authz_bindings));
    let (rbac_server, rbac) = authz_server("Node,RBAC", config.authz_bindings).await?;
    let (allow_server, allow) = authz_server("AlwaysAllow", config.authz_bindings).await?;
    let mut run = AuthzRun { rbac: Vec::new(), allow: Vec::new() };
    for round in 0..2 {
        for (name, endpoint, out) in [("rbac", &rbac, &mut run.rbac), ("allow", &allow, &mut run.allow)] {
            progress(&format!("authorization: {name}, round {}", round + 1));
            let names: Names = Arc::new(move |i| format!("authz-{round}-{i}"));
            let creates = cairn_create(pod, AUTHZ_NAMESPACE, names);
            out.push(run_load(endpoint, AUTHZ_CLIENTS, config.authz_creates, config.level_limit, creates).await?);
        }
    }
    drop((rbac_server, allow_server));
    Ok(run)
}
