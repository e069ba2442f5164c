//! Wire formats: request bodies in, JSON / YAML / Table out, and `Status` errors.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::registry::{Resource, StatusError};

/// Largest request body accepted, as kube-apiserver's default.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

pub const JSON: &str = "application/json";
pub const YAML: &str = "application/yaml";

/// What a client asked to receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    Table(IncludeObject),
    /// `as=PartialObjectMetadata` (a list: `PartialObjectMetadataList`): the objects' metadata only.
    Metadata,
}

/// `includeObject` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Picks the response format from `Accept`, first acceptable entry wins.
pub fn negotiate(headers: &HeaderMap, include: Option<&str>) -> Result<Format, StatusError> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).filter(|s| !s.trim().is_empty())
    else {
        return Ok(Format::Json);
    };
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let param = |k: &str| params.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.as_str());
        match media.as_str() {
            "application/json" | "*/*" | "application/*" => match param("as") {
                None => return Ok(Format::Json),
                Some("Table") if param("g") == Some("meta.k8s.io") && matches!(param("v"), Some("v1" | "v1beta1")) => {
                    let include = match include {
                        Some("None") => IncludeObject::None,
                        Some("Object") => IncludeObject::Object,
                        _ => IncludeObject::Metadata,
                    };
                    return Ok(Format::Table(include));
                }
                Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                    if param("g") == Some("meta.k8s.io") && matches!(param("v"), Some("v1" | "v1beta1")) =>
                {
                    return Ok(Format::Metadata);
                }
                Some(_) => continue,
            },
            "application/yaml" if param("as").is_none() => return Ok(Format::Yaml),
            _ => continue,
        }
    }
    Err(StatusError::not_acceptable("only the following media types are accepted: application/json, application/yaml"))
}

/// Parses a request body as JSON or YAML according to `Content-Type`.
pub fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, StatusError> {
    let ct = content_type(headers);
    if body.len() > MAX_BODY_BYTES {
        return Err(StatusError::too_large(MAX_BODY_BYTES));
    }
    match ct.as_str() {
        "" | JSON | "*/*" => parse_json(body),
        YAML | "application/x-yaml" | "text/yaml" => parse_yaml(body),
        super::protobuf::MEDIA_TYPE => {
            super::protobuf::decode(body).map_err(|e| StatusError::bad_request(e.to_string()))
        }
        other => Err(StatusError::unsupported_media_type(other, &[JSON, YAML, super::protobuf::MEDIA_TYPE])),
    }
}

/// The media type of a request, without parameters, lower-cased.
pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

pub fn parse_json(body: &[u8]) -> Result<Value, StatusError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(StatusError::bad_request("the request body is empty; send a JSON or YAML object"));
    }
    serde_json::from_slice(body)
        .map_err(|e| StatusError::bad_request(format!("the request body is not valid JSON: {e}")))
}

pub fn parse_yaml(body: &[u8]) -> Result<Value, StatusError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(StatusError::bad_request("the request body is empty; send a JSON or YAML object"));
    }
    serde_yaml::from_slice::<Value>(body)
        .map_err(|e| StatusError::bad_request(format!("the request body is not valid YAML: {e}")))
}

/// A response with a JSON body already encoded.
pub fn json_bytes(code: StatusCode, body: Bytes) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    resp
}

pub fn json_value(code: StatusCode, v: &Value) -> Response {
    json_bytes(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

/// Encodes one object in the negotiated format.
pub fn object(r: &Resource, code: StatusCode, format: Format, obj: Bytes, warnings: &[String]) -> Response {
    let resp = match format {
        Format::Json => json_bytes(code, obj),
        Format::Yaml => match serde_json::from_slice::<Value>(&obj) {
            Ok(v) => yaml(code, &v),
            Err(e) => error(&StatusError::internal(e)),
        },
        Format::Table(include) => match table(r, std::slice::from_ref(&obj), include, Map::new()) {
            Ok(t) => json_bytes(code, t),
            Err(e) => error(&e),
        },
        Format::Metadata => match partial_metadata(&obj) {
            Ok(m) => json_bytes(code, m),
            Err(e) => error(&e),
        },
    };
    with_warnings(resp, warnings)
}

/// An encoded object as a `meta.k8s.io/v1 PartialObjectMetadata`: its metadata, copied as stored.
pub fn partial_metadata(obj: &[u8]) -> Result<Bytes, StatusError> {
    #[derive(serde::Deserialize)]
    struct Only<'a> {
        #[serde(borrow)]
        metadata: Option<&'a serde_json::value::RawValue>,
    }
    let only: Only = serde_json::from_slice(obj).map_err(StatusError::internal)?;
    let meta = only.metadata.map_or("{}", |m| m.get());
    let head = br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;
    let mut out = Vec::with_capacity(head.len() + meta.len() + 1);
    out.extend_from_slice(head);
    out.extend_from_slice(meta.as_bytes());
    out.push(b'}');
    Ok(Bytes::from(out))
}

pub fn yaml(code: StatusCode, v: &Value) -> Response {
    match serde_yaml::to_string(v) {
        Ok(s) => {
            let mut resp = Response::new(Body::from(s));
            *resp.status_mut() = code;
            resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(YAML));
            resp
        }
        Err(e) => error(&StatusError::internal(e)),
    }
}

