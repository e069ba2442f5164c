//! The authorizers and NodeRestriction through the real router, with typed clients acting as a
//! node, as a node's controllers and as an admin.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{AppState, Tokens, User, router};
use crate::registry::Registry;
use crate::store::{self, Store};

struct Cluster {
    _dir: tempfile::TempDir,
    router: axum::Router,
}

impl Cluster {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            Store::open(dir.path(), store::Options { cache_bytes: 1 << 20, history: 1000, ..Default::default() })
                .expect("store");
        let registry = Registry::new(store);
        crate::registry::bootstrap::system_namespaces(&registry).await.expect("namespaces");
        crate::registry::service_account_admission::default_accounts(&registry).await;
        let state = Arc::new(AppState::new(registry, Tokens::default(), "127.0.0.1:6443".into()));
        Cluster { _dir: dir, router: router(state) }
    }

    fn client(&self, name: &str, groups: &[&str]) -> Client {
        let user = User::new(name, groups.iter().map(|g| g.to_string()).collect());
        crate::client::in_process(self.router.clone(), user)
    }

    fn admin(&self) -> Client {
        self.client("admin", &["system:masters"])
    }

    fn node(&self, name: &str) -> Client {
        self.client(&format!("system:node:{name}"), &["system:nodes"])
    }
}

/// The message of a refusal, which must be a 403.
fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

async fn node(admin: &Client, name: &str) -> Node {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Node>::all(admin.clone()).create(&PostParams::default(), &node).await.expect("node")
}

async fn pod_on(admin: &Client, name: &str, node: &str, secret: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
            "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), "default").create(&PostParams::default(), &pod).await.expect("pod");
}

async fn secret(admin: &Client, name: &str) {
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), "default").create(&PostParams::default(), &s).await.expect("secret");
}

#[tokio::test]
async fn a_node_reads_only_its_own_node_and_what_its_pods_refer_to() {
    let c = Cluster::new().await;
    let admin = c.admin();
    node(&admin, "n1").await;
    node(&admin, "n2").await;
    for s in ["s1", "s2"] {
        secret(&admin, s).await;
    }
    pod_on(&admin, "p1", "n1", "s1").await;
    pod_on(&admin, "p2", "n2", "s2").await;
    let n1 = c.node("n1");

    let nodes = Api::<Node>::all(n1.clone());
    nodes.get("n1").await.expect("its own Node");
    assert_eq!(
        forbidden(nodes.get("n2").await),
        "nodes \"n2\" is forbidden: User \"system:node:n1\" cannot get resource \"nodes\" in API group \"\" at the \
         cluster scope: node 'n1' cannot read 'n2', only its own Node object"
    );
    assert!(
        forbidden(nodes.list(&ListParams::default()).await)
            .ends_with("cannot read all nodes, only its own Node object")
    );
    nodes.list(&ListParams::default().fields("metadata.name=n1")).await.expect("a list of its own Node");

    let secrets = Api::<Secret>::namespaced(n1.clone(), "default");
    secrets.get("s1").await.expect("a Secret its pod refers to");
    assert_eq!(
        forbidden(secrets.get("s2").await),
        "secrets \"s2\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in \
         the namespace \"default\": no relationship found between node 'n1' and this object"
    );
    assert!(forbidden(secrets.list(&ListParams::default()).await).ends_with(": No Object name found"));
    secrets.list(&ListParams::default().fields("metadata.name=s1")).await.expect("a single-object list");

    let pods = Api::<Pod>::namespaced(n1.clone(), "default");
    pods.get("p1").await.expect("its pod");
    assert!(forbidden(pods.get("p2").await).ends_with("no relationship found between node 'n1' and this object"));
    let all = Api::<Pod>::all(n1.clone());
    assert!(
        forbidden(all.list(&ListParams::default()).await)
            .ends_with("can only list/watch pods with spec.nodeName field selector")
    );
    let mine = all.list(&ListParams::default().fields("spec.nodeName=n1")).await.expect("its pods");
    assert_eq!(mine.items.len(), 1);

    // Not in the node rules at all.
    let services = Api::<Service>::namespaced(n1.clone(), "default");
    services.list(&ListParams::default()).await.expect("services, for pod environments");
    assert_eq!(
        forbidden(services.delete("kubernetes", &Default::default()).await),
        "services \"kubernetes\" is forbidden: User \"system:node:n1\" cannot delete resource \"services\" in API group \
         \"\" in the namespace \"default\""
    );
}

