//! kcp-style tenancy end to end with kube-rs: workspaces, an exported Widget API bound in two
//! organisations, and a controller's view through the APIExport virtual workspace.

mod common;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use serde_json::{json, Value};

const SCHEMA: &str = include_str!("../examples/workspaces/widget-schema.yaml");
const EXPORT: &str = include_str!("../examples/workspaces/widget-export.yaml");
const BINDING: &str = include_str!("../examples/workspaces/widget-binding.yaml");
const CRD: &str = include_str!("../examples/workspaces/widget-crd.yaml");

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn workspaces() -> ApiResource {
    ar("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces")
}

fn widgets() -> ApiResource {
    ar("example.platform-mesh.io", "v1", "Widget", "widgets")
}

use common::KubeEnv as Env;

fn obj(yaml: &str) -> DynamicObject {
    let v: Value = serde_saphyr::from_str(yaml).expect("yaml");
    serde_json::from_value(v).expect("object")
}

async fn create_widget(client: Client, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &widgets());
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"color": "red"},
    }))
    .expect("widget");
    api.create(&PostParams::default(), &w)
        .await
        .expect("create widget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widgets_of_every_bound_workspace_through_the_virtual_workspace() {
    let env = Env::start().await;
    let acme = env.workspace("root:orgs", "acme", "organization").await;
    let beta = env.workspace("root:orgs", "beta", "organization").await;
    env.workspace("root:providers", "widgets", "provider").await;

    // The provider exports the Widget API.
    let provider = env.client("root:providers:widgets");
    let schemas: Api<DynamicObject> = Api::all_with(
        provider.clone(),
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
    );
    schemas
        .create(&PostParams::default(), &obj(SCHEMA))
        .await
        .expect("schema");
    let exports: Api<DynamicObject> = Api::all_with(
        provider.clone(),
        &ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
    );
    let export = exports
        .create(&PostParams::default(), &obj(EXPORT))
        .await
        .expect("export");
    assert_eq!(
        export.data["status"]["identityHash"].as_str().map(str::len),
        Some(64)
    );
    let slices: Api<DynamicObject> = Api::all_with(
        provider,
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIExportEndpointSlice",
            "apiexportendpointslices",
        ),
    );
    let found = slices
        .list(&ListParams::default().fields("metadata.name=widgets.example.platform-mesh.io"))
        .await
        .expect("slices");
    let url = found.items[0].data["status"]["endpoints"][0]["url"]
        .as_str()
        .expect("url")
        .to_string();
    assert!(url.contains("/services/apiexport/"), "{url}");

    // Both organisations bind it and create widgets.
    for org in ["root:orgs:acme", "root:orgs:beta"] {
        let bindings: Api<DynamicObject> = Api::all_with(
            env.client(org),
            &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
        );
        let b = bindings
            .create(&PostParams::default(), &obj(BINDING))
            .await
            .expect("binding");
        assert_eq!(b.data["status"]["phase"], "Bound");
        create_widget(
            env.client(org),
            &format!("from-{}", org.rsplit(':').next().unwrap_or("")),
        )
        .await;
    }

    // A CRD in one workspace is not served in another.
    let crds: Api<DynamicObject> = Api::all_with(
        env.client("root:orgs:beta"),
        &ar(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    crds.create(&PostParams::default(), &obj(CRD))
        .await
        .expect("crd");
    let gadgets = ar("example.com", "v1", "Gadget", "gadgets");
    Api::<DynamicObject>::namespaced_with(env.client("root:orgs:beta"), "default", &gadgets)
        .list(&ListParams::default())
        .await
        .expect("gadgets are served in beta");
    assert!(Api::<DynamicObject>::namespaced_with(
        env.client("root:orgs:acme"),
        "default",
        &gadgets
    )
    .list(&ListParams::default())
    .await
    .is_err());

    // A controller lists and watches every consumer through the virtual workspace.
    let all: Api<DynamicObject> =
        Api::all_with(env.client_at(&format!("{url}/clusters/*")), &widgets());
    let listed = all
        .list(&ListParams::default())
        .await
        .expect("wildcard list");
    let mut clusters: Vec<String> = listed
        .items
        .iter()
        .map(|w| {
            w.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kcp.io/cluster"))
                .cloned()
                .expect("kcp.io/cluster")
        })
        .collect();
    clusters.sort();
    let mut want = vec![acme.clone(), beta.clone()];
    want.sort();
    assert_eq!(clusters, want);
    let bindings: Api<DynamicObject> = Api::all_with(
        env.client_at(&format!("{url}/clusters/*")),
        &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
    );
    assert_eq!(
        bindings
            .list(&ListParams::default())
            .await
            .expect("bindings")
            .items
            .len(),
        2
    );

    let rv = listed.metadata.resource_version.clone().expect("list rv");
    let mut stream = all
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .expect("watch")
        .boxed();

    // Writes at <url>/clusters/<name> go to that consumer.
    create_widget(
        env.client_at(&format!("{url}/clusters/{acme}")),
        "through-vw",
    )
    .await;
    let in_acme: Api<DynamicObject> =
        Api::namespaced_with(env.client("root:orgs:acme"), "default", &widgets());
    in_acme.get("through-vw").await.expect("created in acme");

    // Deleting acme removes its widgets: the watch sees them go.
    let ws: Api<DynamicObject> = Api::all_with(env.client("root:orgs"), &workspaces());
    ws.delete("acme", &DeleteParams::default())
        .await
        .expect("delete acme");
    let mut added = Vec::new();
    let mut deleted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while deleted.len() < 2 {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("watch events in time");
        match next.expect("stream open").expect("event") {
            WatchEvent::Added(o) => added.push(o.metadata.name.unwrap_or_default()),
            WatchEvent::Deleted(o) => {
                assert_eq!(
                    o.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("kcp.io/cluster")),
                    Some(&acme)
                );
                deleted.push(o.metadata.name.unwrap_or_default());
            }
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            _ => {}
        }
    }
    deleted.sort();
    assert_eq!(added, vec!["through-vw".to_string()]);
    assert_eq!(
        deleted,
        vec!["from-acme".to_string(), "through-vw".to_string()]
    );
    let left = all
        .list(&ListParams::default())
        .await
        .expect("list after delete");
    let names: Vec<_> = left
        .items
        .iter()
        .filter_map(|w| w.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["from-beta".to_string()]);
    // The deleted workspace is gone: 403 like kcp.
    assert!(in_acme.list(&ListParams::default()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_types_limit_the_tree_and_bind_their_default_apis() {
    let env = Env::start().await;
    env.workspace("root:providers", "widgets", "provider").await;
    let provider = env.client("root:providers:widgets");
    Api::<DynamicObject>::all_with(
        provider.clone(),
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
    )
    .create(&PostParams::default(), &obj(SCHEMA))
    .await
    .expect("schema");
    Api::<DynamicObject>::all_with(
        provider,
        &ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
    )
    .create(&PostParams::default(), &obj(EXPORT))
    .await
    .expect("export");

    // A type whose workspaces bind the Widget API from the start.
    let types: Api<DynamicObject> = Api::all_with(
        env.client("root"),
        &ar(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
        ),
    );
    let wt: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
        "metadata": {"name": "widget-shop"},
        "spec": {
            "limitAllowedParents": {"types": [{"name": "orgs", "path": "root"}]},
            "defaultAPIBindings": [{"path": "root:providers:widgets", "export": "widgets.example.platform-mesh.io"}],
        },
    }))
    .expect("type");
    types
        .create(&PostParams::default(), &wt)
        .await
        .expect("create type");
    env.workspace("root:orgs", "shop", "widget-shop").await;
    create_widget(env.client("root:orgs:shop"), "on-the-house").await;

    // A type in another workspace that extends widget-shop: it counts as widget-shop for the
    // parents' limits, its workspaces bind widget-shop's APIs too, and it is Ready at once.
    let in_orgs: Api<DynamicObject> = Api::all_with(
        env.client("root:orgs"),
        &ar(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
        ),
    );
    let deluxe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
        "metadata": {"name": "deluxe-shop"},
        "spec": {"extend": {"with": [{"name": "widget-shop", "path": "root"}]},
                 "limitAllowedParents": {"types": [{"name": "orgs", "path": "root"}]}},
    }))
    .expect("type");
    let deluxe = in_orgs
        .create(&PostParams::default(), &deluxe)
        .await
        .expect("create type");
    assert_eq!(deluxe.data["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(deluxe.data["status"]["conditions"][0]["status"], "True");
    env.workspace("root:orgs", "deluxe", "root:orgs:deluxe-shop")
        .await;
    create_widget(env.client("root:orgs:deluxe"), "gold").await;
    let got = Api::<DynamicObject>::all_with(env.client("root:orgs"), &workspaces())
        .get("deluxe")
        .await
        .expect("workspace");
    assert_eq!(
        got.data["spec"]["type"],
        json!({"name": "deluxe-shop", "path": "root:orgs"})
    );

    // Parents and children are limited by the types.
    env.workspace("root:orgs", "acme", "organization").await;
    let in_acme: Api<DynamicObject> = Api::all_with(env.client("root:orgs:acme"), &workspaces());
    for (name, ty) in [
        ("p", "provider"),
        ("o", "organization"),
        ("s", "widget-shop"),
    ] {
        let ws: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"type": {"name": ty}},
        }))
        .expect("workspace");
        let err = in_acme
            .create(&PostParams::default(), &ws)
            .await
            .expect_err("type limits");
        match err {
            kube::Error::Api(s) => assert_eq!(s.code, 422, "{ty}: {}", s.message),
            other => panic!("{ty}: {other}"),
        }
    }
    env.workspace("root:orgs:acme", "team-a", "team").await;
    let unknown: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
        "metadata": {"name": "x"}, "spec": {"type": {"name": "no-such-type"}},
    }))
    .expect("workspace");
    assert!(in_acme
        .create(&PostParams::default(), &unknown)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_to_an_export_that_does_not_exist_yet_is_refused_as_kcp_refuses_it() {
    let env = Env::start().await;
    env.workspace("root:providers", "widgets", "provider").await;
    env.workspace("root:orgs", "early", "organization").await;
    let bindings: Api<DynamicObject> = Api::all_with(
        env.client("root:orgs:early"),
        &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
    );
    // kcp v0.28 refuses it too, for its admin as well (tests/differential/kcp-corpus.yaml).
    match bindings.create(&PostParams::default(), &obj(BINDING)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
            assert_eq!(
                s.message,
                "apibindings.apis.kcp.io \"widgets\" is forbidden: unable to create APIBinding: no permission to bind to export root:providers:widgets:widgets.example.platform-mesh.io"
            );
        }
        other => panic!("a binding to a missing export: {other:?}"),
    }
    let provider = env.client("root:providers:widgets");
    Api::<DynamicObject>::all_with(
        provider.clone(),
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
    )
    .create(&PostParams::default(), &obj(SCHEMA))
    .await
    .expect("schema");
    Api::<DynamicObject>::all_with(
        provider,
        &ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
    )
    .create(&PostParams::default(), &obj(EXPORT))
    .await
    .expect("export");
    let bound = bindings
        .create(&PostParams::default(), &obj(BINDING))
        .await
        .expect("binding once the export exists");
    assert_eq!(bound.data["status"]["phase"], "Bound");
    assert_eq!(bound.data["status"]["conditions"][0]["status"], "True");
    create_widget(env.client("root:orgs:early"), "now-served").await;
}

