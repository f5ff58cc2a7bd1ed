//! A database that runs out of room: its page limit (`DatabaseOptions::max_pages`, a stand-in
//! for `MAX_PAGES`) and a full disk (`FaultRule::disk_full_after`). Every statement that needs a
//! page it cannot get fails with a clear error and leaves nothing behind; committed rows stay
//! readable, the integrity check passes, and the database reopens with every acknowledged row.

use std::collections::BTreeMap;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, EngineError, IndexDef, InsertRow, TableDef,
    Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem};

mod common;

use common::{DIR, bigint, crash, seeded_rng, text_by_key};

/// The shared test options at a page limit of `max_pages`.
fn options(fs: &FaultyFileSystem, max_pages: usize) -> DatabaseOptions {
    DatabaseOptions {
        max_pages,
        ..common::options(fs)
    }
}

/// `Orders(Id BIGINT IDENTITY PRIMARY KEY, Tag INT NOT NULL, Payload VARCHAR(8000) NOT NULL)`
/// with a nonclustered index on `Tag` if `indexed`, hash-partitioned on `Part` if `partitions`
/// is above one.
fn orders(indexed: bool, partitions: u16) -> TableDef {
    let mut table = TableDef::new("Orders")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
        .column(ColumnDef::new("Tag", DataType::Int).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null());
    if partitions > 1 {
        table = table
            .column(ColumnDef::new("Part", DataType::TinyInt).not_null())
            .clustered(IndexDef::new(
                "PK_Orders",
                &["Part", "Id"],
                Uniqueness::PrimaryKey,
            ))
            .partitioned("Part", partitions);
    } else {
        table = table.clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey));
    }
    if indexed {
        table = table.nonclustered(IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique));
    }
    table
}

fn row(id_tag: i64, payload_len: usize, partitions: u16) -> InsertRow {
    let row = InsertRow::new()
        .set(1, (id_tag % 1000) as i32)
        .set(2, "x".repeat(payload_len));
    if partitions > 1 {
        row.set(3, (id_tag % i64::from(partitions)) as i32)
    } else {
        row
    }
}

/// The clustered key that the update and delete loops use for identity `id` in [`orders`] of
/// `partitions` partitions: when the table is partitioned, `id` modulo `partitions` leads as
/// the partition.
fn key(id: i64, partitions: u16) -> Vec<Value> {
    if partitions > 1 {
        vec![
            Value::TinyInt((id % i64::from(partitions)) as u8),
            Value::BigInt(id),
        ]
    } else {
        vec![Value::BigInt(id)]
    }
}

/// Every row of `table`: id (read by `id_of` from column 0) -> the length of the text in
/// column `payload_column`; then the integrity check, and the row count against the rows read.
fn payload_lengths<K: Ord + Copy + std::fmt::Debug>(
    db: &Database,
    table: &str,
    payload_column: usize,
    id_of: impl Fn(&Value) -> Option<K>,
) -> BTreeMap<K, usize> {
    let rows: BTreeMap<K, usize> = text_by_key(db, table, payload_column, id_of)
        .into_iter()
        .map(|(id, text)| (id, text.len()))
        .collect();
    db.check_integrity().unwrap();
    assert_eq!(
        db.table(table).unwrap().row_count(),
        rows.len() as u64,
        "row count"
    );
    rows
}

/// Every row of `Orders`: id -> payload length, and the integrity check.
fn contents(db: &Database) -> BTreeMap<i64, usize> {
    payload_lengths(db, "Orders", 2, bigint)
}

fn is_full(error: &EngineError) -> bool {
    matches!(error, EngineError::PoolFull(_))
}

