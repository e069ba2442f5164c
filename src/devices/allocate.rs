//! Device assignment, as kubelet's device manager: chosen at pod admission, the plugin's Allocate
//! asked when the container is first created, both checkpointed so that a restart changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use super::{Manager, Resource, proto};
use crate::registry::kinds::pod_rules::parse_quantity;
use crate::runtime::cri;

/// The checkpoint's file name in the device-plugins directory (kubelet's).
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// The plugin's Allocate answer for one container, as it is kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Allocated {
    envs: BTreeMap<String, String>,
    /// (container path, host path, read-only).
    mounts: Vec<(String, String, bool)>,
    /// (container path, host path, cgroup permissions).
    devices: Vec<(String, String, String)>,
    annotations: BTreeMap<String, String>,
    cdi_devices: Vec<String>,
}

impl From<proto::ContainerAllocateResponse> for Allocated {
    fn from(r: proto::ContainerAllocateResponse) -> Self {
        Allocated {
            envs: r.envs.into_iter().collect(),
            mounts: r.mounts.into_iter().map(|m| (m.container_path, m.host_path, m.read_only)).collect(),
            devices: r.devices.into_iter().map(|d| (d.container_path, d.host_path, d.permissions)).collect(),
            annotations: r.annotations.into_iter().collect(),
            cdi_devices: r.cdi_devices.into_iter().map(|d| d.name).collect(),
        }
    }
}

/// One container's devices of one resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pod_uid: String,
    container: String,
    resource: String,
    devices: Vec<String>,
    /// Asked for when the container is first created.
    allocated: Option<Allocated>,
}

/// Every assignment, in admission order.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignments {
    entries: Vec<Entry>,
}

/// The devices a container may get of one resource.
pub(super) struct Candidates {
    /// Free healthy devices, the init containers' first.
    pub(super) available: Vec<String>,
    /// The init containers' devices, which the app containers get first.
    pub(super) must_include: Vec<String>,
    /// The plugin, when it offers GetPreferredAllocation.
    pub(super) plugin: Option<proto::device_plugin_client::DevicePluginClient<tonic::transport::Channel>>,
}

/// How long a plugin may take to say which devices it prefers; then any will do.
const PREFERENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The plugin's GetPreferredAllocation answer (empty when it fails: the choice is then cairn's).
async fn preferred(
    mut plugin: proto::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    resource: &str,
    choice: &Candidates,
    count: usize,
) -> Vec<String> {
    let req = proto::PreferredAllocationRequest {
        container_requests: vec![proto::ContainerPreferredAllocationRequest {
            available_device_i_ds: choice.available.clone(),
            must_include_device_i_ds: choice.must_include.clone(),
            allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
        }],
    };
    match tokio::time::timeout(PREFERENCE_TIMEOUT, plugin.get_preferred_allocation(req)).await {
        Ok(Ok(answer)) => {
            answer.into_inner().container_responses.into_iter().next().map(|r| r.device_i_ds).unwrap_or_default()
        }
        Ok(Err(e)) => {
            tracing::warn!("device plugin for {resource}: GetPreferredAllocation failed: {}", e.message());
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(
                "device plugin for {resource}: GetPreferredAllocation did not answer in {PREFERENCE_TIMEOUT:?}"
            );
            Vec::new()
        }
    }
}

/// `count` devices: the ones that must be included, then the plugin's preferred ones that are
/// available, then the other available ones, as kubelet's devicesToAllocate.
pub(super) fn pick(choice: &Candidates, preferred: &[String], count: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(count);
    let wanted = choice.must_include.iter().chain(preferred.iter().filter(|d| choice.available.contains(d)));
    for d in wanted.chain(&choice.available) {
        if out.len() == count {
            break;
        }
        if !out.contains(d) {
            out.push(d.clone());
        }
    }
    out
}

/// What a container gets from its devices, for its CRI configuration.
#[derive(Debug, Default)]
pub struct ContainerDevices {
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<cri::Mount>,
    pub devices: Vec<cri::Device>,
    pub annotations: Vec<(String, String)>,
    pub cdi_devices: Vec<cri::CdiDevice>,
}

pub fn load(path: &Path) -> Assignments {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!("device checkpoint {} is unreadable ({e}); starting without assignments", path.display());
            Assignments::default()
        }),
        Err(_) => Assignments::default(),
    }
}

