//! Every fixed limit of the storage layer, in one place, with the compile-time checks that
//! relate them.

/// Size of every page, in bytes (SQL Server's page size).
pub const PAGE_SIZE_BYTES: usize = 8192;

/// Size of the fixed page header at the start of every page, in bytes.
pub const PAGE_HEADER_BYTES: usize = 96;

/// Size of one entry of the slot array, in bytes.
pub const SLOT_BYTES: usize = 2;

/// Largest record (key plus value plus record header) a leaf page accepts, in bytes. It is
/// SQL Server's in-row limit: one record of this size, with its slot, fills a page.
pub const MAX_RECORD_BYTES: usize = 8060;

/// Largest key the B+tree accepts, in bytes (SQL Server's limit for a clustered key is 900
/// bytes; a nonclustered key holds its own columns plus the clustered key, so we allow more).
pub const MAX_KEY_BYTES: usize = 1700;

/// Bytes of record header in front of a leaf record's key and value: key length and value
/// length, two bytes each.
pub const LEAF_RECORD_HEADER_BYTES: usize = 4;

/// Bytes of record header in front of an inner record's separator key: key length (two bytes)
/// and child page id (four bytes).
pub const INNER_RECORD_HEADER_BYTES: usize = 6;

/// Bytes of a page usable for slots and records.
pub const PAGE_BODY_BYTES: usize = PAGE_SIZE_BYTES - PAGE_HEADER_BYTES;

/// The most rows one leaf page can hold: every row takes at least its slot and its record
/// header, even with an empty key and an empty value. A bound, not a capacity anyone reaches.
pub const MAX_LEAF_ROWS: u64 = (PAGE_BODY_BYTES / (SLOT_BYTES + LEAF_RECORD_HEADER_BYTES)) as u64;

/// The most rows (index entries) one B+tree can hold: [`MAX_LEAF_ROWS`] on every page a pool can
/// have. The engine's open refuses a catalog's row count above it as damage: a tree's row
/// counter is an i64 (see `btree::StripedCounter`), and a count restored from a forged catalog
/// near `i64::MAX` wrapped on the next insert, so that the table then read as empty.
pub const MAX_TREE_ROWS: u64 = MAX_POOL_PAGES as u64 * MAX_LEAF_ROWS;

/// Most pages one buffer pool can address (128 GiB of 8 KiB pages): the page table is a
/// two-level array of `PAGE_TABLE_CHUNK_PAGES`-entry chunks.
pub const MAX_PAGES: usize = 1 << 24;

/// The most pages one buffer pool holds: page ids run from 1 to this, below `MAX_PAGES` (id 0
/// is no page). A configured page limit (`PoolConfig::max_pages`) counts pages, up to this.
pub const MAX_POOL_PAGES: usize = MAX_PAGES - 1;

/// The most 8 KiB slots a data file can have: each page is in at most three slots at once (the
/// durable image's, a captured image's not yet durable, and the one it was written to since),
/// a failed checkpoint may leak one more until the file is reopened, and the images' streams
/// take a few more: five per page leaves room for those. `DataFile::open` refuses a longer
/// file as damage (a sparse file claims any length for free), since it sizes its slot marks
/// and free list by the file's length.
pub const MAX_DATA_FILE_SLOTS: u32 = 5 * MAX_PAGES as u32;

/// The most bytes of a data file image's stream (page map and catalog) reserved before its
/// slots are read: the stream grows as they are, and a length a meta slot merely claims must
/// not be allocated at once.
pub const STREAM_RESERVE_BYTES: u64 = 1 << 20;

/// OPTIMIZE_FOR_SEQUENTIAL_KEY flow control prefers workers likely to finish quickly, but after
/// this many places in a row went to them while a slow worker (one whose last write split a
/// page) waited, the slow worker gets the next place: the preference may delay it, never starve
/// it. Eight keeps splitters rare among the admitted (at most one place in nine while both
/// kinds wait) without letting one wait more than a few hand-offs per slow worker ahead of it.
pub const FLOW_CONTROL_FAST_HANDOFFS_MAX: usize = 8;

/// Pages per chunk of the page table (and per allocation of frames).
pub const PAGE_TABLE_CHUNK_PAGES: usize = 1024;

/// Default memory budget of a file-backed buffer pool: resident page bytes, 1 GiB (131,072
/// pages). Memory-only pools are unbounded.
pub const DEFAULT_MEMORY_BUDGET_BYTES: usize = 1 << 30;

