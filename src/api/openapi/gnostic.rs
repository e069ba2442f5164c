//! `/openapi/v2` as protobuf: the Swagger document in gnostic's `openapi.v2` messages, which
//! kubectl and client-go's discovery decode (`application/com.github.proto-openapi.spec.v2.v1.0+protobuf`).
//! The messages `openapi.v3` shares with it (`NamedAny`, `Any`, `SecurityRequirement`) are used there too.
//!
//! No crate ships these messages, so the part of them the document uses is declared here with
//! prost, field numbers as in gnostic's `OpenAPIv2.proto`. Values gnostic keeps as YAML (vendor
//! extensions, defaults, enums) are written as JSON, which is YAML.

use prost::Message;
use serde_json::{Map, Value};

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
    #[prost(message, repeated, tag = "12")]
    pub security: Vec<SecurityRequirement>,
    #[prost(message, optional, tag = "13")]
    pub security_definitions: Option<SecurityDefinitions>,
    #[prost(message, repeated, tag = "16")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, tag = "3")]
    pub description: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub vendor_extension: Vec<NamedAny>,
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PathItem {
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, repeated, tag = "10")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "2")]
    pub summary: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(bool, tag = "11")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { Parameter parameter = 1; JsonReference json_reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct ParametersItem {
    #[prost(message, optional, tag = "1")]
    pub parameter: Option<Parameter>,
    #[prost(message, optional, tag = "2")]
    pub json_reference: Option<JsonReference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct JsonReference {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub description: String,
}

/// `oneof { BodyParameter body_parameter = 1; NonBodyParameter non_body_parameter = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct Parameter {
    #[prost(message, optional, tag = "1")]
    pub body_parameter: Option<BodyParameter>,
    #[prost(message, optional, tag = "2")]
    pub non_body_parameter: Option<NonBodyParameter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
    #[prost(message, repeated, tag = "6")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { header = 1; form_data = 2; query = 3; path = 4 }`: query and path parameters.
#[derive(Clone, PartialEq, Message)]
pub struct NonBodyParameter {
    #[prost(message, optional, tag = "3")]
    pub query_parameter_sub_schema: Option<QueryParameter>,
    #[prost(message, optional, tag = "4")]
    pub path_parameter_sub_schema: Option<PathParameter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct QueryParameter {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "23")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PathParameter {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
    #[prost(message, repeated, tag = "22")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
    #[prost(message, repeated, tag = "2")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

/// `oneof { Response response = 1; JsonReference json_reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct ResponseValue {
    #[prost(message, optional, tag = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
    #[prost(message, repeated, tag = "5")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { Schema schema = 1; FileSchema file_schema = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct SchemaItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `oneof { Schema schema = 1; bool boolean = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
    #[prost(bool, optional, tag = "2")]
    pub boolean: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

/// gnostic's `Any`: the value as YAML text (field 2; field 1, a protobuf `Any`, is never used).
#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct SecurityRequirement {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedStringArray>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedStringArray {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<StringArray>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StringArray {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SecurityDefinitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSecurityDefinitionsItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSecurityDefinitionsItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<SecurityDefinitionsItem>,
}

/// `oneof { basic = 1; api_key = 2; oauth2 flows = 3..6 }`: the API key scheme (bearer tokens).
#[derive(Clone, PartialEq, Message)]
pub struct SecurityDefinitionsItem {
    #[prost(message, optional, tag = "2")]
    pub api_key_security: Option<ApiKeySecurity>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ApiKeySecurity {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(string, tag = "4")]
    pub description: String,
}

/// Encodes the Swagger 2.0 document `doc` (as [`super::v2`] builds it).
pub fn encode(doc: &Value) -> Vec<u8> {
    document(doc).encode_to_vec()
}

fn document(doc: &Value) -> Document {
    let info = &doc["info"];
    Document {
        swagger: text(doc, "swagger"),
        info: Some(Info {
            title: text(info, "title"),
            version: text(info, "version"),
            description: text(info, "description"),
        }),
        paths: Some(Paths {
            vendor_extension: Vec::new(),
            path: entries(&doc["paths"])
                .map(|(name, item)| NamedPathItem { name, value: Some(path_item(item)) })
                .collect(),
        }),
        definitions: Some(Definitions {
            additional_properties: entries(&doc["definitions"])
                .map(|(name, s)| NamedSchema { name, value: Some(schema(s)) })
                .collect(),
        }),
        security: security(doc),
        security_definitions: Some(SecurityDefinitions {
            additional_properties: entries(&doc["securityDefinitions"])
                .map(|(name, d)| NamedSecurityDefinitionsItem {
                    name,
                    value: Some(SecurityDefinitionsItem {
                        api_key_security: Some(ApiKeySecurity {
                            r#type: text(d, "type"),
                            name: text(d, "name"),
                            r#in: text(d, "in"),
                            description: text(d, "description"),
                        }),
                    }),
                })
                .collect(),
        }),
        vendor_extension: extensions(doc),
    }
}

/// A document's `security` list (the same message in `openapi.v2` and `openapi.v3`).
pub(super) fn security(doc: &Value) -> Vec<SecurityRequirement> {
    let requirements = doc["security"].as_array().into_iter().flatten();
    requirements
        .map(|req| SecurityRequirement {
            additional_properties: entries(req)
                .map(|(name, scopes)| NamedStringArray {
                    name,
                    value: Some(StringArray { value: strings(Some(scopes)) }),
                })
                .collect(),
        })
        .collect()
}

fn path_item(item: &Value) -> PathItem {
    let op = |m: &str| item.get(m).map(operation);
    PathItem {
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        patch: op("patch"),
        parameters: parameters(item),
        vendor_extension: extensions(item),
    }
}

fn operation(op: &Value) -> Operation {
    Operation {
        tags: strings(op.get("tags")),
        summary: text(op, "summary"),
        description: text(op, "description"),
        operation_id: text(op, "operationId"),
        produces: strings(op.get("produces")),
        consumes: strings(op.get("consumes")),
        parameters: parameters(op),
        responses: Some(Responses {
            response_code: entries(&op["responses"])
                .map(|(name, r)| NamedResponseValue {
                    name,
                    value: Some(ResponseValue {
                        response: Some(Response {
                            description: text(r, "description"),
                            schema: r.get("schema").map(|s| SchemaItem { schema: Some(schema(s)) }),
                            vendor_extension: extensions(r),
                        }),
                    }),
                })
                .collect(),
            vendor_extension: Vec::new(),
        }),
        schemes: strings(op.get("schemes")),
        deprecated: op["deprecated"].as_bool().unwrap_or(false),
        vendor_extension: extensions(op),
    }
}

fn parameters(holder: &Value) -> Vec<ParametersItem> {
    let params = holder["parameters"].as_array().into_iter().flatten();
    params
        .map(|p| {
            if let Some(r) = p.get("$ref").and_then(Value::as_str) {
                return ParametersItem {
                    json_reference: Some(JsonReference { r#ref: r.into(), description: text(p, "description") }),
                    ..Default::default()
                };
            }
            let required = p["required"].as_bool().unwrap_or(false);
            let parameter = match p["in"].as_str().unwrap_or_default() {
                "body" => Parameter {
                    body_parameter: Some(BodyParameter {
                        description: text(p, "description"),
                        name: text(p, "name"),
                        r#in: "body".into(),
                        required,
                        schema: p.get("schema").map(schema),
                        vendor_extension: extensions(p),
                    }),
                    ..Default::default()
                },
                "path" => Parameter {
                    non_body_parameter: Some(NonBodyParameter {
                        path_parameter_sub_schema: Some(PathParameter {
                            required,
                            r#in: "path".into(),
                            description: text(p, "description"),
                            name: text(p, "name"),
                            r#type: text(p, "type"),
                            unique_items: p["uniqueItems"].as_bool().unwrap_or(false),
                            vendor_extension: extensions(p),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                _ => Parameter {
                    non_body_parameter: Some(NonBodyParameter {
                        query_parameter_sub_schema: Some(QueryParameter {
                            required,
                            r#in: text(p, "in"),
                            description: text(p, "description"),
                            name: text(p, "name"),
                            r#type: text(p, "type"),
                            unique_items: p["uniqueItems"].as_bool().unwrap_or(false),
                            vendor_extension: extensions(p),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            };
            ParametersItem { parameter: Some(parameter), ..Default::default() }
        })
        .collect()
}

fn schema(s: &Value) -> Schema {
    let number = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let int = |k: &str| s[k].as_i64().unwrap_or(0);
    Schema {
        r#ref: text(s, "$ref"),
        format: text(s, "format"),
        title: text(s, "title"),
        description: text(s, "description"),
        default: s.get("default").map(any),
        maximum: number("maximum"),
        minimum: number("minimum"),
        max_length: int("maxLength"),
        min_length: int("minLength"),
        pattern: text(s, "pattern"),
        max_items: int("maxItems"),
        min_items: int("minItems"),
        unique_items: s["uniqueItems"].as_bool().unwrap_or(false),
        required: strings(s.get("required")),
        r#enum: s["enum"].as_array().into_iter().flatten().map(any).collect(),
        additional_properties: s.get("additionalProperties").map(|a| {
            Box::new(match a {
                Value::Bool(b) => AdditionalPropertiesItem { schema: None, boolean: Some(*b) },
                other => AdditionalPropertiesItem { schema: Some(schema(other)), boolean: None },
            })
        }),
        r#type: match &s["type"] {
            Value::String(t) => Some(TypeItem { value: vec![t.clone()] }),
            Value::Array(_) => Some(TypeItem { value: strings(s.get("type")) }),
            _ => None,
        },
        items: match &s["items"] {
            Value::Array(list) => Some(ItemsItem { schema: list.iter().map(schema).collect() }),
            Value::Object(_) => Some(ItemsItem { schema: vec![schema(&s["items"])] }),
            _ => None,
        },
        all_of: s["allOf"].as_array().into_iter().flatten().map(schema).collect(),
        properties: s.get("properties").map(|p| Properties {
            additional_properties: entries(p).map(|(name, v)| NamedSchema { name, value: Some(schema(v)) }).collect(),
        }),
        read_only: s["readOnly"].as_bool().unwrap_or(false),
        example: s.get("example").map(any),
        vendor_extension: extensions(s),
    }
}

/// The `x-` fields of an object, in order.
pub(super) fn extensions(v: &Value) -> Vec<NamedAny> {
    entries(v).filter(|(k, _)| k.starts_with("x-")).map(|(name, v)| NamedAny { name, value: Some(any(v)) }).collect()
}

fn any(v: &Value) -> Any {
    Any { yaml: v.to_string() }
}

pub(super) fn entries(v: &Value) -> impl Iterator<Item = (String, &Value)> {
    v.as_object().into_iter().flat_map(Map::iter).map(|(k, v)| (k.clone(), v))
}

pub(super) fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

pub(super) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_schema_keeps_what_clients_read() {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.37.0"},
            "paths": {"/api/v1/pods": {"get": {
                "operationId": "listCoreV1PodForAllNamespaces",
                "parameters": [{"name": "watch", "in": "query", "type": "boolean", "uniqueItems": true}],
                "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.PodList"}}},
                "x-kubernetes-action": "list",
            }}},
            "definitions": {"io.k8s.api.core.v1.Pod": {
                "type": "object",
                "required": ["spec"],
                "properties": {
                    "spec": {"$ref": "#/definitions/io.k8s.api.core.v1.PodSpec"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
            }},
        });
        let decoded = Document::decode(encode(&doc).as_slice()).expect("decodes");
        assert_eq!(decoded.swagger, "2.0");
        let op = decoded.paths.as_ref().and_then(|p| p.path[0].value.as_ref()).and_then(|i| i.get.as_ref());
        let op = op.expect("get");
        assert_eq!(op.operation_id, "listCoreV1PodForAllNamespaces");
        assert_eq!(op.vendor_extension[0].value.as_ref().map(|a| a.yaml.as_str()), Some("\"list\""));
        let pod = &decoded.definitions.expect("definitions").additional_properties[0];
        let pod = pod.value.as_ref().expect("schema");
        assert_eq!(pod.required, ["spec"]);
        let gvk = pod.vendor_extension[0].value.as_ref().expect("gvk");
        assert_eq!(
            serde_json::from_str::<Value>(&gvk.yaml).expect("yaml is json"),
            doc["definitions"]["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"]
        );
        let props = &pod.properties.as_ref().expect("properties").additional_properties;
        assert_eq!(props[0].value.as_ref().map(|s| s.r#ref.as_str()), Some("#/definitions/io.k8s.api.core.v1.PodSpec"));
        let labels =
            props[1].value.as_ref().and_then(|s| s.additional_properties.as_ref()).and_then(|a| a.schema.as_ref());
        assert_eq!(labels.and_then(|s| s.r#type.as_ref()).map(|t| t.value.clone()), Some(vec!["string".to_string()]));
    }
}
