//! Column data types and values of lastpage, modelled on SQL Server's.
//!
//! * [`DataType`] is a column's declared type (`int`, `decimal(10,2)`, `varchar(100)`, ...).
//! * [`Value`] is one cell: a typed value or `NULL`.
//! * [`DataType::coerce`] converts a value to a column's type the way SQL Server's implicit
//!   conversion on `INSERT` does (range checks, rounding, padding, parsing of text).
//! * [`Decimal`], [`Date`], [`DateTime2`] and [`Uuid`] are the value types that Rust lacks; each
//!   converts to and from text ([`FromStr`] and [`fmt::Display`]).
//!
//! Errors are [`ValueError`]s carrying a [`ValueErrorKind`] and a SQL-Server-like message.
//! Nothing here panics on bad input.
//!
//! Collation: lastpage compares text by its UTF-8 bytes, that is by Unicode code point, like a
//! binary collation (`Latin1_General_BIN2`), and, as SQL Server does, ignores trailing spaces
//! when comparing (`'a' = 'a  '`). [`Value`]'s own `PartialEq` is structural (`'a' != 'a '`);
//! SQL ordering and equality are defined by the key encoding in [`crate::encoding`].

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

/// Largest precision of `decimal`.
pub const MAX_DECIMAL_PRECISION: u8 = 38;
/// Largest length of `char`, `varchar` and `varbinary`, in bytes.
pub const MAX_BYTE_LENGTH: u16 = 8000;
/// Largest length of `nchar` and `nvarchar`, in characters (UTF-16 code units).
pub const MAX_NCHAR_LENGTH: u16 = 4000;
/// Largest fractional-second precision of `datetime2`.
pub const MAX_DATETIME2_PRECISION: u8 = 7;
/// 100-nanosecond ticks in one second.
pub const TICKS_PER_SECOND: u64 = 10_000_000;
/// 100-nanosecond ticks in one day.
pub const TICKS_PER_DAY: u64 = 86_400 * TICKS_PER_SECOND;
/// Units of `money` in one currency unit (`money` is an `i64` in 1/10000 units).
pub const MONEY_SCALE_FACTOR: i64 = 10_000;

