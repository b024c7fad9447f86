//! Rings of real `cellcache serve` processes for the tests: start, watch form, and the
//! admin-plane views (status, ranges) and commands (invite, leave) the tests use.

use super::*;

/// A ring of real `cellcache serve` processes on loopback (cluster tests).
pub struct Ring {
    pub cells: Vec<Server>,
}

/// The range on the `CELL` line of `status` that contains `marker`.
fn range_in(status: &[String], marker: &str) -> Option<cellcache_cluster::HashRange> {
    let line = status
        .iter()
        .find(|l| l.starts_with("CELL ") && l.contains(marker))?;
    let (a, b) = line
        .split(' ')
        .find_map(|w| w.strip_prefix("range="))?
        .split_once('-')?;
    let bound = |h: &str| u64::from_str_radix(h, 16).expect("a hex range bound");
    Some(cellcache_cluster::HashRange::new(bound(a), bound(b)))
}

/// A free loopback port for a peer listener.
pub fn free_peer_port() -> u16 {
    free_port()
}

impl Ring {
    /// Starts `n` cells: the first bootstraps, each next one joins through the first and
    /// the call waits until every cell is Active in every cell's map.
    pub fn start(n: usize, extra: &[&str]) -> Ring {
        Self::start_with_env(n, extra, &[])
    }

    /// [`Ring::start`] with environment variables (configuration) for every cell.
    pub fn start_with_env(n: usize, extra: &[&str], env: &[(&str, &str)]) -> Ring {
        let mut cells: Vec<Server> = Vec::new();
        let mut first_peer = String::new();
        for i in 0..n {
            let peer = free_peer_port().to_string();
            let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            args.extend(["--peer-port".to_string(), peer.clone()]);
            if i > 0 {
                args.extend(["--join".to_string(), format!("127.0.0.1:{first_peer}")]);
            } else {
                first_peer = peer;
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cells.push(Server::start_one(&args, env));
            let ring = Ring { cells };
            ring.wait_formed(i + 1);
            cells = ring.into_cells();
        }
        Ring { cells }
    }

    /// Starts a `serve --standby` cell (not in the ring yet) and returns its index.
    pub fn add_standby(&mut self, extra: &[&str]) -> usize {
        self.add_standby_with_env(extra, &[])
    }

    /// [`Ring::add_standby`] with environment variables (configuration).
    pub fn add_standby_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> usize {
        let peer = free_peer_port().to_string();
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["--standby", "--peer-port", &peer]);
        self.cells.push(Server::start_with_env(&args, env));
        self.cells.len() - 1
    }

    /// The peer port of cell `i`, from its `CELL` line in cell 0's status (for a restart on
    /// the same ports).
    pub fn peer_port(&self, i: usize) -> String {
        let status = self.status(0);
        let me = status
            .iter()
            .find(|l| {
                l.starts_with("CELL ") && l.contains(&format!("client={} ", self.cells[i].addr))
            })
            .expect("the cell in the map");
        me.split(' ')
            .find_map(|w| w.strip_prefix("peer="))
            .and_then(|a| a.rsplit_once(':'))
            .map(|(_, p)| p.to_string())
            .expect("peer address")
    }

    /// The id cell `i` has in the ring (`SELF` of its status).
    pub fn id(&self, i: usize) -> String {
        let status = self.status(i);
        status[0].split(' ').nth(7).unwrap().to_string()
    }

