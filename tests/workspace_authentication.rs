//! kcp's per-workspace authentication end to end: a WorkspaceType that lists
//! WorkspaceAuthenticationConfigurations admits the users of their issuers into its workspaces
//! and nowhere else, through kcp's filters, with the issuers' keys fetched over HTTPS from the
//! issuer's discovery document (a [`DevIssuer`] here).

mod common;

use std::sync::atomic::Ordering;

use apiserver::workspace_authn::issuer::DevIssuer;
use bytes::Bytes;
use http::Method;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

const KEY: &str = include_str!("../apiserver/src/workspace_authn/testdata/issuer-key.pem");
const OTHER_KEY: &str = include_str!("../apiserver/src/workspace_authn/testdata/other-key.pem");

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn auth_configs() -> ApiResource {
    ar(
        "tenancy.kcp.io",
        "v1alpha1",
        "WorkspaceAuthenticationConfiguration",
        "workspaceauthenticationconfigurations",
    )
}

fn workspace_types() -> ApiResource {
    ar(
        "tenancy.kcp.io",
        "v1alpha1",
        "WorkspaceType",
        "workspacetypes",
    )
}

async fn create(client: kube::Client, r: &ApiResource, obj: Value) {
    Api::<DynamicObject>::all_with(client, r)
        .create(
            &PostParams::default(),
            &serde_json::from_value(obj).expect("object"),
        )
        .await
        .unwrap_or_else(|e| panic!("creating a {}: {e}", r.kind));
}

/// `(status, body)` of a request with `token` as its bearer token.
async fn with_token(
    env: &common::KubeEnv,
    token: &str,
    method: Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let ca = std::fs::read_to_string(env.dir.path().join("data/pki/ca.crt")).expect("ca");
    let client =
        apiserver::client::ClientConfig::new(env.server.address, &ca, None).expect("client");
    let mut conn = client.connect().await.expect("connect");
    let auth = format!("Bearer {token}");
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let reply = conn
        .send_with_headers(
            method,
            path,
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
                ("accept", "application/json"),
            ],
            body,
        )
        .await
        .expect("request");
    (reply.status.as_u16(), reply.json())
}

