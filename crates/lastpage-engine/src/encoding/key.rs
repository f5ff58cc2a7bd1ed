//! The memcomparable key encoding (format in the module docs of [`crate::encoding`]).

use super::{
    Reader, binary_in, checked_decimal, corrupt, decimal_mantissa, i128_from_be, int_in, mismatch,
    text_in, wrong_count,
};
use crate::types::{
    DataType, Date, DateTime2, TICKS_PER_DAY, Uuid, Value, ValueError, decimal_width, utf16_len,
};

const NULL_MARKER: u8 = 0x00;
const VALUE_MARKER: u8 = 0x01;

/// Appends what every encoded non-NULL value of a key column starts with: a key prefix that
/// continues with it sorts after every key with NULL in that column and at or before every
/// key with a value there.
pub fn push_lowest_value_start(out: &mut Vec<u8>) {
    out.push(VALUE_MARKER);
}

/// Pad-run tags of the padded-run form.
const RUN_BEFORE_SMALLER: u8 = 0x01;
const END_OF_STRING: u8 = 0x02;
const RUN_BEFORE_LARGER: u8 = 0x03;

const TEXT_PAD: u8 = b' ';
const BINARY_PAD: u8 = 0x00;

/// Appends the memcomparable encoding of a key (`values[i]` of type `types[i]`) to `out`.
///
/// Values must already have the column types (see [`DataType::coerce`]); integer columns
/// also take other integer types in range, and `decimal` columns integers and decimals of
/// another scale when the conversion is exact. On error `out` is left as it was.
pub fn encode_key(
    types: &[DataType],
    values: &[Value],
    out: &mut Vec<u8>,
) -> Result<(), ValueError> {
    if types.len() != values.len() {
        return Err(wrong_count(types.len(), values.len()));
    }
    let start = out.len();
    for (ty, value) in types.iter().zip(values) {
        if let Err(e) = encode_key_value(ty, value, out) {
            out.truncate(start);
            return Err(e);
        }
    }
    Ok(())
}

