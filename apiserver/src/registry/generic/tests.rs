//! The generic store with a strategy and admission over the memory store: no HTTP, no server.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Value};

use super::own::Place;
use super::*;
use crate::meta::field_error::FieldError;
use crate::registry::{Registry, Report, StrategiesBuilder};
use crate::storage::MemoryStore;

/// A strategy for ConfigMaps that records every call, defaults `data.color`, refuses
/// `data.color: "none"`, stamps `data.stored` before storing, and marks on delete.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
}

impl Recording {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: impl Into<String>) {
        self.calls.lock().unwrap().push(call.into());
    }
}

#[async_trait::async_trait]
impl Strategy for Recording {
    fn prepare_for_create(&self, obj: &mut Value, user: Option<&Identity>) {
        self.record("prepare_for_create");
        if let Some(u) = user {
            obj["data"]["creator"] = json!(u.user);
        }
    }

    fn set_defaults(&self, obj: &mut Value) {
        self.record("default");
        if obj["data"].get("color").is_none() {
            obj["data"]["color"] = json!("blue");
        }
    }

    fn validate(&self, obj: &Value, _old: Option<&Value>, report: &mut Report) {
        self.record("validate");
        if obj["data"]["color"] == "none" {
            report.error(FieldError::invalid(
                "data.color",
                "none",
                "a color is needed",
            ));
        }
        if obj["data"]["color"] == "grey" {
            report.warn("data.color", "grey is dull");
        }
    }

    async fn prepare_for_store(
        &self,
        w: &WriteAttributes<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.record(format!(
            "prepare_for_store {} {}",
            w.cluster,
            if old.is_some() { "update" } else { "create" }
        ));
        obj["data"]["stored"] = json!("yes");
        Ok(())
    }

    async fn after_write(&self, _: &Resource, cluster: &str, stored: &Bytes, change: Change) {
        let obj = objects::decode_stored(stored).unwrap();
        self.record(format!(
            "after_write {cluster} {} {change:?}",
            objects::name(&obj)
        ));
    }
}

/// Admission that refuses the name `forbidden` and counts what it saw.
#[derive(Default)]
struct Refusing {
    seen: Mutex<Vec<(Operation, String, bool)>>,
}

#[async_trait::async_trait]
impl WriteValidation for Refusing {
    async fn validate(
        &self,
        attrs: &Attributes<'_>,
        obj: &Value,
        _old: Option<&Value>,
    ) -> Result<(), ApiError> {
        assert_eq!(
            obj["data"]["stored"], "yes",
            "admission runs after prepare_for_store"
        );
        self.seen
            .lock()
            .unwrap()
            .push((attrs.operation, attrs.name.to_string(), attrs.dry_run));
        if attrs.name == "forbidden" {
            return Err(ApiError::forbidden("not this one"));
        }
        Ok(())
    }
}

struct Fixture {
    objects: GenericStore,
    resource: Arc<Resource>,
    strategy: Arc<Recording>,
    user: Identity,
}

fn fixture() -> Fixture {
    let resource = Registry::builtin()
        .lookup("", "v1", "configmaps")
        .cloned()
        .expect("configmaps are built in");
    let strategy = Arc::new(Recording::default());
    let mut b = StrategiesBuilder::default();
    b.add("", "configmaps", strategy.clone());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    Fixture {
        objects: GenericStore::new(store, b.build(), HeavyWork::default()),
        resource,
        strategy,
        user: Identity {
            user: "alice".into(),
            ..Identity::default()
        },
    }
}

impl Fixture {
    fn write<'a>(&'a self, name: &'a str) -> Write<'a> {
        Write {
            resource: &self.resource,
            cluster: "c1",
            namespace: Some("default"),
            name,
            part: WritePart::Main,
            user: Some(&self.user),
            dry_run: false,
            field_validation: FieldValidation::Warn,
            field_manager: Some("test"),
            work: 0,
        }
    }

    async fn stored(&self, name: &str) -> Option<Value> {
        let key = self.resource.key("c1", Some("default"), name);
        let kv = self.objects.store.get(&key).await.unwrap()?;
        Some(objects::decode_stored(&kv.value).unwrap())
    }
}

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"}, "data": data})
}