/// `10^n` for `n` in `0..=38`.
const POW10: [i128; 39] = {
    let mut table = [1i128; 39];
    let mut i = 1;
    while i < 39 {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

/// `10^n`, saturating at `10^38` (callers only pass `n <= 38`).
#[inline]
pub(crate) fn pow10(n: u8) -> i128 {
    match POW10.get(usize::from(n)) {
        Some(p) => *p,
        None => POW10[38],
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// What went wrong in a [`ValueError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueErrorKind {
    /// A data type with an invalid length, precision or scale (`varchar(9000)`).
    InvalidType,
    /// A value out of the range of the target type (`300` into `tinyint`).
    Overflow,
    /// A string or binary value longer than the column allows.
    Truncation,
    /// A value that cannot be converted: text that does not parse, or a conversion that is
    /// not allowed (`date` into `int`).
    Conversion,
    /// The encoder got a value whose type does not match the column type, or a different
    /// number of values than types.
    Mismatch,
    /// Bytes handed to a decoder that are not a valid encoding.
    Corrupt,
}

/// The error of every fallible operation on types, values and their encodings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueError {
    kind: ValueErrorKind,
    message: String,
    column: Option<String>,
}

const TRUNCATION_PREFIX: &str = "String or binary data would be truncated";

impl ValueError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ValueErrorKind, message: impl Into<String>) -> Self {
        ValueError {
            kind,
            message: message.into(),
            column: None,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ValueErrorKind {
        self.kind
    }

    /// The full message (the same text as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The column set by [`ValueError::with_column`], if any.
    pub fn column(&self) -> Option<&str> {
        self.column.as_deref()
    }

    /// Names the column the error is about. A truncation message then reads
    /// `String or binary data would be truncated in column 'name': value has 12 bytes, the
    /// limit is 10`; other messages keep their SQL Server wording and only record the column
    /// (see [`ValueError::column`]).
    pub fn with_column(mut self, column: &str) -> Self {
        if self.kind == ValueErrorKind::Truncation
            && self.column.is_none()
            && let Some(rest) = self.message.strip_prefix(TRUNCATION_PREFIX)
        {
            self.message = format!("{TRUNCATION_PREFIX} in column '{column}'{rest}");
        }
        self.column = Some(column.to_owned());
        self
    }

    pub(crate) fn invalid_type(message: impl Into<String>) -> Self {
        Self::new(ValueErrorKind::InvalidType, message)
    }

    pub(crate) fn overflow(message: impl Into<String>) -> Self {
        Self::new(ValueErrorKind::Overflow, message)
    }

    pub(crate) fn conversion(message: impl Into<String>) -> Self {
        Self::new(ValueErrorKind::Conversion, message)
    }

    pub(crate) fn mismatch(message: impl Into<String>) -> Self {
        Self::new(ValueErrorKind::Mismatch, message)
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ValueErrorKind::Corrupt, message)
    }

    /// The truncation error: `value has {actual} {unit}, the limit is {limit}`.
    pub(crate) fn truncation(actual: usize, limit: usize, unit: &str) -> Self {
        Self::new(
            ValueErrorKind::Truncation,
            format!("{TRUNCATION_PREFIX}: value has {actual} {unit}, the limit is {limit}"),
        )
    }

    fn arithmetic_overflow(type_name: &str) -> Self {
        Self::overflow(format!(
            "Arithmetic overflow error converting expression to data type {type_name}."
        ))
    }

    fn clash(value: &Value, target: &DataType) -> Self {
        Self::conversion(format!(
            "Operand type clash: {} is incompatible with {}",
            value.data_type_name(),
            target.name()
        ))
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ValueError {}

// ---------------------------------------------------------------------------------------------
// DataType
// ---------------------------------------------------------------------------------------------

/// A column's declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `tinyint`: 0..=255.
    TinyInt,
    /// `smallint`: `i16`.
    SmallInt,
    /// `int`: `i32`.
    Int,
    /// `bigint`: `i64`.
    BigInt,
    /// `bit`: 0 or 1.
    Bit,
    /// `decimal(precision, scale)`: precision 1..=38, scale 0..=precision.
    Decimal {
        /// Total number of decimal digits.
        precision: u8,
        /// Digits after the decimal point.
        scale: u8,
    },
    /// `money`: an `i64` in 1/10000 units.
    Money,
    /// `char(n)`: exactly `n` bytes of UTF-8, padded with spaces; n in 1..=8000.
    Char(u16),
    /// `varchar(n)`: at most `n` bytes of UTF-8; n in 1..=8000.
    VarChar(u16),
    /// `nchar(n)`: exactly `n` UTF-16 code units, padded with spaces; n in 1..=4000.
    NChar(u16),
    /// `nvarchar(n)`: at most `n` UTF-16 code units; n in 1..=4000.
    NVarChar(u16),
    /// `datetime2(p)`: date and time of day with `p` fractional-second digits, p in 0..=7.
    DateTime2(u8),
    /// `date`: 0001-01-01 through 9999-12-31.
    Date,
    /// `uniqueidentifier`: a 16-byte GUID.
    UniqueIdentifier,
    /// `varbinary(n)`: at most `n` bytes; n in 1..=8000.
    VarBinary(u16),
}

/// Bytes of a `decimal(precision, _)` in a key or row: the smallest of 1, 2, 4, 8 or 16 bytes
/// whose two's complement range holds every `precision`-digit mantissa.
pub(crate) fn decimal_width(precision: u8) -> usize {
    match precision {
        0..=2 => 1,
        3..=4 => 2,
        5..=9 => 4,
        10..=18 => 8,
        _ => 16,
    }
}

impl DataType {
    /// Checks the type's length, precision and scale.
    pub fn validate(&self) -> Result<(), ValueError> {
        fn length(name: &str, n: u16, max: u16, unit: &str) -> Result<(), ValueError> {
            if n == 0 || n > max {
                Err(ValueError::invalid_type(format!(
                    "The length {n} given to type {name} is invalid: it must be between 1 and {max} {unit}."
                )))
            } else {
                Ok(())
            }
        }
        match *self {
            DataType::Decimal { precision, scale } => {
                if precision == 0 || precision > MAX_DECIMAL_PRECISION {
                    Err(ValueError::invalid_type(format!(
                        "The precision {precision} given to type decimal is invalid: it must be between 1 and {MAX_DECIMAL_PRECISION}."
                    )))
                } else if scale > precision {
                    Err(ValueError::invalid_type(format!(
                        "The scale {scale} given to type decimal({precision},{scale}) is invalid: it must be between 0 and the precision {precision}."
                    )))
                } else {
                    Ok(())
                }
            }
            DataType::Char(n) => length("char", n, MAX_BYTE_LENGTH, "bytes"),
            DataType::VarChar(n) => length("varchar", n, MAX_BYTE_LENGTH, "bytes"),
            DataType::VarBinary(n) => length("varbinary", n, MAX_BYTE_LENGTH, "bytes"),
            DataType::NChar(n) => length("nchar", n, MAX_NCHAR_LENGTH, "characters"),
            DataType::NVarChar(n) => length("nvarchar", n, MAX_NCHAR_LENGTH, "characters"),
            DataType::DateTime2(p) => {
                if p > MAX_DATETIME2_PRECISION {
                    Err(ValueError::invalid_type(format!(
                        "The precision {p} given to type datetime2 is invalid: it must be between 0 and {MAX_DATETIME2_PRECISION}."
                    )))
                } else {
                    Ok(())
                }
            }
            DataType::TinyInt
            | DataType::SmallInt
            | DataType::Int
            | DataType::BigInt
            | DataType::Bit
            | DataType::Money
            | DataType::Date
            | DataType::UniqueIdentifier => Ok(()),
        }
    }

    /// The type's name without its arguments: `"varchar"`, `"decimal"`, `"datetime2"`, ...
    pub fn base_name(&self) -> &'static str {
        match self {
            DataType::TinyInt => "tinyint",
            DataType::SmallInt => "smallint",
            DataType::Int => "int",
            DataType::BigInt => "bigint",
            DataType::Bit => "bit",
            DataType::Decimal { .. } => "decimal",
            DataType::Money => "money",
            DataType::Char(_) => "char",
            DataType::VarChar(_) => "varchar",
            DataType::NChar(_) => "nchar",
            DataType::NVarChar(_) => "nvarchar",
            DataType::DateTime2(_) => "datetime2",
            DataType::Date => "date",
            DataType::UniqueIdentifier => "uniqueidentifier",
            DataType::VarBinary(_) => "varbinary",
        }
    }

    /// The type's name as SQL Server writes it: `"varchar(100)"`, `"decimal(10,2)"`,
    /// `"datetime2(7)"`, `"int"`, ...
    pub fn name(&self) -> String {
        match *self {
            DataType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            DataType::Char(n)
            | DataType::VarChar(n)
            | DataType::NChar(n)
            | DataType::NVarChar(n)
            | DataType::VarBinary(n) => format!("{}({n})", self.base_name()),
            DataType::DateTime2(p) => format!("datetime2({p})"),
            _ => self.base_name().to_owned(),
        }
    }

    /// Bytes a value of this type takes in an encoded row, for fixed-size types (`None` for
    /// `varchar`, `nvarchar` and `varbinary`). A `NULL` of a fixed-size type takes the same
    /// space.
    pub fn fixed_size(&self) -> Option<usize> {
        match *self {
            DataType::TinyInt | DataType::Bit => Some(1),
            DataType::SmallInt => Some(2),
            DataType::Int => Some(4),
            DataType::BigInt | DataType::Money => Some(8),
            DataType::Decimal { precision, .. } => Some(decimal_width(precision)),
            DataType::Char(n) => Some(usize::from(n)),
            DataType::NChar(n) => Some(2 * usize::from(n)),
            DataType::Date => Some(3),
            DataType::DateTime2(_) => Some(8),
            DataType::UniqueIdentifier => Some(16),
            DataType::VarChar(_) | DataType::NVarChar(_) | DataType::VarBinary(_) => None,
        }
    }

    /// Largest number of bytes a value of this type takes in an encoded row, not counting
    /// the two-byte offset of a variable-size column. For `nvarchar(n)` that is `2n`.
    pub fn max_row_size(&self) -> usize {
        match *self {
            DataType::VarChar(n) | DataType::VarBinary(n) => usize::from(n),
            DataType::NVarChar(n) => 2 * usize::from(n),
            _ => self.fixed_size().unwrap_or(0),
        }
    }

    /// Whether values of this type are [`Value::String`]s.
    pub fn is_text(&self) -> bool {
        matches!(
            self,
            DataType::Char(_) | DataType::VarChar(_) | DataType::NChar(_) | DataType::NVarChar(_)
        )
    }

    /// Converts `value` to this column's type, the way SQL Server's implicit conversion on
    /// `INSERT` does. `NULL` passes through (nullability is the caller's business).
    ///
    /// * Integer types: from any integer type, `bit`, `decimal` (truncated toward zero),
    ///   `money` (rounded) and text (`' 42 '`; empty text is 0, as in SQL Server), with a
    ///   range check: `Arithmetic overflow error converting expression to data type int.`
    /// * `bit`: nonzero numbers are 1; text `'true'`/`'false'` (any case) or an integer.
    /// * `decimal(p,s)` and `money`: from integers, `bit`, `decimal`, `money` and text,
    ///   rounded half away from zero to the scale, then checked against the precision.
    /// * `char`/`varchar`/`nchar`/`nvarchar`: from text, numbers (their text), dates, GUIDs and
    ///   UTF-8 binary. Longer than the column => `String or binary data would be truncated:
    ///   value has X bytes, the limit is n` (use [`ValueError::with_column`] to name the
    ///   column), except that excess trailing spaces are dropped silently, as SQL Server
    ///   does. `char(n)`/`nchar(n)` are padded with spaces to `n`.
    /// * `date`/`datetime2(p)`: from text (`YYYY-MM-DD[( |T)hh:mm[:ss[.fffffff]]]`, or
    ///   `YYYYMMDD`; empty text is 1900-01-01 as in SQL Server), `date` and `datetime2`;
    ///   `datetime2(p)` rounds to `p` fractional digits.
    /// * `uniqueidentifier`: from its text form, with or without braces.
    /// * `varbinary(n)`: from binary only (SQL Server refuses text implicitly), length-checked.
    pub fn coerce(&self, value: Value) -> Result<Value, ValueError> {
        if value.is_null() {
            return Ok(Value::Null);
        }
        self.validate()?;
        match *self {
            DataType::TinyInt => {
                let v = coerce_int(&value, self, 0, i128::from(u8::MAX))?;
                Ok(Value::TinyInt(v as u8))
            }
            DataType::SmallInt => {
                let v = coerce_int(&value, self, i128::from(i16::MIN), i128::from(i16::MAX))?;
                Ok(Value::SmallInt(v as i16))
            }
            DataType::Int => {
                let v = coerce_int(&value, self, i128::from(i32::MIN), i128::from(i32::MAX))?;
                Ok(Value::Int(v as i32))
            }
            DataType::BigInt => {
                let v = coerce_int(&value, self, i128::from(i64::MIN), i128::from(i64::MAX))?;
                Ok(Value::BigInt(v as i64))
            }
            DataType::Bit => coerce_bit(value, self).map(Value::Bit),
            DataType::Decimal { precision, scale } => {
                coerce_decimal(value, self, precision, scale).map(Value::Decimal)
            }
            DataType::Money => coerce_money(value, self).map(Value::Money),
            DataType::Char(n) => {
                let s = text_of(value, self)?;
                fit_bytes(s, usize::from(n), true).map(Value::String)
            }
            DataType::VarChar(n) => {
                let s = text_of(value, self)?;
                fit_bytes(s, usize::from(n), false).map(Value::String)
            }
            DataType::NChar(n) => {
                let s = text_of(value, self)?;
                fit_units(s, usize::from(n), true).map(Value::String)
            }
            DataType::NVarChar(n) => {
                let s = text_of(value, self)?;
                fit_units(s, usize::from(n), false).map(Value::String)
            }
            DataType::Date => match value {
                Value::Date(d) => Ok(Value::Date(d)),
                Value::DateTime2(dt) => Ok(Value::Date(dt.date())),
                Value::String(s) => Ok(Value::Date(parse_datetime_text(&s)?.date())),
                other => Err(ValueError::clash(&other, self)),
            },
            DataType::DateTime2(p) => {
                let dt = match value {
                    Value::Date(d) => DateTime2::from_date(d),
                    Value::DateTime2(dt) => dt,
                    Value::String(s) => parse_datetime_text(&s)?,
                    other => return Err(ValueError::clash(&other, self)),
                };
                dt.round_to_precision(p).map(Value::DateTime2)
            }
            DataType::UniqueIdentifier => match value {
                Value::Uuid(u) => Ok(Value::Uuid(u)),
                Value::String(s) => Uuid::parse_converted_text(s.trim()).map(Value::Uuid).ok_or_else(|| {
                    ValueError::conversion(
                        "Conversion failed when converting from a character string to uniqueidentifier.",
                    )
                }),
                other => Err(ValueError::clash(&other, self)),
            },
            DataType::VarBinary(n) => match value {
                Value::Binary(b) => {
                    if b.len() > usize::from(n) {
                        Err(ValueError::truncation(b.len(), usize::from(n), "bytes"))
                    } else {
                        Ok(Value::Binary(b))
                    }
                }
                Value::String(_) => Err(ValueError::conversion(
                    "Implicit conversion from data type varchar to varbinary is not allowed. Use the CONVERT function to run this query.",
                )),
                other => Err(ValueError::clash(&other, self)),
            },
        }
    }
}

impl DataType {
    /// [`DataType::coerce`] for a value that may be borrowed: a borrowed value the type holds
    /// as it is (see [`DataType::holds_as_is`]) stays borrowed, so inserting values the
    /// caller keeps copies nothing; any other is converted as `coerce` converts it.
    pub fn coerce_cow<'v>(&self, value: Cow<'v, Value>) -> Result<Cow<'v, Value>, ValueError> {
        match value {
            Cow::Borrowed(borrowed) if self.holds_as_is(borrowed) => Ok(Cow::Borrowed(borrowed)),
            value => self.coerce(value.into_owned()).map(Cow::Owned),
        }
    }

    /// Whether [`DataType::coerce`] would return `value` unchanged: it already has this type's
    /// representation and fits. Exact where it says yes; it says no for the types whose check
    /// costs as much as the conversion (`decimal`, `datetime2`, `nchar`), which then convert.
    pub fn holds_as_is(&self, value: &Value) -> bool {
        if value.is_null() {
            return true;
        }
        if self.validate().is_err() {
            return false;
        }
        match (*self, value) {
            (DataType::TinyInt, Value::TinyInt(_))
            | (DataType::SmallInt, Value::SmallInt(_))
            | (DataType::Int, Value::Int(_))
            | (DataType::BigInt, Value::BigInt(_))
            | (DataType::Bit, Value::Bit(_))
            | (DataType::Money, Value::Money(_))
            | (DataType::Date, Value::Date(_))
            | (DataType::UniqueIdentifier, Value::Uuid(_)) => true,
            // A string never has more UTF-16 code units than UTF-8 bytes.
            (DataType::VarChar(n) | DataType::NVarChar(n), Value::String(s)) => {
                s.len() <= usize::from(n)
            }
            (DataType::Char(n), Value::String(s)) => s.len() == usize::from(n),
            (DataType::VarBinary(n), Value::Binary(b)) => b.len() <= usize::from(n),
            _ => false,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Parses a type name: `int`, `integer`, `decimal(10,2)`, `numeric(5)`, `decimal` (= 18,0),
/// `varchar(100)`, `char` (= 1), `datetime2` (= 7), `uniqueidentifier`, ... (any case,
/// spaces allowed around the arguments). The result is validated.
impl FromStr for DataType {
    type Err = ValueError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || ValueError::invalid_type(format!("Unknown data type '{text}'."));
        let trimmed = text.trim();
        let (name, args) = match trimmed.split_once('(') {
            Some((name, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(bad)?;
                (name.trim(), Some(inner))
            }
            None => (trimmed, None),
        };
        let name = name.to_ascii_lowercase();
        let mut numbers = [0u16; 2];
        let mut count = 0usize;
        if let Some(args) = args {
            for part in args.split(',') {
                let part = part.trim();
                if part.eq_ignore_ascii_case("max") {
                    return Err(ValueError::invalid_type(format!(
                        "'{text}': (max) types are not supported; the largest length is {MAX_BYTE_LENGTH} bytes."
                    )));
                }
                let slot = numbers.get_mut(count).ok_or_else(bad)?;
                *slot = part.parse::<u16>().map_err(|_| bad())?;
                count += 1;
            }
            if count == 0 {
                return Err(bad());
            }
        }
        let one = |default: u16| -> Result<u16, ValueError> {
            match count {
                0 => Ok(default),
                1 => Ok(numbers[0]),
                _ => Err(bad()),
            }
        };
        let small = |n: u16| u8::try_from(n).map_err(|_| bad());
        let ty = match name.as_str() {
            "tinyint" | "smallint" | "int" | "integer" | "bigint" | "bit" | "money" | "date"
            | "uniqueidentifier"
                if count > 0 =>
            {
                return Err(bad());
            }
            "tinyint" => DataType::TinyInt,
            "smallint" => DataType::SmallInt,
            "int" | "integer" => DataType::Int,
            "bigint" => DataType::BigInt,
            "bit" => DataType::Bit,
            "money" => DataType::Money,
            "date" => DataType::Date,
            "uniqueidentifier" => DataType::UniqueIdentifier,
            "decimal" | "numeric" | "dec" => match count {
                0 => DataType::Decimal {
                    precision: 18,
                    scale: 0,
                },
                1 => DataType::Decimal {
                    precision: small(numbers[0])?,
                    scale: 0,
                },
                _ => DataType::Decimal {
                    precision: small(numbers[0])?,
                    scale: small(numbers[1])?,
                },
            },
            "char" | "character" => DataType::Char(one(1)?),
            "varchar" => DataType::VarChar(one(1)?),
            "nchar" => DataType::NChar(one(1)?),
            "nvarchar" => DataType::NVarChar(one(1)?),
            "varbinary" => DataType::VarBinary(one(1)?),
            "datetime2" => DataType::DateTime2(small(one(7)?)?),
            _ => return Err(bad()),
        };
        ty.validate()?;
        Ok(ty)
    }
}

// ---------------------------------------------------------------------------------------------
// Coercion helpers
// ---------------------------------------------------------------------------------------------

/// Outcome of parsing integer text that is not a number.
enum IntTextError {
    Invalid,
    Overflow,
}

/// Parses trimmed integer text: optional sign, digits. Empty text is 0 (SQL Server's rule).
fn parse_int_text(text: &str) -> Result<i128, IntTextError> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    let (negative, digits) = split_sign(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IntTextError::Invalid);
    }
    let mut v: i128 = 0;
    for b in digits.bytes() {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i128::from(b - b'0')))
            .ok_or(IntTextError::Overflow)?;
    }
    Ok(if negative { -v } else { v })
}

