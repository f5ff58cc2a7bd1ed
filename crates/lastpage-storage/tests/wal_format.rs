//! The log's byte format: typed records round-trip, decoding garbage never panics, and the reader
//! stops cleanly at every kind of torn tail. Logs here are built by hand (record images written
//! into segment files of a [`FaultyFileSystem`]) so that each kind of damage is exact.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use lastpage_io::{FaultyConfig, FaultyFileSystem, FileSystem, OpenOptions};
use lastpage_storage::limits::{MAX_WAL_RECORD_BYTES, WAL_SEGMENT_HEADER_BYTES};
use lastpage_storage::wal::record::{self, RecordHeader};
use lastpage_storage::wal::{
    ActiveTxn, DirtyPage, LogReader, LogWriter, Lsn, Record, RecordKind, TailKind, TxnId,
    WalConfig, WalError,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn samples() -> Vec<Record<'static>> {
    let bytes = |b: &[u8]| Cow::Owned(b.to_vec());
    vec![
        Record::Begin { txn: TxnId(1) },
        Record::Insert {
            txn: TxnId(1),
            index_id: 7,
            key: bytes(b"key"),
            value: bytes(b"a value"),
        },
        Record::Insert {
            txn: TxnId(u64::MAX),
            index_id: u32::MAX,
            key: bytes(b""),
            value: bytes(&[0xFF; 300]),
        },
        Record::Delete {
            txn: TxnId(2),
            index_id: 3,
            key: bytes(b"k"),
            old_value: bytes(b"old"),
        },
        Record::Update {
            txn: TxnId(3),
            index_id: 4,
            key: bytes(b"k2"),
            old_value: bytes(b"before"),
            new_value: bytes(b"after!"),
        },
        Record::Commit { txn: TxnId(1) },
        Record::Abort { txn: TxnId(2) },
        Record::CheckpointBegin,
        Record::CheckpointEnd {
            begin_lsn: Lsn(4096),
            redo_lsn: Lsn(1024),
            active_txns: vec![ActiveTxn {
                txn: TxnId(9),
                first_lsn: Lsn(1024),
                last_lsn: Lsn(2048),
            }],
            dirty_pages: vec![
                DirtyPage {
                    page_id: 5,
                    rec_lsn: Lsn(1024),
                },
                DirtyPage {
                    page_id: 6,
                    rec_lsn: Lsn(1536),
                },
            ],
        },
        Record::CheckpointEnd {
            begin_lsn: Lsn(0),
            redo_lsn: Lsn(0),
            active_txns: vec![],
            dirty_pages: vec![],
        },
        Record::IdentityReserve {
            table_id: 12,
            up_to: -5,
        },
        Record::IdentityReserve {
            table_id: 1,
            up_to: i64::MAX,
        },
        Record::InsertRun {
            txn: TxnId(8),
            index_id: 2,
            rows: vec![
                (bytes(b"k1"), bytes(b"first row")),
                (bytes(b""), bytes(b"")),
                (bytes(&[0xAB; 40]), bytes(&[0xCD; 500])),
            ],
        },
        Record::InsertRun {
            txn: TxnId(9),
            index_id: 3,
            rows: vec![],
        },
    ]
}

#[test]
fn every_record_kind_round_trips() {
    for sample in samples() {
        let payload = sample.encode_payload();
        assert_eq!(payload.len(), sample.payload_len(), "{sample:?}");
        let decoded = Record::decode(sample.kind() as u8, &payload).unwrap();
        assert_eq!(decoded, sample);
        assert_eq!(
            RecordKind::from_byte(sample.kind() as u8),
            Some(sample.kind())
        );

        let image = record::encode(&sample, Lsn(4096), 7);
        assert_eq!(image.len() % 8, 0);
        let header = RecordHeader::parse(image[..24].try_into().unwrap());
        assert_eq!(header.problem(Lsn(4096)), None);
        assert_eq!(header.total_len as usize, 24 + payload.len());
        assert_eq!(header.kind, sample.kind() as u8);
        assert!(image[header.total_len as usize..].iter().all(|&b| b == 0));
        // Any other position is refused: the LSN is part of the record.
        assert!(header.problem(Lsn(4104)).is_some());
    }
}

