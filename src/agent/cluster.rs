//! The cluster as the pod workers use it: the pod's status and final deletion, the ConfigMaps and
//! Secrets it refers to, and its events, behind [`PodApi`] so that a worker runs against the API
//! in cairn ([`ClientApi`]) and against a fake in its unit tests (kubelet's status manager, pod
//! deletion and event recorder seams).

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use std::sync::Arc;

use super::local_store::LocalStore;
use super::objects::{self, Fetched, Wanted};
use super::spec;
use crate::events::{EventType, ObjectRef, Recorder};
use crate::volumes::TokenKey;

/// Why a write about a pod did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The pod is gone from the API, or another pod of that name replaced it.
    #[error("the pod is gone or was replaced")]
    Gone,
    #[error(transparent)]
    Api(#[from] kube::Error),
}

pub trait PodApi: Send + Sync + 'static {
    /// Writes the pod's status if it is still the same pod (UID); returns the resourceVersion written.
    fn write_status<'a>(&'a self, pod: &'a Pod, status: Value) -> BoxFuture<'a, Result<u64, WriteError>>;
    /// Deletes the pod object for good (grace 0) once its containers are stopped, unless a
    /// successor of that name replaced it.
    fn delete<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), WriteError>>;
    /// The ConfigMaps and Secrets `wanted` refers to.
    fn objects<'a>(&'a self, pod: &'a Pod, wanted: Wanted<'a>) -> BoxFuture<'a, Result<Fetched, kube::Error>>;
    /// Records an event about the pod; never blocks.
    fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String);
    /// The CRI runtime handler of a RuntimeClass (kubelet's `LookupRuntimeHandler`); the error says why
    /// there is none.
    fn runtime_handler<'a>(&'a self, class: &'a str) -> BoxFuture<'a, Result<String, String>>;
    /// A token of the pod's service account, bound to the pod: the token and its expiry.
    fn token<'a>(&'a self, pod: &'a Pod, key: &'a TokenKey) -> BoxFuture<'a, Result<IssuedToken, kube::Error>>;
}

/// A service account token as the API issued it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssuedToken {
    pub token: String,
    /// Unix seconds.
    pub issued: i64,
    pub expires: i64,
}

/// The local store's entry of a pod's tokens.
pub fn tokens_entry(pod: &Pod) -> String {
    format!("tokens-{}", spec::uid(pod))
}

/// [`PodApi`] over the cluster's client, reporting events as `kubelet` from this node. With a
/// local store, what a pod's objects were is kept there and answers while the server cannot be
/// reached.
pub struct ClientApi {
    client: kube::Client,
    recorder: Recorder,
    local: Option<Arc<LocalStore>>,
}

/// The local store's entry of a pod's objects.
pub fn objects_entry(pod: &Pod) -> String {
    format!("objects-{}", spec::uid(pod))
}

impl ClientApi {
    pub fn new(client: kube::Client, node_name: String, local: Option<Arc<LocalStore>>) -> Self {
        ClientApi { recorder: Recorder::spawn(client.clone(), "kubelet".into(), node_name), client, local }
    }

    fn pods(&self, pod: &Pod) -> Api<Pod> {
        Api::namespaced(self.client.clone(), spec::namespace(pod))
    }
}

