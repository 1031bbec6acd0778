//! kcp's permission claims: an APIExport claims resources it does not define (secrets,
//! namespaces, another export's types), an APIBinding accepts or rejects each claim with a label
//! selector, and the export's virtual workspace then reaches exactly the accepted, selected
//! objects of the binding's workspace with the verbs both sides allow.
//!
//! Which objects are reachable is decided by a label the server alone writes: every write in a
//! workspace gets, per accepting binding whose selector matches the object, the label
//! `claimed.internal.apis.kcp.io/<hash of "exportCluster:export">` = `<hash of the claim>`
//! (kcp's key and value, base-62 SHA-224, so they agree with a real kcp's), and loses any other
//! label under that prefix. When a binding's accepted claims change, the objects of the
//! resources concerned are relabelled and the binding's `PermissionClaimsApplied` condition
//! says when that finished. The virtual workspace filters by that label and never by anything a
//! tenant wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha224};

use super::Tenancy;
use crate::meta::selectors::{LabelSelector, Operator, Requirement};
use crate::registry::objects::{self, meta_mut};
use crate::storage::{list_all, StorageError};

/// Prefix of the label keys the server sets on claimed objects.
pub const CLAIM_LABEL_PREFIX: &str = "claimed.internal.apis.kcp.io/";
pub use crate::registry::kcp_types::V2_CLAIMS_ANNOTATION;
/// How many relabelling writes run at once (group commit batches them).
const RELABEL_CONCURRENCY: usize = 64;

/// Resources that are never stored, so never labelled (claimable nonetheless).
const NOT_PERSISTED: &[(&str, &str)] = &[
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authentication.k8s.io", "tokenreviews"),
];

/// `bytes` as a base-62 number (digits `0-9a-zA-Z`, no leading zeros), as Go's
/// `big.Int.Text(62)` writes it.
fn base62(bytes: &[u8]) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut number: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
    let mut out = Vec::new();
    while !number.is_empty() {
        let mut remainder = 0u32;
        let mut quotient = Vec::with_capacity(number.len());
        for b in &number {
            let acc = (remainder << 8) | u32::from(*b);
            let q = acc / 62;
            remainder = acc % 62;
            if !(quotient.is_empty() && q == 0) {
                quotient.push(q as u8);
            }
        }
        out.push(DIGITS[remainder as usize]);
        number = quotient;
    }
    if out.is_empty() {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn hash62(data: &[u8]) -> String {
    base62(&Sha224::digest(data))
}

/// The label key of every claim of export `export` in logical cluster `export_cluster`.
pub fn claim_label_key(export_cluster: &str, export: &str) -> String {
    format!(
        "{CLAIM_LABEL_PREFIX}{}",
        hash62(format!("{export_cluster}:{export}").as_bytes())
    )
}

/// The value put on APIBindings of an export, so its owner always sees them.
pub fn reflexive_value() -> String {
    let bytes: Vec<u8> = (0..28u8).map(|i| i % 10).collect();
    base62(&bytes)
}

/// One claimed resource: group, resource and the identity of the export defining it (empty for
/// built-in types).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimedResource {
    /// API group, empty for core.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Identity hash of the defining export; empty for built-in types.
    pub identity_hash: String,
}

impl ClaimedResource {
    fn from_json(v: &Value) -> Self {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        ClaimedResource {
            group: s("group"),
            resource: s("resource"),
            identity_hash: s("identityHash"),
        }
    }

    /// The label value of this claim (the claim hashed without its verbs, as kcp hashes it).
    pub fn label_value(&self) -> String {
        // Go's encoding of the claim: group omitted when empty, verbs null, identity omitted
        // when empty, in this field order.
        let mut text = String::from("{");
        if !self.group.is_empty() {
            text.push_str(&format!("\"group\":{},", json!(self.group)));
        }
        text.push_str(&format!(
            "\"resource\":{},\"verbs\":null",
            json!(self.resource)
        ));
        if !self.identity_hash.is_empty() {
            text.push_str(&format!(",\"identityHash\":{}", json!(self.identity_hash)));
        }
        text.push('}');
        hash62(text.as_bytes())
    }

    /// The storage key prefix of this resource's objects in `cluster`.
    pub fn prefix(&self, cluster: &str) -> String {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        match self.identity_hash.is_empty() {
            true => format!("/{group}/{}/{cluster}/", self.resource),
            false => format!(
                "/{group}/{}:{}/{cluster}/",
                self.resource, self.identity_hash
            ),
        }
    }

