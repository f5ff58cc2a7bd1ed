//! The seeds' remedies as engine options: hash partitioning (N trees behind one table, merged
//! scans), batched multi-row inserts (atomic per statement), OPTIMIZE_FOR_SEQUENTIAL_KEY and
//! the insert path switched at run time.

use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, EngineError, Expr, IndexDef,
    IndexOptions, InsertPath, InsertRow, KeyRange, TableDef, Uniqueness, Value,
};

mod common;

/// `InsertContention_Part`: the seeds' mod-16 remedy, `ModValue AS ABS(InsertID % 16)
/// PERSISTED` leading the clustered key, hash-partitioned 16 ways on it. The expression is a
/// stored one, so a durable database accepts the table too.
fn partitioned_table(db: &Database) -> Arc<lastpage_engine::Table> {
    db.create_table(
        TableDef::new("InsertContention_Part")
            .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
            .column(ColumnDef::new("Name", DataType::VarChar(100)).not_null())
            .column(
                ColumnDef::new("ModValue", DataType::TinyInt)
                    .not_null()
                    .computed_expression(Expr::column("InsertID").modulo(16).abs()),
            )
            .clustered(IndexDef::new(
                "PK_Part",
                &["ModValue", "InsertID"],
                Uniqueness::PrimaryKey,
            ))
            .nonclustered(IndexDef::new("IX_Name", &["Name"], Uniqueness::NonUnique))
            .partitioned("ModValue", 16),
    )
    .unwrap()
}

#[test]
fn a_partitioned_table_spreads_rows_and_reads_them_back_in_key_order() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = partitioned_table(&db);
    assert_eq!(table.partition_count(), 16);
    let session = db.session();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let (table, db) = (&table, &db);
            scope.spawn(move || {
                let session = db.session();
                for i in 0..250 {
                    table
                        .insert(
                            &session,
                            InsertRow::new().set(1, format!("t{thread}-{}", i % 5)),
                        )
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(table.row_count(), 2000);
    for tree in table.clustered_trees() {
        assert_eq!(
            tree.row_count(),
            125,
            "identity % 16 spreads 2000 rows evenly"
        );
    }
    // A merged scan over all partitions comes back in clustered key order (ModValue, InsertID).
    let rows = common::rows(&table, &session);
    assert_eq!(rows.len(), 2000);
    let keys: Vec<(u8, i32)> = rows
        .iter()
        .map(|row| match (&row[2], &row[0]) {
            (Value::TinyInt(m), Value::Int(id)) => (*m, *id),
            _ => unreachable!(),
        })
        .collect();
    assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
    let backward = common::scan(&table, &session, &KeyRange::all(), Direction::Backward);
    assert_eq!(backward.first(), rows.last());
    // A key that names the partition reads one partition; a prefix reads one ModValue.
    let row = table
        .get(&session, &[Value::Int(5), Value::Int(37)])
        .unwrap()
        .unwrap();
    assert_eq!(row[0], Value::Int(37));
    let fives = table
        .scan(
            &session,
            &common::prefix(vec![Value::Int(5)]),
            Direction::Forward,
        )
        .unwrap()
        .count();
    assert_eq!(fives, 125);
    assert_eq!(
        table
            .get_by_index(&session, "IX_Name", &[Value::from("t3-4")])
            .unwrap()
            .len(),
        50
    );
    // Update and delete find the row's partition.
    assert!(
        table
            .update(
                &session,
                &[Value::Int(5), Value::Int(37)],
                &[(1, Value::from("renamed"))]
            )
            .unwrap()
    );
    assert_eq!(
        table
            .get_by_index(&session, "IX_Name", &[Value::from("renamed")])
            .unwrap()
            .len(),
        1
    );
    assert!(
        table
            .delete(&session, &[Value::Int(5), Value::Int(37)])
            .unwrap()
    );
    assert_eq!(table.row_count(), 1999);
    let check = table.check_integrity().unwrap();
    assert_eq!(check.rows, 1999);
}

#[test]
fn partitioning_must_be_on_an_integer_clustered_key_column() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let error = db
        .create_table(
            TableDef::new("Bad")
                .column(ColumnDef::new("Id", DataType::Int))
                .column(ColumnDef::new("Part", DataType::Int))
                .clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey))
                .partitioned("Part", 4),
        )
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("must be part of the clustered key"),
        "{error}"
    );
    let error = db
        .create_table(
            TableDef::new("Bad2")
                .column(ColumnDef::new("Id", DataType::VarChar(5)))
                .clustered(IndexDef::new("PK", &["Id"], Uniqueness::PrimaryKey))
                .partitioned("Id", 4),
        )
        .unwrap_err();
    assert!(error.to_string().contains("integer"), "{error}");
}

