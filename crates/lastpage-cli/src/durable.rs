//! The durable side of the engine's API, as the CLI uses it, in one place.
//!
//! `bench insert --db`, `bench durable`, `bench recovery` and `crash-test` open durable
//! databases, read the log writer's group-commit counters and the recovery figures. They reach the engine only through
//! the functions here, so that the rest of the CLI is written once against these names and
//! only this file follows the engine's API as it changes.

use std::path::Path;
use std::time::Duration;

use lastpage_engine::{Database, DatabaseOptions, Durability as EngineDurability};
use lastpage_storage::wal::WalConfig;

/// When a commit counts as done, as `--durability` names it (the doc comments are its help).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A commit returns once its log records are on disk (fdatasync; group commit shares one).
    Full,
    /// A commit returns once its log records are in the log buffer; a background flush makes
    /// them durable shortly after (SQL Server's delayed durability).
    Delayed,
    /// Nothing is logged: the benchmark's table is a non-logged table, which reaches the data
    /// file only at checkpoints and which recovery empties after a crash.
    None,
}

impl Durability {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Delayed => "delayed",
            Durability::None => "none",
        }
    }
}

/// The log writer's counters: how many commits one fdatasync made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WalCounters {
    /// Commits acknowledged as durable.
    pub commits: u64,
    /// `fdatasync` calls on the log.
    pub fsyncs: u64,
    /// Bytes the log writer wrote.
    pub flushed_bytes: u64,
    /// Waits for durability (commits, and also rollbacks and identity reservations) that
    /// yielded the processor instead of parking (many waiting at once; see
    /// `WalConfig::yield_wait_committers`).
    pub yielding_waits: u64,
}

impl WalCounters {
    /// What happened between `earlier` and `self` (both read from the same open database).
    pub fn since(&self, earlier: &WalCounters) -> WalCounters {
        WalCounters {
            commits: self.commits.saturating_sub(earlier.commits),
            fsyncs: self.fsyncs.saturating_sub(earlier.fsyncs),
            flushed_bytes: self.flushed_bytes.saturating_sub(earlier.flushed_bytes),
            yielding_waits: self.yielding_waits.saturating_sub(earlier.yielding_waits),
        }
    }

    /// `transactions` per fdatasync (the group-commit factor); `None` without an fdatasync.
    ///
    /// The caller counts the transactions itself because the log writer counts only the
    /// commits that waited for the disk: under DELAYED durability none do, yet the background
    /// flushes still share one fdatasync among many transactions.
    pub fn transactions_per_fsync(&self, transactions: u64) -> Option<f64> {
        (self.fsyncs > 0).then(|| transactions as f64 / self.fsyncs as f64)
    }
}

/// What opening an existing database took to recover it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Recovery {
    /// Log bytes read.
    pub log_bytes: u64,
    /// Log records replayed.
    pub records: u64,
    /// Transactions whose changes after the checkpoint were applied.
    pub committed_txns: u64,
    /// Transactions that never ended, whose changes were undone.
    pub loser_txns: u64,
    /// Row changes applied.
    pub redone_changes: u64,
    /// Row changes undone.
    pub undone_changes: u64,
    /// Reading and applying the log.
    pub replay_duration: Duration,
    /// Pages written back to the data file during replay.
    pub pages_written_during_replay: u64,
    /// The checkpoint that ends recovery.
    pub checkpoint_duration: Duration,
    /// Wall time of the recovery (all of opening the database).
    pub duration: Duration,
}

/// How the CLI opens a durable database. Every field but the durability keeps the engine's
/// default unless a benchmark has a reason to change it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenSettings {
    /// When a commit returns.
    pub durability: Durability,
    /// The buffer pool's memory budget in bytes; `None` keeps the engine's default.
    pub memory_budget_bytes: Option<usize>,
    /// Whether a checkpoint starts by itself once enough log was written. `bench recovery`
    /// turns it off so that the whole log it wrote is still there to replay.
    pub automatic_checkpoints: bool,
    /// How much log starts an automatic checkpoint, bytes; `None` keeps the engine's default.
    pub checkpoint_log_bytes: Option<u64>,
    /// The log segment size of a new log, bytes; `None` keeps the engine's default.
    pub log_segment_bytes: Option<u64>,
}

impl OpenSettings {
    /// The engine's defaults with `durability`.
    pub fn new(durability: Durability) -> OpenSettings {
        OpenSettings {
            durability,
            memory_budget_bytes: None,
            automatic_checkpoints: true,
            checkpoint_log_bytes: None,
            log_segment_bytes: None,
        }
    }
}

/// Opens (creating or recovering) the durable database in `dir`.
pub fn open(dir: &Path, durability: Durability) -> Result<Database, String> {
    open_with(dir, OpenSettings::new(durability))
}

/// Opens (creating or recovering) the durable database in `dir` with `settings`.
pub fn open_with(dir: &Path, settings: OpenSettings) -> Result<Database, String> {
    let defaults = DatabaseOptions::default();
    let options = DatabaseOptions {
        durability: match settings.durability {
            Durability::Delayed => EngineDurability::Delayed,
            // What is not logged is never waited for; logged tables stay fully durable.
            Durability::Full | Durability::None => EngineDurability::Full,
        },
        memory_budget_bytes: settings
            .memory_budget_bytes
            .unwrap_or(defaults.memory_budget_bytes),
        // The background thread starts a checkpoint once this much log was written since the
        // last one; no log ever reaches u64::MAX bytes, so it never does.
        checkpoint_log_bytes: if settings.automatic_checkpoints {
            settings
                .checkpoint_log_bytes
                .unwrap_or(defaults.checkpoint_log_bytes)
        } else {
            u64::MAX
        },
        wal: WalConfig {
            segment_bytes: settings
                .log_segment_bytes
                .unwrap_or(defaults.wal.segment_bytes),
            ..defaults.wal
        },
        ..defaults
    };
    Database::open(dir, options)
        .map_err(|error| format!("cannot open the database in {}: {error}", dir.display()))
}

/// Bytes appended to the log since the database was opened (padding included); `None` for an
/// in-memory database.
pub fn log_appended_bytes(db: &Database) -> Option<u64> {
    db.wal_stats().map(|stats| stats.appended_bytes)
}

/// The log writer's counters since the database was opened; `None` for an in-memory database.
pub fn wal_counters(db: &Database) -> Option<WalCounters> {
    db.wal_stats().map(|stats| WalCounters {
        commits: stats.commits,
        fsyncs: stats.fsyncs,
        flushed_bytes: stats.flushed_bytes,
        yielding_waits: stats.yielding_waits,
    })
}

/// What opening the database recovered; `None` for an in-memory database.
pub fn recovery(db: &Database) -> Option<Recovery> {
    db.recovery_stats().map(|stats| Recovery {
        log_bytes: stats.log_bytes,
        records: stats.records,
        pages_written_during_replay: stats.pages_written_during_replay,
        committed_txns: stats.committed_txns,
        loser_txns: stats.loser_txns,
        redone_changes: stats.redone_changes,
        undone_changes: stats.undone_changes,
        replay_duration: stats.replay_duration,
        checkpoint_duration: Duration::from_micros(stats.checkpoint_us),
        duration: stats.duration,
    })
}