/// Most pages one eviction sweep evicts. A batch amortises the before-write hook (a log flush)
/// over many dirty pages; a pool whose budget is small evicts at most a quarter of it at once,
/// so a sweep never empties the pool of the pages its threads are about to latch again.
pub const EVICTION_BATCH_PAGES: usize = 32;

/// Page buffers in the buffer pool's first slab of page memory (`page_memory.rs`); each later
/// slab is twice the one before, up to [`PAGE_SLAB_MAX_PAGES`]. 16 pages are 128 KiB, glibc's
/// default mmap threshold, so even the first slab is a mapping of its own.
pub const PAGE_SLAB_MIN_PAGES: usize = 16;

/// Page buffers in the largest slab of page memory: 8 MiB, one allocation per 1,024 pages.
pub const PAGE_SLAB_MAX_PAGES: usize = 1024;

/// Deepest B+tree the tree code accepts (levels from the root down to the leaves). With 8 KiB
/// pages and keys of at most `MAX_KEY_BYTES`, 32 levels address far more than `MAX_PAGES`.
pub const MAX_INDEX_LEVELS: usize = 32;

/// How many times a latch spins on a held latch before it parks the thread (the unfair latch
/// only; the fair latch queues at once, as a hand-off latch must). Each round is one attempt
/// followed by a busy backoff: see `LATCH_SPIN_MAX_PAUSE_LOG2`. Measured with
/// `tests/latch_throughput.rs` on 2 cores: rounds that yield the processor cost a whole time
/// slice of a CPU-bound competitor each (milliseconds, not microseconds) and starved parked
/// threads, so every round is a busy spin; ten rounds (about 1000 spin-loop hints, tens of
/// microseconds) spin for roughly what a park and wake-up would cost.
pub const LATCH_SPIN_LIMIT: u32 = 10;

/// Round `r` of a latch's spin issues `2^min(r, LATCH_SPIN_MAX_PAUSE_LOG2)` spin-loop hints:
/// with ten rounds, an exponential backoff throughout (1 + 2 + ... + 512 hints).
pub const LATCH_SPIN_MAX_PAUSE_LOG2: u32 = 9;

/// Lanes of a tree's sequence-keyed inserts (see `btree/lanes.rs`): at most this many leaves at
/// the end of an index take rows at once. Enough that the threads of a few cores rarely share
/// one (a thread keeps its lane); each lane leaves at most one leaf partly filled.
pub const TAIL_LANES: usize = 16;

/// Largest IDENTITY increment whose values are taken in lane blocks (see `btree/lanes.rs`).
/// Each lane reserves about a leaf's worth of values at once (up to a few hundred rows), so
/// all lanes together hold up to `TAIL_LANES` blocks; with a larger increment those blocks would
/// use up a noticeable part of an INT's range, and an insert could report an overflow while
/// many values were still free. Near the end of the range the same can happen with any
/// increment: by at most `TAIL_LANES` blocks.
pub const LANE_IDENTITY_MAX_INCREMENT: i64 = 1000;

/// Bits of a uniquifier below its block number (see the engine's `uniquifier.rs`): a stripe of
/// a table's uniquifiers takes a block of 2^40 values at a time, so a table has 2^24 blocks.
/// Blocks are taken only when a stripe is first used and when one is used up, so a table never
/// runs out but through a file whose rows already hold a value near the end of the range.
pub const UNIQUIFIER_BLOCK_BITS: u32 = 40;

/// Stripes of a table's uniquifiers: threads take values from stripe (thread number modulo
/// this), each on its own cache line and in its own block, so concurrent inserts into a heap or
/// a non-unique clustered index rarely share a cache line for it, and a heap's threads append
/// in separate key ranges rather than all at its last page. 8 KiB per such table.
pub const UNIQUIFIER_STRIPES: usize = 64;

/// Identity values a logged table reserves in its log at once, at first (see the engine's
/// `IdentityState`): for TINYINT and SMALLINT, INT, and BIGINT columns. SQL Server's identity
/// cache has about these sizes, and they bound the same thing: the values skipped after a
/// crash or restart (up to one and a half reservations).
pub const IDENTITY_RESERVE_VALUES_NARROW: u64 = 10;
/// See [`IDENTITY_RESERVE_VALUES_NARROW`].
pub const IDENTITY_RESERVE_VALUES_INT: u64 = 1_000;
/// See [`IDENTITY_RESERVE_VALUES_NARROW`].
pub const IDENTITY_RESERVE_VALUES_BIGINT: u64 = 10_000;

