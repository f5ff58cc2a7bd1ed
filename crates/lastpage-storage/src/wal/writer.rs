//! The log writer: lock-free appends into the log buffer, and leader-based group commit.
//!
//! # Appending
//!
//! [`LogWriter::append`] sizes the record, reserves its bytes with one `fetch_add`, waits for
//! room only if the ring is full (LOGBUFFER), assembles the record in a buffer its thread
//! keeps, computes its CRC in one pass, copies it into the ring a word at a time, and
//! publishes it by storing its first word last; see [`super::buffer`]. No lock is taken on
//! this path.
//!
//! # Group commit: a leader, not a flusher thread
//!
//! A committer calls [`LogWriter::wait_durable`] with the end LSN of its commit record. If that
//! is durable already it returns at once (no wait is recorded). Otherwise it takes the group
//! mutex and either becomes the *leader*, if nobody is, or parks until a leader wakes it. The
//! leader, without holding the group mutex, walks the completed prefix of the buffer, writes all
//! of it with one `write_all_at` and makes it durable with one `sync_data`, advances the durable
//! LSN, and then wakes every parked committer whose LSN is now durable, plus one of the rest to
//! lead the next round. Whoever arrives while a flush is in progress piles up behind it and is
//! served by the next one: that is the group.
//!
//! Why a leader rather than a dedicated flusher thread: the committer that leads was going to block
//! for the flush anyway, so it does the I/O itself and the flush starts without a wake-up of
//! another thread (one context switch fewer per group on the path that decides commit latency; on
//! two cores with a hundred sessions the flusher thread would also compete for a core with the
//! sessions it serves). There is no thread to start, stop or lose, an I/O error is seen by a thread
//! that can report it, and the writer can be model-checked with loom, which needs every thread to
//! finish. DELAYED durability adds a background flusher in the engine (a loop around
//! [`LogWriter::flush_in_background`], whose time is not counted as WRITELOG), which only adds
//! flushes: committers still lead their own. PostgreSQL's WAL flush works the same way (whoever
//! holds `WALWriteLock` flushes for everyone); SQL Server uses a log writer thread.
//!
//! With many committers waiting at once (`WalConfig::yield_wait_committers`), a committer that
//! finds a leader flushing first yields the processor until its LSN is durable, instead of
//! parking; see `LogWriter::yield_while_led`.
//!
//! If the leader finds the prefix stuck behind a record still being copied, it parks until the
//! next completion instead of polling (see the `STALLED` protocol in [`super::buffer`]).
//!
//! # Failure
//!
//! If a write or `sync_data` fails (including `ENOSPC`), the writer becomes failed: every parked
//! waiter gets [`WalError::Failed`], every later append gets it, and so does every wait for an
//! LSN that was not durable before the failure. The write is not retried: after a failed
//! `fdatasync` Linux may have dropped the data and would report the next one as a success, so a
//! retry could acknowledge a commit that is not on disk. A wait for an LSN that *was* durable
//! before the failure still returns `Ok`, because that is true. An append whose record is
//! completed after the failure fails too, although it passed the check before its copy: its
//! record will never be written (see `FAILED` in [`super::buffer`]).
//!
//! # Segments
//!
//! A flush that crosses into a new segment creates it (directory synced, then header written and
//! synced) and syncs the bytes of the old segment before writing the new one, so that durable
//! bytes in a segment imply a durable log before it; such a flush does three writes (the old
//! segment's bytes, the new header, the new segment's bytes) and three fdatasyncs, plus an fsync
//! of the directory. The new segment's file is the one a background thread prepared
//! (zero-filled, reserved, or recycled from a spare, and synced) if it is ready, so that no
//! flush into it extends the file; see `super::prepare`.

use std::cell::Cell;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc as StdArc;
use std::sync::atomic::AtomicU64 as Counter;
use std::sync::atomic::Ordering::Relaxed;

use crossbeam_utils::CachePadded;
use lastpage_io::{File, FileSystem, OpenOptions};

