use serde_json::json;

use super::*;

fn deployment(replicas: i32, surge: serde_json::Value, unavailable: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default", "uid": "d1", "generation": 1},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "a"}]}}}}))
    .unwrap()
}

fn set(name: &str, replicas: i32, available: i32, created: &str) -> ReplicaSet {
    serde_json::from_value(json!({"metadata": {"name": name, "uid": name, "creationTimestamp": created},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"replicas": replicas, "readyReplicas": available, "availableReplicas": available}}))
    .unwrap()
}

#[test]
fn surge_rounds_up_and_unavailable_down() {
    let d = deployment(10, json!("25%"), json!("25%"));
    assert_eq!((max_surge(&d), max_unavailable(&d)), (3, 2));
    let d = deployment(1, json!(0), json!(0));
    assert_eq!((max_surge(&d), max_unavailable(&d)), (0, 1), "both zero means one unavailable");
    let d = deployment(3, json!("100%"), json!(5));
    assert_eq!((max_surge(&d), max_unavailable(&d)), (3, 3), "unavailable is capped at replicas");
}

#[test]
fn a_rollout_of_ten_starts_as_upstreams_trace() {
    // 10 replicas, 25%/25%: the new set goes to 3 while the old keeps 10 (13 at most).
    let d = deployment(10, json!("25%"), json!("25%"));
    let old = set("old", 10, 10, "2026-01-01T00:00:00Z");
    let new = set("new", 0, 0, "2026-01-01T01:00:00Z");
    let sets = Sets { new: Some(new.clone()), old: vec![old] };
    assert_eq!(new_set_replicas(&d, &sets, &new), 3);
    // Then the old set may lose 13 - 8 - 3 = 2.
    let new = set("new", 3, 0, "2026-01-01T01:00:00Z");
    let sets = Sets { new: Some(new.clone()), old: vec![set("old", 10, 10, "2026-01-01T00:00:00Z")] };
    let min_available = replicas(&d) - max_unavailable(&d);
    let unavailable_new = rs_replicas(&new) - rs_status(&new).2;
    assert_eq!(sets.spec_total() - min_available - unavailable_new, 2);
    assert_eq!(new_set_replicas(&d, &sets, &new), 3, "no room to surge further");
}

#[test]
fn scaling_mid_rollout_is_proportional() {
    // Scaled from 10 (max 13) to 20 (max 25) while the sets hold 8 and 5.
    let d = deployment(20, json!("25%"), json!("25%"));
    let mut a = set("a", 8, 8, "2026-01-01T00:00:00Z");
    let mut b = set("b", 5, 5, "2026-01-01T01:00:00Z");
    for rs in [&mut a, &mut b] {
        rs.metadata.annotations = Some([(MAX_REPLICAS.to_string(), "13".to_string())].into());
    }
    let to_add = 20 + max_surge(&d) - 13;
    assert_eq!(to_add, 12);
    let pa = proportion(&d, &a, to_add, 0);
    let pb = proportion(&d, &b, to_add, pa);
    assert_eq!((pa, pb), (7, 5), "8*25/13 = 15 (+7) and 5*25/13 = 10 (+5)");
}

#[test]
fn the_template_hash_ignores_the_hash_label_and_is_stable() {
    let d = deployment(1, json!(1), json!(0));
    let h = template_hash(&d.spec.template, None);
    assert_eq!(h, template_hash(&d.spec.template, None));
    assert_ne!(h, template_hash(&d.spec.template, Some(1)), "a collision count changes the hash");
    assert!(h.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    let mut labelled = d.spec.template.clone();
    labelled.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert(HASH_LABEL.into(), h);
    assert!(equal_ignore_hash(&labelled, &d.spec.template));
    let mut zeros = d.spec.template.clone();
    zeros.metadata.as_mut().unwrap().generation = Some(0);
    zeros.spec.as_mut().unwrap().containers[0].stdin = Some(false);
    assert!(equal_ignore_hash(&zeros, &d.spec.template), "Go's zero values equal absent fields");
    let mut other = d.spec.template.clone();
    other.spec.as_mut().unwrap().containers[0].image = Some("b".into());
    assert!(!equal_ignore_hash(&other, &d.spec.template));
}

#[test]
fn revisions_move_to_the_history_on_rollback() {
    let d = deployment(1, json!(1), json!(0));
    let mut rs = set("a", 1, 1, "2026-01-01T00:00:00Z");
    rs.metadata.annotations = Some([(REVISION.to_string(), "1".to_string())].into());
    assert!(new_set_annotations(&d, &mut rs, "3", true));
    assert_eq!(rs.annotations().get(REVISION).map(String::as_str), Some("3"));
    assert_eq!(rs.annotations().get(REVISION_HISTORY).map(String::as_str), Some("1"));
    assert!(!new_set_annotations(&d, &mut rs, "3", true), "nothing changes twice");
}

#[test]
fn conditions_keep_their_transition_time_while_the_status_holds() {
    let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    let mut s = DeploymentStatus::default();
    set_condition(&mut s, new_condition("Available", "False", "MinimumReplicasUnavailable", "x".into(), t0));
    set_condition(&mut s, new_condition("Available", "False", "MinimumReplicasUnavailable", "x".into(), t1));
    assert_eq!(
        condition(&s, "Available").unwrap().last_update_time,
        Some(Time(t0)),
        "same status and reason: unchanged"
    );
    set_condition(&mut s, new_condition("Available", "True", "MinimumReplicasAvailable", "y".into(), t1));
    assert_eq!(condition(&s, "Available").unwrap().last_transition_time, Some(Time(t1)));
}
