//! The memcached binary protocol over a real socket: every opcode, the quiet forms,
//! pipelining, CAS, errors, oversized values, frames split across reads and a bad magic.
//! Run with `CELLCACHE_TEST_SERVER=memcached` to check the expectations against Debian's
//! memcached 1.6 (the few places cellcache differs on purpose say so); by default they run
//! against the `cellcache` binary, on the engine `CELLCACHE_TEST_IO_ENGINE` names.

mod binary_wire;
mod common;

use binary_wire::*;
use common::{Client, Server, is_memcached};

fn server() -> Server {
    Server::start(&["-m", "64", "-t", "2"])
}

/// Stores `value` under `key` and returns its CAS.
fn store(c: &mut Client, key: &[u8], value: &[u8], flags: u32) -> u64 {
    let r = call(c, &set(key, value, flags, 1, 0));
    assert_eq!(r.status, OK, "{r:?}");
    assert_ne!(r.cas, 0);
    r.cas
}

#[test]
fn get_and_every_storage_opcode() {
    let s = server();
    let mut c = s.connect();
    let cas = store(&mut c, b"a", b"abc", 5);
    // get: flags as extras, the value, the item's CAS; no key
    let r = call(&mut c, &get(GET, b"a", 7));
    assert_eq!(
        (r.status, r.flags(), r.value.as_slice(), r.cas),
        (OK, 5, &b"abc"[..], cas)
    );
    assert!(r.key.is_empty());
    // getk: the key too
    let r = call(&mut c, &get(GETK, b"a", 8));
    assert_eq!(
        (r.key.as_slice(), r.value.as_slice()),
        (&b"a"[..], &b"abc"[..])
    );
    // misses: get says "Not found", getk returns the key
    let r = call(&mut c, &get(GET, b"nope", 9));
    assert_eq!(
        (r.status, r.value.as_slice()),
        (KEY_ENOENT, &b"Not found"[..])
    );
    let r = call(&mut c, &get(GETK, b"nope", 10));
    assert_eq!(
        (r.status, r.key.as_slice(), r.value.len()),
        (KEY_ENOENT, &b"nope"[..], 0)
    );
    // add only if absent, replace only if present
    let add = |key: &[u8], v: &[u8]| request(ADD, &store_extras(0, 0), key, v, 11, 0);
    let replace = |key: &[u8], v: &[u8]| request(REPLACE, &store_extras(3, 0), key, v, 12, 0);
    assert_eq!(call(&mut c, &add(b"a", b"z")).status, KEY_EEXISTS);
    assert_eq!(call(&mut c, &add(b"b", b"bb")).status, OK);
    assert_eq!(call(&mut c, &replace(b"nope", b"z")).status, KEY_ENOENT);
    assert_eq!(call(&mut c, &replace(b"b", b"BBB")).status, OK);
    let r = call(&mut c, &get(GET, b"b", 13));
    assert_eq!((r.flags(), r.value.as_slice()), (3, &b"BBB"[..]));
    // append / prepend: no extras, keep flags, need an item
    let r = call(&mut c, &request(APPEND, &[], b"a", b"de", 14, 0));
    assert_eq!(r.status, OK);
    assert_ne!(r.cas, cas, "a write gives a new CAS");
    assert_eq!(
        call(&mut c, &request(PREPEND, &[], b"a", b"__", 15, 0)).status,
        OK
    );
    let r = call(&mut c, &get(GET, b"a", 16));
    assert_eq!((r.flags(), r.value.as_slice()), (5, &b"__abcde"[..]));
    assert_eq!(
        call(&mut c, &request(APPEND, &[], b"nope", b"z", 17, 0)).status,
        NOT_STORED
    );
    assert_eq!(
        call(&mut c, &request(PREPEND, &[], b"nope", b"z", 18, 0)).status,
        NOT_STORED
    );
    // delete
    assert_eq!(call(&mut c, &get(DELETE, b"b", 19)).status, OK);
    assert_eq!(call(&mut c, &get(DELETE, b"b", 20)).status, KEY_ENOENT);
    assert_eq!(call(&mut c, &get(GET, b"b", 21)).status, KEY_ENOENT);
    // empty value, flags at the extremes
    store(&mut c, b"empty", b"", u32::MAX);
    let r = call(&mut c, &get(GET, b"empty", 22));
    assert_eq!((r.status, r.flags(), r.value.len()), (OK, u32::MAX, 0));
}

