//! `/metrics`: the node's state read at scrape time (so it is never stale,
//! and a node that stops leading stops reporting follower lag at once),
//! then everything the process recorded, rendered.

use std::fmt::Write as _;
use std::time::Duration;

use metrics::{counter, gauge};
use rdkv_proto::wire::{Alarm, NodeStatus, Role};
use rdkv_storage::RegionStats;
use rdkv_storage::raft_log::LogStats;

use super::{Handler, MAX_IN_FLIGHT};
use crate::shards::Shards;
use crate::telemetry::prometheus;
use crate::telemetry::scrape::server_reads;

fn set(name: &'static str, value: u64) {
    gauge!(name).set(value as f64);
}

/// Shard `shard`'s gauge `name`: every Raft and region gauge is one
/// replica's, labelled with its shard (a single group: shard="0").
fn set_for(shard: &str, name: &'static str, value: u64) {
    gauge!(name, "shard" => shard.to_owned()).set(value as f64);
}

fn raft_gauges(shard: &str, status: &NodeStatus, log: &LogStats) {
    let set = |name, value| set_for(shard, name, value);
    set("rdkv_raft_term", status.term);
    set(
        "rdkv_raft_is_leader",
        u64::from(status.role == Role::Leader),
    );
    set(
        "rdkv_raft_has_leader",
        u64::from(status.leader_id.is_some()),
    );
    set("rdkv_raft_last_log_index", status.last_log_index);
    set("rdkv_raft_commit_index", status.commit_index);
    set("rdkv_raft_applied_index", status.applied_index);
    set("rdkv_raft_snapshot_index", status.snapshot_index);
    set("rdkv_raft_purged_index", status.purged_index);
    // A gauge is an f64: the digest's low 52 bits are exact in one.
    set(
        "rdkv_state_digest_applied_index",
        status.state_digest.applied_index,
    );
    set(
        "rdkv_state_digest_low52",
        status.state_digest.digest & ((1 << 52) - 1),
    );
    set("rdkv_raft_members", status.members.len() as u64);
    // No quota applied yet reads as 0 (no limit but the region's).
    set("rdkv_quota_bytes", status.quota.quota_bytes.unwrap_or(0));
    set("rdkv_quota_charged_bytes", status.quota.charged_bytes);
    set(
        "rdkv_alarm_nospace",
        u64::from(status.alarms.contains(&Alarm::NoSpace)),
    );
    set("rdkv_raft_log_bytes", log.bytes_on_disk);
    set("rdkv_raft_log_segments", log.segments);
}

fn region_gauges(shard: &str, region: &RegionStats) {
    let set = |name, value| set_for(shard, name, value);
    set("rdkv_region_capacity_bytes", region.data_capacity_bytes);
    set("rdkv_region_used_bytes", region.used_bytes);
    set("rdkv_region_payload_bytes", region.payload_bytes);
    set("rdkv_region_free_bytes", region.free_bytes);
    set("rdkv_region_live_keys", region.live_keys);
    set("rdkv_region_index_slots", region.index_slots);
    set("rdkv_region_overflow_tables", region.overflow_tables);
    set("rdkv_region_overflow_bytes", region.overflow_bytes);
    gauge!("rdkv_region_fragmentation_ratio", "shard" => shard.to_owned())
        .set(region.fragmentation);
    set(
        "rdkv_region_grace_queue_blocks",
        region.pending_reclaim_blocks,
    );
    set(
        "rdkv_region_grace_queue_bytes",
        region.pending_reclaim_bytes,
    );
    counter!("rdkv_region_reclaimed_blocks_total", "shard" => shard.to_owned())
        .absolute(region.reclaimed_blocks_total);
    counter!("rdkv_region_reclaimed_bytes_total", "shard" => shard.to_owned())
        .absolute(region.reclaimed_bytes_total);
}

/// Per-follower lag exists only while this node leads: rendered here, not
/// recorded, so that a node that stops leading stops reporting it at once.
/// `leading`: the status of each shard this node leads.
fn replication_lag(leading: &[(String, NodeStatus)], out: &mut String) {
    if leading
        .iter()
        .all(|(_, status)| status.replication.is_empty())
    {
        return;
    }
    out.push_str(
        "# HELP rdkv_raft_replication_lag_entries Leader's last log index minus what the follower has (leader only), by shard.\n\
         # TYPE rdkv_raft_replication_lag_entries gauge\n",
    );
    for (shard, status) in leading {
        for follower in &status.replication {
            let _ = writeln!(
                out,
                "rdkv_raft_replication_lag_entries{{shard=\"{shard}\",follower=\"{}\"}} {}",
                follower.id, follower.lag_entries
            );
        }
    }
}

