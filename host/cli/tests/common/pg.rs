//! The PostgreSQL test server and a throwaway database per test (the Postgres and
//! queue-to-postgres suites).

/// The test server: admin URL (no password) and password.
pub struct Server {
    /// `postgres://user@host:port/db` from `NOP_TEST_PG_URL`.
    pub url: String,
    /// `PGPASSWORD`.
    pub password: String,
}

/// The server `scripts/pg-test-server.sh start` exported; fails naming the variables
/// when it did not.
pub fn server() -> Server {
    let (Ok(url), Ok(password)) = (
        std::env::var("NOP_TEST_PG_URL"),
        std::env::var("PGPASSWORD"),
    ) else {
        panic!(
            "the Postgres tests need a PostgreSQL server: set NOP_TEST_PG_URL \
             (postgres://user@host:port/db) and PGPASSWORD, e.g. with \
             `eval \"$(scripts/pg-test-server.sh start)\"` (see docs/exactly-once.md, \"Postgres sink\")"
        );
    };
    Server { url, password }
}

/// A client of `url` with `password`.
pub fn connect(url: &str, password: &str) -> Result<postgres::Client, postgres::Error> {
    let mut c: postgres::Config = url.parse().expect("test URL");
    c.password(password);
    c.connect(postgres::NoTls)
}

/// A database of its own for one test or round, `nop_<tag>_<pid>` (dropped at the end,
/// its prepared transactions rolled back first).
pub struct Db {
    /// Database name.
    pub name: String,
    /// URL of the database (no password).
    pub url: String,
    /// The server it lives on.
    pub server: Server,
    /// A client connected to it.
    pub client: postgres::Client,
}

impl Db {
    /// Creates (or re-creates) the database `nop_<tag>_<pid>`.
    pub fn new(tag: &str) -> Db {
        let server = server();
        let name = format!("nop_{tag}_{}", std::process::id());
        let mut admin = connect(&server.url, &server.password)
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let base = server.url.rsplit_once('/').expect("URL with a database").0;
        let url = format!("{base}/{name}");
        let client = connect(&url, &server.password)
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
        Db {
            name,
            url,
            server,
            client,
        }
    }

    /// GIDs prepared in this database.
    pub fn prepared(&mut self) -> Vec<String> {
        self.client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Rows in `table`.
    pub fn count(&mut self, table: &str) -> i64 {
        self.client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .unwrap()
            .get(0)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        for gid in self.prepared() {
            let _ = self
                .client
                .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
        }
        if let Ok(mut admin) = connect(&self.server.url, &self.server.password) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// The table of [`per_record_departures_job`]: no key, so a row written twice stays
/// visible to a natural-key check.
pub const DEPARTURES_WITHOUT_KEY: &str = "CREATE TABLE departures (year INT, month INT, \
     day INT, carrier TEXT, flight INT, origin TEXT, sched_dep_time INT, dep_delay INT)";

/// The per-record flights job `name` into table `departures` at `url` (through
/// connection `pg`, two-phase commit; e.g. [`DEPARTURES_WITHOUT_KEY`]) at `parallelism`
/// with epochs every `interval_ms`; with `rate`, each source subtask is throttled to that
/// many records per second so that kills land mid-run.
pub fn per_record_departures_job(
    name: &str,
    url: &str,
    parallelism: u32,
    interval_ms: u64,
    rate: Option<u64>,
) -> String {
    let throttle = rate.map_or(String::new(), |r| format!(", max_records_per_second = {r}"));
    format!(
        r#"[job]
name = "{name}"
parallelism = {parallelism}
semantic = "strict-exactly-once"
checkpoint_interval_ms = {interval_ms}

[connections.pg]
kind = "postgres"
url = "{url}"
password_env = "PGPASSWORD"

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true{throttle} }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier", fields = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"] }}

[[sink]]
name = "departures"
plugin = "postgres-sink@0.1.0"
inputs = ["parse"]
connections = ["pg"]
config = {{ connection = "pg", table = "departures", columns = [
    {{ name = "year" }}, {{ name = "month" }}, {{ name = "day" }}, {{ name = "carrier" }},
    {{ name = "flight" }}, {{ name = "origin" }}, {{ name = "sched_dep_time" }},
    {{ name = "dep_delay" }},
] }}
"#
    )
}
