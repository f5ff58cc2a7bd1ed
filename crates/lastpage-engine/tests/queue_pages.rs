//! A durable table used as a queue (rows appended under an IDENTITY key and deleted oldest
//! first) runs in a bounded number of pages across checkpoints, closes and crashes: a leaf that
//! deletes empty is freed and reused (`btree/reclaim.rs`), in the clustered index and in a
//! nonclustered one, including when recovery replays the deletes. Before, every page that ever
//! held a row stayed allocated, and in the data file, for ever.
//!
//! Each cycle opens the database, checks that the rows are exactly the acknowledged ones and
//! that every page in use belongs to a tree, appends rows (single rows, batches, two sessions
//! at once), deletes the oldest down to a window (some in a transaction that rolls back, whose
//! rows must come back), sometimes checkpoints, and closes or crashes (unsynced writes lost).
//!
//! A leaf whose freeing a delete had to give up on, in a tree that sees no more deletes, is
//! freed by the next checkpoint, before its image is written.
//!
//! The tests print their seed; rerun one with `LASTPAGE_SEED=<seed>`.

use std::collections::BTreeSet;
use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, IndexDef, InsertRow, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::seed;

const CYCLES: usize = 8;

/// Rows appended per cycle, and the rows the queue keeps after its deletes.
const APPENDED_PER_CYCLE: usize = 2500;
const WINDOW: usize = 800;

/// The most pages the database may ever allocate. The window's rows take about 15 clustered
/// leaves and 3 of the nonclustered index, and the catalog's tree a few pages; the whole run
/// appends 20,000 rows, which without freeing kept 457 pages.
const MAX_PAGES_ALLOCATED: usize = 120;

/// `Jobs(Id BIGINT IDENTITY PRIMARY KEY, Payload VARCHAR(100), Priority INT)`, with a
/// nonclustered index on Priority.
fn jobs() -> TableDef {
    TableDef::new("Jobs")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
        .column(ColumnDef::new("Priority", DataType::Int).not_null())
        .clustered(IndexDef::new("PK_Jobs", &["Id"], Uniqueness::PrimaryKey))
        .nonclustered(IndexDef::new(
            "IX_Priority",
            &["Priority"],
            Uniqueness::NonUnique,
        ))
}

fn job(rng: &mut StdRng) -> InsertRow {
    InsertRow::new()
        .set(1, "p".repeat(rng.random_range(60..100)))
        .set(2, rng.random_range(0..5))
}

/// The Ids of the rows in `table`.
fn ids(db: &Database, table: &Table) -> BTreeSet<i64> {
    common::rows(table, &db.session())
        .iter()
        .map(|row| common::bigint(&row[0]).expect("an Id"))
        .collect()
}

/// Appends this cycle's rows; returns their Ids.
fn append(db: &Database, table: &Arc<Table>, rng: &mut StdRng) -> Vec<i64> {
    let session = db.session();
    let mut added = Vec::new();
    while added.len() < APPENDED_PER_CYCLE / 2 {
        if rng.random_bool(0.1) {
            let rows: Vec<InsertRow> = (0..rng.random_range(2..50)).map(|_| job(rng)).collect();
            let batch = table.insert_batch(&session, rows).unwrap();
            added.extend(batch.into_iter().map(|id| id.expect("an Id")));
        } else {
            added.push(table.insert(&session, job(rng)).unwrap().expect("an Id"));
        }
    }
    let seeds: Vec<u64> = (0..2).map(|_| rng.random()).collect();
    let from_sessions: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let sessions: Vec<_> = seeds
            .into_iter()
            .map(|seed| {
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed);
                    let session = db.session();
                    (0..APPENDED_PER_CYCLE / 4)
                        .map(|_| {
                            table
                                .insert(&session, job(&mut rng))
                                .unwrap()
                                .expect("an Id")
                        })
                        .collect()
                })
            })
            .collect();
        sessions.into_iter().map(|s| s.join().unwrap()).collect()
    });
    added.extend(from_sessions.into_iter().flatten());
    added
}

/// Deletes the oldest rows down to `WINDOW`, sometimes first deleting some in a transaction
/// that rolls back.
fn delete_oldest(db: &Database, table: &Arc<Table>, queue: &mut BTreeSet<i64>, rng: &mut StdRng) {
    let session = db.session();
    if rng.random_bool(0.5) {
        session.begin().unwrap();
        for &id in queue.iter().take(500) {
            assert!(table.delete(&session, &[Value::BigInt(id)]).unwrap());
        }
        session.rollback().unwrap();
    }
    while queue.len() > WINDOW {
        let oldest = queue.pop_first().expect("the queue is not empty");
        assert!(
            table.delete(&session, &[Value::BigInt(oldest)]).unwrap(),
            "row {oldest} went missing"
        );
    }
}

