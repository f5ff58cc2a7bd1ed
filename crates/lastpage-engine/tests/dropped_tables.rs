//! A dropped table's pages go back to the database: the next tables reuse them, a database at
//! its page limit takes rows again, and no page is lost whether the table was still in use
//! when it was dropped, the drop is replayed after a crash, or a creation failed half way.
//! Randomized tests print their seed; rerun one with `LASTPAGE_SEED=<seed>`.

use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, EngineError, IndexDef, InsertRow, TableDef,
    Uniqueness,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{DIR, assert_every_page_owned, seed};

/// `name(Id BIGINT IDENTITY PRIMARY KEY, Tag INT, Payload VARCHAR(2000))` with a nonclustered
/// index on `Tag`: two trees.
fn table(name: &str) -> TableDef {
    TableDef::new(name)
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Tag", DataType::Int).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(2000)).not_null())
        .clustered(IndexDef::new(
            format!("PK_{name}"),
            &["Id"],
            Uniqueness::PrimaryKey,
        ))
        .nonclustered(IndexDef::new(
            format!("IX_{name}"),
            &["Tag"],
            Uniqueness::NonUnique,
        ))
}

fn row(i: u64) -> InsertRow {
    InsertRow::new()
        .set(1, (i % 97) as i32)
        .set(2, "p".repeat(200 + (i % 7) as usize * 100))
}

/// Inserts `rows` rows into `name`, stopping at the first error, which it returns with the
/// rows that went in.
fn fill(db: &Database, name: &str, rows: u64) -> (u64, Option<EngineError>) {
    let table = db.table(name).unwrap();
    let session = db.session();
    for i in 0..rows {
        if let Err(error) = table.insert(&session, row(i)) {
            return (i, Some(error));
        }
    }
    (rows, None)
}

fn row_count(db: &Database, name: &str) -> u64 {
    let table = db.table(name).unwrap();
    common::rows(&table, &db.session()).len() as u64
}

fn durable_options(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        memory_budget_bytes: 1 << 20,
        ..common::options(fs)
    }
}

#[test]
fn a_dropped_tables_pages_go_to_the_next_tables_in_memory_and_on_disk() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    for durable in [false, true] {
        let context = if durable { "durable" } else { "in memory" };
        let db = if durable {
            Database::open(DIR, durable_options(&fs)).unwrap()
        } else {
            Database::create(DatabaseOptions::default()).unwrap()
        };
        db.create_table(table("Kept")).unwrap();
        db.create_table(table("Dropped")).unwrap();
        fill(&db, "Kept", 300);
        fill(&db, "Dropped", 3_000);
        let ids = db.pool().page_count();
        db.drop_table("Dropped").unwrap();
        let freed = db.pool().free_page_count();
        assert!(freed > 100, "{context}: the drop freed {freed} pages");
        assert_every_page_owned(&db, &format!("{context}, after the drop"));
        db.create_table(table("Next")).unwrap();
        fill(&db, "Next", 4_000);
        let in_use = db.pool().page_count() - db.pool().free_page_count();
        assert_eq!(
            db.pool().page_count(),
            ids.max(in_use),
            "{context}: new page ids were handed out while freed pages waited"
        );
        assert_eq!(db.pool().free_page_count(), 0, "{context}");
        assert_every_page_owned(&db, &format!("{context}, after the refill"));
        assert_eq!(row_count(&db, "Next"), 4_000, "{context}");
        if durable {
            db.close().unwrap();
            let db = Database::open(DIR, durable_options(&fs)).unwrap();
            assert_every_page_owned(&db, "after the reopen");
            assert_eq!(row_count(&db, "Kept"), 300);
            assert_eq!(row_count(&db, "Next"), 4_000);
        }
    }
}

#[test]
fn a_database_at_its_page_limit_takes_rows_again_after_a_drop_and_a_reopen() {
    refill_after_a_drop_at_the_page_limit(lastpage_storage::latch::LatchPolicy::default(), 5);
}

