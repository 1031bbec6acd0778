//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) into
//! JSON, for the built-in kinds typed clients send that way (`kubectl create namespace`, …).
//! Responses are always JSON, which every client accepts.

use base64::Engine;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The four magic bytes in front of every Kubernetes protobuf message.
pub const MAGIC: &[u8] = b"k8s\x00";

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    MapStr,
    MapBytes,
    /// metav1.Time (seconds), RFC 3339
    Time,
    /// metav1.MicroTime, RFC 3339 with microseconds
    MicroTime,
    /// FieldsV1: raw JSON bytes
    RawJson,
}

#[derive(Clone, Copy)]
struct Field {
    num: u64,
    name: &'static str,
    ty: Ty,
    repeated: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
    }
}

const fn r(num: u64, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: true,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "controller", Ty::Bool),
    f(7, "blockOwnerDeletion", Ty::Bool),
];

const MANAGED_FIELDS: &[Field] = &[
    f(1, "manager", Ty::Str),
    f(2, "operation", Ty::Str),
    f(3, "apiVersion", Ty::Str),
    f(4, "time", Ty::Time),
    f(6, "fieldsType", Ty::Str),
    f(7, "fieldsV1", Ty::RawJson),
    f(8, "subresource", Ty::Str),
];

const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(4, "selfLink", Ty::Str),
    f(5, "uid", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "generation", Ty::Int),
    f(8, "creationTimestamp", Ty::Time),
    f(9, "deletionTimestamp", Ty::Time),
    f(10, "deletionGracePeriodSeconds", Ty::Int),
    f(11, "labels", Ty::MapStr),
    f(12, "annotations", Ty::MapStr),
    r(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    r(14, "finalizers", Ty::Str),
    r(17, "managedFields", Ty::Msg(MANAGED_FIELDS)),
];

/// meta/v1 DeleteOptions, which client-go sends with every delete of a kind it prefers protobuf
/// for (ConfigMaps, Secrets, Namespaces, …).
const DELETE_OPTIONS: &[Field] = &[
    f(1, "gracePeriodSeconds", Ty::Int),
    f(
        2,
        "preconditions",
        Ty::Msg(&[f(1, "uid", Ty::Str), f(2, "resourceVersion", Ty::Str)]),
    ),
    f(3, "orphanDependents", Ty::Bool),
    f(4, "propagationPolicy", Ty::Str),
    r(5, "dryRun", Ty::Str),
    f(
        6,
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        Ty::Bool,
    ),
];

const OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "namespace", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "fieldPath", Ty::Str),
];

const NAMESPACE_CONDITION: &[Field] = &[
    f(1, "type", Ty::Str),
    f(2, "status", Ty::Str),
    f(4, "lastTransitionTime", Ty::Time),
    f(5, "reason", Ty::Str),
    f(6, "message", Ty::Str),
];

const NAMESPACE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(&[r(1, "finalizers", Ty::Str)])),
    f(
        3,
        "status",
        Ty::Msg(&[
            f(1, "phase", Ty::Str),
            r(2, "conditions", Ty::Msg(NAMESPACE_CONDITION)),
        ]),
    ),
];

const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapStr),
    f(3, "binaryData", Ty::MapBytes),
    f(4, "immutable", Ty::Bool),
];

const SECRET: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "data", Ty::MapBytes),
    f(3, "type", Ty::Str),
    f(4, "stringData", Ty::MapStr),
    f(5, "immutable", Ty::Bool),
];

const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "secrets", Ty::Msg(OBJECT_REFERENCE)),
    r(3, "imagePullSecrets", Ty::Msg(&[f(1, "name", Ty::Str)])),
    f(4, "automountServiceAccountToken", Ty::Bool),
];

const LEASE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Ty::Msg(&[
            f(1, "holderIdentity", Ty::Str),
            f(2, "leaseDurationSeconds", Ty::Int),
            f(3, "acquireTime", Ty::MicroTime),
            f(4, "renewTime", Ty::MicroTime),
            f(5, "leaseTransitions", Ty::Int),
            f(6, "strategy", Ty::Str),
            f(7, "preferredHolder", Ty::Str),
        ]),
    ),
];

