//! Transactions, logging, checkpoints and recovery of a durable database, over the
//! fault-injecting file system: simulated crashes (lost, applied and torn unsynced writes),
//! failed fsyncs, a database larger than its memory budget, locks and READ COMMITTED.
//!
//! Randomized tests print their seed; rerun one with `LASTPAGE_SEED=<seed>`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use lastpage_engine::database::{DATA_FILE_NAME, WAL_DIR_NAME};
use lastpage_engine::{
    ColumnDef, CommitTicket, DataType, Database, DatabaseOptions, Direction, Durability,
    EngineError, IndexDef, InsertPath, InsertRow, KeyRange, TableDef, Uniqueness, Value, WaitType,
};
use lastpage_io::{CrashMode, FaultRule, FaultyConfig, FaultyFileSystem, FileSystem, OpenOptions};
use lastpage_storage::limits::WAL_ROW_CHANGE_MAX_BYTES;
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{
    CRASH_MODES, DIR, accounts, accounts_by_balance, crash, delayed_options,
    in_memory_with_lock_timeout, notes, open, options, options_without_background_flush, orders,
    orders_rows, seed, text_by_key, wait_until, while_blocked,
};

/// Opens with DELAYED durability by default and no background flush in practice (an hour's
/// interval): the log reaches the disk only when something flushes it.
fn open_delayed(fs: &FaultyFileSystem) -> Database {
    Database::open(DIR, delayed_options(fs)).unwrap()
}

/// Opens the crashed copy `after` and checks that every id in `acknowledged` is in `Orders`.
fn assert_orders_survived(after: &FaultyFileSystem, acknowledged: &[i64]) {
    let rows = orders_rows(&open(after));
    for id in acknowledged {
        assert!(rows.contains_key(id), "acknowledged {id} lost");
    }
}

fn insert_order(db: &Database, session: &lastpage_engine::Session) -> Result<i64, EngineError> {
    let table = db.table("Orders").unwrap();
    let id = table.insert(session, InsertRow::new().set(1, "pending"))?;
    Ok(id.unwrap())
}

/// Inserts `count` orders with [`insert_order`], one statement each, and returns their ids.
fn insert_orders(db: &Database, session: &lastpage_engine::Session, count: usize) -> Vec<i64> {
    (0..count)
        .map(|_| insert_order(db, session).unwrap())
        .collect()
}

/// 500 `Orders` rows with an 80-byte payload, for a batch that writes a good deal of log.
fn orders_of_80_bytes() -> Vec<InsertRow> {
    (0..500)
        .map(|_| InsertRow::new().set(1, "y".repeat(80)))
        .collect()
}

/// A database on a new file system seeded with `seed`, whose `Orders` holds 10,000 rows of
/// [`orders_of_80_bytes`] (20 committed batches, about 1.2 MB of log: several segments), with
/// the table and the session that inserted them.
fn ten_thousand_orders(
    seed: u64,
) -> (
    FaultyFileSystem,
    Database,
    Arc<lastpage_engine::Table>,
    lastpage_engine::Session,
) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = open(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    for _ in 0..20 {
        table.insert_batch(&session, orders_of_80_bytes()).unwrap();
    }
    (fs, db, table, session)
}

/// Opens with an automatic checkpoint after every 16 KiB of log, so that a test's inserts
/// start the checkpointer.
fn open_checkpointing_every_16_kib(fs: &FaultyFileSystem) -> Database {
    Database::open(
        DIR,
        DatabaseOptions {
            checkpoint_log_bytes: 16 << 10,
            ..options(fs)
        },
    )
    .unwrap()
}

#[test]
fn committed_rows_survive_crashes_and_identity_values_are_never_reused() {
    let seed = seed();
    for round in 0..40u64 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed.wrapping_add(round)));
        let db = open(&fs);
        db.create_table(orders()).unwrap();
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let db = db.clone();
                let acked = Arc::clone(&acked);
                scope.spawn(move || {
                    let session = db.session();
                    for _ in 0..40 {
                        let id = insert_order(&db, &session).unwrap();
                        acked.lock().unwrap().insert(id);
                    }
                });
            }
        });
        // A rolled-back transaction: its identity values are burned.
        let session = db.session();
        session.begin().unwrap();
        let rolled_back = insert_orders(&db, &session, 3);
        session.rollback().unwrap();
        // A transaction still open at the crash.
        let open_session = db.session();
        open_session.begin().unwrap();
        let uncommitted: Vec<i64> = (0..3)
            .map(|_| insert_order(&db, &open_session).unwrap())
            .collect();
        if round % 3 == 0 {
            db.checkpoint().unwrap();
        }
        let mode = CRASH_MODES[(round % 3) as usize];
        let after = crash(&fs, mode, db, session, open_session);
        let db = open(&after);
        let rows = orders_rows(&db);
        let acked = acked.lock().unwrap();
        for id in acked.iter() {
            assert!(
                rows.contains_key(id),
                "round {round}: acknowledged id {id} lost"
            );
        }
        for id in rolled_back.iter().chain(&uncommitted) {
            assert!(
                !rows.contains_key(id),
                "round {round}: uncommitted id {id} present"
            );
        }
        db.check_integrity().unwrap();
        let session = db.session();
        let next = insert_order(&db, &session).unwrap();
        let highest_burned = acked
            .iter()
            .chain(&rolled_back)
            .chain(&uncommitted)
            .max()
            .copied()
            .unwrap();
        assert!(
            next > highest_burned,
            "round {round}: identity {next} reused (highest acknowledged, rolled back or \
             handed to the open transaction {highest_burned})"
        );
        let stats = db.recovery_stats().unwrap();
        assert!(stats.records > 0, "round {round}: {stats:?}");
    }
}

/// Identity values that were handed out but never made durable by their own transaction (one
/// still open at the crash, or a DELAYED commit the crash beat to the disk) are not handed out
/// again after recovery. Every way an insert takes values is covered: a table clustered on its
/// identity (lane blocks, and a batch at the tail), a table whose identity is not its clustered
/// key (single rows, and a batch), and a descending SMALLINT identity, whose small reservations
/// make inserts log and wait for new ones often. Some rounds take a checkpoint after the values
/// were reserved and before they were handed out: its catalog must cover them, as recovery does
/// not read the log before it.
#[test]
fn identity_values_handed_out_are_not_handed_out_again_after_a_crash() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let tickets = || {
        TableDef::new("Tickets")
            .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
            .column(ColumnDef::new("Code", DataType::Int).not_null())
            .clustered(IndexDef::new(
                "PK_Tickets",
                &["Code"],
                Uniqueness::PrimaryKey,
            ))
    };
    let countdown = || {
        TableDef::new("Countdown")
            .column(ColumnDef::new("Id", DataType::SmallInt).identity(30_000, -1))
            .column(ColumnDef::new("Note", DataType::VarChar(10)))
            .clustered(IndexDef::new(
                "PK_Countdown",
                &["Id"],
                Uniqueness::PrimaryKey,
            ))
    };
    // Each table's rows to insert, given a unique number for the row.
    let row_of = |table: &str, number: i32| match table {
        "Orders" => InsertRow::new().set(1, "pending"),
        "Tickets" => InsertRow::new().set(1, number),
        _ => InsertRow::new().set(1, "note"),
    };
    let tables = ["Orders", "Tickets", "Countdown"];
    let mut number = 0;
    for round in 0..24u64 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed.wrapping_add(round)));
        let db = open(&fs);
        db.create_table(orders()).unwrap();
        db.create_table(tickets()).unwrap();
        db.create_table(countdown()).unwrap();
        // Every value handed out, per table.
        let mut handed_out: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        let mut insert = |rng: &mut StdRng,
                          number: &mut i32,
                          session: &lastpage_engine::Session,
                          table: &'static str| {
            let handle = db.table(table).unwrap();
            let ids = if rng.random_bool(0.5) {
                *number += 1;
                vec![handle.insert(session, row_of(table, *number)).unwrap()]
            } else {
                let rows = (0..rng.random_range(2..40))
                    .map(|_| {
                        *number += 1;
                        row_of(table, *number)
                    })
                    .collect();
                handle.insert_batch(session, rows).unwrap()
            };
            handed_out
                .entry(table)
                .or_default()
                .extend(ids.into_iter().map(Option::unwrap));
        };
        let committer = db.session();
        for _ in 0..rng.random_range(0..20) {
            let table = tables[rng.random_range(0..3)];
            insert(&mut rng, &mut number, &committer, table);
        }
        if round % 2 == 0 {
            db.checkpoint().unwrap();
        }
        let open_session = db.session();
        open_session.begin().unwrap();
        let delayed = db.session();
        for _ in 0..rng.random_range(1..30) {
            let table = tables[rng.random_range(0..3)];
            if rng.random_bool(0.5) {
                insert(&mut rng, &mut number, &open_session, table);
            } else {
                delayed.begin_with(Durability::Delayed).unwrap();
                insert(&mut rng, &mut number, &delayed, table);
                delayed.commit().unwrap();
            }
        }
        let mode = if round % 4 == 3 {
            CrashMode::Random
        } else {
            CrashMode::LoseUnsynced
        };
        let after = crash(&fs, mode, db, (committer, delayed), open_session);
        let db = open(&after);
        db.check_integrity().unwrap();
        let session = db.session();
        for table in tables {
            number += 1;
            let next = db
                .table(table)
                .unwrap()
                .insert(&session, row_of(table, number))
                .unwrap()
                .unwrap();
            let before = handed_out.get(table).map_or(&[][..], Vec::as_slice);
            let reused = if table == "Countdown" {
                before.iter().any(|&id| id <= next)
            } else {
                before.iter().any(|&id| id >= next)
            };
            assert!(
                !reused,
                "round {round}: {table} handed out {next} again after the crash (before it: \
                 {before:?})"
            );
        }
    }
}

/// Identity reservations cost values only across restarts of a table that had inserts: after
/// inserts, a restart skips at most one and a half reservations (15,000 BIGINT values), as SQL
/// Server's identity cache skips after an unexpected shutdown; a database opened and closed
/// without inserts keeps its counters exactly.
#[test]
fn a_restart_skips_identity_values_only_after_inserts_and_at_most_a_reservation_and_a_half() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(21));
    let db = open(&fs);
    db.create_table(orders()).unwrap();
    let session = db.session();
    let first = insert_order(&db, &session).unwrap();
    drop(session);
    db.close().unwrap();
    let next = open(&fs).table("Orders").unwrap().next_identity().unwrap();
    assert!(
        next > first && next <= first + 15_001,
        "after inserting {first} a restart starts at {next}"
    );
    for _ in 0..3 {
        let db = open(&fs);
        assert_eq!(db.table("Orders").unwrap().next_identity(), Some(next));
        db.close().unwrap();
    }
    let db = open(&fs);
    let session = db.session();
    assert_eq!(insert_order(&db, &session).unwrap(), next);
}

/// A fast load stops waiting for identity reservations: each wait for one appended ahead
/// doubles the reservation. With DELAYED commits and no background flush, only those waits
/// flush the log, so the log's flushes count them: 200 batches of 1,000 INT values wait nine
/// times (the reservation grows from 1,000 values to 512,000), where a fixed size would wait
/// 100 times (once per two batches).
#[test]
fn identity_reservations_grow_until_a_fast_load_stops_waiting_for_them() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(23));
    let db = open_delayed(&fs);
    let table = db
        .create_table(
            TableDef::new("Events")
                .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("Kind", DataType::TinyInt).not_null())
                .clustered(IndexDef::new("PK_Events", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let flushes_before = db.wal_stats().unwrap().flushes;
    for _ in 0..200 {
        let rows = (0..1000).map(|_| InsertRow::new().set(1, 1)).collect();
        table.insert_batch(&session, rows).unwrap();
    }
    let flushes = db.wal_stats().unwrap().flushes - flushes_before;
    assert!(
        (1..=12).contains(&flushes),
        "200,000 values waited for {flushes} flushes of identity reservations"
    );
}

/// Dropped tables stay dropped after a crash, whether the drop is only in the log or also in
/// a checkpoint's image, and a table created under a dropped one's name afterwards comes back
/// with its own rows only. A write through a handle of the dropped table kept from before is
/// refused and leaves nothing in the log for recovery to apply.
#[test]
fn a_dropped_table_stays_dropped_after_a_crash_and_its_name_can_be_reused() {
    for checkpoint_after_drop in [false, true] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(11));
        let db = open(&fs);
        let old = db.create_table(orders()).unwrap();
        let gone = db.create_table(accounts()).unwrap();
        let session = db.session();
        for id in 0..50 {
            old.insert(&session, InsertRow::new().set(1, "old"))
                .unwrap();
            gone.insert(&session, InsertRow::new().set(0, id).set(1, id))
                .unwrap();
        }
        db.checkpoint().unwrap();
        db.drop_table("Accounts").unwrap();
        for _ in 0..50 {
            old.insert(&session, InsertRow::new().set(1, "old"))
                .unwrap();
        }
        db.drop_table("Orders").unwrap();
        assert!(matches!(
            old.insert(&session, InsertRow::new().set(1, "lost")),
            Err(EngineError::UnknownTable(_))
        ));
        let new = db.create_table(orders()).unwrap();
        for _ in 0..3 {
            new.insert(&session, InsertRow::new().set(1, "new"))
                .unwrap();
        }
        if checkpoint_after_drop {
            db.checkpoint().unwrap();
        }
        let after = crash(
            &fs,
            CrashMode::LoseUnsynced,
            db,
            (old, gone, new, session),
            (),
        );
        let db = open(&after);
        assert!(
            matches!(db.table("Accounts"), Err(EngineError::UnknownTable(_))),
            "checkpoint after the drop: {checkpoint_after_drop}"
        );
        let rows = orders_rows(&db);
        assert_eq!(
            rows.values().collect::<Vec<_>>(),
            vec!["new", "new", "new"],
            "checkpoint after the drop: {checkpoint_after_drop}"
        );
        assert_eq!(db.tables().len(), 1);
        db.check_integrity().unwrap();
    }
}

#[test]
fn recovery_replays_updates_deletes_and_undoes_losers_over_a_checkpoint() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(7));
    let db = open(&fs);
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    for id in 0..100 {
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, 1000))
            .unwrap();
    }
    // A loser whose changes straddle the checkpoint: some are in the image, some only logged.
    let loser = db.session();
    loser.begin().unwrap();
    table
        .update(&loser, &[Value::Int(1)], &[(1, Value::Int(-1))])
        .unwrap();
    table.delete(&loser, &[Value::Int(2)]).unwrap();
    // Changes to one row that must be undone newest first: two updates of a row, and an insert
    // and then an update of a new row.
    for balance in [-4, -44] {
        table
            .update(&loser, &[Value::Int(4)], &[(1, Value::Int(balance))])
            .unwrap();
    }
    table
        .insert(&loser, InsertRow::new().set(0, 600).set(1, 6))
        .unwrap();
    table
        .update(&loser, &[Value::Int(600)], &[(1, Value::Int(66))])
        .unwrap();
    db.checkpoint().unwrap();
    table
        .update(&loser, &[Value::Int(3)], &[(1, Value::Int(-3))])
        .unwrap();
    table
        .insert(&loser, InsertRow::new().set(0, 500).set(1, 5))
        .unwrap();
    // Committed work after the checkpoint.
    table
        .update(&session, &[Value::Int(10)], &[(1, Value::Int(10))])
        .unwrap();
    table.delete(&session, &[Value::Int(11)]).unwrap();
    // A key change moves the row.
    table
        .update(&session, &[Value::Int(12)], &[(0, Value::Int(612))])
        .unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), loser);
    let db = open(&after);
    let table = db.table("Accounts").unwrap();
    let session = db.session();
    let balance = |id: i32| {
        table
            .get(&session, &[Value::Int(id)])
            .unwrap()
            .map(|row| row[1].clone())
    };
    assert_eq!(
        balance(1),
        Some(Value::Int(1000)),
        "loser update in the image undone"
    );
    assert_eq!(
        balance(2),
        Some(Value::Int(1000)),
        "loser delete in the image undone"
    );
    assert_eq!(
        balance(3),
        Some(Value::Int(1000)),
        "loser update after it never applied"
    );
    assert_eq!(balance(500), None, "loser insert never applied");
    assert_eq!(
        balance(4),
        Some(Value::Int(1000)),
        "two loser updates in the image undone, newest first"
    );
    assert_eq!(
        balance(600),
        None,
        "a loser insert and its update in the image undone"
    );
    assert_eq!(balance(10), Some(Value::Int(10)));
    assert_eq!(balance(11), None);
    assert_eq!(balance(12), None);
    assert_eq!(balance(612), Some(Value::Int(1000)));
    assert_eq!(table.row_count(), 99);
    db.check_integrity().unwrap();
}

#[test]
fn a_failed_fsync_is_never_acknowledged_and_stops_the_database() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    let db = open(&fs);
    db.create_table(orders()).unwrap();
    let session = db.session();
    let before = insert_orders(&db, &session, 10);
    fs.inject(FaultRule::syncs_fail_from(1));
    let error = insert_order(&db, &session).unwrap_err();
    assert!(
        matches!(error, EngineError::LogFailed(_)),
        "a failed fsync must fail the commit: {error}"
    );
    assert!(error.to_string().contains("fsync") || error.to_string().contains("sync"));
    let refused = insert_order(&db, &session).unwrap_err();
    assert!(
        matches!(refused, EngineError::DatabaseFailed(_)),
        "{refused}"
    );
    assert!(
        db.table("Orders")
            .unwrap()
            .get(&session, &[Value::BigInt(1)])
            .is_err()
    );
    let after = crash(&fs, CrashMode::LoseUnsynced, db, session, ());
    assert_orders_survived(&after, &before);
}

