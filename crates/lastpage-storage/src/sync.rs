//! The one place the storage layer takes its synchronization primitives from.
//!
//! Every latch and lock-free structure imports atomics, mutexes and thread parking from here, so
//! that `RUSTFLAGS="--cfg loom"` swaps them all for loom's model-checked versions at once. Code
//! outside this module must not name `std::sync::atomic` or `std::thread::park` directly.

#[cfg(loom)]
pub use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::thread::{self, Thread};

#[cfg(not(loom))]
pub use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::thread::{self, Thread};

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