const EVENT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "involvedObject", Ty::Msg(OBJECT_REFERENCE)),
    f(3, "reason", Ty::Str),
    f(4, "message", Ty::Str),
    f(
        5,
        "source",
        Ty::Msg(&[f(1, "component", Ty::Str), f(2, "host", Ty::Str)]),
    ),
    f(6, "firstTimestamp", Ty::Time),
    f(7, "lastTimestamp", Ty::Time),
    f(8, "count", Ty::Int),
    f(9, "type", Ty::Str),
    f(10, "eventTime", Ty::MicroTime),
    f(
        11,
        "series",
        Ty::Msg(&[
            f(1, "count", Ty::Int),
            f(2, "lastObservedTime", Ty::MicroTime),
        ]),
    ),
    f(12, "action", Ty::Str),
    f(13, "related", Ty::Msg(OBJECT_REFERENCE)),
    f(14, "reportingComponent", Ty::Str),
    f(15, "reportingInstance", Ty::Str),
];

const RESOURCE_ATTRIBUTES: &[Field] = &[
    f(1, "namespace", Ty::Str),
    f(2, "verb", Ty::Str),
    f(3, "group", Ty::Str),
    f(4, "version", Ty::Str),
    f(5, "resource", Ty::Str),
    f(6, "subresource", Ty::Str),
    f(7, "name", Ty::Str),
];

const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Ty::Msg(&[
            f(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
            f(
                2,
                "nonResourceAttributes",
                Ty::Msg(&[f(1, "path", Ty::Str), f(2, "verb", Ty::Str)]),
            ),
        ]),
    ),
];

const SELF_SUBJECT_RULES_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(&[f(1, "namespace", Ty::Str)])),
];

const SELF_SUBJECT_REVIEW: &[Field] = &[f(1, "metadata", Ty::Msg(OBJECT_META))];

const POLICY_RULE: &[Field] = &[
    r(1, "verbs", Ty::Str),
    r(2, "apiGroups", Ty::Str),
    r(3, "resources", Ty::Str),
    r(4, "resourceNames", Ty::Str),
    r(5, "nonResourceURLs", Ty::Str),
];

const LABEL_SELECTOR: &[Field] = &[
    f(1, "matchLabels", Ty::MapStr),
    r(
        2,
        "matchExpressions",
        Ty::Msg(&[
            f(1, "key", Ty::Str),
            f(2, "operator", Ty::Str),
            r(3, "values", Ty::Str),
        ]),
    ),
];

const ROLE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "rules", Ty::Msg(POLICY_RULE)),
];

const CLUSTER_ROLE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(2, "rules", Ty::Msg(POLICY_RULE)),
    f(
        3,
        "aggregationRule",
        Ty::Msg(&[r(1, "clusterRoleSelectors", Ty::Msg(LABEL_SELECTOR))]),
    ),
];

const ROLE_BINDING: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    r(
        2,
        "subjects",
        Ty::Msg(&[
            f(1, "kind", Ty::Str),
            f(2, "apiGroup", Ty::Str),
            f(3, "name", Ty::Str),
            f(4, "namespace", Ty::Str),
        ]),
    ),
    f(
        3,
        "roleRef",
        Ty::Msg(&[
            f(1, "apiGroup", Ty::Str),
            f(2, "kind", Ty::Str),
            f(3, "name", Ty::Str),
        ]),
    ),
];

const TOKEN_REQUEST: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Ty::Msg(&[
            r(1, "audiences", Ty::Str),
            f(
                3,
                "boundObjectRef",
                Ty::Msg(&[
                    f(1, "kind", Ty::Str),
                    f(2, "apiVersion", Ty::Str),
                    f(3, "name", Ty::Str),
                    f(4, "uid", Ty::Str),
                ]),
            ),
            f(4, "expirationSeconds", Ty::Int),
        ]),
    ),
];

const TOKEN_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Ty::Msg(&[f(1, "token", Ty::Str), r(2, "audiences", Ty::Str)]),
    ),
];

const SUBJECT_ACCESS_REVIEW: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Ty::Msg(&[
            f(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
            f(
                2,
                "nonResourceAttributes",
                Ty::Msg(&[f(1, "path", Ty::Str), f(2, "verb", Ty::Str)]),
            ),
            f(3, "user", Ty::Str),
            r(4, "groups", Ty::Str),
            f(6, "uid", Ty::Str),
        ]),
    ),
];

