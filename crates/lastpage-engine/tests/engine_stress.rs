//! Many sessions insert, update, delete, read and scan one table with a unique and a
//! non-unique nonclustered index at once; afterwards the table must equal the union of every
//! session's oracle and pass the integrity check (every index, every locator). Prints its seed;
//! rerun with `LASTPAGE_SEED=<seed>`.

use std::collections::BTreeMap;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, IndexDef, IndexOptions, InsertPath,
    InsertRow, KeyRange, LatchPolicy, TableDef, Uniqueness, Value,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::seed;

#[test]
fn concurrent_sessions_match_their_oracles_and_every_index_stays_consistent() {
    let seed = seed();
    for (latch_policy, insert_path) in LatchPolicy::ALL
        .into_iter()
        .flat_map(|latch| InsertPath::ALL.into_iter().map(move |path| (latch, path)))
    {
        let db = Database::create(DatabaseOptions::default()).unwrap();
        let options = IndexOptions {
            latch_policy,
            insert_path,
            ..IndexOptions::default()
        };
        let table = db
            .create_table(
                TableDef::new("Orders")
                    .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                    .column(ColumnDef::new("Code", DataType::VarChar(40)).not_null())
                    .column(ColumnDef::new("Amount", DataType::Int).not_null())
                    .column(ColumnDef::new("Note", DataType::VarChar(2000)))
                    .clustered(
                        IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey)
                            .with_options(options),
                    )
                    .nonclustered(
                        IndexDef::new("UQ_Code", &["Code"], Uniqueness::UniqueConstraint)
                            .with_options(options),
                    )
                    .nonclustered(
                        IndexDef::new("IX_Amount", &["Amount"], Uniqueness::NonUnique)
                            .with_options(options),
                    ),
            )
            .unwrap();
        let threads = 12u64;
        let oracles: Vec<BTreeMap<i64, (String, i32, String)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    let table = &table;
                    let db = &db;
                    scope.spawn(move || {
                        let session = db.session();
                        let mut rng = StdRng::seed_from_u64(seed ^ thread);
                        let mut mine: BTreeMap<i64, (String, i32, String)> = BTreeMap::new();
                        for step in 0..1500 {
                            match rng.random_range(0..10) {
                                0..=4 => {
                                    let code = format!("t{thread}-{step}");
                                    let amount = rng.random_range(0..50);
                                    let note = "n".repeat(rng.random_range(0..300));
                                    let id = table
                                        .insert(
                                            &session,
                                            InsertRow::new()
                                                .set(1, code.as_str())
                                                .set(2, amount)
                                                .set(3, note.as_str()),
                                        )
                                        .unwrap()
                                        .unwrap();
                                    mine.insert(id, (code, amount, note));
                                }
                                5 => {
                                    // A duplicate code must fail and leave nothing behind.
                                    if let Some((_, (code, _, _))) = mine.iter().next() {
                                        let error = table
                                            .insert(
                                                &session,
                                                InsertRow::new().set(1, code.as_str()).set(2, 1),
                                            )
                                            .unwrap_err();
                                        assert!(error.to_string().contains("UQ_Code"), "{error}");
                                    }
                                }
                                6 => {
                                    let Some(&id) =
                                        mine.keys().nth(rng.random_range(0..mine.len().max(1)))
                                    else {
                                        continue;
                                    };
                                    let amount = rng.random_range(0..50);
                                    let note = "u".repeat(rng.random_range(0..1500));
                                    assert!(
                                        table
                                            .update(
                                                &session,
                                                &[Value::BigInt(id)],
                                                &[
                                                    (2, Value::Int(amount)),
                                                    (3, Value::from(note.as_str()))
                                                ]
                                            )
                                            .unwrap()
                                    );
                                    let entry = mine.get_mut(&id).unwrap();
                                    entry.1 = amount;
                                    entry.2 = note;
                                }
                                7 => {
                                    let Some(&id) =
                                        mine.keys().nth(rng.random_range(0..mine.len().max(1)))
                                    else {
                                        continue;
                                    };
                                    assert!(table.delete(&session, &[Value::BigInt(id)]).unwrap());
                                    mine.remove(&id);
                                }
                                8 => {
                                    let Some((&id, expected)) =
                                        mine.iter().nth(rng.random_range(0..mine.len().max(1)))
                                    else {
                                        continue;
                                    };
                                    let row =
                                        table.get(&session, &[Value::BigInt(id)]).unwrap().unwrap();
                                    assert_eq!(row[1].to_string(), expected.0);
                                    let by_code = table
                                        .get_by_index(
                                            &session,
                                            "UQ_Code",
                                            &[Value::from(expected.0.as_str())],
                                        )
                                        .unwrap();
                                    assert_eq!(by_code.len(), 1);
                                    assert_eq!(by_code[0][0], Value::BigInt(id));
                                }
                                _ => {
                                    let direction = if step % 2 == 0 {
                                        Direction::Forward
                                    } else {
                                        Direction::Backward
                                    };
                                    let ids: Vec<i64> = table
                                        .scan(&session, &KeyRange::all(), direction)
                                        .unwrap()
                                        .take(500)
                                        .map(|row| match row.unwrap()[0] {
                                            Value::BigInt(id) => id,
                                            _ => unreachable!(),
                                        })
                                        .collect();
                                    assert!(ids.windows(2).all(|pair| (pair[0] < pair[1])
                                        == (direction == Direction::Forward)));
                                }
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .collect()
        });
        let mut expected = BTreeMap::new();
        for oracle in oracles {
            expected.extend(oracle);
        }
        let check = table
            .check_integrity()
            .unwrap_or_else(|error| panic!("{latch_policy:?} {insert_path:?}: {error}"));
        assert_eq!(check.rows, expected.len() as u64);
        let session = db.session();
        let actual: BTreeMap<i64, (String, i32, String)> = table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .unwrap()
            .map(|row| {
                let row = row.unwrap();
                let Value::BigInt(id) = row[0] else {
                    unreachable!()
                };
                let Value::Int(amount) = row[2] else {
                    unreachable!()
                };
                (id, (row[1].to_string(), amount, row[3].to_string()))
            })
            .collect();
        assert!(
            actual == expected,
            "{latch_policy:?}: table contents differ from the oracles"
        );
    }
}

/// One session's identity values ascend, however it inserts: single rows (on its sequence
/// lane), batches (which take their values at the tail), page-sized rows (which do too), and
/// with the insert path switched to classic and back, while other sessions do the same. A
/// session's batch took values past its lane's block, and its next single row went back into
/// the block: one session got ids that went backwards.
#[test]
fn each_session_gets_ascending_identity_values_however_it_inserts() {
    const SESSIONS: usize = 4;
    const STATEMENTS: usize = 300;
    let seed = seed();
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("Events")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(8000)).not_null())
                .clustered(IndexDef::new("PK_Events", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    std::thread::scope(|scope| {
        for session_number in 0..SESSIONS {
            let (db, table) = (&db, &table);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ session_number as u64);
                let session = db.session();
                let mut last = 0i64;
                let mut taken = Vec::new();
                for statement in 0..STATEMENTS {
                    let ids: Vec<i64> = match rng.random_range(0..10) {
                        0..=5 => vec![
                            table
                                .insert(&session, InsertRow::new().set(1, "x".repeat(100)))
                                .unwrap()
                                .unwrap(),
                        ],
                        6 | 7 => {
                            let rows = (0..rng.random_range(2..6))
                                .map(|_| InsertRow::new().set(1, "b"))
                                .collect();
                            table
                                .insert_batch(&session, rows)
                                .unwrap()
                                .into_iter()
                                .map(Option::unwrap)
                                .collect()
                        }
                        8 => vec![
                            table
                                .insert(&session, InsertRow::new().set(1, "p".repeat(7_900)))
                                .unwrap()
                                .unwrap(),
                        ],
                        _ => {
                            // The classic path for a moment (one session's switch is every
                            // session's: that is the point).
                            table
                                .set_insert_path(&session, "PK_Events", InsertPath::Classic)
                                .unwrap();
                            let id = table
                                .insert(&session, InsertRow::new().set(1, "c"))
                                .unwrap()
                                .unwrap();
                            table
                                .set_insert_path(&session, "PK_Events", InsertPath::Default)
                                .unwrap();
                            vec![id]
                        }
                    };
                    for id in ids {
                        taken.push(id);
                        assert!(
                            id > last,
                            "session {session_number}, statement {statement}: id {id} after \
                             {last} (its last ids: {:?})",
                            &taken[taken.len().saturating_sub(12)..]
                        );
                        last = id;
                    }
                }
            });
        }
    });
    db.check_integrity().unwrap();
}
