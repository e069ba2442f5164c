//! The control loops of kube-controller-manager: namespace lifecycle,
//! default service accounts and the `kube-root-ca.crt` ConfigMaps, garbage collection by owner, event expiry, and storage (the volume
//! binder, in-use protection of claims and volumes, generic ephemeral volumes, attach/detach), and
//! Services' Endpoints, EndpointSlices and the slices mirrored from hand-made Endpoints, and node
//! lifecycle (heartbeats, condition taints, taint-based eviction, pod ranges), ClusterRole
//! aggregation, and the signer of client certificate requests.
//!
//! Each is a [`runtime::Reconciler`] over typed objects, run by [`runtime::run`] on the in-process
//! client (`crate::client`); none reaches into another. Event expiry is a periodic sweep instead (see
//! `event_ttl.rs`), and so is the `kubernetes` Service's endpoints reconciler of servers sharing
//! etcd (`apiserverendpoints.rs`, run by every server, not by [`spawn_all`]). A new controller is a file here with a reconciler and the `Controller` that
//! triggers it (copy `serviceaccount.rs`), started in [`spawn_all`]. The garbage collector is a
//! graph over every kind instead (upstream's is too), fed by kube-runtime watchers of metadata.

pub mod apiserverendpoints;
mod attachdetach;
mod clusterroleaggregation;
mod cronjob;
pub mod csrsigning;
mod daemonset;
mod deployment;
mod disruption;
mod endpoints;
mod endpointslice;
mod endpointslicemirroring;
mod ephemeral;
mod event_ttl;
mod expectations;
mod gc;
mod history;
mod informer;
mod job;
mod namespace;
mod nodeipam;
mod nodelifecycle;
mod ownership;
pub mod persistentvolume;
mod pods;
pub mod protection;
mod replicaset;
mod rootcacert;
pub mod runtime;
mod serviceaccount;
mod servicelb;
mod statefulset;
mod tainteviction;
pub mod tokens;
mod ttl_after_finished;

use k8s_openapi::api::apps::v1::{ControllerRevision, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};

pub use ephemeral::is_for_pod as ephemeral_is_for_pod;
pub use event_ttl::EVENT_TTL;
use tokio_util::sync::CancellationToken;

/// What the controllers are run with.
#[derive(Clone)]
pub struct Options {
    /// Whether the built-in load balancer is one of them (`--disable=servicelb`).
    pub servicelb: bool,
    /// `--node-monitor-grace-period`: how long a node may stay silent before it is Unknown.
    pub node_monitor_grace_period: std::time::Duration,
    /// `--cluster-cidr` (IPv4), whose /24s Nodes get as `spec.podCIDR`; `None`: no allocation.
    pub cluster_cidr: Option<crate::net::Cidr>,
    /// Pod ranges in use that no Node names yet (the in-process agent's).
    pub reserved_pod_ranges: Vec<crate::net::Cidr>,
    /// The cluster CA (PEM), published in every namespace as `kube-root-ca.crt`.
    pub root_ca: String,
    /// Signs client certificates with the cluster CA (the `kube-apiserver-client` signer).
    pub sign_client: std::sync::Arc<csrsigning::Sign>,
    /// Signs the long-lived tokens of `kubernetes.io/service-account-token` Secrets.
    pub mint_token: std::sync::Arc<tokens::Mint>,
}

