//! The served resource types, indexed by group/version/resource, and the storage keys of their
//! objects; the per-type [`Strategy`] seam and the [`GenericStore`] every type is written through.

pub mod catalog;
pub mod discovery;
mod generic;
pub mod kcp_types;
pub mod objects;
pub mod openapi;
pub mod resource;
mod strategy;
mod validation;

pub use generic::list::{decode_continue, Collection, Page, Selection};
pub use generic::own::{OwnWrites, Place};
pub use generic::watch::SelectedEvents;
pub use generic::{
    reconcile_namespace, storage_status, Attributes, Deleted, GenericStore, NoValidation,
    Operation, Preconditions, Stored, Write, WriteValidation, Written, MAX_OBJECT_BYTES,
};
pub use resource::{
    Conversion, Resource, TypeInfo, CUSTOM_RESOURCE_VERBS, RESOURCE_VERBS, STATUS_VERBS,
};
pub use strategy::{
    Change, DefaultStrategy, Report, Strategies, StrategiesBuilder, Strategy, WriteAttributes,
};
pub use validation::{duplicate_key, invalid, strict_error, validate_object, Outcome};

use std::collections::HashMap;
use std::sync::Arc;

/// The built-in resources, shared by every logical cluster's view.
pub fn builtin_resources() -> Vec<Arc<Resource>> {
    api::serving::served_types()
        .into_iter()
        .map(TypeInfo::from)
        .chain(crate::registry::kcp_types::kcp_types())
        .map(|t| Arc::new(Resource::new(t)))
        .chain(
            crate::registry::kcp_types::converted_types()
                .into_iter()
                .map(Arc::new),
        )
        .collect()
}

/// A served API group and its versions in preference order.
#[derive(Clone, Debug)]
pub struct Group {
    /// The group name; `""` for the core group.
    pub name: String,
    /// The served versions, in preference order.
    pub versions: Vec<String>,
}

/// Every served resource type.
#[derive(Debug)]
pub struct Registry {
    resources: Vec<Arc<Resource>>,
    by_gvr: HashMap<(String, String, String), Arc<Resource>>,
    groups: Vec<Group>,
}

impl Registry {
    /// A registry of the given resources; a later one with the same group/version/plural wins
    /// the lookup, the first keeps its place in listings.
    pub fn new(list: Vec<Arc<Resource>>) -> Self {
        let mut resources = Vec::new();
        let mut by_gvr = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        for r in list {
            if by_gvr
                .insert(
                    (
                        r.ty.group.clone(),
                        r.ty.version.clone(),
                        r.ty.plural.clone(),
                    ),
                    r.clone(),
                )
                .is_some()
            {
                resources.retain(|o: &Arc<Resource>| {
                    !(o.ty.group == r.ty.group
                        && o.ty.version == r.ty.version
                        && o.ty.plural == r.ty.plural)
                });
            }
            match groups.iter_mut().find(|g| g.name == r.ty.group) {
                Some(g) => {
                    if !g.versions.iter().any(|v| *v == r.ty.version) {
                        g.versions.push(r.ty.version.clone());
                    }
                }
                None => groups.push(Group {
                    name: r.ty.group.clone(),
                    versions: vec![r.ty.version.clone()],
                }),
            }
            resources.push(r);
        }
        Registry {
            resources,
            by_gvr,
            groups,
        }
    }

    /// The registry of everything this server serves.
    pub fn builtin() -> Self {
        Registry::new(builtin_resources())
    }

    /// The resource of a group, version and plural name, if one is served.
    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<&Arc<Resource>> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), resource.to_string()))
    }

    /// Every served resource, each group/version/plural once, in registration order.
    pub fn resources(&self) -> &[Arc<Resource>] {
        &self.resources
    }

    /// Resources of one group version, in registration order.
    pub fn group_version(&self, group: &str, version: &str) -> Vec<&Arc<Resource>> {
        self.resources
            .iter()
            .filter(|r| r.ty.group == group && r.ty.version == version)
            .collect()
    }

    /// Named API groups (the core group excluded), in registration order.
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().filter(|g| !g.name.is_empty())
    }

    /// The served group of that name, if any (`""` is the core group).
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.name == name)
    }
}
