//! Exactly-once under crashes (design §17–§18, §21): the flights jobs at parallelism
//! 2 with short checkpoint intervals, killed at every named failpoint and with SIGKILL
//! at random moments, restarted each time until they finish. The committed output must
//! equal the uninterrupted run: every line once, none missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A copy of an example job with a given checkpoint interval, in `tmp`.
fn job_copy(example: &str, interval_ms: u64, tmp: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("examples/flights").join(example)).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("checkpoint_interval_ms") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if line == "[job]" {
            out.push_str(&format!("checkpoint_interval_ms = {interval_ms}\n"));
        }
    }
    common::kit::job_in(tmp, example, "examples/flights", &out)
}

use common::flights::check_per_record;
use common::job::{Job, repo};

/// A copy of an example job with a checkpoint interval, run in `tmp`.
fn example_job(example: &str, interval_ms: u64, tmp: &Path) -> Job {
    Job::at(job_copy(example, interval_ms, tmp), tmp)
}

/// A reference run without interruption: its committed output and the duration of a
/// second, warm run (the first may include compiling the components into the cache).
fn reference_timed(example: &str) -> (Vec<String>, Duration) {
    let tmp = tempfile::tempdir().unwrap();
    let job = example_job(example, 100, tmp.path());
    let (ok, text) = job.run(None);
    assert!(ok, "{text}");
    let first = job.committed();
    let tmp2 = tempfile::tempdir().unwrap();
    let warm = example_job(example, 100, tmp2.path());
    let t = Instant::now();
    let (ok, text) = warm.run(None);
    assert!(ok, "{text}");
    assert_eq!(warm.committed(), first, "two uninterrupted runs agree");
    (first, t.elapsed())
}

fn reference(example: &str) -> Vec<String> {
    reference_timed(example).0
}

const FAILPOINTS: &[&str] = &[
    "before-barrier-injection=2",
    "after-barrier-injection=3",
    "after-pre-commit=2",
    "after-manifest-publish=2",
    "mid-commit=3",
    "during-restore=1",
];

fn crash_at_every_failpoint(example: &str, expected: &[String]) {
    for fp in FAILPOINTS {
        let tmp = tempfile::tempdir().unwrap();
        let job = example_job(example, 100, tmp.path());
        if fp.starts_with("during-restore") {
            // Needs a checkpoint to restore from: crash once first.
            let (ok, _) = job.run(Some("after-manifest-publish=2"));
            assert!(!ok);
        }
        let (ok, text) = job.run(Some(fp));
        assert!(
            !ok && text.contains("failpoint"),
            "{fp} did not fire: {text}"
        );
        job.finish();
        assert_eq!(job.committed(), expected, "output after a crash at {fp}");
    }
}

/// SIGKILLs the job at random moments, restarting it each time, until `kills` kills have
/// landed while it ran. A resumed run only has the remaining work, so a round can end
/// before enough kills landed; then its output is checked and a fresh round starts.
fn crash_at_random_moments(
    example: &str,
    expected: &[String],
    span: Duration,
    kills: usize,
    seed: u64,
) {
    // Kill moments are spread over one uninterrupted run's duration (start-up included);
    // when a round's first kill comes too late, the window shrinks.
    let mut span = (span.as_millis() as u64).max(100);
    let mut x = seed;
    let mut landed = 0;
    let mut rounds = 0;
    while landed < kills {
        rounds += 1;
        assert!(
            rounds <= 40,
            "kills keep missing the run ({landed}/{kills} landed)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let job = example_job(example, 100, tmp.path());
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 20 + (x >> 33) % span;
            if job.kill_after(Duration::from_millis(at)) {
                if first {
                    span = (span * 2 / 3).max(60);
                }
                break; // the job finished before the kill
            }
            first = false;
            landed += 1;
            if landed == kills {
                break;
            }
        }
        job.finish();
        assert_eq!(
            job.committed(),
            expected,
            "output after random kills (round {rounds})"
        );
        // The durable epochs count every record once, whatever the kills: a run of the
        // finished job reports them (from its final manifest).
        let o = job.command(None).arg("--json").output().unwrap();
        let report: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", common::job::text(&o)));
        assert_eq!(report["already_finished"], true, "{report:#}");
        assert_eq!(report["durable_records_read"], 336_776, "{report:#}");
        assert_eq!(
            report["durable_records_written"],
            expected.len() as u64,
            "{report:#}"
        );
    }
}

