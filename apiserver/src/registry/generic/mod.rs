//! The generic store: the one write path of every served type, as kube-apiserver's
//! `genericregistry.Store`. It owns the storage keys, `generateName` and its retries, the server's
//! metadata, validation, the compare-and-swap loop of updates, deletion with finalizers, dry
//! runs, the one mapping of storage errors to Status, and calls the type's [`Strategy`] and the
//! validating admission it is given at fixed points. Reads of collections go through it too:
//! selections, consistent pages ([`list`]) and each watcher's events ([`watch`]). Requests
//! reach it through the handlers, the server's own controllers through [`own`].

pub mod list;
pub mod own;
pub mod watch;

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::strategy::{Change, Strategies, Strategy, WriteAttributes};
use super::validation::{invalid, strict_error, validate_object};
use super::Resource;
use crate::meta::heavy::HeavyWork;
use crate::meta::schema::FieldValidation;
use crate::meta::status::{ApiError, Cause, GroupResource};
use crate::registry::objects::{self, meta_mut, meta_str, WritePart};
use crate::request::identity::Identity;
use crate::storage::{KeyValue, StorageError, Store};

/// The largest object stored: etcd's default request limit (`--max-request-bytes`), under which
/// every object of a kube-apiserver lives, so a patch cannot grow an object without bound.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// How often an update that keeps losing the race to other writes reads again and recomputes.
/// kube-apiserver's GuaranteedUpdate has no count, only the request's deadline; every lost
/// round is another writer's success, so with n writers on one object a write is refused only
/// after losing this many rounds in a row (at n = 8, about one in 10^59), while the bound still
/// ends a loop no deadline covers.
const RACE_RETRIES: usize = 1024;

/// Tries before giving up on a generated name that keeps colliding.
const GENERATE_NAME_ATTEMPTS: usize = 8;

/// The operation admission is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A change to a stored object.
    Update,
}

/// One write as admission sees it (kube's `admission.Attributes`).
#[derive(Clone, Copy)]
pub struct Attributes<'a> {
    /// The type written.
    pub resource: &'a Resource,
    /// The logical cluster written to.
    pub cluster: &'a str,
    /// The namespace, for a namespaced type.
    pub namespace: Option<&'a str>,
    /// The object's name (generated already on create).
    pub name: &'a str,
    /// Create or update.
    pub operation: Operation,
    /// Who writes.
    pub user: Option<&'a Identity>,
    /// Whether nothing will be stored.
    pub dry_run: bool,
}

/// The validating admission a write passes after its type prepared it and before it is stored
/// (kube's `ValidateObjectFunc`); the admission chain implements it.
#[async_trait::async_trait]
pub trait WriteValidation: Send + Sync {
    /// Changes the object right before it is validated and stored, on every attempt (labels
    /// only the server may set, such as kcp's permission-claim labels).
    async fn mutate(
        &self,
        _attrs: &Attributes<'_>,
        _obj: &mut Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        Ok(())
    }

    /// Refuses the write, or lets it pass unchanged (the default: a plugin that only mutates).
    async fn validate(
        &self,
        _attrs: &Attributes<'_>,
        _obj: &Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Validation that lets every write pass (the server's own writes, tests).
pub struct NoValidation;

impl WriteValidation for NoValidation {}

/// What one request writes, and how.
#[derive(Clone, Copy)]
pub struct Write<'a> {
    /// The type written.
    pub resource: &'a Arc<Resource>,
    /// The logical cluster written to.
    pub cluster: &'a str,
    /// The namespace on the URL, for a namespaced type.
    pub namespace: Option<&'a str>,
    /// The name on the URL (empty on create: the object names itself).
    pub name: &'a str,
    /// The main resource or its status.
    pub part: WritePart,
    /// Who writes.
    pub user: Option<&'a Identity>,
    /// Whether nothing is stored (`dryRun=All`).
    pub dry_run: bool,
    /// What to do with fields the schema does not declare.
    pub field_validation: FieldValidation,
    /// The manager a plain write records in `managedFields`; `None` when the caller set them
    /// already (server-side apply).
    pub field_manager: Option<&'a str>,
    /// Bytes of request input besides the stored object (the body, a patch's copies), to decide
    /// whether the work runs off the async workers.
    pub work: usize,
}

impl Write<'_> {
    fn gr(&self) -> &GroupResource {
        &self.resource.gr
    }

    fn key(&self, name: &str) -> String {
        self.resource.key(self.cluster, self.namespace, name)
    }

    fn strategy_attrs(&self) -> WriteAttributes<'_> {
        WriteAttributes {
            resource: self.resource,
            cluster: self.cluster,
            user: self.user,
        }
    }

