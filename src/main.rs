//! cairn: a single-binary, all-in-one Kubernetes-style edge cluster.

mod agent;
mod api;
mod cgroups;
mod client;
mod controllers;
mod cron;
mod csi;
mod devices;
mod dns;
mod events;
mod join;
mod labels;
mod memory;
mod net;
mod node;
#[allow(dead_code)] // wired by server.rs
mod proxy;
mod registry;
mod runtime;
mod scheduler;
mod scheduling;
mod server;
mod store;
mod streaming;
mod volumes;

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use clap::{Args, Parser, Subcommand};

/// A single-binary Kubernetes-compatible cluster for edge devices, labs and CI.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, about, long_about = None, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the API server with its store and controllers.
    Server(Box<ServerArgs>),
    /// Run a node that joins a server (`--server URL --token T`)
    Agent(Box<AgentArgs>),
    /// Inspect the node's container runtime (a small crictl): pods, ps, images, logs.
    Ctr(CtrArgs),
    /// Import image tarballs into the node's containerd.
    Images(ImagesArgs),
    /// Benchmarks against a running node.
    Bench(BenchArgs),
    /// Run cairn's hostpath CSI driver as a separate process, as an external driver runs
    CsiHostpath(CsiHostpathArgs),
    /// Report what this machine lacks to run cairn's node agent (kernel, cgroups, programs)
    CheckConfig,
    /// Print a kubeconfig for a user, with a new client certificate from the cluster CA (run on
    /// the server, as its user); what the user may do is up to RBAC
    Kubeconfig(KubeconfigArgs),
    /// Move a cluster between datastores
    #[command(subcommand)]
    Datastore(DatastoreCommand),
}

#[derive(Subcommand, Debug)]
enum DatastoreCommand {
    /// Copy every object of the embedded store into an etcd cairn has not used (the server must be
    /// stopped); then start it with --datastore-endpoint and the same --data-dir
    Migrate(MigrateArgs),
}

#[derive(Args, Debug)]
struct MigrateArgs {
    /// The server's data directory [default: /var/lib/cairn as root, else ~/.cairn]
    #[arg(long, env = "CAIRN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The etcd to copy into: comma-separated http:// or https:// URLs of its members (etcd:// is
    /// taken as http://)
    #[arg(long)]
    to: String,
    #[command(flatten)]
    datastore_tls: DatastoreTls,
}

/// TLS for etcd (k3s's flag names).
#[derive(Args, Debug, Clone)]
struct DatastoreTls {
    /// CA certificate that etcd's serving certificates are checked against
    #[arg(long)]
    datastore_cafile: Option<PathBuf>,
    /// Client certificate presented to etcd
    #[arg(long)]
    datastore_certfile: Option<PathBuf>,
    /// Key of the client certificate presented to etcd
    #[arg(long)]
    datastore_keyfile: Option<PathBuf>,
}

impl DatastoreTls {
    /// The etcd of `endpoints` reached with these files.
    fn etcd(&self, endpoints: Vec<String>) -> store::etcd::Config {
        store::etcd::Config {
            endpoints,
            ca_file: self.datastore_cafile.clone(),
            cert_file: self.datastore_certfile.clone(),
            key_file: self.datastore_keyfile.clone(),
            prefix: store::etcd::DEFAULT_PREFIX.into(),
        }
    }
}

#[derive(Args, Debug)]
struct KubeconfigArgs {
    /// The user's name (the certificate's common name)
    #[arg(long)]
    user: String,
    /// A group the user is in (the certificate's organization)
    #[arg(long)]
    group: Option<String>,
    /// The server's data directory [default: /var/lib/cairn as root, else ~/.cairn]
    #[arg(long, env = "CAIRN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The API server's URL the kubeconfig points at
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    server: String,
}

#[derive(Args, Debug)]
struct CsiHostpathArgs {
    /// The CSI socket to serve, e.g. unix:///var/lib/kubelet/plugins/hostpath.csi.cairn.io/csi.sock
    #[arg(long)]
    endpoint: String,
    /// The driver's name (the provisioner of its StorageClasses)
    #[arg(long, default_value = "hostpath.csi.cairn.io")]
    driver_name: String,
    /// The node's name: the driver's node ID and its volumes' topology [default: the hostname]
    #[arg(long, env = "CAIRN_NODE_NAME")]
    node_id: Option<String>,
    /// Where volumes are made
    #[arg(long)]
    storage_path: PathBuf,
    /// Register with the node through this plugins_registry directory (node-driver-registrar's job),
    /// e.g. /var/lib/kubelet/plugins_registry
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// Offer ControllerPublish/Unpublish, so that volumes are attached to the node before they are
    /// staged (give the driver's CSIDriver `attachRequired: true`)
    #[arg(long)]
    enable_attach: bool,
    /// The most volumes of this driver one node takes (0: no limit)
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,
    /// Log filter
    #[arg(long, env = "CAIRN_LOG", default_value = "info")]
    log: String,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Pod start-up through the raw CRI path (RunPodSandbox + CreateContainer + StartContainer); prints JSON lines
    Cri {
        /// Image of the pods' container (already in the runtime)
        #[arg(long)]
        image: String,
        /// Command of the pods' container
        #[arg(long, num_args = 1.., default_values = ["/bin/sleep", "3600"])]
        command: Vec<String>,
        /// Pods per scenario
        #[arg(long, default_value_t = 50)]
        pods: usize,
        /// Pods started at once in the parallel scenario
        #[arg(long, default_value_t = 10)]
        parallel: usize,
    },
}

