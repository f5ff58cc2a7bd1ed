//! A delete-heavy, randomized, model-based hunt over the paths that remove index entries, now
//! that a delete that empties a leaf frees it (`btree/reclaim.rs`) and inner pages left without
//! a child go too.
//!
//! Five tables of different shapes live in one database: clustered on an identity, on an
//! explicit INT key, hash-partitioned on a stored computed `ABS(K % 3)` leading the key, on a
//! non-unique key (hidden uniquifiers), and a heap. Each has a unique nonclustered index (on
//! `U`, with the partitioning column in the partitioned table) and a non-unique one (on `V`);
//! one of them, chosen per case, is not logged. A single writer session runs a random mix of
//! single-row and batch inserts (some with duplicates, which must fail and leave nothing),
//! range-emptying deletes (hundreds of neighbouring rows, so that leaves empty and are freed),
//! updates that move rows (key changes, across partitions too) and change nonclustered keys,
//! and explicit transactions that commit or roll back (the rollback re-inserts into trees whose
//! leaves were freed and takes back inserts by deleting again).
//!
//! Variants: writers side by side on the same tables (each on rows of its own), in memory,
//! durable with checkpoints, clean closes and crashes (`common::crash`),
//! with READ COMMITTED readers scanning every table while the writer works (a reader must never
//! see a row of a transaction that rolls back, whose `V` is negative, nor a torn row, whose
//! payload does not spell its `U` and `V`, and every scan must return rows in key order with no
//! row twice), and at a page limit (`DatabaseOptions::max_pages`), where a statement may fail
//! with `PoolFull` and must leave nothing, and where deleting most of a table must let rows in
//! again. Now and then a table is dropped while the writer's transaction holds it with deletes
//! of its own, and created again.
//!
//! The oracle: the exact rows of each table after every step and every reopen;
//! `common::assert_every_page_owned` after every reopen and at the end of every run (and so
//! the integrity check); identity values never handed out twice (a table that is not logged
//! may hand out again, after a crash, those handed out since its last checkpoint).
//!
//! Each test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`, and scale the number of
//! cases with `LASTPAGE_TEST_CASES`.

mod common;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, EngineError, Expr, IndexDef,
    IndexOptions, InsertPath, InsertRow, KeyRange, LatchPolicy, Session, Table, TableDef,
    Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The longest payload, and the range explicit keys are drawn from.
const MAX_PAYLOAD: usize = 360;
/// Now and then a row about a page long: a leaf of its own, and on the default insert path a
/// page filled before the tail gate.
const MAX_PAGE_SIZED_PAYLOAD: usize = 7000;
const KEY_SPACE: i32 = 4000;
/// Keys of the non-unique clustered index: few, so that many rows share one.
const NON_UNIQUE_KEYS: i32 = 150;
/// Writers side by side own `U` values from `owner * U_STRIDE` on.
const U_STRIDE: i32 = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `Id BIGINT IDENTITY PRIMARY KEY, U, V, P`.
    Ident,
    /// `K INT PRIMARY KEY, U, V, P`.
    Explicit,
    /// `K INT, H AS ABS(K % 3) PERSISTED, U, V, P`, primary key (H, K), partitioned on H.
    Hashed,
    /// `K INT, U, V, P`, a non-unique clustered index on K.
    NonUnique,
    /// `U, V, P`, no clustered index.
    Heap,
}

const KINDS: [Kind; 5] = [
    Kind::Ident,
    Kind::Explicit,
    Kind::Hashed,
    Kind::NonUnique,
    Kind::Heap,
];

fn h_of(k: i32) -> i32 {
    (k % 3).abs()
}

#[derive(Clone, Debug)]
struct Spec {
    kind: Kind,
    name: &'static str,
    logged: bool,
    /// Every index's options: either latch flavour, either insert path, flow control or not.
    options: IndexOptions,
}

impl Spec {
    /// Position of `U` (then `V`, then `P`).
    fn u(&self) -> usize {
        match self.kind {
            Kind::Heap => 0,
            Kind::Hashed => 2,
            _ => 1,
        }
    }
    fn v(&self) -> usize {
        self.u() + 1
    }
    fn p(&self) -> usize {
        self.u() + 2
    }

    /// Whether the test chooses `K` (column 0).
    fn explicit_key(&self) -> bool {
        matches!(self.kind, Kind::Explicit | Kind::Hashed | Kind::NonUnique)
    }

    fn def(&self) -> TableDef {
        let u = ColumnDef::new("U", DataType::Int).not_null();
        let v = ColumnDef::new("V", DataType::Int).not_null();
        let p = ColumnDef::new("P", DataType::VarChar(MAX_PAGE_SIZED_PAYLOAD as u16)).not_null();
        let k = ColumnDef::new("K", DataType::Int).not_null();
        let mut def = TableDef::new(self.name);
        let mut unique_columns = vec!["U"];
        match self.kind {
            Kind::Ident => {
                def = def
                    .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                    .column(u)
                    .column(v)
                    .column(p)
                    .clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey));
            }
            Kind::Explicit => {
                def = def
                    .column(k)
                    .column(u)
                    .column(v)
                    .column(p)
                    .clustered(IndexDef::new("PK", &["K"], Uniqueness::PrimaryKey));
            }
            Kind::Hashed => {
                def = def
                    .column(k)
                    .column(
                        ColumnDef::new("H", DataType::Int)
                            .not_null()
                            .computed_expression(Expr::column("K").modulo(3).abs()),
                    )
                    .column(u)
                    .column(v)
                    .column(p)
                    .clustered(IndexDef::new("PK", &["H", "K"], Uniqueness::PrimaryKey))
                    .partitioned("H", 3);
                unique_columns.push("H");
            }
            Kind::NonUnique => {
                def = def
                    .column(k)
                    .column(u)
                    .column(v)
                    .column(p)
                    .clustered(IndexDef::new("CX", &["K"], Uniqueness::NonUnique));
            }
            Kind::Heap => {
                def = def.column(u).column(v).column(p);
            }
        }
        def = def
            .nonclustered(IndexDef::new(
                "UX_U",
                &unique_columns,
                Uniqueness::UniqueIndex,
            ))
            .nonclustered(IndexDef::new("IX_V", &["V"], Uniqueness::NonUnique));
        if let Some(clustered) = def.clustered.take() {
            def.clustered = Some(clustered.with_options(self.options));
        }
        for index in &mut def.nonclustered {
            index.options = self.options;
        }
        if !self.logged {
            def = def.not_logged();
        }
        def
    }

    /// A full row (an identity table's `Id` is filled in once the insert returns it).
    fn row(&self, k: i32, u: i32, v: i32, payload_len: usize) -> Vec<Value> {
        let p = Value::String(payload(u, v, payload_len));
        match self.kind {
            Kind::Ident => vec![Value::BigInt(0), Value::Int(u), Value::Int(v), p],
            Kind::Explicit | Kind::NonUnique => {
                vec![Value::Int(k), Value::Int(u), Value::Int(v), p]
            }
            Kind::Hashed => vec![
                Value::Int(k),
                Value::Int(h_of(k)),
                Value::Int(u),
                Value::Int(v),
                p,
            ],
            Kind::Heap => vec![Value::Int(u), Value::Int(v), p],
        }
    }

    fn insert_row(&self, row: &[Value]) -> InsertRow {
        let mut insert = InsertRow::new();
        if matches!(self.kind, Kind::Explicit | Kind::Hashed | Kind::NonUnique) {
            insert = insert.set(0, row[0].clone());
        }
        for column in [self.u(), self.v(), self.p()] {
            insert = insert.set(column, row[column].clone());
        }
        insert
    }

    /// The oracle's key of a row: `(U, H)` is unique in every shape (`H` is 0 outside the
    /// partitioned table).
    fn oracle_key(&self, row: &[Value]) -> (i32, i32) {
        let h = if self.kind == Kind::Hashed {
            int(&row[1])
        } else {
            0
        };
        (int(&row[self.u()]), h)
    }

    /// The clustered key a statement names the row by (a heap's is empty: the first row).
    fn key_values(&self, row: &[Value]) -> Vec<Value> {
        match self.kind {
            Kind::Ident | Kind::Explicit | Kind::NonUnique => vec![row[0].clone()],
            Kind::Hashed => vec![row[1].clone(), row[0].clone()],
            Kind::Heap => Vec::new(),
        }
    }

    /// The row's place in clustered key order (none for a heap).
    fn order(&self, row: &[Value]) -> Option<(i64, i64)> {
        match self.kind {
            Kind::Ident => Some((0, big(&row[0]))),
            Kind::Explicit | Kind::NonUnique => Some((0, i64::from(int(&row[0])))),
            Kind::Hashed => Some((i64::from(int(&row[1])), i64::from(int(&row[0])))),
            Kind::Heap => None,
        }
    }
}

