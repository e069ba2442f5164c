//! End to end: a device plugin written here over the real device-plugin gRPC API registers with a
//! real cairn (its `kubelet.sock` under `--kubelet-root-dir`), its devices show in the Node's capacity
//! and allocatable within 5 s, an unhealthy one leaves allocatable, and killing the plugin drops
//! allocatable to 0 with capacity kept, as kubelet does.
//!
//! Needs root, containerd and runc (`.ci/run` installs them).

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

/// The device-plugin API, generated from `proto/deviceplugin.proto` by the build script.
#[allow(clippy::all, clippy::pedantic)]
mod proto {
    tonic::include_proto!("v1beta1");
}

use std::pin::Pin;
use std::time::Instant;

use futures::StreamExt as _;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use common::eventually;
use node::{Node, node_ready};
use proto::device_plugin_server::{DevicePlugin, DevicePluginServer};

const CIDR: &str = "10.48.0.0/16";

type Devices = Pin<Box<dyn futures::Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

/// A plugin listing whatever `devices` holds, again at each change.
struct Plugin {
    devices: watch::Receiver<Vec<(String, bool)>>,
}

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
        let stream = tokio_stream::wrappers::WatchStream::new(self.devices.clone()).map(|devices| {
            let devices = devices
                .into_iter()
                .map(|(id, healthy)| proto::Device {
                    id,
                    health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                    topology: None,
                })
                .collect();
            Ok(proto::ListAndWatchResponse { devices })
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
        Err(Status::unimplemented("no pod asks in this test"))
    }

    async fn pre_start_container(
        &self,
        _: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

fn resource(node: &Node, field: &str) -> String {
    node.ok(&["get", "nodes", "-o", &format!("jsonpath={{.items[0].status.{field}.example\\.com/dev}}")])
}

#[test]
fn an_external_device_plugin_registers_and_its_devices_are_advertised() {
    let node = Node::start(CIDR);
    eventually(60, || node_ready(&node));
    let dir = node.dir.path().join("kubelet/device-plugins");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (devices, listed) = watch::channel(vec![("dev-a".to_string(), true), ("dev-b".to_string(), true)]);
    let stop = tokio_util::sync::CancellationToken::new();
    let _entered = runtime.enter();
    let socket = dir.join("example.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let plugin = runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(Plugin { devices: listed }))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    runtime.block_on(async {
        let channel = cri::connect(&dir.join("kubelet.sock"))
            .await
            .expect("cairn serves kubelet.sock in the device-plugins directory");
        let mut registration = proto::registration_client::RegistrationClient::new(channel);
        registration
            .register(proto::RegisterRequest {
                version: "v1beta1".into(),
                endpoint: "example.sock".into(),
                resource_name: "example.com/dev".into(),
                options: Some(proto::DevicePluginOptions::default()),
            })
            .await
            .expect("registered");
    });
    let registered = Instant::now();
    eventually(5, || (resource(&node, "allocatable") == "2").then_some(()));
    eprintln!("advertised {:?} after registering", registered.elapsed());
    assert_eq!(resource(&node, "capacity"), "2");

    devices.send_replace(vec![("dev-a".to_string(), true), ("dev-b".to_string(), false)]);
    eventually(5, || (resource(&node, "allocatable") == "1").then_some(()));
    assert_eq!(resource(&node, "capacity"), "2");

    // The plugin is killed: its devices stay in capacity, none is allocatable.
    stop.cancel();
    drop(devices);
    runtime.block_on(plugin).unwrap().unwrap();
    eventually(5, || (resource(&node, "allocatable") == "0").then_some(()));
    assert_eq!(resource(&node, "capacity"), "2");
}