/// How many times a table's identity reservation may double: it doubles each time an insert
/// had to wait for a reservation logged ahead of it to reach the disk (values are taken faster
/// than the log is flushed), so that a fast loader soon stops waiting. Up to 1,024 times the
/// first size: 1,024,000 INT values, whose second half (the lead a reservation is appended
/// with) lasts a quarter of a second of the fastest durable load measured here (pipelined
/// 1,000-row batches, about 2M rows/s, whose log reaches the disk 30 ms after it is appended).
/// At 64 times, that load still waited for a reservation about fifty times in 5M rows.
pub const IDENTITY_RESERVE_DOUBLINGS_MAX: u32 = 10;

/// Rounds of the brief spin (`SpinBudget::BRIEF`), used by the default insert path's tail gate
/// for rows that share a page: about 35 spin-loop hints in all, a couple of microseconds, then
/// the thread parks. Their critical section (make the key, put the row on the last leaf) takes a
/// few hundred nanoseconds, but with a hundred appenders on 2 cores its cost is the cache lines
/// it pulls from the other core; appenders that park soon leave a few running ones that keep
/// those lines on their core. Measured with `lastpage bench insert --threads 100 --row-bytes
/// 100` (2 cores, 2,000,000 rows): 2.26M rows/s with this spin against 1.65M with the standard
/// one. Rows that fill a page each hold the gate several times longer and keep the standard
/// spin, which measured better there (350k against 248k rows/s with 8000-byte rows).
pub const BRIEF_SPIN_ROUNDS: u32 = 10;

/// Round `r` of the brief spin issues `2^min(r, BRIEF_SPIN_MAX_PAUSE_LOG2)` spin-loop hints.
pub const BRIEF_SPIN_MAX_PAUSE_LOG2: u32 = 2;

const _: () = assert!(PAGE_HEADER_BYTES + MAX_RECORD_BYTES + SLOT_BYTES <= PAGE_SIZE_BYTES);
const _: () = assert!(PAGE_SIZE_BYTES <= u16::MAX as usize + 1);
// An inner page must hold at least three maximal separators so that a split always leaves
// both halves with at least one separator.
const _: () =
    assert!(3 * (MAX_KEY_BYTES + INNER_RECORD_HEADER_BYTES + SLOT_BYTES) <= PAGE_BODY_BYTES);
const _: () = assert!(MAX_KEY_BYTES + LEAF_RECORD_HEADER_BYTES <= MAX_RECORD_BYTES);
const _: () = assert!(MAX_PAGES.is_multiple_of(PAGE_TABLE_CHUNK_PAGES));
// A tree's row counter starts at most at `MAX_TREE_ROWS` and each row added is on a page, so
// it stays far from the end of its i64 range.
const _: () = assert!(MAX_TREE_ROWS <= i64::MAX as u64 / 1024);
// A backoff round shifts a `u32` by at most these.
const _: () = assert!(LATCH_SPIN_MAX_PAUSE_LOG2 < 32 && BRIEF_SPIN_MAX_PAUSE_LOG2 < 32);

/// Rounds the default insert path retries a busy tail leaf without queueing for it.
pub const TAIL_LATCH_ROUNDS: u32 = 64;

/// Of those rounds, how many spin (with exponential backoff) before the rest yield.
pub const TAIL_LATCH_SPIN_ROUNDS: u32 = 8;

/// Bytes of the header in front of every write-ahead log record's payload: CRC32C (4), total
/// length (4), LSN (8), payload length (4), record type (1), flags (1), reserved (2). See
/// `docs/wal-format.md`.
pub const WAL_RECORD_HEADER_BYTES: usize = 24;

/// Every log record starts at a multiple of this many bytes of the logical log (its LSN is a
/// multiple of it), padding the previous record with zeros. Eight lets the in-memory log buffer
/// be an array of 64-bit words that no two records share, so appenders copy in parallel with
/// plain word stores and publish a record by storing its first word last.
pub const WAL_RECORD_ALIGN_BYTES: usize = 8;

