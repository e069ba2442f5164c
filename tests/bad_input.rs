//! End-to-end: hand-built bad requests against the real `cairn server`. Each gets a `Status` with the
//! right code and reason, and stores nothing.

mod common;

use std::time::{Duration, Instant};

use http::Request;
use http_body_util::BodyExt as _;
use kube::Client;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use common::Server;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";
const JSON: (&str, &str) = ("content-type", "application/json");
const YAML: (&str, &str) = ("content-type", "application/yaml");

/// Sends one request and returns the HTTP status and the body, parsed as JSON when it is JSON.
async fn call(client: &Client, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, Value) {
    let mut request = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(kube::client::Body::from(body)).expect("a valid request");
    let response = tokio::time::timeout(Duration::from_secs(30), client.send(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer in 30s"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let code = response.status().as_u16();
    let bytes = response.into_body().collect().await.expect("the response body").to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (code, body)
}

/// Why an answer is not the failure `Status` with `code` and `reason`, if it is not.
fn status_mismatch(answer: &(u16, Value), code: u16, reason: &str) -> Option<String> {
    let (http, body) = answer;
    let ok = *http == code
        && body["kind"] == "Status"
        && body["apiVersion"] == "v1"
        && body["status"] == "Failure"
        && body["code"] == code
        && body["reason"] == reason
        && body["message"].as_str().is_some_and(|m| !m.is_empty());
    (!ok).then(|| format!("wanted {code} {reason}, got HTTP {http}: {body}"))
}

#[track_caller]
fn assert_status(answer: &(u16, Value), code: u16, reason: &str) {
    if let Some(why) = status_mismatch(answer, code, reason) {
        panic!("{why}");
    }
}

fn config_map(name: &str) -> Vec<u8> {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}).to_string().into()
}

/// The store's current revision, as a list reports it.
async fn revision(client: &Client) -> u64 {
    let (code, list) = call(client, "GET", CONFIGMAPS, &[], Vec::new()).await;
    assert_eq!(code, 200, "{list}");
    list["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("a list resourceVersion")
}

/// Names of the objects in a namespaced collection.
async fn names(client: &Client, collection: &str) -> Vec<String> {
    let (code, list) = call(client, "GET", collection, &[], Vec::new()).await;
    assert_eq!(code, 200, "{list}");
    list["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_string()).collect()
}

/// The revision once start-up writes (system namespaces, their service accounts) are done and
/// nothing else writes.
async fn quiet_revision(client: &Client) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "the server kept writing for 30s after start-up");
        let (_, accounts) = call(client, "GET", "/api/v1/serviceaccounts", &[], Vec::new()).await;
        let defaults =
            accounts["items"].as_array().map_or(0, |a| a.iter().filter(|i| i["metadata"]["name"] == "default").count());
        let before = revision(client).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if defaults >= 4 && revision(client).await == before {
            return before;
        }
    }
}

/// One bad request and the failure it must get.
struct Case {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    code: u16,
    reason: &'static str,
}

fn case(what: &'static str, method: &'static str, path: &'static str, code: u16, reason: &'static str) -> Case {
    Case { what, method, path, headers: Vec::new(), body: Vec::new(), code, reason }
}

impl Case {
    fn json(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.headers.push(JSON);
        self.body = body.into();
        self
    }

    fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }

    fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_status_and_store_nothing() {
    let server = Server::start();
    let client = server.client().await;
    let (code, cfg) = call(&client, "POST", CONFIGMAPS, &[JSON], config_map("cfg")).await;
    assert_eq!(code, 201, "{cfg}");
    let mut newer = cfg.clone();
    newer["data"]["k"] = json!("v2");
    let (code, updated) = call(&client, "PUT", &format!("{CONFIGMAPS}/cfg"), &[JSON], newer.to_string().into()).await;
    assert_eq!(code, 200, "{updated}");
    let mut stale = cfg.clone();
    stale["data"]["k"] = json!("stale");

    let start = quiet_revision(&client).await;
    let configmaps_before = names(&client, CONFIGMAPS).await;
    let cases = [
        case("malformed JSON", "POST", CONFIGMAPS, 400, "BadRequest")
            .json(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad-json""#),
        case("malformed YAML", "POST", CONFIGMAPS, 400, "BadRequest")
            .header(YAML.0, YAML.1)
            .body("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad-yaml\ndata: [unclosed\n"),
        case("a JSON array", "POST", CONFIGMAPS, 400, "BadRequest")
            .json(format!("[{}]", String::from_utf8(config_map("in-array")).unwrap())),
        case("an empty body", "POST", CONFIGMAPS, 400, "BadRequest").json(""),
        case("the kind of another resource", "POST", CONFIGMAPS, 400, "BadRequest")
            .json(r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"wrong-kind"}}"#),
        case("another apiVersion", "POST", CONFIGMAPS, 400, "BadRequest")
            .json(r#"{"apiVersion":"apps/v1","kind":"ConfigMap","metadata":{"name":"wrong-version"}}"#),
        case(
            "an unknown field with strict validation",
            "POST",
            "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
            400,
            "BadRequest",
        )
        .json(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"strict"},"bogus":1}"#),
        case("an unknown query parameter", "POST", "/api/v1/namespaces/default/configmaps?bogus=1", 400, "BadRequest")
            .json(config_map("unknown-param")),
        case("an invalid dryRun value", "POST", "/api/v1/namespaces/default/configmaps?dryRun=Some", 400, "BadRequest")
            .json(config_map("bad-dry-run")),
        case("a body in an unsupported type", "POST", CONFIGMAPS, 415, "UnsupportedMediaType")
            .header("content-type", "text/plain")
            .body(config_map("text-plain")),
        case(
            "a patch in an unsupported type",
            "PATCH",
            "/api/v1/namespaces/default/configmaps/cfg",
            415,
            "UnsupportedMediaType",
        )
        .header("content-type", "text/plain")
        .body(r#"{"data":{"k":"patched"}}"#),
        case(
            "an update from a stale resourceVersion",
            "PUT",
            "/api/v1/namespaces/default/configmaps/cfg",
            409,
            "Conflict",
        )
        .json(stale.to_string()),
        case("PUT on a collection", "PUT", CONFIGMAPS, 405, "MethodNotAllowed").json(config_map("put-collection")),
        case("POST to a named object", "POST", "/api/v1/namespaces/default/configmaps/cfg", 405, "MethodNotAllowed")
            .json(config_map("cfg")),
        case("Accept: text/html on a create", "POST", CONFIGMAPS, 406, "NotAcceptable")
            .header("accept", "text/html")
            .json(config_map("html")),
        case("Accept: text/html on a list", "GET", CONFIGMAPS, 406, "NotAcceptable").header("accept", "text/html"),
        case("an unknown resource", "GET", "/api/v1/namespaces/default/nosuchthings", 404, "NotFound"),
        case("a create of an unknown resource", "POST", "/api/v1/namespaces/default/nosuchthings", 404, "NotFound")
            .json(config_map("nowhere")),
        case("an unknown group", "GET", "/apis/nosuch.example.com/v1/things", 404, "NotFound"),
        case(
            "a malformed label selector",
            "GET",
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b",
            400,
            "BadRequest",
        ),
        case(
            "an unsupported field selector",
            "GET",
            "/api/v1/namespaces/default/configmaps?fieldSelector=spec.bogus%3D1",
            400,
            "BadRequest",
        ),
        case(
            "a garbage continue token",
            "GET",
            "/api/v1/namespaces/default/configmaps?limit=1&continue=not-a-token!",
            400,
            "BadRequest",
        ),
        case("a non-numeric limit", "GET", "/api/v1/namespaces/default/configmaps?limit=abc", 400, "BadRequest"),
        case(
            "a watch from resourceVersion=abc",
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=abc",
            400,
            "BadRequest",
        ),
        case(
            "a delete with a body of another kind",
            "DELETE",
            "/api/v1/namespaces/default/configmaps/cfg",
            400,
            "BadRequest",
        )
        .json(r#"{"apiVersion":"v1","kind":"ConfigMap"}"#),
    ];

    let mut failures = Vec::new();
    for c in &cases {
        let answer = call(&client, c.method, c.path, &c.headers, c.body.clone()).await;
        if let Some(why) = status_mismatch(&answer, c.code, c.reason) {
            failures.push(format!("{} ({} {}): {why}", c.what, c.method, c.path));
        }
        let now = revision(&client).await;
        if now != start {
            failures.push(format!("{} ({} {}): the revision moved from {start} to {now}", c.what, c.method, c.path));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));

    assert_eq!(names(&client, CONFIGMAPS).await, configmaps_before);
    let (_, current) = call(&client, "GET", &format!("{CONFIGMAPS}/cfg"), &[], Vec::new()).await;
    assert_eq!(current["data"]["k"], "v2");
    assert_eq!(current["metadata"]["resourceVersion"], updated["metadata"]["resourceVersion"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused() {
    let server = Server::start();
    let client = server.client().await;
    let (code, cfg) = call(&client, "POST", CONFIGMAPS, &[JSON], config_map("cfg")).await;
    assert_eq!(code, 201, "{cfg}");
    let start = quiet_revision(&client).await;

    let huge = "x".repeat(3 * 1024 * 1024 + 1024);
    let create = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "huge"}, "data": {"k": huge}});
    let answer = call(&client, "POST", CONFIGMAPS, &[JSON], create.to_string().into()).await;
    assert_status(&answer, 413, "RequestEntityTooLarge");
    let patch = json!({"data": {"k": huge}});
    let merge = ("content-type", "application/merge-patch+json");
    let answer = call(&client, "PATCH", &format!("{CONFIGMAPS}/cfg"), &[merge], patch.to_string().into()).await;
    assert_status(&answer, 413, "RequestEntityTooLarge");

    assert_eq!(revision(&client).await, start);
    assert_eq!(names(&client, CONFIGMAPS).await.iter().filter(|n| *n == "huge").count(), 0);
    // The server still serves normal requests afterwards.
    let (code, body) = call(&client, "POST", CONFIGMAPS, &[JSON], config_map("small")).await;
    assert_eq!(code, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_pods_name_the_bad_fields() {
    let server = Server::start();
    let client = server.client().await;
    let start = quiet_revision(&client).await;

    let no_containers = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {}});
    let no_name = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nameless"},
        "spec": {"containers": [{"image": "busybox"}]}});
    for (pod, name, field) in
        [(no_containers, "empty", "spec.containers"), (no_name, "nameless", "spec.containers[0].name")]
    {
        let answer = call(&client, "POST", PODS, &[JSON], pod.to_string().into()).await;
        assert_status(&answer, 422, "Invalid");
        let details = &answer.1["details"];
        assert_eq!((details["kind"].as_str(), details["name"].as_str()), (Some("Pod"), Some(name)), "{}", answer.1);
        let causes = details["causes"].as_array().cloned().unwrap_or_default();
        assert!(
            causes.iter().any(|c| c["field"] == field && c["reason"] == "FieldValueRequired"),
            "no FieldValueRequired cause for {field}: {}",
            answer.1
        );
    }
    assert_eq!(revision(&client).await, start);
    assert!(names(&client, PODS).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_are_not_found_with_details() {
    let server = Server::start();
    let client = server.client().await;
    let start = quiet_revision(&client).await;
    let cm = "/api/v1/namespaces/default/configmaps/nope";
    let requests = [
        (case("GET a configmap", "GET", cm, 404, "NotFound"), "configmaps"),
        (case("GET a pod", "GET", "/api/v1/namespaces/default/pods/nope", 404, "NotFound"), "pods"),
        (case("DELETE", "DELETE", cm, 404, "NotFound"), "configmaps"),
        (
            case("PATCH", "PATCH", cm, 404, "NotFound")
                .header("content-type", "application/merge-patch+json")
                .body(r#"{"data":{"a":"b"}}"#),
            "configmaps",
        ),
        (case("PUT", "PUT", cm, 404, "NotFound").json(config_map("nope")), "configmaps"),
    ];
    for (c, kind) in requests {
        let answer = call(&client, c.method, c.path, &c.headers, c.body).await;
        assert_status(&answer, c.code, c.reason);
        let details = &answer.1["details"];
        assert_eq!(
            (details["name"].as_str(), details["kind"].as_str()),
            (Some("nope"), Some(kind)),
            "{}: {}",
            c.what,
            answer.1
        );
        assert_eq!(answer.1["message"], format!("{kind} \"nope\" not found"));
    }
    assert_eq!(revision(&client).await, start);
    assert!(!names(&client, CONFIGMAPS).await.contains(&"nope".to_string()));
}

/// Deterministic pseudo-random bytes (xorshift), so a failure can be replayed.
fn junk(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_garbage_does_not_hurt_the_server() {
    let server = Server::start();
    let client = server.client().await;
    let (code, cfg) = call(&client, "POST", CONFIGMAPS, &[JSON], config_map("cfg")).await;
    assert_eq!(code, 201, "{cfg}");
    let start = quiet_revision(&client).await;
    let port: u16 = server.url.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).expect("a port");

    let methods = ["POST", "PUT", "PATCH"];
    let paths = [
        CONFIGMAPS,
        "/api/v1/namespaces/default/configmaps/cfg",
        PODS,
        "/apis/events.k8s.io/v1/namespaces/default/events",
    ];
    let types = [
        "application/json",
        "application/yaml",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/vnd.kubernetes.protobuf",
        "text/plain",
    ];
    let mut tasks = Vec::new();
    for i in 0..50u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            if i % 5 == 0 {
                // Not even TLS: raw bytes on the socket.
                let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
                let _ = tcp.write_all(&junk(i, 4096)).await;
                let _ = tcp.shutdown().await;
                return Ok(());
            }
            let (method, path) = (methods[i as usize % 3], paths[i as usize % 4]);
            let content_type = types[i as usize % types.len()];
            let mut body = junk(i, 64 + (i as usize * 97) % 8192);
            if i % 3 == 0 {
                // Almost JSON: a truncated object with junk inside.
                body = [br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":""#.as_slice(), &body].concat();
            }
            let (code, answer) = call(&client, method, path, &[("content-type", content_type)], body).await;
            if (400..500).contains(&code) && answer["kind"] == "Status" && answer["code"] == code {
                Ok(())
            } else {
                Err(format!("{method} {path} ({content_type}) got HTTP {code}: {answer}"))
            }
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) =
            tokio::time::timeout(Duration::from_secs(60), t).await.expect("a request hung").expect("a task panicked")
        {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "garbage got an answer other than a 4xx Status:\n{}", failures.join("\n"));

    let (code, ready) = call(&client, "GET", "/readyz", &[], Vec::new()).await;
    assert_eq!((code, ready.as_str()), (200, Some("ok")));
    assert_eq!(revision(&client).await, start, "garbage changed the store");
    let (code, body) = call(&client, "POST", CONFIGMAPS, &[JSON], config_map("after")).await;
    assert_eq!(code, 201, "{body}");
    assert!(!server.log().contains("panicked"), "{}", server.log());
}
