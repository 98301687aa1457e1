//! The restore steps of a submission (design §10.4–§10.6, §12.2): a Delta's savepoint,
//! a restore from a savepoint (check, fork, finalize-sink, seed), and a rescale.

use super::{JobManager, ManagerError, Note, Platform, Prepared, Submitted};
use crate::compat::{Action, Actions, Status};
use crate::from_savepoint;
use nop_stream_checkpoint::{Namespace, savepoint};
use nop_stream_core::operator_id;

impl<P: Platform> JobManager<P> {
    /// A Delta over a job with checkpoints: its latest epoch becomes a savepoint and the
    /// patched job restores from it, through the same check (design §12.2).
    pub(super) fn delta_savepoint(&self, p: &mut Prepared) -> Result<(), ManagerError> {
        let Some(epoch) = p.ns.manifest_epochs()?.last().map(|e| e.0) else {
            return Ok(());
        };
        let job = p.compiled.plan.job.job_id.to_string();
        let root = self.savepoint_root(&job);
        let name = savepoint::default_name(&root.open().map_err(store)?, epoch)?;
        let at = root.join(&name);
        savepoint::export(
            &p.ns,
            &p.ns.describe(),
            nop_stream_api::EpochId(epoch),
            &at.open().map_err(store)?,
        )?;
        (self.notes)(&Note::DeltaSavepoint {
            epoch,
            savepoint: at.to_string(),
        });
        p.sub.from_savepoint = Some(at.to_string());
        Ok(())
    }

    /// A restore from the submission's savepoint: check first and refuse anything but
    /// compatible, touching nothing; then a `fork` moves the job to its new lineage,
    /// `finalize-sink` commits the old sink's pending committables, and the savepoint's
    /// epoch is published into the job's namespace. Returns the answer when the
    /// submission ends here (refused, or check-only).
    pub(super) fn restore_savepoint(
        &self,
        p: &mut Prepared,
    ) -> Result<Option<Submitted>, ManagerError> {
        let given = p.sub.from_savepoint.clone().unwrap_or_default();
        let job = p.compiled.plan.job.job_id.to_string();
        let location = savepoint::resolve(&self.savepoint_root(&job), &given)?;
        let sp = from_savepoint::open(&location).map_err(ManagerError::Savepoint)?;
        let actions: Actions = match &p.sub.actions_json {
            Some(j) => serde_json::from_str(j)
                .map_err(|e| ManagerError::JobFile(format!("the actions: {e}")))?,
            None => Actions::default(),
        };
        // With --fresh the namespace is replaced whatever epochs it holds.
        let report = from_savepoint::check_against(
            &sp,
            &p.compiled.plan,
            &p.compiled.component_hashes(),
            (!p.sub.fresh).then_some(&p.ns),
            &actions,
        )
        .map_err(ManagerError::Savepoint)?;
        if report.verdict != Status::Compatible {
            tracing::info!(%job, savepoint = %location, verdict = %report.verdict, "restore refused");
            return Ok(Some(Submitted::Refused {
                savepoint: given,
                report: Box::new(report),
            }));
        }
        if let Some(lineage) = actions.actions.iter().find_map(|a| match a {
            Action::Fork { namespace } => Some(namespace.clone()),
            _ => None,
        }) {
            self.fork(p, &lineage)?;
        }
        if p.sub.check_only {
            return Ok(Some(Submitted::Checked {
                report: Box::new(report),
            }));
        }
        for line in self.platform.finalize_sinks(&sp, &actions, &p.sub)? {
            (self.notes)(&Note::Finalized(line));
        }
        let fp = {
            let platform = &self.platform;
            let compiled = &p.compiled;
            let mut migrate =
                |op: &str, state: &str, from: u32, entries: &[crate::migrate::StateEntry]| {
                    platform.migrate_state(compiled, op, state, from, entries)
                };
            from_savepoint::seed_namespace(
                &sp,
                &p.ns,
                p.sub.fresh,
                &actions,
                &p.compiled.plan,
                &p.compiled.component_hashes(),
                &mut migrate,
            )
            .map_err(ManagerError::Savepoint)?
        };
        tracing::info!(%job, savepoint = %location, epoch = sp.info.epoch, actions = actions.actions.len(), "restoring a savepoint");
        (self.notes)(&Note::RestoringSavepoint {
            savepoint: given,
            epoch: sp.info.epoch,
            into: p.location.to_string(),
        });
        p.seeded = true;
        p.rescale_from = Some(fp).filter(|fp| *fp != p.compiled.plan.fingerprint);
        Ok(None)
    }

