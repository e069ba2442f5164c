//! The gRPC probe: `grpc.health.v1.Health/Check` over plaintext HTTP/2, worded as upstream's
//! `pkg/probe/grpc`.

use std::time::Duration;

use http::uri::PathAndQuery;
use k8s_openapi::api::core::v1::GRPCAction;
use tokio::time::Instant;
use tonic::transport::Endpoint;

use super::{KUBE_VERSION, Outcome, ProbeResult, go_duration};

/// How long the channel waits between connection attempts (gRPC's first backoff).
const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// `HealthCheckResponse.ServingStatus` names.
fn status_name(status: i32) -> String {
    match status {
        0 => "UNKNOWN".to_string(),
        1 => "SERVING".to_string(),
        2 => "NOT_SERVING".to_string(),
        3 => "SERVICE_UNKNOWN".to_string(),
        other => other.to_string(),
    }
}

pub(super) async fn probe(host: &str, action: &GRPCAction, timeout: Duration) -> Outcome {
    let failure = |message: String| Outcome::new(ProbeResult::Failure, message);
    let deadline = Instant::now() + timeout;
    let addr = if host.contains(':') { format!("[{host}]:{}", action.port) } else { format!("{host}:{}", action.port) };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(format!("kube-probe/{KUBE_VERSION}")))
    {
        Ok(endpoint) => endpoint.connect_timeout(timeout),
        Err(e) => return failure(format!("error: failed to connect service at {addr:?}: {e}")),
    };
    // Like grpc-go's blocking dial: keep trying until the deadline.
    let connect_timeout = || {
        failure(format!(
            "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
            go_duration(timeout)
        ))
    };
    let channel = loop {
        match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Err(_) => return connect_timeout(),
            Ok(Ok(channel)) => break channel,
            Ok(Err(e)) => {
                tracing::debug!("grpc probe: connecting to {addr}: {e}");
                let retry = Instant::now() + RECONNECT_BACKOFF;
                if retry >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    return connect_timeout();
                }
                tokio::time::sleep_until(retry).await;
            }
        }
    };

    let service = action.service.clone().unwrap_or_default();
    let mut client = tonic::client::Grpc::new(channel);
    let call = async {
        client.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        let path = PathAndQuery::from_static("/grpc.health.v1.Health/Check");
        client.unary(tonic::Request::new(HealthCheckRequest { service }), path, codec).await
    };
    let rpc_timeout = || failure(format!("timeout: health rpc did not complete within {}", go_duration(timeout)));
    match tokio::time::timeout_at(deadline, call).await {
        Err(_) => rpc_timeout(),
        Ok(Err(status)) => match status.code() {
            tonic::Code::Unimplemented => failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            tonic::Code::DeadlineExceeded => rpc_timeout(),
            code => failure(format!(
                "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                status.message()
            )),
        },
        Ok(Ok(response)) => match response.into_inner().status {
            1 => Outcome::new(ProbeResult::Success, "service healthy"),
            other => failure(format!("service unhealthy (responded with {:?})", status_name(other))),
        },
    }
}
