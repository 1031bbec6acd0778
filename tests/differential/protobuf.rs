//! The body of a corpus step with `protobuf: true`: the step's JSON object written as client-go
//! writes a built-in kind in `application/vnd.kubernetes.protobuf` (the magic `k8s\0`, then a
//! runtime.Unknown holding the type and the message).
//!
//! It writes the message the way Go's generated marshallers do, which is what the server has to
//! read back: a field Go holds by value (`string`, `int64`, `bool`, a struct, a `metav1.Time`) is
//! always on the wire, zero or not; a pointer (`*bool`, `*int64`, `*AggregationRule`) only when
//! set; lists and maps element by element. It knows the kinds the corpus sends, written here
//! independently of the server's decoder, and refuses a field it does not know so that no part
//! of a step is silently left out.

use base64::Engine;
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// What a field holds.
#[derive(Clone, Copy)]
enum T {
    Str,
    Int,
    Bool,
    /// metav1.Time and MicroTime: a Timestamp message (seconds, nanos); empty when zero.
    Time,
    /// map<string, string>
    MapStr,
    /// map<string, bytes>, base64 in JSON
    MapBytes,
    Msg(&'static [F]),
}

/// How Go holds it.
#[derive(Clone, Copy)]
enum H {
    /// By value: always on the wire.
    Val,
    /// A pointer: on the wire when set.
    Ptr,
    /// A slice: one field per element.
    Rep,
}

#[derive(Clone, Copy)]
struct F(u64, &'static str, T, H);

const OWNER_REFERENCE: &[F] = &[
    F(1, "kind", T::Str, H::Val),
    F(3, "name", T::Str, H::Val),
    F(4, "uid", T::Str, H::Val),
    F(5, "apiVersion", T::Str, H::Val),
    F(6, "controller", T::Bool, H::Ptr),
    F(7, "blockOwnerDeletion", T::Bool, H::Ptr),
];

const OBJECT_META: &[F] = &[
    F(1, "name", T::Str, H::Val),
    F(2, "generateName", T::Str, H::Val),
    F(3, "namespace", T::Str, H::Val),
    F(4, "selfLink", T::Str, H::Val),
    F(5, "uid", T::Str, H::Val),
    F(6, "resourceVersion", T::Str, H::Val),
    F(7, "generation", T::Int, H::Val),
    F(8, "creationTimestamp", T::Time, H::Val),
    F(9, "deletionTimestamp", T::Time, H::Ptr),
    F(10, "deletionGracePeriodSeconds", T::Int, H::Ptr),
    F(11, "labels", T::MapStr, H::Val),
    F(12, "annotations", T::MapStr, H::Val),
    F(13, "ownerReferences", T::Msg(OWNER_REFERENCE), H::Rep),
    F(14, "finalizers", T::Str, H::Rep),
];

const CONFIG_MAP: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "data", T::MapStr, H::Val),
    F(3, "binaryData", T::MapBytes, H::Val),
    F(4, "immutable", T::Bool, H::Ptr),
];

const SECRET: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "data", T::MapBytes, H::Val),
    F(3, "type", T::Str, H::Val),
    F(4, "stringData", T::MapStr, H::Val),
    F(5, "immutable", T::Bool, H::Ptr),
];

const NAMESPACE: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(
        2,
        "spec",
        T::Msg(&[F(1, "finalizers", T::Str, H::Rep)]),
        H::Val,
    ),
    F(
        3,
        "status",
        T::Msg(&[F(1, "phase", T::Str, H::Val)]),
        H::Val,
    ),
];

const OBJECT_REFERENCE: &[F] = &[
    F(1, "kind", T::Str, H::Val),
    F(2, "namespace", T::Str, H::Val),
    F(3, "name", T::Str, H::Val),
    F(4, "uid", T::Str, H::Val),
    F(5, "apiVersion", T::Str, H::Val),
    F(6, "resourceVersion", T::Str, H::Val),
    F(7, "fieldPath", T::Str, H::Val),
];

const SERVICE_ACCOUNT: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "secrets", T::Msg(OBJECT_REFERENCE), H::Rep),
    F(
        3,
        "imagePullSecrets",
        T::Msg(&[F(1, "name", T::Str, H::Val)]),
        H::Rep,
    ),
    F(4, "automountServiceAccountToken", T::Bool, H::Ptr),
];

