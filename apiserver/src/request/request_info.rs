//! Turns a request path and method into what it addresses: logical cluster, API group/version,
//! resource, namespace, name, subresource and verb. Pure; no registry lookups.

use http::Method;
use percent_encoding::percent_decode_str;

use crate::meta::status::ApiError;

/// The logical cluster a request addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClusterTarget {
    /// One logical cluster by name.
    Name(String),
    /// `/clusters/*`: every cluster, read-only.
    Wildcard,
}

impl ClusterTarget {
    /// The cluster's name, or `None` for the wildcard.
    pub fn name(&self) -> Option<&str> {
        match self {
            ClusterTarget::Name(n) => Some(n),
            ClusterTarget::Wildcard => None,
        }
    }
}

/// The default logical cluster for requests without a `/clusters/` prefix.
pub const ROOT_CLUSTER: &str = "root";

/// What a path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/api`
    CoreRoot,
    /// `/apis`
    GroupList,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    ResourceList {
        /// The API group; empty for the core group.
        group: String,
        /// The API version.
        version: String,
    },
    /// A resource or subresource URL.
    Resource(ResourceRequest),
    /// `/openapi/v2`
    OpenApiV2,
    /// `/openapi/v3`
    OpenApiV3Root,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/<g>/<v>`
    OpenApiV3Group {
        /// The API group; empty for the core group.
        group: String,
        /// The API version.
        version: String,
    },
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz` (and their per-check sub paths)
    Health {
        /// Which endpoint: `healthz`, `livez` or `readyz`.
        endpoint: String,
        /// The single check asked for (`/livez/ping`), or `None` for all of them.
        check: Option<String>,
    },
    /// `/metrics`
    Metrics,
    /// `/admission/validate`, `/admission/mutate`: the admission webhooks.
    Admission(Review),
    /// Anything else.
    Unknown,
}

/// Which admission webhook a request calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Review {
    /// `/admission/validate`: the validating webhook, which allows or denies.
    Validate,
    /// `/admission/mutate`: the mutating webhook, which may also patch the object.
    Mutate,
}

/// The verb of a resource request, as Kubernetes names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// GET of one named object.
    Get,
    /// GET of a collection.
    List,
    /// GET with `watch=true` or under the legacy `/watch/` prefix: a stream of changes.
    Watch,
    /// POST to a collection.
    Create,
    /// PUT of a named object (or its subresource).
    Update,
    /// PATCH of a named object (or its subresource).
    Patch,
    /// DELETE of one named object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The verb as Kubernetes spells it in RBAC rules and audit (`get`, `deletecollection`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the verb only reads (`get`, `list`, `watch`).
    pub fn is_read_only(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

/// A request for a resource, a collection or a subresource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRequest {
    /// The API group; empty for the core group (`/api/v1`).
    pub group: String,
    /// The API version (`v1`, `v1alpha1`).
    pub version: String,
    /// The plural resource name from the path (`configmaps`).
    pub resource: String,
    /// The namespace from `/namespaces/<ns>/`, or `None` for a cluster-scoped request (always
    /// `None` for the `namespaces` resource itself).
    pub namespace: Option<String>,
    /// The object name, or `None` for a request on the whole collection.
    pub name: Option<String>,
    /// The subresource (`status`, `finalize`), if the path names one.
    pub subresource: Option<String>,
    /// The verb, from the method, whether a name is given, and the watch flag.
    pub verb: Verb,
}

/// A parsed request: cluster plus target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// The logical cluster, from `/clusters/<name>/`; `root` when the path has no such prefix.
    pub cluster: ClusterTarget,
    /// What the rest of the path addresses.
    pub target: Target,
    /// `/services/apiexport/<cluster>/<export>/...`: the APIExport virtual workspace
    /// (the export's logical-cluster name and the export's name).
    pub virtual_workspace: Option<(String, String)>,
    /// `/services/<view>/clusters/<cluster>/...`: one of Platform Mesh's virtual workspaces.
    pub view: Option<ViewKind>,
    /// `/services/initializingworkspaces/<initializer>/clusters/<cluster>/...` (or
    /// `terminatingworkspaces`): where an initializer or terminator sees its workspaces.
    pub lifecycle: Option<(Lifecycle, String)>,
}

