//! A pipeline through a ring cell is answered in order per key, as one memcached answers
//! it, also while the ring is still settling (a master's lease or map confirmation pending):
//! a `get` pipelined after a `set` of the same key sees that `set`.

mod common;

use common::Ring;

const KEYS: usize = 200;
const ROUNDS: usize = 3;

#[test]
fn a_pipeline_sent_as_the_ring_forms_reads_its_own_writes() {
    if common::is_memcached() {
        return;
    }
    for round in 0..ROUNDS {
        let ring = Ring::start(3, &["-m", "16"]);
        // Right after forming: leases and confirmations of the new layout are still pending,
        // so some requests wait to be routed again.
        let mut c = ring.cells[1].connect();
        let mut batch = Vec::new();
        for i in 0..KEYS {
            batch.extend_from_slice(format!("set k{i} 0 0 2\r\nv{}\r\n", i % 10).as_bytes());
            batch.extend_from_slice(format!("get k{i}\r\n").as_bytes());
        }
        c.send(&batch);
        for i in 0..KEYS {
            assert_eq!(c.line(), "STORED", "round {round}, set k{i}");
            let lines = c.lines_until_end();
            assert_eq!(
                lines,
                [format!("VALUE k{i} 0 2"), format!("v{}", i % 10)],
                "round {round}: get k{i} pipelined after its set"
            );
        }
    }
}

/// `flush_all` keeps its place among the requests around it: unacknowledged (`noreply`)
/// writes before it are flushed even while they wait to be routed, writes after it survive.
#[test]
fn a_flush_all_pipelined_between_writes_keeps_its_place() {
    if common::is_memcached() {
        return;
    }
    for round in 0..ROUNDS {
        let ring = Ring::start(3, &["-m", "16"]);
        let mut c = ring.cells[1].connect();
        let mut batch = Vec::new();
        for i in 0..KEYS {
            batch.extend_from_slice(format!("set old{i} 0 0 1 noreply\r\nx\r\n").as_bytes());
        }
        batch.extend_from_slice(b"flush_all\r\n");
        for i in 0..KEYS {
            batch.extend_from_slice(format!("set new{i} 0 0 1 noreply\r\ny\r\n").as_bytes());
        }
        c.send(&batch);
        assert_eq!(c.line(), "OK", "round {round}");
        for i in 0..KEYS {
            c.send(format!("get old{i} new{i}\r\n").as_bytes());
            assert_eq!(
                c.lines_until_end(),
                [format!("VALUE new{i} 0 1"), "y".to_string()],
                "round {round}: old{i} flushed, new{i} kept"
            );
        }
    }
}
