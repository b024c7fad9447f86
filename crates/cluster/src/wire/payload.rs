//! Payload layouts of the frames that carry data rather than control messages.
//!
//! Replication and range hand-off both move *full item state*, never commands, so applying a
//! record is idempotent and order is decided by a sequence number alone: a backup applies
//! record `seq` of a master's lane only right after `seq - 1` and refuses a frame that jumps
//! ([`SequenceGap`]; the node enforces this, the codec just carries the numbers). All integers are little-endian; every length is bounded and checked
//! against the remaining bytes, so decoding never panics and never over-reads.
//!
//! ```text
//! record  := op:u8  range.start:u64  range.end:u64  seq:u64  body
//! Set     := key_len:u8 key  flags:u32  expiry_unix_secs:u64  cas:u64  stale:u8
//!            value_len:u32 value
//! Delete  := key_len:u8 key
//! Touch   := key_len:u8 key  expiry_unix_secs:u64
//! Flush   := at_unix_secs:u64
//! SetPart := key_len:u8 key  flags:u32  expiry_unix_secs:u64  cas:u64  stale:u8
//!            total_len:u32  offset:u32  part_len:u32 part
//!
//! `stale` is 1 for an item marked stale by a meta invalidation (`md … I`), else 0.
//! ack / snapshot-done := range.start:u64 range.end:u64 seq:u64
//! sequence gap        := "sequence gap: expected " decimal      (a `Refused` payload)
//! ```

use crate::id::CellId;
use crate::range::HashRange;
use crate::wire::WireError;

/// Longest key; it also fits the one-byte key length.
pub const KEY_BYTES_MAX: usize = cellcache_keyspace::KEY_BYTES_MAX;
const _: () = assert!(KEY_BYTES_MAX <= u8::MAX as usize);

const OP_SET: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_TOUCH: u8 = 3;
const OP_FLUSH: u8 = 4;
const OP_SET_PART: u8 = 5;

/// One change to replicate, with full item state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationOp<'a> {
    /// The item now has exactly this state (set family, incr/decr, append… all become Set).
    Set {
        key: &'a [u8],
        value: &'a [u8],
        flags: u32,
        expiry_unix_secs: u64,
        cas: u64,
        stale: bool,
    },
    /// The item is gone.
    Delete { key: &'a [u8] },
    /// The item's expiry changed.
    Touch {
        key: &'a [u8],
        expiry_unix_secs: u64,
    },
    /// Every item of the range written before `at_unix_secs` is invalid from then on.
    Flush { at_unix_secs: u64 },
    /// One piece of a `Set` whose value is too large for one frame-friendly record: bytes
    /// `offset..offset + part.len()` of a `total_len`-byte value. The pieces of one value go
    /// in order, each with its own sequence number, so other records can travel between
    /// them; the receiver stores the item when the last piece arrives.
    SetPart {
        key: &'a [u8],
        flags: u32,
        expiry_unix_secs: u64,
        cas: u64,
        stale: bool,
        total_len: u32,
        offset: u32,
        part: &'a [u8],
    },
}

impl<'a> ReplicationOp<'a> {
    /// The key the op changes (`None` for a flush, which changes the whole range).
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            ReplicationOp::Set { key, .. }
            | ReplicationOp::Delete { key }
            | ReplicationOp::Touch { key, .. }
            | ReplicationOp::SetPart { key, .. } => Some(key),
            ReplicationOp::Flush { .. } => None,
        }
    }
}

/// A replication record: which master range's stream it belongs to and where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationRecord<'a> {
    /// The master range whose stream this is.
    pub range: HashRange,
    /// Position in its sender's lane (live or snapshot) to this receiver: consecutive.
    pub seq: u64,
    /// What changed.
    pub op: ReplicationOp<'a>,
}