/// Waits until the APIBinding `name` in `path` says its claims are applied, and returns it.
async fn claims_applied(env: &Env, path: &str, name: &str) -> DynamicObject {
    let bindings: Api<DynamicObject> = Api::all_with(
        env.client(path),
        &ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings"),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let b = bindings.get(name).await.expect("binding");
        let applied = b.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "PermissionClaimsApplied" && c["status"] == "True");
        if applied {
            return b;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "claims of {path} never applied: {:?}",
            b.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Gives `users` the `rules` in workspace `path` (a ClusterRole and ClusterRoleBinding `name`).
async fn grant(env: &Env, path: &str, name: &str, rules: Value, users: &[&str]) {
    let rbac = |kind: &str, plural: &str| ar("rbac.authorization.k8s.io", "v1", kind, plural);
    let subjects: Vec<Value> = users
        .iter()
        .map(|u| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}))
        .collect();
    for (r, obj) in [
        (
            rbac("ClusterRole", "clusterroles"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name}, "rules": rules}),
        ),
        (
            rbac("ClusterRoleBinding", "clusterrolebindings"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                   "subjects": subjects}),
        ),
    ] {
        Api::<DynamicObject>::all_with(env.client(path), &r)
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).expect("object"),
            )
            .await
            .unwrap_or_else(|e| panic!("{} {name} in {path}: {e}", r.kind));
    }
}

