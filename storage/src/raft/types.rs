//! What rdkv's Raft log carries. A `Command` is applied to the region by the
//! state machine on every replica; its `CommandResult` goes back to the client
//! that proposed it (on the leader only).

use std::fmt;

use bytes::Bytes;
use rdkv_proto::shard::ShardMap;
use rdkv_proto::wire::key_use::{txn_op_keys, update_keys};
use rdkv_proto::wire::{ErrorCode, ErrorReply, Request, Response, TxnOp, Update};
use serde::{Deserialize, Serialize};

use crate::cluster_id::ClusterId;

/// A state-machine command. Append-only (postcard encodes the variant index,
/// and these are stored in the durable log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Put {
        key: Bytes,
        value: Bytes,
    },
    Delete {
        key: Bytes,
    },
    /// Write (or delete, when `new_value` is `None`) only if the key's version
    /// is `expected_version` (`None`: only if the key is absent).
    Cas {
        key: Bytes,
        expected_version: Option<u64>,
        new_value: Option<Bytes>,
    },
    /// All pairs in one entry: applied together, one version for all.
    MPut {
        pairs: Vec<(Bytes, Bytes)>,
    },
    /// A read-modify-write of one key (INCR, APPEND, SET NX/XX/GET), decided
    /// and applied by the state machine so that it is atomic.
    Update {
        key: Bytes,
        update: Update,
    },
    /// Deletes every key.
    Clear,
    /// The cluster's hash seed (SipHash keys of the region index), proposed
    /// by the first leader that finds none applied. The first one applied
    /// fixes the seed for good; later ones change nothing. Internal: no
    /// client request becomes this command.
    SetHashSeed {
        seed: (u64, u64),
    },
    /// The cluster's quota: the most the live pairs may be charged
    /// (`rdkv_proto::region::charged_bytes`). Proposed by a leader whose
    /// `--quota-bytes` differs from the one applied; every replica refuses
    /// a write past it alike. Internal: no client request becomes this.
    SetQuota {
        bytes: u64,
    },
    /// Redis's MULTI/EXEC: `ops` in order as one entry, if every watched
    /// key still has its version (`Request::Transaction`).
    Transaction {
        watch: Vec<(Bytes, Option<u64>)>,
        ops: Vec<TxnOp>,
    },
    /// `command` as proposed by a leader whose wall clock read
    /// `now_unix_ms` (the entry's stamp): apply moves the replicated apply
    /// clock to it (never back), expires keys by that clock, and turns
    /// relative TTLs into deadlines from it, so every replica decides
    /// alike. Every client write is proposed this way. Never nested
    /// (decoding refuses it, so a peer cannot make decoding recurse).
    Timed {
        now_unix_ms: u64,
        #[serde(deserialize_with = "timed_once")]
        command: Box<Command>,
    },
    /// The active expire cycle: deletes each key that still has the
    /// version given and has expired on the apply clock (a key written
    /// again since the leader chose it is left alone). Internal: proposed
    /// by the leader (`Timed`), never by a client.
    ExpireKeys {
        keys: Vec<(Bytes, u64)>,
    },
    /// The cluster's identity (`cluster_id`), proposed by the first leader
    /// that finds none applied. The first one applied is the cluster's for
    /// good. Internal: no client request becomes this command.
    SetClusterId {
        id: ClusterId,
    },
    /// A new shard map for the metadata group (docs/sharding.md, section
    /// 2): applied only if its version is exactly one above the applied
    /// map's (0 when none), else refused alike on every replica; kept as
    /// the record `state_machine::SHARD_MAP_KEY`. Internal: proposed by the
    /// metadata group's leader, never by a client request.
    PublishShardMap {
        map: ShardMap,
    },
}