/// Where helper commands find the runtime.
#[derive(Args, Debug, Clone)]
struct RuntimeArgs {
    /// cairn's data directory, whose embedded containerd to ask
    #[arg(short = 'd', long, env = "CAIRN_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Ask this CRI/containerd socket instead, e.g. unix:///run/containerd/containerd.sock
    #[arg(long, global = true)]
    container_runtime_endpoint: Option<String>,
}

#[derive(Args, Debug)]
struct CtrArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(subcommand)]
    what: CtrCommand,
}

#[derive(Subcommand, Debug)]
enum CtrCommand {
    /// List pod sandboxes
    Pods,
    /// List containers (running ones unless --all)
    Ps {
        #[arg(short, long)]
        all: bool,
    },
    /// List images
    Images,
    /// Print a container's log
    Logs {
        /// Container ID (a unique prefix is enough)
        id: String,
        /// Only the last N lines
        #[arg(long)]
        tail: Option<usize>,
    },
    /// Run a command in a running container
    Exec {
        /// Container ID
        id: String,
        /// The command and its arguments (after `--`)
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
}

#[derive(Args, Debug)]
struct ImagesArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(subcommand)]
    what: ImagesCommand,
}

#[derive(Subcommand, Debug)]
enum ImagesCommand {
    /// Import OCI layout or `docker save` tarballs (plain, .gz or .zst) into the k8s.io namespace
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// Flags of every node, `cairn server` (with its agent) and `cairn agent` alike. Every flag can also
/// be given in the YAML config file under the same name without dashes (e.g.
/// `kubelet-port: 10250`); flags on the command line win.
#[derive(Args, Debug, Clone)]
struct NodeArgs {
    /// YAML file with flag values [default: /etc/cairn/config.yaml if present]
    #[arg(short = 'c', long, env = "CAIRN_CONFIG_FILE")]
    config: Option<PathBuf>,
    /// Where cairn keeps its state [default: /var/lib/cairn as root, $HOME/.cairn otherwise]
    #[arg(short = 'd', long, env = "CAIRN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// resolv.conf whose resolvers the cluster DNS forwards to and `dnsPolicy: Default` pods get (kubelet's --resolv-conf) [default: /etc/resolv.conf, or systemd-resolved's upstreams when it lists only 127.0.0.53]
    #[arg(long)]
    resolv_conf: Option<PathBuf>,
    /// containerd binary to run [default: `containerd` from PATH]
    #[arg(long)]
    containerd_bin: Option<PathBuf>,
    /// Use this CRI runtime instead of starting containerd, e.g. unix:///run/containerd/containerd.sock
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
    /// Directory of CNI plugins to use instead of cairn's own (with --cni-conf-dir)
    #[arg(long)]
    cni_bin_dir: Option<PathBuf>,
    /// Directory of CNI network configurations to use instead of cairn's own
    #[arg(long)]
    cni_conf_dir: Option<PathBuf>,
    /// Resources held back for the system from pods, e.g. cpu=500m,memory=512Mi
    #[arg(long, default_value = "")]
    system_reserved: String,
    /// Resources held back for cairn itself from pods, e.g. cpu=100m,memory=128Mi
    #[arg(long, default_value = "")]
    kube_reserved: String,
    /// Port of the node agent's /healthz on 127.0.0.1 (0 turns it off)
    #[arg(long, default_value_t = 10248)]
    healthz_port: u16,
    /// Devices to offer as a resource, one unit per matching device node, e.g.
    /// cairn.io/serial=/dev/ttyUSB* (repeatable)
    #[arg(long = "device", value_name = "RESOURCE=GLOB")]
    devices: Vec<String>,
    /// Do not look for NVIDIA GPUs (found GPUs are offered as nvidia.com/gpu)
    #[arg(long)]
    disable_gpu: bool,
    /// Where GPU discovery looks for dev/, proc/ and the driver's files (tests point it at a fake tree)
    #[arg(long, default_value = "/", hide = true)]
    gpu_discovery_root: PathBuf,
    /// Port of the node's HTTPS endpoint (container logs) that the API server calls; 0 picks a free one
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// Name of this node [default: the hostname]
    #[arg(long, env = "CAIRN_NODE_NAME")]
    node_name: Option<String>,
    /// kubelet's root directory (its --root-dir): plugins_registry/, plugins/ [default: /var/lib/kubelet as root, <data-dir>/agent/kubelet otherwise]
    #[arg(long)]
    kubelet_root_dir: Option<PathBuf>,
    /// kubelet's --cgroup-root: the cgroup pods go under (as `<root>/kubepods`); agents sharing a machine each need their own
    #[arg(long, default_value = "/")]
    cgroup_root: String,
    /// Where the built-in local-path class makes its volumes [default: <data-dir>/storage]
    #[arg(long)]
    default_local_storage_path: Option<PathBuf>,
    /// Log filter, e.g. `info` or `cairn=debug`
    #[arg(long, env = "CAIRN_LOG", default_value = "info")]
    log: String,
    /// Directory of static pod manifests, run here without the scheduler, with mirror pods in the API (kubelet's --pod-manifest-path) [default: <data-dir>/agent/pod-manifests]
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// IPv4 address to advertise for this node (its InternalIP) [default: the host's first address]
    #[arg(long)]
    node_ip: Option<IpAddr>,
    /// Percent of the image filesystem in use from which unused images are removed (kubelet's flag)
    #[arg(long, default_value_t = 85)]
    image_gc_high_threshold: u8,
    /// Percent of the image filesystem in use that image garbage collection frees down to
    #[arg(long, default_value_t = 80)]
    image_gc_low_threshold: u8,
    /// Minimum age of an unused image before it may be removed
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    image_minimum_gc_age: std::time::Duration,
    /// Let image garbage collection remove the images of the air-gap folder too (an air-gapped node cannot get them back)
    #[arg(long)]
    image_gc_air_gapped_images: bool,
    /// How often image garbage collection looks at the images (tests shorten kubelet's five minutes)
    #[arg(long, default_value = "5m", value_parser = parse_duration, hide = true)]
    image_gc_period: std::time::Duration,
    /// Eviction thresholds that if met evict a pod at once, e.g. memory.available<1Gi (kubelet's flag; setting it replaces all the defaults)
    #[arg(long, default_value = agent::eviction::thresholds::DEFAULT_HARD)]
    eviction_hard: String,
    /// Eviction thresholds that if met over their grace period evict a pod, e.g. memory.available<1.5Gi
    #[arg(long, default_value = "")]
    eviction_soft: String,
    /// Grace periods of the soft eviction thresholds, e.g. memory.available=1m30s
    #[arg(long, default_value = "")]
    eviction_soft_grace_period: String,
    /// What eviction frees beyond a threshold once it is met, e.g. imagefs.available=2Gi
    #[arg(long, default_value = "")]
    eviction_minimum_reclaim: String,
    /// The most grace, in seconds, a pod evicted for a soft threshold gets (0: its own)
    #[arg(long, default_value_t = 0)]
    eviction_max_pod_grace_period: i64,
    /// How long a pressure condition stays after the pressure is gone
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    eviction_pressure_transition_period: std::time::Duration,
    /// Evict pods over their ephemeral-storage limits or an emptyDir's sizeLimit (kubelet's localStorageCapacityIsolation)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    local_storage_capacity_isolation: bool,
}

/// Flags of `cairn agent`, a node joining a server.
#[derive(Args, Debug, Clone)]
struct AgentArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The server to join, e.g. https://10.0.0.1:6443; several servers of one cluster
    /// comma-separated, the next used when one cannot be reached
    #[arg(short = 's', long, env = "CAIRN_URL")]
    server: String,
    /// The join token: the full K10<sha256 of the CA>::server:<secret> from the server's <data-dir>/server/token (a bare secret works too, without checking the server's CA)
    #[arg(short = 't', long, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the token
    #[arg(long, env = "CAIRN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

/// Flags of `cairn server`. Every flag can also be given in the YAML config file under the same
/// name without dashes (e.g. `write-kubeconfig-mode: "0644"`); flags on the command line win.
#[derive(Args, Debug, Clone)]
struct ServerArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Address the API listens on
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: IpAddr,
    /// HTTPS port of the API (0 picks a free one)
    #[arg(long, default_value_t = 6443)]
    https_listen_port: u16,
    /// Where to write the admin kubeconfig [default: /etc/cairn/cairn.yaml as root, <data-dir>/kubeconfig.yaml otherwise]
    #[arg(short = 'o', long, env = "CAIRN_KUBECONFIG_OUTPUT")]
    write_kubeconfig: Option<PathBuf>,
    /// File mode of the kubeconfig, octal
    #[arg(long, env = "CAIRN_KUBECONFIG_MODE", default_value = "0600")]
    write_kubeconfig_mode: String,
    /// Extra hostname or IP for the serving certificate (repeatable)
    #[arg(long = "tls-san")]
    tls_san: Vec<String>,
    /// The join token: a secret, or the full K10<sha256 of the CA>::server:<secret> [default: generated; the full token is written to <data-dir>/server/token]
    #[arg(short = 't', long, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the token
    #[arg(long, env = "CAIRN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Do not run the node agent in this process
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    disable_agent: bool,
    /// Do not run the scheduler in this process
    #[arg(long)]
    disable_scheduler: bool,
    /// Do not run the service proxy (kube-proxy's job) on this node
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    disable_kube_proxy: bool,
    /// Built-in components not to run: coredns (the cluster DNS), servicelb (the load balancer)
    #[arg(long, value_delimiter = ',')]
    disable: Vec<String>,
    /// Address of the cluster DNS, in the service CIDR (kubelet's --cluster-dns) [default: the
    /// service CIDR's 10th address, 10.43.0.10]
    #[arg(long)]
    cluster_dns: Option<std::net::Ipv4Addr>,
    /// Domain of the cluster (kubelet's --cluster-domain)
    #[arg(long, default_value = dns::DEFAULT_DOMAIN)]
    cluster_domain: String,
    /// KubeSchedulerConfiguration file (kubescheduler.config.k8s.io/v1): profiles, plugins, weights
    #[arg(long)]
    scheduler_config: Option<PathBuf>,
    /// Authorizers asked in order, the first to allow deciding: Node, RBAC, AlwaysAllow, AlwaysDeny
    /// (kube-apiserver's --authorization-mode)
    #[arg(long, default_value = "Node,RBAC")]
    authorization_mode: api::authz::Modes,
    /// Pod network of the cluster
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: String,
    /// How nodes reach each other's pods: auto (direct routes to nodes on a shared network, VXLAN
    /// to the others), host-gw (direct routes only), vxlan (VXLAN to all), none
    #[arg(long, value_enum, default_value_t = net::routes::Backend::Auto)]
    flannel_backend: net::routes::Backend,
    /// Network of the Services' cluster IPs; its first address is the `kubernetes` Service's
    #[arg(long, default_value = "10.43.0.0/16")]
    service_cidr: String,
    /// Port range of the Services' node ports
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Upper bound of the store's page cache, in MiB
    #[arg(long, default_value_t = 16)]
    store_cache_mib: u64,
    /// kube-controller-manager's: how long a node may send no heartbeat before it is Unknown, tainted and its pods evicted
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    node_monitor_grace_period: std::time::Duration,
    /// A server of the cluster to join: this server then keeps the cluster in the same etcd (with
    /// its own --datastore-cafile/-certfile/-keyfile, if etcd wants them), with the same CA and keys
    /// (needs --token, that server's)
    #[arg(short = 's', long, env = "CAIRN_URL")]
    server: Option<String>,
    /// etcd to keep the cluster in instead of the embedded store: comma-separated http:// or https://
    /// URLs of its members (k3s's flag)
    #[arg(long, env = "CAIRN_DATASTORE_ENDPOINT")]
    datastore_endpoint: Option<String>,
    #[command(flatten)]
    datastore_tls: DatastoreTls,
    /// The issuer (`iss`) of service account tokens, and of their OIDC discovery document
    #[arg(long, default_value = api::sa_token::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// The audiences the API accepts in service account tokens, comma-separated [default: the issuer]
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// The longest lifetime a requested service account token gets (e.g. 24h) [default: no limit]
    #[arg(long, value_parser = parse_duration)]
    service_account_max_token_expiration: Option<std::time::Duration>,
    /// Give the tokens of pods' kube-api-access volumes a year's life, with a warning time at
    /// their requested hour, for clients that never reread them (kube-apiserver's default)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    service_account_extend_token_expiration: bool,
}

