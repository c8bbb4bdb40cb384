//! What operators see: `/metrics` (valid Prometheus text whose counters move
//! by exactly the operations done), follower lag, one-sided reads reported
//! by clients, `/health` through a partition, and `rdkvctl top` in a
//! terminal.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_client::{Client, ClientOptions, Consistency, Transport};
use rdkv_tests::prometheus::{Exposition, http_get};
use rdkv_tests::{Cluster, Intent, binary, check_with_leader, client_options, eventually};

/// The labels of a single group's Raft and region gauges.
const SHARD_0: &[(&str, &str)] = &[("shard", "0")];

async fn health(cluster: &Cluster, id: u64) -> Result<(u16, String)> {
    let addr = cluster.node(id)?.http_addr;
    tokio::task::spawn_blocking(move || http_get(addr, "/health")).await?
}

/// A client of node `id` (requests enter there) over `transport`.
fn client(cluster: &Cluster, id: u64, transport: Transport) -> Result<Client> {
    cluster.client_with(
        Intent::Via(&[id]),
        ClientOptions {
            transport,
            request_timeout: Duration::from_secs(5),
            ..client_options(None)
        },
    )
}

/// `after - before` of one sample (absent counts as 0).
fn moved(before: &Exposition, after: &Exposition, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.get(name, labels).unwrap_or(0.0) - before.get(name, labels).unwrap_or(0.0)
}

