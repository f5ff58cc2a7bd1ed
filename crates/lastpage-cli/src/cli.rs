//! Command-line flags. Parsing only: the workloads live in [`crate::bench`].

use clap::{Args, Parser, Subcommand, ValueEnum};
use lastpage_engine::LatchPolicy;

use crate::bench::insert::{InsertConfig, KeyKind, MAX_ROW_BYTES};

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
}

/// `lastpage bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Many sessions insert single rows concurrently (like `ostress -n<threads> -r<rows>`);
    /// reports throughput, per-insert latency, wait statistics, tree shape and integrity.
    Insert(InsertArgs),
    /// Ascending vs random clustered key, interleaved in one process, at 1, 2, 100 and 300
    /// threads, for 100- and 8000-byte rows and both latch flavours (medians of --repeat runs).
    InsertCompare(CompareArgs),
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

/// The clustered key of the benchmark table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeyArg {
    /// Clustered PRIMARY KEY on `InsertID int IDENTITY(1,1)`: every insert goes to the last page.
    Ascending,
    /// Clustered PRIMARY KEY on a `uniqueidentifier DEFAULT NEWID()`: inserts land everywhere.
    Random,
    /// Clustered PRIMARY KEY (ModValue, InsertID) with `ModValue AS InsertID % 16 PERSISTED`:
    /// sixteen insertion points.
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
    /// Latch flavour of the clustered index's pages.
    #[arg(long, value_enum, default_value_t = LatchArg::Adaptive)]
    pub latch: LatchArg,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Rows one session inserts before the measured run (not measured, not counted in `rows`).
    #[arg(long, default_value_t = 0, value_name = "W")]
    pub warmup_rows: u64,
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
            warmup_rows: self.warmup_rows,
        }
    }
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

/// A whole number of at least 1.
fn positive(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(value) => Ok(value),
        Err(_) => Err(format!("'{text}' is not a whole number of at least 1")),
    }
}
