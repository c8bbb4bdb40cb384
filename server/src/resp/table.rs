//! The commands the front end knows, one row each: name, arity, flags, key
//! positions, whether it is allowed before AUTH, and its handler. Dispatch
//! (`Session::prepare`) and the `COMMAND` reply are both read from here.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use rdkv_proto::wire::Op;
use rdkv_storage::state_machine::LocalReads;

use super::RespServer;
use super::client_command;
use super::cluster;
use super::commands::{self, upper};
use super::expiry;
use super::keyspace;
use super::parse::Args;
use super::reply::{Protocol, Reply};
use super::session::SessionRun;
use crate::order::Finish;

/// What a command served by the store returns: it may wait for Raft or the
/// leader.
pub type StoreFuture<'a> = Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

/// A handler of a command served by the store.
#[derive(Debug, Clone, Copy)]
pub enum StoreRun {
    /// Any number of store calls: the command's place among the writes of
    /// its keys is fixed only once it has finished.
    Steps(for<'a> fn(&'a RespServer, &'a [Bytes]) -> StoreFuture<'a>),
    /// Its last store call is a write of one log entry, decided in apply,
    /// and no earlier call reads (one write; DEL's deletes in turn): the
    /// command is placed once that write is queued for Raft. It is handed
    /// its place (`Some`: dropping it lets the connection's next write of
    /// its keys be proposed) for that call (`RespServer::call_placed`).
    Placed(for<'a> fn(&'a RespServer, &'a [Bytes], Option<Finish>) -> StoreFuture<'a>),
}

impl StoreRun {
    /// Whether the command is placed before it finishes.
    pub fn is_placed(self) -> bool {
        matches!(self, StoreRun::Placed(_))
    }

    /// Starts the command with `args` (after the name). A placed one takes
    /// `place`; any other leaves it with the caller, to hold until the
    /// command has finished.
    pub fn start<'a>(
        self,
        server: &'a RespServer,
        args: &'a [Bytes],
        place: &mut Option<Finish>,
    ) -> StoreFuture<'a> {
        match self {
            StoreRun::Steps(run) => run(server, args),
            StoreRun::Placed(run) => run(server, args, place.take()),
        }
    }
}

/// A read served at once from this node's region, called only once the
/// node may serve reads from it (`RespServer::reads_now`), through the
/// batch's kept reader (`LocalReads`), with the command's arguments (the
/// name first) as a view of the connection's input: `true` once its reply
/// is appended to the buffer, encoded in the protocol given; `false`,
/// nothing appended: this one may not be (the command runs as a store
/// command instead).
pub type NowRun = fn(&RespServer, &mut LocalReads<'_>, Args<'_>, Protocol, &mut BytesMut) -> bool;

/// How a command is run; every handler gets the arguments after the name.
#[derive(Debug, Clone, Copy)]
pub enum Run {
    /// `+OK`, then the connection closes.
    Quit,
    /// Answered from the arguments alone.
    Pure(fn(&[Bytes]) -> Reply),
    /// Reads or changes the connection's state, or reads the node's.
    Session(SessionRun),
    /// Served by the store, here or at the leader.
    Store(StoreRun),
    /// EXEC: waits for every earlier command, then runs the transaction.
    Exec,
    /// WATCH: waits for every earlier command, then reads versions.
    Watch,
}

/// Where a command's keys are, as `COMMAND` reports them: the first and last
/// argument index (negative: from the end) and the step between keys.
#[derive(Debug, Clone, Copy)]
pub struct Keys {
    first: i64,
    last: i64,
    step: i64,
}

impl Keys {
    const NONE: Keys = Keys {
        first: 0,
        last: 0,
        step: 0,
    };
    const ONE: Keys = Keys {
        first: 1,
        last: 1,
        step: 1,
    };
    const ALL: Keys = Keys {
        first: 1,
        last: -1,
        step: 1,
    };
    /// `key value key value ...`
    const TWO: Keys = Keys {
        first: 1,
        last: 2,
        step: 1,
    };
    const PAIRS: Keys = Keys {
        first: 1,
        last: -1,
        step: 2,
    };
}

#[derive(Debug)]
pub struct Spec {
    pub name: &'static str,
    /// Arguments including the name; negative: at least that many.
    arity: i64,
    flags: &'static [&'static str],
    keys: Keys,
    /// Allowed on a connection that has not authenticated.
    pub before_auth: bool,
    pub run: Run,
    /// A store read's way to be answered at once, skipping the store's
    /// queue, when nothing earlier on the connection writes its keys; the
    /// op it counts as in the request metrics.
    pub now: Option<(Op, NowRun)>,
}

const fn row(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: Keys,
    run: Run,
) -> Spec {
    Spec {
        name,
        arity,
        flags,
        keys,
        before_auth: false,
        run,
        now: None,
    }
}