/// A user of the server who is no admin: a client certificate of its CA, with no rights but
/// those a test grants.
struct User {
    config: kube::Config,
    address: std::net::SocketAddr,
}

impl User {
    async fn new(env: &Env, name: &str) -> User {
        let kubeconfig = env
            .server
            .write_user_kubeconfig(&format!("{name}.kubeconfig"), name, &[])
            .expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("read"),
            &Default::default(),
        )
        .await
        .expect("config");
        User {
            config,
            address: env.server.address,
        }
    }

    /// A client of the server's URL path `path` (`/clusters/...`, `/services/...`).
    fn at(&self, path: &str) -> Client {
        let mut c = self.config.clone();
        c.cluster_url = format!("https://{}{path}", self.address)
            .parse()
            .expect("url");
        Client::try_from(c).expect("client")
    }

    /// A client of workspace `path`.
    fn in_workspace(&self, path: &str) -> Client {
        self.at(&format!("/clusters/{path}"))
    }
}

fn secret(name: &str, labels: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": labels}, "stringData": {"k": "v"}}))
    .expect("secret")
}

/// The names of the objects of `list` the tests made (not the kube-root-ca.crt the server puts
/// in every namespace).
fn names(list: &kube::core::ObjectList<DynamicObject>) -> Vec<String> {
    let mut n: Vec<String> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .filter(|n| n != "kube-root-ca.crt")
        .collect();
    n.sort();
    n
}

