//! Unit tests of the column types: validation, names, coercion, text conversions.

use lastpage_engine::types::{
    DataType, Date, DateTime2, Decimal, TICKS_PER_DAY, Uuid, Value, ValueError, ValueErrorKind,
};

fn dec(text: &str) -> Decimal {
    text.parse().unwrap()
}

fn coerce(ty: DataType, v: impl Into<Value>) -> Result<Value, ValueError> {
    ty.coerce(v.into())
}

fn err(ty: DataType, v: impl Into<Value>) -> ValueError {
    match coerce(ty, v) {
        Ok(ok) => panic!("{ty} accepted {ok:?}"),
        Err(e) => e,
    }
}

// ---- DataType ------------------------------------------------------------------------------

#[test]
fn validate_rejects_bad_parameters() {
    let bad = [
        DataType::Decimal {
            precision: 0,
            scale: 0,
        },
        DataType::Decimal {
            precision: 39,
            scale: 0,
        },
        DataType::Decimal {
            precision: 5,
            scale: 6,
        },
        DataType::Char(0),
        DataType::VarChar(8001),
        DataType::VarBinary(0),
        DataType::NChar(4001),
        DataType::NVarChar(0),
        DataType::DateTime2(8),
    ];
    for ty in bad {
        let e = ty.validate().unwrap_err();
        assert_eq!(e.kind(), ValueErrorKind::InvalidType, "{ty:?}");
        assert!(e.to_string().contains("invalid"), "{e}");
        // Coercing to a bad type is an error, not a panic.
        assert!(ty.coerce(Value::Int(1)).is_err());
    }
    assert!(
        DataType::VarChar(8001)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("between 1 and 8000")
    );
    for ok in [
        DataType::Decimal {
            precision: 38,
            scale: 38,
        },
        DataType::Decimal {
            precision: 1,
            scale: 0,
        },
        DataType::VarChar(8000),
        DataType::NVarChar(4000),
        DataType::DateTime2(0),
        DataType::DateTime2(7),
    ] {
        ok.validate().unwrap();
    }
}

#[test]
fn names_and_parsing() {
    let cases = [
        (DataType::TinyInt, "tinyint"),
        (DataType::Int, "int"),
        (
            DataType::Decimal {
                precision: 10,
                scale: 2,
            },
            "decimal(10,2)",
        ),
        (DataType::Money, "money"),
        (DataType::Char(10), "char(10)"),
        (DataType::VarChar(100), "varchar(100)"),
        (DataType::NChar(5), "nchar(5)"),
        (DataType::NVarChar(4000), "nvarchar(4000)"),
        (DataType::DateTime2(7), "datetime2(7)"),
        (DataType::Date, "date"),
        (DataType::UniqueIdentifier, "uniqueidentifier"),
        (DataType::VarBinary(16), "varbinary(16)"),
    ];
    for (ty, name) in cases {
        assert_eq!(ty.name(), name);
        assert_eq!(ty.to_string(), name);
        assert_eq!(name.parse::<DataType>().unwrap(), ty);
        assert_eq!(name.to_uppercase().parse::<DataType>().unwrap(), ty);
    }
    assert_eq!(
        "NUMERIC( 5 , 1 )".parse::<DataType>().unwrap(),
        DataType::Decimal {
            precision: 5,
            scale: 1
        }
    );
    assert_eq!(
        "decimal".parse::<DataType>().unwrap(),
        DataType::Decimal {
            precision: 18,
            scale: 0
        }
    );
    assert_eq!(
        "datetime2".parse::<DataType>().unwrap(),
        DataType::DateTime2(7)
    );
    assert_eq!("integer".parse::<DataType>().unwrap(), DataType::Int);
    for bad in [
        "varchar(max)",
        "varchar(9000)",
        "int(4)",
        "blob",
        "decimal(5,2,1)",
        "varchar(",
        "",
    ] {
        assert!(bad.parse::<DataType>().is_err(), "{bad}");
    }
}

