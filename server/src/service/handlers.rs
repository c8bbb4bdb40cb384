//! What each request does on this node.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::{ChangeMembers, ReadPolicy};
use rdkv_proto::wire::{
    Consistency, ErrorCode, ErrorReply, Fault, LeaderHint, Limits, MemberInfo, Op, Request,
    Response, SINGLE_ENTRY_OVERHEAD_BYTES, ServedCounts, SnapshotChunk, Update,
};
use rdkv_storage::raft::{Command, CommandResult, NodeAddr, TypeConfig};
use rdkv_storage::raft_log::LogStore;
use rdkv_storage::state_machine::RegionStateMachine;

use crate::Raft;
use crate::peer::PeerContext;
use crate::telemetry::{RequestStats, Via};

/// Largest snapshot piece one `SnapshotRead` returns.
const MAX_SNAPSHOT_CHUNK_BYTES: u32 = 4 * 1024 * 1024;
/// A leader refuses writes that would leave less than this share of the
/// region free: replicas' regions fill differently (fragmentation, grace
/// periods), and a follower must never be the one that runs out.
const WRITE_HEADROOM_PERCENT: u64 = 5;
const MOVE_LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a write may wait to commit, or a read to confirm leadership.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where this node can be reached, for `/status` and `endpoint status`.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    /// Native protocol over TCP.
    pub client: String,
    /// Native protocol over the local Unix socket.
    pub rpc_socket: Option<String>,
    /// `shm` attach socket.
    pub shm_socket: Option<String>,
    pub resp: Option<String>,
    pub http: Option<String>,
}

/// What a handler is configured with.
#[derive(Debug, Clone)]
pub struct HandlerSettings {
    pub limits: Limits,
    pub endpoints: Endpoints,
    /// Accept `InjectFault` (fault tests only).
    pub fault_injection: bool,
    /// Client connections served at once (TCP and Unix socket together).
    pub max_client_connections: u32,
    /// Bytes of large requests held at once, across connections.
    pub max_in_flight_bytes: u64,
}

/// Requests up to this size do not take from the in-flight budget: a node
/// at its budget still answers reads and small writes (each connection's
/// credits bound those).
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug)]
pub struct Handler {
    raft: Raft,
    sm: RegionStateMachine,
    peers: Arc<PeerContext>,
    limits: Limits,
    log: LogStore,
    endpoints: Endpoints,
    stats: RequestStats,
    fault_injection: bool,
    rdma: Arc<crate::rdma::RdmaState>,
    /// One permit per client connection allowed.
    connection_slots: Arc<tokio::sync::Semaphore>,
    max_client_connections: u32,
    /// One permit per KiB of large requests allowed in flight.
    in_flight_kib: Arc<tokio::sync::Semaphore>,
    max_in_flight_kib: u32,
}

type Reply = Result<Response, ErrorReply>;

/// The `mem` transport's server side: an in-process `MemChannel` calls the
/// handler directly, with no framing or socket.
impl rdkv_fabric::RpcHandler for Handler {
    fn handle(
        &self,
        request: Request,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + '_>> {
        Box::pin(Handler::handle(self, request, Via::Mem))
    }
}

