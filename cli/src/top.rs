//! `rdkvctl top`: every member's role, term, applied index, lag, traffic,
//! latency, errors and region fill, refreshed every interval.
//!
//! Rates come from the difference of two `endpoint status` answers (request
//! counters per op), so a node's figures cover exactly the last interval;
//! p99 is the node's own recent window (10-20 s). On a terminal the screen
//! is redrawn in place; otherwise each refresh is printed after the
//! previous one (like `top -b`), so it can be logged or piped. On a
//! multi-shard cluster a table per shard follows (`top_shards`).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkv_client::{Client, NodeStatus, OpStats, Role};
use rdkv_proto::wire::ShardStatus;

use crate::output::Table;
use crate::views::{fill_percent, role_name};
use crate::{shards, top_shards};

/// What `top` shows for one member in one refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    pub id: u64,
    pub endpoint: String,
    /// `None`: the member did not answer this time.
    pub status: Option<Live>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub role: Role,
    pub term: u64,
    pub applied_index: u64,
    /// Entries behind the leader's applied index (`None`: leader unknown).
    pub lag_entries: Option<u64>,
    /// Requests per second by column (get+mget, put+mput+cas+update, delete+clear, scan), over the interval.
    pub rates: Rates,
    /// Highest recent p99 of the data ops, in µs.
    pub p99_us: u64,
    /// Errors / requests over the interval, in percent (`None`: no requests).
    pub error_percent: Option<f64>,
    pub fill_percent: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub get: f64,
    pub put: f64,
    pub del: f64,
    pub scan: f64,
}

fn column(op: &str) -> Option<usize> {
    match op {
        "get" | "mget" => Some(0),
        "put" | "mput" | "update" | "cas" => Some(1),
        "delete" | "clear" => Some(2),
        "scan" => Some(3),
        _ => None,
    }
}

fn counts(ops: &[OpStats]) -> BTreeMap<&str, (u64, u64)> {
    ops.iter()
        .map(|o| (o.op.as_str(), (o.requests, o.errors)))
        .collect()
}

/// One member's row from its previous and current status (pure).
pub fn live(
    previous: Option<&NodeStatus>,
    now: &NodeStatus,
    elapsed: Duration,
    leader_applied: Option<u64>,
) -> Live {
    let before = previous.map(|p| counts(&p.ops)).unwrap_or_default();
    let secs = elapsed.as_secs_f64().max(1e-3);
    let mut per_column = [0u64; 4];
    let (mut requests, mut errors) = (0u64, 0u64);
    for op in &now.ops {
        let Some(col) = column(&op.op) else { continue };
        let (r0, e0) = before.get(op.op.as_str()).copied().unwrap_or((0, 0));
        // A restarted node starts from zero: count from there.
        let (dr, de) = if op.requests >= r0 {
            (op.requests - r0, op.errors.saturating_sub(e0))
        } else {
            (op.requests, op.errors)
        };
        per_column[col] += dr;
        requests += dr;
        errors += de;
    }
    let rate = |n: u64| {
        if previous.is_some() {
            n as f64 / secs
        } else {
            0.0
        }
    };
    Live {
        role: now.role,
        term: now.term,
        applied_index: now.applied_index,
        lag_entries: leader_applied.map(|l| l.saturating_sub(now.applied_index)),
        rates: Rates {
            get: rate(per_column[0]),
            put: rate(per_column[1]),
            del: rate(per_column[2]),
            scan: rate(per_column[3]),
        },
        p99_us: now
            .ops
            .iter()
            .filter(|o| column(&o.op).is_some())
            .map(|o| o.recent_p99_us)
            .max()
            .unwrap_or(0),
        error_percent: (previous.is_some() && requests > 0)
            .then(|| errors as f64 * 100.0 / requests as f64),
        fill_percent: fill_percent(&now.region).unwrap_or(0.0),
    }
}

fn latency(us: u64) -> String {
    match us {
        0 => "-".to_owned(),
        us if us < 1000 => format!("{us}us"),
        us if us < 1_000_000 => format!("{:.1}ms", us as f64 / 1000.0),
        us => format!("{:.1}s", us as f64 / 1e6),
    }
}

