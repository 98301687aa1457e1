//! Values crossing `nop:postgres/client`: WIT values bound as statement parameters in
//! the type the server inferred, and result columns decoded from the binary format.

use crate::bindings::nop::postgres::client::Value;
use bytes::{BufMut, BytesMut};
use postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use std::error::Error as StdError;

/// Microseconds from 1970-01-01 to PostgreSQL's epoch 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A WIT value as a statement parameter, converted to the type the server inferred.
#[derive(Debug)]
pub(crate) struct Param<'a>(pub(crate) &'a Value);

type BoxError = Box<dyn StdError + Sync + Send>;

fn mismatch(v: &Value, ty: &Type) -> BoxError {
    let name = match v {
        Value::Null => "null",
        Value::Boolean(_) => "boolean",
        Value::Int2(_) => "int2",
        Value::Int4(_) => "int4",
        Value::Int8(_) => "int8",
        Value::Float4(_) => "float4",
        Value::Float8(_) => "float8",
        Value::Text(_) => "text",
        Value::Bytea(_) => "bytea",
        Value::Jsonb(_) => "jsonb",
        Value::Numeric(_) => "numeric",
        Value::Timestamptz(_) => "timestamptz",
        Value::Uuid(_) => "uuid",
    };
    format!(
        "a {name} value does not bind to a parameter of type {}",
        ty.name()
    )
    .into()
}

fn is_text(ty: &Type) -> bool {
    [
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::UNKNOWN,
    ]
    .contains(ty)
}

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let v = self.0;
        match v {
            Value::Null => return Ok(IsNull::Yes),
            Value::Boolean(b) if *ty == Type::BOOL => out.put_u8(u8::from(*b)),
            Value::Int2(_) | Value::Int4(_) | Value::Int8(_) => {
                let n = match v {
                    Value::Int2(n) => i64::from(*n),
                    Value::Int4(n) => i64::from(*n),
                    Value::Int8(n) => *n,
                    _ => unreachable!(),
                };
                let range =
                    || -> BoxError { format!("{n} is out of range for {}", ty.name()).into() };
                match *ty {
                    Type::INT2 => out.put_i16(i16::try_from(n).map_err(|_| range())?),
                    Type::INT4 => out.put_i32(i32::try_from(n).map_err(|_| range())?),
                    Type::INT8 => out.put_i64(n),
                    Type::FLOAT4 => out.put_f32(n as f32),
                    Type::FLOAT8 => out.put_f64(n as f64),
                    Type::NUMERIC => encode_numeric(&n.to_string(), out)?,
                    _ if is_text(ty) => out.put_slice(n.to_string().as_bytes()),
                    _ => return Err(mismatch(v, ty)),
                }
            }
            Value::Float4(_) | Value::Float8(_) => {
                let x = match v {
                    Value::Float4(x) => f64::from(*x),
                    Value::Float8(x) => *x,
                    _ => unreachable!(),
                };
                match *ty {
                    Type::FLOAT4 => out.put_f32(x as f32),
                    Type::FLOAT8 => out.put_f64(x),
                    Type::NUMERIC if x.is_finite() => encode_numeric(&format!("{x}"), out)?,
                    Type::NUMERIC if x.is_nan() => encode_numeric("NaN", out)?,
                    _ => return Err(mismatch(v, ty)),
                }
            }
            Value::Text(s) => match *ty {
                Type::JSON => out.put_slice(s.as_bytes()),
                Type::JSONB => {
                    out.put_u8(1);
                    out.put_slice(s.as_bytes());
                }
                Type::NUMERIC => encode_numeric(s, out)?,
                Type::UUID => out.put_slice(&parse_uuid(s)?),
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Bytea(b) if *ty == Type::BYTEA => out.put_slice(b),
            Value::Jsonb(s) => match *ty {
                Type::JSONB => {
                    out.put_u8(1);
                    out.put_slice(s.as_bytes());
                }
                Type::JSON => out.put_slice(s.as_bytes()),
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Numeric(s) => match *ty {
                Type::NUMERIC => encode_numeric(s, out)?,
                _ if is_text(ty) => out.put_slice(s.as_bytes()),
                _ => return Err(mismatch(v, ty)),
            },
            Value::Timestamptz(us) if *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP => {
                out.put_i64(
                    us.checked_sub(PG_EPOCH_US)
                        .ok_or("timestamp out of range")?,
                );
            }
            Value::Uuid(s) if *ty == Type::UUID => out.put_slice(&parse_uuid(s)?),
            _ => return Err(mismatch(v, ty)),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn parse_uuid(s: &str) -> Result<[u8; 16], BoxError> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let bytes = hex::decode(&hex).map_err(|_| format!("`{s}` is not a UUID"))?;
    bytes
        .try_into()
        .map_err(|_| format!("`{s}` is not a UUID").into())
}

/// NUMERIC's binary form from decimal text (`-12.340`, `NaN`): base-10000 digit groups.
fn encode_numeric(s: &str, out: &mut BytesMut) -> Result<(), BoxError> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("nan") {
        out.put_i16(0);
        out.put_i16(0);
        out.put_u16(0xC000);
        out.put_u16(0);
        return Ok(());
    }
    let bad = || -> BoxError { format!("`{s}` is not a decimal number").into() };
    let (neg, body) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let dscale = u16::try_from(frac.len()).map_err(|_| bad())?;
    let int = int.trim_start_matches('0');
    // Integer part padded on the left, fraction on the right, to whole groups of 4.
    let int_pad = (4 - int.len() % 4) % 4;
    let frac_pad = (4 - frac.len() % 4) % 4;
    let digits: String = "0".repeat(int_pad) + int + frac + &"0".repeat(frac_pad);
    let mut groups: Vec<i16> = digits
        .as_bytes()
        .chunks(4)
        .map(|c| {
            std::str::from_utf8(c)
                .unwrap_or("0")
                .parse::<i16>()
                .unwrap_or(0)
        })
        .collect();
    let mut weight = ((int_pad + int.len()) / 4) as i32 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(i16::try_from(groups.len()).map_err(|_| bad())?);
    out.put_i16(i16::try_from(weight).map_err(|_| bad())?);
    out.put_u16(if neg && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_u16(dscale);
    for g in groups {
        out.put_i16(g);
    }
    Ok(())
}

/// NUMERIC's binary form as decimal text.
fn decode_numeric(b: &[u8]) -> Result<String, String> {
    let rd = |i: usize| -> Result<u16, String> {
        b.get(i..i + 2)
            .map(|x| u16::from_be_bytes([x[0], x[1]]))
            .ok_or_else(|| "truncated numeric".to_string())
    };
    let ndigits = rd(0)? as usize;
    let weight = rd(2)? as i16 as i32;
    let sign = rd(4)?;
    let dscale = rd(6)? as usize;
    if sign == 0xC000 {
        return Ok("NaN".into());
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| rd(8 + 2 * i))
        .collect::<Result<_, _>>()?;
    let group = |e: i32| -> u16 {
        let i = weight - e;
        if i >= 0 && (i as usize) < digits.len() {
            digits[i as usize]
        } else {
            0
        }
    };
    let mut int = String::new();
    if weight >= 0 {
        int.push_str(&group(weight).to_string());
        for e in (0..weight).rev() {
            int.push_str(&format!("{:04}", group(e)));
        }
    } else {
        int.push('0');
    }
    let mut frac = String::new();
    let mut e = -1;
    while frac.len() < dscale {
        frac.push_str(&format!("{:04}", group(e)));
        e -= 1;
    }
    frac.truncate(dscale);
    let mut s = String::new();
    if sign == 0x4000 {
        s.push('-');
    }
    s.push_str(&int);
    if dscale > 0 {
        s.push('.');
        s.push_str(&frac);
    }
    Ok(s)
}

/// A result column's raw bytes, decoded by [`decode`].
pub(crate) struct Raw<'a>(pub(crate) &'a [u8]);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Raw(raw))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

