use serde_json::{Value, json};

use super::*;
use crate::registry::patch::{METADATA_MERGE_KEYS, merge, primitive};

const KEYS: &[MergeKey] = &[merge("spec.containers", "name"), merge("spec.containers.ports", "containerPort")];

fn schema() -> Schema<'static> {
    Schema::new(KEYS)
}

fn writer(manager: &str) -> Writer<'_> {
    Writer { manager, api_version: "v1", subresource: "", has_status: true }
}

fn pod(image: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "uid": "u", "labels": {"app": "web"}, "finalizers": ["a.io/x"]},
        "spec": {"containers": [{"name": "c", "image": image, "ports": [{"containerPort": 80}]}]},
        "status": {"phase": "Pending"},
    })
}

/// The fields of `entries` that `manager` owns, as fieldsV1.
fn owned(entries: &[Entry], manager: &str) -> Value {
    entries.iter().find(|e| e.manager == manager).map(|e| e.fields.to_fields_v1()).unwrap_or(Value::Null)
}

#[test]
fn fields_v1_reads_and_writes_upstream_documents_unchanged() {
    let doc = json!({
        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}},
    });
    let set = FieldSet::from_fields_v1(&doc);
    assert_eq!(set.to_fields_v1(), doc);
    assert_eq!(
        set.paths(),
        [
            ".metadata.labels",
            ".metadata.labels.app",
            ".spec.containers[name=\"c\"]",
            ".spec.containers[name=\"c\"].image",
            ".spec.containers[name=\"c\"].name"
        ]
    );
}

#[test]
fn a_create_gives_its_manager_every_field_but_server_metadata_and_status() {
    let mut entries = Vec::new();
    let cmp = Schema::new(&[merge("spec.containers", "name"), primitive("metadata.finalizers")])
        .compare(&json!({}), &pod("a"));
    update(&mut entries, cmp, &writer("kubectl-create"), "2026-12-07T08:00:00Z");
    assert_eq!(
        owned(&entries, "kubectl-create"),
        json!({
            "f:metadata": {"f:finalizers": {".": {}, "v:\"a.io/x\"": {}}, "f:labels": {".": {}, "f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}, "f:ports": {}}}},
        })
    );
    assert_eq!(entries[0].time.as_deref(), Some("2026-12-07T08:00:00Z"));
}

#[test]
fn an_update_takes_the_fields_it_changes_and_leaves_the_time_of_a_no_op() {
    let s = schema();
    let mut entries = Vec::new();
    update(&mut entries, s.compare(&json!({}), &pod("a")), &writer("one"), "t1");
    update(&mut entries, s.compare(&pod("a"), &pod("b")), &writer("two"), "t2");
    let c = "k:{\"name\":\"c\"}";
    assert_eq!(owned(&entries, "two"), json!({"f:spec": {"f:containers": {c: {"f:image": {}}}}}));
    assert!(owned(&entries, "one")["f:spec"]["f:containers"][c].get("f:image").is_none());
    update(&mut entries, s.compare(&pod("b"), &pod("b")), &writer("two"), "t3");
    assert_eq!(entries.iter().find(|e| e.manager == "two").and_then(|e| e.time.as_deref()), Some("t2"));
}

#[test]
fn ports_are_keyed_by_port_and_protocol_with_tcp_as_the_default() {
    let set = schema().fields_of(&pod("a")).expect("fields");
    let ports = &set.to_fields_v1()["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:ports"];
    assert_eq!(ports, &json!({"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}));
}

#[test]
fn an_applied_list_item_without_its_key_or_twice_is_refused() {
    let no_name = json!({"spec": {"containers": [{"image": "x"}]}});
    let err = schema().fields_of(&no_name).expect_err("no key");
    assert!(err.message.contains("omits key field \"name\""), "{}", err.message);
    let twice = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    let err = schema().fields_of(&twice).expect_err("duplicate");
    assert!(err.message.contains("duplicate entries for key"), "{}", err.message);
}

#[test]
fn an_apply_conflicts_with_another_owner_unless_forced() {
    let s = schema();
    let mut entries = Vec::new();
    update(&mut entries, s.compare(&json!({}), &pod("a")), &writer("kubectl-client-side-apply"), "t1");
    let config = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "b"}]}});
    let applied = s.fields_of(&config).expect("fields");
    let merged = s.merge(&pod("a"), &config);
    let cmp = s.compare(&pod("a"), &merged);
    let err = apply(&mut entries.clone(), &cmp, &applied, &writer("kubectl"), false, "t2").expect_err("conflict");
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using v1: .spec.containers[name=\"c\"].image"
    );
    let cause = &err.details.as_ref().expect("details").causes[0];
    assert_eq!(cause.reason, "FieldManagerConflict");
    assert_eq!(cause.field, ".spec.containers[name=\"c\"].image");

    apply(&mut entries, &cmp, &applied, &writer("kubectl"), true, "t2").expect("forced");
    let c = "k:{\"name\":\"c\"}";
    assert_eq!(
        owned(&entries, "kubectl"),
        json!({"f:spec": {"f:containers": {c: {".": {}, "f:image": {}, "f:name": {}}}}})
    );
    assert!(owned(&entries, "kubectl-client-side-apply")["f:spec"]["f:containers"][c].get("f:image").is_none());
}

