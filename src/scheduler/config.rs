//! `KubeSchedulerConfiguration` (kubescheduler.config.k8s.io/v1): the subset an in-process
//! scheduler uses, turned into profiles the way kube-scheduler merges and expands plugin sets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::framework::{Enabled, Plugin, Point, Profile};
use super::plugins::{self, DEFAULT_PLUGINS, Handle};

/// The default profile's name, and what the API server puts in an empty `spec.schedulerName`.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    profiles: Vec<ProfileConfig>,
    percentage_of_nodes_to_score: Option<i64>,
    pod_initial_backoff_seconds: Option<i64>,
    pod_max_backoff_seconds: Option<i64>,
    parallelism: Option<i64>,
    #[serde(default)]
    extenders: Vec<Value>,
    // Accepted and ignored, so that existing files load: they concern a separate kube-scheduler process.
    #[serde(rename = "leaderElection")]
    _leader_election: Option<IgnoredAny>,
    #[serde(rename = "clientConnection")]
    _client_connection: Option<IgnoredAny>,
    #[serde(rename = "enableProfiling")]
    _enable_profiling: Option<IgnoredAny>,
    #[serde(rename = "enableContentionProfiling")]
    _enable_contention_profiling: Option<IgnoredAny>,
    #[serde(rename = "delayCacheUntilActive")]
    _delay_cache_until_active: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileConfig {
    scheduler_name: Option<String>,
    #[serde(default)]
    plugins: Plugins,
    #[serde(default)]
    plugin_config: Vec<PluginConfig>,
    percentage_of_nodes_to_score: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Plugins {
    multi_point: Option<PluginSet>,
    pre_enqueue: Option<PluginSet>,
    queue_sort: Option<PluginSet>,
    pre_filter: Option<PluginSet>,
    filter: Option<PluginSet>,
    post_filter: Option<PluginSet>,
    pre_score: Option<PluginSet>,
    score: Option<PluginSet>,
    reserve: Option<PluginSet>,
    permit: Option<PluginSet>,
    pre_bind: Option<PluginSet>,
    bind: Option<PluginSet>,
    post_bind: Option<PluginSet>,
}

impl Plugins {
    fn at(&self, point: Point) -> Option<&PluginSet> {
        match point {
            Point::PreEnqueue => self.pre_enqueue.as_ref(),
            Point::QueueSort => self.queue_sort.as_ref(),
            Point::PreFilter => self.pre_filter.as_ref(),
            Point::Filter => self.filter.as_ref(),
            Point::PostFilter => self.post_filter.as_ref(),
            Point::PreScore => self.pre_score.as_ref(),
            Point::Score => self.score.as_ref(),
            Point::Reserve => self.reserve.as_ref(),
            Point::Permit => self.permit.as_ref(),
            Point::PreBind => self.pre_bind.as_ref(),
            Point::Bind => self.bind.as_ref(),
            Point::PostBind => self.post_bind.as_ref(),
        }
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginSet {
    #[serde(default)]
    enabled: Vec<PluginRef>,
    #[serde(default)]
    disabled: Vec<PluginRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginRef {
    name: String,
    /// int32 upstream: bounded so that weighted totals cannot overflow.
    weight: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginConfig {
    name: String,
    args: Option<Value>,
}

/// A validated scheduler configuration; [`Config::build`] turns it into profiles.
#[derive(Debug)]
pub struct Config {
    profiles: Vec<ProfileConfig>,
    percentage_of_nodes_to_score: u32,
    /// Threads that filter and score nodes (`parallelism`); 1 means none besides the scheduling loop.
    parallelism: usize,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_file(FileConfig::default()).unwrap_or_else(|_| unreachable!("the default configuration is valid"))
    }
}

fn percentage(field: &str, v: Option<i64>) -> Result<Option<u32>, String> {
    match v {
        None => Ok(None),
        Some(p) if (0..=100).contains(&p) => Ok(Some(p as u32)),
        Some(p) => Err(format!("{field}: Invalid value: {p}: not in valid range [0-100]")),
    }
}

impl Config {
    /// Reads and validates a configuration file (YAML or JSON).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading scheduler config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("scheduler config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: FileConfig = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        Self::from_file(file)
    }

    fn from_file(mut file: FileConfig) -> Result<Self, String> {
        const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";
        match file.api_version.as_deref() {
            Some(API_VERSION) | None => {}
            Some(v) => return Err(format!("apiVersion: Unsupported value: {v:?}: supported values: {API_VERSION:?}")),
        }
        match file.kind.as_deref() {
            Some("KubeSchedulerConfiguration") | None => {}
            Some(k) => {
                return Err(format!(
                    "kind: Unsupported value: {k:?}: supported values: \"KubeSchedulerConfiguration\""
                ));
            }
        }
        if !file.extenders.is_empty() {
            return Err("extenders: Forbidden: scheduler extenders are not supported".into());
        }
        if let Some(p) = file.parallelism.filter(|p| *p <= 0) {
            return Err(format!("parallelism: Invalid value: {p}: should be an integer value greater than zero"));
        }
        let initial = file.pod_initial_backoff_seconds.unwrap_or(1);
        if initial <= 0 {
            return Err(format!("podInitialBackoffSeconds: Invalid value: {initial}: must be greater than 0"));
        }
        let max = file.pod_max_backoff_seconds.unwrap_or(10);
        if max < initial {
            return Err(format!(
                "podMaxBackoffSeconds: Invalid value: {max}: must be greater than or equal to PodInitialBackoffSeconds"
            ));
        }
        let global = percentage("percentageOfNodesToScore", file.percentage_of_nodes_to_score)?.unwrap_or(0);
        if file.profiles.is_empty() {
            file.profiles.push(ProfileConfig::default());
        }
        if file.profiles.len() == 1 && file.profiles[0].scheduler_name.is_none() {
            file.profiles[0].scheduler_name = Some(DEFAULT_SCHEDULER_NAME.into());
        }
        let mut names = HashSet::new();
        for (i, p) in file.profiles.iter().enumerate() {
            let name = p.scheduler_name.as_deref().unwrap_or_default();
            if name.is_empty() {
                return Err(format!("profiles[{i}].schedulerName: Required value"));
            }
            if !names.insert(name) {
                return Err(format!("profiles[{i}].schedulerName: Duplicate value: {name:?}"));
            }
            percentage(&format!("profiles[{i}].percentageOfNodesToScore"), p.percentage_of_nodes_to_score)?;
            let mut seen = HashSet::new();
            for (j, c) in p.plugin_config.iter().enumerate() {
                if !seen.insert(c.name.as_str()) {
                    return Err(format!(
                        "profiles[{i}].pluginConfig[{j}]: Invalid value: {:?}: repeated config for plugin {}",
                        c.name, c.name
                    ));
                }
            }
        }
        Ok(Config {
            parallelism: file.parallelism.map_or_else(default_parallelism, |p| p as usize),
            profiles: file.profiles,
            percentage_of_nodes_to_score: global,
            initial_backoff: Duration::from_secs(initial as u64),
            max_backoff: Duration::from_secs(max as u64),
        })
    }

    /// Instantiates every profile's plugins (validating their args) and expands the plugin sets.
    pub fn build(&self, handle: &Handle) -> Result<Vec<Profile>, String> {
        let pool = match self.parallelism {
            1 => None,
            n => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("scheduler-{i}"))
                    .build()
                    .map_err(|e| format!("starting {n} scheduler threads: {e}"))?,
            )),
        };
        let mut profiles = Vec::new();
        for (i, p) in self.profiles.iter().enumerate() {
            let profile = build_profile(p, self.percentage_of_nodes_to_score, pool.as_ref(), handle)
                .map_err(|e| format!("profiles[{i}] ({:?}): {e}", p.scheduler_name.as_deref().unwrap_or_default()))?;
            profiles.push(profile);
        }
        // All profiles share one queue, so they must sort it the same way.
        let sorts: HashSet<Vec<&str>> =
            profiles.iter().map(|p| p.plugins(Point::QueueSort).map(|pl| pl.name()).collect::<Vec<_>>()).collect();
        if sorts.len() > 1 {
            return Err("profiles: Invalid value: queueSort must be the same for all profiles".into());
        }
        Ok(profiles)
    }
}

