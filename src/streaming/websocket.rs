//! The WebSocket side of streaming: the server handshake, the `v5.channel.k8s.io` exec/attach
//! session translated onto SPDY towards the node (kube-apiserver's `StreamTranslatorHandler`),
//! and port-forward's SPDY-in-WebSocket tunnel (`TunnelingHandler`).

use std::collections::HashMap;

use axum::body::Body;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::{Role, frame::coding::CloseCode};

use super::spdy::{self, Frame};

/// Remote command over WebSocket with stdin close (kubectl 1.30+).
pub const V5_CHANNEL: &str = "v5.channel.k8s.io";
/// Port-forward's SPDY carried in binary WebSocket messages (kubectl 1.30+).
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5's close signal: `[255, channel]` half-closes that channel.
const CLOSE: u8 = 255;

/// The subprotocols a client offers, in its order of preference.
pub fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The 101 accepting a WebSocket upgrade with `protocol`; `None` when the request is not a valid
/// WebSocket handshake.
pub fn accept(headers: &HeaderMap, protocol: &str) -> Option<Response<Body>> {
    let key = headers.get(header::SEC_WEBSOCKET_KEY)?;
    if headers.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()) != Some("13") {
        return None;
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, HeaderValue::from_str(&accept).ok()?);
    h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(protocol).ok()?);
    Some(resp)
}

async fn server(on: OnUpgrade) -> Option<WebSocketStream<TokioIo<Upgraded>>> {
    match on.await {
        Ok(io) => Some(WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await),
        Err(e) => {
            tracing::debug!("WebSocket upgrade failed: {e}");
            None
        }
    }
}

async fn close<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
    let _ = ws.close(Some(frame)).await;
}

/// Which streams a remote command session has (the request's stdin, stdout, stderr and tty).
#[derive(Debug, Clone, Copy, Default)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Streams {
    /// The SPDY streams a `v4.channel.k8s.io` client opens, in client-go's order, as
    /// (WebSocket channel, SPDY stream id, `streamType`).
    fn spdy(self) -> Vec<(u8, u32, &'static str)> {
        let mut out = vec![(ERROR, "error")];
        if self.stdin {
            out.push((STDIN, "stdin"));
        }
        if self.stdout {
            out.push((STDOUT, "stdout"));
        }
        if self.stderr && !self.tty {
            out.push((STDERR, "stderr"));
        }
        if self.tty {
            out.push((RESIZE, "resize"));
        }
        out.into_iter().enumerate().map(|(i, (ch, t))| (ch, 2 * i as u32 + 1, t)).collect()
    }
}

/// Serves a `v5.channel.k8s.io` client (upgrading on `on`) over `node`, an SPDY connection that
/// switched to `v4.channel.k8s.io`: stdin and resize go to the node, stdout and stderr come back
/// as they arrive, stdin's close signal becomes the stdin stream's FIN, and the session's Status
/// is sent on the error channel before a normal close.
pub async fn translate<N>(on: OnUpgrade, node: N, streams: Streams)
where
    N: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(mut ws) = server(on).await else { return };
    let (mut rd, mut wr) = tokio::io::split(node);
    // Frames are read in a task of their own: a read cut short by the select below would lose bytes.
    let (frames_tx, mut frames) = tokio::sync::mpsc::channel(16);
    let reader = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        let mut dec = spdy::Decoder::default();
        loop {
            let frame = dec.read(&mut rd).await;
            let end = !matches!(frame, Ok(Some(_)));
            if frames_tx.send(frame).await.is_err() || end {
                return;
            }
        }
    }));
    let mut enc = spdy::Encoder::default();
    let layout = streams.spdy();
    let id_of = |ch: u8| layout.iter().find(|(c, ..)| *c == ch).map(|(_, id, _)| *id);
    let channel_of: HashMap<u32, u8> = layout.iter().map(|(ch, id, _)| (*id, *ch)).collect();
    let mut opening = Vec::new();
    for (_, id, kind) in &layout {
        let headers = vec![("streamtype".to_string(), kind.to_string())];
        opening.extend_from_slice(&enc.encode(&Frame::SynStream { stream: *id, fin: false, headers }));
    }
    if wr.write_all(&opening).await.is_err() {
        return close(&mut ws).await;
    }
    let mut error = Vec::new();
    let mut stdin_open = true;
    let outcome: Result<(), String> = loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    let Some((&ch, payload)) = data.split_first() else { continue };
                    let frame = match (ch, payload) {
                        (CLOSE, [STDIN]) if stdin_open => {
                            stdin_open = false;
                            id_of(STDIN).map(|stream| Frame::Data { stream, fin: true, data: Bytes::new() })
                        }
                        (STDIN, _) if stdin_open => id_of(STDIN)
                            .map(|stream| Frame::Data { stream, fin: false, data: data.slice(1..) }),
                        (RESIZE, _) => id_of(RESIZE)
                            .map(|stream| Frame::Data { stream, fin: false, data: data.slice(1..) }),
                        _ => None,
                    };
                    if let Some(f) = frame
                        && let Err(e) = wr.write_all(&enc.encode(&f)).await
                    {
                        break Err(format!("writing to the node: {e}"));
                    }
                }
                Some(Ok(Message::Close(_))) | None => return,
                Some(Ok(_)) => {}
                Some(Err(e)) => return tracing::debug!("exec WebSocket ended: {e}"),
            },
            frame = frames.recv() => match frame.unwrap_or(Ok(None)) {
                Ok(Some(Frame::Data { stream, data, .. })) => match channel_of.get(&stream) {
                    Some(&ERROR) => error.extend_from_slice(&data),
                    Some(&ch) if !data.is_empty() => {
                        let mut msg = Vec::with_capacity(data.len() + 1);
                        msg.push(ch);
                        msg.extend_from_slice(&data);
                        if ws.send(Message::Binary(msg.into())).await.is_err() {
                            return;
                        }
                    }
                    _ => {}
                },
                Ok(Some(Frame::Ping(id))) => {
                    if let Err(e) = wr.write_all(&enc.encode(&Frame::Ping(id))).await {
                        break Err(format!("writing to the node: {e}"));
                    }
                }
                Ok(Some(Frame::GoAway { .. })) | Ok(None) => break Ok(()),
                Ok(Some(_)) => {}
                Err(e) => break Err(e.to_string()),
            },
        }
    };
    drop(reader);
    let status = match outcome {
        Ok(()) => translated_status(&error),
        Err(e) => internal(&e),
    };
    let mut msg = vec![ERROR];
    msg.extend_from_slice(status.to_string().as_bytes());
    if ws.send(Message::Binary(msg.into())).await.is_ok() {
        close(&mut ws).await;
    }
}

