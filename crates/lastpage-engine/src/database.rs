//! The database: the buffer pool, the catalog of tables, sessions, and (for a database opened
//! from a directory) the write-ahead log, checkpoints and recovery.
//!
//! A durable database is a directory with three things in it: `data.lp`, the data file whose
//! checkpoint images hold every page and the catalog (see `docs/data-file.md`), `wal/`, the
//! log (see `docs/wal-format.md`), and `lock`, which an open handle holds locked so that one
//! handle at a time opens the directory. The log is logical: it records rows inserted, deleted and
//! updated, and schema changes, and recovery replays it onto the last checkpoint image (see
//! `docs/recovery.md`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};
use std::time::{Duration, Instant};

use lastpage_io::{FileSystem, StdFileSystem};
use lastpage_storage::buffer::{BufferPool, PageError, PoolConfig};
use lastpage_storage::limits::{
    CHECKPOINT_LOG_BYTES, CHECKPOINT_POLL_INTERVAL_MS, CHECKPOINT_RETRY_MAX_MS,
    DELAYED_FLUSH_INTERVAL_MS, LOCK_ESCALATION_THRESHOLD, LOCK_MANAGER_DEFAULT_SHARDS,
    MAX_POOL_PAGES, MAX_TREE_ROWS, MAX_TXN_ID, MEMORY_BUDGET_BYTES, OPEN_LOCK_WAIT_MS,
    RECOVERY_WRITE_BACK_PAUSE_MS, UNDO_KEPT_ENTRIES, UNDO_SPARE_KEPT_ENTRIES, WAL_MAX_END_LSN,
    WAL_ROW_CHANGE_MAX_BYTES,
};
use lastpage_storage::stats::{self, AttributionGuard, WaitAccumulator, WaitSnapshot};
use lastpage_storage::sync::{self, AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering};
use lastpage_storage::wal::{
    ExpectedEnd, LogWriter, Lsn, Record, TxnId, WalConfig, WalError, WalStats,
};

use crate::catalog::{Catalog, DroppedTree, table_name_key};
use crate::ended_writes::EndedWrites;
use crate::error::{EngineError, Result};
use crate::locks::LockManager;
use crate::recovery::{self, RecoveryStats};
use crate::schema::{IndexOptions, TableDef};
use crate::table::{Table, TableCheck};
use crate::txn::{ActiveSlot, Durability, NO_ACTIVE_LSN, Transaction};

/// Transaction ids a thread takes at a time (see [`Database::next_txn_id`]).
const TXN_ID_BLOCK: u64 = 1024;

/// Name of the data file inside a database directory.
pub const DATA_FILE_NAME: &str = "data.lp";
/// Name of the lock file inside a database directory.
pub const LOCK_FILE_NAME: &str = "lock";
/// Name of the log directory inside a database directory.
pub const WAL_DIR_NAME: &str = "wal";

/// How a database is opened.
#[derive(Clone)]
pub struct DatabaseOptions {
    /// The durability of transactions that do not choose one.
    pub durability: Durability,
    /// Memory the buffer pool may use for pages of a durable database, in bytes. An in-memory
    /// database ([`Database::create`]) keeps every page.
    pub memory_budget_bytes: usize,
    /// A checkpoint starts by itself once this much log was written since the last one.
    pub checkpoint_log_bytes: u64,
    /// How long a DELAYED commit may stay in the log buffer before a background flush; longer
    /// than zero ([`Database::open`] refuses zero, which would make the flusher spin).
    pub delayed_flush_interval: Duration,
    /// How long a lock request waits before failing (SET LOCK_TIMEOUT); `None` waits forever
    /// (deadlocks are still detected).
    pub lock_timeout: Option<Duration>,
    /// How many row locks a transaction may take on one table before it tries to trade them
    /// for one lock on the whole table (lock escalation, checked between the statements of an
    /// explicit transaction; see `docs/locking.md`). `None` never escalates, like SQL Server's
    /// `LOCK_ESCALATION = DISABLE`. By default `LOCK_ESCALATION_THRESHOLD` (5,000, SQL
    /// Server's).
    pub lock_escalation_threshold: Option<usize>,
    /// Undo entries an explicit transaction in a durable database keeps in memory between its
    /// statements (by default `UNDO_KEPT_ENTRIES`); past this many, its changes to logged
    /// tables leave the undo list and a rollback undoes them from the log (see `txn.rs`).
    /// Tests set it low to have transactions do so often. At least 1.
    pub undo_kept_entries: usize,
    /// The log's buffer and segment sizes.
    pub wal: WalConfig,
    /// The file system a durable database uses; `None` is the real one. Tests pass a
    /// fault-injecting one.
    pub file_system: Option<Arc<dyn FileSystem>>,
    /// The most pages the database may hold (SQL Server's MAXSIZE, in 8 KiB pages): a write
    /// that needs one more fails with [`EngineError::PoolFull`]. At most, and by default,
    /// `MAX_POOL_PAGES` (128 GiB less one page; a larger value counts as that). Tests set it
    /// low to reach a full database cheaply. Recovery at open is not held to it (only to
    /// `MAX_POOL_PAGES`): committed rows are replayed whatever pages they take.
    pub max_pages: usize,
}

impl Default for DatabaseOptions {
    fn default() -> Self {
        DatabaseOptions {
            durability: Durability::Full,
            memory_budget_bytes: MEMORY_BUDGET_BYTES,
            checkpoint_log_bytes: CHECKPOINT_LOG_BYTES,
            delayed_flush_interval: Duration::from_millis(DELAYED_FLUSH_INTERVAL_MS),
            lock_timeout: None,
            lock_escalation_threshold: Some(LOCK_ESCALATION_THRESHOLD),
            undo_kept_entries: UNDO_KEPT_ENTRIES,
            wal: WalConfig::default(),
            file_system: None,
            max_pages: MAX_POOL_PAGES,
        }
    }
}

impl std::fmt::Debug for DatabaseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseOptions")
            .field("durability", &self.durability)
            .field("memory_budget_bytes", &self.memory_budget_bytes)
            .field("checkpoint_log_bytes", &self.checkpoint_log_bytes)
            .field("delayed_flush_interval", &self.delayed_flush_interval)
            .field("lock_timeout", &self.lock_timeout)
            .field("lock_escalation_threshold", &self.lock_escalation_threshold)
            .field("undo_kept_entries", &self.undo_kept_entries)
            .field("wal", &self.wal)
            .field("file_system", &self.file_system.as_ref().map(|_| "custom"))
            .field("max_pages", &self.max_pages)
            .finish()
    }
}

/// What a checkpoint did.
#[derive(Clone, Debug, Default)]
pub struct CheckpointStats {
    /// Where recovery starts replaying committed work (the log's end when writers paused).
    pub checkpoint_lsn: u64,
    /// Where recovery starts reading (the first record of the oldest transaction then active).
    pub recovery_start_lsn: u64,
    /// How long writers were paused, in microseconds.
    pub pause_us: u64,
    /// The whole checkpoint, in microseconds.
    pub duration_us: u64,
    /// Log segment files removed (or kept as spares for later segments).
    pub segments_removed: usize,
    /// Why the removal of the log the image made unnecessary stopped short, if it did. The
    /// checkpoint succeeded all the same: its image is durable, old segments left behind are
    /// read by no open or recovery, and the next checkpoint removes them (see
    /// [`Database::log_truncation_failure`]).
    pub log_truncation_error: Option<String>,
}

/// The parts only a durable database has.
pub(crate) struct Durable {
    /// The directory's lock file, locked (see [`Database::open`]).
    _lock: Box<dyn lastpage_io::File>,
    dir: PathBuf,
    pub(crate) wal: LogWriter,
    /// Writers hold it shared from their change to the trees until its log record is
    /// appended; a checkpoint holds it exclusively while it captures the pages, so the image
    /// it writes is exactly the effect of the log before its checkpoint LSN.
    gate: RwLock<()>,
    /// One checkpoint at a time; holds the LSN of the last one.
    checkpoint: Mutex<u64>,
    /// What recovery did, set once it is done.
    recovery: std::sync::OnceLock<RecoveryStats>,
    /// The background log flusher's thread, which [`Database::request_log_flush`] wakes.
    flusher: std::sync::OnceLock<std::thread::Thread>,
    /// Set by [`Database::request_log_flush`] before it wakes the flusher, and cleared by the
    /// flusher before each flush. The wake-up alone can be lost: the flusher parks while it
    /// waits in the log's group commit, and that park uses up an unpark meant for its pause.
    flush_requested: AtomicBool,
    /// The automatic checkpointer's failures in a row, and the error of the last one, cleared
    /// by its next success (see [`Database::automatic_checkpoint_failure`]).
    automatic_failure: Mutex<Option<(u32, String)>>,
    /// Checkpoints in a row whose removal of old log failed, and the last one's error, cleared
    /// by the next checkpoint whose removal succeeds (see [`Database::log_truncation_failure`]).
    truncation_failure: Mutex<Option<(u32, String)>>,
}