impl Handler {
    pub fn new(
        raft: Raft,
        sm: RegionStateMachine,
        peers: Arc<PeerContext>,
        log: LogStore,
        settings: HandlerSettings,
        rdma: Arc<crate::rdma::RdmaState>,
    ) -> Self {
        Handler {
            raft,
            sm,
            peers,
            limits: settings.limits,
            log,
            endpoints: settings.endpoints,
            stats: RequestStats::default(),
            fault_injection: settings.fault_injection,
            rdma,
            connection_slots: Arc::new(tokio::sync::Semaphore::new(
                settings.max_client_connections as usize,
            )),
            max_client_connections: settings.max_client_connections,
            in_flight_kib: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(settings.max_in_flight_bytes / 1024).unwrap_or(usize::MAX),
            )),
            max_in_flight_kib: u32::try_from(settings.max_in_flight_bytes / 1024)
                .unwrap_or(u32::MAX),
        }
    }

    /// A slot for one more client connection, if the limit allows.
    pub(super) fn connection_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.connection_slots).try_acquire_owned().ok()
    }

    pub fn max_client_connections(&self) -> u32 {
        self.max_client_connections
    }

    /// Takes `payload_bytes` from the node's in-flight budget for a large
    /// request (`None` for a small one), waiting while the budget is spent;
    /// `waited` is set if it had to.
    pub(super) async fn in_flight_permit(
        &self,
        payload_bytes: usize,
        waited: &mut bool,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if payload_bytes <= SMALL_REQUEST_BYTES {
            return None;
        }
        let kib = u32::try_from(payload_bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.max_in_flight_kib);
        if let Ok(permit) = Arc::clone(&self.in_flight_kib).try_acquire_many_owned(kib) {
            return Some(permit);
        }
        *waited = true;
        Arc::clone(&self.in_flight_kib)
            .acquire_many_owned(kib)
            .await
            .ok()
    }

    /// (budget, in use) of large in-flight requests, in bytes.
    pub fn in_flight_bytes(&self) -> (u64, u64) {
        let total = u64::from(self.max_in_flight_kib) * 1024;
        let free = self.in_flight_kib.available_permits() as u64 * 1024;
        (total, total.saturating_sub(free))
    }

    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    pub fn rdma(&self) -> &crate::rdma::RdmaState {
        &self.rdma
    }

    pub fn stats(&self) -> &RequestStats {
        &self.stats
    }

    pub(crate) fn log(&self) -> &LogStore {
        &self.log
    }

    /// Requests answered over the native protocol, by kind (the older,
    /// coarser view of [`RequestStats`]).
    pub fn served(&self) -> ServedCounts {
        let n = |op| self.stats.requests_of(op);
        let (tcp_connections, unix_connections) = self.stats.accepted();
        let data = [
            Op::Get,
            Op::MGet,
            Op::Put,
            Op::Update,
            Op::Delete,
            Op::Cas,
            Op::MPut,
            Op::Scan,
        ];
        let admin = Op::ALL
            .iter()
            .filter(|op| !data.contains(op))
            .map(|&op| n(op))
            .sum();
        ServedCounts {
            get: n(Op::Get),
            mget: n(Op::MGet),
            put: n(Op::Put) + n(Op::Update),
            delete: n(Op::Delete),
            cas: n(Op::Cas),
            mput: n(Op::MPut),
            admin,
            tcp_connections,
            unix_connections,
            scan: n(Op::Scan),
        }
    }

    pub fn token(&self) -> Option<&str> {
        self.peers.token.as_deref()
    }

    pub fn node_id(&self) -> u64 {
        self.peers.node_id
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn region_stats(&self) -> rdkv_storage::RegionStats {
        self.sm.region_stats()
    }

    /// Validation counters of this node's own lock-free reader (current
    /// region; they restart when a snapshot install replaces the region).
    pub fn local_read_stats(&self) -> rdkv_fabric::ReadStats {
        self.sm.reader().stats()
    }

    /// Keys held by this node's region (DBSIZE).
    pub fn live_keys(&self) -> u64 {
        self.sm.region_stats().live_keys
    }

    pub(super) fn raft(&self) -> &Raft {
        &self.raft
    }

    pub(super) fn sm(&self) -> &RegionStateMachine {
        &self.sm
    }

    pub(super) fn peers(&self) -> &PeerContext {
        &self.peers
    }

    /// Serves one request that arrived `via` a transport: checks its limits,
    /// answers it, and accounts for it in the metrics.
    pub async fn handle(&self, request: Request, via: Via) -> Response {
        let op = request.op();
        let flight = self.stats.start();
        let response = match request.validate(&self.limits) {
            Err(e) => Response::Error(ErrorReply::from(&e)),
            Ok(()) => self.dispatch(request).await,
        };
        let error = match &response {
            Response::Error(reply) => Some(reply.code),
            _ => None,
        };
        self.stats.finish(flight, op, via, error);
        response
    }

    async fn dispatch(&self, request: Request) -> Response {
        let reply = match request {
            Request::Ping => Ok(Response::Pong),
            Request::Get { key, consistency } => self.get(&key, consistency).await,
            Request::MGet { keys, consistency } => self.mget(&keys, consistency).await,
            Request::Put { key, value } => self.write(Command::Put { key, value }).await,
            Request::Delete { key } => self.write(Command::Delete { key }).await,
            Request::Cas {
                key,
                expected_version,
                new_value,
            } => {
                self.write(Command::Cas {
                    key,
                    expected_version,
                    new_value,
                })
                .await
            }
            Request::MPut { pairs } => self.write(Command::MPut { pairs }).await,
            Request::Status => Ok(Response::Status(Box::new(self.status()))),
            Request::Health => Ok(Response::Health(self.health())),
            Request::Members => Ok(Response::Members(self.members())),
            Request::AddMember {
                id,
                peer_addr,
                client_addr,
                learner,
            } => self.add_member(id, peer_addr, client_addr, learner).await,
            Request::PromoteMember { id } => self.promote_member(id).await,
            Request::RemoveMember { id } => self.remove_member(id).await,
            Request::MoveLeader { to } => self.move_leader(to).await,
            Request::SnapshotRead { offset, max_bytes } => {
                self.snapshot_read(offset, max_bytes).await
            }
            Request::Update { key, update } => self.write(Command::Update { key, update }).await,
            Request::Clear => self.write(Command::Clear).await,
            Request::InjectFault(fault) => self.inject_fault(fault),
            Request::ReportReads(report) => {
                crate::telemetry::scrape::client_reads(&report);
                Ok(Response::Done)
            }
            Request::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            } => {
                self.scan(&start_key, end_key.as_deref(), limit, consistency)
                    .await
            }
            // Needs the client connection it belongs to (its queue pair lives
            // as long as that connection): handled in `service`.
            Request::RdmaConnect { .. } => Err(ErrorReply::new(
                ErrorCode::InvalidRequest,
                "rdma sessions are opened on a native client connection",
            )),
            Request::RdmaRegion => self
                .rdma
                .region_grant(&self.sm, self.node_id())
                .map(Response::RdmaRegion),
        };
        reply.unwrap_or_else(Response::Error)
    }

    /// The client address of node `id`: from the membership, or learned from
    /// its peer handshake.
    pub(super) fn client_addr_of(&self, id: u64, node: Option<&NodeAddr>) -> Option<String> {
        node.map(|n| n.client_addr.clone())
            .filter(|a| !a.is_empty())
            .or_else(|| self.peers.client_addr_of(id))
    }

    fn hint(&self, leader: Option<u64>, node: Option<&NodeAddr>) -> Option<LeaderHint> {
        let node_id = leader?;
        let node = node.cloned().or_else(|| {
            let metrics = self.raft.metrics().borrow_watched().clone();
            metrics
                .membership_config
                .membership()
                .get_node(&node_id)
                .cloned()
        });
        let client_addr = self.client_addr_of(node_id, node.as_ref())?;
        Some(LeaderHint {
            node_id,
            client_addr,
        })
    }

    fn not_leader(&self, leader: Option<u64>, node: Option<&NodeAddr>) -> ErrorReply {
        ErrorReply::not_leader(self.hint(leader, node))
    }

    /// Writes and membership changes are the leader's: elsewhere, say who leads.
    fn require_leader(&self) -> Result<(), ErrorReply> {
        if self.raft.is_leader() {
            Ok(())
        } else {
            Err(self.current_leader_error())
        }
    }

    fn current_leader_error(&self) -> ErrorReply {
        let leader = self.raft.metrics().borrow_watched().current_leader;
        self.not_leader(leader, None)
    }

    /// Waits until this node may serve a read at `consistency`.
    async fn read_barrier(&self, consistency: Consistency) -> Result<(), ErrorReply> {
        let policy = match consistency {
            Consistency::Follower { max_lag_entries } => {
                let metrics = self.raft.metrics().borrow_watched().clone();
                // The lag is judged against this node's view of the commit
                // index; that view is only as fresh as its last contact with
                // the leader (a follower) or with a quorum (a leader). A node
                // cut off for longer stops answering instead of serving an
                // unbounded staleness.
                let freshness = Duration::from_millis(self.raft.config().election_timeout_min);
                let contact = if metrics.state == openraft::ServerState::Leader {
                    crate::node::quorum_ack_age(&metrics)
                } else {
                    self.peers.since_leader_contact()
                };
                if contact.is_none_or(|age| age > freshness) {
                    return Err(ErrorReply::new(
                        ErrorCode::StaleFollower,
                        format!(
                            "no contact with the {} for {}; follower reads need it within {freshness:?}",
                            if metrics.state == openraft::ServerState::Leader {
                                "quorum"
                            } else {
                                "leader"
                            },
                            contact.map_or("ever".to_owned(), |age| format!("{age:?}")),
                        ),
                    ));
                }
                let committed = metrics.cluster_committed.map_or(0, |l| l.index);
                let lag = committed.saturating_sub(self.sm.applied_index());
                if lag > max_lag_entries {
                    return Err(ErrorReply::new(
                        ErrorCode::StaleFollower,
                        format!(
                            "this node is {lag} entries behind, over the {max_lag_entries} allowed"
                        ),
                    ));
                }
                return Ok(());
            }
            // During a transfer the lease is not trusted (see move_leader).
            Consistency::Lease if self.sm.lease_suppressed() => ReadPolicy::ReadIndex,
            Consistency::Lease => ReadPolicy::LeaseRead,
            Consistency::Linearizable => ReadPolicy::ReadIndex,
        };
        let lease = matches!(consistency, Consistency::Lease);
        let confirmed =
            tokio::time::timeout(REQUEST_TIMEOUT, self.raft.ensure_linearizable(policy))
                .await
                .map_err(|_| {
                    ErrorReply::new(
                        ErrorCode::Unavailable,
                        format!("leadership not confirmed within {REQUEST_TIMEOUT:?}"),
                    )
                })?;
        match confirmed {
            Ok(_) => Ok(()),
            // The lease has lapsed (no quorum contact lately): a ReadIndex
            // round confirms leadership instead.
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) if lease => {
                match tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
                )
                .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(self.read_error(e)),
                    Err(_) => Err(ErrorReply::new(
                        ErrorCode::Unavailable,
                        format!("leadership not confirmed within {REQUEST_TIMEOUT:?}"),
                    )),
                }
            }
            Err(e) => Err(self.read_error(e)),
        }
    }

    fn read_error(
        &self,
        error: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>,
    ) -> ErrorReply {
        match error {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
                self.not_leader(f.leader_id, f.leader_node.as_ref())
            }
            RaftError::APIError(LinearizableReadError::QuorumNotEnough(e)) => {
                ErrorReply::new(ErrorCode::Unavailable, e.to_string())
            }
            RaftError::Fatal(e) => ErrorReply::new(ErrorCode::Unavailable, e.to_string()),
        }
    }

    fn local(&self, key: &[u8]) -> Result<Option<rdkv_proto::wire::Versioned>, ErrorReply> {
        self.sm
            .get_local(key)
            .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))
    }

    async fn get(&self, key: &Bytes, consistency: Consistency) -> Reply {
        self.read_barrier(consistency).await?;
        Ok(Response::Value(self.local(key)?))
    }

    async fn mget(&self, keys: &[Bytes], consistency: Consistency) -> Reply {
        self.read_barrier(consistency).await?;
        // Stop as soon as the reply could not fit a frame: a batch of large
        // values must not be gathered in memory just to be refused.
        let budget = u64::from(self.limits.max_frame_bytes);
        let mut bytes = 0u64;
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self.local(key)?;
            bytes += value.as_ref().map_or(0, |v| v.value.len() as u64);
            if bytes > budget {
                return Err(ErrorReply::new(
                    ErrorCode::FrameTooLarge,
                    format!("the values exceed the {budget}-byte frame limit; ask for fewer keys"),
                ));
            }
            values.push(value);
        }
        Ok(Response::Values(values))
    }

    async fn scan(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
        consistency: Consistency,
    ) -> Reply {
        self.read_barrier(consistency).await?;
        let budget = u64::from(self.limits.max_frame_bytes)
            .saturating_sub(u64::from(SINGLE_ENTRY_OVERHEAD_BYTES));
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let page = self
            .sm
            .scan_local(start, end, limit, budget)
            .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))?;
        Ok(Response::Pairs {
            pairs: page.pairs,
            more: page.more,
        })
    }

    fn inject_fault(&self, fault: Fault) -> Reply {
        if !self.fault_injection {
            return Err(ErrorReply::new(
                ErrorCode::InvalidRequest,
                "fault injection is disabled (start the node with --fault-injection)",
            ));
        }
        tracing::warn!(?fault, "fault injected");
        match fault {
            Fault::Isolate { peers } => self.peers.isolate_from(peers),
            Fault::Heal => {
                self.peers.isolate_from([]);
                self.log.set_fsync_delay(Duration::ZERO);
            }
            Fault::SlowFsync { delay_ms } => {
                self.log.set_fsync_delay(Duration::from_millis(delay_ms));
            }
        }
        Ok(Response::Done)
    }

    /// Refuses a write the region could not take with headroom to spare.
    fn admit(&self, command: &Command) -> Result<(), ErrorReply> {
        let incoming: u64 = match command {
            Command::Put { key, value } => (key.len() + value.len()) as u64,
            Command::Cas {
                key,
                new_value: Some(value),
                ..
            } => (key.len() + value.len()) as u64,
            Command::MPut { pairs } => pairs.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum(),
            Command::Update { key, update } => {
                let grows = match update {
                    Update::Incr { .. } => 20,
                    Update::Append { suffix } => suffix.len(),
                    Update::SetIf { value, .. } => value.len(),
                };
                (key.len() + grows) as u64
            }
            Command::Delete { .. }
            | Command::Clear
            | Command::Cas {
                new_value: None, ..
            } => return Ok(()),
        };
        let stats = self.sm.region_stats();
        let reserve = stats.data_capacity_bytes * WRITE_HEADROOM_PERCENT / 100;
        let available = stats.free_bytes + stats.pending_reclaim_bytes;
        if available < incoming.saturating_add(reserve) {
            return Err(ErrorReply::new(
                ErrorCode::RegionFull,
                format!(
                    "region full: {available} bytes free or reclaimable, {incoming} needed plus a {reserve}-byte reserve"
                ),
            ));
        }
        Ok(())
    }

    async fn write(&self, command: Command) -> Reply {
        self.require_leader()?;
        self.admit(&command)?;
        // A leader cut off from its quorum would hold the request (and the
        // connection's credit) forever: bound it; the outcome is then unknown.
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(command))
            .await
            .map_err(|_| {
                ErrorReply::new(
                    ErrorCode::Timeout,
                    format!(
                        "not committed within {REQUEST_TIMEOUT:?}: it may or may not be applied"
                    ),
                )
            })?
            .map_err(|e| self.write_error(e))?;
        match response.data {
            CommandResult::Written { version } => Ok(Response::Written { version }),
            CommandResult::Deleted { existed, version } => {
                Ok(Response::Deleted { existed, version })
            }
            CommandResult::CasDone {
                succeeded,
                version,
                current,
            } => Ok(Response::CasDone {
                succeeded,
                version,
                current,
            }),
            CommandResult::MWritten { version } => Ok(Response::MWritten { version }),
            CommandResult::Updated(outcome) => Ok(Response::Updated(outcome)),
            CommandResult::Cleared { removed, version } => {
                Ok(Response::Cleared { removed, version })
            }
            CommandResult::Failed {
                region_full,
                message,
            } => Err(ErrorReply::new(
                if region_full {
                    ErrorCode::RegionFull
                } else {
                    ErrorCode::Internal
                },
                message,
            )),
            CommandResult::None => Err(ErrorReply::new(
                ErrorCode::Internal,
                "a write produced no result",
            )),
        }
    }

    fn write_error(
        &self,
        error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
    ) -> ErrorReply {
        match error {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                self.not_leader(f.leader_id, f.leader_node.as_ref())
            }
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ErrorReply::new(
                ErrorCode::Timeout,
                "leadership changed while the write was in flight: it may or may not have been applied",
            ),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ErrorReply::new(ErrorCode::InvalidRequest, e.to_string())
            }
            RaftError::APIError(other) => {
                ErrorReply::new(ErrorCode::InvalidRequest, other.to_string())
            }
            RaftError::Fatal(e) => ErrorReply::new(ErrorCode::Unavailable, e.to_string()),
        }
    }

    pub(crate) fn members(&self) -> Vec<MemberInfo> {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: self.client_addr_of(*id, Some(node)).unwrap_or_default(),
                voter: voters.contains(id),
            })
            .collect()
    }

    async fn add_member(
        &self,
        id: u64,
        peer_addr: String,
        client_addr: String,
        learner: bool,
    ) -> Reply {
        self.require_leader()?;
        if id == 0 {
            return Err(ErrorReply::new(
                ErrorCode::InvalidRequest,
                "member ids start at 1",
            ));
        }
        tracing::info!(id, %peer_addr, %client_addr, learner, "adding a member");
        let node = NodeAddr {
            peer_addr,
            client_addr,
        };
        // Blocking: returns once the learner has caught up (by snapshot if
        // the log it needs was purged).
        self.raft
            .add_learner(id, node, true)
            .await
            .map_err(|e| self.write_error(e))?;
        if !learner {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
                .await
                .map_err(|e| self.write_error(e))?;
        }
        Ok(Response::Members(self.members()))
    }

    async fn promote_member(&self, id: u64) -> Reply {
        self.require_leader()?;
        if !self.members().iter().any(|m| m.id == id) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("node {id} is not a member"),
            ));
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(Response::Members(self.members()))
    }

    async fn remove_member(&self, id: u64) -> Reply {
        self.require_leader()?;
        let Some(member) = self.members().into_iter().find(|m| m.id == id) else {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("node {id} is not a member"),
            ));
        };
        tracing::info!(id, "removing a member");
        let change = if member.voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(Response::Members(self.members()))
    }

    async fn move_leader(&self, to: u64) -> Reply {
        self.require_leader()?;
        if !self.members().iter().any(|m| m.id == to && m.voter) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("node {to} is not a voter"),
            ));
        }
        if to == self.node_id() {
            return Ok(Response::Done);
        }
        tracing::info!(to, "transferring leadership");
        // openraft lets the target win its election while followers' leases
        // still run, and this node keeps believing it leads until it hears of
        // the new term: no lease reads from here until an election timeout
        // after the transfer could have completed.
        let hold_ms = self.raft.config().election_timeout_max * 2;
        let until_us = rdkv_fabric::clock::unix_now_us() + hold_ms * 1000;
        self.sm
            .suppress_lease_until(until_us)
            .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))?;
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| ErrorReply::new(ErrorCode::Unavailable, e.to_string()))?;
        self.raft
            .wait(Some(MOVE_LEADER_TIMEOUT))
            .metrics(|m| m.current_leader == Some(to), "leadership moved")
            .await
            .map_err(|e| {
                ErrorReply::new(
                    ErrorCode::Timeout,
                    format!("node {to} did not take over: {e}"),
                )
            })?;
        Ok(Response::Done)
    }

    async fn snapshot_read(&self, offset: u64, max_bytes: u32) -> Reply {
        let (meta, data) = self
            .sm
            .snapshot_bytes()
            .await
            .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))?;
        let total_bytes = data.len() as u64;
        let start = offset.min(total_bytes) as usize;
        let len = max_bytes.clamp(1, MAX_SNAPSHOT_CHUNK_BYTES) as usize;
        let end = start.saturating_add(len).min(data.len());
        Ok(Response::Snapshot(SnapshotChunk {
            last_log_index: meta.last_log_id.map_or(0, |l| l.index),
            total_bytes,
            offset: start as u64,
            data: data.slice(start..end),
        }))
    }
}