/// kcp's permission claims, row by row as kcp answers them: what the export's owner reaches in a
/// consumer workspace through the export's virtual workspace depends only on what the consumer
/// accepted, selected, and the verbs both sides allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_claims_give_the_export_owner_only_what_was_accepted() {
    let env = Env::start().await;
    let acme = env.workspace("root:orgs", "acme", "organization").await;
    let beta = env.workspace("root:orgs", "beta", "organization").await;
    let gamma = env.workspace("root:orgs", "gamma", "organization").await;
    env.workspace("root:providers", "widgets", "provider").await;
    let provider = env.client("root:providers:widgets");
    Api::<DynamicObject>::all_with(
        provider.clone(),
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
    )
    .create(&PostParams::default(), &obj(SCHEMA))
    .await
    .expect("schema");
    // A v1alpha2 export claiming secrets (most verbs, not patch) and configmaps (read only).
    let mut export = obj(EXPORT);
    export.types = Some(kube::core::TypeMeta {
        api_version: "apis.kcp.io/v1alpha2".into(),
        kind: "APIExport".into(),
    });
    let schema_name = export.data["spec"]["latestResourceSchemas"][0].clone();
    export.data["spec"] = json!({
        "resources": [{"group": "example.platform-mesh.io", "name": "widgets", "schema": schema_name, "storage": {"crd": {}}}],
        "permissionClaims": [
            {"group": "", "resource": "secrets", "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            {"group": "", "resource": "configmaps", "verbs": ["get", "list"]},
        ],
    });
    let export = Api::<DynamicObject>::all_with(
        provider.clone(),
        &ar("apis.kcp.io", "v1alpha2", "APIExport", "apiexports"),
    )
    .create(&PostParams::default(), &export)
    .await
    .expect("export");
    let export_name = export.metadata.name.clone().expect("name");
    let url = format!(
        "https://{}/services/apiexport/{}/{export_name}",
        env.server.address,
        export
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kcp.io/cluster"))
            .expect("export cluster")
    );

    // acme accepts secrets labelled share=yes; beta binds without accepting; gamma accepts
    // configmaps with every verb (the export allows only reading).
    let binding = |claims: Value| -> DynamicObject {
        let mut b = obj(BINDING);
        b.types = Some(kube::core::TypeMeta {
            api_version: "apis.kcp.io/v1alpha2".into(),
            kind: "APIBinding".into(),
        });
        b.data["spec"]["permissionClaims"] = claims;
        b
    };
    let v2_bindings = ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings");
    let accept = |resource: &str, verbs: Value, selector: Value, state: &str| json!({"group": "", "resource": resource, "verbs": verbs, "selector": selector, "state": state});
    let acme_claims = json!([
        accept(
            "secrets",
            json!(["get", "list", "watch", "create", "update", "patch", "delete"]),
            json!({"matchLabels": {"share": "yes"}}),
            "Accepted"
        ),
        accept(
            "configmaps",
            json!(["get", "list"]),
            json!({"matchAll": true}),
            "Rejected"
        ),
    ]);
    for (path, claims) in [
        ("root:orgs:acme", acme_claims.clone()),
        ("root:orgs:beta", json!([])),
        (
            "root:orgs:gamma",
            json!([accept(
                "configmaps",
                json!(["get", "list", "watch", "delete"]),
                json!({"matchAll": true}),
                "Accepted"
            )]),
        ),
    ] {
        let b = Api::<DynamicObject>::all_with(env.client(path), &v2_bindings)
            .create(&PostParams::default(), &binding(claims))
            .await
            .expect("binding");
        assert_eq!(b.data["status"]["phase"], "Bound");
    }
    // Each consumer has secrets and configmaps of its own.
    for path in ["root:orgs:acme", "root:orgs:beta", "root:orgs:gamma"] {
        let secrets: Api<DynamicObject> = Api::namespaced_with(
            env.client(path),
            "default",
            &ar("", "v1", "Secret", "secrets"),
        );
        let short = path.rsplit(':').next().unwrap_or_default();
        for (name, share) in [("shared", "yes"), ("private", "no")] {
            secrets
                .create(
                    &PostParams::default(),
                    &secret(&format!("{short}-{name}"), json!({"share": share})),
                )
                .await
                .expect("secret");
        }
        let cm: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("{short}-settings")}, "data": {"a": "b"}}))
            .expect("configmap");
        Api::<DynamicObject>::namespaced_with(
            env.client(path),
            "default",
            &ar("", "v1", "ConfigMap", "configmaps"),
        )
        .create(&PostParams::default(), &cm)
        .await
        .expect("configmap");
    }
    // A tenant's own forged claim label is replaced by the server's.
    let acme_secrets: Api<DynamicObject> = Api::namespaced_with(
        env.client("root:orgs:acme"),
        "default",
        &ar("", "v1", "Secret", "secrets"),
    );
    let acme_binding = claims_applied(&env, "root:orgs:acme", "widgets").await;
    claims_applied(&env, "root:orgs:gamma", "widgets").await;
    let conditions = acme_binding.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // acme accepted patch too, which the export does not claim: valid for kcp v0.28, and the
    // claim works with the verbs both sides allow.
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "PermissionClaimsValid" && c["status"] == "True"),
        "{conditions:?}"
    );
    assert_eq!(
        acme_binding.data["status"]["exportPermissionClaims"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        acme_binding.data["status"]["appliedPermissionClaims"][0]["resource"],
        "secrets"
    );
    let shared = acme_secrets
        .get("acme-shared")
        .await
        .expect("shared secret");
    let claim_label = shared
        .metadata
        .labels
        .as_ref()
        .and_then(|l| {
            l.iter()
                .find(|(k, _)| k.starts_with("claimed.internal.apis.kcp.io/"))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .expect("the selected secret carries the claim label");
    assert_eq!(
        claim_label.1, "ctwrJRvMX7cX8wwk40Lz00UjJhYxPWE3TpN1lu",
        "kcp's value for core secrets"
    );
    let private = acme_secrets
        .get("acme-private")
        .await
        .expect("private secret");
    assert!(private
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| !l.contains_key(&claim_label.0)));
    acme_secrets
        .create(
            &PostParams::default(),
            &secret(
                "acme-forged",
                json!({"share": "no", claim_label.0.clone(): claim_label.1.clone()}),
            ),
        )
        .await
        .expect("forged");

    let vw = |cluster: &str, resource: (&str, &str)| -> Api<DynamicObject> {
        let r = ar("", "v1", resource.0, resource.1);
        let client = env.client_at(&format!("{url}/clusters/{cluster}"));
        match cluster {
            "*" => Api::all_with(client, &r),
            _ => Api::namespaced_with(client, "default", &r),
        }
    };
    let secrets_of = |c: &str| vw(c, ("Secret", "secrets"));
    let configmaps_of = |c: &str| vw(c, ("ConfigMap", "configmaps"));
    let lp = ListParams::default();

    // Row: across every bound workspace, only accepted and selected objects exist.
    assert_eq!(
        names(&secrets_of("*").list(&lp).await.expect("wildcard secrets")),
        vec!["acme-shared"]
    );
    assert_eq!(
        names(
            &configmaps_of("*")
                .list(&lp)
                .await
                .expect("wildcard configmaps")
        ),
        vec!["gamma-settings"]
    );
    // Row: a workspace that accepted nothing gives nothing: 403 as kcp's authorizer.
    let (code, message) = api_error(secrets_of(&beta).list(&lp).await);
    assert_eq!(code, 403);
    assert!(message.ends_with(": access denied"), "{message}");
    // Row: a rejected claim gives nothing.
    assert_eq!(api_error(configmaps_of(&acme).list(&lp).await).0, 403);
    // Row: in the accepting workspace, the selected secret is there, the others are not (404).
    assert_eq!(
        names(&secrets_of(&acme).list(&lp).await.expect("acme secrets")),
        vec!["acme-shared"]
    );
    secrets_of(&acme)
        .get("acme-shared")
        .await
        .expect("selected secret");
    assert_eq!(
        api_error(secrets_of(&acme).get("acme-private").await).0,
        404
    );
    assert_eq!(api_error(secrets_of(&acme).get("acme-forged").await).0, 404);
    assert_eq!(
        api_error(
            secrets_of(&acme)
                .delete("acme-private", &DeleteParams::default())
                .await
        )
        .0,
        404
    );
    // Row: a write through the claim gets the selector's labels; another value is refused.
    let made = secrets_of(&acme)
        .create(&PostParams::default(), &secret("from-provider", json!({})))
        .await
        .expect("create through the claim");
    assert_eq!(
        made.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("share"))
            .map(String::as_str),
        Some("yes")
    );
    let (code, message) = api_error(
        secrets_of(&acme)
            .create(
                &PostParams::default(),
                &secret("wrong-label", json!({"share": "no"})),
            )
            .await,
    );
    assert_eq!(
        (code, message.as_str()),
        (403, "protected label share must have value yes")
    );
    // Row: a verb outside the intersection (the export does not claim patch) is refused.
    let (code, _) = api_error(
        secrets_of(&acme)
            .patch(
                "acme-shared",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"data": {}})),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        names(
            &configmaps_of(&gamma)
                .list(&lp)
                .await
                .expect("gamma configmaps")
        ),
        vec!["gamma-settings"]
    );
    assert_eq!(
        api_error(
            configmaps_of(&gamma)
                .delete("gamma-settings", &DeleteParams::default())
                .await
        )
        .0,
        403
    );
    // Row: `*` on the binding's side only is no wildcard (kcp intersects the verb sets).
    let gamma_bindings: Api<DynamicObject> =
        Api::all_with(env.client("root:orgs:gamma"), &v2_bindings);
    gamma_bindings
        .patch(
            "widgets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"permissionClaims": [
                accept("configmaps", json!(["*"]), json!({"matchAll": true}), "Accepted")]}})),
        )
        .await
        .expect("star");
    claims_applied(&env, "root:orgs:gamma", "widgets").await;
    assert_eq!(api_error(configmaps_of(&gamma).list(&lp).await).0, 403);
    // Row: APIBindings to the export are visible, never writable without a claim.
    let bindings_vw: Api<DynamicObject> = Api::all_with(
        env.client_at(&format!("{url}/clusters/*")),
        &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
    );
    assert_eq!(
        bindings_vw.list(&lp).await.expect("bindings").items.len(),
        3
    );
    let in_acme: Api<DynamicObject> = Api::all_with(
        env.client_at(&format!("{url}/clusters/{acme}")),
        &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
    );
    let (code, message) = api_error(in_acme.delete("widgets", &DeleteParams::default()).await);
    assert_eq!(code, 403);
    assert!(message.ends_with(": access denied"), "{message}");

    // Rejecting the claim relabels: the provider loses the secrets at once.
    let acme_bindings: Api<DynamicObject> =
        Api::all_with(env.client("root:orgs:acme"), &v2_bindings);
    let mut rejected = acme_claims.clone();
    rejected[0]["state"] = json!("Rejected");
    acme_bindings
        .patch(
            "widgets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"permissionClaims": rejected}})),
        )
        .await
        .expect("reject");
    claims_applied(&env, "root:orgs:acme", "widgets").await;
    assert!(secrets_of("*")
        .list(&lp)
        .await
        .expect("wildcard")
        .items
        .is_empty());
    assert_eq!(api_error(secrets_of(&acme).list(&lp).await).0, 403);
    let shared = acme_secrets.get("acme-shared").await.expect("shared");
    assert!(shared
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| !l.contains_key(&claim_label.0)));

    // A claim the export does not make is invalid.
    let mut bogus = acme_claims.clone();
    bogus[1] = accept(
        "pods",
        json!(["get"]),
        json!({"matchAll": true}),
        "Accepted",
    );
    let b = acme_bindings
        .patch(
            "widgets",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"permissionClaims": bogus}})),
        )
        .await
        .expect("bogus claim");
    let valid = b.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PermissionClaimsValid")
        .cloned()
        .expect("valid condition");
    assert_eq!(
        (valid["status"].as_str(), valid["reason"].as_str()),
        (Some("False"), Some("InvalidPermissionClaims"))
    );
}

