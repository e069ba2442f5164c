//! Namespace deletion (upstream's namespace controller): a terminating namespace is emptied,
//! resource by resource as discovery lists them, then its `kubernetes` finalizer is removed through
//! `/finalize`, which lets the storage delete it. Each pass reports in the namespace's status with
//! upstream's five deletion conditions (what could not be discovered or deleted, what remains, which
//! finalizers hold it).

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
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
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let content = match self.delete_content(&name).await {
            Ok(content) => content,
            Err(e) => {
                let failed = Content { discovery_failed: Some(e.message()), ..Content::default() };
                self.report(&namespaces, &ns, &failed).await?;
                return Err(e);
            }
        };
        self.report(&namespaces, &ns, &content).await?;
        if !content.remaining.is_empty() || !content.failed.is_empty() {
            return Ok(Action::requeue(RECHECK));
        }
        let mut body = (*ns).clone();
        if let Some(f) = body.spec.as_mut().and_then(|s| s.finalizers.as_mut()) {
            f.retain(|f| f != NAMESPACE_FINALIZER);
        }
        match namespaces.replace_subresource("finalize", &name, &PostParams::default(), &body).await {
            Ok(_) => tracing::info!("namespace {name} is empty and finalized"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}

/// What one pass over a terminating namespace found.
#[derive(Debug, Default)]
struct Content {
    discovery_failed: Option<String>,
    /// Resources whose deletion failed, with why.
    failed: Vec<String>,
    /// Objects still there per group resource (`pods`, `deployments.apps`).
    remaining: BTreeMap<String, usize>,
    /// Objects still there per finalizer they carry.
    finalizers: BTreeMap<String, usize>,
}

impl Content {
    /// Upstream's five deletion conditions: (type, true, reason, message).
    fn conditions(&self) -> [(&'static str, bool, &'static str, String); 5] {
        let listed = |m: &BTreeMap<String, usize>, f: &dyn Fn(&str, usize) -> String| {
            m.iter().map(|(k, n)| f(k, *n)).collect::<Vec<_>>().join(", ")
        };
        [
            match &self.discovery_failed {
                Some(e) => (
                    "NamespaceDeletionDiscoveryFailure",
                    true,
                    "DiscoveryFailed",
                    format!("Discovery failed for some groups: {e}"),
                ),
                None => (
                    "NamespaceDeletionDiscoveryFailure",
                    false,
                    "ResourcesDiscovered",
                    "All resources successfully discovered".into(),
                ),
            },
            (
                "NamespaceDeletionGroupVersionParsingFailure",
                false,
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed".into(),
            ),
            if self.failed.is_empty() {
                (
                    "NamespaceDeletionContentFailure",
                    false,
                    "ContentDeleted",
                    "All content successfully deleted, may be waiting on finalization".into(),
                )
            } else {
                let n = self.failed.len();
                (
                    "NamespaceDeletionContentFailure",
                    true,
                    "ContentDeletionFailed",
                    format!("Failed to delete all resource types, {n} remaining: {}", self.failed.join(", ")),
                )
            },
            if self.remaining.is_empty() {
                ("NamespaceContentRemaining", false, "ContentRemoved", "All content successfully removed".into())
            } else {
                let what = listed(&self.remaining, &|r, n| format!("{r} has {n} resource instances"));
                (
                    "NamespaceContentRemaining",
                    true,
                    "SomeResourcesRemain",
                    format!("Some resources are remaining: {what}"),
                )
            },
            if self.finalizers.is_empty() {
                (
                    "NamespaceFinalizersRemaining",
                    false,
                    "ContentHasNoFinalizers",
                    "All content-preserving finalizers finished".into(),
                )
            } else {
                let what = listed(&self.finalizers, &|f, n| format!("{f} in {n} resource instances"));
                (
                    "NamespaceFinalizersRemaining",
                    true,
                    "SomeFinalizersRemain",
                    format!("Some content in the namespace has finalizers remaining: {what}"),
                )
            },
        ]
    }
}

impl Namespaces {
    /// Asks for everything in `ns` to be deleted, then counts what is still there (objects
    /// terminating gracefully or held by finalizers, or made meanwhile).
    async fn delete_content(&self, ns: &str) -> Result<Content, Error> {
        let discovery = Discovery::new(self.client.clone()).run().await.map_err(Error::Discovery)?;
        let mut content = Content::default();
        for group in discovery.groups() {
            for (resource, caps) in group.recommended_resources() {
                if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::DELETE_COLLECTION) {
                    continue;
                }
                let group_resource = if resource.group.is_empty() {
                    resource.plural.clone()
                } else {
                    format!("{}.{}", resource.plural, resource.group)
                };
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &resource);
                match api.delete_collection(&DeleteParams::default(), &ListParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
                    Err(e) => {
                        content.failed.push(format!("{group_resource}: {}", Error::from(e).message()));
                        continue;
                    }
                }
                let left = api.list(&ListParams::default()).await?.items;
                if left.is_empty() {
                    continue;
                }
                content.remaining.insert(group_resource, left.len());
                for f in left.iter().flat_map(|o| o.metadata.finalizers.iter().flatten()) {
                    *content.finalizers.entry(f.clone()).or_default() += 1;
                }
            }
        }
        Ok(content)
    }

    /// Writes the deletion conditions to the namespace's status when they changed, keeping the
    /// transition time of those whose status did not.
    async fn report(&self, namespaces: &Api<Namespace>, ns: &Namespace, content: &Content) -> Result<(), Error> {
        let old = ns.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        let now = Time(jiff::Timestamp::now());
        let mut conditions: Vec<NamespaceCondition> =
            old.iter().filter(|c| !content.conditions().iter().any(|(t, ..)| *t == c.type_)).cloned().collect();
        for (type_, on, reason, message) in content.conditions() {
            let status = if on { "True" } else { "False" };
            let since = old
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .and_then(|c| c.last_transition_time.clone());
            conditions.push(NamespaceCondition {
                type_: type_.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: Some(since.unwrap_or_else(|| now.clone())),
            });
        }
        if conditions == old {
            return Ok(());
        }
        let patch = serde_json::json!({"status": {"conditions": conditions}});
        match namespaces.patch_status(&ns.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
