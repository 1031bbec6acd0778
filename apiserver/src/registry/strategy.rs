//! The per-type seam of the generic store, as kube-apiserver's REST strategies: what one type
//! adds to the writes every type goes through. Every method has a no-op default, so a type with
//! nothing special needs no strategy at all.
//!
//! Strategies are contributed by the layer that owns the behaviour (the Platform Mesh type rules,
//! the service-account token of a legacy Secret, RBAC's escalation check, the namespace
//! lifecycle, the tenancy types) and assembled once into [`Strategies`], looked up per
//! (group, resource). Several contributions to one type run in the order they were added.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::Resource;
use crate::meta::field_error::FieldError;
use crate::meta::names::NameRule;
use crate::meta::status::ApiError;
use crate::request::identity::Identity;

/// The outcome of a type's own validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Violations; non-empty means the object is invalid (422).
    pub errors: Vec<FieldError>,
    /// Advice about valid but suspicious values (`Warning` headers), each starting with the
    /// field path.
    pub warnings: Vec<String>,
}

impl Report {
    /// Whether there are no errors (warnings do not count).
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }

    /// Records an error.
    pub fn error(&mut self, e: FieldError) {
        self.errors.push(e);
    }

    /// Records a warning `<field>: <text>`.
    pub fn warn(&mut self, field: &str, text: impl AsRef<str>) {
        self.warnings.push(format!("{field}: {}", text.as_ref()));
    }
}

/// One write as a strategy sees it.
#[derive(Clone, Copy)]
pub struct WriteAttributes<'a> {
    /// The type written.
    pub resource: &'a Resource,
    /// The logical cluster written to.
    pub cluster: &'a str,
    /// Who writes; `None` for the server's own writes.
    pub user: Option<&'a Identity>,
}

/// What a stored write did, for [`Strategy::after_write`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new object was stored.
    Created,
    /// An object was replaced (also a deletion that waits for finalizers, after it began).
    Updated,
    /// A delete request marked the object for deletion; it stays until its finalizers are gone
    /// (and, for a namespace, until it is empty).
    DeleteBegun,
    /// The object is gone from storage.
    Deleted,
}

/// What one type adds to the generic store's writes. The order of a create is: the server's
/// metadata, [`prepare_for_create`](Strategy::prepare_for_create), [`set_defaults`](Strategy::set_defaults),
/// the structural schema, [`validate`](Strategy::validate),
/// [`prepare_for_store`](Strategy::prepare_for_store), validating admission, storage,
/// [`after_write`](Strategy::after_write). An update runs the same from `default` on, on every
/// attempt of its compare-and-swap loop.
#[async_trait::async_trait]
pub trait Strategy: Send + Sync {
    /// The rule `metadata.name` follows.
    fn name_rule(&self) -> Option<NameRule> {
        None
    }

    /// Fills server-set fields of a new object that depend on who creates it.
    fn prepare_for_create(&self, _obj: &mut Value, _user: Option<&Identity>) {}

    /// Defaults beyond the schema's `default`s (only absent fields are filled).
    fn set_defaults(&self, _obj: &mut Value) {}

    /// The type's rules over a whole object, after schema validation (`old` on update).
    fn validate(&self, _obj: &Value, _old: Option<&Value>, _report: &mut Report) {}

    /// The last preparation before the object is stored, which may read other objects and
    /// refuse the write (a legacy token Secret gets its token, a binding resolves its export).
    async fn prepare_for_store(
        &self,
        _write: &WriteAttributes<'_>,
        _obj: &mut Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        Ok(())
    }

    /// Whether a delete always marks the object first, even without finalizers (namespaces,
    /// which are emptied before they go).
    fn marks_on_delete(&self) -> bool {
        false
    }

    /// What a delete changes besides the deletion timestamp when it marks the object.
    fn begin_delete(&self, _obj: &mut Value) {}

    /// Runs after a write was stored; `stored` is the object as watchers see it.
    async fn after_write(
        &self,
        _resource: &Resource,
        _cluster: &str,
        _stored: &Bytes,
        _change: Change,
    ) {
    }
}

/// The strategy of a type nobody contributed to.
pub struct DefaultStrategy;

