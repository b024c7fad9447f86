//! Three replicas in one process over an in-memory transport: initialization, a committed
//! proposal, leader-only writes, stale refusals, leader kill, re-election and a proposal
//! committed after failover. Every wait is bounded in iterations.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::change::Change;
use crate::map::CellAddress;

/// Routes calls to in-process replicas; a node in `down` neither sends nor receives.
#[derive(Default)]
struct Router {
    groups: Mutex<BTreeMap<RaftNodeId, Arc<RaftGroup>>>,
    down: Mutex<BTreeSet<RaftNodeId>>,
}

struct Link {
    router: Arc<Router>,
    from: RaftNodeId,
}

impl RaftTransport for Link {
    fn call(
        &self,
        target: RaftNodeId,
        rpc: RaftRpc,
        body: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send {
        let router = self.router.clone();
        let from = self.from;
        async move {
            let group = {
                let down = router.down.lock().unwrap();
                if down.contains(&from) || down.contains(&target) {
                    None
                } else {
                    router.groups.lock().unwrap().get(&target).cloned()
                }
            };
            match group {
                Some(g) => g.handle_rpc(rpc, &body).await,
                None => Err(TransportError {
                    target,
                    reason: "node down".into(),
                }),
            }
        }
    }
}

fn addr(n: u32) -> CellAddress {
    CellAddress {
        client: format!("127.0.0.1:{}", 23000 + n),
        peer: format!("127.0.0.1:{}", 33000 + n),
    }
}

fn fast() -> RaftConfig {
    RaftConfig {
        heartbeat_interval_ms: 30,
        election_timeout_min_ms: 150,
        election_timeout_max_ms: 300,
    }
}

/// Waits (bounded) until every live replica names the same live leader.
async fn agreed_leader(router: &Router, live: &[RaftNodeId]) -> RaftNodeId {
    for _ in 0..500 {
        let leaders: BTreeSet<Option<RaftNodeId>> = {
            let groups = router.groups.lock().unwrap();
            live.iter().map(|id| groups[id].leader()).collect()
        };
        if let [Some(l)] = leaders.iter().copied().collect::<Vec<_>>()[..] {
            if live.contains(&l) {
                return l;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no agreed leader among {live:?}");
}

/// Waits (bounded) until every listed replica has applied `epoch`.
async fn applied_everywhere(router: &Router, ids: &[RaftNodeId], epoch: u64) {
    for _ in 0..500 {
        let done = {
            let groups = router.groups.lock().unwrap();
            ids.iter()
                .all(|id| groups[id].current_map().epoch() == epoch)
        };
        if done {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("epoch {epoch} not applied on all of {ids:?}");
}

fn group(router: &Router, id: RaftNodeId) -> Arc<RaftGroup> {
    router.groups.lock().unwrap()[&id].clone()
}

#[tokio::test(flavor = "current_thread")]
async fn three_replicas_commit_elect_and_fail_over() {
    let router = Arc::new(Router::default());
    let genesis = ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).unwrap();
    let ids: Vec<RaftNodeId> = vec![1, 2, 3];
    for &id in &ids {
        let link = Arc::new(Link {
            router: router.clone(),
            from: id,
        });
        let g = RaftGroup::start(id, genesis.clone(), fast(), link)
            .await
            .unwrap();
        router.groups.lock().unwrap().insert(id, Arc::new(g));
    }
    let voters: BTreeMap<RaftNodeId, CellId> = ids.iter().map(|&i| (i, CellId::whole(i))).collect();
    group(&router, 1).initialize(&voters).await.unwrap();

    let leader = agreed_leader(&router, &ids).await;
    let divide = |epoch, n| Proposal {
        based_on_epoch: epoch,
        change: Change::BeginDivision {
            parent: CellId::whole(1),
            child_address: addr(n),
        },
    };
    let map = group(&router, leader).propose(divide(1, 1)).await.unwrap();
    assert_eq!(map.epoch(), 2);
    applied_everywhere(&router, &ids, 2).await;

    // Writes go through the leader only; followers name it.
    let follower = *ids.iter().find(|&&i| i != leader).unwrap();
    match group(&router, follower).propose(divide(2, 2)).await {
        Err(ConsensusError::NotLeader { leader: Some(cell) }) => {
            assert_eq!(cell, CellId::whole(leader))
        }
        other => panic!("follower accepted a write: {other:?}"),
    }
    // A stale proposal commits as a refusal and changes nothing.
    match group(&router, leader).propose(divide(1, 3)).await {
        Err(ConsensusError::Refused(ChangeError::StaleEpoch {
            proposed: 1,
            current: 2,
        })) => {}
        other => panic!("stale proposal not refused: {other:?}"),
    }
    assert_eq!(group(&router, leader).current_map().epoch(), 2);
    let members = group(&router, leader).membership();
    assert_eq!(members.voters, voters.values().cloned().collect());
    assert!(group(&router, leader).confirm_map(2).await);
    assert!(!group(&router, leader).confirm_map(1).await);

    // Kill the leader: the other two elect a new one and keep committing.
    router.down.lock().unwrap().insert(leader);
    group(&router, leader).shutdown().await.unwrap();
    let survivors: Vec<RaftNodeId> = ids.iter().copied().filter(|&i| i != leader).collect();
    let new_leader = agreed_leader(&router, &survivors).await;
    assert_ne!(new_leader, leader);
    let child = group(&router, new_leader)
        .current_map()
        .cells()
        .iter()
        .find(|c| c.state == crate::CellState::Joining)
        .map(|c| c.id.clone())
        .unwrap();
    let complete = Proposal {
        based_on_epoch: 2,
        change: Change::CompleteDivision { child },
    };
    let map = group(&router, new_leader).propose(complete).await.unwrap();
    assert_eq!(map.epoch(), 3);
    assert_eq!(map.active_cells().count(), 2);
    applied_everywhere(&router, &survivors, 3).await;
    assert!(group(&router, new_leader).confirm_map(3).await);

    // A replacement replica joins from the genesis map: as a learner it replays the log (the
    // entries computed against older epochs re-apply in order) and reaches the same map; then
    // it is promoted to voter and the group commits with it.
    let link = Arc::new(Link {
        router: router.clone(),
        from: 4,
    });
    let fourth = RaftGroup::start(4, genesis.clone(), fast(), link)
        .await
        .unwrap();
    router.groups.lock().unwrap().insert(4, Arc::new(fourth));
    group(&router, new_leader)
        .add_learner(4, &CellId::whole(4))
        .await
        .unwrap();
    let mut members: Vec<RaftNodeId> = survivors.clone();
    members.push(4);
    applied_everywhere(&router, &members, 3).await;
    assert_eq!(
        group(&router, 4).current_map(),
        group(&router, new_leader).current_map()
    );
    assert!(
        group(&router, new_leader)
            .membership()
            .learners
            .contains(&CellId::whole(4))
    );
    let voters: BTreeSet<RaftNodeId> = members.iter().copied().collect();
    group(&router, new_leader)
        .change_voters(voters)
        .await
        .unwrap();
    let membership = group(&router, new_leader).membership();
    assert!(
        membership.voters.contains(&CellId::whole(4)),
        "{membership:?}"
    );
    let parent = group(&router, new_leader).current_map().cells()[0]
        .id
        .clone();
    let divide_again = Proposal {
        based_on_epoch: 3,
        change: Change::BeginDivision {
            parent,
            child_address: addr(9),
        },
    };
    let leader_now = agreed_leader(&router, &members).await;
    assert_eq!(
        group(&router, leader_now)
            .propose(divide_again)
            .await
            .unwrap()
            .epoch(),
        4
    );
    applied_everywhere(&router, &members, 4).await;
    for id in members {
        group(&router, id).shutdown().await.unwrap();
    }
}

/// The sender a receiver checks is the node the RPC's `vote` names, for each kind.
#[test]
fn rpc_sender_reads_the_vote_of_every_rpc() {
    let vote = openraft::Vote::new_committed(3, 7u64);
    let append: AppendEntriesRequest<MapRaft> = AppendEntriesRequest {
        vote,
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let body = serde_json::to_vec(&append).unwrap();
    assert_eq!(
        RaftGroup::rpc_sender(RaftRpc::AppendEntries, &body),
        Some(7)
    );
    let ballot = VoteRequest::new(openraft::Vote::new(4, 9u64), None);
    let body = serde_json::to_vec(&ballot).unwrap();
    assert_eq!(RaftGroup::rpc_sender(RaftRpc::Vote, &body), Some(9));
    assert_eq!(RaftGroup::rpc_sender(RaftRpc::Vote, b"{}"), None);
    assert_eq!(RaftGroup::rpc_sender(RaftRpc::Vote, b"not json"), None);
}
