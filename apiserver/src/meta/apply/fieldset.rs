//! [`FieldSet`]: a set of field paths stored as a trie, with set algebra and the
//! FieldsV1 JSON encoding used by `metadata.managedFields[].fieldsV1`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::path::{path_to_string, Path, PathElement};

/// Deepest path the object walkers descend to; deeper values are treated as leaves.
pub(crate) const MAX_DEPTH: usize = 256;
/// Deepest FieldsV1 nesting accepted when decoding (above [`MAX_DEPTH`], so every
/// set this module produces decodes again).
const MAX_DECODE_DEPTH: usize = MAX_DEPTH + 16;

/// A set of field paths (the fields a manager owns, or that a write touched).
///
/// A path is a *member* when the node it names is itself in the set; a path can also
/// merely lead to members deeper down. In FieldsV1 a member without children is `{}`,
/// a member with children carries a `".": {}` entry, and a non-member node only lists
/// its children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    children: BTreeMap<PathElement, Node>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    member: bool,
    set: FieldSet,
}

impl Node {
    fn is_empty(&self) -> bool {
        !self.member && self.set.is_empty()
    }
}

/// Why a FieldsV1 value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldsV1Error {
    /// A node is not a JSON object.
    #[error("FieldsV1 node at {path:?} is not an object")]
    NotAnObject {
        /// The rendered path of the node.
        path: String,
    },
    /// A key is not `.`, `f:…`, `k:{…}`, `v:…` or `i:N`.
    #[error("invalid FieldsV1 key {key:?} at {path:?}")]
    BadKey {
        /// The offending key.
        key: String,
        /// The rendered path of its parent.
        path: String,
    },
    /// The nesting is deeper than any real object.
    #[error("FieldsV1 nesting too deep")]
    TooDeep,
}

impl FieldSet {
    /// An empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// True when the set holds no member at all.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Adds `path` as a member (the empty path is ignored: the root is never a member).
    pub fn insert(&mut self, path: &[PathElement]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let node = self.children.entry(first.clone()).or_default();
        if rest.is_empty() {
            node.member = true;
        } else {
            node.set.insert(rest);
        }
    }

    /// True when `path` is a member.
    pub fn contains(&self, path: &[PathElement]) -> bool {
        match path.split_first() {
            None => false,
            Some((first, rest)) => match self.children.get(first) {
                None => false,
                Some(node) if rest.is_empty() => node.member,
                Some(node) => node.set.contains(rest),
            },
        }
    }

    /// True when `path` or any path below it is a member.
    pub fn contains_at_or_below(&self, path: &[PathElement]) -> bool {
        match path.split_first() {
            None => !self.is_empty(),
            Some((first, rest)) => match self.children.get(first) {
                None => false,
                Some(node) if rest.is_empty() => !node.is_empty(),
                Some(node) => node.set.contains_at_or_below(rest),
            },
        }
    }

    /// Removes `path` as a member (its descendants stay) and prunes empty nodes.
    pub fn remove(&mut self, path: &[PathElement]) {
        self.remove_inner(path, false);
    }

    /// Removes `path` and everything below it.
    pub fn remove_subtree(&mut self, path: &[PathElement]) {
        self.remove_inner(path, true);
    }

    fn remove_inner(&mut self, path: &[PathElement], subtree: bool) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let Some(node) = self.children.get_mut(first) else {
            return;
        };
        if rest.is_empty() {
            if subtree {
                node.set = FieldSet::new();
            }
            node.member = false;
        } else {
            node.set.remove_inner(rest, subtree);
        }
        if node.is_empty() {
            self.children.remove(first);
        }
    }

    /// Members of either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.union_in_place(other);
        out
    }

    fn union_in_place(&mut self, other: &FieldSet) {
        for (pe, theirs) in &other.children {
            let mine = self.children.entry(pe.clone()).or_default();
            mine.member |= theirs.member;
            mine.set.union_in_place(&theirs.set);
        }
    }

    /// Members of `self` that are not members of `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        for (pe, mine) in &self.children {
            let node = match other.children.get(pe) {
                None => mine.clone(),
                Some(theirs) => Node {
                    member: mine.member && !theirs.member,
                    set: mine.set.difference(&theirs.set),
                },
            };
            if !node.is_empty() {
                out.children.insert(pe.clone(), node);
            }
        }
        out
    }

    /// Members of both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        for (pe, mine) in &self.children {
            if let Some(theirs) = other.children.get(pe) {
                let node = Node {
                    member: mine.member && theirs.member,
                    set: mine.set.intersection(&theirs.set),
                };
                if !node.is_empty() {
                    out.children.insert(pe.clone(), node);
                }
            }
        }
        out
    }

    /// All member paths, in structured-merge-diff iteration order: at each level the
    /// members first (sorted), then the members below each child (sorted).
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        let mut prefix = Vec::new();
        self.collect_paths(&mut prefix, &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        for (pe, node) in &self.children {
            if node.member {
                let mut p = prefix.clone();
                p.push(pe.clone());
                out.push(p);
            }
        }
        for (pe, node) in &self.children {
            prefix.push(pe.clone());
            node.set.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// Number of member paths.
    pub fn len(&self) -> usize {
        self.children
            .values()
            .map(|n| usize::from(n.member) + n.set.len())
            .sum()
    }

    /// Member paths rendered as in conflict messages (`.spec.replicas`).
    pub fn path_strings(&self) -> Vec<String> {
        self.paths().iter().map(|p| path_to_string(p)).collect()
    }

    /// Encodes the set in the FieldsV1 form, e.g.
    /// `{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{".":{},"f:replicas":{}}}`.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.encode())
    }

    fn encode(&self) -> Map<String, Value> {
        let mut map = Map::new();
        for (pe, node) in &self.children {
            let mut inner = node.set.encode();
            if node.member && !inner.is_empty() {
                inner.insert(".".to_string(), Value::Object(Map::new()));
            }
            map.insert(pe.to_fields_key(), Value::Object(inner));
        }
        map
    }

    /// Decodes a FieldsV1 value. `null` decodes to the empty set.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, FieldsV1Error> {
        if value.is_null() {
            return Ok(FieldSet::new());
        }
        let mut prefix = Vec::new();
        FieldSet::decode(value, &mut prefix)
    }

    fn decode(value: &Value, prefix: &mut Path) -> Result<FieldSet, FieldsV1Error> {
        if prefix.len() > MAX_DECODE_DEPTH {
            return Err(FieldsV1Error::TooDeep);
        }
        let Value::Object(map) = value else {
            return Err(FieldsV1Error::NotAnObject {
                path: path_to_string(prefix),
            });
        };
        let mut out = FieldSet::new();
        for (key, child) in map {
            if key == "." {
                continue;
            }
            let pe = PathElement::from_fields_key(key).ok_or_else(|| FieldsV1Error::BadKey {
                key: key.clone(),
                path: path_to_string(prefix),
            })?;
            let member = match child {
                Value::Object(inner) => inner.is_empty() || inner.contains_key("."),
                _ => false,
            };
            prefix.push(pe.clone());
            let set = FieldSet::decode(child, prefix);
            prefix.pop();
            let node = Node { member, set: set? };
            if !node.is_empty() {
                let entry = out.children.entry(pe).or_default();
                entry.member |= node.member;
                entry.set.union_in_place(&node.set);
            }
        }
        Ok(out)
    }
}
