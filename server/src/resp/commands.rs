//! What each Redis command does. A command is a row of the table in
//! `table`; its handler is here: `fn(args)` or `fn(&mut Session, args)`
//! when it is answered at once, `async fn(&RespServer, args)` when the
//! store serves it.
//! `args` excludes the command name, and the table has checked its arity.

use bytes::{Bytes, BytesMut};
use rdkv_proto::wire::{Expiry, Request, Response, Role, SetCondition, Update, UpdateOutcome};
use rdkv_storage::state_machine::LocalReads;

use super::RespServer;
use super::expiry;
use super::glob::glob_match;
use super::parse::Args;
use super::reply::{Protocol, Reply};
use super::session::Session;
use super::store::unexpected;
use crate::order::Finish;
use crate::service::shard_status;

pub fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

pub fn integer_arg(arg: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(arg).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

pub fn ping(args: &[Bytes]) -> Reply {
    match args {
        [] => Reply::Simple("PONG"),
        [message] => Reply::Bulk(message.clone()),
        _ => Reply::wrong_arity("ping"),
    }
}

pub fn echo(args: &[Bytes]) -> Reply {
    Reply::Bulk(args[0].clone())
}

pub fn select(args: &[Bytes]) -> Reply {
    match integer_arg(&args[0]) {
        Some(0) => Reply::ok(),
        Some(_) => Reply::err("DB index is out of range"),
        None => Reply::not_integer(),
    }
}

pub async fn dbsize(server: &RespServer, _: &[Bytes]) -> Reply {
    match server.live_keys().await {
        Ok(count) => Reply::Integer(i64::try_from(count).unwrap_or(i64::MAX)),
        Err(e) => e,
    }
}

pub async fn get(server: &RespServer, args: &[Bytes]) -> Reply {
    match server.get(&args[0]).await {
        Ok(Some(value)) => Reply::Bulk(value),
        Ok(None) => Reply::Null,
        Err(e) => e,
    }
}

/// GET answered at once from this node's region ([`RespServer::get_now`]),
/// its reply encoded straight from the read buffer.
pub fn get_now(
    server: &RespServer,
    reads: &mut LocalReads<'_>,
    args: Args<'_>,
    protocol: Protocol,
    out: &mut BytesMut,
) -> bool {
    let Some(key) = args.get(1) else {
        return false;
    };
    server.get_now(reads, key, |value| match value {
        Some(value) => Reply::encode_bulk(value, out),
        None => Reply::Null.encode(protocol, out),
    })
}

pub fn strlen_reply(value: Option<&Bytes>) -> Reply {
    Reply::Integer(value.map_or(0, |v| v.len() as i64))
}

pub async fn strlen(server: &RespServer, args: &[Bytes]) -> Reply {
    match server.get(&args[0]).await {
        Ok(value) => strlen_reply(value.as_ref()),
        Err(e) => e,
    }
}

/// SET's options: the condition, whether the old value is returned, and
/// the written pair's expiry (`expiry::set_options` parses them).
#[derive(Debug)]
pub struct SetOptions {
    pub condition: SetCondition,
    pub get: bool,
    pub expiry: Expiry,
}

impl SetOptions {
    /// A plain SET: a `Put` (which clears any deadline, as a plain SET
    /// does in Redis), no read of the current value.
    pub fn is_plain(&self) -> bool {
        self.condition == SetCondition::Always && !self.get && self.expiry == Expiry::Never
    }

    pub fn update(&self, value: &Bytes) -> Update {
        Update::Set {
            value: value.clone(),
            condition: self.condition,
            return_old: self.get,
            expiry: self.expiry,
        }
    }

    /// The reply to a SET decided by the store.
    pub fn reply(&self, outcome: UpdateOutcome) -> Reply {
        match outcome {
            UpdateOutcome::Set { old, .. } if self.get => old.map_or(Reply::Null, Reply::Bulk),
            UpdateOutcome::Set { written: true, .. } => Reply::ok(),
            UpdateOutcome::Set { written: false, .. } => Reply::Null,
            other => unexpected(&other),
        }
    }
}

/// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT unix-s|PXAT unix-ms|KEEPTTL].
pub async fn set(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    match expiry::set_options(&args[2..]) {
        Ok(options) => set_with(server, &args[0], &args[1], options, place).await,
        Err(reply) => reply,
    }
}

/// SET (or SETEX) of `key` to `value` with its options checked: one write,
/// placed at `place` (`RespServer::call_placed`).
pub async fn set_with(
    server: &RespServer,
    key: &Bytes,
    value: &Bytes,
    options: SetOptions,
    place: Option<Finish>,
) -> Reply {
    if options.is_plain() {
        let request = Request::Put {
            key: key.clone(),
            value: value.clone(),
        };
        return match server.call_placed(request, place).await {
            Ok(Response::Written { .. }) => Reply::ok(),
            Ok(other) => unexpected(&other),
            Err(e) => e,
        };
    }
    match server.update(key, options.update(value), place).await {
        Ok(outcome) => options.reply(outcome),
        Err(e) => e,
    }
}

/// SETNX's update and reply.
pub fn setnx_update(value: &Bytes) -> Update {
    Update::SetIf {
        value: value.clone(),
        condition: SetCondition::IfAbsent,
        return_old: false,
    }
}

pub fn setnx_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Set { written, .. } => Reply::Integer(i64::from(written)),
        other => unexpected(&other),
    }
}

