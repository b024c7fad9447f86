//! Byte-level building blocks shared by both directions: splitting a line
//! into tokens, hand-written decimal parsing and formatting, key validation,
//! and base64 for meta `b` keys.
//!
//! Tokens are separated by one or more spaces, as memcached's tokenizer does;
//! no other byte separates tokens (a tab is part of a token). Numbers accept
//! what memcached's `strtol`-based parsers accept on the wire in practice: an
//! optional `+` (or `-` for signed fields) and decimal digits, with overflow
//! rejected instead of wrapped.

/// Iterator over the space-separated tokens of a line (empty tokens skipped).
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    /// Tokens of `line`, which must not contain the line terminator.
    pub fn new(line: &'a [u8]) -> Self {
        Self { rest: line }
    }

    /// The unconsumed remainder, leading spaces removed.
    pub fn remainder(&self) -> &'a [u8] {
        let start = self
            .rest
            .iter()
            .position(|&b| b != b' ')
            .unwrap_or(self.rest.len());
        &self.rest[start..]
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.remainder();
        if rest.is_empty() {
            self.rest = rest;
            return None;
        }
        // Tokens are short (keys, numbers, flags): a plain scan beats
        // memchr's SIMD setup here; memchr is kept for finding line ends.
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

/// Parses an unsigned decimal (optional leading `+`), rejecting overflow.
#[inline]
pub fn parse_u64(token: &[u8]) -> Option<u64> {
    let digits = match token {
        [b'+', rest @ ..] => rest,
        _ => token,
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &b in digits {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
    }
    Some(value)
}

/// Parses an unsigned 32-bit decimal, rejecting overflow.
#[inline]
pub fn parse_u32(token: &[u8]) -> Option<u32> {
    parse_u64(token).and_then(|v| u32::try_from(v).ok())
}

/// Parses a length: an unsigned decimal that fits `usize`.
#[inline]
pub fn parse_usize(token: &[u8]) -> Option<usize> {
    parse_u64(token).and_then(|v| usize::try_from(v).ok())
}

/// Parses a signed decimal (optional `+` or `-`), rejecting overflow.
#[inline]
pub fn parse_i64(token: &[u8]) -> Option<i64> {
    match token {
        [b'-', rest @ ..] => {
            if rest.first() == Some(&b'+') {
                return None;
            }
            let magnitude = parse_u64(rest)?;
            if magnitude == 1 << 63 {
                Some(i64::MIN)
            } else {
                i64::try_from(magnitude).ok().map(|v| -v)
            }
        }
        _ => parse_u64(token).and_then(|v| i64::try_from(v).ok()),
    }
}

/// Appends the decimal form of `value`.
#[inline]
pub fn write_u64(out: &mut Vec<u8>, mut value: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        // `value % 10` is below 10, so the cast cannot truncate.
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

/// Appends the decimal form of a signed `value`.
#[inline]
pub fn write_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    write_u64(out, value.unsigned_abs());
}

/// Whether `key` is acceptable: 1..=`max` bytes, none of them a space, CR, LF or NUL —
/// what memcached's parser splits lines and tokens on (it reads a line up to its first
/// NUL). Other control bytes are part of the key,
/// as in memcached (protocol.txt asks clients not to send them, yet Debian's own load tool,
/// memcaslap, starts every key with eight of them); bytes >= 0x80 too (UTF-8 keys).
#[inline]
pub fn key_is_valid(key: &[u8], max: usize) -> bool {
    !key.is_empty() && key.len() <= max && key.iter().all(|&b| !forbidden_in_key(b))
}

/// The bytes no text key may hold: the token separator, the line end's, and NUL.
#[inline]
fn forbidden_in_key(b: u8) -> bool {
    b == b' ' || b == b'\r' || b == b'\n' || b == 0
}

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_value(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Largest binary key a base64 meta key can decode to (a longest key of base64 text).
pub const BINARY_KEY_BYTES_MAX: usize = cellcache_keyspace::KEY_BYTES_MAX / 4 * 3;

/// Decodes standard, padded base64 `text` into `out`, returning the decoded
/// length, or `None` when the text is not canonical padded base64 or does
/// not fit `out`.
pub fn base64_decode(text: &[u8], out: &mut [u8]) -> Option<usize> {
    if text.is_empty() || text.len() % 4 != 0 {
        return None;
    }
    let mut written = 0;
    let quads = text.len() / 4;
    for (index, quad) in text.chunks_exact(4).enumerate() {
        let last = index + 1 == quads;
        let pad = match quad {
            [_, _, b'=', b'='] if last => 2,
            [_, _, _, b'='] if last => 1,
            _ => 0,
        };
        let mut bits: u32 = 0;
        for &b in &quad[..4 - pad] {
            bits = (bits << 6) | u32::from(base64_value(b)?);
        }
        bits <<= 6 * pad as u32;
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        let take = 3 - pad;
        // Reject non-canonical encodings whose padding bits are not zero, so
        // each binary key has exactly one wire form.
        if bytes[take..].iter().any(|&b| b != 0) {
            return None;
        }
        let dest = out.get_mut(written..written + take)?;
        dest.copy_from_slice(&bytes[..take]);
        written += take;
    }
    Some(written)
}

/// Appends the standard, padded base64 encoding of `data`.
pub fn base64_encode(data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let bits = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let symbols = [
            BASE64_ALPHABET[(bits >> 18) as usize & 63],
            BASE64_ALPHABET[(bits >> 12) as usize & 63],
            BASE64_ALPHABET[(bits >> 6) as usize & 63],
            BASE64_ALPHABET[bits as usize & 63],
        ];
        let keep = chunk.len() + 1;
        out.extend_from_slice(&symbols[..keep]);
        out.extend(std::iter::repeat_n(b'=', 4 - keep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_skip_repeated_spaces_but_not_tabs() {
        let tokens: Vec<&[u8]> = Tokens::new(b"  get  a\tb   c ").collect();
        assert_eq!(tokens, vec![&b"get"[..], b"a\tb", b"c"]);
        assert_eq!(Tokens::new(b"   ").next(), None);
    }

    #[test]
    fn numbers_parse_like_memcached_and_reject_overflow() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"+7"), Some(7));
        assert_eq!(parse_u64(b"007"), Some(7));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"+"), None);
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-+1"), None);
        assert_eq!(parse_i64(b"-"), None);
        assert_eq!(parse_i64(b"-5"), Some(-5));
    }

    #[test]
    fn numbers_format_round_trip() {
        for v in [0u64, 1, 9, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
        for v in [0i64, -1, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            write_i64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    #[test]
    fn keys_reject_controls_spaces_and_length() {
        assert!(key_is_valid(b"user:42", 250));
        assert!(key_is_valid("ключ".as_bytes(), 250));
        assert!(!key_is_valid(b"", 250));
        // Control bytes are part of a key, as in memcached (memcaslap's keys start with
        // eight of them); the separators are not.
        assert!(key_is_valid(b"a\tb", 250));
        assert!(key_is_valid(b"a\x7f", 250));
        assert!(key_is_valid(
            b"\x10\x10\x10\x10\x10\x10\x10\x10nr9zdNVpql",
            250
        ));
        assert!(!key_is_valid(b"a\x00b", 250));
        assert!(!key_is_valid(b"a b", 250));
        assert!(!key_is_valid(b"a\rb", 250));
        assert!(!key_is_valid(b"a\nb", 250));
        assert!(!key_is_valid(&[b'k'; 251], 250));
        assert!(key_is_valid(&[b'k'; 250], 250));
    }

    #[test]
    fn base64_round_trips_and_rejects_garbage() {
        let mut buf = [0u8; 64];
        assert_eq!(base64_decode(b"bXlrZXk=", &mut buf), Some(5));
        assert_eq!(&buf[..5], b"mykey");
        for data in [&b""[..], b"a", b"ab", b"abc", b"\x00\xff\x10\x80"] {
            let mut text = Vec::new();
            base64_encode(data, &mut text);
            if data.is_empty() {
                assert!(text.is_empty());
                continue;
            }
            let n = base64_decode(&text, &mut buf).expect("own encoding decodes");
            assert_eq!(&buf[..n], data);
        }
        assert_eq!(base64_decode(b"!!!!", &mut buf), None);
        assert_eq!(base64_decode(b"abc", &mut buf), None);
        assert_eq!(base64_decode(b"a=bc", &mut buf), None);
        assert_eq!(base64_decode(b"YR==", &mut buf), None, "non-zero pad bits");
        assert_eq!(base64_decode(b"YQ==YQ==", &mut buf), None, "pad mid-text");
        assert_eq!(base64_decode(b"YWJj", &mut [0u8; 2]), None, "too small");
    }
}