/// kcp's two workspace-lifecycle virtual workspaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// New workspaces waiting for initializers.
    Initializing,
    /// Deleted workspaces waiting for terminators.
    Terminating,
}

impl Lifecycle {
    /// The virtual workspace's name in URLs.
    pub fn service(self) -> &'static str {
        match self {
            Lifecycle::Initializing => "initializingworkspaces",
            Lifecycle::Terminating => "terminatingworkspaces",
        }
    }

    fn from_service(name: &str) -> Option<Lifecycle> {
        match name {
            "initializingworkspaces" => Some(Lifecycle::Initializing),
            "terminatingworkspaces" => Some(Lifecycle::Terminating),
            _ => None,
        }
    }
}

/// Platform Mesh's virtual workspaces, computed views over a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViewKind {
    /// `/services/contentconfigurations`: the UI content a workspace sees.
    ContentConfigurations,
    /// `/services/marketplace`: what providers offer a workspace.
    Marketplace,
}

impl ViewKind {
    /// The name in the URL.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewKind::ContentConfigurations => "contentconfigurations",
            ViewKind::Marketplace => "marketplace",
        }
    }

    fn from_url(name: &str) -> Option<ViewKind> {
        match name {
            "contentconfigurations" => Some(ViewKind::ContentConfigurations),
            "marketplace" => Some(ViewKind::Marketplace),
            _ => None,
        }
    }
}

/// Whether `s` is a valid logical-cluster name or path (`root`, `root:orgs:acme`, `system:admin`).
pub fn is_valid_cluster(s: &str) -> bool {
    if s.starts_with("system:") {
        return s.len() > "system:".len() && s.split(':').skip(1).all(valid_segment);
    }
    !s.is_empty() && s.split(':').all(valid_segment)
}

fn valid_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    alnum(b[0]) && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// Splits the raw (still percent-encoded) path into decoded segments. An encoded `/` or a
/// `.`/`..` segment is refused, so a name can never escape its place in the storage key.
fn segments(raw_path: &str) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for raw in raw_path.split('/').filter(|s| !s.is_empty()) {
        let decoded = percent_decode_str(raw).decode_utf8().map_err(|_| {
            ApiError::bad_request(format!("invalid path segment {raw:?}: not UTF-8"))
        })?;
        if decoded.contains('/') {
            return Err(ApiError::bad_request(format!(
                "invalid path segment {decoded:?}: may not contain '/'"
            )));
        }
        if decoded == "." || decoded == ".." {
            return Err(ApiError::bad_request(format!(
                "invalid path segment {decoded:?}: may not be '.' or '..'"
            )));
        }
        out.push(decoded.into_owned());
    }
    Ok(out)
}

/// Parses method, path and the `watch` query flag into a [`RequestInfo`].
pub fn parse(method: &Method, raw_path: &str, watch_param: bool) -> Result<RequestInfo, ApiError> {
    let segs = segments(raw_path)?;
    let mut parts: &[String] = &segs;
    let mut cluster = ClusterTarget::Name(ROOT_CLUSTER.to_string());
    let mut virtual_workspace = None;
    let mut view = None;
    let mut lifecycle = None;
    if parts.first().map(String::as_str) == Some("services") {
        match parts {
            [_, kind, id, clusters, ..]
                if clusters == "clusters"
                    && Lifecycle::from_service(kind).is_some()
                    && is_valid_cluster(id) =>
            {
                lifecycle = Lifecycle::from_service(kind).map(|l| (l, id.clone()));
                parts = &parts[3..];
            }
            [_, kind, export_cluster, export, clusters, ..]
                if kind == "apiexport" && clusters == "clusters" =>
            {
                virtual_workspace = Some((export_cluster.clone(), export.clone()));
                parts = &parts[4..];
            }
            [_, kind, clusters, ..]
                if clusters == "clusters" && ViewKind::from_url(kind).is_some() =>
            {
                view = ViewKind::from_url(kind);
                parts = &parts[2..];
            }
            _ => {
                return Ok(RequestInfo {
                    cluster,
                    target: Target::Unknown,
                    virtual_workspace: None,
                    view: None,
                    lifecycle: None,
                })
            }
        }
    }
    if parts.first().map(String::as_str) == Some("clusters") {
        let Some(c) = parts.get(1) else {
            return Ok(RequestInfo {
                cluster,
                target: Target::Unknown,
                virtual_workspace,
                view,
                lifecycle,
            });
        };
        cluster = if c == "*" {
            ClusterTarget::Wildcard
        } else if is_valid_cluster(c) {
            ClusterTarget::Name(c.clone())
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid cluster: {c:?} does not match the regex ^[a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?(:[a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?)*$"
            )));
        };
        parts = &parts[2..];
    }
    let target = parse_target(method, parts, watch_param);
    Ok(RequestInfo {
        cluster,
        target,
        virtual_workspace,
        view,
        lifecycle,
    })
}

