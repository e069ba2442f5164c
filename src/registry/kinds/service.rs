//! `v1` Services and Endpoints: defaults (`SetDefaults_Service`, the service strategy's
//! `PrepareForCreate`/`PrepareForUpdate` with `patchAllocatedValues` and `dropTypeDependentFields`),
//! validation (`ValidateService`, `ValidateServiceUpdate`, `ValidateEndpoints`) and the
//! `kubectl get svc` / `kubectl get endpoints` columns. Cluster IPs and node ports are handed out by
//! `registry::services`, around the write.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, EndpointAddress, Endpoints, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
    SessionAffinityConfig,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::pod_rules::{
    dns_subdomain, invalid_raw, opt, port_name_errors, push_msgs, range_error, required, slice, valid_ip,
};
use crate::registry::Subresource;
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, NameRule, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

pub const CLUSTER_IP: &str = "ClusterIP";
pub const NODE_PORT: &str = "NodePort";
pub const LOAD_BALANCER: &str = "LoadBalancer";
pub const EXTERNAL_NAME: &str = "ExternalName";
/// `spec.clusterIP` of a headless Service.
pub const NONE: &str = "None";
const TYPES: &[&str] = &[CLUSTER_IP, EXTERNAL_NAME, LOAD_BALANCER, NODE_PORT];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
/// Upstream's `DefaultClientIPServiceAffinitySeconds` and `MaxClientIPServiceAffinitySeconds`.
const DEFAULT_AFFINITY_SECONDS: i32 = 10800;
const MAX_AFFINITY_SECONDS: i32 = 86400;

pub struct Services;

/// `spec.type`, defaulted.
pub fn service_type(spec: &ServiceSpec) -> &str {
    spec.type_.as_deref().filter(|t| !t.is_empty()).unwrap_or(CLUSTER_IP)
}

/// Whether the Service gets a cluster IP (`needsClusterIP`): not ExternalName, not headless.
pub fn needs_cluster_ip(spec: &ServiceSpec) -> bool {
    service_type(spec) != EXTERNAL_NAME && opt(&spec.cluster_ip) != NONE
}

/// Whether its ports get node ports (`needsNodePort`).
pub fn needs_node_ports(spec: &ServiceSpec) -> bool {
    match service_type(spec) {
        NODE_PORT => true,
        LOAD_BALANCER => spec.allocate_load_balancer_node_ports != Some(false),
        _ => false,
    }
}

/// Whether it gets a health-check node port (`needsHCNodePort`): a LoadBalancer keeping the client
/// address.
pub fn needs_health_check_port(spec: &ServiceSpec) -> bool {
    service_type(spec) == LOAD_BALANCER && spec.external_traffic_policy.as_deref() == Some("Local")
}

/// Reachable from outside the cluster (`ExternallyAccessible`).
fn externally_accessible(spec: &ServiceSpec) -> bool {
    matches!(service_type(spec), NODE_PORT | LOAD_BALANCER)
        || (service_type(spec) == CLUSTER_IP && !slice(&spec.external_ips).is_empty())
}

