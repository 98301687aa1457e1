//! Components that are not what the job needs are refused when they are loaded or
//! planned, with a message naming the fault (design §16): the wrong world, a core wasm
//! module, a file that is not wasm at all. Compiled components are cached on disk.

mod common;

use common::{JobDir, Op, host, pipeline_toml, wasm};
use nop_stream_api::PluginKind;
use nop_stream_core::{PluginRef, parse_job_file, stream_graph};
use nop_stream_plugin_host::{PluginRegistry, RuntimeError};
use nop_stream_task::plugin_host;
use std::path::PathBuf;

fn registry(job_dir: PathBuf) -> PluginRegistry<'static> {
    PluginRegistry::new(
        host(),
        vec![PathBuf::from(nop_stream_artifacts::PLUGIN_DIR)],
        job_dir,
    )
}

fn path_ref(path: &str) -> PluginRef {
    PluginRef::Path {
        path: path.to_owned(),
    }
}

#[test]
fn source_component_used_as_an_operator_is_the_wrong_world() {
    let path = wasm("fault-wrong-world");
    let reg = registry(std::env::temp_dir());
    let err = reg
        .load(&path_ref(&path), PluginKind::Operator)
        .expect_err("a source component cannot serve as an operator");
    let msg = err.to_string();
    let RuntimeError::WrongWorld {
        plugin,
        expected,
        message,
    } = &err
    else {
        panic!("expected WrongWorld, got {err:?}");
    };
    assert_eq!(plugin, &path);
    assert_eq!(*expected, PluginKind::Operator);
    assert!(
        message.contains("operator-plugin"),
        "wasmtime's reason names the missing export: {message}"
    );
    assert!(
        msg.starts_with(&format!(
            "plugin `{path}` does not implement the `nop:stream/operator` world: "
        )),
        "{msg}"
    );
    // The same component loads as what it is, a source, and is then caught by its kind.
    let err = reg
        .load(&path_ref(&path), PluginKind::Source)
        .expect_err("its describe() says operator");
    let RuntimeError::DescribeMismatch { plugin, message } = &err else {
        panic!("expected DescribeMismatch, got {err:?}");
    };
    assert_eq!(plugin, &path);
    assert_eq!(
        message,
        "exports the `source` world but describe() says it is a operator"
    );
}

#[test]
fn operator_component_used_as_a_sink_is_the_wrong_world() {
    let path = wasm("fault-trap");
    let err = registry(std::env::temp_dir())
        .load(&path_ref(&path), PluginKind::Sink)
        .expect_err("an operator is not a sink");
    assert!(
        matches!(&err, RuntimeError::WrongWorld { expected: PluginKind::Sink, plugin, .. } if *plugin == path),
        "{err:?}"
    );
}

#[test]
fn wrong_world_in_a_job_is_a_diagnostic_on_the_operator_plugin_field() {
    let mut toml = pipeline_toml(
        "wrong-world",
        1,
        &[Op::new("mid", wasm("fault-wrong-world"), "{}")],
    );
    // The operator is the second node: `operator[0]`.
    toml.push('\n');
    let job = JobDir::new(&common::records(1), &toml);
    let name = job.file.display().to_string();
    let model = parse_job_file(&name, &toml).expect("the file itself is well-formed");
    let reg = registry(job.dir.path().to_owned());
    let diags = stream_graph(&model, &reg).expect_err("planning must refuse it");
    assert_eq!(diags.len(), 1, "{diags}");
    let d = &diags.0[0];
    assert_eq!(d.field, "operator[0].plugin");
    assert!(
        d.message.contains(&format!(
            "plugin `{}` does not implement the `nop:stream/operator` world",
            wasm("fault-wrong-world")
        )),
        "{d}"
    );
    assert!(diags.mentions("operator[0]"));
}

#[test]
fn core_wasm_module_is_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("core.wasm");
    // The smallest core module: magic and version 1.
    std::fs::write(&file, b"\0asm\x01\0\0\0").unwrap();
    let label = file.display().to_string();
    let err = host()
        .load(&label, &file, PluginKind::Operator)
        .expect_err("a core module is not a component");
    let RuntimeError::PluginLoad {
        plugin,
        path,
        message,
    } = &err
    else {
        panic!("expected PluginLoad, got {err:?}");
    };
    assert_eq!((plugin, path), (&label, &label));
    assert!(
        message.contains("core wasm module, not a component"),
        "{message}"
    );
    assert!(message.contains("wasm32-wasip2"), "{message}");
}

#[test]
fn garbage_file_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("garbage.wasm");
    std::fs::write(&file, b"this is not webassembly at all").unwrap();
    let err = registry(dir.path().to_owned())
        .load(&path_ref("garbage.wasm"), PluginKind::Operator)
        .expect_err("garbage");
    let msg = err.to_string();
    let RuntimeError::PluginLoad { plugin, path, .. } = &err else {
        panic!("expected PluginLoad, got {err:?}");
    };
    assert_eq!(plugin, "garbage.wasm");
    assert_eq!(path, &file.display().to_string());
    assert!(
        msg.starts_with(&format!(
            "cannot load plugin `garbage.wasm` from {}: ",
            file.display()
        )),
        "{msg}"
    );
}

