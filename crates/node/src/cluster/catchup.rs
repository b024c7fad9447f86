//! Catching up with the ring's map through its peers, only as far as consensus backs it.
//!
//! A cell's map changes when its consensus replica applies a committed entry (the ring driver
//! installs `RaftGroup::current_map`), when the group's leader answers one of this cell's own
//! proposals with the map that committed it, and once at start, from the answer of the cell
//! it joined through. Peers also tell a cell that a newer map may exist: a frame stamped with
//! a newer epoch (a heartbeat, a forwarded request, a replication batch or its refusal), an
//! unsolicited `MapUpdate`, or the group not confirming the cell's map. None of these is
//! installed: any member — anyone holding the ring's secret — can send any map, and one
//! numbered a thousand epochs ahead would stop the cell for good (no later committed map
//! would ever be newer). Each starts a catch-up instead: the cell asks every consensus
//! voter of its own map for its map ([`Membership::from_map`]) and installs a newer one only
//! once a majority of those voters answered with that very map. An honest cell holds only
//! committed maps, so a map a majority reports was committed, whatever a minority of
//! dishonest members answer, and a map reported by fewer is not installed.
//!
//! This is what a removed cell needs: the group stopped sending it the log, so the voters
//! telling it the map that removed it is how it learns to stop serving. A cell that is
//! merely behind gets the entries through the log too; a catch-up only gets there sooner.
//!
//! At most one catch-up runs at a time and at most one starts per heartbeat interval,
//! whatever the number of hints: a flood of forged frames costs each voter one `MapRequest`
//! per interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT;
use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{CellId, ClusterMap, Membership};

use super::Cluster;

impl Cluster {
    /// A peer says a newer map may exist: starts a catch-up (see the module docs) unless one
    /// runs or started within the last heartbeat interval.
    pub fn catch_up(self: &Arc<Self>) {
        let now = self.now_ms();
        let spacing = self.config.ring.heartbeat_interval_ms.max(1);
        let last = self.catch_up_at.load(Ordering::Acquire);
        if last != 0 && now < last.saturating_add(spacing) {
            return;
        }
        if self.catching_up.swap(true, Ordering::AcqRel) {
            return;
        }
        self.catch_up_at.store(now, Ordering::Release);
        let cl = self.clone();
        self.handle.spawn(async move {
            cl.catch_up_round().await;
            cl.catching_up.store(false, Ordering::Release);
        });
    }

    /// Asks the voters of this cell's map for theirs, each within `request_timeout_ms`, and
    /// installs the newest map a majority of them reported, as soon as one is.
    async fn catch_up_round(self: &Arc<Self>) {
        let (epoch, voters) = {
            let ring = self.lock_ring();
            let map = ring.map();
            let voters = Membership::from_map(map, self.config.voters_max).voters;
            (map.epoch(), voters)
        };
        let quorum = voters.len() / 2 + 1;
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        let mut asks = tokio::task::JoinSet::new();
        for voter in voters.into_iter().filter(|v| *v != self.me) {
            let Some(link) = self.link(&voter) else {
                continue;
            };
            asks.spawn(async move {
                let call = link.call(FrameKind::MapRequest, Vec::new());
                match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(f)) if f.kind == FrameKind::MapUpdate => Some((voter, f.payload)),
                    _ => None,
                }
            });
        }
        let mut tally = Tally::default();
        while let Some(answer) = asks.join_next().await {
            let Ok(Some((voter, bytes))) = answer else {
                continue;
            };
            tally.add(voter, bytes);
            if let Some(map) = tally.backed(quorum, epoch, self.ring_id) {
                tracing::info!(
                    epoch = map.epoch(),
                    quorum,
                    "a majority of the voters reported a newer map"
                );
                self.install_map(map);
                return;
            }
        }
    }
}

/// The maps voters reported in one catch-up, by their exact encoding.
#[derive(Default)]
struct Tally {
    reports: Vec<(Vec<u8>, Vec<CellId>)>,
}

impl Tally {
    /// `voter` reported the map encoded as `bytes` (a voter counts once).
    fn add(&mut self, voter: CellId, bytes: Vec<u8>) {
        if self.reports.iter().any(|(_, by)| by.contains(&voter)) {
            return;
        }
        match self.reports.iter_mut().find(|(b, _)| *b == bytes) {
            Some((_, by)) => by.push(voter),
            None => self.reports.push((bytes, vec![voter])),
        }
    }

    /// The newest map of ring `ring` newer than `epoch` that at least `quorum` voters
    /// reported.
    fn backed(&self, quorum: usize, epoch: u64, ring: u64) -> Option<ClusterMap> {
        self.reports
            .iter()
            .filter(|(_, by)| by.len() >= quorum)
            .filter_map(|(bytes, _)| ClusterMap::decode(bytes, MAP_BYTES_MAX_DEFAULT).ok())
            .filter(|m| m.epoch() > epoch && m.ring() == ring)
            .max_by_key(ClusterMap::epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellcache_cluster::{CellAddress, Change, Proposal};

    fn addr(n: u32) -> CellAddress {
        CellAddress {
            client: format!("127.0.0.1:{}", 21000 + n),
            peer: format!("127.0.0.1:{}", 31000 + n),
        }
    }

    /// A ring's first map and the one after a division, as the group commits them.
    fn maps() -> (ClusterMap, ClusterMap) {
        let first = ClusterMap::bootstrap_ring(CellId::whole(1), addr(0), 2, 7).unwrap();
        let division = Proposal {
            based_on_epoch: first.epoch(),
            change: Change::BeginDivision {
                parent: CellId::whole(1),
                child_address: addr(1),
            },
        };
        let next = cellcache_cluster::change::apply(&first, &division).unwrap();
        (first, next)
    }

    fn voter(n: u64) -> CellId {
        CellId::whole(n)
    }

    #[test]
    fn a_map_needs_a_majority_of_identical_reports() {
        let (first, next) = maps();
        let mut t = Tally::default();
        t.add(voter(2), next.encode());
        assert!(
            t.backed(2, first.epoch(), 7).is_none(),
            "one voter of three"
        );
        // The same voter again does not count twice.
        t.add(voter(2), next.encode());
        assert!(t.backed(2, first.epoch(), 7).is_none());
        t.add(voter(3), next.encode());
        assert_eq!(t.backed(2, first.epoch(), 7), Some(next.clone()));
        // Not newer than what the cell has, or of another ring: nothing to install.
        assert!(t.backed(2, next.epoch(), 7).is_none());
        assert!(t.backed(2, first.epoch(), 8).is_none());
    }

    #[test]
    fn a_forged_map_reported_by_a_minority_is_not_installed() {
        let (first, next) = maps();
        let forged = String::from_utf8(next.encode())
            .unwrap()
            .replace(&format!("\"epoch\":{}", next.epoch()), "\"epoch\":1002");
        let mut t = Tally::default();
        t.add(voter(2), forged.into_bytes());
        t.add(voter(3), first.encode());
        t.add(voter(4), first.encode());
        assert!(t.backed(2, first.epoch(), 7).is_none());
    }
}
