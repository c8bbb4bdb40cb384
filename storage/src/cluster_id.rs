//! The cluster identity: 16 bytes that name one cluster for its whole life.
//! A new cluster's first leader proposes a random one (`Command::SetClusterId`),
//! so it travels in the log and in every snapshot; a restore
//! (`backup::restore`) gives the cluster it starts a new one. Peers present
//! it in their handshake, and a member refuses a peer of another cluster
//! (`rdkv-server`'s `peer::service`), so a node restored elsewhere, or left
//! over from an old cluster, can neither join nor vote.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use serde::{Deserialize, Serialize};
use siphasher::sip128::{Hasher128, SipHasher13};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterId(pub [u8; 16]);

/// Fixed keys of the restore derivation: the same inputs give the same
/// identity on every host and build.
const DERIVE_KEYS: (u64, u64) = (0x7264_6b76_636c_7573, 0x7465_725f_6964_5f31);

impl ClusterId {
    /// A fresh identity from the process's random source (the one
    /// `region::random_seed` draws from).
    pub fn random() -> ClusterId {
        let draw = || {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&draw().to_le_bytes());
        bytes[8..].copy_from_slice(&draw().to_le_bytes());
        ClusterId(bytes)
    }

    /// The identity of a cluster restored from a snapshot: a function of
    /// what every member is given alike (the source cluster, the snapshot's
    /// position, the new membership, the operator's name for the new
    /// cluster), so that each member restored separately gets the same
    /// one, and one that differs from the source cluster's.
    pub fn derive(parts: &[&[u8]]) -> ClusterId {
        let mut hasher = SipHasher13::new_with_keys(DERIVE_KEYS.0, DERIVE_KEYS.1);
        hasher.write(b"rdkv restored cluster v1");
        for part in parts {
            // Length-prefixed: ("ab", "c") and ("a", "bc") differ.
            hasher.write_u64(part.len() as u64);
            hasher.write(part);
        }
        ClusterId(hasher.finish128().as_bytes())
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_identities_depend_on_every_part_and_its_boundaries() {
        let a = ClusterId::derive(&[b"ab", b"c"]);
        assert_eq!(a, ClusterId::derive(&[b"ab", b"c"]));
        assert_ne!(a, ClusterId::derive(&[b"a", b"bc"]));
        assert_ne!(a, ClusterId::derive(&[b"ab", b"d"]));
        assert_ne!(ClusterId::random(), ClusterId::random());
        assert_eq!(a.to_string().len(), 32);
    }
}
