//! Log records: the header every record starts with, and the typed payloads.
//!
//! # Record layout (all integers little-endian)
//!
//! | offset | size | field         | meaning                                                    |
//! |--------|------|---------------|------------------------------------------------------------|
//! | 0      | 4    | `crc`         | CRC32C of bytes `4..total_len`, seeded ([`checksum_seed`]) |
//! | 4      | 4    | `total_len`   | header plus payload, in bytes (24 ..= `MAX_WAL_RECORD_BYTES`) |
//! | 8      | 8    | `lsn`         | the record's own LSN (its offset in the logical log)       |
//! | 16     | 4    | `payload_len` | payload bytes; always `total_len - 24`                     |
//! | 20     | 1    | `kind`        | [`RecordKind`]                                             |
//! | 21     | 1    | `flags`       | zero (reserved)                                            |
//! | 22     | 2    | `reserved`    | zero                                                       |
//! | 24     | n    | payload       | as the kind says                                           |
//!
//! After the payload come zero bytes up to the next multiple of 8, where the next record starts
//! (the padding is not covered by the CRC). The CRC comes first so that it covers every other
//! byte of the header, and so that the first 8 bytes (CRC and length) are never zero: the log
//! buffer uses that word as the record's completion mark (see [`super::buffer`]).
//!
//! The redundancy is deliberate: a reader accepts a record only if the length is in bounds, the
//! two lengths agree, the LSN is the position it was read from, the reserved bytes are zero and
//! the CRC matches. Garbage (zeros past the end, a torn write, stale bytes) fails at least one,
//! and the first record that fails is the end of the log.
//!
//! # Payloads
//!
//! Byte strings are a `u32` length followed by the bytes. See [`Record`] for each kind.

use std::borrow::Cow;

use super::{Lsn, align_up};
use crate::limits::{MAX_WAL_RECORD_BYTES, WAL_RECORD_HEADER_BYTES};

/// A transaction id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId(pub u64);

/// The record type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A transaction started.
    Begin = 1,
    /// A row was inserted into an index.
    Insert = 2,
    /// A row was deleted from an index (with its old value, for undo).
    Delete = 3,
    /// A row's value was replaced (with both values: undo and redo).
    Update = 4,
    /// A transaction committed.
    Commit = 5,
    /// A transaction rolled back (its undo is complete).
    Abort = 6,
    /// A checkpoint started.
    CheckpointBegin = 7,
    /// A checkpoint ended, with its tables.
    CheckpointEnd = 8,
    /// Identity values of a table up to a value were handed out.
    IdentityReserve = 9,
    /// A schema change (a table created or dropped), described by the layer above.
    Schema = 10,
    /// Several rows were inserted into one index by one statement.
    InsertRun = 11,
}

impl RecordKind {
    /// The kind with this type byte.
    pub fn from_byte(byte: u8) -> Option<RecordKind> {
        Some(match byte {
            1 => RecordKind::Begin,
            2 => RecordKind::Insert,
            3 => RecordKind::Delete,
            4 => RecordKind::Update,
            5 => RecordKind::Commit,
            6 => RecordKind::Abort,
            7 => RecordKind::CheckpointBegin,
            8 => RecordKind::CheckpointEnd,
            9 => RecordKind::IdentityReserve,
            10 => RecordKind::Schema,
            11 => RecordKind::InsertRun,
            _ => return None,
        })
    }
}

/// A transaction that was active at a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveTxn {
    /// The transaction.
    pub txn: TxnId,
    /// LSN of its first record (recovery must read back this far to undo it).
    pub first_lsn: Lsn,
    /// LSN of its last record so far.
    pub last_lsn: Lsn,
}

/// A page that was dirty at a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyPage {
    /// The page.
    pub page_id: u64,
    /// LSN of the oldest record whose change the page may not have on disk (redo starts at the
    /// smallest of these).
    pub rec_lsn: Lsn,
}

