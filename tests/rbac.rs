//! End to end: who may do what, with the real kubectl.
//!
//! RBAC: a user made with `cairn kubeconfig`, bound to `view` in one namespace, lists but does not
//! delete there and sees nothing elsewhere; `kubectl auth can-i` and `auth whoami` agree; a
//! ClusterRole labelled to aggregate into `view` widens it; an admin impersonates the user, the user
//! may not impersonate anyone; the bootstrap roles are there; a malformed role is refused with
//! upstream's causes.
//!
//! Tokens, certificates and Pod Security: `kubectl create token` tokens work and stop working when
//! their pod or service account goes; TokenReview and OIDC discovery; a CSR approved with `kubectl
//! certificate approve` becomes a working kubeconfig; `restricted` and `baseline` namespaces refuse
//! and warn with upstream's texts.
//!
//! In the cluster (root, containerd): a busybox pod reads its own namespace's pods through the
//! `kubernetes` Service with its mounted token and is refused another namespace.

mod common;

#[path = "common/busybox.rs"]
mod busybox;
#[allow(dead_code)]
#[path = "../src/runtime/cri.rs"]
mod cri;
#[path = "common/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../src/runtime/oci_image.rs"]
mod oci_image;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{Server, eventually};
use serde_json::Value;

/// kubectl as the user of `kubeconfig`.
fn as_user(kubeconfig: &PathBuf, args: &[&str]) -> Output {
    Command::new(common::kubectl_path()).arg("--kubeconfig").arg(kubeconfig).args(args).output().expect("run kubectl")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn rbac_bindings_decide_what_a_user_may_do() {
    let server = Server::start();
    // A kubeconfig for jane, with a certificate from the cluster CA.
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["kubeconfig", "--user", "jane", "--group", "developers", "--server", &server.url])
        .arg("--data-dir")
        .arg(server.dir.path().join("data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let jane = server.dir.path().join("jane.yaml");
    std::fs::write(&jane, &out.stdout).unwrap();
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["kubeconfig", "--user", "x", "--data-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!elsewhere.status.success() && text(&elsewhere).contains("there is no cluster CA here"));

    // The bootstrap roles and bindings are there.
    let roles = server.ok(&["get", "clusterroles", "-o", "name"]);
    for role in ["cluster-admin", "admin", "edit", "view", "system:discovery", "system:node"] {
        assert!(roles.lines().any(|l| l == format!("clusterrole.rbac.authorization.k8s.io/{role}")), "{roles}");
    }
    let binding = server.ok(&["get", "clusterrolebinding", "cluster-admin", "-o", "wide"]);
    assert!(binding.contains("ClusterRole/cluster-admin") && binding.contains("system:masters"), "{binding}");

    // Nothing yet: upstream's 403.
    server.ok(&["create", "namespace", "team"]);
    server.ok(&["create", "configmap", "settings", "-n", "team", "--from-literal=a=b"]);
    server.ok(&["create", "configmap", "other", "--from-literal=a=b"]);
    let refused = as_user(&jane, &["get", "configmaps", "-n", "team"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains(
            "configmaps is forbidden: User \"jane\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
        "{}",
        text(&refused)
    );
    let whoami = as_user(&jane, &["auth", "whoami"]);
    assert!(whoami.status.success(), "{}", text(&whoami));
    let whoami = text(&whoami);
    assert!(whoami.contains("jane") && whoami.contains("[developers system:authenticated]"), "{whoami}");

    // view in team, bound to the group.
    server.ok(&["create", "rolebinding", "devs-view", "--clusterrole=view", "--group=developers", "-n", "team"]);
    let listed = eventually(30, || {
        let out = as_user(&jane, &["get", "configmaps", "-n", "team", "-o", "name"]);
        out.status.success().then(|| text(&out))
    });
    assert!(listed.contains("configmap/settings"), "{listed}");
    let delete = as_user(&jane, &["delete", "configmap", "settings", "-n", "team"]);
    assert!(!delete.status.success() && text(&delete).contains("cannot delete resource \"configmaps\""));
    assert!(!as_user(&jane, &["get", "configmaps", "-n", "default"]).status.success());
    let can_i = |args: &[&str]| {
        let out = as_user(&jane, &[&["auth", "can-i"][..], args].concat());
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(can_i(&["list", "configmaps", "-n", "team"]), "yes");
    assert_eq!(can_i(&["delete", "configmaps", "-n", "team"]), "no");
    assert_eq!(can_i(&["list", "configmaps", "-n", "default"]), "no");
    assert_eq!(can_i(&["list", "secrets", "-n", "team"]), "no");
    let list = as_user(&jane, &["auth", "can-i", "--list", "-n", "team"]);
    assert!(list.status.success(), "{}", text(&list));
    assert!(
        text(&list).lines().any(|l| l.starts_with("configmaps ") && l.contains("[get list watch]")),
        "{}",
        text(&list)
    );

    // A role labelled to aggregate into view widens it.
    server.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: secrets-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
rules:
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list"]
"#,
    );
    eventually(30, || (can_i(&["list", "secrets", "-n", "team"]) == "yes").then_some(()));
    let view = server.ok(&["get", "clusterrole", "view", "-o", "jsonpath={.rules[*].resources}"]);
    assert!(view.contains("secrets"), "{view}");

    // Impersonation: the admin may, jane may not.
    let as_jane = server.kubectl(&["get", "configmaps", "-n", "team", "--as", "jane", "--as-group", "developers"]);
    assert!(as_jane.status.success(), "{}", text(&as_jane));
    let as_jane = server.kubectl(&["delete", "configmap", "settings", "-n", "team", "--as", "jane"]);
    assert!(text(&as_jane).contains("User \"jane\" cannot delete"), "{}", text(&as_jane));
    let impersonating = as_user(&jane, &["get", "configmaps", "-n", "team", "--as", "admin"]);
    assert!(
        text(&impersonating)
            .contains("users \"admin\" is forbidden: User \"jane\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"),
        "{}",
        text(&impersonating)
    );

    // A role granting what its writer does not hold is refused; bad rules get upstream's causes.
    let escalation = as_user(&jane, &["create", "role", "mine", "-n", "team", "--verb=get", "--resource=pods"]);
    assert!(!escalation.status.success(), "{}", text(&escalation));
    let bad = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: bad, namespace: team}\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: []\n- verbs: [get]\n  nonResourceURLs: [/healthz]\n",
    );
    let bad = text(&bad);
    assert!(bad.contains("rules[0].verbs: Required value: verbs must contain at least one value"), "{bad}");
    assert!(bad.contains("rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs"), "{bad}");
}

/// A kubeconfig for `server` that presents a bearer token.
fn token_kubeconfig(server: &Server, token: &str, path: &Path) -> PathBuf {
    let ca = std::fs::read(server.dir.path().join("data/server/tls/server-ca.crt")).unwrap();
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": server.url, "certificate-authority-data": BASE64.encode(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
    });
    std::fs::write(path, config.to_string()).unwrap();
    path.to_path_buf()
}

/// A client key and a PEM certificate request for `user` in `group`.
fn certificate_request(user: &str, group: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, user);
    params.distinguished_name.push(rcgen::DnType::OrganizationName, group);
    (key.serialize_pem(), params.serialize_request(&key).unwrap().pem().unwrap())
}

