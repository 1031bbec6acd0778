//! Unit tests for the parent module.

use super::*;
use time::macros::datetime;

fn secs(s: i64) -> Duration {
    Duration::seconds(s)
}

#[test]
fn human_duration_seconds() {
    assert_eq!(human_duration(Duration::ZERO), "0s");
    assert_eq!(human_duration(secs(7)), "7s");
    assert_eq!(human_duration(secs(59)), "59s");
    assert_eq!(human_duration(secs(119)), "119s");
    assert_eq!(human_duration(Duration::milliseconds(119_999)), "119s");
}

#[test]
fn human_duration_negative() {
    assert_eq!(human_duration(secs(-1)), "0s");
    assert_eq!(human_duration(Duration::milliseconds(-1500)), "0s");
    assert_eq!(human_duration(Duration::milliseconds(-500)), "0s");
    assert_eq!(human_duration(secs(-2)), "<invalid>");
    assert_eq!(human_duration(secs(-3600)), "<invalid>");
    assert_eq!(human_duration(Duration::MIN), "<invalid>");
}

#[test]
fn human_duration_minutes() {
    assert_eq!(human_duration(secs(120)), "2m");
    assert_eq!(human_duration(secs(121)), "2m1s");
    assert_eq!(human_duration(secs(3 * 60 + 12)), "3m12s");
    assert_eq!(human_duration(secs(9 * 60 + 59)), "9m59s");
    assert_eq!(human_duration(secs(10 * 60)), "10m");
    assert_eq!(human_duration(secs(10 * 60 + 30)), "10m");
    assert_eq!(human_duration(secs(179 * 60 + 59)), "179m");
}

#[test]
fn human_duration_hours() {
    assert_eq!(human_duration(secs(180 * 60)), "3h");
    assert_eq!(human_duration(secs(3 * 3600 + 60)), "3h1m");
    assert_eq!(human_duration(secs(7 * 3600 + 59 * 60 + 59)), "7h59m");
    assert_eq!(human_duration(secs(8 * 3600)), "8h");
    assert_eq!(human_duration(secs(8 * 3600 + 59 * 60)), "8h");
    assert_eq!(human_duration(secs(47 * 3600 + 3599)), "47h");
}

#[test]
fn human_duration_days_and_years() {
    let h = |n: i64| secs(n * 3600);
    let d = |n: i64| secs(n * 86400);
    assert_eq!(human_duration(h(48)), "2d");
    assert_eq!(human_duration(h(49)), "2d1h");
    assert_eq!(human_duration(h(5 * 24 + 2)), "5d2h");
    assert_eq!(human_duration(h(8 * 24 - 1)), "7d23h");
    assert_eq!(human_duration(d(8)), "8d");
    assert_eq!(human_duration(d(8) + h(5)), "8d");
    assert_eq!(human_duration(d(729)), "729d");
    assert_eq!(human_duration(d(730)), "2y");
    assert_eq!(human_duration(d(731)), "2y1d");
    assert_eq!(human_duration(d(3 * 365 + 20)), "3y20d");
    assert_eq!(human_duration(d(8 * 365 - 1)), "7y364d");
    assert_eq!(human_duration(d(8 * 365)), "8y");
    assert_eq!(human_duration(d(100 * 365 + 3)), "100y");
    // clamped to Go's ~292 year maximum
    assert_eq!(human_duration(d(1000 * 365)), "292y");
    assert_eq!(human_duration(Duration::MAX), "292y");
}

const NOW: OffsetDateTime = datetime!(2024-09-18 14:06:47 UTC);

#[test]
fn date_cells() {
    let c = |v: Value| cell(Some(&v), "date", NOW);
    assert_eq!(c(json!("2024-09-18T14:06:40Z")), json!("7s"));
    assert_eq!(c(json!("2024-09-18T14:06:40.123456Z")), json!("6s"));
    assert_eq!(c(json!("2024-09-18T16:06:40+02:00")), json!("7s"));
    assert_eq!(c(json!("2024-09-13T12:00:00Z")), json!("5d2h"));
    assert_eq!(c(json!("2024-09-18T14:06:57Z")), json!("<invalid>"));
    assert_eq!(c(json!("")), json!("<unknown>"));
    assert_eq!(c(json!("null")), json!("<unknown>"));
    assert_eq!(c(json!("0001-01-01T00:00:00Z")), json!("<unknown>"));
    assert_eq!(c(json!("yesterday")), json!("<invalid>"));
    assert_eq!(c(json!("2024-09-18")), json!("<invalid>"));
    assert_eq!(c(json!(5)), Value::Null);
    assert_eq!(c(Value::Null), Value::Null);
    assert_eq!(cell(None, "date", NOW), Value::Null);
}

