//! What each Redis command does, in terms of native requests.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Transport};
use rdkv_proto::wire::{
    Consistency, ErrorCode, ErrorReply, Request, Response, Role, SetCondition, Update,
    UpdateOutcome, tokens_match,
};

use super::RespServer;
use super::reply::Reply;
use crate::telemetry::{RequestStats, Via};

/// Sends requests this node cannot serve (it does not lead) to the leader
/// through a native client over the cluster's client addresses.
#[derive(Debug)]
pub struct Forwarder {
    token: Option<String>,
    /// The client and the endpoints it was made with.
    client: Mutex<Option<(Vec<String>, Client)>>,
}

impl Forwarder {
    pub fn new(token: Option<String>) -> Forwarder {
        Forwarder {
            token,
            client: Mutex::new(None),
        }
    }

    fn client(&self, endpoints: Vec<String>) -> Result<Client, Reply> {
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, client)) = slot.as_ref()
            && *known == endpoints
        {
            return Ok(client.clone());
        }
        let options = ClientOptions {
            token: self.token.clone(),
            request_timeout: Duration::from_secs(10),
            transport: Transport::Tcp,
            client_name: "rdkv-resp-forwarder".into(),
            ..ClientOptions::default()
        };
        let client = Client::new(&endpoints, options)
            .map_err(|e| Reply::err(format!("cannot reach the leader: {e}")))?;
        *slot = Some((endpoints, client.clone()));
        Ok(client)
    }

    async fn forward(&self, endpoints: Vec<String>, request: Request) -> Result<Response, Reply> {
        let client = self.client(endpoints)?;
        client.send(request).await.map_err(|e| match e {
            rdkv_client::Error::Server(reply) => error_reply(&reply),
            other => Reply::err(other.to_string()),
        })
    }
}

/// A native error as a Redis error.
fn error_reply(error: &ErrorReply) -> Reply {
    match error.code {
        ErrorCode::NotLeader | ErrorCode::Unavailable => {
            Reply::Error(format!("TRYAGAIN {}", error.message))
        }
        _ => Reply::err(&error.message),
    }
}

/// Longest a command waits for an election to produce a leader.
const ELECTION_WAIT: Duration = Duration::from_secs(10);

/// The commands the front end knows: name, arity (negative: at least),
/// flags (for COMMAND).
const COMMANDS: &[(&str, i64, &[&str])] = &[
    ("ping", -1, &["fast", "stale"]),
    ("echo", 2, &["fast"]),
    ("quit", -1, &["fast"]),
    ("select", 2, &["fast"]),
    ("hello", -1, &["fast"]),
    ("auth", -2, &["fast"]),
    ("get", 2, &["readonly", "fast"]),
    ("set", -3, &["write"]),
    ("setnx", 3, &["write", "fast"]),
    ("getset", 3, &["write", "fast"]),
    ("del", -2, &["write"]),
    ("exists", -2, &["readonly", "fast"]),
    ("mget", -2, &["readonly", "fast"]),
    ("mset", -3, &["write"]),
    ("incr", 2, &["write", "fast"]),
    ("incrby", 3, &["write", "fast"]),
    ("decr", 2, &["write", "fast"]),
    ("decrby", 3, &["write", "fast"]),
    ("append", 3, &["write", "fast"]),
    ("strlen", 2, &["readonly", "fast"]),
    ("dbsize", 1, &["readonly", "fast"]),
    ("flushdb", -1, &["write"]),
    ("flushall", -1, &["write"]),
    ("info", -1, &["stale"]),
    ("command", -1, &["stale"]),
    ("config", -2, &["admin"]),
];

/// One connection's state.
#[derive(Debug)]
pub struct Session<'a> {
    server: &'a RespServer,
    authenticated: bool,
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

