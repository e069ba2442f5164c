//! Cluster IPs and node ports for Services, handed out around the Service's write as
//! kube-apiserver's service REST does (`pkg/registry/core/service/storage/alloc.go`).
//!
//! # Guarantees
//! - Nothing is handed out twice, across crashes: each cluster IP is reserved by creating its
//!   `IPAddress` object (named after the address; a create fails if it exists), each node port by
//!   creating a record under `servicenodeports/<port>`, both durably and before the Service that
//!   uses them is written.
//! - A crash between the reservation and the Service's write leaves a reservation without a
//!   Service. The repair pass (at start and every 3 minutes, upstream's `repair` controllers) frees
//!   a reservation whose Service does not hold it once it is a minute old (a write in flight is
//!   never that slow), and recreates the records of what Services hold but lost.
//! - Dynamic allocation is random in the upper band first; the lower (static) band, where
//!   `10.43.0.1` (the `kubernetes` Service) and `10.43.0.10` (cluster DNS) sit, is used last, as
//!   upstream's allocators do, so that fixed addresses rarely collide.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Service;
use rand::Rng as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::kinds::networking::{FAMILY_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use super::kinds::service::{needs_cluster_ip, needs_health_check_port, needs_node_ports};
use super::validation::{self, FieldError};
use super::{Registry, Result, StatusError, parse_stored, timestamp};
use crate::net::Cidr;
use crate::store::{self, Op, Precondition};

const NODE_PORTS: &str = "servicenodeports";
const IP_ADDRESSES: &str = "ipaddresses.networking.k8s.io";
const SERVICES: &str = "services";
/// Upstream's repair interval.
const REPAIR_EVERY: Duration = Duration::from_secs(180);
/// A reservation younger than this may belong to a write in flight.
const ORPHAN_AGE: chrono::Duration = chrono::Duration::seconds(60);

/// `--service-cidr` and `--service-node-port-range`.
#[derive(Debug, Clone, Copy)]
pub struct ServiceRanges {
    pub cidr: Cidr,
    pub node_ports: (u16, u16),
}

impl Default for ServiceRanges {
    fn default() -> Self {
        ServiceRanges { cidr: Cidr { addr: Ipv4Addr::new(10, 43, 0, 0), prefix: 16 }, node_ports: (30000, 32767) }
    }
}

impl ServiceRanges {
    /// The `n`th usable address of the service CIDR (the network address is never used).
    pub fn nth_ip(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cidr.network()) + n)
    }

    /// Usable addresses: all but the network and broadcast addresses.
    fn ip_count(&self) -> u32 {
        (u32::from(self.cidr.broadcast()) - u32::from(self.cidr.network())).saturating_sub(1)
    }

    fn port_count(&self) -> u32 {
        u32::from(self.node_ports.1 - self.node_ports.0) + 1
    }

    fn contains_ip(&self, ip: Ipv4Addr) -> bool {
        self.cidr.contains(ip) && ip != self.cidr.network() && ip != self.cidr.broadcast()
    }
}

/// Upstream's `calculateRangeOffset`: the size of the static band at the bottom of a range.
fn static_band(size: u32) -> u32 {
    const MIN: u32 = 16;
    const MAX: u32 = 256;
    if size < MIN { 0 } else { (size / 16).clamp(MIN, MAX) }
}

/// Offsets 0..size in allocation order: from a random point of the upper band around it, then the
/// static band from a random point.
fn allocation_order(size: u32) -> impl Iterator<Item = u32> {
    let band = static_band(size);
    let mut rng = rand::rng();
    let upper = size - band;
    let start_upper = if upper > 0 { rng.random_range(0..upper) } else { 0 };
    let start_lower = if band > 0 { rng.random_range(0..band) } else { 0 };
    (0..upper).map(move |i| band + (start_upper + i) % upper).chain((0..band).map(move |i| (start_lower + i) % band))
}

/// What a Service holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Holdings {
    ip: Option<Ipv4Addr>,
    ports: BTreeSet<i32>,
}

