//! The host side of `nop:nats/jetstream@0.1.0` (issue 13 §3): reading NATS JetStream
//! streams for source plugins, on the connections the job file grants to their node.
//!
//! - The plugin names a connection; the host holds its URL and reads the password (with a
//!   user in the URL) or token (without) from the environment variable the job file names,
//!   when it connects. Neither crosses into the component, and no message the host builds
//!   repeats them or the server's address.
//! - Only source instances get a [`NatsAccess`]; every other instance, and every
//!   connection not granted to the source node or not of kind `nats`, is refused with an
//!   error naming the connection.
//! - Reads are by stream sequence. Per instance the host keeps one ephemeral pull consumer
//!   (no acknowledgements, so reading never changes the stream) per (connection, stream,
//!   filter) and the sequence it delivers next; a `fetch` from that sequence continues
//!   it, any other start sequence replaces it by one created with
//!   `DeliverPolicy::ByStartSequence`. A consumer is also replaced after the client
//!   reconnected (a restarted server may restore it at an older position), and after any
//!   failed fetch; a fetch whose sequences do not start at the asked one and increase is
//!   read again from a new consumer. A consumer the process abandons (killed) is removed
//!   by the server after [`CONSUMER_INACTIVE`].
//! - Every call ends within a deadline (the request timeout per server round trip, plus
//!   the fetch's wait) with a `timeout` error, even when the server vanished mid-call.
//! - Limits ([`crate::Limits`]): `nats_fetch_bytes` per fetch, `nats_max_wait_ms` per
//!   fetch, `nats_connect_timeout_ms` (also the timeout of every JetStream API request).
//!   Time blocked on the server counts as host wait, not guest CPU.
//!
//! The client is `async-nats` on one tokio runtime per process ([`runtime`]), started at
//! the first use; host calls hand their future to it and block the calling task thread
//! until it completes.

use crate::bindings::nats::nop::nats::jetstream::{
    self as wjs, ErrorKind, Fetched, Message, NatsError, StreamState,
};
use crate::host::StoreData;
use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the server keeps a consumer nobody pulls from (a killed process's).
pub const CONSUMER_INACTIVE: Duration = Duration::from_secs(60);

/// A connection granted to a source (only `nats` ones can be used here).
pub type NatsGrant = crate::connection::ConnectionGrant;

/// What a source instance may reach through `nop:nats/jetstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsAccess {
    /// Connections granted to the source node (of any kind; only `nats` ones work).
    pub grants: Vec<NatsGrant>,
    /// Operator name, for messages.
    pub operator: String,
}

/// A consumer kept between fetches and the stream sequence it delivers next.
struct Cached {
    consumer: consumer::PullConsumer,
    next: u64,
    /// The client's connect count when the consumer was made.
    connects: u64,
}

/// Per-instance state of the capability (in [`StoreData`]).
#[derive(Default)]
pub(crate) struct NatsState {
    /// `None`: the instance is not a source, so it may use no connection.
    pub(crate) access: Option<NatsAccess>,
    pub(crate) fetch_bytes: u64,
    pub(crate) max_wait_ms: u64,
    pub(crate) connect_timeout_ms: u64,
    /// JetStream contexts per connection name, connected at first use.
    contexts: HashMap<String, jetstream::Context>,
    /// Consumers per (connection, stream, filter).
    consumers: HashMap<(String, String, Option<String>), Cached>,
}

impl std::fmt::Debug for NatsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsState")
            .field("access", &self.access)
            .field("connected", &self.contexts.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl NatsState {
    /// The state of an instance with `access` under `limits`.
    pub(crate) fn new(access: Option<NatsAccess>, limits: &crate::Limits) -> Self {
        NatsState {
            access,
            fetch_bytes: limits.nats_fetch_bytes,
            max_wait_ms: limits.nats_max_wait_ms,
            connect_timeout_ms: limits.nats_connect_timeout_ms,
            contexts: HashMap::new(),
            consumers: HashMap::new(),
        }
    }
}

/// The process's tokio runtime for NATS clients: one worker thread, started at first use.
///
/// # Panics
/// If the runtime cannot be built (the OS refuses a thread).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nats-io")
            .enable_all()
            .build()
            .expect("start the NATS runtime")
    })
}

