//! The `kubernetes.io/kube-apiserver-client` signer (kube-controller-manager's csrsigning): an
//! approved CertificateSigningRequest for it gets a client certificate from the cluster CA, valid
//! for its `expirationSeconds` (a year at most); one whose usages do not fit a client certificate
//! is marked `Failed` (`SignerValidationFailure`). Requests for other signers are left to them.

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};
use crate::registry::kinds::certificates::{APPROVED, FAILED, KUBE_APISERVER_CLIENT, condition};

/// `--cluster-signing-duration`'s default: the longest a signed certificate lives.
const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// Signs a PEM request for the given lifetime; the error says why not.
pub type Sign = dyn Fn(&str, std::time::Duration) -> Result<String, String> + Send + Sync;

pub struct Signer {
    pub client: Client,
    pub sign: Arc<Sign>,
}

pub fn controller(client: &Client) -> Controller<CertificateSigningRequest> {
    Controller::new(Api::all(client.clone()), watcher::Config::default())
}

/// `validAPIServerClientUsages`: client auth, and at most digital signature and key encipherment.
fn check_usages(usages: &[String]) -> Result<(), String> {
    for u in usages {
        if !matches!(u.as_str(), "digital signature" | "key encipherment" | "client auth") {
            return Err(format!("invalid usage for client certificate: {u}"));
        }
    }
    if !usages.iter().any(|u| u == "client auth") {
        return Err("missing required usage for client certificate: client auth".into());
    }
    Ok(())
}

impl Reconciler for Signer {
    type Object = CertificateSigningRequest;
    const NAME: &'static str = "csrsigning";

    async fn reconcile(&self, csr: Arc<CertificateSigningRequest>) -> Result<Action, Error> {
        let issued = csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty());
        if csr.spec.signer_name != KUBE_APISERVER_CLIENT
            || condition(&csr, APPROVED).is_none()
            || condition(&csr, FAILED).is_some()
            || issued
        {
            return Ok(Action::await_change());
        }
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let lifetime = csr
            .spec
            .expiration_seconds
            .map_or(MAX_DURATION, |s| std::time::Duration::from_secs(s.max(600) as u64))
            .min(MAX_DURATION);
        let request = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
        let signed =
            check_usages(csr.spec.usages.as_deref().unwrap_or_default()).and_then(|()| (self.sign)(&request, lifetime));
        let patch = match signed {
            Ok(pem) => {
                tracing::info!("issued a client certificate for certificatesigningrequest {}", csr.name_any());
                serde_json::json!({"status": {"certificate": ByteString(pem.into_bytes())}})
            }
            Err(why) => {
                tracing::info!("certificatesigningrequest {} cannot be signed: {why}", csr.name_any());
                let mut conditions = csr.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                conditions.push(CertificateSigningRequestCondition {
                    type_: FAILED.into(),
                    status: "True".into(),
                    reason: Some("SignerValidationFailure".into()),
                    message: Some(why),
                    last_update_time: Some(now.clone()),
                    last_transition_time: Some(now),
                });
                serde_json::json!({"status": {"conditions": conditions}})
            }
        };
        match api.patch_status(&csr.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_need_client_auth_and_nothing_more() {
        let u = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_usages(&u(&["client auth"])).is_ok());
        assert!(check_usages(&u(&["digital signature", "key encipherment", "client auth"])).is_ok());
        assert_eq!(
            check_usages(&u(&["server auth", "client auth"])).unwrap_err(),
            "invalid usage for client certificate: server auth"
        );
        assert_eq!(
            check_usages(&u(&["digital signature"])).unwrap_err(),
            "missing required usage for client certificate: client auth"
        );
    }
}
