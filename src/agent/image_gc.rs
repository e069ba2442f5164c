//! Image garbage collection, as kubelet's image GC manager (`pkg/kubelet/images/image_gc_manager.go`):
//! every five minutes the node's images are looked at (when each was first seen, when a container
//! last used it), and when the image filesystem is used at or above `--image-gc-high-threshold`
//! (85%), images no container uses are removed, least recently used first, until its use is down
//! to `--image-gc-low-threshold` (80%). Images younger than `--image-minimum-gc-age` (2 minutes),
//! the sandbox image and, unless `--image-gc-air-gapped-images`, the images of the air-gap folder
//! (an air-gapped node could not get them back) are kept. Not enough to free gives the Node a
//! `FreeDiskSpaceFailed` event; a second failure in a row, `ImageGCFailed`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::events::{EventType, ObjectRef, Recorder};
use crate::runtime::cri::{self, Cri};

/// kubelet's `ImageGCPeriod`.
const PERIOD: Duration = Duration::from_secs(300);

/// kubelet's `ImageGCPolicy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub high_percent: u8,
    pub low_percent: u8,
    pub min_age: Duration,
    /// Whether the images of the air-gap folder may go too.
    pub air_gapped: bool,
    /// How often the images are looked at (five minutes; tests shorten it).
    pub period: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            air_gapped: false,
            period: PERIOD,
        }
    }
}

impl Policy {
    /// kubelet's checks of the policy, with its messages.
    pub fn validate(&self) -> Result<(), String> {
        if self.high_percent > 100 {
            return Err(format!("invalid HighThresholdPercent {}, must be in range [0-100]", self.high_percent));
        }
        if self.low_percent > 100 {
            return Err(format!("invalid LowThresholdPercent {}, must be in range [0-100]", self.low_percent));
        }
        if self.low_percent > self.high_percent {
            return Err(format!(
                "LowThresholdPercent {} can not be higher than HighThresholdPercent {}",
                self.low_percent, self.high_percent
            ));
        }
        Ok(())
    }
}

/// An image as the runtime lists it.
#[derive(Clone, Debug, Default)]
pub struct Image {
    pub id: String,
    /// Its tags and digests.
    pub references: Vec<String>,
    pub size: u64,
}

/// Space on the image filesystem, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

/// What one collection removes, and how much it had to free.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub remove: Vec<String>,
    pub to_free: u64,
    pub freed: u64,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    first_detected: Instant,
    last_used: Instant,
}

/// When each image was first seen and last used (kubelet's `imageRecords`, kept in memory only:
/// after a restart every image counts as new for `min_age`).
#[derive(Default)]
pub struct Records {
    images: HashMap<String, Record>,
}

impl Records {
    /// kubelet's `detectImages`: images new since the last look are first seen `now`; images a
    /// container uses are used `now`; images gone are forgotten.
    pub fn detect(&mut self, now: Instant, images: &[Image], in_use: &HashSet<String>) {
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.images.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let record = self.images.entry(image.id.clone()).or_insert(Record { first_detected: now, last_used: now });
            if in_use.contains(&image.id) {
                record.last_used = now;
            }
        }
    }

    /// kubelet's `GarbageCollect` and `freeSpace`: nothing below the high threshold; above it, the
    /// unused, unprotected images old enough, least recently used first, until usage would be at
    /// the low threshold.
    pub fn plan(
        &self,
        now: Instant,
        policy: &Policy,
        fs: FsUsage,
        images: &[Image],
        in_use: &HashSet<String>,
        protected: impl Fn(&Image) -> bool,
    ) -> Option<Plan> {
        if fs.capacity == 0 {
            return None;
        }
        let used_percent = 100 - fs.available.saturating_mul(100) / fs.capacity;
        if used_percent < u64::from(policy.high_percent) {
            return None;
        }
        let target = u128::from(fs.capacity) * u128::from(100 - policy.low_percent) / 100;
        let to_free = u64::try_from(target).unwrap_or(u64::MAX).saturating_sub(fs.available);
        Some(self.choose(now, policy, to_free, images, in_use, protected))
    }

    /// kubelet's `DeleteUnusedImages`, the eviction manager's reclaim: every unused image past the
    /// minimum age, whatever the filesystem's use.
    pub fn plan_all(
        &self,
        now: Instant,
        policy: &Policy,
        images: &[Image],
        in_use: &HashSet<String>,
        protected: impl Fn(&Image) -> bool,
    ) -> Plan {
        self.choose(now, policy, u64::MAX, images, in_use, protected)
    }

    /// Unused, unprotected images past the minimum age, least recently used first, until `to_free`.
    fn choose(
        &self,
        now: Instant,
        policy: &Policy,
        to_free: u64,
        images: &[Image],
        in_use: &HashSet<String>,
        protected: impl Fn(&Image) -> bool,
    ) -> Plan {
        let mut candidates: Vec<(&Image, Record)> = images
            .iter()
            .filter(|i| !in_use.contains(&i.id) && !protected(i))
            .filter_map(|i| Some((i, *self.images.get(&i.id)?)))
            .filter(|(_, r)| now.saturating_duration_since(r.first_detected) >= policy.min_age)
            .collect();
        candidates.sort_by_key(|(_, r)| (r.last_used, r.first_detected));
        let mut plan = Plan { to_free, ..Plan::default() };
        for (image, _) in candidates {
            if plan.freed >= to_free {
                break;
            }
            plan.remove.push(image.id.clone());
            plan.freed += image.size;
        }
        plan
    }
}