/// A duration as Kubernetes flags take it: `50s`, `1m30s`, `500ms`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let invalid = || format!("invalid duration {s:?}: give it as e.g. 50s, 1m30s or 500ms");
    let d: k8s_openapi::jiff::SignedDuration = s.parse().map_err(|_| invalid())?;
    std::time::Duration::try_from(d).map_err(|_| invalid())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Reads a YAML config file into command-line arguments (`key: value` → `--key value`).
fn config_args(path: &std::path::Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the config file {}", path.display()))?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("the config file {} is not valid YAML", path.display()))?;
    let mut args = Vec::new();
    let serde_yaml::Value::Mapping(map) = doc else {
        if doc.is_null() {
            return Ok(args);
        }
        anyhow::bail!("the config file {} must be a YAML mapping of flag names to values", path.display());
    };
    for (k, v) in map {
        let key = k.as_str().with_context(|| format!("a key in {} is not a string", path.display()))?.to_string();
        let values = match v {
            serde_yaml::Value::Sequence(items) => items,
            other => vec![other],
        };
        for value in values {
            let text = match value {
                serde_yaml::Value::String(s) => s,
                serde_yaml::Value::Bool(b) => b.to_string(),
                serde_yaml::Value::Number(n) => n.to_string(),
                _ => anyhow::bail!("the value of {key:?} in {} must be a string, number or boolean", path.display()),
            };
            args.push(format!("--{key}={text}"));
        }
    }
    Ok(args)
}

