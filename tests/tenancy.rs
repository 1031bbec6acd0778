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
