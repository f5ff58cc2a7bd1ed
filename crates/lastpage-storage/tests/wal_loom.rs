//! Model checks of the log with loom: the buffer's reservation, copy and completion protocol on
//! its own, and the whole writer (appends, group commit, the stalled-leader wake-up, failure)
//! over the in-memory file system. Every interleaving of the threads up to a preemption bound is
//! explored; a lost wake-up shows as a deadlock, a missing happens-before edge as a wrong value
//! read. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom \
//!     cargo test -p lastpage-storage --release --test wal_loom
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the default bound of this file (see [`check`]).
#![cfg(loom)]

use std::borrow::Cow;
use std::sync::Arc as StdArc;

use lastpage_io::{FaultRule, FaultyConfig, FaultyFileSystem};
use lastpage_storage::sync::model_check;
use lastpage_storage::wal::buffer::LogBuffer;
use lastpage_storage::wal::{LogReader, LogWriter, Lsn, Record, TxnId, WalConfig};
use loom::sync::Arc;
use loom::thread;

/// The first word of a fake record: a nonzero tag in the low half and the length in the high
/// half, as a real record's CRC and length are.
fn first_word(tag: u64, len: u64) -> u64 {
    (len << 32) | tag
}

/// Appends a fake record of `words` words whose every word after the first is `tag`. The
/// models size the ring so that it never has to wait for room (waiting for room is modelled
/// through the writer below), because a spinning thread makes loom's search unbounded.
fn append(buffer: &LogBuffer, tag: u64, words: u64) -> u64 {
    let reservation = buffer.reserve(words * 8);
    assert!(buffer.has_space(&reservation));
    let mut writer = buffer.writer(reservation, first_word(tag, words * 8));
    for _ in 1..words {
        writer.put(&tag.to_le_bytes());
    }
    // No leader stalls in this model, so nobody needs waking, and nothing fails.
    let _ = writer.complete();
    reservation.start
}

/// Checks that `out` (log bytes from LSN `from` on) holds, at each of `starts`, an intact
/// 3-word record of one of the appenders, and returns their tags.
fn check_records(out: &[u8], from: u64, starts: &[u64]) -> Vec<u64> {
    let mut tags = Vec::new();
    let mut expected = from;
    for &start in starts {
        assert_eq!(start, expected, "the prefix is contiguous");
        let at = (start - from) as usize;
        let word =
            |i: usize| u64::from_le_bytes(out[at + 8 * i..at + 8 * i + 8].try_into().unwrap());
        let tag = word(0) & 0xFFFF_FFFF;
        assert_eq!(word(0), first_word(tag, 24), "first word");
        assert_eq!(word(1), tag, "a record in the completed prefix is complete");
        assert_eq!(word(2), tag, "a record in the completed prefix is complete");
        tags.push(tag);
        expected += 24;
    }
    tags
}

/// Three appenders reserve, copy and complete one record each while a flusher takes out
/// whatever prefix is complete at that moment and releases it (zeroing it) under their feet;
/// the ring wraps in the middle of the records. Every record the flusher sees as completed must
/// be intact, the reservations must be disjoint and contiguous, and after the appenders finish
/// the rest of the log must be found complete: nothing lost, nothing overlapping.
#[test]
fn reservation_copy_and_completion_protocol() {
    model_check(3, || {
        // Twelve words, starting at LSN 48: the records occupy LSNs 48..120, ring words 6..11
        // and then 0..2.
        let buffer = Arc::new(LogBuffer::new(96, 48));
        let appenders: Vec<_> = (1..=3)
            .map(|tag| {
                let buffer = Arc::clone(&buffer);
                thread::spawn(move || (tag, append(&buffer, tag, 3)))
            })
            .collect();
        // Concurrently: one flush of whatever is complete now.
        let mut starts = Vec::new();
        let middle = buffer.completed_prefix(48, &mut starts);
        let mut out = Vec::new();
        buffer.copy_out(48, middle, &mut out);
        buffer.release(48, middle);
        let mut tags = check_records(&out, 48, &starts);
        // After the appenders are done, the rest is complete.
        let mut reserved: Vec<(u64, u64)> = appenders
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect();
        let mut rest_starts = Vec::new();
        let end = buffer.completed_prefix(middle, &mut rest_starts);
        assert_eq!(end, 120, "every record is found complete");
        let mut rest = Vec::new();
        buffer.copy_out(middle, end, &mut rest);
        tags.extend(check_records(&rest, middle, &rest_starts));
        // The flushed records are exactly the appenders' records, at their reservations.
        reserved.sort_by_key(|&(_, start)| start);
        let reserved_tags: Vec<u64> = reserved.iter().map(|&(tag, _)| tag).collect();
        assert_eq!(reserved_tags, tags);
        let reserved_starts: Vec<u64> = reserved.iter().map(|&(_, start)| start).collect();
        assert_eq!(reserved_starts, vec![48, 72, 96]);
        assert_eq!(buffer.completed_records(), 3);
    });
}

