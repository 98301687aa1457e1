//! The embedded runner (design §2.5, §14.4): a job's tasks on threads of this process,
//! with in-process channels. [`InProcessWorkers`] implement the coordinator's `Workers`
//! seam; [`EmbeddedPlatform`] is the job manager's platform, with which a
//! `nop_stream_coordinator::manager::JobManager` is `nopstream run`; [`run_job`] runs one
//! compiled plan to completion. The recovery loop, restore planning and the epoch loop
//! live in the coordinator crate and exist once for both modes.

mod platform;
mod workers;

pub use platform::{EmbeddedPlatform, error_chain};
pub use workers::{InProcessWorkers, WorkerError};

use nop_stream_core::PartitionedPlan;
use nop_stream_plugin_host::{PluginSet, Result, RuntimeError};
use nop_stream_task::{JobProgress, RunOptions};
use std::sync::Arc;

pub use nop_stream_coordinator::JobReport;

/// Runs `plan` to completion with the embedded backend, taking epoch checkpoints,
/// resuming from the latest durable manifest when `opts.resume`, and recovering globally
/// from task failures up to the restart budget (design §10.1).
///
/// # Errors
/// The root-cause failure once the restart budget is spent or when it is not
/// recoverable; a restore incompatibility; a setup error.
pub fn run_job(
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    opts: &RunOptions,
    progress: Arc<JobProgress>,
) -> Result<JobReport> {
    let storage = nop_stream_coordinator::open_namespace(&opts.checkpoints, plan, opts.resume)
        .map_err(runtime_error)?;
    let mut workers = InProcessWorkers::new(plan, plugins, opts, Arc::clone(&storage), progress);
    let mut copts = opts.coordinator_options();
    copts.components = plugins
        .iter()
        .map(|(id, p)| (id.to_string(), p.sha256.clone()))
        .collect();
    nop_stream_coordinator::run_job(plan, &mut workers, storage, &copts).map_err(|e| e.0)
}

/// A coordinator failure as the runtime's error (a restore refused, checkpoint storage).
pub fn runtime_error(e: nop_stream_coordinator::CoordinatorError) -> RuntimeError {
    use nop_stream_coordinator::CoordinatorError;
    match e {
        CoordinatorError::Restore { epoch, message } => RuntimeError::Restore { epoch, message },
        CoordinatorError::Storage { path, message } => RuntimeError::Io { path, message },
        CoordinatorError::EpochTaken { epoch, message } => RuntimeError::Io {
            path: format!("epoch {epoch} of the checkpoint namespace"),
            message,
        },
        CoordinatorError::Internal(m) => RuntimeError::Internal(m),
        e @ CoordinatorError::LeadershipLost { .. } => RuntimeError::Internal(e.to_string()),
    }
}
