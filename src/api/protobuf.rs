//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`), turned into the
//! JSON form of the object they hold.
//!
//! A body is the magic `k8s\0` followed by a `runtime.Unknown` envelope: the object's apiVersion and
//! kind, and `raw`, the object's own protobuf encoding. Field numbers, wire types and JSON names come
//! from a table that `build.rs` generates from the `k8s-pb` and `k8s-openapi` crates; this module
//! walks the wire format with it. Unknown field numbers, such as fields newer than the `k8s-pb`
//! release, are skipped.
//!
//! Go writes every non-pointer field, so empty strings and bytes outside lists and maps are dropped
//! (Go reads them as unset), while `false` and `0` are kept (they may be explicit pointer values).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Number, Value};

pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";
/// How deep messages may nest.
const MAX_DEPTH: usize = 64;

/// Why a body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the protobuf body does not start with the Kubernetes protobuf magic bytes \"k8s\\0\"")]
    Magic,
    #[error("the protobuf body is truncated at byte {0}")]
    Truncated(usize),
    #[error("the protobuf body is malformed at byte {at}: {reason}")]
    Malformed { at: usize, reason: String },
    #[error("the protobuf body names no kind in its envelope")]
    NoKind,
    #[error("the protobuf body holds {0}, which this server does not decode")]
    UnknownKind(String),
    #[error("the protobuf body wraps its object as {0}, which this server does not decode")]
    Wrapping(String),
    #[error("the protobuf body nests objects more than {MAX_DEPTH} levels deep")]
    TooDeep,
}

/// Decodes a Kubernetes protobuf request body into the object's JSON form, with apiVersion and kind
/// set from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    if !body.starts_with(MAGIC) {
        return Err(Error::Magic);
    }
    envelope(Reader { body, pos: MAGIC.len(), end: body.len() }, 0)
}

/// A message of the generated table.
struct Message {
    /// For errors, e.g. `core/v1 Pod`.
    name: &'static str,
    shape: Shape,
}

/// How a message becomes JSON. Numbers are the field numbers it reads.
enum Shape {
    /// An object of its fields, sorted by number.
    Object(&'static [Field]),
    /// `{seconds, nanos}` as an RFC 3339 string, with microseconds for `MicroTime`.
    Time { seconds: u32, nanos: u32, micros: bool },
    /// Nanoseconds as a Go duration string such as `1h0m0s`.
    #[allow(dead_code, reason = "no decoded kind has a duration yet")]
    Duration { nanos: u32 },
    /// A resource quantity's string.
    Quantity { string: u32 },
    /// A number or a string, as `kind` says.
    IntOrString { kind: u32, int: u32, string: u32 },
    /// Embedded JSON (or a nested protobuf body).
    RawJson { raw: u32 },
    /// A Go slice type wrapped in a message, as an array of strings.
    List { items: u32 },
}

struct Field {
    number: u32,
    /// Empty for an embedded (`Card::Inline`) message.
    json: &'static str,
    ty: Ty,
    card: Card,
}

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bytes,
    Bool,
    Int32,
    Int64,
    #[allow(dead_code, reason = "no decoded kind has a double yet")]
    Double,
    Message(u16),
}

#[derive(Clone, Copy)]
enum Card {
    Single,
    Repeated,
    /// A map with string keys; `ty` is the value type.
    Map,
    /// A message whose fields belong to the enclosing object.
    Inline,
}

/// A kind a body may hold; `api_version: None` matches any.
struct Kind {
    api_version: Option<&'static str>,
    kind: &'static str,
    message: u16,
}

/// Field numbers of `runtime.Unknown` and of its `runtime.TypeMeta`.
struct Envelope {
    type_meta: u32,
    raw: u32,
    content_encoding: u32,
    content_type: u32,
    api_version: u32,
    kind: u32,
}

mod table {
    use super::{Card, Envelope, Field, Kind, Message, Shape, Ty};

    include!(concat!(env!("OUT_DIR"), "/protobuf_table.rs"));
}

/// A window `pos..end` of the body; positions are offsets into the whole body, for errors.
#[derive(Clone, Copy)]
struct Reader<'a> {
    body: &'a [u8],
    pos: usize,
    end: usize,
}

/// A field's value as the wire format carries it.
#[derive(Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(Reader<'a>),
    Fixed32,
}

/// One field read from the wire, starting at byte `at`.
struct Item<'a> {
    number: u32,
    at: usize,
    wire: Wire<'a>,
}

/// A message and field name, for errors.
#[derive(Clone, Copy)]
struct Site(&'static str, &'static str);

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} field {}", self.0, self.1)
    }
}

fn malformed(at: usize, reason: impl Into<String>) -> Error {
    Error::Malformed { at, reason: reason.into() }
}

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn bytes(&self) -> &'a [u8] {
        self.body.get(self.pos..self.end).unwrap_or_default()
    }

    fn take(&mut self, n: usize) -> Result<Reader<'a>, Error> {
        let Some(end) = self.pos.checked_add(n).filter(|&end| end <= self.end) else {
            return Err(if self.end == self.body.len() {
                Error::Truncated(self.body.len())
            } else {
                malformed(self.pos, format!("{n} bytes run past the end of the enclosing message at byte {}", self.end))
            });
        };
        let taken = Reader { end, ..*self };
        self.pos = end;
        Ok(taken)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let at = self.pos;
        self.take(N)?.bytes().try_into().map_err(|_| malformed(at, "a fixed-size value is cut short"))
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let at = self.pos;
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let [byte] = self.fixed()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(malformed(at, "a varint is longer than 10 bytes"))
    }

    /// The next field, or `None` at the end of the window.
    fn next(&mut self) -> Result<Option<Item<'a>>, Error> {
        if self.is_empty() {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        let Some(number) = u32::try_from(key >> 3).ok().filter(|&n| n > 0) else {
            return Err(malformed(at, format!("invalid field number {}", key >> 3)));
        };
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => Wire::Fixed64(u64::from_le_bytes(self.fixed()?)),
            2 => {
                let len = self.varint()?;
                Wire::Len(self.take(usize::try_from(len).unwrap_or(usize::MAX))?)
            }
            5 => {
                self.fixed::<4>()?;
                Wire::Fixed32
            }
            3 | 4 => return Err(malformed(at, "protobuf groups are not part of Kubernetes protobuf")),
            other => return Err(malformed(at, format!("invalid wire type {other}"))),
        };
        Ok(Some(Item { number, at, wire }))
    }
}

