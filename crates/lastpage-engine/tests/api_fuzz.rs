//! A randomized test of the embedded API with hostile and unusual input: table definitions with
//! every type at its edges, values of the wrong types, out-of-range numbers, huge and empty
//! strings, keys of the wrong arity, reversed ranges, options on unknown indexes, tables used
//! after their drop and sessions used after their database's close, in memory and durable over
//! the fault-injecting file system (reopened after the run). Every call runs inside
//! `catch_unwind`: the rule is that nothing reachable from the API panics, so any panic fails
//! the test, and so does an `Ok` insert whose row does not read back as it was stored.

use std::ops::Bound;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use lastpage_engine::types::{Date, DateTime2, Decimal, Uuid};
use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, DefaultValue, Direction, IndexDef,
    IndexOptions, InsertPath, InsertRow, KeyRange, Session, Table, TableDef, Uniqueness, Value,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};
use rand::Rng;
use rand::rngs::StdRng;

mod common;

use common::{DIR, cases, options, seeded_rng};

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// A length for a type whose longest is `max`: mostly a valid one, at its edges.
fn length(rng: &mut StdRng, max: u16) -> u16 {
    if rng.random_bool(0.9) {
        *pick(rng, &[1, 1, 2, 10, 10, 50, max - 1, max, 4000.min(max)])
    } else {
        *pick(rng, &[0, max + 1, 4001, 8001, u16::MAX])
    }
}

fn data_type(rng: &mut StdRng) -> DataType {
    match rng.random_range(0..15) {
        0 => DataType::TinyInt,
        1 => DataType::SmallInt,
        2 => DataType::Int,
        3 => DataType::BigInt,
        4 => DataType::Bit,
        5 => {
            let precision: u8 = if rng.random_bool(0.9) {
                *pick(rng, &[1, 2, 3, 4, 5, 9, 10, 18, 19, 28, 37, 38])
            } else {
                *pick(rng, &[0, 39, 255])
            };
            let scale = if rng.random_bool(0.9) {
                *pick(rng, &[0, 1, precision / 2, precision])
            } else {
                *pick(rng, &[precision.saturating_add(1), 255])
            };
            DataType::Decimal { precision, scale }
        }
        6 => DataType::Money,
        7 => DataType::Char(length(rng, 8000)),
        8 => DataType::VarChar(length(rng, 8000)),
        9 => DataType::NChar(length(rng, 4000)),
        10 => DataType::NVarChar(length(rng, 4000)),
        11 => DataType::DateTime2(*pick(rng, &[0, 0, 1, 3, 6, 7, 7, 7, 8])),
        12 => DataType::Date,
        13 => DataType::UniqueIdentifier,
        _ => DataType::VarBinary(length(rng, 8000)),
    }
}

fn name(rng: &mut StdRng, i: usize) -> String {
    match rng.random_range(0..12) {
        0 => String::new(),
        1 => "c".repeat(rng.random_range(100..300)),
        2 => format!("C{}", i % 3),
        3 => format!("c{}", i % 3),
        4 => "Straße".to_owned(),
        5 => "STRASSE".to_owned(),
        6 => "straße".to_owned(),
        7 => "é".to_owned(),
        8 => "e\u{301}".to_owned(),
        9 => " ".to_owned(),
        10 => "\0".to_owned(),
        _ => format!("col{i}"),
    }
}

fn decimal(rng: &mut StdRng) -> Decimal {
    let random = rng.random::<i64>() as i128;
    let mantissa = *pick(
        rng,
        &[
            0i128,
            1,
            -1,
            10i128.pow(38) - 1,
            -(10i128.pow(38) - 1),
            10i128.pow(18),
            i64::MAX as i128,
            i64::MIN as i128,
            random,
        ],
    );
    let scale = *pick(rng, &[0u8, 1, 2, 10, 37, 38]);
    Decimal::new(mantissa, scale).unwrap_or_else(|_| Decimal::new(0, 0).unwrap())
}

fn date(rng: &mut StdRng) -> Date {
    let random = Date::from_days(rng.random_range(0..3_652_059)).unwrap();
    *pick(rng, &[Date::MIN, Date::MAX, random])
}

