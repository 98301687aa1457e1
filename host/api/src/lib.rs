//! Shared vocabulary of nop-stream: stable identities (design §3), plugin metadata as
//! declared by a component's `describe()` (design §16), source/sink capability levels
//! (design §6.1, §7.1), partition policies (design §4.1) and semantic modes (design §13).
//!
//! This crate has no I/O and depends on nothing of ours; every other crate depends on it
//! (design §11.2: `runtime, checkpoint, state, cli -> core -> api`).

mod data;
pub mod delta;
mod ids;
mod plugin;
mod semantics;

pub use data::*;
pub use ids::*;
pub use plugin::*;
pub use semantics::*;
