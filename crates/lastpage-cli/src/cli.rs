//! Command-line flags. Parsing only: the workloads live in [`crate::bench`].

use clap::{Args, Parser, Subcommand, ValueEnum};
use lastpage_engine::{InsertPath, LatchPolicy};

use std::path::PathBuf;
use std::time::Duration;

use lastpage_storage::limits::{CHECKPOINT_LOG_BYTES, WAL_SEGMENT_BYTES};

use crate::bench::checkpoint::{CheckpointConfig, MAX_CHECKPOINT_LOG_MB};
use crate::bench::durable::DurableConfig;
use crate::bench::insert::{InsertConfig, KeyKind, MAX_ROW_BYTES, Remedy};
use crate::bench::matrix::MatrixConfig;
use crate::bench::recovery::{MAX_LOG_MB, RecoveryConfig};
use crate::durable::Durability;

/// Most threads one run may start.
pub const MAX_THREADS: u32 = 4096;

/// lastpage: SQL Server's last-page insert contention, reproduced in an embedded engine.
#[derive(Debug, Parser)]
#[command(name = "lastpage", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Benchmarks over the embedded engine.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Kills a process that inserts durably (and creates, fills and drops a scratch table over
    /// and over) with SIGKILL at a random moment, reopens the database and checks that no
    /// acknowledged row was lost or duplicated, no identity value was handed out twice, the
    /// integrity check passes and every page in use belongs to a tree; repeats --cycles times on the same
    /// database. Prints one line per cycle (rows acknowledged in the cycle; the table's rows and
    /// its rows never acknowledged, which are fine: committed, then killed before the
    /// acknowledgement was written; recovery time) and a summary
    /// `cycles=K acked=N lost=0 duplicates=0 reused=0`; exits with 1 if anything was lost,
    /// duplicated or reused or the check failed.
    CrashTest(CrashTestArgs),
    /// The process `crash-test` kills (internal): inserts durably and prints every
    /// acknowledged identity value on stdout.
    #[command(hide = true)]
    CrashChild(CrashChildArgs),
}

/// `lastpage bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Many sessions insert single rows concurrently (like `ostress -n<threads> -r<rows>`);
    /// reports throughput, per-insert latency, wait statistics, tree shape and integrity.
    Insert(InsertArgs),
    /// Ascending vs random clustered key, interleaved in one process, at 1, 2, 100 and 300
    /// threads, for 100- and 8000-byte rows and both latch flavours (medians of --repeat runs;
    /// classic insert path).
    InsertCompare(CompareArgs),
    /// Every remedy x insert path x latch flavour, interleaved in one process, at 1, 2, 100 and
    /// 300 threads for 100- and 8000-byte rows, against the ascending classic+fifo baseline, the
    /// random key and an "ideal append" reference; ends with the judged figures.
    InsertMatrix(MatrixArgs),
    /// Durable inserts, lastpage (Durability::Full) against SQLite (WAL mode,
    /// synchronous=FULL, one connection shared by the threads), interleaved in one process:
    /// single-row autocommit inserts at each --threads count, then one thread inserting
    /// --batch-rows-row transactions, committed one by one and (lastpage only) pipelined: the
    /// next batch is built while the previous one is flushed, and counts once durable. Reports
    /// rows/s, commit latency, commits per fdatasync, WRITELOG wait per commit and lastpage ÷
    /// SQLite. About 35 s with the defaults.
    Durable(DurableArgs),
    /// The time to recover a large log: one thread fills a fresh durable database
    /// (Durability::Full, automatic checkpoints off) with 1,000-row transactions of 100-byte
    /// rows until the log holds --log-mb MiB, flushes the log and drops the database without
    /// closing it (a crash: no checkpoint), then times Database::open on it. Reports the log
    /// bytes and records replayed, the transactions applied, the replay's and the closing
    /// checkpoint's durations, the whole open, MiB/s and records/s of replay; then checks that
    /// the row count, a full scan and the integrity check find every row inserted (exit code 1
    /// if not). About 10–20 seconds for the default 1 GiB on a fast disk.
    Recovery(RecoveryArgs),
    /// What a checkpoint costs the writers that run through it: one thread fills a fresh
    /// durable database (Durability::Full, automatic checkpoints off) with 1,000-row
    /// transactions of 100-byte rows until the log holds --log-mb MiB (by default what an
    /// automatic checkpoint finds), then a writer of 100-row statements runs for a baseline
    /// window and on through one checkpoint. Reports the checkpoint's pause (writers stopped)
    /// and duration, and the writer's rows/s, p50, p99 and longest statement in both windows;
    /// then checks the row count and the integrity (exit code 1 if wrong).
    Checkpoint(CheckpointArgs),
}