#[test]
fn per_record_job_survives_failpoints_and_random_kills() {
    let (expected, span) = reference_timed("flights-per-record.toml");
    check_per_record(&expected);
    crash_at_every_failpoint("flights-per-record.toml", &expected);
    crash_at_random_moments("flights-per-record.toml", &expected, span, 20, 7);
}

#[test]
fn aggregate_job_survives_failpoints_and_random_kills() {
    let (expected, span) = reference_timed("flights.toml");
    assert_eq!(expected.len(), 16);
    crash_at_every_failpoint("flights.toml", &expected);
    crash_at_random_moments("flights.toml", &expected, span, 20, 11);
}

#[test]
fn restarting_a_finished_job_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let job = example_job("flights-per-record.toml", 100, tmp.path());
    let (ok, text) = job.run(None);
    assert!(ok, "{text}");
    let listing = |dir: &Path| -> BTreeMap<String, u64> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect()
    };
    let before = (listing(&job.out), job.committed());
    for _ in 0..3 {
        let (ok, text) = job.run(None);
        assert!(ok && text.contains("already finished"), "{text}");
    }
    assert_eq!((listing(&job.out), job.committed()), before);
}

#[test]
fn lost_commit_reply_commits_once_and_expired_transaction_fails_loudly() {
    let expected = reference("flights-per-record.toml");
    // The sink commits but the reply is lost: recover says committed, nothing repeats.
    let tmp = tempfile::tempdir().unwrap();
    let job = example_job("flights-per-record.toml", 100, tmp.path());
    let (ok, text) = job.run(Some("commit-reply-lost=2:error"));
    assert!(ok, "{text}");
    assert_eq!(job.committed(), expected);

    // The transaction expired before commit: the job fails and says why.
    let tmp = tempfile::tempdir().unwrap();
    let job = example_job("flights-per-record.toml", 100, tmp.path());
    let (ok, text) = job.run(Some("expire-transaction=1:error"));
    assert!(!ok, "an unknown commit outcome must fail the job");
    assert!(
        text.contains("outcome is unknown") && text.contains("refusing to report it as committed"),
        "{text}"
    );
}

/// A job whose operator traps once (in attempt 1) recovers in-process from the latest
/// durable epoch with a new attempt, and its output is still every line exactly once.
#[test]
fn task_failure_recovers_in_process_from_the_latest_durable_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"
[job]
name = "flights-transient-fault"
parallelism = 2
checkpoint_interval_ms = 50

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", format = "csv", header = true }

[[operator]]
name = "flaky"
plugin = "fault-trap@0.1.0"
inputs = ["flights"]
config = { after = 120000, attempts = 1 }

[[sink]]
name = "lines"
plugin = "jsonl-sink@0.1.0"
inputs = ["flaky"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "lines" }
"#;
    let file = common::kit::job_in(tmp.path(), "transient.toml", "examples/flights", text);
    let job = Job::at(file, tmp.path());
    let (ok, text) = job.run(None);
    assert!(ok, "{text}");
    let recoveries: u32 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("recoveries"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        recoveries >= 1,
        "the trap of attempt 1 must be recovered in process:\n{text}"
    );
    let lines = job.committed();
    let csv = repo().join("examples/flights/data/flights.csv");
    let mut expected: Vec<String> = std::fs::read_to_string(csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect();
    expected.sort();
    assert_eq!(lines.len(), 336_776);
    assert_eq!(lines, expected, "every line exactly once after recovery");
}

