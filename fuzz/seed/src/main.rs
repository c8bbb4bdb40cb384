//! Writes the seed corpora of the fuzz targets: a few small, valid inputs per
//! target, so that the fuzzer starts from real frames, commands, blocks,
//! records and snapshots rather than from nothing.
//!
//! Usage (from `fuzz/`): `cargo run -p rdkv-fuzz-seed [CORPUS_DIR]`
//! (default `corpus`). Files are named `seed-*` and rewritten in place;
//! files libFuzzer added are left alone. Each file's layout matches its
//! target (most targets read a leading control byte).

#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use rdkv_proto::region::{
    BlockRef, HashSeed, LayoutParams, OverflowLink, RegionLayout, SizeClass, Slot, encode_block,
};
use rdkv_proto::wire::{
    ClientHello, Consistency, ErrorCode, ErrorReply, FrameKind, Request, Response, ServerHello,
    ServerInfo, SetCondition, Update, Versioned, encode_frame,
};
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::SnapshotMeta;
use rdkv_storage::record::encode_record;
use rdkv_storage::state_machine::snapshot::{SnapshotRegion, SnapshotWriter};

const MAX_FRAME_BYTES: u32 = 64 * 1024;

fn main() {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("corpus"));
    frame_decoder(&root.join("frame_decoder"));
    resp_parser(&root.join("resp_parser"));
    region_block(&root.join("region_block"));
    log_record(&root.join("log_record"));
    snapshot_reader(&root.join("snapshot_reader"));
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("seed-{name}"));
    fs::write(&path, bytes).unwrap();
    println!("{} ({} bytes)", path.display(), bytes.len());
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn frame<T: serde::Serialize>(kind: FrameKind, id: u64, msg: &T, out: &mut BytesMut) {
    encode_frame(kind, id, msg, MAX_FRAME_BYTES, out).unwrap();
}

/// `[split control][frames...]`: one file per request kind, a handshake,
/// responses, and one pipelined stream.
fn frame_decoder(dir: &Path) {
    let requests = [
        (
            "get",
            Request::Get {
                key: b("user:1"),
                consistency: Consistency::Linearizable,
            },
        ),
        (
            "put",
            Request::Put {
                key: b("user:1"),
                value: b("alice"),
            },
        ),
        ("delete", Request::Delete { key: b("user:1") }),
        (
            "cas",
            Request::Cas {
                key: b("k"),
                expected_version: Some(7),
                new_value: Some(b("v2")),
            },
        ),
        (
            "mget",
            Request::MGet {
                keys: vec![b("a"), b("b"), b("c")],
                consistency: Consistency::Follower { max_lag_entries: 5 },
            },
        ),
        (
            "mput",
            Request::MPut {
                pairs: vec![(b("a"), b("1")), (b("b"), b("2"))],
            },
        ),
        (
            "update",
            Request::Update {
                key: b("counter"),
                update: Update::Incr { delta: -3 },
            },
        ),
        (
            "setif",
            Request::Update {
                key: b("k"),
                update: Update::SetIf {
                    value: b("v"),
                    condition: SetCondition::IfAbsent,
                    return_old: true,
                },
            },
        ),
        (
            "scan",
            Request::Scan {
                start_key: b("a"),
                end_key: Some(b("m")),
                limit: 100,
                consistency: Consistency::Lease,
            },
        ),
        ("ping", Request::Ping),
        (
            "add-member",
            Request::AddMember {
                id: 4,
                peer_addr: "127.0.0.4:7000".into(),
                client_addr: "127.0.0.4:7001".into(),
                learner: true,
            },
        ),
    ];
    for (i, (name, request)) in requests.iter().enumerate() {
        let mut out = BytesMut::from(&[i as u8 * 17][..]);
        frame(FrameKind::Request, i as u64 + 1, request, &mut out);
        write(dir, &format!("request-{name}"), &out);
    }

    let mut out = BytesMut::from(&[0x21][..]);
    frame(
        FrameKind::ClientHello,
        0,
        &ClientHello::new("seed", Some("secret-token".into())),
        &mut out,
    );
    frame(
        FrameKind::ServerHello,
        0,
        &ServerHello::Accepted(ServerInfo {
            version: 1,
            node_id: 1,
            cluster_id: 42,
            max_frame_bytes: MAX_FRAME_BYTES,
            max_in_flight: 64,
        }),
        &mut out,
    );
    write(dir, "handshake", &out);

    let mut out = BytesMut::from(&[0x53][..]);
    frame(
        FrameKind::Response,
        1,
        &Response::Value(Some(Versioned {
            value: b("alice"),
            version: 9,
        })),
        &mut out,
    );
    frame(
        FrameKind::Response,
        2,
        &Response::Error(ErrorReply::new(ErrorCode::NotLeader, "not the leader")),
        &mut out,
    );
    write(dir, "responses", &out);

    // A pipelined stream: several requests back to back.
    let mut out = BytesMut::from(&[0x7f][..]);
    for (i, (_, request)) in requests.iter().take(4).enumerate() {
        frame(FrameKind::Request, 100 + i as u64, request, &mut out);
    }
    write(dir, "pipeline", &out);
}