#[test]
fn a_durable_queue_runs_in_a_bounded_number_of_pages() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    {
        let db = common::open(&fs);
        db.create_table(jobs()).unwrap();
        db.close().unwrap();
    }
    let mut queue: BTreeSet<i64> = BTreeSet::new();
    let mut most_allocated = 0;
    for cycle in 0..CYCLES {
        let db = common::open(&fs);
        let table = db.table("Jobs").unwrap();
        assert!(
            ids(&db, &table) == queue,
            "cycle {cycle}: the rows after the open differ"
        );
        common::assert_every_page_owned(&db, &format!("cycle {cycle}, after the open"));
        queue.extend(append(&db, &table, &mut rng));
        delete_oldest(&db, &table, &mut queue, &mut rng);
        assert!(ids(&db, &table) == queue, "cycle {cycle}: the rows differ");
        common::assert_every_page_owned(&db, &format!("cycle {cycle}, before the end"));
        most_allocated = most_allocated.max(db.pool().page_count());
        if rng.random_bool(0.5) {
            db.checkpoint().unwrap();
        }
        drop(table);
        // Every change was acknowledged (autocommit, FULL), so it survives a crash too.
        if rng.random_bool(0.5) {
            println!("cycle {cycle}: close");
            db.close().unwrap();
        } else {
            println!("cycle {cycle}: crash");
            fs = common::crash(&fs, lastpage_io::CrashMode::LoseUnsynced, db, (), ());
        }
    }
    let db = common::open(&fs);
    let table = db.table("Jobs").unwrap();
    assert!(
        ids(&db, &table) == queue,
        "the rows after the last open differ"
    );
    let checks = common::assert_every_page_owned(&db, "after the last open");
    most_allocated = most_allocated.max(db.pool().page_count());
    println!("at most {most_allocated} pages allocated");
    assert!(
        most_allocated <= MAX_PAGES_ALLOCATED,
        "a queue of {WINDOW} rows allocated {most_allocated} pages: {checks:?}"
    );
}

/// The leaves of the clustered index of the one table, as the integrity checker counts them;
/// also checks that every page in use belongs to a tree.
fn clustered_leaves(db: &Database, context: &str) -> u64 {
    let checks = common::assert_every_page_owned(db, context);
    checks[0].indexes[0].1.leaf_pages
}

/// A delete empties a leaf of the queue and its freeing gives up (forced with the storage
/// crate's `test-hooks`: at every attempt the links seem to have changed, as a split of the
/// left sibling makes them); no delete follows in the tree to retry it. The checkpoint retries
/// it, so the image holds no empty leaf: the leaf is gone in the process, and after a crash
/// and reopen too (the delete that emptied it precedes the checkpoint, so the replay does not
/// see it). Without the checkpoint's retry the leaf stays, empty, in the image and after the
/// reopen.
#[test]
fn a_checkpoint_frees_an_emptied_leaf_whose_freeing_gave_up() {
    let seed = seed();
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = common::open(&fs);
    let table = db.create_table(common::orders()).unwrap();
    let session = db.session();
    for _ in 0..400 {
        table
            .insert(&session, InsertRow::new().set(1, "q".repeat(100)))
            .unwrap();
    }
    let tree = &table.trees().next().expect("a clustered index").1[0];
    tree.fail_next_empty_leaf_free_attempts(lastpage_storage::limits::EMPTY_LEAF_FREE_ATTEMPTS);
    let mut queue: BTreeSet<i64> = (1..=400).collect();
    // The oldest rows go until a delete empties the first leaf and leaves it.
    while tree.stats().empty_leaves_left == 0 {
        let oldest = queue.pop_first().expect("a delete empties the first leaf");
        assert!(table.delete(&session, &[Value::BigInt(oldest)]).unwrap());
    }
    assert_eq!(tree.left_empty_leaves_listed(), 1);
    let leaves = clustered_leaves(&db, "after the deletes");
    db.checkpoint().unwrap();
    assert_eq!(tree.left_empty_leaves_listed(), 0);
    assert_eq!(tree.stats().empty_leaves_retried_freed, 1);
    assert_eq!(
        clustered_leaves(&db, "after the checkpoint"),
        leaves - 1,
        "the checkpoint should have freed the leaf the delete left"
    );
    drop(session);
    let fs = common::crash(&fs, lastpage_io::CrashMode::LoseUnsynced, db, table, ());
    let db = common::open(&fs);
    let table = db.table("Orders").unwrap();
    assert!(
        ids(&db, &table) == queue,
        "the rows after the reopen differ"
    );
    assert_eq!(
        clustered_leaves(&db, "after the reopen"),
        leaves - 1,
        "the image should hold no empty leaf"
    );
}
