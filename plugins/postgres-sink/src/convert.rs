//! JSON field -> [`Value`] per declared column `type` (pure: no host call, unit-tested
//! natively). A missing field and JSON `null` are SQL NULL for every type.
//!
//! | `type` | accepts | binds as |
//! |---|---|---|
//! | `auto` (default) | any: integers `int8`, other numbers `float8`, strings `text`, booleans, objects/arrays `jsonb` | as listed |
//! | `bool` | `true` / `false` | `boolean` |
//! | `int2`, `int4`, `int8` | a JSON integer in the type's range | `smallint`, `integer`, `bigint` |
//! | `float4`, `float8` | a JSON number in range, or the string `"NaN"`, `"Infinity"`, `"-Infinity"` | `real`, `double precision` |
//! | `numeric` | a JSON number, or a string of a decimal number (`-12.340`, `1.5e-3`, `NaN`); exponents are expanded | `numeric` (as text) |
//! | `text` | a string as is; any other value as its JSON text | `text` |
//! | `jsonb` | any value, as its JSON text | `jsonb` |
//! | `bytea` | a string: standard base64 with padding (`"3q2+7w=="`), or hex after `\x` (`"\\xdeadbeef"`, PostgreSQL's own output form) | `bytea` |
//! | `uuid` | a string of 32 hex digits, hyphens allowed (`"67e55044-10b1-426f-9247-bb680e5fe0c8"`) | `uuid` |
//! | `timestamptz` | an RFC 3339 string (`"2026-12-02T17:34:07.123456Z"`, `"...+01:00"`; a space may replace `T`); digits below the microsecond are dropped | `timestamptz` (µs) |
//! | `timestamptz-ms` | a JSON integer of milliseconds since 1970-01-01 UTC | `timestamptz` (µs) |
//!
//! A JSON number is read as an `f64` unless it is an integer, so a `numeric` with more than
//! about 15 significant digits must be sent as a string to keep every digit.

use nop_stream_sdk::postgres::Value;
use serde::Deserialize;
use serde_json::Value as Json;

/// A column's declared type: how its JSON field becomes a [`Value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ColumnType {
    /// By the JSON type (see the module table).
    #[default]
    Auto,
    /// `boolean`.
    Bool,
    /// `smallint`.
    Int2,
    /// `integer`.
    Int4,
    /// `bigint`.
    Int8,
    /// `real`.
    Float4,
    /// `double precision`.
    Float8,
    /// `numeric`, bound as decimal text.
    Numeric,
    /// `text`.
    Text,
    /// `jsonb`.
    Jsonb,
    /// `bytea` from base64 or `\x` hex.
    Bytea,
    /// `uuid` from its text form.
    Uuid,
    /// `timestamptz` from an RFC 3339 string.
    Timestamptz,
    /// `timestamptz` from integer milliseconds.
    TimestamptzMs,
}

impl ColumnType {
    /// The config spelling, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::Auto => "auto",
            ColumnType::Bool => "bool",
            ColumnType::Int2 => "int2",
            ColumnType::Int4 => "int4",
            ColumnType::Int8 => "int8",
            ColumnType::Float4 => "float4",
            ColumnType::Float8 => "float8",
            ColumnType::Numeric => "numeric",
            ColumnType::Text => "text",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Bytea => "bytea",
            ColumnType::Uuid => "uuid",
            ColumnType::Timestamptz => "timestamptz",
            ColumnType::TimestamptzMs => "timestamptz-ms",
        }
    }
}