#[test]
fn missing_plugin_is_refused_listing_where_it_looked() {
    let err = registry(std::env::temp_dir())
        .load(
            &PluginRef::Named {
                name: "no-such-plugin".into(),
                version: "9.9.9".into(),
            },
            PluginKind::Operator,
        )
        .expect_err("missing");
    let msg = err.to_string();
    assert!(
        matches!(err, RuntimeError::PluginNotFound { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("plugin `no-such-plugin@9.9.9` not found"),
        "{msg}"
    );
    assert!(
        msg.contains("no_such_plugin.wasm"),
        "lists every file name tried: {msg}"
    );
    assert!(msg.contains(nop_stream_artifacts::PLUGIN_DIR), "{msg}");
}

#[test]
fn second_host_takes_the_compiled_component_from_the_disk_cache() {
    let cache = tempfile::tempdir().unwrap();
    let path = nop_stream_artifacts::plugin_path("fault-error");
    let first = plugin_host(Some(cache.path().to_owned())).unwrap();
    let a = first
        .load("fault-error@0.1.0", &path, PluginKind::Operator)
        .unwrap();
    assert!(!a.cache_hit, "an empty cache cannot hit");
    let cached: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(cached.len(), 1, "one compiled component: {cached:?}");
    let name = cached[0].file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with(&a.sha256),
        "{name} is keyed by content hash"
    );

    let second = plugin_host(Some(cache.path().to_owned())).unwrap();
    let b = second
        .load("fault-error@0.1.0", &path, PluginKind::Operator)
        .unwrap();
    assert!(
        b.cache_hit,
        "the second host must reuse the compiled component"
    );
    assert_eq!(b.sha256, a.sha256);
    assert_eq!(b.info, a.info);
    assert_eq!(b.info.name, "fault-error");
}

fn named(name: &str, version: &str) -> PluginRef {
    PluginRef::Named {
        name: name.to_owned(),
        version: version.to_owned(),
    }
}

fn copy_plugin(package: &str, to: &std::path::Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(wasm(package), to).unwrap();
}

#[test]
fn versions_side_by_side_each_resolve_to_their_own_file() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("probe-v1", &dir.path().join("probe@0.1.0.wasm"));
    copy_plugin("probe-v2", &dir.path().join("probe@0.2.0.wasm"));
    let reg = PluginRegistry::new(host(), vec![dir.path().to_owned()], dir.path().to_owned());
    for version in ["0.1.0", "0.2.0"] {
        let p = reg
            .load(&named("probe", version), PluginKind::Operator)
            .unwrap();
        assert_eq!(p.info.version, version);
        assert_eq!(p.path, dir.path().join(format!("probe@{version}.wasm")));
    }
    let err = reg
        .load(&named("probe", "0.3.0"), PluginKind::Operator)
        .expect_err("no 0.3.0 on the path");
    assert!(
        matches!(err, RuntimeError::PluginNotFound { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(&format!(
            "plugin `probe@0.3.0` not found in the plugin path [{}] (looked for \
             probe@0.3.0.wasm, probe-0.3.0.wasm, probe.wasm)",
            dir.path().display()
        )),
        "{err}"
    );
}

#[test]
fn an_unversioned_file_of_another_version_is_skipped_not_taken() {
    // Regression: `name@version` used to take the first `name.wasm` on the path whatever
    // version it described, and only planning then failed.
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    copy_plugin("probe-v1", &first.join("probe.wasm"));
    copy_plugin("probe-v2", &second.join("probe.wasm"));
    let reg = PluginRegistry::new(
        host(),
        vec![first.clone(), second.clone()],
        dir.path().to_owned(),
    );
    let v2 = reg
        .load(&named("probe", "0.2.0"), PluginKind::Operator)
        .unwrap();
    assert_eq!(v2.info.version, "0.2.0");
    assert_eq!(v2.path, second.join("probe.wasm"));
    let v1 = reg
        .load(&named("probe", "0.1.0"), PluginKind::Operator)
        .unwrap();
    assert_eq!(v1.path, first.join("probe.wasm"));
    let err = reg
        .load(&named("probe", "9.9.9"), PluginKind::Operator)
        .expect_err("no 9.9.9");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "; found only probe@0.1.0 ({}), probe@0.2.0 ({});",
            first.join("probe.wasm").display(),
            second.join("probe.wasm").display()
        )),
        "{msg}"
    );
}

#[test]
fn a_bundled_plugin_at_an_unknown_version_is_not_found() {
    let err = registry(std::env::temp_dir())
        .load(&named("keyed-aggregate", "9.9.9"), PluginKind::Operator)
        .expect_err("only 0.1.0 is bundled");
    let msg = err.to_string();
    assert!(
        msg.starts_with("plugin `keyed-aggregate@9.9.9` not found in the plugin path"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "found only keyed-aggregate@0.1.0 ({})",
            wasm("keyed-aggregate")
        )),
        "{msg}"
    );
}

