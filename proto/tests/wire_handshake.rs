//! Version negotiation, token comparison and handshake hygiene.

use rdkv_proto::wire::{
    ClientHello, ErrorCode, HANDSHAKE_MAGIC, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, WireError,
    negotiate, tokens_match,
};

fn hello(min_version: u16, max_version: u16) -> ClientHello {
    ClientHello {
        min_version,
        max_version,
        ..ClientHello::new("test", None)
    }
}

#[test]
fn new_hello_offers_this_builds_range() {
    let h = ClientHello::new("cli", Some("secret".into()));
    assert_eq!(h.magic, HANDSHAKE_MAGIC);
    assert_eq!(h.min_version, MIN_PROTOCOL_VERSION);
    assert_eq!(h.max_version, PROTOCOL_VERSION);
    assert_eq!(
        negotiate(&h, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION),
        Ok(PROTOCOL_VERSION)
    );
}

#[test]
fn overlapping_ranges_pick_the_highest_common_version() {
    assert_eq!(negotiate(&hello(1, 5), 3, 9), Ok(5));
    assert_eq!(negotiate(&hello(4, 9), 1, 6), Ok(6));
    assert_eq!(negotiate(&hello(2, 8), 3, 4), Ok(4));
    assert_eq!(negotiate(&hello(3, 3), 3, 3), Ok(3));
    assert_eq!(negotiate(&hello(1, 3), 3, 7), Ok(3));
}

#[test]
fn disjoint_or_inverted_ranges_are_rejected() {
    let err = negotiate(&hello(1, 2), 3, 4).unwrap_err();
    assert_eq!(
        err,
        WireError::UnsupportedVersion {
            client_min: 1,
            client_max: 2,
            server_min: 3,
            server_max: 4
        }
    );
    assert_eq!(ErrorCode::from(&err), ErrorCode::UnsupportedVersion);
    assert!(err.closes_connection());
    assert!(negotiate(&hello(5, 9), 1, 4).is_err());
    assert!(negotiate(&hello(4, 2), 1, 9).is_err());
    assert!(negotiate(&hello(1, 9), 5, 3).is_err());
}

#[test]
fn bad_magic_is_rejected_before_versions() {
    let mut h = hello(1, 1);
    h.magic = *b"GET ";
    assert_eq!(
        negotiate(&h, 1, 1),
        Err(WireError::BadMagic { found: *b"GET " })
    );
}

#[test]
fn tokens_match_only_on_identical_bytes() {
    assert!(tokens_match(b"s3cr3t-token", b"s3cr3t-token"));
    assert!(tokens_match(b"", b""));
    assert!(!tokens_match(b"s3cr3t-token", b"s3cr3t-tokeN"));
    assert!(!tokens_match(b"s3cr3t-token", b"X3cr3t-token"));
    assert!(!tokens_match(b"s3cr3t-token", b"s3cr3t-toke"));
    assert!(!tokens_match(b"s3cr3t-token", b"s3cr3t-token!"));
    assert!(!tokens_match(b"abc", b""));
    // Two bytes that differ in the same bit: the differences must not cancel.
    assert!(!tokens_match(b"ab", b"`c"));
}

#[test]
fn debug_output_does_not_leak_the_token() {
    let h = ClientHello::new("cli", Some("hunter2".into()));
    let shown = format!("{h:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("redacted"), "{shown}");
    assert!(shown.contains("cli"), "{shown}");
}
