//! The data file behind a file-backed [`BufferPool`](crate::buffer::BufferPool): 8 KiB slots
//! holding shadow-paged checkpoint images. See `docs/data-file.md`.
//!
//! Slots 0 and 1 are meta slots, written alternately (generation `g` goes to slot `g % 2`), so
//! a torn meta write leaves the other, older meta slot intact. A meta slot names the image's
//! *stream*: a chain of slots holding the page map (slot and CRC32C of every page id), the
//! latch flavour of every page id, and the caller's opaque user blob. Every other slot holds one
//! page.
//!
//! The shadow-paging rule: a slot that belongs to the last durable image (its pages, its
//! stream) is never written until a newer image is durable, and a slot that belongs to a
//! captured but not yet durable image is never written either. Page writes outside those sets
//! are harmless whatever a crash does to them, because no durable meta slot points at them.
//!
//! Everything here is bookkeeping under one mutex plus positional I/O through the
//! [`lastpage_io::File`] trait; no latch is taken, so the pool may call in while it holds page
//! latches.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use lastpage_io::File;

use crate::buffer::PageError;
use crate::latch::LatchPolicy;
use crate::limits::{
    DATA_FILE_WRITE_RUN_PAGES, MAX_DATA_FILE_SLOTS, MAX_PAGES, PAGE_SIZE_BYTES,
    STREAM_RESERVE_BYTES,
};
use crate::page::{PageBytes, PageId};

/// Identifies a lastpage data file. The last byte is the major format version.
pub(crate) const MAGIC: [u8; 8] = *b"LPDATAF\x01";
/// The format version written into every meta slot. Version 2 added the pages' latch
/// flavours to the stream; this build also reads [`FORMAT_VERSION_1`], whose pages all take
/// the default flavour.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The first format version: a stream of page map and user blob only.
pub(crate) const FORMAT_VERSION_1: u32 = 1;
/// Bytes of a meta slot that carry fields; the rest of the slot is zero.
const META_BYTES: usize = 64;
/// Bytes at the start of every stream slot: the next slot of the chain (0 = none).
const STREAM_HEADER_BYTES: usize = 4;
/// Payload bytes of one stream slot.
const STREAM_PAYLOAD_BYTES: usize = PAGE_SIZE_BYTES - STREAM_HEADER_BYTES;
/// Bytes of one page map entry: slot (u32) and CRC32C (u32).
const MAP_ENTRY_BYTES: usize = 8;
/// Bytes of one page's latch flavour in the stream (format version 2 on): a tag byte.
const FLAVOUR_ENTRY_BYTES: usize = 1;
/// The tag of [`LatchPolicy::Adaptive`] in the stream.
const FLAVOUR_TAG_ADAPTIVE: u8 = 0;
/// The tag of [`LatchPolicy::Fifo`] in the stream.
const FLAVOUR_TAG_FIFO: u8 = 1;
/// The first slot that can hold a page or stream data.
const FIRST_DATA_SLOT: u32 = 2;

/// The slot is part of the last durable image.
const MARK_DURABLE: u8 = 1;
/// The slot is part of a captured image that is not durable yet.
const MARK_PENDING: u8 = 2;

/// One page of a batch for [`DataFile::write_pages`].
pub(crate) struct PageWrite<'a> {
    pub page: PageId,
    /// The page's current slot (0 = none).
    pub current: u32,
    pub bytes: &'a PageBytes,
}

/// One decoded meta slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The format version the slot was written in: [`FORMAT_VERSION`] for every slot this
    /// build writes, except that an open writes the slot it read again as it read it.
    pub format_version: u32,
    pub generation: u64,
    pub page_count: u32,
    pub stream_head: u32,
    pub stream_len: u64,
    pub stream_crc: u32,
    pub blob_len: u64,
}

impl Meta {
    fn encode(&self) -> Box<PageBytes> {
        let mut bytes = zeroed_page();
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&self.format_version.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.generation.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.page_count.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.stream_head.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.stream_len.to_le_bytes());
        bytes[40..44].copy_from_slice(&self.stream_crc.to_le_bytes());
        bytes[44..52].copy_from_slice(&self.blob_len.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[16..META_BYTES]);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The format version of a meta slot that is intact (magic and checksum), whatever the
    /// version; `None` if it is not intact (never written, torn, corrupt, not a meta slot).
    fn intact_version(bytes: &[u8]) -> Option<u32> {
        if bytes.len() < META_BYTES || bytes[0..8] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        (u32_at(12) == crc32c::crc32c(&bytes[16..META_BYTES])).then(|| u32_at(8))
    }

    /// The version of a meta slot that is intact but of a format version this build does not
    /// read, if `bytes` is one.
    fn other_version(bytes: &[u8]) -> Option<u32> {
        Self::intact_version(bytes).filter(|&version| !Self::is_readable(version))
    }

    /// Whether this build reads files of format version `version`.
    fn is_readable(version: u32) -> bool {
        (FORMAT_VERSION_1..=FORMAT_VERSION).contains(&version)
    }

    /// Decodes a meta slot; `None` if it is not a valid one (never written, torn, corrupt, or
    /// of a format version this build does not read).
    fn decode(bytes: &[u8]) -> Option<Meta> {
        let format_version = Self::intact_version(bytes).filter(|&v| Self::is_readable(v))?;
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        Some(Meta {
            format_version,
            generation: u64_at(16),
            page_count: u32_at(24),
            stream_head: u32_at(28),
            stream_len: u64_at(32),
            stream_crc: u32_at(40),
            blob_len: u64_at(44),
        })
    }
}

/// A zeroed page buffer on the heap (allocated zeroed, never built on the stack).
pub(crate) fn zeroed_page() -> Box<PageBytes> {
    let boxed: Box<[u8]> = vec![0u8; PAGE_SIZE_BYTES].into_boxed_slice();
    // A boxed slice of exactly PAGE_SIZE_BYTES always converts; the fallback keeps the function
    // total without a panic path.
    boxed
        .try_into()
        .unwrap_or_else(|_| Box::new([0u8; PAGE_SIZE_BYTES]))
}

/// A page's latch flavour as the stream stores it.
fn tag_of_flavour(policy: LatchPolicy) -> u8 {
    match policy {
        LatchPolicy::Adaptive => FLAVOUR_TAG_ADAPTIVE,
        LatchPolicy::Fifo => FLAVOUR_TAG_FIFO,
    }
}

