//! Unit tests for the parent module.

use super::*;
use serde_json::json;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

#[test]
fn subdomain_valid() {
    for ok in [
        "a",
        "abc",
        "a-b",
        "a.b",
        "example.com",
        "0",
        "a1.b2-c3.d",
        "1-2",
    ] {
        assert!(validate_dns1123_subdomain(ok).is_empty(), "{ok}");
    }
}

#[test]
fn subdomain_invalid() {
    for bad in [
        "", "A", "Foo_Bar", "-a", "a-", "a..b", ".a", "a.", "a_b", "a b", "ä",
    ] {
        assert_eq!(
            validate_dns1123_subdomain(bad),
            vec![SUBDOMAIN_MSG.to_string()],
            "{bad}"
        );
    }
    let long = "a".repeat(254);
    assert_eq!(
        validate_dns1123_subdomain(&long),
        vec!["must be no more than 253 characters".to_string()]
    );
    assert!(validate_dns1123_subdomain(&"a".repeat(253)).is_empty());
    let long_bad = "A".repeat(254);
    assert_eq!(validate_dns1123_subdomain(&long_bad).len(), 2);
}

#[test]
fn label_rules() {
    assert!(validate_dns1123_label("default").is_empty());
    assert!(validate_dns1123_label(&"a".repeat(63)).is_empty());
    assert_eq!(
        validate_dns1123_label(&"a".repeat(64)),
        vec!["must be no more than 63 characters".to_string()]
    );
    assert_eq!(
        validate_dns1123_label("a.b"),
        vec!["must not contain dots".to_string()]
    );
    assert_eq!(validate_dns1123_label("Kube"), vec![LABEL_MSG.to_string()]);
    assert_eq!(validate_dns1123_label(""), vec![LABEL_MSG.to_string()]);
}

#[test]
fn path_segment_rules() {
    assert!(validate_path_segment_name("Foo_Bar:baz", false).is_empty());
    assert_eq!(
        validate_path_segment_name(".", false),
        vec!["may not be '.'".to_string()]
    );
    assert_eq!(
        validate_path_segment_name("..", false),
        vec!["may not be '..'".to_string()]
    );
    assert!(validate_path_segment_name("..", true).is_empty());
    assert_eq!(
        validate_path_segment_name("a/b%c", false),
        vec![
            "may not contain '/'".to_string(),
            "may not contain '%'".to_string()
        ]
    );
}

#[test]
fn qualified_names() {
    for ok in [
        "app",
        "App.Name_1",
        "example.com/name",
        "kubernetes.io/metadata.name",
        "a",
        &"a".repeat(63),
    ] {
        assert!(validate_qualified_name(ok).is_empty(), "{ok}");
    }
    assert_eq!(
        validate_qualified_name(""),
        vec![
            "name part must be non-empty".to_string(),
            NAME_PART_MSG.to_string()
        ]
    );
    assert_eq!(
        validate_qualified_name("-app"),
        vec![NAME_PART_MSG.to_string()]
    );
    assert_eq!(
        validate_qualified_name(&"a".repeat(64)),
        vec!["name part must be no more than 63 characters".to_string()]
    );
    assert_eq!(
        validate_qualified_name("/name"),
        vec!["prefix part must be non-empty".to_string()]
    );
    assert_eq!(
        validate_qualified_name("Example.com/name"),
        vec![format!("prefix part {SUBDOMAIN_MSG}")]
    );
    let three = validate_qualified_name("a/b/c");
    assert_eq!(three.len(), 1);
    assert!(three[0].starts_with("a qualified name must consist of alphanumeric characters"));
    assert!(three[0]
        .ends_with("with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"));
}

