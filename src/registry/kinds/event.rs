//! Events, served as core/v1 and as `events.k8s.io/v1`: two views of one storage, kept in the core
//! form and converted field by field for the newer API (as upstream does).

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use serde_json::{Map, Value, json};

use crate::registry::error::{Result, StatusError};
use crate::registry::strategy::{Column, Kind, NameRule, ResourceInfo, field_at, since, since_cell};
use crate::registry::validation::{ErrorList, FieldError};

pub struct CoreEvents;
pub struct Events;

const STORAGE: &str = "events";
const TYPES: &[&str] = &["Normal", "Warning"];

/// Field-selector fields of events (upstream's `EventToSelectableFields`).
const CORE_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// `(core/v1 name, events.k8s.io/v1 name)` of the fields whose names differ.
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn rename(obj: Value, forward: bool, api_version: &str) -> Value {
    let Value::Object(map) = obj else { return obj };
    let mut out = Map::with_capacity(map.len());
    for (k, v) in map {
        let name = RENAMES
            .iter()
            .find(|(core, new)| if forward { core == &k } else { new == &k })
            .map(|(core, new)| if forward { *new } else { *core })
            .unwrap_or(&k)
            .to_string();
        out.insert(name, v);
    }
    out.insert("apiVersion".into(), json!(api_version));
    Value::Object(out)
}

/// Event fields: JSON paths, except `source`, which is the reporting component.
fn event_field(e: &Value, field: &str, source: &str) -> Option<String> {
    Some(if field == "source" { field_at(&e[source], "component") } else { field_at(e, field) })
}

fn event_columns() -> Vec<Column> {
    vec![
        Column::new("Last Seen", "string", "Time when last event occurred"),
        Column::new("Type", "string", "Type of this event (Normal, Warning), new types could be added in the future."),
        Column::new(
            "Reason",
            "string",
            "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
        ),
        Column::new("Object", "string", "The object that this event is about."),
        Column::new("Subobject", "string", "If the reference is to a sub-object, which field in the object.").wide(),
        Column::new(
            "Source",
            "string",
            "The component reporting this event. Should be a short machine understandable string.",
        )
        .wide(),
        Column::new("Message", "string", "A human-readable description of the status of this operation."),
        Column::new(
            "First Seen",
            "string",
            "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
        )
        .wide(),
        Column::new("Count", "integer", "The number of times this event has occurred.").wide(),
        Column::new("Name", "string", "Name must be unique within a namespace.").wide().format("name"),
    ]
}

/// Upstream's `printEvent`.
fn event_cells(e: &CoreEvent) -> Vec<Value> {
    let first = match &e.first_timestamp {
        Some(t) => since_cell(Some(t)),
        None => since(e.event_time.as_ref().map(|t| t.0)),
    };
    let mut last = match &e.last_timestamp {
        Some(t) => since_cell(Some(t)),
        None => first.clone(),
    };
    let mut count = e.count.unwrap_or(0);
    if let Some(series) = &e.series {
        last = since(series.last_observed_time.as_ref().map(|t| t.0));
        count = series.count.unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let o = &e.involved_object;
    let kind = o.kind.clone().unwrap_or_default().to_lowercase();
    let target = match o.name.as_deref() {
        Some(n) if !n.is_empty() => format!("{kind}/{n}"),
        _ => kind,
    };
    let source = match (&e.source, &e.reporting_component) {
        (Some(s), _) if s.component.as_deref().is_some_and(|c| !c.is_empty()) => {
            let c = s.component.clone().unwrap_or_default();
            match s.host.as_deref().filter(|h| !h.is_empty()) {
                Some(h) => format!("{c}, {h}"),
                None => c,
            }
        }
        (_, Some(rc)) if !rc.is_empty() => match e.reporting_instance.as_deref().filter(|i| !i.is_empty()) {
            Some(i) => format!("{rc}, {i}"),
            None => rc.clone(),
        },
        _ => String::new(),
    };
    vec![
        last,
        json!(e.type_.clone().unwrap_or_default()),
        json!(e.reason.clone().unwrap_or_default()),
        json!(target),
        json!(o.field_path.clone().unwrap_or_default()),
        json!(source),
        json!(e.message.clone().unwrap_or_default().trim()),
        first,
        json!(count),
        json!(e.metadata.name.clone().unwrap_or_default()),
    ]
}

/// An event's `type` is Normal or Warning when set.
fn validate_type(t: Option<&str>) -> ErrorList {
    match t.filter(|t| !t.is_empty()) {
        Some(t) if !TYPES.contains(&t) => vec![FieldError::not_supported("type", t, TYPES)],
        _ => Vec::new(),
    }
}

impl Kind for CoreEvents {
    type Obj = CoreEvent;
    const INFO: ResourceInfo = ResourceInfo {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
        storage: STORAGE,
        return_deleted_object: false,
    };
    const FIELDS: &'static [&'static str] = CORE_FIELDS;
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, e: &CoreEvent) -> ErrorList {
        let mut errs = validate_type(e.type_.as_deref());
        let ns = e.metadata.namespace.clone().unwrap_or_default();
        if let Some(obj_ns) = e.involved_object.namespace.as_deref().filter(|n| !n.is_empty())
            && obj_ns != ns
        {
            errs.push(FieldError::invalid("involvedObject.namespace", obj_ns, "does not match event.namespace"));
        }
        errs
    }

    fn field(&self, e: &Value, field: &str) -> Option<String> {
        event_field(e, field, "source")
    }

    fn columns(&self) -> Vec<Column> {
        event_columns()
    }

    fn cells(&self, e: &CoreEvent) -> Vec<Value> {
        event_cells(e)
    }
}

