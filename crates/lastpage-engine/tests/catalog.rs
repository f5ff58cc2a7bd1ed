//! Tests of the catalog blob: round trips, refusal of closures, and corrupt input.
//!
//! The randomized test prints its seed; rerun a failure with `LASTPAGE_SEED=<seed>` (the
//! encoding tests' `LASTPAGE_TEST_SEED` works too). The number of cases scales with
//! `LASTPAGE_TEST_CASES` (default 1).

use std::sync::Arc;

use lastpage_engine::catalog::{
    CATALOG_FORMAT_VERSION, CATALOG_MAGIC, Catalog, CatalogEntry, DroppedTree, IndexTrees,
    check_persistable,
};
use lastpage_engine::types::{Date, DateTime2, Decimal, TICKS_PER_DAY, Uuid};
use lastpage_engine::{
    ColumnDef, DataType, DefaultValue, EngineError, IndexDef, IndexOptions, InsertPath,
    LatchPolicy, TableDef, Uniqueness, Value,
};
use rand::Rng;

mod common;

use common::{cases, random_type, seeded_rng};

/// Bytes before the body in the blob: magic, version, body length.
const HEADER_LEN: usize = 16;

/// `TableDef` holds closures and so has no `PartialEq`; its `Debug` shows every stored field
/// (a computed column shows as a flag), which is exactly what a round trip must preserve.
fn repr(catalog: &Catalog) -> String {
    format!("{catalog:#?}")
}

/// Trees for `indexes` indexes of `partitions` partitions each, with ids taken from `next_id`.
fn trees(indexes: usize, partitions: usize, next_id: &mut u32) -> Vec<IndexTrees> {
    (0..indexes)
        .map(|index| {
            let mut trees = IndexTrees::default();
            for partition in 0..partitions {
                trees.index_id_per_partition.push(*next_id);
                *next_id += 1;
                trees
                    .root_per_partition
                    .push(1000 + (index * 100 + partition) as u32);
                trees
                    .rows_per_partition
                    .push((partition as u64) << 40 | index as u64);
                // Every other tree has two spare leaves, numbered by its (unique) index id.
                let index_id = *trees.index_id_per_partition.last().unwrap();
                trees.spare_leaves_per_partition.push(if index_id % 2 == 0 {
                    vec![100_000 + 2 * index_id, 100_001 + 2 * index_id]
                } else {
                    Vec::new()
                });
            }
            trees
        })
        .collect()
}