fn value(rng: &mut StdRng) -> Value {
    match rng.random_range(0..22) {
        0 | 1 => Value::Null,
        2 => Value::TinyInt(*pick(rng, &[0, 1, 255])),
        3 => Value::SmallInt(*pick(rng, &[i16::MIN, -1, 0, 1, i16::MAX])),
        4 => Value::Int(*pick(rng, &[i32::MIN, -1, 0, 1, 255, 256, i32::MAX])),
        5 | 6 => {
            let random = rng.random();
            Value::BigInt(*pick(
                rng,
                &[
                    i64::MIN,
                    i64::MIN + 1,
                    -1,
                    0,
                    1,
                    i64::MAX - 1,
                    i64::MAX,
                    random,
                ],
            ))
        }
        7 => Value::Bit(rng.random()),
        8 | 9 => Value::Decimal(decimal(rng)),
        10 => Value::Money(*pick(rng, &[i64::MIN, -1, 0, i64::MAX])),
        11..=14 => {
            let len = *pick(rng, &[0usize, 1, 2, 7999, 8000, 8001, 4000, 4001, 20_000]);
            let unit = *pick(
                rng,
                &["a", "é", "😀", " ", "\0", "1", "-1.5", "2024-01-01", "x"],
            );
            let mut text = unit.repeat(len.div_ceil(unit.len().max(1)).min(len.max(1)));
            if rng.random_bool(0.3) {
                text = pick(
                    rng,
                    &[
                        "12",
                        " 12 ",
                        "1e5",
                        "99999999999999999999999999999999999999999",
                        "2024-02-30",
                        "9999-12-31 23:59:59.99999999",
                        "0001-01-01",
                        "6F9619FF-8B86-D011-B42D-00C04FC964FF",
                        "",
                        "  ",
                        "nan",
                        "-0",
                    ],
                )
                .to_string();
            }
            Value::String(text)
        }
        15 | 16 => {
            let len = *pick(rng, &[0usize, 1, 16, 8000, 8001, 20_000]);
            Value::Binary(vec![rng.random(); len])
        }
        17 => Value::Date(date(rng)),
        18 | 19 => {
            let random = rng.random_range(0..864_000_000_000);
            let ticks = *pick(rng, &[0u64, 1, 863_999_999_999, random]);
            Value::DateTime2(DateTime2::new(date(rng), ticks).unwrap())
        }
        _ => Value::Uuid(Uuid::from_bytes(rng.random())),
    }
}

/// A value of the kind `data_type` holds, mostly at the edges of its range (and sometimes just
/// past them), or now and then any value at all.
fn value_for(rng: &mut StdRng, data_type: DataType) -> Value {
    if rng.random_bool(0.2) {
        return value(rng);
    }
    fn text(rng: &mut StdRng, units: usize) -> String {
        let unit = *pick(rng, &["a", "é", "😀", " ", "Z", "\u{ffff}"]);
        let mut text = String::new();
        while text.len() + unit.len() <= units && text.encode_utf16().count() < units {
            text.push_str(unit);
        }
        if rng.random_bool(0.3) {
            text.push(' ');
        }
        text
    }
    match data_type {
        DataType::TinyInt
        | DataType::SmallInt
        | DataType::Int
        | DataType::BigInt
        | DataType::Bit => {
            let edges = [
                0i64,
                1,
                -1,
                255,
                256,
                32767,
                -32768,
                32768,
                i32::MAX as i64,
                i32::MIN as i64,
                i32::MAX as i64 + 1,
                i64::MAX,
                i64::MIN,
            ];
            Value::BigInt(*pick(rng, &edges))
        }
        DataType::Decimal { precision, scale } => {
            let digits = u32::from(precision.min(38));
            let max = 10i128.pow(digits) - 1;
            let mantissa = *pick(rng, &[0, 1, -1, max, -max, max / 7]);
            Value::Decimal(Decimal::new(mantissa, scale.min(38)).unwrap_or_else(|_| decimal(rng)))
        }
        DataType::Money => Value::Money(*pick(rng, &[i64::MIN, -1, 0, 1, i64::MAX])),
        DataType::Char(n) | DataType::VarChar(n) => {
            let units = *pick(rng, &[0, 1, usize::from(n), usize::from(n) + 1]);
            Value::String(text(rng, units))
        }
        DataType::NChar(n) | DataType::NVarChar(n) => {
            let units = *pick(rng, &[0, 1, usize::from(n), usize::from(n) + 1]);
            Value::String(text(rng, units))
        }
        DataType::VarBinary(n) => {
            let len = *pick(rng, &[0, 1, usize::from(n), usize::from(n) + 1]);
            let byte = *pick(rng, &[0u8, 0xff, 0x7f]);
            Value::Binary(vec![byte; len])
        }
        DataType::DateTime2(_) => {
            let ticks = *pick(rng, &[0u64, 1, 863_999_999_999, 863_999_999_995]);
            let date = date(rng);
            Value::DateTime2(DateTime2::new(date, ticks).unwrap())
        }
        DataType::Date => Value::Date(date(rng)),
        DataType::UniqueIdentifier => {
            let random = rng.random();
            let bytes = *pick(rng, &[[0u8; 16], [0xff; 16], random]);
            Value::Uuid(Uuid::from_bytes(bytes))
        }
    }
}