fn message_for(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    Some(match (api_version, kind) {
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        (
            "authentication.k8s.io/v1"
            | "authentication.k8s.io/v1beta1"
            | "authentication.k8s.io/v1alpha1",
            "SelfSubjectReview",
        ) => SELF_SUBJECT_REVIEW,
        ("authentication.k8s.io/v1", "TokenRequest") => TOKEN_REQUEST,
        ("authentication.k8s.io/v1", "TokenReview") => TOKEN_REVIEW,
        ("authorization.k8s.io/v1", "SubjectAccessReview") => SUBJECT_ACCESS_REVIEW,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Event") => EVENT,
        ("coordination.k8s.io/v1", "Lease") => LEASE,
        // Options kinds are registered in every group-version.
        (_, "DeleteOptions") => DELETE_OPTIONS,
        _ => return None,
    })
}

/// A JSON object from a request body that is JSON or, as typed clients (kubectl's among them)
/// send built-in kinds, Kubernetes protobuf; `None` if it is neither.
pub fn decode_json_or_protobuf(body: &[u8]) -> Option<serde_json::Value> {
    let decoded = if body.starts_with(MAGIC) {
        decode_object(body).ok()
    } else {
        serde_json::from_slice::<Value>(body).ok()
    };
    decoded.filter(Value::is_object)
}

/// A protobuf body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ProtobufError(String);

fn err(m: impl Into<String>) -> ProtobufError {
    ProtobufError(m.into())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| err("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err("varint too long"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtobufError> {
        let len = usize::try_from(self.varint()?).map_err(|_| err("length too large"))?;
        if len > self.buf.len() {
            return Err(err("truncated length-delimited field"));
        }
        let (b, rest) = self.buf.split_at(len);
        self.buf = rest;
        Ok(b)
    }

    fn skip(&mut self, wire: u64) -> Result<(), ProtobufError> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.advance(8),
            2 => self.bytes().map(|_| ()),
            5 => self.advance(4),
            w => Err(err(format!("unsupported wire type {w}"))),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), ProtobufError> {
        if n > self.buf.len() {
            return Err(err("truncated fixed field"));
        }
        self.buf = &self.buf[n..];
        Ok(())
    }
}

/// One field as read: number, wire type, bytes (length-delimited) and varint value.
type RawField = (u64, u64, Vec<u8>, u64);

/// Reads the fields of one message (varint and length-delimited; others are skipped).
fn fields(buf: &[u8]) -> Result<Vec<RawField>, ProtobufError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while !r.buf.is_empty() {
        let tag = r.varint()?;
        let (num, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => {
                let v = r.varint()?;
                out.push((num, wire, Vec::new(), v));
            }
            2 => {
                let b = r.bytes()?;
                out.push((num, wire, b.to_vec(), 0));
            }
            other => r.skip(other)?,
        }
    }
    Ok(out)
}

fn utf8(b: &[u8]) -> Result<String, ProtobufError> {
    String::from_utf8(b.to_vec()).map_err(|_| err("string field is not UTF-8"))
}

fn time_value(b: &[u8], micro: bool) -> Result<Value, ProtobufError> {
    let mut secs: i64 = 0;
    let mut nanos: i64 = 0;
    for (num, wire, _, v) in fields(b)? {
        match (num, wire) {
            (1, 0) => secs = v as i64,
            (2, 0) => nanos = v as i64,
            _ => {}
        }
    }
    let t = OffsetDateTime::from_unix_timestamp(secs).map_err(|_| err("timestamp out of range"))?;
    let t = if micro {
        t.replace_microsecond(((nanos / 1000).clamp(0, 999_999)) as u32)
            .map_err(|_| err("bad microseconds"))?
    } else {
        t
    };
    let s = t
        .format(&Rfc3339)
        .map_err(|_| err("cannot format timestamp"))?;
    Ok(if micro && !s.contains('.') {
        json!(s.replace('Z', ".000000Z"))
    } else {
        json!(s)
    })
}

fn map_entry(b: &[u8], bytes_values: bool) -> Result<(String, Value), ProtobufError> {
    let mut key = String::new();
    let mut value = Value::String(String::new());
    for (num, _, data, _) in fields(b)? {
        match num {
            1 => key = utf8(&data)?,
            2 => {
                value = if bytes_values {
                    json!(base64::engine::general_purpose::STANDARD.encode(&data))
                } else {
                    json!(utf8(&data)?)
                }
            }
            _ => {}
        }
    }
    Ok((key, value))
}

