//! The slotted page layout shared by every B+tree page.
//!
//! ```text
//! offset 0                                  96                      free_start   slot array  8192
//!        +----------------------------------+-----------------------+-----------+-----------+
//!        | header (96 bytes)                | records, in insertion | free      | slot n-1  |
//!        |                                  | order                 | space     | ... slot 0|
//!        +----------------------------------+-----------------------+-----------+-----------+
//! ```
//!
//! The slot array grows down from the end of the page, like SQL Server's row offset array: slot
//! `i` is the two bytes at `PAGE_SIZE - 2 * (i + 1)` and holds the offset of the `i`-th record in
//! key order. Records grow up from the header. A deleted record leaves its bytes behind as
//! garbage, counted in the header and reclaimed by [`PageMut::compact`] when an insert needs the
//! space.
//!
//! Leaf record: `key_len: u16, value_len: u16, key, value`.
//! Inner record: `key_len: u16, child: u32, key`: the separator and the child that holds keys
//! greater than or equal to it. Keys below the first separator live in the page's `low_child`.
//!
//! Header fields (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | page id |
//! | 4 | 1 | page kind (0 free, 1 leaf, 2 inner) |
//! | 5 | 1 | level (0 for leaves) |
//! | 6 | 2 | slot count |
//! | 8 | 2 | free_start: end of the record area |
//! | 10 | 2 | garbage bytes inside the record area |
//! | 12 | 4 | previous leaf (0 = none) |
//! | 16 | 4 | next leaf (0 = none), or the low child of an inner page |
//! | 20 | 4 | index id of the owning B+tree |
//! | 24 | 8 | page LSN (reserved, zero: the log is logical and records no page LSN) |
//! | 32 | 4 | checksum (reserved, zero: the data file keeps each page's CRC32C in its page map) |
//! | 36 | 60 | reserved, zero |

use std::cmp::Ordering;

use crate::limits::{
    INNER_RECORD_HEADER_BYTES, LEAF_RECORD_HEADER_BYTES, MAX_KEY_BYTES, MAX_RECORD_BYTES,
    PAGE_HEADER_BYTES, PAGE_SIZE_BYTES, SLOT_BYTES,
};

/// A page number. Page 0 is never a valid page, so it doubles as "no page" in sibling links.
pub type PageId = u32;

/// The "no page" value of sibling links.
pub const NO_PAGE: PageId = 0;

/// The bytes of one page.
pub type PageBytes = [u8; PAGE_SIZE_BYTES];

// Header field offsets (the table in the module documentation). Public because they are part
// of the file format: tests that corrupt pages write these bytes directly.
/// Offset of the page id in the header.
pub const OFFSET_PAGE_ID: usize = 0;
/// Offset of the page kind byte.
pub const OFFSET_KIND: usize = 4;
/// Offset of the level byte.
pub const OFFSET_LEVEL: usize = 5;
/// Offset of the slot count.
pub const OFFSET_SLOT_COUNT: usize = 6;
/// Offset of `free_start`.
pub const OFFSET_FREE_START: usize = 8;
/// Offset of the garbage byte count.
pub const OFFSET_GARBAGE: usize = 10;
/// Offset of the previous-leaf link.
pub const OFFSET_PREV: usize = 12;
/// Offset of the next-leaf link, or of an inner page's low child.
pub const OFFSET_NEXT: usize = 16;
/// Offset of the owning index's id.
pub const OFFSET_INDEX_ID: usize = 20;

/// What a page holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// Not in use.
    Free,
    /// A B+tree leaf: keys with values.
    Leaf,
    /// A B+tree inner page: separators with child page ids.
    Inner,
}

impl PageKind {
    fn from_byte(byte: u8) -> Option<PageKind> {
        match byte {
            0 => Some(PageKind::Free),
            1 => Some(PageKind::Leaf),
            2 => Some(PageKind::Inner),
            _ => None,
        }
    }

