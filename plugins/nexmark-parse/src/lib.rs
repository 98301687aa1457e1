//! `nexmark-parse`: reads Nexmark CSV lines of one kind ([`nexmark_model::csv`], from
//! `nexmark-source` or from files through `file-source`), keeps those that pass its
//! filters, and emits the chosen columns as a CSV line, optionally keyed by an integer
//! column for a HASH edge. Stateless: it runs chained behind its source at any
//! parallelism. Nexmark q0, q1 and q2 are this operator alone; the join queries use it
//! to select, project and key their inputs.
//!
//! Config:
//!
//! ```json
//! { "kind": "person" | "auction" | "bid",
//!   "fields": ["auction", "bidder", "price_eur", "date_time", "extra"],
//!   "key": "auction",
//!   "filter": [ { "field": "category", "eq": 10 },
//!               { "field": "state", "in": ["OR", "ID", "CA"] },
//!               { "field": "auction", "mod": 123, "eq": 0 } ] }
//! ```
//!
//! - `fields`: output columns, in order, from the kind's columns
//!   ([`nexmark_model::csv::fields`]); bids also offer `price_eur` (q1's `0.908 * price`
//!   with three decimals). Default: every column.
//! - `key`: an integer column; records are keyed by its value as 8 bytes (`i64`
//!   little-endian). Absent: unkeyed.
//! - `filter`: every condition must hold. `eq` compares an integer column with an
//!   integer or a text column with a string; `in` a text column with a list of strings;
//!   `mod` with `eq` tests `column mod m == eq` (integers).
//!
//! Every output record carries the event's `date_time` as its timestamp. A line that does
//! not parse (wrong column count, a non-integer where an integer belongs) is an
//! `invalid-record` error naming the line; `on_error = "skip"` or `"dead-letter"` apply.

use nexmark_model::{Kind, csv};
use nop_stream_sdk::num::parse_i64;
use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["kind"],"properties":{"kind":{"enum":["person","auction","bid"]},"fields":{"type":"array","items":{"type":"string"}},"key":{"type":"string"},"filter":{"type":"array","items":{"type":"object","additionalProperties":false,"required":["field"],"properties":{"field":{"type":"string"},"eq":{},"in":{"type":"array","items":{"type":"string"}},"mod":{"type":"integer","minimum":1}}}}}}"#;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFilter {
    field: String,
    eq: Option<serde_json::Value>,
    #[serde(rename = "in")]
    in_: Option<Vec<String>>,
    #[serde(rename = "mod")]
    modulo: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    kind: String,
    fields: Option<Vec<String>>,
    key: Option<String>,
    #[serde(default)]
    filter: Vec<RawFilter>,
}

/// An output column: a column of the line, or q1's derived euro price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// Column `i` of the line as is.
    Raw(usize),
    /// The `price` column (index) × 0.908, three decimals.
    Euro(usize),
}

/// One filter condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Integer column equals.
    IntEq(usize, i64),
    /// Text column equals.
    TextEq(usize, String),
    /// Text column is one of.
    In(usize, Vec<String>),
    /// Integer column mod `m` equals.
    ModEq(usize, i64, i64),
}

/// The validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The kind of the input lines.
    pub kind: Kind,
    /// Output columns.
    pub columns: Vec<Column>,
    /// Key column (integer).
    pub key: Option<usize>,
    /// Conditions.
    pub filters: Vec<Filter>,
    /// Index of `date_time`.
    pub date_time: usize,
}

/// Whether column `name` of `kind` holds integers.
fn is_int(kind: Kind, name: &str) -> bool {
    match kind {
        Kind::Person => matches!(name, "id" | "date_time"),
        Kind::Auction => matches!(
            name,
            "id" | "initial_bid" | "reserve" | "date_time" | "expires" | "seller" | "category"
        ),
        Kind::Bid => matches!(name, "auction" | "bidder" | "price" | "date_time"),
    }
}

