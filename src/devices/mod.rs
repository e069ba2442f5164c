//! kubelet's device manager: device plugins register on `kubelet.sock` in the device-plugins
//! directory (`<--kubelet-root-dir>/device-plugins/`, so stock plugin DaemonSets work unchanged), the
//! node follows each plugin's ListAndWatch stream (`registration.rs`), and the Node advertises each
//! resource: capacity = every device the plugin listed, allocatable = the healthy ones. A plugin that
//! goes away leaves its devices unhealthy (capacity kept, allocatable 0), as upstream.

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

/// One resource's devices (ID → healthy) and whether its plugin is connected.
#[derive(Debug, Default, Clone)]
struct Resource {
    devices: BTreeMap<String, bool>,
    /// Bumped at every registration, so that an old plugin's stream ending does not touch its successor.
    generation: u64,
}

/// The resources the node's device plugins offer, and a signal of each change. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    resources: Arc<Mutex<BTreeMap<String, Resource>>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for Manager {
    fn default() -> Self {
        Manager { resources: Arc::default(), changed: Arc::new(tokio::sync::watch::Sender::new(0)) }
    }
}

impl Manager {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Resource>> {
        self.resources.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A plugin registered for `resource`: its generation, for the stream it opens.
    fn registered(&self, resource: &str) -> u64 {
        let mut all = self.lock();
        let r = all.entry(resource.to_string()).or_default();
        r.generation += 1;
        r.generation
    }

    /// A ListAndWatch answer of the plugin of `generation`: the resource's whole device list.
    fn listed(&self, resource: &str, generation: u64, devices: BTreeMap<String, bool>) {
        {
            let mut all = self.lock();
            let Some(r) = all.get_mut(resource).filter(|r| r.generation == generation) else { return };
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
            let Some(r) = all.get_mut(resource).filter(|r| r.generation == generation) else { return };
            r.devices.values_mut().for_each(|healthy| *healthy = false);
        }
        self.notify();
    }

    /// Each resource's capacity (devices) and allocatable (healthy devices).
    pub fn capacity(&self) -> BTreeMap<String, (i64, i64)> {
        self.lock()
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
