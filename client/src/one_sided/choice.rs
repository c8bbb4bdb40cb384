//! Which mapped region may serve a read at a consistency level right now:
//! the leader's while its lease holds (`Lease`), any replica within the lag
//! bound (`Follower`); either only if it is not behind what this client has
//! already seen (its reads never go back). The rules are the pure functions
//! at the top.

use std::sync::atomic::Ordering;

use rdkv_fabric::RegionReader;
use rdkv_fabric::clock::{boottime_now_us, unix_now_us};
use rdkv_proto::region::{DynamicHeader, RegionState};
use rdkv_proto::wire::Consistency;

use super::OneSided;
use super::topology::Topology;

/// Which clock a lease is judged on, and now on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseClock {
    /// A region on this host: the boottime clock both processes read.
    Boottime(u64),
    /// A region on another host: the wall clocks, apart by less than the
    /// allowed drift (the documented assumption of remote lease reads).
    Unix(u64),
}

impl LeaseClock {
    /// Now, on the clock that judges a lease of `reader`'s region.
    pub(super) fn for_reader(reader: &RegionReader) -> LeaseClock {
        if reader.on_this_host() {
            LeaseClock::Boottime(boottime_now_us())
        } else {
            LeaseClock::Unix(unix_now_us())
        }
    }
}

/// Whether a leader's region header grants lease reads at `now`: the region
/// serves and its lease runs at least `max_clock_drift_us` beyond now on
/// that clock (the bound on how far two hosts' wall clocks may differ; on
/// one host, the margin for the read that follows the check).
pub(super) fn lease_holds(
    header: &DynamicHeader,
    now: LeaseClock,
    max_clock_drift_us: u64,
) -> bool {
    let (deadline, now_us) = match now {
        LeaseClock::Boottime(now_us) => (header.lease_deadline_boottime_us, now_us),
        LeaseClock::Unix(now_us) => (header.lease_deadline_unix_us, now_us),
    };
    header.state == RegionState::Serving
        && deadline.is_some_and(|deadline| now_us.saturating_add(max_clock_drift_us) < deadline)
}

/// Whether a replica with `header` may serve a read lagging at most
/// `max_lag_entries` behind the leader, whose applied index is
/// `leader_applied` when known.
pub(super) fn within_lag(
    header: &DynamicHeader,
    leader_applied: Option<u64>,
    max_lag_entries: u64,
) -> bool {
    let within = match leader_applied {
        Some(leader) => leader.saturating_sub(header.applied_index) <= max_lag_entries,
        // Without the leader's position only "any lag" is safe.
        None => max_lag_entries == u64::MAX,
    };
    header.state == RegionState::Serving && within
}

/// Whether a region with `header` has applied at least `seen`, the highest
/// log index this client has seen applied anywhere: reading a replica behind
/// it could return a state older than one the client already read (or
/// wrote), so its reads would go back in time.
pub(super) fn not_behind(header: &DynamicHeader, seen: u64) -> bool {
    header.applied_index >= seen
}

impl OneSided {
    /// The reader that may serve a read at `consistency` now, if any.
    pub(super) fn reader_for(
        &self,
        topology: &mut Topology,
        consistency: Consistency,
    ) -> Option<RegionReader> {
        match consistency {
            Consistency::Linearizable => None,
            Consistency::Lease => self.lease_reader(topology),
            Consistency::Follower { max_lag_entries } => {
                self.follower_reader(topology, max_lag_entries)
            }
        }
    }

