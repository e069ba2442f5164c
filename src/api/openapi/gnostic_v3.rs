//! `/openapi/v3/<group-version>` as protobuf: each OpenAPI 3.0 document in gnostic's `openapi.v3`
//! messages (`application/com.github.proto-openapi.spec.v3.v1.0+protobuf`), declared here with
//! prost as the v2 ones are (no crate ships them), field numbers as in gnostic's `OpenAPIv3.proto`.

use prost::Message;
use serde_json::Value;

use super::gnostic::{Any, NamedAny, SecurityRequirement, entries, extensions, security, strings, text};

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub openapi: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "4")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "5")]
    pub components: Option<Components>,
    #[prost(message, repeated, tag = "6")]
    pub security: Vec<SecurityRequirement>,
    #[prost(message, repeated, tag = "9")]
    pub specification_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub description: String,
    #[prost(string, tag = "6")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub path: Vec<NamedPathItem>,
    #[prost(message, repeated, tag = "2")]
    pub specification_extension: Vec<NamedAny>,
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
    #[prost(message, optional, tag = "4")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "6")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "7")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "10")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "13")]
    pub parameters: Vec<ParameterOrReference>,
    #[prost(message, repeated, tag = "14")]
    pub specification_extension: Vec<NamedAny>,
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
    #[prost(message, repeated, tag = "6")]
    pub parameters: Vec<ParameterOrReference>,
    #[prost(message, optional, tag = "7")]
    pub request_body: Option<RequestBodyOrReference>,
    #[prost(message, optional, tag = "8")]
    pub responses: Option<Responses>,
    #[prost(bool, tag = "10")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub specification_extension: Vec<NamedAny>,
}

/// `oneof { Parameter parameter = 1; Reference reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct ParameterOrReference {
    #[prost(message, optional, tag = "1")]
    pub parameter: Option<Parameter>,
    #[prost(message, optional, tag = "2")]
    pub reference: Option<Reference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Parameter {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "10")]
    pub schema: Option<SchemaOrReference>,
    #[prost(message, repeated, tag = "14")]
    pub specification_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Reference {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "3")]
    pub description: String,
}

/// `oneof { RequestBody request_body = 1; Reference reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct RequestBodyOrReference {
    #[prost(message, optional, tag = "1")]
    pub request_body: Option<RequestBody>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RequestBody {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub content: Option<MediaTypes>,
    #[prost(bool, tag = "3")]
    pub required: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct MediaTypes {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedMediaType>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedMediaType {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<MediaType>,
}

#[derive(Clone, PartialEq, Message)]
pub struct MediaType {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<SchemaOrReference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "2")]
    pub response_or_reference: Vec<NamedResponseOrReference>,
    #[prost(message, repeated, tag = "3")]
    pub specification_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedResponseOrReference {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseOrReference>,
}

/// `oneof { Response response = 1; Reference reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct ResponseOrReference {
    #[prost(message, optional, tag = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "3")]
    pub content: Option<MediaTypes>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Components {
    #[prost(message, optional, tag = "1")]
    pub schemas: Option<SchemasOrReferences>,
    #[prost(message, optional, tag = "7")]
    pub security_schemes: Option<SecuritySchemesOrReferences>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SchemasOrReferences {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchemaOrReference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchemaOrReference {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<SchemaOrReference>,
}

/// `oneof { Schema schema = 1; Reference reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct SchemaOrReference {
    #[prost(message, optional, boxed, tag = "1")]
    pub schema: Option<Box<Schema>>,
    #[prost(message, optional, tag = "2")]
    pub reference: Option<Reference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(bool, tag = "1")]
    pub nullable: bool,
    #[prost(bool, tag = "3")]
    pub read_only: bool,
    #[prost(message, optional, tag = "7")]
    pub example: Option<Any>,
    #[prost(bool, tag = "8")]
    pub deprecated: bool,
    #[prost(string, tag = "9")]
    pub title: String,
    #[prost(double, tag = "11")]
    pub maximum: f64,
    #[prost(double, tag = "13")]
    pub minimum: f64,
    #[prost(int64, tag = "15")]
    pub max_length: i64,
    #[prost(int64, tag = "16")]
    pub min_length: i64,
    #[prost(string, tag = "17")]
    pub pattern: String,
    #[prost(int64, tag = "18")]
    pub max_items: i64,
    #[prost(int64, tag = "19")]
    pub min_items: i64,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
    #[prost(string, repeated, tag = "23")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "24")]
    pub r#enum: Vec<Any>,
    #[prost(string, tag = "25")]
    pub r#type: String,
    #[prost(message, repeated, tag = "26")]
    pub all_of: Vec<SchemaOrReference>,
    #[prost(message, repeated, tag = "27")]
    pub one_of: Vec<SchemaOrReference>,
    #[prost(message, repeated, tag = "28")]
    pub any_of: Vec<SchemaOrReference>,
    #[prost(message, optional, tag = "30")]
    pub items: Option<ItemsItem>,
    #[prost(message, optional, tag = "31")]
    pub properties: Option<Properties>,
    #[prost(message, optional, tag = "32")]
    pub additional_properties: Option<AdditionalPropertiesItem>,
    #[prost(message, optional, tag = "33")]
    pub default: Option<DefaultType>,
    #[prost(string, tag = "34")]
    pub description: String,
    #[prost(string, tag = "35")]
    pub format: String,
    #[prost(message, repeated, tag = "36")]
    pub specification_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema_or_reference: Vec<SchemaOrReference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchemaOrReference>,
}

/// `oneof { SchemaOrReference schema_or_reference = 1; bool boolean = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(message, optional, tag = "1")]
    pub schema_or_reference: Option<SchemaOrReference>,
    #[prost(bool, optional, tag = "2")]
    pub boolean: Option<bool>,
}

