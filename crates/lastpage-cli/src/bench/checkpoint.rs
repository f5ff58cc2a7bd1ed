//! `lastpage bench checkpoint`: what a checkpoint costs the writers that run through it.
//!
//! 1. **Load.** One thread fills a fresh durable database (Durability::Full, automatic
//!    checkpoints off) with 1,000-row transactions of 100-byte rows until `--log-mb` MiB of log
//!    were written: the pages an automatic checkpoint finds dirty after `checkpoint_log_bytes`.
//! 2. **Measure.** A writer thread inserts 100-row statements without a break. Its statements
//!    are timed for a baseline window with no checkpoint, then a checkpoint is taken
//!    (`Database::checkpoint`) and the statements that overlap it are timed separately.
//! 3. **Verify.** The row count and the integrity check must find every row inserted.
//!
//! The report gives the checkpoint's own figures (the pause, when writers are stopped, and the
//! whole duration) and the writer's statements per second, median, p99 and longest latency in
//! both windows, so that what the checkpoint does to writers is read as a ratio taken in one
//! run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lastpage_engine::{Database, InsertRow, Table};
use serde::Serialize;

use super::durable::{ROW_BYTES, run_directory, verify_lastpage};
use super::insert::{BenchError, InsertConfig, Workload, round3, round6};
use super::recovery::{LoadReport, MIB, load, memory_budget_bytes};
use super::render::{machine, number, run_footer, table, thousands};
use crate::durable::{self, Durability, OpenSettings};
use crate::sys;

/// Rows per statement of the writer that runs through the checkpoint.
pub const WRITER_STATEMENT_ROWS: u64 = 100;

/// The largest `--log-mb` (the load's table must fit the memory budget to measure only the
/// checkpoint).
pub const MAX_CHECKPOINT_LOG_MB: u64 = 16 * 1024;

/// The longest statement latency the histograms hold, microseconds (an hour).
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// How much longer than asked the baseline window waits for a whole statement of the writer.
const BASELINE_PATIENCE: Duration = Duration::from_secs(10);

/// One `bench checkpoint` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// MiB of log the load writes before the checkpoint.
    pub log_mb: u64,
    /// The buffer pool's memory budget, MiB.
    pub memory_mb: u64,
    /// How long the baseline window lasts.
    pub baseline: Duration,
    /// Where the database goes (a fresh subdirectory of it); `None`: the system's temporary
    /// directory.
    pub db: Option<PathBuf>,
}

/// The checkpoint's own figures.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointFigures {
    /// How long writers were stopped (the capture), milliseconds.
    pub pause_ms: f64,
    /// The whole checkpoint, milliseconds.
    pub duration_ms: f64,
    /// Log segment files it removed.
    pub segments_removed: usize,
}

/// The writer's statements in one window.
#[derive(Clone, Debug, Serialize)]
pub struct WindowReport {
    /// The window's length, seconds.
    pub seconds: f64,
    /// Statements that ran in the window.
    pub statements: u64,
    /// Rows per second the writer inserted in the window.
    pub rows_per_sec: f64,
    /// Statement latency percentiles and maximum, milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointReport {
    pub cpus: usize,
    pub cpu_model: Option<String>,
    pub db_dir: String,
    pub row_bytes: u16,
    pub writer_statement_rows: u64,
    pub load: LoadReport,
    pub checkpoint: CheckpointFigures,
    /// The writer with no checkpoint running.
    pub baseline: WindowReport,
    /// The writer's statements that overlapped the checkpoint.
    pub during_checkpoint: WindowReport,
    /// During ÷ baseline, rows per second.
    pub throughput_ratio: f64,
    /// "ok", or what the verification found wrong.
    pub verified: String,
    pub elapsed_sec: f64,
    pub other_cpu_load_percent: Option<f64>,
}

/// One statement of the writer: when it started and how long it took, from the run's start.
#[derive(Clone, Copy)]
struct Timed {
    start: Duration,
    latency: Duration,
}