/// The latch flavour of the clustered index's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LatchArg {
    /// Fair FIFO hand-off, like SQL Server's page latches (convoys under last-page inserts).
    Fifo,
    /// Unfair spin-then-park latch (no hand-off, no convoys).
    Adaptive,
}

impl From<LatchArg> for LatchPolicy {
    fn from(latch: LatchArg) -> LatchPolicy {
        match latch {
            LatchArg::Fifo => LatchPolicy::Fifo,
            LatchArg::Adaptive => LatchPolicy::Adaptive,
        }
    }
}

/// How inserts reach the leaf, on every index of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    /// Latch coupling from the root for every insert (SQL Server's way; last-page convoys).
    Classic,
    /// Ours: appends go straight to the cached last leaf through the tail gate.
    Default,
}

impl From<PathArg> for InsertPath {
    fn from(path: PathArg) -> InsertPath {
        match path {
            PathArg::Classic => InsertPath::Classic,
            PathArg::Default => InsertPath::Default,
        }
    }
}

/// A remedy for last-page insert contention (seed 000's experiments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RemedyArg {
    /// None: the clustered PRIMARY KEY on the --key column.
    None,
    /// OPTIMIZE_FOR_SEQUENTIAL_KEY = ON on every index (BTREE_INSERT_FLOW_CONTROL waits).
    Ofsk,
    /// Cluster on the NEWID() column and add a UNIQUE NONCLUSTERED index on InsertID (which is
    /// itself an ascending hot spot).
    Nonseq,
    /// `ModValue AS InsertID % 16 PERSISTED` leading the clustered key (ModValue, key column).
    Mod16,
    /// mod16, and the table hash-partitioned on ModValue into 16 partitions (16 B-trees).
    Partition16,
    /// Each session inserts its rows in 100-row statements (`insert_batch_values`); --rows-per-thread
    /// is rounded up to a multiple of 100 and latencies are per statement.
    Batch100,
}

impl From<RemedyArg> for Remedy {
    fn from(remedy: RemedyArg) -> Remedy {
        match remedy {
            RemedyArg::None => Remedy::None,
            RemedyArg::Ofsk => Remedy::Ofsk,
            RemedyArg::Nonseq => Remedy::NonSeq,
            RemedyArg::Mod16 => Remedy::Mod16,
            RemedyArg::Partition16 => Remedy::Partition16,
            RemedyArg::Batch100 => Remedy::Batch100,
        }
    }
}

/// The clustered key of the benchmark table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeyArg {
    /// Clustered PRIMARY KEY on `InsertID int IDENTITY(1,1)`: every insert goes to the last page.
    Ascending,
    /// Clustered PRIMARY KEY on a `uniqueidentifier DEFAULT NEWID()`: inserts land everywhere.
    Random,
    /// Clustered PRIMARY KEY (ModValue, InsertID) with `ModValue AS InsertID % 16 PERSISTED`:
    /// sixteen insertion points. The same as `--key ascending --remedy mod16`; it combines only
    /// with `--remedy none`, `mod16` or `partition16`.
    Mod16,
}

impl From<KeyArg> for KeyKind {
    fn from(key: KeyArg) -> KeyKind {
        match key {
            KeyArg::Ascending => KeyKind::Ascending,
            KeyArg::Random => KeyKind::Random,
            KeyArg::Mod16 => KeyKind::Mod16,
        }
    }
}