/// Without `parallelism` in the file: one thread per CPU up to upstream's 16, but none on machines
/// with two CPUs or fewer, where the API server needs the other CPU and handing nodes to a second
/// thread costs more than it saves.
fn default_parallelism() -> usize {
    match std::thread::available_parallelism().map_or(1, |n| n.get()) {
        n if n <= 2 => 1,
        n => n.min(16),
    }
}

/// upstream's `mergePluginSet`: defaults in order (minus disabled, re-configured in place), then the
/// custom plugins that did not replace a default.
fn merge_plugin_set(defaults: &[PluginRef], custom: &PluginSet) -> (Vec<PluginRef>, HashSet<String>) {
    let disabled: HashSet<String> = custom.disabled.iter().map(|d| d.name.clone()).collect();
    let mut enabled = Vec::new();
    let mut replaced = HashSet::new();
    if !disabled.contains("*") {
        for d in defaults.iter().filter(|d| !disabled.contains(&d.name)) {
            match custom.enabled.iter().position(|c| c.name == d.name) {
                Some(i) => {
                    enabled.push(custom.enabled[i].clone());
                    replaced.insert(i);
                }
                None => enabled.push(d.clone()),
            }
        }
    }
    enabled.extend(custom.enabled.iter().enumerate().filter(|(i, _)| !replaced.contains(i)).map(|(_, c)| c.clone()));
    (enabled, disabled)
}

