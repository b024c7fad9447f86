//! Unit tests of the inter-cell links (`link.rs`).

use super::*;

/// A one-thread runtime and a loopback listener on it (a peer the test plays), with
/// its address.
fn runtime_and_listener() -> (tokio::runtime::Runtime, tokio::net::TcpListener, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    (rt, listener, addr)
}

/// A link from cell 1 to cell 2 at `addr`, without a secret.
fn test_link(
    rt: &tokio::runtime::Runtime,
    addr: String,
    reply: Duration,
    queue_bytes_max: usize,
) -> Arc<Link> {
    link_with(rt, addr, test_link_config(reply, queue_bytes_max))
}

/// The test links' configuration: generous connect and handshake timeouts, no secret.
fn test_link_config(reply: Duration, queue_bytes_max: usize) -> LinkConfig {
    LinkConfig {
        connect: Duration::from_secs(5),
        handshake: Duration::from_secs(5),
        reply,
        give_up_check: reply,
        queue_bytes_max,
        auth: PeerAuth::default(),
    }
}

/// A link from cell 1 to cell 2 at `addr` with `config`.
fn link_with(rt: &tokio::runtime::Runtime, addr: String, config: LinkConfig) -> Arc<Link> {
    Link::start(
        rt.handle(),
        payload::Hello {
            cell: CellId::whole(1),
            ring: 1,
            client: "127.0.0.1:1".into(),
        },
        CellId::whole(2),
        addr,
        WireConfig::default(),
        Arc::new(AtomicU64::new(1)),
        config,
    )
}

/// A peer that accepts, reads everything and never answers (a paused or cut-off cell
/// whose kernel still holds the connection): the request must fail once it is overdue,
/// not wait for TCP to give up.
#[test]
fn a_silent_peer_fails_its_requests_after_the_reply_timeout() {
    let (rt, listener, addr) = runtime_and_listener();
    rt.spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(async move {
                let mut sink = vec![0u8; 4096];
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
                let _ = tx.send(());
            });
            held.push(rx);
        }
    });
    let link = test_link(&rt, addr, Duration::from_millis(200), 1 << 20);
    let outcome = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(30),
            link.call(FrameKind::ForwardRequest, b"get k\r\n".to_vec()),
        )
        .await
    });
    match outcome {
        Ok(Err(LinkError::Silent(_, waited))) => {
            assert_eq!(waited, Duration::from_millis(200))
        }
        other => panic!("expected the silent-peer failure, got {other:?}"),
    }
    // The next request opens a new connection (and fails the same way): the link recovers.
    let again = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(30),
            link.call(FrameKind::ForwardRequest, b"get k\r\n".to_vec()),
        )
        .await
    });
    assert!(matches!(again, Ok(Err(LinkError::Silent(..)))), "{again:?}");
}

#[test]
fn a_budget_bounds_what_is_queued_but_always_takes_one_frame() {
    let b = Budget::new(100);
    assert!(b.try_take(500), "an empty queue takes any one frame");
    assert!(!b.try_take(1), "past the bound");
    b.release(500);
    assert!(b.try_take(60));
    assert!(b.try_take(40));
    assert!(!b.try_take(1));
    assert_eq!(b.queued(), 100);
    b.take(50);
    assert_eq!(
        b.queued(),
        150,
        "what must be queued is counted past the bound"
    );
    b.release(150);
    assert_eq!(b.queued(), 0);
}

#[test]
fn below_max_waits_for_the_writer_to_drain() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let b = Budget::new(10);
    b.take(30);
    let waiter = b.clone();
    rt.block_on(async move {
        let wait = tokio::spawn(async move { waiter.below_max().await });
        tokio::task::yield_now().await;
        assert!(!wait.is_finished(), "over the bound: waits");
        b.release(15);
        tokio::task::yield_now().await;
        assert!(!wait.is_finished(), "still over the bound");
        b.release(10);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("woken once within the bound")
            .expect("the waiting task");
    });
}

