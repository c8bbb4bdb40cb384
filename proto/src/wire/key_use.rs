//! What a request touches, for ordering the requests of one connection: a
//! server runs requests on different keys at once, and a request after
//! another that may observe or change its keys only after it.

use bytes::Bytes;

use super::message::{Request, TxnOp, Update};

/// The keys a request reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyUse<'a> {
    /// Touches no key (status, membership, ping): needs no order.
    Nothing,
    /// Reads these keys only.
    Reads(Vec<&'a Bytes>),
    /// May change these keys (and may read them first).
    Writes(Vec<&'a Bytes>),
    /// Reads or writes a range or the whole keyspace (SCAN, CLEAR): ordered
    /// after everything before it, and everything after it after it.
    Everything,
}

impl Request {
    /// The keys this request touches.
    pub fn key_use(&self) -> KeyUse<'_> {
        match self {
            Request::Get { key, .. } | Request::Ttl { key, .. } => KeyUse::Reads(vec![key]),
            Request::MGet { keys, .. } => KeyUse::Reads(keys.iter().collect()),
            Request::Put { key, .. } | Request::Delete { key } | Request::Cas { key, .. } => {
                KeyUse::Writes(vec![key])
            }
            Request::Update { key, update } => KeyUse::Writes(update_keys(key, update)),
            Request::MPut { pairs } => KeyUse::Writes(pairs.iter().map(|(key, _)| key).collect()),
            // A transaction is one log entry that may write any key it
            // names, its watched keys decide whether it applies.
            Request::Transaction { watch, ops } => {
                let watched = watch.iter().map(|(key, _)| key);
                KeyUse::Writes(watched.chain(ops.iter().flat_map(txn_op_keys)).collect())
            }
            Request::Scan { .. } | Request::Clear | Request::Sharded { .. } => KeyUse::Everything,
            Request::Ping
            | Request::Status
            | Request::Health
            | Request::Members
            | Request::AddMember { .. }
            | Request::PromoteMember { .. }
            | Request::RemoveMember { .. }
            | Request::MoveLeader { .. }
            | Request::SnapshotRead { .. }
            | Request::ReportReads(_)
            | Request::InjectFault(_)
            | Request::RdmaConnect { .. }
            | Request::RdmaRegion
            | Request::OfiRegion
            | Request::ShardMap
            | Request::ShardStatus
            | Request::ShardMoveLeader { .. }
            | Request::PublishShardMap { .. }
            | Request::AddNode { .. }
            | Request::RemoveNode { .. }
            | Request::Digests => KeyUse::Nothing,
        }
    }
}

/// The key an update writes, and the source it reads (COPY, RENAME: whose
/// source RENAME also deletes).
pub fn update_keys<'a>(key: &'a Bytes, update: &'a Update) -> Vec<&'a Bytes> {
    match update {
        Update::CopyFrom { source, .. } => vec![key, source],
        _ => vec![key],
    }
}

/// The keys a transaction's op reads or writes.
pub fn txn_op_keys(op: &TxnOp) -> Vec<&Bytes> {
    match op {
        TxnOp::Get { key }
        | TxnOp::Put { key, .. }
        | TxnOp::Delete { key }
        | TxnOp::Ttl { key } => vec![key],
        TxnOp::Update { key, update } => update_keys(key, update),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Consistency;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn reads_writes_and_ranges_are_told_apart() {
        let get = Request::Get {
            key: b("a"),
            consistency: Consistency::Linearizable,
        };
        assert_eq!(get.key_use(), KeyUse::Reads(vec![&b("a")]));
        let put = Request::Put {
            key: b("a"),
            value: b("1"),
        };
        assert_eq!(put.key_use(), KeyUse::Writes(vec![&b("a")]));
        assert_eq!(Request::Clear.key_use(), KeyUse::Everything);
        assert_eq!(Request::Status.key_use(), KeyUse::Nothing);
    }

    #[test]
    fn a_copy_names_its_source_and_a_transaction_every_key() {
        let rename = Request::Update {
            key: b("to"),
            update: Update::CopyFrom {
                source: b("from"),
                replace: true,
                remove_source: true,
            },
        };
        assert_eq!(rename.key_use(), KeyUse::Writes(vec![&b("to"), &b("from")]));
        let txn = Request::Transaction {
            watch: vec![(b("w"), Some(3))],
            ops: vec![TxnOp::Get { key: b("g") }, TxnOp::Delete { key: b("d") }],
        };
        assert_eq!(
            txn.key_use(),
            KeyUse::Writes(vec![&b("w"), &b("g"), &b("d")])
        );
    }
}
