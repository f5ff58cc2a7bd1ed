//! A randomized, model-based durability hunt over the day's DDL features together: tables of
//! random shapes (identity primary key, explicit primary key, non-unique clustered key, heap;
//! a stored computed column leading or trailing the clustered key, or outside it, and the table
//! partitioned on it; a nonclustered index; logged or not; either latch flavour) are created,
//! filled, changed (single rows and batches, as rows or as values through the prepared and
//! value-batch paths; transactions committed or rolled back), dropped (sometimes while a handle or
//! another session's open transaction still holds them) and created again under the same name,
//! across checkpoints, clean closes and crashes (unsynced writes lost, or each one lost, applied
//! or torn at random). Some batches, updates and creations run at a page limit just above the
//! pages in use (they succeed or fail with `PoolFull` and leave nothing), several threads insert
//! at once now and then, and the memory budget is small, so that pages (a dropped tree's too)
//! are evicted and read back.
//!
//! An oracle holds every table's committed rows (a table that is not logged is empty after a
//! crash). After every reopen: the tables are exactly the oracle's, their rows are the oracle's
//! (computed columns equal their expression), every page in use belongs to a tree, the integrity
//! check passes, and inserting into every table works (no identity value or uniquifier handed out
//! twice: rows with the keys of the rows already there go into a non-unique clustered index;
//! every identity value handed out is remembered, and a table that is not logged may hand out
//! again only those handed out after the last checkpoint, as docs/recovery.md says).
//!
//! Each case prints its seed; rerun one with `LASTPAGE_SEED=<seed>`, and scale the number of
//! cases with `LASTPAGE_TEST_CASES`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, EngineError, Expr, IndexDef, InsertRow,
    KeyRange, LatchPolicy, Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::DIR;

/// Cases per run (times `LASTPAGE_TEST_CASES`).
const CASES: usize = 48;

/// Open-work-close (or crash) cycles per case.
const CYCLES: usize = 8;

/// Operations per cycle.
const OPS: usize = 40;

/// The names tables are created under: few, so that names are reused after drops.
const NAMES: [&str; 4] = ["T0", "T1", "T2", "T3"];

/// How a table is keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    /// `Id BIGINT IDENTITY PRIMARY KEY`.
    Identity,
    /// `Id BIGINT PRIMARY KEY`, values chosen by the test (negative ones too).
    Explicit,
    /// A non-unique clustered index on `K` (hidden uniquifiers); `Id` is an identity.
    NonUnique,
    /// No clustered index: keys are uniquifiers alone; `Id` is an identity.
    Heap,
}

/// Where the computed column `C` is in the clustered key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Leads,
    Trails,
    Outside,
}

#[derive(Clone, Debug)]
struct Shape {
    key: Key,
    /// `C INT NOT NULL AS ABS(source % modulus)`, where the source is `K` for a non-unique
    /// key and `Id` otherwise; and where `C` is in the clustered key.
    computed: Option<(i64, Place)>,
    partitions: Option<u16>,
    nonclustered: bool,
    logged: bool,
    /// The latch flavour of every index's pages (freed pages go to a free list per flavour).
    latch: LatchPolicy,
}

impl Shape {
    fn random(rng: &mut StdRng) -> Shape {
        let key = [Key::Identity, Key::Explicit, Key::NonUnique, Key::Heap][rng.random_range(0..4)];
        let computed = rng.random_bool(0.7).then(|| {
            let place = if key == Key::Heap {
                Place::Outside
            } else {
                [Place::Leads, Place::Trails, Place::Outside][rng.random_range(0..3)]
            };
            ([4, 16][rng.random_range(0..2)], place)
        });
        let partitions = match computed {
            Some((_, Place::Leads | Place::Trails)) if rng.random_bool(0.6) => {
                Some([2, 4, 16][rng.random_range(0..3)])
            }
            _ => None,
        };
        Shape {
            key,
            computed,
            partitions,
            nonclustered: rng.random_bool(0.5),
            logged: rng.random_bool(0.75),
            latch: [LatchPolicy::Fifo, LatchPolicy::Adaptive][rng.random_range(0..2)],
        }
    }

