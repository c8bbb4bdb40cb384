//! How a YCSB record (fieldcount named fields) is stored: one value, the
//! fields one after another as `name length (u16 LE), name, value length
//! (u32 LE), value`. The same bytes go to rdkv and to Redis, so both move
//! the same payload; a reader decodes them, so a damaged record is counted
//! as an error instead of passing unnoticed.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record truncated at byte {offset} of {len}")]
    Truncated { offset: usize, len: usize },
    #[error("record field name is not UTF-8 at byte {offset}")]
    BadName { offset: usize },
    #[error("record has no field {0}")]
    MissingField(String),
}

/// Bytes of the encoding of `fields`.
pub fn encoded_len<'a>(fields: impl IntoIterator<Item = (&'a str, usize)>) -> usize {
    fields
        .into_iter()
        .map(|(name, value_len)| 2 + name.len() + 4 + value_len)
        .sum()
}

pub fn encode<'a>(fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Bytes {
    let mut record = RecordWriter::with_capacity(0);
    for (name, value) in fields {
        record.field(name, value.len()).copy_from_slice(value);
    }
    record.finish()
}

/// A record written field by field into one buffer, each value in place:
/// a generated value is neither built apart nor copied.
#[derive(Debug)]
pub struct RecordWriter {
    out: BytesMut,
}

impl RecordWriter {
    pub fn with_capacity(bytes: usize) -> RecordWriter {
        RecordWriter {
            out: BytesMut::with_capacity(bytes),
        }
    }

    /// Appends field `name` with a value of `value_len` bytes (zeros), and
    /// returns the value's bytes for the caller to write.
    pub fn field(&mut self, name: &str, value_len: usize) -> &mut [u8] {
        // Field names are "field<N>" and values at most a few KiB: the
        // casts cannot truncate for records this workload builds.
        self.out.put_u16_le(name.len() as u16);
        self.out.put_slice(name.as_bytes());
        self.out.put_u32_le(value_len as u32);
        let start = self.out.len();
        self.out.resize(start + value_len, 0);
        &mut self.out[start..]
    }

    pub fn finish(self) -> Bytes {
        self.out.freeze()
    }
}

/// The fields of a record, borrowed from it.
pub fn decode(record: &[u8]) -> Result<Vec<(&str, &[u8])>, RecordError> {
    fields(record).collect()
}

/// The fields of a record one after another, without a list.
pub fn fields(record: &[u8]) -> impl Iterator<Item = Result<(&str, &[u8]), RecordError>> {
    raw_fields(record).map(|field| {
        let (at, name, value) = field?;
        let name = std::str::from_utf8(name).map_err(|_| RecordError::BadName { offset: at })?;
        Ok((name, value))
    })
}

/// The fields of a record with their names as bytes (and where each name
/// starts): the lengths checked, the names not decoded.
fn raw_fields(record: &[u8]) -> impl Iterator<Item = Result<RawField<'_>, RecordError>> {
    let mut offset = 0;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || offset >= record.len() {
            return None;
        }
        let field = next_field(record, &mut offset);
        failed = field.is_err();
        Some(field)
    })
}

/// A field: where its name starts, its name, its value.
type RawField<'r> = (usize, &'r [u8], &'r [u8]);

/// The field at `*offset`, which moves past it.
fn next_field<'r>(record: &'r [u8], offset: &mut usize) -> Result<RawField<'r>, RecordError> {
    let len = record.len();
    let take = |offset: usize, n: usize| -> Result<&[u8], RecordError> {
        record
            .get(offset..offset + n)
            .ok_or(RecordError::Truncated { offset, len })
    };
    let header = take(*offset, 2)?;
    let name_len = u16::from_le_bytes([header[0], header[1]]) as usize;
    *offset += 2;
    let name_at = *offset;
    let name = take(name_at, name_len)?;
    *offset += name_len;
    let header = take(*offset, 4)?;
    let value_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    *offset += 4;
    let value = take(*offset, value_len)?;
    *offset += value_len;
    Ok((name_at, name, value))
}

/// Checks a record read back: all fields, or the one asked for must decode
/// (every length within the record; names compared as bytes, not decoded:
/// a READ checks one record per operation, and decoding ten names cost a
/// one-sided read's runner more than a tenth of its time). Returns the
/// bytes of field data delivered.
pub fn check(record: &[u8], field: Option<&str>) -> Result<usize, RecordError> {
    let mut delivered = 0;
    let mut found = false;
    for entry in raw_fields(record) {
        let (_, name, value) = entry?;
        match field {
            None => delivered += value.len(),
            // The first field of that name, as a list search would find it;
            // the rest are still length-checked (a damaged record is an
            // error).
            Some(wanted) if !found && name == wanted.as_bytes() => {
                delivered = value.len();
                found = true;
            }
            Some(_) => {}
        }
    }
    match field {
        Some(wanted) if !found => Err(RecordError::MissingField(wanted.to_owned())),
        _ => Ok(delivered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format byte by byte: name length (u16 LE), name, value length
    /// (u32 LE), value, field after field.
    #[test]
    fn a_record_is_its_fields_one_after_another() {
        let record = encode([("f", &b"ab"[..]), ("gh", &b""[..])]);
        assert_eq!(
            &record[..],
            &[
                1, 0, b'f', 2, 0, 0, 0, b'a', b'b', 2, 0, b'g', b'h', 0, 0, 0, 0
            ][..]
        );
        let mut written = RecordWriter::with_capacity(0);
        written.field("f", 2).copy_from_slice(b"ab");
        written.field("gh", 0);
        assert_eq!(written.finish(), record);
    }

    #[test]
    fn round_trips_and_finds_fields() {
        let fields: Vec<(String, Vec<u8>)> = (0..3)
            .map(|i| (format!("field{i}"), vec![b'a' + i as u8; 10 + i]))
            .collect();
        let record = encode(fields.iter().map(|(n, v)| (n.as_str(), v.as_slice())));
        assert_eq!(
            record.len(),
            encoded_len(fields.iter().map(|(n, v)| (n.as_str(), v.len())))
        );
        let decoded = decode(&record).unwrap();
        assert_eq!(decoded.len(), 3);
        assert_eq!(decoded[1], ("field1", &[b'b'; 11][..]));
        assert_eq!(check(&record, None), Ok(33));
        assert_eq!(check(&record, Some("field2")), Ok(12));
        assert_eq!(
            check(&record, Some("field9")),
            Err(RecordError::MissingField("field9".into()))
        );
    }

    #[test]
    fn damaged_records_are_errors() {
        let record = encode([("field0", &b"hello"[..])]);
        for cut in 1..record.len() {
            assert!(decode(&record[..cut]).is_err(), "cut at {cut}");
            assert!(check(&record[..cut], None).is_err(), "cut at {cut}");
            assert!(
                check(&record[..cut], Some("field0")).is_err(),
                "cut at {cut}"
            );
        }
        assert_eq!(decode(&[]), Ok(vec![]));
    }
}