pub async fn setnx(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    match server.update(&args[0], setnx_update(&args[1]), place).await {
        Ok(outcome) => setnx_reply(outcome),
        Err(e) => e,
    }
}

/// GETSET's update and reply.
pub fn getset_update(value: &Bytes) -> Update {
    Update::SetIf {
        value: value.clone(),
        condition: SetCondition::Always,
        return_old: true,
    }
}

pub fn getset_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Set { old, .. } => old.map_or(Reply::Null, Reply::Bulk),
        other => unexpected(&other),
    }
}

pub async fn getset(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    match server
        .update(&args[0], getset_update(&args[1]), place)
        .await
    {
        Ok(outcome) => getset_reply(outcome),
        Err(e) => e,
    }
}

/// The delta of INCR, DECR, INCRBY or DECRBY (`args` after the name);
/// `None`: not an integer.
pub fn delta(command: &str, args: &[Bytes]) -> Option<i64> {
    match command {
        "incr" => Some(1),
        "decr" => Some(-1),
        "incrby" => integer_arg(&args[1]),
        _ => integer_arg(&args[1]).and_then(i64::checked_neg),
    }
}

pub fn add_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Integer { value, .. } => Reply::Integer(value),
        UpdateOutcome::NotAnInteger { .. } => Reply::not_integer(),
        other => unexpected(&other),
    }
}

async fn add(server: &RespServer, command: &str, args: &[Bytes], place: Option<Finish>) -> Reply {
    let Some(delta) = delta(command, args) else {
        return Reply::not_integer();
    };
    match server.update(&args[0], Update::Incr { delta }, place).await {
        Ok(outcome) => add_reply(outcome),
        Err(e) => e,
    }
}

pub async fn incr(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    add(server, "incr", args, place).await
}

pub async fn decr(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    add(server, "decr", args, place).await
}

pub async fn incrby(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    add(server, "incrby", args, place).await
}

pub async fn decrby(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    add(server, "decrby", args, place).await
}

pub fn append_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Length { len, .. } => Reply::Integer(len as i64),
        UpdateOutcome::TooLarge { .. } => Reply::err("string exceeds maximum allowed size"),
        other => unexpected(&other),
    }
}

pub async fn append(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    let update = Update::Append {
        suffix: args[1].clone(),
    };
    match server.update(&args[0], update, place).await {
        Ok(outcome) => append_reply(outcome),
        Err(e) => e,
    }
}

