//! Reading the log back: records in LSN order from a starting LSN, up to the end of the valid
//! log.
//!
//! The end of the log is the first position that does not hold a valid record: the files end,
//! a segment is missing or has an invalid header, the header there is impossible (zero length,
//! out-of-bounds length, lengths that disagree, a stored LSN that is not the position, nonzero
//! reserved bytes), the record's bytes end early, or its CRC does not match. After a crash that
//! is the torn tail: whatever the last flush left half-written. The reader stops there, reports
//! where and why ([`LogReader::end`]), and never panics on garbage.
//!
//! What is *not* an end: an I/O error while reading is returned as [`WalError::Io`] (treating it
//! as the end would silently drop committed transactions at recovery), and a record that passes
//! its CRC but cannot be decoded is [`WalError::Corrupt`] (a crash cannot produce one).
//!
//! A bit flip in the middle of an old, durable part of the log is indistinguishable from a torn
//! tail by these checks alone; the reader will stop there too. Telling the two apart (by
//! looking for valid records past the end, or by comparing with the end a checkpoint recorded)
//! is left to recovery.

use std::path::PathBuf;
use std::sync::Arc;

use lastpage_io::{File, FileSystem, OpenOptions};

use super::record::{Record, RecordHeader};
use super::segment::{self, HEADER_BYTES};
use super::{Lsn, WalError, align_up};
use crate::limits::{
    WAL_MAX_END_LSN, WAL_READ_BACK_CHUNK_BYTES, WAL_READ_CHUNK_BYTES, WAL_RECORD_HEADER_BYTES,
};

/// Why the valid log ends where it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailKind {
    /// The log's files end here: the end of a segment file, or no segment holds this LSN.
    EndOfFiles,
    /// The segment file that should hold this LSN has an invalid header or belongs to another
    /// log.
    BadSegment,
    /// The bytes here cannot be a record header; the reason says which check failed (zero
    /// length means nothing was written here: the writer zero-fills segment files ahead of the
    /// log's end, so a log that ends cleanly usually ends this way).
    InvalidHeader(&'static str),
    /// The header is plausible but the record's bytes end early.
    Truncated,
    /// The record is all there but its CRC does not match.
    BadChecksum,
}

/// Where and why the valid log ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEnd {
    /// The first LSN that does not hold a valid record: where the next record would go.
    pub lsn: Lsn,
    /// Why.
    pub kind: TailKind,
}

/// A record as stored: checked (lengths, LSN, CRC) but not decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawRecord {
    /// The record's LSN.
    pub lsn: Lsn,
    /// The LSN of the next record.
    pub end: Lsn,
    /// The type byte.
    pub kind: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

impl RawRecord {
    /// Decodes the payload.
    pub fn decode(&self) -> Result<Record<'_>, WalError> {
        RawRecord::decode_payload(self.lsn, self.kind, &self.payload)
    }

    /// Decodes the payload of a record of type `kind` at `lsn` that its caller took out of the
    /// `RawRecord` (recovery shares it between the row changes it holds until their commit).
    pub fn decode_payload(lsn: Lsn, kind: u8, payload: &[u8]) -> Result<Record<'_>, WalError> {
        Record::decode(kind, payload).map_err(|error| WalError::Corrupt {
            lsn,
            reason: format!("a record with a valid checksum does not decode: {error}"),
        })
    }
}

/// A decoded record and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The record's LSN.
    pub lsn: Lsn,
    /// The LSN of the next record.
    pub end: Lsn,
    /// The record.
    pub record: Record<'static>,
}

/// A segment file being read, with a window of its bytes.
struct OpenSegment {
    start: u64,
    file: Box<dyn File>,
    /// File offset of `window[0]`.
    window_offset: u64,
    window: Vec<u8>,
}

/// Reads records forward from an LSN. Also an iterator of decoded records.
pub struct LogReader {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    segments: Vec<(u64, PathBuf)>,
    /// Segment size and log id, from the first segment header read.
    geometry: Option<(u64, u64)>,
    /// The log's record checksum seed ([`super::record::checksum_seed`]), set with `geometry`.
    checksum_seed: u32,
    current: Option<OpenSegment>,
    position: u64,
    end: Option<LogEnd>,
    /// Why the last `fill` came up short.
    short: TailKind,
    /// The LSN and end (padding excluded) of the record being read, or of its header while
    /// that is read.
    record: (u64, u64),
    /// The start of a segment with an invalid header that the record being read continues
    /// into, read on the condition that the record's checksum passes (see
    /// [`LogReader::headerless_segment`]).
    tentative_headerless: Option<u64>,
    /// Such a segment once that record passed: its start, and the record's LSN.
    headerless: Option<(u64, u64)>,
}

