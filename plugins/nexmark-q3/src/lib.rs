//! `nexmark-q3`: Nexmark q3, local item suggestion, on the SDK's regular join
//! ([`nop_stream_sdk::join::RegularJoin`]): auctions of category 10 joined to their
//! seller when the seller lives in OR, ID or CA.
//!
//! ```sql
//! SELECT P.name, P.city, P.state, A.id
//! FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
//! WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
//! ```
//!
//! Inputs (HASH edges; `nexmark-parse` does the filters and projections):
//! - 0, left: auctions, payload `id`, keyed by `seller`;
//! - 1, right: persons, payload `name,city,state`, keyed by `id`.
//!
//! Output: `name,city,state,id` per pair, keyed by the seller. Config: `{ "type":
//! "inner"|"left"|"right"|"full" (default inner), "left_ttl_ms", "right_ttl_ms" }` (the
//! join's per-side TTL, processing time). An outer join pads the missing side with
//! empty columns: `,,,id` for an auction whose seller never came, `name,city,state,`
//! for a person without auction; see [`nop_stream_sdk::join::JoinFunction`] for when.

use nop_stream_sdk::join::{
    JoinFunction, JoinOutput, JoinType, LATE_OUTPUT, RegularJoin, RegularJoinSpec, Row,
};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"type":{"enum":["inner","left","right","full"],"default":"inner"},"left_ttl_ms":{"type":"integer","minimum":1},"right_ttl_ms":{"type":"integer","minimum":1}}}"#;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default, rename = "type")]
    join_type: JoinType,
    left_ttl_ms: Option<i64>,
    right_ttl_ms: Option<i64>,
}

/// The join function: `name,city,state` of the person, then the auction id.
#[derive(Debug, Default)]
pub struct LocalItems;

impl JoinFunction for LocalItems {
    fn join(
        &mut self,
        _key: &[u8],
        auction: Row<'_>,
        person: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        out.emit_with(|buf| {
            buf.extend_from_slice(person.data);
            buf.push(b',');
            buf.extend_from_slice(auction.data);
        });
        Ok(())
    }

    fn left_only(&mut self, _key: &[u8], auction: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        out.emit(&[b",,,", auction.data].concat());
        Ok(())
    }

    fn right_only(&mut self, _key: &[u8], person: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        out.emit(&[person.data, b","].concat());
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct Q3 {
    join: RegularJoin<LocalItems>,
}

impl Operator for Q3 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q3", "0.1.0")
            .description(
                "Nexmark q3: auctions of category 10 joined to their sellers (regular join)",
            )
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"regular-join","plugin":"nexmark-q3"}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in RegularJoinSpec::state_descriptors() {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q3 config: {e}")))?;
        let spec = RegularJoinSpec::of(c.join_type).with_ttl(c.left_ttl_ms, c.right_ttl_ms);
        Ok(Q3 {
            join: RegularJoin::open(ctx, spec, LocalItems)?,
        })
    }

    nop_stream_sdk::join_operator_hooks!(join);
}

nop_stream_sdk::export_operator!(Q3);

#[cfg(test)]
mod tests {
    use super::*;
    use nexmark_model::{Config as Generator, Kind, csv, event, queries};
    use nop_stream_sdk::{Batch, MockContext};

    /// Parses the stream's lines as the q3 job does.
    fn parsed(kind: Kind, config: &str, n: u64) -> Batch {
        let c = nexmark_parse::Config::parse(config).unwrap();
        let g = Generator::default();
        let mut out = Batch::new();
        for i in (0..n).filter(|&i| g.kind_of(i) == kind) {
            nexmark_parse::parse_line(
                &c,
                csv::line(&event(&g, i)).as_bytes(),
                &mut out,
                &mut Vec::new(),
            )
            .unwrap();
        }
        out
    }

    #[test]
    fn equals_the_native_q3_in_any_input_order() {
        let n = 60_000;
        let auctions = parsed(
            Kind::Auction,
            r#"{"kind":"auction","fields":["id"],"key":"seller","filter":[{"field":"category","eq":10}]}"#,
            n,
        );
        let persons = parsed(
            Kind::Person,
            r#"{"kind":"person","fields":["name","city","state"],"key":"id","filter":[{"field":"state","in":["OR","ID","CA"]}]}"#,
            n,
        );
        let g = Generator::default();
        let events: Vec<_> = (0..n).map(|i| event(&g, i)).collect();
        let p: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                nexmark_model::Event::Person(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        let a: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                nexmark_model::Event::Auction(a) => Some(a.clone()),
                _ => None,
            })
            .collect();
        let mut want = queries::q3(&p, &a);
        want.sort();
        assert!(!want.is_empty());
        for persons_first in [true, false] {
            let mut ctx = MockContext::for_operator::<Q3>();
            let mut op = Q3::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
            let mut out = Batch::new();
            let order = if persons_first {
                [(1, &persons), (0, &auctions)]
            } else {
                [(0, &auctions), (1, &persons)]
            };
            for (input, b) in order {
                op.process(&mut ctx, input, b, &mut out).unwrap();
            }
            op.finish(&mut ctx, &mut out).unwrap();
            let mut got: Vec<String> = out
                .iter()
                .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
                .collect();
            got.sort();
            assert_eq!(got, want);
        }
    }
}
