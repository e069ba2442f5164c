//! End to end: a device plugin written here over the real device-plugin gRPC API registers with a
//! real cairn (its `kubelet.sock` under `--kubelet-root-dir`), its devices show in the Node's capacity
//! and allocatable within 5 s; pods asking for one device each get different ones (the plugin's
//! Allocate env and device node are in the container), a third waits `Insufficient`; after kill -9
//! the containers and their devices stay, and the device freed by a deleted pod goes to the waiting
//! one; an unhealthy device leaves allocatable, and killing the plugin drops allocatable to 0 with
//! capacity kept, as kubelet does. `--device cairn.io/fake=<dir>/fakedev*` offers fake device nodes
//! (made with mknod as /dev/null's 1:3): one each to two pods at the same path, a third waits until a
//! third device node appears. A fake NVIDIA driver tree (`--gpu-discovery-root`: GPU device nodes,
//! `/proc/driver/nvidia`, a library, `nvidia-smi` and `nvidia-container-runtime` as scripts) gives
//! two GPUs: Node labels, capacity, one GPU and the control nodes per pod, a third pod waiting,
//! pod-resources listing the assignments, the `nvidia` RuntimeClass running a pod through that
//! runtime, the same GPUs after kill -9, and a GPU whose node goes turning unhealthy.
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

/// The pod-resources API, generated from `proto/podresources.proto`.
#[allow(clippy::all, clippy::pedantic)]
mod podresources {
    tonic::include_proto!("v1");
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

const UUIDS: [&str; 2] = ["GPU-0aaaaaaa-0000-0000-0000-000000000000", "GPU-1bbbbbbb-0000-0000-0000-000000000000"];

/// A driver tree as NVIDIA's installs it, with fake device nodes; the runtime runs runc, noting
/// each call in `runtime.log`.
fn fake_gpu_root(root: &std::path::Path) {
    let write = |path: &str, text: &str, mode: u32| {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    };
    std::fs::create_dir_all(root.join("dev")).unwrap();
    for n in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"] {
        mknod(&root.join("dev").join(n));
    }
    for (minor, uuid) in UUIDS.iter().enumerate() {
        let info = format!("Model: \t\t NVIDIA Fake GPU\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n");
        write(&format!("proc/driver/nvidia/gpus/0000:0{minor}:00.0/information"), &info, 0o644);
    }
    write("usr/lib/x86_64-linux-gnu/libcuda.so.1", "fake libcuda\n", 0o644);
    write("usr/bin/nvidia-smi", "#!/bin/sh\necho 16384\n", 0o755);
    let runc =
        String::from_utf8(std::process::Command::new("sh").args(["-c", "command -v runc"]).output().unwrap().stdout)
            .unwrap();
    let runtime = format!("#!/bin/sh\necho \"$@\" >> {}/runtime.log\nexec {} \"$@\"\n", root.display(), runc.trim());
    write("usr/bin/nvidia-container-runtime", &runtime, 0o755);
}

