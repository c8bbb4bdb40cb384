//! The lease rules, in one place: when this node counts as acknowledged by
//! a quorum, the lease it publishes in the region header for one-sided
//! readers, how a leader confirms a read, how fresh a follower must be to
//! serve one, and the pause of the lease around a leadership transfer.

use std::time::Duration;

use openraft::metrics::{RaftDataMetrics, RaftServerMetrics};
use openraft::type_config::alias::{LogIdOf, SerdeInstantOf, StoredMembershipOf, VoteOf};
use openraft::{RaftMetrics, ReadPolicy, ServerState};
use rdkv_fabric::clock;
use rdkv_proto::region::LeaseDeadline;
use rdkv_proto::wire::{Consistency, ErrorCode, ErrorReply};
use rdkv_storage::raft::TypeConfig;
use rdkv_storage::state_machine::RegionStateMachine;
use tokio::sync::watch;

use crate::Raft;
use crate::raft_watch::RaftWatch;
use crate::replica::Replica;

/// What the lease rules read of Raft's state. It is taken either from the
/// whole metrics or from their server and data parts: openraft sends the
/// whole metrics on every loop of RaftCore (every heartbeat a follower
/// answers included), the two parts only when they change, so a task that
/// waits for a change waits on the parts ([`RaftWatch`]).
///
/// Read from the parts ([`RaftWatch::read`]), a view may pair a newer role
/// and term with older data. That errs only towards no lease: an applied
/// entry of the term this node leads now is of this same leadership, whose
/// acknowledgement time only grows.
#[derive(Debug, Clone, Copy)]
pub struct Leadership {
    leads: bool,
    /// The term of this node's flushed vote.
    term: u64,
    sole_voter: bool,
    /// How long before this view was taken a quorum last acknowledged
    /// this node (`None`: not yet, or not a leader).
    quorum_acked_ago: Option<Duration>,
    /// The term of the last applied entry's leader.
    applied_term: Option<u64>,
}

impl Leadership {
    pub fn of(metrics: &RaftMetrics<TypeConfig>) -> Self {
        Self::from_facts(
            metrics.state,
            &metrics.vote,
            &metrics.membership_config,
            metrics.last_quorum_acked.as_ref(),
            metrics.last_applied.as_ref(),
        )
    }

    pub fn of_parts(
        server: &RaftServerMetrics<TypeConfig>,
        data: &RaftDataMetrics<TypeConfig>,
    ) -> Self {
        Self::from_facts(
            server.state,
            &server.vote,
            &server.membership_config,
            data.last_quorum_acked.as_ref(),
            data.last_applied.as_ref(),
        )
    }

    fn from_facts(
        state: ServerState,
        vote: &VoteOf<TypeConfig>,
        membership: &StoredMembershipOf<TypeConfig>,
        last_quorum_acked: Option<&SerdeInstantOf<TypeConfig>>,
        last_applied: Option<&LogIdOf<TypeConfig>>,
    ) -> Self {
        Self {
            leads: state == ServerState::Leader,
            term: vote.leader_id.term,
            sole_voter: membership.membership().voter_ids().count() == 1,
            quorum_acked_ago: last_quorum_acked.map(|at| openraft::Instant::elapsed(&**at)),
            applied_term: last_applied.map(|l| l.leader_id.term),
        }
    }

    /// How long ago a quorum last acknowledged this node as leader (`None`:
    /// it does not lead, or has not been acknowledged yet, just elected).
    ///
    /// A sole voter is its own quorum, always current: no other node can be
    /// elected unless this leader first appends a configuration with more
    /// voters, and from that moment the quorum rule applies. (openraft
    /// refreshes a sole voter's acknowledgement only on writes, so an idle
    /// single node would otherwise look cut off.) The lease, `/health` and
    /// follower reads all judge leadership by this one answer.
    pub fn quorum_ack_age(&self) -> Option<Duration> {
        if !self.leads {
            return None;
        }
        if self.sole_voter {
            return Some(Duration::ZERO);
        }
        self.quorum_acked_ago
    }

    /// Whether this node has applied an entry of its current term: a
    /// leader then holds everything its predecessors committed.
    fn applied_own_term(&self) -> bool {
        self.applied_term == Some(self.term)
    }

    /// Whether this node leads and has applied an entry of its own term.
    pub fn leads_with_own_entry(&self) -> bool {
        self.leads && self.applied_own_term()
    }

    /// The deadline of the leader's lease, if this node leads: the last
    /// instant a quorum acknowledged it, plus the minimum election timeout
    /// (no follower votes for another candidate before that has passed), on
    /// both clocks.
    fn lease_deadline(&self, election_timeout_min_ms: u64) -> Option<LeaseDeadline> {
        // A new leader's region may still lack entries its predecessor
        // committed: it serves one-sided reads only once it has applied an
        // entry of its own term (its first blank entry), as openraft's own
        // lease reads wait for it too.
        if !self.applied_own_term() {
            return None;
        }
        let age_us = u64::try_from(self.quorum_ack_age()?.as_micros()).unwrap_or(u64::MAX);
        let lease_us = election_timeout_min_ms * 1000;
        let deadline_us = |now_us: u64| now_us.saturating_sub(age_us) + lease_us;
        Some(LeaseDeadline {
            unix_us: deadline_us(clock::unix_now_us()),
            boottime_us: deadline_us(clock::boottime_now_us()),
        })
    }
}

