//! A device plugin over the real gRPC API, in process: it registers on the manager's socket, its
//! ListAndWatch answers become capacity and allocatable, an unhealthy device leaves allocatable, and
//! the plugin going away leaves capacity with nothing allocatable. Bad registrations get upstream's texts.

use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::proto::{self, device_plugin_server::DevicePlugin, registration_client::RegistrationClient};
use super::{Manager, allocate, podresources, registration};

type Devices = Pin<Box<dyn futures::Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

/// One ListAndWatch answer: device IDs and their health.
type Listing = Vec<(&'static str, &'static str)>;

/// A plugin whose ListAndWatch sends what the test pushes.
struct Plugin(std::sync::Mutex<Option<mpsc::Receiver<Listing>>>);

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    type ListAndWatchStream = Devices;

    async fn get_device_plugin_options(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(proto::DevicePluginOptions::default()))
    }

    async fn list_and_watch(&self, _: Request<proto::Empty>) -> Result<Response<Devices>, Status> {
        let rx = self.0.lock().unwrap().take().ok_or_else(|| Status::unavailable("listed already"))?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(|devices| {
            Ok(proto::ListAndWatchResponse {
                devices: devices
                    .into_iter()
                    .map(|(id, health)| proto::Device { id: id.into(), health: health.into(), topology: None })
                    .collect(),
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    /// The last of the available devices (answered to a manager told it is offered).
    async fn get_preferred_allocation(
        &self,
        req: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let skip = c.available_device_i_ds.len().saturating_sub(c.allocation_size as usize);
                proto::ContainerPreferredAllocationResponse { device_i_ds: c.available_device_i_ds[skip..].to_vec() }
            })
            .collect();
        Ok(Response::new(proto::PreferredAllocationResponse { container_responses }))
    }

    /// Each container gets `DEVICES=<its IDs>` and the device node `/dev/<first ID>`.
    async fn allocate(
        &self,
        req: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| proto::ContainerAllocateResponse {
                envs: [("DEVICES".to_string(), c.devices_ids.join(","))].into(),
                devices: vec![proto::DeviceSpec {
                    container_path: format!("/dev/{}", c.devices_ids[0]),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                }],
                ..Default::default()
            })
            .collect();
        Ok(Response::new(proto::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

async fn until(manager: &Manager, want: &[(&str, (i64, i64))]) {
    let mut changes = manager.changes();
    let want: std::collections::BTreeMap<String, (i64, i64)> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        while manager.capacity() != want {
            changes.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("wanted {want:?}, have {:?}", manager.capacity()));
}

/// Serves the fake plugin on `<dir>/fake.sock` until `stop`; the sender feeds its ListAndWatch.
fn start_plugin(
    dir: &std::path::Path,
    stop: &CancellationToken,
) -> (mpsc::Sender<Listing>, tokio::task::JoinHandle<Result<(), tonic::transport::Error>>) {
    let (tx, rx) = mpsc::channel(4);
    let listener = crate::csi::bind_socket(&dir.join("fake.sock")).unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(proto::device_plugin_server::DevicePluginServer::new(Plugin(std::sync::Mutex::new(Some(rx)))))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
    (tx, tokio::spawn(server))
}

async fn register(dir: &std::path::Path, resource: &str) {
    register_with(dir, resource, None).await;
}

async fn register_with(dir: &std::path::Path, resource: &str, options: Option<proto::DevicePluginOptions>) {
    let channel = crate::runtime::cri::connect(&dir.join("kubelet.sock")).await.unwrap();
    let req = proto::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "fake.sock".into(),
        resource_name: resource.into(),
        options,
    };
    RegistrationClient::new(channel).register(req).await.unwrap();
}

#[tokio::test]
async fn plugins_register_and_their_devices_become_capacity_and_allocatable() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, shutdown) = (Manager::default(), CancellationToken::new());
    registration::serve(dir.path(), manager.clone(), shutdown.clone()).unwrap();
    let plugin_stop = CancellationToken::new();
    let (tx, served) = start_plugin(dir.path(), &plugin_stop);

    let channel = crate::runtime::cri::connect(&dir.path().join("kubelet.sock")).await.unwrap();
    let mut registration = RegistrationClient::new(channel);
    let request = |resource: &str, version: &str| proto::RegisterRequest {
        version: version.into(),
        endpoint: "fake.sock".into(),
        resource_name: resource.into(),
        options: None,
    };
    let e = registration.register(request("gpu", "v1beta1")).await.unwrap_err();
    assert_eq!(e.message(), "the ResourceName \"gpu\" is invalid");
    let e = registration.register(request("example.com/dev", "v1alpha")).await.unwrap_err();
    assert_eq!(
        e.message(),
        "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
    );
    registration.register(request("example.com/dev", "v1beta1")).await.unwrap();

    tx.send(vec![("a", "Healthy"), ("b", "Healthy")]).await.unwrap();
    until(&manager, &[("example.com/dev", (2, 2))]).await;
    tx.send(vec![("a", "Healthy"), ("b", "Unhealthy")]).await.unwrap();
    until(&manager, &[("example.com/dev", (2, 1))]).await;
    // The plugin goes: capacity stays, nothing is allocatable.
    drop(tx);
    plugin_stop.cancel();
    until(&manager, &[("example.com/dev", (2, 0))]).await;
    let _ = served.await;
    shutdown.cancel();
}

fn pod(uid: &str, init: &[usize], app: &[usize]) -> k8s_openapi::api::core::v1::Pod {
    let container = |prefix: &str, i: usize, n: &usize| {
        serde_json::json!({"name": format!("{prefix}{i}"), "image": "i",
            "resources": {"limits": {"example.com/dev": n.to_string()}}})
    };
    let init: Vec<_> = init.iter().enumerate().map(|(i, n)| container("init", i, n)).collect();
    let app: Vec<_> = app.iter().enumerate().map(|(i, n)| container("app", i, n)).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"initContainers": init, "containers": app},
    }))
    .unwrap()
}