/// A checkpoint that cannot sync the data file stops the database: no later checkpoint could
/// be trusted, so the log could never be truncated again and a close could not write its clean
/// image. Every commit acknowledged before is recovered from the log at the next open, over the
/// last good image. Before, commits went on, every later checkpoint (automatic ones too, every
/// 100 ms) was refused, and only `close` failed. A write that fails for want of room, of the
/// pages ahead of the image or of the image's page map, fails only that checkpoint: the
/// database goes on, and the next checkpoint, once there is room, succeeds. (Before, a full disk
/// during the image also refused every later checkpoint.)
#[test]
fn a_checkpoint_that_cannot_sync_the_data_file_stops_the_database_and_a_full_disk_only_fails_it() {
    let data_file = Path::new(DIR).join(DATA_FILE_NAME);
    for (what, rule, stops) in [
        ("a failed fdatasync", FaultRule::syncs_fail_from(1), true),
        (
            "a full disk for the image",
            FaultRule::disk_full_after(0),
            false,
        ),
        (
            "a full disk for the pages",
            FaultRule::disk_full_after(0),
            false,
        ),
    ] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(21));
        let db = open(&fs);
        db.create_table(orders()).unwrap();
        let session = db.session();
        let mut acknowledged = insert_orders(&db, &session, 50);
        db.checkpoint().unwrap();
        acknowledged.extend(insert_orders(&db, &session, 50));
        if what == "a full disk for the image" {
            // Written ahead, so that the checkpoint's first write is its image's.
            db.pool().write_dirty_pages().unwrap();
        }
        fs.inject(rule.on_path(&data_file));
        let error = db.checkpoint().unwrap_err();
        if stops {
            assert!(
                matches!(error, EngineError::DatabaseFailed(_))
                    && error.to_string().contains("data file"),
                "{what}: {error}"
            );
            let refused = insert_order(&db, &session).unwrap_err();
            assert!(
                matches!(refused, EngineError::DatabaseFailed(_)),
                "{what}: a commit after the failed checkpoint: {refused}"
            );
            assert!(db.clone().close().is_err(), "{what}: the close");
        } else {
            let at = if what == "a full disk for the image" {
                "page map"
            } else {
                "writing slot"
            };
            assert!(
                matches!(error, EngineError::Storage(_)) && error.to_string().contains(at),
                "{what}: {error}"
            );
            acknowledged.push(insert_order(&db, &session).unwrap());
            fs.clear_faults();
            db.checkpoint().unwrap();
            acknowledged.push(insert_order(&db, &session).unwrap());
        }
        fs.clear_faults();
        let after = crash(&fs, CrashMode::LoseUnsynced, db, session, ());
        assert_orders_survived(&after, &acknowledged);
        // The reopened database checkpoints again.
        let db = open(&after);
        db.checkpoint().unwrap();
        assert_eq!(orders_rows(&db).len(), acknowledged.len(), "{what}");
    }
}

/// A checkpoint whose fdatasync of the data file fails after the log was flushed up to its
/// capture (the sync of the image's pages, of its page map, or of its meta slot) stops the
/// database and removes no log: the previous image stays the one an open trusts (or, if the
/// meta slot reached the disk all the same, the new one, whose log is there too), and every
/// acknowledged commit since the previous image is only in the log. A checkpoint that went on
/// to truncate the log would lose them. The crash keeps or loses whatever was not synced.
#[test]
fn a_checkpoint_whose_image_cannot_be_synced_stops_the_database_and_removes_no_log() {
    let data_file = Path::new(DIR).join(DATA_FILE_NAME);
    for (nth, what) in [(1, "pages"), (2, "page map"), (3, "meta slot")] {
        for mode in [CrashMode::LoseUnsynced, CrashMode::KeepUnsynced] {
            let (fs, db, table, session) = ten_thousand_orders(43);
            let rows = orders_of_80_bytes();
            // Written and synced ahead, so that the checkpoint writes no page before its
            // capture: its first three fdatasyncs of the data file are then its image's.
            db.pool().write_dirty_pages().unwrap();
            let segments = log_segments(&fs);
            assert!(segments > 2, "{segments} log segments: none to remove");
            fs.inject(FaultRule::sync_fails(nth).on_path(&data_file));
            let error = db.checkpoint().unwrap_err();
            assert!(
                matches!(error, EngineError::DatabaseFailed(_)) && error.to_string().contains(what),
                "{what}: {error}"
            );
            assert_eq!(
                log_segments(&fs),
                segments,
                "{what}: the failed checkpoint removed log"
            );
            let refused = table
                .insert_batch(&session, rows[..1].to_vec())
                .unwrap_err();
            assert!(
                matches!(refused, EngineError::DatabaseFailed(_)),
                "{what}: a commit after the failed checkpoint: {refused}"
            );
            let after = crash(&fs, mode, db, (session, table), ());
            let db = open(&after);
            assert_eq!(orders_rows(&db).len(), 10_000, "{what}, {mode:?}");
            db.check_integrity().unwrap();
        }
    }
}

/// [`options`] with a buffer pool of 64 pages.
fn small_budget(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        memory_budget_bytes: 64 * 8192,
        ..options(fs)
    }
}

/// Opens `fs` with [`small_budget`].
fn open_small(fs: &FaultyFileSystem) -> Database {
    Database::open(DIR, small_budget(fs)).unwrap()
}

/// Inserts 20,000 rows of about 100 bytes into `Orders`, 200 per statement: far more than a
/// [`small_budget`] pool holds, so pages are evicted (checked).
fn insert_orders_past_the_budget(
    db: &Database,
    table: &Arc<lastpage_engine::Table>,
    session: &lastpage_engine::Session,
) {
    let rows: Vec<InsertRow> = (0..200)
        .map(|_| InsertRow::new().set(1, "x".repeat(90)))
        .collect();
    for _ in 0..100 {
        table.insert_batch(session, rows.clone()).unwrap();
    }
    let pool = db.pool().stats();
    assert!(pool.evictions > 0, "{pool:?}");
}

#[test]
fn a_database_larger_than_its_memory_budget_works_and_survives_reopening() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(11));
    let db = open_small(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    insert_orders_past_the_budget(&db, &table, &session);
    assert_eq!(table.row_count(), 20_000);
    let pool = db.pool().stats();
    assert!(pool.resident <= 64 + 64, "{pool:?}");
    db.check_integrity().unwrap();
    let scanned = table
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .unwrap()
        .count();
    assert_eq!(scanned, 20_000);
    drop(session);
    drop(table);
    drop(db);
    let after = fs.crash_with(CrashMode::LoseUnsynced);
    let db = open_small(&after);
    assert_eq!(orders_rows(&db).len(), 20_000);
    db.check_integrity().unwrap();
}

#[test]
fn multi_row_statements_are_logged_as_runs_per_partition_and_recovered() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(13));
    let db = open(&fs);
    let table = db
        .create_table(
            TableDef::new("Orders")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .column(ColumnDef::new("Part", DataType::TinyInt).not_null())
                .clustered(IndexDef::new(
                    "PK_Orders",
                    &["Part", "Id"],
                    Uniqueness::PrimaryKey,
                ))
                .partitioned("Part", 4),
        )
        .unwrap();
    let session = db.session();
    let batch = |tag: &str, count: usize| -> Vec<InsertRow> {
        (0..count)
            .map(|i| {
                InsertRow::new()
                    .set(1, format!("{tag}{i:088}"))
                    .set(2, (i % 4) as i32)
            })
            .collect()
    };
    // 3,000 rows of about 100 bytes in one statement: about 75 KB per partition, so each
    // partition's rows take two runs of at most 64 KiB.
    let records_before = db.wal_stats().unwrap().appended_records;
    table.insert_batch(&session, batch("c", 3000)).unwrap();
    let records = db.wal_stats().unwrap().appended_records - records_before;
    assert!(
        (8..=12).contains(&records),
        "3,000 rows in 4 partitions took {records} log records"
    );
    // A rolled-back multi-row statement, and one of a transaction still open at the crash.
    session.begin().unwrap();
    table.insert_batch(&session, batch("r", 500)).unwrap();
    session.rollback().unwrap();
    let loser = db.session();
    loser.begin().unwrap();
    table.insert_batch(&loser, batch("l", 500)).unwrap();
    // A later commit makes the loser's records durable too.
    table
        .insert(&session, InsertRow::new().set(1, "pending").set(2, 0))
        .unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), loser);
    let db = open(&after);
    let table = db.table("Orders").unwrap();
    let session = db.session();
    let mut payloads = Vec::new();
    for row in table
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .unwrap()
    {
        let row = row.unwrap();
        let Value::String(text) = &row[1] else {
            panic!("payload {:?}", row[1])
        };
        payloads.push(text.clone());
    }
    assert_eq!(payloads.len(), 3001);
    let committed: BTreeSet<String> = payloads
        .into_iter()
        .filter(|p| p.starts_with('c'))
        .collect();
    assert_eq!(committed.len(), 3000, "every committed row once");
    assert!(committed.contains(&format!("c{:088}", 2999)));
    db.check_integrity().unwrap();
}

#[test]
fn insert_runs_are_split_to_fit_a_small_log_buffer() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(17));
    // The smallest buffer the engine accepts: one that holds the largest row change.
    let buffer_bytes = WAL_ROW_CHANGE_MAX_BYTES;
    let small = DatabaseOptions {
        wal: WalConfig {
            buffer_bytes,
            segment_bytes: 256 << 10,
            ..WalConfig::default()
        },
        ..options(&fs)
    };
    let db = Database::open(DIR, small.clone()).unwrap();
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    // Rows of about 115 bytes of log each: a run may hold at most the buffer less a header
    // (about 210 rows), so the statement takes a dozen or so runs.
    let count = 12 * (buffer_bytes / 115);
    let rows: Vec<InsertRow> = (0..count)
        .map(|i| InsertRow::new().set(1, format!("{i:090}")))
        .collect();
    let records_before = db.wal_stats().unwrap().appended_records;
    table.insert_batch(&session, rows).unwrap();
    let records = db.wal_stats().unwrap().appended_records - records_before;
    assert!(
        (12..=20).contains(&records),
        "{count} rows took {records} records"
    );
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = Database::open(
        DIR,
        DatabaseOptions {
            file_system: Some(Arc::new(after.clone())),
            ..small
        },
    )
    .unwrap();
    let rows = orders_rows(&db);
    assert_eq!(rows.len(), count);
    assert_eq!(
        rows.get(&(count as i64)).map(String::as_str),
        Some(format!("{:090}", count - 1).as_str())
    );
    db.check_integrity().unwrap();
}

/// A log buffer too small for the largest row change is refused when the database is opened:
/// a change it could not log would have to fail the whole database; so is a DELAYED flush
/// interval of zero. A table definition too
/// large for one log record fails its CREATE TABLE alone.
#[test]
fn a_log_too_small_for_a_row_change_is_refused_and_an_oversized_definition_fails_alone() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(29));
    let tiny = DatabaseOptions {
        wal: WalConfig {
            buffer_bytes: WAL_ROW_CHANGE_MAX_BYTES - 8,
            ..WalConfig::default()
        },
        ..options(&fs)
    };
    let error = Database::open(DIR, tiny).err().expect("refused");
    assert!(error.to_string().contains("largest row change"), "{error}");
    // A DELAYED flush interval of zero would make the background flusher spin.
    let spinning = DatabaseOptions {
        delayed_flush_interval: Duration::ZERO,
        ..options(&fs)
    };
    let error = Database::open(DIR, spinning).err().expect("refused");
    assert!(error.to_string().contains("longer than zero"), "{error}");

    let db = open(&fs);
    let huge_name = "N".repeat(2 << 20);
    let error = db
        .create_table(TableDef::new(&huge_name).column(ColumnDef::new("V", DataType::Int)))
        .expect_err("an oversized definition is refused");
    assert!(
        matches!(&error, EngineError::InvalidDefinition { reason, .. } if reason.contains("log record")),
        "{error}"
    );
    // The database goes on: the refused statement logged nothing and failed nothing.
    let table = db.create_table(orders()).unwrap();
    insert_order(&db, &db.session()).unwrap();
    assert_eq!(table.row_count(), 1);
    db.checkpoint().unwrap();
}

/// Replay puts each logged batch's rows into the tree as one batch: the rows all come back,
/// in key order, and the leaves are as full as the load left them (an ascending load fills its
/// leaves; a replay that split them in halves would need about twice the pages).
#[test]
fn replayed_batches_come_back_whole_with_leaves_as_full_as_the_load_left_them() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(11));
    let db = open(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    for batch in 0..40 {
        let rows: Vec<InsertRow> = (0..250)
            .map(|i| InsertRow::new().set(1, format!("{batch:03}-{i:096}")))
            .collect();
        table.insert_batch(&session, rows).unwrap();
    }
    let leaves = |db: &Database| {
        let check = db.check_integrity().unwrap();
        let (_, tree) = &check[0].indexes[0];
        (tree.rows, tree.leaf_pages, tree.leaf_fill)
    };
    let (rows_before, leaves_before, fill_before) = leaves(&db);
    assert_eq!(rows_before, 10_000);
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open(&after);
    let (rows_after, leaves_after, fill_after) = leaves(&db);
    assert_eq!(rows_after, 10_000);
    assert!(
        leaves_after <= leaves_before + leaves_before / 20 && fill_after >= fill_before * 0.95,
        "replay left {leaves_after} leaves {fill_after:.3} full, the load {leaves_before} \
         leaves {fill_before:.3} full"
    );
    let rows = orders_rows(&db);
    for (position, (id, payload)) in rows.iter().enumerate() {
        assert_eq!(*id, position as i64 + 1);
        let (batch, row) = (position / 250, position % 250);
        assert_eq!(payload, &format!("{batch:03}-{row:096}"));
    }
}

/// A database whose checkpoint lands exactly on a log segment boundary opens again: the
/// checkpoint's log truncation kept only the last segment, whose first record starts in the
/// segment before, and the next open refused the log as damaged.
#[test]
fn a_database_reopens_after_a_checkpoint_at_a_log_segment_boundary() {
    const SEGMENT: u64 = 4096;
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    let options = || DatabaseOptions {
        wal: WalConfig {
            segment_bytes: SEGMENT,
            prepare_segments: false,
            ..options(&fs).wal
        },
        ..options(&fs)
    };
    let db = Database::open(DIR, options()).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    let mut at_boundary = None;
    for id in 0..5_000 {
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, id % 61))
            .unwrap();
        let stats = db.checkpoint().unwrap();
        if stats.checkpoint_lsn.is_multiple_of(SEGMENT) && stats.checkpoint_lsn >= 3 * SEGMENT {
            at_boundary = Some((id, stats));
            break;
        }
    }
    let (last, stats) = at_boundary.expect("no checkpoint at a segment boundary");
    drop((table, session));
    drop(db);
    let db = Database::open(DIR, options())
        .unwrap_or_else(|error| panic!("no open after {stats:?}: {error}"));
    assert_eq!(db.table("Accounts").unwrap().row_count(), last as u64 + 1);
}

#[test]
fn checkpoints_remove_old_log_and_bound_recovery() {
    let (fs, db, table, session) = ten_thousand_orders(5);
    let rows = orders_of_80_bytes();
    let stats = db.checkpoint().unwrap();
    assert!(stats.segments_removed > 0, "{stats:?}");
    table.insert_batch(&session, rows[..10].to_vec()).unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open(&after);
    let recovery = db.recovery_stats().unwrap();
    assert!(
        recovery.log_bytes < 64 << 10,
        "recovery read {} bytes of log after a checkpoint",
        recovery.log_bytes
    );
    assert_eq!(orders_rows(&db).len(), 10_010);
}

/// A file system whose removals and renames of log segments fail while `fail` is set: a
/// truncation of the log after a checkpoint that cannot get rid of a single old segment.
#[derive(Debug)]
struct SegmentRemovalsFail {
    inner: FaultyFileSystem,
    fail: Arc<AtomicBool>,
}

impl SegmentRemovalsFail {
    fn refuse(&self, path: &Path) -> std::io::Result<()> {
        if self.fail.load(Ordering::Relaxed)
            && path.extension().is_some_and(|extension| extension == "wal")
        {
            return Err(std::io::Error::other("removal refused by the test"));
        }
        Ok(())
    }
}

impl FileSystem for SegmentRemovalsFail {
    fn open(
        &self,
        path: &Path,
        options: OpenOptions,
    ) -> std::io::Result<Box<dyn lastpage_io::File>> {
        self.inner.open(path, options)
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.refuse(path)?;
        self.inner.remove(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.refuse(from)?;
        self.inner.rename(from, to)
    }

    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        self.inner.exists(path)
    }

    fn link_count(&self, path: &Path) -> std::io::Result<u64> {
        self.inner.link_count(path)
    }

    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        self.inner.list_dir(path)
    }

    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(path)
    }
}

/// How many log segment files `fs` holds.
fn log_segments(fs: &FaultyFileSystem) -> usize {
    fs.list_dir(&Path::new(DIR).join(WAL_DIR_NAME))
        .unwrap()
        .iter()
        .filter(|path| path.extension().is_some_and(|extension| extension == "wal"))
        .count()
}