fn index(rng: &mut StdRng, columns: &[ColumnDef], i: usize) -> IndexDef {
    let count = *pick(rng, &[0usize, 1, 1, 1, 2, 2, 3, 17, 40]);
    let mut names: Vec<String> = (0..count)
        .map(|_| {
            if columns.is_empty() || rng.random_bool(0.02) {
                "nope".to_owned()
            } else {
                let column = &pick(rng, columns).name;
                if rng.random_bool(0.2) {
                    column.to_uppercase()
                } else {
                    column.clone()
                }
            }
        })
        .collect();
    if rng.random_bool(0.1) {
        names.dedup();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let uniqueness = *pick(
        rng,
        &[
            Uniqueness::NonUnique,
            Uniqueness::PrimaryKey,
            Uniqueness::UniqueConstraint,
            Uniqueness::UniqueIndex,
        ],
    );
    let mut index = IndexDef::new(
        if rng.random_bool(0.1) {
            name(rng, i)
        } else {
            format!("IX{i}")
        },
        &refs,
        uniqueness,
    );
    if rng.random_bool(0.3) {
        index = index.with_options(IndexOptions {
            insert_path: *pick(rng, &[InsertPath::Classic, InsertPath::default()]),
            optimize_for_sequential_key: rng.random(),
            ..IndexOptions::default()
        });
    }
    index
}

fn table_def(rng: &mut StdRng, durable: bool) -> TableDef {
    let count = *pick(rng, &[0usize, 1, 2, 2, 3, 3, 4, 4, 6, 10, 40, 300, 1025]);
    let mut def = TableDef::new(if rng.random_bool(0.1) {
        name(rng, 0)
    } else {
        format!("T{}", rng.random_range(0..6))
    });
    if rng.random_bool(0.2) {
        def = def.not_logged();
    }
    let mut has_identity = false;
    for i in 0..count {
        let many = count > 10;
        let data_type = if many && rng.random_bool(0.8) {
            DataType::Int
        } else {
            data_type(rng)
        };
        let mut column = ColumnDef::new(
            if many || rng.random_bool(0.7) {
                format!("col{i}")
            } else {
                name(rng, i)
            },
            data_type,
        );
        if rng.random_bool(0.3) {
            column = column.not_null();
        }
        if (!has_identity || rng.random_bool(0.05))
            && rng.random_bool(0.3)
            && (data_type.fixed_size().is_some_and(|s| s <= 8) || rng.random_bool(0.1))
        {
            has_identity = true;
            let extremes = [
                i64::MIN,
                i64::MIN + 1,
                -1,
                1,
                i64::MAX - 1,
                i64::MAX,
                255,
                32767,
            ];
            let seed = *pick(rng, &extremes);
            let increment = if rng.random_bool(0.5) {
                1
            } else if rng.random_bool(0.05) {
                0
            } else {
                *pick(rng, &extremes)
            };
            column = column.identity(seed, increment);
        }
        if rng.random_bool(0.1) {
            let mut constant = value(rng);
            if rng.random_bool(0.7) {
                constant = data_type.coerce(constant).unwrap_or(Value::Null);
            }
            column = column.default_value(DefaultValue::Constant(constant));
        }
        if rng.random_bool(0.05) {
            column = column.default_value(if rng.random() {
                DefaultValue::NewId
            } else {
                DefaultValue::CurrentUtcDateTime
            });
        }
        if !durable && rng.random_bool(0.05) {
            let fixed = value(rng);
            column = column.computed(Arc::new(move |_row: &[Value]| Ok(fixed.clone())));
        }
        def = def.column(column);
    }
    if rng.random_bool(0.8) {
        let clustered = index(rng, &def.columns, 0);
        def = def.clustered(clustered);
    }
    for i in 0..*pick(rng, &[0usize, 0, 1, 2, 3, 20]) {
        let ix = index(rng, &def.columns, i + 1);
        def = def.nonclustered(ix);
    }
    if rng.random_bool(0.15) {
        let column = if def.columns.is_empty() || rng.random_bool(0.1) {
            "nope".to_owned()
        } else {
            pick(rng, &def.columns).name.clone()
        };
        def = def.partitioned(column, *pick(rng, &[0u16, 1, 2, 16, 1000, u16::MAX]));
    }
    def
}

fn key(rng: &mut StdRng, table: &Table) -> Vec<Value> {
    let arity = *pick(rng, &[0usize, 1, 2, 3, 5, table.columns().len()]);
    let columns = table.columns();
    (0..arity)
        .map(|i| {
            if columns.is_empty() || rng.random_bool(0.3) {
                value(rng)
            } else {
                let column = if rng.random_bool(0.5) {
                    i % columns.len()
                } else {
                    rng.random_range(0..columns.len())
                };
                value_for(rng, columns[column].data_type)
            }
        })
        .collect()
}

fn bound(rng: &mut StdRng, table: &Table) -> Bound<Vec<Value>> {
    match rng.random_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(key(rng, table)),
        _ => Bound::Excluded(key(rng, table)),
    }
}