/// Converts one field. `Err` is a reason without the column (the caller names it), e.g.
/// `70000 is out of range for int2 (-32768..=32767)`.
pub fn convert(ty: ColumnType, v: &Json) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    let short = || {
        let t = v.to_string();
        if t.len() > 80 {
            format!("{}...", &t[..t.floor_char_boundary(77)])
        } else {
            t
        }
    };
    let want = |what: &str| Err(format!("{} is not {what}", short()));
    match ty {
        ColumnType::Auto => Ok(match v {
            Json::Bool(b) => Value::Boolean(*b),
            Json::Number(n) => match n.as_i64() {
                Some(i) => Value::Int8(i),
                None => Value::Float8(n.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(s) => Value::Text(s.clone()),
            other => Value::Jsonb(other.to_string()),
        }),
        ColumnType::Bool => match v {
            Json::Bool(b) => Ok(Value::Boolean(*b)),
            _ => want("a boolean"),
        },
        ColumnType::Int2 | ColumnType::Int4 | ColumnType::Int8 => {
            let Some(n) = v.as_i64() else {
                return if v.as_u64().is_some() {
                    Err(format!("{} is out of range for int8", short()))
                } else {
                    want("an integer")
                };
            };
            let range = |lo: i64, hi: i64| {
                Err(format!(
                    "{n} is out of range for {} ({lo}..={hi})",
                    ty.name()
                ))
            };
            match ty {
                ColumnType::Int2 => i16::try_from(n)
                    .map(Value::Int2)
                    .or_else(|_| range(i16::MIN.into(), i16::MAX.into())),
                ColumnType::Int4 => i32::try_from(n)
                    .map(Value::Int4)
                    .or_else(|_| range(i32::MIN.into(), i32::MAX.into())),
                _ => Ok(Value::Int8(n)),
            }
        }
        ColumnType::Float4 | ColumnType::Float8 => {
            let x = match v {
                Json::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                Json::String(s) => match s.as_str() {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    _ => return want("a number (or \"NaN\", \"Infinity\", \"-Infinity\")"),
                },
                _ => return want("a number (or \"NaN\", \"Infinity\", \"-Infinity\")"),
            };
            if ty == ColumnType::Float8 {
                return Ok(Value::Float8(x));
            }
            let y = x as f32;
            if x.is_finite() && !y.is_finite() {
                return Err(format!("{} is out of range for float4", short()));
            }
            Ok(Value::Float4(y))
        }
        ColumnType::Numeric => {
            let text = match v {
                Json::Number(n) => n.to_string(),
                Json::String(s) => s.clone(),
                _ => return want("a number or a decimal string"),
            };
            numeric_text(&text).map(Value::Numeric)
        }
        ColumnType::Text => Ok(Value::Text(match v {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        })),
        ColumnType::Jsonb => Ok(Value::Jsonb(v.to_string())),
        ColumnType::Bytea => match v {
            Json::String(s) => match s.strip_prefix("\\x") {
                Some(hex) => decode_hex(hex).map(Value::Bytea),
                None => decode_base64(s).map(Value::Bytea),
            },
            _ => want("a base64 or \\x-hex string"),
        },
        ColumnType::Uuid => match v {
            Json::String(s) => {
                let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
                let groups: Vec<usize> = s.split('-').map(str::len).collect();
                let shaped = groups == [32] || groups == [8, 4, 4, 4, 12];
                if shaped && hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit) {
                    Ok(Value::Uuid(s.to_ascii_lowercase()))
                } else {
                    want("a UUID (32 hex digits, as 8-4-4-4-12 or unbroken)")
                }
            }
            _ => want("a UUID string"),
        },
        ColumnType::Timestamptz => match v {
            Json::String(s) => parse_rfc3339(s).map(Value::Timestamptz),
            _ => want("an RFC 3339 timestamp string"),
        },
        ColumnType::TimestamptzMs => match v.as_i64() {
            Some(ms) => ms
                .checked_mul(1000)
                .filter(|us| (MIN_US..=MAX_US).contains(us))
                .map(Value::Timestamptz)
                .ok_or_else(|| format!("{ms} ms is out of range for timestamptz")),
            None => want("an integer of milliseconds"),
        },
    }
}

/// The start of PostgreSQL's timestamptz range in µs since 1970 (4714-11-24 BC, 00:00
/// UTC). Its end (294276 AD) lies beyond `i64::MAX` µs, so every other `i64` fits.
const MIN_US: i64 = -210_866_803_200_000_000;
const MAX_US: i64 = i64::MAX;

