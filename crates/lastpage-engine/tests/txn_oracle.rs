//! Transactions against oracles, where bugs in transactions, locks and the log would show.
//!
//! The first two tests interleave explicit and autocommit transactions of several sessions on
//! one thread, against a simple oracle: committed rows, each open transaction's own changes, and
//! the rows each transaction holds locked. Every lock request times out at once (`lock_timeout`
//! zero), so a request that would wait fails deterministically with error 1222, and the oracle
//! knows which ones must: any statement or read that touches a row another open transaction
//! locked. Every other statement must succeed exactly as the oracle says, so a lock left behind
//! by a commit, a rollback or a failed statement, a row lost or duplicated by a rollback, and a
//! reader that sees another transaction's uncommitted change all fail the test. Cases vary the
//! table (a nonclustered index, partitions, an identity-keyed table that is not logged), the
//! default durability, the log's segment size and a page limit that the statements reach. The
//! durable run also checkpoints, closes and crashes the database now and then: a clean close
//! must keep exactly the committed rows, and a crash the committed rows as of some commit at or
//! after the last one known to be durable (a FULL commit, a waited pipelined commit, a flush).
//!
//! The others run sessions on threads: transfers that deadlock (every deadlock must be found,
//! and no money made or lost), marks that READ COMMITTED readers must never see, increments
//! that must be neither lost nor doubled, and transfers with a ledger through a power cut in
//! the middle (atomic and durable).
//!
//! Randomized: each test prints its seed; rerun with `LASTPAGE_SEED=<seed>` (and
//! `LASTPAGE_TEST_CASES=<n>` for n times the cases).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use lastpage_engine::locks::LockError;
use lastpage_engine::{
    Database, DatabaseOptions, Direction, Durability, EngineError, InsertRow, KeyRange, Session,
    Table, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{
    CRASH_MODES, DIR, accounts, accounts_by_balance, cases, options, orders, seed, try_rows,
};

const SESSIONS: usize = 3;
const KEYS: i64 = 10;
const BALANCES: i64 = 4;
/// How many pages past those a run starts with the cases at a page limit may take.
const PAGE_HEADROOM: usize = 1;

/// The oracle's two tables: `Accounts` (explicit keys) and `Orders` (identity keys).
const ACCOUNTS: usize = 0;
const ORDERS: usize = 1;

/// One session's open explicit transaction, as the oracle sees it (per table).
#[derive(Default, Clone)]
struct OpenTxn {
    /// Its own changes: key -> new value, or `None` for a row it deleted.
    changes: [BTreeMap<i64, Option<i64>>; 2],
    /// The rows it holds locked.
    locks: [BTreeSet<i64>; 2],
    /// The rows it deleted or changed so that an entry of it left an index (see `pending.rs`):
    /// readers wait for such a row even when it is not in the tree.
    noted: [BTreeSet<i64>; 2],
    delayed: bool,
    /// Whether it changed a row (so that it logged something).
    wrote: bool,
    /// Whether it changed `Orders` when that table is not logged: a clean close then cannot
    /// keep that table's rows.
    touched_orders: bool,
}

#[derive(Clone, Default, PartialEq, Debug)]
struct State([BTreeMap<i64, i64>; 2]);

struct Oracle {
    committed: State,
    txns: Vec<Option<OpenTxn>>,
    /// Committed states since the last point at which the log was known to be durable: the
    /// first is durable; a crash may keep any later one.
    since_durable: Vec<State>,
    /// Every identity value handed out, crashes included: none may come twice.
    handed: BTreeSet<i64>,
    orders_logged: bool,
    /// Whether autocommit statements (and `begin`) are DELAYED, the database's default.
    delayed_default: bool,
}

impl Oracle {
    fn visible(&self, session: usize, table: usize, key: i64) -> Option<i64> {
        match self.txns[session]
            .as_ref()
            .and_then(|txn| txn.changes[table].get(&key))
        {
            Some(change) => *change,
            None => self.committed.0[table].get(&key).copied(),
        }
    }

    fn visible_rows(&self, session: usize, table: usize) -> BTreeMap<i64, i64> {
        let mut rows = self.committed.0[table].clone();
        if let Some(txn) = &self.txns[session] {
            for (key, change) in &txn.changes[table] {
                match change {
                    Some(value) => rows.insert(*key, *value),
                    None => rows.remove(key),
                };
            }
        }
        rows
    }

    fn locked_by_other(&self, session: usize, table: usize, key: i64) -> bool {
        self.txns.iter().enumerate().any(|(other, txn)| {
            other != session && txn.as_ref().is_some_and(|t| t.locks[table].contains(&key))
        })
    }

    /// Whether a read of `key` by `session` must wait for another transaction: one that holds
    /// the row locked, if the row is in the tree (that transaction's version of it) or that
    /// transaction deleted it. (A lock on a key with no row, left by a failed insert, blocks
    /// inserts only.)
    fn read_blocked(&self, session: usize, table: usize, key: i64) -> bool {
        self.txns.iter().enumerate().any(|(other, txn)| {
            other != session
                && txn.as_ref().is_some_and(|t| {
                    t.locks[table].contains(&key)
                        && (t.noted[table].contains(&key)
                            || self.visible(other, table, key).is_some())
                })
        })
    }

    /// A key at or above every key any transaction locked or any row holds in `table`.
    fn max_key(&self, table: usize) -> i64 {
        let locked = self
            .txns
            .iter()
            .flatten()
            .flat_map(|txn| txn.locks[table].iter());
        let committed = self.committed.0[table].keys();
        locked
            .chain(committed)
            .copied()
            .max()
            .unwrap_or(0)
            .max(KEYS)
    }

    /// Whether a scan of `table` by `session` must wait for another transaction.
    fn scan_blocked(&self, session: usize, table: usize) -> bool {
        self.txns.iter().enumerate().any(|(other, txn)| {
            other != session
                && txn.as_ref().is_some_and(|t| {
                    t.locks[table]
                        .iter()
                        .any(|&key| self.read_blocked(session, table, key))
                })
        })
    }

    /// Records that `session` locked `key` (only an explicit transaction keeps it).
    fn lock(&mut self, session: usize, table: usize, key: i64) {
        if let Some(txn) = &mut self.txns[session] {
            txn.locks[table].insert(key);
        }
    }

    /// Records that `session`'s transaction noted `key` as deleted.
    fn note(&mut self, session: usize, table: usize, key: i64) {
        if let Some(txn) = &mut self.txns[session] {
            txn.noted[table].insert(key);
        }
    }

    /// Applies successful changes of one statement of `session`: into its transaction, or
    /// committed at once (an autocommit statement, FULL).
    fn change(&mut self, session: usize, table: usize, changes: &[(i64, Option<i64>)]) {
        match &mut self.txns[session] {
            Some(txn) => {
                txn.touched_orders |= table == ORDERS;
                for &(key, value) in changes {
                    txn.changes[table].insert(key, value);
                }
                txn.wrote |= table == ACCOUNTS || self.orders_logged;
            }
            None => {
                for &(key, value) in changes {
                    match value {
                        Some(value) => self.committed.0[table].insert(key, value),
                        None => self.committed.0[table].remove(&key),
                    };
                }
                self.committed_now(
                    (table == ACCOUNTS || self.orders_logged) && !self.delayed_default,
                );
            }
        }
    }

    fn commit(&mut self, txn: &OpenTxn, durable: bool) {
        for table in [ACCOUNTS, ORDERS] {
            for (key, change) in &txn.changes[table] {
                match change {
                    Some(value) => self.committed.0[table].insert(*key, *value),
                    None => self.committed.0[table].remove(key),
                };
            }
        }
        self.committed_now(durable);
    }

    fn committed_now(&mut self, durable: bool) {
        if durable {
            self.since_durable = vec![self.committed.clone()];
        } else {
            self.since_durable.push(self.committed.clone());
        }
    }
}

/// A durable database on `fs` (opened or created there), or an in-memory one without `fs`, whose
/// lock waits time out after `lock_timeout`.
fn database(fs: Option<&FaultyFileSystem>, lock_timeout: Option<Duration>) -> Database {
    database_escalating(fs, lock_timeout, false)
}

/// [`database`], in which, if `escalate`, an explicit transaction tries to escalate to a lock
/// on the whole table after every statement (a threshold of one row lock), and, in a durable
/// database, lets the entries of its undo list go after every statement (so that its rollback
/// undoes its changes from the log), so that the concurrent tests below run with such
/// transactions among the others: what a large transaction does, at every size.
fn database_escalating(
    fs: Option<&FaultyFileSystem>,
    lock_timeout: Option<Duration>,
    escalate: bool,
) -> Database {
    let defaults = DatabaseOptions::default();
    let (lock_escalation_threshold, undo_kept_entries) = if escalate {
        (Some(1), 1)
    } else {
        (
            defaults.lock_escalation_threshold,
            defaults.undo_kept_entries,
        )
    };
    match fs {
        Some(fs) => Database::open(
            DIR,
            DatabaseOptions {
                lock_timeout,
                lock_escalation_threshold,
                undo_kept_entries,
                ..options(fs)
            },
        ),
        None => Database::create(DatabaseOptions {
            lock_timeout,
            lock_escalation_threshold,
            ..defaults
        }),
    }
    .unwrap()
}

/// After a run with escalations, checks that transactions tried to escalate, and in a durable
/// database that they let undo entries go. How many escalations succeeded depends on the
/// schedule (an attempt fails while another transaction holds a lock on the table): tens to
/// hundreds a run here, which the printed statistics show, but a run with none is possible,
/// and `tests/locks.rs` tests successful ones for certain.
fn assert_escalated(db: &Database, escalate: bool) {
    let stats = db.lock_stats();
    let undo = db.undo_stats();
    println!("{stats:?} {undo:?}");
    if escalate {
        assert!(
            stats.escalations + stats.failed_escalations > 0,
            "no transaction tried to escalate: {stats:?}"
        );
        assert!(
            !db.is_durable() || undo.spills > 0,
            "no transaction let its undo entries go: {undo:?}"
        );
    } else {
        assert_eq!(stats.escalations, 0, "{stats:?}");
        assert_eq!(undo.spills, 0, "{undo:?}");
    }
}

fn is_timeout<T: std::fmt::Debug>(result: &Result<T, EngineError>) -> bool {
    matches!(result, Err(EngineError::Lock(LockError::Timeout { .. })))
}

fn is_pool_full<T: std::fmt::Debug>(result: &Result<T, EngineError>) -> bool {
    matches!(result, Err(EngineError::PoolFull(_)))
}

/// A row of either table as (key, value).
fn row_of(row: &[Value]) -> (i64, i64) {
    match row {
        [Value::Int(key), Value::Int(balance)] => (i64::from(*key), i64::from(*balance)),
        [Value::BigInt(id), Value::String(payload)] => (*id, payload.parse().unwrap()),
        other => panic!("unexpected row {other:?}"),
    }
}

fn insert_row(key: i64, balance: i64) -> InsertRow {
    InsertRow::new().set(0, key as i32).set(1, balance as i32)
}

/// An order whose payload is `payload`, padded to 90 characters, so that orders fill pages
/// (and a database at its page limit).
fn order_row(payload: i64) -> InsertRow {
    InsertRow::new().set(1, format!("{payload:090}"))
}

/// The value of a row in either table's terms.
fn value_of(table: usize, value: i64) -> Value {
    match table {
        ACCOUNTS => Value::Int(value as i32),
        _ => Value::String(format!("{value:090}")),
    }
}

fn key_of(table: usize, key: i64) -> Value {
    match table {
        ACCOUNTS => Value::Int(key as i32),
        _ => Value::BigInt(key),
    }
}

fn read_state(tables: &[Arc<Table>; 2], session: &Session) -> State {
    State([ACCOUNTS, ORDERS].map(|table| {
        try_rows(&tables[table], session)
            .unwrap()
            .iter()
            .map(|row| row_of(row))
            .collect()
    }))
}

struct Run {
    rng: StdRng,
    oracle: Oracle,
    with_index: bool,
    /// Whether `Orders` is logged (else a crash empties it).
    orders_logged: bool,
    /// Statements refused at the page limit.
    pool_full: usize,
    log: Vec<String>,
}

impl Run {
    /// One random operation of a random session; panics (with the operations so far) when
    /// the engine disagrees with the oracle.
    fn step(&mut self, tables: &[Arc<Table>; 2], sessions: &[Session]) {
        let s = self.rng.random_range(0..SESSIONS);
        let session = &sessions[s];
        let on_orders = self.rng.random_bool(0.35);
        let t = if on_orders { ORDERS } else { ACCOUNTS };
        let table = &tables[t];
        let key = if on_orders {
            // An id handed out lately, or one never handed out.
            let last = self.oracle.handed.last().copied().unwrap_or(1);
            last - self.rng.random_range(-1..8)
        } else {
            self.rng.random_range(0..KEYS)
        };
        let value = self.rng.random_range(0..BALANCES);
        let in_txn = self.oracle.txns[s].is_some();
        let blocked = self.oracle.read_blocked(s, t, key);
        let choice = self.rng.random_range(0..100);
        macro_rules! check {
            ($cond:expr, $($what:tt)*) => {
                if !$cond {
                    let what = format!($($what)*);
                    panic!(
                        "{what}\nsession {s}, table {t}, oracle committed {:?}\nsteps:\n{}",
                        self.oracle.committed,
                        self.log.join("\n")
                    );
                }
            };
        }
        match choice {
            0..=9 => {
                if in_txn {
                    let txn = self.oracle.txns[s].take().expect("in a transaction");
                    match self.rng.random_range(0..5) {
                        0..=1 => {
                            self.log.push(format!("s{s} commit"));
                            let result = session.commit();
                            check!(result.is_ok(), "commit failed: {result:?}");
                            self.oracle.commit(&txn, txn.wrote && !txn.delayed);
                        }
                        2 => {
                            self.log.push(format!("s{s} commit_pipelined"));
                            let ticket = session.commit_pipelined();
                            check!(ticket.is_ok(), "pipelined commit failed: {ticket:?}");
                            let waited = self.rng.random_bool(0.5);
                            if waited {
                                let result = ticket.unwrap().wait();
                                check!(result.is_ok(), "ticket: {result:?}");
                            }
                            self.oracle.commit(&txn, txn.wrote && waited);
                        }
                        _ => {
                            self.log.push(format!("s{s} rollback"));
                            let result = session.rollback();
                            check!(result.is_ok(), "rollback failed: {result:?}");
                        }
                    }
                } else {
                    let delayed = self.rng.random_bool(0.3);
                    self.log.push(format!("s{s} begin delayed={delayed}"));
                    let result = if delayed {
                        session.begin_with(Durability::Delayed)
                    } else {
                        session.begin()
                    };
                    check!(result.is_ok(), "begin failed: {result:?}");
                    self.oracle.txns[s] = Some(OpenTxn {
                        delayed: delayed || self.oracle.delayed_default,
                        ..OpenTxn::default()
                    });
                }
            }
            10..=27 if on_orders => {
                // The three single-row paths: an `InsertRow`, a prepared insert of values the
                // caller keeps, and a one-row batch of such values.
                let how = self.rng.random_range(0..3);
                self.log
                    .push(format!("s{s} insert order {value} (path {how})"));
                let payload = [value_of(ORDERS, value)];
                let result = match how {
                    0 => table.insert(session, order_row(value)),
                    1 => table
                        .prepare_insert(&[1])
                        .and_then(|prepared| prepared.insert(session, &payload)),
                    _ => table
                        .insert_batch_values(session, &[1], [&payload[..]])
                        .map(|ids| ids[0]),
                };
                if is_pool_full(&result) {
                    // At the page limit: the statement changed nothing.
                    self.pool_full += 1;
                    return;
                }
                let Ok(Some(id)) = result else {
                    check!(false, "order insert: {result:?}");
                    return;
                };
                check!(self.oracle.handed.insert(id), "id {id} handed out twice");
                self.oracle.lock(s, t, id);
                self.oracle.change(s, t, &[(id, Some(value))]);
            }
            10..=27 => {
                self.log.push(format!("s{s} insert {key} {value}"));
                let result = table.insert(session, insert_row(key, value));
                if self.oracle.locked_by_other(s, t, key) {
                    check!(is_timeout(&result), "insert of a locked row: {result:?}");
                } else if self.oracle.visible(s, t, key).is_some() {
                    check!(
                        matches!(result, Err(EngineError::DuplicateKey { .. })),
                        "insert of an existing row: {result:?}"
                    );
                    self.oracle.lock(s, t, key);
                } else if is_pool_full(&result) {
                    // The row was locked, and nothing changed.
                    self.pool_full += 1;
                    self.oracle.lock(s, t, key);
                } else {
                    check!(result.is_ok(), "insert failed: {result:?}");
                    self.oracle.lock(s, t, key);
                    self.oracle.change(s, t, &[(key, Some(value))]);
                }
            }
            28..=42 => {
                self.log.push(format!("s{s} update {t}:{key} {value}"));
                let result = table.update(session, &[key_of(t, key)], &[(1, value_of(t, value))]);
                if blocked {
                    check!(is_timeout(&result), "update of a locked row: {result:?}");
                } else if self.oracle.visible(s, t, key).is_some() && is_pool_full(&result) {
                    // A new index entry needed a page: the row stays locked (and noted), and
                    // nothing changed.
                    self.pool_full += 1;
                    self.oracle.lock(s, t, key);
                    if self.with_index && t == ACCOUNTS {
                        self.oracle.note(s, t, key);
                    }
                } else if self.oracle.visible(s, t, key).is_some() {
                    check!(matches!(result, Ok(true)), "update: {result:?}");
                    self.oracle.lock(s, t, key);
                    if self.with_index && t == ACCOUNTS {
                        self.oracle.note(s, t, key);
                    }
                    self.oracle.change(s, t, &[(key, Some(value))]);
                } else {
                    check!(matches!(result, Ok(false)), "update of no row: {result:?}");
                }
            }
            43..=52 if !on_orders => {
                // Moves the row to another key.
                let to = self.rng.random_range(0..KEYS);
                self.log.push(format!("s{s} move {key} -> {to}"));
                let result = table.update(session, &[key_of(t, key)], &[(0, key_of(t, to))]);
                let Some(value) = (!blocked).then(|| self.oracle.visible(s, t, key)).flatten()
                else {
                    if blocked {
                        check!(is_timeout(&result), "move of a locked row: {result:?}");
                    } else {
                        check!(matches!(result, Ok(false)), "move of no row: {result:?}");
                    }
                    return;
                };
                self.oracle.lock(s, t, key);
                if is_pool_full(&result) {
                    check!(
                        !self.oracle.locked_by_other(s, t, to),
                        "a move onto a locked row: {result:?}"
                    );
                    self.pool_full += 1;
                    self.oracle.lock(s, t, to);
                    if to != key || self.with_index {
                        self.oracle.note(s, t, key);
                    }
                    return;
                }
                if to == key {
                    check!(matches!(result, Ok(true)), "move in place: {result:?}");
                    if self.with_index {
                        self.oracle.note(s, t, key);
                    }
                    self.oracle.change(s, t, &[(key, Some(value))]);
                } else if self.oracle.locked_by_other(s, t, to) {
                    check!(is_timeout(&result), "move onto a locked row: {result:?}");
                } else if self.oracle.visible(s, t, to).is_some() {
                    check!(
                        matches!(result, Err(EngineError::DuplicateKey { .. })),
                        "move onto an existing row: {result:?}"
                    );
                    self.oracle.lock(s, t, to);
                    self.oracle.note(s, t, key);
                    if let Some(txn) = &mut self.oracle.txns[s] {
                        // The failed statement logged its delete and its compensation.
                        txn.wrote = true;
                    }
                } else {
                    check!(matches!(result, Ok(true)), "move: {result:?}");
                    self.oracle.lock(s, t, to);
                    self.oracle.note(s, t, key);
                    self.oracle.change(s, t, &[(key, None), (to, Some(value))]);
                }
            }
            43..=62 => {
                self.log.push(format!("s{s} delete {t}:{key}"));
                let result = table.delete(session, &[key_of(t, key)]);
                if blocked {
                    check!(is_timeout(&result), "delete of a locked row: {result:?}");
                } else if self.oracle.visible(s, t, key).is_some() {
                    check!(matches!(result, Ok(true)), "delete: {result:?}");
                    self.oracle.lock(s, t, key);
                    self.oracle.note(s, t, key);
                    self.oracle.change(s, t, &[(key, None)]);
                } else {
                    check!(matches!(result, Ok(false)), "delete of no row: {result:?}");
                }
            }
            63..=72 if on_orders => {
                let count = self.rng.random_range(1..=12);
                self.log
                    .push(format!("s{s} batch of {count} orders {value}"));
                let result = if self.rng.random_bool(0.5) {
                    let rows = (0..count).map(|_| order_row(value)).collect();
                    table.insert_batch(session, rows)
                } else {
                    let payload = [value_of(ORDERS, value)];
                    let rows: Vec<&[Value]> = (0..count).map(|_| &payload[..]).collect();
                    table.insert_batch_values(session, &[1], rows)
                };
                if is_pool_full(&result) {
                    self.pool_full += 1;
                    return;
                }
                let Ok(ids) = result else {
                    check!(false, "order batch: {result:?}");
                    return;
                };
                let mut changes = Vec::new();
                for id in ids {
                    let Some(id) = id else {
                        check!(false, "no id");
                        return;
                    };
                    check!(self.oracle.handed.insert(id), "id {id} handed out twice");
                    self.oracle.lock(s, t, id);
                    changes.push((id, Some(value)));
                }
                self.oracle.change(s, t, &changes);
            }
            63..=72 => {
                // A batch of distinct keys, locked in order.
                let mut keys: Vec<i64> = (0..KEYS).collect();
                let count = self.rng.random_range(1..=3);
                for index in 0..count {
                    let other = self.rng.random_range(index..keys.len());
                    keys.swap(index, other);
                }
                keys.truncate(count);
                self.log.push(format!("s{s} batch {keys:?} {value}"));
                let rows = keys.iter().map(|&key| insert_row(key, value)).collect();
                let result = table.insert_batch(session, rows);
                let mut conflict = false;
                for &key in &keys {
                    if self.oracle.locked_by_other(s, t, key) {
                        conflict = true;
                        break;
                    }
                    self.oracle.lock(s, t, key);
                }
                if conflict {
                    check!(is_timeout(&result), "batch over a locked row: {result:?}");
                } else if is_pool_full(&result) {
                    self.pool_full += 1;
                } else if keys
                    .iter()
                    .any(|&key| self.oracle.visible(s, t, key).is_some())
                {
                    check!(
                        matches!(result, Err(EngineError::DuplicateKey { .. })),
                        "batch over an existing row: {result:?}"
                    );
                } else {
                    check!(result.is_ok(), "batch: {result:?}");
                    let changes: Vec<_> = keys.iter().map(|&key| (key, Some(value))).collect();
                    self.oracle.change(s, t, &changes);
                }
            }
            73..=84 => {
                self.log.push(format!("s{s} get {t}:{key}"));
                let result = table.get(session, &[key_of(t, key)]);
                if blocked {
                    check!(is_timeout(&result), "get of a locked row: {result:?}");
                } else {
                    let got = result.map(|row| row.map(|row| row_of(&row).1));
                    let expected = self.oracle.visible(s, t, key);
                    check!(
                        matches!(got, Ok(ref got) if *got == expected),
                        "get {key}: {got:?}, expected {expected:?}"
                    );
                }
            }
            85..=92 => {
                // A scan of the whole table or of a range from `key` (either end, included
                // or not), in either direction.
                let direction = if self.rng.random_bool(0.5) {
                    Direction::Forward
                } else {
                    Direction::Backward
                };
                let whole = self.rng.random_bool(0.4);
                let included = self.rng.random_bool(0.5);
                let from_below = self.rng.random_bool(0.5);
                let bound = |key: i64| {
                    if included {
                        Bound::Included(vec![key_of(t, key)])
                    } else {
                        Bound::Excluded(vec![key_of(t, key)])
                    }
                };
                let (range, in_range): (KeyRange, Box<dyn Fn(i64) -> bool>) = if whole {
                    (KeyRange::all(), Box::new(|_| true))
                } else if from_below {
                    let range = KeyRange {
                        lower: bound(key),
                        upper: Bound::Unbounded,
                    };
                    (range, Box::new(move |k| k > key || (included && k == key)))
                } else {
                    let range = KeyRange {
                        lower: Bound::Unbounded,
                        upper: bound(key),
                    };
                    (range, Box::new(move |k| k < key || (included && k == key)))
                };
                self.log
                    .push(format!("s{s} scan {t} {range:?} {direction:?}"));
                let result: Result<Vec<(i64, i64)>, String> = table
                    .scan(session, &range, direction)
                    .map_err(|error| error.to_string())
                    .and_then(|rows| {
                        rows.map(|row| row.map(|row| row_of(&row)).map_err(|e| e.to_string()))
                            .collect()
                    });
                let blocked = (0..=self.oracle.max_key(t))
                    .any(|key| in_range(key) && self.oracle.read_blocked(s, t, key));
                if blocked {
                    check!(
                        matches!(&result, Err(error) if error.contains("time out")),
                        "scan past a locked row: {result:?}"
                    );
                } else {
                    let mut expected: Vec<(i64, i64)> = self
                        .oracle
                        .visible_rows(s, t)
                        .into_iter()
                        .filter(|&(key, _)| in_range(key))
                        .collect();
                    if direction == Direction::Backward {
                        expected.reverse();
                    }
                    check!(
                        matches!(result, Ok(ref got) if *got == expected),
                        "scan: {result:?}, expected {expected:?}"
                    );
                }
            }
            _ => {
                if !self.with_index || on_orders {
                    return;
                }
                self.log.push(format!("s{s} get_by_index {value}"));
                let result = table.get_by_index(session, "IX_Balance", &[value_of(t, value)]);
                match result {
                    Ok(rows) => {
                        let got: BTreeMap<i64, i64> = rows.iter().map(|row| row_of(row)).collect();
                        let expected: BTreeMap<i64, i64> = self
                            .oracle
                            .visible_rows(s, t)
                            .into_iter()
                            .filter(|&(_, b)| b == value)
                            .collect();
                        check!(
                            got == expected,
                            "get_by_index {value}: {got:?}, expected {expected:?}"
                        );
                    }
                    Err(error) => check!(
                        matches!(error, EngineError::Lock(LockError::Timeout { .. }))
                            && self.oracle.scan_blocked(s, t),
                        "get_by_index {value}: {error:?}"
                    ),
                }
            }
        }
    }
}

fn run(
    seed: u64,
    durable: bool,
    with_index: bool,
    steps: usize,
    segment_bytes: u64,
    orders_logged: bool,
) {
    let definition = if with_index {
        accounts_by_balance()
    } else {
        accounts()
    };
    // Every fourth case partitions `Accounts`, so that a move can change a row's partition.
    let definition = if seed % 4 == 3 {
        definition.partitioned("Id", 3)
    } else {
        definition
    };
    // Every fifth case makes DELAYED the database's default durability.
    let delayed_default = seed % 5 == 4;
    // Every third case runs at a page limit that the orders reach: a few pages more than the
    // database holds when the run starts, and after every reopen.
    let limit_pages = |db: &Database| {
        if seed % 3 == 1 {
            db.pool()
                .set_max_pages(db.pool().page_count() + PAGE_HEADROOM);
        }
    };
    let open = |fs: &FaultyFileSystem| {
        Database::open(
            DIR,
            DatabaseOptions {
                lock_timeout: Some(Duration::ZERO),
                durability: if delayed_default {
                    Durability::Delayed
                } else {
                    Durability::Full
                },
                // Automatic checkpoints (on their own thread) at any point of the run, too.
                checkpoint_log_bytes: [4 << 10, 1 << 30][seed as usize % 2],
                // Every other pair of cases lets an explicit transaction's undo entries go after
                // every statement, so that its rollback, and recovery, undo it from the log:
                // failed statements among the rest.
                undo_kept_entries: if (seed / 2).is_multiple_of(2) {
                    1
                } else {
                    DatabaseOptions::default().undo_kept_entries
                },
                wal: WalConfig {
                    buffer_bytes: 64 << 10,
                    segment_bytes,
                    ..WalConfig::default()
                },
                ..options(fs)
            },
        )
        .unwrap()
    };
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let mut db = if durable {
        open(&fs)
    } else {
        Database::create(DatabaseOptions {
            lock_timeout: Some(Duration::ZERO),
            ..DatabaseOptions::default()
        })
        .unwrap()
    };
    let mut tables = [
        db.create_table(definition).unwrap(),
        db.create_table(if orders_logged {
            orders()
        } else {
            orders().not_logged()
        })
        .unwrap(),
    ];
    limit_pages(&db);
    let mut run = Run {
        rng: StdRng::seed_from_u64(seed),
        oracle: Oracle {
            committed: State::default(),
            txns: vec![None; SESSIONS],
            since_durable: vec![State::default()],
            handed: BTreeSet::new(),
            orders_logged,
            delayed_default,
        },
        with_index,
        orders_logged,
        pool_full: 0,
        log: Vec::new(),
    };
    let mut sessions: Vec<Session> = (0..SESSIONS).map(|_| db.session()).collect();
    for _ in 0..steps {
        if durable && run.rng.random_bool(0.01) {
            run.log.push("checkpoint".into());
            db.checkpoint().unwrap();
        }
        if durable && run.rng.random_bool(0.01) {
            run.log.push("flush_log".into());
            db.flush_log().unwrap();
            let committed = run.oracle.committed.clone();
            run.oracle.since_durable = vec![committed];
        }
        if durable && run.rng.random_bool(0.003) {
            // A clean close with transactions open: they are undone by the next open, and
            // every commit so far is kept, DELAYED ones included.
            run.log.push("close".into());
            let keeps_orders = run.orders_logged
                || run
                    .oracle
                    .txns
                    .iter()
                    .flatten()
                    .all(|txn| !txn.touched_orders);
            if !keeps_orders {
                run.oracle.committed.0[ORDERS].clear();
            }
            db.clone().close().unwrap();
            drop(sessions);
            drop(tables);
            drop(db);
            db = open(&fs);
            limit_pages(&db);
            tables = [db.table("Accounts").unwrap(), db.table("Orders").unwrap()];
            let reopened = read_state(&tables, &db.session());
            assert_eq!(
                reopened,
                run.oracle.committed,
                "after a clean close\nsteps:\n{}",
                run.log.join("\n")
            );
            run.oracle.since_durable = vec![reopened];
            run.oracle.txns = vec![None; SESSIONS];
            sessions = (0..SESSIONS).map(|_| db.session()).collect();
            continue;
        }
        if durable && run.rng.random_bool(0.005) {
            let mode = match run.rng.random_range(0..3) {
                0 => CrashMode::LoseUnsynced,
                1 => CrashMode::KeepUnsynced,
                _ => CrashMode::Random,
            };
            run.log.push(format!("crash {mode:?}"));
            let after = fs.crash_with(mode);
            // The sessions' open transactions die with the process: no rollback runs.
            for session in sessions.drain(..) {
                std::mem::forget(session);
            }
            drop(tables);
            drop(db);
            fs = after;
            db = open(&fs);
            limit_pages(&db);
            tables = [db.table("Accounts").unwrap(), db.table("Orders").unwrap()];
            let recovered = read_state(&tables, &db.session());
            if !run.orders_logged {
                // A crash empties a table that is not logged, and its identity counter starts
                // again from the last checkpoint's.
                assert!(recovered.0[ORDERS].is_empty(), "{recovered:?}");
                for state in &mut run.oracle.since_durable {
                    state.0[ORDERS].clear();
                }
                run.oracle.handed.clear();
            }
            assert!(
                run.oracle.since_durable.contains(&recovered),
                "after the crash: {recovered:?}, expected one of {:?}\nsteps:\n{}",
                run.oracle.since_durable,
                run.log.join("\n")
            );
            run.oracle.committed = recovered.clone();
            run.oracle.since_durable = vec![recovered];
            run.oracle.txns = vec![None; SESSIONS];
            sessions = (0..SESSIONS).map(|_| db.session()).collect();
            continue;
        }
        run.step(&tables, &sessions);
    }
    // Every transaction ends; then nothing may be locked any more, and a fresh session sees
    // exactly the committed rows.
    for (s, session) in sessions.iter().enumerate() {
        if let Some(txn) = run.oracle.txns[s].take() {
            session.commit().unwrap();
            run.oracle.commit(&txn, false);
        }
    }
    let reader = db.session();
    let got = read_state(&tables, &reader);
    assert_eq!(got, run.oracle.committed, "steps:\n{}", run.log.join("\n"));
    for table in [ACCOUNTS, ORDERS] {
        for &key in run.oracle.committed.0[table].keys() {
            let result = tables[table].update(&reader, &[key_of(table, key)], &[]);
            assert!(
                matches!(result, Ok(true)),
                "row {table}:{key} still locked: {result:?}"
            );
        }
    }
    db.check_integrity().unwrap();
    if std::env::var_os("LASTPAGE_VERBOSE").is_some() {
        println!(
            "seed {seed}: {} statements refused at the page limit",
            run.pool_full
        );
    }
}

#[test]
fn interleaved_transactions_match_the_oracle_in_memory() {
    let seed = seed();
    for case in 0..cases(60) as u64 {
        run(seed.wrapping_add(case), false, case % 2 == 1, 400, 0, true);
    }
}

#[test]
fn interleaved_transactions_match_the_oracle_through_crashes() {
    let seed = seed();
    for case in 0..cases(24) as u64 {
        // Small segments too, so that flushes, checkpoints and crashes meet segment ends.
        let segment_bytes = [256 << 10, 4096, 512, 104][case as usize % 4];
        run(
            seed.wrapping_add(case),
            true,
            case % 2 == 1,
            600,
            segment_bytes,
            case % 3 != 2,
        );
    }
}

/// Threads move money between accounts in explicit transactions (each row locked by an empty
/// update, read, changed; some rows deleted and inserted again in the same transaction; other
/// rows read inside the transaction, so that readers take part in deadlocks; a third of the
/// transactions rolled back), while other threads scan. Lock requests wait as long as the
/// detector needs (a timeout here would be a deadlock it missed), a victim rolls back and
/// reruns. Scans must always find every account exactly once, and at the end the balances
/// must add up to what they started at and nothing may be left locked.
fn transfers(seed: u64, durable: bool, short_timeouts: bool, escalate: bool) {
    const ACCOUNTS: i64 = 8;
    const WRITERS: u64 = 5;
    const TRANSACTIONS: usize = 60;
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    // Either long enough that a timeout means a deadlock went undetected, or so short that
    // timeouts are common: then they must leave nothing behind either.
    let lock_timeout = Some(if short_timeouts {
        Duration::from_millis(2)
    } else {
        Duration::from_secs(30)
    });
    let db = database_escalating(durable.then_some(&fs), lock_timeout, escalate);
    let (table, setup) = accounts_filled(&db, ACCOUNTS, |_| 100);
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..WRITERS {
            let (db, table, done) = (&db, &table, &done);
            scope.spawn(move || {
                let (mut rng, session, _done) = start_writer(db, done, seed, thread);
                let balance_of = |key: i64| match table.get(&session, &[key_of(0, key)]) {
                    Ok(Some(row)) => Ok(row_of(&row).1),
                    Ok(None) => panic!("account {key} is missing for its own locker"),
                    Err(error) => Err(error),
                };
                for _ in 0..TRANSACTIONS {
                    let mut attempts = 0;
                    loop {
                        attempts += 1;
                        assert!(attempts < 1000, "a transfer never got through");
                        session.begin().unwrap();
                        let mut keys: Vec<i64> = (0..ACCOUNTS).collect();
                        let count = rng.random_range(2..=3);
                        for index in 0..count {
                            let other = rng.random_range(index..keys.len());
                            keys.swap(index, other);
                        }
                        keys.truncate(count);
                        let amount = rng.random_range(1..10);
                        let attempt = || -> Result<(), EngineError> {
                            for (position, &key) in keys.iter().enumerate() {
                                if rng_bool(thread, position) {
                                    // A row read, not locked: a READ COMMITTED reader inside
                                    // the transaction.
                                    let _ =
                                        table.get(&session, &[key_of(0, (key + 1) % ACCOUNTS)])?;
                                }
                                assert!(table.update(&session, &[key_of(0, key)], &[])?);
                                if short_timeouts && rng_bool(thread + attempts, position) {
                                    // Hold the row longer than others wait for it.
                                    std::thread::sleep(Duration::from_millis(3));
                                }
                                let balance = balance_of(key)?;
                                let delta = if position == 0 {
                                    -amount * (count as i64 - 1)
                                } else {
                                    amount
                                };
                                if key % 3 == 0 {
                                    // Out and back in: readers must wait for the row, never miss it.
                                    assert!(table.delete(&session, &[key_of(0, key)])?);
                                    table.insert(&session, insert_row(key, balance + delta))?;
                                } else {
                                    assert!(table.update(
                                        &session,
                                        &[key_of(0, key)],
                                        &[(1, value_of(0, balance + delta))]
                                    )?);
                                }
                            }
                            Ok(())
                        };
                        match attempt() {
                            Ok(()) => {
                                if rng.random_bool(0.3) {
                                    session.rollback().unwrap();
                                    continue;
                                }
                                session.commit().unwrap();
                                break;
                            }
                            Err(EngineError::Deadlock { .. }) => {
                                session.rollback().unwrap();
                                std::thread::sleep(Duration::from_micros(
                                    rng.random_range(0..200 * attempts.min(10)),
                                ));
                            }
                            Err(EngineError::Lock(LockError::Timeout { .. })) if short_timeouts => {
                                session.rollback().unwrap();
                                std::thread::sleep(Duration::from_micros(
                                    rng.random_range(0..200 * attempts.min(10)),
                                ));
                            }
                            Err(error) => panic!("transfer failed: {error}"),
                        }
                    }
                }
            });
        }
        for _ in 0..2 {
            let (db, table, done) = (&db, &table, &done);
            scope.spawn(move || {
                let session = db.session();
                let timed_out = |error: &str| short_timeouts && error.contains("time out");
                while done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS {
                    match try_rows(table, &session) {
                        Ok(rows) => {
                            let keys: Vec<i64> = rows.iter().map(|row| row_of(row).0).collect();
                            assert_eq!(keys, (0..ACCOUNTS).collect::<Vec<_>>(), "a scan");
                        }
                        Err(error) => assert!(timed_out(&error), "a scan: {error}"),
                    }
                    for key in 0..ACCOUNTS {
                        match table.get(&session, &[key_of(0, key)]) {
                            Ok(row) => assert!(row.is_some(), "account {key} missing"),
                            Err(error) => assert!(timed_out(&error.to_string()), "{error}"),
                        }
                    }
                }
            });
        }
    });
    let rows: Vec<(i64, i64)> = try_rows(&table, &setup)
        .unwrap()
        .iter()
        .map(|row| row_of(row))
        .collect();
    assert_eq!(rows.len(), ACCOUNTS as usize, "{rows:?}");
    assert_eq!(
        rows.iter().map(|&(_, balance)| balance).sum::<i64>(),
        100 * ACCOUNTS,
        "{rows:?}"
    );
    let stats = db.lock_stats();
    println!("{stats:?}");
    if !short_timeouts {
        assert_eq!(stats.timeouts, 0, "a deadlock went undetected: {stats:?}");
    }
    db.check_integrity().unwrap();
    assert_escalated(&db, escalate);
    // A third of the transactions roll back, and with one entry kept, every one of them that
    // got past its first statement undoes changes from the log.
    if escalate && durable {
        let undo = db.undo_stats();
        assert!(undo.undone_from_log > 0, "{undo:?}");
    }
    // Nothing is left locked: every row can be locked (within the timeout) by a newcomer.
    for key in 0..ACCOUNTS {
        let fresh = db.session();
        fresh.begin().unwrap();
        assert!(table.update(&fresh, &[key_of(0, key)], &[]).unwrap());
        fresh.commit().unwrap();
    }
}

