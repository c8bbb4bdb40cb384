//! The upkeep both one-sided transports' servers (RDMA, libfabric) give
//! their region grants: once a second, register the current region (a new
//! epoch after a snapshot install) and release retired registrations after
//! their grace period, on the blocking pool (a registration may pin the
//! whole region).

use std::time::Duration;

/// Runs `step` (register, then sweep) every second until `shutdown`
/// changes; `transport` names it in the log.
pub async fn run_every_second<F>(
    transport: &'static str,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    step: F,
) where
    F: Fn() + Clone + Send + 'static,
{
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = tokio::task::spawn_blocking(step.clone()).await {
            tracing::warn!("{transport} region maintenance: {e}");
        }
    }
}
