//! Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in kinds served.
//! Maps merge, `null` deletes, lists replace unless a per-field strategy says merge; directives are honoured.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Why a strategic merge patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch (or the original) is not a JSON object.
    #[error("strategic merge patch must be a JSON object, got {0}")]
    NotAnObject(String),
    /// A `$patch` directive has an unknown value.
    #[error("unknown patch type: {directive} in map: {map}")]
    BadPatchType {
        /// The directive value.
        directive: String,
        /// The map it appeared in (JSON).
        map: String,
    },
    /// A list element of a merge-by-key list lacks the merge key.
    #[error("map: {map} does not contain declared merge key: {key}")]
    NoMergeKey {
        /// The element (JSON).
        map: String,
        /// The merge key.
        key: String,
    },
    /// `$retainKeys` is not a list of strings, or the patch sets keys outside it.
    #[error("invalid patch format of retainKeys")]
    BadRetainKeys,
    /// `$deleteFromPrimitiveList/<field>` is not a list.
    #[error("invalid patch format of primitive list")]
    BadPrimitiveList,
    /// `$setElementOrder/<field>` is not a list.
    #[error("invalid patch format of setElementOrder list")]
    BadSetElementOrder,
    /// A merged list mixes maps with other values.
    #[error("list element types are not identical: {0}")]
    MixedListTypes(String),
    /// A merged list contains lists.
    #[error("lists of lists are not supported")]
    ListOfLists,
    /// A list of maps has a merge strategy but no merge key.
    #[error("cannot merge lists without merge key for {0}")]
    MergeWithoutKey(String),
}

/// How a field is combined when both the original and the patch have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldStrategy {
    /// A list of maps merged element-wise by the value of this key.
    MergeByKey(String),
    /// A list of scalars merged as an ordered set union.
    MergePrimitives,
    /// The patch value replaces the original wholesale (also for maps).
    Replace,
}

/// Patch strategies by field path (dotted, from the object root; list elements share their
/// list's path). Fields not listed use the defaults: maps merge, lists replace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeKeys {
    entries: Vec<(Vec<String>, FieldStrategy)>,
}

impl MergeKeys {
    /// An empty table (pure defaults).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the strategy for a dotted path such as `metadata.ownerReferences`.
    pub fn insert(&mut self, path: &str, strategy: FieldStrategy) {
        let segs: Vec<String> = path.split('.').map(str::to_string).collect();
        self.entries.retain(|(p, _)| *p != segs);
        self.entries.push((segs, strategy));
    }

    /// Builder form of [`MergeKeys::insert`].
    pub fn with(mut self, path: &str, strategy: FieldStrategy) -> Self {
        self.insert(path, strategy);
        self
    }

    /// The strategy registered for a path, if any.
    pub fn lookup(&self, path: &[String]) -> Option<&FieldStrategy> {
        self.entries
            .iter()
            .find(|(p, _)| p.as_slice() == path)
            .map(|(_, s)| s)
    }

    /// The ObjectMeta strategies every kind shares: `ownerReferences` by `uid`, `finalizers` as a set.
    pub fn object_meta() -> Self {
        MergeKeys::new()
            .with(
                "metadata.ownerReferences",
                FieldStrategy::MergeByKey("uid".into()),
            )
            .with("metadata.finalizers", FieldStrategy::MergePrimitives)
    }
}

/// The strategies for a served built-in kind (`group` is empty for the core group). Unknown
/// kinds get the ObjectMeta entries only.
pub fn merge_keys_for(group: &str, kind: &str) -> MergeKeys {
    let keys = MergeKeys::object_meta();
    match (group, kind) {
        // ServiceAccount.imagePullSecrets carries no patch strategy upstream: it stays atomic.
        ("", "ServiceAccount") => keys.with("secrets", FieldStrategy::MergeByKey("name".into())),
        ("", "Namespace") => keys.with(
            "status.conditions",
            FieldStrategy::MergeByKey("type".into()),
        ),
        // ConfigMap, Secret, core/v1 Event, events.k8s.io/v1 Event and coordination.k8s.io/v1
        // Lease have no list fields with a merge strategy; Namespace spec.finalizers is atomic.
        _ => keys,
    }
}

