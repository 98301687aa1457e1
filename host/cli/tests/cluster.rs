//! The cluster, end to end (design §2.5): a coordinator and three node processes of the
//! `nopstream` binary over real QUIC on loopback, with the certificates `nopstream cluster
//! init` writes, plugins uploaded to the registry, jobs submitted with `nopstream job
//! submit`. Lease TTL 2 s, heartbeats every 300 ms.
//!
//! - The four flights examples produce exactly the embedded run's output.
//! - Nodes SIGKILLed at random moments (at least 10 kills over the suite): the jobs recover
//!   on the surviving nodes; the per-record job commits every departure once, the
//!   aggregate job equals the uninterrupted run.
//! - A node SIGSTOPped past its lease, then SIGCONTed: the job recovers without it, its late
//!   work is refused and counted, the output is exact.
//! - The coordinator SIGKILLed mid-run and restarted: the job finishes with exact output.
//!
//! The tests of this binary run one at a time (leases on two cores must not expire by
//! starvation), and it prints its duration.

mod common;

use common::cluster::{
    Cluster, Rng, Timed, check_per_record, committed, embedded, job_copy, repo, serial, signal,
    wait_for,
};
use std::time::{Duration, Instant};

#[test]
fn the_four_flights_examples_on_three_nodes_equal_the_embedded_run() {
    let _g = serial();
    let _t = Timed("examples", Instant::now());
    let cluster = Cluster::start(3);
    for example in [
        "flights.toml",
        "flights-per-record.toml",
        "hourly-delay.toml",
        "delay-cascade.toml",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let job = repo().join("examples/flights").join(example);
        let expected = embedded(&job, tmp.path());
        assert!(
            !expected.is_empty(),
            "{example}: the embedded run wrote nothing"
        );
        let out = tmp.path().join("cluster-out");
        // Parallelism 3: every node holds a slot group, so HASH edges cross nodes.
        let id = cluster.submit(&job, &out, &["-p", "3"]);
        let status = cluster.wait_finished(&id, Duration::from_secs(300));
        assert_eq!(cluster.nodes_of(&id), [1, 2, 3], "{status:#}");
        assert_eq!(
            committed(&out),
            expected,
            "{example}: the cluster's output differs from the embedded run"
        );
        if example == "flights-per-record.toml" {
            check_per_record(&expected);
        }
    }
}

/// One run of `example` with a node SIGKILLed at a random moment, restarted once the job
/// has recovered without it; returns the committed output.
fn run_with_node_kill(
    cluster: &mut Cluster,
    rng: &mut Rng,
    example: &str,
    interval_ms: u64,
) -> Vec<String> {
    // About 3 s per run at parallelism 3.
    let job = job_copy(example, interval_ms, 40_000);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
    wait_for("a deployment", Duration::from_secs(60), || {
        !cluster.nodes_of(&id).is_empty()
    });
    let generation = cluster.status(&id)["generation"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(200 + rng.below(2000)));
    let nodes = cluster.nodes_of(&id);
    let victim = nodes[rng.below(nodes.len() as u64) as usize];
    let ended = cluster.status(&id)["state"] != "Running";
    cluster.kill_node(victim);
    eprintln!("[cluster suite] {example}: killed node-{victim} (job ended before: {ended})");
    if !ended {
        wait_for("the job to recover or end", Duration::from_secs(60), || {
            let s = cluster.status(&id);
            s["generation"].as_u64().unwrap() > generation || s["state"] != "Running"
        });
    }
    cluster.start_node(victim);
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    if !ended {
        assert!(
            status["recoveries"].as_u64().unwrap() >= 1,
            "a node holding tasks was killed, so the job recovered: {status:#}"
        );
    }
    cluster.wait_live(3);
    let lines = committed(&out);
    // Regression: the status of a finished job showed the nodes' last counter reports
    // (stale: 316,300 read of 336,776), and a resubmission of the job id added to the
    // previous run's counts. It counts what the durable epochs hold, per run.
    assert_eq!(
        (
            status["records_read"].as_u64(),
            status["records_written"].as_u64()
        ),
        (Some(336_776), Some(lines.len() as u64)),
        "the finished job's counts are its input and its committed output: {status:#}"
    );
    lines
}

#[test]
fn nodes_killed_at_random_moments_leave_exact_output() {
    let _g = serial();
    let _t = Timed("node kills", Instant::now());
    let mut rng = Rng::new("node kills");
    let mut cluster = Cluster::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let aggregate = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    for _ in 0..6 {
        let lines = run_with_node_kill(&mut cluster, &mut rng, "flights-per-record.toml", 200);
        check_per_record(&lines);
    }
    for _ in 0..4 {
        let lines = run_with_node_kill(&mut cluster, &mut rng, "flights.toml", 200);
        assert_eq!(lines, aggregate, "the aggregate after a node kill");
    }
}

