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
    world_with(|_| {}).await
}

/// [`world`] on a server with adjusted options.
async fn world_with(adjust: impl FnOnce(&mut apiserver::server::ServeOptions)) -> Env {
    let env = Env::start_with(adjust).await;
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

/// Watches the marketplace of `api` from a fresh list, publishes a second Widget export and
/// waits for its entry's ADDED event; returns the list's resourceVersion and the open watch.
async fn an_offer_appears(
    env: &Env,
    api: &Api<DynamicObject>,
) -> (
    String,
    futures::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>,
) {
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
    (rv, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_an_offer_appear_and_become_installed() {
    let env = world().await;
    let api: Api<DynamicObject> =
        Api::all_with(env.view("marketplace", "root:orgs:acme:team"), &entries());
    let (rv, mut events) = an_offer_appears(&env, &api).await;
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

/// kubectl lists, gets, discovers and explains both views at `market` and `content` (the
/// views of `root:orgs:acme` of [`world`]).
fn kubectl_reads_both_views(kubectl: &common::Kubectl, market: &str, content: &str) {
    let table = kubectl.ok(&["--server", market, "get", "marketplaceentries"]);
    assert!(table.contains("Widgets Inc."), "{table}");
    assert!(table.contains("widgets"), "{table}");
    let one = kubectl.ok(&[
        "--server",
        market,
        "get",
        "marketplaceentry",
        &format!("{WIDGETS}-widgets"),
        "-o",
        "jsonpath={.spec.apiBindingName}",
    ]);
    assert_eq!(one, "widgets");
    let names = kubectl.ok(&[
        "--server",
        content,
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
    let resources = kubectl.ok(&["--server", content, "api-resources"]);
    assert!(resources.contains("contentconfigurations"), "{resources}");
    let explained = kubectl.ok(&["--server", market, "explain", "marketplaceentries.spec"]);
    assert!(explained.contains("apiBindingName"), "{explained}");
}

fn kubectl_sees_both_views(version: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let env = runtime.block_on(world());
    let bin = common::kubectl_binary(version)
        .unwrap_or_else(|| panic!("kubectl.{version} beside the kubectl on PATH"));
    let kubectl = common::Kubectl::new(bin, &env.server.kubeconfig);
    let base = format!("https://{}", env.server.address);
    kubectl_reads_both_views(
        &kubectl,
        &format!("{base}/services/marketplace/clusters/root:orgs:acme"),
        &format!("{base}/services/contentconfigurations/clusters/root:orgs:acme"),
    );
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

// Extension mode: `platform-mesh virtual-workspaces` in front of a server it does not own (here
// `serve`, playing kcp), reading it through the core export's endpoint slice, with kcp's
// workspaces, tokens and permissions.

/// A running `platform-mesh virtual-workspaces`, trusting the fronted server's client CA.
struct Extension {
    process: common::VirtualWorkspaces,
    /// The extension's own CA (it serves with a certificate of it).
    ca_pem: String,
    /// The fronted server's admin certificate and key, accepted by the extension too.
    admin: (String, String),
    _dir: tempfile::TempDir,
}

impl Extension {
    fn start(env: &Env) -> Extension {
        Extension::start_with(env, &[])
    }

    fn start_with(env: &Env, extra: &[&str]) -> Extension {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = env.dir.path().join("data").join("pki");
        let ca = pki.join("ca.crt");
        let mut flags = vec!["--client-ca-file", ca.to_str().expect("path")];
        flags.extend_from_slice(extra);
        let process = common::start_virtual_workspaces(
            &env.server.kubeconfig,
            &dir.path().join("data"),
            &flags,
        );
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).expect("pki file");
        Extension {
            process,
            ca_pem: read(dir.path().join("data").join("pki").join("ca.crt")),
            admin: (read(pki.join("admin.crt")), read(pki.join("admin.key"))),
            _dir: dir,
        }
    }

    fn url(&self, view: &str, path: &str) -> String {
        format!(
            "https://{}/services/{view}/clusters/{path}",
            self.process.address
        )
    }

    /// A kubeconfig for `url`: the extension's CA, and a client certificate or a token.
    fn kubeconfig(&self, url: &str, user: Value) -> kube::config::Kubeconfig {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "x", "cluster": {"server": url,
                "certificate-authority-data": b64(&self.ca_pem)}}],
            "users": [{"name": "x", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        }))
        .expect("kubeconfig")
    }

    fn admin_user(&self) -> Value {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        json!({"client-certificate-data": b64(&self.admin.0),
               "client-key-data": b64(&self.admin.1)})
    }

    async fn client_with(&self, url: &str, user: Value) -> Client {
        let config =
            kube::Config::from_custom_kubeconfig(self.kubeconfig(url, user), &Default::default())
                .await
                .expect("config");
        Client::try_from(config).expect("client")
    }

    /// The fronted server's admin, through the extension.
    async fn view(&self, view: &str, path: &str) -> Client {
        self.client_with(&self.url(view, path), self.admin_user())
            .await
    }
}

/// What a view answers, comparable across servers: the items (without resourceVersions and
/// managed fields, which are each server's own) or the error's code.
async fn answer(client: Client, r: &ApiResource, params: &ListParams) -> Result<Vec<Value>, u16> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("resourceVersion");
                m.remove("managedFields");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let api: Api<DynamicObject> = Api::all_with(client, r);
    match api.list(params).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .map(|o| {
                let mut v = serde_json::to_value(o).expect("json");
                strip(&mut v);
                v
            })
            .collect()),
        Err(kube::Error::Api(s)) => Err(s.code),
        Err(e) => panic!("not a Status: {e}"),
    }
}