/// Counts a writer thread done when it ends, panicking or not.
struct Done<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What writer `thread` of a run with `seed` starts with: a generator of its own, a session,
/// and the guard that counts it in `done` however it ends, so that the readers stop even when
/// it panics (keep the guard bound until the writer's end).
fn start_writer<'a>(
    db: &Database,
    done: &'a std::sync::atomic::AtomicU64,
    seed: u64,
    thread: u64,
) -> (StdRng, Session, Done<'a>) {
    let rng = StdRng::seed_from_u64(seed ^ thread.wrapping_mul(0x9e37_79b9));
    (rng, db.session(), Done(done))
}

/// An `Accounts` table (with its index on Balance) holding the keys `0..keys`, each with the
/// balance `balance(key)`, and the session that filled it.
fn accounts_filled(
    db: &Database,
    keys: i64,
    balance: impl Fn(i64) -> i64,
) -> (Arc<Table>, Session) {
    let table = db.create_table(accounts_by_balance()).unwrap();
    let setup = db.session();
    for key in 0..keys {
        table.insert(&setup, insert_row(key, balance(key))).unwrap();
    }
    (table, setup)
}

/// Whether the writer `thread` reads a neighbour before locking its `position`th row.
fn rng_bool(thread: u64, position: usize) -> bool {
    (thread + position as u64).is_multiple_of(2)
}

