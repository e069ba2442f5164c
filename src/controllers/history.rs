//! ControllerRevisions, the snapshots of a template StatefulSets and DaemonSets roll between
//! (upstream's `pkg/controller/history`): named `<owner>-<hash>` with the hash of their data, a
//! name collision retried with a bumped collision count, kept sorted by revision number.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt as _};
use serde_json::{Value, json};

use super::ownership::controller_ref;
use super::runtime::Error;

/// The label holding a revision's hash (`ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";
/// Names are at most 253 characters; the owner's part is cut to leave room for the hash.
const MAX_PREFIX: usize = 223;
/// Name collisions tried before giving up for this sync.
const MAX_COLLISIONS: i32 = 10;

/// Upstream's `rand.SafeEncodeString` of a number: its decimal digits mapped onto consonants and
/// digits that cannot spell words.
pub fn safe_encode(n: u32) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    n.to_string().bytes().map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char).collect()
}

/// What the revisions of StatefulSets and DaemonSets record (their `getPatch`): a strategic merge
/// patch that puts the pod template back (`kubectl rollout undo` applies it as it is).
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut template = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    template["$patch"] = json!("replace");
    json!({"spec": {"template": template}})
}

/// The pod template a ControllerRevision holds (`ApplyRevision`).
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision.data.0.pointer("/spec/template")?.clone();
    template.as_object_mut()?.remove("$patch");
    serde_json::from_value(template).ok()
}

/// `HashControllerRevision`: FNV-1 (32 bit) of the data, then of the collision count in decimal.
pub fn hash(data: &Value, collisions: i32) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash = hash.wrapping_mul(0x0100_0193);
            hash ^= u32::from(*b);
        }
    };
    feed(&serde_json::to_vec(data).unwrap_or_default());
    if collisions != 0 {
        feed(collisions.to_string().as_bytes());
    }
    safe_encode(hash)
}

/// `ControllerRevisionName`.
pub fn name(prefix: &str, hash: &str) -> String {
    let cut = prefix.char_indices().nth(MAX_PREFIX).map_or(prefix, |(i, _)| &prefix[..i]);
    format!("{cut}-{hash}")
}

/// `NewControllerRevision`: revision `revision` of `owner`, holding `data`, named after `hash`,
/// labelled with `labels`, controlled by `owner`.
pub fn new<O: Resource<DynamicType = ()>>(
    owner: &O,
    labels: BTreeMap<String, String>,
    hash: &str,
    data: Value,
    revision: i64,
) -> ControllerRevision {
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name(&owner.name_any(), hash)),
            namespace: owner.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref(owner)]),
            ..ObjectMeta::default()
        },
        data: RawExtension(data),
        revision: Some(revision),
    }
}

/// `EqualRevision`: the same data (hash labels differing say nothing when data agree).
pub fn equal(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    a.data.0 == b.data.0
}

/// `SortControllerRevisions`: by revision number, then creation time, then name.
pub fn sort(revisions: &mut [ControllerRevision]) {
    revisions.sort_by(|a, b| {
        let created = |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
        a.revision.cmp(&b.revision).then(created(a).cmp(&created(b))).then_with(|| a.name_any().cmp(&b.name_any()))
    });
}

/// One past the highest revision number of the (sorted) `revisions`; 1 for none.
pub fn next(revisions: &[ControllerRevision]) -> i64 {
    revisions.last().map_or(1, |r| r.revision.unwrap_or(0) + 1)
}

/// `CreateControllerRevision`: creates `make(collisions)`; when its name is taken by different
/// data the collision count goes up and `make` is asked again. An identical revision already
/// there (a cache that had not shown it yet) is returned as it is.
pub async fn create(
    api: &Api<ControllerRevision>,
    collisions: &mut i32,
    make: impl Fn(i32) -> ControllerRevision,
) -> Result<ControllerRevision, Error> {
    loop {
        let candidate = make(*collisions);
        match api.create(&PostParams::default(), &candidate).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(&candidate.name_any()).await?;
                if equal(&existing, &candidate) {
                    return Ok(existing);
                }
                *collisions += 1;
                if *collisions > MAX_COLLISIONS {
                    return Err(Error::Failed(format!(
                        "{} name collisions creating ControllerRevision {}",
                        *collisions,
                        candidate.name_any()
                    )));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `UpdateControllerRevision`: gives an existing revision a new revision number (a rollback to it).
pub async fn renumber(
    api: &Api<ControllerRevision>,
    existing: &ControllerRevision,
    revision: i64,
) -> Result<ControllerRevision, Error> {
    if existing.revision == Some(revision) {
        return Ok(existing.clone());
    }
    let patch = json!({"revision": revision, "metadata": {"resourceVersion": existing.resource_version()}});
    Ok(api.patch(&existing.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_a_hash_of_the_data_and_collisions() {
        let data = json!({"spec": {"template": {"$patch": "replace"}}});
        let h = hash(&data, 0);
        assert!(h.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)), "{h}");
        assert_eq!(h, hash(&data, 0), "the hash is stable");
        assert_ne!(h, hash(&data, 1), "a collision gives another name");
        assert_ne!(h, hash(&json!({"spec": {}}), 0));
        let long = "x".repeat(300);
        assert_eq!(name(&long, "abc").len(), MAX_PREFIX + 4);
        assert_eq!(name("web", "abc"), "web-abc");
    }

    #[test]
    fn revisions_sort_by_number_and_the_next_is_one_past_the_last() {
        let rev = |name: &str, n: i64| ControllerRevision {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            data: RawExtension(serde_json::Value::Null),
            revision: Some(n),
        };
        let mut revs = vec![rev("c", 3), rev("a", 1), rev("b", 2)];
        sort(&mut revs);
        assert_eq!(revs.iter().map(|r| r.revision).collect::<Vec<_>>(), [Some(1), Some(2), Some(3)]);
        assert_eq!(next(&revs), 4);
        assert_eq!(next(&[]), 1);
    }
}
