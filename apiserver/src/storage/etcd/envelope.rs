//! How objects carry their own `resourceVersion` when the commit revision is only known after
//! the write: etcd assigns the revision, so the stored bytes cannot contain it. Instead the
//! encoder runs twice before the write, at two sentinel revisions whose decimal texts have the
//! same length but differ in every digit; the bytes that differ are exactly where the revision
//! goes. The store keeps the first output and those offsets, and splices the real revision into
//! a copy on every read.
//!
//! Stored layout: `MAGIC`, a little-endian `u16` count, that many little-endian `u32` offsets
//! (ascending, each the start of one revision text in the body), then the body. Values without
//! the magic (written by someone else) are read back unchanged.

use bytes::Bytes;

use crate::storage::{Encoder, Revision, StorageError};

const MAGIC: &[u8; 4] = b"\xffpm1";
/// The two sentinels: 19 digits each, every digit different.
const FIRST: Revision = 1_111_111_111_111_111_111;
const SECOND: Revision = 2_222_222_222_222_222_222;
const WIDTH: usize = 19;

/// An encoded object waiting for its revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// The bytes stored in etcd (header and body).
    stored: Bytes,
    /// Where the body starts in `stored`.
    body_at: usize,
    /// Offsets of the revision texts in the body.
    offsets: Vec<usize>,
}

