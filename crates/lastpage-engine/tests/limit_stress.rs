//! Several sessions writing to a durable database at a low page limit
//! (`DatabaseOptions::max_pages`) over the fault-injecting file system, while checkpoints run
//! beside them, and then a power cut (`FaultyFileSystem::crash_with`) and a reopen.
//!
//! Each session owns its rows (an `Owner` column, and a key range of its own for the table
//! with caller-chosen keys), so that its oracle alone says what its rows must be: autocommit
//! inserts, multi-row batches, and explicit transactions that insert, update and delete and
//! then commit or roll back, into an identity table with a nonclustered index, a partitioned
//! table and a table keyed by the caller. Many statements are refused with `PoolFull` (which
//! changes nothing, and leaves an explicit transaction open and usable); rollbacks must put
//! back what they deleted even at the limit. After the crash every acknowledged commit is
//! there exactly once, nothing rolled back or refused is, the integrity check passes, and the
//! database reopens and takes writes. In some rounds the power goes while the sessions still
//! run: then each session's last unit of work (a statement or a transaction whose commit was
//! not acknowledged) may be there or not, but only whole.
//!
//! The test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`. `LASTPAGE_TEST_CASES=<n>`
//! runs `n` times as many rounds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, EngineError, IndexDef, InsertRow,
    KeyRange, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{CRASH_MODES, DIR, cases, seed};

/// Rounds per run at `LASTPAGE_TEST_CASES=1`, within a few seconds in CI.
const ROUNDS: usize = 8;

/// Units of work (statements or transactions) each session attempts per round.
const UNITS_PER_SESSION: usize = 400;

/// Partitions of `Parts`.
const PARTITIONS: u16 = 3;

/// The tables, by index in [`TABLES`]: `Orders` (identity clustered key, a nonclustered index
/// on `Tag`), `Parts` (identity, hash-partitioned on `Part`) and `Accounts` (keys the caller
/// chooses, in a range of its own per session).
const TABLES: [&str; 3] = ["Orders", "Parts", "Accounts"];

fn definitions() -> Vec<TableDef> {
    vec![
        TableDef::new("Orders")
            .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
            .column(ColumnDef::new("Owner", DataType::Int).not_null())
            .column(ColumnDef::new("Tag", DataType::Int).not_null())
            .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
            .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey))
            .nonclustered(IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique)),
        TableDef::new("Parts")
            .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
            .column(ColumnDef::new("Owner", DataType::Int).not_null())
            .column(ColumnDef::new("Tag", DataType::Int).not_null())
            .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
            .column(ColumnDef::new("Part", DataType::TinyInt).not_null())
            .clustered(IndexDef::new(
                "PK_Parts",
                &["Part", "Id"],
                Uniqueness::PrimaryKey,
            ))
            .partitioned("Part", PARTITIONS),
        TableDef::new("Accounts")
            .column(ColumnDef::new("Id", DataType::BigInt).not_null())
            .column(ColumnDef::new("Owner", DataType::Int).not_null())
            .column(ColumnDef::new("Tag", DataType::Int).not_null())
            .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
            .clustered(IndexDef::new(
                "PK_Accounts",
                &["Id"],
                Uniqueness::PrimaryKey,
            )),
    ]
}

/// A row's identity in the oracle: its table, its id (identity value or chosen key) and its
/// partition (`Parts`' partitioning column leads its clustered key; 0 elsewhere).
type RowId = (usize, i64, u8);

/// What an insert will make, before it runs: its row, its chosen key (`None` for an identity
/// table), its partition and its payload.
type Planned = (InsertRow, Option<i64>, u8, String);

/// What a session's rows hold: id -> payload.
type Rows = BTreeMap<RowId, String>;

fn options(fs: &FaultyFileSystem, max_pages: usize, budget_pages: usize) -> DatabaseOptions {
    DatabaseOptions {
        max_pages,
        memory_budget_bytes: budget_pages * 8192,
        // Small, so that automatic checkpoints race the sessions too.
        checkpoint_log_bytes: 512 << 10,
        ..common::options(fs)
    }
}

/// The clustered key of a row.
fn key_of((table, id, part): RowId) -> Vec<Value> {
    match table {
        1 => vec![Value::TinyInt(part), Value::BigInt(id)],
        _ => vec![Value::BigInt(id)],
    }
}

