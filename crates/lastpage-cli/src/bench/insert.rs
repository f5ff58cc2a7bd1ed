//! The insert harness: many sessions, single-row inserts, one table, one process.
//!
//! [`run_insert_bench`] builds the table a [`Workload`] describes in a fresh in-memory
//! database, optionally warms it up, starts every session's thread at once and measures:
//! throughput, per-insert latency (HdrHistogram), wait and latch statistics (global and
//! attributed to sessions), context switches and CPU time (`getrusage`), the clustered tree's
//! shape and split counters, and the database's integrity check.
//!
//! Everything the run measures is in the [`InsertReport`], which serializes to the JSON that
//! `lastpage bench insert --json` prints; [`crate::bench::render`] draws it as tables.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use hdrhistogram::Histogram;
use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, DefaultValue, IndexDef, IndexOptions,
    InsertPath, InsertRow, LatchPolicy, Table, TableDef, Uniqueness, Value, WaitSnapshot, WaitStat,
    WaitType,
};
use lastpage_storage::limits::PAGE_SIZE_BYTES;
use serde::Serialize;

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

    /// The clustered key's columns, as SQL would spell them.
    pub fn clustered_key(self) -> &'static str {
        match self {
            KeyKind::Ascending => "InsertID",
            KeyKind::Random => "RowGuid",
            KeyKind::Mod16 => "ModValue, InsertID",
        }
    }
}

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
    /// Latch flavour of the clustered index's pages.
    pub latch: LatchPolicy,
    /// Rows one session inserts before the measured run.
    pub warmup_rows: u64,
}

impl Default for InsertConfig {
    fn default() -> Self {
        InsertConfig {
            threads: 100,
            rows_per_thread: 1000,
            key: KeyKind::Ascending,
            row_bytes: 100,
            latch: LatchPolicy::Adaptive,
            warmup_rows: 0,
        }
    }
}

impl InsertConfig {
    /// Rows the measured run inserts.
    pub fn total_rows(&self) -> u64 {
        u64::from(self.threads).saturating_mul(self.rows_per_thread)
    }

    /// Rejects configurations the harness cannot run (an [`BenchError::InvalidConfig`]).
    pub fn validate(&self) -> Result<(), BenchError> {
        let invalid = |message: String| Err(BenchError::InvalidConfig(message));
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
}

impl Workload {
    /// The table for `config`: `InsertID int IDENTITY(1,1)`, a payload column of
    /// `config.row_bytes` bytes (`Name VARCHAR(B)` up to 900 bytes, else `Payload CHAR(B)`), and
    /// the clustered key `config.key` asks for, whose pages use `config.latch`.
    pub fn for_config(config: &InsertConfig) -> Workload {
        let bytes = config.row_bytes;
        let (payload_name, payload_type, type_sql) = if bytes <= MAX_VARCHAR_ROW_BYTES {
            ("Name", DataType::VarChar(bytes), "VARCHAR")
        } else {
            ("Payload", DataType::Char(bytes), "CHAR")
        };
        let options = IndexOptions {
            latch_policy: config.latch,
            insert_path: InsertPath::Classic,
            optimize_for_sequential_key: false,
        };
        let identity = ColumnDef::new("InsertID", DataType::Int).identity(1, 1);
        let payload = ColumnDef::new(payload_name, payload_type).not_null();
        let name = format!("InsertContention_{bytes}");
        let (table, payload_column) = match config.key {
            KeyKind::Ascending => (
                TableDef::new(&name)
                    .column(identity)
                    .column(payload)
                    .clustered(
                        IndexDef::new(format!("PK_{name}"), &["InsertID"], Uniqueness::PrimaryKey)
                            .with_options(options),
                    ),
                1,
            ),
            KeyKind::Random => (
                TableDef::new(&name)
                    .column(identity)
                    .column(
                        ColumnDef::new("RowGuid", DataType::UniqueIdentifier)
                            .not_null()
                            .default_value(DefaultValue::NewId),
                    )
                    .column(payload)
                    .clustered(
                        IndexDef::new(format!("PK_{name}"), &["RowGuid"], Uniqueness::PrimaryKey)
                            .with_options(options),
                    ),
                2,
            ),
            KeyKind::Mod16 => (
                TableDef::new(&name)
                    .column(identity)
                    .column(payload)
                    .column(
                        // ModValue AS CONVERT(TINYINT, ABS(InsertID % 16)) PERSISTED NOT NULL
                        ColumnDef::new("ModValue", DataType::TinyInt)
                            .not_null()
                            .computed(Arc::new(|row: &[Value]| {
                                Ok(match row.first().and_then(Value::as_i64) {
                                    Some(id) => Value::TinyInt((id % 16).unsigned_abs() as u8),
                                    None => Value::Null,
                                })
                            })),
                    )
                    .clustered(
                        IndexDef::new(
                            format!("PK_{name}"),
                            &["ModValue", "InsertID"],
                            Uniqueness::PrimaryKey,
                        )
                        .with_options(options),
                    ),
                1,
            ),
        };
        Workload {
            table,
            payload_column,
            payload_sql: format!("{payload_name} {type_sql}({bytes})"),
        }
    }