impl Spec {
    const fn before_auth(self) -> Spec {
        Spec {
            before_auth: true,
            ..self
        }
    }

    const fn answered_now(self, op: Op, now: NowRun) -> Spec {
        Spec {
            now: Some((op, now)),
            ..self
        }
    }

    /// Whether `argc` arguments (the name included) fit the arity.
    pub fn accepts(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        if self.arity >= 0 {
            argc == self.arity
        } else {
            argc >= -self.arity
        }
    }

    /// Whether the command only reads (its flags say `readonly`).
    pub fn is_read(&self) -> bool {
        self.flags.contains(&"readonly")
    }

    /// Whether the command may change the store (its flags say `write`).
    pub fn writes(&self) -> bool {
        self.flags.contains(&"write")
    }

    /// The keys in `argv` (the name first), by the row's key positions.
    pub fn keys_in<'b>(&self, argv: &'b [Bytes]) -> Vec<&'b Bytes> {
        self.key_positions(argv.len())
            .filter_map(|i| argv.get(i))
            .collect()
    }

    /// [`Self::keys_in`] of a borrowed view of the arguments.
    pub fn keys_in_args<'b>(&self, args: Args<'b>) -> Vec<&'b [u8]> {
        self.key_positions(args.len())
            .filter_map(|i| args.get(i))
            .collect()
    }

    /// Where the keys are among `argc` arguments (the name at 0).
    fn key_positions(&self, argc: usize) -> impl Iterator<Item = usize> + use<> {
        let Keys { first, last, step } = self.keys;
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let last = if last < 0 { argc + last } else { last };
        // No keys: an empty range (a keyless row's step is 0).
        let (first, last, step) = if first <= 0 || step <= 0 || last < first {
            (1, 0, 1)
        } else {
            (first, last.min(argc - 1), step)
        };
        (first..=last)
            .step_by(usize::try_from(step).unwrap_or(1))
            .filter_map(|i| usize::try_from(i).ok())
    }

    /// This command's entry in the `COMMAND` reply.
    fn entry(&self) -> Reply {
        Reply::Array(vec![
            Reply::bulk(self.name.to_owned()),
            Reply::Integer(self.arity),
            Reply::Array(
                self.flags
                    .iter()
                    .map(|f| Reply::Status((*f).to_owned()))
                    .collect(),
            ),
            Reply::Integer(self.keys.first),
            Reply::Integer(self.keys.last),
            Reply::Integer(self.keys.step),
            // ACL categories: none (there are no ACLs). Redis 6 and later
            // send this element, and redis-py's RESP3 parser reads it.
            Reply::Array(Vec::new()),
        ])
    }
}

/// A handler of `commands` served by the store.
macro_rules! store {
    ($handler:path) => {
        Run::Store(StoreRun::Steps(|server, args| {
            Box::pin($handler(server, args))
        }))
    };
}

/// A handler placed once its last store call, a write, is queued
/// (`StoreRun::Placed`).
macro_rules! placed {
    ($handler:path) => {
        Run::Store(StoreRun::Placed(|server, args, place| {
            Box::pin($handler(server, args, place))
        }))
    };
}

const NONE: Keys = Keys::NONE;
const ONE: Keys = Keys::ONE;
const ALL: Keys = Keys::ALL;
const READ: &[&str] = &["readonly", "fast"];
const FAST_WRITE: &[&str] = &["write", "fast"];

