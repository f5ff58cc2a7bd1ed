//! A micro-benchmark of the last-page insert pattern on one latch: every thread takes the same
//! latch exclusively, does a little work inside (the insert into the last page), releases it and
//! does more work outside (the rest of the statement). It compares the two flavours' throughput
//! and recorded waits. Ignored by default; run it in release mode:
//!
//! ```text
//! CARGO_TARGET_DIR=target-latch cargo test -p lastpage-storage --release \
//!     --test latch_throughput -- --ignored --nocapture
//! ```
//!
//! `LATCH_BENCH_THREADS` (default `2,64,300`) and `LATCH_BENCH_MS` (default 1000) adjust it.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use lastpage_storage::latch::{Latch, LatchClass, LatchMode, LatchPolicy};
use lastpage_storage::stats::{self, WaitAccumulator, WaitType};

/// Busy work standing in for real work: `rounds` steps of a linear congruential generator.
fn work(seed: u64, rounds: u32) -> u64 {
    let mut x = seed;
    for _ in 0..rounds {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
    }
    x
}

struct Outcome {
    operations: u64,
    /// Fewest and most operations one thread completed: how evenly the latch shares progress.
    least: u64,
    most: u64,
    elapsed: Duration,
    waits: u64,
    wait_ns: u64,
    signal_ns: u64,
    max_wait_ns: u64,
}

fn run(
    policy: LatchPolicy,
    threads: usize,
    duration: Duration,
    inside: u32,
    outside: u32,
) -> Outcome {
    let latch = Arc::new(Latch::new(policy, LatchClass::Buffer));
    let page = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let per_thread: Arc<Vec<AtomicU64>> =
        Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let accumulator = Arc::new(WaitAccumulator::new());
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|index| {
            let (latch, page, stop) = (Arc::clone(&latch), Arc::clone(&page), Arc::clone(&stop));
            let (per_thread, accumulator) = (Arc::clone(&per_thread), Arc::clone(&accumulator));
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let _attribution = stats::attribute_waits_to(accumulator);
                let mut seed = index as u64;
                let mut done = 0;
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    latch.acquire(LatchMode::Exclusive);
                    // The insert: read-modify-write of the page, not atomic on purpose.
                    let value = page.load(Ordering::Relaxed);
                    page.store(work(value, inside), Ordering::Relaxed);
                    latch.release(LatchMode::Exclusive);
                    seed = work(seed, outside);
                    done += 1;
                }
                per_thread[index].store(done, Ordering::Relaxed);
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .for_each(|handle| handle.join().unwrap());
    let elapsed = started.elapsed();
    let ex = accumulator.snapshot().wait(WaitType::PageLatchEx);
    let counts: Vec<u64> = per_thread
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect();
    Outcome {
        operations: counts.iter().sum(),
        least: counts.iter().copied().min().unwrap_or(0),
        most: counts.iter().copied().max().unwrap_or(0),
        elapsed,
        waits: ex.waiting_tasks_count,
        wait_ns: ex.wait_time_ns,
        signal_ns: ex.signal_wait_time_ns,
        max_wait_ns: ex.max_wait_time_ns,
    }
}

#[test]
#[ignore = "benchmark: run in release mode with --ignored --nocapture"]
fn last_page_insert_throughput() {
    let threads: Vec<usize> = std::env::var("LATCH_BENCH_THREADS")
        .unwrap_or_else(|_| "2,64,300".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let millis = std::env::var("LATCH_BENCH_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(1000);
    let duration = Duration::from_millis(millis);
    println!(
        "{:>8} {:>7} {:>10} {:>9} {:>11} {:>9} {:>8} {:>17}",
        "policy",
        "threads",
        "ops/s",
        "waits/op",
        "avg wait us",
        "signal %",
        "max ms",
        "ops/thread min-max"
    );
    for &count in &threads {
        for policy in LatchPolicy::ALL {
            let outcome = run(policy, count, duration, 100, 400);
            let ops = outcome.operations.max(1);
            println!(
                "{:>8} {:>7} {:>10.0} {:>9.3} {:>11.1} {:>9.1} {:>8.2} {:>17}",
                policy.name(),
                count,
                outcome.operations as f64 / outcome.elapsed.as_secs_f64(),
                outcome.waits as f64 / ops as f64,
                outcome.wait_ns as f64 / outcome.waits.max(1) as f64 / 1e3,
                100.0 * outcome.signal_ns as f64 / outcome.wait_ns.max(1) as f64,
                outcome.max_wait_ns as f64 / 1e6,
                format!("{}-{}", outcome.least, outcome.most),
            );
        }
    }
}
