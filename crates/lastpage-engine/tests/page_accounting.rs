//! No page is lost across closes and crashes: every page a durable database has in use belongs
//! to one of its trees, as a linked page or as a spare leaf (a page allocated for the tree's
//! next split and not linked yet), and every other page it has allocated is free.
//!
//! A page that belongs to nobody and is not free stays allocated, and in the data file, for
//! ever. Spare leaves were such pages at every close and every crash: the tree kept them in
//! memory only, and a reopened tree started without them. The checkpoint image's catalog now
//! names them and the open hands them back (`BTree::restore_spare_leaves`). So were a dropped
//! table's pages, and an emptied table's that is not logged, until pages could be freed.
//!
//! Each cycle opens the database, writes through the default insert path (single rows of many
//! sizes, page-sized rows that take a page of their own, batches, several sessions at once,
//! deletes), drops a scratch table (sometimes while a handle still holds it, to the end of the
//! cycle) and creates it again (logged or not), sometimes checkpoints, and then closes cleanly
//! or crashes (unsynced writes lost); after every reopen the rows must all be there and the
//! pages must all be owned or free.
//!
//! The test prints its seed; rerun one with `LASTPAGE_SEED=<seed>`.

use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, IndexDef, InsertRow, Table, TableDef,
    Uniqueness, Value,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{DIR, seed};

/// Open-write-close (or crash) cycles per run.
const CYCLES: usize = 10;

/// Sessions that insert at once in each cycle's concurrent phase.
const SESSIONS: usize = 3;

fn options(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        // A small budget, so that spare leaves are evicted and read back too.
        memory_budget_bytes: 1 << 20,
        ..common::options(fs)
    }
}

/// `Events(Id BIGINT IDENTITY PRIMARY KEY, Payload VARCHAR(8000))`: the sequence lanes, and
/// page-sized rows that are copied into a page of their own before the tail gate.
fn events() -> TableDef {
    TableDef::new("Events")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
        .clustered(IndexDef::new("PK_Events", &["Id"], Uniqueness::PrimaryKey))
}

/// `Parts`: identity, hash-partitioned four ways, with a nonclustered index.
fn parts() -> TableDef {
    TableDef::new("Parts")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Part", DataType::TinyInt).not_null())
        .column(ColumnDef::new("Tag", DataType::Int).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
        .clustered(IndexDef::new(
            "PK_Parts",
            &["Part", "Id"],
            Uniqueness::PrimaryKey,
        ))
        .nonclustered(IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique))
        .partitioned("Part", 4)
}

/// `Heap`: no clustered index, so every row's key is a uniquifier.
fn heap() -> TableDef {
    TableDef::new("Heap").column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
}

fn payload(rng: &mut StdRng) -> String {
    let len = [1, 100, 2_000, 7_900][rng.random_range(0..4)];
    "x".repeat(len)
}

/// A row for `table` (by name), payload of a random size.
fn row(table: &str, rng: &mut StdRng) -> InsertRow {
    match table {
        "Events" => InsertRow::new().set(1, payload(rng)),
        "Parts" => InsertRow::new()
            .set(1, rng.random_range(0..4i32))
            .set(2, rng.random_range(0..50i32))
            .set(3, payload(rng)),
        _ => InsertRow::new().set(0, payload(rng)),
    }
}

/// Asserts that every page in use belongs to a tree (linked or spare), and returns the row
/// count of each table, in `TABLES` order (the integrity check has checked every tree).
fn rows_and_owned_pages(db: &Database, context: &str) -> Vec<u64> {
    let checks = common::assert_every_page_owned(db, context);
    TABLES
        .iter()
        .map(|name| {
            checks
                .iter()
                .find(|table| table.table == *name)
                .map_or(0, |table| table.rows)
        })
        .collect()
}

const TABLES: [&str; 4] = ["Events", "Parts", "Heap", "Scratch"];

/// `Scratch`, dropped and created again in every cycle: logged or not, with a nonclustered
/// index, so that a drop frees two trees.
fn scratch(logged: bool) -> TableDef {
    let def = TableDef::new("Scratch")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Tag", DataType::Int).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
        .clustered(IndexDef::new("PK_Scratch", &["Id"], Uniqueness::PrimaryKey))
        .nonclustered(IndexDef::new("IX_Scratch", &["Tag"], Uniqueness::NonUnique));
    if logged { def } else { def.not_logged() }
}

