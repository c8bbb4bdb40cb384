//! The native requests behind Redis commands: served by this node, or at
//! the leader when this node does not lead (the Redis client never sees a
//! redirect). While no leader is known (an election), a request waits and
//! is tried again, for at most [`ELECTION_WAIT`]; but a pipelined write that
//! Raft refused after a later write of its key went ahead is answered
//! TRYAGAIN ([`RespServer::call_placed`]).

use std::time::Duration;

use bytes::Bytes;
use rdkv_proto::shard::{ShardId, ShardInfo, ShardMap};
use rdkv_proto::wire::{
    Consistency, ErrorCode, KeyExpiry, LeaderHint, Request, Response, Role, ShardStatus, Update,
    UpdateOutcome, Versioned,
};
use rdkv_storage::state_machine::LocalReads;

use super::RespServer;
use super::forward::error_reply;
use super::reply::Reply;
use crate::lease;
use crate::order::Finish;
use crate::replica::Replica;
use crate::service::read;
use crate::telemetry::Via;

/// Longest a command waits for an election to produce a leader.
const ELECTION_WAIT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// The reply to a response no command expects.
pub fn unexpected(what: &impl std::fmt::Debug) -> Reply {
    Reply::err(format!("unexpected reply from the store: {what:?}"))
}

/// The live keys of one shard from its replicas' `statuses`: its leader's
/// count (of the latest term, should a deposed leader not know it yet);
/// while none leads (an election), the count of the replica that applied
/// the most. `None`: no status.
fn leader_count(statuses: &[ShardStatus]) -> Option<u64> {
    statuses
        .iter()
        .filter(|s| s.role == Role::Leader)
        .max_by_key(|s| s.term)
        .or_else(|| statuses.iter().max_by_key(|s| s.applied_index))
        .map(|s| s.region.live_keys)
}

impl RespServer {
    /// Serves `request` here, or at the leader when this node does not lead.
    pub(super) async fn call(&self, request: Request) -> Result<Response, Reply> {
        self.call_placed(request, None).await
    }

