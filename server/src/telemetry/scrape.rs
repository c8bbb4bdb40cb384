//! The one-sided read counters, fed from the two places that count them:
//! clients' reports (added as they arrive) and the node's own reader (set
//! at scrape time). The rest of `/metrics` is read by the service layer.

use metrics::{Counter, counter};
use rdkv_fabric::ReadStats;
use rdkv_proto::wire::ReadReport;

/// One reader's validation counters, whoever counted them.
struct OneSidedCounts {
    reads: u64,
    /// By cause: slot, block, invalidated, moved, slow.
    retries: [(&'static str, u64); 5],
    cache_hits: u64,
    cache_misses: u64,
    rpc_fallbacks: u64,
}

impl OneSidedCounts {
    /// Writes the counters labelled `source`; `apply` adds (a report of
    /// new reads) or sets (a running total).
    fn record(&self, source: &'static str, apply: fn(&Counter, u64)) {
        apply(
            &counter!("rdkv_one_sided_reads_total", "source" => source),
            self.reads,
        );
        for (cause, n) in self.retries {
            let retries =
                counter!("rdkv_one_sided_retries_total", "source" => source, "cause" => cause);
            apply(&retries, n);
        }
        for (result, n) in [("hit", self.cache_hits), ("miss", self.cache_misses)] {
            let lookups =
                counter!("rdkv_one_sided_cache_total", "source" => source, "result" => result);
            apply(&lookups, n);
        }
        apply(
            &counter!("rdkv_one_sided_rpc_fallbacks_total", "source" => source),
            self.rpc_fallbacks,
        );
    }
}

impl From<&ReadReport> for OneSidedCounts {
    fn from(report: &ReadReport) -> OneSidedCounts {
        OneSidedCounts {
            reads: report.reads,
            retries: [
                ("slot", report.retries_slot),
                ("block", report.retries_block),
                ("invalidated", report.retries_invalidated),
                ("moved", report.retries_moved),
                ("slow", report.retries_slow),
            ],
            cache_hits: report.cache_hits,
            cache_misses: report.cache_misses,
            rpc_fallbacks: report.rpc_fallbacks,
        }
    }
}

/// Adds a client's one-sided read report to the `source="client"` counters.
pub fn client_reads(report: &ReadReport) {
    OneSidedCounts::from(report).record("client", Counter::increment);
    for (reason, n) in [
        ("lease", report.lease_refusals),
        ("lag", report.lag_refusals),
    ] {
        counter!("rdkv_one_sided_refusals_total", "reason" => reason).increment(n);
    }
}

/// Sets the `source="server"` counters from the node's own reader (GETs
/// served by RPC read the region lock-free too), counted as a client would
/// report them.
pub fn server_reads(stats: &ReadStats) {
    OneSidedCounts::from(&ReadReport::from(*stats)).record("server", Counter::absolute);
}
