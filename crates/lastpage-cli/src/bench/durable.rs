//! `lastpage bench durable`: durable single-row autocommit inserts from many threads, and
//! durable batched inserts from one, in lastpage (`Durability::Full`) and in SQLite (WAL,
//! `synchronous=FULL`, one shared connection), interleaved in one process so that both see
//! the same machine, disk and page cache. lastpage's batches run twice: as FULL commits, and
//! pipelined (`Session::commit_pipelined`: the thread builds the next batch while the previous
//! one is flushed, and a batch counts only once its commit is durable). SQLite has no pipelined
//! commit; both are compared with its batch cell.
//!
//! Each cell runs for a fixed time (or a fixed number of rows) in a fresh database under the
//! run's directory, is verified (every acknowledged row there, the integrity check), and its
//! files are deleted before the next cell starts. lastpage's cells report commits per
//! fdatasync from the log writer's counters and the WRITELOG/LOGBUFFER waits of the commits;
//! SQLite's fsync count is not observable from outside, but in WAL mode with
//! `synchronous=FULL` it syncs the WAL at every commit, so it is one commit per fsync by
//! construction (the report says so rather than pretending to have measured it).
//!
//! Every cell also reports what a row cost the machine: the bytes the disk holding the
//! databases wrote (log, new log segments' zeros, data pages, the file system's journal;
//! SQLite's files) and the process's CPU time, per row, and context switches per commit. The
//! run starts by measuring the disk itself ([`super::disk`]); the report divides its bandwidth
//! by the pipelined cell's bytes per row, the most rows per second that disk could make
//! durable at that cost.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lastpage_engine::{CommitTicket, WaitType};
use lastpage_storage::wal::WalConfig;
use serde::Serialize;

use super::disk::{self, DiskReference};
use super::insert::{
    BenchError, InsertConfig, LatencyReport, StartGate, WaitReport, Workload, round3, round6,
};
use super::render::{machine, number, run_footer, table, thousands};
use super::sqlite::SqliteBench;
use super::wakeups::{self, WakeupReference};
use crate::durable::{self, Durability};
use crate::sys;

/// The most rows one cell inserts in a time-limited run. It bounds the disk (and memory) a
/// fast cell can use: batched inserts at 2M rows/s would otherwise write gigabytes of log.
pub const MAX_CELL_ROWS: u64 = 5_000_000;

/// How many pipelined batches one thread keeps committed but not yet known to be durable:
/// the batch it waits for is this many batches old, so that one flush can carry the commits
/// of several, and a slow flush (one queued behind a checkpoint's data-file writes, tens of
/// milliseconds on this project's VM) does not stop the thread. On that VM, 4 in flight gave
/// 0.90–0.92M rows/s against 0.80–0.87M with 1; once a batch's rows cost the thread half as
/// much CPU (`insert_batch_values`), 16 gave 0.94–1.25M against 0.88–1.02M with 4. With 16 the
/// thread still waited for its tickets 0.5 ms per batch (40–50% of its time, `perf`): 64 gave
/// 1.10–2.05M rows/s (median 1.40M of six runs, 0.11–0.16 ms of WRITELOG per batch) against
/// 1.04–1.26M with 16, 1.12–1.63M with 32 and 1.42–1.55M with 128 (interleaved runs on one
/// disk). 64 batches (about 116 KB of log each) are more than a 4 MiB log buffer holds, so
/// with one the thread waited for buffer space (LOGBUFFER) instead when the flusher fell
/// behind; the default buffer is 16 MiB since (`WAL_BUFFER_BYTES`). The price is the
/// acknowledgement's delay: the cell reports it ([`DurableCell::acknowledgement_ms_mean`]).
const PIPELINED_BATCHES_IN_FLIGHT: usize = 64;

/// Longest time the park-and-wake probe runs (`--seconds` if that is shorter).
const WAKEUP_PROBE_SECONDS: f64 = 1.0;

/// Payload bytes per row: the seeds' VARCHAR(100) table.
pub(super) const ROW_BYTES: u16 = 100;

/// The wait types a durable run reports, always (zero included).
const LOG_WAITS: [WaitType; 4] = [
    WaitType::WriteLog,
    WaitType::LogBuffer,
    WaitType::LckMS,
    WaitType::LckMX,
];

/// One `bench durable` run.
#[derive(Clone, Debug, PartialEq)]
pub struct DurableConfig {
    /// Thread counts of the autocommit cells.
    pub threads: Vec<u32>,
    /// How long each cell runs, unless `rows` is given.
    pub seconds: f64,
    /// Rows each cell inserts (split across its threads) instead of running for `seconds`.
    pub rows: Option<u64>,
    /// Rows per transaction of the one-thread batched cells.
    pub batch_rows: u64,
    /// Where the cells' databases go (a fresh subdirectory of it); `None`: the system's
    /// temporary directory.
    pub db: Option<PathBuf>,
}

/// How much one cell does.
#[derive(Clone, Copy, Debug)]
struct Budget {
    seconds: f64,
    rows: Option<u64>,
}

