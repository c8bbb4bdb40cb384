//! MULTI/EXEC/DISCARD and WATCH/UNWATCH: the commands queued between MULTI
//! and EXEC become one `Request::Transaction`, one log entry that applies
//! them in order with nothing between them, on the condition that every
//! watched key still has the version WATCH read.
//!
//! A queued command is planned when it is queued: the native ops it needs
//! (`TxnOp`s) and how their results become its reply ([`Finish`]). A
//! command that cannot run in a transaction, or a wrong arity, fails the
//! transaction at EXEC (`EXECABORT`), as in Redis; an error only EXEC can
//! find (a non-integer INCR) is that command's reply, and the others run:
//! Redis has no rollback either.

use bytes::Bytes;
use rdkv_proto::wire::{Request, Response, TxnOp, TxnResult, Update, UpdateOutcome};

use super::RespServer;
use super::commands::{self, SetOptions};
use super::expiry::{self, GetEx, TimeForm};
use super::keyspace;
use super::parse::detached;
use super::reply::Reply;
use super::session::Session;
use super::store::unexpected as unexpected_reply;
use super::table::Spec;

/// Commands that run at once inside MULTI instead of being queued.
pub const RUN_INSIDE_MULTI: &[&str] = &["exec", "discard", "multi", "watch", "quit", "reset"];

/// How a queued command's op results become its reply.
#[derive(Debug)]
enum Finish {
    /// Known when queued (PING, ECHO, UNWATCH, an argument error).
    Known(Reply),
    /// GET.
    Value,
    /// STRLEN.
    Strlen,
    /// TYPE.
    Type,
    /// MGET.
    Values,
    /// EXISTS (present keys), DEL and UNLINK (deleted keys).
    Count,
    /// Plain SET, MSET.
    Ok,
    /// A SET with options, SETEX, PSETEX.
    Set(SetOptions),
    /// SETNX, GETSET, INCR and its kin, APPEND, the EXPIRE family,
    /// PERSIST, GETEX with an option, GETDEL.
    Outcome(fn(UpdateOutcome) -> Reply),
    /// TTL, PTTL, EXPIRETIME, PEXPIRETIME.
    Ttl(TimeForm),
    /// GETEX with a time Redis refuses once it finds the key.
    RefusedIfFound(Reply),
}

#[derive(Debug)]
struct Queued {
    ops: Vec<TxnOp>,
    finish: Finish,
}

/// A transaction being queued.
#[derive(Debug, Default)]
pub struct Multi {
    queued: Vec<Queued>,
    ops: usize,
    bytes: usize,
    /// A command was refused while queueing: EXEC discards the transaction.
    failed: bool,
}

impl Multi {
    pub fn fail(&mut self) {
        self.failed = true;
    }
}

/// Queues command `argv` (its row is `spec`): `+QUEUED`, or the error that
/// will make EXEC discard the transaction.
pub fn queue(session: &mut Session<'_>, spec: &Spec, argv: &[Bytes]) -> Reply {
    let limits = session.server().handler.limits();
    let Some(multi) = session.multi_mut() else {
        return Reply::err("not in a transaction");
    };
    // Queued until EXEC: its own copy, not the connection's read buffer.
    let argv = detached(argv);
    let planned = match plan(spec.name, &argv[1..]) {
        Ok(planned) => planned,
        Err(reply) => {
            multi.failed = true;
            return reply;
        }
    };
    let bytes: usize = argv.iter().map(Bytes::len).sum();
    let max_ops = usize::try_from(limits.max_batch_keys).unwrap_or(usize::MAX);
    let max_bytes = usize::try_from(limits.max_frame_bytes).unwrap_or(usize::MAX);
    if multi.ops + planned.ops.len() > max_ops || multi.bytes + bytes > max_bytes {
        multi.failed = true;
        return Reply::err(format!(
            "a transaction holds at most {max_ops} keys and {max_bytes} bytes of arguments in rdkv"
        ));
    }
    multi.ops += planned.ops.len();
    multi.bytes += bytes;
    multi.queued.push(planned);
    Reply::Simple("QUEUED")
}

fn get_ops(keys: &[Bytes]) -> Vec<TxnOp> {
    keys.iter()
        .map(|key| TxnOp::Get { key: key.clone() })
        .collect()
}

fn update_op(key: &Bytes, update: Update) -> Vec<TxnOp> {
    vec![TxnOp::Update {
        key: key.clone(),
        update,
    }]
}

fn queued(ops: Vec<TxnOp>, finish: Finish) -> Result<Queued, Reply> {
    Ok(Queued { ops, finish })
}

