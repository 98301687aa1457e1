//! nop-stream plans (design §2): a declarative job file becomes a
//! [`StreamModel`], then [`StreamGraph`], [`JobGraph`] (operator chaining),
//! [`PartitionedPlan`] (parallel expansion, StateShard ownership, channel identities,
//! checkpoint ACK set, fingerprint) and [`DeploymentPlan`]. Pure: no I/O, no runtime.
//!
//! ```text
//! parse_job_file(file, text) -> StreamModel        (jobfile: shape + semantic checks)
//! stream_graph(&model, &catalog) -> StreamGraph    (plugin metadata, policies, semantic mode)
//! job_graph(&stream) -> JobGraph                   (chaining, topological order)
//! partitioned_plan(&job) -> PartitionedPlan        (subtasks, shards, channels, fingerprint)
//! deployment_plan(&plan, &opts) -> DeploymentPlan  (placement: slot sharing over nodes)
//! ```
//!
//! Every problem is reported as a [`Diagnostic`]; all of a step's problems come back
//! together as [`Diagnostics`].

pub mod compile;
pub mod delta;
pub mod diag;
pub mod jobfile;
pub mod model;
pub mod placement;
pub mod plan;
pub mod schema;
pub mod shard;
pub mod url;

pub use compile::*;
pub use diag::*;
pub use jobfile::*;
pub use model::*;
pub use placement::*;
pub use plan::*;
pub use shard::*;
pub use url::{redact_url, redact_urls_in_json};