/// The latch flavour a stream's tag stands for; `None` for a tag no build writes.
fn flavour_of_tag(tag: u8) -> Option<LatchPolicy> {
    match tag {
        FLAVOUR_TAG_ADAPTIVE => Some(LatchPolicy::Adaptive),
        FLAVOUR_TAG_FIFO => Some(LatchPolicy::Fifo),
        _ => None,
    }
}

/// What [`DataFile::open`] found: the last durable image.
pub(crate) struct OpenedImage {
    /// Slot and CRC of pages `1..=map.len()`.
    pub map: Vec<(u32, u32)>,
    /// The latch flavour of pages `1..=map.len()` (the default one for every page of a file of
    /// format version 1).
    pub flavours: Vec<LatchPolicy>,
    /// The user blob, `None` for a file that has never completed a checkpoint.
    pub blob: Option<Vec<u8>>,
}

/// Which slots are in use and by what.
struct SlotState {
    /// Slots in the file (the next slot an extension hands out).
    end: u32,
    /// Slots free for any write.
    free: Vec<u32>,
    /// `MARK_*` bits per slot.
    marks: Vec<u8>,
    /// The slots of the last durable image (pages and stream).
    durable: Vec<u32>,
    /// The generation of the last durable image.
    generation: u64,
    /// A capture was taken and its image is not durable (or abandoned) yet.
    pending: bool,
}

impl SlotState {
    fn mark(&self, slot: u32) -> u8 {
        self.marks.get(slot as usize).copied().unwrap_or(0)
    }

    fn set_mark(&mut self, slot: u32, bit: u8) {
        let index = slot as usize;
        if self.marks.len() <= index {
            self.marks.resize(index + 1, 0);
        }
        self.marks[index] |= bit;
    }

    fn clear_mark(&mut self, slot: u32, bit: u8) {
        if let Some(mark) = self.marks.get_mut(slot as usize) {
            *mark &= !bit;
        }
    }

    /// A slot nobody protects: from the free list, else one past the end of the file.
    fn fresh(&mut self) -> u32 {
        while let Some(slot) = self.free.pop() {
            // A freed slot may have been protected again since (it cannot, by construction,
            // but checking costs nothing and keeps the shadow-paging rule local).
            if self.mark(slot) == 0 {
                return slot;
            }
        }
        let slot = self.end;
        self.end += 1;
        slot
    }
}

/// The open data file and its slot bookkeeping.
pub(crate) struct DataFile {
    file: Box<dyn File>,
    state: Mutex<SlotState>,
    /// Set after a failed sync of the data file, or a failed write of a meta slot: later
    /// checkpoints are refused, because after a failed `fdatasync` nothing about unsynced
    /// writes is known (see `lastpage_io`), and a meta slot whose write failed may have reached
    /// the disk all the same. (A failed write of a page or of an image's stream only fails that
    /// checkpoint: the page stays dirty, the stream's fresh slots go back to the free list, and
    /// a later checkpoint tries again, say once a full disk has room.)
    failed: AtomicBool,
}

fn io_error(page: PageId, what: &str, error: std::io::Error) -> PageError {
    PageError::Io {
        page,
        message: format!("{what}: {error}"),
    }
}

fn corrupt(page: PageId, reason: impl Into<String>) -> PageError {
    PageError::Corrupt {
        page,
        reason: reason.into(),
    }
}

fn slot_offset(slot: u32) -> u64 {
    u64::from(slot) * PAGE_SIZE_BYTES as u64
}

impl DataFile {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // The state stays consistent even if a holder panicked: every critical section is a few
        // vector operations.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The meta slot of a new file: generation 0, no pages, no blob.
    fn first_meta() -> Meta {
        Meta {
            format_version: FORMAT_VERSION,
            generation: 0,
            page_count: 0,
            stream_head: 0,
            stream_len: 0,
            stream_crc: crc32c::crc32c(&[]),
            blob_len: 0,
        }
    }

    /// Initialises an empty file: generation 0, no pages, no blob. Durable when this returns.
    pub(crate) fn create(file: Box<dyn File>) -> Result<DataFile, PageError> {
        let meta = Self::first_meta();
        file.set_len(0)
            .map_err(|error| io_error(0, "truncating the new data file", error))?;
        file.write_all_at(0, meta.encode().as_slice())
            .map_err(|error| io_error(0, "writing the first meta slot", error))?;
        file.sync_data()
            .map_err(|error| io_error(0, "syncing the new data file", error))?;
        Ok(DataFile {
            file,
            state: Mutex::new(SlotState {
                end: FIRST_DATA_SLOT,
                free: Vec::new(),
                marks: Vec::new(),
                durable: Vec::new(),
                generation: 0,
                pending: false,
            }),
            failed: AtomicBool::new(false),
        })
    }

