//! A randomized, model-based hunt over `Table::update`: updates that move a row (a new
//! clustered key, across partitions too), that change a unique or a non-unique nonclustered
//! key (to the same value, to a value another row holds, swapping two rows' values inside one
//! transaction), that change a column a persisted computed column and its unique index depend
//! on, in tables with an IDENTITY column, and updates that must fail and leave nothing behind
//! (a duplicate key, a value too long, a NULL in a NOT NULL column, a read-only column).
//!
//! Three tables of the same columns live in one database:
//! `Id BIGINT IDENTITY, K INT, H AS ABS(K % 3) PERSISTED, U INT NOT NULL, V INT NULL, X INT NOT
//! NULL, W AS ABS(X % 50) PERSISTED, P VARCHAR(12) NOT NULL`. `Flat` is clustered on K with a
//! unique index on U, a non-unique one on V and a unique one on the computed W; `Split` is
//! clustered on (H, K), hash-partitioned on H, with the unique indexes on (H, U) and (H, W), so
//! that a key change that moves a row to another partition moves its entries there too; `Dup`
//! is `Flat` with a non-unique clustered index on K (hidden uniquifiers: an update finds a key's
//! first row, and a moved row takes a new uniquifier).
//!
//! The single-threaded model runs transactions (autocommit statements, or explicit ones that
//! commit or roll back) of random updates, inserts and deletes against an oracle (the rows by
//! K, and from them every unique key), predicts each statement's outcome (a row found or not,
//! success or failure), and compares every row of the table (scanned both ways), lookups through
//! every nonclustered index, and the integrity check with it. Its durable variant checkpoints,
//! closes cleanly and crashes (`common::crash`) with a transaction open, and expects exactly the
//! committed rows back.
//!
//! The concurrent part runs threads that each lock rows by updating them, then increment a
//! counter (read under the lock: no update may be lost), swap two rows' unique values, move rows
//! between two keys, and try to take a unique value another row holds (which must fail, after
//! waiting for its holder if it has to); at the end every row is where one of its keys says, the
//! counters add up to the committed increments, the unique values are the ones the table began
//! with, and the integrity check passes. Durable, it checkpoints meanwhile and crashes with a
//! transaction of every writer open. A READ COMMITTED reader runs beside the writers (see
//! `read_committed`). Smaller tests: waits for a unique value another transaction holds, text
//! keys changed only in trailing spaces, page-sized updates, and growing updates beside
//! sequence-lane appends.
//!
//! Each test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`, and scale the number of
//! cases with `LASTPAGE_TEST_CASES`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, EngineError, Expr, IndexDef, InsertRow,
    Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ID: usize = 0;
const K: usize = 1;
const H: usize = 2;
const U: usize = 3;
const V: usize = 4;
const X: usize = 5;
const W: usize = 6;
const P: usize = 7;

/// The longest payload the column holds; the model writes up to two more characters, which
/// must fail the statement.
const MAX_P: usize = 12;
/// Keys are drawn from `0..KEY_SPACE`, and `U` from `0..U_SPACE`: with about 30 rows per
/// table, a random new key or `U` often belongs to another row.
const KEY_SPACE: i32 = 60;
const U_SPACE: i32 = 45;
/// `X` is drawn from `0..X_SPACE`; its computed `W` (`X % 50`) collides far more often.
const X_SPACE: i32 = 200;

fn h_of(k: i32) -> i32 {
    (k % 3).abs()
}

fn w_of(x: i32) -> i32 {
    (x % 50).abs()
}

/// The shapes of the tables: clustered on K, on (H, K) and partitioned, or on K not unique.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Flat,
    Split,
    Dup,
}

/// The columns every table shares, and its indexes: on `Split`, H leads the clustered key and
/// each unique index, as its partitioning requires; `Dup`'s clustered index is not unique (its
/// keys end in hidden uniquifiers, and a key change takes a new one).
fn table_def(name: &str, shape: Shape) -> TableDef {
    let mut def = TableDef::new(name)
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("K", DataType::Int).not_null())
        .column(
            ColumnDef::new("H", DataType::Int)
                .not_null()
                .computed_expression(Expr::column("K").modulo(3).abs()),
        )
        .column(ColumnDef::new("U", DataType::Int).not_null())
        .column(ColumnDef::new("V", DataType::Int))
        .column(ColumnDef::new("X", DataType::Int).not_null())
        .column(
            ColumnDef::new("W", DataType::Int)
                .not_null()
                .computed_expression(Expr::column("X").modulo(50).abs()),
        )
        .column(ColumnDef::new("P", DataType::VarChar(MAX_P as u16)).not_null());
    if shape == Shape::Split {
        def = def
            .clustered(IndexDef::new("PK", &["H", "K"], Uniqueness::PrimaryKey))
            .partitioned("H", 3)
            .nonclustered(IndexDef::new("UX_U", &["H", "U"], Uniqueness::UniqueIndex))
            .nonclustered(IndexDef::new(
                "UQ_W",
                &["H", "W"],
                Uniqueness::UniqueConstraint,
            ));
    } else {
        def = def
            .clustered(if shape == Shape::Dup {
                IndexDef::new("CX", &["K"], Uniqueness::NonUnique)
            } else {
                IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey)
            })
            .nonclustered(IndexDef::new("UX_U", &["U"], Uniqueness::UniqueIndex))
            .nonclustered(IndexDef::new("UQ_W", &["W"], Uniqueness::UniqueConstraint));
    }
    def.nonclustered(IndexDef::new("IX_V", &["V"], Uniqueness::NonUnique))
}

/// A row as the model keeps it (H and W follow from K and X).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    id: i64,
    k: i32,
    u: i32,
    v: Option<i32>,
    x: i32,
    p: String,
}

impl Row {
    fn values(&self) -> Vec<Value> {
        vec![
            Value::BigInt(self.id),
            Value::Int(self.k),
            Value::Int(h_of(self.k)),
            Value::Int(self.u),
            self.v.map_or(Value::Null, Value::Int),
            Value::Int(self.x),
            Value::Int(w_of(self.x)),
            Value::String(self.p.clone()),
        ]
    }
}

/// One table's model: its rows by K and, for `Dup`, the order of their uniquifiers (0 in the
/// other tables). A row takes the next number when it gets its key (inserted, or moved): one
/// thread's uniquifiers ascend, so `Dup`'s rows of one K are in the order they got it.
#[derive(Clone, Debug)]
struct Model {
    name: &'static str,
    split: bool,
    dup: bool,
    rows: BTreeMap<(i32, u64), Row>,
    next_uniquifier: u64,
}

impl Model {
    /// The unique keys a row has, one per unique nonclustered index (`Split`'s lead with H).
    fn unique_keys(&self, row: &Row) -> [(i32, i32); 2] {
        let h = if self.split { h_of(row.k) } else { 0 };
        [(h, row.u), (h, w_of(row.x))]
    }