/// Waits until the extension answers `view` for `path` as the server itself does.
async fn same_answers(env: &Env, ext: &Extension, view: &str, path: &str, params: &ListParams) {
    let r = if view == "marketplace" {
        entries()
    } else {
        contents()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let want = answer(env.view(view, path), &r, params).await;
        let got = answer(ext.view(view, path).await, &r, params).await;
        if got == want {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{view} of {path} ({params:?}) differs:\nserve:     {}\nextension: {}",
                serde_json::to_string(&want.ok()).unwrap_or_default(),
                serde_json::to_string(&got).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_mode_serves_the_same_answers_over_a_server_it_does_not_own() {
    let tokens = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(tokens.path(), "dora-token,dora,dora-uid\n").expect("write tokens");
    let token_file = tokens.path().to_path_buf();
    let env = world_with(|o| o.token_auth_file = Some(token_file)).await;
    let ext = Extension::start(&env);
    let acme_name = {
        let ws: Api<DynamicObject> = Api::all_with(
            env.client("root:orgs"),
            &ar("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces"),
        );
        ws.get("acme").await.expect("acme").data["spec"]["cluster"]
            .as_str()
            .expect("cluster")
            .to_string()
    };
    let all = ListParams::default();
    // Every rule, by path and by name, and every clear error, answer alike.
    for view in ["contentconfigurations", "marketplace"] {
        for path in [
            "root:orgs:acme",
            acme_name.as_str(),
            "root:orgs:acme:team",
            "root:orgs:lonely",
            "root",
            "root:orgs:nowhere",
        ] {
            same_answers(&env, &ext, view, path, &all).await;
        }
    }
    for params in [
        ListParams::default().labels(&format!("{ENTITY}=main")),
        ListParams::default().fields("metadata.name=acme-page"),
    ] {
        same_answers(
            &env,
            &ext,
            "contentconfigurations",
            "root:orgs:acme",
            &params,
        )
        .await;
    }
    // GET by name answers from the view there too.
    let api: Api<DynamicObject> =
        Api::all_with(ext.view("marketplace", "root:orgs:acme").await, &entries());
    let entry = api.get(&format!("{WIDGETS}-widgets")).await.expect("get");
    assert_eq!(entry.data["spec"]["apiBindingName"], "widgets");

    // A watch through the extension sees an offer appear when a provider publishes an export.
    let team: Api<DynamicObject> = Api::all_with(
        ext.view("marketplace", "root:orgs:acme:team").await,
        &entries(),
    );
    let _watch = an_offer_appears(&env, &team).await;
    // Binding it and withdrawing content follow too.
    env.bind(
        "root:orgs:acme:team",
        "my-widgets",
        "root:providers:widgets",
        WIDGETS,
    )
    .await;
    let api: Api<DynamicObject> = Api::all_with(env.client("root:orgs:acme"), &contents());
    api.delete("acme-page", &Default::default())
        .await
        .expect("delete");
    for view in ["contentconfigurations", "marketplace"] {
        for path in ["root:orgs:acme", "root:orgs:acme:team"] {
            same_answers(&env, &ext, view, path, &all).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_mode_takes_its_users_and_permissions_from_the_fronted_server() {
    let tokens = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(tokens.path(), "dora-token,dora,dora-uid\n").expect("write tokens");
    let token_file = tokens.path().to_path_buf();
    let env = world_with(|o| o.token_auth_file = Some(token_file)).await;
    // dora may list ContentConfigurations in acme, nothing else.
    let rbac = |kind: &str, plural: &str| ar("rbac.authorization.k8s.io", "v1", kind, plural);
    env.create(
        "root:orgs:acme",
        &rbac("ClusterRole", "clusterroles"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "content-reader"},
               "rules": [{"apiGroups": ["ui.platform-mesh.io"],
                          "resources": ["contentconfigurations"],
                          "verbs": ["list", "watch"]}]}),
    )
    .await;
    env.create(
        "root:orgs:acme",
        &rbac("ClusterRoleBinding", "clusterrolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "dora"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "content-reader"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": "dora"}]}),
    )
    .await;
    // kcp's front proxy: a client certificate of its own CA, the user in X-Remote-* headers.
    let proxy_dir = tempfile::tempdir().expect("tempdir");
    let proxy = certs::load_or_create(proxy_dir.path(), &[]).expect("front-proxy CA");
    let proxy_ca = proxy_dir.path().join("ca.crt");
    let ext = Extension::start_with(
        &env,
        &[
            "--requestheader-client-ca-file",
            proxy_ca.to_str().expect("path"),
            "--requestheader-allowed-names",
            "front-proxy",
        ],
    );
    let all = ListParams::default();
    same_answers(&env, &ext, "contentconfigurations", "root:orgs:acme", &all).await;
    let (proxy_cert, proxy_key) = proxy
        .issue_client_certificate("front-proxy", &[], 1)
        .expect("proxy certificate");
    for (user, want) in [("dora", 200), ("mallory", 403)] {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut config = kube::Config::from_custom_kubeconfig(
            ext.kubeconfig(
                &ext.url("contentconfigurations", "root:orgs:acme"),
                json!({"client-certificate-data": b64(&proxy_cert),
                       "client-key-data": b64(&proxy_key)}),
            ),
            &Default::default(),
        )
        .await
        .expect("config");
        config.headers = vec![
            (
                "x-remote-user".parse().expect("name"),
                user.parse().expect("value"),
            ),
            (
                "x-remote-group".parse().expect("name"),
                "system:authenticated".parse().expect("value"),
            ),
        ];
        let got = answer(Client::try_from(config).expect("client"), &contents(), &all).await;
        assert_eq!(
            got.err().unwrap_or(200),
            want,
            "{user} through the front proxy"
        );
    }
    let dora = json!({"token": "dora-token"});
    let code = |r: Result<Vec<Value>, u16>| r.err().unwrap_or(200);
    // A token the fronted server accepts, with its permissions there.
    let got = answer(
        ext.client_with(
            &ext.url("contentconfigurations", "root:orgs:acme"),
            dora.clone(),
        )
        .await,
        &contents(),
        &all,
    )
    .await;
    assert_eq!(
        got.map(|items| items.len()),
        Ok(3),
        "dora reads acme's content"
    );
    for (view, path) in [
        ("marketplace", "root:orgs:acme"),
        ("contentconfigurations", "root:orgs:acme:team"),
        ("contentconfigurations", "root:orgs:nowhere"),
    ] {
        let r = if view == "marketplace" {
            entries()
        } else {
            contents()
        };
        let got = answer(
            ext.client_with(&ext.url(view, path), dora.clone()).await,
            &r,
            &all,
        )
        .await;
        assert_eq!(code(got), 403, "dora in {view} of {path}");
    }
    // A token it does not accept; a certificate of a user without permissions.
    let got = answer(
        ext.client_with(
            &ext.url("contentconfigurations", "root:orgs:acme"),
            json!({"token": "guessed"}),
        )
        .await,
        &contents(),
        &all,
    )
    .await;
    assert_eq!(code(got), 401);
    let pki = certs::load_or_create(&env.dir.path().join("data").join("pki"), &[]).expect("pki");
    let (cert, key) = pki
        .issue_client_certificate("mallory", &[], 1)
        .expect("certificate");
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mallory = json!({"client-certificate-data": b64(&cert), "client-key-data": b64(&key)});
    for view in ["contentconfigurations", "marketplace"] {
        let r = if view == "marketplace" {
            entries()
        } else {
            contents()
        };
        let got = answer(
            ext.client_with(&ext.url(view, "root:orgs:acme"), mallory.clone())
                .await,
            &r,
            &all,
        )
        .await;
        assert_eq!(code(got), 403, "mallory in {view}");
    }
    // The extension serves the views and nothing else.
    let plain = ext
        .client_with(
            &format!("https://{}/clusters/root:orgs:acme", ext.process.address),
            ext.admin_user(),
        )
        .await;
    let namespaces: Api<DynamicObject> =
        Api::all_with(plain, &ar("", "v1", "Namespace", "namespaces"));
    match namespaces.list(&all).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404, "{s:?}"),
        other => panic!("namespaces through the extension: {other:?}"),
    }
    // Nor the admission webhooks `serve` has.
    let webhook = ext
        .client_with(
            &format!("https://{}", ext.process.address),
            ext.admin_user(),
        )
        .await;
    let review = http::Request::post("/admission/validate")
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .expect("request");
    match webhook.request_text(review).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404, "{s:?}"),
        other => panic!("a webhook through the extension: {other:?}"),
    }
}

fn kubectl_sees_both_views_through_the_extension(version: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let env = runtime.block_on(world());
    let ext = Extension::start(&env);
    runtime.block_on(same_answers(
        &env,
        &ext,
        "marketplace",
        "root:orgs:acme",
        &ListParams::default(),
    ));
    let bin = common::kubectl_binary(version)
        .unwrap_or_else(|| panic!("kubectl.{version} beside the kubectl on PATH"));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let market = ext.url("marketplace", "root:orgs:acme");
    let config = ext.kubeconfig(&market, ext.admin_user());
    std::fs::write(&kubeconfig, serde_json::to_string(&config).expect("json")).expect("write");
    let kubectl = common::Kubectl::new(bin, &kubeconfig);
    kubectl_reads_both_views(
        &kubectl,
        &market,
        &ext.url("contentconfigurations", "root:orgs:acme"),
    );
    drop(ext);
    drop(env);
}

#[test]
fn kubectl_1_27_lists_and_gets_both_views_through_the_extension() {
    kubectl_sees_both_views_through_the_extension("1.27");
}

#[test]
fn kubectl_1_33_lists_and_gets_both_views_through_the_extension() {
    kubectl_sees_both_views_through_the_extension("1.33");
}
