//! A model-based randomized test of the statement layer (`Table`): a random schema (clustered
//! on an identity alone, on explicit, composite or text keys, non-unique, a heap; hash
//! partitioned or not; zero to two nonclustered indexes, unique or not), then a random mix of
//! single-row and batch inserts (duplicates included, which must fail and leave nothing),
//! updates of key and indexed columns, deletes, lookups, range scans both ways, index seeks,
//! explicit transactions that commit or roll back, and switches of the insert path. After
//! every step the table is compared with an in-memory oracle. The durable variant runs the
//! same mix over the fault-injecting file system, crashes at a random point, and compares the
//! reopened table with the oracle's committed state; both run the integrity checker.

use std::ops::Bound;
use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, DefaultValue, Direction, EngineError, IndexDef,
    InsertPath, InsertRow, KeyRange, Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};
use rand::Rng;
use rand::rngs::StdRng;

mod common;

use common::{CRASH_MODES, DIR, cases, crash, options, seeded_rng};

/// The columns a table can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Col {
    /// BIGINT IDENTITY.
    Id,
    /// INT, a key column.
    K1,
    /// VARCHAR(8), a key column.
    K2,
    /// INT NULL.
    A,
    /// VARCHAR(10) NULL.
    B,
    /// INT NOT NULL.
    C,
    /// VARCHAR(700) NULL, a payload that makes rows large.
    P,
    /// INT, computed: Id % 4 if the table has an identity, else C % 3.
    H,
}

/// A comparable image of a key value: text compares without trailing spaces, as the engine's
/// key encoding does.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum K {
    Null,
    I(i128),
    S(String),
}

fn k(value: &Value) -> K {
    match value {
        Value::Null => K::Null,
        // Numbers doubled, so that a decimal ending in .5 has a place between two integers.
        Value::Int(v) => K::I(2 * i128::from(*v)),
        Value::BigInt(v) => K::I(2 * i128::from(*v)),
        Value::SmallInt(v) => K::I(2 * i128::from(*v)),
        Value::Decimal(d) if d.scale() == 1 => K::I(d.mantissa() / 5),
        Value::String(s) => K::S(s.trim_end_matches(' ').to_owned()),
        other => panic!("unexpected value {other:?}"),
    }
}

#[derive(Clone, Debug)]
struct Nc {
    name: String,
    cols: Vec<usize>,
    unique: bool,
}

#[derive(Clone, Debug)]
struct Schema {
    cols: Vec<Col>,
    /// Clustered key columns (empty: a heap).
    key: Vec<usize>,
    unique_clustered: bool,
    identity: Option<usize>,
    partition: Option<(usize, u16)>,
    ncs: Vec<Nc>,
    /// The identity's seed and increment.
    identity_step: (i64, i64),
    /// The identity column's type: INT, BIGINT or SMALLINT.
    id_type: DataType,
}

impl Schema {
    fn pos(&self, col: Col) -> Option<usize> {
        self.cols.iter().position(|c| *c == col)
    }

    /// Fills in the computed column of `row`.
    fn compute(&self, row: &mut [Value]) {
        if let Some(h) = self.pos(Col::H) {
            let (source, modulus) = match self.identity {
                Some(id) => (id, 4),
                None => (self.pos(Col::C).unwrap(), 3),
            };
            row[h] = match k(&row[source]) {
                K::I(v) => Value::Int((v / 2).rem_euclid(i128::from(modulus)) as i32),
                _ => Value::Null,
            };
        }
    }

    /// A random schema; a durable one has no computed column (a durable database cannot
    /// persist its expression).
    fn random(rng: &mut StdRng, durable: bool) -> Schema {
        use Col::*;
        let kind = rng.random_range(0..if durable { 8 } else { 10 });
        let (cols, key_cols, unique, partition_col): (Vec<Col>, Vec<Col>, bool, Option<Col>) =
            match kind {
                0 => (vec![Id, A, B, C], vec![Id], true, None),
                1 => (vec![Id, A, B, C], vec![Id], true, Some(Id)),
                2 => (vec![K1, A, B, C], vec![K1], true, Some(K1)),
                3 => (vec![K1, K2, A, B, C], vec![K1, K2], true, Some(K1)),
                4 => (vec![K2, A, B, C], vec![K2], true, None),
                5 => (vec![K1, K2, A, B, C], vec![K2, K1], false, Some(K1)),
                6 => (vec![A, B, C], vec![], false, None),
                7 => (vec![K1, Id, A, B, C], vec![K1, Id], true, Some(K1)),
                8 => (vec![Id, H, A, B, C], vec![H, Id], true, Some(H)),
                _ => (vec![H, K1, A, B, C], vec![H, K1], false, Some(H)),
            };
        let key: Vec<usize> = key_cols
            .iter()
            .map(|c| cols.iter().position(|x| x == c).unwrap())
            .collect();
        let partition = partition_col.filter(|_| rng.random_bool(0.5)).map(|c| {
            (
                cols.iter().position(|x| *x == c).unwrap(),
                rng.random_range(2..=4),
            )
        });
        let identity = cols.iter().position(|c| *c == Id);
        let identity_step = if rng.random_bool(0.7) {
            (1, 1)
        } else if rng.random_bool(0.7) {
            (rng.random_range(-5..100), rng.random_range(1..4))
        } else {
            (rng.random_range(-5..100), -rng.random_range(1..4))
        };
        let wide = rng.random_bool(0.5);
        let mut cols = cols;
        if wide {
            cols.push(P);
        }
        let mut ncs = Vec::new();
        let mut candidates: Vec<Vec<Col>> = vec![vec![A], vec![B], vec![B, C], vec![C, A]];
        if wide {
            // Keys longer than an index key may be (some P values are).
            candidates.push(vec![P]);
        }
        let count = rng.random_range(0..=2);
        for i in 0..count {
            let cs = &candidates[rng.random_range(0..candidates.len())];
            let mut nc_cols: Vec<usize> = cs
                .iter()
                .map(|c| cols.iter().position(|x| x == c).unwrap())
                .collect();
            // An index on P is not unique: P is not one of the columns a thread owns values of
            // in the concurrent test.
            let unique = rng.random_bool(0.4) && !cs.contains(&P);
            // A unique index of a partitioned table must hold the partitioning column.
            if unique && let Some((p, _)) = partition {
                nc_cols.push(p);
            }
            ncs.push(Nc {
                name: format!("IX_{i}"),
                cols: nc_cols,
                unique,
            });
        }
        let id_type = [DataType::Int, DataType::BigInt, DataType::SmallInt][rng.random_range(0..3)];
        Schema {
            id_type,
            cols,
            key,
            unique_clustered: unique,
            identity,
            partition,
            ncs,
            identity_step,
        }
    }

