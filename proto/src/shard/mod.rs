//! Sharding facts every process must agree on (`docs/sharding.md`): which
//! hash slot a key is in ([`slot`]). No I/O.

pub mod slot;

pub use slot::{FIRST_SLOT, LAST_SLOT, SLOT_COUNT, Slot, crc16_xmodem, hashed_part, key_slot};
