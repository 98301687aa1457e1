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
//!
//! - `GET /` and `GET /jobs/{job}`: the job list and a job's page (HTML rendered here,
//!   complete without JavaScript: graph as SVG, checkpoint history, exceptions).
//!
//! Errors are JSON `{"error": "..."}`: 404 for an unknown job or epoch, 500 otherwise.
//! The server binds to 127.0.0.1 unless given another address; it has no
//! authentication, so exposing it beyond loopback is the operator's decision.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nop_stream_coordinator::manager::{JobManager, ManagerError, Platform};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

mod page;
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

/// The routes over `manager`.
pub fn router<P: Platform>(manager: Arc<JobManager<P>>) -> Router {
    Router::new()
        .route("/", get(jobs_page::<P>))
        .route("/jobs/{job}", get(job_page::<P>))
        .route("/metrics", get(metrics::<P>))
        .route("/api/v1/jobs", get(jobs::<P>))
        .route("/api/v1/jobs/{job}", get(job::<P>))
        .route("/api/v1/jobs/{job}/checkpoints", get(checkpoints::<P>))
        .route("/api/v1/jobs/{job}/checkpoints/{epoch}", get(epoch::<P>))
        .route("/api/v1/jobs/{job}/exceptions", get(exceptions::<P>))
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
    let app = router(manager);
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
        let body = serde_json::json!({ "error": self.0.to_string() });
        (status, axum::Json(body)).into_response()
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

async fn metrics<P: Platform>(State(m): State<Arc<JobManager<P>>>) -> Response {
    match tokio::task::spawn_blocking(move || m.metrics_text()).await {
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

async fn checkpoints<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.checkpoints(&job)).await
}

async fn epoch<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path((job, epoch)): Path<(String, u64)>,
) -> Response {
    call(m, move |m| m.epoch(&job, epoch)).await
}

async fn exceptions<P: Platform>(
    State(m): State<Arc<JobManager<P>>>,
    Path(job): Path<String>,
) -> Response {
    call(m, move |m| m.exceptions(&job)).await
}
