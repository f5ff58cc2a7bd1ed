//! What the engine's integration tests share: the seed and the scale of a randomized test, the
//! durable database over the fault-injecting file system that many of them start from, the
//! tables they use most, a simulated power cut, readers of a table's rows, and a bounded wait.
//!
//! Every test binary that declares `mod common;` compiles this module on its own and uses only
//! part of it; in that binary the rest would be reported as dead code, hence the `allow`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, Durability, IndexDef, KeyRange,
    Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyFileSystem};
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The directory every database on a fault-injecting file system lives in.
pub const DIR: &str = "/db";

/// The seed of a randomized test: `LASTPAGE_SEED` if set (else `LASTPAGE_TEST_SEED`, the name
/// some of these tests read first, so that it still works), else a fresh one. It is printed,
/// so that a failing run can be repeated.
pub fn seed() -> u64 {
    let seed = ["LASTPAGE_SEED", "LASTPAGE_TEST_SEED"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed = {seed} (rerun with LASTPAGE_SEED={seed})");
    seed
}

/// [`seed`], and a generator seeded with it.
pub fn seeded_rng() -> (u64, StdRng) {
    let seed = seed();
    (seed, StdRng::seed_from_u64(seed))
}

/// How many cases (or rounds) a randomized test runs: `base` times `LASTPAGE_TEST_CASES`
/// (1 if it is not set), so that a longer run needs no change to the code.
pub fn cases(base: usize) -> usize {
    let scale: usize = std::env::var("LASTPAGE_TEST_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    base * scale
}

/// A durable database in [`DIR`] on `fs`, with a 1 MiB log buffer and 256 KiB log segments
/// (small enough that a test's log spans several of them) and every other option at its
/// default. Tests that need more set it on top: `DatabaseOptions { .., ..options(fs) }`.
pub fn options(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        file_system: Some(Arc::new(fs.clone())),
        wal: WalConfig {
            buffer_bytes: 1 << 20,
            segment_bytes: 256 << 10,
            ..WalConfig::default()
        },
        ..DatabaseOptions::default()
    }
}

/// [`options`] with no background flush in practice (an hour's interval): the log reaches the
/// disk only when a commit waits for it or something else flushes it.
pub fn options_without_background_flush(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        delayed_flush_interval: Duration::from_secs(3600),
        ..options(fs)
    }
}

/// [`options_without_background_flush`] with DELAYED commits by default, for the tests of what
/// a commit that did not wait for its log record may lose.
pub fn delayed_options(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        durability: Durability::Delayed,
        ..options_without_background_flush(fs)
    }
}

/// Opens (or creates) the database on `fs` with [`options`].
pub fn open(fs: &FaultyFileSystem) -> Database {
    Database::open(DIR, options(fs)).unwrap()
}

/// Pulls the plug on `fs` (in `mode`) while `db` is open, then lets go of the old handle so that
/// the crashed copy can be opened: `held` (the sessions and tables that keep the handle alive)
/// is dropped before `db`, and `abandoned` (sessions with a transaction still open) is leaked,
/// so that no rollback runs as if the process had gone on. Returns what the crash left.
pub fn crash(
    fs: &FaultyFileSystem,
    mode: CrashMode,
    db: Database,
    held: impl Sized,
    abandoned: impl Sized,
) -> FaultyFileSystem {
    let after = fs.crash_with(mode);
    std::mem::forget(abandoned);
    drop(held);
    drop(db);
    after
}

/// The crash modes in the order the randomized tests index them by, so that a seed picks the
/// same mode wherever it is drawn.
pub const CRASH_MODES: [CrashMode; 3] = [
    CrashMode::Random,
    CrashMode::LoseUnsynced,
    CrashMode::KeepUnsynced,
];

/// A random crash mode, [`CrashMode::Random`] (which loses, applies or tears each unsynced
/// write) twice as likely as each of the other two.
pub fn random_crash_mode(rng: &mut StdRng) -> CrashMode {
    [
        CrashMode::Random,
        CrashMode::Random,
        CrashMode::LoseUnsynced,
        CrashMode::KeepUnsynced,
    ][rng.random_range(0..4)]
}

