//! Ordered range scans in both directions.
//!
//! A scan reads one leaf at a time under a shared latch, copies the rows it wants, and lets the
//! latch go before handing rows out, so a slow consumer never holds a latch. To move on it does
//! not follow sibling links: it descends again from the root to the leaf just past the previous
//! leaf's fence (the separator that bounds it). That keeps the latch order strictly top-down
//! (a backward step along `prev` links would latch right to left, against the order splits
//! use), and it cannot skip rows that a split moved while the scan was between leaves.

use std::collections::VecDeque;
use std::ops::Bound;

use super::{BTree, BTreeError, corrupt};
use crate::buffer::SharedGuard;
use crate::page::PageId;

/// Scan order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Direction {
    /// Ascending key order.
    #[default]
    Forward,
    /// Descending key order.
    Backward,
}

/// Where a descent for a scan lands.
enum Seek<'k> {
    /// The leaf covering this key.
    Covering(&'k [u8]),
    /// The leaf covering the greatest keys below this key.
    Below(&'k [u8]),
    /// The last leaf.
    Last,
}

/// A leaf latched for a scan and its fences: the separators that bound its key range (`None`
/// at the ends of the index).
type ScanLeaf<'a> = (SharedGuard<'a>, Option<Vec<u8>>, Option<Vec<u8>>);

/// An iterator over `(key, value)` pairs of a key range, in either direction.
///
/// If a page cannot be read (an I/O error or a corrupt page in a file-backed pool), the
/// iterator stops early and [`RangeIter::error`] says why: a caller that must not mistake a
/// failed scan for a short one checks it after the loop.
pub struct RangeIter<'a> {
    tree: &'a BTree,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    direction: Direction,
    buffer: VecDeque<(Vec<u8>, Vec<u8>)>,
    exhausted: bool,
    error: Option<BTreeError>,
}

impl BTree {
    /// Scans the keys within `lower..upper` in `direction`.
    pub fn range(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
    ) -> RangeIter<'_> {
        RangeIter {
            tree: self,
            lower: lower.map(<[u8]>::to_vec),
            upper: upper.map(<[u8]>::to_vec),
            direction,
            buffer: VecDeque::new(),
            exhausted: false,
            error: None,
        }
    }

    /// Descends with shared latch coupling; returns the leaf and its fences (the separators
    /// that bound its key range; `None` at the ends of the index).
    fn descend_for_scan(&self, seek: Seek<'_>) -> Result<ScanLeaf<'_>, BTreeError> {
        let mut node = self.root_shared()?;
        let mut low: Option<Vec<u8>> = None;
        let mut high: Option<Vec<u8>> = None;
        while !node.page().is_leaf() {
            let page = node.page();
            let count = page.slot_count();
            // `Some(i)`: the child to the right of separator i; `None`: the low child.
            let chosen = match seek {
                Seek::Covering(key) => page.child_for(key).1,
                Seek::Below(key) => match page.search(key) {
                    Ok(0) | Err(0) => None,
                    Ok(index) | Err(index) => Some(index - 1),
                },
                Seek::Last => count.checked_sub(1),
            };
            let (child, next_separator) = match chosen {
                None => (page.low_child(), 0),
                Some(index) => {
                    low = Some(page.key(index).to_vec());
                    (page.child(index), index + 1)
                }
            };
            if next_separator < count {
                high = Some(page.key(next_separator).to_vec());
            }
            node = self.child_shared(&page, child)?;
        }
        Ok((node, low, high))
    }
}

/// The error of a scan whose next leaf would not lie beyond the one just read.
fn no_progress(leaf: PageId) -> BTreeError {
    corrupt(
        leaf,
        "the separators above this leaf do not move a scan past it".into(),
    )
}