fn object(written: &Written) -> Value {
    match &written.stored {
        Stored::Object(b) => objects::decode_stored(b).unwrap(),
        Stored::DryRun(v) => v.clone(),
    }
}

#[tokio::test]
async fn a_create_runs_the_strategy_and_admission_in_order_and_stores_the_result() {
    let f = fixture();
    let admission = Refusing::default();
    let mut obj = config_map("", json!({"color": "grey"}));
    obj["metadata"]["generateName"] = json!("paint-");
    obj["metadata"]["uid"] = json!("client-chosen");
    let written = f
        .objects
        .create(&f.write(""), obj, &admission)
        .await
        .unwrap();
    let got = object(&written);
    let name = objects::name(&got).to_string();
    assert!(
        name.starts_with("paint-") && name.len() == "paint-".len() + 5,
        "{name}"
    );
    assert_ne!(
        got["metadata"]["uid"], "client-chosen",
        "the server owns the uid"
    );
    assert_eq!(got["data"]["color"], "grey");
    assert_eq!(got["data"]["creator"], "alice");
    assert_eq!(got["data"]["stored"], "yes");
    assert_eq!(got["metadata"]["managedFields"][0]["manager"], "test");
    assert_eq!(f.stored(&name).await.as_ref(), Some(&got));
    assert_eq!(
        written.warnings,
        vec!["data.color: grey is dull".to_string()],
        "the type's warning comes back (a ConfigMap's data is a string map, so no field is unknown)"
    );
    assert_eq!(
        f.strategy.calls(),
        vec![
            "prepare_for_create".to_string(),
            "default".into(),
            "validate".into(),
            "prepare_for_store c1 create".into(),
            format!("after_write c1 {name} Created"),
        ]
    );
    assert_eq!(
        *admission.seen.lock().unwrap(),
        vec![(Operation::Create, name, false)]
    );
}

#[tokio::test]
async fn refusals_store_nothing_and_a_dry_run_stores_nothing() {
    let f = fixture();
    let admission = Refusing::default();
    let invalid = f
        .objects
        .create(
            &f.write(""),
            config_map("bad", json!({"color": "none"})),
            &admission,
        )
        .await
        .unwrap_err();
    assert_eq!(invalid.code, 422, "{invalid:?}");
    assert!(
        invalid.message.contains("data.color"),
        "{}",
        invalid.message
    );
    assert!(
        admission.seen.lock().unwrap().is_empty(),
        "admission runs after validation"
    );

    let refused = f
        .objects
        .create(&f.write(""), config_map("forbidden", json!({})), &admission)
        .await
        .unwrap_err();
    assert_eq!(refused.code, 403);

    let mut dry = f.write("");
    dry.dry_run = true;
    let written = f
        .objects
        .create(&dry, config_map("dry", json!({})), &admission)
        .await
        .unwrap();
    assert!(matches!(written.stored, Stored::DryRun(_)));
    for name in ["bad", "forbidden", "dry"] {
        assert_eq!(f.stored(name).await, None, "{name} was stored");
    }
    assert!(
        !f.strategy
            .calls()
            .iter()
            .any(|c| c.starts_with("after_write")),
        "nothing was written: {:?}",
        f.strategy.calls()
    );
}