    /// The claimed resource a served resource is (its identity read from its storage name).
    pub fn of(resource: &crate::registry::Resource) -> Self {
        let storage = resource
            .all_clusters_prefix()
            .split('/')
            .nth(2)
            .unwrap_or("");
        ClaimedResource {
            group: resource.ty.group.clone(),
            resource: resource.ty.plural.clone(),
            identity_hash: storage
                .split_once(':')
                .map(|(_, id)| id.to_string())
                .unwrap_or_default(),
        }
    }
}

/// One claim of an APIExport, with the verbs it asks for (`*` = any).
#[derive(Clone, Debug, PartialEq)]
pub struct ExportClaim {
    /// What is claimed.
    pub claimed: ClaimedResource,
    /// The verbs asked for.
    pub verbs: Vec<String>,
}

/// The claims of an APIExport as stored (v1alpha1, with the v1alpha2 verbs in an annotation; a
/// claim without verbs asks for all, as kcp converts it).
pub fn export_claims(export: &Value) -> Vec<ExportClaim> {
    let v2: Vec<Value> = export["metadata"]["annotations"][V2_CLAIMS_ANNOTATION]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    let mut out: Vec<ExportClaim> = Vec::new();
    for c in export["spec"]["permissionClaims"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let claimed = ClaimedResource::from_json(c);
        if claimed.resource.is_empty() || out.iter().any(|o| o.claimed == claimed) {
            continue;
        }
        let verbs = c["verbs"]
            .as_array()
            .or_else(|| {
                v2.iter()
                    .find(|x| ClaimedResource::from_json(x) == claimed)
                    .and_then(|x| x["verbs"].as_array())
            })
            .map(|vs| {
                vs.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter(|vs| !vs.is_empty())
            .unwrap_or_else(|| vec!["*".to_string()]);
        out.push(ExportClaim { claimed, verbs });
    }
    out
}

/// A label selector of an accepted claim.
#[derive(Clone, Debug)]
pub enum ClaimSelector {
    /// `matchAll: true` (or v1alpha1's `all: true`).
    All,
    /// `matchLabels` / `matchExpressions`.
    Labels(LabelSelector),
    /// Neither: selects nothing.
    Nothing,
}

impl ClaimSelector {
    /// Reads a binding claim's selector.
    pub fn from_claim(claim: &Value) -> Result<Self, String> {
        let sel = &claim["selector"];
        if sel["matchAll"] == true || claim["all"] == true {
            return Ok(ClaimSelector::All);
        }
        let mut requirements = Vec::new();
        if let Some(labels) = sel["matchLabels"].as_object() {
            for (k, v) in labels {
                let value = v.as_str().unwrap_or("").to_string();
                requirements.push(
                    Requirement::new(k, Operator::Equals, vec![value])
                        .map_err(|e| e.to_string())?,
                );
            }
        }
        for e in sel["matchExpressions"].as_array().into_iter().flatten() {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            let op = match e["operator"].as_str().unwrap_or("") {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("unsupported operator {other:?}")),
            };
            requirements.push(Requirement::new(key, op, values).map_err(|e| e.to_string())?);
        }
        Ok(match requirements.is_empty() {
            true => ClaimSelector::Nothing,
            false => ClaimSelector::Labels(LabelSelector::from_requirements(requirements)),
        })
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        match self {
            ClaimSelector::All => true,
            ClaimSelector::Labels(s) => s.matches(labels),
            ClaimSelector::Nothing => false,
        }
    }

    /// The labels an object must carry (`matchLabels`), which a virtual-workspace write adds.
    pub fn required_labels(claim: &Value) -> BTreeMap<String, String> {
        claim["selector"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
            .collect()
    }
}

/// A claim in force in one workspace: present in the export and accepted by a binding there.
#[derive(Clone, Debug)]
pub struct AcceptedClaim {
    /// The accepting APIBinding.
    pub binding: String,
    /// The export's logical cluster and name.
    pub export_cluster: String,
    /// The export's name.
    pub export: String,
    /// What is claimed.
    pub claimed: ClaimedResource,
    /// The label key and value objects get.
    pub key: String,
    /// See `key`.
    pub value: String,
    /// The binding's claim as written (verbs, selector), for status and comparisons.
    pub raw: Value,
    /// The binding's selector.
    pub selector: ClaimSelector,
    /// The verbs both the export and the binding allow.
    pub verbs: Vec<String>,
}

impl AcceptedClaim {
    /// Whether the claim lets `verb` through (kcp: the request's verb or `*` must be in the
    /// intersection of both sides' verbs).
    pub fn allows(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb || v == "*")
    }

    /// What decides which objects carry the label: a change here means relabelling.
    fn signature(&self) -> (String, String, ClaimedResource, String) {
        (
            self.key.clone(),
            self.value.clone(),
            self.claimed.clone(),
            self.raw["selector"].to_string() + &self.raw["all"].to_string(),
        )
    }
}

/// The relabelling of one logical cluster: whether a worker runs, and what it has yet to do.
#[derive(Default)]
pub(crate) struct RelabelWork {
    running: bool,
    /// Resources to relabel in the next round; `Some` (maybe empty: the bindings' status only)
    /// when a round is due.
    pending: Option<BTreeSet<ClaimedResource>>,
}

/// The state and verbs of a binding's claims, as the binding wrote them.
fn binding_claims(binding: &Value) -> Vec<(ClaimedResource, Value)> {
    binding["spec"]["permissionClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (ClaimedResource::from_json(c), c.clone()))
        .collect()
}

fn intersect(binding: &[String], export: &[String]) -> Vec<String> {
    let b: BTreeSet<&String> = binding.iter().collect();
    export.iter().filter(|v| b.contains(v)).cloned().collect()
}

fn verbs_of(claim: &Value) -> Vec<String> {
    match claim["verbs"].as_array() {
        Some(vs) => vs
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        // A v1alpha1 acceptance has no verbs: it accepts whatever the export asks.
        None => vec!["*".to_string()],
    }
}

/// The accepted claims of one binding against its export.
pub fn accepted_claims(
    binding_name: &str,
    binding: &Value,
    export_cluster: &str,
    export: &Value,
) -> Vec<AcceptedClaim> {
    let export_name = objects::name(export);
    let offered = export_claims(export);
    let key = claim_label_key(export_cluster, export_name);
    let mut out = Vec::new();
    for (claimed, raw) in binding_claims(binding) {
        if raw["state"] != "Accepted" {
            continue;
        }
        let Some(offer) = offered.iter().find(|o| o.claimed == claimed) else {
            continue;
        };
        let Ok(selector) = ClaimSelector::from_claim(&raw) else {
            continue;
        };
        let verbs = intersect(&verbs_of(&raw), &offer.verbs);
        // `*` on both sides is a wildcard; on one side only it is just a verb named `*`, as kcp
        // intersects them.
        out.push(AcceptedClaim {
            binding: binding_name.to_string(),
            export_cluster: export_cluster.to_string(),
            export: export_name.to_string(),
            value: claimed.label_value(),
            claimed,
            key: key.clone(),
            raw,
            selector,
            verbs,
        });
    }
    out
}

/// What a binding's claims look like against its export: the export's claims for
/// `status.exportPermissionClaims`, and the `PermissionClaimsValid` condition.
pub fn claims_status(binding: &Value, export: &Value, now: &str) -> (Vec<Value>, Option<Value>) {
    let offered = export_claims(export);
    let exported: Vec<Value> = offered
        .iter()
        .map(|o| {
            json!({"group": o.claimed.group, "resource": o.claimed.resource, "verbs": o.verbs,
                "identityHash": o.claimed.identity_hash})
        })
        .collect();
    let claims = binding_claims(binding);
    if offered.is_empty() && claims.is_empty() {
        return (exported, None);
    }
    // Accepted claims the export does not make (or that do not parse); verbs that differ are
    // no error (kcp v0.28 intersects them).
    let unexpected: Vec<String> = claims
        .iter()
        .filter(|(_, raw)| raw["state"] == "Accepted")
        .filter(|(claimed, raw)| {
            !offered.iter().any(|o| o.claimed == *claimed)
                || ClaimSelector::from_claim(raw).is_err()
        })
        .map(|(c, _)| {
            format!(
                "unexpected/invalid claim for {}.{} (identity {:?})",
                c.resource, c.group, c.identity_hash
            )
        })
        .collect();
    let condition = if unexpected.is_empty() {
        json!({"type": "PermissionClaimsValid", "status": "True", "lastTransitionTime": now})
    } else {
        let shown = &unexpected[..unexpected.len().min(10)];
        json!({"type": "PermissionClaimsValid", "status": "False", "severity": "Error",
            "reason": "InvalidPermissionClaims", "lastTransitionTime": now,
            "message": format!("{} unexpected and/or invalid permission claims (showing first {}): [{}]",
                unexpected.len(), shown.len(), shown.join(", "))})
    };
    (exported, Some(condition))
}

/// The claims a default binding (one a workspace type makes) accepts, as kcp's API binder
/// does: every claim of the export, with its `defaultSelector` or all objects.
pub fn default_acceptance(export: &Value) -> Vec<Value> {
    export_claims(export)
        .into_iter()
        .map(|c| {
            let selector = export["spec"]["permissionClaims"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|raw| ClaimedResource::from_json(raw) == c.claimed)
                .and_then(|raw| {
                    raw.get("defaultSelector")
                        .filter(|s| s.is_object())
                        .cloned()
                })
                .unwrap_or_else(|| json!({"matchAll": true}));
            json!({"group": c.claimed.group, "resource": c.claimed.resource,
                "identityHash": c.claimed.identity_hash, "verbs": c.verbs,
                "selector": selector, "state": "Accepted"})
        })
        .collect()
}

/// Defaults a binding's claims as kcp's schema does: group and identity hash empty.
pub fn default_binding_claims(binding: &mut Value) {
    let claims = binding
        .get_mut("spec")
        .and_then(|s| s.get_mut("permissionClaims"))
        .and_then(Value::as_array_mut);
    for c in claims
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        for f in ["group", "identityHash"] {
            c.entry(f).or_insert_with(|| json!(""));
        }
    }
}

/// The claim labels an object of `claimed` with `labels` must carry, given the workspace's
/// accepted claims.
pub fn expected_labels(
    claims: &[AcceptedClaim],
    claimed: &ClaimedResource,
    labels: Option<&Value>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if NOT_PERSISTED
        .iter()
        .any(|(g, r)| claimed.group == *g && claimed.resource == *r)
    {
        return out;
    }
    for c in claims {
        if c.claimed == *claimed && c.selector.matches(labels) {
            out.insert(c.key.clone(), c.value.clone());
        }
    }
    out
}

/// Sets an object's claim labels to `expected` (others under the prefix removed); whether
/// anything changed.
pub fn set_claim_labels(obj: &mut Value, expected: &BTreeMap<String, String>) -> bool {
    let current: BTreeMap<String, String> = obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(CLAIM_LABEL_PREFIX))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect();
    if current == *expected {
        return false;
    }
    let meta = meta_mut(obj);
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta.insert("labels".into(), Value::Object(Map::new()));
    }
    if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
        labels.retain(|k, _| !k.starts_with(CLAIM_LABEL_PREFIX));
        for (k, v) in expected {
            labels.insert(k.clone(), json!(v));
        }
        if labels.is_empty() {
            meta.remove("labels");
        }
    }
    true
}

