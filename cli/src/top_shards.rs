//! `rdkvctl top`'s shard table on a multi-shard cluster: one row per shard,
//! from every node's `ShardStatus` (docs/sharding.md, section 10).
//!
//! A shard's row is its leader's view (the replica reporting `Leader` with
//! the highest term): term, applied index, entries applied per second over
//! the interval (the shard's write rate, blanks and membership entries
//! included), region fill; and the replicas' view: how many of its members
//! answered, and the largest lag behind the leader's applied index among
//! them. Request counters are node-wide, so per-op rates stay in the node
//! table above it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::ShardStatus;

use crate::output::Table;
use crate::shards::leaders_of;
use crate::views::{fill_percent, percent_cell};

/// What `top` shows for one shard in one refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRow {
    pub shard: ShardId,
    /// The leading replica's node, its term and applied index (`None`: no
    /// answering replica leads).
    pub leader: Option<LeaderView>,
    /// Replicas that answered / members the answering replicas name.
    pub answered: usize,
    pub members: usize,
    /// Largest `leader applied - replica applied` among answering replicas.
    pub max_lag_entries: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LeaderView {
    pub node: u64,
    pub term: u64,
    pub applied_index: u64,
    /// Entries applied per second at the leader since the last refresh
    /// (`None` on the first refresh or after a leader change).
    pub applied_per_s: Option<f64>,
    pub fill_percent: Option<f64>,
}

/// The leader and applied index a shard had at the previous refresh.
pub type Previous = BTreeMap<ShardId, (Instant, u64, u64)>;

/// Every shard's row from `(node, status)` pairs (pure, given `now`);
/// updates `previous` for the next refresh.
pub fn shard_rows(
    statuses: &[(u64, ShardStatus)],
    previous: &mut Previous,
    now: Instant,
) -> Vec<ShardRow> {
    let leaders = leaders_of(statuses.iter().map(|(node, s)| (*node, s)));
    let mut by_shard: BTreeMap<ShardId, Vec<&ShardStatus>> = BTreeMap::new();
    for (_, status) in statuses {
        by_shard.entry(status.shard).or_default().push(status);
    }
    by_shard
        .into_iter()
        .map(|(shard, replicas)| {
            let leader = leaders.get(&shard).and_then(|&(_, node)| {
                let status = statuses
                    .iter()
                    .find(|(n, s)| *n == node && s.shard == shard)
                    .map(|(_, s)| s)?;
                Some(leader_view(node, status, previous, now))
            });
            let members = replicas.iter().map(|s| s.members.len()).max().unwrap_or(0);
            let max_lag_entries = leader.as_ref().map(|l| {
                replicas
                    .iter()
                    .map(|s| l.applied_index.saturating_sub(s.applied_index))
                    .max()
                    .unwrap_or(0)
            });
            ShardRow {
                shard,
                leader,
                answered: replicas.len(),
                members,
                max_lag_entries,
            }
        })
        .collect()
}

fn leader_view(
    node: u64,
    status: &ShardStatus,
    previous: &mut Previous,
    now: Instant,
) -> LeaderView {
    let applied_per_s = previous
        .get(&status.shard)
        .filter(|&&(_, was_node, was_applied)| {
            was_node == node && status.applied_index >= was_applied
        })
        .map(|&(at, _, was_applied)| {
            let secs = now
                .duration_since(at)
                .max(Duration::from_millis(1))
                .as_secs_f64();
            (status.applied_index - was_applied) as f64 / secs
        });
    previous.insert(status.shard, (now, node, status.applied_index));
    LeaderView {
        node,
        term: status.term,
        applied_index: status.applied_index,
        applied_per_s,
        fill_percent: fill_percent(&status.region),
    }
}

