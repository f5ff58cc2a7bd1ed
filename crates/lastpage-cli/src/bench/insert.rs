//! The insert harness: many sessions, single-row inserts (or 100-row statements), one table,
//! one process.
//!
//! [`run_insert_bench`] builds the table a [`Workload`] describes (the clustered key, the
//! remedy, the insert path and latch flavour of every index) in a fresh in-memory database,
//! optionally warms it up, starts every session's thread at once and measures: throughput,
//! per-statement latency (HdrHistogram), wait and latch statistics (global and attributed to
//! sessions), context switches and CPU time (`getrusage`), every index's shape and split
//! counters, and the database's integrity check. Before it builds the table it returns the
//! allocator's free memory to the kernel, so that every run in a process (`insert-compare`,
//! `insert-matrix`) starts as cold as the first: each pays the page faults of its own pages.
//!
//! Everything the run measures is in the [`InsertReport`], which serializes to the JSON that
//! `lastpage bench insert --json` prints; [`crate::bench::render`] draws it as tables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use hdrhistogram::Histogram;
use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, DefaultValue, Expr, IndexDef, IndexOptions,
    InsertPath, LatchPolicy, PreparedInsert, Table, TableDef, Uniqueness, Value, WaitSnapshot,
    WaitStat, WaitType,
};
use lastpage_storage::limits::PAGE_SIZE_BYTES;
use serde::Serialize;

use crate::durable::{self, Durability, WalCounters};
use crate::sys::{self, Usage};

/// Largest `--row-bytes`: SQL Server's CHAR(8000), one row per page.
pub const MAX_ROW_BYTES: u16 = 8000;

/// Largest payload stored as `VARCHAR(B)`; larger payloads are `CHAR(B)`.
pub const MAX_VARCHAR_ROW_BYTES: u16 = 900;

/// The IDENTITY column is an `int`, so a run cannot insert more rows than this.
const MAX_TOTAL_ROWS: u64 = i32::MAX as u64;

/// The clustered key of the benchmark table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    /// Clustered PRIMARY KEY on the IDENTITY column: the hot last page.
    Ascending,
    /// Clustered PRIMARY KEY on a `uniqueidentifier DEFAULT NEWID()`: no hot spot.
    Random,
    /// Clustered PRIMARY KEY (ModValue, InsertID), `ModValue AS InsertID % 16 PERSISTED`.
    Mod16,
}

impl KeyKind {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            KeyKind::Ascending => "ascending",
            KeyKind::Random => "random",
            KeyKind::Mod16 => "mod16",
        }
    }

    /// The key column `--key` picks, once `mod16` is read as `ascending` plus the mod16
    /// remedy.
    fn base(self) -> KeyKind {
        match self {
            KeyKind::Ascending | KeyKind::Mod16 => KeyKind::Ascending,
            KeyKind::Random => KeyKind::Random,
        }
    }
}

/// A remedy for last-page insert contention: seed 000's experiments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Remedy {
    /// The clustered PRIMARY KEY on the key column, nothing else.
    None,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY on every index.
    Ofsk,
    /// The clustered key on the NEWID() column, plus a UNIQUE NONCLUSTERED index on InsertID.
    #[serde(rename = "nonseq")]
    NonSeq,
    /// `ModValue = InsertID % 16` (persisted, computed) leading the clustered key.
    Mod16,
    /// [`Remedy::Mod16`] and hash partitioning on ModValue into 16 partitions.
    Partition16,
    /// 100-row statements (`Table::insert_batch_values`) instead of single-row inserts.
    Batch100,
}

impl Remedy {
    /// Every remedy, in display order.
    pub const ALL: [Remedy; 6] = [
        Remedy::None,
        Remedy::Ofsk,
        Remedy::NonSeq,
        Remedy::Mod16,
        Remedy::Partition16,
        Remedy::Batch100,
    ];

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Remedy::None => "none",
            Remedy::Ofsk => "ofsk",
            Remedy::NonSeq => "nonseq",
            Remedy::Mod16 => "mod16",
            Remedy::Partition16 => "partition16",
            Remedy::Batch100 => "batch100",
        }
    }

    /// Rows per insert statement.
    pub fn rows_per_statement(self) -> u64 {
        match self {
            Remedy::Batch100 => BATCH_ROWS,
            _ => 1,
        }
    }
}

/// Rows per statement of the batch100 remedy.
pub const BATCH_ROWS: u64 = 100;

/// One run of the insert benchmark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertConfig {
    /// Concurrent sessions, one thread each.
    pub threads: u32,
    /// Single-row inserts per session.
    pub rows_per_thread: u64,
    /// Clustered key.
    pub key: KeyKind,
    /// Payload bytes per row (1..=8000).
    pub row_bytes: u16,
    /// Latch flavour of every index's pages.
    pub latch: LatchPolicy,
    /// Insert path of every index.
    pub insert_path: InsertPath,
    /// Remedy applied to the table.
    pub remedy: Remedy,
    /// Rows one session inserts before the measured run.
    pub warmup_rows: u64,
    /// Where the database lives: `None` for the in-memory database, else a directory where a
    /// durable database is created (it must not hold anything yet).
    pub db_dir: Option<PathBuf>,
    /// When a commit returns, for a durable database (`db_dir` set); ignored in memory.
    pub durability: Durability,
}

