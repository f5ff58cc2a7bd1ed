//! A bulk load in one explicit transaction: the shape in which what a transaction holds per row
//! shows, its row locks (until it escalates to a lock on the table) and its undo entries
//! (until it lets them go, to be undone from the log), and what its rollback and its recovery
//! after a crash hold.
//!
//! `cargo run --release -p lastpage-engine --example one_transaction -- DIR [ROWS]` creates a
//! durable database in `DIR` (which must not exist; it is removed at the end), inserts ROWS
//! rows (default 1,000,000) one statement each into an identity-keyed table in one
//! transaction and commits it, then does the same again and rolls it back, then again and
//! closes the database with that transaction still open, reopens it (its recovery undoes the
//! open transaction), checks the committed rows are all there, and deletes them all, one
//! statement each, in one more transaction. It prints the time per row of each step and the
//! process's peak resident memory (Linux's `VmHWM`; from the reopening on, each step's own), and
//! how many undo entries the transactions let go (past `UNDO_KEPT_ENTRIES`) and the rollback
//! undid from the log.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, IndexDef, InsertRow, TableDef, Uniqueness,
    Value,
};

/// The buffer pool's budget: small, so that the load also evicts pages while it runs.
const MEMORY_BUDGET_BYTES: usize = 64 << 20;
const PAYLOAD_BYTES: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: one_transaction DIR [ROWS]")?);
    let rows: usize = match args.next() {
        Some(rows) => rows.parse()?,
        None => 1_000_000,
    };
    if dir.exists() {
        return Err(format!("{} exists; give a directory to create", dir.display()).into());
    }
    let options = || DatabaseOptions {
        memory_budget_bytes: MEMORY_BUDGET_BYTES,
        ..DatabaseOptions::default()
    };
    let result = run(&dir, rows, &options);
    std::fs::remove_dir_all(&dir)?;
    result
}

fn run(
    dir: &std::path::Path,
    rows: usize,
    options: &dyn Fn() -> DatabaseOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::open(dir, options())?;
    let table = db.create_table(
        TableDef::new("BulkLoad")
            .column(ColumnDef::new("InsertID", DataType::BigInt).identity(1, 1))
            .column(ColumnDef::new("Payload", DataType::VarChar(PAYLOAD_BYTES as u16)).not_null())
            .clustered(IndexDef::new(
                "PK_BulkLoad",
                &["InsertID"],
                Uniqueness::PrimaryKey,
            )),
    )?;
    let session = db.session();
    let payload = "x".repeat(PAYLOAD_BYTES);
    for commit in [true, false] {
        session.begin()?;
        let start = Instant::now();
        for _ in 0..rows {
            table.insert(
                &session,
                InsertRow::new().set(1, Value::String(payload.clone())),
            )?;
        }
        let inserted = start.elapsed();
        if commit {
            session.commit()?;
        } else {
            session.rollback()?;
        }
        let ended = start.elapsed() - inserted;
        println!(
            "{rows} inserts in one transaction: {:.3} µs per insert, {} {:.3} µs per row; \
             peak resident memory {}",
            per_row_us(inserted, rows),
            if commit { "commit" } else { "rollback" },
            per_row_us(ended, rows),
            peak_resident_memory()
        );
    }
    let undo = db.undo_stats();
    println!(
        "undo entries let go: {} in {} spills; changes the rollback undid from the log: {}",
        undo.entries_spilled, undo.spills, undo.undone_from_log
    );
    // A transaction still open when the database closes is a loser to the next open, which
    // undoes it from the log: the recovery of a crash in the middle of a large transaction.
    session.begin()?;
    for _ in 0..rows {
        table.insert(
            &session,
            InsertRow::new().set(1, Value::String(payload.clone())),
        )?;
    }
    drop(table);
    db.close()?;
    // Its rollback is refused now that the database is closed; the transaction stays open in
    // the log.
    drop(session);
    reset_peak_resident_memory();
    let db = Database::open(dir, options())?;
    let stats = db
        .recovery_stats()
        .ok_or("a durable database has recovery statistics")?;
    println!(
        "reopening undid {} changes of {} transaction(s) left open; replay {:.2} s, open {:.2} s; \
         peak resident memory during the open {}",
        stats.undone_changes,
        stats.loser_txns,
        stats.replay_duration.as_secs_f64(),
        stats.duration.as_secs_f64(),
        peak_resident_memory()
    );
    let table = db.table("BulkLoad")?;
    let found = table.row_count();
    println!("after reopening: {found} rows (expected {rows})");
    if found != rows as u64 {
        return Err(format!("expected {rows} rows after reopening, found {found}").into());
    }
    // A purge in one transaction: every row deleted, one statement each. Besides its undo
    // entries and row locks, a deleting transaction notes each row it deletes, for READ
    // COMMITTED readers that do not find it to wait for its outcome.
    let session = db.session();
    reset_peak_resident_memory();
    session.begin()?;
    let start = Instant::now();
    // The committed rows are the first transaction's: identity values 1 to ROWS.
    for key in 1..=rows as i64 {
        if !table.delete(&session, &[Value::BigInt(key)])? {
            return Err(format!("row {key} was not there to delete").into());
        }
    }
    let deleted = start.elapsed();
    session.commit()?;
    let committed = start.elapsed() - deleted;
    println!(
        "{rows} deletes in one transaction: {:.3} µs per delete, commit {:.3} µs per row; \
         peak resident memory {}",
        per_row_us(deleted, rows),
        per_row_us(committed, rows),
        peak_resident_memory()
    );
    let left = table.row_count();
    if left != 0 {
        return Err(format!("expected no rows after the purge, found {left}").into());
    }
    Ok(())
}

fn per_row_us(elapsed: Duration, rows: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / rows.max(1) as f64
}

/// Starts Linux's count of the peak resident memory (`VmHWM`) again from the memory resident
/// now; elsewhere it does nothing, and the peak printed is the whole run's.
fn reset_peak_resident_memory() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// `VmHWM` from `/proc/self/status`, or "unknown" where there is none.
fn peak_resident_memory() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .map(|value| value.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
