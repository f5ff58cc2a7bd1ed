//! `bench insert-compare`: ascending against random clustered keys, in one process.
//!
//! For every cell (row size x latch flavour x thread count) the two keys run alternately
//! (ascending, random, ascending, random, ...) `repeat` times each, so that drift in the
//! machine (other load, memory state) hits both keys alike; the table shows each key's median.
//! Every run uses the classic insert path and no remedy, as this comparison always has (it is
//! about the latch flavours); `bench insert-matrix` covers the paths and the remedies.

use std::time::Instant;

use lastpage_engine::{InsertPath, LatchPolicy, WaitType};
use serde::Serialize;

use super::insert::{
    BenchError, InsertConfig, InsertReport, KeyKind, MAX_VARCHAR_ROW_BYTES, Remedy,
    run_insert_bench,
};
use super::render::{number, table, thousands};
use crate::sys;

/// Thread counts compared.
pub const THREADS: [u32; 4] = [1, 2, 100, 300];

/// Row sizes compared: the seeds' VARCHAR(100) and CHAR(8000) tables.
pub const ROW_BYTES: [u16; 2] = [100, 8000];

/// Default rows per cell (per run) for small rows.
pub const DEFAULT_SMALL_ROWS_PER_CELL: u64 = 60_000;

/// Default floor of rows per thread for small rows. A convoy only forms if the threads run at
/// the same time; a thread that inserts a few hundred 100-byte rows finishes inside one
/// scheduler time slice, so with 300 threads x 200 rows on 2 cores 2 of 5 runs had no
/// PAGELATCH_EX wait at all (about 1.2M rows/s) and 3 of 5 convoyed (about 20k-45k rows/s).
/// From 600 rows per thread up every run convoyed.
pub const MIN_SMALL_ROWS_PER_THREAD: u64 = 1_000;

/// Default, and cap, of rows per cell (per run) for page-sized rows: each takes an 8 KiB page.
pub const MAX_LARGE_ROWS_PER_CELL: u64 = 30_000;

/// What to compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareConfig {
    /// Rows per thread in every cell; `None` for the defaults.
    pub rows_per_thread: Option<u64>,
    /// Runs of each key per cell.
    pub repeat: u32,
}

impl CompareConfig {
    /// Rows per thread for one cell.
    pub fn rows_per_thread(&self, threads: u32, row_bytes: u16) -> u64 {
        let threads = u64::from(threads.max(1));
        let large = row_bytes > MAX_VARCHAR_ROW_BYTES;
        let per_thread = match self.rows_per_thread {
            Some(rows) if large => rows.min(MAX_LARGE_ROWS_PER_CELL / threads),
            Some(rows) => rows,
            None if large => MAX_LARGE_ROWS_PER_CELL / threads,
            None => (DEFAULT_SMALL_ROWS_PER_CELL / threads).max(MIN_SMALL_ROWS_PER_THREAD),
        };
        per_thread.max(1)
    }
}

/// One key's runs in one cell.
#[derive(Clone, Debug, Serialize)]
pub struct KeySummary {
    /// Median rows per second.
    pub rows_per_sec: f64,
    /// Every run's rows per second, in run order.
    pub rows_per_sec_runs: Vec<f64>,
    /// Median PAGELATCH_EX waits per row.
    pub pagelatch_ex_waits_per_row: f64,
    /// Median PAGELATCH_SH waits per row.
    pub pagelatch_sh_waits_per_row: f64,
    /// Runs without a single PAGELATCH_EX wait (no convoy formed).
    pub runs_without_pagelatch_ex: usize,
    /// Median context switches (of the inserting threads) per row.
    pub context_switches_per_row: f64,
    /// Median of the runs' p99 insert latency, microseconds.
    pub p99_us: f64,
    /// `"ok"` if every run's integrity check passed, else the first failure.
    pub integrity: String,
}

impl KeySummary {
    fn from_runs(runs: &[InsertReport]) -> KeySummary {
        let median_of = |value: fn(&InsertReport) -> f64| median(runs.iter().map(value).collect());
        KeySummary {
            rows_per_sec: median_of(|run| run.rows_per_sec),
            rows_per_sec_runs: runs.iter().map(|run| run.rows_per_sec).collect(),
            pagelatch_ex_waits_per_row: median_of(|run| {
                run.waits_per_row_of(WaitType::PageLatchEx)
            }),
            pagelatch_sh_waits_per_row: median_of(|run| {
                run.waits_per_row_of(WaitType::PageLatchSh)
            }),
            runs_without_pagelatch_ex: runs
                .iter()
                .filter(|run| run.waits_per_row_of(WaitType::PageLatchEx) == 0.0)
                .count(),
            context_switches_per_row: median_of(|run| run.context_switches_per_row),
            p99_us: median_of(|run| run.latency_us.p99),
            integrity: runs
                .iter()
                .map(|run| &run.integrity)
                .find(|integrity| integrity.as_str() != "ok")
                .cloned()
                .unwrap_or_else(|| "ok".to_owned()),
        }
    }