#[test]
fn decoding_garbage_fails_without_panicking() {
    let seed = 0xD0C0DE;
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for sample in samples() {
        let payload = sample.encode_payload();
        // Every truncation and every extension of a valid payload is an error.
        for cut in 0..payload.len() {
            assert!(Record::decode(sample.kind() as u8, &payload[..cut]).is_err());
        }
        let mut longer = payload.clone();
        longer.push(0);
        assert!(Record::decode(sample.kind() as u8, &longer).is_err());
    }
    assert!(Record::decode(0, &[]).is_err());
    assert!(Record::decode(200, &[1, 2, 3]).is_err());
    // Random bytes under every type byte: errors or records, never a panic or a huge allocation.
    for _ in 0..20_000 {
        let len = rng.random_range(0..64);
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let _ = Record::decode(rng.random_range(0..13), &bytes);
    }
    // A checkpoint claiming four billion entries is refused before anything is reserved.
    let mut lying = vec![0u8; 16];
    lying.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Record::decode(RecordKind::CheckpointEnd as u8, &lying).is_err());
    // So is an insert run claiming more rows than its bytes could hold.
    let mut lying_run = vec![0u8; 12];
    lying_run.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Record::decode(RecordKind::InsertRun as u8, &lying_run).is_err());
}

#[test]
fn header_checks_reject_impossible_headers() {
    let image = record::encode(&Record::Commit { txn: TxnId(5) }, Lsn(64), 7);
    let header = |mutate: &dyn Fn(&mut [u8])| {
        let mut bytes: [u8; 24] = image[..24].try_into().unwrap();
        mutate(&mut bytes);
        RecordHeader::parse(&bytes).problem(Lsn(64))
    };
    assert_eq!(header(&|_| {}), None);
    assert!(header(&|b| b.fill(0)).unwrap().contains("zero length"));
    assert!(header(&|b| b[4..8].copy_from_slice(&10u32.to_le_bytes())).is_some());
    assert!(
        header(&|b| b[4..8].copy_from_slice(&(MAX_WAL_RECORD_BYTES as u32 + 8).to_le_bytes()))
            .is_some()
    );
    assert!(header(&|b| b[16] ^= 1).unwrap().contains("disagree"));
    assert!(header(&|b| b[9] ^= 1).unwrap().contains("LSN"));
    assert!(header(&|b| b[22] = 1).unwrap().contains("reserved"));
}

const DIR: &str = "/db/log";

