use super::*;
use serde_json::json;

async fn registry() -> (tempfile::TempDir, Registry) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), store::Options { cache_bytes: 1 << 20, history: 1000, ..Default::default() })
        .expect("store");
    let reg = Registry::new(store);
    crate::registry::bootstrap::system_namespaces(&reg).await.expect("bootstrap");
    crate::registry::service_account_admission::default_accounts(&reg).await;
    (dir, reg)
}

fn res(reg: &Registry, group: &str, plural: &str) -> Resource {
    reg.find(group, "v1", plural).expect("served")
}

fn value(b: &Bytes) -> Value {
    serde_json::from_slice(b).expect("json")
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

#[tokio::test]
async fn create_sets_server_fields_and_defaults() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    let w = reg.create(&pods, Some("default"), pod("a"), &WriteOptions::default()).await.unwrap();
    let v = value(&w.object);
    assert!(w.created);
    assert_eq!(v["metadata"]["namespace"], "default");
    assert!(v["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert_eq!(v["metadata"]["generation"], 1);
    assert_eq!(v["spec"]["schedulerName"], "default-scheduler");
    assert_eq!(v["status"]["phase"], "Pending");
    assert_eq!(v["status"]["qosClass"], "BestEffort");
}

#[tokio::test]
async fn generate_name_and_dry_run() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let body = json!({"metadata": {"generateName": "cfg-"}, "data": {"a": "b"}});
    let w = reg.create(&cms, Some("default"), body.clone(), &WriteOptions::default()).await.unwrap();
    let name = value(&w.object)["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("cfg-") && name.len() == 9, "{name}");
    let dry = WriteOptions { dry_run: true, ..Default::default() };
    let before = reg.store().revision();
    reg.create(&cms, Some("default"), json!({"metadata": {"name": "dry"}}), &dry).await.unwrap();
    assert_eq!(reg.store().revision(), before);
    assert_eq!(reg.get(&cms, Some("default"), "dry").unwrap_err().code, 404);
}

#[tokio::test]
async fn wrong_kind_unknown_fields_and_invalid_names() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let wrong = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}});
    assert_eq!(reg.create(&cms, Some("default"), wrong, &WriteOptions::default()).await.unwrap_err().code, 400);
    let strict = WriteOptions { field_validation: FieldValidation::Strict, ..Default::default() };
    let extra = json!({"metadata": {"name": "x"}, "bogus": 1});
    let e = reg.create(&cms, Some("default"), extra.clone(), &strict).await.unwrap_err();
    assert_eq!(e.code, 400);
    assert!(e.message.contains("unknown field \"bogus\""), "{}", e.message);
    let w = reg.create(&cms, Some("default"), extra, &WriteOptions::default()).await.unwrap();
    assert_eq!(w.warnings, vec!["unknown field \"bogus\"".to_string()]);
    let bad = json!({"metadata": {"name": "Not_Valid"}});
    let e = reg.create(&cms, Some("default"), bad, &WriteOptions::default()).await.unwrap_err();
    assert_eq!(e.code, 422);
    assert_eq!(e.details.unwrap().causes[0].field, "metadata.name");
}

#[tokio::test]
async fn namespace_must_exist() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let e =
        reg.create(&cms, Some("nope"), json!({"metadata": {"name": "x"}}), &WriteOptions::default()).await.unwrap_err();
    assert_eq!((e.code, e.message.as_str()), (404, "namespaces \"nope\" not found"));
}

