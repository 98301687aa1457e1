//! The helpers every suite shares: the repository root, the `nopstream` binary, a finished
//! process's output, and a sink directory's committed JSONL lines.

use std::path::{Path, PathBuf};
use std::process::Output;

/// The `nopstream` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_nopstream");

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// stdout and stderr of a finished process.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Committed JSONL output lines under `out` (sorted); staging files are not output.
pub fn committed(out: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            lines.extend(
                std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    lines.sort();
    lines
}

/// Writes `text`, a job file of the example directory `example_dir` (relative to the
/// repository root), to `dir/name` with its relative paths (`host = "..."` of grants,
/// `unzip`, `sort` and `into` of prepare steps) made absolute against the example
/// directory (values starting with `$` are left to the runner), so that a test's job files live in its temporary directory, never in
/// `examples/`. Returns the path written.
pub fn job_in(dir: &Path, name: &str, example_dir: &str, text: &str) -> PathBuf {
    let base = repo().join(example_dir).canonicalize().unwrap();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut line = line.to_owned();
        for key in ["host = \"", "unzip = \"", "sort = \"", "into = \""] {
            let mut from = 0;
            while let Some(at) = line[from..].find(key) {
                let start = from + at + key.len();
                let Some(len) = line[start..].find('"') else {
                    break;
                };
                let value = &line[start..start + len];
                // `$OUTPUT` and other variables are the runner's to expand.
                if !value.is_empty() && !value.starts_with('$') && !Path::new(value).is_absolute() {
                    let abs = base.join(value).display().to_string();
                    line.replace_range(start..start + len, &abs);
                    from = start + abs.len();
                } else {
                    from = start + len;
                }
            }
        }
        out.push_str(&line);
    }
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

/// An HTTP response: status code, headers (names lower-cased) and body (de-chunked).
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl HttpResponse {
    /// The first value of header `name` (any case), or "".
    pub fn header(&self, name: &str) -> String {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}

/// `GET path` over plain HTTP/1.1 (one request per connection).
pub fn http_get(addr: &str, path: &str) -> HttpResponse {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    let mut r = HttpResponse {
        status,
        headers,
        body: String::new(),
    };
    r.body = if r
        .header("transfer-encoding")
        .eq_ignore_ascii_case("chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    r
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}