/// Re-parses the command line with the config file's values in front, so command-line flags win.
/// `subcommand` is the command's name (`server`, `agent`); `pick` takes its flags back out.
fn with_config_file<A>(
    config: Option<&PathBuf>,
    args: A,
    subcommand: &str,
    pick: fn(Command) -> Option<A>,
) -> Result<A> {
    let path = match config {
        Some(p) => p.clone(),
        None => {
            let default = PathBuf::from("/etc/cairn/config.yaml");
            if !default.exists() {
                return Ok(args);
            }
            default
        }
    };
    let mut argv: Vec<String> = std::env::args().collect();
    let pos = argv.iter().position(|a| a == subcommand).map_or(argv.len(), |p| p + 1);
    let extra = config_args(&path)?;
    argv.splice(pos..pos, extra);
    match Cli::try_parse_from(argv) {
        Ok(Cli { command }) => {
            pick(command).with_context(|| format!("the config file {} changed the command", path.display()))
        }
        Err(e) => anyhow::bail!("in the config file {}: {e}", path.display()),
    }
}

/// Reads `--token`, else `--token-file`.
fn token_of(token: &Option<String>, file: &Option<PathBuf>) -> Result<Option<String>> {
    let token = match (token, file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading --token-file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        anyhow::bail!("--token must not be empty");
    }
    Ok(token)
}

