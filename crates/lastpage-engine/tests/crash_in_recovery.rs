//! Crashes and I/O failures *during* recovery, the open and a close.
//!
//! A database with committed and uncommitted work across a checkpoint (an identity-keyed
//! table, one with a nonclustered index, one with ~100-byte rows whose log spans several small
//! segments) is crashed; then its crashed copy is opened with a fault at the n-th operation of
//! the open, for n = 1, 2, ... until the open completes without reaching n:
//!
//! - power cut: the file system crashes (LoseUnsynced / Random) at the n-th mutating
//!   operation (write, fsync, size change, create, remove, rename, directory fsync);
//! - the n-th fsync fails, or the n-th directory fsync, or a read, or the disk fills after n
//!   bytes; the open is retried on the same file system; then a power cut;
//!
//! After each, the database must open with every acknowledged commit exactly once, no
//! uncommitted change, identity values never reused, and a clean integrity check; and after
//! more commits and another crash, still.
//!
//! `LASTPAGE_CRASHREC_SEEDS` (default 2) sets how many seeds each variant runs;
//! `LASTPAGE_CRASHREC_PREPARE` turns the log's segment preparation on, `LASTPAGE_CRASHREC_BIG`
//! makes the log ~1.6 MB (evictions and write-back during replay), and
//! `LASTPAGE_CRASHREC_OPEN_AT_CLOSE` leaves a transaction open across the close.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use lastpage_engine::{Database, DatabaseOptions, InsertRow, Session, Table, Value};
use lastpage_io::{CrashMode, FaultRule, FaultyConfig, FaultyFileSystem, FileSystem, PowerCut};
use lastpage_storage::wal::WalConfig;

mod common;

use common::{DIR, accounts_by_balance, notes, orders};

fn seeds() -> u64 {
    std::env::var("LASTPAGE_CRASHREC_SEEDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(2)
}

fn options(fs: Arc<dyn FileSystem>) -> DatabaseOptions {
    DatabaseOptions {
        file_system: Some(fs),
        memory_budget_bytes: 48 * 8192,
        checkpoint_log_bytes: u64::MAX,
        wal: WalConfig {
            buffer_bytes: 1 << 20,
            segment_bytes: 32 << 10,
            prepare_segments: std::env::var("LASTPAGE_CRASHREC_PREPARE").is_ok(),
            ..WalConfig::default()
        },
        ..DatabaseOptions::default()
    }
}

fn open_fs(fs: &FaultyFileSystem) -> lastpage_engine::Result<Database> {
    Database::open(DIR, options(Arc::new(fs.clone())))
}

/// What the database must hold: every acknowledged commit, nothing else.
#[derive(Clone, Debug, Default)]
struct Model {
    accounts: BTreeMap<i32, i32>,
    notes: BTreeMap<i32, String>,
    orders: BTreeMap<i64, String>,
    /// The highest identity value ever handed out (committed, rolled back or lost).
    max_identity: i64,
    /// How many times `extend` ran (to make fresh keys).
    round: i32,
    /// The payload of an order whose commit failed (not acknowledged): it may be there or not,
    /// and once an open has shown which, it stays so.
    maybe: Option<String>,
}

/// How the process that built the database ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// A power loss.
    Crash(CrashMode),
    /// A commit whose log fsync fails (fsyncgate); the process goes away without a crash, so
    /// the next open sees the page cache.
    FailedFsync,
}

fn note_text(id: i32, version: u32) -> String {
    format!("note {id} v{version} {}", "x".repeat(70))
}

struct Tables {
    orders: Arc<Table>,
    accounts: Arc<Table>,
    notes: Arc<Table>,
}

fn tables(db: &Database) -> Tables {
    Tables {
        orders: db.table("Orders").unwrap(),
        accounts: db.table("Accounts").unwrap(),
        notes: db.table("Notes").unwrap(),
    }
}

fn insert_order(t: &Tables, s: &Session, m: &mut Model, payload: &str, committed: bool) -> i64 {
    let id = t
        .orders
        .insert(s, InsertRow::new().set(1, payload))
        .unwrap()
        .unwrap();
    m.max_identity = m.max_identity.max(id);
    if committed {
        m.orders.insert(id, payload.to_string());
    }
    id
}

fn insert_notes(t: &Tables, s: &Session, m: Option<&mut Model>, ids: std::ops::Range<i32>) {
    let rows: Vec<InsertRow> = ids
        .clone()
        .map(|id| InsertRow::new().set(0, id).set(1, note_text(id, 0)))
        .collect();
    for chunk in rows.chunks(250) {
        t.notes.insert_batch(s, chunk.to_vec()).unwrap();
    }
    if let Some(m) = m {
        for id in ids {
            m.notes.insert(id, note_text(id, 0));
        }
    }
}

/// Builds the database on a new file system and crashes it. Returns the crashed copy (every
/// byte durable, nothing pending) and what it must hold.
fn build(seed: u64, mode: CrashMode) -> (FaultyFileSystem, Model) {
    build_with(seed, End::Crash(mode), big())
}

fn big() -> bool {
    std::env::var("LASTPAGE_CRASHREC_BIG").is_ok()
}