impl LogReader {
    /// A reader of the log in `dir` whose first record is the one at `from` (which must be a
    /// record boundary: the start of the log, or an LSN a checkpoint recorded).
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: impl Into<PathBuf>,
        from: Lsn,
    ) -> Result<LogReader, WalError> {
        let dir = dir.into();
        let segments = segment::list(fs.as_ref(), &dir)?;
        Ok(LogReader {
            fs,
            dir,
            segments,
            geometry: None,
            checksum_seed: 0,
            current: None,
            position: from.0,
            end: None,
            short: TailKind::EndOfFiles,
            record: (from.0, from.0),
            tentative_headerless: None,
            headerless: None,
        })
    }

    /// A segment whose header is invalid but from whose body the reader took the end of the
    /// last record it returned: its start and that record's LSN. The writer syncs a segment's
    /// header before it writes log into it, so an invalid header over the rest of a record
    /// whose checksum passes is a header damaged after the fact (or, after a crash, one never
    /// written over a body that already held exactly those bytes): either way the record's
    /// bytes are the ones its writer made. Without this, such a segment, holding only the end
    /// of the last record, was taken for one whose creation a crash cut short, and the open
    /// removed it, and with it an acknowledged commit. The reader reads no record that starts
    /// in such a segment; `LogWriter::open` writes its header again.
    pub fn headerless_segment(&self) -> Option<(Lsn, Lsn)> {
        self.headerless
            .map(|(start, record)| (Lsn(start), Lsn(record)))
    }

    /// The directory being read.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The LSN of the next record to be read; once the reader has stopped, the end of the
    /// valid log.
    pub fn position(&self) -> Lsn {
        Lsn(self.position)
    }

    /// Where and why the valid log ended, once the reader got there.
    pub fn end(&self) -> Option<LogEnd> {
        self.end
    }

    /// Reads the next record without decoding it, or `None` at the end of the valid log.
    pub fn next_raw(&mut self) -> Result<Option<RawRecord>, WalError> {
        if self.end.is_some() {
            return Ok(None);
        }
        let position = self.position;
        if position > WAL_MAX_END_LSN {
            // No segment reaches this far (a segment header starting beyond
            // `WAL_MAX_START_LSN` is invalid): the log's files end before it. Stopped here, so
            // that a start no log has (a damaged checkpoint LSN) cannot overflow the sums of
            // the position and a record's length below.
            return Ok(self.stop(TailKind::EndOfFiles));
        }
        if self.headerless.is_some_and(|(start, _)| position >= start) {
            // No record starts in a segment whose header is invalid.
            return Ok(self.stop(TailKind::BadSegment));
        }
        self.record = (position, position + WAL_RECORD_HEADER_BYTES as u64);
        let mut header_bytes = [0u8; WAL_RECORD_HEADER_BYTES];
        let got = self.fill(position, &mut header_bytes)?;
        if got < header_bytes.len() {
            let kind = if got == 0 {
                self.short
            } else {
                TailKind::Truncated
            };
            return Ok(self.stop_tentative(kind));
        }
        let header = RecordHeader::parse(&header_bytes);
        if let Some(problem) = header.problem(Lsn(position)) {
            return Ok(self.stop_tentative(TailKind::InvalidHeader(problem)));
        }
        self.record.1 = position + u64::from(header.total_len);
        let mut payload = vec![0u8; header.payload_len as usize];
        let got = self.fill(position + WAL_RECORD_HEADER_BYTES as u64, &mut payload)?;
        if got < payload.len() {
            return Ok(self.stop_tentative(TailKind::Truncated));
        }
        let crc =
            super::record::seeded_checksum(self.checksum_seed, &header_bytes, [payload.as_slice()]);
        if crc != header.crc {
            return Ok(self.stop_tentative(TailKind::BadChecksum));
        }
        if let Some(start) = self.tentative_headerless.take() {
            self.headerless = Some((start, position));
        }
        let end = position + align_up(header.total_len as usize) as u64;
        self.position = end;
        Ok(Some(RawRecord {
            lsn: Lsn(position),
            end: Lsn(end),
            kind: header.kind,
            payload,
        }))
    }

    /// Reads and decodes the next record, or `None` at the end of the valid log.
    pub fn next_record(&mut self) -> Result<Option<LogEntry>, WalError> {
        let Some(raw) = self.next_raw()? else {
            return Ok(None);
        };
        let record = raw.decode()?.into_owned();
        Ok(Some(LogEntry {
            lsn: raw.lsn,
            end: raw.end,
            record,
        }))
    }

    /// [`LogReader::stop`] for a record that may have been read on into a segment with an
    /// invalid header: if it was and did not pass, the record ends as it did before such
    /// segments were read at all, cut short where that segment begins (`Truncated`: it starts
    /// before it, so some of it was there).
    fn stop_tentative(&mut self, kind: TailKind) -> Option<RawRecord> {
        if self.tentative_headerless.take().is_some() {
            return self.stop(TailKind::Truncated);
        }
        self.stop(kind)
    }

    fn stop(&mut self, kind: TailKind) -> Option<RawRecord> {
        self.end = Some(LogEnd {
            lsn: Lsn(self.position),
            kind,
        });
        self.current = None;
        None
    }

    /// Copies log bytes from LSN `position` on into `out`, across segments; returns how many
    /// were there (fewer than asked where the files end, with the reason in `self.short`).
    fn fill(&mut self, position: u64, out: &mut [u8]) -> Result<usize, WalError> {
        let mut done = 0;
        while done < out.len() {
            let at = position + done as u64;
            if !self.open_segment_for(at)? {
                break;
            }
            let (segment_bytes, _) = self.geometry.expect("a segment is open");
            let current = self.current.as_mut().expect("a segment is open");
            let file_offset = HEADER_BYTES + (at - current.start);
            let left_in_segment = current.start + segment_bytes - at;
            let window_end = current.window_offset + current.window.len() as u64;
            if file_offset < current.window_offset || file_offset >= window_end {
                let chunk = (WAL_READ_CHUNK_BYTES as u64).min(left_in_segment) as usize;
                current.window.resize(chunk, 0);
                let read = current
                    .file
                    .read_at(file_offset, &mut current.window)
                    .map_err(|error| {
                        WalError::io(
                            format!("reading the log at LSN {at} in {}", self.dir.display()),
                            error,
                        )
                    })?;
                current.window.truncate(read);
                current.window_offset = file_offset;
                if read == 0 {
                    self.short = TailKind::EndOfFiles;
                    break;
                }
            }
            let in_window = (file_offset - current.window_offset) as usize;
            let available = (current.window.len() - in_window)
                .min(left_in_segment as usize)
                .min(out.len() - done);
            out[done..done + available]
                .copy_from_slice(&current.window[in_window..in_window + available]);
            done += available;
        }
        Ok(done)
    }

    /// Makes `current` the segment holding `lsn`; false (with the reason in `self.short`) if
    /// there is no valid one.
    fn open_segment_for(&mut self, lsn: u64) -> Result<bool, WalError> {
        if let (Some(current), Some((segment_bytes, _))) = (&self.current, self.geometry)
            && current.start <= lsn
            && lsn < current.start + segment_bytes
        {
            return Ok(true);
        }
        if self.tentative_headerless.is_some() {
            // A record read on into a segment with an invalid header must end there.
            self.short = TailKind::BadSegment;
            return Ok(false);
        }
        self.current = None;
        // The last segment starting at or before `lsn`.
        let index = self.segments.partition_point(|(start, _)| *start <= lsn);
        let Some((start, path)) = index.checked_sub(1).map(|i| self.segments[i].clone()) else {
            self.short = TailKind::EndOfFiles;
            return Ok(false);
        };
        let Some(header) = segment::read_header(self.fs.as_ref(), &path)? else {
            // A record that started in the segment before may end in this one: read its end
            // here, on the condition that its checksum passes (see `headerless_segment`).
            let (record_start, record_end) = self.record;
            if let Some((segment_bytes, _)) = self.geometry
                && lsn == start
                && record_start < start
                && start.is_multiple_of(segment_bytes)
                && record_end <= start + segment_bytes
                && self.headerless.is_none()
            {
                let file = self
                    .fs
                    .open(&path, OpenOptions::existing())
                    .map_err(|error| WalError::io(format!("opening {}", path.display()), error))?;
                self.tentative_headerless = Some(start);
                self.current = Some(OpenSegment {
                    start,
                    file,
                    window_offset: 0,
                    window: Vec::new(),
                });
                return Ok(true);
            }
            self.short = TailKind::BadSegment;
            return Ok(false);
        };
        if self.geometry.is_none() {
            self.checksum_seed = super::record::checksum_seed(header.log_id);
        }
        let (segment_bytes, log_id) = *self
            .geometry
            .get_or_insert((header.segment_bytes, header.log_id));
        if header.start_lsn != start
            || header.segment_bytes != segment_bytes
            || header.log_id != log_id
        {
            self.short = TailKind::BadSegment;
            return Ok(false);
        }
        if lsn >= start + segment_bytes {
            // The segment that would hold `lsn` does not exist.
            self.short = TailKind::EndOfFiles;
            return Ok(false);
        }
        let file = self
            .fs
            .open(&path, OpenOptions::existing())
            .map_err(|error| WalError::io(format!("opening {}", path.display()), error))?;
        self.current = Some(OpenSegment {
            start,
            file,
            window_offset: 0,
            window: Vec::new(),
        });
        Ok(true)
    }
}