/// Longest a scrape waits for RaftCore's statistics.
const STAGE_STATS_TIMEOUT: Duration = Duration::from_secs(1);
/// The quantiles of each stage shown.
const STAGE_QUANTILES: [f64; 2] = [0.5, 0.99];

/// Where a write's time goes at this node, stage by stage, from openraft's
/// own log-stage histograms (it samples the last 1,024 entries): proposed
/// (`client_write`) to received by RaftCore, to submitted to the log, to
/// persisted (the fsync), to committed (the quorum), to applied. Rendered
/// here, not recorded: RaftCore keeps them. Every hosted shard's RaftCore
/// is asked at once, so a stalled one costs a scrape one timeout, not one
/// per shard.
async fn stage_latencies(shards: &Shards, out: &mut String) {
    let asks = shards.iter().map(|(shard, replica)| async move {
        let stats = tokio::time::timeout(STAGE_STATS_TIMEOUT, replica.raft.runtime_stats()).await;
        (shard, stats)
    });
    out.push_str(
        "# HELP rdkv_raft_stage_latency_microseconds Time between consecutive stages of a log entry at this node (openraft's sample of the last 1,024 entries), by shard, stage and quantile.\n\
         # TYPE rdkv_raft_stage_latency_microseconds gauge\n",
    );
    for (shard, stats) in futures::future::join_all(asks).await {
        let Ok(Ok(stats)) = stats else { continue };
        let stages = &stats.log_stage_histograms;
        let rows = [
            ("proposed_to_received", &stages.proposed_to_received),
            ("received_to_submitted", &stages.received_to_submitted),
            ("submitted_to_persisted", &stages.submitted_to_persisted),
            ("persisted_to_committed", &stages.persisted_to_committed),
            ("committed_to_applied", &stages.committed_to_applied),
            ("proposed_to_applied", &stages.proposed_to_applied),
        ];
        for (stage, histogram) in rows.into_iter().filter(|(_, h)| h.total() > 0) {
            for quantile in STAGE_QUANTILES {
                let _ = writeln!(
                    out,
                    "rdkv_raft_stage_latency_microseconds{{shard=\"{}\",stage=\"{stage}\",quantile=\"{quantile}\"}} {}",
                    shard,
                    histogram.percentile(quantile)
                );
            }
        }
    }
}

impl Handler {
    fn connection_gauges(&self, status: &NodeStatus) {
        let open = status.open_connections;
        for (transport, n) in [("tcp", open.tcp), ("unix", open.unix), ("resp", open.resp)] {
            gauge!("rdkv_open_connections", "transport" => transport).set(n as f64);
        }
        let admission = self.admission();
        let (in_flight_budget_bytes, in_flight_bytes) = admission.in_flight_bytes();
        set("rdkv_in_flight_large_request_bytes", in_flight_bytes);
        let limits = self.limits();
        for (name, value) in [
            (
                "max_client_connections",
                u64::from(admission.max_client_connections()),
            ),
            ("max_in_flight_bytes", in_flight_budget_bytes),
            ("max_key_bytes", u64::from(limits.max_key_bytes)),
            ("max_value_bytes", u64::from(limits.max_value_bytes)),
            ("max_batch_keys", u64::from(limits.max_batch_keys)),
            ("max_frame_bytes", u64::from(limits.max_frame_bytes)),
            ("max_in_flight_per_connection", u64::from(MAX_IN_FLIGHT)),
        ] {
            gauge!("rdkv_limit", "name" => name).set(value as f64);
        }
    }

    /// Everything `/metrics` shows, in the Prometheus text format (0.0.4).
    pub async fn metrics(&self) -> String {
        let mut leading = Vec::new();
        for (shard, replica) in self.shards().iter() {
            let shard = shard.0.to_string();
            let status = self.status_of(&replica);
            raft_gauges(&shard, &status, &replica.log.stats());
            region_gauges(&shard, &replica.sm.region_stats());
            set_for(
                &shard,
                "rdkv_region_expiring_keys",
                replica.sm.expiring_keys() as u64,
            );
            if status.role == Role::Leader {
                leading.push((shard, status));
            }
        }
        let status = self.status();
        let replica = self.replica();
        // Validation counters of this node's own lock-free reader (current
        // region; they restart when a snapshot install replaces the region).
        server_reads(&replica.sm.reader().stats());
        self.connection_gauges(&status);
        set("rdkv_in_flight_requests", self.stats().in_flight());
        let mut out = prometheus().render();
        replication_lag(&leading, &mut out);
        stage_latencies(self.shards(), &mut out).await;
        out
    }
}