/// A unique nonclustered index of a partitioned table has a tree per partition, so without the
/// partitioning column in its key two partitions could each hold the same key once (as SQL
/// Server, lastpage refuses such an index). With the column, a duplicate is caught.
#[test]
fn a_unique_index_of_a_partitioned_table_must_hold_the_partitioning_column() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = |unique_on: &[&str]| {
        TableDef::new("Parts")
            .column(ColumnDef::new("Part", DataType::Int).not_null())
            .column(ColumnDef::new("Id", DataType::Int).not_null())
            .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
            .clustered(IndexDef::new("PK", &["Part", "Id"], Uniqueness::PrimaryKey))
            .nonclustered(IndexDef::new("UQ_Code", unique_on, Uniqueness::UniqueIndex))
            .partitioned("Part", 4)
    };
    let error = db.create_table(table(&["Code"])).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("must be part of the key of unique index 'UQ_Code'"),
        "{error}"
    );
    let parts = db.create_table(table(&["Code", "Part"])).unwrap();
    let session = db.session();
    let row = |part: i32, id: i32, code: &str| {
        InsertRow::new()
            .set(0, Value::Int(part))
            .set(1, Value::Int(id))
            .set(2, Value::from(code))
    };
    parts.insert(&session, row(0, 1, "A")).unwrap();
    parts.insert(&session, row(1, 2, "A")).unwrap();
    assert!(matches!(
        parts.insert(&session, row(1, 3, "A")),
        Err(EngineError::DuplicateIndexKey { .. })
    ));
    assert_eq!(parts.row_count(), 2);
}

#[test]
fn a_batch_takes_a_block_of_identities_and_is_all_or_nothing() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("Batched")
                .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("Code", DataType::VarChar(10)).not_null())
                .clustered(IndexDef::new(
                    "PK_Batched",
                    &["InsertID"],
                    Uniqueness::PrimaryKey,
                ))
                .nonclustered(IndexDef::new(
                    "UQ_Code",
                    &["Code"],
                    Uniqueness::UniqueConstraint,
                )),
        )
        .unwrap();
    let session = db.session();
    let rows = (0..100)
        .map(|i| InsertRow::new().set(1, format!("c{i}")))
        .collect();
    let identities = table.insert_batch(&session, rows).unwrap();
    assert_eq!(identities, (1..=100).map(Some).collect::<Vec<_>>());
    // Row 50 of the next batch duplicates a code: nothing of that batch stays.
    let rows = (0..100)
        .map(|i| {
            InsertRow::new().set(
                1,
                if i == 50 {
                    "c7".to_owned()
                } else {
                    format!("d{i}")
                },
            )
        })
        .collect();
    let error = table.insert_batch(&session, rows).unwrap_err();
    assert!(matches!(error, EngineError::DuplicateKey { .. }), "{error}");
    // The batch keeps only the rows' records; the message's key comes from the failed one.
    assert!(
        error
            .to_string()
            .contains("'UQ_Code'. Cannot insert duplicate key in object 'Batched'. The duplicate key value is (c7)."),
        "{error}"
    );
    assert_eq!(table.row_count(), 100);
    table.check_integrity().unwrap();
    // A duplicate inside one batch is caught too.
    let rows = vec![InsertRow::new().set(1, "x"), InsertRow::new().set(1, "x")];
    assert!(table.insert_batch(&session, rows).is_err());
    assert_eq!(table.row_count(), 100);
}