#[tokio::test]
async fn node_restriction_keeps_a_node_to_its_own_writes() {
    let c = Cluster::new().await;
    let admin = c.admin();
    let own = node(&admin, "n1").await;
    node(&admin, "n2").await;
    secret(&admin, "s1").await;
    pod_on(&admin, "p2", "n2", "s1").await;
    let n1 = c.node("n1");
    let pods = Api::<Pod>::namespaced(n1.clone(), "default");

    let plain: Pod = serde_json::from_value(json!({"metadata": {"name": "x"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    assert!(forbidden(pods.create(&PostParams::default(), &plain).await).ends_with(
        "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods"
    ));
    let mirror = |node: &str, uid: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": format!("static-{node}"),
            "annotations": {"kubernetes.io/config.mirror": "h"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid, "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap()
    };
    let uid = own.metadata.uid.clone().unwrap();
    assert!(
        forbidden(pods.create(&PostParams::default(), &mirror("n2", &uid)).await)
            .ends_with("node \"n1\" can only create pods with spec.nodeName set to itself")
    );
    assert!(forbidden(pods.create(&PostParams::default(), &mirror("n1", "other-uid")).await).contains("UID mismatch"));
    pods.create(&PostParams::default(), &mirror("n1", &uid)).await.expect("its mirror pod");

    assert!(
        forbidden(pods.delete("p2", &Default::default()).await)
            .ends_with("node \"n1\" can only delete pods with spec.nodeName set to itself")
    );
    let status = json!({"status": {"phase": "Failed"}});
    assert!(
        forbidden(pods.patch_status("p2", &PatchParams::default(), &Patch::Merge(&status)).await)
            .ends_with("node \"n1\" can only update pod status for pods with spec.nodeName set to itself")
    );

    let nodes = Api::<Node>::all(n1.clone());
    let labels = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "true"}}});
    assert!(
        forbidden(nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&labels)).await)
            .ends_with("is not allowed to modify labels: node-role.kubernetes.io/control-plane")
    );
    let taints = json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
    assert!(
        forbidden(nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&taints)).await)
            .ends_with("node \"n1\" is not allowed to modify taints")
    );
    assert!(
        forbidden(nodes.patch("n2", &PatchParams::default(), &Patch::Merge(&json!({}))).await)
            .ends_with("node \"n1\" is not allowed to modify node \"n2\"")
    );
    let ok = json!({"metadata": {"labels": {"kubernetes.io/arch": "arm64", "example.com/x": "y"}}});
    nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&ok)).await.expect("kubelet's own labels");

    let leases = Api::<Lease>::namespaced(n1.clone(), "kube-node-lease");
    let lease = |name: &str| -> Lease { serde_json::from_value(json!({"metadata": {"name": name}})).unwrap() };
    leases.create(&PostParams::default(), &lease("n1")).await.expect("its lease");
    assert!(
        forbidden(leases.create(&PostParams::default(), &lease("n2")).await)
            .ends_with("can only access node lease with the same name as the requesting node")
    );
}

#[tokio::test]
async fn a_nodes_controllers_have_their_fixed_rules_and_discovery_is_open() {
    let c = Cluster::new().await;
    let admin = c.admin();
    secret(&admin, "s1").await;
    let controller = c.client(super::CONTROLLER_USER, &[]);
    Api::<Service>::all(controller.clone()).list(&ListParams::default()).await.expect("services");
    Api::<Node>::all(controller.clone()).list(&ListParams::default()).await.expect("nodes");
    assert!(
        forbidden(Api::<Secret>::namespaced(controller.clone(), "default").get("s1").await).starts_with(
            "secrets \"s1\" is forbidden: User \"system:cairn-controller\" cannot get resource \"secrets\""
        )
    );
    let n1 = c.node("n1");
    n1.apiserver_version().await.expect("version");
    let metrics = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let refused = n1.request_text(metrics).await;
    assert_eq!(forbidden(refused), "forbidden: User \"system:node:n1\" cannot get path \"/metrics\"");
}
