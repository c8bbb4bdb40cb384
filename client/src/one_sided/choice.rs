//! Which mapped region may serve a read at a consistency level right now:
//! the leader's while its lease holds (`Lease`), any replica within the lag
//! bound (`Follower`); either only if it is not behind what this client has
//! already seen (its reads never go back). The rules are the pure functions
//! at the top.

use std::sync::atomic::Ordering;

use rdkv_fabric::{ReadTime, RegionReader};
use rdkv_proto::region::{DynamicHeader, RegionState};
use rdkv_proto::wire::Consistency;

use super::OneSided;
use super::handle::NotServed;
use super::view::{GroupView, ReadView};

/// Which clock a lease is judged on, and now on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseClock {
    /// A region on this host: the boottime clock both processes read.
    Boottime(u64),
    /// A region on another host: the wall clocks, apart by less than the
    /// allowed drift (the documented assumption of remote lease reads).
    Unix(u64),
}

/// Whether a leader's region header grants lease reads at `now`: the region
/// serves and its lease runs at least `max_clock_drift_us` beyond now on
/// that clock (the bound on how far two hosts' wall clocks may differ; on
/// one host, the margin for the read that follows the check).
#[inline]
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
#[inline]
pub(super) fn not_behind(header: &DynamicHeader, seen: u64) -> bool {
    header.applied_index >= seen
}

/// `time` on the clock that judges a lease of `reader`'s region.
#[inline]
fn lease_clock(view: &ReadView, reader: &RegionReader, time: ReadTime) -> LeaseClock {
    if reader.on_this_host() {
        LeaseClock::Boottime(time.monotonic_us)
    } else {
        LeaseClock::Unix(view.unix_us(time))
    }
}

/// A region chosen for a read, and what the read's clock reading must
/// still confirm after the copy (a lease is judged at the reading taken
/// after the copy: every instant of the read is before it).
pub(super) struct Choice<'v> {
    pub(super) reader: &'v RegionReader,
    /// The leader's header whose lease must hold at the reading: the
    /// region read (Lease), or the lag's reference (Follower).
    lease: Option<(&'v RegionReader, DynamicHeader)>,
    /// A `Lease` read (else `Follower`): what a lapsed lease counts as.
    leased_read: bool,
}

impl OneSided {
    /// The region that may serve a read at `consistency`, before it is read.
    /// The region of `group` (the key's shard) that may serve a read at
    /// `consistency`, before it is read.
    #[inline(always)]
    pub(super) fn choose<'v>(
        &self,
        view: &ReadView,
        group: &'v GroupView,
        consistency: Consistency,
    ) -> Result<Choice<'v>, NotServed> {
        match consistency {
            Consistency::Linearizable => Err(NotServed::Consistency),
            Consistency::Lease => self.choose_leader(view, group),
            Consistency::Follower { max_lag_entries } => {
                self.choose_follower(group, max_lag_entries)
            }
        }
    }

    #[inline(always)]
    fn choose_leader<'v>(
        &self,
        view: &ReadView,
        group: &'v GroupView,
    ) -> Result<Choice<'v>, NotServed> {
        let Some(reader) = group.leader_reader() else {
            return Err(self.no_region());
        };
        let header = reader.dynamic_header().map_err(|_| NotServed::Unreadable)?;
        if header.state != RegionState::Serving {
            return Err(self.lease_refused());
        }
        // A leader applies what it committed a moment later: until it
        // catches up with what this client saw, the server answers.
        if !not_behind(&header, self.seen(group.shard)) {
            return Err(self.leader_behind(view, reader, header));
        }
        Ok(Choice {
            reader,
            lease: Some((reader, header)),
            leased_read: true,
        })
    }

    /// No region to read (no view yet, a map without the key's shard, a
    /// group without a leader's region): a refresh may find one.
    #[cold]
    #[inline(never)]
    pub(super) fn no_region(&self) -> NotServed {
        self.views.want_refresh();
        NotServed::NoRegion
    }

    /// The leader's region has not applied what this client saw: `Behind`,
    /// unless its lease lapsed (told apart with a clock reading of its
    /// own: that region may be a dead incarnation's, to be replaced by a
    /// refresh).
    #[cold]
    #[inline(never)]
    fn leader_behind(
        &self,
        view: &ReadView,
        reader: &RegionReader,
        header: DynamicHeader,
    ) -> NotServed {
        let now = lease_clock(view, reader, view.now());
        if !lease_holds(&header, now, self.max_clock_drift_us) {
            return self.lease_refused();
        }
        NotServed::Behind
    }

    #[inline(never)]
    fn choose_follower<'v>(
        &self,
        group: &'v GroupView,
        max_lag_entries: u64,
    ) -> Result<Choice<'v>, NotServed> {
        // The leader's published applied index is the reference only while
        // its lease holds (confirmed after the read): a leader cut off from
        // its quorum (which may not know it has been replaced) publishes a
        // stale one.
        let leader = group
            .leader_reader()
            .and_then(|r| Some((r, r.dynamic_header().ok()?)))
            .filter(|(_, h)| h.state == RegionState::Serving && h.lease_deadline_unix_us.is_some());
        let leader_applied = leader.map(|(_, h)| h.applied_index);
        let seen = self.seen(group.shard);
        let fits = |r: &RegionReader| {
            r.dynamic_header().is_ok_and(|h| {
                within_lag(&h, leader_applied, max_lag_entries) && not_behind(&h, seen)
            })
        };
        // Counted, then the k-th taken: no list of candidates is built.
        let candidates = group.readers.iter().filter(|r| fits(r)).count();
        if candidates == 0 {
            self.counters.add(|c| &c.lag_refusals, 1);
            return Err(NotServed::Lag);
        }
        let pick = self.spread.local().fetch_add(1, Ordering::Relaxed) % candidates;
        let reader = group
            .readers
            .iter()
            .filter(|r| fits(r))
            .nth(pick)
            .ok_or(NotServed::Lag)?;
        // Only a bounded lag relies on the leader's position.
        let lease = leader.filter(|_| max_lag_entries != u64::MAX);
        Ok(Choice {
            reader,
            lease,
            leased_read: false,
        })
    }

    /// After the read: whether the lease the choice relied on held at the
    /// read's clock reading `time`.
    #[inline(always)]
    pub(super) fn confirm(
        &self,
        view: &ReadView,
        choice: &Choice<'_>,
        time: ReadTime,
    ) -> Result<(), NotServed> {
        let Some((leader, header)) = &choice.lease else {
            return Ok(());
        };
        let now = lease_clock(view, leader, time);
        if lease_holds(header, now, self.max_clock_drift_us) {
            Ok(())
        } else if choice.leased_read {
            Err(self.lease_refused())
        } else {
            Err(self.lag_refused())
        }
    }

    #[cold]
    #[inline(never)]
    fn lag_refused(&self) -> NotServed {
        self.counters.add(|c| &c.lag_refusals, 1);
        NotServed::Lag
    }

    #[cold]
    #[inline(never)]
    fn lease_refused(&self) -> NotServed {
        self.counters.add(|c| &c.lease_refusals, 1);
        // The leader may have changed: look again.
        self.views.want_refresh();
        NotServed::Lease
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