struct Inner {
    pool: Arc<BufferPool>,
    /// The catalog. Read on every table lookup and written only by DDL, so a reader/writer lock
    /// (the lesson of seed 003's CMED_HASH_SET spinlock): lookups never exclude each other.
    tables: RwLock<HashMap<String, Arc<Table>>>,
    next_table_id: AtomicU32,
    next_index_id: AtomicU32,
    next_session_id: AtomicU64,
    next_txn_id: AtomicU64,
    locks: LockManager,
    options: DatabaseOptions,
    durable: Option<Durable>,
    /// Every live session's active-transaction slot, for checkpoints.
    sessions: Mutex<Vec<Weak<ActiveSlot>>>,
    /// This database object's number in the process, unique for the process's life (an
    /// address could be reused by a later database).
    instance: u64,
    /// Statements rolled back and transactions ended holding row locks, so far (see
    /// `ended_writes.rs`).
    ended_writes: EndedWrites,
    /// The failure that stopped the database, if one did: once the log could not be made
    /// durable, or a rollback could not undo all of its changes, nothing in memory can be
    /// trusted to match what was committed, so every operation is refused until the database
    /// is reopened (and recovered from its log).
    failure: std::sync::OnceLock<String>,
    /// Set by [`Database::close`] (for a durable database under the checkpoint gate, with the
    /// capture of the image it marks clean): from then on every statement through any clone is
    /// refused. A change after that image would not be in it, and one to a table that is not
    /// logged would not be in the log either, so the next open would trust a clean image that
    /// lost it.
    closed: AtomicBool,
    /// What dropped tables left whose pages are not free yet (see
    /// [`Database::reclaim_dropped_tables`]).
    dropped: Mutex<Dropped>,
    /// Counters of undo entries let go and of changes undone from the log.
    undo: crate::txn::UndoCounters,
}

/// The trees of dropped tables, waiting for their pages to be freed.
#[derive(Default)]
struct Dropped {
    /// Dropped tables that something may still use: a statement that was past its check when
    /// the drop came, a transaction that changed the table (its undo holds the table), or a
    /// handle the application kept. Their trees are taken once nothing else holds them.
    tables: Vec<Arc<Table>>,
    /// Trees nothing uses, whose pages are still to be freed: those of dropped tables, and
    /// those a checkpoint's catalog listed as dropped. A tree stays here while freeing it fails
    /// (an inner page that cannot be read), and every checkpoint's catalog names it.
    trees: Vec<lastpage_storage::btree::BTree>,
}

/// An embedded lastpage database. Cloning it is cheap and shares the database.
///
/// Dropping the last handle (sessions hold one each) stops the background threads, waiting
/// for an automatic checkpoint in progress to finish, so that the directory can be opened
/// again at once. It does not flush the log: call [`Database::close`] for a clean shutdown.
#[derive(Clone)]
pub struct Database {
    /// Present in the handles users and sessions hold; absent in the ones the background
    /// threads make for the length of a tick. Declared before `inner` so that it is dropped
    /// first: the threads are joined before this handle lets go of the database.
    _handle: Option<Arc<Handle>>,
    inner: Arc<Inner>,
}

/// What the last user handle's drop stops: the background threads of a durable database.
struct Handle {
    /// Set when the last user handle goes; each thread checks it whenever it wakes.
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for thread in std::mem::take(&mut self.threads) {
            thread.thread().unpark();
            // A background thread that panicked has nothing left to stop.
            let _ = thread.join();
        }
    }
}

impl Database {
    /// Creates an empty in-memory database: nothing is logged or written to disk, and
    /// transactions and locks work as in a durable one.
    pub fn create(options: DatabaseOptions) -> Result<Database> {
        Ok(Database::assemble(
            Arc::new(BufferPool::with_max_pages(options.max_pages)),
            options,
            None,
            None,
        ))
    }

    fn assemble(
        pool: Arc<BufferPool>,
        options: DatabaseOptions,
        durable: Option<Durable>,
        catalog: Option<&Catalog>,
    ) -> Database {
        Database {
            _handle: None,
            inner: Arc::new(Inner {
                pool,
                tables: RwLock::new(HashMap::new()),
                next_table_id: AtomicU32::new(catalog.map_or(1, |c| c.next_table_id)),
                next_index_id: AtomicU32::new(catalog.map_or(1, |c| c.next_index_id)),
                next_session_id: AtomicU64::new(1),
                next_txn_id: AtomicU64::new(catalog.map_or(1, |c| c.next_txn_id)),
                locks: LockManager::new(LOCK_MANAGER_DEFAULT_SHARDS),
                options,
                durable,
                sessions: Mutex::new(Vec::new()),
                ended_writes: EndedWrites::default(),
                failure: std::sync::OnceLock::new(),
                closed: AtomicBool::new(false),
                dropped: Mutex::new(Dropped::default()),
                undo: Default::default(),
                instance: {
                    // A plain counter, not part of any protocol, and a static, which loom's
                    // atomics cannot be: std's, like table.rs's uniquifier blocks.
                    static INSTANCES: std::sync::atomic::AtomicU64 =
                        std::sync::atomic::AtomicU64::new(1);
                    INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                },
            }),
        }
    }