/// RENAME, RENAMENX or COPY (`args` after the name): the update of the
/// destination `args[1]`, decided by the store.
pub fn copy_update(command: &str, args: &[Bytes]) -> Result<Update, Reply> {
    let mut replace = command == "rename";
    if command == "copy" {
        let mut options = args[2..].iter();
        while let Some(option) = options.next() {
            match (upper(option).as_str(), options.next()) {
                ("REPLACE", next) => {
                    replace = true;
                    if next.is_some() {
                        return Err(Reply::syntax());
                    }
                }
                ("DB", Some(db)) if integer_arg(db) == Some(0) => {}
                ("DB", Some(_)) => return Err(Reply::err("DB index is out of range")),
                _ => return Err(Reply::syntax()),
            }
        }
        if args[0] == args[1] {
            return Err(Reply::err("source and destination objects are the same"));
        }
    }
    Ok(Update::CopyFrom {
        source: args[0].clone(),
        replace,
        remove_source: command != "copy",
    })
}

fn copied(outcome: UpdateOutcome) -> Result<bool, Reply> {
    match outcome {
        UpdateOutcome::Copied {
            source_missing: true,
            ..
        } => Err(Reply::err("no such key")),
        UpdateOutcome::Copied { copied, .. } => Ok(copied),
        other => Err(unexpected(&other)),
    }
}

pub fn rename_reply(outcome: UpdateOutcome) -> Reply {
    copied(outcome).map_or_else(|e| e, |_| Reply::ok())
}

pub fn renamenx_reply(outcome: UpdateOutcome) -> Reply {
    copied(outcome).map_or_else(|e| e, |c| Reply::Integer(i64::from(c)))
}

/// COPY answers 0, not an error, when the source is missing.
pub fn copy_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Copied { copied, .. } => Reply::Integer(i64::from(copied)),
        other => unexpected(&other),
    }
}

async fn copy_command(
    server: &RespServer,
    command: &str,
    args: &[Bytes],
    reply: fn(UpdateOutcome) -> Reply,
    place: Option<Finish>,
) -> Reply {
    updated(server, &args[1], copy_update(command, args), reply, place).await
}

/// Applies `update` to `key` and answers with `reply` of its outcome; an
/// argument error (`Err`) is the reply, nothing is sent. The command's
/// only write: placed at `place` (`RespServer::call_placed`).
pub async fn updated(
    server: &RespServer,
    key: &Bytes,
    update: Result<Update, Reply>,
    reply: fn(UpdateOutcome) -> Reply,
    place: Option<Finish>,
) -> Reply {
    let update = match update {
        Ok(update) => update,
        Err(refused) => return refused,
    };
    match server.update(key, update, place).await {
        Ok(outcome) => reply(outcome),
        Err(e) => e,
    }
}

pub async fn rename(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    copy_command(server, "rename", args, rename_reply, place).await
}

pub async fn renamenx(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    copy_command(server, "renamenx", args, renamenx_reply, place).await
}

pub async fn copy(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    copy_command(server, "copy", args, copy_reply, place).await
}

/// DEL: one delete per key, in turn. Only the last is given `place`, so the
/// command is placed once every earlier delete has finished and the last
/// is queued.
pub async fn del(server: &RespServer, args: &[Bytes], mut place: Option<Finish>) -> Reply {
    let mut deleted = 0;
    for (at, key) in args.iter().enumerate() {
        let last = at + 1 == args.len();
        let place = if last { place.take() } else { None };
        match server
            .call_placed(Request::Delete { key: key.clone() }, place)
            .await
        {
            Ok(Response::Deleted { existed, .. }) => deleted += i64::from(existed),
            Ok(other) => return unexpected(&other),
            Err(e) => return e,
        }
    }
    Reply::Integer(deleted)
}

pub async fn exists(server: &RespServer, args: &[Bytes]) -> Reply {
    match server.mget(args).await {
        Ok(values) => Reply::Integer(values.iter().filter(|v| v.is_some()).count() as i64),
        Err(e) => e,
    }
}

pub async fn mget(server: &RespServer, args: &[Bytes]) -> Reply {
    match server.mget(args).await {
        Ok(values) => values_reply(values),
        Err(e) => e,
    }
}

/// MGET answered at once from this node's region ([`RespServer::mget_now`]).
pub fn mget_now(
    server: &RespServer,
    reads: &mut LocalReads<'_>,
    args: Args<'_>,
    protocol: Protocol,
    out: &mut BytesMut,
) -> bool {
    let Some(values) = server.mget_now(reads, args.iter_from(1)) else {
        return false;
    };
    values_reply(values).encode(protocol, out);
    true
}