    /// [`call`](Self::call) of a command's write, holding its `place`
    /// (`StoreRun::Placed`) until the write is queued for Raft here, or
    /// until it has been answered elsewhere. A write Raft refused after it
    /// was queued (nothing was written) takes its place back and is tried
    /// again as any refused write is, unless a later write of its keys on
    /// the connection has gone ahead meanwhile (`order::Done::withdraw`): tried
    /// now, it would land after that one, so it is answered with the
    /// refusal (TRYAGAIN) instead.
    pub(super) async fn call_placed(
        &self,
        request: Request,
        mut place: Option<Finish>,
    ) -> Result<Response, Reply> {
        let handler = &self.handler;
        request
            .validate(&handler.limits())
            .map_err(|e| Reply::err(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let placed = place.as_ref().map(Finish::done);
            let error = match handler
                .handle_placed(request.clone(), Via::Resp, &mut place)
                .await
            {
                Response::Error(error) if error.code == ErrorCode::NotLeader => error,
                // A key of a shard this node does not host: the forwarding
                // client finds its shard from the map.
                Response::WrongShard(_) => {
                    let endpoints = self.member_endpoints();
                    return Box::pin(self.forwarder.forward(endpoints, request)).await;
                }
                Response::Error(error) => return Err(error_reply(&error)),
                response => return Ok(response),
            };
            if let Some(placed) = placed.filter(|_| place.is_none()) {
                // Queued, then refused (Raft no longer led, was handing
                // over, or its lease had lapsed): nothing was written.
                place = Some(placed.withdraw().ok_or_else(|| error_reply(&error))?);
            }
            match &error.leader_hint {
                Some(hint) if hint.node_id != handler.replica().node_id() => {
                    let endpoints = self.leader_endpoints(hint);
                    // Boxed: the forwarding client's future is large, and
                    // inline it would be copied on every local call too.
                    return Box::pin(self.forwarder.forward(endpoints, request)).await;
                }
                _ if tokio::time::Instant::now() + backoff > deadline => {
                    return Err(error_reply(&error));
                }
                _ => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Every member's client address and the leader's, sorted: the same
    /// set gives the same forwarding client.
    fn leader_endpoints(&self, hint: &LeaderHint) -> Vec<String> {
        let mut endpoints = self.member_endpoints();
        if !endpoints.contains(&hint.client_addr) {
            endpoints.push(hint.client_addr.clone());
        }
        endpoints.sort();
        endpoints
    }

    /// The client addresses this node knows, sorted: a single group's
    /// members; on a multi-shard node every node of the map, as a key's
    /// shard may be on any of them (the forwarding client then routes each
    /// request to its shard's leader by the map it fetches).
    pub(super) fn member_endpoints(&self) -> Vec<String> {
        let shards = self.handler.shards();
        let mut endpoints: Vec<String> = match shards.is_sharded() {
            true => shards
                .shard_map(None)
                .map(|map| {
                    map.nodes()
                        .iter()
                        .filter_map(|n| n.client_addr.clone())
                        .collect()
                })
                .unwrap_or_default(),
            false => shards
                .primary()
                .members()
                .into_iter()
                .map(|m| m.client_addr)
                .collect(),
        };
        endpoints.retain(|a| !a.is_empty());
        endpoints.sort();
        endpoints
    }

    /// Up to `limit` keys from `start_key` on, in key order, with whether
    /// the walk is over (fewer than `limit` keys and nothing more): one
    /// page of the group; on a multi-shard node the forwarding client's
    /// scan, every shard's pages merged in key order.
    pub(super) async fn scan_keys(
        &self,
        start_key: Bytes,
        limit: usize,
    ) -> Result<(Vec<Bytes>, bool), Reply> {
        if self.handler.shards().is_sharded() {
            let endpoints = self.member_endpoints();
            let keys =
                Box::pin(
                    self.forwarder
                        .scan_keys(endpoints, start_key, limit, self.consistency),
                )
                .await?;
            let done = keys.len() < limit;
            return Ok((keys, done));
        }
        let request = Request::Scan {
            start_key,
            end_key: None,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            consistency: self.consistency,
        };
        let (pairs, more) = match self.call(request).await? {
            Response::Pairs { pairs, more } => (pairs, more),
            other => return Err(unexpected(&other)),
        };
        let done = pairs.len() < limit && !more;
        Ok((pairs.into_iter().map(|(key, _)| key).collect(), done))
    }

    /// Deletes every key: one entry in the group's log; on a multi-shard
    /// node one entry in each shard's, all at once through the forwarding
    /// client, not atomic across shards (docs/sharding.md, section 6).
    pub(super) async fn clear(&self) -> Result<(), Reply> {
        if self.handler.shards().is_sharded() {
            let endpoints = self.member_endpoints();
            return Box::pin(self.forwarder.clear(endpoints)).await;
        }
        match self.call(Request::Clear).await? {
            Response::Cleared { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// DBSIZE: the live keys of this node's region; on a multi-shard node
    /// the sum over every shard of its leader's count (docs/sharding.md,
    /// section 6), exact once a write is acknowledged.
    pub(super) async fn live_keys(&self) -> Result<u64, Reply> {
        let shards = self.handler.shards();
        if !shards.is_sharded() {
            return Ok(shards.primary().live_keys());
        }
        let map = shards.shard_map(None).map_err(|e| error_reply(&e))?;
        let local = self.handler.shard_statuses();
        let counts = map
            .shards()
            .iter()
            .map(|shard| self.leader_live_keys(&map, shard, &local));
        let mut total = 0u64;
        for count in futures::future::join_all(counts).await {
            total = total.saturating_add(count?);
        }
        Ok(total)
    }

    /// The live keys of `shard` as its leader counts them ([`leader_count`]):
    /// this node's replica (in `local`) when it leads, else from the
    /// `ShardStatus` of every member, asked at once.
    async fn leader_live_keys(
        &self,
        map: &ShardMap,
        shard: &ShardInfo,
        local: &[ShardStatus],
    ) -> Result<u64, Reply> {
        let mut statuses: Vec<ShardStatus> = local
            .iter()
            .filter(|s| s.shard == shard.id)
            .cloned()
            .collect();
        if let Some(status) = statuses.iter().find(|s| s.role == Role::Leader) {
            return Ok(status.region.live_keys);
        }
        let own_id = self.handler.replica().node_id();
        let addrs: Vec<String> = shard
            .members
            .iter()
            .filter(|id| **id != own_id)
            .filter_map(|id| map.node(*id)?.client_addr.clone())
            .collect();
        let endpoints = self.member_endpoints();
        let asks = addrs
            .iter()
            .map(|addr| self.status_at(endpoints.clone(), addr, shard.id));
        let mut failure = None;
        for answer in futures::future::join_all(asks).await {
            match answer {
                Ok(status) => statuses.extend(status),
                Err(e) => failure = Some(e),
            }
        }
        leader_count(&statuses).ok_or_else(|| {
            failure.unwrap_or_else(|| {
                Reply::err(format!("no member of shard {} answered", shard.id.0))
            })
        })
    }

    /// `shard`'s replica on the node at `addr`, as that node's
    /// `ShardStatus` shows it (`None`: it hosts no replica of `shard`).
    async fn status_at(
        &self,
        endpoints: Vec<String>,
        addr: &str,
        shard: ShardId,
    ) -> Result<Option<ShardStatus>, Reply> {
        let request = Request::ShardStatus;
        match Box::pin(self.forwarder.send_to(endpoints, addr, request)).await? {
            Response::ShardStatus(statuses) => Ok(statuses.into_iter().find(|s| s.shard == shard)),
            other => Err(unexpected(&other)),
        }
    }

    /// The replica whose region this node may answer reads from at once
    /// (`None`: it may not), asked once per batch of buffered commands
    /// (every one of which arrived before this is called):
    /// - at `lease` consistency, when this node holds the lease
    ///   ([`lease::serves_lease_reads`]), within the lease's margin;
    /// - at `linearizable` consistency, when this node leads and a ReadIndex
    ///   round that started now confirms it (the round is shared with every
    ///   other read waiting on the node, `service::read_rounds`): one round
    ///   per batch of reads, not per read. Not the lease: a leader whose
    ///   lease lapsed under load still serves reads this way. A node that
    ///   does not lead or fails the round answers through the store path,
    ///   which forwards or reports why.
    ///
    /// A multi-shard node never does: its keys are in several regions, and
    /// these reads go to one (they go through the handler, which routes).
    pub(super) async fn reads_now(&self) -> Option<Replica> {
        if self.handler.shards().is_sharded() {
            return None;
        }
        let replica = self.handler.replica();
        let allowed = match self.consistency {
            Consistency::Lease => lease::serves_lease_reads(&replica),
            Consistency::Linearizable => {
                replica.raft.is_leader() && matches!(replica.reads.confirm().await, Ok(Ok(())))
            }
            Consistency::Follower { .. } => false,
        };
        allowed.then_some(replica)
    }

    /// Reads `key` from this node's region at once, once [`Self::reads_now`]
    /// said it may, and hands its value to `found` (a slice of the read
    /// buffer, not a copy); `false` for a key over the limit or a failed
    /// read, `found` not called (the read goes through [`RespServer::get`],
    /// which refuses it or reports the failure). The caller accounts for it
    /// in the request metrics.
    pub(super) fn get_now(
        &self,
        reads: &mut LocalReads<'_>,
        key: &[u8],
        found: impl FnOnce(Option<&[u8]>),
    ) -> bool {
        if self.handler.limits().check_key(key).is_err() {
            return false;
        }
        let mut found = Some(found);
        let read = reads.get_with(key, |value| {
            if let Some(found) = found.take() {
                found(value.map(|(value, _)| value));
            }
        });
        read.is_ok()
    }

    /// MGET's values read at once, like [`Self::get_now`]; `None` for a
    /// batch over the limits or a failed read (the store path refuses or
    /// reports it).
    pub(super) fn mget_now<'k>(
        &self,
        reads: &mut LocalReads<'_>,
        keys: impl ExactSizeIterator<Item = &'k [u8]> + Clone,
    ) -> Option<Vec<Option<Bytes>>> {
        let limits = self.handler.limits();
        limits.check_batch(keys.len()).ok()?;
        keys.clone()
            .try_for_each(|key| limits.check_key(key))
            .ok()?;
        let values = read::local_values(reads, keys, limits.max_frame_bytes).ok()?;
        Some(values.into_iter().map(|v| v.map(|v| v.value)).collect())
    }

    pub(super) async fn get(&self, key: &Bytes) -> Result<Option<Bytes>, Reply> {
        let request = Request::Get {
            key: key.clone(),
            consistency: self.consistency,
        };
        match self.call(request).await? {
            Response::Value(value) => Ok(value.map(|v| v.value)),
            other => Err(unexpected(&other)),
        }
    }

    /// The key's deadline and the answering node's clock (`None`: absent).
    pub(super) async fn ttl(&self, key: &Bytes) -> Result<Option<KeyExpiry>, Reply> {
        let request = Request::Ttl {
            key: key.clone(),
            consistency: self.consistency,
        };
        match self.call(request).await? {
            Response::Expiry(expiry) => Ok(expiry),
            other => Err(unexpected(&other)),
        }
    }

    /// The positions of `keys` per shard on a multi-shard node when they
    /// are in more than one; `None`: one request serves them all.
    pub(super) fn split_by_shard<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k Bytes>,
    ) -> Option<Vec<Vec<usize>>> {
        let map = self.handler.shards().map()?;
        let groups = map.positions_by_shard(keys.into_iter().map(|k| &k[..]));
        (groups.len() > 1).then(|| groups.into_iter().map(|(_, at)| at).collect())
    }

    /// The keys' values with their versions (`None`: absent). Keys of
    /// several shards are read shard by shard at once, each part one
    /// consistent read of its shard, and put back in the caller's order.
    async fn mget_versioned(&self, keys: &[Bytes]) -> Result<Vec<Option<Versioned>>, Reply> {
        let Some(groups) = self.split_by_shard(keys) else {
            return self.mget_one_shard(keys.to_vec()).await;
        };
        let parts = groups.iter().map(|positions| {
            self.mget_one_shard(positions.iter().map(|&at| keys[at].clone()).collect())
        });
        let parts = futures::future::join_all(parts).await;
        let mut values: Vec<Option<Versioned>> = keys.iter().map(|_| None).collect();
        for (positions, part) in groups.iter().zip(parts) {
            let part = part?;
            if part.len() != positions.len() {
                return Err(unexpected(&part));
            }
            for (&at, value) in positions.iter().zip(part) {
                values[at] = value;
            }
        }
        Ok(values)
    }

    /// The values of `keys`, all of one shard (or of a single group).
    async fn mget_one_shard(&self, keys: Vec<Bytes>) -> Result<Vec<Option<Versioned>>, Reply> {
        let request = Request::MGet {
            keys,
            consistency: self.consistency,
        };
        match self.call(request).await? {
            Response::Values(values) => Ok(values),
            other => Err(unexpected(&other)),
        }
    }

    pub(super) async fn mget(&self, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, Reply> {
        let values = self.mget_versioned(keys).await?;
        Ok(values.into_iter().map(|v| v.map(|v| v.value)).collect())
    }

    /// The keys' versions (`None`: absent), as WATCH remembers them.
    pub(super) async fn versions(&self, keys: &[Bytes]) -> Result<Vec<Option<u64>>, Reply> {
        let values = self.mget_versioned(keys).await?;
        Ok(values.into_iter().map(|v| v.map(|v| v.version)).collect())
    }

    /// A read-modify-write of one key, decided by the state machine.
    /// `update` of `key`, the command's only write: `place` as in
    /// [`call_placed`](Self::call_placed).
    pub(super) async fn update(
        &self,
        key: &Bytes,
        update: Update,
        place: Option<Finish>,
    ) -> Result<UpdateOutcome, Reply> {
        let request = Request::Update {
            key: key.clone(),
            update,
        };
        match self.call_placed(request, place).await? {
            Response::Updated(outcome) => Ok(outcome),
            other => Err(unexpected(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkv_proto::wire::RegionFill;

    use super::*;

    fn status(role: Role, term: u64, applied_index: u64, live_keys: u64) -> ShardStatus {
        ShardStatus {
            shard: ShardId(1),
            role,
            term,
            leader_id: None,
            members: vec![1, 2, 3],
            last_log_index: applied_index,
            commit_index: applied_index,
            applied_index,
            region: RegionFill {
                capacity_bytes: 1 << 20,
                used_bytes: 0,
                pending_reclaim_bytes: 0,
                live_keys,
            },
        }
    }

    #[test]
    fn a_shard_counts_as_its_leader_says() {
        let statuses = [
            status(Role::Follower, 3, 90, 7),
            status(Role::Leader, 3, 80, 5),
        ];
        assert_eq!(
            leader_count(&statuses),
            Some(5),
            "the leader, not the most applied"
        );
        let deposed = [
            status(Role::Leader, 2, 70, 4),
            status(Role::Leader, 3, 60, 6),
        ];
        assert_eq!(leader_count(&deposed), Some(6), "the latest term's leader");
    }

    #[test]
    fn without_a_leader_the_most_applied_replica_counts() {
        let statuses = [
            status(Role::Candidate, 4, 50, 3),
            status(Role::Follower, 4, 60, 8),
            status(Role::Follower, 4, 40, 1),
        ];
        assert_eq!(leader_count(&statuses), Some(8));
        assert_eq!(leader_count(&[]), None);
    }
}
