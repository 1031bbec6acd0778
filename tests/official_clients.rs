//! The official client libraries against `platform-mesh serve`, as applications use them: what a
//! real client sends (which differs from what this project's own clients send) must work.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

/// Runs `program` of `tests/peers/<peer>` with `interpreter` (relative to that directory, or on
/// PATH) against a fresh server; returns its output. `installed` is what the peer's install puts
/// there (scripts/test installs it).
fn run_peer(peer: &str, interpreter: &str, installed: &str, program: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(peer);
    assert!(
        dir.join(installed).exists(),
        "the {peer} client is not installed in {} (scripts/test installs it)",
        dir.display()
    );
    let server = Server::start();
    let local = dir.join(interpreter);
    let interpreter = if local.exists() {
        local
    } else {
        PathBuf::from(interpreter)
    };
    common::stdout_of(
        Command::new(interpreter)
            .arg(program)
            .current_dir(&dir)
            .env("KUBECONFIG", &server.kubeconfig),
        program,
    )
}

#[test]
fn the_javascript_client_creates_reads_replaces_lists_watches_and_deletes() {
    let out = run_peer(
        "js",
        "node",
        "node_modules/@kubernetes/client-node",
        "configmaps.mjs",
    );
    let steps: Vec<&str> = out.lines().collect();
    assert_eq!(
        steps,
        [
            "ok create",
            "ok read-modify-replace",
            "ok list",
            "ok watch",
            "ok invalid",
            "ok delete"
        ],
        "{out}"
    );
}

#[test]
fn the_python_client_creates_reads_replaces_patches_lists_watches_unzips_and_deletes() {
    let out = run_peer(
        "python",
        ".venv/bin/python",
        ".venv/bin/python",
        "configmaps.py",
    );
    let steps: Vec<&str> = out.lines().collect();
    assert_eq!(
        steps,
        [
            "ok create",
            "ok read-modify-replace",
            "ok patch",
            "ok list",
            "ok watch",
            "ok gzip",
            "ok invalid",
            "ok delete"
        ],
        "{out}"
    );
}

/// The checks `tests/peers/go/clients` makes, in order.
const GO_CHECKS: [&str; 11] = [
    "ok namespace",
    "ok typed-crud",
    "ok typed-conflict",
    "ok typed-patches",
    "ok typed-list-pages",
    "ok dynamic",
    "ok informer",
    "ok watch-resume",
    "ok apply",
    "ok controller-runtime",
    "ok errors",
];

/// Runs the client-go / controller-runtime program with `kubeconfig`; returns its output lines.
fn run_go_clients(kubeconfig: &std::path::Path) -> Vec<String> {
    common::stdout_of(
        Command::new(common::kube_apiserver::peer_binary("go-clients"))
            .arg("--kubeconfig")
            .arg(kubeconfig),
        "go-clients",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

#[test]
fn client_go_and_controller_runtime_work_against_serve() {
    let server = Server::start();
    assert_eq!(run_go_clients(&server.kubeconfig), GO_CHECKS);
}

/// The control: the same program passes against the real kube-apiserver, so what it expects of
/// `serve` is what Kubernetes does.
#[test]
fn client_go_and_controller_runtime_checks_hold_against_kube_apiserver() {
    let kube = common::kube_apiserver::KubeApiserver::start();
    assert_eq!(run_go_clients(&kube.admin_kubeconfig), GO_CHECKS);
}

/// A Go controller as Platform Mesh's providers write theirs (multicluster-runtime with kcp's
/// multicluster-provider, `tests/peers/mcp`) against this server: it engages the workspaces
/// bound to an export through the export's virtual workspace and writes the status of each
/// Widget there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multicluster_runtime_controller_reconciles_in_every_bound_workspace() {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};
    let env = common::KubeEnv::start().await;
    let ar = |g: &str, v: &str, k: &str, p: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), p)
    };
    let create = |path: String, r: ApiResource, v: serde_json::Value| {
        let api: Api<DynamicObject> = Api::all_with(env.client(&path), &r);
        async move {
            let o: DynamicObject = serde_json::from_value(v).expect("object");
            api.create(&PostParams::default(), &o)
                .await
                .unwrap_or_else(|e| panic!("create in {path}: {e}"))
        }
    };
    let yaml = |t: &str| -> serde_json::Value { serde_saphyr::from_str(t).expect("yaml") };
    let provider = env.workspace("root:providers", "widgets", "provider").await;
    create(
        "root:providers:widgets".into(),
        ar(
            "apis.kcp.io",
            "v1alpha1",
            "APIResourceSchema",
            "apiresourceschemas",
        ),
        yaml(include_str!("../examples/workspaces/widget-schema.yaml")),
    )
    .await;
    create(
        "root:providers:widgets".into(),
        ar("apis.kcp.io", "v1alpha1", "APIExport", "apiexports"),
        yaml(include_str!("../examples/workspaces/widget-export.yaml")),
    )
    .await;
    let widgets = ar("example.platform-mesh.io", "v1", "Widget", "widgets");
    let mut consumers = Vec::new();
    for name in ["acme", "globex"] {
        let cluster = env.workspace("root:orgs", name, "organization").await;
        let path = format!("root:orgs:{name}");
        create(
            path.clone(),
            ar("apis.kcp.io", "v1alpha1", "APIBinding", "apibindings"),
            yaml(include_str!("../examples/workspaces/widget-binding.yaml")),
        )
        .await;
        let api: Api<DynamicObject> = Api::namespaced_with(env.client(&path), "default", &widgets);
        let w: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"color": "red"}}))
        .expect("widget");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Err(e) = api.create(&PostParams::default(), &w).await {
            assert!(
                std::time::Instant::now() < deadline,
                "a Widget in {path}: {e}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        consumers.push((path, cluster, api));
    }
    let vw = format!(
        "https://{}/services/apiexport/{provider}/widgets.example.platform-mesh.io",
        env.server.address
    );
    let mut controller = Command::new(common::kube_apiserver::peer_binary("mcp-widgets"))
        .arg("--server")
        .arg(&vw)
        .env("KUBECONFIG", &env.server.kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start mcp-widgets");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut pending: Vec<String> = Vec::new();
    loop {
        pending.clear();
        for (path, cluster, api) in &consumers {
            let w = api.get("w").await.expect("widget");
            let want = format!("multicluster-runtime/{cluster}");
            if w.data["status"]["observedBy"] != want.as_str() {
                pending.push(format!("{path}: {:?}", w.data["status"]));
            }
        }
        if pending.is_empty() || std::time::Instant::now() > deadline {
            break;
        }
        if let Ok(Some(status)) = controller.try_wait() {
            panic!("mcp-widgets exited ({status}); still {pending:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let _ = controller.kill();
    let _ = controller.wait();
    assert!(pending.is_empty(), "not reconciled: {pending:?}");
}