fn csr_yaml(name: &str, request: &str) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  request: {}\n  signerName: kubernetes.io/kube-apiserver-client\n  expirationSeconds: 86400\n  usages: [client auth]\n",
        BASE64.encode(request)
    )
}

#[test]
fn tokens_certificates_and_pod_security() {
    let server = Server::start();
    let dir = server.dir.path();
    server.ok(&["create", "namespace", "apps"]);
    eventually(30, || {
        server.kubectl(&["get", "serviceaccount", "default", "-n", "apps"]).status.success().then_some(())
    });
    server.ok(&["create", "serviceaccount", "reader", "-n", "apps"]);
    server.ok(&["create", "role", "pod-reader", "-n", "apps", "--verb=get,list", "--resource=pods"]);
    server.ok(&["create", "rolebinding", "reader", "-n", "apps", "--role=pod-reader", "--serviceaccount=apps:reader"]);
    server.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: holder, namespace: apps}\nspec:\n  serviceAccountName: reader\n  containers: [{name: c, image: busybox}]\n",
    );

    // Admission gave the pod its token volume, mounted in its container; the namespace has its CA.
    let pod: Value = serde_json::from_str(&server.ok(&["get", "pod", "holder", "-n", "apps", "-o", "json"])).unwrap();
    let volume = &pod["spec"]["volumes"][0];
    assert!(volume["name"].as_str().unwrap().starts_with("kube-api-access-"), "{volume}");
    assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"], 3607);
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    let ca = eventually(30, || {
        let out =
            server.kubectl(&["get", "configmap", "kube-root-ca.crt", "-n", "apps", "-o", "jsonpath={.data.ca\\.crt}"]);
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    });
    assert_eq!(ca.trim(), std::fs::read_to_string(dir.join("data/server/tls/server-ca.crt")).unwrap().trim());
    let missing = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: lost, namespace: apps}\nspec:\n  serviceAccountName: ghost\n  containers: [{name: c, image: busybox}]\n",
    );
    assert!(
        text(&missing).contains("pods \"lost\" is forbidden: error looking up service account apps/ghost: serviceaccount \"ghost\" not found"),
        "{}",
        text(&missing)
    );

    // A token bound to the pod works until the pod goes; a plain one until its account goes.
    let bound = server.ok(&[
        "create",
        "token",
        "reader",
        "-n",
        "apps",
        "--duration",
        "10m",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "holder",
    ]);
    let bound = token_kubeconfig(&server, bound.trim(), &dir.join("bound.yaml"));
    let listed = as_user(&bound, &["get", "pods", "-n", "apps", "-o", "name"]);
    assert!(text(&listed).contains("pod/holder"), "{}", text(&listed));
    let whoami = text(&as_user(&bound, &["auth", "whoami", "-o", "json"]));
    assert!(
        whoami.contains("system:serviceaccount:apps:reader")
            && whoami.contains("authentication.kubernetes.io/pod-name"),
        "{whoami}"
    );
    let elsewhere = as_user(&bound, &["get", "pods", "-n", "default"]);
    assert!(
        text(&elsewhere).contains("User \"system:serviceaccount:apps:reader\" cannot list resource \"pods\""),
        "{}",
        text(&elsewhere)
    );
    let short = server.fails(&["create", "token", "reader", "-n", "apps", "--duration", "1m"]);
    assert!(short.contains("may not specify a duration less than 10 minutes"), "{short}");

    // kubectl validates kinds without a PATCH operation against the protobuf OpenAPI v2, which
    // cairn does not serve yet: it is told not to.
    let review = server.ok_stdin(
        &["create", "-f", "-", "-o", "json", "--validate=false"],
        &format!(
            "{{\"apiVersion\": \"authentication.k8s.io/v1\", \"kind\": \"TokenReview\", \"spec\": {{\"token\": {:?}}}}}",
            server.ok(&["create", "token", "reader", "-n", "apps"]).trim()
        ),
    );
    let review: Value = serde_json::from_str(&review).unwrap();
    assert_eq!(review["status"]["authenticated"], true, "{review}");
    assert_eq!(review["status"]["user"]["username"], "system:serviceaccount:apps:reader");
    let forged: Value = serde_json::from_str(&server.ok_stdin(
        &["create", "-f", "-", "-o", "json", "--validate=false"],
        r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "eyJhbGciOiJFUzI1NiJ9.e30.c2ln"}}"#,
    ))
    .unwrap();
    assert_eq!(forged["status"]["authenticated"], false);

    let plain_token = server.ok(&["create", "token", "reader", "-n", "apps", "--duration", "10m"]);
    let plain = token_kubeconfig(&server, plain_token.trim(), &dir.join("plain.yaml"));
    let discovery = text(&as_user(&plain, &["get", "--raw", "/.well-known/openid-configuration"]));
    assert!(discovery.contains("\"issuer\":\"https://kubernetes.default.svc.cluster.local\""), "{discovery}");
    let jwks = text(&as_user(&plain, &["get", "--raw", "/openid/v1/jwks"]));
    assert!(jwks.contains("\"alg\":\"ES256\"") && jwks.contains("\"kty\":\"EC\""), "{jwks}");

    server.ok(&["delete", "pod", "holder", "-n", "apps", "--grace-period=0", "--force"]);
    eventually(30, || {
        let out = as_user(&bound, &["get", "pods", "-n", "apps"]);
        text(&out).contains("Unauthorized").then_some(())
    });
    assert!(as_user(&plain, &["get", "pods", "-n", "apps"]).status.success(), "the unbound token outlives the pod");
    server.ok(&["delete", "serviceaccount", "reader", "-n", "apps"]);
    eventually(30, || text(&as_user(&plain, &["get", "pods", "-n", "apps"])).contains("Unauthorized").then_some(()));
    assert!(!server.log().contains(plain_token.trim()), "no token is ever logged");

    // A long-lived token kept in a Secret: filled in, working, gone with its account.
    server.ok(&["create", "serviceaccount", "builder", "-n", "apps"]);
    let keep = |name: &str, annotation: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: apps{annotation}}}\ntype: kubernetes.io/service-account-token\n"
        )
    };
    let unnamed = server.kubectl_stdin(&["apply", "-f", "-"], &keep("nameless", ""));
    assert!(
        text(&unnamed).contains("metadata.annotations[kubernetes.io/service-account.name]: Required value"),
        "{}",
        text(&unnamed)
    );
    server.ok_stdin(
        &["apply", "-f", "-"],
        &keep("builder-token", ", annotations: {kubernetes.io/service-account.name: builder}"),
    );
    let kept = eventually(30, || {
        let out = server.ok(&["get", "secret", "builder-token", "-n", "apps", "-o", "jsonpath={.data.token}"]);
        (!out.trim().is_empty()).then(|| String::from_utf8(BASE64.decode(out.trim()).unwrap()).unwrap())
    });
    let described = server.ok(&[
        "get",
        "secret",
        "builder-token",
        "-n",
        "apps",
        "-o",
        "jsonpath={.data.namespace} {.metadata.annotations}",
    ]);
    assert!(
        described.starts_with(&BASE64.encode("apps")) && described.contains("kubernetes.io/service-account.uid"),
        "{described}"
    );
    let kept = token_kubeconfig(&server, &kept, &dir.join("kept.yaml"));
    let whoami = text(&as_user(&kept, &["auth", "whoami"]));
    assert!(whoami.contains("system:serviceaccount:apps:builder"), "{whoami}");
    server.ok(&["delete", "serviceaccount", "builder", "-n", "apps"]);
    eventually(30, || {
        server.kubectl(&["get", "secret", "builder-token", "-n", "apps"]).status.success().then_some(()).xor(Some(()))
    });
    eventually(30, || text(&as_user(&kept, &["auth", "whoami"])).contains("Unauthorized").then_some(()));

    // A certificate request, approved, is a working identity.
    let (key, request) = certificate_request("carol", "auditors");
    server.ok_stdin(&["apply", "-f", "-"], &csr_yaml("carol", &request));
    let pending = server.ok(&["get", "csr", "carol"]);
    assert!(
        pending.contains("kubernetes.io/kube-apiserver-client")
            && pending.contains("system:admin")
            && pending.contains("24h")
            && pending.contains("Pending"),
        "{pending}"
    );
    assert!(server.ok(&["certificate", "approve", "carol"]).contains("approved"));
    let cert = eventually(30, || {
        let out = server.ok(&["get", "csr", "carol", "-o", "jsonpath={.status.certificate}"]);
        (!out.trim().is_empty()).then(|| BASE64.decode(out.trim()).unwrap())
    });
    assert!(server.ok(&["get", "csr", "carol"]).contains("Approved,Issued"));
    let ca = std::fs::read(dir.join("data/server/tls/server-ca.crt")).unwrap();
    let carol = dir.join("carol.yaml");
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": server.url, "certificate-authority-data": BASE64.encode(ca)}}],
        "users": [{"name": "u", "user": {"client-certificate-data": BASE64.encode(cert), "client-key-data": BASE64.encode(key)}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
    });
    std::fs::write(&carol, config.to_string()).unwrap();
    let whoami = text(&as_user(&carol, &["auth", "whoami"]));
    assert!(whoami.contains("carol") && whoami.contains("auditors"), "{whoami}");
    let (_, masters) = certificate_request("mallory", "system:masters");
    let refused = server.kubectl_stdin(&["apply", "-f", "-"], &csr_yaml("mallory", &masters));
    assert!(
        text(&refused)
            .contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"),
        "{}",
        text(&refused)
    );
    server.ok_stdin(&["apply", "-f", "-"], &csr_yaml("dave", &certificate_request("dave", "x").1));
    server.ok(&["certificate", "deny", "dave"]);
    assert!(server.ok(&["get", "csr", "dave"]).contains("Denied"));
    let flip = server.kubectl(&["certificate", "approve", "dave"]);
    assert!(!flip.status.success(), "a denied request cannot be approved: {}", text(&flip));

    // Pod Security: restricted refuses, baseline warns, bad labels are refused, existing pods are named.
    server.ok(&["create", "namespace", "locked"]);
    server.ok(&["label", "namespace", "locked", "pod-security.kubernetes.io/enforce=restricted"]);
    let privileged = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: priv, namespace: locked}\nspec:\n  containers: [{name: c, image: busybox, securityContext: {privileged: true}}]\n",
    );
    assert!(!privileged.status.success());
    assert!(
        text(&privileged).contains("pods \"priv\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"c\" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"),
        "{}",
        text(&privileged)
    );
    let compliant = "apiVersion: v1\nkind: Pod\nmetadata: {name: fine, namespace: locked}\nspec:\n  securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}\n  containers: [{name: c, image: busybox, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}]\n";
    server.ok_stdin(&["apply", "-f", "-"], compliant);
    server.ok(&["create", "namespace", "watched"]);
    server.ok(&["label", "namespace", "watched", "pod-security.kubernetes.io/warn=baseline"]);
    let warned = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: net, namespace: watched}\nspec:\n  hostNetwork: true\n  containers: [{name: c, image: busybox}]\n",
    );
    assert!(warned.status.success(), "{}", text(&warned));
    assert!(
        text(&warned)
            .contains("Warning: would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"),
        "{}",
        text(&warned)
    );
    let tightened = server.kubectl(&["label", "namespace", "watched", "pod-security.kubernetes.io/enforce=baseline"]);
    assert!(tightened.status.success(), "{}", text(&tightened));
    assert!(
        text(&tightened).contains(
            "existing pods in namespace \"watched\" violate the new PodSecurity enforce level \"baseline:latest\""
        ),
        "{}",
        text(&tightened)
    );
    assert!(text(&tightened).contains("net: host namespaces"), "{}", text(&tightened));
    let deployment = server.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: watched}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {hostPID: true, containers: [{name: c, image: busybox}]}\n",
    );
    assert!(
        deployment.status.success()
            && text(&deployment)
                .contains("would violate PodSecurity \"baseline:latest\": host namespaces (hostPID=true)"),
        "{}",
        text(&deployment)
    );
    let bad =
        server.fails(&["label", "namespace", "watched", "pod-security.kubernetes.io/enforce=strict", "--overwrite"]);
    assert!(bad.contains("metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"strict\": must be one of privileged, baseline, restricted"), "{bad}");
}

