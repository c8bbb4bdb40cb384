//! Where a request may be served, and what the client knows of the cluster:
//! endpoints, the leader, the node that answered last, nodes under suspicion.

use std::collections::HashMap;
use std::time::Duration;

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
        | Request::InjectFault(_)
        | Request::RdmaConnect { .. } => (Route::Leader, Idempotence::Write),
    }
}

fn read_route(consistency: Consistency) -> Route {
    match consistency {
        Consistency::Linearizable | Consistency::Lease => Route::Leader,
        Consistency::Follower { .. } => Route::AnySpread,
    }
}

#[derive(Debug)]
pub(crate) struct RouteState {
    /// Seed endpoints plus leader addresses learned from hints.
    pub(crate) endpoints: Vec<String>,
    /// Client address of the node believed to lead.
    pub(crate) leader: Option<String>,
    /// The node that answered last.
    pub(crate) current: Option<String>,
    /// Nodes that recently failed to answer within a call's budget, and
    /// since when: tried last until `SUSPECT_FOR` has passed.
    suspects: HashMap<String, Instant>,
}

impl RouteState {
    pub(crate) fn new(endpoints: Vec<String>) -> RouteState {
        RouteState {
            endpoints,
            leader: None,
            current: None,
            suspects: HashMap::new(),
        }
    }

    /// The node to try for `route` on the `cursor`-th fallback.
    pub(crate) fn pick(&self, route: Route, cursor: usize) -> String {
        let preferred = match route {
            Route::Leader | Route::AnyPreferLeader => {
                self.leader.clone().or_else(|| self.current.clone())
            }
            Route::AnySpread => None,
        };
        if let Some(addr) = preferred {
            return addr;
        }
        let n = self.endpoints.len().max(1);
        let suspect = |addr: &String| {
            self.suspects
                .get(addr)
                .is_some_and(|since| since.elapsed() < SUSPECT_FOR)
        };
        // From the cursor on, the first endpoint not under suspicion; all
        // suspect (or none left): plain rotation.
        (0..n)
            .filter_map(|k| self.endpoints.get((cursor + k) % n))
            .find(|addr| !suspect(addr))
            .or_else(|| self.endpoints.get(cursor % n))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether the cursor has just gone through every endpoint once.
    pub(crate) fn round_done(&self, cursor: usize) -> bool {
        cursor.is_multiple_of(self.endpoints.len().max(1))
    }

    /// Stops preferring `addr` after it failed.
    pub(crate) fn forget(&mut self, addr: &str) {
        if self.leader.as_deref() == Some(addr) {
            self.leader = None;
        }
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

    /// `addr` answered a request sent by `route`.
    pub(crate) fn answered(&mut self, addr: &str, route: Route) {
        self.suspects.remove(addr);
        if route == Route::Leader {
            self.leader = Some(addr.to_owned());
        }
        self.current = Some(addr.to_owned());
    }

    /// A hint named `addr` as the leader.
    pub(crate) fn learn_leader(&mut self, addr: &str) {
        if !self.endpoints.iter().any(|e| e == addr) {
            self.endpoints.push(addr.to_owned());
        }
        self.leader = Some(addr.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> RouteState {
        RouteState::new(vec!["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn the_leader_is_preferred_unless_reads_are_spread() {
        let mut state = state();
        state.learn_leader("b");
        assert_eq!(state.pick(Route::Leader, 0), "b");
        assert_eq!(state.pick(Route::AnyPreferLeader, 2), "b");
        assert_eq!(state.pick(Route::AnySpread, 2), "c");
    }

    #[test]
    fn a_suspect_is_tried_after_the_others() {
        let mut state = state();
        state.suspect("a");
        assert_eq!(state.pick(Route::Leader, 0), "b");
        state.answered("a", Route::AnySpread);
        state.forget("a");
        assert_eq!(state.pick(Route::Leader, 0), "a");
    }

    #[test]
    fn a_hinted_leader_becomes_an_endpoint() {
        let mut state = state();
        state.learn_leader("d");
        assert_eq!(state.endpoints.len(), 4);
        assert!(state.round_done(4));
        assert!(!state.round_done(3));
    }
}