fn payload(rng: &mut StdRng, owner: i32, unit: usize) -> String {
    let len = match rng.random_range(0..10) {
        0..=6 => rng.random_range(20..200),
        7..=8 => rng.random_range(1000..3000),
        _ => rng.random_range(5000..7900),
    };
    let mut text = format!("{owner}:{unit}:");
    let fill = char::from(b'a' + (unit % 26) as u8);
    text.extend(std::iter::repeat_n(fill, len - text.len()));
    text
}

fn is_full(error: &EngineError) -> bool {
    matches!(error, EngineError::PoolFull(_))
}

/// One session's work and what it was told.
struct Worker {
    owner: i32,
    rng: StdRng,
    /// The rows of its acknowledged commits.
    committed: Rows,
    /// A unit of work whose outcome it was not told (the power went): its rows as they would
    /// be had it committed.
    in_doubt: Option<Rows>,
    /// The next key of its own range in `Accounts`.
    next_account: i64,
    refusals: u64,
    commits: u64,
    rollbacks: u64,
    /// Set before the power goes, so that every error after it is known to be the crash's.
    dead: Arc<AtomicBool>,
}

/// Why a unit of work stopped.
enum Stop {
    /// The database refused everything from now on (the power went).
    Dead,
}

impl Worker {
    fn insert_row(&mut self, table: usize, unit: usize) -> Planned {
        let text = payload(&mut self.rng, self.owner, unit);
        let tag = self.rng.random_range(0..50);
        let mut row = InsertRow::new()
            .set(1, self.owner)
            .set(2, tag)
            .set(3, text.clone());
        let mut id = None;
        let mut part = 0;
        match table {
            1 => {
                part = self.rng.random_range(0..PARTITIONS) as u8;
                row = row.set(4, i32::from(part));
            }
            2 => {
                let key = i64::from(self.owner) * 1_000_000_000 + self.next_account;
                self.next_account += 1;
                row = row.set(0, key);
                id = Some(key);
            }
            _ => {}
        }
        (row, id, part, text)
    }

    /// Runs one statement; `Ok(Some(..))` when it changed rows (`changes` applied to `rows`),
    /// `Ok(None)` when it was refused for want of a page, `Err` once the database is dead.
    fn statement(
        &mut self,
        tables: &[Arc<Table>],
        session: &lastpage_engine::Session,
        rows: &mut Rows,
        unit: usize,
    ) -> Result<Option<()>, Stop> {
        let table = self.rng.random_range(0..TABLES.len());
        let own: Vec<RowId> = rows.keys().filter(|id| id.0 == table).copied().collect();
        let result = match self.rng.random_range(0..10) {
            // An update changes the payload (growing or shrinking the row) and the indexed
            // tag, and now and then the clustered key: a row of `Parts` moves to another
            // partition, a row of `Accounts` to another key of its owner's range. A move is a
            // delete and an insert; if the insert is refused, the statement's rollback puts the
            // row back, which at the limit may need a page.
            0..=1 if !own.is_empty() => {
                let id = own[self.rng.random_range(0..own.len())];
                let text = payload(&mut self.rng, self.owner, unit);
                let tag = self.rng.random_range(0..50);
                let mut changes = vec![(2, Value::Int(tag)), (3, Value::from(text.clone()))];
                let mut moved = id;
                if self.rng.random_bool(0.4) {
                    match table {
                        1 => {
                            moved.2 = (id.2 + self.rng.random_range(1..PARTITIONS) as u8)
                                % PARTITIONS as u8;
                            changes.push((4, Value::TinyInt(moved.2)));
                        }
                        2 => {
                            moved.1 = i64::from(self.owner) * 1_000_000_000 + self.next_account;
                            self.next_account += 1;
                            changes.push((0, Value::BigInt(moved.1)));
                        }
                        _ => {}
                    }
                }
                tables[table]
                    .update(session, &key_of(id), &changes)
                    .map(|found| {
                        assert!(
                            found,
                            "owner {}: update of own row {id:?} found nothing",
                            self.owner
                        );
                        rows.remove(&id);
                        rows.insert(moved, text);
                    })
            }
            2..=3 if !own.is_empty() => {
                let id = own[self.rng.random_range(0..own.len())];
                tables[table].delete(session, &key_of(id)).map(|found| {
                    assert!(
                        found,
                        "owner {}: delete of own row {id:?} found nothing",
                        self.owner
                    );
                    rows.remove(&id);
                })
            }
            4..=5 => {
                let count = self.rng.random_range(2..30);
                let made: Vec<Planned> = (0..count).map(|_| self.insert_row(table, unit)).collect();
                let mut batch = Vec::with_capacity(made.len());
                let mut known = Vec::with_capacity(made.len());
                for (row, id, part, text) in made {
                    batch.push(row);
                    known.push((id, part, text));
                }
                tables[table].insert_batch(session, batch).map(|ids| {
                    for (identity, (id, part, text)) in ids.into_iter().zip(known) {
                        let id = identity.or(id).expect("an id");
                        assert!(
                            rows.insert((table, id, part), text).is_none(),
                            "id {id} twice"
                        );
                    }
                })
            }
            _ => {
                let (row, id, part, text) = self.insert_row(table, unit);
                tables[table].insert(session, row).map(|identity| {
                    let id = identity.or(id).expect("an id");
                    assert!(
                        rows.insert((table, id, part), text).is_none(),
                        "id {id} twice"
                    );
                })
            }
        };
        match result {
            Ok(()) => Ok(Some(())),
            Err(error) if is_full(&error) => {
                self.refusals += 1;
                Ok(None)
            }
            Err(error) => self.dead_or_panic(error),
        }
    }