#[test]
fn a_table_dropped_while_in_use_keeps_its_pages_until_let_go() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let dropped = db.create_table(table("Dropped")).unwrap();
    fill(&db, "Dropped", 2_000);
    // A transaction that changed the table holds it through its undo.
    let writer = db.session();
    writer.begin().unwrap();
    for i in 0..500 {
        dropped.insert(&writer, row(i)).unwrap();
    }
    drop(dropped);
    db.drop_table("Dropped").unwrap();
    assert_eq!(
        db.pool().free_page_count(),
        0,
        "pages freed under a transaction"
    );
    // Other tables come and go meanwhile; a rollback of the dropped table's rows still finds
    // its pages as they were.
    db.create_table(table("Other")).unwrap();
    fill(&db, "Other", 2_000);
    writer.rollback().unwrap();
    // The rollback's deletes free the leaves they empty (a leaf of the dropped table's still
    // goes back once it is empty); the rest of its pages wait for the next DDL.
    let free_after_rollback = db.pool().free_page_count();
    db.create_table(table("Third")).unwrap();
    assert!(
        db.pool().free_page_count() > free_after_rollback + 50,
        "the table's pages should have been freed: {} free, {free_after_rollback} before",
        db.pool().free_page_count()
    );
    assert_every_page_owned(&db, "after the transaction ended");
    assert_eq!(row_count(&db, "Other"), 2_000);
}

#[test]
fn a_table_still_held_at_a_checkpoint_is_freed_by_the_next_open() {
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(7));
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    db.create_table(table("Kept")).unwrap();
    let held = db.create_table(table("Dropped")).unwrap();
    fill(&db, "Kept", 500);
    fill(&db, "Dropped", 2_000);
    db.drop_table("Dropped").unwrap();
    db.checkpoint().unwrap();
    assert_eq!(
        db.pool().free_page_count(),
        0,
        "freed while a handle held the table"
    );
    fs = common::crash(&fs, CrashMode::LoseUnsynced, db, held, ());
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    assert!(
        db.pool().free_page_count() > 50,
        "the open freed the dropped trees"
    );
    assert_every_page_owned(&db, "after the open");
    assert_eq!(row_count(&db, "Kept"), 500);
}

#[test]
fn a_drop_replayed_after_a_crash_frees_the_pages() {
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(9));
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    db.create_table(table("Kept")).unwrap();
    db.create_table(table("Dropped")).unwrap();
    fill(&db, "Dropped", 2_000);
    db.checkpoint().unwrap();
    db.drop_table("Dropped").unwrap();
    db.create_table(table("Dropped")).unwrap();
    fill(&db, "Dropped", 100);
    fill(&db, "Kept", 700);
    fs = common::crash(&fs, CrashMode::LoseUnsynced, db, (), ());
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    assert!(db.recovery_stats().unwrap().records > 0);
    assert_every_page_owned(&db, "after the replay");
    assert_eq!(row_count(&db, "Dropped"), 100);
    assert_eq!(row_count(&db, "Kept"), 700);
}

#[test]
fn a_creation_that_fails_leaves_no_page_behind() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(13));
    // At the page limit: room for the first tree of three.
    let db = Database::create(DatabaseOptions::default()).unwrap();
    db.create_table(table("Kept")).unwrap();
    fill(&db, "Kept", 200);
    db.pool().set_max_pages(db.pool().page_count() + 1);
    let three_trees = table("Failed").nonclustered(IndexDef::new(
        "IX_Failed_Payload",
        &["Tag", "Id"],
        Uniqueness::UniqueIndex,
    ));
    let error = db.create_table(three_trees).unwrap_err();
    assert!(matches!(error, EngineError::PoolFull(_)), "{error}");
    assert_eq!(db.pool().free_page_count(), 1, "the first tree's root");
    assert_every_page_owned(&db, "after the failed creation");
    // A definition too large for a log record is refused after its trees were made.
    let db = Database::open(
        DIR,
        DatabaseOptions {
            wal: WalConfig {
                buffer_bytes: lastpage_storage::limits::WAL_ROW_CHANGE_MAX_BYTES,
                ..common::options(&fs).wal
            },
            ..common::options(&fs)
        },
    )
    .unwrap();
    let mut wide = TableDef::new("Wide");
    for column in 0..400 {
        wide = wide.column(ColumnDef::new(format!("{column:0>100}"), DataType::Int));
    }
    let error = db.create_table(wide).unwrap_err();
    assert!(error.to_string().contains("log record"), "{error}");
    assert_eq!(db.pool().free_page_count(), 1, "the heap's tree");
    assert_every_page_owned(&db, "after the refused definition");
}