impl Default for InsertConfig {
    fn default() -> Self {
        InsertConfig {
            threads: 100,
            rows_per_thread: 1000,
            key: KeyKind::Ascending,
            row_bytes: 100,
            latch: LatchPolicy::Adaptive,
            insert_path: InsertPath::Default,
            remedy: Remedy::None,
            warmup_rows: 0,
            db_dir: None,
            durability: Durability::Full,
        }
    }
}

impl InsertConfig {
    /// Rows the measured run inserts.
    pub fn total_rows(&self) -> u64 {
        u64::from(self.threads).saturating_mul(self.rows_per_thread)
    }

    /// The remedy actually applied: `--key mod16` means `--key ascending --remedy mod16`.
    /// Combinations [`InsertConfig::validate`] rejects come back unchanged.
    pub fn effective_remedy(&self) -> Remedy {
        match (self.key, self.remedy) {
            (KeyKind::Mod16, Remedy::None) => Remedy::Mod16,
            (_, remedy) => remedy,
        }
    }

    /// This configuration with `rows_per_thread` rounded up to whole statements (batch100),
    /// and a note saying so if it changed anything.
    pub fn rounded_to_statements(&self) -> (InsertConfig, Option<String>) {
        let per_statement = self.effective_remedy().rows_per_statement();
        let rounded = self.rows_per_thread.div_ceil(per_statement) * per_statement;
        let mut config = self.clone();
        if rounded == self.rows_per_thread {
            return (config, None);
        }
        config.rows_per_thread = rounded;
        let note = format!(
            "--remedy batch100 inserts whole statements of {per_statement} rows: --rows-per-thread {} \
             was rounded up to {rounded}",
            self.rows_per_thread
        );
        (config, Some(note))
    }

    /// Rejects configurations the harness cannot run (an [`BenchError::InvalidConfig`]).
    pub fn validate(&self) -> Result<(), BenchError> {
        let invalid = |message: String| Err(BenchError::InvalidConfig(message));
        if self.key == KeyKind::Mod16
            && !matches!(
                self.remedy,
                Remedy::None | Remedy::Mod16 | Remedy::Partition16
            )
        {
            return invalid(format!(
                "--key mod16 already is a remedy (--key ascending --remedy mod16), so it cannot be \
                 combined with --remedy {}; use --key ascending --remedy {} instead",
                self.remedy.name(),
                self.remedy.name()
            ));
        }
        if self.threads == 0 {
            return invalid("--threads must be at least 1".into());
        }
        if self.rows_per_thread == 0 {
            return invalid("--rows-per-thread must be at least 1".into());
        }
        if self.row_bytes == 0 || self.row_bytes > MAX_ROW_BYTES {
            return invalid(format!(
                "--row-bytes must be between 1 and {MAX_ROW_BYTES}, not {}",
                self.row_bytes
            ));
        }
        let rows = self.total_rows().saturating_add(self.warmup_rows);
        if rows > MAX_TOTAL_ROWS {
            return invalid(format!(
                "{} threads x {} rows plus {} warm-up rows is {rows} rows, more than the int IDENTITY \
                 column can number ({MAX_TOTAL_ROWS})",
                self.threads, self.rows_per_thread, self.warmup_rows
            ));
        }
        if let Some(dir) = &self.db_dir {
            check_fresh_directory(dir)?;
        }
        if let Some(available) = sys::available_memory_bytes() {
            let needed = estimated_memory_bytes(rows, self.row_bytes);
            if needed > available / 10 * 8 {
                return invalid(format!(
                    "{rows} rows of {} bytes need about {:.1} GiB of pages, but only {:.1} GiB of memory \
                     is available; lower --threads, --rows-per-thread or --warmup-rows",
                    self.row_bytes,
                    gib(needed),
                    gib(available)
                ));
            }
        }
        Ok(())
    }
}

/// Refuses a `--db` directory that already holds something: the benchmark measures a fresh
/// database, and reopening an old one would recover its tables (and fail to create the table).
pub fn check_fresh_directory(dir: &Path) -> Result<(), BenchError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BenchError::InvalidConfig(format!(
                    "--db {} is not empty; the benchmark needs a new or empty directory for a fresh \
                     database",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(BenchError::InvalidConfig(format!(
            "--db {} cannot be used: {error}",
            dir.display()
        ))),
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A pessimistic estimate of the pages `rows` rows take: half-full pages (a random key's
/// splits), each row with a few dozen bytes of key and record overhead.
fn estimated_memory_bytes(rows: u64, row_bytes: u16) -> u64 {
    let rows_per_page = (8096 / (u64::from(row_bytes) + 40)).max(1);
    rows.div_ceil(rows_per_page)
        .saturating_mul(2)
        .saturating_mul(PAGE_SIZE_BYTES as u64 + 64)
}

/// Why a run could not be done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchError {
    /// The configuration is not runnable (bad input: exit code 2).
    InvalidConfig(String),
    /// The engine or the operating system failed (exit code 1).
    Failed(String),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::InvalidConfig(message) | BenchError::Failed(message) => {
                f.write_str(message)
            }
        }
    }
}

impl std::error::Error for BenchError {}

/// The table a run inserts into, built from a configuration through the embedded API only.
pub struct Workload {
    /// The table definition.
    pub table: TableDef,
    /// Position of the payload column, the only column an insert supplies.
    pub payload_column: usize,
    /// The payload column as SQL would declare it, e.g. `Name VARCHAR(100)`.
    pub payload_sql: String,
    /// The clustered key's columns, e.g. `ModValue, InsertID`.
    pub clustered_key: String,
    /// The nonclustered indexes, as SQL would describe them.
    pub nonclustered: Vec<String>,
    /// Partitions of every index (1: not partitioned).
    pub partitions: u16,
}