#[test]
fn a_database_at_its_page_limit_fails_statements_cleanly_and_reopens() {
    for (indexed, partitions) in [(false, 1), (true, 1), (true, 4)] {
        for payload_len in [100, 7900] {
            for max_pages in [4, 12, 60] {
                let context = format!(
                    "indexed {indexed}, {partitions} partitions, {payload_len}-byte rows, \
                     max_pages {max_pages}"
                );
                println!("{context}");
                let fs = FaultyFileSystem::new(FaultyConfig::new(1));
                let db = Database::open(DIR, options(&fs, max_pages)).unwrap();
                let table = match db.create_table(orders(indexed, partitions)) {
                    Ok(table) => table,
                    Err(error) => {
                        assert!(is_full(&error), "{context}: create: {error}");
                        continue;
                    }
                };
                let session = db.session();
                let mut expected = BTreeMap::new();
                let mut failures = 0;
                for n in 1..100_000i64 {
                    match table.insert(&session, row(n, payload_len, partitions)) {
                        Ok(id) => {
                            expected.insert(id.unwrap(), payload_len);
                        }
                        Err(error) => {
                            assert!(is_full(&error), "{context}: insert: {error}");
                            failures += 1;
                            if failures == 5 {
                                break;
                            }
                        }
                    }
                }
                assert_eq!(contents(&db), expected, "{context}: after single rows");
                // A multi-row statement that cannot fit leaves nothing behind.
                let batch: Vec<InsertRow> =
                    (0..50).map(|n| row(n, payload_len, partitions)).collect();
                let error = table.insert_batch(&session, batch).unwrap_err();
                assert!(is_full(&error), "{context}: batch: {error}");
                assert_eq!(contents(&db), expected, "{context}: after a failed batch");
                // So does an explicit transaction's statement; the transaction goes on.
                session.begin().unwrap();
                let batch: Vec<InsertRow> =
                    (0..50).map(|n| row(n, payload_len, partitions)).collect();
                assert!(table.insert_batch(&session, batch).is_err());
                session.commit().unwrap();
                assert_eq!(
                    contents(&db),
                    expected,
                    "{context}: after a failed batch in a txn"
                );
                // Growing every row: some fail, the rest change, nothing else moves.
                for (&id, len) in expected.iter_mut() {
                    let key = key(id, partitions);
                    match table.update(&session, &key, &[(2, Value::from("y".repeat(7900)))]) {
                        Ok(true) => *len = 7900,
                        Ok(false) => panic!("{context}: update of {id} found nothing"),
                        Err(error) => assert!(is_full(&error), "{context}: update: {error}"),
                    }
                }
                assert_eq!(contents(&db), expected, "{context}: after updates");
                db.checkpoint().unwrap();
                // Deletes free room on their pages; rows that fit there go in again.
                let ids: Vec<i64> = expected.keys().copied().collect();
                for &id in ids.iter().step_by(2) {
                    let key = key(id, partitions);
                    assert!(table.delete(&session, &key).unwrap(), "{context}: delete");
                    expected.remove(&id);
                }
                assert_eq!(contents(&db), expected, "{context}: after deletes");
                drop((table, session));
                db.close().unwrap();
                // A clean close reopens with every row.
                let db = Database::open(DIR, options(&fs, max_pages)).unwrap();
                assert_eq!(contents(&db), expected, "{context}: after a clean reopen");
                let table = db.table("Orders").unwrap();
                let session = db.session();
                for n in 0..20i64 {
                    match table.insert(&session, row(n, payload_len, partitions)) {
                        Ok(id) => {
                            expected.insert(id.unwrap(), payload_len);
                        }
                        Err(error) => assert!(is_full(&error), "{context}: reinsert: {error}"),
                    }
                }
                assert_eq!(contents(&db), expected, "{context}: after reopen inserts");
                // A crash without a checkpoint: recovery replays the rows into the image.
                let after = crash(&fs, CrashMode::Random, db, (table, session), ());
                let db = Database::open(DIR, options(&after, max_pages))
                    .unwrap_or_else(|error| panic!("{context}: open after a crash: {error}"));
                assert_eq!(contents(&db), expected, "{context}: after a crash");
            }
        }
    }
}

