//! `nopstream nats publish`: publishes a text file into a NATS JetStream stream, one message
//! per line (the publisher of the JetStream examples and tests).

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `nopstream nats ...`.
#[derive(Debug, Subcommand)]
pub enum NatsCommand {
    /// Publish FILE into a JetStream stream, one message per non-empty line (line ending
    /// removed), the header line skipped unless --keep-header. Creates the stream (file
    /// storage, bound to SUBJECT) if it does not exist; waits for every acknowledgement.
    /// Prints the count and the stream sequences of the first and last message.
    Publish {
        /// Server URL, `nats://[user@]host:port` or `tls://[user@]host:port` (no
        /// password: see --password-env).
        #[arg(long)]
        url: String,
        /// With a `tls://` URL: PEM file of the certificate authorities to trust instead
        /// of the system's.
        #[arg(long, value_name = "PEM")]
        ca_file: Option<PathBuf>,
        /// Environment variable holding the password (with a user in the URL) or token.
        #[arg(long)]
        password_env: Option<String>,
        /// Stream name.
        #[arg(long)]
        stream: String,
        /// Subject to publish on.
        #[arg(long)]
        subject: String,
        /// Also publish the first line (by default it is a CSV header and skipped).
        #[arg(long)]
        keep_header: bool,
        /// Text file, or a `.zip` archive whose member --member (default: the only one)
        /// is read.
        file: PathBuf,
        /// Member of a `.zip` FILE.
        #[arg(long)]
        member: Option<String>,
    },
}

/// The lines of `file` (or of a member of a zip archive).
fn read_text(file: &Path, member: Option<&str>) -> Result<Vec<u8>> {
    let mut text = Vec::new();
    if file.extension().is_some_and(|e| e == "zip") {
        let f =
            std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        let mut z = zip::ZipArchive::new(f)
            .with_context(|| format!("{} is not a zip archive", file.display()))?;
        let name = match member {
            Some(m) => m.to_owned(),
            None if z.len() == 1 => z.by_index(0)?.name()?.into_owned(),
            None => bail!(
                "{} has {} members; name one with --member",
                file.display(),
                z.len()
            ),
        };
        z.by_name(&name)
            .with_context(|| format!("{} has no member {name}", file.display()))?
            .read_to_end(&mut text)?;
    } else {
        text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    }
    Ok(text)
}

/// Runs a `nats` subcommand.
///
/// # Errors
/// A file that cannot be read, a server that cannot be reached, a publish not acknowledged.
pub fn run(command: NatsCommand) -> Result<()> {
    match command {
        NatsCommand::Publish {
            url,
            ca_file,
            password_env,
            stream,
            subject,
            keep_header,
            file,
            member,
        } => {
            let text = read_text(&file, member.as_deref())?;
            let mut lines: Vec<Vec<u8>> = text
                .lines()
                .skip(usize::from(!keep_header))
                .map(|l| l.map(String::into_bytes))
                .collect::<std::io::Result<_>>()
                .with_context(|| format!("{} is not UTF-8 text", file.display()))?;
            lines.retain(|l| !l.is_empty());
            let started = Instant::now();
            let opts = nop_stream_nats_jetstream::PublishOptions {
                url,
                ca_file,
                password_env,
                stream: stream.clone(),
                subject: subject.clone(),
                timeout: Duration::from_secs(10),
            };
            let p = nop_stream_nats_jetstream::publish_lines(&opts, lines.into_iter())
                .map_err(anyhow::Error::msg)?;
            println!(
                "published {} messages to stream {stream} (subject {subject}): sequences {}..={} in {:.2} s",
                p.messages,
                p.first_seq,
                p.last_seq,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}
