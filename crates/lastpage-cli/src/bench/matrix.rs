//! `bench insert-matrix`: every remedy on every insert path and latch flavour, in one process.
//!
//! A cell is (row bytes, threads, path + latch, key + remedy). The keys are the ascending key
//! with every remedy and the random key without one. Cells of the same row size and thread
//! count run next to each other, together with the "ideal append" reference
//! ([`super::ideal`]); with `--repeat K` the whole list runs K times, each time starting at a
//! different place (the order rotated by 1/K of the list), and the tables show medians.
//!
//! Every cell is compared with the ascending classic+fifo baseline (SQL Server's behaviour)
//! and with the random key on its own path and latch; the summary holds the judged figures.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use lastpage_engine::{InsertPath, LatchPolicy, WaitType};
use serde::Serialize;

use super::compare::median;
use super::ideal::{IDEAL_MAX_PASSES, IdealReport, run_ideal_append};
use super::insert::{
    BenchError, InsertConfig, InsertReport, KeyKind, MAX_VARCHAR_ROW_BYTES, Remedy,
    run_insert_bench,
};
use super::render::{number, table, thousands};
use crate::sys;

/// Default rows per cell (split across the threads) for rows up to 900 bytes: 600 per thread
/// at 300 threads, where shorter runs may end before a convoy forms (see
/// [`super::compare::MIN_SMALL_ROWS_PER_THREAD`]).
pub const SMALL_ROWS_PER_CELL: u64 = 180_000;

/// Default, and cap, of rows per cell for larger rows: each CHAR(8000) row takes a page (480 MB
/// of pages per cell). Half as many made cells of under a tenth of a second at 100 threads,
/// whose medians still swung by 10% between runs.
pub const LARGE_ROWS_PER_CELL: u64 = 60_000;

/// An insert path with a latch flavour, applied to every index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Setup {
    /// The insert path.
    pub path: InsertPath,
    /// The latch flavour.
    pub latch: LatchPolicy,
}

impl Setup {
    /// `classic+fifo` and the like.
    pub fn name(self) -> String {
        format!("{}+{}", self.path.name(), self.latch.name())
    }
}

/// SQL Server-like: the baseline family.
pub const CLASSIC_FIFO: Setup = Setup {
    path: InsertPath::Classic,
    latch: LatchPolicy::Fifo,
};

/// Ours: what a user gets without asking.
pub const DEFAULT_ADAPTIVE: Setup = Setup {
    path: InsertPath::Default,
    latch: LatchPolicy::Adaptive,
};

/// The classic path with the unfair latch: how much the latch alone does.
pub const CLASSIC_ADAPTIVE: Setup = Setup {
    path: InsertPath::Classic,
    latch: LatchPolicy::Adaptive,
};

/// The path + latch configurations, in display order.
pub const SETUPS: [Setup; 3] = [CLASSIC_FIFO, DEFAULT_ADAPTIVE, CLASSIC_ADAPTIVE];

/// A clustered key with a remedy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Ascending or random.
    pub key: KeyKind,
    /// The remedy.
    pub remedy: Remedy,
}

impl Variant {
    /// `ascending/none`, `ascending/mod16`, `random/none` ...
    pub fn label(self) -> String {
        format!("{}/{}", self.key.name(), self.remedy.name())
    }
}

/// The ascending key without a remedy.
pub const ASCENDING: Variant = Variant {
    key: KeyKind::Ascending,
    remedy: Remedy::None,
};

/// The random key (the "random key" remedy).
pub const RANDOM: Variant = Variant {
    key: KeyKind::Random,
    remedy: Remedy::None,
};

