//! Fault plugin `fault-foreign-key`: an operator that touches keyed state of keys it was
//! not routed, so the host's shard check (design §16: "a guest touching a key of another
//! shard is a trap") must stop it.
//!
//! Config: `{"role": "key"|"foreign"}`.
//! - `key` (default): keys every record by its payload and passes it on; touches no state.
//!   Put it before a HASH edge so the next operator receives keyed records.
//! - `foreign`: for every record with key `k`, writes the value state `seen` under
//!   `k + "x"` — a key the host never routed here, which lands on a shard of another
//!   subtask once enough keys are written.

use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo, ValueState,
};
use serde::Deserialize;

/// Name of the state the `foreign` role writes.
pub const SEEN_STATE: &str = "seen";

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Role {
    #[default]
    Key,
    Foreign,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    role: Role,
}

/// The operator.
pub struct FaultForeignKey {
    role: Role,
    seen: ValueState<u64>,
}

impl Operator for FaultForeignKey {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-foreign-key", "0.1.0")
            .description("role key: keys records by payload; role foreign: writes state of keys it was not routed")
            .state(ValueState::<u64>::descriptor(SEEN_STATE, 1))
            .config_schema(
                r#"{"type":"object","properties":{"role":{"enum":["key","foreign"]}},"additionalProperties":false}"#,
            )
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("fault-foreign-key config: {e}")))?;
        Ok(FaultForeignKey {
            role: config.role,
            seen: ValueState::open(ctx, SEEN_STATE)?,
        })
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            match self.role {
                Role::Key => out.push_record(Some(r.data), r.timestamp, r.data),
                Role::Foreign => {
                    let mut key = r.key.unwrap_or(r.data).to_vec();
                    key.push(b'x');
                    self.seen.put(ctx, &key, &1);
                    out.push_record(r.key, r.timestamp, r.data);
                }
            }
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(FaultForeignKey);

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_sdk::MockContext;

    #[test]
    fn key_role_keys_by_payload_and_foreign_role_writes_the_shifted_key() {
        let mut ctx = MockContext::for_operator::<FaultForeignKey>();
        let mut keyer =
            FaultForeignKey::open(&mut ctx, &TaskInfo::for_tests(), r#"{"role":"key"}"#).unwrap();
        let mut input = Batch::new();
        input.push(b"a");
        let mut keyed = Batch::new();
        keyer.process(&mut ctx, 0, &input, &mut keyed).unwrap();
        assert_eq!(keyed.iter().next().unwrap().key, Some(&b"a"[..]));

        let mut foreign =
            FaultForeignKey::open(&mut ctx, &TaskInfo::for_tests(), r#"{"role":"foreign"}"#)
                .unwrap();
        foreign
            .process(&mut ctx, 0, &keyed, &mut Batch::new())
            .unwrap();
        let seen = ValueState::<u64>::open(&mut ctx, SEEN_STATE).unwrap();
        assert_eq!(seen.get(&mut ctx, b"ax"), Some(1));
    }
}
