//! One small HTTP server over the job manager (design §15), the same for `nopstream run
//! --http ADDR` and the coordinator process (`--http ADDR`):
//!
//! - `GET /metrics`: every job's samples in OpenMetrics text (`nopstream_` prefix, base
//!   units; the inventory is `docs/metrics.md`);
//! - `GET /api/v1/jobs`: every job's status;
//! - `GET /api/v1/jobs/{job}`: one job with its vertices and edges;
//! - `GET /api/v1/jobs/{job}/checkpoints`: counts, summary and history, from the durable
//!   epoch log;
//! - `GET /api/v1/jobs/{job}/checkpoints/{epoch}`: one epoch's trace (its manifest);
//! - `GET /api/v1/jobs/{job}/exceptions`: failures and what recoveries recovered from.
//! - `GET /api/v1/jobs/{job}/watermarks`: each subtask's input and output watermark.
//! - `GET /api/v1/nodes`: a coordinator's nodes, their leases and liveness (404 on an
//!   embedded run).
//!
//! - `GET /` and `GET /jobs/{job}`: the job list and a job's page (HTML rendered here,
//!   complete without JavaScript: graph as SVG, checkpoint history, exceptions).
//!
//! Errors are JSON `{"error": "..."}`: 404 for an unknown job or epoch, 500 otherwise.
//!
//! On a coordinator with standbys ([`spawn_ha`]) one server answers for the process
//! whatever its role: the leader serves the routes above; a standby redirects every route
//! but `/metrics` (`307`, `Location` on the leader's HTTP address) or, when it does not
//! know the leader's HTTP address, answers `503` with the leader's cluster address and
//! term; on `/metrics` a standby serves its own coordinator families
//! (`nopstream_coordinator_leading 0`), so every replica stays a healthy scrape target.
//! The server binds to 127.0.0.1 unless given another address; it has no
//! authentication, so exposing it beyond loopback is the operator's decision.

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nop_stream_coordinator::manager::{JobManager, ManagerError, Platform};
use nop_stream_metrics::Sample;
use nop_stream_proto::cli::NodeStatus;
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

mod page;
pub use axum::Router;
pub use page::esc;

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address does not parse.
    #[error("--http {given}: not an address or port (e.g. 127.0.0.1:8081 or 8081)")]
    Address {
        /// As given.
        given: String,
    },
    /// Binding or starting failed.
    #[error("cannot serve HTTP on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// `given` as a socket address: `HOST:PORT`, or a bare port on 127.0.0.1.
///
/// # Errors
/// [`HttpError::Address`].
pub fn parse_addr(given: &str) -> Result<SocketAddr, HttpError> {
    if let Ok(port) = given.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    given.parse().map_err(|_| HttpError::Address {
        given: given.to_owned(),
    })
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
    _thread: std::thread::JoinHandle<()>,
}

/// The process-wide samples a coordinator adds to `/metrics` (its role, term, election
/// counters and node leases), next to the manager's.
pub type ProcessSamples = Arc<dyn Fn() -> Vec<Sample> + Send + Sync>;

/// The nodes a coordinator sees (`cluster status`'s answer).
pub type Nodes = Arc<dyn Fn() -> Vec<NodeStatus> + Send + Sync>;

/// What a coordinator process adds to the manager's routes.
#[derive(Clone, Default)]
pub struct Extras {
    /// Samples added to every `/metrics` answer.
    pub samples: Option<ProcessSamples>,
    /// The answer of `GET /api/v1/nodes`; without it that route answers 404 (an embedded
    /// run has no nodes).
    pub nodes: Option<Nodes>,
}

/// The routes over `manager`.
pub fn router<P: Platform>(manager: Arc<JobManager<P>>) -> Router {
    router_with(manager, Extras::default())
}