/// Runs `f` on [`runtime`] and blocks the calling thread until it completes (callable from
/// any thread, inside another runtime too).
fn run<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv().expect("the NATS runtime dropped a call")
}

/// [`run`] with a deadline: a call whose server went away mid-way (a pull whose reply never
/// comes) ends with a `timeout` error naming the connection and the stream after `limit`.
fn run_bounded<F, T>(limit: Duration, connection: &str, stream: &str, f: F) -> Result<T, NatsError>
where
    F: Future<Output = Result<T, NatsError>> + Send + 'static,
    T: Send + 'static,
{
    match run(async move { tokio::time::timeout(limit, f).await }) {
        Ok(out) => out,
        Err(_) => Err(err(
            ErrorKind::Timeout,
            format!(
                "connection `{connection}`: stream `{stream}`: no answer within {} ms",
                limit.as_millis()
            ),
        )),
    }
}

fn err(kind: ErrorKind, message: String) -> NatsError {
    NatsError { kind, message }
}

/// `scheme://host:port` and the user of a `nats://[user@]host:port[/...]` URL.
pub(crate) fn split_url(url: &str) -> (String, Option<String>) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{scheme}://{host}"), Some(user.to_owned())),
        None => (format!("{scheme}://{authority}"), None),
    }
}

/// Classifies a client error by its message and rewrites it to name the connection; any
/// trace of the server address is removed.
fn classify(connection: &str, url: &str, what: &str, e: &dyn std::fmt::Display) -> NatsError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    let kind = if lower.contains("stream not found") || lower.contains("not found") {
        ErrorKind::NotFound
    } else if lower.contains("authorization") || lower.contains("authentication") {
        ErrorKind::Auth
    } else if lower.contains("timed out") || lower.contains("timeout") {
        ErrorKind::Timeout
    } else if lower.contains("no responders")
        || lower.contains("disconnect")
        || lower.contains("connection")
        || lower.contains("broken pipe")
        || lower.contains("i/o")
        || lower.contains("io error")
    {
        ErrorKind::Connect
    } else if lower.contains("exceeds maxbytes") || lower.contains("max bytes") {
        ErrorKind::Limit
    } else {
        ErrorKind::Other
    };
    let (base, _) = split_url(url);
    let host = base.split_once("://").map_or(base.as_str(), |x| x.1);
    let text = if host.is_empty() {
        text
    } else {
        text.replace(host, "<server>")
    };
    err(kind, format!("connection `{connection}`: {what}: {text}"))
}