fn int(value: &Value) -> i32 {
    match value {
        Value::Int(v) => *v,
        other => panic!("not an INT: {other:?}"),
    }
}

fn big(value: &Value) -> i64 {
    match value {
        Value::BigInt(v) => *v,
        other => panic!("not a BIGINT: {other:?}"),
    }
}

/// A payload that spells its row's `U` and `V`, so that a torn row shows.
fn payload(u: i32, v: i32, len: usize) -> String {
    let mut text = format!("{u}/{v}/");
    while text.len() < len {
        text.push('#');
    }
    text
}

/// Checks rows as a scan returned them: key order (strict for a unique key), no row twice, no
/// torn row, and, if `committed_only`, no row of a transaction that rolls back (negative `V`).
fn check_scan(
    spec: &Spec,
    rows: &[Vec<Value>],
    direction: Direction,
    committed_only: bool,
) -> Result<(), String> {
    let mut seen = BTreeMap::new();
    let mut previous: Option<(i64, i64)> = None;
    for row in rows {
        let expected_len = match spec.kind {
            Kind::Hashed => 5,
            Kind::Heap => 3,
            _ => 4,
        };
        if row.len() != expected_len {
            return Err(format!(
                "{}: a row of {} values: {row:?}",
                spec.name,
                row.len()
            ));
        }
        let (u, v) = (int(&row[spec.u()]), int(&row[spec.v()]));
        let Value::String(p) = &row[spec.p()] else {
            return Err(format!("{}: payload {:?}", spec.name, row[spec.p()]));
        };
        let prefix = format!("{u}/{v}/");
        if !p.starts_with(&prefix) || p[prefix.len()..].bytes().any(|b| b != b'#') {
            return Err(format!("{}: a torn row: {row:?}", spec.name));
        }
        if committed_only && v < 0 {
            return Err(format!(
                "{}: a row of a transaction that rolls back: {row:?}",
                spec.name
            ));
        }
        if spec.kind == Kind::Hashed && int(&row[1]) != h_of(int(&row[0])) {
            return Err(format!("{}: H is not ABS(K % 3): {row:?}", spec.name));
        }
        // A row that a committed update moved ahead of the scan may come back under its new
        // key, as SQL Server's READ COMMITTED scans may return it (docs/locking.md); under
        // the same key it is a row returned twice.
        let k = spec.explicit_key().then(|| int(&row[0]));
        if let Some(before) = seen.insert(spec.oracle_key(row), k)
            && before == k
        {
            return Err(format!("{}: a row twice: {row:?}", spec.name));
        }
        if let (Some(order), Some(before)) = (spec.order(row), previous) {
            let in_order = match (direction, spec.kind) {
                (Direction::Forward, Kind::NonUnique) => before <= order,
                (Direction::Forward, _) => before < order,
                (Direction::Backward, Kind::NonUnique) => before >= order,
                (Direction::Backward, _) => before > order,
            };
            if !in_order {
                return Err(format!(
                    "{}: out of order ({direction:?}): {before:?} then {row:?}",
                    spec.name
                ));
            }
        }
        previous = spec.order(row);
    }
    Ok(())
}

type Rows = BTreeMap<(i32, i32), Vec<Value>>;

/// One table as the oracle sees it.
struct Model {
    spec: Spec,
    rows: Rows,
    /// The highest identity value handed out (an identity table's).
    max_id: i64,
    /// `max_id` at the last checkpoint (a clean close is one), for a table that is not logged.
    max_id_at_checkpoint: i64,
}

fn is_duplicate(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::DuplicateKey { .. } | EngineError::DuplicateIndexKey { .. }
    )
}

fn is_pool_full(error: &EngineError) -> bool {
    matches!(error, EngineError::PoolFull(_))
}

/// A case's settings.
#[derive(Clone, Copy, Debug)]
struct Settings {
    /// A page limit, if any.
    max_pages: Option<usize>,
    /// READ COMMITTED readers while the writer works.
    readers: bool,
}

/// The writer: the database, its session, the tables and the oracle.
struct Writer {
    rng: StdRng,
    db: Database,
    session: Session,
    tables: Vec<Arc<Table>>,
    models: Vec<Model>,
    /// The rows at the start of the open explicit transaction, if one is open.
    snapshot: Option<Vec<Rows>>,
    /// Whether the open transaction will roll back (its rows are marked by a negative `V`).
    doomed: bool,
    next_u: i32,
    /// This writer's number and the number of writers side by side (each owns its rows: the
    /// keys of its class modulo `owners` and its range of `U`).
    owner: u32,
    owners: u32,
    /// Whether readers hold the tables' handles (no table is dropped then).
    readers_active: bool,
    /// Whether the mix favours inserts (else deletes).
    growing: bool,
    limited: bool,
    /// Statements that failed with `PoolFull`.
    full: u64,
    /// Times deleting most of a full table let a row in again.
    refilled: u64,
    log: Vec<String>,
}

impl Writer {
    fn note(&mut self, entry: String) {
        if self.log.len() > 60 {
            self.log.drain(..30);
        }
        self.log.push(entry);
    }

    fn fail(&self, what: &str) -> ! {
        panic!("{what}\nrecent steps:\n{}", self.log.join("\n"))
    }