/// Restore refuses a changed plan and says what differs (design §10.4).
#[test]
fn resume_with_a_changed_plan_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let job = example_job("flights-per-record.toml", 100, tmp.path());
    let (ok, _) = job.run(Some("after-manifest-publish=1"));
    assert!(!ok);
    let o = job.command(None).args(["-p", "1"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        text.contains("cannot restore from epoch") && text.contains("plan fingerprint differs"),
        "{text}"
    );
    // The explicit way out works.
    let o = job
        .command(None)
        .args(["-p", "1", "--fresh"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_per_record(&job.committed());
}

/// The job text of datagen-source (config `source`) -> bids-parser -> HASH -> keyed-count
/// -> blackhole-sink at parallelism 2 with 50 ms epochs, named `name`, with `job_extra`
/// lines in its `[job]` table.
fn bids_count_job(name: &str, job_extra: &str, source: &str) -> String {
    format!(
        r#"[job]
name = "{name}"
parallelism = 2
checkpoint_interval_ms = 50
{job_extra}

[[source]]
name = "bids"
plugin = "datagen-source@0.1.0"
config = {{ {source} }}

[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "count"
plugin = "keyed-count@0.1.0"
inputs = [{{ from = "parse", partition = "hash" }}]

[[sink]]
name = "out"
plugin = "blackhole-sink@0.1.0"
inputs = ["count"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ summary_dir = "/output" }}
"#
    )
}

/// Runs `text` (a [`bids_count_job`] of `bids` generated bids) uninterrupted as the
/// reference: the job, for more checks, and the blackhole totals its sink committed (one
/// count update per bid).
fn reference_run(tag: &str, text: &str, bids: u64) -> (Job, (u64, u64)) {
    let reference = Job::new("crash", tag, text);
    let (ok, log) = reference.run(None);
    assert!(ok, "{log}");
    let expected = common::files::blackhole_totals(&reference.out);
    assert_eq!(expected.0, bids, "one count update per generated bid");
    (reference, expected)
}

/// Bids of [`small_bids_job`].
const SMALL_BIDS: u64 = 60_000;

/// A [`bids_count_job`] of [`SMALL_BIDS`] bids over 5,000 auctions, at 60,000 bids/s (a
/// second or so of input: a crash lands mid-run).
fn small_bids_job(name: &str, job_extra: &str) -> String {
    bids_count_job(
        name,
        job_extra,
        &format!("records = {SMALL_BIDS}, splits = 2, keys = 5000, records_per_second = 60000"),
    )
}

/// Runs `text` with failpoint `failpoint` armed (one that aborts the process), checks that
/// it fired, resumes the job to its end and returns the blackhole totals it committed.
fn crash_at_then_resume(tag: &str, text: &str, failpoint: &str) -> (u64, u64) {
    let job = Job::new("crash", tag, text);
    let (ok, log) = job.run(Some(failpoint));
    assert!(
        !ok && log.contains("failpoint"),
        "{failpoint} did not fire: {log}"
    );
    job.finish();
    common::files::blackhole_totals(&job.out)
}

#[test]
fn generated_input_replays_exactly_after_random_kills() {
    // datagen-source (3 splits, throttled so kills land mid-run) -> bids-parser -> HASH ->
    // keyed-count (one (auction, running count) update per bid) -> blackhole-sink at
    // parallelism 2. Every auction's counts 1..n appear once each, so the committed
    // multiset, and the sink's order-independent checksum, is the same for any run that
    // neither loses nor repeats a bid.
    const BIDS: u64 = 150_000;
    let text = bids_count_job(
        "datagen-crash",
        "",
        &format!(
            "records = {BIDS}, splits = 3, keys = 500, rotate_every = 50, records_per_second = 100000"
        ),
    );
    let (_, expected) = reference_run("datagen-ref", &text, BIDS);
    common::job::kill_rounds(
        12,
        1_200,
        0xda7a,
        |round| Job::new("crash", &format!("datagen-{round}"), &text),
        |job, round| {
            assert_eq!(
                common::files::blackhole_totals(&job.out),
                expected,
                "round {round}: committed output differs from the uninterrupted run"
            );
        },
    );
}

#[test]
fn a_tiny_state_memory_budget_keeps_the_output_exact_through_kills() {
    // Regression for the byte budget of the keyed working set (design §5.5, §8.1): 20,000
    // auctions at parallelism 2 with `state_memory_bytes` of 1 MiB (512 KiB a subtask, a
    // working set of a few thousand entries) flush and evict all the time; the committed
    // output, uninterrupted and through SIGKILLs, equals the run without a budget.
    const BIDS: u64 = 60_000;
    let job = |budget: &str| {
        bids_count_job(
            "budget",
            budget,
            &format!("records = {BIDS}, splits = 2, keys = 20000, records_per_second = 40000"),
        )
    };
    let (_, expected) = reference_run("budget-ref", &job(""), BIDS);

    let text = job("state_memory_bytes = \"1MiB\"");
    let mut budgeted = Job::new("crash", "budget-1mib", &text);
    budgeted
        .env
        .push(("RUST_LOG".into(), "warn,nopstream::state=debug".into()));
    let (ok, log) = budgeted.run(None);
    assert!(ok, "{log}");
    assert_eq!(common::files::blackhole_totals(&budgeted.out), expected);
    // The budget was in force: the working set was trimmed, and never counted more than
    // the working-set share (3/4 of 512 KiB) at a barrier.
    // Without ANSI escapes (tracing colours field names).
    let mut plain = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            plain.push(c);
        }
    }
    let evictions: Vec<(u64, u64)> = plain
        .lines()
        .filter(|l| l.contains("keyed state at the barrier"))
        .filter_map(|l| {
            let field = |k: &str| {
                let at = l.find(&format!("{k}="))? + k.len() + 1;
                l[at..].split_whitespace().next()?.parse::<u64>().ok()
            };
            Some((field("evictions")?, field("cached_bytes")?))
        })
        .collect();
    assert!(!evictions.is_empty(), "{log}");
    assert!(evictions.iter().any(|(n, _)| *n > 0), "{evictions:?}");
    assert!(
        evictions
            .iter()
            .all(|(_, bytes)| *bytes <= 3 * (512 << 10) / 4),
        "{evictions:?}"
    );

    common::job::kill_rounds(
        6,
        1_500,
        0xb0d9,
        |round| Job::new("crash", &format!("budget-{round}"), &text),
        |job, round| {
            assert_eq!(
                common::files::blackhole_totals(&job.out),
                expected,
                "round {round}: committed output differs from the run without a budget"
            );
        },
    );
}