#[test]
fn appliers_setting_the_same_value_share_the_field() {
    let s = Schema::new(METADATA_MERGE_KEYS);
    let cm = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": v}});
    let mut entries = Vec::new();
    let applied = s.fields_of(&cm("1")).expect("fields");
    apply(&mut entries, &s.compare(&json!({}), &cm("1")), &applied, &writer("a"), false, "t1").expect("first");
    apply(&mut entries, &s.compare(&cm("1"), &cm("1")), &applied, &writer("b"), false, "t2").expect("same value");
    assert_eq!(owned(&entries, "a"), json!({"f:data": {"f:k": {}}}));
    assert_eq!(owned(&entries, "b"), json!({"f:data": {"f:k": {}}}));
    let err = apply(&mut entries, &s.compare(&cm("1"), &cm("2")), &applied, &writer("b"), false, "t3")
        .expect_err("a still owns it");
    assert!(err.message.contains("conflict with \"a\": .data.k"), "{}", err.message);
}

#[test]
fn fields_an_applier_drops_are_removed_unless_someone_else_owns_them() {
    let s = Schema::new(METADATA_MERGE_KEYS);
    let first = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2", "c": "3"}});
    let mut entries = Vec::new();
    let applied = s.fields_of(&first).expect("fields");
    apply(&mut entries, &s.compare(&json!({}), &first), &applied, &writer("me"), false, "t1").expect("apply");
    // Someone else takes over c by an update.
    let mut edited = first.clone();
    edited["data"]["c"] = json!("30");
    update(&mut entries, s.compare(&first, &edited), &writer("kubectl-edit"), "t2");

    let second = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
    let applied = s.fields_of(&second).expect("fields");
    let gone = to_remove(&entries, &writer("me"), &applied);
    assert_eq!(gone.paths(), [".data.b"]);
    let mut next = s.merge(&edited, &second);
    s.remove(&mut next, &gone);
    assert_eq!(next["data"], json!({"a": "1", "c": "30"}));
    apply(&mut entries, &s.compare(&edited, &next), &applied, &writer("me"), false, "t3").expect("apply");
    assert_eq!(owned(&entries, "me"), json!({"f:data": {"f:a": {}}}));
}

#[test]
fn applied_list_items_merge_by_key_and_dropped_ones_go() {
    let s = schema();
    let live = pod("a");
    let config = json!({"spec": {"containers": [{"name": "d", "image": "x"}]}});
    let merged = s.merge(&live, &config);
    let names: Vec<&str> =
        merged["spec"]["containers"].as_array().expect("list").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["c", "d"]);
    let mut gone = FieldSet::default();
    gone.children
        .entry("f:spec".into())
        .or_default()
        .children
        .entry("f:containers".into())
        .or_default()
        .children
        .insert("k:{\"name\":\"c\"}".into(), FieldSet::leaf());
    let mut pruned = merged.clone();
    s.remove(&mut pruned, &gone);
    assert_eq!(pruned["spec"]["containers"], json!([{"name": "d", "image": "x"}]));
}

#[test]
fn status_belongs_to_the_status_subresource() {
    let s = schema();
    let mut entries = Vec::new();
    let mut running = pod("a");
    running["status"]["phase"] = json!("Running");
    let kubelet = Writer { manager: "kubelet", api_version: "v1", subresource: "status", has_status: true };
    update(&mut entries, s.compare(&pod("a"), &running), &kubelet, "t1");
    assert_eq!(owned(&entries, "kubelet"), json!({"f:status": {"f:phase": {}}}));
    assert_eq!(encode(&mut entries)[0]["subresource"], "status");
}

#[test]
fn more_than_ten_updaters_fold_the_oldest_into_ancient_changes() {
    let s = Schema::new(METADATA_MERGE_KEYS);
    let mut entries = Vec::new();
    let mut old = json!({"data": {}});
    for i in 0..12 {
        let mut new = old.clone();
        new["data"][format!("k{i}")] = json!("v");
        update(&mut entries, s.compare(&old, &new), &writer(&format!("m{i}")), &format!("t{i:02}"));
        old = new;
    }
    assert_eq!(entries.len(), 10);
    let ancient = entries.iter().find(|e| e.manager == "ancient-changes").expect("ancient-changes");
    assert_eq!(ancient.fields.to_fields_v1(), json!({"f:data": {"f:k0": {}, "f:k1": {}, "f:k2": {}}}));
}