/// One cell: one engine, one workload, one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct DurableCell {
    /// `lastpage` or `sqlite`.
    pub engine: &'static str,
    /// `autocommit` (single-row statements, each its own transaction) or `batch`.
    pub workload: &'static str,
    /// Inserting threads.
    pub threads: u32,
    /// Rows per transaction.
    pub rows_per_commit: u64,
    /// Rows inserted and acknowledged.
    pub rows: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Wall time the rate is measured over: from the start signal to the deadline (or until
    /// the last thread finished, in a run limited by rows).
    pub elapsed_sec: f64,
    /// Rows committed within `elapsed_sec`, per second (in a timed run, commits still in
    /// flight at the deadline are in `rows` but not in the rate).
    pub rows_per_sec: f64,
    /// Latency of one commit (one row for autocommit, one batch for batch), microseconds, over
    /// the commits that count toward `rows_per_sec`.
    pub latency_us: LatencyReport,
    /// Commits per fdatasync.
    pub commits_per_fsync: Option<f64>,
    /// Where `commits_per_fsync` comes from.
    pub commits_per_fsync_source: &'static str,
    /// fdatasync calls on the log (lastpage only).
    pub fsyncs: Option<u64>,
    /// WRITELOG wait time per commit, microseconds (lastpage only).
    pub writelog_wait_us_per_commit: Option<f64>,
    /// WRITELOG, LOGBUFFER, LCK_M_S and LCK_M_X over the cell (lastpage only).
    pub waits: BTreeMap<&'static str, WaitReport>,
    /// Log bytes the log writer flushed per row inserted (lastpage only).
    pub log_bytes_per_row: Option<f64>,
    /// Bytes the block device holding the databases wrote per row inserted, everything
    /// included (see [`sys::BlockDevice`]); `None` on tmpfs or where the kernel does not say.
    /// Counted from just before the cell's threads start until every commit of the cell is
    /// durable.
    pub disk_bytes_per_row: Option<f64>,
    /// The process's CPU time per row inserted (user and system, every thread: the
    /// inserters, the log flusher, checkpoints), microseconds, over the same span.
    pub cpu_us_per_row: f64,
    /// The process's context switches (voluntary and involuntary) per commit, same span.
    pub context_switches_per_commit: f64,
    /// Pipelined cells: the mean time from a batch's commit to the return of its ticket's wait,
    /// in milliseconds — how long an application that acknowledges each batch once it is
    /// durable keeps it waiting. Absent for the other cells, whose commits return durable.
    pub acknowledgement_ms_mean: Option<f64>,
    /// `"ok"`, or what the verification after the cell found.
    pub verified: String,
}

/// lastpage ÷ SQLite for one workload and thread count.
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    /// `autocommit` or `batch`.
    pub workload: &'static str,
    /// Inserting threads.
    pub threads: u32,
    /// lastpage's rows/s.
    pub lastpage_rows_per_sec: f64,
    /// SQLite's rows/s.
    pub sqlite_rows_per_sec: f64,
    /// lastpage ÷ SQLite.
    pub ratio: f64,
}

/// The figures the issue judges, as measured (the goals are printed beside them, never
/// enforced: performance is measured, not asserted).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Judged {
    /// Thread count the first two figures are taken at (100 if measured, else the largest).
    pub threads: Option<u32>,
    /// lastpage ÷ SQLite, autocommit, at `threads` (goal ≥ 50).
    pub ratio_vs_sqlite: Option<f64>,
    /// lastpage's commits per fdatasync at `threads` (goal ≥ 50).
    pub commits_per_fsync: Option<f64>,
    /// lastpage's durable batched rows/s on one thread, each batch a FULL commit (goal
    /// ≥ 2,000,000).
    pub batch_rows_per_sec: Option<f64>,
    /// The same with pipelined commits: the thread builds the next batch while the previous
    /// one is flushed, and counts a batch only once it is durable.
    pub pipelined_batch_rows_per_sec: Option<f64>,
    /// The most rows per second the disk could make durable at the pipelined cell's cost:
    /// [`DiskReference::large_append_mb_per_sec`] ÷ that cell's disk bytes per row. A
    /// ceiling for the cell on this disk, whatever the engine's CPU cost.
    pub pipelined_batch_disk_ceiling_rows_per_sec: Option<f64>,
    /// [`WakeupReference::round_trips_per_sec`] at `threads` ÷ SQLite's autocommit rows/s
    /// there: the most any engine that parks a thread per commit could reach against SQLite
    /// on this machine, with inserts and I/O that cost nothing. lastpage's committers yield
    /// instead of parking when many wait at once, which this ceiling does not bound.
    pub blocking_ceiling_vs_sqlite: Option<f64>,
}

/// Everything `bench durable` measured; serializes to its `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct DurableReport {
    /// CPUs the process may use.
    pub cpus: usize,
    /// The processor model, if known.
    pub cpu_model: Option<String>,
    /// The directory the cells' databases were created in (and removed from).
    pub db_dir: String,
    /// Seconds per cell (absent when `rows` was given).
    pub seconds_per_cell: Option<f64>,
    /// Rows per cell (when given).
    pub rows_per_cell: Option<u64>,
    /// Rows per transaction of the batched cells.
    pub batch_rows: u64,
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// The disk under `db_dir`, measured before the cells.
    pub disk: DiskReference,
    /// The machine's park-and-wake ceiling at the judged thread count, measured before the
    /// cells (see [`wakeups`]).
    pub wakeups: Option<WakeupReference>,
    /// Every cell, in the order run.
    pub cells: Vec<DurableCell>,
    /// lastpage ÷ SQLite per workload and thread count.
    pub ratios: Vec<Ratio>,
    /// The figures.
    pub judged: Judged,
    /// Wall time of the whole run.
    pub elapsed_sec: f64,
    /// Share of the machine's CPU other processes used meanwhile.
    pub other_cpu_load_percent: Option<f64>,
}

impl DurableReport {
    /// Whether every cell verified.
    pub fn all_ok(&self) -> bool {
        self.cells.iter().all(|cell| cell.verified == "ok")
    }
}

/// What the threads of one cell did.
struct Driven {
    /// Statements committed, all of them (what the verification expects to find).
    statements: u64,
    /// Statements that count toward the rate: in a timed run, those that completed by the
    /// deadline (a statement still waiting then, for SQLite's mutex behind a queue of 300
    /// threads say, would otherwise stretch the run by its whole queue and lower the rate),
    /// and each thread's first statement, whenever it ended.
    measured_statements: u64,
    /// The time the measured statements took: the deadline (or the end of a first statement
    /// after it), or the last thread's finish.
    elapsed_sec: f64,
    /// Whether every thread ran out of statements before any deadline (a run limited by rows,
    /// or a timed one that reached its row cap): the statements' span ended with the last.
    ran_out: bool,
    latency_ns: Histogram<u64>,
}