/// Drops `Scratch` (holding a handle of it if `hold`, which the caller keeps to the end of the
/// cycle), creates it again, logged or not, and fills it; returns the handle held, whether the
/// new table is logged, and its rows.
fn replace_scratch(db: &Database, rng: &mut StdRng, hold: bool) -> (Option<Arc<Table>>, bool, u64) {
    let held = hold.then(|| db.table("Scratch").unwrap());
    db.drop_table("Scratch").unwrap();
    let logged = rng.random_bool(0.5);
    let table = db.create_table(scratch(logged)).unwrap();
    let session = db.session();
    let rows = rng.random_range(0..300u64);
    for _ in 0..rows {
        let row = InsertRow::new()
            .set(1, rng.random_range(0..50i32))
            .set(2, payload(rng));
        table.insert(&session, row).unwrap();
    }
    (held, logged, rows)
}

/// One cycle's writes; returns the rows it added to each table (in `TABLES` order).
fn write(db: &Database, rng: &mut StdRng) -> [u64; 3] {
    let tables: Vec<Arc<Table>> = TABLES[..3]
        .iter()
        .map(|name| db.table(name).unwrap())
        .collect();
    let mut added = [0u64; 3];
    let session = db.session();
    for _ in 0..rng.random_range(20..120) {
        let which = rng.random_range(0..tables.len());
        if rng.random_bool(0.2) {
            let rows: Vec<InsertRow> = (0..rng.random_range(2..40))
                .map(|_| row(TABLES[which], rng))
                .collect();
            added[which] += rows.len() as u64;
            tables[which].insert_batch(&session, rows).unwrap();
        } else {
            tables[which]
                .insert(&session, row(TABLES[which], rng))
                .unwrap();
            added[which] += 1;
        }
    }
    // Several sessions at once: each its own sequence lane on `Events`.
    let seeds: Vec<u64> = (0..SESSIONS).map(|_| rng.random()).collect();
    std::thread::scope(|scope| {
        for seed in seeds {
            let events = Arc::clone(&tables[0]);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                let session = db.session();
                for _ in 0..60 {
                    events.insert(&session, row("Events", &mut rng)).unwrap();
                }
            });
        }
    });
    added[0] += (SESSIONS * 60) as u64;
    // Deletes empty some leaves, which are freed.
    for id in (1..40i64).step_by(3) {
        if tables[0]
            .delete(&session, &[Value::BigInt(id * 7)])
            .unwrap()
        {
            added[0] -= 1;
        }
    }
    // A small batch last: a batch allocates a spare leaf before it enters the tail gate, and
    // keeps it if its rows fit on the last leaf, so each tree likely ends the cycle with one.
    for (which, table) in tables.iter().enumerate() {
        let rows: Vec<InsertRow> = (0..2)
            .map(|_| match TABLES[which] {
                "Events" => InsertRow::new().set(1, "s"),
                "Parts" => InsertRow::new().set(1, 0).set(2, 0).set(3, "s"),
                _ => InsertRow::new().set(0, "s"),
            })
            .collect();
        table.insert_batch(&session, rows).unwrap();
        added[which] += 2;
    }
    added
}

