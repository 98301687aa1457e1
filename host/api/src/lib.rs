//! Shared vocabulary of nop-stream: stable identities (seed §3), plugin metadata as
//! declared by a component's `describe()` (design §3), source/sink capability levels
//! (seed §6.1, §7.1), partition policies (seed §4.1) and semantic modes (seed §13).
//!
//! This crate has no I/O and depends on nothing of ours; every other crate depends on it
//! (seed §11.2: `runtime, checkpoint, state, cli -> core -> api`).

mod data;
mod ids;
mod plugin;
mod semantics;

pub use data::*;
pub use ids::*;
pub use plugin::*;
pub use semantics::*;
