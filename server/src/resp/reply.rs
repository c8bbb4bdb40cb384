//! Replies, encoded in the protocol the connection chose (HELLO): RESP2, or
//! RESP3 with its own types where Redis 7 uses them (maps, null, verbatim
//! strings); in RESP2 those fall back to what Redis sends there.

use bytes::{BufMut, Bytes, BytesMut};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(&'static str),
    /// A simple string built at run time (no CR or LF in it).
    Status(String),
    /// `-ERR ...`, `-WRONGTYPE ...`: the text after `-`, prefix included.
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    /// RESP2 `*-1` (EXEC of an aborted transaction), RESP3 `_`.
    NullArray,
    Array(Vec<Reply>),
    /// A reply encoded already, in the protocol the connection spoke when
    /// its command ran (a read answered at once behind slower commands).
    Encoded(Bytes),
    /// RESP3 `%`; RESP2: a flat array of keys and values.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `=` with the `txt` format (INFO, CLIENT INFO/LIST); RESP2: a
    /// bulk string.
    Verbatim(String),
}

/// The protocol a connection speaks: RESP2 until `HELLO 3`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Protocol {
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    /// `-ERR <message>`.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    pub fn bulk(data: impl Into<Bytes>) -> Reply {
        Reply::Bulk(data.into())
    }

    pub fn wrong_arity(command: &str) -> Reply {
        Reply::err(format!(
            "wrong number of arguments for '{}' command",
            command.to_ascii_lowercase()
        ))
    }

    pub fn not_integer() -> Reply {
        Reply::err("value is not an integer or out of range")
    }

    pub fn syntax() -> Reply {
        Reply::err("syntax error")
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends a bulk string reply of `value` (the same in both protocols).
    pub fn encode_bulk(value: &[u8], out: &mut BytesMut) {
        blob(out, b'$', &[value]);
    }

    /// Appends the reply, encoded in `protocol`, to `out`.
    pub fn encode(&self, protocol: Protocol, out: &mut BytesMut) {
        match self {
            Reply::Encoded(bytes) => out.put_slice(bytes),
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Status(s) => line(out, b'+', &sanitize(s)),
            Reply::Error(s) => line(out, b'-', &sanitize(s)),
            Reply::Integer(n) => number_line(out, b':', *n),
            Reply::Bulk(data) => blob(out, b'$', &[data]),
            Reply::Null => match protocol {
                Protocol::Resp2 => out.put_slice(b"$-1\r\n"),
                Protocol::Resp3 => out.put_slice(b"_\r\n"),
            },
            Reply::NullArray => match protocol {
                Protocol::Resp2 => out.put_slice(b"*-1\r\n"),
                Protocol::Resp3 => out.put_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                number_line(out, b'*', count(items.len()));
                for item in items {
                    item.encode(protocol, out);
                }
            }
            Reply::Map(items) => {
                let (kind, n) = match protocol {
                    Protocol::Resp2 => (b'*', items.len() * 2),
                    Protocol::Resp3 => (b'%', items.len()),
                };
                number_line(out, kind, count(n));
                for (key, value) in items {
                    key.encode(protocol, out);
                    value.encode(protocol, out);
                }
            }
            Reply::Verbatim(text) => match protocol {
                Protocol::Resp2 => blob(out, b'$', &[text.as_bytes()]),
                Protocol::Resp3 => blob(out, b'=', &[b"txt:", text.as_bytes()]),
            },
        }
    }
}

/// A length-prefixed string made of `parts`.
fn blob(out: &mut BytesMut, kind: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    number_line(out, kind, count(len));
    out.reserve(len + 2);
    for part in parts {
        out.put_slice(part);
    }
    out.put_slice(b"\r\n");
}

/// A length or count as a RESP number (none comes near `i64::MAX`).
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `kind` and `n` in decimal: formatted on the stack, as every bulk reply's
/// length is (a `to_string` would allocate per reply).
fn number_line(out: &mut BytesMut, kind: u8, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        digits[at] = b'-';
    }
    line(out, kind, &digits[at..]);
}

fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(kind);
    out.put_slice(text);
    out.put_slice(b"\r\n");
}

/// Simple strings and errors cannot hold CR or LF.
fn sanitize(text: &str) -> Vec<u8> {
    text.bytes()
        .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(reply: &Reply) -> Vec<u8> {
        encoded_in(Protocol::Resp2, reply)
    }

    fn encoded_in(protocol: Protocol, reply: &Reply) -> Vec<u8> {
        let mut out = BytesMut::new();
        reply.encode(protocol, &mut out);
        out.to_vec()
    }

    #[test]
    fn every_kind_encodes_as_redis_does() {
        assert_eq!(encoded(&Reply::ok()), b"+OK\r\n");
        assert_eq!(encoded(&Reply::Status("a\nb".into())), b"+a b\r\n");
        assert_eq!(encoded(&Reply::err("boom")), b"-ERR boom\r\n");
        assert_eq!(
            encoded(&Reply::Error("WRONGTYPE no".into())),
            b"-WRONGTYPE no\r\n"
        );
        assert_eq!(encoded(&Reply::Integer(-12)), b":-12\r\n");
        for n in [0, 7, 10, 99, 100, i64::MAX, i64::MIN, -1, -10] {
            assert_eq!(encoded(&Reply::Integer(n)), format!(":{n}\r\n").as_bytes());
        }
        assert_eq!(encoded(&Reply::bulk("a\r\nb")), b"$4\r\na\r\nb\r\n");
        assert_eq!(encoded(&Reply::bulk("")), b"$0\r\n\r\n");
        assert_eq!(encoded(&Reply::Null), b"$-1\r\n");
        assert_eq!(
            encoded(&Reply::Array(vec![Reply::Integer(1), Reply::Null])),
            b"*2\r\n:1\r\n$-1\r\n"
        );
        assert_eq!(encoded(&Reply::Array(vec![])), b"*0\r\n");
        assert_eq!(
            encoded(&Reply::wrong_arity("GET")),
            b"-ERR wrong number of arguments for 'get' command\r\n"
        );
    }

    #[test]
    fn resp3_types_fall_back_to_what_redis_sends_in_resp2() {
        let map = Reply::Map(vec![
            (Reply::bulk("proto"), Reply::Integer(3)),
            (Reply::bulk("name"), Reply::Null),
        ]);
        assert_eq!(
            encoded_in(Protocol::Resp3, &map),
            b"%2\r\n$5\r\nproto\r\n:3\r\n$4\r\nname\r\n_\r\n"
        );
        assert_eq!(
            encoded_in(Protocol::Resp2, &map),
            b"*4\r\n$5\r\nproto\r\n:3\r\n$4\r\nname\r\n$-1\r\n"
        );
        let info = Reply::Verbatim("a:1\r\n".into());
        assert_eq!(encoded_in(Protocol::Resp3, &info), b"=9\r\ntxt:a:1\r\n\r\n");
        assert_eq!(encoded_in(Protocol::Resp2, &info), b"$5\r\na:1\r\n\r\n");
        // Nested nulls follow the connection's protocol too.
        assert_eq!(encoded_in(Protocol::Resp2, &Reply::NullArray), b"*-1\r\n");
        assert_eq!(encoded_in(Protocol::Resp3, &Reply::NullArray), b"_\r\n");
        let nested = Reply::Array(vec![Reply::Null]);
        assert_eq!(encoded_in(Protocol::Resp3, &nested), b"*1\r\n_\r\n");
        assert_eq!(Protocol::default(), Protocol::Resp2);
    }
}
