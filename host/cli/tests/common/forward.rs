//! A TCP forwarder for cluster tests whose processes live in network namespaces: it
//! listens on an address every namespace reaches (the bridge's) and relays each
//! connection to a server that listens on loopback only (the S3 test server, PostgreSQL).
//! It stops accepting on drop.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A running forwarder.
pub struct Forward {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Forwards connections to `ip:<free port>` to `target`.
pub fn forward(ip: std::net::IpAddr, target: SocketAddr) -> Forward {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if flag.load(Ordering::SeqCst) {
                break;
            }
            let Ok(client) = conn else { continue };
            let Ok(server) = TcpStream::connect(target) else {
                continue;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pump(client, server));
            std::thread::spawn(move || pump(s2, c2));
        }
    });
    Forward { addr, stop }
}