fn parse_target(method: &Method, parts: &[String], watch_param: bool) -> Target {
    let p: Vec<&str> = parts.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["api"] => Target::CoreRoot,
        ["apis"] => Target::GroupList,
        ["api", v] => Target::ResourceList {
            group: String::new(),
            version: v.to_string(),
        },
        ["apis", g] => Target::Group(g.to_string()),
        ["apis", g, v] => Target::ResourceList {
            group: g.to_string(),
            version: v.to_string(),
        },
        ["api", v, rest @ ..] => resource_target(method, "", v, rest, watch_param),
        ["apis", g, v, rest @ ..] => resource_target(method, g, v, rest, watch_param),
        ["openapi", "v2"] => Target::OpenApiV2,
        ["openapi", "v3"] => Target::OpenApiV3Root,
        ["openapi", "v3", "api", v] => Target::OpenApiV3Group {
            group: String::new(),
            version: v.to_string(),
        },
        ["openapi", "v3", "apis", g, v] => Target::OpenApiV3Group {
            group: g.to_string(),
            version: v.to_string(),
        },
        ["version"] => Target::Version,
        [e @ ("healthz" | "livez" | "readyz")] => Target::Health {
            endpoint: e.to_string(),
            check: None,
        },
        [e @ ("healthz" | "livez" | "readyz"), check] => Target::Health {
            endpoint: e.to_string(),
            check: Some(check.to_string()),
        },
        ["metrics"] => Target::Metrics,
        ["admission", "validate"] => Target::Admission(Review::Validate),
        ["admission", "mutate"] => Target::Admission(Review::Mutate),
        _ => Target::Unknown,
    }
}

/// Subresources of a namespace itself (`/namespaces/<ns>/status`), as opposed to resources inside it.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