#[test]
fn label_values() {
    for ok in ["", "v", "v1.2-3_x", &"a".repeat(63)] {
        assert!(validate_label_value(ok).is_empty(), "{ok}");
    }
    assert_eq!(validate_label_value("-x"), vec![VALUE_MSG.to_string()]);
    assert_eq!(validate_label_value("a b"), vec![VALUE_MSG.to_string()]);
    assert_eq!(
        validate_label_value(&"a".repeat(64)),
        vec!["must be no more than 63 characters".to_string()]
    );
    assert_eq!(validate_label_key("app"), Vec::<String>::new());
}

#[test]
fn labels_map_errors() {
    let errs = validate_labels(
        &json!({"good": "ok", "bad key!": "x", "k": "-v"}),
        "metadata.labels",
    );
    let rendered: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        rendered,
        vec![
            format!("metadata.labels: Invalid value: \"bad key!\": {NAME_PART_MSG}"),
            format!("metadata.labels: Invalid value: \"-v\": {VALUE_MSG}"),
        ]
    );
    let errs = validate_labels(&json!({"a": 1}), "metadata.labels");
    assert_eq!(
        errs[0].to_string(),
        "metadata.labels.a: Invalid value: 1: must be of type string"
    );
    assert_eq!(validate_labels(&json!("x"), "metadata.labels").len(), 1);
    assert!(validate_labels(&Value::Null, "metadata.labels").is_empty());
}

#[test]
fn annotations_rules() {
    assert!(validate_annotations(
        &json!({"kubectl.kubernetes.io/last-applied-configuration": "{}", "Mixed.Case/Key": "v"}),
        "metadata.annotations"
    )
    .is_empty());
    let errs = validate_annotations(&json!({"bad key": "v"}), "metadata.annotations");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "metadata.annotations");
    let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT);
    let errs = validate_annotations(&json!({ "k": big }), "metadata.annotations");
    assert_eq!(
        errs[0].to_string(),
        "metadata.annotations: Too long: must have at most 262144 bytes"
    );
    let exact = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT - 1);
    assert!(validate_annotations(&json!({ "k": exact }), "metadata.annotations").is_empty());
}

#[test]
fn generate_name_prefix_rules() {
    assert!(validate_generate_name("web-", NameRule::DnsSubdomain).is_empty());
    assert!(validate_generate_name("web-", NameRule::DnsLabel).is_empty());
    assert_eq!(
        validate_generate_name("-", NameRule::DnsSubdomain),
        vec![SUBDOMAIN_MSG.to_string()]
    );
    assert_eq!(
        validate_generate_name("Web-", NameRule::DnsSubdomain),
        vec![SUBDOMAIN_MSG.to_string()]
    );
    assert!(validate_generate_name("..", NameRule::PathSegment).is_empty());
}

#[test]
fn generate_name_truncates_and_appends() {
    let mut chars = "bcdfg".chars().cycle();
    let n = generate_name("web-", || chars.next().unwrap_or('x'));
    assert_eq!(n, "web-bcdfg");
    let long = "a".repeat(100);
    let n = generate_name(&long, || 'z');
    assert_eq!(n.len(), 63);
    assert!(n.ends_with("zzzzz"));
    assert_eq!(&n[..58], &"a".repeat(58));
    // multi-byte characters are never split
    let wide = "é".repeat(40); // 80 bytes
    let n = generate_name(&wide, || 'b');
    assert!(n.len() <= 63);
    assert!(n.ends_with("bbbbb"));
    assert_eq!(generate_name("", || 'q'), "qqqqq");
    assert!(GENERATE_NAME_ALPHABET
        .chars()
        .all(|c| c.is_ascii_alphanumeric()));
}

