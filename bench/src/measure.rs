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
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
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
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(kib) = vm_hwm_kib(pid) {
                    peak_kib = peak_kib.max(kib);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            peak_kib
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
    let hwm_kib = hwm.join().unwrap_or(0);
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