/// `lastpage bench insert`
#[derive(Debug, Args)]
pub struct InsertArgs {
    /// Concurrent sessions, one thread each.
    #[arg(long, default_value_t = 100, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREADS)))]
    pub threads: u32,
    /// Single-row inserts per session.
    #[arg(long, default_value_t = 1000, value_name = "R", value_parser = positive)]
    pub rows_per_thread: u64,
    /// Clustered key of the table.
    #[arg(long, value_enum, default_value_t = KeyArg::Ascending)]
    pub key: KeyArg,
    /// Payload bytes per row: VARCHAR(B) up to 900 bytes, CHAR(B) above (CHAR(8000) fills a page).
    #[arg(long, default_value_t = 100, value_name = "B",
          value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_ROW_BYTES)))]
    pub row_bytes: u16,
    /// Latch flavour of every index's pages.
    #[arg(long, value_enum, default_value_t = LatchArg::Adaptive)]
    pub latch: LatchArg,
    /// Insert path of every index.
    #[arg(long, value_enum, default_value_t = PathArg::Default)]
    pub path: PathArg,
    /// Remedy for last-page contention applied to the table.
    #[arg(long, value_enum, default_value_t = RemedyArg::None)]
    pub remedy: RemedyArg,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Rows one session inserts before the measured run (not measured, not counted in `rows`).
    #[arg(long, default_value_t = 0, value_name = "W")]
    pub warmup_rows: u64,
    /// Create a durable database in this directory (new or empty) instead of the in-memory
    /// one; the JSON then reports commits per fdatasync and the log's waits. The database is
    /// left there afterwards.
    #[arg(long, value_name = "DIR")]
    pub db: Option<PathBuf>,
    /// When a commit returns in the durable database (needs --db).
    #[arg(long, value_enum, requires = "db", value_name = "MODE")]
    pub durability: Option<Durability>,
}

impl InsertArgs {
    /// The harness configuration these flags describe.
    pub fn config(&self) -> InsertConfig {
        InsertConfig {
            threads: self.threads,
            rows_per_thread: self.rows_per_thread,
            key: self.key.into(),
            row_bytes: self.row_bytes,
            latch: self.latch.into(),
            insert_path: self.path.into(),
            remedy: self.remedy.into(),
            warmup_rows: self.warmup_rows,
            db_dir: self.db.clone(),
            durability: self.durability.unwrap_or(Durability::Full),
        }
    }
}

/// `lastpage bench durable`
#[derive(Debug, Args)]
pub struct DurableArgs {
    /// Thread counts of the single-row autocommit cells, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [1, 10, 100, 300],
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREADS)))]
    pub threads: Vec<u32>,
    /// Seconds each cell runs (each cell also stops at 5,000,000 rows).
    #[arg(long, default_value_t = 3.0, value_name = "S", value_parser = seconds,
          conflicts_with = "rows")]
    pub seconds: f64,
    /// Rows each cell inserts (split across its threads), instead of running for --seconds.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub rows: Option<u64>,
    /// Rows per transaction of the one-thread batched cells. At least 2: one-row
    /// transactions are the single-row cells, which have no pipelined form.
    #[arg(long, default_value_t = 1000, value_name = "R",
          value_parser = clap::value_parser!(u64).range(2..=100_000))]
    pub batch_rows: u64,
    /// Directory for the databases (a fresh subdirectory is created in it and removed at the
    /// end; a DIR that does not exist is created and, left empty, removed too). Default: the
    /// system's temporary directory. Put it on the disk you want to measure: on tmpfs an
    /// fdatasync costs nothing.
    #[arg(long, value_name = "DIR")]
    pub db: Option<PathBuf>,
    /// A smoke run: 0.3 s per cell at 1 and 4 threads, batches of 100 rows.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl DurableArgs {
    /// The run these flags describe (`--quick` overrides the sizes).
    pub fn config(&self) -> DurableConfig {
        let mut threads = Vec::new();
        for &count in &self.threads {
            if !threads.contains(&count) {
                threads.push(count);
            }
        }
        if self.quick {
            return DurableConfig {
                threads: vec![1, 4],
                seconds: 0.3,
                rows: None,
                batch_rows: 100,
                db: self.db.clone(),
            };
        }
        DurableConfig {
            threads,
            seconds: self.seconds,
            rows: self.rows,
            batch_rows: self.batch_rows,
            db: self.db.clone(),
        }
    }
}

