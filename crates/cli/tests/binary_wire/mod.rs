//! A raw memcached binary-protocol client for the black-box tests, written from the
//! protocol's packet layout (not with cellcache's codec, so a codec bug cannot hide itself).

#![allow(dead_code)]

use crate::common::Client;

pub const GET: u8 = 0x00;
pub const SET: u8 = 0x01;
pub const ADD: u8 = 0x02;
pub const REPLACE: u8 = 0x03;
pub const DELETE: u8 = 0x04;
pub const INCREMENT: u8 = 0x05;
pub const DECREMENT: u8 = 0x06;
pub const QUIT: u8 = 0x07;
pub const FLUSH: u8 = 0x08;
pub const GETQ: u8 = 0x09;
pub const NOOP: u8 = 0x0a;
pub const VERSION: u8 = 0x0b;
pub const GETK: u8 = 0x0c;
pub const GETKQ: u8 = 0x0d;
pub const APPEND: u8 = 0x0e;
pub const PREPEND: u8 = 0x0f;
pub const STAT: u8 = 0x10;
pub const SETQ: u8 = 0x11;
pub const ADDQ: u8 = 0x12;
pub const REPLACEQ: u8 = 0x13;
pub const DELETEQ: u8 = 0x14;
pub const INCREMENTQ: u8 = 0x15;
pub const DECREMENTQ: u8 = 0x16;
pub const QUITQ: u8 = 0x17;
pub const FLUSHQ: u8 = 0x18;
pub const APPENDQ: u8 = 0x19;
pub const PREPENDQ: u8 = 0x1a;
pub const VERBOSITY: u8 = 0x1b;
pub const TOUCH: u8 = 0x1c;
pub const GAT: u8 = 0x1d;
pub const GATQ: u8 = 0x1e;
pub const SASL_LIST_MECHS: u8 = 0x20;
pub const SASL_AUTH: u8 = 0x21;
pub const SASL_STEP: u8 = 0x22;
pub const GATK: u8 = 0x23;
pub const GATKQ: u8 = 0x24;

pub const OK: u16 = 0x00;
pub const KEY_ENOENT: u16 = 0x01;
pub const KEY_EEXISTS: u16 = 0x02;
pub const E2BIG: u16 = 0x03;
pub const EINVAL: u16 = 0x04;
pub const NOT_STORED: u16 = 0x05;
pub const DELTA_BADVAL: u16 = 0x06;
pub const AUTH_ERROR: u16 = 0x20;
pub const AUTH_CONTINUE: u16 = 0x21;
pub const UNKNOWN_COMMAND: u16 = 0x81;

/// One request packet.
pub fn request(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut b = vec![0x80, opcode];
    b.extend_from_slice(&(key.len() as u16).to_be_bytes());
    b.push(extras.len() as u8);
    b.push(0); // data type
    b.extend_from_slice(&[0, 0]); // vbucket
    b.extend_from_slice(&body.to_be_bytes());
    b.extend_from_slice(&opaque.to_be_bytes());
    b.extend_from_slice(&cas.to_be_bytes());
    b.extend_from_slice(extras);
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b
}

/// Extras of set/add/replace: flags, expiration.
pub fn store_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut e = flags.to_be_bytes().to_vec();
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

/// Extras of increment/decrement: delta, initial, expiration.
pub fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut e = delta.to_be_bytes().to_vec();
    e.extend_from_slice(&initial.to_be_bytes());
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

pub fn set(key: &[u8], value: &[u8], flags: u32, opaque: u32, cas: u64) -> Vec<u8> {
    request(SET, &store_extras(flags, 0), key, value, opaque, cas)
}

pub fn get(opcode: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    request(opcode, &[], key, &[], opaque, 0)
}

/// SASL PLAIN authentication (`SASL_AUTH`, mechanism `PLAIN`, `NUL user NUL password`).
pub fn sasl_plain(user: &str, password: &str, opaque: u32) -> Vec<u8> {
    let data = format!("\0{user}\0{password}");
    request(SASL_AUTH, &[], b"PLAIN", data.as_bytes(), opaque, 0)
}

/// One response packet, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    pub magic: u8,
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl Resp {
    /// The flags of a get hit.
    pub fn flags(&self) -> u32 {
        u32::from_be_bytes(self.extras[..4].try_into().expect("4-byte flags extras"))
    }

    /// The counter of an incr/decr reply.
    pub fn counter(&self) -> u64 {
        u64::from_be_bytes(self.value[..].try_into().expect("8-byte counter"))
    }
}

/// Reads one response packet (fails the test on timeout or close).
pub fn recv(c: &mut Client) -> Resp {
    let h = c.read_exact_len(24);
    let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extras_len = usize::from(h[4]);
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    assert!(extras_len + key_len <= body, "bad response header {h:?}");
    let b = c.read_exact_len(body);
    Resp {
        magic: h[0],
        opcode: h[1],
        status: u16::from_be_bytes([h[6], h[7]]),
        opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        cas: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        extras: b[..extras_len].to_vec(),
        key: b[extras_len..extras_len + key_len].to_vec(),
        value: b[extras_len + key_len..].to_vec(),
    }
}

/// Sends one request and reads its response.
pub fn call(c: &mut Client, req: &[u8]) -> Resp {
    c.send(req);
    let r = recv(c);
    assert_eq!(r.magic, 0x81, "{r:?}");
    assert_eq!(r.opcode, req[1], "{r:?}");
    assert_eq!(
        &r.opaque.to_be_bytes()[..],
        &req[12..16],
        "opaque echoed: {r:?}"
    );
    r
}
