//! The requests and answers of the calls, as Rust types.
//!
//! Answers deserialize straight from the gateway's JSON (see `wire` for its encodings);
//! requests turn into it through `to_json`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::wire::{b64, de_bytes, de_int, int};

/// The response header every call returns. `revision` is the store's revision when the call
/// was answered; a leader key's `create_revision` is the usual term.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Header {
    #[serde(deserialize_with = "de_int")]
    pub cluster_id: u64,
    /// The member that answered.
    #[serde(deserialize_with = "de_int")]
    pub member_id: u64,
    #[serde(deserialize_with = "de_int")]
    pub revision: i64,
    #[serde(deserialize_with = "de_int")]
    pub raft_term: u64,
}

/// A lease's ID (etcd's int64; 0 means "no lease").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LeaseId, D::Error> {
        de_int(d).map(LeaseId)
    }
}

/// A key and its value with their revisions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct KeyValue {
    #[serde(deserialize_with = "de_bytes")]
    pub key: Vec<u8>,
    #[serde(deserialize_with = "de_bytes")]
    pub value: Vec<u8>,
    /// The revision that created the key (since its last deletion).
    #[serde(deserialize_with = "de_int")]
    pub create_revision: i64,
    /// The revision of its last change.
    #[serde(deserialize_with = "de_int")]
    pub mod_revision: i64,
    /// Changes since creation, 1 for a new key; 0 for a deleted one (in a DELETE event).
    #[serde(deserialize_with = "de_int")]
    pub version: i64,
    /// The lease it is attached to (0: none).
    pub lease: LeaseId,
}

/// One key, or the keys in `[key, range_end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub key: Vec<u8>,
    /// Empty for one key.
    pub range_end: Vec<u8>,
}

impl KeyRange {
    /// Exactly `key`.
    pub fn key(key: impl Into<Vec<u8>>) -> KeyRange {
        KeyRange {
            key: key.into(),
            range_end: Vec::new(),
        }
    }

    /// Every key that starts with `prefix` (an empty prefix is every key).
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> KeyRange {
        let key = prefix.into();
        // etcd's rule (clientv3's GetPrefixRangeEnd): the end is the prefix with its last
        // byte below 0xff incremented and what follows dropped; "\0" means "to the end".
        let mut range_end = key.clone();
        while let Some(last) = range_end.pop() {
            if last < 0xff {
                range_end.push(last + 1);
                break;
            }
        }
        if range_end.is_empty() {
            range_end.push(0);
        }
        KeyRange { key, range_end }
    }

    fn fields(&self, map: &mut serde_json::Map<String, Value>) {
        map.insert("key".into(), b64(&self.key).into());
        if !self.range_end.is_empty() {
            map.insert("range_end".into(), b64(&self.range_end).into());
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut map = serde_json::Map::new();
        self.fields(&mut map);
        Value::Object(map)
    }
}

/// The answer to a range (or a txn's range).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RangeResponse {
    pub header: Header,
    pub kvs: Vec<KeyValue>,
    /// How many keys the range holds (more than `kvs` with a limit).
    #[serde(deserialize_with = "de_int")]
    pub count: i64,
    pub more: bool,
}

/// The answer to a put.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PutResponse {
    pub header: Header,
}

/// The answer to a delete.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DeleteResponse {
    pub header: Header,
    #[serde(deserialize_with = "de_int")]
    pub deleted: i64,
}

/// A comparison's relation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

/// What a comparison looks at, with the operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    Value(Vec<u8>),
    Version(i64),
    /// 0 for a key that does not exist: `CreateRevision(0)` with `Equal` is "absent".
    CreateRevision(i64),
    ModRevision(i64),
    Lease(LeaseId),
}

/// One comparison of a transaction, on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub op: CompareOp,
    pub target: CompareTarget,
}

impl Compare {
    pub fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: CompareTarget) -> Compare {
        Compare {
            key: key.into(),
            op,
            target,
        }
    }

    /// The key does not exist.
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::CreateRevision(0))
    }

    /// The key's value is `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Value(value.into()))
    }

    /// The key is attached to `lease`.
    pub fn lease_is(key: impl Into<Vec<u8>>, lease: LeaseId) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Lease(lease))
    }

    fn to_json(&self) -> Value {
        let result = match self.op {
            CompareOp::Equal => "EQUAL",
            CompareOp::NotEqual => "NOT_EQUAL",
            CompareOp::Greater => "GREATER",
            CompareOp::Less => "LESS",
        };
        let (target, field, operand) = match &self.target {
            CompareTarget::Value(v) => ("VALUE", "value", Value::from(b64(v))),
            CompareTarget::Version(n) => ("VERSION", "version", int(*n).into()),
            CompareTarget::CreateRevision(n) => ("CREATE", "create_revision", int(*n).into()),
            CompareTarget::ModRevision(n) => ("MOD", "mod_revision", int(*n).into()),
            CompareTarget::Lease(id) => ("LEASE", "lease", int(id.0).into()),
        };
        json!({ "result": result, "target": target, "key": b64(&self.key), field: operand })
    }
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Range(KeyRange),
    Delete(KeyRange),
}

impl Op {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: Option<LeaseId>) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    pub(crate) fn put_json(key: &[u8], value: &[u8], lease: Option<LeaseId>) -> Value {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if let Some(lease) = lease {
            body["lease"] = int(lease.0).into();
        }
        body
    }

    fn to_json(&self) -> Value {
        match self {
            Op::Put { key, value, lease } => {
                json!({ "request_put": Op::put_json(key, value, *lease) })
            }
            Op::Range(range) => json!({ "request_range": range.to_json() }),
            Op::Delete(range) => json!({ "request_delete_range": range.to_json() }),
        }
    }
}

