//! Uniquifiers: the hidden 8-byte suffix that makes every key of a non-unique clustered index
//! unique (a heap's keys are nothing else).
//!
//! Each table numbers its own. They used to be numbered for the whole process, and a database
//! opened in the process moved that numbering past the values its rows hold: one file whose heap
//! held a value near the end of the range (checksums valid) then left every heap and non-unique
//! clustered index of every database in the process unable to insert. Per table, such a file
//! can only use up its own table's values.
//!
//! Values are handed out in blocks of 2^[`UNIQUIFIER_BLOCK_BITS`] from [`UNIQUIFIER_STRIPES`]
//! stripes, each on its own cache line: a thread takes values from one stripe (its thread number
//! modulo the stripe count), so concurrent inserts rarely share a cache line for them, and each
//! stripe's values lie in its own block, so a heap's threads append in separate key ranges
//! rather than all at the heap's last page. The last value of a block is never handed out: a
//! stripe holding it has used its block up.

use crossbeam_utils::CachePadded;
use lastpage_storage::limits::{UNIQUIFIER_BLOCK_BITS, UNIQUIFIER_STRIPES};
use lastpage_storage::sync::{AtomicU64, Ordering};

/// A stripe's value before it takes its first block. Its block bits are all ones, like a used-up
/// block's last value, so the first take finds the stripe used up and takes a block.
const NO_BLOCK: u64 = u64::MAX;

/// The uniquifiers of one table.
///
/// Uniqueness is all they promise: two takes never return the same value, and none returns a
/// value in a block at or below the one [`Uniquifiers::raise_past`] was last given. Their order
/// does not follow the order of the takes.
pub struct Uniquifiers {
    /// Bits of a value below its block number.
    block_bits: u32,
    /// How many blocks there are: block numbers run from 0 to `blocks - 1`.
    blocks: u64,
    /// The next block to hand out, at most `blocks` (all handed out).
    next_block: AtomicU64,
    /// The lowest block a stripe may still take values from: a stripe holding an earlier one
    /// (a raise moved past it) takes a new block at its next take.
    floor: AtomicU64,
    /// Each stripe's next value, or its block's last value when the block is used up.
    stripes: Box<[CachePadded<AtomicU64>]>,
}

impl Default for Uniquifiers {
    fn default() -> Self {
        Self::new()
    }
}

impl Uniquifiers {
    /// A table's uniquifiers, with the geometry of the limits: 2^24 blocks of 2^40 values.
    pub fn new() -> Self {
        Self::with_geometry(
            UNIQUIFIER_BLOCK_BITS,
            1 << (u64::BITS - UNIQUIFIER_BLOCK_BITS),
            UNIQUIFIER_STRIPES,
        )
    }

    /// Uniquifiers with `blocks` blocks of 2^`block_bits` values and `stripes` stripes. Tests use
    /// small ones, to cross block ends and use every block up.
    ///
    /// # Panics
    /// If the geometry is empty or its values do not fit in 64 bits.
    pub fn with_geometry(block_bits: u32, blocks: u64, stripes: usize) -> Self {
        assert!(
            (1..u64::BITS).contains(&block_bits)
                && blocks > 0
                && blocks <= 1 << (u64::BITS - block_bits)
                && stripes > 0,
            "uniquifier geometry: {blocks} blocks of 2^{block_bits} values in {stripes} stripes"
        );
        Self {
            block_bits,
            blocks,
            next_block: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            stripes: (0..stripes)
                .map(|_| CachePadded::new(AtomicU64::new(NO_BLOCK)))
                .collect(),
        }
    }

    /// A fresh value from the calling thread's stripe; `None` once every block is handed out.
    pub fn take(&self) -> Option<u64> {
        self.take_from(thread_number())
    }

