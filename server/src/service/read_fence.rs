//! The read fence (on unless `--read-fence=false`): a leader confirms a
//! round of linearizable reads by asking the voters for their persisted
//! votes instead of sending a Raft heartbeat. A follower answers from its
//! log's vote cell on the connection task that reads the request
//! (`peer::service`), without waking its RaftCore.
//!
//! Why it is enough: a round counts when this node and enough voters for a
//! quorum hold this leader's vote, each answer given after the round began
//! (so after every read in it arrived). Votes only grow and are durable
//! before they are answered, so no quorum can have voted for a later leader
//! before the round began: no write was committed by one. Every write
//! acknowledged before then was applied here before it was acknowledged
//! (`write`, `proposals`: rdkv answers a write once the leader applied it),
//! and this node applied an entry of its own term, so it holds everything
//! its predecessors committed. Reading the region after the round is then
//! linearizable, as after a ReadIndex round. An "answer on commit" mode for
//! writes would break this: the fence would then have to wait for the
//! commit index to be applied, as ReadIndex does.
//!
//! Any other outcome (not eligible, too few answers within a heartbeat
//! interval, a newer vote seen) falls back to a ReadIndex round, which also
//! lets openraft find out that this node was deposed.
//!
//! A round asks only as many voters as its quorum still needs, the ones
//! that agreed in the last round first, in the order they answered
//! ([`Gather`]): of three voters, one follower answers each round and the
//! other is left alone. Another is asked when an answer fails or
//! disagrees, and every one once the round is late: after four times the
//! usual quorum time (at least 1 ms, the first round's wait), or a tenth of
//! the round's time (at least 2 ms, at most half) if that is sooner.
//! Which voters are asked changes nothing above: any quorum of answers
//! given after the round began will do.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::type_config::alias::{LeaderIdOf, LogIdOf, WatchReceiverOf};
use openraft::{RaftMetrics, ServerState};
use rdkv_storage::raft::{NodeAddr, TypeConfig, Vote};
use rdkv_storage::raft_log::PersistedVote;
use tokio::time::Instant;

use crate::Raft;
use crate::peer::{Answered, FenceClients};

type LeaderId = LeaderIdOf<TypeConfig>;

/// What a round needs of Raft's state, taken when it starts.
#[derive(Debug, Clone)]
pub(crate) struct FenceView {
    /// This node's persisted, committed vote as leader.
    own_vote: Vote,
    membership_log_id: Option<LogIdOf<TypeConfig>>,
    voters: BTreeSet<u64>,
    /// The voters other than this node, with their addresses.
    others: Vec<(u64, NodeAddr)>,
}

/// Why a round cannot be fenced (it runs a ReadIndex round instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ineligible {
    NotLeader,
    /// A joint configuration: a quorum of each half would be needed.
    Joint,
    /// The configuration in use is not committed yet.
    Uncommitted,
    NotVoter,
    /// This node's persisted vote is not its own committed one (yet).
    NoOwnVote,
    /// This node has not applied an entry of its own term yet.
    NoOwnEntry,
}

/// The view of a round at leader `me`, whose persisted vote is `own`; each
/// rule is a case where a quorum of votes would not be enough.
pub(crate) fn fence_view(
    metrics: &RaftMetrics<TypeConfig>,
    own: Option<Vote>,
    me: u64,
) -> Result<FenceView, Ineligible> {
    if metrics.state != ServerState::Leader || metrics.running_state.is_err() {
        return Err(Ineligible::NotLeader);
    }
    let membership = metrics.membership_config.membership();
    if membership.get_joint_config().len() != 1 {
        return Err(Ineligible::Joint);
    }
    if metrics.membership_config.log_id() != metrics.committed_membership_config.log_id() {
        return Err(Ineligible::Uncommitted);
    }
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    if !voters.contains(&me) {
        return Err(Ineligible::NotVoter);
    }
    let own_vote = own
        .filter(|vote| vote.committed && vote.leader_id.node_id == me)
        .ok_or(Ineligible::NoOwnVote)?;
    let applied_leader = metrics.last_applied.as_ref().map(|log_id| log_id.leader_id);
    if applied_leader != Some(own_vote.leader_id) {
        return Err(Ineligible::NoOwnEntry);
    }
    let others = voters
        .iter()
        .filter(|&&id| id != me)
        .filter_map(|&id| membership.get_node(&id).map(|node| (id, node.clone())))
        .collect();
    Ok(FenceView {
        own_vote,
        membership_log_id: *metrics.membership_config.log_id(),
        voters,
        others,
    })
}

/// Where a round's answers stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pending,
    /// This node and enough voters for a quorum hold this leader's vote.
    Quorum,
    /// A voter holds a later leader's vote: this node may be deposed.
    Higher,
    /// Too many voters answered otherwise (or failed) for a quorum.
    Impossible,
}

/// The answers of one round.
#[derive(Debug)]
pub(crate) struct Tally {
    /// The round counted: an answer to an older round's call was asked
    /// before this round's reads arrived, and must not count.
    round: u64,
    leader: LeaderId,
    others: BTreeSet<u64>,
    need: usize,
    agreed: BTreeSet<u64>,
    failed: BTreeSet<u64>,
}