    fn byte(self) -> u8 {
        match self {
            PageKind::Free => 0,
            PageKind::Leaf => 1,
            PageKind::Inner => 2,
        }
    }
}

/// The page is too full for the record; the caller must split it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageFull;

fn read_u16(bytes: &PageBytes, offset: usize) -> usize {
    usize::from(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
}

fn read_u32(bytes: &PageBytes, offset: usize) -> u32 {
    u32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

fn write_u16(bytes: &mut PageBytes, offset: usize, value: usize) {
    debug_assert!(value <= usize::from(u16::MAX));
    bytes[offset..offset + 2].copy_from_slice(&(value as u16).to_le_bytes());
}

fn write_u32(bytes: &mut PageBytes, offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

fn slot_position(index: usize) -> usize {
    PAGE_SIZE_BYTES - SLOT_BYTES * (index + 1)
}

/// Bytes a leaf record with this key and value occupies, slot included.
pub fn leaf_entry_bytes(key_len: usize, value_len: usize) -> usize {
    LEAF_RECORD_HEADER_BYTES + key_len + value_len + SLOT_BYTES
}

/// Bytes an inner record with this separator occupies, slot included.
pub fn inner_entry_bytes(key_len: usize) -> usize {
    INNER_RECORD_HEADER_BYTES + key_len + SLOT_BYTES
}

/// A read-only view of a page.
#[derive(Clone, Copy)]
pub struct Page<'a> {
    bytes: &'a PageBytes,
}

impl<'a> Page<'a> {
    /// Views `bytes` as a page.
    pub fn new(bytes: &'a PageBytes) -> Self {
        Page { bytes }
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a PageBytes {
        self.bytes
    }

    /// The page's own id, as stamped when it was formatted.
    pub fn page_id(&self) -> PageId {
        read_u32(self.bytes, OFFSET_PAGE_ID)
    }

    /// What the page holds, or `None` if the kind byte is corrupt.
    pub fn kind(&self) -> Option<PageKind> {
        PageKind::from_byte(self.bytes[OFFSET_KIND])
    }

    /// Whether this is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.bytes[OFFSET_KIND] == PageKind::Leaf.byte()
    }

    /// Height above the leaves (0 for a leaf).
    pub fn level(&self) -> u8 {
        self.bytes[OFFSET_LEVEL]
    }

    /// Number of records.
    pub fn slot_count(&self) -> usize {
        read_u16(self.bytes, OFFSET_SLOT_COUNT)
    }

    /// End of the record area.
    pub fn free_start(&self) -> usize {
        read_u16(self.bytes, OFFSET_FREE_START)
    }

    /// Bytes of deleted records still inside the record area.
    pub fn garbage_bytes(&self) -> usize {
        read_u16(self.bytes, OFFSET_GARBAGE)
    }

    /// The previous leaf, or [`NO_PAGE`].
    pub fn prev(&self) -> PageId {
        read_u32(self.bytes, OFFSET_PREV)
    }

    /// The next leaf, or [`NO_PAGE`] for the last leaf.
    pub fn next(&self) -> PageId {
        read_u32(self.bytes, OFFSET_NEXT)
    }

    /// The child of an inner page that holds keys below the first separator.
    pub fn low_child(&self) -> PageId {
        read_u32(self.bytes, OFFSET_NEXT)
    }

    /// Id of the B+tree the page belongs to.
    pub fn index_id(&self) -> u32 {
        read_u32(self.bytes, OFFSET_INDEX_ID)
    }

    /// Bytes free between the record area and the slot array.
    pub fn contiguous_free_bytes(&self) -> usize {
        (PAGE_SIZE_BYTES - SLOT_BYTES * self.slot_count()).saturating_sub(self.free_start())
    }

    /// Bytes free once garbage is compacted away.
    pub fn total_free_bytes(&self) -> usize {
        self.contiguous_free_bytes() + self.garbage_bytes()
    }

    /// Offset of the record in slot `index`.
    pub fn slot(&self, index: usize) -> usize {
        read_u16(self.bytes, slot_position(index))
    }

    /// The key of record `index` (leaf or inner).
    pub fn key(&self, index: usize) -> &'a [u8] {
        let offset = self.slot(index);
        let key_len = read_u16(self.bytes, offset);
        let start = offset + self.record_header_bytes();
        &self.bytes[start..start + key_len]
    }

    /// The value of leaf record `index`.
    pub fn value(&self, index: usize) -> &'a [u8] {
        let offset = self.slot(index);
        let key_len = read_u16(self.bytes, offset);
        let value_len = read_u16(self.bytes, offset + 2);
        let start = offset + LEAF_RECORD_HEADER_BYTES + key_len;
        &self.bytes[start..start + value_len]
    }

    /// The child page of inner record `index`.
    pub fn child(&self, index: usize) -> PageId {
        read_u32(self.bytes, self.slot(index) + 2)
    }

    /// Total size of record `index`, header included, slot excluded.
    pub fn record_bytes(&self, index: usize) -> usize {
        let offset = self.slot(index);
        let key_len = read_u16(self.bytes, offset);
        if self.is_leaf() {
            LEAF_RECORD_HEADER_BYTES + key_len + read_u16(self.bytes, offset + 2)
        } else {
            INNER_RECORD_HEADER_BYTES + key_len
        }
    }

    fn record_header_bytes(&self) -> usize {
        if self.is_leaf() {
            LEAF_RECORD_HEADER_BYTES
        } else {
            INNER_RECORD_HEADER_BYTES
        }
    }

    /// Binary search: `Ok(i)` if record `i` has `key`, `Err(i)` for the position where it
    /// would be inserted.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.slot_count());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.key(mid).cmp(key) {
                Ordering::Less => low = mid + 1,
                Ordering::Greater => high = mid,
                Ordering::Equal => return Ok(mid),
            }
        }
        Err(low)
    }

    /// [`Page::search`] for a key about to be inserted: a key above the page's last one (an
    /// ascending key arriving at the tail, the workload this engine is for) is placed with one
    /// comparison instead of a binary search.
    pub fn search_for_insert(&self, key: &[u8]) -> Result<usize, usize> {
        let count = self.slot_count();
        if count > 0 && self.key(count - 1) < key {
            return Err(count);
        }
        self.search(key)
    }

    /// For an inner page: the child whose subtree covers `key`, and the index of the separator
    /// that led there (`None` for the low child).
    pub fn child_for(&self, key: &[u8]) -> (PageId, Option<usize>) {
        match self.search(key) {
            Ok(index) => (self.child(index), Some(index)),
            Err(0) => (self.low_child(), None),
            Err(index) => (self.child(index - 1), Some(index - 1)),
        }
    }

    /// Whether the page's record area and slot array are self-consistent: every slot points at
    /// a record inside the record area, no record is larger than the limits allow, keys are
    /// strictly ascending, no two records overlap, and the record bytes plus the garbage fill
    /// the area exactly. Checked on every page read from the data file and by the integrity
    /// checker before it reads records, so that a corrupt page is reported rather than read out
    /// of bounds or searched as if it were sorted.
    pub fn check_layout(&self) -> Result<(), String> {
        let kind = self
            .kind()
            .ok_or_else(|| format!("kind byte {} is invalid", self.bytes[OFFSET_KIND]))?;
        if kind == PageKind::Free {
            return Err("page is marked free but is linked into a tree".into());
        }
        let slot_count = self.slot_count();
        let free_start = self.free_start();
        // A damaged slot count can claim more slots than the page holds: checked, not
        // subtracted, so that it is reported rather than overflowing.
        let Some(slot_array_start) = PAGE_SIZE_BYTES.checked_sub(SLOT_BYTES * slot_count) else {
            return Err(format!(
                "slot count {slot_count} needs more than the page's {PAGE_SIZE_BYTES} bytes"
            ));
        };
        if free_start < PAGE_HEADER_BYTES || free_start > slot_array_start {
            return Err(format!(
                "free_start {free_start} overlaps the header or the {slot_count}-slot array"
            ));
        }
        let header_bytes = self.record_header_bytes();
        let mut extents = Vec::with_capacity(slot_count);
        for index in 0..slot_count {
            let offset = self.slot(index);
            if offset < PAGE_HEADER_BYTES || offset + header_bytes > free_start {
                return Err(format!(
                    "slot {index} points at {offset}, outside the record area 96..{free_start}"
                ));
            }
            let key_len = read_u16(self.bytes, offset);
            let length = if kind == PageKind::Leaf {
                header_bytes + key_len + read_u16(self.bytes, offset + 2)
            } else {
                header_bytes + key_len
            };
            if offset + length > free_start {
                return Err(format!(
                    "record in slot {index} ({offset}+{length}) runs past free_start {free_start}"
                ));
            }
            // Within the limits every write enforces: splits rely on any two records fitting
            // on an empty page, and on a full inner page holding at least three.
            if key_len > MAX_KEY_BYTES || length > MAX_RECORD_BYTES {
                return Err(format!(
                    "record in slot {index} has a {key_len}-byte key and {length} bytes in all"
                ));
            }
            if index > 0 && self.key(index - 1) >= self.key(index) {
                return Err(format!(
                    "keys in slots {} and {index} are not strictly ascending",
                    index - 1
                ));
            }
            extents.push((offset, offset + length));
        }
        extents.sort_unstable();
        let mut used = 0;
        for pair in extents.windows(2) {
            if pair[0].1 > pair[1].0 {
                return Err(format!(
                    "records at {} and {} overlap",
                    pair[0].0, pair[1].0
                ));
            }
        }
        for (start, end) in &extents {
            used += end - start;
        }
        if used + self.garbage_bytes() != free_start - PAGE_HEADER_BYTES {
            return Err(format!(
                "records use {used} bytes and garbage {} but the record area is {} bytes",
                self.garbage_bytes(),
                free_start - PAGE_HEADER_BYTES
            ));
        }
        Ok(())
    }
}

