//! `lastpage bench recovery`: how long recovering a database with a large log takes.
//!
//! One process, one database, three phases:
//!
//! 1. **Load.** A fresh durable database (`Durability::Full`) with automatic checkpoints off,
//!    so that nothing ever folds the log into the data file, and a memory budget large enough
//!    for the table, so that no page is evicted and the data file keeps only the empty image of
//!    its creation. One thread inserts `bench durable`'s table in 1,000-row transactions until
//!    the log holds `--log-mb` MiB.
//! 2. **Crash.** The log is flushed and every handle is dropped without `Database::close`,
//!    which would take a checkpoint. Nothing else checkpoints: the engine has no `Drop` that
//!    does, and the automatic checkpoint is off. The next open finds the image of an empty
//!    table and the whole log after it, as after a crash of the process.
//! 3. **Recover.** `Database::open` on the same directory, timed, with the engine's own figures
//!    (log bytes and records replayed, transactions applied, the replay and the closing
//!    checkpoint), then a verification: the row count, a full scan and the integrity check
//!    must all find every row inserted.
//!
//! The log's files are still in the operating system's page cache when it is replayed (they
//! were just written), which is what recovering after a crash of the process meets; after a
//! power failure the first read would come from the disk.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lastpage_engine::{Database, Direction, InsertRow, KeyRange, Table};
use serde::Serialize;

use super::durable::{ROW_BYTES, run_directory, verify_lastpage};
use super::insert::{BenchError, InsertConfig, Workload, round3, round6};
use super::render::{machine, number, run_footer, table, thousands};
use crate::durable::{self, Durability, OpenSettings};
use crate::sys;

/// Bytes in a MiB, the unit of `--log-mb` and `--memory-mb`.
pub(super) const MIB: u64 = 1024 * 1024;

/// Rows per transaction of the load: the batched cell of `bench durable`.
pub const BATCH_ROWS: u64 = 1000;

/// The largest log `--log-mb` may ask for (64 GiB). The table's identity column is an `int`,
/// and at about 116 bytes of log per row (rows go in 1,000-row `InsertRun` records) 64 GiB is
/// about 590 million rows, well below its 2^31 values.
pub const MAX_LOG_MB: u64 = 64 * 1024;

/// One `bench recovery` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// MiB of log to write before the crash.
    pub log_mb: u64,
    /// The buffer pool's memory budget, MiB.
    pub memory_mb: u64,
    /// Where the database goes (a fresh subdirectory of it); `None`: the system's temporary
    /// directory.
    pub db: Option<PathBuf>,
    /// Leave the database there afterwards instead of removing it.
    pub keep: bool,
}

/// What the load phase did.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// Rows inserted and committed.
    pub rows: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Bytes appended to the log (padding included).
    pub log_appended_bytes: u64,
    /// Wall time of the inserts.
    pub elapsed_sec: f64,
    /// Rows per second of the inserts.
    pub rows_per_sec: f64,
}

/// What reopening the database took.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveredReport {
    /// Bytes of log recovery read.
    pub log_bytes: u64,
    /// Log records recovery read.
    pub records: u64,
    /// Transactions whose changes were applied.
    pub committed_txns: u64,
    /// Transactions that never ended, whose changes were undone (0 here: every transaction of
    /// the load committed before the crash).
    pub loser_txns: u64,
    /// Row changes applied.
    pub redone_changes: u64,
    /// Reading and applying the log, seconds.
    pub replay_sec: f64,
    /// Pages written back to the data file during replay, by a second thread (the closing
    /// checkpoint writes only the rest).
    pub pages_written_during_replay: u64,
    /// The checkpoint that ends recovery (it writes the whole table to the data file), seconds.
    pub checkpoint_sec: f64,
    /// All of `Database::open` as the engine measured it, seconds.
    pub engine_open_sec: f64,
    /// All of `Database::open` as measured around the call, seconds.
    pub open_sec: f64,
    /// Log MiB replayed per second of replay.
    pub replay_mib_per_sec: f64,
    /// Log records replayed per second of replay.
    pub replay_records_per_sec: f64,
    /// Row changes applied per second of replay (a multi-row statement's inserts are one
    /// `InsertRun` record per partition and 64 KiB, so records undercount the work).
    pub replay_row_changes_per_sec: f64,
}

/// The checks after recovery.
#[derive(Clone, Debug, Serialize)]
pub struct VerificationReport {
    /// Rows inserted before the crash.
    pub expected_rows: u64,
    /// The table's row count after recovery.
    pub row_count: u64,
    /// Rows a full scan of the table returned.
    pub scanned_rows: u64,
    /// Wall time of the scan and the integrity check, seconds.
    pub elapsed_sec: f64,
    /// `"ok"`, or what the checks found.
    pub verified: String,
}

