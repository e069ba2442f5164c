//! `POST /v1-cairn/node-certificates`: a joining node's credentials (k3s's `/v1-k3s/client-kubelet.crt`
//! and `serving-kubelet.crt`). The node authenticates with the join token (or, to renew, with its own
//! client certificate), sends certificate requests for keys that never leave it, and gets back its
//! client certificate (`system:node:<name>` in `system:nodes`), its endpoint's serving
//! certificate and its controllers' client certificate (`system:cairn-controller`, as k3s's
//! `client-k3s-controller.crt`), all signed by the cluster CA.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use serde::{Deserialize, Serialize};

use super::{AppState, User, codec};
use crate::net::Cidr;
use crate::registry::StatusError;

/// What every node needs to know of the cluster (k3s's `/v1-k3s/config`): served to joined
/// nodes at `GET /v1-cairn/config`, and kept by them for starting while the server is away.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfig {
    /// `--cluster-cidr`: the pod network (traffic within it is not masqueraded).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Cidr,
    /// `--cluster-dns` and `--cluster-domain`.
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Ipv4Addr,
    pub cluster_domain: String,
    /// Whether nodes run the cluster DNS (`--disable coredns` turns it off).
    pub dns: bool,
    /// Whether nodes run the service proxy (`--disable-kube-proxy` turns it off).
    pub proxy: bool,
    /// `--flannel-backend`: how nodes reach each other's pods (absent from what older servers said).
    #[serde(default)]
    pub flannel_backend: crate::net::routes::Backend,
}

/// `GET /v1-cairn/config`, for any authenticated caller.
pub async fn cluster_config(State(state): State<Arc<AppState>>) -> Response {
    match state.cluster.get() {
        Some(c) => axum::Json(c).into_response(),
        None => codec::error(&StatusError::service_unavailable("the server has not started yet")),
    }
}

/// What a server joining this one (`cairn server --server URL --token T`) learns: where the
/// cluster is kept (k3s's `/v1-k3s/server-bootstrap`). Its CA and keys it then takes from there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerBootstrap {
    /// The etcd endpoints (`--datastore-endpoint`); absent when this server has the embedded store,
    /// which no other server can share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datastore_endpoint: Option<String>,
}

/// `GET /v1-cairn/server-bootstrap`, for holders of the join token (or other `system:masters`).
pub async fn server_bootstrap(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let Some(user) = req.extensions().get::<User>() else {
        return codec::error(&StatusError::unauthorized());
    };
    if !user.groups.iter().any(|g| g == "system:masters") {
        tracing::warn!("refused the server bootstrap to {}", user.name);
        return codec::error(&StatusError::forbidden_plain(format!(
            "{} may not join servers to the cluster: give the server's join token",
            user.name
        )));
    }
    axum::Json(ServerBootstrap { datastore_endpoint: state.datastore_endpoint.get().cloned() }).into_response()
}

/// What a joining node asks for.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificateRequest {
    pub node_name: String,
    /// The node's addresses, for its serving certificate.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    #[serde(rename = "clientCSR")]
    pub client_csr: String,
    #[serde(rename = "servingCSR")]
    pub serving_csr: String,
    #[serde(rename = "controllerCSR")]
    pub controller_csr: String,
}

/// What it gets back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificates {
    pub client_certificate: String,
    pub serving_certificate: String,
    pub controller_certificate: String,
    /// The cluster CA (the same bundle `/cacerts` serves).
    pub ca: String,
}

pub async fn node_certificates(State(state): State<Arc<AppState>>, req: Request) -> Response {
    match issue(&state, req).await {
        Ok(certs) => axum::Json(certs).into_response(),
        Err(e) => codec::error(&e),
    }
}

async fn issue(state: &AppState, req: Request) -> Result<NodeCertificates, StatusError> {
    let user = req.extensions().get::<User>().cloned().ok_or_else(StatusError::unauthorized)?;
    let Some(pki) = state.pki.get() else {
        return Err(StatusError::service_unavailable("the server's CA is not loaded yet"));
    };
    let body = axum::body::to_bytes(req.into_body(), codec::MAX_BODY_BYTES)
        .await
        .map_err(|_| StatusError::too_large(codec::MAX_BODY_BYTES))?;
    let ask: NodeCertificateRequest = serde_json::from_slice(&body)
        .map_err(|e| StatusError::bad_request(format!("the node certificate request is not valid: {e}")))?;
    let errors = crate::registry::validation::is_dns1123_subdomain(&ask.node_name);
    if !errors.is_empty() {
        return Err(StatusError::bad_request(format!("invalid node name {:?}: {}", ask.node_name, errors.join("; "))));
    }
    // The join token's holder and admins may join any node; a node renews only its own credentials.
    let may =
        user.groups.iter().any(|g| g == "system:masters") || user.name == format!("system:node:{}", ask.node_name);
    if !may {
        tracing::warn!("refused node credentials for {} to {}", ask.node_name, user.name);
        return Err(StatusError::forbidden_plain(format!(
            "User \"{}\" cannot get credentials for node \"{}\"",
            user.name, ask.node_name
        )));
    }
    let (client, serving, controller) = pki
        .sign_node(&ask.node_name, &ask.addresses, &ask.client_csr, &ask.serving_csr, &ask.controller_csr)
        .map_err(StatusError::bad_request)?;
    tracing::info!("issued the credentials of node {} (for {})", ask.node_name, user.name);
    Ok(NodeCertificates {
        client_certificate: client,
        serving_certificate: serving,
        controller_certificate: controller,
        ca: pki.ca_pem().to_string(),
    })
}
