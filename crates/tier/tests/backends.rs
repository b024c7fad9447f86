//! One contract, both backing stores: redb in a temporary file, and PostgreSQL — a real
//! server this test starts (testkit's `TempPostgres`; the test fails if PostgreSQL is not
//! installed). Reads, batched puts, deletes and touches, `flush_all`'s clear, durability
//! across reopening, and (PostgreSQL) calls failing — not hanging — while the server is
//! stopped, then working again once it is back.

use cellcache_testkit::postgres::TempPostgres;
use cellcache_tier::{BackingStore, Op, PostgresConfig, PostgresStore, Record, RedbStore};
use std::sync::Arc;
use std::time::Duration;

fn record(value: &str, flags: u32, expiry_unix: u32) -> Record {
    Record {
        value: Arc::from(value.as_bytes()),
        flags,
        expiry_unix,
    }
}

fn key(k: &str) -> Arc<[u8]> {
    Arc::from(k.as_bytes())
}

async fn contract(store: &dyn BackingStore) {
    assert_eq!(store.get(b"missing").await.expect("get"), None);
    store.put(b"a", record("alpha", 7, 0)).await.expect("put");
    assert_eq!(
        store.get(b"a").await.expect("get"),
        Some(record("alpha", 7, 0))
    );
    // A batch: two puts (one over an existing key), a delete, a touch, a binary value.
    let binary = Record {
        value: Arc::from(&[0u8, 255, 13, 10, 0][..]),
        flags: u32::MAX,
        expiry_unix: u32::MAX,
    };
    store
        .put(b"t", record("touched", 1, 100))
        .await
        .expect("put");
    store
        .apply(&[
            (key("a"), Op::Put(record("alpha2", 8, 0))),
            (key("b"), Op::Put(binary.clone())),
            (key("t"), Op::Touch { expiry_unix: 200 }),
            (key("gone"), Op::Delete),
            (key("nothing-to-touch"), Op::Touch { expiry_unix: 5 }),
        ])
        .await
        .expect("apply");
    assert_eq!(
        store.get(b"a").await.expect("get"),
        Some(record("alpha2", 8, 0))
    );
    assert_eq!(store.get(b"b").await.expect("get"), Some(binary));
    assert_eq!(
        store.get(b"t").await.expect("get"),
        Some(record("touched", 1, 200))
    );
    assert_eq!(store.get(b"nothing-to-touch").await.expect("get"), None);
    store.delete(b"a").await.expect("delete");
    assert_eq!(store.get(b"a").await.expect("get"), None);
    store.clear().await.expect("clear");
    assert_eq!(store.get(b"b").await.expect("get"), None);
    store
        .put(b"after", record("x", 0, 0))
        .await
        .expect("put after clear");
    assert_eq!(
        store.get(b"after").await.expect("get"),
        Some(record("x", 0, 0))
    );
}

#[tokio::test]
async fn redb_keeps_the_contract_and_its_data_across_reopening() {
    let path = cellcache_testkit::process::scratch_dir("redb").join("backends.redb");
    let _ = std::fs::remove_file(&path);
    {
        let store = RedbStore::open(path.clone()).await.expect("open");
        contract(&store).await;
        store
            .put(b"kept", record("durable", 3, 0))
            .await
            .expect("put");
        assert_eq!(store.describe(), format!("redb:{}", path.display()));
    }
    let store = RedbStore::open(path.clone()).await.expect("reopen");
    assert_eq!(
        store.get(b"kept").await.expect("get"),
        Some(record("durable", 3, 0))
    );
    drop(store);
    std::fs::remove_file(&path).expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract_and_survives_a_restart_of_the_server() {
    let mut pg = tokio::task::spawn_blocking(TempPostgres::start_new)
        .await
        .expect("join")
        .expect("a throwaway PostgreSQL server (Debian's postgresql package)");
    let config = PostgresConfig {
        table: "tier_contract".into(),
        pool_size: 2,
        timeout: Duration::from_secs(2),
    };
    let store = PostgresStore::connect(&pg.url(), &config)
        .await
        .expect("connect");
    assert!(store.describe().starts_with("postgres://127.0.0.1:"));
    assert!(
        !store.describe().contains("cellcache@"),
        "no credentials in the name"
    );
    contract(&store).await;
    store
        .put(b"kept", record("durable", 3, 0))
        .await
        .expect("put");

    let mut pg = tokio::task::spawn_blocking(move || pg.stop().map(|()| pg))
        .await
        .expect("join")
        .expect("stop");
    let failed = store.put(b"down", record("x", 0, 0)).await;
    assert!(
        failed.is_err(),
        "a write while the server is stopped fails: {failed:?}"
    );
    assert!(store.get(b"kept").await.is_err());

    let pg = tokio::task::spawn_blocking(move || pg.start().map(|()| pg))
        .await
        .expect("join")
        .expect("start again");
    // The pool replaces its broken connections: a bounded number of attempts succeed.
    let mut ok = false;
    for _ in 0..20 {
        if store.put(b"up", record("y", 0, 0)).await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "writes succeed again once the server is back");
    assert_eq!(
        store.get(b"kept").await.expect("get"),
        Some(record("durable", 3, 0))
    );
    assert_eq!(store.get(b"down").await.expect("get"), None);
    assert_eq!(
        pg.psql("SELECT count(*) FROM tier_contract").expect("psql"),
        "3",
        "after, kept, up"
    );
}