/// `(range, seq)`: a backup's acknowledgement, or the end of a snapshot stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeSeq {
    /// The range of the stream.
    pub range: HashRange,
    /// The last position the backup applied in the lane (ack), or the marker's own
    /// position in the snapshot lane (snapshot done).
    pub seq: u64,
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(WireError::Payload("truncated"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Payload("flag byte not 0 or 1")),
        }
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn key(&mut self) -> Result<&'a [u8], WireError> {
        let len = usize::from(self.u8()?);
        if len == 0 || len > KEY_BYTES_MAX {
            return Err(WireError::Payload("key length out of bounds"));
        }
        self.take(len)
    }
    fn range(&mut self) -> Result<HashRange, WireError> {
        Ok(HashRange::new(self.u64()?, self.u64()?))
    }
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) -> Result<(), WireError> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(WireError::Payload("key length out of bounds"));
    }
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    Ok(())
}

/// Where `seq` sits in an encoded record: after its op (1 byte) and range (16 bytes).
const RECORD_SEQ_AT: usize = 1 + 16;

/// Sets the sequence number of one encoded record in place: a master encodes a change once
/// and numbers it per target as it queues it. False if `record` is too short to be one.
pub fn set_record_seq(record: &mut [u8], seq: u64) -> bool {
    match record.get_mut(RECORD_SEQ_AT..RECORD_SEQ_AT + 8) {
        Some(field) => {
            field.copy_from_slice(&seq.to_le_bytes());
            true
        }
        None => false,
    }
}

impl<'a> ReplicationRecord<'a> {
    /// Appends the record to `out` (several records may share one payload).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let tag = match self.op {
            ReplicationOp::Set { .. } => OP_SET,
            ReplicationOp::Delete { .. } => OP_DELETE,
            ReplicationOp::Touch { .. } => OP_TOUCH,
            ReplicationOp::Flush { .. } => OP_FLUSH,
            ReplicationOp::SetPart { .. } => OP_SET_PART,
        };
        let rollback = out.len();
        out.push(tag);
        out.extend_from_slice(&self.range.start.to_le_bytes());
        out.extend_from_slice(&self.range.end.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        let body = match self.op {
            ReplicationOp::Set {
                key,
                value,
                flags,
                expiry_unix_secs,
                cas,
                stale,
            } => put_key(out, key).and_then(|()| {
                let len = u32::try_from(value.len())
                    .map_err(|_| WireError::Payload("value longer than u32"))?;
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&expiry_unix_secs.to_le_bytes());
                out.extend_from_slice(&cas.to_le_bytes());
                out.push(u8::from(stale));
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(value);
                Ok(())
            }),
            ReplicationOp::Delete { key } => put_key(out, key),
            ReplicationOp::Touch {
                key,
                expiry_unix_secs,
            } => put_key(out, key).map(|()| {
                out.extend_from_slice(&expiry_unix_secs.to_le_bytes());
            }),
            ReplicationOp::Flush { at_unix_secs } => {
                out.extend_from_slice(&at_unix_secs.to_le_bytes());
                Ok(())
            }
            ReplicationOp::SetPart {
                key,
                flags,
                expiry_unix_secs,
                cas,
                stale,
                total_len,
                offset,
                part,
            } => put_key(out, key).and_then(|()| {
                let len = u32::try_from(part.len())
                    .map_err(|_| WireError::Payload("part longer than u32"))?;
                let end = offset.checked_add(len).filter(|&e| e <= total_len);
                if end.is_none() {
                    return Err(WireError::Payload("part beyond the value's length"));
                }
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&expiry_unix_secs.to_le_bytes());
                out.extend_from_slice(&cas.to_le_bytes());
                out.push(u8::from(stale));
                out.extend_from_slice(&total_len.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(part);
                Ok(())
            }),
        };
        if body.is_err() {
            out.truncate(rollback);
        }
        body
    }

    /// Decodes the first record of `buf`, returning it and the bytes it used.
    pub fn decode(buf: &'a [u8]) -> Result<(ReplicationRecord<'a>, usize), WireError> {
        let mut r = Reader { buf, at: 0 };
        let tag = r.u8()?;
        let range = r.range()?;
        let seq = r.u64()?;
        let op = match tag {
            OP_SET => {
                let key = r.key()?;
                let flags = r.u32()?;
                let expiry_unix_secs = r.u64()?;
                let cas = r.u64()?;
                let stale = r.flag()?;
                let len = r.u32()? as usize;
                let value = r.take(len)?;
                ReplicationOp::Set {
                    key,
                    value,
                    flags,
                    expiry_unix_secs,
                    cas,
                    stale,
                }
            }
            OP_DELETE => ReplicationOp::Delete { key: r.key()? },
            OP_TOUCH => ReplicationOp::Touch {
                key: r.key()?,
                expiry_unix_secs: r.u64()?,
            },
            OP_FLUSH => ReplicationOp::Flush {
                at_unix_secs: r.u64()?,
            },
            OP_SET_PART => {
                let key = r.key()?;
                let flags = r.u32()?;
                let expiry_unix_secs = r.u64()?;
                let cas = r.u64()?;
                let stale = r.flag()?;
                let total_len = r.u32()?;
                let offset = r.u32()?;
                let len = r.u32()?;
                if offset.checked_add(len).is_none_or(|e| e > total_len) {
                    return Err(WireError::Payload("part beyond the value's length"));
                }
                ReplicationOp::SetPart {
                    key,
                    flags,
                    expiry_unix_secs,
                    cas,
                    stale,
                    total_len,
                    offset,
                    part: r.take(len as usize)?,
                }
            }
            _ => return Err(WireError::Payload("unknown replication op")),
        };
        Ok((ReplicationRecord { range, seq, op }, r.at))
    }

    /// Iterates over every record of a payload; stops after the first error.
    pub fn decode_all(
        mut buf: &'a [u8],
    ) -> impl Iterator<Item = Result<ReplicationRecord<'a>, WireError>> + 'a {
        let mut failed = false;
        std::iter::from_fn(move || {
            if buf.is_empty() || failed {
                return None;
            }
            match ReplicationRecord::decode(buf) {
                Ok((rec, used)) => {
                    buf = &buf[used..];
                    Some(Ok(rec))
                }
                Err(e) => {
                    failed = true;
                    Some(Err(e))
                }
            }
        })
    }
}