    /// Reads the newest valid meta slot and its image. `Ok(None)` means the file holds no valid
    /// meta slot and is what a crash during [`DataFile::create`] can leave (see
    /// [`DataFile::is_interrupted_creation`]): the caller initialises it anew.
    pub(crate) fn open(file: Box<dyn File>) -> Result<Option<(DataFile, OpenedImage)>, PageError> {
        let len = file
            .len()
            .map_err(|error| io_error(0, "reading the data file's size", error))?;
        let mut metas = Vec::new();
        let mut other_version = None;
        for slot in 0..2u32 {
            let mut bytes = vec![0u8; META_BYTES];
            let read = file
                .read_at(slot_offset(slot), &mut bytes)
                .map_err(|error| io_error(0, "reading a meta slot", error))?;
            if read == META_BYTES
                && let Some(meta) = Meta::decode(&bytes)
                && meta.generation % 2 == u64::from(slot)
            {
                metas.push(meta);
            }
            if read == META_BYTES {
                other_version = other_version.or(Meta::other_version(&bytes));
            }
        }
        let Some(meta) = metas.into_iter().max_by_key(|meta| meta.generation) else {
            if let Some(version) = other_version {
                return Err(corrupt(
                    0,
                    format!(
                        "the data file has format version {version}; this build reads versions \
                         {FORMAT_VERSION_1} to {FORMAT_VERSION}"
                    ),
                ));
            }
            if Self::is_interrupted_creation(file.as_ref(), len)? {
                return Ok(None);
            }
            return Err(corrupt(
                0,
                if len <= PAGE_SIZE_BYTES as u64 {
                    "the data file holds no valid meta slot, and bytes that no interrupted \
                     creation of a data file writes: not a lastpage data file of this format \
                     version"
                } else {
                    "neither meta slot of the data file is valid"
                },
            ));
        };
        // Opening sizes its slot marks and free list by the file's length, so a length no
        // image can reach (a sparse file claims any length for free) is damage, and must not
        // become allocations of that size.
        let len_slots = u32::try_from(len.div_ceil(PAGE_SIZE_BYTES as u64))
            .ok()
            .filter(|&slots| slots <= MAX_DATA_FILE_SLOTS)
            .ok_or_else(|| corrupt(0, format!("the data file is too large ({len} bytes)")))?;
        let end = len_slots.max(FIRST_DATA_SLOT);
        if meta.page_count as usize >= MAX_PAGES {
            return Err(corrupt(
                0,
                format!("the meta slot names {} pages", meta.page_count),
            ));
        }
        let map_bytes = meta.page_count as u64 * MAP_ENTRY_BYTES as u64;
        let flavour_bytes = if meta.format_version == FORMAT_VERSION_1 {
            0
        } else {
            meta.page_count as u64 * FLAVOUR_ENTRY_BYTES as u64
        };
        if (map_bytes + flavour_bytes).checked_add(meta.blob_len) != Some(meta.stream_len) {
            return Err(corrupt(
                0,
                "the meta slot's stream length does not match its map, latch flavours and blob",
            ));
        }
        // The stream lives in the file's slots, one payload per slot: a length beyond what the
        // file can hold is damage, and must not become an allocation of that size.
        let stream_capacity = u64::from(end - FIRST_DATA_SLOT) * STREAM_PAYLOAD_BYTES as u64;
        if meta.stream_len > stream_capacity {
            return Err(corrupt(
                0,
                format!(
                    "the meta slot's stream of {} bytes cannot fit in a file of {len} bytes",
                    meta.stream_len
                ),
            ));
        }
        let mut state = SlotState {
            end,
            free: Vec::new(),
            marks: vec![0; end as usize],
            durable: Vec::new(),
            generation: meta.generation,
            pending: false,
        };
        // The stream: a chain of slots, each checked to lie inside the file and to be used once.
        // Reserved only up to a bound: the stream grows as its slots are read, and a length a
        // meta slot merely claims must not be allocated at once.
        let mut stream = Vec::with_capacity(
            usize::try_from(meta.stream_len.min(STREAM_RESERVE_BYTES)).unwrap_or(0),
        );
        let mut next = meta.stream_head;
        let mut buffer = zeroed_page();
        while (stream.len() as u64) < meta.stream_len {
            if next < FIRST_DATA_SLOT || next >= end || state.mark(next) != 0 {
                return Err(corrupt(0, format!("the image's stream names slot {next}")));
            }
            file.read_exact_at(slot_offset(next), buffer.as_mut_slice())
                .map_err(|error| io_error(0, "reading the image's page map", error))?;
            state.set_mark(next, MARK_DURABLE);
            state.durable.push(next);
            let want = (meta.stream_len - stream.len() as u64).min(STREAM_PAYLOAD_BYTES as u64);
            stream.extend_from_slice(
                &buffer[STREAM_HEADER_BYTES..STREAM_HEADER_BYTES + want as usize],
            );
            next = u32::from_le_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]);
        }
        if crc32c::crc32c(&stream) != meta.stream_crc {
            return Err(corrupt(
                0,
                "the image's page map and blob fail their checksum",
            ));
        }
        let (map_part, rest) = stream.split_at(map_bytes as usize);
        let (flavour_part, blob) = rest.split_at(flavour_bytes as usize);
        let mut map = Vec::with_capacity(meta.page_count as usize);
        for (index, entry) in map_part.chunks_exact(MAP_ENTRY_BYTES).enumerate() {
            let slot = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
            let crc = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
            let page = index as PageId + 1;
            if slot != 0 {
                if slot < FIRST_DATA_SLOT || slot >= end || state.mark(slot) != 0 {
                    return Err(corrupt(
                        page,
                        format!("the page map puts it in slot {slot}"),
                    ));
                }
                state.set_mark(slot, MARK_DURABLE);
                state.durable.push(slot);
            }
            map.push((slot, crc));
        }
        let flavours = if flavour_part.is_empty() {
            vec![LatchPolicy::default(); map.len()]
        } else {
            flavour_part
                .iter()
                .enumerate()
                .map(|(index, &tag)| {
                    flavour_of_tag(tag).ok_or_else(|| {
                        corrupt(
                            index as PageId + 1,
                            format!("the image gives it latch flavour tag {tag}"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        // The meta slot just read may not be durable: the process that wrote it may have been
        // killed before its fdatasync, or that fdatasync failed and left the page in the cache,
        // readable but marked clean (fsyncgate). Every slot of the image before it is free from
        // here on, so before anything is written there this image must be the durable one:
        // its meta slot is written again, as read, and synced (its pages and stream were
        // synced before the meta slot was written).
        file.write_all_at(
            slot_offset((meta.generation % 2) as u32),
            meta.encode().as_slice(),
        )
        .and_then(|()| file.sync_data())
        .map_err(|error| io_error(0, "writing the meta slot again", error))?;
        // Every slot outside the image is free: whatever a crash left there belongs to no image.
        state.free = (FIRST_DATA_SLOT..end)
            .rev()
            .filter(|&slot| state.mark(slot) == 0)
            .collect();
        let blob = (meta.generation > 0).then(|| blob.to_vec());
        Ok(Some((
            DataFile {
                file,
                state: Mutex::new(state),
                failed: AtomicBool::new(false),
            },
            OpenedImage {
                map,
                flavours,
                blob,
            },
        )))
    }

    /// Whether a file without a valid meta slot is what a crash during [`DataFile::create`]
    /// can leave: creation cuts the file to nothing and writes the first meta slot's page, so
    /// a crash leaves at most that page, each byte of it either written or still zero (a lost
    /// or torn write, or a size change that reached the disk before the bytes did). Anything
    /// else, a file of another program or of another format version that happens to be
    /// called the same, is not reinitialised: that would destroy it.
    fn is_interrupted_creation(file: &dyn File, len: u64) -> Result<bool, PageError> {
        if len > PAGE_SIZE_BYTES as u64 {
            return Ok(false);
        }
        let first = Self::first_meta().encode();
        let mut bytes = vec![0u8; len as usize];
        let read = file
            .read_at(0, &mut bytes)
            .map_err(|error| io_error(0, "reading the data file", error))?;
        Ok(bytes[..read]
            .iter()
            .zip(first.iter())
            .all(|(&byte, &written)| byte == 0 || byte == written))
    }

    /// Reads slot `slot` into `bytes`.
    pub(crate) fn read_slot(
        &self,
        page: PageId,
        slot: u32,
        bytes: &mut PageBytes,
    ) -> Result<(), PageError> {
        self.file
            .read_exact_at(slot_offset(slot), bytes)
            .map_err(|error| io_error(page, &format!("reading slot {slot}"), error))
    }

    /// Writes a batch of pages, each to a slot no image protects: its current slot (0 = none)
    /// if no image protects that, else a fresh one. The slots are chosen first, all under one
    /// hold of the slot state's lock; then the pages go out in slot order, one positional write
    /// per run of consecutive slots (at most [`DATA_FILE_WRITE_RUN_PAGES`] long). `written` is
    /// cleared and given the slot each page of `pages` went to, in the same order, or `None`
    /// for a page that was not written. On the first failed write the rest are not tried: they
    /// and the failed run's pages are not written, their fresh slots go back to the free list,
    /// and the error names the failed run's first page.
    pub(crate) fn write_pages(
        &self,
        pages: &[PageWrite<'_>],
        written: &mut Vec<Option<u32>>,
    ) -> Result<(), PageError> {
        written.clear();
        // (slot, whether it is fresh, index into `pages`)
        let mut slots: Vec<(u32, bool, usize)> = {
            let mut state = self.lock();
            pages
                .iter()
                .enumerate()
                .map(|(index, write)| {
                    if write.current >= FIRST_DATA_SLOT && state.mark(write.current) == 0 {
                        (write.current, false, index)
                    } else {
                        (state.fresh(), true, index)
                    }
                })
                .collect()
        };
        slots.sort_unstable_by_key(|&(slot, _, _)| slot);
        written.resize(pages.len(), None);
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(DATA_FILE_WRITE_RUN_PAGES);
        let mut start = 0;
        while start < slots.len() {
            let first_slot = slots[start].0;
            let mut end = start + 1;
            while end < slots.len()
                && end - start < DATA_FILE_WRITE_RUN_PAGES
                && slots[end].0 == first_slot + (end - start) as u32
            {
                end += 1;
            }
            pieces.clear();
            pieces.extend(
                slots[start..end]
                    .iter()
                    .map(|&(_, _, index)| pages[index].bytes.as_slice()),
            );
            if let Err(error) = self
                .file
                .write_all_vectored_at(slot_offset(first_slot), &pieces)
            {
                // When a fresh slot replaces a page's current one, the old slot is protected by
                // an image (else it would have been reused), and becomes free when that image
                // is superseded; the fresh one nothing names yet.
                let mut state = self.lock();
                state.free.extend(
                    slots[start..]
                        .iter()
                        .filter(|&&(_, fresh, _)| fresh)
                        .map(|&(slot, _, _)| slot),
                );
                let slot_count = end - start;
                let what = if slot_count == 1 {
                    format!("writing slot {first_slot}")
                } else {
                    format!(
                        "writing slots {first_slot} to {}",
                        first_slot + slot_count as u32 - 1
                    )
                };
                return Err(io_error(pages[slots[start].2].page, &what, error));
            }
            for &(slot, _, index) in &slots[start..end] {
                written[index] = Some(slot);
            }
            start = end;
        }
        Ok(())
    }

    /// Gives back the slot of a page that was freed (`slot` was its current slot, 0 for
    /// none). A slot no image protects belonged to that page alone and is free at once; a
    /// protected one (the durable image's, or a pending capture's) becomes free when an image
    /// that does not name it is durable, as any slot a page moved away from.
    pub(crate) fn release_slot(&self, slot: u32) {
        let mut state = self.lock();
        if slot >= FIRST_DATA_SLOT && state.mark(slot) == 0 {
            state.free.push(slot);
        }
    }

    /// Makes the pages written so far durable. A failure fails the file (no more checkpoints):
    /// after a failed `fdatasync` nothing is known about the writes it covered, and a later one
    /// that succeeds would not mean they are on disk.
    pub(crate) fn sync_pages(&self) -> Result<(), PageError> {
        self.file.sync_data().map_err(|error| {
            self.fail();
            io_error(0, "syncing written pages", error)
        })
    }

    /// Starts a capture: refuses if an earlier checkpoint failed or another is pending.
    pub(crate) fn begin_capture(&self) -> Result<u64, PageError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(refused());
        }
        let mut state = self.lock();
        if state.pending {
            return Err(PageError::Io {
                page: 0,
                message: "another checkpoint is in progress".into(),
            });
        }
        // A meta slot's generation is checksummed but otherwise believed: one that cannot grow
        // (a damaged or forged file) fails the checkpoint rather than wrapping to 0, which the
        // next open would take for an older image than the one it replaced.
        let next = state
            .generation
            .checked_add(1)
            .ok_or_else(|| PageError::Corrupt {
                page: 0,
                reason: format!(
                    "the data file's image generation {} cannot grow",
                    state.generation
                ),
            })?;
        state.pending = true;
        Ok(next)
    }

    /// Protects `slot` as part of the pending image. The caller holds the page's latch, so no
    /// eviction of that page can be choosing a slot meanwhile.
    pub(crate) fn protect_pending(&self, slot: u32) {
        if slot >= FIRST_DATA_SLOT {
            self.lock().set_mark(slot, MARK_PENDING);
        }
    }

    /// Gives up a capture that will not be finished: its slots stop being protected. `map`
    /// is the capture's page map (the slot of page `index + 1` at `index`). A slot that no
    /// durable image uses either is still its page's current slot, or the page moved since
    /// (changed and written elsewhere, because the capture protected this slot): `moved(index,
    /// slot)` says so, and such a slot goes back to the free list. Nothing else can use it: it
    /// was on no free list while the capture protected it, and a page moves only to its current
    /// slot or a fresh one. (A `moved` that cannot tell answers `false`: the slot then leaks
    /// until the file is reopened.) The state's lock is held while `moved` runs, so a page
    /// that `moved` finds still in the slot is written there in place from now on.
    pub(crate) fn abandon(&self, map: &[(u32, u32)], moved: impl Fn(usize, u32) -> bool) {
        let mut state = self.lock();
        for (index, &(slot, _)) in map.iter().enumerate() {
            state.clear_mark(slot, MARK_PENDING);
            if slot >= FIRST_DATA_SLOT && state.mark(slot) == 0 && moved(index, slot) {
                state.free.push(slot);
            }
        }
        state.pending = false;
    }

    /// Marks the file failed: no more checkpoints.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// Whether an earlier checkpoint failed.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Makes a captured image durable: sync the pages, write map, latch flavours (one per
    /// map entry) and blob, sync, write the meta slot, sync; then free the slots of the
    /// previous image that the new one does not use. Returns the number of slots freed and the
    /// file's size in slots.
    pub(crate) fn finish(
        &self,
        generation: u64,
        map: &[(u32, u32)],
        flavours: &[LatchPolicy],
        blob: &[u8],
    ) -> Result<(usize, u32), PageError> {
        assert_eq!(
            map.len(),
            flavours.len(),
            "a captured image has one latch flavour per page"
        );
        if self.has_failed() {
            return Err(refused());
        }
        // A failed fdatasync, and a failed write of the meta slot (which may have reached the
        // disk all the same), leave the file in a state nothing knows: they fail the file, and
        // no checkpoint follows. A failed write of the stream (a full disk) leaves nothing
        // unknown: its slots are fresh, no image names them, and they go back to the free list,
        // so a later checkpoint may try again.
        self.file.sync_data().map_err(|error| {
            self.fail();
            io_error(0, "syncing the checkpoint's pages", error)
        })?;
        let mut stream =
            Vec::with_capacity(map.len() * (MAP_ENTRY_BYTES + FLAVOUR_ENTRY_BYTES) + blob.len());
        for (slot, crc) in map {
            stream.extend_from_slice(&slot.to_le_bytes());
            stream.extend_from_slice(&crc.to_le_bytes());
        }
        stream.extend(flavours.iter().map(|&policy| tag_of_flavour(policy)));
        stream.extend_from_slice(blob);
        let chunks: Vec<&[u8]> = stream.chunks(STREAM_PAYLOAD_BYTES).collect();
        let stream_slots: Vec<u32> = {
            let mut state = self.lock();
            let slots: Vec<u32> = chunks.iter().map(|_| state.fresh()).collect();
            for &slot in &slots {
                state.set_mark(slot, MARK_PENDING);
            }
            slots
        };
        let mut buffer = zeroed_page();
        for (index, chunk) in chunks.iter().enumerate() {
            buffer.fill(0);
            let next = stream_slots.get(index + 1).copied().unwrap_or(0);
            buffer[..STREAM_HEADER_BYTES].copy_from_slice(&next.to_le_bytes());
            buffer[STREAM_HEADER_BYTES..STREAM_HEADER_BYTES + chunk.len()].copy_from_slice(chunk);
            if let Err(error) = self
                .file
                .write_all_at(slot_offset(stream_slots[index]), buffer.as_slice())
            {
                let mut state = self.lock();
                for &slot in &stream_slots {
                    state.clear_mark(slot, MARK_PENDING);
                    state.free.push(slot);
                }
                return Err(io_error(0, "writing the checkpoint's page map", error));
            }
        }
        self.file.sync_data().map_err(|error| {
            self.fail();
            io_error(0, "syncing the checkpoint's page map", error)
        })?;
        let meta = Meta {
            format_version: FORMAT_VERSION,
            generation,
            page_count: map.len() as u32,
            stream_head: stream_slots.first().copied().unwrap_or(0),
            stream_len: stream.len() as u64,
            stream_crc: crc32c::crc32c(&stream),
            blob_len: blob.len() as u64,
        };
        self.file
            .write_all_at(
                slot_offset((generation % 2) as u32),
                meta.encode().as_slice(),
            )
            .map_err(|error| {
                self.fail();
                io_error(0, "writing the meta slot", error)
            })?;
        self.file.sync_data().map_err(|error| {
            self.fail();
            io_error(0, "syncing the meta slot", error)
        })?;
        // The new image is durable: its slots become the protected set, and the previous
        // image's slots that it does not use become free.
        let mut state = self.lock();
        let new_durable: Vec<u32> = map
            .iter()
            .map(|&(slot, _)| slot)
            .filter(|&slot| slot >= FIRST_DATA_SLOT)
            .chain(stream_slots)
            .collect();
        for &slot in &new_durable {
            state.clear_mark(slot, MARK_PENDING);
        }
        let old = std::mem::take(&mut state.durable);
        // Unmark the old image first, then re-mark the new one, so that slots both share stay
        // protected.
        for &slot in &old {
            state.clear_mark(slot, MARK_DURABLE);
        }
        for &slot in &new_durable {
            state.set_mark(slot, MARK_DURABLE);
        }
        let mut freed = 0;
        for slot in old {
            if state.mark(slot) == 0 {
                state.free.push(slot);
                freed += 1;
            }
        }
        state.durable = new_durable;
        state.generation = generation;
        state.pending = false;
        Ok((freed, state.end))
    }

    /// The generation of the last durable image.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }
}

pub(crate) fn refused() -> PageError {
    PageError::Io {
        page: 0,
        message: "an earlier checkpoint failed, so the pool refuses further checkpoints".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_slots_round_trip_and_reject_damage() {
        let meta = Meta {
            format_version: FORMAT_VERSION,
            generation: 7,
            page_count: 3,
            stream_head: 9,
            stream_len: 27 + 5,
            stream_crc: 42,
            blob_len: 5,
        };
        let bytes = meta.encode();
        assert_eq!(Meta::decode(bytes.as_slice()), Some(meta));
        let mut torn = bytes.clone();
        torn[20] ^= 1;
        assert_eq!(Meta::decode(torn.as_slice()), None);
        assert_eq!(Meta::decode(&[0u8; 64]), None);
    }

    /// A file that passes everything to `inner` and records each vectored write (the number of
    /// pieces), failing the one numbered `fail_vectored` (from 1; 0 = none).
    #[derive(Debug)]
    struct CountingFile {
        inner: Box<dyn File>,
        vectored: std::sync::Arc<Mutex<Vec<usize>>>,
        fail_vectored: usize,
    }

    impl File for CountingFile {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            self.inner.read_at(offset, buf)
        }
        fn write_all_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.inner.write_all_at(offset, data)
        }
        fn write_all_vectored_at(&self, offset: u64, pieces: &[&[u8]]) -> std::io::Result<()> {
            let mut vectored = self.vectored.lock().unwrap();
            vectored.push(pieces.len());
            if vectored.len() == self.fail_vectored {
                return Err(std::io::Error::other("injected"));
            }
            self.inner.write_all_vectored_at(offset, pieces)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.inner.sync_data()
        }
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.inner.set_len(len)
        }
        fn allocate(&self, len: u64) -> std::io::Result<()> {
            self.inner.allocate(len)
        }
        fn try_lock(&self) -> std::io::Result<bool> {
            self.inner.try_lock()
        }
    }

    /// A new data file over a [`CountingFile`], and a way to see its vectored writes.
    fn counting_data_file(fail_vectored: usize) -> (DataFile, impl Fn() -> Vec<usize>) {
        let vectored = std::sync::Arc::new(Mutex::new(Vec::new()));
        let counting = CountingFile {
            inner: file_with_bytes(&[]),
            vectored: std::sync::Arc::clone(&vectored),
            fail_vectored,
        };
        let file = DataFile::create(Box::new(counting)).unwrap();
        (file, move || vectored.lock().unwrap().clone())
    }

    /// A page whose every byte is `byte`.
    fn page_of(byte: u8) -> Box<PageBytes> {
        let mut page = zeroed_page();
        page.fill(byte);
        page
    }

    /// Writes page `page` (never written before) alone, and returns its slot.
    fn write_one(file: &DataFile, page: PageId) -> u32 {
        let bytes = page_of(1);
        let mut written = Vec::new();
        let write = PageWrite {
            page,
            current: 0,
            bytes: &bytes,
        };
        file.write_pages(&[write], &mut written).unwrap();
        written[0].unwrap()
    }

    fn read_slot_bytes(file: &DataFile, slot: u32) -> Box<PageBytes> {
        let mut bytes = zeroed_page();
        file.read_slot(1, slot, &mut bytes).unwrap();
        bytes
    }

    /// A batch goes out in runs of consecutive slots, in slot order whatever the batch's order,
    /// at most `DATA_FILE_WRITE_RUN_PAGES` pages a run: pages rewritten in their own slots and
    /// fresh ones alike, each to the slot reported for it.
    #[test]
    fn a_batch_of_pages_is_written_in_runs_of_consecutive_slots() {
        let (file, vectored) = counting_data_file(0);
        // Three pages in slots 2, 3 and 4, one write each.
        let first: Vec<u32> = (0..3).map(|page| write_one(&file, page + 1)).collect();
        assert_eq!(first, [2, 3, 4]);
        assert_eq!(vectored(), [1, 1, 1]);
        // Pages 3 and 1 again (their slots are free to reuse: no image names them), page 2 left
        // alone, and enough new pages for two runs of fresh slots.
        let fresh = DATA_FILE_WRITE_RUN_PAGES + 5;
        let contents: Vec<Box<PageBytes>> = (0..fresh + 2)
            .map(|index| page_of(10 + index as u8))
            .collect();
        let mut batch = vec![
            PageWrite {
                page: 3,
                current: 4,
                bytes: &contents[0],
            },
            PageWrite {
                page: 1,
                current: 2,
                bytes: &contents[1],
            },
        ];
        batch.extend((0..fresh).map(|index| PageWrite {
            page: 4 + index as PageId,
            current: 0,
            bytes: &contents[2 + index],
        }));
        // Out of slot order.
        batch.reverse();
        let mut written = Vec::new();
        file.write_pages(&batch, &mut written).unwrap();
        assert_eq!(written.len(), batch.len());
        let fresh_slots: Vec<u32> = (5..5 + fresh as u32).collect();
        let mut slots: Vec<u32> = written.iter().map(|slot| slot.unwrap()).collect();
        slots.sort_unstable();
        assert_eq!(slots[..2], [2, 4]);
        assert_eq!(slots[2..], fresh_slots[..]);
        for (write, slot) in batch.iter().zip(&written) {
            assert!(
                read_slot_bytes(&file, slot.unwrap()).as_slice() == write.bytes.as_slice(),
                "page {}",
                write.page
            );
        }
        // Slot 2 alone (3 is not in the batch), then slots 4 to 68 in a run of the most pages
        // one write takes, then the rest.
        assert_eq!(
            vectored()[3..],
            [
                1,
                DATA_FILE_WRITE_RUN_PAGES,
                fresh + 1 - DATA_FILE_WRITE_RUN_PAGES
            ]
        );
    }

    /// A failed run stops the batch: the runs before it stay written and reported, its pages
    /// and the later ones are not, and every fresh slot they took goes back to the free list.
    #[test]
    fn a_failed_run_gives_its_fresh_slots_back_and_stops_the_batch() {
        let (file, vectored) = counting_data_file(5);
        // Pages 1 to 3 in slots 2 to 4 (vectored writes 1 to 3); a checkpoint image protects
        // none of them.
        for page in 1..=3 {
            write_one(&file, page);
        }
        let contents = page_of(7);
        // Page 1 rewritten in slot 2, page 3 in slot 4, and six new pages in slots 5 to 10:
        // runs [2] then [4..=10] (writes 4 and 5), the second of which fails.
        let mut batch = vec![
            PageWrite {
                page: 1,
                current: 2,
                bytes: &contents,
            },
            PageWrite {
                page: 3,
                current: 4,
                bytes: &contents,
            },
        ];
        batch.extend((4..10).map(|page| PageWrite {
            page,
            current: 0,
            bytes: &contents,
        }));
        let mut written = Vec::new();
        match file.write_pages(&batch, &mut written) {
            Err(PageError::Io { page, message }) => {
                assert_eq!(page, 3);
                assert!(message.contains("slots 4 to 10"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(vectored().len(), 5);
        assert_eq!(written[0], Some(2));
        assert!(written[1..].iter().all(Option::is_none), "{written:?}");
        assert!(read_slot_bytes(&file, 2).as_slice() == contents.as_slice());
        let mut free = file.lock().free.clone();
        free.sort_unstable();
        assert_eq!(free, [5, 6, 7, 8, 9, 10]);
    }

    /// A data file of `slots` zeroed slots whose meta slot holds `meta` (checksum and all).
    fn file_with_meta(meta: Meta, slots: u32) -> Box<dyn File> {
        let file = file_with_bytes(&[]);
        file.set_len(u64::from(slots) * PAGE_SIZE_BYTES as u64)
            .unwrap();
        let slot = (meta.generation % 2) as u32;
        file.write_all_at(slot_offset(slot), meta.encode().as_slice())
            .unwrap();
        file
    }

    /// A file holding `bytes` and nothing else.
    fn file_with_bytes(bytes: &[u8]) -> Box<dyn File> {
        use lastpage_io::{FaultyConfig, FaultyFileSystem, FileSystem, OpenOptions};
        let fs = FaultyFileSystem::new(FaultyConfig::new(1));
        fs.create_dir_all(std::path::Path::new("/db")).unwrap();
        let file = fs
            .open(std::path::Path::new("/db/data.lp"), OpenOptions::create())
            .unwrap();
        file.write_all_at(0, bytes).unwrap();
        file
    }

    /// A data file whose generation-1 image (in format version `format_version`) has
    /// `page_count` free pages and the stream `stream` (map, flavours if any, blob) in one slot.
    fn file_with_image(
        format_version: u32,
        page_count: u32,
        stream: &[u8],
        blob_len: u64,
    ) -> Box<dyn File> {
        let meta = Meta {
            format_version,
            generation: 1,
            page_count,
            stream_head: FIRST_DATA_SLOT,
            stream_len: stream.len() as u64,
            stream_crc: crc32c::crc32c(stream),
            blob_len,
        };
        let file = file_with_meta(meta, 4);
        let mut slot = zeroed_page();
        slot[STREAM_HEADER_BYTES..STREAM_HEADER_BYTES + stream.len()].copy_from_slice(stream);
        file.write_all_at(slot_offset(FIRST_DATA_SLOT), slot.as_slice())
            .unwrap();
        file
    }

    /// Two free pages (slot 0) in the page map, as a stream holds them.
    const TWO_FREE_PAGES: [u8; 16] = [0; 16];

    #[test]
    fn a_file_of_format_version_1_opens_with_every_page_of_the_default_flavour() {
        let stream = [&TWO_FREE_PAGES[..], b"blob"].concat();
        let file = file_with_image(FORMAT_VERSION_1, 2, &stream, 4);
        let (data_file, image) = DataFile::open(file).unwrap().expect("an image");
        assert_eq!(image.map, vec![(0, 0), (0, 0)]);
        assert_eq!(image.flavours, vec![LatchPolicy::default(); 2]);
        assert_eq!(image.blob.as_deref(), Some(&b"blob"[..]));
        // The open wrote the meta slot again as it read it: still version 1, whose stream has
        // no flavours, so that the image stays readable.
        let mut bytes = [0u8; META_BYTES];
        data_file
            .file
            .read_exact_at(slot_offset(1), &mut bytes)
            .unwrap();
        assert_eq!(
            Meta::decode(&bytes).map(|meta| meta.format_version),
            Some(FORMAT_VERSION_1)
        );
    }

    #[test]
    fn a_file_of_format_version_2_gives_each_page_its_latch_flavour() {
        let stream = [
            &TWO_FREE_PAGES[..],
            &[FLAVOUR_TAG_FIFO, FLAVOUR_TAG_ADAPTIVE],
            b"blob",
        ]
        .concat();
        let (_, image) = DataFile::open(file_with_image(2, 2, &stream, 4))
            .unwrap()
            .expect("an image");
        assert_eq!(
            image.flavours,
            vec![LatchPolicy::Fifo, LatchPolicy::Adaptive]
        );
        assert_eq!(image.blob.as_deref(), Some(&b"blob"[..]));
        // A tag no build writes is damage, named with its page.
        let stream = [&TWO_FREE_PAGES[..], &[FLAVOUR_TAG_FIFO, 7], b"blob"].concat();
        match DataFile::open(file_with_image(2, 2, &stream, 4)) {
            Err(PageError::Corrupt { page, reason }) => {
                assert_eq!(
                    (page, reason.as_str()),
                    (2, "the image gives it latch flavour tag 7")
                );
            }
            Err(other) => panic!("not reported as corrupt: {other}"),
            Ok(_) => panic!("opened"),
        }
        // A version-2 stream without its flavours does not match its meta slot's lengths.
        let stream = [&TWO_FREE_PAGES[..], b"blob"].concat();
        match DataFile::open(file_with_image(2, 2, &stream, 4)) {
            Err(PageError::Corrupt { reason, .. }) => {
                assert!(reason.contains("latch flavours"), "{reason}");
            }
            Err(other) => panic!("not reported as corrupt: {other}"),
            Ok(_) => panic!("opened"),
        }
    }

    #[test]
    fn what_an_interrupted_creation_leaves_is_initialised_anew() {
        let first = DataFile::first_meta().encode();
        // Torn before the meta slot's end (a longer prefix is a valid, empty image), and with
        // some written bytes still zero (a torn write reordered under a size change that
        // reached the disk first).
        let mut holes = first.clone();
        holes[..8].fill(0);
        holes[40..44].fill(0);
        let leftovers: [&[u8]; 6] = [
            &[],
            &first[..3],
            &first[..META_BYTES - 1],
            &holes[..],
            &holes[..512],
            &[0u8; 4096],
        ];
        for (case, bytes) in leftovers.into_iter().enumerate() {
            assert!(
                matches!(DataFile::open(file_with_bytes(bytes)), Ok(None)),
                "case {case} ({} bytes) is not taken for an interrupted creation",
                bytes.len()
            );
        }
    }

    #[test]
    fn a_short_file_of_anything_else_is_refused_not_overwritten() {
        // Another version's meta slot with its checksum broken: not even that is certain.
        let mut other_version = DataFile::first_meta().encode();
        other_version[8] ^= 0x40;
        other_version[12] ^= 1;
        // A bit flipped in the generation: neither what creation writes nor a zero.
        let mut one_byte_off = DataFile::first_meta().encode();
        one_byte_off[20] = 0x55;
        let foreign: [&[u8]; 4] = [b"hi\n", &[0xFF; 100], &other_version[..], &one_byte_off[..]];
        for (case, bytes) in foreign.into_iter().enumerate() {
            match DataFile::open(file_with_bytes(bytes)) {
                Err(PageError::Corrupt { reason, .. }) => {
                    assert!(reason.contains("not a lastpage data file"), "{reason}");
                }
                Err(other) => panic!("case {case}: not reported as corrupt: {other}"),
                Ok(None) => panic!("case {case}: taken for an interrupted creation"),
                Ok(Some(_)) => panic!("case {case}: opened"),
            }
        }
    }

    #[test]
    fn a_data_file_of_another_format_version_is_refused_naming_both_versions() {
        let other = FORMAT_VERSION + 1;
        let mut newer = DataFile::first_meta().encode();
        newer[8..12].copy_from_slice(&other.to_le_bytes());
        let short = file_with_bytes(&newer[..]);
        let long = file_with_meta(DataFile::first_meta(), 4);
        long.write_all_at(0, &newer[..]).unwrap();
        for file in [short, long] {
            match DataFile::open(file) {
                Err(PageError::Corrupt { reason, .. }) => assert_eq!(
                    reason,
                    format!(
                        "the data file has format version {other}; this build reads versions \
                         {FORMAT_VERSION_1} to {FORMAT_VERSION}"
                    )
                ),
                Err(other) => panic!("not reported as corrupt: {other}"),
                Ok(_) => panic!("opened"),
            }
        }
    }

    #[test]
    fn a_generation_that_cannot_grow_fails_the_checkpoint_instead_of_wrapping() {
        let last = Meta {
            generation: u64::MAX,
            ..DataFile::first_meta()
        };
        let (file, _) = DataFile::open(file_with_meta(last, 4))
            .unwrap()
            .expect("an image");
        match file.begin_capture() {
            Err(PageError::Corrupt { reason, .. }) => assert!(reason.contains("cannot grow")),
            other => panic!("{other:?}"),
        }
    }

    /// A file that claims `len` bytes (as a sparse file does, for free) and holds `slots`
    /// (slot number and bytes) and zeros everywhere else, without storing them.
    #[derive(Debug)]
    struct SparseFile {
        len: u64,
        slots: Vec<(u32, Box<PageBytes>)>,
    }

    impl SparseFile {
        /// A file of `len` bytes holding `meta` in its meta slot and the stream `payload` in
        /// the slot `meta` names.
        fn new(len: u64, meta: Meta, payload: &[u8]) -> SparseFile {
            let mut stream = zeroed_page();
            stream[STREAM_HEADER_BYTES..STREAM_HEADER_BYTES + payload.len()]
                .copy_from_slice(payload);
            let slots = vec![
                ((meta.generation % 2) as u32, meta.encode()),
                (meta.stream_head, stream),
            ];
            SparseFile { len, slots }
        }
    }

    impl File for SparseFile {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            let read = buf.len().min(self.len.saturating_sub(offset) as usize);
            buf[..read].fill(0);
            for (slot, bytes) in &self.slots {
                for (index, byte) in buf[..read].iter_mut().enumerate() {
                    if let Some(at) = (offset + index as u64).checked_sub(slot_offset(*slot))
                        && at < PAGE_SIZE_BYTES as u64
                    {
                        *byte = bytes[at as usize];
                    }
                }
            }
            Ok(read)
        }
        /// Read only, except for a write of the bytes already there (the open's rewrite of
        /// the meta slot it read).
        fn write_all_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            let mut there = vec![0u8; data.len()];
            let read = self.read_at(offset, &mut there)?;
            if read == data.len() && there == data {
                return Ok(());
            }
            Err(std::io::Error::other("read only"))
        }
        fn sync_data(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn len(&self) -> std::io::Result<u64> {
            Ok(self.len)
        }
        fn set_len(&self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("read only"))
        }
        fn allocate(&self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::other("read only"))
        }
        fn try_lock(&self) -> std::io::Result<bool> {
            Ok(true)
        }
    }

    /// A hostile data file: a sparse file claims any length for free, and a checksummed meta
    /// slot any stream length that fits it. Opening reserved the stream's claimed length at
    /// once, so a file whose meta slot claims a stream of hundreds of GB aborted the process
    /// (the allocation failed); and it sizes its slot marks and free list by the file's
    /// length, so a valid image in a file of terabytes took gigabytes. Both are now bounded:
    /// the stream grows as its slots are read, and a file longer than any image can make
    /// (`MAX_DATA_FILE_SLOTS`) is refused.
    #[test]
    fn a_sparse_file_with_hostile_lengths_is_refused_not_allocated() {
        let slot_bytes = PAGE_SIZE_BYTES as u64;
        let at_the_bound = u64::from(MAX_DATA_FILE_SLOTS) * slot_bytes;
        let payload = [7u8; 8];
        let meta = |stream_len: u64, stream_crc| Meta {
            format_version: FORMAT_VERSION,
            generation: 1,
            page_count: 0,
            stream_head: FIRST_DATA_SLOT,
            stream_len,
            stream_crc,
            blob_len: stream_len,
        };
        let cases = [
            // A claimed stream of 320 GiB in a file that could hold it.
            (at_the_bound, meta(at_the_bound / 2, 0)),
            // A valid image in a file one slot longer than any image makes.
            (at_the_bound + slot_bytes, meta(8, crc32c::crc32c(&payload))),
        ];
        for (len, meta) in cases {
            match DataFile::open(Box::new(SparseFile::new(len, meta, &payload))) {
                Err(PageError::Corrupt { .. }) => {}
                Err(other) => panic!("{len} bytes: not reported as corrupt: {other}"),
                Ok(_) => panic!("{len} bytes: opened"),
            }
        }
        // The same image in a file at the bound opens.
        let len = at_the_bound;
        let file = SparseFile::new(len, meta(8, crc32c::crc32c(&payload)), &payload);
        let (_, image) = DataFile::open(Box::new(file)).unwrap().unwrap();
        assert_eq!(image.blob.as_deref(), Some(&payload[..]));
    }

    #[test]
    fn a_meta_slot_with_impossible_lengths_is_refused_not_trusted() {
        // Checksummed meta slots whose lengths a bit flip could not produce but a hostile file
        // can: each must be an error, never a panic or an allocation of the length it claims.
        let wrapping = Meta {
            format_version: FORMAT_VERSION,
            generation: 3,
            page_count: 2,
            stream_head: FIRST_DATA_SLOT,
            // 16 map bytes and 2 latch flavour bytes plus this wrap around to exactly 8.
            blob_len: 8u64.wrapping_sub(18),
            stream_len: 8,
            stream_crc: crc32c::crc32c(&[0u8; 8]),
        };
        let huge = Meta {
            format_version: FORMAT_VERSION,
            generation: 3,
            page_count: 1,
            stream_head: FIRST_DATA_SLOT,
            blob_len: 1 << 41,
            // 8 map bytes and 1 latch flavour byte, and the blob.
            stream_len: 9 + (1 << 41),
            stream_crc: 0,
        };
        for meta in [wrapping, huge] {
            match DataFile::open(file_with_meta(meta, 4)) {
                Err(PageError::Corrupt { .. }) => {}
                Err(other) => panic!("{meta:?}: not reported as corrupt: {other}"),
                Ok(_) => panic!("{meta:?}: opened"),
            }
        }
    }
}
