//! Server-side printing: builds `meta.k8s.io` Table responses (kubectl get) from objects and columns.
//! Cells follow the CRD table convertor rules; ages use Kubernetes' human-readable durations.

use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

use crate::meta::field_error::{go_quote, render_number};
use crate::meta::jsonpath::{self, Path};

/// Description of the `Name` column (ObjectMeta.name), in this project's words.
pub const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. It is required when creating resources, although some resources let the client ask for a generated name instead. Names exist mainly for idempotent creation and configuration, and cannot be changed later. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// Description of creation-time columns (ObjectMeta.creationTimestamp), in this project's words.
pub const CREATION_TIMESTAMP_DESCRIPTION: &str = "CreationTimestamp is the server time at which this object was created, in RFC 3339 form and UTC. Clients cannot set it; it is filled in by the system and is read-only. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// Renders a duration the way Kubernetes does for ages (`7s`, `3m12s`, `5h`, `5d2h`, `3y20d`):
/// about two significant units; slightly negative values (clock skew under 2s) read `0s`, more
/// negative ones `<invalid>`.
pub fn human_duration(d: Duration) -> String {
    // Go durations are int64 nanoseconds; clamp to the same range.
    let max = Duration::nanoseconds(i64::MAX);
    let min = Duration::nanoseconds(i64::MIN);
    let d = d.clamp(min, max);
    let seconds = d.whole_seconds();
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = d.whole_minutes();
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = d.whole_hours();
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{}h", hours / 24, h)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{}d", hours / 24 / 365, dy)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Parses an RFC 3339 timestamp; `Ok(None)` for the zero time (`""`, `"null"`,
/// `0001-01-01T00:00:00Z`), `Err` when unparsable.
fn parse_timestamp(s: &str) -> Result<Option<OffsetDateTime>, ()> {
    if s.is_empty() || s == "null" {
        return Ok(None);
    }
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| ())?;
    // Go's zero time.Time, 0001-01-01T00:00:00Z
    if t.unix_timestamp() == -62_135_596_800 && t.nanosecond() == 0 {
        return Ok(None);
    }
    Ok(Some(t))
}

/// The age of an RFC 3339 timestamp string relative to `now`: `<unknown>` for a zero time,
/// `<invalid>` when unparsable.
pub fn age_of(timestamp: &str, now: OffsetDateTime) -> String {
    match parse_timestamp(timestamp) {
        Ok(Some(t)) => human_duration(now - t),
        Ok(None) => "<unknown>".to_string(),
        Err(()) => "<invalid>".to_string(),
    }
}

/// The `AGE` text of an object from its `metadata.creationTimestamp` (`<unknown>` when absent).
pub fn object_age(obj: &Value, now: OffsetDateTime) -> String {
    match obj.get("metadata").and_then(|m| m.get("creationTimestamp")) {
        Some(Value::String(s)) => age_of(s, now),
        Some(Value::Null) | None => "<unknown>".to_string(),
        Some(_) => "<invalid>".to_string(),
    }
}

/// Renders a value as JSONPath printing does: strings raw, numbers and booleans formatted,
/// objects and arrays as compact JSON (HTML characters escaped like Go), `null` as nothing.
pub fn print_value(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(render_number(n)),
        Value::Array(_) | Value::Object(_) => Some(
            v.to_string()
                .replace('<', "\\u003c")
                .replace('>', "\\u003e")
                .replace('&', "\\u0026")
                .replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029"),
        ),
    }
}