fn build_with(seed: u64, end: End, big: bool) -> (FaultyFileSystem, Model) {
    let config = FaultyConfig::new(seed);
    let config = if seed % 2 == 1 {
        config.tear(lastpage_io::Tear::Bytes)
    } else {
        config
    };
    let fs = FaultyFileSystem::new(config);
    let db = open_fs(&fs).unwrap();
    db.create_table(orders()).unwrap();
    db.create_table(accounts_by_balance()).unwrap();
    db.create_table(notes()).unwrap();
    let t = tables(&db);
    let s = db.session();
    let mut m = Model::default();
    for id in 0..200 {
        t.accounts
            .insert(&s, InsertRow::new().set(0, id).set(1, id % 17))
            .unwrap();
        m.accounts.insert(id, id % 17);
    }
    insert_notes(&t, &s, Some(&mut m), 0..800);
    for i in 0..40 {
        insert_order(&t, &s, &mut m, &format!("o{i}"), true);
    }
    // A loser that begins before the checkpoint: part of it is in the image.
    let l1 = db.session();
    l1.begin().unwrap();
    for id in 1..=5 {
        t.accounts
            .update(&l1, &[Value::Int(id)], &[(1, Value::Int(1000 + id))])
            .unwrap();
    }
    t.accounts.delete(&l1, &[Value::Int(6)]).unwrap();
    t.notes.delete(&l1, &[Value::Int(7)]).unwrap();
    for i in 0..3 {
        insert_order(&t, &l1, &mut m, &format!("loser1 {i}"), false);
    }
    insert_notes(&t, &l1, None, 5000..5020);
    // A rolled-back transaction.
    let r = db.session();
    r.begin().unwrap();
    for i in 0..3 {
        insert_order(&t, &r, &mut m, &format!("rolled back {i}"), false);
    }
    t.accounts
        .update(&r, &[Value::Int(8)], &[(1, Value::Int(-8))])
        .unwrap();
    r.rollback().unwrap();
    db.checkpoint().unwrap();
    // Committed after the checkpoint: one explicit transaction of many changes...
    s.begin().unwrap();
    for id in 10..60 {
        t.accounts
            .update(&s, &[Value::Int(id)], &[(1, Value::Int(id % 17 + 100))])
            .unwrap();
        m.accounts.insert(id, id % 17 + 100);
    }
    for id in 60..70 {
        assert!(t.accounts.delete(&s, &[Value::Int(id)]).unwrap());
        m.accounts.remove(&id);
    }
    for id in 1000..1050 {
        t.accounts
            .insert(&s, InsertRow::new().set(0, id).set(1, id % 5))
            .unwrap();
        m.accounts.insert(id, id % 5);
    }
    // A key change moves the row.
    t.accounts
        .update(&s, &[Value::Int(70)], &[(0, Value::Int(1070))])
        .unwrap();
    let balance = m.accounts.remove(&70).unwrap();
    m.accounts.insert(1070, balance);
    s.commit().unwrap();
    // ... and enough autocommit batches to span several log segments.
    insert_notes(&t, &s, Some(&mut m), 1000..3000);
    if big {
        insert_notes(&t, &s, Some(&mut m), 20_000..34_000);
    }
    for id in 10..50 {
        t.notes
            .update(
                &s,
                &[Value::Int(id)],
                &[(1, Value::String(note_text(id, 1)))],
            )
            .unwrap();
        m.notes.insert(id, note_text(id, 1));
    }
    for id in 50..60 {
        assert!(t.notes.delete(&s, &[Value::Int(id)]).unwrap());
        m.notes.remove(&id);
    }
    let batch: Vec<InsertRow> = (0..100)
        .map(|i| InsertRow::new().set(1, format!("batch {i}")))
        .collect();
    for (i, id) in t
        .orders
        .insert_batch(&s, batch)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let id = id.unwrap();
        m.max_identity = m.max_identity.max(id);
        m.orders.insert(id, format!("batch {i}"));
    }
    // The first loser goes on after the checkpoint.
    t.accounts
        .update(&l1, &[Value::Int(7)], &[(1, Value::Int(777))])
        .unwrap();
    insert_notes(&t, &l1, None, 6000..6100);
    insert_order(&t, &l1, &mut m, "loser1 late", false);
    // A second loser, only after the checkpoint.
    let l2 = db.session();
    l2.begin().unwrap();
    t.accounts
        .insert(&l2, InsertRow::new().set(0, 2000).set(1, 2))
        .unwrap();
    t.accounts
        .update(&l2, &[Value::Int(20)], &[(1, Value::Int(-20))])
        .unwrap();
    t.notes.delete(&l2, &[Value::Int(100)]).unwrap();
    insert_order(&t, &l2, &mut m, "loser2", false);
    // The last acknowledged commit.
    t.accounts
        .insert(&s, InsertRow::new().set(0, 3000).set(1, 3))
        .unwrap();
    m.accounts.insert(3000, 3);
    insert_order(&t, &s, &mut m, "last", true);
    match end {
        End::Crash(mode) => {
            let after = fs.crash_with(mode);
            std::mem::forget((l1, l2));
            drop((s, t));
            drop(db);
            (after, m)
        }
        End::FailedFsync => {
            fs.inject(FaultRule::sync_fails(1));
            let payload = "maybe".to_string();
            let error = t
                .orders
                .insert(&s, InsertRow::new().set(1, payload.as_str()))
                .unwrap_err();
            assert!(
                matches!(error, lastpage_engine::EngineError::LogFailed(_)),
                "{error}"
            );
            fs.clear_faults();
            // The failed insert took the next identity value.
            m.max_identity += 1;
            m.maybe = Some(payload);
            drop((l1, l2, s, t));
            drop(db);
            (fs, m)
        }
    }
}