    /// What a failed or successful statement must be: `Ok` as expected, a duplicate if
    /// expected, `PoolFull` at a page limit. Returns the value of a success.
    fn outcome<T: std::fmt::Debug>(
        &mut self,
        result: Result<T, EngineError>,
        duplicate: bool,
        what: &str,
    ) -> Option<T> {
        match result {
            Ok(value) if !duplicate => Some(value),
            Err(error) if duplicate && is_duplicate(&error) => None,
            // Side by side, a deadlock with another writer fails a statement now and then.
            Err(EngineError::Lock(_)) if self.owners > 1 => None,
            Err(error) if self.limited && is_pool_full(&error) => {
                self.full += 1;
                None
            }
            other => self.fail(&format!(
                "{what}: got {other:?}, expected {}",
                if duplicate { "a duplicate" } else { "success" }
            )),
        }
    }

    /// A `U` nobody has had: writers side by side own ranges of them.
    fn fresh_u(&mut self) -> i32 {
        self.next_u += 1;
        self.owner as i32 * U_STRIDE + self.next_u
    }

    /// Whether `row` is one of this writer's.
    fn owns(&self, spec: &Spec, row: &[Value]) -> bool {
        int(&row[spec.u()]).div_euclid(U_STRIDE) == self.owner as i32
    }

    /// A `V`: negative in a transaction that rolls back.
    fn v(&mut self) -> i32 {
        let v = self.rng.random_range(0..1000);
        if self.doomed { -1 - v } else { v }
    }

    fn payload_len(&mut self) -> usize {
        if self.rng.random_bool(0.02) {
            self.rng.random_range(2500..=MAX_PAGE_SIZED_PAYLOAD)
        } else if self.rng.random_bool(0.2) {
            self.rng.random_range(0..=40)
        } else {
            self.rng.random_range(100..=MAX_PAYLOAD)
        }
    }

    fn random_k(&mut self, t: usize) -> i32 {
        // Writers side by side own the keys of their class modulo their number.
        let (owner, owners) = (self.owner as i32, self.owners as i32);
        let space = match self.models[t].spec.kind {
            Kind::NonUnique => NON_UNIQUE_KEYS,
            _ => KEY_SPACE,
        };
        owner + owners * self.rng.random_range(0..space / owners)
    }

    /// Whether `row` (with `ignore` left out of the table, a row being replaced) would
    /// duplicate a unique key of the table's rows or of `also` (earlier rows of its batch).
    fn duplicates(
        &self,
        t: usize,
        row: &[Value],
        ignore: Option<(i32, i32)>,
        also: &[Vec<Value>],
    ) -> bool {
        let spec = &self.models[t].spec;
        let key = spec.oracle_key(row);
        let clashes = |other: &Vec<Value>| {
            spec.oracle_key(other) == key
                || (matches!(spec.kind, Kind::Explicit | Kind::Hashed)
                    && int(&other[0]) == int(&row[0]))
        };
        self.models[t]
            .rows
            .iter()
            .filter(|(k, _)| Some(**k) != ignore)
            .any(|(_, other)| clashes(other))
            || also.iter().any(clashes)
    }

    /// A new row for table `t`; with probability `clash` one whose unique keys clash with a
    /// row there (else none clashes with those rows or with `also`, the batch so far).
    fn new_row(&mut self, t: usize, clash: f64, also: &[Vec<Value>]) -> Vec<Value> {
        let spec = self.models[t].spec.clone();
        let clash = self.rng.random_bool(clash) && !self.models[t].rows.is_empty();
        let existing = if clash {
            let index = self.rng.random_range(0..self.models[t].rows.len());
            self.models[t].rows.values().nth(index).cloned()
        } else {
            None
        };
        let mut k = self.random_k(t);
        if matches!(spec.kind, Kind::Explicit | Kind::Hashed) {
            if let Some(existing) = &existing
                && self.rng.random_bool(0.5)
            {
                k = int(&existing[0]);
            } else {
                let taken: std::collections::HashSet<i32> = self.models[t]
                    .rows
                    .values()
                    .chain(also)
                    .map(|row| int(&row[0]))
                    .collect();
                for _ in 0..20 {
                    if !taken.contains(&k) {
                        break;
                    }
                    k = self.random_k(t);
                }
            }
        }
        let u = match &existing {
            Some(existing) => int(&existing[spec.u()]),
            None => self.fresh_u(),
        };
        let v = self.v();
        let len = self.payload_len();
        spec.row(k, u, v, len)
    }

    /// Records rows an insert put in, checking the identity values it handed out.
    fn inserted(&mut self, t: usize, mut rows: Vec<Vec<Value>>, ids: Vec<Option<i64>>) {
        let model = &mut self.models[t];
        for (row, id) in rows.iter_mut().zip(ids) {
            if model.spec.kind == Kind::Ident {
                let id = id.expect("an identity value");
                // Side by side, sequence lanes hand out values in blocks, not in order.
                if id <= model.max_id && self.owners == 1 {
                    let max = model.max_id;
                    self.fail(&format!(
                        "{}: identity value {id} handed out again (up to {max} were)",
                        self.models[t].spec.name
                    ));
                }
                model.max_id = model.max_id.max(id);
                row[0] = Value::BigInt(id);
            }
            let key = model.spec.oracle_key(row);
            assert!(model.rows.insert(key, row.clone()).is_none());
        }
    }

    fn insert_one(&mut self, t: usize) {
        let row = self.new_row(t, 0.05, &[]);
        let duplicate = self.duplicates(t, &row, None, &[]);
        let name = self.models[t].spec.name;
        self.note(format!("{name}: insert {:?}", &row[..row.len() - 1]));
        let insert = self.models[t].spec.insert_row(&row);
        let result = self.tables[t].insert(&self.session, insert);
        if let Some(id) = self.outcome(result, duplicate, "insert") {
            self.inserted(t, vec![row], vec![id]);
        }
    }

    fn insert_batch(&mut self, t: usize) {
        let most = if self.rng.random_bool(0.3) { 300 } else { 40 };
        let count = self.rng.random_range(2..=most);
        let mut rows: Vec<Vec<Value>> = Vec::new();
        let mut duplicate = false;
        for _ in 0..count {
            let row = self.new_row(t, 0.1 / count as f64, &rows);
            duplicate |= self.duplicates(t, &row, None, &rows);
            rows.push(row);
        }
        if !duplicate && self.rng.random_bool(0.05) {
            // The last row repeats the first one's unique key: the whole batch goes back.
            let first = rows[0].clone();
            rows.push(first);
            duplicate = true;
        }
        let name = self.models[t].spec.name;
        self.note(format!(
            "{name}: batch of {} (duplicate {duplicate})",
            rows.len()
        ));
        let inserts = rows
            .iter()
            .map(|row| self.models[t].spec.insert_row(row))
            .collect();
        let result = self.tables[t].insert_batch(&self.session, inserts);
        if let Some(ids) = self.outcome(result, duplicate, "batch") {
            self.inserted(t, rows, ids);
        }
    }

