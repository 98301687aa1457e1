//! The S3 backend: an S3-compatible object store through the `object_store` crate, driven
//! from synchronous callers on one process-wide tokio runtime (two worker threads).
//!
//! - `put_if_absent` is `PutMode::Create` (`If-None-Match: *`); an `AlreadyExists` (HTTP
//!   412 or 304) reads the object and returns its bytes.
//! - Credentials: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` and the
//!   rest of `object_store`'s `AmazonS3Builder::from_env`; never from a URL.
//! - Requests time out after [`REQUEST_TIMEOUT`] and are retried up to [`MAX_RETRIES`]
//!   times within [`RETRY_TIMEOUT`] (connect timeout [`CONNECT_TIMEOUT`]); an endpoint
//!   that cannot be reached fails within about that, naming the location.
//! - Writers upload parts of [`PART_BYTES`] once an object outgrows one part.
//! - HTTPS uses rustls with the process's default crypto provider: ring, the project's
//!   one provider, which [`S3Store::open`] installs as the default if none is.

use crate::{Created, ErrorKind, ObjectMeta, ObjectStore, ObjectWriter, Result, StoreError};
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{
    ClientOptions, ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Timeout of one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of a connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a failed request (transient errors only).
pub const MAX_RETRIES: usize = 3;
/// Time within which retries may run.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(20);
/// Size of one part of a multipart upload (S3's minimum is 5 MiB).
pub const PART_BYTES: usize = 8 << 20;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nopstream-s3")
            .enable_all()
            .build()
            .expect("the storage runtime starts")
    })
}

/// Runs `f` on the storage runtime and waits for it, from any thread (also one of another
/// tokio runtime: the future runs on this one's workers, never on the caller's).
fn block<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .expect("the storage runtime finishes what it is given")
}

/// An S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Store {
    s3: Arc<AmazonS3>,
    /// `s3://bucket`.
    bucket: String,
    /// `?endpoint=...` when not the environment's default, or empty.
    endpoint: String,
    /// `s3://bucket[?endpoint=...]`, for messages.
    label: String,
}

