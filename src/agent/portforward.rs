//! `portForward` served by the node endpoint itself, as kubelet's `portforward` httpstream
//! handler serves it, with the dial the runtime would make: over SPDY/3.1 (`portforward.k8s.io`),
//! a client opens an error stream and a data stream per connection it forwards, paired by their
//! `requestID`; each pair is joined to a TCP connection to `localhost:<port>` made inside the pod's
//! network namespace. Serving it here rather than through containerd's streaming server saves a
//! hop, and containerd's one-second linger at each connection's close.

use std::collections::HashMap;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::streaming::spdy::{Decoder, Encoder, Frame, Headers};

/// Frames waiting for the connection's writer; a slow client holds the pods' senders back.
const OUTGOING: usize = 64;
/// Data frames from the client waiting for one connection in the pod.
const INCOMING: usize = 64;
/// The most a data frame carries towards the client.
const CHUNK: usize = 128 << 10;

/// Where the forwarded connections go: the pod's network namespace, and its names for messages.
#[derive(Clone)]
pub struct Target {
    pub netns: PathBuf,
    /// The sandbox ID, as runtimes name the pod in their errors.
    pub sandbox_id: String,
}

/// One forwarded connection being set up: its streams as they arrive.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<u32>,
    port: u16,
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Serves one upgraded connection until the client goes away.
pub async fn serve<IO: AsyncRead + AsyncWrite + Send + 'static>(io: IO, target: Target) {
    let (mut reader, mut writer) = tokio::io::split(io);
    let (out, mut outgoing) = mpsc::channel::<Frame>(OUTGOING);
    let writing = tokio::spawn(async move {
        let mut encoder = Encoder::default();
        while let Some(frame) = outgoing.recv().await {
            if writer.write_all(&encoder.encode(&frame)).await.is_err() {
                break;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut decoder = Decoder::default();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    // Dropped with the session: a connection in the pod does not outlive its client.
    let mut forwards = tokio::task::JoinSet::new();
    let mut to_pod: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    loop {
        let frame = match decoder.read(&mut reader).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!("port-forward session: {e}");
                break;
            }
        };
        match frame {
            Frame::SynStream { stream, headers, .. } => {
                if out.send(Frame::SynReply { stream, fin: false, headers: vec![] }).await.is_err() {
                    break;
                }
                let Some(id) = header(&headers, "requestid").map(String::from) else { continue };
                let pair = pairs.entry(id.clone()).or_default();
                match header(&headers, "streamtype") {
                    Some("error") => pair.error = Some(stream),
                    Some("data") => {
                        pair.data = Some(stream);
                        pair.port = header(&headers, "port").and_then(|p| p.parse().ok()).unwrap_or(0);
                    }
                    _ => {}
                }
                // Finished forwards are reaped as new ones come.
                while forwards.try_join_next().is_some() {}
                if let Some(Pair { error: Some(error), data: Some(data), port }) = pairs.get(&id) {
                    let (tx, rx) = mpsc::channel(INCOMING);
                    to_pod.insert(*data, tx);
                    forwards.spawn(forward(target.clone(), *port, *error, *data, rx, out.clone()));
                    pairs.remove(&id);
                }
            }
            Frame::Data { stream, fin, data } => {
                if let Some(tx) = to_pod.get(&stream)
                    && !data.is_empty()
                    && tx.send(data).await.is_err()
                {
                    to_pod.remove(&stream);
                }
                if fin {
                    to_pod.remove(&stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                to_pod.remove(&stream);
            }
            Frame::Ping(id) => {
                if out.send(Frame::Ping(id)).await.is_err() {
                    break;
                }
            }
            Frame::GoAway { .. } => break,
            Frame::SynReply { .. } | Frame::Headers { .. } | Frame::Ignored => {}
        }
    }
    forwards.abort_all();
    drop((to_pod, out));
    let _ = writing.await;
}

/// One forwarded connection: dialled in the pod, then copied both ways. A failed dial is
/// reported on the error stream, as kubelet reports it.
async fn forward(
    target: Target,
    port: u16,
    error: u32,
    data: u32,
    mut from_client: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Frame>,
) {
    let conn = match dial(&target, port).await {
        Ok(c) => c,
        Err(e) => {
            let id = &target.sandbox_id;
            let message = format!(
                "error forwarding port {port} to pod {id}, uid : failed to connect to localhost:{port} inside namespace {id:?}, IPv4: dial tcp4 127.0.0.1:{port}: connect: {} ",
                io_text(&e)
            );
            let _ = out.send(Frame::Data { stream: error, fin: true, data: message.into() }).await;
            let _ = out.send(Frame::Data { stream: data, fin: true, data: Bytes::new() }).await;
            return;
        }
    };
    let (mut pod_rd, mut pod_wr) = conn.into_split();
    let upstream = async move {
        while let Some(chunk) = from_client.recv().await {
            if pod_wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = pod_wr.shutdown().await;
    };
    let downstream = async {
        let mut buf = BytesMut::with_capacity(CHUNK);
        loop {
            buf.reserve(CHUNK);
            match pod_rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let chunk = buf.split().freeze();
                    if out.send(Frame::Data { stream: data, fin: false, data: chunk }).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = out.send(Frame::Data { stream: data, fin: true, data: Bytes::new() }).await;
        let _ = out.send(Frame::Data { stream: error, fin: true, data: Bytes::new() }).await;
    };
    tokio::join!(upstream, downstream);
}

/// Go's text for the usual dial errors (what kubectl users see and search for).
fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::TimedOut => "connection timed out".into(),
        _ => e.to_string(),
    }
}

/// A TCP connection to `127.0.0.1:port` inside the pod's network namespace, made on a thread of
/// its own that enters the namespace and ends (the socket stays in the namespace it was made in).
async fn dial(target: &Target, port: u16) -> std::io::Result<TcpStream> {
    let netns = std::fs::File::open(&target.netns)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("portforward-dial".into()).spawn(move || {
        let connect = || -> std::io::Result<std::net::TcpStream> {
            // SAFETY: setns on a valid descriptor; it switches only this thread, which ends here.
            if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(10))?;
            s.set_nonblocking(true)?;
            Ok(s)
        };
        let _ = tx.send(connect());
    })?;
    let stream = rx.await.map_err(|_| std::io::Error::other("the dialling thread ended"))??;
    let stream = TcpStream::from_std(stream)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(kind: &str, port: u16, request: u32) -> Headers {
        [("streamtype", kind.to_string()), ("port", port.to_string()), ("requestid", request.to_string())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// A client of one session: frames out, frames in (pings and replies included).
    struct Client {
        io: tokio::io::DuplexStream,
        encoder: Encoder,
        decoder: Decoder,
    }

    impl Client {
        async fn send(&mut self, frame: Frame) {
            let bytes = self.encoder.encode(&frame);
            self.io.write_all(&bytes).await.unwrap();
        }

        async fn next(&mut self) -> Frame {
            let read = self.decoder.read(&mut self.io);
            tokio::time::timeout(std::time::Duration::from_secs(10), read).await.unwrap().unwrap().unwrap()
        }

        /// Opens a forwarded connection to `port` (error stream, then data stream, as kubectl does).
        async fn open(&mut self, port: u16, request: u32) {
            let (error, data) = (request * 4 + 1, request * 4 + 3);
            self.send(Frame::SynStream { stream: error, fin: false, headers: headers("error", port, request) }).await;
            self.send(Frame::SynStream { stream: data, fin: false, headers: headers("data", port, request) }).await;
            for stream in [error, data] {
                assert_eq!(self.next().await, Frame::SynReply { stream, fin: false, headers: vec![] });
            }
        }
    }

    // Root only: the dial enters a network namespace (this process's own).
    #[tokio::test]
    async fn forwards_a_connection_and_reports_a_refused_one() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return eprintln!("skipping forwards_a_connection_and_reports_a_refused_one: needs root (setns)");
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (io, server) = tokio::io::duplex(1 << 20);
        let target = Target { netns: "/proc/self/ns/net".into(), sandbox_id: "sandbox-1".into() };
        let session = tokio::spawn(serve(server, target));
        let mut c = Client { io, encoder: Encoder::default(), decoder: Decoder::default() };

        c.open(port, 0).await;
        let (mut pod, _) = listener.accept().await.unwrap();
        c.send(Frame::Data { stream: 3, fin: false, data: Bytes::from_static(b"ping") }).await;
        let mut got = [0u8; 4];
        pod.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        pod.write_all(b"pong").await.unwrap();
        drop(pod);
        assert_eq!(c.next().await, Frame::Data { stream: 3, fin: false, data: Bytes::from_static(b"pong") });
        // The pod's close ends both streams at once.
        assert_eq!(c.next().await, Frame::Data { stream: 3, fin: true, data: Bytes::new() });
        assert_eq!(c.next().await, Frame::Data { stream: 1, fin: true, data: Bytes::new() });

        c.open(closed, 1).await;
        let Frame::Data { stream: 5, fin: true, data } = c.next().await else { panic!("no error on the error stream") };
        let message = String::from_utf8_lossy(&data).into_owned();
        assert!(message.starts_with(&format!("error forwarding port {closed} to pod sandbox-1, uid : ")), "{message}");
        assert!(message.contains("connect: connection refused"), "{message}");
        assert_eq!(c.next().await, Frame::Data { stream: 7, fin: true, data: Bytes::new() });

        c.send(Frame::Ping(9)).await;
        assert_eq!(c.next().await, Frame::Ping(9));
        // The client goes: the session ends.
        drop(c);
        tokio::time::timeout(std::time::Duration::from_secs(10), session).await.unwrap().unwrap();
    }
}