/// Converts a column value to a table cell for a CRD column type: `integer` → int64, `number` →
/// float64, `boolean`, `string` (non-strings printed), `date` → age text. Missing, `null` or
/// mismatched values give `null`.
pub fn cell(value: Option<&Value>, column_type: &str, now: OffsetDateTime) -> Value {
    let Some(v) = value else {
        return Value::Null;
    };
    match (column_type, v) {
        (_, Value::Null) => Value::Null,
        ("integer", Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(i64::try_from(u).unwrap_or(i64::MAX))
            } else {
                // float64 → int64 truncates (saturating here)
                Value::from(n.as_f64().unwrap_or(0.0) as i64)
            }
        }
        ("number", Value::Number(n)) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ("boolean", Value::Bool(b)) => Value::Bool(*b),
        ("string", other) => print_value(other).map(Value::String).unwrap_or(Value::Null),
        ("date", Value::String(s)) => Value::String(age_of(s, now)),
        _ => Value::Null,
    }
}

/// What each row's `object` carries (`includeObject` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No `object` in rows.
    None,
    /// A `PartialObjectMetadata` with the object's metadata (the default).
    #[default]
    Metadata,
    /// The full object.
    Object,
}

/// Parses `includeObject`: `None`, `Metadata` (also empty/absent) or `Object`.
pub fn parse_include_object(value: Option<&str>) -> Result<IncludeObject, String> {
    match value {
        None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
        Some("None") => Ok(IncludeObject::None),
        Some("Object") => Ok(IncludeObject::Object),
        Some(other) => Err(format!(
            "unrecognized includeObject value: {}",
            go_quote(other)
        )),
    }
}

/// Where a column's cell value comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// `metadata.name`.
    Name,
    /// A JSONPath evaluated on the object; the first result is used.
    JsonPath(Path),
    /// Sum of the sizes of the maps/lists at these field paths (e.g. ConfigMap `DATA`).
    Count(Vec<Vec<String>>),
    /// Human-readable age from `metadata.creationTimestamp` (built-in `AGE` columns).
    Age,
    /// Any other computation.
    Func(fn(&Value, OffsetDateTime) -> Value),
}

/// One table column: its definition plus how to compute cells.
#[derive(Debug, Clone)]
pub struct ColumnSpec {
    /// Header text.
    pub name: String,
    /// OpenAPI type: `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// OpenAPI format hint (e.g. `name`), usually empty.
    pub format: String,
    /// Human-readable description.
    pub description: String,
    /// 0 = always shown, higher = only with `-o wide`.
    pub priority: i32,
    /// How cells are computed.
    pub source: Source,
}

impl ColumnSpec {
    /// A column with empty format and description and priority 0.
    pub fn new(name: impl Into<String>, type_: impl Into<String>, source: Source) -> Self {
        ColumnSpec {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            source,
        }
    }

