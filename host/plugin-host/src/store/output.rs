//! The host side of `nop:stream/output` (side outputs), `nop:stream/log` and
//! `nop:stream/metrics`.

use super::{HostTrap, StoreData};
use crate::bindings::op::nop::stream::{log, metrics, output};
use crate::bindings::{LogLevel, WitBatch};

/// Longest log line kept, in bytes; longer ones are truncated.
pub const MAX_LOG_LINE: usize = 4096;

impl output::Host for StoreData {
    fn side_output(&mut self, tag: String, records: WitBatch) -> wasmtime::Result<()> {
        if !self.side_tags.contains(&tag) {
            return Err(wasmtime::Error::new(HostTrap(format!(
                "side output {tag:?} is not declared in describe() (declared: {:?})",
                self.side_tags
            ))));
        }
        if !records.ends.is_empty() {
            self.side.push((tag, crate::bindings::host_batch(records)));
        }
        Ok(())
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: LogLevel, mut message: String) -> wasmtime::Result<()> {
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let plugin = self.label.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            LogLevel::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            LogLevel::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
        Ok(())
    }
}

impl metrics::Host for StoreData {
    fn counter_add(&mut self, name: String, delta: u64) -> wasmtime::Result<()> {
        *self.counters.entry(name).or_default() += delta;
        Ok(())
    }

    fn gauge_set(&mut self, name: String, value: i64) -> wasmtime::Result<()> {
        self.gauges.insert(name, value);
        Ok(())
    }
}