/// `oneof { double number = 1; bool boolean = 2; string string = 3; }`: gnostic keeps only
/// scalar defaults.
#[derive(Clone, PartialEq, Message)]
pub struct DefaultType {
    #[prost(double, optional, tag = "1")]
    pub number: Option<f64>,
    #[prost(bool, optional, tag = "2")]
    pub boolean: Option<bool>,
    #[prost(string, optional, tag = "3")]
    pub string: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SecuritySchemesOrReferences {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSecuritySchemeOrReference>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSecuritySchemeOrReference {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<SecuritySchemeOrReference>,
}

/// `oneof { SecurityScheme security_scheme = 1; Reference reference = 2; }`
#[derive(Clone, PartialEq, Message)]
pub struct SecuritySchemeOrReference {
    #[prost(message, optional, tag = "1")]
    pub security_scheme: Option<SecurityScheme>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SecurityScheme {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub description: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub r#in: String,
    #[prost(string, tag = "5")]
    pub scheme: String,
}

/// Encodes one OpenAPI 3.0 document (as [`super::v3`] builds them).
pub fn encode(doc: &Value) -> Vec<u8> {
    let info = &doc["info"];
    let components = &doc["components"];
    Document {
        openapi: text(doc, "openapi"),
        info: Some(Info {
            title: text(info, "title"),
            description: text(info, "description"),
            version: text(info, "version"),
        }),
        paths: Some(Paths {
            path: entries(&doc["paths"])
                .map(|(name, item)| NamedPathItem { name, value: Some(path_item(item)) })
                .collect(),
            specification_extension: Vec::new(),
        }),
        components: Some(Components {
            schemas: Some(SchemasOrReferences {
                additional_properties: entries(&components["schemas"])
                    .map(|(name, s)| NamedSchemaOrReference { name, value: Some(schema_or_ref(s)) })
                    .collect(),
            }),
            security_schemes: Some(SecuritySchemesOrReferences {
                additional_properties: entries(&components["securitySchemes"])
                    .map(|(name, s)| NamedSecuritySchemeOrReference {
                        name,
                        value: Some(SecuritySchemeOrReference {
                            security_scheme: Some(SecurityScheme {
                                r#type: text(s, "type"),
                                description: text(s, "description"),
                                name: text(s, "name"),
                                r#in: text(s, "in"),
                                scheme: text(s, "scheme"),
                            }),
                        }),
                    })
                    .collect(),
            }),
        }),
        security: security(doc),
        specification_extension: extensions(doc),
    }
    .encode_to_vec()
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
        specification_extension: extensions(item),
    }
}

fn operation(op: &Value) -> Operation {
    Operation {
        tags: strings(op.get("tags")),
        summary: text(op, "summary"),
        description: text(op, "description"),
        operation_id: text(op, "operationId"),
        parameters: parameters(op),
        request_body: op.get("requestBody").map(|b| RequestBodyOrReference {
            request_body: Some(RequestBody {
                description: text(b, "description"),
                content: Some(media_types(&b["content"])),
                required: b["required"].as_bool().unwrap_or(false),
            }),
        }),
        responses: Some(Responses {
            response_or_reference: entries(&op["responses"])
                .map(|(name, r)| NamedResponseOrReference {
                    name,
                    value: Some(ResponseOrReference {
                        response: Some(Response {
                            description: text(r, "description"),
                            content: r.get("content").map(media_types),
                        }),
                    }),
                })
                .collect(),
            specification_extension: Vec::new(),
        }),
        deprecated: op["deprecated"].as_bool().unwrap_or(false),
        specification_extension: extensions(op),
    }
}

fn parameters(holder: &Value) -> Vec<ParameterOrReference> {
    let params = holder["parameters"].as_array().into_iter().flatten();
    params
        .map(|p| match p.get("$ref") {
            Some(r) => ParameterOrReference {
                reference: Some(Reference { r#ref: r.as_str().unwrap_or_default().into(), description: String::new() }),
                ..Default::default()
            },
            None => ParameterOrReference {
                parameter: Some(Parameter {
                    name: text(p, "name"),
                    r#in: text(p, "in"),
                    description: text(p, "description"),
                    required: p["required"].as_bool().unwrap_or(false),
                    schema: p.get("schema").map(schema_or_ref),
                    specification_extension: extensions(p),
                }),
                ..Default::default()
            },
        })
        .collect()
}

fn media_types(content: &Value) -> MediaTypes {
    MediaTypes {
        additional_properties: entries(content)
            .map(|(name, m)| NamedMediaType {
                name,
                value: Some(MediaType { schema: m.get("schema").map(schema_or_ref) }),
            })
            .collect(),
    }
}

fn schema_or_ref(s: &Value) -> SchemaOrReference {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        return SchemaOrReference {
            reference: Some(Reference { r#ref: r.into(), description: text(s, "description") }),
            ..Default::default()
        };
    }
    let number = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let int = |k: &str| s[k].as_i64().unwrap_or(0);
    let list = |k: &str| s[k].as_array().into_iter().flatten().map(schema_or_ref).collect::<Vec<_>>();
    let schema = Schema {
        nullable: s["nullable"].as_bool().unwrap_or(false),
        read_only: s["readOnly"].as_bool().unwrap_or(false),
        example: s.get("example").map(|v| Any { yaml: v.to_string() }),
        deprecated: s["deprecated"].as_bool().unwrap_or(false),
        title: text(s, "title"),
        maximum: number("maximum"),
        minimum: number("minimum"),
        max_length: int("maxLength"),
        min_length: int("minLength"),
        pattern: text(s, "pattern"),
        max_items: int("maxItems"),
        min_items: int("minItems"),
        unique_items: s["uniqueItems"].as_bool().unwrap_or(false),
        required: strings(s.get("required")),
        r#enum: s["enum"].as_array().into_iter().flatten().map(|v| Any { yaml: v.to_string() }).collect(),
        r#type: text(s, "type"),
        all_of: list("allOf"),
        one_of: list("oneOf"),
        any_of: list("anyOf"),
        items: s.get("items").map(|i| ItemsItem { schema_or_reference: vec![schema_or_ref(i)] }),
        properties: s.get("properties").map(|p| Properties {
            additional_properties: entries(p)
                .map(|(name, v)| NamedSchemaOrReference { name, value: Some(schema_or_ref(v)) })
                .collect(),
        }),
        additional_properties: s.get("additionalProperties").map(|a| match a {
            Value::Bool(b) => AdditionalPropertiesItem { schema_or_reference: None, boolean: Some(*b) },
            other => AdditionalPropertiesItem { schema_or_reference: Some(schema_or_ref(other)), boolean: None },
        }),
        default: match s.get("default") {
            Some(Value::Number(n)) => Some(DefaultType { number: n.as_f64(), ..Default::default() }),
            Some(Value::Bool(b)) => Some(DefaultType { boolean: Some(*b), ..Default::default() }),
            Some(Value::String(t)) => Some(DefaultType { string: Some(t.clone()), ..Default::default() }),
            _ => None,
        },
        description: text(s, "description"),
        format: text(s, "format"),
        specification_extension: extensions(s),
    };
    SchemaOrReference { schema: Some(Box::new(schema)), reference: None }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn references_schemas_and_operations_survive_a_round_trip() {
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.37.0"},
            "paths": {"/api/v1/namespaces/{namespace}/configmaps/{name}": {
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "patch": {
                    "operationId": "patchCoreV1NamespacedConfigMap",
                    "requestBody": {"required": true, "content": {"application/apply-patch+yaml": {
                        "schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}}}},
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                },
            }},
            "components": {"schemas": {"io.k8s.api.core.v1.ConfigMap": {
                "type": "object",
                "properties": {"data": {"type": "object", "additionalProperties": {"type": "string", "default": ""}}},
            }}},
        });
        let decoded = Document::decode(encode(&doc).as_slice()).expect("decodes");
        assert_eq!(decoded.openapi, "3.0.0");
        let item = decoded.paths.as_ref().and_then(|p| p.path[0].value.as_ref()).expect("path");
        assert_eq!(item.parameters[0].parameter.as_ref().map(|p| p.required), Some(true));
        let patch = item.patch.as_ref().expect("patch");
        let body = patch.request_body.as_ref().and_then(|b| b.request_body.as_ref()).expect("body");
        let media = &body.content.as_ref().expect("content").additional_properties[0];
        assert_eq!(media.name, "application/apply-patch+yaml");
        let reference = media.value.as_ref().and_then(|m| m.schema.as_ref()).and_then(|s| s.reference.as_ref());
        assert_eq!(
            reference.map(|r| r.r#ref.as_str()),
            Some("#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch")
        );
        let schemas = decoded.components.and_then(|c| c.schemas).expect("schemas");
        let cm = schemas.additional_properties[0].value.as_ref().and_then(|s| s.schema.as_ref()).expect("schema");
        let data = cm
            .properties
            .as_ref()
            .and_then(|p| p.additional_properties[0].value.as_ref())
            .and_then(|s| s.schema.as_ref());
        let values = data.and_then(|d| d.additional_properties.as_ref()).and_then(|a| a.schema_or_reference.as_ref());
        let values = values.and_then(|v| v.schema.as_ref()).expect("value schema");
        assert_eq!(
            (values.r#type.as_str(), values.default.as_ref().and_then(|d| d.string.as_deref())),
            ("string", Some(""))
        );
    }
}