impl Config {
    /// Parses and validates the JSON config.
    ///
    /// # Errors
    /// Malformed JSON, unknown fields, or a column the kind lacks, a non-integer key or
    /// filter column, a filter without `eq` or `in`, named in the message.
    pub fn parse(json: &str) -> std::result::Result<Self, String> {
        let e = |m: String| format!("nexmark-parse config: {m}");
        let c: RawConfig = serde_json::from_str(json).map_err(|x| e(x.to_string()))?;
        let kind = Kind::parse(&c.kind).ok_or_else(|| {
            e(format!(
                "`kind` must be person, auction or bid, got {:?}",
                c.kind
            ))
        })?;
        let names = csv::fields(kind);
        let index = |name: &str, what: &str| {
            names.iter().position(|n| *n == name).ok_or_else(|| {
                e(format!(
                    "{what} `{name}` is not a {} column (columns: {})",
                    kind.as_str(),
                    names.join(", ")
                ))
            })
        };
        let columns = match &c.fields {
            None => (0..names.len()).map(Column::Raw).collect(),
            Some(fs) => fs
                .iter()
                .map(|f| {
                    if f == "price_eur" && kind == Kind::Bid {
                        Ok(Column::Euro(index("price", "field")?))
                    } else {
                        index(f, "field").map(Column::Raw)
                    }
                })
                .collect::<std::result::Result<_, _>>()?,
        };
        let key = match &c.key {
            None => None,
            Some(k) if is_int(kind, k) => Some(index(k, "key")?),
            Some(k) => return Err(e(format!("key `{k}` must be an integer column"))),
        };
        let mut filters = Vec::new();
        for f in &c.filter {
            let i = index(&f.field, "filter field")?;
            let int = is_int(kind, &f.field);
            filters.push(match (&f.eq, &f.in_, f.modulo) {
                (Some(v), None, Some(m)) if int => ModEq(i, m, as_int(v, &f.field).map_err(e)?),
                (Some(v), None, None) if int => IntEq(i, as_int(v, &f.field).map_err(e)?),
                (Some(serde_json::Value::String(s)), None, None) if !int => TextEq(i, s.clone()),
                (None, Some(list), None) if !int => In(i, list.clone()),
                _ => {
                    return Err(e(format!(
                        "filter on `{}`: expected `eq` (with `mod` for integers) or, for text \
                         columns, `in`",
                        f.field
                    )));
                }
            });
        }
        use Filter::{In, IntEq, ModEq, TextEq};
        Ok(Config {
            kind,
            columns,
            key,
            filters,
            date_time: index("date_time", "column")?,
        })
    }
}

fn as_int(v: &serde_json::Value, field: &str) -> std::result::Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| format!("filter on `{field}`: `eq` must be an integer, got {v}"))
}

fn int(cols: &[&[u8]], i: usize, line: &[u8]) -> Result<i64> {
    parse_i64(cols[i]).ok_or_else(|| {
        PluginError::invalid_record(format!(
            "column {} is not an integer: {:?}",
            i + 1,
            String::from_utf8_lossy(line)
        ))
    })
}

/// Whether `b` is all ASCII: an OR over 8-byte words (wasm has native 64-bit integers;
/// core's `is_ascii` and `str::from_utf8`, built for wasm32, go a 4-byte word at a time).
fn ascii(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    let mut acc = 0u64;
    for w in &mut words {
        acc |= u64::from_le_bytes(w.try_into().expect("8 bytes"));
    }
    let tail = words.remainder().iter().fold(0u8, |a, &x| a | x);
    acc & 0x8080_8080_8080_8080 == 0 && tail < 0x80
}

/// `fmt::Write` into a byte buffer (q1's euro price).
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Parses `line` (UTF-8 text, checked by the caller) and appends its output record to
/// `out` unless a filter drops it; `buf` is scratch for the output line.
///
/// # Errors
/// `invalid-record` for a line with another column count or a non-integer where the
/// config needs an integer.
pub fn parse_line(config: &Config, line: &[u8], out: &mut Batch, buf: &mut Vec<u8>) -> Result<()> {
    let n = csv::fields(config.kind).len();
    let mut fields: [&[u8]; 10] = [b""; 10];
    let mut count = 0;
    // The commas found by `memchr` (16 bytes at a time with wasm SIMD; `str::split`'s
    // search goes a 4-byte word at a time). A comma is ASCII, so every cut is on a
    // character boundary.
    let mut start = 0;
    for comma in memchr::memchr_iter(b',', line).chain([line.len()]) {
        if count == n {
            count += 1;
            break;
        }
        fields[count] = &line[start..comma];
        start = comma + 1;
        count += 1;
    }
    if count != n {
        return Err(PluginError::invalid_record(format!(
            "a {} line has {n} columns: {:?}",
            config.kind.as_str(),
            String::from_utf8_lossy(line)
        )));
    }
    let f = &fields[..n];
    for c in &config.filters {
        let keep = match c {
            Filter::IntEq(i, v) => int(f, *i, line)? == *v,
            Filter::TextEq(i, v) => f[*i] == v.as_bytes(),
            Filter::In(i, vs) => vs.iter().any(|v| v.as_bytes() == f[*i]),
            Filter::ModEq(i, m, v) => int(f, *i, line)?.rem_euclid(*m) == *v,
        };
        if !keep {
            return Ok(());
        }
    }
    let ts = int(f, config.date_time, line)?;
    buf.clear();
    for (j, c) in config.columns.iter().enumerate() {
        if j > 0 {
            buf.push(b',');
        }
        match c {
            Column::Raw(i) => buf.extend_from_slice(f[*i]),
            Column::Euro(i) => csv::write_euro(int(f, *i, line)?, &mut Bytes(buf)),
        }
    }
    match config.key {
        Some(k) => {
            let key = int(f, k, line)?.to_le_bytes();
            out.push_record(Some(&key), Some(ts), buf);
        }
        None => out.push_record(None, Some(ts), buf),
    }
    Ok(())
}

/// The operator.
#[derive(Debug)]
pub struct NexmarkParse {
    config: Config,
    buf: Vec<u8>,
}

