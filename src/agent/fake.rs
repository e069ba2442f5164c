//! Fakes of the agent's seams for unit tests: a container runtime that keeps sandboxes and
//! containers in memory and logs every call, and a cluster that records status writes, deletions
//! and events.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::cluster::{PodApi, WriteError};
use super::objects::{Fetched, Wanted};
use super::runtime::ContainerRuntime;
use super::spec;
use crate::events::EventType;
use crate::runtime::cri::{self, CriError};

type Call<'a, T> = BoxFuture<'a, Result<T, CriError>>;

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

fn selected(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: BTreeMap<String, cri::PodSandbox>,
    containers: BTreeMap<String, cri::ContainerStatus>,
    images: HashSet<String>,
    calls: Vec<String>,
    exec_exit_code: i32,
}

/// A runtime in memory. Containers run until a test ends them ([`FakeRuntime::exit`]) or they are
/// stopped; every call that changes something is logged as `Op name-or-id [detail]`.
#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl FakeRuntime {
    /// A runtime that has `images`.
    pub fn with_images(images: &[&str]) -> Self {
        let fake = FakeRuntime::default();
        fake.lock().images = images.iter().map(|i| i.to_string()).collect();
        fake
    }

    /// The image is imported now.
    pub fn add_image(&self, image: &str) {
        self.lock().images.insert(image.to_string());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls so far, oldest first.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// How many logged calls start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.lock().calls.iter().filter(|c| c.starts_with(prefix)).count()
    }

    /// The exit code of every command run in a container (probes, hooks).
    pub fn set_exec_exit_code(&self, code: i32) {
        self.lock().exec_exit_code = code;
    }

    /// The newest container named `name`.
    pub fn newest(&self, name: &str) -> Option<cri::ContainerStatus> {
        let st = self.lock();
        st.containers
            .values()
            .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
            .max_by_key(|c| c.created_at)
            .cloned()
    }

    /// The newest running container named `name` exits with `code`.
    pub fn exit(&self, name: &str, code: i32) {
        let id = self.newest(name).filter(|c| c.state == cri::ContainerState::ContainerRunning as i32).map(|c| c.id);
        let mut st = self.lock();
        if let Some(c) = id.and_then(|id| st.containers.get_mut(&id)) {
            finish(c, code);
        }
    }

    fn log(&self, call: String) {
        self.lock().calls.push(call);
    }
}

fn finish(c: &mut cri::ContainerStatus, code: i32) {
    c.state = cri::ContainerState::ContainerExited as i32;
    c.finished_at = now_ns();
    c.exit_code = code;
    c.reason = if code == 0 { "Completed" } else { "Error" }.into();
}

fn not_found(op: &'static str, what: &str) -> CriError {
    CriError::NotFound { op, message: format!("{what} not found") }
}

