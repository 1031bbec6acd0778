//! Attacks a tenant can make with what it may write: objects, annotations, patches, watches,
//! lists and connections. Four static-token users: alice (everything in namespace `default` of
//! workspace A), carol (admin of all of A, as an organisation owner is), bob (admin of B) and
//! eve (no bindings at all). A = `root:a`, B = `root:b`. Each attack is refused or bounded, and
//! variations of it are tried too.

use super::*;

const TOKENS: &str = "alice-token,alice,alice-uid,\"tenants\"
carol-token,carol,carol-uid,\"tenants\"
bob-token,bob,bob-uid,\"tenants\"
eve-token,eve,eve-uid,\"tenants\"
";

const EXPORT: &str = "widgets.example.platform-mesh.io";

struct Tenants {
    env: Env,
    /// Logical cluster names of A and B.
    a: String,
    b: String,
    alice: Caller,
    carol: Caller,
    bob: Caller,
    eve: Caller,
}

fn role_binding(name: &str, role: &str, user: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": name, "namespace": "default"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
           "subjects": [user_subject(user)]})
}

/// A ClusterRole of one rule and its binding to `user`, in `cluster`.
async fn grant(env: &mut Env, cluster: &str, name: &str, rule: Value, user: &str) {
    let rbac = format!("/clusters/{cluster}/apis/rbac.authorization.k8s.io/v1");
    env.create(
        &format!("{rbac}/clusterroles"),
        json!({"metadata": {"name": name}, "rules": [rule]}),
    )
    .await;
    env.create(
        &format!("{rbac}/clusterrolebindings"),
        binding(name, name, user_subject(user)),
    )
    .await;
}

