//! The process's recorder, installed on first use: counters and gauges in
//! the Prometheus exporter's recorder, histograms in the node's own
//! fixed-bucket ones ([`histograms`](super::histograms)), rendered together.

use std::sync::{Arc, OnceLock};

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit, counter,
    describe_counter, describe_gauge, describe_histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use super::histograms::Histograms;

/// The process's metrics, rendered in the Prometheus text format.
#[derive(Debug)]
pub struct MetricsHandle {
    prometheus: PrometheusHandle,
    histograms: Arc<Histograms>,
}

impl MetricsHandle {
    pub fn render(&self) -> String {
        let mut out = self.prometheus.render();
        self.histograms.render(&mut out);
        out
    }
}

/// Counters and gauges to the exporter, histograms to [`Histograms`].
struct NodeRecorder {
    prometheus: PrometheusRecorder,
    histograms: Arc<Histograms>,
}

impl Recorder for NodeRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.prometheus.describe_gauge(key, unit, description);
    }

    // The unit is not shown: every histogram's name already ends in it, as
    // the exporter showed them (its unit suffix off).
    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.histograms.describe(key.as_str(), &description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.prometheus.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.prometheus.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.histograms.series(key))
    }
}

/// The handle that renders this process's metrics. The first call installs
/// the recorder as the global one; if another recorder is already installed
/// (a test harness), metrics recorded and described through the facade go
/// there and this handle renders nothing of them.
pub fn prometheus() -> &'static MetricsHandle {
    static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let prometheus = PrometheusBuilder::new().build_recorder();
        let histograms = Arc::new(Histograms::default());
        let handle = MetricsHandle {
            prometheus: prometheus.handle(),
            histograms: histograms.clone(),
        };
        let recorder = NodeRecorder {
            prometheus,
            histograms,
        };
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics shows only part");
        }
        describe();
        register_zeroes();
        handle
    })
}

/// Counters of rare events exist from the start at 0, so that a dashboard
/// or an alert on them has a series to read before the first event.
fn register_zeroes() {
    for name in [
        "rdkv_raft_elections_total",
        "rdkv_raft_leader_changes_total",
        "rdkv_snapshot_builds_total",
        "rdkv_snapshot_installs_total",
    ] {
        counter!(name).increment(0);
    }
    for transport in ["tcp", "unix"] {
        counter!("rdkv_backpressure_events_total", "transport" => transport).increment(0);
    }
    for transport in ["tcp", "unix"] {
        counter!("rdkv_connections_refused_total", "transport" => transport).increment(0);
    }
    for path in ["client", "peer", "resp"] {
        counter!("rdkv_auth_failures_total", "path" => path).increment(0);
    }
    for reason in ["lease", "lag"] {
        counter!("rdkv_one_sided_refusals_total", "reason" => reason).increment(0);
    }
}

fn describe() {
    describe_events();
    describe_raft_events();
    describe_state();
    describe_peers();
}

/// What is recorded where it happens.
fn describe_events() {
    describe_counter!(
        "rdkv_requests_total",
        "Requests received, by op and transport (tcp, unix, mem, resp)."
    );
    describe_counter!(
        "rdkv_request_errors_total",
        "Requests answered with an error, by op, transport and error code."
    );
    describe_histogram!(
        "rdkv_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's arrival to its answer, by op."
    );
    describe_counter!(
        "rdkv_expired_keys_total",
        "Expired keys removed by this node's active expire cycle while it led."
    );
    describe_counter!(
        "rdkv_connections_accepted_total",
        "Client connections accepted, by transport."
    );
    describe_counter!(
        "rdkv_backpressure_events_total",
        "Times a connection used all its credits and the server stopped reading it until one came back."
    );
    describe_counter!(
        "rdkv_connections_refused_total",
        "Client connections refused because the node was at --max-client-connections."
    );
    describe_counter!(
        "rdkv_auth_failures_total",
        "Handshakes refused for a wrong or missing token, by path (client, peer, shm, resp)."
    );
    describe_counter!(
        "rdkv_one_sided_reads_total",
        "One-sided reads of this node's region: source=client as reported by clients, source=server by the node's own reader."
    );
    describe_counter!(
        "rdkv_one_sided_retries_total",
        "One-sided read attempts that started over, by source and cause."
    );
    describe_counter!(
        "rdkv_one_sided_cache_total",
        "Index cache lookups of one-sided readers, by source and result."
    );
    describe_counter!(
        "rdkv_one_sided_rpc_fallbacks_total",
        "One-sided reads that gave up validating and were served by RPC, by source."
    );
    describe_counter!(
        "rdkv_one_sided_refusals_total",
        "Client one-sided reads refused before reading (reason=lease: lease absent or near expiry; reason=lag: no replica within the lag bound) and sent by RPC."
    );
    describe_counter!(
        "rdkv_snapshot_builds_total",
        "Snapshots built from the region."
    );
    describe_counter!(
        "rdkv_snapshot_installs_total",
        "Snapshots received from the leader and installed."
    );
    describe_histogram!(
        "rdkv_raft_log_fsync_duration_seconds",
        Unit::Seconds,
        "Duration of each fdatasync of a raft log segment, by shard."
    );
    describe_histogram!(
        "rdkv_raft_log_entries_per_fsync",
        "Log entries made durable by one group-commit fsync, by shard."
    );
    describe_histogram!(
        "rdkv_raft_apply_duration_seconds",
        Unit::Seconds,
        "Duration of each batch of committed entries applied to the region, by shard."
    );
    describe_histogram!(
        "rdkv_write_batch_commands",
        "Client writes handed to Raft together, as one batch of log entries, by shard."
    );
    describe_histogram!(
        "rdkv_raft_apply_batch_entries",
        "Committed entries applied in one batch, by shard."
    );
    describe_histogram!(
        "rdkv_peer_append_round_trip_seconds",
        Unit::Seconds,
        "From sending an AppendEntries to a follower to its answer (the follower's fsync included), by shard and follower."
    );
    describe_gauge!("rdkv_in_flight_requests", "Requests being served now.");
}

