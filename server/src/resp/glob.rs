//! Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET): `*`, `?`,
//! `[abc]`, `[^abc]`, `[a-z]` and `\` escapes, on bytes.
//!
//! Matched with one backtracking point (the last `*`), so a pattern from a
//! client costs at most pattern length x text length steps, never the
//! exponential time of naive recursion on `*a*a*a*...`.

/// Whether `text` matches `pattern`; `nocase` folds ASCII case (CONFIG GET
/// does, KEYS and SCAN do not).
pub fn glob_match(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: its pattern position and the
    // text position it has consumed up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            p += 1;
            star = Some((p, t));
            continue;
        }
        if let Some((len, matched)) = one(&pattern[p..], text[t], nocase)
            && matched
        {
            p += len;
            t += 1;
            continue;
        }
        // Mismatch: let the last `*` take one more byte, if there was one.
        let Some((after_star, taken)) = star else {
            return false;
        };
        p = after_star;
        t = taken + 1;
        star = Some((after_star, taken + 1));
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Matches the single-byte pattern element at the start of `pattern`
/// against `byte`: `(element length, matched)`, `None` at the end of the
/// pattern.
fn one(pattern: &[u8], byte: u8, nocase: bool) -> Option<(usize, bool)> {
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    match *pattern.first()? {
        b'?' => Some((1, true)),
        b'[' => Some(class(pattern, byte, nocase)),
        b'\\' if pattern.len() >= 2 => Some((2, eq(pattern[1], byte))),
        literal => Some((1, eq(literal, byte))),
    }
}

/// A `[...]` class at the start of `pattern`. An unterminated class runs
/// to the end of the pattern, as in Redis.
fn class(pattern: &[u8], byte: u8, nocase: bool) -> (usize, bool) {
    let fold = |b: u8| if nocase { b.to_ascii_lowercase() } else { b };
    let byte = fold(byte);
    let mut i = 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            matched |= fold(pattern[i + 1]) == byte;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (a, b) = (fold(pattern[i]), fold(pattern[i + 2]));
            let (low, high) = if a <= b { (a, b) } else { (b, a) };
            matched |= (low..=high).contains(&byte);
            i += 3;
        } else {
            matched |= fold(pattern[i]) == byte;
            i += 1;
        }
    }
    let len = (i + 1).min(pattern.len());
    (len, matched != negate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, text: &str) -> bool {
        glob_match(pattern.as_bytes(), text.as_bytes(), false)
    }

    #[test]
    fn redis_glob_syntax() {
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h*llo", "hllo"));
        assert!(m("h*llo", "heeeello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("h[b-a]llo", "hallo"));
        assert!(!m("h[a-b]llo", "hcllo"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("[\\]]", "]"));
        assert!(m("user:*:name", "user:42:name"));
        assert!(!m("user:*:name", "user:42:names"));
        assert!(m("*:*", "a:b:c"));
        assert!(!m("abc", "ab"));
        assert!(!m("ab", "abc"));
        assert!(m("ab**", "ab"));
        // Case folds only when asked (CONFIG GET).
        assert!(!m("SAVE", "save"));
        assert!(glob_match(b"s?VE", b"save", true));
        assert!(glob_match(b"[A-C]x", b"bx", true));
    }

    #[test]
    fn a_pathological_pattern_takes_quadratic_time_at_most() {
        // Naive recursion takes exponential time on this; here it is a
        // few thousand steps.
        let pattern = "*a".repeat(30) + "b";
        let text = "a".repeat(200);
        assert!(!m(&pattern, &text));
    }
}