/// kcp's workspace initializers: a workspace whose type chain names initializers stays
/// Initializing until each removed itself through its initializing virtual workspace, where it
/// sees only the workspaces waiting for it and may remove only its own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initializers_hold_a_workspace_until_each_removed_itself() {
    let env = Env::start().await;
    let tc = env.workspace("root:providers", "initz", "provider").await;
    let types: Api<DynamicObject> = Api::all_with(
        env.client("root:providers:initz"),
        &ar(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
        ),
    );
    types
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                "metadata": {"name": "audited"}, "spec": {"initializer": true}}),
            )
            .expect("type"),
        )
        .await
        .expect("audited type");
    let secured = types
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                "metadata": {"name": "secured"},
                "spec": {"initializer": true, "extend": {"with": [{"name": "audited", "path": "root:providers:initz"}]}}}))
            .expect("type"),
        )
        .await
        .expect("secured type");
    let (mine, theirs) = (format!("{tc}:secured"), format!("{tc}:audited"));
    let vw_url = secured.data["status"]["virtualWorkspaces"][0]["url"]
        .as_str()
        .expect("initializing URL")
        .to_string();
    assert!(
        vw_url.ends_with(&format!("/services/initializingworkspaces/{mine}")),
        "{vw_url}"
    );

    // A workspace of that type waits for both initializers.
    let ws: Api<DynamicObject> = Api::all_with(env.client("root:orgs"), &workspaces());
    ws.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "guarded"}, "spec": {"type": {"name": "secured", "path": "root:providers:initz"}}}))
        .expect("workspace"),
    )
    .await
    .expect("guarded");
    let lcs = ar(
        "core.kcp.io",
        "v1alpha1",
        "LogicalCluster",
        "logicalclusters",
    );
    let lc_of = |client: Client| Api::<DynamicObject>::all_with(client, &lcs);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let guarded = loop {
        let w = ws.get("guarded").await.expect("guarded");
        if w.data["status"]["phase"] == "Initializing"
            && w.data["status"]["initializers"].is_array()
        {
            break w;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            w.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        guarded.data["status"]["initializers"],
        json!([mine, theirs])
    );
    let cluster = guarded.data["spec"]["cluster"]
        .as_str()
        .expect("cluster")
        .to_string();
    let lc = lc_of(env.client("root:orgs:guarded"))
        .get("cluster")
        .await
        .expect("lc");
    assert_eq!(lc.data["status"]["phase"], "Initializing");
    assert_eq!(lc.data["spec"]["initializers"], json!([mine, theirs]));

    // alice, without `initialize` on the type, sees nothing.
    let as_alice = |url: String| {
        let mut c = env.config.clone();
        c.cluster_url = url.parse().expect("url");
        c.auth_info.impersonate = Some("alice".into());
        Client::try_from(c).expect("client")
    };
    let alice_all = lc_of(as_alice(format!("{vw_url}/clusters/*")));
    assert_eq!(
        api_error(alice_all.list(&ListParams::default()).await).0,
        403
    );
    // Even as the workspace's admin she cannot reach it (nor strip its initializers) before it
    // is Ready.
    Api::<DynamicObject>::all_with(
        env.client("root:orgs:guarded"),
        &ar(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
        ),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "everything"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        )
        .expect("role"),
    )
    .await
    .expect("everything");
    Api::<DynamicObject>::all_with(
        env.client("root:orgs:guarded"),
        &ar("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings"),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "alice-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "everything"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}))
        .expect("binding"),
    )
    .await
    .expect("alice admin of guarded");
    let alice_direct = lc_of(as_alice(format!(
        "https://{}/clusters/root:orgs:guarded",
        env.server.address
    )));
    assert_eq!(api_error(alice_direct.get("cluster").await).0, 403);
    // Granted it, she lists exactly the workspaces waiting for her.
    let rbac = |kind: &str, plural: &str| {
        Api::<DynamicObject>::all_with(
            env.client("root:providers:initz"),
            &ar("rbac.authorization.k8s.io", "v1", kind, plural),
        )
    };
    rbac("ClusterRole", "clusterroles")
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "initialize-secured"},
                "rules": [{"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"],
                           "resourceNames": ["secured"], "verbs": ["initialize"]}]}),
            )
            .expect("role"),
        )
        .await
        .expect("role");
    rbac("ClusterRoleBinding", "clusterrolebindings")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "alice-initializes"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "initialize-secured"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}))
            .expect("binding"),
        )
        .await
        .expect("binding");
    let waiting = alice_all
        .list(&ListParams::default())
        .await
        .expect("alice lists");
    assert_eq!(
        waiting
            .items
            .iter()
            .filter_map(|o| o.metadata.annotations.as_ref()?.get("kcp.io/path").cloned())
            .collect::<Vec<_>>(),
        vec!["root:orgs:guarded".to_string()]
    );
    // kcp's lifecycle virtual workspaces take logical-cluster names, not paths.
    assert_eq!(
        api_error(
            lc_of(as_alice(format!("{vw_url}/clusters/root:orgs:guarded")))
                .get("cluster")
                .await
        )
        .0,
        404
    );
    // Inside the waiting workspace she works as its owner.
    let inside = format!("{vw_url}/clusters/{cluster}");
    let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prepared"}, "data": {"by": "initializer"}}))
    .expect("configmap");
    Api::<DynamicObject>::namespaced_with(
        as_alice(inside.clone()),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    )
    .create(&PostParams::default(), &cm)
    .await
    .expect("the initializer prepares the workspace");
    // She may remove her own name only.
    let alice_lc = lc_of(as_alice(inside.clone()));
    let patch = |list: Value| kube::api::Patch::Merge(json!({"status": {"initializers": list}}));
    let (code, message) = api_error(
        alice_lc
            .patch_status(
                "cluster",
                &kube::api::PatchParams::default(),
                &patch(json!([mine])),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(&format!(
            "only removing the {mine:?} initializer is supported"
        )),
        "{message}"
    );
    alice_lc
        .patch_status(
            "cluster",
            &kube::api::PatchParams::default(),
            &patch(json!([theirs])),
        )
        .await
        .expect("removing her own name");
    // Done, she reaches the workspace no more; it still waits for the other initializer.
    assert_eq!(api_error(alice_lc.get("cluster").await).0, 404);
    assert_eq!(
        api_error(
            Api::<DynamicObject>::namespaced_with(
                as_alice(inside),
                "default",
                &ar("", "v1", "ConfigMap", "configmaps")
            )
            .list(&ListParams::default())
            .await
        )
        .0,
        403
    );
    assert!(alice_all
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
    let w = ws.get("guarded").await.expect("guarded");
    assert_eq!(
        (
            w.data["status"]["phase"].as_str(),
            &w.data["status"]["initializers"]
        ),
        (Some("Initializing"), &json!([theirs]))
    );
    // The other initializer finishes: the workspace is Ready with what the first one prepared.
    let other_url = vw_url.replace(&mine, &theirs);
    lc_of(env.client_at(&format!("{other_url}/clusters/{cluster}")))
        .patch_status(
            "cluster",
            &kube::api::PatchParams::default(),
            &patch(json!([])),
        )
        .await
        .expect("the last initializer");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let w = ws.get("guarded").await.expect("guarded");
        if w.data["status"]["phase"] == "Ready" {
            assert!(
                w.data["status"].get("initializers").is_none(),
                "{:?}",
                w.data["status"]
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            w.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lc = lc_of(env.client("root:orgs:guarded"))
        .get("cluster")
        .await
        .expect("lc");
    assert_eq!(lc.data["status"]["phase"], "Ready");
    alice_direct
        .get("cluster")
        .await
        .expect("Ready: its admin reaches it");
    Api::<DynamicObject>::namespaced_with(
        env.client("root:orgs:guarded"),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    )
    .get("prepared")
    .await
    .expect("prepared during initialization");
}

/// Terminators: a deleted workspace whose type chain names terminators keeps its content until
/// each terminator removed its name through the terminating virtual workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminators_hold_a_deleted_workspace_until_each_removed_itself() {
    let env = Env::start().await;
    let tc = env.workspace("root:providers", "termz", "provider").await;
    let types: Api<DynamicObject> = Api::all_with(
        env.client("root:providers:termz"),
        &ar(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
        ),
    );
    let wt = types
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                "metadata": {"name": "kept"}, "spec": {"terminator": true}}),
            )
            .expect("type"),
        )
        .await
        .expect("kept type");
    let id = format!("{tc}:kept");
    let vw_url = wt.data["status"]["virtualWorkspaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["url"].as_str())
        .find(|u| u.contains("/terminatingworkspaces/"))
        .expect("terminating URL")
        .to_string();
    assert!(
        vw_url.ends_with(&format!("/services/terminatingworkspaces/{id}")),
        "{vw_url}"
    );
    let cluster = env
        .workspace("root:orgs", "doomed", "root:providers:termz:kept")
        .await;
    let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "precious"}, "data": {"a": "b"}}))
    .expect("configmap");
    let in_doomed: Api<DynamicObject> = Api::namespaced_with(
        env.client("root:orgs:doomed"),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    );
    in_doomed
        .create(&PostParams::default(), &cm)
        .await
        .expect("configmap");
    let lcs = ar(
        "core.kcp.io",
        "v1alpha1",
        "LogicalCluster",
        "logicalclusters",
    );
    let terminating = |c: &str| {
        Api::<DynamicObject>::all_with(env.client_at(&format!("{vw_url}/clusters/{c}")), &lcs)
    };
    // Not deleted yet: nothing waits for the terminator, and it reaches nothing.
    assert!(terminating("*")
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
    assert_eq!(api_error(terminating(&cluster).get("cluster").await).0, 404);

    let ws: Api<DynamicObject> = Api::all_with(env.client("root:orgs"), &workspaces());
    ws.delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = terminating("*")
            .list(&ListParams::default())
            .await
            .expect("list");
        if !waiting.items.is_empty() {
            assert_eq!(waiting.items[0].data["status"]["terminators"], json!([id]));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never offered to the terminator"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The workspace and its content stay while the terminator works.
    ws.get("doomed").await.expect("still there");
    let inside = Api::<DynamicObject>::namespaced_with(
        env.client_at(&format!("{vw_url}/clusters/{cluster}")),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    );
    inside
        .get("precious")
        .await
        .expect("the terminator reads the content");
    terminating(&cluster)
        .patch_status(
            "cluster",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"terminators": []}})),
        )
        .await
        .expect("the terminator removes its name");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match ws.get_opt("doomed").await.expect("get") {
            None => break,
            Some(_) => assert!(tokio::time::Instant::now() < deadline, "never deleted"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(api_error(inside.get("precious").await).0, 403);
}

/// A workspace type's default binding accepts every claim of its export, as kcp's API binder
/// does: the export's owner reaches the claimed objects of every workspace of that type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_bindings_accept_their_exports_claims() {
    let env = Env::start().await;
    env.workspace("root:providers", "svc", "provider").await;
    let provider = env.client("root:providers:svc");
    let export: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": "svc"},
        "spec": {"permissionClaims": [{"group": "", "resource": "configmaps", "verbs": ["get", "list"]}]}}))
    .expect("export");
    let export = Api::<DynamicObject>::all_with(
        provider.clone(),
        &ar("apis.kcp.io", "v1alpha2", "APIExport", "apiexports"),
    )
    .create(&PostParams::default(), &export)
    .await
    .expect("export");
    Api::<DynamicObject>::all_with(
        provider,
        &ar(
            "tenancy.kcp.io",
            "v1alpha1",
            "WorkspaceType",
            "workspacetypes",
        ),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
            "metadata": {"name": "customer"},
            "spec": {"defaultAPIBindings": [{"path": "root:providers:svc", "export": "svc"}]}}),
        )
        .expect("type"),
    )
    .await
    .expect("type");
    let customer = env
        .workspace("root:orgs", "customer", "root:providers:svc:customer")
        .await;
    let binding = Api::<DynamicObject>::all_with(
        env.client("root:orgs:customer"),
        &ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings"),
    )
    .get("svc")
    .await
    .expect("default binding");
    assert_eq!(
        binding.data["spec"]["permissionClaims"][0]["state"],
        "Accepted"
    );
    assert_eq!(
        binding.data["spec"]["permissionClaims"][0]["selector"],
        json!({"matchAll": true})
    );
    let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"}, "data": {"a": "b"}}))
    .expect("configmap");
    Api::<DynamicObject>::namespaced_with(
        env.client("root:orgs:customer"),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    )
    .create(&PostParams::default(), &cm)
    .await
    .expect("configmap");
    let url = format!(
        "https://{}/services/apiexport/{}/svc/clusters/{customer}",
        env.server.address,
        export
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kcp.io/cluster"))
            .expect("export cluster")
    );
    let seen = Api::<DynamicObject>::namespaced_with(
        env.client_at(&url),
        "default",
        &ar("", "v1", "ConfigMap", "configmaps"),
    )
    .get("settings")
    .await
    .expect("the export's owner reads it through the claim");
    assert_eq!(seen.data["data"]["a"], "b");
}

