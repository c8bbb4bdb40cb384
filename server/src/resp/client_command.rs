//! CLIENT: the connection's id, name and library, and the node's open
//! connections. Client libraries send `CLIENT SETINFO` on connect and
//! `CLIENT SETNAME` when the user names a connection.

use bytes::Bytes;

use super::clients::valid_client_field;
use super::commands::upper;
use super::reply::Reply;
use super::session::Session;

pub fn client(session: &mut Session<'_>, args: &[Bytes]) -> Reply {
    let sub = upper(&args[0]);
    let rest = &args[1..];
    match (sub.as_str(), rest) {
        ("ID", []) => Reply::Integer(i64::try_from(session.client().id()).unwrap_or(i64::MAX)),
        ("GETNAME", []) => match session.client().info() {
            Some(info) if !info.name.is_empty() => Reply::bulk(info.name),
            _ => Reply::Null,
        },
        ("SETNAME", [name]) => match session.set_name(name) {
            Ok(()) => Reply::ok(),
            Err(reply) => reply,
        },
        ("SETINFO", [field, value]) => set_info(session, field, value),
        ("INFO", []) => Reply::Verbatim(session.client().line()),
        ("LIST", filter) => list(session, filter),
        ("ID" | "GETNAME" | "SETNAME" | "SETINFO" | "INFO", _) => {
            Reply::wrong_arity(&format!("client|{}", sub.to_ascii_lowercase()))
        }
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(&args[0])
                .chars()
                .take(128)
                .collect::<String>()
        )),
    }
}

/// CLIENT SETINFO LIB-NAME|LIB-VER value.
fn set_info(session: &Session<'_>, field: &[u8], value: &[u8]) -> Reply {
    if !valid_client_field(value) {
        return Reply::err(format!(
            "{} cannot contain spaces, newlines or special characters.",
            upper(field)
        ));
    }
    let value = String::from_utf8_lossy(value).into_owned();
    match upper(field).as_str() {
        "LIB-NAME" => session.client().update(|info| info.lib_name = value),
        "LIB-VER" => session.client().update(|info| info.lib_ver = value),
        other => return Reply::err(format!("Unrecognized option '{other}'")),
    }
    Reply::ok()
}

/// CLIENT LIST [TYPE NORMAL] [ID id ...]: every connection is a normal
/// one (rdkv has no replicas or pub/sub clients on this port).
fn list(session: &Session<'_>, filter: &[Bytes]) -> Reply {
    let server = session.server();
    match filter.split_first() {
        None => Reply::Verbatim(server.clients.list(None)),
        Some((option, [kind])) if upper(option) == "TYPE" => match upper(kind).as_str() {
            "NORMAL" => Reply::Verbatim(server.clients.list(None)),
            "MASTER" | "REPLICA" | "PUBSUB" => Reply::Verbatim(String::new()),
            other => Reply::err(format!("Unknown client type '{other}'")),
        },
        Some((option, ids)) if upper(option) == "ID" && !ids.is_empty() => {
            let mut wanted = Vec::with_capacity(ids.len());
            for id in ids {
                match std::str::from_utf8(id).ok().and_then(|t| t.parse().ok()) {
                    Some(id) if id > 0 => wanted.push(id),
                    _ => return Reply::err("Invalid client ID"),
                }
            }
            Reply::Verbatim(server.clients.list(Some(&wanted)))
        }
        Some(_) => Reply::syntax(),
    }
}
