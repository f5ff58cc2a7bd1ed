//! The embedded API end to end: every column type round-trips, every kind of bad input gets
//! a clear error (never a panic), identity, defaults, computed columns, unique constraints,
//! non-unique clustered keys, nonclustered index maintenance and scans.

use std::ops::Bound;
use std::sync::Arc;

use rand::Rng;

use lastpage_engine::schema::ComputeFn;
use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, DefaultValue, Direction, EngineError, IndexDef,
    InsertRow, KeyRange, Session, Table, TableDef, Uniqueness, Value, WaitType,
};

mod common;

use common::seeded_rng;

/// Asserts that a batch of `rows` rows took consecutive identity values.
fn assert_consecutive(ids: &[Option<i64>], rows: usize) {
    let first = ids[0].expect("an identity value");
    assert_eq!(
        ids,
        (first..first + rows as i64).map(Some).collect::<Vec<_>>()
    );
}

/// Runs `threads` threads at once, each with a session of its own that inserts `batches`
/// batches: `batch(session, thread, batch)` inserts (and checks) one of them.
fn batches_on_threads(
    db: &Database,
    threads: usize,
    batches: usize,
    batch: impl Fn(&Session, usize, usize) + Sync,
) {
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let batch = &batch;
            scope.spawn(move || {
                let session = db.session();
                for number in 0..batches {
                    batch(&session, thread, number);
                }
            });
        }
    });
}

/// How many rows a forward scan of `table` from `lower` to `upper` returns.
fn count_in(
    table: &Table,
    session: &Session,
    lower: Bound<Vec<Value>>,
    upper: Bound<Vec<Value>>,
) -> usize {
    table
        .scan(session, &KeyRange { lower, upper }, Direction::Forward)
        .unwrap()
        .count()
}

fn database() -> Database {
    Database::create(DatabaseOptions::default()).unwrap()
}

fn insert_contention_table(
    db: &Database,
    name: &str,
    payload: DataType,
) -> Arc<lastpage_engine::Table> {
    db.create_table(
        TableDef::new(name)
            .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
            .column(ColumnDef::new("Payload", payload).not_null())
            .clustered(IndexDef::new(
                format!("PK_{name}"),
                &["InsertID"],
                Uniqueness::PrimaryKey,
            )),
    )
    .unwrap()
}

#[test]
fn every_column_type_round_trips_through_insert_and_get() {
    let db = database();
    let columns = [
        ("t", DataType::TinyInt, Value::TinyInt(200)),
        ("s", DataType::SmallInt, Value::SmallInt(-3000)),
        ("b", DataType::BigInt, Value::BigInt(1 << 40)),
        ("bit", DataType::Bit, Value::Bit(true)),
        (
            "d",
            DataType::Decimal {
                precision: 10,
                scale: 2,
            },
            Value::from("12345.67"),
        ),
        ("m", DataType::Money, Value::from("19.99")),
        ("c", DataType::Char(5), Value::from("ab")),
        ("v", DataType::VarChar(20), Value::from("hello")),
        ("nc", DataType::NChar(3), Value::from("ü")),
        ("nv", DataType::NVarChar(10), Value::from("naïve")),
        (
            "dt",
            DataType::DateTime2(3),
            Value::from("2024-02-29 13:14:15.1234"),
        ),
        ("dd", DataType::Date, Value::from("0001-01-01")),
        (
            "u",
            DataType::UniqueIdentifier,
            Value::from("6F9619FF-8B86-D011-B42D-00C04FD430C8"),
        ),
        ("vb", DataType::VarBinary(4), Value::Binary(vec![0, 1, 2])),
        ("n", DataType::Int, Value::Null),
    ];
    let mut definition =
        TableDef::new("AllTypes").column(ColumnDef::new("Id", DataType::Int).identity(10, 5));
    for (name, data_type, _) in &columns {
        definition = definition.column(ColumnDef::new(*name, *data_type));
    }
    let table = db
        .create_table(definition.clustered(IndexDef::new(
            "PK_AllTypes",
            &["Id"],
            Uniqueness::PrimaryKey,
        )))
        .unwrap();
    let session = db.session();
    let mut row = InsertRow::new();
    for (position, (_, _, value)) in columns.iter().enumerate() {
        row = row.set(position + 1, value.clone());
    }
    assert_eq!(table.insert(&session, row.clone()).unwrap(), Some(10));
    assert_eq!(table.insert(&session, row).unwrap(), Some(15));
    let stored = table.get(&session, &[Value::Int(15)]).unwrap().unwrap();
    let text: Vec<String> = stored.iter().map(ToString::to_string).collect();
    assert_eq!(text[0], "15");
    assert_eq!(text[5], "12345.67");
    assert_eq!(text[7], "ab   ", "char(5) pads with spaces");
    assert_eq!(
        text[11], "2024-02-29 13:14:15.1230000",
        "rounded to the column's 3 digits"
    );
    assert_eq!(
        text[13].to_uppercase(),
        "6F9619FF-8B86-D011-B42D-00C04FD430C8"
    );
    assert_eq!(stored[15], Value::Null);
    assert_eq!(table.row_count(), 2);
    db.check_integrity().unwrap();
}

#[test]
fn columns_may_be_supplied_in_any_order_and_the_last_of_a_repeat_wins() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Order")
                .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("A", DataType::VarChar(10)))
                .column(ColumnDef::new("B", DataType::Int))
                .column(
                    ColumnDef::new("C", DataType::Int)
                        .default_value(DefaultValue::Constant(Value::Int(7))),
                )
                .clustered(IndexDef::new("PK_Order", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let rows = [
        // Table order (the merge path), with a default left to fill.
        (InsertRow::new().set(1, "a").set(2, 1), ["1", "a", "1", "7"]),
        // Reversed, and with a column supplied twice.
        (
            InsertRow::new().set(3, 9).set(2, 2).set(1, "x").set(1, "b"),
            ["2", "b", "2", "9"],
        ),
        // Out of order with a gap.
        (InsertRow::new().set(2, 3).set(1, "c"), ["3", "c", "3", "7"]),
    ];
    for (row, expected) in rows {
        let id = table.insert(&session, row).unwrap().unwrap();
        let stored = table
            .get(&session, &[Value::Int(id as i32)])
            .unwrap()
            .unwrap();
        let text: Vec<String> = stored.iter().map(ToString::to_string).collect();
        assert_eq!(text, expected);
    }
    db.check_integrity().unwrap();
}

#[test]
fn bad_input_gets_clear_errors() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
                .column(ColumnDef::new("Wide", DataType::Char(8000)))
                .column(ColumnDef::new("Extra", DataType::VarChar(100)))
                .column(ColumnDef::new("Qty", DataType::Int))
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new(
                    "UQ_T_Code",
                    &["Code"],
                    Uniqueness::UniqueConstraint,
                )),
        )
        .unwrap();
    let session = db.session();
    let message = |error: EngineError| error.to_string();

    let too_large = table
        .insert(
            &session,
            InsertRow::new()
                .set(1, "a")
                .set(2, "x")
                .set(3, "y".repeat(100)),
        )
        .unwrap_err();
    assert!(
        matches!(too_large, EngineError::RowTooLarge { .. }),
        "{too_large}"
    );
    assert!(message(too_large).contains("maximum row size of 8060"));

    let wrong_type = table
        .insert(&session, InsertRow::new().set(1, "a").set(4, "abc"))
        .unwrap_err();
    assert!(matches!(wrong_type, EngineError::Value(_)), "{wrong_type}");
    let clash = table
        .insert(
            &session,
            InsertRow::new()
                .set(1, "a")
                .set(4, Value::from("2024-01-01").clone()),
        )
        .unwrap_err();
    assert!(matches!(clash, EngineError::Value(_)), "{clash}");

    let null = table.insert(&session, InsertRow::new()).unwrap_err();
    assert_eq!(
        message(null),
        "Cannot insert the value NULL into column 'Code', table 'T'; column does not allow nulls. INSERT fails."
    );

    let truncated = table
        .insert(&session, InsertRow::new().set(1, "01234567890"))
        .unwrap_err();
    assert!(message(truncated).contains("truncated in column 'Code'"));

    let explicit_identity = table
        .insert(&session, InsertRow::new().set(0, 5).set(1, "a"))
        .unwrap_err();
    assert!(matches!(
        explicit_identity,
        EngineError::ExplicitIdentity { .. }
    ));

    table
        .insert(&session, InsertRow::new().set(1, "dup"))
        .unwrap();
    let duplicate = table
        .insert(&session, InsertRow::new().set(1, "dup"))
        .unwrap_err();
    assert!(
        message(duplicate).starts_with("Violation of UNIQUE KEY constraint 'UQ_T_Code'. Cannot insert duplicate key in object 'T'. The duplicate key value is (dup)"),
    );
    // Identity values are never reused. An insert that fails before its row reaches the index
    // (a bad value, a NULL, a truncation) takes no value; one that fails there takes one, as
    // in SQL Server: 1 went to the oversized row, 2 to "dup", 3 to its duplicate. The failed
    // inserts left no row behind in any index.
    assert_eq!(
        table
            .insert(&session, InsertRow::new().set(1, "next"))
            .unwrap(),
        Some(4)
    );
    assert_eq!(table.row_count(), 2);

    assert!(matches!(
        db.table("Nope"),
        Err(EngineError::UnknownTable(_))
    ));
    assert!(matches!(
        table.column_index("Nope"),
        Err(EngineError::UnknownColumn { .. })
    ));
    assert!(matches!(
        table.insert(&session, InsertRow::new().set(99, 1)),
        Err(EngineError::UnknownColumn { .. })
    ));
    assert!(matches!(
        table.get(&session, &[Value::from("not a number")]),
        Err(EngineError::Value(_))
    ));
    assert!(matches!(
        table.get(&session, &[Value::Int(1), Value::Int(2)]),
        Err(EngineError::KeyArity { .. })
    ));
    // A search value longer than its column matches nothing, as in SQL Server.
    assert_eq!(
        table
            .get_by_index(
                &session,
                "UQ_T_Code",
                &[Value::from("much too long for it")]
            )
            .unwrap()
            .len(),
        0
    );
    assert!(matches!(
        db.create_table(TableDef::new("t").column(ColumnDef::new("a", DataType::Int))),
        Err(EngineError::TableExists(_))
    ));
    assert!(matches!(
        db.create_table(TableDef::new("Bad").column(ColumnDef::new("a", DataType::VarChar(9000)))),
        Err(EngineError::Value(_))
    ));
    assert!(matches!(
        db.create_table(
            TableDef::new("Bad2")
                .column(ColumnDef::new("a", DataType::Int))
                .clustered(IndexDef::new("PK", &["b"], Uniqueness::PrimaryKey))
        ),
        Err(EngineError::UnknownColumn { .. })
    ));
    db.check_integrity().unwrap();
}