fn split_sign(t: &str) -> (bool, &str) {
    if let Some(rest) = t.strip_prefix('-') {
        (true, rest)
    } else if let Some(rest) = t.strip_prefix('+') {
        (false, rest)
    } else {
        (false, t)
    }
}

/// Divides by `divisor` (> 0), rounding half away from zero.
fn div_round(v: i128, divisor: i128) -> i128 {
    let q = v / divisor;
    let r = (v % divisor).abs();
    if r >= divisor - r { q + v.signum() } else { q }
}

fn coerce_int(value: &Value, target: &DataType, min: i128, max: i128) -> Result<i128, ValueError> {
    let v = match value {
        Value::TinyInt(v) => i128::from(*v),
        Value::SmallInt(v) => i128::from(*v),
        Value::Int(v) => i128::from(*v),
        Value::BigInt(v) => i128::from(*v),
        Value::Bit(b) => i128::from(*b),
        Value::Decimal(d) => d.mantissa / pow10(d.scale),
        Value::Money(m) => div_round(i128::from(*m), i128::from(MONEY_SCALE_FACTOR)),
        Value::String(s) => match parse_int_text(s) {
            Ok(v) => v,
            Err(IntTextError::Invalid) => {
                return Err(ValueError::conversion(format!(
                    "Conversion failed when converting the varchar value '{s}' to data type {}.",
                    target.name()
                )));
            }
            Err(IntTextError::Overflow) => i128::MAX,
        },
        other => return Err(ValueError::clash(other, target)),
    };
    if v < min || v > max {
        if let Value::String(s) = value {
            let name = target.name();
            let article = if name.starts_with('i') { "an" } else { "a" };
            return Err(ValueError::overflow(format!(
                "The conversion of the varchar value '{s}' overflowed {article} {name} column."
            )));
        }
        return Err(ValueError::arithmetic_overflow(&target.name()));
    }
    Ok(v)
}

