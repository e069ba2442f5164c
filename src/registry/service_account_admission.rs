//! ServiceAccount admission (upstream's `plugin/pkg/admission/serviceaccount`): a new pod runs as a
//! service account that exists (`default` unless it names one), takes that account's image pull
//! secrets when it names none, and, unless automounting is off on the pod or else on the account,
//! gets a `kube-api-access-*` projected volume (a token, the cluster CA, the namespace) mounted in
//! every container at `/var/run/secrets/kubernetes.io/serviceaccount`. Mirror pods are left alone.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Registry, Result, StatusError, generate_name};
use crate::registry::token_request::KUBE_API_ACCESS_EXPIRATION_SECONDS;

pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const VOLUME_PREFIX: &str = "kube-api-access-";
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The `default` account is made by a controller just after its namespace: it is looked for this
/// many times (upstream's `getServiceAccount`), another account once.
const DEFAULT_ACCOUNT_ATTEMPTS: u32 = 10;
const RETRY: Duration = Duration::from_millis(150);

/// The projected volume upstream's `TokenVolumeSource` describes.
fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": KUBE_API_ACCESS_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [
                    {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                ]}},
            ],
        },
    })
}

/// Mounts the token volume in every (init) container that has nothing at the token path, adding
/// the volume when one does (`mountServiceAccountToken`).
pub fn mount_token(spec: &mut Value, volume_name: impl FnOnce() -> String) {
    let existing = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(str::to_string);
    let name = existing.clone().unwrap_or_else(volume_name);
    let mount = json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            let mounted =
                c["volumeMounts"].as_array().into_iter().flatten().any(|m| m["mountPath"] == TOKEN_MOUNT_PATH);
            if mounted {
                continue;
            }
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount.clone()),
                None => c["volumeMounts"] = json!([mount.clone()]),
            }
            needed = true;
        }
    }
    if needed && existing.is_none() {
        match spec["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(token_volume(&name)),
            None => spec["volumes"] = json!([token_volume(&name)]),
        }
    }
}

impl Registry {
    /// Admits a new pod, before its defaults (which then cover the volume it may get).
    pub(super) async fn admit_service_account(&self, pod: &mut Value) -> Result<()> {
        if pod["metadata"]["annotations"].get(MIRROR_POD_ANNOTATION).is_some() {
            return Ok(());
        }
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        // `serviceAccount` is the deprecated alias the defaults turn into `serviceAccountName`.
        let named = |field: &str| pod["spec"][field].as_str().filter(|n| !n.is_empty()).map(str::to_string);
        let account = named("serviceAccountName").or_else(|| named("serviceAccount")).unwrap_or("default".into());
        let attempts = if account == "default" { DEFAULT_ACCOUNT_ATTEMPTS } else { 1 };
        let mut sa = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(RETRY).await;
            }
            match self.live("serviceaccounts", Some(&ns), &account) {
                Ok(found) => {
                    sa = Some(found);
                    break;
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let Some(sa) = sa else {
            let gr = super::GroupResource { group: String::new(), resource: "pods".into() };
            return Err(StatusError::forbidden(
                &gr,
                &pod_name,
                format!("error looking up service account {ns}/{account}: serviceaccount \"{account}\" not found"),
            ));
        };
        let spec = &mut pod["spec"];
        if spec["imagePullSecrets"].as_array().is_none_or(Vec::is_empty)
            && let Some(secrets) = sa["imagePullSecrets"].as_array().filter(|s| !s.is_empty())
        {
            spec["imagePullSecrets"] = json!(secrets);
        }
        let automount = spec["automountServiceAccountToken"]
            .as_bool()
            .or(sa["automountServiceAccountToken"].as_bool())
            .unwrap_or(true);
        if automount {
            mount_token(spec, || generate_name(VOLUME_PREFIX));
        }
        Ok(())
    }
}

/// The `default` ServiceAccount of every namespace there is, as the serviceaccount controller
/// makes them: for tests of the registry alone, where pods need it.
#[cfg(test)]
pub async fn default_accounts(registry: &Registry) {
    let (Some(namespaces), Some(accounts)) =
        (registry.find("", "v1", "namespaces"), registry.find("", "v1", "serviceaccounts"))
    else {
        return;
    };
    let listing = registry.store().list(&Registry::prefix(&namespaces, None), None);
    for (_, ns) in listing.items {
        let ns: Value = serde_json::from_slice(&ns.data).unwrap_or_default();
        let name = ns["metadata"]["name"].as_str().unwrap_or_default();
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        let _ = registry.create(&accounts, Some(name), sa, &Default::default()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_container_mounts_one_token_volume_unless_it_has_its_own() {
        let mut spec = json!({
            "initContainers": [{"name": "init"}],
            "containers": [
                {"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "b", "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        });
        mount_token(&mut spec, || "kube-api-access-abcde".into());
        let mount = json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
        assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(spec["containers"][0]["volumeMounts"][1], mount);
        assert_eq!(spec["containers"][1]["volumeMounts"].as_array().unwrap().len(), 1, "its own mount stays");
        assert_eq!(spec["volumes"][1], token_volume("kube-api-access-abcde"));
        assert_eq!(spec["volumes"][1]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"], 3607);

        // Admitted again (an existing volume is reused): nothing changes.
        let before = spec.clone();
        mount_token(&mut spec, || unreachable!("the existing volume is reused"));
        assert_eq!(spec, before);

        // Every container has its own: no volume.
        let mut own =
            json!({"containers": [{"name": "b", "volumeMounts": [{"name": "m", "mountPath": TOKEN_MOUNT_PATH}]}]});
        mount_token(&mut own, || "kube-api-access-x".into());
        assert!(own.get("volumes").is_none() || own["volumes"].is_null());
    }
}