/// Decimal text in the plain form PostgreSQL's binary numeric needs: optional sign,
/// digits, optional fraction, no exponent (`1.5e-3` becomes `0.0015`); `NaN` kept.
pub fn numeric_text(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("nan") {
        return Ok("NaN".into());
    }
    let bad = || Err(format!("{s:?} is not a decimal number"));
    if t.eq_ignore_ascii_case("infinity") || t.eq_ignore_ascii_case("-infinity") {
        return Err(format!(
            "{s:?}: infinite numerics are not carried (only NaN)"
        ));
    }
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => match t[i + 1..].parse::<i32>() {
            Ok(e) if e.abs() <= 10_000 => (&t[..i], e),
            Ok(_) => return Err(format!("{s:?}: exponent out of range")),
            Err(_) => return bad(),
        },
        None => (t, 0),
    };
    let (neg, body) = match mantissa.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return bad();
    }
    if exp == 0 {
        let mut out = String::with_capacity(t.len() + 1);
        if neg {
            out.push('-');
        }
        out.push_str(if int.is_empty() { "0" } else { int });
        if !frac.is_empty() {
            out.push('.');
            out.push_str(frac);
        }
        return Ok(out);
    }
    // Shift the decimal point of `digits` (int ++ frac) to `point`.
    let digits = format!("{int}{frac}");
    let point = int.len() as i64 + i64::from(exp);
    let (i, f) = if point <= 0 {
        (
            "0".to_owned(),
            format!("{}{digits}", "0".repeat((-point) as usize)),
        )
    } else if point as usize >= digits.len() {
        (
            format!("{digits}{}", "0".repeat(point as usize - digits.len())),
            String::new(),
        )
    } else {
        (
            digits[..point as usize].to_owned(),
            digits[point as usize..].to_owned(),
        )
    };
    let i = i.trim_start_matches('0');
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    out.push_str(if i.is_empty() { "0" } else { i });
    if !f.is_empty() {
        out.push('.');
        out.push_str(&f);
    }
    Ok(out)
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "\"\\\\x{s}\" is not hex (an even number of hex digits after \\x)"
        ));
    }
    let nib = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    };
    Ok(s.as_bytes()
        .chunks(2)
        .map(|p| nib(p[0]) << 4 | nib(p[1]))
        .collect())
}

/// Standard base64 (`A-Z a-z 0-9 + /`) with `=` padding to a multiple of 4.
fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("{s:?} is not base64 (standard alphabet, padded) or \\x-hex");
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return Err(bad());
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return Err(bad());
    }
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (k, quad) in b.chunks(4).enumerate() {
        let last = k == b.len() / 4 - 1;
        let n = if last { 4 - pad } else { 4 };
        let mut acc = 0u32;
        for (j, &c) in quad.iter().enumerate() {
            let d = if j < n { val(c).ok_or_else(bad)? } else { 0 };
            acc = acc << 6 | d;
        }
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..n - 1]);
    }
    Ok(out)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    // Howard Hinnant's algorithm: days since 1970-01-01 of a proleptic Gregorian date.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T` or a space) to µs since 1970 UTC.
