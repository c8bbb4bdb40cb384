//! Paces the dials to one peer: after a failed dial the next waits, 10 ms
//! at first and twice as long after each further failure, up to the
//! heartbeat interval or 100 ms, whichever is less, and a success forgets
//! the failures. Capped at the heartbeat, a follower that comes back hears
//! from its leader about as soon as it would have without the pacing,
//! before its election timeout (five heartbeats) runs out.
//!
//! openraft 0.10.0-alpha.37 backs off a replication stream only when the
//! stream itself reports errors. When `stream_append` fails before the
//! stream exists (the peer refuses the connection, a partition leaves no
//! route) the leader opens the next stream at once: without this pacing
//! a leader with a follower down dialed it tens of thousands of times a
//! second, a core spent and as many warnings logged.

use std::future::Future;
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use tokio::time::Instant;

/// The wait after the first failure of a run.
pub const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait between two dials (less under a shorter heartbeat).
pub const MAX_WAIT: Duration = Duration::from_millis(100);

/// Who is dialed, for the pacing and its metric.
#[derive(Debug, Clone, Copy)]
pub(super) struct DialPeer {
    /// The shard whose connection dials (a multi-shard node's link is
    /// shared: the shard that happened to dial it).
    pub(super) shard: Option<ShardId>,
    pub(super) target: u64,
    /// The longest wait between two dials: [`MAX_WAIT`] or the heartbeat.
    pub(super) max_wait: Duration,
}

/// The failures of the dials to one peer since its last success.
#[derive(Debug, Default)]
pub(super) struct Redial {
    failures: u32,
    not_before: Option<Instant>,
}

impl Redial {
    /// Runs `dial` once its turn has come; a failure is counted in
    /// `rdkv_peer_dial_failures_total` and delays the next dial.
    pub(super) async fn dial<T, E>(
        &mut self,
        peer: DialPeer,
        dial: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        if let Some(at) = self.not_before {
            tokio::time::sleep_until(at).await;
        }
        let dialed = dial.await;
        match &dialed {
            Ok(_) => *self = Redial::default(),
            Err(_) => {
                self.failures = self.failures.saturating_add(1);
                self.not_before = Some(Instant::now() + self.wait(peer.max_wait));
                metrics::counter!(
                    "rdkv_peer_dial_failures_total",
                    "shard" => peer.shard.unwrap_or(ShardId(0)).to_string(),
                    "peer" => peer.target.to_string()
                )
                .increment(1);
            }
        }
        dialed
    }

    /// The wait before the next dial, after `failures` in a row.
    fn wait(&self, max_wait: Duration) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(16);
        FIRST_WAIT.saturating_mul(1 << doublings).min(max_wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: DialPeer = DialPeer {
        shard: None,
        target: 2,
        max_wait: MAX_WAIT,
    };

    async fn fail(redial: &mut Redial) {
        let failed: Result<(), ()> = redial.dial(PEER, async { Err(()) }).await;
        assert!(failed.is_err());
    }

    #[test]
    fn the_wait_doubles_from_the_first_up_to_the_most() {
        let waits: Vec<u64> = (1..=7)
            .map(|failures| {
                let redial = Redial {
                    failures,
                    not_before: None,
                };
                u64::try_from(redial.wait(MAX_WAIT).as_millis()).unwrap_or(u64::MAX)
            })
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 100, 100, 100]);
        let many = Redial {
            failures: u32::MAX,
            not_before: None,
        };
        assert_eq!(many.wait(MAX_WAIT), MAX_WAIT);
        let short_heartbeat = Duration::from_millis(30);
        assert_eq!(many.wait(short_heartbeat), short_heartbeat);
    }

    /// Sleeps never end early, so the waits are checked as lower bounds,
    /// from a reading taken before the first failure (a turn is counted
    /// from the failure's end, not from when the caller looks).
    #[tokio::test]
    async fn a_dial_after_a_failure_waits_its_turn_and_a_success_forgets() {
        let mut redial = Redial::default();
        let start = Instant::now();
        fail(&mut redial).await;
        fail(&mut redial).await;
        assert!(start.elapsed() >= FIRST_WAIT, "10 ms after one failure");
        let ok: Result<u8, ()> = redial.dial(PEER, async { Ok(7) }).await;
        assert_eq!(ok, Ok(7));
        assert!(
            start.elapsed() >= FIRST_WAIT * 3,
            "then 20 ms after the second"
        );
        assert_eq!(redial.failures, 0);
        assert_eq!(redial.not_before, None, "a success forgot the failures");
    }
}
