//! `flights-mapper`: parses lines of the NYC flights 2013 CSV into typed JSON records keyed
//! by a chosen column.
//!
//! Config: `{ "key": "carrier", "fields": ["carrier", "dep_delay", ...], "skip_null_key":
//! false }` — `key` (default `carrier`) is the column whose value becomes the record key
//! (its text; a number as printed in the JSON; empty for `NA`); `fields` (default all 19
//! columns, file order) lists the columns of the output object, in output order;
//! `skip_null_key` (default `false`) drops records whose key is empty — an unquoted `NA` or
//! empty field, or a quoted `""` (e.g. cancelled flights without `tailnum` when keying by
//! tailnum). A quoted `"NA"` is the text NA and is kept.
//!
//! Per input line at most one record: a compact JSON object (numbers as numbers, `NA` and
//! empty unquoted fields as `null`, strings unquoted; see [`flights`]). The header line
//! itself is recognised and produces nothing. A malformed line fails with `invalid-record`
//! naming the record index, column and value.
//!
//! Input timestamps (event time, e.g. from `file-source`'s `event_time`) are carried to the
//! output record of the same input record, in input order; a line that produces no record
//! (header, skipped null key) drops its timestamp with it.

pub mod csv;
pub mod flights;

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};

use crate::flights::{CONFIG_SCHEMA, Config, Mapper, Parsed};

/// The operator: a [`Mapper`] and a reused key buffer; no state.
#[derive(Debug)]
pub struct FlightsMapper {
    mapper: Mapper,
    key: Vec<u8>,
}

