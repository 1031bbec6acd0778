//! The ClusterRoles every workspace shares: kube-apiserver's bootstrap policy as kcp keeps it in
//! its `system:admin` logical cluster, which kcp's authorizers consult beside each workspace's
//! own RBAC objects.
//!
//! What kcp does with them, and so what [`RbacPolicy::with_shared_roles`] does:
//!
//! * A binding in any workspace may name one of these roles (`cluster-admin`, `admin`, `edit`,
//!   `view`, ...): it grants the role's rules in that workspace. A workspace's own ClusterRole
//!   of the same name adds its rules to the shared one's (kcp merges the two listers), so a
//!   tenant's `cluster-admin` or `view` changes that one workspace only and never takes a rule
//!   away.
//! * The bootstrap ClusterRoleBindings (`system:basic-user`, `system:discovery`, ... for
//!   `system:authenticated`) apply in every workspace the user may enter, resolved against these
//!   roles only: a tenant's ClusterRole named `system:discovery` does not widen them.
//! * None of them is an object of the workspace: reading `clusterroles/cluster-admin` in a
//!   workspace answers 404 as on kcp, and writes there create the workspace's own role.
//! * Aggregation is per logical cluster: `admin`, `edit` and `view` gather the shared
//!   `system:aggregate-to-*` roles; a tenant's role labelled `aggregate-to-view` does not
//!   extend the shared `view`.
//!
//! Only the roles a tenant has a use for are here: kube's user-facing roles and those of kcp's
//! own roles a workspace binds (`system:kcp:workspace:access`, `system:kcp:tenancy:reader`); the
//! roles of kube's controllers, nodes and kcp's internal groups are not.

use std::sync::OnceLock;

use serde_json::{json, Value};

use super::policy::RbacPolicy;

/// The label of kube's bootstrap objects.
const BOOTSTRAPPING: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
const TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
/// Every verb of a resource: kube's bootstrap roles list the same eight.
const READ_WRITE: &[&str] = crate::registry::RESOURCE_VERBS;
const CREATE: &[&str] = &["create"];
const GET: &[&str] = &["get"];

/// One rule of a shared role.
enum Rule {
    /// Verbs on resources of one API group.
    Resources(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    ),
    /// Verbs on non-resource URLs.
    Urls(&'static [&'static str], &'static [&'static str]),
}

/// One shared ClusterRole.
struct Role {
    name: &'static str,
    /// Labels beyond kube's bootstrapping label (`None`: kcp's own role, without it).
    labels: Option<&'static [(&'static str, &'static str)]>,
    /// The label an aggregating role selects (`<label>: "true"`).
    aggregates: Option<&'static str>,
    rules: &'static [Rule],
}

use Rule::{Resources as R, Urls as U};

