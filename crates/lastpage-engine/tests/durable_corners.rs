//! Durability in the less-tested corners of a durable database, against a model of what was
//! acknowledged: heaps, non-unique clustered indexes (uniquifiers), hash-partitioned tables,
//! nonclustered indexes (unique and not), identity columns with other seeds and negative
//! increments, a table that is not logged, tables created and dropped, run-time index option
//! changes, explicit transactions (FULL, DELAYED, pipelined) with rollbacks and failed
//! statements, a transaction left open across checkpoints, explicit and automatic
//! checkpoints, small memory budgets (eviction), clean closes, and crashes at random points:
//! between statements (unsynced writes lost, applied or torn), at the n-th file operation of a
//! commit, flush or checkpoint, and during or right after recovery.
//!
//! The oracle: the log is one sequence, so a recovered database holds exactly the committed
//! transactions up to some point of that sequence, at or after the last one known durable (a
//! FULL commit or a ticket waited for, of a transaction that logged something; a flush, a
//! checkpoint, a schema change) and no later than the last commit attempted. Identity values
//! handed out are never handed out again.
//!
//! Randomized tests print their seed; rerun one with `LASTPAGE_SEED=<seed>`
//! (`LASTPAGE_CORNER_ROUNDS` sets how many rounds each runs).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lastpage_engine::ColumnDef;
use lastpage_engine::{
    CommitTicket, DataType, Database, DatabaseOptions, Direction, Durability, EngineError,
    IndexDef, InsertPath, InsertRow, KeyRange, Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultRule, FaultyConfig, FaultyFileSystem, FileSystem, PowerCut};
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{random_crash_mode, seed};

const DIR: &str = "/db";

/// What the randomized runs reached, to show that they reach it: reopens that found the last
/// durable state, a later one, one short of the last commit; power cuts during an open;
/// automatic checkpoints.
struct Coverage([AtomicU64; 6]);

impl Coverage {
    fn note(&self, what: usize) {
        self.0[what].fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self) -> String {
        let [durable, later, short, cut_open, automatic, faults] =
            self.0.each_ref().map(|n| n.load(Ordering::Relaxed));
        format!(
            "reopens at the last durable state {durable}, at a later one {later}, short of the \
             last commit {short}; power cuts during an open {cut_open}; pauses for the \
             automatic checkpointer {automatic}; statements failed by injected faults {faults}"
        )
    }
}

static COVERAGE: Coverage = Coverage([const { AtomicU64::new(0) }; 6]);

fn rounds(default: u64) -> u64 {
    std::env::var("LASTPAGE_CORNER_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// A file system that loses power at its n-th mutating operation (`lastpage_io::PowerCut`),
// and remembers whether a fault was injected into it.

#[derive(Debug, Clone)]
struct CutFs {
    cut: PowerCut,
    /// A fault (failed fsync, full disk) was injected: failures are expected from now on.
    faulted: Arc<AtomicBool>,
}

impl CutFs {
    fn new(inner: FaultyFileSystem) -> CutFs {
        CutFs {
            cut: PowerCut::new(inner),
            faulted: Arc::new(AtomicBool::new(false)),
        }
    }

    fn inner(&self) -> FaultyFileSystem {
        self.cut.inner().clone()
    }

    /// Cuts the power at the `n`-th mutating operation from now, in `mode`.
    fn arm(&self, n: u64, mode: CrashMode) {
        self.cut.arm(n, mode);
    }

    fn disarm(&self) {
        self.cut.disarm();
    }

    /// Cuts the power now (once), in `mode`.
    fn cut_now_in(&self, mode: CrashMode) {
        self.cut.cut_now(mode);
    }

    fn fired(&self) -> bool {
        self.cut.fired()
    }

    /// Injects `rule` into the file system: failures are expected from now on.
    fn inject(&self, rule: FaultRule) {
        self.faulted.store(true, Ordering::SeqCst);
        self.cut.inner().inject(rule);
    }

    fn faulted(&self) -> bool {
        self.faulted.load(Ordering::SeqCst)
    }

    fn after(&self) -> Option<FaultyFileSystem> {
        self.cut.after()
    }

    /// The file system the database runs on.
    fn file_system(&self) -> Arc<dyn FileSystem> {
        Arc::new(self.cut.clone())
    }
}

// ---------------------------------------------------------------------------------------------
// The tables.

/// The fixed tables: name, definition, and whether it is logged.
fn ids_table() -> TableDef {
    // IDENTITY(1000, 7) clustered, a non-unique and a unique nonclustered index.
    TableDef::new("Ids")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1000, 7))
        .column(ColumnDef::new("Grp", DataType::Int).not_null())
        .column(ColumnDef::new("Code", DataType::Int).not_null())
        .column(ColumnDef::new("Txt", DataType::VarChar(120)))
        .clustered(IndexDef::new("PK_Ids", &["Id"], Uniqueness::PrimaryKey))
        .nonclustered(IndexDef::new("IX_Ids_Grp", &["Grp"], Uniqueness::NonUnique))
        .nonclustered(IndexDef::new(
            "UX_Ids_Code",
            &["Code"],
            Uniqueness::UniqueIndex,
        ))
}

fn heap_table() -> TableDef {
    // A heap with a nonclustered index.
    TableDef::new("Heap")
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .column(ColumnDef::new("W", DataType::VarChar(200)).not_null())
        .nonclustered(IndexDef::new("IX_Heap_V", &["V"], Uniqueness::NonUnique))
}

fn dup_table() -> TableDef {
    // A non-unique clustered index (uniquifiers) and a descending INT identity.
    TableDef::new("Dup")
        .column(ColumnDef::new("Id", DataType::Int).identity(-5, -3))
        .column(ColumnDef::new("Grp", DataType::SmallInt).not_null())
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .clustered(IndexDef::new("CX_Dup", &["Grp"], Uniqueness::NonUnique))
}

fn part_table() -> TableDef {
    // Hash-partitioned on its key, with a nonclustered index.
    TableDef::new("Part")
        .column(ColumnDef::new("K", DataType::Int).not_null())
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .column(ColumnDef::new("Pad", DataType::VarChar(150)).not_null())
        .clustered(IndexDef::new("PK_Part", &["K"], Uniqueness::PrimaryKey))
        .nonclustered(IndexDef::new("IX_Part_V", &["V"], Uniqueness::NonUnique))
        .partitioned("K", 4)
}

fn tiny_table() -> TableDef {
    // A SMALLINT identity counting down by 2: small reservations, logged often.
    TableDef::new("Tiny")
        .column(ColumnDef::new("Id", DataType::SmallInt).identity(30_000, -2))
        .column(ColumnDef::new("Note", DataType::VarChar(20)))
        .clustered(IndexDef::new("PK_Tiny", &["Id"], Uniqueness::PrimaryKey))
}

/// The fixed tables that are logged, in the order a run creates them.
fn logged_tables() -> [TableDef; 5] {
    [
        ids_table(),
        heap_table(),
        dup_table(),
        part_table(),
        tiny_table(),
    ]
}

fn scratch_table() -> TableDef {
    TableDef::new("Scratch")
        .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .clustered(IndexDef::new("PK_Scratch", &["Id"], Uniqueness::PrimaryKey))
        .not_logged()
}

fn tmp_table(name: &str) -> TableDef {
    TableDef::new(name)
        .column(ColumnDef::new("Id", DataType::Int).not_null())
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .clustered(IndexDef::new(
            format!("PK_{name}"),
            &["Id"],
            Uniqueness::PrimaryKey,
        ))
}

const FIXED: [&str; 6] = ["Ids", "Heap", "Dup", "Part", "Tiny", "Scratch"];

/// Tables whose identity values are checked: name, column, increment.
const IDENTITIES: [(&str, usize, i64); 3] = [("Ids", 0, 7), ("Dup", 0, -3), ("Tiny", 0, -2)];