    fn def(&self) -> TableDef {
        let mut def = TableDef::new("T");
        for (i, col) in self.cols.iter().enumerate() {
            let in_key = self.key.contains(&i);
            let column = match col {
                Col::Id => ColumnDef::new("Id", self.id_type)
                    .identity(self.identity_step.0, self.identity_step.1),
                Col::K1 => {
                    let c = ColumnDef::new("K1", DataType::Int);
                    if in_key && (self.unique_clustered || self.partition.is_some()) {
                        c.not_null()
                    } else {
                        c
                    }
                }
                Col::K2 => {
                    let c = ColumnDef::new("K2", DataType::VarChar(8));
                    if in_key && self.unique_clustered {
                        c.not_null()
                    } else {
                        c
                    }
                }
                Col::A => ColumnDef::new("A", DataType::Int),
                Col::B => ColumnDef::new("B", DataType::VarChar(10)),
                Col::P => ColumnDef::new("P", DataType::VarChar(2000)),
                Col::H => {
                    let source = self.identity.unwrap_or_else(|| self.pos(Col::C).unwrap());
                    let modulus = if self.identity.is_some() { 4 } else { 3 };
                    ColumnDef::new("H", DataType::Int).computed(Arc::new(move |row: &[Value]| {
                        Ok(match &row[source] {
                            Value::Null => Value::Null,
                            v => Value::BigInt(v.as_i64().unwrap().rem_euclid(modulus)),
                        })
                    }))
                }
                Col::C => ColumnDef::new("C", DataType::Int)
                    .not_null()
                    .default_value(DefaultValue::Constant(Value::Int(2))),
            };
            def = def.column(column);
        }
        if !self.key.is_empty() {
            let names: Vec<&str> = self.key.iter().map(|i| self.name(*i)).collect();
            def = def.clustered(IndexDef::new(
                "PK_T",
                &names,
                if self.unique_clustered {
                    Uniqueness::PrimaryKey
                } else {
                    Uniqueness::NonUnique
                },
            ));
        }
        for nc in &self.ncs {
            let names: Vec<&str> = nc.cols.iter().map(|i| self.name(*i)).collect();
            def = def.nonclustered(IndexDef::new(
                nc.name.clone(),
                &names,
                if nc.unique {
                    Uniqueness::UniqueIndex
                } else {
                    Uniqueness::NonUnique
                },
            ));
        }
        if let Some((col, n)) = self.partition {
            def = def.partitioned(self.name(col), n);
        }
        def
    }

    fn name(&self, i: usize) -> &'static str {
        match self.cols[i] {
            Col::Id => "Id",
            Col::K1 => "K1",
            Col::K2 => "K2",
            Col::A => "A",
            Col::B => "B",
            Col::C => "C",
            Col::P => "P",
            Col::H => "H",
        }
    }

    fn key_of(&self, row: &[Value]) -> Vec<K> {
        self.key.iter().map(|i| k(&row[*i])).collect()
    }

    fn key_values(&self, row: &[Value]) -> Vec<Value> {
        self.key.iter().map(|i| row[*i].clone()).collect()
    }

    /// Supplied (non-identity, non-computed) columns.
    fn supplied(&self) -> Vec<usize> {
        (0..self.cols.len())
            .filter(|i| !matches!(self.cols[*i], Col::Id | Col::H))
            .collect()
    }
}

fn small_text(rng: &mut StdRng, max: usize) -> String {
    let len = rng.random_range(0..=max.min(3));
    let mut s: String = (0..len)
        .map(|_| ['a', 'b', 'B'][rng.random_range(0..3)])
        .collect();
    if rng.random_bool(0.15) {
        s.push(' ');
    }
    s
}

/// A random value for column `col` (NULL sometimes where it is not allowed, and text too long
/// sometimes, so that failing statements happen).
fn value(rng: &mut StdRng, schema: &Schema, i: usize) -> Value {
    let nullable_try = rng.random_bool(0.04);
    match schema.cols[i] {
        Col::Id | Col::H => unreachable!(),
        Col::K1 => {
            if nullable_try {
                Value::Null
            } else {
                Value::Int(if rng.random_bool(0.5) {
                    rng.random_range(-3..25)
                } else {
                    rng.random_range(-1000..1000)
                })
            }
        }
        Col::K2 => {
            if nullable_try {
                Value::Null
            } else if rng.random_bool(0.02) {
                Value::String("abcdefghij".into())
            } else {
                Value::String(small_text(rng, 8))
            }
        }
        Col::A => {
            if rng.random_bool(0.2) {
                Value::Null
            } else {
                Value::Int(rng.random_range(0..40))
            }
        }
        Col::B => {
            if rng.random_bool(0.2) {
                Value::Null
            } else if rng.random_bool(0.02) {
                Value::String("abcdefghijk".into())
            } else {
                Value::String(small_text(rng, 10))
            }
        }
        Col::C => {
            if nullable_try {
                Value::Null
            } else {
                Value::Int(rng.random_range(0..6))
            }
        }
        Col::P => {
            if rng.random_bool(0.1) {
                Value::Null
            } else {
                let len = if rng.random_bool(0.03) {
                    rng.random_range(1800..=2000)
                } else {
                    rng.random_range(0..=700)
                };
                let c = ['x', 'y', 'z'][rng.random_range(0..3)];
                Value::String(std::iter::repeat_n(c, len).collect())
            }
        }
    }
}

/// Why a row cannot be stored on its own (NULL in a NOT NULL column, text too long).
fn invalid(schema: &Schema, row: &[Value]) -> Option<String> {
    for (i, v) in row.iter().enumerate() {
        let not_null = match schema.cols[i] {
            Col::Id | Col::H => false,
            Col::C => true,
            Col::K1 => {
                schema.key.contains(&i) && (schema.unique_clustered || schema.partition.is_some())
            }
            Col::K2 => schema.key.contains(&i) && schema.unique_clustered,
            _ => false,
        };
        if not_null && v.is_null() {
            return Some(format!("null {}", schema.name(i)));
        }
        if let Value::String(s) = v {
            let max = match schema.cols[i] {
                Col::K2 => 8,
                Col::P => 2000,
                _ => 10,
            };
            if s.len() > max {
                return Some(format!("long {}", schema.name(i)));
            }
        }
    }
    None
}

#[derive(Clone, Debug, Default)]
struct Oracle {
    rows: Vec<Vec<Value>>,
}

impl Oracle {
    /// Whether `row` collides with a row of `others` in a unique index: the clustered key
    /// (`Some(None)`), or nonclustered index `n` (`Some(Some(n))`).
    fn collision<'a>(
        schema: &Schema,
        row: &[Value],
        others: impl Iterator<Item = &'a Vec<Value>> + Clone,
    ) -> Option<(Option<usize>, String)> {
        let fresh_identity_key = schema
            .identity
            .is_some_and(|id| schema.key.contains(&id) && row[id].is_null());
        if schema.unique_clustered && !schema.key.is_empty() && !fresh_identity_key {
            let key = schema.key_of(row);
            if others.clone().any(|o| schema.key_of(o) == key) {
                return Some((None, key_text(row, &schema.key)));
            }
        }
        for (n, nc) in schema.ncs.iter().enumerate() {
            if !nc.unique {
                continue;
            }
            // A fresh identity value (not filled in yet) collides with nothing; a column
            // computed from it is not known yet (compared without it, a match is a maybe).
            let unfilled = schema.identity.filter(|id| row[*id].is_null());
            if unfilled.is_some_and(|id| nc.cols.contains(&id)) {
                continue;
            }
            let unknown = unfilled.and(schema.pos(Col::H));
            let cols: Vec<usize> = nc
                .cols
                .iter()
                .copied()
                .filter(|c| Some(*c) != unknown)
                .collect();
            let key: Vec<K> = cols.iter().map(|i| k(&row[*i])).collect();
            if others
                .clone()
                .any(|o| cols.iter().map(|i| k(&o[*i])).collect::<Vec<_>>() == key)
            {
                let n = n + if cols.len() < nc.cols.len() { 100 } else { 0 };
                return Some((Some(n), key_text(row, &nc.cols)));
            }
        }
        None
    }

    /// The rows in clustered key order, ties (a non-unique key) in any order.
    fn sorted(&self, schema: &Schema) -> Vec<Vec<Value>> {
        let mut rows = self.rows.clone();
        rows.sort_by_key(|r| schema.key_of(r));
        rows
    }
}

