//! Byte encodings of typed values: memcomparable keys and compact rows.
//!
//! The clustered index stores each row as `key || row`: the key columns in the key encoding
//! (so that the B+tree can compare keys with `memcmp`), then the other columns in the row
//! encoding. Both encoders take values already converted to the column types with
//! [`DataType::coerce`]; they check types and lengths and return a [`ValueError`] (kind
//! `Mismatch`, `Overflow` or `Truncation`) instead of encoding a value that does not fit. On
//! error nothing is left appended to `out`. Decoders never panic: bytes that are not a valid
//! encoding give a `ValueError` of kind `Corrupt`.
//!
//! # Key encoding
//!
//! For values of the column types, `memcmp` of two encodings orders them as SQL Server does
//! with a binary collation, `NULL` first. A composite key is the concatenation of its
//! columns' encodings; every column's encoding is prefix-free (no encoding is a proper prefix
//! of another of the same type), so composite keys compare column by column, and a prefix of
//! the columns is a prefix of the bytes (range scans on leading columns work).
//!
//! Each column is one marker byte, `0x00` for `NULL` (nothing follows) or `0x01` for a value,
//! followed by:
//!
//! | type | bytes |
//! | --- | --- |
//! | `tinyint` | 1: the value |
//! | `smallint`, `int`, `bigint` | 2, 4, 8: big-endian two's complement with the sign bit flipped |
//! | `bit` | 1: `0x00` or `0x01` |
//! | `money` | 8: the `i64` in 1/10000 units, big-endian, sign bit flipped |
//! | `decimal(p,s)` | the mantissa at the column's scale `s`, big-endian two's complement with the sign bit flipped, in 1 (p ≤ 2), 2 (p ≤ 4), 4 (p ≤ 9), 8 (p ≤ 18) or 16 bytes |
//! | `date` | 3: days since 0001-01-01, big-endian |
//! | `datetime2(p)` | 8: date as above (3), then 100-ns ticks since midnight, big-endian (5) |
//! | `uniqueidentifier` | 16: the GUID's bytes in SQL Server's comparison order (see [`Uuid::sql_order_bytes`]): text-order bytes `10..16, 8, 9, 7, 6, 5, 4, 3, 2, 1, 0` |
//! | `char`, `varchar`, `nchar`, `nvarchar` | the UTF-8 bytes, trailing spaces removed, in the *padded-run* form below with pad byte `0x20` |
//! | `varbinary` | the bytes, trailing `0x00` removed, in the padded-run form with pad byte `0x00` |
//!
//! SQL Server compares character strings as if the shorter were padded with spaces (`'a' =
//! 'a  '`, and `'a' > 'a\t'` because the pad space sorts above the tab) and binary strings as
//! if padded with `0x00` (`0x01 = 0x0100`). The padded-run form makes `memcmp` do the same.
//! With `P` the pad byte, after removing trailing `P`s:
//!
//! * every byte other than `P` is written as it is;
//! * a run of `k ≥ 1` `P`s (always followed by some byte `c ≠ P`, since trailing ones are
//!   gone) is written as `P 0x01 k` when `c < P`, or `P 0x03 (0xFFFF - k)` when `c > P`, `k`
//!   as a big-endian `u16`;
//! * the end of the string is written `P 0x02`.
//!
//! The end marker stands for the infinite padding: it sorts above runs followed by a smaller
//! byte and below runs followed by a larger one, and, like a run, above literal bytes smaller
//! than `P` and below larger ones. Among runs before bytes below `P`, the longer run is
//! larger; before bytes above `P`, the longer run is smaller. Hence the string compares
//! exactly as its infinitely padded form does. The form needs no escaping of `0x00` in text.
//! Text compares by UTF-8 bytes, which is Unicode code point order: lastpage's only collation
//! is binary, like `Latin1_General_BIN2` (for `nvarchar` text beyond U+FFFF, BIN2 would
//! compare UTF-16 code units instead; lastpage compares code points).
//!
//! Trailing spaces (of text) and trailing zero bytes (of binary) are not part of a key, as
//! SQL Server treats them as insignificant: [`decode_key`] returns `varchar`, `nvarchar` and
//! `varbinary` values without them, and pads `char(n)`/`nchar(n)` back to `n`. A caller that
//! must return the exact stored value of such a key column keeps a copy of it in the row.
//!
//! # Row encoding
//!
//! ```text
//! +-------------+------------------------+--------------------------+-----------------+
//! | null bitmap | fixed-size columns     | end offsets (u16 LE)     | variable data   |
//! | ceil(n/8) B | in column order        | one per variable column  | in column order |
//! +-------------+------------------------+--------------------------+-----------------+
//! ```
//!
//! * Null bitmap: bit `i % 8` of byte `i / 8` is set when column `i` is `NULL`; unused bits
//!   are zero.
//! * Fixed-size columns ([`DataType::fixed_size`]) take their full size even when `NULL`
//!   (then zeros), so any fixed column sits at an offset known from the types alone:
//!   `tinyint`, `bit` 1 byte; `smallint` 2, `int` 4, `bigint` 8 and `money` 8, little-endian;
//!   `decimal(p,s)` the mantissa at scale `s`, little-endian two's complement in 1/2/4/8/16
//!   bytes as in the key; `char(n)` exactly `n` bytes of UTF-8 padded with spaces; `nchar(n)`
//!   exactly `2n` bytes of UTF-16LE padded with spaces; `date` days since 0001-01-01 in 3
//!   bytes little-endian; `datetime2` the date (3 bytes) then the ticks (5 bytes), little-endian;
//!   `uniqueidentifier` 16 bytes in text order.
//! * End offsets: for each variable-size column (`varchar`: UTF-8; `nvarchar`: UTF-16LE;
//!   `varbinary`: the bytes), the offset from the start of the row just past its data. Column
//!   `j`'s data starts at the previous end offset (the first at the start of the variable
//!   data); a `NULL` has no data. The last end offset is the row's length.
//!
//! A row of one `char(8000)` takes 1 + 8000 bytes, as in SQL Server. The row must stay below
//! 64 KiB (the offsets are `u16`); the page limit (8060 bytes with the key) is the caller's.
//!
//! [`DataType::coerce`]: crate::types::DataType::coerce
//! [`DataType::fixed_size`]: crate::types::DataType::fixed_size
//! [`ValueError`]: crate::types::ValueError
//! [`Uuid::sql_order_bytes`]: crate::types::Uuid::sql_order_bytes