#[test]
fn binary_and_text_clients_share_items() {
    let s = server();
    let mut bin = s.connect();
    let mut text = s.connect();
    store(&mut bin, b"shared", b"from-binary", 9);
    text.roundtrip(
        b"get shared\r\n",
        b"VALUE shared 9 11\r\nfrom-binary\r\nEND\r\n",
    );
    text.roundtrip(b"set t 4 0 2\r\nhi\r\n", b"STORED\r\n");
    let r = call(&mut bin, &get(GET, b"t", 1));
    assert_eq!((r.flags(), r.value.as_slice()), (4, &b"hi"[..]));
    if !is_memcached() {
        // A key with a space and control bytes: legal in binary, kept byte for byte
        // (cellcache carries it base64 inside, so a meta client can reach it with `b`).
        store(&mut bin, b"a b\r\n", b"odd", 0);
        let r = call(&mut bin, &get(GETK, b"a b\r\n", 2));
        assert_eq!(
            (r.key.as_slice(), r.value.as_slice()),
            (&b"a b\r\n"[..], &b"odd"[..])
        );
        text.roundtrip(b"mg YSBiDQo= b v\r\n", b"VA 3\r\nodd\r\n");
    }
}

#[test]
fn cas_compares_on_set_delete_and_counters() {
    let s = server();
    let mut c = s.connect();
    let cas = store(&mut c, b"k", b"v1", 0);
    // set with a stale CAS: exists; with the right one: stored, new CAS
    assert_eq!(
        call(&mut c, &set(b"k", b"v2", 0, 1, cas + 1000)).status,
        KEY_EEXISTS
    );
    let r = call(&mut c, &set(b"k", b"v2", 0, 2, cas));
    assert_eq!(r.status, OK);
    let cas2 = r.cas;
    assert_ne!(cas2, cas);
    // CAS on a missing item: not found
    assert_eq!(
        call(&mut c, &set(b"missing", b"x", 0, 3, 77)).status,
        KEY_ENOENT
    );
    // replace with a CAS is a compare-and-swap too
    let r = call(
        &mut c,
        &request(REPLACE, &store_extras(0, 0), b"k", b"v3", 4, cas),
    );
    assert_eq!(r.status, KEY_EEXISTS);
    // delete: wrong CAS exists, right CAS deletes
    assert_eq!(
        call(&mut c, &request(DELETE, &[], b"k", &[], 5, cas)).status,
        KEY_EEXISTS
    );
    assert_eq!(
        call(&mut c, &request(DELETE, &[], b"k", &[], 6, cas2)).status,
        OK
    );
    // a counter's CAS
    let r = call(
        &mut c,
        &request(INCREMENT, &arith_extras(1, 5, 0), b"n", &[], 7, 0),
    );
    assert_eq!((r.status, r.counter()), (OK, 5));
    let ncas = r.cas;
    let stale = request(INCREMENT, &arith_extras(1, 0, 0), b"n", &[], 8, ncas + 1000);
    assert_eq!(call(&mut c, &stale).status, KEY_EEXISTS);
    let r = call(
        &mut c,
        &request(INCREMENT, &arith_extras(1, 0, 0), b"n", &[], 9, ncas),
    );
    assert_eq!((r.status, r.counter()), (OK, 6));
    // the CAS a get reports is the one the last write returned
    let r = call(
        &mut c,
        &request(INCREMENT, &arith_extras(0, 0, 0), b"n", &[], 10, 0),
    );
    assert_eq!(call(&mut c, &get(GET, b"n", 11)).cas, r.cas);
}