/// Everything `bench recovery` measured; serializes to its `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryReport {
    /// CPUs the process may use.
    pub cpus: usize,
    /// The processor model, if known.
    pub cpu_model: Option<String>,
    /// The database's directory.
    pub db_dir: String,
    /// Whether the database was left there (`--keep`).
    pub kept: bool,
    /// The log size asked for, bytes (the load stops at the first commit at or past it).
    pub log_target_bytes: u64,
    /// The buffer pool's memory budget, bytes.
    pub memory_budget_bytes: u64,
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Rows per transaction.
    pub rows_per_transaction: u64,
    /// The load before the crash.
    pub load: LoadReport,
    /// The recovery.
    pub recovery: RecoveredReport,
    /// The checks after it.
    pub verification: VerificationReport,
    /// Wall time of the whole run.
    pub elapsed_sec: f64,
    /// Share of the machine's CPU other processes used meanwhile.
    pub other_cpu_load_percent: Option<f64>,
}

impl RecoveryReport {
    /// Whether recovery brought back exactly what was inserted.
    pub fn ok(&self) -> bool {
        self.verification.verified == "ok"
    }
}

/// Runs the whole benchmark.
pub fn run_recovery(config: &RecoveryConfig) -> Result<RecoveryReport, BenchError> {
    if !(1..=MAX_LOG_MB).contains(&config.log_mb) {
        return Err(BenchError::InvalidConfig(format!(
            "--log-mb must be between 1 and {MAX_LOG_MB}, not {}",
            config.log_mb
        )));
    }
    let memory_budget_bytes = memory_budget_bytes(config.memory_mb)?;
    let settings = OpenSettings {
        memory_budget_bytes: Some(memory_budget_bytes),
        automatic_checkpoints: false,
        ..OpenSettings::new(Durability::Full)
    };
    let run = run_directory(config.db.as_deref(), "recovery")?;
    let db_dir = run.path().display().to_string();
    let started = Instant::now();
    let cpu_load = sys::LoadProbe::start();
    let result = load_crash_recover(config, settings, run.path());
    // A kept database keeps the directories made for it too.
    if !config.keep {
        run.remove();
    }
    let (load, recovery, verification) = result?;
    let (_, other_cpu_load_percent) = cpu_load.finish();
    Ok(RecoveryReport {
        cpus: std::thread::available_parallelism().map_or(1, |cpus| cpus.get()),
        cpu_model: sys::cpu_model(),
        db_dir,
        kept: config.keep,
        log_target_bytes: config.log_mb * MIB,
        memory_budget_bytes: memory_budget_bytes as u64,
        row_bytes: ROW_BYTES,
        rows_per_transaction: BATCH_ROWS,
        load,
        recovery,
        verification,
        elapsed_sec: round3(started.elapsed().as_secs_f64()),
        other_cpu_load_percent,
    })
}

/// `--memory-mb` in bytes, or why it cannot be a memory budget.
pub(super) fn memory_budget_bytes(memory_mb: u64) -> Result<usize, BenchError> {
    memory_mb
        .checked_mul(MIB)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| {
            BenchError::InvalidConfig(format!(
                "--memory-mb {memory_mb} is not a memory budget this machine can address"
            ))
        })
}

/// The three phases, in `dir`.
fn load_crash_recover(
    config: &RecoveryConfig,
    settings: OpenSettings,
    dir: &Path,
) -> Result<(LoadReport, RecoveredReport, VerificationReport), BenchError> {
    let load = {
        let db = durable::open_with(dir, settings).map_err(BenchError::Failed)?;
        let (load, _) = load(&db, config.log_mb * MIB, "bench recovery")?;
        db.flush_log()
            .map_err(|error| BenchError::Failed(format!("cannot flush the log: {error}")))?;
        // The crash: the handle goes without `close()`, so no checkpoint is taken and the
        // next open must replay the whole log.
        drop(db);
        load
    };
    // Give the loaded table's memory back to the kernel, so that recovery starts from the
    // memory a fresh process would have.
    sys::release_free_memory();
    eprintln!("bench recovery: recovering...");
    let opened = Instant::now();
    let db = durable::open_with(dir, settings).map_err(BenchError::Failed)?;
    let open_sec = opened.elapsed().as_secs_f64();
    let stats = durable::recovery(&db).ok_or_else(|| {
        BenchError::Failed("the reopened database reports no recovery figures".into())
    })?;
    let replay_sec = stats.replay_duration.as_secs_f64();
    let recovered = RecoveredReport {
        log_bytes: stats.log_bytes,
        records: stats.records,
        committed_txns: stats.committed_txns,
        loser_txns: stats.loser_txns,
        redone_changes: stats.redone_changes,
        replay_sec: round6(replay_sec),
        pages_written_during_replay: stats.pages_written_during_replay,
        checkpoint_sec: round6(stats.checkpoint_duration.as_secs_f64()),
        engine_open_sec: round6(stats.duration.as_secs_f64()),
        open_sec: round6(open_sec),
        replay_mib_per_sec: round3(stats.log_bytes as f64 / MIB as f64 / replay_sec.max(1e-9)),
        replay_records_per_sec: (stats.records as f64 / replay_sec.max(1e-9)).round(),
        replay_row_changes_per_sec: (stats.redone_changes as f64 / replay_sec.max(1e-9)).round(),
    };
    eprintln!("bench recovery: verifying...");
    let verification = verify(&db, load.rows)?;
    drop(db);
    Ok((load, recovered, verification))
}