#[test]
fn a_crash_or_failure_while_an_asynchronous_snapshot_is_in_flight_keeps_the_output_exact() {
    // Regression for asynchronous snapshots (design §5.5, §8.1): the keyed-count subtasks
    // write their segments on a background thread after forwarding the barrier, and Ack
    // only once the file is durable. Killed there (failpoint `async-snapshot-write`: the
    // file written, not yet durable, the barrier already downstream), or failed there,
    // the job must still commit exactly the uninterrupted output; synchronous snapshots
    // (`async_snapshots = false`) must produce it too.
    let job = |extra: &str| small_bids_job("async-snap", extra);
    let (_, expected) = reference_run("async-ref", &job(""), SMALL_BIDS);

    let sync = Job::new("crash", "async-off", &job("async_snapshots = false"));
    let (ok, log) = sync.run(None);
    assert!(ok, "{log}");
    assert_eq!(common::files::blackhole_totals(&sync.out), expected);

    for nth in [2, 5] {
        assert_eq!(
            crash_at_then_resume(
                &format!("async-abort-{nth}"),
                &job(""),
                &format!("async-snapshot-write={nth}")
            ),
            expected,
            "output after a crash in the snapshot thread (hit {nth})"
        );
    }

    // A failure in the background part fails the task, naming the operator and the
    // file (a storage error is fatal, as a synchronous one is), without an Ack for that
    // epoch; a restart resumes from the latest durable epoch.
    let failed = Job::new("crash", "async-error", &job(""));
    let (ok, log) = failed.run(Some("async-snapshot-write=3:error"));
    assert!(!ok, "{log}");
    assert!(
        log.contains("state of operator `count` (segments/")
            && log.contains("failpoint `async-snapshot-write` fired")
            && !log.contains("panicked"),
        "{log}"
    );
    failed.finish();
    assert_eq!(common::files::blackhole_totals(&failed.out), expected);
}