    fn definition(&self, name: &str) -> TableDef {
        let id = ColumnDef::new("Id", DataType::BigInt);
        let id = if self.key == Key::Explicit {
            id.not_null()
        } else {
            id.identity(1, 1)
        };
        let mut def = TableDef::new(name)
            .column(id)
            .column(ColumnDef::new("K", DataType::Int).not_null())
            .column(ColumnDef::new("Pay", DataType::VarChar(8000)).not_null());
        if let Some((modulus, _)) = self.computed {
            def = def.column(
                ColumnDef::new("C", DataType::Int)
                    .not_null()
                    .computed_expression(Expr::column(self.source()).modulo(modulus).abs()),
            );
        }
        let base: &[&str] = match self.key {
            Key::Identity | Key::Explicit => &["Id"],
            Key::NonUnique => &["K"],
            Key::Heap => &[],
        };
        let columns: Vec<&str> = match self.computed {
            Some((_, Place::Leads)) => ["C"].iter().chain(base).copied().collect(),
            Some((_, Place::Trails)) => base.iter().chain(&["C"]).copied().collect(),
            _ => base.to_vec(),
        };
        if self.key != Key::Heap {
            let uniqueness = if self.key == Key::NonUnique {
                Uniqueness::NonUnique
            } else {
                Uniqueness::PrimaryKey
            };
            def = def.clustered(IndexDef::new(format!("CX_{name}"), &columns, uniqueness));
        }
        if self.nonclustered {
            // A unique index of a partitioned table holds the partitioning column.
            let unique: &[&str] = if self.partitions.is_some() {
                &["Id", "C"]
            } else {
                &["Id"]
            };
            def = if self.key == Key::NonUnique {
                def.nonclustered(IndexDef::new(
                    format!("IX_{name}"),
                    unique,
                    Uniqueness::UniqueIndex,
                ))
            } else {
                def.nonclustered(IndexDef::new(
                    format!("IX_{name}"),
                    &["K"],
                    Uniqueness::NonUnique,
                ))
            };
        }
        if let Some(partitions) = self.partitions {
            def = def.partitioned("C", partitions);
        }
        if !self.logged {
            def = def.not_logged();
        }
        for index in def.clustered.iter_mut().chain(def.nonclustered.iter_mut()) {
            index.options.latch_policy = self.latch;
        }
        def
    }

    fn source(&self) -> &'static str {
        if self.key == Key::NonUnique {
            "K"
        } else {
            "Id"
        }
    }

    /// The row the table stores for these values (the computed column computed here).
    fn row(&self, id: i64, k: i32, pay: &str) -> Vec<Value> {
        let mut row = vec![Value::BigInt(id), Value::Int(k), Value::String(pay.into())];
        if let Some((modulus, _)) = self.computed {
            let source = if self.key == Key::NonUnique {
                i64::from(k)
            } else {
                id
            };
            row.push(Value::Int(i32::try_from((source % modulus).abs()).unwrap()));
        }
        row
    }

    /// The clustered key (a non-unique one's visible part; a heap's is empty) of `row`.
    fn key_of(&self, row: &[Value]) -> Vec<Value> {
        let base = match self.key {
            Key::Identity | Key::Explicit => vec![row[0].clone()],
            Key::NonUnique => vec![row[1].clone()],
            Key::Heap => return Vec::new(),
        };
        match self.computed {
            Some((_, Place::Leads)) => [vec![row[3].clone()], base].concat(),
            Some((_, Place::Trails)) => [base, vec![row[3].clone()]].concat(),
            _ => base,
        }
    }

    /// Whether a key lookup may match several rows (the first match is the one changed).
    fn ambiguous(&self) -> bool {
        matches!(self.key, Key::NonUnique | Key::Heap)
    }
}

/// What the oracle knows of one table.
#[derive(Clone, Debug)]
struct Model {
    shape: Shape,
    /// Which creation of the name this is (unique over the run).
    generation: u64,
    /// Committed rows by `Id`.
    rows: BTreeMap<i64, Vec<Value>>,
    /// The next explicit `Id` (its absolute value) for [`Key::Explicit`].
    next_id: i64,
    /// Every identity value handed out (committed or not): none may be handed out again, but
    /// for a table that is not logged, whose counter starts again from the last checkpoint's
    /// value after a crash (docs/recovery.md, "Identity values").
    handed_out: BTreeSet<i64>,
    /// [`Model::handed_out`] as of the last checkpoint the test took.
    handed_out_checkpointed: BTreeSet<i64>,
}

impl Model {
    /// The values of `K` in the first `count` committed rows, for inserts that take the keys
    /// of rows already there.
    fn keys(&self, count: usize) -> Vec<i32> {
        self.rows
            .values()
            .map(|row| match row[1] {
                Value::Int(k) => k,
                _ => 0,
            })
            .take(count)
            .collect()
    }
}