#[test]
fn index_options_switch_at_run_time_without_a_rebuild() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let options = IndexOptions {
        optimize_for_sequential_key: true,
        insert_path: InsertPath::Classic,
        ..IndexOptions::default()
    };
    let table = db
        .create_table(
            TableDef::new("HotSpotTable")
                .column(ColumnDef::new("HotSpotID", DataType::Int).identity(1, 1))
                .column(ColumnDef::new("ver", DataType::TinyInt))
                .clustered(
                    IndexDef::new("PK_HotSpot", &["HotSpotID"], Uniqueness::PrimaryKey)
                        .with_options(options),
                ),
        )
        .unwrap();
    let insert_some = || {
        std::thread::scope(|scope| {
            for _ in 0..16 {
                scope.spawn(|| {
                    let session = db.session();
                    for _ in 0..300 {
                        table.insert(&session, InsertRow::new().set(1, 1)).unwrap();
                    }
                });
            }
        });
    };
    insert_some();
    assert!(
        table.clustered_trees()[0]
            .options()
            .optimize_for_sequential_key
    );
    let session = db.session();
    table
        .set_optimize_for_sequential_key(&session, "PK_HotSpot", false)
        .unwrap();
    table
        .set_insert_path(&session, "pk_hotspot", InsertPath::Default)
        .unwrap();
    insert_some();
    let options = table.clustered_trees()[0].options();
    assert!(!options.optimize_for_sequential_key);
    assert_eq!(options.insert_path, InsertPath::Default);
    assert_eq!(table.row_count(), 2 * 16 * 300);
    table.check_integrity().unwrap();
    assert!(matches!(
        table.set_insert_path(&session, "nope", InsertPath::Classic),
        Err(EngineError::UnknownIndex { .. })
    ));
    // A heap has no index to alter (SQL Server's ALTER INDEX needs one).
    let heap = db
        .create_table(TableDef::new("Heap").column(ColumnDef::new("ver", DataType::TinyInt)))
        .unwrap();
    let heap_index = heap.trees().next().unwrap().0.to_owned();
    assert!(matches!(
        heap.set_optimize_for_sequential_key(&session, &heap_index, true),
        Err(EngineError::InvalidDefinition { .. })
    ));
}

/// The mod-16 and partition-16 remedies in a durable database: the table's stored expression
/// survives checkpoints, crashes and the replay of its rows, and every row's `ModValue` is
/// `ABS(InsertID % 16)` before and after. Before, a durable database refused the table (its
/// computed column was a function, which the catalog cannot store).
#[test]
fn the_mod_16_remedy_works_in_a_durable_database_across_crashes() {
    let mut fs = lastpage_io::FaultyFileSystem::new(lastpage_io::FaultyConfig::new(21));
    let mut expected = 0u64;
    for cycle in 0..3 {
        let db = common::open(&fs);
        let table = if cycle == 0 {
            partitioned_table(&db)
        } else {
            db.table("InsertContention_Part").unwrap()
        };
        assert_eq!(table.partition_count(), 16);
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (table, db) = (&table, &db);
                scope.spawn(move || {
                    let session = db.session();
                    for i in 0..150 {
                        let row = InsertRow::new().set(1, format!("c{cycle}-t{thread}-{i}"));
                        table.insert(&session, row).unwrap();
                    }
                });
            }
        });
        expected += 600;
        if cycle == 1 {
            db.checkpoint().unwrap();
        }
        let rows = common::rows(&table, &db.session());
        assert_eq!(rows.len() as u64, expected, "cycle {cycle}");
        for row in &rows {
            let (Value::Int(id), Value::TinyInt(modulo)) = (&row[0], &row[2]) else {
                panic!("cycle {cycle}: row {row:?}");
            };
            assert_eq!(
                i64::from(*modulo),
                (i64::from(*id) % 16).abs(),
                "row {row:?}"
            );
        }
        db.check_integrity().unwrap();
        fs = common::crash(&fs, lastpage_io::CrashMode::LoseUnsynced, db, table, ());
    }
    let db = common::open(&fs);
    assert_eq!(
        db.table("InsertContention_Part").unwrap().row_count(),
        expected
    );
}

/// A stored expression fails a statement as T-SQL does: a zero divisor with "Divide by zero
/// error encountered." (error 8134), `ABS` of the smallest bigint with an arithmetic overflow
/// (error 8115); a NULL operand gives NULL. The statement leaves nothing behind.
#[test]
fn a_stored_expression_fails_a_statement_like_t_sql() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Id", DataType::BigInt).not_null())
                .column(ColumnDef::new("Divisor", DataType::BigInt))
                .column(
                    ColumnDef::new("Computed", DataType::BigInt).computed_expression(Expr::Abs(
                        Box::new(Expr::Modulo(
                            Box::new(Expr::column("Id")),
                            Box::new(Expr::column("Divisor")),
                        )),
                    )),
                )
                .column(
                    ColumnDef::new("AbsDivisor", DataType::BigInt)
                        .computed_expression(Expr::column("Divisor").abs()),
                )
                .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let insert = |id: i64, divisor: Option<i64>| {
        let row = InsertRow::new().set(0, id);
        let row = match divisor {
            Some(divisor) => row.set(1, divisor),
            None => row,
        };
        table.insert(&session, row)
    };
    let error = insert(1, Some(0)).unwrap_err();
    assert_eq!(error.to_string(), "Divide by zero error encountered.");
    let error = insert(1, Some(i64::MIN)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "Arithmetic overflow error converting expression to data type bigint."
    );
    insert(i64::MIN, Some(-1)).unwrap();
    insert(-7, Some(4)).unwrap();
    insert(5, None).unwrap();
    let rows = common::rows(&table, &session);
    let computed: Vec<(i64, Value, Value)> = rows
        .iter()
        .map(|row| {
            (
                common::bigint(&row[0]).unwrap(),
                row[2].clone(),
                row[3].clone(),
            )
        })
        .collect();
    assert_eq!(
        computed,
        vec![
            (i64::MIN, Value::BigInt(0), Value::BigInt(1)),
            (-7, Value::BigInt(3), Value::BigInt(4)),
            (5, Value::Null, Value::Null),
        ]
    );
}