impl Operator for NexmarkParse {
    fn describe() -> PluginInfo {
        PluginInfo::operator("nexmark-parse", "0.1.0")
            .description("Parses, filters, projects and keys Nexmark CSV lines")
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(NexmarkParse {
            config: Config::parse(config).map_err(PluginError::invalid_config)?,
            buf: Vec::new(),
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for (i, r) in batch.iter().enumerate() {
            let line = r.data;
            if !ascii(line) {
                std::str::from_utf8(line)
                    .map_err(|_| PluginError::invalid_record(format!("record {i} is not UTF-8")))?;
            }
            parse_line(&self.config, line, out, &mut self.buf)
                .map_err(|e| PluginError::new(e.code, format!("record {i}: {}", e.message)))?;
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(NexmarkParse);

#[cfg(test)]
mod tests {
    use super::*;
    use nexmark_model::{Config as Generator, Event, event, queries};

    fn run(config: &str, kind: Kind, n: u64) -> (Vec<String>, Batch) {
        let c = Config::parse(config).unwrap();
        let g = Generator::default();
        let mut out = Batch::new();
        let mut buf = Vec::new();
        for i in (0..n).filter(|&i| g.kind_of(i) == kind) {
            parse_line(&c, csv::line(&event(&g, i)).as_bytes(), &mut out, &mut buf).unwrap();
        }
        let lines = out
            .iter()
            .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
            .collect();
        (lines, out)
    }

    fn bids(n: u64) -> Vec<nexmark_model::Bid> {
        let g = Generator::default();
        (0..n)
            .filter_map(|i| match event(&g, i) {
                Event::Bid(b) => Some(b),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn q0_q1_q2_are_the_native_queries() {
        let n = 20_000;
        let (q0, _) = run(
            r#"{"kind":"bid","fields":["auction","bidder","price","date_time","extra"]}"#,
            Kind::Bid,
            n,
        );
        assert_eq!(q0, queries::q0(&bids(n)));
        let (q1, _) = run(
            r#"{"kind":"bid","fields":["auction","bidder","price_eur","date_time","extra"]}"#,
            Kind::Bid,
            n,
        );
        assert_eq!(q1, queries::q1(&bids(n)));
        let (q2, out) = run(
            r#"{"kind":"bid","fields":["auction","price"],"key":"auction","filter":[{"field":"auction","mod":123,"eq":0}]}"#,
            Kind::Bid,
            n,
        );
        assert_eq!(q2, queries::q2(&bids(n)));
        assert!(!q2.is_empty());
        let r = out.iter().next().unwrap();
        let auction: i64 = q2[0].split(',').next().unwrap().parse().unwrap();
        assert_eq!(r.key, Some(&auction.to_le_bytes()[..]));
        assert!(r.timestamp.is_some());
    }

    #[test]
    fn text_filters_select_persons() {
        let (lines, _) = run(
            r#"{"kind":"person","fields":["id","state"],"filter":[{"field":"state","in":["OR","CA"]}]}"#,
            Kind::Person,
            5_000,
        );
        assert!(!lines.is_empty());
        assert!(
            lines
                .iter()
                .all(|l| l.ends_with(",OR") || l.ends_with(",CA"))
        );
    }

    #[test]
    fn bad_configs_and_lines_are_refused_naming_what() {
        for (json, what) in [
            (r#"{"kind":"bid","fields":["nope"]}"#, "nope"),
            (r#"{"kind":"bid","key":"channel"}"#, "channel"),
            (
                r#"{"kind":"person","filter":[{"field":"state","eq":3}]}"#,
                "state",
            ),
            (r#"{"kind":"x"}"#, "kind"),
        ] {
            let e = Config::parse(json).unwrap_err();
            assert!(e.contains(what), "{json}: {e}");
        }
        let c = Config::parse(r#"{"kind":"bid","key":"auction"}"#).unwrap();
        let err = parse_line(&c, b"1,2,3", &mut Batch::new(), &mut Vec::new()).unwrap_err();
        assert!(err.message.contains("7 columns"), "{}", err.message);
        let err = parse_line(&c, b"x,2,3,c,u,5,e", &mut Batch::new(), &mut Vec::new()).unwrap_err();
        assert!(err.message.contains("column 1"), "{}", err.message);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_refused() {
        let c = Config::parse(r#"{"kind":"bid"}"#).unwrap();
        let mut ctx = nop_stream_sdk::MockContext::for_operator::<NexmarkParse>();
        let mut op = NexmarkParse {
            config: c,
            buf: Vec::new(),
        };
        let mut batch = Batch::new();
        batch.push_record(None, Some(1), b"1,2,\xff\xfe,4,5,6,7");
        let mut out = Batch::new();
        let e = op.process(&mut ctx, 0, &batch, &mut out).unwrap_err();
        assert!(e.message.contains("not UTF-8"), "{}", e.message);
        assert!(out.is_empty());
    }

    #[test]
    fn ascii_finds_a_high_byte_anywhere() {
        for len in 0..40 {
            let line = vec![b'a'; len];
            assert!(ascii(&line));
            for at in 0..len {
                let mut l = line.clone();
                l[at] = 0x80 | (at as u8);
                assert!(!ascii(&l), "len {len}, high byte at {at}");
            }
        }
    }
}