    fn dead_or_panic<T>(&self, error: EngineError) -> Result<T, Stop> {
        match error {
            EngineError::LogFailed(_)
            | EngineError::DatabaseFailed(_)
            | EngineError::Storage(_)
                if self.dead.load(Ordering::SeqCst) =>
            {
                Err(Stop::Dead)
            }
            other => panic!("owner {}: unexpected error: {other}", self.owner),
        }
    }

    /// One unit of work: an autocommit statement, or an explicit transaction of a few
    /// statements that commits or rolls back.
    fn unit(
        &mut self,
        tables: &[Arc<Table>],
        session: &lastpage_engine::Session,
        unit: usize,
    ) -> Result<(), Stop> {
        if self.rng.random_range(0..3) > 0 {
            let mut rows = self.committed.clone();
            self.in_doubt = Some(rows.clone());
            if self.statement(tables, session, &mut rows, unit)?.is_some() {
                self.commits += 1;
                self.committed = rows;
            }
            self.in_doubt = None;
            return Ok(());
        }
        if let Err(error) = session.begin() {
            return self.dead_or_panic(error);
        }
        let mut rows = self.committed.clone();
        for _ in 0..self.rng.random_range(1..6) {
            // A refused statement changes nothing; the transaction goes on.
            if let Err(stop) = self.statement(tables, session, &mut rows, unit) {
                // The power went before the commit: nothing of it may be there.
                let _ = session.rollback();
                return Err(stop);
            }
        }
        if self.rng.random_bool(0.3) {
            if let Err(error) = session.rollback() {
                // A rollback that fails leaves nothing behind either: the next open undoes
                // the transaction, which has no commit record.
                return self.dead_or_panic(error);
            }
            self.rollbacks += 1;
            return Ok(());
        }
        self.in_doubt = Some(rows.clone());
        match session.commit() {
            Ok(()) => {
                self.commits += 1;
                self.committed = rows;
                self.in_doubt = None;
                Ok(())
            }
            Err(error) => self.dead_or_panic(error),
        }
    }
}