/// Waits until the leader's own proposals after its election (the cluster's
/// settings: hash seed, then quota) are applied, so that none lands among a
/// test's counted operations.
async fn settings_applied(cluster: &Cluster, leader: u64) -> Result<()> {
    eventually(
        Duration::from_secs(15),
        "the quota is applied",
        async || {
            let status = cluster.status_of(leader).await?;
            ensure!(status.quota.quota_bytes.is_some(), "no quota applied yet");
            Ok(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_operation_and_report_follower_lag() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        let follower = (1..=3).find(|&id| id != leader).context("no follower")?;
        // TCP only: every GET is a request the server counts.
        let tcp = client(cluster, leader, Transport::Tcp)?;
        tcp.put("warm", "up").await?;
        // The count below must not include them.
        settings_applied(cluster, leader).await?;

        let before = cluster.metrics_of(leader).await?;
        let before_follower = cluster.metrics_of(follower).await?;
        const PUTS: u64 = 40;
        const GETS: u64 = 25;
        const DELETES: u64 = 10;
        const SCANS: u64 = 3;
        const TOO_LARGE: u64 = 2;
        for i in 0..PUTS {
            tcp.put(format!("k{i}"), "v").await?;
        }
        for i in 0..GETS {
            tcp.get_with(format!("k{i}"), Consistency::Linearizable)
                .await?;
        }
        for i in 0..DELETES {
            tcp.delete(format!("k{i}")).await?;
        }
        for _ in 0..SCANS {
            tcp.scan("k", 10).await?;
        }
        let big_key = "x".repeat(2000);
        for _ in 0..TOO_LARGE {
            ensure!(
                tcp.put(big_key.clone(), "v").await.is_err(),
                "a 2000-byte key was accepted"
            );
        }
        // Follower reads served by the follower itself.
        let at_follower = client(cluster, follower, Transport::Tcp)?;
        const FOLLOWER_GETS: u64 = 7;
        for i in 0..FOLLOWER_GETS {
            at_follower
                .get_with(
                    format!("k{i}"),
                    Consistency::Follower {
                        max_lag_entries: u64::MAX,
                    },
                )
                .await?;
        }
        let after = cluster.metrics_of(leader).await?;
        let after_follower = cluster.metrics_of(follower).await?;

        let tcp_op = |op: &'static str| [("op", op), ("transport", "tcp")];
        for (op, n) in [
            ("put", PUTS + TOO_LARGE),
            ("get", GETS),
            ("delete", DELETES),
            ("scan", SCANS),
        ] {
            let counted = moved(&before, &after, "rdkv_requests_total", &tcp_op(op));
            ensure!(
                counted == n as f64,
                "{op}: {counted} counted for {n} requests"
            );
            let timed = moved(
                &before,
                &after,
                "rdkv_request_duration_seconds_count",
                &[("op", op)],
            );
            ensure!(
                timed == n as f64,
                "{op}: {timed} latencies for {n} requests"
            );
        }
        let errors = moved(
            &before,
            &after,
            "rdkv_request_errors_total",
            &[
                ("op", "put"),
                ("transport", "tcp"),
                ("code", "key_too_large"),
            ],
        );
        ensure!(errors == TOO_LARGE as f64, "{errors} key_too_large errors");
        let on_follower = moved(
            &before_follower,
            &after_follower,
            "rdkv_requests_total",
            &tcp_op("get"),
        );
        ensure!(
            on_follower == FOLLOWER_GETS as f64,
            "follower counted {on_follower} GETs"
        );
        // The writes reached the log: PUTS + DELETES entries.
        let log_moved = moved(&before, &after, "rdkv_raft_last_log_index", SHARD_0);
        ensure!(
            log_moved == (PUTS + DELETES) as f64,
            "the log grew by {log_moved} entries"
        );
        ensure!(after.get("rdkv_raft_is_leader", SHARD_0) == Some(1.0));
        ensure!(after_follower.get("rdkv_raft_is_leader", SHARD_0) == Some(0.0));
        ensure!(after.get("rdkv_region_live_keys", SHARD_0) == Some((PUTS - DELETES + 1) as f64));
        ensure!(
            after.sum("rdkv_raft_log_fsync_duration_seconds_count", &[]) > 0.0,
            "no fsync recorded"
        );
        // The write path's stages, from RaftCore: every write waits for its
        // fsync, so neither the median from submitted to persisted nor that
        // of the whole path can be 0. (Each is an interpolated estimate of
        // its own histogram, so they are not compared with each other.)
        let stage = |name: &'static str| {
            after.get(
                "rdkv_raft_stage_latency_microseconds",
                &[("shard", "0"), ("stage", name), ("quantile", "0.5")],
            )
        };
        let persisted = stage("submitted_to_persisted").context("no fsync stage")?;
        let whole = stage("proposed_to_applied").context("no whole-path stage")?;
        ensure!(
            persisted > 0.0 && whole > 0.0,
            "stages: fsync {persisted} us, whole {whole} us"
        );

        // The Grafana dashboard reads only metrics that exist.
        let dashboard = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana/rdkv.json"),
        )?;
        serde_json::from_str::<serde_json::Value>(&dashboard).context("dashboard JSON")?;
        let mut used = std::collections::BTreeSet::new();
        for (i, _) in dashboard.match_indices("rdkv_") {
            let name: String = dashboard[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used.insert(name);
        }
        ensure!(
            used.len() > 20,
            "the dashboard uses only {} metrics",
            used.len()
        );
        for name in &used {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| after.types.get(*base).is_some_and(|t| t == "histogram"))
                .unwrap_or(name);
            ensure!(
                after.types.contains_key(family),
                "the dashboard reads {name}, which the leader does not export"
            );
        }

        // Follower lag: reported by the leader for both followers; a frozen
        // follower falls behind by every write made meanwhile.
        for id in (1..=3).filter(|&id| id != leader) {
            let label = id.to_string();
            ensure!(
                after
                    .get(
                        "rdkv_raft_replication_lag_entries",
                        &[("shard", "0"), ("follower", &label)],
                    )
                    .is_some(),
                "no lag reported for follower {id}"
            );
        }
        ensure!(
            after_follower
                .samples
                .keys()
                .all(|(name, _)| name != "rdkv_raft_replication_lag_entries"),
            "a follower reports replication lag"
        );
        cluster.node_mut(follower)?.pause()?;
        let frozen = async {
            for i in 0..20 {
                tcp.put(format!("lag{i}"), "v").await?;
            }
            let label = follower.to_string();
            let lag = cluster
                .metrics_of(leader)
                .await?
                .get(
                    "rdkv_raft_replication_lag_entries",
                    &[("shard", "0"), ("follower", &label)],
                )
                .context("lag of the frozen follower")?;
            ensure!(lag >= 20.0, "frozen follower's lag is {lag}");
            Ok(())
        }
        .await;
        cluster.node_mut(follower)?.resume()?;
        frozen?;

        // One-sided reads never reach the server; the client reports them.
        let shm = client(cluster, leader, Transport::Shm)?;
        let before = cluster.metrics_of(leader).await?;
        const ONE_SIDED: u64 = 30;
        for i in 0..ONE_SIDED {
            shm.get(format!("k{i}")).await?;
        }
        let stats = shm.one_sided_stats().await;
        ensure!(stats.served == ONE_SIDED, "{stats:?}");
        shm.flush_read_reports().await;
        let client_reads = [("source", "client")];
        eventually(
            Duration::from_secs(5),
            "every one-sided read reported",
            async || {
                let after = cluster.metrics_of(leader).await?;
                let reported = moved(&before, &after, "rdkv_one_sided_reads_total", &client_reads);
                let gets = moved(&before, &after, "rdkv_requests_total", &tcp_op("get"));
                ensure!(gets == 0.0, "one-sided GETs reached the server: {gets}");
                ensure!(
                    reported == ONE_SIDED as f64,
                    "{reported} reads reported for {ONE_SIDED}"
                );
                Ok(())
            },
        )
        .await
    })
    .await
}