// ---------------------------------------------------------------------------------------------
// The model.

/// Rows by their text (values have no order of their own), each with its count.
type Rows = BTreeMap<String, (Vec<Value>, usize)>;

fn row_key(row: &[Value]) -> String {
    format!("{row:?}")
}

/// Every table's rows (a multiset: heaps and non-unique clustered keys may repeat rows).
#[derive(Clone, Debug, Default, PartialEq)]
struct State {
    tables: BTreeMap<String, Rows>,
}

impl State {
    fn rows(&mut self, table: &str) -> &mut Rows {
        self.tables
            .get_mut(table)
            .unwrap_or_else(|| panic!("no table {table} in the model"))
    }

    fn add(&mut self, table: &str, row: Vec<Value>) {
        self.rows(table)
            .entry(row_key(&row))
            .or_insert_with(|| (row, 0))
            .1 += 1;
    }

    fn remove(&mut self, table: &str, row: &[Value]) {
        let rows = self.rows(table);
        let key = row_key(row);
        let (_, count) = rows
            .get_mut(&key)
            .unwrap_or_else(|| panic!("model: no row {row:?} in {table}"));
        *count -= 1;
        if *count == 0 {
            rows.remove(&key);
        }
    }

    /// The state with the table that is not logged left out (a crash empties it).
    fn logged_part(&self) -> State {
        let mut state = self.clone();
        state.tables.remove("Scratch");
        state
    }
}

/// What the run must find after a crash.
struct Model {
    /// The state with every commit applied (what the next commit builds on).
    current: State,
    /// The state as of the last point known durable.
    durable: State,
    /// The state after each later commit (each may or may not survive a crash), in log order.
    maybe: Vec<State>,
    /// The farthest identity value handed out per table (in the increment's direction).
    farthest_identity: BTreeMap<&'static str, i64>,
    /// Every identity value handed out per table.
    identities: BTreeMap<&'static str, BTreeSet<i64>>,
    /// A counter for fresh keys and values.
    next_number: i32,
    /// Keys of `Part` locked by the open loser transaction (other statements keep off them).
    loser_keys: BTreeSet<i32>,
    /// How many temporary tables were made.
    tmp_made: u32,
    /// Tables whose create or drop failed (outcome unknown), and index options whose change
    /// failed: the next open shows which.
    uncertain_tables: BTreeSet<String>,
    uncertain_options: BTreeSet<(String, String)>,
    /// Autocommit statements whose outcome is unknown, each with the candidate state (0: the
    /// durable one, i: `maybe[i - 1]`) it would have applied to.
    unknown: Vec<(usize, Op)>,
}

/// A statement's change, known before it runs.
#[derive(Clone, Debug)]
enum Op {
    /// Rows to insert (the identity column, if any, holds 0: its values are not known).
    Insert {
        table: String,
        rows: Vec<Vec<Value>>,
    },
    Update {
        table: String,
        old: Vec<Value>,
        new: Vec<Value>,
    },
    Delete {
        table: String,
        old: Vec<Value>,
    },
}

impl Op {
    /// `state` with the change applied as `found` shows it (the identity values of inserted
    /// rows are taken from `found`), if `found` can be that.
    fn apply(&self, state: &State, found: &State) -> Option<State> {
        let mut state = state.clone();
        match self {
            Op::Insert { table, rows } => {
                let before = state.tables.get(table)?;
                let after = found.tables.get(table)?;
                let mut extra: Vec<Vec<Value>> = Vec::new();
                for (key, (row, n)) in after {
                    let had = before.get(key).map_or(0, |(_, n)| *n);
                    if *n < had {
                        return None;
                    }
                    extra.extend(std::iter::repeat_n(row.clone(), n - had));
                }
                if extra.len() != rows.len() {
                    return None;
                }
                let identity = IDENTITIES.iter().any(|(name, ..)| name == table);
                let blank = |row: &Vec<Value>| {
                    let mut row = row.clone();
                    if identity {
                        row[0] = Value::Null;
                    }
                    row_key(&row)
                };
                let mut want: Vec<String> = rows.iter().map(blank).collect();
                let mut got: Vec<String> = extra.iter().map(blank).collect();
                want.sort();
                got.sort();
                if want != got {
                    return None;
                }
                for row in extra {
                    state.add(table, row);
                }
            }
            Op::Update { table, old, new } => {
                state.tables.get(table)?.get(&row_key(old))?;
                state.remove(table, old);
                state.add(table, new.clone());
            }
            Op::Delete { table, old } => {
                state.tables.get(table)?.get(&row_key(old))?;
                state.remove(table, old);
            }
        }
        Some(state)
    }
}

impl Model {
    fn new() -> Model {
        let mut state = State::default();
        for name in FIXED {
            state.tables.insert(name.to_string(), Rows::new());
        }
        Model {
            current: state.clone(),
            durable: state,
            maybe: Vec::new(),
            farthest_identity: BTreeMap::new(),
            identities: BTreeMap::new(),
            next_number: 0,
            loser_keys: BTreeSet::new(),
            tmp_made: 0,
            uncertain_tables: BTreeSet::new(),
            uncertain_options: BTreeSet::new(),
            unknown: Vec::new(),
        }
    }

    fn number(&mut self) -> i32 {
        self.next_number += 1;
        self.next_number
    }

    /// A commit that may or may not survive a crash.
    fn committed_maybe(&mut self, state: State) {
        self.current = state.clone();
        self.maybe.push(state);
    }

    /// Everything committed so far is durable.
    fn all_durable(&mut self) {
        self.durable = self.current.clone();
        self.maybe.clear();
        self.unknown.clear();
    }