/// Every row of the database, by owner, after checking the tables' integrity and counts and
/// that each row is found by its key and through the nonclustered index.
fn contents(db: &Database, context: &str) -> BTreeMap<i32, Rows> {
    db.check_integrity()
        .unwrap_or_else(|error| panic!("{context}: integrity: {error}"));
    let session = db.session();
    let mut owners: BTreeMap<i32, Rows> = BTreeMap::new();
    for (number, name) in TABLES.iter().enumerate() {
        let table = db.table(name).unwrap();
        let mut count = 0u64;
        for direction in [Direction::Forward, Direction::Backward] {
            let mut seen = Vec::new();
            for row in table.scan(&session, &KeyRange::all(), direction).unwrap() {
                let row = row.unwrap_or_else(|error| panic!("{context}: scan {name}: {error}"));
                let (Value::BigInt(id), Value::Int(owner), Value::Int(tag), Value::String(text)) =
                    (&row[0], &row[1], &row[2], &row[3])
                else {
                    panic!("{context}: {name} row {row:?}")
                };
                seen.push(*id);
                if direction == Direction::Forward {
                    count += 1;
                    let part = match row.get(4) {
                        Some(Value::TinyInt(part)) => *part,
                        _ => 0,
                    };
                    let found = table
                        .get(&session, &key_of((number, *id, part)))
                        .unwrap()
                        .unwrap_or_else(|| panic!("{context}: {name} {id} not found by key"));
                    assert_eq!(found, row, "{context}: {name} {id} by key");
                    if number == 0 {
                        let by_tag = table
                            .get_by_index(&session, "IX_Tag", &[Value::Int(*tag)])
                            .unwrap();
                        assert!(
                            by_tag.contains(&row),
                            "{context}: {name} {id} not found through IX_Tag"
                        );
                    }
                    let rows = owners.entry(*owner).or_default();
                    assert!(
                        rows.insert((number, *id, part), text.clone()).is_none(),
                        "{context}: {name} {id} twice"
                    );
                }
            }
            // Partitioned scans merge their trees; within one table ids must be in key order
            // and distinct either way.
            if number != 1 {
                let mut sorted = seen.clone();
                sorted.sort_unstable();
                if direction == Direction::Backward {
                    sorted.reverse();
                }
                assert_eq!(seen, sorted, "{context}: {name} {direction:?} scan order");
            }
            assert_eq!(seen.len() as u64, count, "{context}: {name} scans disagree");
        }
        assert_eq!(table.row_count(), count, "{context}: {name} row count");
    }
    owners
}