impl Iterator for LogReader {
    type Item = Result<LogEntry, WalError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Where to start reading again to go back through some of the log's records newest first
/// without holding all of them: the LSN of the first record of each chunk of about
/// [`WAL_READ_BACK_CHUNK_BYTES`] of payload among the records noted. The log cannot be read
/// backwards (a record's header says where the next one starts, not where the last one did),
/// and holding every record of a transaction of any size is what a rollback from the log
/// exists to avoid; so each chunk is read forward again, and its records handed out in
/// reverse (see [`read_newest_first`]). The marks take one LSN per chunk.
#[derive(Clone, Debug)]
pub struct ReadBackMarks {
    chunk_bytes: u64,
    /// The LSN of each chunk's first noted record, ascending.
    starts: Vec<Lsn>,
    /// Payload bytes noted in the last chunk.
    last_chunk_bytes: u64,
}

impl Default for ReadBackMarks {
    fn default() -> ReadBackMarks {
        ReadBackMarks::with_chunk_bytes(WAL_READ_BACK_CHUNK_BYTES)
    }
}

impl ReadBackMarks {
    /// Marks for chunks of about `chunk_bytes` of payload (a record larger than that is a chunk
    /// of its own). Tests use small chunks to have many.
    pub fn with_chunk_bytes(chunk_bytes: u64) -> ReadBackMarks {
        ReadBackMarks {
            chunk_bytes: chunk_bytes.max(1),
            starts: Vec::new(),
            last_chunk_bytes: 0,
        }
    }

