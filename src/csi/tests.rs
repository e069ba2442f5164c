//! The built-in driver registered through `plugins_registry/` and driven through the node's CSI
//! client, as the agent drives any driver: CSINode and the Node's annotation, CreateVolume, a claim
//! published into a pod directory (staged once, bind-mounted), unpublished, DeleteVolume, and the
//! driver deregistered when its socket goes. Mounts need root.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::client::Drivers;
use super::hostpath::{HostPath, PVC_NAME_PARAM, PVC_NAMESPACE_PARAM};
use super::registration::{NODE_ID_ANNOTATION, Watcher};
use super::{PluginDirs, proto};
use crate::volumes::claims::{self, Node as ClaimsNode};
use crate::volumes::{Objects, mount};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping: mounting needs root");
    }
    root
}

/// The claim, volume, the driver's CSIDriver and the volume's attachment, as the agent would have
/// fetched them.
struct Fetched {
    claim: Option<PersistentVolumeClaim>,
    volume: Option<PersistentVolume>,
    /// The CSIDriver's `attachRequired`.
    attach: bool,
    attachment: Option<VolumeAttachment>,
}

impl Objects for Fetched {
    fn config_map(&self, _: &str, _: &str) -> Option<k8s_openapi::api::core::v1::ConfigMap> {
        None
    }
    fn secret(&self, _: &str, _: &str) -> Option<k8s_openapi::api::core::v1::Secret> {
        None
    }
    fn claim(&self, _: &str) -> Option<PersistentVolumeClaim> {
        self.claim.clone()
    }
    fn volume(&self, _: &str) -> Option<PersistentVolume> {
        self.volume.clone()
    }
    fn csi_driver(&self, name: &str) -> Option<CSIDriver> {
        Some(
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"attachRequired": self.attach}}))
                .unwrap(),
        )
    }
    fn attachment(&self, _: &str) -> Option<VolumeAttachment> {
        self.attachment.clone()
    }
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "pod-uid"},
        "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))
    .unwrap()
}

fn claim(phase: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default", "uid": "claim-uid"},
        "spec": {"volumeName": "pvc-1", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": phase},
    }))
    .unwrap()
}

fn volume(driver: &str, handle: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pvc-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "claimRef": {"namespace": "default", "name": "data", "uid": "claim-uid"},
            "csi": {"driver": driver, "volumeHandle": handle}},
    }))
    .unwrap()
}

#[tokio::test]
async fn claims_that_cannot_be_used_are_reported_in_kubelets_words() {
    let dir = tempfile::tempdir().unwrap();
    let (drivers, dirs) = (Drivers::default(), PluginDirs { root: dir.path().join("kubelet") });
    let node = ClaimsNode { name: "n1", drivers: &drivers, dirs: &dirs, pods_dir: dir.path() };
    let pod_dir = dir.path().join("pod-uid");
    let publish = |claim, volume| {
        let fetched = Fetched { claim, volume, attach: false, attachment: None };
        let (pod, pod_dir, node) = (pod(), pod_dir.clone(), &node);
        async move { claims::publish(&pod, &pod_dir, &fetched, node).await.unwrap_err().to_string() }
    };
    assert_eq!(
        publish(None, None).await,
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[data]: error processing PVC default/data: failed to fetch PVC from API server: persistentvolumeclaims \"data\" not found"
    );
    assert!(
        publish(Some(claim("Pending")), None).await.ends_with("error processing PVC default/data: PVC is not bound")
    );
    let err = publish(Some(claim("Bound")), Some(volume("absent.csi", "h"))).await;
    assert!(err.contains("MountVolume.SetUp failed for volume \"pvc-1\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name absent.csi not found in the list of registered CSI drivers"), "{err}");
}