/// Every key + remedy of the matrix: the ascending key with each remedy, then the random key.
pub fn variants() -> Vec<Variant> {
    Remedy::ALL
        .into_iter()
        .map(|remedy| Variant {
            key: KeyKind::Ascending,
            remedy,
        })
        .chain([RANDOM])
        .collect()
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatrixConfig {
    /// Rows per thread in every cell; `None` for the defaults.
    pub rows_per_thread: Option<u64>,
    /// Runs of every cell.
    pub repeat: u32,
    /// Thread counts.
    pub threads: Vec<u32>,
    /// Row sizes.
    pub row_bytes: Vec<u16>,
}

impl Default for MatrixConfig {
    fn default() -> Self {
        MatrixConfig {
            rows_per_thread: None,
            repeat: 3,
            threads: vec![1, 2, 100, 300],
            row_bytes: vec![100, 8000],
        }
    }
}

impl MatrixConfig {
    /// Rows per thread of the cells with `threads` threads and `row_bytes`-byte rows
    /// (batch100 cells round it up to a multiple of 100).
    pub fn rows_per_thread(&self, threads: u32, row_bytes: u16) -> u64 {
        let threads = u64::from(threads.max(1));
        let large = row_bytes > MAX_VARCHAR_ROW_BYTES;
        let per_thread = match self.rows_per_thread {
            Some(rows) if large => rows.min(LARGE_ROWS_PER_CELL / threads),
            Some(rows) => rows,
            None if large => LARGE_ROWS_PER_CELL / threads,
            None => SMALL_ROWS_PER_CELL / threads,
        };
        per_thread.max(1)
    }

    /// The thread counts the judged figures use: 100 and 300 if present, else the largest.
    pub fn judged_threads(&self) -> Vec<u32> {
        let judged: Vec<u32> = [100, 300]
            .into_iter()
            .filter(|threads| self.threads.contains(threads))
            .collect();
        if judged.is_empty() {
            self.threads.iter().copied().max().into_iter().collect()
        } else {
            judged
        }
    }

    fn engine_config(
        &self,
        row_bytes: u16,
        threads: u32,
        setup: Setup,
        variant: Variant,
    ) -> InsertConfig {
        InsertConfig {
            threads,
            rows_per_thread: self.rows_per_thread(threads, row_bytes),
            key: variant.key,
            row_bytes,
            latch: setup.latch,
            insert_path: setup.path,
            remedy: variant.remedy,
            warmup_rows: 0,
            ..InsertConfig::default()
        }
    }
}

/// One engine cell: medians over its runs.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixCell {
    /// Path + latch, for look-ups.
    #[serde(skip)]
    pub setup: Setup,
    /// Key + remedy, for look-ups.
    #[serde(skip)]
    pub variant: Variant,
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Sessions.
    pub threads: u32,
    /// `classic+fifo`, `default+adaptive` or `classic+adaptive`.
    pub config: String,
    /// Insert path of every index.
    pub insert_path: &'static str,
    /// Latch flavour of every index.
    pub latch: &'static str,
    /// `ascending` or `random`.
    pub key: KeyKind,
    /// The remedy.
    pub remedy: Remedy,
    /// Rows per session (rounded up to whole statements for batch100).
    pub rows_per_thread: u64,
    /// Rows per run.
    pub rows: u64,
    /// `row` or `statement` (batch100): what a latency sample is.
    pub latency_unit: &'static str,
    /// Median rows per second.
    pub rows_per_sec: f64,
    /// Every run's rows per second, in run order.
    pub rows_per_sec_runs: Vec<f64>,
    /// rows/s ÷ the ascending classic+fifo baseline's (same threads and row size).
    pub ratio_to_baseline: Option<f64>,
    /// rows/s ÷ the random key's on the same path and latch (same threads and row size).
    pub ratio_to_random: Option<f64>,
    /// Median waits per row of every wait type seen (PAGELATCH_EX, PAGELATCH_SH and
    /// BTREE_INSERT_FLOW_CONTROL always).
    pub waits_per_row: BTreeMap<String, f64>,
    /// Median context switches of the inserting threads per row.
    pub context_switches_per_row: f64,
    /// Median minor page faults of the process per row (fresh memory from the kernel).
    pub page_faults_per_row: f64,
    /// Median p99 latency (per `latency_unit`), microseconds.
    pub p99_us: f64,
    /// Median leaf fill of the clustered index, from the integrity check.
    pub leaf_fill: Option<f64>,
    /// `"ok"` if every run passed the integrity check, else the first failure (or the error
    /// that stopped a run).
    pub integrity: String,
}

/// The ideal-append reference of one row size and thread count.
#[derive(Clone, Debug, Serialize)]
pub struct IdealCell {
    /// Bytes copied per row.
    pub row_bytes: u16,
    /// Threads.
    pub threads: u32,
    /// Rows per thread in a pass.
    pub rows_per_thread: u64,
    /// Rows per pass (a run repeats its pass until a quarter of a second was timed: see
    /// [`super::ideal`]).
    pub rows: u64,
    /// Median passes per run.
    pub passes: f64,
    /// Median rows per second.
    pub rows_per_sec: f64,
    /// Every run's rows per second.
    pub rows_per_sec_runs: Vec<f64>,
    /// rows/s ÷ the ascending classic+fifo baseline's.
    pub ratio_to_baseline: Option<f64>,
    /// Median context switches per row.
    pub context_switches_per_row: f64,
    /// Median p99 latency, microseconds.
    pub p99_us: f64,
    /// `"ok"` if every run wrote every slot once.
    pub integrity: String,
}

/// default+adaptive ascending against the best remedy.
#[derive(Clone, Debug, Serialize)]
pub struct BestRemedyFigure {
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Sessions.
    pub threads: u32,
    /// default+adaptive, ascending key, no remedy.
    pub default_ascending_rows_per_sec: f64,
    /// The fastest of {random key, mod16, partition16} on {classic+fifo, default+adaptive}.
    pub best_remedy: String,
    /// Its rows per second.
    pub best_remedy_rows_per_sec: f64,
    /// `default_ascending_rows_per_sec / best_remedy_rows_per_sec`.
    pub ratio: Option<f64>,
}

