//! Tests of the serving description: identities, columns and schemas of every served type.
//! Built-in kinds are checked against well-known Kubernetes behaviour, custom ones against CRDs.

use std::collections::BTreeSet;

use serde_json::json;

use super::*;
use crate::schema::structural_problems;

fn find(group: &str, kind: &str) -> ResourceType {
    served_types()
        .into_iter()
        .find(|t| t.group == group && t.kind == kind)
        .unwrap_or_else(|| panic!("{group}/{kind} not served"))
}

fn column(t: &ResourceType, name: &str) -> PrinterColumn {
    t.printer_columns
        .iter()
        .find(|c| c.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("{}: no column {name}", t.kind))
}

fn path(c: &PrinterColumn) -> &str {
    match &c.source {
        ColumnSource::JsonPath(p) => p,
        ColumnSource::Count(_) => panic!("{} is a count column", c.name),
    }
}

#[test]
fn serves_the_expected_types_once_each() {
    let types = served_types();
    let ids: Vec<(String, &str)> = types.iter().map(|t| (t.api_version(), t.plural)).collect();
    let expected = [
        ("v1", "namespaces"),
        ("v1", "configmaps"),
        ("v1", "secrets"),
        ("v1", "serviceaccounts"),
        ("v1", "events"),
        ("events.k8s.io/v1", "events"),
        ("coordination.k8s.io/v1", "leases"),
        ("rbac.authorization.k8s.io/v1", "roles"),
        ("rbac.authorization.k8s.io/v1", "clusterroles"),
        ("rbac.authorization.k8s.io/v1", "rolebindings"),
        ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
        ("core.platform-mesh.io/v1alpha1", "platformmeshes"),
        ("core.platform-mesh.io/v1alpha1", "accounts"),
        ("core.platform-mesh.io/v1alpha1", "accountinfos"),
        ("providers.platform-mesh.io/v1alpha1", "providers"),
        ("providers.platform-mesh.io/v1alpha1", "managedproviders"),
        ("broker.platform-mesh.io/v1alpha1", "acceptapis"),
        ("broker.platform-mesh.io/v1alpha1", "migrations"),
        (
            "broker.platform-mesh.io/v1alpha1",
            "migrationconfigurations",
        ),
    ];
    let expected: Vec<(String, &str)> = expected.iter().map(|(v, p)| (v.to_string(), *p)).collect();
    assert_eq!(ids, expected);
    let kinds: BTreeSet<(&str, &str)> = types.iter().map(|t| (t.group, t.kind)).collect();
    assert_eq!(kinds.len(), types.len());
    assert_eq!(served_types(), types, "stable across calls");
}

#[test]
fn identities_follow_kubernetes_conventions() {
    for t in served_types() {
        assert_eq!(t.list_kind, format!("{}List", t.kind));
        assert_eq!(t.singular, t.kind.to_lowercase());
        assert!(
            t.plural.starts_with(t.singular.trim_end_matches('y')),
            "{}",
            t.plural
        );
        assert_eq!(t.strategic_merge_patch, !t.group.contains("platform-mesh"));
    }
    let ns = find("", "Namespace");
    assert!(!ns.namespaced && ns.status_subresource);
    assert_eq!(ns.short_names, &["ns"]);
    assert_eq!(find("", "ConfigMap").short_names, &["cm"]);
    assert_eq!(find("", "ServiceAccount").short_names, &["sa"]);
    assert_eq!(find("", "Event").short_names, &["ev"]);
    assert_eq!(find("events.k8s.io", "Event").short_names, &["ev"]);
    for kind in ["Account", "AccountInfo", "Provider"] {
        let group = if kind == "Provider" {
            "providers.platform-mesh.io"
        } else {
            "core.platform-mesh.io"
        };
        assert!(!find(group, kind).namespaced, "{kind} is cluster-scoped");
    }
    assert!(find("core.platform-mesh.io", "PlatformMesh").namespaced);
    assert!(find("broker.platform-mesh.io", "AcceptAPI").status_subresource);
    assert!(!find("broker.platform-mesh.io", "MigrationConfiguration").status_subresource);
    assert_eq!(
        find("coordination.k8s.io", "Lease").api_version(),
        "coordination.k8s.io/v1"
    );
}

#[test]
fn every_schema_is_structural_with_object_envelope() {
    for t in served_types() {
        let problems = structural_problems(&t.schema);
        assert!(problems.is_empty(), "{}: {problems:#?}", t.kind);
        let props = &t.schema["properties"];
        assert_eq!(props["apiVersion"]["type"], "string", "{}", t.kind);
        assert_eq!(props["kind"]["type"], "string", "{}", t.kind);
        assert_eq!(props["metadata"]["type"], "object", "{}", t.kind);
        assert!(props["metadata"].get("properties").is_none(), "{}", t.kind);
        let required = t.schema["required"].as_array().cloned().unwrap_or_default();
        assert!(!required.contains(&json!("metadata")), "{}", t.kind);
    }
}

#[test]
fn custom_types_use_their_crd_as_single_source() {
    let crds = crate::crds();
    for t in served_types()
        .into_iter()
        .filter(|t| !t.strategic_merge_patch)
    {
        let crd = crds.iter().find(|c| c.spec.names.kind == t.kind).unwrap();
        let version = &crd.spec.versions[0];
        let mut schema =
            serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
        crate::crds::integral_floats_to_integers(&mut schema);
        assert_eq!(t.schema, schema, "{}", t.kind);
        let columns: Vec<PrinterColumn> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(PrinterColumn::from_crd_column)
            .collect();
        assert_eq!(t.printer_columns, columns, "{}", t.kind);
        assert!(t.printer_columns.iter().all(|c| !c.description.is_empty()));
    }
}