/// The claim labels of an APIBinding: its claims', plus the reflexive value under its own
/// export's key so the export's owner sees every binding to it.
pub fn binding_labels(claims: &[AcceptedClaim], binding: &Value) -> BTreeMap<String, String> {
    let claimed = ClaimedResource {
        group: "apis.kcp.io".into(),
        resource: "apibindings".into(),
        identity_hash: String::new(),
    };
    let mut out = expected_labels(claims, &claimed, binding["metadata"].get("labels"));
    let export_cluster = binding["status"]["apiExportClusterName"]
        .as_str()
        .unwrap_or("");
    let export = binding["spec"]["reference"]["export"]["name"]
        .as_str()
        .unwrap_or("");
    if !export_cluster.is_empty() && !export.is_empty() {
        out.entry(claim_label_key(export_cluster, export))
            .or_insert_with(reflexive_value);
    }
    out
}

/// kcp's selector admission in an APIExport virtual workspace: a write through a claim whose
/// selector has `matchLabels` gets the labels it lacks (a different value is refused), and the
/// object written must then be selected by the claim.
pub struct SelectorAdmission {
    required: BTreeMap<String, String>,
    selector: ClaimSelector,
    inner: Arc<dyn crate::admission::Admission>,
}

impl SelectorAdmission {
    /// `inner`, behind the selector checks of `claim` (unchanged for `matchAll`).
    pub fn wrap(
        claim: &AcceptedClaim,
        inner: Arc<dyn crate::admission::Admission>,
    ) -> Arc<dyn crate::admission::Admission> {
        if matches!(claim.selector, ClaimSelector::All) {
            return inner;
        }
        Arc::new(SelectorAdmission {
            required: ClaimSelector::required_labels(&claim.raw),
            selector: claim.selector.clone(),
            inner,
        })
    }