/// A follower's lease task rewrites its region header when the follower's
/// Raft role or applied state changes, and once a heartbeat interval; not on
/// every heartbeat it answers. Every linearizable read's ReadIndex round
/// sends each follower a heartbeat, thousands a second under a read load,
/// and openraft sends its whole metrics on each (issue 15: those wake-ups
/// cost the followers CPU). The task waits on the metrics' parts, which are
/// sent only when they change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_does_not_publish_its_lease_words_per_heartbeat() -> Result<()> {
    const HEARTBEAT_MS: u64 = 500;
    const READS: u64 = 400;
    let heartbeat_arg = HEARTBEAT_MS.to_string();
    // The heartbeats counted below come from the reads' ReadIndex rounds; a
    // read fence (on by default) confirms reads without them, so it is
    // off here.
    let mut cluster = Cluster::start_with_env(
        3,
        &["--heartbeat-ms", &heartbeat_arg],
        &[("RDKV_READ_FENCE", "false")],
    )?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        let follower = (1..=3).find(|&id| id != leader).context("no follower")?;
        let follower_label = follower.to_string();
        let to_follower = [("shard", "0"), ("peer", follower_label.as_str())];
        let tcp = client(cluster, leader, Transport::Tcp)?;
        tcp.put("k", "v").await?;
        settings_applied(cluster, leader).await?;
        // The follower applies the same entries before the count starts:
        // each applied entry is a change it publishes on.
        let applied = cluster.status_of(leader).await?.applied_index;
        cluster
            .wait_applied(follower, applied, Duration::from_secs(15))
            .await?;

        let started = std::time::Instant::now();
        let leader_before = cluster.metrics_of(leader).await?;
        let before = cluster.metrics_of(follower).await?;
        for _ in 0..READS {
            tcp.get_with("k", Consistency::Linearizable).await?;
        }
        let after = cluster.metrics_of(follower).await?;
        let leader_after = cluster.metrics_of(leader).await?;
        let intervals = started.elapsed().as_millis() as f64 / HEARTBEAT_MS as f64;

        // Once per interval begun, plus one for each change this window may
        // hold (a tick at either end, the leader's commit index moving).
        // The task publishes once as it starts: the series is there, and a
        // count that moved by nothing is a count.
        ensure!(
            after.get("rdkv_lease_publishes_total", SHARD_0).is_some(),
            "the follower shows no rdkv_lease_publishes_total{{shard=\"0\"}}"
        );
        let published = moved(&before, &after, "rdkv_lease_publishes_total", SHARD_0);
        let allowed = intervals.ceil() + 4.0;
        // Each read had its own round, and each round a heartbeat to every
        // follower (the leader's appends to it, all empty, as no write ran),
        // but a heartbeat still in flight when the next round starts stands
        // for both: a round waits for one follower only. Enough of them for
        // the check below to tell the two behaviours apart.
        let heartbeats = moved(
            &leader_before,
            &leader_after,
            "rdkv_peer_append_round_trip_seconds_count",
            &to_follower,
        );
        ensure!(
            heartbeats > 2.0 * allowed,
            "only {heartbeats} heartbeats to the follower for {READS} linearizable reads \
             over {intervals:.1} heartbeat intervals"
        );
        println!(
            "follower {follower}: {published} lease publications over {intervals:.1} \
             intervals and {heartbeats} heartbeats"
        );
        ensure!(
            published <= allowed,
            "the follower published its lease words {published} times over {intervals:.1} \
             heartbeat intervals and {heartbeats} heartbeats (at most {allowed} expected)"
        );
        Ok(())
    })
    .await
}

