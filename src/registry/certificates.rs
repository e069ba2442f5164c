//! The admission of CertificateSigningRequests that needs more than the object: who asked goes into
//! the request (upstream's strategy fills `spec.username`, `uid`, `groups`, `extra` from the user),
//! `kube-apiserver-client` requests may not ask for `system:masters` (`CertificateSubjectRestriction`),
//! and approving or denying one needs the `approve` verb on its signer (`CertificateApproval`).

use serde_json::{Value, json};

use super::kinds::certificates::KUBE_APISERVER_CLIENT;
use super::rbac::Requester;
use super::{GroupResource, Registry, Result, StatusError};

const MASTERS: &str = "system:masters";

fn csr_resource() -> GroupResource {
    GroupResource { group: super::kinds::certificates::GROUP.into(), resource: "certificatesigningrequests".into() }
}

/// The organizations (groups) a PEM certificate request asks for, every one of them.
pub fn requested_groups(request_pem: &str) -> Vec<String> {
    use x509_parser::prelude::FromDer as _;
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(request_pem.as_bytes()) else { return Vec::new() };
    let Ok((_, csr)) = x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents) else {
        return Vec::new();
    };
    let subject = &csr.certification_request_info.subject;
    subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect()
}

/// The PEM of a request's `spec.request` (base64 in JSON).
fn request_pem(csr: &Value) -> String {
    use base64::Engine as _;
    let b64 = csr["spec"]["request"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Registry {
    /// A new request: its requester, and no `system:masters` from the API server client signer.
    pub(super) fn admit_csr_create(&self, csr: &mut Value, who: Option<&Requester>) -> Result<()> {
        let name = csr["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if let Some(who) = who {
            let spec = &mut csr["spec"];
            spec["username"] = json!(who.name);
            spec["groups"] = json!(who.groups);
            match who.uid.is_empty() {
                true => drop(spec.as_object_mut().map(|s| s.remove("uid"))),
                false => spec["uid"] = json!(who.uid),
            }
            match who.extra.is_empty() {
                true => drop(spec.as_object_mut().map(|s| s.remove("extra"))),
                false => spec["extra"] = json!(who.extra),
            }
        }
        if csr["spec"]["signerName"] == KUBE_APISERVER_CLIENT
            && requested_groups(&request_pem(csr)).iter().any(|g| g == MASTERS)
        {
            return Err(StatusError::forbidden(
                &csr_resource(),
                &name,
                format!("use of {KUBE_APISERVER_CLIENT} signer with {MASTERS} group is not allowed"),
            ));
        }
        Ok(())
    }

    /// Approving or denying through `approval`: the writer may `approve` for the signer (by its
    /// name, or `<domain>/*`).
    pub(super) fn admit_csr_approval(&self, csr: &Value, who: Option<&Requester>) -> Result<()> {
        let Some(who) = who else { return Ok(()) };
        let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
        let domain_wide = signer.split_once('/').map(|(domain, _)| format!("{domain}/*")).unwrap_or_default();
        let group = super::kinds::certificates::GROUP;
        if self.may(who, "approve", group, "signers", signer)
            || self.may(who, "approve", group, "signers", &domain_wide)
        {
            return Ok(());
        }
        let name = csr["metadata"]["name"].as_str().unwrap_or_default();
        Err(StatusError::forbidden(
            &csr_resource(),
            name,
            format!("user not permitted to approve requests with signerName {signer:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_of_a_request_are_its_organizations() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, "jane");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:masters");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        assert_eq!(requested_groups(&pem), ["system:masters"]);
        assert!(requested_groups("not a request").is_empty());
    }
}