impl<'a> Item<'a> {
    fn mismatch(&self, site: Site, expected: &str) -> Error {
        let found = match self.wire {
            Wire::Varint(_) => "a varint",
            Wire::Fixed64(_) => "a 64-bit value",
            Wire::Len(_) => "a length-delimited value",
            Wire::Fixed32 => "a 32-bit value",
        };
        malformed(self.at, format!("{site} holds {found}, not {expected}"))
    }

    fn len(&self, site: Site) -> Result<Reader<'a>, Error> {
        match self.wire {
            Wire::Len(r) => Ok(r),
            _ => Err(self.mismatch(site, "a length-delimited value")),
        }
    }

    fn varint(&self, site: Site) -> Result<u64, Error> {
        match self.wire {
            Wire::Varint(v) => Ok(v),
            _ => Err(self.mismatch(site, "a varint")),
        }
    }

    fn text(&self, site: Site) -> Result<&'a str, Error> {
        let r = self.len(site)?;
        std::str::from_utf8(r.bytes()).map_err(|_| malformed(r.pos, format!("{site} is not valid UTF-8")))
    }
}

/// Reads a `runtime.Unknown` envelope and the object inside it.
fn envelope(mut r: Reader, depth: usize) -> Result<Value, Error> {
    let e = &table::ENVELOPE;
    let site = |field| Site("runtime.Unknown", field);
    let (mut api_version, mut kind, mut encoding, mut content_type, mut raw) = ("", "", "", "", None);
    while let Some(item) = r.next()? {
        if item.number == e.type_meta {
            let mut meta = item.len(site("typeMeta"))?;
            while let Some(item) = meta.next()? {
                if item.number == e.api_version {
                    api_version = item.text(site("typeMeta.apiVersion"))?;
                } else if item.number == e.kind {
                    kind = item.text(site("typeMeta.kind"))?;
                }
            }
        } else if item.number == e.raw {
            raw = Some(item.len(site("raw"))?);
        } else if item.number == e.content_encoding {
            encoding = item.text(site("contentEncoding"))?;
        } else if item.number == e.content_type {
            content_type = item.text(site("contentType"))?;
        }
    }
    if kind.is_empty() {
        return Err(Error::NoKind);
    }
    if !encoding.is_empty() {
        return Err(Error::Wrapping(format!("content encoding {encoding:?}")));
    }
    if !content_type.is_empty() && content_type != MEDIA_TYPE {
        return Err(Error::Wrapping(format!("content type {content_type:?}")));
    }
    let found = table::KINDS.iter().find(|k| k.kind == kind && k.api_version.is_none_or(|v| v == api_version));
    let Some(Message { name, shape: Shape::Object(fields) }) = found.map(|k| &table::MESSAGES[usize::from(k.message)])
    else {
        let group_version = match api_version {
            "" => String::new(),
            v if v.contains('/') => format!("{v} "),
            v => format!("core/{v} "),
        };
        return Err(Error::UnknownKind(format!("{group_version}{kind}")));
    };
    let mut object = Map::new();
    object.insert("apiVersion".into(), api_version.into());
    object.insert("kind".into(), kind.into());
    if let Some(raw) = raw {
        fill(&mut object, name, fields, raw, depth + 1)?;
    }
    Ok(Value::Object(object))
}

/// Decodes the fields of message `name` into `object`.
fn fill(
    object: &mut Map<String, Value>,
    name: &'static str,
    fields: &'static [Field],
    mut r: Reader,
    depth: usize,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::TooDeep);
    }
    while let Some(item) = r.next()? {
        let Ok(i) = fields.binary_search_by_key(&item.number, |f| f.number) else { continue };
        let field = &fields[i];
        let site = Site(name, if field.json.is_empty() { "(embedded)" } else { field.json });
        match field.card {
            Card::Single => match value(field.ty, &item, site, depth, false)? {
                Some(v) => drop(object.insert(field.json.into(), v)),
                None => drop(object.shift_remove(field.json)),
            },
            Card::Inline => {
                if let Ty::Message(m) = field.ty
                    && let Message { name, shape: Shape::Object(fields) } = &table::MESSAGES[usize::from(m)]
                {
                    fill(object, name, fields, item.len(site)?, depth + 1)?;
                }
            }
            Card::Repeated => {
                let packed = matches!(field.ty, Ty::Bool | Ty::Int32 | Ty::Int64 | Ty::Double);
                let Some(list) = slot(object, field.json, Value::Array(Vec::new())).as_array_mut() else { continue };
                match item.wire {
                    Wire::Len(mut r) if packed => {
                        while !r.is_empty() {
                            let (number, at) = (item.number, r.pos);
                            let wire = match field.ty {
                                Ty::Double => Wire::Fixed64(u64::from_le_bytes(r.fixed()?)),
                                _ => Wire::Varint(r.varint()?),
                            };
                            list.extend(value(field.ty, &Item { number, at, wire }, site, depth, true)?);
                        }
                    }
                    _ => list.push(value(field.ty, &item, site, depth, true)?.unwrap_or(Value::Null)),
                }
            }
            Card::Map => {
                let (mut entry, mut key, mut val) = (item.len(site)?, "", None);
                while let Some(part) = entry.next()? {
                    match part.number {
                        1 => key = part.text(site)?,
                        2 => val = Some(value(field.ty, &part, site, depth, true)?.unwrap_or(Value::Null)),
                        _ => {}
                    }
                }
                let val = match (val, field.ty) {
                    (Some(v), _) => v,
                    (None, Ty::Message(m)) => message(m, entry, depth + 1)?,
                    (None, Ty::Str | Ty::Bytes) => Value::from(""),
                    (None, Ty::Bool) => Value::Bool(false),
                    (None, Ty::Int32 | Ty::Int64 | Ty::Double) => Value::from(0),
                };
                if let Some(map) = slot(object, field.json, Value::Object(Map::new())).as_object_mut() {
                    map.insert(key.into(), val);
                }
            }
        }
    }
    Ok(())
}

