//! Byte-level tests of the key and row formats, and of the orders SQL Server defines.

use lastpage_engine::encoding::{
    decode_key, decode_row, decode_row_column, encode_key, encode_key_value, encode_row,
    key_prefix_len,
};
use lastpage_engine::types::{DataType, Decimal, Uuid, Value, ValueErrorKind};

fn key(ty: DataType, v: impl Into<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(&[ty], &[v.into()], &mut out).unwrap();
    out
}

fn row(types: &[DataType], values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_row(types, values, &mut out).unwrap();
    out
}

#[test]
fn fixed_key_bytes() {
    assert_eq!(key(DataType::Int, Value::Null), [0x00]);
    assert_eq!(key(DataType::Int, 1), [0x01, 0x80, 0, 0, 1]);
    assert_eq!(key(DataType::Int, -1), [0x01, 0x7f, 0xff, 0xff, 0xff]);
    assert_eq!(key(DataType::TinyInt, 200u8), [0x01, 200]);
    assert_eq!(key(DataType::SmallInt, i16::MIN), [0x01, 0, 0]);
    assert_eq!(
        key(DataType::BigInt, 0i64),
        [0x01, 0x80, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(key(DataType::Bit, true), [0x01, 1]);
    assert_eq!(
        key(DataType::Money, Value::Money(-1)),
        [0x01, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
    let d = DataType::Decimal {
        precision: 4,
        scale: 2,
    };
    assert_eq!(
        key(d, "12.5".parse::<Decimal>().unwrap()),
        [0x01, 0x84, 0xe2],
        "1250 = 0x04e2"
    );
    assert_eq!(
        key(
            DataType::Date,
            "0001-01-02"
                .parse::<lastpage_engine::types::Date>()
                .unwrap()
        ),
        [0x01, 0, 0, 1]
    );
    let dt: lastpage_engine::types::DateTime2 = "0001-01-01 00:00:00.0000001".parse().unwrap();
    assert_eq!(
        key(DataType::DateTime2(7), dt),
        [0x01, 0, 0, 0, 0, 0, 0, 0, 1]
    );
    // Integer columns take other integer types; decimals take integers and exact rescales.
    assert_eq!(key(DataType::BigInt, 1), key(DataType::BigInt, 1i64));
    assert_eq!(key(d, 12), key(d, "12.0".parse::<Decimal>().unwrap()));
}

#[test]
fn string_key_bytes_and_padding() {
    assert_eq!(key(DataType::VarChar(10), "a"), [0x01, b'a', 0x20, 0x02]);
    assert_eq!(key(DataType::VarChar(10), ""), [0x01, 0x20, 0x02]);
    assert_eq!(
        key(DataType::VarChar(10), "a  "),
        key(DataType::VarChar(10), "a"),
        "'a' = 'a  '"
    );
    assert_eq!(
        key(DataType::Char(5), "a    "),
        key(DataType::VarChar(5), "a")
    );
    assert_eq!(
        key(DataType::VarChar(10), "a b"),
        [0x01, b'a', 0x20, 0x03, 0xff, 0xfe, b'b', 0x20, 0x02]
    );
    assert_eq!(
        key(DataType::VarChar(10), "a\tb"),
        [0x01, b'a', b'\t', b'b', 0x20, 0x02]
    );
    assert_eq!(
        key(DataType::VarChar(10), "a \t"),
        [0x01, b'a', 0x20, 0x01, 0x00, 0x01, b'\t', 0x20, 0x02]
    );
    // 0x00 inside text needs no escape.
    assert_eq!(key(DataType::VarChar(10), "\0"), [0x01, 0x00, 0x20, 0x02]);

    // SQL Server pads with spaces: 'a' > 'a<TAB>' (space > TAB), 'a' < 'a!' and 'a' < 'a b'.
    let k = |s: &str| key(DataType::VarChar(20), s);
    let ascending = [
        "\0", "\t", " \t", "", "a\0", "a\t", "a \t", "a", "a  b", "a b", "a!", "aa", "b", "é", "€",
        "𝄞",
    ];
    for w in ascending.windows(2) {
        assert!(k(w[0]) < k(w[1]), "{:?} < {:?}", w[0], w[1]);
    }
    // The same padding rule holds in nvarchar (by code point) and char.
    assert!(key(DataType::NVarChar(5), "a") > key(DataType::NVarChar(5), "a\t"));
    assert!(key(DataType::Char(3), "a  ") > key(DataType::Char(3), "a\t "));
}

#[test]
fn binary_keys_ignore_trailing_zeros() {
    let k = |b: &[u8]| key(DataType::VarBinary(10), b);
    assert_eq!(k(&[1]), k(&[1, 0, 0]), "SQL Server: 0x01 = 0x0100");
    assert_eq!(k(&[]), k(&[0]), "SQL Server: 0x = 0x00");
    assert_eq!(k(&[1]), [0x01, 0x01, 0x00, 0x02]);
    assert_eq!(k(&[0, 1]), [0x01, 0x00, 0x03, 0xff, 0xfe, 0x01, 0x00, 0x02]);
    let ascending: [&[u8]; 7] = [&[], &[0, 0, 1], &[0, 1], &[1], &[1, 0, 1], &[1, 1], &[0xff]];
    for w in ascending.windows(2) {
        assert!(k(w[0]) < k(w[1]), "{:?} < {:?}", w[0], w[1]);
    }
    let (values, _) = decode_key(&[DataType::VarBinary(10)], &k(&[1, 0, 0])).unwrap();
    assert_eq!(values, [Value::Binary(vec![1])]);
}

/// GUIDs with a single 0x01 byte, in ascending SQL Server order. SQL Server compares the
/// stored (little-endian-groups) bytes 10..=15, 8, 9, 6, 7, 4, 5, 0..=3 (.NET SqlGuid); in
/// text order that makes the last group the most significant, left to right, then the
/// fourth group left to right, then the third, second and first groups right to left.
#[test]
fn uniqueidentifier_order_is_sql_servers() {
    let ascending = [
        "00000000-0000-0000-0000-000000000000",
        "01000000-0000-0000-0000-000000000000",
        "00010000-0000-0000-0000-000000000000",
        "00000100-0000-0000-0000-000000000000",
        "00000001-0000-0000-0000-000000000000",
        "00000000-0100-0000-0000-000000000000",
        "00000000-0001-0000-0000-000000000000",
        "00000000-0000-0100-0000-000000000000",
        "00000000-0000-0001-0000-000000000000",
        "00000000-0000-0000-0001-000000000000",
        "00000000-0000-0000-0100-000000000000",
        "00000000-0000-0000-0000-000000000001",
        "00000000-0000-0000-0000-000000000100",
        "00000000-0000-0000-0000-000000010000",
        "00000000-0000-0000-0000-000001000000",
        "00000000-0000-0000-0000-000100000000",
        "00000000-0000-0000-0000-010000000000",
        "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
    ];
    let uuid = |s: &str| s.parse::<Uuid>().unwrap();
    for w in ascending.windows(2) {
        let (a, b) = (uuid(w[0]), uuid(w[1]));
        assert!(
            key(DataType::UniqueIdentifier, a) < key(DataType::UniqueIdentifier, b),
            "{a} < {b}"
        );
        assert!(a < b, "Ord of Uuid: {a} < {b}");
    }
    // NEWSEQUENTIALID()-style values: only the last group increasing is the usual order.
    assert!(
        uuid("6F9619FF-8B86-D011-B42D-00C04FD430C8") < uuid("00000000-0000-0000-B42D-00C04FD430C9")
    );
    let u = uuid("6F9619FF-8B86-D011-B42D-00C04FD430C8");
    assert_eq!(
        key(DataType::UniqueIdentifier, u)[1..],
        [
            0x00, 0xC0, 0x4F, 0xD4, 0x30, 0xC8, 0xB4, 0x2D, 0x11, 0xD0, 0x86, 0x8B, 0xFF, 0x19,
            0x96, 0x6F
        ]
    );
}

#[test]
fn null_sorts_first_and_composite_keys_are_lexicographic() {
    let types = [DataType::VarChar(10), DataType::Int];
    let k = |a: Value, b: Value| {
        let mut out = Vec::new();
        encode_key(&types, &[a, b], &mut out).unwrap();
        out
    };
    let ascending = [
        k(Value::Null, Value::Null),
        k(Value::Null, i32::MIN.into()),
        k("".into(), Value::Null),
        k("a".into(), Value::Null),
        k("a".into(), (-1).into()),
        k("a  ".into(), 0.into()),
        k("a".into(), 1.into()),
        k("a b".into(), i32::MIN.into()),
        k("ab".into(), i32::MIN.into()),
    ];
    for w in ascending.windows(2) {
        assert!(w[0] < w[1], "{:02x?} < {:02x?}", w[0], w[1]);
    }
    // A prefix of the columns is a prefix of the bytes.
    let full = k("abc".into(), 5.into());
    let mut first = Vec::new();
    encode_key_value(&DataType::VarChar(10), &"abc".into(), &mut first).unwrap();
    assert!(full.starts_with(&first));
    assert_eq!(key_prefix_len(&types[..1], &full).unwrap(), first.len());
}

#[test]
fn key_decoding() {
    let types = [
        DataType::Char(4),
        DataType::NChar(3),
        DataType::VarChar(5),
        DataType::Int,
    ];
    let values = [
        Value::from("ab  "),
        Value::from("é  "),
        Value::from("x  "),
        Value::Null,
    ];
    let mut bytes = Vec::new();
    encode_key(&types, &values, &mut bytes).unwrap();
    let len = bytes.len();
    bytes.extend_from_slice(b"row data");
    let (got, used) = decode_key(&types, &bytes).unwrap();
    assert_eq!(used, len);
    // char/nchar come back padded; varchar loses its trailing spaces (a key does not keep them).
    assert_eq!(
        got,
        [
            Value::from("ab  "),
            Value::from("é  "),
            Value::from("x"),
            Value::Null
        ]
    );

    for bad in [
        &[][..],
        &[0x02],
        &[0x01, b'a'],
        &[0x01, b'a', 0x20],
        &[0x01, b'a', 0x20, 0x07],
    ] {
        let e = decode_key(&[DataType::VarChar(5)], bad).unwrap_err();
        assert_eq!(e.kind(), ValueErrorKind::Corrupt, "{bad:?}");
    }
    // Longer than the type, non-canonical runs, a bit of 2, a bad date: corrupt.
    assert!(decode_key(&[DataType::VarChar(1)], &[0x01, b'a', b'b', 0x20, 0x02]).is_err());
    assert!(
        decode_key(
            &[DataType::VarChar(9)],
            &[0x01, b'a', 0x20, 0x01, 0, 1, b'b', 0x20, 0x02]
        )
        .is_err()
    );
    assert!(
        decode_key(
            &[DataType::VarChar(9)],
            &[0x01, b'a', 0x20, 0x03, 0xff, 0xff, b'b', 0x20, 0x02]
        )
        .is_err()
    );
    assert!(decode_key(&[DataType::Bit], &[0x01, 2]).is_err());
    assert!(decode_key(&[DataType::Date], &[0x01, 0xff, 0xff, 0xff]).is_err());
    let d2 = DataType::Decimal {
        precision: 2,
        scale: 0,
    };
    assert!(
        decode_key(&[d2], &[0x01, 0x80 + 100]).is_err(),
        "100 does not fit decimal(2,0)"
    );
}

#[test]
fn encoder_errors_leave_out_unchanged() {
    let mut out = vec![9, 9];
    let e = encode_key(&[DataType::Int, DataType::Int], &[Value::Int(1)], &mut out).unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Mismatch);
    let e = encode_key(
        &[DataType::Int, DataType::Date],
        &[Value::Int(1), Value::Int(2)],
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Mismatch);
    assert!(
        e.to_string()
            .contains("int value cannot be encoded as date"),
        "{e}"
    );
    let e = encode_key(&[DataType::TinyInt], &[Value::Int(256)], &mut out).unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Overflow);
    let e = encode_key(&[DataType::VarChar(2)], &["abc".into()], &mut out).unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Truncation);
    let d = DataType::Decimal {
        precision: 3,
        scale: 1,
    };
    let e = encode_key(&[d], &[Value::Decimal("1.25".parse().unwrap())], &mut out).unwrap_err();
    assert_eq!(
        e.kind(),
        ValueErrorKind::Mismatch,
        "needs rounding: coerce first"
    );
    let e = encode_row(
        &[DataType::Int, DataType::NVarChar(2)],
        &[Value::from(1), "abc".into()],
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Truncation);
    let e = encode_row(&[DataType::Money], &[Value::Int(1)], &mut out).unwrap_err();
    assert_eq!(e.kind(), ValueErrorKind::Mismatch);
    assert_eq!(out, [9, 9]);
}

#[test]
fn row_layout() {
    let types = [
        DataType::Int,
        DataType::VarChar(10),
        DataType::Bit,
        DataType::VarBinary(4),
        DataType::Char(3),
    ];
    let values = [
        Value::Int(7),
        "hi".into(),
        Value::Null,
        Value::Binary(vec![0xAB]),
        "x".into(),
    ];
    let bytes = row(&types, &values);
    #[rustfmt::skip]
    let want = [
        0b0000_0100,             // null bitmap: column 2 is NULL
        7, 0, 0, 0,              // int
        0,                       // bit (NULL: zero)
        b'x', b' ', b' ',        // char(3), padded
        15, 0, 16, 0,            // end offsets of varchar and varbinary
        b'h', b'i', 0xAB,        // variable data
    ];
    assert_eq!(bytes, want);
    let mut padded = values.clone();
    padded[4] = "x  ".into();
    assert_eq!(decode_row(&types, &bytes).unwrap(), padded);
    assert_eq!(
        decode_row_column(&types, &bytes, 1).unwrap(),
        Value::from("hi")
    );
    assert_eq!(decode_row_column(&types, &bytes, 2).unwrap(), Value::Null);
    assert_eq!(
        decode_row_column(&types, &bytes, 3).unwrap(),
        Value::Binary(vec![0xAB])
    );
    assert_eq!(
        decode_row_column(&types, &bytes, 5).unwrap_err().kind(),
        ValueErrorKind::Mismatch
    );

    // nchar/nvarchar are UTF-16LE; a row of one char(8000) is 8001 bytes, as in SQL Server.
    let bytes = row(
        &[DataType::NChar(2), DataType::NVarChar(4)],
        &["é".into(), "𝄞".into()],
    );
    assert_eq!(bytes, [0, 0xE9, 0, b' ', 0, 11, 0, 0x34, 0xD8, 0x1E, 0xDD]);
    assert_eq!(row(&[DataType::Char(8000)], &["x".into()]).len(), 8001);
    assert_eq!(row(&[], &[]), Vec::<u8>::new());

    // Too-large rows are an error (offsets are u16), not a panic.
    for last in [DataType::Char(8000), DataType::VarChar(10)] {
        let mut big = vec![DataType::Char(8000); 9];
        big.push(last);
        let values = vec![Value::from("y"); 10];
        let e = encode_row(&big, &values, &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), ValueErrorKind::Overflow);
        assert!(e.to_string().contains("65535"), "{e}");
    }
    let eight = vec![DataType::Char(8000); 8];
    assert_eq!(row(&eight, &vec![Value::from("y"); 8]).len(), 64_001);
}