use super::buffer::LogBuffer;
use super::prepare::{Prepared, SegmentPreparer, SegmentRecycler, remove_leftovers};
use super::reader::{self, LogReader, TailKind};
use super::record::{self, Record};
use super::segment::{self, HEADER_BYTES, SegmentHeader};
use super::{Lsn, TruncationError, WalConfig, WalError, align_up};
use crate::latch::{Waiter, current_waiter};
use crate::limits::{
    WAL_KEPT_RECORD_IMAGE_BYTES, WAL_MAX_START_LSN, WAL_PREALLOCATE_BYTES,
    WAL_PREPARE_AT_SEGMENT_PERCENT, WAL_READ_CHUNK_BYTES, WAL_RECORD_ALIGN_BYTES,
    WAL_RESERVE_FLUSH_BYTES, WAL_YIELD_WAIT_MAX_NS,
};
use crate::scratch::with_scratch;
use crate::stats::{self, WaitType};
use crate::sync::{self, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

thread_local! {
    /// Where [`LogWriter::append_at`] assembles a record: kept per thread (see
    /// [`with_scratch`]) so that an append neither allocates nor zeroes a buffer.
    static RECORD_IMAGE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A source of zeros for preallocating segment files.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Counters of a [`LogWriter`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended (completed in the buffer).
    pub appended_records: u64,
    /// Bytes reserved by appends, padding included.
    pub appended_bytes: u64,
    /// Flushes (rounds of a leader that wrote something).
    pub flushes: u64,
    /// `sync_data` calls on log segments (one per flush, more when a flush crosses into a new
    /// segment).
    pub fsyncs: u64,
    /// Records written by flushes.
    pub flushed_records: u64,
    /// Bytes written by flushes.
    pub flushed_bytes: u64,
    /// `wait_durable` calls that returned `Ok`: commits made durable.
    pub commits: u64,
    /// Waits for a durable log end (commits, and the other waits for durability: rollbacks,
    /// schema changes, identity reservations, forced flushes) that yielded the processor
    /// rather than parking (see [`WalConfig::yield_wait_committers`]). Not a subset of
    /// `commits`.
    pub yielding_waits: u64,
    /// Segments that began as a file prepared in the background (no zero-fill on any flush),
    /// recycled ones included.
    pub prepared_segments: u64,
    /// Of those, segments that began as a recycled one (a spare: no zeros written at all).
    pub recycled_segments: u64,
    /// Of those, segments whose space was reserved without writing it, because the flushes of
    /// the segment before them were large (see `WAL_RESERVE_FLUSH_BYTES`).
    pub reserved_segments: u64,
    /// Segment files a truncation kept as spares instead of removing them.
    pub spared_segments: u64,
    /// Spare segment files an earlier writer left (and its prepared file) that this writer
    /// adopted when it was opened, to be recycled like its own spares (see `wal/prepare.rs`).
    pub adopted_spares: u64,
    /// Background preparations of a segment file that failed (each only means that a segment
    /// was created inline instead).
    pub segment_preparation_failures: u64,
    /// The durable LSN when the counters were read.
    pub durable_lsn: Lsn,
}

impl WalStats {
    /// Commits acknowledged per `sync_data`: the group commit factor.
    pub fn commits_per_fsync(&self) -> f64 {
        self.commits as f64 / self.fsyncs.max(1) as f64
    }

    /// Records written per flush.
    pub fn records_per_flush(&self) -> f64 {
        self.flushed_records as f64 / self.flushes.max(1) as f64
    }
}

/// What a blocked thread waits for.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The durable LSN to reach this LSN (a commit).
    Durable(u64),
    /// The buffer's released LSN to reach this LSN (room for a reserved record).
    Space(u64),
}

fn signal_all(waiters: Vec<Arc<Waiter>>) {
    if waiters.is_empty() {
        return;
    }
    let now = stats::now_ns();
    for waiter in waiters {
        waiter.signal(now);
    }
}

/// A parked committer or appender.
struct Parked {
    target: Target,
    waiter: Arc<Waiter>,
}

/// What the group mutex protects. It is taken only by threads that are about to block, by the
/// leader when it hands out wake-ups, by an appender that must wake a stalled leader, and to
/// read or record a failure.
struct Group {
    /// Parked threads.
    waiters: Vec<Parked>,
    /// The leader, when it is parked waiting for a record to be completed.
    stalled: Option<Arc<Waiter>>,
    /// The failure, once the writer is failed.
    error: Option<WalError>,
}

/// What only the leader touches: the files and the scratch space of a flush.
struct FlushIo {
    fs: StdArc<dyn FileSystem>,
    /// The log directory; shared so that a flush can keep it for an error message without
    /// copying the path.
    dir: StdArc<Path>,
    segment_bytes: u64,
    log_id: u64,
    /// The segment being written: its start LSN and file.
    current: Option<(u64, Box<dyn File>)>,
    /// The bytes of the flush being written.
    scratch: Vec<u8>,
    /// How far (a file offset) the segment starting at `zeroed_to_segment` is known to be
    /// written or zero-filled.
    zeroed_to: u64,
    zeroed_to_segment: u64,
    /// LSNs of the records in the flush being written.
    starts: Vec<u64>,
    /// Prepares the next segment file in the background (zero-filled, reserved or recycled; if
    /// the configuration asks for it).
    preparer: Option<SegmentPreparer>,
    /// The start LSN of the segment for whose successor a file was last requested.
    prepare_requested_for: u64,
    /// Writes into the current segment, and their bytes, since it became current (or since the
    /// writer was opened): the mean size of its flushes, which decides how its successor is
    /// prepared.
    writes_into_segment: u64,
    bytes_into_segment: u64,
}

/// Plain statistics counters, not part of any protocol.
#[derive(Default)]
struct Counters {
    flushes: Counter,
    fsyncs: Counter,
    flushed_records: Counter,
    flushed_bytes: Counter,
    commits: Counter,
    /// Records the last flush wrote.
    last_flush_records: Counter,
    yielding_waits: Counter,
    prepared_segments: Counter,
    recycled_segments: Counter,
    reserved_segments: Counter,
    spared_segments: Counter,
    adopted_spares: Counter,
    /// Shared with the segment preparer, which counts its failures here.
    preparation_failures: StdArc<Counter>,
}

/// The write-ahead log writer. Share it between threads with an `Arc`; every method takes
/// `&self`.
///
/// Dropping the writer does not flush: whatever was appended but not made durable is lost, as
/// it would be in a crash. Call [`LogWriter::flush_now`] first for a clean shutdown.
pub struct LogWriter {
    buffer: LogBuffer,
    /// End of the durable prefix of the log.
    durable: CachePadded<AtomicU64>,
    /// Set once `group.error` is; lets appends and waits fail without the mutex.
    failed: AtomicBool,
    /// A leader is flushing (or about to). Changed only with the group mutex held, which is
    /// what decides who leads; a yielding committer also reads it without the mutex, as a hint
    /// that a flush is under way (see [`LogWriter::yield_while_led`]).
    leading: AtomicBool,
    /// Committers inside `wait_for` (yielding, parked or leading); counted only when
    /// `yield_wait_committers` is not 0.
    waiting_committers: CachePadded<AtomicU64>,
    /// [`WalConfig::yield_wait_committers`].
    yield_wait_committers: usize,
    group: Mutex<Group>,
    io: Mutex<FlushIo>,
    max_record: usize,
    /// Where the log ended when the writer was opened.
    start: u64,
    counters: Counters,
    /// Keeps segments a truncation no longer needs as spares (with a segment preparer).
    recycler: Option<SegmentRecycler>,
    /// Where every record checksum of this log starts ([`record::checksum_seed`]).
    checksum_seed: u32,
    /// The file system and directory of the log, for reading records back
    /// ([`LogWriter::read_back_newest_first`]); the flush's own are behind its mutex.
    read_back: (StdArc<dyn FileSystem>, StdArc<Path>),
}

impl fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogWriter")
            .field("start", &self.start)
            .field("reserved", &self.buffer.reserved())
            .field("durable", &self.durable.load(Ordering::Relaxed))
            .field("failed", &self.failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl LogWriter {
    /// Opens the log in `dir` for appending, creating it if there is none.
    ///
    /// An existing log is read from the last segment's first record to its end (the first
    /// invalid record: a torn tail after a crash), and everything after the end is cut off —
    /// the segment holding the end is truncated there and later segments are removed, durably —
    /// before anything is appended. Without that, a new record shorter than the torn one it
    /// replaces could leave stale but valid-looking records of the old tail right behind it.
    pub fn open(
        fs: StdArc<dyn FileSystem>,
        dir: impl Into<PathBuf>,
        config: WalConfig,
    ) -> Result<LogWriter, WalError> {
        LogWriter::open_expecting(fs, dir, config, None)
    }

    /// [`LogWriter::open`] for a log that recovery has just read: the end the writer finds must
    /// be the one recovery found, and at least the checkpoint's LSN, or the open fails with
    /// [`WalError::Corrupt`] before anything is cut off. A log that a crash left behind always
    /// agrees; one that disagrees lost a segment, or has damage that is not a torn tail (a bad
    /// header or record with valid log after it), and appending to it would bury acknowledged
    /// commits behind new records, or write new ones below the checkpoint where the next
    /// recovery would skip them.
    pub fn open_expecting(
        fs: StdArc<dyn FileSystem>,
        dir: impl Into<PathBuf>,
        config: WalConfig,
        expected: Option<ExpectedEnd>,
    ) -> Result<LogWriter, WalError> {
        config.validate()?;
        let dir = dir.into();
        // The directory's own entry must be durable too, or a crash could take every segment
        // with it.
        lastpage_io::create_dir_all_durable(fs.as_ref(), &dir).map_err(|error| {
            WalError::io(format!("creating and syncing {}", dir.display()), error)
        })?;
        let recovered = recover_end(&fs, &dir, &config, expected)?;
        let dir: StdArc<Path> = StdArc::from(dir);
        let counters = Counters::default();
        let preparer = config.prepare_segments.then(|| {
            SegmentPreparer::new(
                StdArc::clone(&fs),
                StdArc::clone(&dir),
                HEADER_BYTES + recovered.segment_bytes,
                StdArc::clone(&counters.preparation_failures),
                &counters.adopted_spares,
            )
        });
        if preparer.is_none() {
            remove_leftovers(fs.as_ref(), &dir, &counters.preparation_failures);
        }
        let recycler = preparer.as_ref().map(SegmentPreparer::recycler);
        Ok(LogWriter {
            buffer: LogBuffer::new(config.buffer_bytes, recovered.end),
            durable: CachePadded::new(AtomicU64::new(recovered.end)),
            failed: AtomicBool::new(false),
            leading: AtomicBool::new(false),
            waiting_committers: CachePadded::new(AtomicU64::new(0)),
            yield_wait_committers: config.yield_wait_committers,
            group: Mutex::new(Group {
                waiters: Vec::new(),
                stalled: None,
                error: None,
            }),
            read_back: (StdArc::clone(&fs), StdArc::clone(&dir)),
            io: Mutex::new(FlushIo {
                fs,
                dir,
                segment_bytes: recovered.segment_bytes,
                log_id: recovered.log_id,
                current: recovered.current,
                scratch: Vec::new(),
                zeroed_to: 0,
                zeroed_to_segment: u64::MAX,
                starts: Vec::new(),
                preparer,
                prepare_requested_for: u64::MAX,
                writes_into_segment: 0,
                bytes_into_segment: 0,
            }),
            max_record: config.max_record_bytes(),
            start: recovered.end,
            counters,
            recycler,
            checksum_seed: record::checksum_seed(recovered.log_id),
        })
    }

    /// Where the log ended when the writer was opened: the LSN of the first record it appends.
    pub fn start_lsn(&self) -> Lsn {
        Lsn(self.start)
    }

    /// The largest record (header and payload, in bytes) [`LogWriter::append`] accepts.
    pub fn max_record_bytes(&self) -> usize {
        self.max_record
    }

    /// Goes back through records this writer's log holds, newest first, up to `end` (a record
    /// boundary it handed out), as [`reader::read_newest_first`] does: first it waits until
    /// the log is durable up to `end` (WRITELOG), since records still in the buffer are not in
    /// the files yet. For a rollback of changes no longer in memory; the caller must keep the
    /// records from being truncated away (a transaction's are kept while it is active).
    pub fn read_back_newest_first<E: From<WalError>>(
        &self,
        marks: &reader::ReadBackMarks,
        end: Lsn,
        keep: impl FnMut(&reader::RawRecord) -> Result<bool, E>,
        each: impl FnMut(reader::RawRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        self.wait_until_durable(end)?;
        let (fs, dir) = &self.read_back;
        reader::read_newest_first(fs, dir, marks, end, keep, each)
    }

    /// The end of the durable prefix of the log.
    pub fn durable_lsn(&self) -> Lsn {
        Lsn(self.durable.load(Ordering::Acquire))
    }

    /// The end of everything appended so far (durable or not).
    pub fn end_lsn(&self) -> Lsn {
        Lsn(self.buffer.reserved())
    }

    /// Whether the writer has failed.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The failure, if the writer has failed.
    pub fn failure(&self) -> Option<WalError> {
        if !self.is_failed() {
            return None;
        }
        sync::lock(&self.group).error.clone()
    }

    fn error(&self) -> WalError {
        self.failure().expect("the writer is failed")
    }

    /// The counters so far.
    pub fn stats(&self) -> WalStats {
        WalStats {
            appended_records: self.buffer.completed_records(),
            appended_bytes: self.buffer.reserved() - self.start,
            flushes: self.counters.flushes.load(Relaxed),
            fsyncs: self.counters.fsyncs.load(Relaxed),
            flushed_records: self.counters.flushed_records.load(Relaxed),
            flushed_bytes: self.counters.flushed_bytes.load(Relaxed),
            commits: self.counters.commits.load(Relaxed),
            yielding_waits: self.counters.yielding_waits.load(Relaxed),
            prepared_segments: self.counters.prepared_segments.load(Relaxed),
            recycled_segments: self.counters.recycled_segments.load(Relaxed),
            reserved_segments: self.counters.reserved_segments.load(Relaxed),
            spared_segments: self.counters.spared_segments.load(Relaxed),
            adopted_spares: self.counters.adopted_spares.load(Relaxed),
            segment_preparation_failures: self.counters.preparation_failures.load(Relaxed),
            durable_lsn: self.durable_lsn(),
        }
    }

    /// Appends a record and returns its end LSN (what to pass to [`LogWriter::wait_durable`]).
    /// Waits (LOGBUFFER) only if the log buffer is full.
    pub fn append(&self, record: &Record<'_>) -> Result<Lsn, WalError> {
        Ok(self.append_at(record)?.1)
    }

    /// Appends a record and returns its LSN and its end LSN.
    pub fn append_at(&self, record: &Record<'_>) -> Result<(Lsn, Lsn), WalError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.error());
        }
        let payload_len = record.payload_len();
        let total = record.total_len();
        if total > self.max_record {
            return Err(WalError::RecordTooLarge {
                len: total,
                max: self.max_record,
            });
        }
        let reservation = self.buffer.reserve(align_up(total) as u64);
        if !self.buffer.has_space(&reservation) {
            self.wait_for(
                Target::Space(self.buffer.space_needed(&reservation)),
                Some(WaitType::LogBuffer),
            )?;
        }
        // The LSN is part of the header and so of the CRC: both are known only now. The record
        // is assembled in one piece, in a buffer the thread keeps, so that the CRC is one call
        // over contiguous bytes and the copy into the ring moves whole words: feeding the pieces
        // separately to both costs more than the extra copy.
        let header = record::header_without_crc(record.kind(), Lsn(reservation.start), payload_len);
        let (start, end) = (reservation.start, reservation.end);
        let completion = with_scratch(&RECORD_IMAGE, WAL_KEPT_RECORD_IMAGE_BYTES, |image| {
            image.reserve_exact(total);
            image.extend_from_slice(&header);
            record.write_payload(&mut |piece| image.extend_from_slice(piece));
            debug_assert_eq!(
                image.len(),
                total,
                "payload_len disagrees with write_payload"
            );
            let crc = crc32c::crc32c_append(self.checksum_seed, &image[4..]);
            image[0..4].copy_from_slice(&crc.to_le_bytes());
            let first_word = u64::from_le_bytes(image[0..8].try_into().expect("8 bytes"));
            let mut writer = self.buffer.writer(reservation, first_word);
            writer.put(&image[8..]);
            writer.complete()
        });
        if completion.wake_stalled_leader {
            self.wake_stalled_leader();
        }
        if completion.after_failure {
            // The writer failed between the check above and this completion, and flushes
            // nothing any more: this record will never be written. Reporting success would
            // acknowledge a DELAYED commit (which waits for nothing after its append) that no
            // log holds, while every other commit is refused; so the append fails like any
            // after the failure. Which side of the failure a record is on is decided by the
            // completion's read-modify-write of the progress word, which the failure also
            // changes (`LogBuffer::mark_failed`).
            return Err(self.error());
        }
        Ok((Lsn(start), Lsn(end)))
    }

    /// Waits until the log is durable up to `lsn` (an end LSN from [`LogWriter::append`]).
    ///
    /// Returns at once if it is; otherwise records a WRITELOG wait and either leads a flush or
    /// parks until one covers `lsn`. Fails with [`WalError::Failed`] if the writer fails before
    /// `lsn` is durable.
    pub fn wait_durable(&self, lsn: Lsn) -> Result<(), WalError> {
        self.wait_until_durable(lsn)?;
        self.counters.commits.fetch_add(1, Relaxed);
        Ok(())
    }

    /// [`LogWriter::wait_durable`] for a record that is not a commit (an identity reservation
    /// a statement must not hand values out ahead of): the same wait, not counted as a commit,
    /// so that commits per fdatasync stays a figure about commits.
    pub fn wait_until_durable(&self, lsn: Lsn) -> Result<(), WalError> {
        if lsn.0 > self.durable.load(Ordering::Acquire) {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.error());
            }
            let end = self.buffer.reserved();
            if lsn.0 > end {
                return Err(WalError::BeyondEnd { lsn, end: Lsn(end) });
            }
            self.wait_for(Target::Durable(lsn.0), Some(WaitType::WriteLog))?;
        }
        Ok(())
    }

    /// Removes segment files that only hold log before `lsn` (what a checkpoint no longer
    /// needs: recovery starts at or after it), keeping some as spares to become later segments
    /// (see `wal/prepare.rs`). Returns how many segments it removed or kept as spares; a
    /// failure says how many it had removed before it stopped.
    ///
    /// Opening the log reads from the record holding the last segment's first byte, which may
    /// start segments before `lsn` when records are longer than a segment: so everything from
    /// the segment holding the first record of `lsn`'s segment (its header says where that
    /// record starts) is kept too. A later segment's first record starts at or after `lsn`,
    /// which is a record boundary. The segment being written is never removed. A removal lost
    /// in a crash only leaves an old file behind, which recovery never reads, so the directory
    /// is not synced.
    ///
    /// The files are removed without the flush mutex held: unlinking a large file can take tens
    /// of milliseconds, and every commit would wait for it. Only segments before the current
    /// one are removed, and flushes only ever write the current segment or create later ones.
    pub fn remove_segments_before(&self, lsn: Lsn) -> Result<usize, TruncationError> {
        let mut removed = 0;
        self.remove_segments_counted(lsn, &mut removed)
            .map(|()| removed)
            .map_err(|source| TruncationError { removed, source })
    }

    /// [`LogWriter::remove_segments_before`], counting the segments removed in `removed`.
    fn remove_segments_counted(&self, lsn: Lsn, removed: &mut usize) -> Result<(), WalError> {
        let (fs, segments, current, segment_bytes) = {
            let io = sync::lock(&self.io);
            let current = io.current.as_ref().map(|(start, _)| *start);
            (
                StdArc::clone(&io.fs),
                segment::list(io.fs.as_ref(), &io.dir)?,
                current,
                io.segment_bytes,
            )
        };
        let mut holder = lsn.0 - lsn.0 % segment_bytes;
        if holder > 0 && !segments.iter().any(|(start, _)| *start == holder) {
            // `lsn` is the start of a segment not created yet (the log ends exactly at a
            // segment boundary): the last segment is the one before, and an open reads the
            // log from its first record, which may start in the segment before it. Keeping
            // only that last segment left a log that no longer opened.
            holder -= segment_bytes;
        }
        let holder_header = match segments.iter().find(|(start, _)| *start == holder) {
            Some((_, path)) => segment::read_header(fs.as_ref(), path)?,
            None => None,
        };
        let keep_from = match holder_header {
            Some(header) if header.start_lsn == holder => header.first_record_lsn.min(lsn.0),
            // No readable header to say where its first record starts: keep the segment
            // before it as well, where a record no longer than a segment starts.
            _ => holder.saturating_sub(segment_bytes),
        };
        let keep_start = keep_from - keep_from % segment_bytes;
        for (start, path) in &segments {
            if *start >= keep_start || current.is_some_and(|current| *start >= current) {
                break;
            }
            if self
                .recycler
                .as_ref()
                .is_some_and(|recycler| recycler.offer(path))
            {
                self.counters.spared_segments.fetch_add(1, Relaxed);
            } else {
                fs.remove(path)
                    .map_err(|error| WalError::io(format!("removing {}", path.display()), error))?;
            }
            *removed += 1;
        }
        Ok(())
    }

    /// Makes everything appended so far durable and returns the durable LSN. The caller's
    /// time waiting for the flush is a WRITELOG wait.
    pub fn flush_now(&self) -> Result<Lsn, WalError> {
        self.flush_everything(Some(WaitType::WriteLog))
    }

    /// [`LogWriter::flush_now`] for a background log flusher: the same, except that its time
    /// is not recorded as a wait. It is the log writer's own work, not a task waiting for the
    /// log (SQL Server's log writer does not count WRITELOG either), and counting it would
    /// make the committers' WRITELOG figures include time nobody waited.
    pub fn flush_in_background(&self) -> Result<Lsn, WalError> {
        self.flush_everything(None)
    }

    fn flush_everything(&self, wait_type: Option<WaitType>) -> Result<Lsn, WalError> {
        let target = self.buffer.reserved();
        if target > self.durable.load(Ordering::Acquire) {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.error());
            }
            self.wait_for(Target::Durable(target), wait_type)?;
        }
        Ok(self.durable_lsn())
    }

    fn satisfied(&self, target: Target) -> bool {
        match target {
            Target::Durable(lsn) => self.durable.load(Ordering::Acquire) >= lsn,
            Target::Space(lsn) => self.buffer.released() >= lsn,
        }
    }

    /// Blocks until `target` is met, leading flushes when nobody else does. The caller has
    /// checked that it is not met yet, so this records a wait of `wait_type` (if it is given).
    fn wait_for(&self, target: Target, wait_type: Option<WaitType>) -> Result<(), WalError> {
        let wait = wait_type.map(|wait_type| stats::begin_wait(wait_type, None));
        // Only commits yield: an appender waiting for room (LOGBUFFER) is rare, and the
        // leader it waits for needs the processor more than other appenders do.
        // With yielding off (0) nobody counts, so the shared counter costs nothing.
        let committing = self.yield_wait_committers > 0 && matches!(target, Target::Durable(_));
        if committing {
            let waiting = self.waiting_committers.fetch_add(1, Ordering::Relaxed) + 1;
            if waiting >= self.yield_wait_committers as u64 && self.yield_while_led(target) {
                self.waiting_committers.fetch_sub(1, Ordering::Relaxed);
                self.counters.yielding_waits.fetch_add(1, Relaxed);
                if let Some(wait) = wait {
                    wait.end(None);
                }
                return Ok(());
            }
        }
        let waiter = current_waiter();
        let mut signalled_ns = None;
        let result = loop {
            let mut group = sync::lock(&self.group);
            if self.satisfied(target) {
                break Ok(());
            }
            if let Some(error) = &group.error {
                break Err(error.clone());
            }
            if !self.leading.load(Ordering::Relaxed) {
                self.leading.store(true, Ordering::Relaxed);
                drop(group);
                // A committer woken to lead runs its own flush now: its signal wait (from the
                // wake-up to running again) ended when it took the lead, and must not take in
                // its own write and fdatasync.
                signalled_ns = None;
                self.lead(target, &waiter);
                continue;
            }
            waiter.prepare();
            group.waiters.push(Parked {
                target,
                waiter: Arc::clone(&waiter),
            });
            drop(group);
            signalled_ns = Some(waiter.wait());
        };
        if committing {
            self.waiting_committers.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(wait) = wait {
            wait.end(signalled_ns);
        }
        result
    }

    /// Waits for `target` by yielding the processor for as long as a leader is flushing, up to
    /// `WAL_YIELD_WAIT_MAX_NS`; returns whether the target was met. On `false` the caller goes on
    /// to lead or park as usual.
    ///
    /// Why: parking costs every commit a futex wake-up from the leader and a wake-up of the
    /// sleeping thread (one context switch in, with the scheduler's wake-up path in front of it).
    /// With more committers waiting than processors, a yield hands the processor straight
    /// to another committer that has work, and a committer whose commit the flush made durable
    /// sees it at its next turn without anyone waking it. Below that many committers the yields
    /// would only burn processors that the leader's I/O completion needs, so they park. MySQL's
    /// redo log waits the same way (`innodb_log_spin_cpu_abs_lwm`: spin while processors are
    /// busy, else sleep).
    ///
    /// Yields have a cost too: at 100 committers on 2 vCPUs a commit is scheduled about 2.3
    /// times (once with work, the rest to find its flush not done), and scheduling is most of
    /// the CPU time. Three ways to spend less were measured against it (`bench insert --threads
    /// 100 --rows-per-thread 6000 --durability full`, interleaved; 252k–367k rows/s as it is in
    /// the same series) and none won on that VM, where waking a thread on the other CPU is an
    /// inter-processor interrupt and a VM exit:
    /// - sleeping on one futex word that each flush bumps and wakes in one `FUTEX_WAKE`: 1.2
    ///   switches per commit, but the wake of about 44 sleepers cost the leader 213 µs per
    ///   flush: 130k–192k rows/s;
    /// - a timed sleep (`nanosleep`, 20–100 µs) for a commit past the flush in progress:
    ///   45k–158k rows/s;
    /// - flushing without the leader's yield once 30 records are pending, so that the next
    ///   group appends during the flush: groups of 38 commits, 286k–289k rows/s (at 50 or 70
    ///   pending, groups grew back to 68–86 and it measured the same as yielding).
    ///
    /// What bounds it: a committer's CPU time is one turn with work (its insert, its record and
    /// one switch) plus one futile turn for every time the round of all runnable committers
    /// comes back to it before its flush is done, so about (time from append to durable) ÷
    /// (round). At 100 committers the round is about as long as the flush it waits for
    /// (130–210 µs against 103–118 µs, plus the rest of the gathering round), which makes the
    /// 1.3 futile turns per commit; at 300 committers the round is three times longer and
    /// most commits find their flush done at their next turn (52× SQLite where 100 threads
    /// gave 37–44×). A futile turn costs about what a futex sleep and wake-up cost instead, so
    /// only a shorter flush or cheaper context switches would lower it.
    fn yield_while_led(&self, target: Target) -> bool {
        let deadline_ns = stats::now_ns().saturating_add(WAL_YIELD_WAIT_MAX_NS);
        let mut yields = 0u32;
        loop {
            if self.satisfied(target) {
                return true;
            }
            if !self.leading.load(Ordering::Relaxed) || self.failed.load(Ordering::Acquire) {
                return false;
            }
            sync::yield_now();
            yields += 1;
            // Loom explores every interleaving of each yield, and needs a model whose choices
            // do not depend on the clock: there a few yields stand for the time limit.
            let gave_up = if cfg!(loom) {
                yields >= 3
            } else {
                stats::now_ns() > deadline_ns
            };
            if gave_up {
                return false;
            }
        }
    }

    /// Flushes rounds until `target` is met or the writer fails, then gives up leadership.
    fn lead(&self, target: Target, waiter: &Arc<Waiter>) {
        loop {
            // Group commit on few cores: the committers the last flush woke need the CPU to
            // append their next commits. Yielding once before flushing lets every runnable one
            // do so, so the flush carries them all instead of the first few (PostgreSQL's
            // commit_delay and MySQL's binlog_group_commit_sync_delay sleep for the same
            // reason; a yield waits only as long as there is work to let through).
            if self.counters.last_flush_records.load(Relaxed) > 1 {
                sync::yield_now();
            }
            let seen = self.buffer.progress();
            match self.flush_round() {
                Err(error) => {
                    self.fail(error);
                    return;
                }
                Ok(advanced) => {
                    if self.satisfied(target) {
                        break;
                    }
                    if advanced {
                        self.wake_ready();
                    } else {
                        self.wait_for_completion(seen, waiter);
                    }
                }
            }
        }
        self.resign();
    }

    /// One flush: write the completed prefix of the buffer and make it durable. Returns whether
    /// there was anything to write.
    fn flush_round(&self) -> Result<bool, WalError> {
        let mut io = sync::lock(&self.io);
        let io = &mut *io;
        let from = self.buffer.released();
        io.starts.clear();
        let to = self.buffer.completed_prefix(from, &mut io.starts);
        if to == from {
            return Ok(false);
        }
        io.scratch.clear();
        self.buffer.copy_out(from, to, &mut io.scratch);
        io.write_out(from, &self.counters)?;
        // Zero and release before publishing durability: a committer woken by the durable LSN
        // may append at once, and must find room.
        self.buffer.release(from, to);
        self.durable.store(to, Ordering::Release);
        self.counters.flushes.fetch_add(1, Relaxed);
        self.counters
            .flushed_records
            .fetch_add(io.starts.len() as u64, Relaxed);
        self.counters
            .last_flush_records
            .store(io.starts.len() as u64, Relaxed);
        self.counters.flushed_bytes.fetch_add(to - from, Relaxed);
        Ok(true)
    }

    /// Moves the waiters whose target is met from the group to `wake`.
    fn take_ready(&self, group: &mut Group, wake: &mut Vec<Arc<Waiter>>) {
        group.waiters.retain(|parked| {
            if self.satisfied(parked.target) {
                wake.push(Arc::clone(&parked.waiter));
                false
            } else {
                true
            }
        });
    }

    /// Wakes the waiters a flush satisfied (while the leader goes on leading).
    fn wake_ready(&self) {
        let mut wake = Vec::new();
        self.take_ready(&mut sync::lock(&self.group), &mut wake);
        signal_all(wake);
    }

    /// Gives up leadership: wakes the satisfied waiters, and one of the others to lead next.
    fn resign(&self) {
        let mut wake = Vec::new();
        {
            let mut group = sync::lock(&self.group);
            self.leading.store(false, Ordering::Relaxed);
            self.take_ready(&mut group, &mut wake);
            if !group.waiters.is_empty() {
                wake.push(group.waiters.remove(0).waiter);
            }
        }
        signal_all(wake);
    }

    /// Enters the failed state and fails every parked waiter.
    fn fail(&self, error: WalError) {
        let wake: Vec<Arc<Waiter>> = {
            let mut group = sync::lock(&self.group);
            if group.error.is_none() {
                group.error = Some(error);
            }
            self.failed.store(true, Ordering::Release);
            // After the flag and the error, so that an appender whose completion sees the
            // mark also finds the error (its read-modify-write reads this one's value, which
            // orders both stores before whatever it does next). Nothing is flushed after
            // this: the leader fails here and gives up, and no thread leads once the group
            // holds an error.
            self.buffer.mark_failed();
            self.leading.store(false, Ordering::Relaxed);
            group
                .waiters
                .drain(..)
                .map(|parked| parked.waiter)
                .collect()
        };
        signal_all(wake);
    }

    /// Parks the leader until a record is completed after `seen` (a value of the buffer's
    /// progress word read before the walk that found nothing to flush).
    fn wait_for_completion(&self, seen: u64, waiter: &Arc<Waiter>) {
        waiter.prepare();
        sync::lock(&self.group).stalled = Some(Arc::clone(waiter));
        if self.buffer.mark_stalled(seen) {
            // A record was completed since the walk: walk again rather than wait. If an appender
            // already took the leader out of the slot, its signal is on the way and must be
            // consumed here, or it would cut short a later wait.
            let mut group = sync::lock(&self.group);
            if group.stalled.take().is_some() {
                self.buffer.clear_stalled();
                return;
            }
        }
        waiter.wait();
    }

    /// Called by an appender that completed a record and saw the stalled bit.
    fn wake_stalled_leader(&self) {
        let stalled = {
            let mut group = sync::lock(&self.group);
            // The bit is cleared even when no leader is registered: then it is stale, and would
            // send every append through this mutex until the next stall. That happens when an
            // appender that saw the bit of an earlier stall wakes late: it takes the leader's
            // next registration before the leader sets the bit for it, and the bit the leader
            // then sets outlives the wake-up. With the group mutex held, no registration is in
            // the slot, so no parked leader relies on the bit: a leader registers under this
            // mutex and sets the bit after it (so after this clear), and one whose registration
            // was taken has a signal on its way and waits for nothing else.
            self.buffer.clear_stalled();
            group.stalled.take()
        };
        if let Some(waiter) = stalled {
            waiter.signal(stats::now_ns());
        }
    }
}