fn coerce_bit(value: Value, target: &DataType) -> Result<bool, ValueError> {
    Ok(match value {
        Value::Bit(b) => b,
        Value::TinyInt(v) => v != 0,
        Value::SmallInt(v) => v != 0,
        Value::Int(v) => v != 0,
        Value::BigInt(v) => v != 0,
        Value::Decimal(d) => d.mantissa != 0,
        Value::Money(m) => m != 0,
        Value::String(s) => {
            let t = s.trim();
            if t.eq_ignore_ascii_case("true") {
                true
            } else if t.eq_ignore_ascii_case("false") {
                false
            } else {
                match parse_int_text(t) {
                    Ok(v) => v != 0,
                    Err(IntTextError::Overflow) => true,
                    Err(IntTextError::Invalid) => {
                        return Err(ValueError::conversion(format!(
                            "Conversion failed when converting the varchar value '{s}' to data type bit."
                        )));
                    }
                }
            }
        }
        other => return Err(ValueError::clash(&other, target)),
    })
}

fn coerce_decimal(
    value: Value,
    target: &DataType,
    precision: u8,
    scale: u8,
) -> Result<Decimal, ValueError> {
    let overflow = |source: &str| {
        ValueError::overflow(format!(
            "Arithmetic overflow error converting {source} to data type numeric."
        ))
    };
    let source = match value.data_type_name() {
        "decimal" => "numeric",
        other => other,
    };
    let decimal = match value {
        Value::TinyInt(v) => Decimal::from(i64::from(v)),
        Value::SmallInt(v) => Decimal::from(i64::from(v)),
        Value::Int(v) => Decimal::from(i64::from(v)),
        Value::BigInt(v) => Decimal::from(v),
        Value::Bit(b) => Decimal::from(i64::from(b)),
        Value::Decimal(d) => d,
        Value::Money(m) => Decimal {
            mantissa: i128::from(m),
            scale: 4,
        },
        Value::String(s) => {
            return match parse_decimal_at_scale(s.trim(), scale) {
                Ok(d) if d.fits_precision(precision) => Ok(d),
                Ok(_) | Err(DecimalTextError::Overflow) => Err(overflow("varchar")),
                Err(DecimalTextError::Invalid) => Err(ValueError::conversion(format!(
                    "Error converting data type varchar to numeric: '{s}' is not a number."
                ))),
            };
        }
        other => return Err(ValueError::clash(&other, target)),
    };
    match decimal.rescale(scale) {
        Ok(d) if d.fits_precision(precision) => Ok(d),
        _ => Err(overflow(source)),
    }
}

fn coerce_money(value: Value, target: &DataType) -> Result<i64, ValueError> {
    let overflow = || ValueError::arithmetic_overflow("money");
    let from_i128 = |v: Option<i128>| v.and_then(|v| i64::try_from(v).ok()).ok_or_else(overflow);
    match value {
        Value::Money(m) => Ok(m),
        Value::TinyInt(v) => Ok(i64::from(v) * MONEY_SCALE_FACTOR),
        Value::SmallInt(v) => Ok(i64::from(v) * MONEY_SCALE_FACTOR),
        Value::Int(v) => Ok(i64::from(v) * MONEY_SCALE_FACTOR),
        Value::BigInt(v) => v.checked_mul(MONEY_SCALE_FACTOR).ok_or_else(overflow),
        Value::Bit(b) => Ok(i64::from(b) * MONEY_SCALE_FACTOR),
        Value::Decimal(d) => from_i128(d.rescale(4).ok().map(|d| d.mantissa)),
        Value::String(s) => {
            let t = s.trim();
            if t.is_empty() {
                return Ok(0);
            }
            // SQL Server accepts a currency sign: '$12.50', '-$12.50', '$-12.50'.
            let (sign_first, rest) = split_sign(t);
            let (negative, rest) = match rest.strip_prefix('$') {
                Some(after) if !t.starts_with(['+', '-']) => split_sign(after),
                Some(after) => (sign_first, after),
                None => (sign_first, rest),
            };
            if rest.starts_with(['+', '-']) {
                return Err(ValueError::conversion(format!(
                    "Cannot convert a char value to money. The char value '{s}' has incorrect syntax."
                )));
            }
            match parse_decimal_at_scale(rest, 4) {
                Ok(d) => from_i128(Some(if negative { -d.mantissa } else { d.mantissa })),
                Err(DecimalTextError::Overflow) => Err(overflow()),
                Err(DecimalTextError::Invalid) => Err(ValueError::conversion(format!(
                    "Cannot convert a char value to money. The char value '{s}' has incorrect syntax."
                ))),
            }
        }
        other => Err(ValueError::clash(&other, target)),
    }
}

/// The text of a value converted to a character type.
fn text_of(value: Value, target: &DataType) -> Result<String, ValueError> {
    Ok(match value {
        Value::String(s) => s,
        Value::TinyInt(v) => v.to_string(),
        Value::SmallInt(v) => v.to_string(),
        Value::Int(v) => v.to_string(),
        Value::BigInt(v) => v.to_string(),
        Value::Bit(b) => if b { "1" } else { "0" }.to_owned(),
        Value::Decimal(d) => d.to_string(),
        // CAST(money AS varchar) uses two decimals, as SQL Server's style 0 does.
        Value::Money(m) => Decimal {
            mantissa: div_round(i128::from(m), 100),
            scale: 2,
        }
        .to_string(),
        Value::Date(d) => d.to_string(),
        Value::DateTime2(dt) => dt.to_string(),
        Value::Uuid(u) => u.to_string(),
        // NCHAR and NVARCHAR hold UTF-16 in SQL Server, and a binary converts to them as its
        // code units, little-endian, two bytes each (an odd last byte is padded with a zero:
        // CAST(CAST(0x41 AS nvarchar) AS varbinary) is 0x4100). CHAR and VARCHAR take the
        // bytes as they are: here, UTF-8.
        Value::Binary(b) if matches!(target, DataType::NChar(_) | DataType::NVarChar(_)) => {
            let units: Vec<u16> = b
                .chunks(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair.get(1).copied().unwrap_or(0)]))
                .collect();
            String::from_utf16(&units).map_err(|_| {
                ValueError::conversion(format!(
                    "Cannot convert varbinary to {}: the bytes are not valid UTF-16.",
                    target.name()
                ))
            })?
        }
        Value::Binary(b) => String::from_utf8(b).map_err(|_| {
            ValueError::conversion(format!(
                "Cannot convert varbinary to {}: the bytes are not valid UTF-8.",
                target.name()
            ))
        })?,
        Value::Null => String::new(),
    })
}

