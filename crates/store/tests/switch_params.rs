//! A switch by name (`ctl switch eviction s3fifo`, the automatic policy) runs the policy
//! with the parameters the store was configured with when it started on that policy, and
//! with the policy's defaults otherwise.

use cellcache_store::{EvictionPolicyKind, Store, StoreConfig};

const NOW: u32 = 1_000;

fn store(eviction: EvictionPolicyKind) -> Store {
    Store::new(StoreConfig {
        memory_limit_bytes: 8 << 20,
        slab_size_bytes: 64 << 10,
        item_size_max_bytes: 32 << 10,
        eviction,
        ..StoreConfig::default()
    })
    .expect("a valid config")
}

#[test]
fn switching_away_and_back_keeps_the_configured_tuning() {
    let tuned = EvictionPolicyKind::S3Fifo {
        small_permille: 200,
        ghost_permille: 0,
    };
    let store = store(tuned);
    let lru = store.eviction_named("lru").expect("lru is a policy");
    assert_eq!(lru, EvictionPolicyKind::SlabLru);
    store.switch_eviction(lru, NOW).expect("switch to lru");
    let back = store.eviction_named("s3fifo").expect("s3fifo is a policy");
    assert_eq!(back, tuned, "the configured parameters, not the defaults");
    store.switch_eviction(back, NOW).expect("switch back");
    assert_eq!(store.eviction(), tuned);
}

#[test]
fn a_policy_the_store_did_not_start_on_gets_its_defaults() {
    let store = store(EvictionPolicyKind::SlabLru);
    assert_eq!(
        store.eviction_named("s3fifo"),
        Some(EvictionPolicyKind::S3FIFO)
    );
    assert_eq!(
        store.eviction_named("slab_lru"),
        Some(EvictionPolicyKind::SlabLru)
    );
    assert_eq!(store.eviction_named("clock"), None);
}
