//! ConfigMaps, Secrets and ServiceAccounts: the configuration kinds pods consume.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use serde_json::{Value, json};

use crate::registry::Subresource;
use crate::registry::patch::{MergeKey, merge};
use crate::registry::strategy::{AGE_COLUMN, Column, Kind, NAME_COLUMN, ResourceInfo, age_cell, name_cell};
use crate::registry::validation::{self, ErrorList, FieldError};

/// Upstream's limit on the total size of a ConfigMap's or Secret's data.
const MAX_DATA_BYTES: usize = 1024 * 1024;

pub struct ConfigMaps;
pub struct Secrets;
pub struct ServiceAccounts;

/// The type of Secrets that hold a service account's long-lived token, and their annotations.
pub const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
pub const SERVICE_ACCOUNT_NAME_KEY: &str = "kubernetes.io/service-account.name";
pub const SERVICE_ACCOUNT_UID_KEY: &str = "kubernetes.io/service-account.uid";

/// `IsConfigMapKey`: what a data key may look like.
fn key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        errs.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string());
    }
    if key == "." {
        errs.push("must not be '.'".to_string());
    } else if key == ".." {
        errs.push("must not be '..'".to_string());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

fn validate_keys<'a>(keys: impl Iterator<Item = &'a String>, field: &str, errs: &mut ErrorList) {
    for k in keys {
        for e in key_errors(k) {
            errs.push(FieldError::invalid(validation::key(field, k), k, e));
        }
    }
}