/// A file system holding a log of `records` (in one segment of `segment_bytes`), written by a
/// real writer, plus the end LSN of each record.
fn written_log(records: &[Record<'_>], segment_bytes: u64) -> (FaultyFileSystem, Vec<Lsn>) {
    let fs = FaultyFileSystem::new(FaultyConfig::new(1));
    let config = WalConfig {
        segment_bytes,
        ..WalConfig::default()
    };
    let writer = LogWriter::open(Arc::new(fs.clone()), DIR, config).unwrap();
    let ends = records.iter().map(|r| writer.append(r).unwrap()).collect();
    writer.flush_now().unwrap();
    (fs, ends)
}

fn read_back(fs: &FaultyFileSystem) -> (Vec<Record<'static>>, LogReader) {
    let mut reader = LogReader::open(Arc::new(fs.clone()), DIR, Lsn::ZERO).unwrap();
    let mut records = Vec::new();
    while let Some(entry) = reader.next_record().unwrap() {
        records.push(entry.record);
    }
    (records, reader)
}

fn segment0() -> std::path::PathBuf {
    Path::new(DIR).join("0000000000000000.wal")
}

/// The id of the log in `fs` (from segment 0's header).
fn log_id(fs: &FaultyFileSystem) -> u64 {
    let header = fs.contents(&segment0()).unwrap();
    u64::from_le_bytes(header[40..48].try_into().unwrap())
}

/// Overwrites bytes of the log at `lsn` in segment 0.
fn damage(fs: &FaultyFileSystem, lsn: Lsn, bytes: &[u8]) {
    let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
    file.write_all_at(WAL_SEGMENT_HEADER_BYTES as u64 + lsn.0, bytes)
        .unwrap();
}

#[test]
fn reader_returns_every_record_and_ends_where_the_files_end() {
    let records = samples();
    let (fs, ends) = written_log(&records, 1 << 20);
    let (read, reader) = read_back(&fs);
    assert_eq!(read, records);
    let end = reader.end().unwrap();
    assert_eq!(end.lsn, *ends.last().unwrap());
    // The log ends where its files end, or at the zeros the writer preallocates past its end.
    assert!(
        end.kind == TailKind::EndOfFiles
            || matches!(end.kind, TailKind::InvalidHeader(reason) if reason.contains("zero")),
        "{:?}",
        end.kind
    );

    // Reading from a record boundary in the middle.
    let mut reader = LogReader::open(Arc::new(fs.clone()), DIR, ends[4]).unwrap();
    let entry = reader.next_record().unwrap().unwrap();
    assert_eq!(entry.lsn, ends[4]);
    assert_eq!(entry.record, records[5]);

    // An empty or missing log directory is an empty log.
    let empty = FaultyFileSystem::new(FaultyConfig::new(2));
    let mut reader = LogReader::open(Arc::new(empty), DIR, Lsn::ZERO).unwrap();
    assert!(reader.next_record().unwrap().is_none());
    assert_eq!(reader.end().unwrap().lsn, Lsn::ZERO);
}

/// A kind of damage: its name, what it does to a log, and the tail kind the reader must report.
type Case<'a> = (&'static str, Damage<'a>, fn(TailKind) -> bool);
type Damage<'a> = Box<dyn Fn(&FaultyFileSystem) + 'a>;

#[test]
fn reader_stops_at_each_kind_of_torn_tail() {
    let records = samples();
    let (base, ends) = written_log(&records, 1 << 20);
    // Damage the record after the fifth: the reader must return exactly five records.
    let victim = ends[4];
    let victim_len = ends[5].0 - victim.0;
    let crash = || base.crash_with(lastpage_io::CrashMode::KeepUnsynced);
    let cases: Vec<Case> = vec![
        (
            "zeroed",
            Box::new(|fs| damage(fs, victim, &vec![0; victim_len as usize])),
            |kind| matches!(kind, TailKind::InvalidHeader(reason) if reason.contains("zero")),
        ),
        (
            "flipped payload bit",
            Box::new(|fs| damage(fs, Lsn(victim.0 + 30), &[0x55])),
            |kind| kind == TailKind::BadChecksum,
        ),
        (
            "garbage length",
            Box::new(|fs| damage(fs, Lsn(victim.0 + 4), &[0xFF, 0xFF, 0xFF, 0x7F])),
            |kind| matches!(kind, TailKind::InvalidHeader(_)),
        ),
        (
            "stale record from another position",
            Box::new(|fs| damage(fs, victim, &record::encode(&records[5], Lsn(8), log_id(fs)))),
            |kind| matches!(kind, TailKind::InvalidHeader(reason) if reason.contains("LSN")),
        ),
        (
            "a record of another log, at the right position",
            Box::new(|fs| {
                let other_log = log_id(fs) ^ 1;
                damage(fs, victim, &record::encode(&records[5], victim, other_log))
            }),
            |kind| kind == TailKind::BadChecksum,
        ),
        (
            "file cut inside the record",
            Box::new(|fs| {
                let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
                file.set_len(WAL_SEGMENT_HEADER_BYTES as u64 + victim.0 + 30)
                    .unwrap();
            }),
            |kind| kind == TailKind::Truncated,
        ),
        (
            "file cut inside the header",
            Box::new(|fs| {
                let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
                file.set_len(WAL_SEGMENT_HEADER_BYTES as u64 + victim.0 + 10)
                    .unwrap();
            }),
            |kind| kind == TailKind::Truncated,
        ),
        (
            "file cut at the record",
            Box::new(|fs| {
                let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
                file.set_len(WAL_SEGMENT_HEADER_BYTES as u64 + victim.0)
                    .unwrap();
            }),
            |kind| kind == TailKind::EndOfFiles,
        ),
    ];
    for (name, damage, expected) in cases {
        let fs = crash();
        damage(&fs);
        let (read, reader) = read_back(&fs);
        assert_eq!(read, records[..5], "{name}");
        let end = reader.end().unwrap();
        assert_eq!(end.lsn, victim, "{name}");
        assert!(expected(end.kind), "{name}: {:?}", end.kind);
    }

    // A damaged segment header ends the log at the segment.
    let fs = crash();
    let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
    file.write_all_at(3, b"X").unwrap();
    let (read, reader) = read_back(&fs);
    assert!(read.is_empty());
    assert_eq!(reader.end().unwrap().kind, TailKind::BadSegment);
}

#[test]
fn random_garbage_after_the_log_never_breaks_the_reader() {
    let records = samples();
    let (base, ends) = written_log(&records, 1 << 20);
    let end = *ends.last().unwrap();
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let fs = base.crash_with(lastpage_io::CrashMode::KeepUnsynced);
        let len = rng.random_range(1..200);
        let mut garbage: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if rng.random_bool(0.5) {
            // A plausible header: right LSN and lengths, so only the CRC can catch it.
            let fake = record::encode(&Record::Commit { txn: TxnId(seed) }, end, log_id(&fs));
            garbage[..fake.len().min(len)].copy_from_slice(&fake[..fake.len().min(len)]);
            garbage[0] ^= 1;
        }
        damage(&fs, end, &garbage);
        let (read, reader) = read_back(&fs);
        assert_eq!(read, records, "seed {seed}");
        assert_eq!(reader.end().unwrap().lsn, end, "seed {seed}");
    }
}

