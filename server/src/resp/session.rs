//! One connection's state (whether it has authenticated, its protocol, its
//! name) and how it runs a command: looked up in the table, gated by AUTH,
//! checked for arity, run. AUTH, HELLO and RESET are here; CLIENT is in
//! `client_command`.

use bytes::Bytes;
use rdkv_proto::wire::{Op, tokens_match};

use super::RespServer;
use super::clients::{ClientInfo, Registered, valid_client_field};
use super::cluster;
use super::commands::{hello_reply, integer_arg, upper};
use super::parse::Args;
use super::reply::{Protocol, Reply};
use super::table::{self, NowRun, Run, Spec, StoreRun};
use super::transaction::{self, Multi};
use crate::config::RespClusterMode;
use crate::telemetry::RequestStats;

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// A handler of a command that reads or changes the connection's state.
pub type SessionRun = fn(&mut Session<'_>, &[Bytes]) -> Reply;

/// How a parsed command is run.
#[derive(Debug)]
pub enum Step {
    /// Answered already; `close`: the connection closes after the reply.
    Now { reply: Reply, close: bool },
    /// Reads or changes the connection's (or the node's) state: runs once
    /// every earlier command has finished.
    Session { run: SessionRun },
    /// Served by the store, after the earlier commands on its keys.
    Store { spec: &'static Spec, run: StoreRun },
    /// EXEC, once every earlier command has finished.
    Exec,
    /// WATCH of `argv[1..]`, once every earlier command has finished.
    Watch,
}

impl Step {
    fn now(reply: Reply) -> Step {
        Step::Now {
            reply,
            close: false,
        }
    }
}

#[derive(Debug)]
pub struct Session<'a> {
    server: &'a RespServer,
    authenticated: bool,
    protocol: Protocol,
    client: Registered<'a>,
    /// Commands queued since MULTI.
    multi: Option<Multi>,
    /// WATCHed keys and their versions then, until EXEC, DISCARD or UNWATCH.
    watched: Vec<(Bytes, Option<u64>)>,
    /// The connection opted in to Redis Cluster's rules (`MOVED`,
    /// `CROSSSLOT`): it asked `CLUSTER SLOTS|SHARDS|NODES` or `READONLY`.
    cluster_mode: bool,
    /// `READONLY`: reads are served by the node reached, not redirected.
    readonly: bool,
}

/// What a HELLO asks for, checked before any of it is done.
struct Hello<'b> {
    protocol: Option<Protocol>,
    auth: Option<[&'b Bytes; 2]>,
    name: Option<&'b Bytes>,
}

const INVALID_NAME: &str =
    "ERR Client names cannot contain spaces, newlines or special characters.";

impl<'a> Session<'a> {
    pub fn new(server: &'a RespServer, info: ClientInfo) -> Session<'a> {
        Session {
            authenticated: server.handler.replica().token().is_none(),
            protocol: Protocol::Resp2,
            client: server.clients.register(info),
            multi: None,
            watched: Vec::new(),
            cluster_mode: server.cluster_mode == RespClusterMode::Always,
            readonly: false,
            server,
        }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The protocol replies are encoded in from now on.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    pub fn client(&self) -> &Registered<'a> {
        &self.client
    }

    /// Sets the connection's name (CLIENT SETNAME, HELLO SETNAME); an
    /// empty name clears it.
    pub fn set_name(&mut self, name: &[u8]) -> Result<(), Reply> {
        if !valid_client_field(name) {
            return Err(Reply::Error(INVALID_NAME.into()));
        }
        let name = String::from_utf8_lossy(name).into_owned();
        self.client.update(|info| info.name = name);
        Ok(())
    }

    fn set_protocol(&mut self, protocol: Protocol) {
        self.protocol = protocol;
        self.client.update(|info| info.protocol = protocol);
    }

    pub fn server(&self) -> &'a RespServer {
        self.server
    }

    /// Decides how command `argv` (the name first) runs: answered now,
    /// against the connection's state once every earlier command has
    /// finished, or by the store. Inside MULTI most commands are queued.
    pub fn prepare(&mut self, argv: &[Bytes]) -> Step {
        let spec = match self.checked(argv.first().map(|name| &name[..]), argv.len()) {
            Ok(spec) => spec,
            Err(reply) => {
                if let Some(multi) = &mut self.multi {
                    multi.fail();
                }
                return Step::now(reply);
            }
        };
        if self.multi.is_some() && !transaction::RUN_INSIDE_MULTI.contains(&spec.name) {
            return Step::now(transaction::queue(self, spec, argv));
        }
        if spec.name == "cluster"
            && self.server.cluster_mode == RespClusterMode::Auto
            && cluster::opts_in(&argv[1..])
        {
            self.cluster_mode = true;
        }
        if self.cluster_mode
            && let Some(reply) = self.redirected(spec, &spec.keys_in(argv))
        {
            return Step::now(reply);
        }
        match spec.run {
            Run::Quit => Step::Now {
                reply: Reply::ok(),
                close: true,
            },
            Run::Pure(run) => Step::now(run(&argv[1..])),
            Run::Session(run) => Step::Session { run },
            Run::Store(run) => Step::Store { spec, run },
            Run::Exec => Step::Exec,
            Run::Watch => Step::Watch,
        }
    }

    /// A read that may be answered at once (its row has a `now` runner),
    /// when [`Self::prepare`] would hand it to the store as it is: judged by
    /// the same checks from a borrowed view of its arguments, before the
    /// command is taken off the input. `None`: [`Self::prepare`] decides
    /// (the command is not such a read, or is refused, queued in MULTI or
    /// redirected).
    pub fn now_row(&self, args: Args<'_>) -> Option<(&'static Spec, Op, NowRun)> {
        let spec = self.checked(args.get(0), args.len()).ok()?;
        let (op, now) = spec.now?;
        let as_it_is = self.multi.is_none() && matches!(spec.run, Run::Store(_));
        if !as_it_is
            || self.cluster_mode && self.redirected(spec, &spec.keys_in_args(args)).is_some()
        {
            return None;
        }
        Some((spec, op, now))
    }

    /// On a connection in cluster mode, the reply that replaces store
    /// command `spec` on `keys` (MOVED, CROSSSLOT), if any.
    fn redirected(&self, spec: &Spec, keys: &[impl AsRef<[u8]>]) -> Option<Reply> {
        if !matches!(spec.run, Run::Store(_)) {
            return None;
        }
        cluster::redirect(self.server, spec, keys, self.readonly)
    }

    /// The row of command `name` with `argc` arguments (the name
    /// included), once it is known, allowed and of a valid arity.
    fn checked(&self, name: Option<&[u8]>, argc: usize) -> Result<&'static Spec, Reply> {
        let Some(name) = name else {
            return Err(Reply::err("empty command"));
        };
        let spec = table::lookup(name);
        if !self.authenticated && !spec.is_some_and(|s| s.before_auth) {
            return Err(Reply::Error("NOAUTH Authentication required.".into()));
        }
        let Some(spec) = spec else {
            let shown: String = String::from_utf8_lossy(name).chars().take(128).collect();
            return Err(Reply::err(format!(
                "unknown command '{shown}', with args beginning with: "
            )));
        };
        if !spec.accepts(argc) {
            return Err(Reply::wrong_arity(spec.name));
        }
        Ok(spec)
    }

    pub fn multi_mut(&mut self) -> Option<&mut Multi> {
        self.multi.as_mut()
    }

    pub fn take_multi(&mut self) -> Option<Multi> {
        self.multi.take()
    }

    pub fn take_watched(&mut self) -> Vec<(Bytes, Option<u64>)> {
        std::mem::take(&mut self.watched)
    }

    pub fn watched_len(&self) -> usize {
        self.watched.len()
    }

    pub fn watch(&mut self, versions: impl IntoIterator<Item = (Bytes, Option<u64>)>) {
        self.watched.extend(versions);
    }

    /// MULTI: queue the next commands until EXEC or DISCARD.
    pub fn multi(&mut self) -> Reply {
        if self.multi.is_some() {
            return Reply::err("MULTI calls can not be nested");
        }
        self.multi = Some(Multi::default());
        Reply::ok()
    }

    /// DISCARD: drops the queued commands and the watched keys.
    pub fn discard(&mut self) -> Reply {
        if self.multi.take().is_none() {
            return Reply::err("DISCARD without MULTI");
        }
        self.watched.clear();
        Reply::ok()
    }

    pub fn unwatch(&mut self) -> Reply {
        self.watched.clear();
        Reply::ok()
    }

    /// Runs a command that reads or changes the connection's state.
    pub fn run_session(&mut self, run: SessionRun, argv: &[Bytes]) -> Reply {
        run(self, &argv[1..])
    }

    /// AUTH [user] password (only the `default` user exists).
    pub fn auth(&mut self, args: &[Bytes]) -> Reply {
        let password = match args {
            [password] => password,
            [user, password] if user.as_ref() == b"default" => password,
            [_, _] => return Reply::Error(WRONGPASS.into()),
            _ => return Reply::syntax(),
        };
        match self.server.handler.replica().token() {
            None => Reply::err(
                "AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            ),
            Some(token) if tokens_match(token.as_bytes(), password) => {
                self.authenticated = true;
                Reply::ok()
            }
            Some(_) => {
                RequestStats::auth_failure("resp");
                Reply::Error(WRONGPASS.into())
            }
        }
    }

    /// HELLO [protover [AUTH user password] [SETNAME name]]: every option
    /// is checked before any is applied; the protocol changes only when
    /// the whole command succeeds, and its reply is in the new protocol.
    pub fn hello(&mut self, args: &[Bytes]) -> Reply {
        let hello = match parse_hello(args) {
            Ok(hello) => hello,
            Err(reply) => return reply,
        };
        if let Some([user, password]) = hello.auth {
            let reply = self.auth(&[user.clone(), password.clone()]);
            if reply.is_error() {
                return reply;
            }
        }
        if !self.authenticated {
            return Reply::Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into());
        }
        if let Some(name) = hello.name
            && let Err(reply) = self.set_name(name)
        {
            return reply;
        }
        if let Some(protocol) = hello.protocol {
            self.set_protocol(protocol);
        }
        hello_reply(self.server, self.client.id(), self.protocol)
    }

    /// RESET: the connection as it was when it opened (protocol 2, no
    /// name, not authenticated when a token is set), Redis 6.2's command.
    /// READONLY (`true`) and READWRITE: READONLY also opts in to cluster
    /// mode, as cluster clients send it to replicas they read from.
    pub fn set_readonly(&mut self, readonly: bool) -> Reply {
        self.readonly = readonly;
        self.cluster_mode |= readonly && self.server.cluster_mode == RespClusterMode::Auto;
        Reply::ok()
    }

    pub fn reset(&mut self, _: &[Bytes]) -> Reply {
        self.authenticated = self.server.handler.replica().token().is_none();
        self.set_protocol(Protocol::Resp2);
        self.client.update(|info| info.name.clear());
        self.multi = None;
        self.watched.clear();
        self.cluster_mode = self.server.cluster_mode == RespClusterMode::Always;
        self.readonly = false;
        Reply::Simple("RESET")
    }
}

fn parse_hello(args: &[Bytes]) -> Result<Hello<'_>, Reply> {
    let mut hello = Hello {
        protocol: None,
        auth: None,
        name: None,
    };
    let Some((version, mut rest)) = args.split_first() else {
        return Ok(hello);
    };
    hello.protocol = Some(match integer_arg(version) {
        Some(2) => Protocol::Resp2,
        Some(3) => Protocol::Resp3,
        Some(_) => return Err(Reply::Error("NOPROTO unsupported protocol version".into())),
        None => {
            return Err(Reply::err(
                "Protocol version is not an integer or out of range",
            ));
        }
    });
    while let Some((option, tail)) = rest.split_first() {
        match (upper(option).as_str(), tail) {
            ("AUTH", [user, password, more @ ..]) => {
                hello.auth = Some([user, password]);
                rest = more;
            }
            ("SETNAME", [name, more @ ..]) => {
                if !valid_client_field(name) {
                    return Err(Reply::Error(INVALID_NAME.into()));
                }
                hello.name = Some(name);
                rest = more;
            }
            (other, _) => {
                return Err(Reply::err(format!(
                    "Syntax error in HELLO option '{}'",
                    other.to_ascii_lowercase()
                )));
            }
        }
    }
    Ok(hello)
}
