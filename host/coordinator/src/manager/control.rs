//! Control requests of running and recorded jobs (design §8): one request type,
//! [`JobControl`], answered the same way whether it came over an embedded run's Unix
//! socket or over QUIC to the coordinator process.

use super::{JobManager, ManagerError, Platform, lock};
use crate::SavepointRequest;
use crate::jobs::JobRecord;
use nop_stream_checkpoint::{Location, Namespace, names};
use nop_stream_proto::cli::{CliResponse, JobControl, JobState, JobStatus};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a savepoint request waits for an epoch to become durable.
pub const SAVEPOINT_WAIT: Duration = Duration::from_secs(600);

impl<P: Platform> JobManager<P> {
    /// Answers a control request.
    ///
    /// # Errors
    /// No such job; the job is not running (savepoint, cancel); it made no epoch durable
    /// in time; storage failures.
    pub fn control(&self, request: JobControl) -> Result<CliResponse, ManagerError> {
        Ok(match request {
            JobControl::ListJobs => CliResponse::Jobs(self.list()?),
            JobControl::Status { job } => CliResponse::Job(Box::new(self.status(&job)?)),
            JobControl::Cancel { job } => {
                let r = self.record(&job)?;
                match lock(&self.running).get(&job) {
                    Some(run) => run.cancel.store(true, Ordering::SeqCst),
                    None => {
                        return Err(ManagerError::NotRunning {
                            job,
                            state: r.state.to_string(),
                        });
                    }
                }
                CliResponse::Job(Box::new(self.status_of(&r)))
            }
            JobControl::View { job } => CliResponse::View {
                view_json: serde_json::to_string(&self.status_view(&job)?)
                    .map_err(|e| ManagerError::Platform(e.to_string()))?,
            },
            JobControl::TakeSavepoint { job, out, stop } => {
                let info = self.take_savepoint(&job, out, stop)?;
                CliResponse::Savepoint {
                    info_json: serde_json::to_string(&info)
                        .map_err(|e| ManagerError::Platform(e.to_string()))?,
                }
            }
            JobControl::Checkpoints { job } => {
                let r = self.record(&job)?;
                let ns = Namespace::open(&self.namespace_of(&r)?)?;
                let log = ns.read_log()?;
                let mut manifests = Vec::new();
                for e in ns.manifest_epochs()? {
                    manifests.push(ns.read_manifest(e)?);
                }
                let json = |v: serde_json::Result<String>| {
                    v.map_err(|e| ManagerError::Platform(e.to_string()))
                };
                CliResponse::Checkpoints {
                    log_json: json(serde_json::to_string(&log))?,
                    manifests_json: json(serde_json::to_string(&manifests))?,
                }
            }
        })
    }

    /// Takes a savepoint of running `job` at `out` (a location, or a name in the job's
    /// savepoint root; `None`: `epoch-N` there); with `stop`, the job stops once it is
    /// committed and the answer comes when it has (design §10.4).
    ///
    /// # Errors
    /// The job is not running; it made no epoch durable within [`SAVEPOINT_WAIT`]; the
    /// savepoint could not be written (or, with `stop`, the job did not stop).
    pub fn take_savepoint(
        &self,
        job: &str,
        out: Option<String>,
        stop: bool,
    ) -> Result<nop_stream_checkpoint::SavepointInfo, ManagerError> {
        let tx = match lock(&self.running).get(job) {
            Some(r) => r.savepoints.clone(),
            None => {
                return Err(match self.record(job) {
                    Ok(r) => ManagerError::NotRunning {
                        job: job.to_owned(),
                        state: r.state.to_string(),
                    },
                    Err(e) => e,
                });
            }
        };
        let (reply, rx) = std::sync::mpsc::channel();
        tx.send(SavepointRequest { out, stop, reply })
            .map_err(|_| ManagerError::Ending {
                job: job.to_owned(),
            })?;
        rx.recv_timeout(SAVEPOINT_WAIT)
            .map_err(|_| {
                ManagerError::Savepoint(format!(
                    "job `{job}` made no epoch durable within {} minutes",
                    SAVEPOINT_WAIT.as_secs() / 60
                ))
            })?
            .map_err(ManagerError::Savepoint)
    }

    /// Every job recorded, oldest submission first.
    ///
    /// # Errors
    /// The job store cannot be read.
    pub fn list(&self) -> Result<Vec<JobStatus>, ManagerError> {
        for r in self.jobs.load_all()? {
            lock(&self.records).entry(r.value.job.clone()).or_insert(r);
        }
        let mut records: Vec<JobRecord> = lock(&self.records)
            .values()
            .map(|v| v.value.clone())
            .collect();
        records.sort_by_key(|r| r.submitted_ms);
        Ok(records.iter().map(|r| self.status_of(r)).collect())
    }

    /// `job`'s status.
    ///
    /// # Errors
    /// No such job.
    pub fn status(&self, job: &str) -> Result<JobStatus, ManagerError> {
        Ok(self.status_of(&self.record(job)?))
    }

    /// The location of `r`'s checkpoint namespace (from its job file and lineage, without
    /// compiling it).
    pub(super) fn namespace_of(&self, r: &JobRecord) -> Result<Location, ManagerError> {
        let model = self.model(&r.submission)?;
        Ok(self
            .opts
            .checkpoints
            .join(&names::namespace(&model.job.id, &model.job.pipeline)))
    }

    fn status_of(&self, r: &JobRecord) -> JobStatus {
        // A run whose end is recorded counts from its report, even while its thread is
        // still leaving the running set (the record is written first).
        let live = lock(&self.running)
            .get(&r.job)
            .filter(|_| matches!(r.state, JobState::Submitted | JobState::Running))
            .map(|x| Arc::clone(&x.live));
        let mut refused = r.refused;
        let mut generation = r.generation;
        let mut deployment_json = r.deployment_json.clone();
        let recoveries = r.recoveries;
        let counts = self.platform.live_counts(&r.job);
        let (mut records_read, mut records_written) = (counts.records_read, counts.records_written);
        if let Some(l) = &live {
            refused.events += l.refused_events.load(Ordering::Relaxed);
            refused.streams = counts.refused_streams;
            refused.commands = counts.refused_commands;
            generation = generation.max(l.generation.load(Ordering::SeqCst));
            if let Some(p) = lock(&l.placement).as_ref() {
                deployment_json = serde_json::to_string(p).ok();
            }
        } else if let Some(report) = r
            .report_json
            .as_deref()
            .and_then(|j| serde_json::from_str::<crate::JobReport>(j).ok())
        {
            // An ended run counts what its durable epochs hold: every record read and
            // committed, once, whatever the recoveries.
            records_read = report.durable_records_read;
            records_written = report.durable_records_written;
        }
        let durable_epoch = self
            .namespace_of(r)
            .ok()
            .and_then(|l| Namespace::open(&l).ok())
            .and_then(|ns| ns.manifest_epochs().ok())
            .and_then(|e| e.last().map(|e| e.0));
        JobStatus {
            job: r.job.clone(),
            name: r.name.clone(),
            state: r.state,
            semantic: r.semantic.clone(),
            submitted_ms: r.submitted_ms,
            generation,
            recoveries,
            durable_epoch,
            records_read,
            records_written,
            refused,
            output_dir: r.submission.output_dir.clone(),
            error: r.error.clone(),
            deployment_json,
            report_json: r.report_json.clone(),
            run: r.run,
            history_json: (!r.history.is_empty())
                .then(|| serde_json::to_string(&r.history).ok())
                .flatten(),
        }
    }
}
