//! The database: the buffer pool, the catalog of tables, and sessions.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use lastpage_storage::buffer::BufferPool;
use lastpage_storage::stats::{self, AttributionGuard, WaitAccumulator, WaitSnapshot};
use lastpage_storage::sync::{AtomicU32, AtomicU64, Ordering};

use crate::error::{EngineError, Result};
use crate::schema::TableDef;
use crate::table::{Table, TableCheck};

/// How a database is opened. Durable storage (a directory with a data file and a log) comes
/// with the write-ahead log; today every database lives in memory.
#[derive(Clone, Debug, Default)]
pub struct DatabaseOptions {}

struct Inner {
    pool: Arc<BufferPool>,
    /// The catalog. Read on every table lookup and written only by DDL, so a reader/writer lock
    /// (the lesson of seed 003's CMED_HASH_SET spinlock): lookups never exclude each other.
    tables: RwLock<HashMap<String, Arc<Table>>>,
    next_table_id: AtomicU32,
    next_index_id: AtomicU32,
    next_session_id: AtomicU64,
}

/// An embedded lastpage database. Cloning it is cheap and shares the database.
#[derive(Clone)]
pub struct Database {
    inner: Arc<Inner>,
}

impl Database {
    /// Creates an empty database.
    pub fn create(_options: DatabaseOptions) -> Result<Database> {
        Ok(Database {
            inner: Arc::new(Inner {
                pool: Arc::new(BufferPool::new()),
                tables: RwLock::new(HashMap::new()),
                next_table_id: AtomicU32::new(1),
                next_index_id: AtomicU32::new(1),
                next_session_id: AtomicU64::new(1),
            }),
        })
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.inner.pool
    }

    fn catalog_key(name: &str) -> String {
        name.to_ascii_lowercase()
    }

    /// Creates a table.
    pub fn create_table(&self, definition: TableDef) -> Result<Arc<Table>> {
        let key = Self::catalog_key(&definition.name);
        let mut tables = self
            .inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if tables.contains_key(&key) {
            return Err(EngineError::TableExists(definition.name));
        }
        let id = self.inner.next_table_id.fetch_add(1, Ordering::Relaxed);
        let table = Arc::new(Table::create(id, definition, &self.inner.pool, || {
            self.inner.next_index_id.fetch_add(1, Ordering::Relaxed)
        })?);
        tables.insert(key, Arc::clone(&table));
        Ok(table)
    }

    /// The table called `name` (case-insensitive).
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.inner
            .tables
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&Self::catalog_key(name))
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(name.to_owned()))
    }

    /// Removes a table from the catalog. Its pages stay allocated until the database closes:
    /// page reuse arrives with the data file's free-space map.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&Self::catalog_key(name))
            .map(|_| ())
            .ok_or_else(|| EngineError::UnknownTable(name.to_owned()))
    }

    /// Every table, in name order.
    pub fn tables(&self) -> Vec<Arc<Table>> {
        let mut tables: Vec<Arc<Table>> = self
            .inner
            .tables
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        tables.sort_by(|a, b| a.name().cmp(b.name()));
        tables
    }

    /// Opens a session: the unit that wait statistics are attributed to.
    pub fn session(&self) -> Session {
        Session {
            id: self.inner.next_session_id.fetch_add(1, Ordering::Relaxed),
            waits: Arc::new(WaitAccumulator::new()),
        }
    }

    /// Checks every table (see [`Table::check_integrity`]).
    pub fn check_integrity(&self) -> Result<Vec<TableCheck>> {
        self.tables()
            .iter()
            .map(|table| table.check_integrity())
            .collect()
    }

    /// Process-wide wait statistics, like `sys.dm_os_wait_stats`.
    pub fn wait_stats(&self) -> WaitSnapshot {
        stats::snapshot()
    }

    /// Clears the process-wide wait statistics.
    pub fn clear_wait_stats(&self) {
        stats::clear();
    }
}

/// A session. Every operation takes one, and the waits it incurs are attributed to it (like
/// `sys.dm_exec_session_wait_stats`). A session is used by one thread at a time.
pub struct Session {
    id: u64,
    waits: Arc<WaitAccumulator>,
}

impl Session {
    /// The session id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The waits this session has incurred.
    pub fn waits(&self) -> WaitSnapshot {
        self.waits.snapshot()
    }

    /// Attributes this thread's waits to the session until the guard drops.
    pub(crate) fn attribute(&self) -> AttributionGuard {
        stats::attribute_waits_to(Arc::clone(&self.waits))
    }

    /// Runs `statement`, attributing its waits to the session and to a fresh per-statement
    /// accumulator, whose totals are returned with the result (per-statement runtime stats).
    pub fn run_statement<T>(&self, statement: impl FnOnce() -> T) -> (T, WaitSnapshot) {
        let statement_waits = Arc::new(WaitAccumulator::new());
        let result = {
            let _session = self.attribute();
            let _statement = stats::attribute_waits_to(Arc::clone(&statement_waits));
            statement()
        };
        (result, statement_waits.snapshot())
    }
}
