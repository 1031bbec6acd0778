//! Platform Mesh's virtual workspaces (`/services/contentconfigurations`, `/services/marketplace`)
//! served over the server's own workspaces: each of upstream's rules, GET and WATCH answering
//! from the same computed view as LIST, authorization, clear errors, and kubectl 1.27 and 1.33.

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use serde_json::{json, Value};

const CONTENT_SCHEMA: &str = include_str!(
    "../manifests/kcp/01-platform-mesh-system/10-apiresourceschema-contentconfigurations.ui.platform-mesh.io.yaml"
);
const PROVIDER_SCHEMA: &str = include_str!(
    "../manifests/kcp/01-platform-mesh-system/10-apiresourceschema-providermetadatas.ui.platform-mesh.io.yaml"
);
const WIDGET_SCHEMA: &str = include_str!("../examples/workspaces/widget-schema.yaml");
const WIDGET_EXPORT: &str = include_str!("../examples/workspaces/widget-export.yaml");

const ENTITY: &str = "ui.platform-mesh.io/entity";
const CONTENT_FOR: &str = "ui.platform-mesh.io/content-for";
const WIDGETS: &str = "widgets.example.platform-mesh.io";

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn contents() -> ApiResource {
    ar(
        "ui.platform-mesh.io",
        "v1alpha1",
        "ContentConfiguration",
        "contentconfigurations",
    )
}

fn entries() -> ApiResource {
    ar(
        "marketplace.platform-mesh.io",
        "v1alpha1",
        "MarketplaceEntry",
        "marketplaceentries",
    )
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("yaml")
}

fn obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("object")
}

/// The shared in-process server, with what these tests do with it.
struct Env(common::KubeEnv);

impl std::ops::Deref for Env {
    type Target = common::KubeEnv;

    fn deref(&self) -> &common::KubeEnv {
        &self.0
    }
}

impl Env {
    async fn start() -> Env {
        Env(common::KubeEnv::start().await)
    }

    async fn start_with(adjust: impl FnOnce(&mut apiserver::server::ServeOptions)) -> Env {
        Env(common::KubeEnv::start_with(adjust).await)
    }

    /// A client of view `view` for workspace `path` (a path or a logical-cluster name).
    fn view(&self, view: &str, path: &str) -> Client {
        self.client_at(&format!(
            "https://{}/services/{view}/clusters/{path}",
            self.server.address
        ))
    }

    /// The same as [`Env::view`], as user `name` (a client certificate from the server's CA).
    fn view_as(&self, view: &str, path: &str, name: &str) -> Client {
        let pki =
            certs::load_or_create(&self.dir.path().join("data").join("pki"), &[]).expect("pki");
        let (cert, key) = pki
            .issue_client_certificate(name, &[], 1)
            .expect("certificate");
        let mut c = self.config.clone();
        c.cluster_url = format!(
            "https://{}/services/{view}/clusters/{path}",
            self.server.address
        )
        .parse()
        .expect("url");
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        c.auth_info.client_certificate_data = Some(b64(&cert));
        c.auth_info.client_key_data = Some(b64(&key).into());
        Client::try_from(c).expect("client")
    }

    async fn create(&self, path: &str, r: &ApiResource, v: Value) -> DynamicObject {
        let api: Api<DynamicObject> = Api::all_with(self.client(path), r);
        api.create(&PostParams::default(), &obj(v))
            .await
            .unwrap_or_else(|e| panic!("create in {path}: {e}"))
    }

