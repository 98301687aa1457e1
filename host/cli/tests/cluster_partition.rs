//! A network partition (design §2.5, "Leases"): a coordinator and three node processes,
//! each node in its own network namespace joined to the coordinator's bridge by a veth
//! pair. While a job whose HASH edge crosses nodes runs, node-3's link is cut (its
//! root-side veth set down) for longer than its lease (TTL 2 s) but shorter than QUIC's
//! idle timeout (5 s), then restored:
//!
//! - node-3 stops its own tasks when no renewal was acknowledged in time (`LeaseLost`);
//! - the coordinator expires its lease and recovers the job on node-1 and node-2 under a
//!   new generation;
//! - what node-3's tasks had queued for the others arrives late once the link is back,
//!   and is refused and counted;
//! - node-3 registers again, and the job's output equals the embedded run.
//!
//! Whether QUIC delivers what was queued is up to its loss recovery (see [`RESTORE_BY`]):
//! a connection that meets no probe between the link's return and its idle timeout times
//! out, and nothing it held arrives. A round in which nothing of node-3's arrived shows
//! no refusal, so the test cuts again, in up to [`ROUNDS`] rounds (each a fresh run of the
//! job, every other check made in each).
//!
//! Needs root and iproute2, so it is ignored by a plain `cargo test`; `.ci/run` runs it
//! with `--ignored`. Without them it fails, never passes silently.

mod common;

use common::cluster::{Cluster, Timed, committed, embedded, job_copy, repo, serial, wait_for};
use common::netns::Netns;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The link comes back as soon as the job has recovered without node-3, and at the latest
/// this long after the cut: past its lease (TTL 2 s; node-3 stops its tasks 1.5 s after its
/// last acknowledged renewal) and before QUIC's idle timeout (5 s) would close the
/// connections.
///
/// Not later: while the link is down QUIC's probe timeouts back off exponentially (RFC
/// 9002 §6.2.1) and keep-alive PINGs wait behind the congestion window, so the only
/// packets sent are probes at ≈ (2^k − 1) × PTO after the cut — with a PTO of ≈ 27 ms on
/// the veth, at ≈ 1.7, 3.4 and 7 s. A link restored at 3.5–4 s meets no probe before the
/// idle timeout: node-3's connections time out at 5 s and nothing queued is ever delivered
/// (so it went in 5 of the 6 runs at 3.75 s whose logs were read). Restored by ≈ 3.2 s,
/// the probe at ≈ 3.4 s usually gets through.
const RESTORE_BY: Duration = Duration::from_millis(3_200);

/// Partitions at most, until one shows node-3's late frames refused. Of 33 first rounds
/// with the link restored after ≈ 2.3–2.7 s, 6 delivered nothing of node-3's. Besides the
/// probe schedule, quinn 0.11 does not send an ACK-only packet while the congestion
/// window is full and stream data waits (the gate of quinn-rs/quinn#2785): a node that
/// receives its peer's probe answers only with its own next probe, so both sides' backed-off
/// probes must line up before the 5 s idle timeout.
const ROUNDS: u32 = 5;

#[test]
#[ignore = "needs root and iproute2: .ci/run runs it"]
fn a_node_cut_off_past_its_lease_stops_its_tasks_and_its_late_frames_are_refused() {
    let _g = serial();
    let _t = Timed("partition", Instant::now());
    let net = Netns::new(3).unwrap_or_else(|e| {
        panic!(
            "this test puts each node in a network namespace and needs root and iproute2 \
             (`ip`); it cannot run here: {e}"
        )
    });
    // Dropped before `net`: the processes end before their namespaces go.
    let cluster = Cluster::start_in(net.layout());
    let tmp = tempfile::tempdir().unwrap();
    let expected = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    // The aggregate job at parallelism 3: its HASH edge crosses all three nodes. About
    // 7 s per run: running when node-3's lease expires and after its link returns.
    let job = job_copy("flights.toml", 100, 15_000);
    for round in 1..=ROUNDS {
        let late = partition(
            &cluster,
            &net,
            &job.0,
            &tmp.path().join(format!("out-{round}")),
            &expected,
            round,
        );
        if late {
            return;
        }
        eprintln!(
            "[cluster suite] partition: round {round}: nothing node-3 had queued arrived after \
             its link returned (its connections timed out); cutting again"
        );
    }
    panic!(
        "in {ROUNDS} partitions no late frame of node-3 arrived to be refused\n\
         --- node-1.log:\n{}\n--- node-2.log:\n{}",
        cluster.log_tail("node-1.log"),
        cluster.log_tail("node-2.log")
    );
}

