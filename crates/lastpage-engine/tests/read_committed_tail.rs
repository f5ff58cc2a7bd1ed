//! Readers against the default insert path, through the engine: READ COMMITTED readers must
//! never return a row that does not commit. Prints its seed; rerun with `LASTPAGE_SEED=<seed>`.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, EngineError, IndexDef, IndexOptions,
    InsertPath, InsertRow, KeyRange, LatchPolicy, TableDef, Uniqueness, Value,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::seed;

fn id_of(row: &[Value]) -> i64 {
    match row[0] {
        Value::BigInt(id) => id,
        ref other => panic!("not an id: {other:?}"),
    }
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// An in-memory database with a page limit: autocommit batches into a table clustered on its
/// identity alone run until the database is full, while readers scan. A batch that fails
/// part way takes its rows back; a reader must never have returned one of them.
#[test]
fn readers_never_see_rows_of_a_batch_that_fails_when_the_database_is_full() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..24u64 {
        let latch_policy = LatchPolicy::ALL[(round % 2) as usize];
        let insert_path = InsertPath::ALL[((round / 2) % 2) as usize];
        let db = Database::create(DatabaseOptions {
            max_pages: rng.random_range(40..80),
            ..DatabaseOptions::default()
        })
        .unwrap();
        let options = IndexOptions {
            latch_policy,
            insert_path,
            ..IndexOptions::default()
        };
        // Round by round: the identity alone as the clustered key (batches at the tail on the
        // default path), with a nonclustered index too, and hash-partitioned on another
        // column (batches never at the tail, a lock per row).
        let variant = (round / 4) % 3;
        let mut def = TableDef::new("T")
            .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
            .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
            .column(ColumnDef::new("Part", DataType::TinyInt).not_null());
        def = if variant == 2 {
            def.clustered(
                IndexDef::new("PK_T", &["Part", "Id"], Uniqueness::PrimaryKey)
                    .with_options(options),
            )
            .partitioned("Part", 3)
        } else {
            def.clustered(
                IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey).with_options(options),
            )
        };
        if variant >= 1 {
            def = def.nonclustered(
                IndexDef::new("IX_Part", &["Part"], Uniqueness::NonUnique).with_options(options),
            );
        }
        let table = db.create_table(def).unwrap();
        let stop = AtomicBool::new(false);
        let (seen, committed) = std::thread::scope(|scope| {
            let readers: Vec<_> = (0..2)
                .map(|reader| {
                    let (db, table, stop) = (&db, &table, &stop);
                    scope.spawn(move || {
                        let session = db.session();
                        let mut seen = BTreeSet::new();
                        let mut scans = 0u64;
                        while !stop.load(Ordering::Relaxed) || scans < 3 {
                            scans += 1;
                            let direction = if (reader + scans).is_multiple_of(2) {
                                Direction::Backward
                            } else {
                                Direction::Forward
                            };
                            // The clustered key's order: (Part, Id) when partitioned.
                            let mut last: Option<(u8, i64)> = None;
                            for row in table.scan(&session, &KeyRange::all(), direction).unwrap() {
                                let row = row.unwrap();
                                let id = id_of(&row);
                                let part = match row[2] {
                                    Value::TinyInt(part) if variant == 2 => part,
                                    _ => 0,
                                };
                                if let Some(last) = last {
                                    match direction {
                                        Direction::Forward => {
                                            assert!((part, id) > last, "{id} after {last:?}")
                                        }
                                        Direction::Backward => {
                                            assert!((part, id) < last, "{id} after {last:?}")
                                        }
                                    }
                                }
                                last = Some((part, id));
                                seen.insert(id);
                            }
                        }
                        seen
                    })
                })
                .collect();
            let writer = {
                let (db, table, stop) = (&db, &table, &stop);
                let mut rng = StdRng::seed_from_u64(seed ^ round);
                scope.spawn(move || {
                    // Stops the readers however the writer ends (a panic too).
                    let _stop = StopOnDrop(stop);
                    let session = db.session();
                    let mut committed = BTreeSet::new();
                    let mut failures = 0;
                    while failures < 20 {
                        let rows = rng.random_range(20..400);
                        let len = rng.random_range(50..300);
                        let part = rng.random_range(0..3u8);
                        let batch: Vec<InsertRow> = (0..rows)
                            .map(|_| InsertRow::new().set(1, "p".repeat(len)).set(2, part))
                            .collect();
                        let result = if rng.random_bool(0.2) {
                            // Single rows too: a row whose index entry finds the database
                            // full is taken back as well.
                            table
                                .insert(&session, batch.into_iter().next().unwrap())
                                .map(|id| vec![id])
                        } else {
                            table.insert_batch(&session, batch)
                        };
                        match result {
                            Ok(ids) => committed.extend(ids.into_iter().map(Option::unwrap)),
                            Err(EngineError::PoolFull(_)) => failures += 1,
                            Err(error) => panic!("{error}"),
                        }
                    }
                    committed
                })
            };
            let committed = writer.join().unwrap();
            let mut seen = BTreeSet::new();
            for reader in readers {
                seen.extend(reader.join().unwrap());
            }
            (seen, committed)
        });
        let session = db.session();
        let now: BTreeSet<i64> = table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .unwrap()
            .map(|row| id_of(&row.unwrap()))
            .collect();
        assert_eq!(
            now, committed,
            "round {round}: the table holds exactly the committed rows"
        );
        let uncommitted: Vec<&i64> = seen.difference(&committed).collect();
        assert!(
            uncommitted.is_empty(),
            "round {round} ({latch_policy:?}, {insert_path:?}, table {variant}): readers returned {} rows of \
             failed batches, e.g. {:?} (seed {seed})",
            uncommitted.len(),
            &uncommitted[..uncommitted.len().min(5)]
        );
        table.check_integrity().unwrap();
    }
}