/// What the tasks that follow Raft's state record.
fn describe_raft_events() {
    describe_counter!(
        "rdkv_raft_elections_total",
        "Term changes seen by this node (each is an election somewhere in the cluster)."
    );
    describe_counter!(
        "rdkv_raft_leader_changes_total",
        "Times the leader this node knows changed (including to none)."
    );
    describe_counter!(
        "rdkv_lease_publishes_total",
        "Times this node wrote the Raft term and its lease into a shard's region header: on every change of its Raft role or applied state (on a leader, of the time since its last quorum acknowledgement too), and once a heartbeat interval."
    );
    describe_counter!(
        "rdkv_read_fence_total",
        "Leader read rounds tried by the read fence (on unless --read-fence=false), by outcome (confirmed, higher_vote, no_quorum, ineligible, changed); every outcome but confirmed was followed by a ReadIndex round."
    );
}

/// The peer network's own state.
fn describe_peers() {
    describe_gauge!(
        "rdkv_peer_links",
        "Peer connections this node has open to another node (multi-shard clusters: shared by every shard), by purpose (raft, snapshot) and peer."
    );
}

/// The state read at scrape time (by the service layer).
fn describe_state() {
    for (name, help) in [
        ("rdkv_raft_term", "Current Raft term."),
        ("rdkv_raft_is_leader", "1 if this node leads."),
        ("rdkv_raft_has_leader", "1 if this node knows a leader."),
        (
            "rdkv_raft_last_log_index",
            "Index of the last entry in this node's log.",
        ),
        (
            "rdkv_raft_commit_index",
            "Cluster commit index known to this node.",
        ),
        (
            "rdkv_raft_applied_index",
            "Last log index applied to the region.",
        ),
        (
            "rdkv_raft_snapshot_index",
            "Last log index covered by the current snapshot.",
        ),
        (
            "rdkv_raft_purged_index",
            "Last log index removed behind the snapshot (0: none).",
        ),
        (
            "rdkv_raft_members",
            "Members (voters and learners) in the configuration.",
        ),
        ("rdkv_region_live_keys", "Live keys in the region."),
        (
            "rdkv_region_expiring_keys",
            "Keys with a deadline in the region (expired ones until the expire cycle removes them).",
        ),
        (
            "rdkv_state_digest_applied_index",
            "Applied index at which rdkv_state_digest_low52 was taken.",
        ),
        (
            "rdkv_state_digest_low52",
            "Low 52 bits of the state digest (equal on replicas at one applied index; rdkvctl check compares the full digests).",
        ),
        (
            "rdkv_region_index_slots",
            "Slots in the region's hash index.",
        ),
        (
            "rdkv_region_overflow_tables",
            "Overflow tables linked from the index (keys whose neighbourhood was full; kept until the region is rebuilt).",
        ),
        (
            "rdkv_region_fragmentation_ratio",
            "1 - largest free extent / free bytes (0: free space is one piece).",
        ),
        (
            "rdkv_region_grace_queue_blocks",
            "Freed blocks waiting for their grace period.",
        ),
        ("rdkv_raft_log_segments", "Segment files of the raft log."),
        (
            "rdkv_open_connections",
            "Client connections open now, by transport (tcp, unix, resp).",
        ),
        ("rdkv_limit", "Configured limits, by name."),
    ] {
        describe_gauge!(name, help);
    }
    describe_state_bytes();
}

/// The state read at scrape time that counts bytes.
fn describe_state_bytes() {
    for (name, help) in [
        ("rdkv_raft_log_bytes", "Bytes of raft log segments on disk."),
        (
            "rdkv_region_capacity_bytes",
            "Size of the region's data area.",
        ),
        (
            "rdkv_region_used_bytes",
            "Bytes in live blocks (size classes) and overflow tables.",
        ),
        (
            "rdkv_region_overflow_bytes",
            "Bytes of the data area in overflow tables.",
        ),
        (
            "rdkv_region_payload_bytes",
            "Bytes of live keys and values.",
        ),
        ("rdkv_region_free_bytes", "Free bytes in the data area."),
        (
            "rdkv_region_grace_queue_bytes",
            "Bytes of freed blocks waiting for their grace period.",
        ),
    ] {
        describe_gauge!(name, Unit::Bytes, help);
    }
    describe_counter!(
        "rdkv_region_reclaimed_blocks_total",
        "Blocks returned to the allocator after their grace period (current region)."
    );
    describe_counter!(
        "rdkv_region_reclaimed_bytes_total",
        Unit::Bytes,
        "Bytes returned to the allocator after their grace period (current region)."
    );
}
