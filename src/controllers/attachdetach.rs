//! Attach/detach (upstream's `attachdetach` controller, for CSI volumes): each CSI volume a pod on a
//! node uses, whose driver attaches (its CSIDriver's `attachRequired`, or no CSIDriver at all), gets a
//! VolumeAttachment `csi-<sha256>` to that node, which the driver's attacher acts on. Once no running
//! pod there uses it, and the node no longer lists it in `status.volumesInUse` (it is unmounted), the
//! attachment is deleted: the attacher detaches it. The Node's `status.volumesAttached` lists what is
//! attached; pods get `SuccessfulAttachVolume` and `FailedAttachVolume` events.
//!
//! One reconcile per node, from live reads: it runs when the node changes (its `volumesInUse`), when
//! a pod with claims on it changes, or when one of its attachments does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{AttachedVolume, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;

use super::informer::Informer;
use super::protection::claims_of;
use super::runtime::{Error, Reconciler};
use crate::csi::{attach_required, attachment_name, unique_volume_name};
use crate::events::{EventType, Recorder};

pub struct AttachDetach {
    pub client: Client,
    pub recorder: Recorder,
    /// Per node, the attachment events already recorded (`<attachment>/<pod uid>/<outcome>`).
    reported: Mutex<HashMap<String, HashSet<String>>>,
}

impl AttachDetach {
    pub fn new(client: Client) -> Self {
        let recorder = Recorder::spawn(client.clone(), "attachdetach-controller".into(), String::new());
        AttachDetach { client, recorder, reported: Mutex::default() }
    }
}

pub fn controller(client: &Client, pods: &mut Informer<Pod>) -> Controller<Node> {
    Controller::new(Api::<Node>::all(client.clone()), watcher::Config::default())
        .watches_shared_stream(pods.subscribe(), |pod| {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
            node.filter(|_| !claims_of(&pod).is_empty()).map(|n| ObjectRef::new(&n))
        })
        .watches(Api::<VolumeAttachment>::all(client.clone()), watcher::Config::default(), |va| {
            Some(ObjectRef::new(&va.spec.node_name))
        })
}

/// A volume that should be attached to the node, and the pods that use it.
struct Wanted {
    pv: String,
    driver: String,
    unique: String,
    pods: Vec<crate::events::ObjectRef>,
}

fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

impl AttachDetach {
    /// The attachments the node's pods need, by attachment name.
    async fn wanted(&self, node: &str) -> Result<BTreeMap<String, Wanted>, Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?;
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let drivers: Api<CSIDriver> = Api::all(self.client.clone());
        let mut attaches: HashMap<String, bool> = HashMap::new();
        let mut wanted = BTreeMap::new();
        for pod in on_node.items.iter().filter(|p| !finished(p)) {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            for claim in claims_of(pod) {
                let Some(pv_name) =
                    claims.get_opt(&claim).await?.and_then(|c| c.spec?.volume_name).filter(|v| !v.is_empty())
                else {
                    continue;
                };
                let Some(csi) = volumes.get_opt(&pv_name).await?.and_then(|pv| pv.spec?.csi) else { continue };
                let required = match attaches.get(&csi.driver) {
                    Some(r) => *r,
                    None => {
                        let r = attach_required(drivers.get_opt(&csi.driver).await?.as_ref());
                        attaches.insert(csi.driver.clone(), r);
                        r
                    }
                };
                if !required {
                    continue;
                }
                let entry =
                    wanted.entry(attachment_name(&csi.volume_handle, &csi.driver, node)).or_insert_with(|| Wanted {
                        pv: pv_name.clone(),
                        driver: csi.driver.clone(),
                        unique: unique_volume_name(&csi.driver, &csi.volume_handle),
                        pods: Vec::new(),
                    });
                entry.pods.push(crate::events::ObjectRef::of(pod));
            }
        }
        Ok(wanted)
    }

    /// Records each outcome once per pod.
    fn report(&self, node: &str, name: &str, want: &Wanted, va: &VolumeAttachment, seen: &mut HashSet<String>) {
        let status = va.status.clone().unwrap_or_default();
        let (kind, reason, message) = if status.attached {
            (
                EventType::Normal,
                "SuccessfulAttachVolume",
                format!("AttachVolume.Attach succeeded for volume \"{}\"", want.pv),
            )
        } else if let Some(e) = status.attach_error.and_then(|e| e.message) {
            (
                EventType::Warning,
                "FailedAttachVolume",
                format!("AttachVolume.Attach failed for volume \"{}\" : {e}", want.pv),
            )
        } else {
            return;
        };
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let done = reported.entry(node.to_string()).or_default();
        for pod in &want.pods {
            let key = format!("{name}/{}/{message}", pod.uid);
            if !done.contains(&key) {
                self.recorder.record(pod.clone(), kind, reason, "Attach", message.clone());
            }
            seen.insert(key);
        }
    }
}

impl Reconciler for AttachDetach {
    type Object = Node;
    const NAME: &'static str = "attachdetach";

    async fn reconcile(&self, node: Arc<Node>) -> Result<Action, Error> {
        let name = node.name_any();
        let wanted = self.wanted(&name).await?;
        let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
        let existing: HashMap<String, VolumeAttachment> = attachments
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|va| va.spec.node_name == name)
            .map(|va| (va.name_any(), va))
            .collect();
        let mut seen = HashSet::new();
        for (va_name, want) in &wanted {
            match existing.get(va_name) {
                Some(va) if va.metadata.deletion_timestamp.is_none() => {
                    self.report(&name, va_name, want, va, &mut seen)
                }
                // Being detached: made again once it is gone.
                Some(_) => {}
                None => {
                    let va = VolumeAttachment {
                        metadata: ObjectMeta { name: Some(va_name.clone()), ..Default::default() },
                        spec: VolumeAttachmentSpec {
                            attacher: want.driver.clone(),
                            node_name: name.clone(),
                            source: VolumeAttachmentSource {
                                persistent_volume_name: Some(want.pv.clone()),
                                ..Default::default()
                            },
                        },
                        status: None,
                    };
                    match attachments.create(&PostParams::default(), &va).await {
                        Ok(_) => tracing::info!("attaching volume {} to node {name} ({va_name})", want.pv),
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        let in_use: HashSet<&str> =
            node.status.iter().flat_map(|s| s.volumes_in_use.iter().flatten()).map(String::as_str).collect();
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        for (va_name, va) in &existing {
            if wanted.contains_key(va_name) || va.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let pv = va.spec.source.persistent_volume_name.as_deref().unwrap_or_default();
            let csi = volumes.get_opt(pv).await?.and_then(|pv| pv.spec?.csi);
            // Still mounted there: detaching now would pull it from under the node.
            if csi.is_some_and(|c| in_use.contains(unique_volume_name(&c.driver, &c.volume_handle).as_str())) {
                continue;
            }
            match attachments.delete(va_name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!("detaching volume {pv} from node {name} ({va_name})"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.reported.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), seen);

        let attached: Vec<AttachedVolume> = wanted
            .iter()
            .filter(|(va_name, _)| existing.get(*va_name).and_then(|va| va.status.as_ref()).is_some_and(|s| s.attached))
            .map(|(_, w)| AttachedVolume { name: w.unique.clone(), device_path: String::new() })
            .collect();
        let listed = node.status.as_ref().and_then(|s| s.volumes_attached.clone()).unwrap_or_default();
        if listed != attached {
            let nodes: Api<Node> = Api::all(self.client.clone());
            let patch =
                json!({"status": {"volumesAttached": if attached.is_empty() { None } else { Some(&attached) }}});
            match nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::await_change())
    }
}