/// Connects to `grant` (password or token from its `password_env`).
fn connect(grant: &NatsGrant, timeout: Duration) -> Result<jetstream::Context, NatsError> {
    let connection = grant.name.clone();
    let (url, user) = split_url(&grant.url);
    // The job file refuses a URL with a password; a user-info with `:` would carry one.
    if user.as_deref().is_some_and(|u| u.contains(':')) {
        return Err(err(
            ErrorKind::Refused,
            format!(
                "connection `{connection}`: the URL holds a password; name an environment \
                 variable in `password_env` instead"
            ),
        ));
    }
    let secret = grant.password().map_err(|m| err(ErrorKind::Refused, m))?;
    let mut opts = async_nats::ConnectOptions::new()
        .connection_timeout(timeout)
        .request_timeout(Some(timeout))
        .name("nop-stream");
    // `tls://`: TLS required, verified against the system's roots or, with the
    // connection's `ca_file`, against that file's certificates only.
    if grant.url.starts_with("tls://") {
        opts = opts.require_tls(true);
    }
    if grant
        .ca_pem()
        .map_err(|m| err(ErrorKind::Refused, m))?
        .is_some()
        && let Some(path) = &grant.ca_file
    {
        opts = opts.add_root_certificates(path.clone());
    }
    match (user, secret) {
        (Some(u), Some(p)) => opts = opts.user_and_password(u, p),
        (Some(u), None) => opts = opts.user_and_password(u, String::new()),
        (None, Some(t)) => opts = opts.token(t),
        (None, None) => {}
    }
    // The JetStream context spawns a task: it is made on the runtime too.
    let out = run(async move {
        let connected = tokio::time::timeout(
            timeout + Duration::from_millis(500),
            opts.connect(url.as_str()),
        )
        .await;
        connected.map(|r| {
            r.map(|client| {
                let mut js = jetstream::new(client);
                js.set_timeout(timeout);
                js
            })
        })
    });
    let js = match out {
        Err(_) => {
            return Err(err(
                ErrorKind::Timeout,
                format!(
                    "connection `{connection}`: cannot connect: no answer within {} ms (nats_connect_timeout_ms)",
                    timeout.as_millis()
                ),
            ));
        }
        Ok(Err(e)) => {
            use async_nats::ConnectErrorKind as K;
            let kind = match e.kind() {
                K::Authentication | K::AuthorizationViolation => ErrorKind::Auth,
                K::TimedOut => ErrorKind::Timeout,
                _ => ErrorKind::Connect,
            };
            // The I/O error's kind only: its text could carry the address.
            let detail = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .map(|io| format!(" ({})", io.kind()))
                .unwrap_or_default();
            return Err(err(
                kind,
                format!(
                    "connection `{connection}`: cannot connect: {}{detail}",
                    e.kind()
                ),
            ));
        }
        Ok(Ok(js)) => js,
    };
    Ok(js)
}

