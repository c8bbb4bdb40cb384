//! One connection's state (whether it has authenticated) and how it runs a
//! command: looked up in the table, gated by AUTH, checked for arity, run.

use bytes::Bytes;
use rdkv_proto::wire::tokens_match;

use super::RespServer;
use super::commands::{hello_reply, integer_arg, upper};
use super::reply::Reply;
use super::table::{self, Run, Spec, StoreRun};
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
    Session { run: SessionRun, argv: Vec<Bytes> },
    /// Served by the store, after the earlier commands on its keys.
    Store {
        spec: &'static Spec,
        run: StoreRun,
        argv: Vec<Bytes>,
    },
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
}

impl<'a> Session<'a> {
    pub fn new(server: &'a RespServer) -> Session<'a> {
        Session {
            authenticated: server.handler.replica().token().is_none(),
            server,
        }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    pub fn server(&self) -> &'a RespServer {
        self.server
    }

    /// Decides how command `argv` (the name first) runs: answered now,
    /// against the connection's state once every earlier command has
    /// finished, or by the store.
    pub fn prepare(&self, argv: Vec<Bytes>) -> Step {
        let Some(name) = argv.first() else {
            return Step::now(Reply::err("empty command"));
        };
        let spec = table::lookup(name);
        if !self.authenticated && !spec.is_some_and(|s| s.before_auth) {
            return Step::now(Reply::Error("NOAUTH Authentication required.".into()));
        }
        let Some(spec) = spec else {
            let shown: String = String::from_utf8_lossy(name).chars().take(128).collect();
            return Step::now(Reply::err(format!(
                "unknown command '{shown}', with args beginning with: "
            )));
        };
        if !spec.accepts(argv.len()) {
            return Step::now(Reply::wrong_arity(spec.name));
        }
        match spec.run {
            Run::Quit => Step::Now {
                reply: Reply::ok(),
                close: true,
            },
            Run::Pure(run) => Step::now(run(&argv[1..])),
            Run::Session(run) => Step::Session { run, argv },
            Run::Store(run) => Step::Store { spec, run, argv },
        }
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

    /// HELLO [2 [AUTH user password] [SETNAME name]]: RESP2 only.
    pub fn hello(&mut self, args: &[Bytes]) -> Reply {
        let mut rest = args;
        if let Some((version, tail)) = rest.split_first() {
            match integer_arg(version) {
                Some(2) => {}
                Some(_) => {
                    return Reply::Error("NOPROTO unsupported protocol version".into());
                }
                None => {
                    return Reply::err("Protocol version is not an integer or out of range");
                }
            }
            rest = tail;
        }
        while let Some((option, tail)) = rest.split_first() {
            match (upper(option).as_str(), tail) {
                ("AUTH", [user, password, more @ ..]) => {
                    let reply = self.auth(&[user.clone(), password.clone()]);
                    if reply.is_error() {
                        return reply;
                    }
                    rest = more;
                }
                ("SETNAME", [_, more @ ..]) => rest = more,
                _ => return Reply::syntax(),
            }
        }
        if !self.authenticated {
            return Reply::Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into());
        }
        hello_reply(self.server)
    }
}
