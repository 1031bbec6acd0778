//! The server's own writes: what its in-process controllers (the workspace lifecycle, the
//! initializers, permission claims, namespace cleanup, the default objects of a namespace)
//! write, through the same door as a request. kcp's and kube-controller-manager's controllers
//! write through a client of the API server; here they call the generic store directly, so
//! their objects get the same server metadata, the type's strategy (its defaults, its rules and
//! its hooks after the write), `managedFields` under the controller's name, and the one
//! mapping of storage errors.
//!
//! Two things differ from a request, on purpose: no admission plugin runs (the objects are the
//! server's, not a tenant's, and the plugins guard what tenants write), and a write may set the
//! main resource and the status together ([`WritePart::Whole`]), as kcp's controllers do with
//! a create followed by a status update.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::{GenericStore, NoValidation, Preconditions, Stored, Write};
use crate::meta::schema::FieldValidation;
use crate::meta::status::ApiError;
use crate::registry::objects::{self, WritePart};
use crate::registry::Resource;

/// Where an own write goes: a type, a logical cluster, and for a namespaced type a namespace.
#[derive(Clone, Copy)]
pub struct Place<'a> {
    /// The type.
    pub resource: &'a Arc<Resource>,
    /// The logical cluster.
    pub cluster: &'a str,
    /// The namespace, for a namespaced type.
    pub namespace: Option<&'a str>,
}

impl<'a> Place<'a> {
    /// Objects of cluster-scoped `resource` in `cluster`.
    pub fn cluster(resource: &'a Arc<Resource>, cluster: &'a str) -> Self {
        Place {
            resource,
            cluster,
            namespace: None,
        }
    }

    /// Objects of namespaced `resource` in `namespace` of `cluster`.
    pub fn namespaced(resource: &'a Arc<Resource>, cluster: &'a str, namespace: &'a str) -> Self {
        Place {
            resource,
            cluster,
            namespace: Some(namespace),
        }
    }

    /// The storage key of the object `name` here.
    pub fn key(&self, name: &str) -> String {
        self.resource.key(self.cluster, self.namespace, name)
    }
}

/// The writes of one of the server's controllers, named `manager` in `managedFields`.
pub struct OwnWrites<'a> {
    objects: &'a GenericStore,
    manager: &'a str,
}

impl GenericStore {
    /// The writes of the server's own controller `manager`.
    pub fn own<'a>(&'a self, manager: &'a str) -> OwnWrites<'a> {
        OwnWrites {
            objects: self,
            manager,
        }
    }
}

impl OwnWrites<'_> {
    fn write<'b>(&'b self, place: &Place<'b>, name: &'b str) -> Write<'b> {
        Write {
            resource: place.resource,
            cluster: place.cluster,
            namespace: place.namespace,
            name,
            part: WritePart::Whole,
            user: None,
            dry_run: false,
            // The server's objects follow its own schemas; a field they do not declare is kept
            // (kcp's fields on objects the schemas here leave open).
            field_validation: FieldValidation::Ignore,
            field_manager: Some(self.manager),
            work: 0,
        }
    }

    /// Creates `obj` (main resource and status) at `place`; 409 when it exists.
    pub async fn create(&self, place: Place<'_>, obj: Value) -> Result<Bytes, ApiError> {
        let w = self.write(&place, "");
        match self.objects.create(&w, obj, &NoValidation).await?.stored {
            Stored::Object(bytes) => Ok(bytes),
            Stored::DryRun(_) => Err(ApiError::internal("an own write ran dry")),
        }
    }

    /// Creates `obj` at `place` unless an object of its name is there already; whether it
    /// created it.
    pub async fn create_missing(&self, place: Place<'_>, obj: Value) -> Result<bool, ApiError> {
        match self.create(place, obj).await {
            Ok(_) => Ok(true),
            Err(e) if e.reason == "AlreadyExists" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Lets `change` edit the object `name` at `place` (returning `false` leaves it as it is)
    /// and stores the result, reading again and calling `change` again after a lost race. The
    /// object as it is afterwards; `None` when there is none.
    pub async fn update(
        &self,
        place: Place<'_>,
        name: &str,
        mut change: impl FnMut(&mut Value) -> bool + Send,
    ) -> Result<Option<Value>, ApiError> {
        let w = self.write(&place, name);
        let outcome = self
            .objects
            .update(&w, &NoValidation, |current| {
                let mut next = current.clone();
                // Left as it is: the generic store sees no change and writes nothing.
                if !change(&mut next) {
                    return Ok(current.clone());
                }
                Ok(next)
            })
            .await;
        match outcome {
            Ok(written) => match written.stored {
                Stored::Object(bytes) => objects::decode_stored(&bytes).map(Some),
                Stored::DryRun(_) => Err(ApiError::internal("an own write ran dry")),
            },
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the object `name` at `place` as a client's DELETE would: one with finalizers
    /// (or of a type that always marks first) is marked and stays. Whether it was there.
    pub async fn delete(&self, place: Place<'_>, name: &str) -> Result<bool, ApiError> {
        let w = self.write(&place, name);
        let key = place.key(name);
        let current = match self
            .objects
            .get(place.resource, place.cluster, place.namespace, name)
            .await
        {
            Ok(kv) => kv,
            Err(e) if e.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        };
        match self
            .objects
            .delete(&w, &key, current, &Preconditions::default())
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the object `name` at `place` now, whatever its finalizers: what goes with its
    /// logical cluster, whose content no controller is left to finalize. Whether it was there.
    pub async fn remove(&self, place: Place<'_>, name: &str) -> Result<bool, ApiError> {
        self.objects
            .remove(place.resource, place.cluster, &place.key(name), name)
            .await
    }
}