    /// The rows of table `t` in clustered key order (a heap's in the order a scan returns
    /// them), with the oracle's keys.
    fn ordered(&self, t: usize) -> Vec<(i32, i32)> {
        let spec = &self.models[t].spec;
        if spec.kind == Kind::Heap {
            return common::rows(&self.tables[t], &self.session)
                .iter()
                .map(|row| spec.oracle_key(row))
                .collect();
        }
        let mut rows: Vec<(&(i32, i32), &Vec<Value>)> = self.models[t].rows.iter().collect();
        rows.sort_by_key(|(_, row)| spec.order(row));
        rows.into_iter().map(|(key, _)| *key).collect()
    }

    /// A run of neighbouring rows: `(start, len)` into `ordered`.
    fn run_of(&mut self, len: usize, most: usize) -> (usize, usize) {
        if len == 0 {
            return (0, 0);
        }
        let take = self.rng.random_range(1..=len.min(most));
        let start = self.rng.random_range(0..=len - take);
        (start, take)
    }

    /// Deletes a run of neighbouring rows, one statement each; often enough to empty leaves.
    fn delete_range(&mut self, t: usize, most: usize) {
        let spec = self.models[t].spec.clone();
        let ordered = self.ordered(t);
        let (mut start, take) = self.run_of(ordered.len(), most);
        if spec.kind == Kind::Heap {
            // A heap's delete takes the first row: the run starts there.
            start = 0;
        }
        self.note(format!("{}: delete {take} rows from #{start}", spec.name));
        if spec.kind == Kind::NonUnique {
            // Every row of each key in the run, then one more delete that finds none.
            let mut keys: Vec<i32> = ordered[start..start + take]
                .iter()
                .map(|key| int(&self.models[t].rows[key][0]))
                .collect();
            keys.dedup();
            for k in keys {
                let victims: Vec<(i32, i32)> = self.models[t]
                    .rows
                    .iter()
                    .filter(|(_, row)| int(&row[0]) == k)
                    .map(|(key, _)| *key)
                    .collect();
                for _ in &victims {
                    let result = self.tables[t].delete(&self.session, &[Value::Int(k)]);
                    if result != Ok(true) {
                        self.fail(&format!("delete K = {k}: {result:?}"));
                    }
                }
                let result = self.tables[t].delete(&self.session, &[Value::Int(k)]);
                if result != Ok(false) {
                    self.fail(&format!("delete K = {k} once more: {result:?}"));
                }
                for key in victims {
                    self.models[t].rows.remove(&key);
                }
            }
            return;
        }
        let mut last_row = Vec::new();
        for key in &ordered[start..start + take] {
            let key_values = spec.key_values(&self.models[t].rows[key]);
            let result = self.tables[t].delete(&self.session, &key_values);
            if result != Ok(true) {
                self.fail(&format!("delete {key_values:?}: {result:?}"));
            }
            last_row = self.models[t].rows.remove(key).unwrap();
        }
        if spec.kind != Kind::Heap && take > 0 && self.rng.random_bool(0.3) {
            // The last one again: nothing to delete.
            let gone = self.models[t].spec.key_values(&last_row);
            let result = self.tables[t].delete(&self.session, &gone);
            if result != Ok(false) {
                self.fail(&format!("delete {gone:?} again: {result:?}"));
            }
        }
    }

    /// The row a statement naming `key_values` finds: the first with that key (or the first
    /// row of a heap), as the session reads it.
    fn first_match(&self, t: usize, key_values: &[Value]) -> Option<Vec<Value>> {
        let range = if key_values.is_empty() {
            KeyRange::all()
        } else {
            common::prefix(key_values.to_vec())
        };
        self.tables[t]
            .scan(&self.session, &range, Direction::Forward)
            .unwrap()
            .next()
            .map(Result::unwrap)
    }

    /// Updates a run of neighbouring rows: a new `V` (and payload) each, and sometimes a new
    /// `U` or a moved key.
    fn update_range(&mut self, t: usize) {
        let spec = self.models[t].spec.clone();
        let ordered = self.ordered(t);
        let (start, take) = self.run_of(ordered.len(), 60);
        let move_keys = spec.explicit_key() && self.rng.random_bool(0.5);
        let delta = self.owners as i32
            * if self.rng.random_bool(0.5) {
                self.rng.random_range(1..200)
            } else {
                -self.rng.random_range(1..200)
            };
        let change_u = self.rng.random_bool(0.3);
        self.note(format!(
            "{}: update {take} rows from #{start} (move by {delta}: {move_keys}, new U: {change_u})",
            spec.name
        ));
        for target in &ordered[start..start + take] {
            // The row the statement finds: a heap's first row, a non-unique key's first match.
            let (key_values, old) = match spec.kind {
                Kind::Heap => (Vec::new(), self.first_match(t, &[])),
                Kind::NonUnique => {
                    // An earlier update of the run may have changed this one (a first match).
                    let Some(row) = self.models[t].rows.get(target) else {
                        continue;
                    };
                    let key_values = spec.key_values(row);
                    let first = self.first_match(t, &key_values);
                    (key_values, first)
                }
                _ => match self.models[t].rows.get(target) {
                    Some(row) => (spec.key_values(row), Some(row.clone())),
                    None => continue,
                },
            };
            let Some(old) = old else { continue };
            let old_key = spec.oracle_key(&old);
            let mut new = old.clone();
            let mut changes = Vec::new();
            if move_keys {
                let k = int(&old[0]) + delta;
                new[0] = Value::Int(k);
                changes.push((0, Value::Int(k)));
                if spec.kind == Kind::Hashed {
                    new[1] = Value::Int(h_of(k));
                }
            }
            let u = if change_u {
                if self.rng.random_bool(0.1) {
                    let index = self.rng.random_range(0..self.models[t].rows.len());
                    self.models[t].rows.keys().nth(index).unwrap().0
                } else {
                    self.fresh_u()
                }
            } else {
                int(&old[spec.u()])
            };
            let v = self.v();
            let len = self.payload_len();
            new[spec.u()] = Value::Int(u);
            new[spec.v()] = Value::Int(v);
            new[spec.p()] = Value::String(payload(u, v, len));
            if change_u {
                changes.push((spec.u(), Value::Int(u)));
            }
            changes.push((spec.v(), Value::Int(v)));
            changes.push((spec.p(), new[spec.p()].clone()));
            let duplicate = self.duplicates(t, &new, Some(old_key), &[]);
            let result = self.tables[t].update(&self.session, &key_values, &changes);
            if self.outcome(result, duplicate, "update") == Some(true) {
                self.models[t].rows.remove(&old_key);
                let key = spec.oracle_key(&new);
                self.models[t].rows.insert(key, new);
            } else if !duplicate && !self.limited {
                self.fail(&format!("update {key_values:?}: found no row"));
            }
        }
    }

