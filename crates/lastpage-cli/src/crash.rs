//! `lastpage crash-test`: durability checked by killing a real process.
//!
//! The parent re-executes its own binary as `lastpage crash-child`, which opens the database
//! with `Durability::Full` and inserts from many threads: single rows (half of them through a
//! prepared insert of borrowed values), multi-row batches and explicit transactions, some
//! rolled back and some committed with a pipelined commit (whose rows are acknowledged once
//! its ticket's wait returns, after the thread's next statement).
//! Right after a row's commit returns `Ok`, the child writes the row's identity value to
//! stdout, one line per row: that line is the acknowledgement a client would have received.
//! The parent reads the lines through a pipe, kills the child with SIGKILL at a random moment,
//! reopens the database in-process (which recovers it from the log) and checks:
//!
//! - **lost**: every row ever acknowledged (in this cycle or any earlier one) is there;
//! - **duplicates**: no identity value and no logical row (run, cycle, thread, sequence number)
//!   is in the table twice;
//! - **reused**: no identity value handed out now (acknowledged or rolled back) was handed out
//!   before or was already in the table at the last check (a recovered identity counter must
//!   not go backwards). Values handed out before include those an explicit transaction was
//!   given and the kill cut short: the child writes each one as soon as its insert returns,
//!   before the commit, as an application could have used it from that moment;
//! - every row's contents match what was inserted, rolled-back rows never appear, and the
//!   integrity check passes.
//!
//! Rows that are there but were never acknowledged are fine: the commit was durable but the
//! kill came before the child could write its line. They are counted as `unacked_present`.
//!
//! Each row carries its own provenance (run, cycle, thread, sequence number) and a payload
//! derived from it, because the identity value is assigned inside the insert (the child cannot
//! derive the payload from it beforehand, and a computed column a durable catalog stores is
//! integer arithmetic only). The parent checks acknowledged rows against their acknowledgement and every
//! row against its own provenance.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lastpage_engine::{
    ColumnDef, CommitTicket, DataType, Database, Direction, IndexDef, InsertRow, KeyRange, Table,
    TableDef, Uniqueness, Value,
};

use crate::cli::{CrashChildArgs, CrashLogArgs, CrashTestArgs};
use crate::durable::{self, Durability};

/// The table the crash test inserts into.
const TABLE: &str = "CrashTest";

/// The table the child's churning thread creates, fills and drops over and over, so that the
/// kill also comes while pages are freed and reused (see [`churn`]).
const SCRATCH: &str = "CrashScratch";

/// Rows the churning thread inserts into each scratch table, at most.
const SCRATCH_ROWS_MAX: u64 = 400;

/// Column positions in [`TABLE`].
const ID: usize = 0;
const RUN: usize = 1;
const CYCLE: usize = 2;
const THREAD: usize = 3;
const SEQ: usize = 4;
const PAYLOAD: usize = 5;

/// The columns every insert supplies, in this order (the identity fills `ID`).
const PREPARED_COLUMNS: [usize; 5] = [RUN, CYCLE, THREAD, SEQ, PAYLOAD];

/// How long the parent waits for a child to open the database and start inserting.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Lines of the child's stderr kept for error messages.
const STDERR_LINES: usize = 20;

/// The crash test's table: `Id bigint IDENTITY(1,1)` as the clustered primary key, the row's
/// provenance, and a payload derived from the provenance.
fn table_def() -> TableDef {
    TableDef::new(TABLE)
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Run", DataType::BigInt).not_null())
        .column(ColumnDef::new("Cycle", DataType::Int).not_null())
        .column(ColumnDef::new("Thread", DataType::Int).not_null())
        .column(ColumnDef::new("Seq", DataType::BigInt).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
        .clustered(IndexDef::new(
            "PK_CrashTest",
            &["Id"],
            Uniqueness::PrimaryKey,
        ))
}

/// Where a row came from: which run, cycle and thread inserted it, as its `seq`-th row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Provenance {
    run: i64,
    cycle: i32,
    thread: i32,
    seq: i64,
}

impl Provenance {
    /// The payload a row with this provenance carries: the provenance in text and a hash of it,
    /// so that a row whose columns were mixed up or torn does not match.
    fn payload(&self) -> String {
        let hash = mix((self.run as u64)
            ^ mix(u64::from(self.cycle as u32) << 32 | u64::from(self.thread as u32))
            ^ mix(self.seq as u64 ^ 0x5eed));
        format!(
            "r{:x}.c{}.t{}.s{}.{hash:016x}",
            self.run, self.cycle, self.thread, self.seq
        )
    }

    fn row(&self) -> InsertRow {
        PREPARED_COLUMNS
            .iter()
            .zip(self.values())
            .fold(InsertRow::new(), |row, (&column, value)| {
                row.set(column, value)
            })
    }

    /// The row's values for a [`lastpage_engine::PreparedInsert`] of [`PREPARED_COLUMNS`].
    fn values(&self) -> [Value; 5] {
        [
            Value::BigInt(self.run),
            Value::Int(self.cycle),
            Value::Int(self.thread),
            Value::BigInt(self.seq),
            Value::String(self.payload()),
        ]
    }

    /// The provenance a stored row claims, and whether its payload matches it.
    fn of_row(row: &[Value]) -> Option<(Provenance, bool)> {
        let int = |index: usize| row.get(index).and_then(Value::as_i64);
        let provenance = Provenance {
            run: int(RUN)?,
            cycle: i32::try_from(int(CYCLE)?).ok()?,
            thread: i32::try_from(int(THREAD)?).ok()?,
            seq: int(SEQ)?,
        };
        let payload_ok = row.get(PAYLOAD).and_then(Value::as_str) == Some(&provenance.payload());
        Some((provenance, payload_ok))
    }
}