#[test]
fn defaults_and_computed_columns_fill_in_missing_values() {
    let db = database();
    let modulo: ComputeFn = Arc::new(|row: &[Value]| match &row[0] {
        Value::Int(id) => Ok(Value::TinyInt((id % 16).unsigned_abs() as u8)),
        other => Ok(other.clone()),
    });
    let table = db
        .create_table(
            TableDef::new("InsertContention_100")
                .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
                .column(
                    ColumnDef::new("ver", DataType::TinyInt)
                        .default_value(DefaultValue::Constant(Value::TinyInt(1))),
                )
                .column(
                    ColumnDef::new("dt", DataType::DateTime2(7))
                        .not_null()
                        .default_value(DefaultValue::CurrentUtcDateTime),
                )
                .column(
                    ColumnDef::new("ModValue", DataType::TinyInt)
                        .not_null()
                        .computed(modulo),
                )
                .clustered(IndexDef::new(
                    "PK_Mod",
                    &["ModValue", "InsertID"],
                    Uniqueness::PrimaryKey,
                )),
        )
        .unwrap();
    let session = db.session();
    for _ in 0..40 {
        table.insert(&session, InsertRow::new()).unwrap();
    }
    let rows = common::rows(&table, &session);
    assert_eq!(rows.len(), 40);
    // Clustered on (ModValue, InsertID): 1, 17, 33, 2, 18, 34, ...
    let ids: Vec<String> = rows.iter().take(4).map(|row| row[0].to_string()).collect();
    assert_eq!(ids, ["16", "32", "1", "17"]);
    assert!(
        rows.iter()
            .all(|row| row[1] == Value::TinyInt(1) && !row[2].is_null())
    );
    // A prefix lookup: every row with ModValue = 3.
    let prefix = common::prefix(vec![Value::Int(3)]);
    let threes = common::scan(&table, &session, &prefix, Direction::Backward);
    let ids: Vec<String> = threes.iter().map(|row| row[0].to_string()).collect();
    assert_eq!(ids, ["35", "19", "3"]);
    assert!(matches!(
        table.insert(&session, InsertRow::new().set(3, 1)),
        Err(EngineError::ComputedColumn { .. })
    ));
}