/// [`router`], with a coordinator process's [`Extras`].
pub fn router_with<P: Platform>(manager: Arc<JobManager<P>>, extras: Extras) -> Router {
    let extra = extras.samples.clone();
    let nodes = extras.nodes.clone();
    Router::new()
        .route("/", get(jobs_page::<P>))
        .route("/jobs/{job}", get(job_page::<P>))
        .route(
            "/metrics",
            get(move |State(m): State<Arc<JobManager<P>>>| metrics(m, extra.clone())),
        )
        .route(
            "/api/v1/nodes",
            get(move || {
                let nodes = nodes.clone();
                async move {
                    match nodes {
                        Some(f) => axum::Json(f()).into_response(),
                        None => json_error(
                            StatusCode::NOT_FOUND,
                            "an embedded run has no nodes (ask a coordinator)".into(),
                        ),
                    }
                }
            }),
        )
        .route("/api/v1/jobs", get(jobs::<P>))
        .route("/api/v1/jobs/{job}", get(job::<P>))
        .route("/api/v1/jobs/{job}/checkpoints", get(checkpoints::<P>))
        .route("/api/v1/jobs/{job}/checkpoints/{epoch}", get(epoch::<P>))
        .route("/api/v1/jobs/{job}/exceptions", get(exceptions::<P>))
        .route("/api/v1/jobs/{job}/watermarks", get(watermarks::<P>))
        .fallback(no_route)
        .with_state(manager)
}

/// Serves [`router`] on `addr` from a thread of its own (with a one-thread tokio runtime)
/// until the process ends.
///
/// # Errors
/// [`HttpError::Bind`].
pub fn spawn<P: Platform>(
    addr: SocketAddr,
    manager: Arc<JobManager<P>>,
) -> Result<Server, HttpError> {
    serve(addr, router(manager))
}

/// Who leads, as a standby answers it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaderHint {
    /// The leader's cluster address (QUIC; what `--cluster` and `--join` take), if known.
    pub leader: Option<String>,
    /// The leader's HTTP address, if it serves one.
    pub leader_http: Option<String>,
    /// The leader's term; 0 when unknown.
    pub term: u64,
}

/// A coordinator process's role, as its HTTP server needs it.
pub trait Role: Send + Sync + 'static {
    /// The leader's routes while this process leads (built once, e.g. with
    /// [`router_with`]); `None` while it stands by.
    fn leading(&self) -> Option<Router>;
    /// Who leads, for a standby's answers.
    fn leader(&self) -> LeaderHint;
    /// This process's own samples (the coordinator families), served on a standby's
    /// `/metrics`.
    fn samples(&self) -> Vec<Sample>;
}

/// Serves a coordinator process that may stand by (module docs) on `addr` from a thread
/// of its own until the process ends. Bound at once, before the election is won, so the
/// address can be announced.
///
/// # Errors
/// [`HttpError::Bind`].
pub fn spawn_ha(addr: SocketAddr, role: Arc<dyn Role>) -> Result<Server, HttpError> {
    let app = Router::new().fallback(move |req: axum::extract::Request| {
        let role = Arc::clone(&role);
        async move { dispatch(role, req).await }
    });
    serve(addr, app)
}

async fn dispatch(role: Arc<dyn Role>, req: axum::extract::Request) -> Response {
    use tower::ServiceExt;
    if let Some(r) = role.leading() {
        return match r.oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
    }
    let path = req.uri().path().to_owned();
    if path == "/metrics" {
        return match nop_stream_metrics::encode(role.samples()) {
            Ok(text) => (
                [(
                    header::CONTENT_TYPE,
                    nop_stream_coordinator::manager::METRICS_CONTENT_TYPE,
                )],
                text,
            )
                .into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        };
    }
    let hint = role.leader();
    match &hint.leader_http {
        Some(http) => {
            let target = match req.uri().query() {
                Some(q) => format!("http://{http}{path}?{q}"),
                None => format!("http://{http}{path}"),
            };
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, target)],
                axum::Json(serde_json::json!({
                    "error": "this coordinator is a standby",
                    "leader": hint.leader,
                    "leader_http": hint.leader_http,
                    "term": hint.term,
                })),
            )
                .into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1".to_owned())],
            axum::Json(serde_json::json!({
                "error": "this coordinator is a standby and knows no leader's HTTP address",
                "leader": hint.leader,
                "term": hint.term,
            })),
        )
            .into_response(),
    }
}

