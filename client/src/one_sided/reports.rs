//! Telling the servers about one-sided reads, which they never see: per
//! node, the reads of its region since the last report, and to the leader
//! the refusals (the `rdkv_one_sided_*{source="client"}` metrics).

use std::sync::Arc;

use rdkv_proto::wire::{ReadReport, Request};

use super::OneSided;
use super::topology::{STATUS_TIMEOUT, Topology};
use crate::routing::Router;

/// Best effort: a report that cannot be delivered is dropped (metrics, not data).
async fn send_reports(router: &Router, reports: Vec<(String, ReadReport)>) {
    for (addr, report) in reports {
        let sent = tokio::time::timeout(
            STATUS_TIMEOUT,
            router.send_to(&addr, Request::ReportReads(report)),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            tracing::debug!(addr, "one-sided read report not delivered");
        }
    }
}

impl OneSided {
    /// Deltas since the last report, per node address: each node's region
    /// reads, and the refusals for the leader.
    fn take_reports(&self, topology: &mut Topology) -> Vec<(String, ReadReport)> {
        let mut reports = Vec::new();
        for ((shard, id), node) in &mut topology.nodes {
            let leader = topology.leaders.get(shard).copied();
            let mut delta = std::mem::take(&mut node.unreported);
            if let Some(reader) = &node.reader {
                let now = reader.stats();
                delta = delta.plus(now.since(node.reported));
                node.reported = now;
            }
            let mut report = ReadReport::from(delta);
            // The refusals go once, to the first leader met.
            if Some(*id) == leader {
                let lease = self.counters.sum(|c| &c.lease_refusals);
                let lag = self.counters.sum(|c| &c.lag_refusals);
                report.lease_refusals = lease.saturating_sub(topology.reported_lease_refusals);
                report.lag_refusals = lag.saturating_sub(topology.reported_lag_refusals);
                topology.reported_lease_refusals = lease;
                topology.reported_lag_refusals = lag;
            }
            if !report.is_empty() && !node.client_addr.is_empty() {
                reports.push((node.client_addr.clone(), report));
            }
        }
        reports
    }

    /// Sends what has not been reported yet, in the background (at most once
    /// per refresh).
    pub(super) fn report_in_background(&self, topology: &mut Topology) {
        let reports = self.take_reports(topology);
        if !reports.is_empty() {
            let router = Arc::clone(&self.router);
            tokio::spawn(async move { send_reports(&router, reports).await });
        }
    }

    /// Sends what has not been reported yet, now.
    pub(crate) async fn flush_reports(&self) {
        let reports = {
            let mut topology = self.topology.lock().await;
            self.take_reports(&mut topology)
        };
        send_reports(&self.router, reports).await;
    }
}
