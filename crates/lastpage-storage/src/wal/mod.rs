//! The write-ahead log: log records, a writer with group commit, and a reader that stops at a
//! torn tail.
//!
//! The log is one logical byte stream, addressed by *log sequence numbers*: the LSN of a record
//! is the byte offset of its first byte in the logical log. Records start at multiples of 8, so
//! every LSN is one. [`LogWriter::append`] returns the *end* LSN of the record (the LSN the next
//! record starts at); that is the number a committer passes to [`LogWriter::wait_durable`], and
//! [`LogWriter::durable_lsn`] is the end of the durable prefix. The logical log is cut into
//! segment files of a fixed number of bytes; a record may span two segments.
//!
//! Byte layouts are in `docs/wal-format.md` and in the modules: [`record`] (record header and
//! payloads) and `segment.rs` (segment files). How appends avoid a single hot mutex and how
//! group commit works is in [`writer`] and [`buffer`].
//!
//! Failures are never acknowledged: once a log write or `fdatasync` fails, the writer is failed
//! for good; see [`WalError::Failed`].

pub mod buffer;
mod prepare;
pub mod reader;
pub mod record;
mod segment;
pub mod writer;

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::limits::{
    MAX_WAL_RECORD_BYTES, WAL_BUFFER_BYTES, WAL_MAX_SEGMENT_BYTES, WAL_RECORD_ALIGN_BYTES,
    WAL_RECORD_HEADER_BYTES, WAL_SEGMENT_BYTES, WAL_YIELD_WAIT_COMMITTERS_PER_CPU,
};

pub use reader::{
    LogEnd, LogEntry, LogReader, RawRecord, ReadBackMarks, TailKind, read_newest_first,
};
pub use record::{ActiveTxn, DirtyPage, Record, RecordKind, TxnId};
pub use writer::{ExpectedEnd, LogWriter, WalStats};

/// A log sequence number: a byte offset in the logical log. Records start at multiples of 8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The start of a new log.
    pub const ZERO: Lsn = Lsn(0);
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How a new log is laid out and how much memory the writer's buffer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalConfig {
    /// Size of the in-memory log buffer, in bytes (a multiple of 8). Appenders wait (LOGBUFFER)
    /// when it is full, and no record may be larger.
    pub buffer_bytes: usize,
    /// Bytes of logical log per segment file (a multiple of 8). Used when a log is created; an
    /// existing log keeps the segment size written in its segment headers.
    pub segment_bytes: u64,
    /// Whether a background thread prepares the next segment file (zero-filled, reserved, or
    /// recycled from a spare) before the log reaches it (see `prepare.rs`); without it a flush
    /// zero-fills ahead of itself, inline. On by
    /// default, except in loom models (which cannot run a thread of their own).
    pub prepare_segments: bool,
    /// From how many committers waiting for the log at once a committer waits for a flush by
    /// yielding the processor rather than parking (see `LogWriter::yield_while_led`); 0 parks
    /// always. By default `WAL_YIELD_WAIT_COMMITTERS_PER_CPU` times the processors, except in
    /// loom models, which set it themselves.
    pub yield_wait_committers: usize,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            buffer_bytes: WAL_BUFFER_BYTES,
            segment_bytes: WAL_SEGMENT_BYTES,
            prepare_segments: !cfg!(loom),
            yield_wait_committers: if cfg!(loom) {
                0
            } else {
                WAL_YIELD_WAIT_COMMITTERS_PER_CPU
                    * std::thread::available_parallelism().map_or(1, usize::from)
            },
        }
    }
}

impl WalConfig {
    /// Checks the configuration, explaining what is wrong.
    pub fn validate(&self) -> Result<(), WalError> {
        let align = WAL_RECORD_ALIGN_BYTES;
        if !self.buffer_bytes.is_multiple_of(align)
            || self.buffer_bytes < 2 * WAL_RECORD_HEADER_BYTES
        {
            return Err(WalError::Config(format!(
                "the log buffer must be a multiple of {align} bytes and at least {} bytes, not {}",
                2 * WAL_RECORD_HEADER_BYTES,
                self.buffer_bytes
            )));
        }
        if !self.segment_bytes.is_multiple_of(align as u64)
            || self.segment_bytes == 0
            || self.segment_bytes > WAL_MAX_SEGMENT_BYTES
        {
            return Err(WalError::Config(format!(
                "the log segment size must be a positive multiple of {align} bytes, at most \
                 {WAL_MAX_SEGMENT_BYTES}, not {}",
                self.segment_bytes
            )));
        }
        Ok(())
    }

    /// The largest record (header plus payload) a writer with this configuration accepts.
    pub fn max_record_bytes(&self) -> usize {
        self.buffer_bytes.min(MAX_WAL_RECORD_BYTES)
    }
}

/// Errors of the write-ahead log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WalError {
    /// A write or `fdatasync` of the log failed. The writer refuses every later append and every
    /// wait for an LSN that was not durable before the failure, without retrying: after a failed
    /// `fdatasync` the kernel may have dropped the unwritten data and would report the next one
    /// as successful. Transactions whose commit was not acknowledged may or may not survive a
    /// restart; recovery from the log decides.
    #[error(
        "the write-ahead log failed: {operation} failed: {source}. The log is durable only up to \
         LSN {durable_lsn}; this commit was not acknowledged, and no further commits are accepted \
         until the database is restarted and recovered from its log"
    )]
    Failed {
        /// What failed, e.g. "fdatasync of log segment /db/log/0000000000000000.wal".
        operation: String,
        /// The end of the log prefix that is known to be durable.
        durable_lsn: Lsn,
        /// The I/O error.
        source: Arc<io::Error>,
    },
    /// A record larger than the writer accepts.
    #[error("a log record of {len} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge {
        /// Size of the record, header included.
        len: usize,
        /// The largest record the writer accepts.
        max: usize,
    },
    /// A wait for an LSN that was never handed out.
    #[error("LSN {lsn} is beyond the end of the log ({end})")]
    BeyondEnd {
        /// The LSN waited for.
        lsn: Lsn,
        /// The end of what has been appended.
        end: Lsn,
    },
    /// A record passed its checksum but cannot be decoded, or the log's files contradict each
    /// other. Unlike a torn tail, this cannot be the result of a crash while writing.
    #[error("corrupt log at LSN {lsn}: {reason}")]
    Corrupt {
        /// Where the problem is.
        lsn: Lsn,
        /// What is wrong.
        reason: String,
    },
    /// An I/O error while opening or reading the log.
    #[error("log I/O error: {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: Arc<io::Error>,
    },
    /// An invalid [`WalConfig`].
    #[error("invalid log configuration: {0}")]
    Config(String),
}

impl WalError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> WalError {
        WalError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

/// A removal of old log ([`LogWriter::remove_segments_before`]) that stopped at a segment it
/// could not remove. The log is whole and opens as before: the segments left are old ones, which
/// no reader needs, and the next removal lists them again.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{source} ({removed} older segments were removed before it)")]
pub struct TruncationError {
    /// Segments removed (or kept as spares) before the failure.
    pub removed: usize,
    /// What failed.
    pub source: WalError,
}

/// Rounds a record length up to the record alignment.
pub(crate) fn align_up(len: usize) -> usize {
    len.next_multiple_of(WAL_RECORD_ALIGN_BYTES)
}
