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
    /// [`Manager::release`]); init containers' devices go to the app containers first. Assignments
    /// the pod has already (checkpointed before a restart) stand. The error is the rejection message.
    pub fn admit(&self, pod: &Pod) -> Result<(), String> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut state = self.lock();
        let before = state.assignments.clone();
        let init: Vec<&Container> = spec.init_containers.iter().flatten().collect();
        let containers = init.iter().copied().chain(spec.containers.iter());
        for c in containers {
            for (resource, count) in wants(c) {
                // A device plugin's resource: registered, or held by a container (its plugin not
                // registered again yet after a restart: nothing is free then).
                let healthy: BTreeSet<String> = match state.resources.get(&resource) {
                    Some(r) => r.devices.iter().filter(|(_, h)| **h).map(|(id, _)| id.clone()).collect(),
                    None if state.assignments.entries.iter().any(|e| e.resource == resource) => BTreeSet::new(),
                    // Not a device plugin's resource: the scheduler's to count.
                    None => continue,
                };
                let entries = &state.assignments.entries;
                if entries.iter().any(|e| e.pod_uid == uid && e.container == c.name && e.resource == resource) {
                    continue;
                }
                let ours = |e: &&Entry| e.pod_uid == uid && e.resource == resource;
                let is_init = |name: &str| init.iter().any(|i| i.name == name);
                // Held: other pods' devices, and this pod's app containers'.
                let held: BTreeSet<&String> = entries
                    .iter()
                    .filter(|e| e.resource == resource && (e.pod_uid != uid || !is_init(&e.container)))
                    .flat_map(|e| &e.devices)
                    .collect();
                let reusable: Vec<&String> = entries
                    .iter()
                    .filter(ours)
                    .filter(|e| is_init(&e.container))
                    .flat_map(|e| &e.devices)
                    .filter(|d| healthy.contains(*d) && !held.contains(d))
                    .collect();
                let mut available: Vec<String> = reusable.into_iter().cloned().collect();
                available.dedup();
                let rest: Vec<String> =
                    healthy.iter().filter(|d| !held.contains(d) && !available.contains(d)).cloned().collect();
                available.extend(rest);
                if available.len() < count {
                    let message = format!(
                        "Allocate failed due to requested number of devices unavailable for {resource}. Requested: {count}, Available: {}, which is unexpected",
                        available.len()
                    );
                    state.assignments = before;
                    return Err(message);
                }
                available.truncate(count);
                state.assignments.entries.push(Entry {
                    pod_uid: uid.clone(),
                    container: c.name.clone(),
                    resource,
                    devices: available,
                    allocated: None,
                });
            }
        }
        if state.assignments != before {
            drop(state);
            self.save();
        }
        Ok(())
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