/// `Orders(Id BIGINT IDENTITY PRIMARY KEY, Payload VARCHAR(100) NOT NULL)`.
pub fn orders() -> TableDef {
    TableDef::new("Orders")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
        .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey))
}

/// `Accounts(Id INT PRIMARY KEY, Balance INT NOT NULL)`: explicit keys, for lock tests.
pub fn accounts() -> TableDef {
    TableDef::new("Accounts")
        .column(ColumnDef::new("Id", DataType::Int).not_null())
        .column(ColumnDef::new("Balance", DataType::Int).not_null())
        .clustered(IndexDef::new(
            "PK_Accounts",
            &["Id"],
            Uniqueness::PrimaryKey,
        ))
}

/// [`accounts`] with a non-unique nonclustered index on Balance.
pub fn accounts_by_balance() -> TableDef {
    accounts().nonclustered(IndexDef::new(
        "IX_Balance",
        &["Balance"],
        Uniqueness::NonUnique,
    ))
}

/// `Notes(Id INT PRIMARY KEY, Text VARCHAR(100) NOT NULL)`: explicit keys and rows of about
/// 100 bytes.
pub fn notes() -> TableDef {
    TableDef::new("Notes")
        .column(ColumnDef::new("Id", DataType::Int).not_null())
        .column(ColumnDef::new("Text", DataType::VarChar(100)).not_null())
        .clustered(IndexDef::new("PK_Notes", &["Id"], Uniqueness::PrimaryKey))
}