/// One rows/s ratio between two cells.
#[derive(Clone, Debug, Serialize)]
pub struct RatioFigure {
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Sessions.
    pub threads: u32,
    /// The numerator's rows per second.
    pub numerator_rows_per_sec: f64,
    /// The denominator's rows per second.
    pub denominator_rows_per_sec: f64,
    /// Their ratio.
    pub ratio: Option<f64>,
}

/// The judged figures.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixSummary {
    /// Thread counts the figures use (100 and 300 if the run had them).
    pub judged_threads: Vec<u32>,
    /// For every row size and judged thread count: default+adaptive ascending ÷ the best
    /// remedy among {random key, mod16, partition16} x {classic+fifo, default+adaptive}.
    pub default_ascending_vs_best_remedy: Vec<BestRemedyFigure>,
    /// default+adaptive ÷ classic+fifo, ascending key, no remedy, at 300 threads (or the
    /// largest judged count), every row size.
    pub default_adaptive_vs_classic_fifo: Vec<RatioFigure>,
    /// default+adaptive ascending ÷ ideal append at 100 threads (or the smallest judged
    /// count), every row size.
    pub default_ascending_vs_ideal_append: Vec<RatioFigure>,
}

/// Rows of one row size and thread count.
#[derive(Clone, Debug, Serialize)]
pub struct CellSize {
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Sessions.
    pub threads: u32,
    /// Rows per session (before batch100's rounding).
    pub rows_per_thread: u64,
    /// Rows per cell.
    pub rows: u64,
}

/// The whole matrix.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixReport {
    /// Processors the machine reports.
    pub cpus: usize,
    /// The processor model, if `/proc/cpuinfo` names it.
    pub cpu_model: Option<String>,
    /// Runs of every cell.
    pub repeat: u32,
    /// `--rows-per-thread`, if given.
    pub rows_per_thread: Option<u64>,
    /// Rows per cell for every row size and thread count.
    pub cell_sizes: Vec<CellSize>,
    /// The path + latch configurations.
    pub configs: Vec<String>,
    /// Wall time of the whole matrix.
    pub elapsed_sec: f64,
    /// Share of the machine's CPU capacity other processes used during the matrix.
    pub other_cpu_load_percent: Option<f64>,
    /// The ideal-append reference of every row size and thread count.
    pub ideal: Vec<IdealCell>,
    /// Every engine cell, grouped by row size and thread count.
    pub cells: Vec<MatrixCell>,
    /// The judged figures.
    pub summary: MatrixSummary,
    /// Roundings and other things the reader should know.
    pub notes: Vec<String>,
}

impl MatrixReport {
    /// Whether every run of every cell passed its integrity check.
    pub fn all_ok(&self) -> bool {
        self.cells.iter().all(|cell| cell.integrity == "ok")
            && self.ideal.iter().all(|cell| cell.integrity == "ok")
    }

    fn cell(
        &self,
        row_bytes: u16,
        threads: u32,
        setup: Setup,
        variant: Variant,
    ) -> Option<&MatrixCell> {
        self.cells.iter().find(|cell| {
            cell.row_bytes == row_bytes
                && cell.threads == threads
                && cell.setup == setup
                && cell.variant == variant
        })
    }
}

/// One thing to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Job {
    Engine {
        row_bytes: u16,
        threads: u32,
        setup: Setup,
        variant: Variant,
    },
    Ideal {
        row_bytes: u16,
        threads: u32,
    },
}

/// The result of one run: a report, or the error that stopped it.
type EngineRun = Result<InsertReport, String>;

