//! The machine's own limit for sessions that block at every commit, measured in the same run
//! as the cells it bounds (as [`super::disk`] measures the disk): how many times per second
//! `threads` threads can each park and be woken again when nothing else happens at all.
//!
//! A durable single-row autocommit insert from a session that has its own thread ends with
//! that thread parked until the commit is durable and woken by whoever made it so. Group
//! commit shares the flush, not the parking: every commit still costs one park and one
//! wake-up, and on a virtual machine a wake-up that lands on another CPU is an
//! inter-processor interrupt, a VM exit. The probe runs exactly that cycle with no insert, no
//! log and no I/O: each thread in turn either leads (finds nobody leading, yields once so the
//! others can queue, the way the log writer's leader does before a flush, then takes the
//! queue and wakes it) or queues itself and parks until a leader wakes it. Its round trips
//! per second are a ceiling for any engine that parks a thread per commit at this thread
//! count on this machine; `bench durable` prints them beside the autocommit cells. lastpage's
//! own committers park only while few wait at once: with more waiting than
//! `WalConfig::yield_wait_committers`, they yield the processor until their flush is done
//! instead, which this ceiling does not bound (see `wal/writer.rs`).
//!
//! Why the protocol cannot lose a wake-up: a thread queues itself only while a leader is
//! marked, under the mutex, and a leader takes the queue and clears its mark in one critical
//! section; whoever comes after finds no leader and leads. A waiter's flag is set before its
//! `unpark`, and it parks only while the flag is clear, so an early or stale `unpark` only
//! makes it look again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::insert::{BenchError, round3};

/// How long the threads run before the count starts, so that every one is started and queued.
const WARMUP: Duration = Duration::from_millis(200);

/// How much longer than asked the probe waits for its first round trip.
const WAKEUP_PATIENCE: Duration = Duration::from_secs(10);

/// How often the stopping thread drains the queue while it waits for the threads to finish.
const DRAIN_INTERVAL: Duration = Duration::from_millis(1);

/// What the probe measured.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupReference {
    /// Threads that took part.
    pub threads: u32,
    /// Park-and-wake round trips per second, all threads together (a leader's turn counts as
    /// one too: it stands for the commit whose thread leads the flush).
    pub round_trips_per_sec: f64,
    /// Round trips per leader turn: the group size.
    pub round_trips_per_group: f64,
}

struct Waiter {
    thread: Thread,
    signalled: AtomicBool,
}

