//! Names outside the cluster, asked of the host's resolvers (CoreDNS's `forward . /etc/resolv.conf`
//! with `cache 30`): one fresh query per question over UDP from a random port, retried over TCP when
//! the answer is truncated, the next upstream tried when one does not answer in time; answers kept
//! in a bounded LRU cache for at most 30 s (their own TTL when shorter).

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};

/// The longest an upstream answer is kept (k3s's Corefile `cache 30`).
pub const MAX_CACHE_TTL: u32 = 30;
/// Entries kept (CoreDNS's cache holds 9984 per kind by default).
pub const CACHE_ENTRIES: usize = 10_000;
/// How long one upstream gets before the next is asked (CoreDNS's forward waits up to 2 s per try
/// at first too).
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// The UDP payload we offer upstream and accept (the DNS flag day's 1232).
pub const EDNS_PAYLOAD: u16 = 1232;

/// Why a question could not be answered upstream.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no upstream resolvers are configured")]
    NoUpstreams,
    #[error("encoding a query for {name}: {source}")]
    Encode {
        name: Name,
        #[source]
        source: Box<hickory_server::proto::ProtoError>,
    },
    #[error("asking {server} over {transport}: {source}")]
    Io {
        server: SocketAddr,
        transport: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{server} did not answer within {timeout:?}")]
    Timeout { server: SocketAddr, timeout: Duration },
    #[error("{server} sent an answer that does not parse: {reason}")]
    BadAnswer { server: SocketAddr, reason: String },
    #[error("no upstream answered: {last}")]
    AllFailed {
        #[source]
        last: Box<Error>,
    },
}

/// An upstream's answer, as kept in the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    name: LowerName,
    qtype: RecordType,
    qclass: DNSClass,
}

struct Cached {
    answer: Upstream,
    stored: Instant,
    ttl: u32,
}

/// The forwarder: a list of upstreams tried in turn and the cache of their answers.
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    next: AtomicUsize,
    timeout: Duration,
    cache: Mutex<lru::LruCache<Key, Cached>>,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration, cache_entries: usize) -> Self {
        let entries = NonZeroUsize::new(cache_entries).unwrap_or(NonZeroUsize::MIN);
        Forwarder { upstreams, next: AtomicUsize::new(0), timeout, cache: Mutex::new(lru::LruCache::new(entries)) }
    }

    /// Answers `name`/`qtype` from the cache or the upstreams. Only NOERROR and NXDOMAIN answers
    /// are cached.
    pub async fn resolve(&self, name: &Name, qtype: RecordType, qclass: DNSClass) -> Result<Upstream, Error> {
        let key = Key { name: LowerName::new(name), qtype, qclass };
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        if self.upstreams.is_empty() {
            return Err(Error::NoUpstreams);
        }
        let mut query = Query::query(name.clone(), qtype);
        query.set_query_class(qclass);
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for i in 0..self.upstreams.len() {
            let server = self.upstreams[(start + i) % self.upstreams.len()];
            match exchange(server, &query, self.timeout).await {
                Ok(reply) => {
                    let answer = Upstream {
                        rcode: reply.metadata.response_code,
                        answers: reply.answers,
                        authorities: reply.authorities,
                        additionals: reply.additionals,
                    };
                    self.store(key, &answer);
                    return Ok(answer);
                }
                Err(e) => {
                    tracing::debug!("upstream resolver did not answer: {e}");
                    last = Some(e);
                }
            }
        }
        Err(Error::AllFailed { last: Box::new(last.unwrap_or(Error::NoUpstreams)) })
    }

    fn cached(&self, key: &Key) -> Option<Upstream> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let entry = cache.get(key)?;
        let age = u32::try_from(entry.stored.elapsed().as_secs()).unwrap_or(u32::MAX);
        if age >= entry.ttl {
            cache.pop(key);
            return None;
        }
        // The TTLs count down while the answer sits in the cache.
        let mut answer = entry.answer.clone();
        for r in answer.answers.iter_mut().chain(&mut answer.authorities).chain(&mut answer.additionals) {
            r.ttl = r.ttl.saturating_sub(age);
        }
        Some(answer)
    }

    fn store(&self, key: Key, answer: &Upstream) {
        let ttl = match answer.rcode {
            ResponseCode::NoError | ResponseCode::NXDomain => cache_ttl(answer),
            _ => 0,
        };
        if ttl == 0 {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.put(key, Cached { answer: answer.clone(), stored: Instant::now(), ttl });
    }
}

/// How long an answer may be cached: its smallest answer TTL, or for a negative answer the SOA's
/// (RFC 2308: the smaller of its TTL and its minimum), at most [`MAX_CACHE_TTL`].
fn cache_ttl(answer: &Upstream) -> u32 {
    let ttl = if answer.answers.is_empty() {
        answer.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
            _ => None,
        })
    } else {
        answer.answers.iter().map(|r| r.ttl).min()
    };
    ttl.unwrap_or(0).min(MAX_CACHE_TTL)
}

/// Asks `server` one question: UDP first, TCP when the answer is truncated.
pub async fn exchange(server: SocketAddr, query: &Query, timeout: Duration) -> Result<Message, Error> {
    let mut msg = Message::query();
    msg.metadata.recursion_desired = true;
    msg.add_query(query.clone());
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    msg.set_edns(edns);
    let reply = exchange_udp(server, &msg, timeout).await?;
    if reply.metadata.truncation { exchange_tcp(server, &msg, timeout).await } else { Ok(reply) }
}

