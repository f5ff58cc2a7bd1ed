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

/// Runs `bench insert <args> --json` up to `attempts` times and returns the first report in
/// which `waited` (which also asserts what every run must show) finds the waits the test looks
/// for. Whether such a wait forms at all depends on the scheduler, so one run without it proves
/// nothing. Panics with `none` and the last report if no run waited.
fn insert_json_until_waits(
    attempts: usize,
    args: &[&str],
    waited: impl Fn(&Value) -> bool,
    none: &str,
) -> Value {
    let mut last = Value::Null;
    for _attempt in 0..attempts {
        let report = insert_json(args);
        if waited(&report) {
            return report;
        }
        last = report;
    }
    panic!("{none}: {last}");
}

/// Runs `lastpage <args>` and asserts that it failed as a usage error should: exit code 2, a
/// message on stderr that names `expected`, no panic and nothing on stdout.
fn assert_usage_error(args: &[&str], expected: &str) {
    let output = lastpage(args);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(expected),
        "{args:?}: stderr should mention {expected}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
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
            // Wait types listed even at zero: the page latches and the log's and locks' waits.
            let always = [
                "PAGELATCH_EX",
                "PAGELATCH_SH",
                "PAGELATCH_UP",
                "WRITELOG",
                "LOGBUFFER",
                "LCK_M_S",
                "LCK_M_X",
            ];
            for (name, entry) in waits {
                assert_wait_fields(&report, name);
                if !always.contains(&name.as_str()) {
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
        assert_usage_error(&all, expected);
    }
    let output = lastpage(&["bench", "insert-compare", "--repeat", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(!text(&output.stderr).contains("panicked"));
}

#[test]
fn fair_latches_convoy_on_the_last_page() {
    // Whether a convoy forms depends on the scheduler: if the threads happen to run one after
    // another (a short loop never preempted), nobody waits. A thread's 1,000 rows took about
    // half a millisecond, less than a time slice: on a loaded machine, where the threads got
    // about one processor between them, all three attempts of 64 x 1000 rows once saw no
    // wait (1 run of 20 of this binary beside other tests and a CPU hog), and pinned to one
    // processor 7 runs of 12 saw none. With 5,000 rows a thread outlasts its time slice, so
    // it is preempted, sometimes holding the last page's latch: pinned to one processor,
    // each of 12 runs saw 50 to 104 waits. Up to three attempts stay for a rare schedule.
    let report = insert_json_until_waits(
        3,
        &[
            "--latch",
            "fifo",
            "--threads",
            "64",
            "--key",
            "ascending",
            "--rows-per-thread",
            "5000",
        ],
        |report| {
            assert_eq!(report["rows"], 64 * 5000);
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
            global > 0
        },
        "no PAGELATCH_EX waits in three runs",
    );
    assert!(
        report["context_switches_per_row"]
            .as_f64()
            .is_some_and(|switches| switches > 0.0),
        "{report}"
    );
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

#[test]
fn every_remedy_on_every_path_keeps_the_table_whole() {
    for remedy in ["none", "ofsk", "nonseq", "mod16", "partition16", "batch100"] {
        for path in ["classic", "default"] {
            let report = insert_json(&[
                "--threads",
                "4",
                "--rows-per-thread",
                "200",
                "--remedy",
                remedy,
                "--path",
                path,
            ]);
            let context = format!("remedy {remedy}, path {path}: {report}");
            assert_eq!(report["rows"], 800, "{context}");
            assert_eq!(report["integrity"], "ok", "{context}");
            assert_eq!(report["config"]["remedy"], remedy, "{context}");
            assert_eq!(report["config"]["insert_path"], path, "{context}");
            assert_eq!(report["config"]["latch"], "adaptive", "{context}");
            assert_eq!(report["tree"]["rows"], 800, "{context}");
            assert!(
                report["rows_per_sec"]
                    .as_f64()
                    .is_some_and(|rate| rate > 0.0),
                "{context}"
            );
            let indexes = report["indexes"].as_array().expect("indexes");
            for index in indexes {
                assert_eq!(index["rows"], 800, "{context}");
            }
            match remedy {
                "nonseq" => {
                    assert_eq!(report["config"]["clustered_key"], "RowGuid", "{context}");
                    assert_eq!(indexes.len(), 2, "{context}");
                }
                "mod16" => {
                    assert_eq!(report["config"]["clustered_key"], "ModValue, InsertID");
                }
                "partition16" => {
                    assert_eq!(report["config"]["partitions"], 16, "{context}");
                    assert_eq!(report["tree"]["partitions"], 16, "{context}");
                }
                "batch100" => {
                    assert_eq!(report["latency_unit"], "statement", "{context}");
                    assert_eq!(report["config"]["rows_per_statement"], 100, "{context}");
                }
                "ofsk" => {
                    assert_eq!(report["config"]["optimize_for_sequential_key"], true);
                }
                _ => assert_eq!(report["latency_unit"], "row", "{context}"),
            }
        }
    }
}

#[test]
fn random_key_combines_with_remedies() {
    for remedy in ["nonseq", "mod16", "partition16"] {
        let report = insert_json(&[
            "--threads",
            "3",
            "--rows-per-thread",
            "100",
            "--key",
            "random",
            "--remedy",
            remedy,
            "--latch",
            "fifo",
        ]);
        assert_eq!(report["integrity"], "ok", "{remedy}: {report}");
        assert_eq!(report["rows"], 300, "{remedy}: {report}");
    }
    // --key mod16 keeps meaning --key ascending --remedy mod16, and may add partitioning.
    let report = insert_json(&[
        "--threads",
        "2",
        "--rows-per-thread",
        "100",
        "--key",
        "mod16",
        "--remedy",
        "partition16",
    ]);
    assert_eq!(report["config"]["remedy"], "partition16");
    assert_eq!(report["config"]["clustered_key"], "ModValue, InsertID");
    assert_eq!(report["integrity"], "ok");
}

#[test]
fn flow_control_waits_show_up_with_ofsk() {
    // 32 sessions on a flow control that admits one per CPU: unless the sessions run one after
    // another, some of them wait at the index's entrance. Up to five attempts of 2,000 rows
    // each (500 rows took 7 ms, and on a machine busy with other work three such runs once
    // went by without a wait).
    let report = insert_json_until_waits(
        5,
        &[
            "--threads",
            "32",
            "--rows-per-thread",
            "2000",
            "--remedy",
            "ofsk",
        ],
        |report| {
            assert_eq!(report["integrity"], "ok", "{report}");
            let flow = report["waits"]["BTREE_INSERT_FLOW_CONTROL"]["waiting_tasks_count"]
                .as_u64()
                .unwrap_or(0);
            flow > 0
        },
        "no BTREE_INSERT_FLOW_CONTROL waits in five runs",
    );
    assert!(report["waits_per_row"]["BTREE_INSERT_FLOW_CONTROL"].as_f64() > Some(0.0));
}

#[test]
fn batch100_rounds_rows_up_to_whole_statements() {
    let args = [
        "bench",
        "insert",
        "--threads",
        "3",
        "--rows-per-thread",
        "150",
        "--remedy",
        "batch100",
        "--json",
    ];
    let output = lastpage(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("rounded up to 200"),
        "{}",
        text(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["rows"], 600, "{report}");
    assert_eq!(report["config"]["rows_per_thread"], 200);
    assert_eq!(report["config"]["requested_rows_per_thread"], 150);
    assert_eq!(report["latency_unit"], "statement");
    assert_eq!(report["integrity"], "ok");
    assert!(
        report["notes"][0]
            .as_str()
            .is_some_and(|note| note.contains("rounded up to 200"))
    );
    let human = lastpage(&args[..args.len() - 1]);
    assert!(human.status.success());
    let stdout = text(&human.stdout);
    assert!(stdout.contains("rounded up to 200"), "{stdout}");
    assert!(stdout.contains("per statement"), "{stdout}");
}

#[test]
fn matrix_covers_every_cell_and_judges() {
    let output = lastpage(&[
        "bench",
        "insert-matrix",
        "--threads",
        "1,4",
        "--row-bytes",
        "100",
        "--rows-per-thread",
        "200",
        "--repeat",
        "2",
        "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("the matrix prints JSON");
    assert_eq!(report["repeat"], 2);
    let cells = report["cells"].as_array().expect("cells");
    // 2 thread counts x 3 path+latch configurations x (6 remedies + the random key).
    assert_eq!(cells.len(), 2 * 3 * 7, "{report}");
    for cell in cells {
        assert_eq!(cell["integrity"], "ok", "{cell}");
        assert_eq!(cell["rows_per_sec_runs"].as_array().map(Vec::len), Some(2));
        assert!(cell["ratio_to_baseline"].as_f64() > Some(0.0), "{cell}");
        assert!(cell["ratio_to_random"].as_f64() > Some(0.0), "{cell}");
        for wait in ["PAGELATCH_EX", "PAGELATCH_SH", "BTREE_INSERT_FLOW_CONTROL"] {
            assert!(cell["waits_per_row"][wait].is_number(), "{cell}");
        }
        assert!(cell["leaf_fill"].as_f64() > Some(0.0), "{cell}");
        let expected_unit = if cell["remedy"] == "batch100" {
            "statement"
        } else {
            "row"
        };
        assert_eq!(cell["latency_unit"], expected_unit, "{cell}");
        assert_eq!(
            cell["rows"].as_u64(),
            Some(200 * cell["threads"].as_u64().unwrap_or(0)),
            "{cell}"
        );
    }
    let ideal = report["ideal"].as_array().expect("ideal");
    assert_eq!(ideal.len(), 2);
    for cell in ideal {
        assert_eq!(cell["integrity"], "ok", "{cell}");
        assert!(cell["rows_per_sec"].as_f64() > Some(0.0), "{cell}");
    }
    let summary = &report["summary"];
    assert_eq!(summary["judged_threads"], serde_json::json!([4]));
    let best = &summary["default_ascending_vs_best_remedy"][0];
    assert!(best["ratio"].as_f64() > Some(0.0), "{summary}");
    assert!(best["best_remedy"].as_str().is_some(), "{summary}");
    for figure in [
        "default_adaptive_vs_classic_fifo",
        "default_ascending_vs_ideal_append",
    ] {
        assert!(
            summary[figure][0]["ratio"].as_f64() > Some(0.0),
            "{figure}: {summary}"
        );
    }
    for field in ["cpus", "repeat", "elapsed_sec", "cell_sizes"] {
        assert!(!report[field].is_null(), "{field}: {report}");
    }
}

#[test]
fn matrix_text_is_ready_to_paste() {
    let output = lastpage(&[
        "bench",
        "insert-matrix",
        "--threads",
        "2",
        "--row-bytes",
        "100",
        "--rows-per-thread",
        "100",
        "--repeat",
        "1",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for expected in [
        "CPU(s)",
        "repetitions: 1",
        "total time",
        "ideal append",
        "classic+fifo",
        "default+adaptive",
        "ascending/partition16",
        "random/none",
        "judged figures",
        "best remedy",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn bad_remedy_and_matrix_flags_fail_cleanly() {
    let cases: &[(&[&str], &str)] = &[
        (&["insert", "--remedy", "prayer"], "prayer"),
        (&["insert", "--path", "sideways"], "--path"),
        (
            &["insert", "--key", "mod16", "--remedy", "ofsk"],
            "--key mod16",
        ),
        (
            &["insert", "--key", "mod16", "--remedy", "batch100"],
            "--key mod16",
        ),
        (&["insert-matrix", "--threads", "0"], "--threads"),
        (&["insert-matrix", "--threads", "1,many"], "--threads"),
        (&["insert-matrix", "--row-bytes", "100,9000"], "--row-bytes"),
        (&["insert-matrix", "--repeat", "0"], "--repeat"),
        (
            &["insert-matrix", "--rows-per-thread", "0"],
            "--rows-per-thread",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        assert_usage_error(&all, expected);
    }
}

/// A scratch directory for one test, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("lastpage-cli-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    fn path(&self, child: &str) -> String {
        self.0.join(child).display().to_string()
    }

    /// Asserts that `what` (a bench, which removes its run's files at the end) left nothing here,
    /// and kept the directory itself, which was there before it.
    fn assert_left_empty(&self, what: &str) {
        let left: Vec<_> = std::fs::read_dir(&self.0)
            .unwrap_or_else(|error| panic!("{what} did not keep its --db directory: {error}"))
            .collect();
        assert!(left.is_empty(), "{what} left files behind");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn in_memory_json_has_the_log_fields() {
    let report = insert_json(&["--threads", "2", "--rows-per-thread", "50"]);
    assert!(report["commits_per_fsync"].is_null(), "{report}");
    assert_eq!(report["config"]["storage"], "memory");
    for wait in ["WRITELOG", "LOGBUFFER", "LCK_M_S", "LCK_M_X"] {
        assert_wait_fields(&report, wait);
    }
}

#[test]
fn durable_insert_reports_group_commit() {
    let scratch = Scratch::new("insert");
    for durability in ["full", "delayed", "none"] {
        let db = scratch.path(durability);
        let report = insert_json(&[
            "--threads",
            "4",
            "--rows-per-thread",
            "100",
            "--db",
            &db,
            "--durability",
            durability,
        ]);
        let context = format!("--durability {durability}: {report}");
        assert_eq!(report["rows"], 400, "{context}");
        assert_eq!(report["integrity"], "ok", "{context}");
        assert_eq!(report["config"]["storage"], "durable", "{context}");
        assert_eq!(report["config"]["durability"], durability, "{context}");
        for wait in ["WRITELOG", "LOGBUFFER", "LCK_M_S", "LCK_M_X"] {
            assert_wait_fields(&report, wait);
        }
        if durability == "full" {
            assert!(
                report["commits_per_fsync"]
                    .as_f64()
                    .is_some_and(|value| value >= 1.0),
                "{context}"
            );
        }
    }
}

/// Runs `lastpage bench <bench> --quick --json --db <scratch>`, which must succeed, and returns
/// its output and its JSON report.
fn quick_bench(bench: &str, scratch: &Scratch) -> (Output, Value) {
    quick_bench_in(bench, &scratch.path(""))
}

/// Runs `lastpage bench <bench> --quick --json --db <db>`, as [`quick_bench`] does.
fn quick_bench_in(bench: &str, db: &str) -> (Output, Value) {
    let output = lastpage(&["bench", bench, "--quick", "--json", "--db", db]);
    assert!(
        output.status.success(),
        "bench {bench} failed: {}\nstdout: {}",
        text(&output.stderr),
        text(&output.stdout)
    );
    let report = serde_json::from_slice(&output.stdout).expect("JSON");
    (output, report)
}

#[test]
fn durable_bench_runs_both_engines() {
    let scratch = Scratch::new("durable");
    let (_, report) = quick_bench("durable", &scratch);
    let cells = report["cells"].as_array().expect("cells");
    // --quick: autocommit at 1 and 4 threads, then the batch, each on both engines, and
    // lastpage's pipelined batch.
    assert_eq!(cells.len(), 7, "{report}");
    let workloads: Vec<(&str, &str)> = cells
        .iter()
        .map(|cell| {
            (
                cell["engine"].as_str().unwrap_or("?"),
                cell["workload"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert!(
        workloads.contains(&("lastpage", "pipelined batch")),
        "{workloads:?}"
    );
    assert!(
        report["judged"]["pipelined_batch_rows_per_sec"].is_number(),
        "{report}"
    );
    // The disk is measured before the cells, and so is the park-and-wake ceiling at the
    // judged thread count (--quick: 4), which is divided by SQLite's autocommit rows/s there.
    assert_eq!(report["wakeups"]["threads"], 4, "{report}");
    for (part, figure) in [
        ("disk", "large_append_mb_per_sec"),
        ("disk", "small_append_fsync_p50_us"),
        ("wakeups", "round_trips_per_sec"),
        ("judged", "blocking_ceiling_vs_sqlite"),
    ] {
        assert!(
            report[part][figure]
                .as_f64()
                .is_some_and(|value| value > 0.0),
            "{part}.{figure}: {report}"
        );
    }
    for cell in cells {
        assert_eq!(cell["verified"], "ok", "{cell}");
        assert!(cell["rows"].as_u64().is_some_and(|rows| rows > 0), "{cell}");
        assert!(cell["latency_us"]["p99"].is_number(), "{cell}");
        assert!(
            cell["cpu_us_per_row"].as_f64().is_some_and(|us| us > 0.0),
            "{cell}"
        );
        assert!(cell["context_switches_per_commit"].is_number(), "{cell}");
        // A number where the databases lie on a block device, null on tmpfs.
        assert!(
            cell["disk_bytes_per_row"].is_number() || cell["disk_bytes_per_row"].is_null(),
            "{cell}"
        );
        match cell["engine"].as_str() {
            Some("sqlite") => {
                assert_eq!(cell["commits_per_fsync"], 1.0, "{cell}");
                assert!(cell["log_bytes_per_row"].is_null(), "{cell}");
            }
            Some("lastpage") => {
                // Every row is logged: at least its 100-byte payload.
                assert!(
                    cell["log_bytes_per_row"]
                        .as_f64()
                        .is_some_and(|bytes| bytes >= 100.0),
                    "{cell}"
                );
                assert!(cell["commits_per_fsync"].is_number(), "{cell}");
                assert!(cell["writelog_wait_us_per_commit"].is_number(), "{cell}");
                assert_wait_fields(cell, "WRITELOG");
            }
            other => panic!("unexpected engine {other:?}"),
        }
    }
    assert_eq!(
        report["ratios"].as_array().map(Vec::len),
        Some(4),
        "{report}"
    );
    // The disk's ceiling for the pipelined cell is given exactly when its disk bytes are.
    let pipelined = cells
        .iter()
        .find(|cell| cell["workload"] == "pipelined batch")
        .expect("the pipelined cell");
    assert_eq!(
        report["judged"]["pipelined_batch_disk_ceiling_rows_per_sec"].is_number(),
        pipelined["disk_bytes_per_row"]
            .as_f64()
            .is_some_and(|bytes| bytes > 0.0),
        "{report}"
    );
    // Only the pipelined cell's commits are acknowledged after they return, and it says how
    // long after.
    for cell in cells {
        let acknowledgement = cell["acknowledgement_ms_mean"].as_f64();
        if cell["workload"] == "pipelined batch" {
            assert!(acknowledgement.is_some_and(|ms| ms > 0.0), "{cell}");
        } else {
            assert!(cell["acknowledgement_ms_mean"].is_null(), "{cell}");
        }
    }
    // The run's directory is removed at the end.
    scratch.assert_left_empty("bench durable");
}

/// A run limited by rows counts every pipelined batch: its last batches become durable with
/// the flush at the end of the cell, which its time takes in. They used to be left out, so a
/// cell of 64 batches or fewer reported 0 rows/s.
#[test]
fn durable_bench_counts_every_pipelined_batch_of_a_run_limited_by_rows() {
    let scratch = Scratch::new("durable-rows");
    let output = lastpage(&[
        "bench",
        "durable",
        "--threads",
        "1",
        "--rows",
        "2000",
        "--batch-rows",
        "100",
        "--json",
        "--db",
        &scratch.path(""),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let cells = report["cells"].as_array().expect("cells");
    let pipelined = cells
        .iter()
        .find(|cell| cell["workload"] == "pipelined batch")
        .expect("the pipelined cell");
    assert_eq!(pipelined["rows"], 2000, "{pipelined}");
    let rows_per_sec = pipelined["rows_per_sec"].as_f64().expect("rows_per_sec");
    let elapsed_sec = pipelined["elapsed_sec"].as_f64().expect("elapsed_sec");
    // Every row over the cell's time (both rounded in the report).
    let expected = 2000.0 / elapsed_sec;
    assert!(
        (rows_per_sec - expected).abs() <= expected * 0.01 + 1.0,
        "{rows_per_sec} rows/s, expected {expected}: {pipelined}"
    );
}

#[test]
fn recovery_bench_replays_the_whole_log() {
    let scratch = Scratch::new("recovery");
    let (output, report) = quick_bench("recovery", &scratch);
    let load = &report["load"];
    let recovery = &report["recovery"];
    let verification = &report["verification"];
    assert_eq!(verification["verified"], "ok", "{report}");
    // --quick: 16 MiB of log, written in 1,000-row transactions.
    assert_eq!(report["log_target_bytes"], 16 * 1024 * 1024, "{report}");
    let rows = load["rows"].as_u64().expect("rows");
    let transactions = load["transactions"].as_u64().expect("transactions");
    assert_eq!(rows, transactions * 1000, "{report}");
    assert!(
        load["log_appended_bytes"]
            .as_u64()
            .is_some_and(|bytes| bytes >= 16 * 1024 * 1024),
        "{report}"
    );
    // No checkpoint after the table's creation: recovery replays every transaction.
    assert_eq!(recovery["committed_txns"], transactions, "{report}");
    assert_eq!(recovery["redone_changes"], rows, "{report}");
    assert_eq!(recovery["loser_txns"], 0, "{report}");
    // At least an insert-run record and a commit record per transaction.
    assert!(
        recovery["records"]
            .as_u64()
            .is_some_and(|records| records >= 2 * transactions),
        "{report}"
    );
    for field in [
        "replay_sec",
        "checkpoint_sec",
        "open_sec",
        "replay_mib_per_sec",
        "replay_records_per_sec",
        "replay_row_changes_per_sec",
        "pages_written_during_replay",
    ] {
        assert!(recovery[field].is_number(), "{field}: {report}");
    }
    assert_eq!(verification["row_count"], rows, "{report}");
    assert_eq!(verification["scanned_rows"], rows, "{report}");
    // The progress went to stderr, and the database is removed at the end.
    assert!(
        text(&output.stderr).contains("100%"),
        "{}",
        text(&output.stderr)
    );
    scratch.assert_left_empty("bench recovery");
}

/// A child that fails or dies before the kill fails the crash test: with more than one
/// thread, an insert error used to wait for the other threads (which insert until the kill)
/// and never reached the parent, and a child that aborted looked like one that was killed.
#[test]
fn crash_test_fails_when_its_child_fails_before_the_kill() {
    for (fault, expected) in [
        ("error", "a fault from LASTPAGE_CRASH_CHILD_FAULT"),
        (
            "abort",
            "stopped before it was killed (exit status signal: 6",
        ),
    ] {
        let scratch = Scratch::new(&format!("crash-fault-{fault}"));
        let db = scratch.path("db");
        // The fault comes once thread 0 has inserted 200 rows, tens of milliseconds after
        // the child is ready on an idle machine, but seconds on a busy one whose fdatasync
        // stalls (a kill at 1 to 2 s came first, and the crash test passed). The cycle ends
        // when the child does, so a long kill delay costs nothing.
        let output = Command::new(env!("CARGO_BIN_EXE_lastpage"))
            .args(["crash-test", "--db", &db, "--threads", "4"])
            .args(["--seconds", "60", "--cycles", "1"])
            .env("LASTPAGE_CRASH_CHILD_FAULT", fault)
            .output()
            .expect("the lastpage binary runs");
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{fault}: {stderr}");
        assert!(stderr.contains(expected), "{fault}: {stderr}");
    }
}

#[test]
fn crash_test_loses_nothing() {
    let scratch = Scratch::new("crash");
    let db = scratch.path("db");
    // Small segments and frequent checkpoints, so that truncation and segment recycling run
    // while the child is killed (the defaults are exercised by CI's own crash test).
    let output = lastpage(&[
        "crash-test",
        "--db",
        &db,
        "--threads",
        "4",
        "--seconds",
        "1",
        "--cycles",
        "2",
        "--log-segment-kib",
        "128",
        "--checkpoint-mib",
        "1",
    ]);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "crash-test failed: {}\nstdout: {stdout}",
        text(&output.stderr)
    );
    assert!(stdout.contains("seed="), "the seed is printed: {stdout}");
    assert_eq!(
        stdout
            .lines()
            .filter(|line| line.starts_with("cycle "))
            .count(),
        2,
        "{stdout}"
    );
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("cycles="))
        .unwrap_or_else(|| panic!("no summary line: {stdout}"));
    let fields: std::collections::BTreeMap<&str, u64> = summary
        .split(' ')
        .map(|field| {
            let (name, value) = field
                .split_once('=')
                .unwrap_or_else(|| panic!("bad summary field {field:?}: {summary}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("bad summary value {field:?}: {summary}"));
            (name, value)
        })
        .collect();
    let names: Vec<&str> = fields.keys().copied().collect();
    assert_eq!(
        names,
        ["acked", "cycles", "duplicates", "lost", "reused"],
        "{summary}"
    );
    assert_eq!(fields["cycles"], 2, "{summary}");
    assert!(fields["acked"] > 0, "{summary}");
    assert_eq!(fields["lost"], 0, "{summary}");
    assert_eq!(fields["duplicates"], 0, "{summary}");
    assert_eq!(fields["reused"], 0, "{summary}");
}

#[test]
fn bad_durability_flags_fail_cleanly() {
    let scratch = Scratch::new("flags");
    std::fs::write(scratch.0.join("something"), b"x").expect("write");
    let occupied = scratch.path("");
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "insert", "--durability", "full"], "--db"),
        (
            &["bench", "insert", "--durability", "sometimes", "--db", "x"],
            "--durability",
        ),
        (&["bench", "insert", "--db", &occupied], "not empty"),
        (&["bench", "durable", "--seconds", "0"], "--seconds"),
        (&["bench", "durable", "--seconds", "soon"], "--seconds"),
        (&["bench", "durable", "--threads", "0"], "--threads"),
        (&["bench", "durable", "--batch-rows", "1"], "--batch-rows"),
        (
            &["bench", "durable", "--seconds", "1", "--rows", "10"],
            "--rows",
        ),
        (&["bench", "recovery", "--log-mb", "0"], "--log-mb"),
        (&["bench", "recovery", "--log-mb", "lots"], "--log-mb"),
        (
            &["bench", "recovery", "--quick", "--log-mb", "8"],
            "--log-mb",
        ),
        (&["bench", "recovery", "--memory-mb", "0"], "--memory-mb"),
        (&["crash-test", "--threads", "4"], "--db"),
        (&["crash-test", "--db", "x", "--cycles", "0"], "--cycles"),
        (&["crash-test", "--db", "x", "--seconds=-1"], "--seconds"),
        (&["crash-test", "--db", "x", "--seed", "minus"], "--seed"),
        (
            &["crash-test", "--db", "x", "--log-segment-kib", "8"],
            "--log-segment-kib",
        ),
        (
            &["crash-test", "--db", "x", "--checkpoint-mib", "0"],
            "--checkpoint-mib",
        ),
    ];
    for (args, expected) in cases {
        assert_usage_error(args, expected);
    }
}

#[test]
fn checkpoint_bench_times_a_writer_through_a_checkpoint() {
    let scratch = Scratch::new("checkpoint");
    let (_, report) = quick_bench("checkpoint", &scratch);
    assert_eq!(report["verified"], "ok", "{report}");
    let load = &report["load"];
    assert!(
        load["log_appended_bytes"]
            .as_u64()
            .is_some_and(|bytes| bytes >= 16 * 1024 * 1024),
        "{report}"
    );
    let checkpoint = &report["checkpoint"];
    let (pause, duration) = (
        checkpoint["pause_ms"].as_f64().expect("pause"),
        checkpoint["duration_ms"].as_f64().expect("duration"),
    );
    assert!(pause >= 0.0 && pause <= duration, "{report}");
    for window in ["baseline", "during_checkpoint"] {
        let window = &report[window];
        assert!(
            window["statements"].as_u64().is_some_and(|n| n > 0),
            "{report}"
        );
        let (p50, p99, max) = (
            window["p50_ms"].as_f64().expect("p50"),
            window["p99_ms"].as_f64().expect("p99"),
            window["max_ms"].as_f64().expect("max"),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{report}");
    }
    assert!(report["throughput_ratio"].is_number(), "{report}");
    scratch.assert_left_empty("bench checkpoint");
}

/// A `--db` that does not exist is created with its missing parents, and the bench removes
/// them again at the end; a `--db` that existed is kept. Only the run's own subdirectory was
/// removed: `bench durable --db a/b` left `a` and `a/b` behind, empty.
#[test]
fn benches_remove_the_directories_they_created_and_keep_the_others() {
    let scratch = Scratch::new("created-dirs");
    for bench in ["durable", "checkpoint", "recovery"] {
        let output = lastpage(&[
            "bench",
            bench,
            "--quick",
            "--json",
            "--db",
            &scratch.path("new/nested"),
        ]);
        assert!(
            output.status.success(),
            "bench {bench} failed: {}",
            text(&output.stderr)
        );
        scratch.assert_left_empty(&format!("bench {bench} --db <new>/nested"));
    }
    // A `--db` that was there, empty, is kept (the other bench tests run in one that holds
    // nothing either; here it is the directory named, not its parent).
    std::fs::create_dir(scratch.0.join("kept")).expect("create kept");
    quick_bench_in("durable", &scratch.path("kept"));
    let left: Vec<_> = std::fs::read_dir(&scratch.0)
        .expect("read the scratch directory")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(left, ["kept"], "bench durable --db <existing>");
    assert!(
        std::fs::read_dir(scratch.0.join("kept"))
            .expect("kept is kept")
            .next()
            .is_none(),
        "bench durable left files in --db"
    );
}