pub static COMMANDS: &[Spec] = &[
    row(
        "ping",
        -1,
        &["fast", "stale"],
        NONE,
        Run::Pure(commands::ping),
    )
    .before_auth(),
    row("echo", 2, &["fast"], NONE, Run::Pure(commands::echo)),
    row("quit", -1, &["fast"], NONE, Run::Quit).before_auth(),
    row("select", 2, &["fast"], NONE, Run::Pure(commands::select)),
    row(
        "hello",
        -1,
        &["fast"],
        NONE,
        Run::Session(|session, args| session.hello(args)),
    )
    .before_auth(),
    row(
        "auth",
        -2,
        &["fast"],
        NONE,
        Run::Session(|session, args| session.auth(args)),
    )
    .before_auth(),
    row(
        "reset",
        1,
        &["fast", "stale"],
        NONE,
        Run::Session(|session, args| session.reset(args)),
    )
    .before_auth(),
    row(
        "client",
        -2,
        &["admin", "stale"],
        NONE,
        Run::Session(client_command::client),
    ),
    row("multi", 1, &["fast"], NONE, Run::Session(|s, _| s.multi())),
    row("exec", 1, &["write"], NONE, Run::Exec),
    row(
        "discard",
        1,
        &["fast"],
        NONE,
        Run::Session(|s, _| s.discard()),
    ),
    row("watch", -2, &["fast"], ALL, Run::Watch),
    row(
        "unwatch",
        1,
        &["fast"],
        NONE,
        Run::Session(|s, _| s.unwatch()),
    ),
    row("get", 2, READ, ONE, store!(commands::get)).answered_now(Op::Get, commands::get_now),
    row("set", -3, &["write"], ONE, placed!(commands::set)),
    row("setex", 4, &["write"], ONE, placed!(expiry::setex)),
    row("psetex", 4, &["write"], ONE, placed!(expiry::psetex)),
    row("setnx", 3, FAST_WRITE, ONE, placed!(commands::setnx)),
    row("getset", 3, FAST_WRITE, ONE, placed!(commands::getset)),
    row("getex", -2, FAST_WRITE, ONE, store!(expiry::getex)),
    row("getdel", 2, FAST_WRITE, ONE, placed!(expiry::getdel)),
    row("expire", -3, FAST_WRITE, ONE, placed!(expiry::expire)),
    row("pexpire", -3, FAST_WRITE, ONE, placed!(expiry::pexpire)),
    row("expireat", -3, FAST_WRITE, ONE, placed!(expiry::expireat)),
    row("pexpireat", -3, FAST_WRITE, ONE, placed!(expiry::pexpireat)),
    row("persist", 2, FAST_WRITE, ONE, placed!(expiry::persist)),
    row("ttl", 2, READ, ONE, store!(expiry::ttl)),
    row("pttl", 2, READ, ONE, store!(expiry::pttl)),
    row("expiretime", 2, READ, ONE, store!(expiry::expiretime)),
    row("pexpiretime", 2, READ, ONE, store!(expiry::pexpiretime)),
    row("del", -2, &["write"], ALL, placed!(commands::del)),
    row("exists", -2, READ, ALL, store!(commands::exists)),
    row("unlink", -2, FAST_WRITE, ALL, placed!(commands::del)),
    row("type", 2, READ, ONE, store!(keyspace::key_type)),
    row(
        "rename",
        3,
        &["write"],
        Keys::TWO,
        placed!(commands::rename),
    ),
    row(
        "renamenx",
        3,
        FAST_WRITE,
        Keys::TWO,
        placed!(commands::renamenx),
    ),
    row("copy", -3, &["write"], Keys::TWO, placed!(commands::copy)),
    row("keys", 2, &["readonly"], NONE, store!(keyspace::keys)),
    row("scan", -2, &["readonly"], NONE, store!(keyspace::scan)),
    row("mget", -2, READ, ALL, store!(commands::mget)).answered_now(Op::MGet, commands::mget_now),
    row("mset", -3, &["write"], Keys::PAIRS, store!(commands::mset)),
    row("incr", 2, FAST_WRITE, ONE, placed!(commands::incr)),
    row("incrby", 3, FAST_WRITE, ONE, placed!(commands::incrby)),
    row("decr", 2, FAST_WRITE, ONE, placed!(commands::decr)),
    row("decrby", 3, FAST_WRITE, ONE, placed!(commands::decrby)),
    row("append", 3, FAST_WRITE, ONE, placed!(commands::append)),
    row("strlen", 2, READ, ONE, store!(commands::strlen)),
    row("dbsize", 1, READ, NONE, store!(commands::dbsize)),
    row("flushdb", -1, &["write"], NONE, store!(commands::flush)),
    row("flushall", -1, &["write"], NONE, store!(commands::flush)),
    row("info", -1, &["stale"], NONE, Run::Session(commands::info)),
    row("command", -1, &["stale"], NONE, Run::Pure(command)),
    row("config", -2, &["admin"], NONE, Run::Pure(commands::config)),
    row("cluster", -2, &["stale"], NONE, store!(cluster::cluster)),
    row(
        "readonly",
        1,
        &["fast"],
        NONE,
        Run::Session(|s, _| s.set_readonly(true)),
    ),
    row(
        "readwrite",
        1,
        &["fast"],
        NONE,
        Run::Session(|s, _| s.set_readonly(false)),
    ),
];