/// A checkpoint whose truncation of the log fails (no old segment can be removed or kept as a
/// spare) is durable all the same, so it succeeds: CHECKPOINT, the automatic checkpointer, an
/// open's checkpoint and a close report no error, but the checkpoint's statistics and
/// `Database::log_truncation_failure` say what failed (and how many checkpoints in a row), the
/// database goes on, an open with every old segment still there recovers from that checkpoint
/// (reading none of them), and the next checkpoint removes them. Before, each of those
/// returned an error although its image was durable: an open's failed, and so did a close,
/// which left a caller no way to tell a clean shutdown from a failed one.
#[test]
fn a_checkpoint_whose_log_truncation_fails_succeeds_reports_it_and_is_truncated_later() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(43));
    let fail = Arc::new(AtomicBool::new(false));
    let options_on = |fs: &FaultyFileSystem| DatabaseOptions {
        file_system: Some(Arc::new(SegmentRemovalsFail {
            inner: fs.clone(),
            fail: Arc::clone(&fail),
        })),
        ..options(fs)
    };
    let db = Database::open(DIR, options_on(&fs)).unwrap();
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let rows = orders_of_80_bytes();
    for _ in 0..20 {
        table.insert_batch(&session, rows.clone()).unwrap();
    }
    let segments = log_segments(&fs);
    assert!(segments > 3, "{segments} segments");
    assert_eq!(db.log_truncation_failure(), None);
    fail.store(true, Ordering::Relaxed);
    let stats = db.checkpoint().unwrap();
    println!("{stats:?}");
    assert_eq!(stats.segments_removed, 0, "{stats:?}");
    let error = stats.log_truncation_error.expect("the failure is reported");
    assert!(error.contains("removal refused by the test"), "{error}");
    assert_eq!(log_segments(&fs), segments, "a segment was removed");
    assert_eq!(
        db.log_truncation_failure().map(|(failures, _)| failures),
        Some(1)
    );
    // The database goes on, and so do checkpoints that fail the same way, counted in a row.
    table.insert_batch(&session, rows[..10].to_vec()).unwrap();
    let stats = db.checkpoint().unwrap();
    assert!(stats.log_truncation_error.is_some(), "{stats:?}");
    let (failures, error) = db.log_truncation_failure().unwrap();
    assert_eq!(failures, 2, "{error}");
    table.insert_batch(&session, rows[..10].to_vec()).unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    assert!(log_segments(&after) >= segments);
    // The open replays the log after the checkpoint and takes a checkpoint of its own, whose
    // removal of old log fails too: the open succeeds and says so.
    let db = Database::open(DIR, options_on(&after)).unwrap();
    assert!(log_segments(&after) >= segments);
    let recovery = db.recovery_stats().unwrap();
    assert!(
        recovery.log_bytes < 64 << 10,
        "recovery read {} bytes of log after a checkpoint",
        recovery.log_bytes
    );
    assert_eq!(orders_rows(&db).len(), 10_020);
    assert_eq!(
        db.log_truncation_failure().map(|(failures, _)| failures),
        Some(1)
    );
    // So does a close, whose image is durable and clean: the next open replays nothing.
    db.close().unwrap();
    let db = Database::open(
        DIR,
        DatabaseOptions {
            checkpoint_log_bytes: 16 << 10,
            ..options_on(&after)
        },
    )
    .unwrap();
    let recovery = db.recovery_stats().unwrap();
    assert_eq!(recovery.records, 0, "{recovery:?}");
    assert!(log_segments(&after) >= segments);
    // The automatic checkpointer's attempts succeed too (nothing in
    // `automatic_checkpoint_failure`) and count in `log_truncation_failure`.
    let table = db.table("Orders").unwrap();
    let session = db.session();
    let before = db.log_truncation_failure().unwrap().0;
    table.insert_batch(&session, rows.clone()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while db.log_truncation_failure().unwrap().0 == before {
        assert!(
            std::time::Instant::now() < deadline,
            "no automatic checkpoint ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(db.automatic_checkpoint_failure(), None);
    // Once removals work again, the next checkpoint catches up with the truncation and clears
    // the failure.
    fail.store(false, Ordering::Relaxed);
    let stats = db.checkpoint().unwrap();
    assert!(stats.segments_removed >= segments - 2, "{stats:?}");
    assert_eq!(stats.log_truncation_error, None);
    assert_eq!(db.log_truncation_failure(), None);
    assert!(
        log_segments(&after) <= 2,
        "{} segments",
        log_segments(&after)
    );
    table.insert_batch(&session, rows[..10].to_vec()).unwrap();
    let again = crash(&after, CrashMode::LoseUnsynced, db, (session, table), ());
    assert_eq!(orders_rows(&open(&again)).len(), 10_530);
}

#[test]
fn statements_are_atomic_inside_transactions() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(9));
    let db = open(&fs);
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    session.begin().unwrap();
    table
        .insert(&session, InsertRow::new().set(0, 1).set(1, 1))
        .unwrap();
    let batch = vec![
        InsertRow::new().set(0, 2).set(1, 2),
        InsertRow::new().set(0, 1).set(1, 9),
    ];
    let error = table.insert_batch(&session, batch).unwrap_err();
    assert!(matches!(error, EngineError::DuplicateKey { .. }), "{error}");
    assert_eq!(table.get(&session, &[Value::Int(2)]).unwrap(), None);
    session.commit().unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open(&after);
    let table = db.table("Accounts").unwrap();
    let session = db.session();
    assert!(table.get(&session, &[Value::Int(1)]).unwrap().is_some());
    assert_eq!(table.get(&session, &[Value::Int(2)]).unwrap(), None);
    assert_eq!(table.row_count(), 1);
}

/// A statement that fails part way takes back the rows it had put in before it returns its
/// error: they are in neither the log nor the transaction's undo list yet. If that take-back
/// fails too (here: the batch's early rows were evicted, and the data file can no longer be
/// read), those rows stay in the trees with nothing to undo them, where readers would see them
/// and a checkpoint would write them into the image. The database stops, as after a failed
/// rollback, and its next open has only what committed.
#[test]
fn a_statement_that_cannot_take_back_its_own_rows_stops_the_database() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(37));
    let db = open_small(&fs);
    let table = db.create_table(notes()).unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(0, 0).set(1, "committed"))
        .unwrap();
    // 20,000 rows of about 100 bytes fill far more pages than the pool's 64, and the last row
    // repeats the first row's key, so the statement fails after all the others are in.
    let mut batch: Vec<InsertRow> = (1..=20_000)
        .map(|id| InsertRow::new().set(0, id).set(1, "x".repeat(90)))
        .collect();
    batch.push(InsertRow::new().set(0, 1).set(1, "again"));
    let evictions = db.pool().stats().evictions;
    fs.inject(FaultRule::reads_fail_from(1).on_path(Path::new(DIR).join(DATA_FILE_NAME)));
    let error = table.insert_batch(&session, batch).unwrap_err();
    assert!(db.pool().stats().evictions > evictions);
    assert!(matches!(error, EngineError::DatabaseFailed(_)), "{error}");
    assert!(error.to_string().contains("taking back"), "{error}");
    assert!(error.to_string().contains("Notes"), "{error}");
    fs.clear_faults();
    // Whatever the take-back left in the trees never committed: nothing may read it or build
    // on it, and no checkpoint may write it into the image.
    let refused = table
        .insert(&session, InsertRow::new().set(0, 30_000).set(1, "later"))
        .unwrap_err();
    assert!(
        matches!(refused, EngineError::DatabaseFailed(_)),
        "{refused}"
    );
    assert!(table.get(&session, &[Value::Int(0)]).is_err());
    assert!(db.checkpoint().is_err());
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open_small(&after);
    let table = db.table("Notes").unwrap();
    let session = db.session();
    let ids: Vec<Value> = table
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .unwrap()
        .map(|row| row.unwrap()[0].clone())
        .collect();
    assert_eq!(ids, vec![Value::Int(0)]);
    db.check_integrity().unwrap();
}

/// Opens `fs` with [`small_budget`] and fills `Accounts` (with `IX_Balance`) with 40,000 rows
/// whose balance is their id: far more pages than the pool holds (checked). Then reads row 20
/// and looks up balance 1,000,000, so that those pages are resident and only long-evicted pages
/// (IX_Balance's entry of row 20 among them) need the data file.
fn accounts_past_the_budget(
    fs: &FaultyFileSystem,
) -> (
    Database,
    Arc<lastpage_engine::Table>,
    lastpage_engine::Session,
) {
    let db = open_small(fs);
    let table = db.create_table(accounts_by_balance()).unwrap();
    let session = db.session();
    for first in (0..40_000).step_by(500) {
        let rows = (first..first + 500)
            .map(|id| InsertRow::new().set(0, id).set(1, id))
            .collect();
        table.insert_batch(&session, rows).unwrap();
    }
    assert!(db.pool().stats().evictions > 0);
    let row = vec![Value::Int(20), Value::Int(20)];
    assert_eq!(table.get(&session, &[Value::Int(20)]).unwrap(), Some(row));
    assert!(
        table
            .get_by_index(&session, "IX_Balance", &[Value::Int(1_000_000)])
            .unwrap()
            .is_empty()
    );
    (db, table, session)
}

/// Crashes `fs` (losing unsynced writes), reopens it and checks that row 20 of `Accounts` is
/// there as it committed, found by its key and by its balance, and that the trees are whole.
fn assert_account_20_as_committed(fs: &FaultyFileSystem, db: Database, held: impl Sized) {
    let after = crash(fs, CrashMode::LoseUnsynced, db, held, ());
    let db = open_small(&after);
    let table = db.table("Accounts").unwrap();
    let session = db.session();
    let row = vec![Value::Int(20), Value::Int(20)];
    assert_eq!(
        table.get(&session, &[Value::Int(20)]).unwrap(),
        Some(row.clone())
    );
    let by_balance = table
        .get_by_index(&session, "IX_Balance", &[Value::Int(20)])
        .unwrap();
    assert_eq!(by_balance, vec![row]);
    assert!(
        table
            .get_by_index(&session, "IX_Balance", &[Value::Int(1_000_000)])
            .unwrap()
            .is_empty()
    );
    db.check_integrity().unwrap();
}

/// An update that moves a row's nonclustered entry inserts the new entry and changes the row
/// before it removes the old entry. If that removal fails (here: the old entry's page was
/// evicted, and the data file can no longer be read), the old entry would find the row under a
/// value it no longer has, and nothing (no log record, no undo entry) could take the half
/// change back: the database stops, and its next open has the row as it committed.
#[test]
fn an_update_that_cannot_remove_the_old_index_entry_stops_the_database() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(41));
    let (db, table, session) = accounts_past_the_budget(&fs);
    fs.inject(FaultRule::reads_fail_from(1).on_path(Path::new(DIR).join(DATA_FILE_NAME)));
    let error = table
        .update(&session, &[Value::Int(20)], &[(1, Value::Int(1_000_000))])
        .unwrap_err();
    assert!(matches!(error, EngineError::DatabaseFailed(_)), "{error}");
    assert!(error.to_string().contains("IX_Balance"), "{error}");
    fs.clear_faults();
    assert!(
        table
            .get_by_index(&session, "IX_Balance", &[Value::Int(20)])
            .is_err()
    );
    assert_account_20_as_committed(&fs, db, (session, table));
}

/// A delete removes the row, then its nonclustered entries. If removing an entry fails (its
/// page was evicted and cannot be read), the entry would point at no row: the database stops,
/// as above, and its next open has the row as it committed.
#[test]
fn a_delete_that_cannot_remove_an_index_entry_stops_the_database() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(43));
    let (db, table, session) = accounts_past_the_budget(&fs);
    fs.inject(FaultRule::reads_fail_from(1).on_path(Path::new(DIR).join(DATA_FILE_NAME)));
    let error = table.delete(&session, &[Value::Int(20)]).unwrap_err();
    assert!(matches!(error, EngineError::DatabaseFailed(_)), "{error}");
    assert!(error.to_string().contains("IX_Balance"), "{error}");
    fs.clear_faults();
    assert!(table.get(&session, &[Value::Int(20)]).is_err());
    assert_account_20_as_committed(&fs, db, (session, table));
}

/// A failed log fdatasync stops the database, and the commit that waited for it is refused.
/// The kernel may keep the pages it could not write in its cache, readable but marked clean
/// (fsyncgate; the faulty file system does for some seeds), so a restart without a power loss
/// reads the refused commit as log. Commits acknowledged after that restart must survive a
/// later power loss: the reopened log wrote the read bytes again and synced them (they were
/// left in the cache, and a power loss cut the log before those commits).
#[test]
fn commits_acknowledged_after_a_restart_that_followed_a_failed_fsync_survive_power_loss() {
    let segment = Path::new(DIR).join("wal/0000000000000000.wal");
    let mut checked = 0;
    for seed in 0..64u64 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
        let db = open(&fs);
        let table = db.create_table(accounts()).unwrap();
        let session = db.session();
        for id in 1..=10 {
            table
                .insert(&session, InsertRow::new().set(0, id).set(1, id))
                .unwrap();
        }
        fs.inject(FaultRule::sync_fails(1).on_path(&segment));
        let error = table
            .insert(&session, InsertRow::new().set(0, 11).set(1, 11))
            .unwrap_err();
        assert!(matches!(error, EngineError::LogFailed(_)), "{error}");
        fs.clear_faults();
        if fs.contents(&segment) == fs.durable_contents(&segment) {
            // This seed's failed fsync kept the pages dirty: nothing to show.
            continue;
        }
        checked += 1;
        drop((session, table));
        drop(db);
        let db = open(&fs);
        let table = db.table("Accounts").unwrap();
        let session = db.session();
        table
            .insert(&session, InsertRow::new().set(0, 12).set(1, 12))
            .unwrap();
        let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
        let db = open(&after);
        let table = db.table("Accounts").unwrap();
        let session = db.session();
        for id in (1..=10).chain([12]) {
            assert!(
                table.get(&session, &[Value::Int(id)]).unwrap().is_some(),
                "seed {seed}: acknowledged row {id} lost"
            );
        }
    }
    assert!(checked > 0, "no seed dropped the pages of the failed fsync");
}

/// The identity values one session takes ascend without gaps (on sequence lanes, a session
/// continues its block on the last leaf), also right after a reopen and after a split in the
/// middle of the last leaf (rows that grew). In both cases the tree's hint of its last leaf
/// was stale (the root, or the left half of the split) until an append split fixed it, so the
/// session started a new block for every row until the leaf filled: about 74 values were
/// skipped per insert. The hint is now found again by a descent when it is stale.
#[test]
fn one_session_takes_identity_values_without_gaps_after_a_reopen_or_a_split_in_the_middle() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let db = open(&fs);
    let table = db
        .create_table(
            TableDef::new("Orders")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(2000)).not_null())
                .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    fn insert(table: &Arc<lastpage_engine::Table>, session: &lastpage_engine::Session) -> i64 {
        table
            .insert(session, InsertRow::new().set(1, "y".repeat(90)))
            .unwrap()
            .unwrap()
    }
    let assert_no_gaps = |ids: &[i64], case: &str| {
        for pair in ids.windows(2) {
            assert_eq!(
                pair[1],
                pair[0] + 1,
                "{case}: one session skipped values: {ids:?}"
            );
        }
    };
    let mut last = 0;
    for _ in 0..1000 {
        last = insert(&table, &session);
    }
    // Rows near the end grow, so the last leaf splits in the middle, not at its end.
    for id in last - 60..=last {
        let grown = [(1, Value::from("z".repeat(1500)))];
        assert!(
            table
                .update(&session, &[Value::BigInt(id)], &grown)
                .unwrap()
        );
    }
    let ids: Vec<i64> = (0..5).map(|_| insert(&table, &session)).collect();
    assert_no_gaps(&ids, "after a split in the middle of the last leaf");
    drop((session, table));
    db.close().unwrap();
    let db = open(&fs);
    let table = db.table("Orders").unwrap();
    let session = db.session();
    let ids: Vec<i64> = (0..300).map(|_| insert(&table, &session)).collect();
    assert_no_gaps(&ids, "after a reopen");
    db.check_integrity().unwrap();
}

/// A rollback that fails part way (here: an undo needs a page that was evicted, and the data
/// file can no longer be read) leaves some of the transaction's changes in the trees. Nothing
/// may read them or commit on top of them: the database stops, and its next open undoes the
/// whole transaction from the log.
#[test]
fn a_rollback_that_cannot_undo_its_changes_stops_the_database_and_the_next_open_undoes_them() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(31));
    let db = open_small(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let committed = insert_orders(&db, &session, 10);
    session.begin().unwrap();
    insert_orders_past_the_budget(&db, &table, &session);
    fs.inject(FaultRule::reads_fail_from(1).on_path(Path::new(DIR).join(DATA_FILE_NAME)));
    let error = session.rollback().unwrap_err();
    assert!(matches!(error, EngineError::DatabaseFailed(_)), "{error}");
    assert!(
        error.to_string().contains("rolling back transaction"),
        "{error}"
    );
    fs.clear_faults();
    // The rows the rollback could not remove were never committed: no statement may see them
    // or build on them, through this session or another.
    let refused = insert_order(&db, &session).unwrap_err();
    assert!(
        matches!(refused, EngineError::DatabaseFailed(_)),
        "{refused}"
    );
    assert!(table.get(&session, &[Value::BigInt(committed[0])]).is_err());
    let other = db.session();
    assert!(other.begin().is_err());
    assert!(
        table
            .scan(&other, &KeyRange::all(), Direction::Forward)
            .is_err()
    );
    let after = crash(
        &fs,
        CrashMode::LoseUnsynced,
        db,
        (session, other, table),
        (),
    );
    let db = open_small(&after);
    let ids: Vec<i64> = orders_rows(&db).into_keys().collect();
    assert_eq!(ids, committed);
    db.check_integrity().unwrap();
    // The reopened database goes on, above every identity value the transaction took.
    let session = db.session();
    assert!(insert_order(&db, &session).unwrap() > 20_010);
}