/// Fits text to a byte length: excess trailing spaces are dropped, other excess is an error;
/// `pad` pads with spaces to exactly `n` bytes.
fn fit_bytes(mut s: String, n: usize, pad: bool) -> Result<String, ValueError> {
    if s.len() > n {
        let excess_is_spaces = s
            .as_bytes()
            .get(n..)
            .is_some_and(|rest| rest.iter().all(|&b| b == b' '));
        if excess_is_spaces && s.is_char_boundary(n) {
            s.truncate(n);
        } else {
            return Err(ValueError::truncation(s.len(), n, "bytes"));
        }
    }
    if pad {
        let missing = n - s.len();
        s.reserve(missing);
        s.extend(std::iter::repeat_n(' ', missing));
    }
    Ok(s)
}

/// Number of UTF-16 code units of `s`.
pub(crate) fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// Fits text to a length in UTF-16 code units, like [`fit_bytes`].
fn fit_units(mut s: String, n: usize, pad: bool) -> Result<String, ValueError> {
    // A string never has more UTF-16 code units than UTF-8 bytes: short text needs no count.
    if s.len() <= n && !pad {
        return Ok(s);
    }
    let units = utf16_len(&s);
    if units > n {
        let excess = units - n;
        let trailing_spaces = s.bytes().rev().take_while(|&b| b == b' ').count();
        if trailing_spaces < excess {
            return Err(ValueError::truncation(units, n, "characters"));
        }
        s.truncate(s.len() - excess);
        return Ok(s);
    }
    if pad {
        let missing = n - units;
        s.reserve(missing);
        s.extend(std::iter::repeat_n(' ', missing));
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Decimal
// ---------------------------------------------------------------------------------------------

/// An exact decimal number: `mantissa / 10^scale`, with `|mantissa| < 10^38` and
/// `scale <= 38`.
///
/// Equality, ordering and hashing are numeric (`1.50 == 1.5`); `Display` shows all `scale`
/// digits (`"12.50"`). Parsing accepts `[+-]digits[.digits]` (also `.5` and `5.`).
#[derive(Clone, Copy, Debug)]
pub struct Decimal {
    mantissa: i128,
    scale: u8,
}

enum DecimalTextError {
    Invalid,
    Overflow,
}

/// Parses `[+-]int[.frac]` at `scale` fractional digits, rounding half away from zero.
fn parse_decimal_at_scale(text: &str, scale: u8) -> Result<Decimal, DecimalTextError> {
    let (negative, body) = split_sign(text);
    let (int_digits, frac_digits) = body.split_once('.').unwrap_or((body, ""));
    if (int_digits.is_empty() && frac_digits.is_empty())
        || !int_digits.bytes().all(|b| b.is_ascii_digit())
        || !frac_digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(DecimalTextError::Invalid);
    }
    let scale = scale.min(MAX_DECIMAL_PRECISION);
    let used_frac = frac_digits.get(..usize::from(scale)).unwrap_or(frac_digits);
    let mut m: i128 = 0;
    for b in int_digits.bytes().chain(used_frac.bytes()) {
        m = m
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(b - b'0')))
            .ok_or(DecimalTextError::Overflow)?;
    }
    let missing = usize::from(scale) - used_frac.len();
    m = m
        .checked_mul(pow10(missing as u8))
        .ok_or(DecimalTextError::Overflow)?;
    if frac_digits
        .as_bytes()
        .get(usize::from(scale))
        .is_some_and(|&b| b >= b'5')
    {
        m = m.checked_add(1).ok_or(DecimalTextError::Overflow)?;
    }
    if m >= POW10[38] {
        return Err(DecimalTextError::Overflow);
    }
    Ok(Decimal {
        mantissa: if negative { -m } else { m },
        scale,
    })
}

impl Decimal {
    /// Zero, scale 0.
    pub const ZERO: Decimal = Decimal {
        mantissa: 0,
        scale: 0,
    };

    /// `mantissa / 10^scale`; fails unless `scale <= 38` and `|mantissa| < 10^38`.
    pub fn new(mantissa: i128, scale: u8) -> Result<Decimal, ValueError> {
        if scale > MAX_DECIMAL_PRECISION {
            return Err(ValueError::overflow(format!(
                "The scale {scale} of a decimal value is out of range (at most {MAX_DECIMAL_PRECISION})."
            )));
        }
        if mantissa.unsigned_abs() >= POW10[38].unsigned_abs() {
            return Err(ValueError::overflow(
                "A decimal value has more than 38 digits: Arithmetic overflow error converting expression to data type numeric.",
            ));
        }
        Ok(Decimal { mantissa, scale })
    }

    /// The unscaled integer: the value is `mantissa / 10^scale`.
    pub fn mantissa(&self) -> i128 {
        self.mantissa
    }

    /// Digits after the decimal point.
    pub fn scale(&self) -> u8 {
        self.scale
    }

    /// Digits the value needs: `max(digits of the mantissa, scale, 1)`, so `0.05` has
    /// precision 2 and `123.4` has precision 4.
    pub fn precision(&self) -> u8 {
        let abs = self.mantissa.unsigned_abs();
        let digits = POW10.iter().take_while(|p| p.unsigned_abs() <= abs).count() as u8;
        digits.max(self.scale).max(1)
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// Whether the value fits `decimal(precision, self.scale())`: `|mantissa| < 10^precision`.
    pub fn fits_precision(&self, precision: u8) -> bool {
        precision <= MAX_DECIMAL_PRECISION
            && self.mantissa.unsigned_abs() < pow10(precision).unsigned_abs()
    }

    /// The same value at `scale` digits, rounded half away from zero when digits are
    /// dropped; fails when the result would need more than 38 digits.
    pub fn rescale(&self, scale: u8) -> Result<Decimal, ValueError> {
        let overflow = || {
            ValueError::overflow(
                "Arithmetic overflow error converting numeric to data type numeric.",
            )
        };
        if scale > MAX_DECIMAL_PRECISION {
            return Err(overflow());
        }
        let mantissa = match scale.cmp(&self.scale) {
            Ordering::Equal => self.mantissa,
            Ordering::Greater => self
                .mantissa
                .checked_mul(pow10(scale - self.scale))
                .filter(|m| m.unsigned_abs() < POW10[38].unsigned_abs())
                .ok_or_else(overflow)?,
            Ordering::Less => div_round(self.mantissa, pow10(self.scale - scale)),
        };
        Ok(Decimal { mantissa, scale })
    }

    /// The same value at `scale` digits if that loses nothing; `None` when digits would be
    /// dropped or the result needs more than 38 digits.
    pub fn rescale_exact(&self, scale: u8) -> Option<Decimal> {
        if scale >= self.scale {
            self.rescale(scale).ok()
        } else {
            let divisor = pow10(self.scale - scale);
            (self.mantissa % divisor == 0).then(|| Decimal {
                mantissa: self.mantissa / divisor,
                scale,
            })
        }
    }

    /// The integer part (truncated toward zero).
    pub fn trunc(&self) -> i128 {
        self.mantissa / pow10(self.scale)
    }

    /// The value as `f64` (approximate).
    pub fn to_f64(&self) -> f64 {
        self.mantissa as f64 / pow10(self.scale) as f64
    }

    /// The value without trailing fractional zeros (`1.500` -> `1.5`).
    pub fn normalized(&self) -> Decimal {
        let mut d = *self;
        while d.scale > 0 && d.mantissa % 10 == 0 {
            d.mantissa /= 10;
            d.scale -= 1;
        }
        d
    }
}

impl From<i64> for Decimal {
    fn from(v: i64) -> Self {
        Decimal {
            mantissa: i128::from(v),
            scale: 0,
        }
    }
}

impl From<i32> for Decimal {
    fn from(v: i32) -> Self {
        Decimal {
            mantissa: i128::from(v),
            scale: 0,
        }
    }
}

impl Ord for Decimal {
    fn cmp(&self, other: &Self) -> Ordering {
        if self.scale == other.scale {
            return self.mantissa.cmp(&other.mantissa);
        }
        let (a_int, a_frac) = (
            self.mantissa / pow10(self.scale),
            self.mantissa % pow10(self.scale),
        );
        let (b_int, b_frac) = (
            other.mantissa / pow10(other.scale),
            other.mantissa % pow10(other.scale),
        );
        // Integer parts are truncated toward zero and fractional parts carry the sign of
        // their mantissa, so comparing (int, frac) pairs in that order is numeric order.
        a_int.cmp(&b_int).then_with(|| {
            let scale = self.scale.max(other.scale);
            // |frac| < 10^scale_of_its_own, so scaling up to `scale` stays below 10^38.
            let a = a_frac * pow10(scale - self.scale);
            let b = b_frac * pow10(scale - other.scale);
            a.cmp(&b)
        })
    }
}

impl PartialOrd for Decimal {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Decimal {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Decimal {}

impl Hash for Decimal {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let n = self.normalized();
        n.mantissa.hash(state);
        n.scale.hash(state);
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abs = self.mantissa.unsigned_abs();
        let divisor = pow10(self.scale).unsigned_abs();
        let digits = if self.scale == 0 {
            abs.to_string()
        } else {
            let width = usize::from(self.scale);
            format!("{}.{:0width$}", abs / divisor, abs % divisor)
        };
        f.pad_integral(self.mantissa >= 0, "", &digits)
    }
}

impl FromStr for Decimal {
    type Err = ValueError;