#[test]
fn a_record_that_passes_its_checksum_but_does_not_decode_is_corruption() {
    let (fs, ends) = written_log(&[Record::Begin { txn: TxnId(1) }], 1 << 20);
    // A record of unknown type 99 with a valid CRC where the next record goes.
    let mut header = record::header_without_crc(RecordKind::Begin, ends[0], 8);
    header[20] = 99;
    let crc = record::checksum(log_id(&fs), &header, [&[0u8; 8][..]]);
    header[0..4].copy_from_slice(&crc.to_le_bytes());
    let mut image = header.to_vec();
    image.extend_from_slice(&[0; 8]);
    damage(&fs, ends[0], &image);
    let mut reader = LogReader::open(Arc::new(fs), DIR, Lsn::ZERO).unwrap();
    assert!(reader.next_record().unwrap().is_some());
    let error = reader.next_record().unwrap_err();
    assert!(matches!(error, WalError::Corrupt { .. }), "{error}");
    assert!(
        error.to_string().contains("unknown record type 99"),
        "{error}"
    );
}

#[test]
fn a_log_of_another_format_version_is_refused_not_read_as_empty() {
    let (fs, _) = written_log(&samples(), 1 << 20);
    // Version 1 (record checksums not seeded with the log id), with an intact header CRC.
    let file = fs.open(&segment0(), OpenOptions::existing()).unwrap();
    let mut header = fs.contents(&segment0()).unwrap()[..52].to_vec();
    header[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&header[..48]);
    header[48..52].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(0, &header).unwrap();
    let error = LogReader::open(Arc::new(fs.clone()), DIR, Lsn::ZERO)
        .and_then(|mut reader| reader.next_record().map(|_| ()))
        .unwrap_err();
    assert!(error.to_string().contains("format version 1"), "{error}");
    let error = LogWriter::open(Arc::new(fs.clone()), DIR, WalConfig::default()).unwrap_err();
    assert!(error.to_string().contains("format version 1"), "{error}");
    // Nothing was cut or removed.
    assert_eq!(&fs.contents(&segment0()).unwrap()[..52], &header[..]);
}

/// A reader asked to start past anything a log can reach (recovery passes the LSN a stored
/// checkpoint names, which damage with a valid checksum can make anything) finds the end of
/// the log's files there. Its `position + header bytes` overflowed: a panic reachable from the
/// data file's catalog.
#[test]
fn a_reader_starting_at_the_end_of_the_lsn_range_finds_the_end_without_panicking() {
    let (fs, _) = written_log(&samples(), 1 << 20);
    for from in [u64::MAX, u64::MAX - 7, u64::MAX - 23, 1 << 63] {
        let mut reader = LogReader::open(Arc::new(fs.clone()), DIR, Lsn(from)).unwrap();
        assert!(reader.next_raw().unwrap().is_none(), "from {from}");
        assert!(reader.next_record().unwrap().is_none(), "from {from}");
        let end = reader.end().unwrap();
        assert_eq!((end.lsn, end.kind), (Lsn(from), TailKind::EndOfFiles));
    }
}

/// A file after the log's last segment, named for an LSN at the end of the range and without
/// a valid header (a stray file: no writer names a segment there), is looked through for
/// records of the log like any segment whose header is invalid, without overflowing the LSN
/// of each position it tries (`start + offset`); holding none, it goes as a leftover.
#[test]
fn a_stray_segment_file_named_at_the_end_of_the_lsn_range_does_not_panic_the_open() {
    let records = samples();
    let (fs, ends) = written_log(&records, 1 << 20);
    let stray = Path::new(DIR).join(format!("{:016x}.wal", u64::MAX - 7));
    let file = fs.open(&stray, OpenOptions::create()).unwrap();
    file.write_all_at(0, &vec![0u8; WAL_SEGMENT_HEADER_BYTES + 4096])
        .unwrap();
    file.sync_data().unwrap();
    drop(file);
    let writer = LogWriter::open(Arc::new(fs.clone()), DIR, WalConfig::default()).unwrap();
    assert_eq!(writer.start_lsn(), *ends.last().unwrap());
    drop(writer);
    assert!(!fs.exists(&stray).unwrap(), "the stray file was kept");
    assert_eq!(read_back(&fs).0, records);
}