/// A typed log record. Byte strings borrow when encoding (so logging a row need not copy it
/// first) and borrow from the read buffer when decoding; [`Record::into_owned`] detaches them.
///
/// Payloads (after the record header):
/// - `Begin`, `Commit`, `Abort`: `txn: u64`.
/// - `Insert`: `txn: u64, index_id: u32, key: bytes, value: bytes`.
/// - `Delete`: `txn: u64, index_id: u32, key: bytes, old_value: bytes`.
/// - `Update`: `txn: u64, index_id: u32, key: bytes, old_value: bytes, new_value: bytes`.
/// - `CheckpointBegin`: empty.
/// - `CheckpointEnd`: `begin_lsn: u64, redo_lsn: u64, active count: u32, then per transaction
///   txn: u64, first_lsn: u64, last_lsn: u64; dirty count: u32, then per page page_id: u64,
///   rec_lsn: u64`.
/// - `IdentityReserve`: `table_id: u32, up_to: i64`.
/// - `Schema`: `description: bytes` (opaque to the log; the engine's catalog format).
/// - `InsertRun`: `txn: u64, index_id: u32, count: u32, then per row key: bytes, value: bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A transaction started.
    Begin {
        /// The transaction.
        txn: TxnId,
    },
    /// A row was inserted.
    Insert {
        /// The transaction.
        txn: TxnId,
        /// The index (clustered or nonclustered) the row went into.
        index_id: u32,
        /// The encoded key.
        key: Cow<'a, [u8]>,
        /// The encoded value.
        value: Cow<'a, [u8]>,
    },
    /// A row was deleted.
    Delete {
        /// The transaction.
        txn: TxnId,
        /// The index.
        index_id: u32,
        /// The encoded key.
        key: Cow<'a, [u8]>,
        /// The value the row had, to put it back on undo.
        old_value: Cow<'a, [u8]>,
    },
    /// A row's value was replaced.
    Update {
        /// The transaction.
        txn: TxnId,
        /// The index.
        index_id: u32,
        /// The encoded key.
        key: Cow<'a, [u8]>,
        /// The value before (undo).
        old_value: Cow<'a, [u8]>,
        /// The value after (redo).
        new_value: Cow<'a, [u8]>,
    },
    /// A transaction committed: durable once this record is.
    Commit {
        /// The transaction.
        txn: TxnId,
    },
    /// A transaction rolled back.
    Abort {
        /// The transaction.
        txn: TxnId,
    },
    /// A checkpoint started.
    CheckpointBegin,
    /// A checkpoint ended.
    CheckpointEnd {
        /// LSN of the matching `CheckpointBegin`.
        begin_lsn: Lsn,
        /// Where redo must start.
        redo_lsn: Lsn,
        /// Transactions active at the checkpoint.
        active_txns: Vec<ActiveTxn>,
        /// Pages dirty at the checkpoint.
        dirty_pages: Vec<DirtyPage>,
    },
    /// Identity values of a table were handed out up to `up_to`: after a crash the table's
    /// identity continues above it, so a value is never reused.
    IdentityReserve {
        /// The table.
        table_id: u32,
        /// The highest value that may have been handed out.
        up_to: i64,
    },
    /// A schema change. The log does not interpret it: the engine writes its own description
    /// of the change and reads it back at recovery, so this layer knows nothing of tables.
    Schema {
        /// The description.
        description: Cow<'a, [u8]>,
    },
    /// Rows inserted into one index, in order: what a multi-row statement logs instead of one
    /// `Insert` per row. The header, transaction and index are written once for the run, which
    /// cuts a 100-byte row's log bytes by about a third and its appends to one per run.
    InsertRun {
        /// The transaction.
        txn: TxnId,
        /// The index the rows went into.
        index_id: u32,
        /// Each row's encoded key and value.
        rows: Vec<RunRow<'a>>,
    },
}

/// One row of an [`Record::InsertRun`]: its encoded key and value.
pub type RunRow<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// Why a payload could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Bytes of a length-prefixed byte string.
fn bytes_len(bytes: &[u8]) -> usize {
    4 + bytes.len()
}