/// Sessions insert into their own tables while another creates, fills and drops a scratch
/// table, and a third inserts into the scratch table as it comes and goes (racing the drops:
/// its inserts either go in before a drop or fail with `UnknownTable`). Nothing may be lost,
/// and once everything is let go every page is owned or free, before and after a crash.
#[test]
fn drops_racing_inserts_lose_no_row_and_no_page() {
    let seed = seed();
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    for name in ["A", "B"] {
        db.create_table(table(name)).unwrap();
    }
    db.create_table(table("Scratch")).unwrap();
    let rounds = common::cases(30);
    std::thread::scope(|scope| {
        for name in ["A", "B"] {
            let db = db.clone();
            scope.spawn(move || assert_eq!(fill(&db, name, 3_000), (3_000, None)));
        }
        let racer = db.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_racer = Arc::clone(&stop);
        let racing = scope.spawn(move || {
            let session = racer.session();
            let mut inserted = 0u64;
            while !stop_racer.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(scratch) = racer.table("Scratch") else {
                    continue;
                };
                for i in 0..50 {
                    match scratch.insert(&session, row(i)) {
                        Ok(_) => inserted += 1,
                        Err(EngineError::UnknownTable(_)) => break,
                        Err(other) => panic!("an insert racing a drop: {other}"),
                    }
                }
            }
            inserted
        });
        let mut rng = StdRng::seed_from_u64(seed);
        for round in 0..rounds {
            db.drop_table("Scratch").unwrap();
            db.create_table(table("Scratch")).unwrap();
            fill(&db, "Scratch", rng.random_range(0..400));
            if round % 7 == 3 {
                db.checkpoint().unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        println!("the racer inserted {} rows", racing.join().unwrap());
    });
    // Everything is let go; the next DDL frees what waited.
    db.create_table(table("Last")).unwrap();
    assert_every_page_owned(&db, "after the race");
    let scratch_rows = row_count(&db, "Scratch");
    for name in ["A", "B"] {
        assert_eq!(row_count(&db, name), 3_000, "{name}");
    }
    fs = common::crash(&fs, CrashMode::LoseUnsynced, db, (), ());
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    assert_every_page_owned(&db, "after the crash");
    for name in ["A", "B"] {
        assert_eq!(row_count(&db, name), 3_000, "{name} after the crash");
    }
    assert_eq!(row_count(&db, "Scratch"), scratch_rows);
}

/// A power cut at every mutating I/O operation of an open that frees pages (the trees of a
/// table dropped while held, which the image's catalog lists, and of a drop the log replays)
/// and takes its closing checkpoint: each time, the next open has every committed row and
/// every page owned or free.
#[test]
fn a_power_cut_anywhere_in_an_open_that_frees_pages_loses_nothing() {
    use lastpage_io::PowerCut;
    let fs = FaultyFileSystem::new(FaultyConfig::new(17));
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    for name in ["Kept", "Held", "Replayed"] {
        db.create_table(table(name)).unwrap();
        fill(&db, name, 600);
    }
    let held = db.table("Held").unwrap();
    db.drop_table("Held").unwrap();
    db.checkpoint().unwrap();
    db.drop_table("Replayed").unwrap();
    db.create_table(table("Next")).unwrap();
    fill(&db, "Next", 700);
    let base = common::crash(&fs, CrashMode::LoseUnsynced, db, held, ());
    let open = |fs: Arc<dyn lastpage_io::FileSystem>| {
        Database::open(
            DIR,
            DatabaseOptions {
                file_system: Some(fs),
                ..durable_options(&base)
            },
        )
    };
    let check = |db: &Database, context: &str| {
        assert_every_page_owned(db, context);
        assert_eq!(row_count(db, "Kept"), 600, "{context}");
        assert_eq!(row_count(db, "Next"), 700, "{context}");
        assert!(db.table("Held").is_err() && db.table("Replayed").is_err());
    };
    for n in 1.. {
        let cut = PowerCut::new(base.crash());
        cut.arm(n, CrashMode::Random);
        let opened = open(Arc::new(cut.clone()));
        let Some(after) = cut.after() else {
            let db = opened.unwrap_or_else(|error| panic!("the open without a cut: {error}"));
            check(&db, "the open without a cut");
            println!("a power cut at each of {} operations of the open", n - 1);
            break;
        };
        drop(opened);
        let db = open(Arc::new(after))
            .unwrap_or_else(|error| panic!("after a cut at operation {n}: {error}"));
        check(&db, &format!("after a cut at operation {n}"));
    }
}

/// A dropped table whose pages cannot be freed (its inner pages are not in memory and every
/// read fails) stays set aside: the drop succeeds, a checkpoint lists its trees, and its pages
/// are freed later, by the next DDL once reads work, or by the next open after a crash.
#[test]
fn a_drop_whose_pages_cannot_be_read_frees_them_later() {
    use lastpage_io::FaultRule;
    for crash in [false, true] {
        let mut fs = FaultyFileSystem::new(FaultyConfig::new(23));
        let db = Database::open(
            DIR,
            DatabaseOptions {
                memory_budget_bytes: 16 * 8192,
                ..durable_options(&fs)
            },
        )
        .unwrap();
        db.create_table(table("Kept")).unwrap();
        db.create_table(table("Dropped")).unwrap();
        fill(&db, "Dropped", 2_000);
        db.checkpoint().unwrap();
        // Another table's rows push the dropped table's pages out of memory.
        fill(&db, "Kept", 1_500);
        fs.inject(FaultRule::reads_fail_from(1).on_path("/db/data.lp"));
        db.drop_table("Dropped").unwrap();
        assert_eq!(
            db.pool().free_page_count(),
            0,
            "crash {crash}: pages freed unread"
        );
        db.checkpoint().unwrap();
        fs.clear_faults();
        if crash {
            fs = common::crash(&fs, CrashMode::LoseUnsynced, db, (), ());
            let db = Database::open(DIR, durable_options(&fs)).unwrap();
            assert!(db.pool().free_page_count() > 100, "the open freed them");
            assert_every_page_owned(&db, "after the open");
        } else {
            db.create_table(table("Next")).unwrap();
            assert!(db.pool().free_page_count() > 100, "the next DDL freed them");
            assert_every_page_owned(&db, "after the next DDL");
            drop(db);
        }
    }
}

/// The slot of page `page` in the current image of the data file in `fs` (parsed as
/// `docs/data-file.md` lays it out: the newer valid meta slot names the stream, whose first
/// part is the page map, eight bytes per page).
fn slot_of_page(fs: &FaultyFileSystem, page: u32) -> usize {
    const SLOT: usize = 8192;
    let u32_at =
        |bytes: &[u8], at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at =
        |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let bytes = fs
        .contents(&std::path::Path::new(DIR).join("data.lp"))
        .unwrap();
    let meta_at = (0..2)
        .map(|slot| slot * SLOT)
        .filter(|&at| u32_at(&bytes, at + 12) == crc32c::crc32c(&bytes[at + 16..at + 64]))
        .max_by_key(|&at| u64_at(&bytes, at + 16))
        .unwrap();
    let mut next = u32_at(&bytes, meta_at + 28) as usize;
    let want = page as usize * 8;
    let mut stream = Vec::new();
    while stream.len() < want {
        stream.extend_from_slice(&bytes[next * SLOT + 4..(next + 1) * SLOT]);
        next = u32_at(&bytes, next * SLOT) as usize;
    }
    u32_at(&stream, (page as usize - 1) * 8) as usize
}

/// An unlogged table is emptied by the open after a crash, and its old trees are set aside to
/// be freed. When one of them cannot be freed (here its root's slot is damaged, so the page
/// cannot be read), it stays set aside and the next checkpoint's catalog lists it as a dropped
/// tree, though the emptied table's new trees have the same index ids as its old ones. The
/// catalog's check refused an index id named twice even then, which failed the open's own
/// checkpoint, so the database could not be opened any more, for a page of a table whose rows
/// the open throws away anyway. (Found by the review of the day's commits.)
#[test]
fn an_unlogged_table_whose_old_tree_cannot_be_freed_does_not_stop_the_open() {
    let mut fs = FaultyFileSystem::new(FaultyConfig::new(17));
    let db = Database::open(DIR, durable_options(&fs)).unwrap();
    db.create_table(table("Kept")).unwrap();
    let scratch = db.create_table(table("Scratch").not_logged()).unwrap();
    fill(&db, "Scratch", 2_000);
    let root = scratch.trees().next().unwrap().1[0].root();
    drop(scratch);
    db.checkpoint().unwrap();
    // Replayed by the next open, so that the open takes a checkpoint.
    fill(&db, "Kept", 10);
    fs = common::crash(&fs, CrashMode::LoseUnsynced, db, (), ());
    // The root of the unlogged table's clustered tree is an inner page (2,000 rows of a few
    // hundred bytes fill many leaves); damage its image so that it cannot be read.
    let slot = slot_of_page(&fs, root);
    {
        use lastpage_io::{FileSystem, OpenOptions};
        let file = fs
            .open(
                &std::path::Path::new(DIR).join("data.lp"),
                OpenOptions::existing(),
            )
            .unwrap();
        let at = (slot * 8192 + 4000) as u64;
        let mut byte = [0u8; 1];
        file.read_exact_at(at, &mut byte).unwrap();
        file.write_all_at(at, &[byte[0] ^ 0xff]).unwrap();
        file.sync_data().unwrap();
    }
    let db = Database::open(DIR, durable_options(&fs))
        .unwrap_or_else(|error| panic!("the open after the damage: {error}"));
    assert_eq!(
        row_count(&db, "Scratch"),
        0,
        "the unlogged table was emptied"
    );
    assert_eq!(row_count(&db, "Kept"), 10);
    db.checkpoint().unwrap();
    db.close().unwrap();
    let db = Database::open(DIR, durable_options(&fs))
        .unwrap_or_else(|error| panic!("the open after the close: {error}"));
    assert_eq!(row_count(&db, "Kept"), 10);
}

/// `drop_table` promises that a table dropped while held gives its pages back at the first DDL
/// or checkpoint after its last handle goes. An in-memory database's checkpoint returned before
/// it looked at the dropped tables, so without another DDL the pages never came back.
#[test]
fn an_in_memory_checkpoint_frees_a_dropped_table_let_go_of() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    db.create_table(table("Kept")).unwrap();
    let held = db.create_table(table("Dropped")).unwrap();
    fill(&db, "Dropped", 2_000);
    db.drop_table("Dropped").unwrap();
    assert_eq!(db.pool().free_page_count(), 0, "freed while held");
    drop(held);
    db.checkpoint().unwrap();
    assert!(
        db.pool().free_page_count() > 50,
        "the checkpoint after the last handle went freed {} pages",
        db.pool().free_page_count()
    );
    assert_every_page_owned(&db, "after the checkpoint");
}

