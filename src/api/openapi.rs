//! OpenAPI documents (being written).
use serde_json::Value;
use crate::registry::patch::MergeKey;
use crate::registry::ResourceInfo;
pub struct ResourceDoc<'a> {
    pub info: &'a ResourceInfo,
    pub merge_keys: &'a [MergeKey],
    pub schema: &'a dyn Fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
}
pub struct V3 { pub index: Value, pub documents: Vec<(String, Value)> }
pub fn v2(_r: &[ResourceDoc<'_>]) -> Value { Value::Null }
pub fn v3(_r: &[ResourceDoc<'_>]) -> V3 { V3 { index: Value::Null, documents: vec![] } }
