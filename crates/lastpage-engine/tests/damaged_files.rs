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
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

use common::{DIR, crash, seed};

/// Damaged copies opened per run.
const CASES: u64 = 1000;

/// The template's batches (one transaction each) and their rows.
const BATCHES: i64 = 60;
const BATCH_ROWS: i64 = 50;

/// The shared test options with 64 KiB log segments, so that the template's log spans many
/// segments and damage can hit any of them.
fn options(fs: &FaultyFileSystem) -> DatabaseOptions {
    let mut options = common::options(fs);
    options.wal.segment_bytes = 64 << 10;
    options
}

/// The payload row `id` was inserted with.
fn payload(id: i64) -> String {
    format!("row-{id}-{}", "p".repeat((id % 37) as usize))
}

/// The table every database here holds: a BIGINT key and a text payload.
fn orders() -> TableDef {
    TableDef::new("Orders")
        .column(ColumnDef::new("Id", DataType::BigInt).not_null())
        .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
        .clustered(IndexDef::new("PK_Orders", &["Id"], Uniqueness::PrimaryKey))
}

/// A crashed database: several log segments, a checkpoint that truncated the log, and log
/// after it. Returns the crashed file system.
fn template() -> FaultyFileSystem {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db.create_table(orders()).unwrap();
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
    crash(&fs, CrashMode::LoseUnsynced, db, (session, table), ())
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
    let seed = seed();
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

// ---------------------------------------------------------------------------------------------
// Hostile files: contents that pass every checksum (a file written by a buggy or malicious
// program), so that the decoders and the engine behind them are reached.
// ---------------------------------------------------------------------------------------------

const SLOT: usize = 8192;

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Rewrites the catalog of the data file's current image with `change` (applied to the
/// encoded catalog, whose checksum is then fixed), as a new stream at the file's end that the
/// current meta slot then names, every checksum fixed.
fn rewrite_catalog(fs: &FaultyFileSystem, change: impl FnOnce(&mut Vec<u8>)) {
    let path = Path::new(DIR).join("data.lp");
    let mut bytes = fs.contents(&path).unwrap();
    let meta_at = (0..2)
        .map(|slot| slot * SLOT)
        .filter(|&at| u32_at(&bytes, at + 12) == crc32c::crc32c(&bytes[at + 16..at + 64]))
        .max_by_key(|&at| u64_at(&bytes, at + 16))
        .unwrap();
    let (mut next, stream_len, blob_len) = (
        u32_at(&bytes, meta_at + 28) as usize,
        u64_at(&bytes, meta_at + 32) as usize,
        u64_at(&bytes, meta_at + 44) as usize,
    );
    let mut stream = Vec::new();
    while stream.len() < stream_len {
        let want = (stream_len - stream.len()).min(SLOT - 4);
        stream.extend_from_slice(&bytes[next * SLOT + 4..next * SLOT + 4 + want]);
        next = u32_at(&bytes, next * SLOT) as usize;
    }
    // The blob ends the stream, whatever comes before it (the page map, and the pages' latch
    // flavours from the data file's format version 2).
    let mut blob = stream.split_off(stream_len - blob_len);
    change(&mut blob);
    let body = blob.len() - 20;
    blob[12..16].copy_from_slice(&(body as u32).to_le_bytes());
    let covered = blob.len() - 4;
    let crc = crc32c::crc32c(&blob[..covered]);
    blob[covered..].copy_from_slice(&crc.to_le_bytes());
    stream.extend_from_slice(&blob);
    let head = bytes.len().div_ceil(SLOT);
    bytes.resize(head * SLOT, 0);
    let chunks: Vec<&[u8]> = stream.chunks(SLOT - 4).collect();
    for (index, chunk) in chunks.iter().enumerate() {
        let mut slot = vec![0u8; SLOT];
        let link = if index + 1 < chunks.len() {
            head + index + 1
        } else {
            0
        };
        slot[..4].copy_from_slice(&(link as u32).to_le_bytes());
        slot[4..4 + chunk.len()].copy_from_slice(chunk);
        bytes.extend_from_slice(&slot);
    }
    let meta = &mut bytes[meta_at..meta_at + 64];
    meta[28..32].copy_from_slice(&(head as u32).to_le_bytes());
    meta[32..40].copy_from_slice(&(stream.len() as u64).to_le_bytes());
    meta[40..44].copy_from_slice(&crc32c::crc32c(&stream).to_le_bytes());
    meta[44..52].copy_from_slice(&(blob.len() as u64).to_le_bytes());
    let crc = crc32c::crc32c(&meta[16..64]);
    meta[12..16].copy_from_slice(&crc.to_le_bytes());
    let file = fs.open(&path, OpenOptions::create().truncate()).unwrap();
    file.write_all_at(0, &bytes).unwrap();
    file.sync_data().unwrap();
}

/// An open database (file system seeded with `seed`) whose one table holds one committed row.
fn database_with_one_row(seed: u64) -> (FaultyFileSystem, Database) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(seed));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db.create_table(orders()).unwrap();
    table
        .insert(
            &db.session(),
            InsertRow::new().set(0, 1i64).set(1, payload(1)),
        )
        .unwrap();
    (fs, db)
}