    /// Whether `row` (replacing the row keyed `old`, if any) would break a unique key.
    fn conflicts(&self, old: Option<(i32, u64)>, row: &Row) -> bool {
        let mine = self.unique_keys(row);
        self.rows.iter().any(|(key, other)| {
            Some(*key) != old
                && ((!self.dup && other.k == row.k)
                    || self
                        .unique_keys(other)
                        .iter()
                        .zip(&mine)
                        .any(|(a, b)| a == b))
        })
    }

    /// The row an update or a delete of `k` finds: a `Dup` key's first.
    fn first(&self, k: i32) -> Option<((i32, u64), Row)> {
        self.rows
            .range((k, 0)..=(k, u64::MAX))
            .next()
            .map(|(key, row)| (*key, row.clone()))
    }

    /// Puts a row in under a new key: a `Dup` row takes the next uniquifier.
    fn put(&mut self, row: Row) {
        let uniquifier = if self.dup {
            self.next_uniquifier += 1;
            self.next_uniquifier
        } else {
            0
        };
        self.rows.insert((row.k, uniquifier), row);
    }

    fn search_key(&self, k: i32) -> Vec<Value> {
        if self.split {
            vec![Value::Int(h_of(k)), Value::Int(k)]
        } else {
            vec![Value::Int(k)]
        }
    }
}

/// One change an update statement makes.
#[derive(Clone, Debug)]
enum Change {
    K(i32),
    U(Option<i32>),
    V(Option<i32>),
    X(i32),
    P(String),
    /// A column that cannot be set (identity or computed): the statement fails.
    ReadOnly(usize),
}

impl Change {
    fn column(&self) -> usize {
        match self {
            Change::K(_) => K,
            Change::U(_) => U,
            Change::V(_) => V,
            Change::X(_) => X,
            Change::P(_) => P,
            Change::ReadOnly(column) => *column,
        }
    }

    fn value(&self) -> Value {
        match self {
            Change::K(k) => Value::Int(*k),
            Change::U(u) | Change::V(u) => u.map_or(Value::Null, Value::Int),
            Change::X(x) => Value::Int(*x),
            Change::P(p) => Value::String(p.clone()),
            Change::ReadOnly(_) => Value::Int(1),
        }
    }
}

/// What the model expects of a statement.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Found,
    Missing,
    Fails,
}

fn payload(rng: &mut StdRng, max: usize) -> String {
    let len = rng.random_range(0..=max);
    (0..len)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// Whether an error is one a statement of this model may fail with: a broken constraint, a
/// value that does not fit, or a column that cannot be set. Anything else (a storage error, a
/// failed database) fails the test.
fn expected_failure(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::DuplicateKey { .. }
            | EngineError::DuplicateIndexKey { .. }
            | EngineError::Value(_)
            | EngineError::NullNotAllowed { .. }
            | EngineError::ReadOnlyColumn { .. }
            | EngineError::DuplicateUpdateColumn { .. }
    )
}

/// The single-threaded run: the database, its two tables and their models (`committed` as of
/// the last commit, `current` as the open transaction sees it).
struct Run {
    rng: StdRng,
    db: Database,
    session: Session,
    tables: Vec<Arc<Table>>,
    committed: Vec<Model>,
    current: Vec<Model>,
    in_txn: bool,
    /// Every identity value handed out, to check that none is handed out twice (across
    /// crashes too: both tables are logged).
    ids: Vec<BTreeSet<i64>>,
    /// What happened, for the failure message.
    log: Vec<String>,
    /// How many updates were expected to find their row, miss it, or fail: printed, so that a
    /// change of the mix that stops exercising one of them shows.
    outcomes: BTreeMap<String, usize>,
}

impl Run {
    fn note(&mut self, what: String) {
        self.log.push(what);
        if self.log.len() > 40 {
            self.log.remove(0);
        }
    }

    fn context(&self) -> String {
        self.log.join("\n  ")
    }

    /// An update of the row keyed `k` in table `t`, predicted and checked.
    fn update(&mut self, t: usize, k: i32, changes: &[Change]) {
        let model = &self.current[t];
        let expected = if changes.iter().any(|c| matches!(c, Change::ReadOnly(_)))
            || changes
                .iter()
                .enumerate()
                .any(|(i, c)| changes[..i].iter().any(|e| e.column() == c.column()))
        {
            Expected::Fails
        } else if let Some((old_key, old)) = model.first(k) {
            let mut new = old.clone();
            let mut fits = true;
            for change in changes {
                match change {
                    Change::K(k) => new.k = *k,
                    Change::U(Some(u)) => new.u = *u,
                    Change::U(None) => fits = false,
                    Change::V(v) => new.v = *v,
                    Change::X(x) => new.x = *x,
                    Change::P(p) => {
                        fits &= p.len() <= MAX_P;
                        new.p = p.clone();
                    }
                    Change::ReadOnly(_) => unreachable!(),
                }
            }
            if !fits || model.conflicts(Some(old_key), &new) {
                Expected::Fails
            } else {
                let model = &mut self.current[t];
                model.rows.remove(&old_key);
                if new.k == old.k {
                    // In place: the key, and a `Dup` row's uniquifier, stay.
                    model.rows.insert(old_key, new);
                } else {
                    model.put(new);
                }
                Expected::Found
            }
        } else {
            Expected::Missing
        };
        let search = self.current[t].search_key(k);
        let values: Vec<(usize, Value)> = changes.iter().map(|c| (c.column(), c.value())).collect();
        self.note(format!(
            "{}: update K={k} {changes:?} (expect {expected:?})",
            self.current[t].name
        ));
        *self.outcomes.entry(format!("{expected:?}")).or_default() += 1;
        let result = self.tables[t].update(&self.session, &search, &values);
        let outcome = match &result {
            Ok(true) => Expected::Found,
            Ok(false) => Expected::Missing,
            Err(error) if expected_failure(error) => Expected::Fails,
            Err(error) => panic!("unexpected error {error}\n  {}", self.context()),
        };
        assert_eq!(outcome, expected, "{result:?}\n  {}", self.context());
    }

    fn insert(&mut self, t: usize) {
        let row = Row {
            id: 0,
            k: self.rng.random_range(0..KEY_SPACE),
            u: self.rng.random_range(0..U_SPACE),
            v: self
                .rng
                .random_bool(0.8)
                .then(|| self.rng.random_range(0..10)),
            x: self.rng.random_range(0..X_SPACE),
            p: payload(&mut self.rng, MAX_P),
        };
        let expected = !self.current[t].conflicts(None, &row);
        self.note(format!(
            "{}: insert {row:?} (expect ok: {expected})",
            self.current[t].name
        ));
        let mut insert = InsertRow::new();
        for column in [K, U, V, X, P] {
            insert = insert.set(column, row.values()[column].clone());
        }
        match self.tables[t].insert(&self.session, insert) {
            Ok(id) => {
                assert!(expected, "insert succeeded\n  {}", self.context());
                let id = id.expect("an identity table returns the value");
                assert!(
                    self.ids[t].insert(id),
                    "identity {id} handed out twice\n  {}",
                    self.context()
                );
                self.current[t].put(Row { id, ..row });
            }
            Err(error) if expected_failure(&error) => {
                assert!(!expected, "insert failed: {error}\n  {}", self.context());
            }
            Err(error) => panic!("unexpected error {error}\n  {}", self.context()),
        }
    }