fn holdings(svc: &Service) -> Holdings {
    let Some(spec) = &svc.spec else { return Holdings::default() };
    let ip = needs_cluster_ip(spec).then(|| spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok())).flatten();
    let mut ports: BTreeSet<i32> = if needs_node_ports(spec) {
        spec.ports.iter().flatten().filter_map(|p| p.node_port).filter(|p| *p != 0).collect()
    } else {
        BTreeSet::new()
    };
    if needs_health_check_port(spec)
        && let Some(p) = spec.health_check_node_port.filter(|p| *p != 0)
    {
        ports.insert(p);
    }
    Holdings { ip, ports }
}

/// What one write reserved, released again if the write does not happen.
#[derive(Debug, Default)]
pub(super) struct Reserved {
    ips: Vec<Ipv4Addr>,
    ports: Vec<i32>,
}

/// Who a reservation is for.
struct Owner<'a> {
    namespace: &'a str,
    name: &'a str,
}

fn ip_key(ip: Ipv4Addr) -> String {
    format!("{IP_ADDRESSES}/{ip}")
}

fn port_key(port: i32) -> String {
    format!("{NODE_PORTS}/{port}")
}

fn invalid(svc_name: &str, errs: &[FieldError]) -> StatusError {
    StatusError::invalid("Service", "", svc_name, errs)
}

impl Registry {
    /// The service CIDR and node port range this server allocates from.
    pub fn service_ranges(&self) -> ServiceRanges {
        *self.ranges
    }