    async fn bind(&self, path: &str, name: &str, export_path: &str, export: &str) {
        let b = self
            .create(
                path,
                &ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
                json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
                       "metadata": {"name": name},
                       "spec": {"reference": {"export": {"path": export_path, "name": export}}}}),
            )
            .await;
        assert_eq!(b.data["status"]["phase"], "Bound", "{path} binds {export}");
    }

    /// A ContentConfiguration in `path` with `labels`, rendered (with a configurationResult)
    /// or not.
    async fn content(&self, path: &str, name: &str, labels: Value, rendered: bool) {
        self.create(
            path,
            &contents(),
            json!({"apiVersion": "ui.platform-mesh.io/v1alpha1", "kind": "ContentConfiguration",
                   "metadata": {"name": name, "labels": labels},
                   "spec": {"inlineConfiguration": {"contentType": "json", "content": "{}"}}}),
        )
        .await;
        if rendered {
            let api: Api<DynamicObject> = Api::all_with(self.client(path), &contents());
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"configurationResult": format!("{{\"name\":\"{name}\"}}")}}),
                ),
            )
            .await
            .expect("status");
        }
    }

    /// An APIExport in `path` offered by ProviderMetadata `provider`.
    async fn export(&self, path: &str, name: &str, provider: &str, schemas: &[&str]) {
        let mut x = yaml(WIDGET_EXPORT);
        x["metadata"]["name"] = json!(name);
        x["metadata"]["labels"] = json!({CONTENT_FOR: provider});
        x["spec"]["latestResourceSchemas"] = json!(schemas);
        self.create(
            path,
            &ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
            x,
        )
        .await;
    }
}

/// The core export in `root:platform-mesh-system`, bound there and in `bound` workspaces.
async fn core(env: &Env, bound: &[&str]) {
    let system = "root:platform-mesh-system";
    for schema in [CONTENT_SCHEMA, PROVIDER_SCHEMA] {
        env.create(
            system,
            &ar(
                "apis.kcp.io",
                "v1alpha1",
                "APIResourceSchema",
                "apiresourceschemas",
            ),
            yaml(schema),
        )
        .await;
    }
    env.create(
        system,
        &ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
        json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExport",
               "metadata": {"name": "core.platform-mesh.io"},
               "spec": {"latestResourceSchemas": [
                   "v1alpha1.contentconfigurations.ui.platform-mesh.io",
                   "v1alpha1.providermetadatas.ui.platform-mesh.io"]}}),
    )
    .await;
    for ws in std::iter::once(&system).chain(bound) {
        env.bind(ws, "core", system, "core.platform-mesh.io").await;
    }
}

/// The world of these tests: the core export in `root:platform-mesh-system`, an organization
/// `acme` with an account `team`, a provider `widgets` offering the Widget API with content for
/// organizations and accounts, and content of each kind in each place.
async fn world() -> Env {
    let env = Env::start().await;
    let system = "root:platform-mesh-system";
    env.workspace("root:orgs", "acme", "organization").await;
    env.workspace("root:orgs:acme", "team", "account").await;
    env.workspace("root:orgs", "lonely", "organization").await;
    env.workspace("root:providers", "widgets", "provider").await;
    core(
        &env,
        &[
            "root:orgs:acme",
            "root:orgs:acme:team",
            "root:providers:widgets",
        ],
    )
    .await;

    // The platform's own content, for organizations and for accounts.
    env.content(system, "main-home", json!({ENTITY: "main"}), true)
        .await;
    env.content(
        system,
        "account-home",
        json!({ENTITY: "core_platform-mesh_io_account"}),
        true,
    )
    .await;
    env.content(system, "main-draft", json!({ENTITY: "main"}), false)
        .await;

    // The provider: its metadata, the Widget API, and content for those who bind it.
    let provider = "root:providers:widgets";
    env.create(
        provider,
        &ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
        yaml(WIDGET_SCHEMA),
    )
    .await;
    env.create(
        provider,
        &ar(
            "ui.platform-mesh.io",
            "v1alpha1",
            "ProviderMetadata",
            "providermetadatas",
        ),
        json!({"apiVersion": "ui.platform-mesh.io/v1alpha1", "kind": "ProviderMetadata",
               "metadata": {"name": "widgets"},
               "spec": {"displayName": "Widgets Inc.", "description": "Widgets for everyone"}}),
    )
    .await;
    env.export(
        provider,
        WIDGETS,
        "widgets",
        &["v1.widgets.example.platform-mesh.io"],
    )
    .await;
    // An export with no schema yet is not offered.
    env.export(provider, "gadgets.example.platform-mesh.io", "widgets", &[])
        .await;
    env.content(
        provider,
        "widgets-org",
        json!({CONTENT_FOR: WIDGETS, ENTITY: "main"}),
        true,
    )
    .await;
    env.content(
        provider,
        "widgets-account",
        json!({CONTENT_FOR: WIDGETS, ENTITY: "core_platform-mesh_io_account"}),
        true,
    )
    .await;
    env.content(
        provider,
        "widgets-other-export",
        json!({CONTENT_FOR: "other.example.io", ENTITY: "main"}),
        true,
    )
    .await;

    // The organization's own content: rendered, not rendered, and content for an export.
    let acme = "root:orgs:acme";
    env.content(acme, "acme-page", json!({}), true).await;
    env.content(acme, "acme-unrendered", json!({}), false).await;
    env.content(acme, "acme-for-export", json!({CONTENT_FOR: WIDGETS}), true)
        .await;
    // The organization binds the Widget API; the account does not.
    env.bind(acme, "widgets", provider, WIDGETS).await;
    env
}

