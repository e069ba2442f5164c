//! Static pods (kubelet's file source, `--pod-manifest-path`): every manifest in the node's
//! pod-manifest directory is a pod this node runs by itself, without the scheduler, named
//! `<name>-<node>`, with a UID hashed from the manifest, the node and the file (so an edit is a new
//! pod: the old one stops, the new one starts), tolerating every NoExecute taint. The API shows
//! each as a mirror pod (`kubernetes.io/config.mirror`), owned by the Node and recreated when it is
//! deleted; the pod's status is written there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";

/// How often the directory is looked at again (kubelet's `fileCheckFrequency` is 20 s; a stat of
/// a small directory this often costs nothing and makes an edit take effect at once).
const CHECK_PERIOD: Duration = Duration::from_secs(2);

/// Whether `pod` came from a manifest file (not from the API).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE) == Some("file")
}

/// The static pod's hash a mirror pod stands for, if `pod` is a mirror pod.
pub fn mirror_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_MIRROR)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Follows `dir` until `shutdown`: its static pods, sent again whenever a manifest changes.
pub fn watch_dir(dir: PathBuf, node: String, shutdown: CancellationToken) -> watch::Receiver<Arc<Vec<Pod>>> {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!("static pods: creating {}: {e}", dir.display());
    }
    let (tx, rx) = watch::channel(Arc::new(read_dir(&dir, &node)));
    tokio::spawn(async move {
        let mut seen = fingerprint(&dir);
        let mut ticks = tokio::time::interval(CHECK_PERIOD);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let now = fingerprint(&dir);
            if now != seen {
                seen = now;
                let pods = read_dir(&dir, &node);
                tx.send_replace(Arc::new(pods));
            }
        }
    });
    rx
}

/// What a change of the directory would change: each manifest's name, size and modification time.
fn fingerprint(dir: &Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut files: Vec<_> = manifests(dir)
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            Some((p.display().to_string(), m.len(), m.modified().ok()))
        })
        .collect();
    files.sort();
    files
}

/// The manifest files of `dir`: regular files not hidden, in name order (kubelet's file source).
fn manifests(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// The static pods of `dir`'s manifests; a manifest that is not a valid pod is skipped, saying why.
pub fn read_dir(dir: &Path, node: &str) -> Vec<Pod> {
    let mut pods = Vec::new();
    for path in manifests(dir) {
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| from_manifest(&text, &path, node));
        match parsed {
            Ok(pod) => pods.push(pod),
            Err(e) => tracing::warn!("static pod manifest {}: {e}; it is not run", path.display()),
        }
    }
    pods
}

/// A manifest as kubelet's file source turns it into a pod (`applyDefaults`): named
/// `<name>-<node>` in its namespace (`default`), bound to this node, defaulted and validated as the
/// API would, tolerating every NoExecute taint, with the UID and `config.hash` hashed from the pod,
/// the node and the file.
pub fn from_manifest(text: &str, path: &Path, node: &str) -> Result<Pod, String> {
    let doc: serde_json::Value = serde_yaml::from_str(text).map_err(|e| format!("not valid YAML or JSON: {e}"))?;
    if doc.get("kind").and_then(|k| k.as_str()) != Some("Pod")
        || doc.get("apiVersion").and_then(|v| v.as_str()) != Some("v1")
    {
        return Err("a static pod manifest holds one object of apiVersion v1, kind Pod".into());
    }
    let mut pod: Pod = serde_json::from_value(doc).map_err(|e| format!("not a valid Pod: {e}"))?;
    let name = pod.metadata.name.clone().filter(|n| !n.is_empty()).ok_or("the pod has no metadata.name")?;
    pod.metadata.name = Some(format!("{name}-{}", node.to_lowercase()));
    pod.metadata.namespace.get_or_insert_with(|| "default".into());
    pod.metadata.uid = None;
    pod.metadata.resource_version = None;
    pod.status = None;
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node.to_string());
    let account = (spec.service_account_name.clone(), spec.service_account.clone());
    crate::registry::kinds::pod_rules::default_pod(&mut pod);
    // The API server's ServiceAccount admission has no say in a file: a static pod has a service
    // account only when its manifest names one (and then NodeRestriction refuses its mirror pod).
    let spec = pod.spec.get_or_insert_with(Default::default);
    (spec.service_account_name, spec.service_account) = account;
    let errors = crate::registry::kinds::pod_rules::validate_pod(&pod);
    if !errors.is_empty() {
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(format!("the pod is invalid: {}", all.join(", ")));
    }
    let tolerate =
        Toleration { operator: Some("Exists".into()), effect: Some("NoExecute".into()), ..Default::default() };
    let spec = pod.spec.get_or_insert_with(Default::default);
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.contains(&tolerate) {
        tolerations.push(tolerate);
    }
    let uid = hash(&pod, node, path);
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.into(), uid.clone());
    annotations.insert(CONFIG_SOURCE.into(), "file".into());
    annotations.insert(CONFIG_SEEN.into(), k8s_openapi::jiff::Timestamp::now().to_string());
    pod.metadata.uid = Some(uid);
    pod.status = Some(PodStatus { phase: Some("Pending".into()), ..Default::default() });
    Ok(pod)
}