/// The columns `cols` of `row` as a duplicate key message shows them.
fn key_text(row: &[Value], cols: &[usize]) -> String {
    cols.iter()
        .map(|c| row[*c].to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn row_text(row: &[Value]) -> String {
    format!("{row:?}")
}

/// Compares rows read in key order (`direction`) with the oracle's `expected` (in forward key
/// order): the keys must follow each other in order, and the rows must be the same multiset.
fn same_rows(
    schema: &Schema,
    what: &str,
    actual: &[Vec<Value>],
    expected: &[Vec<Value>],
    direction: Direction,
) {
    let keys: Vec<Vec<K>> = actual.iter().map(|r| schema.key_of(r)).collect();
    for pair in keys.windows(2) {
        let ok = match direction {
            Direction::Forward => pair[0] <= pair[1],
            Direction::Backward => pair[0] >= pair[1],
        };
        assert!(
            ok,
            "{what}: keys out of order: {:?} then {:?}",
            pair[0], pair[1]
        );
    }
    let mut a: Vec<(Vec<K>, String)> = actual
        .iter()
        .map(|r| (schema.key_of(r), row_text(r)))
        .collect();
    let mut e: Vec<(Vec<K>, String)> = expected
        .iter()
        .map(|r| (schema.key_of(r), row_text(r)))
        .collect();
    a.sort();
    e.sort();
    assert_eq!(a, e, "{what}: rows differ");
}

fn read(table: &Table, session: &Session, range: &KeyRange, dir: Direction) -> Vec<Vec<Value>> {
    table
        .scan(session, range, dir)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn in_range(key: &[K], lower: &Bound<Vec<K>>, upper: &Bound<Vec<K>>) -> bool {
    let n = |b: &Vec<K>| b.len();
    let lower_ok = match lower {
        Bound::Unbounded => true,
        Bound::Included(b) => key[..n(b)] >= b[..],
        Bound::Excluded(b) => key[..n(b)] > b[..],
    };
    let upper_ok = match upper {
        Bound::Unbounded => true,
        Bound::Included(b) => key[..n(b)] <= b[..],
        Bound::Excluded(b) => key[..n(b)] < b[..],
    };
    lower_ok && upper_ok
}

struct Run<'a> {
    rng: &'a mut StdRng,
    schema: Schema,
    table: Arc<Table>,
    session: Session,
    oracle: Oracle,
    /// The oracle when the open transaction began.
    committed: Option<Oracle>,
    log: Vec<String>,
    last_identity: Option<i64>,
    /// In the concurrent test, this thread's number: its rows' keys and unique values are
    /// its own (K1, A, K2 and B carry it), so that its oracle is exact while other threads
    /// work on the same table. Such a run reads only its own rows.
    thread: Option<i64>,
    /// Whether the open transaction will roll back (decided when it begins). In a concurrent
    /// run, every row a statement writes that will never commit (in such a transaction, or
    /// of a statement that fails) carries `C = DOOMED`, which readers must never see.
    doomed: bool,
    /// In the crash test: every committed state in order (each as its sorted rows), and the
    /// first that must survive a crash (the last one a FULL commit, a checkpoint or an index
    /// change made durable; those after it were committed DELAYED or pipelined and not
    /// waited for, and may be lost, but only from the end).
    history: Option<(Vec<Vec<String>>, usize)>,
    /// Whether the open transaction commits without waiting for its log record.
    delayed: bool,
    /// Whether the last commit did not wait for its log record.
    last_commit_delayed: bool,
}

/// The rows of `oracle` as sorted text, for comparing states.
fn state_of(oracle: &Oracle) -> Vec<String> {
    let mut rows: Vec<String> = oracle.rows.iter().map(|r| row_text(r)).collect();
    rows.sort();
    rows
}

/// The value of C in rows that are never committed (see `Run::doomed`); C is 0..6 otherwise.
const DOOMED: i32 = 77;

impl<'a> Run<'a> {
    /// A run that starts with an empty oracle, outside a transaction, alone on its rows and
    /// keeping no history; the tests that need otherwise set those fields on top.
    fn new(
        rng: &'a mut StdRng,
        log: String,
        schema: Schema,
        table: Arc<Table>,
        session: Session,
    ) -> Run<'a> {
        Run {
            rng,
            log: vec![log],
            schema,
            table,
            session,
            oracle: Oracle::default(),
            committed: None,
            last_identity: None,
            thread: None,
            doomed: false,
            history: None,
            delayed: false,
            last_commit_delayed: false,
        }
    }

    /// `rows` with C set to [`DOOMED`] (and H computed again).
    fn marked(&self, rows: &[Vec<Value>]) -> Vec<Vec<Value>> {
        let c = self.schema.pos(Col::C).unwrap();
        rows.iter()
            .map(|row| {
                let mut row = row.clone();
                row[c] = Value::Int(DOOMED);
                self.schema.compute(&mut row);
                row
            })
            .collect()
    }

    /// In a concurrent run, marks rows that will never commit (see `Run::doomed`): every row
    /// of a transaction that will roll back, and those of a statement expected to fail if
    /// marked they are still expected to fail.
    fn mark_doomed(&self, rows: &mut Vec<Vec<Value>>, expected: &mut Option<String>) {
        if self.thread.is_none() {
            return;
        }
        let certain = |e: &Option<String>| e.as_ref().is_some_and(|e| e != "maybe duplicate");
        if self.doomed || certain(expected) {
            let marked = self.marked(rows);
            let marked_expected = self.expected_failure(&marked);
            if self.doomed || certain(&marked_expected) {
                *rows = marked;
                *expected = marked_expected;
            }
        }
    }

    /// A random value for column `c`, of this thread's own in the concurrent test.
    fn val(&mut self, c: usize) -> Value {
        let v = value(self.rng, &self.schema, c);
        let Some(t) = self.thread else {
            return v;
        };
        match (self.schema.cols[c], v) {
            (Col::K1, Value::Int(i)) => Value::Int(i + i32::try_from(t).unwrap() * 100_000),
            (Col::A, Value::Int(i)) => Value::Int(i + i32::try_from(t).unwrap() * 1000),
            (Col::A, Value::Null) => Value::Int(i32::try_from(t).unwrap() * 1000 + 999),
            (Col::K2 | Col::B, Value::String(s)) => Value::String(format!("{t}{s}")),
            (Col::B | Col::K2, Value::Null) => Value::String(format!("{t}")),
            (Col::K1, Value::Null) => Value::Int(i32::try_from(t).unwrap() * 100_000 + 50_000),
            (_, v) => v,
        }
    }

    /// Whether the first key column is one a thread owns values of (or this is no
    /// concurrent run), so that a search by it alone reads only the thread's rows.
    fn may_search_prefix(&self, cols: &[usize]) -> bool {
        self.thread.is_none()
            || cols.first().is_some_and(|c| {
                matches!(self.schema.cols[*c], Col::K1 | Col::A | Col::B | Col::K2)
            })
    }

    fn id_value(&self, id: i64) -> Value {
        match self.schema.id_type {
            DataType::Int => Value::Int(i32::try_from(id).unwrap()),
            DataType::SmallInt => Value::SmallInt(i16::try_from(id).unwrap()),
            _ => Value::BigInt(id),
        }
    }

    fn random_row(&mut self) -> Vec<Value> {
        let mut row = vec![Value::Null; self.schema.cols.len()];
        for i in self.schema.supplied() {
            row[i] = self.val(i);
        }
        self.schema.compute(&mut row);
        row
    }

    /// A row of the oracle, or a made-up one.
    fn pick_existing_or_new(&mut self) -> Vec<Value> {
        if !self.oracle.rows.is_empty() && self.rng.random_bool(0.8) {
            let i = self.rng.random_range(0..self.oracle.rows.len());
            self.oracle.rows[i].clone()
        } else {
            let mut row = self.random_row();
            if let Some(id) = self.schema.identity {
                let v = match self.thread {
                    // A value no thread is handed out: before the seed.
                    Some(t) => {
                        self.schema.identity_step.0
                            - self.schema.identity_step.1.signum() * (100 + t)
                    }
                    None => self.rng.random_range(-5..200),
                };
                row[id] = self.id_value(v);
                self.schema.compute(&mut row);
            }
            row
        }
    }

    /// An insert's row: mostly fresh, sometimes a copy of an existing row's values (to make
    /// duplicates).
    fn insert_row(&mut self) -> Vec<Value> {
        let mut row = self.random_row();
        if !self.oracle.rows.is_empty() && self.rng.random_bool(0.3) {
            let i = self.rng.random_range(0..self.oracle.rows.len());
            let other = self.oracle.rows[i].clone();
            for c in self.schema.supplied() {
                if self.rng.random_bool(0.7) {
                    row[c] = other[c].clone();
                }
            }
            self.schema.compute(&mut row);
        }
        row
    }

    /// The first nonclustered index whose key for `row` is longer than a key may be.
    fn too_large(&self, row: &[Value]) -> Option<String> {
        let p = self.schema.pos(Col::P)?;
        let Value::String(text) = &row[p] else {
            return None;
        };
        (text.len() >= 1800).then_some(())?;
        self.schema
            .ncs
            .iter()
            .find(|nc| nc.cols.contains(&p))
            .map(|nc| format!("key {}", nc.name))
    }

    fn expected_failure(&self, rows: &[Vec<Value>]) -> Option<String> {
        // Values are checked row by row (a row's key sizes with its values), or every row's
        // values before any entry is made (a batch at the tail of an identity): either error
        // is right where both orders differ.
        let row_by_row = rows
            .iter()
            .find_map(|row| invalid(&self.schema, row).or_else(|| self.too_large(row)));
        let values_first = rows
            .iter()
            .find_map(|row| invalid(&self.schema, row))
            .or_else(|| rows.iter().find_map(|row| self.too_large(row)));
        match (row_by_row, values_first) {
            (Some(a), Some(b)) if a != b => return Some(format!("{a}|{b}")),
            (Some(a), _) => return Some(a),
            _ => {}
        }
        // Identity-keyed rows cannot collide on the clustered key (fresh values), only on
        // unique nonclustered keys; rows without an identity collide on either.
        // A statement puts its rows into the clustered index first, then into each
        // nonclustered index in turn: the error is the first row's that the first index to
        // reject any rejects.
        let mut found: Option<(usize, usize, String)> = None;
        for (n, row) in rows.iter().enumerate() {
            let schema = &self.schema;
            let others = self.oracle.rows.iter().chain(rows[..n].iter());
            match Oracle::collision(schema, row, others) {
                // Index n + 100: a match on every column but one not known yet.
                Some((Some(n), _)) if n >= 100 => return Some("maybe duplicate".to_owned()),
                Some((which, key)) => {
                    let index = which.map_or(0, |w| w + 1);
                    let name = which.map_or("PK_T".to_owned(), |w| schema.ncs[w].name.clone());
                    if found.as_ref().is_none_or(|(i, _, _)| index < *i) {
                        found = Some((index, n, format!("duplicate {name} ({key})")));
                    }
                }
                None => {}
            }
        }
        found.map(|(_, _, text)| text)
    }

    /// Every unique index's keys are distinct in the oracle.
    fn check_unique(&self) {
        let schema = &self.schema;
        let mut keys: Vec<Vec<usize>> = schema
            .ncs
            .iter()
            .filter(|nc| nc.unique)
            .map(|nc| nc.cols.clone())
            .collect();
        if schema.unique_clustered {
            keys.push(schema.key.clone());
        }
        for cols in keys {
            let mut seen: Vec<Vec<K>> = self
                .oracle
                .rows
                .iter()
                .map(|r| cols.iter().map(|c| k(&r[*c])).collect())
                .collect();
            seen.sort();
            for pair in seen.windows(2) {
                assert_ne!(
                    pair[0], pair[1],
                    "duplicate key in {cols:?}\nlog: {:#?}",
                    self.log
                );
            }
        }
    }

    /// Checks `error` against the expected failure (alternatives separated by `|`).
    fn check_error(&self, error: &EngineError, expected: &str, statement: &str) {
        let ok = expected
            .split('|')
            .any(|expected| error_matches(error, expected, statement));
        assert!(
            ok,
            "expected failure {expected}, got {error:?}\nlog: {:#?}",
            self.log
        );
    }
}

fn error_matches(error: &EngineError, expected: &str, statement: &str) -> bool {
    {
        match error {
            EngineError::KeyTooLarge { index, .. } => expected == format!("key {index}"),
            EngineError::NullNotAllowed {
                column,
                statement: named,
                ..
            } => expected == format!("null {column}") && *named == statement,
            EngineError::Value(e) => {
                expected == format!("long {}", e.column().unwrap_or("?"))
                    && e.message()
                        .contains(&format!("column '{}'", e.column().unwrap_or("?")))
            }
            EngineError::DuplicateKey {
                constraint: name,
                key,
                ..
            }
            | EngineError::DuplicateIndexKey {
                index: name, key, ..
            } => expected == format!("duplicate {name} ({key})") || expected == "maybe duplicate",
            _ => false,
        }
    }
}

impl Run<'_> {
    fn fill_identity(&mut self, row: &mut [Value], id: Option<i64>) {
        if let Some(i) = self.schema.identity {
            let id = id.expect("an identity value");
            assert!(
                !self.oracle.rows.iter().any(|r| r[i] == self.id_value(id)),
                "identity {id} handed out twice"
            );
            // One session's identity values keep going one way (docs/insert-paths.md).
            if let Some(last) = self.last_identity {
                let onward = if self.schema.identity_step.1 > 0 {
                    id > last
                } else {
                    id < last
                };
                assert!(onward, "identity {id} after {last}\nlog: {:#?}", self.log);
            }
            row[i] = self.id_value(id);
            self.schema.compute(row);
            self.last_identity = Some(id);
        } else {
            assert_eq!(id, None);
        }
    }

    fn step(&mut self) {
        let op = self.rng.random_range(0..100);
        match op {
            0..=24 => self.insert_one(),
            25..=39 => self.insert_many(),
            40..=54 => self.update(),
            55..=64 => self.delete(),
            65..=72 => self.lookup(),
            73..=82 if self.thread.is_none() => self.range_scan(),
            83..=88 => self.index_seek(),
            89..=95 => self.transaction(),
            97.. => self.switch_path(),
            _ => {}
        }
        if self.thread.is_none() {
            self.check_all();
        }
        self.note_history();
    }

    /// Records the committed state after a step (see `Run::history`).
    fn note_history(&mut self) {
        let delayed = std::mem::take(&mut self.last_commit_delayed);
        if self.committed.is_some() {
            return;
        }
        let state = state_of(&self.oracle);
        let Some((states, durable_from)) = &mut self.history else {
            return;
        };
        if states.last() != Some(&state) {
            states.push(state);
            if !delayed {
                *durable_from = states.len() - 1;
            }
        }
    }

    /// Everything committed so far is durable (a checkpoint, or a flushed log).
    fn all_durable(&mut self) {
        if let Some((states, durable_from)) = &mut self.history {
            *durable_from = states.len() - 1;
        }
    }

    fn insert_one(&mut self) {
        let mut row = self.insert_row();
        let supplied = self.schema.supplied();
        let how = self.rng.random_range(0..3);
        // Columns an InsertRow leaves out: they get their default (C's is 2) or NULL.
        let mut omitted = Vec::new();
        if how == 0 {
            for c in &supplied {
                // A concurrent run leaves out only columns whose values no thread owns.
                let may_omit =
                    self.thread.is_none() || matches!(self.schema.cols[*c], Col::C | Col::P);
                if may_omit && self.rng.random_bool(0.2) {
                    omitted.push(*c);
                    row[*c] = if self.schema.cols[*c] == Col::C {
                        Value::Int(2)
                    } else {
                        Value::Null
                    };
                }
            }
            self.schema.compute(&mut row);
        }
        let mut expected = self.expected_failure(std::slice::from_ref(&row));
        if !omitted.iter().any(|c| self.schema.cols[*c] == Col::C) {
            let mut rows = vec![row];
            self.mark_doomed(&mut rows, &mut expected);
            row = rows.pop().unwrap();
        }
        self.log.push(format!(
            "insert#{how} {row:?} omitting {omitted:?} expect {expected:?}"
        ));
        let result = match how {
            0 => {
                let mut insert = InsertRow::new();
                for c in &supplied {
                    if !omitted.contains(c) {
                        insert = insert.set(*c, row[*c].clone());
                    }
                }
                self.table.insert(&self.session, insert)
            }
            1 => {
                let prepared = self.table.prepare_insert(&supplied).unwrap();
                let values: Vec<Value> = supplied.iter().map(|c| row[*c].clone()).collect();
                prepared.insert(&self.session, &values)
            }
            _ => {
                let values: Vec<(&str, Value)> = supplied
                    .iter()
                    .map(|c| (self.schema.name(*c), row[*c].clone()))
                    .collect();
                self.table.insert_named(&self.session, &values)
            }
        };
        let maybe = expected.as_deref() == Some("maybe duplicate");
        match (result, expected.filter(|e| e != "maybe duplicate")) {
            (Ok(id), None) => {
                self.fill_identity(&mut row, id);
                self.oracle.rows.push(row);
            }
            (Err(e), Some(why)) => self.check_error(&e, &why, "INSERT"),
            (Err(e), None) if maybe => self.check_error(&e, "maybe duplicate", "INSERT"),
            (result, expected) => panic!(
                "insert {row:?}: got {result:?}, expected failure {expected:?}\nlog: {:#?}",
                self.log
            ),
        }
    }

    fn insert_many(&mut self) {
        let count = if self.rng.random_bool(0.8) {
            self.rng.random_range(0..12)
        } else {
            self.rng.random_range(12..150)
        };
        let mut rows: Vec<Vec<Value>> = (0..count).map(|_| self.insert_row()).collect();
        // Sometimes a duplicate inside the batch itself.
        if count > 1 && self.rng.random_bool(0.2) {
            let from = self.rng.random_range(0..count);
            let to = self.rng.random_range(0..count);
            rows[to] = rows[from].clone();
        }
        let mut expected = self.expected_failure(&rows);
        self.mark_doomed(&mut rows, &mut expected);
        let supplied = self.schema.supplied();
        let by_values = self.rng.random_bool(0.5);
        self.log.push(format!(
            "batch(values={by_values}) {rows:?} expect {expected:?}"
        ));
        let result = if by_values {
            let values: Vec<Vec<Value>> = rows
                .iter()
                .map(|r| supplied.iter().map(|c| r[*c].clone()).collect())
                .collect();
            self.table.insert_batch_values(
                &self.session,
                &supplied,
                values.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            )
        } else {
            let inserts = rows
                .iter()
                .map(|r| {
                    supplied
                        .iter()
                        .fold(InsertRow::new(), |ins, c| ins.set(*c, r[*c].clone()))
                })
                .collect();
            self.table.insert_batch(&self.session, inserts)
        };
        let maybe = expected.as_deref() == Some("maybe duplicate");
        match (result, expected.filter(|e| e != "maybe duplicate")) {
            (Ok(ids), None) => {
                assert_eq!(ids.len(), rows.len());
                for (mut row, id) in rows.into_iter().zip(ids) {
                    self.fill_identity(&mut row, id);
                    self.oracle.rows.push(row);
                }
            }
            (Err(e), Some(why)) => self.check_error(&e, &why, "INSERT"),
            (Err(e), None) if maybe => self.check_error(&e, "maybe duplicate", "INSERT"),
            (result, expected) => panic!(
                "batch {rows:?}: got {result:?}, expected failure {expected:?}\nlog: {:#?}",
                self.log
            ),
        }
    }

    /// The row `key` (a clustered key prefix) names: the first in key order, as the table
    /// reads it, checked to be one of the oracle's.
    fn target(&mut self, key: &[Value]) -> Option<usize> {
        let range = common::prefix(key.to_vec());
        let first = self
            .table
            .scan(&self.session, &range, Direction::Forward)
            .unwrap()
            .next()
            .map(Result::unwrap);
        let want: Vec<K> = key.iter().map(k).collect();
        let mut matches: Vec<usize> = (0..self.oracle.rows.len())
            .filter(|i| self.schema.key_of(&self.oracle.rows[*i])[..want.len()] == want[..])
            .collect();
        matches.sort_by_key(|i| self.schema.key_of(&self.oracle.rows[*i]));
        match first {
            None => {
                assert!(
                    matches.is_empty(),
                    "prefix {key:?}: nothing read, oracle has {matches:?}\nlog: {:#?}",
                    self.log
                );
                None
            }
            Some(row) => {
                let i = matches
                    .iter()
                    .copied()
                    .find(|i| self.oracle.rows[*i] == row)
                    .unwrap_or_else(|| {
                        panic!(
                            "prefix {key:?}: read {row:?}, not in the oracle\nlog: {:#?}",
                            self.log
                        )
                    });
                // The first match has the lowest key columns of the matches.
                assert_eq!(
                    self.schema.key_of(&self.oracle.rows[i]),
                    self.schema.key_of(&self.oracle.rows[matches[0]])
                );
                Some(i)
            }
        }
    }

    fn lookup_key(&mut self) -> Vec<Value> {
        let row = self.pick_existing_or_new();
        let mut key = self.schema.key_values(&row);
        // Sometimes a prefix, sometimes a text key with other trailing spaces.
        if key.len() > 1 && self.may_search_prefix(&self.schema.key) && self.rng.random_bool(0.2) {
            key.truncate(1);
        }
        for v in &mut key {
            match v {
                Value::String(s) if self.rng.random_bool(0.2) => s.push(' '),
                Value::String(_) if self.rng.random_bool(0.05) => {
                    *v = Value::String("abcdefghijk".into());
                }
                // An integer of another type, in range or beyond the column's.
                Value::Int(i) if self.rng.random_bool(0.1) => *v = Value::BigInt(i64::from(*i)),
                Value::BigInt(i) if self.rng.random_bool(0.1) => {
                    if let Ok(small) = i32::try_from(*i) {
                        *v = Value::Int(small);
                    }
                }
                // Half-way to the next integer: equal to no key, between two.
                Value::Int(i) if self.rng.random_bool(0.05) => {
                    let m = i128::from(*i) * 10 + if self.rng.random_bool(0.5) { 5 } else { -5 };
                    *v = Value::Decimal(lastpage_engine::types::Decimal::new(m, 1).unwrap());
                }
                Value::Int(_) | Value::BigInt(_) if self.rng.random_bool(0.03) => {
                    *v = Value::BigInt(if self.rng.random_bool(0.5) {
                        5_000_000_000
                    } else {
                        -5_000_000_000
                    });
                }
                _ => {}
            }
        }
        key
    }

    fn update(&mut self) {
        let key = self.lookup_key();
        let target = self.target(&key);
        let mut changes: Vec<(usize, Value)> = Vec::new();
        for c in self.schema.supplied() {
            if self.rng.random_bool(0.35) {
                let v = if self.rng.random_bool(0.3)
                    && let Some(t) = target
                    && !self.oracle.rows.is_empty()
                {
                    // A value of another row (a likely duplicate).
                    let _ = t;
                    let o = self.rng.random_range(0..self.oracle.rows.len());
                    self.oracle.rows[o][c].clone()
                } else {
                    self.val(c)
                };
                changes.push((c, v));
            }
        }
        let expectation = |changes: &[(usize, Value)]| {
            let t = target?;
            let mut new = self.oracle.rows[t].clone();
            for (c, v) in changes {
                new[*c] = v.clone();
            }
            self.schema.compute(&mut new);
            let expected = invalid(&self.schema, &new)
                .or_else(|| self.too_large(&new))
                .or_else(|| {
                    let others: Vec<&Vec<Value>> = self
                        .oracle
                        .rows
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != t)
                        .map(|(_, r)| r)
                        .collect();
                    Oracle::collision(&self.schema, &new, others.iter().copied()).map(
                        |(which, key)| {
                            let name = which
                                .map_or("PK_T".to_owned(), |w| self.schema.ncs[w].name.clone());
                            format!("duplicate {name} ({key})")
                        },
                    )
                });
            Some((new, expected))
        };
        let mut planned = expectation(&changes);
        if self.thread.is_some()
            && let Some((_, expected)) = &planned
            && (self.doomed || expected.is_some())
        {
            let c = self.schema.pos(Col::C).unwrap();
            let mut marked: Vec<(usize, Value)> =
                changes.iter().filter(|(x, _)| *x != c).cloned().collect();
            marked.push((c, Value::Int(DOOMED)));
            let marked_plan = expectation(&marked);
            if self.doomed || marked_plan.as_ref().is_some_and(|(_, e)| e.is_some()) {
                changes = marked;
                planned = marked_plan;
            }
        }
        self.log.push(format!(
            "update {key:?} set {changes:?} (target {target:?})"
        ));
        let result = self.table.update(&self.session, &key, &changes);
        let Some(t) = target else {
            assert_eq!(
                result,
                Ok(false),
                "update of a missing row\nlog: {:#?}",
                self.log
            );
            return;
        };
        let (new, expected) = planned.expect("a plan for a row that is there");
        let maybe = false;
        match (result, expected) {
            (Ok(true), None) => self.oracle.rows[t] = new,
            (Err(e), Some(why)) => self.check_error(&e, &why, "UPDATE"),
            (Err(e), None) if maybe => self.check_error(&e, "maybe duplicate", "UPDATE"),
            (result, expected) => panic!(
                "update to {new:?}: got {result:?}, expected failure {expected:?}\nlog: {:#?}",
                self.log
            ),
        }
    }

    fn delete(&mut self) {
        let key = self.lookup_key();
        let target = self.target(&key);
        self.log.push(format!("delete {key:?} (target {target:?})"));
        let result = self.table.delete(&self.session, &key);
        assert_eq!(result, Ok(target.is_some()), "delete\nlog: {:#?}", self.log);
        if let Some(t) = target {
            self.oracle.rows.swap_remove(t);
        }
    }

    fn lookup(&mut self) {
        let key = self.lookup_key();
        let got = self.table.get(&self.session, &key).unwrap();
        let want: Vec<K> = key.iter().map(k).collect();
        let matches: Vec<&Vec<Value>> = self
            .oracle
            .rows
            .iter()
            .filter(|r| self.schema.key_of(r)[..want.len()] == want[..])
            .collect();
        match got {
            None => assert!(
                matches.is_empty(),
                "get {key:?}: None, oracle has {matches:?}\nlog: {:#?}",
                self.log
            ),
            Some(row) => {
                assert!(
                    matches.contains(&&row),
                    "get {key:?}: {row:?}, oracle has {matches:?}\nlog: {:#?}",
                    self.log
                );
                let lowest = matches.iter().map(|r| self.schema.key_of(r)).min().unwrap();
                assert_eq!(
                    self.schema.key_of(&row),
                    lowest,
                    "get {key:?}: not the first"
                );
            }
        }
    }

    fn bound(&mut self) -> (Bound<Vec<Value>>, Bound<Vec<K>>) {
        if self.schema.key.is_empty() || self.rng.random_bool(0.2) {
            return (Bound::Unbounded, Bound::Unbounded);
        }
        let key = self.lookup_key();
        let ks: Vec<K> = key.iter().map(k).collect();
        if self.rng.random_bool(0.5) {
            (Bound::Included(key), Bound::Included(ks))
        } else {
            (Bound::Excluded(key), Bound::Excluded(ks))
        }
    }

    fn range_scan(&mut self) {
        let (lower, lower_k) = self.bound();
        let (upper, upper_k) = self.bound();
        let direction = if self.rng.random_bool(0.5) {
            Direction::Forward
        } else {
            Direction::Backward
        };
        let range = KeyRange { lower, upper };
        let actual = read(&self.table, &self.session, &range, direction);
        let expected: Vec<Vec<Value>> = self
            .oracle
            .sorted(&self.schema)
            .into_iter()
            .filter(|r| in_range(&self.schema.key_of(r), &lower_k, &upper_k))
            .collect();
        same_rows(
            &self.schema,
            &format!("scan {range:?} {direction:?}\nlog: {:#?}", self.log),
            &actual,
            &expected,
            direction,
        );
    }

    fn index_seek(&mut self) {
        // The clustered index can be sought by name too.
        let n = self.rng.random_range(0..=self.schema.ncs.len());
        let nc = match self.schema.ncs.get(n) {
            // A concurrent run seeks only by a column of values of its own.
            Some(nc) if !self.may_search_prefix(&nc.cols) => return,
            Some(nc) => nc.clone(),
            None if self.schema.key.is_empty() => return,
            None => Nc {
                name: "PK_T".into(),
                cols: self.schema.key.clone(),
                unique: self.schema.unique_clustered,
            },
        };
        let row = self.pick_existing_or_new();
        let mut key: Vec<Value> = nc.cols.iter().map(|c| row[*c].clone()).collect();
        if key.len() > 1 && self.may_search_prefix(&nc.cols) && self.rng.random_bool(0.3) {
            key.truncate(1);
        }
        let want: Vec<K> = key.iter().map(k).collect();
        let mut actual = self
            .table
            .get_by_index(&self.session, &nc.name, &key)
            .unwrap();
        let mut expected: Vec<Vec<Value>> = self
            .oracle
            .rows
            .iter()
            .filter(|r| {
                nc.cols[..want.len()]
                    .iter()
                    .map(|c| k(&r[*c]))
                    .collect::<Vec<_>>()
                    == want
            })
            .cloned()
            .collect();
        actual.sort_by_key(|r| row_text(r));
        expected.sort_by_key(|r| row_text(r));
        assert_eq!(
            actual, expected,
            "get_by_index {} {key:?}\nlog: {:#?}",
            nc.name, self.log
        );
    }

    fn transaction(&mut self) {
        match &self.committed {
            None => {
                self.doomed = self.rng.random_bool(0.5);
                self.delayed = self.history.is_some() && self.rng.random_bool(0.3);
                self.log.push(format!(
                    "begin (doomed: {}, delayed: {})",
                    self.doomed, self.delayed
                ));
                if self.delayed {
                    self.session
                        .begin_with(lastpage_engine::Durability::Delayed)
                        .unwrap();
                } else {
                    self.session.begin().unwrap();
                }
                self.committed = Some(self.oracle.clone());
            }
            Some(_) => {
                if !self.doomed {
                    // A pipelined commit whose ticket is not waited for is not acknowledged
                    // as durable either.
                    let pipelined = self.history.is_some() && self.rng.random_bool(0.3);
                    let wait = self.rng.random_bool(0.5);
                    self.log
                        .push(format!("commit (pipelined: {pipelined}, wait: {wait})"));
                    if pipelined {
                        let ticket = self.session.commit_pipelined().unwrap();
                        if wait {
                            ticket.wait().unwrap();
                        }
                        self.last_commit_delayed = !wait || self.delayed;
                    } else {
                        self.session.commit().unwrap();
                        self.last_commit_delayed = self.delayed;
                    }
                } else {
                    self.log.push("rollback".into());
                    self.session.rollback().unwrap();
                    self.oracle = self.committed.clone().unwrap();
                }
                self.committed = None;
                self.doomed = false;
            }
        }
    }

    fn switch_path(&mut self) {
        let mut names = vec!["PK_T".to_owned()];
        if self.schema.key.is_empty() {
            names.clear();
        }
        names.extend(self.schema.ncs.iter().map(|n| n.name.clone()));
        if names.is_empty() || self.committed.is_some() {
            return;
        }
        let name = names[self.rng.random_range(0..names.len())].clone();
        let path = if self.rng.random_bool(0.5) {
            InsertPath::Classic
        } else {
            InsertPath::Default
        };
        let ofsk = self.rng.random_bool(0.3);
        self.log.push(format!("path {name} {path:?} ofsk {ofsk}"));
        // An index change is logged and flushed: everything before it is durable.
        self.all_durable();
        self.table
            .set_insert_path(&self.session, &name, path)
            .unwrap();
        self.table
            .set_optimize_for_sequential_key(&self.session, &name, ofsk)
            .unwrap();
    }

    fn check_all(&mut self) {
        self.check_unique();
        let direction = if self.rng.random_bool(0.5) {
            Direction::Forward
        } else {
            Direction::Backward
        };
        let actual = read(&self.table, &self.session, &KeyRange::all(), direction);
        same_rows(
            &self.schema,
            &format!("full scan {direction:?}\nlog: {:#?}", self.log),
            &actual,
            &self.oracle.sorted(&self.schema),
            direction,
        );
        if self.committed.is_none() {
            assert_eq!(
                self.table.row_count(),
                self.oracle.rows.len() as u64,
                "row_count\nlog: {:#?}",
                self.log
            );
        }
    }
}

