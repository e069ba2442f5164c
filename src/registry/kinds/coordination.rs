//! `coordination.k8s.io/v1` Leases (node heartbeats, leader election).

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};

use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{ErrorList, FieldError};

pub struct Leases;

/// Store keys of node heartbeats: the Leases in `kube-node-lease`. Their renewals need no flush of
/// their own on the embedded store ([`crate::store::Options::deferred`]): the node lifecycle
/// controller gives every node a full grace period after a restart, within which its agent renews
/// again (reading the Lease anew when its renewal was lost), so a lost renewal costs nothing.
pub fn node_heartbeat_keys() -> String {
    format!("{}/kube-node-lease/", Leases::INFO.storage)
}

impl Kind for Leases {
    type Obj = Lease;
    const INFO: ResourceInfo = ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "leases.coordination.k8s.io",
        return_deleted_object: false,
    };

    fn validate(&self, lease: &Lease) -> ErrorList {
        let mut errs = Vec::new();
        let spec = lease.spec.clone().unwrap_or_default();
        if let Some(d) = spec.lease_duration_seconds
            && d <= 0
        {
            errs.push(FieldError::invalid("spec.leaseDurationSeconds", d, "must be greater than 0"));
        }
        if let Some(t) = spec.lease_transitions
            && t < 0
        {
            errs.push(FieldError::invalid("spec.leaseTransitions", t, "must be greater than or equal to 0"));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![NAME_COLUMN, Column::new("Holder", "string", "The holder of the lease"), AGE_COLUMN]
    }

    fn cells(&self, lease: &Lease) -> Vec<Value> {
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
        vec![name_cell(&lease.metadata), json!(holder), age_cell(&lease.metadata)]
    }
}