/// [`table`] with both indexes' pages latched by `policy`.
fn table_latched(name: &str, policy: lastpage_storage::latch::LatchPolicy) -> TableDef {
    let mut def = table(name);
    for index in def.clustered.iter_mut().chain(def.nonclustered.iter_mut()) {
        index.options.latch_policy = policy;
    }
    def
}

/// The freed pages an image records come back on the free list of the default latch flavour
/// (flavours are not persisted, and every reopened page has the default one). An index of the
/// other flavour only took free pages of its own flavour, so after a reopen it never reused
/// any: a database of such tables at its page limit stayed full after a drop, with hundreds
/// of free pages it could not use.
#[test]
fn a_database_of_another_latch_flavour_at_its_page_limit_takes_rows_again_after_a_reopen() {
    use lastpage_storage::latch::LatchPolicy;
    let other = if LatchPolicy::default() == LatchPolicy::Fifo {
        LatchPolicy::Adaptive
    } else {
        LatchPolicy::Fifo
    };
    refill_after_a_drop_at_the_page_limit(other, 19);
}

/// Fills a database of 300 pages with one table of `policy`-latched pages until it is full
/// (another table cannot take a row either), drops that table, closes the database (whose
/// image records the freed pages), reopens it, and checks that the other table now takes at
/// least 90% of the rows the dropped one held, and that every page in use is owned.
fn refill_after_a_drop_at_the_page_limit(policy: lastpage_storage::latch::LatchPolicy, seed: u64) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let options = DatabaseOptions {
        max_pages: 300,
        ..durable_options(&fs)
    };
    let db = Database::open(DIR, options.clone()).unwrap();
    db.create_table(table_latched("Big", policy)).unwrap();
    db.create_table(table_latched("Small", policy)).unwrap();
    let (big, error) = fill(&db, "Big", 1_000_000);
    assert!(
        matches!(error, Some(EngineError::PoolFull(_))),
        "the database fills up: {error:?}"
    );
    let (_, error) = fill(&db, "Small", 1_000);
    assert!(matches!(error, Some(EngineError::PoolFull(_))), "{error:?}");
    db.drop_table("Big").unwrap();
    db.close().unwrap();
    let db = Database::open(DIR, options).unwrap();
    assert!(
        db.pool().free_page_count() > 200,
        "the reopened database has its free pages"
    );
    let (small, error) = fill(&db, "Small", big);
    println!("{big} rows filled the database; {small} went in after the drop ({error:?})");
    assert!(
        small * 10 >= big * 9,
        "only {small} of the {big} rows the dropped table held went in after it"
    );
    assert_every_page_owned(&db, "after the refill");
}