    /// The peer address of cell `i`, from its own status (`peer=` of its `SELF` line).
    pub fn peer(&self, i: usize) -> String {
        let status = self.status(i);
        let me = status[0].split(' ').nth(7).expect("SELF id").to_string();
        status
            .iter()
            .find(|l| l.starts_with("CELL ") && l.split(' ').nth(1) == Some(me.as_str()))
            .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("peer=")))
            .expect("a peer address")
            .to_string()
    }

    /// Brings standby cell `standby` into the ring through cell `via` as a division of
    /// `parent` (`ctl split`); returns the standby's one-line reply.
    pub fn invite(&self, standby: usize, via: usize, parent: &str) -> String {
        let path = format!("/cluster/invite?via={}&parent={parent}", self.peer(via));
        let (_, body) = self.cells[standby].admin_call("POST", &path);
        body.trim_end().to_string()
    }

    /// Asks cell `i` to start `cell`'s absorption (`ctl leave`); its one-line reply.
    pub fn leave(&self, i: usize, cell: &str) -> String {
        let (_, body) = self.cells[i].admin_call("POST", &format!("/cluster/leave/{cell}"));
        body.trim_end().to_string()
    }

    /// Two cells whose map outlives the death of either one for a while (leases and the
    /// suspicion timeout long: with one of two voters dead the map can no longer be
    /// confirmed), `-m 32`, and `cluster.no_backup` = `no_backup`: a write with its backup
    /// dead is refused or accepted by that policy alone.
    pub fn two_cells_for_a_dead_backup(no_backup: &str) -> Ring {
        let env = [
            ("CELLCACHE_CLUSTER__NO_BACKUP", no_backup),
            ("CELLCACHE_CLUSTER__RING__LEASE_MS", "20000"),
            ("CELLCACHE_CLUSTER__RING__SUSPICION_TIMEOUT_MS", "60000"),
            ("CELLCACHE_CLUSTER__RING__MAP_LEASE_MS", "20000"),
        ];
        Ring::start_with_env(2, &["-m", "32"], &env)
    }

    /// The first of `prefix0`, `prefix1`, … whose master is cell `cell`.
    pub fn key_mastered_by(&self, cell: usize, prefix: &str) -> String {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|k| self.master_of(k) == cell)
            .expect("some key of an endless sequence lands in every range")
    }

    /// Index of the cell whose range holds `key`'s hash (from cell 0's status).
    pub fn master_of(&self, key: &str) -> usize {
        let h = cellcache_cluster::key_hash(key.as_bytes());
        let status = self.status(0);
        for (i, s) in self.cells.iter().enumerate() {
            if range_in(&status, &format!("client={} ", s.addr)).is_some_and(|r| r.contains(h)) {
                return i;
            }
        }
        panic!("no master for {key}: {status:?}");
    }

    /// The range of the cell whose `CELL` line (in cell 0's status) contains `marker`, e.g.
    /// `client=HOST:PORT `.
    pub fn range_of(&self, marker: &str) -> Option<cellcache_cluster::HashRange> {
        range_in(&self.status(0), marker)
    }

    fn into_cells(self) -> Vec<Server> {
        self.cells
    }

    /// Asserts that no running cell ran a client's write after the map had moved its key
    /// away (`cluster_stray_writes`: the map gate rules it out; such a write is answered
    /// with the retryable error and not replicated).
    pub fn assert_no_stray_writes(&mut self) {
        for (i, cell) in self.cells.iter_mut().enumerate() {
            if cell.is_running() {
                let stray = cell.connect().stat("cluster_stray_writes");
                assert_eq!(stray, "0", "cell {i} ran writes outside its master range");
            }
        }
    }

    /// The ring's status through cell `i`'s admin plane, without the END line.
    pub fn status(&self, i: usize) -> Vec<String> {
        self.cells[i].admin_lines("/cluster/status")
    }

    /// Waits until every cell reports `n` Active cells at one epoch.
    pub fn wait_formed(&self, n: usize) {
        let all: Vec<usize> = (0..self.cells.len()).collect();
        self.wait_formed_among(n, &all);
    }

    /// Waits until cells `among` report `n` Active cells (and nothing else) at one epoch.
    pub fn wait_formed_among(&self, n: usize, among: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let views: Vec<Vec<String>> = among.iter().map(|&i| self.status(i)).collect();
            let epoch = |v: &Vec<String>| v[0].split(' ').nth(1).map(str::to_string);
            let ok = views.iter().all(|v| {
                v.iter()
                    .filter(|l| l.starts_with("CELL") && l.contains(" active "))
                    .count()
                    == n
                    && v.iter().filter(|l| l.starts_with("CELL")).count() == n
                    && epoch(v) == epoch(&views[0])
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ring of {n} did not form: {views:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The ranges cell `i` holds (`/cluster/ranges`): (role, owner id, count) per line, and
    /// the TOTAL.
    pub fn ranges(&self, i: usize) -> (Vec<(String, String, u64)>, u64) {
        let mut rows = Vec::new();
        let mut total = 0;
        for l in self.cells[i].admin_lines("/cluster/ranges") {
            let w: Vec<&str> = l.split(' ').collect();
            match w[0] {
                "RANGE" => rows.push((w[1].to_string(), w[2].to_string(), w[4].parse().unwrap())),
                "TOTAL" => total = w[1].parse().unwrap(),
                other => panic!("unexpected ranges line {other}"),
            }
        }
        (rows, total)
    }
}