#[test]
fn row_decoding_rejects_corruption() {
    let types = [DataType::Int, DataType::VarChar(3)];
    let good = row(&types, &[1.into(), "abc".into()]);
    assert!(decode_row(&types, &good).is_ok());
    let mut longer = good.clone();
    longer.push(0);
    assert!(decode_row(&types, &longer).is_err(), "trailing byte");
    assert!(
        decode_row(&types, &good[..good.len() - 1]).is_err(),
        "short"
    );
    let mut bad_bitmap = good.clone();
    bad_bitmap[0] = 0b1000_0000;
    assert!(
        decode_row(&types, &bad_bitmap).is_err(),
        "bit past the last column"
    );
    let mut bad_offset = good.clone();
    bad_offset[5] = 3;
    assert!(
        decode_row(&types, &bad_offset).is_err(),
        "offset inside the fixed part"
    );
    let mut bad_utf8 = good.clone();
    bad_utf8[7] = 0xff;
    assert!(decode_row(&types, &bad_utf8).is_err(), "not UTF-8");
    assert!(
        decode_row(&[DataType::NVarChar(2)], &[0, 6, 0, 0x41, 0x00, 0x42]).is_err(),
        "odd UTF-16 length"
    );
    assert!(
        decode_row(&[DataType::NVarChar(2)], &[0, 5, 0, 0x00, 0xD8]).is_err(),
        "lone surrogate"
    );
}