/// Payload bytes of an `InsertRun` before its rows: transaction, index and row count.
pub const INSERT_RUN_FIXED_BYTES: usize = 16;

/// Payload bytes one row takes in an `InsertRun`: its key and value, each length-prefixed.
pub fn insert_run_row_bytes(key: &[u8], value: &[u8]) -> usize {
    bytes_len(key) + bytes_len(value)
}

impl<'a> Record<'a> {
    /// The record's type byte.
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Begin { .. } => RecordKind::Begin,
            Record::Insert { .. } => RecordKind::Insert,
            Record::Delete { .. } => RecordKind::Delete,
            Record::Update { .. } => RecordKind::Update,
            Record::Commit { .. } => RecordKind::Commit,
            Record::Abort { .. } => RecordKind::Abort,
            Record::CheckpointBegin => RecordKind::CheckpointBegin,
            Record::CheckpointEnd { .. } => RecordKind::CheckpointEnd,
            Record::IdentityReserve { .. } => RecordKind::IdentityReserve,
            Record::Schema { .. } => RecordKind::Schema,
            Record::InsertRun { .. } => RecordKind::InsertRun,
        }
    }

    /// The transaction the record belongs to, if any.
    pub fn txn(&self) -> Option<TxnId> {
        match self {
            Record::Begin { txn }
            | Record::Insert { txn, .. }
            | Record::Delete { txn, .. }
            | Record::Update { txn, .. }
            | Record::InsertRun { txn, .. }
            | Record::Commit { txn }
            | Record::Abort { txn } => Some(*txn),
            _ => None,
        }
    }

    /// The payload's length in bytes, computed without encoding it.
    pub fn payload_len(&self) -> usize {
        match self {
            Record::Begin { .. } | Record::Commit { .. } | Record::Abort { .. } => 8,
            Record::Insert { key, value, .. } => 12 + bytes_len(key) + bytes_len(value),
            Record::Delete { key, old_value, .. } => 12 + bytes_len(key) + bytes_len(old_value),
            Record::Update {
                key,
                old_value,
                new_value,
                ..
            } => 12 + bytes_len(key) + bytes_len(old_value) + bytes_len(new_value),
            Record::CheckpointBegin => 0,
            Record::CheckpointEnd {
                active_txns,
                dirty_pages,
                ..
            } => 16 + 4 + 24 * active_txns.len() + 4 + 16 * dirty_pages.len(),
            Record::IdentityReserve { .. } => 12,
            Record::Schema { description } => bytes_len(description),
            Record::InsertRun { rows, .. } => {
                INSERT_RUN_FIXED_BYTES
                    + rows
                        .iter()
                        .map(|(key, value)| insert_run_row_bytes(key, value))
                        .sum::<usize>()
            }
        }
    }

    /// Header plus payload, before padding.
    pub fn total_len(&self) -> usize {
        WAL_RECORD_HEADER_BYTES + self.payload_len()
    }

    /// Feeds the payload to `sink` piece by piece, without building it in memory: the writer
    /// assembles the pieces behind the header where it needs them.
    pub fn write_payload(&self, sink: &mut impl FnMut(&[u8])) {
        fn bytes(sink: &mut impl FnMut(&[u8]), bytes: &[u8]) {
            // A record over MAX_WAL_RECORD_BYTES is refused before it is encoded, so every
            // byte string's length fits in a u32.
            sink(&(bytes.len() as u32).to_le_bytes());
            sink(bytes);
        }
        match self {
            Record::Begin { txn } | Record::Commit { txn } | Record::Abort { txn } => {
                sink(&txn.0.to_le_bytes());
            }
            Record::Insert {
                txn,
                index_id,
                key,
                value: second,
            }
            | Record::Delete {
                txn,
                index_id,
                key,
                old_value: second,
            } => {
                sink(&txn.0.to_le_bytes());
                sink(&index_id.to_le_bytes());
                bytes(sink, key);
                bytes(sink, second);
            }
            Record::Update {
                txn,
                index_id,
                key,
                old_value,
                new_value,
            } => {
                sink(&txn.0.to_le_bytes());
                sink(&index_id.to_le_bytes());
                bytes(sink, key);
                bytes(sink, old_value);
                bytes(sink, new_value);
            }
            Record::CheckpointBegin => {}
            Record::CheckpointEnd {
                begin_lsn,
                redo_lsn,
                active_txns,
                dirty_pages,
            } => {
                sink(&begin_lsn.0.to_le_bytes());
                sink(&redo_lsn.0.to_le_bytes());
                sink(&(active_txns.len() as u32).to_le_bytes());
                for active in active_txns {
                    sink(&active.txn.0.to_le_bytes());
                    sink(&active.first_lsn.0.to_le_bytes());
                    sink(&active.last_lsn.0.to_le_bytes());
                }
                sink(&(dirty_pages.len() as u32).to_le_bytes());
                for page in dirty_pages {
                    sink(&page.page_id.to_le_bytes());
                    sink(&page.rec_lsn.0.to_le_bytes());
                }
            }
            Record::IdentityReserve { table_id, up_to } => {
                sink(&table_id.to_le_bytes());
                sink(&up_to.to_le_bytes());
            }
            Record::Schema { description } => bytes(sink, description),
            Record::InsertRun {
                txn,
                index_id,
                rows,
            } => {
                sink(&txn.0.to_le_bytes());
                sink(&index_id.to_le_bytes());
                sink(&(rows.len() as u32).to_le_bytes());
                for (key, value) in rows {
                    bytes(sink, key);
                    bytes(sink, value);
                }
            }
        }
    }

    /// The payload as one byte vector.
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload_len());
        self.write_payload(&mut |piece| out.extend_from_slice(piece));
        out
    }

    /// Decodes a payload of the given type byte. Never panics: any malformed input is an error.
    pub fn decode(kind: u8, payload: &'a [u8]) -> Result<Record<'a>, DecodeError> {
        let kind = RecordKind::from_byte(kind)
            .ok_or_else(|| DecodeError(format!("unknown record type {kind}")))?;
        let mut input = Input { rest: payload };
        let record = match kind {
            RecordKind::Begin => Record::Begin { txn: input.txn()? },
            RecordKind::Commit => Record::Commit { txn: input.txn()? },
            RecordKind::Abort => Record::Abort { txn: input.txn()? },
            RecordKind::Insert => Record::Insert {
                txn: input.txn()?,
                index_id: input.u32()?,
                key: input.bytes()?,
                value: input.bytes()?,
            },
            RecordKind::Delete => Record::Delete {
                txn: input.txn()?,
                index_id: input.u32()?,
                key: input.bytes()?,
                old_value: input.bytes()?,
            },
            RecordKind::Update => Record::Update {
                txn: input.txn()?,
                index_id: input.u32()?,
                key: input.bytes()?,
                old_value: input.bytes()?,
                new_value: input.bytes()?,
            },
            RecordKind::CheckpointBegin => Record::CheckpointBegin,
            RecordKind::CheckpointEnd => {
                let begin_lsn = Lsn(input.u64()?);
                let redo_lsn = Lsn(input.u64()?);
                let active = input.count(24)?;
                let mut active_txns = Vec::with_capacity(active);
                for _ in 0..active {
                    active_txns.push(ActiveTxn {
                        txn: input.txn()?,
                        first_lsn: Lsn(input.u64()?),
                        last_lsn: Lsn(input.u64()?),
                    });
                }
                let dirty = input.count(16)?;
                let mut dirty_pages = Vec::with_capacity(dirty);
                for _ in 0..dirty {
                    dirty_pages.push(DirtyPage {
                        page_id: input.u64()?,
                        rec_lsn: Lsn(input.u64()?),
                    });
                }
                Record::CheckpointEnd {
                    begin_lsn,
                    redo_lsn,
                    active_txns,
                    dirty_pages,
                }
            }
            RecordKind::IdentityReserve => Record::IdentityReserve {
                table_id: input.u32()?,
                up_to: input.u64()? as i64,
            },
            RecordKind::Schema => Record::Schema {
                description: input.bytes()?,
            },
            RecordKind::InsertRun => {
                let txn = input.txn()?;
                let index_id = input.u32()?;
                // Each row takes at least its two length fields.
                let count = input.count(8)?;
                let mut rows = Vec::with_capacity(count);
                for _ in 0..count {
                    rows.push((input.bytes()?, input.bytes()?));
                }
                Record::InsertRun {
                    txn,
                    index_id,
                    rows,
                }
            }
        };
        if !input.rest.is_empty() {
            return Err(DecodeError(format!(
                "{} bytes left over after a {kind:?} record",
                input.rest.len()
            )));
        }
        Ok(record)
    }

    /// The same record owning its byte strings.
    pub fn into_owned(self) -> Record<'static> {
        fn own(bytes: Cow<'_, [u8]>) -> Cow<'static, [u8]> {
            Cow::Owned(bytes.into_owned())
        }
        match self {
            Record::Begin { txn } => Record::Begin { txn },
            Record::Commit { txn } => Record::Commit { txn },
            Record::Abort { txn } => Record::Abort { txn },
            Record::Insert {
                txn,
                index_id,
                key,
                value,
            } => Record::Insert {
                txn,
                index_id,
                key: own(key),
                value: own(value),
            },
            Record::Delete {
                txn,
                index_id,
                key,
                old_value,
            } => Record::Delete {
                txn,
                index_id,
                key: own(key),
                old_value: own(old_value),
            },
            Record::Update {
                txn,
                index_id,
                key,
                old_value,
                new_value,
            } => Record::Update {
                txn,
                index_id,
                key: own(key),
                old_value: own(old_value),
                new_value: own(new_value),
            },
            Record::CheckpointBegin => Record::CheckpointBegin,
            Record::CheckpointEnd {
                begin_lsn,
                redo_lsn,
                active_txns,
                dirty_pages,
            } => Record::CheckpointEnd {
                begin_lsn,
                redo_lsn,
                active_txns,
                dirty_pages,
            },
            Record::IdentityReserve { table_id, up_to } => {
                Record::IdentityReserve { table_id, up_to }
            }
            Record::Schema { description } => Record::Schema {
                description: own(description),
            },
            Record::InsertRun {
                txn,
                index_id,
                rows,
            } => Record::InsertRun {
                txn,
                index_id,
                rows: rows
                    .into_iter()
                    .map(|(key, value)| (own(key), own(value)))
                    .collect(),
            },
        }
    }
}