/// `bytes` with every `nop:stream/<interface>@<from>` name rewritten to `@<to>` (same
/// length, so the component stays valid): a component built against another WIT version.
fn with_wit_version(bytes: &[u8], from: &str, to: &str) -> (Vec<u8>, usize) {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let prefix = b"nop:stream/";
    let mut n = 0;
    let mut i = 0;
    while let Some(p) = out[i..].windows(prefix.len()).position(|w| w == prefix) {
        let start = i + p + prefix.len();
        let name_end = start
            + out[start..]
                .iter()
                .take_while(|b| b.is_ascii_lowercase() || **b == b'-')
                .count();
        let at = format!("@{from}");
        if out[name_end..].starts_with(at.as_bytes()) {
            out[name_end + 1..name_end + 1 + to.len()].copy_from_slice(to.as_bytes());
            n += 1;
        }
        i = name_end;
    }
    (out, n)
}

/// Design §16: a component built against a `nop:stream` version this host does not
/// serve (an older track, a newer track, or a newer patch of the served track) is refused
/// at load, naming both versions and the file.
#[test]
fn a_component_of_a_wit_version_the_host_does_not_serve_is_refused_naming_both() {
    let served = nop_stream_plugin_host::WIT_PACKAGE;
    assert_eq!(served, "nop:stream@0.2.2");
    let original = std::fs::read(wasm("tally-v1")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for version in ["0.1.0", "0.9.0", "0.2.9"] {
        let (bytes, n) = with_wit_version(&original, "0.2.2", version);
        assert!(n >= 2, "the component names nop:stream interfaces ({n})");
        let path = dir.path().join(format!("tally-{version}.wasm"));
        std::fs::write(&path, bytes).unwrap();
        let p = path.display().to_string();
        let r = registry(dir.path().to_owned()).load(&path_ref(&p), PluginKind::Operator);
        let err = r.expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("nop:stream@{version}")) && msg.contains(served),
            "names both versions: {msg}"
        );
        assert!(msg.contains(&p), "names the file: {msg}");
    }
}

/// `nop:stream@0.2.1` and `0.2.2` are additive: a component whose imports and exports
/// name `0.2.0` or `0.2.1` loads on this host (the linker's semver matching), describes
/// itself, and its `state-declarations` export is still found; so does the same
/// component as built.
#[test]
fn components_built_against_0_2_0_and_0_2_1_load_on_the_0_2_2_host() {
    let original = std::fs::read(wasm("opstate-probe")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut paths = vec![wasm("opstate-probe")];
    for old in ["0.2.0", "0.2.1"] {
        let (bytes, n) = with_wit_version(&original, "0.2.2", old);
        assert!(n >= 2, "the component names nop:stream interfaces ({n})");
        let path = dir.path().join(format!("probe-{old}.wasm"));
        std::fs::write(&path, bytes).unwrap();
        paths.push(path.display().to_string());
    }
    for p in paths {
        let loaded = registry(dir.path().to_owned())
            .load(&path_ref(&p), PluginKind::Operator)
            .unwrap_or_else(|e| panic!("{p}: {e}"));
        let names: Vec<_> = loaded
            .info
            .operator_states
            .iter()
            .map(|s| (s.name.as_str(), s.redistribution.to_string()))
            .collect();
        assert_eq!(
            names,
            [
                ("split", "split-registry".to_owned()),
                ("union", "union".to_owned()),
                ("broadcast", "broadcast".to_owned()),
                ("none", "none".to_owned())
            ],
            "{p}"
        );
        assert!(
            loaded
                .info
                .operator_states
                .iter()
                .all(|s| s.schema_sha256.is_some())
        );
    }
}

/// The optional `state-migration` export (design §10.6): tally v2 converts v1 counts, a plugin
/// without the export is refused naming it, and a guest error names the plugin.
#[test]
fn state_migration_runs_the_export_and_a_plugin_without_it_is_refused() {
    let reg = registry(std::env::temp_dir());
    let v2 = reg
        .load(&path_ref(&wasm("tally-v2")), PluginKind::Operator)
        .unwrap();
    let entries = vec![
        (Vec::new(), b"AA".to_vec(), postcard_u64(7)),
        (Vec::new(), b"UA".to_vec(), postcard_u64(300)),
    ];
    let out = v2
        .migrate_state("operators/tally", "count", 1, entries.clone())
        .unwrap();
    assert_eq!(
        out,
        vec![Some(postcard_str("7")), Some(postcard_str("300"))]
    );
    let err = v2
        .migrate_state("operators/tally", "count", 5, entries.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("from 5") && err.contains("migrate"), "{err}");

    let v1 = reg
        .load(&path_ref(&wasm("tally-v1")), PluginKind::Operator)
        .unwrap();
    let err = v1
        .migrate_state("operators/tally", "count", 1, entries)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("exports no `nop:stream/state-migration`") && err.contains("tally"),
        "{err}"
    );
}

/// postcard's encoding of a `u64` (LEB128 varint).
fn postcard_u64(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// postcard's encoding of a short string: its length (varint), then its bytes.
fn postcard_str(s: &str) -> Vec<u8> {
    let mut out = postcard_u64(s.len() as u64);
    out.extend_from_slice(s.as_bytes());
    out
}