/// Who the server takes `token` for in workspace `path` (a SelfSubjectReview), or the status
/// code it refuses it with.
async fn whoami(env: &common::KubeEnv, token: &str, path: &str) -> Result<Value, u16> {
    let (code, body) = with_token(
        env,
        token,
        Method::POST,
        &format!("/clusters/{path}/apis/authentication.k8s.io/v1/selfsubjectreviews"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .await;
    match code {
        201 | 200 => Ok(body["status"]["userInfo"].clone()),
        c => Err(c),
    }
}

fn jwt(issuer: &DevIssuer, username: Value, groups: Value, audiences: &[&str]) -> Value {
    json!({
        "issuer": {"url": issuer.url(), "certificateAuthority": issuer.ca_pem,
                   "audiences": audiences, "audienceMatchPolicy": "MatchAny"},
        "claimMappings": {"username": username, "groups": groups},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_admits_the_users_of_its_types_issuers_and_no_other_workspace_does() {
    let env = common::KubeEnv::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let any = "127.0.0.1:0".parse().expect("addr");
    let acme = DevIssuer::start(&dir.path().join("acme"), any, "/realms/acme", KEY)
        .await
        .expect("issuer");
    let raw = DevIssuer::start(&dir.path().join("raw"), any, "", OTHER_KEY)
        .await
        .expect("issuer");

    env.workspace("root", "corp", "universal").await;
    let corp = || env.client("root:corp");
    // Users of acme's realm are `oidc:<email>`; their groups keep their names (so that a
    // `system:` group in a token is there to be dropped). The raw issuer names users by `sub`.
    create(corp(), &auth_configs(), json!({
        "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
        "metadata": {"name": "acme"},
        "spec": {"jwt": [jwt(&acme, json!({"claim": "email", "prefix": "oidc:"}),
                             json!({"claim": "groups", "prefix": ""}), &["portal", "kubectl"])]},
    }))
    .await;
    create(
        corp(),
        &auth_configs(),
        json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
            "metadata": {"name": "raw"},
            "spec": {"jwt": [jwt(&raw, json!({"claim": "sub", "prefix": ""}),
                                 json!({"claim": "groups", "prefix": ""}), &["raw"])]},
        }),
    )
    .await;
    create(
        corp(),
        &workspace_types(),
        json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
            "metadata": {"name": "with-idp"},
            "spec": {"extend": {"with": [{"name": "universal", "path": "root"}]},
                     "authenticationConfigurations": [{"name": "acme"}, {"name": "raw"}]},
        }),
    )
    .await;
    let team = env
        .workspace("root:corp", "team", "root:corp:with-idp")
        .await;
    env.workspace("root:corp", "other", "universal").await;

    let ann = acme
        .token(
            &json!({"aud": ["portal"], "email": "ann@acme.io", "email_verified": true,
                       "groups": ["developers", "system:masters"], "jti": "t-1"}),
        )
        .expect("token");

    // The user, as kcp makes it: prefixed name, system groups dropped, scoped to the workspace.
    let me = whoami(&env, &ann, "root:corp:team")
        .await
        .expect("admitted");
    assert_eq!(me["username"], "oidc:ann@acme.io");
    assert_eq!(me["groups"], json!(["developers", "system:authenticated"]));
    assert_eq!(
        me["extra"]["authentication.kcp.io/scopes"],
        json!([format!("cluster:{team}")])
    );
    assert_eq!(
        me["extra"]["authentication.kcp.io/cluster-name"],
        json!([team])
    );
    assert_eq!(
        me["extra"]["authentication.kubernetes.io/credential-id"],
        json!(["JTI=t-1"])
    );
    // The logical cluster name addresses it as well as the path.
    assert!(whoami(&env, &ann, &team).await.is_ok());

    // Admitted is not authorized: the workspace's RBAC decides, by the mapped names.
    let configmaps = "/clusters/root:corp:team/api/v1/namespaces/default/configmaps";
    let (code, _) = with_token(&env, &ann, Method::GET, configmaps, Value::Null).await;
    assert_eq!(code, 403, "no RBAC grants the user anything yet");
    create(
        env.client("root:corp:team"),
        &ar(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
        ),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "team-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        }),
    )
    .await;
    create(env.client("root:corp:team"), &ar("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "developers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "team-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "developers"}],
    }))
    .await;
    let (code, body) = with_token(&env, &ann, Method::GET, configmaps, Value::Null).await;
    assert_eq!(code, 200, "{body}");

    // Nowhere else: not the parent, a sibling, root, or a workspace that does not exist (401
    // there too, so that a stranger does not learn which workspaces exist).
    for path in [
        "root:corp",
        "root:corp:other",
        "root",
        "root:corp:nothing-here",
    ] {
        assert_eq!(whoami(&env, &ann, path).await, Err(401), "{path}");
    }
    // As an admin of team, the user creates a child workspace; its types are not
    // team's, and in any other workspace the user is anonymous: the creation is refused.
    let (code, body) = with_token(
        &env,
        &ann,
        Method::POST,
        "/clusters/root:corp:team/apis/tenancy.kcp.io/v1alpha1/workspaces",
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
               "metadata": {"name": "child"}, "spec": {"type": {"name": "with-idp", "path": "root:corp"}}}),
    )
    .await;
    assert_eq!(code, 403, "use of a type in another workspace: {body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("no permission to use workspace type")),
        "{body}"
    );

    // What the issuers' tokens may not do.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let refused = [
        (
            "another audience",
            acme.token(&json!({"aud": "other", "email": "ann@acme.io"})),
        ),
        (
            "expired",
            acme.token(&json!({"aud": "portal", "email": "ann@acme.io", "exp": now - 60})),
        ),
        (
            "unverified email",
            acme.token(&json!({"aud": "portal", "email": "ann@acme.io", "email_verified": false})),
        ),
        (
            "a system user",
            raw.token(&json!({"aud": "raw", "sub": "system:admin"})),
        ),
        (
            "a system service account",
            raw.token(&json!({"aud": "raw", "sub": "system:serviceaccount:default:default"})),
        ),
        (
            "signed by another key",
            raw.signer
                .token(&json!({"aud": "portal", "email": "ann@acme.io", "iss": acme.url()})),
        ),
        ("not a JWT", Ok("not-a-token".to_string())),
    ];
    for (what, token) in refused {
        assert_eq!(
            whoami(&env, &token.expect("token"), "root:corp:team").await,
            Err(401),
            "{what}"
        );
    }
    let bob = raw
        .token(&json!({"aud": "raw", "sub": "bob", "groups": "system:masters"}))
        .expect("token");
    let me = whoami(&env, &bob, "root:corp:team").await.expect("bob");
    assert_eq!(me["username"], "bob");
    assert_eq!(me["groups"], json!(["system:authenticated"]));

    // The keys were fetched once per issuer (discovery and key set), not per request.
    let fetched = acme.requests.load(Ordering::Relaxed);
    assert!(fetched <= 4, "the acme issuer was asked {fetched} times");

    // The type changes: existing workspaces follow at once.
    Api::<DynamicObject>::all_with(corp(), &workspace_types())
        .patch(
            "with-idp",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"authenticationConfigurations": [{"name": "raw"}]}})),
        )
        .await
        .expect("patch type");
    assert_eq!(whoami(&env, &ann, "root:corp:team").await, Err(401));
    assert!(whoami(&env, &bob, "root:corp:team").await.is_ok());
    // A configuration the type names that does not exist makes it authenticate nobody.
    Api::<DynamicObject>::all_with(corp(), &workspace_types())
        .patch(
            "with-idp",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"authenticationConfigurations": [{"name": "raw"}, {"name": "gone"}]}})),
        )
        .await
        .expect("patch type");
    assert_eq!(whoami(&env, &bob, "root:corp:team").await, Err(401));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configurations_are_validated_as_kcp_validates_them() {
    let env = common::KubeEnv::start().await;
    let api = Api::<DynamicObject>::all_with(env.client("root"), &auth_configs());
    let attempt = |name: &str, spec: Value| {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("object");
        let api = api.clone();
        async move { api.create(&PostParams::default(), &obj).await }
    };
    let issuer = json!({"url": "https://example.com"});
    let cases = [
        ("empty", json!({}), Some("spec.jwt: Required value")),
        (
            "minimal-claim",
            json!({"jwt": [{"issuer": issuer,
            "claimMappings": {"username": {"claim": "email"}, "groups": {"claim": "groups"}}}]}),
            None,
        ),
        (
            "minimal-expression",
            json!({"jwt": [{"issuer": issuer,
            "claimMappings": {"username": {"expression": "claims.sub"}, "groups": {"expression": "claims.groups"}}}]}),
            None,
        ),
        (
            "claim-and-expression",
            json!({"jwt": [{"issuer": issuer,
            "claimMappings": {"username": {"claim": "email", "expression": "claims.sub"}}}]}),
            Some("claim and expression cannot both be specified"),
        ),
        (
            "expression-and-prefix",
            json!({"jwt": [{"issuer": issuer,
            "claimMappings": {"username": {"expression": "claims.sub", "prefix": "x:"}}}]}),
            Some("prefix can only be specified when claim is specified"),
        ),
        (
            "no-issuer-url",
            json!({"jwt": [{"issuer": {}, "claimMappings": {}}]}),
            Some("spec.jwt[0].issuer.url: Required value"),
        ),
    ];
    for (name, spec, want) in cases {
        match (attempt(name, spec).await, want) {
            (Ok(_), None) => {}
            (Err(kube::Error::Api(e)), Some(want)) => {
                assert_eq!(e.code, 422, "{name}: {e:?}");
                assert!(e.message.contains(want), "{name}: {}", e.message);
            }
            (got, want) => panic!("{name}: got {got:?}, wanted {want:?}"),
        }
    }
}
