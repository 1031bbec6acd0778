//! Unit tests for the parent module.

use super::*;
use serde_json::json;

fn doc() -> Value {
    json!({
        "metadata": {
            "name": "w1",
            "labels": {"app.kubernetes.io/name": "web", "tier": "front"},
            "creationTimestamp": "2024-01-01T00:00:00Z"
        },
        "spec": {"replicas": 3, "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}], "empty": []},
        "status": {
            "ready": true,
            "conditions": [
                {"type": "Available", "status": "False", "n": 1},
                {"type": "Ready", "status": "True", "n": 2.5, "ok": true}
            ]
        }
    })
}

fn eval(expr: &str) -> Vec<Value> {
    let d = doc();
    let p = parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    evaluate(&p, &d).into_iter().cloned().collect()
}

#[test]
fn simple_fields() {
    assert_eq!(eval(".spec.replicas"), vec![json!(3)]);
    assert_eq!(eval("{.spec.replicas}"), vec![json!(3)]);
    assert_eq!(eval("{ .spec.replicas }"), vec![json!(3)]);
    assert_eq!(eval("$.spec.replicas"), vec![json!(3)]);
    assert_eq!(eval("{$.metadata.name}"), vec![json!("w1")]);
    assert_eq!(eval("metadata.name"), vec![json!("w1")]);
    assert_eq!(eval(".status.ready"), vec![json!(true)]);
    assert_eq!(eval(".spec.missing"), Vec::<Value>::new());
    assert_eq!(eval(".spec.replicas.deeper"), Vec::<Value>::new());
    assert_eq!(eval(""), vec![doc()]);
    assert_eq!(eval("{}"), vec![doc()]);
    assert_eq!(eval("$"), vec![doc()]);
    assert_eq!(eval("."), vec![doc()]);
}

#[test]
fn indexes_and_slices() {
    assert_eq!(eval(".spec.ports[0].port"), vec![json!(80)]);
    assert_eq!(eval(".spec.ports[1].name"), vec![json!("https")]);
    assert_eq!(eval(".spec.ports[-1].port"), vec![json!(443)]);
    assert_eq!(eval(".spec.ports[2]"), Vec::<Value>::new());
    assert_eq!(eval(".spec.ports[-3]"), Vec::<Value>::new());
    assert_eq!(eval(".spec.empty[0]"), Vec::<Value>::new());
    assert_eq!(eval(".spec.ports[0:1].port"), vec![json!(80)]);
    assert_eq!(eval(".spec.ports[:].port"), vec![json!(80), json!(443)]);
    assert_eq!(eval(".spec.ports[1:].port"), vec![json!(443)]);
    assert_eq!(eval(".spec.ports[::2].port"), vec![json!(80)]);
    assert_eq!(eval(".spec.ports[-1:].port"), vec![json!(443)]);
    assert_eq!(eval(".spec.ports[0,1].port"), vec![json!(80), json!(443)]);
    assert!(parse(".spec.ports[i64::MAX:]").is_err());
    assert_eq!(
        eval(".spec.ports[9223372036854775807]"),
        Vec::<Value>::new()
    );
    assert_eq!(
        eval(".spec.ports[-9223372036854775808]"),
        Vec::<Value>::new()
    );
    assert_eq!(
        eval(".spec.ports[-9223372036854775808:9223372036854775807].port").len(),
        2
    );
}

#[test]
fn wildcards() {
    assert_eq!(
        eval(".spec.ports[*].name"),
        vec![json!("http"), json!("https")]
    );
    assert_eq!(eval(".spec.ports.*.port"), vec![json!(80), json!(443)]);
    assert_eq!(eval(".metadata.labels[*]").len(), 2);
    assert_eq!(eval(".metadata.name[*]"), Vec::<Value>::new());
}

#[test]
fn quoted_and_escaped_keys() {
    assert_eq!(
        eval(".metadata.labels['app.kubernetes.io/name']"),
        vec![json!("web")]
    );
    assert_eq!(
        eval(".metadata.labels[\"app.kubernetes.io/name\"]"),
        vec![json!("web")]
    );
    assert_eq!(
        eval(".metadata.labels.app\\.kubernetes\\.io/name"),
        vec![json!("web")]
    );
    assert_eq!(eval("['metadata']['name']"), vec![json!("w1")]);
    assert_eq!(
        eval(".metadata.labels['tier', 'app.kubernetes.io/name']"),
        vec![json!("front"), json!("web")]
    );
}

#[test]
fn filters() {
    assert_eq!(
        eval(".status.conditions[?(@.type==\"Ready\")].status"),
        vec![json!("True")]
    );
    assert_eq!(
        eval("{.status.conditions[?(@.type == 'Ready')].status}"),
        vec![json!("True")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.type!=\"Ready\")].type"),
        vec![json!("Available")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.n==1)].type"),
        vec![json!("Available")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.n==2.5)].type"),
        vec![json!("Ready")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.n > 1)].type"),
        vec![json!("Ready")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.n <= 1)].type"),
        vec![json!("Available")]
    );
    assert_eq!(eval(".status.conditions[?(@.n >= 1)].type").len(), 2);
    assert_eq!(
        eval(".status.conditions[?(@.n < 1)].type"),
        Vec::<Value>::new()
    );
    assert_eq!(
        eval(".status.conditions[?(@.ok==true)].type"),
        vec![json!("Ready")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.ok)].type"),
        vec![json!("Ready")]
    );
    assert_eq!(
        eval(".status.conditions[?(@.ok!=true)].type"),
        Vec::<Value>::new()
    );
    // missing fields and mismatched kinds never match
    assert_eq!(
        eval(".status.conditions[?(@.missing!=\"x\")]"),
        Vec::<Value>::new()
    );
    assert_eq!(
        eval(".status.conditions[?(@.type==1)]"),
        Vec::<Value>::new()
    );
    assert_eq!(
        eval(".spec.ports[?(@.port==$.spec.ports[1].port)].name"),
        vec![json!("https")]
    );
    assert_eq!(eval(".spec.replicas[?(@.x)]"), Vec::<Value>::new());
}