fn run_case(rng: &mut StdRng, db: &Database, steps: usize) -> (Schema, Oracle, Vec<String>) {
    let schema = Schema::random(rng, false);
    let table = db.create_table(schema.def()).unwrap();
    let session = db.session();
    let mut run = Run::new(rng, format!("{schema:?}"), schema, table, session);
    for _ in 0..steps {
        run.step();
    }
    if run.committed.is_some() {
        run.session.rollback().unwrap();
        run.oracle = run.committed.take().unwrap();
        run.check_all();
    }
    run.table.check_integrity().unwrap();
    (run.schema, run.oracle, run.log)
}

#[test]
fn statements_match_an_oracle_in_memory() {
    let (seed, mut rng) = seeded_rng();
    for case in 0..cases(60) {
        println!("seed {seed} case {case}");
        let db = Database::create(DatabaseOptions::default()).unwrap();
        run_case(&mut rng, &db, 150);
        db.check_integrity().unwrap();
    }
}

#[test]
fn statements_match_an_oracle_after_a_crash() {
    let (seed, mut rng) = seeded_rng();
    for case in 0..cases(12) {
        println!("seed {seed} case {case}");
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed.wrapping_add(case as u64)));
        let db = Database::open(DIR, options(&fs)).unwrap();
        let steps = rng.random_range(1..120);
        let checkpoint = rng.random_bool(0.3);
        let schema = Schema::random(&mut rng, true);
        // A table that is not logged comes back empty after a crash.
        let logged = rng.random_bool(0.8);
        let def = if logged {
            schema.def()
        } else {
            schema.def().not_logged()
        };
        let table = db.create_table(def).unwrap();
        let session = db.session();
        let mut run = Run {
            history: Some((vec![Vec::new()], 0)),
            ..Run::new(&mut rng, format!("{schema:?}"), schema, table, session)
        };
        for step in 0..steps {
            run.step();
            // Checkpoints at random points, inside a transaction too (its changes are then in
            // the image, and recovery must take them out again if it never commits).
            if (checkpoint && step == steps / 2) || run.rng.random_bool(0.03) {
                db.checkpoint().unwrap();
                run.all_durable();
            }
        }
        // What may be found: a committed state no older than the last one made durable (every
        // statement committed FULL, and those before it), or nothing for a table not logged.
        let (states, durable_from) = run.history.take().unwrap();
        let allowed: Vec<Vec<String>> = if logged {
            states[durable_from..].to_vec()
        } else {
            vec![Vec::new()]
        };
        let in_transaction = run.committed.is_some();
        let schema = run.schema.clone();
        let log = std::mem::take(&mut run.log);
        let last_identity = run.last_identity;
        let mode = CRASH_MODES[run.rng.random_range(0..3)];
        let Run { table, session, .. } = run;
        let after = if in_transaction {
            crash(&fs, mode, db, table, session)
        } else {
            crash(&fs, mode, db, (table, session), ())
        };
        let db = Database::open(DIR, options(&after)).unwrap();
        let table = db.table("T").unwrap();
        let session = db.session();
        let actual = read(&table, &session, &KeyRange::all(), Direction::Forward);
        let found = Oracle {
            rows: actual.clone(),
        };
        same_rows(
            &schema,
            "after the crash",
            &actual,
            &found.sorted(&schema),
            Direction::Forward,
        );
        assert!(
            allowed.contains(&state_of(&found)),
            "after the crash ({mode:?}): {actual:?} is none of the states that may survive \
             ({} of them, the last {:?})\nlog: {log:#?}",
            allowed.len(),
            allowed.last()
        );
        db.check_integrity().unwrap();
        // Identity values are not handed out again.
        if let (Some(last), Some(_), true) = (last_identity, schema.identity, logged) {
            let mut row = InsertRow::new();
            for c in schema.supplied() {
                let v: Value = match schema.cols[c] {
                    Col::K1 => Value::Int(1000),
                    Col::K2 => Value::String("zz".into()),
                    Col::C | Col::A => Value::Int(1000),
                    Col::B => Value::String("zzz".into()),
                    Col::Id | Col::P | Col::H => Value::Null,
                };
                row = row.set(c, v);
            }
            let next = table.insert(&session, row).unwrap().unwrap();
            let beyond = if schema.identity_step.1 > 0 {
                next > last
            } else {
                next < last
            };
            assert!(beyond, "identity {next} after {last} before the crash");
        }
        // Further statements on the reopened table still match.
        let mut run = Run {
            oracle: Oracle {
                rows: read(
                    &db.table("T").unwrap(),
                    &db.session(),
                    &KeyRange::all(),
                    Direction::Forward,
                ),
            },
            ..Run::new(
                &mut rng,
                format!("reopened {schema:?}"),
                schema.clone(),
                table,
                session,
            )
        };
        for _ in 0..30 {
            run.step();
        }
        drop(run);
        db.check_integrity().unwrap();
        db.close().unwrap();
    }
}

