//! The server backing store: a table in a PostgreSQL database (`--backing-store
//! postgres://user@host:port/db`), reached through tokio-postgres and a deadpool pool.
//!
//! The table (`tier.postgres_table`, created if missing) is `key bytea PRIMARY KEY, value
//! bytea, flags int8, expiry int8`. A batch is one transaction of at most three statements
//! (every put as one `INSERT … ON CONFLICT DO UPDATE` over `unnest` arrays, every delete as
//! one `DELETE … = ANY`, every touch as one `UPDATE … FROM unnest`): a batch of hundreds of
//! keys costs one round trip per statement, and it commits durably with the server's default
//! `synchronous_commit`. The pool bounds the connections (`tier.postgres_pool_size`) and how
//! long a caller waits for one (`tier.postgres_timeout_ms`, also the connect timeout), so a
//! stopped server fails calls promptly instead of hanging them; the pool drops a broken
//! connection and opens a new one once the server is back.

use crate::backing::BackingStore;
use crate::error::TierError;
use crate::record::{Op, Record};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::NoTls;

/// PostgreSQL settings beyond the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// The table holding the records (a plain identifier).
    pub table: String,
    /// Connections in the pool at most.
    pub pool_size: usize,
    /// Bound on connecting and on waiting for a pooled connection.
    pub timeout: Duration,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            table: "cellcache_items".into(),
            pool_size: 8,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A table in a PostgreSQL server.
pub struct PostgresStore {
    pool: Pool,
    /// `host:port/db`, the URL without its credentials.
    name: String,
    sql: Statements,
}

/// The statements, with the table's name in place.
struct Statements {
    get: String,
    put: String,
    delete: String,
    touch: String,
    clear: String,
}

/// Checks that `table` is a plain identifier, so it can be put into SQL as is.
pub fn check_table_name(table: &str) -> Result<(), TierError> {
    let mut chars = table.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && table.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(TierError::TableName(table.to_string()))
    }
}

impl PostgresStore {
    /// Builds the pool for `url`, checks the server answers and creates the table if missing.
    pub async fn connect(url: &str, config: &PostgresConfig) -> Result<PostgresStore, TierError> {
        check_table_name(&config.table)?;
        let mut pg: tokio_postgres::Config = url
            .parse()
            .map_err(|e| TierError::postgres("parsing the URL", e))?;
        pg.connect_timeout(config.timeout);
        let name = describe(&pg);
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.timeout))
            .create_timeout(Some(config.timeout))
            .recycle_timeout(Some(config.timeout))
            .build()
            .map_err(|e| TierError::postgres("building the pool", e))?;
        let t = &config.table;
        let store = PostgresStore {
            pool,
            name,
            sql: Statements {
                get: format!("SELECT value, flags, expiry FROM {t} WHERE key = $1"),
                put: format!(
                    "INSERT INTO {t} (key, value, flags, expiry) \
                     SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int8[]) \
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, \
                     flags = EXCLUDED.flags, expiry = EXCLUDED.expiry"
                ),
                delete: format!("DELETE FROM {t} WHERE key = ANY($1::bytea[])"),
                touch: format!(
                    "UPDATE {t} SET expiry = v.expiry \
                     FROM unnest($1::bytea[], $2::int8[]) AS v(key, expiry) WHERE {t}.key = v.key"
                ),
                clear: format!("TRUNCATE {t}"),
            },
        };
        let client = store.client().await?;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (key bytea PRIMARY KEY, value bytea NOT NULL, \
                 flags int8 NOT NULL, expiry int8 NOT NULL)"
            ))
            .await
            .map_err(|e| TierError::postgres("creating the table", e))?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, TierError> {
        self.pool
            .get()
            .await
            .map_err(|e| TierError::postgres("getting a connection", e))
    }
}

/// `host:port/db` of a connection configuration (never its password).
fn describe(pg: &tokio_postgres::Config) -> String {
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    format!("postgres://{host}:{port}/{}", pg.get_dbname().unwrap_or(""))
}

#[async_trait::async_trait]
impl BackingStore for PostgresStore {
    async fn get(&self, key: &[u8]) -> Result<Option<Record>, TierError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.sql.get, &[&key])
            .await
            .map_err(|e| TierError::postgres("reading", e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let value: Vec<u8> = row
            .try_get(0)
            .map_err(|e| TierError::postgres("value", e))?;
        let flags: i64 = row
            .try_get(1)
            .map_err(|e| TierError::postgres("flags", e))?;
        let expiry: i64 = row
            .try_get(2)
            .map_err(|e| TierError::postgres("expiry", e))?;
        Ok(Some(Record {
            value: Arc::from(value),
            flags: u32::try_from(flags).map_err(|_| TierError::Corrupt("flags out of range"))?,
            expiry_unix: u32::try_from(expiry)
                .map_err(|_| TierError::Corrupt("expiry out of range"))?,
        }))
    }

    async fn apply(&self, batch: &[(Arc<[u8]>, Op)]) -> Result<(), TierError> {
        let (mut put_keys, mut values, mut flags, mut expiries) = (vec![], vec![], vec![], vec![]);
        let (mut deletes, mut touch_keys, mut touch_expiries) = (vec![], vec![], vec![]);
        for (key, op) in batch {
            match op {
                Op::Put(r) => {
                    put_keys.push(&**key);
                    values.push(&*r.value);
                    flags.push(i64::from(r.flags));
                    expiries.push(i64::from(r.expiry_unix));
                }
                Op::Delete => deletes.push(&**key),
                Op::Touch { expiry_unix } => {
                    touch_keys.push(&**key);
                    touch_expiries.push(i64::from(*expiry_unix));
                }
            }
        }
        let mut client = self.client().await?;
        let txn = client
            .transaction()
            .await
            .map_err(|e| TierError::postgres("beginning a transaction", e))?;
        if !put_keys.is_empty() {
            txn.execute(&self.sql.put, &[&put_keys, &values, &flags, &expiries])
                .await
                .map_err(|e| TierError::postgres("writing", e))?;
        }
        if !deletes.is_empty() {
            txn.execute(&self.sql.delete, &[&deletes])
                .await
                .map_err(|e| TierError::postgres("deleting", e))?;
        }
        if !touch_keys.is_empty() {
            txn.execute(&self.sql.touch, &[&touch_keys, &touch_expiries])
                .await
                .map_err(|e| TierError::postgres("touching", e))?;
        }
        txn.commit()
            .await
            .map_err(|e| TierError::postgres("committing", e))
    }

    async fn clear(&self) -> Result<(), TierError> {
        let client = self.client().await?;
        client
            .batch_execute(&self.sql.clear)
            .await
            .map_err(|e| TierError::postgres("clearing", e))
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_table_name("cellcache_items").is_ok());
        assert!(check_table_name("_t1").is_ok());
        assert!(check_table_name("1t").is_err());
        assert!(check_table_name("t; DROP TABLE x").is_err());
        assert!(check_table_name("").is_err());
        assert!(check_table_name(&"a".repeat(64)).is_err());
    }
}
