//! `stats` through any cell of a ring of three real processes answers for the whole ring, as
//! one memcached would: each item counted once (backup copies left out), counters summed
//! over the cells that executed the requests, the ring's memory limit; `stats cell` and
//! `stats cells` keep the per-cell figures, and `stats reset` resets every cell.

mod common;

use common::{Client, Ring};

const KEYS: usize = 120;

fn stat(c: &mut Client, group: &str, name: &str) -> Option<u64> {
    c.stats(group)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.parse().unwrap())
}

#[test]
fn stats_through_any_cell_describe_the_whole_ring() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let mut writer = ring.cells[1].connect();
    for i in 0..KEYS {
        writer.roundtrip(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes(), b"STORED\r\n");
    }
    for i in 0..KEYS / 2 {
        writer.send(format!("get k{i} nokey{i}\r\n").as_bytes());
        assert_eq!(writer.lines_until_end().len(), 2);
    }

    // Every cell answers the same ring-wide figures.
    for i in 0..3 {
        let mut c = ring.cells[i].connect();
        let s = c.stats("");
        let get = |n: &str| -> u64 {
            s.iter()
                .find(|(k, _)| k == n)
                .unwrap_or_else(|| panic!("no {n} in {s:?}"))
                .1
                .parse()
                .unwrap()
        };
        assert_eq!(get("curr_items"), KEYS as u64, "cell {i}: each item once");
        assert_eq!(get("cmd_set"), KEYS as u64, "cell {i}");
        assert_eq!(get("get_hits"), KEYS as u64 / 2, "cell {i}");
        assert_eq!(get("get_misses"), KEYS as u64 / 2, "cell {i}");
        assert_eq!(get("limit_maxbytes"), 3 * 32 * 1024 * 1024 / 2, "cell {i}");
        assert_eq!(
            get("total_items"),
            KEYS as u64,
            "cell {i}: a backup's copy is not stored by a client"
        );
        assert!(get("bytes") > 0);
        // memcached's fields only, as many as one memcached gives (its t/stats.t counts
        // them); cellcache's own, the ring's among them, are in `stats cellcache`.
        assert_eq!(s.len(), 83, "cell {i}: {s:?}");
        assert_eq!(stat(&mut c, "cellcache", "cluster_cells"), Some(3));
        assert_eq!(
            stat(&mut c, "cellcache", "cluster_cells_unreachable"),
            Some(0)
        );
        assert_eq!(stat(&mut c, "", "cluster_cells"), None);
        // The cells' own counters are summed too: cell 1 forwarded the keys it does not
        // master (a cell's `stats cell` carries them to the entry cell).
        assert!(stat(&mut c, "cellcache", "cluster_forwarded").unwrap() > 0);

        // The cell's own figures: master and backup copies it holds.
        let own = stat(&mut c, "cell", "curr_items").unwrap();
        assert_eq!(own, ring.ranges(i).1, "cell {i}: stats cell is its store");
    }
    let own_total: u64 = (0..3).map(|i| ring.ranges(i).1).sum();
    assert_eq!(own_total, 2 * KEYS as u64, "two copies of every item");

    // `stats cells`: every cell's own figures, prefixed with its id.
    let cells = ring.cells[0].connect().stats("cells");
    for i in 0..3 {
        let name = format!("{}:curr_items", ring.id(i));
        let v = cells.iter().find(|(k, _)| *k == name);
        assert_eq!(
            v.map(|(_, v)| v.parse::<u64>().unwrap()),
            Some(ring.ranges(i).1),
            "{name} in {cells:?}"
        );
    }

    // `stats items`: the ring's slabs, every copy held.
    let items: u64 = ring.cells[2]
        .connect()
        .stats("items")
        .iter()
        .filter(|(k, _)| k.ends_with(":number"))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum();
    assert_eq!(items, 2 * KEYS as u64, "stats items counts the copies held");
    assert!(!ring.cells[0].connect().stats("slabs").is_empty());

    // `stats reset` through one cell resets every cell's counters.
    ring.cells[2]
        .connect()
        .roundtrip(b"stats reset\r\n", b"RESET\r\n");
    for i in 0..3 {
        let mut c = ring.cells[i].connect();
        assert_eq!(stat(&mut c, "", "cmd_set"), Some(0), "cell {i}");
        assert_eq!(stat(&mut c, "", "curr_items"), Some(KEYS as u64));
    }
}