impl StoreData {
    /// The JetStream context of granted connection `connection`, connecting at first use.
    fn nats_context(&mut self, connection: &str) -> Result<jetstream::Context, NatsError> {
        let st = &mut self.nats;
        let Some(access) = &st.access else {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: only sources may use nop:nats/jetstream (instance {})",
                    self.label
                ),
            ));
        };
        let Some(grant) = access.grants.iter().find(|g| g.name == connection) else {
            let granted: Vec<String> = access
                .grants
                .iter()
                .map(|g| format!("`{}`", g.name))
                .collect();
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}` is not granted to source `{}`; add `connections = [\"{connection}\"]` to its [[source]] table (granted: {})",
                    access.operator,
                    if granted.is_empty() {
                        "none".into()
                    } else {
                        granted.join(", ")
                    }
                ),
            ));
        };
        if grant.kind != "nats" {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}` is of kind `{}`; nop:nats/jetstream needs kind `nats`",
                    grant.kind
                ),
            ));
        }
        if let Some(js) = st.contexts.get(connection) {
            return Ok(js.clone());
        }
        let js = connect(grant, Duration::from_millis(st.connect_timeout_ms.max(1)))?;
        st.contexts.insert(connection.to_owned(), js.clone());
        Ok(js)
    }

    fn stream_info_inner(
        &mut self,
        connection: &str,
        stream: &str,
    ) -> Result<StreamState, NatsError> {
        let js = self.nats_context(connection)?;
        let url = self.grant_url(connection);
        let name = stream.to_owned();
        let conn = connection.to_owned();
        let limit = Duration::from_millis(self.nats.connect_timeout_ms.max(1) + 1_000);
        run_bounded(limit, connection, stream, async move {
            let s = js
                .get_stream(&name)
                .await
                .map_err(|e| classify(&conn, &url, &format!("stream `{name}`"), &e))?;
            let state = &s.cached_info().state;
            Ok(StreamState {
                first_seq: state.first_sequence,
                last_seq: state.last_sequence,
                messages: state.messages,
            })
        })
    }

    fn grant_url(&self, connection: &str) -> String {
        self.nats
            .access
            .as_ref()
            .and_then(|a| a.grants.iter().find(|g| g.name == connection))
            .map(|g| g.url.clone())
            .unwrap_or_default()
    }

    fn fetch_inner(
        &mut self,
        connection: &str,
        stream: &str,
        filter: Option<String>,
        start_seq: u64,
        max_messages: u32,
        max_wait_ms: u32,
    ) -> Result<Fetched, NatsError> {
        if start_seq == 0 {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: stream `{stream}`: start-seq must be at least 1"
                ),
            ));
        }
        if filter.as_deref().is_some_and(str::is_empty) {
            return Err(err(
                ErrorKind::Refused,
                format!(
                    "connection `{connection}`: stream `{stream}`: an empty filter subject; pass none to read every subject"
                ),
            ));
        }
        let js = self.nats_context(connection)?;
        let url = self.grant_url(connection);
        let key = (connection.to_owned(), stream.to_owned(), filter.clone());
        let cached = self
            .nats
            .consumers
            .remove(&key)
            .filter(|c| c.next == start_seq);
        let wait = Duration::from_millis(u64::from(max_wait_ms).min(self.nats.max_wait_ms));
        let max_bytes = usize::try_from(self.nats.fetch_bytes).unwrap_or(usize::MAX);
        let max = usize::try_from(max_messages.max(1)).unwrap_or(1);
        let conn = connection.to_owned();
        let name = stream.to_owned();
        // Consumer creation and the pulls each may take the request timeout, the long poll
        // `wait` more.
        let limit = wait + Duration::from_millis(3 * self.nats.connect_timeout_ms.max(1) + 1_000);
        let out = run_bounded(limit, connection, stream, async move {
            let what = format!("stream `{name}`");
            let fail = |e: &dyn std::fmt::Display| classify(&conn, &url, &what, e);
            let connects = || {
                js.client()
                    .statistics()
                    .connects
                    .load(std::sync::atomic::Ordering::Relaxed)
            };
            let pull = Pull {
                js: &js,
                stream: &name,
                filter: filter.as_deref(),
                start_seq,
                max,
                max_bytes,
                wait,
                fail: &fail,
            };
            // A consumer never outlives the connection it was made on: a server that
            // restarted may have restored it at another position.
            let cached = cached.filter(|c| c.connects == connects());
            let reused = cached.is_some();
            let (mut fetched, mut consumer) = pull.run(cached.map(|c| c.consumer)).await?;
            if reused && !in_order(&fetched.messages, start_seq) {
                // Out of step all the same: read again from a fresh consumer.
                (fetched, consumer) = pull.run(None).await?;
            }
            if !in_order(&fetched.messages, start_seq) {
                return Err(err(
                    ErrorKind::Other,
                    format!(
                        "connection `{conn}`: stream `{name}`: the server delivered sequences out of order from {start_seq}"
                    ),
                ));
            }
            let next = fetched
                .messages
                .last()
                .map_or(start_seq, |m| m.stream_seq + 1);
            let connects = connects();
            Ok((
                fetched,
                Cached {
                    consumer,
                    next,
                    connects,
                },
            ))
        });
        match out {
            Ok((fetched, cached)) => {
                self.nats.consumers.insert(key, cached);
                Ok(fetched)
            }
            Err(e) => Err(e),
        }
    }
}

impl wjs::Host for StoreData {
    fn stream_info(
        &mut self,
        connection: String,
        stream: String,
    ) -> wasmtime::Result<Result<StreamState, NatsError>> {
        let started = Instant::now();
        let out = self.stream_info_inner(&connection, &stream);
        self.host_wait += started.elapsed();
        if let Err(e) = &out {
            tracing::warn!(plugin = %self.label, "{}", e.message);
        }
        Ok(out)
    }

    fn fetch(
        &mut self,
        connection: String,
        stream: String,
        filter: Option<String>,
        start_seq: u64,
        max_messages: u32,
        max_wait_ms: u32,
    ) -> wasmtime::Result<Result<Fetched, NatsError>> {
        let started = Instant::now();
        let out = self.fetch_inner(
            &connection,
            &stream,
            filter,
            start_seq,
            max_messages,
            max_wait_ms,
        );
        self.host_wait += started.elapsed();
        if let Err(e) = &out {
            tracing::warn!(plugin = %self.label, "{}", e.message);
        }
        Ok(out)
    }
}

/// Whether `messages` start at or after `start` and their sequences increase.
fn in_order(messages: &[Message], start: u64) -> bool {
    let mut next = start;
    for m in messages {
        if m.stream_seq < next {
            return false;
        }
        next = m.stream_seq + 1;
    }
    true
}

/// One fetch: what to read and how.
struct Pull<'a> {
    js: &'a jetstream::Context,
    stream: &'a str,
    filter: Option<&'a str>,
    start_seq: u64,
    max: usize,
    max_bytes: usize,
    wait: Duration,
    fail: &'a (dyn Fn(&dyn std::fmt::Display) -> NatsError + Send + Sync),
}

impl Pull<'_> {
    /// Fetches with `consumer`, or with a new one at `start_seq`; what was read and the
    /// consumer.
    async fn run(
        &self,
        consumer: Option<consumer::PullConsumer>,
    ) -> Result<(Fetched, consumer::PullConsumer), NatsError> {
        let fail = self.fail;
        let consumer = match consumer {
            Some(c) => c,
            None => {
                let s = self
                    .js
                    .get_stream(self.stream)
                    .await
                    .map_err(|e| fail(&e))?;
                s.create_consumer(consumer::pull::Config {
                    deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: self.start_seq,
                    },
                    ack_policy: consumer::AckPolicy::None,
                    filter_subject: self.filter.unwrap_or_default().to_owned(),
                    inactive_threshold: CONSUMER_INACTIVE,
                    description: Some("nop-stream jetstream source".into()),
                    ..Default::default()
                })
                .await
                .map_err(|e| fail(&e))?
            }
        };
        let mut messages = Vec::new();
        let mut pending = None;
        let batch = consumer
            .fetch()
            .max_messages(self.max)
            .max_bytes(self.max_bytes)
            .messages()
            .await
            .map_err(|e| fail(&e))?;
        drain(batch, &mut messages, &mut pending, fail).await?;
        if messages.is_empty() && !self.wait.is_zero() {
            let batch = consumer
                .batch()
                .max_messages(self.max)
                .max_bytes(self.max_bytes)
                .expires(self.wait)
                .messages()
                .await
                .map_err(|e| fail(&e))?;
            drain(batch, &mut messages, &mut pending, fail).await?;
        }
        let pending = match pending {
            Some(p) => p,
            None => consumer.get_info().await.map_err(|e| fail(&e))?.num_pending,
        };
        Ok((Fetched { messages, pending }, consumer))
    }
}

/// Appends the messages of `batch` to `messages`, keeping the server's pending count of the
/// last one in `pending`.
async fn drain(
    mut batch: consumer::pull::Batch,
    messages: &mut Vec<Message>,
    pending: &mut Option<u64>,
    fail: &(dyn Fn(&dyn std::fmt::Display) -> NatsError + Send + Sync),
) -> Result<(), NatsError> {
    while let Some(m) = batch.next().await {
        let m = m.map_err(|e| fail(&e))?;
        let info = m.info().map_err(|e| fail(&e))?;
        *pending = Some(info.pending);
        let published_ms =
            i64::try_from(info.published.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        messages.push(Message {
            stream_seq: info.stream_sequence,
            subject: m.subject.to_string(),
            payload: m.payload.to_vec(),
            published_ms,
        });
    }
    Ok(())
}

/// Counts one acknowledged publish.
fn acknowledged(out: &mut Published, a: jetstream::publish::PublishAck) {
    if out.first_seq == 0 {
        out.first_seq = a.sequence;
    }
    out.last_seq = a.sequence;
    out.messages += 1;
}

/// What [`publish_lines`] publishes.
#[derive(Clone, PartialEq, Eq)]
pub struct PublishOptions {
    /// `nats://[user@]host:port` or `tls://[user@]host:port`.
    pub url: String,
    /// PEM file of the certificate authorities to trust for a `tls://` URL; none: the
    /// system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Environment variable holding the password (with a user in the URL) or token.
    pub password_env: Option<String>,
    /// Stream name; created with file storage and `subject` if it does not exist.
    pub stream: String,
    /// Subject every message is published on.
    pub subject: String,
    /// How long connecting and each acknowledgement may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for PublishOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishOptions")
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