thread_local! {
    /// Whether this thread is decoding the command of a `Command::Timed`.
    static DECODING_TIMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Decodes the command of a `Command::Timed`, refusing another `Timed`
/// inside it before it is decoded: nesting is bounded at one level.
fn timed_once<'de, D: serde::Deserializer<'de>>(decoder: D) -> Result<Box<Command>, D::Error> {
    if DECODING_TIMED.get() {
        return Err(serde::de::Error::custom(
            "a timed command inside a timed command",
        ));
    }
    DECODING_TIMED.set(true);
    let command = Box::<Command>::deserialize(decoder);
    DECODING_TIMED.set(false);
    command
}

impl Command {
    /// `self` stamped with a leader's wall clock (see `Command::Timed`).
    pub fn timed(self, now_unix_ms: u64) -> Command {
        Command::Timed {
            now_unix_ms,
            command: Box::new(self),
        }
    }

    /// The keys a write touches (a COPY's or RENAME's source included), in
    /// the order it names them; `None`: it names none (`Clear`, and the
    /// settings: the hash seed, the quota, the cluster's identity, the
    /// shard map). What routes a write to its shard.
    pub fn keys(&self) -> Option<Vec<&Bytes>> {
        let keys = match self {
            Command::Put { key, .. } | Command::Delete { key } | Command::Cas { key, .. } => {
                vec![key]
            }
            Command::Update { key, update } => update_keys(key, update),
            Command::MPut { pairs } => pairs.iter().map(|(key, _)| key).collect(),
            Command::Transaction { watch, ops } => watch
                .iter()
                .map(|(key, _)| key)
                .chain(ops.iter().flat_map(txn_op_keys))
                .collect(),
            Command::ExpireKeys { keys } => keys.iter().map(|(key, _)| key).collect(),
            Command::Timed { command, .. } => return command.keys(),
            Command::Clear
            | Command::SetHashSeed { .. }
            | Command::SetQuota { .. }
            | Command::SetClusterId { .. }
            | Command::PublishShardMap { .. } => return None,
        };
        Some(keys)
    }

    /// The first of [`Self::keys`], the one the apply of `self` looks up
    /// first: what the apply loop prefetches a few entries ahead. Built
    /// without the list, as it is asked of every entry.
    pub fn first_key(&self) -> Option<&Bytes> {
        match self {
            Command::Put { key, .. }
            | Command::Delete { key }
            | Command::Cas { key, .. }
            | Command::Update { key, .. } => Some(key),
            Command::MPut { pairs } => pairs.first().map(|(key, _)| key),
            Command::ExpireKeys { keys } => keys.first().map(|(key, _)| key),
            Command::Transaction { watch, ops } => match watch.first() {
                Some((key, _)) => Some(key),
                None => ops.iter().flat_map(txn_op_keys).next(),
            },
            Command::Timed { command, .. } => command.first_key(),
            Command::Clear
            | Command::SetHashSeed { .. }
            | Command::SetQuota { .. }
            | Command::SetClusterId { .. }
            | Command::PublishShardMap { .. } => None,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Put { key, value } => {
                write!(
                    f,
                    "put {} bytes key, {} bytes value",
                    key.len(),
                    value.len()
                )
            }
            Command::Delete { key } => write!(f, "delete {} bytes key", key.len()),
            Command::Cas { key, .. } => write!(f, "cas {} bytes key", key.len()),
            Command::MPut { pairs } => write!(f, "mput {} pairs", pairs.len()),
            Command::Update { key, .. } => write!(f, "update {} bytes key", key.len()),
            Command::Clear => write!(f, "clear"),
            Command::SetHashSeed { .. } => write!(f, "set the hash seed"),
            Command::SetQuota { bytes } => write!(f, "set the quota to {bytes} bytes"),
            Command::Transaction { watch, ops } => write!(
                f,
                "transaction of {} ops watching {} keys",
                ops.len(),
                watch.len()
            ),
            Command::Timed { command, .. } => write!(f, "{command}"),
            Command::ExpireKeys { keys } => write!(f, "expire {} keys", keys.len()),
            Command::SetClusterId { id } => write!(f, "set the cluster identity to {id}"),
            Command::PublishShardMap { map } => {
                write!(f, "publish shard map version {}", map.version())
            }
        }
    }
}

/// The writes of the native protocol are the commands the log carries;
/// every other request is handed back unchanged (`Err`), for the caller to
/// serve without the log.
impl TryFrom<Request> for Command {
    type Error = Request;

    fn try_from(request: Request) -> Result<Command, Request> {
        Ok(match request {
            Request::Put { key, value } => Command::Put { key, value },
            Request::Delete { key } => Command::Delete { key },
            Request::Cas {
                key,
                expected_version,
                new_value,
            } => Command::Cas {
                key,
                expected_version,
                new_value,
            },
            Request::MPut { pairs } => Command::MPut { pairs },
            Request::Update { key, update } => Command::Update { key, update },
            Request::Clear => Command::Clear,
            Request::Transaction { watch, ops } => Command::Transaction { watch, ops },
            other => return Err(other),
        })
    }
}

/// The outcome of applying a command on one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// Applied: the reply its proposer gets (versions are the entry's log index).
    Applied(Response),
    /// The command could not be applied here (the region is corrupt); the
    /// region is unchanged by it. A refusal every replica makes alike (the
    /// quota, a limit) is `Applied` with an error response instead.
    Failed { message: String },
    /// For blank and membership entries, which have no client.
    None,
}