    /// Compares table `t` with the oracle.
    fn verify(&self, t: usize, context: &str) {
        let spec = &self.models[t].spec;
        let rows = match common::try_rows(&self.tables[t], &self.session) {
            Ok(rows) => rows,
            Err(error) => self.fail(&format!("{context}: {error}")),
        };
        if let Err(error) = check_scan(spec, &rows, Direction::Forward, false) {
            self.fail(&format!("{context}: {error}"));
        }
        let got: Rows = rows
            .into_iter()
            .filter(|row| self.owns(spec, row))
            .map(|row| (spec.oracle_key(&row), row))
            .collect();
        let want = &self.models[t].rows;
        if &got != want {
            let missing: Vec<_> = want
                .keys()
                .filter(|k| !got.contains_key(k))
                .take(8)
                .collect();
            let extra: Vec<_> = got
                .keys()
                .filter(|k| !want.contains_key(k))
                .take(8)
                .collect();
            let changed: Vec<_> = want
                .iter()
                .filter(|(k, row)| got.get(k).is_some_and(|g| g != *row))
                .map(|(k, row)| (k, row, &got[k]))
                .take(4)
                .collect();
            self.fail(&format!(
                "{context}: {} has {} rows, the oracle {}; missing {missing:?}, extra {extra:?}, \
                 changed {changed:?}",
                spec.name,
                got.len(),
                want.len()
            ));
        }
    }

    fn verify_all(&self, context: &str) {
        for t in 0..self.tables.len() {
            self.verify(t, context);
            if self.owners > 1 {
                continue;
            }
            // Every index holds one entry per row, and the table counts them.
            let want = self.models[t].rows.len() as u64;
            let count = self.tables[t].row_count();
            let check = match self.tables[t].check_integrity() {
                Ok(check) => check,
                Err(error) => self.fail(&format!("{context}: integrity: {error}")),
            };
            let mut entries: BTreeMap<&str, u64> = BTreeMap::new();
            for (index, tree) in &check.indexes {
                *entries.entry(index.as_str()).or_default() += tree.rows;
            }
            // Spare leaves wait for the next splits of the last leaf: a page or two per tree,
            // not a pile (see the regression test at the end).
            if let Some((index, tree)) =
                check.indexes.iter().find(|(_, tree)| tree.spare_leaves > 2)
            {
                self.fail(&format!(
                    "{context}: {} keeps {} spare leaves in {index}",
                    self.models[t].spec.name, tree.spare_leaves
                ));
            }
            // An empty table keeps only its last leaves (one per partition and index).
            let leaves: u64 = check.indexes.iter().map(|(_, tree)| tree.leaf_pages).sum();
            if want == 0 && leaves != check.indexes.len() as u64 {
                self.fail(&format!(
                    "{context}: {} is empty but keeps {leaves} leaves in {} trees: {:?}",
                    self.models[t].spec.name,
                    check.indexes.len(),
                    check.indexes
                ));
            }
            if count != want || check.rows != want || entries.values().any(|&n| n != want) {
                self.fail(&format!(
                    "{context}: {} holds {want} rows, but counts {count}, its check {} and its \
                     indexes {entries:?}",
                    self.models[t].spec.name, check.rows
                ));
            }
        }
    }

    /// One random statement on a random table (no transaction control).
    fn statement(&mut self) {
        // Writers side by side leave the heap alone: its statements take its first row.
        let tables = self.tables.len() - usize::from(self.owners > 1);
        let t = self.rng.random_range(0..tables);
        // Growing: mostly inserts; shrinking: mostly deletes, often of a whole table.
        let roll = self.rng.random_range(0..100);
        let (inserts, batches, deletes) = if self.growing {
            (20, 70, 82)
        } else {
            (10, 20, 75)
        };
        match roll {
            _ if roll < inserts => self.insert_one(t),
            _ if roll < batches => self.insert_batch(t),
            _ if roll < deletes => {
                let most = match (self.growing, self.rng.random_bool(0.3)) {
                    (false, true) => usize::MAX,
                    (false, false) => 200,
                    (true, _) => 80,
                };
                self.delete_range(t, most)
            }
            _ => self.update_range(t),
        }
        // Side by side, a scan in a transaction could deadlock with another writer's.
        if self.snapshot.is_none() || (self.owners == 1 && self.rng.random_bool(0.3)) {
            self.verify(t, "after a statement");
        }
    }

    fn begin(&mut self) {
        self.doomed = self.rng.random_bool(0.4);
        self.note(format!("begin (rolls back: {})", self.doomed));
        self.session.begin().unwrap();
        self.snapshot = Some(self.models.iter().map(|m| m.rows.clone()).collect());
    }

    fn end(&mut self) {
        self.end_unchecked();
        self.verify_all("after the end of a transaction");
    }

    fn end_unchecked(&mut self) {
        let snapshot = self.snapshot.take().expect("a transaction is open");
        if self.doomed {
            self.note("rollback".into());
            if let Err(error) = self.session.rollback() {
                self.fail(&format!("rollback: {error}"));
            }
            for (model, rows) in self.models.iter_mut().zip(snapshot) {
                model.rows = rows;
            }
        } else {
            self.note("commit".into());
            if let Err(error) = self.session.commit() {
                self.fail(&format!("commit: {error}"));
            }
        }
        self.doomed = false;
    }

    /// Drops table `t` (from another session) while this session's open transaction, if
    /// any, holds it with deletes of its own (whose rollback puts rows back into the dropped
    /// trees, whose leaves the deletes freed), ends that transaction, and creates the table
    /// again: the dropped trees' pages must all come back.
    fn drop_and_recreate(&mut self, t: usize) {
        let spec = self.models[t].spec.clone();
        let in_txn = self.snapshot.is_some();
        if in_txn {
            self.delete_range(t, 300);
        }
        self.note(format!(
            "{}: dropped (in a transaction: {in_txn})",
            spec.name
        ));
        let other = self.db.session();
        if let Err(error) = other.db().drop_table(spec.name) {
            self.fail(&format!("drop {}: {error}", spec.name));
        }
        if in_txn {
            self.end_unchecked();
        }
        let placeholder = Arc::clone(&self.tables[(t + 1) % self.tables.len()]);
        drop(std::mem::replace(&mut self.tables[t], placeholder));
        self.tables[t] = match self.db.create_table(spec.def()) {
            Ok(table) => table,
            // Even at a page limit: the dropped table's pages are free by now (nothing holds
            // it), and the new table needs fewer.
            Err(error) => self.fail(&format!("create {} again: {error}", spec.name)),
        };
        let model = &mut self.models[t];
        model.rows.clear();
        model.max_id = 0;
        model.max_id_at_checkpoint = 0;
        self.verify_all(&format!(
            "after {} was dropped and created again",
            spec.name
        ));
        common::assert_every_page_owned(&self.db, &format!("after {} was dropped", spec.name));
    }