/// Notes a checkpoint (or a close) of every table in `tables`.
fn checkpointed(tables: &mut BTreeMap<String, Model>) {
    for model in tables.values_mut() {
        model.handed_out_checkpointed = model.handed_out.clone();
    }
}

fn id_of(row: &[Value]) -> i64 {
    match row[0] {
        Value::BigInt(id) => id,
        ref other => panic!("an Id of {other:?}"),
    }
}

fn payload(rng: &mut StdRng) -> String {
    // Up to rows that take a page of their own.
    let len = [1, 40, 300, 1_500, 7_900][rng.random_range(0..5)];
    let c = char::from(b'a' + rng.random_range(0..26u8));
    c.to_string().repeat(len)
}

/// An open transaction of the second session: the rows it would commit, per table generation,
/// and whether it changed a table that is not logged.
#[derive(Default)]
struct Txn {
    rows: BTreeMap<u64, BTreeMap<i64, Vec<Value>>>,
    changed_unlogged: bool,
}

struct Run {
    rng: StdRng,
    fs: FaultyFileSystem,
    db: Database,
    main: Session,
    other: Session,
    txn: Option<Txn>,
    tables: BTreeMap<String, Model>,
    held: Vec<Arc<Table>>,
    generations: u64,
    log: Vec<String>,
}

fn db_options(fs: &FaultyFileSystem, budget_pages: usize) -> DatabaseOptions {
    DatabaseOptions {
        // Small, so that pages (a dropped tree's too) are evicted and read back.
        memory_budget_bytes: budget_pages * 8192,
        // A lock the test did not expect fails at once instead of hanging the thread.
        lock_timeout: Some(Duration::ZERO),
        ..common::options(fs)
    }
}

impl Run {
    fn note(&mut self, what: String) {
        self.log.push(what);
    }

