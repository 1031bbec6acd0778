//! The Account and AccountInfo controllers against the server: organisations and nested
//! accounts get their workspace tree and AccountInfos, deletion removes the tree, and a
//! thousand accounts created at once all become Ready.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{eventually, TestServer};
use controllers::account::{
    account_infos, accounts, INFO_FINALIZER, WORKSPACE_FINALIZER, WORKSPACE_TYPE_FINALIZER,
};
use controllers::cluster_providers::kcp::{ApiExportOptions, ApiExportProvider, PathAware};
use controllers::kcp::Kcp;
use controllers::kcp::{workspace_types, workspaces};
use controllers::objects::condition_true;
use controllers::runtime::{Manager, ManagerOptions};

/// The server and the workspace controllers running against it.
pub(super) struct Env {
    pub ts: TestServer,
    pub kcp: Arc<Kcp>,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
}

impl Env {
    pub async fn start(workers: usize) -> Env {
        let ts = TestServer::start().await;
        let kcp = Arc::new(
            Kcp::from_kubeconfig(ts.kubeconfig_for("root"), None)
                .await
                .expect("kcp access"),
        );
        let manager = Manager::new(ManagerOptions::default());
        controllers::tenants::add(&manager, kcp.clone(), workers).unwrap();
        let provider = Arc::new(PathAware::new(ApiExportProvider::new(
            ts.root_config().await,
            ApiExportOptions::every_workspace(vec![ts.root_url()]),
        )));
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let stop = stop.clone();
            async move {
                manager
                    .run(provider, async move { stop.cancelled().await })
                    .await
                    .expect("manager runs");
            }
        });
        Env { ts, kcp, stop, run }
    }

    pub fn api(&self, path: &str, ar: &kube::api::ApiResource) -> Api<DynamicObject> {
        Api::all_with(self.kcp.workspace(path), ar)
    }

    pub fn api_ns(&self, path: &str, ns: &str, ar: &kube::api::ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.kcp.workspace(path), ns, ar)
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.run.await;
        self.ts.stop().await;
    }
}

fn account(name: &str, ty: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "core.platform-mesh.io/v1alpha1", "kind": "Account",
        "metadata": {"name": name},
        "spec": {"type": ty, "displayName": format!("The {name} account")},
    }))
    .expect("account")
}

async fn create_account(env: &Env, path: &str, name: &str, ty: &str) {
    env.api(path, &accounts())
        .create(&PostParams::default(), &account(name, ty))
        .await
        .unwrap_or_else(|e| panic!("create Account {path}:{name}: {e}"));
}

async fn ready(env: &Env, path: &str, name: &str) -> DynamicObject {
    let api = env.api(path, &accounts());
    let what = format!("Account {path}:{name} Ready");
    eventually(Duration::from_secs(20), &what, || {
        let api = api.clone();
        async move {
            api.get_opt(name)
                .await
                .unwrap_or_else(|e| panic!("reading Account {name}: {e}"))
                .is_some_and(|a| condition_true(&a.data, "Ready"))
        }
    })
    .await;
    api.get(name).await.expect("account")
}

async fn cluster_of(env: &Env, parent: &str, name: &str) -> String {
    let ws = env
        .api(parent, &workspaces())
        .get(name)
        .await
        .expect("workspace");
    ws.data["spec"]["cluster"]
        .as_str()
        .expect("cluster")
        .to_string()
}