/// `Accounts(Id INT PRIMARY KEY, Payload VARCHAR(8000) NOT NULL)`: keys the caller chooses.
fn accounts() -> TableDef {
    TableDef::new("Accounts")
        .column(ColumnDef::new("Id", DataType::Int).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
        .clustered(IndexDef::new(
            "PK_Accounts",
            &["Id"],
            Uniqueness::PrimaryKey,
        ))
}

/// Every row of `Accounts`: id -> payload length, and the integrity check.
fn accounts_contents(db: &Database) -> BTreeMap<i32, usize> {
    payload_lengths(db, "Accounts", 1, |id| match id {
        Value::Int(id) => Some(*id),
        _ => None,
    })
}

#[test]
fn random_keys_up_to_the_page_limit_survive_a_crash() {
    use rand::Rng;
    let (_, mut rng) = seeded_rng();
    for max_pages in [5, 9, 30] {
        for round in 0..20 {
            let context = format!("max_pages {max_pages} round {round}");
            let fs = FaultyFileSystem::new(FaultyConfig::new(round));
            let db = Database::open(DIR, options(&fs, max_pages)).unwrap();
            let table = db.create_table(accounts()).unwrap();
            let session = db.session();
            let mut expected = BTreeMap::new();
            let mut failures = 0;
            while failures < 20 {
                let id = rng.random_range(0..1_000_000);
                let len = if rng.random_bool(0.5) {
                    100
                } else {
                    rng.random_range(100..7000)
                };
                if expected.contains_key(&id) {
                    continue;
                }
                match table.insert(
                    &session,
                    InsertRow::new().set(0, id).set(1, "p".repeat(len)),
                ) {
                    Ok(_) => {
                        expected.insert(id, len);
                    }
                    Err(error) => {
                        assert!(is_full(&error), "{context}: {error}");
                        failures += 1;
                    }
                }
            }
            assert_eq!(accounts_contents(&db), expected, "{context}");
            let after = crash(&fs, CrashMode::Random, db, (table, session), ());
            let db = Database::open(DIR, options(&after, max_pages))
                .unwrap_or_else(|error| panic!("{context}: open after a crash: {error}"));
            assert_eq!(accounts_contents(&db), expected, "{context}: after a crash");
            // Replay may take the database past its limit; new pages are refused again.
            assert_eq!(
                db.pool().max_pages(),
                max_pages,
                "{context}: the limit after the open"
            );
        }
    }
}

/// A rollback at the page limit puts back a row it deleted even though another session's
/// insert took its room meanwhile (that needs a split): an undo must not fail for want of a
/// page, or the database stops.
#[test]
fn a_rollback_at_the_page_limit_puts_its_rows_back() {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let db = Database::open(DIR, options(&fs, 6)).unwrap();
    let table = db.create_table(accounts()).unwrap();
    let session = db.session();
    let mut expected = BTreeMap::new();
    for id in (10..).step_by(10) {
        match table.insert(
            &session,
            InsertRow::new().set(0, id).set(1, "a".repeat(3000)),
        ) {
            Ok(_) => {
                expected.insert(id, 3000);
            }
            Err(error) => {
                assert!(is_full(&error), "{error}");
                break;
            }
        }
    }
    let deleter = db.session();
    deleter.begin().unwrap();
    assert!(table.delete(&deleter, &[Value::Int(20)]).unwrap());
    // Another session's row takes the room the delete freed.
    table
        .insert(
            &session,
            InsertRow::new().set(0, 21).set(1, "b".repeat(3000)),
        )
        .unwrap();
    expected.insert(21, 3000);
    deleter.rollback().unwrap();
    assert_eq!(accounts_contents(&db), expected);
    // The limit still holds for new rows.
    let error = table
        .insert(
            &session,
            InsertRow::new().set(0, 5).set(1, "c".repeat(3000)),
        )
        .unwrap_err();
    assert!(is_full(&error), "{error}");
    drop((table, session, deleter));
    db.close().unwrap();
    let db = Database::open(DIR, options(&fs, 6)).unwrap();
    assert_eq!(accounts_contents(&db), expected, "after a reopen");
}