/// A rollback that must read changes back from the log (its transaction let its undo entries
/// go) and cannot read the log fails like one that cannot undo a change: the database stops,
/// nothing is acknowledged, and the next open undoes the whole transaction.
/// Opens with [`options`], an explicit transaction letting its undo entries go between
/// statements once it holds `kept` of them (so that its rollback undoes it from the log).
fn open_keeping_undo_entries(fs: &FaultyFileSystem, kept: usize) -> Database {
    Database::open(
        DIR,
        DatabaseOptions {
            undo_kept_entries: kept,
            ..options(fs)
        },
    )
    .unwrap()
}

#[test]
fn a_rollback_that_cannot_read_the_log_back_stops_the_database_and_the_next_open_undoes_it() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(37));
    let db = open_keeping_undo_entries(&fs, 10);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let committed = insert_orders(&db, &session, 10);
    session.begin().unwrap();
    let uncommitted = insert_orders(&db, &session, 105);
    assert_eq!(db.undo_stats().entries_spilled, 100);
    fs.inject(FaultRule::reads_fail_from(1).under(Path::new(DIR).join(WAL_DIR_NAME)));
    let error = session.rollback().unwrap_err();
    assert!(matches!(error, EngineError::DatabaseFailed(_)), "{error}");
    assert!(
        error.to_string().contains("rolling back transaction"),
        "{error}"
    );
    fs.clear_faults();
    let refused = insert_order(&db, &session).unwrap_err();
    assert!(
        matches!(refused, EngineError::DatabaseFailed(_)),
        "{refused}"
    );
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open_keeping_undo_entries(&after, 10);
    let ids: Vec<i64> = orders_rows(&db).into_keys().collect();
    assert_eq!(ids, committed);
    db.check_integrity().unwrap();
    let stats = db.recovery_stats().unwrap();
    assert_eq!(stats.loser_txns, 1, "{stats:?}");
    let session = db.session();
    let next = insert_order(&db, &session).unwrap();
    assert!(next > *uncommitted.last().unwrap(), "{next}");
}

/// A statement that fails inside a large transaction has its changes and their compensations in
/// the log though none of them stays in the undo list. Undoing the transaction from the log
/// must find that statement's table as well, even when no change the list let go was to it.
#[test]
fn a_rollback_from_the_log_undoes_a_failed_statement_on_a_table_the_undo_list_never_held() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(41));
    let db = open_keeping_undo_entries(&fs, 1);
    let accounts = db.create_table(accounts()).unwrap();
    db.create_table(orders()).unwrap();
    let session = db.session();
    for id in [1, 2] {
        accounts
            .insert(&session, InsertRow::new().set(0, id).set(1, 100))
            .unwrap();
    }
    let committed = insert_orders(&db, &session, 3);
    session.begin().unwrap();
    // Moving row 1 onto key 2 deletes row 1, logs it, fails on the duplicate and puts row 1
    // back with a logged compensation; the undo list keeps nothing of it.
    let error = accounts
        .update(&session, &[Value::Int(1)], &[(0, Value::Int(2))])
        .unwrap_err();
    assert!(matches!(error, EngineError::DuplicateKey { .. }), "{error}");
    insert_orders(&db, &session, 3);
    assert!(db.undo_stats().spills >= 1, "{:?}", db.undo_stats());
    session.rollback().unwrap();
    assert!(db.undo_stats().undone_from_log > 0, "{:?}", db.undo_stats());
    let ids: Vec<i64> = orders_rows(&db).into_keys().collect();
    assert_eq!(ids, committed);
    let balances: Vec<Vec<Value>> = accounts
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        balances,
        vec![
            vec![Value::Int(1), Value::Int(100)],
            vec![Value::Int(2), Value::Int(100)]
        ]
    );
    db.check_integrity().unwrap();
    insert_order(&db, &session).unwrap();
}

#[test]
fn writers_wait_on_row_locks_and_time_out_with_sql_servers_message() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let db = Database::open(
        DIR,
        DatabaseOptions {
            lock_timeout: Some(Duration::from_millis(100)),
            ..options(&fs)
        },
    )
    .unwrap();
    let table = db.create_table(accounts()).unwrap();
    let first = db.session();
    let second = db.session();
    table
        .insert(&first, InsertRow::new().set(0, 1).set(1, 10))
        .unwrap();
    first.begin().unwrap();
    table
        .update(&first, &[Value::Int(1)], &[(1, Value::Int(11))])
        .unwrap();
    let error = table
        .update(&second, &[Value::Int(1)], &[(1, Value::Int(12))])
        .unwrap_err();
    assert_eq!(error.to_string(), "Lock request time out period exceeded.");
    assert!(second.waits().wait(WaitType::LckMX).waiting_tasks_count >= 1);
    // READ COMMITTED: the uncommitted value is not read; the reader waits and times out.
    let error = table.get(&second, &[Value::Int(1)]).unwrap_err();
    assert_eq!(error.to_string(), "Lock request time out period exceeded.");
    assert!(second.waits().wait(WaitType::LckMS).waiting_tasks_count >= 1);
    // The writer sees its own change.
    let own = table.get(&first, &[Value::Int(1)]).unwrap().unwrap();
    assert_eq!(own[1], Value::Int(11));
    first.rollback().unwrap();
    let row = table.get(&second, &[Value::Int(1)]).unwrap().unwrap();
    assert_eq!(row[1], Value::Int(10));
}

/// `Lines(OrderId INT, Line INT, Qty INT NOT NULL)`, clustered on (OrderId, Line) without
/// being unique: a lookup by OrderId alone is a prefix lookup.
fn lines() -> TableDef {
    TableDef::new("Lines")
        .column(ColumnDef::new("OrderId", DataType::Int).not_null())
        .column(ColumnDef::new("Line", DataType::Int).not_null())
        .column(ColumnDef::new("Qty", DataType::Int).not_null())
        .clustered(IndexDef::new(
            "CIX_Lines",
            &["OrderId", "Line"],
            Uniqueness::NonUnique,
        ))
}

#[test]
fn a_row_deleted_by_an_open_transaction_is_waited_for_not_skipped() {
    for durable in [false, true] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(5));
        let options = DatabaseOptions {
            lock_timeout: Some(Duration::from_millis(50)),
            ..if durable {
                options(&fs)
            } else {
                DatabaseOptions::default()
            }
        };
        let db = if durable {
            Database::open(DIR, options).unwrap()
        } else {
            Database::create(options).unwrap()
        };
        let accounts = db.create_table(accounts()).unwrap();
        let lines = db.create_table(lines()).unwrap();
        let (deleter, other) = (db.session(), db.session());
        for id in 1..=3 {
            accounts
                .insert(&deleter, InsertRow::new().set(0, id).set(1, id * 10))
                .unwrap();
        }
        for line in 1..=2 {
            lines
                .insert(
                    &deleter,
                    InsertRow::new().set(0, 7).set(1, line).set(2, line),
                )
                .unwrap();
        }
        let timeout = "Lock request time out period exceeded.";
        let key = |id: i32| [Value::Int(id)];
        let waits_before = other.waits().wait(WaitType::LckMS).waiting_tasks_count;

        // A delete, then a move (an update of the key), each rolled back: until then the
        // other session's lookups of the old key wait and time out instead of missing.
        deleter.begin().unwrap();
        assert!(accounts.delete(&deleter, &key(2)).unwrap());
        assert!(
            accounts
                .update(&deleter, &key(3), &[(0, Value::Int(30))])
                .unwrap()
        );
        for id in [2, 3, 30] {
            let error = accounts.get(&other, &key(id)).unwrap_err();
            assert_eq!(
                error.to_string(),
                timeout,
                "durable={durable}: lookup of {id}"
            );
        }
        // A writer waits too, rather than finding nothing to change.
        let error = accounts
            .update(&other, &key(2), &[(1, Value::Int(0))])
            .unwrap_err();
        assert_eq!(error.to_string(), timeout, "durable={durable}: update of 2");
        // Rows nobody touched are read as usual, and the deleter sees its own deletes.
        assert!(accounts.get(&other, &key(1)).unwrap().is_some());
        assert_eq!(accounts.get(&deleter, &key(2)).unwrap(), None);
        assert_eq!(accounts.get(&deleter, &key(3)).unwrap(), None);
        deleter.rollback().unwrap();
        assert_eq!(
            accounts.get(&other, &key(2)).unwrap(),
            Some(vec![Value::Int(2), Value::Int(20)])
        );
        assert_eq!(
            accounts.get(&other, &key(3)).unwrap(),
            Some(vec![Value::Int(3), Value::Int(30)])
        );
        assert_eq!(accounts.get(&other, &key(30)).unwrap(), None);
        for direction in [Direction::Forward, Direction::Backward] {
            let ids: Vec<Value> = accounts
                .scan(&other, &KeyRange::all(), direction)
                .unwrap()
                .map(|row| row.unwrap()[0].clone())
                .collect();
            let mut expected: Vec<Value> = (1..=3).map(Value::Int).collect();
            if direction == Direction::Backward {
                expected.reverse();
            }
            assert_eq!(ids, expected, "durable={durable}: {direction:?} scan");
        }

        // A prefix lookup does not skip a deleted first match to report the next one.
        deleter.begin().unwrap();
        assert!(
            lines
                .delete(&deleter, &[Value::Int(7), Value::Int(1)])
                .unwrap()
        );
        let error = lines.get(&other, &key(7)).unwrap_err();
        assert_eq!(
            error.to_string(),
            timeout,
            "durable={durable}: prefix lookup"
        );
        deleter.rollback().unwrap();
        assert_eq!(
            lines.get(&other, &key(7)).unwrap(),
            Some(vec![Value::Int(7), Value::Int(1), Value::Int(1)])
        );
        assert!(other.waits().wait(WaitType::LckMS).waiting_tasks_count >= waits_before + 5);

        // Scans wait too, either way, rather than skip the deleted row.
        deleter.begin().unwrap();
        assert!(accounts.delete(&deleter, &key(2)).unwrap());
        for direction in [Direction::Forward, Direction::Backward] {
            let error = accounts
                .scan(&other, &KeyRange::all(), direction)
                .unwrap()
                .find_map(Result::err)
                .expect("the scan waits for the deleted row and times out");
            assert_eq!(
                error.to_string(),
                timeout,
                "durable={durable}: {direction:?} scan"
            );
        }
        // Once the delete commits, the row is missing for everyone, without a wait.
        deleter.commit().unwrap();
        assert_eq!(accounts.get(&other, &key(2)).unwrap(), None);
        let ids: Vec<Value> = accounts
            .scan(&other, &KeyRange::all(), Direction::Forward)
            .unwrap()
            .map(|row| row.unwrap()[0].clone())
            .collect();
        assert_eq!(ids, [Value::Int(1), Value::Int(3)], "durable={durable}");
        db.check_integrity().unwrap();
    }
}

/// READ COMMITTED across a writer that changes a row twice: a scan that read the row ahead
/// while it held the first (never committed) value, and then finds it unlocked after the commit
/// of the second, must return the second. It returned the first: the check only asked whether
/// the row was locked now and whether anything had rolled back.
#[test]
fn a_scan_never_returns_a_value_its_writer_changed_again_before_committing() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let writer = db.session();
    for id in 1..=2 {
        table
            .insert(&writer, InsertRow::new().set(0, id).set(1, 0))
            .unwrap();
    }
    writer.begin().unwrap();
    table
        .update(&writer, &[Value::Int(2)], &[(1, Value::Int(111))])
        .unwrap();
    let reader = db.session();
    let mut scan = table
        .scan(&reader, &KeyRange::all(), Direction::Forward)
        .unwrap();
    // Row 1 comes back; row 2 is read ahead while it holds 111 under the writer's lock.
    assert_eq!(
        scan.next().unwrap().unwrap(),
        vec![Value::Int(1), Value::Int(0)]
    );
    table
        .update(&writer, &[Value::Int(2)], &[(1, Value::Int(222))])
        .unwrap();
    writer.commit().unwrap();
    assert_eq!(
        scan.next().unwrap().unwrap(),
        vec![Value::Int(2), Value::Int(222)],
        "a value that was never committed"
    );
    assert!(scan.next().is_none());
}

/// What `Accounts`'s two indexes have now: (insert path, OPTIMIZE_FOR_SEQUENTIAL_KEY) each,
/// every partition's tree alike.
fn accounts_index_options(db: &Database) -> Vec<(InsertPath, bool)> {
    db.table("Accounts")
        .unwrap()
        .trees()
        .map(|(_, trees)| {
            let options = trees[0].options();
            assert!(trees.iter().all(|tree| tree.options() == options));
            (options.insert_path, options.optimize_for_sequential_key)
        })
        .collect()
}

/// `ALTER INDEX … SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = …)` and the insert path are kept by a
/// durable database: logged, replayed after a crash, and stored by a checkpoint; a change to a
/// table dropped later in the log is skipped.
#[test]
fn index_option_changes_survive_a_crash_and_a_checkpoint() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(37));
    let db = open(&fs);
    let table = db.create_table(accounts_by_balance()).unwrap();
    let defined = accounts_index_options(&db);
    assert_eq!(defined, [(InsertPath::Default, false); 2]);
    let session = db.session();
    table
        .set_optimize_for_sequential_key(&session, "PK_Accounts", true)
        .unwrap();
    table
        .set_insert_path(&session, "IX_Balance", InsertPath::Classic)
        .unwrap();
    let changed = vec![(InsertPath::Default, true), (InsertPath::Classic, false)];
    assert_eq!(accounts_index_options(&db), changed);
    let dropped = db.create_table(orders()).unwrap();
    dropped
        .set_optimize_for_sequential_key(&session, "PK_Orders", true)
        .unwrap();
    db.drop_table("Orders").unwrap();
    // The record is flushed before the change returns: nothing else flushes here.
    let after = crash(
        &fs,
        CrashMode::LoseUnsynced,
        db,
        (session, table, dropped),
        (),
    );
    let db = open(&after);
    assert_eq!(
        accounts_index_options(&db),
        changed,
        "replayed from the log"
    );
    assert!(db.table("Orders").is_err());
    db.checkpoint().unwrap();
    let table = db.table("Accounts").unwrap();
    let session = db.session();
    table
        .set_optimize_for_sequential_key(&session, "PK_Accounts", false)
        .unwrap();
    let changed = vec![(InsertPath::Default, false), (InsertPath::Classic, false)];
    let after = crash(&after, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open(&after);
    assert_eq!(
        accounts_index_options(&db),
        changed,
        "the image, then the log"
    );
    db.close().unwrap();
    let db = open(&after);
    assert_eq!(accounts_index_options(&db), changed, "the clean image");
}

/// A lookup through a nonclustered index that waits for a row's lock, while the lock's holder
/// moves the row to another clustered key (same code, same group) and commits, finds the row
/// at its new key: a row with that code exists in every committed state. It returned nothing
/// (and the group lookup one row short): it skipped a row gone from its old key without
/// looking again, as `get` does.
#[test]
fn an_index_lookup_finds_a_row_its_lock_holder_moved_and_committed() {
    for (index, key, expected) in [
        ("UX_Code", Value::from("c2"), 1),
        ("IX_Grp", Value::Int(0), 4),
    ] {
        let db = in_memory_with_lock_timeout(Duration::from_secs(5));
        let table = db
            .create_table(
                TableDef::new("Codes")
                    .column(ColumnDef::new("Id", DataType::Int).not_null())
                    .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
                    .column(ColumnDef::new("Grp", DataType::Int).not_null())
                    .clustered(IndexDef::new("PK_Codes", &["Id"], Uniqueness::PrimaryKey))
                    .nonclustered(IndexDef::new("UX_Code", &["Code"], Uniqueness::UniqueIndex))
                    .nonclustered(IndexDef::new("IX_Grp", &["Grp"], Uniqueness::NonUnique)),
            )
            .unwrap();
        let session = db.session();
        for id in 0..4 {
            let row = InsertRow::new()
                .set(0, id)
                .set(1, format!("c{id}"))
                .set(2, 0);
            table.insert(&session, row).unwrap();
        }
        let writer = db.session();
        writer.begin().unwrap();
        // Locks row 2 without moving an entry.
        let unchanged = [(1, Value::from("c2"))];
        assert!(table.update(&writer, &[Value::Int(2)], &unchanged).unwrap());
        let found = while_blocked(
            &db,
            "the reader did not wait",
            || {
                table
                    .get_by_index(&db.session(), index, std::slice::from_ref(&key))
                    .unwrap()
            },
            || {
                let moved = [(0, Value::Int(20))];
                assert!(table.update(&writer, &[Value::Int(2)], &moved).unwrap());
                writer.commit().unwrap();
            },
        );
        assert_eq!(found.len(), expected, "{index}: {found:?}");
        let now = table.get_by_index(&session, index, &[key]).unwrap();
        assert_eq!(now.len(), expected, "{index}");
    }
}

