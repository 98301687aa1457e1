//! Named fault points for crash tests (design §21). A test arms a point through the
//! environment of a child process, `NOPSTREAM_FAILPOINTS="name[=N][:action],..."`, or in
//! process with [`arm`]. The N-th time an armed point is reached (default the first),
//! `abort` kills the process on the spot (`std::process::abort`, no clean-up, like
//! SIGKILL), `error` makes [`hit`] return `true` so the caller simulates a failure, and
//! `sleep-MS` stalls the caller for MS milliseconds and lets it go on (a slow disk or a
//! stuck thread, e.g. to make a checkpoint time out).
//!
//! Points used by the runtime: `before-barrier-injection`, `after-barrier-injection`,
//! `after-pre-commit`, `after-manifest-publish`, `mid-commit`, `during-restore`,
//! `commit-reply-lost` (error: the commit happened but its reply is dropped),
//! `expire-transaction` (error: the transaction vanishes before commit),
//! `savepoint-write` (each step of writing a savepoint: every segment file, the manifest
//! candidate, the epoch record, `savepoint.json`), `async-snapshot-write` (each segment
//! file of a task's snapshot, written but not yet durable; on the background snapshot
//! thread with asynchronous snapshots), `compaction-write` (a background compaction's
//! file, written but not yet durable).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// What an armed point does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the process.
    Abort,
    /// Report the hit to the caller.
    Error,
    /// Sleep this many milliseconds, then go on as if not armed.
    Sleep(u64),
}

struct Armed {
    remaining: u64,
    action: Action,
}

fn registry() -> &'static Mutex<HashMap<String, Armed>> {
    static REG: OnceLock<Mutex<HashMap<String, Armed>>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut map = HashMap::new();
        if let Ok(spec) = std::env::var("NOPSTREAM_FAILPOINTS") {
            for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (rest, action) = match item.rsplit_once(':') {
                    Some((r, "error")) => (r, Action::Error),
                    Some((r, a)) => match a.strip_prefix("sleep-").map(str::parse) {
                        Some(Ok(ms)) => (r, Action::Sleep(ms)),
                        _ => (r, Action::Abort),
                    },
                    None => (item, Action::Abort),
                };
                let (name, n) = match rest.split_once('=') {
                    Some((n, c)) => (n, c.parse().unwrap_or(1)),
                    None => (rest, 1),
                };
                map.insert(
                    name.to_owned(),
                    Armed {
                        remaining: n.max(1),
                        action,
                    },
                );
            }
        }
        Mutex::new(map)
    })
}

/// Arms `name` to fire on its `nth` hit (1 = next) with `action`.
pub fn arm(name: &str, nth: u64, action: Action) {
    registry().lock().unwrap_or_else(|p| p.into_inner()).insert(
        name.to_owned(),
        Armed {
            remaining: nth.max(1),
            action,
        },
    );
}

/// Disarms every point.
pub fn disarm_all() {
    registry().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Passes fault point `name`: aborts the process, returns `true` or sleeps if it fires
/// (see [`Action`]).
pub fn hit(name: &str) -> bool {
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    let Some(a) = reg.get_mut(name) else {
        return false;
    };
    a.remaining -= 1;
    if a.remaining > 0 {
        return false;
    }
    let action = a.action;
    reg.remove(name);
    drop(reg);
    match action {
        Action::Abort => {
            eprintln!("failpoint `{name}` fired: aborting");
            std::process::abort();
        }
        Action::Error => true,
        Action::Sleep(ms) => {
            eprintln!("failpoint `{name}` fired: sleeping {ms} ms");
            std::thread::sleep(std::time::Duration::from_millis(ms));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeping_point_stalls_its_nth_hit_once_and_reports_nothing() {
        let name = "failpoint-unit-sleep";
        arm(name, 2, Action::Sleep(30));
        let t = std::time::Instant::now();
        assert!(!hit(name));
        assert!(t.elapsed() < std::time::Duration::from_millis(30));
        let t = std::time::Instant::now();
        assert!(!hit(name));
        assert!(t.elapsed() >= std::time::Duration::from_millis(30));
        // Disarmed after firing.
        let t = std::time::Instant::now();
        assert!(!hit(name));
        assert!(t.elapsed() < std::time::Duration::from_millis(30));
    }
}