const DIR: &str = "/log";

/// A writer over `fs` with a `buffer_bytes` ring, one 1 MiB segment prepared inline (loom
/// cannot run the preparer's thread), and committers that yield from `yield_wait_committers`
/// waiting at once (0: never).
fn open_writer(
    fs: &FaultyFileSystem,
    buffer_bytes: usize,
    yield_wait_committers: usize,
) -> Arc<LogWriter> {
    let config = WalConfig {
        buffer_bytes,
        segment_bytes: 1 << 20,
        prepare_segments: false,
        yield_wait_committers,
    };
    Arc::new(LogWriter::open(StdArc::new(fs.clone()), DIR, config).unwrap())
}

fn commit(writer: &LogWriter, txn: u64) -> Result<Lsn, lastpage_storage::wal::WalError> {
    let end = writer.append(&Record::Commit { txn: TxnId(txn) })?;
    writer.wait_durable(end)?;
    Ok(end)
}

/// Two committers against the real writer: whoever leads, whoever parks, both commits become
/// durable, nobody sleeps forever, and the log holds both records.
#[test]
fn two_committers_group_commit() {
    two_committers(0);
}

/// [`two_committers_group_commit`] with committers that wait for the leader by yielding
/// (`yield_wait_committers: 1`): a committer that stops yielding when the leader resigns, or
/// whose flush completes while it yields, must still end with its commit durable.
#[test]
fn two_committers_group_commit_yielding() {
    two_committers(1);
}

fn two_committers(yield_wait_committers: usize) {
    model_check(3, move || {
        let fs = FaultyFileSystem::new(FaultyConfig::new(1));
        let writer = open_writer(&fs, 64, yield_wait_committers);
        let other = {
            let writer = Arc::clone(&writer);
            thread::spawn(move || commit(&writer, 2).unwrap())
        };
        let mine = commit(&writer, 1).unwrap();
        let theirs = other.join().unwrap();
        assert!(writer.durable_lsn() >= mine.max(theirs));
        let mut txns: Vec<u64> = LogReader::open(StdArc::new(fs), DIR, Lsn::ZERO)
            .unwrap()
            .map(|entry| entry.unwrap().record.txn().unwrap().0)
            .collect();
        txns.sort_unstable();
        assert_eq!(txns, vec![1, 2]);
    });
}

/// A record larger than half the buffer makes the second appender wait for space (LOGBUFFER)
/// while the first one's commit is being flushed: both still finish.
#[test]
fn appender_waits_for_buffer_space() {
    model_check(3, || {
        let fs = FaultyFileSystem::new(FaultyConfig::new(2));
        let writer = open_writer(&fs, 64, 0);
        let insert = |txn: u64| Record::Insert {
            txn: TxnId(txn),
            index_id: 1,
            key: Cow::Borrowed(b""),
            value: Cow::Borrowed(b""),
        };
        // 24 + 20 bytes of payload = 44, padded to 48: two never fit in 64 bytes together.
        let other = {
            let writer = Arc::clone(&writer);
            thread::spawn(move || {
                let end = writer.append(&insert(2)).unwrap();
                writer.wait_durable(end).unwrap();
            })
        };
        let end = writer.append(&insert(1)).unwrap();
        writer.wait_durable(end).unwrap();
        other.join().unwrap();
        assert_eq!(writer.flush_now().unwrap(), Lsn(96));
    });
}