/// The row of command `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli.
fn command(args: &[Bytes]) -> Reply {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(Spec::entry).collect());
    };
    match upper(sub).as_str() {
        "COUNT" => Reply::Integer(COMMANDS.len() as i64),
        "INFO" => Reply::Array(
            args[1..]
                .iter()
                .map(|name| lookup(name).map_or(Reply::Null, Spec::entry))
                .collect(),
        ),
        // Docs are optional for redis-cli: it falls back to no hints.
        "DOCS" => Reply::Map(Vec::new()),
        other => Reply::err(format!("unknown subcommand '{other}'. Try COMMAND HELP.")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::{CommandReader, ParseLimits};
    use super::*;

    #[test]
    fn command_count_matches_the_table() {
        assert_eq!(
            command(&[Bytes::from("count")]),
            Reply::Integer(COMMANDS.len() as i64)
        );
        let Reply::Array(all) = command(&[]) else {
            panic!("not an array")
        };
        assert_eq!(all.len(), COMMANDS.len());
    }

    #[test]
    fn command_info_reports_key_positions() {
        let reply = command(&[Bytes::from("INFO"), Bytes::from("MSET")]);
        let expected = Reply::Array(vec![Reply::Array(vec![
            Reply::bulk("mset"),
            Reply::Integer(-3),
            Reply::Array(vec![Reply::Status("write".into())]),
            Reply::Integer(1),
            Reply::Integer(-1),
            Reply::Integer(2),
            Reply::Array(Vec::new()),
        ])]);
        assert_eq!(reply, expected);
    }

    #[test]
    fn keys_are_found_where_the_row_says() {
        let argv = |words: &[&'static str]| -> Vec<Bytes> {
            words
                .iter()
                .map(|w| Bytes::from_static(w.as_bytes()))
                .collect()
        };
        let keys = |name: &[u8], argv: &[Bytes]| -> Vec<Bytes> {
            let spec = lookup(name).expect("a known command");
            spec.keys_in(argv).into_iter().cloned().collect()
        };
        let set = argv(&["SET", "k", "v", "NX"]);
        assert_eq!(keys(b"set", &set), argv(&["k"]));
        let mset = argv(&["MSET", "a", "1", "b", "2"]);
        assert_eq!(keys(b"mset", &mset), argv(&["a", "b"]));
        let del = argv(&["DEL", "a", "b", "c"]);
        assert_eq!(keys(b"del", &del), argv(&["a", "b", "c"]));
        // The borrowed view finds the same keys.
        let mut reader = CommandReader::default();
        let wire = b"*4\r\n$3\r\nDEL\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n";
        assert_eq!(reader.scan(wire, &ParseLimits::default()), Ok(true));
        let del_spec = lookup(b"del").expect("a known command");
        let in_args = del_spec.keys_in_args(reader.args(wire));
        assert_eq!(in_args, [&b"a"[..], b"b", b"c"]);
        assert!(keys(b"flushdb", &argv(&["FLUSHDB"])).is_empty());
        assert!(keys(b"ping", &argv(&["PING", "x"])).is_empty());
        assert!(lookup(b"incr").is_some_and(Spec::writes));
        assert!(!lookup(b"mget").is_some_and(Spec::writes));
    }

    #[test]
    fn expiry_commands_have_redis_rows() {
        let rows = [
            ("setex", 4, true),
            ("psetex", 4, true),
            ("getex", -2, true),
            ("getdel", 2, true),
            ("expire", -3, true),
            ("pexpire", -3, true),
            ("expireat", -3, true),
            ("pexpireat", -3, true),
            ("persist", 2, true),
            ("ttl", 2, false),
            ("pttl", 2, false),
            ("expiretime", 2, false),
            ("pexpiretime", 2, false),
        ];
        for (name, arity, writes) in rows {
            let spec = lookup(name.as_bytes()).expect("a row");
            assert_eq!((spec.arity, spec.writes()), (arity, writes), "{name}");
            let argv: Vec<Bytes> = [name, "k", "10", "v"].map(Bytes::from).into();
            let keys: Vec<&Bytes> = spec.keys_in(&argv);
            assert_eq!(keys, [&argv[1]], "{name}");
            assert!(spec.flags.contains(&"fast") || name.ends_with("setex"));
        }
    }

    /// `Session::now_row` answers a row's reads at once only where
    /// `Session::prepare` would hand the command to the store: every row
    /// with a `now` runner must be a store read.
    #[test]
    fn rows_answered_at_once_are_store_reads() {
        let now_rows: Vec<&str> = COMMANDS
            .iter()
            .filter(|spec| spec.now.is_some())
            .map(|spec| spec.name)
            .collect();
        assert_eq!(now_rows, ["get", "mget"]);
        for spec in COMMANDS.iter().filter(|spec| spec.now.is_some()) {
            assert!(matches!(spec.run, Run::Store(_)), "{}", spec.name);
            assert!(spec.is_read() && !spec.writes(), "{}", spec.name);
        }
    }

    #[test]
    fn arity_is_exact_or_a_minimum() {
        let get = lookup(b"GET").map(|s| (s.accepts(2), s.accepts(3)));
        assert_eq!(get, Some((true, false)));
        let set = lookup(b"set").map(|s| (s.accepts(2), s.accepts(5)));
        assert_eq!(set, Some((false, true)));
        assert!(lookup(b"nosuch").is_none());
    }
}
