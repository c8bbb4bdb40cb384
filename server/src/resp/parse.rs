//! RESP2 request parsing: arrays of bulk strings and inline commands.
//!
//! Incremental: [`parse_command`] looks at the bytes received so far and
//! either returns one complete command (and how many bytes it used), says it
//! needs more, or reports a protocol error (the connection is then closed).
//! Every length is checked against [`ParseLimits`] before anything is
//! allocated or waited for, so a peer cannot make the server buffer more than
//! one bounded command.
//!
//! A connection parses in place ([`CommandReader`]): it first finds a
//! command and shows its arguments without taking it off ([`Args`]: an
//! array command's as offsets into the bytes read, an inline command's as
//! the copies unquoting made). A command answered at once (a GET under a
//! lease) is answered from that view and skipped in the buffer: no copy,
//! no allocation, and no shared count written. Any other command is taken
//! off the buffer (an array command's arguments as `Bytes` slices of it),
//! and one that outlives the batch it was read in copies its arguments out
//! ([`detached`]), so no command in flight holds the connection's read
//! buffer.

use bytes::{Buf, Bytes, BytesMut};

/// Bounds on one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Largest bulk string (the value limit plus slack for keys and options).
    pub max_bulk_bytes: usize,
    /// Most elements in one command array.
    pub max_array_len: usize,
    /// Longest inline command line (and longest `*`/`$` header line).
    pub max_inline_bytes: usize,
    /// Largest whole command, headers included.
    pub max_command_bytes: usize,
}

impl ParseLimits {
    /// Limits derived from the node's value and batch limits.
    pub fn for_values(max_value_bytes: u32, max_batch_keys: u32) -> ParseLimits {
        let max_bulk_bytes = max_value_bytes as usize + 4096;
        let max_array_len = max_batch_keys as usize * 2 + 16;
        ParseLimits {
            max_bulk_bytes,
            max_array_len,
            max_inline_bytes: 64 * 1024,
            // An MSET of a full batch of maximal values is refused anyway by
            // the batch limits; a command may carry a few large values.
            max_command_bytes: max_bulk_bytes * 4 + max_array_len * 64,
        }
    }
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits::for_values(
            rdkv_proto::wire::DEFAULT_MAX_VALUE_BYTES,
            rdkv_proto::wire::DEFAULT_MAX_BATCH_KEYS,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid multibulk length")]
    BadArrayLength,
    #[error("invalid bulk length")]
    BadBulkLength,
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("too big inline request")]
    InlineTooLong,
    #[error("too big mbulk count string")]
    HeaderTooLong,
    #[error("command of {0} bytes or more exceeds the {1}-byte limit")]
    CommandTooLarge(usize, usize),
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("expected CRLF after a bulk string")]
    MissingCrlf,
}

/// Outcome of looking at the buffered bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not enough bytes yet.
    Incomplete,
    /// A command (possibly empty: an empty inline line), using `len` bytes.
    Command { args: Vec<Bytes>, len: usize },
}

/// Position of the `\n` ending the line starting at `start`, looking at no
/// more than `max` bytes; `Err(())` if the line is longer.
fn find_line(buf: &[u8], start: usize, max: usize) -> Result<Option<usize>, ()> {
    let end = buf.len().min(start.saturating_add(max + 2));
    match buf[start..end].iter().position(|&b| b == b'\n') {
        Some(i) => Ok(Some(start + i)),
        None if end - start >= max + 2 => Err(()),
        None => Ok(None),
    }
}

/// Parses a decimal integer header (after its type byte), `\r\n` ended:
/// what `str::parse::<i64>` accepts (an optional sign, digits), without
/// its UTF-8 check (two per command).
fn header_number(line: &[u8]) -> Option<i64> {
    let line = line.strip_suffix(b"\r")?;
    if line.is_empty() || line.len() > 20 {
        return None;
    }
    let (negative, digits) = match line {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, line),
    };
    if digits.is_empty() {
        return None;
    }
    let mut magnitude: u64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        magnitude = magnitude
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Where one command's arguments lie in the bytes it was parsed from.
type Spans = Vec<(usize, usize)>;

