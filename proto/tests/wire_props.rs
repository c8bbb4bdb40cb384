//! Property tests: every message survives a frame round trip, chunking never
//! changes what is decoded, and arbitrary bytes never panic.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use rdkv_proto::shard::{NodeInfo, SLOT_COUNT, ShardId, ShardMap, Slot};
use rdkv_proto::wire::{
    ClientHello, Consistency, DEFAULT_MAX_FRAME_BYTES, ErrorCode, ErrorReply, Frame, FrameDecoder,
    FrameKind, LeaderHint, Request, Response, ServerHello, ServerInfo, ShardRequest, Versioned,
    WrongShard, decode_payload, encode_frame,
};

fn any_bytes() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..48),
        1 => vec(any::<u8>(), 0..4096),
    ]
    .prop_map(Bytes::from)
}

fn any_consistency() -> impl Strategy<Value = Consistency> {
    prop_oneof![
        Just(Consistency::Linearizable),
        Just(Consistency::Lease),
        any::<u64>().prop_map(|max_lag_entries| Consistency::Follower { max_lag_entries }),
    ]
}

fn any_versioned() -> impl Strategy<Value = Versioned> {
    (any_bytes(), any::<u64>()).prop_map(|(value, version)| Versioned { value, version })
}

fn any_error_code() -> impl Strategy<Value = ErrorCode> {
    prop::sample::select(ErrorCode::ALL.to_vec())
}

fn any_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any_bytes(), any_consistency())
            .prop_map(|(key, consistency)| Request::Get { key, consistency }),
        (any_bytes(), any_bytes()).prop_map(|(key, value)| Request::Put { key, value }),
        any_bytes().prop_map(|key| Request::Delete { key }),
        (
            any_bytes(),
            any::<Option<u64>>(),
            proptest::option::of(any_bytes())
        )
            .prop_map(|(key, expected_version, new_value)| Request::Cas {
                key,
                expected_version,
                new_value,
            }),
        (vec(any_bytes(), 0..8), any_consistency())
            .prop_map(|(keys, consistency)| Request::MGet { keys, consistency }),
        vec((any_bytes(), any_bytes()), 0..8).prop_map(|pairs| Request::MPut { pairs }),
        Just(Request::Ping),
        (
            any_bytes(),
            proptest::option::of(any_bytes()),
            any::<u32>(),
            any_consistency()
        )
            .prop_map(|(start_key, end_key, limit, consistency)| Request::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            }),
        Just(Request::ShardMap),
        (any::<u32>(), any_bytes(), any::<u32>(), any_consistency()).prop_map(
            |(shard, start_key, limit, consistency)| Request::Sharded {
                shard: ShardId(shard),
                request: ShardRequest::Scan {
                    start_key,
                    end_key: None,
                    limit,
                    consistency,
                },
            }
        ),
        any::<u32>().prop_map(|shard| Request::Sharded {
            shard: ShardId(shard),
            request: ShardRequest::Clear,
        }),
        (any::<u32>(), any::<bool>()).prop_map(|(shard, open)| Request::Sharded {
            shard: ShardId(shard),
            request: match open {
                true => ShardRequest::OpenReplica,
                false => ShardRequest::CloseReplica,
            },
        }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(shard, from, to)| {
            Request::Sharded {
                shard: ShardId(shard),
                request: ShardRequest::MoveReplica { from, to },
            }
        }),
        any::<u32>().prop_map(|shard| Request::Sharded {
            shard: ShardId(shard),
            request: ShardRequest::RdmaRegion,
        }),
        any::<u32>().prop_map(|shard| Request::Sharded {
            shard: ShardId(shard),
            request: ShardRequest::OfiRegion,
        }),
        Just(Request::ShardStatus),
        (any::<u32>(), any::<u64>()).prop_map(|(shard, to)| Request::ShardMoveLeader {
            shard: ShardId(shard),
            to
        }),
        any_shard_map().prop_map(|map| Request::PublishShardMap { map }),
        (
            any::<u64>(),
            ".{0,40}",
            ".{0,40}",
            proptest::option::of(".{0,40}")
        )
            .prop_map(|(id, peer_addr, client_addr, resp_addr)| Request::AddNode {
                id,
                peer_addr,
                client_addr,
                resp_addr,
            }),
        any::<u64>().prop_map(|id| Request::RemoveNode { id }),
    ]
}