impl Operator for FlightsMapper {
    fn describe() -> PluginInfo {
        PluginInfo::operator("flights-mapper", "0.1.0")
            .description(
                "Parses NYC flights 2013 CSV lines into typed JSON records keyed by a column",
            )
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(Self {
            mapper: Mapper::new(Config::parse(config).map_err(PluginError::invalid_config)?),
            key: Vec::new(),
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for (i, rec) in batch.iter().enumerate() {
            let line = rec.data;
            match self.mapper.parse(line) {
                Ok(Parsed::Row) => {}
                Ok(Parsed::Header) => continue,
                Err(e) => return Err(PluginError::invalid_record(format!("record {i}: {e}"))),
            }
            self.key.clear();
            self.mapper.write_key(line, &mut self.key);
            if self.key.is_empty() && self.mapper.config().skip_null_key {
                continue;
            }
            let mapper = &self.mapper;
            out.push_with(Some(&self.key), rec.timestamp, |buf| {
                mapper.write_json(line, buf);
            });
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(FlightsMapper);

#[cfg(test)]
mod tests {
    use nop_stream_sdk::{ErrorCode, MockContext};

    use super::*;

    #[test]
    fn maps_a_batch_with_keys() {
        let mut ctx = MockContext::for_operator::<FlightsMapper>();
        let mut op = FlightsMapper::open(
            &mut ctx,
            &TaskInfo::for_tests(),
            r#"{"key":"origin","fields":["carrier","dep_delay"]}"#,
        )
        .unwrap();
        let mut input = Batch::default();
        input.push(b"year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour");
        input.push(br#"2013,1,1,517,515,2,830,819,11,"UA",1545,"N14228","EWR","IAH",227,1400,5,15,2013-01-01 10:00:00"#);
        input.push(
            b"2013,1,1,NA,1630,NA,NA,1815,NA,EV,4308,NA,JFK,RDU,NA,416,16,30,2013-01-01T21:00:00Z",
        );
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out.key(0), Some(&b"EWR"[..]));
        assert_eq!(out.record(0), br#"{"carrier":"UA","dep_delay":2}"#);
        assert_eq!(out.key(1), Some(&b"JFK"[..]));
        assert_eq!(out.record(1), br#"{"carrier":"EV","dep_delay":null}"#);
    }

    const HEADER: &[u8] = b"year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour";
    const CEP: &str =
        r#""fields":["time_hour","minute","tailnum","origin","carrier","flight","dep_delay"]"#;

    fn run(config: &str, input: &Batch) -> Batch {
        let mut ctx = MockContext::for_operator::<FlightsMapper>();
        let mut op = FlightsMapper::open(&mut ctx, &TaskInfo::for_tests(), config).unwrap();
        let mut out = Batch::default();
        op.process(&mut ctx, 0, input, &mut out).unwrap();
        out.validate().unwrap();
        out
    }

    /// Rows as file-source delivers them with `event_time` set: every record timestamped.
    fn timed_input() -> Batch {
        let mut input = Batch::default();
        for (ts, line) in [
            (1, HEADER),
            (10, &b"2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z"[..]),
            (20, b"2013,1,1,NA,1630,NA,NA,1815,NA,EV,4308,NA,JFK,RDU,NA,416,16,30,2013-01-01T21:00:00Z"),
            (30, b"2013,1,1,544,545,-1.5,1004,1022,-18,B6,725,N804JB,JFK,BQN,183,1576,5,45,2013-01-01T10:00:00Z"),
            (40, b"2013,1,2,NA,600,NA,NA,901,NA,AA,301,,LGA,ORD,NA,733,6,0,2013-01-02T11:00:00Z"),
            (50, br#"2013,1,2,NA,600,NA,NA,901,NA,AA,302,"",LGA,ORD,NA,733,6,0,2013-01-02T11:00:00Z"#),
            (60, br#"2013,1,2,601,600,1,902,901,1,AA,303,"NA",LGA,ORD,100,733,6,0,2013-01-02T11:00:00Z"#),
        ] {
            input.push_record(None, Some(ts), line);
        }
        input
    }

    #[test]
    fn timestamps_follow_their_records() {
        let input = timed_input();
        let out = run(&format!(r#"{{"key":"tailnum",{CEP}}}"#), &input);
        // Header dropped with its timestamp; every row kept, empty keys included.
        assert_eq!(out.timestamps, vec![10, 20, 30, 40, 50, 60]);
        let keys: Vec<&[u8]> = (0..out.len()).map(|i| out.key(i).unwrap()).collect();
        assert_eq!(keys, vec![&b"N14228"[..], b"", b"N804JB", b"", b"", b"NA"]);
        // Untimed input stays untimed.
        let mut plain = Batch::default();
        plain.push(input.record(1));
        assert!(!run("{}", &plain).has_timestamps());
    }

    #[test]
    fn skip_null_key_drops_records_and_their_timestamps() {
        let input = timed_input();
        let out = run(
            &format!(r#"{{"key":"tailnum","skip_null_key":true,{CEP}}}"#),
            &input,
        );
        assert_eq!(out.timestamps, vec![10, 30, 60]);
        let keys: Vec<&[u8]> = (0..out.len()).map(|i| out.key(i).unwrap()).collect();
        assert_eq!(keys, vec![&b"N14228"[..], b"N804JB", b"NA"]);
        assert_eq!(
            out.record(0),
            br#"{"time_hour":"2013-01-01T10:00:00Z","minute":15,"tailnum":"N14228","origin":"EWR","carrier":"UA","flight":1545,"dep_delay":2}"#
        );
        let v: serde_json::Value = serde_json::from_slice(out.record(1)).unwrap();
        assert_eq!(v["dep_delay"], serde_json::json!(-1.5));
        assert_eq!(v["minute"], 45);
        assert_eq!(v["flight"], 725);
        // A null dep_delay is JSON null, not a string; skip_null_key only looks at the key.
        let out = run(
            &format!(r#"{{"key":"carrier","skip_null_key":true,{CEP}}}"#),
            &input,
        );
        assert_eq!(out.timestamps, vec![10, 20, 30, 40, 50, 60]);
        let v: serde_json::Value = serde_json::from_slice(out.record(1)).unwrap();
        assert!(v["dep_delay"].is_null() && v["tailnum"].is_null());
        assert_eq!(v["carrier"], "EV");
        // A numeric key is never empty; an NA numeric key is.
        let out = run(r#"{"key":"dep_delay","skip_null_key":true}"#, &input);
        assert_eq!(out.timestamps, vec![10, 30, 60]);
        assert_eq!(out.key(1), Some(&b"-1.5"[..]));
    }

    #[test]
    fn malformed_lines_and_configs_are_errors() {
        let mut ctx = MockContext::for_operator::<FlightsMapper>();
        let task = TaskInfo::for_tests();
        assert_eq!(
            FlightsMapper::open(&mut ctx, &task, r#"{"key":"nope"}"#)
                .unwrap_err()
                .code,
            ErrorCode::InvalidConfig
        );
        let mut op = FlightsMapper::open(&mut ctx, &task, "{}").unwrap();
        let mut input = Batch::default();
        input.push(b"2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,x");
        input.push(b"2013,1,1,517,515,late,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,x");
        let err = op
            .process(&mut ctx, 0, &input, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRecord);
        assert!(
            err.message.contains("record 1")
                && err.message.contains("dep_delay")
                && err.message.contains("late"),
            "{}",
            err.message
        );
    }
}