#[test]
fn a_state_ttl_longer_than_the_run_keeps_the_counts_exact_through_a_crash() {
    // With a TTL on `count`, keyed-count learns it through WIT `state-ttl` (0.2.2) and
    // caches nothing across batches: every batch reads and writes its keys in the host.
    // An hour outlives the run, so nothing expires and the committed output equals the
    // run without a TTL, uninterrupted and after a crash.
    let job = |ttl: bool| {
        let text = small_bids_job("ttl", "");
        if !ttl {
            return text;
        }
        let with = text.replace(
            "plugin = \"keyed-count@0.1.0\"\n",
            "plugin = \"keyed-count@0.1.0\"\nstate_ttl_ms = { count = 3600000 }\n",
        );
        assert_ne!(with, text);
        with
    };
    let (_, expected) = reference_run("ttl-ref", &job(false), SMALL_BIDS);
    let with_ttl = Job::new("crash", "ttl-on", &job(true));
    let (ok, log) = with_ttl.run(None);
    assert!(ok, "{log}");
    assert_eq!(common::files::blackhole_totals(&with_ttl.out), expected);
    assert_eq!(
        crash_at_then_resume("ttl-abort", &job(true), "async-snapshot-write=3"),
        expected,
        "output after a crash"
    );
}

#[test]
fn a_state_ttl_shorter_than_the_gap_between_bids_restarts_every_count() {
    // One auction, two bids a second at p=1, one record per batch (the generator's
    // throttle: about 500 ms between bids): with a 20 ms TTL on `count` each bid finds its
    // auction's count expired, so every update is (auction, 1); with 60 s the counts run
    // 1..n. A cache in keyed-count that outlived a batch under a TTL would count on past
    // the expiry. (The throttle catches up after a stall: only a stall of about 480 ms
    // between two reads could bring two bids within the TTL.)
    const BIDS: u64 = 5;
    let job = |ttl_ms: u64| {
        let text = bids_count_job(
            "ttl-expiry",
            "batch_records = 1",
            &format!("records = {BIDS}, splits = 1, keys = 1, records_per_second = 2"),
        )
        .replace("parallelism = 2", "parallelism = 1")
        .replace(
            "plugin = \"keyed-count@0.1.0\"\n",
            &format!("plugin = \"keyed-count@0.1.0\"\nstate_ttl_ms = {{ count = {ttl_ms} }}\n"),
        );
        assert!(text.contains("state_ttl_ms") && text.contains("parallelism = 1\n"));
        text
    };
    // The independent expectation: keyed-count's payload is the key (the auction, `u64`
    // LE, as bids-parser keys a bid) and the count (`u64` LE); the generator's only
    // auction with `keys = 1` is 1000.
    let totals = |counts: &mut dyn Iterator<Item = u64>| {
        let mut s = blackhole_sink::Summary::default();
        for c in counts {
            let mut payload = 1000u64.to_le_bytes().to_vec();
            payload.extend_from_slice(&c.to_le_bytes());
            s.add(&payload);
        }
        (s.records, s.checksum)
    };
    for (ttl_ms, expected) in [
        (20, totals(&mut std::iter::repeat_n(1, BIDS as usize))),
        (60_000, totals(&mut (1..=BIDS))),
    ] {
        let run = Job::new("crash", &format!("ttl-expiry-{ttl_ms}"), &job(ttl_ms));
        let (ok, log) = run.run(None);
        assert!(ok, "{log}");
        assert_eq!(
            common::files::blackhole_totals(&run.out),
            expected,
            "counts under a {ttl_ms} ms TTL"
        );
    }
}