fn encode(msg: &Message) -> Result<Vec<u8>, Error> {
    msg.to_vec().map_err(|source| Error::Encode {
        name: msg.queries.first().map(|q| q.name().clone()).unwrap_or_default(),
        source: Box::new(source),
    })
}

/// Whether `reply` answers `msg` (same ID and question), as a resolver checks before trusting it.
fn answers(msg: &Message, reply: &Message) -> bool {
    reply.metadata.id == msg.metadata.id && reply.metadata.message_type == MessageType::Response && {
        let same = |a: &Query, b: &Query| {
            a.query_type() == b.query_type() && LowerName::new(a.name()) == LowerName::new(b.name())
        };
        reply.queries.len() == msg.queries.len() && reply.queries.iter().zip(&msg.queries).all(|(a, b)| same(a, b))
    }
}

/// Sends `msg` over UDP from a fresh random port and waits for its answer; stray datagrams are
/// ignored.
pub async fn exchange_udp(server: SocketAddr, msg: &Message, timeout: Duration) -> Result<Message, Error> {
    let io = |source| Error::Io { server, transport: "UDP", source };
    let bytes = encode(msg)?;
    let bind: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let work = async {
        let socket = UdpSocket::bind(bind).await.map_err(io)?;
        socket.connect(server).await.map_err(io)?;
        socket.send(&bytes).await.map_err(io)?;
        let mut buf = vec![0u8; 65_535];
        loop {
            let n = socket.recv(&mut buf).await.map_err(io)?;
            match Message::from_vec(&buf[..n]) {
                Ok(reply) if answers(msg, &reply) => return Ok(reply),
                _ => continue,
            }
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| Error::Timeout { server, timeout })?
}

/// Sends `msg` over TCP (two-byte length prefix) and reads its answer.
pub async fn exchange_tcp(server: SocketAddr, msg: &Message, timeout: Duration) -> Result<Message, Error> {
    let io = |source| Error::Io { server, transport: "TCP", source };
    let bytes = encode(msg)?;
    let len = u16::try_from(bytes.len()).map_err(|_| Error::BadAnswer { server, reason: "query too long".into() })?;
    let work = async {
        let mut stream = TcpStream::connect(server).await.map_err(io)?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&bytes);
        stream.write_all(&framed).await.map_err(io)?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.map_err(io)?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).await.map_err(io)?;
        let reply = Message::from_vec(&buf).map_err(|e| Error::BadAnswer { server, reason: e.to_string() })?;
        if answers(msg, &reply) {
            Ok(reply)
        } else {
            Err(Error::BadAnswer { server, reason: "the answer is for another question".into() })
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| Error::Timeout { server, timeout })?
}

/// A query message for `name`/`qtype` with a random ID (for tests and the benchmark as a client).
#[cfg_attr(not(test), allow(dead_code))]
pub fn query_message(name: &Name, qtype: RecordType) -> Message {
    let mut msg = Message::query();
    msg.metadata.op_code = OpCode::Query;
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name.clone(), qtype));
    msg
}

#[cfg(test)]
mod tests {
    use hickory_server::proto::rr::rdata::{A, SOA};

    use super::*;

    fn record(ttl: u32, data: RData) -> Record {
        Record::from_rdata(Name::from_ascii("x.example.").expect("name"), ttl, data)
    }

    #[test]
    fn cache_ttl_is_the_smallest_and_at_most_30s() {
        let a = |ttl| record(ttl, RData::A(A::new(192, 0, 2, 1)));
        let up =
            |answers, authorities| Upstream { rcode: ResponseCode::NoError, answers, authorities, additionals: vec![] };
        assert_eq!(cache_ttl(&up(vec![a(300), a(20)], vec![])), 20);
        assert_eq!(cache_ttl(&up(vec![a(3600)], vec![])), MAX_CACHE_TTL);
        let root = Name::root();
        let soa = |ttl, min| record(ttl, RData::SOA(SOA::new(root.clone(), root.clone(), 1, 1, 1, 1, min)));
        assert_eq!(cache_ttl(&up(vec![], vec![soa(900, 10)])), 10);
        assert_eq!(cache_ttl(&up(vec![], vec![soa(4, 10)])), 4);
        assert_eq!(cache_ttl(&up(vec![], vec![])), 0);
    }

    #[tokio::test]
    async fn no_upstreams_is_an_error_and_dead_ones_time_out() {
        let name = Name::from_ascii("example.com.").expect("name");
        let f = Forwarder::new(vec![], UPSTREAM_TIMEOUT, 10);
        assert!(matches!(f.resolve(&name, RecordType::A, DNSClass::IN).await, Err(Error::NoUpstreams)));
        // A loopback port nobody answers on: refused or timed out, never a hang.
        let silent = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let addr = silent.local_addr().expect("addr");
        let f = Forwarder::new(vec![addr], Duration::from_millis(200), 10);
        assert!(matches!(f.resolve(&name, RecordType::A, DNSClass::IN).await, Err(Error::AllFailed { .. })));
    }
}
