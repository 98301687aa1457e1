//! `flights-mapper`: parses lines of the NYC flights 2013 CSV into typed JSON records keyed
//! by a chosen column.
//!
//! Config: `{ "key": "carrier", "fields": ["carrier", "dep_delay", ...] }` — `key` (default
//! `carrier`) is the column whose value becomes the record key (its text; a number as
//! printed in the JSON; empty for `NA`); `fields` (default all 19 columns, file order)
//! lists the columns of the output object, in output order.
//!
//! Per input line one record: a compact JSON object (numbers as numbers, `NA` and empty
//! unquoted fields as `null`, strings unquoted; see [`flights`]). The header line itself is
//! recognised and produces nothing. A malformed line fails with `invalid-record` naming
//! the record index, column and value. Input timestamps, if any, are passed through.

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