/// What the proposing client is told. `Failed` and `None` become error
/// replies: a command that could not be applied left the region unchanged,
/// and a client's command always has a result.
impl From<CommandResult> for Response {
    fn from(result: CommandResult) -> Response {
        match result {
            CommandResult::Applied(response) => response,
            CommandResult::Failed { message } => {
                Response::Error(ErrorReply::new(ErrorCode::Internal, message))
            }
            CommandResult::None => Response::Error(ErrorReply::new(
                ErrorCode::Internal,
                "a write produced no result",
            )),
        }
    }
}

/// How to reach a member: Raft traffic and client traffic use different ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeAddr {
    pub peer_addr: String,
    pub client_addr: String,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {} client {}", self.peer_addr, self.client_addr)
    }
}

openraft::declare_raft_types!(
    /// rdkv's Raft type configuration.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = NodeAddr,
        AsyncRuntime = openraft_rt_tokio::TokioRuntime,
);

pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;

/// The Raft RPCs and their errors, as peers exchange them.
pub mod rpc {
    use super::TypeConfig;

    pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
    pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<TypeConfig>;
    pub type VoteRequest = openraft::raft::VoteRequest<TypeConfig>;
    pub type VoteResponse = openraft::raft::VoteResponse<TypeConfig>;
    pub type TransferLeaderRequest = openraft::raft::TransferLeaderRequest<TypeConfig>;
    pub type TransferLeaderResponse = openraft::raft::TransferLeaderResponse<TypeConfig>;
    pub type SnapshotResponse = openraft::raft::SnapshotResponse<TypeConfig>;
    /// What the remote node's Raft answered with instead of a response.
    pub type RaftError = openraft::errors::RaftError<TypeConfig>;
    /// A failed call: the peer unreachable, the network, or the remote's error.
    pub type RpcError = openraft::errors::RPCError<TypeConfig>;
    pub type StreamingError = openraft::errors::StreamingError<TypeConfig>;
    /// One answer of a pipelined AppendEntries stream: the log id the
    /// follower has flushed up to, or why the stream stops.
    pub type StreamAppendResult = openraft::raft::StreamAppendResult<TypeConfig>;
    pub type StreamAppendError = openraft::raft::StreamAppendError<TypeConfig>;
    /// RaftCore has stopped.
    pub type Fatal = openraft::errors::Fatal<TypeConfig>;
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use rdkv_proto::wire::{Consistency, ErrorCode, Request, Response, TxnOp, Update};