#[test]
fn concurrent_transfers_keep_the_total_and_every_deadlock_is_detected() {
    let seed = seed();
    transfers(seed, false, false, false);
    transfers(seed.wrapping_add(1), true, false, false);
}

/// The transfers, with transactions that escalate to a lock on the table among the others:
/// the total is kept, and every deadlock through a table's lock is found too.
#[test]
fn concurrent_transfers_with_lock_escalation_keep_the_total() {
    let seed = seed();
    transfers(seed, false, false, true);
    transfers(seed.wrapping_add(1), true, false, true);
}

#[test]
fn transfers_with_lock_timeouts_leave_nothing_behind() {
    let seed = seed();
    transfers(seed, false, true, false);
    transfers(seed.wrapping_add(1), true, true, false);
}

/// Writers put a mark (-1) on rows in explicit transactions (an update, or a delete and an
/// insert of the row again, or a move to another key and back), then either roll back or
/// replace the mark with a new committed value and commit. No committed row ever holds the
/// mark and the keys never change once committed, so READ COMMITTED readers (lookups, scans
/// both ways, index lookups, inside transactions of their own or not) must never see it, and
/// must always find every row.
fn marks(seed: u64, durable: bool, escalate: bool) {
    const ROWS: i64 = 12;
    const WRITERS: u64 = 3;
    const ROUNDS: usize = 150;
    const MARK: i64 = -1;
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = database_escalating(
        durable.then_some(&fs),
        Some(Duration::from_secs(30)),
        escalate,
    );
    let (table, setup) = accounts_filled(&db, ROWS, |key| key);
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..WRITERS {
            let (db, table, done) = (&db, &table, &done);
            scope.spawn(move || {
                let (mut rng, session, _done) = start_writer(db, done, seed, thread);
                for _ in 0..ROUNDS {
                    // Each writer owns the rows whose key is its number modulo WRITERS, so
                    // writers never wait for each other; readers wait for them.
                    let key = (rng.random_range(0..ROWS / WRITERS as i64) * WRITERS as i64)
                        + thread as i64;
                    session.begin().unwrap();
                    match rng.random_range(0..3) {
                        0 => assert!(
                            table
                                .update(&session, &[key_of(0, key)], &[(1, value_of(0, MARK))])
                                .unwrap()
                        ),
                        1 => {
                            assert!(table.delete(&session, &[key_of(0, key)]).unwrap());
                            table.insert(&session, insert_row(key, MARK)).unwrap();
                        }
                        _ => {
                            // Out to a key no committed row has, and back.
                            let away = 1000 + key;
                            assert!(
                                table
                                    .update(&session, &[key_of(0, key)], &[(0, key_of(0, away))])
                                    .unwrap()
                            );
                            assert!(
                                table
                                    .update(&session, &[key_of(0, away)], &[(1, value_of(0, MARK))])
                                    .unwrap()
                            );
                            if rng.random_bool(0.5) {
                                assert!(
                                    table
                                        .update(
                                            &session,
                                            &[key_of(0, away)],
                                            &[(0, key_of(0, key))]
                                        )
                                        .unwrap()
                                );
                            } else {
                                assert!(table.delete(&session, &[key_of(0, away)]).unwrap());
                                table.insert(&session, insert_row(key, MARK)).unwrap();
                            }
                        }
                    }
                    if rng.random_bool(0.5) {
                        session.rollback().unwrap();
                    } else {
                        let value = rng.random_range(0..ROWS);
                        assert!(
                            table
                                .update(&session, &[key_of(0, key)], &[(1, value_of(0, value))])
                                .unwrap()
                        );
                        session.commit().unwrap();
                    }
                }
            });
        }
        for reader in 0..2u64 {
            let (db, table, done) = (&db, &table, &done);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (reader + 100));
                let session = db.session();
                let all: Vec<i64> = (0..ROWS).collect();
                while done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS {
                    let in_txn = rng.random_bool(0.3);
                    if in_txn {
                        session.begin().unwrap();
                    }
                    match rng.random_range(0..4) {
                        0 => {
                            let key = rng.random_range(0..ROWS);
                            let row = table.get(&session, &[key_of(0, key)]).unwrap();
                            let Some(row) = row else {
                                panic!("row {key} missing");
                            };
                            assert_ne!(row_of(&row).1, MARK, "an uncommitted value read");
                        }
                        1 | 2 => {
                            let direction = if rng.random_bool(0.5) {
                                Direction::Forward
                            } else {
                                Direction::Backward
                            };
                            let mut rows: Vec<(i64, i64)> = table
                                .scan(&session, &KeyRange::all(), direction)
                                .unwrap()
                                .map(|row| row_of(&row.unwrap()))
                                .collect();
                            rows.sort();
                            assert!(
                                rows.iter().all(|&(_, value)| value != MARK),
                                "an uncommitted value scanned: {rows:?}"
                            );
                            let keys: Vec<i64> = rows.iter().map(|&(key, _)| key).collect();
                            assert_eq!(keys, all, "a scan {direction:?}");
                        }
                        _ => {
                            let marked = table
                                .get_by_index(&session, "IX_Balance", &[value_of(0, MARK)])
                                .unwrap();
                            assert!(marked.is_empty(), "uncommitted rows by index: {marked:?}");
                        }
                    }
                    if in_txn {
                        session.commit().unwrap();
                    }
                }
            });
        }
    });
    let rows: Vec<(i64, i64)> = try_rows(&table, &setup)
        .unwrap()
        .iter()
        .map(|row| row_of(row))
        .collect();
    assert_eq!(rows.len(), ROWS as usize, "{rows:?}");
    assert!(rows.iter().all(|&(_, value)| value != MARK), "{rows:?}");
    db.check_integrity().unwrap();
    assert_escalated(&db, escalate);
}