/// The largest LSN a log may start at. A log grows at most a few GB/s, so it would take a
/// century to get here; a segment file named beyond it was not made by the writer, and sums of
/// LSNs and record lengths below it cannot overflow.
pub const WAL_MAX_START_LSN: u64 = 1 << 62;

/// The largest log segment a configuration may ask for, or a segment header may claim (1 TiB):
/// sums of a segment's size, its header and an offset into it cannot overflow below it, and a
/// header claiming more was not written by the writer.
pub const WAL_MAX_SEGMENT_BYTES: u64 = 1 << 40;

/// No log position lies beyond this: the end of the largest segment at the last start a
/// segment header may name. A log reader stops here, and a checkpoint naming a position past
/// it is refused at the open.
pub const WAL_MAX_END_LSN: u64 = WAL_MAX_START_LSN + WAL_MAX_SEGMENT_BYTES;

/// Largest log record, header and payload, that the log accepts or a reader believes: a length
/// field above it marks garbage (a torn tail). One megabyte holds any row change (key plus old
/// and new values, each limited by a page) with room for large checkpoint records.
pub const MAX_WAL_RECORD_BYTES: usize = 1 << 20;

/// An upper bound on the log record of one row change (its key, old value and new value, each
/// at most a page's record, with their lengths and the header). A log that is to hold a
/// database's changes must accept records this large: the engine refuses a log buffer smaller
/// than this, since a change it could not log would have to fail the whole database.
pub const WAL_ROW_CHANGE_MAX_BYTES: usize =
    (WAL_RECORD_HEADER_BYTES + 64 + 3 * MAX_RECORD_BYTES).next_multiple_of(WAL_RECORD_ALIGN_BYTES);

/// A thread keeps the buffer it assembles log records in for its next append unless the buffer
/// has grown past this many bytes (a large record's buffer is freed instead of being kept). It
/// holds the largest `InsertRun` record, so a batch-loading thread reuses its buffer.
pub const WAL_KEPT_RECORD_IMAGE_BYTES: usize = 128 << 10;

/// Largest payload of an `InsertRun` log record (a multi-row statement's inserts into one
/// index): a longer run is logged as several. Large enough that the per-record header is
/// negligible (about 600 rows of 100 bytes), small enough to leave the log buffer room for
/// other sessions' records.
pub const WAL_INSERT_RUN_MAX_BYTES: usize = 64 << 10;

/// Default size of the in-memory log buffer (a ring that appenders copy into and the group
/// commit leader writes out from). Appenders wait (LOGBUFFER) when it is full. It must hold the
/// largest record. 16 MiB, PostgreSQL's largest automatic `wal_buffers`: one thread keeping 64
/// pipelined 1,000-row batches in flight (about 7.4 MB of log) waited for room in a 4 MiB
/// buffer about 100 times a run; with 16 MiB it never did, and `bench durable --threads 1`
/// gave a median of 1.87M pipelined rows/s against 1.72M (twelve interleaved runs each,
/// 1.36–2.07M against 1.30–1.98M). Single-row commits never fill either.
pub const WAL_BUFFER_BYTES: usize = 16 << 20;

/// Default number of bytes of the logical log in one log segment file (after the segment
/// header). Segments let checkpoints drop old log by deleting whole files.
pub const WAL_SEGMENT_BYTES: u64 = 64 << 20;

/// Bytes of the header at the start of every log segment file; the segment's log bytes follow
/// it. A whole page, so that the log bytes start page-aligned in the file.
pub const WAL_SEGMENT_HEADER_BYTES: usize = 4096;

/// The mean size of a log segment's flushes, in bytes, from which the next segment file is
/// prepared by reserving its space (`File::allocate`) rather than by writing zeros over it,
/// when no recycled segment is at hand (`wal/prepare.rs`). Zeros cost a second write of every
/// log byte, which flushes this large feel, since they wait for the disk's bandwidth; a
/// reserved block costs the first flush into it a metadata update, which small flushes feel,
/// since they wait for the fdatasync's latency (on this project's VM: 180–190 µs after a 4 KiB
/// append into zeros, 230–260 µs into reserved space). With 64 pipelined 1,000-row batches in
/// flight (flushes of 0.7–1.9 MB), reserving took the bytes the disk wrote per row from
/// 244–289 to 176–228 and one thread from 1.04–1.46M (median 1.36M) to 1.09–2.04M (median
/// 1.47M) rows/s (`bench durable --threads 1`, four interleaved runs each). The bound was
/// 256 KiB then. The pipelined batches' flushes have since become smaller (1.6–2.3 commits of
/// 116 KiB each by the benchmark's commits per fdatasync, 180–270 KiB), so their segments were
/// zero-filled again: at 128 KiB they are reserved, and the batches gave a median of 2.00M rows/s against 1.81M (six interleaved pairs, 1.50–2.52M against
/// 1.10–2.45M), while a FULL commit of one 1,000-row batch (116 KiB, still below the bound,
/// into zeros) stayed where it was (median 1.00M against 0.94M). At 64 KiB those commits went
/// into reserved space too and slowed (0.90M against 0.96M, five pairs).
pub const WAL_RESERVE_FLUSH_BYTES: u64 = 128 << 10;