#[tokio::test]
async fn stale_update_conflicts_and_noop_update_keeps_revision() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let w = reg
        .create(&cms, Some("default"), json!({"metadata": {"name": "c"}, "data": {"a": "1"}}), &WriteOptions::default())
        .await
        .unwrap();
    let first = value(&w.object);
    let mut change = first.clone();
    change["data"]["a"] = json!("2");
    let w2 = reg.update(&cms, Some("default"), "c", change.clone(), None, &WriteOptions::default()).await.unwrap();
    // Same body again carries the old resourceVersion: 409.
    let e = reg.update(&cms, Some("default"), "c", change, None, &WriteOptions::default()).await.unwrap_err();
    assert_eq!(e.code, 409);
    assert!(e.message.contains("the object has been modified"));
    let current = value(&w2.object);
    let rv = reg.store().revision();
    reg.update(&cms, Some("default"), "c", current, None, &WriteOptions::default()).await.unwrap();
    assert_eq!(reg.store().revision(), rv, "a no-op update must not write");
}

#[tokio::test]
async fn generation_follows_spec_only() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    reg.create(&pods, Some("default"), pod("g"), &WriteOptions::default()).await.unwrap();
    let label = br#"{"metadata":{"labels":{"x":"y"}}}"#;
    let w =
        reg.patch(&pods, Some("default"), "g", label, PatchType::Merge, None, &WriteOptions::default()).await.unwrap();
    assert_eq!(value(&w.object)["metadata"]["generation"], 1);
    let image = br#"{"spec":{"containers":[{"name":"c","image":"busybox:2"}]}}"#;
    let w = reg
        .patch(&pods, Some("default"), "g", image, PatchType::StrategicMerge, None, &WriteOptions::default())
        .await
        .unwrap();
    let v = value(&w.object);
    assert_eq!(v["metadata"]["generation"], 2);
    assert_eq!(v["spec"]["containers"][0]["image"], "busybox:2");
}

#[tokio::test]
async fn status_only_through_status() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    let w = reg.create(&pods, Some("default"), pod("s"), &WriteOptions::default()).await.unwrap();
    let mut v = value(&w.object);
    v["status"]["phase"] = json!("Running");
    let w = reg.update(&pods, Some("default"), "s", v.clone(), None, &WriteOptions::default()).await.unwrap();
    assert_eq!(value(&w.object)["status"]["phase"], "Pending");
    let w =
        reg.update(&pods, Some("default"), "s", v, Some(Subresource::Status), &WriteOptions::default()).await.unwrap();
    assert_eq!(value(&w.object)["status"]["phase"], "Running");
}

#[tokio::test]
async fn binding_once() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    reg.create(&pods, Some("default"), pod("b"), &WriteOptions::default()).await.unwrap();
    let binding = json!({"metadata": {"name": "b"}, "target": {"kind": "Node", "name": "n1"}});
    reg.bind("default", "b", &binding).await.unwrap();
    let v = value(&reg.get(&pods, Some("default"), "b").unwrap());
    assert_eq!(v["spec"]["nodeName"], "n1");
    assert_eq!(v["status"]["conditions"][0]["type"], "PodScheduled");
    let e = reg.bind("default", "b", &binding).await.unwrap_err();
    assert_eq!(e.code, 409);
}