/// Applies a strategic merge patch to `original` and returns the patched document. `null` patch
/// values delete keys; directives never survive into the result.
pub fn apply(original: &Value, patch: &Value, merge_keys: &MergeKeys) -> Result<Value, PatchError> {
    let Value::Object(patch_map) = patch else {
        return Err(PatchError::NotAnObject(kind_name(patch).into()));
    };
    let original_map = match original {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        other => return Err(PatchError::NotAnObject(kind_name(other).into())),
    };
    let mut path = Vec::new();
    let merged = merge_map(original_map, patch_map, &mut path, merge_keys)?;
    Ok(Value::Object(merged))
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_directive_key(k: &str) -> bool {
    k == DIRECTIVE
        || k == RETAIN_KEYS
        || k.starts_with(SET_ELEMENT_ORDER)
        || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(d) = patch.get(DIRECTIVE) {
        match d.as_str() {
            Some("replace") => {
                let mut stripped = patch.clone();
                stripped.remove(DIRECTIVE);
                return merge_map(Map::new(), &stripped, path, mk);
            }
            Some("delete") => return Ok(Map::new()),
            // accepted as the default behaviour
            Some("merge") => {}
            _ => {
                return Err(PatchError::BadPatchType {
                    directive: d
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| d.to_string()),
                    map: Value::Object(patch.clone()).to_string(),
                })
            }
        }
    }

    if let Some(rk) = patch.get(RETAIN_KEYS) {
        let keep: Vec<&str> = match rk {
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().ok_or(PatchError::BadRetainKeys))
                .collect::<Result<_, _>>()?,
            _ => return Err(PatchError::BadRetainKeys),
        };
        for (k, v) in patch {
            if v.is_null() || is_directive_key(k) {
                continue;
            }
            if !keep.contains(&k.as_str()) {
                return Err(PatchError::BadRetainKeys);
            }
        }
        original.retain(|k, _| keep.contains(&k.as_str()));
    }

    // Lists with a `$setElementOrder` directive are merged and reordered first.
    let mut ordered_fields: Vec<&str> = Vec::new();
    for (k, order) in patch {
        let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(PatchError::BadSetElementOrder);
        };
        let patch_list = match patch.get(field) {
            Some(Value::Array(l)) => Some(l),
            // a non-list patch value is handled by the ordinary pass below
            Some(Value::Null) | Some(_) => continue,
            None => None,
        };
        let original_list = match original.get(field) {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        };
        path.push(field.to_string());
        let strategy = mk.lookup(path).cloned();
        let key = match &strategy {
            Some(FieldStrategy::MergeByKey(k)) => Some(k.clone()),
            _ => None,
        };
        let merged = match (&original_list, patch_list) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => clean_list(p, path, mk)?,
            (Some(o), Some(p)) => merge_list_value(o.clone(), p, strategy.as_ref(), path, mk)?,
            (None, None) => {
                path.pop();
                continue;
            }
        };
        path.pop();
        let server_order = original_list.unwrap_or_default();
        let order_positions = Positions::of(order, key.as_deref());
        let (in_order, server_only): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|item| order_positions.get(item, key.as_deref()).is_some());
        let reordered = interleave(
            sort_by_order(server_only, &server_order, key.as_deref()),
            sort_by_order(in_order, order, key.as_deref()),
            &server_order,
            key.as_deref(),
        );
        original.insert(field.to_string(), Value::Array(reordered));
        ordered_fields.push(field);
    }

    let mut deletions: Vec<(&str, &Value)> = Vec::new();
    for (k, pv) in patch {
        if k == DIRECTIVE || k == RETAIN_KEYS || k.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            deletions.push((field, pv));
            continue;
        }
        if ordered_fields.contains(&k.as_str()) {
            continue;
        }
        if pv.is_null() {
            original.remove(k);
            continue;
        }
        path.push(k.clone());
        let merged = match original.remove(k) {
            None => clean_value(pv, path, mk)?,
            Some(ov) => merge_value(ov, pv, path, mk)?,
        };
        path.pop();
        original.insert(k.clone(), merged);
    }

    for (field, pv) in deletions {
        let Value::Array(remove) = pv else {
            return Err(PatchError::BadPrimitiveList);
        };
        if let Some(Value::Array(list)) = original.get_mut(field) {
            list.retain(|item| !remove.contains(item));
        }
    }
    Ok(original)
}

