//! Coordinator election and job records on etcd (design §14.5, "Coordinator HA"), built with
//! the `etcd` feature (the `etcd-client` crate needs `protoc` at build time).
//!
//! - **Election.** Each coordinator grants itself a lease of the election TTL, keeps it
//!   alive every TTL / 3, announces itself under `<prefix>/members/<addr>` with that lease,
//!   and campaigns on `<prefix>/leader` (etcd's v3election API). The leader key's create
//!   revision is the **term**: etcd revisions only grow, so every term is greater than
//!   every earlier one.
//! - **Leadership is held, not assumed.** A [`Leadership`] is valid until the send time of
//!   the last acknowledged keep-alive plus the TTL on this process's monotonic clock; a
//!   keep-alive answered with TTL 0 (the lease is gone), or a leader key that is no longer
//!   ours, loses it for good. A process stopped past its TTL finds its deadline passed when
//!   it runs again. Safety does not rest on that clock (etcd renews every lease to its full
//!   TTL on its own leader changes, etcd-io/etcd#9395): nodes refuse stale terms, job
//!   records are written by transactions guarded on the leader key, and checkpoints by the
//!   store's conditional creates.
//! - **Job records** ([`EtcdJobStore`]) live under `<prefix>/jobs/<job>`; the record's
//!   revision is the key's etcd version, and every write is a transaction comparing the
//!   version read and the leader key's create revision with our term.

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use nop_stream_coordinator::election::{
    Announcement, Election, ElectionError, LeaderInfo, Leadership,
};
use nop_stream_coordinator::jobs::{JobRecord, JobStore, JobStoreError, Versioned};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Settings of an etcd election.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client endpoints, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix of this cluster (one etcd can serve several), e.g. `/nopstream/prod`.
    pub prefix: String,
    /// The election lease's TTL: a leader that renews nothing for this long loses its
    /// leadership, and a standby takes over after it. Whole seconds, at least 1.
    pub ttl: Duration,
}

impl EtcdConfig {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (plain HTTP endpoints; the
    /// prefix defaults to `/nopstream`).
    ///
    /// # Errors
    /// Not an `etcd://` URL, or one without an endpoint.
    pub fn parse(url: &str, ttl: Duration) -> Result<Self, String> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("election `{url}`: expected etcd://HOST:PORT[,...][/PREFIX]"))?;
        let (hosts, prefix) = match rest.split_once('/') {
            Some((h, p)) if !p.is_empty() => (h, format!("/{}", p.trim_end_matches('/'))),
            Some((h, _)) => (h, "/nopstream".to_owned()),
            None => (rest, "/nopstream".to_owned()),
        };
        if hosts.contains('@') {
            return Err(format!(
                "election `{}`: credentials in the URL are refused",
                url.split('@').next_back().unwrap_or("")
            ));
        }
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(format!("election `{url}`: no etcd endpoint"));
        }
        Ok(EtcdConfig {
            endpoints,
            prefix,
            ttl: ttl.max(Duration::from_secs(1)),
        })
    }

    fn describe(&self) -> String {
        format!("etcd {}{}", self.endpoints.join(","), self.prefix)
    }
}

/// Counts of what etcd refused this process (shown in its log and metrics).
#[derive(Debug, Default)]
pub struct EtcdCounters {
    /// Job record writes refused by the leadership compare.
    pub fenced_writes: AtomicU64,
}

struct Inner {
    cfg: EtcdConfig,
    rt: tokio::runtime::Runtime,
    client: Client,
    /// A client without a request timeout, for the campaign (it waits for leadership).
    campaign_client: Client,
    /// The lease this process campaigns and announces itself with.
    lease: OnceLock<i64>,
    /// Send time of the last keep-alive etcd acknowledged with a TTL above 0.
    last_renewal: Mutex<Option<Instant>>,
    leadership: OnceLock<(Arc<Leadership>, Vec<u8>)>,
    counters: EtcdCounters,
}

/// An [`Election`] on etcd, and the handle its [`EtcdJobStore`] shares.
#[derive(Clone)]
pub struct EtcdElection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElection")
            .field("etcd", &self.inner.cfg.describe())
            .finish_non_exhaustive()
    }
}