/// SplitMix64's finalizer: a good 64-bit mix. The crash test uses its own generator rather
/// than a crate's so that a printed seed replays the same kill moments and the same mix of
/// statements whatever version of a random-number crate the build resolved.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64: a tiny seeded generator.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// A number in `0..bound` (`bound` ≥ 1).
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    /// A number in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---------------------------------------------------------------------------------------------
// The child.

/// What the child writes to stdout, one line each:
/// `ready` once it inserts; `a ID THREAD SEQ` for each acknowledged row;
/// `r ID THREAD SEQ` for a row inserted by a transaction that was then rolled back;
/// `s ID` for an identity value an explicit transaction was given, before it ends;
/// `b THREAD FIRST COUNT` before a batch statement and `t THREAD FIRST COUNT` before an
/// explicit transaction, whose rows are the thread's rows `FIRST..FIRST+COUNT`;
/// `c THREAD FIRST` just before the COMMIT of the explicit transaction starting at `FIRST`.
fn ack_line(id: i64, provenance: &Provenance) -> String {
    format!("a {id} {} {}\n", provenance.thread, provenance.seq)
}

/// `s ID`: an identity value an insert inside an explicit transaction returned (the
/// application has it, whatever becomes of the transaction).
fn seen_line(id: i64) -> String {
    format!("s {id}\n")
}

/// `b`/`t THREAD FIRST COUNT`: the next `COUNT` rows of the thread, from `FIRST` on, go in
/// one transaction: a batch statement (which commits itself) or an explicit transaction (which
/// commits only after a `c` line). Written before any of them goes in, so a row of the unit in
/// the table means the parent read the line.
fn unit_line(kind: UnitKind, first: &Provenance, count: u64) -> String {
    let tag = match kind {
        UnitKind::Batch => 'b',
        UnitKind::Transaction => 't',
    };
    format!("{tag} {} {} {count}\n", first.thread, first.seq)
}

/// `c THREAD FIRST`: the explicit transaction starting at row `FIRST` asks to commit now.
fn commit_line(first: &Provenance) -> String {
    format!("c {} {}\n", first.thread, first.seq)
}

/// `r ID THREAD SEQ`: a row a transaction inserted and then rolled back.
fn rollback_line(id: i64, provenance: &Provenance) -> String {
    format!("r {id} {} {}\n", provenance.thread, provenance.seq)
}

/// Opens (creating or recovering) the crash test's database with the test's log settings.
fn open(dir: &Path, log: CrashLogArgs) -> Result<lastpage_engine::Database, String> {
    durable::open_with(
        dir,
        durable::OpenSettings {
            checkpoint_log_bytes: Some(log.checkpoint_mib << 20),
            log_segment_bytes: Some(log.log_segment_kib << 10),
            ..durable::OpenSettings::new(Durability::Full)
        },
    )
}

/// `lastpage crash-child`: inserts until killed (or until the parent goes away and a write to
/// the pipe fails).
pub fn run_child(args: &CrashChildArgs) -> ExitCode {
    let (run, cycle) = (args.run, args.cycle);
    let db = match open(&args.db, args.log) {
        Ok(db) => db,
        Err(error) => {
            eprintln!("lastpage crash-child: {error}");
            return ExitCode::from(1);
        }
    };
    let table = match db.table(TABLE) {
        Ok(table) => table,
        Err(_) => match db.create_table(table_def()) {
            Ok(table) => table,
            Err(error) => {
                eprintln!("lastpage crash-child: cannot create table {TABLE}: {error}");
                return ExitCode::from(1);
            }
        },
    };
    // Rust's stdout is line-buffered, so each line reaches the pipe as soon as it is complete:
    // the parent sees every acknowledgement the child got to write before it was killed.
    let out = Mutex::new(std::io::stdout());
    if write_lines(&out, "ready\n").is_err() {
        return ExitCode::SUCCESS;
    }
    let failure: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|scope| {
        let (churn_db, churn_seed) = (&db, mix(args.seed ^ 0x5eed_c4a5));
        scope.spawn(move || {
            // Reported at once, as an inserting thread's error (see below).
            if let Err(error) = churn(churn_db, churn_seed) {
                eprintln!("lastpage crash-child: the churning thread: {error}");
                std::process::exit(1);
            }
        });
        for thread in 0..args.threads {
            let (db, table, out, failure) = (&db, &table, &out, &failure);
            let seed = mix(args.seed ^ u64::from(thread).wrapping_mul(0x9e37_79b9));
            scope.spawn(move || {
                let result = child_thread(db, table, out, run, cycle, thread as i32, seed);
                match result {
                    Ok(()) => {}
                    Err(error) if error == PIPE_CLOSED => {
                        failure
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .get_or_insert(error);
                    }
                    // Reported at once: the other threads go on inserting until the kill, so
                    // the scope would never end, and an error kept for its end would never
                    // reach the parent, which would then pass the cycle.
                    Err(error) => {
                        eprintln!("lastpage crash-child: thread {thread}: {error}");
                        std::process::exit(1);
                    }
                }
            });
        }
    });
    match failure
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        // A closed pipe means the parent is gone: nothing left to report to.
        Some(error) if error == PIPE_CLOSED => ExitCode::SUCCESS,
        Some(error) => {
            eprintln!("lastpage crash-child: {error}");
            ExitCode::from(1)
        }
        None => ExitCode::SUCCESS,
    }
}

const PIPE_CLOSED: &str = "the parent closed the pipe";

