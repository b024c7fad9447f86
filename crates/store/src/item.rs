//! Byte-packed item encoding inside a slab.
//!
//! An item is laid out with no alignment padding so that small items cost only a few bytes of
//! header (the per-item overhead target is ≤ 14 bytes including the index entry):
//!
//! ```text
//! ctrl u8 | key_len u8 | value_len varint | [flags u32 LE] | [expiry u32 LE] | cas varint | key | value
//! ```
//!
//! `ctrl` says which optional fields are present and carries the meta-protocol state bits
//! (fetched, stale, win token). The CAS is stored as a LEB128 varint of its distance above the
//! slab's CAS base (the CAS counter when the slab was opened), which takes 1–2 bytes for items
//! written while the slab is current; a CAS below the base (explicit CAS from replication) is
//! stored whole with `CTRL_CAS_ABSOLUTE`. Every item stores its real 64-bit CAS: it is never
//! derived from the item's location. Decoding trusts the arena contents, which only this
//! crate writes.

/// Client flags field present.
pub(crate) const CTRL_HAS_FLAGS: u8 = 1 << 0;
/// Absolute expiry field present.
pub(crate) const CTRL_HAS_EXPIRY: u8 = 1 << 1;
/// CAS stored whole instead of as a delta above the slab's CAS base.
pub(crate) const CTRL_CAS_ABSOLUTE: u8 = 1 << 2;
/// The item was read at least once since it was written.
pub(crate) const CTRL_FETCHED: u8 = 1 << 3;
/// The item was invalidated (meta `I` flag) and is served as stale.
pub(crate) const CTRL_STALE: u8 = 1 << 4;
/// A meta "win" token was handed out for this item.
pub(crate) const CTRL_WIN: u8 = 1 << 5;
/// The item was stored through a base64 key (meta `b`): memcached echoes its key in base64.
pub(crate) const CTRL_KEY_BINARY: u8 = 1 << 6;
/// The state bits a rewrite of an item may carry over.
pub(crate) const CTRL_STATE: u8 = CTRL_FETCHED | CTRL_STALE | CTRL_WIN | CTRL_KEY_BINARY;

/// Longest LEB128 encoding of a u64.
pub(crate) const VARINT_LEN_MAX: usize = 10;

/// Bytes a LEB128 varint of `v` takes.
pub(crate) fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(buf: &mut [u8], mut v: u64) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        buf[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    buf[i] = v as u8;
    i + 1
}

fn get_varint(buf: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    let mut shift = 0;
    let mut i = 0;
    loop {
        let b = buf[i];
        v |= u64::from(b & 0x7f) << shift;
        i += 1;
        if b & 0x80 == 0 {
            return (v, i);
        }
        shift += 7;
    }
}

/// The fields of an item that are written together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ItemFields<'a> {
    pub key: &'a [u8],
    pub value_len: usize,
    pub flags: u32,
    /// Absolute unix seconds, 0 = never.
    pub expiry: u32,
    pub cas: u64,
    /// State bits (`CTRL_STATE`) to carry into the new item.
    pub state: u8,
}

/// A decoded item header: where things are, relative to the item's first byte.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub ctrl: u8,
    pub key_offset: usize,
    pub key_len: usize,
    pub value_len: usize,
    pub flags: u32,
    pub expiry: u32,
    /// Offset of the expiry field if present (for in-place touch).
    pub expiry_offset: Option<usize>,
    pub cas: u64,
    pub total_len: usize,
}

impl Header {
    pub fn value_offset(&self) -> usize {
        self.key_offset + self.key_len
    }
}

fn cas_field(cas: u64, cas_base: u64) -> (u64, bool) {
    if cas >= cas_base {
        (cas - cas_base, false)
    } else {
        (cas, true)
    }
}

/// Total encoded length of an item with these fields in a slab with `cas_base`.
pub(crate) fn encoded_len(f: &ItemFields<'_>, cas_base: u64) -> usize {
    let (cas_v, _) = cas_field(f.cas, cas_base);
    2 + varint_len(f.value_len as u64)
        + if f.flags != 0 { 4 } else { 0 }
        + if f.expiry != 0 { 4 } else { 0 }
        + varint_len(cas_v)
        + f.key.len()
        + f.value_len
}

/// Upper bound of the encoded length, independent of the slab's CAS base.
pub(crate) fn encoded_len_max(key_len: usize, value_len: usize) -> usize {
    2 + varint_len(value_len as u64) + 4 + 4 + VARINT_LEN_MAX + key_len + value_len
}