impl EtcdElection {
    /// Connects to etcd (nothing is written yet).
    ///
    /// # Errors
    /// The runtime cannot start, or no endpoint answers.
    pub fn connect(cfg: EtcdConfig) -> Result<Self, ElectionError> {
        let err = |m: String| ElectionError {
            backend: cfg.describe(),
            message: m,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd")
            .enable_all()
            .build()
            .map_err(|e| err(format!("cannot start the async runtime: {e}")))?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(cfg.ttl.max(Duration::from_secs(2)));
        let client = rt
            .block_on(Client::connect(cfg.endpoints.clone(), Some(opts)))
            .map_err(|e| err(format!("cannot connect: {e}")))?;
        let campaign_client = rt
            .block_on(Client::connect(
                cfg.endpoints.clone(),
                Some(
                    ConnectOptions::new()
                        .with_connect_timeout(Duration::from_secs(2))
                        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5)),
                ),
            ))
            .map_err(|e| err(format!("cannot connect: {e}")))?;
        Ok(EtcdElection {
            inner: Arc::new(Inner {
                cfg,
                rt,
                client,
                campaign_client,
                lease: OnceLock::new(),
                last_renewal: Mutex::new(None),
                leadership: OnceLock::new(),
                counters: EtcdCounters::default(),
            }),
        })
    }

    /// What etcd refused this process.
    pub fn counters(&self) -> &EtcdCounters {
        &self.inner.counters
    }

    /// The job records of this cluster, written under this process's leadership.
    pub fn job_store(&self) -> EtcdJobStore {
        EtcdJobStore {
            election: self.clone(),
        }
    }

    fn err(&self, m: impl std::fmt::Display) -> ElectionError {
        ElectionError {
            backend: self.inner.cfg.describe(),
            message: m.to_string(),
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.inner.cfg.prefix)
    }

    /// Runs `f` on the etcd runtime from any thread (a scoped thread when called from
    /// inside another runtime, where blocking on a future is not allowed).
    fn block<T: Send>(&self, f: impl Future<Output = T> + Send) -> T {
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| self.inner.rt.block_on(f))
                    .join()
                    .expect("an etcd call panicked")
            })
        } else {
            self.inner.rt.block_on(f)
        }
    }

    /// Grants the lease, announces this member and starts the keep-alive loop, once.
    fn join(&self, addr: &str) -> Result<i64, ElectionError> {
        if let Some(l) = self.inner.lease.get() {
            return Ok(*l);
        }
        let ttl = self.inner.cfg.ttl.as_secs().max(1) as i64;
        let mut c = self.inner.client.clone();
        let member = self.key(&format!("members/{}", Announcement::decode(addr).addr));
        let addr_v = addr.to_owned();
        let id = self
            .block(async move {
                let sent = Instant::now();
                let g = c.lease_grant(ttl, None).await?;
                c.put(member, addr_v, Some(PutOptions::new().with_lease(g.id())))
                    .await?;
                Ok::<_, etcd_client::Error>((g.id(), sent))
            })
            .map_err(|e| self.err(format!("cannot grant the election lease: {e}")))?;
        *self
            .inner
            .last_renewal
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(id.1);
        let _ = self.inner.lease.set(id.0);
        let me = self.clone();
        self.inner
            .rt
            .spawn(async move { me.keep_alive(id.0).await });
        Ok(id.0)
    }

    /// Renews the lease every TTL / 3; after each renewal checks that the leader key,
    /// once won, is still ours. Loses the leadership for good when etcd says the lease is
    /// gone or the key is not ours, or when no renewal was acknowledged within the TTL.
    async fn keep_alive(self, lease: i64) {
        let ttl = self.inner.cfg.ttl;
        let every = ttl / 3;
        let mut c = self.inner.client.clone();
        let mut stream = None;
        loop {
            tokio::time::sleep(every).await;
            if stream.is_none() {
                stream = c.lease_keep_alive(lease).await.ok();
            }
            let sent = Instant::now();
            let renewed = match stream.as_mut() {
                Some((keeper, responses)) => match keeper.keep_alive().await {
                    Ok(()) => match tokio::time::timeout(every, responses.message()).await {
                        Ok(Ok(Some(r))) => Some(r.ttl() > 0),
                        _ => None,
                    },
                    Err(_) => None,
                },
                None => None,
            };
            match renewed {
                Some(true) => {
                    *self
                        .inner
                        .last_renewal
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(sent);
                    if let Some((l, key)) = self.inner.leadership.get() {
                        match c.get(key.clone(), None).await {
                            Ok(r) => match r.kvs().first() {
                                Some(kv) if kv.create_revision() as u64 == l.term => {
                                    l.renewed(sent, ttl);
                                }
                                _ => {
                                    tracing::error!(
                                        term = l.term,
                                        "the leader key is gone or not ours: leadership lost"
                                    );
                                    l.lose();
                                    return;
                                }
                            },
                            Err(e) => tracing::warn!("etcd: cannot read the leader key: {e}"),
                        }
                    }
                }
                Some(false) => {
                    tracing::error!(lease, "etcd says the election lease is gone");
                    if let Some((l, _)) = self.inner.leadership.get() {
                        l.lose();
                    }
                    return;
                }
                None => {
                    stream = None;
                    tracing::warn!(lease, "etcd: a lease renewal failed; retrying");
                    let last = *self
                        .inner
                        .last_renewal
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if last.is_none_or(|t| t.elapsed() >= ttl)
                        && let Some((l, _)) = self.inner.leadership.get()
                    {
                        tracing::error!(
                            term = l.term,
                            "no lease renewal within the TTL: leadership lost"
                        );
                        l.lose();
                        return;
                    }
                }
            }
        }
    }

    /// The term and leader key this process leads under, if it does.
    fn held(&self) -> Option<(u64, Vec<u8>)> {
        self.inner
            .leadership
            .get()
            .map(|(l, k)| (l.term, k.clone()))
    }
}

