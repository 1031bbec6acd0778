//! kcp's per-workspace authentication end to end: a WorkspaceType that lists
//! WorkspaceAuthenticationConfigurations admits the users of their issuers into its workspaces
//! and nowhere else, through kcp's filters, with the issuers' keys fetched over HTTPS from the
//! issuer's discovery document (a [`DevIssuer`] here); and the JWT authenticator itself
//! against the real kube-apiserver (kcp builds workspace authenticators with kube's code), given
//! the same authenticator in its `--authentication-config`.

mod common;

use std::sync::atomic::Ordering;

use apiserver::access::workspace_authn::issuer::DevIssuer;
use http::Method;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

const KEY: &str = include_str!("../apiserver/src/access/workspace_authn/testdata/issuer-key.pem");
const OTHER_KEY: &str =
    include_str!("../apiserver/src/access/workspace_authn/testdata/other-key.pem");

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

/// The CA of `env`'s serving certificate.
fn ca_of(env: &common::KubeEnv) -> String {
    std::fs::read_to_string(env.dir.path().join("data/pki/ca.crt")).expect("ca")
}

/// `(status, body)` of a request with `token` as its bearer token.
async fn with_token(
    env: &common::KubeEnv,
    token: &str,
    method: Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    common::with_bearer(env.server.address, &ca_of(env), token, method, path, &body).await
}

/// Who the server at `address` takes `token` for (a SelfSubjectReview under `prefix`, e.g.
/// `/clusters/<path>`), or the status code it refuses it with.
async fn whoami_at(
    address: std::net::SocketAddr,
    ca: &str,
    prefix: &str,
    token: &str,
) -> Result<Value, u16> {
    let (code, body) = common::with_bearer(
        address,
        ca,
        token,
        Method::POST,
        &format!("{prefix}/apis/authentication.k8s.io/v1/selfsubjectreviews"),
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .await;
    match code {
        201 | 200 => Ok(body["status"]["userInfo"].clone()),
        c => Err(c),
    }
}

/// Who `env` takes `token` for in workspace `path`, or the status code it refuses it with.
async fn whoami(env: &common::KubeEnv, token: &str, path: &str) -> Result<Value, u16> {
    whoami_at(
        env.server.address,
        &ca_of(env),
        &format!("/clusters/{path}"),
        token,
    )
    .await
}

/// Waits (up to 10 s) until `token` is refused in workspace `path` with 401: a changed type or
/// configuration reaches the authenticators through the server's watch cache, a moment after
/// the write that changed it (as on kcp, through its informers).
async fn until_refused(env: &common::KubeEnv, token: &str, path: &str, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = whoami(env, token, path).await;
        if answer == Err(401) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: still {answer:?} after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
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
    // As an admin of team, the user creates a child workspace of a type in root:corp, where a
    // user of the same name may use every type (as a global user `oidc:ann@acme.io` could be
    // granted): the issuer's user is not that user there, but anonymous, and is refused.
    create(corp(), &ar("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "type-users"},
        "rules": [{"apiGroups": ["tenancy.kcp.io"], "resources": ["workspacetypes"], "verbs": ["use"]}],
    }))
    .await;
    create(corp(), &ar("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings"), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "type-users"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "type-users"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "oidc:ann@acme.io"}],
    }))
    .await;
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
    until_refused(
        &env,
        &ann,
        "root:corp:team",
        "ann once the type drops her issuer",
    )
    .await;
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
    until_refused(
        &env,
        &bob,
        "root:corp:team",
        "bob once the type names a missing configuration",
    )
    .await;
}

