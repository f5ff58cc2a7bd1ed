//! Property tests of the key and row encodings, as seeded random loops.
//!
//! Each test prints its seed; rerun a failure with `LASTPAGE_SEED=<seed>` (`LASTPAGE_TEST_SEED`
//! works too). The number of cases scales with `LASTPAGE_TEST_CASES` (default 1).

use std::borrow::Cow;
use std::cmp::Ordering;

use lastpage_engine::encoding::{
    decode_key, decode_key_column, decode_row, decode_row_column, encode_key, encode_row,
    key_prefix_len,
};
use lastpage_engine::types::{DataType, Date, DateTime2, Decimal, TICKS_PER_DAY, Uuid, Value};
use rand::Rng;
use rand::rngs::StdRng;

mod common;

use common::{cases, seeded_rng};

// ------------------------------------------------------------------------------------------
// Generators
// ------------------------------------------------------------------------------------------

/// A random type whose text and binary lengths are short (mostly up to 10, else up to 40), so
/// that padding and truncation meet the values [`random_value`] makes.
fn random_type(rng: &mut StdRng) -> DataType {
    common::random_type(rng, |rng, _| {
        if rng.random_bool(0.8) {
            rng.random_range(1..=10)
        } else {
            rng.random_range(1..=40)
        }
    })
}

fn pick<T: Copy>(rng: &mut impl Rng, items: &[T]) -> T {
    items[rng.random_range(0..items.len())]
}

fn random_int(rng: &mut impl Rng, min: i64, max: i64) -> i64 {
    match rng.random_range(0..4) {
        0 => pick(
            rng,
            &[
                min,
                min.saturating_add(1),
                -1,
                0,
                1,
                max.saturating_sub(1),
                max,
            ],
        )
        .clamp(min, max),
        1 => rng.random_range(-3i64..=3).clamp(min, max),
        _ => rng.random_range(min..=max),
    }
}

/// Characters that stress the padded-run form: below, at and above the pad space.
const CHARS: &[char] = &[
    ' ', ' ', ' ', 'a', 'b', '\t', '\0', '\u{1f}', '!', 'é', '€', '𝄞', '\u{FFFD}',
];
const BYTES: &[u8] = &[0, 0, 0, 1, 0x20, 0x7f, 0x80, 0xff];

/// A random value of `ty` that `ty.coerce` leaves as it is (or `NULL`).
fn random_value(rng: &mut impl Rng, ty: &DataType) -> Value {
    if rng.random_bool(0.12) {
        return Value::Null;
    }
    let value = match *ty {
        DataType::TinyInt => Value::TinyInt(random_int(rng, 0, 255) as u8),
        DataType::SmallInt => {
            Value::SmallInt(random_int(rng, i16::MIN.into(), i16::MAX.into()) as i16)
        }
        DataType::Int => Value::Int(random_int(rng, i32::MIN.into(), i32::MAX.into()) as i32),
        DataType::BigInt => Value::BigInt(random_int(rng, i64::MIN, i64::MAX)),
        DataType::Bit => Value::Bit(rng.random()),
        DataType::Money => Value::Money(random_int(rng, i64::MIN, i64::MAX)),
        DataType::Decimal { precision, scale } => {
            let max = 10i128.pow(u32::from(precision)) - 1;
            let m = match rng.random_range(0..4) {
                0 => pick(rng, &[-max, -1, 0, 1, max]),
                1 => rng.random_range(-30i128..=30).clamp(-max, max),
                _ => rng.random_range(-max..=max),
            };
            Value::Decimal(Decimal::new(m, scale).unwrap())
        }
        DataType::Char(n) | DataType::VarChar(n) | DataType::NChar(n) | DataType::NVarChar(n) => {
            let len = rng.random_range(0..=usize::from(n).min(12));
            let mut s = String::new();
            for _ in 0..len {
                let c = pick(rng, CHARS);
                let fits = match ty {
                    DataType::Char(_) | DataType::VarChar(_) => {
                        s.len() + c.len_utf8() <= usize::from(n)
                    }
                    _ => s.encode_utf16().count() + c.len_utf16() <= usize::from(n),
                };
                if fits {
                    s.push(c);
                }
            }
            Value::String(s)
        }
        DataType::VarBinary(n) => {
            let len = rng.random_range(0..=usize::from(n).min(12));
            Value::Binary((0..len).map(|_| pick(rng, BYTES)).collect())
        }
        DataType::Date => Value::Date(random_date(rng)),
        DataType::DateTime2(precision) => {
            let ticks = match rng.random_range(0..3) {
                0 => pick(rng, &[0, 1, TICKS_PER_DAY - 1, TICKS_PER_DAY / 2]),
                _ => rng.random_range(0..TICKS_PER_DAY),
            };
            // Cut to the precision (rounding up could pass 9999-12-31).
            let unit = 10u64.pow(7 - u32::from(precision));
            let ticks = ticks - ticks % unit;
            Value::DateTime2(DateTime2::new(random_date(rng), ticks).unwrap())
        }
        DataType::UniqueIdentifier => {
            let mut b = [0u8; 16];
            if rng.random_bool(0.5) {
                rng.fill(&mut b);
            } else {
                for byte in &mut b {
                    *byte = pick(rng, &[0, 1, 0x80, 0xff]);
                }
            }
            Value::Uuid(Uuid::from_bytes(b))
        }
    };
    // Coercion pads char/nchar and rounds datetime2 to the column's precision.
    ty.coerce(value).expect("generated values fit their types")
}