/// The newest manifest's JSON under `work` (`None` before the first one).
fn latest_manifest_text(work: &std::path::Path) -> Option<String> {
    let ns = common::files::namespace_in(work)?;
    let m = ns.latest_manifest().ok()??;
    serde_json::to_string_pretty(&m).ok()
}

#[test]
fn restarts_from_incremental_chains_commit_exactly_the_full_snapshot_output() {
    // Incremental snapshots (design §5.5, §8.1), on by default: each epoch writes only the
    // keys changed since the subtask's last snapshot, and a manifest lists per shard the
    // full payload and the deltas after it. SIGKILLed at random points, each restart
    // restores a chain; the committed output must equal that of a run with every epoch a
    // full snapshot (`incremental_snapshots = false`), and some restarts must have
    // restored a chain that holds deltas.
    const BIDS: u64 = 400_000;
    let job = |extra: &str| {
        bids_count_job(
            "incr-snap",
            extra,
            &format!("records = {BIDS}, splits = 2, keys = 5000, records_per_second = 40000"),
        )
    };
    let (reference, expected) =
        reference_run("incr-full", &job("incremental_snapshots = false"), BIDS);
    assert!(
        !latest_manifest_text(&reference.work)
            .expect("a manifest")
            .contains("kv-delta/1"),
        "incremental_snapshots = false wrote a delta"
    );

    let killed = Job::new("crash", "incr-killed", &job(""));
    let mut x: u64 = 0x1c2e;
    let (mut restarts_from_deltas, mut restarts_from_compacted, mut kills) = (0, 0, 0);
    for _ in 0..30 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let limit = Duration::from_millis(400 + (x >> 33) % 900);
        let (ended, ok, log) = killed.run_for(limit);
        if ended {
            assert!(ok, "{log}");
            break;
        }
        kills += 1;
        let manifest = latest_manifest_text(&killed.work);
        if manifest
            .as_deref()
            .is_some_and(|m| m.contains("kv-delta/1"))
        {
            restarts_from_deltas += 1;
        }
        // A chain a background compaction folded (its file `<subtask>.a<n>.c<epoch>.seg`).
        if manifest.as_deref().is_some_and(names_a_compacted_file) {
            restarts_from_compacted += 1;
        }
        if restarts_from_deltas >= 3 && restarts_from_compacted >= 1 {
            break;
        }
    }
    killed.finish();
    eprintln!(
        "{kills} kills, {restarts_from_deltas} restarts from chains with deltas, \
         {restarts_from_compacted} from compacted chains"
    );
    assert_eq!(
        common::files::blackhole_totals(&killed.out),
        expected,
        "output after {kills} kills ({restarts_from_deltas} restarts from chains with deltas, \
         {restarts_from_compacted} from compacted chains)"
    );
    assert!(
        restarts_from_deltas >= 1,
        "no restart restored a chain with deltas in {kills} kills"
    );
    assert!(
        restarts_from_compacted >= 1,
        "no restart restored a compacted chain in {kills} kills"
    );
}

#[test]
fn a_compaction_that_crashes_or_fails_keeps_the_output_exact() {
    // Background compaction of incremental snapshots (design §5.5, §8.1). Killed while it
    // writes its file (failpoint `compaction-write`: written, not yet durable), the job
    // restarts from a manifest that never names the file. Failing there, the task logs
    // it, takes a full snapshot at its next barrier and goes on. Either way the committed
    // output is that of a run with every epoch a full snapshot.
    let job = |extra: &str| small_bids_job("compact", extra);
    let (_, expected) = reference_run(
        "compact-ref",
        &job("incremental_snapshots = false"),
        SMALL_BIDS,
    );

    assert_eq!(
        crash_at_then_resume("compact-abort", &job(""), "compaction-write=2"),
        expected,
        "output after a crash in a compaction"
    );

    let failed = Job::new("crash", "compact-error", &job(""));
    let (ok, log) = failed.run(Some("compaction-write=1:error"));
    assert!(ok, "a failed compaction failed the job: {log}");
    assert!(
        log.contains("background compaction failed")
            && log.contains("compaction of operator `count` (segments/")
            && log.contains("failpoint `compaction-write` fired"),
        "{log}"
    );
    assert_eq!(
        common::files::blackhole_totals(&failed.out),
        expected,
        "output after a failed compaction"
    );
}