/// Name of the NEWID() column.
const GUID_COLUMN: &str = "RowGuid";

impl Workload {
    /// The table for `config`: `InsertID int IDENTITY(1,1)` (always the first column), a
    /// `RowGuid uniqueidentifier DEFAULT NEWID()` if the key or the remedy clusters on it, a
    /// payload column of `config.row_bytes` bytes (`Name VARCHAR(B)` up to 900 bytes, else
    /// `Payload CHAR(B)`), and for mod16 and partition16 `ModValue AS InsertID % 16 PERSISTED`.
    /// The clustered PRIMARY KEY is on the key column (InsertID for an ascending key, RowGuid
    /// for a random one; RowGuid for nonseq, which adds a UNIQUE NONCLUSTERED index on
    /// InsertID), led by ModValue for mod16 and partition16. Every index gets `config.latch`,
    /// `config.insert_path` and, for ofsk, OPTIMIZE_FOR_SEQUENTIAL_KEY.
    pub fn for_config(config: &InsertConfig) -> Workload {
        let bytes = config.row_bytes;
        let remedy = config.effective_remedy();
        let (payload_name, payload_type, type_sql) = if bytes <= MAX_VARCHAR_ROW_BYTES {
            ("Name", DataType::VarChar(bytes), "VARCHAR")
        } else {
            ("Payload", DataType::Char(bytes), "CHAR")
        };
        let options = IndexOptions {
            latch_policy: config.latch,
            insert_path: config.insert_path,
            optimize_for_sequential_key: remedy == Remedy::Ofsk,
        };
        let name = format!("InsertContention_{bytes}");
        let key_column = match (config.key.base(), remedy) {
            (_, Remedy::NonSeq) | (KeyKind::Random, _) => GUID_COLUMN,
            _ => "InsertID",
        };
        let with_mod = matches!(remedy, Remedy::Mod16 | Remedy::Partition16);

        let mut table =
            TableDef::new(&name).column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1));
        if key_column == GUID_COLUMN {
            table = table.column(
                ColumnDef::new(GUID_COLUMN, DataType::UniqueIdentifier)
                    .not_null()
                    .default_value(DefaultValue::NewId),
            );
        }
        let payload_column = table.columns.len();
        table = table.column(ColumnDef::new(payload_name, payload_type).not_null());
        let mut clustered_columns = vec![key_column];
        if with_mod {
            // ModValue AS CONVERT(TINYINT, ABS(InsertID % 16)) PERSISTED NOT NULL: a stored
            // expression, so that a durable database (--db) accepts the table too.
            table = table.column(
                ColumnDef::new("ModValue", DataType::TinyInt)
                    .not_null()
                    .computed_expression(Expr::column("InsertID").modulo(16).abs()),
            );
            clustered_columns.insert(0, "ModValue");
        }
        table = table.clustered(
            IndexDef::new(
                format!("PK_{name}"),
                &clustered_columns,
                Uniqueness::PrimaryKey,
            )
            .with_options(options),
        );
        let mut nonclustered = Vec::new();
        if remedy == Remedy::NonSeq {
            let index = format!("IX_{name}_InsertID");
            nonclustered.push(format!("UNIQUE NONCLUSTERED {index} (InsertID)"));
            table = table.nonclustered(
                IndexDef::new(index, &["InsertID"], Uniqueness::UniqueIndex).with_options(options),
            );
        }
        let partitions = if remedy == Remedy::Partition16 {
            table = table.partitioned("ModValue", 16);
            16
        } else {
            1
        };
        Workload {
            table,
            payload_column,
            payload_sql: format!("{payload_name} {type_sql}({bytes})"),
            clustered_key: clustered_columns.join(", "),
            nonclustered,
            partitions,
        }
    }

    /// The payload thread `thread` inserts: `row_bytes` ASCII letters.
    pub(crate) fn payload(&self, thread: usize, row_bytes: u16) -> Value {
        let letter = char::from(b'a' + (thread % 26) as u8);
        Value::String(std::iter::repeat_n(letter, usize::from(row_bytes)).collect())
    }
}

/// Echo of the configuration in the report.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// Sessions.
    pub threads: u32,
    /// Rows per session.
    pub rows_per_thread: u64,
    /// Rows per session asked for (differs from `rows_per_thread` if batch100 rounded it up).
    pub requested_rows_per_thread: u64,
    /// `ascending`, `random` or `mod16`, as given.
    pub key: KeyKind,
    /// The remedy applied (`mod16` for `--key mod16`).
    pub remedy: Remedy,
    /// The clustered key's columns.
    pub clustered_key: String,
    /// The nonclustered indexes (nonseq: the UNIQUE index on InsertID).
    pub nonclustered_indexes: Vec<String>,
    /// Partitions of every index (1: not partitioned).
    pub partitions: u16,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY on every index.
    pub optimize_for_sequential_key: bool,
    /// Rows per insert statement (100 for batch100, else 1).
    pub rows_per_statement: u64,
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// The payload column, e.g. `Name VARCHAR(100)`.
    pub payload_column: String,
    /// `fifo` or `adaptive`, on every index.
    pub latch: &'static str,
    /// `classic` or `default`, on every index.
    pub insert_path: &'static str,
    /// Rows inserted before the measured run.
    pub warmup_rows: u64,
    /// `memory` (the in-memory database) or `durable` (`--db`).
    pub storage: &'static str,
    /// The durable database's directory.
    pub db: Option<String>,
    /// When a commit returned (durable databases only).
    pub durability: Option<Durability>,
}