pub fn values_reply(values: Vec<Option<Bytes>>) -> Reply {
    Reply::Array(
        values
            .into_iter()
            .map(|v| v.map_or(Reply::Null, Reply::Bulk))
            .collect(),
    )
}

pub async fn mset(server: &RespServer, args: &[Bytes]) -> Reply {
    if !args.len().is_multiple_of(2) {
        return Reply::wrong_arity("mset");
    }
    let pairs: Vec<(Bytes, Bytes)> = args
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    let Some(groups) = server.split_by_shard(pairs.iter().map(|(key, _)| key)) else {
        return mput(server, pairs).await;
    };
    // Keys of several shards: one MPut per shard, at once; atomic per
    // shard only (docs/resp.md).
    let parts = groups.iter().map(|positions| {
        mput(
            server,
            positions.iter().map(|&at| pairs[at].clone()).collect(),
        )
    });
    mset_parts_reply(futures::future::join_all(parts).await)
}

/// `pairs` written as one log entry (all of one shard, or a single group).
async fn mput(server: &RespServer, pairs: Vec<(Bytes, Bytes)>) -> Reply {
    match server.call(Request::MPut { pairs }).await {
        Ok(Response::MWritten { .. }) => Reply::ok(),
        Ok(other) => unexpected(&other),
        Err(e) => e,
    }
}

/// MSET's reply from its shards' parts: OK when every part was written,
/// else an error that says how many parts were (the others' keys were
/// not, or their outcome is unknown), with the first failure.
fn mset_parts_reply(parts: Vec<Reply>) -> Reply {
    let mut failures = parts.iter().filter_map(|part| match part {
        Reply::Error(message) => Some(message.as_str()),
        _ => None,
    });
    let Some(first) = failures.next() else {
        return Reply::ok();
    };
    let failed = 1 + failures.count();
    Reply::err(format!(
        "MSET over {} shards is atomic per shard only: {} of them written, {failed} not \
         (or unknown); first failure: {first}",
        parts.len(),
        parts.len() - failed
    ))
}

/// FLUSHDB / FLUSHALL [SYNC|ASYNC]: replicated like any write (on a
/// multi-shard node, one write per shard: not atomic across shards); with
/// a token configured the connection is authenticated by now (AUTH gates
/// every command).
pub async fn flush(server: &RespServer, args: &[Bytes]) -> Reply {
    match args {
        [] => {}
        [mode] if mode.eq_ignore_ascii_case(b"sync") || mode.eq_ignore_ascii_case(b"async") => {}
        _ => return Reply::err("syntax error"),
    }
    match server.clear().await {
        Ok(()) => Reply::ok(),
        Err(e) => e,
    }
}