/// kcp's warrant: a write that an APIExport's virtual workspace lets into a consumer's workspace
/// runs with the rights of that workspace's administrator (kcp impersonates the caller and adds
/// a warrant of a workspace-local admin), so the export's owner may create there, through an
/// accepted claim, a ClusterRole granting more than it holds itself; the same owner reaching the
/// workspace directly is refused, and so is a workspace that did not accept the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_the_virtual_workspace_carry_kcps_warrant_into_that_workspace() {
    let env = Env::start().await;
    env.workspace("root:providers", "owner", "provider").await;
    let granted = env.workspace("root:orgs", "granted", "organization").await;
    env.workspace("root:orgs", "refused", "organization").await;
    let rbac = |kind: &str, plural: &str| ar("rbac.authorization.k8s.io", "v1", kind, plural);
    // User `owner` administers its own workspace and nothing else.
    grant(
        &env,
        "root:providers:owner",
        "everything",
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        &["owner"],
    )
    .await;
    let owner = User::new(&env, "owner").await;
    // The owner exports nothing but a claim on ClusterRoles.
    let export: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": "roles"},
        "spec": {"permissionClaims": [{"group": "rbac.authorization.k8s.io", "resource": "clusterroles", "verbs": ["*"]}]}}))
    .expect("export");
    let export = Api::<DynamicObject>::all_with(
        owner.at("/clusters/root:providers:owner"),
        &ar("apis.kcp.io", "v1alpha2", "APIExport", "apiexports"),
    )
    .create(&PostParams::default(), &export)
    .await
    .expect("the owner's export");
    let export_cluster = export
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kcp.io/cluster"))
        .expect("export cluster")
        .clone();
    // `granted` accepts the claim, `refused` binds without accepting it.
    for (path, claims) in [
        (
            "root:orgs:granted",
            json!([{"group": "rbac.authorization.k8s.io", "resource": "clusterroles", "verbs": ["*"],
                    "selector": {"matchAll": true}, "state": "Accepted"}]),
        ),
        ("root:orgs:refused", json!([])),
    ] {
        let b: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding", "metadata": {"name": "roles"},
            "spec": {"reference": {"export": {"path": "root:providers:owner", "name": "roles"}},
                     "permissionClaims": claims}}))
        .expect("binding");
        Api::<DynamicObject>::all_with(
            env.client(path),
            &ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings"),
        )
        .create(&PostParams::default(), &b)
        .await
        .expect("consumer binding");
    }
    claims_applied(&env, "root:orgs:granted", "roles").await;
    let refused = env
        .client("root:orgs:refused")
        .request_text(
            http::Request::get("/apis/core.kcp.io/v1alpha1/logicalclusters/cluster")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("refused's LogicalCluster");
    let refused: Value = serde_json::from_str(&refused).expect("json");
    let refused = refused["metadata"]["annotations"]["kcp.io/cluster"]
        .as_str()
        .expect("refused's cluster")
        .to_string();
    let powerful: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "powerful"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}))
    .expect("role");
    let through = |cluster: &str| {
        Api::<DynamicObject>::all_with(
            owner.at(&format!(
                "/services/apiexport/{export_cluster}/roles/clusters/{cluster}"
            )),
            &rbac("ClusterRole", "clusterroles"),
        )
    };
    through(&granted)
        .create(&PostParams::default(), &powerful)
        .await
        .expect("the warrant lets the owner write what the workspace's admin could");
    let direct = Api::<DynamicObject>::all_with(
        owner.at("/clusters/root:orgs:granted"),
        &rbac("ClusterRole", "clusterroles"),
    );
    let (code, _) = api_error(direct.get("powerful").await);
    assert_eq!(
        code, 403,
        "directly, the owner is no member of the workspace"
    );
    let (code, message) = api_error(
        through(&refused)
            .create(&PostParams::default(), &powerful)
            .await,
    );
    assert_eq!(code, 403, "{message}");
}