/// A single-group map of 1 to 4 nodes (the map's own proptests cover
/// every shape; here it is one answer among others).
fn any_shard_map() -> impl Strategy<Value = ShardMap> {
    (
        proptest::collection::btree_set(any::<u64>(), 1..5),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(ids, leader, has_leader)| {
            let ids: Vec<u64> = ids.into_iter().collect();
            let leader = has_leader.then(|| ids[leader.index(ids.len())]);
            let nodes = ids
                .iter()
                .map(|&id| NodeInfo {
                    id,
                    client_addr: Some(format!("10.0.0.{}:7000", id % 256)),
                    resp_addr: None,
                })
                .collect();
            ShardMap::single_group(nodes, leader).unwrap()
        })
}

fn any_error_reply() -> impl Strategy<Value = ErrorReply> {
    (
        any_error_code(),
        ".{0,40}",
        proptest::option::of((any::<u64>(), ".{0,40}")),
    )
        .prop_map(|(code, message, hint)| ErrorReply {
            code,
            message,
            leader_hint: hint.map(|(node_id, client_addr)| LeaderHint {
                node_id,
                client_addr,
            }),
        })
}

fn any_response() -> impl Strategy<Value = Response> {
    prop_oneof![
        proptest::option::of(any_versioned()).prop_map(Response::Value),
        any::<u64>().prop_map(|version| Response::Written { version }),
        (any::<bool>(), any::<u64>())
            .prop_map(|(existed, version)| Response::Deleted { existed, version }),
        (
            any::<bool>(),
            any::<u64>(),
            proptest::option::of(any_versioned())
        )
            .prop_map(|(succeeded, version, current)| Response::CasDone {
                succeeded,
                version,
                current,
            }),
        vec(proptest::option::of(any_versioned()), 0..8).prop_map(Response::Values),
        any::<u64>().prop_map(|version| Response::MWritten { version }),
        (vec((any_bytes(), any_versioned()), 0..8), any::<bool>())
            .prop_map(|(pairs, more)| Response::Pairs { pairs, more }),
        Just(Response::Pong),
        any_error_reply().prop_map(Response::Error),
        any_shard_map().prop_map(|map| Response::ShardMap(Box::new(map))),
        (any::<u64>(), 0..SLOT_COUNT, any::<u32>()).prop_map(|(map_version, slot, shard)| {
            Response::WrongShard(WrongShard {
                map_version,
                slot: Slot::new(slot).unwrap(),
                shard: ShardId(shard),
            })
        }),
    ]
}

fn any_client_hello() -> impl Strategy<Value = ClientHello> {
    (
        any::<[u8; 4]>(),
        any::<u16>(),
        any::<u16>(),
        proptest::option::of(".{0,40}"),
        ".{0,40}",
    )
        .prop_map(
            |(magic, min_version, max_version, token, client_name)| ClientHello {
                magic,
                min_version,
                max_version,
                token,
                client_name,
            },
        )
}

fn any_server_hello() -> impl Strategy<Value = ServerHello> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(
                |(version, node_id, cluster_id, max_frame_bytes, max_in_flight)| {
                    ServerHello::Accepted(ServerInfo {
                        version,
                        node_id,
                        cluster_id,
                        max_frame_bytes,
                        max_in_flight,
                    })
                }
            ),
        (any_error_code(), ".{0,40}")
            .prop_map(|(code, message)| ServerHello::Rejected { code, message }),
        (any::<u16>(), any::<u64>(), any::<u64>()).prop_map(|(version, node_id, map_version)| {
            ServerHello::AcceptedSharded {
                info: ServerInfo {
                    version,
                    node_id,
                    cluster_id: 7,
                    max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
                    max_in_flight: 64,
                },
                shard_map_version: map_version,
            }
        }),
    ]
}