#[tokio::test]
async fn the_built_in_driver_registers_provisions_publishes_and_deregisters() {
    if !is_root() {
        return;
    }
    let (_store, _registry, client) = crate::client::for_tests().await;
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}}))
            .unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dirs = PluginDirs { root: dir.path().join("kubelet") };
    let drivers = Drivers::default();
    let shutdown = CancellationToken::new();
    let mut changes = std::pin::pin!(drivers.changes());
    let watcher =
        Watcher { dir: dirs.registry(), drivers: drivers.clone(), client: client.clone(), node_name: "n1".into() };
    tokio::spawn(watcher.run(shutdown.clone()));
    let storage = dir.path().join("storage");
    let driver = HostPath {
        name: "test.csi.cairn.io".into(),
        node_id: "n1".into(),
        root: storage.clone(),
        attach: true,
        max_volumes: 3,
    };
    let driver_stop = CancellationToken::new();
    super::hostpath::run(driver, &dirs, driver_stop.clone()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), changes.next()).await.expect("the driver registers");
    let entry = drivers.get("test.csi.cairn.io").expect("registered");
    let caps = entry.driver.capabilities();
    assert!(caps.stage_unstage && caps.create_delete && caps.publish_unpublish);

    let csi_node = Api::<CSINode>::all(client.clone()).get("n1").await.unwrap();
    assert_eq!(csi_node.spec.drivers.len(), 1);
    assert_eq!(csi_node.spec.drivers[0].node_id, "n1");
    assert_eq!(csi_node.spec.drivers[0].topology_keys, Some(vec!["kubernetes.io/hostname".to_string()]));
    assert_eq!(csi_node.spec.drivers[0].allocatable.as_ref().and_then(|a| a.count), Some(3));
    assert_eq!(csi_node.metadata.owner_references.unwrap()[0].name, "n1");
    let annotations = Api::<Node>::all(client.clone()).get("n1").await.unwrap().metadata.annotations.unwrap();
    assert_eq!(annotations[NODE_ID_ANNOTATION], r#"{"test.csi.cairn.io":"n1"}"#);

    let request = || proto::CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(proto::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        volume_capabilities: vec![proto::VolumeCapability {
            access_type: Some(proto::volume_capability::AccessType::Mount(Default::default())),
            access_mode: None,
        }],
        parameters: HashMap::from([
            (PVC_NAME_PARAM.to_string(), "data".to_string()),
            (PVC_NAMESPACE_PARAM.to_string(), "default".to_string()),
        ]),
        ..Default::default()
    };
    let made = entry.driver.create_volume(request()).await.unwrap();
    assert_eq!(made.volume_id, "pvc-1_default_data");
    assert_eq!(made.accessible_topology[0].segments["kubernetes.io/hostname"], "n1");
    assert_eq!(entry.driver.create_volume(request()).await.unwrap().volume_id, made.volume_id, "idempotent");
    let mut block = request();
    block.volume_capabilities[0].access_type = Some(proto::volume_capability::AccessType::Block(Default::default()));
    assert_eq!(entry.driver.create_volume(block).await.unwrap_err().code, tonic::Code::InvalidArgument);

    // The driver attaches: nothing is mounted until the volume's attachment to this node is attached,
    // and its publish context reaches NodeStage (which refuses without it).
    let pv = volume("test.csi.cairn.io", &made.volume_id);
    let attachment = |status: serde_json::Value| -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": super::attachment_name(&made.volume_id, "test.csi.cairn.io", "n1")},
            "spec": {"attacher": "test.csi.cairn.io", "nodeName": "n1", "source": {"persistentVolumeName": "pvc-1"}},
            "status": status,
        }))
        .unwrap()
    };
    let pods_dir = dir.path().join("pods");
    let pod_dir = pods_dir.join("pod-uid");
    let cnode = ClaimsNode { name: "n1", drivers: &drivers, dirs: &dirs, pods_dir: &pods_dir };
    let mut fetched = Fetched {
        claim: Some(claim("Bound")),
        volume: Some(pv.clone()),
        attach: true,
        attachment: Some(attachment(json!({"attached": false, "attachError": {"message": "no such disk"}}))),
    };
    let err = claims::publish(&pod(), &pod_dir, &fetched, &cnode).await.unwrap_err().to_string();
    assert!(err.starts_with("MountVolume.WaitForAttach failed for volume \"pvc-1\" : volume attachment csi-"), "{err}");
    assert!(err.ends_with("failed: no such disk"), "{err}");
    let csi = pv.spec.clone().unwrap().csi.unwrap();
    let context = entry
        .driver
        .controller_publish(proto::ControllerPublishVolumeRequest {
            volume_id: made.volume_id.clone(),
            node_id: entry.node_id.clone(),
            volume_capability: Some(claims::capability(&pv, &csi)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(context, HashMap::from([("attachedTo".to_string(), "n1".to_string())]));
    fetched.attachment = Some(attachment(json!({"attached": true, "attachmentMetadata": context})));
    let published = claims::publish(&pod(), &pod_dir, &fetched, &cnode).await.unwrap();
    let target = published["data"].host_path.clone();
    assert_eq!(target, pod_dir.join("volumes/kubernetes.io~csi/pvc-1/mount"));
    std::fs::write(target.join("f"), "in the volume").unwrap();
    assert_eq!(std::fs::read_to_string(storage.join(&made.volume_id).join("f")).unwrap(), "in the volume");
    let staging = dirs.staging("test.csi.cairn.io", &made.volume_id);
    assert!(mount::is_mounted(&staging).unwrap() && mount::is_mounted(&target).unwrap());
    // Publishing again (every sync does) mounts nothing twice.
    claims::publish(&pod(), &pod_dir, &fetched, &cnode).await.unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(info.lines().filter(|l| l.split(' ').nth(4) == Some(target.to_str().unwrap())).count(), 1);

    assert_eq!(claims::in_use(&pods_dir), [format!("kubernetes.io/csi/test.csi.cairn.io^{}", made.volume_id)]);
    claims::unpublish_all(&pod_dir, &cnode).await.unwrap();
    assert!(claims::in_use(&pods_dir).is_empty());
    assert!(!mount::is_mounted(&target).unwrap() && !target.exists());
    assert!(!mount::is_mounted(&staging).unwrap() && !staging.exists());
    assert!(storage.join(&made.volume_id).join("f").exists(), "unpublishing keeps the data");
    entry.driver.delete_volume(made.volume_id.clone()).await.unwrap();
    assert!(!storage.join(&made.volume_id).exists());
    entry.driver.delete_volume(made.volume_id).await.expect("deleting twice is fine");

    // The driver stops and removes its sockets: the watcher deregisters it.
    driver_stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), async {
        while Api::<CSINode>::all(client.clone()).get("n1").await.unwrap().spec.drivers.len() == 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the driver is removed from the CSINode once its socket is gone");
    assert!(drivers.get("test.csi.cairn.io").is_none());
    shutdown.cancel();
}