/// A stored expression reads its columns' values as the row stores them, converted to the
/// columns' types, as T-SQL computes a persisted column from the row it stores: text, a
/// decimal or money value given for an integer column counts as the integer the column keeps,
/// on an insert and on an update. Before, the expression read the value as supplied, found no
/// integer in it and stored NULL beside a row whose `Id` was -7.
#[test]
fn a_stored_expression_reads_its_columns_converted_to_their_types() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Key", DataType::Int).not_null())
                .column(ColumnDef::new("Id", DataType::Int))
                .column(
                    ColumnDef::new("ModValue", DataType::Int)
                        .computed_expression(Expr::column("Id").modulo(4).abs()),
                )
                .clustered(IndexDef::new("PK_T", &["Key"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let supplied = [
        Value::String(" -7 ".into()),
        Value::Decimal(lastpage_engine::types::Decimal::new(-75, 1).unwrap()),
        Value::Money(-70_000),
    ];
    for (key, value) in supplied.iter().enumerate() {
        table
            .insert(
                &session,
                InsertRow::new().set(0, key as i32).set(1, value.clone()),
            )
            .unwrap();
    }
    for row in common::rows(&table, &session) {
        assert_eq!(row[1], Value::Int(-7), "row {row:?}");
        assert_eq!(row[2], Value::Int(3), "row {row:?}: the computed column");
    }
    // An update of the column the expression reads recomputes it from the converted value.
    assert!(
        table
            .update(
                &session,
                &[Value::Int(0)],
                &[(1, Value::String("10".into()))]
            )
            .unwrap()
    );
    let row = common::rows(&table, &session).remove(0);
    assert_eq!(row[1..], [Value::Int(10), Value::Int(2)], "row {row:?}");
}

/// `ABS` returns an `int` for an `int`, `smallint` or `tinyint` operand and a `bigint` for a
/// `bigint` one, as in T-SQL, and fails with an arithmetic overflow (error 8115) when the
/// result does not fit that type: `ABS` of the smallest `int` fails even into a `bigint`
/// column, while `ABS` of the smallest `smallint` is 32768 and a `%` of integers always fits.
/// Before, every operand was a `bigint`, so the smallest `int` stored 2147483648.
#[test]
fn abs_overflows_in_the_type_of_its_operand_like_t_sql() {
    let db = Database::create(DatabaseOptions::default()).unwrap();
    let table = db
        .create_table(
            TableDef::new("T")
                .column(ColumnDef::new("Key", DataType::Int).not_null())
                .column(ColumnDef::new("Small", DataType::SmallInt))
                .column(ColumnDef::new("Id", DataType::Int))
                .column(
                    ColumnDef::new("AbsSmall", DataType::BigInt)
                        .computed_expression(Expr::column("Small").abs()),
                )
                .column(
                    ColumnDef::new("AbsMod", DataType::BigInt)
                        .computed_expression(Expr::column("Id").modulo(-1).abs()),
                )
                .column(
                    ColumnDef::new("AbsId", DataType::BigInt)
                        .computed_expression(Expr::column("Id").abs()),
                )
                .clustered(IndexDef::new("PK_T", &["Key"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    let error = table
        .insert(
            &session,
            InsertRow::new().set(0, 1).set(1, 5i16).set(2, i32::MIN),
        )
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Arithmetic overflow error converting expression to data type int."
    );
    assert_eq!(table.row_count(), 0);
    table
        .insert(
            &session,
            InsertRow::new()
                .set(0, 2)
                .set(1, i16::MIN)
                .set(2, i32::MIN + 1),
        )
        .unwrap();
    let rows = common::rows(&table, &session);
    assert_eq!(
        rows[0][3..],
        [
            Value::BigInt(32768),
            Value::BigInt(0),
            Value::BigInt(i64::from(i32::MAX))
        ]
    );
}