    /// Parses `[+-]digits[.digits]`; the scale is the number of fractional digits (more
    /// than 38 are rounded away).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let frac_len = text.split_once('.').map_or(0, |(_, f)| f.len());
        let scale = frac_len.min(usize::from(MAX_DECIMAL_PRECISION)) as u8;
        parse_decimal_at_scale(text, scale).map_err(|e| match e {
            DecimalTextError::Invalid => {
                ValueError::conversion(format!("'{text}' is not a valid decimal number."))
            }
            DecimalTextError::Overflow => ValueError::overflow(format!(
                "'{text}' has more than {MAX_DECIMAL_PRECISION} digits."
            )),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Date, DateTime2
// ---------------------------------------------------------------------------------------------

/// A calendar date: days since 0001-01-01 in the proleptic Gregorian calendar, from
/// 0001-01-01 (day 0) through 9999-12-31 (day 3 652 058). Text form `YYYY-MM-DD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date(i32);

/// Days from 0001-01-01 to 1970-01-01.
const UNIX_EPOCH_DAY: i64 = 719_162;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 0,
    }
}

impl Date {
    /// 0001-01-01.
    pub const MIN: Date = Date(0);
    /// 9999-12-31.
    pub const MAX: Date = Date(3_652_058);

    /// The date `days` days after 0001-01-01; fails outside 0001-01-01..=9999-12-31.
    pub fn from_days(days: i32) -> Result<Date, ValueError> {
        if (Self::MIN.0..=Self::MAX.0).contains(&days) {
            Ok(Date(days))
        } else {
            Err(ValueError::overflow(format!(
                "Day number {days} is outside the date range 0001-01-01 through 9999-12-31."
            )))
        }
    }

    /// Days since 0001-01-01.
    pub fn days(&self) -> i32 {
        self.0
    }

    /// The date `year-month-day`; fails for dates that do not exist (2023-02-29) or lie
    /// outside 0001-01-01..=9999-12-31.
    pub fn from_ymd(year: i32, month: u32, day: u32) -> Result<Date, ValueError> {
        if !(1..=9999).contains(&year)
            || !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(year, month)
        {
            return Err(ValueError::conversion(format!(
                "{year:04}-{month:02}-{day:02} is not a valid date between 0001-01-01 and 9999-12-31."
            )));
        }
        let days =
            days_from_civil(i64::from(year), i64::from(month), i64::from(day)) + UNIX_EPOCH_DAY;
        Ok(Date(days as i32))
    }

    /// Year, month (1..=12) and day (1..=31).
    pub fn ymd(&self) -> (i32, u32, u32) {
        let (y, m, d) = civil_from_days(i64::from(self.0) - UNIX_EPOCH_DAY);
        (y as i32, m, d)
    }

    /// Today's date in UTC.
    pub fn today_utc() -> Date {
        DateTime2::now_utc().date()
    }

    /// The next day, if it is not past 9999-12-31.
    pub fn succ(&self) -> Option<Date> {
        (self.0 < Self::MAX.0).then_some(Date(self.0 + 1))
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = self.ymd();
        f.pad(&format!("{y:04}-{m:02}-{d:02}"))
    }
}

/// Parses `YYYY-MM-DD` (or `YYYYMMDD`), nothing else.
fn parse_date_part(s: &str) -> Option<Date> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(r)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            digits
                .iter()
                .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')),
        )
    };
    let (y, m, d) = match b.len() {
        10 if b.get(4) == Some(&b'-') && b.get(7) == Some(&b'-') => {
            (num(0..4)?, num(5..7)?, num(8..10)?)
        }
        8 => (num(0..4)?, num(4..6)?, num(6..8)?),
        _ => return None,
    };
    Date::from_ymd(y as i32, m, d).ok()
}

impl FromStr for Date {
    type Err = ValueError;

    /// Parses `YYYY-MM-DD` (or `YYYYMMDD`); rejects dates that do not exist.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_date_part(text.trim()).ok_or_else(|| date_text_error(text))
    }
}

fn date_text_error(text: &str) -> ValueError {
    ValueError::conversion(format!(
        "Conversion failed when converting date and/or time from character string '{text}'."
    ))
}

/// A date and a time of day in 100-nanosecond ticks since midnight (`datetime2`). Text form
/// `YYYY-MM-DD hh:mm:ss.fffffff`; `Display` prints 7 fractional digits unless a precision is
/// given (`format!("{:.3}", dt)` prints 3, `{:.0}` none; digits are cut, not rounded: round
/// with [`DateTime2::round_to_precision`] first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DateTime2 {
    date: Date,
    ticks_100ns: u64,
}

impl DateTime2 {
    /// 0001-01-01 00:00:00.
    pub const MIN: DateTime2 = DateTime2 {
        date: Date::MIN,
        ticks_100ns: 0,
    };
    /// 9999-12-31 23:59:59.9999999.
    pub const MAX: DateTime2 = DateTime2 {
        date: Date::MAX,
        ticks_100ns: TICKS_PER_DAY - 1,
    };

    /// `date` at `ticks_100ns` 100-nanosecond ticks after midnight (less than a day).
    pub fn new(date: Date, ticks_100ns: u64) -> Result<DateTime2, ValueError> {
        if ticks_100ns >= TICKS_PER_DAY {
            return Err(ValueError::overflow(format!(
                "{ticks_100ns} ticks is not a time of day (a day has {TICKS_PER_DAY} ticks of 100 ns)."
            )));
        }
        Ok(DateTime2 { date, ticks_100ns })
    }

    /// Midnight of `date`.
    pub fn from_date(date: Date) -> DateTime2 {
        DateTime2 {
            date,
            ticks_100ns: 0,
        }
    }