/// What the writers of [`read_committed_readers_meet_lanes_batches_and_rollbacks`] share with
/// its readers.
#[derive(Default)]
struct Published {
    /// Rows committed and never deleted or changed afterwards by a transaction that commits,
    /// in the order their commits returned.
    kept: Vec<i64>,
    /// Rows whose inserting transaction rolled back.
    rolled_back: BTreeSet<i64>,
}

/// A payload only transactions that always roll back write: no reader may ever see it.
const DIRTY: &str = "DIRTY";

/// Tags of committed rows are below this; rolled-back updates set tags at or above it.
const DIRTY_TAG: i32 = 100;

/// The table of the test: an identity clustered key (sequence lanes, batches at the tail) and
/// a non-unique nonclustered index on `Tag`.
fn lanes_table(db: &Database, latch_policy: LatchPolicy) -> std::sync::Arc<lastpage_engine::Table> {
    let options = IndexOptions {
        latch_policy,
        insert_path: InsertPath::Default,
        ..IndexOptions::default()
    };
    db.create_table(
        TableDef::new("T")
            .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
            .column(ColumnDef::new("Tag", DataType::Int).not_null())
            .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
            .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey).with_options(options))
            .nonclustered(
                IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique).with_options(options),
            ),
    )
    .unwrap()
}

/// A row of every size the default path treats apart: tiny, ~100 B, ~4 KB (two to a page),
/// and page-sized (copied into its own page before the tail gate).
fn sized_row(rng: &mut StdRng, tag: i32) -> InsertRow {
    let len = match rng.random_range(0..20) {
        0 => 7800,
        1..=2 => 4000,
        3..=5 => 1,
        _ => 100,
    };
    InsertRow::new().set(1, tag).set(2, "x".repeat(len))
}

/// One writer: explicit transactions of single rows (on its sequence lane) or a batch (at the
/// tail), committed or rolled back, and now and then updates and deletes of its committed
/// rows that always roll back.
fn write_transactions(
    db: &Database,
    table: &std::sync::Arc<lastpage_engine::Table>,
    published: &std::sync::Mutex<Published>,
    seed: u64,
    deadline: std::time::Instant,
) {
    let session = db.session();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mine: Vec<i64> = Vec::new();
    while std::time::Instant::now() < deadline {
        session.begin().unwrap();
        let tag = rng.random_range(0..8);
        let mut ids = Vec::new();
        match rng.random_range(0..10) {
            0..=5 => {
                for _ in 0..rng.random_range(1..6) {
                    let row = sized_row(&mut rng, tag);
                    ids.push(table.insert(&session, row).unwrap().unwrap());
                }
            }
            6..=8 => {
                let rows = (0..rng.random_range(2..80))
                    .map(|_| sized_row(&mut rng, tag))
                    .collect();
                let batch = table.insert_batch(&session, rows).unwrap();
                ids.extend(batch.into_iter().map(Option::unwrap));
            }
            _ => {
                // Readers must keep seeing the committed values, never these changes.
                for _ in 0..3 {
                    if mine.is_empty() {
                        break;
                    }
                    let key = [Value::BigInt(mine[rng.random_range(0..mine.len())])];
                    if rng.random_bool(0.5) {
                        // The same row twice is found gone the second time.
                        table.delete(&session, &key).unwrap();
                    } else {
                        let dirty = [(1, Value::Int(DIRTY_TAG + tag)), (2, Value::from(DIRTY))];
                        table.update(&session, &key, &dirty).unwrap();
                    }
                }
                session.rollback().unwrap();
                continue;
            }
        }
        if rng.random_bool(0.25) {
            session.rollback().unwrap();
            published.lock().unwrap().rolled_back.extend(ids);
        } else {
            session.commit().unwrap();
            mine.extend(&ids);
            published.lock().unwrap().kept.extend(ids);
        }
    }
}

