//! The binary protocol against one cell of a three-cell ring: keys mastered on the other
//! cells are forwarded and answered in binary, in order, with the master's CAS; writes are
//! replicated; flush reaches every cell. The binary session runs each frame through the
//! same routing as a text request, so this checks the re-encoding of forwarded replies.

mod binary_wire;
mod common;

use binary_wire::*;
use common::{Client, Ring};

const KEYS: usize = 60;

fn key(i: usize) -> String {
    format!("bkey{i}")
}

/// A cell's own copy of `key` (never forwarded), if it holds one.
fn peek(c: &mut Client, key: &str) -> Option<String> {
    match c.peek_lines(key).as_slice() {
        [] => None,
        [_header, v] => Some(v.clone()),
        other => panic!("unexpected peek reply {other:?}"),
    }
}

#[test]
fn one_cell_serves_every_key_of_the_ring_in_binary() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let masters: Vec<usize> = (0..KEYS).map(|i| ring.master_of(&key(i))).collect();
    for cell in 0..3 {
        assert!(
            masters.contains(&cell),
            "some key is mastered on cell {cell}: {masters:?}"
        );
    }
    let mut c = ring.cells[0].connect();

    // Pipelined sets and gets through cell 0, local and forwarded mixed: in order, each
    // with its opaque, the get's CAS the one its set returned.
    let mut batch = Vec::new();
    for i in 0..KEYS {
        let k = key(i);
        batch.extend(set(
            k.as_bytes(),
            format!("v{i}").as_bytes(),
            i as u32,
            i as u32,
            0,
        ));
        batch.extend(get(GETK, k.as_bytes(), 1000 + i as u32));
    }
    c.send(&batch);
    for i in 0..KEYS {
        let s = recv(&mut c);
        assert_eq!(
            (s.opcode, s.status, s.opaque),
            (SET, OK, i as u32),
            "key {i}"
        );
        let g = recv(&mut c);
        assert_eq!((g.opcode, g.status, g.opaque), (GETK, OK, 1000 + i as u32));
        assert_eq!(g.key, key(i).as_bytes());
        assert_eq!(g.value, format!("v{i}").as_bytes());
        assert_eq!(g.flags(), i as u32);
        assert_eq!(g.cas, s.cas, "key {i}: the master's CAS both times");
    }

    // Each write is on its master and its backup: two cells hold it.
    let mut peekers: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    for i in 0..KEYS {
        let mut holders = 0;
        for p in peekers.iter_mut() {
            holders += usize::from(true_copy(p, &key(i), &format!("v{i}")));
        }
        assert_eq!(holders, 2, "key {i} replicated once");
    }

    // A key mastered elsewhere: every command family, answered by its master.
    let remote = (0..KEYS).find(|&i| masters[i] != 0).unwrap();
    let rk = key(remote);
    let rk = rk.as_bytes();
    let r = call(&mut c, &get(GET, rk, 1));
    let cas = r.cas;
    assert_eq!(
        call(&mut c, &set(rk, b"x", 0, 2, cas + 1000)).status,
        KEY_EEXISTS
    );
    let r = call(&mut c, &set(rk, b"10", 0, 3, cas));
    assert_eq!(r.status, OK);
    let r = call(
        &mut c,
        &request(INCREMENT, &arith_extras(5, 0, 0xffff_ffff), rk, &[], 4, 0),
    );
    assert_eq!((r.status, r.counter()), (OK, 15));
    let r = call(
        &mut c,
        &request(DECREMENT, &arith_extras(20, 0, 0xffff_ffff), rk, &[], 5, 0),
    );
    assert_eq!(r.counter(), 0);
    assert_eq!(
        call(&mut c, &request(APPEND, &[], rk, b"!", 6, 0)).status,
        OK
    );
    assert_eq!(
        call(&mut c, &request(ADD, &store_extras(0, 0), rk, b"y", 7, 0)).status,
        KEY_EEXISTS
    );
    let r = call(
        &mut c,
        &request(TOUCH, &3600u32.to_be_bytes(), rk, &[], 8, 0),
    );
    assert_eq!(r.status, OK);
    let r = call(&mut c, &request(GAT, &3600u32.to_be_bytes(), rk, &[], 9, 0));
    // memcached keeps a shrunken counter's length, padding with spaces.
    assert_eq!(r.value, b"0 !");
    assert_eq!(call(&mut c, &get(DELETE, rk, 10)).status, OK);
    assert_eq!(call(&mut c, &get(GET, rk, 11)).status, KEY_ENOENT);
    // A counter created on its master by a forwarded increment.
    let nk = key(KEYS + 1000);
    let r = call(
        &mut c,
        &request(
            INCREMENT,
            &arith_extras(1, 41, 0),
            nk.as_bytes(),
            &[],
            12,
            0,
        ),
    );
    assert_eq!((r.status, r.counter()), (OK, 41));

    // Quiet commands for keys of every master, closed by a noop: only hits and errors.
    let mut batch = Vec::new();
    for i in 0..KEYS {
        batch.extend(request(
            SETQ,
            &store_extras(0, 0),
            key(i).as_bytes(),
            b"q",
            0,
            0,
        ));
    }
    for i in 0..KEYS {
        batch.extend(get(GETKQ, key(i).as_bytes(), i as u32));
        batch.extend(get(
            GETKQ,
            format!("missing{i}").as_bytes(),
            5000 + i as u32,
        ));
    }
    batch.extend(request(NOOP, &[], &[], &[], 9999, 0));
    c.send(&batch);
    for i in 0..KEYS {
        let r = recv(&mut c);
        assert_eq!((r.opcode, r.status, r.opaque), (GETKQ, OK, i as u32));
        assert_eq!(
            (r.key.as_slice(), r.value.as_slice()),
            (key(i).as_bytes(), &b"q"[..])
        );
    }
    assert_eq!(recv(&mut c).opaque, 9999);

    // A key of bytes the text protocol forbids routes by its own bytes, through any cell.
    let odd = b"odd key\t\x01";
    assert_eq!(call(&mut c, &set(odd, b"odd", 3, 1, 0)).status, OK);
    for cell in &ring.cells {
        let mut other = cell.connect();
        let r = call(&mut other, &get(GETK, odd, 2));
        assert_eq!(
            (r.status, r.key.as_slice(), r.value.as_slice()),
            (OK, &odd[..], &b"odd"[..])
        );
    }

    // Stats come from the cell asked.
    c.send(&request(STAT, &[], &[], &[], 77, 0));
    let mut stats = 0;
    loop {
        let r = recv(&mut c);
        assert_eq!((r.status, r.opaque), (OK, 77));
        if r.key.is_empty() {
            break;
        }
        stats += 1;
        assert!(stats < 10_000);
    }
    assert!(stats > 10);

    // Flush reaches every cell.
    assert_eq!(
        call(&mut c, &request(FLUSH, &[], &[], &[], 1, 0)).status,
        OK
    );
    for i in 0..KEYS {
        assert_eq!(
            call(&mut c, &get(GET, key(i).as_bytes(), 2)).status,
            KEY_ENOENT,
            "key {i}"
        );
    }
}

/// Whether cell `p` holds its own copy of `key` with `value`.
fn true_copy(p: &mut Client, key: &str, value: &str) -> bool {
    peek(p, key).is_some_and(|v| v == value)
}
