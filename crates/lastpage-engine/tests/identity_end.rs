//! IDENTITY values at the end of their type's range: every value up to the end is handed out
//! to single-row inserts, however they take their values, before the overflow error.

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, EngineError, IndexDef, InsertRow, TableDef,
    Uniqueness,
};
use lastpage_io::{FaultyConfig, FaultyFileSystem};

mod common;

/// A BIGINT identity clustered on alone takes its values in sequence-lane blocks of up to a
/// page's worth of rows. Within a block's width of the end of BIGINT's range, a lane could not
/// reserve a whole block, and every single-row insert failed with an overflow although values
/// were left (a batch, which takes only as many values as it has rows, still got them).
#[test]
fn single_rows_take_every_bigint_identity_value_up_to_the_end() {
    for (increment, durable) in [(1i64, false), (7, false), (1, true)] {
        let seed = i64::MAX - 20 * increment;
        let db = if durable {
            common::open(&FaultyFileSystem::new(FaultyConfig::new(3)))
        } else {
            Database::create(DatabaseOptions::default()).unwrap()
        };
        let table = db
            .create_table(
                TableDef::new("T")
                    .column(ColumnDef::new("Id", DataType::BigInt).identity(seed, increment))
                    .column(ColumnDef::new("Payload", DataType::VarChar(10)))
                    .clustered(IndexDef::new("PK_T", &["Id"], Uniqueness::PrimaryKey)),
            )
            .unwrap();
        let session = db.session();
        let mut handed_out = Vec::new();
        let error = loop {
            match table.insert(&session, InsertRow::new().set(1, "x")) {
                Ok(id) => handed_out.push(id.unwrap()),
                Err(error) => break error,
            }
            assert!(
                handed_out.len() <= 20,
                "increment {increment}: {handed_out:?}"
            );
        };
        // The counter holds the next value, so the very last one of the range is not handed
        // out (see `IdentityState::take`): 20 values from the seed.
        let expected: Vec<i64> = (0..20).map(|n| seed + n * increment).collect();
        assert_eq!(handed_out, expected, "increment {increment}");
        assert_eq!(
            error,
            EngineError::IdentityOverflow {
                data_type: "bigint".into()
            },
            "increment {increment}"
        );
        assert_eq!(table.row_count(), 20);
        table.check_integrity().unwrap();
    }
}