/// The child's churning thread, until the kill: creates [`SCRATCH`] (with a nonclustered
/// index: two trees), fills it with up to [`SCRATCH_ROWS_MAX`] rows, deletes some of them oldest
/// first (which frees the leaves they empty, in both trees) and drops it, over and over.
/// Every other round a handle of the table outlives its drop by a round, so its pages wait for
/// it (and a checkpoint in between lists its trees for the next open). The parent checks after
/// every reopen that every page in use belongs to a tree; the rows are not checked.
fn churn(db: &Database, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut held = None;
    // DROP TABLE IF EXISTS: the previous child may have been killed between its CREATE and its
    // DROP (recovery then replays the CREATE, and the table is there).
    if db.table(SCRATCH).is_ok() {
        db.drop_table(SCRATCH)
            .map_err(|error| format!("cannot drop {SCRATCH}: {error}"))?;
    }
    loop {
        let table = db
            .create_table(
                TableDef::new(SCRATCH)
                    .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                    .column(ColumnDef::new("Tag", DataType::Int).not_null())
                    .column(ColumnDef::new("Payload", DataType::VarChar(2000)).not_null())
                    .clustered(IndexDef::new("PK_Scratch", &["Id"], Uniqueness::PrimaryKey))
                    .nonclustered(IndexDef::new("IX_Scratch", &["Tag"], Uniqueness::NonUnique)),
            )
            .map_err(|error| format!("cannot create {SCRATCH}: {error}"))?;
        let session = db.session();
        let mut ids = Vec::new();
        for _ in 0..rng.below(SCRATCH_ROWS_MAX) {
            let row = InsertRow::new()
                .set(1, rng.below(50) as i32)
                .set(2, "s".repeat(1 + rng.below(1_500) as usize));
            let id = table
                .insert(&session, row)
                .map_err(|error| format!("cannot insert into {SCRATCH}: {error}"))?;
            ids.extend(id);
        }
        // As a queue would: the oldest rows go, and the leaves they empty are freed at once,
        // so the kill may also come in the middle of a leaf's unlinking.
        for &id in ids.iter().take(rng.below(ids.len() as u64 + 1) as usize) {
            table
                .delete(&session, &[Value::BigInt(id)])
                .map_err(|error| format!("cannot delete from {SCRATCH}: {error}"))?;
        }
        db.drop_table(SCRATCH)
            .map_err(|error| format!("cannot drop {SCRATCH}: {error}"))?;
        // The handle kept from the round before goes now, after this round's DDL.
        drop(held.take());
        held = (rng.below(2) == 0).then_some(table);
    }
}

/// The environment variable that makes a crash test's child misbehave, so that the crash
/// test's own tests can show that the parent catches it: `error` makes thread 0 fail as an
/// insert that returned an error would, `abort` makes it abort the process (as a crash of the
/// engine would), either once it has run [`CHILD_FAULT_AFTER_STATEMENTS`] statements.
pub const CHILD_FAULT_VAR: &str = "LASTPAGE_CRASH_CHILD_FAULT";

/// See [`CHILD_FAULT_VAR`].
const CHILD_FAULT_AFTER_STATEMENTS: i64 = 200;

/// The fault [`CHILD_FAULT_VAR`] asks thread `thread` of the child for, if any.
fn child_fault(thread: i32) -> Option<String> {
    (thread == 0)
        .then(|| std::env::var(CHILD_FAULT_VAR).ok())
        .flatten()
}

fn write_lines(out: &Mutex<std::io::Stdout>, text: &str) -> Result<(), String> {
    let stdout = out.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut stdout = stdout.lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|_| PIPE_CLOSED.to_owned())
}

