//! `/metrics`: state read at scrape time, then everything rendered.

use std::fmt::Write as _;

use metrics::{counter, gauge};
use rdkv_fabric::ReadStats;
use rdkv_proto::wire::{ReadReport, Role};

use super::recorder::prometheus;
use crate::service::{Handler, MAX_IN_FLIGHT};

/// Adds a client's one-sided read report to the `source="client"` counters.
pub fn client_reads(report: &ReadReport) {
    let client = [("source", "client")];
    counter!("rdkv_one_sided_reads_total", &client).increment(report.reads);
    for (cause, n) in [
        ("slot", report.retries_slot),
        ("block", report.retries_block),
        ("invalidated", report.retries_invalidated),
        ("moved", report.retries_moved),
        ("slow", report.retries_slow),
    ] {
        counter!("rdkv_one_sided_retries_total", "source" => "client", "cause" => cause)
            .increment(n);
    }
    for (result, n) in [("hit", report.cache_hits), ("miss", report.cache_misses)] {
        counter!("rdkv_one_sided_cache_total", "source" => "client", "result" => result)
            .increment(n);
    }
    counter!("rdkv_one_sided_rpc_fallbacks_total", &client).increment(report.rpc_fallbacks);
    for (reason, n) in [
        ("lease", report.lease_refusals),
        ("lag", report.lag_refusals),
    ] {
        counter!("rdkv_one_sided_refusals_total", "reason" => reason).increment(n);
    }
}

/// The node's own reader (GETs served by RPC read the region lock-free too).
fn server_reads(stats: &ReadStats) {
    let server = [("source", "server")];
    counter!("rdkv_one_sided_reads_total", &server).absolute(stats.reads);
    for (cause, n) in [
        ("slot", stats.retries_slot),
        ("block", stats.retries_block),
        ("invalidated", stats.retries_invalidated),
        ("moved", stats.retries_moved),
        ("slow", stats.retries_slow),
    ] {
        counter!("rdkv_one_sided_retries_total", "source" => "server", "cause" => cause)
            .absolute(n);
    }
    for (result, n) in [("hit", stats.cache_hits), ("miss", stats.cache_misses)] {
        counter!("rdkv_one_sided_cache_total", "source" => "server", "result" => result)
            .absolute(n);
    }
    counter!("rdkv_one_sided_rpc_fallbacks_total", &server).absolute(stats.exhausted);
}

fn set(name: &'static str, value: u64) {
    gauge!(name).set(value as f64);
}

/// Everything `/metrics` shows, in the Prometheus text format (0.0.4).
pub fn render(handler: &Handler) -> String {
    let status = handler.status();
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
    set("rdkv_raft_members", status.members.len() as u64);
    let log = handler.log().stats();
    set("rdkv_raft_log_bytes", log.bytes_on_disk);
    set("rdkv_raft_log_segments", log.segments);

    let region = handler.region_stats();
    set("rdkv_region_capacity_bytes", region.data_capacity_bytes);
    set("rdkv_region_used_bytes", region.used_bytes);
    set("rdkv_region_payload_bytes", region.payload_bytes);
    set("rdkv_region_free_bytes", region.free_bytes);
    set("rdkv_region_live_keys", region.live_keys);
    set("rdkv_region_index_slots", region.index_slots);
    gauge!("rdkv_region_fragmentation_ratio").set(region.fragmentation);
    set(
        "rdkv_region_grace_queue_blocks",
        region.pending_reclaim_blocks,
    );
    set(
        "rdkv_region_grace_queue_bytes",
        region.pending_reclaim_bytes,
    );
    counter!("rdkv_region_reclaimed_blocks_total").absolute(region.reclaimed_blocks_total);
    counter!("rdkv_region_reclaimed_bytes_total").absolute(region.reclaimed_bytes_total);
    server_reads(&handler.local_read_stats());

    let open = status.open_connections;
    for (transport, n) in [("tcp", open.tcp), ("unix", open.unix), ("resp", open.resp)] {
        gauge!("rdkv_open_connections", "transport" => transport).set(n as f64);
    }
    let (in_flight_budget_bytes, in_flight_bytes) = handler.in_flight_bytes();
    set("rdkv_in_flight_large_request_bytes", in_flight_bytes);
    let limits = handler.limits();
    for (name, value) in [
        (
            "max_client_connections",
            u64::from(handler.max_client_connections()),
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

    let mut out = prometheus().render();
    // Per-follower lag exists only while this node leads: rendered here so
    // that a node that stops leading stops reporting it at once.
    if !status.replication.is_empty() {
        out.push_str(
            "# HELP rdkv_raft_replication_lag_entries Leader's last log index minus what the follower has (leader only).\n\
             # TYPE rdkv_raft_replication_lag_entries gauge\n",
        );
        for follower in &status.replication {
            let _ = writeln!(
                out,
                "rdkv_raft_replication_lag_entries{{follower=\"{}\"}} {}",
                follower.id, follower.lag_entries
            );
        }
    }
    out
}
