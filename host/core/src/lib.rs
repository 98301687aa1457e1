//! nop-stream plans (design §4, seed §2): a declarative job file becomes a
//! [`StreamModel`], then [`StreamGraph`], [`JobGraph`] (operator chaining),
//! [`PartitionedPlan`] (parallel expansion, StateShard ownership, channel identities,
//! checkpoint ACK set, fingerprint) and [`DeploymentPlan`]. Pure: no I/O, no runtime.

pub mod model;
pub mod plan;
pub mod shard;

pub use model::*;
pub use plan::*;
pub use shard::*;
