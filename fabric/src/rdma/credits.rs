//! Credit-based flow control of two-sided SEND/RECV, the InfiniBand way: a
//! SEND that finds no posted receive buffer is an RNR NAK (and, once the
//! retries run out, a dead connection), so a sender only sends while it
//! holds a credit, and each credit stands for one receive buffer the peer
//! has posted.
//!
//! Rules (why they cannot deadlock or ping-pong):
//! - Every message carries the grants its sender owes: one per receive
//!   buffer it has consumed and re-posted since its last message.
//! - A data message needs two credits: the last credit is kept for a
//!   credit-only update, so a side that owes grants can always say so.
//! - A credit-only update is sent only when it grants at least
//!   [`MIN_UPDATE_GRANT`] credits and we owe at least half the window. Its
//!   own buffer costs the receiver one grant, so an update never makes the
//!   peer owe enough to answer with another update (no ping-pong).
//! - With a window of at least 4, a peer that is waiting for credits while
//!   we have nothing to send still holds `window - (threshold - 1) >= 2`
//!   credits once we have consumed its messages, so it is never starved; two
//!   sides at zero credits each just sent an update granting the other at
//!   least two, so they cannot both wait.
//!
//! Pure bookkeeping: the verbs code calls it under the connection's lock.

use thiserror::Error;

/// Credits a data message needs (one stays in reserve for an update).
pub const DATA_CREDITS_NEEDED: u32 = 2;
/// Smallest grant worth an update-only message.
pub const MIN_UPDATE_GRANT: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CreditError {
    /// The peer granted more credits than it has receive buffers: it is
    /// broken or hostile; the connection must close.
    #[error("peer granted {granted} credits, which would exceed its window of {window}")]
    OverGrant { granted: u32, window: u32 },
    /// A message arrived although the peer had no credit for it.
    #[error("peer sent a message beyond the {window} receive buffers posted for it")]
    Overrun { window: u32 },
}

/// One side's view of a connection's credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditWindow {
    /// Receive buffers the peer posted for us (its announced window).
    peer_window: u32,
    /// Messages we may still send into the peer's buffers.
    send_credits: u32,
    /// Receive buffers we posted for the peer (our announced window).
    own_window: u32,
    /// Buffers of ours the peer may still fill (our view of its credits).
    peer_credits: u32,
    /// Buffers consumed and re-posted but not yet granted back.
    owed: u32,
}

impl CreditWindow {
    /// A fresh connection: the peer posted `peer_window` buffers for us, we
    /// posted `own_window` for it.
    pub fn new(peer_window: u32, own_window: u32) -> CreditWindow {
        CreditWindow {
            peer_window,
            send_credits: peer_window,
            own_window,
            peer_credits: own_window,
            owed: 0,
        }
    }

    pub fn send_credits(&self) -> u32 {
        self.send_credits
    }

    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Takes the credits of one data message; returns the grant to carry in
    /// its header, or `None` when the message must wait for credits.
    pub fn try_send_data(&mut self) -> Option<u32> {
        if self.send_credits < DATA_CREDITS_NEEDED {
            return None;
        }
        self.send_credits -= 1;
        Some(self.take_owed())
    }

    /// Whether a credit-only update should go out now (see the module docs).
    pub fn update_due(&self) -> bool {
        let threshold = (self.own_window / 2).max(MIN_UPDATE_GRANT);
        self.owed >= threshold && self.send_credits >= 1
    }

    /// Takes the credit of an update-only message; returns its grant.
    pub fn try_send_update(&mut self) -> Option<u32> {
        if !self.update_due() {
            return None;
        }
        self.send_credits -= 1;
        Some(self.take_owed())
    }

    fn take_owed(&mut self) -> u32 {
        let grant = self.owed;
        self.owed = 0;
        self.peer_credits += grant;
        grant
    }

    /// A message (data or update) arrived carrying `granted` credits.
    /// Checks that the peer had a credit for it and does not over-grant.
    pub fn on_received(&mut self, granted: u32) -> Result<(), CreditError> {
        if self.peer_credits == 0 {
            return Err(CreditError::Overrun {
                window: self.own_window,
            });
        }
        self.peer_credits -= 1;
        match self.send_credits.checked_add(granted) {
            Some(total) if total <= self.peer_window => {
                self.send_credits = total;
                Ok(())
            }
            _ => Err(CreditError::OverGrant {
                granted,
                window: self.peer_window,
            }),
        }
    }

