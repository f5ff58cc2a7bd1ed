//! The in-memory log buffer: space is reserved with one atomic step, records are copied in
//! parallel, and each record is published on its own.
//!
//! This is the Aether/ERMIA shape of a log buffer, and why appending is not a mutex hot spot:
//!
//! 1. **Reserve.** An appender learns its record's size first, then takes `[start, end)` of the
//!    logical log with one `fetch_add` on `reserved`. That one instruction is the only point
//!    every appender passes through; there is no lock, and the reservation also fixes the
//!    record's LSN (`start`).
//! 2. **Wait for room (rarely).** The buffer is a ring of `capacity` bytes indexed by LSN modulo
//!    the capacity; byte `lsn` may be written once the byte of the previous lap in its place,
//!    `lsn - capacity`, has been taken out (`released > lsn - capacity`), so a reservation
//!    `[start, end)` once `released >= end - capacity`. A full buffer is a LOGBUFFER wait in
//!    the writer.
//! 3. **Copy, in parallel.** The ring is an array of 64-bit words (`AtomicU64`), and records start
//!    at multiples of 8, so no two records share a word: appenders copy with plain (relaxed)
//!    word stores, no read-modify-write, no `unsafe`.
//! 4. **Publish.** The record's first word — CRC and length, never zero — is stored last, with
//!    release ordering. A nonzero word at a record boundary therefore means "this record is
//!    complete, and all of its bytes are visible to whoever reads the word with acquire".
//!
//! The group commit leader ([`super::writer`]) finds the completed prefix by walking record
//! boundaries from `released`: read the first word (acquire); zero means the record there is
//! still being copied (or nobody reserved it yet), so the prefix ends; otherwise skip its padded
//! length. It copies the prefix out, writes it to the file, zeroes those words (so a stale
//! first word can never be mistaken for a completed record when the ring wraps) and then moves
//! `released` forward with release ordering, which hands the space to the appenders waiting for
//! it (who read `released` with acquire before they store).
//!
//! A leader can find the prefix stuck behind a record whose appender was descheduled mid-copy.
//! Rather than poll, it parks: every completion bumps `progress` (a counter, in steps of two)
//! with one read-modify-write, and a stuck leader sets bit 0 of the same word (`STALLED`) after
//! registering itself. Because both are read-modify-writes of one word they are totally
//! ordered: either the leader's `fetch_or` sees the count changed since it scanned (and scans
//! again), or the appender's `fetch_add` sees `STALLED` (and wakes the leader). No wake-up is
//! lost, and no sequentially consistent fence is needed (which loom could not check).
//!
//! A writer that fails sets the top bit of the same word (`FAILED`) the same way, and an
//! appender learns from its own completion's `fetch_add` whether its record was completed
//! before the failure or after it. One completed after it is one no flush will ever write (the
//! failed writer flushes no more), so its appender must report the failure instead of success:
//! checking a flag before the copy, as the writer did alone, left a window between that check
//! and the completion in which a failure went unseen and a DELAYED commit was acknowledged
//! although its record was never going to be written.
//!
//! The type is public so that `tests/wal_loom.rs` can model-check the protocol directly.

use crossbeam_utils::CachePadded;

use crate::limits::{WAL_RECORD_ALIGN_BYTES, WAL_RECORD_HEADER_BYTES};
use crate::sync::{AtomicU64, Ordering};

/// Bit 0 of `progress`: a leader is parked waiting for the next completion.
const STALLED: u64 = 1;
/// The top bit of `progress`: the writer has failed, and no record completed from now on will
/// be written. (The count below it would need 2^62 completions to reach it.)
const FAILED: u64 = 1 << 63;
/// What one completion adds to `progress`.
const ONE_COMPLETION: u64 = 2;
const WORD: u64 = WAL_RECORD_ALIGN_BYTES as u64;

/// A range of the logical log reserved for one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The record's LSN.
    pub start: u64,
    /// One past its last (padded) byte: the next record's LSN.
    pub end: u64,
}