/// Runs `threads` threads, each calling the operation `make_op(thread)` built for it until the
/// budget is spent, and measures every call's latency. `make_op` runs on the thread itself,
/// before the start signal, so that per-thread setup (a session, a payload) is not measured.
fn drive<F, M>(
    threads: usize,
    budget: Budget,
    rows_per_statement: u64,
    make_op: M,
) -> Result<Driven, BenchError>
where
    M: Fn(usize) -> F + Sync,
    F: FnMut() -> Result<(), String>,
{
    let failed =
        |what: &str, error: &dyn std::fmt::Display| BenchError::Failed(format!("{what}: {error}"));
    let rows_cap = budget.rows.unwrap_or(MAX_CELL_ROWS);
    let statements_cap = rows_cap.div_ceil(rows_per_statement.max(1));
    let per_thread = |thread: usize| {
        // Spread the statements so that the first `remainder` threads do one more.
        let threads = threads as u64;
        statements_cap / threads + u64::from((thread as u64) < statements_cap % threads)
    };
    let gate = StartGate::new();
    let stop = AtomicBool::new(false);
    let first_error = std::sync::Mutex::new(None::<String>);
    let deadline = std::sync::OnceLock::new();
    let mut start = Instant::now();
    let results = std::thread::scope(|scope| -> Result<Vec<ThreadResult>, BenchError> {
        let closed = gate.close();
        let mut handles = Vec::with_capacity(threads);
        for thread in 0..threads {
            let (gate, stop, first_error, make_op, deadline) =
                (&gate, &stop, &first_error, &make_op, &deadline);
            let quota = per_thread(thread);
            let spawned = std::thread::Builder::new()
                .name(format!("durable-{thread}"))
                .spawn_scoped(scope, move || {
                    let mut latency_ns = Histogram::<u64>::new(3).ok();
                    let mut op = make_op(thread);
                    let go = gate.arrive_and_wait();
                    // Set before the gate opened; `None` in a run limited by rows.
                    let deadline: Option<Instant> = deadline.get().copied().flatten();
                    let (mut done, mut measured) = (0, 0);
                    let mut measured_until = Instant::now();
                    // Every thread runs its first statement, even one started after the
                    // deadline (a thread the scheduler let wait that long), so that it is
                    // measured (see below).
                    while go && done < quota && (done == 0 || !stop.load(Ordering::Relaxed)) {
                        let started = Instant::now();
                        if let Err(error) = op() {
                            first_error
                                .lock()
                                .unwrap_or_else(|poisoned| poisoned.into_inner())
                                .get_or_insert(error);
                            stop.store(true, Ordering::Relaxed);
                            break;
                        }
                        let finished = Instant::now();
                        let nanos = u64::try_from(finished.duration_since(started).as_nanos())
                            .unwrap_or(u64::MAX);
                        done += 1;
                        // A thread's first statement counts even when it ends after the
                        // deadline, and the span then ends with it: a cell shorter than one
                        // stalled fdatasync (a busy disk) would otherwise measure nothing.
                        if measured > 0 && deadline.is_some_and(|deadline| finished > deadline) {
                            continue;
                        }
                        measured += 1;
                        measured_until = finished;
                        if let Some(histogram) = latency_ns.as_mut()
                            && histogram.record(nanos).is_err()
                        {
                            histogram.saturating_record(nanos);
                        }
                    }
                    (done, measured, latency_ns, Instant::now(), measured_until)
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(error) => {
                    // The threads already started see `run == false` and return at once.
                    gate.open(closed, false);
                    return Err(failed(
                        &format!("cannot start thread {} of {threads}", thread + 1),
                        &error,
                    ));
                }
            }
        }
        gate.wait_ready(threads);
        start = Instant::now();
        let timed = budget
            .rows
            .is_none()
            .then(|| start + Duration::from_secs_f64(budget.seconds.max(0.0)));
        let _ = deadline.set(timed);
        gate.open(closed, true);
        if let Some(deadline) = timed {
            // Until the deadline, or until every thread ran out of statements (a cell capped at
            // `MAX_CELL_ROWS` may finish early, and its time must not take in the rest).
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now >= deadline || handles.iter().all(|handle| handle.is_finished()) {
                    break;
                }
                std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
            }
            stop.store(true, Ordering::Relaxed);
        }
        let mut results = Vec::with_capacity(threads);
        for handle in handles {
            match handle.join() {
                Ok((done, measured, Some(histogram), finished, measured_until)) => {
                    results.push(ThreadResult {
                        done,
                        measured,
                        histogram,
                        finished,
                        measured_until,
                    })
                }
                Ok((_, _, None, _, _)) => {
                    return Err(BenchError::Failed("cannot create a histogram".into()));
                }
                Err(_) => {
                    return Err(BenchError::Failed("an inserting thread panicked".into()));
                }
            }
        }
        Ok(results)
    })?;
    if let Some(error) = first_error
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        return Err(BenchError::Failed(error));
    }
    let mut latency_ns =
        Histogram::<u64>::new(3).map_err(|error| failed("cannot create a histogram", &error))?;
    let (mut statements, mut measured_statements) = (0, 0);
    let (mut finished, mut measured_until) = (start, start);
    for result in &results {
        statements += result.done;
        measured_statements += result.measured;
        finished = finished.max(result.finished);
        measured_until = measured_until.max(result.measured_until);
        latency_ns
            .add(&result.histogram)
            .map_err(|error| failed("cannot merge latency histograms", &error))?;
    }
    // A timed run that ended early (at its row cap) is measured to the last finish instead, and
    // one whose first statement of a thread ended after the deadline, to that statement's end.
    let deadline = deadline.get().copied().flatten();
    let end = match deadline {
        Some(deadline) => deadline.min(finished).max(measured_until),
        None => finished,
    };
    Ok(Driven {
        statements,
        measured_statements,
        elapsed_sec: end.saturating_duration_since(start).as_secs_f64().max(1e-9),
        ran_out: deadline.is_none_or(|deadline| finished < deadline),
        latency_ns,
    })
}