    /// One received buffer was consumed and posted again: owe its grant.
    pub fn on_reposted(&mut self) {
        self.owed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn data_keeps_one_credit_in_reserve() {
        let mut w = CreditWindow::new(4, 4);
        assert_eq!(w.try_send_data(), Some(0));
        assert_eq!(w.try_send_data(), Some(0));
        assert_eq!(w.try_send_data(), Some(0));
        assert_eq!(w.send_credits(), 1);
        assert_eq!(w.try_send_data(), None);
        // Nothing owed: no update either.
        assert_eq!(w.try_send_update(), None);
        w.on_received(0).unwrap();
        w.on_reposted();
        w.on_received(0).unwrap();
        w.on_reposted();
        // Owes 2 >= max(4 / 2, 2): the reserve credit carries the update.
        assert_eq!(w.try_send_update(), Some(2));
        assert_eq!(w.send_credits(), 0);
    }

    #[test]
    fn over_grants_and_overruns_are_refused() {
        let mut w = CreditWindow::new(4, 4);
        w.try_send_data().unwrap();
        assert_eq!(
            w.on_received(2),
            Err(CreditError::OverGrant {
                granted: 2,
                window: 4
            })
        );
        let mut w = CreditWindow::new(4, 4);
        for _ in 0..4 {
            w.on_received(0).unwrap();
        }
        assert_eq!(w.on_received(0), Err(CreditError::Overrun { window: 4 }));
        let mut w = CreditWindow::new(4, 4);
        assert!(w.on_received(u32::MAX).is_err());
    }

    /// Delivers the next message on `wire` to `side`: a data message waits
    /// to be consumed, an update's buffer is reposted at once. False when
    /// the wire is empty.
    fn deliver(
        side: &mut CreditWindow,
        wire: &mut VecDeque<(bool, u32)>,
        unconsumed: &mut u32,
    ) -> bool {
        let Some((is_data, grant)) = wire.pop_front() else {
            return false;
        };
        side.on_received(grant).unwrap();
        if is_data {
            *unconsumed += 1;
        } else {
            side.on_reposted();
        }
        true
    }

    /// Two endpoints exchanging messages in random order: a receiver never
    /// gets more messages than it posted buffers (the Overrun check would
    /// fire), updates never ping-pong, and whoever wants to send data can
    /// always eventually do so.
    #[test]
    fn two_peers_never_overrun_and_never_stall() {
        for window in [4u32, 5, 8, 64] {
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(window);
            let mut next = || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut side = [
                CreditWindow::new(window, window),
                CreditWindow::new(window, window),
            ];
            // In flight towards side i: (is_data, grant).
            let mut wire: [VecDeque<(bool, u32)>; 2] = [VecDeque::new(), VecDeque::new()];
            // Received data messages not yet consumed by the application.
            let mut unconsumed = [0u32, 0];
            let mut data_sent = [0u64, 0];
            let mut updates = 0u64;
            for _ in 0..200_000 {
                let i = (next() % 2) as usize;
                let peer = 1 - i;
                match next() % 4 {
                    0 => {
                        if let Some(grant) = side[i].try_send_data() {
                            wire[peer].push_back((true, grant));
                            data_sent[i] += 1;
                        }
                    }
                    1 => {
                        deliver(&mut side[i], &mut wire[i], &mut unconsumed[i]);
                    }
                    2 => {
                        if unconsumed[i] > 0 {
                            unconsumed[i] -= 1;
                            side[i].on_reposted();
                        }
                    }
                    _ => {
                        if let Some(grant) = side[i].try_send_update() {
                            assert!(grant >= MIN_UPDATE_GRANT);
                            wire[peer].push_back((false, grant));
                            updates += 1;
                        }
                    }
                }
            }
            // Drain: deliver and consume everything, sending updates when due.
            for _ in 0..10_000 {
                for i in 0..2 {
                    let peer = 1 - i;
                    while deliver(&mut side[i], &mut wire[i], &mut unconsumed[i]) {}
                    while unconsumed[i] > 0 {
                        unconsumed[i] -= 1;
                        side[i].on_reposted();
                    }
                    if let Some(grant) = side[i].try_send_update() {
                        wire[peer].push_back((false, grant));
                    }
                }
            }
            assert!(wire.iter().all(VecDeque::is_empty), "updates ping-pong");
            for (i, s) in side.iter().enumerate() {
                assert!(
                    s.send_credits() >= DATA_CREDITS_NEEDED,
                    "window {window}: side {i} is stalled with {} credits ({s:?})",
                    s.send_credits()
                );
            }
            assert!(data_sent[0] > 1000 && data_sent[1] > 1000);
            // Symmetric traffic piggybacks nearly every grant; small windows
            // still need explicit updates.
            assert!(window > 8 || updates > 0, "window {window}: no update sent");
        }
    }

    /// One-way traffic (requests that get no replies): every grant travels
    /// in an update, and the sender never waits for good.
    #[test]
    fn one_way_traffic_is_kept_going_by_updates() {
        for window in [4u32, 7, 64] {
            let mut sender = CreditWindow::new(window, window);
            let mut receiver = CreditWindow::new(window, window);
            let mut to_receiver = VecDeque::new();
            let mut to_sender = VecDeque::new();
            let mut delivered = 0u32;
            let mut updates = 0u32;
            for _ in 0..10_000 {
                if let Some(grant) = sender.try_send_data() {
                    to_receiver.push_back(grant);
                }
                while let Some(grant) = to_receiver.pop_front() {
                    receiver.on_received(grant).unwrap();
                    receiver.on_reposted();
                    delivered += 1;
                }
                if let Some(grant) = receiver.try_send_update() {
                    to_sender.push_back(grant);
                    updates += 1;
                }
                while let Some(grant) = to_sender.pop_front() {
                    sender.on_received(grant).unwrap();
                    sender.on_reposted();
                }
            }
            assert!(
                delivered > 5_000,
                "window {window}: only {delivered} delivered"
            );
            assert!(updates > 0);
        }
    }
}