#[test]
fn index_lookups_wait_for_rows_deleted_or_rekeyed_by_an_open_transaction() {
    let db = in_memory_with_lock_timeout(Duration::from_millis(50));
    let table = db.create_table(accounts_by_balance()).unwrap();
    let (writer, other) = (db.session(), db.session());
    for id in 1..=3 {
        table
            .insert(&writer, InsertRow::new().set(0, id).set(1, id * 10))
            .unwrap();
    }
    let by_balance =
        |session, balance: i32| table.get_by_index(session, "IX_Balance", &[Value::Int(balance)]);
    let timeout = "Lock request time out period exceeded.";
    writer.begin().unwrap();
    assert!(table.delete(&writer, &[Value::Int(2)]).unwrap());
    assert!(
        table
            .update(&writer, &[Value::Int(3)], &[(1, Value::Int(31))])
            .unwrap()
    );
    // The deleted row's entry and the changed row's old entry are gone from the index, and the
    // changed row's new entry is not committed: each lookup waits.
    for balance in [20, 30, 31] {
        let error = by_balance(&other, balance).unwrap_err();
        assert_eq!(error.to_string(), timeout, "lookup of balance {balance}");
    }
    assert_eq!(by_balance(&other, 10).unwrap().len(), 1);
    assert_eq!(
        by_balance(&writer, 31).unwrap(),
        [vec![Value::Int(3), Value::Int(31)]]
    );
    writer.rollback().unwrap();
    assert_eq!(
        by_balance(&other, 20).unwrap(),
        [vec![Value::Int(2), Value::Int(20)]]
    );
    assert_eq!(
        by_balance(&other, 30).unwrap(),
        [vec![Value::Int(3), Value::Int(30)]]
    );
    assert_eq!(by_balance(&other, 31).unwrap(), Vec::<Vec<Value>>::new());
    // Committed, the change moves the row from one key to the other for everyone.
    writer.begin().unwrap();
    assert!(
        table
            .update(&writer, &[Value::Int(3)], &[(1, Value::Int(31))])
            .unwrap()
    );
    writer.commit().unwrap();
    assert_eq!(by_balance(&other, 30).unwrap(), Vec::<Vec<Value>>::new());
    assert_eq!(
        by_balance(&other, 31).unwrap(),
        [vec![Value::Int(3), Value::Int(31)]]
    );
    db.check_integrity().unwrap();
}

#[test]
fn an_index_lookup_blocked_by_a_change_that_rolls_back_returns_only_matching_rows() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db.create_table(accounts_by_balance()).unwrap();
    let writer = db.session();
    table
        .insert(&writer, InsertRow::new().set(0, 1).set(1, 10))
        .unwrap();
    writer.begin().unwrap();
    assert!(
        table
            .update(&writer, &[Value::Int(1)], &[(1, Value::Int(11))])
            .unwrap()
    );
    std::thread::scope(|scope| {
        // It finds the new entry, waits for the row, and then reads the committed row, which
        // the rollback left at balance 10.
        let reader = scope.spawn(|| {
            let session = db.session();
            table
                .get_by_index(&session, "IX_Balance", &[Value::Int(11)])
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !reader.is_finished(),
            "the lookup did not wait for the change"
        );
        writer.rollback().unwrap();
        assert_eq!(reader.join().unwrap(), Vec::<Vec<Value>>::new());
    });
}

#[test]
fn a_lookup_blocked_by_a_delete_returns_the_row_when_the_delete_rolls_back() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let deleter = db.session();
    table
        .insert(&deleter, InsertRow::new().set(0, 1).set(1, 10))
        .unwrap();
    deleter.begin().unwrap();
    assert!(table.delete(&deleter, &[Value::Int(1)]).unwrap());
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let session = db.session();
            table.get(&session, &[Value::Int(1)]).unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !reader.is_finished(),
            "the lookup returned while the delete was still open"
        );
        deleter.rollback().unwrap();
        assert_eq!(
            reader.join().unwrap(),
            Some(vec![Value::Int(1), Value::Int(10)])
        );
    });
}

#[test]
fn lookups_and_scans_never_miss_a_committed_row_while_others_delete_it_and_roll_back() {
    const ROWS: i32 = 40;
    let seed = seed();
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let setup = db.session();
    for id in 1..=ROWS {
        table
            .insert(&setup, InsertRow::new().set(0, id).set(1, id))
            .unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let lookups = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        let mut writers = Vec::new();
        for writer in 0..3u64 {
            let (db, table) = (&db, &table);
            writers.push(scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ writer);
                let session = db.session();
                for _ in 0..400 {
                    session.begin().unwrap();
                    let id = rng.random_range(1..=ROWS);
                    // Deleting or moving it, then rolling back: every row stays committed.
                    if rng.random_bool(0.5) {
                        assert!(table.delete(&session, &[Value::Int(id)]).unwrap());
                    } else {
                        let moved = Value::Int(id + 1000 * (writer as i32 + 1));
                        assert!(
                            table
                                .update(&session, &[Value::Int(id)], &[(0, moved)])
                                .unwrap()
                        );
                    }
                    std::thread::yield_now();
                    session.rollback().unwrap();
                }
            }));
        }
        {
            let (db, table, stop, lookups) = (&db, &table, &stop, &lookups);
            scope.spawn(move || {
                let session = db.session();
                let all: Vec<i32> = (1..=ROWS).collect();
                let mut backward = false;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let direction = if backward {
                        Direction::Backward
                    } else {
                        Direction::Forward
                    };
                    let mut ids: Vec<i32> = table
                        .scan(&session, &KeyRange::all(), direction)
                        .unwrap()
                        .map(|row| match row.unwrap()[0] {
                            Value::Int(id) => id,
                            ref other => panic!("not an INT id: {other:?}"),
                        })
                        .collect();
                    if backward {
                        ids.reverse();
                    }
                    assert_eq!(
                        ids, all,
                        "a {direction:?} scan missed or added rows (seed {seed})"
                    );
                    lookups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    backward = !backward;
                }
            });
        }
        for reader in 0..2u64 {
            let (db, table, stop, lookups) = (&db, &table, &stop, &lookups);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (100 + reader));
                let session = db.session();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = rng.random_range(1..=ROWS);
                    let row = table.get(&session, &[Value::Int(id)]).unwrap();
                    assert_eq!(
                        row,
                        Some(vec![Value::Int(id), Value::Int(id)]),
                        "a committed row was reported missing (seed {seed})"
                    );
                    lookups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        // The readers stop even if a writer failed, so that a failure fails the test rather
        // than hanging it.
        let written: Vec<_> = writers.into_iter().map(|writer| writer.join()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for result in written {
            result.unwrap();
        }
    });
    assert!(lookups.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(table.row_count(), ROWS as u64);
    db.check_integrity().unwrap();
}

#[test]
fn an_uncommitted_batch_is_hidden_by_one_range_lock_until_it_commits() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(3));
    let db = Database::open(
        DIR,
        DatabaseOptions {
            lock_timeout: Some(Duration::from_millis(50)),
            ..options(&fs)
        },
    )
    .unwrap();
    let table = db.create_table(orders()).unwrap();
    let (writer, other) = (db.session(), db.session());
    let before = insert_order(&db, &writer).unwrap();
    let batch = |tag: &str| -> Vec<InsertRow> {
        (0..40)
            .map(|i| InsertRow::new().set(1, format!("{tag}{i}")))
            .collect()
    };
    let acquired_before = db.lock_stats().acquired;
    writer.begin().unwrap();
    let ids: Vec<i64> = table
        .insert_batch(&writer, batch("b"))
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    // Forty fresh keys, one lock.
    assert_eq!(db.lock_stats().acquired - acquired_before, 1);
    let timeout = "Lock request time out period exceeded.";
    for id in [ids[0], ids[17], ids[39]] {
        let error = table.get(&other, &[Value::BigInt(id)]).unwrap_err();
        assert_eq!(error.to_string(), timeout, "read of {id}");
        let error = table
            .update(&other, &[Value::BigInt(id)], &[(1, Value::from("x"))])
            .unwrap_err();
        assert_eq!(error.to_string(), timeout, "update of {id}");
        assert!(table.get(&writer, &[Value::BigInt(id)]).unwrap().is_some());
    }
    assert!(other.waits().wait(WaitType::LckMS).waiting_tasks_count >= 3);
    assert!(other.waits().wait(WaitType::LckMX).waiting_tasks_count >= 3);
    // Rows outside the batch are not held back.
    assert!(
        table
            .get(&other, &[Value::BigInt(before)])
            .unwrap()
            .is_some()
    );
    // The writer's own later statements inside its range need no new lock.
    table
        .update(
            &writer,
            &[Value::BigInt(ids[3])],
            &[(1, Value::from("own"))],
        )
        .unwrap();
    assert_eq!(db.lock_stats().acquired - acquired_before, 1);
    writer.commit().unwrap();
    let row = table
        .get(&other, &[Value::BigInt(ids[3])])
        .unwrap()
        .unwrap();
    assert_eq!(row[1], Value::from("own"));
    assert_eq!(orders_rows(&db).len(), 41);

    // A rolled-back batch leaves nothing, and nothing held.
    writer.begin().unwrap();
    let ids: Vec<i64> = table
        .insert_batch(&writer, batch("r"))
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    writer.rollback().unwrap();
    for id in [ids[0], ids[39]] {
        assert_eq!(table.get(&other, &[Value::BigInt(id)]).unwrap(), None);
    }
    assert_eq!(orders_rows(&db).len(), 41);
    table.insert_batch(&other, batch("c")).unwrap();
    assert_eq!(orders_rows(&db).len(), 81);
    db.check_integrity().unwrap();
}

#[test]
fn batches_keep_their_rows_apart_through_commit_rollback_and_recovery() {
    // Each batch's rows are encoded into one buffer that the thread reuses once nothing holds
    // it: two batches of one open transaction must not share it, and rows committed, rolled
    // back and replayed must be exactly the ones inserted. With a nonclustered index, the
    // batches still go in at the tail and their entries follow, through recovery too.
    for indexed in [false, true] {
        batches_round(indexed);
    }
}

fn batches_round(indexed: bool) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(5));
    let db = open(&fs);
    let mut definition = orders();
    if indexed {
        definition = definition.nonclustered(IndexDef::new(
            "IX_Orders_Payload",
            &["Payload"],
            Uniqueness::NonUnique,
        ));
    }
    let table = db.create_table(definition).unwrap();
    let session = db.session();
    // Rows of several lengths, so that a row read from the wrong place shows.
    let payload = |tag: &str, i: usize| format!("{tag}-{i}-{}", "x".repeat(i % 7));
    let insert = |session: &lastpage_engine::Session, tag: &str, rows: usize| {
        let batch = (0..rows)
            .map(|i| InsertRow::new().set(1, payload(tag, i)))
            .collect();
        let ids = table.insert_batch(session, batch).unwrap();
        ids.into_iter()
            .enumerate()
            .map(|(i, id)| (id.unwrap(), payload(tag, i)))
            .collect::<Vec<_>>()
    };
    let mut expected = BTreeMap::new();
    session.begin().unwrap();
    let first = insert(&session, "a", 300);
    let second = insert(&session, "b", 200);
    session.commit().unwrap();
    expected.extend(first);
    expected.extend(second);
    session.begin().unwrap();
    insert(&session, "r1", 100);
    insert(&session, "r2", 150);
    session.rollback().unwrap();
    expected.extend(insert(&session, "c", 250));
    assert_eq!(orders_rows(&db), expected);
    db.check_integrity().unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let db = open(&after);
    assert_eq!(orders_rows(&db), expected, "indexed: {indexed}");
    let checks = db.check_integrity().unwrap();
    for (name, tree) in &checks[0].indexes {
        assert_eq!(tree.rows, expected.len() as u64, "{name}");
    }
    if indexed {
        let (table, session) = (db.table("Orders").unwrap(), db.session());
        for (id, payload) in expected.iter().step_by(37) {
            let found = table
                .get_by_index(
                    &session,
                    "IX_Orders_Payload",
                    &[Value::from(payload.as_str())],
                )
                .unwrap();
            assert_eq!(found.len(), 1, "{payload}");
            assert_eq!(found[0][0], Value::BigInt(*id));
        }
    }
}

/// Two transactions lock two rows in opposite orders: one is the victim, and its error is SQL
/// Server's 1205 naming the victim's session ("Process ID" is the session id, SPID), not its
/// transaction's id, which the message named before. (Transaction ids come in per-thread blocks,
/// and the setup's thread took the first, so the two ids differ here.)
#[test]
fn a_deadlock_picks_one_victim_and_names_it() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(2));
    let db = open(&fs);
    let table = db.create_table(accounts()).unwrap();
    let setup = db.session();
    for id in [1, 2] {
        table
            .insert(&setup, InsertRow::new().set(0, id).set(1, 0))
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(2));
    let results: Vec<(u64, Result<(), EngineError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = [(1, 2), (2, 1)]
            .into_iter()
            .map(|(first, second)| {
                let session = db.session();
                let table = Arc::clone(&table);
                let barrier = Arc::clone(&barrier);
                scope.spawn(move || {
                    session.begin().unwrap();
                    table
                        .update(&session, &[Value::Int(first)], &[(1, Value::Int(first))])
                        .unwrap();
                    barrier.wait();
                    let result = table
                        .update(&session, &[Value::Int(second)], &[(1, Value::Int(first))])
                        .map(|_| ());
                    match &result {
                        Ok(()) => session.commit().unwrap(),
                        Err(_) => session.rollback().unwrap(),
                    }
                    (session.id(), result)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect()
    });
    let victims: Vec<(u64, &EngineError)> = results
        .iter()
        .filter_map(|(session, result)| Some((*session, result.as_ref().err()?)))
        .collect();
    assert_eq!(victims.len(), 1, "{results:?}");
    let (session, error) = victims[0];
    assert_eq!(
        error,
        &EngineError::Deadlock {
            process_id: session
        }
    );
    assert_eq!(
        error.to_string(),
        format!(
            "Transaction (Process ID {session}) was deadlocked on lock resources with another \
             process and has been chosen as the deadlock victim. Rerun the transaction."
        )
    );
    db.check_integrity().unwrap();
}

#[test]
fn a_non_logged_table_is_emptied_by_crash_recovery_and_kept_by_a_clean_close() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(4));
    let db = open(&fs);
    let table = db.create_table(orders().not_logged()).unwrap();
    let session = db.session();
    for _ in 0..50 {
        table
            .insert(&session, InsertRow::new().set(1, "u"))
            .unwrap();
    }
    drop(session);
    drop(table);
    db.close().unwrap();
    let db = open(&fs);
    assert_eq!(orders_rows(&db).len(), 50, "a clean close keeps the rows");
    let table = db.table("Orders").unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(1, "v"))
        .unwrap();
    let wal_bytes = db.wal_stats().unwrap().appended_bytes;
    assert_eq!(wal_bytes, 0, "a non-logged table writes no log");
    let next_identity = table.next_identity();
    let after = crash(&fs, CrashMode::KeepUnsynced, db, (session, table), ());
    let db = open(&after);
    assert!(
        orders_rows(&db).is_empty(),
        "recovery empties a non-logged table"
    );
    // The identity goes on from the last checkpoint's value (past the blocks the 50 rows the
    // clean close kept came from), not from the seed: values the application saw before that
    // checkpoint are not handed out again.
    let table = db.table("Orders").unwrap();
    let restarted = table.next_identity().unwrap();
    assert!(restarted > 50, "the identity restarted at {restarted}");
    assert!(next_identity.unwrap() >= restarted);
    db.check_integrity().unwrap();
}

/// A clean close while a transaction that changed only logged tables is still open keeps the
/// non-logged tables' rows: the transaction is undone by the next open (a commit after the
/// close is refused, a rollback too), and undoing it touches no table that is not logged. The
/// open used to call any record it read unclean, so the loser's records (read only to undo
/// it) emptied the non-logged table, and a commit after the close was logged after the clean
/// image.
#[test]
fn a_close_during_an_open_logged_transaction_keeps_the_non_logged_rows() {
    for commit in [true, false] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(5));
        let db = open(&fs);
        let scratch = db.create_table(orders().not_logged()).unwrap();
        let accounts = db.create_table(accounts()).unwrap();
        let session = db.session();
        for _ in 0..50 {
            scratch
                .insert(&session, InsertRow::new().set(1, "u"))
                .unwrap();
        }
        accounts
            .insert(&session, InsertRow::new().set(0, 1).set(1, 1))
            .unwrap();
        let open_txn = db.session();
        open_txn.begin().unwrap();
        accounts
            .update(&open_txn, &[Value::Int(1)], &[(1, Value::Int(2))])
            .unwrap();
        db.clone().close().unwrap();
        let ended = if commit {
            open_txn.commit()
        } else {
            open_txn.rollback()
        };
        assert!(
            matches!(ended, Err(EngineError::DatabaseClosed)),
            "{ended:?}"
        );
        drop((session, open_txn, scratch, accounts));
        drop(db);
        let db = open(&fs);
        assert_eq!(orders_rows(&db).len(), 50, "commit={commit}");
        let accounts = db.table("Accounts").unwrap();
        assert_eq!(
            accounts.get(&db.session(), &[Value::Int(1)]).unwrap(),
            Some(vec![Value::Int(1), Value::Int(1)]),
            "commit={commit}: the open transaction is undone"
        );
        db.check_integrity().unwrap();
    }
}

