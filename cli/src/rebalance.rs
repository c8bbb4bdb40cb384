//! `rdkvctl rebalance` (docs/sharding.md, section 8): replicas first, then
//! leaders. The replica plan (`proto::shard::replica_moves`: every node
//! at floor or ceil of replicas / nodes) is carried out one move at a
//! time, each `shard move-replica`'s routed `MoveReplica` (its `NotLeader`
//! redirect followed when the source leads); each move waits until the
//! map shows the members the move before it left. Then the state is read
//! again and the leaders are evened (`proto::shard::leader_moves`) as
//! `shard move-leader` moves them. Run again, it finds nothing to move.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::Client;
use rdkv_proto::shard::{
    LeaderMove, ReplicaMove, ShardId, ShardLeadership, after_replica_moves, leader_bound,
    leader_moves, replica_bounds, replica_moves, replicas_per_node,
};

use crate::output::{Json, View, lines};
use crate::shards::{ShardsState, move_leader, move_replica};

/// How long the map may take to show a finished replica move's members
/// (the move published them through the metadata group before it
/// answered; the node asked may apply that version a moment later).
const MAP_CATCH_UP: Duration = Duration::from_secs(20);
/// Pause between two reads of the map while it catches up.
const MAP_POLL: Duration = Duration::from_millis(100);

/// `rebalance`: the moves made (or planned, `--dry-run`), and each node's
/// replica and led counts after them.
pub struct RebalanceView {
    pub dry_run: bool,
    /// Floor and ceil of replicas / nodes.
    pub replica_bounds: (usize, usize),
    pub replica_moves: Vec<ReplicaMove>,
    /// Node -> replicas it hosts after the moves.
    pub replicas: BTreeMap<u64, usize>,
    /// The most shards a node should lead: ceil(shards / nodes).
    pub bound: usize,
    pub moves: Vec<LeaderMove>,
    /// Node -> shards it leads after the moves.
    pub spread: BTreeMap<u64, usize>,
}

impl RebalanceView {
    /// The view of `moves` made after `replica_moves`, which left `shards`.
    fn of(
        dry_run: bool,
        nodes: &[u64],
        shards: &[ShardLeadership],
        replica_moves: Vec<ReplicaMove>,
        moves: Vec<LeaderMove>,
    ) -> RebalanceView {
        let replicas = replicas_per_node(shards, nodes);
        let total = replicas.values().sum();
        let mut leaders: BTreeMap<ShardId, u64> = shards
            .iter()
            .filter_map(|s| s.leader.map(|l| (s.shard, l)))
            .collect();
        for m in &moves {
            leaders.insert(m.shard, m.to);
        }
        let mut spread: BTreeMap<u64, usize> = nodes.iter().map(|&n| (n, 0)).collect();
        for leader in leaders.values() {
            *spread.entry(*leader).or_default() += 1;
        }
        RebalanceView {
            dry_run,
            replica_bounds: replica_bounds(total, replicas.len()),
            replica_moves,
            replicas,
            bound: leader_bound(shards.len(), nodes.len()),
            moves,
            spread,
        }
    }