/// The process's counters at the start of a cell's measured span (see [`DurableCell`]).
struct CostProbe<'a> {
    usage: sys::Usage,
    device: Option<&'a sys::BlockDevice>,
    disk_written_bytes: Option<u64>,
}

/// What a cell cost per row and per commit.
struct Costs {
    disk_bytes_per_row: Option<f64>,
    cpu_us_per_row: f64,
    context_switches_per_commit: f64,
}

impl<'a> CostProbe<'a> {
    fn start(device: Option<&'a sys::BlockDevice>) -> CostProbe<'a> {
        CostProbe {
            usage: sys::process_usage(),
            device,
            disk_written_bytes: device.and_then(sys::BlockDevice::written_bytes),
        }
    }

    /// What the process spent since [`CostProbe::start`], per row and per commit.
    fn finish(&self, rows: u64, commits: u64) -> Costs {
        let usage = sys::process_usage().since(&self.usage);
        let rows = rows.max(1) as f64;
        Costs {
            disk_bytes_per_row: self
                .disk_written_bytes
                .zip(self.device.and_then(sys::BlockDevice::written_bytes))
                .map(|(before, after)| round3(after.saturating_sub(before) as f64 / rows)),
            cpu_us_per_row: round3(usage.cpu_us as f64 / rows),
            context_switches_per_commit: round3(
                usage.context_switches() as f64 / commits.max(1) as f64,
            ),
        }
    }
}

/// What one thread of [`drive`] did.
struct ThreadResult {
    done: u64,
    measured: u64,
    histogram: Histogram<u64>,
    finished: Instant,
    /// When the thread's last measured statement ended.
    measured_until: Instant,
}

fn latency_report(histogram: &Histogram<u64>) -> LatencyReport {
    let micros = |nanos: u64| round3(nanos as f64 / 1000.0);
    LatencyReport {
        p50: micros(histogram.value_at_quantile(0.50)),
        p99: micros(histogram.value_at_quantile(0.99)),
        p999: micros(histogram.value_at_quantile(0.999)),
        max: micros(histogram.max()),
        mean: round3(histogram.mean() / 1000.0),
    }
}

/// How a lastpage cell commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    /// Every statement is its own FULL transaction: single-row autocommit inserts, or one
    /// `insert_batch` per transaction.
    Full,
    /// Explicit transactions of one batch each, committed with `commit_pipelined`: the thread
    /// builds the next batches while the log flusher syncs earlier ones, and a batch counts
    /// (a statement completes) only once its commit is durable
    /// ([`PIPELINED_BATCHES_IN_FLIGHT`] batches later).
    Pipelined,
}

fn workload_name(rows_per_commit: u64, commit: Commit) -> &'static str {
    match (rows_per_commit > 1, commit) {
        (true, Commit::Pipelined) => "pipelined batch",
        (true, Commit::Full) => "batch",
        (false, _) => "autocommit",
    }
}

/// The SQLite workload a lastpage workload is compared with: SQLite has no pipelined commit,
/// so a pipelined batch is compared with SQLite's batch.
fn sqlite_workload(workload: &str) -> &str {
    if workload == "pipelined batch" {
        "batch"
    } else {
        workload
    }
}