const ROLES: &[Role] = &[
    Role {
        name: "cluster-admin",
        labels: Some(&[]),
        aggregates: None,
        rules: &[R("*", &["*"], &["*"]), U(&["*"], &["*"])],
    },
    Role {
        name: "admin",
        labels: Some(&[]),
        aggregates: Some(TO_ADMIN),
        rules: &[],
    },
    Role {
        name: "edit",
        labels: Some(&[(TO_ADMIN, "true")]),
        aggregates: Some(TO_EDIT),
        rules: &[],
    },
    Role {
        name: "view",
        labels: Some(&[(TO_EDIT, "true")]),
        aggregates: Some(TO_VIEW),
        rules: &[],
    },
    Role {
        name: "system:aggregate-to-admin",
        labels: Some(&[(TO_ADMIN, "true")]),
        aggregates: None,
        rules: &[
            R(
                "authorization.k8s.io",
                &["localsubjectaccessreviews"],
                CREATE,
            ),
            R(
                "rbac.authorization.k8s.io",
                &["rolebindings", "roles"],
                READ_WRITE,
            ),
        ],
    },
    Role {
        name: "system:aggregate-to-edit",
        labels: Some(&[(TO_EDIT, "true")]),
        aggregates: None,
        rules: &[
            R(
                "",
                &[
                    "pods/attach",
                    "pods/exec",
                    "pods/portforward",
                    "pods/proxy",
                    "secrets",
                    "services/proxy",
                ],
                READ,
            ),
            R("", &["serviceaccounts"], &["impersonate"]),
            R(
                "",
                &[
                    "pods",
                    "pods/attach",
                    "pods/exec",
                    "pods/portforward",
                    "pods/proxy",
                ],
                WRITE,
            ),
            R("", &["pods/eviction"], CREATE),
            R(
                "",
                &[
                    "configmaps",
                    "events",
                    "persistentvolumeclaims",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "secrets",
                    "serviceaccounts",
                    "services",
                    "services/proxy",
                ],
                WRITE,
            ),
            R("", &["serviceaccounts/token"], CREATE),
            R(
                "apps",
                &[
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "replicasets",
                    "replicasets/scale",
                    "statefulsets",
                    "statefulsets/scale",
                ],
                WRITE,
            ),
            R("autoscaling", &["horizontalpodautoscalers"], WRITE),
            R("batch", &["cronjobs", "jobs"], WRITE),
            R(
                "extensions",
                &[
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "ingresses",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicationcontrollers/scale",
                ],
                WRITE,
            ),
            R("policy", &["poddisruptionbudgets"], WRITE),
            R(
                "networking.k8s.io",
                &["ingresses", "networkpolicies"],
                WRITE,
            ),
            R("coordination.k8s.io", &["leases"], READ_WRITE),
        ],
    },
    Role {
        name: "system:aggregate-to-view",
        labels: Some(&[(TO_VIEW, "true")]),
        aggregates: None,
        rules: &[
            R(
                "",
                &[
                    "configmaps",
                    "endpoints",
                    "persistentvolumeclaims",
                    "persistentvolumeclaims/status",
                    "pods",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "serviceaccounts",
                    "services",
                    "services/status",
                ],
                READ,
            ),
            R(
                "",
                &[
                    "bindings",
                    "events",
                    "limitranges",
                    "namespaces/status",
                    "pods/log",
                    "pods/status",
                    "replicationcontrollers/status",
                    "resourcequotas",
                    "resourcequotas/status",
                ],
                READ,
            ),
            R("", &["namespaces"], READ),
            R("discovery.k8s.io", &["endpointslices"], READ),
            R(
                "apps",
                &[
                    "controllerrevisions",
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "statefulsets",
                    "statefulsets/scale",
                    "statefulsets/status",
                ],
                READ,
            ),
            R(
                "autoscaling",
                &[
                    "horizontalpodautoscalers",
                    "horizontalpodautoscalers/status",
                ],
                READ,
            ),
            R(
                "batch",
                &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                READ,
            ),
            R(
                "extensions",
                &[
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "ingresses",
                    "ingresses/status",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "replicationcontrollers/scale",
                ],
                READ,
            ),
            R(
                "policy",
                &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                READ,
            ),
            R(
                "networking.k8s.io",
                &["ingresses", "ingresses/status", "networkpolicies"],
                READ,
            ),
        ],
    },
    Role {
        name: "system:basic-user",
        labels: Some(&[]),
        aggregates: None,
        rules: &[
            R(
                "authorization.k8s.io",
                &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                CREATE,
            ),
            R("authentication.k8s.io", &["selfsubjectreviews"], CREATE),
        ],
    },
    Role {
        name: "system:discovery",
        labels: Some(&[]),
        aggregates: None,
        rules: &[U(
            &[
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/healthz",
                "/livez",
                "/openapi",
                "/openapi/*",
                "/readyz",
                "/version",
                "/version/",
            ],
            GET,
        )],
    },
    Role {
        name: "system:public-info-viewer",
        labels: Some(&[]),
        aggregates: None,
        rules: &[U(
            &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            GET,
        )],
    },
    Role {
        name: "system:auth-delegator",
        labels: Some(&[]),
        aggregates: None,
        rules: &[
            R("authentication.k8s.io", &["tokenreviews"], CREATE),
            R("authorization.k8s.io", &["subjectaccessreviews"], CREATE),
        ],
    },
    Role {
        name: "system:monitoring",
        labels: Some(&[]),
        aggregates: None,
        rules: &[U(
            &[
                "/healthz",
                "/healthz/*",
                "/livez",
                "/livez/*",
                "/metrics",
                "/metrics/slis",
                "/readyz",
                "/readyz/*",
            ],
            GET,
        )],
    },
    Role {
        name: "system:service-account-issuer-discovery",
        labels: Some(&[]),
        aggregates: None,
        rules: &[U(
            &[
                "/.well-known/openid-configuration",
                "/.well-known/openid-configuration/",
                "/openid/v1/jwks",
                "/openid/v1/jwks/",
            ],
            GET,
        )],
    },
    Role {
        name: "system:kcp:workspace:access",
        labels: None,
        aggregates: None,
        rules: &[U(&["/"], &["access"])],
    },
    Role {
        name: "system:kcp:tenancy:reader",
        labels: None,
        aggregates: None,
        rules: &[
            R("tenancy.kcp.io", &["workspaces"], READ),
            R("tenancy.kcp.io", &["workspacetypes"], READ),
            R("core.kcp.io", &["logicalclusters"], READ),
        ],
    },
];