#[test]
fn fixed_sizes() {
    assert_eq!(DataType::TinyInt.fixed_size(), Some(1));
    assert_eq!(DataType::Int.fixed_size(), Some(4));
    assert_eq!(DataType::Money.fixed_size(), Some(8));
    assert_eq!(
        DataType::Decimal {
            precision: 2,
            scale: 0
        }
        .fixed_size(),
        Some(1)
    );
    assert_eq!(
        DataType::Decimal {
            precision: 9,
            scale: 2
        }
        .fixed_size(),
        Some(4)
    );
    assert_eq!(
        DataType::Decimal {
            precision: 18,
            scale: 2
        }
        .fixed_size(),
        Some(8)
    );
    assert_eq!(
        DataType::Decimal {
            precision: 38,
            scale: 2
        }
        .fixed_size(),
        Some(16)
    );
    assert_eq!(DataType::Char(8000).fixed_size(), Some(8000));
    assert_eq!(DataType::NChar(10).fixed_size(), Some(20));
    assert_eq!(DataType::Date.fixed_size(), Some(3));
    assert_eq!(DataType::DateTime2(3).fixed_size(), Some(8));
    assert_eq!(DataType::UniqueIdentifier.fixed_size(), Some(16));
    assert_eq!(DataType::VarChar(10).fixed_size(), None);
    assert_eq!(DataType::NVarChar(10).max_row_size(), 20);
}

// ---- integers and bit ------------------------------------------------------------------------

#[test]
fn integer_overflow_errors() {
    let e = err(DataType::TinyInt, 256);
    assert_eq!(e.kind(), ValueErrorKind::Overflow);
    assert_eq!(
        e.to_string(),
        "Arithmetic overflow error converting expression to data type tinyint."
    );
    assert_eq!(err(DataType::TinyInt, -1).kind(), ValueErrorKind::Overflow);
    assert_eq!(
        err(DataType::Int, 2_147_483_648i64).to_string(),
        "Arithmetic overflow error converting expression to data type int."
    );
    assert_eq!(
        err(DataType::SmallInt, -32_769).to_string(),
        "Arithmetic overflow error converting expression to data type smallint."
    );
    assert_eq!(
        err(DataType::Int, "99999999999").to_string(),
        "The conversion of the varchar value '99999999999' overflowed an int column."
    );
    assert_eq!(
        coerce(DataType::Int, i64::from(i32::MIN)).unwrap(),
        Value::Int(i32::MIN)
    );
    assert_eq!(coerce(DataType::TinyInt, 255).unwrap(), Value::TinyInt(255));
    assert_eq!(coerce(DataType::BigInt, 7u8).unwrap(), Value::BigInt(7));
    assert_eq!(
        coerce(DataType::SmallInt, true).unwrap(),
        Value::SmallInt(1)
    );
}

#[test]
fn integers_from_text_decimal_and_money() {
    assert_eq!(coerce(DataType::Int, " -42 ").unwrap(), Value::Int(-42));
    assert_eq!(coerce(DataType::Int, "+7").unwrap(), Value::Int(7));
    assert_eq!(
        coerce(DataType::Int, "").unwrap(),
        Value::Int(0),
        "SQL Server: CAST('' AS int) = 0"
    );
    let e = err(DataType::Int, "12.5");
    assert_eq!(e.kind(), ValueErrorKind::Conversion);
    assert_eq!(
        e.to_string(),
        "Conversion failed when converting the varchar value '12.5' to data type int."
    );
    assert!(err(DataType::BigInt, "abc").to_string().contains("'abc'"));
    // decimal -> int truncates, money -> int rounds (as SQL Server does)
    assert_eq!(coerce(DataType::Int, dec("12.9")).unwrap(), Value::Int(12));
    assert_eq!(
        coerce(DataType::Int, dec("-12.9")).unwrap(),
        Value::Int(-12)
    );
    assert_eq!(
        DataType::Int.coerce(Value::Money(25_000)).unwrap(),
        Value::Int(3)
    );
    assert_eq!(
        DataType::Int.coerce(Value::Money(-25_000)).unwrap(),
        Value::Int(-3)
    );
    assert_eq!(
        DataType::Int.coerce(Value::Money(24_999)).unwrap(),
        Value::Int(2)
    );
    let e = err(DataType::Int, Date::from_ymd(2024, 1, 1).unwrap());
    assert_eq!(
        e.to_string(),
        "Operand type clash: date is incompatible with int"
    );
}