/// Several threads run the mix on one table at once, each on rows of its own (see
/// `Run::thread`), in memory and durable; each thread's statements must match its oracle
/// throughout, and the table must hold the union of their rows at the end.
#[test]
fn statements_match_an_oracle_while_other_threads_write() {
    let (seed, mut rng) = seeded_rng();
    for case in 0..cases(30) {
        println!("seed {seed} case {case}");
        let durable = case % 2 == 1;
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed.wrapping_add(case as u64)));
        let db = if durable {
            Database::open(DIR, options(&fs)).unwrap()
        } else {
            Database::create(DatabaseOptions {
                lock_timeout: Some(std::time::Duration::from_secs(20)),
                ..DatabaseOptions::default()
            })
            .unwrap()
        };
        // Heaps are left out: a heap's rows are found by position, not by a key of their own.
        let schema = loop {
            let schema = Schema::random(&mut rng, durable);
            if !schema.key.is_empty() {
                break schema;
            }
        };
        let table = db.create_table(schema.def()).unwrap();
        // Rows nobody changes while the threads run (thread 9's, which no thread can name):
        // every scan must return them all.
        let permanent = {
            let mut run = Run {
                thread: Some(9),
                ..Run::new(
                    &mut rng,
                    format!("permanent rows: {schema:?}"),
                    schema.clone(),
                    Arc::clone(&table),
                    db.session(),
                )
            };
            for _ in 0..8 {
                run.insert_many();
            }
            run.oracle
        };
        let permanent_keys: Vec<Vec<K>> = permanent.rows.iter().map(|r| schema.key_of(r)).collect();
        let seeds: Vec<u64> = (0..3).map(|_| rng.random()).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        let oracles: Vec<Oracle> = std::thread::scope(|scope| {
            // A reader: READ COMMITTED never shows a row that is never committed (C = DOOMED),
            // and a scan returns keys in order.
            let reader = scope.spawn(|| {
                let session = db.session();
                let c = schema.pos(Col::C).unwrap();
                let mut scans = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for direction in [Direction::Forward, Direction::Backward] {
                        let rows = read(&table, &session, &KeyRange::all(), direction);
                        for row in &rows {
                            assert_ne!(
                                row[c],
                                Value::Int(DOOMED),
                                "read an uncommitted row {row:?}"
                            );
                        }
                        let keys: Vec<Vec<K>> = rows.iter().map(|r| schema.key_of(r)).collect();
                        for key in &permanent_keys {
                            assert!(
                                keys.contains(key),
                                "{direction:?} scan missed the row {key:?}"
                            );
                        }
                        for pair in keys.windows(2) {
                            let ordered = match direction {
                                Direction::Forward => pair[0] <= pair[1],
                                Direction::Backward => pair[0] >= pair[1],
                            };
                            assert!(
                                ordered,
                                "{direction:?} scan: {:?} then {:?}",
                                pair[0], pair[1]
                            );
                        }
                        scans += 1;
                    }
                    for nc in &schema.ncs {
                        let rows = table.get_by_index(&session, &nc.name, &[]).unwrap();
                        for row in &rows {
                            assert_ne!(
                                row[c],
                                Value::Int(DOOMED),
                                "index {} read {row:?}",
                                nc.name
                            );
                        }
                        for row in &permanent.rows {
                            assert!(rows.contains(row), "index {} missed {row:?}", nc.name);
                        }
                    }
                    for row in &permanent.rows {
                        // The first of the rows with its key (a non-unique key can have more).
                        let got = table.get(&session, &schema.key_values(row)).unwrap();
                        assert!(
                            got.as_ref().is_some_and(|got| permanent.rows.contains(got)
                                && schema.key_of(got) == schema.key_of(row)),
                            "get of {row:?}, a row nobody changes: {got:?}"
                        );
                    }
                }
                scans
            });
            let workers: Vec<_> = seeds
                .iter()
                .enumerate()
                .map(|(t, &thread_seed)| {
                    let (db, table, schema) = (&db, &table, &schema);
                    scope.spawn(move || {
                        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(thread_seed);
                        let mut run = Run {
                            thread: Some(t as i64),
                            ..Run::new(
                                &mut rng,
                                format!("thread {t}: {schema:?}"),
                                schema.clone(),
                                Arc::clone(table),
                                db.session(),
                            )
                        };
                        for _ in 0..400 {
                            run.step();
                        }
                        if run.committed.is_some() {
                            run.session.rollback().unwrap();
                            run.oracle = run.committed.take().unwrap();
                        }
                        run.oracle
                    })
                })
                .collect();
            // The reader stops once the writers have, even if one of them failed.
            let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let oracles = results.into_iter().map(Result::unwrap).collect();
            println!("{} scans", reader.join().unwrap());
            oracles
        });
        let all = Oracle {
            rows: oracles
                .into_iter()
                .flat_map(|o| o.rows)
                .chain(permanent.rows)
                .collect(),
        };
        let session = db.session();
        let actual = read(&table, &session, &KeyRange::all(), Direction::Forward);
        same_rows(
            &schema,
            "after the threads",
            &actual,
            &all.sorted(&schema),
            Direction::Forward,
        );
        db.check_integrity().unwrap();
    }
}