/// Inserts 1,000-row transactions from one thread until the log holds `target_bytes`, with a
/// progress line on stderr (starting with `label`) at every tenth of the way. Returns what it
/// did and the table.
pub(super) fn load(
    db: &Database,
    target_bytes: u64,
    label: &str,
) -> Result<(LoadReport, std::sync::Arc<Table>), BenchError> {
    let failed =
        |what: &str, error: &dyn std::fmt::Display| BenchError::Failed(format!("{what}: {error}"));
    let workload = Workload::for_config(&InsertConfig {
        row_bytes: ROW_BYTES,
        ..InsertConfig::default()
    });
    let table = db
        .create_table(workload.table.clone())
        .map_err(|error| failed("cannot create the table", &error))?;
    let session = db.session();
    let payload = workload.payload(0, ROW_BYTES);
    let appended = || durable::log_appended_bytes(db).unwrap_or(0);
    // The log already holds the table's creation; the target counts the inserts' log only.
    let base = appended();
    let started = Instant::now();
    let (mut transactions, mut written, mut tenths) = (0_u64, 0_u64, 0_u64);
    while written < target_bytes {
        let rows = (0..BATCH_ROWS)
            .map(|_| InsertRow::new().set(workload.payload_column, payload.clone()))
            .collect();
        table
            .insert_batch(&session, rows)
            .map_err(|error| failed("an insert failed", &error))?;
        transactions += 1;
        written = appended().saturating_sub(base);
        let reached = (written.saturating_mul(10) / target_bytes).min(10);
        if reached > tenths {
            tenths = reached;
            eprintln!(
                "{label}: loading {:>3}%: {} MiB of log, {} rows, {:.1} s",
                tenths * 10,
                written / MIB,
                thousands(transactions * BATCH_ROWS),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed_sec = started.elapsed().as_secs_f64().max(1e-9);
    let rows = transactions * BATCH_ROWS;
    let report = LoadReport {
        rows,
        transactions,
        log_appended_bytes: written,
        elapsed_sec: round6(elapsed_sec),
        rows_per_sec: (rows as f64 / elapsed_sec).round(),
    };
    Ok((report, table))
}

/// The recovered table holds exactly `expected` rows: by its row count, by a full scan and by
/// the integrity check.
fn verify(db: &Database, expected: u64) -> Result<VerificationReport, BenchError> {
    let started = Instant::now();
    let name = Workload::for_config(&InsertConfig {
        row_bytes: ROW_BYTES,
        ..InsertConfig::default()
    })
    .table
    .name;
    let table = db.table(&name).map_err(|error| {
        BenchError::Failed(format!("the table is gone after recovery: {error}"))
    })?;
    let row_count = table.row_count();
    let scanned = scan_count(db, &table);
    let mut verified = verify_lastpage(db, &table, expected);
    let scanned_rows = match scanned {
        Ok(rows) => {
            if verified == "ok" && rows != expected {
                verified = format!("a full scan found {rows} rows, but {expected} were inserted");
            }
            rows
        }
        Err(error) => {
            verified = error;
            0
        }
    };
    Ok(VerificationReport {
        expected_rows: expected,
        row_count,
        scanned_rows,
        elapsed_sec: round3(started.elapsed().as_secs_f64()),
        verified,
    })
}

/// Rows a forward scan of the whole table returns.
fn scan_count(db: &Database, table: &Table) -> Result<u64, String> {
    let session = db.session();
    let rows = table
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .map_err(|error| format!("cannot scan the table: {error}"))?;
    let mut count = 0;
    for row in rows {
        row.map_err(|error| format!("scanning the table failed: {error}"))?;
        count += 1;
    }
    Ok(count)
}

/// The report as text.
pub fn render(report: &RecoveryReport) -> String {
    let load = &report.load;
    let recovery = &report.recovery;
    let mut out = format!(
        "bench recovery: {} MiB of log ({}-byte rows, {}-row transactions, Durability::Full, \
         no checkpoint since the table was created), crash without close, reopen; {}\n",
        thousands(report.log_target_bytes / MIB),
        report.row_bytes,
        thousands(report.rows_per_transaction),
        machine(report.cpus, report.cpu_model.as_deref()),
    );
    out.push_str(&format!(
        "database in {} ({}); memory budget {} MiB\n",
        report.db_dir,
        if report.kept { "kept" } else { "removed" },
        thousands(report.memory_budget_bytes / MIB),
    ));
    out.push_str(&format!(
        "load: {} rows in {} transactions, {} MiB of log in {} s ({} rows/s)\n",
        thousands(load.rows),
        thousands(load.transactions),
        number(load.log_appended_bytes as f64 / MIB as f64),
        number(load.elapsed_sec),
        thousands(load.rows_per_sec as u64),
    ));
    let mut figures = table(&["recovery", "value"], 1);
    let rows: [(&str, String); 11] = [
        (
            "log replayed",
            format!(
                "{} MiB ({} bytes)",
                number(recovery.log_bytes as f64 / MIB as f64),
                thousands(recovery.log_bytes)
            ),
        ),
        (
            "records (row changes applied)",
            format!(
                "{} ({})",
                thousands(recovery.records),
                thousands(recovery.redone_changes)
            ),
        ),
        ("committed transactions", thousands(recovery.committed_txns)),
        ("loser transactions", thousands(recovery.loser_txns)),
        ("replay", format!("{} s", number(recovery.replay_sec))),
        (
            "pages written back during replay",
            thousands(recovery.pages_written_during_replay),
        ),
        (
            "closing checkpoint",
            format!("{} s", number(recovery.checkpoint_sec)),
        ),
        (
            "Database::open, total",
            format!("{} s", number(recovery.open_sec)),
        ),
        ("replay MiB/s", number(recovery.replay_mib_per_sec)),
        (
            "replay row changes/s",
            thousands(recovery.replay_row_changes_per_sec as u64),
        ),
        (
            "rows (count / scan / expected)",
            format!(
                "{} / {} / {}",
                thousands(report.verification.row_count),
                thousands(report.verification.scanned_rows),
                thousands(report.verification.expected_rows)
            ),
        ),
    ];
    for (name, value) in rows {
        figures.add_row(vec![name.to_owned(), value]);
    }
    figures.add_row(vec![
        "verified".to_owned(),
        report.verification.verified.clone(),
    ]);
    out.push_str(&format!("{figures}\n"));
    out.push_str(
        "The log was replayed from the page cache (it had just been written), as after a crash of \
         the process; after a power failure the first read comes from the disk.\n",
    );
    out.push_str(&run_footer(
        report.elapsed_sec,
        report.other_cpu_load_percent,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_log_is_recovered_whole() {
        let base = std::env::temp_dir().join(format!(
            "lastpage-bench-recovery-unit-{}",
            std::process::id()
        ));
        let config = RecoveryConfig {
            log_mb: 1,
            memory_mb: 256,
            db: Some(base.clone()),
            keep: false,
        };
        let report = run_recovery(&config).expect("bench recovery runs");
        let _ = std::fs::remove_dir_all(&base);
        assert!(report.ok(), "{}", report.verification.verified);
        assert!(report.load.log_appended_bytes >= MIB);
        assert_eq!(report.load.rows, report.load.transactions * BATCH_ROWS);
        // Every transaction's rows are at least one insert-run record, every transaction has a
        // commit record, and the whole log since the table's creation is replayed.
        assert!(report.recovery.records >= 2 * report.load.transactions);
        assert_eq!(report.recovery.redone_changes, report.load.rows);
        assert_eq!(report.recovery.committed_txns, report.load.transactions);
        assert_eq!(report.recovery.loser_txns, 0);
        assert!(report.recovery.log_bytes >= report.load.log_appended_bytes);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for (log_mb, memory_mb) in [(0, 256), (MAX_LOG_MB + 1, 256), (1, 0), (1, u64::MAX)] {
            let config = RecoveryConfig {
                log_mb,
                memory_mb,
                db: None,
                keep: false,
            };
            assert!(
                matches!(run_recovery(&config), Err(BenchError::InvalidConfig(_))),
                "{log_mb} MiB of log, {memory_mb} MiB of memory"
            );
        }
    }
}