    /// The leader's mapped region, its header, and whether its lease holds
    /// now (`None`: no leader region is mapped, or its header is unreadable).
    fn leader_lease<'t>(
        &self,
        topology: &'t Topology,
    ) -> Option<(&'t RegionReader, DynamicHeader, bool)> {
        let reader = topology.leader_reader()?;
        let header = reader.dynamic_header().ok()?;
        let now = LeaseClock::for_reader(reader);
        let holds = lease_holds(&header, now, self.max_clock_drift_us);
        Some((reader, header, holds))
    }

    /// The leader's header, if its lease holds now.
    fn leased_header(&self, topology: &Topology) -> Option<DynamicHeader> {
        let (_, header, holds) = self.leader_lease(topology)?;
        holds.then_some(header)
    }

    fn lease_reader(&self, topology: &mut Topology) -> Option<RegionReader> {
        let (reader, header, holds) = self.leader_lease(topology)?;
        if holds {
            // A leader applies what it committed a moment later: until it
            // catches up with what this client saw, the server answers.
            return not_behind(&header, self.seen()).then(|| reader.clone());
        }
        self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
        // The leader may have changed: look again on the next read.
        topology.refreshed_at = None;
        None
    }

    fn follower_reader(&self, topology: &Topology, max_lag_entries: u64) -> Option<RegionReader> {
        // The leader's published applied index is the reference only while
        // its lease holds: a leader cut off from its quorum (which may not
        // know it has been replaced) publishes a stale one.
        let leader_applied = self.leased_header(topology).map(|h| h.applied_index);
        let seen = self.seen();
        let candidates: Vec<&RegionReader> = topology
            .readers()
            .filter(|r| {
                r.dynamic_header().is_ok_and(|h| {
                    within_lag(&h, leader_applied, max_lag_entries) && not_behind(&h, seen)
                })
            })
            .collect();
        if candidates.is_empty() {
            self.counters.lag_refusals.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let pick = self.spread.fetch_add(1, Ordering::Relaxed) % candidates.len();
        Some(candidates[pick].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header whose lease (if any) ends at `lease` on the wall clock and
    /// ten times that on the boottime clock.
    fn header(state: RegionState, applied_index: u64, lease: Option<u64>) -> DynamicHeader {
        DynamicHeader {
            raft_term: 1,
            applied_index,
            applied_at_unix_us: 0,
            lease_deadline_unix_us: lease,
            state,
            lease_deadline_boottime_us: lease.map(|us| us * 10),
        }
    }

    #[test]
    fn a_lease_holds_only_beyond_the_clock_drift() {
        use LeaseClock::{Boottime, Unix};
        let leased = header(RegionState::Serving, 10, Some(1_000));
        assert!(lease_holds(&leased, Unix(900), 50));
        assert!(
            !lease_holds(&leased, Unix(950), 50),
            "deadline within the drift"
        );
        assert!(!lease_holds(
            &header(RegionState::Serving, 10, None),
            Unix(0),
            0
        ));
        assert!(!lease_holds(
            &header(RegionState::Serving, 10, None),
            Boottime(0),
            0
        ));
        assert!(!lease_holds(
            &header(RegionState::Retired, 10, Some(1_000)),
            Unix(0),
            0
        ));
    }

    #[test]
    fn a_lease_on_this_host_is_judged_on_the_boottime_clock() {
        use LeaseClock::{Boottime, Unix};
        let leased = header(RegionState::Serving, 10, Some(1_000));
        // Past the wall-clock deadline but not the boottime one, and back.
        assert!(lease_holds(&leased, Boottime(9_000), 50));
        assert!(!lease_holds(&leased, Unix(9_000), 50));
        assert!(!lease_holds(&leased, Boottime(9_960), 50));
        assert!(lease_holds(&leased, Unix(900), 50));
    }

    #[test]
    fn a_region_behind_what_was_seen_is_not_read() {
        let replica = header(RegionState::Serving, 90, None);
        assert!(not_behind(&replica, 89));
        assert!(not_behind(&replica, 90));
        assert!(!not_behind(&replica, 91));
    }

    #[test]
    fn the_lag_is_measured_against_the_leader_when_known() {
        let replica = header(RegionState::Serving, 90, None);
        assert!(within_lag(&replica, Some(100), 10));
        assert!(!within_lag(&replica, Some(101), 10));
        assert!(
            !within_lag(&replica, None, 1_000),
            "unknown leader position"
        );
        assert!(within_lag(&replica, None, u64::MAX));
        let retired = header(RegionState::Retired, 100, None);
        assert!(!within_lag(&retired, Some(100), u64::MAX));
    }
}