    fn replicas_line(&self) -> String {
        let (floor, ceil) = self.replica_bounds;
        let counts = self
            .replicas
            .iter()
            .map(|(node, n)| format!("node {node} hosts {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let balanced = self.replicas.values().all(|n| (floor..=ceil).contains(n));
        let state = if balanced { "balanced" } else { "not balanced" };
        format!("replicas {state} ({floor} to {ceil} per node): {counts}")
    }

    fn leaders_line(&self) -> String {
        let counts = self
            .spread
            .iter()
            .map(|(node, led)| format!("node {node} leads {led}"))
            .collect::<Vec<_>>()
            .join(", ");
        let balanced = self.spread.values().all(|&led| led <= self.bound);
        let state = if balanced { "balanced" } else { "not balanced" };
        format!(
            "leaders {state} (at most {} per node): {counts}",
            self.bound
        )
    }
}

fn move_json(shard: ShardId, from: u64, to: u64) -> Json {
    Json::obj([
        ("shard", Json::U64(u64::from(shard.0))),
        ("from", Json::U64(from)),
        ("to", Json::U64(to)),
    ])
}

fn per_node_json(counts: &BTreeMap<u64, usize>) -> Json {
    Json::obj(
        counts
            .iter()
            .map(|(node, n)| (node.to_string(), Json::U64(*n as u64))),
    )
}

impl View for RebalanceView {
    fn simple(&self) -> String {
        let verb = if self.dry_run { "would move" } else { "moved" };
        let replica_moves = self
            .replica_moves
            .iter()
            .map(|m| format!("{verb} shard {} replica {} -> {}", m.shard, m.from, m.to));
        let moves = self
            .moves
            .iter()
            .map(|m| format!("{verb} shard {} leader {} -> {}", m.shard, m.from, m.to));
        let summary = [self.replicas_line(), self.leaders_line()];
        let summary = summary.into_iter().map(|line| match self.dry_run {
            true => format!("planned: {line}"),
            false => line,
        });
        lines(replica_moves.chain(moves).chain(summary))
    }

    fn json(&self) -> Json {
        let (floor, ceil) = self.replica_bounds;
        Json::obj([
            ("dry_run", Json::Bool(self.dry_run)),
            (
                "replica_bounds",
                Json::obj([
                    ("min", Json::U64(floor as u64)),
                    ("max", Json::U64(ceil as u64)),
                ]),
            ),
            (
                "replica_moves",
                Json::Arr(
                    self.replica_moves
                        .iter()
                        .map(|m| move_json(m.shard, m.from, m.to))
                        .collect(),
                ),
            ),
            ("replicas_per_node", per_node_json(&self.replicas)),
            ("bound", Json::U64(self.bound as u64)),
            (
                "moves",
                Json::Arr(
                    self.moves
                        .iter()
                        .map(|m| move_json(m.shard, m.from, m.to))
                        .collect(),
                ),
            ),
            ("leaders_per_node", per_node_json(&self.spread)),
        ])
    }
}

/// Plans the replica moves from the cluster's state and carries them out
/// one at a time, reads the state again, then plans and makes the leader
/// moves; with `dry_run` only plans both (the leader plan from the
/// members the replica plan leaves).
pub async fn rebalance(client: &Client, dry_run: bool) -> Result<RebalanceView> {
    let state = ShardsState::gather(client).await?;
    let nodes = state.node_ids();
    let shards = state.leaderships();
    let replica_plan = replica_moves(&shards, &nodes);
    if dry_run {
        let planned = after_replica_moves(&shards, &replica_plan);
        let moves = leader_moves(&planned, &nodes);
        return Ok(RebalanceView::of(
            true,
            &nodes,
            &planned,
            replica_plan,
            moves,
        ));
    }
    let state = move_replicas(client, state, &replica_plan).await?;
    let nodes = state.node_ids();
    let shards = state.leaderships();
    let moves = leader_moves(&shards, &nodes);
    for m in &moves {
        move_leader(client, &state, m.shard, m.to).await?;
    }
    Ok(RebalanceView::of(
        false,
        &nodes,
        &shards,
        replica_plan,
        moves,
    ))
}

/// Makes the replica moves of `plan` one at a time from `state`, each
/// once the map shows the members the one before left; the state after
/// the last.
async fn move_replicas(
    client: &Client,
    mut state: ShardsState,
    plan: &[ReplicaMove],
) -> Result<ShardsState> {
    let mut expected = state.leaderships();
    for (done, m) in plan.iter().enumerate() {
        move_replica(client, &state, m.shard, (m.from, m.to))
            .await
            .with_context(|| format!("after {done} of the plan's {} replica moves", plan.len()))?;
        expected = after_replica_moves(&expected, &[*m]);
        state = showing_members(client, &expected).await?;
    }
    Ok(state)
}

/// The cluster's state once its map shows every shard of `expected` with
/// those members (in any order); fails after [`MAP_CATCH_UP`].
async fn showing_members(client: &Client, expected: &[ShardLeadership]) -> Result<ShardsState> {
    let deadline = Instant::now() + MAP_CATCH_UP;
    loop {
        let state = ShardsState::gather(client).await?;
        let Some((shard, wanted, shown)) = first_difference(&state, expected) else {
            return Ok(state);
        };
        if Instant::now() >= deadline {
            bail!(
                "after {MAP_CATCH_UP:?} the shard map (version {}) shows shard {shard} with \
                 members {shown:?}, the replica moves made {wanted:?} (run rebalance again)",
                state.map.version()
            );
        }
        tokio::time::sleep(MAP_POLL).await;
    }
}

/// The first shard of `expected` whose members the map does not show:
/// its id, the members expected and those shown (both sorted).
fn first_difference(
    state: &ShardsState,
    expected: &[ShardLeadership],
) -> Option<(ShardId, Vec<u64>, Vec<u64>)> {
    expected.iter().find_map(|s| {
        let mut wanted = s.members.clone();
        wanted.sort_unstable();
        let mut shown = state
            .map
            .shard(s.shard)
            .map(|info| info.members.clone())
            .unwrap_or_default();
        shown.sort_unstable();
        (wanted != shown).then_some((s.shard, wanted, shown))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: u32, members: &[u64], leader: u64) -> ShardLeadership {
        ShardLeadership {
            shard: ShardId(id),
            members: members.to_vec(),
            leader: Some(leader),
        }
    }

    /// Shard 0 moved 1 -> 3: node 3 hosts three replicas and leads two
    /// shards, node 1 hosts one and leads none.
    fn skewed() -> (Vec<u64>, Vec<ShardLeadership>) {
        let shards = vec![
            shard(0, &[3, 2], 3),
            shard(1, &[2, 3], 2),
            shard(2, &[3, 1], 3),
        ];
        (vec![1, 2, 3], shards)
    }

    #[test]
    fn the_view_reports_replica_and_leader_moves_and_counts() {
        let (nodes, shards) = skewed();
        let replica_plan = replica_moves(&shards, &nodes);
        let after = after_replica_moves(&shards, &replica_plan);
        let moves = leader_moves(&after, &nodes);
        let view = RebalanceView::of(false, &nodes, &after, replica_plan, moves);
        assert_eq!(
            view.simple(),
            "moved shard 1 replica 3 -> 1\n\
             moved shard 2 leader 3 -> 1\n\
             replicas balanced (2 to 2 per node): node 1 hosts 2, node 2 hosts 2, node 3 hosts 2\n\
             leaders balanced (at most 1 per node): node 1 leads 1, node 2 leads 1, node 3 leads 1"
        );
        let json = view.json().to_string();
        for key in [
            r#""dry_run":false"#,
            r#""replica_bounds":{"min":2,"max":2}"#,
            r#""replica_moves":[{"shard":1,"from":3,"to":1}]"#,
            r#""replicas_per_node":{"1":2,"2":2,"3":2}"#,
            r#""bound":1"#,
            r#""moves":[{"shard":2,"from":3,"to":1}]"#,
            r#""leaders_per_node":{"1":1,"2":1,"3":1}"#,
        ] {
            assert!(json.contains(key), "{key} not in {json}");
        }
    }

    #[test]
    fn a_dry_run_says_what_it_would_move() {
        let (nodes, shards) = skewed();
        let replica_plan = replica_moves(&shards, &nodes);
        let after = after_replica_moves(&shards, &replica_plan);
        let moves = leader_moves(&after, &nodes);
        let view = RebalanceView::of(true, &nodes, &after, replica_plan, moves);
        let text = view.simple();
        assert!(
            text.starts_with("would move shard 1 replica 3 -> 1\nwould move shard 2 leader"),
            "{text}"
        );
        assert!(text.contains("\nplanned: replicas balanced"), "{text}");
        assert!(view.json().to_string().contains(r#""dry_run":true"#));
    }
}