impl RangeIter<'_> {
    /// Why the scan stopped early, if it did.
    pub fn error(&self) -> Option<&BTreeError> {
        self.error.as_ref()
    }

    /// Takes the error that stopped the scan early, if any.
    pub fn take_error(&mut self) -> Option<BTreeError> {
        self.error.take()
    }

    /// Reads the next leaf's worth of rows into the buffer.
    fn fill(&mut self) {
        while self.buffer.is_empty() && !self.exhausted {
            let filled = match self.direction {
                Direction::Forward => self.fill_forward(),
                Direction::Backward => self.fill_backward(),
            };
            if let Err(error) = filled {
                self.error = Some(error);
                self.exhausted = true;
            }
        }
    }

    fn fill_forward(&mut self) -> Result<(), BTreeError> {
        let seek = match &self.lower {
            Bound::Included(key) | Bound::Excluded(key) => Seek::Covering(key),
            Bound::Unbounded => Seek::Covering(&[]),
        };
        let (leaf, _, high) = self.tree.descend_for_scan(seek)?;
        let page = leaf.page();
        let start = match &self.lower {
            Bound::Unbounded => 0,
            Bound::Included(key) => page.search(key).unwrap_or_else(|index| index),
            Bound::Excluded(key) => page
                .search(key)
                .map_or_else(|index| index, |index| index + 1),
        };
        for index in start..page.slot_count() {
            let key = page.key(index);
            let beyond = match &self.upper {
                Bound::Unbounded => false,
                Bound::Included(upper) => key > upper.as_slice(),
                Bound::Excluded(upper) => key >= upper.as_slice(),
            };
            if beyond {
                self.exhausted = true;
                return Ok(());
            }
            self.buffer
                .push_back((key.to_vec(), page.value(index).to_vec()));
        }
        match high {
            Some(fence) => {
                // The next leaf's range starts above everything this one could hold. A fence
                // that does not move the scan forward (possible only if pages disagree about
                // their keys) would make it read the same leaf for ever.
                if let Bound::Included(key) | Bound::Excluded(key) = &self.lower
                    && fence.as_slice() <= key.as_slice()
                {
                    return Err(no_progress(leaf.page_id()));
                }
                self.lower = Bound::Included(fence);
            }
            None => self.exhausted = true,
        }
        Ok(())
    }

    fn fill_backward(&mut self) -> Result<(), BTreeError> {
        let seek = match &self.upper {
            Bound::Included(key) => Seek::Covering(key),
            Bound::Excluded(key) => Seek::Below(key),
            Bound::Unbounded => Seek::Last,
        };
        let (leaf, low, _) = self.tree.descend_for_scan(seek)?;
        let page = leaf.page();
        let end = match &self.upper {
            Bound::Unbounded => page.slot_count(),
            Bound::Included(key) => page
                .search(key)
                .map_or_else(|index| index, |index| index + 1),
            Bound::Excluded(key) => page.search(key).unwrap_or_else(|index| index),
        };
        for index in (0..end).rev() {
            let key = page.key(index);
            let beyond = match &self.lower {
                Bound::Unbounded => false,
                Bound::Included(lower) => key < lower.as_slice(),
                Bound::Excluded(lower) => key <= lower.as_slice(),
            };
            if beyond {
                self.exhausted = true;
                return Ok(());
            }
            self.buffer
                .push_back((key.to_vec(), page.value(index).to_vec()));
        }
        match low {
            Some(fence) => {
                // The mirror image of the forward scan's check, except that a leaf read for
                // an inclusive bound may start at that very key: the scan then goes on below
                // it, exclusively, which is progress too.
                let stuck = match &self.upper {
                    Bound::Included(key) => fence.as_slice() > key.as_slice(),
                    Bound::Excluded(key) => fence.as_slice() >= key.as_slice(),
                    Bound::Unbounded => false,
                };
                if stuck {
                    return Err(no_progress(leaf.page_id()));
                }
                self.upper = Bound::Excluded(fence);
            }
            None => self.exhausted = true,
        }
        Ok(())
    }
}

impl Iterator for RangeIter<'_> {
    type Item = (Vec<u8>, Vec<u8>);

    fn next(&mut self) -> Option<Self::Item> {
        self.fill();
        self.buffer.pop_front()
    }
}