/// An independent copy of a file system that holds nothing pending (the result of a crash).
fn copy(template: &FaultyFileSystem) -> FaultyFileSystem {
    template.crash_with(CrashMode::KeepUnsynced)
}

/// Checks that `db` holds exactly what `m` says; returns `m` with its maybe-order resolved.
fn check(db: &Database, m: &Model) -> Result<Model, String> {
    let mut m = m.clone();
    let t = tables(db);
    let s = db.session();
    let mut accounts = BTreeMap::new();
    for row in common::try_rows(&t.accounts, &s)? {
        let (Value::Int(id), Value::Int(balance)) = (&row[0], &row[1]) else {
            return Err(format!("account row {row:?}"));
        };
        if accounts.insert(*id, *balance).is_some() {
            return Err(format!("account {id} twice"));
        }
    }
    if accounts != m.accounts {
        let missing: Vec<_> = m
            .accounts
            .iter()
            .filter(|(k, v)| accounts.get(k) != Some(v))
            .take(5)
            .collect();
        let extra: Vec<_> = accounts
            .iter()
            .filter(|(k, v)| m.accounts.get(k) != Some(v))
            .take(5)
            .collect();
        return Err(format!(
            "accounts differ: {} rows, expected {}; expected but missing/different {missing:?}; \
             unexpected {extra:?}",
            accounts.len(),
            m.accounts.len()
        ));
    }
    // The nonclustered index agrees for a few balances.
    for balance in [0, 3, 7, 16, 100, 103, 777, 1001, -8, -20] {
        let want = m.accounts.values().filter(|&&b| b == balance).count();
        let got = t
            .accounts
            .get_by_index(&s, "IX_Balance", &[Value::Int(balance)])
            .map_err(|e| format!("index lookup: {e}"))?
            .len();
        if want != got {
            return Err(format!(
                "IX_Balance = {balance}: {got} rows, expected {want}"
            ));
        }
    }
    let mut notes = BTreeMap::new();
    for row in common::try_rows(&t.notes, &s)? {
        let (Value::Int(id), Value::String(text)) = (&row[0], &row[1]) else {
            return Err(format!("note row {row:?}"));
        };
        if notes.insert(*id, text.clone()).is_some() {
            return Err(format!("note {id} twice"));
        }
    }
    if notes != m.notes {
        let missing: Vec<_> = m
            .notes
            .keys()
            .filter(|k| notes.get(*k) != m.notes.get(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = notes
            .keys()
            .filter(|k| !m.notes.contains_key(*k))
            .take(5)
            .collect();
        return Err(format!(
            "notes differ: {} rows, expected {}; missing/different {missing:?}; unexpected \
             {extra:?}",
            notes.len(),
            m.notes.len()
        ));
    }
    let mut orders = BTreeMap::new();
    for row in common::try_rows(&t.orders, &s)? {
        let (Value::BigInt(id), Value::String(text)) = (&row[0], &row[1]) else {
            return Err(format!("order row {row:?}"));
        };
        if orders.insert(*id, text.clone()).is_some() {
            return Err(format!("order {id} twice"));
        }
    }
    if let Some(maybe) = m.maybe.take() {
        for (id, text) in &orders {
            if *text == maybe && !m.orders.contains_key(id) {
                m.orders.insert(*id, text.clone());
            }
        }
    }
    if orders != m.orders {
        let missing: Vec<_> = m
            .orders
            .keys()
            .filter(|k| !orders.contains_key(*k))
            .take(5)
            .collect();
        let extra: Vec<_> = orders
            .keys()
            .filter(|k| !m.orders.contains_key(*k))
            .take(5)
            .collect();
        return Err(format!(
            "orders differ: {} rows, expected {}; missing {missing:?}; unexpected {extra:?}",
            orders.len(),
            m.orders.len()
        ));
    }
    db.check_integrity()
        .map_err(|e| format!("integrity check: {e}"))?;
    Ok(m)
}

/// More committed work: an identity value that must be new, updates, a batch.
fn extend(db: &Database, m: &mut Model) -> Result<(), String> {
    m.round += 1;
    let t = tables(db);
    let s = db.session();
    let id = t
        .orders
        .insert(&s, InsertRow::new().set(1, format!("round {}", m.round)))
        .map_err(|e| format!("extend: insert order: {e}"))?
        .unwrap();
    if id <= m.max_identity {
        return Err(format!(
            "identity {id} handed out again (the highest handed out before was {})",
            m.max_identity
        ));
    }
    m.max_identity = id;
    m.orders.insert(id, format!("round {}", m.round));
    let base = 100_000 * (m.round + 1);
    let rows: Vec<InsertRow> = (base..base + 300)
        .map(|id| InsertRow::new().set(0, id).set(1, note_text(id, 0)))
        .collect();
    t.notes
        .insert_batch(&s, rows)
        .map_err(|e| format!("extend: notes batch: {e}"))?;
    for id in base..base + 300 {
        m.notes.insert(id, note_text(id, 0));
    }
    let key = *m.accounts.keys().nth(m.round as usize % 50).unwrap();
    t.accounts
        .update(&s, &[Value::Int(key)], &[(1, Value::Int(m.round))])
        .map_err(|e| format!("extend: update: {e}"))?;
    m.accounts.insert(key, m.round);
    Ok(())
}

fn catch<T>(what: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(what)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("PANIC: {message}")
    })
}