fn defaults(svc: &mut Service) {
    let spec = svc.spec.get_or_insert_with(Default::default);
    if opt(&spec.type_).is_empty() {
        spec.type_ = Some(CLUSTER_IP.into());
    }
    if opt(&spec.session_affinity).is_empty() {
        spec.session_affinity = Some("None".into());
    }
    if spec.session_affinity.as_deref() == Some("ClientIP") {
        let config = spec.session_affinity_config.get_or_insert_with(SessionAffinityConfig::default);
        let client = config.client_ip.get_or_insert_with(ClientIPConfig::default);
        client.timeout_seconds.get_or_insert(DEFAULT_AFFINITY_SECONDS);
    }
    // 0 is "none" (clients send it): stored as absent, as upstream's omitempty does.
    if spec.health_check_node_port == Some(0) {
        spec.health_check_node_port = None;
    }
    for port in spec.ports.iter_mut().flatten() {
        if port.node_port == Some(0) {
            port.node_port = None;
        }
        if opt(&port.protocol).is_empty() {
            port.protocol = Some("TCP".into());
        }
        let unset = match &port.target_port {
            None => true,
            Some(IntOrString::Int(i)) => *i == 0,
            Some(IntOrString::String(s)) => s.is_empty(),
        };
        if unset {
            port.target_port = Some(IntOrString::Int(port.port));
        }
    }
    if externally_accessible(spec) && opt(&spec.external_traffic_policy).is_empty() {
        spec.external_traffic_policy = Some("Cluster".into());
    }
    if service_type(spec) != EXTERNAL_NAME && opt(&spec.internal_traffic_policy).is_empty() {
        spec.internal_traffic_policy = Some("Cluster".into());
    }
    if service_type(spec) == LOAD_BALANCER && spec.allocate_load_balancer_node_ports.is_none() {
        spec.allocate_load_balancer_node_ports = Some(true);
    }
    // clusterIP and clusterIPs say the same thing; either may be given.
    match (opt(&spec.cluster_ip).is_empty(), slice(&spec.cluster_ips).is_empty()) {
        (false, true) => spec.cluster_ips = Some(vec![opt(&spec.cluster_ip).to_string()]),
        (true, false) => spec.cluster_ip = slice(&spec.cluster_ips).first().cloned(),
        _ => {}
    }
    if service_type(spec) == EXTERNAL_NAME {
        spec.ip_families = None;
        spec.ip_family_policy = None;
    } else {
        if spec.ip_family_policy.is_none() {
            // A headless Service without a selector takes every family the cluster has (one, here).
            let headless_without_selector =
                opt(&spec.cluster_ip) == NONE && spec.selector.as_ref().is_none_or(BTreeMap::is_empty);
            let policy = if headless_without_selector { "RequireDualStack" } else { "SingleStack" };
            spec.ip_family_policy = Some(policy.into());
        }
        if slice(&spec.ip_families).is_empty() {
            let v6 = spec
                .cluster_ip
                .as_deref()
                .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                .is_some_and(|ip| ip.is_ipv6());
            spec.ip_families = Some(vec![if v6 { "IPv6" } else { "IPv4" }.into()]);
        }
    }
}

/// `patchAllocatedValues`: what an update leaves out (a PUT of the applied manifest) that was
/// allocated stays as it was.
fn keep_allocated(new: &mut ServiceSpec, old: &ServiceSpec) {
    if needs_cluster_ip(old) && needs_cluster_ip(new) {
        if opt(&new.cluster_ip).is_empty() {
            new.cluster_ip = old.cluster_ip.clone();
        }
        if slice(&new.cluster_ips).is_empty() {
            new.cluster_ips = old.cluster_ips.clone();
        }
    }
    if needs_node_ports(old) && needs_node_ports(new) {
        let by_name: BTreeMap<&str, i32> =
            slice(&old.ports).iter().map(|p| (opt(&p.name), p.node_port.unwrap_or(0))).collect();
        let used: HashSet<i32> = slice(&new.ports).iter().filter_map(|p| p.node_port).filter(|p| *p != 0).collect();
        for port in new.ports.iter_mut().flatten() {
            if port.node_port.unwrap_or(0) == 0
                && let Some(&old_port) = by_name.get(opt(&port.name))
                && old_port != 0
                && !used.contains(&old_port)
            {
                port.node_port = Some(old_port);
            }
        }
    }
    if needs_health_check_port(old) && needs_health_check_port(new) && new.health_check_node_port.unwrap_or(0) == 0 {
        new.health_check_node_port = old.health_check_node_port;
    }
}

