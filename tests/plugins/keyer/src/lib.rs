//! Test plugin `keyer`: a stateless operator that keys every record by its payload and
//! passes it on, so the operator after a HASH edge receives keyed records. It declares no
//! state, so it may follow any partition at any parallelism.

use nop_stream_sdk::{Batch, Context, Operator, PluginInfo, Result, TaskInfo};

/// The operator; holds nothing.
pub struct Keyer;

impl Operator for Keyer {
    fn describe() -> PluginInfo {
        PluginInfo::operator("keyer", "0.1.0")
            .description("keys every record by its payload")
            .config_schema(r#"{"type":"object","additionalProperties":false}"#)
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(Keyer)
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            out.push_record(Some(r.data), r.timestamp, r.data);
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(Keyer);

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_sdk::MockContext;

    #[test]
    fn keys_each_record_by_its_payload() {
        let mut ctx = MockContext::for_operator::<Keyer>();
        let mut op = Keyer::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let mut input = Batch::new();
        input.push(b"a");
        input.push(b"bc");
        let mut out = Batch::new();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        let keys: Vec<_> = out.iter().map(|r| r.key).collect();
        assert_eq!(keys, vec![Some(&b"a"[..]), Some(&b"bc"[..])]);
    }
}
