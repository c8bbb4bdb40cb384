//! `ShardRequest::MoveReplica`, run by the shard's leader (docs/sharding.md,
//! section 8), once a quorum has acknowledged it (openraft changes the
//! membership only under a valid lease): the target opens an empty replica
//! and is added as a learner, catches up, is promoted; the source is
//! demoted to a learner (so that it learns it is no voter), removed, and
//! closes its replica; the new members are published. Every failure leaves
//! the shard a valid membership: before the promotion a learner that did
//! not make it is removed again, after it the shard has one voter more
//! than asked. A move cut short (its leader killed) is finished by sending
//! it again: `move_state` says from which step.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::{ChangeMembers, ServerState};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Request, Response, ShardRequest};
use rdkv_storage::failpoint;
use rdkv_storage::raft::NodeAddr;

use super::Reply;
use super::admin;
use super::move_state::{MoveState, Refusal, classify};
use crate::hosting::Hosting;
use crate::lease;
use crate::meta::edit::propose_map_change;
use crate::replica::Replica;
use crate::shards::Shards;

/// How long a new replica may take to catch up with the shard's log (a
/// snapshot of a full region included).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the demoted source is given to learn its demotion before it is
/// removed (it may be down: the move goes on without it).
const DEMOTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Opening or closing a replica on another node.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the leader waits for a quorum's acknowledgement before it
/// changes the membership (several election timeouts).
const ACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a move did not happen (or did not finish).
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("the source and the target are both node {0}")]
    SameNode(u64),
    #[error("node {node} is already a voter of shard {shard}")]
    AlreadyMember { node: u64, shard: ShardId },
    #[error("node {node} is not a voter of shard {shard}")]
    NotMember { node: u64, shard: ShardId },
    #[error("no client address is known for node {0}")]
    UnknownAddress(u64),
    #[error(
        "shard {shard}'s leader was not acknowledged by a quorum within {timeout:?} \
         (nothing was changed)"
    )]
    NotAcknowledged { shard: ShardId, timeout: Duration },
    #[error("node {node} could not open a replica of shard {shard}: {reason}")]
    TargetUnreachable {
        node: u64,
        shard: ShardId,
        reason: String,
    },
    #[error(
        "node {node} did not catch up with shard {shard} within {timeout:?} \
         (the learner was removed again)"
    )]
    CatchUpTimeout {
        node: u64,
        shard: ShardId,
        timeout: Duration,
    },
    #[error("shard {shard}: {step} failed: {reason}")]
    Membership {
        shard: ShardId,
        step: &'static str,
        reason: String,
    },
    #[error(
        "shard {shard} moved, but node {node} did not close its replica: {reason} \
         (it is no member; send the same move again to close it)"
    )]
    SourceKept {
        node: u64,
        shard: ShardId,
        reason: String,
    },
}

impl MoveError {
    fn reply(&self) -> ErrorReply {
        let code = match self {
            MoveError::SameNode(_) | MoveError::AlreadyMember { .. } => ErrorCode::InvalidRequest,
            MoveError::NotMember { .. } => ErrorCode::NotFound,
            // Not `Unavailable`: a client would retry the move elsewhere.
            MoveError::UnknownAddress(_)
            | MoveError::TargetUnreachable { .. }
            | MoveError::Membership { .. }
            | MoveError::SourceKept { .. } => ErrorCode::Internal,
            MoveError::CatchUpTimeout { .. } => ErrorCode::Timeout,
            // Before any step: the move may be sent again, anywhere.
            MoveError::NotAcknowledged { .. } => ErrorCode::Unavailable,
        };
        ErrorReply::new(code, self.to_string())
    }
}

/// One move of `shard`'s replica, on its leader `replica`.
pub struct Move<'a> {
    pub shards: &'a Shards,
    pub hosting: &'a Hosting,
    pub replica: &'a Replica,
    pub shard: ShardId,
}

