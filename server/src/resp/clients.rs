//! The node's open RESP connections, as `CLIENT ID`, `CLIENT INFO` and
//! `CLIENT LIST` show them. One entry per connection, from accept to close;
//! the connection's session owns the facts and copies a change here (a
//! name, the library, the protocol), so the hot path takes no lock.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::reply::Protocol;

/// Longest client name or library field kept (Redis has no limit; a name
/// is one line of CLIENT LIST, so it is bounded here).
pub const MAX_CLIENT_FIELD_BYTES: usize = 256;

/// What CLIENT LIST shows of one connection.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub addr: String,
    pub local_addr: String,
    pub name: String,
    pub lib_name: String,
    pub lib_ver: String,
    pub protocol: Protocol,
    pub opened: Instant,
}

impl ClientInfo {
    pub fn new(addr: String, local_addr: String) -> ClientInfo {
        ClientInfo {
            addr,
            local_addr,
            name: String::new(),
            lib_name: String::new(),
            lib_ver: String::new(),
            protocol: Protocol::Resp2,
            opened: Instant::now(),
        }
    }

    /// One line in Redis's CLIENT LIST format (the fields rdkv knows; the
    /// ones Redis clients parse keep their names and meaning).
    fn line(&self, id: u64) -> String {
        let mut line = String::new();
        let _ = write!(
            line,
            "id={id} addr={} laddr={} fd=-1 name={} age={} idle=0 flags=N db=0 \
             sub=0 psub=0 ssub=0 multi=-1 watch=0 qbuf=0 qbuf-free=0 argv-mem=0 \
             multi-mem=0 tot-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 events=r cmd=client|list \
             user=default redir=-1 resp={} lib-name={} lib-ver={}",
            self.addr,
            self.local_addr,
            self.name,
            self.opened.elapsed().as_secs(),
            self.protocol.version(),
            self.lib_name,
            self.lib_ver,
        );
        line
    }
}

/// Whether `value` can be a client name or library field: printable ASCII
/// without spaces (what Redis accepts), and bounded.
pub fn valid_client_field(value: &[u8]) -> bool {
    value.len() <= MAX_CLIENT_FIELD_BYTES && value.iter().all(|b| (b'!'..=b'~').contains(b))
}

#[derive(Debug)]
pub struct Clients {
    next_id: AtomicU64,
    open: Mutex<BTreeMap<u64, ClientInfo>>,
}

impl Default for Clients {
    fn default() -> Self {
        Clients {
            // Redis numbers its clients from 1 too.
            next_id: AtomicU64::new(1),
            open: Mutex::default(),
        }
    }
}

impl Clients {
    fn open(&self) -> MutexGuard<'_, BTreeMap<u64, ClientInfo>> {
        // The map stays consistent whatever a panicking holder did: every
        // change is one insert, remove or field assignment.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a connection; it is removed when the returned entry drops.
    pub fn register(&self, info: ClientInfo) -> Registered<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open().insert(id, info);
        Registered { clients: self, id }
    }

    /// CLIENT LIST lines of the open connections (all, or those in `ids`),
    /// oldest first, each ending in a newline as in Redis.
    pub fn list(&self, ids: Option<&[u64]>) -> String {
        let open = self.open();
        let mut text = String::new();
        for (id, info) in open.iter() {
            if ids.is_none_or(|ids| ids.contains(id)) {
                text.push_str(&info.line(*id));
                text.push('\n');
            }
        }
        text
    }
}

/// A connection's entry in [`Clients`].
#[derive(Debug)]
pub struct Registered<'a> {
    clients: &'a Clients,
    id: u64,
}

impl Registered<'_> {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn update(&self, change: impl FnOnce(&mut ClientInfo)) {
        if let Some(info) = self.clients.open().get_mut(&self.id) {
            change(info);
        }
    }

    pub fn info(&self) -> Option<ClientInfo> {
        self.clients.open().get(&self.id).cloned()
    }

    /// This connection's CLIENT INFO line.
    pub fn line(&self) -> String {
        self.clients.list(Some(&[self.id]))
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.clients.open().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_listed_while_open_with_their_fields() {
        let clients = Clients::default();
        let first = clients.register(ClientInfo::new("127.0.0.1:5".into(), "l:1".into()));
        let second = clients.register(ClientInfo::new("127.0.0.1:6".into(), "l:1".into()));
        assert_eq!((first.id(), second.id()), (1, 2));
        second.update(|info| {
            info.name = "worker".into();
            info.protocol = Protocol::Resp3;
            info.lib_name = "redis-py".into();
        });
        let list = clients.list(None);
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), 2, "{list}");
        assert!(lines[0].starts_with("id=1 addr=127.0.0.1:5 laddr=l:1 "));
        assert!(lines[0].contains(" name= ") && lines[0].contains(" resp=2 "));
        assert!(lines[1].contains(" name=worker ") && lines[1].contains(" resp=3 "));
        assert!(lines[1].ends_with(" lib-name=redis-py lib-ver="));
        assert_eq!(second.line(), format!("{}\n", lines[1]));
        drop(first);
        assert_eq!(clients.list(None).lines().count(), 1);
        assert_eq!(clients.list(Some(&[1])), "");
    }

    #[test]
    fn names_are_printable_without_spaces_and_bounded() {
        assert!(valid_client_field(b"redis-py"));
        assert!(valid_client_field(b""));
        assert!(!valid_client_field(b"a b"));
        assert!(!valid_client_field(b"a\nb"));
        assert!(!valid_client_field(&[b'x'; MAX_CLIENT_FIELD_BYTES + 1]));
    }
}