impl Tally {
    pub(crate) fn new(round: u64, view: &FenceView) -> Tally {
        Tally {
            round,
            leader: view.own_vote.leader_id,
            others: view.others.iter().map(|(id, _)| *id).collect(),
            need: view.voters.len() / 2 + 1,
            agreed: BTreeSet::new(),
            failed: BTreeSet::new(),
        }
    }

    /// How many more other voters must agree for a quorum.
    fn still_needed(&self) -> usize {
        self.need.saturating_sub(1 + self.agreed.len())
    }

    /// How many other voters answered this round, agreeing or not.
    fn answered(&self) -> usize {
        self.agreed.len() + self.failed.len()
    }

    /// Where the round stands with the answers counted so far and this
    /// node's own vote.
    pub(crate) fn verdict(&self) -> Verdict {
        // This node counts: its vote is the leader's (`fence_view`).
        if 1 + self.agreed.len() >= self.need {
            return Verdict::Quorum;
        }
        if 1 + self.others.len() - self.failed.len() < self.need {
            return Verdict::Impossible;
        }
        Verdict::Pending
    }

    /// Counts `from`'s answer to `round`'s call: its persisted vote, `None`
    /// when it has none or the call failed. Only this leader's own vote
    /// agrees, and only in an answer to this round; an older vote does not,
    /// and a later one (a later term's, or a same-term candidate's with a
    /// higher id) ends the round.
    pub(crate) fn count(&mut self, round: u64, from: u64, vote: Option<&Vote>) -> Verdict {
        if round != self.round || !self.others.contains(&from) {
            return self.verdict();
        }
        match vote {
            Some(vote) if vote.leader_id == self.leader => {
                self.agreed.insert(from);
            }
            Some(vote) if vote.leader_id > self.leader => return Verdict::Higher,
            _ => {
                self.failed.insert(from);
            }
        }
        self.verdict()
    }
}

/// `rdkv_read_fence_total{shard, outcome}`, registered once.
#[derive(Debug, Clone)]
pub struct FenceOutcomes {
    confirmed: metrics::Counter,
    higher_vote: metrics::Counter,
    no_quorum: metrics::Counter,
    ineligible: metrics::Counter,
    changed: metrics::Counter,
}

impl FenceOutcomes {
    pub fn new(shard: &str) -> Self {
        let outcome = |name: &'static str| {
            let counter = metrics::counter!(
                "rdkv_read_fence_total",
                "shard" => shard.to_owned(),
                "outcome" => name
            );
            // The series exist from the start, zero until counted.
            counter.increment(0);
            counter
        };
        FenceOutcomes {
            confirmed: outcome("confirmed"),
            higher_vote: outcome("higher_vote"),
            no_quorum: outcome("no_quorum"),
            ineligible: outcome("ineligible"),
            changed: outcome("changed"),
        }
    }
}

/// The calls a round makes to the other voters: [`FenceClients`] on a
/// node, a script in the tests.
pub(crate) trait FenceCalls {
    /// Asks `target` (at `node`) for its persisted vote, for `round`;
    /// `false` when a call to it is still in flight (an older round's).
    fn ask(
        &mut self,
        round: u64,
        target: u64,
        node: &NodeAddr,
    ) -> impl Future<Output = bool> + Send;
    /// The next call to finish; `None` when none is in flight.
    /// Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Option<Answered>> + Send;
    /// Forgets the connections of nodes that are no longer voters.
    fn retain(&mut self, voters: &BTreeSet<u64>);
}

impl FenceCalls for FenceClients {
    fn ask(
        &mut self,
        round: u64,
        target: u64,
        node: &NodeAddr,
    ) -> impl Future<Output = bool> + Send {
        FenceClients::ask(self, round, target, node)
    }

    fn next(&mut self) -> impl Future<Output = Option<Answered>> + Send {
        FenceClients::next(self)
    }

    fn retain(&mut self, voters: &BTreeSet<u64>) {
        FenceClients::retain(self, voters);
    }
}

/// A round asks every other voter, at the latest, once this share of its
/// time has passed without a verdict (a tenth: 10 ms at the default 100 ms
/// heartbeat) ...
const ASK_ALL_AFTER_FRACTION: u32 = 10;
/// ... but not before this, so that short heartbeats still ask few.
const ASK_ALL_AFTER_FLOOR: Duration = Duration::from_millis(2);
/// Sooner than that when the rounds before it were quick (a hedged
/// request, as in "The Tail at Scale"): a voter asked first that is slow,
/// though within a tenth of the round, costs one round this long, not
/// every round. This many times the usual time a quorum took ...
const HEDGE_FACTOR: u32 = 4;
/// ... but not before this: tokio's timers tick in milliseconds (a round
/// takes 50-150 µs on loopback here).
const HEDGE_FLOOR: Duration = Duration::from_millis(1);
/// The usual quorum time moves by this fraction of the difference to each
/// new round's (an exponentially weighted mean over about eight rounds).
const USUAL_QUORUM_WEIGHT: u32 = 8;