    /// Sets the format.
    pub fn with_format(mut self, format: impl Into<String>) -> Self {
        self.format = format.into();
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Sets the priority.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The `TableColumnDefinition` JSON.
    pub fn definition(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }

    /// Builds a column from a CRD `additionalPrinterColumns` entry
    /// (`{name, type, format?, description?, priority?, jsonPath}`).
    pub fn from_crd_column(col: &Value) -> Result<ColumnSpec, String> {
        let text = |k: &str| col.get(k).and_then(Value::as_str).unwrap_or("");
        let path_text = col
            .get("jsonPath")
            .or_else(|| col.get("JSONPath"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let path = jsonpath::parse(&format!("{{{path_text}}}"))
            .map_err(|_| format!("unrecognized column definition {}", go_quote(path_text)))?;
        let description = match text("description") {
            "" => format!("Custom resource definition column (in JSONPath format): {path_text}"),
            d => d.to_string(),
        };
        let priority = col
            .get("priority")
            .and_then(Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(0);
        Ok(
            ColumnSpec::new(text("name"), text("type"), Source::JsonPath(path))
                .with_format(text("format"))
                .with_description(description)
                .with_priority(priority),
        )
    }

    fn cell_for(&self, obj: &Value, now: OffsetDateTime) -> Value {
        match &self.source {
            Source::Name => Value::String(object_name(obj).to_string()),
            Source::JsonPath(path) => cell(jsonpath::evaluate_first(path, obj), &self.type_, now),
            Source::Count(paths) => {
                let total: usize = paths
                    .iter()
                    .map(|p| {
                        let mut cur = Some(obj);
                        for seg in p {
                            cur = cur.and_then(|c| c.get(seg.as_str()));
                        }
                        match cur {
                            Some(Value::Object(m)) => m.len(),
                            Some(Value::Array(a)) => a.len(),
                            _ => 0,
                        }
                    })
                    .fold(0usize, usize::saturating_add);
                Value::from(i64::try_from(total).unwrap_or(i64::MAX))
            }
            Source::Age => Value::String(object_age(obj, now)),
            Source::Func(f) => f(obj, now),
        }
    }
}

fn object_name(obj: &Value) -> &str {
    obj.get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The `Name` column every table starts with.
pub fn name_column() -> ColumnSpec {
    ColumnSpec::new("Name", "string", Source::Name)
        .with_format("name")
        .with_description(NAME_DESCRIPTION)
}

/// The default CRD `Age` column (`.metadata.creationTimestamp`, type `date`).
pub fn age_column() -> ColumnSpec {
    let path = Path::from_fields(&["metadata", "creationTimestamp"]);
    ColumnSpec::new("Age", "date", Source::JsonPath(path))
        .with_description(CREATION_TIMESTAMP_DESCRIPTION)
}

/// The columns of a CRD version from its `additionalPrinterColumns` (not including `Name`);
/// none given → the default `Age` column.
pub fn crd_columns(additional: Option<&Value>) -> Result<Vec<ColumnSpec>, String> {
    match additional.and_then(Value::as_array) {
        Some(cols) if !cols.is_empty() => cols.iter().map(ColumnSpec::from_crd_column).collect(),
        _ => Ok(vec![age_column()]),
    }
}

/// The cells of one row: the name first, then one cell per column.
pub fn row_cells(columns: &[ColumnSpec], obj: &Value, now: OffsetDateTime) -> Vec<Value> {
    let mut cells = Vec::with_capacity(columns.len() + 1);
    cells.push(Value::String(object_name(obj).to_string()));
    cells.extend(columns.iter().map(|c| c.cell_for(obj, now)));
    cells
}

/// Builds a Table. `columns` are the kind's columns after the implicit leading `Name`;
/// `table_api_version` is `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`; `list_meta` becomes the
/// Table's `metadata` (`resourceVersion`, `continue`, `remainingItemCount`); `no_headers` sends
/// `columnDefinitions: null` (watch events after the first).
pub fn build_table(
    columns: &[ColumnSpec],
    objects: &[&Value],
    include: IncludeObject,
    table_api_version: &str,
    list_meta: Value,
    now: OffsetDateTime,
    no_headers: bool,
) -> Value {
    let definitions = if no_headers {
        Value::Null
    } else {
        let mut defs = vec![name_column().definition()];
        defs.extend(columns.iter().map(ColumnSpec::definition));
        Value::Array(defs)
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = Map::new();
            row.insert(
                "cells".to_string(),
                Value::Array(row_cells(columns, obj, now)),
            );
            match include {
                IncludeObject::None => {
                    row.insert("object".to_string(), Value::Null);
                }
                IncludeObject::Metadata => {
                    let metadata = match obj.get("metadata") {
                        Some(m @ Value::Object(_)) => m.clone(),
                        _ => Value::Object(Map::new()),
                    };
                    row.insert(
                        "object".to_string(),
                        json!({
                            "kind": "PartialObjectMetadata",
                            "apiVersion": table_api_version,
                            "metadata": metadata,
                        }),
                    );
                }
                IncludeObject::Object => {
                    row.insert("object".to_string(), (*obj).clone());
                }
            }
            Value::Object(row)
        })
        .collect();
    let metadata = match list_meta {
        m @ Value::Object(_) => m,
        _ => Value::Object(Map::new()),
    };
    json!({
        "kind": "Table",
        "apiVersion": table_api_version,
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests;
