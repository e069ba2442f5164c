//! End-to-end: the real `cairn server` driven by the kube-rs client.

mod common;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt};
use http::Request;
use http::header::CONTENT_TYPE;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::core::Status;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use common::Server;

/// Longest any single step may wait on the server.
const STEP: Duration = Duration::from_secs(20);

fn object<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn config_map(name: &str, labels: Value, data: Value) -> ConfigMap {
    object(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
}

fn pod(name: &str) -> Pod {
    object(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
}

fn ready_node(name: &str) -> Node {
    object(json!({
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
}

fn names<K: ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(ResourceExt::name_any).collect()
}

/// The `Status` of a call that must have failed with an API error.
fn api_error<T: Debug>(result: kube::Result<T>) -> Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn assert_status(status: &Status, code: u16, reason: &str) {
    assert_eq!((status.code, status.reason.as_str()), (code, reason), "{status:?}");
}

/// `POST pods/{name}/binding` to `node`.
async fn bind(client: &Client, pod: &str, node: &str) -> kube::Result<String> {
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let request = Request::post(format!("/api/v1/namespaces/default/pods/{pod}/binding"))
        .header(CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&binding).unwrap())
        .unwrap();
    client.request_text(request).await
}

/// A watch event reduced to what the tests compare.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kind: &'static str,
    name: String,
    resource_version: String,
}

impl Seen {
    fn of<K: ResourceExt>(event: WatchEvent<K>) -> Self {
        let (kind, obj) = match event {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(b) => {
                return Seen { kind: "BOOKMARK", name: String::new(), resource_version: b.metadata.resource_version };
            }
            WatchEvent::Error(status) => panic!("the watch failed: {status:?}"),
        };
        Seen { kind, name: obj.name_any(), resource_version: obj.resource_version().unwrap_or_default() }
    }

    fn rv(&self) -> u64 {
        self.resource_version.parse().expect("a numeric resourceVersion")
    }
}

/// Reads a watch until the server ends it (at its `timeoutSeconds`), failing after [`STEP`].
async fn drain<K>(stream: impl Stream<Item = kube::Result<WatchEvent<K>>>) -> Vec<WatchEvent<K>> {
    let events =
        tokio::time::timeout(STEP, stream.collect::<Vec<_>>()).await.expect("the server did not end the watch");
    events.into_iter().map(|e| e.expect("a watch event")).collect()
}

/// The changes a watch delivered, without bookmarks.
fn changes<K: ResourceExt>(events: Vec<WatchEvent<K>>) -> Vec<Seen> {
    events.into_iter().map(Seen::of).filter(|s| s.kind != "BOOKMARK").collect()
}

fn kinds_and_names(seen: &[Seen]) -> Vec<(&str, &str)> {
    seen.iter().map(|s| (s.kind, s.name.as_str())).collect()
}

/// The error a watch from `version` ends with: refused outright, or an ERROR event first thing.
async fn watch_error<K>(api: &Api<K>, wp: &WatchParams, version: &str) -> Status
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let stream = match api.watch(wp, version).await {
        Err(kube::Error::Api(status)) => return *status,
        Err(e) => panic!("the watch failed without a Status: {e}"),
        Ok(stream) => stream,
    };
    let mut stream = Box::pin(stream);
    match tokio::time::timeout(STEP, stream.next()).await.expect("no watch event in time") {
        Some(Ok(WatchEvent::Error(status))) => *status,
        Some(Err(kube::Error::Api(status))) => *status,
        other => panic!("expected the watch to fail, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_from_any_version_and_expires_across_restarts() {
    let server = Server::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let pp = PostParams::default();
    for name in ["a", "b"] {
        cms.create(&pp, &config_map(name, json!({"suite": "watch"}), json!({"v": "1"}))).await.unwrap();
    }
    let selected = ListParams::default().labels("suite=watch");
    let listed = cms.list(&selected).await.unwrap();
    assert_eq!(names(&listed.items), ["a", "b"]);
    let start = listed.metadata.resource_version.clone().expect("a list resourceVersion");

    let wp = WatchParams::default().labels("suite=watch").timeout(3);
    let stream = cms.watch(&wp, &start).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    cms.create(&pp, &config_map("c", json!({"suite": "watch"}), json!({"v": "1"}))).await.unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    // A change outside the selector is not delivered.
    cms.create(&pp, &config_map("other", json!({"suite": "elsewhere"}), json!({}))).await.unwrap();

    let seen = changes(drain(stream).await);
    assert_eq!(kinds_and_names(&seen), [("MODIFIED", "a"), ("ADDED", "c"), ("DELETED", "b")]);
    let start_rv: u64 = start.parse().unwrap();
    assert!(seen[0].rv() > start_rv, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].rv() < w[1].rv()), "versions must increase: {seen:?}");

    // Resuming from the first change yields exactly the later ones.
    let resumed = changes(drain(cms.watch(&wp, &seen[0].resource_version).await.unwrap()).await);
    assert_eq!(resumed, seen[1..]);
    // Resuming from the last change yields nothing.
    let caught_up = changes(drain(cms.watch(&wp, &seen[2].resource_version).await.unwrap()).await);
    assert!(caught_up.is_empty(), "{caught_up:?}");

    // The event history does not survive a restart: versions from before it are expired.
    let dir = server.kill9();
    let server = Server::start_with(dir, &[]);
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    for old in [start.as_str(), "1", seen[0].resource_version.as_str()] {
        let status = watch_error(&cms, &wp, old).await;
        assert_status(&status, 410, "Expired");
    }
    // A fresh list gives a version to watch from again.
    let fresh = cms.list(&selected).await.unwrap();
    assert_eq!(names(&fresh.items), ["a", "c"]);
    let stream = cms.watch(&wp, fresh.metadata.resource_version.as_deref().unwrap()).await.unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(kinds_and_names(&changes(drain(stream).await)), [("DELETED", "a")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_sends_initial_events_then_a_bookmark() {
    let server = Server::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let pp = PostParams::default();
    for name in ["x", "y", "z"] {
        cms.create(&pp, &config_map(name, json!({"suite": "initial"}), json!({"name": name}))).await.unwrap();
    }
    let listed = cms.list(&ListParams::default().labels("suite=initial")).await.unwrap();
    let listed_rv: u64 = listed.metadata.resource_version.unwrap().parse().unwrap();

    let wp = WatchParams::default().labels("suite=initial").initial_events().timeout(3);
    let stream = cms.watch(&wp, "").await.unwrap();
    cms.create(&pp, &config_map("later", json!({"suite": "initial"}), json!({}))).await.unwrap();
    let events = drain(stream).await;

    let bookmarks: Vec<usize> =
        events.iter().enumerate().filter(|(_, e)| matches!(e, WatchEvent::Bookmark(_))).map(|(i, _)| i).collect();
    assert!(!bookmarks.is_empty(), "no bookmark in {events:?}");
    let end = bookmarks[0];
    let WatchEvent::Bookmark(bookmark) = &events[end] else { unreachable!() };
    assert_eq!(
        bookmark.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str),
        Some("true"),
        "the first bookmark must mark the end of the initial events"
    );
    let bookmark_rv: u64 = bookmark.metadata.resource_version.parse().unwrap();
    assert!(bookmark_rv >= listed_rv, "bookmark {bookmark_rv} is older than the list at {listed_rv}");

    let seen: Vec<Seen> = events.into_iter().map(Seen::of).collect();
    assert_eq!(kinds_and_names(&seen[..end]), [("ADDED", "x"), ("ADDED", "y"), ("ADDED", "z")]);
    assert!(seen[..end].iter().all(|s| s.rv() <= bookmark_rv), "{seen:?}");
    let live: Vec<&Seen> = seen[end + 1..].iter().filter(|s| s.kind != "BOOKMARK").collect();
    assert_eq!(live.len(), 1, "{seen:?}");
    assert_eq!((live[0].kind, live[0].name.as_str()), ("ADDED", "later"));
    assert!(live[0].rv() > bookmark_rv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_replace_is_a_conflict() {
    let server = Server::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let pp = PostParams::default();
    let created = cms.create(&pp, &config_map("cfg", json!({}), json!({"v": "1"}))).await.unwrap();
    let updated = cms.patch("cfg", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    assert_ne!(created.resource_version(), updated.resource_version());

    let mut stale = created.clone();
    stale.data = Some([("v".to_string(), "3".to_string())].into());
    let status = api_error(cms.replace("cfg", &pp, &stale).await);
    assert_status(&status, 409, "Conflict");
    let current = cms.get("cfg").await.unwrap();
    assert_eq!(current.data.as_ref().unwrap()["v"], "2");
    assert_eq!(current.resource_version(), updated.resource_version());

    // The same change on the current version goes through.
    let mut fresh = current;
    fresh.data = Some([("v".to_string(), "3".to_string())].into());
    let replaced = cms.replace("cfg", &pp, &fresh).await.unwrap();
    assert_eq!(replaced.data.as_ref().unwrap()["v"], "3");
    let version = |cm: &ConfigMap| -> u64 { cm.resource_version().unwrap().parse().unwrap() };
    assert!(version(&replaced) > version(&updated));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_strategic_and_json_patches() {
    let server = Server::start();
    let client = server.client().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let initial: Pod = object(json!({
        "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}},
        "spec": {"containers": [
            {"name": "app", "image": "busybox:1.36", "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "busybox:1.36"},
        ]},
    }));
    pods.create(&PostParams::default(), &initial).await.unwrap();
    let pp = PatchParams::default();

    // Strategic merge: containers merge by name, the other fields and containers stay.
    let strategic = json!({"spec": {"containers": [{"name": "app", "image": "busybox:1.37"}]}});
    let p = pods.patch("web", &pp, &Patch::Strategic(strategic)).await.unwrap();
    let containers = &p.spec.as_ref().unwrap().containers;
    assert_eq!(names_of_containers(containers), ["app", "sidecar"]);
    assert_eq!(containers[0].image.as_deref(), Some("busybox:1.37"));
    assert_eq!(containers[0].env.as_ref().map(Vec::len), Some(1), "the strategic merge dropped env");
    assert_eq!(containers[1].image.as_deref(), Some("busybox:1.36"));
    assert_eq!(p.metadata.generation, Some(2));

    // JSON merge patch: null removes a key.
    let merge = json!({"metadata": {"labels": {"tier": null, "patched": "merge"}}});
    let p = pods.patch("web", &pp, &Patch::Merge(merge)).await.unwrap();
    let labels: Vec<(&str, &str)> = p.labels().iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, [("app", "web"), ("patched", "merge")]);
    assert_eq!(p.metadata.generation, Some(2), "a metadata change must not bump the generation");

    // JSON patch, sent as application/json-patch+json.
    let json_patch = json!([
        {"op": "test", "path": "/spec/containers/1/name", "value": "sidecar"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "busybox:1.38"},
        {"op": "add", "path": "/metadata/annotations", "value": {"note": "json"}},
    ]);
    let p: Pod = client.request(json_patch_request("web", &json_patch)).await.unwrap();
    assert_eq!(p.spec.as_ref().unwrap().containers[1].image.as_deref(), Some("busybox:1.38"));
    assert_eq!(p.annotations().get("note").map(String::as_str), Some("json"));
    assert_eq!(p.metadata.generation, Some(3));

    // A failing `test` operation changes nothing.
    let failing = json!([
        {"op": "test", "path": "/spec/containers/1/name", "value": "not-the-sidecar"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "busybox:9"},
    ]);
    let status = api_error(client.request::<Pod>(json_patch_request("web", &failing)).await);
    assert!((400..500).contains(&status.code), "{status:?}");
    let after = pods.get("web").await.unwrap();
    assert_eq!(after.resource_version(), p.resource_version());
    assert_eq!(after.spec.unwrap().containers[1].image.as_deref(), Some("busybox:1.38"));
}

fn names_of_containers(containers: &[k8s_openapi::api::core::v1::Container]) -> Vec<&str> {
    containers.iter().map(|c| c.name.as_str()).collect()
}

fn json_patch_request(pod: &str, patch: &Value) -> Request<Vec<u8>> {
    Request::patch(format!("/api/v1/namespaces/default/pods/{pod}"))
        .header(CONTENT_TYPE, "application/json-patch+json")
        .body(serde_json::to_vec(patch).unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_pod_deletion_and_preconditions() {
    let server = Server::start();
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    nodes.create(&PostParams::default(), &ready_node("n1")).await.unwrap();
    // Bound by hand only: the scheduler would try too, and could record its failure at any time.
    let mut web = pod("web");
    web.spec.as_mut().unwrap().scheduler_name = Some("by-hand".into());
    let created = pods.create(&PostParams::default(), &web).await.unwrap();
    bind(&client, "web", "n1").await.unwrap();

    // A pod on a live node is only marked: the node has 30 seconds to stop it.
    let deleted = pods.delete("web", &DeleteParams::default()).await.unwrap();
    let marked = deleted.left().expect("the pod, still present");
    assert!(marked.metadata.deletion_timestamp.is_some(), "{marked:?}");
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    let still = pods.get("web").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(still.metadata.deletion_grace_period_seconds, Some(30));

    // A precondition on another uid is refused and changes nothing.
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_status(&api_error(pods.delete("web", &wrong).await), 409, "Conflict");
    assert_eq!(pods.get("web").await.unwrap().resource_version(), still.resource_version());

    // Grace period 0 with the right uid removes it at once.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: created.uid(), resource_version: None }),
        ..Default::default()
    };
    pods.delete("web", &now).await.unwrap();
    assert_status(&api_error(pods.get("web").await), 404, "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_twice_is_a_conflict() {
    let server = Server::start();
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for n in ["n1", "n2"] {
        nodes.create(&PostParams::default(), &ready_node(n)).await.unwrap();
    }
    pods.create(&PostParams::default(), &pod("web")).await.unwrap();
    // The nodes report no room, so the scheduler finds the pod unschedulable: wait for its verdict,
    // or its status write could land after the binding below.
    for _ in 0..200 {
        let p = pods.get("web").await.unwrap();
        let conditions = p.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let answer: Value = serde_json::from_str(&bind(&client, "web", "n1").await.unwrap()).unwrap();
    assert_eq!((answer["kind"].as_str(), answer["status"].as_str()), (Some("Status"), Some("Success")), "{answer}");
    let bound = pods.get("web").await.unwrap();
    assert_eq!(bound.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    let conditions = bound.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    assert!(conditions.iter().any(|c| c.type_ == "PodScheduled" && c.status == "True"), "{conditions:?}");

    for node in ["n1", "n2"] {
        let status = api_error(bind(&client, "web", node).await);
        assert_status(&status, 409, "Conflict");
        assert!(status.message.contains("already assigned"), "{status:?}");
    }
    let after = pods.get("web").await.unwrap();
    assert_eq!(after.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(after.metadata.resource_version, bound.metadata.resource_version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_stores_nothing_and_generate_name_adds_a_suffix() {
    let server = Server::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    let dry = PostParams { dry_run: true, ..Default::default() };

    let answered = cms.create(&dry, &config_map("dry", json!({}), json!({"a": "b"}))).await.unwrap();
    assert_eq!(answered.name_any(), "dry");
    assert_eq!(answered.data.unwrap()["a"], "b");
    assert!(answered.metadata.uid.is_some() && answered.metadata.creation_timestamp.is_some());
    assert_status(&api_error(cms.get("dry").await), 404, "NotFound");

    let generated: ConfigMap = object(json!({"metadata": {"generateName": "gen-"}, "data": {"k": "v"}}));
    let dry_generated = cms.create(&dry, &generated).await.unwrap();
    assert!(dry_generated.name_any().starts_with("gen-"), "{}", dry_generated.name_any());
    assert_status(&api_error(cms.get(&dry_generated.name_any()).await), 404, "NotFound");

    let mut made = BTreeSet::new();
    for _ in 0..3 {
        let cm = cms.create(&PostParams::default(), &generated).await.unwrap();
        let name = cm.name_any();
        assert!(name.starts_with("gen-") && name.len() > "gen-".len(), "{name}");
        assert_eq!(cm.metadata.generate_name.as_deref(), Some("gen-"));
        made.insert(name);
    }
    assert_eq!(made.len(), 3, "generated names must differ: {made:?}");

    let stored: BTreeSet<String> = names(&cms.list(&ListParams::default()).await.unwrap().items).into_iter().collect();
    assert!(made.is_subset(&stored), "{made:?} not all in {stored:?}");
    assert!(!stored.contains("dry") && !stored.contains(&dry_generated.name_any()), "{stored:?}");
}

/// Lists every page of `lp` with `limit`, failing on a repeated name.
async fn list_in_pages<K>(api: &Api<K>, lp: &ListParams, limit: u32) -> Vec<String>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..1000 {
        let mut params = lp.clone().limit(limit);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = api.list(&params).await.unwrap();
        assert!(page.items.len() <= limit as usize, "a page holds more than the limit");
        all.extend(names(&page.items));
        token = page.metadata.continue_.filter(|c| !c.is_empty());
        if token.is_none() {
            let unique: BTreeSet<&String> = all.iter().collect();
            assert_eq!(unique.len(), all.len(), "a name was listed twice: {all:?}");
            return all;
        }
    }
    panic!("the list did not end after 1000 pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_and_label_selectors() {
    let server = Server::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client().await);
    // (name, tier, special)
    let model: Vec<(String, Option<&str>, bool)> = (0..23)
        .map(|i| {
            let tier = if i % 4 == 0 { None } else { Some(["a", "b", "c"][i % 3]) };
            (format!("cm-{i:02}"), tier, i % 5 == 0)
        })
        .collect();
    for (name, tier, special) in &model {
        let mut labels = json!({"suite": "pages"});
        if let Some(t) = tier {
            labels["tier"] = json!(t);
        }
        if *special {
            labels["special"] = json!("yes");
        }
        cms.create(&PostParams::default(), &config_map(name, labels, json!({"name": name}))).await.unwrap();
    }
    let every: Vec<String> = model.iter().map(|(n, _, _)| n.clone()).collect();

    // Unfiltered pages match the unpaged list exactly.
    let unpaged = names(&cms.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(list_in_pages(&cms, &ListParams::default(), 4).await, unpaged);
    let suite = ListParams::default().labels("suite=pages");
    assert_eq!(list_in_pages(&cms, &suite, 5).await, every);
    assert_eq!(list_in_pages(&cms, &suite, 1).await, every);
    let first = cms.list(&suite.clone().limit(5)).await.unwrap();
    assert_eq!(first.items.len(), 5);
    assert!(first.metadata.continue_.is_some());

    let expect = |keep: &dyn Fn(Option<&str>, bool) -> bool| -> Vec<String> {
        model.iter().filter(|(_, t, s)| keep(*t, *s)).map(|(n, _, _)| n.clone()).collect()
    };
    let cases: [(&str, Vec<String>); 5] = [
        ("suite=pages,tier in (a,b)", expect(&|t, _| matches!(t, Some("a" | "b")))),
        ("suite=pages,tier notin (a)", expect(&|t, _| t != Some("a"))),
        ("suite=pages,!special", expect(&|_, s| !s)),
        ("suite=pages,special", expect(&|_, s| s)),
        ("suite=pages,!tier", expect(&|t, _| t.is_none())),
    ];
    for (selector, wanted) in cases {
        assert!(!wanted.is_empty() && wanted.len() < every.len(), "{selector} selects too much or nothing");
        let lp = ListParams::default().labels(selector);
        assert_eq!(names(&cms.list(&lp).await.unwrap().items), wanted, "{selector}");
        assert_eq!(list_in_pages(&cms, &lp, 2).await, wanted, "{selector}, paged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_field_selectors() {
    let server = Server::start();
    let client = server.client().await;
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &ready_node("n1")).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for name in ["p1", "p2", "p3"] {
        pods.create(&PostParams::default(), &pod(name)).await.unwrap();
    }
    bind(&client, "p1", "n1").await.unwrap();
    let running = json!({"status": {"phase": "Running"}});
    pods.patch_status("p2", &PatchParams::default(), &Patch::Merge(running)).await.unwrap();

    let cases: [(&str, &[&str]); 5] = [
        ("spec.nodeName=", &["p2", "p3"]),
        ("spec.nodeName=n1", &["p1"]),
        ("status.phase=Pending", &["p1", "p3"]),
        ("status.phase!=Pending", &["p2"]),
        ("status.phase=Pending,spec.nodeName=", &["p3"]),
    ];
    for (selector, wanted) in cases {
        let listed = pods.list(&ListParams::default().fields(selector)).await.unwrap();
        assert_eq!(names(&listed.items), wanted, "{selector}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_served_by_both_apis() {
    let server = Server::start();
    let client = server.client().await;
    let core: Api<CoreEvent> = Api::default_namespaced(client.clone());
    let new: Api<Event> = Api::default_namespaced(client.clone());
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let now_secs = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);

    let scheduled: CoreEvent = object(json!({
        "metadata": {"name": "web.scheduled"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Scheduled",
        "message": "Successfully assigned default/web to n1",
        "type": "Normal",
        "source": {"component": "default-scheduler"},
        "firstTimestamp": now_secs,
        "lastTimestamp": now_secs,
        "count": 1,
    }));
    let created = core.create(&PostParams::default(), &scheduled).await.unwrap();
    let seen = new.get("web.scheduled").await.unwrap();
    assert_eq!(seen.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("web"));
    assert_eq!(seen.note.as_deref(), Some("Successfully assigned default/web to n1"));
    assert_eq!(seen.reason.as_deref(), Some("Scheduled"));
    assert_eq!(seen.deprecated_count, Some(1));
    assert_eq!(seen.metadata.uid, created.metadata.uid);
    assert_eq!(seen.metadata.resource_version, created.metadata.resource_version);

    let pulled: Event = object(json!({
        "metadata": {"name": "db.pulled"},
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "db", "namespace": "default"},
        "reason": "Pulled",
        "note": "Container image pulled",
        "type": "Normal",
        "eventTime": now,
        "action": "Pull",
        "reportingController": "cairn.io/kubelet",
        "reportingInstance": "n1",
    }));
    let created = new.create(&PostParams::default(), &pulled).await.unwrap();
    let seen = core.get("db.pulled").await.unwrap();
    assert_eq!(seen.involved_object.name.as_deref(), Some("db"));
    assert_eq!(seen.message.as_deref(), Some("Container image pulled"));
    assert_eq!(seen.reporting_component.as_deref(), Some("cairn.io/kubelet"));
    assert_eq!(seen.metadata.uid, created.metadata.uid);

    let by_name = |n: &str| ListParams::default().fields(&format!("involvedObject.name={n}"));
    assert_eq!(names(&core.list(&by_name("web")).await.unwrap().items), ["web.scheduled"]);
    assert_eq!(names(&core.list(&by_name("db")).await.unwrap().items), ["db.pulled"]);
    assert_eq!(names(&core.list(&by_name("nobody")).await.unwrap().items), Vec::<String>::new());
    let regarding = ListParams::default().fields("regarding.name=web");
    assert_eq!(names(&new.list(&regarding).await.unwrap().items), ["web.scheduled"]);
    let all_core = names(&core.list(&ListParams::default()).await.unwrap().items);
    let all_new = names(&new.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(all_core, ["db.pulled", "web.scheduled"]);
    assert_eq!(all_core, all_new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_requests_see_only_health_and_version() {
    let server = Server::start();
    let mut config = server.kube_config().await;
    config.auth_info = Default::default();
    let anonymous = Client::try_from(config).unwrap();

    let get = |path: &str| Request::get(path).body(Vec::new()).unwrap();
    for path in ["/api/v1/pods", "/api/v1/namespaces/default/configmaps", "/apis/events.k8s.io/v1/events"] {
        let status = api_error(anonymous.request_text(get(path)).await);
        assert_status(&status, 401, "Unauthorized");
    }
    assert_eq!(anonymous.request_text(get("/healthz")).await.unwrap(), "ok");
    let version: Value = anonymous.request(get("/version")).await.unwrap();
    assert!(version["gitVersion"].as_str().is_some_and(|v| v.starts_with("v1.37.0")), "{version}");

    // The same paths work with the admin credentials.
    let admin = server.client().await;
    let pods: Value = admin.request(get("/api/v1/pods")).await.unwrap();
    assert_eq!(pods["kind"], "PodList");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_is_served_as_protobuf_with_an_etag() {
    let server = Server::start();
    let client = server.client().await;
    let get = |accept: &str, etag: Option<&str>| {
        let mut req = Request::get("/openapi/v2").header(http::header::ACCEPT, accept);
        if let Some(etag) = etag {
            req = req.header(http::header::IF_NONE_MATCH, etag);
        }
        req.body(Vec::new()).unwrap()
    };
    // kubectl asks under the deprecated name and is answered under the current one.
    let proto = client
        .send(get("application/com.github.proto-openapi.spec.v2@v1.0+protobuf", None).map(kube::client::Body::from))
        .await
        .unwrap();
    assert_eq!(proto.status(), 200);
    assert_eq!(proto.headers()[CONTENT_TYPE], "application/com.github.proto-openapi.spec.v2.v1.0+protobuf");
    let etag = proto.headers()[http::header::ETAG].to_str().unwrap().to_string();
    let body = http_body_util::BodyExt::collect(proto.into_body()).await.unwrap().to_bytes();
    // Field 1 of gnostic's Document, the Swagger version "2.0", then the definitions the kinds need.
    assert_eq!(&body[..5], b"\x0a\x032.0");
    assert!(body.windows(22).any(|w| w == b"io.k8s.api.core.v1.Pod"));

    let again = client
        .send(
            get("application/com.github.proto-openapi.spec.v2.v1.0+protobuf", Some(&etag))
                .map(kube::client::Body::from),
        )
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    let json = client.send(get("application/json", None).map(kube::client::Body::from)).await.unwrap();
    assert_eq!(json.headers()[CONTENT_TYPE], "application/json");
    assert_ne!(json.headers()[http::header::ETAG].to_str().unwrap(), etag);
    let html = client.send(get("text/html", None).map(kube::client::Body::from)).await.unwrap();
    assert_eq!(html.status(), 406);

    // Each OpenAPI v3 document too, in gnostic's openapi.v3 messages.
    let v3 = Request::get("/openapi/v3/api/v1")
        .header(http::header::ACCEPT, "application/com.github.proto-openapi.spec.v3@v1.0+protobuf")
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    let v3 = client.send(v3).await.unwrap();
    assert_eq!(v3.headers()[CONTENT_TYPE], "application/com.github.proto-openapi.spec.v3.v1.0+protobuf");
    let body = http_body_util::BodyExt::collect(v3.into_body()).await.unwrap().to_bytes();
    assert_eq!(&body[..7], b"\x0a\x053.0.0");
    assert!(body.windows(28).any(|w| w == b"io.k8s.api.core.v1.ConfigMap"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_through_kube_rs() {
    let server = Server::start();
    let client = server.client().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let config =
        |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data});

    // An apply creates the object, owned by its manager.
    let made =
        cms.patch("ssa", &PatchParams::apply("operator"), &Patch::Apply(config(json!({"a": "1"})))).await.unwrap();
    let managers: Vec<(String, String)> = made
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone().unwrap_or_default(), m.operation.clone().unwrap_or_default()))
        .collect();
    assert_eq!(managers, [("operator".to_string(), "Apply".to_string())]);
    // A body naming another object, and an apply without a manager, are refused.
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "elsewhere"}});
    let status = api_error(cms.patch("ssa", &PatchParams::apply("operator"), &Patch::Apply(other)).await);
    assert_status(&status, 400, "BadRequest");
    assert!(status.message.contains("does not match the name on the URL"), "{}", status.message);
    let raw = Request::patch("/api/v1/namespaces/default/configmaps/ssa")
        .header(CONTENT_TYPE, "application/apply-patch+yaml")
        .body(config(json!({"a": "2"})).to_string().into_bytes())
        .unwrap();
    let status = api_error(client.request_text(raw).await);
    assert_status(&status, 422, "Invalid");
    assert!(status.message.contains("fieldManager: Required value: is required for apply patch"), "{}", status.message);
    // Applying the status of a pod that does not exist is a 404, and creates nothing.
    let status_config =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ghost"}, "status": {"phase": "Running"}});
    let status =
        api_error(pods.patch_status("ghost", &PatchParams::apply("operator"), &Patch::Apply(status_config)).await);
    assert_status(&status, 404, "NotFound");
    assert!(pods.get_opt("ghost").await.unwrap().is_none());
}