/// When a round of `round_timeout` asks every other voter: a tenth of it
/// (at least the floor, at most half), or `HEDGE_FACTOR` times the usual
/// quorum time (at least the hedge floor) if that is sooner.
fn ask_everyone_after(round_timeout: Duration, usual_quorum: Option<Duration>) -> Duration {
    let by_timeout = (round_timeout / ASK_ALL_AFTER_FRACTION)
        .max(ASK_ALL_AFTER_FLOOR)
        .min(round_timeout / 2);
    let hedge = usual_quorum.map_or(HEDGE_FLOOR, |usual| usual.saturating_mul(HEDGE_FACTOR));
    hedge.max(HEDGE_FLOOR).min(by_timeout)
}

/// `usual` moved towards the time this round's quorum took. A late round
/// counts in full, wait included: when rounds are late often, the usual
/// time rises until four times it covers the voter asked first.
fn next_usual_quorum(usual: Option<Duration>, took: Duration) -> Duration {
    match usual {
        None => took,
        Some(usual) => usual - usual / USUAL_QUORUM_WEIGHT + took / USUAL_QUORUM_WEIGHT,
    }
}

/// How a leader's rounds gather their answers.
#[derive(Debug)]
pub(crate) struct Gather<C> {
    clients: C,
    /// How long a round waits for a quorum: one heartbeat interval.
    round_timeout: Duration,
    /// The order the other voters are asked in, carried from round to
    /// round: the ones that agreed last, in the order they answered,
    /// first; then the ones not asked (passed over as busy, or not needed);
    /// last, the ones that disagreed, failed or had not answered when it
    /// ended.
    order: Vec<u64>,
    /// How long the recent rounds took to a quorum (weighted mean).
    usual_quorum: Option<Duration>,
}

/// What one round asked and heard.
struct Asking {
    /// The voters of this round, in the order to ask them.
    order: Vec<u64>,
    asked: BTreeSet<u64>,
    /// Of `asked`, the ones that agreed, in the order they answered (the
    /// tally counts them too, unordered).
    agreed: Vec<u64>,
    /// Every other voter is to be asked now.
    ask_everyone: bool,
    ask_everyone_at: Instant,
    deadline: Instant,
}

impl Asking {
    /// The voters of `view` in `carried` order, the ones it lacks after.
    fn new(view: &FenceView, carried: &[u64], ask_everyone_at: Instant, deadline: Instant) -> Self {
        let in_view = |id: &u64| view.others.iter().any(|(other, _)| other == id);
        let mut order: Vec<u64> = carried.iter().copied().filter(in_view).collect();
        for (id, _) in &view.others {
            if !order.contains(id) {
                order.push(*id);
            }
        }
        Asking {
            order,
            asked: BTreeSet::new(),
            agreed: Vec::new(),
            ask_everyone: false,
            ask_everyone_at,
            deadline,
        }
    }

    /// How many more voters to ask now: enough that, if every call out
    /// agrees, the quorum is reached (all of them once `ask_everyone`).
    fn wanted(&self, tally: &Tally) -> usize {
        if self.ask_everyone {
            return usize::MAX;
        }
        let out = self.asked.len().saturating_sub(tally.answered());
        tally.still_needed().saturating_sub(out)
    }

    /// The order for the next round (see `Gather::order`).
    fn next_order(&self) -> Vec<u64> {
        let asked_not_agreed = |id: &u64| self.asked.contains(id) && !self.agreed.contains(id);
        let not_asked = self.order.iter().filter(|id| !self.asked.contains(id));
        let last = self.order.iter().filter(|id| asked_not_agreed(id));
        self.agreed
            .iter()
            .chain(not_asked)
            .chain(last)
            .copied()
            .collect()
    }
}

impl<C: FenceCalls> Gather<C> {
    pub(crate) fn new(clients: C, round_timeout: Duration) -> Self {
        Gather {
            clients,
            round_timeout,
            order: Vec::new(),
            usual_quorum: None,
        }
    }

    /// Asks as few other voters as a quorum needs and counts the answers
    /// of round `round` until a verdict or the round's deadline (`Pending`
    /// then). Another voter is asked when an answer fails or disagrees,
    /// and every other one after [`ask_everyone_after`].
    pub(crate) async fn gather(&mut self, round: u64, view: &FenceView) -> Verdict {
        let mut tally = Tally::new(round, view);
        let before_asking = tally.verdict();
        if before_asking != Verdict::Pending {
            return before_asking;
        }
        self.clients.retain(&view.voters);
        let started = Instant::now();
        let ask_everyone_at = started + ask_everyone_after(self.round_timeout, self.usual_quorum);
        let deadline = started + self.round_timeout;
        let mut asking = Asking::new(view, &self.order, ask_everyone_at, deadline);
        let verdict = self.run_round(round, view, &mut asking, &mut tally).await;
        self.order = asking.next_order();
        if verdict == Verdict::Quorum {
            self.usual_quorum = Some(next_usual_quorum(self.usual_quorum, started.elapsed()));
        }
        verdict
    }

