//! Event time of CSV records: the `event_time` config (design §8.5; Flink's
//! `TimestampAssigner`).
//!
//! ```json
//! "event_time": { "column": "time_hour", "format": "rfc3339", "add_minutes_column": "minute" }
//! ```
//!
//! Every record read gets the timestamp (ms since the Unix epoch) of its `column`, plus
//! `add_minutes_column` minutes if that is set (the flights file rounds `time_hour` down to
//! the hour and keeps the minute apart). Columns are named by the header line, so
//! `event_time` needs `format = "csv"` and `header = true`.
//!
//! # Formats
//! - `rfc3339`: `YYYY-MM-DDTHH:MM:SS[.fff]` then `Z` or `±HH:MM` (also `z`, `±HHMM`; `t` or
//!   a space instead of `T`). Fractions beyond milliseconds are truncated.
//! - `datetime`: `YYYY-MM-DD HH:MM:SS[.fff]` without offset, taken as UTC (`T` is
//!   accepted instead of the space).
//! - `epoch-ms`: an integer, milliseconds since the epoch.
//! - `epoch-s`: seconds since the epoch, an integer with an optional fraction
//!   (`1357034400`, `1357034400.25`).
//!
//! Seconds may be 60 (a leap second counts as the first second of the next minute). Values
//! are not trimmed: surrounding spaces make a value invalid.
//!
//! # Fields
//! One line is one record (a newline inside quotes is not supported, as for the whole
//! source). Fields are split at `,`; a field starting with `"` is quoted (RFC 4180, `""`
//! inside stands for `"`) and may contain `,`. Header names are unquoted before matching;
//! a UTF-8 byte-order mark before the header is ignored.

use serde::Deserialize;

/// How the event-time column is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeFormat {
    /// `2013-01-01T10:00:00Z`, `2013-01-01T05:00:00-05:00`.
    Rfc3339,
    /// Integer milliseconds since the Unix epoch.
    EpochMs,
    /// Seconds since the Unix epoch, optionally with a fraction.
    EpochS,
    /// Naive `2013-01-01 10:00:00`, taken as UTC.
    Datetime,
}

impl TimeFormat {
    fn describe(self) -> &'static str {
        match self {
            TimeFormat::Rfc3339 => {
                "an rfc3339 timestamp (like 2013-01-01T10:00:00Z or 2013-01-01T05:00:00-05:00)"
            }
            TimeFormat::EpochMs => "an epoch-ms timestamp (integer milliseconds since 1970)",
            TimeFormat::EpochS => "an epoch-s timestamp (seconds since 1970, like 1357034400)",
            TimeFormat::Datetime => "a datetime (like 2013-01-01 10:00:00, taken as UTC)",
        }
    }

    /// Parses `value` into ms since the Unix epoch.
    #[must_use]
    pub fn parse(self, value: &[u8]) -> Option<i64> {
        match self {
            TimeFormat::Rfc3339 => {
                let (ms, rest) = date_time(value)?;
                ms.checked_sub(offset_ms(rest)?)
            }
            TimeFormat::Datetime => match date_time(value)? {
                (ms, []) => Some(ms),
                _ => None,
            },
            TimeFormat::EpochMs => integer(value),
            TimeFormat::EpochS => epoch_seconds(value),
        }
    }
}

/// The `event_time` config object.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTimeConfig {
    /// Header name of the column holding the event time.
    pub column: String,
    /// How that column is written.
    pub format: TimeFormat,
    /// Header name of a column of whole minutes added to the time (e.g. flights `minute`).
    #[serde(default)]
    pub add_minutes_column: Option<String>,
}

/// An [`EventTimeConfig`] resolved against a header: column indexes and scratch space.
#[derive(Clone, Debug)]
pub struct EventTime {
    config: EventTimeConfig,
    column: usize,
    minutes: Option<usize>,
    /// Content ranges of the fields of the current line, up to the last one needed.
    fields: Vec<(usize, usize)>,
}

