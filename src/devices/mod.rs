//! kubelet's device manager: device plugins register on `kubelet.sock` in the device-plugins
//! directory (`<--kubelet-root-dir>/device-plugins/`, so stock plugin DaemonSets work unchanged), the
//! node follows each plugin's ListAndWatch stream (`registration.rs`), and the Node advertises each
//! resource: capacity = every device the plugin listed, allocatable = the healthy ones. A plugin that
//! goes away leaves its devices unhealthy (capacity kept, allocatable 0), as upstream.
//!
//! Allocation (`allocate.rs`): a pod is admitted only when every container gets the devices it asks
//! for (healthy, held by no other active pod; init containers' devices reused by the app containers);
//! the plugin's Allocate answer is asked for when the container is first created, and both are
//! checkpointed (`<device-plugins>/kubelet_internal_checkpoint`), so a restarted node gives running
//! containers the same devices and never gives a device to two pods.
//!
//! `generic.rs` is the built-in plugin of `--device RESOURCE=GLOB` (device nodes by glob).

mod allocate;
pub mod generic;
pub mod nvidia;
mod plugin;
pub mod podresources;
pub mod registration;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The device-plugin API v1beta1, as generated from `proto/deviceplugin.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1beta1");
}

/// The API version plugins register with.
pub const VERSION: &str = "v1beta1";
/// The health a plugin reports for a usable device.
pub const HEALTHY: &str = "Healthy";

/// The device-plugins directory under kubelet's root directory.
pub fn plugins_dir(kubelet_root_dir: &std::path::Path) -> PathBuf {
    kubelet_root_dir.join("device-plugins")
}

/// One resource's devices (ID → healthy) and its plugin, while connected.
#[derive(Debug, Default, Clone)]
struct Resource {
    devices: BTreeMap<String, bool>,
    /// Bumped at every registration, so that an old plugin's stream ending does not touch its successor.
    generation: u64,
    plugin: Option<proto::device_plugin_client::DevicePluginClient<tonic::transport::Channel>>,
    pre_start_required: bool,
    /// The plugin answers GetPreferredAllocation.
    preferred_allocation: bool,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    assignments: allocate::Assignments,
}

/// The resources the node's device plugins offer, what is assigned to which container, and a signal
/// of each change of the resources. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    state: Arc<Mutex<State>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Where assignments are checkpointed (none in unit tests), and its writers' lock.
    checkpoint: Option<(PathBuf, Arc<Mutex<()>>)>,
}

impl Default for Manager {
    fn default() -> Self {
        Manager { state: Arc::default(), changed: Arc::new(tokio::sync::watch::Sender::new(0)), checkpoint: None }
    }
}

impl Manager {
    /// A manager checkpointing under `dir`, with the assignments checkpointed there before.
    pub fn new(dir: &std::path::Path) -> Self {
        let checkpoint = dir.join(allocate::CHECKPOINT);
        let assignments = allocate::load(&checkpoint);
        let state = State { resources: BTreeMap::new(), assignments };
        Manager {
            state: Arc::new(Mutex::new(state)),
            checkpoint: Some((checkpoint, Arc::default())),
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A plugin registered for `resource`: its generation, for the stream it opens.
    fn registered(&self, resource: &str, options: &proto::DevicePluginOptions) -> u64 {
        let mut all = self.lock();
        let r = all.resources.entry(resource.to_string()).or_default();
        r.generation += 1;
        r.pre_start_required = options.pre_start_required;
        r.preferred_allocation = options.get_preferred_allocation_available;
        r.plugin = None;
        r.generation
    }

    /// The plugin of `generation` is connected: its client, for Allocate and PreStartContainer.
    fn connected(
        &self,
        resource: &str,
        generation: u64,
        client: proto::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    ) {
        if let Some(r) = self.lock().resources.get_mut(resource).filter(|r| r.generation == generation) {
            r.plugin = Some(client);
        }
    }

    /// A ListAndWatch answer of the plugin of `generation`: the resource's whole device list.
    fn listed(&self, resource: &str, generation: u64, devices: BTreeMap<String, bool>) {
        {
            let mut all = self.lock();
            let Some(r) = all.resources.get_mut(resource).filter(|r| r.generation == generation) else { return };
            if r.devices == devices {
                return;
            }
            r.devices = devices;
        }
        self.notify();
    }

    /// The plugin of `generation` went away: its devices stay, unhealthy.
    fn disconnected(&self, resource: &str, generation: u64) {
        {
            let mut all = self.lock();
            let Some(r) = all.resources.get_mut(resource).filter(|r| r.generation == generation) else { return };
            r.devices.values_mut().for_each(|healthy| *healthy = false);
            r.plugin = None;
        }
        self.notify();
    }

    /// Each resource's capacity (devices) and allocatable (healthy devices).
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        self.lock()
            .resources
            .iter()
            .map(|(name, r)| {
                (name.clone(), (r.devices.len() as i64, r.devices.values().filter(|h| **h).count() as i64))
            })
            .collect()
    }

    /// Ticks at every change of what [`Manager::capacity`] says.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}