impl Strategy for DefaultStrategy {}

/// Several contributions to one type, run in order: the first name rule given wins, every
/// preparation and check runs, the first refusal stops the write.
struct Composite(Vec<Arc<dyn Strategy>>);

#[async_trait::async_trait]
impl Strategy for Composite {
    fn name_rule(&self) -> Option<NameRule> {
        self.0.iter().find_map(|s| s.name_rule())
    }

    fn prepare_for_create(&self, obj: &mut Value, user: Option<&Identity>) {
        for s in &self.0 {
            s.prepare_for_create(obj, user);
        }
    }

    fn set_defaults(&self, obj: &mut Value) {
        for s in &self.0 {
            s.set_defaults(obj);
        }
    }

    fn validate(&self, obj: &Value, old: Option<&Value>, report: &mut Report) {
        for s in &self.0 {
            s.validate(obj, old, report);
        }
    }

    async fn prepare_for_store(
        &self,
        write: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        for s in &self.0 {
            s.prepare_for_store(write, obj, old).await?;
        }
        Ok(())
    }

    fn marks_on_delete(&self) -> bool {
        self.0.iter().any(|s| s.marks_on_delete())
    }

    fn begin_delete(&self, obj: &mut Value) {
        for s in &self.0 {
            s.begin_delete(obj);
        }
    }

    async fn after_write(
        &self,
        resource: &Resource,
        cluster: &str,
        stored: &Bytes,
        change: Change,
    ) {
        for s in &self.0 {
            s.after_write(resource, cluster, stored, change).await;
        }
    }
}

/// The strategies of every type, assembled once when the server starts.
#[derive(Clone)]
pub struct Strategies {
    by_type: HashMap<(String, String), Arc<dyn Strategy>>,
    /// What a type without contributions of its own gets: the contributions to every type.
    every: Arc<dyn Strategy>,
}

impl Default for Strategies {
    fn default() -> Self {
        StrategiesBuilder::default().build()
    }
}

impl Strategies {
    /// The strategy of `resource`'s type.
    pub fn of(&self, resource: &Resource) -> &Arc<dyn Strategy> {
        self.by_type
            .get(&(resource.ty.group.clone(), resource.ty.plural.clone()))
            .unwrap_or(&self.every)
    }

    /// The strategy of the type `group`/`plural`.
    pub fn of_type(&self, group: &str, plural: &str) -> &Arc<dyn Strategy> {
        self.by_type
            .get(&(group.to_string(), plural.to_string()))
            .unwrap_or(&self.every)
    }
}

/// Collects contributions, then freezes them into [`Strategies`].
#[derive(Default)]
pub struct StrategiesBuilder {
    by_type: Vec<((String, String), Arc<dyn Strategy>)>,
    every: Vec<Arc<dyn Strategy>>,
}

impl StrategiesBuilder {
    /// Adds a contribution to the type `group`/`plural` (`""` for the core group).
    pub fn add(&mut self, group: &str, plural: &str, s: Arc<dyn Strategy>) -> &mut Self {
        self.by_type
            .push(((group.to_string(), plural.to_string()), s));
        self
    }

    /// Adds a contribution to every type, run after the type's own.
    pub fn add_to_every_type(&mut self, s: Arc<dyn Strategy>) -> &mut Self {
        self.every.push(s);
        self
    }

    /// The frozen table.
    pub fn build(self) -> Strategies {
        let compose = |mut parts: Vec<Arc<dyn Strategy>>| -> Arc<dyn Strategy> {
            match parts.len() {
                0 => Arc::new(DefaultStrategy),
                1 => parts.remove(0),
                _ => Arc::new(Composite(parts)),
            }
        };
        let mut grouped: HashMap<(String, String), Vec<Arc<dyn Strategy>>> = HashMap::new();
        for (key, s) in self.by_type {
            grouped.entry(key).or_default().push(s);
        }
        let by_type = grouped
            .into_iter()
            .map(|(key, mut parts)| {
                parts.extend(self.every.iter().cloned());
                (key, compose(parts))
            })
            .collect();
        Strategies {
            by_type,
            every: compose(self.every),
        }
    }
}