#[test]
fn integer_number_boolean_cells() {
    let c = |v: Value, t: &str| cell(Some(&v), t, NOW);
    assert_eq!(c(json!(3), "integer"), json!(3));
    assert_eq!(c(json!(-3), "integer"), json!(-3));
    assert_eq!(c(json!(3.9), "integer"), json!(3));
    assert_eq!(c(json!(u64::MAX), "integer"), json!(i64::MAX));
    assert_eq!(c(json!("3"), "integer"), Value::Null);
    assert_eq!(c(json!(true), "integer"), Value::Null);
    assert_eq!(c(json!(3), "number"), json!(3.0));
    assert_eq!(c(json!(1.5), "number"), json!(1.5));
    assert_eq!(c(json!("1.5"), "number"), Value::Null);
    assert_eq!(c(json!(true), "boolean"), json!(true));
    assert_eq!(c(json!("true"), "boolean"), Value::Null);
    assert_eq!(c(json!(1), "boolean"), Value::Null);
    assert_eq!(c(json!("x"), "mystery"), Value::Null);
    assert_eq!(cell(None, "integer", NOW), Value::Null);
}

#[test]
fn string_cells() {
    let c = |v: Value| cell(Some(&v), "string", NOW);
    assert_eq!(c(json!("nginx")), json!("nginx"));
    assert_eq!(c(json!(3)), json!("3"));
    assert_eq!(c(json!(1.5)), json!("1.5"));
    assert_eq!(c(json!(false)), json!("false"));
    assert_eq!(c(json!([1, "a"])), json!("[1,\"a\"]"));
    assert_eq!(
        c(json!({"b": 1, "a": "<&>"})),
        json!("{\"a\":\"\\u003c\\u0026\\u003e\",\"b\":1}")
    );
    assert_eq!(c(Value::Null), Value::Null);
}

#[test]
fn include_object_parsing() {
    assert_eq!(parse_include_object(None), Ok(IncludeObject::Metadata));
    assert_eq!(parse_include_object(Some("")), Ok(IncludeObject::Metadata));
    assert_eq!(
        parse_include_object(Some("Metadata")),
        Ok(IncludeObject::Metadata)
    );
    assert_eq!(parse_include_object(Some("None")), Ok(IncludeObject::None));
    assert_eq!(
        parse_include_object(Some("Object")),
        Ok(IncludeObject::Object)
    );
    assert_eq!(
        parse_include_object(Some("object")),
        Err("unrecognized includeObject value: \"object\"".to_string())
    );
    assert_eq!(IncludeObject::default(), IncludeObject::Metadata);
}