#[test]
fn a_non_unique_clustered_key_keeps_duplicates_and_nonclustered_indexes_follow_every_write() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Sales")
                .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("Price", DataType::Money).not_null())
                .column(ColumnDef::new("Name", DataType::VarChar(50)))
                .clustered(IndexDef::new("CX_Price", &["Price"], Uniqueness::NonUnique))
                .nonclustered(IndexDef::new(
                    "IX_InsertID",
                    &["InsertID"],
                    Uniqueness::UniqueIndex,
                ))
                .nonclustered(IndexDef::new("IX_Name", &["Name"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    for i in 0..300 {
        table
            .insert(
                &session,
                InsertRow::new()
                    .set(1, Value::Int(i % 7))
                    .set(2, format!("name{}", i % 11)),
            )
            .unwrap();
    }
    assert_eq!(table.row_count(), 300);
    let by_id = table
        .get_by_index(&session, "IX_InsertID", &[Value::Int(42)])
        .unwrap();
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0][1].to_string(), "6.0000");
    let named = table
        .get_by_index(&session, "IX_Name", &[Value::from("name3")])
        .unwrap();
    assert_eq!(named.len(), (0..300).filter(|i| i % 11 == 3).count());
    // Rows with Price = 6: every one of them, through the clustered prefix.
    let six = table
        .scan(
            &session,
            &common::prefix(vec![Value::Int(6)]),
            Direction::Forward,
        )
        .unwrap()
        .count();
    assert_eq!(six, (0..300).filter(|i| i % 7 == 6).count());

    // Update a non-key column: IX_Name follows.
    assert!(
        table
            .update(&session, &[Value::Int(6)], &[(2, Value::from("renamed"))])
            .unwrap()
    );
    assert_eq!(
        table
            .get_by_index(&session, "IX_Name", &[Value::from("renamed")])
            .unwrap()
            .len(),
        1
    );
    // Update the clustered key: the row moves, every index follows.
    let moved_id = table
        .get_by_index(&session, "IX_Name", &[Value::from("renamed")])
        .unwrap()[0][0]
        .clone();
    assert!(
        table
            .update(&session, &[Value::Int(6)], &[(1, Value::Int(100))])
            .unwrap()
    );
    let moved = table
        .get_by_index(&session, "IX_InsertID", &[moved_id])
        .unwrap();
    assert_eq!(moved[0][1].to_string(), "100.0000");
    // Delete: every index follows.
    assert!(table.delete(&session, &[Value::Int(100)]).unwrap());
    assert!(!table.delete(&session, &[Value::Int(100)]).unwrap());
    assert_eq!(table.row_count(), 299);
    let check = table.check_integrity().unwrap();
    assert_eq!(check.rows, 299);
    assert_eq!(check.indexes.len(), 3);
    assert!(check.indexes.iter().all(|(_, tree)| tree.rows == 299));
    // Updating identity is refused.
    assert!(matches!(
        table.update(&session, &[Value::Int(1)], &[(0, Value::Int(5))]),
        Err(EngineError::ReadOnlyColumn { .. })
    ));
    // A column set twice is refused, as T-SQL refuses `SET Name = 'a', Name = 'b'` (264),
    // and the row keeps its value; before, the last value won.
    let before = table.get(&session, &[Value::Int(1)]).unwrap();
    assert!(before.is_some());
    let error = table
        .update(
            &session,
            &[Value::Int(1)],
            &[(2, Value::from("a")), (2, Value::from("b"))],
        )
        .unwrap_err();
    assert!(
        matches!(&error, EngineError::DuplicateUpdateColumn { column } if column == "Name"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("more than once in the SET clause")
    );
    assert_eq!(table.get(&session, &[Value::Int(1)]).unwrap(), before);
}

#[test]
fn updates_that_grow_a_row_past_its_page_split_it_and_keep_every_row() {
    let db = database();
    let table = insert_contention_table(&db, "Grow", DataType::VarChar(8000));
    let session = db.session();
    for _ in 0..200 {
        table
            .insert(&session, InsertRow::new().set(1, "x".repeat(50)))
            .unwrap();
    }
    for id in (1..=200).step_by(3) {
        assert!(
            table
                .update(
                    &session,
                    &[Value::Int(id)],
                    &[(1, Value::from("y".repeat(3000)))]
                )
                .unwrap()
        );
    }
    let rows = common::rows(&table, &session);
    assert_eq!(rows.len(), 200);
    for row in &rows {
        let Value::Int(id) = row[0] else {
            panic!("id is an int")
        };
        let expected = if (id - 1) % 3 == 0 { 3000 } else { 50 };
        assert_eq!(row[1].to_string().len(), expected, "row {id}");
    }
    table.check_integrity().unwrap();
}

#[test]
fn identity_overflow_is_an_error_not_a_wraparound() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Tiny")
                .column(ColumnDef::new("Id", DataType::TinyInt).identity(254, 1))
                .column(ColumnDef::new("v", DataType::Int))
                .clustered(IndexDef::new("PK_Tiny", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    table.insert(&session, InsertRow::new()).unwrap();
    table.insert(&session, InsertRow::new()).unwrap();
    let error = table.insert(&session, InsertRow::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "Arithmetic overflow error converting IDENTITY to data type tinyint."
    );
}

#[test]
fn a_bigint_identity_at_the_end_of_its_range_fails_instead_of_wrapping_to_negative_values() {
    let db = database();
    let session = db.session();
    // Clustered on another column: values are taken one at a time (and a batch's at once).
    let table = db
        .create_table(
            TableDef::new("BigEdge")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(i64::MAX - 3, 1))
                .column(ColumnDef::new("Code", DataType::Int).not_null())
                .clustered(IndexDef::new(
                    "PK_BigEdge",
                    &["Code"],
                    Uniqueness::PrimaryKey,
                )),
        )
        .unwrap();
    let id = table.insert(&session, InsertRow::new().set(1, 1)).unwrap();
    assert_eq!(id, Some(i64::MAX - 3));
    // A batch that would run past the end fails whole and takes nothing.
    let batch = (2..6).map(|code| InsertRow::new().set(1, code)).collect();
    assert!(matches!(
        table.insert_batch(&session, batch),
        Err(EngineError::IdentityOverflow { .. })
    ));
    let id = table.insert(&session, InsertRow::new().set(1, 2)).unwrap();
    assert_eq!(id, Some(i64::MAX - 2));
    let id = table.insert(&session, InsertRow::new().set(1, 3)).unwrap();
    assert_eq!(id, Some(i64::MAX - 1));
    // The counter holds the next value, so i64::MAX itself is never handed out.
    for code in 4..7 {
        assert!(matches!(
            table.insert(&session, InsertRow::new().set(1, code)),
            Err(EngineError::IdentityOverflow { .. })
        ));
    }
    assert_eq!(table.row_count(), 3);
    // Clustered on the identity: values are taken in lane blocks, so the range's last block
    // may be given up, but no value wraps around.
    let keyed = db
        .create_table(
            TableDef::new("BigKeyed")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(i64::MAX - 5000, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .clustered(IndexDef::new(
                    "PK_BigKeyed",
                    &["Id"],
                    Uniqueness::PrimaryKey,
                )),
        )
        .unwrap();
    let mut failed = false;
    for _ in 0..6000 {
        match keyed.insert(&session, InsertRow::new().set(1, "x")) {
            Ok(id) => {
                assert!(!failed, "an insert succeeded after an overflow");
                assert!(id.unwrap() >= i64::MAX - 5000, "{id:?} wrapped around");
            }
            Err(EngineError::IdentityOverflow { .. }) => failed = true,
            Err(other) => panic!("{other}"),
        }
    }
    assert!(failed, "5,000 values cannot serve 6,000 rows");
    assert_eq!(keyed.check_integrity().unwrap().rows, keyed.row_count());
}

#[test]
fn variable_length_keys_read_back_as_stored_but_compare_without_trailing_spaces() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Codes")
                .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
                .column(ColumnDef::new("n", DataType::Int))
                .clustered(IndexDef::new("PK_Codes", &["Code"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(0, "abc  ").set(1, 1))
        .unwrap();
    let duplicate = table
        .insert(&session, InsertRow::new().set(0, "abc").set(1, 2))
        .unwrap_err();
    assert!(
        matches!(duplicate, EngineError::DuplicateKey { .. }),
        "'abc' equals 'abc  '"
    );
    let row = table.get(&session, &[Value::from("abc")]).unwrap().unwrap();
    assert_eq!(
        row[0],
        Value::from("abc  "),
        "the stored value comes back, trailing spaces and all"
    );
}

/// Inserts `rows` rows with `payload` in column 1 and returns their identity values.
fn insert_payloads(
    table: &Arc<lastpage_engine::Table>,
    session: &lastpage_engine::Session,
    rows: usize,
    payload: &str,
) -> Vec<i64> {
    (0..rows)
        .map(|_| {
            table
                .insert(session, InsertRow::new().set(1, payload))
                .unwrap()
                .unwrap()
        })
        .collect()
}

/// IDENTITY on the default path's sequence lanes: a single session gets consecutive values;
/// concurrent sessions each get ascending values, all distinct, every row keeps its own
/// payload, and the next value lies above every value handed out; a rolled-back value is never
/// handed out again.
#[test]
fn identity_values_from_sequence_lanes_ascend_per_session_and_never_repeat() {
    let db = database();
    let table = insert_contention_table(&db, "Lanes", DataType::VarChar(100));
    let session = db.session();
    let single = insert_payloads(&table, &session, 1000, "single");
    assert_eq!(
        single,
        (1..=1000).collect::<Vec<_>>(),
        "one session never skips"
    );
    // A rolled-back insert consumes its value.
    session.begin().unwrap();
    let rolled_back = table
        .insert(&session, InsertRow::new().set(1, "gone"))
        .unwrap()
        .unwrap();
    let rolled_back_key = [Value::Int(i32::try_from(rolled_back).unwrap())];
    assert!(table.get(&session, &rolled_back_key).unwrap().is_some());
    session.rollback().unwrap();
    // An explicit transaction keeps its inserts' changes (an autocommit insert in memory does
    // not need to), so the rollback removes the row.
    assert_eq!(table.get(&session, &rolled_back_key).unwrap(), None);
    assert_eq!(table.row_count(), 1000);
    let after = table
        .insert(&session, InsertRow::new().set(1, "single"))
        .unwrap()
        .unwrap();
    assert!(after > rolled_back);
    let threads = 8;
    let per_thread = 3000;
    let ids: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (db, table) = (&db, &table);
                scope.spawn(move || {
                    insert_payloads(
                        table,
                        &db.session(),
                        per_thread,
                        &format!("thread {thread}"),
                    )
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for session_ids in &ids {
        assert!(session_ids.windows(2).all(|pair| pair[0] < pair[1]));
    }
    let mut all: Vec<i64> = ids.iter().flatten().copied().collect();
    all.extend(&single);
    all.push(after);
    all.sort_unstable();
    let distinct = all.len();
    all.dedup();
    assert_eq!(all.len(), distinct, "no value is handed out twice");
    assert!(!all.contains(&rolled_back));
    assert!(table.next_identity().unwrap() > *all.last().unwrap());
    let rows = common::rows(&table, &session);
    assert_eq!(rows.len(), all.len());
    for row in &rows {
        let Value::Int(id) = row[0] else {
            panic!("identity is an INT: {row:?}")
        };
        let payload = row[1].to_string();
        match ids
            .iter()
            .position(|session_ids| session_ids.contains(&i64::from(id)))
        {
            Some(thread) => assert_eq!(payload, format!("thread {thread}")),
            None => assert_eq!(payload, "single"),
        }
    }
    let check = table.check_integrity().unwrap();
    assert_eq!(check.rows, all.len() as u64);
}

/// An INT identity that reaches the end of its range: values are handed out up to the largest
/// INT (lane blocks do not make one session stop early), then every insert fails with an
/// identity overflow and leaves nothing behind.
#[test]
fn identity_overflow_is_reported_at_the_end_of_the_range() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Edge")
                .column(ColumnDef::new("Id", DataType::Int).identity(i64::from(i32::MAX) - 99, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .clustered(IndexDef::new("PK_Edge", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let ids = insert_payloads(&table, &session, 100, "x");
    assert_eq!(*ids.last().unwrap(), i64::from(i32::MAX));
    for _ in 0..3 {
        assert!(matches!(
            table.insert(&session, InsertRow::new().set(1, "x")),
            Err(EngineError::IdentityOverflow { .. })
        ));
    }
    assert_eq!(table.row_count(), 100);
    assert_eq!(table.check_integrity().unwrap().rows, 100);
}

/// Multi-row inserts into a table clustered on its identity alone take their values as one
/// block at the end of the index: each batch's values are consecutive, batches from many
/// sessions at once leave every row once with its own payload and the leaves full (no batch
/// lands behind a later one), a batch with a bad row inserts nothing, and a rolled-back batch
/// leaves nothing behind.
#[test]
fn identity_batches_take_consecutive_values_and_fill_every_leaf() {
    let db = database();
    let table = insert_contention_table(&db, "Batches", DataType::VarChar(100));
    let (threads, batches, rows) = (8, 40, 50);
    batches_on_threads(&db, threads, batches, |session, thread, batch| {
        let payload = |row: usize| format!("{thread}-{batch}-{row}");
        let ids = table
            .insert_batch(
                session,
                (0..rows)
                    .map(|row| InsertRow::new().set(1, payload(row)))
                    .collect(),
            )
            .unwrap();
        assert_consecutive(&ids, rows);
        for (row, id) in ids.into_iter().enumerate() {
            let got = table
                .get(session, &[Value::Int(id.unwrap() as i32)])
                .unwrap()
                .expect("the row just inserted");
            assert_eq!(got[1], Value::from(payload(row).as_str()));
        }
    });
    let total = (threads * batches * rows) as u64;
    assert_eq!(table.row_count(), total);
    let checks = db.check_integrity().unwrap();
    let check = checks
        .iter()
        .find(|check| check.table == "Batches")
        .unwrap();
    assert_eq!(check.rows, total);
    let (_, tree) = &check.indexes[0];
    assert!(tree.leaf_fill > 0.95, "{tree:?}");

    let session = db.session();
    // A row that fails its checks fails the batch before anything goes in.
    let bad = table.insert_batch(
        &session,
        vec![
            InsertRow::new().set(1, "fine"),
            InsertRow::new().set(1, "x".repeat(101)),
        ],
    );
    assert!(bad.is_err(), "{bad:?}");
    assert_eq!(table.row_count(), total);
    // A rolled-back batch leaves nothing behind, and its values are not handed out again.
    session.begin().unwrap();
    let rolled_back = table
        .insert_batch(
            &session,
            (0..rows).map(|_| InsertRow::new().set(1, "gone")).collect(),
        )
        .unwrap();
    session.rollback().unwrap();
    assert_eq!(table.row_count(), total);
    let next = table
        .insert_batch(&session, vec![InsertRow::new().set(1, "after")])
        .unwrap();
    assert!(next[0] > *rolled_back.last().unwrap(), "{next:?}");
    db.check_integrity().unwrap();
}

/// The table of the borrowed-batch tests: identity key, a NOT NULL payload, a padded code
/// with a default, an nvarchar and an int; `shape` adds what sends a batch down the copying
/// path instead of the one at the tail.
fn borrowed_batch_table(db: &Database, name: &str, shape: &str) -> Arc<lastpage_engine::Table> {
    let mut table = TableDef::new(name)
        .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
        .column(ColumnDef::new("Payload", DataType::VarChar(20)).not_null())
        .column(
            ColumnDef::new("Code", DataType::Char(4))
                .default_value(DefaultValue::Constant(Value::from("zz"))),
        )
        .column(ColumnDef::new("Note", DataType::NVarChar(6)))
        .column(ColumnDef::new("Amount", DataType::Int))
        .clustered(IndexDef::new(
            format!("PK_{name}"),
            &["InsertID"],
            Uniqueness::PrimaryKey,
        ));
    match shape {
        "tail" => {}
        "nonclustered" => {
            table = table.nonclustered(IndexDef::new(
                format!("IX_{name}"),
                &["Amount"],
                Uniqueness::NonUnique,
            ));
        }
        "computed" => {
            let twice: ComputeFn = Arc::new(|row: &[Value]| {
                Ok(match row[4].as_i64() {
                    Some(amount) => Value::BigInt(amount * 2),
                    None => Value::Null,
                })
            });
            table = table.column(ColumnDef::new("Twice", DataType::BigInt).computed(twice));
        }
        other => panic!("unknown shape {other}"),
    }
    db.create_table(table).unwrap()
}

/// A column list for [`borrowed_batch_table`]: the payload and any of the other three
/// columns, in any order.
fn random_insert_columns(rng: &mut rand::rngs::StdRng) -> Vec<usize> {
    let mut columns: Vec<usize> = vec![1];
    for column in [2, 3, 4] {
        if rng.random_bool(0.5) {
            columns.insert(rng.random_range(0..=columns.len()), column);
        }
    }
    columns
}

/// Values for `columns` of [`borrowed_batch_table`]: mostly good ones, some that need
/// converting, NULLs, and about one in `bad_in` bad: a NULL or too long a payload, or text
/// that is no number for the int column.
fn random_insert_values(
    rng: &mut rand::rngs::StdRng,
    columns: &[usize],
    bad_in: u32,
) -> Vec<Value> {
    columns
        .iter()
        .map(|&column| match column {
            1 => match rng.random_range(0..bad_in) {
                0 => Value::Null,
                1 => Value::from("x".repeat(21)),
                2 => Value::Int(rng.random_range(-99..99)),
                _ => Value::from(format!("p{}", rng.random_range(0..1000))),
            },
            2 => match rng.random_range(0..3) {
                0 => Value::Null,
                1 => Value::from("ab"),
                _ => Value::from("abcd"),
            },
            3 => match rng.random_range(0..3) {
                0 => Value::Null,
                1 => Value::from("€uro"),
                _ => Value::from("note  "),
            },
            _ if rng.random_range(0..bad_in) == 0 => Value::from("seven"),
            _ => match rng.random_range(0..3) {
                0 => Value::Null,
                1 => Value::from(rng.random_range(-5..5).to_string().as_str()),
                _ => Value::Int(rng.random_range(-1000..1000)),
            },
        })
        .collect()
}

/// `row`'s values for `columns` as an `InsertRow`.
fn insert_row(columns: &[usize], row: &[Value]) -> InsertRow {
    columns
        .iter()
        .zip(row)
        .fold(InsertRow::new(), |insert, (&column, value)| {
            insert.set(column, value.clone())
        })
}

/// Checks that the same insert into two twin tables (`Owned_…` and `{other}…`) came out the
/// same: equal results, or errors that differ only in the table's name. Returns the result if
/// both succeeded, `None` if both failed.
fn same_outcome<'r, T: PartialEq + std::fmt::Debug>(
    owned: &'r Result<T, EngineError>,
    other: &Result<T, EngineError>,
    other_prefix: &str,
    context: &str,
) -> Option<&'r T> {
    match (owned, other) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "{context}");
            Some(a)
        }
        (Err(a), Err(b)) => {
            assert_eq!(
                a.to_string().replace("Owned_", ""),
                b.to_string().replace(other_prefix, ""),
                "{context}"
            );
            None
        }
        _ => panic!("{context}: {owned:?} against {other:?}"),
    }
}

/// `insert_batch_values` stores exactly what `insert_batch` stores for the same rows, on the
/// path at the tail (values borrowed) and on the copying paths (a nonclustered index, a
/// computed column): random column lists in any order, values that need converting (an int
/// into the varchar, text into the int, short text padded into the char), defaults, NULLs,
/// and batches with a bad row, which fail the same way and leave nothing behind.
#[test]
fn borrowed_batches_store_what_owned_batches_store() {
    let (seed, mut rng) = seeded_rng();
    let db = database();
    for shape in ["tail", "nonclustered", "computed"] {
        let owned = borrowed_batch_table(&db, &format!("Owned_{shape}"), shape);
        let borrowed = borrowed_batch_table(&db, &format!("Borrowed_{shape}"), shape);
        let session = db.session();
        let (mut failed, mut inserted) = (0, 0);
        for _ in 0..150 {
            let columns = random_insert_columns(&mut rng);
            let rows: Vec<Vec<Value>> = (0..rng.random_range(1..40))
                .map(|_| random_insert_values(&mut rng, &columns, 300))
                .collect();
            let owned_rows = rows.iter().map(|row| insert_row(&columns, row)).collect();
            let from_owned = owned.insert_batch(&session, owned_rows);
            let from_borrowed =
                borrowed.insert_batch_values(&session, &columns, rows.iter().map(Vec::as_slice));
            let context = format!("seed {seed}: {shape}");
            match same_outcome(&from_owned, &from_borrowed, "Borrowed_", &context) {
                Some(ids) => inserted += ids.len(),
                None => failed += 1,
            }
        }
        assert!(
            failed > 3 && inserted > 1000,
            "seed {seed}: {failed} {inserted}"
        );
        assert_eq!(
            common::rows(&owned, &session),
            common::rows(&borrowed, &session),
            "seed {seed}: {shape}"
        );
        assert_eq!(borrowed.row_count(), inserted as u64);
        assert_eq!(owned.next_identity(), borrowed.next_identity());
    }
    db.check_integrity().unwrap();
}

/// A bad column list or a row of the wrong length fails `insert_batch_values` with an error
/// that says so, before anything goes in or any identity value is used.
#[test]
fn borrowed_batches_check_their_column_list_once() {
    let db = database();
    for shape in ["tail", "computed"] {
        let table = borrowed_batch_table(&db, &format!("Checked_{shape}"), shape);
        let session = db.session();
        let row = [Value::from("a"), Value::Int(1)];
        let insert = |columns: &[usize], rows: &[&[Value]]| {
            table.insert_batch_values(&session, columns, rows.iter().copied())
        };
        let error = insert(&[1, 1], &[&row]).unwrap_err();
        assert!(
            matches!(&error, EngineError::DuplicateInsertColumn { column } if column == "Payload"),
            "{error}"
        );
        assert!(error.to_string().contains("more than once"), "{error}");
        let error = insert(&[0, 1], &[&row]).unwrap_err();
        assert!(
            matches!(error, EngineError::ExplicitIdentity { .. }),
            "{error}"
        );
        let error = insert(&[1, 9], &[&row]).unwrap_err();
        assert!(
            matches!(error, EngineError::UnknownColumn { .. }),
            "{error}"
        );
        if shape == "computed" {
            let error = insert(&[1, 5], &[&row]).unwrap_err();
            assert!(
                matches!(error, EngineError::ComputedColumn { .. }),
                "{error}"
            );
        }
        let short = [Value::from("b")];
        let error = insert(&[1, 4], &[&row, &row, &short]).unwrap_err();
        assert!(
            matches!(
                error,
                EngineError::InsertArity {
                    row: 3,
                    expected: 2,
                    got: 1
                }
            ),
            "{error}"
        );
        assert_eq!(table.row_count(), 0);
        assert_eq!(table.next_identity(), Some(1));
        // No rows is no statement; then the first good batch gets the first values.
        assert_eq!(insert(&[1, 4], &[]).unwrap(), Vec::<Option<i64>>::new());
        // A value that does not convert fails the batch.
        let error = insert(&[4, 1], &[&[Value::Int(7), Value::from("x")], &row[..]]).unwrap_err();
        assert!(error.to_string().contains("to data type int"), "{error}");
        assert_eq!(table.row_count(), 0);
    }
}

/// An in-memory autocommit insert of fresh identity keys takes no row lock only where nothing
/// can fail after its rows are in the clustered tree: with a nonclustered index, an entry made
/// afterwards can still fail and take the rows out again, and so can a later row of a batch,
/// so they are locked from the moment a reader could see them (a reader would otherwise return
/// a row that never commits).
#[test]
fn fresh_rows_are_locked_while_a_later_index_entry_can_still_fail() {
    let db = database();
    let table = |name: &str, unique_email: bool| {
        let mut def = TableDef::new(name)
            .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
            .column(ColumnDef::new("Email", DataType::VarChar(50)).not_null())
            .clustered(IndexDef::new(
                format!("PK_{name}"),
                &["Id"],
                Uniqueness::PrimaryKey,
            ));
        if unique_email {
            def = def.nonclustered(IndexDef::new(
                format!("UQ_{name}"),
                &["Email"],
                Uniqueness::UniqueConstraint,
            ));
        }
        db.create_table(def).unwrap()
    };
    let (plain, indexed) = (table("Plain", false), table("Indexed", true));
    let session = db.session();
    let locks_taken = |insert: &dyn Fn()| {
        let before = db.lock_stats().acquired;
        insert();
        db.lock_stats().acquired - before
    };
    let row = || InsertRow::new().set(1, "a@example.com");
    assert_eq!(
        locks_taken(&|| {
            plain.insert(&session, row()).unwrap();
        }),
        0,
        "nothing can fail after the row is in: no lock"
    );
    // A batch's rows go in one after another, and a later one can still fail (a database
    // full at its page limit) and take the visible ones back: one range lock covers them.
    assert_eq!(
        locks_taken(&|| drop(plain.insert_batch(&session, vec![row(), row()]).unwrap())),
        1
    );
    assert_eq!(
        locks_taken(&|| drop(plain.insert_batch(&session, vec![row()]).unwrap())),
        0,
        "a batch of one row is a single row"
    );
    // The unique key is locked as always; the clustered key now too.
    assert_eq!(
        locks_taken(&|| {
            indexed.insert(&session, row()).unwrap();
        }),
        2
    );
    // The duplicate fails after its clustered row went in; that row was locked meanwhile.
    assert_eq!(
        locks_taken(&|| assert!(indexed.insert(&session, row()).is_err())),
        2
    );
    assert_eq!(indexed.row_count(), 1);
}

/// A table is reached only through sessions of its own database: through another database's
/// session, a statement would take that database's locks and write its log under this
/// table's index ids (which that database's recovery would apply to its own tables).
#[test]
fn a_table_refuses_sessions_of_another_database() {
    let (one, other) = (database(), database());
    let table = borrowed_batch_table(&one, "Mine", "tail");
    borrowed_batch_table(&other, "Theirs", "tail");
    let stranger = other.session();
    let row = InsertRow::new().set(1, "x");
    let refused = |result: Result<(), EngineError>| {
        assert!(
            matches!(&result, Err(EngineError::UnknownTable(name)) if name == "Mine"),
            "{result:?}"
        );
    };
    refused(table.insert(&stranger, row.clone()).map(drop));
    refused(table.get(&stranger, &[Value::Int(1)]).map(drop));
    refused(
        table
            .scan(&stranger, &KeyRange::all(), Direction::Forward)
            .map(drop),
    );
    assert_eq!(table.row_count(), 0);
    let own = one.session();
    table.insert(&own, row).unwrap();
    assert_eq!(
        table
            .get(&own, &[Value::Int(1)])
            .unwrap()
            .map(|row| row.len()),
        Some(5)
    );
}

/// An iterator whose `len` lies (`ExactSizeIterator` is a safe trait): the batch counts the
/// rows it is given instead, so it neither drops rows nor reads past its end.
#[test]
fn a_batch_counts_its_rows_whatever_the_iterator_says() {
    struct Lying<'a> {
        rows: std::slice::Iter<'a, Vec<Value>>,
        claimed: usize,
    }
    impl<'a> Iterator for Lying<'a> {
        type Item = &'a [Value];
        fn next(&mut self) -> Option<&'a [Value]> {
            self.rows.next().map(Vec::as_slice)
        }
        fn size_hint(&self) -> (usize, Option<usize>) {
            (self.claimed, Some(self.claimed))
        }
    }
    impl ExactSizeIterator for Lying<'_> {}
    let db = database();
    let table = borrowed_batch_table(&db, "Lied_to", "tail");
    let session = db.session();
    let rows: Vec<Vec<Value>> = ["a", "b", "c"]
        .into_iter()
        .map(|payload| vec![Value::from(payload)])
        .collect();
    for claimed in [1, 5, 0, usize::MAX] {
        let ids = table
            .insert_batch_values(
                &session,
                &[1],
                Lying {
                    rows: rows.iter(),
                    claimed,
                },
            )
            .unwrap();
        assert_eq!(ids.len(), 3, "claimed {claimed}");
    }
    assert_eq!(table.row_count(), 12);
    table.check_integrity().unwrap();
}

/// `PreparedInsert::insert` stores exactly what `Table::insert` stores for the same row, on
/// the borrowed path (identity key, no nonclustered index) and on the copying paths (a
/// nonclustered index, a computed column): random column lists in any order, each prepared
/// once and run for several rows, values that need converting, defaults, NULLs, and rows that
/// fail, the same way. A rolled-back transaction of prepared inserts leaves nothing behind
/// and does not give its identity values out again.
#[test]
fn prepared_inserts_store_what_single_row_inserts_store() {
    let (seed, mut rng) = seeded_rng();
    let db = database();
    for shape in ["tail", "nonclustered", "computed"] {
        let owned = borrowed_batch_table(&db, &format!("Owned_{shape}"), shape);
        let prepared_table = borrowed_batch_table(&db, &format!("Prepared_{shape}"), shape);
        let session = db.session();
        let (mut failed, mut inserted) = (0, 0);
        for _ in 0..60 {
            let columns = random_insert_columns(&mut rng);
            let prepared = prepared_table.prepare_insert(&columns).unwrap();
            for _ in 0..rng.random_range(1..10) {
                let row = random_insert_values(&mut rng, &columns, 12);
                let owned_row = insert_row(&columns, &row);
                let from_owned = owned.insert(&session, owned_row);
                let from_prepared = prepared.insert(&session, &row);
                let context = format!("seed {seed}: {shape}");
                match same_outcome(&from_owned, &from_prepared, "Prepared_", &context) {
                    Some(_) => inserted += 1,
                    None => failed += 1,
                }
            }
        }
        assert!(
            failed > 3 && inserted > 100,
            "seed {seed}: {failed} {inserted}"
        );
        // A transaction of prepared inserts that rolls back.
        let prepared = prepared_table.prepare_insert(&[1]).unwrap();
        let rows_before = prepared_table.row_count();
        session.begin().unwrap();
        let mut rolled_back = Vec::new();
        for _ in 0..3 {
            rolled_back.push(prepared.insert(&session, &[Value::from("gone")]).unwrap());
            owned
                .insert(&session, InsertRow::new().set(1, "gone"))
                .unwrap();
        }
        session.rollback().unwrap();
        assert_eq!(
            prepared_table.row_count(),
            rows_before,
            "seed {seed}: {shape}"
        );
        let after = prepared.insert(&session, &[Value::from("kept")]).unwrap();
        let owned_after = owned
            .insert(&session, InsertRow::new().set(1, "kept"))
            .unwrap();
        assert_eq!(after, owned_after, "seed {seed}: {shape}");
        assert!(
            after > rolled_back.into_iter().max().flatten(),
            "seed {seed}: {shape}: a rolled-back identity value was given out again"
        );
        assert_eq!(
            common::rows(&owned, &session),
            common::rows(&prepared_table, &session),
            "seed {seed}: {shape}"
        );
        assert_eq!(prepared_table.row_count(), inserted as u64 + 1);
    }
    db.check_integrity().unwrap();
}

/// A bad column list fails `prepare_insert`, and a row of the wrong length fails the prepared
/// insert, each with an error that says so, before anything goes in or any identity value is
/// used.
#[test]
fn prepared_inserts_check_their_column_list_once_and_every_row_length() {
    let db = database();
    for shape in ["tail", "nonclustered"] {
        let table = borrowed_batch_table(&db, &format!("Checked_{shape}"), shape);
        let session = db.session();
        let error = table.prepare_insert(&[1, 1]).err().unwrap();
        assert!(
            matches!(&error, EngineError::DuplicateInsertColumn { column } if column == "Payload"),
            "{error}"
        );
        let error = table.prepare_insert(&[0, 1]).err().unwrap();
        assert!(
            matches!(error, EngineError::ExplicitIdentity { .. }),
            "{error}"
        );
        let error = table.prepare_insert(&[1, 9]).err().unwrap();
        assert!(
            matches!(error, EngineError::UnknownColumn { .. }),
            "{error}"
        );
        let prepared = table.prepare_insert(&[1, 4]).unwrap();
        let error = prepared.insert(&session, &[Value::from("b")]).unwrap_err();
        assert!(
            matches!(
                error,
                EngineError::InsertArity {
                    row: 1,
                    expected: 2,
                    got: 1
                }
            ),
            "{error}"
        );
        // NOT NULL and conversion failures, then a good row that gets the first identity.
        let error = prepared
            .insert(&session, &[Value::Null, Value::Int(1)])
            .unwrap_err();
        assert!(
            matches!(error, EngineError::NullNotAllowed { .. }),
            "{error}"
        );
        let error = prepared
            .insert(&session, &[Value::from("a"), Value::from("x")])
            .unwrap_err();
        assert!(error.to_string().contains("to data type int"), "{error}");
        assert_eq!(table.row_count(), 0);
        assert_eq!(table.next_identity(), Some(1));
        let row = [Value::from("a"), Value::from("12")];
        assert_eq!(prepared.insert(&session, &row).unwrap(), Some(1));
        assert_eq!(
            common::rows(&table, &session),
            vec![vec![
                Value::Int(1),
                Value::from("a"),
                Value::from("zz  "),
                Value::Null,
                Value::Int(12)
            ]]
        );
    }
    db.check_integrity().unwrap();
}

/// A table wider than a borrowed row holds on the stack takes prepared inserts the same way:
/// the row spills to the heap.
#[test]
fn prepared_inserts_into_a_wide_table_store_every_column() {
    let db = database();
    let mut definition =
        TableDef::new("Wide").column(ColumnDef::new("InsertID", DataType::BigInt).identity(1, 1));
    for column in 1..=40 {
        definition = definition.column(ColumnDef::new(format!("C{column}"), DataType::Int));
    }
    let table = db
        .create_table(definition.clustered(IndexDef::new(
            "PK_Wide",
            &["InsertID"],
            Uniqueness::PrimaryKey,
        )))
        .unwrap();
    let columns: Vec<usize> = (1..=40).rev().collect();
    let prepared = table.prepare_insert(&columns).unwrap();
    let session = db.session();
    for row in 0..3 {
        let values: Vec<Value> = columns
            .iter()
            .map(|&column| Value::Int(row * 100 + column as i32))
            .collect();
        assert_eq!(
            prepared.insert(&session, &values).unwrap(),
            Some(i64::from(row) + 1)
        );
    }
    let rows = common::rows(&table, &session);
    assert_eq!(rows.len(), 3);
    for (row, stored) in rows.iter().enumerate() {
        let expected: Vec<Value> = std::iter::once(Value::BigInt(row as i64 + 1))
            .chain((1..=40).map(|column| Value::Int(row as i32 * 100 + column)))
            .collect();
        assert_eq!(stored, &expected);
    }
    db.check_integrity().unwrap();
}

/// A unique nonclustered key another transaction inserted and has not committed makes an
/// insert of the same value wait, on every path, even when the insert's own clustered key is
/// a fresh identity value that needs no lock (an in-memory autocommit insert): after a
/// rollback the insert goes in, after a commit it fails as a duplicate. Before this was fixed,
/// the waiting insert failed at once with a duplicate key that was then rolled back.
#[test]
fn an_uncommitted_unique_nonclustered_key_makes_an_insert_wait() {
    for (shape, batch) in [
        ("identity", false),
        ("identity", true),
        ("classic", false),
        ("classic", true),
    ] {
        let db = common::in_memory_with_lock_timeout(std::time::Duration::from_secs(20));
        let mut def = TableDef::new("Customers")
            .column(ColumnDef::new("Id", DataType::Int).identity(1, 1))
            .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
            .column(ColumnDef::new("Region", DataType::Int));
        def = match shape {
            // The tree makes the identity key (`identity_keyed`).
            "identity" => def.clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey)),
            _ => def.clustered(IndexDef::new(
                "CX",
                &["Region", "Id"],
                Uniqueness::NonUnique,
            )),
        };
        let table = db
            .create_table(def.nonclustered(IndexDef::new(
                "UX_Code",
                &["Code"],
                Uniqueness::UniqueIndex,
            )))
            .unwrap();
        for (code, commit) in [("x", false), ("y", true)] {
            let first = db.session();
            first.begin().unwrap();
            table
                .insert(&first, InsertRow::new().set(1, code).set(2, 1))
                .unwrap();
            let second = common::while_blocked(
                &db,
                &format!("{shape} batch={batch} {code}: the second insert did not wait"),
                || {
                    let session = db.session();
                    let result = if batch {
                        let rows = vec![
                            InsertRow::new().set(1, format!("{code}-other")).set(2, 2),
                            InsertRow::new().set(1, code).set(2, 2),
                        ];
                        table.insert_batch(&session, rows).map(|_| ())
                    } else {
                        table
                            .insert(&session, InsertRow::new().set(1, code).set(2, 2))
                            .map(|_| ())
                    };
                    (
                        result,
                        session.waits().wait(WaitType::LckMX).waiting_tasks_count,
                    )
                },
                || {
                    if commit {
                        first.commit().unwrap();
                    } else {
                        first.rollback().unwrap();
                    }
                },
            );
            let (result, lock_waits) = second;
            assert!(lock_waits >= 1, "{shape} batch={batch} {code}");
            if commit {
                let error = result.unwrap_err();
                assert!(
                    matches!(error, EngineError::DuplicateIndexKey { .. }),
                    "{shape} batch={batch}: {error}"
                );
            } else {
                result.unwrap_or_else(|error| panic!("{shape} batch={batch}: {error}"));
            }
            let session = db.session();
            let rows = table
                .get_by_index(&session, "UX_Code", &[Value::from(code)])
                .unwrap();
            // One row with the code: the committed first one, or the second after a rollback.
            let region = if commit { 1 } else { 2 };
            assert_eq!(rows.len(), 1, "{shape} batch={batch} {code}: {rows:?}");
            assert_eq!(
                rows[0][2],
                Value::Int(region),
                "{shape} batch={batch} {code}"
            );
        }
        db.check_integrity().unwrap();
    }
}

