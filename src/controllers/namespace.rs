//! Namespace deletion (upstream's namespace controller): a terminating namespace is emptied,
//! resource by resource as discovery lists them, then its `kubernetes` finalizer is removed through
//! `/finalize`, which lets the storage delete it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};
use crate::registry::kinds::NAMESPACE_FINALIZER;

/// How soon a namespace whose content is still going is looked at again.
const RECHECK: Duration = Duration::from_secs(2);

pub struct Namespaces {
    pub client: Client,
}

pub fn controller(client: &Client) -> Controller<Namespace> {
    Controller::new(Api::all(client.clone()), watcher::Config::default())
}

impl Reconciler for Namespaces {
    type Object = Namespace;
    const NAME: &'static str = "namespace";

    async fn reconcile(&self, ns: Arc<Namespace>) -> Result<Action, Error> {
        let finalizers = ns.spec.as_ref().and_then(|s| s.finalizers.as_ref());
        if ns.metadata.deletion_timestamp.is_none()
            || !finalizers.is_some_and(|f| f.iter().any(|f| f == NAMESPACE_FINALIZER))
        {
            return Ok(Action::await_change());
        }
        let name = ns.name_any();
        if self.delete_content(&name).await? > 0 {
            return Ok(Action::requeue(RECHECK));
        }
        let mut body = (*ns).clone();
        if let Some(f) = body.spec.as_mut().and_then(|s| s.finalizers.as_mut()) {
            f.retain(|f| f != NAMESPACE_FINALIZER);
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        match namespaces.replace_subresource("finalize", &name, &PostParams::default(), &body).await {
            Ok(_) => tracing::info!("namespace {name} is empty and finalized"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}

impl Namespaces {
    /// Asks for everything in `ns` to be deleted; returns how many objects are still there (those
    /// terminating gracefully, or made meanwhile).
    async fn delete_content(&self, ns: &str) -> Result<usize, Error> {
        let discovery = Discovery::new(self.client.clone()).run().await.map_err(Error::Discovery)?;
        let mut left = 0;
        for group in discovery.groups() {
            for (resource, caps) in group.recommended_resources() {
                if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::DELETE_COLLECTION) {
                    continue;
                }
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &resource);
                match api.delete_collection(&DeleteParams::default(), &ListParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                    Err(e) => return Err(e.into()),
                }
                left += api.list(&ListParams::default().limit(1)).await?.items.len();
            }
        }
        Ok(left)
    }
}
