//! Human-readable output: comfy-table tables of the benchmark reports.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};

use super::insert::InsertReport;

/// A table with the house style; columns after the first `left` are right-aligned.
pub fn table(header: &[&str], left: usize) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    for index in left..header.len() {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// `1234567` as `1,234,567`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A float with at most three significant decimals, small values keeping their first digits.
pub fn number(value: f64) -> String {
    if value == 0.0 {
        "0".to_owned()
    } else if value.abs() >= 1000.0 {
        thousands(value.round() as u64)
    } else if value.abs() >= 100.0 {
        format!("{value:.1}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else if value.abs() >= 0.001 {
        format!("{value:.3}")
    } else {
        format!("{value:.2e}")
    }
}

/// The machine as a report's first line names it: "2 CPUs (model)".
pub fn machine(cpus: usize, cpu_model: Option<&str>) -> String {
    match cpu_model {
        Some(model) => format!("{cpus} CPUs ({model})"),
        None => format!("{cpus} CPUs"),
    }
}

/// The closing line of a multi-run report: total time, and how busy the rest of the machine
/// was meanwhile (wall-clock rates on a busy 2-core machine are noise).
pub fn run_footer(elapsed_sec: f64, other_cpu_load_percent: Option<f64>) -> String {
    let mut line = format!("total time {elapsed_sec:.1} s");
    if let Some(load) = other_cpu_load_percent {
        line.push_str(&format!(
            "; other processes used about {load:.0}% of the machine's CPU meanwhile{}",
            if load >= 10.0 {
                " (a busy machine: wall-clock rates are noisy)"
            } else {
                ""
            }
        ));
    }
    line.push('\n');
    line
}

/// The tables of one `bench insert` run.
pub fn insert_report(report: &InsertReport) -> String {
    let config = &report.config;
    let mut out = format!(
        "bench insert: {} threads x {} rows, key {}, remedy {} (clustered PK on {}{}{}), {}, latch {}, insert path {}{}{}\n",
        config.threads,
        thousands(config.rows_per_thread),
        config.key.name(),
        config.remedy.name(),
        config.clustered_key,
        if config.partitions > 1 {
            format!(", {} partitions", config.partitions)
        } else {
            String::new()
        },
        config
            .nonclustered_indexes
            .iter()
            .map(|index| format!("; {index}"))
            .collect::<String>(),
        config.payload_column,
        config.latch,
        config.insert_path,
        if config.optimize_for_sequential_key {
            ", OPTIMIZE_FOR_SEQUENTIAL_KEY = ON"
        } else {
            ""
        },
        if config.warmup_rows > 0 {
            format!(", {} warm-up rows", thousands(config.warmup_rows))
        } else {
            String::new()
        }
    );
    if config.rows_per_statement > 1 {
        out.push_str(&format!(
            "{}-row statements (insert_batch_values): latencies are per statement\n",
            config.rows_per_statement
        ));
    }
    if let (Some(db), Some(durability)) = (&config.db, config.durability) {
        out.push_str(&format!(
            "durable database in {db}, durability {}: {} commits per fdatasync, WRITELOG {} µs \
             per commit, {} of the WRITELOG waits spent yielding instead of parked\n",
            durability.name(),
            report
                .commits_per_fsync
                .map_or_else(|| "-".to_owned(), number),
            number(report.log.writelog_wait_us_per_commit),
            report
                .log
                .wal
                .map_or_else(|| "-".to_owned(), |wal| number(wal.yielding_waits as f64)),
        ));
    }
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }

    if let Some(load) = report.other_cpu_load_percent.filter(|load| *load >= 10.0) {
        out.push_str(&format!(
            "warning: other processes used about {load:.0}% of the machine's CPU during the run; \
             wall-clock numbers are inflated\n"
        ));
    }
    let mut throughput = table(
        &[
            "rows",
            "elapsed s",
            "rows/s",
            if report.latency_unit == "statement" {
                "p50 µs/stmt"
            } else {
                "p50 µs"
            },
            if report.latency_unit == "statement" {
                "p99 µs/stmt"
            } else {
                "p99 µs"
            },
            if report.latency_unit == "statement" {
                "max µs/stmt"
            } else {
                "max µs"
            },
            "ctx switches/row",
            "CPU s",
        ],
        0,
    );
    throughput.add_row(vec![
        thousands(report.rows),
        format!("{:.3}", report.elapsed_sec),
        thousands(report.rows_per_sec as u64),
        number(report.latency_us.p50),
        number(report.latency_us.p99),
        number(report.latency_us.max),
        number(report.context_switches_per_row),
        format!("{:.3}", report.cpu_sec),
    ]);
    out.push_str(&format!("{throughput}\n"));

    let mut waits = table(
        &[
            "wait type",
            "waiting_tasks_count",
            "wait_time_ms",
            "max_wait_time_ms",
            "signal_wait_time_ms",
            "waits/row",
        ],
        1,
    );
    for (name, wait) in &report.waits {
        waits.add_row(vec![
            (*name).to_owned(),
            thousands(wait.waiting_tasks_count),
            number(wait.wait_time_ms),
            number(wait.max_wait_time_ms),
            number(wait.signal_wait_time_ms),
            number(report.waits_per_row.get(name).copied().unwrap_or(0.0)),
        ]);
    }
    out.push_str(&format!("{waits}\n"));
    let attribution = &report.session_attribution;
    out.push_str(&format!(
        "PAGELATCH_EX: {} waits / {} ms globally, {} waits / {} ms summed over the {} sessions\n",
        thousands(attribution.pagelatch_ex_global),
        number(attribution.pagelatch_ex_wait_time_ms_global),
        thousands(attribution.pagelatch_ex_sessions),
        number(attribution.pagelatch_ex_wait_time_ms_sessions),
        config.threads,
    ));
    let mut latches = table(
        &[
            "latch class",
            "waiting_requests_count",
            "wait_time_ms",
            "max_wait_time_ms",
        ],
        1,
    );
    let mut any_latch = false;
    for (name, latch) in &report.latch_stats {
        if latch.waiting_requests_count > 0 {
            any_latch = true;
            latches.add_row(vec![
                (*name).to_owned(),
                thousands(latch.waiting_requests_count),
                number(latch.wait_time_ms),
                number(latch.max_wait_time_ms),
            ]);
        }
    }
    if any_latch {
        out.push_str(&format!("{latches}\n"));
    } else {
        out.push_str("latch stats: no latch waits\n");
    }

    let optional = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), thousands);
    let mut shape = table(
        &[
            "index",
            "rows",
            "leaf pages",
            "inner pages",
            "levels",
            "leaf fill",
            "leaf splits",
            "leaf appends",
            "inner splits",
            "split restarts",
            "integrity",
        ],
        1,
    );
    let indexes = if report.indexes.is_empty() {
        std::slice::from_ref(&report.tree)
    } else {
        report.indexes.as_slice()
    };
    for tree in indexes {
        shape.add_row(vec![
            if tree.partitions > 1 {
                format!("{} ({} partitions)", tree.index, tree.partitions)
            } else {
                tree.index.clone()
            },
            optional(tree.rows),
            optional(tree.leaf_pages),
            optional(tree.inner_pages),
            tree.levels
                .map_or_else(|| "-".to_owned(), |levels| levels.to_string()),
            tree.leaf_fill
                .map_or_else(|| "-".to_owned(), |fill| format!("{:.1}%", fill * 100.0)),
            thousands(tree.leaf_splits),
            thousands(tree.leaf_appends),
            thousands(tree.inner_splits),
            thousands(tree.split_restarts),
            report.integrity.clone(),
        ]);
    }
    out.push_str(&format!("{shape}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(12345.6), "12,346");
        assert_eq!(number(0.5), "0.500");
        assert_eq!(number(2.345), "2.35");
    }
}
