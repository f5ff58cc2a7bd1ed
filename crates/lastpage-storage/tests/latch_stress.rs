//! Stress tests of both latch flavours with real threads (many more than the two cores), and
//! checks of the wait statistics the latches record.
//!
//! The stress tests are randomized; each prints its seed, and `LATCH_STRESS_SEED=<seed>` replays
//! one. Wait statistics are checked through a [`WaitAccumulator`] that only the test's own
//! threads feed, and through global snapshot deltas only for counters that can only grow (the
//! tests of this file run in parallel in one process).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use lastpage_storage::latch::{Latch, LatchClass, LatchMode, LatchPolicy};
use lastpage_storage::stats::{self, WaitAccumulator, WaitType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use LatchMode::{Exclusive, Shared, Update};

/// A latch and the data it protects: a pair that writers keep equal, and how many threads are
/// inside in each mode, to check compatibility directly.
struct Protected {
    latch: Latch,
    first: AtomicU64,
    second: AtomicU64,
    exclusive_inside: AtomicU32,
    update_inside: AtomicU32,
    shared_inside: AtomicU32,
}

impl Protected {
    fn new(policy: LatchPolicy) -> Protected {
        Protected {
            latch: Latch::new(policy, LatchClass::Buffer),
            first: AtomicU64::new(0),
            second: AtomicU64::new(0),
            exclusive_inside: AtomicU32::new(0),
            update_inside: AtomicU32::new(0),
            shared_inside: AtomicU32::new(0),
        }
    }

    /// Called right after the latch was granted in `mode`.
    fn enter(&self, mode: LatchMode) {
        match mode {
            Exclusive => {
                assert_eq!(
                    self.exclusive_inside.swap(1, Ordering::SeqCst),
                    0,
                    "two writers"
                );
                assert_eq!(
                    self.update_inside.load(Ordering::SeqCst),
                    0,
                    "writer with updater"
                );
                assert_eq!(
                    self.shared_inside.load(Ordering::SeqCst),
                    0,
                    "writer with reader"
                );
                assert!(self.latch.is_held_exclusive());
            }
            Update => {
                assert_eq!(
                    self.update_inside.swap(1, Ordering::SeqCst),
                    0,
                    "two updaters"
                );
                assert_eq!(
                    self.exclusive_inside.load(Ordering::SeqCst),
                    0,
                    "updater with writer"
                );
            }
            Shared => {
                self.shared_inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    self.exclusive_inside.load(Ordering::SeqCst),
                    0,
                    "reader with writer"
                );
            }
        }
    }

    /// Called right before the latch is released (or converted) from `mode`.
    fn leave(&self, mode: LatchMode) {
        match mode {
            Exclusive => self.exclusive_inside.store(0, Ordering::SeqCst),
            Update => self.update_inside.store(0, Ordering::SeqCst),
            Shared => {
                self.shared_inside.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Reads the pair under a shared or update latch; a torn pair means a writer was inside.
    fn read(&self, rng: &mut StdRng) -> u64 {
        let first = self.first.load(Ordering::Relaxed);
        maybe_yield(rng);
        let second = self.second.load(Ordering::Relaxed);
        assert_eq!(first, second, "a reader saw a half-written pair");
        first
    }

    /// Increments the pair under an exclusive latch, non-atomically on purpose.
    fn write(&self, rng: &mut StdRng) -> u64 {
        let value = self.first.load(Ordering::Relaxed) + 1;
        self.first.store(value, Ordering::Relaxed);
        maybe_yield(rng);
        assert_eq!(
            self.second.load(Ordering::Relaxed) + 1,
            value,
            "a writer saw a half-written pair"
        );
        self.second.store(value, Ordering::Relaxed);
        value
    }
}

/// Yields inside a critical section now and then, so that holders get preempted and the parking
/// paths run, as they do with hundreds of threads on two cores.
fn maybe_yield(rng: &mut StdRng) {
    if rng.random_ratio(1, 16) {
        thread::yield_now();
    }
}

fn seed() -> u64 {
    std::env::var("LATCH_STRESS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos() as u64)
        })
}

/// One random operation on `cell`. Returns how many increments it made.
fn one_operation(cell: &Protected, rng: &mut StdRng) -> u64 {
    match rng.random_range(0..100) {
        // Plain readers.
        0..40 => {
            cell.latch.acquire(Shared);
            cell.enter(Shared);
            cell.read(rng);
            cell.leave(Shared);
            cell.latch.release(Shared);
            0
        }
        // Plain writers, some of which downgrade and check that nobody wrote since.
        40..65 => {
            cell.latch.acquire(Exclusive);
            cell.enter(Exclusive);
            let written = cell.write(rng);
            cell.leave(Exclusive);
            if rng.random_bool(0.3) {
                cell.latch.downgrade();
                cell.enter(Shared);
                assert_eq!(
                    cell.read(rng),
                    written,
                    "a writer got in during a downgrade"
                );
                cell.leave(Shared);
                cell.latch.release(Shared);
            } else {
                cell.latch.release(Exclusive);
            }
            1
        }
        // Updaters, most of which upgrade: nothing may change between the update latch and
        // the upgrade.
        65..85 => {
            cell.latch.acquire(Update);
            cell.enter(Update);
            let before = cell.read(rng);
            cell.leave(Update);
            if rng.random_bool(0.7) {
                cell.latch.upgrade();
                cell.enter(Exclusive);
                assert_eq!(
                    cell.write(rng),
                    before + 1,
                    "a writer got in during an upgrade"
                );
                cell.leave(Exclusive);
                cell.latch.release(Exclusive);
                1
            } else {
                cell.latch.release(Update);
                0
            }
        }
        // Conditional requests in every mode.
        _ => {
            let mode = [Shared, Update, Exclusive][rng.random_range(0..3)];
            if !cell.latch.try_acquire(mode) {
                return 0;
            }
            cell.enter(mode);
            let increments = if mode == Exclusive {
                cell.write(rng);
                1
            } else {
                cell.read(rng);
                0
            };
            cell.leave(mode);
            cell.latch.release(mode);
            increments
        }
    }
}

fn stress(policy: LatchPolicy) {
    const THREADS: usize = 64;
    const CELLS: usize = 3;
    const OPERATIONS: usize = 5000;
    let seed = seed();
    println!("latch stress ({policy}): seed {seed} (replay with LATCH_STRESS_SEED={seed})");
    let cells: Arc<Vec<Protected>> = Arc::new((0..CELLS).map(|_| Protected::new(policy)).collect());
    let increments: Arc<Vec<AtomicU64>> = Arc::new((0..CELLS).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let cells = Arc::clone(&cells);
            let increments = Arc::clone(&increments);
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(index as u64));
            thread::spawn(move || {
                for _ in 0..OPERATIONS {
                    // Skewed towards the first cell: one hot page and two warm ones.
                    let cell = if rng.random_bool(0.6) {
                        0
                    } else {
                        rng.random_range(0..CELLS)
                    };
                    let made = one_operation(&cells[cell], &mut rng);
                    increments[cell].fetch_add(made, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .expect("a stress thread failed (see its panic above; seed printed above)");
    }
    for (cell, expected) in cells.iter().zip(increments.iter()) {
        let expected = expected.load(Ordering::Relaxed);
        assert!(
            cell.latch.try_acquire(Exclusive),
            "latch left held: {:?}",
            cell.latch
        );
        assert_eq!(
            cell.first.load(Ordering::Relaxed),
            expected,
            "lost updates (seed {seed})"
        );
        assert_eq!(
            cell.second.load(Ordering::Relaxed),
            expected,
            "lost updates (seed {seed})"
        );
        cell.latch.release(Exclusive);
        assert_eq!(cell.latch.parked_waiters(), 0);
    }
    println!(
        "latch stress ({policy}): {THREADS} threads x {OPERATIONS} operations in {:?}",
        started.elapsed()
    );
}

#[test]
fn stress_fifo() {
    stress(LatchPolicy::Fifo);
}

#[test]
fn stress_adaptive() {
    stress(LatchPolicy::Adaptive);
}

/// Runs `threads` threads that each take `latch` exclusively `rounds` times, holding it for
/// `hold` (so that the others must wait), with every wait attributed to the returned
/// accumulator.
fn contend_exclusively(
    latch: &Arc<Latch>,
    threads: usize,
    rounds: usize,
    hold: Duration,
) -> Arc<WaitAccumulator> {
    let accumulator = Arc::new(WaitAccumulator::new());
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let latch = Arc::clone(latch);
            let accumulator = Arc::clone(&accumulator);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let _attribution = stats::attribute_waits_to(accumulator);
                barrier.wait();
                for _ in 0..rounds {
                    latch.acquire(Exclusive);
                    thread::sleep(hold);
                    latch.release(Exclusive);
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .for_each(|handle| handle.join().unwrap());
    accumulator
}

#[test]
fn fifo_buffer_latch_records_pagelatch_ex_with_signal_wait_time() {
    let before = stats::snapshot();
    let latch = Arc::new(Latch::new(LatchPolicy::Fifo, LatchClass::Buffer));
    let mine = contend_exclusively(&latch, 6, 20, Duration::from_micros(200)).snapshot();
    let ex = mine.wait(WaitType::PageLatchEx);
    assert!(ex.waiting_tasks_count > 0, "{ex:?}");
    assert!(
        ex.signal_wait_time_ns > 0,
        "a hand-off must leave signal wait time: {ex:?}"
    );
    assert!(ex.signal_wait_time_ns <= ex.wait_time_ns, "{ex:?}");
    assert!(
        ex.max_wait_time_ns > 0 && ex.max_wait_time_ns <= ex.wait_time_ns,
        "{ex:?}"
    );
    assert_eq!(mine.wait(WaitType::LatchEx).waiting_tasks_count, 0);
    assert_eq!(mine.wait(WaitType::PageLatchSh).waiting_tasks_count, 0);
    assert_eq!(
        mine.latch(LatchClass::Buffer).waiting_tasks_count,
        ex.waiting_tasks_count
    );
    assert_eq!(mine.latch(LatchClass::Metadata).waiting_tasks_count, 0);
    // The global statistics saw (at least) the same.
    let delta = stats::snapshot().since(&before);
    assert!(delta.wait(WaitType::PageLatchEx).waiting_tasks_count >= ex.waiting_tasks_count);
    assert!(delta.wait(WaitType::PageLatchEx).signal_wait_time_ns >= ex.signal_wait_time_ns);
}

#[test]
fn fifo_metadata_latch_records_latch_ex() {
    let before = stats::snapshot();
    let latch = Arc::new(Latch::new(LatchPolicy::Fifo, LatchClass::Metadata));
    let mine = contend_exclusively(&latch, 4, 20, Duration::from_micros(200)).snapshot();
    let ex = mine.wait(WaitType::LatchEx);
    assert!(ex.waiting_tasks_count > 0, "{ex:?}");
    assert!(ex.signal_wait_time_ns > 0, "{ex:?}");
    assert_eq!(mine.wait(WaitType::PageLatchEx).waiting_tasks_count, 0);
    assert_eq!(
        mine.latch(LatchClass::Metadata).waiting_tasks_count,
        ex.waiting_tasks_count
    );
    assert_eq!(mine.latch(LatchClass::Buffer).waiting_tasks_count, 0);
    let delta = stats::snapshot().since(&before);
    assert!(delta.wait(WaitType::LatchEx).waiting_tasks_count >= ex.waiting_tasks_count);
    assert!(delta.latch(LatchClass::Metadata).waiting_tasks_count >= ex.waiting_tasks_count);
}

#[test]
fn adaptive_latch_records_waits_and_parked_waiters_have_signal_wait_time() {
    let latch = Arc::new(Latch::new(LatchPolicy::Adaptive, LatchClass::Buffer));
    // Holding for 2 ms outlasts any spin, so the waiters park and are woken.
    let mine = contend_exclusively(&latch, 4, 5, Duration::from_millis(2)).snapshot();
    let ex = mine.wait(WaitType::PageLatchEx);
    assert!(ex.waiting_tasks_count > 0, "{ex:?}");
    assert!(ex.wait_time_ns >= 1_000_000, "{ex:?}");
    assert!(ex.signal_wait_time_ns > 0, "{ex:?}");
    assert!(ex.signal_wait_time_ns <= ex.wait_time_ns, "{ex:?}");
    assert_eq!(mine.wait(WaitType::LatchEx).waiting_tasks_count, 0);
}

#[test]
fn uncontended_acquisitions_record_no_wait() {
    for policy in LatchPolicy::ALL {
        let accumulator = Arc::new(WaitAccumulator::new());
        {
            let _attribution = stats::attribute_waits_to(Arc::clone(&accumulator));
            let latch = Latch::new(policy, LatchClass::Buffer);
            for _ in 0..1000 {
                for mode in [Shared, Update, Exclusive] {
                    latch.acquire(mode);
                    latch.release(mode);
                    assert!(latch.try_acquire(mode));
                    latch.release(mode);
                }
                latch.acquire(Shared);
                latch.acquire(Shared);
                latch.acquire(Update);
                latch.release(Shared);
                latch.release(Shared);
                latch.upgrade();
                assert!(latch.is_held_exclusive());
                latch.downgrade();
                assert!(!latch.is_held_exclusive());
                latch.release(Shared);
            }
        }
        let mine = accumulator.snapshot();
        assert!(
            mine.waits().all(|(_, stat)| stat.waiting_tasks_count == 0),
            "{policy}: {mine:?}"
        );
    }
}

/// An upgrade that waits for a reader records one exclusive wait, not an update wait.
#[test]
fn an_upgrade_that_waits_records_the_exclusive_wait_type() {
    for policy in LatchPolicy::ALL {
        let latch = Arc::new(Latch::new(policy, LatchClass::Buffer));
        let accumulator = Arc::new(WaitAccumulator::new());
        let reader_in = Arc::new(AtomicBool::new(false));
        latch.acquire(Shared);
        let upgrader = {
            let latch = Arc::clone(&latch);
            let accumulator = Arc::clone(&accumulator);
            thread::spawn(move || {
                let _attribution = stats::attribute_waits_to(accumulator);
                latch.acquire(Update);
                latch.upgrade();
                assert!(latch.is_held_exclusive());
                latch.release(Exclusive);
            })
        };
        reader_in.store(true, Ordering::SeqCst);
        while latch.parked_waiters() == 0 {
            thread::sleep(Duration::from_micros(100));
        }
        thread::sleep(Duration::from_millis(2));
        assert!(
            !latch.try_acquire(Shared),
            "{policy}: a new reader overtook the upgrader"
        );
        latch.release(Shared);
        upgrader.join().unwrap();
        let mine = accumulator.snapshot();
        assert_eq!(
            mine.wait(WaitType::PageLatchEx).waiting_tasks_count,
            1,
            "{policy}"
        );
        assert!(
            mine.wait(WaitType::PageLatchEx).wait_time_ns >= 2_000_000,
            "{policy}"
        );
        assert_eq!(
            mine.wait(WaitType::PageLatchUp).waiting_tasks_count,
            0,
            "{policy}"
        );
    }
}

#[test]
fn releasing_a_mode_that_is_not_held_panics() {
    for policy in LatchPolicy::ALL {
        for mode in [Shared, Update, Exclusive] {
            let latch = Latch::new(policy, LatchClass::Buffer);
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| latch.release(mode)));
            assert!(
                outcome.is_err(),
                "{policy}: releasing an unheld {mode:?} latch did not panic"
            );
            // The latch is still usable afterwards.
            assert!(latch.try_acquire(Exclusive), "{policy} {mode:?}: {latch:?}");
            latch.release(Exclusive);
        }
        let latch = Latch::new(policy, LatchClass::Buffer);
        latch.acquire(Shared);
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| latch.upgrade())).is_err()
        );
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| latch.downgrade())).is_err()
        );
        latch.release(Shared);
    }
}

#[test]
fn the_latch_is_small() {
    let size = std::mem::size_of::<Latch>();
    println!("size_of::<Latch>() = {size}");
    assert!(size <= 64, "a latch sits in every page frame: {size} bytes");
}
