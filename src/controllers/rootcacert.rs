//! Every active namespace has the `kube-root-ca.crt` ConfigMap holding the cluster CA (upstream's
//! root-ca-cert-publisher), which the `kube-api-access-*` volumes of pods project as `ca.crt`.
//! A deleted or edited one is put back.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};

use super::runtime::{Error, Reconciler};

pub const NAME: &str = "kube-root-ca.crt";
const DESCRIPTION_KEY: &str = "kubernetes.io/description";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

pub struct RootCaPublisher {
    pub client: Client,
    /// The cluster CA, PEM.
    pub ca: String,
}

/// Namespaces, and changes to their `kube-root-ca.crt`.
pub fn controller(client: &Client) -> Controller<Namespace> {
    Controller::new(Api::all(client.clone()), watcher::Config::default()).watches(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={NAME}")),
        |cm| cm.namespace().map(|ns| ObjectRef::new(&ns)),
    )
}

impl RootCaPublisher {
    fn data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("ca.crt".to_string(), self.ca.clone())])
    }
}

impl Reconciler for RootCaPublisher {
    type Object = Namespace;
    const NAME: &'static str = "root-ca-cert-publisher";

    async fn reconcile(&self, ns: Arc<Namespace>) -> Result<Action, Error> {
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns.name_any());
        let result = match maps.get_opt(NAME).await? {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(NAME.into()),
                        annotations: Some(BTreeMap::from([(DESCRIPTION_KEY.into(), DESCRIPTION.into())])),
                        ..Default::default()
                    },
                    data: Some(self.data()),
                    ..Default::default()
                };
                maps.create(&PostParams::default(), &cm).await.map(|_| "published")
            }
            Some(cm) if cm.data.as_ref() == Some(&self.data()) && cm.binary_data.is_none() => {
                return Ok(Action::await_change());
            }
            Some(mut cm) => {
                cm.data = Some(self.data());
                cm.binary_data = None;
                cm.annotations_mut().insert(DESCRIPTION_KEY.into(), DESCRIPTION.into());
                maps.replace(NAME, &PostParams::default(), &cm).await.map(|_| "restored")
            }
        };
        match result {
            Ok(what) => tracing::debug!("{what} {}/{NAME}", ns.name_any()),
            // Changed meanwhile (retried on its event), or the namespace is going.
            Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404 | 409) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::await_change())
    }
}