/// Appends the key encoding of one column value to `out`. On error, `out` may hold part of
/// the encoding: [`encode_key`] undoes that for the whole key.
pub fn encode_key_value(ty: &DataType, value: &Value, out: &mut Vec<u8>) -> Result<(), ValueError> {
    if value.is_null() {
        out.push(NULL_MARKER);
        return Ok(());
    }
    out.push(VALUE_MARKER);
    match *ty {
        DataType::TinyInt => out.push(int_in(ty, value, 0, i64::from(u8::MAX))? as u8),
        DataType::SmallInt => {
            let v = int_in(ty, value, i64::from(i16::MIN), i64::from(i16::MAX))? as i16;
            out.extend_from_slice(&((v as u16) ^ 0x8000).to_be_bytes());
        }
        DataType::Int => {
            let v = int_in(ty, value, i64::from(i32::MIN), i64::from(i32::MAX))? as i32;
            out.extend_from_slice(&((v as u32) ^ 0x8000_0000).to_be_bytes());
        }
        DataType::BigInt => {
            let v = int_in(ty, value, i64::MIN, i64::MAX)?;
            out.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
        }
        DataType::Bit => match value {
            Value::Bit(b) => out.push(u8::from(*b)),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Money => match value {
            Value::Money(m) => out.extend_from_slice(&((*m as u64) ^ (1 << 63)).to_be_bytes()),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Decimal { precision, scale } => {
            let m = decimal_mantissa(ty, value, precision, scale)?;
            let width = decimal_width(precision);
            let be = m.to_be_bytes();
            let part = &be[16 - width..];
            out.push(part[0] ^ 0x80);
            out.extend_from_slice(&part[1..]);
        }
        DataType::Date => match value {
            Value::Date(d) => push_date_be(*d, out),
            other => return Err(mismatch(ty, other)),
        },
        DataType::DateTime2(_) => match value {
            Value::DateTime2(dt) => {
                push_date_be(dt.date(), out);
                out.extend_from_slice(&dt.ticks().to_be_bytes()[3..]);
            }
            other => return Err(mismatch(ty, other)),
        },
        DataType::UniqueIdentifier => match value {
            Value::Uuid(u) => out.extend_from_slice(&u.sql_order_bytes()),
            other => return Err(mismatch(ty, other)),
        },
        DataType::Char(_) | DataType::VarChar(_) | DataType::NChar(_) | DataType::NVarChar(_) => {
            let s = text_in(ty, value)?;
            encode_padded(s.as_bytes(), TEXT_PAD, out)?;
        }
        DataType::VarBinary(n) => {
            let b = binary_in(ty, value, n)?;
            encode_padded(b, BINARY_PAD, out)?;
        }
    }
    Ok(())
}

fn push_date_be(d: Date, out: &mut Vec<u8>) {
    // Days are in 0..=3_652_058 < 2^24.
    out.extend_from_slice(&(d.days() as u32).to_be_bytes()[1..]);
}

/// Writes `bytes` without trailing `pad`s in the padded-run form.
fn encode_padded(bytes: &[u8], pad: u8, out: &mut Vec<u8>) -> Result<(), ValueError> {
    let trimmed_len = bytes.iter().rposition(|&b| b != pad).map_or(0, |i| i + 1);
    let mut rest = bytes.get(..trimmed_len).unwrap_or(&[]);
    loop {
        let Some(run_start) = rest.iter().position(|&b| b == pad) else {
            out.extend_from_slice(rest);
            break;
        };
        let (literal, from_run) = rest.split_at(run_start);
        out.extend_from_slice(literal);
        // Trailing pads were trimmed, so a byte other than `pad` follows every run.
        let Some(run_len) = from_run.iter().position(|&b| b != pad) else {
            break;
        };
        let next = from_run.get(run_len).copied().unwrap_or(pad);
        let k = u16::try_from(run_len).map_err(|_| {
            ValueError::overflow("A key string has a run of more than 65535 padding characters.")
        })?;
        if next < pad {
            out.extend_from_slice(&[pad, RUN_BEFORE_SMALLER]);
            out.extend_from_slice(&k.to_be_bytes());
        } else {
            out.extend_from_slice(&[pad, RUN_BEFORE_LARGER]);
            out.extend_from_slice(&(u16::MAX - k).to_be_bytes());
        }
        rest = from_run.get(run_len..).unwrap_or(&[]);
    }
    out.extend_from_slice(&[pad, END_OF_STRING]);
    Ok(())
}

/// Reads a padded-run string of at most `max_len` bytes (pads included) into `buf`; only the
/// canonical form that [`encode_padded`] writes is accepted.
fn decode_padded(
    r: &mut Reader<'_>,
    pad: u8,
    max_len: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ValueError> {
    let too_long = || corrupt("key string longer than its type allows");
    loop {
        let rest = r.rest();
        let Some(i) = rest.iter().position(|&b| b == pad) else {
            return Err(corrupt("unterminated key string"));
        };
        if buf.len() + i > max_len {
            return Err(too_long());
        }
        buf.extend_from_slice(r.take(i)?);
        r.take(1)?;
        let tag = r.byte()?;
        let k = match tag {
            END_OF_STRING => return Ok(()),
            RUN_BEFORE_SMALLER => u16::from_be_bytes(r.array()?),
            RUN_BEFORE_LARGER => u16::MAX - u16::from_be_bytes(r.array()?),
            _ => return Err(corrupt("bad tag in key string")),
        };
        let next = r.peek().ok_or_else(|| corrupt("unterminated key string"))?;
        let tag_fits = (next < pad) == (tag == RUN_BEFORE_SMALLER);
        if k == 0 || next == pad || !tag_fits {
            return Err(corrupt("bad padding run in key string"));
        }
        if buf.len() + usize::from(k) > max_len {
            return Err(too_long());
        }
        buf.resize(buf.len() + usize::from(k), pad);
    }
}

/// Decodes a key of `types` from the start of `bytes`; returns the values and the number of
/// bytes the key took. `char(n)`/`nchar(n)` values come back padded to `n`; `varchar`,
/// `nvarchar` and `varbinary` values without trailing spaces or zero bytes (which a key does
/// not keep).
pub fn decode_key(types: &[DataType], bytes: &[u8]) -> Result<(Vec<Value>, usize), ValueError> {
    let mut r = Reader::new(bytes);
    let mut values = Vec::with_capacity(types.len());
    for ty in types {
        values.push(decode_key_value(ty, &mut r)?);
    }
    Ok((values, r.pos))
}

/// The value of key column `position` of a key encoded with `types`: the columns before it are
/// skipped without building their values, and none after it is read.
pub fn decode_key_column(
    types: &[DataType],
    bytes: &[u8],
    position: usize,
) -> Result<Value, ValueError> {
    let ty = types
        .get(position)
        .ok_or_else(|| corrupt("a key column past the key's columns"))?;
    let start = key_prefix_len(&types[..position], bytes)?;
    decode_key_value(ty, &mut Reader::new(&bytes[start..]))
}

/// Length in bytes of the encoding of the first `types.len()` key columns at the start of
/// `bytes`, without building the values.
pub fn key_prefix_len(types: &[DataType], bytes: &[u8]) -> Result<usize, ValueError> {
    let mut r = Reader::new(bytes);
    let mut scratch = Vec::new();
    for ty in types {
        match r.byte()? {
            NULL_MARKER => continue,
            VALUE_MARKER => {}
            _ => return Err(corrupt("bad null marker in key")),
        }
        let width = match *ty {
            DataType::TinyInt | DataType::Bit => 1,
            DataType::SmallInt => 2,
            DataType::Int => 4,
            DataType::BigInt | DataType::Money | DataType::DateTime2(_) => 8,
            DataType::Decimal { precision, .. } => decimal_width(precision),
            DataType::Date => 3,
            DataType::UniqueIdentifier => 16,
            DataType::Char(n) | DataType::VarChar(n) | DataType::VarBinary(n) => {
                let pad = if matches!(ty, DataType::VarBinary(_)) {
                    BINARY_PAD
                } else {
                    TEXT_PAD
                };
                scratch.clear();
                decode_padded(&mut r, pad, usize::from(n), &mut scratch)?;
                0
            }
            DataType::NChar(n) | DataType::NVarChar(n) => {
                scratch.clear();
                decode_padded(&mut r, TEXT_PAD, 3 * usize::from(n), &mut scratch)?;
                0
            }
        };
        r.take(width)?;
    }
    Ok(r.pos)
}

fn decode_key_value(ty: &DataType, r: &mut Reader<'_>) -> Result<Value, ValueError> {
    match r.byte()? {
        NULL_MARKER => return Ok(Value::Null),
        VALUE_MARKER => {}
        _ => return Err(corrupt("bad null marker in key")),
    }
    Ok(match *ty {
        DataType::TinyInt => Value::TinyInt(r.byte()?),
        DataType::SmallInt => Value::SmallInt((u16::from_be_bytes(r.array()?) ^ 0x8000) as i16),
        DataType::Int => Value::Int((u32::from_be_bytes(r.array()?) ^ 0x8000_0000) as i32),
        DataType::BigInt => Value::BigInt((u64::from_be_bytes(r.array()?) ^ (1 << 63)) as i64),
        DataType::Bit => match r.byte()? {
            0 => Value::Bit(false),
            1 => Value::Bit(true),
            _ => return Err(corrupt("bit is neither 0 nor 1")),
        },
        DataType::Money => Value::Money((u64::from_be_bytes(r.array()?) ^ (1 << 63)) as i64),
        DataType::Decimal { precision, scale } => {
            let mut be = [0u8; 16];
            let width = decimal_width(precision);
            let part = &mut be[..width];
            part.copy_from_slice(r.take(width)?);
            part[0] ^= 0x80;
            checked_decimal(i128_from_be(part), precision, scale)?
        }
        DataType::Date => Value::Date(read_date_be(r)?),
        DataType::DateTime2(_) => {
            let date = read_date_be(r)?;
            let mut ticks = [0u8; 8];
            ticks[3..].copy_from_slice(r.take(5)?);
            let ticks = u64::from_be_bytes(ticks);
            if ticks >= TICKS_PER_DAY {
                return Err(corrupt("datetime2 time of day out of range"));
            }
            Value::DateTime2(DateTime2::new(date, ticks).map_err(|_| corrupt("datetime2"))?)
        }
        DataType::UniqueIdentifier => Value::Uuid(Uuid::from_sql_order_bytes(r.array()?)),
        DataType::Char(n) | DataType::VarChar(n) => {
            let mut buf = Vec::new();
            decode_padded(r, TEXT_PAD, usize::from(n), &mut buf)?;
            let mut s = String::from_utf8(buf).map_err(|_| corrupt("key text is not UTF-8"))?;
            if matches!(ty, DataType::Char(_)) {
                let missing = usize::from(n).saturating_sub(s.len());
                s.extend(std::iter::repeat_n(' ', missing));
            }
            Value::String(s)
        }
        DataType::NChar(n) | DataType::NVarChar(n) => {
            let mut buf = Vec::new();
            decode_padded(r, TEXT_PAD, 3 * usize::from(n), &mut buf)?;
            let mut s = String::from_utf8(buf).map_err(|_| corrupt("key text is not UTF-8"))?;
            let units = utf16_len(&s);
            if units > usize::from(n) {
                return Err(corrupt("key text longer than its type allows"));
            }
            if matches!(ty, DataType::NChar(_)) {
                s.extend(std::iter::repeat_n(
                    ' ',
                    usize::from(n).saturating_sub(units),
                ));
            }
            Value::String(s)
        }
        DataType::VarBinary(n) => {
            let mut buf = Vec::new();
            decode_padded(r, BINARY_PAD, usize::from(n), &mut buf)?;
            Value::Binary(buf)
        }
    })
}

fn read_date_be(r: &mut Reader<'_>) -> Result<Date, ValueError> {
    let mut be = [0u8; 4];
    be[1..].copy_from_slice(r.take(3)?);
    Date::from_days(u32::from_be_bytes(be) as i32).map_err(|_| corrupt("date out of range"))
}