/// The full state of one item, as replication carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemState<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub expiry_unix_secs: u64,
    pub cas: u64,
    /// Marked stale by a meta invalidation.
    pub stale: bool,
}

/// Encodes the state of one item as records of at most about `part_bytes` of value each: one
/// `Set` when the value fits, else consecutive `SetPart`s (sequence numbers are filled in
/// later by whoever orders the stream).
pub fn encode_item(
    range: HashRange,
    item: &ItemState<'_>,
    part_bytes: usize,
) -> Result<Vec<Vec<u8>>, WireError> {
    let ItemState {
        key,
        value,
        flags,
        expiry_unix_secs,
        cas,
        stale,
    } = *item;
    let record = |op| {
        let mut b = Vec::with_capacity(key.len() + value.len().min(part_bytes) + 64);
        ReplicationRecord { range, seq: 0, op }
            .encode(&mut b)
            .map(|()| b)
    };
    if value.len() <= part_bytes.max(1) {
        return Ok(vec![record(ReplicationOp::Set {
            key,
            value,
            flags,
            expiry_unix_secs,
            cas,
            stale,
        })?]);
    }
    let total_len =
        u32::try_from(value.len()).map_err(|_| WireError::Payload("value longer than u32"))?;
    let mut records = Vec::with_capacity(value.len().div_ceil(part_bytes));
    for (i, part) in value.chunks(part_bytes).enumerate() {
        // i * part_bytes < value.len() <= u32::MAX
        let offset = (i * part_bytes) as u32;
        records.push(record(ReplicationOp::SetPart {
            key,
            flags,
            expiry_unix_secs,
            cas,
            stale,
            total_len,
            offset,
            part,
        })?);
    }
    Ok(records)
}

/// Encodes one change as records: a `Set` through [`encode_item`] (in parts when its value
/// is longer than `part_bytes`), any other op as one record.
pub fn encode_op(
    range: HashRange,
    op: ReplicationOp<'_>,
    part_bytes: usize,
) -> Result<Vec<Vec<u8>>, WireError> {
    match op {
        ReplicationOp::Set {
            key,
            value,
            flags,
            expiry_unix_secs,
            cas,
            stale,
        } => {
            let item = ItemState {
                key,
                value,
                flags,
                expiry_unix_secs,
                cas,
                stale,
            };
            encode_item(range, &item, part_bytes)
        }
        op => {
            let mut b = Vec::new();
            ReplicationRecord { range, seq: 0, op }.encode(&mut b)?;
            Ok(vec![b])
        }
    }
}