const POLICY_RULE: &[F] = &[
    F(1, "verbs", T::Str, H::Rep),
    F(2, "apiGroups", T::Str, H::Rep),
    F(3, "resources", T::Str, H::Rep),
    F(4, "resourceNames", T::Str, H::Rep),
    F(5, "nonResourceURLs", T::Str, H::Rep),
];

const LABEL_SELECTOR: &[F] = &[
    F(1, "matchLabels", T::MapStr, H::Val),
    F(
        2,
        "matchExpressions",
        T::Msg(&[
            F(1, "key", T::Str, H::Val),
            F(2, "operator", T::Str, H::Val),
            F(3, "values", T::Str, H::Rep),
        ]),
        H::Rep,
    ),
];

const ROLE: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "rules", T::Msg(POLICY_RULE), H::Rep),
];

const CLUSTER_ROLE: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "rules", T::Msg(POLICY_RULE), H::Rep),
    F(
        3,
        "aggregationRule",
        T::Msg(&[F(1, "clusterRoleSelectors", T::Msg(LABEL_SELECTOR), H::Rep)]),
        H::Ptr,
    ),
];

const ROLE_BINDING: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(
        2,
        "subjects",
        T::Msg(&[
            F(1, "kind", T::Str, H::Val),
            F(2, "apiGroup", T::Str, H::Val),
            F(3, "name", T::Str, H::Val),
            F(4, "namespace", T::Str, H::Val),
        ]),
        H::Rep,
    ),
    F(
        3,
        "roleRef",
        T::Msg(&[
            F(1, "apiGroup", T::Str, H::Val),
            F(2, "kind", T::Str, H::Val),
            F(3, "name", T::Str, H::Val),
        ]),
        H::Val,
    ),
];

const EVENT_SOURCE: &[F] = &[
    F(1, "component", T::Str, H::Val),
    F(2, "host", T::Str, H::Val),
];

const EVENT: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(2, "involvedObject", T::Msg(OBJECT_REFERENCE), H::Val),
    F(3, "reason", T::Str, H::Val),
    F(4, "message", T::Str, H::Val),
    F(5, "source", T::Msg(EVENT_SOURCE), H::Val),
    F(6, "firstTimestamp", T::Time, H::Val),
    F(7, "lastTimestamp", T::Time, H::Val),
    F(8, "count", T::Int, H::Val),
    F(9, "type", T::Str, H::Val),
    F(10, "eventTime", T::Time, H::Val),
    F(
        11,
        "series",
        T::Msg(&[
            F(1, "count", T::Int, H::Val),
            F(2, "lastObservedTime", T::Time, H::Val),
        ]),
        H::Ptr,
    ),
    F(12, "action", T::Str, H::Val),
    F(13, "related", T::Msg(OBJECT_REFERENCE), H::Ptr),
    F(14, "reportingComponent", T::Str, H::Val),
    F(15, "reportingInstance", T::Str, H::Val),
];

const LEASE: &[F] = &[
    F(1, "metadata", T::Msg(OBJECT_META), H::Val),
    F(
        2,
        "spec",
        T::Msg(&[
            F(1, "holderIdentity", T::Str, H::Ptr),
            F(2, "leaseDurationSeconds", T::Int, H::Ptr),
            F(3, "acquireTime", T::Time, H::Ptr),
            F(4, "renewTime", T::Time, H::Ptr),
            F(5, "leaseTransitions", T::Int, H::Ptr),
            F(6, "strategy", T::Str, H::Ptr),
            F(7, "preferredHolder", T::Str, H::Ptr),
        ]),
        H::Val,
    ),
];

fn message_of(api_version: &str, kind: &str) -> &'static [F] {
    match (api_version, kind) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Event") => EVENT,
        ("coordination.k8s.io/v1", "Lease") => LEASE,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        _ => panic!("the test's protobuf encoder does not know {kind} in {api_version}"),
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, num: u64, wire: u64) {
    varint(out, num << 3 | wire);
}