#[test]
fn bit_conversions() {
    assert_eq!(coerce(DataType::Bit, 5).unwrap(), Value::Bit(true));
    assert_eq!(coerce(DataType::Bit, 0).unwrap(), Value::Bit(false));
    assert_eq!(coerce(DataType::Bit, -1i64).unwrap(), Value::Bit(true));
    for (text, want) in [
        ("true", true),
        ("TRUE", true),
        (" False ", false),
        ("1", true),
        ("0", false),
    ] {
        assert_eq!(
            coerce(DataType::Bit, text).unwrap(),
            Value::Bit(want),
            "{text}"
        );
    }
    assert_eq!(
        coerce(DataType::Bit, dec("0.00")).unwrap(),
        Value::Bit(false)
    );
    let e = err(DataType::Bit, "yes");
    assert_eq!(
        e.to_string(),
        "Conversion failed when converting the varchar value 'yes' to data type bit."
    );
}

#[test]
fn null_passes_through() {
    for ty in [
        DataType::Int,
        DataType::Char(3),
        DataType::Date,
        DataType::Decimal {
            precision: 5,
            scale: 2,
        },
    ] {
        assert_eq!(ty.coerce(Value::Null).unwrap(), Value::Null);
    }
    assert_eq!(Value::from(None::<i32>), Value::Null);
}

// ---- decimal and money ---------------------------------------------------------------------