/// One inserting thread of the child: mostly single-row autocommit inserts, some multi-row
/// batches (one transaction each), acknowledging every row once its statement returned `Ok`,
/// and some explicit transactions. Half of those that commit use a pipelined commit: their
/// rows are acknowledged only once its ticket's wait returns, after the thread's next
/// statement, as a pipelining application would.
fn child_thread(
    db: &Database,
    table: &Arc<Table>,
    out: &Mutex<std::io::Stdout>,
    run: i64,
    cycle: i32,
    thread: i32,
    seed: u64,
) -> Result<(), String> {
    let session = db.session();
    let prepared = table
        .prepare_insert(&PREPARED_COLUMNS)
        .map_err(|error| format!("cannot prepare the insert: {error}"))?;
    let mut rng = Rng::new(seed);
    let mut seq = 0i64;
    let next = |seq: &mut i64| {
        let provenance = Provenance {
            run,
            cycle,
            thread,
            seq: *seq,
        };
        *seq += 1;
        provenance
    };
    let id_of = |id: Option<i64>| id.ok_or_else(|| "the table has no identity column".to_owned());
    // A pipelined commit and the acknowledgements it holds back until it is durable.
    let mut in_flight: Option<(CommitTicket, String)> = None;
    let fault = child_fault(thread);
    loop {
        if seq >= CHILD_FAULT_AFTER_STATEMENTS {
            match fault.as_deref() {
                Some("error") => return Err(format!("a fault from {CHILD_FAULT_VAR}")),
                Some("abort") => std::process::abort(),
                _ => {}
            }
        }
        // The previous statement's pipelined commit is waited for after this statement.
        let previous = in_flight.take();
        let choice = rng.below(100);
        if choice < 75 {
            // Half through a prepared insert of borrowed values, half as an `InsertRow`: the
            // two single-row paths the engine has.
            let provenance = next(&mut seq);
            let id = if choice < 37 {
                prepared.insert(&session, &provenance.values())
            } else {
                table.insert(&session, provenance.row())
            }
            .map_err(|error| format!("insert failed: {error}"))?;
            write_lines(out, &ack_line(id_of(id)?, &provenance))?;
        } else if choice < 87 {
            let rows = 2 + rng.below(30);
            let provenances: Vec<Provenance> = (0..rows).map(|_| next(&mut seq)).collect();
            write_lines(out, &unit_line(UnitKind::Batch, &provenances[0], rows))?;
            let ids = table
                .insert_batch(&session, provenances.iter().map(Provenance::row).collect())
                .map_err(|error| format!("batch insert failed: {error}"))?;
            let mut lines = String::new();
            for (id, provenance) in ids.into_iter().zip(&provenances) {
                lines.push_str(&ack_line(id_of(id)?, provenance));
            }
            write_lines(out, &lines)?;
        } else {
            // An explicit transaction of a few single-row inserts, committed (every row
            // acknowledged after COMMIT returns) or rolled back (its rows must never be seen,
            // and their identity values never handed out again).
            let commit = choice < 95;
            let rows = 1 + rng.below(5);
            let first = Provenance {
                run,
                cycle,
                thread,
                seq,
            };
            write_lines(out, &unit_line(UnitKind::Transaction, &first, rows))?;
            session
                .begin()
                .map_err(|error| format!("BEGIN TRANSACTION failed: {error}"))?;
            let mut lines = String::new();
            for _ in 0..rows {
                let provenance = next(&mut seq);
                let id = table
                    .insert(&session, provenance.row())
                    .map_err(|error| format!("insert in a transaction failed: {error}"))?;
                write_lines(out, &seen_line(id_of(id)?))?;
                let line = if commit {
                    ack_line(id_of(id)?, &provenance)
                } else {
                    rollback_line(id_of(id)?, &provenance)
                };
                lines.push_str(&line);
            }
            if commit {
                write_lines(out, &commit_line(&first))?;
            }
            if commit && rng.below(2) == 0 {
                let ticket = session
                    .commit_pipelined()
                    .map_err(|error| format!("a pipelined COMMIT failed: {error}"))?;
                in_flight = Some((ticket, lines));
            } else {
                if commit {
                    session
                        .commit()
                        .map_err(|error| format!("COMMIT failed: {error}"))?;
                } else {
                    session
                        .rollback()
                        .map_err(|error| format!("ROLLBACK failed: {error}"))?;
                }
                write_lines(out, &lines)?;
            }
        }
        if let Some((ticket, lines)) = previous {
            ticket
                .wait()
                .map_err(|error| format!("a pipelined COMMIT failed: {error}"))?;
            write_lines(out, &lines)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent.

/// What the reader thread saw on the child's stdout.
enum Event {
    Ready,
    Ack(i64, Provenance),
    RolledBack(i64, Provenance),
    /// An identity value given to an explicit transaction before it ended.
    Seen(i64),
    /// Rows of one thread that go in one transaction (the provenance's `seq` is the first).
    Unit(UnitKind, Provenance, u64),
    /// The explicit transaction whose first row this is asks to commit.
    Committing(Provenance),
    /// A line that does not parse (a torn last line is dropped before this).
    Garbage(String),
    Eof,
}

/// How the rows of a unit go in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnitKind {
    /// One batch statement, which commits itself.
    Batch,
    /// An explicit transaction, which commits only if the child asked it to (`c` line).
    Transaction,
}

/// Rows of one thread that must be in the table all or none: `count` rows from `first`, and
/// for an explicit transaction, only if its COMMIT was asked for.
#[derive(Clone, Copy, Debug)]
struct Unit {
    kind: UnitKind,
    first: Provenance,
    count: u64,
    committing: bool,
}

/// One cycle's figures.
#[derive(Clone, Debug, Default)]
struct CycleReport {
    acked: u64,
    rows: u64,
    unacked_present: u64,
    recovery_ms: f64,
    recovered_log_bytes: Option<u64>,
    recovered_records: Option<u64>,
    lost: u64,
    duplicates: u64,
    reused: u64,
    corrupt: u64,
    rolled_back_present: u64,
    /// Transactions (batches or explicit) only some of whose rows are in the table.
    partial: u64,
    /// Explicit transactions whose rows are in the table although their COMMIT was never
    /// asked for (recovery kept a transaction that never committed).
    uncommitted_present: u64,
    /// Pages allocated and not free after the reopen, and pages free.
    pages_in_use: usize,
    free_pages: usize,
    /// "ok" if the integrity check passed and every page in use belongs to a tree.
    integrity: String,
}

impl CycleReport {
    fn failed(&self) -> bool {
        self.lost > 0
            || self.duplicates > 0
            || self.reused > 0
            || self.corrupt > 0
            || self.rolled_back_present > 0
            || self.partial > 0
            || self.uncommitted_present > 0
            || self.integrity != "ok"
    }
}

/// What the parent knows across cycles.
struct Ledger {
    run: i64,
    /// Every acknowledged row, by identity value.
    acked: HashMap<i64, Provenance>,
    /// Identity values rolled-back transactions used.
    rolled_back: Vec<(i64, Provenance)>,
    /// The transactions of more than one row the current cycle's child began.
    units: Vec<Unit>,
    /// Acknowledged rows found missing by any check (a row lost once counts once).
    ever_lost: HashSet<i64>,
    /// The most extra copies of rows any check found.
    most_duplicates: u64,
    /// The largest identity value acknowledged or seen in the table so far: every value handed
    /// out from now on must be larger.
    high_water: i64,
}

/// `lastpage crash-test`.
pub fn run_crash_test(args: &CrashTestArgs) -> ExitCode {
    let seed = args.seed.unwrap_or_else(clock_seed);
    // The run tags every row, so that rows of earlier runs on the same database are told apart.
    let run = (mix(seed ^ clock_seed()) >> 1) as i64;
    println!(
        "crash-test: db={} threads={} seconds={} cycles={} log-segment-kib={} checkpoint-mib={} \
         seed={seed} (repeat with --seed {seed})",
        args.db.display(),
        args.threads,
        args.seconds,
        args.cycles,
        args.log.log_segment_kib,
        args.log.checkpoint_mib
    );
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("lastpage: cannot find this program's own executable: {error}");
            return ExitCode::from(1);
        }
    };
    let mut ledger = Ledger {
        run,
        acked: HashMap::new(),
        rolled_back: Vec::new(),
        units: Vec::new(),
        ever_lost: HashSet::new(),
        most_duplicates: 0,
        high_water: 0,
    };
    // What is there before the first child runs: an existing database's rows set the high-water
    // mark, and a damaged one is reported before anything is blamed on a kill.
    match verify(&args.db, args.log, &mut ledger) {
        Ok(report) if report.failed() => {
            eprintln!(
                "lastpage: the database in {} fails the check before the first cycle: \
                 integrity {}, corrupt rows {}",
                args.db.display(),
                report.integrity,
                report.corrupt
            );
            return ExitCode::from(1);
        }
        Ok(_) => {}
        Err(error) => {
            eprintln!("lastpage: {error}");
            return ExitCode::from(1);
        }
    }
    let mut rng = Rng::new(seed);
    let (mut acked, mut reused) = (0, 0);
    let mut any_failed = false;
    for cycle in 1..=args.cycles {
        let child_seed = rng.next();
        let delay = args.seconds * (0.5 + 0.5 * rng.unit());
        let report = match one_cycle(args, &exe, &mut ledger, cycle, child_seed, delay) {
            Ok(report) => report,
            Err(error) => {
                eprintln!("lastpage: cycle {cycle}: {error}");
                return ExitCode::from(1);
            }
        };
        println!(
            "cycle {cycle}/{}: killed after {delay:.2} s, acked={} rows={} unacked_present={} \
             recovery_ms={:.1}{} lost={} duplicates={} reused={}{}{} pages={} free={} \
             integrity={}",
            args.cycles,
            report.acked,
            report.rows,
            report.unacked_present,
            report.recovery_ms,
            match (report.recovered_log_bytes, report.recovered_records) {
                (Some(bytes), Some(records)) => format!(" (log {bytes} bytes, {records} records)"),
                _ => String::new(),
            },
            report.lost,
            report.duplicates,
            report.reused,
            if report.corrupt > 0 {
                format!(" corrupt={}", report.corrupt)
            } else {
                String::new()
            },
            [
                ("rolled_back_present", report.rolled_back_present),
                ("partial", report.partial),
                ("uncommitted_present", report.uncommitted_present),
            ]
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(name, count)| format!(" {name}={count}"))
            .collect::<String>(),
            report.pages_in_use,
            report.free_pages,
            report.integrity
        );
        any_failed |= report.failed();
        acked += report.acked;
        reused += report.reused;
    }
    // Lost rows stay lost and duplicates stay in the table, so every later check sees them
    // again: the summary counts each lost row once and the worst duplicate count, not sums.
    println!(
        "cycles={} acked={acked} lost={} duplicates={} reused={reused}",
        args.cycles,
        ledger.ever_lost.len(),
        ledger.most_duplicates
    );
    if any_failed {
        eprintln!("lastpage: crash-test failed (see the cycle lines; seed {seed})");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

/// Starts a child, kills it after `delay` seconds of inserting, collects its acknowledgements
/// and verifies the recovered database.
fn one_cycle(
    args: &CrashTestArgs,
    exe: &Path,
    ledger: &mut Ledger,
    cycle: u32,
    child_seed: u64,
    delay: f64,
) -> Result<CycleReport, String> {
    let mut child = std::process::Command::new(exe)
        .arg("crash-child")
        .arg("--db")
        .arg(&args.db)
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--seed")
        .arg(child_seed.to_string())
        .arg("--run")
        .arg(ledger.run.to_string())
        .arg("--cycle")
        .arg(cycle.to_string())
        .args(args.log.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot start the child process: {error}"))?;
    let (events, stderr_tail, readers) = match watch(&mut child) {
        Ok(watched) => watched,
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
    };
    let mut acks = Vec::new();
    let mut rolled_back = Vec::new();
    let mut seen = Vec::new();
    let mut units: Vec<Unit> = Vec::new();
    let mut committing: HashSet<(i32, i64)> = HashSet::new();
    let mut garbage = Vec::new();
    let mut eof = false;
    let mut handle = |event: Event, eof: &mut bool| match event {
        Event::Ready => {}
        Event::Ack(id, provenance) => acks.push((id, provenance)),
        Event::RolledBack(id, provenance) => rolled_back.push((id, provenance)),
        Event::Seen(id) => seen.push(id),
        Event::Unit(kind, first, count) => units.push(Unit {
            kind,
            first,
            count,
            committing: false,
        }),
        Event::Committing(first) => {
            committing.insert((first.thread, first.seq));
        }
        Event::Garbage(line) => garbage.push(line),
        Event::Eof => *eof = true,
    };

    // Wait for the child to start inserting, then let it run for `delay`.
    let ready_by = Instant::now() + READY_TIMEOUT;
    let mut ready = false;
    while !ready && !eof {
        match events.recv_timeout(ready_by.saturating_duration_since(Instant::now())) {
            Ok(Event::Ready) => ready = true,
            Ok(event) => handle(event, &mut eof),
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => eof = true,
        }
    }
    if ready {
        let kill_at = Instant::now() + Duration::from_secs_f64(delay);
        while !eof {
            let left = kill_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match events.recv_timeout(left) {
                Ok(event) => handle(event, &mut eof),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => eof = true,
            }
        }
    }
    // `Child::kill` sends SIGKILL on Unix: no destructor, no flush, no chance to finish.
    let _ = child.kill();
    let status = child.wait();
    // The child never ends by itself while its parent reads its pipe: an exit code, or a
    // signal other than the kill (a crash, an abort, the OOM killer), means it stopped before
    // the kill, and a cycle that verified what it wrote until then would pass a test that
    // never ran to the kill.
    let killed = status
        .as_ref()
        .is_ok_and(|status| status.signal() == Some(libc::SIGKILL));
    for reader in readers {
        let _ = reader.join();
    }
    while let Ok(event) = events.try_recv() {
        handle(event, &mut eof);
    }
    let stderr_text = stderr_tail
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .join("\n");
    if !ready {
        return Err(format!(
            "the child did not start inserting within {} s (exit status {}): {}",
            READY_TIMEOUT.as_secs(),
            status.map_or_else(|error| error.to_string(), |status| status.to_string()),
            if stderr_text.is_empty() {
                "no error output"
            } else {
                &stderr_text
            }
        ));
    }
    if eof && acks.is_empty() && !stderr_text.is_empty() {
        return Err(format!(
            "the child stopped before it was killed: {stderr_text}"
        ));
    }
    if !killed && stderr_text.is_empty() {
        return Err(format!(
            "the child stopped before it was killed (exit status {}), and wrote no error",
            status.map_or_else(|error| error.to_string(), |status| status.to_string()),
        ));
    }
    if !stderr_text.is_empty() {
        // The child only writes to stderr when an insert failed: that is a failure of the
        // engine under test, not of the kill.
        return Err(format!(
            "the child reported an error before it was killed: {stderr_text}"
        ));
    }
    if let Some(line) = garbage.first() {
        return Err(format!(
            "the child wrote {} line(s) that are not acknowledgements, the first: {line:?}",
            garbage.len()
        ));
    }

    // Identity values handed out this cycle (acknowledged or rolled back) must be new: above
    // everything acknowledged, rolled back, given to an explicit transaction or seen in the
    // table before this cycle, and never handed out twice. SQL Server never gives an identity
    // value out again, not even one a rolled-back transaction used. (A value given to an
    // explicit transaction is acknowledged or rolled back too if the transaction ended, so
    // values given are not counted twice here; they raise the mark below.)
    let tag = |thread_seq: Provenance| Provenance {
        run: ledger.run,
        cycle: cycle as i32,
        ..thread_seq
    };
    let mut reused = 0;
    let mut handed_out: HashSet<i64> = HashSet::with_capacity(acks.len() + rolled_back.len());
    for &id in acks.iter().chain(&rolled_back).map(|(id, _)| id) {
        if id <= ledger.high_water || !handed_out.insert(id) {
            reused += 1;
        }
    }
    for &(id, thread_seq) in &acks {
        ledger.acked.entry(id).or_insert(tag(thread_seq));
    }
    for &(id, thread_seq) in &rolled_back {
        ledger.rolled_back.push((id, tag(thread_seq)));
        ledger.high_water = ledger.high_water.max(id);
    }
    if let Some(&max_seen) = seen.iter().max() {
        ledger.high_water = ledger.high_water.max(max_seen);
    }
    ledger.units = units
        .into_iter()
        .map(|unit| Unit {
            first: tag(unit.first),
            committing: committing.contains(&(unit.first.thread, unit.first.seq)),
            ..unit
        })
        .collect();
    let mut report = verify(&args.db, args.log, ledger)?;
    report.acked = acks.len() as u64;
    report.reused = reused;
    Ok(report)
}

/// The reader threads of a child's stdout (acknowledgements, as [`Event`]s on the channel) and
/// stderr (its last lines, for error messages).
type Watched = (
    Receiver<Event>,
    Arc<Mutex<Vec<String>>>,
    Vec<std::thread::JoinHandle<()>>,
);

fn watch(child: &mut Child) -> Result<Watched, String> {
    let stdout = child
        .stdout
        .take()
        .ok_or("the child's stdout is not a pipe")?;
    let stderr = child
        .stderr
        .take()
        .ok_or("the child's stderr is not a pipe")?;
    let (sender, receiver) = mpsc::channel();
    let stdout_reader = std::thread::Builder::new()
        .name("crash-acks".into())
        .spawn(move || read_acks(stdout, &sender))
        .map_err(|error| format!("cannot start a reader thread: {error}"))?;
    let tail = Arc::new(Mutex::new(Vec::new()));
    let tail_writer = Arc::clone(&tail);
    let stderr_reader = std::thread::Builder::new()
        .name("crash-stderr".into())
        .spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut tail = tail_writer
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if tail.len() == STDERR_LINES {
                    tail.remove(0);
                }
                tail.push(line);
            }
        })
        .map_err(|error| format!("cannot start a reader thread: {error}"))?;
    Ok((receiver, tail, vec![stdout_reader, stderr_reader]))
}

