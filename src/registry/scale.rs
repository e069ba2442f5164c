//! The `scale` subresource (upstream's per-kind `ScaleREST`): an `autoscaling/v1` Scale read from a
//! workload (`spec.replicas`, `status.replicas`, the selector as a string), and replaced or patched
//! as a Scale, which writes only the workload's `spec.replicas`, through its main-resource rules.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use super::patch::{self, PatchType};
use super::validation::FieldError;
use super::{Registry, Resource, Result, StatusError, WriteOptions, parse_rv, strategy, to_bytes};

/// The Scale of a workload given as JSON.
fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let selector: Option<LabelSelector> =
        obj["spec"].get("selector").and_then(|s| serde_json::from_value(s.clone()).ok());
    let mut m = serde_json::Map::new();
    for k in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = meta.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": {"replicas": obj["spec"].get("replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": obj["status"].get("replicas").cloned().unwrap_or(json!(0)),
            "selector": crate::labels::format_selector(selector.as_ref()),
        },
    })
}

/// `spec.replicas` of a Scale sent by a client, checked as `ValidateScale`.
fn replicas_of(scale: &Value, name: &str) -> Result<i64> {
    if let Some(kind) = scale.get("kind").and_then(Value::as_str)
        && kind != "Scale"
    {
        return Err(StatusError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind (Scale)"
        )));
    }
    let replicas = scale["spec"].get("replicas").and_then(Value::as_i64).unwrap_or(0);
    if replicas < 0 {
        let e = FieldError::invalid_raw("spec.replicas", replicas, "must be greater than or equal to 0");
        return Err(StatusError::invalid("Scale", "autoscaling", name, &[e]));
    }
    Ok(replicas)
}

fn scaled(mut obj: Value, replicas: i64) -> Value {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    obj["spec"]["replicas"] = json!(replicas);
    obj
}

impl Registry {
    /// GET `.../{name}/scale`.
    pub fn get_scale(&self, r: &Resource, ns: Option<&str>, name: &str) -> Result<bytes::Bytes> {
        to_bytes(&scale_of(&self.get_value(r, ns, name)?))
    }

    /// PUT `.../{name}/scale`: the Scale's resourceVersion, when given, is a precondition.
    pub async fn update_scale(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        scale: Value,
        opts: &WriteOptions,
    ) -> Result<bytes::Bytes> {
        if let Some(n) = strategy::str_at(&scale, &["metadata", "name"])
            && n != name
        {
            return Err(StatusError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        let replicas = replicas_of(&scale, name)?;
        let wanted_rv = parse_rv(strategy::str_at(&scale, &["metadata", "resourceVersion"]).as_deref())?;
        let w = self
            .guaranteed_update(r, ns, name, wanted_rv, None, opts, None, |old| Ok(scaled(old.clone(), replicas)))
            .await?;
        to_bytes(&scale_of(&serde_json::from_slice(&w.object).map_err(StatusError::internal)?))
    }

    /// PATCH `.../{name}/scale`: the patch applies to the Scale.
    pub async fn patch_scale(
        &self,
        r: &Resource,
        ns: Option<&str>,
        name: &str,
        body: &[u8],
        pt: PatchType,
        opts: &WriteOptions,
    ) -> Result<bytes::Bytes> {
        let gr = r.info().group_resource();
        let w = self
            .guaranteed_update(r, ns, name, None, None, opts, None, |current| {
                let before = scale_of(current);
                let patched = patch::apply(&before, body, pt, patch::METADATA_MERGE_KEYS)
                    .map_err(|e| StatusError::bad_request(e.to_string()))?;
                let asked = strategy::str_at(&patched, &["metadata", "resourceVersion"]);
                if asked.is_some() && asked != strategy::str_at(current, &["metadata", "resourceVersion"]) {
                    return Err(StatusError::modified(&gr, name));
                }
                Ok(scaled(current.clone(), replicas_of(&patched, name)?))
            })
            .await?;
        to_bytes(&scale_of(&serde_json::from_slice(&w.object).map_err(StatusError::internal)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_shows_replicas_and_the_selector() {
        let d = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7",
                                    "labels": {"a": "b"}},
                       "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
                       "status": {"replicas": 2}});
        let s = scale_of(&d);
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"], json!({"replicas": 2, "selector": "app=web"}));
        assert_eq!(s["metadata"]["resourceVersion"], "7");
        assert!(s["metadata"].get("labels").is_none());
        assert_eq!(scaled(d, 5)["spec"]["replicas"], 5);
        assert_eq!(replicas_of(&json!({"spec": {"replicas": -1}}), "web").unwrap_err().code, 422);
    }
}
