//! Why a backing-store operation failed. Every failure is retryable from the tier's point
//! of view (the write-back engine keeps the data and retries with backoff); the variants say
//! which store and which step, for logs and `SERVER_ERROR` lines.

/// A backing store's failure.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The specification (`--backing-store`) is not `redb:PATH` or `postgres://…`.
    #[error("backing store {0:?}: expected redb:PATH or postgres://…")]
    Spec(String),
    /// A PostgreSQL table name that is not a plain identifier.
    #[error("tier.postgres_table {0:?}: expected letters, digits and _ (not first), at most 63")]
    TableName(String),
    /// redb failed (opening, a transaction, a table, a commit).
    #[error("redb {what}: {source}")]
    Redb {
        /// the step
        what: &'static str,
        /// redb's error
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// PostgreSQL failed (a connection from the pool, a statement, a commit).
    #[error("postgres {what}: {source}")]
    Postgres {
        /// the step
        what: &'static str,
        /// the client's or the pool's error
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored record could not be decoded (the file or table holds something else).
    #[error("corrupt record for a key: {0}")]
    Corrupt(&'static str),
    /// The blocking task running a redb call was lost (the runtime is shutting down).
    #[error("the store's worker task ended: {0}")]
    Worker(String),
}

impl TierError {
    pub(crate) fn redb(
        what: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        TierError::Redb {
            what,
            source: Box::new(e),
        }
    }

    pub(crate) fn postgres(
        what: &'static str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        TierError::Postgres {
            what,
            source: Box::new(e),
        }
    }
}