/// The whole-number requests of extended resources a container makes (limits; requests equal them).
fn wants(c: &Container) -> BTreeMap<String, usize> {
    let r = c.resources.as_ref();
    r.and_then(|r| r.limits.as_ref().or(r.requests.as_ref()))
        .into_iter()
        .flatten()
        .filter(|(name, _)| name.contains('/') && !name.contains("kubernetes.io/"))
        .filter_map(|(name, q)| Some((name.clone(), (parse_quantity(&q.0)? / 1000) as usize)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

impl Manager {
    /// Writes the assignments as they are now. One writer at a time: two would share the
    /// temporary file.
    fn save(&self) {
        let Some((path, saving)) = &self.checkpoint else { return };
        let _one = saving.lock().unwrap_or_else(|e| e.into_inner());
        let assignments = self.lock().assignments.clone();
        let tmp = path.with_extension("tmp");
        let written = serde_json::to_vec(&assignments)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!("writing the device checkpoint {}: {e}", path.display());
        }
    }

    /// kubelet's device admission of a pod: each container's devices of every device-plugin resource
    /// it asks for, among the healthy devices no other pod holds (a pod holds its devices until
    /// [`Manager::release`]); init containers' devices go to the app containers first, and a plugin
    /// that offers GetPreferredAllocation chooses among the rest. Assignments the pod has already
    /// (checkpointed before a restart) stand. The error is the rejection message.
    pub async fn admit(&self, pod: &Pod) -> Result<(), String> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
        let containers = spec.init_containers.iter().flatten().chain(spec.containers.iter());
        let mut added = Vec::new();
        for c in containers {
            for (resource, count) in wants(c) {
                let Some(choice) = self.candidates(&uid, &init, &c.name, &resource) else { continue };
                let devices = if choice.must_include.len() >= count {
                    choice.must_include[..count].to_vec()
                } else if choice.available.len() < count {
                    self.forget(&uid, &added);
                    return Err(format!(
                        "Allocate failed due to requested number of devices unavailable for {resource}. Requested: {count}, Available: {}, which is unexpected",
                        choice.available.len()
                    ));
                } else {
                    let preferred = match choice.plugin.clone() {
                        Some(plugin) if choice.available.len() > count => {
                            preferred(plugin, &resource, &choice, count).await
                        }
                        _ => Vec::new(),
                    };
                    pick(&choice, &preferred, count)
                };
                self.lock().assignments.entries.push(Entry {
                    pod_uid: uid.clone(),
                    container: c.name.clone(),
                    resource: resource.clone(),
                    devices,
                    allocated: None,
                });
                added.push((c.name.clone(), resource));
            }
        }
        if !added.is_empty() {
            self.save();
        }
        Ok(())
    }

    /// What the container may get of `resource`: `None` when it is not a device plugin's resource or
    /// the container has its devices already.
    fn candidates(&self, uid: &str, init: &[&str], container: &str, resource: &str) -> Option<Candidates> {
        let state = self.lock();
        // A device plugin's resource: registered, or held by a container (its plugin not registered
        // again yet after a restart: nothing is free then).
        let registered = state.resources.get(resource);
        let entries = &state.assignments.entries;
        if registered.is_none() && !entries.iter().any(|e| e.resource == resource) {
            // Not a device plugin's resource: the scheduler's to count.
            return None;
        }
        if entries.iter().any(|e| e.pod_uid == uid && e.container == container && e.resource == resource) {
            return None;
        }
        let healthy: BTreeSet<&String> =
            registered.into_iter().flat_map(|r| r.devices.iter().filter(|(_, h)| **h).map(|(id, _)| id)).collect();
        let is_init = |name: &str| init.contains(&name);
        // Held: other pods' devices, and this pod's app containers'.
        let held: BTreeSet<&String> = entries
            .iter()
            .filter(|e| e.resource == resource && (e.pod_uid != uid || !is_init(&e.container)))
            .flat_map(|e| &e.devices)
            .collect();
        let mut must_include: Vec<String> = entries
            .iter()
            .filter(|e| e.pod_uid == uid && e.resource == resource && is_init(&e.container))
            .flat_map(|e| &e.devices)
            .filter(|d| healthy.contains(d) && !held.contains(d))
            .cloned()
            .collect();
        must_include.dedup();
        let mut available = must_include.clone();
        available
            .extend(healthy.iter().filter(|d| !held.contains(*d) && !must_include.contains(d)).map(|d| (*d).clone()));
        let plugin = registered.filter(|r| r.preferred_allocation).and_then(|r| r.plugin.clone());
        Some(Candidates { available, must_include, plugin })
    }

    /// Takes back what an admission that failed half-way had assigned.
    fn forget(&self, uid: &str, added: &[(String, String)]) {
        if added.is_empty() {
            return;
        }
        let mut state = self.lock();
        state
            .assignments
            .entries
            .retain(|e| e.pod_uid != uid || !added.iter().any(|(c, r)| *c == e.container && *r == e.resource));
    }

    /// The devices `pod_uid` holds: (container, resource, device IDs).
    pub fn assigned(&self, pod_uid: &str) -> Vec<(String, String, Vec<String>)> {
        let state = self.lock();
        let entries = state.assignments.entries.iter().filter(|e| e.pod_uid == pod_uid);
        entries.map(|e| (e.container.clone(), e.resource.clone(), e.devices.clone())).collect()
    }

    /// How many distinct devices of each resource pods hold.
    pub fn held(&self) -> BTreeMap<String, i64> {
        let state = self.lock();
        let mut held: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for e in &state.assignments.entries {
            held.entry(&e.resource).or_default().extend(e.devices.iter().map(String::as_str));
        }
        held.into_iter().map(|(r, d)| (r.to_string(), d.len() as i64)).collect()
    }

    /// Each resource's healthy devices.
    pub fn allocatable(&self) -> Vec<(String, Vec<String>)> {
        let state = self.lock();
        let healthy = |r: &Resource| r.devices.iter().filter(|(_, h)| **h).map(|(id, _)| id.clone()).collect();
        state.resources.iter().map(|(name, r)| (name.clone(), healthy(r))).collect()
    }

    /// The pod's devices are free again (its worker stopped everything).
    pub fn release(&self, pod_uid: &str) {
        self.retain_where(|uid| uid != pod_uid);
    }

    /// Only the devices of `pods` stay held (the node's pods, at its first listing).
    pub fn retain(&self, pods: &HashSet<String>) {
        self.retain_where(|uid| pods.contains(uid));
    }

    fn retain_where(&self, keep: impl Fn(&str) -> bool) {
        let mut state = self.lock();
        let count = state.assignments.entries.len();
        state.assignments.entries.retain(|e| keep(&e.pod_uid));
        if state.assignments.entries.len() != count {
            drop(state);
            self.save();
        }
    }

    /// What the container gets from its devices: the plugins' Allocate answers (asked the first
    /// time, then kept), after PreStartContainer where a plugin asks for it.
    pub async fn container_devices(&self, pod_uid: &str, container: &str) -> Result<ContainerDevices, String> {
        let mut out = ContainerDevices::default();
        let wanted: Vec<(Entry, Option<Resource>)> = {
            let state = self.lock();
            state
                .assignments
                .entries
                .iter()
                .filter(|e| e.pod_uid == pod_uid && e.container == container)
                .map(|e| (e.clone(), state.resources.get(&e.resource).cloned()))
                .collect()
        };
        for (entry, resource) in wanted {
            let plugin = || {
                resource
                    .as_ref()
                    .and_then(|r| r.plugin.clone())
                    .ok_or_else(|| format!("device plugin for {} is not registered on this node", entry.resource))
            };
            let allocated = match entry.allocated.clone() {
                Some(a) => a,
                None => {
                    let req = proto::AllocateRequest {
                        container_requests: vec![proto::ContainerAllocateRequest {
                            devices_ids: entry.devices.clone(),
                        }],
                    };
                    let answer = plugin()?.allocate(req).await.map_err(|e| {
                        format!("device plugin for {}: Allocate failed: {}", entry.resource, e.message())
                    })?;
                    let allocated: Allocated =
                        answer.into_inner().container_responses.into_iter().next().unwrap_or_default().into();
                    self.keep(&entry, allocated.clone());
                    allocated
                }
            };
            if resource.as_ref().is_some_and(|r| r.pre_start_required) {
                let req = proto::PreStartContainerRequest { devices_ids: entry.devices.clone() };
                plugin()?.pre_start_container(req).await.map_err(|e| {
                    format!("device plugin for {}: PreStartContainer failed: {}", entry.resource, e.message())
                })?;
            }
            out.envs.extend(allocated.envs);
            out.mounts.extend(allocated.mounts.into_iter().map(|(container_path, host_path, readonly)| cri::Mount {
                container_path,
                host_path,
                readonly,
                ..Default::default()
            }));
            out.devices.extend(allocated.devices.into_iter().map(|(container_path, host_path, permissions)| {
                cri::Device { container_path, host_path, permissions }
            }));
            out.annotations.extend(allocated.annotations);
            out.cdi_devices.extend(allocated.cdi_devices.into_iter().map(|name| cri::CdiDevice { name }));
        }
        Ok(out)
    }

    /// Keeps a plugin's Allocate answer with its assignment (if that still stands).
    fn keep(&self, entry: &Entry, allocated: Allocated) {
        let mut state = self.lock();
        let Some(e) = state
            .assignments
            .entries
            .iter_mut()
            .find(|e| e.pod_uid == entry.pod_uid && e.container == entry.container && e.resource == entry.resource)
        else {
            return;
        };
        e.allocated = Some(allocated);
        drop(state);
        self.save();
    }
}
