//! The ConfigMaps and Secrets a pod refers to (upstream's `VisitPodConfigmapNames` and
//! `VisitPodSecretNames`): what the node agent fetches for a pod, and what the Node authorizer lets
//! the pod's node read.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, PodSpec};

/// Names of ConfigMaps and Secrets, in the pod's namespace.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Referenced {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
}

impl Referenced {
    /// Everything the pod refers to: its volumes, every container's environment (init and ephemeral
    /// containers too), its image pull secrets.
    pub fn all(spec: &PodSpec) -> Self {
        let mut refs = Self::default();
        refs.add_volumes(spec);
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            refs.add_env(c.env.as_deref(), c.env_from.as_deref());
        }
        for c in spec.ephemeral_containers.iter().flatten() {
            refs.add_env(c.env.as_deref(), c.env_from.as_deref());
        }
        refs.add_pull_secrets(spec);
        refs
    }

    /// The sources of the pod's volumes (projected ones included, and inline CSI volumes' publish
    /// secrets).
    pub fn add_volumes(&mut self, spec: &PodSpec) {
        for v in spec.volumes.iter().flatten() {
            self.config_maps.extend(v.config_map.as_ref().map(|c| c.name.clone()));
            self.secrets.extend(v.secret.as_ref().and_then(|s| s.secret_name.clone()));
            self.secrets
                .extend(v.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()).map(|r| r.name.clone()));
            for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                self.config_maps.extend(source.config_map.as_ref().map(|c| c.name.clone()));
                self.secrets.extend(source.secret.as_ref().map(|s| s.name.clone()));
            }
        }
        self.drop_empty();
    }

    /// One container's `env` and `envFrom`.
    pub fn add_env(&mut self, env: Option<&[EnvVar]>, env_from: Option<&[EnvFromSource]>) {
        for from in env_from.into_iter().flatten() {
            self.config_maps.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
            self.secrets.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
        }
        for source in env.into_iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            self.config_maps.extend(source.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            self.secrets.extend(source.secret_key_ref.as_ref().map(|r| r.name.clone()));
        }
        self.drop_empty();
    }

    pub fn add_pull_secrets(&mut self, spec: &PodSpec) {
        self.secrets.extend(spec.image_pull_secrets.iter().flatten().map(|s| s.name.clone()));
        self.drop_empty();
    }

    fn drop_empty(&mut self) {
        self.config_maps.retain(|n| !n.is_empty());
        self.secrets.retain(|n| !n.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_finds_every_kind_of_reference() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "a", "envFrom": [{"configMapRef": {"name": "cm-from"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}}]}],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s-init"}}]}],
            "ephemeralContainers": [{"name": "e", "env": [{"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "cm-eph", "key": "k"}}}]}],
            "volumes": [
                {"name": "v1", "configMap": {"name": "cm-vol"}},
                {"name": "v2", "secret": {"secretName": "s-vol"}},
                {"name": "v3", "projected": {"sources": [{"secret": {"name": "s-proj"}}, {"configMap": {"name": "cm-proj"}}]}},
                {"name": "v4", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s-csi"}}}
            ],
            "imagePullSecrets": [{"name": "s-pull"}, {"name": ""}]
        }))
        .unwrap();
        let refs = Referenced::all(&spec);
        let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(refs.config_maps, set(&["cm-eph", "cm-from", "cm-proj", "cm-vol"]));
        assert_eq!(refs.secrets, set(&["s-csi", "s-env", "s-init", "s-proj", "s-pull", "s-vol"]));
    }
}