    fn delete(&mut self, t: usize, k: i32) {
        let expected = match self.current[t].first(k) {
            Some((key, _)) => self.current[t].rows.remove(&key).is_some(),
            None => false,
        };
        self.note(format!("{}: delete K={k}", self.current[t].name));
        let search = self.current[t].search_key(k);
        let deleted = self.tables[t].delete(&self.session, &search).unwrap();
        assert_eq!(deleted, expected, "delete\n  {}", self.context());
    }

    /// A key: usually one a row has.
    fn some_key(&mut self, t: usize) -> i32 {
        let keys: Vec<i32> = self.current[t].rows.keys().map(|(k, _)| *k).collect();
        if keys.is_empty() || self.rng.random_bool(0.1) {
            self.rng.random_range(0..KEY_SPACE)
        } else {
            keys[self.rng.random_range(0..keys.len())]
        }
    }

    /// A `U` another row has (or this row's own, or a fresh one).
    fn some_u(&mut self, t: usize) -> i32 {
        let k = self.some_key(t);
        match self.current[t].first(k) {
            Some((_, row)) if self.rng.random_bool(0.5) => row.u,
            _ => self.rng.random_range(0..U_SPACE),
        }
    }

    fn random_change(&mut self, t: usize) -> Change {
        match self.rng.random_range(0..12) {
            0..=2 => Change::U(Some(self.some_u(t))),
            3 => Change::U(None),
            4..=5 => Change::K(if self.rng.random_bool(0.5) {
                self.some_key(t)
            } else {
                self.rng.random_range(0..KEY_SPACE)
            }),
            6 => Change::V(
                self.rng
                    .random_bool(0.8)
                    .then(|| self.rng.random_range(0..10)),
            ),
            7..=8 => Change::X(self.rng.random_range(0..X_SPACE)),
            9..=10 => Change::P(payload(&mut self.rng, MAX_P + 2)),
            _ => Change::ReadOnly([ID, H, W][self.rng.random_range(0..3)]),
        }
    }

    /// One statement of a transaction.
    fn statement(&mut self) {
        let t = self.rng.random_range(0..self.tables.len());
        match self.rng.random_range(0..20) {
            0..=1 => self.insert(t),
            2 => {
                let k = self.some_key(t);
                self.delete(t, k);
            }
            3..=4 => self.swap_unique(t),
            5 => self.swap_keys(t),
            6 => {
                // The same value again: changes nothing, and must not trip over its own keys.
                let k = self.some_key(t);
                if let Some((_, row)) = self.current[t].first(k) {
                    self.update(
                        t,
                        k,
                        &[Change::U(Some(row.u)), Change::K(row.k), Change::X(row.x)],
                    );
                }
            }
            _ => {
                let k = self.some_key(t);
                let count = self.rng.random_range(1..=3);
                let changes: Vec<Change> = (0..count).map(|_| self.random_change(t)).collect();
                self.update(t, k, &changes);
            }
        }
    }

    /// Swaps two rows' `U` through a value outside the others' range, as T-SQL would in three
    /// statements (a unique index is checked per statement). A step fails (and leaves the
    /// transaction as it was) when its value is taken.
    fn swap_unique(&mut self, t: usize) {
        let (a, b) = (self.some_key(t), self.some_key(t));
        let (Some((_, ra)), Some((_, rb))) = (self.current[t].first(a), self.current[t].first(b))
        else {
            return;
        };
        self.update(t, a, &[Change::U(Some(U_SPACE + 7))]);
        self.update(t, b, &[Change::U(Some(ra.u))]);
        self.update(t, a, &[Change::U(Some(rb.u))]);
    }

    /// Swaps two rows' clustered keys (moving both, across partitions in `Split`).
    fn swap_keys(&mut self, t: usize) {
        let (a, b) = (self.some_key(t), self.some_key(t));
        let spare = KEY_SPACE + 1;
        self.update(t, a, &[Change::K(spare)]);
        self.update(t, b, &[Change::K(a)]);
        self.update(t, spare, &[Change::K(b)]);
    }

    fn begin(&mut self) {
        self.note("begin".into());
        self.session.begin().unwrap();
        self.in_txn = true;
    }

    fn commit(&mut self) {
        self.note("commit".into());
        self.session.commit().unwrap();
        self.in_txn = false;
        self.committed = self.current.clone();
    }

    fn rollback(&mut self) {
        self.note("rollback".into());
        self.session.rollback().unwrap();
        self.in_txn = false;
        self.current = self.committed.clone();
    }

    /// Every row of every table, index lookups and the integrity check against the model.
    fn check(&mut self, what: &str) {
        for (t, table) in self.tables.iter().enumerate() {
            let model = &self.current[t];
            // The model's rows in the table's order: `Split`'s by (H, K) (partition by
            // partition, also through an index), `Dup`'s by K and then uniquifier.
            let mut ordered: Vec<(&(i32, u64), &Row)> = model.rows.iter().collect();
            ordered.sort_by_key(|((k, uniquifier), _)| {
                (if model.split { h_of(*k) } else { 0 }, *k, *uniquifier)
            });
            let expected: Vec<Vec<Value>> = ordered.iter().map(|(_, row)| row.values()).collect();
            let rows = common::rows(table, &self.session);
            assert_eq!(
                rows,
                expected,
                "{what}: {} differs from the model\n  {}",
                model.name,
                self.context()
            );
            let mut backward = common::scan(
                table,
                &self.session,
                &lastpage_engine::KeyRange::all(),
                lastpage_engine::Direction::Backward,
            );
            backward.reverse();
            assert_eq!(backward, expected, "{what}: {} backward", model.name);
            // Through the non-unique index on V.
            let v = self.rng.random_range(0..10);
            let found = table
                .get_by_index(&self.session, "IX_V", &[Value::Int(v)])
                .unwrap();
            let with_v: Vec<Vec<Value>> = expected
                .iter()
                .filter(|row| row[V] == Value::Int(v))
                .cloned()
                .collect();
            assert_eq!(found, with_v, "{what}: {} lookup IX_V = {v}", model.name);
            // A lookup through each unique index of a few values, held or not.
            for _ in 0..3 {
                let u = self.rng.random_range(0..U_SPACE);
                let x = self.rng.random_range(0..X_SPACE);
                for (index, column, value) in [("UX_U", U, u), ("UQ_W", W, w_of(x))] {
                    for h in 0..if model.split { 3 } else { 1 } {
                        let key = if model.split {
                            vec![Value::Int(h), Value::Int(value)]
                        } else {
                            vec![Value::Int(value)]
                        };
                        let found = table.get_by_index(&self.session, index, &key).unwrap();
                        let expected: Vec<Vec<Value>> = model
                            .rows
                            .values()
                            .filter(|r| {
                                (!model.split || h_of(r.k) == h)
                                    && r.values()[column] == Value::Int(value)
                            })
                            .map(Row::values)
                            .collect();
                        assert_eq!(
                            found,
                            expected,
                            "{what}: {} lookup {index} = {key:?}\n  {}",
                            model.name,
                            self.context()
                        );
                    }
                }
            }
            if let Err(error) = table.check_integrity() {
                panic!("{what}: integrity: {error}\n  {}", self.context());
            }
        }
    }