impl FlushIo {
    /// Writes `self.scratch`, the log bytes from LSN `from` on, into the segments, syncing each
    /// segment before the next is written.
    fn write_out(&mut self, from: u64, counters: &Counters) -> Result<(), WalError> {
        let bytes = std::mem::take(&mut self.scratch);
        let result = self.write_pieces(from, &bytes, counters);
        self.scratch = bytes;
        result
    }

    fn write_pieces(
        &mut self,
        from: u64,
        bytes: &[u8],
        counters: &Counters,
    ) -> Result<(), WalError> {
        let durable = Lsn(from);
        let mut position = from;
        let mut offset = 0;
        while offset < bytes.len() {
            let segment_start = position - position % self.segment_bytes;
            let length = ((segment_start + self.segment_bytes - position) as usize)
                .min(bytes.len() - offset);
            self.open_segment(segment_start, durable, counters)?;
            let zeroed_to = if self.zeroed_to_segment == segment_start {
                self.zeroed_to
            } else {
                0
            };
            let segment_file_bytes = HEADER_BYTES + self.segment_bytes;
            // The segment's path is only for error messages: it is built when one is, not on
            // every flush (formatting it cost as much as the rest of a small flush's user time).
            let dir = StdArc::clone(&self.dir);
            let path = || dir.join(segment::file_name(segment_start));
            let file = self.current.as_ref().expect("just opened").1.as_ref();
            let write_error = |error| {
                failed(
                    format!("writing log segment {}", path().display()),
                    durable,
                    error,
                )
            };
            let file_offset = HEADER_BYTES + (position - segment_start);
            let write_end = file_offset + length as u64;
            file.write_all_at(file_offset, &bytes[offset..offset + length])
                .map_err(write_error)?;
            // Extend the file with zeros well past what is written, once per
            // WAL_PREALLOCATE_BYTES: an fdatasync of a file whose size did not change has no
            // metadata to commit, which makes most flushes markedly cheaper (as PostgreSQL
            // zero-fills its WAL segments). Zeros read back as the end of the log.
            let mut new_zeroed_to = zeroed_to.max(write_end);
            if write_end > zeroed_to {
                let target = (write_end + WAL_PREALLOCATE_BYTES).min(segment_file_bytes);
                while new_zeroed_to < target {
                    let piece = (target - new_zeroed_to).min(ZEROS.len() as u64) as usize;
                    file.write_all_at(new_zeroed_to, &ZEROS[..piece])
                        .map_err(write_error)?;
                    new_zeroed_to += piece as u64;
                }
            }
            file.sync_data().map_err(|error| {
                failed(
                    format!("fdatasync of log segment {}", path().display()),
                    durable,
                    error,
                )
            })?;
            self.zeroed_to = new_zeroed_to;
            self.zeroed_to_segment = segment_start;
            counters.fsyncs.fetch_add(1, Relaxed);
            position += length as u64;
            offset += length;
            self.writes_into_segment += 1;
            self.bytes_into_segment += length as u64;
            if (position - segment_start) * 100 / self.segment_bytes
                >= WAL_PREPARE_AT_SEGMENT_PERCENT
                && self.prepare_requested_for != segment_start
                && let Some(preparer) = &mut self.preparer
            {
                // Large flushes wait for the disk's bandwidth, which zeros written ahead would
                // halve; small ones wait for the fdatasync's latency, which a write into a
                // reserved but unwritten block lengthens (see `WAL_RESERVE_FLUSH_BYTES`).
                let mean_flush_bytes = self.bytes_into_segment / self.writes_into_segment;
                preparer.request(mean_flush_bytes >= WAL_RESERVE_FLUSH_BYTES);
                self.prepare_requested_for = segment_start;
            }
        }
        Ok(())
    }