    /// `fork`: the job runs as another pipeline lineage from here on (its record keeps
    /// the lineage), restored into that lineage's namespace, which must be empty unless
    /// --fresh.
    fn fork(&self, p: &mut Prepared, lineage: &str) -> Result<(), ManagerError> {
        p.sub.pipeline = Some(lineage.to_owned());
        p.model.job.pipeline = lineage.to_owned();
        nop_stream_core::validate_model(&p.model).map_err(|d| {
            ManagerError::JobFile(format!("fork {lineage}: not a valid pipeline id: {d}"))
        })?;
        p.compiled = self.platform.compile(&p.model, &p.sub)?;
        p.location = crate::checkpoint_location(&self.opts.checkpoints, &p.compiled.plan);
        p.ns = Namespace::open(&p.location)?;
        if !p.sub.fresh && p.ns.has_durable()? {
            return Err(ManagerError::ForkNamespaceUsed {
                lineage: lineage.to_owned(),
                namespace: p.location.to_string(),
            });
        }
        (self.notes)(&Note::Forking {
            lineage: lineage.to_owned(),
        });
        Ok(())
    }

    /// An explicit rescale (design §10.5): the latest durable epoch, taken by this same job
    /// at another parallelism, restores into the plan at the new one. Its manifest must
    /// carry the fingerprint of this job compiled at the parallelism it was taken with
    /// (subtasks per vertex in it): only the parallelism may change.
    pub(super) fn rescale(&self, p: &mut Prepared) -> Result<(), ManagerError> {
        let m = p.ns.latest_manifest()?.ok_or_else(|| {
            ManagerError::Rescale(format!(
                "--rescale needs a checkpoint to restore, and {} has none{}",
                p.location,
                if p.sub.fresh {
                    " (--fresh discards it)"
                } else {
                    ""
                }
            ))
        })?;
        let plan = &p.compiled.plan;
        let mut old = p.model.clone();
        for node in &mut old.nodes {
            let id = operator_id(node);
            let Some(v) = plan
                .vertices
                .iter()
                .find(|v| v.operators.iter().any(|o| o.operator_id == id))
            else {
                continue;
            };
            let n = m.tasks.iter().filter(|t| t.task.vertex == v.id).count() as u32;
            if n == 0 {
                return Err(ManagerError::Rescale(format!(
                    "--rescale: epoch {} has no task of vertex `{}`; the job's topology \
                     changed, so this is not a rescale",
                    m.epoch.0, v.id
                )));
            }
            node.parallelism = Some(n);
        }
        let old_plan = self.platform.compile(&old, &p.sub)?.plan;
        if !old_plan.fingerprint_matches(&m.plan_fingerprint) {
            return Err(ManagerError::Rescale(format!(
                "--rescale: epoch {} was not taken by this job at its old parallelism \
                 (fingerprint {} vs {}); only the parallelism may change in a rescale",
                m.epoch.0,
                &m.plan_fingerprint[..m.plan_fingerprint.len().min(16)],
                &old_plan.fingerprint[..old_plan.fingerprint.len().min(16)]
            )));
        }
        (self.notes)(&Note::Rescaling {
            epoch: m.epoch.0,
            parallelism: plan
                .vertices
                .iter()
                .map(|v| format!("{}={}", v.id, v.parallelism))
                .collect::<Vec<_>>()
                .join(", "),
        });
        p.rescale_from = Some(m.plan_fingerprint);
        Ok(())
    }
}

fn store(e: nop_stream_storage::StoreError) -> ManagerError {
    ManagerError::Storage(e.into())
}