mod key;
mod row;

pub use key::{
    decode_key, decode_key_column, encode_key, encode_key_value, key_prefix_len,
    push_lowest_value_start,
};
pub use row::{decode_row, decode_row_column, encode_row};

use crate::types::{DataType, Decimal, Value, ValueError, utf16_len};

/// The error for a value whose type does not match its column's.
fn mismatch(ty: &DataType, value: &Value) -> ValueError {
    ValueError::mismatch(format!(
        "A {} value cannot be encoded as {} without conversion (coerce it to the column type first).",
        value.data_type_name(),
        ty.name()
    ))
}

fn wrong_count(types: usize, values: usize) -> ValueError {
    ValueError::mismatch(format!("{values} values were given for {types} columns."))
}

/// An integer value of any integer type, range-checked for `ty`.
fn int_in(ty: &DataType, value: &Value, min: i64, max: i64) -> Result<i64, ValueError> {
    let v = match value {
        Value::TinyInt(v) => i64::from(*v),
        Value::SmallInt(v) => i64::from(*v),
        Value::Int(v) => i64::from(*v),
        Value::BigInt(v) => *v,
        other => return Err(mismatch(ty, other)),
    };
    if v < min || v > max {
        return Err(ValueError::overflow(format!(
            "Arithmetic overflow error converting expression to data type {}.",
            ty.name()
        )));
    }
    Ok(v)
}

/// The mantissa of a `decimal(precision, scale)` value at the column's scale (integers are
/// accepted too; other scales only if rescaling is exact).
fn decimal_mantissa(
    ty: &DataType,
    value: &Value,
    precision: u8,
    scale: u8,
) -> Result<i128, ValueError> {
    let d = match value {
        Value::Decimal(d) => *d,
        Value::TinyInt(_) | Value::SmallInt(_) | Value::Int(_) | Value::BigInt(_) => {
            Decimal::from(value.as_i64().unwrap_or(0))
        }
        other => return Err(mismatch(ty, other)),
    };
    let d = d.rescale_exact(scale).ok_or_else(|| {
        ValueError::mismatch(format!(
            "The decimal value {d} does not have the scale of {} (coerce it to the column type first).",
            ty.name()
        ))
    })?;
    if !d.fits_precision(precision) {
        return Err(ValueError::overflow(format!(
            "Arithmetic overflow error converting numeric to data type {}.",
            ty.name()
        )));
    }
    Ok(d.mantissa())
}

/// The text of a value for a character column of at most `n` bytes (`char`, `varchar`) or
/// `n` UTF-16 code units (`nchar`, `nvarchar`).
fn text_in<'v>(ty: &DataType, value: &'v Value) -> Result<&'v str, ValueError> {
    let Value::String(s) = value else {
        return Err(mismatch(ty, value));
    };
    match *ty {
        DataType::Char(n) | DataType::VarChar(n) if s.len() > usize::from(n) => {
            return Err(ValueError::truncation(s.len(), usize::from(n), "bytes"));
        }
        // A string never has more UTF-16 code units than UTF-8 bytes.
        DataType::NChar(n) | DataType::NVarChar(n) if s.len() > usize::from(n) => {
            let units = utf16_len(s);
            if units > usize::from(n) {
                return Err(ValueError::truncation(units, usize::from(n), "characters"));
            }
        }
        _ => {}
    }
    Ok(s)
}

/// The bytes of a value for a `varbinary(n)` column.
fn binary_in<'v>(ty: &DataType, value: &'v Value, n: u16) -> Result<&'v [u8], ValueError> {
    let Value::Binary(b) = value else {
        return Err(mismatch(ty, value));
    };
    if b.len() > usize::from(n) {
        return Err(ValueError::truncation(b.len(), usize::from(n), "bytes"));
    }
    Ok(b)
}

/// Sign-extends a big-endian two's complement number of up to 16 bytes.
fn i128_from_be(bytes: &[u8]) -> i128 {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    bytes.iter().fold(if negative { -1 } else { 0 }, |acc, &b| {
        (acc << 8) | i128::from(b)
    })
}

/// Decodes a decimal mantissa and checks it against the precision.
fn checked_decimal(mantissa: i128, precision: u8, scale: u8) -> Result<Value, ValueError> {
    let d = Decimal::new(mantissa, scale).map_err(|_| corrupt("decimal out of range"))?;
    if !d.fits_precision(precision) {
        return Err(corrupt("decimal has more digits than its precision"));
    }
    Ok(Value::Decimal(d))
}

fn corrupt(what: &str) -> ValueError {
    ValueError::corrupt(format!("Corrupt encoded value: {what}."))
}

/// A bounds-checked cursor over encoded bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ValueError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| corrupt("length overflow"))?;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| corrupt("unexpected end of data"))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ValueError> {
        let slice = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8, ValueError> {
        Ok(self.array::<1>()?[0])
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.pos..).unwrap_or(&[])
    }
}