/// Batches into a table clustered on its identity with non-unique nonclustered indexes go in
/// at the tail too (each batch's values consecutive, leaves full under concurrency), and each
/// row's nonclustered entries follow once its identity value is known: every row is found
/// through its index. A batch whose nonclustered entry is rejected (a key too large) leaves
/// nothing in any index, and a rolled-back batch neither.
#[test]
fn identity_batches_with_nonclustered_indexes_go_in_at_the_tail() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Tagged")
                .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .column(ColumnDef::new("Tag", DataType::Int).not_null())
                .column(ColumnDef::new("Note", DataType::VarChar(2000)))
                .clustered(IndexDef::new(
                    "PK_Tagged",
                    &["InsertID"],
                    Uniqueness::PrimaryKey,
                ))
                .nonclustered(IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique))
                .nonclustered(IndexDef::new("IX_Note", &["Note"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let (threads, batches, rows) = (8, 30, 50);
    batches_on_threads(&db, threads, batches, |session, thread, batch| {
        let tag = (thread * 1000 + batch) as i32;
        let batch_rows = (0..rows)
            .map(|row| InsertRow::new().set(1, format!("{tag}-{row}")).set(2, tag))
            .collect();
        let ids = table.insert_batch(session, batch_rows).unwrap();
        assert_consecutive(&ids, rows);
        let mut found = table
            .get_by_index(session, "IX_Tag", &[Value::Int(tag)])
            .unwrap();
        found.sort_by_key(|row| row[0].as_i64());
        assert_eq!(found.len(), rows, "tag {tag}");
        for (row, (values, id)) in found.iter().zip(&ids).enumerate() {
            assert_eq!(values[0].as_i64(), *id, "tag {tag}");
            assert_eq!(values[1], Value::from(format!("{tag}-{row}").as_str()));
        }
    });
    let total = (threads * batches * rows) as u64;
    let check = |expected: u64| {
        let checks = db.check_integrity().unwrap();
        let check = checks.iter().find(|check| check.table == "Tagged").unwrap();
        assert_eq!(check.rows, expected);
        for (name, tree) in &check.indexes {
            assert_eq!(tree.rows, expected, "{name}");
        }
        check.indexes[0].1.leaf_fill
    };
    let fill = check(total);
    assert!(fill > 0.95, "leaf fill {fill}");

    let session = db.session();
    let before = table.next_identity().unwrap();
    // The last row's note is too long for a key of IX_Note: its entry is rejected after the
    // clustered records and the other entries went in, and all of them are removed again.
    let mut failing: Vec<InsertRow> = (0..rows)
        .map(|row| {
            InsertRow::new()
                .set(1, format!("bad-{row}"))
                .set(2, -1)
                .set(3, "n")
        })
        .collect();
    failing.push(
        InsertRow::new()
            .set(1, "too long")
            .set(2, -1)
            .set(3, "x".repeat(1800)),
    );
    let error = table.insert_batch(&session, failing).unwrap_err();
    assert!(matches!(error, EngineError::KeyTooLarge { .. }), "{error}");
    assert_eq!(table.row_count(), total);
    assert!(
        table
            .get_by_index(&session, "IX_Tag", &[Value::Int(-1)])
            .unwrap()
            .is_empty()
    );
    check(total);
    // A rolled-back batch leaves nothing behind either; its values are not handed out again.
    session.begin().unwrap();
    let rolled_back = table
        .insert_batch(
            &session,
            (0..rows)
                .map(|_| InsertRow::new().set(1, "gone").set(2, -2))
                .collect(),
        )
        .unwrap();
    session.rollback().unwrap();
    check(total);
    let next = table
        .insert_batch(&session, vec![InsertRow::new().set(1, "after").set(2, -3)])
        .unwrap();
    assert!(next[0].unwrap() > rolled_back.last().unwrap().unwrap());
    assert!(next[0].unwrap() > before);
    check(total + 1);
}

/// A dropped table is gone from the catalog, and a handle of it kept from before refuses every
/// write with "Invalid object name" instead of writing rows nobody can reach, and every read;
/// a new table of the same name starts empty.
#[test]
fn a_dropped_table_refuses_writes_through_handles_kept_from_before() {
    let db = database();
    let table = borrowed_batch_table(&db, "Dropped", "tail");
    let session = db.session();
    let prepared = table.prepare_insert(&[1]).unwrap();
    table
        .insert(&session, InsertRow::new().set(1, "kept"))
        .unwrap();
    assert!(!table.is_dropped());
    db.drop_table("dropped").unwrap();
    assert!(table.is_dropped());
    assert!(matches!(
        db.table("Dropped"),
        Err(EngineError::UnknownTable(name)) if name == "Dropped"
    ));
    let refused = |result: lastpage_engine::Result<()>, what: &str| match result {
        Err(EngineError::UnknownTable(name)) => {
            assert_eq!(name, "Dropped", "{what}");
        }
        other => panic!("{what} into a dropped table: {other:?}"),
    };
    refused(
        table
            .insert(&session, InsertRow::new().set(1, "lost"))
            .map(|_| ()),
        "insert",
    );
    refused(
        prepared
            .insert(&session, &[Value::from("lost")])
            .map(|_| ()),
        "prepared insert",
    );
    refused(
        table
            .insert_batch(&session, vec![InsertRow::new().set(1, "lost")])
            .map(|_| ()),
        "batch",
    );
    refused(
        table
            .update(&session, &[Value::Int(1)], &[(1, Value::from("lost"))])
            .map(|_| ()),
        "update",
    );
    refused(
        table.delete(&session, &[Value::Int(1)]).map(|_| ()),
        "delete",
    );
    // Inside an explicit transaction too, which stays usable.
    session.begin().unwrap();
    refused(
        table
            .insert(&session, InsertRow::new().set(1, "lost"))
            .map(|_| ()),
        "insert in a transaction",
    );
    session.commit().unwrap();
    assert!(matches!(
        db.drop_table("Dropped"),
        Err(EngineError::UnknownTable(_))
    ));
    let again = borrowed_batch_table(&db, "Dropped", "tail");
    assert_eq!(again.row_count(), 0);
    assert_eq!(
        again
            .insert(&session, InsertRow::new().set(1, "new"))
            .unwrap(),
        Some(1)
    );
    // Reads through the old handle are refused too.
    assert!(matches!(
        table.get(&session, &[Value::Int(1)]),
        Err(EngineError::UnknownTable(_))
    ));
    assert!(matches!(
        table.scan(&session, &KeyRange::all(), Direction::Forward),
        Err(EngineError::UnknownTable(_))
    ));
    assert!(matches!(
        table.get_by_index(&session, "PK_Dropped", &[Value::Int(1)]),
        Err(EngineError::UnknownTable(_))
    ));
    db.check_integrity().unwrap();
}

/// A search value longer than its column equals no row but sorts among the rows, as SQL
/// Server compares it: a lookup finds nothing and a range starts or ends between the rows,
/// for text and binary keys, clustered and nonclustered alike. Trailing spaces (and a binary
/// value's trailing zero bytes) still do not count.
#[test]
fn search_values_longer_than_their_column_compare_with_the_rows() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Codes")
                .column(ColumnDef::new("Code", DataType::VarChar(3)).not_null())
                .column(ColumnDef::new("Tag", DataType::VarBinary(2)).not_null())
                .clustered(IndexDef::new("PK_Codes", &["Code"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("IX_Tag", &["Tag"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    for (code, tag) in [("abc", vec![1, 2]), ("abd", vec![1, 3]), ("zzz", vec![9])] {
        table
            .insert(
                &session,
                InsertRow::new().set(0, code).set(1, Value::Binary(tag)),
            )
            .unwrap();
    }
    let codes = |range: KeyRange, direction: Direction| -> Vec<String> {
        table
            .scan(&session, &range, direction)
            .unwrap()
            .map(|row| match &row.unwrap()[0] {
                Value::String(code) => code.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let long = || vec![Value::from("abcd")];
    let from = |lower| KeyRange {
        lower,
        upper: Bound::Unbounded,
    };
    let to = |upper| KeyRange {
        lower: Bound::Unbounded,
        upper,
    };
    assert_eq!(
        codes(from(Bound::Included(long())), Direction::Forward),
        ["abd", "zzz"]
    );
    assert_eq!(
        codes(from(Bound::Excluded(long())), Direction::Backward),
        ["zzz", "abd"]
    );
    assert_eq!(
        codes(to(Bound::Included(long())), Direction::Forward),
        ["abc"]
    );
    assert_eq!(
        codes(to(Bound::Excluded(long())), Direction::Backward),
        ["abc"]
    );
    let longest = vec![Value::from("b".repeat(8000))];
    assert_eq!(
        codes(from(Bound::Included(longest)), Direction::Forward),
        ["zzz"]
    );
    // Longer than any text column: refused with the truncation error, and no row equals it.
    let too_long = vec![Value::from("b".repeat(8001))];
    assert!(matches!(
        table.scan(
            &session,
            &from(Bound::Included(too_long.clone())),
            Direction::Forward
        ),
        Err(EngineError::Value(_))
    ));
    assert_eq!(table.get(&session, &too_long).unwrap(), None);
    assert_eq!(table.get(&session, &long()).unwrap(), None);
    assert!(
        table
            .get(&session, &[Value::from("abc    ")])
            .unwrap()
            .is_some()
    );
    assert!(table.delete(&session, &long()).is_ok_and(|found| !found));
    let tagged = |tag: Vec<u8>| {
        table
            .get_by_index(&session, "IX_Tag", &[Value::Binary(tag)])
            .unwrap()
            .len()
    };
    assert_eq!(tagged(vec![1, 2, 5]), 0);
    assert_eq!(tagged(vec![1, 2]), 1);
    // Binary values compare as if padded with zero bytes, as SQL Server compares them.
    assert_eq!(tagged(vec![1, 2, 0]), 1);
}

/// A search value outside its column's range (a bigint in an int key) compares with the rows
/// as in SQL Server, instead of failing with the overflow of converting it to the column's
/// type: a lookup finds no row, and a range bound lies above or below them all.
#[test]
fn search_values_outside_the_key_columns_range_compare_with_the_rows() {
    let db = database();
    let table = insert_contention_table(&db, "Wide", DataType::VarChar(10));
    let session = db.session();
    for _ in 0..3 {
        table
            .insert(&session, InsertRow::new().set(1, "x"))
            .unwrap();
    }
    let above = || vec![Value::BigInt(i64::from(i32::MAX) + 1)];
    let below = || vec![Value::BigInt(i64::from(i32::MIN) - 1)];
    assert_eq!(table.get(&session, &above()).unwrap(), None);
    assert!(table.delete(&session, &above()).is_ok_and(|found| !found));
    assert!(table.get(&session, &[Value::BigInt(1)]).unwrap().is_some());
    let count = |lower, upper| count_in(&table, &session, lower, upper);
    use Bound::{Excluded, Included, Unbounded};
    assert_eq!(count(Included(above()), Unbounded), 0);
    assert_eq!(count(Excluded(below()), Unbounded), 3);
    assert_eq!(count(Unbounded, Included(above())), 3);
    assert_eq!(count(Unbounded, Excluded(below())), 0);
    assert_eq!(count(Included(below()), Excluded(above())), 3);
    // Values that do not convert at all are still errors.
    assert!(table.get(&session, &[Value::from("one")]).is_err());
}

/// A number that a numeric key column cannot hold exactly (1.5 in an INT key, 1.005 in a
/// DECIMAL(5,2) one) compares with the rows exactly, as SQL Server compares it (in the type of
/// higher precedence): a lookup finds no row, and a range bound lies between the keys around
/// it. Converting it to the column's type first rounded it onto a key: a lookup of 1.5 found
/// row 1, `>= 1.5` returned row 1 and `< 1.5` missed it.
#[test]
fn search_numbers_a_key_column_cannot_hold_exactly_compare_with_the_rows() {
    use lastpage_engine::types::Decimal;
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Prices")
                .column(ColumnDef::new("A", DataType::Int).not_null())
                .column(
                    ColumnDef::new(
                        "Price",
                        DataType::Decimal {
                            precision: 5,
                            scale: 2,
                        },
                    )
                    .not_null(),
                )
                .clustered(IndexDef::new("PK_Prices", &["A"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("IX_Price", &["Price"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    let decimal = |mantissa, scale| Value::Decimal(Decimal::new(mantissa, scale).unwrap());
    for a in -2..=2 {
        let price = decimal(i128::from(a) * 100 + 1, 2);
        table
            .insert(&session, InsertRow::new().set(0, a).set(1, price))
            .unwrap();
    }
    let keys = |lower, upper| -> Vec<i64> {
        table
            .scan(&session, &KeyRange { lower, upper }, Direction::Forward)
            .unwrap()
            .map(|row| row.unwrap()[0].as_i64().unwrap())
            .collect()
    };
    use Bound::{Excluded, Included, Unbounded};
    let one_and_a_half = || vec![decimal(15, 1)];
    let minus_one_and_a_half = || vec![decimal(-15, 1)];
    assert_eq!(table.get(&session, &one_and_a_half()).unwrap(), None);
    assert_eq!(table.get(&session, &minus_one_and_a_half()).unwrap(), None);
    assert!(!table.delete(&session, &one_and_a_half()).unwrap());
    assert_eq!(keys(Included(one_and_a_half()), Unbounded), [2]);
    assert_eq!(keys(Excluded(one_and_a_half()), Unbounded), [2]);
    assert_eq!(keys(Unbounded, Excluded(one_and_a_half())), [-2, -1, 0, 1]);
    assert_eq!(keys(Unbounded, Included(one_and_a_half())), [-2, -1, 0, 1]);
    // -1.5 converts toward zero, to -1, and lies below it.
    assert_eq!(
        keys(Included(minus_one_and_a_half()), Unbounded),
        [-1, 0, 1, 2]
    );
    assert_eq!(keys(Unbounded, Included(minus_one_and_a_half())), [-2]);
    assert_eq!(
        keys(Excluded(minus_one_and_a_half()), Excluded(one_and_a_half())),
        [-1, 0, 1]
    );
    // Numbers the column holds exactly still find their row, whatever their type.
    let row_two = Some(vec![Value::Int(2), decimal(201, 2)]);
    assert_eq!(table.get(&session, &[decimal(20, 1)]).unwrap(), row_two);
    assert_eq!(
        table.get(&session, &[Value::Money(20_000)]).unwrap(),
        row_two
    );
    assert_eq!(table.get(&session, &[Value::Money(25_000)]).unwrap(), None);
    // A decimal beyond the column's range is above (or below) every row, as an integer is.
    let huge = || vec![decimal(10_000_000_000, 0)];
    assert_eq!(table.get(&session, &huge()).unwrap(), None);
    assert_eq!(keys(Included(huge()), Unbounded), Vec::<i64>::new());
    assert_eq!(keys(Unbounded, Excluded(huge())).len(), 5);
    // The same in a DECIMAL(5,2) index: 1.005 lies between 1.00 and 1.01.
    let priced = |price: Value| table.get_by_index(&session, "IX_Price", &[price]).unwrap();
    assert!(priced(decimal(1005, 3)).is_empty());
    assert!(priced(decimal(1014, 3)).is_empty());
    assert_eq!(priced(decimal(1010, 3)).len(), 1);
    assert_eq!(priced(Value::Int(1)).len(), 0);
}

/// A date or datetime2 that a temporal key column cannot hold exactly (a time of day in a DATE
/// key, a fraction of a second in a DATETIME2(0) one) compares exactly too, as SQL Server
/// compares it (in the type of higher precedence): converting it first cut or rounded it onto
/// a key.
#[test]
fn search_instants_a_key_column_cannot_hold_exactly_compare_with_the_rows() {
    use lastpage_engine::types::{Date, DateTime2};
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Events")
                .column(ColumnDef::new("At", DataType::DateTime2(0)).not_null())
                .column(ColumnDef::new("Day", DataType::Date).not_null())
                .clustered(IndexDef::new("PK_Events", &["At"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new("IX_Day", &["Day"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    let day = |d| Date::from_ymd(2026, 11, d).unwrap();
    let at = |d, second, ticks| {
        Value::DateTime2(DateTime2::from_hms(day(d), 10, 0, second, ticks).unwrap())
    };
    for d in 1..=3 {
        for second in 0..2 {
            table
                .insert(
                    &session,
                    InsertRow::new()
                        .set(0, at(d, second, 0))
                        .set(1, Value::Date(day(d))),
                )
                .unwrap();
        }
    }
    // 10:00:00.4 on the 2nd rounds to 10:00:00 in DATETIME2(0), but lies between two keys.
    let between = || vec![at(2, 0, 4_000_000)];
    assert_eq!(table.get(&session, &between()).unwrap(), None);
    let count = |lower, upper| count_in(&table, &session, lower, upper);
    use Bound::{Included, Unbounded};
    assert_eq!(count(Included(between()), Unbounded), 3);
    assert_eq!(count(Unbounded, Included(between())), 3);
    // 10:00:00.6 rounds up to 10:00:01, and lies below it.
    let below_next = || vec![at(2, 0, 6_000_000)];
    assert_eq!(table.get(&session, &below_next()).unwrap(), None);
    assert_eq!(count(Included(below_next()), Unbounded), 3);
    // The same key at whole seconds, and a date (its midnight), compare as usual.
    assert!(table.get(&session, &[at(2, 1, 0)]).unwrap().is_some());
    assert_eq!(count(Included(vec![Value::Date(day(2))]), Unbounded), 4);
    // Noon on the 2nd is no DATE; a lookup by the day itself finds its two rows.
    let by_day = |value: Value| table.get_by_index(&session, "IX_Day", &[value]).unwrap();
    assert!(by_day(at(2, 0, 0)).is_empty());
    assert_eq!(by_day(Value::Date(day(2))).len(), 2);
}

/// BIT converts every nonzero number to 1, so a number searched for in a BIT key is placed by
/// its value, not by its conversion: -1 lies below both bits (`>= -1` returned only 1, and
/// `<= -1` returned 0), 0.5 between them, 2 above them.
#[test]
fn search_numbers_in_a_bit_key_lie_below_between_or_above_the_bits() {
    use lastpage_engine::types::Decimal;
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Flags")
                .column(ColumnDef::new("Flag", DataType::Bit).not_null())
                .clustered(IndexDef::new("PK_Flags", &["Flag"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    for flag in [false, true] {
        table
            .insert(&session, InsertRow::new().set(0, flag))
            .unwrap();
    }
    let flags = |lower, upper| -> Vec<Value> {
        table
            .scan(&session, &KeyRange { lower, upper }, Direction::Forward)
            .unwrap()
            .map(|row| row.unwrap()[0].clone())
            .collect()
    };
    use Bound::{Included, Unbounded};
    let both = vec![Value::Bit(false), Value::Bit(true)];
    let half = Value::Decimal(Decimal::new(5, 1).unwrap());
    for (search, at_least, at_most) in [
        (Value::Int(-1), both.clone(), vec![]),
        (half, vec![Value::Bit(true)], vec![Value::Bit(false)]),
        (Value::Int(2), vec![], both.clone()),
        (Value::Int(1), vec![Value::Bit(true)], both.clone()),
    ] {
        let key = || vec![search.clone()];
        assert_eq!(
            flags(Included(key()), Unbounded),
            at_least,
            "Flag >= {search:?}"
        );
        assert_eq!(
            flags(Unbounded, Included(key())),
            at_most,
            "Flag <= {search:?}"
        );
        let found = table.get(&session, &key()).unwrap();
        assert_eq!(
            found.is_some(),
            search == Value::Int(1),
            "Flag = {search:?}"
        );
    }
}

/// A number (or a date, or a uniqueidentifier) searched for in a text key is refused with a
/// clear error: SQL Server compares them by converting the column's text to the number, row by
/// row, which no index on the text can answer. Converting the number to text instead gave
/// other rows without a word (`Code >= 5` returned '5' alone, where SQL Server returns '05',
/// '10' and '5').
#[test]
fn a_number_searched_for_in_a_text_key_is_refused() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Codes")
                .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
                .clustered(IndexDef::new("PK_Codes", &["Code"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    for code in ["05", "5", "10"] {
        // Stored values convert to the column's type, as an INSERT converts them.
        table
            .insert(&session, InsertRow::new().set(0, code))
            .unwrap();
    }
    table.insert(&session, InsertRow::new().set(0, 7)).unwrap();
    let refused = table.get(&session, &[Value::Int(5)]).unwrap_err();
    assert!(
        refused.to_string().contains("pass the value as text"),
        "{refused}"
    );
    let range = KeyRange {
        lower: Bound::Included(vec![Value::Int(5)]),
        upper: Bound::Unbounded,
    };
    assert!(table.scan(&session, &range, Direction::Forward).is_err());
    // As text, the search is the index's own.
    assert!(table.get(&session, &[Value::from("5")]).unwrap().is_some());
    assert!(table.get(&session, &[Value::from("7")]).unwrap().is_some());
}

/// A PRIMARY KEY's columns are NOT NULL even when their definition does not say so, as in SQL
/// Server: a NULL key was stored.
#[test]
fn a_primary_key_column_refuses_null() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Keys")
                .column(ColumnDef::new("Id", DataType::Int))
                .column(ColumnDef::new("V", DataType::Int))
                .clustered(IndexDef::new("PK_Keys", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let error = table
        .insert(&session, InsertRow::new().set(0, Value::Null).set(1, 1))
        .unwrap_err();
    assert!(
        matches!(error, EngineError::NullNotAllowed { .. }),
        "{error}"
    );
    // Only the key's columns: V still takes NULL.
    table
        .insert(&session, InsertRow::new().set(0, 1).set(1, Value::Null))
        .unwrap();
}

/// In a composite key, a value beyond its column's range decides the comparison at that column:
/// the rows with the same leading values are all below (or all above) the bound.
#[test]
fn an_out_of_range_value_inside_a_composite_bound_decides_at_its_column() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Pairs")
                .column(ColumnDef::new("A", DataType::Int).not_null())
                .column(ColumnDef::new("B", DataType::TinyInt).not_null())
                .clustered(IndexDef::new(
                    "PK_Pairs",
                    &["A", "B"],
                    Uniqueness::PrimaryKey,
                )),
        )
        .unwrap();
    let session = db.session();
    for a in 1..=3 {
        for b in [0, 7, 255] {
            table
                .insert(&session, InsertRow::new().set(0, a).set(1, b))
                .unwrap();
        }
    }
    let pairs = |lower, upper| -> Vec<(i64, i64)> {
        table
            .scan(&session, &KeyRange { lower, upper }, Direction::Forward)
            .unwrap()
            .map(|row| {
                let row = row.unwrap();
                (row[0].as_i64().unwrap(), row[1].as_i64().unwrap())
            })
            .collect()
    };
    use Bound::{Excluded, Included};
    let key = |a: i64, b: i64| vec![Value::BigInt(a), Value::BigInt(b)];
    // (2, 256) lies after every (2, b) and before (3, 0); (2, -1) before every (2, b).
    assert_eq!(
        pairs(Included(key(2, 256)), Included(key(3, 300))),
        [(3, 0), (3, 7), (3, 255)]
    );
    assert_eq!(
        pairs(Excluded(key(2, -1)), Excluded(key(2, 256))),
        [(2, 0), (2, 7), (2, 255)]
    );
    assert_eq!(pairs(Included(key(3, 256)), Bound::Unbounded), []);
}

/// NULL sorts below every value of a key column; a bound below the column's range keeps that
/// order, exactly like a bound at the column's lowest value.
#[test]
fn an_out_of_range_bound_sorts_above_null_keys_like_the_lowest_value() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Maybe")
                .column(ColumnDef::new("K", DataType::Int))
                .clustered(IndexDef::new("CX_Maybe", &["K"], Uniqueness::NonUnique)),
        )
        .unwrap();
    let session = db.session();
    for k in [Value::Null, Value::Int(1), Value::Int(2)] {
        table.insert(&session, InsertRow::new().set(0, k)).unwrap();
    }
    let count = |lower, upper| count_in(&table, &session, lower, upper);
    use Bound::{Excluded, Included, Unbounded};
    let below = || vec![Value::BigInt(i64::from(i32::MIN) - 1)];
    let lowest = || vec![Value::Int(i32::MIN)];
    assert_eq!(count(Included(below()), Unbounded), 2);
    assert_eq!(count(Included(lowest()), Unbounded), 2);
    assert_eq!(count(Unbounded, Excluded(below())), 1);
    assert_eq!(count(Unbounded, Excluded(lowest())), 1);
}

/// A computed column's expression or a function default that panics fails its statement with
/// an error, which is undone like any failed statement: nothing of it stays, in an explicit
/// transaction too, and its row locks go. When the panic unwound through the engine, the
/// statement's locks were held for ever, so the next reader of the row timed out.
#[test]
fn a_supplied_function_that_panics_fails_its_statement_and_leaves_nothing_behind() {
    let db = common::in_memory_with_lock_timeout(std::time::Duration::from_millis(500));
    let unlucky: ComputeFn = Arc::new(|row: &[Value]| {
        if row[1] == Value::Int(13) {
            panic!("thirteen");
        }
        Ok(row[1].clone())
    });
    let table = db
        .create_table(
            TableDef::new("Superstition")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .column(ColumnDef::new("V", DataType::Int).not_null())
                .column(ColumnDef::new("C", DataType::Int).computed(unlucky))
                .column(
                    ColumnDef::new("D", DataType::Int).default_value(DefaultValue::Function(
                        Arc::new(|| panic!("no default today")),
                    )),
                )
                .clustered(IndexDef::new("PK_S", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(0, 1).set(1, 0).set(3, 0))
        .unwrap();
    let error = table
        .update(&session, &[Value::Int(1)], &[(1, Value::Int(13))])
        .unwrap_err();
    assert!(
        matches!(&error, EngineError::FunctionPanicked { column, message, .. }
            if column == "C" && message == "thirteen"),
        "{error}"
    );
    let error = table
        .insert(&session, InsertRow::new().set(0, 2).set(1, 0))
        .unwrap_err();
    assert!(
        matches!(&error, EngineError::FunctionPanicked { column, .. } if column == "D"),
        "{error}"
    );
    // Inside a transaction, the failed statement is undone and the transaction goes on.
    session.begin().unwrap();
    table
        .update(&session, &[Value::Int(1)], &[(1, Value::Int(5))])
        .unwrap();
    assert!(
        table
            .update(&session, &[Value::Int(1)], &[(1, Value::Int(13))])
            .is_err()
    );
    session.commit().unwrap();
    // Another session reads and changes the row without waiting for a leaked lock.
    let other = db.session();
    let row = table.get(&other, &[Value::Int(1)]).unwrap().unwrap();
    assert_eq!(row[1], Value::Int(5));
    assert_eq!(row[2], Value::Int(5));
    table
        .update(&other, &[Value::Int(1)], &[(1, Value::Int(6))])
        .unwrap();
    assert_eq!(table.row_count(), 1);
    table.check_integrity().unwrap();
}

/// Starts a transaction of `writer` holding row 1 of a fresh `T(Id, V)`, runs `read` on
/// another thread, and once it waits on the row's lock, commits `writer` after 20 ms; returns
/// what `read` returned.
fn read_waiting_on_a_lock<R: Send>(
    db: &Database,
    delete: bool,
    read: impl FnOnce(&Arc<lastpage_engine::Table>) -> R + Send,
) -> R {
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .column(ColumnDef::new("V", DataType::Int))
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let setup = db.session();
    for id in 0..3 {
        table
            .insert(&setup, InsertRow::new().set(0, id).set(1, id))
            .unwrap();
    }
    let writer = db.session();
    writer.begin().unwrap();
    if delete {
        assert!(table.delete(&writer, &[Value::Int(1)]).unwrap());
    } else {
        assert!(
            table
                .update(&writer, &[Value::Int(1)], &[(1, Value::Int(10))])
                .unwrap()
        );
    }
    common::while_blocked(
        db,
        "the reader did not wait",
        || read(&table),
        || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            writer.commit().unwrap();
        },
    )
}

/// A wait inside `Session::run_statement` counts once for the session: the statement's own
/// read installed the session's accumulator a second time, and every wait of a statement run
/// that way counted twice in `Session::waits`.
#[test]
fn a_statements_wait_counts_once_for_its_session() {
    let db = database();
    let (statement, session) = read_waiting_on_a_lock(&db, false, |table| {
        let session = db.session();
        let (row, statement) = session.run_statement(|| table.get(&session, &[Value::Int(1)]));
        assert!(row.unwrap().is_some());
        (statement, session.waits())
    });
    let (statement, session) = (
        statement.wait(WaitType::LckMS),
        session.wait(WaitType::LckMS),
    );
    assert_eq!(statement.waiting_tasks_count, 1);
    assert_eq!(session.waiting_tasks_count, 1, "{session:?}");
    assert_eq!(session.wait_time_ns, statement.wait_time_ns);
}

/// A scan waits while it is iterated, after `Table::scan` returned: those waits are the
/// scanning session's too (they were only in the global statistics).
#[test]
fn a_scans_waits_are_its_sessions() {
    let db = database();
    let (rows, waits) = read_waiting_on_a_lock(&db, true, |table| {
        let session = db.session();
        let rows = table
            .scan(&session, &KeyRange::all(), Direction::Forward)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        (rows.len(), session.waits())
    });
    assert_eq!(rows, 2);
    assert_eq!(waits.wait(WaitType::LckMS).waiting_tasks_count, 1);
}

/// The resident memory of this process, from `/proc/self/statm`.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Sessions that are gone leave nothing behind: every session's slot stayed in the database's
/// list until a checkpoint, which an in-memory database never takes (two million sessions,
/// each dropped at once, kept 106 MB).
#[test]
fn sessions_that_are_gone_do_not_accumulate() {
    let db = database();
    for _ in 0..10_000 {
        drop(db.session());
    }
    let before = resident_bytes();
    for _ in 0..500_000 {
        drop(db.session());
    }
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 8 << 20,
        "500,000 dropped sessions left {} MB",
        grown >> 20
    );
}

/// `Database::close` shuts every clone of an in-memory database out too, as its documentation
/// says: the flag lived with the durable parts, so an in-memory database went on after it.
#[test]
fn closing_an_in_memory_database_refuses_every_statement_through_its_clones() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::Int).not_null())
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let other = db.clone();
    let session = other.session();
    table.insert(&session, InsertRow::new().set(0, 1)).unwrap();
    db.close().unwrap();
    let refused = table
        .insert(&session, InsertRow::new().set(0, 2))
        .unwrap_err();
    assert!(matches!(refused, EngineError::DatabaseClosed), "{refused}");
    assert!(matches!(
        table.get(&session, &[Value::Int(1)]),
        Err(EngineError::DatabaseClosed)
    ));
    assert!(other.session().begin().is_err());
}

/// An update that sets a NOT NULL column to NULL fails with SQL Server's message 515 for an
/// UPDATE ("... UPDATE fails."), not the INSERT's wording it used to borrow.
#[test]
fn an_update_to_null_in_a_not_null_column_says_update_fails() {
    let db = database();
    let table = db
        .create_table(
            TableDef::new("Notes")
                .column(ColumnDef::new("Id", DataType::Int))
                .column(ColumnDef::new("V", DataType::Int).not_null())
                .clustered(IndexDef::new("PK_Notes", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let error = table
        .insert(&session, InsertRow::new().set(0, 1))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Cannot insert the value NULL into column 'V', table 'Notes'; column does not allow nulls. INSERT fails."
    );
    table
        .insert(&session, InsertRow::new().set(0, 1).set(1, 5))
        .unwrap();
    let error = table
        .update(&session, &[Value::Int(1)], &[(1, Value::Null)])
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Cannot insert the value NULL into column 'V', table 'Notes'; column does not allow nulls. UPDATE fails."
    );
    assert_eq!(
        table.get(&session, &[Value::Int(1)]).unwrap().unwrap(),
        vec![Value::Int(1), Value::Int(5)]
    );
}
