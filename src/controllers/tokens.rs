//! Secrets of type `kubernetes.io/service-account-token` (upstream's serviceaccount-token
//! controller, `TokensController`): one made for an existing service account gets a long-lived
//! token of it, the cluster CA and the namespace in its data, and the account's UID in its
//! annotations; one whose account is gone, or was replaced, is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};
use crate::registry::kinds::config::{SERVICE_ACCOUNT_NAME_KEY, SERVICE_ACCOUNT_TOKEN, SERVICE_ACCOUNT_UID_KEY};

/// Signs a token for (namespace, account name, account UID, secret name); the error says why not.
pub type Mint = dyn Fn(&str, &str, &str, &str) -> Result<String, String> + Send + Sync;

pub struct Tokens {
    pub client: Client,
    pub mint: Arc<Mint>,
    /// The cluster CA (PEM), the Secret's `ca.crt`.
    pub ca: String,
    pub secrets: Store<Secret>,
}

/// Token Secrets, and the service accounts they name (a deleted account deletes its Secrets).
pub fn controller(client: &Client) -> (Controller<Secret>, Store<Secret>) {
    let by_type = watcher::Config::default().fields(&format!("type={SERVICE_ACCOUNT_TOKEN}"));
    let controller = Controller::new(Api::<Secret>::all(client.clone()), by_type);
    let secrets = controller.store();
    let store = secrets.clone();
    let controller =
        controller.watches(Api::<ServiceAccount>::all(client.clone()), watcher::Config::default(), move |sa| {
            let ns = sa.namespace();
            store
                .state()
                .iter()
                .filter(|s| s.namespace() == ns && account_of(s) == Some(sa.name_any().as_str()))
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        });
    (controller, secrets)
}

fn account_of(secret: &Secret) -> Option<&str> {
    secret.annotations().get(SERVICE_ACCOUNT_NAME_KEY).map(String::as_str)
}

impl Reconciler for Tokens {
    type Object = Secret;
    const NAME: &'static str = "serviceaccount-token";

    async fn synced(&self) -> bool {
        self.secrets.wait_until_ready().await.is_ok()
    }

    async fn reconcile(&self, secret: Arc<Secret>) -> Result<Action, Error> {
        let (Some(ns), Some(account)) = (secret.namespace(), account_of(&secret)) else {
            return Ok(Action::await_change());
        };
        if secret.type_.as_deref() != Some(SERVICE_ACCOUNT_TOKEN) || secret.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let sa = Api::<ServiceAccount>::namespaced(self.client.clone(), &ns).get_opt(account).await?;
        let uid = sa.as_ref().and_then(|sa| sa.metadata.uid.clone());
        let named_uid = secret.annotations().get(SERVICE_ACCOUNT_UID_KEY);
        let Some(uid) = uid.filter(|uid| named_uid.is_none_or(|named| named == uid)) else {
            let preconditions = Preconditions { uid: secret.metadata.uid.clone(), resource_version: None };
            let params = DeleteParams { preconditions: Some(preconditions), ..Default::default() };
            match secrets.delete(&secret.name_any(), &params).await {
                Ok(_) => {
                    tracing::info!("deleted secret {ns}/{}: its service account {account} is gone", secret.name_any())
                }
                Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(Action::await_change());
        };
        let data = secret.data.clone().unwrap_or_default();
        let has = |key: &str, want: &[u8]| data.get(key).is_some_and(|v| v.0 == want);
        let has_token = data.get("token").is_some_and(|t| !t.0.is_empty());
        if has_token && has("ca.crt", self.ca.as_bytes()) && has("namespace", ns.as_bytes()) && named_uid.is_some() {
            return Ok(Action::await_change());
        }
        let mut updated = (*secret).clone();
        let data: &mut BTreeMap<String, ByteString> = updated.data.get_or_insert_with(Default::default);
        if !has_token {
            let token = (self.mint)(&ns, account, &uid, &secret.name_any()).map_err(Error::Failed)?;
            data.insert("token".into(), ByteString(token.into_bytes()));
        }
        data.insert("ca.crt".into(), ByteString(self.ca.clone().into_bytes()));
        data.insert("namespace".into(), ByteString(ns.clone().into_bytes()));
        updated.annotations_mut().insert(SERVICE_ACCOUNT_UID_KEY.into(), uid);
        match secrets.replace(&secret.name_any(), &PostParams::default(), &updated).await {
            Ok(_) => tracing::debug!("filled in the token of secret {ns}/{}", secret.name_any()),
            // Changed meanwhile (its event brings it back) or gone.
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}