impl RangeSeq {
    /// Fixed 24-byte layout.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.range.start.to_le_bytes());
        out.extend_from_slice(&self.range.end.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    /// Decodes a payload that must be exactly one `RangeSeq`.
    pub fn decode(buf: &[u8]) -> Result<RangeSeq, WireError> {
        let mut r = Reader { buf, at: 0 };
        let v = RangeSeq {
            range: r.range()?,
            seq: r.u64()?,
        };
        if r.at != buf.len() {
            return Err(WireError::Payload("trailing bytes"));
        }
        Ok(v)
    }
}

/// A backup's refusal of a replication frame that does not continue its lane: the records'
/// positions jump past (or skip within) what it applied. It carries the position the
/// receiver expects next, so the master renumbers what it has not had acknowledged from
/// there and re-sends the range; as text, so that logs printing a refusal read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceGap {
    /// The position the receiver accepts next (its last applied one, plus one).
    pub expected: u64,
}

/// What a sequence-gap refusal starts with.
const SEQUENCE_GAP_PREFIX: &str = "sequence gap: expected ";

impl SequenceGap {
    /// The `Refused` payload.
    pub fn encode(&self) -> Vec<u8> {
        format!("{SEQUENCE_GAP_PREFIX}{}", self.expected).into_bytes()
    }

    /// A `Refused` payload that is a sequence gap, or `None` (any other refusal).
    pub fn decode(buf: &[u8]) -> Option<SequenceGap> {
        let text = std::str::from_utf8(buf).ok()?;
        let digits = text.strip_prefix(SEQUENCE_GAP_PREFIX)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let expected = digits.parse().ok()?;
        Some(SequenceGap { expected })
    }
}

/// The first frame of every peer connection: who sends, of which ring, reachable where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's cell id.
    pub cell: CellId,
    /// The sender's ring ([`crate::ClusterMap::ring`]).
    pub ring: u64,
    /// The sender's client (memcached) address, for operators' messages.
    pub client: String,
}

/// Longest client address a Hello carries.
const HELLO_CLIENT_BYTES_MAX: usize = 255;

/// Hello payload, as text: `<cell id> <ring, hex> <client address>`.
pub fn encode_hello(hello: &Hello) -> Vec<u8> {
    format!("{} {:x} {}", hello.cell, hello.ring, hello.client).into_bytes()
}

/// Parses a Hello payload.
pub fn decode_hello(buf: &[u8]) -> Result<Hello, WireError> {
    let text = std::str::from_utf8(buf).map_err(|_| WireError::Payload("hello is not UTF-8"))?;
    let mut words = text.split(' ');
    let bad = WireError::Payload("hello is not `<cell> <ring> <client address>`");
    let (Some(cell), Some(ring), Some(client), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad);
    };
    if client.is_empty() || client.len() > HELLO_CLIENT_BYTES_MAX {
        return Err(bad);
    }
    Ok(Hello {
        cell: cell
            .parse()
            .map_err(|_| WireError::Payload("hello is not a cell id"))?,
        ring: u64::from_str_radix(ring, 16).map_err(|_| WireError::Payload("hello ring"))?,
        client: client.to_string(),
    })
}

/// A cell id as a payload (a suspect to probe), as text.
pub fn encode_cell_id(id: &CellId) -> Vec<u8> {
    id.to_string().into_bytes()
}

/// Parses a cell id payload.
pub fn decode_cell_id(buf: &[u8]) -> Result<CellId, WireError> {
    let text = std::str::from_utf8(buf).map_err(|_| WireError::Payload("cell id is not UTF-8"))?;
    text.parse()
        .map_err(|_| WireError::Payload("not a cell id"))
}

#[cfg(test)]
mod tests;