#[test]
fn counters_create_count_and_refuse() {
    let s = server();
    let mut c = s.connect();
    let incr = |delta, initial, exptime| {
        request(
            INCREMENT,
            &arith_extras(delta, initial, exptime),
            b"n",
            &[],
            1,
            0,
        )
    };
    let decr = |delta| {
        request(
            DECREMENT,
            &arith_extras(delta, 0, 0xffff_ffff),
            b"n",
            &[],
            2,
            0,
        )
    };
    // expiration 0xffffffff: a missing counter is not created
    assert_eq!(call(&mut c, &incr(1, 10, 0xffff_ffff)).status, KEY_ENOENT);
    assert_eq!(call(&mut c, &get(GET, b"n", 3)).status, KEY_ENOENT);
    // otherwise it is created with the initial value (the delta is not applied)
    let r = call(&mut c, &incr(5, 10, 0));
    assert_eq!((r.status, r.counter()), (OK, 10));
    assert_eq!(call(&mut c, &incr(5, 99, 0)).counter(), 15);
    assert_eq!(call(&mut c, &get(GET, b"n", 4)).value, b"15");
    // decrement stops at 0
    assert_eq!(call(&mut c, &decr(100)).counter(), 0);
    // increment wraps at 2^64
    store(&mut c, b"n", b"18446744073709551615", 0);
    assert_eq!(call(&mut c, &incr(2, 0, 0)).counter(), 1);
    // a non-numeric value
    store(&mut c, b"n", b"abc", 0);
    assert_eq!(call(&mut c, &incr(1, 0, 0)).status, DELTA_BADVAL);
    assert_eq!(call(&mut c, &decr(1)).status, DELTA_BADVAL);
}

#[test]
fn touch_and_get_and_touch() {
    let s = server();
    let mut c = s.connect();
    let cas = store(&mut c, b"t", b"val", 6);
    let exptime = |e: u32| e.to_be_bytes().to_vec();
    // touch: flags as extras, no value
    let r = call(&mut c, &request(TOUCH, &exptime(3600), b"t", &[], 1, 0));
    assert_eq!(
        (r.status, r.flags(), r.value.len(), r.key.len()),
        (OK, 6, 0, 0)
    );
    assert_eq!(
        call(&mut c, &request(TOUCH, &exptime(10), b"nope", &[], 2, 0)).status,
        KEY_ENOENT
    );
    // gat / gatk return the item
    let r = call(&mut c, &request(GAT, &exptime(3600), b"t", &[], 3, 0));
    assert_eq!(
        (r.status, r.flags(), r.value.as_slice(), r.cas),
        (OK, 6, &b"val"[..], cas)
    );
    let r = call(&mut c, &request(GATK, &exptime(3600), b"t", &[], 4, 0));
    assert_eq!(
        (r.key.as_slice(), r.value.as_slice()),
        (&b"t"[..], &b"val"[..])
    );
    let r = call(&mut c, &request(GATK, &exptime(3600), b"nope", &[], 5, 0));
    assert_eq!((r.status, r.key.as_slice()), (KEY_ENOENT, &b"nope"[..]));
    // Touching with an absolute time in the past (over 30 days = unix time) answers
    // success, as memcached does, and expires the item.
    let past = 30 * 24 * 3600 + 1;
    let r = call(&mut c, &request(TOUCH, &exptime(past), b"t", &[], 6, 0));
    assert_eq!(r.status, OK);
    assert_eq!(call(&mut c, &get(GET, b"t", 7)).status, KEY_ENOENT);
    // A set with such an expiration stores nothing visible.
    let r = call(
        &mut c,
        &request(SET, &store_extras(0, past), b"gone", b"x", 8, 0),
    );
    assert_eq!(r.status, OK);
    assert_eq!(call(&mut c, &get(GET, b"gone", 9)).status, KEY_ENOENT);
}

