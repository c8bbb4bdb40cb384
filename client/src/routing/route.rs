//! Where a request may be served, and what the client knows of the cluster:
//! endpoints, the leader, the node that answered last, nodes under suspicion.

use std::collections::HashMap;
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{Consistency, Request};
use tokio::time::Instant;

/// How long a node that did not answer is tried only after the others.
const SUSPECT_FOR: Duration = Duration::from_secs(5);

/// Where a request may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Only the leader; follow `NotLeader` redirects.
    Leader,
    /// Any node; prefer the leader (or the node last talked to) when known.
    AnyPreferLeader,
    /// Any node, spread round-robin over the endpoints (follower reads).
    AnySpread,
}

/// Whether repeating a request after an unknown outcome is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idempotence {
    Read,
    Write,
}

/// Where a request of this kind may be served, and whether repeating it after
/// an unknown outcome is harmless.
pub(crate) fn route_of(request: &Request) -> (Route, Idempotence) {
    match request {
        Request::Get { consistency, .. }
        | Request::MGet { consistency, .. }
        | Request::Scan { consistency, .. }
        | Request::Ttl { consistency, .. } => (read_route(*consistency), Idempotence::Read),
        Request::Ping
        | Request::Status
        | Request::Health
        | Request::Members
        | Request::SnapshotRead { .. }
        | Request::ReportReads(_)
        | Request::RdmaRegion
        | Request::OfiRegion
        | Request::ShardMap
        | Request::ShardStatus
        | Request::Digests => (Route::AnyPreferLeader, Idempotence::Read),
        Request::Put { .. }
        | Request::Delete { .. }
        | Request::Cas { .. }
        | Request::MPut { .. }
        | Request::Update { .. }
        | Request::Transaction { .. }
        | Request::Clear
        | Request::AddMember { .. }
        | Request::PromoteMember { .. }
        | Request::RemoveMember { .. }
        | Request::MoveLeader { .. }
        | Request::ShardMoveLeader { .. }
        | Request::PublishShardMap { .. }
        | Request::AddNode { .. }
        | Request::RemoveNode { .. }
        | Request::InjectFault(_)
        | Request::RdmaConnect { .. } => (Route::Leader, Idempotence::Write),
        // A shard's scan or clear goes where the unsharded one would, in
        // that shard; its placement operations are its leader's (opening
        // and closing a replica are sent to one node, not routed).
        Request::Sharded { request, .. } => match request.to_request() {
            Some(request) => route_of(&request),
            None => (Route::Leader, Idempotence::Write),
        },
    }
}

fn read_route(consistency: Consistency) -> Route {
    match consistency {
        Consistency::Linearizable | Consistency::Lease => Route::Leader,
        Consistency::Follower { .. } => Route::AnySpread,
    }
}

/// The shard a request is for and where the client's map puts it. For a
/// single group (no map, or a map of one shard) it is shard 0 with no hint
/// and no member list: any endpoint may be tried, as before sharding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) shard: ShardId,
    /// The client address of the shard's leader as the map names it.
    pub(crate) hint: Option<String>,
    /// The client addresses of the shard's members; empty: every endpoint.
    pub(crate) members: Vec<String>,
}