#[test]
fn every_type_ends_with_or_has_a_date_age_column() {
    for t in served_types() {
        if t.kind == "Event" {
            continue;
        }
        let age = column(&t, "Age");
        assert_eq!(age.type_, "date", "{}", t.kind);
        assert_eq!(path(&age), ".metadata.creationTimestamp", "{}", t.kind);
        assert_eq!(age.priority, 0);
    }
}

#[test]
fn built_in_columns_match_kubectl() {
    let ns = find("", "Namespace");
    assert_eq!(path(&column(&ns, "Status")), ".status.phase");
    let cm = find("", "ConfigMap");
    let data = column(&cm, "Data");
    assert_eq!(data.type_, "integer");
    assert_eq!(
        data.source,
        ColumnSource::Count(vec!["data".into(), "binaryData".into()])
    );
    let secret = find("", "Secret");
    let names: Vec<&str> = secret
        .printer_columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["Type", "Data", "Age"]);
    assert_eq!(
        column(&secret, "Data").source,
        ColumnSource::Count(vec!["data".into()])
    );
    let sa = find("", "ServiceAccount");
    assert_eq!(
        column(&sa, "Secrets").source,
        ColumnSource::Count(vec!["secrets".into()])
    );
    for (group, object, message) in [
        ("", ".involvedObject.name", ".message"),
        ("events.k8s.io", ".regarding.name", ".note"),
    ] {
        let ev = find(group, "Event");
        let default: Vec<&str> = ev
            .printer_columns
            .iter()
            .filter(|c| c.priority == 0)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            default,
            ["Last Seen", "Type", "Reason", "Object", "Message"]
        );
        assert_eq!(column(&ev, "Last Seen").type_, "date");
        assert_eq!(path(&column(&ev, "Object")), object);
        assert_eq!(path(&column(&ev, "Message")), message);
    }
    assert_eq!(
        path(&column(&find("", "Event"), "Last Seen")),
        ".lastTimestamp"
    );
    let lease = find("coordination.k8s.io", "Lease");
    assert_eq!(path(&column(&lease, "Holder")), ".spec.holderIdentity");
}

#[test]
fn platform_mesh_columns_are_useful() {
    let pm = find("core.platform-mesh.io", "PlatformMesh");
    assert_eq!(
        path(&column(&pm, "Ready")),
        ".status.conditions[?(@.type=='Ready')].status"
    );
    assert_eq!(column(&pm, "KCP_REASON").priority, 1);
    let provider = find("providers.platform-mesh.io", "Provider");
    assert_eq!(path(&column(&provider, "Phase")), ".status.phase");
    let accept = find("broker.platform-mesh.io", "AcceptAPI");
    let names: Vec<&str> = accept
        .printer_columns
        .iter()
        .filter(|c| c.priority == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["Group", "Resource", "Age"]);
    let account = find("core.platform-mesh.io", "Account");
    let names: Vec<&str> = account
        .printer_columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["Display Name", "Type", "Ready", "Age"]);
    assert!(column(&account, "Type").description.contains(".spec.type"));
}

#[test]
fn built_in_schemas_describe_their_fields() {
    let cm = find("", "ConfigMap").schema;
    assert_eq!(
        cm["properties"]["data"]["additionalProperties"]["type"],
        "string"
    );
    assert_eq!(cm["properties"]["immutable"]["type"], "boolean");
    let secret = find("", "Secret").schema;
    assert_eq!(
        secret["properties"]["data"]["additionalProperties"]["format"],
        "byte"
    );
    let ev = find("", "Event").schema;
    assert_eq!(ev["required"], json!(["involvedObject"]));
    assert_eq!(ev["properties"]["eventTime"]["format"], "date-time");
    assert_eq!(ev["properties"]["count"]["format"], "int32");
    let lease = find("coordination.k8s.io", "Lease").schema;
    assert_eq!(
        lease["properties"]["spec"]["properties"]["holderIdentity"]["type"],
        "string"
    );
    let ns = find("", "Namespace").schema;
    assert_eq!(
        ns["properties"]["spec"]["properties"]["finalizers"]["items"]["type"],
        "string"
    );
    assert!(!serde_json::to_string(&ns).unwrap().contains("\"$ref\""));
}

#[test]
fn kubernetes_atomic_structs_are_atomic() {
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            "rbac.authorization.k8s.io",
            "RoleBinding",
            &["/properties/roleRef", "/properties/subjects/items"],
        ),
        (
            "rbac.authorization.k8s.io",
            "ClusterRoleBinding",
            &["/properties/roleRef", "/properties/subjects/items"],
        ),
        (
            "rbac.authorization.k8s.io",
            "ClusterRole",
            &["/properties/aggregationRule/properties/clusterRoleSelectors/items"],
        ),
        (
            "",
            "Event",
            &["/properties/involvedObject", "/properties/related"],
        ),
        (
            "events.k8s.io",
            "Event",
            &["/properties/regarding", "/properties/related"],
        ),
    ];
    for (group, kind, pointers) in cases {
        let schema = find(group, kind).schema;
        for at in pointers {
            let node = schema
                .pointer(at)
                .unwrap_or_else(|| panic!("{group}/{kind}: nothing at {at}"));
            assert_eq!(node["type"], "object", "{group}/{kind}{at}");
            assert_eq!(
                node["x-kubernetes-map-type"], "atomic",
                "{group}/{kind}{at}"
            );
        }
    }
}