/// "master" or the name Redis gives a follower in `context`.
fn redis_role(role: Role, follower: &'static str) -> &'static str {
    if role == Role::Leader {
        "master"
    } else {
        follower
    }
}

pub fn info(session: &mut Session<'_>, args: &[Bytes]) -> Reply {
    let wanted: Vec<String> = args.iter().map(|a| upper(a)).collect();
    let show = |section: &str| {
        wanted.is_empty()
            || wanted
                .iter()
                .any(|w| w == section || w == "ALL" || w == "DEFAULT" || w == "EVERYTHING")
    };
    let server = session.server();
    let status = server.handler.status();
    let mut text = String::new();
    if show("SERVER") {
        text.push_str(&format!(
            "# Server\r\nredis_version:7.0.0\r\nrdkv_version:{}\r\nredis_mode:standalone\r\nos:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nrdkv_node_id:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            server.port,
            status.id,
        ));
    }
    if show("REPLICATION") {
        text.push_str(&format!(
            "# Replication\r\nrole:{}\r\nraft_role:{:?}\r\nraft_term:{}\r\nraft_leader_id:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\nconnected_slaves:{}\r\n\r\n",
            redis_role(status.role, "slave"),
            status.role,
            status.term,
            status.leader_id.map_or_else(|| "none".to_owned(), |l| l.to_string()),
            status.commit_index,
            status.applied_index,
            status.members.len().saturating_sub(1),
        ));
    }
    if show("KEYSPACE") {
        // Like Redis's (a Redis Cluster node's too), the keys this node
        // holds: every hosted shard's replica. Both counts include keys
        // expired but not yet removed by the active expire cycle.
        let (keys, expires) =
            server
                .handler
                .shards()
                .iter()
                .fold((0, 0), |(keys, expires), (_, replica)| {
                    (
                        keys + replica.live_keys(),
                        expires + replica.sm.expiring_keys() as u64,
                    )
                });
        text.push_str(&format!(
            "# Keyspace\r\ndb0:keys={keys},expires={expires},avg_ttl=0\r\n"
        ));
    }
    if server.handler.shards().is_sharded() && show("SHARDS") {
        text.push_str(&shards_section(server));
    }
    Reply::Verbatim(text)
}

/// INFO's `# Shards` (rdkv's own section, a multi-shard node only): a
/// line per hosted shard replica, as its own Raft sees it. The
/// Replication section above is the node's first shard's.
fn shards_section(server: &RespServer) -> String {
    let mut text = String::from("\r\n# Shards\r\n");
    for (shard, replica) in server.handler.shards().iter() {
        let status = shard_status(shard, &replica);
        text.push_str(&format!(
            "shard{}:role={},raft_role={:?},term={},leader_id={},members={},commit_index={},applied_index={},keys={},expires={}\r\n",
            status.shard.0,
            redis_role(status.role, "slave"),
            status.role,
            status.term,
            status.leader_id.map_or_else(|| "none".to_owned(), |l| l.to_string()),
            status.members.len(),
            status.commit_index,
            status.applied_index,
            status.region.live_keys,
            replica.sm.expiring_keys(),
        ));
    }
    text
}

/// The HELLO reply: the server, and the connection's id and protocol.
pub fn hello_reply(server: &RespServer, client_id: u64, protocol: Protocol) -> Reply {
    let status = server.handler.status();
    let s = |text: &str| Reply::bulk(Bytes::copy_from_slice(text.as_bytes()));
    Reply::Map(vec![
        (s("server"), s("rdkv")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Reply::Integer(protocol.version())),
        (
            s("id"),
            Reply::Integer(i64::try_from(client_id).unwrap_or(i64::MAX)),
        ),
        (s("mode"), s("standalone")),
        (s("role"), s(redis_role(status.role, "replica"))),
        (s("modules"), Reply::Array(Vec::new())),
    ])
}

/// CONFIG GET: the few settings redis-benchmark and clients ask for.
pub fn config(args: &[Bytes]) -> Reply {
    match upper(&args[0]).as_str() {
        "GET" if args.len() >= 2 => {
            let settings = [("save", ""), ("appendonly", "no"), ("databases", "1")];
            let mut out = Vec::new();
            for pattern in &args[1..] {
                for (name, value) in settings {
                    if glob_match(pattern, name.as_bytes(), true) {
                        out.push((Reply::bulk(name.to_owned()), Reply::bulk(value.to_owned())));
                    }
                }
            }
            Reply::Map(out)
        }
        "GET" => Reply::wrong_arity("config|get"),
        other => Reply::err(format!("CONFIG {other} is not supported by rdkv")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arguments_are_canonical_decimals() {
        assert_eq!(integer_arg(b"-12"), Some(-12));
        assert_eq!(integer_arg(b"+12"), None);
        assert_eq!(integer_arg(b"012"), None);
        assert_eq!(integer_arg(b"x"), None);
    }

    #[test]
    fn config_get_answers_what_redis_benchmark_asks() {
        let reply = config(&[Bytes::from("GET"), Bytes::from("save")]);
        assert_eq!(
            reply,
            Reply::Map(vec![(Reply::bulk("save"), Reply::bulk(""))])
        );
        let reply = config(&[Bytes::from("get"), Bytes::from("appendonly")]);
        assert_eq!(
            reply,
            Reply::Map(vec![(Reply::bulk("appendonly"), Reply::bulk("no"))])
        );
    }
}
