//! Running a child process and measuring it: wall time from spawn to exit, the CPU time
//! the kernel accounted to it (`wait4`'s `rusage`, which covers the child and every
//! descendant it waited for), and its peak resident set size.
//!
//! The peak is the child's own `VmHWM` (`/proc/<pid>/status`), polled every 10 ms from
//! the spawn (which returns once the child has exec'd) to its exit, not `rusage`'s
//! `ru_maxrss`: Linux carries the high-water mark of the address space a child leaves at
//! `exec` into `ru_maxrss`, and std spawns with `posix_spawn` (a `vfork` sharing this
//! process's address space), so `ru_maxrss` is at least this process's own RSS at the
//! spawn. A bench that holds a folded state of 100 MiB then reported every later child as
//! at least that large. `ru_maxrss` is the fallback where `/proc` is not readable.
//!
//! The same poll reads each thread's CPU time and keeps the last value seen: the
//! scheduler's on-CPU nanoseconds (`/proc/<pid>/task/*/schedstat`, first field) where the
//! kernel keeps them, else user + system clock ticks (`stat`, 10 ms each, too coarse for a
//! thread that runs a millisecond now and then), so [`ChildRun::threads`] tells which thread limits a
//! pipelined run. A thread's last 10 ms before it exits can be missed. `perf` is no
//! substitute on a virtual machine that samples `cpu-clock`: it overcharges kernel entries.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// What one child process cost and printed.
#[derive(Debug, Clone)]
pub struct ChildRun {
    /// Spawn to exit, seconds.
    pub wall_s: f64,
    /// User + system CPU seconds.
    pub cpu_s: f64,
    /// System (kernel) CPU seconds, part of `cpu_s`.
    pub sys_s: f64,
    /// Peak resident set size, MiB.
    pub max_rss_mib: f64,
    /// CPU seconds per thread name (threads of one name summed), busiest first; empty
    /// where `/proc` is not readable.
    pub threads: Vec<ThreadCpu>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// CPU time of the threads of one name in a child process.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ThreadCpu {
    /// Thread name as the kernel keeps it (at most 15 bytes; a task's is
    /// `{head operator}#{subtask}`).
    pub name: String,
    /// User + system CPU seconds.
    pub cpu_s: f64,
}

/// Clock ticks per second of `/proc` CPU times.
#[allow(unsafe_code)]
pub fn clock_ticks() -> f64 {
    // SAFETY: `sysconf` has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The name and CPU ticks (user + system) of a process or thread from its `/proc/.../stat`
/// line. The name is in parentheses and may itself hold spaces and parentheses, so the
/// fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let mut rest = stat.get(close + 2..)?.split_ascii_whitespace();
    // After the name: state (field 3) ... utime (14), stime (15).
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((name, utime + stime))
}

/// Records the latest CPU time (ns) of every thread of `pid` into `seen` (by thread id).
fn poll_threads(pid: u32, seen: &mut std::collections::HashMap<String, (String, u64)>) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    let ns_per_tick = 1e9 / clock_ticks();
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((name, ticks)) = parse_stat(&stat) else {
            continue;
        };
        let ns = std::fs::read_to_string(entry.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_ascii_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or((ticks as f64 * ns_per_tick) as u64);
        seen.insert(entry.file_name().to_string_lossy().into_owned(), (name, ns));
    }
}

/// Sums the threads seen by name, busiest first.
fn threads_by_name(seen: &std::collections::HashMap<String, (String, u64)>) -> Vec<ThreadCpu> {
    let mut by_name: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for (name, ns) in seen.values() {
        *by_name.entry(name).or_default() += ns;
    }
    let mut v: Vec<ThreadCpu> = by_name
        .into_iter()
        .map(|(name, ns)| ThreadCpu {
            name: name.to_owned(),
            cpu_s: ns as f64 / 1e9,
        })
        .collect();
    v.sort_by(|a, b| {
        b.cpu_s
            .total_cmp(&a.cpu_s)
            .then_with(|| a.name.cmp(&b.name))
    });
    v
}