/// A catalog with every data type, every default that can be stored, identity, unique and
/// non-unique indexes, index options, a heap and a partitioned table.
fn rich_catalog() -> Catalog {
    let mut next_index_id = 1;
    let orders = TableDef::new("Orders")
        .column(ColumnDef::new("Id", DataType::BigInt).identity(-5, 3))
        .column(
            ColumnDef::new("Tiny", DataType::TinyInt)
                .default_value(DefaultValue::Constant(Value::TinyInt(7))),
        )
        .column(ColumnDef::new("Small", DataType::SmallInt).not_null())
        .column(
            ColumnDef::new("Int", DataType::Int)
                .default_value(DefaultValue::Constant(Value::Int(-42))),
        )
        .column(
            ColumnDef::new("Flag", DataType::Bit)
                .default_value(DefaultValue::Constant(Value::Bit(true))),
        )
        .column(
            ColumnDef::new(
                "Price",
                DataType::Decimal {
                    precision: 38,
                    scale: 6,
                },
            )
            .default_value(DefaultValue::Constant(Value::Decimal(
                Decimal::new(-12_345_678, 6).unwrap(),
            ))),
        )
        .column(
            ColumnDef::new("Cost", DataType::Money)
                .default_value(DefaultValue::Constant(Value::Money(12_5000))),
        )
        .column(
            ColumnDef::new("Code", DataType::Char(5))
                .default_value(DefaultValue::Constant(Value::from("ab   "))),
        )
        .column(ColumnDef::new("Customer", DataType::VarChar(8000)).not_null())
        .column(ColumnDef::new("Wide", DataType::NChar(4000)))
        .column(
            ColumnDef::new("Note", DataType::NVarChar(10))
                .default_value(DefaultValue::Constant(Value::from("héllo 𝄞"))),
        )
        .column(
            ColumnDef::new("Created", DataType::DateTime2(7))
                .default_value(DefaultValue::CurrentUtcDateTime),
        )
        .column(
            ColumnDef::new("Due", DataType::DateTime2(0)).default_value(DefaultValue::Constant(
                Value::DateTime2(
                    DateTime2::new(Date::from_ymd(2024, 2, 29).unwrap(), 12 * 3600 * 10_000_000)
                        .unwrap(),
                ),
            )),
        )
        .column(
            ColumnDef::new("Day", DataType::Date).default_value(DefaultValue::Constant(
                Value::Date(Date::from_ymd(1, 1, 1).unwrap()),
            )),
        )
        .column(
            ColumnDef::new("Guid", DataType::UniqueIdentifier)
                .not_null()
                .default_value(DefaultValue::NewId),
        )
        .column(
            ColumnDef::new("Blob", DataType::VarBinary(16))
                .default_value(DefaultValue::Constant(Value::Binary(vec![0, 1, 0xff]))),
        )
        .column(
            ColumnDef::new("Nothing", DataType::Int)
                .default_value(DefaultValue::Constant(Value::Null)),
        )
        .clustered(
            IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey).with_options(
                IndexOptions {
                    latch_policy: LatchPolicy::Fifo,
                    insert_path: InsertPath::Classic,
                    optimize_for_sequential_key: true,
                },
            ),
        )
        .nonclustered(IndexDef::new(
            "UQ_Orders_Guid",
            &["Guid"],
            Uniqueness::UniqueConstraint,
        ))
        .nonclustered(IndexDef::new(
            "IX_Orders_Customer",
            &["Customer", "Day"],
            Uniqueness::NonUnique,
        ))
        .nonclustered(
            IndexDef::new("UX_Orders_Code", &["Code"], Uniqueness::UniqueIndex).with_options(
                IndexOptions {
                    latch_policy: LatchPolicy::Adaptive,
                    insert_path: InsertPath::Default,
                    optimize_for_sequential_key: true,
                },
            ),
        );
    let orders_trees = trees(4, 1, &mut next_index_id);

    let heap = TableDef::new("Heap").column(ColumnDef::new("x", DataType::VarChar(1)));
    let heap_trees = trees(1, 1, &mut next_index_id);

    let partitioned = TableDef::new("Events")
        .column(ColumnDef::new("InsertID", DataType::Int).identity(1, 1))
        .column(ColumnDef::new("Part", DataType::TinyInt).not_null())
        .column(ColumnDef::new("Payload", DataType::VarBinary(8000)))
        .clustered(IndexDef::new(
            "CX_Events",
            &["Part", "InsertID"],
            Uniqueness::NonUnique,
        ))
        .nonclustered(IndexDef::new(
            "IX_Events_Id",
            &["InsertID"],
            Uniqueness::NonUnique,
        ))
        .partitioned("Part", 16);
    let partitioned_trees = trees(2, 16, &mut next_index_id);
    // Trees of dropped tables still in use when the catalog was written.
    let dropped_trees = (0..3)
        .map(|index| {
            next_index_id += 1;
            DroppedTree {
                index_id: next_index_id - 1,
                root: 5_000 + index,
                spare_leaves: (0..index).map(|spare| 6_000 + 10 * index + spare).collect(),
            }
        })
        .collect();

    Catalog {
        format_version: CATALOG_FORMAT_VERSION,
        next_table_id: 10,
        next_index_id,
        next_txn_id: u64::MAX,
        checkpoint_lsn: 0x0123_4567_89ab_cdef,
        oldest_active_lsn: 0x0123_4567_0000_0000,
        clean_shutdown: true,
        tables: vec![
            CatalogEntry {
                table_id: 1,
                definition: orders,
                index_trees: orders_trees,
                next_identity: Some(i64::MIN),
                uniquifier_blocks: None,
            },
            CatalogEntry {
                table_id: 5,
                definition: heap,
                index_trees: heap_trees,
                next_identity: None,
                uniquifier_blocks: Some(u64::MAX),
            },
            CatalogEntry {
                table_id: 9,
                definition: partitioned,
                index_trees: partitioned_trees,
                next_identity: Some(1_000_001),
                uniquifier_blocks: Some(17),
            },
        ],
        dropped_trees,
    }
}

fn expect_corrupt(result: Result<Catalog, EngineError>, what: &str) {
    match result {
        Err(EngineError::CorruptCatalog(_)) => {}
        Err(other) => panic!("{what}: expected a corrupt-catalog error, got {other:?}"),
        Ok(_) => panic!("{what}: decoded"),
    }
}

/// Writes a fresh body length and CRC over `blob`'s header and body (`blob` without its old
/// CRC), so a test can reach the parser behind the checksum.
fn reseal(mut blob: Vec<u8>) -> Vec<u8> {
    let body_len = (blob.len() - HEADER_LEN) as u32;
    blob[12..16].copy_from_slice(&body_len.to_le_bytes());
    let crc = crc32c::crc32c(&blob);
    blob.extend_from_slice(&crc.to_le_bytes());
    blob
}