/// Checks a row a reader returned (no value of a transaction that rolls back), notes its id in
/// `seen`, and returns the id.
fn checked_id(row: &[Value], seen: &mut BTreeSet<i64>, seed: u64) -> i64 {
    let id = id_of(row);
    let dirty_tag = matches!(row[1], Value::Int(tag) if tag >= DIRTY_TAG);
    let dirty_payload = matches!(&row[2], Value::String(text) if text == DIRTY);
    assert!(
        !dirty_tag && !dirty_payload,
        "row {id}: a value of a transaction that rolled back (seed {seed})"
    );
    seen.insert(id);
    id
}

/// One scan either way: of the whole table (now and then), of the tail where the lanes fill
/// their leaves and start new ones, or from the middle of the tree, stopping after a random
/// number of rows. It must return keys strictly in order, within its range, and every row of
/// `must_see` (committed before it started) in the part of the range it covered.
fn scan_and_check(
    table: &lastpage_engine::Table,
    session: &lastpage_engine::Session,
    rng: &mut StdRng,
    must_see: &[i64],
    seen: &mut BTreeSet<i64>,
    seed: u64,
) {
    let top = must_see.iter().copied().max().unwrap_or(0);
    let direction = if rng.random_bool(0.5) {
        Direction::Forward
    } else {
        Direction::Backward
    };
    let middle = rng.random_range(0..=top);
    let tail = (top - rng.random_range(0..3000)).max(0);
    let bound = |id: i64| vec![Value::BigInt(id)];
    let (lower, upper, low, high) = match rng.random_range(0..10) {
        0 => (Bound::Unbounded, Bound::Unbounded, i64::MIN, i64::MAX),
        1..=5 => (
            Bound::Included(bound(tail)),
            Bound::Unbounded,
            tail,
            i64::MAX,
        ),
        6..=7 => (
            Bound::Unbounded,
            Bound::Included(bound(middle)),
            i64::MIN,
            middle,
        ),
        _ => (
            Bound::Excluded(bound(middle / 2)),
            Bound::Excluded(bound(middle)),
            middle / 2 + 1,
            middle - 1,
        ),
    };
    let limit = rng.random_range(1..1500);
    let mut got = Vec::new();
    for row in table
        .scan(session, &KeyRange { lower, upper }, direction)
        .unwrap()
    {
        got.push(checked_id(&row.unwrap(), seen, seed));
        if got.len() == limit {
            break;
        }
    }
    for pair in got.windows(2) {
        let ordered = match direction {
            Direction::Forward => pair[0] < pair[1],
            Direction::Backward => pair[0] > pair[1],
        };
        assert!(
            ordered,
            "{direction:?}: {pair:?} out of order (seed {seed})"
        );
    }
    assert!(
        got.iter().all(|id| (low..=high).contains(id)),
        "(seed {seed})"
    );
    // What the scan covered: its range, up to where it stopped.
    let (low, high) = match (got.len() == limit, direction) {
        (false, _) => (low, high),
        (true, Direction::Forward) => (low, got[limit - 1]),
        (true, Direction::Backward) => (got[limit - 1], high),
    };
    let got: BTreeSet<i64> = got.into_iter().collect();
    let missing: Vec<&i64> = must_see
        .iter()
        .filter(|id| (low..=high).contains(*id) && !got.contains(id))
        .collect();
    assert!(
        missing.is_empty(),
        "a {direction:?} scan of {low}..={high} missed {} committed rows, e.g. {:?} (seed {seed})",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

/// One reader: scans, lookups by key and lookups through the index until `deadline` (and at least
/// a few), each checked against what was committed before it started. Returns every id it
/// was given.
fn read_committed(
    db: &Database,
    table: &lastpage_engine::Table,
    published: &std::sync::Mutex<Published>,
    deadline: std::time::Instant,
    seed: u64,
) -> BTreeSet<i64> {
    let session = db.session();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = BTreeSet::new();
    let mut reads = 0u64;
    while std::time::Instant::now() < deadline || reads < 5 {
        reads += 1;
        let must_see: Vec<i64> = published.lock().unwrap().kept.clone();
        match rng.random_range(0..8) {
            0..=4 => scan_and_check(table, &session, &mut rng, &must_see, &mut seen, seed),
            5..=6 => {
                for _ in 0..20.min(must_see.len()) {
                    let id = must_see[rng.random_range(0..must_see.len())];
                    let row = table.get(&session, &[Value::BigInt(id)]).unwrap();
                    let row =
                        row.unwrap_or_else(|| panic!("committed row {id} not found (seed {seed})"));
                    checked_id(&row, &mut seen, seed);
                }
            }
            _ => {
                let tag = rng.random_range(0..8);
                let rows = table
                    .get_by_index(&session, "IX_Tag", &[Value::Int(tag)])
                    .unwrap();
                let mut got = BTreeSet::new();
                for row in &rows {
                    assert_eq!(row[1], Value::Int(tag), "(seed {seed})");
                    let id = checked_id(row, &mut seen, seed);
                    assert!(got.insert(id), "row {id} twice (seed {seed})");
                }
                // Rows of this tag committed before the lookup began (tags of committed rows
                // never change), a sample of them: each row not returned has another tag.
                for _ in 0..50.min(must_see.len()) {
                    let id = must_see[rng.random_range(0..must_see.len())];
                    if got.contains(&id) {
                        continue;
                    }
                    let row = table.get(&session, &[Value::BigInt(id)]).unwrap();
                    assert_ne!(
                        row.expect("a committed row")[1],
                        Value::Int(tag),
                        "the index lookup missed committed row {id} (seed {seed})"
                    );
                }
            }
        }
    }
    println!("{reads} reads");
    seen
}

/// Explicit transactions on the default insert path (single rows on the sequence lanes, rows
/// of every size up to a page, batches at the tail) that commit or roll back, updates and
/// deletes of committed rows that always roll back, and the insert path switched at run time,
/// while READ COMMITTED readers scan both ways (the whole table, the tail, or from the middle),
/// look rows up by key and through the index. Readers must return every row committed before
/// they started, never a row or a value of a transaction that rolls back, and keys strictly
/// in order; at the end the table holds exactly the committed rows and passes the integrity
/// check.
#[test]
fn read_committed_readers_meet_lanes_batches_and_rollbacks() {
    let seed = seed();
    for latch_policy in LatchPolicy::ALL {
        let db = Database::create(DatabaseOptions {
            lock_timeout: Some(std::time::Duration::from_secs(20)),
            ..DatabaseOptions::default()
        })
        .unwrap();
        let table = lanes_table(&db, latch_policy);
        let published = std::sync::Mutex::new(Published::default());
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1200);
        let seen = std::thread::scope(|scope| {
            let (db, table, published) = (&db, &table, &published);
            // ALTER INDEX … SET now and then: the classic path for a while, then back.
            let switcher = scope.spawn(move || {
                let session = db.session();
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5157);
                while std::time::Instant::now() < deadline {
                    let path = if rng.random_bool(0.7) {
                        InsertPath::Default
                    } else {
                        InsertPath::Classic
                    };
                    table.set_insert_path(&session, "PK_T", path).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(rng.random_range(1..30)));
                }
                let path = InsertPath::Default;
                table.set_insert_path(&session, "PK_T", path).unwrap();
            });
            let writers: Vec<_> = (0..4u64)
                .map(|writer| {
                    let seed = seed ^ (writer + 1).wrapping_mul(0x9E37_79B9);
                    scope.spawn(move || write_transactions(db, table, published, seed, deadline))
                })
                .collect();
            let readers: Vec<_> = (0..3u64)
                .map(|reader| {
                    let seed = seed ^ (reader + 101);
                    scope.spawn(move || read_committed(db, table, published, deadline, seed))
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
            switcher.join().unwrap();
            let mut seen = BTreeSet::new();
            for reader in readers {
                seen.extend(reader.join().unwrap());
            }
            seen
        });
        let published = published.into_inner().unwrap();
        let dirty: Vec<&i64> = seen.intersection(&published.rolled_back).collect();
        assert!(
            dirty.is_empty(),
            "{latch_policy:?}: readers returned {} rows of transactions that rolled back, e.g. \
             {:?} (seed {seed})",
            dirty.len(),
            &dirty[..dirty.len().min(5)]
        );
        let session = db.session();
        let now: Vec<i64> = table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .unwrap()
            .map(|row| id_of(&row.unwrap()))
            .collect();
        let mut kept = published.kept;
        kept.sort_unstable();
        assert!(
            now == kept,
            "{latch_policy:?}: the table differs from the commits (seed {seed})"
        );
        println!(
            "{latch_policy:?}: {} rows committed, {} rolled back",
            kept.len(),
            published.rolled_back.len()
        );
        table.check_integrity().unwrap();
    }
}