impl EventTime {
    /// Resolves the column names of `config` against the header line `header` of `path`.
    ///
    /// # Errors
    /// A column that is not in the header (the message names it and lists the header), or
    /// a header that does not split.
    pub fn resolve(config: &EventTimeConfig, header: &[u8], path: &str) -> Result<Self, String> {
        let header = header.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(header);
        let mut ranges = Vec::new();
        split(header, usize::MAX, &mut ranges)
            .map_err(|e| format!("file-source: header line of {path}: {e}"))?;
        let names: Vec<String> = ranges
            .iter()
            .map(|&(s, e)| String::from_utf8_lossy(&header[s..e]).replace("\"\"", "\""))
            .collect();
        let find = |what: &str, name: &str| {
            names.iter().position(|n| n == name).ok_or_else(|| {
                format!(
                    "file-source config \"event_time\": {what} {name:?} is not a column of {path}; its header has {}",
                    if header.is_empty() {
                        "no columns (the first line is empty)".to_string()
                    } else {
                        format!("columns: {}", names.join(", "))
                    }
                )
            })
        };
        let column = find("column", &config.column)?;
        let minutes = match &config.add_minutes_column {
            Some(m) => Some(find("add_minutes_column", m)?),
            None => None,
        };
        Ok(Self {
            config: config.clone(),
            column,
            minutes,
            fields: Vec::new(),
        })
    }

    /// The event time of one record (a CSV line without its line ending).
    ///
    /// # Errors
    /// A message naming the column and the value (the caller adds where the record is):
    /// too few fields, broken quoting, a value that does not parse, an overflow.
    pub fn timestamp(&mut self, line: &[u8]) -> Result<i64, String> {
        let last = self.column.max(self.minutes.unwrap_or(0));
        split(line, last + 1, &mut self.fields)?;
        let config = &self.config;
        let value = |i: usize| -> Result<&[u8], String> {
            let (s, e) = self.fields.get(i).copied().ok_or_else(|| {
                let name = if i == self.column {
                    &config.column
                } else {
                    config.add_minutes_column.as_ref().unwrap_or(&config.column)
                };
                format!(
                    "event_time column {name:?} is field {} but the record has only {} fields",
                    i + 1,
                    self.fields.len()
                )
            })?;
            Ok(&line[s..e])
        };
        let raw = value(self.column)?;
        let mut ts = config.format.parse(raw).ok_or_else(|| {
            format!(
                "event_time column {:?}: value {:?} is not {}",
                config.column,
                String::from_utf8_lossy(raw),
                config.format.describe()
            )
        })?;
        if let (Some(i), Some(name)) = (self.minutes, &config.add_minutes_column) {
            let raw = value(i)?;
            let minutes = integer(raw).ok_or_else(|| {
                format!(
                    "event_time add_minutes_column {name:?}: value {:?} is not an integer number of minutes",
                    String::from_utf8_lossy(raw)
                )
            })?;
            ts = minutes
                .checked_mul(60_000)
                .and_then(|m| ts.checked_add(m))
                .ok_or_else(|| {
                    format!(
                        "event_time: {:?} plus {minutes} minutes overflows a millisecond timestamp",
                        String::from_utf8_lossy(value(self.column).unwrap_or_default())
                    )
                })?;
        }
        Ok(ts)
    }
}