fn run_round(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let max_pages = rng.random_range(12..60);
    let budget_pages = if rng.random_bool(0.5) {
        rng.random_range(4..40)
    } else {
        1 << 16
    };
    let sessions = rng.random_range(3..6);
    let crash_while_running = rng.random_bool(0.4);
    let mode = CRASH_MODES[rng.random_range(0..3)];
    let context = format!(
        "round seed {seed}: max_pages {max_pages}, budget {budget_pages} pages, {sessions} \
         sessions, crash {} ({mode:?})",
        if crash_while_running {
            "while running"
        } else {
            "after"
        }
    );
    let fs = FaultyFileSystem::new(FaultyConfig::new(rng.random()));
    let db = Database::open(DIR, options(&fs, max_pages, budget_pages)).unwrap();
    let mut tables = Vec::new();
    for definition in definitions() {
        tables.push(
            db.create_table(definition)
                .unwrap_or_else(|error| panic!("{context}: create: {error}")),
        );
    }
    let dead = Arc::new(AtomicBool::new(false));
    let checkpoints_stop = AtomicBool::new(false);
    let start = Barrier::new(sessions + 1);
    let (finished_units, units_done) = mpsc::channel::<()>();
    let mut after = None;
    let workers: Vec<Worker> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..sessions)
            .map(|owner| {
                let worker_seed = rng.random::<u64>();
                let (db, tables, dead, start) = (&db, &tables, dead.clone(), &start);
                let finished_units = finished_units.clone();
                scope.spawn(move || {
                    let mut worker = Worker {
                        owner: owner as i32,
                        rng: StdRng::seed_from_u64(worker_seed),
                        committed: Rows::new(),
                        in_doubt: None,
                        next_account: 0,
                        refusals: 0,
                        commits: 0,
                        rollbacks: 0,
                        dead,
                    };
                    let session = db.session();
                    start.wait();
                    for unit in 0..UNITS_PER_SESSION {
                        match worker.unit(tables, &session, unit) {
                            Ok(()) => {}
                            Err(Stop::Dead) => break,
                        }
                        if unit == UNITS_PER_SESSION / 2 {
                            let _ = finished_units.send(());
                        }
                    }
                    if session.in_transaction() {
                        let _ = session.rollback();
                    }
                    worker
                })
            })
            .collect();
        drop(finished_units);
        let checkpointer = {
            let (db, stop, dead) = (&db, &checkpoints_stop, dead.clone());
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match db.checkpoint() {
                        Ok(_) => {}
                        Err(_) if dead.load(Ordering::SeqCst) => break,
                        Err(error) => panic!("checkpoint: {error}"),
                    }
                    std::thread::yield_now();
                }
            })
        };
        start.wait();
        if crash_while_running {
            // Once every session is half way through, the power goes. The workers learn of it
            // from the errors that follow, and before that from the flag, which is set first so
            // that no error after the crash is taken for a bug.
            for _ in 0..sessions {
                let _ = units_done.recv();
            }
            dead.store(true, Ordering::SeqCst);
            after = Some(fs.crash_with(mode));
        }
        // Every worker is joined before a panic of one is passed on, and the checkpointer is
        // stopped first, so that a failure ends the round instead of leaving it waiting.
        let joined: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        if joined.iter().any(Result::is_err) {
            checkpoints_stop.store(true, Ordering::Relaxed);
        }
        let workers: Vec<Worker> = joined
            .into_iter()
            .map(|joined| joined.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect();
        if !crash_while_running {
            // A checkpoint may be under way when the power goes.
            dead.store(true, Ordering::SeqCst);
            after = Some(fs.crash_with(mode));
        }
        checkpoints_stop.store(true, Ordering::Relaxed);
        checkpointer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        workers
    });
    let refusals: u64 = workers.iter().map(|worker| worker.refusals).sum();
    let commits: u64 = workers.iter().map(|worker| worker.commits).sum();
    let rollbacks: u64 = workers.iter().map(|worker| worker.rollbacks).sum();
    println!("{context}: {commits} commits, {rollbacks} rollbacks, {refusals} refusals");
    drop(tables);
    drop(db);
    let after = after.expect("the power went");
    let db = Database::open(DIR, options(&after, max_pages, budget_pages))
        .unwrap_or_else(|error| panic!("{context}: open after the crash: {error}"));
    let found = contents(&db, &format!("{context}, after the crash"));
    for owner in found.keys() {
        assert!(
            (0..sessions as i32).contains(owner),
            "{context}: rows of unknown owner {owner}"
        );
    }
    for worker in &workers {
        let empty = Rows::new();
        let rows = found.get(&worker.owner).unwrap_or(&empty);
        let matches_doubt = worker.in_doubt.as_ref().is_some_and(|doubt| rows == doubt);
        if rows != &worker.committed && !matches_doubt {
            let missing: Vec<&RowId> = worker
                .committed
                .keys()
                .filter(|id| !rows.contains_key(id))
                .take(5)
                .collect();
            let extra: Vec<&RowId> = rows
                .keys()
                .filter(|id| !worker.committed.contains_key(id))
                .take(5)
                .collect();
            let changed = worker
                .committed
                .iter()
                .filter(|(id, text)| rows.get(id).is_some_and(|found| found != *text))
                .count();
            panic!(
                "{context}: owner {} has {} rows, its acknowledged commits {} (in doubt: {:?}); \
                 missing e.g. {missing:?}, extra e.g. {extra:?}, {changed} changed",
                worker.owner,
                rows.len(),
                worker.committed.len(),
                worker.in_doubt.as_ref().map(BTreeMap::len),
            );
        }
    }
    // The database takes writes again, and is held to its limit for new pages.
    assert_eq!(
        db.pool().max_pages(),
        max_pages,
        "{context}: the limit after the open"
    );
    let session = db.session();
    let orders = db.table("Orders").unwrap();
    match orders.insert(
        &session,
        InsertRow::new().set(1, 99).set(2, 1).set(3, "after"),
    ) {
        Ok(_) => {}
        Err(error) => assert!(is_full(&error), "{context}: insert after the open: {error}"),
    }
    db.checkpoint()
        .unwrap_or_else(|error| panic!("{context}: checkpoint after the open: {error}"));
    drop((orders, session));
    db.close()
        .unwrap_or_else(|error| panic!("{context}: close after the open: {error}"));
}

/// Aborts the process if `work` does not finish within `limit`: a hang would otherwise stall
/// CI with no message.
fn with_watchdog(limit: Duration, what: &str, work: impl FnOnce()) {
    let (done, finished) = mpsc::channel::<()>();
    let what = what.to_string();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
            eprintln!("{what}: no progress for {limit:?}; aborting (a hang)");
            std::process::abort();
        }
    });
    work();
    let _ = done.send(());
    watchdog.join().unwrap();
}

#[test]
fn sessions_at_the_page_limit_through_checkpoints_and_a_crash_keep_exactly_their_commits() {
    let seed = seed();
    for round in 0..cases(ROUNDS) as u64 {
        let round_seed = seed.wrapping_add(round.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        with_watchdog(
            Duration::from_secs(120),
            &format!("round seed {round_seed}"),
            || {
                if let Err(panic) = std::panic::catch_unwind(|| run_round(round_seed)) {
                    eprintln!("failed: seed {seed}, round {round} (round seed {round_seed})");
                    std::panic::resume_unwind(panic);
                }
            },
        );
    }
}