fn node_name_of(args: &NodeArgs) -> String {
    args.node_name
        .clone()
        .or_else(|| hostname::get().ok().and_then(|h| h.into_string().ok()))
        .unwrap_or_else(|| "cairn".into())
        .to_lowercase()
}

/// Parses `--cluster-cidr` as the IPv4 network the nodes' pod ranges come from.
fn parse_cluster_cidr(text: &str) -> Result<net::Cidr> {
    Ok(text
        .parse::<net::Cidr>()
        .ok()
        .filter(|c| c.prefix <= 30)
        .with_context(|| {
            format!("invalid cluster-cidr {text:?} for the pod network: expected an IPv4 CIDR of /30 or larger such as 10.42.0.0/16")
        })?
        .net())
}

/// Checks the node flags that need no machine to check.
fn check_node_flags(args: &NodeArgs) -> Result<()> {
    if args.cni_bin_dir.is_some() != args.cni_conf_dir.is_some() {
        anyhow::bail!("--cni-bin-dir and --cni-conf-dir go together: give both to use your own CNI plugins");
    }
    reserved_of(args)?;
    devices_of(args)?;
    Ok(())
}

fn devices_of(args: &NodeArgs) -> Result<Vec<devices::generic::DeviceGlob>> {
    args.devices.iter().map(|d| d.parse()).collect::<Result<Vec<_>, String>>().map_err(anyhow::Error::msg)
}

/// `--system-reserved` plus `--kube-reserved`.
fn reserved_of(args: &NodeArgs) -> Result<agent::node::Reserved> {
    let reserved = |flag: &str, value: &str| {
        agent::node::Reserved::parse(value).map_err(|e| anyhow::anyhow!("invalid --{flag} {value:?}: {e}"))
    };
    Ok(reserved("system-reserved", &args.system_reserved)?.plus(&reserved("kube-reserved", &args.kube_reserved)?))
}

/// The node's own settings from its flags; checks that its runtime can start at all.
fn node_config(args: &NodeArgs, cluster_cidr: net::Cidr, control_plane: bool) -> Result<node::NodeConfig> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    check_node_flags(args)?;
    let gpus = (!args.disable_gpu).then(|| devices::nvidia::Gpus::discover(&args.gpu_discovery_root)).flatten();
    if let Some(g) = &gpus {
        let models: Vec<&str> = g.gpus.iter().map(|g| g.model.as_deref().unwrap_or("unknown model")).collect();
        let runtimes: Vec<&str> = g.runtimes.iter().map(|(handler, _)| handler.as_str()).collect();
        tracing::info!(
            "found {} NVIDIA GPU(s): {}; container runtime handlers: {}",
            g.gpus.len(),
            models.join(", "),
            if runtimes.is_empty() {
                "none (nvidia-container-runtime not installed)".into()
            } else {
                runtimes.join(", ")
            }
        );
    }
    let runtime = runtime::Config {
        data_dir: data_dir.clone(),
        containerd_bin: args.containerd_bin.clone(),
        endpoint: args.container_runtime_endpoint.clone(),
        cni_bin_dir: args.cni_bin_dir.clone(),
        cni_conf_dir: args.cni_conf_dir.clone(),
        cluster_cidr,
        pod_cidr: None,
        runtimes: gpus.as_ref().map(|g| g.runtimes.clone()).unwrap_or_default(),
    };
    runtime.check()?;
    let reserved = reserved_of(args)?;
    let kubelet_root_dir = args.kubelet_root_dir.clone().unwrap_or_else(|| {
        if is_root() { PathBuf::from("/var/lib/kubelet") } else { data_dir.join("agent").join("kubelet") }
    });
    let local_storage_path = args.default_local_storage_path.clone().unwrap_or_else(|| data_dir.join("storage"));
    let devices = devices_of(args)?;
    let pod_manifest_path =
        args.pod_manifest_path.clone().unwrap_or_else(|| data_dir.join("agent").join("pod-manifests"));
    let image_gc = agent::image_gc::Policy {
        high_percent: args.image_gc_high_threshold,
        low_percent: args.image_gc_low_threshold,
        min_age: args.image_minimum_gc_age,
        air_gapped: args.image_gc_air_gapped_images,
        period: args.image_gc_period.max(std::time::Duration::from_secs(1)),
    };
    image_gc.validate().map_err(|e| anyhow::anyhow!("--image-gc-high-threshold/--image-gc-low-threshold: {e}"))?;
    let eviction = agent::eviction::Config {
        thresholds: agent::eviction::thresholds::parse(
            &args.eviction_hard,
            &args.eviction_soft,
            &args.eviction_soft_grace_period,
            &args.eviction_minimum_reclaim,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?,
        pressure_transition: args.eviction_pressure_transition_period,
        max_pod_grace: args.eviction_max_pod_grace_period,
        local_storage_isolation: args.local_storage_capacity_isolation,
    };
    let node_ips = match args.node_ip {
        Some(ip) => vec![ip],
        None => node::local_ips(Some(&runtime.network().bridge)),
    };
    Ok(node::NodeConfig {
        node_name: node_name_of(args),
        data_dir,
        node_ips,
        runtime,
        reserved,
        healthz_port: args.healthz_port,
        kubelet_port: args.kubelet_port,
        devices,
        gpus,
        kubelet_root_dir,
        cgroup_root: args.cgroup_root.clone(),
        local_storage_path,
        resolv_conf: args.resolv_conf.clone(),
        control_plane,
        pod_manifest_path,
        image_gc,
        eviction,
    })
}