/// How far ahead of the log's end the writer zero-fills the current segment file, in bytes:
/// an fdatasync that does not change the file's size has no metadata to commit.
pub const WAL_PREALLOCATE_BYTES: u64 = 1 << 20;

/// How full, in percent, the log segment being written is when the writer asks for the next
/// segment file to be prepared in the background (`wal/prepare.rs`): early enough that the
/// file is ready at the switch, late enough that a short-lived log never prepares one.
pub const WAL_PREPARE_AT_SEGMENT_PERCENT: u64 = 50;

/// Log segments a checkpoint no longer needs that are kept as spares, to become later segments
/// without being zero-filled (see `wal/prepare.rs`); more are removed. Four 64 MiB segments
/// cover the log a checkpoint interval (`CHECKPOINT_LOG_BYTES`) writes.
pub const WAL_SPARE_SEGMENTS_MAX: usize = 4;

/// Committers waiting for the log at once, per processor, from which a committer waits for a
/// flush by yielding the processor instead of parking (`WalConfig::yield_wait_committers`,
/// `wal/writer.rs`). Durable single-row commits on this project's 2-vCPU VM, interleaved runs
/// of `bench insert --db DIR --durability full` against parking always: 100 threads 110–120k
/// against 84–95k rows/s, 300 threads 91–105k against 67–83k; 10 and 30 threads unchanged.
/// Yielding at 10 threads as well lost 8–30% there: with few committers the yields only burn
/// the processors that the leader's I/O completion needs.
pub const WAL_YIELD_WAIT_COMMITTERS_PER_CPU: usize = 8;

/// The longest a committer yields waiting for one flush before it parks, in nanoseconds: a few
/// fdatasyncs of an SSD, so that a slow or stuck device costs yielding threads no more than
/// this.
pub const WAL_YIELD_WAIT_MAX_NS: u64 = 2_000_000;

/// Bytes of zeros the segment preparer writes per call (it checks for shutdown between them).
pub const WAL_PREPARE_CHUNK_BYTES: usize = 1 << 20;

/// A thread keeps the buffers it completes and encodes single-row inserts in (the engine's
/// `with_scratch` buffers) unless one has grown past this many bytes: room for a CHAR(8000)
/// row's encoded value, and for the values of a row of a few hundred columns.
pub const INSERT_SCRATCH_KEPT_BYTES: usize = 16 << 10;

/// A thread keeps the buffer of its last multi-row insert's encoded rows for the next one
/// unless it has grown past this many bytes: room for a 1,000-row batch of rows of up to about
/// a kilobyte.
pub const BATCH_BUFFER_KEPT_BYTES: usize = 1 << 20;

/// The most a multi-row insert reserves up front for its encoded rows (its first row's size
/// times the rows): 64 MiB, far more than the batching benchmarks' batches need, and small
/// enough that a wrong guess (a long first row among millions of short ones) costs no more.
pub const BATCH_BUFFER_RESERVE_MAX_BYTES: usize = 64 << 20;

/// The most times a lookup through a nonclustered index reads the index: it reads it again
/// when it finds a row gone or changed since it read the index (moved, perhaps, to another
/// clustered key with the same entry). A cap, so that writers that never stop cannot starve it.
pub const INDEX_LOOKUP_MAX_PASSES: u32 = 4;

/// Columns a row of borrowed values (the engine's `BorrowedRow`, which a prepared insert
/// completes per row) holds on the stack; a wider table's rows spill to the heap, one
/// allocation per row, and work the same.
pub const BORROWED_ROW_INLINE_COLUMNS: usize = 16;

/// How many bytes a log reader asks the file system for at a time.
pub const WAL_READ_CHUNK_BYTES: usize = 256 << 10;