/// What [`scan`] found at the start of the buffer.
enum Scanned {
    Incomplete,
    /// An array command of `len` bytes, its arguments at the spans.
    Array {
        len: usize,
    },
    /// An inline command: its arguments had to be unquoted, so they are
    /// copies.
    Inline {
        args: Vec<Bytes>,
        len: usize,
    },
}

/// Looks for one complete command at the start of `buf` without consuming it.
pub fn parse_command(buf: &[u8], limits: &ParseLimits) -> Result<Parsed, ProtocolError> {
    let mut spans = Spans::new();
    Ok(match scan(buf, limits, &mut spans)? {
        Scanned::Incomplete => Parsed::Incomplete,
        Scanned::Array { len } => {
            let whole = Bytes::copy_from_slice(&buf[..len]);
            let args = spans.into_iter().map(|(s, e)| whole.slice(s..e)).collect();
            Parsed::Command { args, len }
        }
        Scanned::Inline { args, len } => Parsed::Command { args, len },
    })
}

/// [`parse_command`] with an array command's arguments as `spans` into `buf`.
fn scan(buf: &[u8], limits: &ParseLimits, spans: &mut Spans) -> Result<Scanned, ProtocolError> {
    spans.clear();
    match buf.first() {
        None => Ok(Scanned::Incomplete),
        Some(b'*') => parse_array(buf, limits, spans),
        Some(_) => parse_inline(buf, limits),
    }
}

fn parse_array(
    buf: &[u8],
    limits: &ParseLimits,
    spans: &mut Spans,
) -> Result<Scanned, ProtocolError> {
    let Some(nl) = find_line(buf, 0, 32).map_err(|()| ProtocolError::HeaderTooLong)? else {
        return Ok(Scanned::Incomplete);
    };
    let count = header_number(&buf[1..nl]).ok_or(ProtocolError::BadArrayLength)?;
    if count > limits.max_array_len as i64 {
        return Err(ProtocolError::BadArrayLength);
    }
    if count <= 0 {
        // `*0` and `*-1`: an empty command, ignored as Redis does.
        return Ok(Scanned::Array { len: nl + 1 });
    }
    let count = count as usize;
    let mut pos = nl + 1;
    for _ in 0..count {
        if pos >= buf.len() {
            return Ok(Scanned::Incomplete);
        }
        if buf[pos] != b'$' {
            return Err(ProtocolError::ExpectedBulk(buf[pos] as char));
        }
        let Some(nl) = find_line(buf, pos, 32).map_err(|()| ProtocolError::BadBulkLength)? else {
            return Ok(Scanned::Incomplete);
        };
        let len = header_number(&buf[pos + 1..nl]).ok_or(ProtocolError::BadBulkLength)?;
        if len < 0 || len > limits.max_bulk_bytes as i64 {
            return Err(ProtocolError::BadBulkLength);
        }
        let len = len as usize;
        let start = nl + 1;
        let end = start + len;
        if end + 2 > limits.max_command_bytes {
            return Err(ProtocolError::CommandTooLarge(
                end + 2,
                limits.max_command_bytes,
            ));
        }
        if buf.len() < end + 2 {
            return Ok(Scanned::Incomplete);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        spans.push((start, end));
        pos = end + 2;
    }
    Ok(Scanned::Array { len: pos })
}

fn parse_inline(buf: &[u8], limits: &ParseLimits) -> Result<Scanned, ProtocolError> {
    let Some(nl) =
        find_line(buf, 0, limits.max_inline_bytes).map_err(|()| ProtocolError::InlineTooLong)?
    else {
        return Ok(Scanned::Incomplete);
    };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let args = split_inline(line)?;
    if args.len() > limits.max_array_len {
        return Err(ProtocolError::BadArrayLength);
    }
    Ok(Scanned::Inline { args, len: nl + 1 })
}

/// Splits an inline line into arguments: whitespace separated, with
/// double-quoted (`\n`, `\"`, `\xHH` escapes) and single-quoted strings.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let Some(&first) = line.get(i) else {
            return Ok(args);
        };
        let (arg, end) = match first {
            b'"' => quoted(line, i + 1, b'"', double_quoted_escape)?,
            b'\'' => quoted(line, i + 1, b'\'', single_quoted_escape)?,
            _ => {
                let end = line[i..]
                    .iter()
                    .position(u8::is_ascii_whitespace)
                    .map_or(line.len(), |n| i + n);
                (line[i..end].to_vec(), end)
            }
        };
        args.push(Bytes::from(arg));
        i = end;
    }
}