/// Starts every controller; they stop when `shutdown` fires.
pub fn spawn_all(client: &Client, options: &Options, shutdown: &CancellationToken) {
    // Controllers that follow pods share one watch of every pod.
    let mut pods = informer::Informer::new(Api::<Pod>::all(client.clone()), watcher::Config::default());
    tokio::spawn(runtime::run(
        namespace::controller(client),
        namespace::Namespaces { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        serviceaccount::controller(client),
        serviceaccount::ServiceAccounts { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        rootcacert::controller(client),
        rootcacert::RootCaPublisher { client: client.clone(), ca: options.root_ca.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        csrsigning::controller(client),
        csrsigning::Signer { client: client.clone(), sign: options.sign_client.clone() },
        shutdown.clone(),
    ));
    let (token_secrets, secrets) = tokens::controller(client);
    tokio::spawn(runtime::run(
        token_secrets,
        tokens::Tokens {
            client: client.clone(),
            mint: options.mint_token.clone(),
            ca: options.root_ca.clone(),
            secrets,
        },
        shutdown.clone(),
    ));
    let (aggregation, roles) = clusterroleaggregation::controller(client);
    tokio::spawn(runtime::run(
        aggregation,
        clusterroleaggregation::Aggregation { client: client.clone(), roles },
        shutdown.clone(),
    ));
    persistentvolume::spawn(client, shutdown);
    tokio::spawn(runtime::run(
        protection::claim_controller(client, &mut pods),
        protection::ClaimProtection { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        protection::volume_controller(client),
        protection::VolumeProtection { client: client.clone() },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        ephemeral::controller(&mut pods),
        ephemeral::EphemeralVolumes {
            client: client.clone(),
            recorder: crate::events::Recorder::spawn(client.clone(), "ephemeral_volume".into(), String::new()),
        },
        shutdown.clone(),
    ));
    tokio::spawn(runtime::run(
        attachdetach::controller(client, &mut pods),
        attachdetach::AttachDetach::new(client.clone()),
        shutdown.clone(),
    ));
    tokio::spawn(event_ttl::run(client.clone(), event_ttl::EVENT_TTL, shutdown.clone()));
    tokio::spawn(gc::run(client.clone(), shutdown.clone()));

    let mut sets = informer::Informer::new(Api::<ReplicaSet>::all(client.clone()), watcher::Config::default());
    replicaset::spawn(client, &mut sets, &mut pods, shutdown);
    deployment::spawn(client, &mut sets, &mut pods, shutdown);
    let mut jobs = informer::Informer::new(Api::<Job>::all(client.clone()), watcher::Config::default());
    job::spawn(client, &mut jobs, &mut pods, shutdown);
    cronjob::spawn(client, &mut jobs, shutdown);
    disruption::spawn(client, &mut pods, shutdown);
    let mut services = informer::Informer::new(Api::<Service>::all(client.clone()), watcher::Config::default());
    let mut endpoints = informer::Informer::new(Api::<Endpoints>::all(client.clone()), watcher::Config::default());
    let mut slices = informer::Informer::new(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default());
    endpoints::spawn(client, &mut services, &mut pods, &mut endpoints, shutdown);
    endpointslice::spawn(client, &mut services, &mut pods, &mut slices, shutdown);
    endpointslicemirroring::spawn(client, &mut services, &mut endpoints, &mut slices, shutdown);
    let revisions = informer::Informer::new(Api::<ControllerRevision>::all(client.clone()), watcher::Config::default());
    let claims = informer::Informer::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default());
    statefulset::spawn(client, &mut pods, &revisions, &claims, shutdown);
    let mut nodes = informer::Informer::new(Api::<Node>::all(client.clone()), watcher::Config::default());
    daemonset::spawn(client, &mut pods, &mut nodes, &revisions, shutdown);
    if options.servicelb {
        servicelb::spawn(client, &mut services, &mut nodes, shutdown);
    }
    nodelifecycle::spawn(client, &mut nodes, &pods, options.node_monitor_grace_period, shutdown);
    tainteviction::spawn(client, &mut pods, &mut nodes, shutdown);
    if let Some(cidr) = options.cluster_cidr {
        nodeipam::spawn(client, &mut nodes, cidr, options.reserved_pod_ranges.clone(), shutdown);
    }
    tokio::spawn(runtime::run(
        ttl_after_finished::controller(client),
        ttl_after_finished::TtlAfterFinished { client: client.clone() },
        shutdown.clone(),
    ));
    pods.spawn(shutdown.clone());
    sets.spawn(shutdown.clone());
    jobs.spawn(shutdown.clone());
    revisions.spawn(shutdown.clone());
    claims.spawn(shutdown.clone());
    nodes.spawn(shutdown.clone());
    services.spawn(shutdown.clone());
    endpoints.spawn(shutdown.clone());
    slices.spawn(shutdown.clone());
}
