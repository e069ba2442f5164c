use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, LifecycleHandler, Probe,
    SleepAction, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::*;

// ---- fakes and helpers ----

#[derive(Clone)]
enum Behave {
    Exit(i32, &'static str, &'static str),
    Hang,
    TimedOut,
    Broken,
}

/// An `Exec` whose answer is set per command name (`cmd[0]`); it records every call.
#[derive(Default)]
struct FakeExec {
    behave: Mutex<HashMap<String, Behave>>,
    calls: Mutex<Vec<(Vec<String>, tokio::time::Instant)>>,
}

impl FakeExec {
    fn set(&self, cmd: &str, behave: Behave) {
        self.behave.lock().unwrap().insert(cmd.to_string(), behave);
    }
    fn calls(&self, cmd: &str) -> Vec<tokio::time::Instant> {
        self.calls.lock().unwrap().iter().filter(|(c, _)| c[0] == cmd).map(|(_, at)| *at).collect()
    }
}

impl Exec for FakeExec {
    fn exec(&self, _id: &str, cmd: Vec<String>, _timeout: Duration) -> BoxFuture<'_, anyhow::Result<ExecOutput>> {
        let behave = self.behave.lock().unwrap().get(&cmd[0]).cloned().unwrap_or(Behave::Exit(0, "", ""));
        self.calls.lock().unwrap().push((cmd, tokio::time::Instant::now()));
        Box::pin(async move {
            match behave {
                Behave::Exit(exit_code, out, err) => {
                    Ok(ExecOutput { exit_code, stdout: out.into(), stderr: err.into() })
                }
                Behave::Hang => futures::future::pending().await,
                Behave::TimedOut => Err(anyhow::Error::new(ExecTimeout)),
                Behave::Broken => Err(anyhow::anyhow!("rpc error: code = NotFound desc = container is not running")),
            }
        })
    }
}

fn exec_probe(cmd: &[&str]) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(cmd.iter().map(|s| s.to_string()).collect()) }),
        ..Default::default()
    }
}

fn http_probe(port: IntOrString, path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction { port, path: Some(path.to_string()), ..Default::default() }),
        ..Default::default()
    }
}

fn local() -> Target {
    Target { pod_ip: Some("127.0.0.1".to_string()), container_id: "c1".to_string(), ..Default::default() }
}

/// A port on 127.0.0.1 that nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// A raw HTTP server on 127.0.0.1: `respond` maps a request head to a response (`None`: never
/// answer). A client that does not speak HTTP gets a 400, as Go's server answers TLS to plain HTTP.
async fn serve(respond: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let respond = Arc::new(respond);
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let respond = respond.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                    if !head[0].is_ascii_alphabetic() {
                        let _ = stream.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n").await;
                        return;
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                log.lock().unwrap().push(head.clone());
                match respond(&head) {
                    Some(response) => {
                        let _ = stream.write_all(response.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                    None => futures::future::pending::<()>().await,
                }
            });
        }
    });
    (port, seen)
}

fn response(status: &str, headers: &str, body: &str) -> String {
    format!("HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

fn path_of(head: &str) -> &str {
    head.split(' ').nth(1).unwrap_or_default()
}

// ---- exec ----

#[tokio::test]
async fn exec_success_and_failure_carry_the_output() {
    let exec = FakeExec::default();
    exec.set("ok", Behave::Exit(0, "fine\n", ""));
    exec.set("bad", Behave::Exit(1, "out ", "err"));
    let outcome = run_probe(&exec_probe(&["ok"]), &local(), &exec).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Success, output: "fine\n".to_string() });
    let outcome = run_probe(&exec_probe(&["bad"]), &local(), &exec).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Failure, output: "out err".to_string() });
}

