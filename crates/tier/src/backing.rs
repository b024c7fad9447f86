//! The interface every backing store implements, and [`open`], which picks one from the
//! operator's specification.
//!
//! A store answers single reads ([`BackingStore::get`]) and applies batches
//! ([`BackingStore::apply`]) atomically and durably: when `apply` returns `Ok`, every op
//! of the batch survives a crash of the cell and of the store's host (redb commits with
//! fsync; PostgreSQL commits with its default `synchronous_commit`). A batch never holds
//! two ops for one key (the write-back engine keeps one flush per key in flight), so the
//! order of ops inside a batch does not matter.

use crate::error::TierError;
use crate::postgres::{PostgresConfig, PostgresStore};
use crate::record::{Op, Record};
use crate::redb_store::RedbStore;
use std::path::PathBuf;
use std::sync::Arc;

/// A durable key-value store behind a cell.
#[async_trait::async_trait]
pub trait BackingStore: Send + Sync + 'static {
    /// The key's record, or `None` when the store has none.
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, TierError>;

    /// Applies every op of `batch` in one atomic, durable transaction.
    async fn apply(&self, batch: &[(Arc<[u8]>, Op)]) -> Result<(), TierError>;

    /// Removes every record (`flush_all`).
    async fn clear(&self) -> Result<(), TierError>;

    /// One line naming the store, for logs and `stats` (no secrets: a PostgreSQL URL's
    /// password is left out).
    fn describe(&self) -> String;

    /// Stores one record (a batch of one).
    async fn put(&self, key: &[u8], record: Record) -> Result<(), TierError> {
        self.apply(&[(Arc::from(key), Op::Put(record))]).await
    }

    /// Deletes one key (a batch of one).
    async fn delete(&self, key: &[u8]) -> Result<(), TierError> {
        self.apply(&[(Arc::from(key), Op::Delete)]).await
    }
}

/// A parsed `--backing-store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// `redb:PATH`: an embedded redb file.
    Redb(PathBuf),
    /// `postgres://…` or `postgresql://…`: a PostgreSQL connection URL.
    Postgres(String),
}

impl Spec {
    /// Parses `redb:PATH`, `postgres://…` or `postgresql://…`.
    pub fn parse(spec: &str) -> Result<Spec, TierError> {
        if let Some(path) = spec.strip_prefix("redb:") {
            if path.is_empty() {
                return Err(TierError::Spec(spec.to_string()));
            }
            return Ok(Spec::Redb(PathBuf::from(path)));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(Spec::Postgres(spec.to_string()));
        }
        Err(TierError::Spec(spec.to_string()))
    }
}

/// Opens the store `spec` names. PostgreSQL's pool is created here and its table made if
/// missing, so a wrong URL or an unreachable server fails the cell's start.
pub async fn open(
    spec: &Spec,
    postgres: &PostgresConfig,
) -> Result<Arc<dyn BackingStore>, TierError> {
    Ok(match spec {
        Spec::Redb(path) => Arc::new(RedbStore::open(path.clone()).await?),
        Spec::Postgres(url) => Arc::new(PostgresStore::connect(url, postgres).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            Spec::parse("redb:/tmp/a.redb").ok(),
            Some(Spec::Redb(PathBuf::from("/tmp/a.redb")))
        );
        assert!(matches!(
            Spec::parse("postgres://u@localhost/db"),
            Ok(Spec::Postgres(_))
        ));
        assert!(matches!(Spec::parse("redb:"), Err(TierError::Spec(_))));
        assert!(matches!(Spec::parse("mysql://x"), Err(TierError::Spec(_))));
    }
}