/// The image of the in-cluster client: the real kubectl beside busybox.
const KUBECTL_IMAGE: &str = "docker.io/cairn-test/kubectl:1";

fn kubectl_image() -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static is needed");
    let kubectl = std::fs::read(common::kubectl_path()).expect("kubectl");
    let mut image = oci_image::ImageBuilder::new(KUBECTL_IMAGE)
        .file("/bin/busybox", &busybox, 0o755)
        .file("/bin/kubectl", &kubectl, 0o755)
        .dir("/tmp", 0o1777);
    for applet in ["sh", "sleep", "cat", "ls", "head", "echo"] {
        image = image.symlink(&format!("/bin/{applet}"), "busybox");
    }
    image.env("PATH=/bin").env("HOME=/tmp").cmd(&["/bin/sh"]).oci_layout_tar()
}

#[test]
fn a_pod_talks_to_the_api_with_its_mounted_token() {
    // The API on every address, so that the `kubernetes` Service reaches it from pods.
    let node = node::Node::start_with(
        "10.62.0.0/16",
        &["--disable-kube-proxy=false", "--disable=coredns", "--bind-address", "0.0.0.0"],
    );
    let images = node.dir.path().join("data/agent/images");
    std::fs::write(images.join("kubectl.part"), kubectl_image()).unwrap();
    std::fs::rename(images.join("kubectl.part"), images.join("kubectl.tar")).unwrap();
    eventually(60, || node::node_ready(&node));
    node.ok(&["create", "namespace", "apps"]);
    node.ok(&["create", "namespace", "other"]);
    eventually(30, || node.kubectl(&["get", "serviceaccount", "default", "-n", "apps"]).status.success().then_some(()));
    node.ok(&["create", "serviceaccount", "reader", "-n", "apps"]);
    node.ok(&["create", "role", "pod-reader", "-n", "apps", "--verb=get,list", "--resource=pods"]);
    node.ok(&["create", "rolebinding", "reader", "-n", "apps", "--role=pod-reader", "--serviceaccount=apps:reader"]);
    let pod = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: apps}}\nspec:\n  serviceAccountName: reader\n  terminationGracePeriodSeconds: 0\n{extra}  containers: [{{name: c, image: {KUBECTL_IMAGE}, command: [sleep, '3600']}}]\n"
        )
    };
    node.ok_stdin(&["apply", "-f", "-"], &pod("client", ""));
    node.ok_stdin(&["apply", "-f", "-"], &pod("quiet", "  automountServiceAccountToken: false\n"));
    for name in ["client", "quiet"] {
        node.ok(&["wait", "--for=condition=Ready", &format!("pod/{name}"), "-n", "apps", "--timeout=120s"]);
    }
    let exec = |pod: &str, script: &str| node.kubectl(&["exec", "-n", "apps", pod, "--", "sh", "-c", script]);
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let files = text(&exec("client", &format!("cat {dir}/namespace; echo; cat {dir}/ca.crt; head -c 3 {dir}/token")));
    let ca = std::fs::read_to_string(node.dir.path().join("data/server/tls/server-ca.crt")).unwrap();
    assert!(files.starts_with("apps\n") && files.contains(ca.trim()) && files.trim_end().ends_with("eyJ"), "{files}");

    // kubectl's in-cluster config: $KUBERNETES_SERVICE_HOST, the token and ca.crt, nothing else.
    let mut last = String::new();
    let own = (0..120)
        .find_map(|_| {
            let out = exec("client", "kubectl get pods -o name");
            last = text(&out);
            let done = out.status.success().then(|| last.clone());
            if done.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            done
        })
        .unwrap_or_else(|| {
            panic!("the pod never read its namespace's pods: {last}\n--- server log ---\n{}", node.log())
        });
    assert!(own.contains("pod/client") && own.contains("pod/quiet"), "{own}");
    let whoami = text(&exec("client", "kubectl auth whoami"));
    assert!(whoami.contains("system:serviceaccount:apps:reader") && whoami.contains("client"), "{whoami}");
    let refused = exec("client", "kubectl get pods -n other");
    assert!(
        !refused.status.success()
            && text(&refused).contains("pods is forbidden: User \"system:serviceaccount:apps:reader\" cannot list resource \"pods\" in API group \"\" in the namespace \"other\""),
        "{}",
        text(&refused)
    );
    let none = exec("quiet", &format!("ls {dir}"));
    assert!(!none.status.success(), "automountServiceAccountToken: false mounts nothing: {}", text(&none));
}