fn build_profile(
    p: &ProfileConfig,
    global_percentage: u32,
    pool: Option<&Arc<rayon::ThreadPool>>,
    handle: &Handle,
) -> Result<Profile, String> {
    let name = p.scheduler_name.clone().unwrap_or_default();
    let args: HashMap<&str, &Value> =
        p.plugin_config.iter().filter_map(|c| c.args.as_ref().map(|a| (c.name.as_str(), a))).collect();
    let mut instances: BTreeMap<String, Option<Arc<dyn Plugin>>> = BTreeMap::new();
    let mut instance = |name: &str| -> Result<Option<Arc<dyn Plugin>>, String> {
        if let Some(i) = instances.get(name) {
            return Ok(i.clone());
        }
        let built = plugins::build(name, args.get(name).map(|v| (*v).clone()), handle).map_err(|e| match e {
            e if e.starts_with("unknown plugin") => e,
            e => format!("pluginConfig {name}: {e}"),
        })?;
        if built.is_none() {
            tracing::info!("scheduler profile {:?}: plugin {name} is not served by cairn; left out", p.scheduler_name);
        }
        instances.insert(name.to_string(), built.clone());
        Ok(built)
    };

    let defaults: Vec<PluginRef> =
        DEFAULT_PLUGINS.iter().map(|(n, w)| PluginRef { name: n.to_string(), weight: Some(*w as i32) }).collect();
    let (multi, _) = merge_plugin_set(&defaults, &p.plugins.multi_point.clone().unwrap_or_default());
    let mut points: HashMap<Point, Vec<Enabled>> = HashMap::new();
    for point in Point::ALL {
        let custom = p.plugins.at(point).cloned().unwrap_or_default();
        let (explicit, disabled) = merge_plugin_set(&[], &custom);
        let mut explicit_plugins = Vec::new();
        for r in &explicit {
            if let Some(pl) = instance(&r.name)? {
                if !pl.points().contains(&point) {
                    return Err(format!("plugin {:?} does not extend {} plugin", r.name, point.config_name()));
                }
                explicit_plugins.push((r.clone(), pl));
            }
        }
        // MultiPoint expansion (upstream's expandMultiPointPlugins): explicit overrides of multi-point
        // plugins first, then the other multi-point plugins, then the remaining explicit ones.
        let mut list: Vec<(PluginRef, Arc<dyn Plugin>)> = Vec::new();
        let mut overrides = HashSet::new();
        let mut from_multi = Vec::new();
        if !disabled.contains("*") {
            for r in &multi {
                let Some(pl) = instance(&r.name)? else { continue };
                if !pl.points().contains(&point) || disabled.contains(&r.name) {
                    continue;
                }
                if explicit.iter().any(|e| e.name == r.name) {
                    overrides.insert(r.name.clone());
                    continue;
                }
                if from_multi.iter().any(|(m, _): &(PluginRef, _)| m.name == r.name) {
                    return Err(format!("plugin {:?} already registered as {}", r.name, point.config_name()));
                }
                from_multi.push((r.clone(), pl));
            }
        }
        list.extend(explicit_plugins.iter().filter(|(r, _)| overrides.contains(&r.name)).cloned());
        list.extend(from_multi);
        list.extend(explicit_plugins.into_iter().filter(|(r, _)| !overrides.contains(&r.name)));
        let mut seen = HashSet::new();
        for (r, _) in &list {
            if !seen.insert(r.name.clone()) {
                return Err(format!("plugin {:?} already registered as {}", r.name, point.config_name()));
            }
            if let Some(w) = r.weight.filter(|w| *w < 0) {
                return Err(format!("plugins.score.enabled[{}].weight: Invalid value: {w}: must be positive", r.name));
            }
        }
        let enabled: Vec<Enabled> = list
            .into_iter()
            .map(|(r, plugin)| Enabled { plugin, weight: r.weight.filter(|w| *w > 0).map_or(1, i64::from) })
            .collect();
        if !enabled.is_empty() {
            points.insert(point, enabled);
        }
    }
    match points.get(&Point::QueueSort).map(Vec::len) {
        Some(1) => {}
        None => return Err("no queue sort plugin is enabled".into()),
        Some(_) => return Err("only one queue sort plugin can be enabled".into()),
    }
    if !points.contains_key(&Point::Bind) {
        return Err("at least one bind plugin is needed".into());
    }
    let percentage =
        percentage("percentageOfNodesToScore", p.percentage_of_nodes_to_score)?.unwrap_or(global_percentage);
    Ok(Profile { name, points, percentage_of_nodes_to_score: percentage, pool: pool.cloned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_for_a_separate_scheduler_process_are_accepted_and_ignored() {
        let c =
            Config::parse("leaderElection: {leaderElect: true}\nclientConnection: {qps: 50}\nenableProfiling: true\n")
                .unwrap();
        assert_eq!(c.profiles.len(), 1);
        assert_eq!(c.profiles[0].scheduler_name.as_deref(), Some(DEFAULT_SCHEDULER_NAME));
        assert!(Config::parse("leaderElect: true\n").unwrap_err().contains("leaderElect"));
    }
}