#[tokio::test(start_paused = true)]
async fn exec_timeout_fails_with_upstream_message() {
    let exec = FakeExec::default();
    exec.set("sleep", Behave::Hang);
    let mut probe = exec_probe(&["sleep", "10"]);
    probe.timeout_seconds = Some(2);
    let start = tokio::time::Instant::now();
    let outcome = run_probe(&probe, &local(), &exec).await;
    assert_eq!(outcome.result, ProbeResult::Failure);
    assert_eq!(outcome.output, r#"command "sleep 10" timed out"#);
    assert!(start.elapsed() >= Duration::from_secs(2) && start.elapsed() <= Duration::from_secs(4));

    exec.set("sleep", Behave::TimedOut);
    let outcome = run_probe(&probe, &local(), &exec).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Failure, output: r#"command "sleep 10" timed out"#.into() });
}

#[tokio::test]
async fn exec_runtime_error_is_unknown_and_output_is_bounded() {
    let exec = FakeExec::default();
    exec.set("gone", Behave::Broken);
    let outcome = run_probe(&exec_probe(&["gone"]), &local(), &exec).await;
    assert_eq!(outcome.result, ProbeResult::Unknown);
    assert!(outcome.output.contains("container is not running"), "{}", outcome.output);

    let big: &'static str = Box::leak("x".repeat(3 * MAX_OUTPUT).into_boxed_str());
    exec.set("noisy", Behave::Exit(1, big, big));
    let outcome = run_probe(&exec_probe(&["noisy"]), &local(), &exec).await;
    assert_eq!(outcome.output.len(), MAX_OUTPUT);
}

#[tokio::test]
async fn exec_command_expands_static_env() {
    let exec = FakeExec::default();
    let mut target = local();
    target.env = vec![
        EnvVar { name: "PORT".into(), value: Some("8080".into()), ..Default::default() },
        EnvVar { name: "SECRET".into(), value: None, ..Default::default() },
    ];
    let probe = exec_probe(&["check", "$(PORT)", "$$(PORT)", "$(SECRET)", "$(MISSING)", "a$b", "$(open"]);
    run_probe(&probe, &target, &exec).await;
    let calls = exec.calls.lock().unwrap();
    assert_eq!(calls[0].0, ["check", "8080", "$(PORT)", "", "$(MISSING)", "a$b", "$(open"]);
}

// ---- httpGet ----

#[tokio::test]
async fn http_200_succeeds_with_default_and_custom_headers() {
    let (port, seen) = serve(|_| Some(response("200 OK", "", "healthy"))).await;
    let mut probe = http_probe(IntOrString::Int(port.into()), "/healthz?full=1");
    probe.http_get.as_mut().unwrap().http_headers =
        Some(vec![HTTPHeader { name: "X-Custom".into(), value: "yes".into() }]);
    let outcome = run_probe(&probe, &local(), &FakeExec::default()).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Success, output: "healthy".into() });
    let head = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(head.starts_with("get /healthz?full=1 http/1.1\r\n"), "{head}");
    assert!(head.contains("user-agent: kube-probe/1.37\r\n"), "{head}");
    assert!(head.contains("accept: */*\r\n"), "{head}");
    assert!(head.contains(&format!("host: 127.0.0.1:{port}\r\n")), "{head}");
    assert!(head.contains("x-custom: yes\r\n"), "{head}");
}

#[tokio::test]
async fn http_host_header_and_user_agent_can_be_overridden() {
    let (port, seen) = serve(|_| Some(response("204 No Content", "", ""))).await;
    let mut probe = http_probe(IntOrString::Int(port.into()), "");
    probe.http_get.as_mut().unwrap().http_headers = Some(vec![
        HTTPHeader { name: "Host".into(), value: "example.com".into() },
        HTTPHeader { name: "User-Agent".into(), value: "mine".into() },
        HTTPHeader { name: "Accept".into(), value: "".into() },
    ]);
    assert_eq!(run_probe(&probe, &local(), &FakeExec::default()).await.result, ProbeResult::Success);
    let head = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(head.starts_with("get / http/1.1\r\n"), "{head}");
    assert!(head.contains("host: example.com\r\n") && head.contains("user-agent: mine\r\n"), "{head}");
    assert!(!head.contains("accept:"), "{head}");
}