/// Runs the matrix, reporting each run on stderr as it finishes.
pub fn run_matrix(config: &MatrixConfig) -> Result<MatrixReport, BenchError> {
    let invalid = |message: &str| Err(BenchError::InvalidConfig(message.to_owned()));
    if config.repeat == 0 {
        return invalid("--repeat must be at least 1");
    }
    if config.threads.is_empty() {
        return invalid("--threads needs at least one thread count");
    }
    if config.row_bytes.is_empty() {
        return invalid("--row-bytes needs at least one row size");
    }
    let variants = variants();
    let mut jobs = Vec::new();
    for &row_bytes in &config.row_bytes {
        for &threads in &config.threads {
            jobs.push(Job::Ideal { row_bytes, threads });
            for setup in SETUPS {
                for &variant in &variants {
                    // Validate every cell before running any, so bad flags fail at once.
                    config
                        .engine_config(row_bytes, threads, setup, variant)
                        .rounded_to_statements()
                        .0
                        .validate()?;
                    jobs.push(Job::Engine {
                        row_bytes,
                        threads,
                        setup,
                        variant,
                    });
                }
            }
        }
    }

    let started = Instant::now();
    let cpu_load = sys::LoadProbe::start();
    let mut notes = Vec::new();
    // One untimed run per row size before the cells (the random key at the most threads, whose
    // pages every thread allocates), so the first cell does not also pay for the process's
    // first use of its code and thread stacks. Every run then starts from cold memory (see
    // `run_insert_bench`).
    let most_threads = config.threads.iter().copied().max().unwrap_or(1);
    for &row_bytes in &config.row_bytes {
        let warm_up = config.engine_config(row_bytes, most_threads, CLASSIC_ADAPTIVE, RANDOM);
        let warm_started = Instant::now();
        run_insert_bench(&warm_up)?;
        eprintln!(
            "[warm-up] {row_bytes:>4} B, {most_threads:>3} threads, {} {} (untimed, {:.2} s)",
            CLASSIC_ADAPTIVE.name(),
            RANDOM.label(),
            warm_started.elapsed().as_secs_f64()
        );
    }
    notes.push(format!(
        "before the cells, one untimed warm-up run per row size ({} on {}, {most_threads} threads); \
         every run starts with the allocator's free memory returned to the kernel, as in a fresh process{}",
        RANDOM.label(),
        CLASSIC_ADAPTIVE.name(),
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            ""
        } else {
            " (not on this platform: runs may reuse memory earlier ones freed; see pf/row)"
        }
    ));
    let mut engine_runs: HashMap<Job, Vec<EngineRun>> = HashMap::new();
    let mut ideal_runs: HashMap<Job, Vec<Result<IdealReport, String>>> = HashMap::new();
    let total = jobs.len() * config.repeat as usize;
    let mut done = 0;
    for repetition in 0..config.repeat as usize {
        let shift = repetition * jobs.len() / config.repeat as usize;
        let mut order = jobs.clone();
        order.rotate_left(shift);
        for job in order {
            let run_started = Instant::now();
            done += 1;
            let (label, outcome) = match job {
                Job::Engine {
                    row_bytes,
                    threads,
                    setup,
                    variant,
                } => {
                    let run =
                        run_insert_bench(&config.engine_config(row_bytes, threads, setup, variant))
                            .map_err(|error| error.to_string());
                    let outcome = match &run {
                        Ok(report) if report.integrity == "ok" => {
                            format!("{:>11} rows/s", thousands(report.rows_per_sec as u64))
                        }
                        Ok(report) => format!("INTEGRITY FAILURE: {}", report.integrity),
                        Err(error) => format!("FAILED: {error}"),
                    };
                    engine_runs.entry(job).or_default().push(run);
                    (
                        format!(
                            "{row_bytes:>4} B, {threads:>3} threads, {:<16} {:<21}",
                            setup.name(),
                            variant.label()
                        ),
                        outcome,
                    )
                }
                Job::Ideal { row_bytes, threads } => {
                    let run = run_ideal_append(
                        threads,
                        config.rows_per_thread(threads, row_bytes),
                        row_bytes,
                    )
                    .map_err(|error| error.to_string());
                    let outcome = match &run {
                        Ok(report) => {
                            format!("{:>11} rows/s", thousands(report.rows_per_sec as u64))
                        }
                        Err(error) => format!("FAILED: {error}"),
                    };
                    ideal_runs.entry(job).or_default().push(run);
                    (
                        format!(
                            "{row_bytes:>4} B, {threads:>3} threads, {:<38}",
                            "ideal append"
                        ),
                        outcome,
                    )
                }
            };
            eprintln!(
                "[{done:>3}/{total}] {label} {outcome} ({:.2} s; {:.0} s so far)",
                run_started.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let (_, other_cpu_load_percent) = cpu_load.finish();
    let elapsed_sec = round3(started.elapsed().as_secs_f64());

    let mut cells = Vec::new();
    let mut ideal = Vec::new();
    for job in &jobs {
        match *job {
            Job::Engine {
                row_bytes,
                threads,
                setup,
                variant,
            } => {
                let runs = engine_runs.remove(job).unwrap_or_default();
                for note in runs.iter().flatten().flat_map(|run| &run.notes) {
                    let note = format!("{row_bytes} B, {threads} threads: {note}");
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                cells.push(summarize(config, row_bytes, threads, setup, variant, &runs));
            }
            Job::Ideal { row_bytes, threads } => {
                let runs = ideal_runs.remove(job).unwrap_or_default();
                ideal.push(summarize_ideal(config, row_bytes, threads, &runs));
            }
        }
    }
    let mut report = MatrixReport {
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: sys::cpu_model(),
        repeat: config.repeat,
        rows_per_thread: config.rows_per_thread,
        cell_sizes: config
            .row_bytes
            .iter()
            .flat_map(|&row_bytes| {
                config
                    .threads
                    .iter()
                    .map(move |&threads| (row_bytes, threads))
            })
            .map(|(row_bytes, threads)| {
                let rows_per_thread = config.rows_per_thread(threads, row_bytes);
                CellSize {
                    row_bytes,
                    threads,
                    rows_per_thread,
                    rows: rows_per_thread * u64::from(threads),
                }
            })
            .collect(),
        configs: SETUPS.iter().map(|setup| setup.name()).collect(),
        elapsed_sec,
        other_cpu_load_percent,
        ideal,
        cells,
        summary: MatrixSummary {
            judged_threads: Vec::new(),
            default_ascending_vs_best_remedy: Vec::new(),
            default_adaptive_vs_classic_fifo: Vec::new(),
            default_ascending_vs_ideal_append: Vec::new(),
        },
        notes,
    };
    fill_ratios(&mut report);
    report.summary = summary(config, &report);
    Ok(report)
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// `numerator / denominator`, rounded, if the denominator is positive.
fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0).then(|| round3(numerator / denominator))
}

fn summarize(
    config: &MatrixConfig,
    row_bytes: u16,
    threads: u32,
    setup: Setup,
    variant: Variant,
    runs: &[EngineRun],
) -> MatrixCell {
    let reports: Vec<&InsertReport> = runs.iter().flatten().collect();
    let median_of = |value: &dyn Fn(&InsertReport) -> f64| {
        median(reports.iter().map(|report| value(report)).collect())
    };
    let mut waits_per_row = BTreeMap::new();
    let mut names: Vec<&'static str> = vec![
        WaitType::PageLatchEx.name(),
        WaitType::PageLatchSh.name(),
        WaitType::BtreeInsertFlowControl.name(),
    ];
    for report in &reports {
        for (name, per_row) in &report.waits_per_row {
            if *per_row > 0.0 && !names.contains(name) {
                names.push(name);
            }
        }
    }
    for name in names {
        waits_per_row.insert(
            name.to_owned(),
            median_of(&|report| report.waits_per_row.get(name).copied().unwrap_or(0.0)),
        );
    }
    let integrity = runs
        .iter()
        .find_map(|run| match run {
            Ok(report) if report.integrity != "ok" => Some(report.integrity.clone()),
            Ok(_) => None,
            Err(error) => Some(format!("run failed: {error}")),
        })
        .unwrap_or_else(|| "ok".to_owned());
    let first = reports.first();
    let rows_per_thread = first.map_or_else(
        || config.rows_per_thread(threads, row_bytes),
        |report| report.config.rows_per_thread,
    );
    let fills: Vec<f64> = reports
        .iter()
        .filter_map(|report| report.tree.leaf_fill)
        .collect();
    MatrixCell {
        setup,
        variant,
        row_bytes,
        threads,
        config: setup.name(),
        insert_path: setup.path.name(),
        latch: setup.latch.name(),
        key: variant.key,
        remedy: variant.remedy,
        rows_per_thread,
        rows: rows_per_thread * u64::from(threads),
        latency_unit: first.map_or("row", |report| report.latency_unit),
        rows_per_sec: median_of(&|report| report.rows_per_sec),
        rows_per_sec_runs: runs
            .iter()
            .map(|run| run.as_ref().map_or(0.0, |report| report.rows_per_sec))
            .collect(),
        ratio_to_baseline: None,
        ratio_to_random: None,
        waits_per_row,
        context_switches_per_row: median_of(&|report| report.context_switches_per_row),
        page_faults_per_row: median_of(&|report| report.page_faults_per_row),
        p99_us: median_of(&|report| report.latency_us.p99),
        leaf_fill: (!fills.is_empty()).then(|| median(fills)),
        integrity,
    }
}

fn summarize_ideal(
    config: &MatrixConfig,
    row_bytes: u16,
    threads: u32,
    runs: &[Result<IdealReport, String>],
) -> IdealCell {
    let reports: Vec<&IdealReport> = runs.iter().flatten().collect();
    let median_of = |value: fn(&IdealReport) -> f64| {
        median(reports.iter().map(|report| value(report)).collect())
    };
    let rows_per_thread = config.rows_per_thread(threads, row_bytes);
    IdealCell {
        row_bytes,
        threads,
        rows_per_thread,
        rows: rows_per_thread * u64::from(threads),
        passes: median_of(|report| f64::from(report.passes)),
        rows_per_sec: median_of(|report| report.rows_per_sec),
        rows_per_sec_runs: runs
            .iter()
            .map(|run| run.as_ref().map_or(0.0, |report| report.rows_per_sec))
            .collect(),
        ratio_to_baseline: None,
        context_switches_per_row: median_of(|report| report.context_switches_per_row),
        p99_us: median_of(|report| report.p99_us),
        integrity: runs
            .iter()
            .find_map(|run| match run {
                Ok(report) if report.integrity != "ok" => Some(report.integrity.clone()),
                Ok(_) => None,
                Err(error) => Some(format!("run failed: {error}")),
            })
            .unwrap_or_else(|| "ok".to_owned()),
    }
}

/// Fills in every cell's ratio to the baseline and to the random key.
fn fill_ratios(report: &mut MatrixReport) {
    let rate = |report: &MatrixReport, row_bytes, threads, setup, variant| {
        report
            .cell(row_bytes, threads, setup, variant)
            .map(|cell| cell.rows_per_sec)
    };
    let mut ratios = Vec::with_capacity(report.cells.len());
    for cell in &report.cells {
        let setup = cell.setup;
        let baseline = rate(
            report,
            cell.row_bytes,
            cell.threads,
            CLASSIC_FIFO,
            ASCENDING,
        );
        let random = rate(report, cell.row_bytes, cell.threads, setup, RANDOM);
        ratios.push((
            baseline.and_then(|baseline| ratio(cell.rows_per_sec, baseline)),
            random.and_then(|random| ratio(cell.rows_per_sec, random)),
        ));
    }
    for (cell, (to_baseline, to_random)) in report.cells.iter_mut().zip(ratios) {
        cell.ratio_to_baseline = to_baseline;
        cell.ratio_to_random = to_random;
    }
    let baselines: Vec<Option<f64>> = report
        .ideal
        .iter()
        .map(|ideal| {
            rate(
                report,
                ideal.row_bytes,
                ideal.threads,
                CLASSIC_FIFO,
                ASCENDING,
            )
        })
        .collect();
    for (ideal, baseline) in report.ideal.iter_mut().zip(baselines) {
        ideal.ratio_to_baseline = baseline.and_then(|baseline| ratio(ideal.rows_per_sec, baseline));
    }
}

/// The judged figures.
fn summary(config: &MatrixConfig, report: &MatrixReport) -> MatrixSummary {
    let judged = config.judged_threads();
    let rate = |row_bytes, threads, setup, variant| {
        report
            .cell(row_bytes, threads, setup, variant)
            .map_or(0.0, |cell| cell.rows_per_sec)
    };
    let candidates: Vec<(Setup, Variant)> = [CLASSIC_FIFO, DEFAULT_ADAPTIVE]
        .into_iter()
        .flat_map(|setup| {
            [
                RANDOM,
                Variant {
                    key: KeyKind::Ascending,
                    remedy: Remedy::Mod16,
                },
                Variant {
                    key: KeyKind::Ascending,
                    remedy: Remedy::Partition16,
                },
            ]
            .into_iter()
            .map(move |variant| (setup, variant))
        })
        .collect();
    let mut best_remedy = Vec::new();
    for &row_bytes in &config.row_bytes {
        for &threads in &judged {
            let ours = rate(row_bytes, threads, DEFAULT_ADAPTIVE, ASCENDING);
            let (best, best_rate) = candidates
                .iter()
                .map(|&(setup, variant)| {
                    ((setup, variant), rate(row_bytes, threads, setup, variant))
                })
                .fold(
                    None,
                    |best: Option<((Setup, Variant), f64)>, candidate| match best {
                        Some(best) if best.1 >= candidate.1 => Some(best),
                        _ => Some(candidate),
                    },
                )
                .unwrap_or(((CLASSIC_FIFO, RANDOM), 0.0));
            let name = if best.1 == RANDOM {
                "random key".to_owned()
            } else {
                best.1.remedy.name().to_owned()
            };
            best_remedy.push(BestRemedyFigure {
                row_bytes,
                threads,
                default_ascending_rows_per_sec: ours,
                best_remedy: format!("{name} on {}", best.0.name()),
                best_remedy_rows_per_sec: best_rate,
                ratio: ratio(ours, best_rate),
            });
        }
    }
    let most = if judged.contains(&300) {
        300
    } else {
        judged.iter().copied().max().unwrap_or(1)
    };
    let fewest = if judged.contains(&100) {
        100
    } else {
        judged.iter().copied().min().unwrap_or(1)
    };
    let figure = |row_bytes, threads, numerator: f64, denominator: f64| RatioFigure {
        row_bytes,
        threads,
        numerator_rows_per_sec: numerator,
        denominator_rows_per_sec: denominator,
        ratio: ratio(numerator, denominator),
    };
    let vs_classic = config
        .row_bytes
        .iter()
        .map(|&row_bytes| {
            figure(
                row_bytes,
                most,
                rate(row_bytes, most, DEFAULT_ADAPTIVE, ASCENDING),
                rate(row_bytes, most, CLASSIC_FIFO, ASCENDING),
            )
        })
        .collect();
    let vs_ideal = config
        .row_bytes
        .iter()
        .map(|&row_bytes| {
            let ideal = report
                .ideal
                .iter()
                .find(|ideal| ideal.row_bytes == row_bytes && ideal.threads == fewest)
                .map_or(0.0, |ideal| ideal.rows_per_sec);
            figure(
                row_bytes,
                fewest,
                rate(row_bytes, fewest, DEFAULT_ADAPTIVE, ASCENDING),
                ideal,
            )
        })
        .collect();
    MatrixSummary {
        judged_threads: judged,
        default_ascending_vs_best_remedy: best_remedy,
        default_adaptive_vs_classic_fifo: vs_classic,
        default_ascending_vs_ideal_append: vs_ideal,
    }
}

fn optional_ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}"))
}

