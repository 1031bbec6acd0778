//! The `jwks` attack of `bench --only attacks` ([`crate::bench::attacks`]): a tenant's issuer
//! made as costly to check as the server lets it be, and tokens anyone can send.
//!
//! The admin gives workspace A a WorkspaceType whose WorkspaceAuthenticationConfiguration
//! trusts an issuer run by this bench, and a workspace `evil` of that type. The issuer's key set
//! is as large as the server fetches (1 MiB: some 745 keys of 8192 bits with the largest
//! exponent kube takes, [`hostile_jwks`]). The attack: [`CONNECTIONS`] connections sending, in
//! a closed loop, tokens of that issuer naming no key with garbage signatures to `evil`, each
//! answered 401. Without bounds, each such token was checked against every key, twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use apiserver::access::workspace_authn::fetch::MAX_BODY;
use apiserver::access::workspace_authn::issuer::{garbage_token, hostile_jwks, DevIssuer};
use http::{Method, StatusCode};
use https_client::ClientConfig;
use serde_json::json;

/// Connections sending garbage tokens.
pub(crate) const CONNECTIONS: usize = 8;
/// A key the issuer holds (it signs nothing here: its set is the hostile one).
const KEY: &str = include_str!("../../apiserver/src/access/workspace_authn/testdata/other-key.pem");

/// What the attack needs while it runs.
pub(crate) struct Prepared {
    /// The issuer; it serves until dropped.
    pub issuer: DevIssuer,
    /// The workspace path the tokens are sent to.
    pub path: String,
    /// Tokens answered 401 so far.
    pub refused: Arc<AtomicUsize>,
    /// Keys in the issuer's set.
    pub keys: usize,
}

/// Starts the hostile issuer (its certificates in `dir`) and makes workspace `evil` of A
/// (cluster `a`) authenticate with it.
pub(crate) async fn prepare(
    admin: &mut https_client::Connection,
    client: &ClientConfig,
    a: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Prepared> {
    let jwks = hostile_jwks(MAX_BODY);
    let keys = jwks["keys"].as_array().map_or(0, Vec::len);
    let issuer = DevIssuer::start_with_keys(
        &dir.join("issuer"),
        "127.0.0.1:0".parse()?,
        "",
        KEY,
        Some(jwks),
    )
    .await?;
    let tenancy = format!("/clusters/{a}/apis/tenancy.kcp.io/v1alpha1");
    crate::bench::broker::post(
        admin,
        &format!("{tenancy}/workspaceauthenticationconfigurations"),
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceAuthenticationConfiguration",
               "metadata": {"name": "hostile"},
               "spec": {"jwt": [{
                   "issuer": {"url": issuer.url(), "certificateAuthority": issuer.ca_pem,
                              "audiences": ["x"], "audienceMatchPolicy": "MatchAny"},
                   "claimMappings": {"username": {"claim": "sub", "prefix": ""}}}]}}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("{tenancy}/workspacetypes"),
        json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
               "metadata": {"name": "hostile"},
               "spec": {"extend": {"with": [{"name": "universal", "path": "root"}]},
                        "authenticationConfigurations": [{"name": "hostile"}]}}),
    )
    .await?;
    let workspace = wait_for_type(admin, &tenancy, a).await?;
    let path = format!("/clusters/{workspace}/api/v1/namespaces/default/configmaps");
    // The first token fetches the set; the window measures the tokens after it.
    let refused = Arc::new(AtomicUsize::new(0));
    let mut conn = client.connect().await?;
    let status = send(&mut conn, &path, &garbage_token(issuer.url())).await?;
    if status != StatusCode::UNAUTHORIZED {
        return Err(anyhow!("a garbage token was answered {status}"));
    }
    if issuer.requests.load(Ordering::Relaxed) < 2 {
        return Err(anyhow!("the server did not fetch the issuer's key set"));
    }
    Ok(Prepared {
        issuer,
        path,
        refused,
        keys,
    })
}

/// Creates workspace `evil` of type `hostile` in A (retrying while the type is not yet seen)
/// and waits until it is ready; its cluster.
async fn wait_for_type(
    admin: &mut https_client::Connection,
    tenancy: &str,
    a: &str,
) -> anyhow::Result<String> {
    let body = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
                      "metadata": {"name": "evil"},
                      "spec": {"type": {"name": "hostile", "path": a}}});
    let mut tries = 0;
    loop {
        match crate::bench::broker::post(admin, &format!("{tenancy}/workspaces"), body.clone())
            .await
        {
            Ok(()) => break,
            Err(e) if tries < 50 => {
                tries += 1;
                tracing::debug!(error = %e, "workspace evil not created yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    let path = format!("{tenancy}/workspaces/evil");
    crate::bench::broker::wait_ready(admin, &path, |w| w["status"]["phase"] == "Ready").await?;
    let ws = admin.get(&path).await?.json();
    ws["spec"]["cluster"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("workspace evil has no cluster"))
}

async fn send(
    conn: &mut https_client::Connection,
    path: &str,
    token: &str,
) -> anyhow::Result<StatusCode> {
    let auth = format!("Bearer {token}");
    let r = conn
        .send_with_headers(
            Method::GET,
            path,
            &[("authorization", &auth), ("accept", "application/json")],
            Vec::new(),
        )
        .await?;
    Ok(r.status)
}

/// The attack: [`CONNECTIONS`] connections sending garbage tokens of the issuer at `url` to
/// `path` until stopped, counting the 401s.
pub(crate) async fn attack(
    client: ClientConfig,
    path: String,
    url: String,
    refused: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        tasks.push(tokio::spawn(send_loop(
            client.clone(),
            path.clone(),
            garbage_token(&url),
            refused.clone(),
        )));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Sends `token` to `path` in a loop on one connection until stopped, counting the 401s.
async fn send_loop(
    client: ClientConfig,
    path: String,
    token: String,
    refused: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut conn = client.connect().await?;
    loop {
        match send(&mut conn, &path, &token).await {
            Ok(StatusCode::UNAUTHORIZED) => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok(s) => return Err(anyhow!("a garbage token was answered {s}")),
            // A 401 may close the connection: open another.
            Err(_) => conn = client.connect().await?,
        }
    }
}

/// What the row says of the attack.
pub(crate) fn said(p: &Prepared, seconds: u64) -> String {
    format!(
        "{} keys of 8192 bits in the issuer's set, {:.0} garbage tokens/s answered 401 from {CONNECTIONS} connections, {} fetches of the set",
        p.keys,
        p.refused.load(Ordering::Relaxed) as f64 / seconds.max(1) as f64,
        p.issuer.requests.load(Ordering::Relaxed) / 2,
    )
}

/// The row's label.
pub(crate) fn label() -> String {
    format!(
        "a tenant's issuer serving 1 MiB of 8192-bit keys, kid-less garbage tokens from {CONNECTIONS} connections"
    )
}
