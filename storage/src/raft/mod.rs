//! The Raft side of storage: the type configuration shared by the log store,
//! the state machine and the server, and the commands the log carries.

pub mod types;

pub use types::rpc;
pub use types::{
    Command, CommandResult, Entry, LogId, NodeAddr, SnapshotMeta, StoredMembership, TypeConfig,
    Vote,
};
