//! SPDY/3.1 framing, as far as Kubernetes' streaming protocols use it (moby/spdystream, which
//! client-go, kubelet and containerd's CRI streaming server speak): control frames, data frames
//! and zlib-compressed header blocks. Written here because no maintained Rust crate speaks SPDY;
//! the wire format is the SPDY/3.1 draft's.

use std::io;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::spdy_dictionary::DICTIONARY;

const VERSION: u16 = 3;
/// The largest frame accepted (spdystream's `MaxDataLength` is 16 MiB, the 24-bit length's limit).
const MAX_FRAME: usize = (1 << 24) - 1;
/// The most a header block may inflate to.
const MAX_HEADERS: usize = 1 << 20;

pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

pub type Headers = Vec<(String, String)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    Headers {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last_stream: u32,
        status: u32,
    },
    /// SETTINGS and WINDOW_UPDATE: read and dropped (spdystream neither enforces nor expects flow control).
    Ignored,
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("reading SPDY frames: {0}")]
    Io(#[from] io::Error),
    #[error("invalid SPDY frame: {0}")]
    Invalid(String),
}

fn invalid(m: impl Into<String>) -> SpdyError {
    SpdyError::Invalid(m.into())
}

/// The sending half of a connection's header compression (SPDY keeps one zlib stream per
/// direction for the whole connection, primed with the SPDY/3 dictionary).
pub struct Encoder {
    deflate: Compress,
}

/// The receiving half.
pub struct Decoder {
    inflate: Decompress,
}

impl Default for Encoder {
    fn default() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // The dictionary is a constant; setting it cannot fail on a fresh stream.
        let _ = deflate.set_dictionary(DICTIONARY);
        Encoder { deflate }
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder { inflate: Decompress::new(true) }
    }
}

impl Encoder {
    fn encode_headers(&mut self, headers: &[(String, String)]) -> Bytes {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (name, value) in headers {
            raw.put_u32(name.len() as u32);
            raw.put_slice(name.to_ascii_lowercase().as_bytes());
            raw.put_u32(value.len() as u32);
            raw.put_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input: &[u8] = &raw;
        loop {
            out.reserve(256);
            let before = self.deflate.total_in();
            // Writing into a Vec cannot fail; a stalled stream is retried with more room.
            let _ = self.deflate.compress_vec(input, &mut out, FlushCompress::Sync);
            input = &input[(self.deflate.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        out.into()
    }

    /// The frame's bytes on the wire.
    pub fn encode(&mut self, frame: &Frame) -> Bytes {
        let mut out = BytesMut::new();
        let control = |out: &mut BytesMut, kind: u16, flags: u8, body: &[u8]| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32((u32::from(flags) << 24) | body.len() as u32);
            out.put_slice(body);
        };
        let fin = |f: bool| if f { FLAG_FIN } else { 0 };
        match frame {
            Frame::Data { stream, fin: f, data } => {
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u32((u32::from(fin(*f)) << 24) | data.len() as u32);
                out.put_slice(data);
            }
            Frame::SynStream { stream, fin: f, headers } => {
                let mut body = BytesMut::new();
                body.put_u32(*stream);
                body.put_u32(0); // associated-to stream
                body.put_u16(0); // priority and slot
                body.put_slice(&self.encode_headers(headers));
                control(&mut out, SYN_STREAM, fin(*f), &body);
            }
            Frame::SynReply { stream, fin: f, headers } | Frame::Headers { stream, fin: f, headers } => {
                let kind = if matches!(frame, Frame::SynReply { .. }) { SYN_REPLY } else { HEADERS };
                let mut body = BytesMut::new();
                body.put_u32(*stream);
                body.put_slice(&self.encode_headers(headers));
                control(&mut out, kind, fin(*f), &body);
            }
            Frame::RstStream { stream, status } => {
                control(&mut out, RST_STREAM, 0, &[stream.to_be_bytes(), status.to_be_bytes()].concat())
            }
            Frame::Ping(id) => control(&mut out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_stream, status } => {
                control(&mut out, GOAWAY, 0, &[last_stream.to_be_bytes(), status.to_be_bytes()].concat())
            }
            Frame::Ignored => {}
        }
        out.freeze()
    }
}

impl Decoder {
    fn decode_headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let mut raw = Vec::with_capacity(block.len() * 4);
        let mut input = block;
        loop {
            raw.reserve(1024);
            let before = self.inflate.total_in();
            match self.inflate.decompress_vec(input, &mut raw, FlushDecompress::Sync) {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate.set_dictionary(DICTIONARY).map_err(|e| invalid(format!("header dictionary: {e}")))?;
                }
                Err(e) => return Err(invalid(format!("header block: {e}"))),
            }
            input = &input[(self.inflate.total_in() - before) as usize..];
            if raw.len() > MAX_HEADERS {
                return Err(invalid("header block too large"));
            }
            if input.is_empty() && raw.len() < raw.capacity() {
                break;
            }
        }
        let mut buf = Bytes::from(raw);
        let take = |buf: &mut Bytes| -> Result<String, SpdyError> {
            let n = read_u32(buf)? as usize;
            if buf.len() < n {
                return Err(invalid("truncated header block"));
            }
            String::from_utf8(buf.split_to(n).to_vec()).map_err(|_| invalid("header is not UTF-8"))
        };
        let count = read_u32(&mut buf)?;
        let mut headers = Vec::new();
        for _ in 0..count {
            let name = take(&mut buf)?;
            let value = take(&mut buf)?;
            headers.push((name, value));
        }
        Ok(headers)
    }

    /// Reads the next frame; `None` at a clean end of the connection.
    pub async fn read<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> Result<Option<Frame>, SpdyError> {
        let mut head = [0u8; 8];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        if len > MAX_FRAME {
            return Err(invalid("frame too large"));
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).await?;
        let mut body = Bytes::from(body);
        let fin = flags & FLAG_FIN != 0;
        if word & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data { stream: word, fin, data: body }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(invalid(format!("SPDY version {version}, not 3")));
        }
        let frame = match (word & 0xffff) as u16 {
            SYN_STREAM => {
                let stream = read_u32(&mut body)? & 0x7fff_ffff;
                if body.len() < 6 {
                    return Err(invalid("short SYN_STREAM"));
                }
                body.advance(6);
                Frame::SynStream { stream, fin, headers: self.decode_headers(&body)? }
            }
            kind @ (SYN_REPLY | HEADERS) => {
                let stream = read_u32(&mut body)? & 0x7fff_ffff;
                let headers = self.decode_headers(&body)?;
                if kind == SYN_REPLY {
                    Frame::SynReply { stream, fin, headers }
                } else {
                    Frame::Headers { stream, fin, headers }
                }
            }
            RST_STREAM => Frame::RstStream { stream: read_u32(&mut body)? & 0x7fff_ffff, status: read_u32(&mut body)? },
            PING => Frame::Ping(read_u32(&mut body)?),
            GOAWAY => Frame::GoAway { last_stream: read_u32(&mut body)? & 0x7fff_ffff, status: read_u32(&mut body)? },
            SETTINGS | WINDOW_UPDATE => Frame::Ignored,
            _ => Frame::Ignored,
        };
        Ok(Some(frame))
    }
}