    /// Opens the durable database in directory `dir`, creating it if it does not exist.
    ///
    /// An existing database is recovered: its last checkpoint image is loaded, the log after it
    /// is replayed so that every committed transaction is present and no uncommitted change
    /// is, the log's torn tail (if a crash left one) is cut off, and a checkpoint is taken if
    /// anything was replayed or the last shutdown was clean (see `docs/recovery.md`).
    /// [`Database::recovery_stats`] says what that took.
    pub fn open(dir: impl AsRef<Path>, options: DatabaseOptions) -> Result<Database> {
        let dir = dir.as_ref().to_path_buf();
        if options.wal.max_record_bytes() < WAL_ROW_CHANGE_MAX_BYTES {
            return Err(EngineError::Storage(format!(
                "the log buffer of {} bytes cannot hold the largest row change ({} bytes): every \
                 change must be loggable, or a statement could fail the whole database",
                options.wal.buffer_bytes, WAL_ROW_CHANGE_MAX_BYTES
            )));
        }
        if options.delayed_flush_interval.is_zero() {
            // The background flusher pauses this long between flushes; without a pause it would
            // spin on a core for as long as the database is open.
            return Err(EngineError::Storage(
                "the DELAYED flush interval must be longer than zero (Durability::Full flushes \
                 at every commit)"
                    .into(),
            ));
        }
        let fs: Arc<dyn FileSystem> = options
            .file_system
            .clone()
            .unwrap_or_else(|| Arc::new(StdFileSystem));
        let io = |what: &str, error: std::io::Error| {
            EngineError::Storage(format!("{what} {}: {error}", dir.display()))
        };
        // The directory's name must be durable before any commit in it is acknowledged: a
        // crash that lost it would lose the whole database. The log writer makes `wal/`
        // durable in it, and the pool the data file, but nothing else synced its parent.
        lastpage_io::create_dir_all_durable(fs.as_ref(), &dir)
            .map_err(|error| io("creating and syncing", error))?;
        // One process, one handle: two writers of the same files would destroy each other's
        // checkpoint images and log. The lock lives as long as the database.
        let lock = fs
            .open(
                &dir.join(LOCK_FILE_NAME),
                lastpage_io::OpenOptions::create(),
            )
            .map_err(|error| io("locking", error))?;
        // Another handle may be going away at this moment (its last drop joins its background
        // threads, which can take as long as a checkpoint in progress; or another process is
        // exiting), so an open waits a little before it gives up.
        let deadline = Instant::now() + Duration::from_millis(OPEN_LOCK_WAIT_MS);
        while !lock.try_lock().map_err(|error| io("locking", error))? {
            if Instant::now() >= deadline {
                return Err(EngineError::Storage(format!(
                    "the database in {} is already open (in this or another process)",
                    dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        let (pool, image) = BufferPool::open_file(
            Arc::clone(&fs),
            &dir.join(DATA_FILE_NAME),
            PoolConfig {
                memory_budget_bytes: options.memory_budget_bytes,
                // Replay is not held to the configured limit (it is set below, once the
                // database is open): it redoes the committed rows, not the pages they were
                // on, and a tree built again in commit order, without the splits that failed
                // statements and rolled-back rows left, can take more pages than before. A
                // crash of a database at its limit then made every open fail with 'replaying
                // a committed change failed: the buffer pool is full'.
                max_pages: MAX_POOL_PAGES,
            },
        )
        .map_err(|error| EngineError::Storage(error.to_string()))?;
        let catalog = image.as_deref().map(Catalog::decode).transpose()?;
        if let Some(catalog) = &catalog
            && catalog.next_txn_id > MAX_TXN_ID
        {
            return Err(EngineError::CorruptCatalog(format!(
                "the next transaction id {} is beyond any the database hands out ({MAX_TXN_ID})",
                catalog.next_txn_id
            )));
        }
        // No log reaches past its last possible segment (a segment header starting beyond
        // `WAL_MAX_START_LSN` is invalid): a checkpoint naming such a position is damage, and
        // recovery would start reading the log there.
        if let Some(catalog) = &catalog
            && (catalog.checkpoint_lsn > WAL_MAX_END_LSN
                || catalog.oldest_active_lsn > WAL_MAX_END_LSN)
        {
            return Err(EngineError::CorruptCatalog(format!(
                "the checkpoint LSN {} or recovery start LSN {} is beyond any log position \
                 ({WAL_MAX_END_LSN})",
                catalog.checkpoint_lsn, catalog.oldest_active_lsn
            )));
        }
        let pool = Arc::new(pool);
        // Recovery runs on a database without a log: replayed changes are not logged again.
        let db = Database::assemble(Arc::clone(&pool), options.clone(), None, catalog.as_ref());
        if let Some(catalog) = &catalog {
            for entry in &catalog.tables {
                db.attach_table(entry)?;
            }
            db.attach_dropped_trees(&catalog.dropped_trees)?;
            // Before the replay, which may need the pages.
            db.reclaim_dropped_tables();
        }
        let wal_dir = dir.join(WAL_DIR_NAME);
        let mut recovery = replay_writing_back(&db, &pool, Arc::clone(&fs), &wal_dir, &catalog)?;
        let checkpoint_lsn = catalog.as_ref().map_or(0, |catalog| catalog.checkpoint_lsn);
        // The writer must find the log ending where replay stopped, and not before the
        // checkpoint; otherwise part of the log is missing or damaged, and both appending to
        // it and the checkpoint below would make the loss permanent.
        let wal = LogWriter::open_expecting(
            Arc::clone(&fs),
            wal_dir.clone(),
            options.wal,
            Some(ExpectedEnd {
                replayed_to: Lsn(recovery.log_end),
                at_least: Lsn(checkpoint_lsn),
            }),
        )
        .map_err(|error| EngineError::Storage(error.to_string()))?;
        recovery.log_end = wal.start_lsn().0;
        let inner = Arc::into_inner(db.inner).expect("nobody else holds the database yet");
        let db = Database {
            _handle: None,
            inner: Arc::new(Inner {
                durable: Some(Durable {
                    _lock: lock,
                    dir,
                    wal,
                    gate: RwLock::new(()),
                    checkpoint: Mutex::new(checkpoint_lsn),
                    recovery: std::sync::OnceLock::new(),
                    flusher: std::sync::OnceLock::new(),
                    flush_requested: AtomicBool::new(false),
                    automatic_failure: Mutex::new(None),
                    truncation_failure: Mutex::new(None),
                }),
                ..inner
            }),
        };
        // Before the pool writes a dirty page out, the log must be durable up to every change
        // the page holds (the WAL rule). The pool cannot know the page's LSN, so it flushes
        // the whole log: evictions come in batches, so this is one flush per batch.
        // Once the database is gone, a `Table` handle kept beyond it still reaches the pool;
        // its pages must not be written then: the directory's lock went with the database, and
        // another handle may have opened the files and reused the slots this pool thinks free.
        let weak = Arc::downgrade(&db.inner);
        pool.set_before_write_hook(Box::new(move || {
            let Some(inner) = weak.upgrade() else {
                return Err(
                    "the database is closed: a table handle kept beyond its database \
                            cannot write its pages"
                        .into(),
                );
            };
            match &inner.durable {
                Some(durable) => durable.wal.flush_now().map(|_| ()).map_err(|error| {
                    // A failed flush fails the log for good, wherever it happens: here, ahead
                    // of an eviction or of a checkpoint's page writes, as much as in a commit.
                    // So the database stops here too (as `Database::fail` does), refusing reads
                    // and every later operation with the log's own error. Before, only the next
                    // write noticed: until then reads went on over rows the log could no longer
                    // make durable, and the checkpoint that ran into the failure reported only
                    // "the before-write hook (the log flush) failed", not that the log had
                    // failed, nor why.
                    let message = error.to_string();
                    let _ = inner.failure.set(message.clone());
                    message
                }),
                None => Ok(()),
            }
        }));
        let replayed = recovery.records > 0 || catalog.is_none();
        // Clean if the image says so and no change was logged after it. Records before it are
        // those of transactions still open at the close, read only to undo them: they never
        // touch a table that is not logged (a close with such a change open is not clean).
        // A commit or an identity reservation racing the close may land after it (their
        // checks of the close run outside the checkpoint gate): they change no row.
        let clean = catalog
            .as_ref()
            .is_some_and(|catalog| catalog.clean_shutdown)
            && recovery.changes_after_checkpoint == 0;
        if !clean {
            // Not a clean shutdown: a table that is not logged may hold any mix of its
            // changes, with no log to repair it, so it starts empty (as PostgreSQL's UNLOGGED
            // tables do).
            for table in db.tables().iter().filter(|table| !table.is_logged()) {
                db.recreate_table(&table.catalog_entry())?;
            }
            // The emptied tables' old trees (a checkpoint below would free them too, but
            // not every open takes one).
            db.reclaim_dropped_tables();
        }
        // After a clean shutdown a checkpoint still clears the image's clean mark, so that a
        // crash from here on is told apart from a clean shutdown.
        let checkpoint = if replayed || clean {
            Some(db.checkpoint()?)
        } else {
            None
        };
        recovery.checkpoint_us = checkpoint.map_or(0, |stats| stats.duration_us);
        // From here on new pages count against the configured limit; a database that
        // recovery took past it keeps its pages, and only writes that need more fail.
        pool.set_max_pages(db.inner.options.max_pages);
        recovery.duration = started.elapsed();
        if let Some(durable) = db.durable() {
            let _ = durable.recovery.set(recovery);
        }
        Ok(db.start_background())
    }

    /// Starts the threads that flush DELAYED commits and take automatic checkpoints, and
    /// returns the database as a user handle, whose last drop stops them. They hold only a
    /// weak reference between ticks. They are two threads so that a long checkpoint never
    /// holds up the flushes that bound DELAYED commits.
    fn start_background(self) -> Database {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let interval = self.inner.options.delayed_flush_interval;
        let flusher =
            self.spawn_background("lastpage-log-flusher", interval, &stop, |db, durable| {
                // A request that comes during a flush may end up in the flag only (see
                // `Durable::flush_requested`): flush again until none came, or the requested
                // commit would wait a whole interval. The swap reads the requester's store, so
                // the flush after it covers what the requester appended.
                loop {
                    durable.flush_requested.swap(false, Ordering::AcqRel);
                    if durable.wal.durable_lsn() < durable.wal.end_lsn()
                        && let Err(error) = durable.wal.flush_in_background()
                    {
                        db.fail(error);
                        return false;
                    }
                    if !durable.flush_requested.load(Ordering::Acquire) {
                        return true;
                    }
                }
            });
        if let (Some(durable), Some(flusher)) = (self.durable(), &flusher) {
            let _ = durable.flusher.set(flusher.thread().clone());
        }
        let poll = Duration::from_millis(CHECKPOINT_POLL_INTERVAL_MS);
        // After a failed attempt the next waits until this instant (see
        // `CHECKPOINT_RETRY_MAX_MS`). Only the checkpointer's thread reads and writes it.
        let retry_at = std::cell::Cell::new(None::<Instant>);
        let checkpointer =
            self.spawn_background("lastpage-checkpointer", poll, &stop, move |db, durable| {
                let since = durable
                    .wal
                    .end_lsn()
                    .0
                    .saturating_sub(*sync::lock(&durable.checkpoint));
                if since >= db.inner.options.checkpoint_log_bytes
                    && db.check_usable().is_ok()
                    && retry_at.get().is_none_or(|at| Instant::now() >= at)
                {
                    // A failed automatic checkpoint (a full disk, say) leaves the previous image
                    // in force: it is kept for `automatic_checkpoint_failure`, and the next
                    // attempt waits longer each time. One that failed the data file stops the
                    // database (`Database::fail_checkpoint`), and every later operation reports
                    // that instead.
                    let result = db.checkpoint();
                    let mut failure = sync::lock(&durable.automatic_failure);
                    match result {
                        Ok(_) => {
                            *failure = None;
                            retry_at.set(None);
                        }
                        Err(error) => {
                            let failures = failure.as_ref().map_or(0, |(n, _)| *n) + 1;
                            let wait_ms = CHECKPOINT_POLL_INTERVAL_MS
                                .saturating_mul(1 << failures.min(16))
                                .min(CHECKPOINT_RETRY_MAX_MS);
                            retry_at.set(Some(Instant::now() + Duration::from_millis(wait_ms)));
                            *failure = Some((failures, error.to_string()));
                        }
                    }
                }
                true
            });
        Database {
            _handle: Some(Arc::new(Handle {
                stop,
                threads: flusher.into_iter().chain(checkpointer).collect(),
            })),
            inner: self.inner,
        }
    }

    /// Runs `tick` every `interval`, and whenever the thread is unparked, on a thread of its
    /// own until it returns false, `stop` is set or the database is gone. Returns the thread,
    /// if it started.
    fn spawn_background(
        &self,
        name: &str,
        interval: Duration,
        stop: &Arc<std::sync::atomic::AtomicBool>,
        tick: impl Fn(&Database, &Durable) -> bool + Send + 'static,
    ) -> Option<std::thread::JoinHandle<()>> {
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::clone(stop);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                loop {
                    // The last user handle sets `stop`, unparks the thread and joins it. The
                    // flag is read before the pause too: an unpark that came during a tick may
                    // have been used up there (a tick parks when it waits in the log's group
                    // commit), and the pause would then last its whole interval (an hour, for
                    // some DELAYED settings) before the drop could return.
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        return;
                    }
                    // An unpark cuts the pause short; so may a spurious wake-up, which only
                    // costs one tick with nothing to do.
                    std::thread::park_timeout(interval);
                    // The last user handle sets `stop`, unparks the thread and joins it.
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        return;
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let db = Database {
                        _handle: None,
                        inner,
                    };
                    let Some(durable) = db.durable() else { return };
                    if !tick(&db, durable) {
                        return;
                    }
                }
            })
            .ok()
    }

    /// Wakes the background log flusher to flush what has been appended so far, without
    /// waiting for it (see [`Session::commit_pipelined`]).
    pub(crate) fn request_log_flush(&self) {
        if let Some(durable) = self.durable()
            && let Some(flusher) = durable.flusher.get()
        {
            durable.flush_requested.store(true, Ordering::Release);
            flusher.unpark();
        }
    }

    /// How many statements were rolled back and transactions ended holding row locks so far. A
    /// reader that sees it unchanged since before it read a row, and finds the row unlocked
    /// now (or holds its lock), knows the version it read is the row's current one, and read
    /// unlocked a committed one: see `ended_writes.rs`.
    pub(crate) fn ended_writes(&self) -> u64 {
        self.inner.ended_writes.count()
    }

    /// Counts a statement rolled back, or a transaction that held row locks ending; called
    /// after the last change (or undo) and before the locks are released.
    pub(crate) fn note_ended_write(&self) {
        self.inner.ended_writes.note();
    }

    pub(crate) fn durable(&self) -> Option<&Durable> {
        self.inner.durable.as_ref()
    }

    /// Whether the database has a log and a data file.
    pub fn is_durable(&self) -> bool {
        self.inner.durable.is_some()
    }

    /// The directory of a durable database.
    pub fn dir(&self) -> Option<&Path> {
        self.durable().map(|durable| durable.dir.as_path())
    }

    pub(crate) fn wal(&self) -> Option<&LogWriter> {
        self.durable().map(|durable| &durable.wal)
    }

    pub(crate) fn locks(&self) -> &LockManager {
        &self.inner.locks
    }

    /// The row lock manager's counters since the database was opened: locks granted, requests
    /// that waited, timeouts and deadlock victims.
    pub fn lock_stats(&self) -> crate::locks::LockStats {
        self.inner.locks.stats()
    }

    pub(crate) fn lock_timeout(&self) -> Option<Duration> {
        self.inner.options.lock_timeout
    }

    pub(crate) fn lock_escalation_threshold(&self) -> Option<usize> {
        self.inner.options.lock_escalation_threshold
    }

    pub(crate) fn undo_kept_entries(&self) -> usize {
        self.inner.options.undo_kept_entries.max(1)
    }

    /// Counters of transactions' undo lists since the database was opened: entries let go by
    /// large transactions, and changes their rollbacks undid from the log.
    pub fn undo_stats(&self) -> crate::txn::UndoStats {
        self.inner.undo.snapshot()
    }

    pub(crate) fn undo_counters(&self) -> &crate::txn::UndoCounters {
        &self.inner.undo
    }

    /// This database's instance number, unique in the process.
    pub(crate) fn instance(&self) -> u64 {
        self.inner.instance
    }

    pub(crate) fn default_durability(&self) -> Durability {
        self.inner.options.durability
    }

    /// A new transaction id. Threads take ids in blocks, so that concurrent autocommit
    /// statements do not all increment one shared counter; the counter (which checkpoints
    /// record) stays above every id handed out. Ids stop below `MAX_TXN_ID`, which the open
    /// refuses: only a catalog or log record damaged to lie near it can get there.
    pub(crate) fn next_txn_id(&self) -> Result<lastpage_storage::wal::TxnId> {
        thread_local! {
            /// The next id of this thread's block, the block's end, and whose block it is.
            static BLOCK: std::cell::Cell<(u64, u64, u64)> =
                const { std::cell::Cell::new((0, 0, 0)) };
        }
        let owner = self.inner.instance;
        BLOCK.with(|block| {
            let (mut next, mut end, block_owner) = block.get();
            if block_owner != owner || next == end {
                // The counter never passes the limit: checkpoints write it into the catalog,
                // whose open refuses a counter beyond it.
                next = self
                    .inner
                    .next_txn_id
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                        next.checked_add(TXN_ID_BLOCK)
                            .filter(|&end| end <= MAX_TXN_ID)
                    })
                    .map_err(|next| {
                        EngineError::Transaction(format!(
                            "the database's transaction ids are used up (the next is {next}, \
                             and ids stop at {MAX_TXN_ID})"
                        ))
                    })?;
                end = next + TXN_ID_BLOCK;
            }
            block.set((next + 1, end, owner));
            Ok(lastpage_storage::wal::TxnId(next))
        })
    }