    /// Makes the segment starting at `start` the current one, creating it (directory synced,
    /// then header written and synced) if this flush is the first to reach it: from the
    /// prepared file if one is ready, else as a new, empty file.
    fn open_segment(
        &mut self,
        start: u64,
        durable: Lsn,
        counters: &Counters,
    ) -> Result<(), WalError> {
        if self
            .current
            .as_ref()
            .is_none_or(|(current, _)| *current != start)
        {
            self.current = None;
            let path = self.dir.join(segment::file_name(start));
            let fail = |what: &str, error: io::Error| {
                failed(
                    format!("{what} log segment {}", path.display()),
                    durable,
                    error,
                )
            };
            // The record holding the segment's first byte is the last one of this flush that
            // starts at or before it (this flush is the first to write into the segment).
            let index = self.starts.partition_point(|&lsn| lsn <= start);
            let first_record_lsn = index.checked_sub(1).map_or(start, |i| self.starts[i]);
            let header = SegmentHeader {
                segment_bytes: self.segment_bytes,
                start_lsn: start,
                first_record_lsn,
                log_id: self.log_id,
            };
            let prepared = self
                .preparer
                .as_mut()
                .and_then(|preparer| preparer.take(&path));
            let file = if prepared.is_some() {
                self.fs
                    .open(&path, OpenOptions::existing())
                    .map_err(|error| fail("opening the prepared file of", error))?
            } else {
                self.fs
                    .open(&path, OpenOptions::create().truncate())
                    .map_err(|error| fail("creating", error))?
            };
            // The name first, then the header: once the header is durable, so is every rename
            // and creation in the directory before it, and no crash can leave this segment's
            // header in a file under another name (an old name of a recycled file, which a
            // crash may keep beside the new one). A crash before the header is durable leaves a
            // file under the segment's name with a header never written (a recycled file's old
            // header was zeroed by the preparer), which recovery removes.
            self.fs.sync_dir(&self.dir).map_err(|error| {
                failed(
                    format!("fsync of the log directory {}", self.dir.display()),
                    durable,
                    error,
                )
            })?;
            file.write_all_at(0, &header.encode())
                .map_err(|error| fail("writing the header of", error))?;
            file.sync_data()
                .map_err(|error| fail("fdatasync of the header of", error))?;
            counters.fsyncs.fetch_add(1, Relaxed);
            if let Some(prepared) = prepared {
                // Written (with zeros, or with old log) or reserved, and synced all the way: no
                // flush into it extends the file.
                self.zeroed_to = HEADER_BYTES + self.segment_bytes;
                self.zeroed_to_segment = start;
                counters.prepared_segments.fetch_add(1, Relaxed);
                match prepared {
                    Prepared::Recycled => counters.recycled_segments.fetch_add(1, Relaxed),
                    Prepared::Reserved => counters.reserved_segments.fetch_add(1, Relaxed),
                    Prepared::Zeroed => 0,
                };
            }
            self.writes_into_segment = 0;
            self.bytes_into_segment = 0;
            self.current = Some((start, file));
        }
        Ok(())
    }
}