    use super::{Command, CommandResult};

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn a_commands_keys_are_what_it_writes_and_reads_and_its_first_key_leads_them() {
        let copy = Update::CopyFrom {
            source: b("from"),
            replace: true,
            remove_source: true,
        };
        let cases: Vec<(Command, Option<Vec<&str>>)> = vec![
            (
                Command::Put {
                    key: b("p"),
                    value: b("v"),
                }
                .timed(7),
                Some(vec!["p"]),
            ),
            (
                Command::Cas {
                    key: b("c"),
                    expected_version: Some(1),
                    new_value: Some(b("v")),
                },
                Some(vec!["c"]),
            ),
            (Command::Delete { key: b("d") }, Some(vec!["d"])),
            (
                Command::Update {
                    key: b("to"),
                    update: copy.clone(),
                },
                Some(vec!["to", "from"]),
            ),
            (
                Command::MPut {
                    pairs: vec![(b("m1"), b("v")), (b("m2"), b("v"))],
                }
                .timed(7),
                Some(vec!["m1", "m2"]),
            ),
            (
                Command::Transaction {
                    watch: vec![(b("w"), Some(1))],
                    ops: vec![TxnOp::Put {
                        key: b("t"),
                        value: b("v"),
                    }],
                },
                Some(vec!["w", "t"]),
            ),
            (
                Command::Transaction {
                    watch: vec![],
                    ops: vec![
                        TxnOp::Update {
                            key: b("to"),
                            update: copy.clone(),
                        },
                        TxnOp::Get { key: b("g") },
                    ],
                },
                Some(vec!["to", "from", "g"]),
            ),
            (
                Command::ExpireKeys {
                    keys: vec![(b("e"), 3)],
                },
                Some(vec!["e"]),
            ),
            (Command::MPut { pairs: vec![] }, Some(vec![])),
            (Command::Clear.timed(7), None),
            (Command::SetQuota { bytes: 1 }, None),
        ];
        for (command, expected) in cases {
            let keys = command
                .keys()
                .map(|keys| keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>());
            let expected =
                expected.map(|keys| keys.iter().map(|k| k.as_bytes().to_vec()).collect());
            assert_eq!(keys, expected, "{command}");
            let first = keys.as_ref().and_then(|keys| keys.first().cloned());
            assert_eq!(command.first_key().map(|k| k.to_vec()), first, "{command}");
        }
    }

    #[test]
    fn writes_become_commands_and_reads_come_back() {
        let put = Request::Put {
            key: Bytes::from("k"),
            value: Bytes::from("v"),
        };
        assert_eq!(
            Command::try_from(put),
            Ok(Command::Put {
                key: Bytes::from("k"),
                value: Bytes::from("v"),
            })
        );
        assert_eq!(Command::try_from(Request::Clear), Ok(Command::Clear));
        let get = Request::Get {
            key: Bytes::from("k"),
            consistency: Consistency::Lease,
        };
        assert_eq!(Command::try_from(get.clone()), Err(get));
    }

    #[test]
    fn a_timed_command_round_trips_and_a_nested_one_is_refused() {
        let put = Command::Put {
            key: Bytes::from("k"),
            value: Bytes::from("v"),
        };
        let timed = put.clone().timed(7);
        let bytes = postcard::to_allocvec(&timed).unwrap();
        assert_eq!(postcard::from_bytes::<Command>(&bytes).unwrap(), timed);
        let nested = timed.timed(8);
        let bytes = postcard::to_allocvec(&nested).unwrap();
        assert!(postcard::from_bytes::<Command>(&bytes).is_err());
        // A refused decode leaves the guard clear for the next one.
        let bytes = postcard::to_allocvec(&put.timed(9)).unwrap();
        assert!(postcard::from_bytes::<Command>(&bytes).is_ok());
    }

    #[test]
    fn failed_results_become_error_replies() {
        let failed = CommandResult::Failed {
            message: "corrupt".into(),
        };
        assert!(matches!(
            Response::from(failed),
            Response::Error(reply) if reply.code == ErrorCode::Internal
        ));
        assert!(matches!(
            Response::from(CommandResult::None),
            Response::Error(reply) if reply.code == ErrorCode::Internal
        ));
        assert_eq!(
            Response::from(CommandResult::Applied(Response::Written { version: 7 })),
            Response::Written { version: 7 }
        );
    }
}
