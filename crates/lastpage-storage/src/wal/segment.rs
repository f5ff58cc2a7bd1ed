//! Log segment files.
//!
//! Segment `k` holds the logical log bytes `[k * segment_bytes, (k + 1) * segment_bytes)` after
//! a header of `WAL_SEGMENT_HEADER_BYTES`; it is named after its first LSN, as 16 lowercase hex
//! digits with the extension `.wal` (`0000000004000000.wal`). Log byte `lsn` lives at file
//! offset `WAL_SEGMENT_HEADER_BYTES + (lsn - start_lsn)`.
//!
//! # Header (little-endian; the rest of the header is zero)
//!
//! | offset | size | field              | meaning                                                 |
//! |--------|------|--------------------|---------------------------------------------------------|
//! | 0      | 8    | magic              | `LPWALSEG`                                              |
//! | 8      | 4    | version            | 2 (1: record checksums not seeded with the log id)      |
//! | 12     | 4    | header bytes       | `WAL_SEGMENT_HEADER_BYTES`                              |
//! | 16     | 8    | segment bytes      | logical log bytes per segment (the same in every file)  |
//! | 24     | 8    | start LSN          | first LSN of this segment (`k * segment_bytes`)         |
//! | 32     | 8    | first record LSN   | LSN of the record holding the segment's first byte (it  |
//! |        |      |                    | starts in the previous segment if a record spans both)  |
//! | 40     | 8    | log id             | random, the same in every segment of one log            |
//! | 48     | 4    | CRC32C             | of bytes 0..48                                          |
//!
//! The writer creates (or renames into place) a segment file, syncs the directory, then writes and
//! syncs its header, all before it writes any log bytes into it; and it syncs the bytes of one
//! segment before it writes into the next. So a segment whose header is invalid has no durable log
//! bytes, and if any byte of segment `k` is durable, every earlier byte of the log is too.

use std::path::{Path, PathBuf};

use lastpage_io::FileSystem;

use super::WalError;
use super::record::RecordHeader;
use crate::limits::{
    MAX_WAL_RECORD_BYTES, WAL_MAX_SEGMENT_BYTES, WAL_MAX_START_LSN, WAL_RECORD_ALIGN_BYTES,
    WAL_RECORD_HEADER_BYTES, WAL_SEGMENT_HEADER_BYTES,
};

const MAGIC: &[u8; 8] = b"LPWALSEG";
/// The format version this build writes and reads. Version 1 logs (whose record checksums
/// were not seeded with the log id) are refused with an error, never read as empty.
const VERSION: u32 = 2;
const HEADER_FIELDS_BYTES: usize = 48;

/// The file offset of the segment's first log byte.
pub(crate) const HEADER_BYTES: u64 = WAL_SEGMENT_HEADER_BYTES as u64;

/// What a segment header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub segment_bytes: u64,
    pub start_lsn: u64,
    pub first_record_lsn: u64,
    pub log_id: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; WAL_SEGMENT_HEADER_BYTES];
        bytes[0..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(WAL_SEGMENT_HEADER_BYTES as u32).to_le_bytes());
        bytes[16..24].copy_from_slice(&self.segment_bytes.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.start_lsn.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.first_record_lsn.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.log_id.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..HEADER_FIELDS_BYTES]);
        bytes[48..52].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The format version a header says it has, if it is intact: long enough, with the magic
    /// and a matching CRC. Whatever the version, those three are where every one starts.
    fn intact_version(bytes: &[u8]) -> Option<u32> {
        if bytes.len() < HEADER_FIELDS_BYTES + 4 || &bytes[0..8] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        (u32_at(48) == crc32c::crc32c(&bytes[..HEADER_FIELDS_BYTES])).then(|| u32_at(8))
    }

    /// The version of a header that is intact (magic and CRC) but of another format version
    /// than this build's, if `bytes` is one.
    pub fn other_version(bytes: &[u8]) -> Option<u32> {
        Self::intact_version(bytes).filter(|&version| version != VERSION)
    }

    /// Parses and checks a header; `None` if it is not a valid one.
    pub fn decode(bytes: &[u8]) -> Option<SegmentHeader> {
        if Self::intact_version(bytes) != Some(VERSION) {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        if u32_at(12) as usize != WAL_SEGMENT_HEADER_BYTES {
            return None;
        }
        let header = SegmentHeader {
            segment_bytes: u64_at(16),
            start_lsn: u64_at(24),
            first_record_lsn: u64_at(32),
            log_id: u64_at(40),
        };
        // The checksum has no secret, so these are checked like any file content: only what
        // a writer makes is valid. A segment beyond `WAL_MAX_START_LSN` overflowed the reader's
        // `start + segment_bytes`; an unaligned first record LSN (or segment size, which a
        // configuration cannot have) became the log's end, and the open removed the segment
        // after it, then panicked on the unaligned start of its log buffer.
        let align = WAL_RECORD_ALIGN_BYTES as u64;
        let sane = header.segment_bytes > 0
            && header.segment_bytes <= WAL_MAX_SEGMENT_BYTES
            && header.segment_bytes.is_multiple_of(align)
            && header.start_lsn.is_multiple_of(header.segment_bytes)
            && header.start_lsn <= WAL_MAX_START_LSN
            && header.first_record_lsn <= header.start_lsn
            && header.first_record_lsn.is_multiple_of(align);
        sane.then_some(header)
    }
}

/// The file name of the segment starting at `start_lsn`.
pub(crate) fn file_name(start_lsn: u64) -> String {
    format!("{start_lsn:016x}.wal")
}