    /// A fresh value from stripe `stripe` (modulo the stripe count): [`Uniquifiers::take`] with
    /// the stripe chosen by the caller, which the model check needs (its threads share one
    /// operating-system thread).
    pub fn take_from(&self, stripe: usize) -> Option<u64> {
        let stripe = &self.stripes[stripe % self.stripes.len()];
        let block_end = (1u64 << self.block_bits) - 1;
        // Relaxed throughout: uniqueness only needs each location's modification order (every
        // value comes from a compare-exchange on its stripe, every block from an update of
        // `next_block`), and no other memory is published through these values; but the floor,
        // whose raise comes with the raised block numbering (see `raise_past`).
        let floor = self.floor.load(Ordering::Acquire);
        let mut value = stripe.load(Ordering::Relaxed);
        loop {
            if value & block_end != block_end && value >> self.block_bits >= floor {
                match stripe.compare_exchange_weak(
                    value,
                    value + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(value),
                    Err(current) => {
                        value = current;
                        continue;
                    }
                }
            }
            let block = self.take_block()?;
            let first = block << self.block_bits;
            match stripe.compare_exchange(value, first + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(first),
                // Another thread of the stripe installed a block first. The one taken here is
                // left unused: this happens only when a stripe is first used or used up, and
                // costs one of 2^24 blocks.
                Err(current) => value = current,
            }
        }
    }

    /// The next block, or `None` once every block is handed out. It never moves the counter past
    /// `blocks`, so refused takes leave nothing behind.
    fn take_block(&self) -> Option<u64> {
        self.next_block
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |block| {
                (block < self.blocks).then_some(block + 1)
            })
            .ok()
    }

    /// Makes every value taken after this returns lie in a later block than `highest`'s: the
    /// highest value the table's rows hold when its database is opened (an earlier process
    /// handed it out). Stripes holding a block at or below `highest`'s drop it at their next
    /// take; once `highest` lies in the last block, every later take fails.
    pub fn raise_past(&self, highest: u64) {
        let floor = (highest >> self.block_bits)
            .saturating_add(1)
            .min(self.blocks);
        self.raise_to_block(floor);
    }

    /// The blocks handed out so far: every value taken lies in a block below this. A checkpoint
    /// stores it, so that the next open continues past it without reading the rows
    /// ([`Uniquifiers::raise_to_block`]).
    pub fn blocks_taken(&self) -> u64 {
        self.next_block.load(Ordering::Relaxed)
    }

    /// Makes every value taken after this returns lie in block `floor` or a later one (at most
    /// every block: then every later take fails). Recovery calls it for every row it replays,
    /// so a raise that changes nothing is one load: the floor only grows, and the block
    /// numbering is raised before it, so a floor already this high means both are.
    pub fn raise_to_block(&self, floor: u64) {
        let floor = floor.min(self.blocks);
        if self.floor.load(Ordering::Acquire) >= floor {
            return;
        }
        // The blocks first, so that a take that reads the new floor and takes a block gets one
        // at or past it. A take that took a block before the raise drops it at its next take.
        self.next_block.fetch_max(floor, Ordering::Relaxed);
        // Release, and Acquire in `take_from`: a take that reads the new floor sees the raised
        // block numbering too.
        self.floor.fetch_max(floor, Ordering::Release);
    }
}