impl Waiter {
    fn signal(&self) {
        self.signalled.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

#[derive(Default)]
struct Group {
    leading: bool,
    queue: Vec<Arc<Waiter>>,
}

#[derive(Default)]
struct Shared {
    group: Mutex<Group>,
    stop: AtomicBool,
    round_trips: AtomicU64,
    groups: AtomicU64,
}

impl Shared {
    fn group(&self) -> std::sync::MutexGuard<'_, Group> {
        // The critical sections cannot panic; a poisoned mutex still holds a consistent group.
        self.group.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One thread's loop until `stop` is set.
    fn run(&self) {
        let me = Arc::new(Waiter {
            thread: thread::current(),
            signalled: AtomicBool::new(false),
        });
        while !self.stop.load(Ordering::Relaxed) {
            let mut group = self.group();
            if group.leading {
                me.signalled.store(false, Ordering::Relaxed);
                group.queue.push(Arc::clone(&me));
                drop(group);
                while !me.signalled.load(Ordering::Acquire) {
                    thread::park();
                }
            } else {
                group.leading = true;
                drop(group);
                thread::yield_now();
                let woken = {
                    let mut group = self.group();
                    group.leading = false;
                    std::mem::take(&mut group.queue)
                };
                self.groups.fetch_add(1, Ordering::Relaxed);
                woken.iter().for_each(|waiter| waiter.signal());
            }
            self.round_trips.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs the probe with `threads` threads for about `seconds` (after a short warm-up) and
/// stops them all before it returns.
pub fn measure(threads: u32, seconds: f64) -> Result<WakeupReference, BenchError> {
    if threads == 0 || !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(BenchError::InvalidConfig(format!(
            "the wake-up probe needs at least one thread and 0-3600 s, not {threads} and {seconds}"
        )));
    }
    let shared = Arc::new(Shared::default());
    let mut handles = Vec::with_capacity(threads as usize);
    let mut spawn_error = None;
    for index in 0..threads {
        let shared = Arc::clone(&shared);
        match thread::Builder::new()
            .name(format!("wakeup-{index}"))
            .spawn(move || shared.run())
        {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                spawn_error = Some(error);
                break;
            }
        }
    }
    let measured = spawn_error.is_none().then(|| {
        thread::sleep(WARMUP);
        let (round_trips, groups) = counts(&shared);
        let started = Instant::now();
        thread::sleep(Duration::from_secs_f64(seconds));
        // A machine too busy to run the threads at all in a short window would report 0:
        // the window lasts until they have made one round trip (at most WAKEUP_PATIENCE more).
        let patience = Instant::now() + WAKEUP_PATIENCE;
        while counts(&shared).0 == round_trips && Instant::now() < patience {
            thread::sleep(DRAIN_INTERVAL);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let (round_trips_after, groups_after) = counts(&shared);
        (
            round_trips_after - round_trips,
            groups_after - groups,
            elapsed,
        )
    });
    // Stop: a thread that has not seen `stop` yet may still queue itself, so the queue is
    // drained until every thread has finished.
    shared.stop.store(true, Ordering::Relaxed);
    while !handles.iter().all(|handle| handle.is_finished()) {
        std::mem::take(&mut shared.group().queue)
            .iter()
            .for_each(|waiter| waiter.signal());
        thread::sleep(DRAIN_INTERVAL);
    }
    for handle in handles {
        handle
            .join()
            .map_err(|_| BenchError::Failed("a wake-up probe thread panicked".into()))?;
    }
    if let Some(error) = spawn_error {
        return Err(BenchError::Failed(format!(
            "cannot start the wake-up probe's threads: {error}"
        )));
    }
    let (round_trips, groups, elapsed) = measured.expect("measured unless a spawn failed");
    Ok(WakeupReference {
        threads,
        round_trips_per_sec: (round_trips as f64 / elapsed).round(),
        round_trips_per_group: round3(round_trips as f64 / groups.max(1) as f64),
    })
}

fn counts(shared: &Shared) -> (u64, u64) {
    (
        shared.round_trips.load(Ordering::Relaxed),
        shared.groups.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Many short rounds with few threads: a lost wake-up would leave a thread parked for good,
    /// and the probe would never return (the watchdog turns that into a failure).
    #[test]
    fn every_parked_thread_is_woken_and_every_thread_stops() {
        for threads in [1, 2, 8] {
            let (sender, receiver) = mpsc::channel();
            thread::spawn(move || {
                let _ = sender.send(measure(threads, 0.05));
            });
            let reference = receiver
                .recv_timeout(Duration::from_secs(60))
                .expect("the probe hung: a thread stayed parked")
                .expect("the probe ran");
            assert_eq!(reference.threads, threads);
            assert!(reference.round_trips_per_sec > 0.0, "{reference:?}");
            assert!(reference.round_trips_per_group >= 1.0, "{reference:?}");
            if threads == 1 {
                // A lone thread always finds nobody leading: every turn is its own group.
                assert_eq!(reference.round_trips_per_group, 1.0, "{reference:?}");
            }
        }
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(matches!(measure(0, 1.0), Err(BenchError::InvalidConfig(_))));
        assert!(matches!(measure(2, 0.0), Err(BenchError::InvalidConfig(_))));
        assert!(matches!(
            measure(2, f64::NAN),
            Err(BenchError::InvalidConfig(_))
        ));
    }
}