    /// The write as admission sees it, for the object `name`.
    pub fn attributes<'b>(&'b self, name: &'b str, operation: Operation) -> Attributes<'b> {
        Attributes {
            resource: self.resource,
            cluster: self.cluster,
            namespace: self.namespace,
            name,
            operation,
            user: self.user,
            dry_run: self.dry_run,
        }
    }
}

/// What a create or update left.
#[derive(Debug)]
pub enum Stored {
    /// The object as stored (or as it already was, for an update that changed nothing).
    Object(Bytes),
    /// The object a dry run would have stored.
    DryRun(Value),
}

/// The result of a create or update: the object and the warnings for the client.
#[derive(Debug)]
pub struct Written {
    /// The object.
    pub stored: Stored,
    /// Warnings of validation (unknown fields, the type's advice).
    pub warnings: Vec<String>,
}

/// What a delete request asked to hold (`DeleteOptions.preconditions`).
#[derive(Debug, Default)]
pub struct Preconditions {
    /// The uid the object must have.
    pub uid: Option<String>,
    /// The resourceVersion the object must have.
    pub resource_version: Option<String>,
}

/// The outcome of deleting one object.
#[derive(Debug)]
pub enum Deleted {
    /// Removed from storage; the final state as watchers saw it.
    Gone(Bytes),
    /// Marked for deletion, waiting for finalizers (or, for a namespace, its content).
    Pending(Bytes),
    /// What a dry run would have done.
    DryRun(Value),
}

/// The one write path of every type over a [`Store`].
pub struct GenericStore {
    store: Arc<dyn Store>,
    strategies: Strategies,
    heavy: HeavyWork,
}

impl GenericStore {
    /// The generic store over `store`, with the types' `strategies`; long synchronous work takes
    /// a seat of `heavy`.
    pub fn new(store: Arc<dyn Store>, strategies: Strategies, heavy: HeavyWork) -> Self {
        GenericStore {
            store,
            strategies,
            heavy,
        }
    }

    /// The store's newest revision: what a collection is read at when nothing older is asked.
    pub fn current_revision(&self) -> crate::storage::Revision {
        self.store.current_revision()
    }

    /// The seats for long synchronous work.
    pub fn heavy(&self) -> &HeavyWork {
        &self.heavy
    }

    /// The strategies of every type.
    pub fn strategies(&self) -> &Strategies {
        &self.strategies
    }

    /// The strategy of `resource`'s type.
    pub fn strategy(&self, resource: &Resource) -> &Arc<dyn Strategy> {
        self.strategies.of(resource)
    }