fn server_config(args: ServerArgs) -> Result<server::ServerConfig> {
    let data_dir = args.node.data_dir.clone().unwrap_or_else(default_data_dir);
    let write_kubeconfig = args.write_kubeconfig.clone().unwrap_or_else(|| {
        if is_root() { PathBuf::from("/etc/cairn/cairn.yaml") } else { data_dir.join("kubeconfig.yaml") }
    });
    let token = token_of(&args.token, &args.token_file)?;
    if args.server.is_some() && token.is_none() {
        anyhow::bail!("joining the server at --server needs its token: give --token or --token-file");
    }
    let join = args.server.as_ref().map(|s| server::JoinServer {
        url: s.trim_end_matches('/').to_string(),
        datastore: args.datastore_tls.etcd(Vec::new()),
    });
    let scheduler = match (args.disable_scheduler, &args.scheduler_config) {
        (true, _) => None,
        (false, Some(path)) => Some(scheduler::Config::load(path)?),
        (false, None) => Some(scheduler::Config::default()),
    };
    let cidr_ok = args
        .cluster_cidr
        .split_once('/')
        .is_some_and(|(ip, bits)| ip.parse::<IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 128));
    if !cidr_ok {
        anyhow::bail!("invalid cluster-cidr {:?}: expected a CIDR such as 10.42.0.0/16", args.cluster_cidr);
    }
    let service_ranges = registry::ServiceRanges {
        cidr: args
            .service_cidr
            .parse::<net::Cidr>()
            .ok()
            .filter(|c| (8..=30).contains(&c.prefix))
            .with_context(|| {
                format!(
                    "invalid service-cidr {:?}: expected an IPv4 CIDR between /8 and /30 such as 10.43.0.0/16",
                    args.service_cidr
                )
            })?
            .net(),
        node_ports: args
            .service_node_port_range
            .split_once('-')
            .and_then(|(lo, hi)| Some((lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?)))
            .filter(|(lo, hi)| lo <= hi && *lo > 0)
            .with_context(|| {
                format!(
                    "invalid service-node-port-range {:?}: expected a range of ports such as 30000-32767",
                    args.service_node_port_range
                )
            })?,
    };
    for component in &args.disable {
        if !["coredns", "servicelb"].contains(&component.as_str()) {
            anyhow::bail!("invalid --disable {component:?}: cairn's built-in components are coredns and servicelb");
        }
    }
    // k3s's default: the service CIDR's 10th address.
    let cluster_dns =
        args.cluster_dns.unwrap_or_else(|| std::net::Ipv4Addr::from(u32::from(service_ranges.cidr.network()) + 10));
    if !service_ranges.cidr.contains(cluster_dns) {
        anyhow::bail!(
            "invalid cluster-dns {}: it must be in the service CIDR {}",
            cluster_dns,
            service_ranges.cidr.net()
        );
    }
    let validation_errors = registry::validation::is_dns1123_subdomain(&args.cluster_domain);
    if !validation_errors.is_empty() {
        anyhow::bail!("invalid cluster-domain {:?}: {}", args.cluster_domain, validation_errors.join("; "));
    }
    let cluster_cidr = args.cluster_cidr.parse::<net::Cidr>().ok().map(net::Cidr::net);
    let services = server::ServicesConfig {
        ranges: service_ranges,
        cluster_dns,
        cluster_domain: args.cluster_domain.clone(),
        dns: !args.disable.iter().any(|c| c == "coredns"),
        servicelb: !args.disable.iter().any(|c| c == "servicelb"),
        proxy: !args.disable_kube_proxy,
    };
    let node = if args.disable_agent {
        // The node's flags are checked all the same: a config file shared with agents stays valid.
        check_node_flags(&args.node)?;
        None
    } else {
        // The node's pod network is IPv4: a /24 of the cluster CIDR, or all of it when smaller.
        Some(node_config(&args.node, parse_cluster_cidr(&args.cluster_cidr)?, true)?)
    };
    Ok(server::ServerConfig {
        services,
        node,
        scheduler,
        data_dir,
        bind_address: args.bind_address,
        https_listen_port: args.https_listen_port,
        write_kubeconfig,
        write_kubeconfig_mode: server::parse_mode(&args.write_kubeconfig_mode)?,
        tls_san: args.tls_san.clone(),
        token,
        node_monitor_grace_period: args.node_monitor_grace_period,
        cluster_cidr,
        flannel_backend: args.flannel_backend,
        authorization: args.authorization_mode.clone(),
        service_account_issuer: args.service_account_issuer.clone(),
        join,
        datastore: match &args.datastore_endpoint {
            None => None,
            Some(endpoints) => Some(
                args.datastore_tls.etcd(
                    store::etcd::Config::parse_endpoints(endpoints)
                        .map_err(|e| anyhow::anyhow!("invalid --datastore-endpoint: {e}"))?,
                ),
            ),
        },
        token_policy: registry::token_request::TokenPolicy {
            audiences: args.api_audiences.iter().filter(|a| !a.is_empty()).cloned().collect(),
            max_expiration_seconds: args.service_account_max_token_expiration.map(|d| d.as_secs() as i64),
            extend_expiration: args.service_account_extend_token_expiration,
        },
        node_name: node_name_of(&args.node),
        store_cache_mib: args.store_cache_mib,
    })
}