fn random_date(rng: &mut impl Rng) -> Date {
    let days = match rng.random_range(0..3) {
        0 => pick(rng, &[Date::MIN.days(), Date::MAX.days(), 1, 719_162]),
        1 => rng.random_range(738_000..738_010),
        _ => rng.random_range(Date::MIN.days()..=Date::MAX.days()),
    };
    Date::from_days(days).unwrap()
}

// ------------------------------------------------------------------------------------------
// The intended SQL order, written independently of the encoding
// ------------------------------------------------------------------------------------------

/// Compares as if the shorter were padded with `pad` (SQL Server's rule for text with
/// spaces and for binary with zero bytes).
fn padded_cmp(a: &[u8], b: &[u8], pad: u8) -> Ordering {
    let len = a.len().max(b.len());
    (0..len)
        .map(|i| a.get(i).unwrap_or(&pad).cmp(b.get(i).unwrap_or(&pad)))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// SQL Server's uniqueidentifier order, from .NET's SqlGuid: the GUID is stored as
/// `Guid.ToByteArray()` (first three groups little-endian) and bytes are compared in the
/// order 10..=15, 8, 9, 6, 7, 4, 5, 0..=3.
fn sql_guid_cmp(a: &Uuid, b: &Uuid) -> Ordering {
    fn storage(u: &Uuid) -> [u8; 16] {
        let t = u.as_bytes();
        [
            t[3], t[2], t[1], t[0], t[5], t[4], t[7], t[6], t[8], t[9], t[10], t[11], t[12], t[13],
            t[14], t[15],
        ]
    }
    const ORDER: [usize; 16] = [10, 11, 12, 13, 14, 15, 8, 9, 6, 7, 4, 5, 0, 1, 2, 3];
    let (sa, sb) = (storage(a), storage(b));
    ORDER
        .iter()
        .map(|&i| sa[i].cmp(&sb[i]))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

fn sql_cmp(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        (Value::Bit(x), Value::Bit(y)) => x.cmp(y),
        (Value::Decimal(x), Value::Decimal(y)) => x.cmp(y),
        (Value::Money(x), Value::Money(y)) => x.cmp(y),
        (Value::String(x), Value::String(y)) => padded_cmp(x.as_bytes(), y.as_bytes(), b' '),
        (Value::Binary(x), Value::Binary(y)) => padded_cmp(x, y, 0),
        (Value::Date(x), Value::Date(y)) => x.days().cmp(&y.days()),
        (Value::DateTime2(x), Value::DateTime2(y)) => x
            .date()
            .days()
            .cmp(&y.date().days())
            .then(x.ticks().cmp(&y.ticks())),
        (Value::Uuid(x), Value::Uuid(y)) => sql_guid_cmp(x, y),
        (x, y) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => panic!("cannot compare {x:?} with {y:?}"),
        },
    }
}