/// Opens `fs` (no faults), checks it, adds work, crashes it (`mode`), opens and checks again.
fn verify_after(fs: &FaultyFileSystem, m: &Model, mode: CrashMode) -> Result<(), String> {
    let db = catch(|| open_fs(fs))?.map_err(|e| format!("clean open failed: {e}"))?;
    let mut m = catch(|| check(&db, m))?.map_err(|e| format!("after the faulty open: {e}"))?;
    catch(|| extend(&db, &mut m))??;
    let after = fs.crash_with(mode);
    drop(db);
    let db =
        catch(|| open_fs(&after))?.map_err(|e| format!("open after a second crash failed: {e}"))?;
    m = catch(|| check(&db, &m))?.map_err(|e| format!("after a second crash: {e}"))?;
    // And a clean close keeps it all.
    catch(|| extend(&db, &mut m))??;
    db.close().map_err(|e| format!("close: {e}"))?;
    let db = catch(|| open_fs(&after))?.map_err(|e| format!("open after close failed: {e}"))?;
    m = catch(|| check(&db, &m))?.map_err(|e| format!("after a clean close: {e}"))?;
    let _ = m;
    Ok(())
}

// ---------------------------------------------------------------------------------------------

struct Report {
    name: &'static str,
    cases: u64,
    failures: Vec<String>,
}

impl Report {
    fn new(name: &'static str) -> Report {
        Report {
            name,
            cases: 0,
            failures: Vec::new(),
        }
    }

    fn record(&mut self, case: String, result: Result<(), String>) {
        self.cases += 1;
        if self.cases.is_multiple_of(100) || case.contains("(completed") {
            eprintln!("[{}] {} cases; {case}", self.name, self.cases);
        }
        if let Err(error) = result {
            eprintln!("[{}] FAIL {case}: {error}", self.name);
            self.failures.push(format!("{case}: {error}"));
        }
    }