impl S3Store {
    /// The bucket `bucket` at `endpoint` (default: the environment's, or AWS) in `region`
    /// (default: the environment's, or `us-east-1`), with credentials from the environment.
    ///
    /// # Errors
    /// A configuration the `object_store` crate refuses ([`ErrorKind::Invalid`]).
    pub fn open(bucket: &str, endpoint: Option<&str>, region: Option<&str>) -> Result<Self> {
        // reqwest's client takes the process default; an already installed one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT),
            )
            .with_retry(RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
                ..RetryConfig::default()
            });
        let endpoint = endpoint
            .map(str::to_owned)
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT").ok());
        if let Some(e) = &endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        let endpoint = endpoint
            .map(|e| format!("?endpoint={e}"))
            .unwrap_or_default();
        let label = format!("s3://{bucket}{endpoint}");
        if let Some(r) = region {
            b = b.with_region(r);
        }
        let s3 = b.build().map_err(|e| {
            StoreError::new(&label, None, ErrorKind::Invalid, scrub(&e.to_string()))
        })?;
        Ok(S3Store {
            s3: Arc::new(s3),
            bucket: format!("s3://{bucket}"),
            endpoint,
            label,
        })
    }

    /// Lists `prefix` once, so that a missing bucket, refused credentials or an
    /// unreachable endpoint fail now.
    ///
    /// # Errors
    /// [`ErrorKind::NoSuchBucket`], [`ErrorKind::PermissionDenied`],
    /// [`ErrorKind::Unreachable`], or another failure, naming the location.
    pub fn probe(&self, prefix: &str) -> Result<()> {
        let s3 = Arc::clone(&self.s3);
        let p = ObjPath::from(prefix);
        block(async move { s3.list_with_delimiter(Some(&p)).await.map(|_| ()) }).map_err(|e| {
            let mut e = self.err(None, &e, false);
            e.location = self.describe_prefix(prefix);
            e
        })
    }

    /// Maps an `object_store` error; `write` marks a write, whose transport failures leave
    /// its outcome unknown.
    fn err(&self, name: Option<&str>, e: &object_store::Error, write: bool) -> StoreError {
        let text = scrub(&e.to_string());
        let lower = text.to_lowercase();
        let kind = match e {
            object_store::Error::NotFound { .. } if lower.contains("nosuchbucket") => {
                ErrorKind::NoSuchBucket
            }
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => ErrorKind::PermissionDenied,
            _ if lower.contains("nosuchbucket") || lower.contains("bucket does not exist") => {
                ErrorKind::NoSuchBucket
            }
            _ if lower.contains("invalidaccesskeyid")
                || lower.contains("signaturedoesnotmatch")
                || lower.contains("accessdenied")
                || lower.contains("403 forbidden") =>
            {
                ErrorKind::PermissionDenied
            }
            _ if lower.contains("connection refused")
                || lower.contains("dns error")
                || lower.contains("error trying to connect")
                || lower.contains("client error (connect)")
                || (!write && lower.contains("error sending request")) =>
            {
                ErrorKind::Unreachable
            }
            _ if lower.contains("503") || lower.contains("slow down") || lower.contains("409") => {
                if write {
                    ErrorKind::OutcomeUnknown
                } else {
                    ErrorKind::Unavailable
                }
            }
            _ if write => ErrorKind::OutcomeUnknown,
            _ => ErrorKind::Other,
        };
        let message = match kind {
            ErrorKind::NoSuchBucket => format!("the bucket does not exist ({text})"),
            ErrorKind::PermissionDenied => format!(
                "the credentials were refused or lack permission (they come from \
                 AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) ({text})"
            ),
            ErrorKind::Unreachable => format!("the endpoint cannot be reached ({text})"),
            _ => text,
        };
        StoreError::new(&self.label, name, kind, message)
    }

    fn path(&self, name: &str) -> Result<ObjPath> {
        crate::check_name(&self.label, name)?;
        ObjPath::parse(name).map_err(|e| {
            StoreError::new(&self.label, Some(name), ErrorKind::Invalid, e.to_string())
        })
    }

    fn get_opts_range(&self, name: &str, range: Option<std::ops::Range<u64>>) -> Result<Vec<u8>> {
        let p = self.path(name)?;
        let s3 = Arc::clone(&self.s3);
        block(async move {
            match range {
                Some(r) => s3.get_range(&p, r).await.map(|b| b.to_vec()),
                None => match s3.get(&p).await {
                    Ok(g) => g.bytes().await.map(|b| b.to_vec()),
                    Err(e) => Err(e),
                },
            }
        })
        .map_err(|e| self.err(Some(name), &e, false))
    }
}

/// An `object_store` message with anything that looks like a signature or key removed
/// (they carry none today; this keeps it so), and an S3 XML error body cut down to its
/// code.
fn scrub(text: &str) -> String {
    let mut out = text.to_owned();
    if let Some(xml) = out.find("<?xml") {
        let code = out[xml..]
            .split_once("<Code>")
            .and_then(|(_, r)| r.split_once("</Code>"))
            .map(|(c, _)| c.to_owned());
        out.truncate(xml);
        if let Some(c) = code {
            out.push_str(&format!("S3 error {c}"));
        }
    }
    for var in [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ] {
        if let Ok(v) = std::env::var(var)
            && v.len() >= 4
        {
            out = out.replace(&v, "***");
        }
    }
    out
}

impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        self.label.clone()
    }

    fn describe_prefix(&self, prefix: &str) -> String {
        if prefix.is_empty() {
            self.label.clone()
        } else {
            format!("{}/{prefix}{}", self.bucket, self.endpoint)
        }
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.get_opts_range(name, None)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len);
        if len == 0 {
            return Ok(Vec::new());
        }
        let bytes = self
            .get_opts_range(name, Some(offset..end))
            .map_err(|e| match e.kind {
                // A range that starts past the end is refused (HTTP 416).
                ErrorKind::Other if e.message.to_lowercase().contains("range") => StoreError {
                    kind: ErrorKind::ShortRead,
                    ..e
                },
                _ => e,
            })?;
        if bytes.len() as u64 != len {
            return Err(StoreError::new(
                &self.label,
                Some(name),
                ErrorKind::ShortRead,
                format!(
                    "{} bytes returned for bytes {offset}..{end}: the object is shorter",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let p = self.path(name)?;
        let s3 = Arc::clone(&self.s3);
        let payload = PutPayload::from(bytes.to_vec());
        block(async move { s3.put(&p, payload).await.map(|_| ()) })
            .map_err(|e| self.err(Some(name), &e, true))
    }

    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> Result<Created> {
        let p = self.path(name)?;
        let s3 = Arc::clone(&self.s3);
        let payload = PutPayload::from(bytes.to_vec());
        let r = block(async move {
            s3.put_opts(&p, payload, PutOptions::from(PutMode::Create))
                .await
                .map(|_| ())
        });
        match r {
            Ok(()) => Ok(Created::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists(self.get(name)?)),
            Err(e) => Err(self.err(Some(name), &e, true)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let s3 = Arc::clone(&self.s3);
        // `object_store` lists by path segments; list the directory the prefix lies in
        // and keep the names that start with the whole prefix.
        let dir = match prefix.rfind('/') {
            Some(i) => prefix[..i].to_owned(),
            None => String::new(),
        };
        let want = prefix.to_owned();
        let mut out = block(async move {
            let p = ObjPath::from(dir.as_str());
            let mut stream = s3.list(if dir.is_empty() { None } else { Some(&p) });
            let mut out = Vec::new();
            while let Some(m) = stream.next().await {
                let m = m?;
                let name = m.location.to_string();
                if name.starts_with(&want) {
                    out.push(ObjectMeta { name, size: m.size });
                }
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| self.err(Some(prefix), &e, false))?;
        out.sort();
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let p = self.path(name)?;
        let s3 = Arc::clone(&self.s3);
        match block(async move { s3.delete(&p).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(Some(name), &e, true)),
        }
    }

    fn writer<'a>(&'a self, name: &str) -> Result<Box<dyn ObjectWriter + 'a>> {
        let path = self.path(name)?;
        Ok(Box::new(S3Writer {
            store: self,
            name: name.to_owned(),
            path,
            buf: Vec::new(),
            upload: None,
        }))
    }
}

/// [`S3Store`]'s writer: one `put` for an object of at most one part, a multipart upload
/// for a larger one (aborted if the writer is dropped unfinished).
struct S3Writer<'a> {
    store: &'a S3Store,
    name: String,
    path: ObjPath,
    buf: Vec<u8>,
    upload: Option<Box<dyn object_store::MultipartUpload>>,
}

impl S3Writer<'_> {
    fn send_part(&mut self, part: Vec<u8>) -> Result<()> {
        if self.upload.is_none() {
            let s3 = Arc::clone(&self.store.s3);
            let p = self.path.clone();
            let up = block(async move { s3.put_multipart(&p).await })
                .map_err(|e| self.store.err(Some(&self.name), &e, true))?;
            self.upload = Some(up);
        }
        let up = self.upload.as_mut().expect("started above");
        let fut = up.put_part(PutPayload::from(part));
        block(fut).map_err(|e| self.store.err(Some(&self.name), &e, true))
    }
}

impl ObjectWriter for S3Writer<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(bytes);
        while self.buf.len() >= PART_BYTES {
            let rest = self.buf.split_off(PART_BYTES);
            let part = std::mem::replace(&mut self.buf, rest);
            self.send_part(part)?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        if self.upload.is_none() {
            let bytes = std::mem::take(&mut self.buf);
            return self.store.put(&self.name, &bytes);
        }
        if !self.buf.is_empty() {
            let part = std::mem::take(&mut self.buf);
            self.send_part(part)?;
        }
        let mut up = self.upload.take().expect("started");
        block(async move { up.complete().await.map(|_| ()) })
            .map_err(|e| self.store.err(Some(&self.name), &e, true))
    }
}

impl Drop for S3Writer<'_> {
    fn drop(&mut self) {
        if let Some(mut up) = self.upload.take() {
            runtime().spawn(async move {
                let _ = up.abort().await;
            });
        }
    }
}