    /// One transaction: autocommit statements, or an explicit transaction that commits or rolls
    /// back.
    fn transaction(&mut self) {
        if self.rng.random_bool(0.3) {
            for _ in 0..self.rng.random_range(1..=4) {
                self.statement();
                self.committed = self.current.clone();
            }
            self.check("after autocommit statements");
            return;
        }
        self.begin();
        for _ in 0..self.rng.random_range(1..=8) {
            self.statement();
        }
        self.check("inside a transaction");
        if self.rng.random_bool(0.6) {
            self.commit();
        } else {
            self.rollback();
        }
        self.check("after the transaction");
    }
}

const SHAPES: [(&str, Shape); 3] = [
    ("Flat", Shape::Flat),
    ("Split", Shape::Split),
    ("Dup", Shape::Dup),
];

fn open_tables(db: &Database) -> Vec<Arc<Table>> {
    SHAPES
        .iter()
        .map(|(name, _)| db.table(name).unwrap())
        .collect()
}

fn create_tables(db: &Database) -> Vec<Model> {
    SHAPES
        .iter()
        .map(|&(name, shape)| {
            db.create_table(table_def(name, shape)).unwrap();
            Model {
                name,
                split: shape == Shape::Split,
                dup: shape == Shape::Dup,
                rows: BTreeMap::new(),
                next_uniquifier: 0,
            }
        })
        .collect()
}

fn new_run(seed: u64, db: Database) -> Run {
    let models = create_tables(&db);
    Run {
        rng: StdRng::seed_from_u64(seed),
        session: db.session(),
        tables: open_tables(&db),
        committed: models.clone(),
        current: models,
        in_txn: false,
        ids: vec![BTreeSet::new(); SHAPES.len()],
        log: Vec::new(),
        outcomes: BTreeMap::new(),
        db,
    }
}

/// Fills every table with about 30 rows, committed.
fn fill(run: &mut Run) {
    for _ in 0..45 {
        for t in 0..SHAPES.len() {
            run.insert(t);
        }
    }
    run.committed = run.current.clone();
    run.check("after the fill");
}

#[test]
fn updates_in_memory_match_the_model() {
    let (seed, _) = common::seeded_rng();
    for case in 0..common::cases(8) {
        let seed = seed.wrapping_add(case as u64);
        println!("case seed {seed}");
        let mut run = new_run(seed, Database::create(DatabaseOptions::default()).unwrap());
        fill(&mut run);
        for _ in 0..60 {
            run.transaction();
        }
        println!("updates: {:?}", run.outcomes);
    }
}

#[test]
fn updates_survive_checkpoints_closes_and_crashes() {
    let (seed, _) = common::seeded_rng();
    for case in 0..common::cases(4) {
        let seed = seed.wrapping_add(case as u64);
        println!("case seed {seed}");
        let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
        let mut run = new_run(seed, common::open(&fs));
        fill(&mut run);
        for round in 0..6 {
            for _ in 0..8 {
                run.transaction();
            }
            if run.rng.random_bool(0.5) {
                run.db.checkpoint().unwrap();
            }
            // Leave a transaction open with updates of its own, and stop the database: cleanly
            // (the open transaction is rolled back by the next open) or by a crash.
            run.begin();
            for _ in 0..run.rng.random_range(1..=6) {
                run.statement();
            }
            let crash = run.rng.random_bool(0.7);
            run.note(format!("round {round}: stop (crash: {crash})"));
            let placeholder = Database::create(DatabaseOptions::default()).unwrap();
            let db = std::mem::replace(&mut run.db, placeholder);
            let session = std::mem::replace(&mut run.session, run.db.session());
            let tables = std::mem::take(&mut run.tables);
            if crash {
                let mode = [
                    CrashMode::Random,
                    CrashMode::LoseUnsynced,
                    CrashMode::KeepUnsynced,
                ][run.rng.random_range(0..3)];
                fs = common::crash(&fs, mode, db, tables, session);
            } else {
                // The session's drop rolls its transaction back; the close checkpoints.
                drop(session);
                drop(tables);
                db.close().unwrap();
            }
            run.in_txn = false;
            run.current = run.committed.clone();
            run.db = common::open(&fs);
            run.session = run.db.session();
            run.tables = open_tables(&run.db);
            run.check(&format!("after reopen {round}"));
            common::assert_every_page_owned(&run.db, "after reopen");
        }
        println!("updates: {:?}", run.outcomes);
    }
}

/// Rows of the concurrent part: slot `s` lives at key `s` or `s + MOVED`.
const SLOTS: i32 = 12;
const MOVED: i32 = 1000;
const THREADS: usize = 3;

/// What one thread of the concurrent part saw commit.
#[derive(Default)]
struct Outcome {
    /// Committed increments per slot.
    increments: BTreeMap<i32, i64>,
    commits: usize,
    rollbacks: usize,
    /// Attempts to take a unique value another row held, all refused.
    refused_takes: usize,
    /// Transactions that ended in a deadlock or a lock timeout.
    conflicts: usize,
}

/// Whether an error is the end of a transaction a thread of the concurrent part may meet: a
/// deadlock victim. The thread rolls its transaction back. A lock timeout is not: its 20 s are
/// far longer than any transaction here holds a lock, so one would mean a cycle of waits the
/// deadlock detector missed, or a lock nobody releases.
fn lock_conflict(error: &EngineError) -> bool {
    matches!(error, EngineError::Deadlock { .. })
}