/// The first flush fails: every committer gets the error (none hangs, none is told its commit
/// is durable), and the writer refuses further appends.
#[test]
fn failed_flush_fails_every_committer() {
    failed_flush(0);
}

/// [`failed_flush_fails_every_committer`] with a committer yielding while the flush fails.
#[test]
fn failed_flush_fails_every_yielding_committer() {
    failed_flush(1);
}

fn failed_flush(yield_wait_committers: usize) {
    model_check(3, move || {
        let fs = FaultyFileSystem::new(FaultyConfig::new(3));
        // Sync 1 writes the segment header; sync 2 is the first flush.
        fs.inject(FaultRule::syncs_fail_from(2));
        let writer = open_writer(&fs, 64, yield_wait_committers);
        let other = {
            let writer = Arc::clone(&writer);
            thread::spawn(move || commit(&writer, 2).is_err())
        };
        assert!(commit(&writer, 1).is_err());
        assert!(other.join().unwrap());
        assert!(writer.is_failed());
        assert!(writer.append(&Record::Commit { txn: TxnId(3) }).is_err());
    });
}

/// A DELAYED commit (an append nobody waits for) racing a failed flush. The flush's leader,
/// once its commit has failed, counts the records completed so far: if the other one is not
/// among them, it was completed after the failure, which no flush will ever write, and its
/// append must fail with the writer's error rather than acknowledge the commit. Before the
/// completion itself told the appender about the failure, an append that checked the failed
/// flag just before the leader failed went on to return `Ok`.
#[test]
fn an_append_completed_after_a_failed_flush_is_refused() {
    model_check(3, || {
        let fs = FaultyFileSystem::new(FaultyConfig::new(5));
        // Sync 1 writes the segment header; sync 2 is the first flush.
        fs.inject(FaultRule::syncs_fail_from(2));
        let writer = open_writer(&fs, 64, 0);
        let delayed = {
            let writer = Arc::clone(&writer);
            thread::spawn(move || {
                writer
                    .append(&Record::Commit { txn: TxnId(2) })
                    .map_err(|error| error.to_string())
            })
        };
        let failure = commit(&writer, 1).unwrap_err().to_string();
        let completed_by_the_failure = writer.stats().appended_records;
        let appended = delayed.join().unwrap();
        if completed_by_the_failure == 1 {
            assert!(
                appended.is_err(),
                "an append completed after the failure was acknowledged"
            );
        }
        if let Err(error) = appended {
            assert_eq!(error, failure, "the same error as the failed commit");
        }
        assert!(writer.is_failed());
    });
}

/// Three committers: a leader, a committer parked behind it, and one that may find the prefix
/// stuck behind an incomplete record and must be woken by its appender (the stalled-leader
/// protocol). All three commits become durable.
#[test]
fn three_committers_group_commit() {
    model_check(2, || {
        let fs = FaultyFileSystem::new(FaultyConfig::new(4));
        let writer = open_writer(&fs, 128, 0);
        let others: Vec<_> = (2..=3)
            .map(|txn| {
                let writer = Arc::clone(&writer);
                thread::spawn(move || commit(&writer, txn).unwrap())
            })
            .collect();
        let mut ends = vec![commit(&writer, 1).unwrap()];
        ends.extend(others.into_iter().map(|handle| handle.join().unwrap()));
        assert!(writer.durable_lsn() >= *ends.iter().max().unwrap());
        assert_eq!(writer.durable_lsn(), Lsn(96));
    });
}
