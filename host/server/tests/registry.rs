//! The plugin registry and job submission over the CLI protocol: a coordinator served in
//! this process on real QUIC with the certificates `init_cluster` writes, a real client.
//! Uploads are validated and stored by sha256; damaged, truncated, oversized, non-component,
//! wrong-world and version-reusing uploads are refused with a clear error; the registry
//! survives a coordinator restart; a job naming a plugin the registry lacks is refused
//! by name.

use nop_stream_cluster::session::{CoordinatorConfig, cli_request, serve_coordinator};
use nop_stream_cluster::{
    ClusterEndpoint, Identity, InitOptions, LeaseConfig, Protocol, TransportSettings, init_cluster,
    load_credentials,
};
use nop_stream_proto::cli::{CliRequest, CliResponse, JobSubmission};
use nop_stream_server::store::sha256_hex;
use nop_stream_server::{ClusterCoordinator, ClusterOptions};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Served {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    certs: PathBuf,
}

fn serve(dir: &Path) -> Served {
    let certs = dir.join("certs");
    if !certs.join("ca.crt").exists() {
        init_cluster(&certs, &InitOptions::with_nodes(1)).unwrap();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let svc = ClusterCoordinator::start(ClusterOptions::new(
        dir.join("coord"),
        Duration::from_secs(2),
    ))
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let cfg = CoordinatorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        certs: certs.clone(),
        lease: LeaseConfig::default(),
    };
    let s2 = Arc::clone(&svc);
    rt.spawn(serve_coordinator(cfg, svc, move |c| {
        s2.set_registry(c.registry.clone());
        tx.send(c.addr).unwrap();
    }));
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Served { rt, addr, certs }
}

impl Served {
    fn call(&self, req: CliRequest) -> CliResponse {
        let admin: Identity = "cli-admin".parse().unwrap();
        self.rt
            .block_on(cli_request(self.addr, &self.certs, &admin, &req))
            .unwrap()
    }

    fn upload(&self, bytes: Vec<u8>) -> CliResponse {
        let sha256 = sha256_hex(&bytes);
        self.call(CliRequest::UploadPlugin { bytes, sha256 })
    }

    /// Sends `raw` as the whole request stream (a frame prefix and whatever follows) and
    /// returns the answer, as a broken or hostile client would.
    fn raw(&self, raw: Vec<u8>) -> CliResponse {
        let creds = load_credentials(&self.certs, &"cli-admin".parse().unwrap()).unwrap();
        self.rt.block_on(async {
            let ep = ClusterEndpoint::bind(
                "127.0.0.1:0".parse().unwrap(),
                &creds,
                &[],
                &TransportSettings::default(),
            )
            .unwrap();
            let pc = ep
                .connect(self.addr, &Identity::Coordinator, Protocol::Cli)
                .await
                .unwrap();
            let (mut send, mut recv) = pc.connection.open_bi().await.unwrap();
            send.write_all(&raw).await.unwrap();
            send.finish().unwrap();
            nop_stream_cluster::frame::read_value::<CliResponse>(&mut recv, 16 << 20)
                .await
                .unwrap()
                .expect("an answer")
        })
    }
}

fn plugin(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(nop_stream_artifacts::PLUGIN_DIR).join(format!("{name}.wasm"))).unwrap()
}