#[tokio::test]
async fn http_500_fails_with_status_code() {
    let (port, _) = serve(|_| Some(response("500 Internal Server Error", "", "secret details"))).await;
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/"), &local(), &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome { result: ProbeResult::Failure, output: "HTTP probe failed with statuscode: 500".into() }
    );
}

#[tokio::test]
async fn http_redirects_on_the_same_host_are_followed() {
    let (port, seen) = serve(|head| match path_of(head) {
        "/old" => Some(response("302 Found", "Location: /new\r\n", "")),
        "/new" => Some(response("200 OK", "", "arrived")),
        _ => Some(response("404 Not Found", "", "")),
    })
    .await;
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/old"), &local(), &FakeExec::default()).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Success, output: "arrived".into() });
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn http_redirect_to_another_host_is_a_warning() {
    let (port, seen) = serve(move |_| Some(response("301 Moved", "Location: http://localhost:1/x\r\n", "moved"))).await;
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/"), &local(), &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome { result: ProbeResult::Warning, output: "Probe terminated redirects, Response body: moved".into() }
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(
        Kind::Readiness.event_message(&outcome).unwrap(),
        "Readiness probe warning: Probe terminated redirects, Response body: moved"
    );
}

#[tokio::test]
async fn http_redirect_loop_stops_after_ten() {
    let (port, seen) = serve(|head| {
        let n: u32 = path_of(head).trim_start_matches('/').parse().unwrap_or(0);
        Some(response("302 Found", &format!("Location: /{}\r\n", n + 1), ""))
    })
    .await;
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/0"), &local(), &FakeExec::default()).await;
    assert_eq!(outcome.result, ProbeResult::Failure);
    assert_eq!(outcome.output, format!(r#"Get "http://127.0.0.1:{port}/10": stopped after 10 redirects"#));
    assert_eq!(seen.lock().unwrap().len(), 10);
}

#[tokio::test]
async fn http_named_port_resolves_and_missing_name_errors() {
    let (port, _) = serve(|_| Some(response("200 OK", "", ""))).await;
    let mut target = local();
    target.ports = vec![ContainerPort { name: Some("web".into()), container_port: port.into(), ..Default::default() }];
    let probe = http_probe(IntOrString::String("web".into()), "/");
    assert_eq!(run_probe(&probe, &target, &FakeExec::default()).await.result, ProbeResult::Success);

    let probe = http_probe(IntOrString::String("admin".into()), "/");
    let outcome = run_probe(&probe, &target, &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome { result: ProbeResult::Unknown, output: r#"strconv.Atoi: parsing "admin": invalid syntax"#.into() }
    );
    assert_eq!(
        Kind::Liveness.event_message(&outcome).unwrap(),
        r#"Liveness probe errored and resulted in unknown state: strconv.Atoi: parsing "admin": invalid syntax"#
    );
    let outcome = run_probe(&http_probe(IntOrString::Int(70000), "/"), &target, &FakeExec::default()).await;
    assert_eq!(outcome.output, "invalid port number: 70000");
}

#[tokio::test]
async fn http_timeout_against_a_server_that_never_answers() {
    let (port, _) = serve(|_| None).await;
    let started = std::time::Instant::now();
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/slow"), &local(), &FakeExec::default()).await;
    assert!(started.elapsed() >= Duration::from_secs(1) && started.elapsed() < Duration::from_secs(3));
    assert_eq!(outcome.result, ProbeResult::Failure);
    assert_eq!(
        outcome.output,
        format!(
            r#"Get "http://127.0.0.1:{port}/slow": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"#
        )
    );
}

#[tokio::test]
async fn http_connection_refused_is_worded_as_go() {
    let port = closed_port().await;
    let outcome =
        run_probe(&http_probe(IntOrString::Int(port.into()), "/healthz"), &local(), &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome {
            result: ProbeResult::Failure,
            output: format!(
                r#"Get "http://127.0.0.1:{port}/healthz": dial tcp 127.0.0.1:{port}: connect: connection refused"#
            ),
        }
    );
    assert_eq!(
        Kind::Liveness.event_message(&outcome).unwrap(),
        format!(
            r#"Liveness probe failed: Get "http://127.0.0.1:{port}/healthz": dial tcp 127.0.0.1:{port}: connect: connection refused"#
        )
    );
}

#[tokio::test]
async fn http_body_is_read_up_to_10_kib() {
    let body = "y".repeat(3 * MAX_OUTPUT);
    let (port, _) = serve(move |_| Some(response("200 OK", "", &body))).await;
    let outcome = run_probe(&http_probe(IntOrString::Int(port.into()), "/"), &local(), &FakeExec::default()).await;
    assert_eq!(outcome.result, ProbeResult::Success);
    assert_eq!(outcome.output.len(), MAX_OUTPUT);
}

/// A TLS server with a self-signed certificate answering 200 `secure` to one request per connection.
async fn serve_tls() -> u16 {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else { return };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls.write_all(response("200 OK", "", "secure").as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test]
async fn https_skips_certificate_verification() {
    let port = serve_tls().await;
    let mut probe = http_probe(IntOrString::Int(port.into()), "/");
    probe.http_get.as_mut().unwrap().scheme = Some("HTTPS".into());
    let outcome = run_probe(&probe, &local(), &FakeExec::default()).await;
    assert_eq!(outcome, Outcome { result: ProbeResult::Success, output: "secure".into() });

    // The same over a host name (SNI) rather than an IP address.
    probe.http_get.as_mut().unwrap().host = Some("localhost".into());
    assert_eq!(run_probe(&probe, &local(), &FakeExec::default()).await.result, ProbeResult::Success);
}

#[tokio::test]
async fn https_probe_against_plain_http_fails_but_hook_falls_back() {
    let (port, seen) = serve(|_| Some(response("200 OK", "", ""))).await;
    let mut action = HTTPGetAction {
        port: IntOrString::Int(port.into()),
        scheme: Some("HTTPS".into()),
        path: Some("/hook".into()),
        http_headers: Some(vec![HTTPHeader { name: "Authorization".into(), value: "Bearer x".into() }]),
        ..Default::default()
    };
    let probe = Probe { http_get: Some(action.clone()), ..Default::default() };
    let outcome = run_probe(&probe, &local(), &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome {
            result: ProbeResult::Failure,
            output: format!(r#"Get "https://127.0.0.1:{port}/hook": http: server gave HTTP response to HTTPS client"#),
        }
    );
    let hook = LifecycleHandler { http_get: Some(action.clone()), ..Default::default() };
    assert_eq!(run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(5)).await, Ok(()));
    let head = seen.lock().unwrap().last().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /hook http/1.1") && head.contains("user-agent: kube-lifecycle/1.37"), "{head}");
    assert!(!head.contains("authorization"), "{head}");

    action.scheme = None;
    action.port = IntOrString::Int(closed_port().await.into());
    let hook = LifecycleHandler { http_get: Some(action), ..Default::default() };
    let err = run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(5)).await.unwrap_err();
    assert!(err.ends_with("connect: connection refused"), "{err}");
    assert_eq!(
        hook_failure_message(&hook, "app", "web_default(123)", &err),
        format!(r#"HTTP lifecycle hook (/hook) for Container "app" in Pod "web_default(123)" failed - error: {err}"#)
    );
}

#[tokio::test]
async fn http_hook_ignores_the_status_code() {
    let (port, _) = serve(|_| Some(response("500 Internal Server Error", "", ""))).await;
    let hook = LifecycleHandler {
        http_get: Some(HTTPGetAction { port: IntOrString::Int(port.into()), ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(5)).await, Ok(()));
}

// ---- tcpSocket ----

#[tokio::test]
async fn tcp_open_and_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap().port();
    let probe = |port: u16| Probe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(port.into()), host: None }),
        ..Default::default()
    };
    assert_eq!(run_probe(&probe(open), &local(), &FakeExec::default()).await, Outcome::new(ProbeResult::Success, ""));
    let closed = closed_port().await;
    assert_eq!(
        run_probe(&probe(closed), &local(), &FakeExec::default()).await,
        Outcome::new(ProbeResult::Failure, format!("dial tcp 127.0.0.1:{closed}: connect: connection refused"))
    );
}

// ---- gRPC ----

/// A gRPC health server over h2c: service "" is SERVING, "down" NOT_SERVING, other methods are
/// unimplemented.
async fn serve_grpc() -> u16 {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|req: ::http::Request<hyper::body::Incoming>| async move {
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let service = String::from_utf8_lossy(body.get(7..).unwrap_or_default()).into_owned();
                let mut trailers = ::http::HeaderMap::new();
                let mut frames = Vec::new();
                if path == "/grpc.health.v1.Health/Check" {
                    let status = if service == "down" { 2u8 } else { 1 };
                    frames.push(Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from(vec![
                        0, 0, 0, 0, 2, 0x08, status,
                    ]))));
                    trailers.insert("grpc-status", "0".parse().unwrap());
                } else {
                    trailers.insert("grpc-status", "12".parse().unwrap());
                    trailers.insert("grpc-message", "unknown service".parse().unwrap());
                }
                frames.push(Ok(Frame::trailers(trailers)));
                let response = ::http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(StreamBody::new(futures::stream::iter(frames)))
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    port
}

#[tokio::test]
async fn grpc_health_serving_and_not_serving() {
    let port = serve_grpc().await;
    let probe = |service: Option<&str>| Probe {
        grpc: Some(GRPCAction { port: port.into(), service: service.map(String::from), ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(
        run_probe(&probe(None), &local(), &FakeExec::default()).await,
        Outcome::new(ProbeResult::Success, "service healthy")
    );
    assert_eq!(
        run_probe(&probe(Some("down")), &local(), &FakeExec::default()).await,
        Outcome::new(ProbeResult::Failure, r#"service unhealthy (responded with "NOT_SERVING")"#)
    );
}

#[tokio::test(start_paused = true)]
async fn grpc_unreachable_times_out_connecting() {
    let port = closed_port().await;
    let probe = Probe {
        grpc: Some(GRPCAction { port: port.into(), ..Default::default() }),
        timeout_seconds: Some(3),
        ..Default::default()
    };
    let outcome = run_probe(&probe, &local(), &FakeExec::default()).await;
    assert_eq!(
        outcome,
        Outcome::new(
            ProbeResult::Failure,
            format!(r#"timeout: failed to connect service "127.0.0.1:{port}" within 3s: context deadline exceeded"#)
        )
    );
}

// ---- hooks ----

#[tokio::test]
async fn exec_hook_reports_exit_code_and_output() {
    let exec = FakeExec::default();
    exec.set("sh", Behave::Exit(3, "out", "boom"));
    let hook = LifecycleHandler {
        exec: Some(ExecAction { command: Some(vec!["sh".into(), "-c".into(), "exit 3".into()]) }),
        ..Default::default()
    };
    let err = run_hook(&hook, &local(), &exec, Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err, r#"command 'sh -c exit 3' exited with 3: boom, message: "outboom""#);
    assert_eq!(
        hook_failure_message(&hook, "app", "web_default(123)", &err),
        r#"Exec lifecycle hook ([sh -c exit 3]) for Container "app" in Pod "web_default(123)" failed - error: command 'sh -c exit 3' exited with 3: boom, message: "outboom""#
    );
    exec.set("sh", Behave::Exit(0, "", ""));
    assert_eq!(run_hook(&hook, &local(), &exec, Duration::from_secs(30)).await, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn sleep_hook_and_budget() {
    let hook = LifecycleHandler { sleep: Some(SleepAction { seconds: 5 }), ..Default::default() };
    let start = tokio::time::Instant::now();
    assert_eq!(run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(30)).await, Ok(()));
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    let start = tokio::time::Instant::now();
    let err = run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(2)).await.unwrap_err();
    assert_eq!(err, "container terminated before sleep hook finished");
    assert_eq!(start.elapsed(), Duration::from_secs(2));

    let exec = FakeExec::default();
    exec.set("wait", Behave::Hang);
    let hook = LifecycleHandler { exec: Some(ExecAction { command: Some(vec!["wait".into()]) }), ..Default::default() };
    let err = run_hook(&hook, &local(), &exec, Duration::from_millis(1500)).await.unwrap_err();
    assert_eq!(err, "hook did not complete within 1.5s");
}

#[tokio::test]
async fn tcp_socket_hook_is_invalid() {
    let hook = LifecycleHandler {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(8080), host: None }),
        ..Default::default()
    };
    let err = run_hook(&hook, &local(), &FakeExec::default(), Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(
        err,
        "invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,TCPSocket:&TCPSocketAction{Port:{0 8080 },Host:,},Sleep:nil,}"
    );
    assert_eq!(hook_failure_message(&hook, "app", "p", &err), format!("Cannot run handler: {err}"));
}

#[test]
fn go_durations() {
    assert_eq!(go_duration(Duration::from_secs(1)), "1s");
    assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(go_duration(Duration::from_secs(7200)), "2h0m0s");
    assert_eq!(go_duration(Duration::from_millis(29_250)), "29.25s");
}

#[test]
fn kill_messages() {
    assert_eq!(
        Kind::Liveness.kill_message("app", true).unwrap(),
        "Container app failed liveness probe, will be restarted"
    );
    assert_eq!(Kind::Startup.kill_message("app", false).unwrap(), "Container app failed startup probe");
    assert_eq!(Kind::Readiness.kill_message("app", true), None);
}

// ---- manager ----

struct Harness {
    exec: Arc<FakeExec>,
    manager: ProbeManager,
    events: mpsc::UnboundedReceiver<ProbeEvent>,
}

impl Harness {
    fn new() -> Self {
        let exec = Arc::new(FakeExec::default());
        let (tx, events) = mpsc::unbounded_channel();
        Harness { manager: ProbeManager::new(exec.clone(), tx), exec, events }
    }

    /// The next event within 10 simulated minutes.
    async fn next(&mut self) -> ProbeEvent {
        tokio::time::timeout(Duration::from_secs(600), self.events.recv()).await.expect("no event").unwrap()
    }

    /// The next event that is not a failed attempt.
    async fn next_change(&mut self) -> (Kind, bool) {
        loop {
            if let ProbeEvent { kind, what: What::Changed(v), .. } = self.next().await {
                return (kind, v);
            }
        }
    }

    /// Asserts that nothing is reported for `secs` simulated seconds.
    async fn quiet(&mut self, secs: u64) {
        if let Ok(event) = tokio::time::timeout(Duration::from_secs(secs), self.events.recv()).await {
            panic!("unexpected event {event:?}");
        }
    }
}

fn container(startup: Option<Probe>, liveness: Option<Probe>, readiness: Option<Probe>) -> Container {
    Container {
        name: "app".into(),
        startup_probe: startup,
        liveness_probe: liveness,
        readiness_probe: readiness,
        ..Default::default()
    }
}

fn periodic(cmd: &str, period: i32, success: i32, failure: i32) -> Probe {
    Probe {
        period_seconds: Some(period),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..exec_probe(&[cmd])
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_flips_after_thresholds_and_keeps_probing() {
    let mut h = Harness::new();
    let start = tokio::time::Instant::now();
    let c = container(None, None, Some(periodic("ready", 10, 2, 3)));
    h.manager.add_container("uid", &c, "c1", local());
    assert_eq!(h.manager.result("uid", "app", Kind::Readiness), Some(false));
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), None);

    assert_eq!(h.next_change().await, (Kind::Readiness, true));
    assert_eq!(start.elapsed(), Duration::from_secs(10), "two successes: at 0 s and 10 s");
    assert_eq!(h.manager.result("uid", "app", Kind::Readiness), Some(true));
    h.quiet(25).await;

    h.exec.set("ready", Behave::Exit(1, "not yet", ""));
    let since = tokio::time::Instant::now();
    for _ in 0..3 {
        let event = h.next().await;
        assert_eq!(event.what, What::Failed { message: "Readiness probe failed: not yet".into() });
        assert_eq!((event.uid.as_str(), event.container.as_str(), event.container_id.as_str()), ("uid", "app", "c1"));
    }
    assert_eq!(h.next_change().await, (Kind::Readiness, false));
    assert!(since.elapsed() <= Duration::from_secs(30));
    // Still probing while failing: failures keep being reported, without a new Changed.
    for _ in 0..2 {
        assert!(matches!(h.next().await.what, What::Failed { .. }));
    }
    h.exec.set("ready", Behave::Exit(0, "", ""));
    assert_eq!(h.next_change().await, (Kind::Readiness, true));
    h.quiet(60).await;
    assert!(h.exec.calls("ready").len() >= 12);
}

#[tokio::test(start_paused = true)]
async fn errored_attempts_are_retried_and_do_not_count() {
    let mut h = Harness::new();
    h.exec.set("live", Behave::Broken);
    h.manager.add_container("uid", &container(None, Some(periodic("live", 10, 1, 1)), None), "c1", local());
    for _ in 0..3 {
        let event = h.next().await;
        let What::Failed { message } = event.what else { panic!("{event:?}") };
        assert!(message.starts_with("Liveness probe errored and resulted in unknown state: rpc error"), "{message}");
    }
    assert_eq!(h.exec.calls("live").len(), 9, "three tries a period");
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), Some(true));
}

#[tokio::test(start_paused = true)]
async fn initial_delay_is_honoured() {
    let h = Harness::new();
    let start = tokio::time::Instant::now();
    let probe = Probe { initial_delay_seconds: Some(15), ..periodic("ready", 10, 1, 3) };
    h.manager.add_container("uid", &container(None, None, Some(probe)), "c1", local());
    tokio::time::sleep(Duration::from_secs(36)).await;
    let calls: Vec<_> = h.exec.calls("ready").iter().map(|at| at.duration_since(start).as_secs()).collect();
    assert_eq!(calls, [15, 25, 35]);
}

#[tokio::test(start_paused = true)]
async fn startup_gates_liveness_and_readiness() {
    let mut h = Harness::new();
    let start = tokio::time::Instant::now();
    h.exec.set("start", Behave::Exit(1, "starting", ""));
    let c = container(
        Some(periodic("start", 5, 1, 30)),
        Some(periodic("live", 10, 1, 3)),
        Some(periodic("ready", 10, 1, 3)),
    );
    h.manager.add_container("uid", &c, "c1", local());
    assert_eq!(h.manager.result("uid", "app", Kind::Startup), Some(false));
    tokio::time::sleep(Duration::from_secs(62)).await;
    assert!(h.exec.calls("live").is_empty() && h.exec.calls("ready").is_empty());
    assert_eq!(h.exec.calls("start").len(), 13);

    h.exec.set("start", Behave::Exit(0, "", ""));
    let (kind, value) = h.next_change().await;
    assert_eq!((kind, value), (Kind::Startup, true));
    let started_at = tokio::time::Instant::now();
    assert_eq!(started_at.duration_since(start), Duration::from_secs(65));
    // Readiness runs at once; liveness waits for its own tick.
    assert_eq!(h.next_change().await, (Kind::Readiness, true));
    assert_eq!(tokio::time::Instant::now(), started_at);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(h.exec.calls("start").len(), 14, "the startup probe stops once it succeeded");
    let live: Vec<_> = h.exec.calls("live").iter().map(|at| at.duration_since(start).as_secs()).collect();
    assert_eq!(live, [70, 80]);
    assert_eq!(h.manager.result("uid", "app", Kind::Startup), Some(true));
}

#[tokio::test(start_paused = true)]
async fn startup_failure_stops_probing() {
    let mut h = Harness::new();
    let start = tokio::time::Instant::now();
    h.exec.set("start", Behave::Exit(1, "", ""));
    let c = container(Some(periodic("start", 5, 1, 3)), None, Some(periodic("ready", 10, 1, 3)));
    h.manager.add_container("uid", &c, "c1", local());
    assert_eq!(h.next_change().await, (Kind::Startup, false));
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(h.exec.calls("start").len(), 3);
    assert!(h.exec.calls("ready").is_empty());
}

#[tokio::test(start_paused = true)]
async fn liveness_failure_holds_until_a_new_container() {
    let mut h = Harness::new();
    h.exec.set("live", Behave::Exit(1, "dead", ""));
    let c = container(None, Some(periodic("live", 10, 1, 3)), None);
    h.manager.add_container("uid", &c, "c1", local());
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), Some(true));
    for _ in 0..3 {
        assert_eq!(h.next().await.what, What::Failed { message: "Liveness probe failed: dead".into() });
    }
    assert_eq!(h.next_change().await, (Kind::Liveness, false));
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), Some(false));
    h.quiet(120).await;
    assert_eq!(h.exec.calls("live").len(), 3);

    // The same container again changes nothing.
    h.manager.add_container("uid", &c, "c1", local());
    h.quiet(30).await;
    assert_eq!(h.exec.calls("live").len(), 3);

    // A replacement resets the result and resumes probing.
    h.exec.set("live", Behave::Exit(0, "", ""));
    h.manager.add_container("uid", &c, "c2", local());
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), Some(true));
    h.quiet(35).await;
    assert_eq!(h.exec.calls("live").len(), 7);
}