#[tokio::test]
async fn an_update_is_a_compare_and_swap_that_skips_writes_that_change_nothing() {
    let f = fixture();
    let created = f
        .objects
        .create(
            &f.write(""),
            config_map("cm", json!({"color": "red"})),
            &NoValidation,
        )
        .await
        .unwrap();
    let first = object(&created);
    let revision = f.objects.current_revision();

    // The same object again: nothing is written.
    let same = f
        .objects
        .update(&f.write("cm"), &NoValidation, |current| Ok(current.clone()))
        .await
        .unwrap();
    assert_eq!(object(&same), first);
    assert_eq!(f.objects.current_revision(), revision);

    // A change is written with a new resourceVersion; the creator set on create stays.
    let changed = f
        .objects
        .update(&f.write("cm"), &NoValidation, |current| {
            let mut next = current.clone();
            next["data"]["color"] = json!("green");
            Ok(next)
        })
        .await
        .unwrap();
    let changed = object(&changed);
    assert_eq!(changed["data"]["color"], "green");
    assert_eq!(changed["metadata"]["uid"], first["metadata"]["uid"]);
    assert_ne!(
        changed["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );

    // A stale resourceVersion is a conflict, and a name that differs from the URL's is refused.
    let stale = f
        .objects
        .update(&f.write("cm"), &NoValidation, |_| Ok(first.clone()))
        .await
        .unwrap_err();
    assert_eq!(stale.code, 409);
    let renamed = f
        .objects
        .update(&f.write("cm"), &NoValidation, |current| {
            let mut next = current.clone();
            next["metadata"]["name"] = json!("other");
            Ok(next)
        })
        .await
        .unwrap_err();
    assert_eq!(renamed.code, 400);
    let missing = f
        .objects
        .update(&f.write("nothing"), &NoValidation, |c| Ok(c.clone()))
        .await
        .unwrap_err();
    assert_eq!(missing.code, 404);
    assert!(f
        .strategy
        .calls()
        .contains(&"prepare_for_store c1 update".to_string()));
}

#[tokio::test]
async fn a_delete_waits_for_finalizers_and_the_last_one_removed_deletes() {
    let f = fixture();
    let mut obj = config_map("held", json!({}));
    obj["metadata"]["finalizers"] = json!(["example.com/hold"]);
    f.objects
        .create(&f.write(""), obj, &NoValidation)
        .await
        .unwrap();
    let key = f.resource.key("c1", Some("default"), "held");
    let current = f.objects.store.get(&key).await.unwrap().unwrap();
    let pending = f
        .objects
        .delete(&f.write("held"), &key, current, &Preconditions::default())
        .await
        .unwrap();
    let Deleted::Pending(bytes) = pending else {
        panic!("a finalizer holds the object: {pending:?}");
    };
    assert!(objects::is_deleting(
        &objects::decode_stored(&bytes).unwrap()
    ));

    let gone = f
        .objects
        .update(&f.write("held"), &NoValidation, |current| {
            let mut next = current.clone();
            next["metadata"]["finalizers"] = json!([]);
            Ok(next)
        })
        .await
        .unwrap();
    assert!(matches!(gone.stored, Stored::Object(_)));
    assert_eq!(f.stored("held").await, None);
    let calls = f.strategy.calls();
    assert!(
        calls.contains(&"after_write c1 held DeleteBegun".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"after_write c1 held Deleted".to_string()),
        "{calls:?}"
    );

    // Preconditions are checked against the stored object.
    f.objects
        .create(&f.write(""), config_map("plain", json!({})), &NoValidation)
        .await
        .unwrap();
    let key = f.resource.key("c1", Some("default"), "plain");
    let current = f.objects.store.get(&key).await.unwrap().unwrap();
    let wrong_uid = Preconditions {
        uid: Some("not-it".into()),
        resource_version: None,
    };
    let refused = f
        .objects
        .delete(&f.write("plain"), &key, current.clone(), &wrong_uid)
        .await
        .unwrap_err();
    assert_eq!(refused.code, 409);
    let gone = f
        .objects
        .delete(&f.write("plain"), &key, current, &Preconditions::default())
        .await
        .unwrap();
    assert!(matches!(gone, Deleted::Gone(_)));
    assert_eq!(f.stored("plain").await, None);
}

#[tokio::test]
async fn types_without_a_strategy_get_the_contributions_to_every_type() {
    struct Every(Mutex<usize>);
    #[async_trait::async_trait]
    impl Strategy for Every {
        async fn after_write(&self, _: &Resource, _: &str, _: &Bytes, _: Change) {
            *self.0.lock().unwrap() += 1;
        }
    }
    let every = Arc::new(Every(Mutex::new(0)));
    let own = Arc::new(Recording::default());
    let mut b = StrategiesBuilder::default();
    b.add("", "configmaps", own.clone());
    b.add_to_every_type(every.clone());
    let strategies = b.build();
    let registry = Registry::builtin();
    let secrets = registry.lookup("", "v1", "secrets").unwrap();
    let config_maps = registry.lookup("", "v1", "configmaps").unwrap();
    let objects = GenericStore::new(
        Arc::new(MemoryStore::new()),
        strategies,
        HeavyWork::default(),
    );
    for (r, name) in [(secrets, "s"), (config_maps, "c")] {
        let w = Write {
            resource: r,
            cluster: "c1",
            namespace: Some("default"),
            name: "",
            part: WritePart::Main,
            user: None,
            dry_run: false,
            field_validation: FieldValidation::Strict,
            field_manager: None,
            work: 0,
        };
        let obj = json!({"apiVersion": "v1", "kind": r.kind(),
            "metadata": {"name": name, "namespace": "default"}});
        objects.create(&w, obj, &NoValidation).await.unwrap();
    }
    assert_eq!(
        *every.0.lock().unwrap(),
        2,
        "both writes reached the every-type part"
    );
    assert_eq!(
        own.calls()
            .iter()
            .filter(|c| c.starts_with("after_write"))
            .count(),
        1,
        "only the ConfigMap reached its own strategy"
    );
}

#[tokio::test]
async fn the_servers_own_writes_run_the_strategy_and_record_their_manager() {
    let f = fixture();
    let own = f.objects.own("kcp");
    let place = Place::namespaced(&f.resource, "c1", "default");
    let created = own
        .create(place, config_map("mine", json!({"color": "red"})))
        .await
        .unwrap();
    let got = objects::decode_stored(&created).unwrap();
    assert_eq!(got["data"]["stored"], "yes", "the type prepared it");
    assert!(got["metadata"]["uid"].is_string(), "the server's metadata");
    assert_eq!(got["metadata"]["managedFields"][0]["manager"], "kcp");
    assert!(f
        .strategy
        .calls()
        .contains(&"after_write c1 mine Created".to_string()));
    assert!(
        !own.create_missing(place, config_map("mine", json!({})))
            .await
            .unwrap(),
        "an object of the name is there already"
    );

    // An edit that changes nothing writes nothing; one that does is stored.
    let before = f.stored("mine").await.unwrap();
    let same = own.update(place, "mine", |_| false).await.unwrap().unwrap();
    assert_eq!(
        same["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    let changed = own
        .update(place, "mine", |cm| {
            cm["data"]["color"] = json!("green");
            true
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed["data"]["color"], "green");
    assert_eq!(f.stored("mine").await.unwrap()["data"]["color"], "green");
    assert!(own
        .update(place, "absent", |_| true)
        .await
        .unwrap()
        .is_none());

    // A delete waits for finalizers, as a client's; a removal does not.
    own.update(place, "mine", |cm| {
        cm["metadata"]["finalizers"] = json!(["example.com/hold"]);
        true
    })
    .await
    .unwrap();
    assert!(own.delete(place, "mine").await.unwrap());
    assert!(objects::is_deleting(&f.stored("mine").await.unwrap()));
    assert!(own.remove(place, "mine").await.unwrap());
    assert!(f.stored("mine").await.is_none());
    assert!(f
        .strategy
        .calls()
        .contains(&"after_write c1 mine Deleted".to_string()));
    assert!(!own.remove(place, "mine").await.unwrap());
    assert!(!own.delete(place, "mine").await.unwrap());
}

#[tokio::test]
async fn the_servers_own_writes_set_the_status_with_the_object() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let objects = GenericStore::new(store, Strategies::default(), HeavyWork::default());
    let namespaces = Registry::builtin()
        .lookup("", "v1", "namespaces")
        .cloned()
        .expect("namespaces are built in");
    assert!(namespaces.ty.status_subresource);
    let own = objects.own("kcp");
    let place = Place::cluster(&namespaces, "c1");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"},
        "status": {"phase": "Active", "conditions": [{"type": "Held", "status": "True"}]}});
    let got = objects::decode_stored(&own.create(place, ns).await.unwrap()).unwrap();
    assert_eq!(got["status"]["conditions"][0]["type"], "Held");
    let got = own
        .update(place, "n", |ns| {
            ns["status"]["conditions"][0]["status"] = json!("False");
            ns["metadata"]["labels"] = json!({"a": "b"});
            true
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["status"]["conditions"][0]["status"], "False");
    assert_eq!(got["metadata"]["labels"]["a"], "b");
}