    /// `(max - min) / median` of rows per second.
    pub fn spread(&self) -> f64 {
        let max = self
            .rows_per_sec_runs
            .iter()
            .copied()
            .fold(f64::MIN, f64::max);
        let min = self
            .rows_per_sec_runs
            .iter()
            .copied()
            .fold(f64::MAX, f64::min);
        if self.rows_per_sec > 0.0 {
            (max - min) / self.rows_per_sec
        } else {
            0.0
        }
    }
}

/// One cell of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareCell {
    /// Payload bytes per row.
    pub row_bytes: u16,
    /// Latch flavour.
    pub latch: &'static str,
    /// Sessions.
    pub threads: u32,
    /// Rows per session.
    pub rows_per_thread: u64,
    /// Rows per run.
    pub rows: u64,
    /// The ascending key (clustered PK on the IDENTITY column).
    pub ascending: KeySummary,
    /// The random key (clustered PK on a NEWID() uniqueidentifier).
    pub random: KeySummary,
    /// Median rows/s of ascending divided by that of random (below 1: ascending is slower).
    pub ratio_ascending_to_random: f64,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    /// Runs of each key per cell.
    pub repeat: u32,
    /// `--rows-per-thread`, if given.
    pub rows_per_thread: Option<u64>,
    /// Processors the machine reports.
    pub cpus: usize,
    /// Wall time of the whole comparison.
    pub elapsed_sec: f64,
    /// Share of the machine's CPU capacity other processes used during the comparison.
    pub other_cpu_load_percent: Option<f64>,
    /// Every cell, in run order.
    pub cells: Vec<CompareCell>,
}

impl CompareReport {
    /// Whether every run passed its integrity check.
    pub fn all_ok(&self) -> bool {
        self.cells
            .iter()
            .all(|cell| cell.ascending.integrity == "ok" && cell.random.integrity == "ok")
    }
}

/// The median (the mean of the middle two for an even count); 0 for no values.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// Runs the comparison, reporting each cell on stderr as it finishes.
pub fn run_compare(config: &CompareConfig) -> Result<CompareReport, BenchError> {
    if config.repeat == 0 {
        return Err(BenchError::InvalidConfig(
            "--repeat must be at least 1".into(),
        ));
    }
    let started = Instant::now();
    let cpu_load = sys::LoadProbe::start();
    let cell_count = ROW_BYTES.len() * LatchPolicy::ALL.len() * THREADS.len();
    // Validate every cell before running any, so a bad --rows-per-thread fails at once.
    for row_bytes in ROW_BYTES {
        for threads in THREADS {
            cell_config(
                config,
                row_bytes,
                LatchPolicy::Fifo,
                threads,
                KeyKind::Random,
            )
            .validate()?;
        }
    }
    let mut cells = Vec::with_capacity(cell_count);
    for row_bytes in ROW_BYTES {
        for latch in LatchPolicy::ALL {
            for threads in THREADS {
                let cell_started = Instant::now();
                let mut ascending = Vec::new();
                let mut random = Vec::new();
                for _ in 0..config.repeat {
                    ascending.push(run_insert_bench(&cell_config(
                        config,
                        row_bytes,
                        latch,
                        threads,
                        KeyKind::Ascending,
                    ))?);
                    random.push(run_insert_bench(&cell_config(
                        config,
                        row_bytes,
                        latch,
                        threads,
                        KeyKind::Random,
                    ))?);
                }
                let rows_per_thread = config.rows_per_thread(threads, row_bytes);
                let ascending = KeySummary::from_runs(&ascending);
                let random = KeySummary::from_runs(&random);
                let ratio = if random.rows_per_sec > 0.0 {
                    ascending.rows_per_sec / random.rows_per_sec
                } else {
                    0.0
                };
                eprintln!(
                    "[{:>2}/{cell_count}] {row_bytes:>4} B, {:<8}, {threads:>3} threads: ascending {:>9} rows/s, random {:>9} rows/s, ratio {ratio:.2} ({:.1} s)",
                    cells.len() + 1,
                    latch.name(),
                    thousands(ascending.rows_per_sec as u64),
                    thousands(random.rows_per_sec as u64),
                    cell_started.elapsed().as_secs_f64(),
                );
                cells.push(CompareCell {
                    row_bytes,
                    latch: latch.name(),
                    threads,
                    rows_per_thread,
                    rows: rows_per_thread * u64::from(threads),
                    ascending,
                    random,
                    ratio_ascending_to_random: (ratio * 1000.0).round() / 1000.0,
                });
            }
        }
    }
    let (_, other_cpu_load_percent) = cpu_load.finish();
    Ok(CompareReport {
        other_cpu_load_percent,
        repeat: config.repeat,
        rows_per_thread: config.rows_per_thread,
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        elapsed_sec: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        cells,
    })
}