async fn tenants(adjust: impl FnOnce(&mut apiserver::server::ServeOptions)) -> Tenants {
    let mut env = Env::start(|opts, dir| {
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, TOKENS).expect("token file");
        opts.token_auth_file = Some(tokens);
        adjust(opts);
    })
    .await;
    let a = env.workspace("a").await;
    let b = env.workspace("b").await;
    for (cluster, admin) in [(&a, "carol"), (&b, "bob")] {
        env.create(
            &format!("/clusters/{cluster}/apis/rbac.authorization.k8s.io/v1/clusterroles"),
            yaml(EVERYTHING),
        )
        .await;
        env.create(
            &format!("/clusters/{cluster}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
            binding(&format!("{admin}-admin"), "everything", user_subject(admin)),
        )
        .await;
    }
    let rbac = format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/namespaces/default");
    env.create(
        &format!("{rbac}/roles"),
        json!({"metadata": {"name": "all-of-default"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await;
    env.create(
        &format!("{rbac}/rolebindings"),
        role_binding("alice", "all-of-default", "alice"),
    )
    .await;
    let alice = env.bearer("alice-token").await;
    let carol = env.bearer("carol-token").await;
    let bob = env.bearer("bob-token").await;
    let eve = env.bearer("eve-token").await;
    Tenants {
        env,
        a,
        b,
        alice,
        carol,
        bob,
        eve,
    }
}

impl Tenants {
    fn configmaps(&self, cluster: &str) -> String {
        format!("/clusters/{cluster}/api/v1/namespaces/default/configmaps")
    }

    /// bob publishes the widget schema and export in B.
    async fn export_in_b(&mut self) {
        let base = format!("/clusters/{}/apis/apis.kcp.io/v1alpha1", self.b);
        for (path, text) in [
            (
                "apiresourceschemas",
                include_str!("../../examples/workspaces/widget-schema.yaml"),
            ),
            (
                "apiexports",
                include_str!("../../examples/workspaces/widget-export.yaml"),
            ),
        ] {
            let r = self.bob.post(&format!("{base}/{path}"), &yaml(text)).await;
            assert_eq!(r.status, StatusCode::CREATED, "{path}: {:?}", r.json());
        }
    }
}

impl Tenants {
    /// bob lets carol bind his export (`bind` on it in B).
    async fn let_carol_bind(&mut self) {
        let b = self.b.clone();
        grant(
            &mut self.env,
            &b,
            "bind-widgets",
            json!({"apiGroups": ["apis.kcp.io"], "resources": ["apiexports"],
                   "resourceNames": [EXPORT], "verbs": ["bind"]}),
            "carol",
        )
        .await;
    }
}

fn apibinding(name: &str, path: &str, export: &str) -> Value {
    json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIBinding",
           "metadata": {"name": name},
           "spec": {"reference": {"export": {"path": path, "name": export}}}})
}

/// The parts of an error answer a client sees, with `names` (what the caller itself sent)
/// blanked, so two answers can be compared for what they reveal.
fn answer(r: &Reply, names: &[&str]) -> (StatusCode, String, String) {
    let v = r.json();
    let mut message = v["message"].as_str().unwrap_or("").to_string();
    for n in names {
        message = message.replace(n, "<name>");
    }
    (
        r.status,
        v["reason"].as_str().unwrap_or("").to_string(),
        message,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_admin_cannot_take_over_another_workspace_path() {
    let mut t = tenants(|_| {}).await;
    let (a, b) = (t.a.clone(), t.b.clone());
    let lcs = format!("/clusters/{a}/apis/core.kcp.io/v1alpha1/logicalclusters");
    // A second LogicalCluster claiming B's path: refused, whatever its name.
    for name in ["evil", "cluster"] {
        let r = t
            .carol
            .post(
                &lcs,
                &json!({"apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
                        "metadata": {"name": name, "annotations": {"kcp.io/path": "root:b"}}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{name}: {:?}", r.json());
    }
    // Rewriting A's own LogicalCluster: the server's annotations stay as they were, by PUT and
    // by patch; an annotation of the tenant's own is kept.
    let mut lc = t.carol.get(&format!("{lcs}/cluster")).await.json();
    lc["metadata"]["annotations"]["kcp.io/path"] = json!("root:b");
    lc["metadata"]["annotations"]["kcp.io/cluster"] = json!(b);
    lc["metadata"]["annotations"]["tenancy.kcp.io/owner"] = json!("carol");
    lc["metadata"]["annotations"]["mine"] = json!("kept");
    let r = t
        .carol
        .call(Method::PUT, &format!("{lcs}/cluster"), Some(&lc))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = t
        .carol
        .call(
            Method::PATCH,
            &format!("{lcs}/cluster"),
            Some(&json!({"metadata": {"annotations": {"kcp.io/path": "root:b", "kcp.io/extra": "x"}}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let lc = t.carol.get(&format!("{lcs}/cluster")).await.json();
    let annotations = &lc["metadata"]["annotations"];
    assert_eq!(annotations["kcp.io/path"], "root:a", "{lc}");
    assert_eq!(annotations["kcp.io/cluster"], a.as_str());
    assert!(annotations.get("kcp.io/extra").is_none(), "{lc}");
    assert!(annotations.get("tenancy.kcp.io/owner").is_none(), "{lc}");
    assert_eq!(annotations["mine"], "kept");
    // Its spec is the server's; deleting it, one by one or all, is refused.
    let mut changed = lc.clone();
    changed["spec"]["type"] = json!({"name": "root", "path": "root"});
    let r = t
        .carol
        .call(Method::PUT, &format!("{lcs}/cluster"), Some(&changed))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    let r = t
        .carol
        .call(Method::DELETE, &format!("{lcs}/cluster"), None)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{:?}", r.json());
    let r = t.carol.call(Method::DELETE, &lcs, None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{:?}", r.json());
    // A path annotation on any other object must name the workspace it is written to.
    for (path, expected) in [
        ("root:b", StatusCode::UNPROCESSABLE_ENTITY),
        ("root", StatusCode::UNPROCESSABLE_ENTITY),
        ("root:a", StatusCode::CREATED),
    ] {
        let r = t
            .carol
            .post(
                &t.configmaps(&a),
                &json!({"metadata": {"name": "p", "annotations": {"kcp.io/path": path}}}),
            )
            .await;
        assert_eq!(r.status, expected, "{path}: {:?}", r.json());
    }

    // B is still B: bob works there, and what an admin writes to root:b lands in B.
    let r = t.bob.get(&t.configmaps("root:b")).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    t.env
        .create(
            "/clusters/root:b/api/v1/namespaces/default/secrets",
            json!({"metadata": {"name": "b-only"}, "stringData": {"k": "v"}}),
        )
        .await;
    let r = t
        .bob
        .get(&format!(
            "/clusters/{b}/api/v1/namespaces/default/secrets/b-only"
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t
        .carol
        .get(&format!(
            "/clusters/{a}/api/v1/namespaces/default/secrets/b-only"
        ))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = t
        .carol
        .get("/clusters/root:b/api/v1/namespaces/default/secrets/b-only")
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_index_comes_from_workspaces_not_annotations_also_after_a_restart() {
    use apiserver::storage::Store;
    let mut server = common::Server::start();
    let mut admin = Caller::new(&server.client(), &[]).await;
    let mut clusters = Vec::new();
    // Several workspaces, so the planted claims sort before and after their victims.
    for name in ["a", "b", "c", "zz"] {
        clusters.push(create_workspace(&mut admin, name).await);
    }
    // LogicalClusters claiming every other path, planted straight into the stopped server's
    // store (as data left by an older version, or written around admission): the index must
    // not read them.
    server.kill();
    {
        let store = apiserver::storage::RedbStore::open(&server.data_dir.join("store.redb"))
            .expect("open the store");
        for (i, victim) in ["root:b", "root:c", "root:zz", "root:a"].iter().enumerate() {
            let owner = &clusters[i];
            let lc = json!({"apiVersion": "core.kcp.io/v1alpha1", "kind": "LogicalCluster",
                            "metadata": {"name": format!("planted-{i}"),
                                         "annotations": {"kcp.io/cluster": owner, "kcp.io/path": victim}}});
            let bytes = serde_json::to_vec(&lc).expect("json");
            store
                .create(
                    &format!("/core.kcp.io/logicalclusters/{owner}/planted-{i}"),
                    Box::new(move |_| bytes.clone()),
                )
                .await
                .expect("plant");
        }
    }
    server.restart(&[]);
    let mut admin = Caller::new(&server.client(), &[]).await;
    for (name, cluster) in ["a", "b", "c", "zz"].iter().zip(&clusters) {
        let lc = admin
            .get(&format!(
                "/clusters/root:{name}/apis/core.kcp.io/v1alpha1/logicalclusters/cluster"
            ))
            .await
            .json();
        assert_eq!(
            lc["metadata"]["annotations"]["kcp.io/cluster"],
            cluster.as_str(),
            "root:{name} resolves to its own workspace: {lc}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_patch_can_grow_an_object_without_bound() {
    let mut t = tenants(|_| {}).await;
    let cms = t.configmaps(&t.a.clone());
    let r = t
        .alice
        .post(
            &cms,
            &json!({"metadata": {"name": "bomb"}, "data": {"k": "x".repeat(1000)}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let patch_as = |ops: Value| ops;
    // 40 copies, each doubling the document: refused once the copies pass 3 MiB, long before
    // memory runs out. Variants: copying the whole object, an array element, into arrays.
    let doubling_data: Vec<Value> = (0..40)
        .map(|i| json!({"op": "copy", "from": "/data", "path": format!("/data/c{i}")}))
        .collect();
    let mut doubling_meta = vec![json!({"op": "add", "path": "/metadata/labels", "value": {}})];
    doubling_meta.extend((0..40).map(
        |i| json!({"op": "copy", "from": "/metadata", "path": format!("/metadata/labels/c{i}")}),
    ));
    let mut doubling_array = vec![json!({"op": "add", "path": "/metadata/finalizers",
                                         "value": ["x".repeat(1000)]})];
    doubling_array.extend((0..40).map(
        |_| json!({"op": "copy", "from": "/metadata/finalizers", "path": "/metadata/finalizers/0"}),
    ));
    for ops in [doubling_data, doubling_meta, doubling_array] {
        let r = t
            .alice
            .call_with(
                Method::PATCH,
                &format!("{cms}/bomb"),
                "application/json-patch+json",
                &patch_as(json!(ops)),
            )
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap_or("")
                .contains("would exceed"),
            "{:?}",
            r.json()
        );
    }
    // The server is fine and the object unchanged; a small copy still works.
    assert_eq!(t.env.admin.get("/readyz").await.status, StatusCode::OK);
    let cm = t.alice.get(&format!("{cms}/bomb")).await.json();
    assert_eq!(cm["data"].as_object().map(|d| d.len()), Some(1), "{cm}");
    let r = t
        .alice
        .call_with(
            Method::PATCH,
            &format!("{cms}/bomb"),
            "application/json-patch+json",
            &json!([{"op": "copy", "from": "/data/k", "path": "/data/k2"}]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());

    // Merge and apply patches add at most their own size, but repeated they would grow an
    // object forever: a stored object is capped (1.5 MiB), whatever the verb.
    let crds = format!(
        "/clusters/{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        t.a
    );
    let r = t
        .carol
        .post(
            &crds,
            &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": "blobs.example.com"},
                    "spec": {"group": "example.com", "scope": "Namespaced",
                             "names": {"plural": "blobs", "singular": "blob", "kind": "Blob", "listKind": "BlobList"},
                             "versions": [{"name": "v1", "served": true, "storage": true,
                                           "schema": {"openAPIV3Schema": {"type": "object",
                                               "x-kubernetes-preserve-unknown-fields": true}}}]}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let blobs = format!(
        "/clusters/{}/apis/example.com/v1/namespaces/default/blobs",
        t.a
    );
    let mut created = false;
    for _ in 0..100 {
        let r = t
            .carol
            .post(
                &blobs,
                &json!({"apiVersion": "example.com/v1", "kind": "Blob", "metadata": {"name": "b"}}),
            )
            .await;
        if r.status == StatusCode::CREATED {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(created, "the CRD is served");
    let chunk = "y".repeat(700 * 1024);
    let mut codes = Vec::new();
    for (i, content_type) in [
        "application/merge-patch+json",
        "application/merge-patch+json",
        "application/json-patch+json",
    ]
    .iter()
    .enumerate()
    {
        let body = if content_type.contains("json-patch") {
            json!([{"op": "add", "path": format!("/k{i}"), "value": chunk}])
        } else {
            json!({format!("k{i}"): chunk})
        };
        let r = t
            .carol
            .call_with(Method::PATCH, &format!("{blobs}/b"), content_type, &body)
            .await;
        codes.push(r.status);
        if r.status != StatusCode::OK {
            assert_eq!(
                r.json()["reason"],
                "RequestEntityTooLarge",
                "{:?}",
                r.json()
            );
        }
    }
    assert_eq!(
        codes,
        vec![
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::PAYLOAD_TOO_LARGE
        ]
    );
    // A PUT of the same size as the body limit allows is refused the same way.
    let mut blob = t.carol.get(&format!("{blobs}/b")).await.json();
    blob["k2"] = json!("z".repeat(700 * 1024));
    let r = t
        .carol
        .call(Method::PUT, &format!("{blobs}/b"), Some(&blob))
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{:?}", r.json());

    // Strategic merge of long lists: 10,000 finalizers merged with 10,000 more (the linear-time
    // merge itself is checked at a larger size in the strategic_merge unit tests).
    let live: Vec<String> = (0..10_000).map(|i| format!("example.com/l{i}")).collect();
    let r = t
        .alice
        .post(
            &cms,
            &json!({"metadata": {"name": "long", "finalizers": live}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let more: Vec<String> = (0..10_000).map(|i| format!("example.com/p{i}")).collect();
    let r = t
        .alice
        .call_with(
            Method::PATCH,
            &format!("{cms}/long"),
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"finalizers": more}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    assert_eq!(
        r.json()["metadata"]["finalizers"].as_array().map(Vec::len),
        Some(20_000)
    );
    let r = t
        .alice
        .call_with(
            Method::PATCH,
            &format!("{cms}/long"),
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_over_one_mebibyte_is_refused_as_kube_does() {
    let mut t = tenants(|_| {}).await;
    let cms = t.configmaps(&t.a.clone());
    let secrets = format!("/clusters/{}/api/v1/namespaces/default/secrets", t.a);
    let mib = 1024 * 1024;
    let r = t
        .alice
        .post(
            &cms,
            &json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(mib)}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    assert_eq!(
        r.json()["details"]["causes"][0]["reason"],
        "FieldValueTooLong"
    );
    let r = t
        .alice
        .post(
            &cms,
            &json!({"metadata": {"name": "fits"}, "data": {"k": "x".repeat(mib - 1)}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    // Growing it past the limit by patch is refused too, by each patch form.
    for (content_type, patch) in [
        (
            "application/merge-patch+json",
            json!({"data": {"k2": "yy"}}),
        ),
        (
            "application/json-patch+json",
            json!([{"op": "add", "path": "/data/k2", "value": "yy"}]),
        ),
        (
            "application/strategic-merge-patch+json",
            json!({"data": {"k2": "yy"}}),
        ),
    ] {
        let r = t
            .alice
            .call_with(Method::PATCH, &format!("{cms}/fits"), content_type, &patch)
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{content_type}");
    }
    let r = t
        .alice
        .post(
            &secrets,
            &json!({"metadata": {"name": "big"}, "stringData": {"k": "x".repeat(mib + 1)}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    let half = base64::engine::general_purpose::STANDARD.encode(vec![0u8; mib / 2 + 1]);
    let r = t
        .alice
        .post(
            &secrets,
            &json!({"metadata": {"name": "big"}, "data": {"a": half, "b": half}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
}

/// An HTTP/2 connection whose receive windows are small, so that an answer it does not read
/// stays on the server.
async fn slow_reader(
    env: &Env,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    ClientConfig::new(env.server.address, &env.ca, None)
        .expect("config")
        .connect_h2_with_window(Some(65_535))
        .await
        .expect("h2")
}

fn bearer_get(path: &str, token: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::get(format!("https://localhost{path}"))
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_lists_and_idle_watches_are_bounded_per_user() {
    let mut t = tenants(|opts| {
        opts.budgets.watches_per_user = 3;
        opts.budgets.list_bytes_per_user = 2 * 1024 * 1024;
    })
    .await;
    let cms = t.configmaps(&t.a.clone());
    for i in 0..6 {
        let r = t
            .alice
            .post(&cms, &json!({"metadata": {"name": format!("c{i}")}, "data": {"k": "x".repeat(250 * 1024)}}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    // alice lists 1.5 MB and does not read it: the answer waits on the server, and counts.
    let mut conn = slow_reader(&t.env).await;
    let first = conn
        .send_request(bearer_get(&cms, "alice-token"))
        .await
        .expect("first list");
    assert_eq!(first.status(), StatusCode::OK);
    let second = conn
        .send_request(bearer_get(&cms, "alice-token"))
        .await
        .expect("second list");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(second.headers().contains_key("retry-after"));
    // Others are not affected; small lists of alice's are not counted.
    let r = t.carol.get(&cms).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t.alice.get(&format!("{cms}?limit=1")).await;
    assert_eq!(r.status, StatusCode::OK);
    // Once alice lets go of the first answer, she may list again.
    drop(first);
    drop(conn);
    let mut listed = false;
    for _ in 0..100 {
        if t.alice.get(&cms).await.status == StatusCode::OK {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed, "alice's budget came back");

    // A watch's initial state counts like a list until it is read: unread, it leaves no room
    // for another large answer.
    let mut conn = slow_reader(&t.env).await;
    let everything = conn
        .send_request(bearer_get(&format!("{cms}?watch=true"), "alice-token"))
        .await
        .expect("watch");
    assert_eq!(everything.status(), StatusCode::OK);
    let r = conn
        .send_request(bearer_get(&cms, "alice-token"))
        .await
        .expect("list");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(everything);
    drop(conn);

    // Watches: three per user, whether read or not; others and admins are not limited by hers.
    let mut conn = slow_reader(&t.env).await;
    let watch = format!("{cms}?watch=true&labelSelector=selects%3Dnothing");
    let mut open = Vec::new();
    for _ in 0..3 {
        let r = conn
            .send_request(bearer_get(&watch, "alice-token"))
            .await
            .expect("watch");
        assert_eq!(r.status(), StatusCode::OK);
        open.push(r);
    }
    let r = conn
        .send_request(bearer_get(&watch, "alice-token"))
        .await
        .expect("watch");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = t.carol.get(&format!("{watch}&timeoutSeconds=1")).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = t.env.admin.get(&format!("{watch}&timeoutSeconds=1")).await;
    assert_eq!(r.status, StatusCode::OK);
    open.pop();
    let mut reopened = false;
    for _ in 0..100 {
        let r = conn
            .send_request(bearer_get(&watch, "alice-token"))
            .await
            .expect("watch");
        if r.status() == StatusCode::OK {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reopened, "a closed watch frees its slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_another_workspace_export_needs_bind_there() {
    let mut t = tenants(|_| {}).await;
    t.export_in_b().await;
    let (a, b) = (t.a.clone(), t.b.clone());
    let bindings = format!("/clusters/{a}/apis/apis.kcp.io/v1alpha1/apibindings");
    let refused = t
        .carol
        .post(&bindings, &apibinding("w", "root:b", EXPORT))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::FORBIDDEN,
        "{:?}",
        refused.json()
    );
    // Absent exports and workspaces answer exactly the same.
    for (path, export) in [("root:b", "nope.example.com"), ("root:nowhere", EXPORT)] {
        let r = t
            .carol
            .post(&bindings, &apibinding("w", path, export))
            .await;
        assert_eq!(
            answer(&r, &[path, export]),
            answer(&refused, &["root:b", EXPORT]),
            "{path}:{export}"
        );
    }
    // Nothing of B reached A: no binding, no schema in A's OpenAPI.
    let r = t.carol.get(&format!("{bindings}/w")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let doc = t.carol.get(&format!("/clusters/{a}/openapi/v2")).await;
    assert!(!String::from_utf8_lossy(&doc.body).contains("example.platform-mesh.io"));
    // bob may bind his own export; with `bind` granted in B, carol may too.
    let r = t
        .bob
        .post(
            &format!("/clusters/{b}/apis/apis.kcp.io/v1alpha1/apibindings"),
            &apibinding("own", "", EXPORT),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    t.let_carol_bind().await;
    let r = t
        .carol
        .post(&bindings, &apibinding("w", "root:b", EXPORT))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    assert_eq!(r.json()["status"]["phase"], "Bound");
    // Pointing a binding elsewhere is refused: its reference never changes (kcp's rule); another
    // export is another binding, and that is a new bind, checked again.
    let mut w = r.json();
    w["spec"]["reference"]["export"]["name"] = json!("other.example.com");
    let r = t
        .carol
        .call(Method::PUT, &format!("{bindings}/w"), Some(&w))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_virtual_workspace_writes_only_into_bound_workspaces() {
    let mut t = tenants(|_| {}).await;
    t.export_in_b().await;
    let (a, b) = (t.a.clone(), t.b.clone());
    let c = t.env.workspace("c").await;
    // A binds B's export (carol was granted bind); C never does.
    t.let_carol_bind().await;
    let r = t
        .carol
        .post(
            &format!("/clusters/{a}/apis/apis.kcp.io/v1alpha1/apibindings"),
            &apibinding("w", "root:b", EXPORT),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let vw = |cluster: &str, ns: &str| {
        format!(
            "/services/apiexport/{b}/{EXPORT}/clusters/{cluster}/apis/example.platform-mesh.io/v1/namespaces/{ns}/widgets"
        )
    };
    let widget = json!({"apiVersion": "example.platform-mesh.io/v1", "kind": "Widget",
                        "metadata": {"name": "w"}, "spec": {"color": "red"}});
    // bob owns the export: he writes into A, which bound it...
    let mut written = false;
    for _ in 0..100 {
        let r = t.bob.post(&vw(&a, "default"), &widget).await;
        if r.status == StatusCode::CREATED {
            written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(written, "the provider writes into a bound workspace");
    // ... and nowhere else: not C, not root, not B itself, not a name that does not exist, all
    // with one answer; a namespace of an unbound workspace tells nothing either.
    let refused = t.bob.post(&vw(&c, "default"), &widget).await;
    assert_eq!(
        refused.status,
        StatusCode::FORBIDDEN,
        "{:?}",
        refused.json()
    );
    for (cluster, ns) in [
        ("root", "default"),
        (b.as_str(), "default"),
        ("cnotaworkspace00", "default"),
        (c.as_str(), "no-such-namespace"),
        ("root:c", "default"),
    ] {
        let r = t.bob.post(&vw(cluster, ns), &widget).await;
        assert_eq!(answer(&r, &[]), answer(&refused, &[]), "{cluster}/{ns}");
        let r = t.bob.get(&vw(cluster, ns)).await;
        assert_eq!(
            answer(&r, &[]),
            answer(&refused, &[]),
            "list {cluster}/{ns}"
        );
    }
    // Nothing was planted in C.
    let r = t
        .env
        .admin
        .get(&format!(
            "/clusters/{c}/apis/example.platform-mesh.io/v1/namespaces/default/widgets/w"
        ))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_workspace_type_needs_use_there() {
    let mut t = tenants(|_| {}).await;
    let (a, b) = (t.a.clone(), t.b.clone());
    let r = t
        .bob
        .post(
            &format!("/clusters/{b}/apis/tenancy.kcp.io/v1alpha1/workspacetypes"),
            &json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                    "metadata": {"name": "b-type"},
                    "spec": {"defaultAPIBindings": [{"path": "root:b", "export": EXPORT}]}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let workspaces = format!("/clusters/{a}/apis/tenancy.kcp.io/v1alpha1/workspaces");
    let ws = |name: &str, t: &str, path: &str| {
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
               "metadata": {"name": name}, "spec": {"type": {"name": t, "path": path}}})
    };
    let refused = t
        .carol
        .post(&workspaces, &ws("w1", "b-type", "root:b"))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::FORBIDDEN,
        "{:?}",
        refused.json()
    );
    for (name, path) in [("nope", "root:b"), ("b-type", "root:nowhere")] {
        let r = t.carol.post(&workspaces, &ws("w1", name, path)).await;
        assert_eq!(
            answer(&r, &[name, path]),
            answer(&refused, &["b-type", "root:b"]),
            "{path}:{name}"
        );
    }
    // root's built-in types are everyone's.
    let r = t
        .carol
        .post(&workspaces, &ws("w2", "universal", "root"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    grant(
        &mut t.env,
        &b,
        "use-b-type",
        json!({"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"],
               "resourceNames": ["b-type"], "verbs": ["use"]}),
        "carol",
    )
    .await;
    let r = t
        .carol
        .post(&workspaces, &ws("w1", "b-type", "root:b"))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_tells_a_tenant_what_another_holds() {
    let mut t = tenants(|_| {}).await;
    t.export_in_b().await;
    let (a, b) = (t.a.clone(), t.b.clone());
    // /metrics shows every tenant's traffic: RBAC on the URL in root.
    assert_eq!(t.eve.get("/metrics").await.status, StatusCode::FORBIDDEN);
    assert_eq!(t.carol.get("/metrics").await.status, StatusCode::FORBIDDEN);
    assert_eq!(t.env.admin.get("/metrics").await.status, StatusCode::OK);
    grant(
        &mut t.env,
        "root",
        "metrics-reader",
        json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}),
        "eve",
    )
    .await;
    assert_eq!(t.eve.get("/metrics").await.status, StatusCode::OK);
    // A workspace that exists and one that does not answer alike, by path and by name, for
    // resources and for discovery.
    for (present, absent) in [
        ("/clusters/root:b/api/v1/namespaces/default/configmaps".to_string(),
         "/clusters/root:nowhere/api/v1/namespaces/default/configmaps".to_string()),
        (format!("/clusters/{b}/api/v1/namespaces/default/configmaps/x"),
         "/clusters/cnotaworkspace00/api/v1/namespaces/default/configmaps/x".to_string()),
        (format!("/clusters/{b}/apis"), "/clusters/root:nowhere/apis".to_string()),
        (format!("/clusters/{b}/apis/apis.kcp.io/v1alpha1/apiexports/{EXPORT}"),
         format!("/clusters/{b}/apis/apis.kcp.io/v1alpha1/apiexports/nope")),
        (format!("/services/apiexport/{b}/{EXPORT}/clusters/*/apis/example.platform-mesh.io/v1/widgets"),
         format!("/services/apiexport/{b}/nope/clusters/*/apis/example.platform-mesh.io/v1/widgets")),
        (format!("/services/apiexport/{b}/{EXPORT}/clusters/*/apis"),
         "/services/apiexport/cnotaworkspace00/nope/clusters/*/apis".to_string()),
    ] {
        for who in [&mut t.eve, &mut t.carol] {
            let p = who.get(&present).await;
            let q = who.get(&absent).await;
            assert_eq!(p.status, StatusCode::FORBIDDEN, "{present}: {:?}", p.json());
            assert_eq!(answer(&p, &[]), answer(&q, &[]), "{present} vs {absent}");
        }
    }
    // TokenReview in A answers only for A's own service accounts: bob's token and a
    // service account token of B look like garbage there.
    let review = |token: &str| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token}})
    };
    let reviews = format!("/clusters/{a}/apis/authentication.k8s.io/v1/tokenreviews");
    let garbage = t.carol.post(&reviews, &review("not-a-token")).await.json();
    assert_eq!(garbage["status"]["authenticated"], false);
    let r = t.carol.post(&reviews, &review("bob-token")).await.json();
    assert_eq!(r["status"], garbage["status"], "{r}");
    let r = t
        .bob
        .post(
            &format!("/clusters/{b}/api/v1/namespaces/default/serviceaccounts"),
            &json!({"metadata": {"name": "bot"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let b_token = t
        .bob
        .post(
            &format!("/clusters/{b}/api/v1/namespaces/default/serviceaccounts/bot/token"),
            &json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "spec": {}}),
        )
        .await
        .json()["status"]["token"]
        .as_str()
        .expect("token")
        .to_string();
    let r = t.carol.post(&reviews, &review(&b_token)).await.json();
    assert_eq!(r["status"], garbage["status"], "{r}");
    // In B (bob's), and in root (the platform's), the same token is reviewed.
    let r = t
        .bob
        .post(
            &format!("/clusters/{b}/apis/authentication.k8s.io/v1/tokenreviews"),
            &review(&b_token),
        )
        .await
        .json();
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    let r = t
        .env
        .admin
        .post(
            "/clusters/root/apis/authentication.k8s.io/v1/tokenreviews",
            &review("bob-token"),
        )
        .await
        .json();
    assert_eq!(r["status"]["user"]["username"], "bob", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_follows_every_rbac_change_at_once_with_many_roles() {
    let mut t = tenants(|_| {}).await;
    let a = t.a.clone();
    let rbac = format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/namespaces/default");
    for i in 0..300 {
        let r = t
            .carol
            .post(
                &format!("{rbac}/roles"),
                &json!({"metadata": {"name": format!("r{i}")},
                        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                   "resourceNames": [format!("c{i}")], "verbs": ["get"]}]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let cms = t.configmaps(&a);
    t.env
        .create(&cms, json!({"metadata": {"name": "c7"}}))
        .await;
    // The policy is decoded once and kept...
    assert_eq!(
        t.eve.get(&format!("{cms}/c7")).await.status,
        StatusCode::FORBIDDEN
    );
    assert!(
        t.env.server.state.policies.get(&a).is_some(),
        "A's policy is kept"
    );
    // ... yet every grant and revocation counts for the very next request.
    for round in 0..10 {
        let r = t
            .carol
            .post(
                &format!("{rbac}/rolebindings"),
                &role_binding("eve", "r7", "eve"),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "round {round}");
        assert_eq!(
            t.eve.get(&format!("{cms}/c7")).await.status,
            StatusCode::OK,
            "round {round}"
        );
        let r = t
            .carol
            .call(Method::DELETE, &format!("{rbac}/rolebindings/eve"), None)
            .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            t.eve.get(&format!("{cms}/c7")).await.status,
            StatusCode::FORBIDDEN,
            "round {round}"
        );
    }
}

/// A workspace admin who impersonates `system:masters` in her own workspace is refused (kcp's
/// impersonation gate: only an unscoped administrator impersonates a privileged group or sets a
/// `kcp.io` extra), so she can neither forge a workspace's owner nor get a type's default
/// binding to another tenant's export without `bind` there; her own forged owner is replaced by
/// herself; and impersonating other names does not multiply her budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonating_system_masters_gains_nothing_outside_the_rules() {
    let mut t = tenants(|opts| opts.budgets.watches_per_user = 3).await;
    t.export_in_b().await;
    let a = t.a.clone();
    let r = t
        .carol
        .post(
            &format!("/clusters/{a}/apis/tenancy.kcp.io/v1alpha1/workspacetypes"),
            &json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                    "metadata": {"name": "sneaky"},
                    "spec": {"defaultAPIBindings": [{"path": "root:b", "export": EXPORT}]}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let workspaces = format!("/clusters/{a}/apis/tenancy.kcp.io/v1alpha1/workspaces");
    let forged = r#"{"username":"admin","groups":["system:masters"]}"#;
    let ws = |name: &str| {
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
               "metadata": {"name": name,
                            "annotations": {"experimental.tenancy.kcp.io/owner": forged}},
               "spec": {"type": {"name": "sneaky", "path": "root:a"}}})
    };
    let config = ClientConfig::new(t.env.server.address, &t.env.ca, None).expect("config");
    let bearer = ("authorization", "Bearer carol-token");
    for headers in [
        vec![
            bearer,
            ("impersonate-user", "carol"),
            ("impersonate-group", "system:masters"),
        ],
        vec![
            bearer,
            ("impersonate-user", "carol"),
            ("impersonate-group", "system:kcp:logical-cluster-admin"),
        ],
        vec![
            bearer,
            ("impersonate-user", "carol"),
            (
                "impersonate-extra-authentication.kcp.io%2Fscopes",
                "cluster:root",
            ),
        ],
    ] {
        let mut as_master = Caller::new(&config, &headers).await;
        let r = as_master.post(&workspaces, &ws("w1")).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{headers:?}: {:?}",
            r.json()
        );
        assert!(
            r.json()["message"]
                .as_str()
                .is_some_and(|m| m.contains("not allowed for the requestor")),
            "{:?}",
            r.json()
        );
    }
    // Without impersonation the forged owner is replaced by carol, who may not bind bob's
    // export: the default binding is never made and the workspace waits in Initializing.
    let r = t.carol.post(&workspaces, &ws("w2")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let owner = r.json()["metadata"]["annotations"]["experimental.tenancy.kcp.io/owner"].clone();
    let owner: Value = serde_json::from_str(owner.as_str().unwrap_or("{}")).expect("owner");
    assert_eq!(owner["username"], "carol", "{owner}");
    let mut child = String::new();
    for _ in 0..100 {
        let w = t.env.admin.get(&format!("{workspaces}/w2")).await.json();
        if w["status"]["phase"] == "Initializing" {
            child = w["spec"]["cluster"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!child.is_empty(), "w2 reached Initializing");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let w = t.env.admin.get(&format!("{workspaces}/w2")).await.json();
    assert_eq!(w["status"]["phase"], "Initializing", "{w}");
    let bound = t
        .env
        .admin
        .get(&format!(
            "/clusters/{child}/apis/apis.kcp.io/v1alpha1/apibindings/{EXPORT}"
        ))
        .await;
    assert_eq!(bound.status, StatusCode::NOT_FOUND, "{:?}", bound.json());

    // Budgets: carol's three watches are hers, also when she opens them as other users (who
    // may watch in A).
    for who in ["x1", "x2", "x3"] {
        t.env
            .create(
                &format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
                binding(&format!("{who}-admin"), "everything", user_subject(who)),
            )
            .await;
    }
    let watch = format!(
        "{}?watch=true&labelSelector=selects%3Dnothing",
        t.configmaps(&a)
    );
    let mut conn = slow_reader(&t.env).await;
    let mut open = Vec::new();
    for who in ["carol", "x1", "x2", "x3"] {
        let mut req = bearer_get(&watch, "carol-token");
        if who != "carol" {
            req.headers_mut().insert(
                "impersonate-user",
                http::HeaderValue::from_str(who).expect("header"),
            );
        }
        // Each answer is kept, so its watch stays open.
        open.push(conn.send_request(req).await.expect("watch"));
    }
    assert_eq!(
        open.iter().map(|r| r.status().as_u16()).collect::<Vec<_>>(),
        [200, 200, 200, 429]
    );
}

/// A CRD whose one CEL rule is `rule`, over `spec.l`, a list of integers (`maxItems` if given).
fn cel_crd(plural: &str, kind: &str, rule: &str, max_items: Option<u64>) -> Value {
    let mut l = json!({"type": "array", "items": {"type": "integer"}});
    if let Some(n) = max_items {
        l["maxItems"] = json!(n);
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.example.com")},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"l": l},
                                               "x-kubernetes-validations": [{"rule": rule}]}}}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_are_costed_when_defined_and_bounded_when_run() {
    let mut t = tenants(|_| {}).await;
    let crds = format!(
        "/clusters/{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        t.a
    );
    // The rule of the finding, over a list with no maxItems: refused when defined, as kube.
    let cubic = "self.l.all(a, self.l.all(b, self.l.all(c, a + b + c >= 0)))";
    let r = t
        .carol
        .post(&crds, &cel_crd("cubes", "Cube", cubic, None))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    let v = r.json();
    assert_eq!(
        v["message"],
        "CustomResourceDefinition.apiextensions.k8s.io \"cubes.example.com\" is invalid: [\
         spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: \
         Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying \
         the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings \
         are declared), spec.versions[0].schema.openAPIV3Schema: Forbidden: x-kubernetes-validations \
         estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than \
         100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where \
         arrays, maps, and strings are declared)]"
    );
    assert_eq!(v["details"]["causes"][0]["reason"], "FieldValueForbidden");
    // A rule that does not compile is refused too.
    let r = t
        .carol
        .post(&crds, &cel_crd("broken", "Broken", "self.l.all(x, ", None))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    // With a bound the same rule is cheap enough, and it is served and enforced.
    let r = t
        .carol
        .post(&crds, &cel_crd("cubes", "Cube", cubic, Some(10)))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let cubes = format!(
        "/clusters/{}/apis/example.com/v1/namespaces/default/cubes",
        t.a
    );
    let cube = |name: &str, l: Vec<i64>| {
        json!({"apiVersion": "example.com/v1", "kind": "Cube",
               "metadata": {"name": name}, "spec": {"l": l}})
    };
    let mut created = false;
    for _ in 0..100 {
        let r = t.carol.post(&cubes, &cube("ok", vec![1, 2, 3])).await;
        if r.status == StatusCode::CREATED {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(created, "the CRD is served");
    let r = t.alice.post(&cubes, &cube("bad", vec![1, -5])).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.json());
    assert_eq!(
        r.json()["message"],
        format!("Cube.example.com \"bad\" is invalid: spec: Invalid value: \"object\": failed rule: {cubic}")
    );
}