    /// At a page limit: deletes most of a table (from its start) and checks that a row gets
    /// in again once pages are free.
    fn refill_after_full(&mut self, t: usize) {
        let spec = self.models[t].spec.clone();
        let count = self.models[t].rows.len();
        if count < 50 {
            return;
        }
        let free_before = self.db.pool().free_page_count();
        let ordered = self.ordered(t);
        let take = count * 3 / 4;
        self.note(format!(
            "{}: at the limit, delete {take} of {count}",
            spec.name
        ));
        if spec.kind == Kind::NonUnique {
            let mut keys: Vec<i32> = ordered[..take]
                .iter()
                .map(|key| int(&self.models[t].rows[key][0]))
                .collect();
            keys.dedup();
            for k in keys {
                while self.tables[t]
                    .delete(&self.session, &[Value::Int(k)])
                    .unwrap()
                {}
                self.models[t].rows.retain(|_, row| int(&row[0]) != k);
            }
        } else {
            for key in &ordered[..take] {
                let key_values = spec.key_values(&self.models[t].rows[key]);
                assert_eq!(self.tables[t].delete(&self.session, &key_values), Ok(true));
                self.models[t].rows.remove(key);
            }
        }
        let free = self.db.pool().free_page_count();
        self.note(format!("free pages {free_before} -> {free}"));
        // About 40 rows fill a leaf: 300 neighbouring rows (of a partition's 100 at least) span
        // whole leaves, which must go.
        // Side by side, other writers take and free pages too.
        let alone = self.owners == 1;
        if alone && spec.kind != Kind::Heap && take >= 300 && free <= free_before {
            self.fail(&format!(
                "{}: deleting {take} neighbouring rows of {count} freed no page ({free} free)",
                spec.name
            ));
        }
        if free >= 12 {
            let mut row = self.new_row(t, 0.0, &[]);
            let u = self.fresh_u();
            let v = self.v();
            row[spec.u()] = Value::Int(u);
            row[spec.v()] = Value::Int(v);
            row[spec.p()] = Value::String(payload(u, v, 20));
            if spec.explicit_key() {
                // A key of this writer's class that no row of it has.
                let (owner, owners) = (self.owner as i32, self.owners as i32);
                let taken: std::collections::HashSet<i32> = self.models[t]
                    .rows
                    .values()
                    .map(|row| int(&row[0]))
                    .collect();
                let k = if spec.kind == Kind::NonUnique {
                    owner
                } else {
                    (1..)
                        .map(|j| owner - owners * j)
                        .find(|k| !taken.contains(k))
                        .unwrap()
                };
                row[0] = Value::Int(k);
                if spec.kind == Kind::Hashed {
                    row[1] = Value::Int(h_of(k));
                }
            }
            let insert = spec.insert_row(&row);
            match self.tables[t].insert(&self.session, insert) {
                Ok(id) => {
                    self.refilled += 1;
                    self.inserted(t, vec![row], vec![id]);
                }
                Err(error) if !alone && is_pool_full(&error) => {}
                Err(error) => self.fail(&format!(
                    "{}: after deleting {take} rows ({free} pages free) an insert failed: {error}",
                    spec.name
                )),
            }
        }
        self.verify(t, "after a refill");
    }

    /// Runs `steps` steps; ends any transaction it opened unless `leave_open`.
    fn run(&mut self, steps: usize, leave_open: bool) {
        for _ in 0..steps {
            if self.rng.random_bool(0.05) {
                self.growing = !self.growing;
            }
            let full_before = self.full;
            match self.rng.random_range(0..100) {
                0..=7 if self.snapshot.is_none() => self.begin(),
                14 if !self.readers_active && self.owners == 1 => {
                    let t = self.rng.random_range(0..self.tables.len());
                    self.drop_and_recreate(t);
                }
                8..=13 if self.snapshot.is_some() => self.end(),
                _ => self.statement(),
            }
            if self.full > full_before && self.snapshot.is_none() && self.rng.random_bool(0.5) {
                let t = self.rng.random_range(0..self.tables.len());
                self.refill_after_full(t);
            }
        }
        if self.snapshot.is_some() && !(leave_open && self.rng.random_bool(0.5)) {
            self.end();
        }
    }
}

/// A reader: scans every table, both ways and over key ranges, until `stop`.
fn reader(
    db: Database,
    tables: Vec<(Spec, Arc<Table>)>,
    stop: &AtomicBool,
    scans: &AtomicU64,
    seed: u64,
) {
    let session = db.session();
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let (spec, table) = &tables[rng.random_range(0..tables.len())];
        let direction = if rng.random_bool(0.5) {
            Direction::Forward
        } else {
            Direction::Backward
        };
        let range = if spec.kind != Kind::Heap && spec.kind != Kind::Hashed && rng.random_bool(0.4)
        {
            let low = rng.random_range(0..KEY_SPACE);
            let high = low + rng.random_range(0..800);
            let value = |v: i32| {
                if spec.kind == Kind::Ident {
                    Value::BigInt(i64::from(v))
                } else {
                    Value::Int(v)
                }
            };
            KeyRange {
                lower: Bound::Included(vec![value(low)]),
                upper: Bound::Excluded(vec![value(high)]),
            }
        } else {
            KeyRange::all()
        };
        let rows: Result<Vec<Vec<Value>>, EngineError> = table
            .scan(&session, &range, direction)
            .and_then(|rows| rows.collect());
        let rows = rows.unwrap_or_else(|error| panic!("reader: {}: {error}", spec.name));
        if let Err(error) = check_scan(spec, &rows, direction, true) {
            panic!("reader (seed {seed}): {error}");
        }
        scans.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `writer` for `steps` steps, with `readers` readers.
fn run_steps(writer: &mut Writer, steps: usize, readers: usize, leave_open: bool) {
    if readers == 0 {
        writer.run(steps, leave_open);
        return;
    }
    let stop = AtomicBool::new(false);
    let scans = AtomicU64::new(0);
    let tables: Vec<(Spec, Arc<Table>)> = writer
        .models
        .iter()
        .map(|m| m.spec.clone())
        .zip(writer.tables.iter().cloned())
        .collect();
    let base: u64 = writer.rng.random();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers as u64)
            .map(|i| {
                let (db, tables, stop, scans) = (writer.db.clone(), tables.clone(), &stop, &scans);
                scope.spawn(move || reader(db, tables, stop, scans, base + i))
            })
            .collect();
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop_guard = StopOnDrop(&stop);
        writer.readers_active = true;
        writer.run(steps, leave_open);
        writer.readers_active = false;
        // A transaction left open would keep readers waiting for its locks.
        if writer.snapshot.is_some() {
            writer.end();
        }
        drop(stop_guard);
        for handle in handles {
            handle.join().unwrap();
        }
    });
    println!("readers scanned {} times", scans.load(Ordering::Relaxed));
}

fn specs(rng: &mut StdRng) -> Vec<Spec> {
    let unlogged = rng.random_range(0..KINDS.len() + 2);
    let names = ["TIdent", "TExplicit", "THashed", "TNonUnique", "THeap"];
    KINDS
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (kind, name))| Spec {
            kind: *kind,
            name,
            logged: i != unlogged,
            options: IndexOptions {
                latch_policy: LatchPolicy::ALL[rng.random_range(0..2)],
                insert_path: InsertPath::ALL[rng.random_range(0..2)],
                optimize_for_sequential_key: rng.random_bool(0.2),
            },
        })
        .collect()
}

fn new_writer(rng: &mut StdRng, db: Database, specs: &[Spec], limited: bool) -> Writer {
    let tables = specs
        .iter()
        .map(|spec| db.create_table(spec.def()).unwrap())
        .collect();
    let mut writer = new_writer_on(rng, db, specs, tables);
    writer.limited = limited;
    writer
}