fn location(name: &str, generated: &str, origin: &str, path: &str, ty: &str, base: &str) -> Value {
    json!({"name": name, "generatedClusterId": generated, "originClusterId": origin,
           "path": path, "url": format!("{base}/clusters/{path}"), "type": ty})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn organisations_and_accounts_get_their_workspace_tree_and_lose_it_on_delete() {
    let env = Env::start(4).await;
    let base = env.ts.root_url();

    // An organisation in root:orgs.
    create_account(&env, "root:orgs", "acme", "org").await;
    let acme = ready(&env, "root:orgs", "acme").await;
    for c in [
        "WorkspaceTypeSubroutine",
        "WorkspaceSubroutine",
        "ManageAccountInfoSubroutine",
        "WorkspaceReadySubroutine",
        "Ready",
    ] {
        assert!(
            condition_true(&acme.data, c),
            "{c}: {:?}",
            acme.data["status"]
        );
    }
    assert_eq!(
        acme.metadata.finalizers.clone().unwrap_or_default(),
        vec![WORKSPACE_TYPE_FINALIZER, WORKSPACE_FINALIZER]
    );
    let ws = env
        .api("root:orgs", &workspaces())
        .get("acme")
        .await
        .unwrap();
    assert_eq!(
        ws.data["spec"]["type"],
        json!({"name": "acme-org", "path": "root:orgs"})
    );
    let owner = &ws.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Account", "acme")
    );
    assert_eq!(owner.uid, acme.metadata.uid.clone().unwrap());
    for t in ["acme-org", "acme-account"] {
        let wst = env
            .api("root:orgs", &workspace_types())
            .get(t)
            .await
            .unwrap();
        assert_eq!(
            wst.metadata.labels.clone().unwrap()["core.platform-mesh.io/org"],
            "acme"
        );
    }
    let orgs = cluster_of(&env, "root", "orgs").await;
    let acme_cluster = cluster_of(&env, "root:orgs", "acme").await;
    let info = env
        .api("root:orgs:acme", &account_infos())
        .get("account")
        .await
        .unwrap();
    let acme_at = location("acme", &acme_cluster, &orgs, "root:orgs:acme", "org", &base);
    assert_eq!(info.data["spec"]["account"], acme_at);
    assert_eq!(info.data["spec"]["organization"], acme_at);
    assert!(info.data["spec"].get("parentAccount").is_none());
    assert_eq!(info.data["spec"]["fga"], json!({"store": {"id": ""}}));
    assert_eq!(
        info.data["spec"]["clusterInfo"]["ca"],
        env.kcp.ca_pem.as_str()
    );
    assert!(env.kcp.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    eventually(Duration::from_secs(10), "AccountInfo finalizer", || {
        let api = env.api("root:orgs:acme", &account_infos());
        async move {
            api.get("account").await.is_ok_and(|i| {
                i.metadata.finalizers.unwrap_or_default() == vec![INFO_FINALIZER.to_string()]
            })
        }
    })
    .await;

    // Others write the organisation's FGA store; accounts below inherit it.
    let mut info = env
        .api("root:orgs:acme", &account_infos())
        .get("account")
        .await
        .unwrap();
    info.data["spec"]["fga"]["store"]["id"] = json!("01JSTORE");
    env.api("root:orgs:acme", &account_infos())
        .replace("account", &PostParams::default(), &info)
        .await
        .unwrap();

    // An account in the organisation, and one inside that.
    create_account(&env, "root:orgs:acme", "team", "account").await;
    let team = ready(&env, "root:orgs:acme", "team").await;
    assert_eq!(
        team.metadata.finalizers.clone().unwrap_or_default(),
        vec![WORKSPACE_FINALIZER]
    );
    let ws = env
        .api("root:orgs:acme", &workspaces())
        .get("team")
        .await
        .unwrap();
    assert_eq!(
        ws.data["spec"]["type"],
        json!({"name": "acme-account", "path": "root:orgs"})
    );
    create_account(&env, "root:orgs:acme:team", "dev", "account").await;
    ready(&env, "root:orgs:acme:team", "dev").await;
    let team_cluster = cluster_of(&env, "root:orgs:acme", "team").await;
    let dev_cluster = cluster_of(&env, "root:orgs:acme:team", "dev").await;
    let team_at = location(
        "team",
        &team_cluster,
        &acme_cluster,
        "root:orgs:acme:team",
        "account",
        &base,
    );
    let dev = env
        .api("root:orgs:acme:team:dev", &account_infos())
        .get("account")
        .await
        .unwrap();
    assert_eq!(
        dev.data["spec"],
        json!({
            "account": location("dev", &dev_cluster, &team_cluster, "root:orgs:acme:team:dev", "account", &base),
            "parentAccount": team_at,
            "organization": acme_at,
            "fga": {"store": {"id": "01JSTORE"}},
            "clusterInfo": {"ca": env.kcp.ca_pem},
        })
    );

    // The server refuses what upstream's account webhook refuses.
    for (path, name, ty) in [
        ("root:orgs", "ab", "org"),
        ("root:orgs:acme", "x", "folder"),
    ] {
        match env
            .api(path, &accounts())
            .create(&PostParams::default(), &account(name, ty))
            .await
        {
            Err(kube::Error::Api(s)) => assert!(s.code == 422 || s.code == 403, "{s:?}"),
            other => panic!("{name}: {other:?}"),
        }
    }

    // Deleting an account removes its workspace, then the Account.
    env.api("root:orgs:acme:team", &accounts())
        .delete("dev", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "dev and its workspace gone",
        || {
            let (a, w) = (
                env.api("root:orgs:acme:team", &accounts()),
                env.api("root:orgs:acme:team", &workspaces()),
            );
            async move {
                matches!(a.get_opt("dev").await, Ok(None))
                    && matches!(w.get_opt("dev").await, Ok(None))
            }
        },
    )
    .await;

    // Deleting the organisation removes the whole tree and its workspace types.
    env.api("root:orgs", &accounts())
        .delete("acme", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "acme, its tree and types gone",
        || {
            let (a, w, t) = (
                env.api("root:orgs", &accounts()),
                env.api("root:orgs", &workspaces()),
                env.api("root:orgs", &workspace_types()),
            );
            async move {
                matches!(a.get_opt("acme").await, Ok(None))
                    && matches!(w.get_opt("acme").await, Ok(None))
                    && matches!(t.get_opt("acme-org").await, Ok(None))
                    && matches!(t.get_opt("acme-account").await, Ok(None))
            }
        },
    )
    .await;
    match env
        .api("root:orgs:acme:team", &accounts())
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the nested workspace is still reachable: {other:?}"),
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_accounts_created_at_once_all_become_ready() {
    const N: usize = 1000;
    let env = Env::start(16).await;
    create_account(&env, "root:orgs", "bulk", "org").await;
    ready(&env, "root:orgs", "bulk").await;

    let api = env.api("root:orgs:bulk", &accounts());
    let started = Instant::now();
    let mut creates = futures::stream::FuturesUnordered::new();
    for i in 0..N {
        let api = api.clone();
        creates.push(async move {
            api.create(
                &PostParams::default(),
                &account(&format!("a{i:04}"), "account"),
            )
            .await
            .map(|_| ())
        });
        if creates.len() >= 32 {
            use futures::StreamExt;
            creates.next().await.expect("one").expect("create");
        }
    }
    use futures::StreamExt;
    while let Some(r) = creates.next().await {
        r.expect("create");
    }
    let created = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = api.list(&Default::default()).await.expect("list");
        let done = list
            .items
            .iter()
            .filter(|a| condition_true(&a.data, "Ready"))
            .count();
        if done == N {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {N} Ready after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    println!(
        "{N} Accounts: created in {:.1} s, all Ready {:.1} s after the first create (target < 30 s)",
        created.as_secs_f64(),
        took.as_secs_f64()
    );
    env.stop().await;
}