fn error_of(r: CliResponse) -> String {
    match r {
        CliResponse::Error(e) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A valid component with other bytes: a custom section appended (allowed at the end of a
/// component, ignored by the loader).
fn with_custom_section(mut bytes: Vec<u8>) -> Vec<u8> {
    let name = b"nopstream-test";
    let payload = b"other bytes, same plugin";
    let body_len = 1 + name.len() + payload.len();
    bytes.push(0); // custom section id
    bytes.push(body_len as u8); // LEB128 (< 128)
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn uploads_are_validated_stored_by_hash_and_bad_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    let source = plugin("file_source");
    let CliResponse::Plugin(entry) = s.upload(source.clone()) else {
        panic!("upload refused");
    };
    assert_eq!(entry.reference(), "file-source@0.1.0");
    assert_eq!(entry.sha256, sha256_hex(&source));
    assert_eq!(entry.size, source.len() as u64);
    assert_eq!(entry.wit, "nop:stream@0.2.2");
    assert!(
        dir.path()
            .join("coord/registry/blobs")
            .join(format!("{}.wasm", entry.sha256))
            .is_file()
    );
    // The same bytes again: accepted, nothing changes.
    assert!(matches!(s.upload(source.clone()), CliResponse::Plugin(e) if e == entry));

    // Damaged on the way: the bytes do not hash to what the client computed.
    let mut cut = source.clone();
    cut.truncate(source.len() / 2);
    let e = error_of(s.call(CliRequest::UploadPlugin {
        bytes: cut,
        sha256: entry.sha256.clone(),
    }));
    assert!(e.contains("upload damaged"), "{e}");

    // A truncated request stream: the frame claims more bytes than arrive.
    let mut frame = Vec::new();
    nop_stream_proto::codec::write_frame(
        &mut frame,
        &CliRequest::UploadPlugin {
            bytes: source.clone(),
            sha256: entry.sha256.clone(),
        },
        nop_stream_proto::cli::MAX_UPLOAD_FRAME,
    )
    .unwrap();
    frame.truncate(frame.len() - 1000);
    let e = error_of(s.raw(frame));
    assert!(
        e.contains("bad request") && e.contains("stream ended inside a frame"),
        "{e}"
    );

    // Over the size cap: refused from the length prefix, before anything is read.
    let mut prefix = ((nop_stream_proto::cli::MAX_UPLOAD_FRAME + 1) as u32)
        .to_be_bytes()
        .to_vec();
    prefix.extend_from_slice(&[0; 64]);
    let e = error_of(s.raw(prefix));
    assert!(e.contains("exceeds") && e.contains("cap"), "{e}");

    // Not a component at all, and a core module.
    let e = error_of(s.upload(b"definitely not wasm".to_vec()));
    assert!(e.contains("not a loadable WebAssembly component"), "{e}");
    let e = error_of(s.upload(b"\0asm\x01\0\0\0".to_vec()));
    assert!(e.contains("core wasm module, not a component"), "{e}");

    // A component of the wrong world.
    let e = error_of(s.upload(plugin("fault_wrong_world")));
    assert!(
        e.contains("exports none of the worlds operator, source, sink of nop:stream@0.2.2"),
        "{e}"
    );

    // The same name@version with other bytes.
    let other = with_custom_section(source.clone());
    let e = error_of(s.upload(other.clone()));
    assert!(
        e.contains("file-source@0.1.0 is already registered with sha256")
            && e.contains(&sha256_hex(&other))
            && e.contains("immutable"),
        "{e}"
    );

    let CliResponse::Plugins(list) = s.call(CliRequest::ListPlugins) else {
        panic!("no list");
    };
    assert_eq!(
        list,
        vec![entry.clone()],
        "only the valid upload is registered"
    );

    // The registry survives a restart of the coordinator.
    drop(s);
    let s = serve(dir.path());
    let CliResponse::Plugins(list) = s.call(CliRequest::ListPlugins) else {
        panic!("no list");
    };
    assert_eq!(list, vec![entry]);
}

#[test]
fn a_job_naming_a_plugin_the_registry_lacks_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    for p in ["file_source", "flights_mapper", "jsonl_sink"] {
        assert!(matches!(s.upload(plugin(p)), CliResponse::Plugin(_)));
    }
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flights/flights.toml");
    let sub = JobSubmission {
        fresh: true,
        ..JobSubmission::new(
            job.display().to_string(),
            std::fs::read_to_string(&job).unwrap(),
            job.parent().unwrap().display().to_string(),
            dir.path().join("out").display().to_string(),
        )
    };
    let e = error_of(s.call(CliRequest::SubmitJob(Box::new(sub.clone()))));
    assert!(
        e.contains("keyed-aggregate@0.1.0 is not in the cluster's registry")
            && e.contains("nopstream plugin upload"),
        "{e}"
    );
    // A plugin named by path is refused with what to do instead.
    let by_path = JobSubmission {
        text: sub.text.replace(
            "plugin = \"keyed-aggregate@0.1.0\"",
            "plugin = \"plugins/keyed_aggregate.wasm\"",
        ),
        ..sub
    };
    let e = error_of(s.call(CliRequest::SubmitJob(Box::new(by_path))));
    assert!(
        e.contains("plugins/keyed_aggregate.wasm") && e.contains("name@version"),
        "{e}"
    );
}