#[tokio::test(start_paused = true)]
async fn stop_liveness_and_startup_keeps_readiness() {
    let mut h = Harness::new();
    let c = container(None, Some(periodic("live", 10, 1, 3)), Some(periodic("ready", 10, 1, 1)));
    h.manager.add_container("uid", &c, "c1", local());
    assert_eq!(h.next_change().await, (Kind::Readiness, true));
    h.manager.stop_liveness_and_startup("uid");
    assert_eq!(h.manager.result("uid", "app", Kind::Liveness), None);
    let live = h.exec.calls("live").len();
    h.exec.set("ready", Behave::Exit(1, "", ""));
    h.exec.set("live", Behave::Exit(1, "", ""));
    assert_eq!(h.next().await.kind, Kind::Readiness);
    assert_eq!(h.next_change().await, (Kind::Readiness, false));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.exec.calls("live").len(), live);
}

#[tokio::test(start_paused = true)]
async fn remove_pod_stops_the_workers() {
    let mut h = Harness::new();
    let c = container(None, Some(periodic("live", 10, 1, 3)), Some(periodic("ready", 10, 1, 3)));
    h.manager.add_container("uid", &c, "c1", local());
    let mut other = c.clone();
    other.name = "side".into();
    h.manager.add_container("uid", &other, "c9", local());
    assert!(h.next_change().await.1);
    assert_eq!(Arc::strong_count(&h.exec), 6, "four workers, the manager and the test");

    h.manager.remove_container("uid", "side");
    assert_eq!(h.manager.result("uid", "side", Kind::Readiness), None);
    assert_eq!(h.manager.result("uid", "app", Kind::Readiness), Some(true));
    h.manager.remove_pod("uid");
    assert_eq!(h.manager.result("uid", "app", Kind::Readiness), None);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(Arc::strong_count(&h.exec), 2);
    let calls = h.exec.calls.lock().unwrap().len();
    while h.events.try_recv().is_ok() {}
    h.quiet(300).await;
    assert_eq!(h.exec.calls.lock().unwrap().len(), calls);

    // Dropping the manager stops whatever is left.
    h.manager.add_container("uid", &c, "c3", local());
    assert_eq!(Arc::strong_count(&h.exec), 4);
    drop(h.manager);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(Arc::strong_count(&h.exec), 1);
}