const _: () = assert!(WAL_RECORD_HEADER_BYTES.is_multiple_of(WAL_RECORD_ALIGN_BYTES));
const _: () = assert!(WAL_PREPARE_AT_SEGMENT_PERCENT <= 100);
const _: () =
    assert!(WAL_RECORD_HEADER_BYTES + WAL_INSERT_RUN_MAX_BYTES <= WAL_KEPT_RECORD_IMAGE_BYTES);
const _: () = assert!(WAL_RECORD_HEADER_BYTES + WAL_INSERT_RUN_MAX_BYTES <= MAX_WAL_RECORD_BYTES);
const _: () = assert!(MAX_WAL_RECORD_BYTES.is_multiple_of(WAL_RECORD_ALIGN_BYTES));
const _: () = assert!(MAX_WAL_RECORD_BYTES <= u32::MAX as usize);
const _: () = assert!(MAX_WAL_RECORD_BYTES <= WAL_BUFFER_BYTES);
const _: () = assert!(WAL_BUFFER_BYTES.is_multiple_of(WAL_RECORD_ALIGN_BYTES));
const _: () = assert!(WAL_SEGMENT_BYTES.is_multiple_of(WAL_RECORD_ALIGN_BYTES as u64));
// A row change fits in a record.
const _: () = assert!(WAL_ROW_CHANGE_MAX_BYTES <= MAX_WAL_RECORD_BYTES);

/// Stripes of a database's count of ended writes (statements rolled back and transactions
/// that ended holding row locks): every such commit adds to the count, so one shared counter
/// would be a cache line every committing writer fights over; a reader sums the stripes.
pub const ENDED_WRITES_STRIPES: usize = 16;

/// Transaction ids are handed out from 1 upwards in blocks of a thousand or so, and nothing
/// reaches this one (a billion transactions a second would take 146 years). A stored catalog
/// or a log record naming an id at or above it is damage, refused when a database is opened:
/// trusting it would make the counter overflow (`Database::next_txn_id` adds a block to it; a
/// panic, or ids the log already holds handed out again).
pub const MAX_TXN_ID: u64 = 1 << 62;

/// Shards of a row lock manager when the caller has no better number: enough that threads
/// locking different rows rarely meet on one shard mutex.
pub const LOCK_MANAGER_DEFAULT_SHARDS: usize = 64;

/// Most shards a row lock manager accepts; larger requests are clamped to it. Each shard is a
/// cache-line-padded mutex and an empty hash map, so this bounds the manager's fixed memory.
pub const LOCK_MANAGER_MAX_SHARDS: usize = 1 << 16;

/// Row locks one transaction may hold on one table before it tries to trade them for a single
/// lock on the whole table (SQL Server's lock escalation threshold, 5,000). A transaction that
/// fails to escalate, because another transaction holds a lock on the table, tries again once
/// it holds twice as many locks, so the looking (one pass over every shard) costs a constant
/// per lock however large the transaction grows.
pub const LOCK_ESCALATION_THRESHOLD: usize = 5_000;

/// Undo entries an explicit transaction keeps in memory between its statements, in a durable
/// database; past this many, its changes to logged tables are undone from the log instead (see
/// the engine's `txn.rs`), so that a transaction of any size holds a bounded amount of memory
/// for its undo. At about 100 bytes an entry (its key included), a few megabytes.
pub const UNDO_KEPT_ENTRIES: usize = 1 << 16;

/// Undo entries' room a session keeps from its last transaction for its next one; a larger
/// list (a large transaction's, or a large batch's) is freed when its transaction ends.
pub const UNDO_SPARE_KEPT_ENTRIES: usize = 1 << 12;

/// Bytes of log records (their payloads) held in memory at a time by a reader that goes back
/// through part of the log newest first (a rollback of changes no longer in its undo list,
/// recovery's undo of transactions that never ended): it reads the part again in chunks of
/// about this size, each forward, and hands out each chunk's records in reverse.
pub const WAL_READ_BACK_CHUNK_BYTES: u64 = 4 << 20;

/// Bytes of a row lock's key (index ordinal and encoded key) stored inside the lock itself;
/// a longer key is allocated. Covers an identity (2 + 9 bytes), a GUID (2 + 17) and the
/// remedies' (ModValue, InsertID) keys, and keeps a lock key at 40 bytes.
pub const LOCK_KEY_INLINE_BYTES: usize = 30;