    fn context(&self) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(25).collect();
        format!(
            "last operations (newest first):\n  {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    }

    fn table(&self, name: &str) -> Arc<Table> {
        self.db
            .table(name)
            .unwrap_or_else(|error| panic!("table {name}: {error}\n{}", self.context()))
    }

    /// A live table for an operation of `in_txn`'s session: for the main session one the open
    /// transaction has not touched (its rows may be locked).
    fn pick_table(&mut self, in_txn: bool) -> Option<String> {
        let touched: Vec<u64> = self
            .txn
            .as_ref()
            .map(|txn| txn.rows.keys().copied().collect())
            .unwrap_or_default();
        let names: Vec<String> = self
            .tables
            .iter()
            .filter(|(_, model)| in_txn || !touched.contains(&model.generation))
            .map(|(name, _)| name.clone())
            .collect();
        if names.is_empty() {
            return None;
        }
        Some(names[self.rng.random_range(0..names.len())].clone())
    }

    /// The rows `in_txn`'s session sees in `name` (its transaction's, or the committed ones).
    fn rows_mut(&mut self, name: &str, in_txn: bool) -> &mut BTreeMap<i64, Vec<Value>> {
        let model = self.tables.get_mut(name).unwrap();
        if in_txn {
            let txn = self.txn.as_mut().unwrap();
            txn.rows
                .entry(model.generation)
                .or_insert_with(|| model.rows.clone())
        } else {
            &mut model.rows
        }
    }

    /// Notes identity values `name` handed out, which it must never have handed out before.
    fn note_identities(&mut self, name: &str, ids: impl Iterator<Item = i64>) {
        if self.tables[name].shape.key == Key::Explicit {
            return;
        }
        let mut again = Vec::new();
        let model = self.tables.get_mut(name).unwrap();
        for id in ids {
            if !model.handed_out.insert(id) {
                again.push(id);
            }
        }
        assert!(
            again.is_empty(),
            "{name} ({:?}) handed out identity values {again:?} again\n{}",
            self.tables[name].shape,
            self.context()
        );
    }

    /// Notes that `in_txn`'s session changed `name` (for a clean close, see [`Run::reopen`]).
    fn wrote(&mut self, name: &str, in_txn: bool) {
        if in_txn && !self.tables[name].shape.logged {
            self.txn.as_mut().unwrap().changed_unlogged = true;
        }
    }

    fn create(&mut self) {
        self.try_create(false);
    }

    /// [`Run::create`]; if `may_fill`, the creation may fail with `PoolFull` (at a page limit),
    /// and then there is no such table.
    fn try_create(&mut self, may_fill: bool) {
        let free: Vec<&str> = NAMES
            .iter()
            .copied()
            .filter(|name| !self.tables.contains_key(*name))
            .collect();
        if free.is_empty() {
            return;
        }
        let name = free[self.rng.random_range(0..free.len())].to_owned();
        let shape = Shape::random(&mut self.rng);
        self.note(format!("create {name} {shape:?}"));
        let ctx = self.context();
        match self.db.create_table(shape.definition(&name)) {
            Ok(_) => {}
            Err(EngineError::PoolFull(_)) if may_fill => {
                self.note("  (the database was full)".into());
                return;
            }
            Err(error) => panic!("create {name}: {error}\n{ctx}"),
        }
        self.generations += 1;
        let model = Model {
            shape,
            generation: self.generations,
            rows: BTreeMap::new(),
            next_id: 1,
            handed_out: BTreeSet::new(),
            handed_out_checkpointed: BTreeSet::new(),
        };
        self.tables.insert(name, model);
    }

    /// Inserts `count` rows into `name` (as one batch if `batch`), with `K` values from `keys`
    /// when given (else random ones).
    fn insert(&mut self, name: &str, in_txn: bool, count: usize, batch: bool, keys: &[i32]) {
        self.try_insert(name, in_txn, count, batch, keys, false);
    }

    /// [`Run::insert`]; if `may_fill` (a batch at a page limit), the statement may fail with
    /// `PoolFull`, and then none of its rows went in. Returns whether it succeeded.
    fn try_insert(
        &mut self,
        name: &str,
        in_txn: bool,
        count: usize,
        batch: bool,
        keys: &[i32],
        may_fill: bool,
    ) -> bool {
        let shape = self.tables[name].shape.clone();
        let mut planned = Vec::new();
        for i in 0..count {
            let k = keys
                .get(i)
                .copied()
                .unwrap_or_else(|| self.rng.random_range(-30..30));
            let pay = payload(&mut self.rng);
            let id = (shape.key == Key::Explicit).then(|| {
                let model = self.tables.get_mut(name).unwrap();
                let id = model.next_id;
                model.next_id += self.rng.random_range(1..4);
                if self.rng.random_bool(0.3) { -id } else { id }
            });
            planned.push((id, k, pay));
        }
        let rows: Vec<InsertRow> = planned
            .iter()
            .map(|(id, k, pay)| {
                let row = InsertRow::new().set(1, *k).set(2, pay.as_str());
                match id {
                    Some(id) => row.set(0, *id),
                    None => row,
                }
            })
            .collect();
        self.note(format!(
            "insert {count} into {name} (txn {in_txn}, batch {batch})"
        ));
        let table = self.table(name);
        let session = if in_txn { &self.other } else { &self.main };
        // The same rows as values the caller keeps (the prepared and value-batch paths: into
        // a table clustered on its identity alone they are encoded where they lie).
        let columns: &[usize] = if shape.key == Key::Explicit {
            &[0, 1, 2]
        } else {
            &[1, 2]
        };
        let values: Vec<Vec<Value>> = planned
            .iter()
            .map(|(id, k, pay)| {
                let tail = [Value::Int(*k), Value::String(pay.clone())];
                id.map(Value::BigInt).into_iter().chain(tail).collect()
            })
            .collect();
        let result = match (batch, self.rng.random_bool(0.5)) {
            (true, false) => table.insert_batch(session, rows),
            (true, true) => {
                table.insert_batch_values(session, columns, values.iter().map(Vec::as_slice))
            }
            (false, false) => rows
                .into_iter()
                .map(|row| table.insert(session, row))
                .collect(),
            (false, true) => {
                let prepared = table.prepare_insert(columns).unwrap();
                values
                    .iter()
                    .map(|values| prepared.insert(session, values))
                    .collect()
            }
        };
        let ids = match result {
            Ok(ids) => ids,
            Err(EngineError::PoolFull(_)) if may_fill => {
                self.note("  (the database was full)".into());
                return false;
            }
            Err(error) => panic!(
                "insert into {name} ({shape:?}): {error}\n{}",
                self.context()
            ),
        };
        self.wrote(name, in_txn);
        self.note_identities(name, ids.iter().flatten().copied());
        let target = self.rows_mut(name, in_txn);
        for ((id, k, pay), returned) in planned.iter().zip(ids) {
            let id = id.or(returned).expect("an identity value");
            let row = shape.row(id, *k, pay);
            assert!(target.insert(id, row).is_none(), "Id {id} twice in {name}");
        }
        true
    }

    /// Inserts rows into `name` from several threads at once (autocommit), so that identity
    /// lanes and uniquifier stripes are used side by side and trees get spare leaves.
    fn insert_concurrently(&mut self, name: &str) {
        const THREADS: usize = 3;
        let shape = self.tables[name].shape.clone();
        let mut planned: Vec<Vec<(Option<i64>, i32, String)>> = vec![Vec::new(); THREADS];
        for rows in &mut planned {
            for _ in 0..self.rng.random_range(10..80) {
                let k = self.rng.random_range(-30..30);
                let pay = payload(&mut self.rng);
                let id = (shape.key == Key::Explicit).then(|| {
                    let model = self.tables.get_mut(name).unwrap();
                    let id = model.next_id;
                    model.next_id += 1;
                    id
                });
                rows.push((id, k, pay));
            }
        }
        self.note(format!("insert from {THREADS} threads into {name}"));
        let table = self.table(name);
        let ids: Vec<Vec<Option<i64>>> = std::thread::scope(|scope| {
            let threads: Vec<_> = planned
                .iter()
                .map(|rows| {
                    let (db, table) = (&self.db, &table);
                    scope.spawn(move || {
                        let session = db.session();
                        rows.iter()
                            .map(|(id, k, pay)| {
                                let row = InsertRow::new().set(1, *k).set(2, pay.as_str());
                                let row = match id {
                                    Some(id) => row.set(0, *id),
                                    None => row,
                                };
                                table.insert(&session, row)
                            })
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_else(|error| panic!("insert into {name}: {error}\n{}", self.context()));
        self.note_identities(name, ids.iter().flatten().flatten().copied());
        let rows = self.rows_mut(name, false);
        for (planned, ids) in planned.iter().zip(ids) {
            for ((id, k, pay), returned) in planned.iter().zip(ids) {
                let id = id.or(returned).expect("an identity value");
                assert!(
                    rows.insert(id, shape.row(id, *k, pay)).is_none(),
                    "Id {id} twice in {name}"
                );
            }
        }
    }

    /// The row an update or delete of `name` by `key` changes, as `in_txn`'s session sees it:
    /// the first match in key order.
    fn first_match(&self, name: &str, in_txn: bool, key: &[Value]) -> i64 {
        let table = self.table(name);
        let session = if in_txn { &self.other } else { &self.main };
        let range = if key.is_empty() {
            KeyRange::all()
        } else {
            common::prefix(key.to_vec())
        };
        let rows = common::scan(&table, session, &range, lastpage_engine::Direction::Forward);
        let Some(first) = rows.first() else {
            panic!(
                "{name}: no row has the key {key:?} of a row the oracle holds\n{}",
                self.context()
            )
        };
        id_of(first)
    }

    /// Updates or deletes a random row of `name`.
    fn change(&mut self, name: &str, in_txn: bool, delete: bool) {
        self.try_change(name, in_txn, delete, false);
    }

    /// [`Run::change`]; if `may_fill` (at a page limit), an update may fail with `PoolFull`,
    /// and then the row is as it was.
    fn try_change(&mut self, name: &str, in_txn: bool, delete: bool, may_fill: bool) {
        let shape = self.tables[name].shape.clone();
        let rows = self.rows_mut(name, in_txn).clone();
        if rows.is_empty() {
            return;
        }
        let pick = rows
            .keys()
            .nth(self.rng.random_range(0..rows.len()))
            .copied();
        let key = shape.key_of(&rows[&pick.unwrap()]);
        let id = if shape.ambiguous() {
            self.first_match(name, in_txn, &key)
        } else {
            pick.unwrap()
        };
        let old = rows
            .get(&id)
            .unwrap_or_else(|| {
                panic!(
                    "{name}: the first match {id} is no row the oracle knows\n{}",
                    self.context()
                )
            })
            .clone();
        let table = self.table(name);
        if delete {
            self.note(format!(
                "delete {key:?} (Id {id}) from {name} (txn {in_txn})"
            ));
            let session = if in_txn { &self.other } else { &self.main };
            let found = table
                .delete(session, &key)
                .unwrap_or_else(|error| panic!("delete from {name}: {error}\n{}", self.context()));
            assert!(found, "delete {key:?} from {name} found nothing");
            self.wrote(name, in_txn);
            self.rows_mut(name, in_txn).remove(&id);
        } else {
            let k = match &old[1] {
                Value::Int(k) => *k,
                other => panic!("K {other:?}"),
            };
            // A non-unique key's `K` changes only sometimes (the row moves then).
            let new_k = if shape.key != Key::NonUnique || self.rng.random_bool(0.3) {
                self.rng.random_range(-30..30)
            } else {
                k
            };
            let pay = payload(&mut self.rng);
            self.note(format!(
                "update {key:?} (Id {id}) of {name} to K {new_k} (txn {in_txn})"
            ));
            let session = if in_txn { &self.other } else { &self.main };
            let found = match table.update(
                session,
                &key,
                &[(1, Value::Int(new_k)), (2, Value::String(pay.clone()))],
            ) {
                Ok(found) => found,
                Err(EngineError::PoolFull(_)) if may_fill => {
                    self.note("  (the database was full)".into());
                    return;
                }
                Err(error) => panic!("update of {name}: {error}\n{}", self.context()),
            };
            assert!(found, "update {key:?} of {name} found nothing");
            self.wrote(name, in_txn);
            self.rows_mut(name, in_txn)
                .insert(id, shape.row(id, new_k, &pay));
        }
    }

    fn drop_table(&mut self, name: &str, hold: bool) {
        self.note(format!("drop {name} (hold {hold})"));
        let handle = self.table(name);
        let ctx = self.context();
        self.db
            .drop_table(name)
            .unwrap_or_else(|error| panic!("drop {name}: {error}\n{ctx}"));
        self.tables.remove(name);
        let error = common::try_rows(&handle, &self.main).unwrap_err();
        assert!(
            error.contains(name),
            "a dropped table's handle reads: {error}"
        );
        if hold {
            self.held.push(handle);
        }
    }

    fn end_txn(&mut self, commit: bool) {
        let Some(txn) = self.txn.take() else {
            return;
        };
        self.note(format!("end txn (commit {commit})"));
        if commit {
            self.other
                .commit()
                .unwrap_or_else(|error| panic!("commit: {error}\n{}", self.context()));
            for (generation, rows) in txn.rows {
                if let Some(model) = self
                    .tables
                    .values_mut()
                    .find(|model| model.generation == generation)
                {
                    model.rows = rows;
                }
            }
        } else {
            self.other
                .rollback()
                .unwrap_or_else(|error| panic!("rollback: {error}\n{}", self.context()));
        }
    }

    fn step(&mut self) {
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=7 => self.create(),
            8..=35 => {
                let in_txn = self.txn.is_some() && self.rng.random_bool(0.6);
                if let Some(name) = self.pick_table(in_txn) {
                    let batch = self.rng.random_bool(0.4);
                    let count = if batch {
                        self.rng.random_range(1..60)
                    } else {
                        self.rng.random_range(1..6)
                    };
                    // Some rows take the keys of rows already there (uniquifiers tell them
                    // apart).
                    let keys = self.tables[&name].keys(count / 2);
                    self.insert(&name, in_txn, count, batch, &keys);
                }
            }
            36..=55 => {
                let in_txn = self.txn.is_some() && self.rng.random_bool(0.6);
                if let Some(name) = self.pick_table(in_txn) {
                    // A transaction changes many rows at a time, so that a rollback (after the
                    // table was dropped, too) splits pages as it puts them back.
                    let times = if in_txn {
                        self.rng.random_range(1..30)
                    } else {
                        1
                    };
                    let delete = self.rng.random_bool(0.4);
                    for _ in 0..times {
                        self.change(&name, in_txn, delete);
                    }
                }
            }
            56..=61 => {
                // A held handle of a dropped table refuses writes.
                if let Some(handle) = self.held.first() {
                    let error = handle
                        .insert(
                            &self.main,
                            InsertRow::new().set(0, 1i64).set(1, 1).set(2, "x"),
                        )
                        .unwrap_err();
                    assert!(
                        matches!(error, EngineError::UnknownTable(_)),
                        "an insert through a dropped table's handle: {error}"
                    );
                }
                if let Some(name) = self.pick_table(false) {
                    let hold = self.rng.random_bool(0.4);
                    self.drop_table(&name, hold);
                }
            }
            62..=66 => {
                // A drop of a table the open transaction changed.
                let touched = self.txn.as_ref().and_then(|txn| {
                    self.tables
                        .iter()
                        .find(|(_, model)| txn.rows.contains_key(&model.generation))
                        .map(|(name, _)| name.clone())
                });
                if let Some(name) = touched {
                    self.drop_table(&name, false);
                }
            }
            67..=74 => {
                if self.txn.is_none() {
                    self.note("begin".into());
                    self.other.begin().unwrap();
                    self.txn = Some(Txn::default());
                } else {
                    let commit = self.rng.random_bool(0.5);
                    self.end_txn(commit);
                }
            }
            75..=78 => {
                if !self.held.is_empty() {
                    self.note("let go of the held tables".into());
                    self.held.clear();
                }
            }
            79..=84 => {
                self.note("checkpoint".into());
                let ctx = self.context();
                self.db
                    .checkpoint()
                    .unwrap_or_else(|error| panic!("checkpoint: {error}\n{ctx}"));
                checkpointed(&mut self.tables);
                if self.held.is_empty() && self.txn.is_none() {
                    self.check("after a checkpoint");
                }
            }
            85..=89 => {
                if let Some(name) = self.pick_table(false) {
                    self.insert_concurrently(&name);
                }
            }
            90..=93 => {
                // At a page limit a few pages above what is in use: a batch (atomic) and a
                // creation either succeed or fail with `PoolFull` and leave nothing behind.
                let pool = Arc::clone(self.db.pool());
                let limit = pool.page_count() + self.rng.random_range(0..6);
                self.note(format!(
                    "page limit {limit} ({} free)",
                    pool.free_page_count()
                ));
                pool.set_max_pages(limit);
                let in_txn = self.txn.is_some() && self.rng.random_bool(0.6);
                if let Some(name) = self.pick_table(in_txn) {
                    let count = self.rng.random_range(20..200);
                    self.try_insert(&name, in_txn, count, true, &[], true);
                    for _ in 0..self.rng.random_range(0..8) {
                        self.try_change(&name, in_txn, false, true);
                    }
                }
                if self.rng.random_bool(0.3) {
                    self.try_create(true);
                }
                pool.set_max_pages(usize::MAX);
            }
            _ => {
                let in_txn = self.txn.is_some() && self.rng.random_bool(0.6);
                if let Some(name) = self.pick_table(in_txn) {
                    let count = self.rng.random_range(20..120);
                    self.insert(&name, in_txn, count, true, &[]);
                }
            }
        }
    }

    /// Compares every table with the oracle and checks that every page is owned.
    fn check(&mut self, when: &str) {
        let ctx = self.context();
        let mut names: Vec<String> = self
            .db
            .tables()
            .iter()
            .map(|table| table.name().to_owned())
            .collect();
        names.sort();
        let expected: Vec<String> = self.tables.keys().cloned().collect();
        assert_eq!(names, expected, "{when}: the tables\n{ctx}");
        for (name, model) in &self.tables {
            let table = self.db.table(name).unwrap();
            let mut rows = common::try_rows(&table, &self.main)
                .unwrap_or_else(|error| panic!("{when}: {error}\n{ctx}"));
            rows.sort_by_key(|row| id_of(row));
            for row in &rows {
                let id = id_of(row);
                let k = match row[1] {
                    Value::Int(k) => k,
                    ref other => panic!("{when}: {name}: K {other:?}"),
                };
                let Value::String(pay) = &row[2] else {
                    panic!("{when}: {name}: Pay {:?}", row[2])
                };
                assert_eq!(
                    *row,
                    model.shape.row(id, k, pay),
                    "{when}: {name}: a computed column differs from its expression\n{ctx}"
                );
            }
            let expected: Vec<Vec<Value>> = model.rows.values().cloned().collect();
            if rows != expected {
                let got: BTreeMap<i64, &Vec<Value>> =
                    rows.iter().map(|row| (id_of(row), row)).collect();
                let missing: Vec<i64> = model
                    .rows
                    .keys()
                    .filter(|id| !got.contains_key(id))
                    .copied()
                    .take(10)
                    .collect();
                let extra: Vec<i64> = got
                    .keys()
                    .filter(|id| !model.rows.contains_key(id))
                    .copied()
                    .take(10)
                    .collect();
                panic!(
                    "{when}: {name} ({:?}) has {} rows, the oracle {}: missing ids {missing:?}, \
                     extra ids {extra:?}\n{ctx}",
                    model.shape,
                    rows.len(),
                    model.rows.len()
                );
            }
        }
        common::assert_every_page_owned(&self.db, when);
    }

    /// Inserts into every table rows with the keys of the rows it has, and a few more.
    fn probe_inserts(&mut self) {
        let names: Vec<String> = self.tables.keys().cloned().collect();
        for name in names {
            let keys = self.tables[&name].keys(40);
            let count = keys.len() + 3;
            let batch = self.rng.random_bool(0.5);
            self.insert(&name, false, count, batch, &keys);
        }
    }

    /// Closes cleanly or crashes, and opens the database again.
    fn reopen(self) -> Run {
        let Run {
            mut rng,
            fs,
            db,
            main,
            other,
            mut txn,
            mut tables,
            held,
            generations,
            mut log,
        } = self;
        let how = rng.random_range(0..3);
        let fs = if how == 0 {
            // A clean close, sometimes with the transaction still open (lost, as uncommitted).
            // If that transaction changed a table that is not logged, nothing can undo those
            // changes, so the close's image is not clean and the next open empties every such
            // table, as after a crash.
            if txn.is_some() && rng.random_bool(0.5) {
                other.rollback().unwrap();
                txn = None;
            }
            // Sometimes a handle still holds a dropped table through the close: the close's
            // catalog lists its trees, and the next open frees them.
            let hold_through = rng.random_bool(0.5);
            log.push(format!(
                "close (transaction open {}, {} dropped tables held {hold_through})",
                txn.is_some(),
                held.len()
            ));
            if txn.as_ref().is_some_and(|txn| txn.changed_unlogged) {
                for model in tables.values_mut() {
                    if !model.shape.logged {
                        model.rows.clear();
                    }
                }
            }
            let held = if hold_through {
                held
            } else {
                drop(held);
                Vec::new()
            };
            drop(main);
            db.close()
                .unwrap_or_else(|error| panic!("close: {error}\n{log:?}"));
            checkpointed(&mut tables);
            drop(held);
            drop(other);
            fs
        } else {
            let mode = if how == 1 {
                CrashMode::LoseUnsynced
            } else {
                CrashMode::Random
            };
            log.push(format!("crash {mode:?}"));
            for model in tables.values_mut() {
                if !model.shape.logged {
                    model.rows.clear();
                    model.handed_out = model.handed_out_checkpointed.clone();
                }
            }
            // The session is let go of even with its transaction open (not leaked, as
            // `common::crash` does with such sessions: hundreds of leaked databases use up the
            // memory of a long run). Its rollback cannot reach the crashed copy: the old file
            // system refuses every operation after the crash.
            common::crash(&fs, mode, db, (held, main, other), ())
        };
        let budget = [16, 128][rng.random_range(0..2)];
        let db = Database::open(DIR, db_options(&fs, budget))
            .unwrap_or_else(|error| panic!("open: {error}\nlog: {log:?}"));
        let main = db.session();
        let other = db.session();
        let mut run = Run {
            rng,
            fs,
            db,
            main,
            other,
            txn: None,
            tables,
            held: Vec::new(),
            generations,
            log,
        };
        run.note("reopened".into());
        // The open's own checkpoint.
        checkpointed(&mut run.tables);
        run.check("after the reopen");
        run.probe_inserts();
        run
    }
}

fn run_case(seed: u64) {
    println!("case seed = {seed} (rerun with LASTPAGE_SEED={seed} LASTPAGE_TEST_CASES=1)");
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = Database::open(DIR, db_options(&fs, 128)).unwrap();
    let main = db.session();
    let other = db.session();
    let mut run = Run {
        rng: StdRng::seed_from_u64(seed),
        fs,
        db,
        main,
        other,
        txn: None,
        tables: BTreeMap::new(),
        held: Vec::new(),
        generations: 0,
        log: Vec::new(),
    };
    for _ in 0..2 {
        run.create();
    }
    for cycle in 0..CYCLES {
        run.note(format!("cycle {cycle}"));
        // Sometimes none, so that an open is followed at once by a close or a crash.
        let ops = run.rng.random_range(0..=OPS * 2);
        for _ in 0..ops {
            run.step();
        }
        run = run.reopen();
    }
    run.end_txn(true);
    drop(run);
}

#[test]
fn ddl_crash_and_reopen_against_an_oracle() {
    let seed = common::seed();
    // A seed given to repeat a case runs that case first (and alone, unless scaled).
    let given = ["LASTPAGE_SEED", "LASTPAGE_TEST_SEED"]
        .iter()
        .any(|name| std::env::var(name).is_ok());
    let cases = common::cases(if given { 1 } else { CASES });
    for case in 0..cases as u64 {
        run_case(seed.wrapping_add(case));
    }
}