/// The value at `key`, set to `empty` unless it is already of the same JSON type.
fn slot<'m>(object: &'m mut Map<String, Value>, key: &str, empty: Value) -> &'m mut Value {
    let slot = object.entry(key).or_insert(Value::Null);
    if std::mem::discriminant(slot) != std::mem::discriminant(&empty) {
        *slot = empty;
    }
    slot
}

/// One value of type `ty`; `None` when it is to be left out. Empty strings and bytes are kept only
/// where `keep_empty` (list items and map values).
fn value(ty: Ty, item: &Item, site: Site, depth: usize, keep_empty: bool) -> Result<Option<Value>, Error> {
    Ok(match ty {
        Ty::Str => Some(item.text(site)?).filter(|s| keep_empty || !s.is_empty()).map(Value::from),
        Ty::Bytes => {
            Some(item.len(site)?.bytes()).filter(|b| keep_empty || !b.is_empty()).map(|b| BASE64.encode(b).into())
        }
        Ty::Bool => Some(Value::Bool(item.varint(site)? != 0)),
        Ty::Int32 => Some(Value::from(item.varint(site)? as i32)),
        Ty::Int64 => Some(Value::from(item.varint(site)? as i64)),
        Ty::Double => match item.wire {
            Wire::Fixed64(bits) => {
                let number = Number::from_f64(f64::from_bits(bits));
                Some(Value::Number(number.ok_or_else(|| malformed(item.at, format!("{site} is not a finite number")))?))
            }
            _ => return Err(item.mismatch(site, "a 64-bit value")),
        },
        Ty::Message(m) => Some(message(m, item.len(site)?, depth + 1)?).filter(|v| !v.is_null()),
    })
}

/// Decodes message `m` of the table; `Value::Null` where Go writes `null` (a zero time, no raw JSON).
fn message(m: u16, mut r: Reader, depth: usize) -> Result<Value, Error> {
    if depth > MAX_DEPTH {
        return Err(Error::TooDeep);
    }
    let Message { name, shape } = &table::MESSAGES[usize::from(m)];
    let site = |field| Site(name, field);
    let start = r.pos;
    Ok(match *shape {
        Shape::Object(fields) => {
            let mut object = Map::new();
            fill(&mut object, name, fields, r, depth)?;
            Value::Object(object)
        }
        Shape::Time { seconds, nanos, micros } => {
            let (mut s, mut n) = (None, 0);
            while let Some(item) = r.next()? {
                if item.number == seconds {
                    s = Some(item.varint(site("seconds"))? as i64);
                } else if item.number == nanos {
                    n = item.varint(site("nanos"))? as i32;
                }
            }
            match (s, n) {
                (None | Some(GO_ZERO_TIME), 0) => Value::Null,
                (s, n) => time(s.unwrap_or_default(), n, micros)
                    .ok_or_else(|| malformed(start, format!("{name} is out of range")))?,
            }
        }
        Shape::Duration { nanos } => {
            let mut d = 0;
            while let Some(item) = r.next()? {
                if item.number == nanos {
                    d = item.varint(site("duration"))? as i64;
                }
            }
            Value::String(go_duration(d))
        }
        Shape::Quantity { string } => {
            let mut q = "";
            while let Some(item) = r.next()? {
                if item.number == string {
                    q = item.text(site("string"))?;
                }
            }
            Value::from(if q.is_empty() { "0" } else { q })
        }
        Shape::IntOrString { kind, int, string } => {
            let (mut is_string, mut i, mut s) = (false, 0, "");
            while let Some(item) = r.next()? {
                if item.number == kind {
                    is_string = item.varint(site("type"))? == 1;
                } else if item.number == int {
                    i = item.varint(site("intVal"))? as i32;
                } else if item.number == string {
                    s = item.text(site("strVal"))?;
                }
            }
            if is_string { Value::from(s) } else { Value::from(i) }
        }
        Shape::RawJson { raw } => {
            let mut bytes = None;
            while let Some(item) = r.next()? {
                if item.number == raw {
                    bytes = Some(item.len(site("raw"))?);
                }
            }
            match bytes {
                None => Value::Null,
                Some(b) if b.is_empty() => Value::Null,
                Some(b) if b.bytes().starts_with(MAGIC) => {
                    envelope(Reader { pos: b.pos + MAGIC.len(), ..b }, depth + 1)?
                }
                Some(b) => serde_json::from_slice(b.bytes())
                    .map_err(|e| malformed(b.pos, format!("{name} holds neither JSON nor Kubernetes protobuf: {e}")))?,
            }
        }
        Shape::List { items } => {
            let mut list = Vec::new();
            while let Some(item) = r.next()? {
                if item.number == items {
                    list.push(Value::from(item.text(site("items"))?));
                }
            }
            Value::Array(list)
        }
    })
}