async fn devices_env(manager: &Manager, uid: &str, container: &str) -> String {
    let got = manager.container_devices(uid, container).await.unwrap();
    got.envs.into_iter().find(|(k, _)| k == "DEVICES").map(|(_, v)| v).unwrap_or_default()
}

#[tokio::test]
async fn each_device_goes_to_one_pod_init_devices_are_reused_and_assignments_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, shutdown) = (Manager::new(dir.path()), CancellationToken::new());
    registration::serve(dir.path(), manager.clone(), shutdown.clone()).unwrap();
    let stop = CancellationToken::new();
    let (tx, _served) = start_plugin(dir.path(), &stop);
    register(dir.path(), "example.com/dev").await;
    tx.send(vec![("a", "Healthy"), ("b", "Healthy")]).await.unwrap();
    until(&manager, &[("example.com/dev", (2, 2))]).await;

    manager.admit(&pod("p1", &[], &[1])).await.unwrap();
    manager.admit(&pod("p2", &[], &[1])).await.unwrap();
    let (one, two) = (devices_env(&manager, "p1", "app0").await, devices_env(&manager, "p2", "app0").await);
    assert!(one != two && [&one, &two].iter().all(|d| *d == "a" || *d == "b"), "{one} {two}");
    let got = manager.container_devices("p1", "app0").await.unwrap();
    assert_eq!(got.devices[0].container_path, format!("/dev/{one}"));
    assert_eq!(
        manager.admit(&pod("p3", &[], &[1])).await.unwrap_err(),
        "Allocate failed due to requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0, which is unexpected"
    );
    // Admitted again (a relist), a pod keeps what it has.
    manager.admit(&pod("p1", &[], &[1])).await.unwrap();
    assert_eq!(devices_env(&manager, "p1", "app0").await, one);

    // The checkpoint: a restarted node gives the same devices (with the plugin's kept answer), and
    // still none twice.
    let restarted = Manager::new(dir.path());
    let generation = restarted.registered("example.com/dev", &Default::default());
    restarted.listed("example.com/dev", generation, [("a".to_string(), true), ("b".to_string(), true)].into());
    assert!(restarted.admit(&pod("p3", &[], &[1])).await.unwrap_err().contains("Available: 0"));
    restarted.admit(&pod("p1", &[], &[1])).await.unwrap();
    assert_eq!(devices_env(&restarted, "p1", "app0").await, one);
    drop(restarted);

    // Released devices go to the next pod; an init container's device is reused by the app container.
    manager.release("p1");
    manager.release("p2");
    manager.admit(&pod("p4", &[1], &[1])).await.unwrap();
    assert_eq!(devices_env(&manager, "p4", "init0").await, devices_env(&manager, "p4", "app0").await);
    manager.admit(&pod("p5", &[], &[1])).await.unwrap();
    assert_ne!(devices_env(&manager, "p5", "app0").await, devices_env(&manager, "p4", "app0").await);
    let checkpointed = std::fs::read_to_string(dir.path().join("kubelet_internal_checkpoint")).unwrap();
    assert!(checkpointed.contains("\"p4\"") && checkpointed.contains("\"p5\"") && !checkpointed.contains("\"p1\""));
    stop.cancel();
    shutdown.cancel();
}