fn known(reply: Reply) -> Result<Queued, Reply> {
    queued(Vec::new(), Finish::Known(reply))
}

/// The ops and reply of command `name` with arguments `args` (arity
/// already checked by the table).
fn plan(name: &str, args: &[Bytes]) -> Result<Queued, Reply> {
    match name {
        "ping" => known(commands::ping(args)),
        "echo" => known(commands::echo(args)),
        "unwatch" => known(Reply::ok()),
        "get" => queued(get_ops(args), Finish::Value),
        "strlen" => queued(get_ops(args), Finish::Strlen),
        "type" => queued(get_ops(args), Finish::Type),
        "mget" => queued(get_ops(args), Finish::Values),
        "exists" => queued(get_ops(args), Finish::Count),
        "del" | "unlink" => {
            let ops = args.iter().map(|key| TxnOp::Delete { key: key.clone() });
            queued(ops.collect(), Finish::Count)
        }
        "set" => match expiry::set_options(&args[2..]) {
            Ok(options) => plan_set(&args[0], &args[1], options),
            Err(reply) => known(reply),
        },
        "mset" if !args.len().is_multiple_of(2) => known(Reply::wrong_arity("mset")),
        "mset" => {
            let ops = args.chunks_exact(2).map(|pair| TxnOp::Put {
                key: pair[0].clone(),
                value: pair[1].clone(),
            });
            queued(ops.collect(), Finish::Ok)
        }
        "setnx" => queued(
            update_op(&args[0], commands::setnx_update(&args[1])),
            Finish::Outcome(commands::setnx_reply),
        ),
        "getset" => queued(
            update_op(&args[0], commands::getset_update(&args[1])),
            Finish::Outcome(commands::getset_reply),
        ),
        "incr" | "decr" | "incrby" | "decrby" => match commands::delta(name, args) {
            Some(delta) => queued(
                update_op(&args[0], Update::Incr { delta }),
                Finish::Outcome(commands::add_reply),
            ),
            None => known(Reply::not_integer()),
        },
        "append" => queued(
            update_op(
                &args[0],
                Update::Append {
                    suffix: args[1].clone(),
                },
            ),
            Finish::Outcome(commands::append_reply),
        ),
        "rename" | "renamenx" | "copy" => {
            let reply = match name {
                "rename" => commands::rename_reply,
                "renamenx" => commands::renamenx_reply,
                _ => commands::copy_reply,
            };
            planned_update(&args[1], commands::copy_update(name, args), reply)
        }
        other => plan_expiry(other, args),
    }
}

/// The ops and reply of an expiry command, or the refusal of a command
/// that cannot run in a transaction.
fn plan_expiry(name: &str, args: &[Bytes]) -> Result<Queued, Reply> {
    match name {
        "setex" | "psetex" => match expiry::setex_options(name, args) {
            Ok(options) => plan_set(&args[0], &args[2], options),
            Err(reply) => known(reply),
        },
        "expire" | "pexpire" | "expireat" | "pexpireat" => planned_update(
            &args[0],
            expiry::expire_update(name, args),
            expiry::expire_reply,
        ),
        "persist" => planned_update(&args[0], Ok(expiry::persist_update()), expiry::expire_reply),
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => {
            let op = TxnOp::Ttl {
                key: args[0].clone(),
            };
            queued(vec![op], Finish::Ttl(TimeForm::of_command(name)))
        }
        "getex" => plan_getex(args),
        "getdel" => planned_update(&args[0], Ok(Update::GetDel), expiry::got_reply),
        other => Err(Reply::err(format!(
            "'{other}' cannot run inside MULTI in rdkv (docs/resp.md lists the commands that can)"
        ))),
    }
}

/// A command of one update; an argument error is its reply at EXEC, as
/// in Redis.
fn planned_update(
    key: &Bytes,
    update: Result<Update, Reply>,
    reply: fn(UpdateOutcome) -> Reply,
) -> Result<Queued, Reply> {
    match update {
        Ok(update) => queued(update_op(key, update), Finish::Outcome(reply)),
        Err(error) => known(error),
    }
}

fn plan_set(key: &Bytes, value: &Bytes, options: SetOptions) -> Result<Queued, Reply> {
    if options.is_plain() {
        let op = TxnOp::Put {
            key: key.clone(),
            value: value.clone(),
        };
        return queued(vec![op], Finish::Ok);
    }
    queued(update_op(key, options.update(value)), Finish::Set(options))
}