fn bytes_field(out: &mut Vec<u8>, num: u64, data: &[u8]) {
    tag(out, num, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn map_entries(out: &mut Vec<u8>, num: u64, v: &Value, bytes_values: bool, at: &str) {
    let Some(map) = v.as_object() else {
        assert!(v.is_null(), "{at}: a map, got {v}");
        return;
    };
    // Go writes map entries in key order (serde_json's map is ordered by key too).
    for (k, val) in map {
        let val = val.as_str().unwrap_or_else(|| panic!("{at}/{k}: a string"));
        let val = if bytes_values {
            base64::engine::general_purpose::STANDARD
                .decode(val)
                .unwrap_or_else(|e| panic!("{at}/{k}: base64: {e}"))
        } else {
            val.as_bytes().to_vec()
        };
        let mut entry = Vec::new();
        bytes_field(&mut entry, 1, k.as_bytes());
        bytes_field(&mut entry, 2, &val);
        bytes_field(out, num, &entry);
    }
}

/// Writes one value of type `t` as field `num`.
fn scalar(out: &mut Vec<u8>, num: u64, t: T, v: &Value, at: &str) {
    match t {
        T::Str => bytes_field(out, num, v.as_str().unwrap_or("").as_bytes()),
        T::Int => {
            tag(out, num, 0);
            varint(out, v.as_i64().unwrap_or(0) as u64);
        }
        T::Bool => {
            tag(out, num, 0);
            varint(out, u64::from(v.as_bool().unwrap_or(false)));
        }
        T::Time => {
            let mut ts = Vec::new();
            if let Some(s) = v.as_str() {
                let t = OffsetDateTime::parse(s, &Rfc3339)
                    .unwrap_or_else(|e| panic!("{at}: a time: {e}"));
                tag(&mut ts, 1, 0);
                varint(&mut ts, t.unix_timestamp() as u64);
                if t.nanosecond() != 0 {
                    tag(&mut ts, 2, 0);
                    varint(&mut ts, u64::from(t.nanosecond()));
                }
            }
            bytes_field(out, num, &ts);
        }
        T::Msg(fields) => {
            let empty = Map::new();
            let obj = v.as_object().unwrap_or(&empty);
            bytes_field(out, num, &message(obj, fields, at));
        }
        T::MapStr | T::MapBytes => map_entries(out, num, v, matches!(t, T::MapBytes), at),
    }
}

fn message(obj: &Map<String, Value>, fields: &[F], at: &str) -> Vec<u8> {
    for k in obj.keys() {
        assert!(
            fields.iter().any(|f| f.1 == k),
            "{at}/{k}: the test's protobuf encoder does not know this field"
        );
    }
    let mut out = Vec::new();
    let mut sorted: Vec<&F> = fields.iter().collect();
    sorted.sort_by_key(|f| f.0);
    for &F(num, name, t, how) in sorted {
        let v = obj.get(name).unwrap_or(&Value::Null);
        let at = format!("{at}/{name}");
        match how {
            H::Val => scalar(&mut out, num, t, v, &at),
            H::Ptr if v.is_null() => {}
            H::Ptr => scalar(&mut out, num, t, v, &at),
            H::Rep => {
                for (i, item) in v.as_array().into_iter().flatten().enumerate() {
                    scalar(&mut out, num, t, item, &format!("{at}/{i}"));
                }
            }
        }
    }
    out
}

/// The protobuf body client-go would send for `obj` (which names its apiVersion and kind).
pub fn encode(obj: &Value) -> Vec<u8> {
    let api_version = obj["apiVersion"]
        .as_str()
        .expect("a protobuf step names its apiVersion");
    let kind = obj["kind"]
        .as_str()
        .expect("a protobuf step names its kind");
    let mut rest = obj.as_object().cloned().unwrap_or_default();
    rest.remove("apiVersion");
    rest.remove("kind");
    let raw = message(&rest, message_of(api_version, kind), "");
    let mut type_meta = Vec::new();
    bytes_field(&mut type_meta, 1, api_version.as_bytes());
    bytes_field(&mut type_meta, 2, kind.as_bytes());
    let mut unknown = Vec::new();
    bytes_field(&mut unknown, 1, &type_meta);
    bytes_field(&mut unknown, 2, &raw);
    // contentEncoding and contentType: plain strings, so on the wire though empty.
    bytes_field(&mut unknown, 3, b"");
    bytes_field(&mut unknown, 4, b"");
    let mut out = b"k8s\x00".to_vec();
    out.extend(unknown);
    out
}
