//! Segment preparation: the next log segment file is zero-filled and synced by a background
//! thread before the log reaches it, so that flushes never extend a file.
//!
//! Why: an `fdatasync` of a file whose size or block allocation changed must also commit that
//! metadata (on ext4, a journal commit and a second device flush), which makes it markedly
//! slower than one that only writes data into blocks already allocated. The writer therefore
//! never lets a flush write past what is already written or zero-filled: without a prepared
//! file it zero-fills `WAL_PREALLOCATE_BYTES` ahead inline, on the commit path, once per
//! mebibyte of log (PostgreSQL zero-fills its segments for the same reason). With a prepared
//! file, a whole segment's allocation is done ahead of time by a thread no committer waits for
//! (as PostgreSQL's checkpointer preallocates segments).
//!
//! The protocol, all under one mutex:
//! - The leader *requests* a file once the segment being written is half full
//!   ([`SegmentPreparer::request`]); the first request starts the thread, so a short-lived log
//!   never starts one nor writes a segment's worth of zeros.
//! - The thread prepares only while a file is wanted and none is ready: it creates
//!   [`PREPARED_FILE_NAME`] afresh, writes zeros over the header and body a mebibyte at a time
//!   (syncing each, and checking for shutdown between them), syncs the directory, and marks
//!   the file ready. If the request asked for a *reservation* (the writer does when the
//!   segment's flushes were large, `WAL_RESERVE_FLUSH_BYTES`), it reserves the file's space
//!   with [`lastpage_io::File::allocate`] instead of writing zeros (falling back to zeros on a
//!   file system that cannot): the blocks are allocated, so no flush extends the file, but
//!   unwritten, so the zeros cost no second write of every log byte; the first flush into each
//!   block pays for that with a metadata update, which is why small flushes get zeros.
//! - At a segment switch the leader *takes* the ready file ([`SegmentPreparer::take`]): it
//!   renames it to the segment's name while holding the mutex (the thread never touches a ready
//!   file), then syncs the directory and writes and syncs the header, as it would for a new
//!   file. If no file is ready it creates the segment inline, as without a preparer.
//!
//! Nothing here affects what is durable: a prepared file holds zeros (or unwritten reserved
//! blocks, or a recycled segment's old log behind a zeroed header) and a name that is not a
//! segment's, so a crash leaves at most a stray file, which the next writer adopts as a spare
//! or removes (see "Across a restart") and recovery never reads; a crash between the rename
//! and the synced header leaves a segment with an invalid header at the end of the log, which
//! recovery removes exactly as it removes one that was being created. A preparation that fails
//! (a full disk, a failed sync) is counted and abandoned, and the writer falls back to creating
//! segments inline, where a failure does fail the log.
//!
//! **Recycling.** Zero-filling writes every log byte twice, and on a disk whose bandwidth the
//! log and the checkpoints already share, that second write is what limits a long ingest. So
//! segments a checkpoint no longer needs are not removed but kept as *spares*
//! ([`SegmentRecycler::offer`], up to `WAL_SPARE_SEGMENTS_MAX` of them), renamed to
//! `<n>.spare`, and a wanted file is made from a spare (renamed to [`PREPARED_FILE_NAME`])
//! before any zeros are written: its blocks are allocated and written already, so flushes into
//! it commit no metadata either (PostgreSQL recycles its WAL segments the same way). A spare
//! holds old log, which is harmless: every record carries its own LSN, and old records carry
//! LSNs of an earlier segment, so a reader stops at the first of them exactly as at zeros (and
//! the record checksum is seeded with the log's id, so no stale or forged bytes can pass for a
//! record of this log). Its old *header* is not harmless: a crash may keep any of the names the
//! file has had (renames are not atomic on every file system; the test file system keeps each
//! name's old or new state at random), and a valid header of segment A under the name of
//! segment B is what a swapped or copied segment looks like, which recovery refuses. So the
//! preparer zeroes a spare's header (synced) before it renames it, and the writer makes a
//! segment's name durable (a directory sync) before it writes the header: a durable header then
//! implies that every earlier rename of the file is durable too, and an interrupted switch
//! leaves only a header never written, which recovery removes. (Before this ordering, about one
//! run in twenty of `recycled_segments_never_bring_old_log_back` left a log that could not be
//! opened.)
//!
//! **Across a restart.** A new preparer adopts the spares an earlier writer left, and the
//! prepared file (renamed to a spare's name), up to `WAL_SPARE_SEGMENTS_MAX`, but only a file
//! whose size is a whole segment's and which has no other name
//! ([`lastpage_io::FileSystem::link_count`] is 1); every other leftover name is removed, which
//! only unlinks that name. Why the second condition: a crash that keeps both the old and the
//! new name of a rename leaves two names of one file, and reusing the file under one of them
//! writes over whatever the other name is. A truncation's rename of segment A to a spare, kept
//! beside A's name, made the adopted spare a later segment B that A's stale name still reached,
//! so the next truncation offered "A" (really B, live) as a spare, and the preparer zeroed B's
//! header and wrote segment C over B's acknowledged log; and a prepared file kept beside a
//! segment's name, created afresh (with a truncation), emptied that segment. (Until the link
//! count was asked, every leftover was removed instead, and each restart of a long ingest went
//! back to writing every log byte twice until truncations had made new spares.) A file with
//! one name is reached through nothing else; running, the log gives no file a second name
//! (renames move names), so only a crash's leftovers are ever checked. Its contents are old
//! log of an earlier segment, or zeros, as for a spare made while running: a spare is made
//! only from a segment before the one being written, and a flush syncs a segment's bytes
//! before it writes into the next one, so the durable log, whose end the next open finds,
//! already passed the spare's old range; LSNs never go back, so no adopted file ever holds a
//! record at the position it will have in its new segment (and a spare of an earlier log in
//! the same directory carries another log id, which its records' checksums are seeded with).
//! A rename lost in a crash only leaves an old segment (with a zeroed header if it was being
//! reused), which recovery never reads and the next truncation removes or offers as a spare of
//! its own. Without a preparer (`WalConfig::prepare_segments` off) nothing could reuse them, so
//! the writer removes every leftover ([`remove_leftovers`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64 as Counter;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::JoinHandle;