#[test]
fn quiet_commands_answer_only_what_memcached_answers() {
    let s = server();
    let mut c = s.connect();
    store(&mut c, b"q1", b"one", 1);
    // One write: successes of quiet commands and misses of quiet gets are silent; hits
    // and errors answer, in order, and noop closes the batch.
    let ext = store_extras(0, 0);
    let mut batch = Vec::new();
    batch.extend(request(SETQ, &ext, b"q2", b"two", 100, 0)); // silent
    batch.extend(get(GETQ, b"missing", 101)); // silent
    batch.extend(get(GETKQ, b"q1", 102)); // hit: answers with key
    batch.extend(get(GETQ, b"q2", 103)); // hit
    batch.extend(request(ADDQ, &ext, b"q1", b"x", 104, 0)); // error: answers
    batch.extend(request(REPLACEQ, &ext, b"q2", b"TWO", 105, 0)); // silent
    batch.extend(request(APPENDQ, &[], b"q2", b"+", 106, 0)); // silent
    batch.extend(request(PREPENDQ, &[], b"q2", b"-", 107, 0)); // silent
    batch.extend(request(APPENDQ, &[], b"missing", b"+", 108, 0)); // error
    batch.extend(request(
        INCREMENTQ,
        &arith_extras(1, 7, 0),
        b"cnt",
        &[],
        109,
        0,
    )); // silent
    batch.extend(request(
        DECREMENTQ,
        &arith_extras(1, 0, 0),
        b"cnt",
        &[],
        110,
        0,
    )); // silent
    batch.extend(request(DELETEQ, &[], b"q1", &[], 111, 0)); // silent
    batch.extend(request(DELETEQ, &[], b"q1", &[], 112, 0)); // error: not found
    batch.extend(request(GATQ, &3600u32.to_be_bytes(), b"q2", &[], 113, 0)); // hit
    batch.extend(request(
        GATKQ,
        &3600u32.to_be_bytes(),
        b"missing",
        &[],
        114,
        0,
    )); // silent
    batch.extend(request(NOOP, &[], &[], &[], 115, 0));
    c.send(&batch);
    let mut got = Vec::new();
    loop {
        let r = recv(&mut c);
        let done = r.opcode == NOOP;
        got.push((r.opaque, r.status, r.key, r.value));
        if done {
            break;
        }
    }
    let expected: Vec<(u32, u16, Vec<u8>, Vec<u8>)> = vec![
        (102, OK, b"q1".to_vec(), b"one".to_vec()),
        (103, OK, vec![], b"two".to_vec()),
        (104, KEY_EEXISTS, vec![], b"Data exists for key.".to_vec()),
        (108, NOT_STORED, vec![], b"Not stored.".to_vec()),
        (112, KEY_ENOENT, vec![], b"Not found".to_vec()),
        (113, OK, vec![], b"-TWO+".to_vec()),
        (115, OK, vec![], vec![]),
    ];
    assert_eq!(got, expected);
    assert_eq!(call(&mut c, &get(GET, b"cnt", 1)).value, b"6");
    // flushq: silent, and everything is gone
    c.send(&request(FLUSHQ, &[], &[], &[], 2, 0));
    assert_eq!(call(&mut c, &request(NOOP, &[], &[], &[], 3, 0)).status, OK);
    assert_eq!(call(&mut c, &get(GET, b"q2", 4)).status, KEY_ENOENT);
}

#[test]
fn pipelined_requests_answer_in_order() {
    let s = server();
    let mut c = s.connect();
    let n = 200u32;
    let mut batch = Vec::new();
    for i in 0..n {
        let key = format!("p{i}");
        batch.extend(set(key.as_bytes(), key.as_bytes(), i, i, 0));
        batch.extend(get(GETK, key.as_bytes(), n + i));
    }
    c.send(&batch);
    for i in 0..n {
        let key = format!("p{i}");
        let r = recv(&mut c);
        assert_eq!((r.opcode, r.opaque, r.status), (SET, i, OK));
        let r = recv(&mut c);
        assert_eq!((r.opcode, r.opaque, r.flags()), (GETK, n + i, i));
        assert_eq!(
            (r.key.as_slice(), r.value.as_slice()),
            (key.as_bytes(), key.as_bytes())
        );
    }
}