#[test]
fn epochs_that_time_out_while_a_delta_is_written_are_aborted_and_the_chain_stays_exact() {
    // A checkpoint timeout with incremental snapshots (design §5.5, §8.1). One subtask's
    // snapshot thread stalls for 1.5 s while it writes a delta (failpoint
    // `async-snapshot-write` with `sleep`), far past `checkpoint_timeout_ms = 200`: the
    // coordinator aborts that epoch, and the ones whose snapshots queue behind it, and
    // the job goes on. The later epochs' chains build on the stalled delta, so the
    // retention must keep it while they reference it. Run to its end, and killed after
    // the aborts and restarted from those chains, the job must commit exactly the output
    // of a run with full snapshots and no timeout.
    let job = |extra: &str| small_bids_job("ckpt-timeout", extra);
    let (_, expected) = reference_run(
        "timeout-ref",
        &job("incremental_snapshots = false"),
        SMALL_BIDS,
    );
    let text = job("checkpoint_timeout_ms = 200");
    let stall = "async-snapshot-write=6:sleep-1500";

    let straight = Job::new("crash", "timeout-straight", &text);
    let (ok, log) = straight.run(Some(stall));
    assert!(ok, "{log}");
    assert!(
        log.contains("failpoint `async-snapshot-write` fired: sleeping")
            && log.contains("aborted: "),
        "no epoch was aborted: {log}"
    );
    assert_eq!(
        common::files::blackhole_totals(&straight.out),
        expected,
        "output of a run with aborted epochs"
    );

    // Killed at the 4th manifest published (2 before the stall, the aborts, then the 4th),
    // then restarted.
    let killed = Job::new("crash", "timeout-killed", &text);
    let (ok, log) = killed.run(Some(&format!("{stall},after-manifest-publish=4")));
    assert!(
        !ok && log.contains("aborted: ")
            && log.contains("failpoint `after-manifest-publish` fired: aborting"),
        "no abort before the crash: {log}"
    );
    let manifest = latest_manifest_text(&killed.work).expect("a manifest before the kill");
    assert!(
        manifest.contains("kv-delta/1"),
        "the restart does not restore a chain with deltas: {manifest}"
    );
    // The chains it restores reach into the directories of aborted epochs.
    let aborted = aborted_epochs(&killed.work);
    assert!(
        aborted
            .iter()
            .any(|e| manifest.contains(&format!("\"segments/{e}/"))),
        "no segment of an aborted epoch ({aborted:?}) in the restored manifest: {manifest}"
    );
    killed.finish();
    assert_eq!(
        common::files::blackhole_totals(&killed.out),
        expected,
        "output after aborted epochs, a kill and a restart"
    );
}

/// The epochs the epoch log under `work` records as aborted.
fn aborted_epochs(work: &std::path::Path) -> Vec<u64> {
    let ns = common::files::namespace_in(work).expect("a checkpoint namespace");
    ns.read_log()
        .unwrap()
        .iter()
        .filter(|r| r.state == nop_stream_checkpoint::EpochState::Aborted)
        .map(|r| r.epoch.0)
        .collect()
}

/// Whether manifest text `m` references a file a background compaction wrote
/// (`segments/<e>/<operator>/<subtask>.a<attempt>.c<epoch>.seg`; operator ids never hold
/// a `.`, which the names encode).
fn names_a_compacted_file(m: &str) -> bool {
    m.split('"').any(|t| {
        t.starts_with("segments/")
            && t.rsplit('/')
                .next()
                .is_some_and(|f| f.contains(".c") && f.ends_with(".seg"))
    })
}