#[tokio::test]
async fn bound_pod_deletes_gracefully_unbound_at_once() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    let nodes = res(&reg, "", "nodes");
    reg.create(&nodes, None, json!({"metadata": {"name": "n1"}}), &WriteOptions::default()).await.unwrap();
    reg.create(&pods, Some("default"), pod("u"), &WriteOptions::default()).await.unwrap();
    assert!(matches!(
        reg.delete(&pods, Some("default"), "u", &DeleteOptions::default()).await.unwrap(),
        Deleted::Gone(_)
    ));

    reg.create(&pods, Some("default"), pod("p"), &WriteOptions::default()).await.unwrap();
    reg.bind("default", "p", &json!({"target": {"name": "n1"}})).await.unwrap();
    let Deleted::Pending(b) = reg.delete(&pods, Some("default"), "p", &DeleteOptions::default()).await.unwrap() else {
        panic!("a bound pod must wait for its node");
    };
    let v = value(&b);
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    // The node confirms with grace 0 and a uid precondition.
    let uid = v["metadata"]["uid"].as_str().unwrap().to_string();
    let wrong = DeleteOptions { grace_period_seconds: Some(0), uid: Some("other".into()), ..Default::default() };
    assert_eq!(reg.delete(&pods, Some("default"), "p", &wrong).await.unwrap_err().code, 409);
    let ok = DeleteOptions { grace_period_seconds: Some(0), uid: Some(uid), ..Default::default() };
    assert!(matches!(reg.delete(&pods, Some("default"), "p", &ok).await.unwrap(), Deleted::Gone(_)));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let body = json!({"metadata": {"name": "f", "finalizers": ["example.com/hold"]}});
    reg.create(&cms, Some("default"), body, &WriteOptions::default()).await.unwrap();
    assert!(matches!(
        reg.delete(&cms, Some("default"), "f", &DeleteOptions::default()).await.unwrap(),
        Deleted::Pending(_)
    ));
    let add = br#"{"metadata":{"finalizers":["example.com/hold","example.com/more"]}}"#;
    assert_eq!(
        reg.patch(&cms, Some("default"), "f", add, PatchType::Merge, None, &WriteOptions::default())
            .await
            .unwrap_err()
            .code,
        422
    );
    let clear = br#"{"metadata":{"finalizers":null}}"#;
    reg.patch(&cms, Some("default"), "f", clear, PatchType::Merge, None, &WriteOptions::default()).await.unwrap();
    assert_eq!(reg.get(&cms, Some("default"), "f").unwrap_err().code, 404);
}

#[tokio::test]
async fn selectors_and_pagination() {
    let (_d, reg) = registry().await;
    let pods = res(&reg, "", "pods");
    for i in 0..5 {
        let mut p = pod(&format!("p{i}"));
        p["metadata"]["labels"]["tier"] = json!(if i % 2 == 0 { "even" } else { "odd" });
        reg.create(&pods, Some("default"), p, &WriteOptions::default()).await.unwrap();
    }
    let labels = LabelSelector::parse("tier in (even),app=web").unwrap();
    let page = reg.list(&pods, Some("default"), &ListOptions { labels, ..Default::default() }).unwrap();
    assert_eq!(page.items.len(), 3);
    let fields = FieldSelector::parse("metadata.name=p3").unwrap();
    let page = reg.list(&pods, None, &ListOptions { fields, ..Default::default() }).unwrap();
    assert_eq!(page.items.len(), 1);
    let bad = FieldSelector::parse("spec.bogus=1").unwrap();
    assert_eq!(reg.list(&pods, None, &ListOptions { fields: bad, ..Default::default() }).unwrap_err().code, 400);

    let first = reg.list(&pods, Some("default"), &ListOptions { limit: Some(2), ..Default::default() }).unwrap();
    assert_eq!((first.items.len(), first.remaining), (2, Some(3)));
    let token = first.continue_token.expect("more pages");
    let rest = ListOptions { limit: Some(10), continue_token: Some(token), ..Default::default() };
    let second = reg.list(&pods, Some("default"), &rest).unwrap();
    assert_eq!(second.items.len(), 3);
    assert!(second.continue_token.is_none());
}

#[tokio::test]
async fn watch_translates_selector_transitions() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let opts = WatchOptions { labels: LabelSelector::parse("watched=yes").unwrap(), ..Default::default() };
    let mut w = reg.watch(&cms, Some("default"), opts).unwrap();
    reg.create(
        &cms,
        Some("default"),
        json!({"metadata": {"name": "w", "labels": {"watched": "no"}}}),
        &WriteOptions::default(),
    )
    .await
    .unwrap();
    let on = br#"{"metadata":{"labels":{"watched":"yes"}}}"#;
    reg.patch(&cms, Some("default"), "w", on, PatchType::Merge, None, &WriteOptions::default()).await.unwrap();
    assert!(matches!(w.next().await.unwrap(), WatchItem::Added(_)));
    let off = br#"{"metadata":{"labels":{"watched":"no"}}}"#;
    reg.patch(&cms, Some("default"), "w", off, PatchType::Merge, None, &WriteOptions::default()).await.unwrap();
    assert!(matches!(w.next().await.unwrap(), WatchItem::Deleted(_)));
}

