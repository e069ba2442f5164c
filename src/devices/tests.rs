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
use super::{Manager, registration};

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

    async fn get_preferred_allocation(
        &self,
        _: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not offered"))
    }

    async fn allocate(&self, _: Request<proto::AllocateRequest>) -> Result<Response<proto::AllocateResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
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

#[tokio::test]
async fn plugins_register_and_their_devices_become_capacity_and_allocatable() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, shutdown) = (Manager::default(), CancellationToken::new());
    registration::serve(dir.path(), manager.clone(), shutdown.clone()).unwrap();

    let (tx, rx) = mpsc::channel(4);
    let plugin_stop = CancellationToken::new();
    let listener = crate::csi::bind_socket(&dir.path().join("fake.sock")).unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(proto::device_plugin_server::DevicePluginServer::new(Plugin(std::sync::Mutex::new(Some(rx)))))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            plugin_stop.clone().cancelled_owned(),
        );
    let served = tokio::spawn(server);

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