/// `dropTypeDependentFields`: a type change drops what only the old type had, when the update
/// carries it over unchanged.
fn drop_type_dependent(new: &mut ServiceSpec, old: &ServiceSpec) {
    if needs_cluster_ip(old) && !needs_cluster_ip(new) && service_type(new) == EXTERNAL_NAME {
        if new.cluster_ip == old.cluster_ip {
            new.cluster_ip = None;
        }
        if new.cluster_ips == old.cluster_ips {
            new.cluster_ips = None;
        }
    }
    if service_type(new) == EXTERNAL_NAME {
        if new.ip_families == old.ip_families {
            new.ip_families = None;
        }
        if new.ip_family_policy == old.ip_family_policy {
            new.ip_family_policy = None;
        }
    }
    if needs_node_ports(old) && !needs_node_ports(new) {
        let by_name: BTreeMap<&str, Option<i32>> =
            slice(&old.ports).iter().map(|p| (opt(&p.name), p.node_port)).collect();
        for port in new.ports.iter_mut().flatten() {
            if by_name.get(opt(&port.name)).is_some_and(|old| *old == port.node_port) {
                port.node_port = None;
            }
        }
    }
    if needs_health_check_port(old)
        && !needs_health_check_port(new)
        && new.health_check_node_port == old.health_check_node_port
    {
        new.health_check_node_port = None;
    }
    if service_type(new) != LOAD_BALANCER {
        if new.allocate_load_balancer_node_ports == old.allocate_load_balancer_node_ports {
            new.allocate_load_balancer_node_ports = None;
        }
        if new.load_balancer_class == old.load_balancer_class {
            new.load_balancer_class = None;
        }
    }
    if !externally_accessible(new) && new.external_traffic_policy == old.external_traffic_policy {
        new.external_traffic_policy = None;
    }
    if service_type(new) == EXTERNAL_NAME && new.internal_traffic_policy == old.internal_traffic_policy {
        new.internal_traffic_policy = None;
    }
}

fn validate_port(port: &ServicePort, path: &str, spec: &ServiceSpec, many: bool, out: &mut ErrorList) {
    let name = opt(&port.name);
    if many && name.is_empty() {
        out.push(required(&validation::child(path, "name")));
    } else if !name.is_empty() {
        push_msgs(out, &validation::child(path, "name"), name, validation::is_dns1123_label(name));
    }
    if !(1..=65535).contains(&port.port) {
        out.push(invalid_raw(&validation::child(path, "port"), port.port, &range_error(1, 65535)));
    }
    match opt(&port.protocol) {
        "" => out.push(required(&validation::child(path, "protocol"))),
        p if !PROTOCOLS.contains(&p) => {
            out.push(FieldError::not_supported(validation::child(path, "protocol"), p, PROTOCOLS))
        }
        _ => {}
    }
    let target = validation::child(path, "targetPort");
    match &port.target_port {
        Some(IntOrString::Int(p)) if !(1..=65535).contains(p) => {
            out.push(invalid_raw(&target, p, &range_error(1, 65535)))
        }
        Some(IntOrString::String(s)) => push_msgs(out, &target, s, port_name_errors(s)),
        _ => {}
    }
    if let Some(np) = port.node_port.filter(|p| *p != 0) {
        let node_port = validation::child(path, "nodePort");
        if !matches!(service_type(spec), NODE_PORT | LOAD_BALANCER) {
            out.push(FieldError::forbidden(
                node_port,
                format!("may not be used when `type` is '{}'", service_type(spec)),
            ));
        } else if !(1..=65535).contains(&np) {
            out.push(invalid_raw(&node_port, np, &range_error(1, 65535)));
        }
    }
    if let Some(app) = port.app_protocol.as_deref() {
        let field = validation::child(path, "appProtocol");
        push_msgs(out, &field, app, validation::is_qualified_name(app));
    }
}