fn unsealed(blob: &[u8]) -> Vec<u8> {
    blob[..blob.len() - 4].to_vec()
}

#[test]
fn rich_catalog_round_trips() {
    let catalog = rich_catalog();
    let bytes = catalog.encode().unwrap();
    assert_eq!(bytes[..8], CATALOG_MAGIC);
    let decoded = Catalog::decode(&bytes).unwrap();
    assert_eq!(repr(&decoded), repr(&catalog));
    // The encoding is deterministic, so a decoded catalog encodes to the same bytes.
    assert_eq!(decoded.encode().unwrap(), bytes);
}

/// Decodes `tests/fixtures/catalog-v<version>.bin`, `rich_catalog()` as the build that wrote
/// that format version encoded it, checking that it is of that version.
fn decode_fixture(version: u32) -> Catalog {
    let path = format!(
        "{}/tests/fixtures/catalog-v{version}.bin",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
    assert_eq!(bytes[8..12], version.to_le_bytes(), "{path}");
    let decoded = Catalog::decode(&bytes).unwrap_or_else(|error| panic!("{path}: {error}"));
    assert_eq!(decoded.format_version, version, "{path}");
    decoded
}

/// The first spare leaf of the first table of `catalog`.
fn first_spare_leaf(catalog: &Catalog) -> u32 {
    catalog.tables[0]
        .index_trees
        .iter()
        .flat_map(|trees| trees.spare_leaves_per_partition.iter().flatten())
        .copied()
        .next()
        .expect("the first table has a spare leaf")
}

/// `catalog` as a version 2 catalog decodes: without dropped trees (which took the last index
/// ids) and uniquifier blocks.
fn as_version_2(mut catalog: Catalog) -> Catalog {
    catalog.format_version = 2;
    catalog.next_index_id -= catalog.dropped_trees.len() as u32;
    catalog.dropped_trees.clear();
    for entry in &mut catalog.tables {
        entry.uniquifier_blocks = None;
    }
    catalog
}

/// A catalog written by the build before dropped trees were recorded (format version 2):
/// `rich_catalog()` as that build encoded it (without dropped trees), kept as a file. It must
/// still decode, to the same catalog with no dropped trees, so that a database written then
/// still opens.
#[test]
fn a_version_2_catalog_still_decodes_with_no_dropped_trees() {
    let decoded = decode_fixture(2);
    assert!(decoded.dropped_trees.is_empty());
    assert_eq!(repr(&decoded), repr(&as_version_2(rich_catalog())));
}

/// A catalog written by the build before spare leaves were recorded (format version 1):
/// `rich_catalog()` as that build encoded it, kept as a file. It must still decode, to the same
/// catalog with no spare leaves, so that a database written then still opens.
#[test]
fn a_version_1_catalog_still_decodes_with_no_spare_leaves() {
    let decoded = decode_fixture(1);
    let mut expected = as_version_2(rich_catalog());
    expected.format_version = 1;
    for trees in expected.tables.iter_mut().flat_map(|t| &mut t.index_trees) {
        for spare_leaves in &mut trees.spare_leaves_per_partition {
            spare_leaves.clear();
        }
    }
    assert!(
        decoded
            .tables
            .iter()
            .flat_map(|t| &t.index_trees)
            .all(|trees| {
                trees.spare_leaves_per_partition.len() == trees.root_per_partition.len()
                    && trees.spare_leaves_per_partition.iter().all(Vec::is_empty)
            })
    );
    assert_eq!(repr(&decoded), repr(&expected));
}

#[test]
fn empty_catalog_round_trips() {
    let catalog = Catalog::default();
    let bytes = catalog.encode().unwrap();
    assert_eq!(repr(&Catalog::decode(&bytes).unwrap()), repr(&catalog));
}

#[test]
fn constant_defaults_are_stored_in_the_column_type() {
    // Inserts convert a default to its column's type, so the catalog stores it converted.
    let mut catalog = Catalog::default();
    let mut next_index_id = 1;
    catalog.tables.push(CatalogEntry {
        table_id: 1,
        definition: TableDef::new("t")
            .column(
                ColumnDef::new("a", DataType::BigInt)
                    .default_value(DefaultValue::Constant(Value::TinyInt(3))),
            )
            .column(
                ColumnDef::new("b", DataType::Char(3))
                    .default_value(DefaultValue::Constant(Value::from("x"))),
            ),
        index_trees: trees(1, 1, &mut next_index_id),
        next_identity: None,
        uniquifier_blocks: Some(0),
    });
    catalog.next_table_id = 2;
    catalog.next_index_id = next_index_id;
    let decoded = Catalog::decode(&catalog.encode().unwrap()).unwrap();
    let columns = &decoded.tables[0].definition.columns;
    assert_eq!(
        format!("{:?}", columns[0].default),
        "Some(Constant(BigInt(3)))"
    );
    assert_eq!(
        format!("{:?}", columns[1].default),
        r#"Some(Constant(String("x  ")))"#
    );
}

#[test]
fn closures_are_refused_with_a_clear_message() {
    let computed = TableDef::new("t")
        .column(ColumnDef::new("a", DataType::Int))
        .column(
            ColumnDef::new("c", DataType::Int)
                .computed(Arc::new(|row: &[Value]| Ok(row[0].clone()))),
        );
    let error = check_persistable(&computed).unwrap_err();
    assert_eq!(
        error.to_string(),
        "table 't' cannot be stored in a durable database: column 'c' is computed by a function; \
         a function cannot be stored (a computed column can be, as an expression: \
         ColumnDef::computed_expression; a default, once the SQL layer can store its text)"
    );
    assert!(matches!(
        &error,
        EngineError::NotPersistable { table, column, .. } if table == "t" && column == "c"
    ));

    let function = TableDef::new("u").column(
        ColumnDef::new("d", DataType::Int)
            .default_value(DefaultValue::Function(Arc::new(|| Ok(Value::Int(1))))),
    );
    assert_eq!(
        check_persistable(&function).unwrap_err().to_string(),
        "table 'u' cannot be stored in a durable database: column 'd' has a function default; \
         a function cannot be stored (a computed column can be, as an expression: \
         ColumnDef::computed_expression; a default, once the SQL layer can store its text)"
    );

    // Encoding a catalog holding such a table fails with the same error.
    for (def, message) in [(computed, error.to_string()), (function, String::new())] {
        let mut catalog = Catalog::default();
        let mut next_index_id = 1;
        catalog.tables.push(CatalogEntry {
            table_id: 1,
            definition: def.clone(),
            index_trees: trees(1, 1, &mut next_index_id),
            next_identity: None,
            uniquifier_blocks: Some(0),
        });
        catalog.next_table_id = 2;
        catalog.next_index_id = next_index_id;
        let error = catalog.encode().unwrap_err();
        assert!(
            matches!(error, EngineError::NotPersistable { .. }),
            "{error:?}"
        );
        if !message.is_empty() {
            assert_eq!(error.to_string(), message);
        }
    }

    // A plain table passes, and so does the rich catalog's every table.
    for entry in rich_catalog().tables {
        check_persistable(&entry.definition).unwrap();
    }
}

#[test]
fn defaults_that_do_not_fit_their_column_are_refused() {
    let def = TableDef::new("t").column(
        ColumnDef::new("a", DataType::TinyInt)
            .default_value(DefaultValue::Constant(Value::Int(300))),
    );
    let error = check_persistable(&def).unwrap_err();
    assert!(
        matches!(error, EngineError::NotPersistable { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("does not convert to tinyint"),
        "{error}"
    );
}

/// A change that makes a catalog inconsistent.
type Spoil = Box<dyn Fn(&mut Catalog)>;

#[test]
fn inconsistent_catalogs_are_not_encoded() {
    let cases: Vec<(&str, Spoil)> = vec![
        (
            "missing trees",
            Box::new(|c| {
                c.tables[0].index_trees.pop();
            }),
        ),
        (
            "partition count",
            Box::new(|c| {
                c.tables[2].index_trees[1].root_per_partition.pop();
            }),
        ),
        (
            "identity value",
            Box::new(|c| c.tables[1].next_identity = Some(1)),
        ),
        (
            "missing identity value",
            Box::new(|c| c.tables[0].next_identity = None),
        ),
        ("duplicate table id", Box::new(|c| c.tables[1].table_id = 1)),
        (
            "duplicate table name",
            Box::new(|c| c.tables[1].definition.name = "ORDERS".into()),
        ),
        ("table id counter", Box::new(|c| c.next_table_id = 9)),
        ("index id counter", Box::new(|c| c.next_index_id -= 1)),
        (
            "duplicate index id",
            Box::new(|c| c.tables[1].index_trees[0].index_id_per_partition[0] = 1),
        ),
        (
            "invalid type",
            Box::new(|c| c.tables[1].definition.columns[0].data_type = DataType::VarChar(0)),
        ),
        ("version", Box::new(|c| c.format_version = 4)),
        ("old version", Box::new(|c| c.format_version = 1)),
        ("version 2", Box::new(|c| c.format_version = 2)),
        (
            "uniquifier blocks of a table with a unique clustered index",
            Box::new(|c| c.tables[0].uniquifier_blocks = Some(1)),
        ),
        (
            "a heap without uniquifier blocks",
            Box::new(|c| c.tables[1].uniquifier_blocks = None),
        ),
        (
            "dropped tree's index id counter",
            Box::new(|c| c.dropped_trees[0].index_id = c.next_index_id),
        ),
        (
            "dropped tree whose root is a table's",
            Box::new(|c| {
                c.dropped_trees[0].root = c.tables[0].index_trees[0].root_per_partition[0]
            }),
        ),
        (
            "two dropped trees with one root",
            Box::new(|c| c.dropped_trees[2].root = c.dropped_trees[1].root),
        ),
        (
            "dropped tree whose root is a spare leaf",
            Box::new(|c| c.dropped_trees[0].root = c.dropped_trees[2].spare_leaves[0]),
        ),
        (
            "dropped tree's spare leaf that is a table's",
            Box::new(|c| {
                let spare = first_spare_leaf(c);
                c.dropped_trees[1].spare_leaves.push(spare);
            }),
        ),
        (
            "spare leaf lists",
            Box::new(|c| {
                c.tables[1].index_trees[0]
                    .spare_leaves_per_partition
                    .clear()
            }),
        ),
        (
            "duplicate spare leaf",
            Box::new(|c| {
                let spare = first_spare_leaf(c);
                c.tables[1].index_trees[0].spare_leaves_per_partition[0].push(spare);
            }),
        ),
        (
            "spare leaf that is a root",
            Box::new(|c| {
                let root = c.tables[1].index_trees[0].root_per_partition[0];
                c.tables[0].index_trees[0].spare_leaves_per_partition[0].push(root);
            }),
        ),
    ];
    for (what, spoil) in cases {
        let mut catalog = rich_catalog();
        spoil(&mut catalog);
        match catalog.encode() {
            Err(EngineError::InvalidCatalog(_)) => {}
            other => panic!("{what}: expected InvalidCatalog, got {other:?}"),
        }
    }
}

#[test]
fn specific_corruptions_are_reported() {
    let bytes = rich_catalog().encode().unwrap();

    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    let error = Catalog::decode(&bad_magic).unwrap_err();
    assert!(error.to_string().contains("magic"), "{error}");

    let mut bad_crc = bytes.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 1;
    let error = Catalog::decode(&bad_crc).unwrap_err();
    assert!(error.to_string().contains("checksum"), "{error}");

    let mut future = unsealed(&bytes);
    future[8..12].copy_from_slice(&4u32.to_le_bytes());
    let error = Catalog::decode(&reseal(future)).unwrap_err();
    assert!(error.to_string().contains("version 4"), "{error}");

    let mut trailing = unsealed(&bytes);
    trailing.push(0);
    let error = Catalog::decode(&reseal(trailing)).unwrap_err();
    assert!(
        error.to_string().contains("follow the last table"),
        "{error}"
    );

    // A table count far beyond what the bytes could hold is refused before anything is
    // reserved for it.
    let mut huge = unsealed(&bytes);
    huge[HEADER_LEN + 33..HEADER_LEN + 37].copy_from_slice(&u32::MAX.to_le_bytes());
    let error = Catalog::decode(&reseal(huge)).unwrap_err();
    assert!(error.to_string().contains("does not fit"), "{error}");

    // The first column's type tag of the first table sits after the counters and the clean-shutdown flag (33 bytes), the
    // table count (4), the table id (4), the name "Orders" (4 + 6), the column count (4) and
    // the column name "Id" (4 + 2).
    let tag_at = HEADER_LEN + 33 + 4 + 4 + 10 + 4 + 6;
    let mut unknown_type = unsealed(&bytes);
    assert_eq!(unknown_type[tag_at], 4, "the tag of bigint");
    unknown_type[tag_at] = 99;
    let error = Catalog::decode(&reseal(unknown_type)).unwrap_err();
    assert!(
        error.to_string().contains("unknown data type tag 99"),
        "{error}"
    );
}

#[test]
fn every_single_byte_corruption_is_an_error() {
    let bytes = rich_catalog().encode().unwrap();
    for position in 0..bytes.len() {
        for flip in 1..=u8::MAX {
            let mut corrupt = bytes.clone();
            corrupt[position] ^= flip;
            expect_corrupt(
                Catalog::decode(&corrupt),
                &format!("byte {position} ^ {flip:#x}"),
            );
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = rich_catalog().encode().unwrap();
    for len in 0..bytes.len() {
        expect_corrupt(
            Catalog::decode(&bytes[..len]),
            &format!("truncated to {len} bytes"),
        );
    }
    // With the checksum and length made to match, every truncated body still fails: the
    // parser itself notices the missing bytes.
    let body = unsealed(&bytes);
    for len in HEADER_LEN..body.len() {
        expect_corrupt(
            Catalog::decode(&reseal(body[..len].to_vec())),
            &format!("body truncated to {len} bytes and resealed"),
        );
    }
}

#[test]
fn corruptions_behind_a_valid_checksum_never_panic() {
    // Past the checksum the parser sees arbitrary bytes. It must return an error, or decode a
    // catalog that encodes back to exactly those bytes (so it accepted a valid blob).
    let body = unsealed(&rich_catalog().encode().unwrap());
    for position in HEADER_LEN..body.len() {
        for value in 0..=u8::MAX {
            if body[position] == value {
                continue;
            }
            let mut mutated = body.clone();
            mutated[position] = value;
            let blob = reseal(mutated);
            match Catalog::decode(&blob) {
                Err(EngineError::CorruptCatalog(_)) => {}
                Err(other) => panic!("byte {position} = {value:#x}: unexpected error {other:?}"),
                Ok(catalog) => assert!(
                    catalog.encode().unwrap() == blob,
                    "byte {position} = {value:#x} decoded to a catalog that encodes differently"
                ),
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Randomized round trips
// ------------------------------------------------------------------------------------------

fn pick<T: Clone>(rng: &mut impl Rng, items: &[T]) -> T {
    items[rng.random_range(0..items.len())].clone()
}

/// A length for a text or binary type: mostly short, sometimes the type's largest.
fn length(rng: &mut impl Rng, max: u16) -> u16 {
    if rng.random_bool(0.2) {
        max
    } else {
        rng.random_range(1..=40)
    }
}

/// A random constant of `ty`, already in the form the column type gives it (so the round trip
/// compares equal), or `NULL`.
fn random_value(rng: &mut impl Rng, ty: DataType) -> Value {
    if rng.random_bool(0.1) {
        return Value::Null;
    }
    let value = match ty {
        DataType::TinyInt => Value::TinyInt(rng.random()),
        DataType::SmallInt => Value::SmallInt(rng.random()),
        DataType::Int => Value::Int(rng.random()),
        DataType::BigInt => Value::BigInt(rng.random()),
        DataType::Bit => Value::Bit(rng.random()),
        DataType::Money => Value::Money(rng.random()),
        DataType::Decimal { precision, scale } => {
            let max = 10i128.pow(u32::from(precision)) - 1;
            Value::Decimal(Decimal::new(rng.random_range(-max..=max), scale).unwrap())
        }
        DataType::Char(n) | DataType::VarChar(n) | DataType::NChar(n) | DataType::NVarChar(n) => {
            let mut s = String::new();
            for _ in 0..rng.random_range(0..=usize::from(n).min(12)) {
                s.push(pick(rng, &[' ', 'a', 'Z', '\0', 'é', '€', '𝄞']));
            }
            // Cut back to the column's length in bytes (a safe bound for nchar too).
            while s.len() > usize::from(n) {
                s.pop();
            }
            Value::String(s)
        }
        DataType::VarBinary(n) => {
            let len = rng.random_range(0..=usize::from(n).min(12));
            Value::Binary((0..len).map(|_| rng.random()).collect())
        }
        DataType::Date => Value::Date(
            Date::from_days(rng.random_range(Date::MIN.days()..=Date::MAX.days())).unwrap(),
        ),
        DataType::DateTime2(_) => {
            let date =
                Date::from_days(rng.random_range(Date::MIN.days()..Date::MAX.days())).unwrap();
            Value::DateTime2(DateTime2::new(date, rng.random_range(0..TICKS_PER_DAY)).unwrap())
        }
        DataType::UniqueIdentifier => Value::Uuid(Uuid::from_bytes(rng.random())),
    };
    ty.coerce(value)
        .expect("generated constants fit their types")
}

fn random_name(rng: &mut impl Rng, prefix: &str, taken: &[String]) -> String {
    loop {
        let suffix: String = (0..rng.random_range(0..6))
            .map(|_| pick(rng, &['a', 'b', '_', '1', 'é', '表', ' ']))
            .collect();
        let name = format!("{prefix}{suffix}");
        if !taken.iter().any(|other| other.eq_ignore_ascii_case(&name)) {
            return name;
        }
    }
}

fn random_index(rng: &mut impl Rng, def: &TableDef, name: String) -> IndexDef {
    let columns: Vec<String> = (0..rng.random_range(1..=3))
        .map(|_| pick(rng, &def.columns).name)
        .collect();
    IndexDef {
        name,
        columns,
        uniqueness: pick(
            rng,
            &[
                Uniqueness::NonUnique,
                Uniqueness::PrimaryKey,
                Uniqueness::UniqueConstraint,
                Uniqueness::UniqueIndex,
            ],
        ),
        options: IndexOptions {
            latch_policy: pick(rng, &LatchPolicy::ALL),
            insert_path: pick(rng, &InsertPath::ALL),
            optimize_for_sequential_key: rng.random(),
        },
    }
}

fn random_entry(
    rng: &mut impl Rng,
    table_id: u32,
    name: String,
    next_index_id: &mut u32,
) -> CatalogEntry {
    let mut def = TableDef::new(name);
    let identity_at = rng.random_bool(0.5).then(|| rng.random_range(0..6));
    let column_count = rng.random_range(1..=6);
    let mut names = Vec::new();
    for position in 0..column_count {
        let name = random_name(rng, "c", &names);
        names.push(name.clone());
        let column = if identity_at == Some(position) {
            let ty = pick(
                rng,
                &[
                    DataType::TinyInt,
                    DataType::SmallInt,
                    DataType::Int,
                    DataType::BigInt,
                ],
            );
            let increment = pick(rng, &[1, -1, 7, i64::MIN, i64::MAX]);
            ColumnDef::new(name, ty).identity(rng.random(), increment)
        } else {
            let ty = random_type(rng, |rng, max| length(rng, max));
            let mut column = ColumnDef::new(name, ty);
            column.nullable = rng.random();
            column.default = match rng.random_range(0..5) {
                0 => Some(DefaultValue::CurrentUtcDateTime),
                1 => Some(DefaultValue::NewId),
                2 | 3 => Some(DefaultValue::Constant(random_value(rng, ty))),
                _ => None,
            };
            column
        };
        def.columns.push(column);
    }
    let mut index_names = Vec::new();
    if rng.random_bool(0.7) {
        let name = random_name(rng, "PK", &index_names);
        index_names.push(name.clone());
        def.clustered = Some(random_index(rng, &def, name));
    }
    for _ in 0..rng.random_range(0..=3) {
        let name = random_name(rng, "IX", &index_names);
        index_names.push(name.clone());
        let index = random_index(rng, &def, name);
        def.nonclustered.push(index);
    }
    let partitions = if rng.random_bool(0.3) {
        let count = pick(rng, &[1u16, 2, 16, 1024]);
        def.partition = Some(lastpage_engine::PartitionDef {
            column: pick(rng, &names),
            partitions: count,
        });
        usize::from(count)
    } else {
        1
    };
    let index_trees = (0..1 + def.nonclustered.len())
        .map(|_| {
            let mut trees = IndexTrees::default();
            for _ in 0..partitions {
                // Spare leaves numbered by the (unique) index id, so that none is named twice;
                // a random root may still be one of them, with odds of about one in 2^28.
                let spare_leaves = (0..rng.random_range(0..=3))
                    .map(|k| 0x8000_0000 + 4 * *next_index_id + k)
                    .collect();
                trees.index_id_per_partition.push(*next_index_id);
                *next_index_id += 1;
                trees
                    .root_per_partition
                    .push(rng.random_range(0..0x8000_0000));
                trees.rows_per_partition.push(rng.random());
                trees.spare_leaves_per_partition.push(spare_leaves);
            }
            trees
        })
        .collect();
    let next_identity = def
        .columns
        .iter()
        .any(|column| column.identity.is_some())
        .then(|| rng.random());
    let uniquifier_blocks = def
        .clustered
        .as_ref()
        .is_none_or(|index| !index.uniqueness.is_unique())
        .then(|| rng.random());
    CatalogEntry {
        table_id,
        definition: def,
        index_trees,
        next_identity,
        uniquifier_blocks,
    }
}

fn random_catalog(rng: &mut impl Rng) -> Catalog {
    let mut next_table_id = 1;
    let mut next_index_id = rng.random_range(1..1000);
    let mut names = Vec::new();
    let mut tables = Vec::new();
    for _ in 0..rng.random_range(0..=4) {
        let name = random_name(rng, "t", &names);
        names.push(name.clone());
        next_table_id += rng.random_range(1..5);
        tables.push(random_entry(
            rng,
            next_table_id - 1,
            name,
            &mut next_index_id,
        ));
    }
    let dropped_trees = (0..rng.random_range(0..3))
        .map(|index| {
            next_index_id += 1;
            DroppedTree {
                index_id: next_index_id - 1,
                root: 1_000_000 + index,
                spare_leaves: (0..rng.random_range(0..3))
                    .map(|spare| 2_000_000 + 10 * index + spare)
                    .collect(),
            }
        })
        .collect();
    Catalog {
        format_version: CATALOG_FORMAT_VERSION,
        next_table_id,
        next_index_id: next_index_id + rng.random_range(0..3),
        next_txn_id: rng.random(),
        checkpoint_lsn: rng.random(),
        oldest_active_lsn: rng.random(),
        clean_shutdown: rng.random(),
        tables,
        dropped_trees,
    }
}

#[test]
fn random_catalogs_round_trip() {
    let (_, mut rng) = seeded_rng();
    for case in 0..cases(300) {
        let catalog = random_catalog(&mut rng);
        let bytes = catalog
            .encode()
            .unwrap_or_else(|error| panic!("case {case}: {error}"));
        let decoded =
            Catalog::decode(&bytes).unwrap_or_else(|error| panic!("case {case}: {error}"));
        assert_eq!(repr(&decoded), repr(&catalog), "case {case}");
        assert_eq!(decoded.encode().unwrap(), bytes, "case {case}");
        // A cheap corruption check on every case: flip one random byte.
        if !bytes.is_empty() {
            let mut corrupt = bytes.clone();
            let position = rng.random_range(0..corrupt.len());
            corrupt[position] ^= rng.random_range(1..=255u8);
            expect_corrupt(
                Catalog::decode(&corrupt),
                &format!("case {case}, byte {position}"),
            );
        }
    }
}

/// A computed column's expression is stored and read back; one nested too deeply or reading a
/// column that is not there or not an integer is refused by the encoder, and a blob whose
/// expression nests too deeply is refused by the decoder without recursing through it.
/// A dropped tree may share its index id with a table's tree (the old tree of a table that is
/// not logged, emptied after a crash, whose new trees keep its index ids), but not its root.
#[test]
fn a_dropped_tree_may_share_a_tables_index_id_but_not_its_root() {
    let mut catalog = rich_catalog();
    catalog.dropped_trees[0].index_id = catalog.tables[1].index_trees[0].index_id_per_partition[0];
    let decoded = Catalog::decode(&catalog.encode().unwrap()).unwrap();
    assert_eq!(repr(&decoded), repr(&catalog));
}

#[test]
fn computed_expressions_round_trip_and_bad_ones_are_refused() {
    use lastpage_engine::Expr;
    let with = |expr: Expr| {
        let mut catalog = Catalog::default();
        let mut next_index_id = 1;
        catalog.tables.push(CatalogEntry {
            table_id: 1,
            definition: TableDef::new("t")
                .column(ColumnDef::new("Id", DataType::BigInt).identity(1, 1))
                .column(ColumnDef::new("Note", DataType::VarChar(10)))
                .column(
                    ColumnDef::new("ModValue", DataType::TinyInt)
                        .not_null()
                        .computed_expression(expr),
                ),
            index_trees: trees(1, 1, &mut next_index_id),
            next_identity: Some(1),
            uniquifier_blocks: Some(0),
        });
        catalog.next_table_id = 2;
        catalog.next_index_id = next_index_id;
        catalog
    };
    let expr = Expr::column("id").modulo(16).abs();
    let catalog = with(Expr::Modulo(
        Box::new(expr.clone()),
        Box::new(Expr::Integer(i64::MIN)),
    ));
    let decoded = Catalog::decode(&catalog.encode().unwrap()).unwrap();
    assert_eq!(repr(&decoded), repr(&catalog));
    assert!(
        repr(&decoded).contains("ABS(([id] % 16))"),
        "{}",
        repr(&decoded)
    );

    let deep = (0..40).fold(Expr::column("Id"), |expr, _| expr.abs());
    for (what, expr) in [
        ("too deep", deep.clone()),
        ("unknown column", Expr::column("Missing").modulo(2)),
        ("not an integer", Expr::column("Note").modulo(2)),
    ] {
        match with(expr).encode() {
            Err(EngineError::InvalidCatalog(reason)) => println!("{what}: {reason}"),
            other => panic!("{what}: expected InvalidCatalog, got {other:?}"),
        }
    }
    // The decoder meets a deep one in bytes: the same catalog with a shallow expression,
    // whose stored form is then replaced by a deep one's (`ABS` is tag 4, a column tag 1).
    let shallow = with(Expr::column("Id").abs()).encode().unwrap();
    let stored_shallow = [&[4u8, 1][..], &2u32.to_le_bytes(), b"Id"].concat();
    let at = unsealed(&shallow)
        .windows(stored_shallow.len())
        .position(|window| window == stored_shallow.as_slice())
        .expect("the stored expression");
    let mut blob = unsealed(&shallow);
    let stored_deep = [vec![4u8; 40], stored_shallow[1..].to_vec()].concat();
    blob.splice(at..at + stored_shallow.len(), stored_deep);
    let error = Catalog::decode(&reseal(blob)).unwrap_err();
    assert!(error.to_string().contains("nests more than"), "{error}");
}