#[tokio::test]
async fn events_are_served_in_both_apis() {
    let (_d, reg) = registry().await;
    let core = res(&reg, "", "events");
    let new = reg.find("events.k8s.io", "v1", "events").unwrap();
    let ev = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Started", "message": "hello", "type": "Normal", "count": 1});
    reg.create(&core, Some("default"), ev, &WriteOptions::default()).await.unwrap();
    let v = value(&reg.get(&new, Some("default"), "e1").unwrap());
    assert_eq!(v["apiVersion"], "events.k8s.io/v1");
    assert_eq!(v["regarding"]["name"], "p");
    assert_eq!(v["note"], "hello");
    let fields = FieldSelector::parse("involvedObject.name=p,reason=Started").unwrap();
    assert_eq!(reg.list(&core, Some("default"), &ListOptions { fields, ..Default::default() }).unwrap().items.len(), 1);
}

#[test]
fn continue_tokens_round_trip_and_reject_garbage() {
    let t = encode_continue(5, "pods/default/a", "pods/default/");
    assert_eq!(decode_continue(&t, "pods/default/").unwrap(), "pods/default/a");
    assert_eq!(decode_continue("!!!", "pods/").unwrap_err().code, 400);
}

#[tokio::test]
async fn a_uid_in_an_update_must_be_the_stored_one() {
    let (_d, reg) = registry().await;
    let cms = res(&reg, "", "configmaps");
    let opts = WriteOptions::default();
    let created = reg.create(&cms, Some("default"), json!({"metadata": {"name": "u"}}), &opts).await.unwrap();
    let uid = value(&created.object)["metadata"]["uid"].as_str().unwrap().to_string();
    let patch = |uid: &str| format!(r#"{{"metadata":{{"uid":"{uid}","labels":{{"a":"b"}}}}}}"#).into_bytes();
    let err = reg.patch(&cms, Some("default"), "u", &patch("other"), PatchType::Merge, None, &opts).await.unwrap_err();
    assert_eq!(err.code, 422);
    assert!(err.message.contains(r#"metadata.uid: Invalid value: "other": field is immutable"#), "{}", err.message);
    let ok = reg.patch(&cms, Some("default"), "u", &patch(&uid), PatchType::Merge, None, &opts).await.unwrap();
    assert_eq!(value(&ok.object)["metadata"]["labels"]["a"], "b");
}

fn claim_body(name: &str, class: Option<&str>) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    if let Some(c) = class {
        v["spec"]["storageClassName"] = json!(c);
    }
    v
}

fn class_body(name: &str, default: bool, expand: bool) -> Value {
    let annotations = if default { json!({"storageclass.kubernetes.io/is-default-class": "true"}) } else { json!({}) };
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations}, "provisioner": "example.com/x",
        "allowVolumeExpansion": expand})
}

