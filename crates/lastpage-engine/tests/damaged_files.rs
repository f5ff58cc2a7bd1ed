//! Opening a database whose files were damaged: bit flips, zeroed ranges, truncation, deleted
//! and renamed files, anywhere in the data file and the log. Whatever the damage, `Database::open`
//! and reading the table afterwards never panic: they fail with an error, or they succeed, and
//! then every row read back is one that was inserted, with its own contents (a page or a log
//! record read wrong would show as a row with the wrong payload).
//!
//! Randomized: prints its seed; rerun one with `LASTPAGE_SEED=<seed>`.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lastpage_engine::{
    ColumnDef, DataType, Database, DatabaseOptions, Direction, IndexDef, InsertRow, KeyRange,
    TableDef, Uniqueness, Value,
};
use lastpage_io::{CrashMode, FaultyConfig, FaultyFileSystem, FileSystem, OpenOptions};
use lastpage_storage::wal::WalConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/db";

/// Damaged copies opened per run.
const CASES: u64 = 1000;

/// The template's batches (one transaction each) and their rows.
const BATCHES: i64 = 60;
const BATCH_ROWS: i64 = 50;

fn options(fs: &FaultyFileSystem) -> DatabaseOptions {
    DatabaseOptions {
        file_system: Some(Arc::new(fs.clone())),
        wal: WalConfig {
            buffer_bytes: 1 << 20,
            segment_bytes: 64 << 10,
            ..WalConfig::default()
        },
        ..DatabaseOptions::default()
    }
}

/// The payload row `id` was inserted with.
fn payload(id: i64) -> String {
    format!("row-{id}-{}", "p".repeat((id % 37) as usize))
}

/// A crashed database: several log segments, a checkpoint that truncated the log, and log
/// after it. Returns the crashed file system.
fn template() -> FaultyFileSystem {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db
        .create_table(
            TableDef::new("Orders")
                .column(ColumnDef::new("Id", DataType::BigInt).not_null())
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey)),
        )
        .unwrap();
    let session = db.session();
    for batch in 0..BATCHES {
        let rows = (batch * BATCH_ROWS..(batch + 1) * BATCH_ROWS)
            .map(|id| InsertRow::new().set(0, id).set(1, payload(id)))
            .collect();
        table.insert_batch(&session, rows).unwrap();
        if batch == 30 {
            db.checkpoint().unwrap();
        }
    }
    let after = fs.crash_with(CrashMode::LoseUnsynced);
    drop((session, table, db));
    after
}