use lastpage_io::{File, FileSystem, OpenOptions};

use super::segment::HEADER_BYTES;
use crate::limits::{WAL_PREPARE_CHUNK_BYTES, WAL_SPARE_SEGMENTS_MAX};
use crate::sync::{self, Condvar, Mutex};

/// The name of the prepared file in the log directory (not a segment name, so the log's
/// readers never see it).
pub(crate) const PREPARED_FILE_NAME: &str = "next-segment.prepared";

/// The extension of a spare (recycled) segment file, named `<16 hex digits>.spare`.
const SPARE_EXTENSION: &str = "spare";

/// Where a prepared file came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// Written with zeros.
    Zeroed,
    /// Its space reserved ([`lastpage_io::File::allocate`]) without writing it.
    Reserved,
    /// A recycled segment.
    Recycled,
}

/// What the leader and the preparing thread share.
struct Shared {
    fs: Arc<dyn FileSystem>,
    dir: Arc<Path>,
    /// Bytes of a prepared file: header and body.
    file_bytes: u64,
    state: Mutex<State>,
    changed: Condvar,
    /// Preparations that failed or whose file could not be taken (shared with the writer's
    /// statistics).
    failures: Arc<Counter>,
}

#[derive(Default)]
struct State {
    /// The leader wants a file ready for its next segment.
    wanted: bool,
    /// With the space reserved rather than zero-filled, if no spare is at hand (what the
    /// latest request asked for).
    reserve: bool,
    /// A prepared file is in place, complete and synced, and where it came from.
    ready: Option<Prepared>,
    /// The writer is going away.
    stop: bool,
    /// Spare segment files, each a complete segment's size.
    spares: Vec<PathBuf>,
    /// The number in the next spare's name.
    next_spare: u64,
}