/// `[control][RESP bytes]`: bit 0 of the control byte picks the small limits;
/// the rest picks the split point.
fn resp_parser(dir: &Path) {
    let seeds: [(&str, &[u8]); 7] = [
        ("set", b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n"),
        ("get", b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"),
        ("inline", b"PING\r\n"),
        (
            "inline-quoted",
            b"SET \"a key\" 'it\\'s' \"\\x41\\n\"\r\nGET k\n",
        ),
        (
            "pipeline",
            b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINCR\r\n$1\r\nc\r\n*4\r\n$4\r\nMSET\r\n$1\r\na\r\n$1\r\n1\r\n$0\r\n\r\n",
        ),
        ("empty-arrays", b"*0\r\n*-1\r\n\r\n"),
        ("auth-hello", b"*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\nHELLO 2\r\n"),
    ];
    for (i, (name, bytes)) in seeds.iter().enumerate() {
        let mut out = vec![(i as u8) * 37];
        out.extend_from_slice(bytes);
        write(dir, name, &out);
    }
}

/// `[mode][bytes]`: valid blocks (mode 0), and a valid static header followed
/// by slot words (mode 1: the target fixes the CRC up anyway).
fn region_block(dir: &Path) {
    for (name, key, value, pad) in [
        ("block-small", &b"user:1"[..], &b"alice"[..], 64 - 35),
        ("block-empty-value", &b"k"[..], &b""[..], 39),
        ("block-binary", &b"\x00\xff"[..], &[7u8; 200][..], 0),
    ] {
        let mut block = Vec::new();
        encode_block(key, value, 42, 1_700_000_000_000, &mut block);
        block.resize(block.len() + pad, 0);
        let mut out = vec![0];
        out.extend_from_slice(&block);
        write(dir, name, &out);
    }
    let layout = RegionLayout::plan(LayoutParams {
        region_bytes: 1 << 20,
        bucket_count: 64,
        neighbourhood_buckets: 2,
        region_epoch: 1,
        node_id: 1,
        hash_seed: HashSeed(1, 2),
        max_key_bytes: 1024,
        max_value_bytes: 64 * 1024,
        grace_period_us: 1000,
    })
    .unwrap();
    let mut out = vec![1];
    out.extend_from_slice(&layout.encode_static());
    let class = SizeClass::for_units(1).unwrap();
    for (fingerprint, offset) in [(5, 0), (9, 3), (77, 100)] {
        out.extend_from_slice(&Slot::new(fingerprint, class, offset).encode().to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    write(dir, "header-and-slots", &out);
    // A bucket whose anchor (slot 7) links to a table, then that table of
    // one unit: entries, and a link to the next in its last slot.
    let mut out = vec![0];
    let entry = |fingerprint, offset| Slot::new(fingerprint, class, offset).encode();
    let words = [
        entry(5, 0),
        entry(9, 3),
        0,
        entry(77, 100),
        0,
        0,
        entry(6, 7),
        OverflowLink::new(1, 200).encode(),
        entry(11, 40),
        0,
        entry(12, 41),
        0,
        0,
        0,
        0,
        OverflowLink::new(2, 201).encode(),
    ];
    for word in words {
        out.extend_from_slice(&word.to_le_bytes());
    }
    write(dir, "bucket-with-link-and-table", &out);
}

/// `[u16 LE payload bound][records...]`.
fn log_record(dir: &Path) {
    for (name, payloads) in [
        ("one", vec![&b"hello"[..]]),
        ("several", vec![&b"a"[..], &b""[..], &[0xab; 100][..]]),
    ] {
        let mut out = 1024u16.to_le_bytes().to_vec();
        for payload in payloads {
            encode_record(payload, &mut out);
        }
        write(dir, name, &out);
    }
    // A torn tail: a whole record, then half of one.
    let mut out = 1024u16.to_le_bytes().to_vec();
    encode_record(b"whole", &mut out);
    let mut torn = Vec::new();
    encode_record(b"torn record", &mut torn);
    out.extend_from_slice(&torn[..10]);
    write(dir, "torn-tail", &out);
}

/// `[mode][snapshot]`: small valid snapshots (mode 0: read as is; the odd
/// mode also exercises the writer round trip on the same bytes).
fn snapshot_reader(dir: &Path) {
    for (name, mode, pairs) in [
        ("empty", 0u8, vec![]),
        (
            "three-pairs",
            0,
            vec![
                (&b"a"[..], &b"1"[..], 1u64),
                (b"b", b"22", 2),
                (b"c", b"", 3),
            ],
        ),
        (
            "one-pair-roundtrip",
            1,
            vec![(&b"key"[..], &b"value"[..], 9)],
        ),
    ] {
        let mut writer = SnapshotWriter::new(
            Vec::new(),
            &SnapshotMeta::default(),
            SnapshotRegion {
                hash_seed: Some((7, 9)),
                quota_bytes: Some(1 << 20),
                clock_unix_ms: 1_700_000_000_000,
                cluster_id: Some(ClusterId([3; 16])),
            },
        )
        .unwrap();
        for (key, value, version) in pairs {
            let pair = BlockRef {
                key,
                value,
                version,
                deadline: version * 1_000,
            };
            writer.pair(pair).unwrap();
        }
        let mut out = vec![mode];
        out.extend_from_slice(&writer.finish().unwrap());
        write(dir, name, &out);
    }
}