    fn finish(self) {
        eprintln!(
            "[{}] {} cases, {} failures",
            self.name,
            self.cases,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{} of {} cases failed; first: {}",
            self.failures.len(),
            self.cases,
            self.failures[0]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The steps every case shares: arm a fault, open, classify what the open came to, record it.

const BUILD_MODES: [CrashMode; 2] = [CrashMode::LoseUnsynced, CrashMode::Random];
const LIMIT: u64 = 2000;

/// The faults of the close and the fsyncgate tests: a power cut that loses what was not synced,
/// a power cut that keeps some of it at random, the n-th fsync failing, and every fsync from
/// the n-th on failing.
const VARIANTS: [&str; 4] = ["cut lose", "cut random", "fsync", "fsync sticky"];

/// Opens the database on a file system that loses power at its armed operation.
fn open_cut(cut: &PowerCut) -> lastpage_engine::Result<Database> {
    Database::open(DIR, options(Arc::new(cut.clone())))
}

/// A file system over `inner` that loses power (`mode`) at its `n`-th mutating operation.
fn armed_cut(inner: FaultyFileSystem, mode: CrashMode, n: u64) -> PowerCut {
    let cut = PowerCut::new(inner);
    cut.arm(n, mode);
    cut
}

/// Checks a database that an open returned and drops it. A panic in the check is a failure of
/// the case, not of the whole test, so that the report can name every failing case.
fn check_opened(db: Database, model: &Model) -> Result<(), String> {
    let result = catch(|| check(&db, model)).and_then(|r| r).map(|_| ());
    drop(db);
    result
}

/// What an open with an armed fault came to.
enum Opened {
    /// The open panicked, which always fails the case.
    Panicked(String),
    /// The open returned a database before it reached its fault. A later fault point would
    /// not be reached either, so the loop over fault points stops here.
    Completed(Database),
    /// The open returned a database although it reached its fault: it got past the fault, or
    /// the fault struck a background thread after the open returned.
    Despite(Database),
    /// The open failed. The error is there when the fault was not reached, because then nothing
    /// explains the failure.
    Failed(Option<lastpage_engine::EngineError>),
}

/// Runs `open` and classifies its outcome; `reached` tells, once the open has returned,
/// whether the armed fault was reached.
fn open_with_fault(
    open: impl FnOnce() -> lastpage_engine::Result<Database>,
    reached: impl FnOnce() -> bool,
) -> Opened {
    let result = match catch(open) {
        Ok(result) => result,
        Err(panic) => return Opened::Panicked(panic),
    };
    match (result, reached()) {
        (Ok(db), false) => Opened::Completed(db),
        (Ok(db), true) => Opened::Despite(db),
        (Err(_), true) => Opened::Failed(None),
        (Err(error), false) => Opened::Failed(Some(error)),
    }
}

/// One of [`VARIANTS`] armed on a copy of a crashed database. The cut wraps the base file
/// system, so that fsync faults injected into the base are seen through the cut as well.
struct Armed {
    variant: &'static str,
    base: FaultyFileSystem,
    cut: PowerCut,
    /// What the cut does with writes that were not durable.
    mode: CrashMode,
    before: lastpage_io::FaultyStats,
}

impl Armed {
    fn new(base: FaultyFileSystem, variant: &'static str) -> Armed {
        let mode = if variant == "cut random" {
            CrashMode::Random
        } else {
            CrashMode::LoseUnsynced
        };
        Armed {
            variant,
            cut: PowerCut::new(base.clone()),
            mode,
            before: base.stats(),
            base,
        }
    }

    fn is_cut(&self) -> bool {
        self.variant.starts_with("cut")
    }

    /// Arms the fault at `n`, and notes the counters from which `reached` counts failed fsyncs.
    fn arm(&mut self, n: u64) {
        self.before = self.base.stats();
        match self.variant {
            "cut lose" | "cut random" => self.cut.arm(n, self.mode),
            "fsync" => self.base.inject(FaultRule::sync_fails(n)),
            _ => self.base.inject(FaultRule::syncs_fail_from(n)),
        }
    }

    /// Whether the armed fault has been reached since `arm`.
    fn reached(&self) -> bool {
        if self.is_cut() {
            self.cut.fired()
        } else {
            self.base.stats().failed_syncs > self.before.failed_syncs
        }
    }

    /// The file system to verify: what the power cut left, or the base without its faults
    /// (the same process, or its successor, goes on with the page cache).
    fn after(self) -> FaultyFileSystem {
        if self.is_cut() {
            self.cut.after().unwrap()
        } else {
            self.base.clear_faults();
            self.base
        }
    }
}

impl Report {
    /// Records an open whose fault (`fs`'s injected rule) is cleared before anything is
    /// checked. An open that returned a database is checked; when it reached its fault as
    /// well, it is recorded as `despite`. Unless the open panicked or completed, the file
    /// system that `after` gives (if any) must then recover. Returns whether the open
    /// completed before its fault, which ends the loop over fault points.
    fn record_faulted_open(
        &mut self,
        case: String,
        opened: Opened,
        fs: &FaultyFileSystem,
        model: &Model,
        despite: &str,
        after: impl FnOnce() -> Option<FaultyFileSystem>,
    ) -> bool {
        match opened {
            Opened::Panicked(panic) => {
                self.record(case, Err(format!("open: {panic}")));
                return false;
            }
            Opened::Completed(db) => {
                fs.clear_faults();
                self.record(format!("{case} (completed)"), check_opened(db, model));
                return true;
            }
            // The power went during work the open does not fail for (its checkpoint's removal
            // of old log, whose image is durable by then), or in a background thread after the
            // open returned: the process is gone, and what the cut left is verified below.
            Opened::Despite(db) if fs.is_crashed() => drop(db),
            Opened::Despite(db) => {
                fs.clear_faults();
                self.record(format!("{case} ({despite})"), check_opened(db, model));
            }
            Opened::Failed(_) => {}
        }
        if let Some(after) = after() {
            self.record(case, verify_after(&after, model, CrashMode::LoseUnsynced));
        }
        false
    }

    /// Opens under `cut` and records the case: a panic or a failure without the cut fails
    /// it; an open that completed before the cut is checked and recorded as `completed()`
    /// (worked out after the check, so that it can count every operation); otherwise what
    /// the cut left must open and recover. `what` names the open in messages. Returns whether
    /// the open completed before the cut, which ends the loop over cut points.
    fn record_cut_open(
        &mut self,
        case: &str,
        cut: &PowerCut,
        model: &Model,
        what: &str,
        completed: impl FnOnce() -> String,
    ) -> bool {
        match open_with_fault(|| open_cut(cut), || cut.fired()) {
            Opened::Panicked(panic) => {
                self.record(case.to_string(), Err(format!("{what}: {panic}")));
                return false;
            }
            Opened::Completed(db) => {
                let result = check_opened(db, model);
                self.record(completed(), result);
                return true;
            }
            Opened::Failed(Some(error)) => {
                let error = format!("{what} failed without a fault: {error}");
                self.record(case.to_string(), Err(error));
                return false;
            }
            // The cut struck a background thread after the open returned.
            Opened::Despite(db) => drop(db),
            Opened::Failed(None) => {}
        }
        let after = cut.after().unwrap();
        self.record(
            case.to_string(),
            verify_after(&after, model, CrashMode::Random),
        );
        false
    }
}

/// Power fails at the n-th mutating operation of the open.
#[test]
fn power_cut_at_every_operation_of_the_open() {
    let mut report = Report::new("power cut in open");
    for seed in 0..seeds() {
        for build_mode in BUILD_MODES {
            let (template, model) = build(seed, build_mode);
            for cut_mode in [CrashMode::LoseUnsynced, CrashMode::Random] {
                for n in 1..LIMIT {
                    let cut = armed_cut(copy(&template), cut_mode, n);
                    let case =
                        format!("seed {seed} built {build_mode:?}, cut {cut_mode:?} at op {n}");
                    let completed = || format!("{case} (completed, {} ops)", cut.ops());
                    if report.record_cut_open(&case, &cut, &model, "open", completed) {
                        break;
                    }
                }
            }
        }
    }
    report.finish();
}

/// The n-th fsync of the open fails (fsyncgate: its writes are kept or dropped at random);
/// the open is retried on the same file system, and then the power fails.
#[test]
fn a_failed_fsync_in_the_open_then_a_retry() {
    let mut report = Report::new("failed fsync in open");
    for seed in 0..seeds() {
        for build_mode in BUILD_MODES {
            let (template, model) = build(seed, build_mode);
            for sticky in [false, true] {
                for n in 1..LIMIT {
                    let fs = copy(&template);
                    fs.inject(if sticky {
                        FaultRule::syncs_fail_from(n)
                    } else {
                        FaultRule::sync_fails(n)
                    });
                    let case = format!(
                        "seed {seed} built {build_mode:?}, fsync {n} fails (sticky {sticky})"
                    );
                    let opened = open_with_fault(|| open_fs(&fs), || fs.stats().failed_syncs > 0);
                    let despite = "open succeeded despite the failure";
                    let retry = || {
                        fs.clear_faults();
                        Some(fs.clone())
                    };
                    if report.record_faulted_open(case, opened, &fs, &model, despite, retry) {
                        break;
                    }
                }
            }
        }
    }
    report.finish();
}

/// The disk fills after `budget` bytes of the open's writes; the open is retried once space is
/// freed, or the power fails instead.
#[test]
fn a_full_disk_in_the_open_then_a_retry_or_a_crash() {
    let mut report = Report::new("disk full in open");
    for seed in 0..seeds() {
        for build_mode in BUILD_MODES {
            let (template, model) = build(seed, build_mode);
            let fs = copy(&template);
            drop(open_fs(&fs).unwrap());
            let total = fs.stats().bytes_written;
            let mut budgets: Vec<u64> = (0..total).step_by(4096).collect();
            budgets.extend((0..total).step_by(8192).map(|b| b + 100));
            budgets.sort();
            for budget in budgets {
                for then_crash in [false, true] {
                    let fs = copy(&template);
                    fs.inject(FaultRule::disk_full_after(budget));
                    let case = format!(
                        "seed {seed} built {build_mode:?}, disk full after {budget} of {total} \
                         bytes, then {}",
                        if then_crash { "crash" } else { "retry" }
                    );
                    // A full disk may or may not stop the open, so an open that succeeds is
                    // checked but never ends the loop.
                    match catch(|| open_fs(&fs)) {
                        Ok(Ok(db)) => {
                            fs.clear_faults();
                            let result = check_opened(db, &model);
                            report.record(format!("{case} (open succeeded)"), result);
                        }
                        Ok(Err(_)) => {}
                        Err(panic) => {
                            report.record(case, Err(format!("open: {panic}")));
                            continue;
                        }
                    }
                    let fs = if then_crash {
                        fs.crash_with(CrashMode::Random)
                    } else {
                        fs.clear_faults();
                        fs
                    };
                    report.record(case, verify_after(&fs, &model, CrashMode::LoseUnsynced));
                }
            }
        }
    }
    report.finish();
}

/// The n-th read, or the n-th directory fsync, of the open fails; the open is retried.
#[test]
fn a_failed_read_or_directory_fsync_in_the_open_then_a_retry() {
    let mut report = Report::new("failed read/dir fsync in open");
    for seed in 0..seeds() {
        for build_mode in BUILD_MODES {
            let (template, model) = build(seed, build_mode);
            for kind in ["read", "dir"] {
                for n in 1..LIMIT * 10 {
                    let fs = copy(&template);
                    fs.inject(if kind == "read" {
                        FaultRule::read_fails(n)
                    } else {
                        FaultRule::dir_sync_fails(n)
                    });
                    let case = format!("seed {seed} built {build_mode:?}, {kind} {n} fails");
                    let before = fs.stats();
                    let reached = || {
                        let stats = fs.stats();
                        if kind == "read" {
                            stats.reads - before.reads >= n
                        } else {
                            stats.dir_syncs - before.dir_syncs >= n
                        }
                    };
                    let opened = open_with_fault(|| open_fs(&fs), reached);
                    let despite = "open succeeded despite the failure";
                    // Reads fail at many more points than directory fsyncs; verifying after
                    // every seventh keeps the test's time in bounds.
                    let retry = || {
                        fs.clear_faults();
                        let step = if kind == "read" { n % 7 == 0 } else { true };
                        step.then(|| fs.clone())
                    };
                    if report.record_faulted_open(case, opened, &fs, &model, despite, retry) {
                        break;
                    }
                }
            }
        }
    }
    report.finish();
}

/// A close (flush and clean checkpoint) that loses power at its n-th operation, or whose n-th
/// fsync fails (then the database is dropped and opened again on the same file system).
#[test]
fn a_crash_or_a_failed_fsync_during_a_close() {
    let mut report = Report::new("fault in close");
    for seed in 0..seeds() {
        let (template, model) = build(seed, CrashMode::Random);
        for variant in VARIANTS {
            for n in 1..LIMIT {
                let case = format!("seed {seed}, {variant} at {n} of the close");
                let mut m = model.clone();
                let mut armed = Armed::new(copy(&template), variant);
                let db = open_cut(&armed.cut).unwrap();
                extend(&db, &mut m).unwrap();
                // A transaction still open at the close: the next open undoes it.
                let open_txn = std::env::var("LASTPAGE_CRASHREC_OPEN_AT_CLOSE")
                    .is_ok()
                    .then(|| {
                        let t = tables(&db);
                        let loser = db.session();
                        loser.begin().unwrap();
                        t.accounts
                            .update(&loser, &[Value::Int(3000)], &[(1, Value::Int(-30))])
                            .unwrap();
                        t.notes.delete(&loser, &[Value::Int(1001)]).unwrap();
                        insert_order(&t, &loser, &mut m, "open at close", false);
                        loser
                    });
                armed.arm(n);
                let closed = catch(|| db.close());
                drop(open_txn);
                let reached = armed.reached();
                let closed = match closed {
                    Ok(closed) => closed,
                    Err(panic) => {
                        report.record(case, Err(format!("close: {panic}")));
                        continue;
                    }
                };
                if closed.is_ok() && !reached {
                    armed.base.clear_faults();
                    let result = verify_after(&armed.base, &m, CrashMode::Random);
                    report.record(format!("{case} (completed)"), result);
                    break;
                }
                let fs = armed.after();
                report.record(case, verify_after(&fs, &m, CrashMode::LoseUnsynced));
            }
        }
    }
    report.finish();
}

/// A second crash after a successful recovery and more commits, then a power cut at every
/// operation of that second open.
#[test]
fn a_power_cut_in_the_open_after_a_second_crash() {
    let mut report = Report::new("power cut in second open");
    for seed in 0..seeds() {
        let (first, mut model) = build(seed, CrashMode::Random);
        let db = open_fs(&first).unwrap();
        model = check(&db, &model).unwrap();
        extend(&db, &mut model).unwrap();
        // An open transaction at the second crash, spanning a checkpoint.
        let t = tables(&db);
        let loser = db.session();
        loser.begin().unwrap();
        t.notes.delete(&loser, &[Value::Int(1500)]).unwrap();
        insert_order(&t, &loser, &mut model, "loser 3", false);
        db.checkpoint().unwrap();
        extend(&db, &mut model).unwrap();
        t.accounts
            .update(&loser, &[Value::Int(3000)], &[(1, Value::Int(-3))])
            .unwrap();
        let template = first.crash_with(CrashMode::Random);
        std::mem::forget(loser);
        drop(t);
        drop(db);
        for cut_mode in [CrashMode::LoseUnsynced, CrashMode::Random] {
            for n in 1..LIMIT {
                let cut = armed_cut(copy(&template), cut_mode, n);
                let case = format!("seed {seed}, cut {cut_mode:?} at op {n}");
                let completed = || format!("{case} (completed)");
                if report.record_cut_open(&case, &cut, &model, "open", completed) {
                    break;
                }
            }
        }
    }
    report.finish();
}

/// The process before the open failed an fsync of the log and went away without a power loss
/// (the page cache keeps what it wrote); the open then loses power at its n-th operation, or
/// its n-th fsync fails and it is retried.
#[test]
fn a_fault_in_the_open_after_a_process_whose_fsync_failed() {
    let mut report = Report::new("fault in open after fsyncgate");
    for seed in 0..seeds() {
        for variant in VARIANTS {
            for n in 1..LIMIT {
                let (fs, model) = build_with(seed, End::FailedFsync, big());
                let case = format!("seed {seed}, {variant} at {n}");
                let mut armed = Armed::new(fs, variant);
                armed.arm(n);
                let opened = open_with_fault(|| open_cut(&armed.cut), || armed.reached());
                let base = armed.base.clone();
                let after = || Some(armed.after());
                if report.record_faulted_open(case, opened, &base, &model, "open succeeded", after)
                {
                    break;
                }
            }
        }
    }
    report.finish();
}

/// The n-th fsync of the open fails; the retried open then loses power at its m-th operation.
#[test]
fn a_failed_fsync_in_the_open_then_a_power_cut_in_the_retry() {
    let mut report = Report::new("failed fsync then cut");
    for seed in 0..seeds() {
        let (template, model) = build(seed, CrashMode::Random);
        'n: for n in 1..LIMIT {
            for m in 1..LIMIT {
                let fs = copy(&template);
                fs.inject(FaultRule::sync_fails(n));
                let case = format!("seed {seed}, fsync {n} fails, then cut at {m}");
                // An open that gets past its failed fsync is not checked here: the retry,
                // under a cut, is what this test is about.
                match open_with_fault(|| open_fs(&fs), || fs.stats().failed_syncs > 0) {
                    Opened::Panicked(panic) => {
                        report.record(case, Err(format!("open: {panic}")));
                        continue;
                    }
                    Opened::Completed(db) => {
                        fs.clear_faults();
                        report.record(format!("{case} (completed)"), check_opened(db, &model));
                        break 'n;
                    }
                    Opened::Despite(_) | Opened::Failed(_) => {}
                }
                fs.clear_faults();
                let cut = armed_cut(fs.clone(), CrashMode::Random, m);
                let completed = || format!("{case} (retry completed)");
                if report.record_cut_open(&case, &cut, &model, "retry", completed) {
                    break;
                }
            }
        }
    }
    report.finish();
}

/// Power fails at the n-th operation of a new database's life: its creation, its first tables,
/// its first commits and a checkpoint. Whatever was acknowledged is there afterwards.
#[test]
fn a_power_cut_while_a_new_database_is_created_and_first_used() {
    let mut report = Report::new("power cut in creation");
    for seed in 0..seeds() {
        for mode in [CrashMode::LoseUnsynced, CrashMode::Random] {
            for n in 1..LIMIT {
                let cut = armed_cut(FaultyFileSystem::new(FaultyConfig::new(seed)), mode, n);
                let case = format!("seed {seed}, cut {mode:?} at {n}");
                let mut acked_tables = 0;
                let mut m = Model::default();
                let run = catch(|| -> Result<(), String> {
                    let db = open_cut(&cut).map_err(|e| e.to_string())?;
                    for def in [orders(), accounts_by_balance(), notes()] {
                        db.create_table(def).map_err(|e| e.to_string())?;
                        acked_tables += 1;
                    }
                    let t = tables(&db);
                    let s = db.session();
                    for id in 0..20 {
                        t.accounts
                            .insert(&s, InsertRow::new().set(0, id).set(1, id))
                            .map_err(|e| e.to_string())?;
                        m.accounts.insert(id, id);
                        let payload = format!("o{id}");
                        let oid = t
                            .orders
                            .insert(&s, InsertRow::new().set(1, payload.as_str()))
                            .map_err(|e| e.to_string())?
                            .unwrap();
                        m.max_identity = oid;
                        m.orders.insert(oid, payload);
                        if id == 10 {
                            db.checkpoint().map_err(|e| e.to_string())?;
                        }
                    }
                    let rows: Vec<InsertRow> = (0..300)
                        .map(|id| InsertRow::new().set(0, id).set(1, note_text(id, 0)))
                        .collect();
                    t.notes.insert_batch(&s, rows).map_err(|e| e.to_string())?;
                    for id in 0..300 {
                        m.notes.insert(id, note_text(id, 0));
                    }
                    db.checkpoint().map_err(|e| e.to_string())?;
                    Ok(())
                });
                let completed = matches!(run, Ok(Ok(()))) && !cut.fired();
                if let Err(panic) = &run {
                    report.record(case.clone(), Err(panic.clone()));
                }
                if let Ok(Err(error)) = &run
                    && !cut.fired()
                {
                    report.record(
                        case.clone(),
                        Err(format!("failed without a fault: {error}")),
                    );
                    continue;
                }
                if completed {
                    report.record(format!("{case} (completed)"), Ok(()));
                    break;
                }
                let Some(after) = cut.after() else {
                    continue;
                };
                let result = (|| -> Result<(), String> {
                    let db = catch(|| open_fs(&after))?
                        .map_err(|e| format!("open after the cut failed: {e}"))?;
                    let names: Vec<String> =
                        db.tables().iter().map(|t| t.name().to_string()).collect();
                    if names.len() < acked_tables {
                        return Err(format!(
                            "{acked_tables} tables created, {names:?} after the crash"
                        ));
                    }
                    if names.len() < 3 {
                        // The model's rows need every table; what was acknowledged was at most
                        // tables, which are there.
                        return Ok(());
                    }
                    // Acknowledged rows present; nothing else is expected to be missing, and
                    // unacknowledged rows (the one cut) may or may not be there, so check
                    // inclusion only.
                    let t = tables(&db);
                    let s = db.session();
                    for (id, balance) in &m.accounts {
                        let row = t
                            .accounts
                            .get(&s, &[Value::Int(*id)])
                            .map_err(|e| e.to_string())?;
                        if row.map(|r| r[1].clone()) != Some(Value::Int(*balance)) {
                            return Err(format!("acknowledged account {id} lost"));
                        }
                    }
                    for id in m.orders.keys() {
                        if t.orders
                            .get(&s, &[Value::BigInt(*id)])
                            .map_err(|e| e.to_string())?
                            .is_none()
                        {
                            return Err(format!("acknowledged order {id} lost"));
                        }
                    }
                    db.check_integrity().map_err(|e| e.to_string())?;
                    let id = t
                        .orders
                        .insert(&s, InsertRow::new().set(1, "after"))
                        .map_err(|e| e.to_string())?
                        .unwrap();
                    if id <= m.max_identity {
                        return Err(format!("identity {id} reused"));
                    }
                    Ok(())
                })();
                report.record(case, result);
            }
        }
    }
    report.finish();
}