/// The shard table, below the node table.
pub fn render_shards(rows: &[ShardRow]) -> String {
    let mut table = Table::new([
        "SHARD",
        "LEADER",
        "TERM",
        "APPLIED",
        "ENTRIES/s",
        "REPLICAS",
        "MAX LAG",
        "FILL",
    ]);
    for row in rows {
        let dash = || "-".to_owned();
        let leader = row.leader.as_ref();
        table.row([
            row.shard.to_string(),
            leader.map_or_else(dash, |l| l.node.to_string()),
            leader.map_or_else(dash, |l| l.term.to_string()),
            leader.map_or_else(dash, |l| l.applied_index.to_string()),
            leader
                .and_then(|l| l.applied_per_s)
                .map_or_else(dash, |r| format!("{r:.0}")),
            format!("{}/{}", row.answered, row.members),
            row.max_lag_entries.map_or_else(dash, |l| l.to_string()),
            percent_cell(leader.and_then(|l| l.fill_percent)),
        ]);
    }
    let led = rows.iter().filter(|r| r.leader.is_some()).count();
    format!(
        "{} shards - {led} with a leader answering\n{}",
        rows.len(),
        table.render()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkv_proto::wire::{RegionFill, Role};

    fn status(shard: u32, role: Role, term: u64, applied: u64) -> ShardStatus {
        ShardStatus {
            shard: ShardId(shard),
            role,
            term,
            leader_id: None,
            members: vec![1, 2, 3],
            last_log_index: applied,
            commit_index: applied,
            applied_index: applied,
            region: RegionFill {
                capacity_bytes: 1000,
                used_bytes: 250,
                pending_reclaim_bytes: 0,
                live_keys: 3,
            },
        }
    }

    #[test]
    fn a_shard_row_is_its_leaders_view_and_its_replicas_lag() {
        let t0 = Instant::now();
        let mut previous = Previous::new();
        let first = [
            (1, status(0, Role::Leader, 3, 100)),
            (2, status(0, Role::Follower, 3, 98)),
            (2, status(1, Role::Follower, 2, 40)),
        ];
        let rows = shard_rows(&first, &mut previous, t0);
        assert_eq!(rows.len(), 2);
        let leader = rows[0].leader.as_ref().expect("shard 0 has a leader");
        assert_eq!(
            (leader.node, leader.term, leader.applied_index),
            (1, 3, 100)
        );
        assert_eq!(leader.applied_per_s, None, "no interval yet");
        assert_eq!(leader.fill_percent, Some(25.0));
        assert_eq!((rows[0].answered, rows[0].members), (2, 3));
        assert_eq!(rows[0].max_lag_entries, Some(2));
        // Shard 1: no replica answering leads it.
        assert_eq!(rows[1].leader, None);
        assert_eq!(rows[1].max_lag_entries, None);

        let later = [
            (1, status(0, Role::Leader, 3, 300)),
            (2, status(0, Role::Follower, 3, 300)),
        ];
        let rows = shard_rows(&later, &mut previous, t0 + Duration::from_secs(2));
        let leader = rows[0].leader.as_ref().expect("shard 0 has a leader");
        assert_eq!(leader.applied_per_s, Some(100.0));
        assert_eq!(rows[0].max_lag_entries, Some(0));

        // A new leader (higher term, other node) starts its rate afresh.
        let moved = [
            (1, status(0, Role::Follower, 4, 310)),
            (3, status(0, Role::Leader, 4, 320)),
        ];
        let rows = shard_rows(&moved, &mut previous, t0 + Duration::from_secs(3));
        let leader = rows[0].leader.as_ref().expect("shard 0 has a leader");
        assert_eq!((leader.node, leader.applied_per_s), (3, None));
    }

    #[test]
    fn the_table_names_every_shard_and_its_leader() {
        let mut previous = Previous::new();
        let rows = shard_rows(
            &[
                (2, status(0, Role::Leader, 1, 7)),
                (3, status(5, Role::Follower, 1, 7)),
            ],
            &mut previous,
            Instant::now(),
        );
        let text = render_shards(&rows);
        assert!(
            text.starts_with("2 shards - 1 with a leader answering"),
            "{text}"
        );
        for header in [
            "SHARD",
            "LEADER",
            "ENTRIES/s",
            "REPLICAS",
            "MAX LAG",
            "FILL",
        ] {
            assert!(text.contains(header), "no {header}: {text}");
        }
        assert!(text.contains("| 0     | 2      | 1    | 7 "), "{text}");
        assert!(text.contains("| 5     | -      |"), "{text}");
    }
}