impl Move<'_> {
    /// Moves the replica from `from` to `to`; answers the new members. When
    /// this node is `from`, it hands its leadership to another voter first
    /// and answers `NotLeader` naming it: the client resends the move there.
    /// A move a leader's death cut short is resumed where it stopped
    /// ([`classify`]); one already done closes the source if it is still
    /// open and answers the members.
    pub async fn run(&self, from: u64, to: u64) -> Reply {
        self.replica.require_leader()?;
        let state = self.state(from, to).map_err(|e| e.reply())?;
        if state == MoveState::Done {
            return self.already_done(from).await;
        }
        if from == self.replica.node_id() {
            return self.lead_elsewhere(from).await;
        }
        self.acknowledged().await?;
        if state == MoveState::Fresh {
            self.add_target(to).await.map_err(|e| e.reply())?;
            failpoint::hit(failpoint::MOVE_AFTER_PROMOTION);
        } else {
            tracing::info!(shard = self.shard.0, from, to, ?state, "resuming a move");
        }
        self.remove_source(from).await.map_err(|e| e.reply())?;
        failpoint::hit(failpoint::MOVE_AFTER_REMOVAL);
        let voters: Vec<u64> = self.voters().into_iter().collect();
        let version = publish_members(self.shards, self.shard, voters).await?;
        tracing::info!(shard = self.shard.0, from, to, version, "moved a replica");
        self.close_source(from).await.map_err(|e| e.reply())?;
        Ok(Response::Members(self.replica.members()))
    }

    /// Opens the target's replica, adds it as a learner, promotes it once
    /// caught up; a learner that did not make it is removed again.
    async fn add_target(&self, to: u64) -> Result<(), MoveError> {
        let added = match self.open_target(to).await {
            Ok(target) => self.add_and_promote(to, target).await,
            Err(e) => Err(e),
        };
        if added.is_err() {
            self.undo_learner(to).await;
        }
        added
    }

    /// The move was done already (by an earlier try whose answer was
    /// lost, or whose close failed): the source is asked again to close
    /// its replica (done already if it hosts none), as the move's last
    /// step would; a source out of reach is reported, as there.
    async fn already_done(&self, from: u64) -> Reply {
        tracing::info!(shard = self.shard.0, from, "the move was done already");
        self.close_source(from).await.map_err(|e| e.reply())?;
        Ok(Response::Members(self.replica.members()))
    }

    /// Waits until a quorum has acknowledged this leader recently (within
    /// half of openraft's leader lease, the maximum election timeout):
    /// openraft refuses membership changes without a valid lease, answering
    /// "forward to no one". A leader just elected has none until its first
    /// entry or heartbeat is acknowledged, and the move of a leader's own
    /// replica is resent to a leader just elected: the one the source
    /// handed its leadership to ([`Move::lead_elsewhere`]). With slow
    /// followers' disks the move came there before any acknowledgement and
    /// failed. Fails `NotLeader` if this node stops leading meanwhile.
    async fn acknowledged(&self) -> Result<(), ErrorReply> {
        let raft = &self.replica.raft;
        let fresh = Duration::from_millis(raft.config().election_timeout_max) / 2;
        let waited = raft
            .wait(Some(ACKNOWLEDGED_TIMEOUT))
            .metrics(
                |m| {
                    m.state != ServerState::Leader
                        || lease::quorum_ack_age(m).is_some_and(|age| age < fresh)
                },
                "acknowledged by a quorum",
            )
            .await;
        self.replica.require_leader()?;
        waited.map(|_| ()).map_err(|_| {
            MoveError::NotAcknowledged {
                shard: self.shard,
                timeout: ACKNOWLEDGED_TIMEOUT,
            }
            .reply()
        })
    }

    /// How far the move got, from the shard's voters and the members this
    /// node's map names; the refusals of a move that cannot be (resumed).
    fn state(&self, from: u64, to: u64) -> Result<MoveState, MoveError> {
        let named: BTreeSet<u64> = self
            .shards
            .map()
            .and_then(|map| {
                map.shard(self.shard)
                    .map(|s| s.members.iter().copied().collect())
            })
            .unwrap_or_default();
        classify(&self.voters(), &named, from, to).map_err(|refusal| match refusal {
            Refusal::SameNode => MoveError::SameNode(from),
            Refusal::AlreadyMember => MoveError::AlreadyMember {
                node: to,
                shard: self.shard,
            },
            Refusal::NotMember => MoveError::NotMember {
                node: from,
                shard: self.shard,
            },
        })
    }

    fn voters(&self) -> BTreeSet<u64> {
        self.replica
            .metrics()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// The source leads: hand the leadership to another voter (the lowest),
    /// and name whichever other voter won the election.
    async fn lead_elsewhere(&self, from: u64) -> Reply {
        let Some(next) = self.voters().into_iter().find(|&id| id != from) else {
            return Err(MoveError::Membership {
                shard: self.shard,
                step: "finding another voter to lead",
                reason: "the source is the only voter".into(),
            }
            .reply());
        };
        let leader = admin::transfer_leadership(self.replica, next, |l| l != from).await?;
        if leader != next {
            tracing::info!(
                shard = self.shard.0,
                next,
                leader,
                "another voter won the transfer"
            );
        }
        Err(self.replica.not_leader(Some(leader), None))
    }

    /// Asks node `to` to open a replica of the shard; its addresses.
    async fn open_target(&self, to: u64) -> Result<NodeAddr, MoveError> {
        let unreachable = |reason: String| MoveError::TargetUnreachable {
            node: to,
            shard: self.shard,
            reason,
        };
        let response = self
            .remote(to, ShardRequest::OpenReplica)
            .await
            .map_err(|e| match e {
                Remote::Unknown => MoveError::UnknownAddress(to),
                Remote::Failed(reason) => unreachable(reason),
            })?;
        match response {
            Response::Members(members) => members
                .into_iter()
                .find(|m| m.id == to)
                .map(|m| NodeAddr {
                    peer_addr: m.peer_addr,
                    client_addr: m.client_addr,
                })
                .ok_or_else(|| unreachable("it answered as another node".to_owned())),
            other => Err(unreachable(format!("unexpected answer {other:?}"))),
        }
    }

    /// Adds `to` as a learner, waits until it caught up, promotes it.
    async fn add_and_promote(&self, to: u64, target: NodeAddr) -> Result<(), MoveError> {
        let raft = &self.replica.raft;
        raft.add_learner(to, target, false)
            .await
            .map_err(|e| self.membership("adding the learner", e))?;
        let commit = self
            .replica
            .metrics()
            .cluster_committed
            .map_or(0, |l| l.index);
        self.replicated(to, commit, CATCH_UP_TIMEOUT)
            .await
            .then_some(())
            .ok_or(MoveError::CatchUpTimeout {
                node: to,
                shard: self.shard,
                timeout: CATCH_UP_TIMEOUT,
            })?;
        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([to])), false)
            .await
            .map_err(|e| self.membership("promoting the learner", e))?;
        Ok(())
    }

    /// A learner that did not become a voter is removed again, and its
    /// node asked to close the replica it may have opened (both best
    /// effort: the error that stopped the move is the one reported).
    async fn undo_learner(&self, to: u64) {
        let raft = &self.replica.raft;
        let metrics = self.replica.metrics();
        let membership = metrics.membership_config.membership();
        let learner = membership.learner_ids().any(|id| id == to);
        if learner {
            let change = ChangeMembers::RemoveNodes(BTreeSet::from([to]));
            if let Err(e) = raft.change_membership(change, false).await {
                tracing::warn!(shard = self.shard.0, to, "removing the learner again: {e}");
            }
        }
        if let Err(Remote::Failed(e)) = self.remote(to, ShardRequest::CloseReplica).await {
            tracing::warn!(
                shard = self.shard.0,
                to,
                "closing the target's replica: {e}"
            );
        }
    }

    /// Demotes `from` to a learner, gives it a moment to learn that, then
    /// removes it. Resumable: a source already demoted is only removed, one
    /// already removed is left alone.
    async fn remove_source(&self, from: u64) -> Result<(), MoveError> {
        let raft = &self.replica.raft;
        if self.voters().contains(&from) {
            let demoted = raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([from])), true)
                .await
                .map_err(|e| self.membership("demoting the source", e))?;
            let index = demoted.log_id.index;
            if !self.replicated(from, index, DEMOTION_TIMEOUT).await {
                tracing::warn!(
                    shard = self.shard.0,
                    from,
                    "the source did not learn its demotion"
                );
            }
        }
        let metrics = self.replica.metrics();
        let learner = metrics
            .membership_config
            .membership()
            .learner_ids()
            .any(|id| id == from);
        if learner {
            raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([from])), false)
                .await
                .map_err(|e| self.membership("removing the source", e))?;
        }
        Ok(())
    }

    async fn close_source(&self, from: u64) -> Result<(), MoveError> {
        match self.remote(from, ShardRequest::CloseReplica).await {
            // `WrongShard`: it hosts no replica of the shard (closed by an
            // earlier try of the move).
            Ok(Response::Done | Response::WrongShard(_)) => Ok(()),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(Remote::Unknown) => Err("no client address is known for it".to_owned()),
            Err(Remote::Failed(reason)) => Err(reason),
        }
        .map_err(|reason| MoveError::SourceKept {
            node: from,
            shard: self.shard,
            reason,
        })
    }

    /// Whether `node`'s log matched this leader's up to `index` within
    /// `timeout` (the leader's replication metrics).
    async fn replicated(&self, node: u64, index: u64, timeout: Duration) -> bool {
        self.replica
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&node).cloned().flatten())
                        .is_some_and(|matched| matched.index >= index)
                },
                "replicated to the node",
            )
            .await
            .is_ok()
    }

    fn membership(&self, step: &'static str, e: impl std::fmt::Display) -> MoveError {
        MoveError::Membership {
            shard: self.shard,
            step,
            reason: e.to_string(),
        }
    }

    /// Sends `request` of this shard to node `node` directly.
    async fn remote(&self, node: u64, request: ShardRequest) -> Result<Response, Remote> {
        let addr = self.shards.client_addr_of(node).ok_or(Remote::Unknown)?;
        let options = rdkv_client::ClientOptions {
            request_timeout: REMOTE_TIMEOUT,
            ..self.hosting.client_options()
        };
        let client = rdkv_client::Client::new(&[addr.as_str()], options)
            .map_err(|e| Remote::Failed(e.to_string()))?;
        let request = Request::Sharded {
            shard: self.shard,
            request,
        };
        client
            .send_to(&addr, request)
            .await
            .map_err(|e| Remote::Failed(e.to_string()))
    }
}