/// A writer on tables that exist.
fn new_writer_on(
    rng: &mut StdRng,
    db: Database,
    specs: &[Spec],
    tables: Vec<Arc<Table>>,
) -> Writer {
    Writer {
        rng: StdRng::seed_from_u64(rng.random()),
        session: db.session(),
        db,
        tables,
        models: specs
            .iter()
            .map(|spec| Model {
                spec: spec.clone(),
                rows: Rows::new(),
                max_id: 0,
                max_id_at_checkpoint: 0,
            })
            .collect(),
        snapshot: None,
        doomed: false,
        next_u: 0,
        owner: 0,
        owners: 1,
        readers_active: false,
        growing: true,
        limited: false,
        full: 0,
        refilled: 0,
        log: Vec::new(),
    }
}

fn in_memory_case(seed: u64, settings: Settings) {
    println!("case seed {seed}: {settings:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let db = Database::create(DatabaseOptions {
        max_pages: settings
            .max_pages
            .unwrap_or(DatabaseOptions::default().max_pages),
        ..DatabaseOptions::default()
    })
    .unwrap();
    let specs = specs(&mut rng);
    let mut writer = new_writer(&mut rng, db, &specs, settings.max_pages.is_some());
    for round in 0..4 {
        run_steps(
            &mut writer,
            300,
            if settings.readers { 2 } else { 0 },
            false,
        );
        writer.verify_all(&format!("round {round}"));
        let rows: Vec<usize> = writer.models.iter().map(|m| m.rows.len()).collect();
        common::assert_every_page_owned(
            &writer.db,
            &format!("case {seed}, round {round}, rows {rows:?}"),
        );
    }
    println!(
        "case {seed}: {} statements failed for want of a page, {} refills",
        writer.full, writer.refilled
    );
}

#[test]
fn deletes_match_an_oracle_in_memory() {
    let (_, mut rng) = common::seeded_rng();
    for case in 0..common::cases(6) {
        let settings = Settings {
            max_pages: (case % 3 == 2).then(|| rng.random_range(45..90)),
            readers: case % 2 == 1,
        };
        in_memory_case(rng.random(), settings);
    }
}

fn durable_options(fs: &FaultyFileSystem, max_pages: Option<usize>) -> DatabaseOptions {
    DatabaseOptions {
        max_pages: max_pages.unwrap_or(DatabaseOptions::default().max_pages),
        // Small, so that freed and reused pages are evicted and read back.
        memory_budget_bytes: 1 << 20,
        // Small, so that checkpoints start by themselves while rows are deleted.
        checkpoint_log_bytes: 512 << 10,
        ..common::options(fs)
    }
}

fn durable_case(seed: u64, max_pages: Option<usize>, cycles: usize) {
    println!("durable case seed {seed}: max_pages {max_pages:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let specs = specs(&mut rng);
    let db = Database::open(common::DIR, durable_options(&fs, max_pages)).unwrap();
    let mut writer = new_writer(&mut rng, db, &specs, max_pages.is_some());
    for cycle in 0..cycles {
        // One reader: a durable commit's flush competes with it for the CPU.
        let readers = usize::from(rng.random_bool(0.3));
        let steps = rng.random_range(50..250);
        run_steps(&mut writer, steps, readers, true);
        if rng.random_bool(0.3) {
            writer.note("checkpoint".into());
            writer.db.checkpoint().unwrap();
            for model in &mut writer.models {
                model.max_id_at_checkpoint = model.max_id;
            }
            run_steps(&mut writer, rng.random_range(0..20), 0, true);
        }
        if let Some(failure) = writer.db.automatic_checkpoint_failure() {
            writer.fail(&format!("an automatic checkpoint failed: {failure:?}"));
        }
        // The committed rows: the open transaction's changes go with the crash.
        let open = writer.snapshot.take();
        let open_txn = open.is_some();
        writer.doomed = false;
        let clean = open.is_none() && rng.random_bool(0.3);
        if let Some(rows) = open {
            for (model, rows) in writer.models.iter_mut().zip(rows) {
                model.rows = rows;
            }
        }
        // The handles go with the old database; a placeholder stands in until the reopen.
        let placeholder = Database::create(DatabaseOptions::default()).unwrap();
        let session = std::mem::replace(&mut writer.session, placeholder.session());
        let db = std::mem::replace(&mut writer.db, placeholder);
        let tables = std::mem::take(&mut writer.tables);
        if clean {
            println!("cycle {cycle}: close");
            writer.note(format!("cycle {cycle}: close"));
            drop((session, tables));
            db.close().unwrap();
            for model in &mut writer.models {
                model.max_id_at_checkpoint = model.max_id;
            }
        } else {
            let mode = match rng.random_range(0..3) {
                0 => CrashMode::Random,
                1 => CrashMode::KeepUnsynced,
                _ => CrashMode::LoseUnsynced,
            };
            println!("cycle {cycle}: crash ({mode:?})");
            writer.note(format!("cycle {cycle}: crash ({mode:?})"));
            // A session with a transaction still open is abandoned, so that no rollback runs.
            fs = if open_txn {
                common::crash(&fs, mode, db, tables, session)
            } else {
                common::crash(&fs, mode, db, (tables, session), ())
            };
            for model in &mut writer.models {
                if !model.spec.logged {
                    model.rows.clear();
                    model.max_id = model.max_id_at_checkpoint;
                }
            }
        }
        let db = Database::open(common::DIR, durable_options(&fs, max_pages)).unwrap();
        writer.session = db.session();
        writer.tables = specs.iter().map(|s| db.table(s.name).unwrap()).collect();
        writer.db = db;
        writer.verify_all(&format!("cycle {cycle}, after the reopen"));
        common::assert_every_page_owned(&writer.db, &format!("case {seed}, cycle {cycle}"));
    }
}

#[test]
fn deletes_match_an_oracle_through_crashes() {
    let (_, mut rng) = common::seeded_rng();
    for case in 0..common::cases(3) {
        let max_pages = (case % 3 == 2).then(|| rng.random_range(50..100));
        durable_case(rng.random(), max_pages, 6);
    }
}

/// Writers side by side on the same tables (each on rows of its own: keys of its class, its
/// own `U` values), with a reader: frees of emptied leaves race other writers' splits,
/// appends through the sequence lanes and inserts into the same leaves.
fn concurrent_case(seed: u64, writers: u32, max_pages: Option<usize>) {
    println!("concurrent case seed {seed}: {writers} writers, max_pages {max_pages:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let db = Database::create(DatabaseOptions {
        max_pages: max_pages.unwrap_or(DatabaseOptions::default().max_pages),
        ..DatabaseOptions::default()
    })
    .unwrap();
    let specs = specs(&mut rng);
    let first = new_writer(&mut rng, db.clone(), &specs, max_pages.is_some());
    let tables = first.tables.clone();
    let mut all: Vec<Writer> = vec![first];
    for _ in 1..writers {
        let mut writer = new_writer_on(&mut rng, db.clone(), &specs, tables.clone());
        writer.owner = all.len() as u32;
        all.push(writer);
    }
    for writer in &mut all {
        writer.limited = max_pages.is_some();
        writer.owners = writers;
        writer.readers_active = true;
    }
    let stop = AtomicBool::new(false);
    let scans = AtomicU64::new(0);
    let reader_tables: Vec<(Spec, Arc<Table>)> =
        specs.iter().cloned().zip(tables.clone()).collect();
    std::thread::scope(|scope| {
        let reader = {
            let (db, stop, scans) = (db.clone(), &stop, &scans);
            scope.spawn(move || reader(db, reader_tables, stop, scans, seed))
        };
        let handles: Vec<_> = all
            .iter_mut()
            .map(|writer| scope.spawn(move || writer.run(800, false)))
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        for result in results {
            result.unwrap();
        }
    });
    println!(
        "reader scanned {} times; {} statements failed for want of a page, {} refills",
        scans.load(Ordering::Relaxed),
        all.iter().map(|writer| writer.full).sum::<u64>(),
        all.iter().map(|writer| writer.refilled).sum::<u64>()
    );
    // Every table holds exactly the union of the writers' rows.
    let mut union = new_writer_on(&mut rng, db.clone(), &specs, tables);
    for writer in &all {
        writer.verify_all("at the end");
        for (model, theirs) in union.models.iter_mut().zip(&writer.models) {
            model
                .rows
                .extend(theirs.rows.iter().map(|(k, v)| (*k, v.clone())));
        }
    }
    union.owner = 0;
    union.owners = 1;
    // Every row is owned by writer 0's `U` range only when there is one writer: compare all.
    for t in 0..union.tables.len() {
        let spec = union.models[t].spec.clone();
        let rows = common::rows(&union.tables[t], &union.session);
        let got: Rows = rows
            .into_iter()
            .map(|row| (spec.oracle_key(&row), row))
            .collect();
        assert!(
            got == union.models[t].rows,
            "{}: the rows differ from the writers' (seed {seed})",
            spec.name
        );
        assert_eq!(
            union.tables[t].row_count(),
            got.len() as u64,
            "{}",
            spec.name
        );
    }
    common::assert_every_page_owned(&db, &format!("concurrent case {seed}"));
}