/// The start LSN a segment file name stands for, if it is one.
pub(crate) fn parse_file_name(name: &Path) -> Option<u64> {
    let name = name.to_str()?;
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The segments in `dir`, by start LSN, ascending. A missing directory is an empty log.
pub(crate) fn list(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<(u64, PathBuf)>, WalError> {
    if !fs
        .exists(dir)
        .map_err(|error| WalError::io(format!("looking for {}", dir.display()), error))?
    {
        return Ok(Vec::new());
    }
    let names = fs
        .list_dir(dir)
        .map_err(|error| WalError::io(format!("listing {}", dir.display()), error))?;
    let mut segments: Vec<(u64, PathBuf)> = names
        .iter()
        .filter_map(|name| parse_file_name(name).map(|start| (start, dir.join(name))))
        .collect();
    segments.sort();
    Ok(segments)
}

/// Whether the segment at `path`, named for LSN `start`, begins its body with a record of
/// that LSN: what a segment the writer wrote log into looks like, whatever its header says.
/// Only what the reader checks before the payload is checked ([`RecordHeader::problem`]); the
/// CRC needs the log's id, which is in the segment header. A segment whose creation a crash
/// cut short holds zeros there, or the records of the old segment it was recycled from, whose
/// LSNs are older.
pub(crate) fn holds_records_from(
    fs: &dyn FileSystem,
    path: &Path,
    start: u64,
) -> Result<bool, WalError> {
    let file = fs
        .open(path, lastpage_io::OpenOptions::existing())
        .map_err(|error| WalError::io(format!("opening {}", path.display()), error))?;
    let mut bytes = [0u8; WAL_RECORD_HEADER_BYTES];
    let read = file
        .read_at(HEADER_BYTES, &mut bytes)
        .map_err(|error| WalError::io(format!("reading {}", path.display()), error))?;
    Ok(read == bytes.len()
        && RecordHeader::parse(&bytes)
            .problem(super::Lsn(start))
            .is_none())
}

/// Whether the segment at `path`, named for LSN `start`, holds a complete record of the log
/// whose record checksums start from `checksum_seed` (its stored LSN its position, its CRC
/// valid) at a record boundary near its start, whatever the segment's header says: whether the
/// writer wrote log into it. A segment whose creation a crash cut short holds none: the writer
/// syncs a segment's header before it writes any log into it, so its body holds zeros, or the
/// old records of the segment it was recycled from, whose LSNs are older.
///
/// The first record that starts in a segment starts within `MAX_WAL_RECORD_BYTES` of its start
/// (a record spanning into it is no longer), so only the body's first `2 × MAX_WAL_RECORD_BYTES`
/// bytes are searched, at every multiple of 8. Not found: a segment holding only the end of a
/// record spanning into it (the reader takes that end from the segment's body if the record's
/// checksum passes: `LogReader::headerless_segment`), or a record too long to end within those
/// bytes (segments smaller than a record).
pub(crate) fn holds_records_of_log(
    fs: &dyn FileSystem,
    path: &Path,
    start: u64,
    segment_bytes: u64,
    checksum_seed: u32,
) -> Result<bool, WalError> {
    let file = fs
        .open(path, lastpage_io::OpenOptions::existing())
        .map_err(|error| WalError::io(format!("opening {}", path.display()), error))?;
    let mut body = vec![0u8; segment_bytes.min(2 * MAX_WAL_RECORD_BYTES as u64) as usize];
    let read = file
        .read_at(HEADER_BYTES, &mut body)
        .map_err(|error| WalError::io(format!("reading {}", path.display()), error))?;
    body.truncate(read);
    let mut at = 0;
    while at + WAL_RECORD_HEADER_BYTES <= body.len() {
        let header_bytes: &[u8; WAL_RECORD_HEADER_BYTES] = body[at..at + WAL_RECORD_HEADER_BYTES]
            .try_into()
            .expect("a header's bytes");
        // A file's name can say any LSN (no writer names a segment past `WAL_MAX_START_LSN`,
        // but a stray file can): a position past the end of the range holds no record.
        let Some(lsn) = start.checked_add(at as u64) else {
            break;
        };
        let header = RecordHeader::parse(header_bytes);
        let end = at + header.total_len as usize;
        if header.problem(super::Lsn(lsn)).is_none()
            && end <= body.len()
            && super::record::seeded_checksum(
                checksum_seed,
                header_bytes,
                [&body[at + WAL_RECORD_HEADER_BYTES..end]],
            ) == header.crc
        {
            return Ok(true);
        }
        at += WAL_RECORD_ALIGN_BYTES;
    }
    Ok(false)
}

/// Reads a segment's header; `None` if the file is too short or the header is invalid. An intact
/// header of another format version is an error: such a log must not be read as empty and cut.
pub(crate) fn read_header(
    fs: &dyn FileSystem,
    path: &Path,
) -> Result<Option<SegmentHeader>, WalError> {
    let file = fs
        .open(path, lastpage_io::OpenOptions::existing())
        .map_err(|error| WalError::io(format!("opening {}", path.display()), error))?;
    let mut bytes = vec![0u8; HEADER_FIELDS_BYTES + 4];
    let read = file
        .read_at(0, &mut bytes)
        .map_err(|error| WalError::io(format!("reading {}", path.display()), error))?;
    if read < bytes.len() {
        return Ok(None);
    }
    if let Some(version) = SegmentHeader::other_version(&bytes) {
        return Err(WalError::Corrupt {
            lsn: super::Lsn(
                parse_file_name(Path::new(path.file_name().unwrap_or_default())).unwrap_or(0),
            ),
            reason: format!(
                "log segment {} has format version {version}; this build reads version {VERSION}",
                path.display()
            ),
        });
    }
    Ok(SegmentHeader::decode(&bytes))
}