/// Prepares the next segment file in the background; owned by the log writer's flush state.
pub(crate) struct SegmentPreparer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SegmentPreparer {
    /// A preparer for segment files of `file_bytes` (header included) in `dir`, which adopts
    /// the spares and the prepared file a previous writer left there if they can be reused, and
    /// removes them if not (counting the adopted ones in `adopted`; see the module
    /// documentation). No thread runs until the first [`SegmentPreparer::request`]. Failures
    /// are counted in `failures`.
    pub(crate) fn new(
        fs: Arc<dyn FileSystem>,
        dir: Arc<Path>,
        file_bytes: u64,
        failures: Arc<Counter>,
        adopted: &Counter,
    ) -> Self {
        let shared = Shared {
            fs,
            dir,
            file_bytes,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            failures,
        };
        adopted.fetch_add(shared.adopt_leftovers(), Relaxed);
        SegmentPreparer {
            shared: Arc::new(shared),
            thread: None,
        }
    }

    /// A handle through which segments the log no longer needs become spares.
    pub(crate) fn recycler(&self) -> SegmentRecycler {
        SegmentRecycler {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Asks for a prepared file, starting the thread if this is the first request. A thread
    /// that cannot be started only means that segments are created inline. `reserve` asks for
    /// the file's space to be reserved rather than zero-filled when no spare is at hand (see
    /// the module documentation).
    pub(crate) fn request(&mut self, reserve: bool) {
        {
            let mut state = sync::lock(&self.shared.state);
            state.wanted = true;
            state.reserve = reserve;
        }
        self.shared.changed.notify_one();
        if self.thread.is_none() {
            let shared = Arc::clone(&self.shared);
            self.thread = std::thread::Builder::new()
                .name("lastpage-wal-prepare".into())
                .spawn(move || shared.run())
                .inspect_err(|_| {
                    self.shared.failures.fetch_add(1, Relaxed);
                })
                .ok();
        }
    }

    /// Renames the prepared file to `segment` if one is ready, and says where it came from;
    /// on `None` the caller creates the segment itself. The next file is not requested here but
    /// when the new segment is half written, so that a log that ends within it never makes one.
    pub(crate) fn take(&mut self, segment: &Path) -> Option<Prepared> {
        let mut state = sync::lock(&self.shared.state);
        let ready = state.ready.take()?;
        self.shared
            .fs
            .rename(&self.shared.prepared_path(), segment)
            .inspect_err(|_| {
                self.shared.failures.fetch_add(1, Relaxed);
            })
            .ok()
            .map(|()| ready)
    }
}

/// Turns segment files the log no longer needs into spares (see the module documentation).
#[derive(Clone)]
pub(crate) struct SegmentRecycler {
    shared: Arc<Shared>,
}

impl SegmentRecycler {
    /// Keeps the segment file at `segment` as a spare, if fewer than `WAL_SPARE_SEGMENTS_MAX`
    /// are kept. Returns whether it did; on `false` the caller removes the file. The file must
    /// be a whole segment that no reader of the log needs any more.
    pub(crate) fn offer(&self, segment: &Path) -> bool {
        let shared = &self.shared;
        let mut state = sync::lock(&shared.state);
        if state.stop || state.spares.len() >= WAL_SPARE_SEGMENTS_MAX {
            return false;
        }
        let spare = shared.spare_path(state.next_spare);
        state.next_spare += 1;
        match shared.fs.rename(segment, &spare) {
            Ok(()) => {
                state.spares.push(spare);
                shared.changed.notify_one();
                true
            }
            Err(_) => {
                shared.failures.fetch_add(1, Relaxed);
                false
            }
        }
    }
}

impl Drop for SegmentPreparer {
    fn drop(&mut self) {
        sync::lock(&self.shared.state).stop = true;
        self.shared.changed.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread only returns (it catches nothing that could panic short of a bug in
            // the file system implementation, which would show up in tests).
            let _ = thread.join();
        }
    }
}

/// The spares and the prepared file an earlier writer left in a log directory.
struct Leftovers {
    /// Their paths, spares first (in the order of their numbers), then the prepared file.
    paths: Vec<PathBuf>,
    /// A number above every spare's.
    next_spare: u64,
}

/// Lists the [`Leftovers`] in `dir`, or `None` if it cannot be listed.
fn leftovers(fs: &dyn FileSystem, dir: &Path) -> Option<Leftovers> {
    let names = fs.list_dir(dir).ok()?;
    let mut found = Leftovers {
        paths: Vec::new(),
        next_spare: 0,
    };
    let mut prepared = None;
    for name in names {
        let spare_number = name
            .to_str()
            .and_then(|name| name.strip_suffix(SPARE_EXTENSION))
            .and_then(|stem| stem.strip_suffix('.'))
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        if let Some(number) = spare_number {
            found.next_spare = found.next_spare.max(number.saturating_add(1));
            found.paths.push(dir.join(&name));
        } else if name.as_os_str() == PREPARED_FILE_NAME {
            prepared = Some(dir.join(&name));
        }
    }
    found.paths.extend(prepared);
    Some(found)
}

/// Removes the spares and the prepared file an earlier writer left in `dir`, for a writer
/// without a preparer, which could never reuse them (before, they stayed on disk for good).
/// Removing a name only unlinks it; a failure only leaves a file behind, and is counted in
/// `failures`.
pub(crate) fn remove_leftovers(fs: &dyn FileSystem, dir: &Path, failures: &Counter) {
    for path in leftovers(fs, dir).map_or_else(Vec::new, |found| found.paths) {
        if fs.remove(&path).is_err() {
            failures.fetch_add(1, Relaxed);
        }
    }
}

impl Shared {
    fn prepared_path(&self) -> PathBuf {
        self.dir.join(PREPARED_FILE_NAME)
    }

    fn spare_path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:016x}.{SPARE_EXTENSION}"))
    }