/// One run of `job` with node-3 cut off mid-run; checks everything but the refusal of
/// node-3's late frames, and returns whether node-1 or node-2 refused some (then it checks
/// that the job status counted them).
fn partition(
    cluster: &Cluster,
    net: &Netns,
    job: &std::path::Path,
    out: &std::path::Path,
    expected: &[String],
    round: u32,
) -> bool {
    let refused_before: BTreeSet<String> =
        refused_streams_of_node3(cluster, net).into_iter().collect();
    let id = cluster.submit(job, out, &["-p", "3", "--fresh"]);
    wait_for(
        "the job running on three nodes with a durable epoch",
        Duration::from_secs(60),
        || cluster.nodes_of(&id) == [1, 2, 3] && !cluster.status(&id)["durable_epoch"].is_null(),
    );
    let before = cluster.status(&id);
    let generation = before["generation"].as_u64().unwrap();

    // Cut node-3 off; restore its link once the coordinator has recovered without it.
    let cut = Instant::now();
    net.set_link(3, false);
    eprintln!(
        "[cluster suite] partition: round {round}: node-3 cut off at {}",
        utc_now()
    );
    // `NOPSTREAM_PARTITION_CUT_MS` keeps the link down that long instead (3750 shows the
    // connections timing out).
    let fixed = std::env::var("NOPSTREAM_PARTITION_CUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    let mut recovered: Option<(Value, Duration)> = None;
    loop {
        let elapsed = cut.elapsed();
        let done = match fixed {
            Some(d) => elapsed >= d,
            None => recovered.is_some() || elapsed >= RESTORE_BY,
        };
        if done {
            break;
        }
        if recovered.is_none() {
            let s = cluster.status(&id);
            if s["generation"].as_u64().unwrap() > generation {
                recovered = Some((s, cut.elapsed()));
            }
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    net.set_link(3, true);
    let down = cut.elapsed();
    eprintln!(
        "[cluster suite] partition: round {round}: node-3's link restored at {} after {:.2} s",
        utc_now(),
        down.as_secs_f64()
    );
    if recovered.is_none() {
        // Slow: node-3 needs about a second more to register again (its handshake's
        // retransmission), so the recovery still places nothing on it.
        wait_for(
            "the recovery without node-3",
            Duration::from_secs(30),
            || {
                let s = cluster.status(&id);
                let up = s["generation"].as_u64().unwrap() > generation;
                if up {
                    recovered = Some((s, cut.elapsed()));
                }
                up
            },
        );
    }
    let (after, seen) = recovered.expect("waited for");
    eprintln!(
        "[cluster suite] partition: round {round}: generation {generation} -> {} seen {:.2} s \
         after the cut, on nodes {:?}",
        after["generation"],
        seen.as_secs_f64(),
        Cluster::nodes_in(&after)
    );
    assert!(
        !Cluster::nodes_in(&after).is_empty() && !Cluster::nodes_in(&after).contains(&3),
        "the recovery while node-3 is cut off places nothing on it: {after:#}"
    );

    // node-3 comes back as new capacity under a new lease.
    wait_for("node-3 to register again", Duration::from_secs(30), || {
        cluster.node_status(3).is_some_and(|s| {
            s["registrations"].as_u64() == Some(u64::from(round) + 1) && s["live"] == true
        })
    });
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    assert_eq!(committed(out), expected, "the output after a partition");
    assert!(
        status["generation"].as_u64().unwrap() > generation,
        "{status:#}"
    );

    // node-3 stopped its own tasks when it found its lease lost (the coordinator could
    // not tell it: the link was down), once per round, and its lease expired once.
    let log = cluster.log("node-3.log");
    let lost = log
        .lines()
        .filter(|l| l.contains("stopping this node's tasks") && l.contains("LeaseLost"))
        .count();
    assert_eq!(
        lost,
        round as usize,
        "node-3 must stop its tasks itself:\n{}",
        cluster.log_tail("node-3.log")
    );
    let node3 = cluster.node_status(3).unwrap();
    assert!(
        node3["registrations"].as_u64() == Some(u64::from(round) + 1)
            && node3["live"] == true
            && node3["expirations"].as_u64() == Some(u64::from(round)),
        "node-3 registered again once, after its lease expired: {node3:#}"
    );

    // Its late frames: what node-3's tasks had queued for the others before it stopped
    // them arrived once the link was back, and a receiver of the fenced generation
    // stopped the stream. The job status counts stale work per job across its runs.
    let count = |s: &Value| {
        let r = &s["refused"];
        ["events", "streams", "commands"].map(|k| r[k].as_u64().unwrap())
    };
    let (was, now) = (count(&before), count(&status));
    eprintln!(
        "[cluster suite] partition: round {round}: refused events {}, streams {}, commands {} \
         (before the cut {was:?}); generation {}, recoveries {}",
        now[0], now[1], now[2], status["generation"], status["recoveries"]
    );
    let late: Vec<String> = refused_streams_of_node3(cluster, net)
        .into_iter()
        .filter(|l| !refused_before.contains(l))
        .collect();
    if late.is_empty() {
        return false;
    }
    eprintln!(
        "[cluster suite] partition: round {round}: node-3's late streams refused:\n{}",
        late.join("\n")
    );
    assert!(
        now.iter().sum::<u64>() > was.iter().sum::<u64>(),
        "the stale generation's work was refused and counted: {status:#}"
    );
    true
}

/// Lines of node-1's and node-2's logs where a stream from node-3 was refused because its
/// generation was fenced.
fn refused_streams_of_node3(cluster: &Cluster, net: &Netns) -> Vec<String> {
    let node3 = format!("peer={}:", net.node_ip(3));
    [1, 2]
        .iter()
        .flat_map(|n| {
            cluster
                .log(&format!("node-{n}.log"))
                .lines()
                .filter(|l| {
                    l.contains("data stream stopped")
                        && l.contains(&node3)
                        && l.contains("refusal=generation fenced")
                })
                .map(|l| format!("node-{n}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The time of day (UTC), to line up with the processes' logs.
fn utc_now() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let s = t.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        s / 3600 % 24,
        s / 60 % 60,
        s % 60,
        t.subsec_millis()
    )
}