    /// Notes an identity value handed out: it must never have been handed out before, across
    /// crashes too. (Values are not handed out in order: single rows take theirs from a
    /// sequence lane's block, batches from the counter.)
    fn handed_out(&mut self, table: &str, id: i64) {
        let Some(&(name, _, increment)) = IDENTITIES.iter().find(|(name, ..)| *name == table)
        else {
            return;
        };
        assert!(
            self.identities.entry(name).or_default().insert(id),
            "{table}: identity {id} handed out twice"
        );
        let farthest = self.farthest_identity.entry(name).or_insert(id);
        if (increment > 0 && id > *farthest) || (increment < 0 && id < *farthest) {
            *farthest = id;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading a database.

fn snapshot(db: &Database) -> Result<State, String> {
    let session = db.session();
    let mut state = State::default();
    for table in db.tables() {
        let mut rows = Rows::new();
        for row in common::try_rows(&table, &session)? {
            rows.entry(row_key(&row)).or_insert_with(|| (row, 0)).1 += 1;
        }
        let count: usize = rows.values().map(|(_, n)| n).sum();
        if count as u64 != table.row_count() {
            return Err(format!(
                "{}: {count} rows scanned, row_count says {}",
                table.name(),
                table.row_count()
            ));
        }
        state.tables.insert(table.name().to_string(), rows);
    }
    Ok(state)
}

/// The first four rows of `rows` (values and count) that `other` does not hold as many times.
fn first_not_in<'a>(rows: &'a Rows, other: &Rows) -> Vec<&'a (Vec<Value>, usize)> {
    rows.iter()
        .filter(|(row, n)| other.get(*row) != Some(n))
        .map(|(_, n)| n)
        .take(4)
        .collect()
}

fn describe_difference(found: &State, expected: &State) -> String {
    let mut out = String::new();
    let names: BTreeSet<&String> = found.tables.keys().chain(expected.tables.keys()).collect();
    for name in names {
        match (found.tables.get(name), expected.tables.get(name)) {
            (Some(f), Some(e)) if f == e => {}
            (Some(f), Some(e)) => {
                let missing = first_not_in(e, f);
                let extra = first_not_in(f, e);
                out += &format!(
                    "\n  {name}: {} rows, expected {}; expected {missing:?}; found {extra:?}",
                    f.values().map(|(_, n)| n).sum::<usize>(),
                    e.values().map(|(_, n)| n).sum::<usize>()
                );
            }
            (f, e) => {
                out += &format!(
                    "\n  {name}: found {:?}, expected {:?}",
                    f.is_some(),
                    e.is_some()
                )
            }
        }
    }
    out
}

/// Checks the nonclustered indexes against the rows for a few keys.
fn check_indexes(db: &Database, state: &State) -> Result<(), String> {
    let session = db.session();
    let lookups: [(&str, &str, usize); 4] = [
        ("Ids", "IX_Ids_Grp", 1),
        ("Ids", "UX_Ids_Code", 2),
        ("Heap", "IX_Heap_V", 0),
        ("Part", "IX_Part_V", 1),
    ];
    for (table_name, index, column) in lookups {
        let table = db.table(table_name).map_err(|e| e.to_string())?;
        let rows = &state.tables[table_name];
        let mut values: Vec<&Value> = Vec::new();
        for (row, _) in rows.values() {
            if values.len() < 6 && !values.contains(&&row[column]) {
                values.push(&row[column]);
            }
        }
        for value in values {
            let want = rows
                .values()
                .filter(|(row, _)| &row[column] == value)
                .map(|(_, n)| n)
                .sum::<usize>();
            let got = table
                .get_by_index(&session, index, std::slice::from_ref(value))
                .map_err(|e| format!("{index} lookup: {e}"))?
                .len();
            if want != got {
                return Err(format!("{index} = {value:?}: {got} rows, expected {want}"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The run.

struct Config {
    durability: Durability,
    memory_pages: usize,
    checkpoint_log_bytes: u64,
    flush_interval: Duration,
    segment_bytes: u64,
}

fn options(fs: Arc<dyn FileSystem>, config: &Config) -> DatabaseOptions {
    DatabaseOptions {
        file_system: Some(fs),
        durability: config.durability,
        memory_budget_bytes: config.memory_pages * 8192,
        checkpoint_log_bytes: config.checkpoint_log_bytes,
        delayed_flush_interval: config.flush_interval,
        lock_timeout: Some(Duration::from_secs(5)),
        wal: WalConfig {
            buffer_bytes: 1 << 20,
            segment_bytes: config.segment_bytes,
            ..WalConfig::default()
        },
        ..DatabaseOptions::default()
    }
}

/// A statement or transaction end failed: `Ok` if it failed because the power was cut (the
/// run ends there), else the failure.
fn failed(cut: &CutFs, what: &str, error: EngineError) -> Result<(), String> {
    if cut.faulted() && !cut.fired() {
        COVERAGE.note(5);
        let message = error.to_string();
        if message.trim().is_empty() {
            return Err(format!("{what} failed without a message"));
        }
    }
    if cut.fired() || cut.faulted() {
        Ok(())
    } else {
        Err(format!("{what}: {error}"))
    }
}

/// How a cycle ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// The power goes between statements.
    Crash(CrashMode),
    /// The power goes at a file operation of a commit, flush or checkpoint.
    Cut(CrashMode),
    /// A clean close.
    Close,
    /// A failed fsync or a full disk, more work, then the process goes (`None`: without a
    /// crash, so the next open sees the page cache) or the power (`Some`).
    Fault(Option<CrashMode>),
}

/// The text column of a new row of `table` (random lengths, so that pages split unevenly).
fn text_for(table: &str, number: i32, rng: &mut StdRng) -> String {
    match table {
        "Ids" => format!("ids {number} {}", "i".repeat(rng.random_range(0..100))),
        "Heap" => format!("heap {number} {}", "h".repeat(rng.random_range(0..180))),
        "Part" => format!("part {number} {}", "p".repeat(rng.random_range(0..130))),
        "Tiny" => format!("t{number}"),
        _ => String::new(),
    }
}

/// A new row of `table`, made from a fresh number and its text.
fn insert_row(table: &str, number: i32, text: &str) -> InsertRow {
    match table {
        "Ids" => InsertRow::new()
            .set(1, number % 13)
            .set(2, number)
            .set(3, text.to_string()),
        "Heap" => InsertRow::new().set(0, number % 7).set(1, text.to_string()),
        "Dup" => InsertRow::new().set(1, (number % 5) as i16).set(2, number),
        "Part" => InsertRow::new()
            .set(0, number)
            .set(1, number % 11)
            .set(2, text.to_string()),
        "Tiny" => InsertRow::new().set(1, text.to_string()),
        "Scratch" => InsertRow::new().set(1, number),
        _ => InsertRow::new().set(0, number).set(1, number % 3),
    }
}

/// The row the table holds after inserting `insert_row(table, number, text)` with identity
/// value `id`.
fn expected_row(table: &str, number: i32, id: Option<i64>, text: &str) -> Vec<Value> {
    match table {
        "Ids" => vec![
            Value::BigInt(id.unwrap()),
            Value::Int(number % 13),
            Value::Int(number),
            Value::String(text.to_string()),
        ],
        "Heap" => vec![Value::Int(number % 7), Value::String(text.to_string())],
        "Dup" => vec![
            Value::Int(id.unwrap() as i32),
            Value::SmallInt((number % 5) as i16),
            Value::Int(number),
        ],
        "Part" => vec![
            Value::Int(number),
            Value::Int(number % 11),
            Value::String(text.to_string()),
        ],
        "Tiny" => vec![
            Value::SmallInt(id.unwrap() as i16),
            Value::String(text.to_string()),
        ],
        "Scratch" => vec![Value::Int(id.unwrap() as i32), Value::Int(number)],
        _ => vec![Value::Int(number), Value::Int(number % 3)],
    }
}

/// Index options per (table, index), as the model expects them.
type Options = BTreeMap<(String, String), (InsertPath, bool)>;

/// Notes in `options` the options each index of the new table `name` starts with.
fn note_options(options: &mut Options, name: &str, table: &Table) {
    for (index, trees) in table.trees() {
        let o = trees[0].options();
        options.insert(
            (name.to_string(), index.to_string()),
            (o.insert_path, o.optimize_for_sequential_key),
        );
    }
}

fn index_options(db: &Database) -> Options {
    let mut options = Options::new();
    for table in db.tables() {
        for (index, trees) in table.trees() {
            let first = trees[0].options();
            for tree in trees {
                assert_eq!(tree.options(), first, "{index}: partitions disagree");
            }
            options.insert(
                (table.name().to_string(), index.to_string()),
                (first.insert_path, first.optimize_for_sequential_key),
            );
        }
    }
    options
}

/// Creates the fixed tables (the logged ones, then `Scratch`) in `db` and returns their options.
fn create_fixed_tables(db: &Database) -> Result<Options, String> {
    let mut options = Options::new();
    for definition in logged_tables().into_iter().chain([scratch_table()]) {
        let table = db.create_table(definition).map_err(|e| e.to_string())?;
        note_options(&mut options, table.name(), &table);
    }
    Ok(options)
}

/// One database lifetime's driver.
struct Run {
    rng: StdRng,
    m: Model,
    options: Options,
    config: Config,
    cut: CutFs,
    db: Database,
    s: Session,
    /// The loser: a transaction left open until the crash or close, outside the model.
    loser: Option<Session>,
    /// Commits so far, numbering the model's `maybe` states and the tickets.
    commits: u64,
    /// The commit number of each state in `m.maybe`.
    maybe_commits: Vec<u64>,
    /// Pipelined commits not yet waited for: the commit's number, whether the transaction
    /// logged anything, and its ticket.
    tickets: Vec<(u64, bool, CommitTicket)>,
    log: Vec<String>,
    /// The statement in progress, if it may change rows.
    pending_op: Option<Op>,
}

type Step = Result<(), String>;

/// A key to update or delete by, and the row it reaches first.
type KeyAndRow = (Vec<Value>, Vec<Value>);

impl Run {
    /// A driver of one lifetime of `db` (opened through `cut` with `config`), carrying the
    /// model and the tables' options on from the lifetime before, with nothing committed,
    /// pending or logged in this one yet.
    fn new(
        rng_seed: u64,
        m: Model,
        options: Options,
        config: &Config,
        cut: &CutFs,
        db: &Database,
    ) -> Run {
        Run {
            rng: StdRng::seed_from_u64(rng_seed),
            m,
            options,
            config: Config { ..*config },
            cut: cut.clone(),
            db: db.clone(),
            s: db.session(),
            loser: None,
            commits: 0,
            maybe_commits: Vec::new(),
            tickets: Vec::new(),
            log: Vec::new(),
            pending_op: None,
        }
    }

    fn table(&self, name: &str) -> Arc<Table> {
        self.db.table(name).unwrap()
    }

    fn note(&mut self, what: String) {
        self.log.push(what);
        if self.log.len() > 40 {
            self.log.remove(0);
        }
    }

    /// A commit that is durable only if something flushes it later.
    fn commit_maybe(&mut self, state: State) {
        self.commits += 1;
        self.m.committed_maybe(state);
        self.maybe_commits.push(self.commits);
    }

    fn commit_durable(&mut self, state: State) {
        self.commits += 1;
        self.m.current = state;
        self.m.all_durable();
        self.maybe_commits.clear();
    }

    /// Settles a CREATE or DROP TABLE of `name`, whose change the model already holds if it
    /// succeeded: then the model counts it durable, with everything before it, as a schema
    /// change is once it returns; after a failure the table may or may not be there.
    fn table_changed(
        &mut self,
        name: String,
        what: &str,
        result: Result<(), EngineError>,
    ) -> Result<(), String> {
        match result {
            Ok(()) => {
                let current = self.m.current.clone();
                self.commit_durable(current);
                Ok(())
            }
            Err(error) => {
                self.m.uncertain_tables.insert(name);
                failed(&self.cut, what, error)
            }
        }
    }

    /// Every commit up to number `commit` is durable.
    fn durable_up_to(&mut self, commit: u64) {
        while let Some(&first) = self.maybe_commits.first()
            && first <= commit
        {
            self.maybe_commits.remove(0);
            self.m.durable = self.m.maybe.remove(0);
            self.m.unknown.retain_mut(|(at, _)| {
                *at = at.wrapping_sub(1);
                *at != usize::MAX
            });
        }
    }

    fn all_durable(&mut self) {
        self.m.all_durable();
        self.maybe_commits.clear();
    }

    /// Picks a table that rows can be written to now.
    fn pick_table(&mut self, working: &State) -> String {
        let names: Vec<&String> = working.tables.keys().collect();
        names[self.rng.random_range(0..names.len())].clone()
    }

    /// One write statement in `session`, applied to `working` if it succeeds. Returns whether
    /// it logged something (a change to a logged table).
    fn statement(&mut self, working: &mut State) -> Result<bool, EngineError> {
        self.pending_op = None;
        let result = self.statement_in(working);
        if result.is_ok() {
            self.pending_op = None;
        }
        result
    }

    fn statement_in(&mut self, working: &mut State) -> Result<bool, EngineError> {
        let table_name = self.pick_table(working);
        let table = self.table(&table_name);
        let logged = table_name != "Scratch";
        let choice = self.rng.random_range(0..100);
        if choice < 40 || working.tables[&table_name].is_empty() {
            // Insert one row or a batch.
            let count = if self.rng.random_bool(0.5) {
                1
            } else {
                self.rng.random_range(2..60)
            };
            return self.insert(&table_name, count, working);
        }
        if choice < 47 && table_name == "Part" {
            // A batch whose last row repeats an existing key fails whole.
            let existing: Vec<i32> = working.tables["Part"]
                .values()
                .filter_map(|(row, _)| match row[0] {
                    Value::Int(k) if !self.m.loser_keys.contains(&k) => Some(k),
                    _ => None,
                })
                .collect();
            if let Some(&dup) = existing.first() {
                let mut rows: Vec<InsertRow> = (0..self.rng.random_range(1..30))
                    .map(|_| {
                        let number = self.m.number();
                        insert_row("Part", number, "doomed")
                    })
                    .collect();
                rows.push(insert_row("Part", dup, "doomed"));
                match table.insert_batch(&self.s, rows) {
                    Err(EngineError::DuplicateKey { .. }) => {}
                    Err(error) if self.cut.fired() || self.cut.faulted() => return Err(error),
                    other => panic!("a batch with a duplicate key: {:?}", other.map(|_| ())),
                }
                self.note("failed batch into Part".into());
                return Ok(false);
            }
        }
        // Update or delete one row: find the row the key reaches first.
        let Some((key, row)) = self.target(&table_name, &table, working)? else {
            return Ok(false);
        };
        if choice < 75 {
            let (changes, new_row) = self.changes(&table_name, &row);
            self.pending_op = Some(Op::Update {
                table: table_name.clone(),
                old: row.clone(),
                new: new_row.clone(),
            });
            let found = table.update(&self.s, &key, &changes)?;
            assert!(found, "update of {table_name} {key:?} found no row");
            working.remove(&table_name, &row);
            working.add(&table_name, new_row);
            self.note(format!("update {table_name} {key:?} {changes:?}"));
        } else {
            self.pending_op = Some(Op::Delete {
                table: table_name.clone(),
                old: row.clone(),
            });
            let found = table.delete(&self.s, &key)?;
            assert!(found, "delete of {table_name} {key:?} found no row");
            working.remove(&table_name, &row);
            self.note(format!("delete {table_name} {key:?}"));
        }
        Ok(logged)
    }

    /// Inserts `count` new rows into `table_name` (one by `insert`, more by `insert_batch`),
    /// applied to `working` if it succeeds. Returns whether it logged something.
    fn insert(
        &mut self,
        table_name: &str,
        count: usize,
        working: &mut State,
    ) -> Result<bool, EngineError> {
        let table = self.table(table_name);
        let logged = table_name != "Scratch";
        let mut made = Vec::new();
        for _ in 0..count {
            let number = self.m.number();
            let text = text_for(table_name, number, &mut self.rng);
            made.push((number, text));
        }
        self.pending_op = Some(Op::Insert {
            table: table_name.to_string(),
            rows: made
                .iter()
                .map(|(number, text)| expected_row(table_name, *number, Some(0), text))
                .collect(),
        });
        let ids = if count == 1 {
            let (number, text) = &made[0];
            vec![table.insert(&self.s, insert_row(table_name, *number, text))?]
        } else {
            let rows = made
                .iter()
                .map(|(number, text)| insert_row(table_name, *number, text))
                .collect();
            table.insert_batch(&self.s, rows)?
        };
        for ((number, text), id) in made.iter().zip(ids) {
            if let Some(id) = id {
                self.m.handed_out(table_name, id);
            }
            working.add(table_name, expected_row(table_name, *number, id, text));
        }
        self.note(format!("insert {count} into {table_name}"));
        Ok(logged)
    }

    /// A key of `table` to update or delete, and the row it reaches first.
    fn target(
        &mut self,
        name: &str,
        table: &Table,
        working: &State,
    ) -> Result<Option<KeyAndRow>, EngineError> {
        let rows: Vec<&Vec<Value>> = working.tables[name]
            .values()
            .map(|(row, _)| row)
            .filter(|row| {
                !(name == "Part"
                    && matches!(row[0], Value::Int(k) if self.m.loser_keys.contains(&k)))
            })
            .collect();
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows[self.rng.random_range(0..rows.len())].clone();
        let key = match name {
            "Heap" => Vec::new(),
            "Dup" => vec![row[1].clone()],
            "Ids" | "Tiny" | "Scratch" | "Part" => vec![row[0].clone()],
            _ => vec![row[0].clone()],
        };
        if name == "Heap" || name == "Dup" {
            // The first row of the key in key order (what update and delete reach).
            let range = if key.is_empty() {
                KeyRange::all()
            } else {
                KeyRange {
                    lower: Bound::Included(key.clone()),
                    upper: Bound::Included(key.clone()),
                }
            };
            let first = table
                .scan(&self.s, &range, Direction::Forward)?
                .next()
                .expect("a row of the key")?;
            return Ok(Some((key, first)));
        }
        Ok(Some((key, row)))
    }

    /// Changes to make to `row` of `table`, and the row after them.
    fn changes(&mut self, table: &str, row: &[Value]) -> (Vec<(usize, Value)>, Vec<Value>) {
        let number = self.m.number();
        let mut new_row = row.to_vec();
        let mut changes = Vec::new();
        let mut set = |column: usize, value: Value, changes: &mut Vec<(usize, Value)>| {
            new_row[column] = value.clone();
            changes.push((column, value));
        };
        match table {
            "Ids" => {
                set(1, Value::Int(number % 13), &mut changes);
                if self.rng.random_bool(0.3) {
                    set(2, Value::Int(number), &mut changes);
                }
                let text = text_for("Ids", number, &mut self.rng);
                set(3, Value::String(text), &mut changes);
            }
            "Heap" => {
                set(0, Value::Int(number % 7), &mut changes);
                let text = text_for("Heap", number, &mut self.rng);
                set(1, Value::String(text), &mut changes);
            }
            "Dup" => {
                if self.rng.random_bool(0.4) {
                    set(1, Value::SmallInt((number % 5) as i16), &mut changes);
                }
                set(2, Value::Int(number), &mut changes);
            }
            "Part" => {
                if self.rng.random_bool(0.3) {
                    set(0, Value::Int(number), &mut changes);
                }
                set(1, Value::Int(number % 11), &mut changes);
                let text = text_for("Part", number, &mut self.rng);
                set(2, Value::String(text), &mut changes);
            }
            "Tiny" => set(1, Value::String(format!("u{number}")), &mut changes),
            _ => set(1, Value::Int(number), &mut changes),
        }
        (changes, new_row)
    }

    /// An autocommit statement.
    fn autocommit(&mut self) -> Step {
        self.autocommit_of(Self::statement)
    }

    /// Runs `statement` (a statement as [`Run::statement`] makes one) as an autocommit
    /// statement.
    fn autocommit_of(
        &mut self,
        statement: impl FnOnce(&mut Run, &mut State) -> Result<bool, EngineError>,
    ) -> Step {
        let mut working = self.m.current.clone();
        // A statement that fails before it names its change leaves no older one behind.
        self.pending_op = None;
        match statement(self, &mut working) {
            Ok(logged) => {
                if logged && self.config.durability == Durability::Full {
                    self.commit_durable(working);
                } else {
                    self.commit_maybe(working);
                }
                Ok(())
            }
            Err(error) => {
                // The outcome is unknown (the power went during its commit, or the log failed
                // after its records were written): the statement may have taken effect on top
                // of the last commit.
                if let Some(op) = self.pending_op.take() {
                    self.m.unknown.push((self.m.maybe.len(), op));
                }
                failed(&self.cut, "autocommit statement", error)
            }
        }
    }

    /// An explicit transaction: begin, statements, and an end.
    fn transaction(&mut self, final_end: bool) -> Step {
        let durability = if self.rng.random_bool(0.5) {
            Durability::Full
        } else {
            Durability::Delayed
        };
        if let Err(error) = self.s.begin_with(durability) {
            return failed(&self.cut, "begin", error);
        }
        let mut working = self.m.current.clone();
        let mut logged = false;
        for _ in 0..self.rng.random_range(1..8) {
            match self.statement(&mut working) {
                Ok(did) => logged |= did,
                Err(error) => {
                    let _ = self.s.rollback();
                    return failed(&self.cut, "statement in a transaction", error);
                }
            }
        }
        let end = if final_end {
            0
        } else {
            self.rng.random_range(0..100)
        };
        if end < 60 {
            self.note(format!("commit {durability:?}"));
            match self.s.commit() {
                Ok(()) if logged && durability == Durability::Full => self.commit_durable(working),
                Ok(()) => self.commit_maybe(working),
                Err(error) => {
                    self.commit_maybe(working);
                    return failed(&self.cut, "commit", error);
                }
            }
        } else if end < 80 {
            self.note("rollback".into());
            if let Err(error) = self.s.rollback() {
                return failed(&self.cut, "rollback", error);
            }
        } else {
            return self.commit_pipelined(working, logged);
        }
        Ok(())
    }

    /// Commits the explicit transaction with a pipelined commit and keeps its ticket. The
    /// transaction leaves `working`, and logged something if `logged`.
    fn commit_pipelined(&mut self, working: State, logged: bool) -> Step {
        self.note("pipelined commit".into());
        match self.s.commit_pipelined() {
            Ok(ticket) => {
                self.commit_maybe(working);
                self.tickets.push((self.commits, logged, ticket));
                Ok(())
            }
            Err(error) => {
                self.commit_maybe(working);
                failed(&self.cut, "pipelined commit", error)
            }
        }
    }

    fn wait_ticket(&mut self) -> Step {
        if self.tickets.is_empty() {
            return Ok(());
        }
        let index = self.rng.random_range(0..self.tickets.len());
        if self.rng.random_bool(0.3) {
            // Dropped unwaited: a DELAYED commit.
            drop(self.tickets.remove(index));
            return Ok(());
        }
        self.wait_ticket_at(index)
    }

    /// Waits for the ticket at `index` of `tickets`.
    fn wait_ticket_at(&mut self, index: usize) -> Step {
        let (commit, logged, ticket) = self.tickets.remove(index);
        match ticket.wait() {
            // A transaction that logged nothing (it changed only the table that is not logged)
            // wrote no commit record, and its ticket has nothing to wait for: its wait returns
            // at once and flushes nothing (`CommitTicket::wait`), so it makes no earlier
            // DELAYED commit durable. A FULL commit that logged nothing waits for no flush
            // either (see `transaction`); PostgreSQL's commit of a transaction that wrote no
            // WAL does not flush either. The commit itself has nothing a crash could lose but
            // its changes to the table that is not logged, which a crash empties anyway.
            Ok(()) if logged => {
                self.durable_up_to(commit);
                Ok(())
            }
            Ok(()) => Ok(()),
            Err(error) => failed(&self.cut, "ticket wait", error),
        }
    }

    /// A loser transaction: opened once, left open until the crash or close.
    fn loser_work(&mut self) -> Step {
        let loser = match self.loser.take() {
            Some(loser) => loser,
            None => {
                let loser = self.db.session();
                if let Err(error) = loser.begin() {
                    return failed(&self.cut, "loser begin", error);
                }
                loser
            }
        };
        let result = (|| -> Result<(), EngineError> {
            // Not Heap or Dup: other statements scan those for the row a key reaches first,
            // and would wait for the loser's locks.
            for name in ["Ids", "Tiny", "Part"] {
                let number = self.m.number();
                let text = text_for(name, number, &mut self.rng);
                let id = self
                    .table(name)
                    .insert(&loser, insert_row(name, number, &text))?;
                if let Some(id) = id {
                    self.m.handed_out(name, id);
                }
                if name == "Part" {
                    self.m.loser_keys.insert(number);
                }
            }
            // Change and delete committed rows of Part.
            let keys: Vec<i32> = self.m.current.tables["Part"]
                .values()
                .filter_map(|(row, _)| match row[0] {
                    Value::Int(k) if !self.m.loser_keys.contains(&k) => Some(k),
                    _ => None,
                })
                .take(2)
                .collect();
            if let Some(&k) = keys.first() {
                self.m.loser_keys.insert(k);
                self.table("Part")
                    .update(&loser, &[Value::Int(k)], &[(1, Value::Int(-1))])?;
            }
            if let Some(&k) = keys.get(1) {
                self.m.loser_keys.insert(k);
                self.table("Part").delete(&loser, &[Value::Int(k)])?;
            }
            Ok(())
        })();
        self.loser = Some(loser);
        self.note("loser work".into());
        result.or_else(|error| failed(&self.cut, "loser", error))
    }

    fn schema_change(&mut self) -> Step {
        let tmp: Vec<String> = self
            .m
            .current
            .tables
            .keys()
            .filter(|name| name.starts_with("Tmp"))
            .cloned()
            .collect();
        let choice = self.rng.random_range(0..3);
        if choice == 0 && tmp.len() < 3 {
            self.m.tmp_made += 1;
            let name = format!("Tmp{}", self.m.tmp_made);
            self.note(format!("create {name}"));
            let result = self.db.create_table(tmp_table(&name));
            if let Ok(table) = &result {
                note_options(&mut self.options, &name, table);
                self.m.current.tables.insert(name.clone(), Rows::new());
            }
            self.table_changed(name, "create table", result.map(drop))
        } else if choice == 1 && !tmp.is_empty() {
            let name = tmp[self.rng.random_range(0..tmp.len())].clone();
            self.note(format!("drop {name}"));
            let result = self.db.drop_table(&name);
            if result.is_ok() {
                self.options.retain(|(table, _), _| *table != name);
                self.m.current.tables.remove(&name);
            }
            self.table_changed(name, "drop table", result)
        } else {
            let keys: Vec<(String, String)> = self
                .options
                .keys()
                .filter(|(table, _)| table != "Heap")
                .cloned()
                .collect();
            let (table, index) = keys[self.rng.random_range(0..keys.len())].clone();
            let handle = self.table(&table);
            let result = if self.rng.random_bool(0.5) {
                let path = if self.rng.random_bool(0.5) {
                    InsertPath::Classic
                } else {
                    InsertPath::Default
                };
                self.options
                    .get_mut(&(table.clone(), index.clone()))
                    .unwrap()
                    .0 = path;
                handle.set_insert_path(&self.s, &index, path)
            } else {
                let on = self.rng.random_bool(0.5);
                self.options
                    .get_mut(&(table.clone(), index.clone()))
                    .unwrap()
                    .1 = on;
                handle.set_optimize_for_sequential_key(&self.s, &index, on)
            };
            self.note(format!("alter {table}.{index}"));
            match result {
                Ok(()) => {
                    self.all_durable();
                    Ok(())
                }
                Err(error) => {
                    self.m.uncertain_options.insert((table, index));
                    failed(&self.cut, "alter index", error)
                }
            }
        }
    }

    /// One random step of the workload.
    fn step(&mut self) -> Step {
        match self.rng.random_range(0..100) {
            0..45 => self.autocommit(),
            45..75 => self.transaction(false),
            75..80 => self.wait_ticket(),
            80..83 => {
                self.note("checkpoint".into());
                match self.db.checkpoint() {
                    Ok(_) => {
                        self.all_durable();
                        Ok(())
                    }
                    Err(error) => failed(&self.cut, "checkpoint", error),
                }
            }
            83..86 => {
                self.note("flush".into());
                match self.db.flush_log() {
                    Ok(()) => {
                        self.all_durable();
                        Ok(())
                    }
                    Err(error) => failed(&self.cut, "flush", error),
                }
            }
            86..89 => self.loser_work(),
            89..94 => self.schema_change(),
            94 if self.config.checkpoint_log_bytes != u64::MAX => {
                // Long enough for the checkpointer's poll to find the log past its limit.
                COVERAGE.note(4);
                std::thread::sleep(Duration::from_millis(
                    lastpage_storage::limits::CHECKPOINT_POLL_INTERVAL_MS + 20,
                ));
                Ok(())
            }
            _ => {
                std::thread::yield_now();
                Ok(())
            }
        }
    }
}

fn open_db(fs: &FaultyFileSystem, config: &Config) -> Result<(CutFs, Database), String> {
    let cut = CutFs::new(fs.clone());
    let db = Database::open(DIR, options(cut.file_system(), config))
        .map_err(|e| format!("open: {e}"))?;
    Ok((cut, db))
}

/// Checks a reopened database against the model and settles the model on what it holds.
/// `scratch_kept`: whether the table that is not logged must have kept its rows (`Some(true)`:
/// a clean close; `Some(false)`: a crash; `None`: either, a close that failed part way).
fn verify(
    db: &Database,
    m: &mut Model,
    options: &mut Options,
    scratch_kept: Option<bool>,
) -> Result<(), String> {
    let found = snapshot(db)?;
    // Tables whose create or drop failed may or may not be there: they are left out of the
    // comparison and taken as found.
    let certain = |state: &State| {
        let mut state = state.logged_part();
        state
            .tables
            .retain(|name, _| !m.uncertain_tables.contains(name));
        state
    };
    let logged = certain(&found);
    let candidates: Vec<&State> = std::iter::once(&m.durable).chain(&m.maybe).collect();
    let mut matched_state = None;
    for (index, state) in candidates.iter().enumerate().rev() {
        if certain(state) == logged {
            matched_state = Some((index, (*state).clone()));
            break;
        }
        let applied = m
            .unknown
            .iter()
            .filter(|(at, _)| *at == index)
            .filter_map(|(_, op)| op.apply(state, &found))
            .find(|applied| certain(applied) == logged);
        if let Some(applied) = applied {
            matched_state = Some((index, applied));
            break;
        }
    }
    let Some((matched, matched_state)) = matched_state else {
        return Err(format!(
            "the database holds none of the {} states the log allows; against the last \
             durable one:{}\nagainst the last committed one:{}",
            candidates.len(),
            describe_difference(&logged, &m.durable.logged_part()),
            describe_difference(&logged, &m.current.logged_part()),
        ));
    };
    let scratch = &found.tables["Scratch"];
    let kept = scratch == &m.current.tables["Scratch"];
    match scratch_kept {
        Some(true) if !kept => {
            return Err(format!(
                "Scratch lost rows across a clean close: {} rows, expected {}",
                scratch.len(),
                m.current.tables["Scratch"].len()
            ));
        }
        Some(false) if !scratch.is_empty() => {
            return Err(format!(
                "Scratch kept {} rows across a crash",
                scratch.len()
            ));
        }
        None if !kept && !scratch.is_empty() => {
            return Err(format!("Scratch holds {} rows of no state", scratch.len()));
        }
        _ => {}
    }
    COVERAGE.note(if matched == 0 { 0 } else { 1 });
    if matched + 1 < candidates.len() {
        COVERAGE.note(2);
    }
    let mut state = matched_state;
    state.tables.insert("Scratch".into(), scratch.clone());
    let found_options = index_options(db);
    for name in std::mem::take(&mut m.uncertain_tables) {
        state.tables.remove(&name);
        options.retain(|(table, _), _| *table != name);
        if let Some(rows) = found.tables.get(&name) {
            state.tables.insert(name.clone(), rows.clone());
            for (key, value) in &found_options {
                if key.0 == name {
                    options.insert(key.clone(), *value);
                }
            }
        }
    }
    for key in std::mem::take(&mut m.uncertain_options) {
        if let (Some(found), Some(expected)) = (found_options.get(&key), options.get_mut(&key)) {
            *expected = *found;
        }
    }
    // Identity values of rows whose insert failed but took effect were handed out too.
    for (name, column, _) in IDENTITIES {
        let ids = m.identities.entry(name).or_default();
        for (row, _) in state.tables[name].values() {
            if let Value::BigInt(id) = row[column] {
                ids.insert(id);
            } else if let Value::Int(id) = row[column] {
                ids.insert(i64::from(id));
            } else if let Value::SmallInt(id) = row[column] {
                ids.insert(i64::from(id));
            }
        }
    }
    m.current = state;
    m.all_durable();
    m.loser_keys.clear();
    if &found_options != options {
        return Err(format!(
            "index options differ: found {found_options:?}, expected {options:?}"
        ));
    }
    db.check_integrity()
        .map_err(|e| format!("integrity check: {e}"))?;
    check_indexes(db, &m.current)?;
    for (name, _, increment) in IDENTITIES {
        let Some(&farthest) = m.farthest_identity.get(name) else {
            continue;
        };
        let next = db.table(name).unwrap().next_identity().unwrap();
        let beyond = if increment > 0 {
            next > farthest
        } else {
            next < farthest
        };
        if !beyond {
            return Err(format!(
                "{name}: the next identity value is {next}, but {farthest} was handed out"
            ));
        }
    }
    Ok(())
}

/// One round: a database through several lifetimes, each ended by a crash, a power cut at a
/// file operation, or a close, and reopened (sometimes with a crash during or right after
/// recovery).
fn corner_round(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let config = Config {
        durability: if rng.random_bool(0.5) {
            Durability::Full
        } else {
            Durability::Delayed
        },
        memory_pages: [16, 32, 64, 4096][rng.random_range(0..4)],
        checkpoint_log_bytes: [32 << 10, 128 << 10, u64::MAX][rng.random_range(0..3)],
        flush_interval: [
            Duration::from_millis(1),
            Duration::from_millis(20),
            Duration::from_secs(3600),
        ][rng.random_range(0..3)],
        segment_bytes: [32 << 10, 256 << 10][rng.random_range(0..2)],
    };
    let fs_config = if rng.random_bool(0.5) {
        FaultyConfig::new(seed).tear(lastpage_io::Tear::Bytes)
    } else {
        FaultyConfig::new(seed)
    };
    let mut fs = FaultyFileSystem::new(fs_config);
    let mut m = Model::new();
    let (mut cut, mut db) = open_db(&fs, &config)?;
    let mut options = create_fixed_tables(&db)?;
    let mut history = Vec::new();
    for cycle in 0..4 {
        let mut run = Run::new(rng.random(), m, options, &config, &cut, &db);
        let steps = rng.random_range(10..120);
        let mut result = Ok(());
        for _ in 0..steps {
            result = run.step();
            if result.is_err() || cut.fired() {
                break;
            }
        }
        let end = match rng.random_range(0..13) {
            0..5 => End::Crash(random_crash_mode(&mut rng)),
            5..8 => End::Cut(random_crash_mode(&mut rng)),
            8..10 => End::Close,
            10 => End::Fault(None),
            _ => End::Fault(Some(random_crash_mode(&mut rng))),
        };
        history.push(format!("cycle {cycle}: {steps} steps, then {end:?}"));
        if let Err(error) = result {
            return Err(format!("{error}\n{history:?}\nlast steps: {:#?}", run.log));
        }
        let mut scratch_kept = Some(false);
        // The process ended with the power on: the next one reads what the page cache holds.
        let mut exited_with_power_on = false;
        match end {
            End::Crash(mode) => {
                cut.cut_now_in(mode);
            }
            End::Cut(mode) => {
                cut.arm(rng.random_range(1..40), mode);
                let step = match rng.random_range(0..4) {
                    0 => run.transaction(true),
                    1 => run
                        .db
                        .checkpoint()
                        .map(|_| run.all_durable())
                        .or_else(|e| failed(&cut, "checkpoint", e)),
                    2 => run
                        .db
                        .flush_log()
                        .map(|_| run.all_durable())
                        .or_else(|e| failed(&cut, "flush", e)),
                    _ => {
                        let result = run.db.clone().close();
                        scratch_kept = None;
                        result
                            .map(|_| run.all_durable())
                            .or_else(|e| failed(&cut, "close", e))
                    }
                };
                if let Err(error) = step {
                    return Err(format!("{error}\n{history:?}\nlast steps: {:#?}", run.log));
                }
                cut.cut_now_in(mode);
            }
            End::Fault(crash) => {
                let rule = match rng.random_range(0..4) {
                    0 => FaultRule::sync_fails(rng.random_range(1..12)),
                    1 => FaultRule::syncs_fail_from(rng.random_range(1..12)),
                    2 => FaultRule::disk_full_after(rng.random_range(0..200_000)),
                    _ => FaultRule::sync_fails(rng.random_range(1..4))
                        .on_path(Path::new(DIR).join(lastpage_engine::database::DATA_FILE_NAME)),
                };
                history.push(format!("cycle {cycle}: {rule:?}"));
                cut.inject(rule);
                // Work goes on: failures are expected, successes must be as good as ever.
                for _ in 0..rng.random_range(5..60) {
                    if let Err(error) = run.step() {
                        return Err(format!("{error}\n{history:?}\nlast steps: {:#?}", run.log));
                    }
                }
                if rng.random_bool(0.3) {
                    let _ = run.db.clone().close();
                    scratch_kept = None;
                }
                match crash {
                    Some(mode) => cut.cut_now_in(mode),
                    None => {
                        // The process goes without a power loss: the next one reads what
                        // the page cache holds.
                        cut.inner().clear_faults();
                        exited_with_power_on = true;
                        if scratch_kept.is_some() {
                            scratch_kept = None;
                        }
                    }
                }
            }
            End::Close => {
                if cut.fired() {
                    // The power went already.
                } else {
                    match run.db.clone().close() {
                        Ok(()) => {
                            run.all_durable();
                            scratch_kept = Some(true);
                        }
                        Err(error) => {
                            return Err(format!("close: {error}\n{history:?}"));
                        }
                    }
                }
            }
        }
        let after = if scratch_kept == Some(true) || exited_with_power_on {
            cut.inner()
        } else {
            cut.after().expect("the power was cut")
        };
        let log = std::mem::take(&mut run.log);
        m = std::mem::replace(&mut run.m, Model::new());
        options = std::mem::take(&mut run.options);
        drop(run);
        drop(db);
        fs = after;
        // A crash during recovery, sometimes.
        if scratch_kept != Some(true) && rng.random_bool(0.4) {
            let cut_open = CutFs::new(fs.clone());
            let at = rng.random_range(1..60);
            cut_open.arm(at, random_crash_mode(&mut rng));
            let opened = Database::open(DIR, options_for(&cut_open, &config));
            if cut_open.fired() {
                COVERAGE.note(3);
                drop(opened);
                fs = cut_open.after().unwrap();
                history.push(format!(
                    "cycle {cycle}: power cut at operation {at} of the open"
                ));
            } else {
                cut_open.disarm();
                let opened =
                    opened.map_err(|e| format!("open: {e}\n{history:?}\nlast: {log:#?}"))?;
                verify(&opened, &mut m, &mut options, scratch_kept)
                    .map_err(|e| format!("{e}\n{history:?}\nlast steps: {log:#?}"))?;
                scratch_kept = Some(false);
                // And right after recovery.
                let crashed = cut_open.inner().crash_with(random_crash_mode(&mut rng));
                drop(opened);
                fs = crashed;
                history.push(format!("cycle {cycle}: crash right after the open"));
            }
        }
        let opened =
            open_db(&fs, &config).map_err(|e| format!("{e}\n{history:?}\nlast steps: {log:#?}"))?;
        cut = opened.0;
        db = opened.1;
        verify(&db, &mut m, &mut options, scratch_kept)
            .map_err(|e| format!("{e}\n{history:?}\nlast steps: {log:#?}"))?;
    }
    Ok(())
}

fn options_for(cut: &CutFs, config: &Config) -> DatabaseOptions {
    options(cut.file_system(), config)
}

#[test]
fn every_corner_keeps_what_was_acknowledged_through_crashes_and_reopens() {
    let seed = seed();
    let mut failures = Vec::new();
    for round in 0..rounds(10) {
        let round_seed = seed.wrapping_add(round);
        if let Err(error) = corner_round(round_seed) {
            eprintln!("round seed {round_seed}: {error}");
            failures.push(round_seed);
        }
    }
    eprintln!("{}", COVERAGE.report());
    assert!(failures.is_empty(), "failed round seeds: {failures:?}");
}

/// A pipelined commit of a transaction that changed only the table that is not logged, its
/// ticket waited for, is no durable point: the transaction wrote no commit record, so the wait
/// flushes nothing, and an earlier DELAYED commit is lost to a crash as it would be without it.
/// The model once took every waited ticket for one, and found "none of the states the log
/// allows" (`every_corner_keeps_what_was_acknowledged_through_crashes_and_reopens` with
/// LASTPAGE_SEED=56252702622704).
#[test]
fn a_waited_ticket_of_a_transaction_that_logged_nothing_makes_nothing_durable() {
    let config = Config {
        durability: Durability::Delayed,
        memory_pages: 4096,
        checkpoint_log_bytes: u64::MAX,
        flush_interval: Duration::from_secs(3600),
        segment_bytes: 256 << 10,
    };
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let (cut, db) = open_db(&fs, &config).unwrap();
    let options = create_fixed_tables(&db).unwrap();
    let mut run = Run::new(1, Model::new(), options, &config, &cut, &db);
    // A DELAYED autocommit into a logged table: committed, its records only in the log buffer.
    run.autocommit_of(|run, working| run.insert("Ids", 1, working))
        .unwrap();
    // A transaction that changes only the table that is not logged, committed pipelined, and
    // its ticket waited for.
    run.s.begin().unwrap();
    let mut working = run.m.current.clone();
    assert!(!run.insert("Scratch", 1, &mut working).unwrap());
    run.commit_pipelined(working, false).unwrap();
    run.wait_ticket_at(0).unwrap();
    cut.cut_now_in(CrashMode::LoseUnsynced);
    let mut m = std::mem::replace(&mut run.m, Model::new());
    let mut options = std::mem::take(&mut run.options);
    drop(run);
    drop(db);
    let (_, db) = open_db(&cut.after().unwrap(), &config).unwrap();
    // The case this test is about: were the Ids row kept, any model would accept it.
    assert_eq!(
        db.table("Ids").unwrap().row_count(),
        0,
        "the ticket's wait flushed the earlier DELAYED commit"
    );
    verify(&db, &mut m, &mut options, Some(false)).unwrap();
}

/// Row counts per table, for the close-and-reopen cycles.
fn row_counts(db: &Database) -> BTreeMap<String, u64> {
    let session = db.session();
    db.tables()
        .into_iter()
        .map(|table| {
            let scanned = common::try_rows(&table, &session).unwrap().len() as u64;
            assert_eq!(scanned, table.row_count(), "{}", table.name());
            (table.name().to_string(), scanned)
        })
        .collect()
}

/// A database closed and reopened many times with a memory budget of a few pages (so that
/// every cycle evicts): each open finds every row, the identity counters go on past every
/// value handed out, and the integrity check passes. Cycles that change nothing, and cycles
/// that only update rows in place, must not grow the data file or the page count at all.
#[test]
fn close_and_reopen_cycles_with_a_tiny_memory_budget_keep_everything_and_leak_nothing() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let config = Config {
        durability: Durability::Full,
        memory_pages: 8,
        checkpoint_log_bytes: u64::MAX,
        flush_interval: Duration::from_millis(20),
        segment_bytes: 64 << 10,
    };
    let open = || Database::open(DIR, options(Arc::new(fs.clone()), &config)).unwrap();
    let data_slots = || {
        fs.contents(&Path::new(DIR).join(lastpage_engine::database::DATA_FILE_NAME))
            .unwrap()
            .len()
            / 8192
    };
    let db = open();
    for definition in logged_tables() {
        db.create_table(definition).unwrap();
    }
    db.close().unwrap();
    let mut m = Model::new();
    let mut number = 0;
    let mut sizes = Vec::new();
    for cycle in 0..24 {
        let db = open();
        let session = db.session();
        let counts = row_counts(&db);
        for name in ["Ids", "Heap", "Dup", "Part", "Tiny"] {
            assert_eq!(
                counts[name],
                m.current.tables[name]
                    .values()
                    .map(|(_, n)| *n as u64)
                    .sum::<u64>(),
                "cycle {cycle}: rows of {name}"
            );
        }
        db.check_integrity()
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        let pages_at_open = db.pool().page_count();
        // Cycles 0..8 insert (batches and single rows) and delete; 8..16 update in place;
        // 16..24 change nothing.
        if cycle < 8 {
            for name in ["Ids", "Heap", "Dup", "Part", "Tiny"] {
                let table = db.table(name).unwrap();
                for _ in 0..rng.random_range(1..4) {
                    let rows: Vec<(i32, String)> = (0..rng.random_range(1..80))
                        .map(|_| {
                            number += 1;
                            (number, text_for(name, number, &mut rng))
                        })
                        .collect();
                    let ids = if rows.len() == 1 {
                        vec![
                            table
                                .insert(&session, insert_row(name, rows[0].0, &rows[0].1))
                                .unwrap(),
                        ]
                    } else {
                        table
                            .insert_batch(
                                &session,
                                rows.iter()
                                    .map(|(n, text)| insert_row(name, *n, text))
                                    .collect(),
                            )
                            .unwrap()
                    };
                    for ((n, text), id) in rows.iter().zip(ids) {
                        if let Some(id) = id {
                            m.handed_out(name, id);
                        }
                        m.current.add(name, expected_row(name, *n, id, text));
                    }
                }
            }
            // Delete a few rows of the tables with unique keys.
            for name in ["Ids", "Part", "Tiny"] {
                let table = db.table(name).unwrap();
                let victims: Vec<Vec<Value>> = m.current.tables[name]
                    .values()
                    .map(|(row, _)| row.clone())
                    .take(5)
                    .collect();
                for row in victims {
                    assert!(table.delete(&session, &[row[0].clone()]).unwrap());
                    m.current.remove(name, &row);
                }
            }
        } else if cycle < 16 {
            // Same-size updates of a non-key column: nothing needs a new page.
            let table = db.table("Part").unwrap();
            let rows: Vec<Vec<Value>> = m.current.tables["Part"]
                .values()
                .map(|(row, _)| row.clone())
                .collect();
            for row in rows.iter().take(100) {
                let Value::Int(v) = row[1] else { panic!() };
                let new_v = (v + 1) % 11;
                assert!(
                    table
                        .update(&session, &[row[0].clone()], &[(1, Value::Int(new_v))])
                        .unwrap()
                );
                let mut new_row = row.clone();
                new_row[1] = Value::Int(new_v);
                m.current.remove("Part", row);
                m.current.add("Part", new_row);
            }
        }
        // The identity counters go on past every value handed out.
        for (name, _, increment) in IDENTITIES {
            if let Some(&farthest) = m.farthest_identity.get(name) {
                let next = db.table(name).unwrap().next_identity().unwrap();
                assert!(
                    if increment > 0 {
                        next > farthest
                    } else {
                        next < farthest
                    },
                    "cycle {cycle}: {name} would hand out {next}, but {farthest} was handed out"
                );
            }
        }
        let pages = db.pool().page_count();
        drop(session);
        db.close().unwrap();
        sizes.push((cycle, pages_at_open, pages, data_slots()));
        if cycle >= 9 {
            let (_, _, before_pages, before_slots) = sizes[sizes.len() - 2];
            assert!(
                pages <= before_pages && data_slots() <= before_slots,
                "cycle {cycle}: the database grew without new rows: {sizes:?}"
            );
        }
    }
    println!("(cycle, pages at open, pages at close, data file slots): {sizes:?}");
}