async fn names(client: Client, r: &ApiResource, params: &ListParams) -> Vec<String> {
    let api: Api<DynamicObject> = Api::all_with(client, r);
    let mut names: Vec<String> = api
        .list(params)
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_configurations_follow_upstreams_rules_for_organizations_and_accounts() {
    let env = world().await;
    let all = ListParams::default();
    // An organization: its own rendered content without content-for, the bound export's content
    // for organizations, and the platform's content for organizations; nothing unrendered.
    let acme = names(
        env.view("contentconfigurations", "root:orgs:acme"),
        &contents(),
        &all,
    )
    .await;
    assert_eq!(acme, ["acme-page", "main-home", "widgets-org"]);
    // An account below it: the entity type is the account's, and it bound nothing.
    let team = names(
        env.view("contentconfigurations", "root:orgs:acme:team"),
        &contents(),
        &all,
    )
    .await;
    assert_eq!(team, ["account-home"]);
    // Selectors apply to the computed list as to any list.
    let selected = names(
        env.view("contentconfigurations", "root:orgs:acme"),
        &contents(),
        &ListParams::default().labels(&format!("{ENTITY}=main")),
    )
    .await;
    assert_eq!(selected, ["main-home", "widgets-org"]);
    let by_field = names(
        env.view("contentconfigurations", "root:orgs:acme"),
        &contents(),
        &ListParams::default().fields("metadata.name=acme-page"),
    )
    .await;
    assert_eq!(by_field, ["acme-page"]);
    // limit/continue pages through the same view.
    let api: Api<DynamicObject> = Api::all_with(
        env.view("contentconfigurations", "root:orgs:acme"),
        &contents(),
    );
    let first = api
        .list(&ListParams::default().limit(2))
        .await
        .expect("page");
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("continue");
    let rest = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(rest.items.len(), 1);
    // GET answers from the view: the export's content is there, the unrendered one is not.
    let got = api.get("widgets-org").await.expect("get");
    assert_eq!(
        got.data["status"]["configurationResult"],
        "{\"name\":\"widgets-org\"}"
    );
    let missing = api
        .get("acme-unrendered")
        .await
        .expect_err("not in the view");
    assert!(
        matches!(missing, kube::Error::Api(ref s) if s.code == 404),
        "{missing}"
    );
    // The view answers by logical-cluster name as by path.
    let cluster = env.client("root:orgs");
    let ws: Api<DynamicObject> = Api::all_with(
        cluster,
        &ar("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces"),
    );
    let name = ws.get("acme").await.expect("acme").data["spec"]["cluster"]
        .as_str()
        .expect("cluster")
        .to_string();
    let by_name = names(env.view("contentconfigurations", &name), &contents(), &all).await;
    assert_eq!(by_name, acme);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_marketplace_offers_each_export_of_a_provider_and_tells_whether_it_is_installed() {
    let env = world().await;
    let acme: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:acme"), &entries());
    let listed = acme.list(&ListParams::default()).await.expect("list");
    let entry_names: Vec<_> = listed
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    // The export without schemas is not offered.
    assert_eq!(entry_names, [format!("{WIDGETS}-widgets")]);
    let entry = &listed.items[0];
    assert_eq!(
        entry.data["spec"]["apiBindingName"], "widgets",
        "acme bound it"
    );
    assert_eq!(
        entry.data["spec"]["providerMetadata"]["spec"]["displayName"],
        "Widgets Inc."
    );
    assert_eq!(entry.data["spec"]["apiExport"]["metadata"]["name"], WIDGETS);
    assert!(entry.data["spec"]["apiExport"]["metadata"]
        .get("managedFields")
        .is_none());
    // The account sees the same offer, not installed there.
    let team: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:acme:team"), &entries());
    let got = team
        .get(&format!("{WIDGETS}-widgets"))
        .await
        .expect("get by name");
    assert!(got.data["spec"].get("apiBindingName").is_none(), "{got:?}");
    // A second export offered by the same provider is one more entry.
    env.export(
        "root:providers:widgets",
        "sprockets.example.platform-mesh.io",
        "widgets",
        &["v1.widgets.example.platform-mesh.io"],
    )
    .await;
    let after = names(
        env.view("marketplace", "root:orgs:acme"),
        &entries(),
        &ListParams::default(),
    )
    .await;
    assert_eq!(
        after,
        [
            "sprockets.example.platform-mesh.io-widgets".to_string(),
            format!("{WIDGETS}-widgets")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_an_offer_appear_and_become_installed() {
    let env = world().await;
    let api: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:acme:team"), &entries());
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.clone().expect("rv");
    let mut events = api
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .expect("watch")
        .boxed();
    env.export(
        "root:providers:widgets",
        "sprockets.example.platform-mesh.io",
        "widgets",
        &["v1.widgets.example.platform-mesh.io"],
    )
    .await;
    let added = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event in time")
        .expect("event")
        .expect("open");
    let WatchEvent::Added(o) = added else {
        panic!("expected ADDED, got {added:?}");
    };
    assert_eq!(
        o.metadata.name.as_deref(),
        Some("sprockets.example.platform-mesh.io-widgets")
    );
    // The account binds the Widget API: its entry is modified to name the binding.
    env.bind(
        "root:orgs:acme:team",
        "my-widgets",
        "root:providers:widgets",
        WIDGETS,
    )
    .await;
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .expect("an event in time")
            .expect("event")
            .expect("open");
        if let WatchEvent::Modified(o) = e {
            assert_eq!(
                o.metadata.name.as_deref(),
                Some(&*format!("{WIDGETS}-widgets"))
            );
            assert_eq!(o.data["spec"]["apiBindingName"], "my-widgets");
            break;
        }
    }
    // A watch from the list's resourceVersion replays what happened since, computed at each step.
    let mut replay = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch again")
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(10), replay.try_next())
        .await
        .expect("in time")
        .expect("event")
        .expect("open");
    assert!(matches!(first, WatchEvent::Added(_)), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_users_and_unfit_workspaces_get_clear_statuses() {
    let env = world().await;
    let status = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not a Status: {other}"),
    };
    // A user who may not read the workspace's sources sees nothing, not even whether it exists.
    for view in ["contentconfigurations", "marketplace"] {
        let r = if view == "marketplace" {
            entries()
        } else {
            contents()
        };
        let api: Api<DynamicObject> =
            Api::all_with(env.view_as(view, "root:orgs:acme", "mallory"), &r);
        let (code, _) = status(
            api.list(&ListParams::default())
                .await
                .expect_err("forbidden"),
        );
        assert_eq!(code, 403, "{view}");
    }
    // Root has no parent to decide the entity type.
    let api: Api<DynamicObject> =
        Api::all_with(env.view("contentconfigurations", "root"), &contents());
    let (code, message) = status(api.list(&ListParams::default()).await.expect_err("root"));
    assert_eq!(code, 400, "{message}");
    assert!(message.contains("no parent"), "{message}");
    // A workspace without the core binding.
    let api: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:lonely"), &entries());
    let (code, message) = status(api.list(&ListParams::default()).await.expect_err("lonely"));
    assert_eq!(code, 404, "{message}");
    assert!(message.contains("core.platform-mesh.io"), "{message}");
    // Views are read-only, for one workspace at a time.
    let api: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:acme"), &entries());
    let e = api
        .create(
            &PostParams::default(),
            &obj(
                json!({"apiVersion": "marketplace.platform-mesh.io/v1alpha1",
                        "kind": "MarketplaceEntry", "metadata": {"name": "x"}}),
            ),
        )
        .await
        .expect_err("read-only");
    assert_eq!(status(e).0, 405);
    let api: Api<DynamicObject> = Api::all_with(env.view("marketplace", "*"), &entries());
    let (code, _) = status(
        api.list(&ListParams::default())
            .await
            .expect_err("wildcard"),
    );
    assert_eq!(code, 400);
    // An unknown path is refused as kcp's front proxy refuses it.
    let api: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:nowhere"), &entries());
    let (code, _) = status(api.list(&ListParams::default()).await.expect_err("nowhere"));
    assert_eq!(code, 403);
}

fn kubectl_sees_both_views(version: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let env = runtime.block_on(world());
    let bin = common::kubectl_binary(version)
        .unwrap_or_else(|| panic!("kubectl.{version} beside the kubectl on PATH"));
    let kubectl = common::Kubectl::new(bin, &env.server.kubeconfig);
    let base = format!("https://{}", env.server.address);
    let market = format!("{base}/services/marketplace/clusters/root:orgs:acme");
    let table = kubectl.ok(&["--server", &market, "get", "marketplaceentries"]);
    assert!(table.contains("Widgets Inc."), "{table}");
    assert!(table.contains("widgets"), "{table}");
    let one = kubectl.ok(&[
        "--server",
        &market,
        "get",
        "marketplaceentry",
        &format!("{WIDGETS}-widgets"),
        "-o",
        "jsonpath={.spec.apiBindingName}",
    ]);
    assert_eq!(one, "widgets");
    let content = format!("{base}/services/contentconfigurations/clusters/root:orgs:acme");
    let names = kubectl.ok(&[
        "--server",
        &content,
        "get",
        "contentconfigurations",
        "-o",
        "name",
    ]);
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        [
            "contentconfiguration.ui.platform-mesh.io/acme-page",
            "contentconfiguration.ui.platform-mesh.io/main-home",
            "contentconfiguration.ui.platform-mesh.io/widgets-org",
        ]
    );
    let resources = kubectl.ok(&["--server", &content, "api-resources"]);
    assert!(resources.contains("contentconfigurations"), "{resources}");
    let explained = kubectl.ok(&["--server", &market, "explain", "marketplaceentries.spec"]);
    assert!(explained.contains("apiBindingName"), "{explained}");
    drop(env);
}

#[test]
fn kubectl_1_27_lists_gets_and_discovers_both_views() {
    kubectl_sees_both_views("1.27");
}

#[test]
fn kubectl_1_33_lists_gets_and_discovers_both_views() {
    kubectl_sees_both_views("1.33");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_views_follow_upstreams_flags() {
    let env = Env::start_with(|o| {
        o.views.entity_label = "example.io/for".into();
        o.views.main_entity = "org".into();
    })
    .await;
    env.workspace("root:orgs", "acme", "organization").await;
    core(&env, &["root:orgs:acme"]).await;
    let system = "root:platform-mesh-system";
    env.content(system, "org-home", json!({"example.io/for": "org"}), true)
        .await;
    env.content(system, "main-home", json!({ENTITY: "main"}), true)
        .await;
    let got = names(
        env.view("contentconfigurations", "root:orgs:acme"),
        &contents(),
        &ListParams::default(),
    )
    .await;
    assert_eq!(
        got,
        ["org-home"],
        "the entity label and name come from the flags"
    );
}