/// The bootstrap ClusterRoleBindings that reach tenants: `(role, groups)`, each binding named
/// after its role.
const BINDINGS: &[(&str, &[&str])] = &[
    ("cluster-admin", &["system:masters"]),
    ("system:basic-user", &["system:authenticated"]),
    ("system:discovery", &["system:authenticated"]),
    (
        "system:public-info-viewer",
        &["system:authenticated", "system:unauthenticated"],
    ),
    ("system:monitoring", &["system:monitoring"]),
    (
        "system:service-account-issuer-discovery",
        &["system:serviceaccounts"],
    ),
];

fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| json!(s)).collect())
}

/// The shared ClusterRoles as `rbac.authorization.k8s.io/v1` objects, aggregation not yet
/// resolved (as written before kube's aggregation controller fills them).
pub fn cluster_role_objects() -> Vec<Value> {
    ROLES
        .iter()
        .map(|role| {
            let rules: Vec<Value> = role
                .rules
                .iter()
                .map(|rule| match rule {
                    R(group, resources, verbs) => json!({
                        "apiGroups": [group], "resources": strings(resources), "verbs": strings(verbs),
                    }),
                    U(urls, verbs) => json!({"nonResourceURLs": strings(urls), "verbs": strings(verbs)}),
                })
                .collect();
            let mut obj = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role.name}, "rules": rules,
            });
            if let Some(extra) = role.labels {
                let mut labels = serde_json::Map::new();
                for (k, v) in std::iter::once(&BOOTSTRAPPING).chain(extra.iter()) {
                    labels.insert((*k).to_string(), json!(v));
                }
                obj["metadata"]["labels"] = Value::Object(labels);
            }
            if let Some(label) = role.aggregates {
                obj["aggregationRule"] =
                    json!({"clusterRoleSelectors": [{"matchLabels": {label: "true"}}]});
            }
            obj
        })
        .collect()
}

/// The bootstrap ClusterRoleBindings as `rbac.authorization.k8s.io/v1` objects.
pub fn cluster_role_binding_objects() -> Vec<Value> {
    BINDINGS
        .iter()
        .map(|(role, groups)| {
            let subjects: Vec<Value> = groups
                .iter()
                .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
                .collect();
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subjects,
            })
        })
        .collect()
}

/// The shared roles and bindings, aggregation resolved, built once.
pub fn shared() -> &'static RbacPolicy {
    static SHARED: OnceLock<RbacPolicy> = OnceLock::new();
    SHARED.get_or_init(|| {
        RbacPolicy::from_objects(
            &[],
            &cluster_role_objects(),
            &[],
            &cluster_role_binding_objects(),
        )
    })
}