/// An identity reservation logged after the close's clean image changes no row: the next open
/// still calls the close clean and keeps the non-logged rows. A heap takes its identity values
/// (and may log a reservation) before its statement reaches the checkpoint gate, where the
/// close is checked, so a batch racing the close can log one after the image; any record there
/// used to count as a crash, and emptied the non-logged table (in 4 to 11 of 40 rounds of
/// this race). Racing commits land there the same way.
#[test]
fn an_identity_reservation_racing_a_clean_close_keeps_the_non_logged_rows() {
    let seed = seed();
    let mut emptied = Vec::new();
    for round in 0..20u64 {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed.wrapping_add(round)));
        let db = open(&fs);
        // Many tables make the close's catalog, built between its checkpoint LSN and its
        // closed mark, take a while: the window the race needs.
        for i in 0..300 {
            let pad = TableDef::new(format!("Pad{i}"))
                .column(ColumnDef::new("A", DataType::Int).not_null());
            db.create_table(pad).unwrap();
        }
        let scratch = db.create_table(orders().not_logged()).unwrap();
        scratch
            .insert(&db.session(), InsertRow::new().set(1, "u"))
            .unwrap();
        // A heap with a SMALLINT identity reserves 10 values at a time: each batch logs one.
        let events = db
            .create_table(
                TableDef::new("Events")
                    .column(ColumnDef::new("Id", DataType::SmallInt).identity(-32768, 1))
                    .column(ColumnDef::new("Kind", DataType::TinyInt).not_null()),
            )
            .unwrap();
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let inserter = {
            let (db, started) = (db.clone(), Arc::clone(&started));
            std::thread::spawn(move || {
                let session = db.session();
                loop {
                    let rows = (0..12).map(|_| InsertRow::new().set(1, 1)).collect();
                    match events.insert_batch(&session, rows) {
                        Ok(_) => started.store(true, std::sync::atomic::Ordering::Release),
                        Err(EngineError::DatabaseClosed) => return,
                        // A loaded machine can take long enough to close for the inserter to
                        // use up all 65,536 values first; the round then races nothing more.
                        Err(EngineError::IdentityOverflow { .. }) => {
                            started.store(true, std::sync::atomic::Ordering::Release);
                            return;
                        }
                        Err(error) => panic!("{error}"),
                    }
                }
            })
        };
        while !started.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(round % 5));
        drop(scratch);
        db.close().unwrap();
        inserter.join().unwrap();
        let db = open(&fs);
        if orders_rows(&db).len() != 1 {
            emptied.push((round, db.recovery_stats().unwrap().records));
        }
    }
    assert!(
        emptied.is_empty(),
        "seed {seed}: a clean close emptied the non-logged table in rounds (round, records \
         read) {emptied:?}"
    );
}

/// A writer whose commit or rollback is refused (the database was closed, or its log failed)
/// lets its locks go with its change still in the trees. A reader that waited for those locks
/// must not return that change: it returned the update's balance (or missed the deleted row)
/// although the next open undoes it. It now fails with the database's state.
#[test]
fn a_reader_waiting_for_a_writer_whose_end_is_refused_does_not_return_its_change() {
    for (case, delete) in [("commit", false), ("rollback", false), ("delete", true)] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(5));
        let db = Database::open(
            DIR,
            DatabaseOptions {
                lock_timeout: Some(Duration::from_secs(5)),
                ..options(&fs)
            },
        )
        .unwrap();
        let table = db.create_table(accounts()).unwrap();
        let session = db.session();
        table
            .insert(&session, InsertRow::new().set(0, 1).set(1, 1))
            .unwrap();
        let writer = db.session();
        writer.begin().unwrap();
        if delete {
            assert!(table.delete(&writer, &[Value::Int(1)]).unwrap());
        } else {
            let change = [(1, Value::Int(2))];
            assert!(table.update(&writer, &[Value::Int(1)], &change).unwrap());
        }
        let read = while_blocked(
            &db,
            "the reader did not wait",
            || table.get(&db.session(), &[Value::Int(1)]),
            || {
                std::thread::sleep(Duration::from_millis(20));
                db.clone().close().unwrap();
                let ended = if case == "rollback" {
                    writer.rollback()
                } else {
                    writer.commit()
                };
                assert!(
                    matches!(ended, Err(EngineError::DatabaseClosed)),
                    "{ended:?}"
                );
            },
        );
        assert!(
            matches!(read, Err(EngineError::DatabaseClosed)),
            "{case}: {read:?}"
        );
        drop((session, writer, table));
        drop(db);
        let db = open(&fs);
        let row = db
            .table("Accounts")
            .unwrap()
            .get(&db.session(), &[Value::Int(1)])
            .unwrap();
        assert_eq!(row, Some(vec![Value::Int(1), Value::Int(1)]), "{case}");
    }
}

/// A lookup through an index matching many rows finishes while another session keeps deleting
/// some of them (and inserting others): it looked at the whole range again whenever a row it
/// had read was gone, even without waiting for it, and never finished while the deletes went
/// on. It now looks again only after waiting for a writer that moved or changed a row, only
/// at rows it has not considered, and at most `INDEX_LOOKUP_MAX_PASSES` times.
#[test]
fn an_index_lookup_finishes_while_another_session_deletes_matching_rows() {
    const ROWS: i32 = 20_000;
    let db = in_memory_with_lock_timeout(Duration::from_secs(5));
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .column(ColumnDef::new("Grp", DataType::Int).not_null())
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("IX_Grp", &["Grp"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    let rows: Vec<InsertRow> = (0..ROWS)
        .map(|id| InsertRow::new().set(0, id).set(1, 0))
        .collect();
    table.insert_batch(&session, rows).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (finished, found) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let session = db.session();
            let mut next = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(table.delete(&session, &[Value::Int(next)]).unwrap());
                let row = InsertRow::new().set(0, next + ROWS).set(1, 0);
                table.insert(&session, row).unwrap();
                next += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let reader = scope.spawn(|| {
            table
                .get_by_index(&db.session(), "IX_Grp", &[Value::Int(0)])
                .unwrap()
                .len()
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !reader.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let finished = reader.is_finished();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (finished, reader.join().unwrap())
    });
    assert!(
        finished,
        "the lookup did not finish in 10 s while another session deleted rows"
    );
    // Every row it returns matched; the churn moves a few hundred rows at most meanwhile.
    assert!(found > ROWS as usize / 2, "{found} rows");
}

/// `T(Id, Grp, W)` with a nonclustered index on Grp, in an in-memory database whose lock
/// waits time out after 10 s, holding a row (id, 0, 0) for each of `ids`.
fn moving_rows(ids: &[i32]) -> (Database, Arc<lastpage_engine::Table>) {
    let db = in_memory_with_lock_timeout(Duration::from_secs(10));
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .column(ColumnDef::new("Grp", DataType::Int).not_null())
                .column(ColumnDef::new("W", DataType::Int).not_null())
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("IX_Grp", &["Grp"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    for &id in ids {
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, 0).set(2, 0))
            .unwrap();
    }
    (db, table)
}

/// Sets column `column` of row `id` to `value` through `session`, which must find the row.
fn set_column(
    table: &Arc<lastpage_engine::Table>,
    session: &lastpage_engine::Session,
    id: i32,
    column: usize,
    value: i32,
) {
    let change = [(column, Value::Int(value))];
    assert!(table.update(session, &[Value::Int(id)], &change).unwrap());
}

/// Looks up Grp = 0 on another thread while `meanwhile` runs here; returns what it found.
fn lookup_group_zero_while(
    db: &Database,
    table: &lastpage_engine::Table,
    meanwhile: impl FnOnce(),
) -> Vec<Vec<Value>> {
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            table
                .get_by_index(&db.session(), "IX_Grp", &[Value::Int(0)])
                .unwrap()
        });
        meanwhile();
        reader.join().unwrap()
    })
}

/// Waits until `db` has counted `at_least` lock waits, then 50 ms more.
fn wait_for_lock_waits(db: &Database, at_least: u64) {
    wait_until(Duration::from_secs(5), "the reader did not wait", || {
        db.lock_stats().waits >= at_least
    });
    std::thread::sleep(Duration::from_millis(50));
}

/// The Id column of `rows`, sorted.
fn sorted_ids(rows: &[Vec<Value>]) -> Vec<i64> {
    let mut ids: Vec<i64> = rows.iter().map(|row| row[0].as_i64().unwrap()).collect();
    ids.sort();
    ids
}

/// A lookup that waited for one writer returns a row another session moved to another
/// clustered key meanwhile: it skipped the row, gone from its old key without a wait of its
/// own.
#[test]
fn an_index_lookup_returns_a_row_moved_while_it_waited_for_another() {
    let (db, table) = moving_rows(&[0, 1]);
    let s = db.session();
    let w = db.session();
    w.begin().unwrap();
    set_column(&table, &w, 0, 2, 1);
    let found = lookup_group_zero_while(&db, &table, || {
        // The reader waits for row 0 (W's).
        wait_for_lock_waits(&db, 1);
        set_column(&table, &s, 1, 0, 2);
        w.commit().unwrap();
    });
    assert_eq!(
        sorted_ids(&found),
        vec![0, 2],
        "the lookup returned {found:?}"
    );
}

/// A lookup returns a row moved away and back while it waited for writers: the third pass
/// skipped the row's key as considered already.
#[test]
fn an_index_lookup_returns_a_row_moved_away_and_back_while_it_waited() {
    let (db, table) = moving_rows(&[1, 10]);
    let s = db.session();
    let w1 = db.session();
    let w2 = db.session();
    w1.begin().unwrap();
    set_column(&table, &w1, 1, 2, 1);
    w2.begin().unwrap();
    set_column(&table, &w2, 10, 2, 1);
    let found = lookup_group_zero_while(&db, &table, || {
        // The reader waits for row 1 (W1's).
        wait_for_lock_waits(&db, 1);
        // W1 moves row 1 to key 2 and commits: the reader finds key 1 gone after its wait.
        set_column(&table, &w1, 1, 0, 2);
        w1.commit().unwrap();
        // The reader now waits for row 10 (W2's).
        wait_for_lock_waits(&db, 2);
        // Row R moves back to key 1 (autocommit), then W2 commits.
        set_column(&table, &s, 2, 0, 1);
        w2.commit().unwrap();
    });
    // Both rows match Grp = 0 and are committed when the lookup returns (R was committed at
    // every moment of the lookup).
    let now = table
        .get_by_index(&db.session(), "IX_Grp", &[Value::Int(0)])
        .unwrap();
    assert_eq!(sorted_ids(&now), vec![1, 10]);
    // R may come back under key 1 or 2 (where it was when read), but it must come back.
    assert_eq!(found.len(), 2, "the lookup returned {found:?}");
}

/// A lookup returns a row it had already returned, then saw moved to another clustered key
/// while it waited for another writer, once: it came back under both keys.
#[test]
fn an_index_lookup_returns_a_row_moved_after_it_was_read_once() {
    let (db, table) = moving_rows(&[1, 10]);
    let s = db.session();
    let w2 = db.session();
    w2.begin().unwrap();
    set_column(&table, &w2, 10, 2, 1);
    let found = lookup_group_zero_while(&db, &table, || {
        // The reader has returned row 1 and waits for row 10 (W2's).
        wait_for_lock_waits(&db, 1);
        // Row 1 moves to key 2 (autocommit); W2 deletes row 10 and commits.
        set_column(&table, &s, 1, 0, 2);
        assert!(table.delete(&w2, &[Value::Int(10)]).unwrap());
        w2.commit().unwrap();
    });
    assert_eq!(
        found.len(),
        1,
        "one row matched at every moment; the lookup returned {found:?}"
    );
}

/// A lookup through an index reads it a leaf at a time, so a row whose entry moves from one
/// end of the search key's range to the other meanwhile (autocommit updates of the second key
/// column) can be found twice: it was returned twice.
#[test]
fn an_index_lookup_returns_a_row_once_while_its_entry_moves() {
    let seed = seed();
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("Items")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .column(ColumnDef::new("Grp", DataType::Int).not_null())
                .column(ColumnDef::new("Val", DataType::Int).not_null())
                .clustered(IndexDef::new("PK_Items", &["Id"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new(
                    "IX_Grp_Val",
                    &["Grp", "Val"],
                    Uniqueness::NonUnique,
                )),
        )
        .unwrap();
    let session = db.session();
    let rows: Vec<InsertRow> = (0..3000)
        .map(|id| InsertRow::new().set(0, id).set(1, 1).set(2, id))
        .collect();
    table.insert_batch(&session, rows).unwrap();
    let moving = 1_000_000;
    table
        .insert(
            &session,
            InsertRow::new().set(0, moving).set(1, 1).set(2, -1),
        )
        .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let failure = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed);
            let session = db.session();
            let mut high = false;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                high = !high;
                let val = if high {
                    1_000_000 + rng.random_range(0..10)
                } else {
                    -1 - rng.random_range(0..10)
                };
                let change = [(2, Value::Int(val))];
                table
                    .update(&session, &[Value::Int(moving)], &change)
                    .unwrap();
            }
        });
        let start = std::time::Instant::now();
        let mut failure = None;
        while failure.is_none() && start.elapsed() < Duration::from_secs(2) {
            let rows = table
                .get_by_index(&session, "IX_Grp_Val", &[Value::Int(1)])
                .unwrap();
            let found = rows
                .iter()
                .filter(|row| row[0] == Value::Int(moving))
                .count();
            if rows.len() != 3001 || found != 1 {
                failure = Some((rows.len(), found));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        failure
    });
    assert_eq!(
        failure, None,
        "seed {seed}: (rows, times the moving row came back)"
    );
}

/// A checkpoint asked for while a close is writing its image waits for it, and then must not
/// write an image after the clean one: that image, not marked clean, made the next open take
/// the close for a crash and empty the non-logged table. It now fails with DatabaseClosed.
#[test]
fn a_checkpoint_queued_behind_a_close_does_not_undo_its_clean_image() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(9).sync_delay(Duration::from_millis(40)));
    let db = open(&fs);
    let scratch = db.create_table(orders().not_logged()).unwrap();
    let rows: Vec<InsertRow> = (0..20_000)
        .map(|_| InsertRow::new().set(1, "x".repeat(90)))
        .collect();
    scratch.insert_batch(&db.session(), rows).unwrap();
    drop(scratch);
    let other = db.clone();
    let racer = std::thread::spawn(move || {
        // The close's image takes several 40 ms fdatasyncs; this starts during them.
        std::thread::sleep(Duration::from_millis(60));
        other.checkpoint().map(|_| ())
    });
    db.close().unwrap();
    let raced = racer.join().unwrap();
    assert!(
        matches!(raced, Err(EngineError::DatabaseClosed)),
        "{raced:?}"
    );
    let db = open(&fs);
    assert_eq!(orders_rows(&db).len(), 20_000);
}

/// A clean close while a transaction that changed a non-logged table is still open does not
/// call its image clean: nothing in the log could undo those changes, so the next open treats
/// the table as after a crash and empties it. Before, the uncommitted row became permanent.
/// With the transaction ended (here rolled back) the close is clean and keeps the rows.
#[test]
fn a_close_during_an_open_change_to_a_non_logged_table_keeps_none_of_it() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(8));
    let db = open(&fs);
    let table = db.create_table(orders().not_logged()).unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(1, "committed"))
        .unwrap();
    session.begin().unwrap();
    table
        .insert(&session, InsertRow::new().set(1, "uncommitted"))
        .unwrap();
    db.clone().close().unwrap();
    let after = crash(&fs, CrashMode::KeepUnsynced, db, table, session);
    let db = open(&after);
    assert!(
        orders_rows(&db).is_empty(),
        "the open change makes the close unclean for the non-logged table"
    );

    let table = db.table("Orders").unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(1, "kept"))
        .unwrap();
    session.begin().unwrap();
    table
        .insert(&session, InsertRow::new().set(1, "rolled back"))
        .unwrap();
    session.rollback().unwrap();
    db.clone().close().unwrap();
    let after = crash(&after, CrashMode::KeepUnsynced, db, (session, table), ());
    let db = open(&after);
    let rows: Vec<String> = orders_rows(&db).into_values().collect();
    assert_eq!(
        rows,
        ["kept"],
        "with every transaction ended the close is clean"
    );
}