/// kubelet's static pod UID: a hash of the node, the file and the pod (hex, 32 digits).
fn hash(pod: &Pod, node: &str, path: &Path) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(format!("host:{node}"));
    h.update(format!("file:{}", path.display()));
    h.update(serde_json::to_vec(pod).unwrap_or_default());
    h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The mirror pod of a static pod, as the API keeps it: the same pod with `config.mirror`, owned
/// by its Node (so it goes with the Node), without the static pod's UID or status, and with its
/// priority left to the API's Priority admission (a global default class may give another one).
pub fn mirror_of(pod: &Pod, node: &Node) -> Pod {
    let mut mirror = pod.clone();
    if let Some(spec) = mirror.spec.as_mut() {
        (spec.priority, spec.preemption_policy) = (None, None);
    }
    let hash = annotation(pod, CONFIG_HASH).unwrap_or_default().to_string();
    mirror.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(CONFIG_MIRROR.into(), hash);
    mirror.metadata.uid = None;
    mirror.status = None;
    if let (Some(name), Some(uid)) = (node.metadata.name.clone(), node.metadata.uid.clone()) {
        mirror.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name,
            uid,
            controller: Some(true),
            ..Default::default()
        }]);
    }
    mirror
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: main\n    image: busybox\n";

    #[test]
    fn a_manifest_becomes_a_static_pod_of_this_node() {
        let pod = from_manifest(MANIFEST, Path::new("/m/web.yaml"), "edge-1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-edge-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("edge-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"), "defaulted as the API would");
        assert!(spec.tolerations.as_ref().unwrap().iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.effect.as_deref() == Some("NoExecute")
            && t.key.is_none()));
        assert!(is_static(&pod));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        assert_eq!(annotation(&pod, CONFIG_HASH), Some(uid.as_str()));
        // The same manifest hashes the same; an edit, another file or node does not.
        let again = from_manifest(MANIFEST, Path::new("/m/web.yaml"), "edge-1").unwrap();
        assert_eq!(again.metadata.uid, pod.metadata.uid);
        let edited = MANIFEST.replace("busybox", "busybox:2");
        for other in [
            from_manifest(&edited, Path::new("/m/web.yaml"), "edge-1"),
            from_manifest(MANIFEST, Path::new("/m/other.yaml"), "edge-1"),
            from_manifest(MANIFEST, Path::new("/m/web.yaml"), "edge-2"),
        ] {
            assert_ne!(other.unwrap().metadata.uid, pod.metadata.uid);
        }
    }

    #[test]
    fn bad_manifests_say_why() {
        let p = Path::new("/m/x.yaml");
        assert!(from_manifest("{", p, "n").unwrap_err().contains("not valid YAML"));
        assert!(from_manifest("apiVersion: v1\nkind: Service\n", p, "n").unwrap_err().contains("kind Pod"));
        let nameless = "apiVersion: v1\nkind: Pod\nspec:\n  containers: [{name: a, image: b}]\n";
        assert!(from_manifest(nameless, p, "n").unwrap_err().contains("metadata.name"));
        let invalid = "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: []\n";
        assert!(from_manifest(invalid, p, "n").unwrap_err().contains("invalid"));
    }

    #[test]
    fn the_mirror_is_owned_by_the_node_and_names_the_hash() {
        let pod = from_manifest(MANIFEST, Path::new("/m/web.yaml"), "n1").unwrap();
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "uid": "node-uid"}})).unwrap();
        let mirror = mirror_of(&pod, &node);
        assert_eq!(mirror_hash(&mirror), pod.metadata.uid.as_deref());
        assert_eq!(mirror.metadata.uid, None);
        let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "n1", "node-uid"));
    }
}