fn read_acks(stdout: impl Read, sender: &mpsc::Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // A line without its newline is the last one, torn by the kill: the child had not
        // finished acknowledging that row, so it does not count as acknowledged.
        if line.last() != Some(&b'\n') {
            break;
        }
        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        if sender.send(parse_line(&text)).is_err() {
            return;
        }
    }
    let _ = sender.send(Event::Eof);
}

/// A thread's row number as a provenance of no run or cycle yet (the parent adds them).
fn thread_seq(thread: Option<i64>, seq: Option<i64>) -> Option<Provenance> {
    Some(Provenance {
        run: 0,
        cycle: 0,
        thread: i32::try_from(thread?).ok()?,
        seq: seq?,
    })
}

fn parse_line(line: &str) -> Event {
    let fields: Vec<&str> = line.split(' ').collect();
    let number = |index: usize| {
        fields
            .get(index)
            .and_then(|field| field.parse::<i64>().ok())
    };
    match fields.first().copied() {
        Some("ready") if fields.len() == 1 => Event::Ready,
        Some("a") if fields.len() == 4 => match (number(1), number(2), number(3)) {
            (Some(id), Some(thread), Some(seq)) => match i32::try_from(thread) {
                Ok(thread) => Event::Ack(
                    id,
                    Provenance {
                        run: 0,
                        cycle: 0,
                        thread,
                        seq,
                    },
                ),
                Err(_) => Event::Garbage(line.to_owned()),
            },
            _ => Event::Garbage(line.to_owned()),
        },
        Some("s") if fields.len() == 2 => match number(1) {
            Some(id) => Event::Seen(id),
            None => Event::Garbage(line.to_owned()),
        },
        Some(tag @ ("b" | "t")) if fields.len() == 4 => {
            let kind = if tag == "b" {
                UnitKind::Batch
            } else {
                UnitKind::Transaction
            };
            match (thread_seq(number(1), number(2)), number(3)) {
                (Some(first), Some(count)) if count > 0 => Event::Unit(kind, first, count as u64),
                _ => Event::Garbage(line.to_owned()),
            }
        }
        Some("c") if fields.len() == 3 => match thread_seq(number(1), number(2)) {
            Some(first) => Event::Committing(first),
            None => Event::Garbage(line.to_owned()),
        },
        Some("r") if fields.len() == 4 => match (number(1), number(2), number(3)) {
            (Some(id), Some(thread), Some(seq)) => match i32::try_from(thread) {
                Ok(thread) => Event::RolledBack(
                    id,
                    Provenance {
                        run: 0,
                        cycle: 0,
                        thread,
                        seq,
                    },
                ),
                Err(_) => Event::Garbage(line.to_owned()),
            },
            _ => Event::Garbage(line.to_owned()),
        },
        _ => Event::Garbage(line.to_owned()),
    }
}

