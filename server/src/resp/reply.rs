//! RESP2 replies.

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
    /// `$-1`
    Null,
    Array(Vec<Reply>),
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

    /// Appends the encoded reply to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Status(s) => line(out, b'+', &sanitize(s)),
            Reply::Error(s) => line(out, b'-', &sanitize(s)),
            Reply::Integer(n) => line(out, b':', n.to_string().as_bytes()),
            Reply::Bulk(data) => {
                line(out, b'$', data.len().to_string().as_bytes());
                out.put_slice(data);
                out.put_slice(b"\r\n");
            }
            Reply::Null => out.put_slice(b"$-1\r\n"),
            Reply::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }
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
        let mut out = BytesMut::new();
        reply.encode(&mut out);
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
}
