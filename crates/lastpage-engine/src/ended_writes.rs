//! A database's count of ended writes: statements rolled back, and transactions that ended
//! holding row locks. Two reads rely on it to skip reading a row a second time.
//!
//! The protocol (model-checked in `tests/ended_writes_loom.rs`):
//! - A writer changes a row only while it holds the row's exclusive lock, and counts itself
//!   here ([`EndedWrites::note`]) after its last change (or undo) and before its locks go.
//! - A reader reads the count, then the row; later, it holds the row's lock or sees the row
//!   unlocked (either way after the lock's last holder let it go), and reads the count again.
//!   If the count did not move, no transaction that held the row's lock at any moment since
//!   the first read let it go, so what the reader read is the row's current version, and, read
//!   unlocked, a committed one. `Table::committed_value` takes a read as committed this way;
//!   `Table::find_locked_with` takes the version it read as the one its new lock protects.
//!
//! Why this is enough: a writer's count comes before its release of the lock in its own
//! order, and the reader's second read of the count after its acquisition (or sight) of the
//! lock free, so the second read sees the writer's count if the writer's release is what the
//! reader saw. If instead the first read already saw that count, the reader's row read comes
//! after the writer's last change and sees it.

use crossbeam_utils::CachePadded;
use lastpage_storage::sync::{AtomicU64, Ordering};

/// How many stripes the count has. Under loom, two: enough for a reader's sum to meet writers
/// in different stripes, and few enough for the model checker to explore every interleaving.
#[cfg(not(loom))]
const STRIPES: usize = lastpage_storage::limits::ENDED_WRITES_STRIPES;
#[cfg(loom)]
const STRIPES: usize = 2;

/// Hands each thread its stripe, round robin. A plain counter, not part of any protocol (std's,
/// like the database instance numbers).
static NEXT_STRIPE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

std::thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES;
}

/// The count, in stripes: every ending writer adds to it, so one shared counter would be a
/// cache line every committing writer fights over; a reader sums the stripes.
pub struct EndedWrites {
    stripes: [CachePadded<AtomicU64>; STRIPES],
}

impl Default for EndedWrites {
    fn default() -> EndedWrites {
        EndedWrites {
            stripes: std::array::from_fn(|_| CachePadded::new(AtomicU64::new(0))),
        }
    }
}

impl EndedWrites {
    /// The count so far.
    ///
    /// The stripes are summed one by one, which is enough: each only grows, so a count added
    /// after a reader's first sum read its stripe makes the second sum larger.
    pub fn count(&self) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.load(Ordering::Acquire))
            .fold(0, u64::wrapping_add)
    }

    /// Counts a statement rolled back, or a transaction that held row locks ending, in the
    /// calling thread's stripe: after the writer's last change (or undo) and before its locks
    /// are released.
    pub fn note(&self) {
        self.note_in_stripe(STRIPE.with(|stripe| *stripe));
    }

    /// [`EndedWrites::note`] in a given stripe (taken modulo the number of stripes): the loom
    /// model puts its writers in different stripes this way, which thread-local choice could
    /// not be relied on to do.
    pub fn note_in_stripe(&self, stripe: usize) {
        self.stripes[stripe % STRIPES].fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_note_counts_once_whatever_its_stripe() {
        let ended = EndedWrites::default();
        assert_eq!(ended.count(), 0);
        ended.note();
        for stripe in 0..3 * STRIPES {
            ended.note_in_stripe(stripe);
        }
        assert_eq!(ended.count(), 1 + 3 * STRIPES as u64);
        // Threads other than this one count too.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| ended.note());
            }
        });
        assert_eq!(ended.count(), 5 + 3 * STRIPES as u64);
    }
}