fn rendered(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

#[test]
fn object_meta_valid() {
    let meta = json!({
        "name": "cm-1", "namespace": "default", "labels": {"app": "x"},
        "annotations": {"a": "b"}, "finalizers": ["example.com/f"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u", "controller": true}],
        "generation": 3
    });
    assert!(validate_object_meta(&meta, true, NameRule::DnsSubdomain).is_empty());
    assert!(validate_object_meta(&json!({"name": "ns"}), false, NameRule::DnsLabel).is_empty());
}

#[test]
fn object_meta_name_and_namespace() {
    let errs = validate_object_meta(&json!({}), true, NameRule::DnsSubdomain);
    assert_eq!(
        rendered(&errs),
        vec![
            "metadata.name: Required value: name or generateName is required",
            "metadata.namespace: Required value",
        ]
    );
    let errs = validate_object_meta(&json!({"name": "Foo_Bar"}), false, NameRule::DnsSubdomain);
    assert_eq!(
        rendered(&errs),
        vec![format!(
            "metadata.name: Invalid value: \"Foo_Bar\": {SUBDOMAIN_MSG}"
        )]
    );
    let errs = validate_object_meta(
        &json!({"name": "x", "namespace": "default"}),
        false,
        NameRule::DnsLabel,
    );
    assert_eq!(
        rendered(&errs),
        vec!["metadata.namespace: Forbidden: not allowed on this type"]
    );
    let errs = validate_object_meta(
        &json!({"name": "x", "namespace": "Bad.NS"}),
        true,
        NameRule::DnsSubdomain,
    );
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "metadata.namespace");
    let errs = validate_object_meta(&json!({"name": 5}), false, NameRule::DnsSubdomain);
    assert_eq!(
        errs[0].kind,
        crate::meta::field_error::FieldErrorKind::TypeInvalid
    );
    let errs = validate_object_meta(&json!("x"), false, NameRule::DnsSubdomain);
    assert_eq!(errs.len(), 1);
}

#[test]
fn object_meta_generate_name() {
    let errs = validate_object_meta(
        &json!({"generateName": "Bad_", "name": "bad-abcde"}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(
        rendered(&errs),
        vec![format!(
            "metadata.generateName: Invalid value: \"Bad_\": {SUBDOMAIN_MSG}"
        )]
    );
}

#[test]
fn object_meta_generation_finalizers_owners() {
    let errs = validate_object_meta(
        &json!({"name": "a", "generation": -1}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(
        rendered(&errs),
        vec!["metadata.generation: Invalid value: -1: must be greater than or equal to 0"]
    );
    let errs = validate_object_meta(
        &json!({"name": "a", "finalizers": ["orphan", "foregroundDeletion", "bad/x/y"]}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(errs.len(), 2);
    assert_eq!(
        errs[1].to_string(),
        "metadata.finalizers: Invalid value: [\"orphan\",\"foregroundDeletion\",\"bad/x/y\"]: finalizer orphan and foregroundDeletion cannot be both set"
    );
    let errs = validate_object_meta(
        &json!({"name": "a", "ownerReferences": [{}]}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(
        rendered(&errs),
        vec![
            "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty",
            "metadata.ownerReferences.kind: Invalid value: \"\": kind must not be empty",
            "metadata.ownerReferences.name: Invalid value: \"\": name must not be empty",
            "metadata.ownerReferences.uid: Invalid value: \"\": uid must not be empty",
        ]
    );
    let errs = validate_object_meta(
        &json!({"name": "a", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Event", "name": "e", "uid": "1"},
            {"apiVersion": "a/b/c", "kind": "K", "name": "n", "uid": "2"}
        ]}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(errs.len(), 2);
    assert!(errs[0].detail.contains("disallowed from being an owner"));
    assert_eq!(errs[1].field, "metadata.ownerReferences.apiVersion");
    let errs = validate_object_meta(
        &json!({"name": "a", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d1", "uid": "1", "controller": true},
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d2", "uid": "2", "controller": true}
        ]}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(errs.len(), 1);
    assert!(errs[0]
        .detail
        .ends_with("for Deployment/d1 and Deployment/d2"));
    let errs = validate_object_meta(
        &json!({"name": "a", "ownerReferences": "x", "finalizers": [1]}),
        false,
        NameRule::DnsSubdomain,
    );
    assert_eq!(errs.len(), 2);
}
