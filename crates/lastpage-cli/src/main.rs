//! The `lastpage` command.
//!
//! Exit codes: 0 success; 1 the run failed (an engine error, a failed integrity check);
//! 2 bad input (clap's own errors, or a configuration the harness refuses).

mod bench;
mod cli;
mod crash;
mod durable;
mod sys;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use bench::checkpoint as checkpoint_bench;
use bench::compare::{self, CompareConfig};
use bench::durable as durable_bench;
use bench::insert::{BenchError, run_insert_bench};
use bench::matrix;
use bench::recovery as recovery_bench;
use cli::{
    BenchCommand, CheckpointArgs, Cli, Command, CompareArgs, DurableArgs, InsertArgs, MatrixArgs,
    RecoveryArgs,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(BenchCommand::Insert(args)) => bench_insert(&args),
        Command::Bench(BenchCommand::InsertCompare(args)) => bench_insert_compare(&args),
        Command::Bench(BenchCommand::InsertMatrix(args)) => bench_insert_matrix(&args),
        Command::Bench(BenchCommand::Durable(args)) => bench_durable(&args),
        Command::Bench(BenchCommand::Recovery(args)) => bench_recovery(&args),
        Command::Bench(BenchCommand::Checkpoint(args)) => bench_checkpoint(&args),
        Command::CrashTest(args) => crash::run_crash_test(&args),
        Command::CrashChild(args) => crash::run_child(&args),
    }
}

fn bench_durable(args: &DurableArgs) -> ExitCode {
    let report = match durable_bench::run_durable(&args.config()) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    let failure =
        (!report.all_ok()).then(|| "a cell failed its verification (see the report)".into());
    emit(&report, args.json, durable_bench::render, failure)
}

fn bench_recovery(args: &RecoveryArgs) -> ExitCode {
    let report = match recovery_bench::run_recovery(&args.config()) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    let failure = (!report.ok()).then(|| {
        format!(
            "recovery did not bring back what was inserted: {}",
            report.verification.verified
        )
    });
    emit(&report, args.json, recovery_bench::render, failure)
}

fn bench_checkpoint(args: &CheckpointArgs) -> ExitCode {
    let report = match checkpoint_bench::run_checkpoint(&args.config()) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    let failure = (report.verified != "ok")
        .then(|| format!("the table is not what was inserted: {}", report.verified));
    emit(&report, args.json, checkpoint_bench::render, failure)
}

fn bench_insert(args: &InsertArgs) -> ExitCode {
    let report = match run_insert_bench(&args.config()) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    if args.json {
        // The human output shows notes itself; say them where a JSON reader will see them too.
        for note in &report.notes {
            eprintln!("lastpage: note: {note}");
        }
    }
    let failure =
        (report.integrity != "ok").then(|| format!("integrity check failed: {}", report.integrity));
    emit(&report, args.json, bench::render::insert_report, failure)
}

fn bench_insert_compare(args: &CompareArgs) -> ExitCode {
    let config = CompareConfig {
        rows_per_thread: args.rows_per_thread,
        repeat: args.repeat,
    };
    let report = match compare::run_compare(&config) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    let failure = (!report.all_ok()).then(|| "an integrity check failed (see the report)".into());
    emit(&report, args.json, compare::render, failure)
}

fn bench_insert_matrix(args: &MatrixArgs) -> ExitCode {
    let report = match matrix::run_matrix(&args.config()) {
        Ok(report) => report,
        Err(error) => return fail(&error),
    };
    let failure =
        (!report.all_ok()).then(|| "an integrity check or a run failed (see the report)".into());
    emit(&report, args.json, matrix::render, failure)
}

/// Prints a report as JSON or as tables, then turns `failure` (a failed integrity check, a
/// failed run) into exit code 1.
fn emit<R: serde::Serialize>(
    report: &R,
    json: bool,
    render: impl Fn(&R) -> String,
    failure: Option<String>,
) -> ExitCode {
    let text = if json {
        match serde_json::to_string_pretty(report) {
            Ok(json) => json + "\n",
            Err(error) => {
                return fail(&BenchError::Failed(format!(
                    "cannot serialize the report: {error}"
                )));
            }
        }
    } else {
        render(report)
    };
    print(&text);
    match failure {
        None => ExitCode::SUCCESS,
        Some(message) => {
            eprintln!("lastpage: {message}");
            ExitCode::from(1)
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

fn fail(error: &BenchError) -> ExitCode {
    eprintln!("lastpage: {error}");
    match error {
        BenchError::InvalidConfig(_) => ExitCode::from(2),
        BenchError::Failed(_) => ExitCode::from(1),
    }
}