    async fn run_round(
        &mut self,
        round: u64,
        view: &FenceView,
        asking: &mut Asking,
        tally: &mut Tally,
    ) -> Verdict {
        self.ask_more(round, view, asking, tally).await;
        loop {
            let Some(Answered {
                from,
                round: of,
                vote,
            }) = self.next_answer(round, view, asking, tally).await
            else {
                return Verdict::Pending;
            };
            // An older round's late answer does not count (the tally
            // ignores it), but its voter is free to be asked again.
            let verdict = tally.count(of, from, vote.ok().flatten().as_ref());
            if of == round && tally.agreed.contains(&from) {
                asking.agreed.push(from);
            }
            match verdict {
                Verdict::Pending => self.ask_more(round, view, asking, tally).await,
                verdict => return verdict,
            }
        }
    }

    /// The next answer, asking every other voter at `ask_everyone_at`;
    /// `None` at the deadline, or when no call is out even after asking
    /// everyone.
    async fn next_answer(
        &mut self,
        round: u64,
        view: &FenceView,
        asking: &mut Asking,
        tally: &Tally,
    ) -> Option<Answered> {
        loop {
            tokio::select! {
                // An answer ready at the same time as the timer wins.
                biased;
                next = tokio::time::timeout_at(asking.deadline, self.clients.next()) => {
                    match next {
                        Ok(Some(answered)) => return Some(answered),
                        // No call out. Not reached while `FenceCalls::ask`
                        // refuses only a voter with a call out (a Pending
                        // round then has one out or one to ask); a guard,
                        // so that a refusal for another reason asks whoever
                        // is left rather than giving the round up early.
                        Ok(None) if !asking.ask_everyone => {
                            self.ask_everyone(round, view, asking, tally).await;
                        }
                        _ => return None,
                    }
                }
                () = tokio::time::sleep_until(asking.ask_everyone_at), if !asking.ask_everyone => {
                    self.ask_everyone(round, view, asking, tally).await;
                }
            }
        }
    }

    async fn ask_everyone(
        &mut self,
        round: u64,
        view: &FenceView,
        asking: &mut Asking,
        tally: &Tally,
    ) {
        asking.ask_everyone = true;
        self.ask_more(round, view, asking, tally).await;
    }

    /// Asks the next voters in `asking`'s order, as many as it wants now.
    /// A voter whose older call is still out is passed over: asked once
    /// that call's answer is back if the round still wants a voter then,
    /// else when the round asks everyone.
    async fn ask_more(&mut self, round: u64, view: &FenceView, asking: &mut Asking, tally: &Tally) {
        let mut wanted = asking.wanted(tally);
        for &id in &asking.order {
            if wanted == 0 {
                break;
            }
            if asking.asked.contains(&id) {
                continue;
            }
            // `order` holds the view's voters only (`Asking::new`).
            let Some((_, node)) = view.others.iter().find(|(other, _)| *other == id) else {
                continue;
            };
            if self.clients.ask(round, id, node).await {
                asking.asked.insert(id);
                wanted -= 1;
            }
        }
    }
}

/// A leader's read fence: its connections to the voters and its rounds.
pub struct ReadFence {
    gather: Gather<FenceClients>,
    own_vote: PersistedVote,
    metrics: WatchReceiverOf<TypeConfig, RaftMetrics<TypeConfig>>,
    node_id: u64,
    outcomes: FenceOutcomes,
    round: u64,
}

impl std::fmt::Debug for ReadFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadFence")
            .field("node_id", &self.node_id)
            .field("round", &self.round)
            .field("gather", &self.gather)
            .finish_non_exhaustive()
    }
}

impl ReadFence {
    pub fn new(
        clients: FenceClients,
        own_vote: PersistedVote,
        raft: &Raft,
        node_id: u64,
        round_timeout: Duration,
        outcomes: FenceOutcomes,
    ) -> Self {
        ReadFence {
            gather: Gather::new(clients, round_timeout),
            own_vote,
            metrics: raft.metrics(),
            node_id,
            outcomes,
            round: 0,
        }
    }

    /// Runs one round; `true`: the reads that arrived before this call may
    /// be answered from this node's applied region. `false`: run a ReadIndex
    /// round instead.
    pub async fn confirm(&mut self) -> bool {
        self.round += 1;
        let view = {
            let metrics = self.metrics.borrow_watched();
            fence_view(&metrics, self.own_vote.get(), self.node_id)
        };
        let view = match view {
            Ok(view) => view,
            // A follower's linearizable reads come here too: not a
            // leader's round, not counted.
            Err(Ineligible::NotLeader) => return false,
            Err(_) => {
                self.outcomes.ineligible.increment(1);
                return false;
            }
        };
        match self.gather.gather(self.round, &view).await {
            Verdict::Quorum if self.unchanged(&view) => {
                self.outcomes.confirmed.increment(1);
                true
            }
            Verdict::Quorum => {
                self.outcomes.changed.increment(1);
                false
            }
            Verdict::Higher => {
                self.outcomes.higher_vote.increment(1);
                false
            }
            Verdict::Pending | Verdict::Impossible => {
                self.outcomes.no_quorum.increment(1);
                false
            }
        }
    }