/// Runs the whole benchmark.
pub fn run_checkpoint(config: &CheckpointConfig) -> Result<CheckpointReport, BenchError> {
    if !(1..=MAX_CHECKPOINT_LOG_MB).contains(&config.log_mb) {
        return Err(BenchError::InvalidConfig(format!(
            "--log-mb must be between 1 and {MAX_CHECKPOINT_LOG_MB}, not {}",
            config.log_mb
        )));
    }
    let settings = OpenSettings {
        memory_budget_bytes: Some(memory_budget_bytes(config.memory_mb)?),
        automatic_checkpoints: false,
        ..OpenSettings::new(Durability::Full)
    };
    let run = run_directory(config.db.as_deref(), "checkpoint")?;
    let db_dir = run.path().display().to_string();
    let started = Instant::now();
    let cpu_load = sys::LoadProbe::start();
    let result = load_and_measure(config, settings, run.path());
    run.remove();
    let (load, checkpoint, baseline, during, verified) = result?;
    let (_, other_cpu_load_percent) = cpu_load.finish();
    Ok(CheckpointReport {
        cpus: std::thread::available_parallelism().map_or(1, |cpus| cpus.get()),
        cpu_model: sys::cpu_model(),
        db_dir,
        row_bytes: ROW_BYTES,
        writer_statement_rows: WRITER_STATEMENT_ROWS,
        load,
        checkpoint,
        throughput_ratio: round3(during.rows_per_sec / baseline.rows_per_sec.max(1.0)),
        baseline,
        during_checkpoint: during,
        verified,
        elapsed_sec: round3(started.elapsed().as_secs_f64()),
        other_cpu_load_percent,
    })
}

type Measured = (
    LoadReport,
    CheckpointFigures,
    WindowReport,
    WindowReport,
    String,
);

fn load_and_measure(
    config: &CheckpointConfig,
    settings: OpenSettings,
    dir: &Path,
) -> Result<Measured, BenchError> {
    let db = Arc::new(durable::open_with(dir, settings).map_err(BenchError::Failed)?);
    let (load, table) = load(&db, config.log_mb * MIB, "bench checkpoint")?;
    eprintln!("bench checkpoint: measuring...");
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicU64::new(0));
    let writer = spawn_writer(&db, &table, origin, &stop, &finished);
    // A moment for the writer to get going, then the baseline window, then the checkpoint.
    std::thread::sleep(config.baseline / 4);
    let baseline_start = origin.elapsed();
    let finished_before = finished.load(Ordering::Acquire);
    std::thread::sleep(config.baseline);
    // The window holds at least one whole statement: the second to finish after it opened
    // started after the first had finished, inside the window. A machine that stalls the writer
    // longer than the window (a slow fdatasync on a busy disk) left it empty.
    let patience = Instant::now() + BASELINE_PATIENCE;
    while finished.load(Ordering::Acquire) < finished_before + 2 && Instant::now() < patience {
        std::thread::sleep(Duration::from_millis(1));
    }
    let checkpoint_start = origin.elapsed();
    let stats = db.checkpoint();
    let checkpoint_end = origin.elapsed();
    std::thread::sleep(config.baseline / 4);
    stop.store(true, Ordering::Relaxed);
    let timed = writer
        .join()
        .map_err(|_| BenchError::Failed("the writer thread panicked".into()))??;
    let stats =
        stats.map_err(|error| BenchError::Failed(format!("the checkpoint failed: {error}")))?;
    // The checkpoint is durable, but its figures would leave out the unlinking of the old log,
    // which competes with the writer's fdatasyncs: such a run measured something else.
    if let Some(error) = &stats.log_truncation_error {
        return Err(BenchError::Failed(format!(
            "the checkpoint could not remove the old log, so its figures would leave that out: \
             {error}"
        )));
    }
    let checkpoint = CheckpointFigures {
        pause_ms: round3(stats.pause_us as f64 / 1000.0),
        duration_ms: round3(stats.duration_us as f64 / 1000.0),
        segments_removed: stats.segments_removed,
    };
    let baseline = window(&timed, baseline_start, checkpoint_start, |statement| {
        statement.start >= baseline_start && statement.start + statement.latency <= checkpoint_start
    })?;
    let during = window(&timed, checkpoint_start, checkpoint_end, |statement| {
        statement.start < checkpoint_end && statement.start + statement.latency > checkpoint_start
    })?;
    let expected = load.rows + timed.len() as u64 * WRITER_STATEMENT_ROWS;
    let verified = verify_lastpage(&db, &table, expected);
    Ok((load, checkpoint, baseline, during, verified))
}