/// A bounds-checked cursor over a payload.
struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < len {
            return Err(DecodeError(format!(
                "payload ends early: {len} bytes needed, {} left",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    fn txn(&mut self) -> Result<TxnId, DecodeError> {
        Ok(TxnId(self.u64()?))
    }

    fn bytes(&mut self) -> Result<Cow<'a, [u8]>, DecodeError> {
        let len = self.u32()? as usize;
        Ok(Cow::Borrowed(self.take(len)?))
    }

    /// A `u32` element count, checked against the bytes left so that garbage cannot make the
    /// decoder reserve gigabytes.
    fn count(&mut self, element_bytes: usize) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        if count.saturating_mul(element_bytes) > self.rest.len() {
            return Err(DecodeError(format!(
                "{count} elements of {element_bytes} bytes do not fit in the {} bytes left",
                self.rest.len()
            )));
        }
        Ok(count)
    }
}

/// A record header as read from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// The stored CRC32C.
    pub crc: u32,
    /// Header plus payload.
    pub total_len: u32,
    /// The record's LSN as stored.
    pub lsn: Lsn,
    /// Payload bytes.
    pub payload_len: u32,
    /// Type byte.
    pub kind: u8,
    /// Flags byte (zero).
    pub flags: u8,
    /// Reserved (zero).
    pub reserved: u16,
}

