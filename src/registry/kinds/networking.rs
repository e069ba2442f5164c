//! `networking.k8s.io/v1` IPAddresses: one object per cluster IP in use, named after the address,
//! pointing at the Service that holds it (the MultiCIDRServiceAllocator's records). The service
//! registry creates one before it stores a Service with that IP, so creating it is the reservation.

use k8s_openapi::api::networking::v1::IPAddress;
use serde_json::{Value, json};

use super::pod_rules::required;
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

pub struct IpAddresses;

/// The labels the allocator puts on the IPAddresses it makes.
pub const FAMILY_LABEL: &str = "ipaddress.kubernetes.io/ip-family";
pub const MANAGED_BY_LABEL: &str = "ipaddress.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "ipallocator.k8s.io";

impl Kind for IpAddresses {
    type Obj = IPAddress;
    const INFO: ResourceInfo = ResourceInfo {
        group: "networking.k8s.io",
        version: "v1",
        kind: "IPAddress",
        plural: "ipaddresses",
        singular: "ipaddress",
        namespaced: false,
        short_names: &["ip"],
        categories: &[],
        subresources: &[],
        storage: "ipaddresses.networking.k8s.io",
        return_deleted_object: false,
    };

    fn validate(&self, ip: &IPAddress) -> ErrorList {
        let mut out = Vec::new();
        let name = ip.metadata.name.clone().unwrap_or_default();
        match name.parse::<std::net::IpAddr>() {
            Ok(parsed) if parsed.to_string() == name => {}
            Ok(parsed) => out.push(FieldError::invalid(
                "metadata.name",
                &name,
                format!("must be in canonical form (\"{parsed}\")"),
            )),
            Err(_) => out.push(FieldError::invalid("metadata.name", &name, "must be a valid IP address")),
        }
        let parent = &ip.spec.parent_ref;
        if parent.resource.is_empty() {
            out.push(required("spec.parentRef.resource"));
        }
        if parent.name.is_empty() {
            out.push(required("spec.parentRef.name"));
        }
        out
    }

    fn validate_update(&self, new: &IPAddress, old: &IPAddress) -> ErrorList {
        let mut out = self.validate(new);
        if new.spec != old.spec {
            out.push(FieldError::invalid_raw("spec.parentRef", "{...}", "field is immutable"));
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, Column::new("ParentRef", "string", "The IPAddress ParentReference."), AGE_COLUMN]
    }

    fn cells(&self, ip: &IPAddress) -> Vec<Value> {
        let parent = Some(&ip.spec.parent_ref).filter(|p| !p.name.is_empty()).map_or("<none>".to_string(), |p| {
            let gr = if p.group.as_deref().unwrap_or("").is_empty() {
                p.resource.clone()
            } else {
                format!("{}.{}", p.resource, p.group.as_deref().unwrap_or(""))
            };
            let ns = p.namespace.as_deref().filter(|n| !n.is_empty()).map(|n| format!("/{n}")).unwrap_or_default();
            format!("{gr}{ns}/{}", p.name).to_lowercase()
        });
        vec![name_cell(&ip.metadata), json!(parent), age_cell(&ip.metadata)]
    }
}