fn validate_spec(svc: &Service, out: &mut ErrorList) {
    let Some(spec) = &svc.spec else {
        out.push(required("spec"));
        return;
    };
    let ty = service_type(spec);
    if !TYPES.contains(&ty) {
        out.push(FieldError::not_supported("spec.type", ty, TYPES));
    }
    let ports = slice(&spec.ports);
    let headless = opt(&spec.cluster_ip) == NONE;
    if ports.is_empty() && ty != EXTERNAL_NAME && !headless {
        out.push(required("spec.ports"));
    }
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    let mut node_ports = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let path = validation::index("spec.ports", i);
        validate_port(port, &path, spec, ports.len() > 1, out);
        let name = opt(&port.name);
        if !name.is_empty() && !names.insert(name) {
            out.push(FieldError::duplicate(validation::child(&path, "name"), name));
        }
        if !keys.insert((port.port, opt(&port.protocol))) {
            out.push(FieldError::duplicate_raw(
                &path,
                format!("core.ServicePort{{Name:\"\", Protocol:\"{}\", Port:{}}}", opt(&port.protocol), port.port),
            ));
        }
        if let Some(np) = port.node_port.filter(|p| *p != 0)
            && !node_ports.insert((np, opt(&port.protocol)))
        {
            out.push(FieldError::duplicate_raw(validation::child(&path, "nodePort"), np));
        }
    }
    for (k, v) in spec.selector.iter().flatten() {
        let field = validation::key("spec.selector", k);
        push_msgs(out, &field, k, validation::is_qualified_name(k));
        push_msgs(out, &field, v, validation::is_label_value(v));
    }
    match opt(&spec.session_affinity) {
        "None" => {
            if spec.session_affinity_config.is_some() {
                out.push(FieldError::invalid_raw(
                    "spec.sessionAffinityConfig",
                    "{...}",
                    "must not be set when session affinity is None",
                ));
            }
        }
        "ClientIP" => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            if let Some(t) = timeout.filter(|t| *t <= 0 || *t > MAX_AFFINITY_SECONDS) {
                out.push(invalid_raw(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    t,
                    &format!("must be greater than 0 and less than {MAX_AFFINITY_SECONDS}"),
                ));
            }
        }
        other => out.push(FieldError::not_supported("spec.sessionAffinity", other, &["ClientIP", "None"])),
    }
    validate_cluster_ips(spec, out);
    if ty == EXTERNAL_NAME {
        let name = opt(&spec.external_name);
        if name.is_empty() {
            out.push(required("spec.externalName"));
        } else {
            // A fully qualified name may end with a dot.
            dns_subdomain(name.strip_suffix('.').unwrap_or(name), "spec.externalName", out);
        }
    }
    for (i, ip) in slice(&spec.external_ips).iter().enumerate() {
        valid_ip(ip, &validation::index("spec.externalIPs", i), out);
    }
    validate_policies(spec, out);
}

fn validate_cluster_ips(spec: &ServiceSpec, out: &mut ErrorList) {
    let ty = service_type(spec);
    let ips = slice(&spec.cluster_ips);
    if ty == EXTERNAL_NAME {
        if !opt(&spec.cluster_ip).is_empty() || !ips.is_empty() {
            out.push(FieldError::forbidden("spec.clusterIPs", "may not be set for ExternalName services"));
        }
        return;
    }
    if let (Some(first), Some(ip)) = (ips.first(), spec.cluster_ip.as_deref())
        && first != ip
    {
        out.push(FieldError::invalid("spec.clusterIPs", ip, "must match the first value in spec.clusterIPs"));
    }
    if ips.len() > 2 {
        out.push(FieldError::invalid_raw("spec.clusterIPs", format!("{ips:?}"), "may only hold up to 2 values"));
    }
    for (i, ip) in ips.iter().enumerate() {
        let field = validation::index("spec.clusterIPs", i);
        if ip == NONE {
            if i > 0 {
                out.push(FieldError::invalid(
                    field,
                    ip,
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                ));
            } else if matches!(ty, NODE_PORT | LOAD_BALANCER) {
                out.push(FieldError::invalid(field, ip, format!("may not be set to 'None' for {ty} services")));
            }
            continue;
        }
        valid_ip(ip, &field, out);
    }
    let policy = opt(&spec.ip_family_policy);
    let policies = ["PreferDualStack", "RequireDualStack", "SingleStack"];
    if !policy.is_empty() && !policies.contains(&policy) {
        out.push(FieldError::not_supported("spec.ipFamilyPolicy", policy, &policies));
    }
    // This cluster serves IPv4 services only.
    if policy == "RequireDualStack" && opt(&spec.cluster_ip) != NONE {
        out.push(FieldError::invalid(
            "spec.ipFamilyPolicy",
            policy,
            "this cluster is not configured for dual-stack services",
        ));
    }
    for (i, family) in slice(&spec.ip_families).iter().enumerate() {
        let field = validation::index("spec.ipFamilies", i);
        match family.as_str() {
            "IPv4" => {}
            "IPv6" => out.push(FieldError::invalid(field, family, "not configured on this cluster")),
            other => out.push(FieldError::not_supported(field, other, &["IPv4", "IPv6"])),
        }
    }
    if slice(&spec.ip_families).len() > 1 && policy == "SingleStack" {
        out.push(FieldError::invalid_raw(
            "spec.ipFamilies",
            format!("{:?}", slice(&spec.ip_families)),
            "when spec.ipFamilyPolicy is SingleStack, at most one family may be given",
        ));
    }
}