#[test]
fn every_page_belongs_to_a_tree_after_closes_and_crashes() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    {
        let db = Database::open(DIR, options(&fs)).unwrap();
        db.create_table(events()).unwrap();
        db.create_table(parts()).unwrap();
        db.create_table(heap()).unwrap();
        db.create_table(scratch(true)).unwrap();
        db.close().unwrap();
    }
    let mut expected = vec![0u64; TABLES.len()];
    for cycle in 0..CYCLES {
        let db = Database::open(DIR, options(&fs))
            .unwrap_or_else(|error| panic!("cycle {cycle}: open: {error}"));
        let rows = rows_and_owned_pages(&db, &format!("cycle {cycle}, after the open"));
        assert_eq!(rows, expected, "cycle {cycle}: rows after the open");
        let added = write(&db, &mut rng);
        if rng.random_bool(0.5) {
            db.checkpoint().unwrap();
        }
        // Every write was acknowledged (autocommit, FULL), so it survives a crash too.
        for (count, added) in expected.iter_mut().zip(added) {
            *count += added;
        }
        let hold = rng.random_bool(0.5);
        let (held, scratch_logged, scratch_rows) = replace_scratch(&db, &mut rng, hold);
        expected[3] = scratch_rows;
        if held.is_none() {
            let rows = rows_and_owned_pages(&db, &format!("cycle {cycle}, before the end"));
            assert_eq!(rows, expected, "cycle {cycle}: rows before the end");
        }
        if rng.random_bool(0.5) {
            // With the dropped table still held: its trees are listed in the catalog.
            db.checkpoint().unwrap();
        }
        if rng.random_bool(0.5) {
            println!(
                "cycle {cycle}: close (dropped table held: {})",
                held.is_some()
            );
            db.close().unwrap();
        } else {
            println!(
                "cycle {cycle}: crash (dropped table held: {})",
                held.is_some()
            );
            let after = fs.crash();
            drop(db);
            fs = after;
            // A table that is not logged starts empty after a crash.
            if !scratch_logged {
                expected[3] = 0;
            }
        }
        drop(held);
    }
    let db = Database::open(DIR, options(&fs)).unwrap();
    let rows = rows_and_owned_pages(&db, "at the end");
    assert_eq!(rows, expected, "rows at the end");
}

/// A spare leaf that cannot be read back (evicted, then a failed read) stays a spare leaf: the
/// split that wanted it fails, and once reads work again every page still belongs to a tree.
/// Before, the split had taken the page off the list before reading it, and it belonged to no
/// tree for ever.
#[test]
fn a_spare_leaf_that_cannot_be_read_stays_a_spare_leaf() {
    use lastpage_io::FaultRule;
    let fs = FaultyFileSystem::new(FaultyConfig::new(11));
    let db = Database::open(
        DIR,
        DatabaseOptions {
            memory_budget_bytes: 64 * 8192,
            ..options(&fs)
        },
    )
    .unwrap();
    let events = db.create_table(events()).unwrap();
    let filler = db.create_table(heap()).unwrap();
    let session = db.session();
    // Several leaves, so that the last one splits as the tail (with a spare leaf), not as
    // the root; then a batch that fits on the last leaf keeps the spare leaf it prepared.
    let tiny = |n: usize| {
        (0..n)
            .map(|_| InsertRow::new().set(1, "s"))
            .collect::<Vec<_>>()
    };
    events.insert_batch(&session, tiny(1_000)).unwrap();
    events.insert_batch(&session, tiny(2)).unwrap();
    rows_and_owned_pages(&db, "after the batch");
    let spares = |db: &Database| -> u64 {
        db.check_integrity().unwrap()[0]
            .indexes
            .iter()
            .map(|(_, tree)| tree.spare_leaves)
            .sum()
    };
    assert_eq!(spares(&db), 1, "the batch's spare leaf");
    // Page-sized rows elsewhere push the spare out of memory; a row on the last leaf of
    // `Events` brings that leaf back in.
    for _ in 0..1_500 {
        filler
            .insert(&session, InsertRow::new().set(0, "f".repeat(7_900)))
            .unwrap();
    }
    events.insert_batch(&session, tiny(1)).unwrap();
    // And a lookup brings the root back (the tail's parent, which its split latches).
    assert!(events.get(&session, &[Value::BigInt(1)]).unwrap().is_some());
    fs.inject(FaultRule::reads_fail_from(1));
    // Rows past the last leaf's room: the split needs the spare, whose read fails.
    let error = events
        .insert_batch(&session, tiny(400))
        .map(|_| ())
        .unwrap_err();
    println!("the split failed: {error}");
    fs.clear_faults();
    rows_and_owned_pages(&db, "after the failed read");
    assert_eq!(spares(&db), 1, "the spare leaf is still one");
    events.insert_batch(&session, tiny(400)).unwrap();
    rows_and_owned_pages(&db, "after the split");
}