#[test]
fn a_node_stopped_past_its_lease_is_fenced_and_its_late_work_refused() {
    let _g = serial();
    let _t = Timed("sigstop", Instant::now());
    let cluster = Cluster::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let expected = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    // The aggregate job: its HASH edge crosses nodes, so the stopped node's channels are
    // streams the other nodes must refuse.
    // About 6 s at parallelism 3: running when node-2's lease expires.
    let job = job_copy("flights.toml", 100, 20_000);
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
    wait_for(
        "the job running on three nodes",
        Duration::from_secs(60),
        || cluster.nodes_of(&id) == [1, 2, 3] && !cluster.status(&id)["durable_epoch"].is_null(),
    );
    let generation = cluster.status(&id)["generation"].as_u64().unwrap();
    let pid = cluster.node_pid(2);
    signal(pid, "-STOP");
    // Past its lease (2 s): the coordinator recovers without node-2.
    wait_for("recovery without node-2", Duration::from_secs(30), || {
        let s = cluster.status(&id);
        s["generation"].as_u64().unwrap() > generation && !cluster.nodes_of(&id).contains(&2)
    });
    std::thread::sleep(Duration::from_millis(500));
    signal(pid, "-CONT");
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    assert_eq!(committed(&out), expected, "the output after a stopped node");
    let refused = &status["refused"];
    let total = refused["events"].as_u64().unwrap()
        + refused["streams"].as_u64().unwrap()
        + refused["commands"].as_u64().unwrap();
    assert!(
        total > 0,
        "the stale generation's work was refused and counted: {status:#}"
    );
    // node-2 stopped its own tasks when it found its lease lost, and joined again.
    let log = cluster.log("node-2.log");
    assert!(
        log.contains("stopping this node's tasks")
            && (log.contains("LeaseLost") || log.contains("expired")),
        "node-2 must stop its tasks itself:\n{}",
        cluster.log_tail("node-2.log")
    );
    cluster.wait_live(3);

    // The same job again, fresh: its generations go on above the fenced ones, which every
    // node still refuses (a run counting from generation 1 again had its first
    // deployments refused on the nodes and recovered until it passed them).
    let again = tmp.path().join("again");
    let id2 = cluster.submit(
        &repo().join("examples/flights/flights.toml"),
        &again,
        &["-p", "3", "--fresh"],
    );
    assert_eq!(id2, id);
    let rerun = cluster.wait_finished(&id, Duration::from_secs(300));
    assert_eq!(committed(&again), expected, "the fresh run's output");
    assert!(
        rerun["recoveries"] == 0
            && rerun["generation"].as_u64().unwrap() > status["generation"].as_u64().unwrap(),
        "a fresh run deploys above the generations its nodes fenced, at once: {rerun:#}\n\
         --- coordinator log tail:\n{}",
        cluster.log_tail("coordinator.log")
    );
}

#[test]
fn a_coordinator_killed_mid_run_and_restarted_finishes_the_job_exactly() {
    let _g = serial();
    let _t = Timed("coordinator restart", Instant::now());
    let mut rng = Rng::new("coordinator restart");
    let mut cluster = Cluster::start(3);
    for _ in 0..2 {
        let job = job_copy("flights-per-record.toml", 200, 40_000);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
        wait_for("a deployment", Duration::from_secs(60), || {
            !cluster.nodes_of(&id).is_empty()
        });
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        cluster.kill_coordinator();
        std::thread::sleep(Duration::from_millis(500));
        cluster.start_coordinator();
        let status = cluster.wait_finished(&id, Duration::from_secs(300));
        check_per_record(&committed(&out));
        eprintln!(
            "[cluster suite] after a coordinator restart: generation {}, recoveries {}",
            status["generation"], status["recoveries"]
        );
    }
}

#[test]
fn a_job_stopped_with_a_savepoint_resumes_on_resubmission_with_exact_output() {
    let _g = serial();
    let _t = Timed("stop with savepoint", Instant::now());
    let cluster = Cluster::start(2);
    let job = job_copy("flights-per-record.toml", 200, 40_000);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "2", "--fresh"]);
    wait_for("a deployment", Duration::from_secs(60), || {
        !cluster.nodes_of(&id).is_empty()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let sp = tmp.path().join("sp");
    let (ok, text) = cluster.cli(
        &[
            "stop",
            &id,
            "--savepoint",
            "--out",
            &sp.display().to_string(),
        ],
        &[],
    );
    assert!(ok, "{text}");
    assert!(text.contains("stopped with a savepoint at epoch"), "{text}");
    assert!(sp.join("savepoint.json").is_file());
    // The answer comes once the job stopped.
    let status = cluster.status(&id);
    assert_eq!(status["state"], "Stopped", "{status:#}");
    let partial = committed(&out);
    assert!(
        !partial.is_empty() && partial.len() < 336_776,
        "stopped mid-run with its savepoint's epoch committed: {} lines",
        partial.len()
    );
    // Submitted again (no --fresh): resumes from the savepoint's epoch, nothing twice.
    let again = cluster.submit(&job.0, &out, &["-p", "2"]);
    assert_eq!(again, id);
    cluster.wait_finished(&id, Duration::from_secs(300));
    check_per_record(&committed(&out));
}

#[test]
fn nodes_holding_no_task_of_a_job_compile_its_components_ahead_of_need() {
    // Regression: only nodes given tasks fetched and compiled a job's components, so a
    // redeploy onto a survivor after a node loss began with a cold compile there.
    let _g = serial();
    let _t = Timed("warm components", Instant::now());
    let cluster = Cluster::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let id = cluster.submit(
        &repo().join("examples/flights/flights.toml"),
        &out,
        &["-p", "1"],
    );
    wait_for("a deployment", Duration::from_secs(60), || {
        !cluster.nodes_of(&id).is_empty()
    });
    let busy = cluster.nodes_of(&id);
    assert_eq!(busy.len(), 1, "parallelism 1 runs on one node");
    let components = |node: u32| -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(cluster.path(&format!("node-{node}")).join("components"))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.ends_with(".wasm"))
                        .collect()
                })
                .unwrap_or_default();
        names.sort();
        names
    };
    cluster.wait_finished(&id, Duration::from_secs(300));
    let expected = components(busy[0]);
    assert!(!expected.is_empty(), "node-{} fetched nothing", busy[0]);
    for idle in (1..=3).filter(|n| !busy.contains(n)) {
        wait_for(
            &format!("node-{idle} to compile the job's components"),
            Duration::from_secs(120),
            || {
                components(idle) == expected
                    && cluster
                        .log(&format!("node-{idle}.log"))
                        .contains("components warmed")
            },
        );
    }
}
