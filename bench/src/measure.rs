//! Running a child process and measuring it: wall time from spawn to exit, and the CPU
//! time and peak resident set size the kernel accounted to it (`wait4`'s `rusage`, which
//! covers the child and every descendant it waited for).

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
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .context("stdout")?
        .read_to_string(&mut stdout)?;
    let (status, usage) = wait4(child.id())?;
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
        // Linux reports ru_maxrss in KiB.
        max_rss_mib: usage.ru_maxrss as f64 / 1024.0,
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
}