fn read_u32(buf: &mut Bytes) -> Result<u32, SpdyError> {
    if buf.len() < 4 {
        return Err(invalid("truncated frame"));
    }
    Ok(buf.get_u32())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let (mut tx, mut rx) = (Encoder::default(), Decoder::default());
        let mut wire = Vec::new();
        for f in frames {
            wire.extend_from_slice(&tx.encode(f));
        }
        let mut r = &wire[..];
        let mut out = Vec::new();
        while let Some(f) = rx.read(&mut r).await.expect("frame") {
            out.push(f);
        }
        out
    }

    #[tokio::test]
    async fn frames_round_trip_through_one_compression_context() {
        let h = |t: &str| vec![("streamtype".to_string(), t.to_string())];
        let frames = vec![
            Frame::SynStream { stream: 1, fin: false, headers: h("error") },
            Frame::SynStream { stream: 3, fin: false, headers: h("stdout") },
            Frame::SynReply { stream: 1, fin: false, headers: vec![] },
            Frame::Data { stream: 3, fin: false, data: Bytes::from_static(b"hello") },
            Frame::Data { stream: 3, fin: true, data: Bytes::new() },
            Frame::Headers { stream: 3, fin: false, headers: h("x") },
            Frame::RstStream { stream: 3, status: 5 },
            Frame::Ping(7),
            Frame::GoAway { last_stream: 3, status: 0 },
        ];
        assert_eq!(round_trip(&frames).await, frames);
    }

    #[test]
    fn the_dictionary_is_the_drafts() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.starts_with(b"\x00\x00\x00\x07options"));
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }

    #[tokio::test]
    async fn a_truncated_or_foreign_frame_is_an_error() {
        let mut c = Encoder::default();
        let wire = c.encode(&Frame::Ping(1));
        let mut r = &wire[..wire.len() - 1];
        assert!(Decoder::default().read(&mut r).await.is_err());
        let mut v2 = wire.to_vec();
        v2[1] = 2;
        assert!(matches!(Decoder::default().read(&mut &v2[..]).await, Err(SpdyError::Invalid(_))));
    }
}