fn internal(message: &str) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": format!("Internal error occurred: {message}"),
           "reason": "InternalError", "details": {"causes": [{"message": message}]}, "code": 500})
}

/// The Status a v5 client gets for the node's error stream, as the translator rebuilds it: none
/// is success, an exit code is `NonZeroExitCode` with upstream's message, anything else as sent.
fn translated_status(error: &[u8]) -> Value {
    if error.iter().all(u8::is_ascii_whitespace) {
        return json!({"metadata": {}, "status": "Success"});
    }
    let Ok(status) = serde_json::from_slice::<Value>(error) else {
        return internal(String::from_utf8_lossy(error).trim());
    };
    if status["status"] == "Success" {
        return json!({"metadata": {}, "status": "Success"});
    }
    let exit_code = (status["reason"] == "NonZeroExitCode")
        .then(|| {
            status["details"]["causes"].as_array()?.iter().find(|c| c["reason"] == "ExitCode")?["message"].as_str()
        })
        .flatten();
    match exit_code {
        Some(code) => json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: command terminated with exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code}]},
        }),
        None => status,
    }
}

/// Carries port-forward's SPDY between a WebSocket client (upgrading on `on`) and `node`, an SPDY
/// connection that switched to `portforward.k8s.io`: each binary message is a piece of the byte
/// stream, in either direction, until either side ends.
pub async fn tunnel<N>(on: OnUpgrade, node: N)
where
    N: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(mut ws) = server(on).await else { return };
    let (mut rd, mut wr) = tokio::io::split(node);
    let mut buf = vec![0u8; 32 << 10];
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    if wr.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) | Some(Ok(Message::Text(_))) => break,
                Some(Ok(_)) => {}
            },
            n = rd.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return;
                    }
                }
            },
        }
    }
    let _ = wr.shutdown().await;
    close(&mut ws).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_opened_in_client_go_order() {
        let all = Streams { stdin: true, stdout: true, stderr: true, tty: false };
        assert_eq!(
            all.spdy(),
            vec![(ERROR, 1, "error"), (STDIN, 3, "stdin"), (STDOUT, 5, "stdout"), (STDERR, 7, "stderr")]
        );
        let tty = Streams { stdin: true, stdout: true, stderr: true, tty: true };
        assert_eq!(
            tty.spdy(),
            vec![(ERROR, 1, "error"), (STDIN, 3, "stdin"), (STDOUT, 5, "stdout"), (RESIZE, 7, "resize")]
        );
    }

    #[test]
    fn an_exit_code_is_rebuilt_as_the_translator_does() {
        let node = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        let s = translated_status(node);
        assert_eq!(s["message"], "command terminated with non-zero exit code: command terminated with exit code 3");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(translated_status(b"")["status"], "Success");
        assert_eq!(translated_status(br#"{"metadata":{},"status":"Success"}"#)["status"], "Success");
        let other = br#"{"status":"Failure","message":"boom","reason":"InternalError","code":500}"#;
        assert_eq!(translated_status(other)["message"], "boom");
        assert_eq!(translated_status(b"not json")["reason"], "InternalError");
    }
}