/// The log's side of a run: group commit and the time commits waited for it.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LogReport {
    /// Transactions (statements) the measured run committed per fdatasync of the log (absent
    /// in memory, or without any fdatasync, as under `--durability none`).
    pub commits_per_fsync: Option<f64>,
    /// The log writer's counters over the measured run (absent in memory).
    pub wal: Option<WalCounters>,
    /// WRITELOG wait time per commit (per statement), in microseconds.
    pub writelog_wait_us_per_commit: f64,
    /// WRITELOG waits per commit (per statement).
    pub writelog_waits_per_commit: f64,
}

/// Per-insert latency percentiles, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatencyReport {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest insert.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// One wait type's totals, in `sys.dm_os_wait_stats` columns (times in milliseconds).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct WaitReport {
    /// Waits started.
    pub waiting_tasks_count: u64,
    /// Total wait time.
    pub wait_time_ms: f64,
    /// Longest single wait.
    pub max_wait_time_ms: f64,
    /// Time between being signalled and running again.
    pub signal_wait_time_ms: f64,
}

impl From<WaitStat> for WaitReport {
    fn from(stat: WaitStat) -> WaitReport {
        WaitReport {
            waiting_tasks_count: stat.waiting_tasks_count,
            wait_time_ms: round3(stat.wait_time_ms()),
            max_wait_time_ms: round3(stat.max_wait_time_ms()),
            signal_wait_time_ms: round3(stat.signal_wait_time_ms()),
        }
    }
}

/// One latch class's totals, in `sys.dm_os_latch_stats` columns (times in milliseconds).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatchReport {
    /// Latch requests that had to wait.
    pub waiting_requests_count: u64,
    /// Total wait time.
    pub wait_time_ms: f64,
    /// Longest single wait.
    pub max_wait_time_ms: f64,
}

/// The global wait counters against the sum of what the sessions were charged.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AttributionReport {
    /// PAGELATCH_EX waits in the global statistics (`sys.dm_os_wait_stats`).
    pub pagelatch_ex_global: u64,
    /// PAGELATCH_EX waits summed over the sessions (`sys.dm_exec_session_wait_stats`).
    pub pagelatch_ex_sessions: u64,
    /// PAGELATCH_EX wait time in the global statistics, in milliseconds.
    pub pagelatch_ex_wait_time_ms_global: f64,
    /// PAGELATCH_EX wait time summed over the sessions, in milliseconds.
    pub pagelatch_ex_wait_time_ms_sessions: f64,
    /// Waits of every type in the global statistics.
    pub all_waits_global: u64,
    /// Waits of every type summed over the sessions.
    pub all_waits_sessions: u64,
}

/// Context switches of the inserting threads.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ContextSwitchReport {
    /// Voluntary switches (the thread blocked), summed over the inserting threads' insert loops.
    pub voluntary: u64,
    /// Involuntary switches (preemptions), likewise.
    pub involuntary: u64,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// One index after the run (the clustered index in `tree`; every index in `indexes`), summed
/// over its partitions' B-trees.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TreeReport {
    /// The index's name.
    pub index: String,
    /// B-trees of the index (one per partition).
    pub partitions: usize,
    /// Rows the integrity check counted (absent if the check failed).
    pub rows: Option<u64>,
    /// Leaf pages.
    pub leaf_pages: Option<u64>,
    /// Inner pages.
    pub inner_pages: Option<u64>,
    /// Levels, leaves included.
    pub levels: Option<u8>,
    /// Average fraction of each leaf's body in use (over every partition's leaves).
    pub leaf_fill: Option<f64>,
    /// Leaf splits that moved rows.
    pub leaf_splits: u64,
    /// Splits at the end of the index that started a new empty page.
    pub leaf_appends: u64,
    /// Inner page splits, root growth included.
    pub inner_splits: u64,
    /// Inserts that found the leaf full and restarted on the split path.
    pub split_restarts: u64,
    /// Pages the database's buffer pool allocated.
    pub buffer_pool_pages: usize,
}