    /// Whether this node still leads with the same persisted vote and
    /// configuration as when the round began. Belt and braces: the quorum
    /// already rules out a later leader before the round began.
    fn unchanged(&self, view: &FenceView) -> bool {
        let metrics = self.metrics.borrow_watched();
        self.own_vote.get() == Some(view.own_vote)
            && metrics.state == ServerState::Leader
            && *metrics.membership_config.log_id() == view.membership_log_id
    }

    /// Whether late answers of earlier rounds are still to come.
    pub fn is_busy(&self) -> bool {
        self.gather.clients.is_busy()
    }

    /// Takes back one late answer (its connection goes back to idle).
    pub async fn take_back_late(&mut self) {
        self.gather.clients.next().await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use openraft::errors::Unreachable;
    use openraft::type_config::alias::StoredMembershipOf;
    use openraft::{LogId, Membership, StoredMembership};
    use rdkv_storage::raft::rpc::RpcError;

    use super::*;

    const TERM: u64 = 7;
    const ROUND: u64 = 12;

    fn vote(term: u64, node: u64, committed: bool) -> Vote {
        match committed {
            true => Vote::new_committed(term, node),
            false => Vote::new(term, node),
        }
    }

    fn log_id(term: u64, leader: u64, index: u64) -> LogIdOf<TypeConfig> {
        LogId::new(
            LeaderId {
                term,
                node_id: leader,
            },
            index,
        )
    }

    /// Voters `configs` (one set: uniform; two: joint) and learner 9,
    /// configured by the entry at `index`.
    fn membership(configs: &[&[u64]], index: u64) -> Arc<StoredMembershipOf<TypeConfig>> {
        let sets: Vec<BTreeSet<u64>> = configs
            .iter()
            .map(|c| c.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<u64, NodeAddr> = sets
            .iter()
            .flatten()
            .chain([&9])
            .map(|&id| {
                let addr = format!("127.0.0.1:{}", 7000 + id);
                (
                    id,
                    NodeAddr {
                        peer_addr: addr.clone(),
                        client_addr: addr,
                    },
                )
            })
            .collect();
        let membership = Membership::new(sets, nodes).expect("a valid membership");
        Arc::new(StoredMembership::new(Some(log_id(1, 1, index)), membership))
    }

    /// Node 1 leading three voters in `TERM`, with an entry of its term
    /// applied.
    fn leader_metrics() -> RaftMetrics<TypeConfig> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.state = ServerState::Leader;
        metrics.membership_config = membership(&[&[1, 2, 3]], 3);
        metrics.committed_membership_config = membership(&[&[1, 2, 3]], 3);
        metrics.last_applied = Some(log_id(TERM, 1, 10));
        metrics
    }

    fn own() -> Option<Vote> {
        Some(vote(TERM, 1, true))
    }

    #[test]
    fn a_leader_with_its_entry_applied_fences_with_the_other_voters() {
        let view = fence_view(&leader_metrics(), own(), 1).expect("eligible");
        let others: Vec<u64> = view.others.iter().map(|(id, _)| *id).collect();
        assert_eq!(others, [2, 3], "not itself, not learner 9");
        assert_eq!(view.voters, BTreeSet::from([1, 2, 3]));
    }

    /// What a case changes in the leader's metrics.
    type Change = dyn Fn(&mut RaftMetrics<TypeConfig>);
    /// A case: its name, the change, the persisted vote, the refusal.
    type Case<'a> = (&'a str, &'a Change, Option<Vote>, Ineligible);

    #[test]
    fn each_rule_refuses_a_round_it_cannot_fence() {
        let refused = |change: &Change, own: Option<Vote>| {
            let mut metrics = leader_metrics();
            change(&mut metrics);
            fence_view(&metrics, own, 1).err()
        };
        let cases: [Case; 7] = [
            (
                "a follower",
                &|m| m.state = ServerState::Follower,
                own(),
                Ineligible::NotLeader,
            ),
            (
                "a joint configuration",
                &|m| {
                    m.membership_config = membership(&[&[1, 2, 3], &[1, 2, 4]], 3);
                    m.committed_membership_config = m.membership_config.clone();
                },
                own(),
                Ineligible::Joint,
            ),
            (
                "an uncommitted configuration",
                &|m| m.membership_config = membership(&[&[1, 2, 3]], 11),
                own(),
                Ineligible::Uncommitted,
            ),
            (
                "a leader that is not a voter",
                &|m| {
                    m.membership_config = membership(&[&[2, 3, 4]], 3);
                    m.committed_membership_config = m.membership_config.clone();
                },
                own(),
                Ineligible::NotVoter,
            ),
            (
                "an uncommitted own vote",
                &|_| {},
                Some(vote(TERM, 1, false)),
                Ineligible::NoOwnVote,
            ),
            (
                "another node's vote",
                &|_| {},
                Some(vote(TERM, 2, true)),
                Ineligible::NoOwnVote,
            ),
            (
                "the last applied entry of the previous term",
                &|m| m.last_applied = Some(log_id(TERM - 1, 2, 9)),
                own(),
                Ineligible::NoOwnEntry,
            ),
        ];
        for (case, change, own, why) in cases {
            assert_eq!(refused(change, own), Some(why), "{case}");
        }
        assert_eq!(
            refused(&|_| {}, None),
            Some(Ineligible::NoOwnVote),
            "no vote saved"
        );
    }

    /// Node 1's view of a round among `voters`.
    fn view(voters: &[u64]) -> FenceView {
        let mut metrics = leader_metrics();
        metrics.membership_config = membership(&[voters], 3);
        metrics.committed_membership_config = metrics.membership_config.clone();
        fence_view(&metrics, own(), 1).expect("eligible")
    }

    fn tally(voters: &[u64]) -> Tally {
        Tally::new(ROUND, &view(voters))
    }

    #[test]
    fn only_this_leaders_vote_from_a_voter_counts_towards_the_quorum() {
        let mut three = tally(&[1, 2, 3]);
        assert_eq!(three.verdict(), Verdict::Pending);
        assert_eq!(
            three.count(ROUND, 9, own().as_ref()),
            Verdict::Pending,
            "a learner"
        );
        assert_eq!(
            three.count(ROUND - 1, 2, own().as_ref()),
            Verdict::Pending,
            "an answer to the previous round's call"
        );
        assert_eq!(three.count(ROUND, 2, own().as_ref()), Verdict::Quorum);

        let mut three = tally(&[1, 2, 3]);
        assert_eq!(
            three.count(ROUND, 2, Some(&vote(TERM - 1, 1, true))),
            Verdict::Pending
        );
        assert_eq!(
            three.count(ROUND, 3, None),
            Verdict::Impossible,
            "an older vote, then a failure"
        );

        let mut three = tally(&[1, 2, 3]);
        let same_term_candidate = vote(TERM, 0, false);
        assert_eq!(
            three.count(ROUND, 2, Some(&same_term_candidate)),
            Verdict::Pending
        );
        assert_eq!(
            three.count(ROUND, 3, Some(&vote(TERM + 1, 3, false))),
            Verdict::Higher
        );
        let later_same_term = vote(TERM, 2, true);
        assert_eq!(
            tally(&[1, 2, 3]).count(ROUND, 2, Some(&later_same_term)),
            Verdict::Higher
        );

        let mut five = tally(&[1, 2, 3, 4, 5]);
        assert_eq!(five.count(ROUND, 2, own().as_ref()), Verdict::Pending);
        assert_eq!(
            five.count(ROUND, 2, own().as_ref()),
            Verdict::Pending,
            "counted once"
        );
        assert_eq!(five.count(ROUND, 4, None), Verdict::Pending);
        assert_eq!(five.count(ROUND, 5, own().as_ref()), Verdict::Quorum);
    }

    #[test]
    fn a_sole_voter_is_its_own_quorum() {
        assert_eq!(tally(&[1]).verdict(), Verdict::Quorum);
    }

    /// The other voters as a script. An asked voter answers after its
    /// delay (none: at once) with its vote, a failed call if it is in
    /// `failing`, or never if its vote is `None` (its call stays out). A
    /// voter in `busy` has an older round's call out, whose answer comes
    /// back after the delay given with it (`start` schedules it). One call
    /// out per voter, as `FenceClients` keeps.
    #[derive(Default)]
    struct Script {
        votes: BTreeMap<u64, Option<Vote>>,
        delays: BTreeMap<u64, Duration>,
        failing: BTreeSet<u64>,
        busy: Vec<(Duration, Answered)>,
        /// Every call made, as (round, voter).
        asked: Vec<(u64, u64)>,
        /// The answers to come, each with the time it arrives.
        due: Vec<(Instant, Answered)>,
        silent: BTreeSet<u64>,
    }

    impl Script {
        fn with(votes: &[(u64, Option<Vote>)]) -> Script {
            Script {
                votes: votes.iter().copied().collect(),
                ..Script::default()
            }
        }

        fn delayed(mut self, delays: &[(u64, Duration)]) -> Script {
            self.delays = delays.iter().copied().collect();
            self
        }

        /// Schedules the `busy` voters' answers from now on.
        fn start(&mut self) {
            let now = Instant::now();
            let busy = std::mem::take(&mut self.busy);
            let late = busy.into_iter().map(|(delay, late)| (now + delay, late));
            self.due.extend(late);
        }

        fn has_call_out(&self, target: u64) -> bool {
            self.silent.contains(&target)
                || self.due.iter().any(|(_, answer)| answer.from == target)
        }

        fn answer(&self, round: u64, target: u64) -> Option<Answered> {
            let vote = match self.failing.contains(&target) {
                true => Err(RpcError::Unreachable(Unreachable::from_string("scripted"))),
                false => Ok(Some(self.votes.get(&target).copied().flatten()?)),
            };
            Some(Answered {
                from: target,
                round,
                vote,
            })
        }
    }

    impl FenceCalls for Script {
        fn ask(
            &mut self,
            round: u64,
            target: u64,
            _node: &NodeAddr,
        ) -> impl Future<Output = bool> + Send {
            let free = !self.has_call_out(target);
            if free {
                self.asked.push((round, target));
                let delay = self.delays.get(&target).copied().unwrap_or_default();
                match self.answer(round, target) {
                    Some(answered) => self.due.push((Instant::now() + delay, answered)),
                    None => {
                        self.silent.insert(target);
                    }
                }
            }
            std::future::ready(free)
        }

        /// Taken only once due, as `FenceClients::next`: cancel-safe.
        async fn next(&mut self) -> Option<Answered> {
            let first_due = (0..self.due.len()).min_by_key(|&at| self.due[at].0);
            if let Some(first) = first_due {
                tokio::time::sleep_until(self.due[first].0).await;
                return Some(self.due.remove(first).1);
            }
            if !self.silent.is_empty() {
                std::future::pending::<()>().await;
            }
            None
        }

        fn retain(&mut self, _voters: &BTreeSet<u64>) {}
    }

    const ROUND_TIMEOUT: Duration = Duration::from_millis(100);

    /// Runs `rounds` rounds from `ROUND` on, on a runtime whose clock moves
    /// only when every task waits: each round's verdict, and how long (by
    /// that clock) it took.
    fn gather_rounds(
        gather: &mut Gather<Script>,
        view: &FenceView,
        rounds: u64,
    ) -> Vec<(Verdict, Duration)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            gather.clients.start();
            let mut verdicts = Vec::new();
            for round in ROUND..ROUND + rounds {
                let started = Instant::now();
                let verdict = gather.gather(round, view).await;
                verdicts.push((verdict, started.elapsed()));
            }
            verdicts
        })
    }

    const AT_ONCE: Duration = Duration::ZERO;
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_round_asks_only_as_many_voters_as_its_quorum_needs() {
        let mut three = Gather::new(Script::with(&[(2, own()), (3, own())]), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut three, &view(&[1, 2, 3]), 2);
        assert_eq!(verdicts, [(Verdict::Quorum, AT_ONCE); 2]);
        assert_eq!(three.clients.asked, [(ROUND, 2), (ROUND + 1, 2)]);

        let agree = |id| (id, own());
        let votes = [agree(2), agree(3), agree(4), agree(5)];
        let mut five = Gather::new(Script::with(&votes), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut five, &view(&[1, 2, 3, 4, 5]), 1);
        assert_eq!(verdicts, [(Verdict::Quorum, AT_ONCE)]);
        assert_eq!(five.clients.asked, [(ROUND, 2), (ROUND, 3)]);
        assert_eq!(
            five.order,
            [2, 3, 4, 5],
            "the ones not asked keep their place"
        );
    }

    #[test]
    fn an_answer_that_does_not_agree_asks_the_next_voter_who_is_asked_first_after() {
        let older = Some(vote(TERM - 1, 1, true));
        let mut gather = Gather::new(Script::with(&[(2, older), (3, own())]), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 2);
        assert_eq!(verdicts, [(Verdict::Quorum, AT_ONCE); 2]);
        assert_eq!(
            gather.clients.asked,
            [(ROUND, 2), (ROUND, 3), (ROUND + 1, 3)],
            "3 agreed and 2 did not: the next round asks 3 alone"
        );
        assert_eq!(gather.order, [3, 2]);
    }

    #[test]
    fn a_failed_call_asks_the_next_voter_and_goes_last() {
        let mut script = Script::with(&[(2, own()), (3, own()), (4, own()), (5, own())]);
        script.failing.insert(2);
        let mut gather = Gather::new(script, ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3, 4, 5]), 1);
        assert_eq!(verdicts, [(Verdict::Quorum, AT_ONCE)]);
        assert_eq!(gather.clients.asked, [(ROUND, 2), (ROUND, 3), (ROUND, 4)]);
        assert_eq!(gather.order, [3, 4, 5, 2]);
    }

    #[test]
    fn a_voter_that_does_not_answer_is_passed_over_once_the_round_is_late() {
        let mut gather = Gather::new(Script::with(&[(2, None), (3, own())]), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 2);
        // With no round before it, a round is late after the hedge's floor.
        assert_eq!(
            verdicts,
            [(Verdict::Quorum, HEDGE_FLOOR), (Verdict::Quorum, AT_ONCE)]
        );
        assert_eq!(
            gather.clients.asked,
            [(ROUND, 2), (ROUND, 3), (ROUND + 1, 3)],
            "2 had not answered: it goes last"
        );
        assert_eq!(gather.order, [3, 2]);
    }

    #[test]
    fn a_slow_voter_asked_first_costs_one_round_not_every_round() {
        // 2 agrees after 5 ms, well within a tenth of the round (10 ms).
        let script = Script::with(&[(2, own()), (3, own())]).delayed(&[(2, 5 * MS)]);
        let mut gather = Gather::new(script, ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 3);
        assert_eq!(
            verdicts,
            [
                (Verdict::Quorum, HEDGE_FLOOR),
                (Verdict::Quorum, AT_ONCE),
                (Verdict::Quorum, AT_ONCE)
            ]
        );
        let asked = [(ROUND, 2), (ROUND, 3), (ROUND + 1, 3), (ROUND + 2, 3)];
        assert_eq!(gather.clients.asked, asked);
    }

    #[test]
    fn a_round_is_late_after_four_times_the_usual_quorum_time() {
        // Every voter answers after 2 ms: the first round asks both (the
        // second at the hedge's floor), the next one waits for the one it
        // asked.
        let delays = [(2, 2 * MS), (3, 2 * MS)];
        let script = Script::with(&[(2, own()), (3, own())]).delayed(&delays);
        let mut gather = Gather::new(script, ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 2);
        assert_eq!(verdicts, [(Verdict::Quorum, 2 * MS); 2]);
        let asked = [(ROUND, 2), (ROUND, 3), (ROUND + 1, 2)];
        assert_eq!(gather.clients.asked, asked);
        assert_eq!(gather.usual_quorum, Some(2 * MS));

        assert_eq!(next_usual_quorum(None, MS), MS);
        assert_eq!(next_usual_quorum(Some(8 * MS), AT_ONCE), 7 * MS);
        let late = |usual| ask_everyone_after(ROUND_TIMEOUT, usual);
        assert_eq!(late(None), HEDGE_FLOOR);
        assert_eq!(late(Some(MS)), 4 * MS);
        assert_eq!(late(Some(Duration::from_micros(10))), HEDGE_FLOOR);
        assert_eq!(late(Some(5 * MS)), ROUND_TIMEOUT / 10, "at most a tenth");
    }

    #[test]
    fn short_rounds_still_wait_a_floor_before_asking_everyone() {
        let slow = Some(10 * MS);
        assert_eq!(ask_everyone_after(10 * MS, slow), ASK_ALL_AFTER_FLOOR);
        assert_eq!(
            ask_everyone_after(3 * MS, slow),
            Duration::from_micros(1500)
        );
        assert_eq!(
            ask_everyone_after(Duration::from_micros(600), None),
            Duration::from_micros(300),
            "at most half the round"
        );
    }

    #[test]
    fn a_busy_voter_is_asked_for_this_round_as_soon_as_it_is_free_if_still_wanted() {
        let late = || Answered {
            from: 2,
            round: ROUND - 1,
            vote: Ok(own()),
        };
        // Of four voters, this node and two others make a quorum. 3's call
        // fails at once and 4 agrees after 5 ms; 2, busy until its older
        // call's answer is back at 2 ms (that answer does not count), is
        // asked then and agrees 3 ms later, together with 4.
        let votes = [(2, own()), (3, own()), (4, own())];
        let mut wanted = Script::with(&votes).delayed(&[(2, 3 * MS), (4, 5 * MS)]);
        wanted.failing.insert(3);
        wanted.busy.push((2 * MS, late()));
        let mut gather = Gather::new(wanted, ROUND_TIMEOUT);
        // Rounds have been slow: this one is late only after the tenth.
        gather.usual_quorum = Some(5 * MS);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3, 4]), 1);
        assert_eq!(
            verdicts,
            [(Verdict::Quorum, 5 * MS)],
            "8 ms: 2 asked only once 4 answered"
        );
        assert_eq!(gather.clients.asked, [(ROUND, 3), (ROUND, 4), (ROUND, 2)]);

        let mut not_wanted = Script::with(&[(2, own()), (3, None)]);
        not_wanted.busy.push((AT_ONCE, late()));
        let mut gather = Gather::new(not_wanted, ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 1);
        // 3 is out and expected to agree, so 2 is asked only when the
        // round is late.
        assert_eq!(verdicts, [(Verdict::Quorum, HEDGE_FLOOR)]);
        assert_eq!(gather.clients.asked, [(ROUND, 3), (ROUND, 2)]);
    }

    #[test]
    fn an_answer_due_as_the_round_turns_late_wins_over_asking_everyone() {
        // Without `biased` the select would take the timer first about half
        // the time: twenty fresh rounds all going one way rule that out.
        for _ in 0..20 {
            let script = Script::with(&[(2, own()), (3, own())]).delayed(&[(2, HEDGE_FLOOR)]);
            let mut gather = Gather::new(script, ROUND_TIMEOUT);
            let verdicts = gather_rounds(&mut gather, &view(&[1, 2, 3]), 1);
            assert_eq!(verdicts, [(Verdict::Quorum, HEDGE_FLOOR)]);
            assert_eq!(gather.clients.asked, [(ROUND, 2)]);
        }
    }

    #[test]
    fn a_later_vote_ends_the_round_and_silence_ends_it_at_its_deadline() {
        let later = Some(vote(TERM + 1, 2, false));
        let mut higher = Gather::new(Script::with(&[(2, later), (3, own())]), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut higher, &view(&[1, 2, 3]), 1);
        assert_eq!(verdicts, [(Verdict::Higher, AT_ONCE)]);
        assert_eq!(higher.clients.asked, [(ROUND, 2)]);
        assert_eq!(higher.usual_quorum, None, "only a quorum's time counts");

        let mut silent = Gather::new(Script::with(&[(2, None), (3, None)]), ROUND_TIMEOUT);
        let verdicts = gather_rounds(&mut silent, &view(&[1, 2, 3]), 1);
        assert_eq!(verdicts, [(Verdict::Pending, ROUND_TIMEOUT)]);
        assert_eq!(silent.usual_quorum, None);
    }
}