fn agent_config(args: AgentArgs) -> Result<join::AgentConfig> {
    let token = token_of(&args.token, &args.token_file)?
        .context("a joining node needs the server's token: give --token or --token-file (CAIRN_TOKEN)")?;
    let token = api::pki::JoinToken::parse(&token).map_err(|e| anyhow::anyhow!("invalid --token: {e}"))?;
    let servers: Vec<String> =
        args.server.split(',').map(|s| s.trim().trim_end_matches('/').to_string()).filter(|s| !s.is_empty()).collect();
    if let Some(bad) = servers.iter().find(|s| !s.starts_with("https://")) {
        anyhow::bail!("invalid --server {bad:?}: expected the server's HTTPS URL, such as https://10.0.0.1:6443");
    }
    if servers.is_empty() {
        anyhow::bail!("--server is empty: give the server's HTTPS URL, such as https://10.0.0.1:6443");
    }
    // The cluster CIDR is the server's; the node takes the range the server gives it.
    let node = node_config(&args.node, parse_cluster_cidr("10.42.0.0/16")?, false)?;
    Ok(join::AgentConfig { server: servers[0].clone(), servers, token, node })
}

fn init_logging(filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    // containerd runs this same binary as the pod network's CNI plugin.
    if net::is_cni_invocation() {
        return std::process::ExitCode::from(u8::try_from(net::plugin_main()).unwrap_or(1));
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => run_server(*args),
        Command::Agent(args) => run_agent(*args),
        Command::Ctr(args) => run_ctr(args),
        Command::Images(args) => run_images(args),
        Command::Bench(args) => run_bench(args),
        Command::CsiHostpath(args) => run_csi_hostpath(args),
        Command::Kubeconfig(args) => run_kubeconfig(args),
        Command::Datastore(DatastoreCommand::Migrate(args)) => run_migrate(args),
        Command::CheckConfig => {
            let items = runtime::check_config::report(&runtime::check_config::Kernel::read(std::path::Path::new("/")));
            return if runtime::check_config::print(&items) {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            };
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_migrate(args: MigrateArgs) -> Result<()> {
    init_logging("info");
    let to = args.to.replace("etcd://", "http://");
    let target = args
        .datastore_tls
        .etcd(store::etcd::Config::parse_endpoints(&to).map_err(|e| anyhow::anyhow!("invalid --to: {e}"))?);
    let db = args.data_dir.unwrap_or_else(default_data_dir).join("server").join("db");
    if !db.exists() {
        anyhow::bail!("there is no embedded store at {}: give the server's --data-dir", db.display());
    }
    helper_runtime()?.block_on(async {
        let from = store::Store::open(&db, store::Options::default())
            .with_context(|| format!("opening {} (is the server still running?)", db.display()))?;
        let mut shown = 0;
        let copied = store::etcd::migrate(&from, &target, |done, total| {
            if done == total || done >= shown + 500 {
                shown = done;
                eprintln!("copied {done} of {total} objects");
            }
        })
        .await
        .context("copying into etcd")?;
        println!("copied {copied} objects from {} into etcd at {}", db.display(), target.endpoints.join(","));
        Ok(())
    })
}

fn run_kubeconfig(args: KubeconfigArgs) -> Result<()> {
    let tls = args.data_dir.unwrap_or_else(default_data_dir).join("server").join("tls");
    let config = api::pki::user_kubeconfig(&tls, &args.server, &args.user, args.group.as_deref())?;
    print!("{config}");
    Ok(())
}

fn run_csi_hostpath(args: CsiHostpathArgs) -> Result<()> {
    init_logging(&args.log);
    let socket = csi::endpoint_path(&args.endpoint)?;
    let node_id = args
        .node_id
        .or_else(|| hostname::get().ok().and_then(|h| h.into_string().ok()))
        .context("--node-id is needed: the hostname is not readable")?
        .to_lowercase();
    let driver = csi::hostpath::HostPath {
        name: args.driver_name.clone(),
        node_id,
        root: args.storage_path,
        attach: args.enable_attach,
        max_volumes: args.max_volumes_per_node,
    };
    let registration = args.registration_dir.map(|d| d.join(format!("{}-reg.sock", args.driver_name)));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let shutdown = tokio_util::sync::CancellationToken::new();
        csi::hostpath::serve_with_registration(driver, socket.clone(), registration, shutdown.clone())?;
        tracing::info!("CSI driver {} serving on {}", args.driver_name, socket.display());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        shutdown.cancel();
        // Let the servers remove their sockets.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Ok(())
    })
}

fn default_data_dir() -> PathBuf {
    if is_root() {
        PathBuf::from("/var/lib/cairn")
    } else {
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")).join(".cairn")
    }
}

fn helper_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

fn run_ctr(args: CtrArgs) -> Result<()> {
    let data_dir = args.runtime.data_dir.unwrap_or_else(default_data_dir);
    let socket = runtime::helper_socket(&data_dir, args.runtime.container_runtime_endpoint.as_deref())?;
    let query = match args.what {
        CtrCommand::Pods => runtime::ctr::Query::Pods,
        CtrCommand::Ps { all } => runtime::ctr::Query::Containers { all },
        CtrCommand::Images => runtime::ctr::Query::Images,
        CtrCommand::Logs { id, tail } => runtime::ctr::Query::Logs { id, tail },
        CtrCommand::Exec { id, cmd } => runtime::ctr::Query::Exec { id, cmd },
    };
    let out = helper_runtime()?.block_on(runtime::ctr::run(&socket, query))?;
    print!("{out}");
    Ok(())
}

fn run_images(args: ImagesArgs) -> Result<()> {
    init_logging("info");
    let data_dir = args.runtime.data_dir.unwrap_or_else(default_data_dir);
    let socket = runtime::helper_socket(&data_dir, args.runtime.container_runtime_endpoint.as_deref())?;
    let ImagesCommand::Import { files } = args.what;
    helper_runtime()?.block_on(async {
        let channel = runtime::images::connect(&socket).await?;
        let importer = runtime::images::Importer::new(channel);
        let mut failed = 0;
        for file in &files {
            let started = std::time::Instant::now();
            let progress = runtime::images::progress_logger(file);
            let before = importer.stats();
            match importer.import_file(file, &progress).await {
                Ok(images) => {
                    for image in images {
                        println!(
                            "imported {} ({}) from {} in {:.1?}",
                            image.reference,
                            image.digest,
                            file.display(),
                            started.elapsed()
                        );
                    }
                    let after = importer.stats();
                    println!(
                        "  {} blobs written ({:.1} MiB), {} already present",
                        after.blobs_written - before.blobs_written,
                        (after.bytes_written - before.bytes_written) as f64 / 1048576.0,
                        after.blobs_skipped - before.blobs_skipped
                    );
                }
                Err(e) => {
                    eprintln!("cairn: {}: {e:#}", file.display());
                    failed += 1;
                }
            }
        }
        if failed > 0 {
            anyhow::bail!("{failed} of {} files could not be imported", files.len());
        }
        Ok(())
    })
}

fn run_bench(args: BenchArgs) -> Result<()> {
    let data_dir = args.runtime.data_dir.unwrap_or_else(default_data_dir);
    let socket = runtime::helper_socket(&data_dir, args.runtime.container_runtime_endpoint.as_deref())?;
    let BenchCommand::Cri { image, command, pods, parallel } = args.what;
    let plan = runtime::bench::Plan { image, command, pods, parallel };
    let figures =
        helper_runtime()?.block_on(async { runtime::bench::run(&runtime::Cri::new(&socket), &plan).await })?;
    for f in figures {
        println!("{}", serde_json::to_string(&f)?);
    }
    Ok(())
}

fn run_server(args: ServerArgs) -> Result<()> {
    let config = args.node.config.clone();
    let args = with_config_file(config.as_ref(), args, "server", |c| match c {
        Command::Server(a) => Some(*a),
        _ => None,
    })?;
    init_logging(&args.node.log);
    let cfg = server_config(args)?;
    block_on(server::run(cfg))
}

fn run_agent(args: AgentArgs) -> Result<()> {
    let config = args.node.config.clone();
    let args = with_config_file(config.as_ref(), args, "agent", |c| match c {
        Command::Agent(a) => Some(*a),
        _ => None,
    })?;
    init_logging(&args.node.log);
    let cfg = agent_config(args)?;
    block_on(join::run(cfg))
}

/// Runs a long-lived command (server or agent) on two worker threads, which suit the small
/// machines cairn runs on.
fn block_on(run: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_parse_as_kubernetes_flags_take_them() {
        assert_eq!(super::parse_duration("50s"), Ok(Duration::from_secs(50)));
        assert_eq!(super::parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(super::parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(super::parse_duration("-5s").is_err());
        assert!(super::parse_duration("soon").unwrap_err().contains("e.g. 50s"));
    }
}