fn cell_config(
    config: &CompareConfig,
    row_bytes: u16,
    latch: LatchPolicy,
    threads: u32,
    key: KeyKind,
) -> InsertConfig {
    InsertConfig {
        threads,
        rows_per_thread: config.rows_per_thread(threads, row_bytes),
        key,
        row_bytes,
        latch,
        insert_path: InsertPath::Classic,
        remedy: Remedy::None,
        warmup_rows: 0,
        ..InsertConfig::default()
    }
}

/// The comparison as a table.
pub fn render(report: &CompareReport) -> String {
    let mut out = format!(
        "bench insert-compare: ascending vs random clustered key, single-row inserts, classic insert path, median of {} interleaved run(s) per key, {} CPU(s)\n",
        report.repeat, report.cpus
    );
    let mut grid = table(
        &[
            "row bytes",
            "latch",
            "threads",
            "rows/run",
            "asc rows/s",
            "rand rows/s",
            "asc ÷ rand",
            "asc waits/row EX / SH",
            "rand waits/row EX / SH",
            "asc cs/row",
            "rand cs/row",
            "spread asc / rand",
        ],
        2,
    );
    for cell in &report.cells {
        grid.add_row(vec![
            cell.row_bytes.to_string(),
            cell.latch.to_owned(),
            cell.threads.to_string(),
            thousands(cell.rows),
            thousands(cell.ascending.rows_per_sec as u64),
            thousands(cell.random.rows_per_sec as u64),
            format!("{:.2}", cell.ratio_ascending_to_random),
            format!(
                "{} / {}",
                number(cell.ascending.pagelatch_ex_waits_per_row),
                number(cell.ascending.pagelatch_sh_waits_per_row)
            ),
            format!(
                "{} / {}",
                number(cell.random.pagelatch_ex_waits_per_row),
                number(cell.random.pagelatch_sh_waits_per_row)
            ),
            number(cell.ascending.context_switches_per_row),
            number(cell.random.context_switches_per_row),
            format!(
                "{:.0}% / {:.0}%",
                cell.ascending.spread() * 100.0,
                cell.random.spread() * 100.0
            ),
        ]);
    }
    out.push_str(&format!("{grid}\n"));
    out.push_str(
        "asc ÷ rand below 1: the ascending key is slower. waits/row = PAGELATCH_EX / PAGELATCH_SH waiting_tasks_count \
         per row; cs = voluntary + involuntary context switches of the inserting threads (getrusage RUSAGE_THREAD); \
         spread = (max - min) / median rows/s over the runs. All columns except spread are medians.\n",
    );
    for cell in &report.cells {
        let summary = &cell.ascending;
        if cell.threads >= 100 && summary.runs_without_pagelatch_ex > 0 {
            out.push_str(&format!(
                "note: {} B, {}, {} threads: {} of {} ascending run(s) had no PAGELATCH_EX wait at all \
                 (the threads ran one after another; no convoy formed); runs: {} rows/s\n",
                cell.row_bytes,
                cell.latch,
                cell.threads,
                summary.runs_without_pagelatch_ex,
                summary.rows_per_sec_runs.len(),
                summary
                    .rows_per_sec_runs
                    .iter()
                    .map(|rate| thousands(*rate as u64))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    for cell in &report.cells {
        for (key, summary) in [("ascending", &cell.ascending), ("random", &cell.random)] {
            if summary.integrity != "ok" {
                out.push_str(&format!(
                    "INTEGRITY FAILURE: {} B, {}, {} threads, {key}: {}\n",
                    cell.row_bytes, cell.latch, cell.threads, summary.integrity
                ));
            }
        }
    }
    out.push_str(&super::render::run_footer(
        report.elapsed_sec,
        report.other_cpu_load_percent,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_stay_within_their_row_budgets() {
        let defaults = CompareConfig {
            rows_per_thread: None,
            repeat: 1,
        };
        assert_eq!(defaults.rows_per_thread(1, 100), 60_000);
        assert_eq!(defaults.rows_per_thread(2, 100), 30_000);
        assert_eq!(defaults.rows_per_thread(100, 100), 1000);
        assert_eq!(defaults.rows_per_thread(300, 100), 1000);
        assert_eq!(defaults.rows_per_thread(300, 8000), 100);
        let explicit = CompareConfig {
            rows_per_thread: Some(1000),
            repeat: 1,
        };
        assert_eq!(explicit.rows_per_thread(300, 100), 1000);
        assert_eq!(explicit.rows_per_thread(100, 8000), 300);
        assert_eq!(explicit.rows_per_thread(1, 8000), 1000);
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