fn sql_cmp_rows(a: &[Value], b: &[Value]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| sql_cmp(x, y))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// What a key gives back: trailing spaces of varchar/nvarchar and trailing zeros of
/// varbinary are not kept.
fn key_normalized(ty: &DataType, v: &Value) -> Value {
    match (ty, v) {
        (DataType::VarChar(_) | DataType::NVarChar(_), Value::String(s)) => {
            Value::String(s.trim_end_matches(' ').to_owned())
        }
        (DataType::VarBinary(_), Value::Binary(b)) => {
            let len = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
            Value::Binary(b[..len].to_vec())
        }
        _ => v.clone(),
    }
}

fn key(types: &[DataType], values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(types, values, &mut out)
        .unwrap_or_else(|e| panic!("encode_key {types:?} {values:?}: {e}"));
    out
}

// ------------------------------------------------------------------------------------------
// Properties
// ------------------------------------------------------------------------------------------

#[test]
fn single_column_key_order_matches_sql_order() {
    let (seed, mut rng) = seeded_rng();
    for _ in 0..cases(2000) {
        let ty = random_type(&mut rng);
        let values: Vec<Value> = (0..30).map(|_| random_value(&mut rng, &ty)).collect();
        let keys: Vec<Vec<u8>> = values
            .iter()
            .map(|v| key(&[ty], std::slice::from_ref(v)))
            .collect();
        for i in 0..values.len() {
            for j in 0..values.len() {
                let want = sql_cmp(&values[i], &values[j]);
                let got = keys[i].cmp(&keys[j]);
                assert_eq!(
                    got, want,
                    "seed {seed}, {ty:?}: {:?} vs {:?} => keys {:02x?} vs {:02x?}",
                    values[i], values[j], keys[i], keys[j]
                );
            }
        }
    }
}

#[test]
fn composite_key_order_is_lexicographic() {
    let (seed, mut rng) = seeded_rng();
    for _ in 0..cases(1500) {
        let types: Vec<DataType> = (0..rng.random_range(1..=4))
            .map(|_| random_type(&mut rng))
            .collect();
        let rows: Vec<Vec<Value>> = (0..25)
            .map(|_| types.iter().map(|t| random_value(&mut rng, t)).collect())
            .collect();
        // Make equal leading columns likely, so that later columns decide.
        let mut rows = rows;
        for r in 1..rows.len() {
            if rng.random_bool(0.5) {
                let cut = rng.random_range(0..types.len());
                let prev = rows[r - 1][..cut].to_vec();
                rows[r][..cut].clone_from_slice(&prev);
            }
        }
        let keys: Vec<Vec<u8>> = rows.iter().map(|r| key(&types, r)).collect();
        for i in 0..rows.len() {
            for j in 0..rows.len() {
                assert_eq!(
                    keys[i].cmp(&keys[j]),
                    sql_cmp_rows(&rows[i], &rows[j]),
                    "seed {seed}, {types:?}: {:?} vs {:?}",
                    rows[i],
                    rows[j]
                );
            }
        }
    }
}