/// What [`publish_lines`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Messages published and acknowledged.
    pub messages: u64,
    /// Stream sequence of the first one (0 if none).
    pub first_seq: u64,
    /// Stream sequence of the last one (0 if none).
    pub last_seq: u64,
}

/// Publishes every item of `payloads` as one message on `opts.subject`, creating the
/// stream (file storage, the subject) if it does not exist, and waits for every publish
/// acknowledgement (up to 1,024 in flight).
///
/// # Errors
/// A message naming the connection URL's role (never the password): cannot connect, the
/// stream cannot be created, a publish not acknowledged.
pub fn publish_lines(
    opts: &PublishOptions,
    payloads: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> Result<Published, String> {
    let grant = NatsGrant {
        name: "publish".into(),
        kind: "nats".into(),
        url: opts.url.clone(),
        password_env: opts.password_env.clone(),
        ca_file: opts.ca_file.clone(),
    };
    let js = connect(&grant, opts.timeout).map_err(|e| e.message)?;
    let stream = opts.stream.clone();
    let subject = opts.subject.clone();
    run(async move {
        let s = js
            .get_or_create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("stream `{stream}`: cannot create or open it: {e}"))?;
        let covered = s.cached_info().config.subjects.clone();
        let mut out = Published {
            messages: 0,
            first_seq: 0,
            last_seq: 0,
        };
        let mut inflight = std::collections::VecDeque::new();
        let ack_error = |e: &dyn std::fmt::Display| {
            format!(
                "stream `{stream}`: a publish on `{subject}` was not acknowledged: {e} (the stream's subjects: {covered:?})"
            )
        };
        for p in payloads {
            let f = js
                .publish(subject.clone(), p.into())
                .await
                .map_err(|e| format!("publish on `{subject}`: {e}"))?;
            inflight.push_back(f);
            if inflight.len() >= 1024
                && let Some(f) = inflight.pop_front()
            {
                acknowledged(&mut out, f.await.map_err(|e| ack_error(&e))?);
            }
        }
        while let Some(f) = inflight.pop_front() {
            acknowledged(&mut out, f.await.map_err(|e| ack_error(&e))?);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_user_and_path() {
        assert_eq!(
            split_url("nats://alice@127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".into(), Some("alice".into()))
        );
        assert_eq!(split_url("tls://h:1/x?y"), ("tls://h:1".into(), None));
    }

    #[test]
    fn errors_name_the_connection_and_hide_the_address() {
        let e = classify(
            "q",
            "nats://10.1.2.3:4222",
            "stream `S`",
            &"request to 10.1.2.3:4222 timed out",
        );
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.starts_with("connection `q`: stream `S`: "));
        assert!(!e.message.contains("10.1.2.3"), "{}", e.message);
        let e = classify(
            "q",
            "nats://h:1",
            "stream `S`",
            &"jetstream error: stream not found (code 404, error code 10059)",
        );
        assert_eq!(e.kind, ErrorKind::NotFound);
    }

    #[test]
    fn grants_do_not_print_their_url() {
        let g = NatsGrant {
            name: "q".into(),
            kind: "nats".into(),
            url: "nats://secret-host:4222".into(),
            password_env: Some("NATS_PW".into()),
            ca_file: None,
        };
        assert!(!format!("{g:?}").contains("secret-host"));
    }
}
