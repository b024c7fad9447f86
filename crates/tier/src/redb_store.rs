//! The embedded backing store: one redb file per cell (`--backing-store redb:PATH`).
//!
//! redb (its 2.x line: 3 and later need a newer Rust than the workspace's 1.85) is crash-safe
//! (copy-on-write B-trees, a commit is durable when it returns with the
//! default `Durability::Immediate`) and its API is synchronous, so every call runs on
//! tokio's blocking pool; redb serialises write transactions itself, so concurrent batches
//! simply queue. One table, `items`: the key's bytes to [`Record::encode`]'s bytes.

use crate::backing::BackingStore;
use crate::error::TierError;
use crate::record::{Op, Record};
use redb::{Database, ReadableTable, TableDefinition};
use std::path::PathBuf;
use std::sync::Arc;

const ITEMS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("items");

/// A redb file.
pub struct RedbStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl RedbStore {
    /// Opens (creating if missing) the file at `path` and its table.
    pub async fn open(path: PathBuf) -> Result<RedbStore, TierError> {
        let at = path.clone();
        let db = blocking(move || {
            let db = Database::create(&at).map_err(|e| TierError::redb("opening the file", e))?;
            let txn = db
                .begin_write()
                .map_err(|e| TierError::redb("beginning a transaction", e))?;
            txn.open_table(ITEMS)
                .map_err(|e| TierError::redb("creating the table", e))?;
            txn.commit().map_err(|e| TierError::redb("committing", e))?;
            Ok(db)
        })
        .await?;
        Ok(RedbStore {
            db: Arc::new(db),
            path,
        })
    }
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TierError> + Send + 'static,
) -> Result<T, TierError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TierError::Worker(e.to_string()))?
}

#[async_trait::async_trait]
impl BackingStore for RedbStore {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, TierError> {
        let db = self.db.clone();
        let key = key.to_vec();
        blocking(move || {
            let txn = db
                .begin_read()
                .map_err(|e| TierError::redb("beginning a read", e))?;
            let table = txn
                .open_table(ITEMS)
                .map_err(|e| TierError::redb("opening the table", e))?;
            let Some(found) = table
                .get(key.as_slice())
                .map_err(|e| TierError::redb("reading", e))?
            else {
                return Ok(None);
            };
            Record::decode(found.value())
                .map(Some)
                .ok_or(TierError::Corrupt("redb value shorter than its header"))
        })
        .await
    }

    async fn apply(&self, batch: &[(Arc<[u8]>, Op)]) -> Result<(), TierError> {
        let db = self.db.clone();
        let batch = batch.to_vec();
        blocking(move || {
            let txn = db
                .begin_write()
                .map_err(|e| TierError::redb("beginning a transaction", e))?;
            {
                let mut table = txn
                    .open_table(ITEMS)
                    .map_err(|e| TierError::redb("opening the table", e))?;
                for (key, op) in &batch {
                    match op {
                        Op::Put(r) => {
                            table
                                .insert(&**key, r.encode().as_slice())
                                .map_err(|e| TierError::redb("writing", e))?;
                        }
                        Op::Delete => {
                            table
                                .remove(&**key)
                                .map_err(|e| TierError::redb("deleting", e))?;
                        }
                        Op::Touch { expiry_unix } => {
                            let old = table
                                .get(&**key)
                                .map_err(|e| TierError::redb("reading", e))?
                                .and_then(|v| Record::decode(v.value()));
                            if let Some(mut r) = old {
                                r.expiry_unix = *expiry_unix;
                                table
                                    .insert(&**key, r.encode().as_slice())
                                    .map_err(|e| TierError::redb("writing", e))?;
                            }
                        }
                    }
                }
            }
            txn.commit().map_err(|e| TierError::redb("committing", e))
        })
        .await
    }

    async fn clear(&self) -> Result<(), TierError> {
        let db = self.db.clone();
        blocking(move || {
            let txn = db
                .begin_write()
                .map_err(|e| TierError::redb("beginning a transaction", e))?;
            txn.delete_table(ITEMS)
                .map_err(|e| TierError::redb("dropping the table", e))?;
            txn.open_table(ITEMS)
                .map_err(|e| TierError::redb("creating the table", e))?;
            txn.commit().map_err(|e| TierError::redb("committing", e))
        })
        .await
    }

    fn describe(&self) -> String {
        format!("redb:{}", self.path.display())
    }
}
