//! Unit tests for the parent module.

use super::*;
use serde_json::json;

fn sel(s: &str) -> LabelSelector {
    LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn err(s: &str) -> String {
    match LabelSelector::parse(s) {
        Ok(sel) => panic!("{s} parsed as {sel}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn empty_selects_everything() {
    for s in ["", "   ", "\t\n"] {
        let l = sel(s);
        assert!(l.is_empty());
        assert!(l.matches(None));
        assert!(l.matches(Some(&json!({"a": "b"}))));
    }
    assert!(LabelSelector::everything().matches(Some(&Value::Null)));
}

#[test]
fn equality_forms() {
    let l = json!({"app": "web", "tier": "front"});
    assert!(sel("app=web").matches(Some(&l)));
    assert!(sel("app==web").matches(Some(&l)));
    assert!(sel(" app = web ").matches(Some(&l)));
    assert!(!sel("app=db").matches(Some(&l)));
    assert!(sel("app!=db").matches(Some(&l)));
    assert!(!sel("app!=web").matches(Some(&l)));
    assert!(sel("missing!=x").matches(Some(&l)));
    assert!(!sel("missing=x").matches(Some(&l)));
    assert!(sel("app=web,tier=front").matches(Some(&l)));
    assert!(!sel("app=web,tier=back").matches(Some(&l)));
    // `k=` means "equals the empty string"
    let r = sel("app=");
    assert_eq!(r.requirements()[0].values(), &[String::new()]);
    assert!(r.matches(Some(&json!({"app": ""}))));
    assert!(!r.matches(Some(&json!({}))));
}

#[test]
fn set_forms() {
    let l = json!({"env": "prod"});
    assert!(sel("env in (prod,dev)").matches(Some(&l)));
    assert!(sel("env in(prod)").matches(Some(&l)));
    assert!(!sel("env in (dev, qa)").matches(Some(&l)));
    assert!(sel("env notin (dev,qa)").matches(Some(&l)));
    assert!(!sel("env notin (prod)").matches(Some(&l)));
    assert!(sel("other notin (prod)").matches(Some(&l)));
    assert!(!sel("other in (prod)").matches(Some(&l)));
    // empty set means {""}
    assert_eq!(
        sel("env in ()").requirements()[0].values(),
        &[String::new()]
    );
    assert_eq!(
        sel("env in (a,,b)").requirements()[0].values(),
        &["".to_string(), "a".to_string(), "b".to_string()]
    );
    assert_eq!(
        sel("env in (,a)").requirements()[0].values(),
        &["".to_string(), "a".to_string()]
    );
    assert_eq!(
        sel("env in (a,)").requirements()[0].values(),
        &["".to_string(), "a".to_string()]
    );
    assert_eq!(
        sel("env in (b,a,b)").requirements()[0].values(),
        &["a", "b"]
    );
    // keywords are plain identifiers in key/value position
    assert!(sel("in in (notin)").matches(Some(&json!({"in": "notin"}))));
}

#[test]
fn existence_forms() {
    let l = json!({"app": "web"});
    assert!(sel("app").matches(Some(&l)));
    assert!(!sel("tier").matches(Some(&l)));
    assert!(sel("!tier").matches(Some(&l)));
    assert!(!sel("!app").matches(Some(&l)));
    assert!(sel("app,!tier").matches(Some(&l)));
    assert!(sel("!tier,app").matches(Some(&l)));
    assert!(sel("!app").matches(None));
    assert!(!sel("app").matches(None));
}

#[test]
fn numeric_comparisons() {
    let l = json!({"n": "5", "s": "x"});
    assert!(sel("n>3").matches(Some(&l)));
    assert!(!sel("n>5").matches(Some(&l)));
    assert!(sel("n<6").matches(Some(&l)));
    assert!(!sel("n<5").matches(Some(&l)));
    // "-1" is not a valid label value, so negative limits are rejected (as in Kubernetes)
    assert!(err("n<-1").contains("values[0][-1]: Invalid value: \"-1\""));
    assert!(!sel("s>1").matches(Some(&l)));
    assert!(!sel("missing>1").matches(Some(&l)));
    assert_eq!(
        err("n>x"),
        "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
    );
}

#[test]
fn non_string_labels_are_ignored() {
    let l = json!({"n": 5});
    assert!(!sel("n").matches(Some(&l)));
    assert!(sel("!n").matches(Some(&l)));
    assert!(!sel("n").matches(Some(&json!("not a map"))));
}

#[test]
fn other_label_containers() {
    let s = sel("app=web");
    let mut m = BTreeMap::new();
    m.insert("app".to_string(), "web".to_string());
    assert!(s.matches_labels(&m));
    assert!(s.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
    assert!(!s.matches_object(&json!({"metadata": {}})));
    assert!(!s.matches_object(&json!(null)));
}

#[test]
fn display_round_trips() {
    let s = sel("z=1, a in (y,x), !b, c, d!=2, e notin (q), f>1, g<2, h==3");
    assert_eq!(
        s.to_string(),
        "a in (x,y),!b,c,d!=2,e notin (q),f>1,g<2,h==3,z=1"
    );
    assert_eq!(sel(&s.to_string()), s);
}

#[test]
fn structural_errors() {
    assert_eq!(err("a=b,"), "found '', expected: identifier after ','");
    assert_eq!(err("a=b,,c"), "found ',', expected: identifier after ','");
    assert_eq!(
        err(",a"),
        "found ',', expected: !, identifier, or 'end of string'"
    );
    assert_eq!(
        err("=a"),
        "found '=', expected: !, identifier, or 'end of string'"
    );
    assert_eq!(
        err("a=b c=d"),
        "found 'c', expected: ',' or 'end of string'"
    );
    assert_eq!(err("!a=b"), "found '=', expected: ',' or 'end of string'");
    assert_eq!(
        err("a b"),
        "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
    );
    assert_eq!(
        err("a in b"),
        "unable to parse requirement: found 'b' expected: '('"
    );
    assert_eq!(
        err("a in (b"),
        "unable to parse requirement: found '', expected: ',' or ')'"
    );
    assert_eq!(
        err("a in (="),
        "unable to parse requirement: found '=', expected: ',', ')' or identifier"
    );
    assert_eq!(
        err("a in (b,="),
        "unable to parse requirement: found '=', expected: ',', or identifier"
    );
    assert_eq!(
        err("a>=1"),
        "unable to parse requirement: found '=', expected: identifier"
    );
    assert_eq!(
        err("!"),
        "unable to parse requirement: found '', expected: identifier"
    );
    assert_eq!(
        err("!!a"),
        "unable to parse requirement: found '!', expected: identifier"
    );
}

#[test]
fn double_equals_without_value_is_empty_value() {
    // `a==` parses like `a=`: the value is the empty string
    assert_eq!(sel("a==").requirements()[0].values(), &[String::new()]);
    assert_eq!(sel("a!=").requirements()[0].operator(), Operator::NotEquals);
}

#[test]
fn key_and_value_validation_errors() {
    let e = err("-bad=x");
    assert!(
        e.starts_with("unable to parse requirement: <nil>: Invalid value: \"-bad\": name part must consist of"),
        "{e}"
    );
    let e = err("a/b/c");
    assert!(
        e.starts_with(
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name"
        ),
        "{e}"
    );
    let e = err("app=-x");
    assert!(
        e.starts_with("unable to parse requirement: values[0][-x]: Invalid value: \"-x\": a valid label must be an empty string"),
        "{e}"
    );
    let long = format!("app={}", "a".repeat(64));
    let e = err(&long);
    assert!(e.contains("must be no more than 63 characters"), "{e}");
    let e = err("app in (-x,-y)");
    assert!(
        e.starts_with("unable to parse requirement: [values[0][-x]"),
        "{e}"
    );
    assert!(e.contains(", values[1][-y]: "), "{e}");
    assert!(sel("example.com/app=x").matches(Some(&json!({"example.com/app": "x"}))));
}

#[test]
fn requirement_new_checks_counts() {
    assert!(Requirement::new("a", Operator::In, vec![]).is_err());
    assert!(Requirement::new("a", Operator::Equals, vec![]).is_err());
    assert!(Requirement::new("a", Operator::Exists, vec!["x".into()]).is_err());
    assert!(Requirement::new("a", Operator::GreaterThan, vec!["1".into(), "2".into()]).is_err());
    let e = Requirement::new("a", Operator::In, vec![]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unable to parse requirement: values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
    );
    let e = Requirement::new("Bad Key", Operator::Exists, vec![]).unwrap_err();
    assert!(e
        .to_string()
        .starts_with("unable to parse requirement: key: Invalid value: \"Bad Key\""));
    let ok = Requirement::new("a", Operator::In, vec!["x".into()]).unwrap();
    let s = LabelSelector::from_requirements(vec![ok]);
    assert!(s.matches(Some(&json!({"a": "x"}))));
}

#[test]
fn never_panics_on_odd_input() {
    for s in [
        "(",
        ")",
        "((",
        "a in ((",
        "!!",
        "!,",
        "a=b=c",
        "a in (b))",
        "é=ü",
        "a\u{0}=b",
        "a<",
        "a>",
        "a in",
        "a notin",
        "a,",
        "  ,  ",
        "\\",
        "a=(",
        "a in (b c)",
    ] {
        let _ = LabelSelector::parse(s);
    }
    assert!(LabelSelector::parse("a=b=c").is_err());
}

// ---------------- field selectors ----------------

fn fsel(s: &str) -> FieldSelector {
    FieldSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn field_parse_forms() {
    let f = fsel("metadata.name=foo");
    assert_eq!(
        f.requirements(),
        &[FieldRequirement {
            field: "metadata.name".into(),
            operator: FieldOperator::Equals,
            value: "foo".into()
        }]
    );
    assert_eq!(
        fsel("a==b").requirements()[0].operator,
        FieldOperator::DoubleEquals
    );
    assert_eq!(fsel("a==b").requirements()[0].value, "b");
    assert_eq!(
        fsel("a!=b").requirements()[0].operator,
        FieldOperator::NotEquals
    );
    assert_eq!(fsel("a=").requirements()[0].value, "");
    assert!(fsel("").is_empty());
    assert!(fsel(",").is_empty());
    assert_eq!(fsel("b=1,a=2").requirements()[0].field, "a");
}

#[test]
fn field_escapes() {
    let f = fsel(r"a=x\,y\=z\\w,b=c");
    assert_eq!(f.requirements()[0].value, r"x,y=z\w");
    assert_eq!(f.requirements()[1].value, "c");
    assert_eq!(f.to_string(), r"a=x\,y\=z\\w,b=c");
    assert_eq!(
        FieldSelector::parse(r"a=x\n").unwrap_err().to_string(),
        "invalid field selector: invalid escape sequence: \\n"
    );
    assert_eq!(
        FieldSelector::parse(r"a=x\").unwrap_err().to_string(),
        "invalid field selector: invalid escape sequence: \\"
    );
    assert_eq!(
        FieldSelector::parse("a=b=c").unwrap_err().to_string(),
        "invalid field selector: unescaped character in value: ="
    );
    assert_eq!(escape_field_value(r"a,b=c\"), r"a\,b\=c\\");
}

#[test]
fn field_parse_errors() {
    assert_eq!(
        FieldSelector::parse("metadata.name")
            .unwrap_err()
            .to_string(),
        "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
    );
    assert_eq!(
        FieldSelector::parse("a=b,c").unwrap_err().to_string(),
        "invalid selector: 'a=b,c'; can't understand 'c'"
    );
    for s in ["=", "!", "!=", "é=ü", "\\", "\\,", "a=\\,"] {
        let _ = FieldSelector::parse(s);
    }
}

#[test]
fn field_validation() {
    let f = fsel("metadata.name=a,spec.x=b");
    assert!(f.validate_fields(&["metadata.name", "spec.x"]).is_ok());
    assert_eq!(
        f.validate_fields(&["metadata.name", "metadata.namespace"])
            .unwrap_err()
            .to_string(),
        "field label not supported: spec.x"
    );
    assert!(fsel("").validate_fields(&[]).is_ok());
}

#[test]
fn field_matching() {
    let obj = json!({
        "metadata": {"name": "foo", "namespace": "default"},
        "type": "Opaque",
        "spec": {"replicas": 3, "paused": false, "ratio": 1.5, "nested": {"a": 1}},
        "involvedObject": {"name": "pod-1", "kind": "Pod"}
    });
    assert!(fsel("metadata.name=foo").matches(&obj));
    assert!(fsel("metadata.name==foo,metadata.namespace=default").matches(&obj));
    assert!(!fsel("metadata.name=bar").matches(&obj));
    assert!(fsel("metadata.name!=bar").matches(&obj));
    assert!(fsel("type=Opaque").matches(&obj));
    assert!(fsel("involvedObject.name=pod-1,involvedObject.kind=Pod").matches(&obj));
    assert!(fsel("spec.replicas=3").matches(&obj));
    assert!(fsel("spec.paused=false").matches(&obj));
    assert!(fsel("spec.ratio=1.5").matches(&obj));
    assert!(fsel("spec.nested=").matches(&obj));
    assert!(fsel("spec.missing=").matches(&obj));
    assert!(fsel("spec.missing!=x").matches(&obj));
    assert!(!fsel("spec.missing=x").matches(&obj));
    let cluster = json!({"metadata": {"name": "ns"}});
    assert!(fsel("metadata.namespace=").matches(&cluster));
    assert!(fsel("").matches(&json!(null)));
    let mut fields = BTreeMap::new();
    fields.insert("metadata.name".to_string(), "foo".to_string());
    assert!(fsel("metadata.name=foo,x=").matches_fields(&fields));
    assert!(!fsel("metadata.name!=foo").matches_fields(&fields));
}

#[test]
fn requested_name() {
    assert_eq!(fsel("metadata.name=foo").requested_name(), Some("foo"));
    assert_eq!(fsel("metadata.name==foo,a=b").requested_name(), Some("foo"));
    assert_eq!(fsel("metadata.name!=foo").requested_name(), None);
    assert_eq!(fsel("metadata.namespace=x").requested_name(), None);
    assert_eq!(fsel("").requested_name(), None);
    assert_eq!(fsel("a=b").requires_exact_match("a"), Some("b"));
}

#[test]
fn field_value_reader() {
    let obj = json!({"a": {"b": "c", "n": -2, "big": 18446744073709551615u64}});
    assert_eq!(field_value(&obj, "a.b"), "c");
    assert_eq!(field_value(&obj, "a.n"), "-2");
    assert_eq!(field_value(&obj, "a.big"), "18446744073709551615");
    assert_eq!(field_value(&obj, "a"), "");
    assert_eq!(field_value(&obj, "a.b.c"), "");
    assert_eq!(field_value(&obj, ""), "");
}