    fn add_required(&self, obj: &mut Value) -> Result<(), crate::meta::status::ApiError> {
        let meta = meta_mut(obj);
        if !meta.get("labels").is_some_and(Value::is_object) {
            meta.insert("labels".into(), Value::Object(Map::new()));
        }
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            for (k, v) in &self.required {
                match labels.get(k).and_then(Value::as_str) {
                    Some(have) if have != v => {
                        return Err(crate::meta::status::ApiError::forbidden(format!(
                            "protected label {k} must have value {v}"
                        )))
                    }
                    Some(_) => {}
                    None => {
                        labels.insert(k.clone(), json!(v));
                    }
                }
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::admission::WriteValidation for SelectorAdmission {
    async fn mutate(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), crate::meta::status::ApiError> {
        self.add_required(obj)?;
        self.inner.mutate(attrs, obj, old).await
    }

    async fn validate(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), crate::meta::status::ApiError> {
        if !self.selector.matches(obj["metadata"].get("labels")) {
            return Err(crate::meta::status::ApiError::forbidden(
                "object does not match required labels".to_string(),
            ));
        }
        self.inner.validate(attrs, obj, old).await
    }
}

#[async_trait::async_trait]
impl crate::admission::Admission for SelectorAdmission {
    async fn admit(
        &self,
        attrs: &crate::admission::Attributes<'_>,
        obj: &mut Value,
    ) -> Result<(), crate::meta::status::ApiError> {
        self.add_required(obj)?;
        self.inner.admit(attrs, obj).await
    }
}

impl Tenancy {
    /// The claims in force in `cluster` (kept; recomputed when a binding or an export changes).
    pub async fn claims_of(&self, cluster: &str) -> Arc<Vec<AcceptedClaim>> {
        if let Some(hit) = self
            .claims
            .read()
            .ok()
            .and_then(|m| m.get(cluster).cloned())
        {
            return hit;
        }
        let computed = Arc::new(self.compute_claims(cluster).await.0);
        if let Ok(mut m) = self.claims.write() {
            m.insert(cluster.to_string(), computed.clone());
        }
        computed
    }

    /// The accepted claims of `cluster`, and whether any binding there has claims on either
    /// side (so its status speaks about them).
    async fn compute_claims(&self, cluster: &str) -> (Vec<AcceptedClaim>, bool) {
        let Ok((bindings, _)) = list_all(
            self.store.as_ref(),
            &format!("/apis.kcp.io/apibindings/{cluster}/"),
        )
        .await
        else {
            return (Vec::new(), false);
        };
        let bindings: Vec<Value> = bindings
            .iter()
            .filter_map(|kv| objects::decode_stored(&kv.value).ok())
            .collect();
        self.claims_from(&bindings).await
    }

    /// [`Tenancy::compute_claims`] from a cluster's APIBindings, already read.
    async fn claims_from(&self, bindings: &[Value]) -> (Vec<AcceptedClaim>, bool) {
        let mut out = Vec::new();
        let mut any = false;
        for b in bindings {
            if b["status"]["phase"] != "Bound" {
                continue;
            }
            let claims = binding_claims(b);
            any |= !claims.is_empty()
                || b["status"]["exportPermissionClaims"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty());
            if claims.is_empty() {
                continue;
            }
            let export_cluster = b["status"]["apiExportClusterName"].as_str().unwrap_or("");
            let export = b["spec"]["reference"]["export"]["name"]
                .as_str()
                .unwrap_or("");
            let Ok(Some(ekv)) = self
                .store
                .get(&format!(
                    "/apis.kcp.io/apiexports/{export_cluster}/{export}"
                ))
                .await
            else {
                continue;
            };
            let Ok(e) = objects::decode_stored(&ekv.value) else {
                continue;
            };
            out.extend(accepted_claims(objects::name(b), b, export_cluster, &e));
        }
        (out, any)
    }

    /// Forgets every kept claim set (an export changed somewhere).
    pub(crate) fn forget_claims(&self) {
        if let Ok(mut m) = self.claims.write() {
            m.clear();
        }
    }

    /// Recomputes the claims of `cluster`; relabels the resources whose claims changed and
    /// brings the bindings' applied claims up to date, in the background.
    /// `bindings` are the cluster's APIBindings as just read.
    pub(crate) async fn refresh_claims(&self, cluster: &str, bindings: &[Value]) {
        let old = self
            .claims
            .read()
            .ok()
            .and_then(|m| m.get(cluster).cloned());
        let (new, any) = self.claims_from(bindings).await;
        let new = Arc::new(new);
        if let Ok(mut m) = self.claims.write() {
            m.insert(cluster.to_string(), new.clone());
        }
        let sig =
            |v: &[AcceptedClaim]| -> BTreeSet<_> { v.iter().map(|c| c.signature()).collect() };
        let before = old.as_deref().map(|v| sig(v)).unwrap_or_default();
        let after = sig(&new);
        let changed: BTreeSet<ClaimedResource> = before
            .symmetric_difference(&after)
            .map(|s| s.2.clone())
            .collect();
        // Without a kept set (a restart, another replica's first sight) the labels on disk may
        // lag a change made meanwhile: relabel everything claimed.
        let changed: BTreeSet<ClaimedResource> = match old {
            Some(_) => changed,
            None => new.iter().map(|c| c.claimed.clone()).collect(),
        };
        if !any && changed.is_empty() {
            return;
        }
        // One worker per cluster at a time; changes arriving meanwhile are merged into its next
        // round, so a tenant rewriting its bindings quickly queues no more than one round.
        let start = {
            let mut work = match self.relabels.lock() {
                Ok(w) => w,
                Err(p) => p.into_inner(),
            };
            let entry = work.entry(cluster.to_string()).or_default();
            entry
                .pending
                .get_or_insert_with(BTreeSet::new)
                .extend(changed);
            !std::mem::replace(&mut entry.running, true)
        };
        let Some(state) = self.state().filter(|_| start) else {
            return;
        };
        let cluster = cluster.to_string();
        tokio::spawn(async move {
            while let Some(changed) = state.next_relabel(&cluster) {
                let claims = state.claims_of(&cluster).await;
                let mut failures = Vec::new();
                for claimed in &changed {
                    if let Err(e) = state.relabel(&cluster, claimed, &claims).await {
                        failures.push(format!("{}/{}: {e}", claimed.group, claimed.resource));
                    }
                }
                state.set_applied(&cluster, &claims, &failures).await;
            }
        });
    }

    /// The next round of relabelling in `cluster`, or `None` (and the worker ends) when no
    /// change came in since the last one.
    fn next_relabel(&self, cluster: &str) -> Option<BTreeSet<ClaimedResource>> {
        let mut work = match self.relabels.lock() {
            Ok(w) => w,
            Err(p) => p.into_inner(),
        };
        let next = work.get_mut(cluster).and_then(|w| w.pending.take());
        if next.is_none() {
            work.remove(cluster);
        }
        next
    }

    /// Writes the expected claim labels on every object of `claimed` in `cluster` (kcp sends an
    /// empty patch to each so its admission relabels; this is the same, done by the server).
    pub(crate) async fn relabel(
        &self,
        cluster: &str,
        claimed: &ClaimedResource,
        claims: &[AcceptedClaim],
    ) -> Result<usize, StorageError> {
        use futures::StreamExt;
        let (items, _) = list_all(self.store.as_ref(), &claimed.prefix(cluster)).await?;
        let mut changed = 0;
        let mut pending = futures::stream::FuturesUnordered::new();
        let mut first_error = None;
        for kv in items {
            pending.push(self.relabel_one(kv, claimed, claims));
            if pending.len() >= RELABEL_CONCURRENCY {
                match pending.next().await {
                    Some(Ok(true)) => changed += 1,
                    Some(Err(e)) => first_error = first_error.or(Some(e)),
                    _ => {}
                }
            }
        }
        while let Some(r) = pending.next().await {
            match r {
                Ok(true) => changed += 1,
                Err(e) => first_error = first_error.or(Some(e)),
                Ok(false) => {}
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    async fn relabel_one(
        &self,
        mut kv: crate::storage::KeyValue,
        claimed: &ClaimedResource,
        claims: &[AcceptedClaim],
    ) -> Result<bool, StorageError> {
        for _ in 0..8 {
            let Ok(mut obj) = objects::decode_stored(&kv.value) else {
                return Ok(false);
            };
            let expected = if claimed.group == "apis.kcp.io" && claimed.resource == "apibindings" {
                binding_labels(claims, &obj)
            } else {
                expected_labels(claims, claimed, obj["metadata"].get("labels"))
            };
            if !set_claim_labels(&mut obj, &expected) {
                return Ok(false);
            }
            match self
                .store
                .update(&kv.key, kv.mod_revision, objects::encoder(obj))
                .await
            {
                Ok(_) => return Ok(true),
                Err(StorageError::Conflict { .. }) => match self.store.get(&kv.key).await? {
                    Some(fresh) => kv = fresh,
                    None => return Ok(false),
                },
                Err(StorageError::NotFound(_)) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Brings every binding's `appliedPermissionClaims` and `PermissionClaimsApplied` in
    /// `cluster` up to date with `claims`.
    async fn set_applied(&self, cluster: &str, claims: &[AcceptedClaim], failures: &[String]) {
        let Ok((bindings, _)) = list_all(
            self.store.as_ref(),
            &format!("/apis.kcp.io/apibindings/{cluster}/"),
        )
        .await
        else {
            return;
        };
        let now = objects::now_rfc3339();
        for kv in bindings {
            let Ok(mut b) = objects::decode_stored(&kv.value) else {
                continue;
            };
            let name = objects::name(&b).to_string();
            let mine: Vec<&AcceptedClaim> = claims.iter().filter(|c| c.binding == name).collect();
            if b["status"]["phase"] != "Bound"
                || (b["spec"]["permissionClaims"].is_null()
                    && b["status"]["exportPermissionClaims"].is_null())
            {
                continue;
            }
            let applied: Vec<Value> = if failures.is_empty() {
                mine.iter()
                    .map(|c| {
                        json!({"group": c.claimed.group, "resource": c.claimed.resource,
                            "verbs": c.raw["verbs"].as_array().cloned().unwrap_or_else(|| vec![json!("*")]),
                            "identityHash": c.claimed.identity_hash,
                            "selector": c.raw.get("selector").cloned().unwrap_or_else(|| json!({"matchAll": true}))})
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let condition = match failures.is_empty() {
                true => {
                    json!({"type": "PermissionClaimsApplied", "status": "True", "lastTransitionTime": now})
                }
                false => {
                    json!({"type": "PermissionClaimsApplied", "status": "False", "severity": "Error",
                    "reason": "InternalError", "lastTransitionTime": now,
                    "message": format!("Permission claims have not been fully applied: {}", failures.join("; "))})
                }
            };
            let same_applied = b["status"]["appliedPermissionClaims"]
                == Value::Array(applied.clone())
                || (applied.is_empty() && b["status"]["appliedPermissionClaims"].is_null());
            let conditions = b["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let old = conditions
                .iter()
                .find(|c| c["type"] == "PermissionClaimsApplied");
            if same_applied && old.is_some_and(|o| o["status"] == condition["status"]) {
                continue;
            }
            let mut conditions: Vec<Value> = conditions
                .into_iter()
                .filter(|c| c["type"] != "PermissionClaimsApplied")
                .collect();
            conditions.push(condition);
            if applied.is_empty() {
                if let Some(s) = b["status"].as_object_mut() {
                    s.remove("appliedPermissionClaims");
                }
            } else {
                b["status"]["appliedPermissionClaims"] = Value::Array(applied);
            }
            b["status"]["conditions"] = Value::Array(conditions);
            // A lost race means another write happened; that write refreshes the claims again.
            let _ = self
                .store
                .update(&kv.key, kv.mod_revision, objects::encoder(b))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values computed by kcp's own functions (Go, `permissionclaims.ToLabelKeyAndValue`).
    #[test]
    fn labels_agree_with_kcp() {
        let core = ClaimedResource {
            group: String::new(),
            resource: "secrets".into(),
            identity_hash: String::new(),
        };
        assert_eq!(core.label_value(), "ctwrJRvMX7cX8wwk40Lz00UjJhYxPWE3TpN1lu");
        let bound = ClaimedResource {
            group: "core.platform-mesh.io".into(),
            resource: "accounts".into(),
            identity_hash: "abc123".into(),
        };
        assert_eq!(
            bound.label_value(),
            "c8HLNCfsw67SGZIKCFSnNLPB4VFKWIKackuKwM"
        );
        assert_eq!(
            claim_label_key("root", "core.platform-mesh.io"),
            "claimed.internal.apis.kcp.io/5kOyxVZdOqfcQsm9UJlthYU6lcQaQGwdRas0bJ"
        );
        assert_eq!(reflexive_value(), "LstvmbbzVDDOn90ZbhzSQO5U3DMCf88h1pZ");
        assert_eq!(base62(&[0, 0]), "0");
        assert_eq!(base62(&[61]), "Z");
        assert_eq!(base62(&[62]), "10");
    }

    fn export(claims: Value) -> Value {
        json!({"metadata": {"name": "e"}, "spec": {"permissionClaims": claims}})
    }

    #[test]
    fn verbs_are_intersected_and_only_accepted_claims_count() {
        let e = export(json!([
            {"resource": "secrets", "verbs": ["get", "list", "watch", "create"]},
            {"resource": "configmaps"},
        ]));
        let b = json!({"metadata": {"name": "b"}, "spec": {"permissionClaims": [
            {"resource": "secrets", "verbs": ["get", "list", "delete"], "state": "Accepted", "selector": {"matchAll": true}},
            {"resource": "configmaps", "verbs": ["*"], "state": "Rejected", "selector": {"matchAll": true}},
            {"resource": "namespaces", "verbs": ["*"], "state": "Accepted", "selector": {"matchAll": true}},
        ]}});
        let accepted = accepted_claims("b", &b, "c1", &e);
        assert_eq!(accepted.len(), 1, "{accepted:?}");
        assert_eq!(accepted[0].verbs, vec!["get", "list"]);
        assert!(accepted[0].allows("list") && !accepted[0].allows("delete"));
        assert!(!accepted[0].allows("create"));
        let (exported, valid) = claims_status(&b, &e, "now");
        assert_eq!(exported[1]["verbs"], json!(["*"]));
        let valid = valid.unwrap();
        assert_eq!(valid["reason"], "InvalidPermissionClaims");
        assert_eq!(
            valid["message"],
            "1 unexpected and/or invalid permission claims (showing first 1): [unexpected/invalid claim for namespaces. (identity \"\")]"
        );
    }

    #[test]
    fn a_star_on_one_side_only_is_no_wildcard() {
        let e = export(json!([{"resource": "secrets", "verbs": ["get"]}]));
        let b = json!({"metadata": {"name": "b"}, "spec": {"permissionClaims": [
            {"resource": "secrets", "verbs": ["*"], "state": "Accepted", "selector": {"matchAll": true}}]}});
        let accepted = accepted_claims("b", &b, "c1", &e);
        assert!(accepted[0].verbs.is_empty());
        assert!(!accepted[0].allows("get"));
    }

    #[test]
    fn selectors_decide_the_labels_and_foreign_claim_labels_go() {
        let e = export(json!([{"resource": "secrets", "verbs": ["*"]}]));
        let b = json!({"metadata": {"name": "b"}, "spec": {"permissionClaims": [
            {"resource": "secrets", "verbs": ["*"], "state": "Accepted",
             "selector": {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["secret"]}]}}]}});
        let claims = accepted_claims("b", &b, "c1", &e);
        let secrets = ClaimedResource {
            group: String::new(),
            resource: "secrets".into(),
            identity_hash: String::new(),
        };
        let yes = expected_labels(&claims, &secrets, Some(&json!({"team": "a"})));
        assert_eq!(yes.len(), 1);
        assert!(expected_labels(&claims, &secrets, Some(&json!({"team": "b"}))).is_empty());
        assert!(expected_labels(
            &claims,
            &secrets,
            Some(&json!({"team": "a", "tier": "secret"}))
        )
        .is_empty());
        let mut obj = json!({"metadata": {"labels": {"team": "b",
            "claimed.internal.apis.kcp.io/forged": "x"}}});
        assert!(set_claim_labels(&mut obj, &BTreeMap::new()));
        assert_eq!(obj["metadata"]["labels"], json!({"team": "b"}));
        assert!(!set_claim_labels(&mut obj, &BTreeMap::new()));
    }

    #[test]
    fn v1alpha2_verbs_are_read_from_the_annotation() {
        let mut e = export(json!([{"resource": "secrets", "all": true}]));
        e["metadata"]["annotations"] = json!({V2_CLAIMS_ANNOTATION:
            r#"[{"resource":"secrets","verbs":["get","list"]}]"#});
        assert_eq!(export_claims(&e)[0].verbs, vec!["get", "list"]);
    }
}
