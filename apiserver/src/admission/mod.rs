//! Admission: what a write passes besides its type's own strategy, as kube-apiserver's
//! admission chain. Mutating plugins ([`Admission::admit`]) run once the request's object is
//! decoded, before it is named and validated; validating ones
//! ([`WriteValidation::validate`]) run after the type prepared it, right before it is stored, on
//! every attempt of an update's compare-and-swap loop.
//!
//! The plugins: the namespace lifecycle ([`namespaces`]), the object-count limit
//! ([`limits`]) and kcp's path annotation (the tenancy's `PathAnnotation`). The structural schema,
//! CEL rules and the type rules are part of the generic store's validation
//! ([`crate::registry::validate_object`]), as in kube-apiserver, where they run in the custom
//! resource's strategy.

pub mod limits;
pub mod namespaces;
pub mod rules;

use std::sync::Arc;

use serde_json::Value;

use crate::meta::status::ApiError;
pub use crate::registry::{invalid, strict_error, Attributes, Operation, Outcome, WriteValidation};

/// One admission plugin. Its validating half is [`WriteValidation`], which the generic store
/// calls; the mutating half is called by the handlers.
#[async_trait::async_trait]
pub trait Admission: WriteValidation {
    /// May change or refuse the object as the request sent it (on create, before it is named).
    async fn admit(&self, _attrs: &Attributes<'_>, _obj: &mut Value) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Plugins run in order; the first refusal stops the write.
#[derive(Clone, Default)]
pub struct Chain(Vec<Arc<dyn Admission>>);

impl Chain {
    /// A chain of `plugins`, run in the order given.
    pub fn new(plugins: Vec<Arc<dyn Admission>>) -> Self {
        Chain(plugins)
    }
}

#[async_trait::async_trait]
impl WriteValidation for Chain {
    async fn mutate(
        &self,
        attrs: &Attributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        for plugin in &self.0 {
            plugin.mutate(attrs, obj, old).await?;
        }
        Ok(())
    }

    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        for plugin in &self.0 {
            plugin.validate(attrs, obj, old).await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Admission for Chain {
    async fn admit(&self, attrs: &Attributes<'_>, obj: &mut Value) -> Result<(), ApiError> {
        for plugin in &self.0 {
            plugin.admit(attrs, obj).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::registry::Registry;

    /// A plugin that writes its name into the object when admitting, records when validating,
    /// and refuses both when told to.
    struct Plugin {
        name: &'static str,
        refuse: bool,
        log: Arc<Mutex<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl WriteValidation for Plugin {
        async fn validate(
            &self,
            _: &Attributes<'_>,
            _: &Value,
            _: Option<&Value>,
        ) -> Result<(), ApiError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("validate {}", self.name));
            match self.refuse {
                true => Err(ApiError::forbidden(format!("{} says no", self.name))),
                false => Ok(()),
            }
        }
    }

    #[async_trait::async_trait]
    impl Admission for Plugin {
        async fn admit(&self, _: &Attributes<'_>, obj: &mut Value) -> Result<(), ApiError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("admit {}", self.name));
            obj["seen"].as_array_mut().unwrap().push(self.name.into());
            match self.refuse {
                true => Err(ApiError::forbidden(format!("{} says no", self.name))),
                false => Ok(()),
            }
        }
    }

    #[tokio::test]
    async fn plugins_run_in_order_and_the_first_refusal_stops_the_chain() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let plugin = |name, refuse| {
            Arc::new(Plugin {
                name,
                refuse,
                log: log.clone(),
            }) as Arc<dyn Admission>
        };
        let chain = Chain::new(vec![
            plugin("a", false),
            plugin("b", true),
            plugin("c", false),
        ]);
        let registry = Registry::builtin();
        let resource = registry.lookup("", "v1", "configmaps").unwrap();
        let attrs = Attributes {
            resource,
            cluster: "c1",
            namespace: Some("default"),
            name: "x",
            operation: Operation::Create,
            user: None,
            dry_run: false,
        };
        let mut obj = serde_json::json!({"seen": []});
        let admitted = chain.admit(&attrs, &mut obj).await.unwrap_err();
        assert_eq!(admitted.message, "b says no");
        assert_eq!(obj["seen"], serde_json::json!(["a", "b"]));
        let validated = chain.validate(&attrs, &obj, None).await.unwrap_err();
        assert_eq!(validated.message, "b says no");
        assert_eq!(
            *log.lock().unwrap(),
            ["admit a", "admit b", "validate a", "validate b"]
        );
        // As the generic store sees it: the chain is the write's validation.
        let as_validation: &dyn WriteValidation = &chain;
        assert!(as_validation.validate(&attrs, &obj, None).await.is_err());
    }
}