/// [`Leadership::quorum_ack_age`] of the whole metrics.
pub fn quorum_ack_age(metrics: &RaftMetrics<TypeConfig>) -> Option<Duration> {
    Leadership::of(metrics).quorum_ack_age()
}

/// [`Leadership::leads_with_own_entry`] of the whole metrics.
pub fn leads_with_own_entry(metrics: &RaftMetrics<TypeConfig>) -> bool {
    Leadership::of(metrics).leads_with_own_entry()
}

/// Keeps the region header's term and lease words current: renewed on every
/// quorum acknowledgement (and every heartbeat interval), cleared at once
/// when this node stops leading, and when its Raft stops (openraft shows a
/// stopped Raft in its whole metrics only: the parts' watches just close).
/// Counts each writing in `published`.
pub async fn publish_leadership(
    raft: Raft,
    sm: RegionStateMachine,
    heartbeat_ms: u64,
    published: metrics::Counter,
    mut shutdown: watch::Receiver<bool>,
) {
    let election_timeout_min_ms = raft.config().election_timeout_min;
    let mut raft_watch = RaftWatch::new(&raft);
    let mut tick = tokio::time::interval(Duration::from_millis(heartbeat_ms.max(1)));
    // A stalled task renews once, not once per tick it missed.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let publish = |term: u64, deadline: Option<LeaseDeadline>| {
        if let Err(e) = sm.publish_leadership(term, deadline) {
            tracing::error!("publishing leadership in the region header: {e}");
        }
        published.increment(1);
    };
    loop {
        // Read under the watches' guards, not cloned: on a leader this runs
        // on every quorum acknowledgement, and a clone copies the
        // replication and membership maps.
        let now = raft_watch.read(Leadership::of_parts);
        publish(now.term, now.lease_deadline(election_timeout_min_ms));
        let raft_stopped = tokio::select! {
            running = raft_watch.changed() => !running,
            _ = tick.tick() => false,
            _ = shutdown.changed() => return,
        };
        if raft_stopped {
            publish(now.term, None);
            return;
        }
    }
}

/// How far before its lease runs out a leader stops serving lease reads
/// from its region: the margin for the read that follows the check.
const LOCAL_LEASE_MARGIN_US: u64 = 10_000;

/// Whether this node may serve a lease read from its own region now, with
/// no round to RaftCore or the followers: the lease it publishes in its
/// region header for one-sided readers ([`publish_leadership`]: it leads,
/// has applied an entry of its term, a quorum acknowledged it within the
/// lease, no transfer suspended it) runs at least [`LOCAL_LEASE_MARGIN_US`]
/// beyond now on this host's boottime clock. Every write this node
/// acknowledged is applied here before its reply, and no other node can be
/// elected before the deadline, so the region holds every acknowledged
/// write.
pub fn serves_lease_reads(replica: &Replica) -> bool {
    replica
        .sm
        .published_lease_boottime_us()
        .is_some_and(|deadline_us| {
            clock::boottime_now_us().saturating_add(LOCAL_LEASE_MARGIN_US) < deadline_us
        })
}

/// How a leader confirms it may serve a read at `consistency` (follower
/// reads are judged by [`follower_contact`] instead): a lease read, unless
/// a leadership transfer suspended the lease, else a ReadIndex round.
pub fn leader_read_policy(consistency: Consistency, sm: &RegionStateMachine) -> ReadPolicy {
    match consistency {
        Consistency::Lease if !sm.lease_suppressed() => ReadPolicy::LeaseRead,
        _ => ReadPolicy::ReadIndex,
    }
}

/// A follower read is judged against this node's view of the commit index;
/// that view is only as fresh as its last contact with the leader (a
/// follower) or with a quorum (a leader). A node cut off for longer than the
/// minimum election timeout stops answering instead of serving an unbounded
/// staleness.
pub fn follower_contact(
    replica: &Replica,
    metrics: &RaftMetrics<TypeConfig>,
) -> Result<(), ErrorReply> {
    let freshness = Duration::from_millis(replica.raft.config().election_timeout_min);
    let leads = metrics.state == ServerState::Leader;
    let contact = if leads {
        quorum_ack_age(metrics)
    } else {
        replica.peers.since_leader_contact()
    };
    if contact.is_some_and(|age| age <= freshness) {
        return Ok(());
    }
    Err(ErrorReply::new(
        ErrorCode::StaleFollower,
        format!(
            "no contact with the {} for {}; follower reads need it within {freshness:?}",
            if leads { "quorum" } else { "leader" },
            contact.map_or("ever".to_owned(), |age| format!("{age:?}")),
        ),
    ))
}

/// Before a leadership transfer: openraft lets the target win its election
/// while followers' leases still run, and this node keeps believing it leads
/// until it hears of the new term, so no lease reads from here (by RPC or
/// one-sided) until an election timeout after the transfer could have
/// completed.
pub fn suspend_for_transfer(replica: &Replica) -> Result<(), ErrorReply> {
    let hold_ms = replica.raft.config().election_timeout_max * 2;
    let until_us = clock::unix_now_us() + hold_ms * 1000;
    replica
        .sm
        .suppress_lease_until(until_us)
        .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))
}