    /// The payload thread `thread` inserts: `row_bytes` ASCII letters.
    fn payload(&self, thread: usize, row_bytes: u16) -> Value {
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
    /// `ascending`, `random` or `mod16`.
    pub key: KeyKind,
    /// The clustered key's columns.
    pub clustered_key: &'static str,
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// The payload column, e.g. `Name VARCHAR(100)`.
    pub payload_column: String,
    /// `fifo` or `adaptive`.
    pub latch: &'static str,
    /// `classic`.
    pub insert_path: &'static str,
    /// Rows inserted before the measured run.
    pub warmup_rows: u64,
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

/// The clustered index after the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TreeReport {
    /// The index's name.
    pub index: String,
    /// Rows the integrity check counted (absent if the check failed).
    pub rows: Option<u64>,
    /// Leaf pages.
    pub leaf_pages: Option<u64>,
    /// Inner pages.
    pub inner_pages: Option<u64>,
    /// Levels, leaves included.
    pub levels: Option<u8>,
    /// Average fraction of each leaf's body in use.
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
    /// Rows inserted by the measured run.
    pub rows: u64,
    /// Wall time from the start signal until the last session finished.
    pub elapsed_sec: f64,
    /// `rows / elapsed_sec`.
    pub rows_per_sec: f64,
    /// Per-insert latency (`Table::insert` only), microseconds.
    pub latency_us: LatencyReport,
    /// Every wait type with a nonzero count, plus PAGELATCH_EX/SH/UP always.
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
    /// Share of the machine's CPU capacity other processes (or the hypervisor: steal time) used
    /// during the run, from `/proc/stat`; absent for runs under 0.2 s. Wall-clock numbers of a
    /// run with a high value are not comparable with those of a quiet run.
    pub other_cpu_load_percent: Option<f64>,
    /// The clustered index's shape and split counters.
    pub tree: TreeReport,
    /// `"ok"`, or what the integrity check found.
    pub integrity: String,
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

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Lets every thread get ready, then releases them at once (like a barrier, but it can also
/// call the run off if a thread cannot be started).
///
/// The release is the coordinator dropping a write lock that the threads wait to read: unlike
/// a condition variable, whose woken waiters must re-take its mutex one by one (so the threads
/// would start staggered, each able to finish a short run before the next one begins), every
/// reader is woken at once and none waits for another.
struct StartGate {
    ready: Mutex<usize>,
    all_ready: Condvar,
    go: RwLock<()>,
    run: AtomicBool,
}

impl StartGate {
    fn new() -> StartGate {
        StartGate {
            ready: Mutex::new(0),
            all_ready: Condvar::new(),
            go: RwLock::new(()),
            run: AtomicBool::new(false),
        }
    }

    /// Closes the gate: threads that arrive wait until the returned guard drops.
    fn close(&self) -> RwLockWriteGuard<'_, ()> {
        self.go
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A thread is ready; blocks until the gate opens. Returns whether to run.
    fn arrive_and_wait(&self) -> bool {
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
    fn wait_ready(&self, count: usize) {
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
    fn open(&self, closed: RwLockWriteGuard<'_, ()>, run: bool) {
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
/// `config.threads` sessions inserting `config.rows_per_thread` single rows each.
pub fn run_insert_bench(config: &InsertConfig) -> Result<InsertReport, BenchError> {
    config.validate()?;
    let failed =
        |what: &str, error: &dyn std::fmt::Display| BenchError::Failed(format!("{what}: {error}"));
    let workload = Workload::for_config(config);
    let db = Database::create(DatabaseOptions::default())
        .map_err(|error| failed("cannot create the database", &error))?;
    let table = db
        .create_table(workload.table.clone())
        .map_err(|error| failed("cannot create the table", &error))?;

    if config.warmup_rows > 0 {
        let session = db.session();
        let payload = workload.payload(0, config.row_bytes);
        for _ in 0..config.warmup_rows {
            table
                .insert(
                    &session,
                    InsertRow::new().set(workload.payload_column, payload.clone()),
                )
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
            gate: Arc::clone(&gate),
            stop: Arc::clone(&stop),
            payload_column: workload.payload_column,
            rows: config.rows_per_thread,
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
    let process_before = sys::process_usage();
    let machine_before = sys::MachineCpu::now();
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
    let process_usage = sys::process_usage().since(&process_before);
    let other_cpu_load_percent = machine_before
        .zip(sys::MachineCpu::now())
        .and_then(|(before, after)| {
            after.other_load_percent(&before, process_usage.cpu_us as f64 / 1e6)
        })
        .map(|percent| percent.round());
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
            WaitType::PageLatchEx | WaitType::PageLatchSh | WaitType::PageLatchUp
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

    let (tree, integrity) = check(&db, &table, config);
    let micros = |nanos: u64| round3(nanos as f64 / 1000.0);
    Ok(InsertReport {
        config: ConfigReport {
            threads: config.threads,
            rows_per_thread: config.rows_per_thread,
            key: config.key,
            clustered_key: config.key.clustered_key(),
            row_bytes: config.row_bytes,
            payload_column: workload.payload_sql.clone(),
            latch: config.latch.name(),
            insert_path: InsertPath::Classic.name(),
            warmup_rows: config.warmup_rows,
        },
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
        other_cpu_load_percent,
        tree,
        integrity,
    })
}

fn round6(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

/// One session's thread.
struct Worker {
    db: Database,
    table: Arc<Table>,
    gate: Arc<StartGate>,
    stop: Arc<AtomicBool>,
    payload_column: usize,
    rows: u64,
}

impl Worker {
    fn run(self, payload: Value, mut latency_ns: Histogram<u64>) -> WorkerResult {
        let session = self.db.session();
        let go = self.gate.arrive_and_wait();
        let usage_before = sys::thread_usage();
        let mut rows = 0;
        let mut error = None;
        if go {
            for _ in 0..self.rows {
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                let row = InsertRow::new().set(self.payload_column, payload.clone());
                let started = Instant::now();
                let inserted = self.table.insert(&session, row);
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
                rows += 1;
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

/// The integrity check and the clustered tree's shape.
fn check(db: &Database, table: &Table, config: &InsertConfig) -> (TreeReport, String) {
    let mut stats = lastpage_storage::btree::TreeStats::default();
    for tree in table.clustered_trees() {
        stats += tree.stats();
    }
    let mut tree = TreeReport {
        index: format!("PK_{}", table.name()),
        leaf_splits: stats.leaf_splits,
        leaf_appends: stats.leaf_appends,
        inner_splits: stats.inner_splits,
        split_restarts: stats.split_restarts,
        buffer_pool_pages: db.pool().page_count(),
        ..TreeReport::default()
    };
    let expected = config.total_rows() + config.warmup_rows;
    let integrity = match db.check_integrity() {
        Err(error) => error.to_string(),
        Ok(checks) => {
            let clustered = checks
                .iter()
                .find(|check| check.table == table.name())
                .and_then(|check| check.indexes.first());
            match clustered {
                None => format!("the integrity check did not report table {}", table.name()),
                Some((index, shape)) => {
                    tree.index.clone_from(index);
                    tree.rows = Some(shape.rows);
                    tree.leaf_pages = Some(shape.leaf_pages);
                    tree.inner_pages = Some(shape.inner_pages);
                    tree.levels = Some(shape.levels);
                    tree.leaf_fill = Some(round3(shape.leaf_fill));
                    let next_identity = table.next_identity();
                    if shape.rows != expected {
                        format!(
                            "the clustered index holds {} rows, but {expected} were inserted",
                            shape.rows
                        )
                    } else if table.row_count() != expected {
                        format!(
                            "the table counts {} rows, but {expected} were inserted",
                            table.row_count()
                        )
                    } else if next_identity != Some(expected as i64 + 1) {
                        format!(
                            "the next identity value is {next_identity:?}, expected {}",
                            expected + 1
                        )
                    } else {
                        "ok".to_owned()
                    }
                }
            }
        }
    };
    (tree, integrity)
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