impl ContainerRuntime for FakeRuntime {
    fn run_pod_sandbox(&self, r: cri::RunPodSandboxRequest) -> Call<'_, cri::RunPodSandboxResponse> {
        let config = r.config.unwrap_or_default();
        let mut st = self.lock();
        st.next_id += 1;
        let id = format!("sandbox-{}", st.next_id);
        st.calls.push(format!("RunPodSandbox {id}"));
        let sandbox = cri::PodSandbox {
            id: id.clone(),
            metadata: config.metadata,
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: now_ns(),
            labels: config.labels,
            annotations: config.annotations,
            ..Default::default()
        };
        st.sandboxes.insert(id.clone(), sandbox);
        Box::pin(async move { Ok(cri::RunPodSandboxResponse { pod_sandbox_id: id }) })
    }

    fn stop_pod_sandbox(&self, r: cri::StopPodSandboxRequest) -> Call<'_, cri::StopPodSandboxResponse> {
        let mut st = self.lock();
        st.calls.push(format!("StopPodSandbox {}", r.pod_sandbox_id));
        if let Some(s) = st.sandboxes.get_mut(&r.pod_sandbox_id) {
            s.state = cri::PodSandboxState::SandboxNotready as i32;
        }
        for c in
            st.containers.values_mut().filter(|c| c.labels.get("io.kubernetes.sandbox.id") == Some(&r.pod_sandbox_id))
        {
            if c.state == cri::ContainerState::ContainerRunning as i32 {
                finish(c, 137);
            }
        }
        Box::pin(async { Ok(cri::StopPodSandboxResponse {}) })
    }

    fn remove_pod_sandbox(&self, r: cri::RemovePodSandboxRequest) -> Call<'_, cri::RemovePodSandboxResponse> {
        let mut st = self.lock();
        st.calls.push(format!("RemovePodSandbox {}", r.pod_sandbox_id));
        st.sandboxes.remove(&r.pod_sandbox_id);
        st.containers.retain(|_, c| c.labels.get("io.kubernetes.sandbox.id") != Some(&r.pod_sandbox_id));
        Box::pin(async { Ok(cri::RemovePodSandboxResponse {}) })
    }

    fn pod_sandbox_status(&self, r: cri::PodSandboxStatusRequest) -> Call<'_, cri::PodSandboxStatusResponse> {
        let found = self.lock().sandboxes.get(&r.pod_sandbox_id).cloned();
        Box::pin(async move {
            let s = found.ok_or_else(|| not_found("PodSandboxStatus", &r.pod_sandbox_id))?;
            let status = cri::PodSandboxStatus {
                id: s.id,
                metadata: s.metadata,
                state: s.state,
                created_at: s.created_at,
                network: Some(cri::PodSandboxNetworkStatus { ip: "10.42.0.7".into(), ..Default::default() }),
                labels: s.labels,
                ..Default::default()
            };
            Ok(cri::PodSandboxStatusResponse { status: Some(status), ..Default::default() })
        })
    }

    fn list_pod_sandbox(&self, r: cri::ListPodSandboxRequest) -> Call<'_, cri::ListPodSandboxResponse> {
        let selector = r.filter.map(|f| f.label_selector).unwrap_or_default();
        let items = self.lock().sandboxes.values().filter(|s| selected(&s.labels, &selector)).cloned().collect();
        Box::pin(async move { Ok(cri::ListPodSandboxResponse { items }) })
    }

    fn create_container(&self, r: cri::CreateContainerRequest) -> Call<'_, cri::CreateContainerResponse> {
        let config = r.config.unwrap_or_default();
        let mut st = self.lock();
        st.next_id += 1;
        let id = format!("container-{}", st.next_id);
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let ns =
            config.linux.as_ref().and_then(|l| l.security_context.as_ref()).and_then(|s| s.namespace_options.as_ref());
        match ns.filter(|n| n.pid == cri::NamespaceMode::Target as i32) {
            Some(n) => st.calls.push(format!("CreateContainer {name} pid-of={}", n.target_id)),
            None => st.calls.push(format!("CreateContainer {name}")),
        }
        let mut labels = config.labels;
        // Where the fake finds a container's sandbox (containerd keeps it outside the labels).
        labels.insert("io.kubernetes.sandbox.id".into(), r.pod_sandbox_id);
        let status = cri::ContainerStatus {
            id: id.clone(),
            metadata: config.metadata,
            state: cri::ContainerState::ContainerCreated as i32,
            created_at: now_ns(),
            image: config.image,
            image_ref: "sha256:fake".into(),
            labels,
            annotations: config.annotations,
            mounts: config.mounts,
            ..Default::default()
        };
        st.containers.insert(id.clone(), status);
        Box::pin(async move { Ok(cri::CreateContainerResponse { container_id: id }) })
    }

    fn start_container(&self, r: cri::StartContainerRequest) -> Call<'_, cri::StartContainerResponse> {
        let mut st = self.lock();
        st.calls.push(format!("StartContainer {}", r.container_id));
        let started = st.containers.get_mut(&r.container_id).map(|c| {
            c.state = cri::ContainerState::ContainerRunning as i32;
            c.started_at = now_ns();
        });
        Box::pin(async move {
            started.ok_or_else(|| not_found("StartContainer", &r.container_id))?;
            Ok(cri::StartContainerResponse {})
        })
    }

    fn stop_container<'a>(&'a self, id: &'a str, grace: Duration) -> Call<'a, ()> {
        let mut st = self.lock();
        st.calls.push(format!("StopContainer {id} {}s", grace.as_secs()));
        if let Some(c) = st.containers.get_mut(id).filter(|c| c.state == cri::ContainerState::ContainerRunning as i32) {
            // SIGTERM ends it.
            finish(c, 143);
        }
        Box::pin(async { Ok(()) })
    }

    fn remove_container(&self, r: cri::RemoveContainerRequest) -> Call<'_, cri::RemoveContainerResponse> {
        let mut st = self.lock();
        st.calls.push(format!("RemoveContainer {}", r.container_id));
        st.containers.remove(&r.container_id);
        Box::pin(async { Ok(cri::RemoveContainerResponse {}) })
    }

    fn list_containers(&self, r: cri::ListContainersRequest) -> Call<'_, cri::ListContainersResponse> {
        let filter = r.filter.unwrap_or_default();
        let containers = self
            .lock()
            .containers
            .values()
            .filter(|c| selected(&c.labels, &filter.label_selector))
            .filter(|c| filter.state.as_ref().is_none_or(|s| s.state == c.state))
            .map(|c| cri::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.labels.get("io.kubernetes.sandbox.id").cloned().unwrap_or_default(),
                metadata: c.metadata.clone(),
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Box::pin(async move { Ok(cri::ListContainersResponse { containers }) })
    }

    fn container_status(&self, r: cri::ContainerStatusRequest) -> Call<'_, cri::ContainerStatusResponse> {
        let found = self.lock().containers.get(&r.container_id).cloned();
        Box::pin(async move {
            let status = found.ok_or_else(|| not_found("ContainerStatus", &r.container_id))?;
            Ok(cri::ContainerStatusResponse { status: Some(status), ..Default::default() })
        })
    }

    fn reopen_container_log(&self, _: cri::ReopenContainerLogRequest) -> Call<'_, cri::ReopenContainerLogResponse> {
        Box::pin(async { Ok(cri::ReopenContainerLogResponse {}) })
    }

    fn exec_sync(&self, r: cri::ExecSyncRequest) -> Call<'_, cri::ExecSyncResponse> {
        let exit_code = self.lock().exec_exit_code;
        self.log(format!("ExecSync {} {}", r.container_id, r.cmd.join(" ")));
        Box::pin(async move { Ok(cri::ExecSyncResponse { exit_code, ..Default::default() }) })
    }

    fn exec(&self, r: cri::ExecRequest) -> Call<'_, cri::ExecResponse> {
        self.log(format!("Exec {} {}", r.container_id, r.cmd.join(" ")));
        let url = format!("http://127.0.0.1:1/exec/{}", r.container_id);
        Box::pin(async move { Ok(cri::ExecResponse { url }) })
    }

    fn attach(&self, r: cri::AttachRequest) -> Call<'_, cri::AttachResponse> {
        self.log(format!("Attach {}", r.container_id));
        let url = format!("http://127.0.0.1:1/attach/{}", r.container_id);
        Box::pin(async move { Ok(cri::AttachResponse { url }) })
    }

    fn list_container_stats(&self, _: cri::ListContainerStatsRequest) -> Call<'_, cri::ListContainerStatsResponse> {
        Box::pin(async { Ok(cri::ListContainerStatsResponse::default()) })
    }

    fn image_status(&self, r: cri::ImageStatusRequest) -> Call<'_, cri::ImageStatusResponse> {
        let name = r.image.map(|i| i.image).unwrap_or_default();
        let image = self
            .lock()
            .images
            .contains(&name)
            .then(|| cri::Image { id: format!("sha256:{name}"), ..Default::default() });
        Box::pin(async move { Ok(cri::ImageStatusResponse { image, ..Default::default() }) })
    }

    fn pull_image(&self, r: cri::PullImageRequest) -> Call<'_, cri::PullImageResponse> {
        let name = r.image.map(|i| i.image).unwrap_or_default();
        self.log(format!("PullImage {name}"));
        let known = self.lock().images.contains(&name);
        Box::pin(async move {
            if !known {
                return Err(not_found("PullImage", &name));
            }
            Ok(cri::PullImageResponse { image_ref: format!("sha256:{name}") })
        })
    }
}