/// What a clean close keeps of a non-logged table while a transaction that tried to change it
/// is still open depends on what the transaction's statements left, not on whether they ran. A
/// transaction whose only statement on the table failed does not make the close unclean, and
/// the rows are kept, both when the statement failed before changing anything (an insert of a
/// duplicate key) and when it changed a row first and its rollback put the row back (an update
/// that moves a row onto an existing key: a delete, then an insert that fails). Before, any
/// statement on the table marked the transaction, and the close emptied the table (found by
/// `txn_oracle.rs` with `LASTPAGE_SEED=6980618124164082926`, an insert refused at the page
/// limit). A failed statement after one that succeeded still leaves the close unclean: the
/// earlier change is in the image and nothing could undo it.
#[test]
fn a_close_during_a_transaction_whose_change_to_a_non_logged_table_failed_keeps_the_table() {
    let note = |id: i32, text: &str| InsertRow::new().set(0, id).set(1, text);
    // Opens the database on `fs`, begins a transaction that inserts note 3 if `earlier` and
    // then fails a statement (an insert of a second note 1, or if `failing_move` an update of
    // note 2's key to 1), closes cleanly with that transaction open, crashes, and returns the
    // crashed copy with the texts of the notes its open finds.
    let close_after_a_failed_statement = |fs: &FaultyFileSystem, earlier, failing_move| {
        let db = open(fs);
        let table = db.table("Notes").unwrap();
        let session = db.session();
        session.begin().unwrap();
        if earlier {
            table.insert(&session, note(3, "uncommitted")).unwrap();
        }
        let failed = if failing_move {
            table
                .update(&session, &[Value::Int(2)], &[(0, Value::Int(1))])
                .map(drop)
        } else {
            table.insert(&session, note(1, "duplicate")).map(drop)
        };
        assert!(
            matches!(failed, Err(EngineError::DuplicateKey { .. })),
            "{failed:?}"
        );
        db.clone().close().unwrap();
        let after = crash(fs, CrashMode::KeepUnsynced, db, table, session);
        let int = |value: &Value| match value {
            Value::Int(id) => Some(*id),
            _ => None,
        };
        // Closed again, so that the next call's open is not after a crash.
        let db = open(&after);
        let texts: Vec<String> = text_by_key(&db, "Notes", 1, int).into_values().collect();
        db.close().unwrap();
        (after, texts)
    };
    let fs = FaultyFileSystem::new(FaultyConfig::new(9));
    let db = open(&fs);
    let table = db.create_table(notes().not_logged()).unwrap();
    let session = db.session();
    table.insert(&session, note(1, "one")).unwrap();
    table.insert(&session, note(2, "two")).unwrap();
    db.close().unwrap();
    drop((table, session));
    let (after, texts) = close_after_a_failed_statement(&fs, false, false);
    assert_eq!(
        texts,
        ["one", "two"],
        "a failed insert that changed nothing leaves the close clean"
    );
    let (after, texts) = close_after_a_failed_statement(&after, false, true);
    assert_eq!(
        texts,
        ["one", "two"],
        "a failed move whose rollback put the row back leaves the close clean"
    );
    let (_, texts) = close_after_a_failed_statement(&after, true, true);
    assert!(
        texts.is_empty(),
        "the earlier change of the open transaction makes the close unclean: {texts:?}"
    );
}

/// A close shuts the database down for every clone of its handle: a change after the clean
/// image would be in neither the image nor (for a table that is not logged) the log, so the
/// next open would trust an image that lost it. Before, a delete through another clone after
/// the close was acknowledged and then undone by the next open.
#[test]
fn a_closed_database_refuses_every_statement_through_its_other_handles() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(9));
    let db = open(&fs);
    let table = db.create_table(orders().not_logged()).unwrap();
    let session = db.session();
    for _ in 0..10 {
        table
            .insert(&session, InsertRow::new().set(1, "kept"))
            .unwrap();
    }
    db.clone().close().unwrap();
    let closed = |result: Result<(), EngineError>| {
        assert!(
            matches!(result, Err(EngineError::DatabaseClosed)),
            "{result:?}"
        );
    };
    closed(table.delete(&session, &[Value::BigInt(1)]).map(drop));
    closed(
        table
            .insert(&session, InsertRow::new().set(1, "late"))
            .map(drop),
    );
    closed(
        table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .map(drop),
    );
    closed(db.checkpoint().map(drop));
    let after = crash(&fs, CrashMode::KeepUnsynced, db, (session, table), ());
    let db = open(&after);
    let rows: Vec<String> = orders_rows(&db).into_values().collect();
    assert_eq!(
        rows,
        vec!["kept"; 10],
        "the clean close's image, and nothing after it"
    );
}

#[test]
fn delayed_durability_commits_at_once_and_a_forced_flush_makes_them_durable() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(6).sync_delay(Duration::from_millis(2)));
    let db = open_delayed(&fs);
    db.create_table(orders()).unwrap();
    let session = db.session();
    let fsyncs_before = db.wal_stats().unwrap().fsyncs;
    let ids = insert_orders(&db, &session, 200);
    assert_eq!(
        db.wal_stats().unwrap().fsyncs,
        fsyncs_before,
        "delayed commits do not wait for the log"
    );
    db.flush_log().unwrap();
    let after = crash(&fs, CrashMode::LoseUnsynced, db, session, ());
    let db = open(&after);
    let rows = orders_rows(&db);
    for id in ids {
        assert!(rows.contains_key(&id));
    }
}

/// A pipelined commit's WRITELOG wait, done when its ticket is waited on, is the committing
/// session's, as a FULL commit's is (it was only in the global statistics).
#[test]
fn a_commit_tickets_wait_is_its_sessions() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(3).sync_delay(Duration::from_millis(20)));
    let db = open(&fs);
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    session.begin().unwrap();
    table
        .insert(&session, InsertRow::new().set(0, 1).set(1, 1))
        .unwrap();
    let ticket = session.commit_pipelined().unwrap();
    let before = session.waits().wait(WaitType::WriteLog).waiting_tasks_count;
    ticket.wait().unwrap();
    let after = session.waits().wait(WaitType::WriteLog).waiting_tasks_count;
    assert_eq!(after, before + 1);
}

/// A flush that a pipelined commit requests while the background flusher waits in the log's
/// group commit for another committer's flush is not lost. That wait parks the flusher, and the
/// park used up the wake-up, so the commit stayed in the log buffer for the whole interval (an
/// hour here) unless someone else flushed. The steps: A's FULL commit leads a slow flush; B's
/// FULL commit and P's pipelined one queue behind it (P wakes the flusher, which waits); when
/// A's flush ends, B or the flusher leads the next one. C's pipelined commit comes during that
/// flush: if B leads it, the flusher is parked, and before the fix it parked for an hour after.
#[test]
fn a_flush_requested_while_the_flusher_waits_for_a_group_commit_is_not_lost() {
    let step = Duration::from_millis(60);
    let fs = FaultyFileSystem::new(FaultyConfig::new(31).sync_delay(step * 5));
    let db = Database::open(DIR, options_without_background_flush(&fs)).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let full_commit = |id: i64| {
        let table = Arc::clone(&table);
        let session = db.session();
        std::thread::spawn(move || {
            table
                .insert(&session, InsertRow::new().set(0, id).set(1, id))
                .unwrap();
        })
    };
    let session = db.session();
    let pipelined = |id: i64| {
        session.begin().unwrap();
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, id))
            .unwrap();
        session.commit_pipelined().unwrap()
    };
    let a = full_commit(1);
    std::thread::sleep(step);
    let b = full_commit(2);
    std::thread::sleep(step);
    let p = pipelined(3);
    // A's flush ends at 5 steps; the next one runs until 10.
    std::thread::sleep(step * 5);
    let c = pipelined(4);
    a.join().unwrap();
    b.join().unwrap();
    // Nobody waits for C's ticket: only the background flusher can make it durable.
    wait_until(
        Duration::from_secs(10),
        "the pipelined commit's flush request was lost",
        || c.is_durable(),
    );
    p.wait().unwrap();
    c.wait().unwrap();
}

#[test]
fn pipelined_commits_are_durable_once_their_ticket_returns() {
    // One session pipelines batches: it commits batch n with `commit_pipelined` and waits for
    // batch n-1's ticket only after building batch n, as an ingesting application would. Only
    // batches whose ticket returned are acknowledged; some tickets are dropped unwaited (a
    // DELAYED commit). After a crash every acknowledged batch is there, every batch is there
    // whole or not at all, and the open transaction is gone. The flusher wakes for a pipelined
    // commit by itself: the interval flush is an hour away, and fsyncs take a millisecond, so
    // the next batch is built while the previous one is being flushed.
    let seed = seed();
    for round in 0..12u64 {
        let round_seed = seed.wrapping_add(round);
        let mut rng = StdRng::seed_from_u64(round_seed);
        let fs = FaultyFileSystem::new(
            FaultyConfig::new(round_seed).sync_delay(Duration::from_millis(1)),
        );
        let db = Database::open(DIR, options_without_background_flush(&fs)).unwrap();
        let table = db.create_table(orders()).unwrap();
        let session = db.session();
        let mut batches: Vec<Vec<i64>> = Vec::new();
        let mut acked: BTreeSet<usize> = BTreeSet::new();
        let mut in_flight: Option<(usize, CommitTicket)> = None;
        for batch in 0..30usize {
            session.begin().unwrap();
            let rows = (0..rng.random_range(1..40))
                .map(|i| InsertRow::new().set(1, format!("b{batch}-{i}")))
                .collect();
            let ids: Vec<i64> = table
                .insert_batch(&session, rows)
                .unwrap()
                .into_iter()
                .map(Option::unwrap)
                .collect();
            batches.push(ids);
            let ticket = session.commit_pipelined().unwrap();
            if batch == 0 {
                // Nobody waits and the interval flush is an hour away: the commit becomes
                // durable only because the flusher was asked to flush at once.
                let asked = std::time::Instant::now();
                while !ticket.is_durable() {
                    assert!(
                        asked.elapsed() < Duration::from_secs(60),
                        "round {round}: a pipelined commit was never flushed"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if let Some((previous, ticket)) = in_flight.replace((batch, ticket)) {
                if rng.random_range(0..5) == 0 {
                    drop(ticket);
                } else {
                    ticket.wait().unwrap();
                    acked.insert(previous);
                }
            }
        }
        // A transaction still open at the crash.
        let open_session = db.session();
        open_session.begin().unwrap();
        let uncommitted = insert_order(&db, &open_session).unwrap();
        let mode = CRASH_MODES[(round % 3) as usize];
        let after = crash(&fs, mode, db, (session, table, in_flight), open_session);
        let db = open(&after);
        let rows = orders_rows(&db);
        for (batch, ids) in batches.iter().enumerate() {
            let present = ids.iter().filter(|id| rows.contains_key(id)).count();
            assert!(
                present == 0 || present == ids.len(),
                "round {round}: batch {batch} is torn: {present} of {} rows",
                ids.len()
            );
            assert!(
                present > 0 || !acked.contains(&batch),
                "round {round}: acknowledged batch {batch} lost"
            );
        }
        assert!(!rows.contains_key(&uncommitted), "round {round}");
        db.check_integrity().unwrap();
    }
}

#[test]
fn a_pipelined_commit_whose_flush_fails_is_not_acknowledged() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(8));
    let db = open(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let before = insert_orders(&db, &session, 10);
    fs.inject(FaultRule::syncs_fail_from(1));
    session.begin().unwrap();
    table
        .insert_batch(&session, vec![InsertRow::new().set(1, "doomed"); 5])
        .unwrap();
    let ticket = session.commit_pipelined().unwrap();
    let error = ticket.wait().unwrap_err();
    assert!(
        matches!(error, EngineError::LogFailed(_)),
        "a failed fsync must fail the pipelined commit: {error}"
    );
    assert!(matches!(
        session
            .begin()
            .and_then(|()| session.commit_pipelined().map(drop)),
        Err(EngineError::DatabaseFailed(_))
    ));
    let after = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    assert_orders_survived(&after, &before);
}

#[test]
fn a_log_missing_or_damaged_before_its_end_is_refused_not_silently_replaced() {
    // Damage that a crash cannot cause must stop the open, before the writer cuts anything
    // off and before the open's checkpoint: appending to such a log would bury acknowledged
    // commits, or write new ones below the checkpoint where the next recovery skips them.
    let fs = FaultyFileSystem::new(FaultyConfig::new(12));
    let db = open(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let batch = |tag: &str| {
        (0..100)
            .map(|i| InsertRow::new().set(1, format!("{tag}-{i}-{}", "x".repeat(60))))
            .collect::<Vec<_>>()
    };
    // About 1.5 MB of log in 256 KiB segments, with a checkpoint about 850 KB in: it removes
    // the segments before the one before its own (0 and 1), and replay starts in segment 3.
    for round in 0..120 {
        table.insert_batch(&session, batch("a")).unwrap();
        if round == 70 {
            db.checkpoint().unwrap();
        }
    }
    let expected = orders_rows(&db);
    let crashed = crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ());
    let wal_dir = Path::new(DIR).join("wal");
    let segments = |fs: &FaultyFileSystem| {
        let mut names: Vec<_> = fs
            .list_dir(&wal_dir)
            .unwrap()
            .into_iter()
            .filter(|name| name.extension().is_some_and(|extension| extension == "wal"))
            .map(|name| wal_dir.join(name))
            .collect();
        names.sort();
        names
    };
    assert!(
        segments(&crashed).len() >= 3 && !segments(&crashed)[0].ends_with("0000000000000000.wal"),
        "{:?}",
        segments(&crashed)
    );
    let refused = |fs: &FaultyFileSystem, case: &str| match Database::open(DIR, options(fs)) {
        Err(error) => assert!(
            error.to_string().contains("missing or damaged"),
            "{case}: {error}"
        ),
        Ok(db) => panic!("{case}: opened with {} rows", orders_rows(&db).len()),
    };
    // The log's segments are all gone: the data file's checkpoint needs log it cannot have.
    let copy = crashed.crash_with(CrashMode::LoseUnsynced);
    for segment in segments(&copy) {
        copy.remove(&segment).unwrap();
    }
    refused(&copy, "no log");
    // A record in the middle of a segment that has valid segments after it is damaged:
    // replay stops there, but the log goes on.
    let copy = crashed.crash_with(CrashMode::LoseUnsynced);
    let middle = &segments(&copy)[segments(&copy).len() - 2];
    let file = copy.open(middle, OpenOptions::existing()).unwrap();
    let at = file.len().unwrap() / 2;
    let mut byte = [0u8; 1];
    file.read_exact_at(at, &mut byte).unwrap();
    file.write_all_at(at, &[byte[0] ^ 0x10]).unwrap();
    file.sync_data().unwrap();
    refused(&copy, "a damaged record with valid log after it");
    // The data file is gone and the log no longer starts at its beginning (the checkpoint
    // truncated it): replaying what is left would make a database without its tables.
    let copy = crashed.crash_with(CrashMode::LoseUnsynced);
    copy.remove(&Path::new(DIR).join("data.lp")).unwrap();
    refused(&copy, "no data file and a truncated log");
    // Untouched, the database opens with every row.
    let db = open(&crashed.crash_with(CrashMode::LoseUnsynced));
    assert_eq!(orders_rows(&db), expected);
    db.check_integrity().unwrap();
}

#[test]
fn a_torn_log_tail_is_cut_and_the_database_opens() {
    let seed = seed();
    for round in 0..8 {
        let fs = FaultyFileSystem::new(
            FaultyConfig::new(seed.wrapping_add(round)).tear(lastpage_io::Tear::Bytes),
        );
        let db = open_delayed(&fs);
        db.create_table(orders()).unwrap();
        let session = db.session();
        for _ in 0..300 {
            insert_order(&db, &session).unwrap();
            if rand::random::<u8>() < 8 {
                // Some flushes, so the crash finds synced and unsynced log.
                db.flush_log().unwrap();
            }
        }
        let after = crash(&fs, CrashMode::Random, db, session, ());
        let db = open(&after);
        let rows = orders_rows(&db);
        // Whatever survived is a prefix of the commits (ids were taken in order).
        let ids: Vec<i64> = rows.keys().copied().collect();
        let expected: Vec<i64> = (1..=ids.len() as i64).collect();
        assert_eq!(ids, expected, "round {round}: not a prefix");
        db.check_integrity().unwrap();
        let session = db.session();
        insert_order(&db, &session).unwrap();
    }
    let _ = Path::new(DIR);
}

#[test]
fn readers_never_see_rows_of_transactions_that_roll_back() {
    for durable in [false, true] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(12));
        let db = if durable {
            open(&fs)
        } else {
            Database::create(DatabaseOptions::default()).unwrap()
        };
        let table = db.create_table(orders()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let seen_committed = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for writer in 0..3 {
                let db = db.clone();
                let table = Arc::clone(&table);
                scope.spawn(move || {
                    let session = db.session();
                    for round in 0..150 {
                        session.begin().unwrap();
                        let doomed = (round + writer) % 2 == 0;
                        let payload = if doomed { "doomed" } else { "kept" };
                        for _ in 0..3 {
                            table
                                .insert(&session, InsertRow::new().set(1, payload))
                                .unwrap();
                        }
                        if doomed {
                            session.rollback().unwrap();
                        } else {
                            session.commit().unwrap();
                        }
                    }
                });
            }
            for _ in 0..2 {
                let db = db.clone();
                let table = Arc::clone(&table);
                let stop = &stop;
                let seen_committed = &seen_committed;
                scope.spawn(move || {
                    let session = db.session();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for row in table
                            .scan(&session, &KeyRange::all(), Direction::Forward)
                            .unwrap()
                        {
                            let row = row.unwrap();
                            assert_ne!(
                                row[1],
                                Value::from("doomed"),
                                "a reader saw a row of a transaction that rolled back"
                            );
                            seen_committed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let id = rand::random_range(1..2000i64);
                        if let Some(row) = table.get(&session, &[Value::BigInt(id)]).unwrap() {
                            assert_ne!(row[1], Value::from("doomed"));
                        }
                    }
                });
            }
            // Stop the readers once the writers are done.
            std::thread::sleep(Duration::from_millis(10));
            while table.row_count() < 3 * 75 * 3 {
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(table.row_count(), 3 * 75 * 3, "durable={durable}");
        assert!(seen_committed.load(std::sync::atomic::Ordering::Relaxed) > 0);
        db.check_integrity().unwrap();
    }
}

#[test]
fn a_database_directory_is_opened_by_one_handle_at_a_time() {
    let dir = std::env::temp_dir().join(format!(
        "lastpage-lock-test-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let first = Database::open(&dir, DatabaseOptions::default()).unwrap();
    let error = Database::open(&dir, DatabaseOptions::default())
        .err()
        .expect("a second open of the same directory must fail");
    assert!(error.to_string().contains("already open"), "{error}");
    drop(first);
    let again = Database::open(&dir, DatabaseOptions::default()).unwrap();
    drop(again);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Dropping the last handle stops the background threads before it returns, waiting for an
/// automatic checkpoint in progress: no thread of the dropped database still holds (or writes
/// to) the directory, whose lock is free at once. Before, the checkpoint went on holding the
/// database, and an open right after the drop waited for it or failed as "already open".
/// Dropping the last handle returns once the background threads see the stop, even if the
/// log flusher was parked in the log's group commit (behind an automatic checkpoint's flush)
/// when the drop unparked it: that used up the wake-up, and the flusher then slept its whole
/// DELAYED interval (60 s here) before it saw the stop, with the drop waiting for it.
#[test]
fn dropping_the_last_handle_while_the_flusher_waits_in_a_group_commit_returns_promptly() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(36).sync_delay(Duration::from_millis(100)));
    let db = Database::open(
        DIR,
        DatabaseOptions {
            durability: Durability::Delayed,
            delayed_flush_interval: Duration::from_secs(60),
            checkpoint_log_bytes: 256 << 10,
            wal: WalConfig {
                buffer_bytes: 8 << 20,
                segment_bytes: 64 << 10,
                ..WalConfig::default()
            },
            ..options(&fs)
        },
    )
    .unwrap();
    let table = db.create_table(orders()).unwrap();
    let accounts = db.create_table(accounts()).unwrap();
    let session = db.session();
    accounts
        .insert(&session, InsertRow::new().set(0, 0).set(1, 0))
        .unwrap();
    db.checkpoint().unwrap();
    for _ in 0..10 {
        let rows: Vec<InsertRow> = (0..1000)
            .map(|_| InsertRow::new().set(1, "x".repeat(90)))
            .collect();
        table.insert_batch(&session, rows).unwrap();
    }
    // The automatic checkpoint starts and leads a long log flush.
    let fsyncs_before = db.wal_stats().unwrap().fsyncs;
    let started = std::time::Instant::now();
    while db.wal_stats().unwrap().fsyncs == fsyncs_before {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no checkpoint started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A pipelined commit wakes the flusher, which parks behind the checkpoint's flush.
    session.begin().unwrap();
    accounts
        .insert(&session, InsertRow::new().set(0, 1).set(1, 1))
        .unwrap();
    let ticket = session.commit_pipelined().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop((ticket, session, table, accounts));
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        drop(db);
        let _ = sender.send(started.elapsed());
    });
    let took = receiver.recv_timeout(Duration::from_secs(30));
    assert!(
        took.is_ok(),
        "dropping the last handle did not return within 30 s"
    );
}

#[test]
fn dropping_the_last_handle_waits_for_an_automatic_checkpoint_and_frees_the_directory() {
    // Every fdatasync takes 40 ms, so the automatic checkpoint (several of them) is still
    // running when the handle goes.
    let fs = FaultyFileSystem::new(FaultyConfig::new(31).sync_delay(Duration::from_millis(40)));
    let db = open_checkpointing_every_16_kib(&fs);
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    let rows = orders_of_80_bytes();
    table.insert_batch(&session, rows).unwrap();
    let lock_path = Path::new(DIR).join("lock");
    let probe = fs.open(&lock_path, OpenOptions::existing()).unwrap();
    assert!(
        !probe.try_lock().unwrap(),
        "the open database holds its lock"
    );
    // The checkpointer looks every 100 ms; give it time to start.
    std::thread::sleep(Duration::from_millis(150));
    drop((session, table));
    let started = std::time::Instant::now();
    drop(db);
    println!("the drop took {:?}", started.elapsed());
    assert!(
        probe.try_lock().unwrap(),
        "a background thread still holds the dropped database"
    );
    drop(probe);
    let db = open(&fs);
    assert_eq!(orders_rows(&db).len(), 500);
}

/// A full disk under the data file fails the automatic checkpoints without stopping the
/// database, and says so (`Database::automatic_checkpoint_failure`): commits go on in the log,
/// which cannot be truncated meanwhile. Once there is room, a later attempt succeeds and the
/// failure is cleared. Before, the checkpointer threw the error away and retried every 100 ms.
#[test]
fn automatic_checkpoints_on_a_full_disk_fail_visibly_and_succeed_once_there_is_room() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(41));
    let db = open_checkpointing_every_16_kib(&fs);
    db.create_table(orders()).unwrap();
    let session = db.session();
    fs.inject(FaultRule::disk_full_after(0).on_path(Path::new(DIR).join(DATA_FILE_NAME)));
    // More than 16 KiB of log, so that the checkpointer starts.
    let mut acknowledged = insert_orders(&db, &session, 300);
    // Bounded polls, not timings: each waits for the background thread's next attempt.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (failures, error) = loop {
        if let Some(failure) = db.automatic_checkpoint_failure() {
            break failure;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no automatic checkpoint failed in 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        failures >= 1 && error.contains("no space"),
        "{failures}: {error}"
    );
    acknowledged.push(insert_order(&db, &session).unwrap());
    fs.clear_faults();
    while db.automatic_checkpoint_failure().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "no automatic checkpoint succeeded in 60 s once there was room"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = crash(&fs, CrashMode::LoseUnsynced, db, session, ());
    assert_orders_survived(&after, &acknowledged);
}