impl Target {
    /// The one group of an unsharded cluster.
    pub(crate) fn whole() -> Target {
        Target {
            shard: ShardId(0),
            hint: None,
            members: Vec::new(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct RouteState {
    /// Seed endpoints plus leader addresses learned from hints.
    pub(crate) endpoints: Vec<String>,
    /// Per shard, the client address of the node believed to lead it
    /// (learned from answers and `NotLeader` hints; fresher than the map's).
    leaders: HashMap<ShardId, String>,
    /// The node that answered last.
    pub(crate) current: Option<String>,
    /// Nodes that recently failed to answer within a call's budget, and
    /// since when: tried last until `SUSPECT_FOR` has passed.
    suspects: HashMap<String, Instant>,
    /// Per shard, nodes that answered `WrongShard` for it with no newer
    /// map to give (a replica moved away while the map stays): passed over
    /// for that shard until a new map is installed.
    strays: HashMap<ShardId, Vec<String>>,
}

impl RouteState {
    pub(crate) fn new(endpoints: Vec<String>) -> RouteState {
        RouteState {
            endpoints,
            leaders: HashMap::new(),
            current: None,
            suspects: HashMap::new(),
            strays: HashMap::new(),
        }
    }

    /// The node believed to lead `shard`.
    pub(crate) fn leader(&self, shard: ShardId) -> Option<&String> {
        self.leaders.get(&shard)
    }

    /// Forgets every shard's leader: a new map's hints are fresher (and
    /// its members too).
    pub(crate) fn forget_leaders(&mut self) {
        self.leaders.clear();
        self.strays.clear();
    }

    /// `addr` does not serve `shard` though the map says it does (its
    /// replica moved away): try the shard's other members.
    pub(crate) fn not_serving(&mut self, addr: &str, shard: ShardId) {
        if self
            .leaders
            .get(&shard)
            .is_some_and(|leader| leader == addr)
        {
            self.leaders.remove(&shard);
        }
        if self.current.as_deref() == Some(addr) {
            self.current = None;
        }
        let strays = self.strays.entry(shard).or_default();
        if !strays.iter().any(|s| s == addr) {
            strays.push(addr.to_owned());
        }
    }

    fn is_stray(&self, addr: &str, shard: ShardId) -> bool {
        self.strays
            .get(&shard)
            .is_some_and(|strays| strays.iter().any(|s| s == addr))
    }

    /// The node to try for `route` to `target` on the `cursor`-th fallback.
    pub(crate) fn pick(&self, route: Route, cursor: usize, target: &Target) -> String {
        if let Some(addr) = self.preferred(route, target) {
            return addr.clone();
        }
        let candidates = self.candidates(target);
        let n = candidates.len().max(1);
        // From the cursor on, the first candidate not under suspicion; all
        // suspect (or none left): plain rotation.
        (0..n)
            .filter_map(|k| candidates.get((cursor + k) % n))
            .find(|addr| !self.is_suspect(addr) && !self.is_stray(addr, target.shard))
            .or_else(|| candidates.get(cursor % n))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether `addr` failed within the last `SUSPECT_FOR`.
    fn is_suspect(&self, addr: &str) -> bool {
        self.suspects
            .get(addr)
            .is_some_and(|since| since.elapsed() < SUSPECT_FOR)
    }

    /// The leader of the target's shard as known, else the map's hint
    /// unless that node failed lately (the map's version, and so its hint,
    /// may not change for a long time after its leader died), else (a
    /// shard any node may serve) the node that answered last.
    fn preferred<'a>(&'a self, route: Route, target: &'a Target) -> Option<&'a String> {
        match route {
            Route::AnySpread => None,
            Route::Leader | Route::AnyPreferLeader => {
                self.leaders
                    .get(&target.shard)
                    .or(target.hint.as_ref().filter(|hint| {
                        !self.is_suspect(hint) && !self.is_stray(hint, target.shard)
                    }))
                    .or_else(|| {
                        self.current
                            .as_ref()
                            .filter(|c| target.members.is_empty() || target.members.contains(c))
                    })
            }
        }
    }

    /// The nodes a fallback goes through: the shard's members when the map
    /// names them, else every endpoint.
    fn candidates<'a>(&'a self, target: &'a Target) -> &'a [String] {
        if target.members.is_empty() {
            &self.endpoints
        } else {
            &target.members
        }
    }

    /// Whether the cursor has just gone through every candidate once.
    pub(crate) fn round_done(&self, cursor: usize, target: &Target) -> bool {
        cursor.is_multiple_of(self.candidates(target).len().max(1))
    }

    /// Stops preferring `addr` after it failed, for every shard.
    pub(crate) fn forget(&mut self, addr: &str) {
        self.leaders.retain(|_, leader| leader != addr);
        if self.current.as_deref() == Some(addr) {
            self.current = None;
        }
    }

    /// `addr` did not answer within a call's budget (crashed, frozen, cut
    /// off): it must not stay the first choice of the next calls.
    pub(crate) fn suspect(&mut self, addr: &str) {
        self.forget(addr);
        self.suspects.insert(addr.to_owned(), Instant::now());
    }

    /// `addr` answered a request for `shard` sent by `route`.
    pub(crate) fn answered(&mut self, addr: &str, route: Route, shard: ShardId) {
        self.suspects.remove(addr);
        if route == Route::Leader {
            self.leaders.insert(shard, addr.to_owned());
        }
        self.current = Some(addr.to_owned());
    }

    /// A hint named `addr` as the leader of `shard`.
    pub(crate) fn learn_leader(&mut self, addr: &str, shard: ShardId) {
        if !self.endpoints.iter().any(|e| e == addr) {
            self.endpoints.push(addr.to_owned());
        }
        self.leaders.insert(shard, addr.to_owned());
    }

    /// Forgets who leads `shard` (it moved its leadership away).
    pub(crate) fn leader_moved(&mut self, shard: ShardId) {
        self.leaders.remove(&shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> RouteState {
        RouteState::new(vec!["a".into(), "b".into(), "c".into()])
    }

    fn whole() -> Target {
        Target::whole()
    }

    #[test]
    fn the_leader_is_preferred_unless_reads_are_spread() {
        let mut state = state();
        state.learn_leader("b", ShardId(0));
        assert_eq!(state.pick(Route::Leader, 0, &whole()), "b");
        assert_eq!(state.pick(Route::AnyPreferLeader, 2, &whole()), "b");
        assert_eq!(state.pick(Route::AnySpread, 2, &whole()), "c");
    }

    #[test]
    fn a_node_not_serving_a_shard_is_passed_over_for_its_other_members() {
        let mut state = state();
        let shard = Target {
            shard: ShardId(2),
            hint: Some("a".into()),
            members: vec!["a".into(), "b".into()],
        };
        state.learn_leader("a", ShardId(2));
        assert_eq!(state.pick(Route::Leader, 0, &shard), "a");
        state.not_serving("a", ShardId(2));
        assert_eq!(state.pick(Route::Leader, 0, &shard), "b");
        assert_eq!(state.pick(Route::Leader, 1, &shard), "b");
        // Other shards still go to it.
        let other = Target {
            shard: ShardId(1),
            ..shard.clone()
        };
        assert_eq!(state.pick(Route::Leader, 0, &other), "a");
        // A new map's members are trusted again.
        state.forget_leaders();
        assert_eq!(state.pick(Route::Leader, 0, &shard), "a");
    }

    #[test]
    fn a_suspect_is_tried_after_the_others() {
        let mut state = state();
        state.suspect("a");
        assert_eq!(state.pick(Route::Leader, 0, &whole()), "b");
        state.answered("a", Route::AnySpread, ShardId(0));
        state.forget("a");
        assert_eq!(state.pick(Route::Leader, 0, &whole()), "a");
    }

    #[test]
    fn a_hinted_leader_becomes_an_endpoint() {
        let mut state = state();
        state.learn_leader("d", ShardId(0));
        assert_eq!(state.endpoints.len(), 4);
        assert!(state.round_done(4, &whole()));
        assert!(!state.round_done(3, &whole()));
    }

    #[test]
    fn each_shard_has_its_own_leader_and_members() {
        let mut state = state();
        let shard = |id, hint: Option<&str>, members: &[&str]| Target {
            shard: ShardId(id),
            hint: hint.map(str::to_owned),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
        };
        let one = shard(1, Some("c"), &["b", "c"]);
        // The map's hint first; a learnt leader overrides it.
        assert_eq!(state.pick(Route::Leader, 0, &one), "c");
        state.learn_leader("b", ShardId(1));
        assert_eq!(state.pick(Route::Leader, 0, &one), "b");
        assert_eq!(
            state.pick(Route::Leader, 0, &whole()),
            "a",
            "shard 0 unchanged"
        );
        // With no leader or hint, fallbacks go through the members only,
        // and the last node to answer is preferred only if it is one.
        let no_hint = shard(2, None, &["b", "c"]);
        state.answered("a", Route::AnySpread, ShardId(0));
        assert_eq!(state.pick(Route::Leader, 0, &no_hint), "b");
        assert_eq!(state.pick(Route::Leader, 1, &no_hint), "c");
        assert_eq!(state.pick(Route::Leader, 2, &no_hint), "b");
        assert!(state.round_done(2, &no_hint));
        // A node that fails stops leading every shard it was thought to.
        state.learn_leader("b", ShardId(0));
        state.forget("b");
        assert_eq!(state.leader(ShardId(0)), None);
        assert_eq!(state.leader(ShardId(1)), None);
        state.forget_leaders();
        assert_eq!(state.pick(Route::Leader, 0, &one), "c");
    }

    #[test]
    fn a_failed_hinted_leader_is_passed_over_for_the_other_members() {
        let mut state = state();
        let target = Target {
            shard: ShardId(1),
            hint: Some("a".to_owned()),
            members: vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
        };
        assert_eq!(state.pick(Route::Leader, 0, &target), "a");
        // "a" (the map's leader) no longer accepts connections.
        state.suspect("a");
        assert_eq!(state.pick(Route::Leader, 0, &target), "b");
        assert_eq!(state.pick(Route::Leader, 2, &target), "c");
        // It answers again: its hint counts again.
        state.answered("a", Route::AnySpread, ShardId(0));
        assert_eq!(state.pick(Route::Leader, 0, &target), "a");
    }
}
