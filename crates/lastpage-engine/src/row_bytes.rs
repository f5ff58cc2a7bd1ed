//! The encoded keys and values a transaction keeps for its changes (to log them and to undo
//! them): a vector of their own, or a range of one buffer a whole batch's rows share.
//!
//! A multi-row insert encodes every row into one buffer, so that its rows cost no allocation
//! each: two per row (key and value) and their frees at commit were a sixth of a durable
//! batch's CPU time. Each row's change then holds its ranges of the shared buffer.

use std::borrow::Cow;
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Encoded bytes of one key or value. Compares, hashes and prints as its bytes.
#[derive(Clone)]
pub(crate) enum RowBytes {
    /// Bytes of their own.
    Owned(Vec<u8>),
    /// `range` of a buffer shared with other rows of the same statement.
    Shared {
        buffer: Arc<Vec<u8>>,
        range: Range<usize>,
    },
}

impl RowBytes {
    /// `range` of `buffer`, sharing it. Panics if the range is out of the buffer's bounds,
    /// which would be a bug in the caller that encoded the rows.
    pub(crate) fn shared(buffer: &Arc<Vec<u8>>, range: Range<usize>) -> RowBytes {
        assert!(
            range.start <= range.end && range.end <= buffer.len(),
            "row bytes {range:?} outside a buffer of {}",
            buffer.len()
        );
        RowBytes::Shared {
            buffer: Arc::clone(buffer),
            range,
        }
    }

    /// `part` as a range of `buffer` if it is a slice of it (as the pieces of a record decoded
    /// from `buffer` are), else as bytes of its own.
    pub(crate) fn within(buffer: &Arc<Vec<u8>>, part: Cow<'_, [u8]>) -> RowBytes {
        match part {
            Cow::Borrowed(slice) => {
                // Addresses compared as numbers: a slice elsewhere (an empty one may point
                // anywhere) gives an offset past the buffer, and is copied.
                let start = (slice.as_ptr() as usize).wrapping_sub(buffer.as_ptr() as usize);
                if start <= buffer.len() && slice.len() <= buffer.len() - start {
                    RowBytes::shared(buffer, start..start + slice.len())
                } else {
                    RowBytes::Owned(slice.to_vec())
                }
            }
            Cow::Owned(bytes) => RowBytes::Owned(bytes),
        }
    }
}

impl Deref for RowBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            RowBytes::Owned(bytes) => bytes,
            RowBytes::Shared { buffer, range } => &buffer[range.clone()],
        }
    }
}

impl From<Vec<u8>> for RowBytes {
    fn from(bytes: Vec<u8>) -> RowBytes {
        RowBytes::Owned(bytes)
    }
}

impl PartialEq for RowBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for RowBytes {}

impl fmt::Debug for RowBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_the_buffer_become_ranges_of_it_and_others_copies() {
        let buffer = Arc::new(b"keyvalue".to_vec());
        let inside = RowBytes::within(&buffer, Cow::Borrowed(&buffer[3..8]));
        assert!(matches!(&inside, RowBytes::Shared { range, .. } if *range == (3..8)));
        assert_eq!(&*inside, b"value");
        let whole = RowBytes::within(&buffer, Cow::Borrowed(&buffer[..]));
        assert!(matches!(&whole, RowBytes::Shared { range, .. } if *range == (0..8)));
        let at_end = RowBytes::within(&buffer, Cow::Borrowed(&buffer[8..]));
        assert_eq!(&*at_end, b"");
        let other = b"value".to_vec();
        let outside = RowBytes::within(&buffer, Cow::Borrowed(&other[..]));
        assert!(matches!(&outside, RowBytes::Owned(bytes) if bytes == b"value"));
        let owned = RowBytes::within(&buffer, Cow::Owned(b"own".to_vec()));
        assert!(matches!(&owned, RowBytes::Owned(bytes) if bytes == b"own"));
    }

    #[test]
    fn shared_ranges_read_as_their_bytes_and_compare_with_owned_ones() {
        let buffer = Arc::new(b"keyvalue".to_vec());
        let key = RowBytes::shared(&buffer, 0..3);
        let value = RowBytes::shared(&buffer, 3..8);
        assert_eq!(&*key, b"key");
        assert_eq!(&*value, b"value");
        assert_eq!(key, RowBytes::from(b"key".to_vec()));
        assert_ne!(key, value);
        assert_eq!(format!("{key:?}"), format!("{:?}", b"key"));
        drop(buffer);
        // The rows keep the buffer alive.
        assert_eq!(&*value.clone(), b"value");
    }

    #[test]
    #[should_panic(expected = "outside a buffer")]
    fn a_range_past_the_buffer_is_refused() {
        let buffer = Arc::new(vec![0; 4]);
        let _ = RowBytes::shared(&buffer, 2..5);
    }
}