/// Reads what follows a backslash at `line[i]` inside quotes into `arg`;
/// returns where the argument goes on.
type Escape = fn(line: &[u8], i: usize, arg: &mut Vec<u8>) -> Result<usize, ProtocolError>;

/// The quoted argument that starts at `line[start]` (just after its opening
/// `quote`) and where it ends. The closing quote must be followed by
/// whitespace or the end of the line.
fn quoted(
    line: &[u8],
    start: usize,
    quote: u8,
    escape: Escape,
) -> Result<(Vec<u8>, usize), ProtocolError> {
    let mut arg = Vec::new();
    let mut i = start;
    loop {
        let &c = line.get(i).ok_or(ProtocolError::UnbalancedQuotes)?;
        i += 1;
        match c {
            _ if c == quote => break,
            b'\\' => i = escape(line, i, &mut arg)?,
            other => arg.push(other),
        }
    }
    if line.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
        return Err(ProtocolError::UnbalancedQuotes);
    }
    Ok((arg, i))
}

/// In double quotes: `\n`, `\r`, `\t`, `\xHH`; any other escaped byte
/// stands for itself (an `x` without two hex digits too).
fn double_quoted_escape(line: &[u8], i: usize, arg: &mut Vec<u8>) -> Result<usize, ProtocolError> {
    let &e = line.get(i).ok_or(ProtocolError::UnbalancedQuotes)?;
    let hex = || {
        let digits = std::str::from_utf8(line.get(i + 1..i + 3)?).ok()?;
        u8::from_str_radix(digits, 16).ok()
    };
    match e {
        b'n' => arg.push(b'\n'),
        b'r' => arg.push(b'\r'),
        b't' => arg.push(b'\t'),
        b'x' if let Some(v) = hex() => {
            arg.push(v);
            return Ok(i + 3);
        }
        other => arg.push(other),
    }
    Ok(i + 1)
}

/// In single quotes only `\'` is an escape; any other backslash is itself.
fn single_quoted_escape(line: &[u8], i: usize, arg: &mut Vec<u8>) -> Result<usize, ProtocolError> {
    if line.get(i) == Some(&b'\'') {
        arg.push(b'\'');
        Ok(i + 1)
    } else {
        arg.push(b'\\');
        Ok(i)
    }
}

/// A command's arguments (the name first), borrowed: an array command's
/// as a view of the buffer it was scanned from, so reading them writes
/// nothing (a `Bytes` slice of the buffer writes its shared count when
/// made and when dropped); an inline command's as the copies unquoting
/// made.
#[derive(Debug, Clone, Copy)]
pub struct Args<'a>(ArgsIn<'a>);

#[derive(Debug, Clone, Copy)]
enum ArgsIn<'a> {
    /// `buf` is the command's bytes (the view is made only when they are
    /// all there), and `scan` put every span within them.
    Spans {
        buf: &'a [u8],
        spans: &'a [(usize, usize)],
    },
    Owned(&'a [Bytes]),
}

impl<'a> Args<'a> {
    const NONE: Args<'static> = Args(ArgsIn::Owned(&[]));

