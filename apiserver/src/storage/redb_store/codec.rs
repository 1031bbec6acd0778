//! The on-disk layout of the redb backend: table definitions and the byte encodings of their
//! values. Every decoder validates its input and reports corrupt data as `StorageError::Backend`.
//!
//! Tables:
//! - `current`: key -> `create_rev u64 BE | mod_rev u64 BE | value`, the latest state.
//! - `history`: (key, rev) -> `tag u8 | create_rev u64 BE | value`, every retained version that
//!   is no longer live (a write moves the version it replaces here, so a live object is stored
//!   once); a deletion is stored with tag [`TAG_DELETED`] and the delete's final bytes.
//! - `log`: rev -> `event type u8 | key`, one entry per committed revision, for watch replay.
//! - `meta`: name -> u64: [`META_REVISION`], [`META_COMPACTED`], [`META_FORMAT`].

use redb::TableDefinition;

use crate::storage::{EventType, Result, Revision, StorageError};

pub(super) const CURRENT: TableDefinition<&str, &[u8]> = TableDefinition::new("current");
pub(super) const HISTORY: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("history");
pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The latest committed revision.
pub(super) const META_REVISION: &str = "revision";
/// The compacted revision.
pub(super) const META_COMPACTED: &str = "compacted";
/// The layout version of the file.
pub(super) const META_FORMAT: &str = "format";
/// The layout this code writes and reads.
pub(super) const FORMAT_VERSION: u64 = 1;

/// A history entry holding a live value.
pub(super) const TAG_VALUE: u8 = 0;
/// A history entry recording a deletion.
pub(super) const TAG_DELETED: u8 = 1;

/// Maps any backend error to `StorageError::Backend`.
pub(super) fn backend(err: impl std::fmt::Display) -> StorageError {
    StorageError::Backend(err.to_string())
}

fn corrupt(what: &str) -> StorageError {
    StorageError::Backend(format!("corrupt {what} entry"))
}

fn read_u64(raw: &[u8], at: usize, what: &str) -> Result<u64> {
    raw.get(at..at + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt(what))
}

/// Encodes a `current` value.
pub(super) fn encode_current(create: Revision, modified: Revision, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create.to_be_bytes());
    out.extend_from_slice(&modified.to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes a `current` value into (create revision, mod revision, value).
pub(super) fn decode_current(raw: &[u8]) -> Result<(Revision, Revision, &[u8])> {
    let create = read_u64(raw, 0, "current")?;
    let modified = read_u64(raw, 8, "current")?;
    Ok((create, modified, &raw[16..]))
}

/// Encodes a `history` value.
pub(super) fn encode_history(tag: u8, create: Revision, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + value.len());
    out.push(tag);
    out.extend_from_slice(&create.to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes a `history` value into (is deletion, create revision, value).
pub(super) fn decode_history(raw: &[u8]) -> Result<(bool, Revision, &[u8])> {
    let deleted = match raw.first() {
        Some(&TAG_VALUE) => false,
        Some(&TAG_DELETED) => true,
        _ => return Err(corrupt("history")),
    };
    let create = read_u64(raw, 1, "history")?;
    Ok((deleted, create, &raw[9..]))
}

/// Encodes a `log` value.
pub(super) fn encode_log(kind: EventType, key: &str) -> Vec<u8> {
    let tag = match kind {
        EventType::Create => 0,
        EventType::Update => 1,
        EventType::Delete => 2,
    };
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(tag);
    out.extend_from_slice(key.as_bytes());
    out
}

/// Decodes a `log` value into (event type, key).
pub(super) fn decode_log(raw: &[u8]) -> Result<(EventType, &str)> {
    let kind = match raw.first() {
        Some(0) => EventType::Create,
        Some(1) => EventType::Update,
        Some(2) => EventType::Delete,
        _ => return Err(corrupt("log")),
    };
    let key = std::str::from_utf8(&raw[1..]).map_err(|_| corrupt("log"))?;
    Ok((kind, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_corruption() {
        let raw = encode_current(3, 7, b"abc");
        assert_eq!(decode_current(&raw).ok(), Some((3, 7, &b"abc"[..])));
        assert!(decode_current(&raw[..10]).is_err());

        let raw = encode_history(TAG_DELETED, 5, b"x");
        assert_eq!(decode_history(&raw).ok(), Some((true, 5, &b"x"[..])));
        assert!(decode_history(&[9, 0, 0]).is_err());
        assert!(decode_history(&[]).is_err());

        let raw = encode_log(EventType::Update, "/a/b");
        assert_eq!(decode_log(&raw).ok(), Some((EventType::Update, "/a/b")));
        assert!(decode_log(&[2, 0xff]).is_err());
        assert!(decode_log(&[]).is_err());
    }
}