/// Every file of the database directory, the log's included.
fn files(fs: &FaultyFileSystem) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [PathBuf::from(DIR), Path::new(DIR).join("wal")] {
        for name in fs.list_dir(&dir).unwrap() {
            let path = dir.join(name);
            if fs.open(&path, OpenOptions::existing()).is_ok() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Damages one file of `fs` at random; returns what it did.
fn damage(fs: &FaultyFileSystem, rng: &mut StdRng) -> String {
    let files = files(fs);
    let path = &files[rng.random_range(0..files.len())];
    let file = fs.open(path, OpenOptions::existing()).unwrap();
    let len = file.len().unwrap();
    // Most damage goes where the structure is: the first pages of a file (meta slots, segment
    // headers, the first records).
    let offset = |rng: &mut StdRng| {
        if len == 0 {
            0
        } else if rng.random_bool(0.5) {
            rng.random_range(0..len.min(3 * 8192))
        } else {
            rng.random_range(0..len)
        }
    };
    let what = match rng.random_range(0..5) {
        0 => {
            let at = offset(rng);
            let mut byte = [0u8; 1];
            if len > 0 {
                file.read_exact_at(at, &mut byte).unwrap();
                file.write_all_at(at, &[byte[0] ^ (1 << rng.random_range(0..8))])
                    .unwrap();
            }
            format!("flipped a bit of byte {at}")
        }
        1 => {
            let at = offset(rng);
            let count = rng.random_range(1..=4096).min(len - at.min(len));
            file.write_all_at(at, &vec![0u8; count as usize]).unwrap();
            format!("zeroed {count} bytes at {at}")
        }
        2 => {
            let to = offset(rng);
            file.set_len(to).unwrap();
            format!("truncated to {to} bytes")
        }
        3 => {
            drop(file);
            fs.remove(path).unwrap();
            return format!("deleted {}", path.display());
        }
        _ => {
            // A file renamed to another segment's name (or to no LSN the writer makes).
            drop(file);
            let to = path.with_file_name(format!("{:016x}.wal", rng.random::<u64>() >> 40));
            fs.rename(path, &to).unwrap();
            return format!("renamed {} to {}", path.display(), to.display());
        }
    };
    file.sync_data().unwrap();
    format!("{what} of {}", path.display())
}

/// Opens the damaged copy and reads the table back, checking its integrity; `Err` if
/// anything refused to.
fn open_and_read(fs: &FaultyFileSystem) -> Result<Vec<Vec<Value>>, String> {
    let db = Database::open(DIR, options(fs)).map_err(|error| error.to_string())?;
    let table = db.table("Orders").map_err(|error| error.to_string())?;
    let session = db.session();
    let rows = table
        .scan(&session, &KeyRange::all(), Direction::Forward)
        .map_err(|error| error.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())?;
    db.check_integrity().map_err(|error| error.to_string())?;
    Ok(rows)
}

/// The rows as id -> payload; panics on a row of another shape.
fn by_id(rows: &[Vec<Value>], context: &str) -> BTreeMap<i64, String> {
    rows.iter()
        .map(|row| match row.as_slice() {
            [Value::BigInt(id), Value::String(text)] => (*id, text.clone()),
            other => panic!("{context}: a row of the wrong shape: {other:?}"),
        })
        .collect()
}

#[test]
fn damaged_files_never_panic_the_open_and_never_give_wrong_rows() {
    let seed = std::env::var("LASTPAGE_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed = {seed} (rerun with LASTPAGE_SEED={seed})");
    let crashed = template();
    let intact = open_and_read(&crashed.crash_with(CrashMode::LoseUnsynced)).unwrap();
    assert_eq!(by_id(&intact, "intact").len() as i64, BATCHES * BATCH_ROWS);
    let (mut refused, mut opened) = (0, 0);
    for case in 0..CASES {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(case));
        let copy = crashed.crash_with(CrashMode::LoseUnsynced);
        let what = damage(&copy, &mut rng);
        let outcome = catch_unwind(AssertUnwindSafe(|| open_and_read(&copy)));
        let context = format!("seed {seed}, case {case}: {what}");
        match outcome {
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default();
                panic!("{context}: the open or the read panicked: {message}");
            }
            Ok(Err(_)) => refused += 1,
            Ok(Ok(rows)) => {
                opened += 1;
                let rows = by_id(&rows, &context);
                for (id, text) in &rows {
                    assert_eq!(text, &payload(*id), "{context}: row {id} reads wrong");
                }
                // Damage that recovery cannot tell from a torn tail may cost the commits after
                // it, never one before it and never part of a batch: what is left is the
                // first n batches.
                let n = rows.len() as i64;
                assert!(
                    n % BATCH_ROWS == 0 && rows.keys().copied().eq(0..n),
                    "{context}: {n} rows that are not a prefix of whole batches"
                );
            }
        }
    }
    println!("{CASES} damaged copies: {refused} refused, {opened} opened with correct rows");
}

#[test]
fn a_foreign_file_where_the_data_file_goes_is_refused_and_left_as_it_was() {
    let data_file = Path::new(DIR).join("data.lp");
    let foreign = b"not a lastpage database, but someone's notes\n".as_slice();
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    fs.create_dir_all(Path::new(DIR)).unwrap();
    fs.open(&data_file, OpenOptions::create())
        .unwrap()
        .write_all_at(0, foreign)
        .unwrap();
    let error = Database::open(DIR, options(&fs))
        .err()
        .expect("a foreign data file is refused");
    assert!(
        error.to_string().contains("not a lastpage data file"),
        "unclear error: {error}"
    );
    let file = fs.open(&data_file, OpenOptions::existing()).unwrap();
    let mut kept = vec![0u8; 4096];
    let read = file.read_at(0, &mut kept).unwrap();
    assert_eq!(&kept[..read], foreign, "the foreign file was changed");

    // What a crash during the data file's creation leaves, an empty file, is no foreign file:
    // the database is created over it.
    let fs = FaultyFileSystem::new(FaultyConfig::new(2));
    fs.create_dir_all(Path::new(DIR)).unwrap();
    fs.open(&data_file, OpenOptions::create()).unwrap();
    let db = Database::open(DIR, options(&fs)).expect("an empty data file is initialised");
    assert!(db.table("Orders").is_err());
}
