//! The NYC flights 2013 schema and the line → JSON mapping.
//!
//! Values: an unquoted `NA` or an unquoted empty field is a missing value and becomes
//! `null` in every column; numeric columns hold integers or decimals (quoted or not) and
//! become JSON numbers (integers keep their digits, decimals are re-printed in shortest
//! round-trip form); text columns become JSON strings with CSV quoting undone.

use std::io::Write as _;

use serde::Deserialize;

use crate::csv::{Field, split_line};

/// Type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A JSON number (or null).
    Number,
    /// A JSON string (or null).
    Text,
}

/// The columns of `flights.csv`, in file order.
pub const COLUMNS: [(&str, Kind); 19] = [
    ("year", Kind::Number),
    ("month", Kind::Number),
    ("day", Kind::Number),
    ("dep_time", Kind::Number),
    ("sched_dep_time", Kind::Number),
    ("dep_delay", Kind::Number),
    ("arr_time", Kind::Number),
    ("sched_arr_time", Kind::Number),
    ("arr_delay", Kind::Number),
    ("carrier", Kind::Text),
    ("flight", Kind::Number),
    ("tailnum", Kind::Text),
    ("origin", Kind::Text),
    ("dest", Kind::Text),
    ("air_time", Kind::Number),
    ("distance", Kind::Number),
    ("hour", Kind::Number),
    ("minute", Kind::Number),
    ("time_hour", Kind::Text),
];

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"key":{"type":"string","enum":["year","month","day","dep_time","sched_dep_time","dep_delay","arr_time","sched_arr_time","arr_delay","carrier","flight","tailnum","origin","dest","air_time","distance","hour","minute","time_hour"],"default":"carrier","x-key-spec":true,"description":"column whose value becomes the record key"},"fields":{"type":"array","items":{"type":"string","enum":["year","month","day","dep_time","sched_dep_time","dep_delay","arr_time","sched_arr_time","arr_delay","carrier","flight","tailnum","origin","dest","air_time","distance","hour","minute","time_hour"]},"description":"columns to keep, in output order; default all, in file order"},"skip_null_key":{"type":"boolean","default":false,"description":"drop records whose key column is missing (unquoted NA or empty) or an empty quoted string"}}}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    key: Option<String>,
    fields: Option<Vec<String>>,
    skip_null_key: Option<bool>,
}

/// Validated configuration: column indexes into [`COLUMNS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Column whose value is the record key (default `carrier`).
    pub key: usize,
    /// Columns written to the output object, in output order (default: all, file order).
    pub fields: Vec<usize>,
    /// Drop records whose key is empty: the key column is missing (unquoted `NA` or empty)
    /// or a quoted empty string (default `false`: such records get the empty key).
    pub skip_null_key: bool,
}

fn column(name: &str) -> Result<usize, String> {
    COLUMNS.iter().position(|(c, _)| *c == name).ok_or_else(|| {
        let names: Vec<&str> = COLUMNS.iter().map(|(c, _)| *c).collect();
        format!("unknown column {name:?}; columns are {}", names.join(", "))
    })
}

impl Config {
    /// Parses `{ "key": "carrier", "fields": ["carrier", "dep_delay"], "skip_null_key": false }`.
    ///
    /// # Errors
    /// Malformed JSON, unknown fields or columns, a column listed twice.
    pub fn parse(json: &str) -> Result<Self, String> {
        let raw: RawConfig =
            serde_json::from_str(json).map_err(|e| format!("flights-mapper config: {e}"))?;
        let key = column(raw.key.as_deref().unwrap_or("carrier"))
            .map_err(|e| format!("flights-mapper config \"key\": {e}"))?;
        let fields = match raw.fields {
            None => (0..COLUMNS.len()).collect(),
            Some(names) => {
                let mut idx = Vec::with_capacity(names.len());
                for n in &names {
                    let i =
                        column(n).map_err(|e| format!("flights-mapper config \"fields\": {e}"))?;
                    if idx.contains(&i) {
                        return Err(format!(
                            "flights-mapper config \"fields\": {n:?} listed twice"
                        ));
                    }
                    idx.push(i);
                }
                idx
            }
        };
        Ok(Self {
            key,
            fields,
            skip_null_key: raw.skip_null_key.unwrap_or(false),
        })
    }
}

