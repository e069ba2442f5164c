//! The `kubernetes` Service's endpoints when several servers share one etcd: kube-apiserver's lease
//! endpoint reconciler (`--endpoint-reconciler-type=lease`). Every server runs it (it is not
//! elected): each keeps a Lease `apiserver-<hash of its address>` in `kube-system` (labelled
//! `apiserver.kubernetes.io/identity: kube-apiserver`, its address in an annotation), renewed every
//! 10 s and good for 15 s (upstream's master lease TTL), and points the Endpoints and
//! EndpointSlices at the servers whose Lease is current. A server that stops removes its Lease and
//! itself at once; one that dies drops out once its Lease runs out. A periodic loop, as
//! upstream's, rather than a reconciler: its input is the clock.
//!
//! Servers listening on different ports (several on one machine) get one EndpointSlice per port:
//! `kubernetes` for the lowest, `kubernetes-<port>` for the others.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort as SlicePort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt as _};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const RENEW_EVERY: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 15;
/// Leases of servers gone this long are deleted (upstream's identity lease collector).
const FORGET_AFTER: SignedDuration = SignedDuration::from_hours(1);
const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
const ADDRESS_ANNOTATION: &str = "cairn.io/advertise-address";
const SERVICE: &str = "kubernetes";

/// Keeps this server (`me`, its advertised address) among the `kubernetes` Service's endpoints
/// until `shutdown`, then takes it out. `live` is given the addresses of the live servers after
/// every round (for the admin kubeconfig).
pub async fn run(client: Client, me: SocketAddr, shutdown: CancellationToken, live: watch::Sender<Vec<SocketAddr>>) {
    let digest = crate::runtime::oci_image::hex(&Sha256::digest(me.to_string().as_bytes()));
    let lease_name = format!("apiserver-{}", &digest[..16]);
    let reconciler = Reconciler { client, me, lease_name };
    loop {
        match reconciler.round(false).await {
            Ok(servers) => {
                let servers: Vec<SocketAddr> =
                    servers.iter().flat_map(|(p, ips)| ips.iter().map(|ip| SocketAddr::new(*ip, *p))).collect();
                live.send_if_modified(|now| {
                    let changed = *now != servers;
                    *now = servers;
                    changed
                });
            }
            Err(e) => tracing::warn!("reconciling the kubernetes Service's endpoints: {e}"),
        }
        tokio::select! {
            () = tokio::time::sleep(RENEW_EVERY) => {}
            () = shutdown.cancelled() => break,
        }
    }
    match reconciler.round(true).await {
        Ok(_) => tracing::info!("removed this server ({me}) from the kubernetes Service's endpoints"),
        Err(e) => tracing::warn!("removing this server from the kubernetes Service's endpoints: {e}"),
    }
}

struct Reconciler {
    client: Client,
    me: SocketAddr,
    lease_name: String,
}

