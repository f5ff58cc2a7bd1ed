//! End-to-end tests of the `lastpage` binary.

use std::process::{Command, Output};

use serde_json::Value;

fn lastpage(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lastpage"))
        .args(args)
        .output()
        .expect("the lastpage binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `bench insert <args> --json` and returns the parsed report, asserting success.
fn insert_json(args: &[&str]) -> Value {
    let mut all = vec!["bench", "insert"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = lastpage(&all);
    assert!(
        output.status.success(),
        "{all:?} failed: {}\nstdout: {}",
        text(&output.stderr),
        text(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{all:?} printed no JSON ({error}): {}",
            text(&output.stdout)
        )
    })
}

fn assert_wait_fields(report: &Value, wait: &str) {
    let entry = &report["waits"][wait];
    for field in [
        "waiting_tasks_count",
        "wait_time_ms",
        "max_wait_time_ms",
        "signal_wait_time_ms",
    ] {
        assert!(
            entry[field].is_number(),
            "waits.{wait}.{field} missing in {report}"
        );
    }
}

#[test]
fn every_key_and_latch_reports_the_required_fields() {
    for key in ["ascending", "random", "mod16"] {
        for latch in ["fifo", "adaptive"] {
            let report = insert_json(&[
                "--threads",
                "4",
                "--rows-per-thread",
                "200",
                "--key",
                key,
                "--latch",
                latch,
            ]);
            let context = format!("key {key}, latch {latch}: {report}");
            assert_eq!(report["rows"], 800, "{context}");
            assert!(
                report["rows_per_sec"]
                    .as_f64()
                    .is_some_and(|rate| rate > 0.0),
                "{context}"
            );
            for percentile in ["p50", "p99", "max"] {
                assert!(report["latency_us"][percentile].is_number(), "{context}");
            }
            let p50 = report["latency_us"]["p50"].as_f64().unwrap_or(-1.0);
            let max = report["latency_us"]["max"].as_f64().unwrap_or(-1.0);
            assert!(p50 > 0.0 && p50 <= max, "{context}");
            for wait in ["PAGELATCH_EX", "PAGELATCH_SH", "PAGELATCH_UP"] {
                assert_wait_fields(&report, wait);
            }
            let waits = report["waits"].as_object().expect("waits is an object");
            for (name, entry) in waits {
                assert_wait_fields(&report, name);
                if !name.starts_with("PAGELATCH_") {
                    assert!(
                        entry["waiting_tasks_count"].as_u64().unwrap_or(0) > 0,
                        "{context}"
                    );
                }
            }
            assert_eq!(report["integrity"], "ok", "{context}");
            assert_eq!(report["config"]["key"], key, "{context}");
            assert_eq!(report["config"]["latch"], latch, "{context}");
            assert_eq!(report["tree"]["rows"], 800, "{context}");
        }
    }
}

#[test]
fn page_sized_rows_and_warm_up_keep_the_table_whole() {
    let report = insert_json(&[
        "--threads",
        "4",
        "--rows-per-thread",
        "50",
        "--row-bytes",
        "8000",
        "--warmup-rows",
        "20",
    ]);
    assert_eq!(report["rows"], 200);
    assert_eq!(report["integrity"], "ok");
    assert_eq!(report["config"]["payload_column"], "Payload CHAR(8000)");
    // CHAR(8000): one row per page, so every row is its own leaf.
    assert_eq!(report["tree"]["leaf_pages"], 220);
}

#[test]
fn bad_flags_fail_cleanly() {
    let cases: &[(&[&str], &str)] = &[
        (&["--key", "sideways"], "sideways"),
        (&["--threads", "0"], "--threads"),
        (&["--row-bytes", "9000"], "--row-bytes"),
        (&["--row-bytes", "0"], "--row-bytes"),
        (&["--rows-per-thread", "0"], "--rows-per-thread"),
        (&["--latch", "sometimes"], "--latch"),
        (&["--threads", "many"], "--threads"),
        (
            &["--threads", "4096", "--rows-per-thread", "1000000"],
            "IDENTITY",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["bench", "insert"];
        all.extend_from_slice(args);
        let output = lastpage(&all);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{all:?}: stderr should mention {expected}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{all:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{all:?} printed to stdout");
    }
    let output = lastpage(&["bench", "insert-compare", "--repeat", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(!text(&output.stderr).contains("panicked"));
}

#[test]
fn fair_latches_convoy_on_the_last_page() {
    // Whether a convoy forms depends on the scheduler: if the threads happen to run one after
    // another (a short loop never preempted), nobody waits. 64 threads x 1000 rows convoyed in
    // every trial on 2 cores; up to three attempts keep a rare unlucky schedule from failing.
    let mut last = Value::Null;
    for _attempt in 0..3 {
        let report = insert_json(&[
            "--latch",
            "fifo",
            "--threads",
            "64",
            "--key",
            "ascending",
            "--rows-per-thread",
            "1000",
        ]);
        assert_eq!(report["rows"], 64 * 1000);
        assert_eq!(report["integrity"], "ok");
        let global = report["waits"]["PAGELATCH_EX"]["waiting_tasks_count"]
            .as_u64()
            .unwrap_or(0);
        // Every wait happens inside some session's insert, so attribution adds up exactly.
        assert_eq!(
            report["session_attribution"]["pagelatch_ex_sessions"].as_u64(),
            Some(global),
            "{report}"
        );
        if global > 0 {
            assert!(
                report["context_switches_per_row"]
                    .as_f64()
                    .is_some_and(|switches| switches > 0.0),
                "{report}"
            );
            return;
        }
        last = report;
    }
    panic!("no PAGELATCH_EX waits in three runs: {last}");
}

#[test]
fn human_output_has_the_tables() {
    let output = lastpage(&[
        "bench",
        "insert",
        "--threads",
        "3",
        "--rows-per-thread",
        "100",
        "--key",
        "mod16",
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    for expected in [
        "3 threads x 100 rows",
        "key mod16",
        "rows/s",
        "PAGELATCH_EX",
        "leaf pages",
        "ok",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn compare_covers_every_cell() {
    let output = lastpage(&[
        "bench",
        "insert-compare",
        "--rows-per-thread",
        "2",
        "--repeat",
        "1",
        "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("compare prints JSON");
    let cells = report["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 2 * 2 * 4);
    for cell in cells {
        assert!(
            cell["ratio_ascending_to_random"]
                .as_f64()
                .is_some_and(|ratio| ratio > 0.0),
            "{cell}"
        );
        assert_eq!(cell["ascending"]["integrity"], "ok", "{cell}");
        assert_eq!(cell["random"]["integrity"], "ok", "{cell}");
        assert_eq!(
            cell["rows"].as_u64(),
            Some(2 * cell["threads"].as_u64().unwrap_or(0)),
            "{cell}"
        );
    }
}