fn failed(operation: String, durable_lsn: Lsn, error: io::Error) -> WalError {
    WalError::Failed {
        operation,
        durable_lsn,
        source: StdArc::new(error),
    }
}

/// What recovery read of a log, which the writer's end must agree with (see
/// [`LogWriter::open_expecting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedEnd {
    /// Where recovery's reader stopped: the end of the valid log it replayed.
    pub replayed_to: Lsn,
    /// The LSN of the checkpoint recovery started from: the log must reach it.
    pub at_least: Lsn,
}

impl ExpectedEnd {
    /// Fails unless `end` (where the writer found the log to end) agrees.
    fn check(&self, end: u64, dir: &Path) -> Result<(), WalError> {
        if end == self.replayed_to.0 && end >= self.at_least.0 {
            return Ok(());
        }
        Err(WalError::Corrupt {
            lsn: Lsn(end.min(self.replayed_to.0)),
            reason: format!(
                "the log in {} ends at LSN {end}, but recovery read it to LSN {} and the \
                 checkpoint it started from is at LSN {}: a log segment is missing or damaged \
                 (not a torn tail). Nothing was changed; restore the log or the database from a \
                 backup",
                dir.display(),
                self.replayed_to.0,
                self.at_least.0
            ),
        })
    }
}

/// Where an existing log ends, and the state to append from there.
struct Recovered {
    end: u64,
    segment_bytes: u64,
    log_id: u64,
    current: Option<(u64, Box<dyn File>)>,
}