#[test]
fn recursive_descent() {
    assert_eq!(eval("..port"), vec![json!(80), json!(443)]);
    assert_eq!(
        eval("$..name"),
        vec![json!("w1"), json!("http"), json!("https")]
    );
    assert_eq!(eval(".spec.ports..*").len(), 6);
}

#[test]
fn parse_errors() {
    for bad in [
        "{.a",
        ".a}",
        ".a[",
        ".a[x]",
        ".a[]",
        ".a[1:2:0]",
        ".a[1:2:3:4]",
        ".a[?(@.b==)]",
        ".a[?(@.b=~'x')]",
        ".a[?(@.b=='x']",
        ".a[?(@.b=='x')",
        ".a['x",
        ".a['x' 'y']",
        ".a[?(1)]",
        ".a[?@.b]",
        "..",
        ".a b",
        ".a)",
        "{.a}{.b}",
    ] {
        assert!(parse(bad).is_err(), "{bad} should fail");
    }
}

#[test]
fn helpers() {
    let p = parse("{.metadata.name}").unwrap();
    assert_eq!(p.as_str(), "{.metadata.name}");
    assert_eq!(p.to_string(), "{.metadata.name}");
    assert_eq!(p.simple_fields(), Some(vec!["metadata", "name"]));
    assert_eq!(parse(".a[0]").unwrap().simple_fields(), None);
    assert!(parse("").unwrap().is_root());
    let d = doc();
    assert_eq!(evaluate_first(&p, &d), Some(&json!("w1")));
    assert_eq!(p.evaluate(&d).len(), 1);
    let f = Path::from_fields(&["metadata", "name"]);
    assert_eq!(f.as_str(), ".metadata.name");
    assert_eq!(f.evaluate(&d), vec![&json!("w1")]);
    let dotted = Path::from_fields(&["metadata", "labels", "app.kubernetes.io/name"]);
    assert_eq!(
        dotted.as_str(),
        ".metadata.labels.app\\.kubernetes\\.io/name"
    );
    assert_eq!(parse(dotted.as_str()).map(|p| p.evaluate(&d).len()), Ok(1));
    assert_eq!(dotted.evaluate(&d), vec![&json!("web")]);
    let q: Path = ".spec.replicas".parse().unwrap();
    assert_eq!(q.evaluate(&d), vec![&json!(3)]);
}

#[test]
fn never_panics() {
    let inputs = [
        "[",
        "]",
        "[[",
        "['",
        "[\"",
        "[?",
        "[?(",
        "[?(@",
        "[?(@.",
        "[?(@.a",
        "[?(@.a=",
        "[?(@.a==",
        "\\",
        ".\\",
        "..\\",
        "{",
        "}",
        "{{}}",
        "$$",
        "@",
        ".é[0]",
        "[-]",
        "[:]",
        "[::]",
        "[1,]",
        "[?(@.a=='\\",
        "[?(\"x\"==@.a)]",
        ".a..b..c",
        "[99999999999999999999]",
    ];
    let d = doc();
    for i in inputs {
        if let Ok(p) = parse(i) {
            let _ = evaluate(&p, &d);
        }
    }
    // deep documents do not overflow the stack in recursive descent
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({"a": deep});
    }
    let p = parse("..a").unwrap();
    assert_eq!(evaluate(&p, &deep).len(), 100);
}
