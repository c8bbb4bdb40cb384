//! [`Handler`]: serves one request on this node. It checks the request's
//! limits, hands it to the module of its concern (read, write, admin,
//! status), and accounts for it in the metrics; it holds no rule of its own.

use std::sync::Arc;

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Limits, Request, Response, ShardRequest};
use rdkv_storage::raft::{Command, NodeAddr};
use rdkv_storage::state_machine::ScanRange;

use super::admission::{Admission, within_quota};
use super::{Reply, admin, read, replica_move, write};
use crate::hosting::Hosting;
use crate::ofi::OfiState;
use crate::order::Finish;
use crate::rdma::RdmaState;
use crate::replica::Replica;
use crate::shards::{NotHere, Shards, not_across_shards};
use crate::telemetry::{RequestStats, Via};

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
    /// The quota this node proposes; it admits writes by the applied one
    /// (the cluster's) once there is one.
    pub quota_bytes: u64,
    pub endpoints: Endpoints,
    /// Accept `InjectFault` (fault tests only).
    pub fault_injection: bool,
    /// Client connections served at once (TCP and Unix socket together).
    pub max_client_connections: u32,
    /// Bytes of large requests held at once, across connections.
    pub max_in_flight_bytes: u64,
    /// Opens and closes shard replicas (a multi-shard node's moves).
    pub hosting: Option<Arc<Hosting>>,
}

/// The replica a request's keys route to, or the early answer: nothing is
/// proposed or read for a key this node does not serve, so `WrongShard`
/// is safe to resend (docs/sharding.md, section 4).
macro_rules! routed {
    ($route:expr) => {
        match $route {
            Ok(replica) => replica,
            Err(NotHere::WrongShard(wrong)) => return Ok(Response::WrongShard(wrong)),
            Err(cross) => return Err(cross.to_error()),
        }
    };
}

/// The answer to an rdma session request that reached the handler: it
/// needs the client connection it belongs to (its queue pair lives as long
/// as that connection), so `connection` serves it, on native connections
/// only.
fn rdma_connect_elsewhere() -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        "rdma sessions are opened on a native client connection",
    )
}

/// A scan's range as the state machine takes it.
fn scan_range<'k>(start: &'k [u8], end: Option<&'k [u8]>, limit: u32) -> ScanRange<'k> {
    ScanRange {
        start,
        end,
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
    }
}

