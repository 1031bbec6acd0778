//! Validation of one object, the same for every type: the metadata rules, the type's defaults,
//! the structural schema (prune, default, validate, CEL) and the type's own rules. In
//! kube-apiserver this is the strategy's `Validate` (a custom resource's schema and CEL rules run
//! there, not in admission); the API server's writes and the admission webhook both use it.

use serde_json::Value;

use super::strategy::{Report, Strategy};
use super::Resource;
use crate::meta::field_error::FieldError;
use crate::meta::names::NameRule;
use crate::meta::schema::FieldValidation;
use crate::meta::status::{ApiError, Cause};

/// What validation found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Fields the schema does not declare (already pruned from the object).
    pub unknown_fields: Vec<String>,
    /// Problems that refuse the object.
    pub errors: Vec<FieldError>,
    /// Problems worth telling the client that do not refuse it.
    pub warnings: Vec<String>,
}

/// Defaults, prunes and validates `obj` (the new state; `old` on update).
pub fn validate_object(
    r: &Resource,
    strategy: &dyn Strategy,
    obj: &mut Value,
    old: Option<&Value>,
    mode: FieldValidation,
) -> Outcome {
    let mut errors = crate::meta::names::validate_object_meta(
        obj.get("metadata").unwrap_or(&Value::Null),
        r.ty.namespaced,
        strategy.name_rule().unwrap_or(NameRule::DnsSubdomain),
    );
    strategy.set_defaults(obj);
    let schema = if crate::meta::schema::has_rules(&r.ty.schema) {
        off_the_workers(|| crate::meta::schema::admit(obj, old, &r.ty.schema, mode))
    } else {
        crate::meta::schema::admit(obj, old, &r.ty.schema, mode)
    };
    errors.extend(schema.errors);
    let mut rules = Report::default();
    strategy.validate(obj, old, &mut rules);
    errors.extend(rules.errors);
    Outcome {
        unknown_fields: schema.unknown_fields,
        errors,
        warnings: rules.warnings,
    }
}

/// How many objects' CEL rules may be evaluated at once: a core for the async workers, the
/// others for CEL, at least one.
fn cel_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1))
        .unwrap_or(1)
        .max(1)
}

/// A counting semaphore for threads that may block (the CEL evaluations).
struct Slots {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

/// One held slot, given back when dropped.
struct Slot<'a>(&'a Slots);

impl Slots {
    fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

static CEL_SLOTS: std::sync::LazyLock<Slots> = std::sync::LazyLock::new(|| Slots {
    free: std::sync::Mutex::new(cel_slots()),
    freed: std::sync::Condvar::new(),
});

/// Runs CEL evaluation (bounded by its cost budget, yet up to about a second of CPU) off the
/// async workers: the worker hands its other tasks over before this thread blocks, and at most
/// [`cel_slots`] evaluations run at once, so one tenant's rules cannot take every core.
fn off_the_workers<T>(f: impl FnOnce() -> T) -> T {
    let run = || {
        let _slot = CEL_SLOTS.acquire();
        f()
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(run)
        }
        _ => run(),
    }
}

/// The 422 of an object that failed validation: `<Kind>.<group> "<name>" is invalid: ...`.
pub fn invalid(r: &Resource, name: &str, errors: &[FieldError]) -> ApiError {
    let mut seen = std::collections::HashSet::new();
    let causes = errors
        .iter()
        .filter(|e| seen.insert(e.to_string()))
        .map(|e| Cause {
            reason: e.reason().to_string(),
            message: e.body(),
            // An error about no field is "<nil>", as kube-apiserver prints a nil path.
            field: e.field.clone(),
        })
        .collect();
    ApiError::invalid(r.kind(), &r.ty.group, name, causes)
}

/// The 400 of a strict write with unknown fields.
pub fn strict_error(r: &Resource, unknown: &[String]) -> ApiError {
    let list: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    ApiError::bad_request(format!(
        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
        r.kind(),
        r.ty.version,
        r.kind(),
        list.join(", ")
    ))
}

/// The first key that appears twice in one object of a JSON document (as `a.b.c`), which a
/// strict decoder refuses; `None` when there is none or the text is not JSON.
pub fn duplicate_key(json: &[u8]) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;

    /// Walks a value; `found` keeps the first duplicate's path.
    struct Walk<'a> {
        path: String,
        found: &'a RefCell<Option<String>>,
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq
                .next_element_seed(Walk {
                    path: self.path.clone(),
                    found: self.found,
                })?
                .is_some()
            {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = if self.path.is_empty() {
                    key.clone()
                } else {
                    format!("{}.{key}", self.path)
                };
                if !seen.insert(key) && self.found.borrow().is_none() {
                    *self.found.borrow_mut() = Some(path.clone());
                }
                map.next_value_seed(Walk {
                    path,
                    found: self.found,
                })?;
            }
            Ok(())
        }
    }

    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(json);
    // serde_json's nesting limit stays: a body deeper than it is refused elsewhere.
    let walk = Walk {
        path: String::new(),
        found: &found,
    };
    walk.deserialize(&mut de).ok()?;
    found.into_inner()
}

#[cfg(test)]
mod duplicate_tests {
    use super::duplicate_key;

    #[test]
    fn the_first_repeated_key_is_named_by_its_path() {
        assert_eq!(duplicate_key(br#"{"a": 1, "b": {"c": 1}}"#), None);
        assert_eq!(
            duplicate_key(br#"{"data": {"a": "1"}, "data": {"b": "2"}}"#).as_deref(),
            Some("data")
        );
        assert_eq!(
            duplicate_key(br#"{"metadata": {"labels": {"x": "1", "x": "2"}}}"#).as_deref(),
            Some("metadata.labels.x")
        );
        assert_eq!(duplicate_key(br#"[{"a": 1}, {"a": 2}]"#), None);
        assert_eq!(duplicate_key(b"not json"), None);
    }
}