    /// Enters the checkpoint gate (shared) if the database has one.
    pub(crate) fn enter_gate(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.durable().map(|durable| {
            durable
                .gate
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        })
    }

    /// Records a log failure: from now on the database refuses every operation.
    pub(crate) fn fail(&self, error: WalError) -> EngineError {
        let message = error.to_string();
        let _ = self.inner.failure.set(message.clone());
        EngineError::LogFailed(message)
    }

    /// The error for a checkpoint that failed with `error`. If the data file failed (a failed
    /// fdatasync, or a failed write of the meta slot, which may have reached the disk all the
    /// same), the buffer pool refuses every later checkpoint, since after a failed fdatasync
    /// nothing is known about the unsynced writes (fsyncgate). (A write of pages or of the
    /// image's page map that fails, for want of room say, fails only this checkpoint: a
    /// `Storage` error, and the next checkpoint tries again.) Commits could
    /// still go to the log, but the log would then grow without end, never to be truncated,
    /// until the disk filled, and a close could no longer write its clean image. So the
    /// database stops, as PostgreSQL does (a PANIC) when a checkpoint's fsync fails: every
    /// acknowledged commit is in the log, and the next open replays it over the last good
    /// image and takes a new one.
    fn fail_checkpoint(&self, error: PageError) -> EngineError {
        // A log flush that failed in the pool's before-write hook stopped the database (see
        // the hook in `Database::open`): that failure, which names the log's error, is what
        // this checkpoint ran into, not the pool's "the before-write hook failed".
        if let Err(stopped) = self.check_not_failed() {
            return stopped;
        }
        if !self.inner.pool.checkpoints_failed() {
            return EngineError::Storage(error.to_string());
        }
        self.stop(format!(
            "a checkpoint could not write or sync the data file ({error}), so no later \
             checkpoint can be trusted; every acknowledged commit is in the log"
        ))
    }

