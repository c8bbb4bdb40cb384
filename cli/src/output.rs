//! Output formats: `simple` (etcdctl-like lines), `table` (boxed, aligned) and
//! `json` (one compact line, written by hand).
//!
//! Keys and values are bytes. Valid UTF-8 is shown as is; anything else is shown
//! escaped: invalid bytes as `\xNN` and, so that the form can be read back without
//! ambiguity, every backslash as `\\`. JSON output marks such fields with
//! `"<field>_escaped": true`. Table cells also escape control characters so that
//! a value with a newline cannot break the layout.

use std::borrow::Cow;
use std::fmt::Write as _;

use clap::ValueEnum;

/// `-w/--write-out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Simple,
    Table,
    Json,
}

/// Something a command prints, in every format.
pub trait View {
    /// Lines for `-w simple`; empty means print nothing.
    fn simple(&self) -> String;
    /// `-w table`; defaults to the simple form (for one-line messages).
    fn table(&self) -> String {
        self.simple()
    }
    fn json(&self) -> Json;
}

/// The text to print for `view` (ends with a newline unless empty).
pub fn render(view: &dyn View, format: Format) -> String {
    let mut out = match format {
        Format::Simple => view.simple(),
        Format::Table => view.table(),
        Format::Json => view.json().to_string(),
    };
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Shows `bytes` as text: UTF-8 unchanged, otherwise escaped (second value `true`).
pub fn show_bytes(bytes: &[u8]) -> (Cow<'_, str>, bool) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return (Cow::Borrowed(text), false);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    (Cow::Owned(out), true)
}

/// One item per line (no newline after the last).
pub fn lines(items: impl IntoIterator<Item = String>) -> String {
    items.into_iter().collect::<Vec<_>>().join("\n")
}

/// A table cell for `text`: control characters escaped so one row stays one line.
pub fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// A boxed table with left-aligned columns sized to their widest cell.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(headers: I) -> Self {
        Self {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// `headers` over `rows`, rendered.
    pub fn of<H, S, R, C>(headers: H, rows: impl IntoIterator<Item = R>) -> String
    where
        H: IntoIterator<Item = S>,
        S: Into<String>,
        R: IntoIterator<Item = C>,
        C: AsRef<str>,
    {
        let mut table = Table::new(headers);
        for row in rows {
            table.row(row);
        }
        table.render()
    }

    /// Adds a row; cells are sanitised with [`cell`]; missing cells are blank.
    pub fn row<I: IntoIterator<Item = S>, S: AsRef<str>>(&mut self, cells: I) {
        let mut row: Vec<String> = cells.into_iter().map(|c| cell(c.as_ref())).collect();
        row.resize(self.headers.len().max(row.len()), String::new());
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let rule = {
            let mut s = String::from("+");
            for w in &widths {
                s.push_str(&"-".repeat(w + 2));
                s.push('+');
            }
            s
        };
        let line = |row: &[String]| {
            let mut s = String::from("|");
            for (i, w) in widths.iter().enumerate() {
                let c = row.get(i).map_or("", String::as_str);
                let pad = w - c.chars().count();
                let _ = write!(s, " {c}{} |", " ".repeat(pad));
            }
            s
        };
        let mut out = String::new();
        for part in [rule.clone(), line(&self.headers), rule.clone()] {
            out.push_str(&part);
            out.push('\n');
        }
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        if !self.rows.is_empty() {
            out.push_str(&rule);
            out.push('\n');
        }
        out
    }
}

/// A JSON value, rendered compactly by `Display`.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    U64(u64),
    F64(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn obj<I: IntoIterator<Item = (K, Json)>, K: Into<String>>(fields: I) -> Self {
        Self::Obj(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> Self {
        Self::Str(s.into())
    }

    pub fn opt_u64(v: Option<u64>) -> Self {
        v.map_or(Self::Null, Self::U64)
    }

    /// Adds `name` (shown with [`show_bytes`]) and, if it had to be escaped,
    /// `name_escaped: true` to an object's fields.
    pub fn push_bytes(fields: &mut Vec<(String, Json)>, name: &str, bytes: &[u8]) {
        let (text, escaped) = show_bytes(bytes);
        fields.push((name.to_owned(), Json::str(text)));
        if escaped {
            fields.push((format!("{name}_escaped"), Json::Bool(true)));
        }
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Null => f.write_str("null"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::U64(n) => write!(f, "{n}"),
            Self::F64(x) if x.is_finite() => write!(f, "{x}"),
            Self::F64(_) => f.write_str("null"),
            Self::Str(s) => write_json_string(f, s),
            Self::Arr(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Self::Obj(fields) => {
                f.write_str("{")?;
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_json_string(f, k)?;
                    write!(f, ":{v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// RFC 8259 string escaping.
fn write_json_string(f: &mut std::fmt::Formatter<'_>, s: &str) -> std::fmt::Result {
    f.write_str("\"")?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\u{8}' => f.write_str("\\b")?,
            '\u{c}' => f.write_str("\\f")?,
            c if u32::from(c) < 0x20 || c == '\u{7f}' => write!(f, "\\u{:04x}", u32::from(c))?,
            c => f.write_char(c)?,
        }
    }
    f.write_str("\"")
}

/// A plain message (e.g. "OK") with its JSON form.
#[derive(Debug, Clone)]
pub struct Message {
    pub text: String,
    pub json: Json,
}

impl View for Message {
    fn simple(&self) -> String {
        self.text.clone()
    }

    fn json(&self) -> Json {
        self.json.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_shown_as_is_and_other_bytes_escaped() {
        assert_eq!(show_bytes(b"hello"), (Cow::Borrowed("hello"), false));
        assert_eq!(show_bytes(b"a\\b"), (Cow::Borrowed("a\\b"), false));
        let (text, escaped) = show_bytes(b"a\\\xff\x00z\xc3");
        assert!(escaped);
        assert_eq!(text, "a\\\\\\xff\u{0}z\\xc3");
        assert_eq!(show_bytes("é".as_bytes()).0, "é");
    }

    #[test]
    fn json_strings_are_escaped() {
        let j = Json::str("q\"b\\n\nt\tc\u{1}\u{7f}é\u{8}\u{c}\r");
        assert_eq!(j.to_string(), r#""q\"b\\n\nt\tc\u0001\u007fé\b\f\r""#);
    }

    #[test]
    fn json_renders_nested_values() {
        let j = Json::obj([
            ("a", Json::U64(1)),
            ("b", Json::Arr(vec![Json::Null, Json::Bool(false)])),
            ("c", Json::F64(12.5)),
            ("d", Json::F64(f64::NAN)),
            ("e", Json::obj::<[(&str, Json); 0], &str>([])),
        ]);
        assert_eq!(
            j.to_string(),
            r#"{"a":1,"b":[null,false],"c":12.5,"d":null,"e":{}}"#
        );
    }

    #[test]
    fn json_marks_escaped_bytes() {
        let mut fields = Vec::new();
        Json::push_bytes(&mut fields, "key", b"ok");
        Json::push_bytes(&mut fields, "value", b"\xfe\"");
        assert_eq!(
            Json::Obj(fields).to_string(),
            r#"{"key":"ok","value":"\\xfe\"","value_escaped":true}"#
        );
    }

    #[test]
    fn table_columns_align() {
        let mut t = Table::new(["ID", "ADDRESS", "É"]);
        t.row(["1", "127.0.0.1:7379", "x"]);
        t.row(["12345", "h:1", "ééé"]);
        let out = t.render();
        let expected = "\
+-------+----------------+-----+
| ID    | ADDRESS        | É   |
+-------+----------------+-----+
| 1     | 127.0.0.1:7379 | x   |
| 12345 | h:1            | ééé |
+-------+----------------+-----+
";
        assert_eq!(out, expected);
        let widths: Vec<usize> = out.lines().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "{widths:?}");
    }

    #[test]
    fn table_cells_escape_control_characters() {
        let mut t = Table::new(["V"]);
        t.row(["a\nb\t\u{1b}"]);
        let out = t.render();
        assert_eq!(out.lines().count(), 5);
        assert!(out.contains("| a\\nb\\t\\u{1b} |"), "{out}");
    }

    #[test]
    fn empty_table_has_only_a_header() {
        let out = Table::new(["KEY", "VALUE"]).render();
        assert_eq!(out.lines().count(), 3);
    }

    #[test]
    fn render_adds_one_newline_and_prints_nothing_for_empty() {
        let m = Message {
            text: "OK".into(),
            json: Json::obj([("ok", Json::Bool(true))]),
        };
        assert_eq!(render(&m, Format::Simple), "OK\n");
        assert_eq!(render(&m, Format::Table), "OK\n");
        assert_eq!(render(&m, Format::Json), "{\"ok\":true}\n");
        let empty = Message {
            text: String::new(),
            json: Json::Null,
        };
        assert_eq!(render(&empty, Format::Simple), "");
    }
}