/// `lastpage bench recovery`
#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// MiB of log to write before the crash (the load stops at the first commit that reaches
    /// it). About 9,000 rows per MiB.
    #[arg(long, default_value_t = 1024, value_name = "N", conflicts_with = "quick",
          value_parser = clap::value_parser!(u64).range(1..=MAX_LOG_MB))]
    pub log_mb: u64,
    /// The buffer pool's memory budget, MiB. Keep it above the table's size (about the log's
    /// size): otherwise pages are evicted while loading and recovering, and the run measures
    /// the eviction too.
    #[arg(long, default_value_t = 4096, value_name = "M",
          value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub memory_mb: u64,
    /// Directory for the database (a fresh subdirectory is created in it; a DIR that does not
    /// exist is created, and removed at the end with it unless --keep). Default: the
    /// system's temporary directory. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub db: Option<PathBuf>,
    /// Leave the database there afterwards (it is removed by default). Opening it again
    /// replays nothing: recovery ended with a checkpoint.
    #[arg(long)]
    pub keep: bool,
    /// A smoke run: 16 MiB of log.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// MiB of log a `bench recovery --quick` writes.
pub const QUICK_LOG_MB: u64 = 16;

impl RecoveryArgs {
    /// The run these flags describe (`--quick` overrides the log size).
    pub fn config(&self) -> RecoveryConfig {
        RecoveryConfig {
            log_mb: if self.quick {
                QUICK_LOG_MB
            } else {
                self.log_mb
            },
            memory_mb: self.memory_mb,
            db: self.db.clone(),
            keep: self.keep,
        }
    }
}

/// `lastpage bench checkpoint`
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// MiB of log to write before the checkpoint: the default is the log size at which a
    /// database takes an automatic checkpoint. About 9,000 rows per MiB.
    #[arg(long, default_value_t = CHECKPOINT_LOG_BYTES >> 20, value_name = "N",
          conflicts_with = "quick",
          value_parser = clap::value_parser!(u64).range(1..=MAX_CHECKPOINT_LOG_MB))]
    pub log_mb: u64,
    /// The buffer pool's memory budget, MiB (keep the table in memory to measure only the
    /// checkpoint).
    #[arg(long, default_value_t = 4096, value_name = "M",
          value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub memory_mb: u64,
    /// Length of the writer's baseline window, milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub baseline_ms: u64,
    /// Directory for the database (a fresh subdirectory is created in it and removed at the
    /// end; a DIR that does not exist is created and, left empty, removed too). Default: the
    /// system's temporary directory. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub db: Option<PathBuf>,
    /// A smoke run: 16 MiB of log, a 200 ms baseline.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl CheckpointArgs {
    /// The run these flags describe (`--quick` overrides the log size and the baseline).
    pub fn config(&self) -> CheckpointConfig {
        CheckpointConfig {
            log_mb: if self.quick {
                QUICK_LOG_MB
            } else {
                self.log_mb
            },
            memory_mb: self.memory_mb,
            baseline: Duration::from_millis(if self.quick { 200 } else { self.baseline_ms }),
            db: self.db.clone(),
        }
    }
}

/// `lastpage crash-test`
#[derive(Debug, Args)]
pub struct CrashTestArgs {
    /// The database directory (created if missing). Every cycle reopens the same database, so
    /// rows accumulate across cycles; an existing crash-test database is continued.
    #[arg(long, value_name = "DIR")]
    pub db: PathBuf,
    /// Inserting threads in the child process.
    #[arg(long, default_value_t = 8, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// The child is killed at a random moment between S/2 and S seconds after it started
    /// inserting.
    #[arg(long, default_value_t = 2.0, value_name = "S", value_parser = seconds)]
    pub seconds: f64,
    /// Kill-and-recover cycles.
    #[arg(long, default_value_t = 3, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub cycles: u32,
    /// Seed of the kill moments and of the children's choices (default: from the clock; it is
    /// printed either way, so a run can be repeated).
    #[arg(long, value_name = "X")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub log: CrashLogArgs,
}

/// The log settings of a crash test's database. Small segments and frequent checkpoints make
/// checkpoints, log truncation and segment recycling run many times in a short test, each
/// liable to be cut short by the kill.
#[derive(Debug, Clone, Copy, Args)]
pub struct CrashLogArgs {
    /// Log segment size of a new database, KiB (an existing log keeps its own).
    #[arg(long, default_value_t = WAL_SEGMENT_BYTES >> 10, value_name = "KIB",
          value_parser = clap::value_parser!(u64).range(64..=(1 << 20)))]
    pub log_segment_kib: u64,
    /// MiB of log after which a checkpoint starts by itself.
    #[arg(long, default_value_t = CHECKPOINT_LOG_BYTES >> 20, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    pub checkpoint_mib: u64,
}