/// Starts the writer: 100-row statements until `stop`, each timed from `origin` and counted in
/// `finished` once its time is taken.
fn spawn_writer(
    db: &Arc<Database>,
    table: &Arc<Table>,
    origin: Instant,
    stop: &Arc<AtomicBool>,
    finished: &Arc<AtomicU64>,
) -> std::thread::JoinHandle<Result<Vec<Timed>, BenchError>> {
    let (db, table, stop) = (Arc::clone(db), Arc::clone(table), Arc::clone(stop));
    let finished = Arc::clone(finished);
    std::thread::spawn(move || {
        let workload = Workload::for_config(&InsertConfig {
            row_bytes: ROW_BYTES,
            ..InsertConfig::default()
        });
        let payload = workload.payload(1, ROW_BYTES);
        let session = db.session();
        let mut timed = Vec::with_capacity(1 << 16);
        while !stop.load(Ordering::Relaxed) {
            let start = origin.elapsed();
            let rows = (0..WRITER_STATEMENT_ROWS)
                .map(|_| InsertRow::new().set(workload.payload_column, payload.clone()))
                .collect();
            table
                .insert_batch(&session, rows)
                .map_err(|error| BenchError::Failed(format!("the writer failed: {error}")))?;
            timed.push(Timed {
                start,
                latency: origin.elapsed() - start,
            });
            finished.fetch_add(1, Ordering::Release);
        }
        Ok(timed)
    })
}

/// The writer's figures over the statements `in_window` picks, in the window `[from, to)`.
fn window(
    timed: &[Timed],
    from: Duration,
    to: Duration,
    in_window: impl Fn(&Timed) -> bool,
) -> Result<WindowReport, BenchError> {
    // Bounded explicitly: an auto-resizing histogram's `saturating_record` clamps to its
    // initial range (about 2 ms) instead of growing.
    let mut latencies = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)
        .map_err(|error| BenchError::Failed(format!("cannot make a histogram: {error}")))?;
    let mut statements = 0;
    for statement in timed.iter().filter(|statement| in_window(statement)) {
        latencies.saturating_record(statement.latency.as_micros() as u64);
        statements += 1;
    }
    let seconds = (to - from).as_secs_f64().max(1e-9);
    let ms = |micros: u64| round3(micros as f64 / 1000.0);
    Ok(WindowReport {
        seconds: round6(seconds),
        statements,
        rows_per_sec: (statements as f64 * WRITER_STATEMENT_ROWS as f64 / seconds).round(),
        p50_ms: ms(latencies.value_at_quantile(0.5)),
        p99_ms: ms(latencies.value_at_quantile(0.99)),
        max_ms: ms(latencies.max()),
    })
}

/// The report as text.
pub fn render(report: &CheckpointReport) -> String {
    let load = &report.load;
    let checkpoint = &report.checkpoint;
    let mut out = format!(
        "bench checkpoint: {} rows loaded ({} MiB of log, {}-byte rows, 1,000-row \
         transactions, no checkpoint since); then a writer of {}-row statements runs through \
         one checkpoint; {}\n",
        thousands(load.rows),
        number(load.log_appended_bytes as f64 / MIB as f64),
        report.row_bytes,
        report.writer_statement_rows,
        machine(report.cpus, report.cpu_model.as_deref()),
    );
    out.push_str(&format!(
        "checkpoint: writers paused {} ms, whole checkpoint {} ms, {} log segments removed\n",
        number(checkpoint.pause_ms),
        number(checkpoint.duration_ms),
        checkpoint.segments_removed
    ));
    let mut figures = table(
        &[
            "writer",
            "seconds",
            "statements",
            "rows/s",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        1,
    );
    for (name, window) in [
        ("no checkpoint", &report.baseline),
        ("during the checkpoint", &report.during_checkpoint),
    ] {
        figures.add_row(vec![
            name.to_owned(),
            number(window.seconds),
            thousands(window.statements),
            thousands(window.rows_per_sec as u64),
            number(window.p50_ms),
            number(window.p99_ms),
            number(window.max_ms),
        ]);
    }
    out.push_str(&format!("{figures}\n"));
    out.push_str(&format!(
        "writer rows/s during ÷ without the checkpoint: {}; verified: {}\n",
        report.throughput_ratio, report.verified
    ));
    out.push_str(&run_footer(
        report.elapsed_sec,
        report.other_cpu_load_percent,
    ));
    out.push('\n');
    out
}
