//! The row encoding (format in the module docs of [`crate::encoding`]).

use std::borrow::Borrow;

use super::{
    Reader, binary_in, checked_decimal, corrupt, decimal_mantissa, i128_from_be, int_in, mismatch,
    text_in, wrong_count,
};
use crate::types::{
    DataType, Date, DateTime2, TICKS_PER_DAY, Uuid, Value, ValueError, decimal_width,
};

/// Appends the row encoding of `values` (of `types`) to `out`. Values must already have the
/// column types (see [`DataType::coerce`]); `char(n)`/`nchar(n)` values shorter than `n` are
/// padded. On error `out` is left as it was. The values may be owned or borrowed (a completed
/// row of an insert borrows the values its caller keeps).
pub fn encode_row<V: Borrow<Value>>(
    types: &[DataType],
    values: &[V],
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    if types.len() != values.len() {
        return Err(wrong_count(types.len(), values.len()));
    }
    let start = out.len();
    let result = encode_row_inner(types, values, start, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_row_inner<V: Borrow<Value>>(
    types: &[DataType],
    values: &[V],
    start: usize,
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    let bitmap_len = types.len().div_ceil(8);
    // One allocation for the whole row: growing a small buffer step by step costs more than
    // encoding the row (a VARCHAR(100) row would otherwise be reallocated on its way).
    out.reserve(bitmap_len + encoded_size_hint(types, values));
    out.resize(start + bitmap_len, 0);
    let mut var_count = 0usize;
    for (i, (ty, value)) in types.iter().zip(values).enumerate() {
        let value = value.borrow();
        if value.is_null() {
            out[start + i / 8] |= 1 << (i % 8);
        }
        match ty.fixed_size() {
            Some(size) if value.is_null() => out.resize(out.len() + size, 0),
            Some(_) => encode_fixed(ty, value, out)?,
            None => var_count += 1,
        }
    }
    let offsets_at = out.len();
    out.resize(offsets_at + 2 * var_count, 0);
    let var_columns = types
        .iter()
        .zip(values)
        .filter(|(ty, _)| ty.fixed_size().is_none());
    for (j, (ty, value)) in var_columns.enumerate() {
        let value = value.borrow();
        if !value.is_null() {
            encode_var(ty, value, out)?;
        }
        let end = row_len(out.len() - start)?;
        let at = offsets_at + 2 * j;
        out[at..at + 2].copy_from_slice(&end.to_le_bytes());
    }
    row_len(out.len() - start)?;
    Ok(())
}

/// About how many bytes the columns of a row take after the null bitmap: exact for the usual
/// column types, a guess (one byte per character) for `nvarchar`.
fn encoded_size_hint<V: Borrow<Value>>(types: &[DataType], values: &[V]) -> usize {
    types
        .iter()
        .zip(values)
        .map(|(ty, value)| match (ty.fixed_size(), value.borrow()) {
            (Some(size), _) => size,
            (None, Value::String(text)) => 2 + text.len(),
            (None, Value::Binary(bytes)) => 2 + bytes.len(),
            (None, _) => 2,
        })
        .sum()
}

/// A row length as `u16`, or the error for a row of 64 KiB or more.
fn row_len(len: usize) -> Result<u16, ValueError> {
    u16::try_from(len).map_err(|_| {
        ValueError::overflow(format!(
            "The encoded row has {len} bytes or more, above the limit of 65535 bytes."
        ))
    })
}

fn encode_fixed(ty: &DataType, value: &Value, out: &mut Vec<u8>) -> Result<(), ValueError> {
    match *ty {
        DataType::TinyInt => out.push(int_in(ty, value, 0, i64::from(u8::MAX))? as u8),
        DataType::SmallInt => {
            let v = int_in(ty, value, i64::from(i16::MIN), i64::from(i16::MAX))? as i16;
            out.extend_from_slice(&v.to_le_bytes());
        }
        DataType::Int => {
            let v = int_in(ty, value, i64::from(i32::MIN), i64::from(i32::MAX))? as i32;
            out.extend_from_slice(&v.to_le_bytes());
        }
        DataType::BigInt => {
            out.extend_from_slice(&int_in(ty, value, i64::MIN, i64::MAX)?.to_le_bytes());
        }
        DataType::Bit => match value {
            Value::Bit(b) => out.push(u8::from(*b)),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Money => match value {
            Value::Money(m) => out.extend_from_slice(&m.to_le_bytes()),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Decimal { precision, scale } => {
            let m = decimal_mantissa(ty, value, precision, scale)?;
            out.extend_from_slice(&m.to_le_bytes()[..decimal_width(precision)]);
        }
        DataType::Date => match value {
            Value::Date(d) => push_date_le(*d, out),
            other => return Err(mismatch(ty, other)),
        },
        DataType::DateTime2(_) => match value {
            Value::DateTime2(dt) => {
                push_date_le(dt.date(), out);
                out.extend_from_slice(&dt.ticks().to_le_bytes()[..5]);
            }
            other => return Err(mismatch(ty, other)),
        },
        DataType::UniqueIdentifier => match value {
            Value::Uuid(u) => out.extend_from_slice(u.as_bytes()),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Char(n) => {
            let s = text_in(ty, value)?;
            out.extend_from_slice(s.as_bytes());
            out.resize(out.len() + (usize::from(n) - s.len()), b' ');
        }
        DataType::NChar(n) => {
            let s = text_in(ty, value)?;
            let mut units = 0usize;
            for unit in s.encode_utf16() {
                out.extend_from_slice(&unit.to_le_bytes());
                units += 1;
            }
            for _ in units..usize::from(n) {
                out.extend_from_slice(&[b' ', 0]);
            }
        }
        DataType::VarChar(_) | DataType::NVarChar(_) | DataType::VarBinary(_) => {
            return Err(mismatch(ty, value));
        }
    }
    Ok(())
}

fn encode_var(ty: &DataType, value: &Value, out: &mut Vec<u8>) -> Result<(), ValueError> {
    match *ty {
        DataType::VarChar(_) => out.extend_from_slice(text_in(ty, value)?.as_bytes()),
        DataType::NVarChar(_) => {
            for unit in text_in(ty, value)?.encode_utf16() {
                out.extend_from_slice(&unit.to_le_bytes());
            }
        }
        DataType::VarBinary(n) => out.extend_from_slice(binary_in(ty, value, n)?),
        _ => return Err(mismatch(ty, value)),
    }
    Ok(())
}

fn push_date_le(d: Date, out: &mut Vec<u8>) {
    // Days are in 0..=3_652_058 < 2^24.
    out.extend_from_slice(&(d.days() as u32).to_le_bytes()[..3]);
}

/// Decodes a row of `types` that takes all of `bytes`.
pub fn decode_row(types: &[DataType], bytes: &[u8]) -> Result<Vec<Value>, ValueError> {
    let layout = Layout::of(types, bytes)?;
    let mut values = Vec::with_capacity(types.len());
    let mut fixed_at = layout.bitmap_len;
    let mut var_start = layout.data_start;
    let mut var_index = 0usize;
    for (i, ty) in types.iter().enumerate() {
        let null = layout.is_null(i);
        match ty.fixed_size() {
            Some(size) => {
                let field = slice(bytes, fixed_at, fixed_at.saturating_add(size))?;
                fixed_at += size;
                if null {
                    if field.iter().any(|&b| b != 0) {
                        return Err(corrupt("NULL column with data"));
                    }
                    values.push(Value::Null);
                } else {
                    values.push(decode_fixed(ty, field)?);
                }
            }
            None => {
                let end = layout.var_end(var_index)?;
                var_index += 1;
                let field = slice(bytes, var_start, end)?;
                var_start = end;
                if null {
                    if !field.is_empty() {
                        return Err(corrupt("NULL column with data"));
                    }
                    values.push(Value::Null);
                } else {
                    values.push(decode_var(ty, field)?);
                }
            }
        }
    }
    if var_start != bytes.len() {
        return Err(corrupt("row length does not match its columns"));
    }
    Ok(values)
}

/// Decodes column `index` of a row of `types` without decoding the others (checks only
/// what that column needs).
pub fn decode_row_column(
    types: &[DataType],
    bytes: &[u8],
    index: usize,
) -> Result<Value, ValueError> {
    let ty = types.get(index).ok_or_else(|| {
        ValueError::mismatch(format!(
            "Column {index} does not exist: the row has {} columns.",
            types.len()
        ))
    })?;
    let layout = Layout::of(types, bytes)?;
    match ty.fixed_size() {
        Some(size) => {
            if layout.is_null(index) {
                return Ok(Value::Null);
            }
            let before: usize = types[..index].iter().filter_map(DataType::fixed_size).sum();
            let at = layout.bitmap_len + before;
            decode_fixed(ty, slice(bytes, at, at.saturating_add(size))?)
        }
        None => {
            let var_index = types[..index]
                .iter()
                .filter(|t| t.fixed_size().is_none())
                .count();
            let start = match var_index.checked_sub(1) {
                Some(prev) => layout.var_end(prev)?,
                None => layout.data_start,
            };
            let field = slice(bytes, start, layout.var_end(var_index)?)?;
            if layout.is_null(index) {
                return if field.is_empty() {
                    Ok(Value::Null)
                } else {
                    Err(corrupt("NULL column with data"))
                };
            }
            decode_var(ty, field)
        }
    }
}

fn slice(bytes: &[u8], start: usize, end: usize) -> Result<&[u8], ValueError> {
    if start > end {
        return Err(corrupt("variable-size column offsets out of order"));
    }
    bytes
        .get(start..end)
        .ok_or_else(|| corrupt("column data past the end of the row"))
}

/// Where the parts of an encoded row are.
struct Layout<'a> {
    bytes: &'a [u8],
    bitmap_len: usize,
    offsets_at: usize,
    data_start: usize,
}

impl<'a> Layout<'a> {
    fn of(types: &[DataType], bytes: &'a [u8]) -> Result<Self, ValueError> {
        let bitmap_len = types.len().div_ceil(8);
        let fixed: usize = types.iter().filter_map(DataType::fixed_size).sum();
        let var_count = types.iter().filter(|t| t.fixed_size().is_none()).count();
        let offsets_at = bitmap_len + fixed;
        let data_start = offsets_at + 2 * var_count;
        if bytes.len() < data_start {
            return Err(corrupt("row shorter than its fixed-size part"));
        }
        // Bits past the last column must be zero.
        if !types.len().is_multiple_of(8) {
            let last = bytes.get(bitmap_len - 1).copied().unwrap_or(0);
            if last >> (types.len() % 8) != 0 {
                return Err(corrupt("null bitmap has bits past the last column"));
            }
        }
        Ok(Layout {
            bytes,
            bitmap_len,
            offsets_at,
            data_start,
        })
    }

    fn is_null(&self, column: usize) -> bool {
        self.bytes
            .get(column / 8)
            .is_some_and(|b| b & (1 << (column % 8)) != 0)
    }

    /// End offset of variable-size column number `j`.
    fn var_end(&self, j: usize) -> Result<usize, ValueError> {
        let at = self.offsets_at + 2 * j;
        let mut r = Reader::new(self.bytes);
        r.take(at)?;
        let end = usize::from(u16::from_le_bytes(r.array()?));
        if end < self.data_start {
            return Err(corrupt("variable-size column offset inside the fixed part"));
        }
        Ok(end)
    }
}

fn decode_fixed(ty: &DataType, field: &[u8]) -> Result<Value, ValueError> {
    let mut r = Reader::new(field);
    Ok(match *ty {
        DataType::TinyInt => Value::TinyInt(r.byte()?),
        DataType::SmallInt => Value::SmallInt(i16::from_le_bytes(r.array()?)),
        DataType::Int => Value::Int(i32::from_le_bytes(r.array()?)),
        DataType::BigInt => Value::BigInt(i64::from_le_bytes(r.array()?)),
        DataType::Bit => match r.byte()? {
            0 => Value::Bit(false),
            1 => Value::Bit(true),
            _ => return Err(corrupt("bit is neither 0 nor 1")),
        },
        DataType::Money => Value::Money(i64::from_le_bytes(r.array()?)),
        DataType::Decimal { precision, scale } => {
            let mut be = [0u8; 16];
            let width = decimal_width(precision);
            let part = &mut be[..width];
            part.copy_from_slice(r.take(width)?);
            part.reverse();
            checked_decimal(i128_from_be(part), precision, scale)?
        }
        DataType::Date => Value::Date(read_date_le(&mut r)?),
        DataType::DateTime2(_) => {
            let date = read_date_le(&mut r)?;
            let mut le = [0u8; 8];
            le[..5].copy_from_slice(r.take(5)?);
            let ticks = u64::from_le_bytes(le);
            if ticks >= TICKS_PER_DAY {
                return Err(corrupt("datetime2 time of day out of range"));
            }
            Value::DateTime2(DateTime2::new(date, ticks).map_err(|_| corrupt("datetime2"))?)
        }
        DataType::UniqueIdentifier => Value::Uuid(Uuid::from_bytes(r.array()?)),
        DataType::Char(_) => Value::String(utf8(field)?),
        DataType::NChar(_) => Value::String(utf16(field)?),
        DataType::VarChar(_) | DataType::NVarChar(_) | DataType::VarBinary(_) => {
            return Err(corrupt("variable-size type in the fixed part"));
        }
    })
}

fn decode_var(ty: &DataType, field: &[u8]) -> Result<Value, ValueError> {
    let too_long = || corrupt("value longer than its type allows");
    match *ty {
        DataType::VarChar(n) => {
            if field.len() > usize::from(n) {
                return Err(too_long());
            }
            Ok(Value::String(utf8(field)?))
        }
        DataType::NVarChar(n) => {
            if field.len() > 2 * usize::from(n) {
                return Err(too_long());
            }
            Ok(Value::String(utf16(field)?))
        }
        DataType::VarBinary(n) => {
            if field.len() > usize::from(n) {
                return Err(too_long());
            }
            Ok(Value::Binary(field.to_vec()))
        }
        _ => Err(corrupt("fixed-size type in the variable part")),
    }
}

fn utf8(field: &[u8]) -> Result<String, ValueError> {
    String::from_utf8(field.to_vec()).map_err(|_| corrupt("text is not UTF-8"))
}

fn utf16(field: &[u8]) -> Result<String, ValueError> {
    if !field.len().is_multiple_of(2) {
        return Err(corrupt("UTF-16 text with an odd number of bytes"));
    }
    let units = field
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]));
    let mut s = String::with_capacity(field.len());
    for c in char::decode_utf16(units) {
        s.push(c.map_err(|_| corrupt("text is not valid UTF-16"))?);
    }
    Ok(s)
}

fn read_date_le(r: &mut Reader<'_>) -> Result<Date, ValueError> {
    let mut le = [0u8; 4];
    le[..3].copy_from_slice(r.take(3)?);
    Date::from_days(u32::from_le_bytes(le) as i32).map_err(|_| corrupt("date out of range"))
}