    /// Adopts the spares and the prepared file an earlier writer left in the directory, each
    /// one that is a whole segment's size and has no other name, up to
    /// `WAL_SPARE_SEGMENTS_MAX`; the prepared file becomes a spare under a new spare name.
    /// Removes the rest: a crash may have kept another name of such a file, which reusing it
    /// would write through (see the module documentation). Returns how many it adopted. Spare
    /// numbers go on above the leftovers', so a name whose removal failed is never reused.
    /// Failures only leave files behind.
    fn adopt_leftovers(&self) -> u64 {
        let Some(leftovers) = leftovers(self.fs.as_ref(), &self.dir) else {
            return 0;
        };
        let mut state = sync::lock(&self.state);
        state.next_spare = leftovers.next_spare;
        let mut adopted = 0;
        for path in leftovers.paths {
            if state.spares.len() < WAL_SPARE_SEGMENTS_MAX && self.reusable(&path) {
                let spare = if path.extension() == Some(SPARE_EXTENSION.as_ref()) {
                    Some(path.clone())
                } else {
                    // The prepared file: complete or not, its contents are zeros, or a spare's
                    // behind a zeroed header (a reuse that a crash stopped before the switch).
                    let spare = self.spare_path(state.next_spare);
                    state.next_spare += 1;
                    self.fs.rename(&path, &spare).ok().map(|()| spare)
                };
                if let Some(spare) = spare {
                    state.spares.push(spare);
                    adopted += 1;
                    continue;
                }
            }
            if self.fs.remove(&path).is_err() {
                self.failures.fetch_add(1, Relaxed);
            }
        }
        adopted
    }

    /// Whether the leftover file at `path` can be a spare: the size of a whole segment file,
    /// and no other name, through which a reuse would write into another file's contents
    /// (see the module documentation).
    fn reusable(&self, path: &Path) -> bool {
        self.fs.link_count(path).ok() == Some(1)
            && self
                .fs
                .open(path, OpenOptions::existing())
                .and_then(|file| file.len())
                .ok()
                == Some(self.file_bytes)
    }