/// A transaction: if every comparison holds, `success` runs, otherwise `failure`; atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }

    pub fn when(mut self, compare: impl IntoIterator<Item = Compare>) -> Txn {
        self.compare.extend(compare);
        self
    }

    pub fn and_then(mut self, ops: impl IntoIterator<Item = Op>) -> Txn {
        self.success.extend(ops);
        self
    }

    pub fn or_else(mut self, ops: impl IntoIterator<Item = Op>) -> Txn {
        self.failure.extend(ops);
        self
    }

    pub(crate) fn to_json(&self) -> Value {
        let list = |ops: &[Op]| Value::Array(ops.iter().map(Op::to_json).collect());
        json!({
            "compare": Value::Array(self.compare.iter().map(Compare::to_json).collect()),
            "success": list(&self.success),
            "failure": list(&self.failure),
        })
    }
}

/// The answer of one operation of the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub enum OpResponse {
    #[serde(rename = "response_put")]
    Put(PutResponse),
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_delete_range")]
    Delete(DeleteResponse),
}

/// The answer to a transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct TxnResponse {
    pub header: Header,
    /// Whether the comparisons held (and `success` ran).
    pub succeeded: bool,
    /// One per operation of the branch that ran, in order.
    pub responses: Vec<OpResponse>,
}

/// A lease and its TTL in seconds: the answer to a grant (etcd raises a TTL below its
/// minimum) and to a renewal (the time from now; always positive here, since a lease that is
/// gone is [`crate::Error::LeaseNotFound`]).
///
/// A renewal's answer says only that the member renewed the lease. It is no proof that a key
/// is still held (etcd 3.4 could renew a lease that had been revoked), so a holder confirms
/// with a transaction comparing the key's value and lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Lease {
    pub header: Header,
    #[serde(rename = "ID")]
    pub id: LeaseId,
    #[serde(rename = "TTL", deserialize_with = "de_int")]
    pub ttl: i64,
}

/// A lease's remaining time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LeaseTimeToLive {
    pub header: Header,
    #[serde(rename = "ID")]
    pub id: LeaseId,
    /// Seconds left; always non-negative here (-1 is [`crate::Error::LeaseNotFound`]).
    #[serde(rename = "TTL", deserialize_with = "de_int")]
    pub ttl: i64,
    #[serde(rename = "grantedTTL", deserialize_with = "de_int")]
    pub granted_ttl: i64,
    /// The keys attached to it (asked for with `keys`).
    #[serde(deserialize_with = "de_keys")]
    pub keys: Vec<Vec<u8>>,
}

fn de_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
    #[derive(Deserialize)]
    struct Key(#[serde(deserialize_with = "de_bytes")] Vec<u8>);
    let keys = Option::<Vec<Key>>::deserialize(d)?.unwrap_or_default();
    Ok(keys.into_iter().map(|k| k.0).collect())
}

/// A member's status (`/v3/maintenance/status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Status {
    pub header: Header,
    /// etcd's version, like `3.4.23`.
    pub version: String,
    /// The leader's member ID as this member knows it (0: none).
    #[serde(deserialize_with = "de_int")]
    pub leader: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_follow_etcd() {
        assert_eq!(KeyRange::prefix("a/").range_end, b"a0");
        assert_eq!(KeyRange::prefix(vec![b'a', 0xff]).range_end, b"b");
        assert_eq!(KeyRange::prefix(vec![0xff, 0xff]).range_end, vec![0]);
        assert_eq!(KeyRange::prefix("").range_end, vec![0]);
        assert!(KeyRange::key("a").range_end.is_empty());
    }

    #[test]
    fn txn_json_names_every_field() {
        let txn = Txn::new()
            .when([Compare::absent("k"), Compare::lease_is("k", LeaseId(7))])
            .and_then([Op::put("k", "v", Some(LeaseId(7)))])
            .or_else([
                Op::Range(KeyRange::key("k")),
                Op::Delete(KeyRange::prefix("p")),
            ]);
        let body = txn.to_json();
        assert_eq!(
            body["compare"][0],
            json!({"result": "EQUAL", "target": "CREATE", "key": "aw==", "create_revision": "0"})
        );
        assert_eq!(body["compare"][1]["lease"], "7");
        assert_eq!(body["success"][0]["request_put"]["lease"], "7");
        assert_eq!(
            body["failure"][1]["request_delete_range"]["range_end"],
            "cQ=="
        );
    }

    #[test]
    fn txn_answers_decode() {
        let answer = r#"{"header":{"revision":"5"},"succeeded":true,"responses":[
            {"response_put":{"header":{"revision":"5"}}},
            {"response_range":{"header":{"revision":"5"},"kvs":[{"key":"aw==","lease":"9"}],"count":"1"}}]}"#;
        let txn: TxnResponse = serde_json::from_str(answer).expect("decodes");
        assert!(txn.succeeded);
        assert_eq!(txn.header.revision, 5);
        match &txn.responses[1] {
            OpResponse::Range(r) => assert_eq!(r.kvs[0].lease, LeaseId(9)),
            other => panic!("expected a range, got {other:?}"),
        }
        let failed: TxnResponse = serde_json::from_str(r#"{"header":{}}"#).expect("decodes");
        assert!(!failed.succeeded);
    }
}
