//! The ring's recent events: what each committed map changed, said once per change — one
//! structured log line with its reason (`ring event`), and kept (the last
//! `cluster.events_kept`) for `GET /events` on the admin plane. An event is read off the
//! difference between the map a cell had and the one it installs, so every cell reports the
//! same events for the same epochs.

use std::collections::VecDeque;

use cellcache_cluster::{AbsorptionReason, CellState, ClusterMap, HashRange, Migration};
use serde::Serialize;

/// One change of the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// The map epoch that made it.
    pub epoch: u64,
    /// Seconds since the Unix epoch when this cell installed that map.
    pub at: u64,
    /// `division_started`, `division_finished`, `division_abandoned`,
    /// `absorption_started`, `absorption_finished`, `shift_started`, `shift_finished`,
    /// `shift_abandoned`.
    pub kind: &'static str,
    /// The cell the event is about: the new cell of a division, the departed one of an
    /// absorption, the one taking the range of a shift.
    pub cell: String,
    /// The other cell: the dividing parent, the absorbing successor, or the shift's giver.
    pub other: String,
    /// The range that moves (`[start, end]`, hex).
    pub range: [String; 2],
    /// Why: `scale-out` for a division; `left` (asked to) or `crashed` (evicted by
    /// consensus after a confirmed suspicion) for an absorption; `balance` for a shift (a
    /// boundary between neighbours moved); the policy's reason for an
    /// autoscale decision (`autoscale_divide`, `autoscale_absorb`, `autoscale_failed`, on
    /// the deciding cell only, with no range).
    pub reason: String,
}

fn hex(r: &HashRange) -> [String; 2] {
    [format!("{:016x}", r.start), format!("{:016x}", r.end)]
}

/// The events that turn `old` into `new` (maps of one ring, `new` later).
pub fn diff(old: &ClusterMap, new: &ClusterMap, at: u64) -> Vec<Event> {
    let mut out = Vec::new();
    let event = |kind, m: &Migration| match m {
        Migration::Division {
            parent,
            child,
            range,
            ..
        } => Event {
            epoch: new.epoch(),
            at,
            kind,
            cell: child.to_string(),
            other: parent.to_string(),
            range: hex(range),
            reason: "scale-out".into(),
        },
        Migration::Absorption {
            departed,
            reason,
            successor,
            range,
            ..
        } => Event {
            epoch: new.epoch(),
            at,
            kind,
            cell: departed.to_string(),
            other: successor.to_string(),
            range: hex(range),
            reason: match reason {
                AbsorptionReason::Leaving => "left",
                AbsorptionReason::Crashed => "crashed",
            }
            .into(),
        },
        Migration::Shift {
            from, to, range, ..
        } => Event {
            epoch: new.epoch(),
            at,
            kind,
            cell: to.to_string(),
            other: from.to_string(),
            range: hex(range),
            reason: "balance".into(),
        },
    };
    for m in new.migrations() {
        if !old.migrations().contains(m) {
            let kind = match m {
                Migration::Division { .. } => "division_started",
                Migration::Absorption { .. } => "absorption_started",
                Migration::Shift { .. } => "shift_started",
            };
            out.push(event(kind, m));
        }
    }
    for m in old.migrations() {
        if new.migrations().contains(m) {
            continue;
        }
        // A division finishes with its child Active; one whose child is gone was undone.
        let kind = match m {
            Migration::Division { child, .. } => match new.cell(child).map(|c| c.state) {
                Some(CellState::Active) => "division_finished",
                _ => "division_abandoned",
            },
            Migration::Absorption { .. } => "absorption_finished",
            // A shift finishes with the receiver mastering the range.
            Migration::Shift { to, range, .. } => {
                match new
                    .cell(to)
                    .and_then(|c| c.range)
                    .filter(|r| r.covers(range))
                {
                    Some(_) => "shift_finished",
                    None => "shift_abandoned",
                }
            }
        };
        out.push(event(kind, m));
    }
    out
}

/// The last events, oldest first, at most `kept`.
#[derive(Debug)]
pub struct Recent {
    kept: usize,
    events: VecDeque<Event>,
}

impl Recent {
    pub fn new(kept: usize) -> Self {
        Recent {
            kept,
            events: VecDeque::new(),
        }
    }

    pub fn push(&mut self, e: Event) {
        if self.kept == 0 {
            return;
        }
        while self.events.len() >= self.kept {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    pub fn list(&self) -> Vec<Event> {
        self.events.iter().cloned().collect()
    }
}

impl super::Cluster {
    /// Logs `e` as one `ring event` line and keeps it.
    pub(super) fn note_event(&self, e: Event) {
        tracing::info!(
            epoch = e.epoch,
            kind = e.kind,
            cell = %e.cell,
            other = %e.other,
            range = %format_args!("{}-{}", e.range[0], e.range[1]),
            reason = %e.reason,
            "ring event"
        );
        self.events.lock().push(e);
    }

    /// The ring's recent events, oldest first (`GET /events`).
    pub fn recent_events(&self) -> Vec<Event> {
        self.events.lock().list()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellcache_cluster::{CellAddress, CellId, Change, Proposal};

    fn addr(n: u16) -> CellAddress {
        CellAddress {
            client: format!("127.0.0.1:{n}"),
            peer: format!("127.0.0.1:{}", n + 1000),
        }
    }

    #[test]
    fn a_division_starts_then_finishes() {
        let first = CellId::whole(1);
        let one = ClusterMap::bootstrap(first.clone(), addr(1), 2).unwrap();
        let step = |map: &ClusterMap, change: Change| {
            cellcache_cluster::change::apply(
                map,
                &Proposal {
                    based_on_epoch: map.epoch(),
                    change,
                },
            )
            .expect("the change applies")
        };
        let dividing = step(
            &one,
            Change::BeginDivision {
                parent: first.clone(),
                child_address: addr(2),
            },
        );
        let started = diff(&one, &dividing, 10);
        assert_eq!(started.len(), 1, "{started:?}");
        assert_eq!(started[0].kind, "division_started");
        assert_eq!(started[0].other, first.to_string());
        assert_eq!(started[0].reason, "scale-out");
        assert_eq!(started[0].epoch, dividing.epoch());
        let child: CellId = started[0].cell.parse().unwrap();
        let done = step(&dividing, Change::CompleteDivision { child });
        let finished = diff(&dividing, &done, 11);
        assert_eq!(finished.len(), 1, "{finished:?}");
        assert_eq!(finished[0].kind, "division_finished");
        assert!(diff(&done, &done, 12).is_empty());
    }

    #[test]
    fn only_the_last_events_are_kept() {
        let mut r = Recent::new(2);
        for epoch in 1..=3 {
            r.push(Event {
                epoch,
                at: 0,
                kind: "division_started",
                cell: "2".into(),
                other: "1".into(),
                range: ["0".into(), "1".into()],
                reason: "scale-out".into(),
            });
        }
        let kept: Vec<u64> = r.list().iter().map(|e| e.epoch).collect();
        assert_eq!(kept, [2, 3]);
    }
}