impl CrashLogArgs {
    /// The arguments that pass these settings on to a child process.
    pub fn to_args(self) -> [String; 4] {
        [
            "--log-segment-kib".into(),
            self.log_segment_kib.to_string(),
            "--checkpoint-mib".into(),
            self.checkpoint_mib.to_string(),
        ]
    }
}

/// `lastpage crash-child` (internal)
#[derive(Debug, Args)]
pub struct CrashChildArgs {
    /// The database directory.
    #[arg(long, value_name = "DIR")]
    pub db: PathBuf,
    /// Inserting threads.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Seed of the mix of single rows, batches and rolled-back transactions.
    #[arg(long, value_name = "X")]
    pub seed: u64,
    /// The crash test's run tag, stored in every row.
    #[arg(long, value_name = "R")]
    pub run: i64,
    /// The cycle, stored in every row.
    #[arg(long, value_name = "C")]
    pub cycle: i32,
    #[command(flatten)]
    pub log: CrashLogArgs,
}

/// `lastpage bench insert-compare`
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Rows per thread in every cell. Default for 100-byte rows: 60,000 rows per cell split
    /// across the threads, but at least 1,000 per thread (shorter runs often end before a
    /// convoy forms), so 100 and 300 threads insert 100,000 and 300,000 rows. 8000-byte cells:
    /// 30,000 rows split across the threads, a cap that also applies to an explicit value
    /// (each row takes a whole 8 KiB page).
    #[arg(long, value_name = "R", value_parser = positive)]
    pub rows_per_thread: Option<u64>,
    /// Runs of each key per cell (interleaved ascending, random, ascending, ...); the table
    /// shows medians.
    #[arg(long, default_value_t = 3, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `lastpage bench insert-matrix`
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Rows per thread in every cell. Default: 180,000 rows per cell split across the threads
    /// for 100-byte rows (600 per thread at 300 threads, enough for convoys to form), 60,000 for
    /// 8000-byte rows (each takes a whole page); an explicit value is capped at 60,000 rows per
    /// cell for rows over 900 bytes. batch100 cells round it up to a multiple of 100.
    #[arg(long, value_name = "R", value_parser = positive)]
    pub rows_per_thread: Option<u64>,
    /// Runs of every cell (the cell order rotated between repetitions); the tables show
    /// medians. The default 3 takes about 6 minutes on 2 cores (one repetition about 2 minutes).
    #[arg(long, default_value_t = 3, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Thread counts, comma-separated. The judged figures use 100 and 300 threads if present,
    /// else the largest count given.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [1, 2, 100, 300],
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREADS)))]
    pub threads: Vec<u32>,
    /// Payload bytes per row, comma-separated (1..=8000).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [100, 8000],
          value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_ROW_BYTES)))]
    pub row_bytes: Vec<u16>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl MatrixArgs {
    /// The matrix these flags describe (duplicates in the lists dropped, order kept).
    pub fn config(&self) -> MatrixConfig {
        let mut threads = Vec::new();
        for &count in &self.threads {
            if !threads.contains(&count) {
                threads.push(count);
            }
        }
        let mut row_bytes = Vec::new();
        for &bytes in &self.row_bytes {
            if !row_bytes.contains(&bytes) {
                row_bytes.push(bytes);
            }
        }
        MatrixConfig {
            rows_per_thread: self.rows_per_thread,
            repeat: self.repeat,
            threads,
            row_bytes,
        }
    }
}

/// A number of seconds: more than 0, at most an hour.
fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value > 0.0 && value <= 3600.0 => Ok(value),
        Ok(_) => Err("must be more than 0 and at most 3600".to_owned()),
        Err(_) => Err(format!("'{text}' is not a number of seconds")),
    }
}

/// A whole number of at least 1.
fn positive(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(value) => Ok(value),
        Err(_) => Err(format!("'{text}' is not a whole number of at least 1")),
    }
}