impl Kind for ConfigMaps {
    type Obj = ConfigMap;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        singular: "configmap",
        namespaced: true,
        short_names: &["cm"],
        categories: &[],
        subresources: &[],
        storage: "configmaps",
        return_deleted_object: false,
    };

    fn validate(&self, cm: &ConfigMap) -> ErrorList {
        let mut errs = Vec::new();
        let data = cm.data.clone().unwrap_or_default();
        let binary = cm.binary_data.clone().unwrap_or_default();
        validate_keys(data.keys(), "data", &mut errs);
        validate_keys(binary.keys(), "binaryData", &mut errs);
        for k in data.keys().filter(|k| binary.contains_key(*k)) {
            errs.push(FieldError::invalid(validation::key("data", k), k, "duplicate of key present in binaryData"));
        }
        let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + binary.iter().map(|(k, v)| k.len() + v.0.len()).sum::<usize>();
        if size > MAX_DATA_BYTES {
            errs.push(FieldError::too_long("", MAX_DATA_BYTES));
        }
        errs
    }

    fn validate_update(&self, new: &ConfigMap, old: &ConfigMap) -> ErrorList {
        let mut errs = self.validate(new);
        if old.immutable == Some(true) {
            if new.immutable != Some(true) {
                errs.push(FieldError::forbidden("immutable", "field is immutable when `immutable` is set"));
            }
            if new.data != old.data {
                errs.push(FieldError::forbidden("data", "field is immutable when `immutable` is set"));
            }
            if new.binary_data != old.binary_data {
                errs.push(FieldError::forbidden("binaryData", "field is immutable when `immutable` is set"));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Data",
                "string",
                "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, cm: &ConfigMap) -> Vec<Value> {
        let n = cm.data.as_ref().map_or(0, |d| d.len()) + cm.binary_data.as_ref().map_or(0, |d| d.len());
        vec![name_cell(&cm.metadata), json!(n), age_cell(&cm.metadata)]
    }
}

impl Secrets {
    /// `stringData` is write-only: merged into `data`, never stored.
    fn fold_string_data(secret: &mut Secret) {
        if let Some(strings) = secret.string_data.take() {
            let data = secret.data.get_or_insert_with(Default::default);
            for (k, v) in strings {
                data.insert(k, ByteString(v.into_bytes()));
            }
        }
    }
}

impl Kind for Secrets {
    type Obj = Secret;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        singular: "secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        storage: "secrets",
        return_deleted_object: false,
    };
    const FIELDS: &'static [&'static str] = &["type"];

    fn prepare_create(&self, secret: &mut Secret) {
        Self::fold_string_data(secret);
        if secret.type_.as_deref().is_none_or(str::is_empty) {
            secret.type_ = Some("Opaque".into());
        }
    }

    fn prepare_update(&self, new: &mut Secret, old: &Secret) {
        Self::fold_string_data(new);
        if new.type_.as_deref().is_none_or(str::is_empty) {
            new.type_ = old.type_.clone();
        }
    }

    fn validate(&self, secret: &Secret) -> ErrorList {
        let mut errs = Vec::new();
        let data = secret.data.clone().unwrap_or_default();
        validate_keys(data.keys(), "data", &mut errs);
        if data.iter().map(|(k, v)| k.len() + v.0.len()).sum::<usize>() > MAX_DATA_BYTES {
            errs.push(FieldError::too_long("data", MAX_DATA_BYTES));
        }
        let required: &[&str] = match secret.type_.as_deref().unwrap_or("Opaque") {
            "kubernetes.io/tls" => &["tls.crt", "tls.key"],
            "kubernetes.io/dockerconfigjson" => &[".dockerconfigjson"],
            "kubernetes.io/dockercfg" => &[".dockercfg"],
            _ => &[],
        };
        for k in required {
            if !data.contains_key(*k) {
                errs.push(FieldError::required(validation::key("data", k), ""));
            }
        }
        let annotations = secret.metadata.annotations.as_ref();
        if secret.type_.as_deref() == Some(SERVICE_ACCOUNT_TOKEN)
            && annotations.and_then(|a| a.get(SERVICE_ACCOUNT_NAME_KEY)).is_none_or(String::is_empty)
        {
            errs.push(FieldError::required(validation::key("metadata.annotations", SERVICE_ACCOUNT_NAME_KEY), ""));
        }
        errs
    }

    fn validate_update(&self, new: &Secret, old: &Secret) -> ErrorList {
        let mut errs = self.validate(new);
        if new.type_ != old.type_ {
            errs.push(FieldError::invalid("type", new.type_.clone().unwrap_or_default(), "field is immutable"));
        }
        if old.immutable == Some(true) && (new.data != old.data || new.immutable != Some(true)) {
            errs.push(FieldError::forbidden("data", "field is immutable when `immutable` is set"));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Type",
                "string",
                "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
            ),
            Column::new(
                "Data",
                "string",
                "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, secret: &Secret) -> Vec<Value> {
        vec![
            name_cell(&secret.metadata),
            json!(secret.type_.clone().unwrap_or_default()),
            json!(secret.data.as_ref().map_or(0, |d| d.len())),
            age_cell(&secret.metadata),
        ]
    }
}

impl Kind for ServiceAccounts {
    type Obj = ServiceAccount;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        namespaced: true,
        short_names: &["sa"],
        categories: &[],
        subresources: &[Subresource::Token],
        storage: "serviceaccounts",
        return_deleted_object: false,
    };
    const MERGE_KEYS: &'static [MergeKey] = &[merge("secrets", "name")];

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::new(
                "Secrets",
                "string",
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
            ),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, sa: &ServiceAccount) -> Vec<Value> {
        vec![name_cell(&sa.metadata), json!(sa.secrets.as_ref().map_or(0, |s| s.len())), age_cell(&sa.metadata)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_folds_into_data() {
        let mut s: Secret =
            serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}})).unwrap();
        Secrets.prepare_create(&mut s);
        assert!(s.string_data.is_none());
        assert_eq!(s.data.unwrap()["a"].0, b"b");
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
    }

    #[test]
    fn config_keys() {
        assert!(key_errors("app.properties").is_empty());
        assert!(!key_errors("a/b").is_empty());
        assert!(!key_errors("..").is_empty());
    }

    #[test]
    fn immutable_configmaps_stay_put() {
        let old: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "immutable": true, "data": {"a": "1"}})).unwrap();
        let mut new = old.clone();
        new.data = Some([("a".to_string(), "2".to_string())].into());
        assert_eq!(ConfigMaps.validate_update(&new, &old).len(), 1);
    }
}