fn row(rng: &mut StdRng, table: &Table) -> InsertRow {
    let columns = table.columns().len();
    let mut row = InsertRow::new();
    for _ in 0..rng.random_range(0..columns + 3) {
        let column = if rng.random_bool(0.05) {
            columns + 7
        } else {
            rng.random_range(0..columns.max(1))
        };
        let value = match table.columns().get(column) {
            Some(definition) => value_for(rng, definition.data_type),
            None => value(rng),
        };
        row = row.set(column, value);
    }
    row
}

/// Reads back every row of `table` and checks the table, without panicking.
fn read_all(session: &Session, table: &Table) -> Option<Vec<Vec<Value>>> {
    let iter = table
        .scan(session, &KeyRange::all(), Direction::Forward)
        .ok()?;
    let rows: Vec<Vec<Value>> = iter.filter_map(|row| row.ok()).collect();
    Some(rows)
}

/// One random operation on `table`.
fn operate(rng: &mut StdRng, db: &Database, session: &Session, table: &Arc<Table>) {
    match rng.random_range(0..16) {
        0..=3 => {
            let row = row(rng, table);
            let _ = table.insert(session, row);
        }
        4 => {
            let rows = (0..rng.random_range(0..20))
                .map(|_| row(rng, table))
                .collect();
            let _ = table.insert_batch(session, rows);
        }
        5 => {
            let columns: Vec<usize> = (0..rng.random_range(0..4))
                .map(|_| rng.random_range(0..table.columns().len() + 2))
                .collect();
            let rows: Vec<Vec<Value>> = (0..rng.random_range(0..5))
                .map(|_| {
                    (0..columns.len() + usize::from(rng.random_bool(0.1)))
                        .map(|_| value(rng))
                        .collect()
                })
                .collect();
            let _ = table.insert_batch_values(session, &columns, rows.iter().map(Vec::as_slice));
            if let Ok(prepared) = table.prepare_insert(&columns) {
                for values in &rows {
                    let _ = prepared.insert(session, values);
                }
            }
        }
        6 => {
            let _ = table.get(session, &key(rng, table));
        }
        7 => {
            let range = KeyRange {
                lower: bound(rng, table),
                upper: bound(rng, table),
            };
            let direction = *pick(rng, &[Direction::Forward, Direction::Backward]);
            if let Ok(iter) = table.scan(session, &range, direction) {
                for _ in iter.take(50) {}
            }
        }
        8 => {
            let changes: Vec<(usize, Value)> = (0..rng.random_range(0..4))
                .map(|_| (rng.random_range(0..table.columns().len() + 2), value(rng)))
                .collect();
            let key = match read_all(session, table) {
                Some(rows) if !rows.is_empty() && rng.random_bool(0.7) => {
                    // A real row's key, by the clustered columns when the table has them.
                    let row = pick(rng, &rows).clone();
                    row.into_iter().take(rng.random_range(0..4)).collect()
                }
                _ => key(rng, table),
            };
            let _ = table.update(session, &key, &changes);
        }
        9 => {
            let _ = table.delete(session, &key(rng, table));
        }
        10 => {
            let names = ["nope", "", "IX0", "IX1", "ix1", "IX2"];
            let index = pick(rng, &names);
            let _ = table.set_insert_path(
                session,
                index,
                *pick(rng, &[InsertPath::Classic, InsertPath::default()]),
            );
            let _ = table.set_optimize_for_sequential_key(session, index, rng.random());
            let _ = table.get_by_index(session, index, &key(rng, table));
        }
        11 => {
            let _ = match rng.random_range(0..4) {
                0 => session.begin(),
                1 => session.commit(),
                2 => session.rollback(),
                _ => session.commit_pipelined().map(|ticket| drop(ticket.wait())),
            };
        }
        12 => {
            let _ = table.check_integrity();
            let _ = table.column_index(&name(rng, 0));
            let _ = table.insert_named(session, &[(name(rng, 1).as_str(), value(rng))]);
        }
        13 => {
            if db.is_durable() && rng.random_bool(0.3) {
                let _ = db.checkpoint();
            }
        }
        14 => {
            // An insert whose row must read back as it was stored.
            check_round_trip(rng, session, table);
        }
        _ => {
            let _ = db.create_table(table_def(rng, db.is_durable()));
        }
    }
}

