//! Readers against the default insert path, through the engine: READ COMMITTED readers must
//! never return a row that does not commit. Prints its seed; rerun with `LASTPAGE_SEED=<seed>`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, EngineError, IndexDef, IndexOptions,
    InsertPath, InsertRow, KeyRange, LatchPolicy, TableDef, Uniqueness, Value,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn seed() -> u64 {
    let seed = std::env::var("LASTPAGE_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed = {seed} (rerun with LASTPAGE_SEED={seed})");
    seed
}

fn id_of(row: &[Value]) -> i64 {
    match row[0] {
        Value::BigInt(id) => id,
        ref other => panic!("not an id: {other:?}"),
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
                let (db, table) = (&db, &table);
                let mut rng = StdRng::seed_from_u64(seed ^ round);
                scope.spawn(move || {
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
            stop.store(true, Ordering::Relaxed);
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