/// Serves `app` on `addr` from a thread of its own (one-thread tokio runtime).
fn serve(addr: SocketAddr, app: Router) -> Result<Server, HttpError> {
    let bind = |source| HttpError::Bind { addr, source };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(bind)?;
    let std_listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    std_listener.set_nonblocking(true).map_err(bind)?;
    let local = std_listener.local_addr().map_err(bind)?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(std_listener).map_err(bind)?
    };
    let thread = std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            if let Err(e) = rt.block_on(async move { axum::serve(listener, app).await }) {
                tracing::error!("HTTP server on {local} ended: {e}");
            }
        })
        .map_err(bind)?;
    Ok(Server {
        addr: local,
        _thread: thread,
    })
}

/// A manager call's failure as a response.
struct Failure(ManagerError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = match self.0 {
            ManagerError::NoJob { .. } | ManagerError::NoEpoch { .. } => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        json_error(status, self.0.to_string())
    }
}

/// Runs a (blocking: it reads storage) manager call off the server's thread.
async fn call<P: Platform, T: Serialize + Send + 'static>(
    m: Arc<JobManager<P>>,
    f: impl FnOnce(&JobManager<P>) -> Result<T, ManagerError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || f(&m)).await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => Failure(e).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn metrics<P: Platform>(m: Arc<JobManager<P>>, process: Option<ProcessSamples>) -> Response {
    let text = move || {
        let mut samples = m.samples()?;
        if let Some(p) = process {
            samples.extend(p());
        }
        nop_stream_metrics::encode(samples)
            .map_err(|e| ManagerError::Platform(format!("metrics: {e}")))
    };
    match tokio::task::spawn_blocking(text).await {
        Ok(Ok(text)) => (
            [(
                header::CONTENT_TYPE,
                nop_stream_coordinator::manager::METRICS_CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Ok(Err(e)) => Failure(e).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Runs a (blocking) page rendering off the server's thread.
async fn html<P: Platform>(
    m: Arc<JobManager<P>>,
    f: impl FnOnce(&JobManager<P>) -> Result<String, ManagerError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || f(&m)).await {
        Ok(Ok(page)) => axum::response::Html(page).into_response(),
        Ok(Err(e)) => Failure(e).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn jobs_page<P: Platform>(State(m): State<Arc<JobManager<P>>>) -> Response {
    html(m, |m| Ok(page::jobs_page(&m.list()?))).await
}

async fn job_page<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    html(m, move |m| {
        let view = m.view(&job)?;
        let checkpoints = m.checkpoints(&job).map_err(|e| e.to_string());
        let exceptions = m.exceptions(&job)?;
        Ok(page::job_page(
            &view,
            checkpoints.as_ref().map_err(Clone::clone),
            &exceptions,
        ))
    })
    .await
}

async fn jobs<P: Platform>(State(m): State<Arc<JobManager<P>>>) -> Response {
    call(m, |m| m.list()).await
}

async fn job<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.view(&job)).await
}

async fn watermarks<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.watermarks(&job)).await
}

async fn checkpoints<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.checkpoints(&job)).await
}

async fn epoch<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    path: Result<Path<(String, u64)>, axum::extract::rejection::PathRejection>,
) -> Response {
    match path {
        Ok(Path((job, epoch))) => call(m, move |m| m.epoch(&job, epoch)).await,
        // An epoch that is not a number: a JSON error, as every other API failure.
        Err(e) => json_error(
            StatusCode::BAD_REQUEST,
            format!("{} (an epoch is a whole number)", e.body_text()),
        ),
    }
}

/// A JSON error body, `{"error": "…"}`, with `status`.
fn json_error(status: StatusCode, error: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": error }))).into_response()
}

/// Any path no route serves: 404 with a JSON body naming it.
async fn no_route(uri: axum::http::Uri) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        format!(
            "no such path: {} (the API is under /api/v1/: jobs, jobs/JOB, \
             jobs/JOB/checkpoints[/EPOCH], jobs/JOB/exceptions, jobs/JOB/watermarks, nodes)",
            uri.path()
        ),
    )
}

async fn exceptions<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.exceptions(&job)).await
}
