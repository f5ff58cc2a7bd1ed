//! The one place the storage layer takes its synchronization primitives from.
//!
//! Every latch and lock-free structure imports atomics, mutexes and thread parking from here, so
//! that `RUSTFLAGS="--cfg loom"` swaps them all for loom's model-checked versions at once. Code
//! outside this module must not name `std::sync::atomic` or `std::thread::park` directly.
//! The row lock manager (in the engine crate) takes its mutexes and condition variables from
//! here for the same reason.

#[cfg(loom)]
pub use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(loom)]
pub use loom::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(loom)]
pub use loom::thread::{self, Thread};

#[cfg(not(loom))]
pub use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(loom))]
pub use std::thread::{self, Thread};

/// Runs `body` under loom's model checker, exploring every interleaving with at most
/// `preemptions` preemptions per execution unless `LOOM_MAX_PREEMPTIONS` sets the bound: the
/// one way every model check of both crates starts (bugs in these protocols need very few
/// preemptions to show, and unbounded models take minutes to hours).
#[cfg(loom)]
pub fn model_check(preemptions: usize, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    builder.check(body);
}

/// Tells the processor (or, under loom, the model checker) that this thread is spinning.
///
/// Under loom a spin loop must yield, or the checker would explore an unbounded number of
/// iterations of it.
#[inline]
pub fn spin_loop_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Gives up the processor to another runnable thread.
#[inline]
pub fn yield_now() {
    thread::yield_now();
}

/// Locks a mutex, ignoring poisoning: the data our mutexes guard stays consistent even if a
/// holder panicked, because every critical section is a handful of queue operations.
#[inline]
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        mutex.lock().unwrap()
    }
    #[cfg(not(loom))]
    {
        mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Locks a reader-writer lock for reading, ignoring poisoning as [`lock`] does.
#[inline]
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    #[cfg(loom)]
    {
        lock.read().unwrap()
    }
    #[cfg(not(loom))]
    {
        lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Locks a reader-writer lock for writing, ignoring poisoning as [`lock`] does.
#[inline]
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    #[cfg(loom)]
    {
        lock.write().unwrap()
    }
    #[cfg(not(loom))]
    {
        lock.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Waits on `condvar`, releasing `guard` meanwhile, ignoring poisoning as [`lock`] does. The
/// caller must re-check its condition afterwards: the wait may return spuriously.
#[inline]
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        condvar.wait(guard).unwrap()
    }
    #[cfg(not(loom))]
    {
        condvar
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Waits on `condvar` for at most `timeout`, releasing `guard` meanwhile, ignoring poisoning.
/// The caller must re-check its condition and its deadline afterwards: the wait may return
/// spuriously or early.
///
/// Under loom the timeout is ignored (loom does not model time), so a model that relies on a
/// timeout to make progress is reported as a deadlock; models must use waits that are
/// signalled.
#[inline]
pub fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        condvar.wait_timeout(guard, timeout).unwrap().0
    }
    #[cfg(not(loom))]
    {
        condvar
            .wait_timeout(guard, timeout)
            .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard)
    }
}