/// The matrix as text to paste into an issue note.
pub fn render(report: &MatrixReport) -> String {
    let mut out = String::from(
        "bench insert-matrix: every remedy x insert path + latch (on every index), one table per cell, \
         single-row inserts (batch100: 100-row statements), all cells interleaved in one process\n",
    );
    out.push_str(&format!(
        "machine: {} CPU(s){}\n",
        report.cpus,
        report
            .cpu_model
            .as_ref()
            .map_or_else(String::new, |model| format!(", {model}"))
    ));
    let sizes: Vec<String> = report
        .cell_sizes
        .iter()
        .map(|size| {
            format!(
                "{} B x {} thr: {} x {}",
                size.row_bytes,
                size.threads,
                size.threads,
                thousands(size.rows_per_thread)
            )
        })
        .collect();
    out.push_str(&format!(
        "rows per cell (threads x rows per thread): {}\n",
        sizes.join("; ")
    ));
    out.push_str(&format!(
        "repetitions: {} (cell order rotated between repetitions; every figure is a median){}\n",
        report.repeat,
        if report.repeat == 1 {
            "; one run per cell, so single numbers carry run-to-run noise"
        } else {
            ""
        }
    ));
    out.push_str(&super::render::run_footer(
        report.elapsed_sec,
        report.other_cpu_load_percent,
    ));

    let row_sizes: Vec<u16> = report
        .cell_sizes
        .iter()
        .fold(Vec::new(), |mut sizes, size| {
            if !sizes.contains(&size.row_bytes) {
                sizes.push(size.row_bytes);
            }
            sizes
        });
    for row_bytes in row_sizes {
        out.push_str(&format!("\n{row_bytes}-byte rows\n"));
        let mut grid = table(
            &[
                "threads",
                "path+latch",
                "key/remedy",
                "rows/s",
                "÷ base",
                "÷ rand",
                "EX/row",
                "SH/row",
                "FLOW/row",
                "other waits/row",
                "cs/row",
                "pf/row",
                "leaf fill",
                "check",
            ],
            3,
        );
        for size in report
            .cell_sizes
            .iter()
            .filter(|size| size.row_bytes == row_bytes)
        {
            if let Some(ideal) = report
                .ideal
                .iter()
                .find(|ideal| ideal.row_bytes == row_bytes && ideal.threads == size.threads)
            {
                grid.add_row(vec![
                    size.threads.to_string(),
                    "-".to_owned(),
                    "ideal append".to_owned(),
                    thousands(ideal.rows_per_sec as u64),
                    optional_ratio(ideal.ratio_to_baseline),
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                    number(ideal.context_switches_per_row),
                    "-".to_owned(),
                    "-".to_owned(),
                    ideal.integrity.clone(),
                ]);
            }
            for cell in report
                .cells
                .iter()
                .filter(|cell| cell.row_bytes == row_bytes && cell.threads == size.threads)
            {
                let wait =
                    |name: &str| number(cell.waits_per_row.get(name).copied().unwrap_or(0.0));
                let others: Vec<String> = cell
                    .waits_per_row
                    .iter()
                    .filter(|(name, per_row)| {
                        **per_row > 0.0
                            && ![
                                WaitType::PageLatchEx.name(),
                                WaitType::PageLatchSh.name(),
                                WaitType::BtreeInsertFlowControl.name(),
                            ]
                            .contains(&name.as_str())
                    })
                    .map(|(name, per_row)| format!("{name} {}", number(*per_row)))
                    .collect();
                grid.add_row(vec![
                    cell.threads.to_string(),
                    cell.config.clone(),
                    format!(
                        "{}/{}{}",
                        cell.key.name(),
                        cell.remedy.name(),
                        if cell.latency_unit == "statement" {
                            "*"
                        } else {
                            ""
                        }
                    ),
                    thousands(cell.rows_per_sec as u64),
                    optional_ratio(cell.ratio_to_baseline),
                    optional_ratio(cell.ratio_to_random),
                    wait(WaitType::PageLatchEx.name()),
                    wait(WaitType::PageLatchSh.name()),
                    wait(WaitType::BtreeInsertFlowControl.name()),
                    if others.is_empty() {
                        "-".to_owned()
                    } else {
                        others.join(", ")
                    },
                    number(cell.context_switches_per_row),
                    number(cell.page_faults_per_row),
                    cell.leaf_fill
                        .map_or_else(|| "-".to_owned(), |fill| format!("{:.1}%", fill * 100.0)),
                    if cell.integrity == "ok" {
                        "ok".to_owned()
                    } else {
                        "FAILED".to_owned()
                    },
                ]);
            }
        }
        out.push_str(&format!("{grid}\n"));
    }
    out.push_str(&format!(
        "÷ base: rows/s ÷ ascending/none on classic+fifo (SQL Server-like), same threads and row size. \
         ÷ rand: rows/s ÷ random/none on the same path+latch. EX, SH, FLOW: PAGELATCH_EX, PAGELATCH_SH, \
         BTREE_INSERT_FLOW_CONTROL waiting_tasks_count per row (every index); cs: voluntary + involuntary \
         context switches of the inserting threads per row; pf: minor page faults of the process per \
         row (fresh memory from the kernel); leaf fill: the clustered index's, from the \
         integrity check. *: 100-row statements (insert_batch_values). ideal append: per row one shared atomic \
         fetch_add plus a copy of the row's bytes into a buffer allocated and touched before the clock \
         starts (so it pays no page faults; the engine runs pay theirs, pf), same threads, start gate \
         and per-row timing as the engine runs; each of its runs repeats that pass with fresh threads until \
         a quarter of a second has been timed (at most {IDEAL_MAX_PASSES} passes), and counts every pass's rows over every pass's time.\n",
    ));
    for cell in &report.cells {
        if cell.integrity != "ok" {
            out.push_str(&format!(
                "INTEGRITY FAILURE: {} B, {} threads, {}, {}/{}: {}\n",
                cell.row_bytes,
                cell.threads,
                cell.config,
                cell.key.name(),
                cell.remedy.name(),
                cell.integrity
            ));
        }
    }
    for ideal in &report.ideal {
        if ideal.integrity != "ok" {
            out.push_str(&format!(
                "IDEAL APPEND FAILURE: {} B, {} threads: {}\n",
                ideal.row_bytes, ideal.threads, ideal.integrity
            ));
        }
    }
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }

    let summary = &report.summary;
    out.push_str("\njudged figures (rows/s ratios; below 1 the first is slower)\n");
    for figure in &summary.default_ascending_vs_best_remedy {
        out.push_str(&format!(
            "- {} B, {} threads: default+adaptive ascending {} ÷ best remedy ({}) {} = {}\n",
            figure.row_bytes,
            figure.threads,
            thousands(figure.default_ascending_rows_per_sec as u64),
            figure.best_remedy,
            thousands(figure.best_remedy_rows_per_sec as u64),
            optional_ratio(figure.ratio)
        ));
    }
    for figure in &summary.default_adaptive_vs_classic_fifo {
        out.push_str(&format!(
            "- {} B, {} threads: default+adaptive ÷ classic+fifo, ascending/none: {} ÷ {} = {}\n",
            figure.row_bytes,
            figure.threads,
            thousands(figure.numerator_rows_per_sec as u64),
            thousands(figure.denominator_rows_per_sec as u64),
            optional_ratio(figure.ratio)
        ));
    }
    for figure in &summary.default_ascending_vs_ideal_append {
        out.push_str(&format!(
            "- {} B, {} threads: default+adaptive ascending ÷ ideal append: {} ÷ {} = {}\n",
            figure.row_bytes,
            figure.threads,
            thousands(figure.numerator_rows_per_sec as u64),
            thousands(figure.denominator_rows_per_sec as u64),
            optional_ratio(figure.ratio)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_stay_within_their_row_budgets() {
        let defaults = MatrixConfig::default();
        assert_eq!(defaults.rows_per_thread(1, 100), 180_000);
        assert_eq!(defaults.rows_per_thread(100, 100), 1_800);
        assert_eq!(defaults.rows_per_thread(300, 100), 600);
        assert_eq!(defaults.rows_per_thread(300, 8000), 200);
        assert_eq!(defaults.rows_per_thread(1, 8000), 60_000);
        let explicit = MatrixConfig {
            rows_per_thread: Some(1000),
            ..MatrixConfig::default()
        };
        assert_eq!(explicit.rows_per_thread(300, 100), 1000);
        assert_eq!(explicit.rows_per_thread(100, 8000), 600);
    }

    #[test]
    fn judged_threads_fall_back_to_the_largest() {
        assert_eq!(MatrixConfig::default().judged_threads(), vec![100, 300]);
        let small = MatrixConfig {
            threads: vec![1, 4],
            ..MatrixConfig::default()
        };
        assert_eq!(small.judged_threads(), vec![4]);
    }
}
