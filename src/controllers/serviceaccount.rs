//! Every active namespace has a `default` ServiceAccount (upstream's serviceaccount controller).
//!
//! The shape every controller here has: a [`Reconciler`] for one object, and a `controller` that
//! says which changes call it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};

const DEFAULT: &str = "default";

pub struct ServiceAccounts {
    pub client: Client,
}

/// Namespaces, and their `default` account's deletion.
pub fn controller(client: &Client) -> Controller<Namespace> {
    Controller::new(Api::all(client.clone()), watcher::Config::default()).watches(
        Api::<ServiceAccount>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={DEFAULT}")),
        |sa| sa.namespace().map(|ns| ObjectRef::new(&ns)),
    )
}

impl Reconciler for ServiceAccounts {
    type Object = Namespace;
    const NAME: &'static str = "serviceaccount";

    async fn reconcile(&self, ns: Arc<Namespace>) -> Result<Action, Error> {
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &ns.name_any());
        if accounts.get_opt(DEFAULT).await?.is_some() {
            return Ok(Action::await_change());
        }
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some(DEFAULT.into()), ..Default::default() },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &sa).await {
            Ok(_) => tracing::debug!("created service account {}/{DEFAULT}", ns.name_any()),
            // Made meanwhile, or the namespace is going: nothing to do.
            Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404 | 409) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}