/// The GPU the pod's container was given: the NVIDIA device nodes it sees are exactly that GPU's and
/// the control nodes, and `NVIDIA_VISIBLE_DEVICES` names it.
fn gpu_of(node: &Server, pod: &str) -> usize {
    let seen = node.ok(&["exec", pod, "--", "sh", "-c", "ls /dev | grep nvidia"]);
    let mut seen: Vec<&str> = seen.lines().collect();
    seen.sort();
    let gpu = seen.iter().find_map(|n| n.strip_prefix("nvidia")?.parse::<usize>().ok()).expect("a GPU node");
    let want = [format!("nvidia{gpu}").as_str(), "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
        .map(String::from);
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(seen, want, "exactly one GPU and the control nodes");
    let visible = node.ok(&["exec", pod, "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]);
    assert_eq!(visible.trim(), UUIDS[gpu]);
    gpu
}

fn gpus(node: &Server, field: &str) -> String {
    quantity(node, field, "nvidia\\.com/gpu")
}

fn label(node: &Server, name: &str) -> String {
    let name = name.replace('.', "\\.");
    node.ok(&["get", "nodes", "-o", &format!("jsonpath={{.items[0].metadata.labels.{name}}}")])
}

/// The GPUs of the fake driver tree `root`, before kill -9: (gpu1's GPU, gpu2's).
fn check_gpus(node: &Server, root: &std::path::Path, runtime: &tokio::runtime::Runtime) -> (usize, usize) {
    eventually(10, || (gpus(node, "allocatable") == "2").then_some(()));
    let labels = ["present", "count", "product", "memory"].map(|l| label(node, &format!("nvidia.com/gpu.{l}")));
    assert_eq!(labels, ["true", "2", "NVIDIA-Fake-GPU", "16384"].map(String::from));
    assert_eq!(get(node, "runtimeclass/nvidia", "{.handler}"), "nvidia");

    node.ok_stdin(&["apply", "-f", "-"], &pod_of("gpu1", "nvidia.com/gpu"));
    node.ok_stdin(&["apply", "-f", "-"], &pod_of("gpu2", "nvidia.com/gpu"));
    running(node, "gpu1");
    running(node, "gpu2");
    let (a, b) = (gpu_of(node, "gpu1"), gpu_of(node, "gpu2"));
    assert_ne!(a, b);
    let lib = node.ok(&["exec", "gpu1", "--", "cat", "/usr/local/nvidia/lib64/libcuda.so.1"]);
    assert_eq!(lib, "fake libcuda\n", "the driver's libraries where CUDA images look");
    assert_eq!(node.ok(&["exec", "gpu1", "--", "/usr/local/nvidia/bin/nvidia-smi"]).trim(), "16384");
    node.ok_stdin(&["apply", "-f", "-"], &pod_of("gpu3", "nvidia.com/gpu"));
    eventually(30, || {
        let events = node.ok(&["get", "events", "--field-selector", "involvedObject.name=gpu3"]);
        events.contains("Insufficient nvidia.com/gpu").then_some(())
    });

    // What monitoring exporters read.
    let socket = node.dir.path().join("kubelet/pod-resources/kubelet.sock");
    let listed = runtime.block_on(async {
        use podresources::pod_resources_lister_client::PodResourcesListerClient;
        let mut client = PodResourcesListerClient::new(cri::connect(&socket).await.expect("pod-resources socket"));
        client.list(podresources::ListPodResourcesRequest {}).await.unwrap().into_inner().pod_resources
    });
    let devices_of = |name: &str| {
        let pod = listed.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("{name} listed: {listed:?}"));
        let devices = pod.containers.iter().flat_map(|c| &c.devices);
        devices.flat_map(|d| d.device_ids.iter().map(|id| format!("{}={id}", d.resource_name))).collect::<Vec<_>>()
    };
    assert_eq!(devices_of("gpu1"), [format!("nvidia.com/gpu={}", UUIDS[a])]);
    assert_eq!(devices_of("gpu2"), [format!("nvidia.com/gpu={}", UUIDS[b])]);

    // The nvidia RuntimeClass runs its pod through NVIDIA's runtime (here, the script).
    let rc = pod_of("rc", "nvidia.com/gpu").replace("spec:\n", "spec:\n  runtimeClassName: nvidia\n");
    node.ok_stdin(&["apply", "-f", "-"], &rc.replace("    resources: {limits: {nvidia.com/gpu: 1}}\n", ""));
    running(node, "rc");
    let log = std::fs::read_to_string(root.join("runtime.log")).unwrap_or_default();
    assert!(log.contains("create"), "the nvidia handler ran NVIDIA's runtime: {log:?}");
    node.ok(&["delete", "pod", "rc", "--wait=false"]);
    (a, b)
}

/// After kill -9: the same GPUs; the one freed goes to the waiting pod; a GPU whose node goes is
/// unhealthy.
fn check_gpus_after_restart(node: &Server, root: &std::path::Path, (a, b): (usize, usize)) {
    eventually(10, || (gpus(node, "allocatable") == "2").then_some(()));
    assert_eq!((gpu_of(node, "gpu1"), gpu_of(node, "gpu2")), (a, b));
    assert_eq!(get(node, "pod/gpu3", "{.status.phase}"), "Pending");
    node.ok(&["delete", "pod", "gpu1"]);
    running(node, "gpu3");
    assert_eq!(gpu_of(node, "gpu3"), a);
    node.ok(&["delete", "pod", "gpu2", "gpu3", "--wait=false"]);
    std::fs::remove_file(root.join("dev/nvidia1")).unwrap();
    eventually(10, || (gpus(node, "allocatable") == "1").then_some(()));
    assert_eq!(gpus(node, "capacity"), "2");
}

#[test]
fn device_plugins_register_and_their_devices_go_to_one_pod_each() {
    let fakes = tempfile::tempdir().unwrap();
    mknod(&fakes.path().join("fakedev0"));
    mknod(&fakes.path().join("fakedev1"));
    std::fs::write(fakes.path().join("fakedev-not-a-device"), "").unwrap();
    let flag = format!("cairn.io/fake={}/fakedev?", fakes.path().display());
    let gpu_root = tempfile::tempdir().unwrap();
    fake_gpu_root(gpu_root.path());
    let gpu_root_flag = gpu_root.path().display().to_string();
    let mut node = Node::start_with(CIDR, &["--device", &flag, "--gpu-discovery-root", &gpu_root_flag]);
    eventually(60, || node_ready(&node));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    check_generic_devices(&node, fakes.path());
    let gpus = check_gpus(&node, gpu_root.path(), &runtime);
    let dir = node.dir.path().join("kubelet/device-plugins");
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
    check_gpus_after_restart(&node, gpu_root.path(), gpus);

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