/// Locks slot `s`'s row by updating its payload, and returns the key the row has (the row
/// cannot move while the lock is held). `None` if it moved between the two lookups.
fn lock_slot(
    table: &Arc<Table>,
    session: &Session,
    s: i32,
    tag: &str,
) -> Result<Option<i32>, EngineError> {
    for k in [s, s + MOVED] {
        if table.update(
            session,
            &[Value::Int(k)],
            &[(P, Value::String(tag.to_owned()))],
        )? {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

fn get_int(table: &Table, session: &Session, k: i32, column: usize) -> i32 {
    let row = table
        .get(session, &[Value::Int(k)])
        .unwrap()
        .expect("a row this transaction has locked is there");
    match row[column] {
        Value::Int(value) => value,
        ref other => panic!("column {column}: {other:?}"),
    }
}

/// One transaction of thread `me`: returns the slots it incremented if it is to commit, or an
/// error (a lock conflict) after which it is rolled back.
fn concurrent_transaction(
    rng: &mut StdRng,
    table: &Arc<Table>,
    session: &Session,
    me: usize,
    outcome: &mut Outcome,
) -> Result<Vec<i32>, EngineError> {
    let tag = format!("t{me}");
    let mut incremented = Vec::new();
    for _ in 0..rng.random_range(1..=3) {
        let s = rng.random_range(0..SLOTS);
        let Some(k) = lock_slot(table, session, s, &tag)? else {
            continue;
        };
        match rng.random_range(0..4) {
            0 => {
                // Read under the lock, then write: no other transaction can change V meanwhile.
                let v = get_int(table, session, k, V);
                assert!(table.update(session, &[Value::Int(k)], &[(V, Value::Int(v + 1))])?);
                incremented.push(s);
            }
            1 => {
                let t = rng.random_range(0..SLOTS);
                let Some(kt) = lock_slot(table, session, t, &tag)? else {
                    continue;
                };
                if kt == k {
                    continue;
                }
                let (us, ut) = (
                    get_int(table, session, k, U),
                    get_int(table, session, kt, U),
                );
                // Each thread's spare value is its own, so that swaps side by side never need
                // the same one.
                let spare = -1 - me as i32;
                for (key, u) in [(k, spare), (kt, us), (k, ut)] {
                    assert!(table.update(session, &[Value::Int(key)], &[(U, Value::Int(u))])?);
                }
            }
            2 => {
                let to = if k < MOVED { k + MOVED } else { k - MOVED };
                assert!(table.update(session, &[Value::Int(k)], &[(K, Value::Int(to))])?);
            }
            _ => {
                // Every committed state holds every U of the initial permutation, so taking
                // another slot's U must fail, whatever its holder is doing (it may have to wait
                // for the holder's transaction first).
                let u = (s + rng.random_range(1..SLOTS)) % SLOTS * 7;
                match table.update(session, &[Value::Int(k)], &[(U, Value::Int(u))]) {
                    Err(EngineError::DuplicateIndexKey { .. }) => outcome.refused_takes += 1,
                    Err(error) if lock_conflict(&error) => return Err(error),
                    other => {
                        // The row may hold `u` itself (its own value, mid-permutation).
                        let own = get_int(table, session, k, U);
                        assert!(
                            own == u && matches!(other, Ok(true)),
                            "thread {me}: taking U={u} for slot {s} gave {other:?}"
                        );
                    }
                }
            }
        }
    }
    Ok(incremented)
}

/// The transaction writer `me` leaves open for the crash: on slots of its own (so that it
/// waits for no other writer's), it swaps two rows' U, moves one and changes the other's V.
/// Recovery must undo all of it.
fn open_transaction(table: &Arc<Table>, session: &Session, me: usize) {
    let slots = [2 * me as i32, 2 * me as i32 + 1];
    let keys: Vec<i32> = slots
        .iter()
        .map(|&s| lock_slot(table, session, s, "open").unwrap().unwrap())
        .collect();
    let us: Vec<i32> = keys
        .iter()
        .map(|&k| get_int(table, session, k, U))
        .collect();
    let changes = [
        (keys[0], U, -1 - me as i32),
        (keys[1], U, us[0]),
        (keys[0], U, us[1]),
        (keys[1], V, -1),
    ];
    for (k, column, value) in changes {
        assert!(
            table
                .update(session, &[Value::Int(k)], &[(column, Value::Int(value))])
                .unwrap()
        );
    }
    let to = if keys[0] < MOVED {
        keys[0] + MOVED
    } else {
        keys[0] - MOVED
    };
    assert!(
        table
            .update(session, &[Value::Int(keys[0])], &[(K, Value::Int(to))])
            .unwrap()
    );
}

/// The rows of the concurrent part, checked: every slot once, at one of its keys, with the
/// committed increments in V, and the unique values the table began with.
fn check_slots(table: &Table, session: &Session, expected: &BTreeMap<i32, i64>, what: &str) {
    let rows = common::rows(table, session);
    assert_eq!(rows.len(), SLOTS as usize, "{what}: {rows:?}");
    let mut us = BTreeSet::new();
    for row in &rows {
        let (Value::Int(k), Value::Int(u), Value::Int(v), Value::Int(x)) =
            (&row[K], &row[U], &row[V], &row[X])
        else {
            panic!("{what}: {row:?}")
        };
        assert!(*k == *x || *k == *x + MOVED, "{what}: slot {x} at key {k}");
        assert_eq!(
            i64::from(*v),
            expected.get(x).copied().unwrap_or(0),
            "{what}: slot {x}: an increment was lost or invented"
        );
        us.insert(*u);
    }
    assert_eq!(
        us,
        (0..SLOTS).map(|s| s * 7).collect::<BTreeSet<_>>(),
        "{what}: the unique values are not the ones the table began with"
    );
    if let Err(error) = table.check_integrity() {
        panic!("{what}: integrity: {error}");
    }
}

/// A READ COMMITTED reader beside the writers: it must never see a value only an uncommitted
/// transaction wrote (a negative U is a swap's spare value, a negative V a transaction that
/// rolls back), and a lookup of a unique value finds at most the one row that holds it.
/// Returns how many lookups of a unique value found its row, and how many found none.
///
/// Every committed state holds every value of the permutation, so a lookup should always find
/// one row; but a lookup reads the index again only a few times (`INDEX_LOOKUP_MAX_PASSES`)
/// when rows move or change under it, and then may miss one, so misses are counted (and
/// printed) rather than failed. Before `Table::committed_index_matches` read the index again
/// for every row it found but did not return (gone, or not matching, whether it waited for the
/// row's writer or not), a few lookups in every hundred runs missed their row; since, none in
/// 640 runs did.
fn read_committed(
    table: &Table,
    session: &Session,
    rng: &mut StdRng,
    done: &AtomicBool,
) -> (usize, usize) {
    let (mut found, mut missed) = (0, 0);
    while !done.load(Ordering::Acquire) {
        let rows = match rng.random_range(0..3) {
            0 => {
                let u = rng.random_range(0..SLOTS) * 7;
                let rows = table
                    .get_by_index(session, "UX_U", &[Value::Int(u)])
                    .unwrap();
                assert!(rows.len() <= 1, "two rows with U={u}: {rows:?}");
                for row in &rows {
                    assert_eq!(row[U], Value::Int(u), "{row:?}");
                }
                found += rows.len();
                missed += usize::from(rows.is_empty());
                rows
            }
            1 => {
                let k = rng.random_range(0..SLOTS) + MOVED * rng.random_range(0..2);
                table
                    .get(session, &[Value::Int(k)])
                    .unwrap()
                    .into_iter()
                    .collect()
            }
            _ => common::rows(table, session),
        };
        for row in rows {
            for column in [U, V] {
                assert!(
                    !matches!(row[column], Value::Int(value) if value < 0),
                    "a reader saw an uncommitted value: {row:?}"
                );
            }
        }
    }
    (found, missed)
}

/// The concurrent part: `THREADS` writers and a reader on `Flat` with `SLOTS` rows; durable,
/// with checkpoints side by side, and a crash at the end with a transaction of every writer
/// still open (their updates must be undone, and every commit must survive). Every other seed
/// makes the table's clustered index non-unique (`Dup`), so that a move takes a new uniquifier
/// and its lock.
fn concurrent_updates(seed: u64, durable: bool) {
    let shape = if seed.is_multiple_of(2) {
        Shape::Flat
    } else {
        Shape::Dup
    };
    println!("{shape:?}");
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = if durable {
        Database::open(
            common::DIR,
            DatabaseOptions {
                lock_timeout: Some(Duration::from_secs(20)),
                ..common::options(&fs)
            },
        )
        .unwrap()
    } else {
        common::in_memory_with_lock_timeout(Duration::from_secs(20))
    };
    let table = db.create_table(table_def("Slots", shape)).unwrap();
    let session = db.session();
    // U is a permutation of the multiples of 7 below 7 * SLOTS; X (and so W) is the slot.
    for s in 0..SLOTS {
        let row = InsertRow::new()
            .set(K, s)
            .set(U, s * 7)
            .set(V, 0)
            .set(X, s)
            .set(P, "start");
        table.insert(&session, row).unwrap();
    }
    // The writers that finished their transactions, whether the reader is to stop, and
    // whether it has.
    let finished = AtomicUsize::new(0);
    let (done, reader_stopped) = (AtomicBool::new(false), AtomicBool::new(false));
    let (outcomes, open) = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..THREADS)
            .map(|me| {
                let (db, table) = (&db, &table);
                let (finished, done, reader_stopped) = (&finished, &done, &reader_stopped);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ ((me as u64 + 1) << 32));
                    let session = db.session();
                    let mut outcome = Outcome::default();
                    for round in 0..60 {
                        if durable && me == 0 && round % 15 == 7 {
                            db.checkpoint().unwrap();
                        }
                        session.begin().unwrap();
                        let result =
                            concurrent_transaction(&mut rng, table, &session, me, &mut outcome);
                        let commits = rng.random_bool(0.8);
                        match result {
                            Ok(incremented) if commits => {
                                session.commit().unwrap();
                                outcome.commits += 1;
                                for s in incremented {
                                    *outcome.increments.entry(s).or_default() += 1;
                                }
                            }
                            Ok(incremented) => {
                                // A value no committed state holds, for the reader to never see.
                                if let Some(&s) = incremented.first() {
                                    let k = lock_slot(table, &session, s, "gone")
                                        .ok()
                                        .flatten()
                                        .expect("a slot this transaction locked stays put");
                                    assert!(
                                        table
                                            .update(
                                                &session,
                                                &[Value::Int(k)],
                                                &[(V, Value::Int(-1))]
                                            )
                                            .unwrap()
                                    );
                                }
                                session.rollback().unwrap();
                                outcome.rollbacks += 1;
                            }
                            Err(error) if lock_conflict(&error) => {
                                session.rollback().unwrap();
                                outcome.rollbacks += 1;
                                outcome.conflicts += 1;
                            }
                            Err(error) => panic!("thread {me}: {error}"),
                        }
                    }
                    // Durable: one more transaction, left open for the crash, once the reader has
                    // stopped (it would wait for the open transactions until its lock timeout).
                    if finished.fetch_add(1, Ordering::AcqRel) + 1 == THREADS {
                        done.store(true, Ordering::Release);
                    }
                    while !reader_stopped.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if durable {
                        session.begin().unwrap();
                        open_transaction(table, &session, me);
                    }
                    (outcome, session)
                })
            })
            .collect();
        let reader = {
            let (db, table, done, reader_stopped) = (&db, &table, &done, &reader_stopped);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ 0xdead);
                let found = read_committed(table, &db.session(), &mut rng, done);
                reader_stopped.store(true, Ordering::Release);
                found
            })
        };
        let (outcomes, open): (Vec<Outcome>, Vec<Session>) =
            writers.into_iter().map(|t| t.join().unwrap()).unzip();
        let (found, missed) = reader.join().unwrap();
        println!("reader: {found} lookups of a unique value found its row, {missed} none");
        (outcomes, open)
    });
    let mut expected = BTreeMap::new();
    for (me, outcome) in outcomes.iter().enumerate() {
        println!(
            "thread {me}: {} commits, {} rollbacks ({} after a lock conflict), {} refused takes",
            outcome.commits, outcome.rollbacks, outcome.conflicts, outcome.refused_takes
        );
        for (s, n) in &outcome.increments {
            *expected.entry(*s).or_insert(0i64) += n;
        }
    }
    if !durable {
        drop(open);
        check_slots(&table, &session, &expected, "at the end");
        return;
    }
    let mode = [
        CrashMode::Random,
        CrashMode::LoseUnsynced,
        CrashMode::KeepUnsynced,
    ][(seed % 3) as usize];
    let fs = common::crash(&fs, mode, db, (table, session), open);
    let db = common::open(&fs);
    let table = db.table("Slots").unwrap();
    check_slots(&table, &db.session(), &expected, "after the crash");
    common::assert_every_page_owned(&db, "after the crash");
}