fn io_error(context: String) -> impl FnOnce(io::Error) -> WalError {
    move |error| WalError::io(context, error)
}

/// Finds the end of the log in `dir` and cuts off everything after it, durably.
fn recover_end(
    fs: &StdArc<dyn FileSystem>,
    dir: &Path,
    config: &WalConfig,
    expected: Option<ExpectedEnd>,
) -> Result<Recovered, WalError> {
    let segments = segment::list(fs.as_ref(), dir)?;
    // Every file's header, read once: the search for the last valid segment and the check for
    // misplaced segments below both look at them.
    let headers = segments
        .iter()
        .map(|(_, path)| segment::read_header(fs.as_ref(), path))
        .collect::<Result<Vec<_>, _>>()?;
    // Trailing segments whose header is invalid were being created when the process stopped;
    // the writer syncs a header before it writes log bytes, so they hold no durable log bytes.
    let last_valid = segments.iter().zip(&headers).enumerate().rev().find_map(
        |(index, ((start, _), header))| {
            header
                .filter(|header| header.start_lsn == *start)
                .map(|header| (index, header))
        },
    );
    let Some((last_index, header)) = last_valid else {
        // No valid segment: a new log, or one whose first segment never got a durable header.
        // Its name is then the log's end, and must be one the writer could have made.
        let end = segments.first().map_or(0, |(start, _)| *start);
        if !end.is_multiple_of(WAL_RECORD_ALIGN_BYTES as u64) || end > WAL_MAX_START_LSN {
            return Err(WalError::Corrupt {
                lsn: Lsn(end),
                reason: format!(
                    "no segment of the log in {} has a valid header, and the first one's name, \
                     {}, is not an LSN the log could start at",
                    dir.display(),
                    segments[0].1.display()
                ),
            });
        }
        // The writer makes a segment's header durable before it writes any log into it, or
        // creates the next segment: only the first segment of a log can lack a header, and
        // then nothing was written into it. Anything else is damage, and removing the files
        // (below) would throw the log away.
        let damage = match segments.as_slice() {
            [] => None,
            [(start, path)] => segment::holds_records_from(fs.as_ref(), path, *start)?.then(|| {
                format!(
                    "the header of log segment {} is damaged, but the segment holds log records",
                    path.display()
                )
            }),
            more => Some(format!(
                "none of the {} log segments in {} has a valid header",
                more.len(),
                dir.display()
            )),
        };
        if let Some(reason) = damage {
            return Err(WalError::Corrupt {
                lsn: Lsn(end),
                reason,
            });
        }
        if let Some(expected) = &expected {
            expected.check(end, dir)?;
        }
        cut_after(fs.as_ref(), dir, &segments, None)?;
        return Ok(Recovered {
            end,
            segment_bytes: config.segment_bytes,
            log_id: new_log_id(),
            current: None,
        });
    };
    let segment_bytes = header.segment_bytes;

    // Read from the record holding the last segment's first byte to the end of the valid log.
    let mut reader = LogReader::open(StdArc::clone(fs), dir, Lsn(header.first_record_lsn))?;
    while reader.next_raw()?.is_some() {}
    let end = reader.position().0;
    // A segment after the last valid one whose header is invalid, from which the reader took
    // the end of the last record (its checksum passed): a damaged header, kept and written
    // again below rather than removed with that record (see `LogReader::headerless_segment`).
    let headerless = reader
        .headerless_segment()
        .map(|(start, record)| (start.0, record.0));
    let end_segment = end - end % segment_bytes;
    let holder = segments.iter().position(|(start, _)| *start == end_segment);
    if end < header.start_lsn {
        // The record crossing into the last segment is torn; the end lies in an earlier
        // segment, which must exist and be valid, and so must every segment from it to the
        // last: the writer makes a segment's header durable, and the log before it, before it
        // writes into the next one, so an invalid segment before a valid one is damage, never
        // a crash. Checking only the reader's reason for stopping missed a damaged header
        // inside a record spanning whole segments (segments shorter than a record): the reader
        // stops there as at a torn write (`Truncated`), and the open cut the valid segments
        // after it off with their commits
        // (`wal_writer.rs::a_damaged_header_of_a_segment_inside_a_spanning_record_is_refused_not_cut_off`).
        let valid_at = |start: u64| {
            segments
                .binary_search_by_key(&start, |(start, _)| *start)
                .ok()
                .and_then(|index| headers[index])
                .is_some_and(|other| {
                    other.start_lsn == start
                        && other.segment_bytes == segment_bytes
                        && other.log_id == header.log_id
                })
        };
        let mut all_valid = true;
        let mut start = end_segment;
        while all_valid && start < header.start_lsn {
            all_valid = valid_at(start);
            start += segment_bytes;
        }
        let bad = !all_valid
            || reader
                .end()
                .is_some_and(|end| end.kind == TailKind::BadSegment)
            || end < header.first_record_lsn;
        if bad {
            return Err(WalError::Corrupt {
                lsn: Lsn(end),
                reason: format!(
                    "the log segment holding LSN {end} is missing or invalid, but segment {} \
                     after it is valid",
                    segments[last_index].1.display()
                ),
            });
        }
    }
    // A file that holds this log's segment for another LSN than its name says was swapped,
    // renamed or copied: it may hold log beyond the end (which opening would then drop), or
    // a segment that is also there under its own name. The writer never leaves such a file
    // behind: a recycled spare's old header is zeroed before it is renamed, and a segment's
    // name is durable before its header is written (see `wal/prepare.rs`). So every such file
    // is refused, even one holding a segment no longer in the directory: that is a copy too.
    for ((start, path), other) in segments.iter().zip(&headers) {
        if let Some(other) = other
            && other.start_lsn != *start
            && other.log_id == header.log_id
        {
            return Err(WalError::Corrupt {
                lsn: Lsn(other.start_lsn),
                reason: format!(
                    "log segment {} holds the segment starting at LSN {} (the log ends at LSN \
                     {end}): segment files were renamed, swapped or copied",
                    path.display(),
                    other.start_lsn
                ),
            });
        }
    }
    // Segments after the last valid one are taken for segments whose creation a crash cut
    // short, and go below. But a header damaged later (a bit flip, an overwrite) over a segment
    // the writer had written log into looks the same, and the reader stops there too (so even
    // recovery's end agrees): removing it dropped every acknowledged commit in it, silently.
    // The writer syncs a header before it writes any log into a segment, so one whose body
    // holds a record of this log at its own LSN is damage, never a crash, and is refused, as
    // a log's only segment is above.
    let checksum_seed = record::checksum_seed(header.log_id);
    for (start, path) in &segments[last_index + 1..] {
        if segment::holds_records_of_log(fs.as_ref(), path, *start, segment_bytes, checksum_seed)? {
            return Err(WalError::Corrupt {
                lsn: Lsn(*start),
                reason: format!(
                    "the header of log segment {} is damaged, but the segment holds log records \
                     (the log's valid part ends at LSN {end})",
                    path.display()
                ),
            });
        }
    }
    if let Some(expected) = &expected {
        expected.check(end, dir)?;
    }
    // Segments after the one that holds the end go. The end may also be exactly at the start
    // of a segment that was never created, or whose header never became durable: the next flush
    // creates it afresh, so an invalid one goes too.
    let holder = holder.filter(|&index| {
        index <= last_index || headerless.is_some_and(|(start, _)| start == segments[index].0)
    });
    let keep_up_to = match holder {
        Some(_) => Some(end_segment),
        None => end_segment.checked_sub(1),
    };
    cut_after(fs.as_ref(), dir, &segments, keep_up_to)?;
    // What this open read may not be durable: a previous process may have been killed between
    // a write and its fdatasync, or its fdatasync may have failed, after which the kernel may
    // keep the pages in its cache, readable, but marked clean, so that no later fdatasync
    // writes them (PostgreSQL's "fsyncgate"). Appending after such bytes and acknowledging
    // commits on a later, successful fdatasync would leave a hole before them at the next
    // power loss (or, for a new segment's header, a segment the next open removes as never
    // created). So the bytes that may not be durable are written again, from what was read, and
    // synced: the header and log of the segment holding the end, and of the one holding the
    // log's last byte if that is the segment before. Only those can hold such bytes (the writer
    // syncs a segment before it creates the next), and only from `known_durable` on (the
    // checkpoint recovery started from, whose log was flushed before its image was written).
    let known_durable = expected.as_ref().map_or(0, |expected| expected.at_least.0);
    let last_byte_segment = end.checked_sub(1).map(|last| last - last % segment_bytes);
    let mut current = None;
    for index in [last_byte_segment, holder.map(|_| end_segment)]
        .into_iter()
        .flatten()
        .filter_map(|start| segments.iter().position(|(other, _)| *other == start))
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (start, path) = &segments[index];
        let is_holder = holder == Some(index);
        let rewrite = start + segment_bytes > known_durable;
        if !rewrite && !is_holder {
            continue;
        }
        let file = fs
            .open(path, OpenOptions::existing())
            .map_err(io_error(format!("opening {}", path.display())))?;
        if rewrite {
            // The reader read through both segments, so both headers are valid, but for one
            // whose header is damaged over the end of the last record: that one is written
            // anew, as the writer made it.
            let header = headers[index].or_else(|| {
                headerless
                    .filter(|(headerless_start, _)| headerless_start == start)
                    .map(|(_, record)| SegmentHeader {
                        segment_bytes,
                        start_lsn: *start,
                        first_record_lsn: record,
                        log_id: header.log_id,
                    })
            });
            let Some(header) = header else {
                return Err(WalError::Corrupt {
                    lsn: Lsn(*start),
                    reason: format!("the header of log segment {} is invalid", path.display()),
                });
            };
            let from = known_durable.max(*start);
            let to = end.min(start + segment_bytes);
            rewrite_read_bytes(
                file.as_ref(),
                path,
                &header,
                from - start..to.max(from) - start,
            )?;
        }
        if is_holder {
            file.set_len(HEADER_BYTES + (end - end_segment))
                .map_err(io_error(format!("truncating {}", path.display())))?;
        }
        // One fdatasync for the rewrite and the cut alike.
        file.sync_data()
            .map_err(io_error(format!("fdatasync of {}", path.display())))?;
        if is_holder {
            current = Some((end_segment, file));
        }
    }
    Ok(Recovered {
        end,
        segment_bytes,
        log_id: header.log_id,
        current,
    })
}