#[test]
fn decimal_rounding_and_precision() {
    let d52 = DataType::Decimal {
        precision: 5,
        scale: 2,
    };
    let got = |v: Value| match d52.coerce(v).unwrap() {
        Value::Decimal(d) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(got("123.456".into()).to_string(), "123.46");
    assert_eq!(got("123.454".into()).to_string(), "123.45");
    assert_eq!(
        got("-0.005".into()).to_string(),
        "-0.01",
        "half away from zero"
    );
    assert_eq!(got("  7 ".into()).to_string(), "7.00");
    assert_eq!(got(".5".into()).to_string(), "0.50");
    assert_eq!(got(12.into()).to_string(), "12.00");
    assert_eq!(got(Value::Decimal(dec("1.005"))).to_string(), "1.01");
    assert_eq!(got(Value::Money(123_456)).to_string(), "12.35");
    assert_eq!(got(Value::Decimal(dec("999.994"))).to_string(), "999.99");
    assert_eq!(got(Value::Decimal(dec("1.5"))).scale(), 2);

    let e = err(d52, 1000);
    assert_eq!(e.kind(), ValueErrorKind::Overflow);
    assert_eq!(
        e.to_string(),
        "Arithmetic overflow error converting int to data type numeric."
    );
    assert_eq!(
        err(d52, "999.995").to_string(),
        "Arithmetic overflow error converting varchar to data type numeric."
    );
    assert_eq!(
        d52.coerce(Value::Decimal(dec("-1000")))
            .unwrap_err()
            .to_string(),
        "Arithmetic overflow error converting numeric to data type numeric."
    );
    assert_eq!(err(d52, "1,5").kind(), ValueErrorKind::Conversion);
    assert_eq!(err(d52, "").kind(), ValueErrorKind::Conversion);
    assert_eq!(err(d52, "1e5").kind(), ValueErrorKind::Conversion);

    let d38 = DataType::Decimal {
        precision: 38,
        scale: 0,
    };
    let max = "9".repeat(38);
    assert_eq!(
        coerce(d38, max.as_str()).unwrap(),
        Value::Decimal(dec(&max))
    );
    assert_eq!(err(d38, format!("1{max}")).kind(), ValueErrorKind::Overflow);
    assert_eq!(
        coerce(d38, i64::MIN).unwrap().to_string(),
        i64::MIN.to_string()
    );
    // Many fractional digits are rounded away, not an error.
    let d38_2 = DataType::Decimal {
        precision: 38,
        scale: 2,
    };
    let long = format!("1.{}", "4".repeat(60));
    assert_eq!(coerce(d38_2, long.as_str()).unwrap().to_string(), "1.44");
}

#[test]
fn decimal_text_equality_and_order() {
    assert_eq!(dec("12.50").to_string(), "12.50");
    assert_eq!(dec("-0.05").to_string(), "-0.05");
    assert_eq!(dec("+3").to_string(), "3");
    assert_eq!(dec("5.").to_string(), "5");
    assert_eq!(dec("0012.50"), dec("12.5"));
    assert_eq!(dec("1.50"), dec("1.5"));
    assert!(dec("-1.5") < dec("-1.49"));
    assert!(dec("0.1") > dec("0.09999"));
    assert!(
        dec("99999999999999999999999999999999999999")
            > dec("0.00000000000000000000000000000000000001")
    );
    assert_eq!(Decimal::new(1250, 2).unwrap().precision(), 4);
    assert_eq!(dec("0.05").precision(), 2);
    assert!(Decimal::new(10i128.pow(38), 0).is_err());
    assert!(Decimal::new(1, 39).is_err());
    for bad in ["", "-", ".", "1.2.3", "1 2", "abc", "--1"] {
        assert!(bad.parse::<Decimal>().is_err(), "{bad}");
    }
    assert_eq!(format!("{:>8}", dec("-1.5")), "    -1.5");
}

#[test]
fn money_conversions() {
    let m = |v: Value| DataType::Money.coerce(v);
    assert_eq!(m("12.34567".into()).unwrap(), Value::Money(123_457));
    assert_eq!(m("$1.50".into()).unwrap(), Value::Money(15_000));
    assert_eq!(m("-$1.50".into()).unwrap(), Value::Money(-15_000));
    assert_eq!(m("$-1.50".into()).unwrap(), Value::Money(-15_000));
    assert_eq!(m("".into()).unwrap(), Value::Money(0));
    assert_eq!(m(3.into()).unwrap(), Value::Money(30_000));
    assert_eq!(m(Value::Decimal(dec("0.00005"))).unwrap(), Value::Money(1));
    assert_eq!(
        m(Value::BigInt(i64::MAX)).unwrap_err().to_string(),
        "Arithmetic overflow error converting expression to data type money."
    );
    assert_eq!(
        m("12x".into()).unwrap_err().kind(),
        ValueErrorKind::Conversion
    );
    assert_eq!(
        m("--1".into()).unwrap_err().kind(),
        ValueErrorKind::Conversion
    );
    assert_eq!(Value::Money(125_000).to_string(), "12.5000");
    assert_eq!(Value::Money(-1).to_string(), "-0.0001");
    // money -> varchar uses two decimals, as SQL Server's CAST does
    assert_eq!(
        DataType::VarChar(20).coerce(Value::Money(123_456)).unwrap(),
        Value::from("12.35")
    );
}

// ---- strings and binary --------------------------------------------------------------------

#[test]
fn char_pads_and_truncation_errors() {
    assert_eq!(
        coerce(DataType::Char(5), "ab").unwrap(),
        Value::from("ab   ")
    );
    assert_eq!(
        coerce(DataType::Char(3), "abc").unwrap(),
        Value::from("abc")
    );
    assert_eq!(
        coerce(DataType::VarChar(5), "ab").unwrap(),
        Value::from("ab")
    );
    assert_eq!(coerce(DataType::Char(4), 42).unwrap(), Value::from("42  "));

    let e = err(DataType::VarChar(3), "abcd");
    assert_eq!(e.kind(), ValueErrorKind::Truncation);
    assert_eq!(
        e.to_string(),
        "String or binary data would be truncated: value has 4 bytes, the limit is 3"
    );
    let e = e.with_column("name");
    assert_eq!(
        e.to_string(),
        "String or binary data would be truncated in column 'name': value has 4 bytes, the limit is 3"
    );
    assert_eq!(e.column(), Some("name"));
    // Lengths are bytes of UTF-8 for char/varchar.
    assert_eq!(
        err(DataType::Char(5), "日本").to_string(),
        "String or binary data would be truncated: value has 6 bytes, the limit is 5"
    );
    // Excess trailing spaces are dropped silently, as SQL Server does.
    assert_eq!(
        coerce(DataType::VarChar(3), "abc   ").unwrap(),
        Value::from("abc")
    );
    assert_eq!(
        coerce(DataType::Char(3), "a     ").unwrap(),
        Value::from("a  ")
    );
    assert_eq!(
        err(DataType::VarChar(3), "ab  c").kind(),
        ValueErrorKind::Truncation
    );
    // Other messages keep their wording when a column is named.
    let e = err(DataType::Int, "x").with_column("id");
    assert!(e.to_string().starts_with("Conversion failed"));
    assert_eq!(e.column(), Some("id"));
}

#[test]
fn nchar_counts_utf16_code_units() {
    assert_eq!(coerce(DataType::NChar(3), "a").unwrap(), Value::from("a  "));
    assert_eq!(
        coerce(DataType::NVarChar(3), "日本語").unwrap(),
        Value::from("日本語")
    );
    assert_eq!(
        coerce(DataType::NChar(3), "日本").unwrap(),
        Value::from("日本 ")
    );
    assert_eq!(
        coerce(DataType::NVarChar(2), "𝄞").unwrap(),
        Value::from("𝄞"),
        "one surrogate pair"
    );
    let e = err(DataType::NVarChar(2), "𝄞a");
    assert_eq!(
        e.to_string(),
        "String or binary data would be truncated: value has 3 characters, the limit is 2"
    );
    assert_eq!(
        err(DataType::NVarChar(3), "日本語x").kind(),
        ValueErrorKind::Truncation
    );
    assert_eq!(
        coerce(DataType::NVarChar(3), "日本語   ").unwrap(),
        Value::from("日本語")
    );
}

#[test]
fn text_from_other_types() {
    let v = |x: Value| DataType::VarChar(50).coerce(x).unwrap();
    assert_eq!(v(Value::Bit(true)), Value::from("1"));
    assert_eq!(v(Value::Decimal(dec("-1.50"))), Value::from("-1.50"));
    assert_eq!(
        v(Date::from_ymd(2024, 2, 29).unwrap().into()),
        Value::from("2024-02-29")
    );
    assert_eq!(v(Value::Binary(b"hi".to_vec())), Value::from("hi"));
    assert!(
        DataType::VarChar(50)
            .coerce(Value::Binary(vec![0xff]))
            .is_err()
    );
}

#[test]
fn varbinary() {
    assert_eq!(
        coerce(DataType::VarBinary(3), vec![1u8, 2, 3]).unwrap(),
        Value::Binary(vec![1, 2, 3])
    );
    let e = err(DataType::VarBinary(2), vec![1u8, 2, 3]);
    assert_eq!(
        e.to_string(),
        "String or binary data would be truncated: value has 3 bytes, the limit is 2"
    );
    assert_eq!(
        err(DataType::VarBinary(2), "ab").kind(),
        ValueErrorKind::Conversion
    );
    assert_eq!(Value::Binary(vec![0x01, 0xAB]).to_string(), "0x01AB");
}

// ---- dates ---------------------------------------------------------------------------------

#[test]
fn date_parsing_and_display() {
    for text in [
        "0001-01-01",
        "1900-01-01",
        "1970-01-01",
        "2000-02-29",
        "2024-12-31",
        "9999-12-31",
    ] {
        let d: Date = text.parse().unwrap();
        assert_eq!(d.to_string(), text);
        assert_eq!(Date::from_days(d.days()).unwrap(), d);
    }
    assert_eq!("0001-01-01".parse::<Date>().unwrap().days(), 0);
    assert_eq!("1900-01-01".parse::<Date>().unwrap().days(), 693_595);
    assert_eq!("1970-01-01".parse::<Date>().unwrap().days(), 719_162);
    assert_eq!("9999-12-31".parse::<Date>().unwrap(), Date::MAX);
    assert_eq!("20240131".parse::<Date>().unwrap().ymd(), (2024, 1, 31));
    for bad in [
        "2023-02-29",
        "1900-02-29",
        "2024-13-01",
        "2024-04-31",
        "2024-00-10",
        "2024-01-00",
        "0000-12-31",
        "10000-01-01",
        "2024-1-5",
        "2024/01/05",
        "",
        "abc",
    ] {
        assert!(bad.parse::<Date>().is_err(), "{bad}");
    }
    assert_eq!(
        err(DataType::Date, "2023-02-29").to_string(),
        "Conversion failed when converting date and/or time from character string '2023-02-29'."
    );
    assert!(Date::from_days(-1).is_err());
    assert!(Date::from_days(Date::MAX.days() + 1).is_err());
    // Every day of a few years round-trips through y/m/d.
    for days in (0..Date::MAX.days()).step_by(97).chain(730_000..731_000) {
        let d = Date::from_days(days).unwrap();
        let (y, m, dd) = d.ymd();
        assert_eq!(Date::from_ymd(y, m, dd).unwrap(), d);
    }
}

#[test]
fn date_coercion() {
    let d = |s: &str| Value::Date(s.parse().unwrap());
    assert_eq!(
        coerce(DataType::Date, "2024-01-31").unwrap(),
        d("2024-01-31")
    );
    assert_eq!(
        coerce(DataType::Date, " 2024-01-31 10:00:00 ").unwrap(),
        d("2024-01-31")
    );
    assert_eq!(
        coerce(DataType::Date, "").unwrap(),
        d("1900-01-01"),
        "SQL Server: CAST('' AS date)"
    );
    let dt: DateTime2 = "2024-01-31 23:59:59.9999999".parse().unwrap();
    assert_eq!(
        DataType::Date.coerce(Value::DateTime2(dt)).unwrap(),
        d("2024-01-31")
    );
    assert_eq!(
        err(DataType::Date, 20240131).kind(),
        ValueErrorKind::Conversion
    );
}

#[test]
fn datetime2_parsing_rounding_and_display() {
    let dt = |s: &str| s.parse::<DateTime2>().unwrap();
    let full = dt("2024-01-31T10:11:12.1234567");
    assert_eq!(full.to_string(), "2024-01-31 10:11:12.1234567");
    assert_eq!(dt(&full.to_string()), full);
    assert_eq!(format!("{full:.3}"), "2024-01-31 10:11:12.123");
    assert_eq!(format!("{full:.0}"), "2024-01-31 10:11:12");
    assert_eq!(dt("2024-01-31").to_string(), "2024-01-31 00:00:00.0000000");
    assert_eq!(
        dt("2024-01-31 10:11").to_string(),
        "2024-01-31 10:11:00.0000000"
    );
    assert_eq!(dt("2024-01-31 10:11:12.5").hms(), (10, 11, 12, 5_000_000));
    for bad in [
        "2024-01-31 24:00:00",
        "2024-01-31 10:60",
        "2024-01-31 10:11:60",
        "2024-01-31 10:11:12.12345678",
        "2024-01-31 10",
        "2024-01-31 10:11.5",
        "2024-01-31 10:11:12.",
        "2023-02-29 10:00",
        "",
    ] {
        assert!(bad.parse::<DateTime2>().is_err(), "{bad}");
    }

    let coerce_dt = |p: u8, s: &str| match DataType::DateTime2(p).coerce(s.into()).unwrap() {
        Value::DateTime2(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        coerce_dt(3, "2024-01-31 10:11:12.1234567").to_string(),
        "2024-01-31 10:11:12.1230000"
    );
    assert_eq!(
        coerce_dt(3, "2024-01-31 10:11:12.1235").to_string(),
        "2024-01-31 10:11:12.1240000"
    );
    assert_eq!(
        coerce_dt(3, "2024-01-31 23:59:59.9996").to_string(),
        "2024-02-01 00:00:00.0000000"
    );
    assert_eq!(
        coerce_dt(0, "2024-12-31 23:59:59.5").to_string(),
        "2025-01-01 00:00:00.0000000"
    );
    assert_eq!(coerce_dt(7, "2024-01-31 10:11:12.1234567"), full);
    let e = DataType::DateTime2(0)
        .coerce("9999-12-31 23:59:59.6".into())
        .unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Overflow);
    assert_eq!(
        coerce_dt(0, "9999-12-31 23:59:59.4").to_string(),
        "9999-12-31 23:59:59.0000000"
    );
    assert_eq!(
        DataType::DateTime2(2)
            .coerce(Value::Date("2024-05-06".parse().unwrap()))
            .unwrap(),
        Value::DateTime2(dt("2024-05-06"))
    );
    assert!(DateTime2::new(Date::MIN, TICKS_PER_DAY).is_err());
    let now = DateTime2::now_utc();
    assert!(now.date() > "2024-01-01".parse().unwrap());
    assert!(now.ticks() < TICKS_PER_DAY);
    assert_eq!(
        Value::DateTime2(full).to_string(),
        "2024-01-31 10:11:12.1234567"
    );
}

// ---- uniqueidentifier ----------------------------------------------------------------------

#[test]
fn uuid_text_round_trip() {
    let text = "6F9619FF-8B86-D011-B42D-00C04FD430C8";
    let u: Uuid = text.parse().unwrap();
    assert_eq!(
        u.as_bytes()[..4],
        [0x6F, 0x96, 0x19, 0xFF],
        "bytes in text order"
    );
    assert_eq!(u.to_string(), text);
    assert_eq!(text.to_lowercase().parse::<Uuid>().unwrap(), u);
    assert_eq!(format!("{{{text}}}").parse::<Uuid>().unwrap(), u);
    assert_eq!(
        DataType::UniqueIdentifier
            .coerce(Value::from(text.to_lowercase()))
            .unwrap(),
        Value::Uuid(u)
    );
    for bad in [
        "6F9619FF-8B86-D011-B42D-00C04FD430C",
        "6F9619FF-8B86-D011-B42D-00C04FD430C8A",
        "6F9619FF8B86-D011-B42D-00C04FD430C8-",
        "6F9619FG-8B86-D011-B42D-00C04FD430C8",
        "{6F9619FF-8B86-D011-B42D-00C04FD430C8",
        "",
    ] {
        assert!(bad.parse::<Uuid>().is_err(), "{bad}");
    }
    assert_eq!(
        err(DataType::UniqueIdentifier, "nope").to_string(),
        "Conversion failed when converting from a character string to uniqueidentifier."
    );
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    assert_ne!(a, b);
    assert_eq!(a.as_bytes()[6] >> 4, 4, "version 4");
    assert_eq!(a.as_bytes()[8] >> 6, 0b10, "RFC 4122 variant");
    assert_eq!(Uuid::from_sql_order_bytes(a.sql_order_bytes()), a);
}

// ---- Value ---------------------------------------------------------------------------------

#[test]
fn value_display_and_names() {
    assert_eq!(Value::Null.to_string(), "NULL");
    assert_eq!(Value::Bit(true).to_string(), "1");
    assert_eq!(Value::from(-5).to_string(), "-5");
    assert_eq!(Value::from("x").to_string(), "x");
    assert_eq!(Value::from(7i64).data_type_name(), "bigint");
    assert_eq!(Value::from("x").data_type_name(), "varchar");
    assert_eq!(Value::Null.data_type_name(), "null");
    assert!(Value::Null.is_null());
    assert!(!Value::from(0).is_null());
    assert_eq!(Value::from(Some("a")), Value::from("a"));
    assert_eq!(Value::from(&b"ab"[..]), Value::Binary(b"ab".to_vec()));
}

/// Text converted to uniqueidentifier follows the truncation rules of a 36-character type, as
/// in SQL Server: characters past the GUID are cut off (they made the conversion fail). A
/// Rust parse of a `Uuid` stays strict.
#[test]
fn text_converted_to_uniqueidentifier_is_cut_to_36_characters() {
    let guid = "0E984725-C51C-4BF4-9960-E1C80E27ABA0";
    let converted = coerce(DataType::UniqueIdentifier, format!("{guid}wrong")).unwrap();
    assert_eq!(converted, coerce(DataType::UniqueIdentifier, guid).unwrap());
    assert!(coerce(DataType::UniqueIdentifier, &guid[..35]).is_err());
    assert!(coerce(DataType::UniqueIdentifier, format!("{{{guid}}}x")).is_err());
    assert!(format!("{guid}wrong").parse::<Uuid>().is_err());
}

/// A binary converts to NCHAR and NVARCHAR as UTF-16 code units, little-endian, as SQL Server
/// stores those types (it was read as UTF-8: 0x41004200 became "A\0B\0"); an odd last byte is
/// padded with a zero; CHAR and VARCHAR still take the bytes as UTF-8.
#[test]
fn binary_converts_to_nvarchar_as_utf16_and_to_varchar_as_utf8() {
    let ab = vec![0x41, 0x00, 0x42, 0x00];
    assert_eq!(
        coerce(DataType::NVarChar(10), ab.clone()),
        Ok(Value::from("AB"))
    );
    assert_eq!(
        coerce(DataType::NChar(2), ab.clone()),
        Ok(Value::from("AB"))
    );
    assert_eq!(
        coerce(DataType::NVarChar(10), vec![0x41]),
        Ok(Value::from("A"))
    );
    assert_eq!(coerce(DataType::VarChar(10), ab), Ok(Value::from("A\0B\0")));
    // An unpaired surrogate is no text.
    let unpaired = vec![0x00, 0xD8];
    assert_eq!(
        err(DataType::NVarChar(10), unpaired).kind(),
        ValueErrorKind::Conversion
    );
}