    /// Records that rolling back transaction `txn` failed with `error` part way: some of its
    /// changes are still in the trees, where the next statement could read them or commit on
    /// top of them. As SQL Server takes such a database offline and PostgreSQL escalates an
    /// error during abort to a PANIC, the database refuses every operation from now on; a
    /// durable database's next open undoes the transaction from its log (it has no commit
    /// record). Returns the error to report for the rollback.
    pub(crate) fn fail_rollback(&self, txn: TxnId, error: EngineError) -> EngineError {
        if matches!(error, EngineError::DatabaseClosed) {
            // Nothing can use the database after a close anyway, and its next open undoes the
            // transaction as above.
            return error;
        }
        let message = if self.is_durable() {
            format!(
                "rolling back transaction {} failed, so some of its changes could not be \
                 undone: {error}. The next open of the database undoes them from the log",
                txn.0
            )
        } else {
            format!(
                "rolling back transaction {} failed, so some of its changes could not be \
                 undone: {error}. An in-memory database has no log to undo them from: its \
                 contents can no longer be trusted",
                txn.0
            )
        };
        self.stop(message)
    }

    /// Records that a change stopped half done (`message` says where and why) and could not be
    /// taken back: its changes are in the trees but in neither the log nor an undo list, so
    /// only the last image and the log still hold the database's committed state. The database
    /// refuses every operation from now on, as after [`Database::fail_rollback`]; `message`
    /// is returned as is if the database had stopped already (it may be that failure's own
    /// error). Returns the error to report for the statement.
    pub(crate) fn fail_change(&self, message: String) -> EngineError {
        if self.inner.failure.get().is_some() {
            return EngineError::DatabaseFailed(message);
        }
        let message = if self.is_durable() {
            format!("{message}. The next open of the database returns to its committed state")
        } else {
            format!(
                "{message}. An in-memory database has no log to return to its committed state \
                 from: its contents can no longer be trusted"
            )
        };
        self.stop(message)
    }

    /// Stops the database with `message` (the first stop's message stays) and returns the
    /// error to report.
    fn stop(&self, message: String) -> EngineError {
        let _ = self.inner.failure.set(message.clone());
        EngineError::DatabaseFailed(message)
    }

    /// Fails if the database stopped after a failure ([`Database::fail`],
    /// [`Database::fail_rollback`], [`Database::fail_change`]).
    pub(crate) fn check_not_failed(&self) -> Result<()> {
        match self.inner.failure.get() {
            Some(message) => Err(EngineError::DatabaseFailed(message.clone())),
            None => Ok(()),
        }
    }