/// One lastpage cell in a fresh durable database in `dir` (removed afterwards).
fn lastpage_cell(
    dir: &Path,
    device: Option<&sys::BlockDevice>,
    threads: u32,
    budget: Budget,
    rows_per_commit: u64,
    commit: Commit,
) -> Result<DurableCell, BenchError> {
    let failed =
        |what: &str, error: &dyn std::fmt::Display| BenchError::Failed(format!("{what}: {error}"));
    let workload = Workload::for_config(&InsertConfig {
        row_bytes: ROW_BYTES,
        ..InsertConfig::default()
    });
    sys::release_free_memory();
    let db = durable::open(dir, Durability::Full).map_err(BenchError::Failed)?;
    let table = db
        .create_table(workload.table.clone())
        .map_err(|error| failed("cannot create the table", &error))?;
    let insert = table
        .prepare_insert(&[workload.payload_column])
        .map_err(|error| failed("cannot prepare the insert", &error))?;
    db.clear_wait_stats();
    let wal_before = durable::wal_counters(&db);
    let cost_probe = CostProbe::start(device);
    // Pipelined batches acknowledged, and the nanoseconds from their commits to their
    // acknowledgements, summed.
    let acknowledgements = (AtomicU64::new(0), AtomicU64::new(0));
    let driven = drive(threads as usize, budget, rows_per_commit, |thread| {
        let session = db.session();
        let payload = workload.payload(thread, ROW_BYTES);
        let (table, insert, column) = (&table, &insert, workload.payload_column);
        let acknowledgements = &acknowledgements;
        // The pipelined batches whose commits are not yet known to be durable, oldest first,
        // with when each was committed.
        let mut in_flight: VecDeque<(Instant, CommitTicket)> =
            VecDeque::with_capacity(PIPELINED_BATCHES_IN_FLIGHT + 1);
        move || {
            // A statement lends the thread's payload to its rows, as a program binds one buffer
            // per parameter: nothing is built per row.
            let columns = [column];
            let batch = || {
                let rows =
                    std::iter::repeat_n(std::slice::from_ref(&payload), rows_per_commit as usize);
                table.insert_batch_values(&session, &columns, rows)
            };
            match (rows_per_commit, commit) {
                (1, _) => insert
                    .insert(&session, std::slice::from_ref(&payload))
                    .map(|_| ()),
                (_, Commit::Full) => batch().map(|_| ()),
                (_, Commit::Pipelined) => (|| {
                    session.begin()?;
                    if let Err(error) = batch() {
                        let _ = session.rollback();
                        return Err(error);
                    }
                    // This statement completes when the oldest batch in flight is durable; the
                    // cell's last batches are flushed below, before the verification.
                    in_flight.push_back((Instant::now(), session.commit_pipelined()?));
                    if in_flight.len() > PIPELINED_BATCHES_IN_FLIGHT
                        && let Some((committed, ticket)) = in_flight.pop_front()
                    {
                        ticket.wait()?;
                        let (count, total_ns) = acknowledgements;
                        count.fetch_add(1, Ordering::Relaxed);
                        total_ns
                            .fetch_add(committed.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    Ok(())
                })(),
            }
            .map_err(|error| format!("lastpage: insert failed: {error}"))
        }
    })?;
    // The cell's last pipelined batches went out of scope with its thread's closure, unwaited:
    // flush them, so that every row the verification counts is durable.
    let flush_started = Instant::now();
    db.flush_log()
        .map_err(|error| failed("cannot flush the log", &error))?;
    let flush_sec = flush_started.elapsed().as_secs_f64();
    let rows = driven.statements * rows_per_commit;
    let costs = cost_probe.finish(rows, driven.statements);
    let waits = db.wait_stats();
    let wal = durable::wal_counters(&db)
        .zip(wal_before)
        .map(|(after, before)| after.since(&before));
    // A pipelined cell's statements acknowledge the batch committed the given number of
    // statements earlier. In a timed run the last batches of the measured ones were not
    // acknowledged by the deadline; in one that ran out of rows they were made durable by the
    // flush above, whose time the span then takes in (leaving them out gave 0 rows/s for a
    // cell of 64 batches or fewer).
    let (acknowledged, elapsed_sec) = match commit {
        Commit::Full => (driven.measured_statements, driven.elapsed_sec),
        Commit::Pipelined if driven.ran_out => {
            (driven.measured_statements, driven.elapsed_sec + flush_sec)
        }
        Commit::Pipelined => (
            driven
                .measured_statements
                .saturating_sub(PIPELINED_BATCHES_IN_FLIGHT as u64),
            driven.elapsed_sec,
        ),
    };
    let verified = verify_lastpage(&db, &table, rows);
    let writelog = waits.wait(WaitType::WriteLog);
    let cell = DurableCell {
        engine: "lastpage",
        workload: workload_name(rows_per_commit, commit),
        threads,
        rows_per_commit,
        rows,
        commits: driven.statements,
        elapsed_sec: round6(elapsed_sec),
        rows_per_sec: (acknowledged as f64 * rows_per_commit as f64 / elapsed_sec).round(),
        latency_us: latency_report(&driven.latency_ns),
        commits_per_fsync: wal
            .and_then(|wal| wal.transactions_per_fsync(driven.statements))
            .map(round3),
        commits_per_fsync_source: "transactions committed / the log writer's fdatasync calls",
        fsyncs: wal.map(|wal| wal.fsyncs),
        writelog_wait_us_per_commit: Some(round3(
            writelog.wait_time_ns as f64 / 1000.0 / driven.statements.max(1) as f64,
        )),
        waits: LOG_WAITS
            .iter()
            .map(|&wait| (wait.name(), WaitReport::from(waits.wait(wait))))
            .collect(),
        log_bytes_per_row: wal.map(|wal| round3(wal.flushed_bytes as f64 / rows.max(1) as f64)),
        disk_bytes_per_row: costs.disk_bytes_per_row,
        cpu_us_per_row: costs.cpu_us_per_row,
        context_switches_per_commit: costs.context_switches_per_commit,
        acknowledgement_ms_mean: match acknowledgements.0.into_inner() {
            0 => None,
            count => Some(round3(
                acknowledgements.1.into_inner() as f64 / 1e6 / count as f64,
            )),
        },
        verified,
    };
    drop(table);
    drop(db);
    remove_dir(dir);
    Ok(cell)
}

/// Every inserted row is in the table, and the integrity check passes.
pub(super) fn verify_lastpage(
    db: &lastpage_engine::Database,
    table: &lastpage_engine::Table,
    rows: u64,
) -> String {
    if table.row_count() != rows {
        return format!(
            "lastpage's table counts {} rows, but {rows} were acknowledged",
            table.row_count()
        );
    }
    match db.check_integrity() {
        Err(error) => format!("lastpage's integrity check failed: {error}"),
        Ok(checks) => match checks.iter().find(|check| check.table == table.name()) {
            Some(check) if check.rows == rows => "ok".to_owned(),
            Some(check) => format!(
                "lastpage's integrity check counts {} rows, but {rows} were acknowledged",
                check.rows
            ),
            None => "lastpage's integrity check did not report the table".to_owned(),
        },
    }
}

/// One SQLite cell in a fresh database file at `path` (removed afterwards).
fn sqlite_cell(
    path: &Path,
    device: Option<&sys::BlockDevice>,
    threads: u32,
    budget: Budget,
    rows_per_commit: u64,
) -> Result<DurableCell, BenchError> {
    sys::release_free_memory();
    let bench = SqliteBench::create(path).map_err(BenchError::Failed)?;
    let payload: String = "a".repeat(usize::from(ROW_BYTES));
    let cost_probe = CostProbe::start(device);
    let driven = drive(threads as usize, budget, rows_per_commit, |thread| {
        // The same letters per thread as lastpage's payloads.
        let letter = char::from(b'a' + (thread % 26) as u8);
        let payload: String = std::iter::repeat_n(letter, payload.len()).collect();
        let bench = &bench;
        move || {
            if rows_per_commit == 1 {
                bench.insert(&payload)
            } else {
                bench.insert_batch(&payload, rows_per_commit)
            }
        }
    })?;
    let rows = driven.statements * rows_per_commit;
    let costs = cost_probe.finish(rows, driven.statements);
    let verified = bench.verify(rows);
    bench.remove();
    Ok(DurableCell {
        engine: "sqlite",
        workload: workload_name(rows_per_commit, Commit::Full),
        threads,
        rows_per_commit,
        rows,
        commits: driven.statements,
        elapsed_sec: round6(driven.elapsed_sec),
        rows_per_sec: (driven.measured_statements as f64 * rows_per_commit as f64
            / driven.elapsed_sec)
            .round(),
        latency_us: latency_report(&driven.latency_ns),
        acknowledgement_ms_mean: None,
        commits_per_fsync: Some(1.0),
        commits_per_fsync_source: "by construction: SQLite in WAL mode with synchronous=FULL syncs the WAL at every commit (not measured)",
        fsyncs: None,
        writelog_wait_us_per_commit: None,
        waits: BTreeMap::new(),
        log_bytes_per_row: None,
        disk_bytes_per_row: costs.disk_bytes_per_row,
        cpu_us_per_row: costs.cpu_us_per_row,
        context_switches_per_commit: costs.context_switches_per_commit,
        verified,
    })
}

pub(super) fn remove_dir(dir: &Path) {
    // A leftover directory wastes disk, nothing worse; the run's own directory is removed at
    // the end anyway.
    let _ = std::fs::remove_dir_all(dir);
}

/// The directory a run's databases go in, with the directories made for it, so that removing
/// it leaves the file system as the run found it.
pub(super) struct RunDirectory {
    path: PathBuf,
    /// The directories `run_directory` created, the run's own first and then each missing
    /// parent outwards (a `--db` that did not exist, and its missing parents).
    created: Vec<PathBuf>,
}

impl RunDirectory {
    /// The run's own directory.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the run's directory with everything in it, then each directory created for it
    /// that is empty by then, innermost first. A directory that existed before the run is
    /// kept, and so is one created for it that something else has since put a file in.
    pub(super) fn remove(self) {
        remove_dir(&self.path);
        remove_created(&self.created);
    }
}

/// Removes the directories in `created` (innermost first) while they are empty: the first
/// that is not stops it, since its parents then are not empty either. One that is not there
/// (the run's own, removed already, or one a failed creation never made) is passed over.
fn remove_created(created: &[PathBuf]) {
    for dir in created {
        match std::fs::remove_dir(dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => break,
            _ => {}
        }
    }
}

/// The directory the run's databases go in: a new subdirectory of `--db` (or of the system's
/// temporary directory), so that nothing already there is touched. `bench` names the
/// benchmark in the directory's name (`durable`, `recovery`). A `--db` that does not exist is
/// created, with its missing parents, and [`RunDirectory::remove`] removes them again.
pub(super) fn run_directory(base: Option<&Path>, bench: &str) -> Result<RunDirectory, BenchError> {
    let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis())
        .unwrap_or(0);
    let path = base.join(format!(
        "lastpage-bench-{bench}-{}-{stamp}",
        std::process::id()
    ));
    // Noted before they are made: afterwards nothing tells them from directories that were
    // there. (A relative `--db` ends in the empty path, which is never created.)
    let created: Vec<PathBuf> = path
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .map(Path::to_path_buf)
        .collect();
    if let Err(error) = std::fs::create_dir_all(&path) {
        // The parents it made before it failed go too.
        remove_created(&created);
        return Err(BenchError::InvalidConfig(format!(
            "cannot create {}: {error}",
            path.display()
        )));
    }
    Ok(RunDirectory { path, created })
}

/// Runs the whole comparison.
pub fn run_durable(config: &DurableConfig) -> Result<DurableReport, BenchError> {
    if config.threads.is_empty() {
        return Err(BenchError::InvalidConfig(
            "--threads needs at least one thread count".into(),
        ));
    }
    if !(config.seconds > 0.0 && config.seconds <= 3600.0) {
        return Err(BenchError::InvalidConfig(format!(
            "--seconds must be more than 0 and at most 3600, not {}",
            config.seconds
        )));
    }
    let budget = Budget {
        seconds: config.seconds,
        rows: config.rows,
    };
    let judged_threads = if config.threads.contains(&100) {
        Some(100)
    } else {
        config.threads.iter().copied().max()
    };
    let run = run_directory(config.db.as_deref(), "durable")?;
    let dir = run.path();
    let db_dir = dir.display().to_string();
    let started = Instant::now();
    let cpu_load = sys::LoadProbe::start();
    let result = disk::measure(dir, config.seconds).and_then(|disk| {
        // One thread never parks (it leads every turn): nothing to measure.
        let wakeups = judged_threads
            .filter(|&threads| threads > 1)
            .map(|threads| wakeups::measure(threads, config.seconds.min(WAKEUP_PROBE_SECONDS)))
            .transpose()?;
        run_cells(config, budget, dir).map(|cells| (disk, wakeups, cells))
    });
    run.remove();
    let (disk, wakeups, cells) = result?;
    let (_, other_cpu_load_percent) = cpu_load.finish();

    let mut ratios = Vec::new();
    for cell in cells.iter().filter(|cell| cell.engine == "lastpage") {
        let sqlite = cells.iter().find(|other| {
            other.engine == "sqlite"
                && other.workload == sqlite_workload(cell.workload)
                && other.threads == cell.threads
        });
        if let Some(sqlite) = sqlite {
            ratios.push(Ratio {
                workload: cell.workload,
                threads: cell.threads,
                lastpage_rows_per_sec: cell.rows_per_sec,
                sqlite_rows_per_sec: sqlite.rows_per_sec,
                ratio: round3(cell.rows_per_sec / sqlite.rows_per_sec.max(1e-9)),
            });
        }
    }
    let judged = Judged {
        threads: judged_threads,
        ratio_vs_sqlite: ratios
            .iter()
            .find(|ratio| ratio.workload == "autocommit" && Some(ratio.threads) == judged_threads)
            .map(|ratio| ratio.ratio),
        commits_per_fsync: cells
            .iter()
            .find(|cell| {
                cell.engine == "lastpage"
                    && cell.workload == "autocommit"
                    && Some(cell.threads) == judged_threads
            })
            .and_then(|cell| cell.commits_per_fsync),
        batch_rows_per_sec: cells
            .iter()
            .find(|cell| cell.engine == "lastpage" && cell.workload == "batch")
            .map(|cell| cell.rows_per_sec),
        pipelined_batch_rows_per_sec: cells
            .iter()
            .find(|cell| cell.engine == "lastpage" && cell.workload == "pipelined batch")
            .map(|cell| cell.rows_per_sec),
        pipelined_batch_disk_ceiling_rows_per_sec: cells
            .iter()
            .find(|cell| cell.engine == "lastpage" && cell.workload == "pipelined batch")
            .and_then(|cell| cell.disk_bytes_per_row)
            .filter(|&bytes| bytes > 0.0)
            .map(|bytes| (disk.large_append_mb_per_sec * 1e6 / bytes).round()),
        blocking_ceiling_vs_sqlite: wakeups.as_ref().and_then(|wakeups| {
            ratios
                .iter()
                .find(|ratio| ratio.workload == "autocommit" && ratio.threads == wakeups.threads)
                .map(|ratio| {
                    round3(wakeups.round_trips_per_sec / ratio.sqlite_rows_per_sec.max(1e-9))
                })
        }),
    };
    Ok(DurableReport {
        cpus: std::thread::available_parallelism().map_or(1, |cpus| cpus.get()),
        cpu_model: sys::cpu_model(),
        db_dir,
        seconds_per_cell: config.rows.is_none().then_some(config.seconds),
        rows_per_cell: config.rows,
        batch_rows: config.batch_rows,
        row_bytes: ROW_BYTES,
        disk,
        wakeups,
        cells,
        ratios,
        judged,
        elapsed_sec: round3(started.elapsed().as_secs_f64()),
        other_cpu_load_percent,
    })
}

fn run_cells(
    config: &DurableConfig,
    budget: Budget,
    dir: &Path,
) -> Result<Vec<DurableCell>, BenchError> {
    let device = sys::BlockDevice::of(dir);
    let device = device.as_ref();
    let mut cells = Vec::new();
    for &threads in &config.threads {
        cells.push(lastpage_cell(
            &dir.join(format!("lastpage-{threads}t")),
            device,
            threads,
            budget,
            1,
            Commit::Full,
        )?);
        cells.push(sqlite_cell(
            &dir.join(format!("sqlite-{threads}t.db")),
            device,
            threads,
            budget,
            1,
        )?);
    }
    let batch = config.batch_rows.max(1);
    cells.push(lastpage_cell(
        &dir.join("lastpage-batch"),
        device,
        1,
        budget,
        batch,
        Commit::Full,
    )?);
    cells.push(lastpage_cell(
        &dir.join("lastpage-pipelined"),
        device,
        1,
        budget,
        batch,
        Commit::Pipelined,
    )?);
    cells.push(sqlite_cell(
        &dir.join("sqlite-batch.db"),
        device,
        1,
        budget,
        batch,
    )?);
    Ok(cells)
}

/// The report as tables.
pub fn render(report: &DurableReport) -> String {
    let mut out = format!(
        "bench durable: lastpage (Durability::Full) vs SQLite (WAL, synchronous=FULL, one shared \
         connection), {}-byte rows, {}, batches of {} rows; {}\n",
        report.row_bytes,
        match (report.seconds_per_cell, report.rows_per_cell) {
            (_, Some(rows)) => format!("{} rows per cell", thousands(rows)),
            (Some(seconds), None) => format!(
                "{seconds} s per cell (at most {} rows)",
                thousands(MAX_CELL_ROWS)
            ),
            (None, None) => String::new(),
        },
        thousands(report.batch_rows),
        machine(report.cpus, report.cpu_model.as_deref()),
    );
    out.push_str(&format!("databases in {} (removed)\n", report.db_dir));
    out.push_str(&format!(
        "the disk there, measured first: fdatasync after a 4 KiB append {} µs (p50); 1 MiB \
         appends each followed by fdatasync: {} MB/s\n",
        number(report.disk.small_append_fsync_p50_us),
        number(report.disk.large_append_mb_per_sec),
    ));
    let mut cells = table(
        &[
            "engine",
            "workload",
            "threads",
            "rows",
            "rows/s",
            "p50 µs/commit",
            "p99 µs/commit",
            "commits/fdatasync",
            "WRITELOG µs/commit",
            "LOGBUFFER waits",
            "log B/row",
            "disk B/row",
            "CPU µs/row",
            "ctx switches/commit",
            "× SQLite",
            "verified",
        ],
        3,
    );
    for cell in &report.cells {
        let ratio = (cell.engine == "lastpage")
            .then(|| {
                report
                    .ratios
                    .iter()
                    .find(|ratio| ratio.workload == cell.workload && ratio.threads == cell.threads)
            })
            .flatten();
        cells.add_row(vec![
            cell.engine.to_owned(),
            if cell.rows_per_commit > 1 {
                format!("{} of {}", cell.workload, thousands(cell.rows_per_commit))
            } else {
                cell.workload.to_owned()
            },
            cell.threads.to_string(),
            thousands(cell.rows),
            thousands(cell.rows_per_sec as u64),
            number(cell.latency_us.p50),
            number(cell.latency_us.p99),
            match (cell.engine, cell.commits_per_fsync) {
                ("sqlite", Some(value)) => format!("{} (by design)", number(value)),
                (_, Some(value)) => number(value),
                (_, None) => "-".to_owned(),
            },
            cell.writelog_wait_us_per_commit
                .map_or_else(|| "-".to_owned(), number),
            cell.waits.get(WaitType::LogBuffer.name()).map_or_else(
                || "-".to_owned(),
                |wait| thousands(wait.waiting_tasks_count),
            ),
            cell.log_bytes_per_row
                .map_or_else(|| "-".to_owned(), number),
            cell.disk_bytes_per_row
                .map_or_else(|| "?".to_owned(), number),
            number(cell.cpu_us_per_row),
            number(cell.context_switches_per_commit),
            ratio.map_or_else(String::new, |ratio| format!("{}×", number(ratio.ratio))),
            cell.verified.clone(),
        ]);
    }
    out.push_str(&format!("{cells}\n"));
    out.push_str(
        "SQLite's commits/fdatasync is 1 by design (WAL + synchronous=FULL syncs at every commit); \
         lastpage's is its transactions ÷ its log writer's fdatasync calls. disk B/row: bytes \
         the disk wrote per row (log, new segments' zeros, data pages, file-system journal; \
         SQLite's WAL and database; other writers to the same disk too), `?` with no disk \
         (tmpfs); CPU µs/row: the process's CPU \
         time per row, every thread.\n",
    );
    let judged = &report.judged;
    let figure = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), number);
    if let Some(threads) = judged.threads {
        out.push_str(&format!(
            "at {threads} threads: lastpage ÷ SQLite = {}× (goal ≥ 50×), commits per fdatasync = {} \
             (goal ≥ 50)\n",
            figure(judged.ratio_vs_sqlite),
            figure(judged.commits_per_fsync),
        ));
    }
    if let Some(wakeups) = &report.wakeups {
        out.push_str(&format!(
            "this machine's ceiling for {} sessions that each park at every commit: {} \
             park-and-wake round trips/s with no insert, no log and no I/O ({} per group, a \
             leader waking the rest as in group commit) = {}× SQLite (lastpage's committers \
             yield instead of parking while {} or more wait at once)\n",
            wakeups.threads,
            thousands(wakeups.round_trips_per_sec as u64),
            number(wakeups.round_trips_per_group),
            figure(judged.blocking_ceiling_vs_sqlite),
            WalConfig::default().yield_wait_committers,
        ));
    }
    let acknowledgement = report
        .cells
        .iter()
        .find_map(|cell| cell.acknowledgement_ms_mean)
        .map_or_else(String::new, |ms| {
            format!(
                ", acknowledged {} ms after its commit on average",
                number(ms)
            )
        });
    out.push_str(&format!(
        "durable batched inserts on one thread: {} rows/s with FULL commits, {} rows/s \
         pipelined ({PIPELINED_BATCHES_IN_FLIGHT} batches in flight, each counted once \
         durable{acknowledgement}) (goal ≥ 2,000,000)\n",
        figure(judged.batch_rows_per_sec),
        figure(judged.pipelined_batch_rows_per_sec),
    ));
    if let Some(ceiling) = judged.pipelined_batch_disk_ceiling_rows_per_sec {
        out.push_str(&format!(
            "this disk's ceiling for the pipelined cell: {} MB/s ÷ the bytes the disk wrote per \
             row = {} rows/s\n",
            number(report.disk.large_append_mb_per_sec),
            thousands(ceiling as u64),
        ));
    }
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
    fn drive_splits_a_row_budget_across_threads_exactly() {
        let counted = std::sync::atomic::AtomicU64::new(0);
        let budget = Budget {
            seconds: 10.0,
            rows: Some(1003),
        };
        let driven = drive(4, budget, 1, |_| {
            || {
                counted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        })
        .expect("drive");
        assert_eq!(driven.statements, 1003);
        assert_eq!(driven.measured_statements, 1003);
        assert_eq!(counted.load(Ordering::Relaxed), 1003);
        assert_eq!(driven.latency_ns.len(), 1003);
    }

    #[test]
    fn drive_stops_on_the_first_error() {
        let budget = Budget {
            seconds: 10.0,
            rows: None,
        };
        let error = drive(3, budget, 1, |thread| {
            move || {
                if thread == 1 {
                    Err("boom".to_owned())
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(())
                }
            }
        })
        .err()
        .expect("the error comes back");
        assert_eq!(error, BenchError::Failed("boom".into()));
    }

    #[test]
    fn drive_runs_for_the_time_given() {
        let budget = Budget {
            seconds: 0.2,
            rows: None,
        };
        let driven = drive(2, budget, 1, |_| {
            || {
                std::thread::sleep(Duration::from_millis(2));
                Ok(())
            }
        })
        .expect("drive");
        assert!(driven.statements > 0);
        assert!(driven.elapsed_sec >= 0.2, "{}", driven.elapsed_sec);
    }

    /// A first statement that ends after the deadline (a stalled fdatasync) is measured, and
    /// the span ends with it; later ones after the deadline are not. Before, such a cell
    /// reported 0 rows.
    #[test]
    fn drive_measures_each_threads_first_statement_even_after_the_deadline() {
        let budget = Budget {
            seconds: 0.01,
            rows: None,
        };
        let driven = drive(2, budget, 1, |_| {
            let mut first = true;
            move || {
                if std::mem::take(&mut first) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            }
        })
        .expect("drive");
        assert_eq!(driven.measured_statements, 2);
        assert!(driven.statements >= 2);
        assert!(driven.elapsed_sec >= 0.1, "{}", driven.elapsed_sec);
    }

    #[test]
    fn sqlite_cells_verify() {
        let run = run_directory(None, "durable").expect("dir");
        let dir = run.path();
        let budget = Budget {
            seconds: 10.0,
            rows: Some(40),
        };
        let device = sys::BlockDevice::of(dir);
        let cell =
            sqlite_cell(&dir.join("s.db"), device.as_ref(), 4, budget, 1).expect("autocommit");
        assert_eq!(
            (cell.rows, cell.commits, cell.verified.as_str()),
            (40, 40, "ok")
        );
        // Forty synced commits make the disk write, and cost CPU time.
        if device.is_some() {
            assert!(
                cell.disk_bytes_per_row.is_some_and(|bytes| bytes > 0.0),
                "{cell:?}"
            );
        }
        assert!(cell.cpu_us_per_row > 0.0, "{cell:?}");
        let cell = sqlite_cell(&dir.join("b.db"), device.as_ref(), 1, budget, 20).expect("batch");
        assert_eq!(
            (cell.rows, cell.commits, cell.verified.as_str()),
            (40, 2, "ok")
        );
        run.remove();
    }
}
