//! Every `nopstream` command the README and the guides in `docs/` show parses against this
//! binary's command line: a renamed flag or subcommand fails here, not in a reader's shell.
//!
//! Commands are taken from ```sh blocks (lines, or parts of lines split at `;`, `&&`, `&`
//! and `|`, that start with `nopstream` or `cargo run -p nop-stream-cli --`) and from the
//! first column of the command table in `docs/commands.md`. Documentation notation is
//! read as such: `[...]` is optional and dropped, `a|b` takes `a`, `ADDR`, `N`, `MS` and
//! `$i` stand for a value; `--cluster` and `--certs` may come from the environment
//! (`NOPSTREAM_CLUSTER`, `NOPSTREAM_CERTS`), as the guides set them.

use crate::Cli;
use clap::Parser;
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
}

/// The documents checked: the README and every guide but the design.
fn documents() -> Vec<(String, String)> {
    let mut docs = vec![(
        "README.md".to_owned(),
        std::fs::read_to_string(repo().join("README.md")).unwrap(),
    )];
    let mut guides: Vec<_> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.ends_with("design.md"))
        .collect();
    guides.sort();
    for g in guides {
        let name = format!("docs/{}", g.file_name().unwrap().to_string_lossy());
        docs.push((name, std::fs::read_to_string(&g).unwrap()));
    }
    docs
}

/// The shell lines of a document's ```sh blocks, continuation lines joined.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = strip_comment(line);
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(&line);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// `line` without a `#` comment (a `#` that starts a word, outside quotes).
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return line[..i].to_owned(),
            _ => {}
        }
        prev = c;
    }
    line.to_owned()
}

/// The `nopstream` invocations of one shell line, as argument lists.
fn invocations(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for part in commands(line) {
        let words = words(&part);
        let mut words = words.as_slice();
        // `for i in 1 2 3; do nopstream ... & done`: the command follows `do`.
        if words.first().is_some_and(|w| w == "do") {
            words = &words[1..];
        }
        let args = match words {
            [first, rest @ ..] if first == "nopstream" => rest,
            [c, r, p, cli, dash, rest @ ..]
                if c == "cargo"
                    && r == "run"
                    && p == "-p"
                    && cli == "nop-stream-cli"
                    && dash == "--" =>
            {
                rest
            }
            _ => continue,
        };
        out.push(args.to_vec());
    }
    out
}

/// The commands of a shell line: its parts between `&`, `;` and `|` outside quotes.
fn commands(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '&' | ';' | '|') => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        out.last_mut().unwrap().push(c);
    }
    out
}

/// Shell words, quotes removed; `[...]` (optional parts) dropped.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    let mut depth = 0u32;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, '[') if cur.is_empty() || depth > 0 => depth += 1,
            (None, ']') if depth > 0 => depth -= 1,
            _ if depth > 0 => {}
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() || any {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() || any {
        out.push(cur);
    }
    out
}

/// The commands of `docs/commands.md`'s table: its first column, `a\|b` read as `a`.
fn table_commands(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `nopstream "))
        .map(|l| {
            let cmd = l.split('`').next().unwrap();
            let cmd = cmd.replace("\\|", "|");
            // `--kind operator|source|sink`: the first alternative.
            cmd.split(' ')
                .map(|w| w.split('|').next().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .map(|c| format!("nopstream {c}"))
        .collect()
}

/// A value for a placeholder the docs write in capitals or as a shell variable.
fn example_value(word: &str) -> &str {
    match word {
        "ADDR" => "127.0.0.1:7400",
        "N" | "$i" => "2",
        "MS" => "1000",
        w => w,
    }
}

fn parse(args: &[String]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once("nopstream").chain(args.iter().map(|a| example_value(a)));
    Cli::try_parse_from(argv)
}

fn check(doc: &str, shown: &str, args: &[String], problems: &mut Vec<String>) {
    let mut parsed = parse(args);
    // The guides export NOPSTREAM_CLUSTER and NOPSTREAM_CERTS instead of repeating
    // `--cluster` and `--certs`: a command that needs them is read with them.
    if parsed
        .as_ref()
        .is_err_and(|e| e.kind() == clap::error::ErrorKind::MissingRequiredArgument)
    {
        let mut with_env = args.to_vec();
        for (flag, value) in [("--cluster", "127.0.0.1:7400"), ("--certs", "certs")] {
            if !args.iter().any(|a| a == flag) {
                with_env.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        parsed = parse(&with_env);
    }
    if let Err(e) = parsed {
        let first = e.to_string();
        let first = first.lines().next().unwrap_or_default().to_owned();
        problems.push(format!("{doc}: `{shown}`: {first}"));
    }
}

#[test]
fn every_command_the_docs_show_parses() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (doc, text) in documents() {
        for line in shell_lines(&text) {
            for args in invocations(&line) {
                check(&doc, line.trim(), &args, &mut problems);
                checked += 1;
            }
        }
        if doc == "docs/commands.md" {
            for cmd in table_commands(&text) {
                let args = invocations(&cmd).pop().unwrap();
                check(&doc, &cmd, &args, &mut problems);
                checked += 1;
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The README's first command and the cluster guide's are among them.
    assert!(checked > 40, "only {checked} commands found");
}

#[test]
fn the_readers_notation_is_read_as_such() {
    assert_eq!(
        invocations("nopstream run JOB --from-savepoint $PWD/sp [--actions A.toml]   "),
        vec![vec!["run", "JOB", "--from-savepoint", "$PWD/sp"]]
    );
    assert_eq!(
        invocations("for i in 1 2 3; do nopstream node --id $i & done"),
        vec![vec!["node", "--id", "$i"]]
    );
    assert_eq!(
        invocations("nopstream node --storage 's3://b/p?endpoint=E&region=R' & done"),
        vec![vec!["node", "--storage", "s3://b/p?endpoint=E&region=R"]]
    );
    assert_eq!(
        strip_comment("nopstream x 'a # b' # note"),
        "nopstream x 'a # b' "
    );
    assert_eq!(
        shell_lines("```sh\nnopstream a \\\n  --b c\n```\n"),
        vec!["nopstream a    --b c"]
    );
}