    /// Fails if the database stopped after a failure or was closed.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_not_failed()?;
        self.check_not_closed()
    }

    /// Fails with [`EngineError::DatabaseClosed`] once the database was closed. Writers call it
    /// inside the checkpoint gate, where a close cannot slip in between the check and the change.
    pub(crate) fn check_not_closed(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(EngineError::DatabaseClosed);
        }
        Ok(())
    }

    /// The log writer's counters (commits per fdatasync and so on), for a durable database.
    pub fn wal_stats(&self) -> Option<WalStats> {
        self.wal().map(LogWriter::stats)
    }

    /// Whether the automatic checkpointer's last attempt failed: how many attempts in a row
    /// failed, and the last one's error; `None` after a success (and for an in-memory
    /// database). A failed automatic checkpoint leaves the database running on its log, which
    /// cannot be truncated until a checkpoint succeeds: an application that must notice a full
    /// disk before the log fills it too looks here.
    pub fn automatic_checkpoint_failure(&self) -> Option<(u32, String)> {
        self.durable()
            .and_then(|durable| sync::lock(&durable.automatic_failure).clone())
    }

    /// Whether the last checkpoint failed to remove the log its image made unnecessary: how
    /// many checkpoints in a row did, and the last one's error; `None` once one succeeded (and
    /// for an in-memory database). Such a checkpoint, and a close or an open whose checkpoint
    /// it was, succeeds: its image is durable, and the segments left behind are read by no open
    /// or recovery. But they take disk space until a later checkpoint removes them, and that
    /// removal may keep failing (a permissions change, a read-only remount), so an operator
    /// who watches the log's disk looks here; every checkpoint, automatic or not, tries again.
    pub fn log_truncation_failure(&self) -> Option<(u32, String)> {
        self.durable()
            .and_then(|durable| sync::lock(&durable.truncation_failure).clone())
    }

    /// What recovery did when the database was opened, for a durable database.
    pub fn recovery_stats(&self) -> Option<RecoveryStats> {
        self.durable()
            .and_then(|durable| durable.recovery.get().copied())
    }

    /// Shuts the database down cleanly: flushes the log and takes a checkpoint, so the next
    /// open has nothing to replay (and tables that are not logged keep their rows). From the
    /// checkpoint on, every statement through any clone of this handle fails with
    /// [`EngineError::DatabaseClosed`]: a change after the clean image would be lost by the
    /// next open (for a table that is not logged) or make the image a lie. While a transaction
    /// that changed a table that is not logged is still open, the checkpoint is not marked
    /// clean: nothing could undo those changes, so the next open empties such tables as after
    /// a crash.
    pub fn close(self) -> Result<()> {
        self.flush_log()?;
        if !self.is_durable() {
            // No image to take: the close only shuts every clone out, as for a durable one.
            self.check_usable()?;
            self.inner.closed.store(true, Ordering::Release);
            return Ok(());
        }
        self.take_checkpoint(true).map(|_| ())
    }

    /// Makes every commit so far durable, DELAYED ones included (`sys.sp_flush_log`).
    pub fn flush_log(&self) -> Result<()> {
        self.check_usable()?;
        if let Some(wal) = self.wal() {
            wal.flush_now().map_err(|error| self.fail(error))?;
        }
        Ok(())
    }

    /// Takes a checkpoint (CHECKPOINT): writes a new image of every page and the catalog to the
    /// data file, after which recovery starts at this point and older log is removed. Writers
    /// pause only while dirty pages are captured; the data file's fdatasyncs run while they
    /// continue. For an in-memory database it only frees the pages of dropped tables that
    /// nothing holds any more, as every checkpoint does (see [`Database::drop_table`]).
    pub fn checkpoint(&self) -> Result<CheckpointStats> {
        self.take_checkpoint(false)
    }

    fn take_checkpoint(&self, clean_shutdown: bool) -> Result<CheckpointStats> {
        self.check_usable()?;
        let Some(durable) = self.durable() else {
            // No image to write, but `drop_table` promises that a dropped table's pages are
            // freed at the first table creation, drop or checkpoint after its last handle goes: an in-memory
            // database that creates and drops no more tables would otherwise never get them
            // back. It has no capture for the free to race, so no gate is needed.
            self.reclaim_dropped_tables();
            self.free_left_empty_leaves();
            return Ok(CheckpointStats::default());
        };
        let started = Instant::now();
        let mut last = sync::lock(&durable.checkpoint);
        // Again once the checkpoint is this one's: a checkpoint queued behind a close would
        // write an image after the close's clean one, not marked clean.
        self.check_usable()?;
        // Dropped tables nothing uses any more give their pages back first, and so do the
        // empty leaves deletes had to leave (see `free_left_empty_leaves`), inside the gate
        // (see `reclaim_dropped_tables`) but not while the writers are stopped: freeing a
        // tree or a leaf reads pages.
        {
            let _gate = self.enter_gate();
            self.reclaim_dropped_tables();
            self.free_left_empty_leaves();
        }
        // Most pages are written before the writers are stopped, so that the pause below only
        // writes those dirtied meanwhile.
        self.inner
            .pool
            .write_dirty_pages()
            .map_err(|error| self.fail_checkpoint(error))?;
        let (pending, catalog, pause) = {
            let _gate = durable
                .gate
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // A change that stopped the database half done did so inside the gate (see
            // `Database::fail_change`): its half must not reach the image. And nothing may
            // follow a close's image.
            self.check_usable()?;
            let paused = Instant::now();
            let checkpoint_lsn = durable.wal.end_lsn().0;
            let recovery_start = self.oldest_active_lsn().min(checkpoint_lsn);
            let mut catalog = self.catalog(checkpoint_lsn, recovery_start);
            // A transaction that changed a table that is not logged and is still open leaves
            // changes in the image that nothing can undo: the next open must treat that table
            // as after a crash (empty it), so the image is not called clean.
            catalog.clean_shutdown = clean_shutdown && !self.unlogged_changes_open();
            if clean_shutdown {
                // Nothing may change after the image a close takes (see `Inner::closed`).
                self.inner.closed.store(true, Ordering::Release);
            }
            let pending = self
                .inner
                .pool
                .checkpoint_capture()
                .map_err(|error| self.fail_checkpoint(error))?;
            (pending, catalog, paused.elapsed())
        };
        // The image holds changes of transactions that may not have committed; the log must be
        // durable up to the checkpoint before the image is, or recovery could not undo them.
        // A capture given up hands back the slots of pages written elsewhere since, which a
        // mere drop would leak until the next open.
        if let Err(error) = durable.wal.flush_now() {
            let error = self.fail(error);
            pending.abandon(&self.inner.pool);
            return Err(error);
        }
        let blob = match catalog.encode() {
            Ok(blob) => blob,
            Err(error) => {
                pending.abandon(&self.inner.pool);
                return Err(error);
            }
        };
        pending
            .finish(&self.inner.pool, &blob)
            .map_err(|error| self.fail_checkpoint(error))?;
        // The image is durable: the automatic checkpoints count the log written since from
        // here, also when the removal of the old log below fails. That removal is
        // housekeeping: old segments left behind are read by no open or recovery, and the next
        // checkpoint's removal, which lists every segment again, takes them. So its failure
        // does not fail the checkpoint (which did what it promised: before, CHECKPOINT, a
        // close and an open whose checkpoint was durable reported an error, and a caller
        // could only conclude that its image was not); it is reported in the statistics
        // instead, and in `Database::log_truncation_failure` until a removal succeeds.
        *last = catalog.checkpoint_lsn;
        let (segments_removed, log_truncation_error) = match durable
            .wal
            .remove_segments_before(Lsn(catalog.oldest_active_lsn))
        {
            Ok(removed) => {
                *sync::lock(&durable.truncation_failure) = None;
                (removed, None)
            }
            Err(error) => {
                let message = format!(
                    "the checkpoint is durable, but removing the log before LSN {} failed: {error}",
                    catalog.oldest_active_lsn
                );
                let mut failure = sync::lock(&durable.truncation_failure);
                let failures = failure.as_ref().map_or(0, |(n, _)| *n).saturating_add(1);
                *failure = Some((failures, message.clone()));
                (error.removed, Some(message))
            }
        };
        Ok(CheckpointStats {
            checkpoint_lsn: catalog.checkpoint_lsn,
            recovery_start_lsn: catalog.oldest_active_lsn,
            pause_us: pause.as_micros() as u64,
            duration_us: started.elapsed().as_micros() as u64,
            segments_removed,
            log_truncation_error,
        })
    }

    /// The first LSN of the oldest transaction that has written to the log and not ended.
    fn oldest_active_lsn(&self) -> u64 {
        let mut sessions = sync::lock(&self.inner.sessions);
        sessions.retain(|slot| slot.strong_count() > 0);
        sessions
            .iter()
            .filter_map(Weak::upgrade)
            .map(|slot| slot.first_lsn.load(Ordering::Acquire))
            .filter(|&lsn| lsn != NO_ACTIVE_LSN)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Whether a session's open transaction changed a table that is not logged.
    fn unlogged_changes_open(&self) -> bool {
        sync::lock(&self.inner.sessions)
            .iter()
            .filter_map(Weak::upgrade)
            .any(|slot| slot.unlogged_changes.load(Ordering::Acquire))
    }

    /// The catalog as of now (called with writers paused).
    fn catalog(&self, checkpoint_lsn: u64, oldest_active_lsn: u64) -> Catalog {
        Catalog {
            format_version: crate::catalog::CATALOG_FORMAT_VERSION,
            next_table_id: self.inner.next_table_id.load(Ordering::Relaxed),
            next_index_id: self.inner.next_index_id.load(Ordering::Relaxed),
            next_txn_id: self.inner.next_txn_id.load(Ordering::Relaxed),
            checkpoint_lsn,
            oldest_active_lsn,
            clean_shutdown: false,
            tables: self
                .tables()
                .iter()
                .map(|table| table.catalog_entry())
                .collect(),
            dropped_trees: self.dropped_trees(),
        }
    }

    /// The trees of dropped tables whose pages are not free yet, for a checkpoint's catalog:
    /// the next open frees them if this process does not.
    fn dropped_trees(&self) -> Vec<DroppedTree> {
        let dropped = sync::lock(&self.inner.dropped);
        let held = dropped
            .tables
            .iter()
            .flat_map(|table| table.trees().flat_map(|(_, trees)| trees));
        held.chain(&dropped.trees)
            .map(|tree| DroppedTree {
                index_id: tree.index_id(),
                root: tree.root(),
                spare_leaves: tree.spare_leaves(),
            })
            .collect()
    }

    /// Adds the trees a checkpoint's catalog listed as dropped, for
    /// [`Database::reclaim_dropped_tables`] to free. Each spare leaf is checked as when a live
    /// tree is attached.
    fn attach_dropped_trees(&self, trees: &[DroppedTree]) -> Result<()> {
        let mut dropped = sync::lock(&self.inner.dropped);
        for tree in trees {
            let opened = lastpage_storage::btree::BTree::open(
                Arc::clone(&self.inner.pool),
                tree.index_id,
                tree.root,
                lastpage_storage::btree::TreeOptions::default(),
                0,
            );
            opened
                .restore_spare_leaves(&tree.spare_leaves)
                .map_err(|error| {
                    EngineError::CorruptCatalog(format!("dropped tree {}: {error}", tree.index_id))
                })?;
            dropped.trees.push(opened);
        }
        Ok(())
    }

    /// Sets a dropped (or replaced) table aside until its pages can be freed, and frees what
    /// can be freed.
    fn retire_table(&self, table: Arc<Table>) {
        sync::lock(&self.inner.dropped).tables.push(table);
        self.reclaim_dropped_tables();
    }

    /// Frees the pages of every dropped table that nothing uses any more. A dropped table's pages cannot be freed while something still holds
    /// the table (see [`Dropped::tables`]): they would be reused under it. So they wait, and
    /// this runs at every table creation and drop and every checkpoint (and at the open), freeing the tables let go of
    /// since.
    ///
    /// The caller is inside the checkpoint gate (or nothing else can reach the database yet,
    /// as at the open): a checkpoint's capture must see each tree either listed in its catalog
    /// (a table's, or a dropped one's) with all its pages in use, or with all of them free.
    /// A tree that cannot be freed (an inner page that cannot be read) stays listed, to be
    /// tried again: its pages are late, never lost, and the drop has succeeded regardless.
    pub(crate) fn reclaim_dropped_tables(&self) {
        let mut dropped = sync::lock(&self.inner.dropped);
        let Dropped { tables, trees } = &mut *dropped;
        tables.retain_mut(|table| match Arc::get_mut(table) {
            Some(table) => {
                trees.extend(table.take_trees());
                false
            }
            None => true,
        });
        trees.retain_mut(|tree| tree.free_all_pages().is_err());
    }

    /// Retries, in every tree of every table, freeing the empty leaves whose freeing a delete
    /// gave up on (`BTree::free_left_empty_leaves`), so that they are gone from the image this
    /// checkpoint writes. Those a delete in the tree retried already are gone too; this is for
    /// trees that see no more deletes. The caller is inside the checkpoint gate, as a delete
    /// is: freeing changes pages, which a capture must see whole. A freeing that fails leaves
    /// its leaf listed for the next try and fails nothing: the leaf is a page late, no row is
    /// lost, and the page that cannot be read fails the next operation that needs it.
    fn free_left_empty_leaves(&self) {
        for table in self.tables() {
            for (_, trees) in table.trees() {
                for tree in trees {
                    let _freed = tree.free_left_empty_leaves();
                }
            }
        }
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.inner.pool
    }

    /// Creates a table. In a durable database the new table is logged and the log flushed
    /// before this returns, like any committed schema change.
    pub fn create_table(&self, definition: TableDef) -> Result<Arc<Table>> {
        self.check_usable()?;
        if self.is_durable() {
            crate::catalog::check_persistable(&definition)?;
        }
        let _gate = self.enter_gate();
        // Again inside the gate, where a close cannot slip in between the check and the
        // change: a table created after the close's clean image would be logged after it, and
        // the next open would take the close for a crash.
        self.check_usable()?;
        // Tables dropped earlier and let go of since give their pages back first (before the
        // catalog's lock, which lookups take: freeing a tree reads its inner pages).
        self.reclaim_dropped_tables();
        let key = table_name_key(&definition.name);
        let mut tables = self
            .inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if tables.contains_key(&key) {
            return Err(EngineError::TableExists(definition.name));
        }
        // Ids are handed out below u32::MAX, so that every id has a successor (the catalog
        // keeps the next id, and a created table's log description its own id plus one). A
        // catalog can hold a counter at the end of the range: a wrapping increment handed out
        // u32::MAX, whose description then overflowed, and after it ids already in use.
        let name = definition.name.clone();
        let take_id = |counter: &AtomicU32, what: &str| {
            counter
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1))
                .map_err(|next| EngineError::InvalidDefinition {
                    table: name.clone(),
                    reason: format!("the database's {what} ids are used up (the next is {next})"),
                })
        };
        let id = take_id(&self.inner.next_table_id, "table")?;
        let pool = &self.inner.pool;
        // The trees made so far, so that a creation that fails half way (a database at its
        // page limit) frees their pages: each is a root and nothing else yet.
        let mut made = Vec::new();
        let created = Table::create(self.inner.instance, id, definition, &mut |options| {
            let index_id = take_id(&self.inner.next_index_id, "index")?;
            let tree = lastpage_storage::btree::BTree::create(Arc::clone(pool), index_id, options)?;
            made.push((index_id, tree.root(), options));
            Ok(tree)
        });
        let table = match created {
            Ok(table) => Arc::new(table),
            Err(error) => {
                let trees = made.into_iter().map(|(index_id, root, options)| {
                    lastpage_storage::btree::BTree::open(
                        Arc::clone(pool),
                        index_id,
                        root,
                        options,
                        0,
                    )
                });
                sync::lock(&self.inner.dropped).trees.extend(trees);
                self.reclaim_dropped_tables();
                return Err(error);
            }
        };
        if let Some(wal) = self.wal() {
            let description = recovery::describe_create(&table.catalog_entry())?;
            let record = Record::Schema {
                description: description.into(),
            };
            // Refused before it reaches the log, where a record too large fails the database.
            if record.total_len() > wal.max_record_bytes() {
                let error = EngineError::InvalidDefinition {
                    table: table.name().to_owned(),
                    reason: format!(
                        "its definition takes {} bytes of log, more than the {} a log record \
                         may hold",
                        record.total_len(),
                        wal.max_record_bytes()
                    ),
                };
                // Its trees go: nothing else has seen the table.
                table.mark_dropped();
                self.retire_table(table);
                return Err(error);
            }
            wal.append(&record).map_err(|error| self.fail(error))?;
            // The first identity reservation goes to the disk with the table, so that the
            // first insert need not wait for a flush of its own (see `identity.rs`).
            table.reserve_identity_ahead(self)?;
            wal.flush_now().map_err(|error| self.fail(error))?;
        }
        tables.insert(key, Arc::clone(&table));
        Ok(table)
    }

    /// Adds a table whose trees already exist (from a checkpoint image).
    pub(crate) fn attach_table(&self, entry: &crate::catalog::CatalogEntry) -> Result<()> {
        let pool = &self.inner.pool;
        let mut trees = entry
            .index_trees
            .iter()
            .enumerate()
            .flat_map(|(position, index)| {
                (0..index.index_id_per_partition.len()).map(move |partition| {
                    (
                        (position, partition),
                        index.index_id_per_partition[partition],
                        index.root_per_partition.get(partition).copied(),
                        index
                            .rows_per_partition
                            .get(partition)
                            .copied()
                            .unwrap_or(0),
                        index
                            .spare_leaves_per_partition
                            .get(partition)
                            .map_or(&[][..], Vec::as_slice),
                    )
                })
            });
        let table = Table::create(
            self.inner.instance,
            entry.table_id,
            entry.definition.clone(),
            &mut |options| {
                let Some(((position, partition), index_id, Some(root), rows, spare_leaves)) =
                    trees.next()
                else {
                    return Err(EngineError::Storage(format!(
                        "the catalog entry of table {} lists fewer trees than its indexes need",
                        entry.table_id
                    )));
                };
                // A count no tree can reach is damage: the tree's counter counts in an i64,
                // and one seeded near its end wrapped on the next insert (the table then read
                // as empty).
                if rows > MAX_TREE_ROWS {
                    return Err(EngineError::CorruptCatalog(format!(
                        "index {position} of table '{}', partition {partition}, has a row count \
                         of {rows}, more than a tree can hold ({MAX_TREE_ROWS})",
                        entry.definition.name
                    )));
                }
                let tree = lastpage_storage::btree::BTree::open(
                    Arc::clone(pool),
                    index_id,
                    root,
                    options,
                    rows,
                );
                tree.restore_spare_leaves(spare_leaves).map_err(|error| {
                    EngineError::CorruptCatalog(format!(
                        "table '{}': {error}",
                        entry.definition.name
                    ))
                })?;
                Ok(tree)
            },
        )?;
        if let Some(next) = entry.next_identity {
            table.raise_identity(next);
        }
        // Rows replayed later raise the numbering past their own uniquifiers (see
        // `recovery::replay`); the image's rows are covered by the count, or read.
        match entry.uniquifier_blocks {
            Some(blocks) => table.raise_uniquifier_blocks(blocks),
            None => table.raise_uniquifiers_past_rows()?,
        }
        self.register_table(Arc::new(table));
        Ok(())
    }

    /// Adds (or replaces, by name) a table with fresh, empty trees under the index ids `entry`
    /// names: a table created by a logged schema change during recovery, or a table that is not
    /// logged, emptied after a crash.
    pub(crate) fn recreate_table(&self, entry: &crate::catalog::CatalogEntry) -> Result<()> {
        let pool = &self.inner.pool;
        let mut ids = entry.index_ids();
        let table = Table::create(
            self.inner.instance,
            entry.table_id,
            entry.definition.clone(),
            &mut |options| {
                let index_id = ids.next().ok_or_else(|| {
                    EngineError::Storage(format!(
                        "the logged definition of table {} lists fewer trees than its indexes need",
                        entry.table_id
                    ))
                })?;
                Ok(lastpage_storage::btree::BTree::create(
                    Arc::clone(pool),
                    index_id,
                    options,
                )?)
            },
        )?;
        // An emptied table's identity goes on from the image's value, not from its seed, so
        // that values handed out before its last checkpoint are not handed out again. (Those
        // handed out since may be: a table that is not logged keeps no record of them, as
        // `docs/recovery.md` says.)
        if let Some(next) = entry.next_identity {
            table.raise_identity(next);
        }
        let max_index = entry.index_ids().max().unwrap_or(0);
        self.inner
            .next_index_id
            .fetch_max(max_index + 1, Ordering::Relaxed);
        self.inner
            .next_table_id
            .fetch_max(entry.table_id + 1, Ordering::Relaxed);
        self.register_table(Arc::new(table));
        Ok(())
    }

    /// Adds a table to the catalog; one it replaces (an emptied table that is not logged) is
    /// set aside for its pages to be freed.
    fn register_table(&self, table: Arc<Table>) {
        let replaced = self
            .inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(table_name_key(table.name()), table);
        if let Some(replaced) = replaced {
            replaced.mark_dropped();
            self.retire_table(replaced);
        }
    }

    /// Removes a table dropped by a logged schema change during recovery.
    pub(crate) fn forget_table(&self, table_id: u32) {
        let mut forgotten = Vec::new();
        self.inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|_, table| {
                let dropped = table.id() == table_id;
                if dropped {
                    table.mark_dropped();
                    forgotten.push(Arc::clone(table));
                }
                !dropped
            });
        for table in forgotten {
            self.retire_table(table);
        }
    }

    /// Raises the next transaction id above one seen in the log.
    pub(crate) fn saw_txn_id(&self, txn: u64) {
        self.inner
            .next_txn_id
            .fetch_max(txn.saturating_add(1), Ordering::Relaxed);
    }

    /// The table called `name` (case-insensitive).
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.inner
            .tables
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&table_name_key(name))
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(name.to_owned()))
    }

    /// Removes a table from the catalog. In a durable database the drop is logged and flushed.
    /// A handle of the table kept from before refuses reads and writes from then on
    /// (`UnknownTable`, SQL Server's "Invalid object name"); a statement already past that
    /// check when the drop happens completes, as if it had run just before the drop, and its
    /// rows go with the table. The table's pages are freed for other tables to reuse at once
    /// if nothing else holds the table, else at the first table creation, drop or checkpoint after the last
    /// handle of it goes (see `docs/recovery.md`, Dropped tables and freed pages).
    pub fn drop_table(&self, name: &str) -> Result<()> {
        let _gate = self.enter_gate();
        // Inside the gate, where a close cannot slip in between the check and the change.
        self.check_usable()?;
        let mut tables = self
            .inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = table_name_key(name);
        let table = tables
            .get(&key)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(name.to_owned()))?;
        if let Some(wal) = self.wal() {
            wal.append(&Record::Schema {
                description: recovery::describe_drop(table.id()).into(),
            })
            .and_then(|end| wal.wait_until_durable(end))
            .map_err(|error| self.fail(error))?;
        }
        table.mark_dropped();
        tables.remove(&key);
        drop(tables);
        self.retire_table(table);
        Ok(())
    }

    /// Changes the run-time options of the index at `position` of `table` (see
    /// `Table::indexes`) with `change` (the latch policy cannot change). In a durable database
    /// the change is logged and flushed first, inside the checkpoint gate, so that a
    /// checkpoint's catalog has it exactly when the checkpoint is past its record. Changes are
    /// serialized by the catalog's write lock, as DDL is, from reading the options to applying
    /// them: two changes of different options of one index both take effect, and the log's
    /// order is the order they took effect in.
    pub(crate) fn alter_index(
        &self,
        session: &Session,
        table: &Table,
        position: usize,
        change: impl FnOnce(&mut IndexOptions),
    ) -> Result<()> {
        let _gate = self.enter_gate();
        // Inside the gate, where a close cannot slip in between the check and the change.
        self.check_usable()?;
        let _catalog = self
            .inner
            .tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Under the lock a drop takes too: a dropped table's change is refused, not logged.
        table.check_usable_by(session)?;
        let mut options = table.index_options(position);
        change(&mut options);
        if let Some(wal) = self.wal() {
            let position = u32::try_from(position).expect("a table has few indexes");
            wal.append(&Record::Schema {
                description: recovery::describe_index_options(table.id(), position, &options)
                    .into(),
            })
            .and_then(|end| wal.wait_until_durable(end))
            .map_err(|error| self.fail(error))?;
        }
        table.apply_index_options(
            position,
            options.insert_path,
            options.optimize_for_sequential_key,
        )
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
        let active = Arc::new(ActiveSlot::new());
        let mut sessions = sync::lock(&self.inner.sessions);
        if sessions.len() == sessions.capacity() {
            // Before the vector grows, the slots of sessions that are gone go (only a
            // checkpoint removed them, and an in-memory database never checkpoints: two
            // million sessions opened and dropped kept 106 MB).
            sessions.retain(|slot| slot.strong_count() > 0);
            // Then room for as many again, so that at least half the vector is pushed before
            // the next prune scans it: a constant cost per session. Left full (every slot
            // live), every later session scanned them all again.
            let live = sessions.len();
            sessions.reserve(live.max(4));
        }
        sessions.push(Arc::downgrade(&active));
        drop(sessions);
        Session {
            id: self.inner.next_session_id.fetch_add(1, Ordering::Relaxed),
            waits: Arc::new(WaitAccumulator::new()),
            db: self.clone(),
            active,
            txn: std::cell::RefCell::new(None),
            spare_undo: std::cell::Cell::new(Vec::new()),
        }
    }

    /// Checks every table (see [`Table::check_integrity`]).
    pub fn check_integrity(&self) -> Result<Vec<TableCheck>> {
        self.check_usable()?;
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
/// `sys.dm_exec_session_wait_stats`). A session is used by one thread at a time, and holds at
/// most one explicit transaction; dropping it rolls that transaction back.
pub struct Session {
    id: u64,
    waits: Arc<WaitAccumulator>,
    db: Database,
    active: Arc<ActiveSlot>,
    /// The explicit transaction, or the autocommit one of the statement running. A `RefCell`,
    /// not a mutex: a session is used by one thread at a time (it is `Send`, not `Sync`), and
    /// every statement would otherwise pay for an uncontended lock.
    txn: std::cell::RefCell<Option<Transaction>>,
    /// An emptied undo list kept for the next transaction, so that autocommit statements do
    /// not allocate one each.
    spare_undo: std::cell::Cell<Vec<crate::txn::UndoEntry>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.abandon();
    }
}