/// The calling thread's number, which picks its stripe. Plain std atomics, not part of any
/// protocol: any number is correct, distinct ones only spread the threads over the stripes.
///
/// A thread's number goes back when it exits, and a new thread takes the lowest free one: with
/// numbers never reused, a thread started after 64 others had come and gone (a connection's
/// thread, a pool's replacement) shared the stripe of a thread still running, so both took
/// interleaved values of one block and appended to the same last page of a heap.
fn thread_number() -> usize {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    /// Numbers of threads that exited, for new threads to take (the lowest first).
    static FREE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());
    /// The next number never handed out.
    static NEXT: Mutex<usize> = Mutex::new(0);
    /// A thread's number, given back when the thread exits.
    struct Number(usize);
    impl Drop for Number {
        fn drop(&mut self) {
            FREE.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(self.0);
        }
    }
    thread_local! {
        static NUMBER: Number = Number(
            FREE.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .pop_first()
                .unwrap_or_else(|| {
                    let mut next = NEXT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    *next += 1;
                    *next - 1
                }),
        );
    }
    // A take from another thread-local's destructor, after this one's ran, uses stripe 0.
    NUMBER.try_with(|number| number.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::Uniquifiers;
    use std::collections::HashSet;

    #[test]
    fn values_are_unique_across_block_ends_and_stripes_and_run_out_cleanly() {
        // 4 blocks of 4 values (3 handed out each) in 2 stripes: 12 values in all, each stripe
        // taking 6 of them from 2 blocks.
        let uniquifiers = Uniquifiers::with_geometry(2, 4, 2);
        let mut seen = HashSet::new();
        for take in 0..12 {
            let value = uniquifiers
                .take_from(take % 2)
                .unwrap_or_else(|| panic!("take {take} found the values used up"));
            assert_ne!(value & 3, 3, "a block's last value {value} was handed out");
            assert!(seen.insert(value), "value {value} was handed out twice");
        }
        assert_eq!(uniquifiers.take_from(0), None);
        assert_eq!(uniquifiers.take_from(1), None);
        // A refused take leaves nothing behind: a raise past block 0 keeps them all used up.
        uniquifiers.raise_past(0);
        assert_eq!(uniquifiers.take_from(0), None);
    }

    #[test]
    fn a_raise_drops_only_the_blocks_at_or_below_the_highest_value() {
        let uniquifiers = Uniquifiers::with_geometry(4, 16, 2);
        assert_eq!(uniquifiers.take_from(0), Some(0));
        assert_eq!(uniquifiers.take_from(1), Some(16));
        // Rows hold a value of block 0: stripe 0 drops its block, stripe 1 keeps block 1.
        uniquifiers.raise_past(5);
        assert_eq!(uniquifiers.take_from(1), Some(17));
        assert_eq!(uniquifiers.take_from(0), Some(32));
        // Rows hold a value of block 6: both drop theirs and the next block is 7.
        uniquifiers.raise_past(6 * 16 + 2);
        assert_eq!(uniquifiers.take_from(1), Some(7 * 16));
        assert_eq!(uniquifiers.take_from(0), Some(8 * 16));
    }

    #[test]
    fn a_value_in_the_last_block_uses_the_table_up_and_nothing_else() {
        let hostile = Uniquifiers::new();
        hostile.raise_past(u64::MAX - 5);
        assert_eq!(hostile.take(), None);
        let other = Uniquifiers::new();
        assert_eq!(other.take(), Some(0), "another table's numbering moved too");
        // One block before the last still leaves the last block.
        let near = Uniquifiers::new();
        near.raise_past(u64::MAX - (1 << 40) - 5);
        assert_eq!(near.take(), Some(((1 << 24) - 1) << 40));
    }

    /// Threads running at the same time take values from different blocks (so that a heap's
    /// appenders write separate key ranges), however many threads came and went before: with
    /// thread numbers never reused, the 64th thread started after a running one shared its
    /// stripe and took the next values of its block.
    #[test]
    fn a_running_thread_shares_its_block_with_no_later_thread() {
        let uniquifiers = Uniquifiers::new();
        let block_of = |value: u64| value >> 40;
        let (taken, release) = std::sync::mpsc::channel::<u64>();
        let uniquifiers = &uniquifiers;
        std::thread::scope(|scope| {
            // Dropped by a failed assertion too, which lets the running thread end.
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            scope.spawn(move || {
                taken.send(uniquifiers.take().unwrap()).unwrap();
                let _ = stopped.recv();
            });
            let running = block_of(release.recv().unwrap());
            for started in 0..200 {
                let value = scope
                    .spawn(move || uniquifiers.take().unwrap())
                    .join()
                    .unwrap();
                assert_ne!(
                    block_of(value),
                    running,
                    "thread {started} started after a running one took from its block"
                );
            }
            stop.send(()).unwrap();
        });
    }

    #[test]
    fn threads_take_distinct_values() {
        let uniquifiers = Uniquifiers::with_geometry(3, 1 << 20, 4);
        let values: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..10_000)
                            .map(|_| uniquifiers.take().unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|handle| handle.join().unwrap())
                .collect()
        });
        let distinct: HashSet<_> = values.iter().collect();
        assert_eq!(distinct.len(), values.len(), "a value was handed out twice");
        assert!(values.iter().all(|value| value & 7 != 7));
    }
}