impl PodApi for ClientApi {
    /// A merge patch, as kubelet's status manager sends (with the UID, which the API refuses to
    /// change, so a replaced pod is left alone): fields other components own in the status
    /// (nominatedNodeName, resize, ...) stay.
    fn write_status<'a>(&'a self, pod: &'a Pod, status: Value) -> BoxFuture<'a, Result<u64, WriteError>> {
        Box::pin(async move {
            // A static pod's status goes to its mirror pod (the one standing for this very
            // manifest), whose UID is the API's own.
            let uid = if super::static_pods::is_static(pod) {
                let mirror = self.pods(pod).get_opt(spec::name(pod)).await?;
                let mirror = mirror.filter(|m| super::static_pods::mirror_hash(m) == Some(spec::uid(pod)));
                mirror.and_then(|m| m.metadata.uid).ok_or(WriteError::Gone)?
            } else {
                spec::uid(pod).to_string()
            };
            let patch = json!({"metadata": {"uid": uid}, "status": status});
            match self.pods(pod).patch_status(spec::name(pod), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(written) => Ok(written.metadata.resource_version.and_then(|v| v.parse().ok()).unwrap_or(0)),
                // Gone, or another pod now: the UID in the patch differs from the stored one.
                Err(kube::Error::Api(s)) if s.code == 404 || (s.code == 422 && s.message.contains("metadata.uid")) => {
                    Err(WriteError::Gone)
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Grace 0 with a UID precondition: the pod object goes, not a successor of that name.
    fn delete<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), WriteError>> {
        Box::pin(async move {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(spec::uid(pod).into()), resource_version: None }),
                ..Default::default()
            };
            match self.pods(pod).delete(spec::name(pod), &params).await {
                Ok(_) => Ok(()),
                // Gone, or the UID precondition failed: a successor has the name.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Err(WriteError::Gone),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn objects<'a>(&'a self, pod: &'a Pod, wanted: Wanted<'a>) -> BoxFuture<'a, Result<Fetched, kube::Error>> {
        Box::pin(async move {
            let fetched = objects::fetch(&self.client, pod, &wanted).await;
            let Some(local) = &self.local else { return fetched };
            let entry = objects_entry(pod);
            match fetched {
                Ok(f) => {
                    let mut kept: Fetched = local.get(&entry).unwrap_or_default();
                    kept.merge(&f);
                    local.put(&entry, &kept);
                    Ok(f)
                }
                // The server did not answer: what was fetched last time.
                Err(e) if !matches!(e, kube::Error::Api(_)) => match local.get::<Fetched>(&entry) {
                    Some(kept) => {
                        tracing::debug!(
                            "pod {}: the server cannot be reached ({e}): using its objects as last known",
                            spec::uid(pod)
                        );
                        Ok(kept)
                    }
                    None => Err(e),
                },
                Err(e) => Err(e),
            }
        })
    }

    fn runtime_handler<'a>(&'a self, class: &'a str) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(self.client.clone());
            match classes.get(class).await {
                Ok(rc) => Ok(rc.handler),
                Err(kube::Error::Api(s)) => Err(s.message),
                Err(e) => Err(format!("failed to get RuntimeClass: {e}")),
            }
        })
    }

    fn event(&self, pod: &Pod, kind: EventType, reason: &str, message: String) {
        self.recorder.record(ObjectRef::of(pod), kind, reason, "", message);
    }

    /// A TokenRequest bound to the pod. With a local store, the tokens are kept (sealed) there too,
    /// so a pod started while the server cannot be reached still has its last token.
    fn token<'a>(&'a self, pod: &'a Pod, key: &'a TokenKey) -> BoxFuture<'a, Result<IssuedToken, kube::Error>> {
        Box::pin(async move {
            let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or("default".into());
            let mut spec = json!({
                "expirationSeconds": key.expiration_seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": spec::name(pod), "uid": spec::uid(pod)},
            });
            if !key.audience.is_empty() {
                spec["audiences"] = json!([key.audience]);
            }
            let request: TokenRequest =
                serde_json::from_value(json!({"spec": spec})).map_err(kube::Error::SerdeError)?;
            let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), spec::namespace(pod));
            let entry = tokens_entry(pod);
            let id = format!("{}:{}", key.audience, key.expiration_seconds);
            let issued = accounts.create_token_request(&account, &PostParams::default(), &request).await;
            let local = self.local.as_ref();
            match issued {
                Ok(answer) => {
                    let status = answer.status.unwrap_or_default();
                    let now = k8s_openapi::jiff::Timestamp::now().as_second();
                    let expires = status.expiration_timestamp.map_or(now, |t| t.0.as_second());
                    let token = IssuedToken { token: status.token.unwrap_or_default(), issued: now, expires };
                    if let Some(local) = local {
                        let mut kept: std::collections::BTreeMap<String, IssuedToken> =
                            local.get(&entry).unwrap_or_default();
                        kept.insert(id, token.clone());
                        local.put(&entry, &kept);
                    }
                    Ok(token)
                }
                Err(e) if !matches!(e, kube::Error::Api(_)) => {
                    let kept: Option<std::collections::BTreeMap<String, IssuedToken>> =
                        local.and_then(|l| l.get(&entry));
                    kept.and_then(|mut k| k.remove(&id)).ok_or(e)
                }
                Err(e) => Err(e),
            }
        })
    }
}