#[derive(Debug)]
pub struct Handler {
    /// This node's shard replicas: keyed requests go to their key's shard,
    /// the others to the primary (shard 0 in a single group).
    shards: Shards,
    limits: Limits,
    quota_bytes: u64,
    endpoints: Endpoints,
    stats: RequestStats,
    fault_injection: bool,
    rdma: Arc<RdmaState>,
    ofi: Arc<OfiState>,
    admission: Admission,
    hosting: Option<Arc<Hosting>>,
}

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
        shards: Shards,
        settings: HandlerSettings,
        rdma: Arc<RdmaState>,
        ofi: Arc<OfiState>,
    ) -> Self {
        Handler {
            shards,
            limits: settings.limits,
            quota_bytes: settings.quota_bytes,
            endpoints: settings.endpoints,
            stats: RequestStats::default(),
            fault_injection: settings.fault_injection,
            rdma,
            ofi,
            admission: Admission::new(
                settings.max_client_connections,
                settings.max_in_flight_bytes,
            ),
            hosting: settings.hosting,
        }
    }

    /// The replica of requests that name no shard (shard 0 in a single
    /// group).
    pub fn replica(&self) -> Replica {
        self.shards.primary()
    }

    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// Why this node refuses a one-sided grant request that names no
    /// shard (`RdmaRegion`, `OfiRegion`, `RdmaConnect`, a plain shm attach):
    /// a multi-shard node holds a region per shard, and a reader given one
    /// for a request that named none would take another shard's keys for
    /// absent (docs/sharding.md, section 5). Such a node grants a region
    /// only to a request naming its shard (`Request::Sharded`).
    pub fn one_sided_refusal(&self) -> Option<ErrorReply> {
        self.shards.is_sharded().then(|| {
            ErrorReply::new(
                ErrorCode::InvalidRequest,
                "this node hosts several shards: a one-sided grant must name its \
                 shard (protocol version 3)",
            )
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    pub fn stats(&self) -> &RequestStats {
        &self.stats
    }

    pub fn rdma(&self) -> &RdmaState {
        &self.rdma
    }

    pub fn ofi(&self) -> &OfiState {
        &self.ofi
    }

    pub(super) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Serves one request that arrived `via` a transport: checks its limits,
    /// answers it, and accounts for it in the metrics.
    pub async fn handle(&self, request: Request, via: Via) -> Response {
        self.handle_placed(request, via, &mut None).await
    }

    /// [`handle`](Self::handle), taking and dropping `placed` once a
    /// write's place in the log is fixed (it is queued for Raft): the
    /// connection's next write of the same keys may then be proposed. A
    /// request refused before that (not the leader, no room, not a write)
    /// leaves it with the caller, whose next attempt is still first.
    pub async fn handle_placed(
        &self,
        request: Request,
        via: Via,
        placed: &mut Option<Finish>,
    ) -> Response {
        let op = request.op();
        let flight = self.stats.start();
        let response = match request.validate(&self.limits) {
            Err(e) => Response::Error(ErrorReply::from(&e)),
            Ok(()) => self
                .dispatch(request, placed)
                .await
                .unwrap_or_else(Response::Error),
        };
        let error = match &response {
            Response::Error(reply) => Some(reply.code),
            _ => None,
        };
        self.stats.finish(flight, op, via, error);
        response
    }

    /// The hot requests (GET, MGET, writes) are awaited here; the rest are
    /// boxed: a future is as large as its largest arm, and it is copied at
    /// every await on the way down.
    async fn dispatch(&self, request: Request, placed: &mut Option<Finish>) -> Reply {
        let max_frame_bytes = self.limits.max_frame_bytes;
        match request {
            Request::Ping => Ok(Response::Pong),
            Request::Get { key, consistency } => {
                let replica = routed!(self.shards.for_key(&key));
                read::get(&replica, &key, consistency).await
            }
            Request::MGet { keys, consistency } => {
                let replica = routed!(self.shards.for_keys(keys.iter().map(|k| &k[..])));
                read::mget(&replica, &keys, consistency, max_frame_bytes).await
            }
            // Every write is a command for the log.
            other => match Command::try_from(other) {
                Ok(command) => self.write(command, placed).await,
                Err(other) => Box::pin(self.dispatch_rest(other)).await,
            },
        }
    }

    async fn dispatch_rest(&self, request: Request) -> Reply {
        let replica = &self.shards.primary();
        let max_frame_bytes = self.limits.max_frame_bytes;
        match request {
            Request::Ping => Ok(Response::Pong),
            Request::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            } => {
                if self.shards.is_sharded() {
                    return Err(not_across_shards("scan"));
                }
                let range = scan_range(&start_key, end_key.as_deref(), limit);
                read::scan(replica, range, consistency, max_frame_bytes).await
            }
            // Opening a replica names a shard not hosted here (yet).
            Request::Sharded {
                shard,
                request: ShardRequest::OpenReplica,
            } => replica_move::open_replica(self.hosting.as_deref(), shard).await,
            Request::Sharded { shard, request } => {
                let replica = routed!(self.shards.hosted(shard));
                self.serve_sharded(shard, &replica, request).await
            }
            Request::Ttl { key, consistency } => {
                let replica = routed!(self.shards.for_key(&key));
                read::ttl(&replica, &key, consistency).await
            }
            Request::Status => Ok(Response::Status(Box::new(self.status()))),
            Request::Health => Ok(Response::Health(self.health())),
            Request::Members => Ok(Response::Members(replica.members())),
            Request::ShardMap => self
                .shards
                .shard_map(self.endpoints.resp.clone())
                .map(|map| Response::ShardMap(Box::new(map))),
            Request::Digests => Ok(Response::Digests(replica.sm.digests())),
            Request::ShardStatus => Ok(Response::ShardStatus(self.shard_statuses())),
            Request::ShardMoveLeader { shard, to } => {
                let replica = self.shards.get(shard).ok_or_else(|| {
                    ErrorReply::new(
                        ErrorCode::NotFound,
                        format!("shard {shard} has no replica on this node"),
                    )
                })?;
                admin::move_leader(&replica, to).await
            }
            Request::AddMember {
                id,
                peer_addr,
                client_addr,
                learner,
            } => {
                let addr = NodeAddr {
                    peer_addr,
                    client_addr,
                };
                admin::add_member(replica, id, addr, learner).await
            }
            Request::PromoteMember { id } => admin::promote_member(replica, id).await,
            Request::RemoveMember { id } => admin::remove_member(replica, id).await,
            Request::MoveLeader { to } => admin::move_leader(replica, to).await,
            Request::SnapshotRead { offset, max_bytes } => {
                admin::snapshot_read(replica, offset, max_bytes).await
            }
            // Every shard's traffic and log: a node is cut off or slowed whole.
            Request::InjectFault(fault) => {
                for (_, replica) in self.shards.all() {
                    admin::inject_fault(&replica, self.fault_injection, fault.clone())?;
                }
                Ok(Response::Done)
            }
            request @ (Request::PublishShardMap { .. }
            | Request::AddNode { .. }
            | Request::RemoveNode { .. }) => self.meta_request(request).await,
            Request::ReportReads(report) => {
                crate::telemetry::scrape::client_reads(&report);
                Ok(Response::Done)
            }
            Request::RdmaConnect { .. } => Err(rdma_connect_elsewhere()),
            // Unnamed: the one group's region (shard 0), refused on a
            // multi-shard node.
            Request::RdmaRegion => self.unnamed_grant(false),
            Request::OfiRegion => self.unnamed_grant(true),
            // GET and MGET are served by `dispatch`, writes by `write`.
            other => Err(ErrorReply::new(
                ErrorCode::InvalidRequest,
                format!("{:?} is not served here", other.op()),
            )),
        }
    }

    /// A request of the metadata group (docs/sharding.md, section 2):
    /// a new map version, a new node, a node leaving. A single-group node
    /// has none.
    async fn meta_request(&self, request: Request) -> Reply {
        let Some(meta) = self.shards.meta() else {
            let what = match request {
                Request::AddNode { .. } => {
                    "a single-group node takes a new node as a member (`AddMember`, what \
                     `--join` sends it)"
                }
                Request::RemoveNode { .. } => {
                    "a single-group node removes a member with `RemoveMember` (`rdkvctl \
                     member remove`)"
                }
                _ => "a single-group node has no shard map to publish",
            };
            return Err(ErrorReply::new(ErrorCode::InvalidRequest, what));
        };
        match request {
            Request::PublishShardMap { map } => crate::meta::edit::publish_here(meta, map).await,
            Request::AddNode {
                id,
                peer_addr,
                client_addr,
                resp_addr,
            } => {
                let node = crate::meta::join::NewNode {
                    id,
                    peer_addr,
                    client_addr,
                    resp_addr,
                };
                crate::meta::join::add_node(meta, node).await
            }
            Request::RemoveNode { id } => crate::meta::remove::remove_node(meta, id).await,
            other => Err(ErrorReply::new(
                ErrorCode::Internal,
                format!("{:?} is not a metadata group request", other.op()),
            )),
        }
    }

    /// A keyless request of one shard's `replica` (docs/sharding.md,
    /// section 4): what it would be on a single group, on that replica.
    async fn serve_sharded(
        &self,
        shard: ShardId,
        replica: &Replica,
        request: ShardRequest,
    ) -> Reply {
        match request {
            ShardRequest::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            } => {
                let range = scan_range(&start_key, end_key.as_deref(), limit);
                read::scan(replica, range, consistency, self.limits.max_frame_bytes).await
            }
            ShardRequest::Clear => self.write_to(replica, Command::Clear, &mut None).await,
            // Served before the shard is looked up (it is not hosted yet),
            // and alike when it is.
            ShardRequest::OpenReplica => {
                replica_move::open_replica(self.hosting.as_deref(), shard).await
            }
            ShardRequest::CloseReplica => {
                replica_move::close_replica(self.hosting.as_deref(), shard).await
            }
            ShardRequest::MoveReplica { from, to } => {
                let Some(hosting) = self.hosting.as_deref() else {
                    return Err(replica_move::single_group());
                };
                let run = replica_move::Move {
                    shards: &self.shards,
                    hosting,
                    replica,
                    shard,
                };
                run.run(from, to).await
            }
            ShardRequest::RdmaRegion => self.grant(replica, shard, false),
            ShardRequest::OfiRegion => self.grant(replica, shard, true),
            ShardRequest::RdmaConnect { .. } => Err(rdma_connect_elsewhere()),
        }
    }

    /// A grant request naming no shard: the single group's region,
    /// refused on a multi-shard node.
    fn unnamed_grant(&self, ofi: bool) -> Reply {
        match self.one_sided_refusal() {
            Some(refusal) => Err(refusal),
            None => self.grant(&self.shards.primary(), ShardId(0), ofi),
        }
    }

    /// The grant of `replica`'s region, shard `shard`'s, over libfabric
    /// (`ofi`) or verbs; sent over the authenticated connection only, like
    /// every answer.
    fn grant(&self, replica: &Replica, shard: ShardId, ofi: bool) -> Reply {
        let (sm, node_id) = (&replica.sm, replica.node_id());
        match ofi {
            true => self
                .ofi
                .region_grant(sm, node_id, shard)
                .map(Response::OfiRegion),
            false => self
                .rdma
                .region_grant(sm, node_id, shard)
                .map(Response::RdmaRegion),
        }
    }

    /// A write goes through the log on the leader, if the quota has room
    /// for it.
    async fn write(&self, command: Command, placed: &mut Option<Finish>) -> Reply {
        let replica = match command.keys() {
            Some(keys) => routed!(self.shards.for_keys(keys.into_iter().map(|key| &key[..]))),
            None if self.shards.is_sharded() => return Err(not_across_shards("a keyless write")),
            None => self.shards.primary(),
        };
        self.write_to(&replica, command, placed).await
    }

    /// `command` through the log of `replica`, on its leader, if the quota
    /// has room for it.
    async fn write_to(
        &self,
        replica: &Replica,
        command: Command,
        placed: &mut Option<Finish>,
    ) -> Reply {
        replica.require_leader()?;
        self.admit_within_quota(replica, &command)?;
        write::commit(replica, command, placed).await
    }

    /// Checks `command` against the cluster's quota (this node's own until
    /// one is applied); a refusal raises the no-space alarm.
    fn admit_within_quota(&self, replica: &Replica, command: &Command) -> Result<(), ErrorReply> {
        let sm = &replica.sm;
        let status = sm.quota_status();
        let quota_bytes = status.quota_bytes.unwrap_or(self.quota_bytes);
        within_quota(command, status.charged_bytes, quota_bytes).inspect_err(|_| {
            sm.raise_no_space_alarm();
        })
    }
}