#[test]
fn key_round_trips() {
    let (seed, mut rng) = seeded_rng();
    for _ in 0..cases(30000) {
        let types: Vec<DataType> = (0..rng.random_range(0..=5))
            .map(|_| random_type(&mut rng))
            .collect();
        let values: Vec<Value> = types.iter().map(|t| random_value(&mut rng, t)).collect();
        let mut bytes = key(&types, &values);
        let len = bytes.len();
        let want: Vec<Value> = types
            .iter()
            .zip(&values)
            .map(|(t, v)| key_normalized(t, v))
            .collect();
        // Bytes after the key (a row, another key) are not read.
        bytes.extend((0..rng.random_range(0..4)).map(|_| rng.random::<u8>()));
        let (got, used) = decode_key(&types, &bytes)
            .unwrap_or_else(|e| panic!("seed {seed}: decode_key {types:?} {values:?}: {e}"));
        assert_eq!(used, len, "seed {seed}: {types:?} {values:?}");
        assert_eq!(got, want, "seed {seed}: {types:?}");
        assert_eq!(
            key_prefix_len(&types, &bytes).unwrap(),
            len,
            "seed {seed}: {types:?}"
        );
        // Each column decodes alone to the value the whole key decodes to, and a position
        // past the last column is an error, not a panic.
        for (position, value) in want.iter().enumerate() {
            let column = decode_key_column(&types, &bytes, position).unwrap_or_else(|e| {
                panic!("seed {seed}: decode_key_column {types:?} at {position}: {e}")
            });
            assert_eq!(&column, value, "seed {seed}: {types:?} at {position}");
        }
        assert!(
            decode_key_column(&types, &bytes, types.len()).is_err(),
            "seed {seed}: {types:?}"
        );
        // The normalized values encode to the same key.
        assert_eq!(key(&types, &got), bytes[..len], "seed {seed}: {types:?}");
    }
}

#[test]
fn row_round_trips() {
    let (seed, mut rng) = seeded_rng();
    for _ in 0..cases(30000) {
        let types: Vec<DataType> = (0..rng.random_range(0..=20))
            .map(|_| random_type(&mut rng))
            .collect();
        let values: Vec<Value> = types.iter().map(|t| random_value(&mut rng, t)).collect();
        let prefix: Vec<u8> = (0..rng.random_range(0..5))
            .map(|_| rng.random::<u8>())
            .collect();
        let mut out = prefix.clone();
        encode_row(&types, &values, &mut out)
            .unwrap_or_else(|e| panic!("seed {seed}: encode_row {types:?} {values:?}: {e}"));
        assert_eq!(
            out[..prefix.len()],
            prefix[..],
            "seed {seed}: encode_row kept the prefix"
        );
        let row = &out[prefix.len()..];
        let got = decode_row(&types, row)
            .unwrap_or_else(|e| panic!("seed {seed}: decode_row {types:?}: {e}"));
        assert_eq!(got, values, "seed {seed}: {types:?}");
        for (i, want) in values.iter().enumerate() {
            assert_eq!(
                &decode_row_column(&types, row, i).unwrap(),
                want,
                "seed {seed}: column {i} of {types:?}"
            );
        }
        let fixed: usize = types.iter().filter_map(DataType::fixed_size).sum();
        assert!(row.len() >= types.len().div_ceil(8) + fixed, "seed {seed}");
    }
}

/// `coerce_cow` of a borrowed value gives what `coerce` gives, and keeps the value borrowed
/// only where `coerce` would return it unchanged: values of the column's own type, of other
/// types, and strings longer than the column (with and without excess trailing spaces).
#[test]
fn coercing_a_borrowed_value_matches_coerce() {
    let (seed, mut rng) = seeded_rng();
    let (mut borrowed, mut total) = (0usize, 0usize);
    for _ in 0..cases(30000) {
        let ty = random_type(&mut rng);
        let value = match rng.random_range(0..4) {
            0 | 1 => random_value(&mut rng, &ty),
            2 => {
                let other = random_type(&mut rng);
                random_value(&mut rng, &other)
            }
            _ => {
                let len = rng.random_range(0..=14);
                Value::String((0..len).map(|_| pick(&mut rng, CHARS)).collect())
            }
        };
        let want = ty.coerce(value.clone());
        let got = ty.coerce_cow(Cow::Borrowed(&value));
        total += 1;
        match (&want, &got) {
            (Ok(want), Ok(got)) => {
                assert_eq!(got.as_ref(), want, "seed {seed}: {ty:?} {value:?}");
                if matches!(got, Cow::Borrowed(_)) {
                    borrowed += 1;
                    assert!(ty.holds_as_is(&value), "seed {seed}: {ty:?} {value:?}");
                    assert_eq!(want, &value, "seed {seed}: {ty:?} kept {value:?}");
                }
            }
            (Err(want), Err(got)) => assert_eq!(got, want, "seed {seed}: {ty:?} {value:?}"),
            _ => panic!("seed {seed}: {ty:?} {value:?}: coerce {want:?}, coerce_cow {got:?}"),
        }
    }
    // Most values of the column's own type stay borrowed: the point of `coerce_cow`.
    assert!(
        borrowed * 4 > total,
        "seed {seed}: {borrowed} of {total} borrowed"
    );
    // A type that is itself invalid converts nothing, not even a value that would fit it.
    let empty = Value::String(String::new());
    assert!(!DataType::VarChar(0).holds_as_is(&empty));
    assert!(
        DataType::VarChar(0)
            .coerce_cow(Cow::Borrowed(&empty))
            .is_err()
    );
}