/// Reopens the database (timing the recovery), scans the whole table and checks it against
/// the ledger. Raises the ledger's high-water mark to the largest identity value in the table.
fn verify(dir: &Path, log: CrashLogArgs, ledger: &mut Ledger) -> Result<CycleReport, String> {
    let started = Instant::now();
    let db = open(dir, log)?;
    let recovery_ms = started.elapsed().as_secs_f64() * 1000.0;
    let recovery = durable::recovery(&db);
    let mut report = CycleReport {
        recovery_ms,
        recovered_log_bytes: recovery.map(|recovery| recovery.log_bytes),
        recovered_records: recovery.map(|recovery| recovery.records),
        ..CycleReport::default()
    };
    // No table yet is a database whose first child was killed before its CREATE TABLE was
    // durable: then nothing can have been acknowledged either.
    let table = db.table(TABLE).ok();
    let mut present: HashMap<i64, u32> = HashMap::new();
    let mut logical: HashMap<Provenance, u32> = HashMap::new();
    if let Some(table) = &table {
        if table.columns().len() != PAYLOAD + 1 {
            return Err(format!(
                "{} holds a table {TABLE} that the crash test did not create",
                dir.display()
            ));
        }
        let session = db.session();
        let rows = table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .map_err(|error| format!("cannot scan {TABLE}: {error}"))?;
        for row in rows {
            let row = row.map_err(|error| format!("scanning {TABLE} failed: {error}"))?;
            report.rows += 1;
            let Some(id) = row.get(ID).and_then(Value::as_i64) else {
                report.corrupt += 1;
                continue;
            };
            *present.entry(id).or_insert(0) += 1;
            ledger.high_water = ledger.high_water.max(id);
            match Provenance::of_row(&row) {
                Some((provenance, true)) => {
                    *logical.entry(provenance).or_insert(0) += 1;
                    if let Some(acked) = ledger.acked.get(&id) {
                        if *acked != provenance {
                            report.corrupt += 1;
                        }
                    } else {
                        report.unacked_present += 1;
                    }
                }
                _ => report.corrupt += 1,
            }
        }
    }
    let missing: Vec<i64> = ledger
        .acked
        .keys()
        .filter(|id| !present.contains_key(id))
        .copied()
        .collect();
    report.lost = missing.len() as u64;
    ledger.ever_lost.extend(missing);
    report.duplicates = present
        .values()
        .chain(logical.values())
        .map(|&count| u64::from(count.saturating_sub(1)))
        .sum();
    ledger.most_duplicates = ledger.most_duplicates.max(report.duplicates);
    // A rolled-back row is back if its provenance is in the table, whatever its identity value.
    report.rolled_back_present = ledger
        .rolled_back
        .iter()
        .filter(|(_, provenance)| logical.contains_key(provenance))
        .count() as u64;
    // Each transaction of the cycle is in the table whole or not at all, and an explicit one
    // only if its COMMIT was asked for: rows present without an acknowledgement are fine (the
    // kill can cut an acknowledgement off), but not part of a transaction, nor one that never
    // committed.
    for unit in &ledger.units {
        let present = (0..unit.count)
            .filter(|offset| {
                logical.contains_key(&Provenance {
                    seq: unit.first.seq + *offset as i64,
                    ..unit.first
                })
            })
            .count() as u64;
        if present > 0 && present < unit.count {
            report.partial += 1;
        }
        if present > 0 && unit.kind == UnitKind::Transaction && !unit.committing {
            report.uncommitted_present += 1;
        }
    }
    // Every page in use must belong to a tree: a page the crash (or the churning thread's
    // drops, see `churn`) left owned by nobody and not free would stay in the file for ever.
    let (ids, free) = (db.pool().page_count(), db.pool().free_page_count());
    (report.pages_in_use, report.free_pages) = (ids - free, free);
    report.integrity = match db.check_integrity() {
        Ok(checks) => {
            let owned: u64 = checks
                .iter()
                .flat_map(|table| &table.indexes)
                .map(|(_, tree)| tree.leaf_pages + tree.inner_pages + tree.spare_leaves)
                .sum();
            if owned == report.pages_in_use as u64 {
                "ok".to_owned()
            } else {
                format!(
                    "failed: {} pages are in use but the trees own {owned}",
                    report.pages_in_use
                )
            }
        }
        Err(error) => format!("failed: {error}"),
    };
    // Acknowledged values count toward the mark even if (wrongly) missing from the table.
    if let Some(&max_acked) = ledger.acked.keys().max() {
        ledger.high_water = ledger.high_water.max(max_acked);
    }
    drop(table);
    drop(db);
    Ok(report)
}