fn resource_target(
    method: &Method,
    group: &str,
    version: &str,
    rest: &[&str],
    watch_param: bool,
) -> Target {
    let mut rest = rest;
    // The legacy `/watch/` URL prefix.
    let mut watch = watch_param;
    if rest.first() == Some(&"watch") {
        watch = true;
        rest = &rest[1..];
    }
    let mut namespace = None;
    let mut in_namespace = false;
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
            in_namespace = true;
        }
    }
    let (resource, name, subresource) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(s.to_string())),
        _ => return Target::Unknown,
    };
    if resource == "namespaces" && !in_namespace {
        // A namespace is cluster-scoped: `/namespaces/<ns>` names it (while
        // `/namespaces/<ns>/namespaces` asks for namespaces in a namespace, which do not exist).
        namespace = None;
    }
    let verb = match (method.clone(), name.is_some()) {
        (Method::GET | Method::HEAD, _) if watch => Verb::Watch,
        (Method::GET | Method::HEAD, true) => Verb::Get,
        (Method::GET | Method::HEAD, false) => Verb::List,
        (Method::POST, _) => Verb::Create,
        (Method::PUT, _) => Verb::Update,
        (Method::PATCH, _) => Verb::Patch,
        (Method::DELETE, true) => Verb::Delete,
        (Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Target::Unknown,
    };
    Target::Resource(ResourceRequest {
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        namespace,
        name,
        subresource,
        verb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(method: Method, path: &str) -> (ClusterTarget, ResourceRequest) {
        let info = parse(&method, path, false).expect("parse");
        match info.target {
            Target::Resource(r) => (info.cluster, r),
            other => panic!("not a resource: {other:?}"),
        }
    }

    #[test]
    fn cluster_prefix_and_default() {
        let (c, r) = res(
            Method::GET,
            "/clusters/root:orgs:acme/api/v1/namespaces/default/configmaps/x",
        );
        assert_eq!(c, ClusterTarget::Name("root:orgs:acme".into()));
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.name.as_deref(), Some("x"));
        assert_eq!(r.verb, Verb::Get);
        let (c, r) = res(
            Method::GET,
            "/apis/core.platform-mesh.io/v1alpha1/platformmeshes",
        );
        assert_eq!(c, ClusterTarget::Name("root".into()));
        assert_eq!(r.verb, Verb::List);
        assert_eq!(r.namespace, None);
        let (c, _) = res(Method::GET, "/clusters/*/api/v1/configmaps");
        assert_eq!(c, ClusterTarget::Wildcard);
    }

    #[test]
    fn namespaces_are_cluster_scoped() {
        let (_, r) = res(Method::GET, "/api/v1/namespaces/foo");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref(), r.namespace),
            ("namespaces", Some("foo"), None)
        );
        let (_, r) = res(Method::PUT, "/api/v1/namespaces/foo/status");
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert_eq!(r.name.as_deref(), Some("foo"));
        let (_, r) = res(Method::GET, "/api/v1/namespaces");
        assert_eq!(r.verb, Verb::List);
    }

    #[test]
    fn verbs() {
        assert_eq!(
            res(Method::POST, "/api/v1/namespaces/d/configmaps").1.verb,
            Verb::Create
        );
        assert_eq!(
            res(Method::DELETE, "/api/v1/namespaces/d/configmaps")
                .1
                .verb,
            Verb::DeleteCollection
        );
        assert_eq!(
            res(Method::DELETE, "/api/v1/namespaces/d/configmaps/a")
                .1
                .verb,
            Verb::Delete
        );
        assert_eq!(
            res(Method::GET, "/api/v1/watch/namespaces/d/configmaps")
                .1
                .verb,
            Verb::Watch
        );
        let info = parse(&Method::GET, "/api/v1/namespaces/d/configmaps", true).expect("parse");
        assert!(matches!(
            info.target,
            Target::Resource(ResourceRequest {
                verb: Verb::Watch,
                ..
            })
        ));
    }

    #[test]
    fn refuses_escapes() {
        assert!(parse(&Method::GET, "/api/v1/namespaces/d/configmaps/a%2Fb", false).is_err());
        assert!(parse(
            &Method::GET,
            "/api/v1/namespaces/d/configmaps/%2E%2E",
            false
        )
        .is_err());
        assert!(parse(&Method::GET, "/api/v1/namespaces/d/configmaps/..", false).is_err());
        assert!(parse(&Method::GET, "/clusters/Bad_Name/api", false).is_err());
    }

    #[test]
    fn discovery_and_openapi() {
        let t = |p: &str| parse(&Method::GET, p, false).expect("parse").target;
        assert_eq!(t("/api"), Target::CoreRoot);
        assert_eq!(t("/clusters/root/apis"), Target::GroupList);
        assert_eq!(t("/apis/g.io"), Target::Group("g.io".into()));
        assert_eq!(
            t("/openapi/v3/apis/g.io/v1"),
            Target::OpenApiV3Group {
                group: "g.io".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            t("/livez/ping"),
            Target::Health {
                endpoint: "livez".into(),
                check: Some("ping".into())
            }
        );
    }

    #[test]
    fn virtual_workspace_urls() {
        let info = parse(
            &Method::GET,
            "/services/apiexport/c1/widgets.example.io/clusters/*/apis/example.io/v1/widgets",
            false,
        )
        .expect("parse");
        assert_eq!(
            info.virtual_workspace,
            Some(("c1".to_string(), "widgets.example.io".to_string()))
        );
        assert_eq!(info.cluster, ClusterTarget::Wildcard);
        assert!(matches!(
            info.target,
            Target::Resource(ResourceRequest {
                verb: Verb::List,
                ..
            })
        ));
        let other = parse(&Method::GET, "/services/other/x", false).expect("parse");
        assert_eq!(other.target, Target::Unknown);
    }

    #[test]
    fn cluster_names() {
        assert!(is_valid_cluster("root"));
        assert!(is_valid_cluster("root:orgs:acme"));
        assert!(is_valid_cluster("system:admin"));
        assert!(!is_valid_cluster("Root"));
        assert!(!is_valid_cluster("root::x"));
        assert!(!is_valid_cluster("-a"));
    }
}