#[test]
fn read_committed_readers_never_see_a_mark_that_never_commits() {
    let seed = seed();
    marks(seed, false, false);
    marks(seed.wrapping_add(1), true, false);
}

/// The marks, with writers whose transactions escalate to a lock on the table: readers still
/// never see a mark, and find every row.
#[test]
fn read_committed_readers_never_see_a_mark_with_lock_escalation() {
    let seed = seed();
    marks(seed, false, true);
    marks(seed.wrapping_add(1), true, true);
}

/// Writers move money between accounts and write each transfer into a ledger in the same
/// transaction (FULL or DELAYED), another thread takes a checkpoint now and then, and the
/// power goes while they run. What the next open finds must be atomic and durable: the
/// balances are the opening ones moved by exactly the transfers in the ledger, and every
/// transfer whose FULL commit returned is there.
fn transfers_through_a_crash(seed: u64) {
    const ACCOUNTS: i64 = 6;
    const WRITERS: u64 = 4;
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let open = |fs: &FaultyFileSystem| {
        Database::open(
            DIR,
            DatabaseOptions {
                lock_timeout: Some(Duration::from_secs(30)),
                wal: WalConfig {
                    buffer_bytes: 64 << 10,
                    segment_bytes: [4096, 256 << 10][seed as usize % 2],
                    ..WalConfig::default()
                },
                ..options(fs)
            },
        )
        .unwrap()
    };
    let db = open(&fs);
    let accounts_table = db.create_table(accounts()).unwrap();
    let ledger = db.create_table(common::notes()).unwrap();
    let setup = db.session();
    for key in 0..ACCOUNTS {
        accounts_table.insert(&setup, insert_row(key, 100)).unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Every fourth case closes the database cleanly instead of cutting the power, under the
    // writers' feet: every commit acknowledged before the close began must be kept (DELAYED
    // ones too: the close flushes), and the transactions it refuses undone.
    let closing = seed % 4 == 3;
    let closing_started = std::sync::atomic::AtomicBool::new(false);
    let mut rng = StdRng::seed_from_u64(seed);
    let crash_after = Duration::from_millis(rng.random_range(5..60));
    let mode = CRASH_MODES[rng.random_range(0..3)];
    let (after, acknowledged, refused) = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|thread| {
                let (db, accounts_table, ledger, stop) = (&db, &accounts_table, &ledger, &stop);
                let closing_started = &closing_started;
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ thread.wrapping_mul(0x9e37_79b9));
                    let session = db.session();
                    let mut acknowledged = Vec::new();
                    let mut refused = Vec::new();
                    for n in 0.. {
                        if stop.load(std::sync::atomic::Ordering::SeqCst) {
                            break;
                        }
                        let id = (thread * 100_000 + n) as i32;
                        let from = rng.random_range(0..ACCOUNTS);
                        let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
                        let amount = rng.random_range(1..10);
                        let delayed = rng.random_bool(0.3);
                        let result = (|| -> Result<(), EngineError> {
                            if delayed {
                                session.begin_with(Durability::Delayed)?;
                            } else {
                                session.begin()?;
                            }
                            for (key, delta) in [(from, -amount), (to, amount)] {
                                assert!(accounts_table.update(&session, &[key_of(0, key)], &[])?);
                                let row = accounts_table.get(&session, &[key_of(0, key)])?;
                                let balance = row_of(&row.expect("locked row")).1;
                                accounts_table.update(
                                    &session,
                                    &[key_of(0, key)],
                                    &[(1, value_of(0, balance + delta))],
                                )?;
                            }
                            ledger.insert(
                                &session,
                                InsertRow::new()
                                    .set(0, id)
                                    .set(1, format!("{from},{to},{amount}")),
                            )?;
                            session.commit().inspect_err(|error| {
                                // A commit the close refused must not commit: its caller
                                // would run it again.
                                if matches!(error, EngineError::DatabaseClosed) {
                                    refused.push(id);
                                }
                            })
                        })();
                        match result {
                            Ok(()) if !delayed => acknowledged.push(id),
                            // Returned before the close began: the close's flush covers it.
                            Ok(())
                                if closing
                                    && !closing_started
                                        .load(std::sync::atomic::Ordering::SeqCst) =>
                            {
                                acknowledged.push(id)
                            }
                            Ok(()) => {}
                            Err(EngineError::Deadlock { .. }) => {
                                let _ = session.rollback();
                            }
                            // The power went: the database refuses everything from here on.
                            Err(_) => {
                                let _ = session.rollback();
                                break;
                            }
                        }
                    }
                    (acknowledged, refused)
                })
            })
            .collect();
        let checkpointer = scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if db.checkpoint().is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        std::thread::sleep(crash_after);
        // Every fourth case closes the database cleanly instead, under the writers' feet: every
        // commit acknowledged before (DELAYED ones too: the close flushes) must be kept, and
        // the transactions it refuses undone.
        let after = if closing {
            closing_started.store(true, std::sync::atomic::Ordering::SeqCst);
            db.clone().close().unwrap();
            fs.crash_with(CrashMode::LoseUnsynced)
        } else {
            fs.crash_with(mode)
        };
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (mut acknowledged, mut refused) = (Vec::new(), Vec::new());
        for writer in writers {
            let (acked, refusals) = writer.join().unwrap();
            acknowledged.extend(acked);
            refused.extend(refusals);
        }
        checkpointer.join().unwrap();
        (after, acknowledged, refused)
    });
    drop((setup, accounts_table, ledger));
    drop(db);
    let db = open(&after);
    let session = db.session();
    let ledger: BTreeMap<i32, (i64, i64, i64)> = try_rows(&db.table("Notes").unwrap(), &session)
        .unwrap()
        .iter()
        .map(|row| match row.as_slice() {
            [Value::Int(id), Value::String(text)] => {
                let parts: Vec<i64> = text.split(',').map(|part| part.parse().unwrap()).collect();
                (*id, (parts[0], parts[1], parts[2]))
            }
            other => panic!("ledger row {other:?}"),
        })
        .collect();
    let mut expected: BTreeMap<i64, i64> = (0..ACCOUNTS).map(|key| (key, 100)).collect();
    for &(from, to, amount) in ledger.values() {
        *expected.get_mut(&from).unwrap() -= amount;
        *expected.get_mut(&to).unwrap() += amount;
    }
    let balances: BTreeMap<i64, i64> = try_rows(&db.table("Accounts").unwrap(), &session)
        .unwrap()
        .iter()
        .map(|row| row_of(row))
        .collect();
    assert_eq!(
        balances,
        expected,
        "{mode:?} after {crash_after:?}: balances do not match the {} transfers in the ledger",
        ledger.len()
    );
    println!(
        "{mode:?} (closing: {closing}) after {crash_after:?}: {} transfers recovered, {} \
         acknowledged, {} refused",
        ledger.len(),
        acknowledged.len(),
        refused.len()
    );
    for id in &acknowledged {
        assert!(
            ledger.contains_key(id),
            "{mode:?}: acknowledged transfer {id} lost ({} acknowledged, {} in the ledger)",
            acknowledged.len(),
            ledger.len()
        );
    }
    for id in &refused {
        assert!(
            !ledger.contains_key(id),
            "transfer {id} committed though its commit was refused"
        );
    }
    db.check_integrity().unwrap();
}