/// A summary of several counters, for tests: `cycles=K acked=N lost=L duplicates=D reused=R`
/// parsed back into its numbers.
#[cfg(test)]
fn parse_summary(line: &str) -> Option<std::collections::BTreeMap<String, u64>> {
    let mut fields = std::collections::BTreeMap::new();
    for field in line.split(' ') {
        let (name, value) = field.split_once('=')?;
        fields.insert(name.to_owned(), value.parse().ok()?);
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_tie_a_row_to_its_provenance() {
        let provenance = Provenance {
            run: 7,
            cycle: 2,
            thread: 3,
            seq: 41,
        };
        let mut row = vec![
            Value::BigInt(1),
            Value::BigInt(7),
            Value::Int(2),
            Value::Int(3),
            Value::BigInt(41),
            Value::String(provenance.payload()),
        ];
        assert_eq!(Provenance::of_row(&row), Some((provenance, true)));
        row[SEQ] = Value::BigInt(42);
        assert_eq!(
            Provenance::of_row(&row).map(|(_, ok)| ok),
            Some(false),
            "a row whose columns do not match its payload is caught"
        );
        assert!(provenance.payload().len() <= 100);
        assert_ne!(
            provenance.payload(),
            Provenance {
                seq: 42,
                ..provenance
            }
            .payload()
        );
    }

    #[test]
    fn lines_parse_and_garbage_is_caught() {
        assert!(matches!(parse_line("ready"), Event::Ready));
        assert!(matches!(
            parse_line("a 12 3 4"),
            Event::Ack(
                12,
                Provenance {
                    thread: 3,
                    seq: 4,
                    ..
                }
            )
        ));
        assert!(matches!(
            parse_line("r 9 1 2"),
            Event::RolledBack(
                9,
                Provenance {
                    thread: 1,
                    seq: 2,
                    ..
                }
            )
        ));
        assert!(matches!(parse_line("s 17"), Event::Seen(17)));
        let first = Provenance {
            run: 7,
            cycle: 2,
            thread: 3,
            seq: 40,
        };
        for (kind, line) in [
            (UnitKind::Batch, unit_line(UnitKind::Batch, &first, 5)),
            (
                UnitKind::Transaction,
                unit_line(UnitKind::Transaction, &first, 5),
            ),
        ] {
            match parse_line(line.trim_end()) {
                Event::Unit(parsed, Provenance { thread, seq, .. }, 5) => {
                    assert_eq!((parsed, thread, seq), (kind, 3, 40), "{line:?}");
                }
                _ => panic!("{line:?}"),
            }
        }
        assert!(matches!(
            parse_line(commit_line(&first).trim_end()),
            Event::Committing(Provenance {
                thread: 3,
                seq: 40,
                ..
            })
        ));
        for bad in [
            "",
            "a 1 2",
            "a x 2 3",
            "b 1",
            "b 1 2 0",
            "t 1 2",
            "t 1 2 3 4",
            "c 1",
            "c x 2",
            "a 1 2 3 4",
            "r",
            "r 9",
            "s",
            "s x",
            "s 1 2",
        ] {
            assert!(matches!(parse_line(bad), Event::Garbage(_)), "{bad:?}");
        }
    }

    #[test]
    fn a_torn_last_line_is_not_an_ack() {
        let (sender, receiver) = mpsc::channel();
        read_acks(&b"ready\na 1 0 0\na 2 0 1\na 3 0"[..], &sender);
        let events: Vec<Event> = receiver.try_iter().collect();
        let acks: Vec<i64> = events
            .iter()
            .filter_map(|event| match event {
                Event::Ack(id, _) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(acks, [1, 2]);
        assert!(matches!(events.last(), Some(Event::Eof)));
    }

    #[test]
    fn the_generator_is_seeded() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let mut rng = Rng::new(1);
        assert!(
            (0..1000)
                .map(|_| rng.unit())
                .all(|x| (0.0..1.0).contains(&x))
        );
    }

    #[test]
    fn summaries_parse() {
        let fields =
            parse_summary("cycles=2 acked=10 lost=0 duplicates=0 reused=0").expect("parses");
        assert_eq!(fields["acked"], 10);
        assert!(parse_summary("cycles=2 acked=ten").is_none());
    }
}