/// kcp's workspace ownership: whoever creates a workspace is recorded as its owner (a tenant
/// cannot name another one, nor change it later) and becomes its administrator
/// (`workspace-admin`); nobody else gains anything there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creator_of_a_workspace_owns_it_and_only_the_creator() {
    let env = Env::start().await;
    // alice and bob may create workspaces in root:orgs, nothing more.
    grant(
        &env,
        "root:orgs",
        "workspace-creator",
        json!([{"apiGroups": ["tenancy.kcp.io"], "resources": ["workspaces"], "verbs": ["create", "get", "update"]}]),
        &["alice", "bob"],
    )
    .await;
    let (alice, bob) = (User::new(&env, "alice").await, User::new(&env, "bob").await);
    // alice names bob as the owner: the server records alice.
    let ws: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
        "metadata": {"name": "wonderland",
                     "annotations": {"experimental.tenancy.kcp.io/owner": "{\"username\":\"bob\"}"}},
        "spec": {"type": {"name": "organization", "path": "root"}}}))
    .expect("workspace");
    let created = Api::<DynamicObject>::all_with(alice.in_workspace("root:orgs"), &workspaces())
        .create(&PostParams::default(), &ws)
        .await
        .expect("alice creates a workspace");
    let owner = |w: &DynamicObject| -> Value {
        serde_json::from_str(
            w.metadata.annotations.as_ref().expect("annotations")
                ["experimental.tenancy.kcp.io/owner"]
                .as_str(),
        )
        .expect("owner json")
    };
    assert_eq!(owner(&created)["username"], "alice");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let configmaps = ar("", "v1", "ConfigMap", "configmaps");
    loop {
        match Api::<DynamicObject>::namespaced_with(
            alice.in_workspace("root:orgs:wonderland"),
            "default",
            &configmaps,
        )
        .list(&ListParams::default())
        .await
        {
            Ok(_) => break,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "alice never administered her workspace: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, _) = api_error(
        Api::<DynamicObject>::namespaced_with(
            bob.in_workspace("root:orgs:wonderland"),
            "default",
            &configmaps,
        )
        .list(&ListParams::default())
        .await,
    );
    assert_eq!(code, 403, "bob gains nothing in alice's workspace");
    // The owner stays alice's, whatever an update says.
    let mut changed =
        Api::<DynamicObject>::all_with(alice.in_workspace("root:orgs"), &workspaces())
            .get("wonderland")
            .await
            .expect("get");
    changed
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            "experimental.tenancy.kcp.io/owner".into(),
            "{\"username\":\"bob\"}".into(),
        );
    let updated = Api::<DynamicObject>::all_with(alice.in_workspace("root:orgs"), &workspaces())
        .replace("wonderland", &PostParams::default(), &changed)
        .await
        .expect("update");
    assert_eq!(owner(&updated)["username"], "alice");
}