/// Everything one run measured. Serializes to the JSON of `lastpage bench insert --json`.
#[derive(Clone, Debug, Serialize)]
pub struct InsertReport {
    /// The configuration.
    pub config: ConfigReport,
    /// Commits per fdatasync (the same as `log.commits_per_fsync`, at the top level because it
    /// is the figure a durable run is judged by).
    pub commits_per_fsync: Option<f64>,
    /// The log's counters and waits.
    pub log: LogReport,
    /// Rows inserted by the measured run.
    pub rows: u64,
    /// Wall time from the start signal until the last session finished.
    pub elapsed_sec: f64,
    /// `rows / elapsed_sec`.
    pub rows_per_sec: f64,
    /// Per-statement latency (`Table::insert`, or `Table::insert_batch_values` for batch100),
    /// microseconds.
    pub latency_us: LatencyReport,
    /// What one latency sample is: `"row"` (a single-row insert) or `"statement"` (a
    /// `rows_per_statement`-row `insert_batch_values`).
    pub latency_unit: &'static str,
    /// Every wait type with a nonzero count, plus PAGELATCH_EX/SH/UP, WRITELOG, LOGBUFFER,
    /// LCK_M_S and LCK_M_X always.
    pub waits: BTreeMap<&'static str, WaitReport>,
    /// `waiting_tasks_count / rows` for every wait type in `waits`.
    pub waits_per_row: BTreeMap<&'static str, f64>,
    /// Every latch class (`sys.dm_os_latch_stats`).
    pub latch_stats: BTreeMap<&'static str, LatchReport>,
    /// Global counters against the sum of the sessions' counters.
    pub session_attribution: AttributionReport,
    /// Context switches of the inserting threads per row.
    pub context_switches_per_row: f64,
    /// The inserting threads' context switches.
    pub context_switches: ContextSwitchReport,
    /// Context switches of the whole process per row, thread start-up and joins included.
    pub process_context_switches_per_row: f64,
    /// CPU time (user + system) of the whole process during the run, in seconds.
    pub cpu_sec: f64,
    /// Minor page faults of the whole process during the run, per row: memory the allocator
    /// had to get from the kernel (fresh pages) rather than reuse.
    pub page_faults_per_row: f64,
    /// Share of the machine's CPU capacity other processes (or the hypervisor: steal time) used
    /// during the run, from `/proc/stat`; absent for runs under 0.2 s. Wall-clock numbers of a
    /// run with a high value are not comparable with those of a quiet run.
    pub other_cpu_load_percent: Option<f64>,
    /// The clustered index's shape and split counters.
    pub tree: TreeReport,
    /// Every index (clustered first), each summed over its partitions.
    pub indexes: Vec<TreeReport>,
    /// `"ok"`, or what the integrity check found.
    pub integrity: String,
    /// Things the harness changed or wants the reader to know (e.g. rounding for batch100).
    pub notes: Vec<String>,
}

impl InsertReport {
    /// Waits of one type per inserted row (0 if none).
    pub fn waits_per_row_of(&self, wait_type: WaitType) -> f64 {
        self.waits_per_row
            .get(wait_type.name())
            .copied()
            .unwrap_or(0.0)
    }
}