#[tokio::test]
async fn storage_kinds_default_protect_and_validate_as_upstream() {
    let (_d, reg) = registry().await;
    let (pvs, pvcs, classes) = (
        res(&reg, "", "persistentvolumes"),
        res(&reg, "", "persistentvolumeclaims"),
        res(&reg, "storage.k8s.io", "storageclasses"),
    );
    let opts = WriteOptions::default();

    let w = reg.create(&classes, None, class_body("plain", false, false), &opts).await.unwrap();
    let sc = value(&w.object);
    assert_eq!((sc["reclaimPolicy"].as_str(), sc["volumeBindingMode"].as_str()), (Some("Delete"), Some("Immediate")));
    let e = reg
        .patch(&classes, None, "plain", br#"{"provisioner":"other.io/y"}"#, PatchType::Merge, None, &opts)
        .await
        .unwrap_err();
    assert!(
        e.message.contains("provisioner: Invalid value") && e.message.contains("field is immutable"),
        "{}",
        e.message
    );

    // No default class yet: the claim keeps no class; then the newest default is assigned.
    let w = reg.create(&pvcs, Some("default"), claim_body("a", None), &opts).await.unwrap();
    assert!(value(&w.object)["spec"].get("storageClassName").is_none());
    reg.create(&classes, None, class_body("older", true, false), &opts).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    reg.create(&classes, None, class_body("newer", true, true), &opts).await.unwrap();
    let w = reg.create(&pvcs, Some("default"), claim_body("b", None), &opts).await.unwrap();
    let claim = value(&w.object);
    assert_eq!(claim["spec"]["storageClassName"], "newer");
    assert_eq!(claim["spec"]["volumeMode"], "Filesystem");
    assert_eq!(claim["status"]["phase"], "Pending");
    assert_eq!(claim["metadata"]["finalizers"], json!(["kubernetes.io/pvc-protection"]));
    let explicit = reg.create(&pvcs, Some("default"), claim_body("c", Some("")), &opts).await.unwrap();
    assert_eq!(value(&explicit.object)["spec"]["storageClassName"], "", "an explicit \"\" is a class");

    // The spec is fixed; an unbound claim may not grow either.
    let grow = br#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#;
    let e = reg.patch(&pvcs, Some("default"), "b", grow, PatchType::Merge, None, &opts).await.unwrap_err();
    assert!(
        e.message.contains("spec: Forbidden: spec is immutable after creation except resources.requests"),
        "{}",
        e.message
    );
    // Bound: growth is the class's to allow.
    let bound = br#"{"status":{"phase":"Bound","capacity":{"storage":"1Gi"}}}"#;
    for name in ["a", "b"] {
        reg.patch(&pvcs, Some("default"), name, bound, PatchType::Merge, Some(Subresource::Status), &opts)
            .await
            .unwrap();
    }
    reg.patch(&pvcs, Some("default"), "b", grow, PatchType::Merge, None, &opts).await.unwrap();
    let e = reg.patch(&pvcs, Some("default"), "a", grow, PatchType::Merge, None, &opts).await.unwrap_err();
    assert_eq!(e.code, 403);
    assert!(e.message.contains("only dynamically provisioned pvc can be resized"), "{}", e.message);
    let shrink = br#"{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}"#;
    let e = reg.patch(&pvcs, Some("default"), "b", shrink, PatchType::Merge, None, &opts).await.unwrap_err();
    assert!(e.message.contains("field can not be less than status.capacity"), "{}", e.message);

    let invalid = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bad"},
        "spec": {"accessModes": ["ReadWriteOnce", "Sometimes"], "capacity": {"storage": "1Gi"},
            "hostPath": {"path": "/a"}, "nfs": {"server": "s", "path": "/p"}}});
    let e = reg.create(&pvs, None, invalid, &opts).await.unwrap_err();
    assert!(e.message.contains(r#"spec.accessModes: Unsupported value: "Sometimes""#), "{}", e.message);
    assert!(e.message.contains("spec.nfs: Forbidden: may not specify more than 1 volume type"), "{}", e.message);
    let none = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bad"},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}});
    let e = reg.create(&pvs, None, none, &opts).await.unwrap_err();
    assert!(e.message.contains("spec: Required value: must specify a volume type"), "{}", e.message);
    let ok = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}, "hostPath": {"path": "/a"}}});
    let pv = value(&reg.create(&pvs, None, ok, &opts).await.unwrap().object);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["status"]["phase"], "Pending");
    assert_eq!(pv["metadata"]["finalizers"], json!(["kubernetes.io/pv-protection"]));
    let e = reg
        .patch(&pvs, None, "pv", br#"{"spec":{"hostPath":{"path":"/b"}}}"#, PatchType::Merge, None, &opts)
        .await
        .unwrap_err();
    assert!(
        e.message.contains(
            "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
        ),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn runtime_classes_validate_and_their_pods_get_overhead_and_scheduling() {
    let (_d, reg) = registry().await;
    let (classes, pods) = (res(&reg, "node.k8s.io", "runtimeclasses"), res(&reg, "", "pods"));
    let opts = WriteOptions::default();
    let class = |name: &str, handler: &str| {
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler,
            "overhead": {"podFixed": {"cpu": "250m", "memory": "64Mi"}},
            "scheduling": {"nodeSelector": {"gpu": "yes"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}})
    };
    let e = reg.create(&classes, None, class("bad", "Not_A_Label"), &opts).await.unwrap_err();
    assert!(
        e.message.contains(r#"handler: Invalid value: "Not_A_Label": a lowercase RFC 1123 label"#),
        "{}",
        e.message
    );
    reg.create(&classes, None, class("nvidia", "nvidia"), &opts).await.unwrap();
    let e =
        reg.patch(&classes, None, "nvidia", br#"{"handler":"runc"}"#, PatchType::Merge, None, &opts).await.unwrap_err();
    assert!(e.message.contains(r#"handler: Invalid value: "runc": field is immutable"#), "{}", e.message);

    let pod = |name: &str, extra: Value| {
        let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    };
    let e =
        reg.create(&pods, Some("default"), pod("p0", json!({"runtimeClassName": "nope"})), &opts).await.unwrap_err();
    assert_eq!(e.code, 403);
    assert_eq!(e.message, r#"pods "p0" is forbidden: pod rejected: RuntimeClass "nope" not found"#);
    let w = reg.create(&pods, Some("default"), pod("p1", json!({"runtimeClassName": "nvidia"})), &opts).await.unwrap();
    let spec = value(&w.object)["spec"].clone();
    assert_eq!(spec["overhead"], json!({"cpu": "250m", "memory": "64Mi"}));
    assert_eq!(spec["nodeSelector"], json!({"gpu": "yes"}));
    assert!(spec["tolerations"].as_array().unwrap().iter().any(|t| t["key"] == "gpu"), "{spec}");
    let conflict = pod("p2", json!({"runtimeClassName": "nvidia", "nodeSelector": {"gpu": "no"}}));
    let e = reg.create(&pods, Some("default"), conflict, &opts).await.unwrap_err();
    assert!(
        e.message
            .ends_with("conflict: runtimeClass.scheduling.nodeSelector[gpu] = yes; pod.spec.nodeSelector[gpu] = no"),
        "{}",
        e.message
    );
    let e = reg.create(&pods, Some("default"), pod("p3", json!({"overhead": {"cpu": "1"}})), &opts).await.unwrap_err();
    assert!(
        e.message.ends_with("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"),
        "{}",
        e.message
    );
    let same = pod("p4", json!({"runtimeClassName": "nvidia", "overhead": {"cpu": "0.25", "memory": "64Mi"}}));
    reg.create(&pods, Some("default"), same, &opts).await.unwrap();
}

#[tokio::test]
async fn priority_classes_validate_and_give_pods_their_priority() {
    let (_d, reg) = registry().await;
    crate::registry::bootstrap::system_priority_classes(&reg).await.unwrap();
    let (classes, pods) = (res(&reg, "scheduling.k8s.io", "priorityclasses"), res(&reg, "", "pods"));
    let opts = WriteOptions::default();
    let class = |name: &str, value: i64, extra: Value| {
        let mut c = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let pod = |name: &str, extra: Value| {
        let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    };
    let message = |e: StatusError| (e.code, e.message);

    // The system classes exist and stay.
    let critical = value(&reg.get(&classes, None, "system-node-critical").unwrap());
    assert_eq!(
        (critical["value"].as_i64(), critical["preemptionPolicy"].as_str()),
        (Some(2_000_001_000), Some("PreemptLowerPriority"))
    );
    let e = reg.delete(&classes, None, "system-cluster-critical", &DeleteOptions::default()).await.unwrap_err();
    assert_eq!(
        message(e),
        (403, r#"priorityclasses.scheduling.k8s.io "system-cluster-critical" is forbidden: this is a system priority class and cannot be deleted"#.into())
    );

    // Validation.
    let e = reg.create(&classes, None, class("huge", 1_000_000_001, json!({})), &opts).await.unwrap_err();
    assert!(
        e.message.contains("value: Forbidden: maximum allowed value of a user defined priority is 1000000000"),
        "{}",
        e.message
    );
    let e = reg.create(&classes, None, class("system-mine", 5, json!({})), &opts).await.unwrap_err();
    assert!(
        e.message.contains("metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority class"),
        "{}",
        e.message
    );
    let e =
        reg.create(&classes, None, class("odd", 5, json!({"preemptionPolicy": "Sometimes"})), &opts).await.unwrap_err();
    assert!(e.message.contains(r#"preemptionPolicy: Unsupported value: "Sometimes""#), "{}", e.message);
    reg.create(&classes, None, class("batch", 100, json!({"preemptionPolicy": "Never"})), &opts).await.unwrap();
    let e = reg.patch(&classes, None, "batch", br#"{"value":200}"#, PatchType::Merge, None, &opts).await.unwrap_err();
    assert!(e.message.contains("value: Forbidden: may not be changed in an update."), "{}", e.message);

    // Pods get their class's priority and policy, and may not ask for others.
    let w = reg.create(&pods, Some("default"), pod("plain", json!({})), &opts).await.unwrap();
    let spec = value(&w.object)["spec"].clone();
    assert_eq!((spec["priority"].as_i64(), spec["preemptionPolicy"].as_str()), (Some(0), Some("PreemptLowerPriority")));
    let w = reg.create(&pods, Some("default"), pod("b", json!({"priorityClassName": "batch"})), &opts).await.unwrap();
    let spec = value(&w.object)["spec"].clone();
    assert_eq!((spec["priority"].as_i64(), spec["preemptionPolicy"].as_str()), (Some(100), Some("Never")));
    let e =
        reg.create(&pods, Some("default"), pod("x", json!({"priorityClassName": "nope"})), &opts).await.unwrap_err();
    assert_eq!(message(e), (403, r#"pods "x" is forbidden: no PriorityClass with name nope was found"#.into()));
    let e = reg
        .create(&pods, Some("default"), pod("y", json!({"priorityClassName": "batch", "priority": 7})), &opts)
        .await
        .unwrap_err();
    assert!(e.message.ends_with("the integer value of priority (7) must not be provided in pod spec; priority admission controller computed 100 from the given PriorityClass name"), "{}", e.message);
    let e = reg
        .create(
            &pods,
            Some("default"),
            pod("z", json!({"priorityClassName": "batch", "preemptionPolicy": "PreemptLowerPriority"})),
            &opts,
        )
        .await
        .unwrap_err();
    assert!(e.message.ends_with("the string value of PreemptionPolicy (PreemptLowerPriority) must not be provided in pod spec; priority admission controller computed Never from the given PriorityClass name"), "{}", e.message);

    // One global default, which pods without a class get.
    reg.create(&classes, None, class("standard", 10, json!({"globalDefault": true})), &opts).await.unwrap();
    let e = reg.create(&classes, None, class("other", 20, json!({"globalDefault": true})), &opts).await.unwrap_err();
    assert_eq!(
        message(e),
        (403, r#"priorityclasses.scheduling.k8s.io "other" is forbidden: PriorityClass standard is already marked as default. Only one default can exist"#.into())
    );
    let w = reg.create(&pods, Some("default"), pod("d", json!({})), &opts).await.unwrap();
    let spec = value(&w.object)["spec"].clone();
    assert_eq!((spec["priorityClassName"].as_str(), spec["priority"].as_i64()), (Some("standard"), Some(10)));
}