#[test]
fn deletes_match_an_oracle_with_writers_side_by_side() {
    let (_, mut rng) = common::seeded_rng();
    for case in 0..common::cases(8) {
        let max_pages = (case % 3 == 2).then(|| rng.random_range(60..120));
        concurrent_case(rng.random(), 2 + (case % 2) as u32, max_pages);
    }
}

/// Writers side by side on a durable database, then a crash or a clean close: the reopened
/// tables hold exactly the union of what the writers committed (a table that is not logged is
/// empty after a crash), and every page in use belongs to a tree.
fn concurrent_durable_case(seed: u64, writers: u32, cycles: usize) {
    println!("concurrent durable case seed {seed}: {writers} writers");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let specs = specs(&mut rng);
    let mut committed: Vec<Rows> = vec![Rows::new(); specs.len()];
    let mut next_u = vec![0; writers as usize];
    // The last cycle only checks what the one before left.
    for cycle in 0..=cycles {
        let db = Database::open(common::DIR, durable_options(&fs, None)).unwrap();
        let tables: Vec<Arc<Table>> = if cycle == 0 {
            specs
                .iter()
                .map(|spec| db.create_table(spec.def()).unwrap())
                .collect()
        } else {
            specs
                .iter()
                .map(|spec| db.table(spec.name).unwrap())
                .collect()
        };
        let mut all: Vec<Writer> = (0..writers)
            .map(|owner| {
                let mut writer = new_writer_on(&mut rng, db.clone(), &specs, tables.clone());
                writer.owner = owner;
                writer.owners = writers;
                writer.readers_active = true;
                writer.next_u = next_u[owner as usize];
                for (model, rows) in writer.models.iter_mut().zip(&committed) {
                    model.rows = rows
                        .iter()
                        .filter(|(_, row)| {
                            int(&row[model.spec.u()]).div_euclid(U_STRIDE) == owner as i32
                        })
                        .map(|(k, v)| (*k, v.clone()))
                        .collect();
                }
                writer.verify_all(&format!("cycle {cycle}, after the open"));
                writer
            })
            .collect();
        common::assert_every_page_owned(
            &db,
            &format!("concurrent durable case {seed}, cycle {cycle}"),
        );
        if cycle == cycles {
            break;
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = all
                .iter_mut()
                .map(|writer| scope.spawn(move || writer.run(300, false)))
                .collect();
            for handle in handles {
                handle.join().unwrap();
            }
        });
        for rows in &mut committed {
            rows.clear();
        }
        for (owner, writer) in all.iter().enumerate() {
            writer.verify_all("at the end of the cycle");
            next_u[owner] = writer.next_u;
            for (rows, model) in committed.iter_mut().zip(&writer.models) {
                rows.extend(model.rows.iter().map(|(k, v)| (*k, v.clone())));
            }
        }
        assert_eq!(db.automatic_checkpoint_failure(), None);
        if rng.random_bool(0.3) {
            db.checkpoint().unwrap();
        }
        drop(all);
        if rng.random_bool(0.3) {
            println!("cycle {cycle}: close");
            drop(tables);
            db.close().unwrap();
        } else {
            let mode = [
                CrashMode::Random,
                CrashMode::KeepUnsynced,
                CrashMode::LoseUnsynced,
            ][rng.random_range(0..3)];
            println!("cycle {cycle}: crash ({mode:?})");
            fs = common::crash(&fs, mode, db, tables, ());
            for (rows, spec) in committed.iter_mut().zip(&specs) {
                if !spec.logged {
                    rows.clear();
                }
            }
        }
    }
}

#[test]
fn deletes_match_an_oracle_with_writers_side_by_side_through_crashes() {
    let (_, mut rng) = common::seeded_rng();
    for case in 0..common::cases(2) {
        concurrent_durable_case(rng.random(), 2 + (case % 2) as u32, 4);
    }
}

/// A queue of page-sized rows that drains each time: every row goes onto the emptied last
/// leaf (which is never freed), so the page the default path prepared for it before the tail
/// gate is not needed and joins the spare leaves. That page used to be freshly allocated every
/// time, and the spare leaves grew by one per row for ever (each a page of the database
/// limit): a database at its page limit turned rows away although its table was empty.
#[test]
fn page_sized_rows_onto_an_emptied_last_leaf_do_not_pile_up_spare_leaves() {
    let db = Database::create(DatabaseOptions {
        max_pages: 40,
        ..DatabaseOptions::default()
    })
    .unwrap();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                .column(ColumnDef::new("P", DataType::VarChar(8000)).not_null())
                .clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    for round in 0..200 {
        let id = table
            .insert(&session, InsertRow::new().set(1, "y".repeat(7000)))
            .unwrap_or_else(|error| panic!("round {round}: {error}"))
            .unwrap();
        assert!(table.delete(&session, &[Value::BigInt(id)]).unwrap());
    }
    let check = table.check_integrity().unwrap();
    let spare: u64 = check
        .indexes
        .iter()
        .map(|(_, tree)| tree.spare_leaves)
        .sum();
    assert!(spare <= 1, "an empty table keeps {spare} spare leaves");
    common::assert_every_page_owned(&db, "after the queue drained");
}