    /// `date` at `hour:minute:second` plus `fraction_ticks` 100-ns ticks (< 10 000 000).
    pub fn from_hms(
        date: Date,
        hour: u32,
        minute: u32,
        second: u32,
        fraction_ticks: u32,
    ) -> Result<DateTime2, ValueError> {
        if hour > 23 || minute > 59 || second > 59 || u64::from(fraction_ticks) >= TICKS_PER_SECOND
        {
            return Err(ValueError::conversion(format!(
                "{hour:02}:{minute:02}:{second:02}.{fraction_ticks:07} is not a valid time of day."
            )));
        }
        let seconds = u64::from(hour) * 3600 + u64::from(minute) * 60 + u64::from(second);
        Ok(DateTime2 {
            date,
            ticks_100ns: seconds * TICKS_PER_SECOND + u64::from(fraction_ticks),
        })
    }

    /// The current UTC time (7 fractional digits).
    pub fn now_utc() -> DateTime2 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = since_epoch.as_secs();
        let days = (secs / 86_400) as i64 + UNIX_EPOCH_DAY;
        let ticks =
            (secs % 86_400) * TICKS_PER_SECOND + u64::from(since_epoch.subsec_nanos() / 100);
        let date = Date::from_days(i32::try_from(days).unwrap_or(Date::MAX.0)).unwrap_or(Date::MAX);
        DateTime2 {
            date,
            ticks_100ns: ticks,
        }
    }

    /// The date part.
    pub fn date(&self) -> Date {
        self.date
    }

    /// 100-ns ticks since midnight.
    pub fn ticks(&self) -> u64 {
        self.ticks_100ns
    }

    /// Hour, minute, second and the fraction of the second in 100-ns ticks.
    pub fn hms(&self) -> (u32, u32, u32, u32) {
        let secs = self.ticks_100ns / TICKS_PER_SECOND;
        let frac = (self.ticks_100ns % TICKS_PER_SECOND) as u32;
        (
            (secs / 3600) as u32,
            (secs / 60 % 60) as u32,
            (secs % 60) as u32,
            frac,
        )
    }

    /// Rounds (half up) to `precision` fractional-second digits, carrying into the next day;
    /// fails past 9999-12-31 23:59:59.9999999 or for a precision above 7.
    pub fn round_to_precision(&self, precision: u8) -> Result<DateTime2, ValueError> {
        if precision > MAX_DATETIME2_PRECISION {
            return Err(ValueError::invalid_type(format!(
                "The precision {precision} given to type datetime2 is invalid: it must be between 0 and 7."
            )));
        }
        let unit = 10u64.pow(u32::from(MAX_DATETIME2_PRECISION - precision));
        let rem = self.ticks_100ns % unit;
        let mut ticks = self.ticks_100ns - rem;
        if rem * 2 >= unit {
            ticks += unit;
        }
        if ticks >= TICKS_PER_DAY {
            let date = self.date.succ().ok_or_else(|| {
                ValueError::overflow(
                    "The conversion of a datetime2 value resulted in an out-of-range value (after 9999-12-31).",
                )
            })?;
            return Ok(DateTime2 {
                date,
                ticks_100ns: ticks - TICKS_PER_DAY,
            });
        }
        Ok(DateTime2 {
            date: self.date,
            ticks_100ns: ticks,
        })
    }

    /// Writes the value with `precision` fractional digits (0..=7).
    fn write_with_precision(&self, f: &mut fmt::Formatter<'_>, precision: usize) -> fmt::Result {
        let (h, mi, s, frac) = self.hms();
        let precision = precision.min(7);
        if precision == 0 {
            write!(f, "{} {h:02}:{mi:02}:{s:02}", self.date)
        } else {
            let digits = frac / 10u32.pow(7 - precision as u32);
            write!(
                f,
                "{} {h:02}:{mi:02}:{s:02}.{digits:0precision$}",
                self.date
            )
        }
    }
}

impl fmt::Display for DateTime2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_with_precision(f, f.precision().unwrap_or(7))
    }
}

/// Parses `YYYY-MM-DD[( |T)hh:mm[:ss[.f{1,7}]]]` (date also as `YYYYMMDD`). Empty text is
/// 1900-01-01 00:00, as in SQL Server.
fn parse_datetime_text(text: &str) -> Result<DateTime2, ValueError> {
    let t = text.trim();
    if t.is_empty() {
        // SQL Server's CAST('' AS date/datetime2) is 1900-01-01.
        return Ok(DateTime2::from_date(Date(693_595)));
    }
    let (date_part, time_part) = match t.find([' ', 'T', 't']) {
        Some(i) => (
            t.get(..i).unwrap_or(""),
            Some(t.get(i + 1..).unwrap_or("").trim_start()),
        ),
        None => (t, None),
    };
    let date = parse_date_part(date_part).ok_or_else(|| date_text_error(text))?;
    let Some(time) = time_part else {
        return Ok(DateTime2::from_date(date));
    };
    let parse_time = || -> Option<DateTime2> {
        let (hms, frac) = match time.split_once('.') {
            Some((hms, frac)) => (hms, Some(frac)),
            None => (time, None),
        };
        let mut fields = [0u32; 3];
        let mut count = 0;
        for part in hms.split(':') {
            if part.is_empty() || part.len() > 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            *fields.get_mut(count)? = part.parse().ok()?;
            count += 1;
        }
        if count < 2 || (frac.is_some() && count < 3) {
            return None;
        }
        let fraction_ticks = match frac {
            Some(f) if !f.is_empty() && f.len() <= 7 && f.bytes().all(|b| b.is_ascii_digit()) => {
                f.parse::<u32>().ok()? * 10u32.pow(7 - f.len() as u32)
            }
            Some(_) => return None,
            None => 0,
        };
        DateTime2::from_hms(date, fields[0], fields[1], fields[2], fraction_ticks).ok()
    };
    parse_time().ok_or_else(|| date_text_error(text))
}

impl FromStr for DateTime2 {
    type Err = ValueError;

    /// Parses `YYYY-MM-DD[( |T)hh:mm[:ss[.fffffff]]]` (up to 7 fractional digits).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Err(date_text_error(text));
        }
        parse_datetime_text(text)
    }
}

// ---------------------------------------------------------------------------------------------
// Uuid
// ---------------------------------------------------------------------------------------------

/// A `uniqueidentifier`: 16 bytes in text order (`6F9619FF-8B86-D011-B42D-00C04FD430C8` is
/// `[0x6F, 0x96, 0x19, 0xFF, 0x8B, 0x86, ...]`). Its `Ord` is SQL Server's order (see
/// [`Uuid::sql_order_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uuid([u8; 16]);

impl Uuid {
    /// The all-zero GUID.
    pub const NIL: Uuid = Uuid([0; 16]);

    /// A GUID from its 16 bytes in text order.
    pub fn from_bytes(bytes: [u8; 16]) -> Uuid {
        Uuid(bytes)
    }

    /// The 16 bytes in text order.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// A random (version 4) GUID, like `NEWID()`.
    pub fn new_v4() -> Uuid {
        let mut b: [u8; 16] = rand::random();
        b[6] = (b[6] & 0x0F) | 0x40;
        b[8] = (b[8] & 0x3F) | 0x80;
        Uuid(b)
    }

    /// The bytes reordered so that comparing them with `memcmp` gives SQL Server's order of
    /// `uniqueidentifier`.
    ///
    /// SQL Server stores a GUID as .NET's `Guid.ToByteArray()` does: the first three groups
    /// little-endian (text bytes `3 2 1 0 | 5 4 | 7 6 | 8 9 | 10..16`). It compares the stored
    /// bytes in the order 10 11 12 13 14 15, 8 9, 6 7, 4 5, 0 1 2 3 (`SqlGuid`'s order), each
    /// byte unsigned. In text-order bytes `t` that is:
    /// `t[10..16], t[8], t[9], t[7], t[6], t[5], t[4], t[3], t[2], t[1], t[0]`: the last group
    /// is most significant, and within each of the first three groups the last byte comes
    /// first.
    pub fn sql_order_bytes(&self) -> [u8; 16] {
        let t = &self.0;
        [
            t[10], t[11], t[12], t[13], t[14], t[15], t[8], t[9], t[7], t[6], t[5], t[4], t[3],
            t[2], t[1], t[0],
        ]
    }