/// The `VmHWM` (peak RSS) of process `pid` in KiB, if it is running.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[allow(unsafe_code)]
fn wait4(pid: u32) -> Result<(i32, libc::rusage)> {
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data, valid when zeroed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = libc::pid_t::try_from(pid).context("pid out of range")?;
    loop {
        // SAFETY: `status` and `usage` are valid, exclusively borrowed out-pointers; `pid` is
        // our own child, not yet reaped (std's `Child` only reaps in `wait`, never on drop).
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((status, usage));
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("wait4");
        }
    }
}

fn secs(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6
}

/// Runs `cmd` to completion, capturing stdout (stderr is captured and shown on failure).
///
/// # Errors
/// Spawn failure, or a non-zero exit (with the child's stderr).
pub fn run(mut cmd: Command) -> Result<ChildRun> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    /// Stops the poll thread however `run` returns.
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop = Stop(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
        false,
    )));
    let hwm = {
        let (stop, pid) = (std::sync::Arc::clone(&stop.0), child.id());
        std::thread::spawn(move || {
            let mut peak_kib = 0u64;
            let mut threads = std::collections::HashMap::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(kib) = vm_hwm_kib(pid) {
                    peak_kib = peak_kib.max(kib);
                }
                poll_threads(pid, &mut threads);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            (peak_kib, threads_by_name(&threads))
        })
    };
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .context("stdout")?
        .read_to_string(&mut stdout)?;
    // The last poll before the exit: the child is a zombie (no `VmHWM`) only after it.
    let (status, usage) = wait4(child.id())?;
    drop(stop);
    let (hwm_kib, threads) = hwm.join().unwrap_or_default();
    let wall_s = started.elapsed().as_secs_f64();
    let stderr = err_reader.join().unwrap_or_default();
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!(
            "{cmd:?} failed (wait status {status}):\n{}",
            stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n")
        );
    }
    Ok(ChildRun {
        wall_s,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
        sys_s: secs(usage.ru_stime),
        // Both in KiB.
        max_rss_mib: if hwm_kib > 0 {
            hwm_kib as f64 / 1024.0
        } else {
            usage.ru_maxrss as f64 / 1024.0
        },
        threads,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_child() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo hi; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
        ]);
        let r = run(cmd).unwrap();
        assert_eq!(r.stdout.trim(), "hi");
        assert!(
            r.cpu_s > 0.0 && r.wall_s > 0.0 && r.max_rss_mib > 0.0,
            "{r:?}"
        );
        let mut fail = Command::new("sh");
        fail.args(["-c", "echo oops >&2; exit 3"]);
        assert!(run(fail).unwrap_err().to_string().contains("oops"));
    }

    #[test]
    fn a_thread_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "4242 (snap (a) 1) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(line), Some(("snap (a) 1".to_owned(), 175)));
        assert_eq!(parse_stat("4242 (x) S 1 2"), None);
    }

    #[test]
    fn a_busy_child_thread_is_charged_its_cpu() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]);
        let r = run(cmd).unwrap();
        let sh = r
            .threads
            .iter()
            .find(|t| t.name == "sh")
            .expect("the shell's thread");
        // Ticks are 10 ms; the last poll can miss the final 10 ms.
        assert!(sh.cpu_s > 0.5 * r.cpu_s, "{r:?}");
        assert!(sh.cpu_s <= r.cpu_s + 0.02, "{r:?}");
    }

    #[test]
    fn a_small_child_of_a_large_process_measures_small() {
        // 256 MiB touched here: `ru_maxrss` would report the child at least that large.
        let big = vec![1u8; 256 << 20];
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 0.2"]);
        let r = run(cmd).unwrap();
        assert!(r.max_rss_mib < 64.0, "{r:?}");
        assert!(
            std::hint::black_box(&big)
                .iter()
                .step_by(4096)
                .all(|&b| b == 1)
        );
    }
}
