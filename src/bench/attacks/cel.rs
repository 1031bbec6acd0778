//! The `cel` attack of `bench --only attacks`: a CEL rule cubic in the length of a list. alice
//! (given cluster rights in A, which defining a CRD needs) tries it over an unbounded list, then
//! ever shorter `maxItems` until the cost estimate admits it, and sends dry-run creates with
//! full lists from 4 connections; each evaluation ends at the runtime cost limit at most.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use http::{Method, StatusCode};
use https_client::{ClientConfig, Connection};
use serde_json::json;

use super::Tenant;
use crate::bench::ms;

/// The rule: cubic in the length of `spec.l`.
const CUBIC_RULE: &str = "self.l.all(a, self.l.all(b, self.l.all(c, a + b + c >= 0)))";

/// Connections alice sends dry-run creates from.
const CONNECTIONS: usize = 4;

/// The CRD, `spec.l` bounded by `max_items` when given.
fn crd(max_items: Option<u64>) -> Vec<u8> {
    let mut l = json!({"type": "array", "items": {"type": "integer"}});
    if let Some(n) = max_items {
        l["maxItems"] = json!(n);
    }
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "cubes.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "cubes", "singular": "cube", "kind": "Cube"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": {"l": l},
                                            "x-kubernetes-validations": [{"rule": CUBIC_RULE}]}}}}}]}}))
    .unwrap_or_default()
}

/// What the attack set up and counted.
pub(super) struct Prepared {
    /// CRDs refused (422) before one was admitted.
    crd_refused: usize,
    /// The `maxItems` of the admitted CRD.
    max_items: u64,
    /// How long one dry-run create took on the quiet server.
    one_alone: Duration,
    path: String,
    body: Vec<u8>,
    sent: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

/// Gives alice cluster rights in A, defines the costliest admitted CRD and waits until it is
/// served.
pub(super) async fn prepare(
    admin: &mut Connection,
    client: &ClientConfig,
    a: &str,
) -> anyhow::Result<Prepared> {
    let rbac = format!("/clusters/{a}/apis/rbac.authorization.k8s.io/v1");
    crate::bench::broker::post(
        admin,
        &format!("{rbac}/clusterroles"),
        json!({"metadata": {"name": "everything"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await?;
    crate::bench::broker::post(
        admin,
        &format!("{rbac}/clusterrolebindings"),
        json!({"metadata": {"name": "alice"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "everything"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]}),
    )
    .await?;
    let mut alice = Tenant::new(client, "alice-token").await?;
    let crds = format!("/clusters/{a}/apis/apiextensions.k8s.io/v1/customresourcedefinitions");
    // Unbounded first, then ever shorter lists: the first admitted is the costliest the
    // estimate lets through (to within 10 items).
    let mut crd_refused = 0;
    let mut max_items = None;
    for max in std::iter::once(None).chain((1..=50).rev().map(|i| Some(i * 10))) {
        let s = alice
            .send(Method::POST, &crds, "application/json", crd(max))
            .await?;
        if s == StatusCode::CREATED {
            max_items = Some(max.unwrap_or(u64::MAX));
            break;
        }
        crd_refused += 1;
    }
    let max_items = max_items.ok_or_else(|| anyhow!("no cubic-rule CRD was admitted"))?;
    if max_items == u64::MAX {
        return Err(anyhow!(
            "the cubic rule over an unbounded list was admitted"
        ));
    }
    let path = format!("/clusters/{a}/apis/example.com/v1/namespaces/default/cubes?dryRun=All");
    let body = serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "Cube",
        "metadata": {"name": "c"}, "spec": {"l": (0..max_items).collect::<Vec<_>>()}}))?;
    let started = Instant::now();
    let one_alone = loop {
        let t = Instant::now();
        let s = alice
            .send(Method::POST, &path, "application/json", body.clone())
            .await?;
        if s != StatusCode::NOT_FOUND {
            break t.elapsed();
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(anyhow!("the cubic-rule CRD is not served"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Ok(Prepared {
        crd_refused,
        max_items,
        one_alone,
        path,
        body,
        sent: Arc::new(AtomicUsize::new(0)),
        refused: Arc::new(AtomicUsize::new(0)),
    })
}

/// The dry-run creates from [`CONNECTIONS`] connections, until stopped.
pub(super) fn attack(
    client: &ClientConfig,
    p: &Prepared,
) -> impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static {
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            (
                client.clone(),
                p.path.clone(),
                p.body.clone(),
                p.sent.clone(),
                p.refused.clone(),
            )
        })
        .collect();
    async move {
        let handles: Vec<_> = tasks
            .into_iter()
            .map(|(c, path, body, sent, refused)| {
                tokio::spawn(super::refused_loop(
                    c,
                    Method::POST,
                    path,
                    "application/json",
                    body,
                    sent,
                    refused,
                ))
            })
            .collect();
        for h in handles {
            h.await??;
        }
        Ok(())
    }
}

/// What alice did, for the row.
pub(super) fn said(p: &Prepared) -> String {
    format!(
        "{} cubic-rule CRDs refused 422, admitted at maxItems {}; {} dry-run creates of {} integers (one alone {}), {} refused 422",
        p.crd_refused,
        p.max_items,
        p.sent.load(Ordering::Relaxed),
        p.max_items,
        ms(p.one_alone),
        p.refused.load(Ordering::Relaxed)
    )
}

/// The row's label.
pub(super) fn label() -> String {
    format!("a CEL rule cubic in a list, then dry-run creates from {CONNECTIONS} connections")
}
