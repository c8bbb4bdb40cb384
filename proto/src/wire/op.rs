//! Request kinds as names: the `op` label of metrics and of `endpoint status`.

use super::message::Request;

/// What a request does, without its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Get,
    MGet,
    Put,
    Delete,
    Cas,
    MPut,
    Update,
    Scan,
    Clear,
    Ping,
    Status,
    Health,
    Members,
    AddMember,
    PromoteMember,
    RemoveMember,
    MoveLeader,
    SnapshotRead,
    ReportReads,
    InjectFault,
    RdmaConnect,
    RdmaRegion,
    Digests,
    Transaction,
    Ttl,
    OfiRegion,
    ShardMap,
    ShardStatus,
    ShardMoveLeader,
    PublishShardMap,
    ShardOpenReplica,
    ShardCloseReplica,
    ShardMoveReplica,
    AddNode,
    RemoveNode,
}

impl Op {
    /// Every op, in a fixed order (indexes of per-op tables).
    pub const ALL: [Op; 35] = [
        Op::Get,
        Op::MGet,
        Op::Put,
        Op::Delete,
        Op::Cas,
        Op::MPut,
        Op::Update,
        Op::Scan,
        Op::Clear,
        Op::Ping,
        Op::Status,
        Op::Health,
        Op::Members,
        Op::AddMember,
        Op::PromoteMember,
        Op::RemoveMember,
        Op::MoveLeader,
        Op::SnapshotRead,
        Op::ReportReads,
        Op::InjectFault,
        Op::RdmaConnect,
        Op::RdmaRegion,
        Op::Digests,
        Op::Transaction,
        Op::Ttl,
        Op::OfiRegion,
        Op::ShardMap,
        Op::ShardStatus,
        Op::ShardMoveLeader,
        Op::PublishShardMap,
        Op::ShardOpenReplica,
        Op::ShardCloseReplica,
        Op::ShardMoveReplica,
        Op::AddNode,
        Op::RemoveNode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::MGet => "mget",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Cas => "cas",
            Op::MPut => "mput",
            Op::Update => "update",
            Op::Scan => "scan",
            Op::Clear => "clear",
            Op::Ping => "ping",
            Op::Status => "status",
            Op::Health => "health",
            Op::Members => "members",
            Op::AddMember => "add_member",
            Op::PromoteMember => "promote_member",
            Op::RemoveMember => "remove_member",
            Op::MoveLeader => "move_leader",
            Op::SnapshotRead => "snapshot_read",
            Op::ReportReads => "report_reads",
            Op::InjectFault => "inject_fault",
            Op::RdmaConnect => "rdma_connect",
            Op::RdmaRegion => "rdma_region",
            Op::OfiRegion => "ofi_region",
            Op::ShardMap => "shard_map",
            Op::ShardStatus => "shard_status",
            Op::ShardMoveLeader => "shard_move_leader",
            Op::PublishShardMap => "publish_shard_map",
            Op::ShardOpenReplica => "shard_open_replica",
            Op::ShardCloseReplica => "shard_close_replica",
            Op::ShardMoveReplica => "shard_move_replica",
            Op::AddNode => "add_node",
            Op::RemoveNode => "remove_node",
            Op::Digests => "digests",
            Op::Transaction => "transaction",
            Op::Ttl => "ttl",
        }
    }

    /// Position in [`Op::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Key-value data operations (what `rdkvctl top` shows), as opposed to
    /// admin and liveness requests.
    pub fn is_data(self) -> bool {
        matches!(
            self,
            Op::Get
                | Op::MGet
                | Op::Put
                | Op::Delete
                | Op::Cas
                | Op::MPut
                | Op::Update
                | Op::Scan
                | Op::Clear
                | Op::Transaction
                | Op::Ttl
        )
    }
}

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Get { .. } => Op::Get,
            Request::MGet { .. } => Op::MGet,
            Request::Put { .. } => Op::Put,
            Request::Delete { .. } => Op::Delete,
            Request::Cas { .. } => Op::Cas,
            Request::MPut { .. } => Op::MPut,
            Request::Update { .. } => Op::Update,
            Request::Scan { .. } => Op::Scan,
            Request::Clear => Op::Clear,
            Request::Ping => Op::Ping,
            Request::Status => Op::Status,
            Request::Health => Op::Health,
            Request::Members => Op::Members,
            Request::AddMember { .. } => Op::AddMember,
            Request::PromoteMember { .. } => Op::PromoteMember,
            Request::RemoveMember { .. } => Op::RemoveMember,
            Request::MoveLeader { .. } => Op::MoveLeader,
            Request::SnapshotRead { .. } => Op::SnapshotRead,
            Request::ReportReads(_) => Op::ReportReads,
            Request::InjectFault(_) => Op::InjectFault,
            Request::RdmaConnect { .. } => Op::RdmaConnect,
            Request::RdmaRegion => Op::RdmaRegion,
            Request::Digests => Op::Digests,
            Request::Transaction { .. } => Op::Transaction,
            Request::Ttl { .. } => Op::Ttl,
            Request::OfiRegion => Op::OfiRegion,
            Request::ShardMap => Op::ShardMap,
            Request::Sharded { request, .. } => request.op(),
            Request::ShardStatus => Op::ShardStatus,
            Request::ShardMoveLeader { .. } => Op::ShardMoveLeader,
            Request::PublishShardMap { .. } => Op::PublishShardMap,
            Request::AddNode { .. } => Op::AddNode,
            Request::RemoveNode { .. } => Op::RemoveNode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Op;

    #[test]
    fn all_is_in_index_order_and_names_are_unique() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
        let names: std::collections::BTreeSet<_> = Op::ALL.iter().map(|op| op.name()).collect();
        assert_eq!(names.len(), Op::ALL.len());
    }
}