/// The ring of log bytes between the appenders and the group commit leader.
pub struct LogBuffer {
    words: Box<[AtomicU64]>,
    /// Capacity in bytes (a multiple of 8).
    capacity: u64,
    /// The next LSN to hand out.
    reserved: CachePadded<AtomicU64>,
    /// Everything below this LSN has been taken out and zeroed; bytes below
    /// `released + capacity` may be written.
    released: CachePadded<AtomicU64>,
    /// Completed records times two, plus [`STALLED`] and [`FAILED`].
    progress: CachePadded<AtomicU64>,
}

/// What [`RecordWriter::complete`] learned from its completion's read-modify-write of the
/// progress word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a stalled leader must be woken, and a record completed after a failure is not logged"]
pub struct Completion {
    /// A leader is parked waiting for a completion: the appender must wake it.
    pub wake_stalled_leader: bool,
    /// The writer had failed before the record was completed, so no flush will write it.
    pub after_failure: bool,
}

impl LogBuffer {
    /// An empty buffer of `capacity` bytes (a positive multiple of 8) whose first record will
    /// have LSN `start` (a multiple of 8).
    pub fn new(capacity: usize, start: u64) -> LogBuffer {
        assert!(
            capacity > 0 && capacity.is_multiple_of(WAL_RECORD_ALIGN_BYTES),
            "log buffer capacity {capacity} is not a positive multiple of 8"
        );
        assert!(
            start.is_multiple_of(WORD),
            "log start {start} is not aligned"
        );
        LogBuffer {
            words: (0..capacity / WAL_RECORD_ALIGN_BYTES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            capacity: capacity as u64,
            reserved: CachePadded::new(AtomicU64::new(start)),
            released: CachePadded::new(AtomicU64::new(start)),
            progress: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The next LSN to be handed out: the end of everything reserved so far.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Everything below this LSN has left the buffer.
    pub fn released(&self) -> u64 {
        self.released.load(Ordering::Acquire)
    }

    /// Reserves `len` bytes (a positive multiple of 8, at most the capacity).
    ///
    /// Relaxed is enough: the reservation only has to hand out disjoint ranges, which any
    /// atomic read-modify-write does. What a reader of the buffer needs to see is ordered by the
    /// record's first word (release/acquire), not by this counter.
    #[inline]
    pub fn reserve(&self, len: u64) -> Reservation {
        debug_assert!(len > 0 && len.is_multiple_of(WORD) && len <= self.capacity);
        let start = self.reserved.fetch_add(len, Ordering::Relaxed);
        Reservation {
            start,
            end: start + len,
        }
    }

    /// `released` must reach this LSN before the reservation's bytes may be written.
    pub fn space_needed(&self, reservation: &Reservation) -> u64 {
        reservation.end.saturating_sub(self.capacity)
    }

    /// Whether the reservation's bytes may be written now. The acquire load orders the
    /// leader's zeroing of this space before the caller's stores into it.
    #[inline]
    pub fn has_space(&self, reservation: &Reservation) -> bool {
        self.released() >= self.space_needed(reservation)
    }

    /// Starts copying a record into its reservation, which must have space. `first_word` is the
    /// record's first 8 bytes (CRC and length, little-endian), which [`RecordWriter::complete`]
    /// stores last; the bytes from offset 8 on are fed to [`RecordWriter::put`].
    pub fn writer(&self, reservation: Reservation, first_word: u64) -> RecordWriter<'_> {
        debug_assert!(first_word != 0, "a record's first word is never zero");
        RecordWriter {
            buffer: self,
            reservation,
            first_word,
            index: self.next_index(self.index_of(reservation.start)),
            stored_words: 1,
            pending: 0,
            pending_bytes: 0,
        }
    }

    /// The index in `words` of the word holding byte `lsn` (a multiple of 8). One division:
    /// loops over consecutive words call it once and then step with [`LogBuffer::next_index`].
    fn index_of(&self, lsn: u64) -> usize {
        ((lsn / WORD) % self.words.len() as u64) as usize
    }

    /// The index after `index`, wrapping around the ring.
    #[inline]
    fn next_index(&self, index: usize) -> usize {
        if index + 1 == self.words.len() {
            0
        } else {
            index + 1
        }
    }

    fn word(&self, lsn: u64) -> &AtomicU64 {
        &self.words[self.index_of(lsn)]
    }

    /// Walks the completed records from `from` (which must be `released`, and only the one
    /// leader may call this) and returns the end of the completed prefix, pushing each record's
    /// LSN onto `starts`.
    pub fn completed_prefix(&self, from: u64, starts: &mut Vec<u64>) -> u64 {
        // Every record that has been copied lies below `from + capacity` (its appender waited for
        // that), so the walk stops there: a word further on would belong to the ring's next lap.
        let limit = from + self.capacity;
        let mut position = from;
        while position < limit {
            let first = self.word(position).load(Ordering::Acquire);
            if first == 0 {
                break;
            }
            let total = first >> 32;
            debug_assert!(
                total >= WAL_RECORD_HEADER_BYTES as u64 && total <= self.capacity,
                "corrupt first word {first:#x} in the log buffer at {position}"
            );
            starts.push(position);
            position += total.next_multiple_of(WORD);
        }
        position
    }

    /// The ring indexes of the words of `[from, to)` (at most one lap), as at most two
    /// contiguous runs: up to the end of the ring, then from its start. Loops over a run step
    /// through a slice instead of wrapping an index at every word.
    fn runs(&self, from: u64, to: u64) -> [std::ops::Range<usize>; 2] {
        let words = ((to - from) / WORD) as usize;
        debug_assert!(words <= self.words.len(), "more than one lap of the ring");
        let start = self.index_of(from);
        let first = words.min(self.words.len() - start);
        [start..start + first, 0..words - first]
    }

    /// Appends the bytes of `[from, to)` (a completed prefix) to `out`. The relaxed loads see
    /// the appenders' stores because `completed_prefix` read each record's first word with
    /// acquire, after which the appender's earlier stores are visible.
    pub fn copy_out(&self, from: u64, to: u64, out: &mut Vec<u8>) {
        let mut at = out.len();
        out.resize(at + (to - from) as usize, 0);
        for run in self.runs(from, to) {
            let bytes = &mut out[at..at + run.len() * WORD as usize];
            for (word, chunk) in self.words[run.clone()]
                .iter()
                .zip(bytes.chunks_exact_mut(WORD as usize))
            {
                chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            at += run.len() * WORD as usize;
        }
    }

    /// Zeroes `[from, to)` and releases it to the appenders.
    pub fn release(&self, from: u64, to: u64) {
        for run in self.runs(from, to) {
            for word in &self.words[run] {
                word.store(0, Ordering::Relaxed);
            }
        }
        self.released.store(to, Ordering::Release);
    }

    /// The progress word: completions times two, plus the `STALLED` bit (bit 0). A leader reads it
    /// before it walks the prefix.
    pub fn progress(&self) -> u64 {
        self.progress.load(Ordering::Acquire)
    }

    /// Sets the stalled bit; returns whether any record was completed since `seen` (a value
    /// of [`LogBuffer::progress`]), in which case the caller must not wait.
    pub fn mark_stalled(&self, seen: u64) -> bool {
        let before = self.progress.fetch_or(STALLED, Ordering::AcqRel);
        (before & !FAILED) / ONE_COMPLETION != (seen & !FAILED) / ONE_COMPLETION
    }

    /// Marks the buffer's writer failed: every record completed from now on learns so from its
    /// [`Completion`]. The caller must flush nothing after this. A read-modify-write of the
    /// progress word, so that every completion is ordered before or after it.
    pub fn mark_failed(&self) {
        self.progress.fetch_or(FAILED, Ordering::AcqRel);
    }

    /// Clears the stalled bit (by whoever removed the stalled leader from its slot).
    pub fn clear_stalled(&self) {
        self.progress.fetch_and(!STALLED, Ordering::AcqRel);
    }

    /// How many records have been completed since the buffer was created.
    pub fn completed_records(&self) -> u64 {
        (self.progress.load(Ordering::Relaxed) & !FAILED) / ONE_COMPLETION
    }
}

/// Copies one record into its reservation, word by word.
pub struct RecordWriter<'a> {
    buffer: &'a LogBuffer,
    reservation: Reservation,
    first_word: u64,
    /// Index in the ring of the next word to be stored (stepped, never recomputed: a division
    /// per word would cost more than the store).
    index: usize,
    /// Words of the record stored or reserved so far, the first word included.
    stored_words: u64,
    /// Bytes collected for the next word, little-endian.
    pending: u64,
    pending_bytes: usize,
}

impl RecordWriter<'_> {
    /// Appends bytes to the record.
    #[inline]
    pub fn put(&mut self, mut bytes: &[u8]) {
        if self.pending_bytes > 0 {
            // Top up the partial word first; whole words then come straight from the input.
            let take = (WORD as usize - self.pending_bytes).min(bytes.len());
            for (offset, &byte) in bytes[..take].iter().enumerate() {
                self.pending |= u64::from(byte) << (8 * (self.pending_bytes + offset));
            }
            self.pending_bytes += take;
            bytes = &bytes[take..];
            if self.pending_bytes < WORD as usize {
                return;
            }
            let word = std::mem::take(&mut self.pending);
            self.pending_bytes = 0;
            self.store(word);
        }
        let mut words = bytes.chunks_exact(WORD as usize);
        for chunk in &mut words {
            self.store(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        for (offset, &byte) in words.remainder().iter().enumerate() {
            self.pending |= u64::from(byte) << (8 * offset);
        }
        self.pending_bytes = words.remainder().len();
    }

    #[inline]
    fn store(&mut self, word: u64) {
        debug_assert!(
            self.stored_words < (self.reservation.end - self.reservation.start) / WORD,
            "record overflows its reservation"
        );
        self.buffer.words[self.index].store(word, Ordering::Relaxed);
        self.index = self.buffer.next_index(self.index);
        self.stored_words += 1;
    }

    /// Pads the record with zeros, publishes it by storing its first word (release), and counts
    /// the completion. Returns whether a stalled leader must be woken, and whether the writer
    /// had failed before the completion (see [`LogBuffer::mark_failed`]).
    pub fn complete(mut self) -> Completion {
        if self.pending_bytes > 0 {
            let word = self.pending;
            self.store(word);
        }
        // Padding words inside the reservation (none when the caller fed exactly the record):
        // the leader zeroed them when it released the space, so they are zero already.
        debug_assert!(self.stored_words * WORD <= self.reservation.end - self.reservation.start);
        self.buffer
            .word(self.reservation.start)
            .store(self.first_word, Ordering::Release);
        let before = self
            .buffer
            .progress
            .fetch_add(ONE_COMPLETION, Ordering::AcqRel);
        Completion {
            wake_stalled_leader: before & STALLED != 0,
            after_failure: before & FAILED != 0,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Records of every length, fed to the writer in pieces split at random points (so the
    /// partial-word path meets every alignment), through a ring small enough to wrap every few
    /// records, come out byte for byte with zero padding.
    #[test]
    fn records_split_into_random_pieces_come_out_intact_across_wraps() {
        let seed = 0x5eed_0b0f;
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let buffer = LogBuffer::new(96, 0);
        let mut from = 0;
        for round in 0..2000 {
            let len = rng.random_range(WAL_RECORD_HEADER_BYTES..=88);
            let mut image: Vec<u8> = (0..len).map(|_| rng.random_range(1..=255u8)).collect();
            // The first word carries the length in its high half, as a real record's does.
            image[4..8].copy_from_slice(&(len as u32).to_le_bytes());
            let reservation = buffer.reserve(len.next_multiple_of(8) as u64);
            assert!(buffer.has_space(&reservation), "seed {seed} round {round}");
            let first_word = u64::from_le_bytes(image[..8].try_into().expect("8 bytes"));
            let mut writer = buffer.writer(reservation, first_word);
            let mut rest = &image[8..];
            while !rest.is_empty() {
                let piece = rng.random_range(0..=rest.len());
                writer.put(&rest[..piece]);
                rest = &rest[piece..];
            }
            assert_eq!(
                writer.complete(),
                Completion {
                    wake_stalled_leader: false,
                    after_failure: false
                },
                "no leader is stalled and nothing failed"
            );
            let mut starts = Vec::new();
            let to = buffer.completed_prefix(from, &mut starts);
            assert_eq!((starts.as_slice(), to), (&[from][..], reservation.end));
            let mut out = Vec::new();
            buffer.copy_out(from, to, &mut out);
            image.resize(out.len(), 0);
            assert_eq!(out, image, "seed {seed} round {round}");
            buffer.release(from, to);
            from = to;
        }
    }
}