#[test]
fn frames_split_across_reads_and_large_values() {
    let s = server();
    let mut c = s.connect();
    // A frame sent a few bytes at a time, each piece flushed on its own.
    let req = set(b"split", b"0123456789abcdef", 3, 42, 0);
    for piece in req.chunks(5) {
        c.send(piece);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(recv(&mut c).status, OK);
    // Values up to the item size limit, both ways, in one frame.
    for len in [100_000usize, 1_000_000] {
        let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        store(&mut c, b"big", &value, 0);
        let r = call(&mut c, &get(GET, b"big", 1));
        assert_eq!(r.value.len(), len);
        assert!(r.value == value, "large value round-trips byte for byte");
    }
}

#[test]
fn oversized_value_is_refused_swallowed_and_drops_the_old_one() {
    let s = server();
    let mut c = s.connect();
    store(&mut c, b"big", b"old", 0);
    let value = vec![b'x'; (1 << 20) + 1];
    let req = set(b"big", &value, 0, 77, 0);
    // Sent in pieces. cellcache refuses as soon as the header and key arrived (memcached
    // answers only once it swallowed the whole value).
    c.send(&req[..24 + 8 + 3]);
    if !is_memcached() {
        let r = recv(&mut c);
        assert_eq!((r.opcode, r.status, r.opaque), (SET, E2BIG, 77));
        assert_eq!(r.value, b"Too large.");
    }
    for piece in req[24 + 8 + 3..].chunks(100_000) {
        c.send(piece);
    }
    if is_memcached() {
        assert_eq!(recv(&mut c).status, E2BIG);
    }
    // The value was swallowed: the connection goes on.
    assert_eq!(call(&mut c, &request(NOOP, &[], &[], &[], 1, 0)).status, OK);
    // memcached drops the value a refused set meant to replace.
    assert_eq!(call(&mut c, &get(GET, b"big", 2)).status, KEY_ENOENT);
    // An oversized append keeps the old value.
    store(&mut c, b"big", b"old", 0);
    let r = call(&mut c, &request(APPEND, &[], b"big", &value, 3, 0));
    assert_eq!(r.status, E2BIG);
    assert_eq!(call(&mut c, &get(GET, b"big", 4)).value, b"old");
}

/// memcached counts the whole item against item_size_max (key + value + 59 bytes, + 4 with
/// flags): with a 250-byte key and flags, a value one byte over is refused as too large,
/// and one byte less is stored.
#[test]
fn the_whole_item_counts_against_the_size_limit() {
    let s = server();
    let mut c = s.connect();
    let key = vec![b'k'; 250];
    let fits = (1 << 20) - 59 - 4 - 250;
    let r = call(&mut c, &set(&key, &vec![b'x'; fits + 1], 7, 5, 0));
    assert_eq!(r.status, E2BIG, "one byte over");
    let r = call(&mut c, &set(&key, &vec![b'x'; fits], 7, 6, 0));
    assert_eq!(r.status, OK, "exactly at the limit");
}

#[test]
fn keyless_commands() {
    let s = server();
    let mut c = s.connect();
    // noop, version
    let r = call(&mut c, &request(NOOP, &[], &[], &[], 1, 0));
    assert_eq!((r.status, r.value.len(), r.cas), (OK, 0, 0));
    let r = call(&mut c, &request(VERSION, &[], &[], &[], 2, 0));
    assert_eq!(r.status, OK);
    let mut text = s.connect();
    text.send(b"version\r\n");
    assert_eq!(
        text.line(),
        format!("VERSION {}", String::from_utf8_lossy(&r.value))
    );
    // verbosity: cellcache accepts and ignores it; memcached 1.6 does not know the opcode
    // (and then swallows as many bytes again as the body had before it answers: its own
    // connection here, with 4 bytes for it to swallow).
    let mut v = s.connect();
    let mut req = request(VERBOSITY, &1u32.to_be_bytes(), &[], &[], 3, 0);
    if is_memcached() {
        req.extend_from_slice(&[0; 4]);
    }
    let r = call(&mut v, &req);
    assert_eq!(r.status, if is_memcached() { UNKNOWN_COMMAND } else { OK });
    // flush with a delay far ahead: nothing goes now
    store(&mut c, b"f", b"x", 0);
    let far = u32::MAX - 1;
    let r = call(&mut c, &request(FLUSH, &far.to_be_bytes(), &[], &[], 4, 0));
    assert_eq!(r.status, OK);
    assert_eq!(call(&mut c, &get(GET, b"f", 5)).status, OK);
    // flush now
    assert_eq!(
        call(&mut c, &request(FLUSH, &[], &[], &[], 6, 0)).status,
        OK
    );
    assert_eq!(call(&mut c, &get(GET, b"f", 7)).status, KEY_ENOENT);
}

/// Reads stat packets until the empty terminator: (name, value) pairs.
fn stats(c: &mut Client, group: &[u8], opaque: u32) -> Result<Vec<(String, String)>, u16> {
    c.send(&request(STAT, &[], group, &[], opaque, 0));
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let r = recv(c);
        assert_eq!((r.opcode, r.opaque), (STAT, opaque));
        if r.status != OK {
            return Err(r.status);
        }
        if r.key.is_empty() {
            return Ok(out);
        }
        out.push((
            String::from_utf8_lossy(&r.key).into_owned(),
            String::from_utf8_lossy(&r.value).into_owned(),
        ));
    }
    panic!("no stat terminator");
}