async fn wait_health(cluster: &Cluster, id: u64, want_ok: bool) -> Result<String> {
    let what = format!(
        "node {id} /health {}",
        if want_ok { "ok" } else { "failing" }
    );
    eventually(Duration::from_secs(15), &what, async || {
        let (status, body) = health(cluster, id).await?;
        ensure!((status == 200) == want_ok, "/health is {status}: {body}");
        Ok(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_unhealthy_when_cut_off_and_recovers() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 90, async |cluster, _| {
        for id in 1..=3 {
            wait_health(cluster, id, true).await?;
        }
        // Node 1 loses both peers, whatever its role.
        cluster.node_mut(2)?.pause()?;
        cluster.node_mut(3)?.pause()?;
        let unhealthy = wait_health(cluster, 1, false).await;
        cluster.node_mut(2)?.resume()?;
        cluster.node_mut(3)?.resume()?;
        let body = unhealthy?;
        ensure!(
            body.contains("\"healthy\":false") && !body.contains("\"reason\":\"\""),
            "unhealthy without a reason: {body}"
        );
        wait_health(cluster, 1, true).await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdkvctl_top_shows_every_member_in_a_terminal() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    tokio::task::spawn_blocking(|| binary("rdkvctl")).await?;
    check_with_leader(&mut cluster, 90, async |cluster, leader| {
        let endpoint = cluster.node(leader)?.endpoint();
        let writer = client(cluster, leader, Transport::Tcp)?;
        let writes = tokio::spawn(async move {
            for i in 0..400 {
                let _ = writer.put(format!("t{i}"), "v").await;
            }
        });
        // `script` runs top under a pseudo-terminal, as a user would see it.
        let command = format!(
            "{} --endpoints {endpoint} top --interval-ms 300 --iterations 4",
            binary("rdkvctl").display()
        );
        let out = tokio::task::spawn_blocking(move || {
            Command::new("script")
                .args(["-qec", &command, "/dev/null"])
                .output()
        })
        .await?
        .context("running script (util-linux) for a pseudo-terminal")?;
        writes.abort();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(out.status.success(), "top failed: {text}");
        ensure!(
            text.contains("\u{1b}[H\u{1b}[2J"),
            "no screen redraw on a terminal: {text:?}"
        );
        let last = text
            .rsplit("\u{1b}[H\u{1b}[2J")
            .next()
            .context("no refresh")?;
        ensure!(
            last.contains("rdkv top - ") && last.contains("3 members"),
            "{last}"
        );
        ensure!(last.contains("| leader "), "{last}");
        ensure!(last.matches("| follower ").count() == 2, "{last}");
        for header in [
            "ROLE", "TERM", "APPLIED", "LAG", "GET/s", "PUT/s", "P99", "ERR%", "FILL%",
        ] {
            ensure!(last.contains(header), "no {header} column: {last}");
        }

        // Not a terminal: one plain table per refresh, no escape codes.
        let plain = tokio::task::spawn_blocking({
            let rdkvctl = binary("rdkvctl");
            let endpoint = endpoint.clone();
            move || {
                Command::new(rdkvctl)
                    .args([
                        "--endpoints",
                        &endpoint,
                        "top",
                        "--interval-ms",
                        "200",
                        "--iterations",
                        "2",
                    ])
                    .output()
            }
        })
        .await??;
        let text = String::from_utf8_lossy(&plain.stdout);
        ensure!(
            plain.status.success() && !text.contains('\u{1b}'),
            "{text:?}"
        );
        ensure!(text.matches("rdkv top - ").count() == 2, "{text}");
        Ok(())
    })
    .await
}