/// Writes segment `path`'s `header` and the log bytes at `range` (offsets into its log, after
/// the header) of its open `file` again, as they read now; the caller syncs them: bytes a page
/// cache shows may be bytes it will never write (see `recover_end`).
///
/// The file may end before `range` does: the log's end is its last record's end rounded up to
/// the record alignment, and a torn write can keep the record but lose its padding, which no
/// checksum covers and nothing reads. Only the bytes that are there are written again.
fn rewrite_read_bytes(
    file: &dyn File,
    path: &Path,
    header: &SegmentHeader,
    range: std::ops::Range<u64>,
) -> Result<(), WalError> {
    let rewrite = |error| WalError::io(format!("rewriting {}", path.display()), error);
    file.write_all_at(0, &header.encode()).map_err(rewrite)?;
    let mut chunk = vec![0u8; WAL_READ_CHUNK_BYTES];
    let mut position = range.start;
    while position < range.end {
        let length = (range.end - position).min(chunk.len() as u64) as usize;
        let offset = HEADER_BYTES + position;
        let read = file
            .read_at(offset, &mut chunk[..length])
            .map_err(rewrite)?;
        if read == 0 {
            // The reader checked every record up to the end, so only the last record's padding
            // can be missing; more means the file changed under this open.
            if range.end - position >= WAL_RECORD_ALIGN_BYTES as u64 {
                return Err(WalError::Corrupt {
                    lsn: Lsn(header.start_lsn + position),
                    reason: format!(
                        "log segment {} ended while its log was being rewritten: it was \
                         changed by someone else during the open",
                        path.display()
                    ),
                });
            }
            break;
        }
        file.write_all_at(offset, &chunk[..read]).map_err(rewrite)?;
        position += read as u64;
    }
    Ok(())
}

/// Removes every segment that starts after LSN `keep_up_to` (all of them if `None`) and syncs
/// the directory.
fn cut_after(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &[(u64, PathBuf)],
    keep_up_to: Option<u64>,
) -> Result<(), WalError> {
    let first_removed = keep_up_to.map_or(0, |lsn| {
        segments.partition_point(|(start, _)| *start <= lsn)
    });
    if first_removed >= segments.len() {
        return Ok(());
    }
    for (_, path) in &segments[first_removed..] {
        fs.remove(path)
            .map_err(io_error(format!("removing {}", path.display())))?;
    }
    fs.sync_dir(dir)
        .map_err(io_error(format!("fsync of {}", dir.display())))
}

/// A random id for a new log, so that segments of different logs are never mixed up.
fn new_log_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(stats::now_ns());
    hasher.write_u32(std::process::id());
    hasher.finish()
}
