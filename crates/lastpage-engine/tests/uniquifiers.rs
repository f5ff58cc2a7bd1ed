//! Uniquifiers across processes. A non-unique clustered index (and a heap, which is one with no
//! columns) ends every key in a uniquifier, which each table numbers in blocks. A database
//! opened by a later process must not hand out the uniquifiers its rows already hold: before
//! `Database::open` moved the numbering past them, a heap reopened by a new process refused
//! every insert as a duplicate key.
//!
//! The first half runs in a child, as a real restart would: this test binary again, told by an
//! environment variable to play the child.

use std::path::Path;
use std::process::Command;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, IndexDef, InsertRow, Table, TableDef,
    Uniqueness, Value,
};

/// The environment variable that makes the test play the child, naming the database directory.
const CHILD_DIR: &str = "LASTPAGE_UNIQUIFIER_CHILD_DIR";

/// Rows each process inserts into each table.
const ROWS: i32 = 3;

/// The heap, and the table clustered on a non-unique key that every row shares.
fn tables(db: &Database) -> (std::sync::Arc<Table>, std::sync::Arc<Table>) {
    let heap = db.table("Heap").unwrap_or_else(|_| {
        db.create_table(TableDef::new("Heap").column(ColumnDef::new("V", DataType::Int).not_null()))
            .unwrap()
    });
    let shared_key = db.table("SharedKey").unwrap_or_else(|_| {
        db.create_table(
            TableDef::new("SharedKey")
                .column(ColumnDef::new("K", DataType::Int).not_null())
                .column(ColumnDef::new("V", DataType::Int).not_null())
                .clustered(IndexDef::new("CX_SharedKey", &["K"], Uniqueness::NonUnique)),
        )
        .unwrap()
    });
    (heap, shared_key)
}

/// Inserts `ROWS` rows into both tables (every `SharedKey` row with the same key), each
/// autocommitted and durable when it returns.
fn insert_rows(db: &Database, first: i32) {
    let (heap, shared_key) = tables(db);
    let session = db.session();
    for v in first..first + ROWS {
        heap.insert(&session, InsertRow::new().set(0, Value::Int(v)))
            .unwrap_or_else(|error| panic!("heap row {v}: {error}"));
        shared_key
            .insert(
                &session,
                InsertRow::new().set(0, Value::Int(7)).set(1, Value::Int(v)),
            )
            .unwrap_or_else(|error| panic!("shared-key row {v}: {error}"));
    }
}

fn child(dir: &Path) {
    let db = Database::open(dir, DatabaseOptions::default()).unwrap();
    insert_rows(&db, 0);
    // No close: the next process finds the rows through recovery, as after a crash.
    std::process::exit(0);
}

#[test]
fn a_reopened_database_never_hands_out_a_uniquifier_its_rows_hold() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        child(Path::new(&dir));
    }
    let dir = std::env::temp_dir().join(format!(
        "lastpage-uniquifier-test-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_reopened_database_never_hands_out_a_uniquifier_its_rows_hold",
            "--nocapture",
        ])
        .env(CHILD_DIR, &dir)
        .status()
        .unwrap();
    assert!(status.success(), "the child failed: {status}");

    // Another database's heap takes the first uniquifiers of this thread's stripe first: the
    // numbering is its own, and must not make the reopened database's any different.
    let other = Database::create(DatabaseOptions::default()).unwrap();
    let session = other.session();
    let (other_heap, _) = tables(&other);
    for v in 0..2 {
        other_heap
            .insert(&session, InsertRow::new().set(0, Value::Int(v)))
            .unwrap();
    }

    let db = Database::open(&dir, DatabaseOptions::default()).unwrap();
    insert_rows(&db, ROWS);
    let (heap, shared_key) = tables(&db);
    assert_eq!(heap.row_count(), 2 * ROWS as u64);
    assert_eq!(shared_key.row_count(), 2 * ROWS as u64);
    db.check_integrity().unwrap();
    drop((heap, shared_key));
    db.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

mod common;

/// `Events(K INT, Payload VARCHAR(600))`, clustered on `K`, which every row shares: each row's
/// key is told apart by its uniquifier alone, so a uniquifier handed out twice is a duplicate key.
fn shared_key_events(db: &Database) -> std::sync::Arc<Table> {
    db.table("Events").unwrap_or_else(|_| {
        db.create_table(
            TableDef::new("Events")
                .column(ColumnDef::new("K", DataType::Int).not_null())
                .column(ColumnDef::new("Payload", DataType::VarChar(600)).not_null())
                .clustered(IndexDef::new("CX_Events", &["K"], Uniqueness::NonUnique)),
        )
        .unwrap()
    })
}

/// Inserts `rows` rows on each of `threads` threads at once (each thread its own stripe of
/// uniquifiers, so more threads take more blocks).
fn insert_events(db: &Database, threads: usize, rows: usize) {
    let events = shared_key_events(db);
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let events = std::sync::Arc::clone(&events);
            scope.spawn(move || {
                let session = db.session();
                for i in 0..rows {
                    let row = InsertRow::new()
                        .set(0, Value::Int(7))
                        .set(1, Value::from("e".repeat(500)));
                    events
                        .insert(&session, row)
                        .unwrap_or_else(|error| panic!("thread {thread}, row {i}: {error}"));
                }
            });
        }
    });
}

/// The catalog records how many uniquifier blocks each table has handed out, so an open
/// continues past them without reading the table, and recovery raises the numbering past the
/// rows it replays (inserted after the last checkpoint, in blocks the count does not cover).
/// Before, the open read every key of every non-unique clustered index.
#[test]
fn the_open_continues_the_numbering_without_reading_the_rows() {
    use lastpage_io::{FaultyConfig, FaultyFileSystem};
    let seed = common::seed();
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let options = |fs: &FaultyFileSystem| DatabaseOptions {
        memory_budget_bytes: 64 * 8192,
        ..common::options(fs)
    };
    let mut expected = 0u64;
    {
        let db = Database::open(common::DIR, options(&fs)).unwrap();
        insert_events(&db, 1, 3_000);
        expected += 3_000;
        db.close().unwrap();
    }
    for cycle in 0..4 {
        let db = Database::open(common::DIR, options(&fs)).unwrap();
        let reads = db.pool().stats().reads;
        let leaves = db.check_integrity().unwrap()[0].indexes[0].1.leaf_pages;
        println!("cycle {cycle}: the open read {reads} pages; the table has {leaves} leaves");
        assert!(
            reads * 4 < leaves,
            "cycle {cycle}: the open read {reads} pages of a table of {leaves} leaves"
        );
        // One thread, then a checkpoint, then more threads than before: their stripes take
        // blocks after the checkpoint, which only the replay of their rows can tell the next
        // process about.
        insert_events(&db, 1, 200);
        db.checkpoint().unwrap();
        insert_events(&db, 2 + cycle, 100);
        expected += 200 + 100 * (2 + cycle) as u64;
        assert_eq!(
            shared_key_events(&db).row_count(),
            expected,
            "cycle {cycle}"
        );
        if cycle % 2 == 0 {
            fs = common::crash(&fs, lastpage_io::CrashMode::LoseUnsynced, db, (), ());
        } else {
            db.close().unwrap();
        }
    }
    let db = Database::open(common::DIR, options(&fs)).unwrap();
    insert_events(&db, 4, 50);
    let events = shared_key_events(&db);
    assert_eq!(events.row_count(), expected + 200);
    db.check_integrity().unwrap();
}
