//! What rdkv's Raft log carries. A `Command` is applied to the region by the
//! state machine on every replica; its `CommandResult` goes back to the client
//! that proposed it (on the leader only).

use std::fmt;

use bytes::Bytes;
use rdkv_proto::wire::{Update, UpdateOutcome, Versioned};
use serde::{Deserialize, Serialize};

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
        }
    }
}

/// The outcome of applying a command; `version` is the entry's log index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Written {
        version: u64,
    },
    Deleted {
        existed: bool,
        version: u64,
    },
    CasDone {
        succeeded: bool,
        version: u64,
        current: Option<Versioned>,
    },
    MWritten {
        version: u64,
    },
    /// The command could not be applied here (e.g. the region is full); the
    /// region is unchanged by it.
    Failed {
        region_full: bool,
        message: String,
    },
    /// For blank and membership entries, which have no client.
    None,
    /// The outcome of a `Command::Update`.
    Updated(UpdateOutcome),
    Cleared {
        removed: u64,
        version: u64,
    },
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
