//! Per-thread scratch buffers: a hot path that needs a vector only for the length of one call
//! takes its thread's instead of allocating and freeing one per call (the log writer assembles
//! every record in one; the engine completes and encodes every single-row insert in two).

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with the buffer `scratch` keeps for this thread (empty when `f` gets it), then
/// keeps it, emptied, for the next call unless it grew past `kept_bytes` (a buffer a rare large
/// call grew is freed rather than held for the thread's lifetime). A nested call finds the
/// buffer taken and starts a new one.
#[inline]
pub fn with_scratch<T, R>(
    scratch: &'static LocalKey<Cell<Vec<T>>>,
    kept_bytes: usize,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    let mut buffer = scratch.take();
    let result = f(&mut buffer);
    buffer.clear();
    if buffer.capacity() * std::mem::size_of::<T>() <= kept_bytes {
        scratch.set(buffer);
    }
    result
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    thread_local! {
        static BUFFER: Cell<Vec<u64>> = const { Cell::new(Vec::new()) };
    }

    #[test]
    fn a_buffer_is_kept_emptied_unless_it_grew_too_large() {
        let kept = 64 * size_of::<u64>();
        with_scratch(&BUFFER, kept, |buffer| buffer.extend(0..10));
        let capacity = with_scratch(&BUFFER, kept, |buffer| {
            assert!(buffer.is_empty(), "a kept buffer comes back emptied");
            // A nested call gets a buffer of its own while this one is taken.
            with_scratch(&BUFFER, kept, |inner| assert_eq!(inner.capacity(), 0));
            buffer.capacity()
        });
        assert!(capacity >= 10, "the first call's buffer was kept");
        with_scratch(&BUFFER, kept, |buffer| buffer.extend(0..1000));
        with_scratch(&BUFFER, kept, |buffer| {
            assert_eq!(buffer.capacity(), 0, "a buffer past the limit was freed");
        });
    }
}