    /// Reserves what the Service `obj` needs and `old` (its stored version, on update) does not
    /// hold, writing allocated values into `obj`. Nothing is reserved on a dry run, but every
    /// check is made.
    pub(super) async fn reserve_for_service(
        &self,
        obj: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<Reserved> {
        let mut svc: Service = serde_json::from_value(obj.clone()).map_err(StatusError::internal)?;
        let old_held = match old {
            Some(o) => holdings(&serde_json::from_value(o.clone()).map_err(StatusError::internal)?),
            None => Holdings::default(),
        };
        let namespace = svc.metadata.namespace.clone().unwrap_or_default();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let owner = Owner { namespace: &namespace, name: &name };
        let mut reserved = Reserved::default();
        let result = self.reserve(&mut svc, &old_held, &owner, dry_run, &mut reserved).await;
        if let Err(e) = result {
            self.release(reserved).await;
            return Err(e);
        }
        *obj = serde_json::to_value(&svc).map_err(StatusError::internal)?;
        Ok(reserved)
    }

    async fn reserve(
        &self,
        svc: &mut Service,
        old: &Holdings,
        owner: &Owner<'_>,
        dry_run: bool,
        reserved: &mut Reserved,
    ) -> Result<()> {
        let Some(spec) = svc.spec.as_mut() else { return Ok(()) };
        if needs_cluster_ip(spec) {
            let wanted = spec.cluster_ip.clone().filter(|ip| !ip.is_empty());
            let kept = wanted.as_deref().and_then(|w| w.parse::<Ipv4Addr>().ok()).filter(|w| old.ip == Some(*w));
            if kept.is_none() {
                let ip = match wanted {
                    Some(w) => {
                        let ip = self.reserve_ip(&w, owner, dry_run).await?;
                        if !dry_run {
                            reserved.ips.push(ip);
                        }
                        ip
                    }
                    None => {
                        let ip = self.reserve_next_ip(owner, dry_run).await?;
                        if !dry_run {
                            reserved.ips.push(ip);
                        }
                        ip
                    }
                };
                spec.cluster_ip = Some(ip.to_string());
                spec.cluster_ips = Some(vec![ip.to_string()]);
            }
        }
        if needs_node_ports(spec) {
            // One node port may serve a port number over two protocols.
            let mut mine: BTreeSet<i32> = BTreeSet::new();
            for (i, port) in spec.ports.iter_mut().flatten().enumerate() {
                match port.node_port.filter(|p| *p != 0) {
                    Some(p) if old.ports.contains(&p) || mine.contains(&p) => {}
                    Some(p) => {
                        let field = validation::child(&validation::index("spec.ports", i), "nodePort");
                        self.reserve_port(p, owner, dry_run)
                            .await
                            .map_err(|msg| invalid(owner.name, &[FieldError::invalid_raw(field, p, msg)]))?;
                        if !dry_run {
                            reserved.ports.push(p);
                        }
                        mine.insert(p);
                    }
                    None => {
                        let p = self.reserve_next_port(owner, dry_run).await?;
                        if !dry_run {
                            reserved.ports.push(p);
                        }
                        mine.insert(p);
                        port.node_port = Some(p);
                    }
                }
            }
        }
        if needs_health_check_port(spec) {
            match spec.health_check_node_port.filter(|p| *p != 0) {
                Some(p) if old.ports.contains(&p) => {}
                Some(p) => {
                    self.reserve_port(p, owner, dry_run).await.map_err(|msg| {
                        StatusError::internal(format!("failed to allocate requested HealthCheck NodePort {p}: {msg}"))
                    })?;
                    if !dry_run {
                        reserved.ports.push(p);
                    }
                }
                None => {
                    let p = self.reserve_next_port(owner, dry_run).await?;
                    if !dry_run {
                        reserved.ports.push(p);
                    }
                    spec.health_check_node_port = Some(p);
                }
            }
        }
        Ok(())
    }

    /// A requested cluster IP: in range and free, or upstream's 422.
    async fn reserve_ip(&self, wanted: &str, owner: &Owner<'_>, dry_run: bool) -> Result<Ipv4Addr> {
        let refuse = |why: String| {
            invalid(
                owner.name,
                &[FieldError::invalid_raw(
                    "spec.clusterIPs",
                    format!("[\"{wanted}\"]"),
                    format!("failed to allocate IP {wanted}: {why}"),
                )],
            )
        };
        let ip: Ipv4Addr = wanted.parse().map_err(|_| refuse("not a valid IPv4 address".into()))?;
        if !self.ranges.contains_ip(ip) {
            return Err(refuse(format!(
                "the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}",
                self.ranges.cidr.net()
            )));
        }
        match self.create_ip_record(ip, owner, dry_run).await? {
            true => Ok(ip),
            false => Err(refuse("provided IP is already allocated".into())),
        }
    }

    async fn reserve_next_ip(&self, owner: &Owner<'_>, dry_run: bool) -> Result<Ipv4Addr> {
        for offset in allocation_order(self.ranges.ip_count()) {
            let ip = self.ranges.nth_ip(offset + 1);
            if self.store.get(&ip_key(ip)).is_some() {
                continue;
            }
            if self.create_ip_record(ip, owner, dry_run).await? {
                return Ok(ip);
            }
        }
        Err(StatusError::internal("failed to allocate a serviceIP: range is full"))
    }

    /// Creates the IPAddress of `ip`; false if it exists.
    async fn create_ip_record(&self, ip: Ipv4Addr, owner: &Owner<'_>, dry_run: bool) -> Result<bool> {
        if dry_run {
            return Ok(self.store.get(&ip_key(ip)).is_none());
        }
        let record = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IPAddress",
            "metadata": {
                "name": ip.to_string(),
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": timestamp(Utc::now()),
                "labels": {FAMILY_LABEL: "IPv4", MANAGED_BY_LABEL: MANAGED_BY},
            },
            "spec": {"parentRef": {"group": "", "resource": SERVICES, "namespace": owner.namespace, "name": owner.name}},
        });
        match self.store.write(ip_key(ip), Precondition::Absent, Op::Put(record)).await {
            Ok(_) => Ok(true),
            Err(store::Error::AlreadyExists) => Ok(false),
            Err(e) => Err(StatusError::internal(e)),
        }
    }

    /// A requested node port: in range and free, or upstream's reason why not.
    async fn reserve_port(&self, port: i32, owner: &Owner<'_>, dry_run: bool) -> Result<(), String> {
        let (lo, hi) = self.ranges.node_ports;
        if !(i32::from(lo)..=i32::from(hi)).contains(&port) {
            return Err(format!("provided port is not in the valid range. The range of valid ports is {lo}-{hi}"));
        }
        match self.create_port_record(port, owner, dry_run).await {
            Ok(true) => Ok(()),
            Ok(false) => Err("provided port is already allocated".into()),
            Err(e) => Err(e.message),
        }
    }

    async fn reserve_next_port(&self, owner: &Owner<'_>, dry_run: bool) -> Result<i32> {
        let lo = i32::from(self.ranges.node_ports.0);
        for offset in allocation_order(self.ranges.port_count()) {
            let port = lo + offset as i32;
            if self.store.get(&port_key(port)).is_some() {
                continue;
            }
            if self.create_port_record(port, owner, dry_run).await? {
                return Ok(port);
            }
        }
        Err(StatusError::internal("failed to allocate a nodePort: range is full"))
    }

    async fn create_port_record(&self, port: i32, owner: &Owner<'_>, dry_run: bool) -> Result<bool> {
        if dry_run {
            return Ok(self.store.get(&port_key(port)).is_none());
        }
        let record = json!({
            "metadata": {"name": port.to_string(), "creationTimestamp": timestamp(Utc::now())},
            "service": {"namespace": owner.namespace, "name": owner.name},
        });
        match self.store.write(port_key(port), Precondition::Absent, Op::Put(record)).await {
            Ok(_) => Ok(true),
            Err(store::Error::AlreadyExists) => Ok(false),
            Err(e) => Err(StatusError::internal(e)),
        }
    }

    /// Gives back what a failed write reserved.
    pub(super) async fn release(&self, reserved: Reserved) {
        for ip in reserved.ips {
            self.remove_record(ip_key(ip)).await;
        }
        for port in reserved.ports {
            self.remove_record(port_key(port)).await;
        }
    }

    /// After a Service's write (or removal, `new` = None): frees what `old` held and `new` does not.
    pub(super) async fn release_unused(&self, old: &Value, new: Option<&Value>) {
        let parse = |v: &Value| serde_json::from_value::<Service>(v.clone()).map(|s| holdings(&s)).unwrap_or_default();
        let before = parse(old);
        let after = new.map(parse).unwrap_or_default();
        if let Some(ip) = before.ip.filter(|ip| after.ip != Some(*ip)) {
            self.remove_record(ip_key(ip)).await;
        }
        for port in before.ports.difference(&after.ports) {
            self.remove_record(port_key(*port)).await;
        }
    }

    /// Deletes a reservation; a failure is left to the repair pass.
    async fn remove_record(&self, key: String) {
        let Some(current) = self.store.get(&key) else { return };
        let Ok(value) = parse_stored(&current) else { return };
        if let Err(e) = self.store.write(key.clone(), Precondition::Revision(current.rv), Op::Delete(value)).await {
            tracing::warn!("releasing {key}: {e}; the repair pass will release it");
        }
    }

    /// Runs the repair pass now and every 3 minutes until `shutdown`.
    pub fn spawn_service_repair(&self, shutdown: CancellationToken) {
        let registry = self.clone();
        tokio::spawn(async move {
            loop {
                registry.repair_service_allocations().await;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(REPAIR_EVERY) => {}
                }
            }
        });
    }

    /// Upstream's `repairip` and node port `Repair`: reservations match what Services hold.
    pub async fn repair_service_allocations(&self) {
        let mut held_ips: BTreeMap<Ipv4Addr, (String, String)> = BTreeMap::new();
        let mut held_ports: BTreeMap<i32, (String, String)> = BTreeMap::new();
        for (_, obj) in self.store.list(&format!("{SERVICES}/"), None).items {
            let Ok(svc) = serde_json::from_slice::<Service>(&obj.data) else { continue };
            let owner =
                (svc.metadata.namespace.clone().unwrap_or_default(), svc.metadata.name.clone().unwrap_or_default());
            let held = holdings(&svc);
            if let Some(ip) = held.ip {
                if !self.ranges.contains_ip(ip) {
                    tracing::warn!(
                        "the cluster IP {ip} of service {}/{} is not within the service CIDR {}; recreate the service to move it",
                        owner.0,
                        owner.1,
                        self.ranges.cidr.net()
                    );
                }
                if let Some(other) = held_ips.insert(ip, owner.clone()) {
                    tracing::error!(
                        "the cluster IP {ip} is held by both {}/{} and {}/{}",
                        other.0,
                        other.1,
                        owner.0,
                        owner.1
                    );
                }
            }
            for port in held.ports {
                if let Some(other) = held_ports.insert(port, owner.clone()).filter(|o| *o != owner) {
                    tracing::error!(
                        "node port {port} is held by both {}/{} and {}/{}",
                        other.0,
                        other.1,
                        owner.0,
                        owner.1
                    );
                }
            }
        }
        let now = Utc::now();
        let old_enough = |v: &Value| {
            v.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_none_or(|t| now - t.with_timezone(&Utc) > ORPHAN_AGE)
        };
        for (key, obj) in self.store.list(&format!("{IP_ADDRESSES}/"), None).items {
            let Ok(v) = parse_stored(&obj) else { continue };
            if v.pointer("/metadata/labels").and_then(|l| l.get(MANAGED_BY_LABEL)).and_then(Value::as_str)
                != Some(MANAGED_BY)
            {
                continue;
            }
            let ip = key.rsplit('/').next().and_then(|ip| ip.parse::<Ipv4Addr>().ok());
            let parent =
                |f: &str| v.pointer(&format!("/spec/parentRef/{f}")).and_then(Value::as_str).unwrap_or("").to_string();
            let holder = ip.and_then(|ip| held_ips.remove(&ip));
            if holder.as_ref().is_some_and(|h| *h == (parent("namespace"), parent("name"))) {
                continue;
            }
            if holder.is_none() && old_enough(&v) {
                tracing::info!("releasing cluster IP {} held by no service", key.rsplit('/').next().unwrap_or(""));
                self.remove_record(key).await;
            }
        }
        for (ip, (namespace, name)) in held_ips {
            tracing::warn!("the cluster IP {ip} of service {namespace}/{name} had no IPAddress; recreating it");
            let owner = Owner { namespace: &namespace, name: &name };
            if let Err(e) = self.create_ip_record(ip, &owner, false).await {
                tracing::warn!("recreating the IPAddress {ip}: {}", e.message);
            }
        }
        for (key, obj) in self.store.list(&format!("{NODE_PORTS}/"), None).items {
            let Ok(v) = parse_stored(&obj) else { continue };
            let port = key.rsplit('/').next().and_then(|p| p.parse::<i32>().ok());
            if port.is_some_and(|p| held_ports.remove(&p).is_some()) || !old_enough(&v) {
                continue;
            }
            tracing::info!("releasing node port {} held by no service", key.rsplit('/').next().unwrap_or(""));
            self.remove_record(key).await;
        }
        for (port, (namespace, name)) in held_ports {
            tracing::warn!("node port {port} of service {namespace}/{name} had no record; recreating it");
            let owner = Owner { namespace: &namespace, name: &name };
            if let Err(e) = self.create_port_record(port, &owner, false).await {
                tracing::warn!("recreating the record of node port {port}: {}", e.message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_allocation_leaves_the_static_band_for_last() {
        assert_eq!(static_band(65534), 256);
        assert_eq!(static_band(2768), 173);
        assert_eq!(static_band(10), 0);
        let order: Vec<u32> = allocation_order(2768).collect();
        assert_eq!(order.len(), 2768);
        assert!(order[..2768 - 173].iter().all(|o| *o >= 173));
        let distinct: BTreeSet<u32> = order.iter().copied().collect();
        assert_eq!(distinct.len(), 2768);
    }

    #[test]
    fn the_first_address_is_the_kubernetes_service() {
        let r = ServiceRanges::default();
        assert_eq!(r.nth_ip(1), Ipv4Addr::new(10, 43, 0, 1));
        assert_eq!(r.ip_count(), 65534);
        assert!(!r.contains_ip(Ipv4Addr::new(10, 43, 0, 0)));
        assert!(!r.contains_ip(Ipv4Addr::new(10, 43, 255, 255)));
        assert!(r.contains_ip(Ipv4Addr::new(10, 43, 0, 10)));
    }
}