    /// The thread's loop: prepare whenever a file is wanted and none is ready.
    fn run(&self) {
        loop {
            let (spare, reserve) = {
                let mut state = sync::lock(&self.state);
                // Idle until a file is wanted and none is ready (or the writer goes away).
                while !state.stop && (!state.wanted || state.ready.is_some()) {
                    state = sync::wait(&self.changed, state);
                }
                if state.stop {
                    return;
                }
                state.wanted = false;
                (state.spares.pop(), state.reserve)
            };
            if let Some(spare) = spare {
                if self.reuse(&spare) {
                    sync::lock(&self.state).ready = Some(Prepared::Recycled);
                    continue;
                }
                // Not usable after all: remove it, and write zeros instead.
                if self.fs.remove(&spare).is_err() {
                    self.failures.fetch_add(1, Relaxed);
                }
            }
            match self.prepare(reserve) {
                Ok(Some(prepared)) => sync::lock(&self.state).ready = Some(prepared),
                // Stopped halfway: the file is incomplete and is never used.
                Ok(None) => return,
                Err(_) => {
                    self.failures.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Makes the spare at `spare` the prepared file. Its body is a synced segment's, so only
    /// its header needs writing (zeros, synced); the rename's durability does not matter (see
    /// the module documentation). Returns whether it did; a spare of the wrong size (which
    /// a truncation could only leave after a bug) is not used.
    fn reuse(&self, spare: &Path) -> bool {
        let Ok(file) = self.fs.open(spare, OpenOptions::existing()) else {
            return false;
        };
        if file.len().ok() != Some(self.file_bytes) {
            return false;
        }
        // The old header goes first, durably: a crash can keep any of the names this file
        // has had (its old segment's, the spare's, the prepared file's, the new segment's;
        // renames are not atomic on every file system), and under a segment's name a valid
        // header of another segment looks like a misplaced segment, which recovery refuses.
        // Zeros read as a header never written, which it knows how to treat.
        file.write_all_at(0, &[0; HEADER_BYTES as usize])
            .and_then(|()| file.sync_data())
            .and_then(|()| self.fs.rename(spare, &self.prepared_path()))
            .inspect_err(|_| {
                self.failures.fetch_add(1, Relaxed);
            })
            .is_ok()
    }

    /// Makes the prepared file: its space reserved if `reserve` asks for it and the file
    /// system can, else zeros written over all of it; then syncs it and the directory. Returns
    /// how it was made, or `None` if the writer stopped meanwhile.
    fn prepare(&self, reserve: bool) -> io::Result<Option<Prepared>> {
        let file: Box<dyn File> = self
            .fs
            .open(&self.prepared_path(), OpenOptions::create().truncate())?;
        if reserve {
            match file.allocate(self.file_bytes) {
                Ok(()) => {
                    file.sync_data()?;
                    self.fs.sync_dir(&self.dir)?;
                    return Ok(Some(Prepared::Reserved));
                }
                Err(error) if error.kind() == io::ErrorKind::Unsupported => {}
                Err(error) => return Err(error),
            }
        }
        let zeros = vec![0u8; WAL_PREPARE_CHUNK_BYTES];
        let mut written = 0;
        while written < self.file_bytes {
            if sync::lock(&self.state).stop {
                return Ok(None);
            }
            let piece = (self.file_bytes - written).min(zeros.len() as u64) as usize;
            file.write_all_at(written, &zeros[..piece])?;
            // Synced chunk by chunk: a whole segment's zeros written back at once would hold up
            // the device, and every log flush queued behind them, for a tenth of a second.
            file.sync_data()?;
            written += piece as u64;
        }
        self.fs.sync_dir(&self.dir)?;
        Ok(Some(Prepared::Zeroed))
    }
}