fn widget(name: &str, replicas: Value) -> Value {
    json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": "default", "uid": "u-1", "resourceVersion": "1200",
                     "creationTimestamp": "2024-09-18T14:06:40Z", "labels": {"app": "x"}},
        "spec": {"replicas": replicas, "image": "nginx"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn widget_columns() -> Vec<ColumnSpec> {
    crd_columns(Some(&json!([
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Image", "type": "string", "jsonPath": ".spec.image", "priority": 1, "description": "The image"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
        {"name": "Missing", "type": "string", "jsonPath": ".spec.nothing"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ])))
    .unwrap_or_default()
}

#[test]
fn crd_table_shape() {
    let cols = widget_columns();
    assert_eq!(cols.len(), 5);
    let w1 = widget("foo", json!(3));
    let w2 = widget("bar", json!("three"));
    let t = build_table(
        &cols,
        &[&w1, &w2],
        IncludeObject::Metadata,
        "meta.k8s.io/v1",
        json!({"resourceVersion": "1234", "continue": "abc"}),
        NOW,
        false,
    );
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        t["metadata"],
        json!({"resourceVersion": "1234", "continue": "abc"})
    );
    let defs = t["columnDefinitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(defs.len(), 6);
    assert_eq!(
        defs[0],
        json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0})
    );
    assert_eq!(
        defs[1],
        json!({"name": "Replicas", "type": "integer", "format": "", "description": "Custom resource definition column (in JSONPath format): .spec.replicas", "priority": 0})
    );
    assert_eq!(defs[2]["priority"], 1);
    assert_eq!(defs[2]["description"], "The image");
    let rows = t["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0]["cells"],
        json!(["foo", 3, "nginx", "True", null, "7s"])
    );
    assert_eq!(
        rows[1]["cells"],
        json!(["bar", null, "nginx", "True", null, "7s"])
    );
    for r in &rows {
        assert_eq!(r["cells"].as_array().map(Vec::len), Some(defs.len()));
    }
    assert_eq!(
        rows[0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": w1["metadata"].clone()})
    );
}

#[test]
fn include_variants_and_v1beta1() {
    let cols = widget_columns();
    let w = widget("foo", json!(1));
    let t = build_table(
        &cols,
        &[&w],
        IncludeObject::Metadata,
        "meta.k8s.io/v1beta1",
        Value::Null,
        NOW,
        false,
    );
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(t["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(t["metadata"], json!({}));
    let t = build_table(
        &cols,
        &[&w],
        IncludeObject::Object,
        "meta.k8s.io/v1",
        json!({}),
        NOW,
        false,
    );
    assert_eq!(t["rows"][0]["object"], w);
    let t = build_table(
        &cols,
        &[&w],
        IncludeObject::None,
        "meta.k8s.io/v1",
        json!({}),
        NOW,
        false,
    );
    // As kube-apiserver: the row's object is there, as null.
    assert_eq!(t["rows"][0].get("object"), Some(&Value::Null));
    let bare = json!({"kind": "Widget"});
    let t = build_table(
        &cols,
        &[&bare],
        IncludeObject::Metadata,
        "meta.k8s.io/v1",
        json!({}),
        NOW,
        false,
    );
    assert_eq!(t["rows"][0]["object"]["metadata"], json!({}));
    assert_eq!(t["rows"][0]["cells"][0], "");
}

#[test]
fn no_headers_and_empty_lists() {
    let cols = widget_columns();
    let w = widget("foo", json!(1));
    let t = build_table(
        &cols,
        &[&w],
        IncludeObject::Metadata,
        "meta.k8s.io/v1",
        json!({}),
        NOW,
        true,
    );
    assert_eq!(t["columnDefinitions"], Value::Null);
    assert_eq!(t["rows"][0]["cells"].as_array().map(Vec::len), Some(6));
    let t = build_table(
        &cols,
        &[],
        IncludeObject::Metadata,
        "meta.k8s.io/v1",
        json!({"resourceVersion": "5"}),
        NOW,
        false,
    );
    assert_eq!(t["rows"], json!([]));
    assert_eq!(t["columnDefinitions"].as_array().map(Vec::len), Some(6));
}

#[test]
fn crd_defaults_and_errors() {
    let cols = crd_columns(None).unwrap_or_default();
    assert_eq!(cols.len(), 1);
    assert_eq!(cols[0].name, "Age");
    assert_eq!(cols[0].type_, "date");
    assert_eq!(cols[0].description, CREATION_TIMESTAMP_DESCRIPTION);
    assert_eq!(crd_columns(Some(&json!([]))).map(|c| c.len()), Ok(1));
    let err = crd_columns(Some(
        &json!([{"name": "X", "type": "string", "jsonPath": ".a[?("}]),
    ))
    .err();
    assert_eq!(
        err,
        Some("unrecognized column definition \".a[?(\"".to_string())
    );
    let legacy =
        ColumnSpec::from_crd_column(&json!({"name": "L", "type": "string", "JSONPath": ".a"}));
    assert!(legacy.is_ok());
    let w = json!({"metadata": {"name": "n", "creationTimestamp": "2024-09-18T14:06:40Z"}});
    assert_eq!(row_cells(&cols, &w, NOW), vec![json!("n"), json!("7s")]);
    let no_ts = json!({"metadata": {"name": "n"}});
    assert_eq!(row_cells(&cols, &no_ts, NOW), vec![json!("n"), Value::Null]);
}

fn holder(obj: &Value, _now: OffsetDateTime) -> Value {
    obj.get("spec")
        .and_then(|s| s.get("holderIdentity"))
        .cloned()
        .unwrap_or(Value::String("<none>".into()))
}

#[test]
fn builtin_style_columns() {
    let cols = vec![
        ColumnSpec::new(
            "Data",
            "string",
            Source::Count(vec![vec!["data".into()], vec!["binaryData".into()]]),
        ),
        ColumnSpec::new("Holder", "string", Source::Func(holder)),
        ColumnSpec::new("Age", "string", Source::Age),
        ColumnSpec::new("Also", "string", Source::Name),
    ];
    let cm = json!({"metadata": {"name": "cm", "creationTimestamp": "2024-09-18T11:06:47Z"},
                    "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
    assert_eq!(
        row_cells(&cols, &cm, NOW),
        vec![
            json!("cm"),
            json!(3),
            json!("<none>"),
            json!("3h"),
            json!("cm")
        ]
    );
    let empty = json!({"metadata": {"name": "e"}, "data": "weird"});
    assert_eq!(
        row_cells(&cols, &empty, NOW),
        vec![
            json!("e"),
            json!(0),
            json!("<none>"),
            json!("<unknown>"),
            json!("e")
        ]
    );
    let bad_ts = json!({"metadata": {"name": "b", "creationTimestamp": 5}});
    assert_eq!(object_age(&bad_ts, NOW), "<invalid>");
    assert_eq!(age_of("2024-09-18T14:06:47Z", NOW), "0s");
}

#[test]
fn column_builder() {
    let c = ColumnSpec::new("X", "integer", Source::Name)
        .with_format("int32")
        .with_description("d")
        .with_priority(2);
    assert_eq!(
        c.definition(),
        json!({"name": "X", "type": "integer", "format": "int32", "description": "d", "priority": 2})
    );
    assert_eq!(name_column().definition()["format"], "name");
    assert_eq!(age_column().name, "Age");
}

#[test]
fn print_value_rules() {
    assert_eq!(print_value(&json!("s")), Some("s".into()));
    assert_eq!(print_value(&json!(1e21)), Some("1e+21".into()));
    assert_eq!(print_value(&Value::Null), None);
    assert_eq!(
        print_value(&json!(["\u{2028}"])),
        Some("[\"\\u2028\"]".into())
    );
}