/// Decoders on arbitrary and on damaged bytes: never a panic; whatever decodes is valid
/// (it encodes again, to the same bytes for keys and rows).
#[test]
fn decoding_garbage_never_panics() {
    let (seed, mut rng) = seeded_rng();
    let (mut key_ok, mut row_ok) = (0usize, 0usize);
    for case in 0..cases(100000) {
        let types: Vec<DataType> = (0..rng.random_range(0..=6))
            .map(|_| random_type(&mut rng))
            .collect();
        let mut bytes: Vec<u8> = if case % 2 == 0 {
            (0..rng.random_range(0..48))
                .map(|_| {
                    let any = rng.random();
                    pick(&mut rng, &[0u8, 1, 2, 3, 0x20, 0x80, 0xff, any])
                })
                .collect()
        } else {
            // A valid key or row, damaged.
            let values: Vec<Value> = types.iter().map(|t| random_value(&mut rng, t)).collect();
            let mut b = Vec::new();
            if rng.random_bool(0.5) {
                encode_key(&types, &values, &mut b).unwrap();
            } else {
                encode_row(&types, &values, &mut b).unwrap();
            }
            b
        };
        if case % 2 == 1 && !bytes.is_empty() {
            match rng.random_range(0..4) {
                0 => {
                    let i = rng.random_range(0..bytes.len());
                    bytes[i] ^= 1 << rng.random_range(0..8);
                }
                1 => bytes.truncate(rng.random_range(0..bytes.len())),
                2 => {
                    let i = rng.random_range(0..=bytes.len());
                    bytes.insert(i, rng.random());
                }
                _ => {
                    let i = rng.random_range(0..bytes.len());
                    bytes[i] = rng.random();
                }
            }
        }
        if let Ok((values, used)) = decode_key(&types, &bytes) {
            key_ok += 1;
            let mut again = Vec::new();
            encode_key(&types, &values, &mut again).unwrap_or_else(|e| {
                panic!("seed {seed}: decoded key does not encode: {e}: {types:?} {values:?}")
            });
            assert_eq!(
                again,
                bytes[..used],
                "seed {seed}: non-canonical key accepted: {types:?}"
            );
            assert_eq!(
                key_prefix_len(&types, &bytes).ok(),
                Some(used),
                "seed {seed}"
            );
        }
        let _ = key_prefix_len(&types, &bytes);
        if let Ok(values) = decode_row(&types, &bytes) {
            row_ok += 1;
            let mut again = Vec::new();
            encode_row(&types, &values, &mut again).unwrap_or_else(|e| {
                panic!("seed {seed}: decoded row does not encode: {e}: {types:?} {values:?}")
            });
            assert_eq!(
                again, bytes,
                "seed {seed}: non-canonical row accepted: {types:?}"
            );
        }
        for i in 0..=types.len() {
            let _ = decode_row_column(&types, &bytes, i);
        }
    }
    println!("decoded {key_ok} keys and {row_ok} rows out of the damaged inputs");
}