/// A parsed value of one column of the current line.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
    /// Text of the column's field (see `Mapper::fields`).
    Text,
}

/// Maps CSV lines to JSON objects, reusing its buffers across lines.
#[derive(Debug)]
pub struct Mapper {
    config: Config,
    fields: Vec<Field>,
    values: Vec<Value>,
}

/// What [`Mapper::parse`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A data line; call [`Mapper::write_key`] and [`Mapper::write_json`].
    Row,
    /// The header line (every field equals its column name); it produces no record.
    Header,
}

fn number(text: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(text).ok()?;
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::Int(i));
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() => Some(Value::Float(f)),
        _ => None,
    }
}

fn write_text(out: &mut Vec<u8>, raw: &[u8], escaped: bool) {
    out.push(b'"');
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        match b {
            b'"' => {
                out.extend_from_slice(b"\\\"");
                // `""` inside a quoted field is one quote.
                if escaped && raw.get(i + 1) == Some(&b'"') {
                    i += 1;
                }
            }
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                let _ = write!(out, "\\u{b:04x}");
            }
            _ => out.push(b),
        }
        i += 1;
    }
    out.push(b'"');
}

fn write_number(out: &mut Vec<u8>, v: Value) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        // Shortest round-trip form, the same serde_json prints (downstream key derivation
        // relies on it).
        Value::Float(f) => {
            let _ = serde_json::to_writer(&mut *out, &f);
        }
        Value::Null | Value::Text => {}
    }
}