#[test]
fn a_full_disk_fails_the_commit_and_nothing_acknowledged_is_lost() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(13));
    let db = open(&fs);
    db.create_table(orders()).unwrap();
    let session = db.session();
    let mut acked = Vec::new();
    fs.inject(FaultRule::disk_full_after(64 << 10));
    let error = loop {
        match insert_order(&db, &session) {
            Ok(id) => acked.push(id),
            Err(error) => break error,
        }
        assert!(acked.len() < 100_000, "the disk never filled");
    };
    assert!(
        matches!(error, EngineError::LogFailed(_)),
        "a commit that could not be written must fail: {error}"
    );
    assert!(!acked.is_empty(), "{error}");
    let refused = insert_order(&db, &session).unwrap_err();
    assert!(
        matches!(refused, EngineError::DatabaseFailed(_)),
        "{refused}"
    );
    let after = crash(&fs, CrashMode::Random, db, session, ());
    let db = open(&after);
    let rows = orders_rows(&db);
    for id in acked {
        assert!(rows.contains_key(&id), "acknowledged {id} lost");
    }
    db.check_integrity().unwrap();
}

/// A new database's directory is as durable as the commits made in it. Before, the open
/// created it and never synced its parent: the log writer made `wal/` durable inside it and
/// the pool the data file, but a crash that lost the directory's own name (which no sync had
/// made durable) lost the whole database with every acknowledged commit; a missing parent the
/// open created was no better. The fault-injecting file system keeps a new directory's name
/// only once its parent is synced, as a real one need not either.
#[test]
fn a_new_database_directory_survives_a_crash_with_its_acknowledged_commits() {
    for dir in [DIR, "/srv/lastpage/db"] {
        let fs = FaultyFileSystem::new(FaultyConfig::new(31));
        let db = Database::open(dir, options(&fs)).unwrap();
        db.create_table(orders()).unwrap();
        let session = db.session();
        let acknowledged = insert_orders(&db, &session, 10);
        let after = crash(&fs, CrashMode::LoseUnsynced, db, session, ());
        assert!(
            after.exists(Path::new(dir)).unwrap(),
            "{dir}: the crash took the database's directory"
        );
        let rows = orders_rows(&Database::open(dir, options(&after)).unwrap());
        for id in &acknowledged {
            assert!(rows.contains_key(id), "{dir}: acknowledged {id} lost");
        }
    }
}

/// Table names differing only in the case of a non-ASCII letter are two tables, to the
/// database and to its catalog alike. Before, the catalog's check folded all of Unicode and
/// refused the pair, so every checkpoint failed and the database could not be opened again.
#[test]
fn table_names_differing_in_non_ascii_case_survive_checkpoints_and_reopening() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(23));
    let table = |name: &str| TableDef::new(name).column(ColumnDef::new("V", DataType::Int));
    {
        let db = open(&fs);
        db.create_table(table("É")).unwrap();
        db.create_table(table("é")).unwrap();
        db.create_table(table("STRASSE")).unwrap();
        assert!(matches!(
            db.create_table(table("strasse")),
            Err(EngineError::TableExists(_))
        ));
        db.checkpoint().unwrap();
        db.close().unwrap();
    }
    let db = open(&fs);
    for name in ["É", "é", "Strasse"] {
        db.table(name).unwrap();
    }
    db.checkpoint().unwrap();
}

/// `Undone(K INT PRIMARY KEY, V INT, Code INT, Pad VARCHAR(120))` with a non-unique index on
/// V and a unique one on Code; or, `partitioned`, hash-partitioned on K, whose unique index
/// then has to hold K too (on Code, K).
fn undone_table(partitioned: bool) -> TableDef {
    let table = TableDef::new("Undone")
        .column(ColumnDef::new("K", DataType::Int).not_null())
        .column(ColumnDef::new("V", DataType::Int).not_null())
        .column(ColumnDef::new("Code", DataType::Int).not_null())
        .column(ColumnDef::new("Pad", DataType::VarChar(120)).not_null())
        .clustered(IndexDef::new("PK_Undone", &["K"], Uniqueness::PrimaryKey))
        .nonclustered(IndexDef::new("IX_Undone_V", &["V"], Uniqueness::NonUnique));
    if partitioned {
        table
            .nonclustered(IndexDef::new(
                "UX_Undone_Code",
                &["Code", "K"],
                Uniqueness::UniqueIndex,
            ))
            .partitioned("K", 4)
    } else {
        table.nonclustered(IndexDef::new(
            "UX_Undone_Code",
            &["Code"],
            Uniqueness::UniqueIndex,
        ))
    }
}

fn undone_row(k: i32, v: i32, code: i32, pad: &str) -> InsertRow {
    InsertRow::new()
        .set(0, Value::Int(k))
        .set(1, Value::Int(v))
        .set(2, Value::Int(code))
        .set(3, Value::String(pad.to_owned()))
}

/// A transaction's undo list keeps no copy of an inserted row's value: undoing the insert reads
/// it back from the tree, and the compensation's log record and the nonclustered entries it
/// removes follow from what was read. This rolls back a transaction that inserts rows (one
/// statement each, and as batches, whose rows' keys and values share one buffer) into a
/// table with a unique and a non-unique nonclustered index (partitioned, and not) and into an
/// identity-keyed table, updates them (their indexed columns and their length, some twice),
/// moves some to other keys, deletes some and inserts one back under the same key, and
/// changes committed rows too. Read back wrong (a value other than the inserted one, or its
/// entries left in the indexes), the rollback would leave entries behind or take committed
/// rows' entries away: the tables must hold exactly their committed rows and pass the
/// integrity check (which matches every index entry to its row), as must the database reopened
/// after a crash, whose recovery replays the compensations from their log records.
///
/// Each case runs twice: with the default undo list, and with one that keeps at most 7 entries
/// between statements, so that the transaction lets its entries go after most statements and
/// its rollback undoes most of its changes from the log instead: the statement that fails, and
/// the rows moved and changed again, then have their compensations in the part read back. That
/// run also has another session commit about a megabyte of log (several segments) and take a
/// checkpoint in the middle of the transaction, which must keep the log the rollback reads.
#[test]
fn a_rolled_back_transaction_leaves_no_row_or_index_entry_of_its_inserts() {
    let seed = seed();
    let cases = CRASH_MODES.into_iter().zip([true, false, true]);
    for ((mode, partitioned), undo_kept_entries) in
        cases.flat_map(|case| [(case, None), (case, Some(7))])
    {
        let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
        let db = match undo_kept_entries {
            Some(kept) => open_keeping_undo_entries(&fs, kept),
            None => open(&fs),
        };
        let undone = db.create_table(undone_table(partitioned)).unwrap();
        let orders_table = db.create_table(orders()).unwrap();
        let session = db.session();
        for k in 0..40 {
            let row = undone_row(k, k % 4, k, &format!("committed {k}"));
            undone.insert(&session, row).unwrap();
        }
        insert_orders(&db, &session, 10);
        let committed = (
            common::rows(&undone, &session),
            common::rows(&orders_table, &session),
        );
        db.check_integrity().unwrap();

        session.begin().unwrap();
        // Rows inserted one statement each, and a batch.
        for k in 100..140 {
            let pad = "i".repeat(k as usize % 100);
            undone
                .insert(&session, undone_row(k, k % 3, 10_000 + k, &pad))
                .unwrap();
        }
        let batch = (200..260)
            .map(|k| undone_row(k, k % 5, 20_000 + k, &"b".repeat(k as usize % 90)))
            .collect();
        undone.insert_batch(&session, batch).unwrap();
        if undo_kept_entries.is_some() {
            let load = db.create_table(accounts()).unwrap();
            let loader = db.session();
            for batch in 0..20 {
                let rows = (0..1000)
                    .map(|n| InsertRow::new().set(0, batch * 1000 + n).set(1, n))
                    .collect();
                load.insert_batch(&loader, rows).unwrap();
            }
            db.checkpoint().unwrap();
        }
        // Their indexed columns and their lengths change, some rows' twice.
        for k in (100..140).chain(200..260).step_by(3) {
            let changes = [
                (1, Value::Int(50 + k % 7)),
                (2, Value::Int(30_000 + k)),
                (3, Value::String("u".repeat(120))),
            ];
            assert!(undone.update(&session, &[Value::Int(k)], &changes).unwrap());
        }
        for k in (100..140).chain(200..260).step_by(5) {
            let changes = [(1, Value::Int(k)), (3, Value::String(String::new()))];
            assert!(undone.update(&session, &[Value::Int(k)], &changes).unwrap());
        }
        // Some move to other keys (a delete and an insert, often into another partition), and
        // change again there.
        for k in (102..140).chain(202..260).step_by(6) {
            let moved = [(0, Value::Int(k + 1000))];
            assert!(undone.update(&session, &[Value::Int(k)], &moved).unwrap());
            let changes = [(1, Value::Int(k % 11)), (2, Value::Int(40_000 + k))];
            assert!(
                undone
                    .update(&session, &[Value::Int(k + 1000)], &changes)
                    .unwrap()
            );
        }
        // Some go, and one comes back under its key with other values.
        for k in [101, 139, 203, 259] {
            assert!(undone.delete(&session, &[Value::Int(k)]).unwrap());
        }
        undone
            .insert(&session, undone_row(101, 77, 50_101, "back"))
            .unwrap();
        // Committed rows change, move and go too.
        for k in (0..40).step_by(5) {
            let changes = [(1, Value::Int(90 + k)), (2, Value::Int(60_000 + k))];
            assert!(undone.update(&session, &[Value::Int(k)], &changes).unwrap());
        }
        let moved = [(0, Value::Int(5_007))];
        assert!(undone.update(&session, &[Value::Int(7)], &moved).unwrap());
        for k in [3, 11] {
            assert!(undone.delete(&session, &[Value::Int(k)]).unwrap());
        }
        // A statement that fails (a duplicate key) takes back only itself.
        let duplicate = undone.insert(&session, undone_row(110, 0, 1, "dup"));
        assert!(duplicate.is_err(), "key 110 is taken: {duplicate:?}");
        // The identity-keyed table: rows one statement each, a batch at the tail, updates.
        let ids = insert_orders(&db, &session, 20);
        let batch = (0..30)
            .map(|n| InsertRow::new().set(1, format!("batch {n}")))
            .collect();
        orders_table.insert_batch(&session, batch).unwrap();
        for id in ids.iter().step_by(4) {
            let changes = [(1, Value::String("changed".into()))];
            assert!(
                orders_table
                    .update(&session, &[Value::BigInt(*id)], &changes)
                    .unwrap()
            );
        }
        db.check_integrity().unwrap();
        let before_rollback = db.undo_stats();
        session.rollback().unwrap();
        let undo = db.undo_stats();
        if undo_kept_entries.is_some() {
            assert!(
                before_rollback.spills > 10 && undo.undone_from_log > 100,
                "{undo:?}"
            );
        } else {
            assert_eq!(undo, lastpage_engine::UndoStats::default());
        }

        let after_rollback = (
            common::rows(&undone, &session),
            common::rows(&orders_table, &session),
        );
        assert_eq!(
            after_rollback, committed,
            "the rollback left changes behind"
        );
        db.check_integrity()
            .unwrap_or_else(|error| panic!("after the rollback: {error}"));

        let after = crash(&fs, mode, db, (undone, orders_table, session), ());
        let db = open(&after);
        let session = db.session();
        let reopened = (
            common::rows(&db.table("Undone").unwrap(), &session),
            common::rows(&db.table("Orders").unwrap(), &session),
        );
        assert_eq!(
            reopened, committed,
            "{mode:?}, partitioned {partitioned}, {undo_kept_entries:?}: recovery brought changes \
             back"
        );
        db.check_integrity().unwrap_or_else(|error| {
            panic!("{mode:?}, partitioned {partitioned}: after recovery: {error}")
        });
        // The codes the transaction used are free again.
        let undone = db.table("Undone").unwrap();
        for k in (100..140).step_by(3) {
            undone
                .insert(&session, undone_row(k, 0, 30_000 + k, "again"))
                .unwrap();
        }
        db.check_integrity().unwrap();
    }
}