pub(crate) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Lets every thread get ready, then releases them at once (like a barrier, but it can also
/// call the run off if a thread cannot be started).
///
/// The release is the coordinator dropping a write lock that the threads wait to read: unlike
/// a condition variable, whose woken waiters must re-take its mutex one by one (so the threads
/// would start staggered, each able to finish a short run before the next one begins), every
/// reader is woken at once and none waits for another.
pub(super) struct StartGate {
    ready: Mutex<usize>,
    all_ready: Condvar,
    go: RwLock<()>,
    run: AtomicBool,
}

impl StartGate {
    pub(super) fn new() -> StartGate {
        StartGate {
            ready: Mutex::new(0),
            all_ready: Condvar::new(),
            go: RwLock::new(()),
            run: AtomicBool::new(false),
        }
    }

    /// Closes the gate: threads that arrive wait until the returned guard drops.
    pub(super) fn close(&self) -> RwLockWriteGuard<'_, ()> {
        self.go
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A thread is ready; blocks until the gate opens. Returns whether to run.
    pub(super) fn arrive_and_wait(&self) -> bool {
        *self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += 1;
        self.all_ready.notify_one();
        drop(
            self.go
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        self.run.load(Ordering::Acquire)
    }

    /// Blocks until `count` threads are ready.
    pub(super) fn wait_ready(&self, count: usize) {
        let mut ready = self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while *ready < count {
            ready = self
                .all_ready
                .wait(ready)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Opens the gate (by dropping `closed`), telling every thread whether to run.
    pub(super) fn open(&self, closed: RwLockWriteGuard<'_, ()>, run: bool) {
        self.run.store(run, Ordering::Release);
        drop(closed);
    }
}

/// What one session's thread measured.
struct WorkerResult {
    rows: u64,
    latency_ns: Histogram<u64>,
    finished: Instant,
    usage: Option<Usage>,
    session_waits: WaitSnapshot,
    error: Option<String>,
}

/// Runs one insert benchmark: a fresh database, the table of [`Workload::for_config`],
/// `config.threads` sessions inserting `config.rows_per_thread` rows each (single-row
/// inserts, or 100-row statements for batch100, with `rows_per_thread` rounded up to whole
/// statements and a note saying so).
pub fn run_insert_bench(requested: &InsertConfig) -> Result<InsertReport, BenchError> {
    requested.validate()?;
    let (config, rounding_note) = requested.rounded_to_statements();
    let config = &config;
    config.validate()?;
    let notes: Vec<String> = rounding_note.into_iter().collect();
    let rows_per_statement = config.effective_remedy().rows_per_statement();
    let failed =
        |what: &str, error: &dyn std::fmt::Display| BenchError::Failed(format!("{what}: {error}"));
    let workload = Workload::for_config(config);
    // Every run starts from the same cold memory, whatever ran before it in this process.
    sys::release_free_memory();
    let db = match &config.db_dir {
        None => Database::create(DatabaseOptions::default())
            .map_err(|error| failed("cannot create the database", &error))?,
        Some(dir) => durable::open(dir, config.durability).map_err(BenchError::Failed)?,
    };
    // `--durability none` is the engine's non-logged table: nothing reaches the log.
    let definition = match (&config.db_dir, config.durability) {
        (Some(_), Durability::None) => workload.table.clone().not_logged(),
        _ => workload.table.clone(),
    };
    let table = db
        .create_table(definition)
        .map_err(|error| failed("cannot create the table", &error))?;
    let insert = table
        .prepare_insert(&[workload.payload_column])
        .map_err(|error| failed("cannot prepare the insert", &error))?;

    if config.warmup_rows > 0 {
        let session = db.session();
        let payload = [workload.payload(0, config.row_bytes)];
        for _ in 0..config.warmup_rows {
            insert
                .insert(&session, &payload)
                .map_err(|error| failed("warm-up insert failed", &error))?;
        }
    }

    let threads = config.threads as usize;
    let gate = Arc::new(StartGate::new());
    // Threads that arrive before the gate opens wait on it; an early return opens it (the guard
    // drops) with `run` still false, so no thread is left waiting.
    let closed = gate.close();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles: Vec<JoinHandle<WorkerResult>> = Vec::with_capacity(threads);
    for thread in 0..threads {
        let latency_ns = Histogram::<u64>::new(3)
            .map_err(|error| failed("cannot create a histogram", &error))?;
        let payload = workload.payload(thread, config.row_bytes);
        let worker = Worker {
            db: db.clone(),
            table: Arc::clone(&table),
            insert: insert.clone(),
            gate: Arc::clone(&gate),
            stop: Arc::clone(&stop),
            payload_column: workload.payload_column,
            rows: config.rows_per_thread,
            rows_per_statement,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("insert-{thread}"))
            .spawn(move || worker.run(payload, latency_ns));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                gate.open(closed, false);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(failed(
                    &format!("cannot start thread {} of {threads}", thread + 1),
                    &error,
                ));
            }
        }
    }

    gate.wait_ready(threads);
    db.clear_wait_stats();
    let wal_before = durable::wal_counters(&db);
    let cpu_load = sys::LoadProbe::start();
    let start = Instant::now();
    gate.open(closed, true);

    let mut results = Vec::with_capacity(threads);
    let mut panics = Vec::new();
    for handle in handles {
        match handle.join() {
            Ok(result) => results.push(result),
            Err(payload) => panics.push(panic_message(payload.as_ref())),
        }
    }
    let waits = db.wait_stats();
    // DELAYED commits may still be in the log buffer: flushed first, so that commits per
    // fdatasync counts the flush that makes them durable (it counted them without it). After
    // the timed span, and a no-op for FULL commits, which are durable already.
    if panics.is_empty() {
        db.flush_log()
            .map_err(|error| BenchError::Failed(format!("cannot flush the log: {error}")))?;
    }
    let wal = durable::wal_counters(&db)
        .zip(wal_before)
        .map(|(after, before)| after.since(&before));
    let (process_usage, other_cpu_load_percent) = cpu_load.finish();
    if let Some(message) = panics.first() {
        return Err(BenchError::Failed(format!(
            "{} inserting thread(s) panicked; the first said: {message}",
            panics.len()
        )));
    }
    if let Some(error) = results.iter().find_map(|result| result.error.as_ref()) {
        return Err(BenchError::Failed(format!("insert failed: {error}")));
    }

    let rows: u64 = results.iter().map(|result| result.rows).sum();
    let finished = results
        .iter()
        .map(|result| result.finished)
        .max()
        .unwrap_or(start);
    let elapsed_sec = finished
        .saturating_duration_since(start)
        .as_secs_f64()
        .max(1e-9);
    let mut latency_ns =
        Histogram::<u64>::new(3).map_err(|error| failed("cannot create a histogram", &error))?;
    let mut worker_usage = Usage::default();
    let mut worker_usage_known = true;
    let mut session_waits = WaitTotals::default();
    for result in &results {
        latency_ns
            .add(&result.latency_ns)
            .map_err(|error| failed("cannot merge latency histograms", &error))?;
        match &result.usage {
            Some(usage) => worker_usage.add(usage),
            None => worker_usage_known = false,
        }
        session_waits.add(&result.session_waits);
    }
    let (context_switches, source) = if worker_usage_known {
        (
            worker_usage,
            "getrusage(RUSAGE_THREAD) of each inserting thread around its insert loop",
        )
    } else {
        (process_usage, "getrusage(RUSAGE_SELF) around the whole run")
    };

    let per_row = |count: u64| count as f64 / rows.max(1) as f64;
    let mut wait_reports = BTreeMap::new();
    let mut waits_per_row = BTreeMap::new();
    for (wait_type, stat) in waits.waits() {
        let always = matches!(
            wait_type,
            WaitType::PageLatchEx
                | WaitType::PageLatchSh
                | WaitType::PageLatchUp
                | WaitType::WriteLog
                | WaitType::LogBuffer
                | WaitType::LckMS
                | WaitType::LckMX
        );
        if always || stat.waiting_tasks_count > 0 {
            wait_reports.insert(wait_type.name(), WaitReport::from(stat));
            waits_per_row.insert(wait_type.name(), per_row(stat.waiting_tasks_count));
        }
    }
    let latch_stats = waits
        .latches()
        .map(|(class, stat)| {
            (
                class.name(),
                LatchReport {
                    waiting_requests_count: stat.waiting_tasks_count,
                    wait_time_ms: round3(stat.wait_time_ms()),
                    max_wait_time_ms: round3(stat.max_wait_time_ms()),
                },
            )
        })
        .collect();
    let session_attribution = AttributionReport {
        pagelatch_ex_global: waits.wait(WaitType::PageLatchEx).waiting_tasks_count,
        pagelatch_ex_sessions: session_waits
            .wait(WaitType::PageLatchEx)
            .waiting_tasks_count,
        pagelatch_ex_wait_time_ms_global: round3(waits.wait(WaitType::PageLatchEx).wait_time_ms()),
        pagelatch_ex_wait_time_ms_sessions: round3(
            session_waits.wait(WaitType::PageLatchEx).wait_time_ms(),
        ),
        all_waits_global: waits
            .waits()
            .map(|(_, stat)| stat.waiting_tasks_count)
            .sum(),
        all_waits_sessions: session_waits.total_count(),
    };

    let statements = rows / rows_per_statement.max(1);
    let writelog = waits.wait(WaitType::WriteLog);
    let log = LogReport {
        commits_per_fsync: wal
            .and_then(|wal| wal.transactions_per_fsync(statements))
            .map(round3),
        wal,
        writelog_wait_us_per_commit: round3(
            writelog.wait_time_ns as f64 / 1000.0 / statements.max(1) as f64,
        ),
        writelog_waits_per_commit: round6(
            writelog.waiting_tasks_count as f64 / statements.max(1) as f64,
        ),
    };
    let (tree, indexes, integrity) = check(&db, &table, config);
    let micros = |nanos: u64| round3(nanos as f64 / 1000.0);
    Ok(InsertReport {
        config: ConfigReport {
            threads: config.threads,
            rows_per_thread: config.rows_per_thread,
            requested_rows_per_thread: requested.rows_per_thread,
            key: config.key,
            remedy: config.effective_remedy(),
            clustered_key: workload.clustered_key.clone(),
            nonclustered_indexes: workload.nonclustered.clone(),
            partitions: workload.partitions,
            optimize_for_sequential_key: config.effective_remedy() == Remedy::Ofsk,
            rows_per_statement,
            row_bytes: config.row_bytes,
            payload_column: workload.payload_sql.clone(),
            latch: config.latch.name(),
            insert_path: config.insert_path.name(),
            warmup_rows: config.warmup_rows,
            storage: if config.db_dir.is_some() {
                "durable"
            } else {
                "memory"
            },
            db: config.db_dir.as_ref().map(|dir| dir.display().to_string()),
            durability: config.db_dir.as_ref().map(|_| config.durability),
        },
        commits_per_fsync: log.commits_per_fsync,
        log,
        rows,
        elapsed_sec: round6(elapsed_sec),
        rows_per_sec: (rows as f64 / elapsed_sec).round(),
        latency_us: LatencyReport {
            p50: micros(latency_ns.value_at_quantile(0.50)),
            p99: micros(latency_ns.value_at_quantile(0.99)),
            p999: micros(latency_ns.value_at_quantile(0.999)),
            max: micros(latency_ns.max()),
            mean: round3(latency_ns.mean() / 1000.0),
        },
        latency_unit: if rows_per_statement > 1 {
            "statement"
        } else {
            "row"
        },
        waits: wait_reports,
        waits_per_row,
        latch_stats,
        session_attribution,
        context_switches_per_row: round6(per_row(context_switches.context_switches())),
        context_switches: ContextSwitchReport {
            voluntary: context_switches.voluntary,
            involuntary: context_switches.involuntary,
            source,
        },
        process_context_switches_per_row: round6(per_row(process_usage.context_switches())),
        cpu_sec: round6(process_usage.cpu_us as f64 / 1e6),
        page_faults_per_row: round6(per_row(process_usage.minor_faults)),
        other_cpu_load_percent,
        tree,
        indexes,
        integrity,
        notes,
    })
}

pub(crate) fn round6(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

/// One session's thread.
struct Worker {
    db: Database,
    table: Arc<Table>,
    /// The single-row insert of the payload column, prepared once for every session.
    insert: PreparedInsert,
    gate: Arc<StartGate>,
    stop: Arc<AtomicBool>,
    payload_column: usize,
    /// Rows to insert (a multiple of `rows_per_statement`).
    rows: u64,
    /// 1: single-row `insert`; more: `insert_batch_values` statements of that many rows.
    rows_per_statement: u64,
}

impl Worker {
    fn run(self, payload: Value, mut latency_ns: Histogram<u64>) -> WorkerResult {
        let session = self.db.session();
        let go = self.gate.arrive_and_wait();
        let usage_before = sys::thread_usage();
        let mut rows = 0;
        let mut error = None;
        let per_statement = self.rows_per_statement.max(1);
        if go {
            for _ in 0..self.rows / per_statement {
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                // A statement lends the session's payload to its rows, as a program binds one
                // buffer per parameter: nothing is built per row.
                let (started, inserted) = if per_statement == 1 {
                    let started = Instant::now();
                    let row = std::slice::from_ref(&payload);
                    (started, self.insert.insert(&session, row).map(|_| ()))
                } else {
                    let rows =
                        std::iter::repeat_n(std::slice::from_ref(&payload), per_statement as usize);
                    let columns = [self.payload_column];
                    let started = Instant::now();
                    (
                        started,
                        self.table
                            .insert_batch_values(&session, &columns, rows)
                            .map(|_| ()),
                    )
                };
                let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                if let Err(insert_error) = inserted {
                    error = Some(insert_error.to_string());
                    self.stop.store(true, Ordering::Relaxed);
                    break;
                }
                // `record` grows the (auto-resizing) histogram as needed; `saturating_record`
                // would clamp to its initial range instead of growing.
                if latency_ns.record(nanos).is_err() {
                    latency_ns.saturating_record(nanos);
                }
                rows += per_statement;
            }
        }
        let finished = Instant::now();
        let usage = usage_before
            .zip(sys::thread_usage())
            .map(|(before, after)| after.since(&before));
        WorkerResult {
            rows,
            latency_ns,
            finished,
            usage,
            session_waits: session.waits(),
            error,
        }
    }
}

/// Sums of wait counters over several snapshots (per-session snapshots, added up).
/// `WaitSnapshot` has no public addition, so the sum is kept per wait type.
#[derive(Default)]
struct WaitTotals {
    waits: [WaitStat; WaitType::COUNT],
}

impl WaitTotals {
    fn add(&mut self, snapshot: &WaitSnapshot) {
        for (total, wait_type) in self.waits.iter_mut().zip(WaitType::ALL) {
            let stat = snapshot.wait(wait_type);
            total.waiting_tasks_count += stat.waiting_tasks_count;
            total.wait_time_ns += stat.wait_time_ns;
            total.max_wait_time_ns = total.max_wait_time_ns.max(stat.max_wait_time_ns);
            total.signal_wait_time_ns += stat.signal_wait_time_ns;
        }
    }

    fn wait(&self, wait_type: WaitType) -> WaitStat {
        WaitType::ALL
            .iter()
            .position(|&candidate| candidate == wait_type)
            .map(|index| self.waits[index])
            .unwrap_or_default()
    }

    fn total_count(&self) -> u64 {
        self.waits.iter().map(|stat| stat.waiting_tasks_count).sum()
    }
}

/// The integrity check and every index's shape (summed over partitions), clustered first.
fn check(
    db: &Database,
    table: &Table,
    config: &InsertConfig,
) -> (TreeReport, Vec<TreeReport>, String) {
    let mut indexes: Vec<TreeReport> = table
        .trees()
        .map(|(name, trees)| {
            let mut stats = lastpage_storage::btree::TreeStats::default();
            for tree in trees {
                stats += tree.stats();
            }
            TreeReport {
                index: name.to_owned(),
                partitions: trees.len(),
                leaf_splits: stats.leaf_splits,
                leaf_appends: stats.leaf_appends,
                inner_splits: stats.inner_splits,
                split_restarts: stats.split_restarts,
                buffer_pool_pages: db.pool().page_count(),
                ..TreeReport::default()
            }
        })
        .collect();
    let expected = config.total_rows() + config.warmup_rows;
    let integrity = match db.check_integrity() {
        Err(error) => error.to_string(),
        Ok(checks) => match checks.iter().find(|check| check.table == table.name()) {
            None => format!("the integrity check did not report table {}", table.name()),
            Some(check) => {
                // The check lists each index once per partition; sum them up per index.
                for report in &mut indexes {
                    let shapes: Vec<_> = check
                        .indexes
                        .iter()
                        .filter(|(index, _)| *index == report.index)
                        .map(|(_, shape)| shape)
                        .collect();
                    if shapes.is_empty() {
                        continue;
                    }
                    let leaf_pages: u64 = shapes.iter().map(|shape| shape.leaf_pages).sum();
                    let fill_pages: f64 = shapes
                        .iter()
                        .map(|shape| shape.leaf_fill * shape.leaf_pages as f64)
                        .sum();
                    report.rows = Some(shapes.iter().map(|shape| shape.rows).sum());
                    report.leaf_pages = Some(leaf_pages);
                    report.inner_pages = Some(shapes.iter().map(|shape| shape.inner_pages).sum());
                    report.levels = shapes.iter().map(|shape| shape.levels).max();
                    report.leaf_fill = Some(round3(fill_pages / leaf_pages.max(1) as f64));
                }
                let clustered_rows = indexes.first().and_then(|report| report.rows);
                let next_identity = table.next_identity();
                if clustered_rows != Some(expected) {
                    format!(
                        "the clustered index holds {} rows, but {expected} were inserted",
                        clustered_rows.map_or_else(|| "no".to_owned(), |rows| rows.to_string())
                    )
                } else if check.rows != expected {
                    format!(
                        "the integrity check counts {} rows, but {expected} were inserted",
                        check.rows
                    )
                } else if table.row_count() != expected {
                    format!(
                        "the table counts {} rows, but {expected} were inserted",
                        table.row_count()
                    )
                } else if next_identity.is_none_or(|next| next <= expected as i64) {
                    // Sequence lanes reserve identity values in blocks, so the next value may
                    // lie beyond the rows inserted (values reserved but unused are skipped, as
                    // SQL Server's identity cache skips them), but never at or below them.
                    format!(
                        "the next identity value is {next_identity:?}, but {expected} rows took \
                         values from 1"
                    )
                } else if let Some(index) =
                    indexes.iter().find(|index| index.rows != Some(expected))
                {
                    format!(
                        "index {} holds {:?} entries, but {expected} rows were inserted",
                        index.index, index.rows
                    )
                } else {
                    "ok".to_owned()
                }
            }
        },
    };
    let tree = indexes.first().cloned().unwrap_or_else(|| TreeReport {
        index: format!("PK_{}", table.name()),
        ..TreeReport::default()
    });
    (tree, indexes, integrity)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(no message)".to_owned()
    }
}