/// Longest header (everything but key and value) of an item whose value is shorter than a
/// slab (≤ 2^30 bytes: a 5-byte length varint): ctrl, key_len, value_len, flags, expiry, CAS.
pub(crate) const HEADER_BYTES_MAX: usize = 2 + 5 + 4 + 4 + VARINT_LEN_MAX;

/// Writes the header and key into `buf` (which is exactly `encoded_len` long) and returns the
/// value's offset; the caller copies the value bytes there.
pub(crate) fn encode_head(buf: &mut [u8], f: &ItemFields<'_>, cas_base: u64) -> usize {
    debug_assert!(f.key.len() <= u8::MAX as usize);
    let (cas_v, absolute) = cas_field(f.cas, cas_base);
    let mut ctrl = f.state & CTRL_STATE;
    if f.flags != 0 {
        ctrl |= CTRL_HAS_FLAGS;
    }
    if f.expiry != 0 {
        ctrl |= CTRL_HAS_EXPIRY;
    }
    if absolute {
        ctrl |= CTRL_CAS_ABSOLUTE;
    }
    buf[0] = ctrl;
    buf[1] = f.key.len() as u8;
    let mut i = 2 + put_varint(&mut buf[2..], f.value_len as u64);
    if f.flags != 0 {
        buf[i..i + 4].copy_from_slice(&f.flags.to_le_bytes());
        i += 4;
    }
    if f.expiry != 0 {
        buf[i..i + 4].copy_from_slice(&f.expiry.to_le_bytes());
        i += 4;
    }
    i += put_varint(&mut buf[i..], cas_v);
    buf[i..i + f.key.len()].copy_from_slice(f.key);
    i + f.key.len()
}

/// Decodes the header of the item starting at `buf[0]`.
pub(crate) fn decode(buf: &[u8], cas_base: u64) -> Header {
    let ctrl = buf[0];
    let key_len = buf[1] as usize;
    let (value_len, n) = get_varint(&buf[2..]);
    let mut i = 2 + n;
    let mut flags = 0;
    if ctrl & CTRL_HAS_FLAGS != 0 {
        flags = u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        i += 4;
    }
    let mut expiry = 0;
    let mut expiry_offset = None;
    if ctrl & CTRL_HAS_EXPIRY != 0 {
        expiry = u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        expiry_offset = Some(i);
        i += 4;
    }
    let (cas_v, n) = get_varint(&buf[i..]);
    i += n;
    let cas = if ctrl & CTRL_CAS_ABSOLUTE != 0 {
        cas_v
    } else {
        cas_v + cas_base
    };
    let value_len = value_len as usize;
    Header {
        ctrl,
        key_offset: i,
        key_len,
        value_len,
        flags,
        expiry,
        expiry_offset,
        cas,
        total_len: i + key_len + value_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_all_field_combinations() {
        for &(flags, expiry, cas, base) in &[
            (0u32, 0u32, 5u64, 0u64),
            (7, 0, 1 << 40, 3),
            (0, 1_700_000_000, 300, 299),
            (u32::MAX, u32::MAX, 2, 1 << 50),
            (1, 1, u64::MAX, 0),
        ] {
            let key = b"some-key";
            let value = vec![0xabu8; 300];
            let f = ItemFields {
                key,
                value_len: value.len(),
                flags,
                expiry,
                cas,
                state: CTRL_STALE,
            };
            let len = encoded_len(&f, base);
            assert!(len <= encoded_len_max(key.len(), value.len()));
            let mut buf = vec![0u8; len];
            let vo = encode_head(&mut buf, &f, base);
            buf[vo..].copy_from_slice(&value);
            let h = decode(&buf, base);
            assert_eq!(h.total_len, len);
            assert_eq!((h.flags, h.expiry, h.cas), (flags, expiry, cas));
            assert_eq!(&buf[h.key_offset..h.key_offset + h.key_len], key);
            assert_eq!(&buf[h.value_offset()..], &value[..]);
            assert_eq!(h.ctrl & CTRL_STALE, CTRL_STALE);
        }
    }

    #[test]
    fn small_item_header_is_five_bytes() {
        // 14-byte key, 100-byte value, no flags, no expiry, CAS within 16383 of the slab base.
        let f = ItemFields {
            key: &[b'k'; 14],
            value_len: 100,
            flags: 0,
            expiry: 0,
            cas: 10_000,
            state: 0,
        };
        assert_eq!(encoded_len(&f, 1) - 114, 5);
    }
}