    /// How many arguments, the name included.
    pub fn len(&self) -> usize {
        match self.0 {
            ArgsIn::Spans { spans, .. } => spans.len(),
            ArgsIn::Owned(args) => args.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `i` (0: the command's name).
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        match self.0 {
            ArgsIn::Spans { buf, spans } => {
                let &(start, end) = spans.get(i)?;
                buf.get(start..end)
            }
            ArgsIn::Owned(args) => args.get(i).map(|arg| &arg[..]),
        }
    }

    /// The arguments from `first` on.
    pub fn iter_from(&self, first: usize) -> impl ExactSizeIterator<Item = &'a [u8]> + Clone {
        let args = *self;
        // Every index below `len` is there, so nothing is skipped.
        (first.min(args.len())..args.len()).map(move |i| args.get(i).unwrap_or_default())
    }
}

/// A command [`CommandReader::scan`] found at the front of the buffer and
/// left there.
#[derive(Debug, Default)]
enum Pending {
    #[default]
    None,
    /// An array command of `len` bytes, its arguments at the reader's spans.
    Array { len: usize },
    /// An inline command: its arguments had to be unquoted, so they are
    /// copies.
    Inline { args: Vec<Bytes>, len: usize },
}

/// A connection's parser: takes commands off the front of its input
/// buffer without copying them. Holds the argument offsets it reuses and
/// the command it last found: [`Self::scan`] finds one, then
/// [`Self::args`] shows it and [`Self::skip`] or [`Self::take`] takes it
/// off, all on the same buffer, unchanged in between.
#[derive(Debug, Default)]
pub struct CommandReader {
    spans: Spans,
    pending: Pending,
}

impl CommandReader {
    /// Looks for one complete command at the front of `buf`, consuming
    /// nothing: `true` if there is one.
    pub fn scan(&mut self, buf: &[u8], limits: &ParseLimits) -> Result<bool, ProtocolError> {
        self.pending = match scan(buf, limits, &mut self.spans)? {
            Scanned::Incomplete => Pending::None,
            Scanned::Array { len } => Pending::Array { len },
            Scanned::Inline { args, len } => Pending::Inline { args, len },
        };
        Ok(!matches!(self.pending, Pending::None))
    }

    /// The arguments of the command [`Self::scan`] found in `buf`; none if
    /// `buf` is not the buffer it scanned.
    pub fn args<'a>(&'a self, buf: &'a [u8]) -> Args<'a> {
        match &self.pending {
            Pending::Array { len } if *len <= buf.len() => Args(ArgsIn::Spans {
                buf: &buf[..*len],
                spans: &self.spans,
            }),
            Pending::Inline { args, .. } => Args(ArgsIn::Owned(args)),
            _ => Args::NONE,
        }
    }

    /// Drops the command [`Self::scan`] found from the front of `buf` (it
    /// was answered from its [`Self::args`]).
    pub fn skip(&mut self, buf: &mut BytesMut) {
        let len = self.pending_len(buf);
        buf.advance(len);
        self.pending = Pending::None;
    }

    /// Takes the command [`Self::scan`] found off the front of `buf` into
    /// `argv` (cleared first). An array command's arguments are slices of
    /// `buf`'s bytes: while they live, `buf` cannot reuse its memory, so
    /// the caller drops them (or [`detached`] copies) before it reads more.
    pub fn take(&mut self, buf: &mut BytesMut, argv: &mut Vec<Bytes>) {
        argv.clear();
        let len = self.pending_len(buf);
        let pending = std::mem::take(&mut self.pending);
        // A command is never empty on the wire; 0: nothing to take.
        if len == 0 {
            return;
        }
        match pending {
            Pending::None => {}
            Pending::Array { .. } => {
                let whole = buf.split_to(len).freeze();
                argv.extend(self.spans.iter().map(|&(s, e)| whole.slice(s..e)));
            }
            Pending::Inline { args, .. } => {
                let _ = buf.split_to(len);
                argv.extend(args);
            }
        }
    }