#[test]
fn concurrent_updates_lose_nothing_and_keep_unique_values() {
    let (seed, _) = common::seeded_rng();
    for case in 0..common::cases(8) {
        let seed = seed.wrapping_add(case as u64);
        println!("case seed {seed}");
        concurrent_updates(seed, false);
    }
}

#[test]
fn concurrent_updates_survive_checkpoints_and_a_crash() {
    let (seed, _) = common::seeded_rng();
    for case in 0..common::cases(8) {
        let seed = seed.wrapping_add(case as u64);
        println!("case seed {seed}");
        concurrent_updates(seed, true);
    }
}

/// `Flat` in an in-memory database with rows K=1 (U=10, X=1) and K=2 (U=20, X=2), committed.
fn two_rows() -> (Database, Arc<Table>) {
    let db = common::in_memory_with_lock_timeout(Duration::from_secs(20));
    let table = db.create_table(table_def("Flat", Shape::Flat)).unwrap();
    let session = db.session();
    for (k, u) in [(1, 10), (2, 20)] {
        let row = InsertRow::new().set(K, k).set(U, u).set(X, k).set(P, "p");
        table.insert(&session, row).unwrap();
    }
    (db, table)
}

fn set_u(table: &Arc<Table>, session: &Session, k: i32, u: i32) -> Result<bool, EngineError> {
    table.update(session, &[Value::Int(k)], &[(U, Value::Int(u))])
}

