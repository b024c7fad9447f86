//! The configuration's defaults, validation, TOML, environment and flag-derived limits.

use super::*;

#[test]
fn example_config_in_repository_equals_defaults() {
    let text = include_str!("../../../../cellcache.example.toml");
    let parsed = NodeConfig::from_toml_str(text).expect("example parses");
    assert_eq!(parsed, NodeConfig::default());
    // Every field must be spelled out in the example, not merely defaulted: compare
    // the example's keys with the serialized defaults' keys.
    let example: toml::Table = text.parse().unwrap();
    let defaults: toml::Table = toml::to_string(&NodeConfig::default())
        .unwrap()
        .parse()
        .unwrap();
    for (section, fields) in &defaults {
        let Some(fields) = fields.as_table() else {
            continue;
        };
        for key in fields.keys() {
            assert!(
                example.get(section).and_then(|s| s.get(key)).is_some(),
                "cellcache.example.toml lacks [{section}] {key}"
            );
        }
    }
}

/// The parser refuses an oversized item before reading it and the store checks again
/// (append, incr, replication): both must count an item as memcached does.
#[test]
fn parser_and_store_count_item_sizes_alike() {
    use cellcache_proto::limits as proto;
    assert_eq!(
        proto::ITEM_OVERHEAD_BYTES,
        cellcache_store::ITEM_OVERHEAD_BYTES
    );
    assert_eq!(proto::ITEM_FLAGS_BYTES, cellcache_store::ITEM_FLAGS_BYTES);
    assert_eq!(proto::ITEM_CAS_BYTES, cellcache_store::ITEM_CAS_BYTES);
    let c = NodeConfig::default();
    let limits = c.protocol_limits();
    assert_eq!(limits.item_size_max, 1 << 20);
    let cases = [(1, 1_048_516, 0), (1, 1_048_517, 0), (250, 1_048_267, 0)]
        .into_iter()
        .chain([(1, 1_048_512, 7), (1, 1_048_513, 7), (250, 1_048_268, 0)])
        .chain([(1, 1_048_524, 0), (1, 1_048_525, 0)]);
    for cas_enabled in [true, false] {
        let mut c = c.clone();
        c.store.cas_enabled = cas_enabled;
        let limits = c.protocol_limits();
        for (key, value, flags) in cases.clone() {
            assert_eq!(
                limits.item_fits(key, value, flags),
                c.store.item_fits(key, value, flags),
                "{key} {value} {flags} cas {cas_enabled}"
            );
        }
        assert_eq!(limits.value_bytes_max(), c.store.value_bytes_max());
    }
    // memcached -C -I 1m: 1 048 524 with a 1-byte key.
    let mut no_cas = c.clone();
    no_cas.store.cas_enabled = false;
    assert_eq!(no_cas.protocol_limits().value_bytes_max(), 1_048_524);
}

/// memcached's -R as a key: 20 by default, 0 refused with the key named, settable from
/// the file and the environment like every key.
#[test]
// figment's Jail API fixes the closure's error type; nothing to shrink here.
#[allow(clippy::result_large_err)]
fn requests_per_event_max_defaults_to_memcacheds_and_refuses_zero() {
    assert_eq!(NodeConfig::default().server.requests_per_event_max, 20);
    let c = NodeConfig::from_toml_str("[server]\nrequests_per_event_max = 0\n").unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("server.requests_per_event_max"), "{err}");
    let c = NodeConfig::from_toml_str("[server]\nrequests_per_event_max = 1\n").unwrap();
    assert_eq!(c.server.requests_per_event_max, 1);
    figment::Jail::expect_with(|jail| {
        jail.set_env("CELLCACHE_SERVER__REQUESTS_PER_EVENT_MAX", "7");
        let c = NodeConfig::load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.server.requests_per_event_max, 7);
        Ok(())
    });
}

#[test]
fn unknown_keys_are_refused() {
    let err = NodeConfig::from_toml_str("[server]\nprot = 1\n").unwrap_err();
    assert!(err.to_string().contains("prot"), "{err}");
}

