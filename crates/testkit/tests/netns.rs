//! Real partitions: a `cellcache serve` in one network namespace, clients in others;
//! reachable, cut, healed; isolating one node and a minority; a recorded workload across a
//! partition still checks out. Skips with the reason printed where namespaces cannot be
//! made (not root, no iproute2 or nftables).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cellcache_testkit::netns::{Netns, NetnsError};
use cellcache_testkit::process::{Server, ServerSpec};
use cellcache_testkit::workload::{Workload, WorkloadConfig};

fn namespaces(nodes: usize) -> Option<Netns> {
    match Netns::create(nodes) {
        Ok(netns) => Some(netns),
        Err(NetnsError::Unavailable(reason)) => {
            println!("SKIPPED: {reason}");
            None
        }
        Err(error) => panic!("building namespaces: {error}"),
    }
}

/// Whether `version` gets an answer from inside node `from` within a short timeout.
fn reaches(netns: &Netns, from: usize, addr: SocketAddr) -> bool {
    netns
        .run_in(from, || {
            let timeout = Duration::from_millis(300);
            let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
                return false;
            };
            stream.set_read_timeout(Some(timeout)).expect("timeout");
            stream.write_all(b"version\r\n").expect("write");
            let mut line = String::new();
            BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("VERSION")
        })
        .expect("enter namespace")
}

#[test]
fn cut_isolate_partition_and_heal() {
    let Some(netns) = namespaces(3) else { return };
    let spec = ServerSpec::cellcache("netns-server").expect("cellcache binary");
    let server = Server::start(netns.place(0, spec)).expect("server starts in node 0");
    let addr = server.addr();
    assert_eq!(addr.ip(), Netns::address(0));

    assert!(reaches(&netns, 1, addr), "reachable across the bridge");
    assert!(reaches(&netns, 2, addr));

    netns.cut(0, 1).expect("cut");
    assert!(!reaches(&netns, 1, addr), "cut link");
    assert!(reaches(&netns, 2, addr), "other links stay up");

    netns.heal().expect("heal");
    assert!(reaches(&netns, 1, addr), "healed");

    netns.isolate(0).expect("isolate");
    assert!(!reaches(&netns, 1, addr));
    assert!(!reaches(&netns, 2, addr));
    netns.heal().expect("heal");

    // minority {0, 1} against {2}
    netns.partition(&[0, 1]).expect("partition");
    assert!(reaches(&netns, 1, addr), "same side");
    assert!(!reaches(&netns, 2, addr), "other side");
    netns.heal().expect("heal");
    assert!(reaches(&netns, 2, addr));

    // a plain process inside a node sees only that node's interfaces
    let output = netns
        .command(2, "ip")
        .args(["-4", "-o", "addr", "show", "dev", "eth0"])
        .output()
        .expect("ip inside node 2");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("{}/24", Netns::address(2))),
        "{text}"
    );
    drop(server);
}

#[test]
fn open_connection_stalls_during_a_cut_and_resumes_after() {
    let Some(netns) = namespaces(2) else { return };
    let spec = ServerSpec::cellcache("netns-stall").expect("cellcache binary");
    let server = Server::start(netns.place(0, spec)).expect("server starts");
    let addr = server.addr();
    netns
        .run_in(1, || {
            let mut stream = TcpStream::connect(addr).expect("connect");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            stream.write_all(b"version\r\n").expect("write");
            reader.read_line(&mut line).expect("answer before the cut");

            netns.cut(0, 1).expect("cut");
            stream
                .set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            stream
                .write_all(b"version\r\n")
                .expect("written to the send buffer");
            line.clear();
            assert!(
                reader.read_line(&mut line).is_err(),
                "no answer across a cut"
            );

            netns.heal().expect("heal");
            // TCP retransmits; the answer arrives once the link is back
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            line.clear();
            reader.read_line(&mut line).expect("answer after healing");
            assert!(line.starts_with("VERSION"), "{line}");
        })
        .expect("enter namespace");
    drop(server);
}

#[test]
fn workload_across_a_partition_checks_out() {
    let Some(netns) = namespaces(2) else { return };
    let spec = ServerSpec::cellcache("netns-load").expect("cellcache binary");
    let mut server = Server::start(netns.place(0, spec)).expect("server starts");
    let workload = Workload::start(WorkloadConfig {
        request_timeout: Duration::from_millis(300),
        ops_per_client: 100_000,
        netns: Some(netns.name(1).to_owned()),
        ..WorkloadConfig::registers(vec![server.addr()])
    })
    .expect("workload starts in node 1");
    let long = Duration::from_secs(20);
    assert!(workload.wait_completed(200, long));
    netns.cut(0, 1).expect("cut");
    std::thread::sleep(Duration::from_millis(700));
    netns.heal().expect("heal");
    let done = workload.completed();
    assert!(
        workload.wait_completed(done + 200, long),
        "load resumes after healing"
    );
    let run = workload.finish();
    assert!(run.summary.unknown > 0, "{:?}", run.summary);
    assert_eq!(run.summary.final_reads_missing, 0);
    run.assert_valid("netns-partition");

    // the nemesis works inside a namespace too: the pid is the server's, not `ip`'s
    server.kill9().expect("kill -9");
    server.restart().expect("restart in node 0");
    assert!(reaches(&netns, 1, server.addr()));
}
