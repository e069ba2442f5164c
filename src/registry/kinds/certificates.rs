//! `certificates.k8s.io/v1` CertificateSigningRequests, as upstream's `pkg/registry/certificates`:
//! the request and its requester (filled in by the registry from who creates it) are fixed at
//! create; `approval` changes only the Approved/Denied conditions, `status` only the certificate
//! and the other conditions; validation as `pkg/apis/certificates/validation`.

use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::registry::strategy::{
    AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, human_duration, name_cell,
};
use crate::registry::subresource::Subresource;
use crate::registry::validation::{self, ErrorList, FieldError};

pub const GROUP: &str = "certificates.k8s.io";
pub const APPROVED: &str = "Approved";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";
/// The signer of client certificates for the API server (`kubectl certificate approve` users).
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";

/// Key usages a request may name (`KeyUsage` constants).
const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

pub struct CertificateSigningRequests;

/// The condition of `type_` that is `True`, if any.
pub fn condition<'a>(
    csr: &'a CertificateSigningRequest,
    type_: &str,
) -> Option<&'a CertificateSigningRequestCondition> {
    conditions(csr).iter().rfind(|c| c.type_ == type_ && c.status == "True")
}

fn conditions(csr: &CertificateSigningRequest) -> &[CertificateSigningRequestCondition] {
    csr.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn is_approval(c: &CertificateSigningRequestCondition) -> bool {
    c.type_ == APPROVED || c.type_ == DENIED
}

/// `ValidateCertificateSigningRequestCreate`'s spec checks.
fn validate_spec(csr: &CertificateSigningRequest, out: &mut ErrorList) {
    let spec = &csr.spec;
    if spec.request.0.is_empty() {
        out.push(FieldError::required("spec.request", ""));
    } else {
        let text = String::from_utf8_lossy(&spec.request.0);
        if !text.contains("-----BEGIN CERTIFICATE REQUEST-----") {
            out.push(FieldError::invalid_raw(
                "spec.request",
                "[]byte{...}",
                "PEM block type must be CERTIFICATE REQUEST",
            ));
        } else if let Err(e) = rcgen::CertificateSigningRequestParams::from_pem(&text) {
            out.push(FieldError::invalid_raw("spec.request", "[]byte{...}", format!("{e}")));
        }
    }
    if spec.signer_name.is_empty() {
        out.push(FieldError::required("spec.signerName", ""));
    } else {
        validate_signer_name(&spec.signer_name, out);
    }
    match spec.usages.as_deref() {
        None | Some([]) => out.push(FieldError::required("spec.usages", "")),
        Some(usages) => {
            for (i, u) in usages.iter().enumerate() {
                let field = validation::index("spec.usages", i);
                if !USAGES.contains(&u.as_str()) {
                    out.push(FieldError::not_supported(&field, u, USAGES));
                } else if usages[..i].contains(u) {
                    out.push(FieldError::duplicate(&field, u));
                }
            }
        }
    }
    if let Some(secs) = spec.expiration_seconds.filter(|s| *s < 600) {
        out.push(FieldError::invalid_raw(
            "spec.expirationSeconds",
            secs,
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
}

/// `ValidateSignerName`: a fully qualified domain, a `/`, and a path.
fn validate_signer_name(name: &str, out: &mut ErrorList) {
    let Some((domain, path)) = name.split_once('/') else {
        out.push(FieldError::invalid(
            "spec.signerName",
            name,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    };
    if path.is_empty() {
        out.push(FieldError::invalid("spec.signerName", name, "validating path: path must not be empty"));
    }
    for e in validation::is_dns1123_subdomain(domain) {
        out.push(FieldError::invalid("spec.signerName", name, format!("validating domain: {e}")));
    }
    if !domain.contains('.') {
        out.push(FieldError::invalid(
            "spec.signerName",
            name,
            "should be a domain with at least two segments separated by dots",
        ));
    }
}

/// `validateConditions` and the rules of updating them.
fn validate_conditions(new: &CertificateSigningRequest, old: Option<&CertificateSigningRequest>, out: &mut ErrorList) {
    let list = conditions(new);
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let field = validation::index("status.conditions", i);
        if c.type_.is_empty() {
            out.push(FieldError::required(validation::child(&field, "type"), ""));
        }
        let status_field = validation::child(&field, "status");
        if [APPROVED, DENIED, FAILED].contains(&c.type_.as_str()) {
            if c.status != "True" {
                out.push(FieldError::not_supported(&status_field, &c.status, &["True"]));
            }
            if seen.contains(&c.type_.as_str()) {
                out.push(FieldError::duplicate(validation::child(&field, "type"), &c.type_));
            }
        } else if !["True", "False", "Unknown"].contains(&c.status.as_str()) {
            out.push(FieldError::not_supported(&status_field, &c.status, &["False", "True", "Unknown"]));
        }
        seen.push(&c.type_);
    }
    if seen.contains(&APPROVED) && seen.contains(&DENIED) {
        let i = list.iter().rposition(is_approval).unwrap_or_default();
        out.push(FieldError::invalid(
            validation::child(&validation::index("status.conditions", i), "type"),
            &list[i].type_,
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    let Some(old) = old else { return };
    for kind in [APPROVED, DENIED, FAILED] {
        if condition(old, kind).is_some() && condition(new, kind).is_none() {
            out.push(FieldError::forbidden(
                "status.conditions",
                format!("updates may not remove a condition of type {kind:?}"),
            ));
        }
    }
    let old_cert = old.status.as_ref().and_then(|s| s.certificate.as_ref());
    let new_cert = new.status.as_ref().and_then(|s| s.certificate.as_ref());
    if old_cert.is_some_and(|c| !c.0.is_empty()) && old_cert != new_cert {
        out.push(FieldError::forbidden("status.certificate", "updates may not modify existing certificate content"));
    }
}

/// Sets the times of conditions that are new or changed (`populateConditionTimestamps`).
fn stamp_conditions(new: &mut CertificateSigningRequest, old: Option<&CertificateSigningRequest>) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let before = old.map(conditions).unwrap_or_default().to_vec();
    for c in new.status.iter_mut().flat_map(|s| s.conditions.iter_mut().flatten()) {
        let previous = before.iter().find(|o| o.type_ == c.type_);
        if c.last_update_time.is_none() {
            c.last_update_time = Some(now.clone());
        }
        if c.last_transition_time.is_none() {
            c.last_transition_time = match previous {
                Some(p) if p.status == c.status => p.last_transition_time.clone().or(Some(now.clone())),
                _ => Some(now.clone()),
            };
        }
    }
}

/// The CONDITION column: `Approved,Issued`, `Pending`, `Denied`, `Failed`.
fn condition_cell(csr: &CertificateSigningRequest) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for kind in [APPROVED, DENIED, FAILED] {
        if condition(csr, kind).is_some() {
            parts.push(kind);
        }
    }
    if parts.is_empty() {
        parts.push("Pending");
    }
    if csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty()) {
        parts.push("Issued");
    }
    parts.join(",")
}

impl Kind for CertificateSigningRequests {
    type Obj = CertificateSigningRequest;
    const INFO: ResourceInfo = ResourceInfo {
        group: GROUP,
        version: "v1",
        kind: "CertificateSigningRequest",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        namespaced: false,
        short_names: &["csr"],
        categories: &[],
        subresources: &[Subresource::Status, Subresource::Approval],
        storage: "certificatesigningrequests",
        return_deleted_object: false,
    };
    const FIELDS: &'static [&'static str] = &["spec.signerName"];

    fn prepare_create(&self, csr: &mut CertificateSigningRequest) {
        csr.status = None;
    }

    fn validate(&self, csr: &CertificateSigningRequest) -> ErrorList {
        let mut out = ErrorList::new();
        validate_spec(csr, &mut out);
        out
    }

    /// Only metadata changes through the main resource.
    fn prepare_update(&self, new: &mut CertificateSigningRequest, old: &CertificateSigningRequest) {
        new.spec = old.spec.clone();
        new.status = old.status.clone();
    }

    fn validate_update(&self, _new: &CertificateSigningRequest, _old: &CertificateSigningRequest) -> ErrorList {
        ErrorList::new()
    }

    /// The signer's: the certificate and conditions other than Approved and Denied.
    fn prepare_status_update(&self, new: &mut CertificateSigningRequest, old: &CertificateSigningRequest) {
        new.spec = old.spec.clone();
        let kept: Vec<_> = conditions(old).iter().filter(|c| is_approval(c)).cloned().collect();
        let status = new.status.get_or_insert_with(Default::default);
        let mut list: Vec<_> =
            status.conditions.take().unwrap_or_default().into_iter().filter(|c| !is_approval(c)).collect();
        list.splice(0..0, kept);
        status.conditions = (!list.is_empty()).then_some(list);
        stamp_conditions(new, Some(old));
    }

    fn validate_status_update(&self, new: &CertificateSigningRequest, old: &CertificateSigningRequest) -> ErrorList {
        let mut out = ErrorList::new();
        validate_conditions(new, Some(old), &mut out);
        out
    }

    /// `approval`: only the Approved and Denied conditions change.
    fn prepare_subresource_update(
        &self,
        _sub: Subresource,
        new: &mut CertificateSigningRequest,
        old: &CertificateSigningRequest,
    ) {
        new.spec = old.spec.clone();
        let approvals: Vec<_> = conditions(new).iter().filter(|c| is_approval(c)).cloned().collect();
        let mut status = old.status.clone().unwrap_or_default();
        let mut list: Vec<_> =
            status.conditions.take().unwrap_or_default().into_iter().filter(|c| !is_approval(c)).collect();
        list.extend(approvals);
        status.conditions = (!list.is_empty()).then_some(list);
        new.status = Some(status);
        stamp_conditions(new, Some(old));
    }

    fn validate_subresource_update(
        &self,
        sub: Subresource,
        new: &CertificateSigningRequest,
        old: &CertificateSigningRequest,
    ) -> ErrorList {
        let mut out = ErrorList::new();
        match sub {
            Subresource::Approval => validate_conditions(new, Some(old), &mut out),
            other => out.push(FieldError::forbidden("", format!("updates through {} are not served", other.name()))),
        }
        out
    }

    fn field(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "spec.signerName" => obj["spec"]["signerName"].as_str().map(str::to_string),
            _ => None,
        }
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            AGE_COLUMN,
            Column::new("SignerName", "string", "Name of the signer that will sign the request."),
            Column::new("Requestor", "string", "Name of the user that created the request."),
            Column::new("RequestedDuration", "string", "Requested certificate lifetime."),
            Column::new("Condition", "string", "Current condition of the certificate request."),
        ]
    }

    fn cells(&self, csr: &CertificateSigningRequest) -> Vec<Value> {
        vec![
            name_cell(&csr.metadata),
            age_cell(&csr.metadata),
            json!(csr.spec.signer_name),
            json!(csr.spec.username.clone().unwrap_or_default()),
            json!(csr.spec.expiration_seconds.map_or("<none>".to_string(), |s| human_duration(s.into()))),
            json!(condition_cell(csr)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(v: Value) -> CertificateSigningRequest {
        serde_json::from_value(v).unwrap()
    }

    fn request_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, "jane");
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn requests_need_a_csr_a_signer_and_known_usages() {
        use base64::Engine as _;
        let good = base64::engine::general_purpose::STANDARD.encode(request_pem());
        let ok = csr(json!({"metadata": {"name": "a"}, "spec": {
            "request": good, "signerName": KUBE_APISERVER_CLIENT, "usages": ["client auth"], "expirationSeconds": 600}}));
        assert_eq!(messages(&CertificateSigningRequests.validate(&ok)), Vec::<String>::new());
        let bad = csr(json!({"metadata": {"name": "b"}, "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode("hello"), "signerName": "nodomain",
            "usages": ["client auth", "flying", "client auth"], "expirationSeconds": 60}}));
        assert_eq!(
            messages(&CertificateSigningRequests.validate(&bad)),
            [
                "spec.request: Invalid value: []byte{...}: PEM block type must be CERTIFICATE REQUEST",
                "spec.signerName: Invalid value: \"nodomain\": must be a fully qualified domain and path of the form 'example.com/signer-name'",
                format!(
                    "spec.usages[1]: Unsupported value: \"flying\": supported values: {}",
                    USAGES.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", ")
                )
                .as_str(),
                "spec.usages[2]: Duplicate value: \"client auth\"",
                "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)",
            ]
        );
    }

    #[test]
    fn approval_changes_only_approval_and_may_not_take_it_back() {
        let old = csr(
            json!({"metadata": {"name": "a"}, "spec": {"request": "", "signerName": "x.io/y", "usages": ["client auth"]}}),
        );
        let mut approved = csr(json!({"metadata": {"name": "a"}, "spec": {"request": "", "signerName": "other.io/z"},
            "status": {"certificate": "Y2VydA==", "conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove"}]}}));
        CertificateSigningRequests.prepare_subresource_update(Subresource::Approval, &mut approved, &old);
        assert_eq!(approved.spec.signer_name, "x.io/y", "the spec is kept");
        assert!(approved.status.as_ref().unwrap().certificate.is_none(), "approval does not issue");
        assert!(condition(&approved, APPROVED).unwrap().last_update_time.is_some());
        assert_eq!(condition_cell(&approved), "Approved");
        assert!(
            CertificateSigningRequests.validate_subresource_update(Subresource::Approval, &approved, &old).is_empty()
        );

        let mut both = approved.clone();
        both.status.as_mut().unwrap().conditions.as_mut().unwrap().push(CertificateSigningRequestCondition {
            type_: DENIED.into(),
            status: "True".into(),
            ..Default::default()
        });
        assert_eq!(
            messages(&CertificateSigningRequests.validate_subresource_update(Subresource::Approval, &both, &approved)),
            [
                "status.conditions[1].type: Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
            ]
        );
        let mut withdrawn = approved.clone();
        withdrawn.status.as_mut().unwrap().conditions = None;
        assert_eq!(
            messages(&CertificateSigningRequests.validate_subresource_update(
                Subresource::Approval,
                &withdrawn,
                &approved
            )),
            ["status.conditions: Forbidden: updates may not remove a condition of type \"Approved\""]
        );

        // The signer's status update keeps the approval and adds the certificate.
        let mut issued = csr(json!({"metadata": {"name": "a"}, "spec": {"request": "", "signerName": "x.io/y"},
            "status": {"certificate": "Y2VydA=="}}));
        CertificateSigningRequests.prepare_status_update(&mut issued, &approved);
        assert!(condition(&issued, APPROVED).is_some());
        assert_eq!(condition_cell(&issued), "Approved,Issued");
    }
}