    /// The current state of one object, 404 when it does not exist.
    pub async fn get(
        &self,
        resource: &Resource,
        cluster: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<KeyValue, ApiError> {
        let key = resource.key(cluster, namespace, name);
        match self.store.get(&key).await {
            Ok(Some(kv)) => Ok(kv),
            Ok(None) => Err(ApiError::not_found(&resource.gr, name)),
            Err(e) => Err(storage_status(&resource.gr, name, e)),
        }
    }

    /// Validates `obj` (metadata, the type's defaults, the schema, the type's rules), refusing
    /// it per `fieldValidation`; returns the warnings.
    fn validate(
        &self,
        w: &Write<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<Vec<String>, ApiError> {
        let r = w.resource;
        let outcome = validate_object(r, self.strategy(r).as_ref(), obj, old, w.field_validation);
        let mut warnings = Vec::new();
        if !outcome.unknown_fields.is_empty() {
            match w.field_validation {
                FieldValidation::Strict => return Err(strict_error(r, &outcome.unknown_fields)),
                FieldValidation::Warn => warnings.extend(
                    outcome
                        .unknown_fields
                        .iter()
                        .map(|f| format!("unknown field {f:?}")),
                ),
                FieldValidation::Ignore => {}
            }
        }
        if !outcome.errors.is_empty() {
            return Err(invalid(r, objects::name(obj), &outcome.errors));
        }
        warnings.extend(outcome.warnings);
        Ok(warnings)
    }

    /// Records in `new.metadata.managedFields` which fields a plain write set.
    fn record_update(&self, w: &Write<'_>, old: Option<&Value>, new: &mut Value) {
        let Some(manager) = w.field_manager else {
            return;
        };
        let base = managed_fields_base(old, new);
        // A new object of a built-in kind is compared, as kube-apiserver compares it, with the
        // kind's zero value as Go prints it: what is there already (a Namespace's empty spec, an
        // Event's empty reportingComponent) is set by nobody.
        let zero = match old {
            None if w.resource.ty.strategic_merge_patch => {
                crate::meta::protobuf::zero_object(&w.resource.api_version, w.resource.kind())
            }
            _ => None,
        };
        let entries = crate::meta::apply::record_update(
            old.or(zero.as_ref()),
            new,
            base,
            manager,
            &w.resource.api_version,
            (w.part == WritePart::Status).then_some("status"),
            &w.resource.ty.schema,
            &objects::now_rfc3339(),
        );
        // Writes of the main resource do not own the status (kube-apiserver resets it for
        // them), nor the annotation only the server sets.
        let main_resets_status = w.resource.ty.status_subresource && w.part == WritePart::Main;
        let entries: Vec<_> = entries
            .into_iter()
            .filter_map(|mut e| {
                if main_resets_status {
                    if let Some(f) = e.fields_v1.as_object_mut() {
                        f.remove("f:status");
                    }
                }
                without_server_annotation(e)
            })
            .collect();
        crate::meta::apply::set_managed_fields(new, &entries);
    }

    /// The checks every object passes right before it is stored: the type's last preparation,
    /// validating admission, and the size limit.
    async fn before_store(
        &self,
        w: &Write<'_>,
        validation: &dyn WriteValidation,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.strategy(w.resource)
            .prepare_for_store(&w.strategy_attrs(), obj, old)
            .await?;
        let (name, operation) = match old {
            None => (objects::name(obj).to_string(), Operation::Create),
            Some(_) => (w.name.to_string(), Operation::Update),
        };
        validation
            .mutate(&w.attributes(&name, operation), obj, old)
            .await?;
        validation
            .validate(&w.attributes(&name, operation), obj, old)
            .await?;
        check_size(w.gr(), obj)
    }

    /// Creates `obj` (decoded, its namespace reconciled with the URL's): names it from
    /// `generateName` if it has no name, fills the server's metadata, validates it, and stores it,
    /// trying new generated names while they collide.
    pub async fn create(
        &self,
        w: &Write<'_>,
        mut obj: Value,
        validation: &dyn WriteValidation,
    ) -> Result<Written, ApiError> {
        let r = w.resource;
        let generate = meta_str(&obj, "name")
            .is_none_or(str::is_empty)
            .then(|| meta_str(&obj, "generateName").unwrap_or("").to_string())
            .filter(|p| !p.is_empty());
        if let Some(prefix) = &generate {
            let name = crate::meta::names::generate_name(prefix, random_suffix_char);
            meta_mut(&mut obj).insert("name".into(), json!(name));
        }
        // Server-side apply computed the object's managedFields already; keep them.
        let applied_fields = match w.field_manager {
            None => obj["metadata"].get("managedFields").cloned(),
            Some(_) => None,
        };
        // The server's own write keeps the status it sets with the object.
        let status = match w.part {
            WritePart::Whole => obj.get("status").cloned(),
            _ => None,
        };
        objects::prepare_for_create(&mut obj, r, w.cluster);
        if let Some(status) = status {
            obj["status"] = status;
        }
        if let Some(fields) = applied_fields {
            meta_mut(&mut obj).insert("managedFields".into(), fields);
        }
        let strategy = self.strategy(r);
        strategy.prepare_for_create(&mut obj, w.user);
        let warnings = self
            .heavy
            .run(w.work, || {
                let warnings = self.validate(w, &mut obj, None)?;
                self.record_update(w, None, &mut obj);
                Ok::<_, ApiError>(warnings)
            })
            .await?;
        self.before_store(w, validation, &mut obj, None).await?;
        if w.dry_run {
            return Ok(Written {
                stored: Stored::DryRun(obj),
                warnings,
            });
        }
        let mut attempt = 0;
        loop {
            let name = objects::name(&obj).to_string();
            match self
                .store
                .create(&w.key(&name), objects::encoder(obj.clone()))
                .await
            {
                Ok(kv) => {
                    strategy
                        .after_write(r, w.cluster, &kv.value, Change::Created)
                        .await;
                    return Ok(Written {
                        stored: Stored::Object(kv.value),
                        warnings,
                    });
                }
                Err(StorageError::AlreadyExists(_))
                    if generate.is_some() && attempt + 1 < GENERATE_NAME_ATTEMPTS =>
                {
                    attempt += 1;
                    let prefix = generate.as_deref().unwrap_or_default();
                    let name = crate::meta::names::generate_name(prefix, random_suffix_char);
                    meta_mut(&mut obj).insert("name".into(), json!(name));
                }
                Err(StorageError::AlreadyExists(_)) if generate.is_some() => {
                    let mut e = ApiError::already_exists(w.gr(), &name);
                    e.message.push_str(
                        ", the server was not able to generate a unique name for the object",
                    );
                    return Err(e);
                }
                Err(e) => return Err(storage_status(w.gr(), &name, e)),
            }
        }
    }

    /// Reads the object named by `w`, computes its new state with `compute` (given the current
    /// one as served), applies the update rules and writes it with compare-and-swap, retrying on
    /// a lost race when the new state carries no resourceVersion. A write that changes nothing is
    /// not stored and emits no event; one that removes the last finalizer of a deleting object
    /// removes the object.
    pub async fn update(
        &self,
        w: &Write<'_>,
        validation: &dyn WriteValidation,
        mut compute: impl FnMut(&Value) -> Result<Value, ApiError> + Send,
    ) -> Result<Written, ApiError> {
        let r = w.resource;
        let strategy = self.strategy(r);
        let key = w.key(w.name);
        for _ in 0..RACE_RETRIES {
            let current = self.get(r, w.cluster, w.namespace, w.name).await?;
            // Decoding, patching and validating a large object is long CPU work: off the async
            // workers, so other tenants' requests are not queued behind it.
            let work = current.value.len() + w.work;
            let (old, mut new, precondition, warnings) = self
                .heavy
                .run(work, || {
                    let old = objects::decode_stored(&current.value)?;
                    let mut new = compute(&r.to_served(old.clone()))?;
                    objects::check_type_meta(&mut new, r)?;
                    let mut new = r.to_storage(new);
                    let precondition = match meta_str(&new, "resourceVersion") {
                        None | Some("") => false,
                        Some(rv) => {
                            if objects::parse_resource_version(rv)? != current.mod_revision {
                                return Err(ApiError::conflict(w.gr(), w.name));
                            }
                            true
                        }
                    };
                    match meta_str(&new, "name") {
                        None | Some("") => {
                            meta_mut(&mut new).insert("name".into(), json!(w.name));
                        }
                        Some(n) if n == w.name => {}
                        Some(n) => {
                            return Err(ApiError::bad_request(format!(
                            "the name of the object ({n}) does not match the name on the URL ({})",
                            w.name
                        )))
                        }
                    }
                    reconcile_namespace(r, w.namespace, &mut new)?;
                    objects::prepare_for_update(&mut new, &old, r, w.part)?;
                    let warnings = self.validate(w, &mut new, Some(&old))?;
                    self.record_update(w, Some(&old), &mut new);
                    Ok((old, new, precondition, warnings))
                })
                .await?;
            self.before_store(w, validation, &mut new, Some(&old))
                .await?;
            let written = |stored| Written { stored, warnings };
            if objects::same_object(&new, &old) {
                return Ok(written(Stored::Object(current.value)));
            }
            if w.dry_run {
                // What would be replaced: the current resourceVersion, as kube-apiserver answers.
                meta_mut(&mut new).insert(
                    "resourceVersion".into(),
                    json!(current.mod_revision.to_string()),
                );
                return Ok(written(Stored::DryRun(new)));
            }
            if objects::is_deleting(&new) && objects::finalizers(&new).is_empty() {
                // The last finalizer is gone: the object goes now. Watchers see it go as it was
                // last stored (as kube-apiserver's DELETED event carries etcd's previous value);
                // the writer gets what it wrote.
                match self
                    .store
                    .delete(&key, current.mod_revision, objects::encoder(old.clone()))
                    .await
                {
                    Ok(event) => {
                        strategy
                            .after_write(r, w.cluster, &event.value, Change::Deleted)
                            .await;
                        let mut answer = objects::encoder(new);
                        return Ok(written(Stored::Object(answer(event.revision).into())));
                    }
                    // Written meanwhile: read again and recompute, as kube-apiserver's
                    // GuaranteedUpdate does; a resourceVersion precondition that no longer
                    // holds is refused then, one that still holds (a patch without one
                    // carries the current) goes on.
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(e) => return Err(storage_status(w.gr(), w.name, e)),
                }
            }
            match self
                .store
                .update(&key, current.mod_revision, objects::encoder(new))
                .await
            {
                Ok(kv) => {
                    strategy
                        .after_write(r, w.cluster, &kv.value, Change::Updated)
                        .await;
                    return Ok(written(Stored::Object(kv.value)));
                }
                Err(StorageError::Conflict { .. }) => continue,
                Err(StorageError::NotFound(_)) if !precondition => continue,
                Err(e) => return Err(storage_status(w.gr(), w.name, e)),
            }
        }
        Err(ApiError::conflict(w.gr(), w.name))
    }

    /// Deletes the object at `key` whose state was read as `current`: an object with
    /// finalizers (or of a type that always marks first) is marked and stays; any other goes.
    /// A lost race reads the object again and retries.
    pub async fn delete(
        &self,
        w: &Write<'_>,
        key: &str,
        mut current: KeyValue,
        preconditions: &Preconditions,
    ) -> Result<Deleted, ApiError> {
        let r = w.resource;
        let strategy = self.strategy(r);
        loop {
            let mut obj = objects::decode_stored(&current.value)?;
            let name = objects::name(&obj).to_string();
            let uid = meta_str(&obj, "uid").unwrap_or("").to_string();
            // kube-apiserver names the kind (not the resource) in these two conflicts.
            let by_kind = GroupResource::new(&r.ty.group, &r.ty.kind);
            if let Some(want) = &preconditions.uid {
                if *want != uid {
                    return Err(ApiError::conflict_with(
                        &by_kind,
                        &name,
                        &format!("the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"),
                    ));
                }
            }
            if let Some(want) = &preconditions.resource_version {
                if *want != current.mod_revision.to_string() {
                    return Err(ApiError::conflict_with(
                        &by_kind,
                        &name,
                        &format!(
                            "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({}). The object might have been modified",
                            current.mod_revision
                        ),
                    ));
                }
            }
            let marks = strategy.marks_on_delete() || !objects::finalizers(&obj).is_empty();
            if marks {
                if objects::is_deleting(&obj) {
                    return Ok(Deleted::Pending(current.value));
                }
                let m = meta_mut(&mut obj);
                m.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                strategy.begin_delete(&mut obj);
            }
            if w.dry_run {
                return Ok(Deleted::DryRun(obj));
            }
            let encoded = objects::encoder(obj);
            let written = match marks {
                true => self
                    .store
                    .update(key, current.mod_revision, encoded)
                    .await
                    .map(|kv| kv.value),
                false => self
                    .store
                    .delete(key, current.mod_revision, encoded)
                    .await
                    .map(|event| event.value),
            };
            match written {
                Ok(bytes) => {
                    let change = if marks {
                        Change::DeleteBegun
                    } else {
                        Change::Deleted
                    };
                    strategy.after_write(r, w.cluster, &bytes, change).await;
                    return Ok(if marks {
                        Deleted::Pending(bytes)
                    } else {
                        Deleted::Gone(bytes)
                    });
                }
                Err(StorageError::Conflict { .. }) => {}
                Err(e) => return Err(storage_status(w.gr(), &name, e)),
            }
            // Lost a race: read again and retry.
            current = match self.store.get(key).await {
                Ok(Some(kv)) => kv,
                Ok(None) => return Err(ApiError::not_found(w.gr(), &name)),
                Err(e) => return Err(storage_status(w.gr(), &name, e)),
            };
        }
    }
}

impl GenericStore {
    /// Removes the object at `key` now, whatever its finalizers, reading it again after a lost
    /// race; whether it was there.
    async fn remove(
        &self,
        r: &Resource,
        cluster: &str,
        key: &str,
        name: &str,
    ) -> Result<bool, ApiError> {
        loop {
            let current = match self.store.get(key).await {
                Ok(Some(kv)) => kv,
                Ok(None) => return Ok(false),
                Err(e) => return Err(storage_status(&r.gr, name, e)),
            };
            // Watchers see the final state at the deletion revision.
            let last = objects::decode_stored(&current.value)?;
            match self
                .store
                .delete(key, current.mod_revision, objects::encoder(last))
                .await
            {
                Ok(event) => {
                    self.strategy(r)
                        .after_write(r, cluster, &event.value, Change::Deleted)
                        .await;
                    return Ok(true);
                }
                Err(StorageError::Conflict { .. }) => continue,
                Err(StorageError::NotFound(_)) => return Ok(false),
                Err(e) => return Err(storage_status(&r.gr, name, e)),
            }
        }
    }
}

fn random_suffix_char() -> char {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let i = rand::random_range(0..ALPHABET.len());
    ALPHABET[i] as char
}

/// Fills the namespace from the URL and refuses a body that names another one; a cluster-scoped
/// type's objects carry none.
pub fn reconcile_namespace(
    r: &Resource,
    url_namespace: Option<&str>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    if !r.ty.namespaced {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("namespace");
        }
        return Ok(());
    }
    let url_ns = url_namespace.unwrap_or_default();
    match meta_str(obj, "namespace") {
        None | Some("") => {
            meta_mut(obj).insert("namespace".into(), json!(url_ns));
            Ok(())
        }
        Some(ns) if ns == url_ns => Ok(()),
        Some(_) => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
}

/// Refuses an object larger than [`MAX_OBJECT_BYTES`] before it reaches the store, whichever
/// verb produced it (a patch can grow an object past the body limit).
fn check_size(gr: &GroupResource, obj: &Value) -> Result<(), ApiError> {
    if objects::json_len_within(obj, MAX_OBJECT_BYTES).is_some() {
        return Ok(());
    }
    Err(ApiError::new(
        413,
        "RequestEntityTooLarge",
        format!(
            "{gr} {:?} would be larger than {MAX_OBJECT_BYTES} bytes, the most one stored object may have",
            objects::name(obj)
        ),
    ))
}

/// An entry without the `kcp.io/cluster` annotation, which the server sets and no manager owns
/// (so managedFields are what kube-apiserver records for the same writes); `None` when nothing
/// else is left.
fn without_server_annotation(
    mut entry: crate::meta::apply::ManagedFieldsEntry,
) -> Option<crate::meta::apply::ManagedFieldsEntry> {
    // `f:` + objects::CLUSTER_ANNOTATION, spelled out: this runs on every write.
    const KEY: &str = "f:kcp.io/cluster";
    debug_assert_eq!(KEY, format!("f:{}", objects::CLUSTER_ANNOTATION));
    let fields = &mut entry.fields_v1;
    if let Some(meta) = fields.get_mut("f:metadata").and_then(Value::as_object_mut) {
        if let Some(ann) = meta.get_mut("f:annotations").and_then(Value::as_object_mut) {
            if ann.remove(KEY).is_some() && ann.keys().all(|k| k == ".") {
                meta.remove("f:annotations");
            }
        }
        if meta.is_empty() {
            fields.as_object_mut().map(|f| f.remove("f:metadata"));
        }
    }
    let empty = fields.as_object().is_some_and(serde_json::Map::is_empty);
    (!empty).then_some(entry)
}

/// The managedFields a non-apply write starts from: the stored ones, unless the client sent
/// different ones (then those, and `[{}]` clears them), as kube-apiserver does.
fn managed_fields_base(
    old: Option<&Value>,
    new: &Value,
) -> Vec<crate::meta::apply::ManagedFieldsEntry> {
    let sent = new.get("metadata").and_then(|m| m.get("managedFields"));
    let stored = old
        .and_then(|o| o.get("metadata"))
        .and_then(|m| m.get("managedFields"));
    match sent {
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_object().is_some_and(|m| m.is_empty()) => {
            Vec::new()
        }
        Some(s) if Some(s) != stored && !s.is_null() => crate::meta::apply::managed_fields_of(new),
        _ => old
            .map(crate::meta::apply::managed_fields_of)
            .unwrap_or_default(),
    }
}

/// Maps a storage error about object `name` of `gr` to the client's Status: the one place the
/// store's errors become API errors.
pub fn storage_status(gr: &GroupResource, name: &str, e: StorageError) -> ApiError {
    match e {
        StorageError::AlreadyExists(_) => ApiError::already_exists(gr, name),
        StorageError::NotFound(_) => ApiError::not_found(gr, name),
        StorageError::Conflict { .. } => ApiError::conflict(gr, name),
        StorageError::Compacted {
            requested,
            compacted,
        } => ApiError::gone(format!(
            "too old resource version: {requested} ({compacted})"
        )),
        StorageError::FutureRevision { requested, current } => ApiError::timeout(format!(
            "Timeout: Too large resource version: {requested}, current: {current}"
        ))
        .with_details(crate::meta::status::Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            }],
            retry_after_seconds: Some(1),
            ..Default::default()
        }),
        e @ StorageError::TooSlow { .. } => ApiError::slow_watcher(e.to_string()),
        StorageError::Backend(m) => ApiError::internal(format!("storage error: {m}")),
    }
}

#[cfg(test)]
mod tests;