    /// The pending command's length; 0 if none, or if `buf` is shorter
    /// than the command (not the buffer scanned: a caller's bug, and
    /// nothing is taken rather than the wrong bytes).
    fn pending_len(&self, buf: &[u8]) -> usize {
        let len = match &self.pending {
            Pending::None => 0,
            Pending::Array { len } | Pending::Inline { len, .. } => *len,
        };
        debug_assert!(
            len <= buf.len(),
            "a command of {len} bytes in {}",
            buf.len()
        );
        if len <= buf.len() { len } else { 0 }
    }

    /// [`Self::scan`] then [`Self::take`] (which, with nothing found, only
    /// clears `argv`): `false` if no command is complete yet.
    pub fn next_into(
        &mut self,
        buf: &mut BytesMut,
        limits: &ParseLimits,
        argv: &mut Vec<Bytes>,
    ) -> Result<bool, ProtocolError> {
        let found = self.scan(buf, limits)?;
        self.take(buf, argv);
        Ok(found)
    }
}

/// `argv` copied out of the buffer it was parsed from (one allocation for
/// the bytes), for a command that runs past the batch it was read in.
pub fn detached(argv: &[Bytes]) -> Vec<Bytes> {
    let total = argv.iter().map(Bytes::len).sum();
    let mut whole = BytesMut::with_capacity(total);
    for arg in argv {
        whole.extend_from_slice(arg);
    }
    let mut whole = whole.freeze();
    argv.iter().map(|arg| whole.split_to(arg.len())).collect()
}

/// Takes one complete command off the front of `buf`, if there is one.
pub fn next_command(
    buf: &mut BytesMut,
    limits: &ParseLimits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let mut argv = Vec::new();
    let taken = CommandReader::default().next_into(buf, limits, &mut argv)?;
    Ok(taken.then_some(argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ParseLimits {
        ParseLimits {
            max_bulk_bytes: 100,
            max_array_len: 8,
            max_inline_bytes: 64,
            max_command_bytes: 400,
        }
    }

    fn parse(input: &[u8]) -> Result<Parsed, ProtocolError> {
        parse_command(input, &limits())
    }

    fn command(args: &[&str], len: usize) -> Parsed {
        Parsed::Command {
            args: args
                .iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect(),
            len,
        }
    }

    #[test]
    fn arrays_of_bulk_strings() {
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        assert_eq!(
            parse(input).unwrap(),
            command(&["SET", "k", "hello"], input.len())
        );
        // Every strict prefix is incomplete.
        for cut in 0..input.len() {
            assert_eq!(
                parse(&input[..cut]).unwrap(),
                Parsed::Incomplete,
                "cut {cut}"
            );
        }
        // Binary values and an empty bulk string.
        let input = b"*2\r\n$3\r\na\r\n\r\n$0\r\n\r\n";
        assert_eq!(
            parse(input).unwrap(),
            Parsed::Command {
                args: vec![Bytes::from_static(b"a\r\n"), Bytes::new()],
                len: input.len()
            }
        );
        assert_eq!(parse(b"*0\r\n").unwrap(), command(&[], 4));
    }

    #[test]
    fn pipelined_commands_come_one_at_a_time() {
        let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\nPING\r\n*1\r\n$4\r\nPI"[..]);
        let l = limits();
        assert_eq!(
            next_command(&mut buf, &l).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        assert_eq!(
            next_command(&mut buf, &l).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        assert_eq!(next_command(&mut buf, &l).unwrap(), None);
        buf.extend_from_slice(b"NG\r\n");
        assert_eq!(
            next_command(&mut buf, &l).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn a_reader_slices_the_buffer_and_detached_copies() {
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n*1\r\n$1\r\nx"[..]);
        let (start, len) = (buf.as_ptr() as usize, buf.len());
        let within = |arg: &Bytes| (start..start + len).contains(&(arg.as_ptr() as usize));
        let mut reader = CommandReader::default();
        let mut argv = vec![Bytes::from_static(b"left over")];
        let l = limits();
        assert!(reader.next_into(&mut buf, &l, &mut argv).unwrap());
        assert_eq!(argv, [Bytes::from("GET"), Bytes::from("k")]);
        assert!(argv.iter().all(within), "array arguments are not copied");
        let copies = detached(&argv);
        assert_eq!(copies, argv);
        assert!(!copies.iter().any(within), "detached arguments are copies");
        assert!(reader.next_into(&mut buf, &l, &mut argv).unwrap());
        assert_eq!(argv, [Bytes::from("PING")]);
        assert!(!reader.next_into(&mut buf, &l, &mut argv).unwrap());
        assert!(argv.is_empty());
        assert_eq!(&buf[..], b"*1\r\n$1\r\nx");
        assert!(detached(&[]).is_empty());
    }

    /// A command answered from its view is skipped, exactly its bytes; the
    /// view shows an array command's slices and an inline command's copies.
    #[test]
    fn a_reader_shows_a_command_then_skips_or_takes_it() {
        let wire = &b"*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$0\r\n\r\nGET  \"b c\"\r\n*1\r\n$1\r\nx"[..];
        let mut buf = BytesMut::from(wire);
        let mut reader = CommandReader::default();
        let l = limits();
        assert_eq!(reader.scan(&buf, &l), Ok(true));
        let args = reader.args(&buf);
        let shown: Vec<&[u8]> = (0..args.len()).filter_map(|i| args.get(i)).collect();
        assert_eq!(shown, [&b"MGET"[..], b"a", b""]);
        assert_eq!(args.iter_from(1).collect::<Vec<_>>(), [&b"a"[..], b""]);
        assert_eq!(args.iter_from(9).len(), 0);
        assert_eq!(args.get(3), None);
        // Not the buffer scanned (shorter than the command): no arguments.
        assert!(reader.args(&buf[..10]).is_empty());
        reader.skip(&mut buf);
        assert_eq!(&buf[..], &wire[27..]);
        assert_eq!(reader.scan(&buf, &l), Ok(true));
        let args = reader.args(&buf);
        assert_eq!((args.len(), args.get(1)), (2, Some(&b"b c"[..])));
        let mut argv = Vec::new();
        reader.take(&mut buf, &mut argv);
        assert_eq!(argv, [Bytes::from("GET"), Bytes::from("b c")]);
        assert_eq!(&buf[..], b"*1\r\n$1\r\nx");
        // Nothing complete: nothing shown, skipped or taken.
        assert_eq!(reader.scan(&buf, &l), Ok(false));
        assert!(reader.args(&buf).is_empty());
        reader.skip(&mut buf);
        reader.take(&mut buf, &mut argv);
        assert!(argv.is_empty());
        assert_eq!(&buf[..], b"*1\r\n$1\r\nx");
    }

    #[test]
    fn inline_commands() {
        assert_eq!(parse(b"PING\r\n").unwrap(), command(&["PING"], 6));
        assert_eq!(
            parse(b"set  a b\n").unwrap(),
            command(&["set", "a", "b"], 9)
        );
        assert_eq!(parse(b"\r\n").unwrap(), command(&[], 2));
        assert_eq!(
            parse(b"SET k \"a b\\x41\\n\" 'c d'\r\n").unwrap(),
            command(&["SET", "k", "a bA\n", "c d"], 25)
        );
        assert_eq!(parse(b"PING").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(b"SET \"a\r\n"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(
            parse(b"SET \"a\"b\r\n"),
            Err(ProtocolError::UnbalancedQuotes)
        );
    }

    #[test]
    fn limits_are_checked_before_waiting_for_the_bytes() {
        // A bulk length over the limit fails at its header.
        assert_eq!(parse(b"*1\r\n$101\r\n"), Err(ProtocolError::BadBulkLength));
        assert!(parse(b"*1\r\n$100\r\n").unwrap() == Parsed::Incomplete);
        assert_eq!(parse(b"*9\r\n"), Err(ProtocolError::BadArrayLength));
        assert_eq!(parse(b"*-5\r\n").unwrap(), command(&[], 5));
        // The whole command is bounded too.
        let mut big = b"*5\r\n".to_vec();
        for _ in 0..3 {
            big.extend_from_slice(b"$100\r\n");
            big.extend_from_slice(&[b'x'; 100]);
            big.extend_from_slice(b"\r\n");
        }
        big.extend_from_slice(b"$100\r\n");
        assert!(matches!(
            parse(&big),
            Err(ProtocolError::CommandTooLarge(..))
        ));
        // Lines without an end are bounded.
        assert_eq!(parse(&[b'a'; 70]), Err(ProtocolError::InlineTooLong));
        assert_eq!(parse(&[b'a'; 60]).unwrap(), Parsed::Incomplete);
        let mut header = b"*".to_vec();
        header.extend_from_slice(&[b'1'; 40]);
        assert_eq!(parse(&header), Err(ProtocolError::HeaderTooLong));
    }

    #[test]
    fn header_numbers_are_what_i64_parsing_accepts() {
        for line in [
            "0",
            "7",
            "-1",
            "+5",
            "-0",
            "123456",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "-9223372036854775809",
            "",
            "-",
            "+",
            "1a",
            " 1",
            "1 ",
            "--1",
            "+-1",
            "٣",
            "99999999999999999999",
            "00000000000000000001",
        ] {
            let mut input = line.as_bytes().to_vec();
            input.push(b'\r');
            assert_eq!(header_number(&input), line.parse::<i64>().ok(), "{line:?}");
        }
        assert_eq!(header_number(b"12"), None, "no CR");
        assert_eq!(
            header_number(b"000000000000000000001\r"),
            None,
            "over 20 bytes"
        );
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        assert_eq!(parse(b"*x\r\n"), Err(ProtocolError::BadArrayLength));
        assert_eq!(
            parse(b"*1\r\n:3\r\n"),
            Err(ProtocolError::ExpectedBulk(':'))
        );
        assert_eq!(parse(b"*1\r\n$-1\r\n"), Err(ProtocolError::BadBulkLength));
        assert_eq!(
            parse(b"*1\r\n$1\r\nab\r\n"),
            Err(ProtocolError::MissingCrlf)
        );
        assert_eq!(parse(b"*1\n"), Err(ProtocolError::BadArrayLength));
    }

    mod props {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Arbitrary bytes never panic, and anything returned stays
            /// within the limits and within the input.
            #[test]
            fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
                let l = limits();
                if let Ok(Parsed::Command { args, len }) = parse_command(&input, &l) {
                    prop_assert!(len <= input.len());
                    prop_assert!(len <= l.max_command_bytes.max(l.max_inline_bytes + 2));
                    prop_assert!(args.len() <= l.max_array_len);
                    for arg in &args {
                        prop_assert!(arg.len() <= l.max_bulk_bytes.max(l.max_inline_bytes));
                    }
                }
            }

            /// Arbitrary bytes after a valid header: same guarantees.
            #[test]
            fn arbitrary_bodies_never_panic(
                count in 0u32..20,
                body in proptest::collection::vec(any::<u8>(), 0..400),
            ) {
                let mut input = format!("*{count}\r\n").into_bytes();
                input.extend_from_slice(&body);
                let l = limits();
                let mut buf = BytesMut::from(&input[..]);
                // Draining a buffer always terminates and never grows it.
                for _ in 0..input.len() + 1 {
                    match next_command(&mut buf, &l) {
                        Ok(Some(args)) => prop_assert!(args.len() <= l.max_array_len),
                        Ok(None) | Err(_) => break,
                    }
                }
                prop_assert!(buf.len() <= input.len());
            }

            /// Valid commands round-trip whatever their bytes.
            #[test]
            fn encoded_arrays_parse_back(args in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
                let mut input = format!("*{}\r\n", args.len()).into_bytes();
                for a in &args {
                    input.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                    input.extend_from_slice(a);
                    input.extend_from_slice(b"\r\n");
                }
                let parsed = parse_command(&input, &limits()).unwrap();
                let expected: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
                prop_assert_eq!(parsed, Parsed::Command { args: expected, len: input.len() });
            }
        }
    }
}