const _: () = assert!(
    LOCK_MANAGER_DEFAULT_SHARDS >= 1 && LOCK_MANAGER_DEFAULT_SHARDS <= LOCK_MANAGER_MAX_SHARDS
);

/// Pages a checkpoint writes per batch before it quiesces the writers (one log flush and one
/// round of shared latches per batch; see `BufferPool::write_dirty_pages`).
pub const CHECKPOINT_WRITE_BATCH_PAGES: usize = 256;

/// The most pages the data file writes with one positional write: a batch of pages (a
/// checkpoint's, or an eviction's) that goes to consecutive slots is written in runs of up to
/// this many (512 KiB) with one `pwritev` each. A `pwrite` per page cost about twice the CPU
/// of the run's share of one call, on the file system's per-call work (measured writing 8 KiB
/// pages into a growing file on ext4: 7.3 against 3.3 µs a page, Python's own cost included).
pub const DATA_FILE_WRITE_RUN_PAGES: usize = 64;

/// How long the thread that writes replayed pages back during recovery pauses between its
/// passes over the pool, in milliseconds.
pub const RECOVERY_WRITE_BACK_PAUSE_MS: u64 = 10;

/// Default memory budget of a durable database's buffer pool, in bytes.
pub const MEMORY_BUDGET_BYTES: usize = 1 << 30;

/// A durable database takes a checkpoint by itself once this many bytes of log were written
/// since the last one. It bounds recovery time (replay runs at hundreds of MB/s) and the log's
/// size on disk.
pub const CHECKPOINT_LOG_BYTES: u64 = 256 << 20;

/// How long opening a database waits for another handle of it to go away before it reports
/// the database as in use, in milliseconds.
pub const OPEN_LOCK_WAIT_MS: u64 = 2000;

/// How often the automatic checkpointer looks at how much log was written, in milliseconds.
pub const CHECKPOINT_POLL_INTERVAL_MS: u64 = 100;

/// The longest the automatic checkpointer waits before it tries again after failed checkpoints,
/// in milliseconds. After each failure in a row it waits twice as long as after the one
/// before, from `CHECKPOINT_POLL_INTERVAL_MS` on: every attempt pauses the writers for a
/// capture, and a disk that stays full would otherwise be tried ten times a second.
pub const CHECKPOINT_RETRY_MAX_MS: u64 = 10_000;

/// How long a DELAYED-durability commit may wait in the log buffer before the background
/// flusher writes it, in milliseconds: the window of commits a crash can lose.
pub const DELAYED_FLUSH_INTERVAL_MS: u64 = 20;

/// How deeply a computed column's stored expression may nest (`schema::Expr::depth`): a table
/// definition with a deeper one is refused, and so is a catalog naming one, whose decoding
/// recurses once per level.
pub const COMPUTED_EXPRESSION_MAX_DEPTH: usize = 32;

/// Attempts to free a leaf a delete emptied before the delete gives up and leaves it linked,
/// empty (see `btree/reclaim.rs`). An attempt fails only when the leaf's left sibling changed
/// between two latches (it split, or was freed itself) or was busy (latched by a reader or a
/// writer right beside it: it is then waited for with nothing held before the next attempt);
/// the delete then lists the leaf for a later retry ([`LEFTOVER_EMPTY_LEAVES_MAX`]).
pub const EMPTY_LEAF_FREE_ATTEMPTS: usize = 4;

/// How many emptied leaves a tree lists for a later retry after the freeing gave up on them
/// (or failed) (see `btree/reclaim.rs`): the next delete in the tree retries the oldest one,
/// and [`BTree::free_left_empty_leaves`] (which the engine calls at every checkpoint) retries
/// them all. Each entry is a key of at most [`MAX_KEY_BYTES`], so the list stays small. A
/// leaf left while the list is full is not listed (counted in
/// `TreeStats::empty_leaves_not_listed`): it stays, empty, until rows go into it and a delete
/// empties it again, or its tree is freed, which costs a page and loses nothing. Give-ups are
/// rare (a left sibling that changes or is busy four times running), so a full list means
/// something keeps the freeing from working, and more entries would not help.
///
/// [`BTree::free_left_empty_leaves`]: crate::btree::BTree::free_left_empty_leaves
pub const LEFTOVER_EMPTY_LEAVES_MAX: usize = 16;