/// Splits `line` into the content ranges of its first `limit` fields (fewer if the line
/// has fewer); quoted fields yield the range inside the quotes, `""` escapes not undone.
///
/// # Errors
/// A quoted field among them is not closed or has text after its closing quote.
pub fn split(line: &[u8], limit: usize, out: &mut Vec<(usize, usize)>) -> Result<(), String> {
    out.clear();
    let mut i = 0;
    while out.len() < limit {
        let next = if line.get(i) == Some(&b'"') {
            let mut j = i + 1;
            loop {
                match line.get(j) {
                    None => {
                        return Err(format!("field {} has an unterminated quote", out.len() + 1));
                    }
                    Some(b'"') if line.get(j + 1) == Some(&b'"') => j += 2,
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            out.push((i + 1, j));
            match line.get(j + 1) {
                None => return Ok(()),
                Some(b',') => j + 2,
                Some(_) => {
                    return Err(format!(
                        "field {} has text after its closing quote",
                        out.len()
                    ));
                }
            }
        } else {
            let end = memchr::memchr(b',', &line[i..]).map_or(line.len(), |p| i + p);
            out.push((i, end));
            if end == line.len() {
                return Ok(());
            }
            end + 1
        };
        i = next;
    }
    Ok(())
}

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d` (H. Hinnant's
/// `days_from_civil`).
#[must_use]
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Exactly `n` ASCII digits at the start of `s`.
fn digits(s: &[u8], n: usize) -> Option<u32> {
    let d = s.get(..n)?;
    d.iter().try_fold(0u32, |acc, b| {
        b.is_ascii_digit().then(|| acc * 10 + u32::from(b - b'0'))
    })
}

/// `YYYY-MM-DD(T|t| )HH:MM:SS[.f+]` at the start of `s`: ms since the epoch (as UTC) and
/// the rest of `s`.
fn date_time(s: &[u8]) -> Option<(i64, &[u8])> {
    if s.len() < 19
        || s[4] != b'-'
        || s[7] != b'-'
        || !matches!(s[10], b'T' | b't' | b' ')
        || s[13] != b':'
        || s[16] != b':'
    {
        return None;
    }
    let y = i64::from(digits(s, 4)?);
    let mo = digits(&s[5..], 2)?;
    let d = digits(&s[8..], 2)?;
    let h = digits(&s[11..], 2)?;
    let mi = digits(&s[14..], 2)?;
    let sec = digits(&s[17..], 2)?;
    if !(1..=12).contains(&mo) || d == 0 || d > days_in_month(y, mo) || h > 23 || mi > 59 {
        return None;
    }
    if sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac_ms = 0i64;
    if let Some(f) = rest.strip_prefix(b".") {
        let n = f.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        for k in 0..3 {
            frac_ms = frac_ms * 10
                + f.get(k)
                    .filter(|_| k < n)
                    .map_or(0, |b| i64::from(b - b'0'));
        }
        rest = &f[n..];
    }
    let secs = days_from_civil(y, mo, d) * 86_400
        + i64::from(h) * 3600
        + i64::from(mi) * 60
        + i64::from(sec);
    Some((secs * 1000 + frac_ms, rest))
}

/// `Z`, `z`, `±HH:MM` or `±HHMM` (the whole of `s`) as ms east of UTC.
fn offset_ms(s: &[u8]) -> Option<i64> {
    let (sign, hm) = match s {
        [b'Z' | b'z'] => return Some(0),
        [b'+', rest @ ..] => (1, rest),
        [b'-', rest @ ..] => (-1, rest),
        _ => return None,
    };
    let (h, m) = match hm.len() {
        5 if hm[2] == b':' => (digits(hm, 2)?, digits(&hm[3..], 2)?),
        4 => (digits(hm, 2)?, digits(&hm[2..], 2)?),
        _ => return None,
    };
    if h > 23 || m > 59 {
        return None;
    }
    Some(sign * (i64::from(h) * 3600 + i64::from(m) * 60) * 1000)
}

/// An optionally signed decimal integer, nothing else.
fn integer(s: &[u8]) -> Option<i64> {
    nop_stream_sdk::num::parse_i64(s)
}

/// `[-+]digits[.digits]` seconds as ms (fraction beyond ms truncated toward zero).
fn epoch_seconds(s: &[u8]) -> Option<i64> {
    let (neg, body) = match s {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, s),
    };
    let (int, frac) = match body.iter().position(|b| *b == b'.') {
        Some(p) => (&body[..p], Some(&body[p + 1..])),
        None => (body, None),
    };
    if int.is_empty() || !int.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut ms = std::str::from_utf8(int)
        .ok()?
        .parse::<i64>()
        .ok()?
        .checked_mul(1000)?;
    if let Some(f) = frac {
        if f.is_empty() || !f.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut part = 0i64;
        for k in 0..3 {
            part = part * 10 + f.get(k).map_or(0, |b| i64::from(b - b'0'));
        }
        ms = ms.checked_add(part)?;
    }
    Some(if neg { -ms } else { ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000;
    /// 2013-01-01T00:00:00Z.
    const Y2013: i64 = 1_356_998_400_000;

    fn cfg(json: &str) -> EventTimeConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2013, 1, 1) * 86_400_000, Y2013);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(days_from_civil(1600, 1, 1), -135_140);
    }

    #[test]
    fn rfc3339() {
        let f = TimeFormat::Rfc3339;
        let p = |s: &str| f.parse(s.as_bytes());
        assert_eq!(p("2013-01-01T10:00:00Z"), Some(Y2013 + 10 * HOUR));
        assert_eq!(p("2013-01-01t10:00:00z"), Some(Y2013 + 10 * HOUR));
        assert_eq!(p("2013-01-01 10:00:00Z"), Some(Y2013 + 10 * HOUR));
        assert_eq!(p("2013-01-01T05:00:00-05:00"), Some(Y2013 + 10 * HOUR));
        assert_eq!(p("2013-01-01T15:30:00+05:30"), Some(Y2013 + 10 * HOUR));
        assert_eq!(p("2013-01-01T15:30:00+0530"), Some(Y2013 + 10 * HOUR));
        assert_eq!(
            p("2013-01-01T10:00:00.1234Z"),
            Some(Y2013 + 10 * HOUR + 123)
        );
        assert_eq!(p("2013-01-01T10:00:00.5Z"), Some(Y2013 + 10 * HOUR + 500));
        assert_eq!(p("1969-12-31T23:59:59Z"), Some(-1000));
        assert_eq!(p("2012-06-30T23:59:60Z"), p("2012-07-01T00:00:00Z"));
        assert_eq!(p("2012-02-29T00:00:00Z"), Some(1_330_473_600_000));
        for bad in [
            "",
            "2013-01-01T10:00:00",
            "2013-01-01 10:00:00",
            "2013-01-01T10:00Z",
            "2013-02-29T10:00:00Z",
            "2013-13-01T10:00:00Z",
            "2013-01-00T10:00:00Z",
            "2013-01-01T24:00:00Z",
            "2013-01-01T10:60:00Z",
            "2013-01-01T10:00:00.Z",
            "2013-01-01T10:00:00+5:00",
            "2013-01-01T10:00:00+24:00",
            "2013-01-01T10:00:00Z ",
            " 2013-01-01T10:00:00Z",
            "2013/01/01T10:00:00Z",
            "NA",
        ] {
            assert_eq!(p(bad), None, "{bad}");
        }
    }

    #[test]
    fn datetime_epoch_ms_and_epoch_s() {
        let dt = |s: &str| TimeFormat::Datetime.parse(s.as_bytes());
        assert_eq!(dt("2013-01-01 10:00:00"), Some(Y2013 + 10 * HOUR));
        assert_eq!(dt("2013-01-01T10:00:00"), Some(Y2013 + 10 * HOUR));
        assert_eq!(dt("2013-01-01 10:00:00.250"), Some(Y2013 + 10 * HOUR + 250));
        assert_eq!(dt("2013-01-01 10:00:00Z"), None);
        assert_eq!(dt("2013-01-01"), None);
        let ms = |s: &str| TimeFormat::EpochMs.parse(s.as_bytes());
        assert_eq!(ms("1357034400000"), Some(Y2013 + 10 * HOUR));
        assert_eq!(ms("-5"), Some(-5));
        assert_eq!(ms("1357034400000.0"), None);
        assert_eq!(ms(""), None);
        assert_eq!(ms("99999999999999999999"), None);
        let s = |v: &str| TimeFormat::EpochS.parse(v.as_bytes());
        assert_eq!(s("1357034400"), Some(Y2013 + 10 * HOUR));
        assert_eq!(s("1357034400.25"), Some(Y2013 + 10 * HOUR + 250));
        assert_eq!(s("1.2345"), Some(1234));
        assert_eq!(s("-1.5"), Some(-1500));
        assert_eq!(s("+2"), Some(2000));
        for bad in ["", "-", ".5", "1.", "1e3", "x", "9223372036854775807"] {
            assert_eq!(s(bad), None, "{bad}");
        }
    }

    #[test]
    fn split_handles_quotes_and_limits() {
        let mut r = Vec::new();
        let line = br#"a,"b,c",,"d""e",f"#;
        split(line, usize::MAX, &mut r).unwrap();
        let t: Vec<&[u8]> = r.iter().map(|&(s, e)| &line[s..e]).collect();
        assert_eq!(t, vec![&b"a"[..], b"b,c", b"", b"d\"\"e", b"f"]);
        split(line, 2, &mut r).unwrap();
        assert_eq!(r.len(), 2);
        split(b"", 5, &mut r).unwrap();
        assert_eq!(r, vec![(0, 0)]);
        assert!(
            split(br#"a,"b"#, 5, &mut r)
                .unwrap_err()
                .contains("field 2")
        );
        assert!(
            split(br#""a"b,c"#, 5, &mut r)
                .unwrap_err()
                .contains("field 1")
        );
        // Broken quoting after the last needed field is not looked at.
        split(br#"a,"b"#, 1, &mut r).unwrap();
    }

    #[test]
    fn resolves_columns_and_adds_minutes() {
        let header = b"\xEF\xBB\xBFyear,\"minute\",time_hour";
        let mut et = EventTime::resolve(
            &cfg(r#"{"column":"time_hour","format":"rfc3339","add_minutes_column":"minute"}"#),
            header,
            "/input/f.csv",
        )
        .unwrap();
        assert_eq!(
            et.timestamp(b"2013,15,2013-01-01T10:00:00Z"),
            Ok(Y2013 + 10 * HOUR + 15 * 60_000)
        );
        assert_eq!(
            et.timestamp(b"2013,\"-5\",\"2013-01-01T10:00:00Z\""),
            Ok(Y2013 + 10 * HOUR - 5 * 60_000)
        );
        let err = et.timestamp(b"2013,x,2013-01-01T10:00:00Z").unwrap_err();
        assert_eq!(
            err,
            r#"event_time add_minutes_column "minute": value "x" is not an integer number of minutes"#
        );
        let err = et.timestamp(b"2013,15,2013-01-01 10:00").unwrap_err();
        assert_eq!(
            err,
            r#"event_time column "time_hour": value "2013-01-01 10:00" is not an rfc3339 timestamp (like 2013-01-01T10:00:00Z or 2013-01-01T05:00:00-05:00)"#
        );
        let err = et.timestamp(b"2013,15").unwrap_err();
        assert_eq!(
            err,
            r#"event_time column "time_hour" is field 3 but the record has only 2 fields"#
        );
        let err = et.timestamp(b"2013,\"15").unwrap_err();
        assert!(err.contains("unterminated quote"), "{err}");

        let mut et =
            EventTime::resolve(&cfg(r#"{"column":"t","format":"epoch-s"}"#), b"t,v", "/p").unwrap();
        assert_eq!(et.timestamp(b"10,whatever,more"), Ok(10_000));

        let err = EventTime::resolve(
            &cfg(r#"{"column":"when","format":"epoch-ms"}"#),
            b"a,b",
            "/input/x.csv",
        )
        .unwrap_err();
        assert_eq!(
            err,
            r#"file-source config "event_time": column "when" is not a column of /input/x.csv; its header has columns: a, b"#
        );
        let err = EventTime::resolve(
            &cfg(r#"{"column":"a","format":"epoch-ms","add_minutes_column":"m"}"#),
            b"a,b",
            "/p",
        )
        .unwrap_err();
        assert!(err.contains(r#"add_minutes_column "m""#), "{err}");
        let err = EventTime::resolve(&cfg(r#"{"column":"a","format":"epoch-ms"}"#), b"", "/p")
            .unwrap_err();
        assert!(err.contains("first line is empty"), "{err}");
    }

    #[test]
    fn config_object_is_strict() {
        assert!(serde_json::from_str::<EventTimeConfig>(r#"{"column":"a"}"#).is_err());
        assert!(
            serde_json::from_str::<EventTimeConfig>(r#"{"column":"a","format":"iso"}"#).is_err()
        );
        assert!(
            serde_json::from_str::<EventTimeConfig>(r#"{"column":"a","format":"epoch-s","x":1}"#)
                .is_err()
        );
        let c = cfg(r#"{"column":"a","format":"datetime"}"#);
        assert_eq!(
            (c.format, c.add_minutes_column),
            (TimeFormat::Datetime, None)
        );
    }
}