/// kcp binds a workspace's default APIs as its owner: an owner who may not bind the export gets
/// a workspace that waits (Initializing, `APIBindingsInitialized` False) until an administrator
/// grants `bind`, and then comes up without anyone touching it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_bindings_are_made_as_the_owner_and_wait_for_bind() {
    let env = Env::start().await;
    let admin = env.client("root");
    let create = |r: ApiResource, v: Value| {
        let admin = admin.clone();
        async move {
            Api::<DynamicObject>::all_with(admin, &r)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(v).expect("object"),
                )
                .await
                .expect("create")
        }
    };
    create(
        ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
        json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport", "metadata": {"name": "gated-api"}, "spec": {}}),
    )
    .await;
    create(
        ar("tenancy.kcp.io", "v1alpha1", "WorkspaceType", "workspacetypes"),
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType", "metadata": {"name": "bound"},
               "spec": {"defaultAPIBindings": [{"export": "gated-api", "path": "root"}]}}),
    )
    .await;
    grant(
        &env,
        "root",
        "bound-creator",
        json!([{"apiGroups": ["tenancy.kcp.io"], "resources": ["workspaces"], "verbs": ["create", "get"]},
               {"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"], "resourceNames": ["bound"], "verbs": ["use"]}]),
        &["carol"],
    )
    .await;
    let carol = User::new(&env, "carol").await;
    Api::<DynamicObject>::all_with(carol.in_workspace("root"), &workspaces())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                "metadata": {"name": "carols"}, "spec": {"type": {"name": "bound", "path": "root"}}}))
            .expect("workspace"),
        )
        .await
        .expect("carol creates her workspace");
    let lc = Api::<DynamicObject>::all_with(
        env.client("root:carols"),
        &ar(
            "core.kcp.io",
            "v1alpha1",
            "LogicalCluster",
            "logicalclusters",
        ),
    );
    let condition = |lc: &DynamicObject| {
        lc.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "APIBindingsInitialized")
            .cloned()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        // The workspace's path resolves once it is scheduled: until then its LogicalCluster is
        // not found there.
        let status = match lc.get("cluster").await {
            Ok(now) => {
                if let Some(c) = condition(&now).filter(|c| c["status"] == "False") {
                    break (c, now);
                }
                now.data["status"].clone()
            }
            Err(kube::Error::Api(e)) if e.code == 404 => json!("not scheduled yet"),
            Err(e) => panic!("LogicalCluster: {e}"),
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "never refused: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.0["reason"], "APIBindingErrors");
    assert!(
        refused.0["message"]
            .as_str()
            .unwrap_or("")
            .contains("no permission to bind"),
        "{}",
        refused.0
    );
    assert_eq!(refused.1.data["status"]["phase"], "Initializing");
    // An administrator lets carol bind the export: the workspace comes up on its own.
    grant(
        &env,
        "root",
        "gated-api-binder",
        json!([{"apiGroups": ["apis.kcp.io"], "resources": ["apiexports"], "resourceNames": ["gated-api"], "verbs": ["bind"]}]),
        &["carol"],
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = lc.get("cluster").await.expect("LogicalCluster");
        if now.data["status"]["phase"] == "Ready" {
            assert_eq!(condition(&now).expect("condition")["status"], "True");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never Ready: {:?}",
            now.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bindings = Api::<DynamicObject>::all_with(
        env.client("root:carols"),
        &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
    )
    .list(&ListParams::default())
    .await
    .expect("bindings");
    assert_eq!(names(&bindings), vec!["gated-api".to_string()]);
}