/// Inserts a row of values its columns hold and checks that `get` by its clustered key (when
/// that key is unique) reads the same values back.
fn check_round_trip(rng: &mut StdRng, session: &Session, table: &Arc<Table>) {
    let columns = table.columns();
    let mut row = InsertRow::new();
    let mut expected: Vec<Option<Value>> = vec![None; columns.len()];
    for (i, column) in columns.iter().enumerate() {
        if column.identity.is_some() || column.computed.is_some() {
            continue;
        }
        let candidate = value_for(rng, column.data_type);
        if let Ok(converted) = column.data_type.coerce(candidate.clone()) {
            expected[i] = Some(converted);
            row = row.set(i, candidate);
        }
    }
    if table.insert(session, row).is_err() {
        return;
    }
    let Some(rows) = read_all(session, table) else {
        return;
    };
    let found = rows.iter().any(|stored| {
        expected
            .iter()
            .zip(stored)
            .all(|(want, got)| want.as_ref().is_none_or(|want| want == got))
    });
    assert!(
        found,
        "an inserted row did not read back: {expected:?} not in {} rows",
        rows.len()
    );
}

fn run_case(rng: &mut StdRng, durable: bool) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(rng.random()));
    let open = || {
        if durable {
            Database::open(DIR, options(&fs))
        } else {
            Database::create(DatabaseOptions::default())
        }
    };
    let db = open().unwrap();
    let session = db.session();
    let mut tables = Vec::new();
    for _ in 0..rng.random_range(1..4) {
        let def = table_def(rng, durable);
        match db.create_table(def) {
            Ok(table) => tables.push(table),
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
    if tables.is_empty() {
        return;
    }
    for _ in 0..rng.random_range(10..120) {
        let table = pick(rng, &tables).clone();
        operate(rng, &db, &session, &table);
    }
    if rng.random_bool(0.3) {
        let _ = session.rollback();
        let dropped = pick(rng, &tables).clone();
        let _ = db.drop_table(dropped.name());
        for _ in 0..5 {
            operate(rng, &db, &session, &dropped);
        }
    }
    let _ = session.rollback();
    let before: Vec<Option<Vec<Vec<Value>>>> = tables
        .iter()
        .map(|table| read_all(&session, table))
        .collect();
    let kept = db.clone();
    let other = db.session();
    let closed = db.close();
    // Everything after the close must fail cleanly.
    for _ in 0..5 {
        let table = pick(rng, &tables).clone();
        operate(rng, &kept, &other, &table);
    }
    drop((session, other, kept));
    // The names of the tables that were not dropped, and every handle let go of, so that the
    // database can be opened again.
    let names: Vec<Option<String>> = tables
        .iter()
        .map(|table| (!table.is_dropped()).then(|| table.name().to_owned()))
        .collect();
    drop(tables);
    if durable && closed.is_ok() {
        let db = open().unwrap();
        let session = db.session();
        for (name, before) in names.iter().zip(before) {
            let Some(name) = name else { continue };
            let Ok(reopened) = db.table(name) else {
                continue;
            };
            let after = read_all(&session, &reopened);
            assert_eq!(before, after, "table {name} changed across a clean close");
            reopened.check_integrity().unwrap();
        }
    }
}

#[test]
fn hostile_input_through_the_api_never_panics() {
    let (seed, mut rng) = seeded_rng();
    let started = std::time::Instant::now();
    for case in 0..cases(100_000) {
        let durable = case % 3 == 2;
        let case_seed: u64 = rng.random();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(case_seed);
            run_case(&mut rng, durable);
        }));
        if outcome.is_err() {
            panic!("case {case} (seed {seed}, case seed {case_seed}, durable {durable}) panicked");
        }
        // About four seconds by default (in debug), and that times `LASTPAGE_TEST_CASES`.
        if started.elapsed().as_secs() >= 4 * cases(1) as u64 {
            break;
        }
    }
}