/// Why a request to another node got no answer.
enum Remote {
    Unknown,
    Failed(String),
}

/// Publishes `shard`'s new `members` after a move; returns the map version
/// naming them.
///
/// The one place a move changes the shard map: a new version through the
/// metadata group (`meta::edit::propose_map_change`), which every node
/// applies and serves. A leader hint outside the new members is dropped.
/// Clients holding the old map still reach the shard meanwhile: the
/// removed node answers `WrongShard` with the new version, and a client
/// without it tries the shard's other members, whose `NotLeader`
/// redirects name its leader.
pub async fn publish_members(
    shards: &Shards,
    shard: ShardId,
    members: Vec<u64>,
) -> Result<u64, ErrorReply> {
    let meta = shards.meta().ok_or_else(single_group)?;
    propose_map_change(meta, |edit| {
        if let Some(info) = edit.shard_mut(shard) {
            info.leader = info.leader.filter(|l| members.contains(l));
            info.members.clone_from(&members);
        }
    })
    .await
    .map_err(|e| {
        // Internal, not Unavailable: the move itself is done; a client must
        // not send it again.
        ErrorReply::new(
            ErrorCode::Internal,
            format!("moved, but publishing shard {shard}'s members failed: {e}"),
        )
    })
}

/// Opens `shard`'s replica here for a move (`ShardRequest::OpenReplica`):
/// answers this node's addresses.
pub async fn open_replica(hosting: Option<&Hosting>, shard: ShardId) -> Reply {
    let hosting = hosting.ok_or_else(single_group)?;
    hosting
        .open(shard)
        .await
        .map_err(|e| ErrorReply::new(ErrorCode::Unavailable, e.to_string()))?;
    Ok(Response::Members(vec![hosting.own_member()]))
}

/// Closes `shard`'s replica here after a move (`ShardRequest::CloseReplica`).
pub async fn close_replica(hosting: Option<&Hosting>, shard: ShardId) -> Reply {
    let hosting = hosting.ok_or_else(single_group)?;
    hosting
        .close(shard)
        .await
        .map_err(|e| ErrorReply::new(ErrorCode::InvalidRequest, e.to_string()))?;
    Ok(Response::Done)
}

pub(super) fn single_group() -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        "a single group's node does not move replicas (its membership: `member add/remove`)",
    )
}