/// A tenant's issuer serving the costliest key set the server fetches (1 MiB: some 745 keys of
/// 8192 bits with the largest exponent kube takes), and tokens naming no key with garbage
/// signatures, which anyone can send: each is refused quickly (a few verifications, not one per
/// key and then again after a fetch), several senders at once do not hold up another issuer's
/// users, and the set is not fetched again for every token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_issuers_key_set_costs_a_few_verifications_per_token() {
    let env = common::KubeEnv::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let any = "127.0.0.1:0".parse().expect("addr");
    let acme = DevIssuer::start(&dir.path().join("acme"), any, "/realms/acme", KEY)
        .await
        .expect("issuer");
    let jwks = apiserver::access::workspace_authn::issuer::hostile_jwks(
        apiserver::access::workspace_authn::fetch::MAX_BODY,
    );
    assert!(jwks["keys"].as_array().expect("keys").len() > 700);
    let hostile =
        DevIssuer::start_with_keys(&dir.path().join("hostile"), any, "", OTHER_KEY, Some(jwks))
            .await
            .expect("issuer");

    env.workspace("root", "corp", "universal").await;
    let corp = || env.client("root:corp");
    for (name, issuer, audience) in [("acme", &acme, "portal"), ("hostile", &hostile, "x")] {
        create(corp(), &auth_configs(), json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
            "metadata": {"name": name},
            "spec": {"jwt": [jwt(issuer, json!({"claim": "sub", "prefix": ""}),
                                 json!({"claim": "groups", "prefix": ""}), &[audience])]},
        }))
        .await;
        create(
            corp(),
            &workspace_types(),
            json!({
                "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
                "metadata": {"name": format!("with-{name}")},
                "spec": {"extend": {"with": [{"name": "universal", "path": "root"}]},
                         "authenticationConfigurations": [{"name": name}]},
            }),
        )
        .await;
    }
    env.workspace("root:corp", "team", "root:corp:with-acme")
        .await;
    env.workspace("root:corp", "evil", "root:corp:with-hostile")
        .await;
    let ann = acme
        .token(&json!({"aud": "portal", "sub": "ann"}))
        .expect("token");
    assert!(whoami(&env, &ann, "root:corp:team").await.is_ok());

    // The first garbage token fetches the set; the next ones are refused within a few
    // verifications each.
    let garbage = apiserver::access::workspace_authn::issuer::garbage_token(hostile.url());
    assert_eq!(whoami(&env, &garbage, "root:corp:evil").await, Err(401));
    let fetched = hostile.requests.load(Ordering::Relaxed);
    assert_eq!(fetched, 2, "discovery and keys");
    let mut slowest = std::time::Duration::ZERO;
    for _ in 0..10 {
        let started = std::time::Instant::now();
        assert_eq!(whoami(&env, &garbage, "root:corp:evil").await, Err(401));
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < std::time::Duration::from_millis(200),
        "a garbage token took {slowest:?}"
    );

    // Four senders of garbage at once, while ann keeps being admitted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (stop, address, ca, garbage) = (
            stop.clone(),
            env.server.address,
            ca_of(&env),
            garbage.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut refused = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let answer = whoami_at(address, &ca, "/clusters/root:corp:evil", &garbage).await;
                assert_eq!(answer, Err(401));
                refused += 1;
            }
            refused
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut ann_slowest = std::time::Duration::ZERO;
    for _ in 0..20 {
        let started = std::time::Instant::now();
        assert!(whoami(&env, &ann, "root:corp:team").await.is_ok());
        ann_slowest = ann_slowest.max(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for s in senders {
        refused += s.await.expect("sender");
    }
    eprintln!(
        "garbage tokens: slowest alone {slowest:?}; {refused} refused by 4 senders; \
         ann's slowest meanwhile {ann_slowest:?}"
    );
    assert!(
        ann_slowest < std::time::Duration::from_millis(500),
        "ann waited {ann_slowest:?} while garbage tokens were checked"
    );
    // Refused tokens do not refetch the set more than every ten seconds.
    assert!(hostile.requests.load(Ordering::Relaxed) <= fetched + 2);
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

/// One token of the conformance table: its name and claims (`iss`, `iat`, `exp` added by the
/// issuer unless given; `key: other` signs with a key the issuer does not publish).
fn conformance_tokens(now: u64) -> Vec<(&'static str, Value)> {
    let ok = json!({"aud": "portal", "email": "ann@acme.io", "email_verified": true, "sub": "u1",
                    "tenant": "acme", "level": 3, "groups": ["a", "b"], "team": "blue", "jti": "j1"});
    let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut c = ok.clone();
        f(c.as_object_mut().expect("object"));
        c
    };
    vec![
        ("accepted", ok.clone()),
        (
            "groups-as-a-string",
            with(&|c| {
                c.insert("groups".into(), json!("a"));
            }),
        ),
        (
            "no-groups",
            with(&|c| {
                c.remove("groups");
            }),
        ),
        (
            "audience-among-others",
            with(&|c| {
                c.insert("aud".into(), json!(["x", "kubectl"]));
            }),
        ),
        (
            "no-accepted-audience",
            with(&|c| {
                c.insert("aud".into(), json!(["x"]));
            }),
        ),
        (
            "expired",
            with(&|c| {
                c.insert("exp".into(), json!(now - 60));
            }),
        ),
        (
            "not-before-in-an-hour",
            with(&|c| {
                c.insert("nbf".into(), json!(now + 3600));
            }),
        ),
        (
            "not-before-within-leeway",
            with(&|c| {
                c.insert("nbf".into(), json!(now + 60));
            }),
        ),
        (
            "email-not-verified",
            with(&|c| {
                c.insert("email_verified".into(), json!(false));
            }),
        ),
        (
            "email-verified-as-a-string",
            with(&|c| {
                c.insert("email_verified".into(), json!("true"));
            }),
        ),
        (
            "no-email-verified",
            with(&|c| {
                c.remove("email_verified");
            }),
        ),
        (
            "no-email",
            with(&|c| {
                c.remove("email");
            }),
        ),
        (
            "email-not-a-string",
            with(&|c| {
                c.insert("email".into(), json!(["ann@acme.io"]));
            }),
        ),
        (
            "tenant-differs",
            with(&|c| {
                c.insert("tenant".into(), json!("other"));
            }),
        ),
        (
            "no-tenant",
            with(&|c| {
                c.remove("tenant");
            }),
        ),
        (
            "level-too-low",
            with(&|c| {
                c.insert("level".into(), json!(1));
            }),
        ),
        (
            "banned-user",
            with(&|c| {
                c.insert("email".into(), json!("banned@acme.io"));
            }),
        ),
        (
            "no-sub-for-uid",
            with(&|c| {
                c.remove("sub");
            }),
        ),
        (
            "groups-of-numbers",
            with(&|c| {
                c.insert("groups".into(), json!([1, 2]));
            }),
        ),
        (
            "team-as-a-list",
            with(&|c| {
                c.insert("team".into(), json!(["x", "y"]));
            }),
        ),
        (
            "no-team",
            with(&|c| {
                c.remove("team");
            }),
        ),
        (
            "another-issuer",
            with(&|c| {
                c.insert("iss".into(), json!("https://127.0.0.1:1/other"));
            }),
        ),
        (
            "another-key",
            with(&|c| {
                c.insert("key".into(), json!("other"));
            }),
        ),
    ]
}

/// The JWT authenticator both servers are given.
fn conformance_authenticator(issuer: &DevIssuer) -> Value {
    json!({
        "issuer": {"url": issuer.url(), "certificateAuthority": issuer.ca_pem,
                   "audiences": ["portal", "kubectl"], "audienceMatchPolicy": "MatchAny"},
        "claimValidationRules": [
            {"claim": "tenant", "requiredValue": "acme"},
            {"expression": "claims.level >= 2", "message": "level too low"}],
        "claimMappings": {
            "username": {"claim": "email", "prefix": "oidc:"},
            "groups": {"claim": "groups", "prefix": "g:"},
            "uid": {"claim": "sub"},
            "extra": [{"key": "acme.io/team", "valueExpression": "has(claims.team) ? claims.team : []"}]},
        "userValidationRules": [
            {"expression": "!user.username.startsWith('oidc:banned')", "message": "banned"}],
    })
}

/// What a server made of a token: refused, or the user without what only one side adds
/// (`system:authenticated`, kcp's scope extras).
fn comparable(answer: Result<Value, u16>) -> Value {
    match answer {
        Err(code) => json!({"refused": code}),
        Ok(user) => {
            let groups: Vec<&Value> = user["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|g| *g != "system:authenticated")
                .collect();
            let mut extra = user["extra"].as_object().cloned().unwrap_or_default();
            extra.retain(|k, _| !k.starts_with("authentication.kcp.io/"));
            json!({"username": user["username"], "uid": user["uid"], "groups": groups, "extra": extra})
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_authenticators_map_tokens_as_kube_apiserver_maps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let issuer = DevIssuer::start(
        &dir.path().join("issuer"),
        "127.0.0.1:0".parse().expect("addr"),
        "/realms/acme",
        KEY,
    )
    .await
    .expect("issuer");
    let other = apiserver::access::workspace_authn::issuer::Signer::new(issuer.url(), OTHER_KEY)
        .expect("signer");
    let config = dir.path().join("authentication-config.yaml");
    std::fs::write(
        &config,
        serde_json::to_string(&json!({
            "apiVersion": "apiserver.config.k8s.io/v1beta1", "kind": "AuthenticationConfiguration",
            "jwt": [conformance_authenticator(&issuer)],
        }))
        .expect("json"),
    )
    .expect("write config");
    let kube = common::kube_apiserver::KubeApiserver::start_with(&[
        "--authentication-config".to_string(),
        config.display().to_string(),
    ]);

    let env = common::KubeEnv::start().await;
    env.workspace("root", "corp", "universal").await;
    create(
        env.client("root:corp"),
        &auth_configs(),
        json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
            "metadata": {"name": "acme"}, "spec": {"jwt": [conformance_authenticator(&issuer)]},
        }),
    )
    .await;
    create(
        env.client("root:corp"),
        &workspace_types(),
        json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
            "metadata": {"name": "acme"},
            "spec": {"extend": {"with": [{"name": "universal", "path": "root"}]},
                     "authenticationConfigurations": [{"name": "acme"}]},
        }),
    )
    .await;
    env.workspace("root:corp", "team", "root:corp:acme").await;

    let (kube_address, kube_ca) = (kube.address, kube.pki.ca_cert_pem().to_string());
    let kube_whoami = |token: String| {
        let ca = kube_ca.clone();
        async move { whoami_at(kube_address, &ca, "", &token).await }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let tokens: Vec<(&str, String)> = conformance_tokens(now)
        .into_iter()
        .map(|(name, mut claims)| {
            let signer = match claims.as_object_mut().and_then(|c| c.remove("key")) {
                Some(_) => &other,
                None => &issuer.signer,
            };
            (name, signer.token(&claims).expect("token"))
        })
        .collect();
    // kube-apiserver starts its authenticator asynchronously: wait for the accepted token.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while kube_whoami(tokens[0].1.clone()).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "kube-apiserver never accepted a token of the issuer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let mut differences = Vec::new();
    let mut accepted = 0;
    for (name, token) in &tokens {
        let theirs = comparable(kube_whoami(token.clone()).await);
        let ours = comparable(whoami(&env, token, "root:corp:team").await);
        accepted += usize::from(theirs.get("refused").is_none());
        if theirs != ours {
            differences.push(format!("{name}: kube-apiserver {theirs}, serve {ours}"));
        }
    }
    assert!(
        differences.is_empty(),
        "workspace authentication differs from kube-apiserver's:\n  {}",
        differences.join("\n  ")
    );
    // The table is worth something only if both answers occur.
    assert!(
        (5..tokens.len() - 5).contains(&accepted),
        "{accepted} of {} tokens accepted",
        tokens.len()
    );
}