#[test]
fn transfers_are_atomic_and_durable_through_a_crash_in_the_middle() {
    let seed = seed();
    for case in 0..cases(8) as u64 {
        transfers_through_a_crash(seed.wrapping_add(case));
    }
}

/// Threads count in rows: each transaction locks a row (or inserts it, the first time), reads
/// it and writes it back one higher, by an update, by a delete and an insert, or by a move to
/// another key and back; then it commits (and counts the increment) or rolls back. No
/// increment may be lost or applied twice: each row ends at the number of committed
/// increments of it, in memory and after a reopen.
fn counters(seed: u64, durable: bool, escalate: bool) {
    const ROWS: i64 = 6;
    const WRITERS: u64 = 4;
    const ROUNDS: usize = 120;
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let lock_timeout = Some(Duration::from_secs(30));
    let db = database_escalating(durable.then_some(&fs), lock_timeout, escalate);
    let table = db.create_table(accounts_by_balance()).unwrap();
    let counts: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|thread| {
                let (db, table) = (&db, &table);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ thread.wrapping_mul(0x9e37_79b9));
                    let session = db.session();
                    let mut counts = vec![0i64; ROWS as usize];
                    for _ in 0..ROUNDS {
                        let key = rng.random_range(0..ROWS);
                        let how = rng.random_range(0..3);
                        let commit = rng.random_bool(0.75);
                        let result = (|| -> Result<(), EngineError> {
                            session.begin()?;
                            loop {
                                if table.update(&session, &[key_of(0, key)], &[])? {
                                    break;
                                }
                                match table.insert(&session, insert_row(key, 1)) {
                                    Ok(_) => return Ok(()),
                                    // Inserted and committed by another since: count on it.
                                    Err(EngineError::DuplicateKey { .. }) => continue,
                                    Err(error) => return Err(error),
                                }
                            }
                            let row = table.get(&session, &[key_of(0, key)])?.expect("locked");
                            let next = row_of(&row).1 + 1;
                            match how {
                                0 => {
                                    table.update(
                                        &session,
                                        &[key_of(0, key)],
                                        &[(1, value_of(0, next))],
                                    )?;
                                }
                                1 => {
                                    assert!(table.delete(&session, &[key_of(0, key)])?);
                                    table.insert(&session, insert_row(key, next))?;
                                }
                                _ => {
                                    let away = 1000 + key;
                                    assert!(table.update(
                                        &session,
                                        &[key_of(0, key)],
                                        &[(0, key_of(0, away)), (1, value_of(0, next))],
                                    )?);
                                    assert!(table.update(
                                        &session,
                                        &[key_of(0, away)],
                                        &[(0, key_of(0, key))],
                                    )?);
                                }
                            }
                            Ok(())
                        })();
                        match result {
                            Ok(()) if commit => {
                                session.commit().unwrap();
                                counts[key as usize] += 1;
                            }
                            Ok(()) => session.rollback().unwrap(),
                            Err(EngineError::Deadlock { .. }) => {
                                session.rollback().unwrap();
                            }
                            Err(error) => panic!("an increment failed: {error}"),
                        }
                    }
                    counts
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|writer| writer.join().unwrap())
            .collect()
    });
    let expected: BTreeMap<i64, i64> = (0..ROWS)
        .map(|key| (key, counts.iter().map(|counts| counts[key as usize]).sum()))
        .filter(|&(_, count)| count > 0)
        .collect();
    let read = |db: &Database| -> BTreeMap<i64, i64> {
        try_rows(&db.table("Accounts").unwrap(), &db.session())
            .unwrap()
            .iter()
            .map(|row| row_of(row))
            .collect()
    };
    assert_eq!(read(&db), expected, "increments lost or doubled");
    db.check_integrity().unwrap();
    assert_escalated(&db, escalate);
    if durable {
        drop(table);
        let after = fs.crash_with(CrashMode::LoseUnsynced);
        drop(db);
        let db = database(Some(&after), lock_timeout);
        assert_eq!(read(&db), expected, "after a crash");
    }
}

#[test]
fn concurrent_increments_are_neither_lost_nor_doubled() {
    let seed = seed();
    counters(seed, false, false);
    counters(seed.wrapping_add(1), true, false);
}

/// The increments, with writers whose transactions escalate to a lock on the table: none is
/// lost or doubled.
#[test]
fn concurrent_increments_with_lock_escalation_are_neither_lost_nor_doubled() {
    let seed = seed();
    counters(seed, false, true);
    counters(seed.wrapping_add(1), true, true);
}