pub fn parse_rfc3339(s: &str) -> Result<i64, String> {
    let bad = |why: &str| Err(format!("{s:?} is not an RFC 3339 timestamp ({why})"));
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return bad("expected YYYY-MM-DDTHH:MM:SS and an offset");
    }
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(sec)) = (
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ) else {
        return bad("expected digits");
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mdays = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo) || d < 1 || d > mdays[(mo - 1) as usize] {
        return bad("no such date");
    }
    if h > 23 || mi > 59 || sec > 59 {
        return bad("no such time of day");
    }
    let mut i = 19;
    let mut micros = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return bad("empty fraction");
        }
        let frac = &s[start..i];
        let six: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        micros = six.parse().unwrap_or(0);
    }
    let offset_s = match &s[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let (Some(oh), Some(om)) = (num(i + 1..i + 3), num(i + 4..i + 6)) else {
                return bad("bad offset");
            };
            if oh > 23 || om > 59 {
                return bad("bad offset");
            }
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return bad("expected Z or +HH:MM after the time"),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Ok(secs * 1_000_000 + micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(ty: ColumnType, v: Json) -> Value {
        convert(ty, &v).unwrap_or_else(|e| panic!("{} {v}: {e}", ty.name()))
    }

    fn err(ty: ColumnType, v: Json) -> String {
        match convert(ty, &v) {
            Ok(x) => panic!("{} {v} converted to {x:?}", ty.name()),
            Err(e) => e,
        }
    }

    #[test]
    fn null_is_null_for_every_type() {
        for ty in [
            ColumnType::Auto,
            ColumnType::Bool,
            ColumnType::Int2,
            ColumnType::Int4,
            ColumnType::Int8,
            ColumnType::Float4,
            ColumnType::Float8,
            ColumnType::Numeric,
            ColumnType::Text,
            ColumnType::Jsonb,
            ColumnType::Bytea,
            ColumnType::Uuid,
            ColumnType::Timestamptz,
            ColumnType::TimestamptzMs,
        ] {
            assert_eq!(ok(ty, Json::Null), Value::Null, "{}", ty.name());
        }
    }

    #[test]
    fn integers_fit_their_type_or_fail_with_the_range() {
        use ColumnType::*;
        assert_eq!(ok(Int2, json!(-32768)), Value::Int2(i16::MIN));
        assert_eq!(ok(Int2, json!(32767)), Value::Int2(i16::MAX));
        assert_eq!(
            err(Int2, json!(32768)),
            "32768 is out of range for int2 (-32768..=32767)"
        );
        assert_eq!(ok(Int4, json!(i32::MIN)), Value::Int4(i32::MIN));
        assert!(err(Int4, json!(2147483648_i64)).contains("out of range for int4"));
        assert_eq!(ok(Int8, json!(i64::MIN)), Value::Int8(i64::MIN));
        assert_eq!(ok(Int8, json!(i64::MAX)), Value::Int8(i64::MAX));
        assert!(err(Int8, json!(u64::MAX)).contains("out of range for int8"));
        assert_eq!(err(Int8, json!(1.5)), "1.5 is not an integer");
        assert_eq!(err(Int4, json!("7")), "\"7\" is not an integer");
        assert_eq!(ok(Bool, json!(true)), Value::Boolean(true));
        assert_eq!(err(Bool, json!(1)), "1 is not a boolean");
    }

    #[test]
    fn floats_take_numbers_and_the_special_strings() {
        use ColumnType::*;
        assert_eq!(ok(Float8, json!(1.5)), Value::Float8(1.5));
        assert_eq!(ok(Float8, json!(f64::MAX)), Value::Float8(f64::MAX));
        assert_eq!(ok(Float8, json!("NaN")), Value::Float8(f64::NAN));
        assert_eq!(ok(Float8, json!("Infinity")), Value::Float8(f64::INFINITY));
        assert_eq!(
            ok(Float8, json!("-Infinity")),
            Value::Float8(f64::NEG_INFINITY)
        );
        assert_eq!(ok(Float4, json!(0.25)), Value::Float4(0.25));
        assert_eq!(
            ok(Float4, json!("-Infinity")),
            Value::Float4(f32::NEG_INFINITY)
        );
        assert!(err(Float4, json!(1e300)).contains("out of range for float4"));
        assert!(err(Float8, json!("inf")).contains("is not a number"));
    }

    #[test]
    fn numerics_become_plain_decimal_text() {
        use ColumnType::*;
        assert_eq!(ok(Numeric, json!(12)), Value::Numeric("12".into()));
        assert_eq!(ok(Numeric, json!(-0.5)), Value::Numeric("-0.5".into()));
        let long = "-123456789012345678901234567890.000000000000000000001";
        assert_eq!(ok(Numeric, json!(long)), Value::Numeric(long.into()));
        assert_eq!(ok(Numeric, json!("NaN")), Value::Numeric("NaN".into()));
        assert_eq!(numeric_text("1.5e-3").unwrap(), "0.0015");
        assert_eq!(numeric_text("1.5E3").unwrap(), "1500");
        assert_eq!(numeric_text("-12.345e2").unwrap(), "-1234.5");
        assert_eq!(numeric_text("1e300").unwrap().len(), 301);
        assert_eq!(numeric_text(".5").unwrap(), "0.5");
        assert_eq!(
            ok(Numeric, json!(1e20)),
            Value::Numeric("100000000000000000000".into())
        );
        for bad in ["", "1.2.3", "abc", "1e", "--1", "Infinity", "1e99999"] {
            assert!(numeric_text(bad).is_err(), "{bad:?}");
        }
        assert!(err(Numeric, json!(true)).contains("is not a number or a decimal string"));
    }

    #[test]
    fn bytea_from_base64_or_hex() {
        use ColumnType::*;
        assert_eq!(ok(Bytea, json!("")), Value::Bytea(vec![]));
        assert_eq!(ok(Bytea, json!("\\x")), Value::Bytea(vec![]));
        assert_eq!(
            ok(Bytea, json!("3q2+7w==")),
            Value::Bytea(vec![0xde, 0xad, 0xbe, 0xef])
        );
        assert_eq!(ok(Bytea, json!("AAE=")), Value::Bytea(vec![0, 1]));
        assert_eq!(ok(Bytea, json!("AAEC")), Value::Bytea(vec![0, 1, 2]));
        assert_eq!(
            ok(Bytea, json!("\\xDEADbeef")),
            Value::Bytea(vec![0xde, 0xad, 0xbe, 0xef])
        );
        let all: Vec<u8> = (0..=255).collect();
        // base64 of 0..=255, computed independently (python3 base64.b64encode).
        let b64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==";
        assert_eq!(ok(Bytea, json!(b64)), Value::Bytea(all));
        for bad in ["abc", "ab=c", "a===", "\\x0", "\\xzz", "AA-="] {
            assert!(convert(Bytea, &json!(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn uuids_and_text() {
        use ColumnType::*;
        let u = "67E55044-10b1-426f-9247-bb680e5fe0c8";
        assert_eq!(ok(Uuid, json!(u)), Value::Uuid(u.to_ascii_lowercase()));
        assert!(matches!(
            ok(Uuid, json!("67e5504410b1426f9247bb680e5fe0c8")),
            Value::Uuid(_)
        ));
        for bad in [
            "67e55044-10b1-426f-9247",
            "67e55044-10b1-426f-9247-bb680e5fe0cg",
            "6-7e55044410b1426f9247bb680e5fe0c8",
        ] {
            assert!(convert(Uuid, &json!(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(ok(Text, json!("é")), Value::Text("é".into()));
        assert_eq!(ok(Text, json!({"a":1})), Value::Text("{\"a\":1}".into()));
        assert_eq!(ok(Jsonb, json!([1, "x"])), Value::Jsonb("[1,\"x\"]".into()));
        assert_eq!(ok(Auto, json!(3)), Value::Int8(3));
        assert_eq!(ok(Auto, json!(3.5)), Value::Float8(3.5));
        assert_eq!(ok(Auto, json!({"a":1})), Value::Jsonb("{\"a\":1}".into()));
    }

    #[test]
    fn timestamps_from_rfc3339_and_milliseconds() {
        use ColumnType::*;
        assert_eq!(
            ok(Timestamptz, json!("1970-01-01T00:00:00Z")),
            Value::Timestamptz(0)
        );
        // 2026-12-02T17:34:07.123456Z = 1796232847 s (date -d ... +%s).
        assert_eq!(
            ok(Timestamptz, json!("2026-12-02T17:34:07.123456Z")),
            Value::Timestamptz(1_796_232_847_123_456)
        );
        assert_eq!(
            ok(Timestamptz, json!("2026-12-02 18:34:07.1234569+01:00")),
            Value::Timestamptz(1_796_232_847_123_456)
        );
        assert_eq!(
            ok(Timestamptz, json!("1969-12-31T23:59:59.5-00:00")),
            Value::Timestamptz(-500_000)
        );
        assert_eq!(
            ok(Timestamptz, json!("2000-02-29T00:00:00Z")),
            Value::Timestamptz(951_782_400_000_000)
        );
        for bad in [
            "2001-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T17:34:07",
            "2026-12-02T17:34:07+0100",
            "2026-12-02",
            "2026-12-02T17:34:07.Z",
        ] {
            assert!(convert(Timestamptz, &json!(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            ok(TimestamptzMs, json!(1500)),
            Value::Timestamptz(1_500_000)
        );
        assert_eq!(ok(TimestamptzMs, json!(-1)), Value::Timestamptz(-1000));
        assert!(err(TimestamptzMs, json!(i64::MAX)).contains("out of range for timestamptz"));
        assert_eq!(
            err(TimestamptzMs, json!("1")),
            "\"1\" is not an integer of milliseconds"
        );
    }
}