impl RecordHeader {
    /// Splits the 24 header bytes into fields, without judging them.
    pub fn parse(bytes: &[u8; WAL_RECORD_HEADER_BYTES]) -> RecordHeader {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        RecordHeader {
            crc: u32_at(0),
            total_len: u32_at(4),
            lsn: Lsn(u64::from_le_bytes(bytes[8..16].try_into().expect("8"))),
            payload_len: u32_at(16),
            kind: bytes[20],
            flags: bytes[21],
            reserved: u16::from_le_bytes([bytes[22], bytes[23]]),
        }
    }

    /// Checks everything that can be checked without the payload, for a record read at
    /// `position`: why it cannot be a record, or `None` if it may be one.
    pub fn problem(&self, position: Lsn) -> Option<&'static str> {
        let total = self.total_len as usize;
        if total == 0 {
            Some("zero length (nothing was written here)")
        } else if !(WAL_RECORD_HEADER_BYTES..=MAX_WAL_RECORD_BYTES).contains(&total) {
            Some("record length out of bounds")
        } else if self.payload_len as usize + WAL_RECORD_HEADER_BYTES != total {
            Some("record and payload lengths disagree")
        } else if self.lsn != position {
            Some("stored LSN is not the record's position")
        } else if self.flags != 0 || self.reserved != 0 {
            Some("reserved header bytes are not zero")
        } else {
            None
        }
    }
}