fn round_trip<T>(kind: FrameKind, request_id: u64, msg: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut wire = BytesMut::new();
    encode_frame(kind, request_id, msg, DEFAULT_MAX_FRAME_BYTES, &mut wire).unwrap();
    let frame = FrameDecoder::default().decode(&mut wire).unwrap().unwrap();
    assert!(wire.is_empty());
    assert_eq!(frame.kind, kind);
    assert_eq!(frame.request_id, request_id);
    decode_payload(&frame).unwrap()
}

/// Drains `buf`, never panicking; checks every frame it does yield is consistent.
fn drain(decoder: &mut FrameDecoder, buf: &mut BytesMut) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = decoder.decode(buf) {
        assert!(frame.payload.len() + 9 <= decoder.max_frame_bytes() as usize);
        frames.push(frame);
    }
    frames
}

proptest! {
    #[test]
    fn requests_round_trip(req in any_request(), id in any::<u64>()) {
        prop_assert_eq!(round_trip(FrameKind::Request, id, &req), req);
    }

    #[test]
    fn responses_round_trip(resp in any_response(), id in any::<u64>()) {
        prop_assert_eq!(round_trip(FrameKind::Response, id, &resp), resp);
    }

    #[test]
    fn hellos_round_trip(c in any_client_hello(), s in any_server_hello()) {
        prop_assert_eq!(round_trip(FrameKind::ClientHello, 0, &c), c);
        prop_assert_eq!(round_trip(FrameKind::ServerHello, 0, &s), s);
    }

    #[test]
    fn chunking_does_not_change_the_decoded_stream(
        reqs in vec(any_request(), 1..6),
        chunk_sizes in vec(1usize..64, 1..32),
    ) {
        let mut wire = BytesMut::new();
        for (i, req) in reqs.iter().enumerate() {
            encode_frame(FrameKind::Request, i as u64, req, DEFAULT_MAX_FRAME_BYTES, &mut wire)
                .unwrap();
        }
        let mut decoder = FrameDecoder::default();
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        let mut rest = &wire[..];
        let mut sizes = chunk_sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).min(rest.len());
            buf.put_slice(&rest[..n]);
            rest = &rest[n..];
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        prop_assert_eq!(frames.len(), reqs.len());
        for (i, (f, req)) in frames.iter().zip(&reqs).enumerate() {
            prop_assert_eq!(f.request_id, i as u64);
            prop_assert_eq!(&decode_payload::<Request>(f).unwrap(), req);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_frame_decoder(
        bytes in vec(any::<u8>(), 0..4096),
        max in prop_oneof![Just(DEFAULT_MAX_FRAME_BYTES), 0u32..512],
    ) {
        let mut decoder = FrameDecoder::new(max);
        let mut buf = BytesMut::from(&bytes[..]);
        drain(&mut decoder, &mut buf);
        // Same bytes arriving in small pieces.
        let mut buf = BytesMut::new();
        for chunk in bytes.chunks(7) {
            buf.put_slice(chunk);
            drain(&mut decoder, &mut buf);
        }
    }

    #[test]
    fn arbitrary_payloads_never_panic_the_message_decoders(
        bytes in vec(any::<u8>(), 0..4096),
    ) {
        let frame = Frame { kind: FrameKind::Request, request_id: 1, payload: Bytes::from(bytes) };
        let _ = decode_payload::<Request>(&frame);
        let _ = decode_payload::<Response>(&frame);
        let _ = decode_payload::<ClientHello>(&frame);
        let _ = decode_payload::<ServerHello>(&frame);
    }

    #[test]
    fn corrupted_valid_payloads_never_panic(
        req in any_request(),
        resp in any_response(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        for mut bytes in [postcard::to_stdvec(&req).unwrap(), postcard::to_stdvec(&resp).unwrap()] {
            if bytes.is_empty() {
                continue;
            }
            for (at, byte) in &flips {
                let i = at.index(bytes.len());
                bytes[i] = *byte;
            }
            let frame = Frame { kind: FrameKind::Request, request_id: 1, payload: bytes.into() };
            let _ = decode_payload::<Request>(&frame);
            let _ = decode_payload::<Response>(&frame);
        }
    }
}