impl Reconciler {
    /// Renews (or, when `leaving`, deletes) this server's Lease, then writes the endpoints of the
    /// servers whose Lease is current and returns them (by port).
    async fn round(&self, leaving: bool) -> kube::Result<BTreeMap<u16, BTreeSet<IpAddr>>> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-system");
        if leaving {
            let _ = leases.delete(&self.lease_name, &DeleteParams::default()).await;
        } else {
            self.renew(&leases).await?;
        }
        let now = Timestamp::now();
        let mut servers: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
        for lease in leases.list(&ListParams::default().labels(&format!("{IDENTITY_LABEL}=kube-apiserver"))).await? {
            let Some(address) = lease.annotations().get(ADDRESS_ANNOTATION).and_then(|a| a.parse::<SocketAddr>().ok())
            else {
                continue;
            };
            let spec = lease.spec.clone().unwrap_or_default();
            let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            let Some(renewed) = spec.renew_time.map(|t| t.0) else { continue };
            let expires = renewed + SignedDuration::from_secs(seconds);
            if expires + FORGET_AFTER < now {
                let _ = leases.delete(&lease.name_any(), &DeleteParams::default()).await;
            }
            if expires >= now && !(leaving && lease.name_any() == self.lease_name) {
                servers.entry(address.port()).or_default().insert(address.ip());
            }
        }
        self.write_endpoints(&servers).await?;
        Ok(servers)
    }

    async fn renew(&self, leases: &Api<Lease>) -> kube::Result<()> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name.clone()),
                labels: Some([(IDENTITY_LABEL.to_string(), "kube-apiserver".to_string())].into()),
                annotations: Some([(ADDRESS_ANNOTATION.to_string(), self.me.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.lease_name.clone()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                renew_time: Some(now),
                ..Default::default()
            }),
        };
        match leases.get_opt(&self.lease_name).await? {
            None => leases.create(&PostParams::default(), &lease).await.map(drop),
            Some(current) => {
                let mut next = lease;
                next.metadata.resource_version = current.resource_version();
                leases.replace(&self.lease_name, &PostParams::default(), &next).await.map(drop)
            }
        }
    }

    async fn write_endpoints(&self, servers: &BTreeMap<u16, BTreeSet<IpAddr>>) -> kube::Result<()> {
        let port = |port: u16| EndpointPort {
            name: Some("https".into()),
            port: i32::from(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let subsets: Vec<EndpointSubset> = servers
            .iter()
            .map(|(p, ips)| EndpointSubset {
                addresses: Some(
                    ips.iter().map(|ip| EndpointAddress { ip: ip.to_string(), ..Default::default() }).collect(),
                ),
                ports: Some(vec![port(*p)]),
                ..Default::default()
            })
            .collect();
        let endpoints: Api<Endpoints> = Api::namespaced(self.client.clone(), "default");
        let mut current = endpoints.get_opt(SERVICE).await?.unwrap_or_default();
        let wanted = (!subsets.is_empty()).then_some(subsets);
        if current.subsets != wanted {
            let created = current.metadata.resource_version.is_none();
            current.metadata.name = Some(SERVICE.into());
            current.labels_mut().insert("endpointslice.kubernetes.io/skip-mirror".into(), "true".into());
            current.subsets = wanted;
            if created {
                endpoints.create(&PostParams::default(), &current).await?;
            } else {
                endpoints.replace(SERVICE, &PostParams::default(), &current).await?;
            }
            tracing::info!("the kubernetes Service's endpoints are now {}", describe(servers));
        }

        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), "default");
        let mut names = BTreeSet::new();
        for (i, (p, ips)) in servers.iter().enumerate() {
            let name = if i == 0 { SERVICE.to_string() } else { format!("{SERVICE}-{p}") };
            let v4 = ips.iter().all(IpAddr::is_ipv4);
            let wanted_endpoints: Option<Vec<Endpoint>> = ips
                .iter()
                .map(|ip| Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(EndpointConditions { ready: Some(true), ..Default::default() }),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
                .into();
            let wanted_ports = vec![SlicePort {
                name: Some("https".into()),
                port: Some(i32::from(*p)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }];
            names.insert(name.clone());
            let current = slices.get_opt(&name).await?;
            if current
                .as_ref()
                .is_some_and(|c| c.endpoints == wanted_endpoints && c.ports == Some(wanted_ports.clone()))
            {
                continue;
            }
            let mut slice = current.clone().unwrap_or_default();
            slice.metadata.name = Some(name.clone());
            slice.labels_mut().insert("kubernetes.io/service-name".into(), SERVICE.into());
            slice.address_type = if v4 { "IPv4" } else { "IPv6" }.into();
            slice.endpoints = wanted_endpoints;
            slice.ports = Some(wanted_ports);
            match current {
                None => slices.create(&PostParams::default(), &slice).await.map(drop)?,
                Some(_) => slices.replace(&name, &PostParams::default(), &slice).await.map(drop)?,
            }
        }
        let params = ListParams::default().labels(&format!("kubernetes.io/service-name={SERVICE}"));
        for stale in slices.list(&params).await? {
            let name = stale.name_any();
            if name.starts_with(&format!("{SERVICE}-")) && !names.contains(&name) {
                slices.delete(&name, &DeleteParams::default()).await?;
            }
        }
        Ok(())
    }
}

fn describe(servers: &BTreeMap<u16, BTreeSet<IpAddr>>) -> String {
    let all: Vec<String> =
        servers.iter().flat_map(|(p, ips)| ips.iter().map(move |ip| SocketAddr::new(*ip, *p).to_string())).collect();
    if all.is_empty() { "none".into() } else { all.join(", ") }
}