/// What [`FakeApi`] was asked to do, in order.
#[derive(Debug, Clone)]
pub enum Written {
    Status(Value),
    Deleted(String),
    Event {
        reason: String,
        message: String,
    },
    /// A token was requested for the pod of this UID.
    Token(String),
}

/// A cluster that records what the worker writes; it refers to no ConfigMaps or Secrets.
#[derive(Default)]
pub struct FakeApi {
    written: Mutex<Vec<Written>>,
    revision: AtomicU64,
}

impl FakeApi {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Written>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn written(&self) -> Vec<Written> {
        self.lock().clone()
    }

    /// The statuses written, oldest first.
    pub fn statuses(&self) -> Vec<Value> {
        self.lock()
            .iter()
            .filter_map(|w| match w {
                Written::Status(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// The status written last.
    pub fn status(&self) -> Option<Value> {
        self.statuses().pop()
    }

    /// The events' reasons and messages, oldest first.
    pub fn events(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter_map(|w| match w {
                Written::Event { reason, message } => Some((reason.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }
}

impl PodApi for FakeApi {
    fn write_status<'a>(&'a self, _: &'a Pod, status: Value) -> BoxFuture<'a, Result<u64, WriteError>> {
        self.lock().push(Written::Status(status));
        let rv = self.revision.fetch_add(1, Ordering::Relaxed) + 1000;
        Box::pin(async move { Ok(rv) })
    }

    fn delete<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), WriteError>> {
        self.lock().push(Written::Deleted(spec::uid(pod).into()));
        Box::pin(async { Ok(()) })
    }

    fn objects<'a>(&'a self, _: &'a Pod, _: Wanted<'a>) -> BoxFuture<'a, Result<Fetched, kube::Error>> {
        Box::pin(async { Ok(Fetched::default()) })
    }

    fn event(&self, _: &Pod, _: EventType, reason: &str, message: String) {
        self.lock().push(Written::Event { reason: reason.into(), message });
    }

    /// Every class runs under the handler of its name.
    fn runtime_handler<'a>(&'a self, class: &'a str) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move { Ok(class.to_string()) })
    }

    /// A token naming the pod and the request, valid for the time asked.
    fn token<'a>(
        &'a self,
        pod: &'a Pod,
        key: &'a crate::volumes::TokenKey,
    ) -> BoxFuture<'a, Result<super::cluster::IssuedToken, kube::Error>> {
        self.lock().push(Written::Token(spec::uid(pod).into()));
        let issued = k8s_openapi::jiff::Timestamp::now().as_second();
        let token = format!("token-of-{}-for-{}-{}", spec::uid(pod), key.audience, key.expiration_seconds);
        Box::pin(
            async move { Ok(super::cluster::IssuedToken { token, issued, expires: issued + key.expiration_seconds }) },
        )
    }
}
