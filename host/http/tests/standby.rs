//! A coordinator's HTTP server before and after its election is won ([`spawn_ha`]): a
//! standby redirects the API to the leader's HTTP address, answers 503 when it knows none,
//! serves its own coordinator families on `/metrics`; once the process leads, the same
//! listener serves the leader's routes.

use nop_stream_http::{LeaderHint, Role, Router, spawn_ha};
use nop_stream_metrics::{Sample, inventory as inv};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct FakeRole {
    leads: AtomicBool,
    hint: Mutex<LeaderHint>,
}

impl Role for FakeRole {
    fn leading(&self) -> Option<Router> {
        self.leads.load(Ordering::SeqCst).then(|| {
            Router::new().route(
                "/api/v1/jobs",
                axum::routing::get(|| async { "the leader's jobs" }),
            )
        })
    }

    fn leader(&self) -> LeaderHint {
        self.hint.lock().unwrap().clone()
    }

    fn samples(&self) -> Vec<Sample> {
        let leading = f64::from(u8::from(self.leads.load(Ordering::SeqCst)));
        vec![
            Sample::gauge(&inv::COORDINATOR_LEADING, Vec::new(), leading),
            Sample::gauge(&inv::COORDINATOR_TERM, Vec::new(), 7.0),
        ]
    }
}

fn get(addr: &str, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_lowercase(), body.to_owned())
}

#[test]
fn a_standby_redirects_then_serves_once_it_leads() {
    let role = Arc::new(FakeRole::default());
    let server = spawn_ha(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(&role) as Arc<dyn Role>,
    )
    .unwrap();
    let addr = server.addr.to_string();

    // No leader known: 503 with what is known, and a hint to retry.
    let (code, head, body) = get(&addr, "/api/v1/jobs");
    assert_eq!(code, 503, "{body}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["leader"], serde_json::Value::Null);

    // A leader with an HTTP address: 307 to the same path and query there.
    *role.hint.lock().unwrap() = LeaderHint {
        leader: Some("10.0.0.2:7000".into()),
        leader_http: Some("10.0.0.2:8081".into()),
        term: 7,
    };
    let (code, head, body) = get(&addr, "/api/v1/jobs/j-1/checkpoints?limit=5");
    assert_eq!(code, 307, "{body}");
    assert!(
        head.contains("location: http://10.0.0.2:8081/api/v1/jobs/j-1/checkpoints?limit=5"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["leader"], "10.0.0.2:7000");
    assert_eq!(v["term"], 7);

    // /metrics stays local on a standby: a healthy target that says it does not lead.
    let (code, _, body) = get(&addr, "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("nopstream_coordinator_leading 0"), "{body}");
    assert!(body.contains("nopstream_coordinator_term 7"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");

    // Elected: the same listener serves the leader's routes.
    role.leads.store(true, Ordering::SeqCst);
    let (code, _, body) = get(&addr, "/api/v1/jobs");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, "the leader's jobs");
}
