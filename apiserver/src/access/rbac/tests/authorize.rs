//! Table-driven authorization of resource requests.

use super::*;

#[test]
fn authorize_resource_requests() {
    let p = fixture();
    let sa_builder = UserInfo::service_account("default", "builder");
    let sa_deployer = UserInfo::service_account("ci", "deployer");
    // (case, attributes, allowed)
    let cases: Vec<(&str, Attributes, bool)> = vec![
        (
            "role via rolebinding",
            res(u("jane", &[]), "get", "", "pods", "", "p", "default"),
            true,
        ),
        (
            "role verb list",
            res(u("jane", &[]), "list", "", "pods", "", "", "default"),
            true,
        ),
        (
            "role verb not granted",
            res(u("jane", &[]), "delete", "", "pods", "", "p", "default"),
            false,
        ),
        (
            "role limited to namespace",
            res(u("jane", &[]), "get", "", "pods", "", "p", "kube-system"),
            false,
        ),
        (
            "role not cluster-wide",
            res(u("jane", &[]), "list", "", "pods", "", "", ""),
            false,
        ),
        (
            "clusterrole via rolebinding in ns",
            res(u("jane", &[]), "delete", "", "secrets", "", "s", "default"),
            true,
        ),
        (
            "clusterrole via rolebinding other ns",
            res(u("jane", &[]), "get", "", "secrets", "", "s", "other"),
            false,
        ),
        (
            "clusterrole via rolebinding cluster scope",
            res(u("jane", &[]), "list", "", "secrets", "", "", ""),
            false,
        ),
        (
            "wrong api group",
            res(u("jane", &[]), "get", "apps", "pods", "", "p", "default"),
            false,
        ),
        (
            "crb group cluster scope",
            res(u("x", &["ops"]), "list", "", "nodes", "", "", ""),
            true,
        ),
        (
            "crb group in namespace",
            res(u("x", &["ops"]), "get", "", "nodes", "", "n1", "default"),
            true,
        ),
        (
            "crb group wrong verb",
            res(u("x", &["ops"]), "delete", "", "nodes", "", "n1", ""),
            false,
        ),
        (
            "no group membership",
            res(u("x", &["devs"]), "list", "", "nodes", "", "", ""),
            false,
        ),
        (
            "resourceNames match",
            res(
                u("d", &["devs"]),
                "get",
                "",
                "configmaps",
                "",
                "app-config",
                "default",
            ),
            true,
        ),
        (
            "resourceNames mismatch",
            res(
                u("d", &["devs"]),
                "get",
                "",
                "configmaps",
                "",
                "other",
                "default",
            ),
            false,
        ),
        (
            "resourceNames no name (list)",
            res(
                u("d", &["devs"]),
                "get",
                "",
                "configmaps",
                "",
                "",
                "default",
            ),
            false,
        ),
        (
            "subresource exact",
            res(sa_builder.clone(), "get", "", "pods", "log", "p", "default"),
            true,
        ),
        (
            "subresource not parent",
            res(sa_builder.clone(), "get", "", "pods", "", "p", "default"),
            false,
        ),
        (
            "parent rule no subresource",
            res(u("jane", &[]), "get", "", "pods", "log", "p", "default"),
            false,
        ),
        (
            "sa with explicit namespace",
            res(
                sa_deployer.clone(),
                "get",
                "",
                "pods",
                "log",
                "p",
                "default",
            ),
            true,
        ),
        (
            "sa wrong namespace",
            res(
                UserInfo::service_account("ci", "builder"),
                "get",
                "",
                "pods",
                "log",
                "p",
                "default",
            ),
            false,
        ),
        (
            "sa group binding */status",
            res(
                sa_deployer.clone(),
                "get",
                "apps",
                "deployments",
                "status",
                "d",
                "default",
            ),
            true,
        ),
        (
            "sa groups implied by name",
            res(
                u("system:serviceaccount:ci:x", &[]),
                "get",
                "",
                "pods",
                "status",
                "p",
                "default",
            ),
            true,
        ),
        (
            "*/status not main resource",
            res(
                sa_deployer,
                "get",
                "apps",
                "deployments",
                "",
                "d",
                "default",
            ),
            false,
        ),
        (
            "crb sa without namespace never applies",
            res(
                u("system:serviceaccount:default:nodes-sa", &[]),
                "list",
                "",
                "nodes",
                "",
                "",
                "",
            ),
            false,
        ),
        (
            "wildcard resources and verbs",
            res(
                u("bob", &[]),
                "deletecollection",
                "example.com",
                "widgets",
                "",
                "",
                "ns1",
            ),
            true,
        ),
        (
            "wildcard resources cover subresources",
            res(
                u("bob", &[]),
                "update",
                "example.com",
                "widgets",
                "status",
                "w",
                "",
            ),
            true,
        ),
        (
            "wildcard limited to group",
            res(u("bob", &[]), "get", "", "widgets", "", "w", ""),
            false,
        ),
        (
            "aggregated rule 1",
            res(u("agg", &[]), "get", "", "pods", "", "p", "x"),
            true,
        ),
        (
            "aggregated rule 2",
            res(u("agg", &[]), "list", "", "configmaps", "", "", ""),
            true,
        ),
        (
            "aggregation replaces stale rules",
            res(u("agg", &[]), "delete", "", "pods", "", "p", "x"),
            false,
        ),
        (
            "aggregation matchExpressions In",
            res(u("agg", &[]), "get", "apps", "deployments", "", "d", "x"),
            true,
        ),
        (
            "aggregation excludes non-matching",
            res(u("agg", &[]), "delete", "apps", "deployments", "", "d", "x"),
            false,
        ),
        (
            "system:masters",
            res(
                u("root", &["system:masters"]),
                "delete",
                "x.io",
                "anything",
                "",
                "a",
                "ns",
            ),
            true,
        ),
        (
            "anonymous nothing",
            res(
                u("system:anonymous", &[]),
                "get",
                "",
                "pods",
                "",
                "",
                "default",
            ),
            false,
        ),
    ];
    assert!(cases.len() >= 30);
    for (case, attrs, allowed) in cases {
        let d = p.authorize(&attrs);
        assert_eq!(d.is_allowed(), allowed, "{case}: {d:?}");
        if !allowed {
            assert_eq!(d, Decision::Deny(String::new()), "{case}");
        }
    }
}