/// The rows of `table` in `range` as `session` reads them, in `direction`; panics on any error.
pub fn scan(
    table: &Table,
    session: &Session,
    range: &KeyRange,
    direction: Direction,
) -> Vec<Vec<Value>> {
    table
        .scan(session, range, direction)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Every row of `table` as `session` reads it, in key order; panics on any error.
pub fn rows(table: &Table, session: &Session) -> Vec<Vec<Value>> {
    scan(table, session, &KeyRange::all(), Direction::Forward)
}

/// Every row of `table` as `session` reads it, in key order, or the first error as text (for
/// tests that report a failed case instead of panicking).
pub fn try_rows(table: &Table, session: &Session) -> Result<Vec<Vec<Value>>, String> {
    let mut rows = Vec::new();
    for row in table
        .scan(session, &KeyRange::all(), Direction::Forward)
        .map_err(|e| format!("scan {}: {e}", table.name()))?
    {
        rows.push(row.map_err(|e| format!("scan {}: {e}", table.name()))?);
    }
    Ok(rows)
}

/// A key range that holds exactly the rows whose key starts with `prefix`.
pub fn prefix(prefix: Vec<Value>) -> KeyRange {
    KeyRange {
        lower: std::ops::Bound::Included(prefix.clone()),
        upper: std::ops::Bound::Included(prefix),
    }
}

/// Every row of the table named `table`: its key (read from column 0 by `key_of`, which
/// returns `None` for a value of the wrong type) -> its text in column `text_column`. Panics on
/// a key or a text of the wrong type and on a key read twice.
pub fn text_by_key<K: Ord + Copy + std::fmt::Debug>(
    db: &Database,
    table: &str,
    text_column: usize,
    key_of: impl Fn(&Value) -> Option<K>,
) -> BTreeMap<K, String> {
    let table = db.table(table).unwrap();
    let mut texts = BTreeMap::new();
    for row in rows(&table, &db.session()) {
        let Some(key) = key_of(&row[0]) else {
            panic!("id {:?}", row[0])
        };
        let Value::String(text) = &row[text_column] else {
            panic!("payload {:?}", row[text_column])
        };
        assert!(
            texts.insert(key, text.clone()).is_none(),
            "id {key:?} twice"
        );
    }
    texts
}

/// The key of a `BIGINT` key column, for [`text_by_key`].
pub fn bigint(value: &Value) -> Option<i64> {
    match value {
        Value::BigInt(id) => Some(*id),
        _ => None,
    }
}

/// Every row of `Orders` (see [`orders`]): id -> payload.
pub fn orders_rows(db: &Database) -> BTreeMap<i64, String> {
    text_by_key(db, "Orders", 1, bigint)
}

/// Polls `done` every millisecond until it holds; panics with `what` if that takes longer than
/// `limit`. For a test that must wait for another thread to reach a state (a lock wait, a flush)
/// without hanging for ever when it never does.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A random column type with every kind of type equally likely; the length of a text or binary
/// type is `length(rng, the type's largest length)`.
pub fn random_type<R: Rng>(rng: &mut R, length: impl Fn(&mut R, u16) -> u16) -> DataType {
    match rng.random_range(0..15) {
        0 => DataType::TinyInt,
        1 => DataType::SmallInt,
        2 => DataType::Int,
        3 => DataType::BigInt,
        4 => DataType::Bit,
        5 => {
            let precision = rng.random_range(1..=38);
            DataType::Decimal {
                precision,
                scale: rng.random_range(0..=precision),
            }
        }
        6 => DataType::Money,
        7 => DataType::Char(length(rng, 8000)),
        8 => DataType::VarChar(length(rng, 8000)),
        9 => DataType::NChar(length(rng, 4000)),
        10 => DataType::NVarChar(length(rng, 4000)),
        11 => DataType::DateTime2(rng.random_range(0..=7)),
        12 => DataType::Date,
        13 => DataType::UniqueIdentifier,
        _ => DataType::VarBinary(length(rng, 8000)),
    }
}

/// An in-memory database whose lock waits time out after `lock_timeout`, for a test in which
/// one session waits for another's lock (a generous timeout keeps a slow machine from failing
/// it; a short one tests the timeout).
pub fn in_memory_with_lock_timeout(lock_timeout: Duration) -> Database {
    Database::create(DatabaseOptions {
        lock_timeout: Some(lock_timeout),
        ..DatabaseOptions::default()
    })
    .unwrap()
}

/// Runs `blocked` on another thread and, once `db` has counted a lock wait more than before
/// (`blocked` waits for a lock that a transaction of this thread holds), runs `meanwhile` here,
/// which usually ends that transaction; returns what `blocked` returned. Panics with `what` if
/// `blocked` returns without having waited, or has not waited within 10 s.
pub fn while_blocked<R: Send>(
    db: &Database,
    what: &str,
    blocked: impl FnOnce() -> R + Send,
    meanwhile: impl FnOnce(),
) -> R {
    let waits_before = db.lock_stats().waits;
    std::thread::scope(|scope| {
        let waiter = scope.spawn(blocked);
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.lock_stats().waits == waits_before {
            assert!(!waiter.is_finished() && Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
        meanwhile();
        waiter.join().unwrap()
    })
}

/// Asserts that every page in use (allocated and not free) belongs to a tree of a table, as a
/// linked page or a spare leaf, and returns the integrity check of every table (which has
/// checked every tree). Exact only while no dropped table's pages wait for a handle to go.
pub fn assert_every_page_owned(db: &Database, context: &str) -> Vec<lastpage_engine::TableCheck> {
    let checks = db
        .check_integrity()
        .unwrap_or_else(|error| panic!("{context}: integrity: {error}"));
    let trees = || checks.iter().flat_map(|table| &table.indexes);
    let owned: u64 = trees()
        .map(|(_, tree)| tree.leaf_pages + tree.inner_pages + tree.spare_leaves)
        .sum();
    let spare: u64 = trees().map(|(_, tree)| tree.spare_leaves).sum();
    let pool = db.pool();
    let (ids, free) = (pool.page_count() as u64, pool.free_page_count() as u64);
    let in_use = ids - free;
    println!("{context}: {in_use} pages in use ({spare} spare leaves), {free} free");
    assert_eq!(
        in_use, owned,
        "{context}: {in_use} pages are in use ({ids} allocated, {free} free) but the trees own \
         {owned} ({spare} spare leaves): a page was lost"
    );
    checks
}