/// A closed database with one small table.
fn small_database() -> FaultyFileSystem {
    let (fs, db) = database_with_one_row(3);
    db.close().unwrap();
    fs
}

/// Opens the database and inserts a row; `Err` if anything refused.
fn open_and_insert(fs: &FaultyFileSystem) -> Result<(), String> {
    let db = Database::open(DIR, options(fs)).map_err(|error| error.to_string())?;
    let table = db.table("Orders").map_err(|error| error.to_string())?;
    let session = db.session();
    table
        .insert(&session, InsertRow::new().set(0, 2i64).set(1, payload(2)))
        .map_err(|error| error.to_string())?;
    Ok(())
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_catalog_whose_next_transaction_id_is_at_the_end_of_the_range_is_refused() {
    let fs = small_database();
    // The catalog's next transaction id: after the 16-byte header and two u32 counters.
    rewrite_catalog(&fs, |blob| {
        blob[24..32].copy_from_slice(&(u64::MAX - 1).to_le_bytes())
    });
    match catch_unwind(AssertUnwindSafe(|| open_and_insert(&fs))) {
        Err(panic) => panic!("the open or the insert panicked: {}", panic_message(panic)),
        Ok(Ok(())) => panic!(
            "a catalog with transaction id {} was accepted",
            u64::MAX - 1
        ),
        Ok(Err(error)) => assert!(error.contains("transaction id"), "unclear error: {error}"),
    }
}

/// A catalog whose next transaction id is exactly at the limit opens (ids below it were all
/// the open refuses), but no transaction gets an id at or past it: the engine would write log
/// records that its next open refuses (found by a helper reviewing the limit).
#[test]
fn transaction_ids_stop_at_the_limit_the_open_refuses() {
    use lastpage_storage::limits::MAX_TXN_ID;
    let fs = small_database();
    rewrite_catalog(&fs, |blob| {
        blob[24..32].copy_from_slice(&MAX_TXN_ID.to_le_bytes())
    });
    let error = open_and_insert(&fs).expect_err("no id is left");
    assert!(error.contains("used up"), "unclear error: {error}");
    // Refused transactions leave the counter at the limit, so a clean close (which writes it
    // into the catalog) still leaves a database that opens.
    let db = Database::open(DIR, options(&fs)).expect("the database still opens");
    let table = db.table("Orders").unwrap();
    assert_eq!(table.row_count(), 1);
    for _ in 0..3 {
        let refused = table.insert(&db.session(), InsertRow::new().set(0, 3i64).set(1, "x"));
        assert!(refused.is_err());
    }
    drop(table);
    db.close().unwrap();
    let db = Database::open(DIR, options(&fs)).expect("the database opens after a clean close");
    assert_eq!(db.table("Orders").unwrap().row_count(), 1);
}

/// Rewrites the log's last record (in the first segment) of kind `kind` with `change`, applied
/// to the whole record, header included, and fixes its checksum.
fn rewrite_last_log_record(fs: &FaultyFileSystem, kind: u8, change: impl FnOnce(&mut [u8])) {
    use lastpage_storage::wal::{LogReader, Lsn, record::checksum_seed};
    let mut reader =
        LogReader::open(Arc::new(fs.clone()), Path::new(DIR).join("wal"), Lsn(0)).unwrap();
    let mut last = None;
    while let Some(raw) = reader.next_raw().unwrap() {
        if raw.kind == kind {
            last = Some(raw);
        }
    }
    let last = last.unwrap_or_else(|| panic!("the log holds no record of kind {kind}"));
    let segment = Path::new(DIR).join("wal").join(format!("{:016x}.wal", 0));
    let file = fs.open(&segment, OpenOptions::existing()).unwrap();
    let mut header = vec![0u8; 48];
    file.read_exact_at(0, &mut header).unwrap();
    let log_id = u64_at(&header, 40);
    let at = 4096 + last.lsn.0;
    let mut length = [0u8; 8];
    file.read_exact_at(at, &mut length).unwrap();
    let mut record = vec![0u8; u32_at(&length, 4) as usize];
    file.read_exact_at(at, &mut record).unwrap();
    change(&mut record);
    let crc = crc32c::crc32c_append(checksum_seed(log_id), &record[4..]);
    record[..4].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(at, &record).unwrap();
    file.sync_data().unwrap();
}

#[test]
fn a_log_record_of_a_transaction_id_at_the_end_of_the_range_is_refused() {
    // A crash, so that the log after the checkpoint is replayed; its last record is the commit
    // of the last insert.
    let (fs, db) = database_with_one_row(4);
    let fs = fs.crash_with(CrashMode::LoseUnsynced);
    drop(db);
    // Every record begins with its txn id in the payload.
    rewrite_last_log_record(&fs, 5, |record| {
        record[24..32].copy_from_slice(&u64::MAX.to_le_bytes())
    });
    match catch_unwind(AssertUnwindSafe(|| open_and_insert(&fs))) {
        Err(panic) => panic!("the open or the insert panicked: {}", panic_message(panic)),
        Ok(Ok(())) => panic!("a log record of transaction {} was accepted", u64::MAX),
        Ok(Err(error)) => assert!(error.contains("transaction"), "unclear error: {error}"),
    }
}

/// A heap row whose uniquifier lies in the last block of the range (checksums valid) uses up
/// its own heap's uniquifiers and nothing else. While uniquifiers were numbered for the whole
/// process, opening such a file left every heap and non-unique clustered index of every
/// database in the process unable to insert.
#[test]
fn a_heap_row_whose_uniquifier_ends_the_range_uses_up_only_its_own_heap() {
    let heap =
        |name: &str| TableDef::new(name).column(ColumnDef::new("V", DataType::Int).not_null());
    let row = || InsertRow::new().set(0, Value::Int(7));
    let fs = FaultyFileSystem::new(FaultyConfig::new(6));
    let db = Database::open(DIR, options(&fs)).unwrap();
    db.create_table(heap("Neighbour")).unwrap();
    let hostile = db.create_table(heap("Hostile")).unwrap();
    hostile.insert(&db.session(), row()).unwrap();
    drop(hostile);
    // A crash, so that the insert is replayed from the log.
    let fs = fs.crash_with(CrashMode::LoseUnsynced);
    drop(db);
    let hostile_value = u64::MAX - 5;
    // An `Insert` record's payload: txn (8 bytes), index id (4), the key's length (4) and the
    // key, which a heap's row is its uniquifier alone (8 bytes, big-endian).
    rewrite_last_log_record(&fs, 2, |record| {
        assert_eq!(u32_at(record, 36), 8, "a heap's key is its uniquifier");
        record[40..48].copy_from_slice(&hostile_value.to_be_bytes());
    });

    let db = Database::open(DIR, options(&fs)).unwrap();
    let session = db.session();
    let hostile = db.table("Hostile").unwrap();
    match hostile.insert(&session, row()) {
        Ok(_) => panic!("a uniquifier past {hostile_value} was handed out"),
        Err(error) => assert!(
            error.to_string().contains("used up"),
            "unclear error: {error}"
        ),
    }
    assert_eq!(hostile.row_count(), 1, "the hostile row reads back");
    db.table("Neighbour")
        .unwrap()
        .insert(&session, row())
        .expect("a neighbouring heap of the same database inserts");
    let other = Database::create(DatabaseOptions::default()).unwrap();
    other
        .create_table(heap("Heap"))
        .unwrap()
        .insert(&other.session(), row())
        .expect("a heap of another database in the process inserts");
    db.check_integrity().unwrap();
}

/// A catalog (checksums valid) that names a page of the tree, or one past the file, as a
/// spare leaf is refused at the open with an error that says so. A split would otherwise take
/// that page as a new, empty one and link it a second time, losing the rows on it.
#[test]
fn a_catalog_naming_a_page_in_use_as_a_spare_leaf_is_refused() {
    use lastpage_engine::catalog::Catalog;
    let fs = FaultyFileSystem::new(FaultyConfig::new(5));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db.create_table(orders()).unwrap();
    let session = db.session();
    for id in 1..=2_000i64 {
        table
            .insert(&session, InsertRow::new().set(0, id).set(1, payload(id)))
            .unwrap();
    }
    // Leaves the deletes of 500 to 900 empty are freed: free pages named as spare leaves. The
    // last leaf, which the deletes of 1700 on empty (it holds at most about 160 rows), stays
    // linked: empty, like a spare, but in use.
    for id in (500..=900i64).chain(1700..=2000) {
        assert!(table.delete(&session, &[Value::BigInt(id)]).unwrap());
    }
    let page_count = db.pool().page_count() as u32;
    drop((table, session));
    db.close().unwrap();
    assert!(
        page_count > 10,
        "the tree should have several pages, not {page_count}"
    );

    let mut original = None;
    rewrite_catalog(&fs, |blob| original = Some(Catalog::decode(blob).unwrap()));
    let original = original.unwrap();
    let trees = &original.tables[0].index_trees[0];
    let (root, spare_leaves) = (
        trees.root_per_partition[0],
        trees.spare_leaves_per_partition[0].clone(),
    );
    let with_spare_leaves = |spare_leaves: Vec<u32>| {
        let mut catalog = original.clone();
        catalog.tables[0].index_trees[0].spare_leaves_per_partition[0] = spare_leaves;
        let bytes = catalog.encode().unwrap();
        rewrite_catalog(&fs, |blob| *blob = bytes);
    };
    // Every page but the root (refused by the catalog's own check) and the real spare leaves
    // is in the tree; one more is past the file.
    let mut refused = 0;
    for page in (1..=page_count + 1).filter(|page| *page != root && !spare_leaves.contains(page)) {
        let mut named = spare_leaves.clone();
        named.push(page);
        with_spare_leaves(named);
        match catch_unwind(AssertUnwindSafe(|| Database::open(DIR, options(&fs)))) {
            Err(panic) => panic!("page {page}: the open panicked: {}", panic_message(panic)),
            Ok(Ok(_)) => panic!("page {page}, named as a spare leaf, was accepted"),
            Ok(Err(error)) => assert!(
                error.to_string().contains("spare leaf"),
                "page {page}: unclear error: {error}"
            ),
        }
        refused += 1;
    }
    assert_eq!(refused as usize, page_count as usize - spare_leaves.len());
    // The rewriting itself leaves a database that opens, with every row.
    with_spare_leaves(spare_leaves);
    let db = Database::open(DIR, options(&fs)).unwrap();
    assert_eq!(db.table("Orders").unwrap().row_count(), 1_298);
    db.check_integrity().unwrap();
}

#[test]
fn a_damaged_header_of_the_last_log_segment_fails_the_open_instead_of_losing_its_commits() {
    // A flipped bit in the last log segment's header made it look like a segment whose
    // creation a crash cut short: the open removed it, and with it the acknowledged batches
    // in it, and reported success.
    let fs = template();
    let wal = Path::new(DIR).join("wal");
    let mut segments: Vec<PathBuf> = fs
        .list_dir(&wal)
        .unwrap()
        .into_iter()
        .filter(|name| name.extension().is_some_and(|extension| extension == "wal"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 2, "{segments:?}");
    let last = wal.join(segments.last().unwrap());
    let file = fs.open(&last, OpenOptions::existing()).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(4, &mut byte).unwrap();
    file.write_all_at(4, &[byte[0] ^ 0x80]).unwrap();
    file.sync_data().unwrap();
    match open_and_read(&fs) {
        Err(error) => println!("refused: {error}"),
        Ok(rows) => panic!(
            "the open succeeded with {} of the {} acknowledged rows",
            rows.len(),
            BATCHES * BATCH_ROWS
        ),
    }
}

/// A catalog whose checkpoint and recovery-start LSNs lie at the end of the LSN range (its
/// checksum valid) is refused with an error naming them. Recovery started reading the log
/// there, and the log reader's `position + header bytes` overflowed: a panic reachable from
/// the data file (which, inside the open's write-back scope, hung the open).
#[test]
fn a_catalog_whose_log_positions_are_at_the_end_of_the_range_is_refused() {
    for lsn in [u64::MAX, u64::MAX - 7, u64::MAX - 4095] {
        let fs = small_database();
        // The checkpoint LSN and the oldest active LSN: after the 16-byte header, two u32
        // counters and the next transaction id.
        rewrite_catalog(&fs, |blob| {
            blob[32..40].copy_from_slice(&lsn.to_le_bytes());
            blob[40..48].copy_from_slice(&lsn.to_le_bytes());
        });
        match catch_unwind(AssertUnwindSafe(|| open_and_insert(&fs))) {
            Err(panic) => panic!(
                "the open with log positions {lsn} panicked: {}",
                panic_message(panic)
            ),
            Ok(Ok(())) => panic!("a catalog with log positions {lsn} was accepted"),
            Ok(Err(error)) => assert!(
                error.contains("beyond any log position"),
                "unclear error: {error}"
            ),
        }
    }
}

/// A catalog whose next table id or next index id is the last u32 (checksums valid: a
/// catalog that passes every check, with its ids used up) opens, and creating a table then
/// fails with an error. The ids were handed out with a wrapping `fetch_add`, and the created
/// table's log description added one to them: a panic (an overflow) reachable from the file.
#[test]
fn a_catalog_whose_table_or_index_ids_are_used_up_refuses_new_tables_without_panicking() {
    // The next table id and the next index id: after the 16-byte header.
    for at in [16, 20] {
        let fs = small_database();
        rewrite_catalog(&fs, |blob| {
            blob[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes())
        });
        let create = || {
            let db = Database::open(DIR, options(&fs)).map_err(|error| error.to_string())?;
            let created = db
                .create_table(
                    TableDef::new("Other").column(ColumnDef::new("V", DataType::Int).not_null()),
                )
                .map(drop)
                .map_err(|error| error.to_string());
            // The existing table is still there either way.
            assert_eq!(db.table("Orders").unwrap().row_count(), 1);
            created
        };
        match catch_unwind(AssertUnwindSafe(create)) {
            Err(panic) => panic!(
                "the open or the creation panicked (ids at {at}): {}",
                panic_message(panic)
            ),
            Ok(Ok(())) => panic!("a table was created with the ids at {at} used up"),
            Ok(Err(error)) => assert!(error.contains("used up"), "unclear error: {error}"),
        }
    }
}

/// A catalog whose row counts no tree can hold (checksums valid) is refused with an error
/// naming the table and the partition, and one at the most a tree can hold opens and counts
/// on without wrapping. A tree's counter counts in an i64 and was seeded from the catalog as
/// it was: a count near `i64::MAX` wrapped on the next insert, and the table read as empty.
#[test]
fn a_catalog_with_absurd_row_counts_is_refused() {
    use lastpage_engine::catalog::Catalog;
    use lastpage_storage::limits::MAX_TREE_ROWS;
    let fs = FaultyFileSystem::new(FaultyConfig::new(8));
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db
        .create_table(
            TableDef::new("Spread")
                .column(ColumnDef::new("Id", DataType::BigInt).not_null())
                .clustered(IndexDef::new("PK_Spread", &["Id"], Uniqueness::PrimaryKey))
                .partitioned("Id", 3),
        )
        .unwrap();
    drop(table);
    db.close().unwrap();
    let mut original = None;
    rewrite_catalog(&fs, |blob| original = Some(Catalog::decode(blob).unwrap()));
    let original = original.unwrap();
    // Only the last partition's count is forged: the error must name it.
    let with_rows = |rows: u64| {
        let mut catalog = original.clone();
        *catalog.tables[0].index_trees[0]
            .rows_per_partition
            .last_mut()
            .unwrap() = rows;
        let bytes = catalog.encode().unwrap();
        rewrite_catalog(&fs, |blob| *blob = bytes);
    };
    for rows in [
        u64::MAX,
        i64::MAX as u64 + 1,
        i64::MAX as u64,
        i64::MAX as u64 - 1,
        MAX_TREE_ROWS + 1,
    ] {
        with_rows(rows);
        match catch_unwind(AssertUnwindSafe(|| Database::open(DIR, options(&fs)))) {
            Err(panic) => panic!(
                "row count {rows}: the open panicked: {}",
                panic_message(panic)
            ),
            Ok(Ok(db)) => panic!(
                "a catalog with a row count of {rows} was accepted; the table counts {} rows",
                db.table("Spread").unwrap().row_count()
            ),
            Ok(Err(error)) => {
                let error = error.to_string();
                assert!(
                    error.contains("catalog")
                        && error.contains("'Spread', partition 2")
                        && error.contains(&format!("row count of {rows}")),
                    "unclear error: {error}"
                );
            }
        }
    }
    // The largest count a tree can hold opens, and rows inserted by this thread and by another
    // (each adds to its own stripe of the tree's counter) count on from it.
    with_rows(MAX_TREE_ROWS);
    let db = Database::open(DIR, options(&fs)).unwrap();
    let table = db.table("Spread").unwrap();
    assert_eq!(table.row_count(), MAX_TREE_ROWS);
    let insert = |id: i64| {
        table
            .insert(&db.session(), InsertRow::new().set(0, id))
            .unwrap()
    };
    // Id 2 goes to the last partition, whose count was forged (partition = id modulo 3).
    insert(2);
    std::thread::scope(|scope| {
        scope.spawn(|| insert(5)).join().unwrap();
    });
    assert_eq!(table.row_count(), MAX_TREE_ROWS + 2);
}

/// Rewrites the log's last create-table record with `change`, applied to the one-table catalog
/// it holds (ids only, so that the record keeps its length), every checksum fixed.
fn rewrite_last_create_record(
    fs: &FaultyFileSystem,
    change: impl FnOnce(&mut lastpage_engine::catalog::Catalog),
) {
    use lastpage_engine::catalog::Catalog;
    // A schema record's payload is its description's length (u32) and the description: the
    // create tag (1), then a one-table catalog.
    rewrite_last_log_record(fs, 10, |record| {
        let len = u32_at(record, 24) as usize;
        assert_eq!(
            record[28], 1,
            "the last schema record is no create-table record"
        );
        let blob = &mut record[29..28 + len];
        let mut catalog = Catalog::decode(blob).unwrap();
        change(&mut catalog);
        let mut bytes = catalog.encode().unwrap();
        assert_eq!(bytes.len(), blob.len());
        // An index id placed at `STAND_IN` (which encoding accepts) becomes the table's
        // clustered index id: a duplicate, which encoding would refuse.
        let clustered = catalog.tables[0].index_trees[0].index_id_per_partition[0];
        if let Some(at) = bytes
            .windows(4)
            .position(|window| window == STAND_IN.to_le_bytes())
        {
            bytes[at..at + 4].copy_from_slice(&clustered.to_le_bytes());
            let covered = bytes.len() - 4;
            let crc = crc32c::crc32c(&bytes[..covered]);
            bytes[covered..].copy_from_slice(&crc.to_le_bytes());
        }
        blob.copy_from_slice(&bytes);
    });
}

/// An index id that `rewrite_last_create_record` replaces with the clustered one's.
const STAND_IN: u32 = 0x5EED_1C00;

/// A crashed database whose log creates 'Orders' (one row) and then 'Others' (one row), with
/// no checkpoint after them, so that the open replays both creations. (The names are of one
/// length, so that a forgery can give the second the first's name and keep the record's.)
fn two_tables_in_the_log() -> FaultyFileSystem {
    let (fs, db) = database_with_one_row(9);
    let other = db
        .create_table(
            TableDef::new("Others")
                .column(ColumnDef::new("Id", DataType::BigInt).not_null())
                .column(ColumnDef::new("Payload", DataType::VarChar(100)).not_null())
                .clustered(IndexDef::new("PK_Other", &["Id"], Uniqueness::PrimaryKey))
                .nonclustered(IndexDef::new(
                    "IX_Other",
                    &["Payload"],
                    Uniqueness::NonUnique,
                )),
        )
        .unwrap();
    let session = db.session();
    other
        .insert(&session, InsertRow::new().set(0, 7i64).set(1, "other"))
        .unwrap();
    db.table("Orders")
        .unwrap()
        .insert(&session, InsertRow::new().set(0, 2i64).set(1, payload(2)))
        .unwrap();
    let fs = fs.crash_with(CrashMode::LoseUnsynced);
    drop((other, session, db));
    fs
}

/// A create-table record forged (checksums valid) to name the table id or an index id of a
/// table already live at that point of the replay is refused with an error naming the ids,
/// and so is one naming an index id twice, and one reusing a live table's name (which
/// replaced that table, rows and all). The replay created the table anyway, and its id
/// maps then sent the live table's logged changes to whichever table they held last, mixing
/// the tables' rows; only the checkpoint ending the open failed, blaming the catalog's encoder
/// ('The catalog cannot be encoded: index id 1 is used twice') rather than the log.
#[test]
fn a_create_table_record_naming_ids_in_use_is_refused() {
    // The original log replays: 'Orders' then 'Others', each with its rows.
    let fs = two_tables_in_the_log();
    let db = Database::open(DIR, options(&fs)).unwrap();
    assert_eq!(db.table("Orders").unwrap().row_count(), 2);
    assert_eq!(db.table("Others").unwrap().row_count(), 1);
    drop(db);
    // 'Orders' took the first table id and index id, 'Others' the next ones (ids only grow).
    type Forgery = fn(&mut lastpage_engine::catalog::Catalog);
    let forgeries: [(&str, Forgery, &str); 5] = [
        (
            "the name of 'Orders' (in other letter case)",
            |catalog| catalog.tables[0].definition.name = "ORDERS".to_string(),
            "reuses the name of live table 'Orders'",
        ),
        (
            "the clustered index id of 'Orders'",
            |catalog| catalog.tables[0].index_trees[0].index_id_per_partition[0] -= 1,
            "index ids [",
        ),
        (
            "for its nonclustered index, the clustered index id of 'Orders'",
            |catalog| catalog.tables[0].index_trees[1].index_id_per_partition[0] -= 2,
            "index ids [",
        ),
        (
            "the table id of 'Orders'",
            |catalog| catalog.tables[0].table_id -= 1,
            "table id ",
        ),
        (
            "its own clustered index id twice",
            |catalog| {
                catalog.next_index_id = STAND_IN + 1;
                catalog.tables[0].index_trees[1].index_id_per_partition[0] = STAND_IN;
            },
            "used twice",
        ),
    ];
    for (what, forge, expected) in forgeries {
        let fs = two_tables_in_the_log();
        rewrite_last_create_record(&fs, forge);
        match catch_unwind(AssertUnwindSafe(|| Database::open(DIR, options(&fs)))) {
            Err(panic) => panic!("{what}: the open panicked: {}", panic_message(panic)),
            Ok(Ok(db)) => panic!(
                "a create-table record naming {what} was accepted; the tables and their rows: \
                 {:?}",
                db.tables()
                    .iter()
                    .map(|table| (table.name().to_string(), table.row_count()))
                    .collect::<Vec<_>>()
            ),
            Ok(Err(error)) => {
                let error = error.to_string();
                println!("{what}: {error}");
                assert!(
                    error.contains("recovery cannot continue")
                        && error.contains("create-table record")
                        && error.contains(expected),
                    "{what}: unclear error: {error}"
                );
            }
        }
    }
}
