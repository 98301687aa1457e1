//! The metrics seam of nop-stream (design §15).
//!
//! - [`inventory`]: every metric family, committed as `docs/metrics.md`;
//! - [`JobMetrics`] and [`TaskMetrics`]: the counters of a job's subtasks in one process,
//!   updated by the task threads once per batch and read only when sampled;
//! - [`Sample`] and [`MetricsFrame`]: values as plain data, in which node processes ship
//!   theirs to the coordinator, so a new metric is one line where it is counted;
//! - [`encode`]: the OpenMetrics text of a set of samples, made only when scraped.
//!
//! Pure: no I/O, no threads.

mod encode;
mod histogram;
pub mod inventory;
mod sample;
mod task;

pub use encode::{CONTENT_TYPE, EncodeError, check, encode};
pub use histogram::{Histogram, SECONDS_BUCKETS};
pub use inventory::{Family, INVENTORY, Kind, Unit};
pub use sample::{HistogramValue, MAX_FRAME_SAMPLES, MetricsFrame, Sample, Value, merge, sum};
pub use task::{JobMetrics, SplitProgress, TaskMetrics};