impl Kind for Events {
    type Obj = Event;
    const INFO: ResourceInfo = ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
        storage: STORAGE,
        return_deleted_object: false,
    };
    const FIELDS: &'static [&'static str] = &[
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    ];
    const NAME_RULE: NameRule = NameRule::PathSegment;

    fn validate(&self, e: &Event) -> ErrorList {
        let mut errs = validate_type(e.type_.as_deref());
        if e.metadata.creation_timestamp.is_none() && e.event_time.is_none() {
            errs.push(FieldError::required("eventTime", ""));
        }
        errs
    }

    fn field(&self, e: &Value, field: &str) -> Option<String> {
        event_field(e, field, "deprecatedSource")
    }

    fn columns(&self) -> Vec<Column> {
        event_columns()
    }

    fn cells(&self, e: &Event) -> Vec<Value> {
        to_core(e).map(|c| event_cells(&c)).unwrap_or_default()
    }

    fn decode_stored(&self, stored: Value) -> Result<Value> {
        Ok(rename(stored, true, "events.k8s.io/v1"))
    }

    fn encode_stored(&self, obj: Value) -> Result<Value> {
        let v = rename(obj, false, "v1");
        // Check the stored form is a valid core event before accepting it.
        serde_json::from_value::<CoreEvent>(v.clone()).map_err(StatusError::internal)?;
        Ok(v)
    }

    fn converts(&self) -> bool {
        true
    }
}

fn to_core(e: &Event) -> Option<CoreEvent> {
    let v = serde_json::to_value(e).ok()?;
    serde_json::from_value(rename(v, false, "v1")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_round_trips() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "d"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "message": "hi", "count": 2, "reason": "Started"});
        let new = rename(core.clone(), true, "events.k8s.io/v1");
        assert_eq!(new["regarding"]["name"], "p");
        assert_eq!(new["note"], "hi");
        assert_eq!(new["deprecatedCount"], 2);
        assert_eq!(rename(new, false, "v1"), core);
    }

    #[test]
    fn event_row() {
        let e: CoreEvent = serde_json::from_value(json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
            "type": "Normal", "reason": "Scheduled", "message": "Successfully assigned d/p to n ", "source": {"component": "default-scheduler"}})).unwrap();
        let cells = event_cells(&e);
        assert_eq!(cells[3], "pod/p");
        assert_eq!(cells[5], "default-scheduler");
        assert_eq!(cells[6], "Successfully assigned d/p to n");
        assert_eq!(cells[8], 1);
    }
}
