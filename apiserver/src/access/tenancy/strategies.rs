//! The tenancy types in the generic store: one strategy per type, and kcp's path annotation
//! admission for every other object.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::apis::{export_identity, prepare_crd, reload_cluster_types};
use super::{invalid, prepare_logical_cluster, Tenancy};
use crate::admission::{Admission, Attributes, WriteValidation};
use crate::meta::status::ApiError;
use crate::registry::objects;
use crate::registry::{Change, Resource, StrategiesBuilder, Strategy, WriteAttributes};

impl Tenancy {
    /// Adds the strategies of the tenancy types.
    pub fn add_strategies(self: &Arc<Self>, strategies: &mut StrategiesBuilder) {
        let t = || self.clone();
        strategies
            .add(
                "core.kcp.io",
                "logicalclusters",
                Arc::new(LogicalClusters(t())),
            )
            .add("tenancy.kcp.io", "workspaces", Arc::new(Workspaces(t())))
            .add(
                "tenancy.kcp.io",
                "workspacetypes",
                Arc::new(WorkspaceTypes(t())),
            )
            .add(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                Arc::new(Crds(t())),
            )
            .add(
                "apis.kcp.io",
                "apiresourceschemas",
                Arc::new(ResourceSchemas),
            )
            .add("apis.kcp.io", "apiexports", Arc::new(Exports(t())))
            .add("apis.kcp.io", "apibindings", Arc::new(Bindings(t())));
    }
}

/// The types whose objects carry their workspace's path, set by the server (kcp's path
/// annotation admission), and LogicalClusters, which are the server's own.
const SETS_PATH: &[(&str, &str)] = &[
    ("apis.kcp.io", "apiexports"),
    ("apis.kcp.io", "apibindings"),
    ("tenancy.kcp.io", "workspacetypes"),
    ("core.kcp.io", "logicalclusters"),
];

/// kcp's path annotation admission: on any object but those whose path the server sets, a
/// `kcp.io/path` annotation must be the canonical path of the workspace written to.
pub struct PathAnnotation(pub Arc<Tenancy>);

#[async_trait::async_trait]
impl WriteValidation for PathAnnotation {
    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        obj: &Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let ty = &attrs.resource.ty;
        if SETS_PATH
            .iter()
            .any(|(g, p)| ty.group == *g && ty.plural == *p)
        {
            return Ok(());
        }
        self.0
            .check_path_annotation(attrs.resource, attrs.cluster, obj)
    }
}

impl Admission for PathAnnotation {}

/// kcp's permission-claims admission: every object written gets exactly the claim labels the
/// workspace's accepted claims give it (see [`super::claims`]); a label under the claim prefix
/// that a client wrote is replaced, never trusted.
pub struct ClaimLabels(pub Arc<Tenancy>);

#[async_trait::async_trait]
impl WriteValidation for ClaimLabels {
    async fn mutate(
        &self,
        attrs: &Attributes<'_>,
        obj: &mut Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let claimed = super::claims::ClaimedResource::of(attrs.resource);
        let claims = self.0.claims_of(attrs.cluster).await;
        let expected = if claimed.group == "apis.kcp.io" && claimed.resource == "apibindings" {
            super::claims::binding_labels(&claims, obj)
        } else {
            super::claims::expected_labels(&claims, &claimed, obj["metadata"].get("labels"))
        };
        super::claims::set_claim_labels(obj, &expected);
        Ok(())
    }
}

impl Admission for ClaimLabels {}

/// LogicalClusters: created and deleted with their workspace; clients may only touch what is
/// not the server's.
/// A client may shrink the initializers it waits for (see [`super::initializers`]); the phase
/// and the lifecycle labels stay the server's, and each write moves the workspace on.
struct LogicalClusters(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for LogicalClusters {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        // The server's own writes (no user) create LogicalClusters and move their phase;
        // a client's are held to what a client may change.
        if w.user.is_some() {
            prepare_logical_cluster(w.resource, obj, old, w.user)?;
            if let Some(old) = old {
                super::initializers::check_status_update(old, obj)
                    .map_err(|m| super::initializers::invalid_status(w.resource, m))?;
            }
        }
        super::initializers::set_labels(obj);
        Ok(())
    }

    /// Marked deleting, a LogicalCluster is offered to its terminators: their labels go on.
    fn begin_delete(&self, obj: &mut Value) {
        super::initializers::set_labels(obj);
    }

    async fn after_write(&self, _: &Resource, cluster: &str, _: &Bytes, change: Change) {
        if change == Change::Updated {
            if let Err(e) = self.0.advance(cluster).await {
                tracing::warn!(cluster, error = %e, "moving an initialized workspace on");
            }
        }
    }
}

/// Workspaces: scheduled onto a new logical cluster, initialized and deleted with it.
struct Workspaces(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for Workspaces {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.0
            .prepare_workspace(w.resource, w.cluster, obj, old, w.user)
            .await
    }

    async fn after_write(&self, _: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        if let Ok(obj) = objects::decode_stored(stored) {
            self.0
                .after_workspace_write(cluster, &obj, change == Change::Deleted)
                .await;
        }
    }
}