struct Pods(Vec<k8s_openapi::api::core::v1::Pod>);

impl podresources::ActivePods for Pods {
    fn active_pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        self.0.clone()
    }
}

#[tokio::test]
async fn a_plugin_that_prefers_devices_chooses_and_pod_resources_lists_the_assignments() {
    use podresources::proto::{self as pr, pod_resources_lister_client::PodResourcesListerClient};
    let dir = tempfile::tempdir().unwrap();
    let (manager, shutdown) = (Manager::default(), CancellationToken::new());
    registration::serve(dir.path(), manager.clone(), shutdown.clone()).unwrap();
    let (tx, _served) = start_plugin(dir.path(), &shutdown);
    let options = proto::DevicePluginOptions { get_preferred_allocation_available: true, ..Default::default() };
    register_with(dir.path(), "example.com/dev", Some(options)).await;
    tx.send(vec![("a", "Healthy"), ("b", "Healthy"), ("c", "Healthy")]).await.unwrap();
    until(&manager, &[("example.com/dev", (3, 3))]).await;
    let (p1, p2, p3) = (pod("p1", &[], &[1]), pod("p2", &[], &[1, 1]), pod("p3", &[], &[]));
    manager.admit(&p1).await.unwrap();
    manager.admit(&p2).await.unwrap();
    assert_eq!(manager.assigned("p1"), [("app0".to_string(), "example.com/dev".to_string(), vec!["c".to_string()])]);
    let p2_devices: Vec<Vec<String>> = manager.assigned("p2").into_iter().map(|(_, _, d)| d).collect();
    assert_eq!(p2_devices, [vec!["b".to_string()], vec!["a".to_string()]]);

    let socket_dir = dir.path().join("pod-resources");
    podresources::serve(&socket_dir, manager.clone(), std::sync::Arc::new(Pods(vec![p1, p2, p3])), shutdown.clone())
        .unwrap();
    let channel = crate::runtime::cri::connect(&socket_dir.join("kubelet.sock")).await.unwrap();
    let mut client = PodResourcesListerClient::new(channel);
    let listed = client.list(pr::ListPodResourcesRequest {}).await.unwrap().into_inner().pod_resources;
    type Containers = Vec<(String, Vec<String>)>;
    let summary: Vec<(String, Containers)> = listed
        .iter()
        .map(|p| {
            let containers = p
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.devices.iter().flat_map(|d| d.device_ids.clone()).collect::<Vec<_>>()));
            (p.name.clone(), containers.collect())
        })
        .collect();
    let own = |name: &str, ids: &[&str]| (name.to_string(), ids.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        summary,
        [
            ("p1".to_string(), vec![own("app0", &["c"])]),
            ("p2".to_string(), vec![own("app0", &["b"]), own("app1", &["a"])]),
            ("p3".to_string(), vec![]),
        ]
    );
    assert_eq!(listed[0].namespace, "default");
    assert_eq!(listed[0].containers[0].devices[0].resource_name, "example.com/dev");
    let req = pr::GetPodResourcesRequest { pod_name: "p1".into(), pod_namespace: "default".into() };
    let got = client.get(req).await.unwrap().into_inner().pod_resources.unwrap();
    assert_eq!(got, listed[0]);
    let req = pr::GetPodResourcesRequest { pod_name: "p9".into(), pod_namespace: "default".into() };
    assert_eq!(client.get(req).await.unwrap_err().message(), "pod p9 in namespace default not found");
    let all = client.get_allocatable_resources(pr::AllocatableResourcesRequest {}).await.unwrap().into_inner();
    assert_eq!(all.devices.len(), 1);
    assert_eq!(all.devices[0].device_ids, ["a", "b", "c"]);
    shutdown.cancel();
}

#[test]
fn kubelet_picks_must_include_then_preferred_then_any() {
    let choice = |available: &[&str], must: &[&str]| allocate::Candidates {
        available: available.iter().map(|s| s.to_string()).collect(),
        must_include: must.iter().map(|s| s.to_string()).collect(),
        plugin: None,
    };
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(allocate::pick(&choice(&["i", "a", "b", "c"], &["i"]), &ids(&["c"]), 2), ids(&["i", "c"]));
    // A preference naming what is not available is ignored; too short a one is filled up.
    assert_eq!(allocate::pick(&choice(&["a", "b", "c"], &[]), &ids(&["z", "b"]), 2), ids(&["b", "a"]));
}