    /// Notes a record that may be read back: at `lsn`, with `payload_bytes` of payload.
    /// Records must be noted in LSN order; the records a read back keeps must all have been
    /// noted, or a chunk could hold more than the marks know of.
    pub fn note(&mut self, lsn: Lsn, payload_bytes: u64) {
        debug_assert!(self.starts.last().is_none_or(|&last| last <= lsn));
        if self.starts.is_empty() || self.last_chunk_bytes + payload_bytes > self.chunk_bytes {
            self.starts.push(lsn);
            self.last_chunk_bytes = 0;
        }
        self.last_chunk_bytes += payload_bytes;
    }

    /// The first noted record's LSN.
    pub fn first(&self) -> Option<Lsn> {
        self.starts.first().copied()
    }

    /// How many chunks the noted records make.
    pub fn chunks(&self) -> usize {
        self.starts.len()
    }
}

/// Goes through the records of the log in `dir` from the first one `marks` noted to `end` (a
/// record boundary, which must be in the log's files: durable), newest first, handing each
/// that `keep` keeps to `each`. Holds one chunk's kept records at a time (see
/// [`ReadBackMarks`]). A log that ends before `end` is corrupt: the caller knows the records up
/// to it were written.
pub fn read_newest_first<E: From<WalError>>(
    fs: &Arc<dyn FileSystem>,
    dir: &std::path::Path,
    marks: &ReadBackMarks,
    end: Lsn,
    mut keep: impl FnMut(&RawRecord) -> Result<bool, E>,
    mut each: impl FnMut(RawRecord) -> Result<(), E>,
) -> Result<(), E> {
    for (chunk, &from) in marks.starts.iter().enumerate().rev() {
        if from >= end {
            continue;
        }
        let to = marks
            .starts
            .get(chunk + 1)
            .map_or(end, |&next| next.min(end));
        let mut reader = LogReader::open(Arc::clone(fs), dir, from)?;
        let mut kept = Vec::new();
        while reader.position() < to {
            let Some(raw) = reader.next_raw()? else {
                let (lsn, why) = match reader.end() {
                    Some(tail) => (tail.lsn, format!("{:?}", tail.kind)),
                    None => (reader.position(), "no end".to_string()),
                };
                return Err(WalError::Corrupt {
                    lsn,
                    reason: format!(
                        "the log ends here ({why}) while reading back records up to {to}, which \
                         were written"
                    ),
                }
                .into());
            };
            if keep(&raw)? {
                kept.push(raw);
            }
        }
        for raw in kept.into_iter().rev() {
            each(raw)?;
        }
    }
    Ok(())
}