fn merge_value(
    original: Value,
    patch: &Value,
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Value, PatchError> {
    let strategy = mk.lookup(path).cloned();
    match (original, patch) {
        (Value::Object(o), Value::Object(p)) => {
            if strategy == Some(FieldStrategy::Replace) {
                clean_value(patch, path, mk)
            } else {
                Ok(Value::Object(merge_map(o, p, path, mk)?))
            }
        }
        (Value::Array(o), Value::Array(p)) => Ok(Value::Array(merge_list_value(
            o,
            p,
            strategy.as_ref(),
            path,
            mk,
        )?)),
        (_, p) => clean_value(p, path, mk),
    }
}

fn merge_list_value(
    original: Vec<Value>,
    patch: &[Value],
    strategy: Option<&FieldStrategy>,
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Vec<Value>, PatchError> {
    match strategy {
        Some(FieldStrategy::MergeByKey(key)) => merge_list(original, patch, Some(key), path, mk),
        Some(FieldStrategy::MergePrimitives) => merge_list(original, patch, None, path, mk),
        Some(FieldStrategy::Replace) | None => clean_list(patch, path, mk),
    }
}

/// Turns a patch value that has nothing to merge with into a plain value: nulls dropped from
/// maps, directives applied and removed.
fn clean_value(v: &Value, path: &mut Vec<String>, mk: &MergeKeys) -> Result<Value, PatchError> {
    match v {
        Value::Object(m) => Ok(Value::Object(merge_map(Map::new(), m, path, mk)?)),
        Value::Array(items) => Ok(Value::Array(clean_list(items, path, mk)?)),
        other => Ok(other.clone()),
    }
}

/// Cleans a list taken from the patch: directive-only elements (`{"$patch": ...}` and
/// `$patch: delete` entries) are dropped, maps are cleaned.
fn clean_list(
    items: &[Value],
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Vec<Value>, PatchError> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if let Value::Object(m) = item {
            match m.get(DIRECTIVE).and_then(Value::as_str) {
                Some("delete") => continue,
                Some("replace") if m.len() == 1 => continue,
                _ => {}
            }
            let mut stripped = m.clone();
            stripped.remove(DIRECTIVE);
            out.push(Value::Object(merge_map(Map::new(), &stripped, path, mk)?));
        } else {
            out.push(item.clone());
        }
    }
    Ok(out)
}

/// Merges a list with a merge strategy: by `key` for lists of maps, as a set for scalars.
fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    key: Option<&str>,
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    if original.iter().chain(patch).any(Value::is_array) {
        return Err(PatchError::ListOfLists);
    }
    // Directive elements (`{"$patch": "replace"}` etc.) are maps even in scalar lists.
    let is_directive_elem = |v: &Value| v.as_object().is_some_and(|m| m.contains_key(DIRECTIVE));
    let maps = original
        .iter()
        .chain(patch)
        .filter(|v| !is_directive_elem(v))
        .filter(|v| v.is_object())
        .count();
    let total = original
        .iter()
        .chain(patch)
        .filter(|v| !is_directive_elem(v))
        .count();
    if maps == 0 {
        merge_scalar_list(original, patch)
    } else if maps == total {
        let Some(key) = key else {
            return Err(PatchError::MergeWithoutKey(path.join(".")));
        };
        merge_keyed_list(original, patch, key, path, mk)
    } else {
        Err(PatchError::MixedListTypes(
            Value::Array(original.iter().chain(patch).cloned().collect()).to_string(),
        ))
    }
}

fn merge_scalar_list(original: Vec<Value>, patch: &[Value]) -> Result<Vec<Value>, PatchError> {
    let mut replace = false;
    let mut patch_items: Vec<Value> = Vec::new();
    let mut in_patch: HashSet<String> = HashSet::new();
    for p in patch {
        if let Some(m) = p.as_object() {
            match m.get(DIRECTIVE).and_then(Value::as_str) {
                Some("replace") => replace = true,
                Some("merge") | Some("delete") => {}
                _ => {
                    return Err(PatchError::BadPatchType {
                        directive: m.get(DIRECTIVE).map(|d| d.to_string()).unwrap_or_default(),
                        map: p.to_string(),
                    })
                }
            }
            continue;
        }
        if in_patch.insert(p.to_string()) {
            patch_items.push(p.clone());
        }
    }
    if replace {
        return Ok(patch_items);
    }
    let mut server_only: Vec<Value> = Vec::new();
    let mut seen = in_patch;
    for o in &original {
        if seen.insert(o.to_string()) {
            server_only.push(o.clone());
        }
    }
    Ok(interleave(server_only, patch_items, &original, None))
}

