//! The value format of the cross-process stress test, shared by the writer
//! (the test) and the reader processes (`shm_reader`):
//! `<key>|<seq>|<filler>`, the filler derived from key and seq, so that a torn
//! or foreign value does not decode.

pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The filler of `key`'s value number `seq` (16 to 1 024 letters).
fn filler(key: &[u8], seq: u64) -> Vec<u8> {
    let mut state = splitmix64(fnv1a(key) ^ seq.rotate_left(32));
    let len = 16 + (state % 1009) as usize;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state = splitmix64(state);
        for b in state.to_le_bytes() {
            if out.len() < len {
                out.push(b'a' + b % 26);
            }
        }
    }
    out
}

/// The value the writer writes as `key`'s number `seq`.
pub fn encode(key: &str, seq: u64) -> Vec<u8> {
    let mut value = format!("{key}|{seq}|").into_bytes();
    value.extend_from_slice(&filler(key.as_bytes(), seq));
    value
}

/// The seq of `value` if it is exactly one the writer wrote for `key`, or
/// why not.
pub fn check(key: &[u8], value: &[u8]) -> Result<u64, String> {
    let mut parts = value.splitn(3, |b| *b == b'|');
    let (Some(embedded), Some(seq), Some(fill)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("not <key>|<seq>|<filler>".to_owned());
    };
    if embedded != key {
        return Err(format!(
            "value of key {:?}",
            String::from_utf8_lossy(embedded)
        ));
    }
    let seq: u64 = std::str::from_utf8(seq)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "unparsable seq".to_owned())?;
    if fill != filler(key, seq).as_slice() {
        return Err(format!("filler of seq {seq} does not match"));
    }
    Ok(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_values_check_and_others_do_not() {
        let v = encode("hot-1", 42);
        assert_eq!(check(b"hot-1", &v), Ok(42));
        assert!(check(b"hot-2", &v).is_err());
        let mut torn = v.clone();
        let last = torn.len() - 1;
        torn[last] ^= 1;
        assert!(check(b"hot-1", &torn).is_err());
        assert!(check(b"hot-1", b"garbage").is_err());
    }
}