    /// The inverse of [`Uuid::sql_order_bytes`].
    pub fn from_sql_order_bytes(k: [u8; 16]) -> Uuid {
        Uuid([
            k[15], k[14], k[13], k[12], k[11], k[10], k[9], k[8], k[6], k[7], k[0], k[1], k[2],
            k[3], k[4], k[5],
        ])
    }

    /// Parses text converted to uniqueidentifier: as [`Uuid::parse_text`], but text longer than
    /// that (without braces) is cut to its first 36 bytes, as SQL Server does: for a conversion
    /// from text, uniqueidentifier counts as a character type of 36 and follows the truncation
    /// rules (`CONVERT(uniqueidentifier, '0E984725-C51C-4BF4-9960-E1C80E27ABA0wrong')` works).
    fn parse_converted_text(text: &str) -> Option<Uuid> {
        match text.get(..36) {
            Some(first) if text.len() > 36 && !text.starts_with('{') => Uuid::parse_text(first),
            _ => Uuid::parse_text(text),
        }
    }

    /// Parses `XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX` (any case, optionally in braces).
    fn parse_text(text: &str) -> Option<Uuid> {
        let inner = match text.strip_prefix('{') {
            Some(rest) => rest.strip_suffix('}')?,
            None => text,
        };
        let b = inner.as_bytes();
        if b.len() != 36 {
            return None;
        }
        let mut out = [0u8; 16];
        let mut i = 0;
        let mut n = 0;
        while i < 36 {
            if matches!(i, 8 | 13 | 18 | 23) {
                if b[i] != b'-' {
                    return None;
                }
                i += 1;
                continue;
            }
            let hi = hex_value(b[i])?;
            let lo = hex_value(*b.get(i + 1)?)?;
            *out.get_mut(n)? = hi << 4 | lo;
            n += 1;
            i += 2;
        }
        Some(Uuid(out))
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl Ord for Uuid {
    fn cmp(&self, other: &Self) -> Ordering {
        self.sql_order_bytes().cmp(&other.sql_order_bytes())
    }
}

impl PartialOrd for Uuid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.0;
        let mut s = String::with_capacity(36);
        for (i, byte) in t.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                s.push('-');
            }
            s.push_str(&format!("{byte:02X}"));
        }
        f.pad(&s)
    }
}

impl FromStr for Uuid {
    type Err = ValueError;

    /// Parses `6F9619FF-8B86-D011-B42D-00C04FD430C8` (any case, optionally in braces).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Uuid::parse_text(text.trim()).ok_or_else(|| {
            ValueError::conversion(format!(
                "Conversion failed when converting from a character string to uniqueidentifier: '{text}'."
            ))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Value
// ---------------------------------------------------------------------------------------------

/// One cell: `NULL` or a value of one of the column types. Text of all four character types
/// is a [`Value::String`]; after [`DataType::coerce`] a `char(n)` value is padded to `n`.
///
/// `PartialEq` is structural (`'a' != 'a '`, but `1.50 == 1.5` because [`Decimal`]'s equality
/// is numeric); SQL's comparison is the key encoding's byte order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// `tinyint`.
    TinyInt(u8),
    /// `smallint`.
    SmallInt(i16),
    /// `int`.
    Int(i32),
    /// `bigint`.
    BigInt(i64),
    /// `bit`.
    Bit(bool),
    /// `decimal(p,s)`.
    Decimal(Decimal),
    /// `money`, in 1/10000 units.
    Money(i64),
    /// `char`, `varchar`, `nchar`, `nvarchar`.
    String(String),
    /// `varbinary`.
    Binary(Vec<u8>),
    /// `date`.
    Date(Date),
    /// `datetime2`.
    DateTime2(DateTime2),
    /// `uniqueidentifier`.
    Uuid(Uuid),
}

impl Value {
    /// Whether the value is `NULL`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The name of the value's type as used in messages: `"int"`, `"varchar"`, `"decimal"`,
    /// `"null"`, ...
    pub fn data_type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::TinyInt(_) => "tinyint",
            Value::SmallInt(_) => "smallint",
            Value::Int(_) => "int",
            Value::BigInt(_) => "bigint",
            Value::Bit(_) => "bit",
            Value::Decimal(_) => "decimal",
            Value::Money(_) => "money",
            Value::String(_) => "varchar",
            Value::Binary(_) => "varbinary",
            Value::Date(_) => "date",
            Value::DateTime2(_) => "datetime2",
            Value::Uuid(_) => "uniqueidentifier",
        }
    }

    /// The value of an integer or `bit` value as `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::TinyInt(v) => Some(i64::from(*v)),
            Value::SmallInt(v) => Some(i64::from(*v)),
            Value::Int(v) => Some(i64::from(*v)),
            Value::BigInt(v) => Some(*v),
            Value::Bit(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// The exact numeric value of a number (an integer, bit, decimal or money value), for
    /// comparing numbers of different types as SQL Server does (in the type of higher
    /// precedence, so that nothing is rounded away); `None` for other values.
    pub fn as_exact_number(&self) -> Option<Decimal> {
        match self {
            Value::Decimal(d) => Some(*d),
            Value::Money(m) => Some(Decimal {
                mantissa: i128::from(*m),
                scale: 4,
            }),
            other => other.as_i64().map(Decimal::from),
        }
    }

    /// The exact instant of a date or datetime2 value (a date is its midnight), for comparing
    /// them as SQL Server does (in the type of higher precedence, so that no time of day or
    /// fraction of a second is rounded away); `None` for other values.
    pub fn as_exact_instant(&self) -> Option<DateTime2> {
        match self {
            Value::Date(date) => Some(DateTime2::from_date(*date)),
            Value::DateTime2(instant) => Some(*instant),
            _ => None,
        }
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a binary value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Binary(b) => Some(b),
            _ => None,
        }
    }
}

/// SQL-Server-like text: `NULL`, `42`, `1`/`0` for bit, `12.50`, money with four decimals
/// (`12.5000`), strings as they are, binary as `0x0A1B`, dates `2024-01-31`, `datetime2` with
/// 7 fractional digits unless a precision is given (`{:.3}`), GUIDs upper-case.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.pad("NULL"),
            Value::TinyInt(v) => fmt::Display::fmt(v, f),
            Value::SmallInt(v) => fmt::Display::fmt(v, f),
            Value::Int(v) => fmt::Display::fmt(v, f),
            Value::BigInt(v) => fmt::Display::fmt(v, f),
            Value::Bit(b) => f.pad(if *b { "1" } else { "0" }),
            Value::Decimal(d) => fmt::Display::fmt(d, f),
            Value::Money(m) => fmt::Display::fmt(
                &Decimal {
                    mantissa: i128::from(*m),
                    scale: 4,
                },
                f,
            ),
            Value::String(s) => f.pad(s),
            Value::Binary(b) => {
                let mut s = String::with_capacity(2 + 2 * b.len());
                s.push_str("0x");
                for byte in b {
                    s.push_str(&format!("{byte:02X}"));
                }
                f.pad(&s)
            }
            Value::Date(d) => fmt::Display::fmt(d, f),
            Value::DateTime2(dt) => fmt::Display::fmt(dt, f),
            Value::Uuid(u) => fmt::Display::fmt(u, f),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        })*
    };
}

value_from!(
    u8 => TinyInt,
    i16 => SmallInt,
    i32 => Int,
    i64 => BigInt,
    bool => Bit,
    Decimal => Decimal,
    String => String,
    Vec<u8> => Binary,
    Date => Date,
    DateTime2 => DateTime2,
    Uuid => Uuid,
);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Binary(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}