fn merge_keyed_list(
    original: Vec<Value>,
    patch: &[Value],
    key: &str,
    path: &mut Vec<String>,
    mk: &MergeKeys,
) -> Result<Vec<Value>, PatchError> {
    let mut base = original;
    let mut regular: Vec<&Map<String, Value>> = Vec::new();
    let mut deleted: HashSet<String> = HashSet::new();
    let mut replace = false;
    for p in patch {
        let Value::Object(m) = p else { continue };
        match m.get(DIRECTIVE) {
            None => regular.push(m),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let Some(kv) = m.get(key) else {
                        return Err(PatchError::NoMergeKey {
                            map: p.to_string(),
                            key: key.to_string(),
                        });
                    };
                    deleted.insert(kv.to_string());
                }
                Some("replace") => replace = true,
                // an explicit merge element is an ordinary element
                Some("merge") => regular.push(m),
                _ => {
                    return Err(PatchError::BadPatchType {
                        directive: d
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| d.to_string()),
                        map: p.to_string(),
                    })
                }
            },
        }
    }
    if !deleted.is_empty() {
        base.retain(|o| identity(o, Some(key)).is_none_or(|id| !deleted.contains(&id)));
    }
    if replace {
        let items: Vec<Value> = regular
            .iter()
            .map(|m| Value::Object((*m).clone()))
            .collect();
        return clean_list(&items, path, mk);
    }
    let server_order = base.clone();
    let mut merged = base;
    // Where each merge-key value sits in `merged`, so a long list merges in linear time.
    let mut index = Positions::of(&merged, Some(key));
    let mut patch_order: Vec<Value> = Vec::new();
    for m in regular {
        let Some(kv) = m.get(key) else {
            return Err(PatchError::NoMergeKey {
                map: Value::Object(m.clone()).to_string(),
                key: key.to_string(),
            });
        };
        let mut stripped = m.clone();
        stripped.remove(DIRECTIVE);
        let id = kv.to_string();
        match index.0.get(&id).copied() {
            Some(i) => {
                let existing = match merged.get_mut(i) {
                    Some(Value::Object(o)) => std::mem::take(o),
                    _ => Map::new(),
                };
                let combined = merge_map(existing, &stripped, path, mk)?;
                if let Some(slot) = merged.get_mut(i) {
                    *slot = Value::Object(combined);
                }
            }
            None => {
                index.0.insert(id, merged.len());
                merged.push(Value::Object(merge_map(Map::new(), &stripped, path, mk)?));
            }
        }
        patch_order.push(Value::Object(m.clone()));
    }
    let patch_positions = Positions::of(&patch_order, Some(key));
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| patch_positions.get(item, Some(key)).is_some());
    Ok(interleave(
        sort_by_order(server_only, &server_order, Some(key)),
        sort_by_order(in_patch, &patch_order, Some(key)),
        &server_order,
        Some(key),
    ))
}

/// How an item is found in a list: its merge-key value for maps, itself for scalars, as JSON
/// text (hashable, so lookups in long lists stay linear in total).
fn identity(item: &Value, key: Option<&str>) -> Option<String> {
    match key {
        Some(k) => item.get(k).map(Value::to_string),
        None => Some(item.to_string()),
    }
}

/// The first position of each item of a list, by [`identity`].
struct Positions(HashMap<String, usize>);

impl Positions {
    fn of(order: &[Value], key: Option<&str>) -> Self {
        let mut map = HashMap::with_capacity(order.len());
        for (i, o) in order.iter().enumerate() {
            if let Some(id) = identity(o, key) {
                map.entry(id).or_insert(i);
            }
        }
        Positions(map)
    }

    /// Where `item` appears: by merge-key value for maps, by equality for scalars.
    fn get(&self, item: &Value, key: Option<&str>) -> Option<usize> {
        self.0.get(&identity(item, key)?).copied()
    }
}

/// Stable-sorts items by their position in `order`; items not found go last.
fn sort_by_order(mut items: Vec<Value>, order: &[Value], key: Option<&str>) -> Vec<Value> {
    let positions = Positions::of(order, key);
    items.sort_by_cached_key(|item| positions.get(item, key).unwrap_or(usize::MAX));
    items
}

/// Interleaves server-only items into patch items, both already ordered: a server-only item goes
/// first only when both sit in the live list and it came earlier there; otherwise patch items lead.
fn interleave(
    server_only: Vec<Value>,
    patch_items: Vec<Value>,
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let positions = Positions::of(server_order, key);
    let mut out = Vec::with_capacity(server_only.len() + patch_items.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (positions.get(l, key), positions.get(r, key)),
                (Some(li), Some(ri)) if li.cmp(&ri) == Ordering::Less
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        if let Some(v) = next {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests;