/// A writable view of a page.
pub struct PageMut<'a> {
    bytes: &'a mut PageBytes,
}

impl<'a> PageMut<'a> {
    /// Views `bytes` as a writable page.
    pub fn new(bytes: &'a mut PageBytes) -> Self {
        PageMut { bytes }
    }

    /// A read-only view of the same page.
    pub fn as_page(&self) -> Page<'_> {
        Page { bytes: self.bytes }
    }

    /// Formats the page as an empty page of `kind` at `level`.
    pub fn format(&mut self, page_id: PageId, kind: PageKind, level: u8, index_id: u32) {
        self.bytes[..PAGE_HEADER_BYTES].fill(0);
        write_u32(self.bytes, OFFSET_PAGE_ID, page_id);
        self.bytes[OFFSET_KIND] = kind.byte();
        self.bytes[OFFSET_LEVEL] = level;
        write_u16(self.bytes, OFFSET_SLOT_COUNT, 0);
        write_u16(self.bytes, OFFSET_FREE_START, PAGE_HEADER_BYTES);
        write_u16(self.bytes, OFFSET_GARBAGE, 0);
        write_u32(self.bytes, OFFSET_INDEX_ID, index_id);
    }

    /// Copies every byte of `source` except the page id: used to move the root's contents to a
    /// new child when the root grows.
    pub fn copy_contents_from(&mut self, source: &Page<'_>) {
        let page_id = self.as_page().page_id();
        self.bytes.copy_from_slice(source.bytes());
        write_u32(self.bytes, OFFSET_PAGE_ID, page_id);
    }

    /// Sets the previous-leaf link.
    pub fn set_prev(&mut self, page: PageId) {
        write_u32(self.bytes, OFFSET_PREV, page);
    }

    /// Sets the next-leaf link.
    pub fn set_next(&mut self, page: PageId) {
        write_u32(self.bytes, OFFSET_NEXT, page);
    }

    /// Sets the low child of an inner page.
    pub fn set_low_child(&mut self, page: PageId) {
        write_u32(self.bytes, OFFSET_NEXT, page);
    }

    /// Makes room for `record_len` bytes plus a slot, compacting if that is enough; returns the
    /// offset to write the record at.
    fn reserve(&mut self, record_len: usize) -> Result<usize, PageFull> {
        let needed = record_len + SLOT_BYTES;
        let page = self.as_page();
        if page.contiguous_free_bytes() < needed {
            if page.total_free_bytes() < needed {
                return Err(PageFull);
            }
            self.compact();
        }
        Ok(self.as_page().free_start())
    }

    /// Inserts a slot pointing at `offset` at position `index`, shifting later slots.
    fn insert_slot(&mut self, index: usize, offset: usize) {
        let count = self.as_page().slot_count();
        debug_assert!(index <= count);
        // Slots live at decreasing addresses, so slots index..count move down by one slot.
        let low = slot_position(count);
        let high = slot_position(index) + SLOT_BYTES;
        self.bytes.copy_within(low + SLOT_BYTES..high, low);
        write_u16(self.bytes, slot_position(index), offset);
        write_u16(self.bytes, OFFSET_SLOT_COUNT, count + 1);
    }

    /// Inserts a leaf record at slot `index` (which must keep keys sorted).
    pub fn insert_leaf(&mut self, index: usize, key: &[u8], value: &[u8]) -> Result<(), PageFull> {
        let record_len = LEAF_RECORD_HEADER_BYTES + key.len() + value.len();
        let offset = self.reserve(record_len)?;
        write_u16(self.bytes, offset, key.len());
        write_u16(self.bytes, offset + 2, value.len());
        let key_start = offset + LEAF_RECORD_HEADER_BYTES;
        self.bytes[key_start..key_start + key.len()].copy_from_slice(key);
        self.bytes[key_start + key.len()..key_start + key.len() + value.len()]
            .copy_from_slice(value);
        write_u16(self.bytes, OFFSET_FREE_START, offset + record_len);
        self.insert_slot(index, offset);
        Ok(())
    }

    /// Overwrites the key of leaf record `index` with `key`, which must have the same length
    /// and keep the keys sorted. Lets a writer copy a large row into a private page before it
    /// knows the row's key (see `btree/append.rs`).
    pub fn overwrite_key(&mut self, index: usize, key: &[u8]) {
        let page = self.as_page();
        assert!(page.is_leaf(), "only leaf records are rewritten in place");
        assert_eq!(
            page.key(index).len(),
            key.len(),
            "a key is overwritten by one as long"
        );
        let start = page.slot(index) + LEAF_RECORD_HEADER_BYTES;
        self.bytes[start..start + key.len()].copy_from_slice(key);
    }

    /// Inserts an inner record (separator `key`, `child`) at slot `index`.
    pub fn insert_inner(
        &mut self,
        index: usize,
        key: &[u8],
        child: PageId,
    ) -> Result<(), PageFull> {
        let record_len = INNER_RECORD_HEADER_BYTES + key.len();
        let offset = self.reserve(record_len)?;
        write_u16(self.bytes, offset, key.len());
        write_u32(self.bytes, offset + 2, child);
        let key_start = offset + INNER_RECORD_HEADER_BYTES;
        self.bytes[key_start..key_start + key.len()].copy_from_slice(key);
        write_u16(self.bytes, OFFSET_FREE_START, offset + record_len);
        self.insert_slot(index, offset);
        Ok(())
    }

    /// Removes record `index`; its bytes become garbage.
    pub fn remove(&mut self, index: usize) {
        let page = self.as_page();
        let count = page.slot_count();
        debug_assert!(index < count);
        let record_len = page.record_bytes(index);
        let garbage = page.garbage_bytes() + record_len;
        let low = slot_position(count - 1);
        let high = slot_position(index);
        // Slots index+1..count move up by one slot, over the removed one.
        self.bytes.copy_within(low..high, low + SLOT_BYTES);
        write_u16(self.bytes, OFFSET_SLOT_COUNT, count - 1);
        write_u16(self.bytes, OFFSET_GARBAGE, garbage);
    }

    /// Removes records `from..` and returns nothing; used after moving them to a new page.
    pub fn truncate(&mut self, from: usize) {
        let count = self.as_page().slot_count();
        let removed: usize = (from..count)
            .map(|index| self.as_page().record_bytes(index))
            .sum();
        let garbage = self.as_page().garbage_bytes() + removed;
        write_u16(self.bytes, OFFSET_SLOT_COUNT, from);
        write_u16(self.bytes, OFFSET_GARBAGE, garbage);
    }

    /// Rewrites the record area without garbage, keeping slot order.
    pub fn compact(&mut self) {
        let page = self.as_page();
        if page.garbage_bytes() == 0 {
            return;
        }
        let count = page.slot_count();
        let mut scratch = [0u8; PAGE_SIZE_BYTES];
        let mut write_at = PAGE_HEADER_BYTES;
        let mut new_offsets = [0u16; PAGE_SIZE_BYTES / SLOT_BYTES];
        for (index, new_offset) in new_offsets.iter_mut().enumerate().take(count) {
            let offset = page.slot(index);
            let length = page.record_bytes(index);
            scratch[write_at..write_at + length]
                .copy_from_slice(&self.bytes[offset..offset + length]);
            *new_offset = write_at as u16;
            write_at += length;
        }
        self.bytes[PAGE_HEADER_BYTES..write_at]
            .copy_from_slice(&scratch[PAGE_HEADER_BYTES..write_at]);
        for (index, new_offset) in new_offsets.iter().enumerate().take(count) {
            write_u16(self.bytes, slot_position(index), usize::from(*new_offset));
        }
        write_u16(self.bytes, OFFSET_FREE_START, write_at);
        write_u16(self.bytes, OFFSET_GARBAGE, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_RECORD_BYTES;

    fn leaf() -> Box<PageBytes> {
        let mut bytes = Box::new([0u8; PAGE_SIZE_BYTES]);
        PageMut::new(&mut bytes).format(7, PageKind::Leaf, 0, 1);
        bytes
    }

    #[test]
    fn records_stay_sorted_and_removal_space_is_reused_after_compaction() {
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        let mut count = 0u32;
        loop {
            let key = (count * 7919 % 100_000).to_be_bytes();
            let index = match page.as_page().search(&key) {
                Ok(_) => unreachable!("keys are distinct"),
                Err(index) => index,
            };
            if page.insert_leaf(index, &key, &[0xAB; 100]).is_err() {
                break;
            }
            count += 1;
        }
        // 8096 body bytes / (4 + 4 + 100 + 2) bytes per record.
        assert_eq!(count, 73);
        let view = page.as_page();
        assert!(view.check_layout().is_ok());
        for index in 1..view.slot_count() {
            assert!(view.key(index - 1) < view.key(index));
        }
        page.remove(10);
        page.remove(0);
        assert_eq!(page.as_page().garbage_bytes(), 216);
        assert!(page.as_page().check_layout().is_ok());
        page.insert_leaf(0, &[0, 0, 0, 0], &[1; 100]).unwrap();
        page.insert_leaf(1, &[0, 0, 0, 1], &[2; 100]).unwrap();
        assert!(page.insert_leaf(2, &[0, 0, 0, 2], &[3; 100]).is_err());
        let view = page.as_page();
        assert!(view.check_layout().is_ok());
        assert_eq!(view.value(1), &[2; 100]);
        assert_eq!(view.slot_count(), 73);
    }

    #[test]
    fn the_layout_check_refuses_a_slot_count_larger_than_the_page() {
        let mut bytes = leaf();
        write_u16(&mut bytes, OFFSET_SLOT_COUNT, 5000);
        let error = Page::new(&bytes).check_layout().unwrap_err();
        assert!(error.contains("slot count 5000"), "{error}");
    }

    #[test]
    fn the_layout_check_refuses_unsorted_keys_and_records_over_the_limits() {
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        for (index, key) in [b"b", b"d", b"f"].into_iter().enumerate() {
            page.insert_leaf(index, key, b"value").unwrap();
        }
        assert_eq!(page.as_page().check_layout(), Ok(()));
        // Equal neighbours, then a key out of order: a binary search would silently miss rows.
        for key in [b"b", b"z"] {
            page.overwrite_key(1, key);
            let error = page.as_page().check_layout().unwrap_err();
            assert!(error.contains("ascending"), "{error}");
        }
        page.overwrite_key(1, b"d");
        assert_eq!(page.as_page().check_layout(), Ok(()));

        // No write makes a key longer than MAX_KEY_BYTES; a split relies on that.
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        page.insert_leaf(0, &[7; MAX_KEY_BYTES], b"").unwrap();
        assert_eq!(page.as_page().check_layout(), Ok(()));
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        page.insert_leaf(0, &[7; MAX_KEY_BYTES + 1], b"").unwrap();
        assert!(page.as_page().check_layout().unwrap_err().contains("key"));
    }

    #[test]
    fn the_insert_search_agrees_with_the_binary_search() {
        // Keys 10, 20, ..., 500 on one page; probe every key from below the first to above the
        // last, present or not: the fast path for keys past the end must not change an answer.
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        assert_eq!(page.as_page().search_for_insert(&[5]), Err(0));
        for (index, key) in (10u16..=500).step_by(10).enumerate() {
            page.insert_leaf(index, &key.to_be_bytes(), &[1]).unwrap();
        }
        let view = page.as_page();
        for probe in 0u16..=520 {
            let key = probe.to_be_bytes();
            assert_eq!(
                view.search_for_insert(&key),
                view.search(&key),
                "key {probe}"
            );
        }
        assert_eq!(view.search_for_insert(&600u16.to_be_bytes()), Err(50));
        assert_eq!(view.search_for_insert(&500u16.to_be_bytes()), Ok(49));
    }

    #[test]
    fn one_maximal_record_fills_a_page() {
        let mut bytes = leaf();
        let mut page = PageMut::new(&mut bytes);
        let value = vec![1u8; MAX_RECORD_BYTES - LEAF_RECORD_HEADER_BYTES - 4];
        page.insert_leaf(0, &[0, 0, 0, 1], &value).unwrap();
        assert!(page.insert_leaf(1, &[0, 0, 0, 2], &[1; 40]).is_err());
        assert_eq!(page.as_page().value(0).len(), value.len());
    }

    #[test]
    fn inner_pages_route_keys_to_children() {
        let mut bytes = Box::new([0u8; PAGE_SIZE_BYTES]);
        let mut page = PageMut::new(&mut bytes);
        page.format(3, PageKind::Inner, 1, 1);
        page.set_low_child(10);
        page.insert_inner(0, b"m", 11).unwrap();
        page.insert_inner(1, b"t", 12).unwrap();
        let view = page.as_page();
        assert_eq!(view.child_for(b"a"), (10, None));
        assert_eq!(view.child_for(b"m"), (11, Some(0)));
        assert_eq!(view.child_for(b"p"), (11, Some(0)));
        assert_eq!(view.child_for(b"z"), (12, Some(1)));
        assert!(view.check_layout().is_ok());
    }
}