#[test]
fn stat_with_and_without_group() {
    let s = server();
    let mut c = s.connect();
    store(&mut c, b"s", b"x", 0);
    call(&mut c, &get(GET, b"s", 1));
    let general = stats(&mut c, b"", 9).expect("general stats");
    let find = |name: &str| {
        general
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert!(
        find("pid").is_some_and(|p| p.parse::<u32>().is_ok()),
        "{general:?}"
    );
    assert!(find("get_hits").is_some_and(|v| v.parse::<u64>().unwrap() >= 1));
    assert!(find("curr_items").is_some());
    let settings = stats(&mut c, b"settings", 10).expect("settings");
    assert!(
        settings.iter().any(|(k, _)| k == "maxbytes"),
        "{settings:?}"
    );
    assert_eq!(stats(&mut c, b"no-such-group", 11), Err(KEY_ENOENT));
    assert_eq!(stats(&mut c, b"reset", 12), Ok(vec![]));
    // memcached's t/binary.t: `detail on` and `detail off` answer an empty success.
    assert_eq!(stats(&mut c, b"detail on", 14), Ok(vec![]));
    assert_eq!(stats(&mut c, b"detail off", 15), Ok(vec![]));
    // The connection is still in step.
    assert_eq!(
        call(&mut c, &request(NOOP, &[], &[], &[], 13, 0)).status,
        OK
    );
}

#[test]
fn quit_answers_then_closes_and_quitq_closes_silently() {
    let s = server();
    let mut c = s.connect();
    let r = call(&mut c, &request(QUIT, &[], &[], &[], 5, 0));
    assert_eq!(r.status, OK);
    assert!(c.is_closed());
    let mut c = s.connect();
    c.send(&request(QUITQ, &[], &[], &[], 6, 0));
    assert!(c.is_closed(), "quitq closes without a reply");
}

#[test]
fn unknown_opcode_is_answered_and_skipped() {
    let s = server();
    let mut c = s.connect();
    let r = call(&mut c, &request(0x42, &[], &[], b"some body", 3, 0));
    assert_eq!(
        (r.status, r.value.as_slice()),
        (UNKNOWN_COMMAND, &b"Unknown command"[..])
    );
    // SASL is not served (memcached without SASL says the same).
    let r = call(&mut c, &request(0x20, &[], &[], &[], 4, 0));
    assert_eq!(r.status, UNKNOWN_COMMAND);
    assert_eq!(call(&mut c, &request(NOOP, &[], &[], &[], 5, 0)).status, OK);
}

#[test]
fn malformed_headers_close_the_connection() {
    let s = server();
    // Lengths the opcode does not take (a get with extras): "invalid arguments", closed.
    let mut c = s.connect();
    let r = call(&mut c, &request(GET, &[0, 0, 0, 0], b"k", &[], 1, 0));
    assert_eq!(r.status, EINVAL);
    assert!(c.is_closed());
    // A get without a key.
    let mut c = s.connect();
    assert_eq!(call(&mut c, &get(GET, b"", 2)).status, EINVAL);
    assert!(c.is_closed());
    // Key and extras longer than the body: "unknown command", closed.
    let mut c = s.connect();
    let mut bad = request(SET, &store_extras(0, 0), b"key", b"", 3, 0);
    bad[8..12].copy_from_slice(&4u32.to_be_bytes());
    c.send(&bad);
    let r = recv(&mut c);
    assert_eq!((r.status, r.opaque), (UNKNOWN_COMMAND, 3));
    assert!(c.is_closed());
    // A key longer than 250 bytes.
    let mut c = s.connect();
    assert_eq!(call(&mut c, &get(GET, &[b'k'; 251], 4)).status, EINVAL);
    assert!(c.is_closed());
}

#[test]
fn bad_magic_after_binary_frames_closes_without_reply() {
    let s = server();
    let mut c = s.connect();
    // Replies already due are delivered, then the connection closes on the bad byte
    // (memcached looks at it once a whole header's worth arrived).
    let mut batch = request(NOOP, &[], &[], &[], 1, 0);
    batch.extend_from_slice(b"get foo\r\nget bar\r\nget baz\r\n");
    c.send(&batch);
    assert_eq!(recv(&mut c).status, OK);
    assert!(c.is_closed());
    // The server carries on for other connections.
    let mut t = s.connect();
    t.send(b"version\r\n");
    assert!(t.line().starts_with("VERSION "));
}