/// Go's zero `time.Time` in Unix seconds, which Go writes as `null`.
const GO_ZERO_TIME: i64 = -62_135_596_800;

/// RFC 3339 in UTC, as Go's `metav1.Time` (whole seconds) and `metav1.MicroTime` write it.
fn time(seconds: i64, nanos: i32, micros: bool) -> Option<Value> {
    let t = chrono::DateTime::from_timestamp(seconds, u32::try_from(nanos).ok().filter(|&n| n < 1_000_000_000)?)?;
    if !(0..=9999).contains(&chrono::Datelike::year(&t)) {
        return None;
    }
    let format = if micros { "%Y-%m-%dT%H:%M:%S%.6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" };
    Some(Value::String(t.format(format).to_string()))
}

/// Formats nanoseconds as Go's `time.Duration.String` does: `1h2m3.5s`, `1.5ms`, `0s`.
fn go_duration(nanos: i64) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let u = nanos.unsigned_abs();
    let frac = |v: u64, digits: usize| {
        if v == 0 { String::new() } else { format!(".{v:0digits$}").trim_end_matches('0').to_string() }
    };
    let body = match u {
        0 => return "0s".into(),
        1..1_000 => format!("{u}ns"),
        1_000..1_000_000 => format!("{}{}µs", u / 1_000, frac(u % 1_000, 3)),
        1_000_000..1_000_000_000 => format!("{}{}ms", u / 1_000_000, frac(u % 1_000_000, 6)),
        _ => {
            let (secs, frac) = (u / 1_000_000_000, frac(u % 1_000_000_000, 9));
            let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            match (h, m) {
                (0, 0) => format!("{s}{frac}s"),
                (0, m) => format!("{m}m{s}{frac}s"),
                (h, m) => format!("{h}h{m}m{s}{frac}s"),
            }
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const META: &str = "meta/v1 ObjectMeta";

    // Wire-format builders; field numbers come from the generated table by JSON name.

    fn fields(message: &str) -> &'static [Field] {
        let found = table::MESSAGES.iter().find_map(|m| match m.shape {
            Shape::Object(fields) if m.name == message => Some(fields),
            _ => None,
        });
        found.unwrap_or_else(|| panic!("no message {message}"))
    }

    fn shape(message: &str) -> &'static Shape {
        &table::MESSAGES.iter().find(|m| m.name == message).unwrap_or_else(|| panic!("no message {message}")).shape
    }

    fn num(message: &str, json: &str) -> u32 {
        let field = fields(message).iter().find(|f| f.json == json);
        field.unwrap_or_else(|| panic!("{message} has no field {json}")).number
    }

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn ld(number: u32, bytes: impl AsRef<[u8]>) -> Vec<u8> {
        let bytes = bytes.as_ref();
        [varint(u64::from(number) << 3 | 2), varint(bytes.len() as u64), bytes.to_vec()].concat()
    }

    fn vi(number: u32, v: i64) -> Vec<u8> {
        [varint(u64::from(number) << 3), varint(v as u64)].concat()
    }

    /// Field `json` of `message`, length-delimited.
    fn lf(message: &str, json: &str, bytes: impl AsRef<[u8]>) -> Vec<u8> {
        ld(num(message, json), bytes)
    }

    /// Field `json` of `message`, a varint.
    fn vf(message: &str, json: &str, v: i64) -> Vec<u8> {
        vi(num(message, json), v)
    }

    /// An entry of map field `json` of `message`.
    fn entry(message: &str, json: &str, key: &str, value: impl AsRef<[u8]>) -> Vec<u8> {
        lf(message, json, [ld(1, key), ld(2, value)].concat())
    }

    fn time(message: &str, s: i64, n: i64) -> Vec<u8> {
        let Shape::Time { seconds, nanos, .. } = *shape(message) else { panic!("{message} is no time") };
        [vi(seconds, s), vi(nanos, n)].concat()
    }

    fn quantity(q: &str) -> Vec<u8> {
        let Shape::Quantity { string } = *shape("resource Quantity") else { panic!("no quantity") };
        ld(string, q)
    }

    fn int_or_string(v: Result<i64, &str>) -> Vec<u8> {
        let Shape::IntOrString { kind, int, string } = *shape("intstr IntOrString") else { panic!("no intstr") };
        match v {
            Ok(i) => [vi(kind, 0), vi(int, i), ld(string, "")].concat(),
            Err(s) => [vi(kind, 1), vi(int, 0), ld(string, s)].concat(),
        }
    }

    fn body(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let e = &table::ENVELOPE;
        let type_meta = [ld(e.api_version, api_version), ld(e.kind, kind)].concat();
        [MAGIC.to_vec(), ld(e.type_meta, type_meta), ld(e.raw, raw), ld(e.content_encoding, ""), ld(e.content_type, "")]
            .concat()
    }

    /// Object metadata as Go writes it: every string field, empty or not.
    fn meta(name: &str, namespace: &str) -> Vec<u8> {
        [
            lf(META, "name", name),
            lf(META, "generateName", ""),
            lf(META, "namespace", namespace),
            vf(META, "generation", 0),
        ]
        .concat()
    }

    #[test]
    fn config_map() {
        const CM: &str = "core/v1 ConfigMap";
        let raw = [
            lf(
                CM,
                "metadata",
                [meta("c", "x"), entry(META, "labels", "app", "web"), lf(META, "creationTimestamp", "")].concat(),
            ),
            entry(CM, "data", "a", "b"),
            entry(CM, "data", "empty", ""),
            entry(CM, "binaryData", "bin", [0, 1, 2, 0xff]),
            vf(CM, "immutable", 0),
        ]
        .concat();
        let expected = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "x", "generation": 0, "labels": {"app": "web"}},
            "data": {"a": "b", "empty": ""},
            "binaryData": {"bin": "AAEC/w=="},
            "immutable": false,
        });
        assert_eq!(decode(&body("v1", "ConfigMap", raw)).unwrap(), expected);
    }

    #[test]
    fn namespace() {
        const NS: &str = "core/v1 Namespace";
        let spec = [lf("core/v1 NamespaceSpec", "finalizers", "kubernetes")].concat();
        let raw = [lf(NS, "metadata", meta("x", "")), lf(NS, "spec", spec), lf(NS, "status", "")].concat();
        let expected = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "x", "generation": 0},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {},
        });
        assert_eq!(decode(&body("v1", "Namespace", raw)).unwrap(), expected);
    }

    #[test]
    fn secret() {
        const SECRET: &str = "core/v1 Secret";
        let raw = [
            lf(SECRET, "metadata", meta("s", "default")),
            entry(SECRET, "data", "k", "v"),
            entry(SECRET, "data", "none", ""),
            entry(SECRET, "stringData", "plain", "text"),
            lf(SECRET, "type", "Opaque"),
        ]
        .concat();
        let expected = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "default", "generation": 0},
            "data": {"k": "dg==", "none": ""},
            "stringData": {"plain": "text"},
            "type": "Opaque",
        });
        assert_eq!(decode(&body("v1", "Secret", raw)).unwrap(), expected);
    }

    #[test]
    fn pod() {
        const POD: &str = "core/v1 Pod";
        const SPEC: &str = "core/v1 PodSpec";
        const C: &str = "core/v1 Container";
        const PORT: &str = "core/v1 ContainerPort";
        const RES: &str = "core/v1 ResourceRequirements";
        const PROBE: &str = "core/v1 Probe";
        const HANDLER: &str = "core/v1 ProbeHandler";
        const STATUS: &str = "core/v1 PodStatus";
        const COND: &str = "core/v1 PodCondition";
        let liveness = [
            lf(
                PROBE,
                "",
                [lf(
                    HANDLER,
                    "httpGet",
                    [
                        lf("core/v1 HTTPGetAction", "path", "/healthz"),
                        lf("core/v1 HTTPGetAction", "port", int_or_string(Err("http"))),
                    ]
                    .concat(),
                )]
                .concat(),
            ),
            vf(PROBE, "periodSeconds", 5),
        ];
        let readiness =
            lf(PROBE, "", lf(HANDLER, "tcpSocket", lf("core/v1 TCPSocketAction", "port", int_or_string(Ok(8080)))));
        let container = [
            lf(C, "name", "web"),
            lf(C, "image", "nginx:1.27"),
            lf(C, "command", "nginx"),
            lf(C, "command", ""),
            lf(
                C,
                "ports",
                [
                    lf(PORT, "name", "http"),
                    vf(PORT, "hostPort", 0),
                    vf(PORT, "containerPort", 80),
                    lf(PORT, "protocol", "TCP"),
                ]
                .concat(),
            ),
            lf(
                C,
                "resources",
                [entry(RES, "limits", "cpu", quantity("500m")), entry(RES, "requests", "memory", quantity("64Mi"))]
                    .concat(),
            ),
            lf(C, "livenessProbe", liveness.concat()),
            lf(C, "readinessProbe", readiness),
            lf(C, "imagePullPolicy", ""),
            vf(C, "tty", 0),
        ]
        .concat();
        let spec = [
            lf(SPEC, "containers", container),
            vf(SPEC, "terminationGracePeriodSeconds", 0),
            entry(SPEC, "nodeSelector", "disk", "ssd"),
            vf(SPEC, "automountServiceAccountToken", 0),
            vf(SPEC, "priority", -5),
            vi(4000, 7),
            ld(4001, "a field from a newer release"),
        ]
        .concat();
        let condition = [
            lf(COND, "type", "Ready"),
            lf(COND, "status", "True"),
            lf(COND, "lastTransitionTime", time("meta/v1 Time", 1_704_164_705, 999)),
        ];
        let status = [lf(STATUS, "phase", "Running"), lf(STATUS, "conditions", condition.concat())].concat();
        let metadata =
            [meta("p", "default"), lf(META, "creationTimestamp", time("meta/v1 Time", 1_704_164_705, 0))].concat();
        let raw = [lf(POD, "metadata", metadata), lf(POD, "spec", spec), lf(POD, "status", status)].concat();
        let expected = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "default", "generation": 0, "creationTimestamp": "2024-01-02T03:05:05Z",
            },
            "spec": {
                "containers": [{
                    "name": "web",
                    "image": "nginx:1.27",
                    "command": ["nginx", ""],
                    "ports": [{"name": "http", "hostPort": 0, "containerPort": 80, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m"}, "requests": {"memory": "64Mi"}},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                    "readinessProbe": {"tcpSocket": {"port": 8080}},
                    "tty": false,
                }],
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"disk": "ssd"},
                "automountServiceAccountToken": false,
                "priority": -5,
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-02T03:05:05Z"}],
            },
        });
        assert_eq!(decode(&body("v1", "Pod", raw)).unwrap(), expected);
    }

    #[test]
    fn lease_micro_time() {
        const LEASE: &str = "coordination/v1 Lease";
        const SPEC: &str = "coordination/v1 LeaseSpec";
        let spec = [
            lf(SPEC, "holderIdentity", "node-1"),
            vf(SPEC, "leaseDurationSeconds", 40),
            lf(SPEC, "renewTime", time("meta/v1 MicroTime", 1_704_164_705, 123_456_789)),
            lf(SPEC, "acquireTime", ""),
        ];
        let raw = [lf(LEASE, "metadata", meta("node-1", "kube-node-lease")), lf(LEASE, "spec", spec.concat())].concat();
        let object = decode(&body("coordination.k8s.io/v1", "Lease", raw)).unwrap();
        assert_eq!(
            object["spec"],
            json!({"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2024-01-02T03:05:05.123456Z"})
        );
    }

    #[test]
    fn delete_options() {
        const OPTS: &str = "meta/v1 DeleteOptions";
        const PRE: &str = "meta/v1 Preconditions";
        let raw = [
            vf(OPTS, "gracePeriodSeconds", 0),
            lf(OPTS, "preconditions", [lf(PRE, "uid", "0b7a-11"), lf(PRE, "resourceVersion", "42")].concat()),
            lf(OPTS, "propagationPolicy", "Foreground"),
            lf(OPTS, "dryRun", "All"),
        ]
        .concat();
        for api_version in ["v1", "coordination.k8s.io/v1"] {
            let expected = json!({
                "apiVersion": api_version, "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": "0b7a-11", "resourceVersion": "42"},
                "propagationPolicy": "Foreground",
                "dryRun": ["All"],
            });
            assert_eq!(decode(&body(api_version, "DeleteOptions", raw.clone())).unwrap(), expected);
        }
    }

    #[test]
    fn node() {
        const NODE: &str = "core/v1 Node";
        const SPEC: &str = "core/v1 NodeSpec";
        const STATUS: &str = "core/v1 NodeStatus";
        const COND: &str = "core/v1 NodeCondition";
        let taint = [lf("core/v1 Taint", "key", "gpu"), lf("core/v1 Taint", "effect", "NoSchedule")];
        let spec =
            [lf(SPEC, "podCIDR", "10.1.0.0/24"), vf(SPEC, "unschedulable", 0), lf(SPEC, "taints", taint.concat())];
        let ready = [
            lf(COND, "type", "Ready"),
            lf(COND, "status", "True"),
            lf(COND, "lastHeartbeatTime", time("meta/v1 Time", 1_704_164_705, 0)),
            lf(COND, "lastTransitionTime", ""),
        ];
        let endpoint = vf("core/v1 DaemonEndpoint", "Port", 10250);
        let status = [
            entry(STATUS, "capacity", "cpu", quantity("4")),
            entry(STATUS, "capacity", "memory", quantity("8Gi")),
            lf(STATUS, "conditions", ready.concat()),
            lf(
                STATUS,
                "addresses",
                [lf("core/v1 NodeAddress", "type", "InternalIP"), lf("core/v1 NodeAddress", "address", "10.0.0.2")]
                    .concat(),
            ),
            lf(STATUS, "daemonEndpoints", lf("core/v1 NodeDaemonEndpoints", "kubeletEndpoint", endpoint)),
        ];
        let raw = [
            lf(NODE, "metadata", meta("n1", "")),
            lf(NODE, "spec", spec.concat()),
            lf(NODE, "status", status.concat()),
        ];
        let expected = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "generation": 0},
            "spec": {
                "podCIDR": "10.1.0.0/24", "unschedulable": false, "taints": [{"key": "gpu", "effect": "NoSchedule"}],
            },
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi"},
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2024-01-02T03:05:05Z"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        });
        assert_eq!(decode(&body("v1", "Node", raw.concat())).unwrap(), expected);
    }

    #[test]
    fn binding() {
        const REF: &str = "core/v1 ObjectReference";
        let target = [lf(REF, "kind", "Node"), lf(REF, "name", "n1"), lf(REF, "apiVersion", "v1")].concat();
        let raw = [lf("core/v1 Binding", "metadata", meta("p", "default")), lf("core/v1 Binding", "target", target)];
        let expected = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p", "namespace": "default", "generation": 0},
            "target": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
        });
        assert_eq!(decode(&body("v1", "Binding", raw.concat())).unwrap(), expected);
    }

    #[test]
    fn events() {
        const CORE: &str = "core/v1 Event";
        const NEW: &str = "events/v1 Event";
        let involved =
            [lf("core/v1 ObjectReference", "kind", "Pod"), lf("core/v1 ObjectReference", "name", "p")].concat();
        let micro = time("meta/v1 MicroTime", 1_704_164_705, 250_000_000);
        let core = [
            lf(CORE, "metadata", meta("p.1", "default")),
            lf(CORE, "involvedObject", &involved),
            lf(CORE, "reason", "Started"),
            lf(CORE, "source", lf("core/v1 EventSource", "component", "kubelet")),
            lf(CORE, "firstTimestamp", time("meta/v1 Time", 1_704_164_705, 0)),
            vf(CORE, "count", 2),
            lf(CORE, "eventTime", &micro),
        ];
        let object = decode(&body("v1", "Event", core.concat())).unwrap();
        assert_eq!(object["involvedObject"], json!({"kind": "Pod", "name": "p"}));
        assert_eq!(object["source"], json!({"component": "kubelet"}));
        assert_eq!(object["firstTimestamp"], "2024-01-02T03:05:05Z");
        assert_eq!(object["eventTime"], "2024-01-02T03:05:05.250000Z");
        assert_eq!(object["count"], 2);

        let series = [vf("events/v1 EventSeries", "count", 3), lf("events/v1 EventSeries", "lastObservedTime", &micro)];
        let new = [
            lf(NEW, "metadata", meta("p.2", "default")),
            lf(NEW, "eventTime", &micro),
            lf(NEW, "series", series.concat()),
            lf(NEW, "reportingController", "cairn"),
            lf(NEW, "regarding", &involved),
            lf(NEW, "note", "started"),
        ];
        let object = decode(&body("events.k8s.io/v1", "Event", new.concat())).unwrap();
        let expected = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "p.2", "namespace": "default", "generation": 0},
            "eventTime": "2024-01-02T03:05:05.250000Z",
            "series": {"count": 3, "lastObservedTime": "2024-01-02T03:05:05.250000Z"},
            "reportingController": "cairn",
            "regarding": {"kind": "Pod", "name": "p"},
            "note": "started",
        });
        assert_eq!(object, expected);
    }

    /// `kubectl debug src --copy-to=copy --image=busybox --keep-liveness --keep-readiness --keep-startup ...`
    /// of a pod with most fields set: the copy kubectl creates holds the original pod's spec.
    #[test]
    fn kubectl_debug_pod() {
        let pod =
            decode(include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/protobuf/pod.pb"))).unwrap();
        let spec = &pod["spec"];
        let web = &spec["containers"][0];
        assert_eq!(
            pod["metadata"],
            json!({
                "name": "copy", "namespace": "default", "generation": 0,
                "labels": {"app": "web"}, "annotations": {"note": "x"},
            })
        );
        assert_eq!(
            web["livenessProbe"],
            json!({
                "httpGet": {
                    "path": "/healthz", "port": "http", "scheme": "HTTP", "httpHeaders": [{"name": "X", "value": "y"}],
                },
                "initialDelaySeconds": 3, "timeoutSeconds": 1, "periodSeconds": 5,
                "successThreshold": 1, "failureThreshold": 3,
                "terminationGracePeriodSeconds": 10,
            })
        );
        assert_eq!(web["readinessProbe"]["tcpSocket"], json!({"port": 8080}));
        assert_eq!(
            web["resources"],
            json!({"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "250m", "memory": "64Mi"}})
        );
        assert_eq!(
            web["envFrom"],
            json!([{"prefix": "CFG_", "configMapRef": {"name": "cfg", "optional": true}}, {"secretRef": {"name": "s"}}])
        );
        assert_eq!(
            web["env"][3]["valueFrom"],
            json!({"resourceFieldRef": {"containerName": "web", "resource": "limits.memory", "divisor": "1Mi"}})
        );
        assert_eq!(
            web["lifecycle"],
            json!({"postStart": {"exec": {"command": ["true"]}}, "preStop": {"sleep": {"seconds": 5}}})
        );
        assert_eq!(web["securityContext"]["runAsNonRoot"], false);
        assert_eq!(
            spec["volumes"],
            json!([
                {"name": "cm", "configMap": {
                    "name": "cfg", "items": [{"key": "a", "path": "a.txt", "mode": 420}],
                    "defaultMode": 292, "optional": false,
                }},
                {"name": "sec", "secret": {"secretName": "s", "defaultMode": 256}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "tok", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "api", "expirationSeconds": 3600, "path": "token"}},
                    {"downwardAPI": {"items": [
                        {"path": "labels", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}},
                    ]}},
                ]}},
            ])
        );
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}])
        );
        assert_eq!(spec["terminationGracePeriodSeconds"], 0);
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["hostUsers"], false);
        assert_eq!(spec["overhead"], json!({"cpu": "10m"}));
        assert_eq!(spec["containers"][1]["name"], "dbg");
    }

    /// Bodies kubectl 1.37 sent for `kubectl create ...`, with the JSON it prints for `--dry-run=client -o json`
    /// plus the zero values Go writes to protobuf.
    fn fixtures() -> Vec<(&'static str, &'static [u8], Value)> {
        macro_rules! fixture {
            ($name:literal) => {
                include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/protobuf/", $name, ".pb"))
            };
        }
        vec![
            (
                "create namespace x",
                fixture!("namespace"),
                json!({
                    "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "generation": 0},
                    "spec": {}, "status": {},
                }),
            ),
            (
                "create configmap c -n x --from-literal=a=b --from-literal=empty= --from-file=bin",
                fixture!("configmap"),
                json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "c", "namespace": "x", "generation": 0},
                    "data": {"a": "b", "empty": ""},
                    "binaryData": {"bin": "AAEC/2Jpbg=="},
                }),
            ),
            (
                "create secret generic s --from-literal=k=v",
                fixture!("secret"),
                json!({
                    "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "generation": 0},
                    "data": {"k": "dg=="},
                }),
            ),
            (
                "create serviceaccount sa",
                fixture!("serviceaccount"),
                json!({
                    "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "generation": 0},
                }),
            ),
            (
                "create token sa --duration=1h --audience=aud1",
                fixture!("tokenrequest"),
                json!({
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": {"generation": 0},
                    "spec": {"audiences": ["aud1"], "expirationSeconds": 3600}, "status": {},
                }),
            ),
            (
                "auth can-i get pods --subresource=log -n x",
                fixture!("selfsubjectaccessreview"),
                json!({
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "metadata": {"generation": 0},
                    "spec": {"resourceAttributes": {
                        "namespace": "x", "verb": "get", "resource": "pods", "subresource": "log",
                    }},
                    "status": {"allowed": false, "denied": false},
                }),
            ),
            (
                "create quota q --hard=cpu=1500m,memory=1Gi,pods=2 --scopes=BestEffort",
                fixture!("resourcequota"),
                json!({
                    "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "generation": 0},
                    "spec": {"hard": {"cpu": "1500m", "memory": "1Gi", "pods": "2"}, "scopes": ["BestEffort"]},
                    "status": {},
                }),
            ),
            (
                "create service clusterip svc --tcp=80:8080 --tcp=443:https",
                fixture!("service"),
                json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "svc", "generation": 0, "labels": {"app": "svc"}},
                    "spec": {
                        "ports": [
                            {"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 0},
                            {"name": "443-https", "protocol": "TCP", "port": 443, "targetPort": "https", "nodePort": 0},
                        ],
                        "selector": {"app": "svc"}, "type": "ClusterIP",
                        "healthCheckNodePort": 0, "publishNotReadyAddresses": false,
                    },
                    "status": {"loadBalancer": {}},
                }),
            ),
            (
                "create poddisruptionbudget pdb --selector=a=b --min-available=50%",
                fixture!("poddisruptionbudget"),
                json!({
                    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "pdb", "generation": 0},
                    "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"a": "b"}}},
                    "status": {
                        "observedGeneration": 0, "disruptionsAllowed": 0,
                        "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0,
                    },
                }),
            ),
        ]
    }

    #[test]
    fn kubectl_bodies() {
        for (command, bytes, expected) in fixtures() {
            assert_eq!(decode(bytes).unwrap(), expected, "kubectl {command}");
        }
    }

    #[test]
    fn damaged_bodies_give_errors_not_panics() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/protobuf");
        for file in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(file.unwrap().path()).unwrap();
            for cut in 0..bytes.len() {
                match decode(&bytes[..cut]) {
                    Err(Error::Magic) => assert!(cut < MAGIC.len()),
                    Err(Error::NoKind) => assert_eq!(cut, MAGIC.len()),
                    Err(Error::Truncated(at)) => assert_eq!(at, cut),
                    // Cut between two fields of the envelope.
                    Ok(_) => {}
                    Err(other) => panic!("cut at {cut}: {other}"),
                }
            }
            for i in MAGIC.len()..bytes.len() {
                // Toggles a varint's continuation bit and changes its value.
                let mut damaged = bytes.clone();
                damaged[i] ^= 0x81;
                let _ = decode(&damaged);
            }
        }
    }

    #[test]
    fn errors() {
        let ns = body("v1", "Namespace", lf("core/v1 Namespace", "metadata", meta("x", "")));
        assert!(matches!(decode(b"{\"kind\":\"Namespace\"}"), Err(Error::Magic)));
        assert_eq!(decode(&ns[..12]).unwrap_err().to_string(), "the protobuf body is truncated at byte 12");
        assert_eq!(
            decode(&body("v1", "Foo", Vec::new())).unwrap_err().to_string(),
            "the protobuf body holds core/v1 Foo, which this server does not decode"
        );
        assert_eq!(
            decode(&body("example.com/v1", "Widget", Vec::new())).unwrap_err().to_string(),
            "the protobuf body holds example.com/v1 Widget, which this server does not decode"
        );
        assert!(matches!(decode(&body("", "", Vec::new())), Err(Error::NoKind)));

        // A nested length that runs past the end of its message.
        let bad =
            body("v1", "Namespace", [ld(num("core/v1 Namespace", "metadata"), [0x0a, 0x09, b'x']), ld(1, "")].concat());
        let err = decode(&bad).unwrap_err().to_string();
        assert!(err.contains("9 bytes run past the end of the enclosing message"), "{err}");

        // A known field with the wrong wire type.
        let bad = body("v1", "Namespace", vf("core/v1 Namespace", "metadata", 1));
        let err = decode(&bad).unwrap_err().to_string();
        assert!(
            err.ends_with("core/v1 Namespace field metadata holds a varint, not a length-delimited value"),
            "{err}"
        );

        let bad = body("v1", "Namespace", lf("core/v1 Namespace", "metadata", lf(META, "name", [0xff, 0xfe])));
        assert!(decode(&bad).unwrap_err().to_string().ends_with("meta/v1 ObjectMeta field name is not valid UTF-8"));

        let mut gzip = ns.clone();
        gzip.extend(ld(table::ENVELOPE.content_encoding, "gzip"));
        assert!(matches!(decode(&gzip), Err(Error::Wrapping(_))));

        let long_varint = [MAGIC, &[0x08], &[0xff; 11]].concat();
        assert!(decode(&long_varint).unwrap_err().to_string().contains("longer than 10 bytes"));
        assert!(decode(&[MAGIC, &[0x0b]].concat()).unwrap_err().to_string().contains("groups"));
        assert!(decode(&[MAGIC, &[0x00]].concat()).unwrap_err().to_string().contains("invalid field number 0"));
    }

    #[test]
    fn depth_is_bounded() {
        let ns = body("v1", "Namespace", lf("core/v1 Namespace", "metadata", meta("x", "")));
        let r = Reader { body: &ns, pos: MAGIC.len(), end: ns.len() };
        assert!(envelope(r, MAX_DEPTH - 2).is_ok());
        assert!(matches!(envelope(r, MAX_DEPTH), Err(Error::TooDeep)));
    }

    #[test]
    fn special_values() {
        assert_eq!(super::time(0, 0, false), Some(json!("1970-01-01T00:00:00Z")));
        assert_eq!(super::time(1_704_164_705, 5_000, true), Some(json!("2024-01-02T03:05:05.000005Z")));
        assert_eq!(super::time(GO_ZERO_TIME, 0, false), Some(json!("0001-01-01T00:00:00Z")));
        assert_eq!(super::time(i64::MAX, 0, false), None);
        assert_eq!(super::time(0, -1, false), None);
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (1_000_000, "1ms"),
            (30_000_000_000, "30s"),
            (90_500_000_000, "1m30.5s"),
            (3_600_000_000_000, "1h0m0s"),
            (-5_000_000_000, "-5s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ] {
            assert_eq!(go_duration(nanos), text);
        }
        // A zero time is Go's `null`, and is left out.
        let ns = body(
            "v1",
            "Namespace",
            lf("core/v1 Namespace", "metadata", lf(META, "creationTimestamp", time("meta/v1 Time", GO_ZERO_TIME, 0))),
        );
        assert_eq!(decode(&ns).unwrap(), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}}));
    }
}