/// A peer that accepts but never reads: the kernel's buffers fill, the link's writer
/// blocks, and past `queue_bytes_max` new requests fail at once with `Busy` instead of
/// queueing without end.
#[test]
fn a_peer_that_reads_nothing_gets_busy_requests_not_an_endless_queue() {
    let (rt, listener, addr) = runtime_and_listener();
    rt.spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    const QUEUE_MAX: usize = 1 << 20;
    const FRAME: usize = 16 * 1024;
    let link = test_link(&rt, addr, Duration::from_secs(600), QUEUE_MAX);
    let busy = Arc::new(AtomicU64::new(0));
    let mut most_queued = 0;
    // 64 MiB offered, far past what loopback's socket buffers hold.
    for _ in 0..4_096 {
        let refused = busy.clone();
        link.request(
            FrameKind::ForwardRequest,
            vec![b'x'; FRAME],
            Box::new(move |r| {
                if let Err(LinkError::Busy(..)) = r {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }),
        );
        most_queued = most_queued.max(link.budget.queued());
        if busy.load(Ordering::Relaxed) > 0 {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(busy.load(Ordering::Relaxed) > 0, "no request was refused");
    assert!(most_queued <= QUEUE_MAX, "{most_queued} bytes queued");
}

/// The peer listener's gate: while the replies a connection owes are queued past the
/// bound, nothing more is read from it; once the writer drains them, reading resumes.
#[test]
fn read_frames_reads_nothing_while_its_gate_is_over_the_bound() {
    use tokio::io::AsyncWriteExt as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (mut peer, mut rd) = tokio::io::duplex(64 * 1024);
        let owed = Budget::new(10);
        owed.take(100);
        let seen = Arc::new(AtomicU64::new(0));
        let (gate, count) = (owed.clone(), seen.clone());
        let reader = tokio::spawn(async move {
            read_frames(&mut rd, &WireConfig::default(), "test", Some(&gate), |_| {
                count.fetch_add(1, Ordering::Relaxed);
                true
            })
            .await;
        });
        let mut frame = Vec::new();
        wire::encode(
            &WireConfig::default(),
            FrameKind::Heartbeat,
            1,
            0,
            b"x",
            &mut frame,
        )
        .expect("a frame");
        peer.write_all(&frame).await.expect("written");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(seen.load(Ordering::Relaxed), 0, "read past the bound");
        owed.release(100);
        tokio::time::timeout(Duration::from_secs(10), async {
            while seen.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the frame is read once the replies drained");
        drop(peer);
        reader.await.expect("the reader ends with the connection");
    });
}

/// A peer that answers every frame a second late: a request given up at its own deadline
/// fails alone with `GaveUp`, its late reply is dropped, and the connection stays for the
/// next request (one connection accepted in all).
#[test]
fn a_request_gives_up_at_its_own_deadline_and_the_connection_stays() {
    let (rt, listener, addr) = runtime_and_listener();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut rd, wr) = tokio::io::split(stream);
                let wr = Arc::new(tokio::sync::Mutex::new(wr));
                read_frames(&mut rd, &WireConfig::default(), "test", None, |f| {
                    if f.request_id == 0 {
                        return true; // the Hello
                    }
                    let wr = wr.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let mut out = Vec::new();
                        let _ = wire::encode(
                            &WireConfig::default(),
                            FrameKind::ForwardReply,
                            1,
                            f.request_id,
                            b"END\r\n",
                            &mut out,
                        );
                        let _ = wr.lock().await.write_all(&out).await;
                    });
                    true
                })
                .await;
            });
        }
    });
    // Replies are late by a second; the link itself would wait 30 s for one.
    let mut link_config = test_link_config(Duration::from_secs(30), 1 << 20);
    link_config.give_up_check = Duration::from_millis(20);
    let link = link_with(&rt, addr, link_config);
    let (tx, rx) = std::sync::mpsc::channel();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    link.request_until(
        FrameKind::ForwardRequest,
        b"get k\r\n".to_vec(),
        Instant::now() + Duration::from_millis(100),
        Box::new(move |r| {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(r);
        }),
    );
    // Its reply comes a second late and the link's own timeout is 30 s: only its deadline
    // can end it first.
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("an outcome");
    assert_eq!(first, Err(LinkError::GaveUp));
    // The next request on the same link waits for its (late) reply and gets it.
    let second = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(20),
            link.call(FrameKind::ForwardRequest, b"get k\r\n".to_vec()),
        )
        .await
    });
    match second {
        Ok(Ok(f)) => assert_eq!(f.payload, b"END\r\n"),
        other => panic!("expected the reply, got {other:?}"),
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the late reply was dropped"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection all along"
    );
}

/// A peer that accepts and never reads (a paused cell): once its socket buffers are full the
/// link's write waits for good, and every request — written, or queued behind the write —
/// must still give up at its own deadline.
#[test]
fn a_request_gives_up_while_the_write_to_a_paused_peer_waits() {
    let (rt, listener, addr) = runtime_and_listener();
    rt.spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    const FRAME: usize = 64 * 1024;
    const FRAMES: usize = 512; // 32 MiB, far past what loopback's socket buffers hold
    let mut config = test_link_config(Duration::from_secs(600), FRAME * FRAMES);
    config.give_up_check = Duration::from_millis(20);
    let link = link_with(&rt, addr, config);
    let (tx, rx) = std::sync::mpsc::channel();
    let give_up = Instant::now() + Duration::from_millis(200);
    for _ in 0..FRAMES {
        let tx = tx.clone();
        link.request_until(
            FrameKind::ForwardRequest,
            vec![b'x'; FRAME],
            give_up,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
    }
    // With the write waiting and a 600 s reply timeout, only the deadlines can end them.
    for i in 0..FRAMES {
        let outcome = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("request {i} of {FRAMES} got no outcome"));
        assert_eq!(outcome, Err(LinkError::GaveUp));
    }
}