impl Election for EtcdElection {
    fn describe(&self) -> String {
        self.inner.cfg.describe()
    }

    fn campaign(&self, addr: &str) -> Result<Arc<Leadership>, ElectionError> {
        if let Some((l, _)) = self.inner.leadership.get() {
            return Ok(Arc::clone(l));
        }
        let lease = self.join(addr)?;
        // A campaign waits until every earlier candidate's key is gone, on a client without
        // a request timeout: etcd resigns a candidacy whose call is cancelled, and a new
        // call would be a new candidate with a new term.
        // A broken connection cancels the candidacy too: campaign again (a new candidate
        // key, a new term) while the lease lives.
        let won = loop {
            let mut c = self.inner.campaign_client.clone();
            let name = self.key("leader");
            let value = addr.to_owned();
            match self.block(async move { c.campaign(name, value, lease).await }) {
                Ok(won) => break won,
                Err(e) if e.to_string().contains("lease not found") => {
                    return Err(self.err(format!("campaign failed: {e}")));
                }
                Err(e) => {
                    tracing::warn!("etcd: campaign interrupted, campaigning again: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        };
        let key = won
            .leader()
            .ok_or_else(|| self.err("campaign answered without a leader key"))?;
        let term = key.rev() as u64;
        let since = self
            .inner
            .last_renewal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_else(Instant::now);
        // Valid only as long as the lease renewed last is.
        let l = Leadership::until(term, since + self.inner.cfg.ttl);
        let _ = self
            .inner
            .leadership
            .set((Arc::clone(&l), key.key().to_vec()));
        tracing::info!(term, "elected: this coordinator leads");
        Ok(l)
    }

    fn leader(&self) -> Result<Option<LeaderInfo>, ElectionError> {
        let mut c = self.inner.client.clone();
        let name = self.key("leader");
        match self.block(async move { c.leader(name).await }) {
            Ok(r) => Ok(r.kv().map(|kv| {
                let a = Announcement::decode(&String::from_utf8_lossy(kv.value()));
                LeaderInfo {
                    addr: a.addr,
                    http: a.http,
                    term: kv.create_revision() as u64,
                }
            })),
            // etcd answers "election: no leader" with an error status.
            Err(e) if e.to_string().contains("no leader") => Ok(None),
            Err(e) => Err(self.err(format!("cannot read the leader: {e}"))),
        }
    }

    fn members(&self) -> Result<Vec<String>, ElectionError> {
        let mut c = self.inner.client.clone();
        let prefix = self.key("members/");
        let r = self
            .block(async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| self.err(format!("cannot list the coordinators: {e}")))?;
        let mut out: Vec<String> = r
            .kvs()
            .iter()
            .map(|kv| Announcement::decode(&String::from_utf8_lossy(kv.value())).addr)
            .collect();
        out.sort();
        Ok(out)
    }

    fn fenced_writes(&self) -> u64 {
        self.inner.counters.fenced_writes.load(Ordering::Relaxed)
    }
}

/// Job records in etcd (design §14.5, "Coordinator HA"): each write is a transaction guarded
/// on the record's version and on this process's leadership.
#[derive(Debug, Clone)]
pub struct EtcdJobStore {
    election: EtcdElection,
}

impl EtcdJobStore {
    fn location(&self) -> String {
        format!("{}/jobs", self.election.describe())
    }

    fn job_key(&self, job: &str) -> String {
        self.election.key(&format!("jobs/{job}"))
    }

    fn decode(&self, kv: &etcd_client::KeyValue) -> Result<Versioned<JobRecord>, JobStoreError> {
        let value =
            serde_json::from_slice(kv.value()).map_err(|source| JobStoreError::Corrupt {
                location: self.location(),
                object: String::from_utf8_lossy(kv.key()).into_owned(),
                source,
            })?;
        Ok(Versioned {
            revision: kv.version() as u64,
            value,
        })
    }

    fn etcd_err(&self, e: etcd_client::Error) -> JobStoreError {
        JobStoreError::Store(nop_stream_storage::StoreError::new(
            self.location(),
            None,
            nop_stream_storage::ErrorKind::Unavailable,
            e.to_string(),
        ))
    }
}

impl JobStore for EtcdJobStore {
    fn load(&self, job: &str) -> Result<Option<Versioned<JobRecord>>, JobStoreError> {
        let mut c = self.election.inner.client.clone();
        let key = self.job_key(job);
        let r = self
            .election
            .block(async move { c.get(key, None).await })
            .map_err(|e| self.etcd_err(e))?;
        r.kvs().first().map(|kv| self.decode(kv)).transpose()
    }

    fn load_all(&self) -> Result<Vec<Versioned<JobRecord>>, JobStoreError> {
        let mut c = self.election.inner.client.clone();
        let prefix = self.job_key("");
        let r = self
            .election
            .block(async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| self.etcd_err(e))?;
        let mut kvs: Vec<&etcd_client::KeyValue> = r.kvs().iter().collect();
        kvs.sort_by_key(|kv| kv.create_revision());
        kvs.into_iter().map(|kv| self.decode(kv)).collect()
    }

    fn save(&self, record: &JobRecord, expected: u64) -> Result<u64, JobStoreError> {
        let Some((term, leader_key)) = self.election.held() else {
            return Err(JobStoreError::Fenced {
                location: self.location(),
                job: record.job.clone(),
                term: 0,
            });
        };
        let key = self.job_key(&record.job);
        let bytes = serde_json::to_vec(record).map_err(|source| JobStoreError::Corrupt {
            location: self.location(),
            object: key.clone(),
            source,
        })?;
        let txn = Txn::new()
            .when([
                Compare::version(key.clone(), CompareOp::Equal, expected as i64),
                Compare::create_revision(leader_key.clone(), CompareOp::Equal, term as i64),
            ])
            .and_then([TxnOp::put(key.clone(), bytes, None)]);
        let mut c = self.election.inner.client.clone();
        let lk = leader_key.clone();
        let (ok, leader_rev) = self
            .election
            .block(async move {
                let t = c.txn(txn).await?;
                if t.succeeded() {
                    return Ok((true, 0));
                }
                let l = c.get(lk, None).await?;
                Ok::<_, etcd_client::Error>((
                    false,
                    l.kvs().first().map_or(0, |kv| kv.create_revision()),
                ))
            })
            .map_err(|e| self.etcd_err(e))?;
        if ok {
            return Ok(expected + 1);
        }
        if leader_rev as u64 != term {
            self.election
                .inner
                .counters
                .fenced_writes
                .fetch_add(1, Ordering::SeqCst);
            tracing::error!(job = %record.job, term, "etcd refused a job record write: this coordinator no longer leads");
            return Err(JobStoreError::Fenced {
                location: self.location(),
                job: record.job.clone(),
                term,
            });
        }
        Err(JobStoreError::Conflict {
            location: self.location(),
            job: record.job.clone(),
            expected,
        })
    }
}