impl Mapper {
    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A mapper for `config`.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            fields: Vec::with_capacity(COLUMNS.len()),
            values: Vec::with_capacity(COLUMNS.len()),
        }
    }

    /// Splits and type-checks `line`.
    ///
    /// # Errors
    /// A message naming the column and value: wrong field count, broken quoting,
    /// a non-number in a numeric column, text that is not UTF-8.
    pub fn parse(&mut self, line: &[u8]) -> Result<Parsed, String> {
        split_line(line, &mut self.fields)?;
        if self.fields.len() != COLUMNS.len() {
            return Err(format!(
                "expected {} fields, found {}",
                COLUMNS.len(),
                self.fields.len()
            ));
        }
        if self.fields[0].raw(line) == b"year"
            && self
                .fields
                .iter()
                .zip(COLUMNS)
                .all(|(f, (name, _))| f.raw(line) == name.as_bytes())
        {
            return Ok(Parsed::Header);
        }
        self.values.clear();
        for (f, (name, kind)) in self.fields.iter().zip(COLUMNS) {
            let raw = f.raw(line);
            let v = if !f.quoted && (raw.is_empty() || raw == b"NA") {
                Value::Null
            } else {
                match kind {
                    Kind::Number => number(raw).ok_or_else(|| {
                        format!(
                            "column {name}: value {:?} is not a number",
                            String::from_utf8_lossy(raw)
                        )
                    })?,
                    Kind::Text => {
                        std::str::from_utf8(raw).map_err(|_| {
                            format!(
                                "column {name}: value {:?} is not UTF-8",
                                String::from_utf8_lossy(raw)
                            )
                        })?;
                        Value::Text
                    }
                }
            };
            self.values.push(v);
        }
        Ok(Parsed::Row)
    }

    /// Appends the key of the parsed line to `out`: the key column's text, its number as
    /// printed in the JSON, or nothing when it is null.
    pub fn write_key(&self, line: &[u8], out: &mut Vec<u8>) {
        let i = self.config.key;
        match self.values[i] {
            Value::Text => {
                let f = self.fields[i];
                if f.escaped {
                    let mut rest = f.raw(line);
                    while let Some(p) = rest.windows(2).position(|w| w == b"\"\"") {
                        out.extend_from_slice(&rest[..=p]);
                        rest = &rest[p + 2..];
                    }
                    out.extend_from_slice(rest);
                } else {
                    out.extend_from_slice(f.raw(line));
                }
            }
            v => write_number(out, v),
        }
    }

    /// Appends the parsed line as a compact JSON object of the configured fields.
    pub fn write_json(&self, line: &[u8], out: &mut Vec<u8>) {
        out.push(b'{');
        for (n, &i) in self.config.fields.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(COLUMNS[i].0.as_bytes());
            out.extend_from_slice(b"\":");
            match self.values[i] {
                Value::Null => out.extend_from_slice(b"null"),
                Value::Text => {
                    let f = self.fields[i];
                    write_text(out, f.raw(line), f.escaped);
                }
                v => write_number(out, v),
            }
        }
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour";

    fn map(config: &str, line: &str) -> Result<Option<(String, String)>, String> {
        let mut m = Mapper::new(Config::parse(config)?);
        if m.parse(line.as_bytes())? == Parsed::Header {
            return Ok(None);
        }
        let (mut k, mut j) = (Vec::new(), Vec::new());
        m.write_key(line.as_bytes(), &mut k);
        m.write_json(line.as_bytes(), &mut j);
        Ok(Some((
            String::from_utf8(k).unwrap(),
            String::from_utf8(j).unwrap(),
        )))
    }

    #[test]
    fn maps_the_sample_row_quoted_and_unquoted() {
        let want = r#"{"year":2013,"month":1,"day":1,"dep_time":517,"sched_dep_time":515,"dep_delay":2,"arr_time":830,"sched_arr_time":819,"arr_delay":11,"carrier":"UA","flight":1545,"tailnum":"N14228","origin":"EWR","dest":"IAH","air_time":227,"distance":1400,"hour":5,"minute":15,"time_hour":"2013-01-01 10:00:00"}"#;
        let quoted = r#"2013,1,1,517,515,2,830,819,11,"UA",1545,"N14228","EWR","IAH",227,1400,5,15,2013-01-01 10:00:00"#;
        let plain = quoted.replace('"', "");
        for line in [quoted, plain.as_str()] {
            let (k, j) = map("{}", line).unwrap().unwrap();
            assert_eq!(k, "UA");
            assert_eq!(j, want);
            let v: serde_json::Value = serde_json::from_str(&j).unwrap();
            assert_eq!(v["dep_delay"], 2);
        }
    }

    #[test]
    fn na_is_null_and_fields_select_and_order() {
        let line =
            "2013,1,1,NA,1630,NA,NA,1815,NA,EV,4308,NA,EWR,RDU,NA,416,16,30,2013-01-01T21:00:00Z";
        let (k, j) = map(
            r#"{"key":"tailnum","fields":["carrier","dep_delay","tailnum","distance"]}"#,
            line,
        )
        .unwrap()
        .unwrap();
        assert_eq!(k, "");
        assert_eq!(
            j,
            r#"{"carrier":"EV","dep_delay":null,"tailnum":null,"distance":416}"#
        );
        // A quoted "NA" is the string NA; a numeric key prints as in the JSON.
        let line = r#"2013,1,1,1,2,-3.50,4,5,6,"NA",7,"a""b\",EWR,RDU,8,9,10,11,x"#;
        let (k, j) = map(
            r#"{"key":"dep_delay","fields":["carrier","tailnum","dep_delay"]}"#,
            line,
        )
        .unwrap()
        .unwrap();
        assert_eq!(k, "-3.5");
        assert_eq!(j, r#"{"carrier":"NA","tailnum":"a\"b\\","dep_delay":-3.5}"#);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["tailnum"], "a\"b\\");
        let (k, _) = map(r#"{"key":"tailnum"}"#, line).unwrap().unwrap();
        assert_eq!(k, "a\"b\\");
    }

    #[test]
    fn header_lines_are_skipped() {
        assert_eq!(map("{}", HEADER).unwrap(), None);
        let quoted: Vec<String> = HEADER.split(',').map(|c| format!("\"{c}\"")).collect();
        assert_eq!(map("{}", &quoted.join(",")).unwrap(), None);
    }

    #[test]
    fn malformed_lines_name_column_and_value() {
        let err = map("{}", "2013,1,1").unwrap_err();
        assert!(err.contains("expected 19 fields, found 3"), "{err}");
        let line = "2013,1,1,517,515,abc,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,x";
        let err = map("{}", line).unwrap_err();
        assert!(err.contains("dep_delay") && err.contains("abc"), "{err}");
        let line = "2013,1,1,517,515,inf,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,x";
        assert!(map("{}", line).unwrap_err().contains("dep_delay"));
        let line = "2013,1,1,517,515,\"NA\",830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,x";
        assert!(map("{}", line).unwrap_err().contains("dep_delay"));
    }

    #[test]
    fn bad_configs_are_rejected() {
        for bad in [
            r#"{"key":"nope"}"#,
            r#"{"fields":["year","year"]}"#,
            r#"{"fields":["colour"]}"#,
            r#"{"other":1}"#,
            "[",
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        let c = Config::parse("{}").unwrap();
        assert_eq!(c.key, 9);
        assert_eq!(c.fields.len(), 19);
        assert!(!c.skip_null_key);
        assert!(
            Config::parse(r#"{"skip_null_key":true}"#)
                .unwrap()
                .skip_null_key
        );
        assert!(Config::parse(r#"{"skip_null_key":"yes"}"#).is_err());
        serde_json::from_str::<serde_json::Value>(CONFIG_SCHEMA).unwrap();
    }

    /// The schema's column enums (what `nopstream validate` checks) list exactly
    /// [`COLUMNS`], in file order.
    #[test]
    fn the_config_schema_lists_every_column() {
        let schema: serde_json::Value = serde_json::from_str(CONFIG_SCHEMA).unwrap();
        let want: Vec<&str> = COLUMNS.iter().map(|(c, _)| *c).collect();
        for at in ["/properties/key/enum", "/properties/fields/items/enum"] {
            let have: Vec<&str> = schema
                .pointer(at)
                .and_then(|v| v.as_array())
                .unwrap_or_else(|| panic!("no {at}"))
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(have, want, "{at}");
        }
    }

    /// Maps the whole real file (`unzip -p examples/flights/data/flights.csv.zip >
    /// /tmp/flights.csv` first).
    #[test]
    #[ignore = "needs /tmp/flights.csv: unzip -p examples/flights/data/flights.csv.zip > /tmp/flights.csv"]
    fn maps_the_real_file() {
        let text = std::fs::read_to_string("/tmp/flights.csv").expect(
            "/tmp/flights.csv: unzip -p examples/flights/data/flights.csv.zip > /tmp/flights.csv",
        );
        let mut m = Mapper::new(Config::parse("{}").unwrap());
        let (mut k, mut j) = (Vec::new(), Vec::new());
        let mut rows = 0;
        for line in text.lines() {
            if m.parse(line.as_bytes()).unwrap() == Parsed::Header {
                continue;
            }
            k.clear();
            j.clear();
            m.write_key(line.as_bytes(), &mut k);
            m.write_json(line.as_bytes(), &mut j);
            let v: serde_json::Value = serde_json::from_slice(&j).unwrap();
            assert_eq!(v["carrier"].as_str().unwrap().as_bytes(), k.as_slice());
            rows += 1;
        }
        assert_eq!(rows, 336_776);
    }
}