impl Envelope {
    /// Runs the encoder at both sentinels and records where the revision goes.
    pub(crate) fn encode(encode: &mut Encoder) -> Result<Self, StorageError> {
        let first = encode(FIRST);
        let second = encode(SECOND);
        let broken = |why: &str| StorageError::Backend(format!("cannot store object: {why}"));
        if first.len() != second.len() {
            return Err(broken("its encoding depends on more than its revision"));
        }
        let mut offsets = Vec::new();
        let mut i = 0;
        while i < first.len() {
            if first[i] == second[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < first.len() && first[i] != second[i] {
                i += 1;
            }
            let run = &first[start..i];
            if !run.len().is_multiple_of(WIDTH) || run.iter().any(|b| *b != b'1') {
                return Err(broken("its encoding depends on more than its revision"));
            }
            offsets.extend((start..i).step_by(WIDTH));
        }
        if offsets.len() > usize::from(u16::MAX) || first.len() > u32::MAX as usize {
            return Err(broken("it is too large"));
        }
        let header = MAGIC.len() + 2 + 4 * offsets.len();
        let mut stored = Vec::with_capacity(header + first.len());
        stored.extend_from_slice(MAGIC);
        stored.extend_from_slice(&(offsets.len() as u16).to_le_bytes());
        for at in &offsets {
            stored.extend_from_slice(&(*at as u32).to_le_bytes());
        }
        stored.extend_from_slice(&first);
        Ok(Envelope {
            stored: stored.into(),
            body_at: header,
            offsets,
        })
    }

    /// Parses stored bytes. Bytes that are not an envelope are a body without revision texts.
    #[cfg(test)]
    fn parse(stored: Bytes) -> Self {
        let (body_at, offsets) = layout(&stored);
        Envelope {
            stored,
            body_at,
            offsets,
        }
    }

    /// The bytes to store.
    pub(crate) fn stored(&self) -> &Bytes {
        &self.stored
    }

    /// The object as the encoder would have produced it at `revision`.
    pub(crate) fn at(&self, revision: Revision) -> Bytes {
        if self.offsets.is_empty() {
            return self.stored.slice(self.body_at..);
        }
        splice(&self.stored[self.body_at..], &self.offsets, revision).into()
    }
}

/// Where the body of stored bytes starts and where its revision texts are; `(0, [])` for bytes
/// that are not an envelope (or a truncated or inconsistent one).
fn layout(stored: &[u8]) -> (usize, Vec<usize>) {
    let plain = (0, Vec::new());
    if !stored.starts_with(MAGIC) || stored.len() < MAGIC.len() + 2 {
        return plain;
    }
    let count = u16::from_le_bytes([stored[4], stored[5]]) as usize;
    let body_at = MAGIC.len() + 2 + 4 * count;
    if stored.len() < body_at {
        return plain;
    }
    let body_len = stored.len() - body_at;
    let mut offsets: Vec<usize> = Vec::with_capacity(count);
    for i in 0..count {
        let at = 6 + 4 * i;
        let off = u32::from_le_bytes([stored[at], stored[at + 1], stored[at + 2], stored[at + 3]])
            as usize;
        let previous_end = offsets.last().map_or(0, |p: &usize| *p + WIDTH);
        if off < previous_end || off + WIDTH > body_len {
            return plain;
        }
        offsets.push(off);
    }
    (body_at, offsets)
}

/// `body` with the revision text at each offset replaced by `revision`.
fn splice(body: &[u8], offsets: &[usize], revision: Revision) -> Vec<u8> {
    let text = revision.to_string();
    let mut out = Vec::with_capacity(body.len() + offsets.len() * text.len());
    let mut from = 0;
    for at in offsets {
        out.extend_from_slice(&body[from..*at]);
        out.extend_from_slice(text.as_bytes());
        from = at + WIDTH;
    }
    out.extend_from_slice(&body[from..]);
    out
}

/// Restores an object read from etcd at its revision, in one copy.
pub(crate) fn restore(stored: &[u8], revision: Revision) -> Bytes {
    let (body_at, offsets) = layout(stored);
    let body = &stored[body_at..];
    if offsets.is_empty() {
        return Bytes::copy_from_slice(body);
    }
    splice(body, &offsets, revision).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_encoder(name: &str) -> Encoder {
        let name = name.to_string();
        Box::new(move |rev| {
            format!(r#"{{"metadata":{{"name":"{name}","resourceVersion":"{rev}"}},"n":111}}"#)
                .into_bytes()
        })
    }

    #[test]
    fn splices_the_revision_where_the_encoder_put_it() {
        let mut enc = json_encoder("a1");
        let env = Envelope::encode(&mut enc).unwrap();
        for rev in [0, 7, 12345, u64::MAX] {
            assert_eq!(env.at(rev), enc(rev));
        }
        assert_eq!(Envelope::parse(env.stored().clone()), env);
        assert_eq!(restore(env.stored(), 42), enc(42));
    }

    #[test]
    fn several_and_adjacent_revisions() {
        let mut enc: Encoder = Box::new(|rev| format!("{rev}{rev}-{rev}").into_bytes());
        let env = Envelope::encode(&mut enc).unwrap();
        assert_eq!(env.offsets, [0, 19, 39]);
        assert_eq!(env.at(5), "55-5");
    }

    #[test]
    fn no_revision_and_foreign_values() {
        let mut enc: Encoder = Box::new(|_| b"plain".to_vec());
        let env = Envelope::encode(&mut enc).unwrap();
        assert_eq!(env.at(9), "plain");
        assert_eq!(restore(b"written by etcdctl", 3), "written by etcdctl");
        // A truncated or inconsistent header is taken as plain bytes, never a panic.
        for broken in [
            &b"\xffpm1"[..],
            b"\xffpm1\x02\x00\x01\x00\x00\x00",
            b"\xffpm1\x01\x00\xff\xff\xff\xffbody",
        ] {
            assert_eq!(restore(broken, 3), Bytes::copy_from_slice(broken));
        }
    }

    #[test]
    fn refuses_encoders_that_depend_on_more_than_the_revision() {
        let mut hex: Encoder = Box::new(|rev| format!("{rev:x}").into_bytes());
        assert!(Envelope::encode(&mut hex).is_err());
        let mut n = 0;
        let mut counting: Encoder = Box::new(move |_| {
            n += 1;
            format!("call {n}").into_bytes()
        });
        assert!(Envelope::encode(&mut counting).is_err());
    }
}
