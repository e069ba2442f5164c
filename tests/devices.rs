//! End to end: a device plugin written here over the real device-plugin gRPC API registers with a
//! real cairn (its `kubelet.sock` under `--kubelet-root-dir`), its devices show in the Node's capacity
//! and allocatable within 5 s; pods asking for one device each get different ones (the plugin's
//! Allocate env and device node are in the container), a third waits `Insufficient`; after kill -9
//! the containers and their devices stay, and the device freed by a deleted pod goes to the waiting
//! one; an unhealthy device leaves allocatable, and killing the plugin drops allocatable to 0 with
//! capacity kept, as kubelet does. `--device cairn.io/fake=<dir>/fakedev*` offers fake device nodes
//! (made with mknod as /dev/null's 1:3): one each to two pods at the same path, a third waits until a
//! third device node appears.
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

use busybox::BUSYBOX;
use common::{Server, eventually};
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

    /// `DEV=<IDs>` and the device node `/dev/fake-<ID>` (the host's /dev/null) per device.
    async fn allocate(
        &self,
        req: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| proto::ContainerAllocateResponse {
                envs: [("DEV".to_string(), c.devices_ids.join(","))].into(),
                devices: c
                    .devices_ids
                    .iter()
                    .map(|id| proto::DeviceSpec {
                        container_path: format!("/dev/fake-{id}"),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
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

/// A busybox pod asking for one device of `resource`. It is stopped by the node before its object goes (a grace
/// period of 0 would delete the object at once, and the next pod would be bound while the node
/// still runs this one, as upstream).
fn pod(name: &str) -> String {
    pod_of(name, "example.com/dev")
}

fn pod_of(name: &str, resource: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources: {{limits: {{{resource}: 1}}}}
"#
    )
}

fn get(node: &Server, what: &str, path: &str) -> String {
    node.ok(&["get", what, "-o", &format!("jsonpath={path}")])
}

fn running(node: &Server, name: &str) {
    for _ in 0..600 {
        if get(node, &format!("pod/{name}"), "{.status.phase}") == "Running" {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!(
        "pod {name} is not Running\n{}\n--- server log ---\n{}",
        node.ok(&["get", "events", "--field-selector", &format!("involvedObject.name={name}")]),
        node.log()
    );
}

/// The device the pod's container was given, checked against what it sees.
fn device_of(node: &Server, pod: &str) -> String {
    let dev = node.ok(&["exec", pod, "--", "sh", "-c", "echo $DEV"]).trim().to_string();
    let nodes = node.ok(&["exec", pod, "--", "sh", "-c", "ls /dev | grep fake-"]);
    assert_eq!(nodes.trim(), format!("fake-{dev}"), "exactly its own device node");
    dev
}

/// Registers the plugin at `example.sock` with the node's device manager.
fn register(runtime: &tokio::runtime::Runtime, dir: &std::path::Path) {
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
}

fn resource(node: &Server, field: &str) -> String {
    quantity(node, field, "example\\.com/dev")
}

fn quantity(node: &Server, field: &str, resource: &str) -> String {
    node.ok(&["get", "nodes", "-o", &format!("jsonpath={{.items[0].status.{field}.{resource}}}")])
}

/// A harmless character device node (1:3, as /dev/null) at `path`.
fn mknod(path: &std::path::Path) {
    let status = std::process::Command::new("mknod").arg(path).args(["c", "1", "3"]).status().unwrap();
    assert!(status.success(), "mknod {}", path.display());
}

/// The fake device nodes the pod's container sees under `dir`.
fn fake_devices_of(node: &Server, pod: &str, dir: &std::path::Path) -> String {
    node.ok(&["exec", pod, "--", "sh", "-c", &format!("ls {}", dir.display())]).trim().to_string()
}

/// `--device`: device nodes found by glob are one unit each, handed over at the same path, and one
/// that appears later is found within seconds.
fn check_generic_devices(node: &Server, fakes: &std::path::Path) {
    let fake = "cairn\\.io/fake";
    eventually(10, || (quantity(node, "allocatable", fake) == "2").then_some(()));
    node.ok_stdin(&["apply", "-f", "-"], &pod_of("g1", "cairn.io/fake"));
    node.ok_stdin(&["apply", "-f", "-"], &pod_of("g2", "cairn.io/fake"));
    running(node, "g1");
    running(node, "g2");
    let (a, b) = (fake_devices_of(node, "g1", fakes), fake_devices_of(node, "g2", fakes));
    let mut both = [a.clone(), b.clone()];
    both.sort();
    assert_eq!(both, ["fakedev0", "fakedev1"], "one device each, at the host's path");
    node.ok_stdin(&["apply", "-f", "-"], &pod_of("g3", "cairn.io/fake"));
    eventually(30, || {
        let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=g3"]);
        events.contains("Insufficient cairn.io/fake").then_some(())
    });
    let appeared = Instant::now();
    mknod(&fakes.join("fakedev2"));
    eventually(10, || (quantity(node, "allocatable", fake) == "3").then_some(()));
    eprintln!("a new device node was allocatable after {:?}", appeared.elapsed());
    running(node, "g3");
    assert_eq!(fake_devices_of(node, "g3", fakes), "fakedev2");
    node.ok(&["delete", "pod", "g1", "g2", "g3", "--wait=false"]);
}

#[test]
fn device_plugins_register_and_their_devices_go_to_one_pod_each() {
    let fakes = tempfile::tempdir().unwrap();
    mknod(&fakes.path().join("fakedev0"));
    mknod(&fakes.path().join("fakedev1"));
    std::fs::write(fakes.path().join("fakedev-not-a-device"), "").unwrap();
    let flag = format!("cairn.io/fake={}/fakedev?", fakes.path().display());
    let mut node = Node::start_with(CIDR, &["--device", &flag]);
    eventually(60, || node_ready(&node));
    check_generic_devices(&node, fakes.path());
    let dir = node.dir.path().join("kubelet/device-plugins");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let (devices, listed) = watch::channel(vec![("dev-a".to_string(), true), ("dev-b".to_string(), true)]);
    let stop = tokio_util::sync::CancellationToken::new();
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
    register(&runtime, &dir);
    let registered = Instant::now();
    eventually(5, || (resource(&node, "allocatable") == "2").then_some(()));
    eprintln!("advertised {:?} after registering", registered.elapsed());
    assert_eq!(resource(&node, "capacity"), "2");

    // One device each; the third pod waits for one.
    node.ok_stdin(&["apply", "-f", "-"], &pod("one"));
    node.ok_stdin(&["apply", "-f", "-"], &pod("two"));
    running(&node, "one");
    running(&node, "two");
    let (first, second) = (device_of(&node, "one"), device_of(&node, "two"));
    assert_ne!(first, second);
    node.ok_stdin(&["apply", "-f", "-"], &pod("three"));
    eventually(30, || {
        let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=three"]);
        events.contains("0/1 nodes are available: 1 Insufficient example.com/dev.").then_some(())
    });
    assert!(dir.join("kubelet_internal_checkpoint").exists());

    // kill -9: the same containers keep the same devices; the plugin registers again, as plugins do
    // when kubelet.sock is made anew.
    let containers = |node: &Server| {
        ["one", "two"].map(|p| get(node, &format!("pod/{p}"), "{.status.containerStatuses[0].containerID}"))
    };
    let before = containers(&node);
    node.restart_after_kill9();
    eventually(60, || node_ready(&node));
    register(&runtime, &dir);
    eventually(10, || (resource(&node, "allocatable") == "2").then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(containers(&node), before);
    assert_eq!((device_of(&node, "one"), device_of(&node, "two")), (first.clone(), second));
    assert_eq!(get(&node, "pod/three", "{.status.phase}"), "Pending");
    // The first pod goes: its device is the waiting pod's.
    node.ok(&["delete", "pod", "one"]);
    running(&node, "three");
    assert_eq!(device_of(&node, "three"), first);
    node.ok(&["delete", "pod", "two", "three", "--wait=false"]);

    // Health: an unhealthy device leaves allocatable; the plugin killed leaves capacity only.
    devices.send_replace(vec![("dev-a".to_string(), true), ("dev-b".to_string(), false)]);
    eventually(5, || (resource(&node, "allocatable") == "1").then_some(()));
    assert_eq!(resource(&node, "capacity"), "2");
    stop.cancel();
    drop(devices);
    runtime.block_on(plugin).unwrap().unwrap();
    eventually(5, || (resource(&node, "allocatable") == "0").then_some(()));
    assert_eq!(resource(&node, "capacity"), "2");
}