fn plan_getex(args: &[Bytes]) -> Result<Queued, Reply> {
    match expiry::getex_plan(args) {
        Ok(GetEx::Read) => queued(get_ops(&args[..1]), Finish::Value),
        Ok(GetEx::Update(update)) => planned_update(&args[0], Ok(update), expiry::got_reply),
        Ok(GetEx::RefusedIfFound(refused)) => {
            queued(get_ops(&args[..1]), Finish::RefusedIfFound(refused))
        }
        Err(reply) => known(reply),
    }
}

/// The reply of one queued command from its ops' results.
fn finish(finish: Finish, results: Vec<TxnResult>) -> Reply {
    if let Some(TxnResult::Error(error)) = results.iter().find(|r| matches!(r, TxnResult::Error(_)))
    {
        return super::forward::error_reply(error);
    }
    let values = || {
        results.iter().map(|r| match r {
            TxnResult::Value(value) => value.as_ref().map(|v| v.value.clone()),
            _ => None,
        })
    };
    let outcome = || match results.first() {
        Some(TxnResult::Updated(outcome)) => Ok(outcome.clone()),
        other => Err(unexpected_reply(&other)),
    };
    match finish {
        Finish::Known(reply) => reply,
        Finish::Value => values().next().flatten().map_or(Reply::Null, Reply::Bulk),
        Finish::Strlen => commands::strlen_reply(values().next().flatten().as_ref()),
        Finish::Type => keyspace::type_reply(values().next().flatten().as_ref()),
        Finish::Values => commands::values_reply(values().collect()),
        Finish::Count => Reply::Integer(
            results
                .iter()
                .filter(|r| {
                    matches!(
                        r,
                        TxnResult::Value(Some(_)) | TxnResult::Deleted { existed: true }
                    )
                })
                .count() as i64,
        ),
        Finish::Ok => Reply::ok(),
        Finish::Set(options) => outcome().map_or_else(|e| e, |o| options.reply(o)),
        Finish::Outcome(reply) => outcome().map_or_else(|e| e, reply),
        Finish::Ttl(form) => match results.first() {
            Some(TxnResult::Expiry(expiry)) => expiry::ttl_reply(form, *expiry),
            other => unexpected_reply(&other),
        },
        Finish::RefusedIfFound(refused) => {
            expiry::refused_if_found(refused, values().next().flatten().as_ref())
        }
    }
}

/// EXEC: runs the queued commands as one transaction.
pub async fn exec(session: &mut Session<'_>) -> Reply {
    let Some(multi) = session.take_multi() else {
        return Reply::err("EXEC without MULTI");
    };
    let watch = session.take_watched();
    if multi.failed {
        return Reply::Error("EXECABORT Transaction discarded because of previous errors.".into());
    }
    let mut ops = Vec::with_capacity(multi.ops);
    let mut finishes = Vec::with_capacity(multi.queued.len());
    for queued in multi.queued {
        finishes.push((queued.ops.len(), queued.finish));
        ops.extend(queued.ops);
    }
    let results = if ops.is_empty() && watch.is_empty() {
        Vec::new()
    } else {
        match run(session.server(), watch, ops).await {
            Ok(Some(results)) => results,
            Ok(None) => return Reply::NullArray,
            Err(reply) => return reply,
        }
    };
    let mut results = results.into_iter();
    let replies = finishes
        .into_iter()
        .map(|(count, how)| finish(how, results.by_ref().take(count).collect()))
        .collect();
    Reply::Array(replies)
}

/// The transaction's results; `None`: aborted (a watched key changed).
async fn run(
    server: &RespServer,
    watch: Vec<(Bytes, Option<u64>)>,
    ops: Vec<TxnOp>,
) -> Result<Option<Vec<TxnResult>>, Reply> {
    let expected = ops.len();
    match server.call(Request::Transaction { watch, ops }).await? {
        Response::Transaction { aborted: true, .. } => Ok(None),
        Response::Transaction { results, .. } if results.len() == expected => Ok(Some(results)),
        other => Err(unexpected_reply(&other)),
    }
}

/// WATCH key [key ...]: remembers each key's version now; EXEC applies
/// nothing if any of them changed by then.
pub async fn watch(session: &mut Session<'_>, keys: &[Bytes]) -> Reply {
    if session.multi_mut().is_some() {
        return Reply::err("WATCH inside MULTI is not allowed");
    }
    let limits = session.server().handler.limits();
    let max = usize::try_from(limits.max_batch_keys).unwrap_or(usize::MAX);
    if session.watched_len() + keys.len() > max {
        return Reply::err(format!("a connection watches at most {max} keys in rdkv"));
    }
    match session.server().versions(keys).await {
        Ok(versions) => {
            session.watch(keys.iter().cloned().zip(versions));
            Reply::ok()
        }
        Err(reply) => reply,
    }
}