impl Session {
    /// The database the session belongs to.
    pub fn db(&self) -> &Database {
        &self.db
    }

    pub(crate) fn active_slot(&self) -> &ActiveSlot {
        &self.active
    }

    pub(crate) fn txn_slot(&self) -> std::cell::RefMut<'_, Option<Transaction>> {
        self.txn.borrow_mut()
    }

    /// An empty undo list, reusing the last transaction's allocation.
    pub(crate) fn take_spare_undo(&self) -> Vec<crate::txn::UndoEntry> {
        self.spare_undo.take()
    }

    /// Keeps an ended transaction's undo list (emptied) for the next one.
    pub(crate) fn return_spare_undo(&self, mut undo: Vec<crate::txn::UndoEntry>) {
        undo.clear();
        // A large transaction's list is not kept: with hundreds of sessions, each keeping the
        // largest list it ever had would add up.
        if undo.capacity() > UNDO_SPARE_KEPT_ENTRIES {
            undo = Vec::new();
        }
        self.spare_undo.set(undo);
    }

    /// The explicit transaction's id, if one is open.
    pub(crate) fn current_txn_id(&self) -> Option<lastpage_storage::wal::TxnId> {
        self.txn_slot().as_ref().map(|txn| txn.id)
    }

    /// The session id: SQL Server's session id (SPID), numbered from 1 in each database and
    /// the same for the session's whole life, whatever transactions it runs. The deadlock
    /// error names its victim by it ([`EngineError::Deadlock`]'s "Process ID").
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The error of one of the session's lock requests that failed (see
    /// [`EngineError::from_lock`]).
    pub(crate) fn lock_error(&self, error: crate::locks::LockError) -> EngineError {
        EngineError::from_lock(error, self.id)
    }

    /// The waits this session has incurred.
    pub fn waits(&self) -> WaitSnapshot {
        self.waits.snapshot()
    }

    /// Attributes this thread's waits to the session until the guard drops.
    pub(crate) fn attribute(&self) -> AttributionGuard {
        stats::attribute_waits_to(Arc::clone(&self.waits))
    }

    /// The session's wait statistics, for a wait done on its behalf elsewhere (a
    /// [`crate::CommitTicket`]'s).
    pub(crate) fn waits_accumulator(&self) -> Arc<WaitAccumulator> {
        Arc::clone(&self.waits)
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

/// Clears its flag when dropped, on unwinding too.
struct StopWhenDropped<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopWhenDropped<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Replays the log (see [`recovery::replay`]) while another thread writes the pages it fills
/// back to the data file, so that the checkpoint ending recovery finds them clean instead of
/// writing and syncing the whole table after replay: replay is CPU, write-back is I/O, and on
/// two threads they overlap. Every change replay makes is in the durable log already, so an
/// early write breaks no rule (and the pool has no log to flush yet); the passes skip any page
/// replay holds, and a page filled further after it was written is dirty again and written
/// again.
fn replay_writing_back(
    db: &Database,
    pool: &BufferPool,
    fs: Arc<dyn FileSystem>,
    wal_dir: &Path,
    catalog: &Option<Catalog>,
) -> Result<RecoveryStats> {
    let replaying = std::sync::atomic::AtomicBool::new(true);
    let (replayed, written_back) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut written = 0;
            while replaying.load(std::sync::atomic::Ordering::Relaxed) {
                written += pool.write_dirty_pages()?;
                // A pause between passes lets pages fill up, so that each pass writes whole
                // batches of full pages and syncs once per batch, rather than chasing replay
                // page by page (a sync and a scan of every frame each time).
                std::thread::sleep(Duration::from_millis(RECOVERY_WRITE_BACK_PAUSE_MS));
            }
            Ok::<usize, lastpage_storage::buffer::PageError>(written)
        });
        // The write-back thread stops once replay is over, also when replay panics: the scope
        // waits for it before the panic goes on, so without the guard a panic in replay (a bug
        // reached from a damaged file) hung the open for ever instead of surfacing.
        let replayed = {
            let _stop = StopWhenDropped(&replaying);
            recovery::replay(db, fs, wal_dir, catalog.as_ref())
        };
        let written_back = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (replayed, written_back)
    });
    let mut stats = replayed?;
    stats.pages_written_during_replay = written_back
        .map_err(|error| EngineError::Storage(format!("writing back replayed pages: {error}")))?
        as u64;
    Ok(stats)
}