fn u_values(table: &Table, session: &Session) -> Vec<(i32, i32)> {
    common::rows(table, session)
        .into_iter()
        .map(|row| match (&row[K], &row[U]) {
            (Value::Int(k), Value::Int(u)) => (*k, *u),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// A unique value another transaction gave up (by an update or a delete it has not committed)
/// is waited for: its rollback keeps the value taken (the update fails), its commit frees it
/// (the update succeeds). A value it took is waited for the other way round.
#[test]
fn a_unique_value_another_transaction_holds_is_waited_for() {
    for (gives_up_by_delete, commits) in
        [(false, false), (false, true), (true, false), (true, true)]
    {
        let (db, table) = two_rows();
        let holder = db.session();
        holder.begin().unwrap();
        if gives_up_by_delete {
            assert!(table.delete(&holder, &[Value::Int(1)]).unwrap());
        } else {
            assert!(set_u(&table, &holder, 1, 11).unwrap());
        }
        let result = common::while_blocked(
            &db,
            "the update of U to a value given up by an open transaction did not wait",
            || set_u(&table, &db.session(), 2, 10),
            || end_transaction(&holder, commits),
        );
        let context = format!("delete: {gives_up_by_delete}, commit: {commits}");
        if commits {
            assert!(result.unwrap(), "{context}");
        } else {
            assert!(
                matches!(result, Err(EngineError::DuplicateIndexKey { .. })),
                "{context}: {result:?}"
            );
        }
        let expected = match (gives_up_by_delete, commits) {
            (false, false) | (true, false) => vec![(1, 10), (2, 20)],
            (false, true) => vec![(1, 11), (2, 10)],
            (true, true) => vec![(2, 10)],
        };
        assert_eq!(u_values(&table, &db.session()), expected, "{context}");
        table.check_integrity().unwrap();
    }
    // A value an open transaction took: waited for, then refused if it committed.
    for commits in [false, true] {
        let (db, table) = two_rows();
        let holder = db.session();
        holder.begin().unwrap();
        assert!(set_u(&table, &holder, 1, 30).unwrap());
        let result = common::while_blocked(
            &db,
            "the update of U to a value an open transaction took did not wait",
            || set_u(&table, &db.session(), 2, 30),
            || end_transaction(&holder, commits),
        );
        if commits {
            assert!(
                matches!(result, Err(EngineError::DuplicateIndexKey { .. })),
                "{result:?}"
            );
            assert_eq!(u_values(&table, &db.session()), [(1, 30), (2, 20)]);
        } else {
            assert!(result.unwrap());
            assert_eq!(u_values(&table, &db.session()), [(1, 10), (2, 30)]);
        }
        table.check_integrity().unwrap();
    }
}

/// Commits `session`'s transaction if `commits`, else rolls it back.
fn end_transaction(session: &Session, commits: bool) {
    if commits {
        session.commit().unwrap();
    } else {
        session.rollback().unwrap();
    }
}

/// Updates that grow rows on the leaves sequence lanes and the tail are filling: such an
/// update is the one write that splits a leaf of an identity-keyed tree outside the append
/// path (a classic split under the lane's or the tail's feet). Inserters append small rows on
/// their lanes while an updater grows (and shrinks, and grows and rolls back) the newest rows;
/// every row must be there once, in order, with the payload last committed, every session's
/// identities must ascend, and the trees must check.
#[test]
fn growing_updates_beside_lane_appends_keep_every_row() {
    let (seed, _) = common::seeded_rng();
    for case in 0..common::cases(2) {
        let seed = seed.wrapping_add(case as u64);
        println!("case seed {seed}");
        let db = Database::create(DatabaseOptions::default()).unwrap();
        let table = db
            .create_table(
                TableDef::new("Grow")
                    .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                    .column(ColumnDef::new("Payload", DataType::VarChar(4000)).not_null())
                    .clustered(IndexDef::new("PK_Grow", &["Id"], Uniqueness::PrimaryKey)),
            )
            .unwrap();
        let payloads = std::sync::Mutex::new(BTreeMap::<i64, String>::new());
        let inserting = AtomicUsize::new(THREADS);
        std::thread::scope(|scope| {
            for me in 0..THREADS {
                let (db, table, payloads, inserting) = (&db, &table, &payloads, &inserting);
                scope.spawn(move || {
                    let session = db.session();
                    let mut last = 0;
                    for n in 0..1500 {
                        let text = format!("{me}-{n}");
                        let id = table
                            .insert(&session, InsertRow::new().set(1, text.as_str()))
                            .unwrap()
                            .unwrap();
                        assert!(id > last, "thread {me}: {id} after {last}");
                        last = id;
                        payloads.lock().unwrap().insert(id, text);
                    }
                    inserting.fetch_sub(1, Ordering::AcqRel);
                });
            }
            let (db, table, payloads, inserting) = (&db, &table, &payloads, &inserting);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                let session = db.session();
                while inserting.load(Ordering::Acquire) > 0 {
                    let newest: Vec<i64> = payloads
                        .lock()
                        .unwrap()
                        .keys()
                        .rev()
                        .take(40)
                        .copied()
                        .collect();
                    let Some(&id) = newest.get(rng.random_range(0..newest.len().max(1))) else {
                        std::thread::yield_now();
                        continue;
                    };
                    let len = if rng.random_bool(0.5) {
                        rng.random_range(1500..4000)
                    } else {
                        rng.random_range(1..20)
                    };
                    let text: String = std::iter::repeat_n('x', len).collect();
                    let rolls_back = rng.random_bool(0.2);
                    if rolls_back {
                        session.begin().unwrap();
                    }
                    assert!(
                        table
                            .update(
                                &session,
                                &[Value::BigInt(id)],
                                &[(1, Value::from(text.as_str()))]
                            )
                            .unwrap()
                    );
                    if rolls_back {
                        session.rollback().unwrap();
                    } else {
                        payloads.lock().unwrap().insert(id, text);
                    }
                }
            });
        });
        let session = db.session();
        let rows: BTreeMap<i64, String> = common::rows(&table, &session)
            .into_iter()
            .map(|row| match (&row[0], &row[1]) {
                (Value::BigInt(id), Value::String(text)) => (*id, text.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = payloads.into_inner().unwrap();
        assert_eq!(rows.len(), expected.len());
        assert!(
            rows == expected,
            "the rows differ from the payloads written"
        );
        table.check_integrity().unwrap();
    }
}

/// A key whose new value differs from the old one only in trailing spaces is the same key
/// (SQL Server compares text padded with spaces): the update changes the row in place and must
/// still return the value as written, through the clustered key and a unique index on text, and
/// through a rollback and a crash.
#[test]
fn trailing_spaces_change_a_text_key_in_place() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(7));
    let db = common::open(&fs);
    let table = db
        .create_table(
            TableDef::new("Names")
                .column(ColumnDef::new("Name", DataType::VarChar(20)).not_null())
                .column(ColumnDef::new("Code", DataType::VarChar(20)).not_null())
                .column(ColumnDef::new("N", DataType::Int).not_null())
                .clustered(IndexDef::new("PK", &["Name"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("UX_Code", &["Code"], Uniqueness::UniqueIndex)),
        )
        .unwrap();
    let session = db.session();
    for (name, code, n) in [("a", "x", 1), ("b", "y", 2)] {
        let row = InsertRow::new().set(0, name).set(1, code).set(2, n);
        table.insert(&session, row).unwrap();
    }
    let texts = |session: &Session, table: &Table| -> Vec<(String, String)> {
        common::rows(table, session)
            .into_iter()
            .map(|row| match (&row[0], &row[1]) {
                (Value::String(name), Value::String(code)) => (name.clone(), code.clone()),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let set = |key: &str, column: usize, value: &str| {
        table.update(
            &session,
            &[Value::from(key)],
            &[(column, Value::from(value))],
        )
    };
    // The same keys with trailing spaces: in place, the spaces kept.
    assert!(set("a", 0, "a  ").unwrap());
    assert!(set("a", 1, "x ").unwrap());
    // Taking the other row's code with trailing spaces is a duplicate.
    assert!(matches!(
        set("b", 1, "x   "),
        Err(EngineError::DuplicateIndexKey { .. })
    ));
    let spaced = vec![
        ("a  ".to_owned(), "x ".to_owned()),
        ("b".to_owned(), "y".to_owned()),
    ];
    assert_eq!(texts(&session, &table), spaced);
    table.check_integrity().unwrap();
    // In a transaction that rolls back: a move to a new key, back to the old one spelled
    // differently, and a code swap.
    session.begin().unwrap();
    assert!(set("a", 0, "c").unwrap());
    assert!(set("c", 0, "a").unwrap());
    assert!(set("a", 1, "z").unwrap());
    assert!(set("b", 1, "x").unwrap());
    assert!(set("a", 1, "y ").unwrap());
    assert_eq!(
        texts(&session, &table),
        [
            ("a".to_owned(), "y ".to_owned()),
            ("b".to_owned(), "x".to_owned())
        ]
    );
    session.rollback().unwrap();
    assert_eq!(texts(&session, &table), spaced);
    table.check_integrity().unwrap();
    // The same once committed, then a crash with it undone again in an open transaction.
    session.begin().unwrap();
    assert!(set("a", 0, "c").unwrap());
    assert!(set("c", 0, "a").unwrap());
    session.commit().unwrap();
    let moved = vec![
        ("a".to_owned(), "x ".to_owned()),
        ("b".to_owned(), "y".to_owned()),
    ];
    assert_eq!(texts(&session, &table), moved);
    session.begin().unwrap();
    assert!(set("a", 0, "a ").unwrap());
    assert!(set("b", 1, "q").unwrap());
    let fs = common::crash(&fs, CrashMode::KeepUnsynced, db, table, session);
    let db = common::open(&fs);
    let table = db.table("Names").unwrap();
    assert_eq!(texts(&db.session(), &table), moved);
    table.check_integrity().unwrap();
}

/// Updates that grow rows to about a page and shrink them again, in a durable database: leaves
/// split under in-place updates and moves, a row too large for a page fails its statement
/// (which must leave nothing), transactions roll back, and a crash with one open must bring
/// back exactly the committed rows.
#[test]
fn page_sized_updates_split_leaves_and_fail_whole() {
    let (seed, mut rng) = common::seeded_rng();
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = common::open(&fs);
    let def = |name: &str| {
        TableDef::new(name)
            .column(ColumnDef::new("K", DataType::Int).not_null())
            .column(ColumnDef::new("U", DataType::Int).not_null())
            .column(ColumnDef::new("P", DataType::VarChar(8000)).not_null())
            .column(ColumnDef::new("Q", DataType::VarChar(8000)))
            .clustered(IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey))
            .nonclustered(IndexDef::new("UX_U", &["U"], Uniqueness::UniqueIndex))
    };
    let table = db.create_table(def("Big")).unwrap();
    let session = db.session();
    // K -> (U, the length of P and of Q).
    type Rows = BTreeMap<i32, (i32, usize, usize)>;
    let read = |table: &Table, session: &Session| -> Rows {
        common::rows(table, session)
            .into_iter()
            .map(|row| match (&row[0], &row[1], &row[2], &row[3]) {
                (Value::Int(k), Value::Int(u), Value::String(p), Value::String(q)) => {
                    (*k, (*u, p.len(), q.len()))
                }
                (Value::Int(k), Value::Int(u), Value::String(p), Value::Null) => {
                    (*k, (*u, p.len(), 0))
                }
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let mut committed: Rows = BTreeMap::new();
    for k in 0..40 {
        let len = rng.random_range(0..3000);
        let row = InsertRow::new()
            .set(0, k * 2)
            .set(1, k)
            .set(2, "p".repeat(len).as_str());
        table.insert(&session, row).unwrap();
        committed.insert(k * 2, (k, len, 0));
    }
    let (mut grew, mut too_large) = (0, 0);
    for round in 0..200 {
        session.begin().unwrap();
        let mut current = committed.clone();
        for _ in 0..rng.random_range(1..6) {
            let k = rng.random_range(0..90);
            let mut changes = Vec::new();
            let len = if rng.random_bool(0.5) {
                rng.random_range(3000..8000)
            } else {
                rng.random_range(0..50)
            };
            changes.push((2, Value::from("q".repeat(len).as_str())));
            // Now and then a second long column, which makes the row too large for a page
            // when the first one is long too: the statement fails and leaves nothing.
            if rng.random_bool(0.15) {
                changes.push((
                    3,
                    Value::from("z".repeat(rng.random_range(1000..5000)).as_str()),
                ));
            }
            if rng.random_bool(0.3) {
                changes.push((0, Value::Int(rng.random_range(0..90))));
            }
            if rng.random_bool(0.2) {
                changes.push((1, Value::Int(rng.random_range(0..60))));
            }
            let result = table.update(&session, &[Value::Int(k)], &changes);
            match result {
                Ok(found) => {
                    assert_eq!(found, current.contains_key(&k), "round {round}: K={k}");
                    if let Some((u, _, q)) = current.remove(&k) {
                        // The value the update gave `column`, if it changed it.
                        let changed = |column: usize| {
                            changes
                                .iter()
                                .find_map(|(c, v)| (*c == column).then_some(v))
                        };
                        let int = |value: &Value| match value {
                            Value::Int(value) => *value,
                            _ => unreachable!(),
                        };
                        let new_q = changed(3).map_or(q, |v| match v {
                            Value::String(q) => q.len(),
                            _ => unreachable!(),
                        });
                        let new_k = changed(0).map_or(k, int);
                        let new_u = changed(1).map_or(u, int);
                        assert!(
                            current.insert(new_k, (new_u, len, new_q)).is_none(),
                            "round {round}: K={new_k} twice"
                        );
                        grew += usize::from(len >= 3000);
                    }
                }
                Err(EngineError::RowTooLarge { .. }) => too_large += 1,
                Err(EngineError::DuplicateKey { .. } | EngineError::DuplicateIndexKey { .. }) => {}
                Err(error) => panic!("round {round}: {error}"),
            }
            assert_eq!(read(&table, &session), current, "round {round}");
        }
        if rng.random_bool(0.6) {
            session.commit().unwrap();
            committed = current;
        } else {
            session.rollback().unwrap();
        }
        assert_eq!(read(&table, &session), committed, "round {round}");
        table.check_integrity().unwrap();
    }
    println!("{grew} rows grew, {too_large} updates too large for a page");
    session.begin().unwrap();
    for k in 0..90 {
        let _ = table.update(
            &session,
            &[Value::Int(k)],
            &[(2, Value::from("r".repeat(4000).as_str()))],
        );
    }
    let fs = common::crash(&fs, CrashMode::Random, db, table, session);
    let db = common::open(&fs);
    let table = db.table("Big").unwrap();
    assert_eq!(read(&table, &db.session()), committed);
    common::assert_every_page_owned(&db, "after the crash");
}