/// The header of a record of `kind` with `payload_len` payload bytes at `lsn`, with its CRC
/// field still zero.
pub fn header_without_crc(
    kind: RecordKind,
    lsn: Lsn,
    payload_len: usize,
) -> [u8; WAL_RECORD_HEADER_BYTES] {
    let mut header = [0u8; WAL_RECORD_HEADER_BYTES];
    let total = (WAL_RECORD_HEADER_BYTES + payload_len) as u32;
    header[4..8].copy_from_slice(&total.to_le_bytes());
    header[8..16].copy_from_slice(&lsn.0.to_le_bytes());
    header[16..20].copy_from_slice(&(payload_len as u32).to_le_bytes());
    header[20] = kind as u8;
    header
}

/// Where every record checksum of the log with id `log_id` starts: the CRC32C of the id's
/// eight little-endian bytes. Seeding the checksum with the log's id means that bytes of
/// another log, or bytes a user chose (a row's payload inside an old record of a recycled
/// segment), cannot pass for a record of this log without knowing its random id.
pub fn checksum_seed(log_id: u64) -> u32 {
    crc32c::crc32c(&log_id.to_le_bytes())
}

/// The CRC32C a record's header (bytes 4..24) and payload pieces must carry in the log with
/// id `log_id`.
pub fn checksum<'p>(
    log_id: u64,
    header: &[u8; WAL_RECORD_HEADER_BYTES],
    payload: impl IntoIterator<Item = &'p [u8]>,
) -> u32 {
    seeded_checksum(checksum_seed(log_id), header, payload)
}

/// [`checksum`] from a seed computed once per log ([`checksum_seed`]), for readers and writers
/// that check or make many records.
pub fn seeded_checksum<'p>(
    seed: u32,
    header: &[u8; WAL_RECORD_HEADER_BYTES],
    payload: impl IntoIterator<Item = &'p [u8]>,
) -> u32 {
    let mut crc = crc32c::crc32c_append(seed, &header[4..]);
    for piece in payload {
        crc = crc32c::crc32c_append(crc, piece);
    }
    crc
}

/// The complete on-disk image of `record` at `lsn` in the log with id `log_id`: header,
/// payload and zero padding. The writer does not call this (it assembles header and payload in
/// a per-thread buffer and copies that into the log buffer); tests and tools do.
pub fn encode(record: &Record<'_>, lsn: Lsn, log_id: u64) -> Vec<u8> {
    let payload = record.encode_payload();
    let mut header = header_without_crc(record.kind(), lsn, payload.len());
    let crc = checksum(log_id, &header, [payload.as_slice()]);
    header[0..4].copy_from_slice(&crc.to_le_bytes());
    let mut image = Vec::with_capacity(align_up(header.len() + payload.len()));
    image.extend_from_slice(&header);
    image.extend_from_slice(&payload);
    image.resize(align_up(image.len()), 0);
    image
}