/// WorkspaceTypes: carry their path, publish the URLs of their initializing and terminating
/// virtual workspaces, and are Ready at once.
struct WorkspaceTypes(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for WorkspaceTypes {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.0.set_path_annotation(w.cluster, obj);
        // kcp's default: children of a type that names none are universal.
        if old.is_none() {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("defaultChildWorkspaceType")
                    .or_insert_with(|| json!({"name": "universal", "path": "root"}));
            }
        }
        let fresh = super::initializers::type_status(
            &self.0.advertise_address,
            w.cluster,
            objects::name(obj),
            &objects::now_rfc3339(),
        );
        obj["status"] = match old
            .and_then(|o| o.get("status"))
            .filter(|s| s["virtualWorkspaces"] == fresh["virtualWorkspaces"])
        {
            Some(s) => s.clone(),
            None => fresh,
        };
        Ok(())
    }
}

/// CustomResourceDefinitions: checked and given their status; the cluster serves their types
/// once written.
struct Crds(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for Crds {
    /// As kube-apiserver: a CRD without `spec.conversion` converts nothing (`strategy: None`).
    fn set_defaults(&self, obj: &mut Value) {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            if !spec.get("conversion").is_some_and(Value::is_object) {
                spec.insert("conversion".into(), serde_json::json!({"strategy": "None"}));
            }
        }
    }

    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        prepare_crd(w.resource, obj)
    }

    async fn after_write(&self, _: &Resource, cluster: &str, _: &Bytes, _: Change) {
        if let Some(state) = self.0.state() {
            reload_cluster_types(&state, cluster).await;
        }
    }
}

/// APIResourceSchemas: immutable once created, as kcp's.
struct ResourceSchemas;

#[async_trait::async_trait]
impl Strategy for ResourceSchemas {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        match old {
            Some(old) if old.get("spec") != obj.get("spec") => Err(invalid(
                w.resource,
                objects::name(obj),
                "spec",
                "Invalid value: \"object\": APIResourceSchema spec is immutable".into(),
            )),
            Some(_) => Ok(()),
            None => {
                // kcp defaults how the names of the schema's objects are validated.
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("nameValidation")
                        .or_insert_with(|| json!("DNS1123Subdomain"));
                }
                check_schema_roots(obj)
            }
        }
    }
}

/// kcp's APIResourceSchema admission: each version's `schema` is the structural schema itself
/// (not nested under `openAPIV3Schema` as in a CRD), of type object at its root, validated as the
/// CRD it becomes (so its errors name `openAPIV3Schema`); kcp refuses with 403 Forbidden.
fn check_schema_roots(obj: &Value) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    for (i, v) in obj["spec"]["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = format!("spec.versions[{i}].schema.openAPIV3Schema.type");
        match v["schema"]["type"].as_str().unwrap_or_default() {
            "object" => {}
            "" => errors.push(format!(
                "{field}: Required value: must not be empty at the root"
            )),
            other => errors.push(format!(
                "{field}: Invalid value: {other:?}: must be object at the root"
            )),
        }
        // CEL rules: compiled and estimated within kube's cost limits, as the CRD would be.
        let root = format!("spec.versions[{i}].schema.openAPIV3Schema");
        errors.extend(
            crate::meta::schema::check_rule_costs(&v["schema"], &root)
                .iter()
                .map(ToString::to_string),
        );
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::forbidden_object(
        &crate::meta::status::GroupResource::new("apis.kcp.io", "apiresourceschemas"),
        objects::name(obj),
        format!("[{}]", errors.join(", ")),
    ))
}

/// APIExports: carry their path and an identity that never changes; their endpoint slice and
/// the bindings to them follow their writes.
struct Exports(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for Exports {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.0.set_path_annotation(w.cluster, obj);
        let identity = export_identity(w.cluster, objects::name(obj));
        // kcp's condition that the export's identity is settled (the server made it).
        let valid = json!({"type": "IdentityValid", "status": "True",
            "lastTransitionTime": objects::now_rfc3339()});
        obj["status"] = json!({"identityHash": identity, "conditions": [valid]});
        if let Some(s) = old.and_then(|o| o.get("status")) {
            if s.get("identityHash").is_some() {
                obj["status"]["identityHash"] = s["identityHash"].clone();
            }
            let kept = s["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "IdentityValid"));
            if let Some(kept) = kept {
                obj["status"]["conditions"] = json!([kept]);
            }
        }
        Ok(())
    }

    async fn after_write(&self, _: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        if let Ok(obj) = objects::decode_stored(stored) {
            self.0
                .after_export_write(cluster, &obj, change == Change::Deleted)
                .await;
        }
    }
}

/// APIBindings: need `bind` on their export, resolve it, and change what the cluster serves.
struct Bindings(Arc<Tenancy>);

#[async_trait::async_trait]
impl Strategy for Bindings {
    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        // kcp's schema rule (`self == oldSelf` on spec.reference): a binding stays bound to
        // the export it was created for; another export is another binding.
        if let Some(old) = old {
            if old["spec"]["reference"] != obj["spec"]["reference"] {
                return Err(invalid(
                    w.resource,
                    crate::registry::objects::name(obj),
                    "spec.reference",
                    "Invalid value: \"object\": APIExport reference must not be changed".into(),
                ));
            }
        }
        self.0
            .prepare_binding_write(w.cluster, obj, old, w.user)
            .await?;
        super::unbinding::add_finalizer(obj);
        Ok(())
    }

    async fn after_write(&self, _: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        if let Some(state) = self.0.state() {
            if matches!(change, Change::DeleteBegun | Change::Updated) {
                if let Ok(b) = crate::registry::objects::decode_stored(stored) {
                    if crate::registry::objects::is_deleting(&b) {
                        state.unbind(cluster, crate::registry::objects::name(&b));
                    }
                }
            }
            reload_cluster_types(&state, cluster).await;
        }
    }
}