/// Adds `Warning: 299 - "..."` headers.
pub fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {:?}", w);
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// A server-side `Table` of `items` (each the JSON of one object), encoded straight into bytes.
pub fn table(
    r: &Resource,
    items: &[Bytes],
    include: IncludeObject,
    list_meta: Map<String, Value>,
) -> Result<Bytes, StatusError> {
    let columns: Vec<Value> = r
        .columns()
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description, "priority": c.priority})
        })
        .collect();
    let head = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": Value::Object(list_meta),
        "columnDefinitions": columns,
    });
    let mut out = serde_json::to_vec(&head).map_err(StatusError::internal)?;
    out.pop();
    out.extend_from_slice(b",\"rows\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let row = r.row(item)?;
        out.extend_from_slice(b"{\"cells\":");
        serde_json::to_writer(&mut out, &row.cells).map_err(StatusError::internal)?;
        match include {
            IncludeObject::None => {}
            IncludeObject::Metadata => {
                out.extend_from_slice(
                    br#","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#,
                );
                serde_json::to_writer(&mut out, &row.metadata).map_err(StatusError::internal)?;
                out.push(b'}');
            }
            IncludeObject::Object => {
                out.extend_from_slice(b",\"object\":");
                out.extend_from_slice(item);
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(Bytes::from(out))
}

/// The `meta/v1 Status` body of an error.
pub fn status_body(e: &StatusError) -> Value {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": e.message,
        "reason": e.reason,
        "code": e.code,
    });
    if let Some(d) = &e.details {
        let mut details = Map::new();
        if !d.name.is_empty() {
            details.insert("name".into(), json!(d.name));
        }
        if !d.group.is_empty() {
            details.insert("group".into(), json!(d.group));
        }
        if !d.kind.is_empty() {
            details.insert("kind".into(), json!(d.kind));
        }
        if !d.uid.is_empty() {
            details.insert("uid".into(), json!(d.uid));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> =
                d.causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(s) = d.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(s));
        }
        v["details"] = Value::Object(details);
    }
    v
}

/// The HTTP response for an error.
pub fn error(e: &StatusError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_value(code, &status_body(e))
}

impl IntoResponse for StatusError {
    fn into_response(self) -> Response {
        error(&self)
    }
}

/// `{"kind":"Status","status":"Success",...}` as answered by deletes and bindings.
pub fn success(code: StatusCode, details: Option<Value>) -> Response {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    if let Some(d) = details {
        v["details"] = d;
    }
    if code != StatusCode::OK {
        v["code"] = json!(code.as_u16());
    }
    json_value(code, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn kubectl_get_asks_for_tables() {
        let h = accept(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        );
        assert_eq!(negotiate(&h, None).unwrap(), Format::Table(IncludeObject::Metadata));
        assert_eq!(negotiate(&h, Some("Object")).unwrap(), Format::Table(IncludeObject::Object));
    }

    #[test]
    fn metadata_only_clients_get_partial_object_metadata() {
        let h = accept("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1");
        assert_eq!(negotiate(&h, None).unwrap(), Format::Metadata);
        let obj = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","uid":"u"},"data":{"k":"v"}}"#;
        let m: Value = serde_json::from_slice(&partial_metadata(obj).unwrap()).unwrap();
        assert_eq!(
            m,
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a", "uid": "u"}})
        );
    }

    #[test]
    fn protobuf_falls_back_to_json_and_unknown_is_406() {
        assert_eq!(
            negotiate(&accept("application/vnd.kubernetes.protobuf, application/json"), None).unwrap(),
            Format::Json
        );
        assert_eq!(negotiate(&accept("application/yaml"), None).unwrap(), Format::Yaml);
        assert_eq!(negotiate(&accept("text/html"), None).unwrap_err().code, 406);
    }

    #[test]
    fn bodies_are_checked() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_body(&h, b"{").unwrap_err().code, 400);
        assert_eq!(parse_body(&h, b"").unwrap_err().code, 400);
        assert_eq!(parse_body(&h, &vec![b' '; MAX_BODY_BYTES + 1]).unwrap_err().code, 413);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
        assert_eq!(parse_body(&h, b"a: 1\n").unwrap(), json!({"a": 1}));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(parse_body(&h, b"x").unwrap_err().code, 415);
    }

    #[test]
    fn status_bodies_match_upstream_shape() {
        let gr = crate::registry::GroupResource { group: String::new(), resource: "pods".into() };
        let v = status_body(&StatusError::not_found(&gr, "x"));
        assert_eq!(v["message"], "pods \"x\" not found");
        assert_eq!(v["reason"], "NotFound");
        assert_eq!(v["details"], json!({"name": "x", "kind": "pods"}));
        assert_eq!(v["code"], 404);
    }
}