fn integer_arg(arg: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(arg).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
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

    /// Runs one command; `true` closes the connection after the reply.
    pub async fn execute(&mut self, args: &[Bytes]) -> (Reply, bool) {
        let name = upper(&args[0]);
        if name == "QUIT" {
            return (Reply::ok(), true);
        }
        if !self.authenticated && !matches!(name.as_str(), "AUTH" | "HELLO" | "PING") {
            return (
                Reply::Error("NOAUTH Authentication required.".into()),
                false,
            );
        }
        let Some(&(_, arity, _)) = COMMANDS
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(&name))
        else {
            let shown: String = String::from_utf8_lossy(&args[0])
                .chars()
                .take(128)
                .collect();
            return (
                Reply::err(format!(
                    "unknown command '{shown}', with args beginning with: "
                )),
                false,
            );
        };
        let n = args.len() as i64;
        if (arity > 0 && n != arity) || (arity < 0 && n < -arity) {
            return (Reply::wrong_arity(&name), false);
        }
        (self.run(&name, &args[1..]).await, false)
    }

    async fn run(&mut self, name: &str, args: &[Bytes]) -> Reply {
        match name {
            "PING" => match args {
                [] => Reply::Simple("PONG"),
                [message] => Reply::Bulk(message.clone()),
                _ => Reply::wrong_arity(name),
            },
            "ECHO" => Reply::Bulk(args[0].clone()),
            "SELECT" => match integer_arg(&args[0]) {
                Some(0) => Reply::ok(),
                Some(_) => Reply::err("DB index is out of range"),
                None => Reply::not_integer(),
            },
            "AUTH" => self.auth(args),
            "HELLO" => self.hello(args),
            "GET" => match self.get(&args[0]).await {
                Ok(Some(value)) => Reply::Bulk(value),
                Ok(None) => Reply::Null,
                Err(e) => e,
            },
            "STRLEN" => match self.get(&args[0]).await {
                Ok(value) => Reply::Integer(value.map_or(0, |v| v.len() as i64)),
                Err(e) => e,
            },
            "SET" => self.set(args).await,
            "SETNX" => {
                let update = Update::SetIf {
                    value: args[1].clone(),
                    condition: SetCondition::IfAbsent,
                    return_old: false,
                };
                match self.update(&args[0], update).await {
                    Ok(UpdateOutcome::Set { written, .. }) => Reply::Integer(i64::from(written)),
                    Ok(other) => unexpected(&other),
                    Err(e) => e,
                }
            }
            "GETSET" => {
                let update = Update::SetIf {
                    value: args[1].clone(),
                    condition: SetCondition::Always,
                    return_old: true,
                };
                match self.update(&args[0], update).await {
                    Ok(UpdateOutcome::Set { old, .. }) => old.map_or(Reply::Null, Reply::Bulk),
                    Ok(other) => unexpected(&other),
                    Err(e) => e,
                }
            }
            "INCR" => self.incr(&args[0], 1).await,
            "DECR" => self.incr(&args[0], -1).await,
            "INCRBY" | "DECRBY" => {
                let delta = match integer_arg(&args[1]) {
                    Some(d) if name == "INCRBY" => Some(d),
                    Some(d) => d.checked_neg(),
                    None => None,
                };
                match delta {
                    Some(delta) => self.incr(&args[0], delta).await,
                    None => Reply::not_integer(),
                }
            }
            "APPEND" => {
                let update = Update::Append {
                    suffix: args[1].clone(),
                };
                match self.update(&args[0], update).await {
                    Ok(UpdateOutcome::Length { len, .. }) => Reply::Integer(len as i64),
                    Ok(UpdateOutcome::TooLarge { .. }) => {
                        Reply::err("string exceeds maximum allowed size")
                    }
                    Ok(other) => unexpected(&other),
                    Err(e) => e,
                }
            }
            "DEL" => {
                let mut deleted = 0;
                for key in args {
                    match self.call(Request::Delete { key: key.clone() }).await {
                        Ok(Response::Deleted { existed, .. }) => deleted += i64::from(existed),
                        Ok(other) => return unexpected(&other),
                        Err(e) => return e,
                    }
                }
                Reply::Integer(deleted)
            }
            "EXISTS" => match self.mget(args).await {
                Ok(values) => Reply::Integer(values.iter().filter(|v| v.is_some()).count() as i64),
                Err(e) => e,
            },
            "MGET" => match self.mget(args).await {
                Ok(values) => Reply::Array(
                    values
                        .into_iter()
                        .map(|v| v.map_or(Reply::Null, Reply::Bulk))
                        .collect(),
                ),
                Err(e) => e,
            },
            "MSET" => {
                if !args.len().is_multiple_of(2) {
                    return Reply::wrong_arity(name);
                }
                let pairs = args
                    .chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect();
                match self.call(Request::MPut { pairs }).await {
                    Ok(Response::MWritten { .. }) => Reply::ok(),
                    Ok(other) => unexpected(&other),
                    Err(e) => e,
                }
            }
            "DBSIZE" => Reply::Integer(self.server.handler.replica().live_keys() as i64),
            // Replicated like any write; with a token configured the
            // connection is authenticated by now (AUTH gates every command).
            "FLUSHDB" | "FLUSHALL" => match args {
                [] => self.flush().await,
                [mode]
                    if mode.eq_ignore_ascii_case(b"sync")
                        || mode.eq_ignore_ascii_case(b"async") =>
                {
                    self.flush().await
                }
                _ => Reply::err("syntax error"),
            },
            "INFO" => self.info(args),
            "COMMAND" => command(args),
            "CONFIG" => config(args),
            _ => Reply::err(format!("unknown command '{name}'")),
        }
    }

    fn auth(&mut self, args: &[Bytes]) -> Reply {
        let password = match args {
            [password] => password,
            [user, password] if user.as_ref() == b"default" => password,
            [_, _] => {
                return Reply::Error(
                    "WRONGPASS invalid username-password pair or user is disabled.".into(),
                );
            }
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
                Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
            }
        }
    }

    fn hello(&mut self, args: &[Bytes]) -> Reply {
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
        let status = self.server.handler.status();
        let role = if status.role == Role::Leader {
            "master"
        } else {
            "replica"
        };
        let s = |text: &str| Reply::bulk(Bytes::copy_from_slice(text.as_bytes()));
        Reply::Array(vec![
            s("server"),
            s("rdkv"),
            s("version"),
            s(env!("CARGO_PKG_VERSION")),
            s("proto"),
            Reply::Integer(2),
            s("id"),
            Reply::Integer(status.id as i64),
            s("mode"),
            s("standalone"),
            s("role"),
            s(role),
            s("modules"),
            Reply::Array(Vec::new()),
        ])
    }

    fn info(&self, args: &[Bytes]) -> Reply {
        let wanted: Vec<String> = args.iter().map(|a| upper(a)).collect();
        let show = |section: &str| {
            wanted.is_empty()
                || wanted
                    .iter()
                    .any(|w| w == section || w == "ALL" || w == "DEFAULT" || w == "EVERYTHING")
        };
        let status = self.server.handler.status();
        let mut text = String::new();
        if show("SERVER") {
            text.push_str(&format!(
                "# Server\r\nredis_version:7.0.0\r\nrdkv_version:{}\r\nredis_mode:standalone\r\nos:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nrdkv_node_id:{}\r\n\r\n",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::process::id(),
                self.server.port,
                status.id,
            ));
        }
        if show("REPLICATION") {
            let role = if status.role == Role::Leader {
                "master"
            } else {
                "slave"
            };
            text.push_str(&format!(
                "# Replication\r\nrole:{role}\r\nraft_role:{:?}\r\nraft_term:{}\r\nraft_leader_id:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\nconnected_slaves:{}\r\n\r\n",
                status.role,
                status.term,
                status.leader_id.map_or_else(|| "none".to_owned(), |l| l.to_string()),
                status.commit_index,
                status.applied_index,
                status.members.len().saturating_sub(1),
            ));
        }
        if show("KEYSPACE") {
            text.push_str(&format!(
                "# Keyspace\r\ndb0:keys={},expires=0,avg_ttl=0\r\n",
                self.server.handler.replica().live_keys()
            ));
        }
        Reply::bulk(text)
    }

    /// Serves `request` here, or at the leader when this node does not lead.
    /// While no leader is known (an election), waits and tries again, for
    /// at most [`ELECTION_WAIT`].
    async fn flush(&self) -> Reply {
        match self.call(Request::Clear).await {
            Ok(Response::Cleared { .. }) => Reply::ok(),
            Ok(other) => unexpected(&other),
            Err(e) => e,
        }
    }

    async fn call(&self, request: Request) -> Result<Response, Reply> {
        let handler = &self.server.handler;
        request
            .validate(&handler.limits())
            .map_err(|e| Reply::err(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        let mut backoff = Duration::from_millis(20);
        loop {
            let error = match handler.handle(request.clone(), Via::Resp).await {
                Response::Error(error) if error.code == ErrorCode::NotLeader => error,
                Response::Error(error) => return Err(error_reply(&error)),
                response => return Ok(response),
            };
            match &error.leader_hint {
                Some(hint) if hint.node_id != handler.replica().node_id() => {
                    let mut endpoints: Vec<String> = handler
                        .replica()
                        .members()
                        .into_iter()
                        .map(|m| m.client_addr)
                        .filter(|a| !a.is_empty())
                        .collect();
                    if !endpoints.contains(&hint.client_addr) {
                        endpoints.push(hint.client_addr.clone());
                    }
                    endpoints.sort();
                    return self.server.forwarder.forward(endpoints, request).await;
                }
                _ if tokio::time::Instant::now() + backoff > deadline => {
                    return Err(error_reply(&error));
                }
                _ => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
            }
        }
    }

    fn consistency(&self) -> Consistency {
        self.server.consistency
    }

    async fn get(&self, key: &Bytes) -> Result<Option<Bytes>, Reply> {
        let request = Request::Get {
            key: key.clone(),
            consistency: self.consistency(),
        };
        match self.call(request).await? {
            Response::Value(value) => Ok(value.map(|v| v.value)),
            other => Err(unexpected(&other)),
        }
    }

    async fn mget(&self, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, Reply> {
        let request = Request::MGet {
            keys: keys.to_vec(),
            consistency: self.consistency(),
        };
        match self.call(request).await? {
            Response::Values(values) => {
                Ok(values.into_iter().map(|v| v.map(|v| v.value)).collect())
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn update(&self, key: &Bytes, update: Update) -> Result<UpdateOutcome, Reply> {
        let request = Request::Update {
            key: key.clone(),
            update,
        };
        match self.call(request).await? {
            Response::Updated(outcome) => Ok(outcome),
            other => Err(unexpected(&other)),
        }
    }

    async fn incr(&self, key: &Bytes, delta: i64) -> Reply {
        match self.update(key, Update::Incr { delta }).await {
            Ok(UpdateOutcome::Integer { value, .. }) => Reply::Integer(value),
            Ok(UpdateOutcome::NotAnInteger { .. }) => Reply::not_integer(),
            Ok(other) => unexpected(&other),
            Err(e) => e,
        }
    }

    /// SET key value [NX|XX] [GET] [KEEPTTL]; EX/PX/EXAT/PXAT are refused
    /// (rdkv has no expiry).
    async fn set(&self, args: &[Bytes]) -> Reply {
        let (key, value) = (&args[0], &args[1]);
        let mut condition = SetCondition::Always;
        let mut get = false;
        for option in &args[2..] {
            match upper(option).as_str() {
                "NX" if condition == SetCondition::Always => condition = SetCondition::IfAbsent,
                "XX" if condition == SetCondition::Always => condition = SetCondition::IfPresent,
                "GET" => get = true,
                "KEEPTTL" => {}
                "EX" | "PX" | "EXAT" | "PXAT" => {
                    return Reply::err(
                        "expiry is not supported by rdkv: SET EX/PX/EXAT/PXAT cannot be used",
                    );
                }
                _ => return Reply::syntax(),
            }
        }
        if condition == SetCondition::Always && !get {
            let request = Request::Put {
                key: key.clone(),
                value: value.clone(),
            };
            return match self.call(request).await {
                Ok(Response::Written { .. }) => Reply::ok(),
                Ok(other) => unexpected(&other),
                Err(e) => e,
            };
        }
        let update = Update::SetIf {
            value: value.clone(),
            condition,
            return_old: get,
        };
        match self.update(key, update).await {
            Ok(UpdateOutcome::Set { old, .. }) if get => old.map_or(Reply::Null, Reply::Bulk),
            Ok(UpdateOutcome::Set { written: true, .. }) => Reply::ok(),
            Ok(UpdateOutcome::Set { written: false, .. }) => Reply::Null,
            Ok(other) => unexpected(&other),
            Err(e) => e,
        }
    }
}

fn unexpected(what: &impl std::fmt::Debug) -> Reply {
    Reply::err(format!("unexpected reply from the store: {what:?}"))
}

fn command_entry(name: &str, arity: i64, flags: &[&str]) -> Reply {
    let (first, last) = match name {
        "get" | "set" | "setnx" | "getset" | "incr" | "incrby" | "decr" | "decrby" | "append"
        | "strlen" => (1, 1),
        "del" | "exists" | "mget" => (1, -1),
        "mset" => (1, -1),
        _ => (0, 0),
    };
    let step = if name == "mset" {
        2
    } else {
        i64::from(first > 0)
    };
    Reply::Array(vec![
        Reply::bulk(name.to_owned()),
        Reply::Integer(arity),
        Reply::Array(
            flags
                .iter()
                .map(|f| Reply::Status((*f).to_owned()))
                .collect(),
        ),
        Reply::Integer(first),
        Reply::Integer(last),
        Reply::Integer(step),
    ])
}

/// COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli.
fn command(args: &[Bytes]) -> Reply {
    let Some(sub) = args.first() else {
        return Reply::Array(
            COMMANDS
                .iter()
                .map(|(n, a, f)| command_entry(n, *a, f))
                .collect(),
        );
    };
    match upper(sub).as_str() {
        "COUNT" => Reply::Integer(COMMANDS.len() as i64),
        "INFO" => Reply::Array(
            args[1..]
                .iter()
                .map(|name| {
                    COMMANDS
                        .iter()
                        .find(|(n, _, _)| n.as_bytes().eq_ignore_ascii_case(name))
                        .map_or(Reply::Null, |(n, a, f)| command_entry(n, *a, f))
                })
                .collect(),
        ),
        // Docs are optional for redis-cli: it falls back to no hints.
        "DOCS" => Reply::Array(Vec::new()),
        other => Reply::err(format!("unknown subcommand '{other}'. Try COMMAND HELP.")),
    }
}

/// CONFIG GET: the few settings redis-benchmark and clients ask for.
fn config(args: &[Bytes]) -> Reply {
    match upper(&args[0]).as_str() {
        "GET" if args.len() >= 2 => {
            let settings = [("save", ""), ("appendonly", "no"), ("databases", "1")];
            let mut out = Vec::new();
            for pattern in &args[1..] {
                for (name, value) in settings {
                    if glob_match(pattern, name.as_bytes()) {
                        out.push(Reply::bulk(name.to_owned()));
                        out.push(Reply::bulk(value.to_owned()));
                    }
                }
            }
            Reply::Array(out)
        }
        "GET" => Reply::wrong_arity("config|get"),
        other => Reply::err(format!("CONFIG {other} is not supported by rdkv")),
    }
}

/// Redis-style glob with `*` and `?` only.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob_match(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob_match(rest, &text[1..]),
        Some((c, rest)) => text
            .split_first()
            .is_some_and(|(t, tail)| t.eq_ignore_ascii_case(c) && glob_match(rest, tail)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"save", b"save"));
        assert!(glob_match(b"*", b"appendonly"));
        assert!(glob_match(b"app*", b"appendonly"));
        assert!(glob_match(b"s?ve", b"SAVE"));
        assert!(!glob_match(b"sav", b"save"));
    }

    #[test]
    fn config_get_answers_what_redis_benchmark_asks() {
        let reply = config(&[Bytes::from("GET"), Bytes::from("save")]);
        assert_eq!(
            reply,
            Reply::Array(vec![Reply::bulk("save"), Reply::bulk("")])
        );
        let reply = config(&[Bytes::from("get"), Bytes::from("appendonly")]);
        assert_eq!(
            reply,
            Reply::Array(vec![Reply::bulk("appendonly"), Reply::bulk("no")])
        );
    }

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
}