fn validate_policies(spec: &ServiceSpec, out: &mut ErrorList) {
    match opt(&spec.external_traffic_policy) {
        "" => {}
        p if !externally_accessible(spec) => out.push(FieldError::invalid(
            "spec.externalTrafficPolicy",
            p,
            "may only be set for externally-accessible services",
        )),
        "Cluster" | "Local" => {}
        p => out.push(FieldError::not_supported("spec.externalTrafficPolicy", p, &["Cluster", "Local"])),
    }
    match opt(&spec.internal_traffic_policy) {
        "" | "Cluster" | "Local" => {}
        p => out.push(FieldError::not_supported("spec.internalTrafficPolicy", p, &["Cluster", "Local"])),
    }
    if let Some(port) = spec.health_check_node_port.filter(|p| *p != 0)
        && !needs_health_check_port(spec)
    {
        out.push(invalid_raw(
            "spec.healthCheckNodePort",
            port,
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    if service_type(spec) != LOAD_BALANCER {
        if spec.allocate_load_balancer_node_ports.is_some() {
            out.push(FieldError::forbidden(
                "spec.allocateLoadBalancerNodePorts",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        if !slice(&spec.load_balancer_source_ranges).is_empty() {
            out.push(FieldError::forbidden(
                "spec.loadBalancerSourceRanges",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        if spec.load_balancer_class.is_some() {
            out.push(FieldError::forbidden("spec.loadBalancerClass", "may only be used when `type` is 'LoadBalancer'"));
        }
    }
}

impl Kind for Services {
    type Obj = Service;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        singular: "service",
        namespaced: true,
        short_names: &["svc"],
        categories: &["all"],
        subresources: &[Subresource::Status],
        storage: "services",
        return_deleted_object: true,
    };
    const NAME_RULE: NameRule = NameRule::Dns1035Label;
    const MERGE_KEYS: &'static [crate::registry::patch::MergeKey] = &[
        crate::registry::patch::merge("spec.ports", "port"),
        crate::registry::patch::merge("status.conditions", "type"),
    ];

    fn prepare_create(&self, svc: &mut Service) {
        svc.status = Some(ServiceStatus { load_balancer: Some(LoadBalancerStatus::default()), conditions: None });
        defaults(svc);
    }

    fn prepare_update(&self, new: &mut Service, old: &Service) {
        new.status = old.status.clone();
        if let (Some(spec), Some(old_spec)) = (new.spec.as_mut(), old.spec.as_ref()) {
            keep_allocated(spec, old_spec);
            drop_type_dependent(spec, old_spec);
        }
        defaults(new);
    }

    fn prepare_status_update(&self, new: &mut Service, old: &Service) {
        new.spec = old.spec.clone();
    }

    fn validate(&self, svc: &Service) -> ErrorList {
        let mut out = Vec::new();
        validate_spec(svc, &mut out);
        out
    }

    fn validate_update(&self, new: &Service, old: &Service) -> ErrorList {
        let mut out = self.validate(new);
        let (Some(spec), Some(old_spec)) = (&new.spec, &old.spec) else { return out };
        // A cluster IP may not change, except by going to or from ExternalName.
        if service_type(spec) != EXTERNAL_NAME && service_type(old_spec) != EXTERNAL_NAME {
            let old_ips = slice(&old_spec.cluster_ips);
            for (i, ip) in slice(&spec.cluster_ips).iter().enumerate() {
                if old_ips.get(i).is_some_and(|o| o != ip) {
                    out.push(FieldError::invalid(
                        validation::index("spec.clusterIPs", i),
                        ip,
                        "may not change once set",
                    ));
                }
            }
        }
        out
    }

    fn validate_status_update(&self, new: &Service, _old: &Service) -> ErrorList {
        let mut out = Vec::new();
        let ingress = new.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate() {
            let path = validation::index("status.loadBalancer.ingress", i);
            if let Some(ip) = ing.ip.as_deref() {
                valid_ip(ip, &validation::child(&path, "ip"), &mut out);
            }
            if let Some(host) = ing.hostname.as_deref() {
                dns_subdomain(host, &validation::child(&path, "hostname"), &mut out);
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("Type", "string", "The type of the service."),
            Column::new("Cluster-IP", "string", "The IP address of the service."),
            Column::new("External-IP", "string", "The external IP address of the service."),
            Column::new("Port(s)", "string", "The ports of the service."),
            AGE_COLUMN,
            Column::new("Selector", "string", "The label selector of the service.").wide(),
        ]
    }

    fn cells(&self, svc: &Service) -> Vec<Value> {
        let spec = svc.spec.clone().unwrap_or_default();
        let cluster_ip = spec.cluster_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "<none>".into());
        let selector = spec
            .selector
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| s.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "<none>".into());
        vec![
            name_cell(&svc.metadata),
            json!(service_type(&spec)),
            json!(cluster_ip),
            json!(external_ip(svc)),
            json!(port_string(slice(&spec.ports))),
            age_cell(&svc.metadata),
            json!(selector),
        ]
    }
}

/// The EXTERNAL-IP column (`getServiceExternalIP`).
fn external_ip(svc: &Service) -> String {
    let spec = svc.spec.clone().unwrap_or_default();
    let external = slice(&spec.external_ips).join(",");
    match service_type(&spec) {
        LOAD_BALANCER => {
            let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
            let mut all: Vec<String> = ingress
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().filter(|s| !s.is_empty()).or_else(|| i.hostname.clone()))
                .collect();
            all.extend(slice(&spec.external_ips).iter().cloned());
            if all.is_empty() { "<pending>".into() } else { all.join(",") }
        }
        EXTERNAL_NAME => opt(&spec.external_name).to_string(),
        _ if external.is_empty() => "<none>".into(),
        _ => external,
    }
}

/// The PORT(S) column (`makePortString`): `80/TCP`, `80:30080/TCP`.
fn port_string(ports: &[ServicePort]) -> String {
    if ports.is_empty() {
        return "<none>".into();
    }
    let shown: Vec<String> = ports
        .iter()
        .map(|p| match p.node_port.filter(|n| *n != 0) {
            Some(np) => format!("{}:{np}/{}", p.port, opt(&p.protocol)),
            None => format!("{}/{}", p.port, opt(&p.protocol)),
        })
        .collect();
    shown.join(",")
}

pub struct EndpointsKind;

fn validate_address(addr: &EndpointAddress, path: &str, out: &mut ErrorList) {
    let field = validation::child(path, "ip");
    match addr.ip.parse::<std::net::IpAddr>() {
        Err(_) => valid_ip(&addr.ip, &field, out),
        Ok(ip) if ip.is_loopback() => {
            out.push(FieldError::invalid(&field, &addr.ip, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
        }
        Ok(ip) if ip.is_multicast() || matches!(ip, std::net::IpAddr::V4(v4) if v4.is_link_local()) => out.push(
            FieldError::invalid(&field, &addr.ip, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"),
        ),
        Ok(_) => {}
    }
    if let Some(h) = addr.hostname.as_deref().filter(|h| !h.is_empty()) {
        push_msgs(out, &validation::child(path, "hostname"), h, validation::is_dns1123_label(h));
    }
}

impl Kind for EndpointsKind {
    type Obj = Endpoints;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Endpoints",
        plural: "endpoints",
        singular: "endpoints",
        namespaced: true,
        short_names: &["ep"],
        categories: &[],
        subresources: &[],
        storage: "endpoints",
        return_deleted_object: false,
    };

    fn validate(&self, ep: &Endpoints) -> ErrorList {
        let mut out = Vec::new();
        for (i, subset) in ep.subsets.iter().flatten().enumerate() {
            let path = validation::index("subsets", i);
            for (field, addrs) in [("addresses", &subset.addresses), ("notReadyAddresses", &subset.not_ready_addresses)]
            {
                for (j, addr) in slice(addrs).iter().enumerate() {
                    validate_address(addr, &validation::index(&validation::child(&path, field), j), &mut out);
                }
            }
            let ports = slice(&subset.ports);
            for (j, port) in ports.iter().enumerate() {
                let pp = validation::index(&validation::child(&path, "ports"), j);
                let name = opt(&port.name);
                if ports.len() > 1 && name.is_empty() {
                    out.push(required(&validation::child(&pp, "name")));
                } else if !name.is_empty() {
                    push_msgs(&mut out, &validation::child(&pp, "name"), name, validation::is_dns1123_label(name));
                }
                if !(1..=65535).contains(&port.port) {
                    out.push(invalid_raw(&validation::child(&pp, "port"), port.port, &range_error(1, 65535)));
                }
                let protocol = opt(&port.protocol);
                if !protocol.is_empty() && !PROTOCOLS.contains(&protocol) {
                    out.push(FieldError::not_supported(validation::child(&pp, "protocol"), protocol, PROTOCOLS));
                }
            }
        }
        out
    }

    fn prepare_create(&self, ep: &mut Endpoints) {
        for port in ep.subsets.iter_mut().flatten().flat_map(|s| s.ports.iter_mut().flatten()) {
            if opt(&port.protocol).is_empty() {
                port.protocol = Some("TCP".into());
            }
        }
    }

    fn prepare_update(&self, new: &mut Endpoints, _old: &Endpoints) {
        self.prepare_create(new);
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, Column::new("Endpoints", "string", "Endpoints of the service"), AGE_COLUMN]
    }

    fn cells(&self, ep: &Endpoints) -> Vec<Value> {
        vec![name_cell(&ep.metadata), json!(format_endpoints(ep)), age_cell(&ep.metadata)]
    }
}

/// The ENDPOINTS column (`formatEndpoints`): the first three ready `ip:port`s and how many more.
fn format_endpoints(ep: &Endpoints) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    let mut count = 0;
    for subset in ep.subsets.iter().flatten() {
        let addresses = slice(&subset.addresses);
        let ports = slice(&subset.ports);
        if ports.is_empty() {
            for addr in addresses {
                count += 1;
                if list.len() < MAX {
                    list.push(addr.ip.clone());
                }
            }
            continue;
        }
        for port in ports {
            for addr in addresses {
                count += 1;
                if list.len() < MAX {
                    list.push(
                        std::net::SocketAddr::new(
                            addr.ip.parse().unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
                            port.port as u16,
                        )
                        .to_string(),
                    );
                }
            }
        }
    }
    match (list.is_empty(), count > MAX) {
        (true, _) => "<none>".into(),
        (false, true) => format!("{} + {} more...", list.join(","), count - MAX),
        (false, false) => list.join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: Value) -> Service {
        let mut s: Service = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).unwrap();
        Services.prepare_create(&mut s);
        s
    }

    fn errs(spec: Value) -> Vec<String> {
        Services.validate(&svc(spec)).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = svc(json!({"ports": [{"port": 80}], "selector": {"app": "web"}, "sessionAffinity": "ClientIP"}));
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].target_port, Some(IntOrString::Int(80)));
        assert_eq!(spec.session_affinity_config.unwrap().client_ip.unwrap().timeout_seconds, Some(10800));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.external_traffic_policy, None);
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
        assert!(s.status.unwrap().load_balancer.is_some());
        let lb = svc(json!({"type": "LoadBalancer", "ports": [{"port": 80}]})).spec.unwrap();
        assert_eq!(lb.external_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(lb.allocate_load_balancer_node_ports, Some(true));
        let headless = svc(json!({"clusterIP": "None"})).spec.unwrap();
        assert_eq!(headless.cluster_ips, Some(vec!["None".to_string()]));
        assert_eq!(headless.ip_family_policy.as_deref(), Some("RequireDualStack"));
        let external = svc(json!({"type": "ExternalName", "externalName": "example.com"})).spec.unwrap();
        assert_eq!(external.ip_families, None);
        assert_eq!(external.internal_traffic_policy, None);
    }

    #[test]
    fn invalid_specs_get_upstreams_messages() {
        assert!(errs(json!({"ports": [{"port": 80}], "selector": {"app": "web"}})).is_empty());
        assert_eq!(errs(json!({})), ["spec.ports: Required value"]);
        assert_eq!(
            errs(json!({"ports": [{"port": 0}]})),
            [
                "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ports[0].targetPort: Invalid value: 0: must be between 1 and 65535, inclusive"
            ]
        );
        assert_eq!(
            errs(json!({"ports": [{"name": "a", "port": 80}, {"port": 81}]})),
            ["spec.ports[1].name: Required value"]
        );
        assert_eq!(
            errs(json!({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]})),
            ["spec.ports[1].name: Duplicate value: \"a\""]
        );
        assert_eq!(
            errs(json!({"ports": [{"port": 80, "protocol": "ICMP"}]})),
            ["spec.ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\""]
        );
        assert_eq!(
            errs(json!({"ports": [{"port": 80, "nodePort": 30080}]})),
            ["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"]
        );
        assert_eq!(
            errs(json!({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]})),
            ["spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services"]
        );
        assert_eq!(
            errs(json!({"clusterIP": "10.43.0.300", "ports": [{"port": 80}]})),
            [
                "spec.clusterIPs[0]: Invalid value: \"10.43.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
            ]
        );
        assert_eq!(errs(json!({"type": "ExternalName"})), ["spec.externalName: Required value"]);
        assert_eq!(
            errs(json!({"type": "Magic", "ports": [{"port": 80}]}))[0],
            "spec.type: Unsupported value: \"Magic\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
        );
        assert_eq!(
            errs(json!({"ports": [{"port": 80}], "externalTrafficPolicy": "Local"})),
            [
                "spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services"
            ]
        );
        assert_eq!(
            errs(
                json!({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}})
            ),
            [
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 0: must be greater than 0 and less than 86400"
            ]
        );
        assert_eq!(
            errs(json!({"ports": [{"port": 80}], "ipFamilies": ["IPv6"]})),
            ["spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"]
        );
        assert_eq!(
            errs(json!({"ports": [{"port": 80}], "selector": {"app": "bad value"}}))[0].split(':').next(),
            Some("spec.selector[app]")
        );
    }

    #[test]
    fn updates_keep_what_was_allocated_and_drop_what_the_type_no_longer_has() {
        let old = svc(
            json!({"type": "NodePort", "clusterIP": "10.43.0.7", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        );
        let mut new = svc(json!({"type": "NodePort", "ports": [{"name": "http", "port": 80}]}));
        Services.prepare_update(&mut new, &old);
        let spec = new.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.43.0.7"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].node_port, Some(30080));
        assert!(Services.validate_update(&new, &old).is_empty());

        let mut to_cluster_ip = old.clone();
        to_cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        Services.prepare_update(&mut to_cluster_ip, &old);
        let spec = to_cluster_ip.spec.as_ref().unwrap();
        assert_eq!(spec.ports.as_ref().unwrap()[0].node_port, None);
        assert_eq!(spec.external_traffic_policy, None);

        let mut moved = old.clone();
        moved.spec.as_mut().unwrap().cluster_ip = Some("10.43.0.8".into());
        moved.spec.as_mut().unwrap().cluster_ips = Some(vec!["10.43.0.8".into()]);
        let errs: Vec<String> = Services.validate_update(&moved, &old).iter().map(ToString::to_string).collect();
        assert_eq!(errs, ["spec.clusterIPs[0]: Invalid value: \"10.43.0.8\": may not change once set"]);
    }

    #[test]
    fn columns_read_as_kubectl_shows_them() {
        let mut s = svc(json!({"type": "NodePort", "clusterIP": "10.43.0.7", "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}, {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]}));
        let cells = Services.cells(&s);
        assert_eq!(
            cells[1..5],
            [json!("NodePort"), json!("10.43.0.7"), json!("<none>"), json!("80:30080/TCP,53:30053/UDP")]
        );
        assert_eq!(cells[6], json!("app=web"));
        s.spec.as_mut().unwrap().type_ = Some("LoadBalancer".into());
        assert_eq!(Services.cells(&s)[3], json!("<pending>"));
        let ep: Endpoints = serde_json::from_value(json!({"metadata": {"name": "web"}, "subsets": [{
            "addresses": [{"ip": "10.42.0.5"}, {"ip": "10.42.0.6"}], "ports": [{"port": 80}, {"port": 443}]}]}))
        .unwrap();
        assert_eq!(format_endpoints(&ep), "10.42.0.5:80,10.42.0.6:80,10.42.0.5:443 + 1 more...");
        assert_eq!(format_endpoints(&Endpoints::default()), "<none>");
    }
}