#[test]
// figment's Jail API fixes the closure's error type; nothing to shrink here.
#[allow(clippy::result_large_err)]
fn environment_overrides_file() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("c.toml", "[server]\nport = 1000\n[io]\nthreads = 3\n")?;
        jail.set_env("CELLCACHE_SERVER__PORT", "2000");
        jail.set_env("CELLCACHE_STORE__MEMORY_LIMIT_BYTES", "33554432");
        jail.set_env("CELLCACHE_UNRELATED", "ignored: not SECTION__FIELD");
        let c = NodeConfig::load(Some(Path::new("c.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.server.port, 2000);
        assert_eq!(c.io.threads, 3);
        assert_eq!(c.store.memory_limit_bytes, 32 << 20);
        Ok(())
    });
}

/// `[store] eviction` by name in the file, overridden by `CELLCACHE_STORE__EVICTION`; the
/// table form keeps its parameters.
#[test]
// figment's Jail API fixes the closure's error type; nothing to shrink here.
#[allow(clippy::result_large_err)]
fn eviction_policy_from_file_and_environment() {
    use cellcache_store::EvictionPolicyKind;
    figment::Jail::expect_with(|jail| {
        jail.create_file("c.toml", "[store]\neviction = \"s3fifo\"\n")?;
        let c = NodeConfig::load(Some(Path::new("c.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.store.eviction, EvictionPolicyKind::S3FIFO);
        jail.set_env("CELLCACHE_STORE__EVICTION", "lru");
        let c = NodeConfig::load(Some(Path::new("c.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.store.eviction, EvictionPolicyKind::SlabLru);
        Ok(())
    });
    let c = NodeConfig::from_toml_str(
        "[store]\neviction = { kind = \"s3fifo\", small_permille = 200, ghost_permille = 0 }\n",
    )
    .unwrap();
    assert_eq!(
        c.store.eviction,
        EvictionPolicyKind::S3Fifo {
            small_permille: 200,
            ghost_permille: 0
        }
    );
    assert!(NodeConfig::from_toml_str("[store]\neviction = \"arc\"\n").is_err());
}

/// `[cluster.tls]`: off by default, on with all three files, a start error naming what is
/// missing with only some; settable from the file and the environment (nested tables are
/// `SECTION__TABLE__FIELD`).
#[test]
// figment's Jail API fixes the closure's error type; nothing to shrink here.
#[allow(clippy::result_large_err)]
fn peer_tls_is_all_or_nothing_and_names_what_is_missing() {
    let c = NodeConfig::default();
    assert!(!c.cluster.tls.enabled());
    assert_eq!(c.cluster.tls.server_name, "cellcache");
    c.validate().expect("off by default");
    let c = NodeConfig::from_toml_str("[cluster.tls]\ncert_file = \"c.pem\"\n").unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("--peer-tls-key") && err.contains("--peer-tls-ca"),
        "{err}"
    );
    assert!(!err.contains("--peer-tls-cert"), "{err}");
    let all = "[cluster.tls]\ncert_file = \"c\"\nkey_file = \"k\"\nca_file = \"a\"\n";
    let c = NodeConfig::from_toml_str(all).unwrap();
    assert!(c.cluster.tls.enabled());
    c.validate().expect("all three given");
    let nameless = format!("{all}server_name = \"\"\n");
    let err = NodeConfig::from_toml_str(&nameless)
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("server_name"), "{err}");
    figment::Jail::expect_with(|jail| {
        jail.set_env("CELLCACHE_CLUSTER__TLS__CERT_FILE", "/e/cert.pem");
        jail.set_env("CELLCACHE_CLUSTER__TLS__SERVER_NAME", "ring.example");
        let c = NodeConfig::load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.cluster.tls.cert_file, "/e/cert.pem");
        assert_eq!(c.cluster.tls.server_name, "ring.example");
        assert!(c.cluster.tls.key_file.is_empty());
        Ok(())
    });
}