fn decode_message(buf: &[u8], desc: &[Field]) -> Result<Value, ProtobufError> {
    let mut out = Map::new();
    for (num, wire, data, v) in fields(buf)? {
        let Some(field) = desc.iter().find(|f| f.num == num) else {
            continue;
        };
        let value = match (field.ty, wire) {
            (Ty::Str, 2) => json!(utf8(&data)?),
            (Ty::Int, 0) => json!(v as i64),
            (Ty::Bool, 0) => json!(v != 0),
            (Ty::Msg(d), 2) => decode_message(&data, d)?,
            (Ty::Time, 2) => time_value(&data, false)?,
            (Ty::MicroTime, 2) => time_value(&data, true)?,
            (Ty::RawJson, 2) => {
                let raw = fields(&data)?
                    .into_iter()
                    .find(|(n, ..)| *n == 1)
                    .map(|(_, _, d, _)| d)
                    .unwrap_or_default();
                serde_json::from_slice(&raw).map_err(|_| err("fieldsV1 is not JSON"))?
            }
            (Ty::MapStr | Ty::MapBytes, 2) => {
                let (k, val) = map_entry(&data, matches!(field.ty, Ty::MapBytes))?;
                let entry = out.entry(field.name).or_insert_with(|| json!({}));
                if let Some(m) = entry.as_object_mut() {
                    m.insert(k, val);
                }
                continue;
            }
            _ => {
                return Err(err(format!(
                    "field {} has an unexpected wire type {wire}",
                    field.name
                )))
            }
        };
        if field.repeated {
            let entry = out.entry(field.name).or_insert_with(|| json!([]));
            if let Some(a) = entry.as_array_mut() {
                a.push(value);
            }
        } else {
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf-encoded object of a built-in kind into its JSON form.
pub fn decode_object(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| err("the body does not start with the Kubernetes protobuf prefix"))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw = Vec::new();
    for (num, _, data, _) in fields(rest)? {
        match num {
            1 => {
                for (n, _, d, _) in fields(&data)? {
                    match n {
                        1 => api_version = utf8(&d)?,
                        2 => kind = utf8(&d)?,
                        _ => {}
                    }
                }
            }
            2 => raw = data,
            _ => {}
        }
    }
    let desc = message_for(&api_version, &kind).ok_or_else(|| {
        err(format!(
            "protobuf is not supported for {kind} in {api_version:?}; send JSON"
        ))
    })?;
    let mut obj = decode_message(&raw, desc)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, num: u64, data: &[u8]) {
        varint(out, num << 3 | 2);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        field(&mut tm, 1, api_version.as_bytes());
        field(&mut tm, 2, kind.as_bytes());
        let mut unknown = Vec::new();
        field(&mut unknown, 1, &tm);
        field(&mut unknown, 2, raw);
        let mut out = MAGIC.to_vec();
        out.extend(unknown);
        out
    }

    #[test]
    fn decodes_a_namespace_as_kubectl_sends_it() {
        let mut meta = Vec::new();
        field(&mut meta, 1, b"team-a");
        let mut label = Vec::new();
        field(&mut label, 1, b"env");
        field(&mut label, 2, b"dev");
        field(&mut meta, 11, &label);
        let mut ns = Vec::new();
        field(&mut ns, 1, &meta);
        field(&mut ns, 2, &[]);
        field(&mut ns, 3, &[]);
        let v = decode_object(&envelope("v1", "Namespace", &ns)).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"env": "dev"}}, "spec": {}, "status": {}})
        );
    }

    #[test]
    fn decodes_secret_bytes_as_base64() {
        let mut meta = Vec::new();
        field(&mut meta, 1, b"s");
        let mut entry = Vec::new();
        field(&mut entry, 1, b"k");
        field(&mut entry, 2, b"\x00\xff");
        let mut secret = Vec::new();
        field(&mut secret, 1, &meta);
        field(&mut secret, 2, &entry);
        field(&mut secret, 3, b"Opaque");
        let v = decode_object(&envelope("v1", "Secret", &secret)).expect("decode");
        assert_eq!(v["data"]["k"], "AP8=");
        assert_eq!(v["type"], "Opaque");
    }

    #[test]
    fn refuses_garbage_without_panicking() {
        assert!(decode_object(b"k8s").is_err());
        assert!(decode_object(b"k8s\x00\x0a\xff\xff\xff").is_err());
        assert!(decode_object(&envelope("v1", "Pod", &[])).is_err());
        for n in 0..64u8 {
            let mut b = MAGIC.to_vec();
            b.extend((0..n).map(|i| i.wrapping_mul(37)));
            let _ = decode_object(&b);
        }
    }
}
