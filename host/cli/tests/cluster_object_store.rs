//! A cluster that shares no directory (design §14): the coordinator and three nodes each
//! in a network namespace of their own with a private data directory; checkpoints, the
//! plugin registry and the job records on the S3 test server; the job reads the flights
//! CSV each node has locally (the job's directory) and inserts one row per departure into
//! PostgreSQL with two-phase commit. Through ten random node SIGKILLs (each node
//! restarted) and a coordinator SIGKILL restarted with an **empty** data directory, every
//! row is committed exactly once and nothing stays prepared.
//!
//! Needs root and iproute2 (network namespaces), the S3 test server and PostgreSQL (both
//! started by `.ci/run`, on loopback: the test forwards the bridge's address to them), so
//! it is ignored by a plain `cargo test` and fails without them.

mod common;

use common::cluster::{Cluster, Rng};
use common::flights::natural_keys;
use common::forward::forward;
use common::netns::Netns;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The committed rows as JSON lines (sorted), for the natural-key check.
fn rows(db: &mut common::pg::Db) -> Vec<String> {
    let mut out: Vec<String> = db
        .client
        .query(
            "SELECT json_build_object('year', year, 'month', month, 'day', day, \
             'carrier', carrier, 'flight', flight, 'origin', origin, \
             'sched_dep_time', sched_dep_time)::text FROM departures",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    out.sort();
    out
}

#[test]
#[ignore = "needs root, iproute2, the S3 test server and PostgreSQL (.ci/run)"]
fn a_cluster_without_a_shared_file_system_survives_node_and_coordinator_kills() {
    let started = Instant::now();
    let s3 = std::env::var("NOP_TEST_S3_URL").expect(
        "NOP_TEST_S3_URL is not set: start the test server with \
         `eval \"$(scripts/s3-test-server.sh start)\"`",
    );
    let mut db = common::pg::Db::new("s3cluster");
    db.client
        .batch_execute(common::pg::DEPARTURES_WITHOUT_KEY)
        .unwrap();
    let net = Netns::with_coordinator(3).unwrap_or_else(|e| panic!("network namespaces: {e}"));
    // What every namespace reaches: the object store and the database, forwarded from the
    // bridge's address to their loopback ones.
    let nop_stream_checkpoint::Location::S3 { endpoint, .. } =
        nop_stream_checkpoint::Location::parse(&s3).unwrap()
    else {
        panic!("NOP_TEST_S3_URL is not an s3:// URL");
    };
    let endpoint = endpoint.expect("the test server's endpoint");
    let s3_port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let s3_fwd = forward(net.host_ip(), ([127, 0, 0, 1], s3_port).into());
    let pg_url: url_parts::Parts = url_parts::parse(&db.url);
    let pg_fwd = forward(net.host_ip(), ([127, 0, 0, 1], pg_url.port).into());
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let storage = format!(
        "s3://nop/cluster-tests/{}-{n}?endpoint=http://{}",
        std::process::id(),
        s3_fwd.addr
    );
    let mut layout = net.layout();
    layout.storage = Some(storage.clone());
    let mut cluster = Cluster::start_in(layout);
    let sink = PathBuf::from(nop_stream_artifacts::PLUGIN_DIR).join("postgres_sink.wasm");
    let (ok, out) = cluster.cli(&["plugin", "upload"], &[sink]);
    assert!(ok, "{out}");

    let job_url = format!("postgres://{}@{}/{}", pg_url.user, pg_fwd.addr, db.name);
    let job = common::job::Job::new(
        "s3-cluster",
        "per-record",
        &common::pg::per_record_departures_job(
            "s3-cluster-per-record",
            &job_url,
            3,
            200,
            Some(4000),
        ),
    );
    let id = cluster.submit(&job.file, &job.out, &["--fresh"]);
    let mut rng = Rng::new("s3 cluster");
    let mut kills = 0;
    let mut coordinator_restarted = false;
    while kills < 10 {
        std::thread::sleep(Duration::from_millis(400 + rng.below(1200)));
        let s = cluster.status(&id);
        if s["state"] != "Running" && s["state"] != "Submitted" {
            break;
        }
        if kills == 5 && !coordinator_restarted {
            // The coordinator dies and comes back with nothing on its disk.
            cluster.restart_coordinator(true);
            coordinator_restarted = true;
            continue;
        }
        // A node that holds tasks of the live generation.
        let holding = Cluster::nodes_in(&s);
        if holding.is_empty() {
            continue;
        }
        let node = holding[rng.below(holding.len() as u64) as usize];
        cluster.kill_node(node);
        kills += 1;
        std::thread::sleep(Duration::from_millis(200 + rng.below(800)));
        cluster.start_node(node);
    }
    assert!(
        coordinator_restarted,
        "the coordinator kill landed while the job ran"
    );
    let status = cluster.wait_finished(&id, Duration::from_secs(600));
    assert!(
        status["generation"].as_u64().unwrap() >= 6,
        "the kills of nodes holding tasks forced recoveries: {status:#}"
    );
    eprintln!(
        "[cluster object store] {kills} node kills, 1 coordinator restart with an empty data \
         directory; generation {}, recoveries {}",
        status["generation"], status["recoveries"]
    );
    let lines = rows(&mut db);
    assert_eq!(lines.len(), 336_776, "every departure exactly once");
    assert_eq!(natural_keys_of_rows(&lines), 336_776, "no duplicate");
    assert_eq!(
        db.prepared(),
        Vec::<String>::new(),
        "nothing stays prepared"
    );
    // Everything that matters is on the store; the coordinator's data directory holds
    // caches only.
    let root = nop_stream_checkpoint::Location::parse(&storage)
        .unwrap()
        .open()
        .unwrap();
    for prefix in ["cluster.json", "jobs/", "registry/index/", "checkpoints/"] {
        let found = nop_stream_storage::ObjectStore::list(&root, prefix).unwrap();
        assert!(!found.is_empty(), "{prefix} on the store");
    }
    for dir in ["jobs", "checkpoints", "registry", "plugins", "savepoints"] {
        assert!(
            !cluster.path("coord").join(dir).exists(),
            "the coordinator's data directory holds {dir}"
        );
    }
    eprintln!(
        "[cluster object store] took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn natural_keys_of_rows(lines: &[String]) -> usize {
    natural_keys(lines).len()
}

/// The parts of a `postgres://user@host:port/db` URL the test needs.
mod url_parts {
    pub struct Parts {
        pub user: String,
        pub port: u16,
    }

    pub fn parse(url: &str) -> Parts {
        let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
        let (user, rest) = rest.split_once('@').expect("user@host");
        let host_port = rest.split('/').next().unwrap();
        let port = host_port
            .rsplit_once(':')
            .map_or(5432, |(_, p)| p.parse().unwrap());
        Parts {
            user: user.to_owned(),
            port,
        }
    }
}