pub fn render(rows: &[TopRow], at: &str) -> String {
    let mut table = Table::new([
        "ID", "ENDPOINT", "ROLE", "TERM", "APPLIED", "LAG", "GET/s", "PUT/s", "DEL/s", "SCAN/s",
        "P99", "ERR%", "FILL%",
    ]);
    for row in rows {
        match &row.status {
            None => table.row([
                row.id.to_string(),
                row.endpoint.clone(),
                "unreachable".to_owned(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
            Some(s) => table.row([
                row.id.to_string(),
                row.endpoint.clone(),
                role_name(s.role).to_owned(),
                s.term.to_string(),
                s.applied_index.to_string(),
                s.lag_entries
                    .map_or_else(|| "-".to_owned(), |l| l.to_string()),
                format!("{:.0}", s.rates.get),
                format!("{:.0}", s.rates.put),
                format!("{:.0}", s.rates.del),
                format!("{:.0}", s.rates.scan),
                latency(s.p99_us),
                s.error_percent
                    .map_or_else(|| "-".to_owned(), |e| format!("{e:.1}")),
                format!("{:.1}", s.fill_percent),
            ]),
        }
    }
    let leader = rows
        .iter()
        .find(|r| r.status.as_ref().is_some_and(|s| s.role == Role::Leader));
    let summary = match leader {
        Some(l) => format!("leader {} ({})", l.id, l.endpoint),
        None => "no leader answering".to_owned(),
    };
    format!(
        "rdkv top - {at} - {} members - {summary}\n{}",
        rows.len(),
        table.render()
    )
}

/// One node's answers in one refresh.
struct Answer {
    id: u64,
    endpoint: String,
    status: Option<NodeStatus>,
    /// The shard replicas it hosts (asked on a multi-shard cluster only).
    shards: Vec<ShardStatus>,
    at: Instant,
}

/// The nodes `top` asks and whether the cluster has several shards: on a
/// multi-shard cluster the map's nodes (the members `Members` lists are the
/// primary shard's only), else the group's members.
async fn targets(client: &Client) -> Result<(Vec<(u64, String)>, bool)> {
    if let Ok(map) = shards::fetch_map(client).await
        && map.shards().len() > 1
    {
        let nodes = map
            .nodes()
            .iter()
            .filter_map(|n| Some((n.id, n.client_addr.clone()?)))
            .collect();
        return Ok((nodes, true));
    }
    let members = client.members().await.context("listing members failed")?;
    let nodes = members.into_iter().map(|m| (m.id, m.client_addr)).collect();
    Ok((nodes, false))
}

/// Asks every node at once, each within `interval`; sorted by node id.
async fn ask_all(
    client: &Client,
    nodes: Vec<(u64, String)>,
    sharded: bool,
    interval: Duration,
) -> Vec<Answer> {
    let mut asks = tokio::task::JoinSet::new();
    for (id, endpoint) in nodes {
        let client = client.clone();
        asks.spawn(async move {
            let ask = async {
                let status = client.status_of(&endpoint).await.ok();
                let shards = if sharded {
                    client
                        .shard_statuses_of(&endpoint)
                        .await
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                (status, shards)
            };
            let (status, shards) = tokio::time::timeout(interval, ask)
                .await
                .unwrap_or_default();
            Answer {
                id,
                endpoint,
                status,
                shards,
                at: Instant::now(),
            }
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = asks.join_next().await {
        answers.extend(answer.ok());
    }
    answers.sort_by_key(|a| a.id);
    answers
}

/// The node rows of one refresh; `previous` keeps each node's last status.
fn node_rows(
    answers: &mut [Answer],
    previous: &mut BTreeMap<u64, (Instant, NodeStatus)>,
    interval: Duration,
) -> Vec<TopRow> {
    let leader_applied = answers
        .iter()
        .filter_map(|a| a.status.as_ref())
        .find(|s| s.role == Role::Leader)
        .map(|s| s.applied_index);
    answers
        .iter_mut()
        .map(|a| {
            let status = a.status.take().map(|now| {
                let before = previous.get(&a.id);
                let elapsed = before.map_or(interval, |(t, _)| a.at.duration_since(*t));
                let row = live(before.map(|(_, s)| s), &now, elapsed, leader_applied);
                previous.insert(a.id, (a.at, now));
                row
            });
            TopRow {
                id: a.id,
                endpoint: a.endpoint.clone(),
                status,
            }
        })
        .collect()
}

/// Refreshes every `interval` until Ctrl-C, or `iterations` times.
pub async fn run(client: &Client, interval: Duration, iterations: Option<u64>) -> Result<()> {
    let terminal = std::io::stdout().is_terminal();
    let mut previous: BTreeMap<u64, (Instant, NodeStatus)> = BTreeMap::new();
    let mut previous_shards = top_shards::Previous::new();
    let mut done = 0u64;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let (nodes, sharded) = targets(client).await?;
        let mut answers = ask_all(client, nodes, sharded, interval).await;
        let mut text = render(
            &node_rows(&mut answers, &mut previous, interval),
            &clock_utc(),
        );
        if sharded {
            // A node's status is its first hosted shard's replica: say so.
            text = text.replacen(
                " members - ",
                " nodes (role, term, applied: each node's first shard) - ",
                1,
            );
            let statuses: Vec<(u64, ShardStatus)> = answers
                .into_iter()
                .flat_map(|a| a.shards.into_iter().map(move |s| (a.id, s)))
                .collect();
            let rows = top_shards::shard_rows(&statuses, &mut previous_shards, Instant::now());
            text = format!("{text}\n{}", top_shards::render_shards(&rows));
        }
        let mut out = std::io::stdout().lock();
        if terminal {
            // Home, clear: redraw in place.
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
        done += 1;
        if iterations.is_some_and(|n| done >= n) {
            break;
        }
    }
    Ok(())
}

/// The time of day as `HH:MM:SS UTC` (no date library needed).
fn clock_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        day % 3600 / 60,
        day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkv_tests::fake_server::node_status;

    fn status(ops: &[(&str, u64, u64, u64)], applied: u64) -> NodeStatus {
        NodeStatus {
            last_log_index: applied,
            commit_index: applied,
            applied_index: applied,
            ops: ops
                .iter()
                .map(|&(op, requests, errors, p99)| OpStats {
                    op: op.into(),
                    requests,
                    errors,
                    recent_p99_us: p99,
                })
                .collect(),
            ..node_status(2, Role::Follower)
        }
    }

    #[test]
    fn rates_errors_and_lag_come_from_the_interval() {
        let before = status(&[("get", 100, 0, 50), ("put", 10, 0, 900)], 90);
        let now = status(
            &[
                ("get", 300, 0, 60),
                ("put", 30, 4, 1200),
                ("status", 99, 0, 5),
            ],
            100,
        );
        let row = live(Some(&before), &now, Duration::from_secs(2), Some(105));
        assert_eq!(row.rates.get, 100.0);
        assert_eq!(row.rates.put, 10.0);
        assert_eq!(row.rates.del, 0.0);
        // 4 errors in 220 data requests; admin requests are not traffic.
        assert!((row.error_percent.unwrap() - 4.0 * 100.0 / 220.0).abs() < 1e-9);
        assert_eq!(row.p99_us, 1200);
        assert_eq!(row.lag_entries, Some(5));
        assert_eq!(row.fill_percent, 12.5);
        // The first refresh has no interval: no rates, no error rate.
        let first = live(None, &now, Duration::from_secs(1), None);
        assert_eq!(first.rates, Rates::default());
        assert_eq!(first.error_percent, None);
        assert_eq!(first.lag_entries, None);
    }

    #[test]
    fn a_restarted_node_counts_from_zero() {
        let before = status(&[("get", 1000, 0, 0)], 5);
        let now = status(&[("get", 40, 0, 0)], 5);
        let row = live(Some(&before), &now, Duration::from_secs(1), Some(5));
        assert_eq!(row.rates.get, 40.0);
    }

    #[test]
    fn render_shows_every_member_and_the_leader() {
        let rows = vec![
            TopRow {
                id: 1,
                endpoint: "h1:7379".into(),
                status: Some(Live {
                    role: Role::Leader,
                    term: 2,
                    applied_index: 10,
                    lag_entries: Some(0),
                    rates: Rates {
                        get: 1500.4,
                        ..Rates::default()
                    },
                    p99_us: 2500,
                    error_percent: Some(0.0),
                    fill_percent: 12.5,
                }),
            },
            TopRow {
                id: 2,
                endpoint: "h2:7379".into(),
                status: None,
            },
        ];
        let text = render(&rows, "12:00:00 UTC");
        assert!(text.starts_with("rdkv top - 12:00:00 UTC - 2 members - leader 1 (h1:7379)"));
        assert!(text.contains("| 1  | h1:7379  | leader "), "{text}");
        assert!(text.contains("1500"), "{text}");
        assert!(text.contains("2.5ms"), "{text}");
        assert!(text.contains("unreachable"), "{text}");
    }
}