/// What collection must never remove: the sandbox image, and the air-gap folder's images as its
/// state file names them.
pub struct Protected {
    pub sandbox_image: String,
    /// `None` when the air-gapped images may go.
    pub imported_state: Option<PathBuf>,
}

impl Protected {
    fn references(&self) -> HashSet<String> {
        let imported = self.imported_state.as_deref().map(crate::runtime::images::imported_references);
        std::iter::once(self.sandbox_image.clone())
            .chain(imported.into_iter().flatten())
            .map(|r| crate::runtime::oci_image::normalize_reference(&r).unwrap_or(r))
            .collect()
    }
}

/// The image garbage collector: what it knows of the images, shared by its own rounds and the
/// eviction manager's reclaim.
pub struct ImageGc {
    cri: Cri,
    policy: Policy,
    protected: Protected,
    records: tokio::sync::Mutex<Records>,
}

impl ImageGc {
    pub fn new(cri: Cri, policy: Policy, protected: Protected) -> std::sync::Arc<Self> {
        std::sync::Arc::new(ImageGc { cri, policy, protected, records: Default::default() })
    }

    /// Looks at the images every `policy.period` and collects when the image filesystem is full
    /// enough, until `shutdown`.
    pub async fn run(self: std::sync::Arc<Self>, recorder: Recorder, node: ObjectRef, shutdown: CancellationToken) {
        let mut failed_before = false;
        loop {
            match self.collect(false).await {
                Ok(None) => failed_before = false,
                Ok(Some(plan)) if plan.freed >= plan.to_free => failed_before = false,
                Ok(Some(plan)) => {
                    let message = format!(
                        "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                        plan.to_free, plan.freed
                    );
                    tracing::warn!("image garbage collection: {message}");
                    recorder.record(node.clone(), EventType::Warning, "FreeDiskSpaceFailed", "", message.clone());
                    if failed_before {
                        recorder.record(node.clone(), EventType::Warning, "ImageGCFailed", "", message);
                    }
                    failed_before = true;
                }
                Err(e) => {
                    if failed_before {
                        tracing::warn!("image garbage collection failed multiple times in a row: {e}");
                        recorder.record(node.clone(), EventType::Warning, "ImageGCFailed", "", e.to_string());
                    } else {
                        tracing::info!(
                            "image garbage collection failed once, stats initialization may not have completed yet: {e}"
                        );
                    }
                    failed_before = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.policy.period) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// kubelet's `DeleteUnusedImages`: removes every unused image past the minimum age. Returns
    /// the bytes freed.
    pub async fn delete_unused(&self) -> anyhow::Result<u64> {
        Ok(self.collect(true).await?.map_or(0, |p| p.freed))
    }

    /// One round: the plan carried out (`None` when the filesystem is below the high threshold);
    /// `all` removes every unused image whatever the filesystem's use.
    async fn collect(&self, all: bool) -> anyhow::Result<Option<Plan>> {
        let cri = &self.cri;
        let mut records = self.records.lock().await;
        let now = Instant::now();
        let images: Vec<Image> = cri
            .list_images(Default::default())
            .await?
            .images
            .into_iter()
            .map(|i| Image { references: [i.repo_tags, i.repo_digests].concat(), id: i.id, size: i.size })
            .collect();
        let in_use: HashSet<String> =
            cri.list_containers(Default::default()).await?.containers.into_iter().map(|c| c.image_ref).collect();
        records.detect(now, &images, &in_use);
        let keep = self.protected.references();
        let protected = |i: &Image| i.references.iter().any(|r| keep.contains(r));
        let mut plan = if all {
            records.plan_all(now, &self.policy, &images, &in_use, protected)
        } else {
            let fs = image_fs_usage(cri).await?;
            let Some(plan) = records.plan(now, &self.policy, fs, &images, &in_use, protected) else {
                return Ok(None);
            };
            let used = 100 - fs.available.saturating_mul(100) / fs.capacity.max(1);
            tracing::info!(
                "image filesystem {used}% used (high threshold {}%): freeing {} bytes, {} image(s) eligible",
                self.policy.high_percent,
                plan.to_free,
                plan.remove.len()
            );
            plan
        };
        drop(records);
        let mut freed = 0;
        for id in &plan.remove {
            let image = images.iter().find(|i| i.id == *id);
            let size = image.map_or(0, |i| i.size);
            let spec = cri::ImageSpec { image: id.clone(), ..Default::default() };
            match cri.remove_image(cri::RemoveImageRequest { image: Some(spec) }).await {
                Ok(_) => {
                    tracing::info!(
                        "removed unused image {} ({size} bytes)",
                        image.and_then(|i| i.references.first()).unwrap_or(id)
                    );
                    freed += size;
                }
                Err(e) => tracing::warn!("removing image {id}: {e}"),
            }
        }
        plan.freed = freed;
        Ok(Some(plan))
    }
}

/// Where the runtime keeps its images (CRI `ImageFsInfo`).
pub async fn image_fs_mount(cri: &Cri) -> anyhow::Result<String> {
    let info = cri.image_fs_info(cri::ImageFsInfoRequest {}).await?;
    info.image_filesystems
        .first()
        .and_then(|f| f.fs_id.as_ref())
        .map(|f| f.mountpoint.clone())
        .filter(|m| !m.is_empty())
        .ok_or_else(|| anyhow::anyhow!("the runtime names no image filesystem"))
}

async fn image_fs_usage(cri: &Cri) -> anyhow::Result<FsUsage> {
    let mount = image_fs_mount(cri).await?;
    let stat = nix::sys::statvfs::statvfs(mount.as_str())
        .map_err(|e| anyhow::anyhow!("statfs of the image filesystem {mount}: {e}"))?;
    let block = stat.fragment_size();
    Ok(FsUsage { capacity: stat.blocks() * block, available: stat.blocks_available() * block })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64) -> Image {
        Image { id: id.into(), references: vec![format!("docker.io/library/{id}:latest")], size }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn below_the_high_threshold_nothing_goes() {
        let mut r = Records::default();
        let t0 = Instant::now();
        let images = [image("a", GIB)];
        r.detect(t0, &images, &HashSet::new());
        let later = t0 + Duration::from_secs(600);
        let fs = FsUsage { capacity: 100 * GIB, available: 16 * GIB };
        assert_eq!(r.plan(later, &Policy::default(), fs, &images, &HashSet::new(), |_| false), None);
    }

    #[test]
    fn least_recently_used_go_first_until_the_low_threshold() {
        let mut r = Records::default();
        let t0 = Instant::now();
        let images = [image("old", 3 * GIB), image("recent", 3 * GIB), image("used", 3 * GIB), image("pause", GIB)];
        let none = HashSet::new();
        r.detect(t0, &images, &none);
        // "recent" was used later than "old"; "used" is used by a container now.
        r.detect(t0 + Duration::from_secs(200), &images, &HashSet::from(["recent".to_string()]));
        let in_use = HashSet::from(["used".to_string()]);
        let now = t0 + Duration::from_secs(400);
        r.detect(now, &images, &in_use);
        let protected = |i: &Image| i.id == "pause";
        // 90% used: 10 GiB of 100 must be freed to reach 80%.
        let fs = FsUsage { capacity: 100 * GIB, available: 10 * GIB };
        let plan = r.plan(now, &Policy::default(), fs, &images, &in_use, protected).unwrap();
        assert_eq!(plan.to_free, 10 * GIB);
        assert_eq!(plan.remove, ["old", "recent"], "least recently used first, never the used or pinned one");
        assert!(plan.freed < plan.to_free, "not enough: FreeDiskSpaceFailed");
        // 86% used: 6 GiB to free, two images.
        let fs = FsUsage { capacity: 100 * GIB, available: 14 * GIB };
        let plan = r.plan(now, &Policy::default(), fs, &images, &in_use, protected).unwrap();
        assert_eq!((plan.remove.len(), plan.freed), (2, 6 * GIB));
        // 85% used with a low threshold of 83%: 2 GiB, one image.
        let fs = FsUsage { capacity: 100 * GIB, available: 15 * GIB };
        let policy = Policy { low_percent: 83, ..Policy::default() };
        let plan = r.plan(now, &policy, fs, &images, &in_use, protected).unwrap();
        assert_eq!(plan.remove, ["old"]);
    }

    #[test]
    fn images_younger_than_the_minimum_age_stay() {
        let mut r = Records::default();
        let t0 = Instant::now();
        let images = [image("fresh", GIB)];
        r.detect(t0, &images, &HashSet::new());
        let fs = FsUsage { capacity: 10 * GIB, available: 0 };
        let plan = r.plan(t0 + Duration::from_secs(60), &Policy::default(), fs, &images, &HashSet::new(), |_| false);
        assert_eq!(plan.map(|p| p.remove), Some(vec![]));
        let plan = r.plan(t0 + Duration::from_secs(121), &Policy::default(), fs, &images, &HashSet::new(), |_| false);
        assert_eq!(plan.map(|p| p.remove), Some(vec!["fresh".to_string()]));
        // An image gone from the runtime is forgotten.
        r.detect(t0, &[], &HashSet::new());
        assert!(r.images.is_empty());
    }

    #[test]
    fn the_sandbox_image_and_the_air_gapped_ones_are_protected() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("images.imported.json");
        let record = serde_json::json!({"files": {
            "app.tar": {"size": 1, "mtime_ns": 1, "kind": "tarball", "ok": true,
                "images": [{"reference": "busybox:1.36", "digest": "sha256:aa"}]},
            "broken.tar": {"size": 1, "mtime_ns": 1, "kind": "tarball", "ok": false,
                "images": [{"reference": "docker.io/library/broken:1"}]}}});
        std::fs::write(&state, record.to_string()).unwrap();
        let sandbox = "localhost/cairn/pause:1".to_string();
        let protected = Protected { sandbox_image: sandbox.clone(), imported_state: Some(state) };
        let keep = protected.references();
        assert_eq!(keep, HashSet::from([sandbox.clone(), "docker.io/library/busybox:1.36".to_string()]));
        let opted_in = Protected { sandbox_image: sandbox.clone(), imported_state: None };
        assert_eq!(opted_in.references(), HashSet::from([sandbox]));
    }

    #[test]
    fn policies_are_checked_as_kubelet_does() {
        assert_eq!(Policy::default().validate(), Ok(()));
        let bad = Policy { low_percent: 90, ..Policy::default() };
        assert_eq!(
            bad.validate().unwrap_err(),
            "LowThresholdPercent 90 can not be higher than HighThresholdPercent 85"
        );
        let bad = Policy { high_percent: 101, ..Policy::default() };
        assert_eq!(bad.validate().unwrap_err(), "invalid HighThresholdPercent 101, must be in range [0-100]");
    }
}
