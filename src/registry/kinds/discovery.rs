//! `discovery.k8s.io/v1` EndpointSlices: validation (`ValidateEndpointSlice`), the immutable
//! address type, and the `kubectl get endpointslices` columns.

use std::collections::HashSet;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::pod_rules::{dns_label, dns_subdomain, invalid_raw, opt, range_error, required, slice};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

pub struct EndpointSlices;

const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
/// Upstream's `maxEndpoints`, `maxAddresses` and `maxPorts`.
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 20000;

fn validate_address(address: &str, ty: &str, field: &str, out: &mut ErrorList) {
    match ty {
        "IPv4" => match address.parse::<std::net::Ipv4Addr>() {
            Err(_) => out.push(FieldError::invalid(field, address, "must be a valid IPv4 address")),
            Ok(ip) if ip.is_loopback() => {
                out.push(FieldError::invalid(field, address, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
            }
            Ok(_) => {}
        },
        "IPv6" if address.parse::<std::net::Ipv6Addr>().is_err() => {
            out.push(FieldError::invalid(field, address, "must be a valid IPv6 address"))
        }
        "FQDN" => dns_subdomain(address, field, out),
        _ => {}
    }
}

impl Kind for EndpointSlices {
    type Obj = EndpointSlice;
    const INFO: ResourceInfo = ResourceInfo {
        group: "discovery.k8s.io",
        version: "v1",
        kind: "EndpointSlice",
        plural: "endpointslices",
        singular: "endpointslice",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "endpointslices.discovery.k8s.io",
        return_deleted_object: false,
    };
    const GENERATION: bool = true;

    fn validate(&self, slice_obj: &EndpointSlice) -> ErrorList {
        let mut out = Vec::new();
        let ty = slice_obj.address_type.as_str();
        if ty.is_empty() {
            out.push(required("addressType"));
        } else if !ADDRESS_TYPES.contains(&ty) {
            out.push(FieldError::not_supported("addressType", ty, ADDRESS_TYPES));
        }
        let endpoints = slice(&slice_obj.endpoints);
        if endpoints.len() > MAX_ENDPOINTS {
            out.push(FieldError::too_many("endpoints", endpoints.len(), MAX_ENDPOINTS));
        }
        for (i, ep) in endpoints.iter().enumerate() {
            let path = validation::index("endpoints", i);
            let addresses = validation::child(&path, "addresses");
            if ep.addresses.is_empty() {
                out.push(FieldError::required(&addresses, "must contain at least 1 address"));
            } else if ep.addresses.len() > MAX_ADDRESSES {
                out.push(FieldError::too_many(&addresses, ep.addresses.len(), MAX_ADDRESSES));
            }
            for (j, a) in ep.addresses.iter().enumerate() {
                validate_address(a, ty, &validation::index(&addresses, j), &mut out);
            }
            if let Some(h) = ep.hostname.as_deref() {
                dns_label(h, &validation::child(&path, "hostname"), &mut out);
            }
            if let Some(n) = ep.node_name.as_deref() {
                dns_subdomain(n, &validation::child(&path, "nodeName"), &mut out);
            }
        }
        let ports = slice(&slice_obj.ports);
        if ports.len() > MAX_PORTS {
            out.push(FieldError::too_many("ports", ports.len(), MAX_PORTS));
        }
        let mut names = HashSet::new();
        for (i, port) in ports.iter().enumerate() {
            let path = validation::index("ports", i);
            let name = opt(&port.name);
            if !name.is_empty() {
                dns_label(name, &validation::child(&path, "name"), &mut out);
            }
            if !names.insert(name) {
                out.push(FieldError::duplicate(validation::child(&path, "name"), name));
            }
            if let Some(p) = port.port.filter(|p| !(1..=65535).contains(p)) {
                out.push(invalid_raw(&validation::child(&path, "port"), p, &range_error(1, 65535)));
            }
            let protocol = opt(&port.protocol);
            if !protocol.is_empty() && !["SCTP", "TCP", "UDP"].contains(&protocol) {
                out.push(FieldError::not_supported(
                    validation::child(&path, "protocol"),
                    protocol,
                    &["SCTP", "TCP", "UDP"],
                ));
            }
        }
        out
    }

    fn prepare_create(&self, s: &mut EndpointSlice) {
        for port in s.ports.iter_mut().flatten() {
            if opt(&port.protocol).is_empty() {
                port.protocol = Some("TCP".into());
            }
        }
    }

    fn prepare_update(&self, new: &mut EndpointSlice, _old: &EndpointSlice) {
        self.prepare_create(new);
    }

    fn validate_update(&self, new: &EndpointSlice, old: &EndpointSlice) -> ErrorList {
        let mut out = self.validate(new);
        if new.address_type != old.address_type {
            out.push(FieldError::invalid("addressType", &new.address_type, "field is immutable"));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new("AddressType", "string", "The IP protocol for this slice"),
            Column::new("Ports", "string", "The ports for this slice"),
            Column::new("Endpoints", "string", "First N endpoints for this slice"),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, s: &EndpointSlice) -> Vec<Value> {
        const MAX: usize = 3;
        let shorten = |all: Vec<String>| match all.len() {
            0 => "<unset>".to_string(),
            n if n > MAX => format!("{} + {} more...", all[..MAX].join(","), n - MAX),
            _ => all.join(","),
        };
        let ports: Vec<String> = slice(&s.ports).iter().filter_map(|p| p.port).map(|p| p.to_string()).collect();
        let addresses: Vec<String> = slice(&s.endpoints).iter().flat_map(|e| e.addresses.iter().cloned()).collect();
        vec![
            name_cell(&s.metadata),
            json!(s.address_type),
            json!(shorten(ports)),
            json!(shorten(addresses)),
            age_cell(&s.metadata),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(v: Value) -> Vec<String> {
        let mut obj = json!({"metadata": {"name": "web-abcde"}});
        obj.as_object_mut().unwrap().extend(v.as_object().unwrap().clone());
        EndpointSlices.validate(&serde_json::from_value(obj).unwrap()).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn slices_are_checked_as_upstream() {
        assert!(
            errs(json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.42.0.5"]}], "ports": [{"port": 80}]}))
                .is_empty()
        );
        assert_eq!(
            errs(json!({"addressType": "IPv4", "endpoints": [{"addresses": ["fe80::1"]}]})),
            ["endpoints[0].addresses[0]: Invalid value: \"fe80::1\": must be a valid IPv4 address"]
        );
        assert_eq!(
            errs(json!({"addressType": "IPv4", "endpoints": [{"addresses": []}]})),
            ["endpoints[0].addresses: Required value: must contain at least 1 address"]
        );
        assert_eq!(
            errs(json!({"addressType": "Mac", "endpoints": []}))[0],
            "addressType: Unsupported value: \"Mac\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
        );
    }

    #[test]
    fn columns_show_ports_and_first_endpoints() {
        let s: EndpointSlice = serde_json::from_value(json!({"metadata": {"name": "web-abcde"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.42.0.5"]}, {"addresses": ["10.42.0.6"]}, {"addresses": ["10.42.0.7"]}, {"addresses": ["10.42.0.8"]}],
            "ports": [{"port": 80}]}))
        .unwrap();
        let cells = EndpointSlices.cells(&s);
        assert_eq!(cells[2], json!("80"));
        assert_eq!(cells[3], json!("10.42.0.5,10.42.0.6,10.42.0.7 + 1 more..."));
    }
}
