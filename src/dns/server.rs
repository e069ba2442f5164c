//! The DNS listener: hickory-server's UDP and TCP loops with cairn's request handler, which answers
//! the cluster's names from the current [`RecordSet`] snapshot (never waiting on a rebuild) and
//! everything else through the [`Forwarder`] (CoreDNS's plugin chain `kubernetes` → `forward`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Name, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::forward::{EDNS_PAYLOAD, Forwarder};
use super::records::{Lookup, RecordSet};

/// The longest CNAME chain followed through ExternalName Services (CoreDNS stops at 8 too).
const MAX_CNAME_CHAIN: usize = 8;
/// A TCP client idle this long is disconnected.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Answers queued per TCP connection.
const TCP_RESPONSE_BUFFER: usize = 64;

/// A listener could not be opened or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listening for DNS on {addr} over {transport}: {source}")]
    Bind {
        addr: SocketAddr,
        transport: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no listen address given")]
    NoListenAddress,
    #[error("the DNS listeners stopped: {0}")]
    Serve(String),
}

/// Where the snapshot lives: one writer swaps it, every query loads it.
pub type Snapshot = Arc<ArcSwap<RecordSet>>;

/// The sockets, bound before serving so that a caller (a test) can learn the port of `:0`.
pub struct Listeners {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl Listeners {
    /// Binds UDP and TCP on every address; with port 0, TCP takes the port UDP got.
    pub async fn bind(listen: &[SocketAddr]) -> Result<Self, Error> {
        if listen.is_empty() {
            return Err(Error::NoListenAddress);
        }
        let mut out = Listeners { udp: Vec::new(), tcp: Vec::new() };
        for addr in listen {
            let (udp, tcp) = bind_pair(*addr).await?;
            out.udp.push(udp);
            out.tcp.push(tcp);
        }
        Ok(out)
    }

    /// The addresses actually bound (one per listen address).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.udp.iter().filter_map(|s| s.local_addr().ok()).collect()
    }
}

async fn bind_pair(addr: SocketAddr) -> Result<(UdpSocket, TcpListener), Error> {
    let udp_err = |source| Error::Bind { addr, transport: "UDP", source };
    // A free UDP port may be taken for TCP: try a few ports when any will do.
    let tries = if addr.port() == 0 { 16 } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let udp = UdpSocket::bind(addr).await.map_err(udp_err)?;
        let bound = udp.local_addr().map_err(udp_err)?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(source) => last = Some(Error::Bind { addr: bound, transport: "TCP", source }),
        }
    }
    Err(last.unwrap_or(Error::NoListenAddress))
}

/// Answers queries: the cluster's names from the snapshot, the rest upstream.
pub struct Handler {
    records: Snapshot,
    forwarder: Arc<Forwarder>,
}

/// What goes back, before encoding.
struct Reply {
    metadata: Metadata,
    answers: Vec<Record>,
    authority: Vec<Record>,
    additionals: Vec<Record>,
}

impl Reply {
    fn error(metadata: Metadata, rcode: ResponseCode) -> Self {
        let mut metadata = metadata;
        metadata.response_code = rcode;
        Reply { metadata, answers: Vec::new(), authority: Vec::new(), additionals: Vec::new() }
    }
}

impl Handler {
    pub fn new(records: Snapshot, forwarder: Arc<Forwarder>) -> Self {
        Handler { records, forwarder }
    }

    async fn reply(&self, request: &Request) -> Reply {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = true;
        if request.metadata.op_code != OpCode::Query {
            return Reply::error(metadata, ResponseCode::NotImp);
        }
        let Ok(info) = request.request_info() else {
            // Not exactly one question.
            return Reply::error(metadata, ResponseCode::FormErr);
        };
        let query = info.query.original();
        self.resolve(metadata, query.name(), query.query_type(), query.query_class()).await
    }

    /// Follows the name through the record set and, where it leaves the cluster, upstream.
    async fn resolve(&self, mut metadata: Metadata, name: &Name, qtype: RecordType, qclass: DNSClass) -> Reply {
        let mut chain: Vec<Record> = Vec::new();
        let mut current = name.clone();
        for _ in 0..MAX_CNAME_CHAIN {
            let lookup =
                if qclass == DNSClass::IN { self.records.load().lookup(&current, qtype) } else { Lookup::Forward };
            match lookup {
                Lookup::Answer(a) => {
                    metadata.authoritative = true;
                    metadata.response_code = a.rcode;
                    chain.extend(a.answers);
                    return Reply { metadata, answers: chain, authority: a.authority, additionals: a.additionals };
                }
                Lookup::Alias { cname, target } => {
                    metadata.authoritative = true;
                    chain.push(*cname);
                    current = target;
                }
                Lookup::Forward => {
                    return match self.forwarder.resolve(&current, qtype, qclass).await {
                        Ok(up) => {
                            metadata.response_code = up.rcode;
                            chain.extend(up.answers);
                            Reply { metadata, answers: chain, authority: up.authorities, additionals: up.additionals }
                        }
                        // The alias alone, when its target cannot be looked up (CoreDNS's
                        // kubernetes plugin answers the CNAME it has).
                        Err(e) if !chain.is_empty() => {
                            tracing::debug!("the target of {name} could not be resolved upstream: {e}");
                            Reply { metadata, answers: chain, authority: Vec::new(), additionals: Vec::new() }
                        }
                        Err(e) => {
                            tracing::debug!("{name} {qtype} could not be resolved upstream: {e}");
                            Reply::error(metadata, ResponseCode::ServFail)
                        }
                    };
                }
            }
        }
        tracing::debug!("{name}: CNAME chain longer than {MAX_CNAME_CHAIN}");
        Reply::error(metadata, ResponseCode::ServFail)
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let reply = self.reply(request).await;
        let edns = request.edns.as_ref().map(|theirs| {
            let mut e = Edns::new();
            e.set_max_payload(theirs.max_payload().clamp(512, EDNS_PAYLOAD));
            e
        });
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(e) = &edns {
            builder.edns(e);
        }
        let metadata = reply.metadata;
        let message = builder.build(
            metadata,
            reply.answers.iter(),
            reply.authority.iter(),
            std::iter::empty(),
            reply.additionals.iter(),
        );
        match response.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!("sending a DNS answer to {}: {e}", request.src());
                let mut failed = metadata;
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header { metadata: failed, counts: HeaderCounts::default() })
            }
        }
    }
}

/// Serves on `listeners` until `shutdown`.
pub async fn serve(listeners: Listeners, handler: Handler, shutdown: CancellationToken) -> Result<(), Error> {
    let mut server = Server::new(handler);
    for socket in listeners.udp {
        server.register_socket(socket);
    }
    for listener in listeners.tcp {
        server.register_listener(listener, TCP_IDLE, TCP_RESPONSE_BUFFER);
    }
    tokio::select! {
        () = shutdown.cancelled() => server.shutdown_gracefully().await.map_err(|e| Error::Serve(e.to_string())),
        done = server.block_until_done() => match done {
            Ok(()) => Err(Error::Serve("the listeners closed".into())),
            Err(e) => Err(Error::Serve(e.to_string())),
        },
    }
}
