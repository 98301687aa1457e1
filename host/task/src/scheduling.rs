//! How the kernel schedules this process's task threads (design §19).

/// How the kernel schedules this process's task threads (`RunOptions::task_scheduling`,
/// `--task-scheduling` of `nopstream run` and `nopstream node`). Threads a task starts
/// (its snapshot writer, its background compaction) inherit the policy; the process's
/// other threads (the coordinator, QUIC, the control socket) keep the default one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskScheduling {
    /// `SCHED_BATCH` on Linux (default): a task thread that wakes does not preempt the
    /// thread running on its CPU; it runs when that one blocks or its time slice ends.
    /// With more busy task threads than cores (a parser and a keyed stage per subtask at
    /// p=2 on two cores), every batch handed to a sleeping downstream task otherwise
    /// preempts the upstream one mid-batch, which costs CPU time. The cost of `SCHED_BATCH`
    /// is latency on a busy machine: a woken task may wait for the running thread's slice
    /// (a few ms) instead of starting at once, at every hand-over a barrier makes, so
    /// checkpoints take longer on a saturated host (`bench/RESULTS.md` has both
    /// measurements). Jobs that need the lowest checkpoint latency on a saturated host run
    /// with `Normal`. On an idle CPU a woken task starts at once either way. Elsewhere than
    /// Linux: as [`TaskScheduling::Normal`].
    #[default]
    Batch,
    /// The default policy (`SCHED_OTHER`): a woken task thread may preempt a running one
    /// at once, for the lowest hand-over latency on a saturated machine.
    Normal,
}

impl TaskScheduling {
    /// Puts the calling thread under this policy. A thread that is not under the default
    /// policy (the process was started with `chrt`) keeps its own. A refusal (a seccomp
    /// filter, say) is logged at `debug` and the thread runs under the policy it has.
    pub fn apply_to_this_thread(self) {
        #[cfg(target_os = "linux")]
        if self == TaskScheduling::Batch {
            // SAFETY: `sched_getscheduler(0)` reads the calling thread's policy.
            #[allow(unsafe_code)]
            let current = unsafe { libc::sched_getscheduler(0) };
            if current != libc::SCHED_OTHER {
                // Started under another policy on purpose (`chrt`): left as it is.
                return;
            }
            // SAFETY: `sched_param` is plain integers (more fields than the priority on
            // some C libraries); all zero is priority 0, the only one SCHED_BATCH takes.
            #[allow(unsafe_code)]
            let param: libc::sched_param = unsafe { std::mem::zeroed() };
            // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread's
            // policy and reads `param`, a valid `sched_param` on the stack, during the
            // call. An unprivileged thread may move from SCHED_OTHER to SCHED_BATCH
            // (sched(7)); priority 0 is the only one SCHED_BATCH takes.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
            if rc != 0 {
                tracing::debug!(
                    error = %std::io::Error::last_os_error(),
                    "task thread keeps its scheduling policy: SCHED_BATCH was refused"
                );
            }
        }
    }
}

impl std::str::FromStr for TaskScheduling {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "batch" => Ok(TaskScheduling::Batch),
            "normal" => Ok(TaskScheduling::Normal),
            other => Err(format!(
                "unknown task scheduling `{other}` (expected `batch` or `normal`)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_scheduling_parses_and_applies_to_the_calling_thread_only() {
        assert_eq!("batch".parse(), Ok(TaskScheduling::Batch));
        assert_eq!("normal".parse(), Ok(TaskScheduling::Normal));
        assert_eq!(TaskScheduling::default(), TaskScheduling::Batch);
        let err = "fifo".parse::<TaskScheduling>().unwrap_err();
        assert!(
            err.contains("`fifo`") && err.contains("`batch` or `normal`"),
            "{err}"
        );
        #[cfg(target_os = "linux")]
        {
            #[allow(unsafe_code)]
            fn policy() -> i32 {
                // SAFETY: reads the calling thread's policy.
                unsafe { libc::sched_getscheduler(0) }
            }
            assert_eq!(
                policy(),
                libc::SCHED_OTHER,
                "this test expects to run under the default policy (not under `chrt`)"
            );
            let policy_after = |s: TaskScheduling| {
                std::thread::spawn(move || {
                    s.apply_to_this_thread();
                    // A thread it starts inherits the policy (the snapshot writer).
                    let child = std::thread::spawn(policy).join().unwrap();
                    (policy(), child)
                })
                .join()
                .unwrap()
            };
            assert_eq!(
                policy_after(TaskScheduling::Batch),
                (libc::SCHED_BATCH, libc::SCHED_BATCH)
            );
            assert_eq!(
                policy_after(TaskScheduling::Normal),
                (libc::SCHED_OTHER, libc::SCHED_OTHER)
            );
            // The thread that asked for a task thread's policy keeps its own.
            assert_eq!(policy(), libc::SCHED_OTHER);
        }
    }
}