pub(crate) fn decode(ty: &Type, b: &[u8]) -> Result<Value, String> {
    let fixed = |n: usize| -> Result<&[u8], String> {
        (b.len() == n)
            .then_some(b)
            .ok_or_else(|| format!("{} value of {} bytes", ty.name(), b.len()))
    };
    let text = || String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8".to_string());
    Ok(match *ty {
        Type::BOOL => Value::Boolean(fixed(1)?[0] != 0),
        Type::INT2 => Value::Int2(i16::from_be_bytes(fixed(2)?.try_into().unwrap_or_default())),
        Type::INT4 => Value::Int4(i32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default())),
        Type::INT8 => Value::Int8(i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default())),
        Type::OID => Value::Int8(i64::from(u32::from_be_bytes(
            fixed(4)?.try_into().unwrap_or_default(),
        ))),
        Type::FLOAT4 => Value::Float4(f32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default())),
        Type::FLOAT8 => Value::Float8(f64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default())),
        Type::BYTEA => Value::Bytea(b.to_vec()),
        Type::JSON => Value::Jsonb(text()?),
        Type::JSONB => {
            if b.first() != Some(&1) {
                return Err("unknown jsonb version".into());
            }
            Value::Jsonb(String::from_utf8(b[1..].to_vec()).map_err(|_| "invalid UTF-8")?)
        }
        Type::NUMERIC => Value::Numeric(decode_numeric(b)?),
        Type::TIMESTAMPTZ | Type::TIMESTAMP => {
            let us = i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default());
            Value::Timestamptz(us.saturating_add(PG_EPOCH_US))
        }
        Type::UUID => {
            let h = hex::encode(fixed(16)?);
            Value::Uuid(format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            ))
        }
        _ if is_text(ty) => Value::Text(text()?),
        _ => {
            return Err(format!(
                "type {} is not carried by nop:postgres (cast it in SQL, e.g. `::text`)",
                ty.name()
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numerics_round_trip_through_the_binary_form() {
        for s in [
            "0",
            "1",
            "-1",
            "12345",
            "-12.340",
            "0.0001",
            "100000000",
            "3.14159265358979",
            "NaN",
            "0.50",
            "99999999.99999",
        ] {
            let mut b = BytesMut::new();
            encode_numeric(s, &mut b).unwrap();
            assert_eq!(decode_numeric(&b).unwrap(), s, "{s}");
        }
        assert!(encode_numeric("1e5", &mut BytesMut::new()).is_err());
        assert!(encode_numeric("abc", &mut BytesMut::new()).is_err());
        assert!(encode_numeric(".", &mut BytesMut::new()).is_err());
    }
}
