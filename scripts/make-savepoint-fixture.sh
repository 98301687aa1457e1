#!/usr/bin/env bash
# Writes a savepoint fixture of the current on-disk format (design §10.4): the
# per-carrier flights job at p=2 with 50 ms epochs, killed by a failpoint right after its
# second durable epoch, that epoch promoted to a savepoint, plus the job file it was taken
# with. host/cli/tests/savepoint.rs restores every fixture under
# host/cli/tests/fixtures/savepoints with the current host; each later change of the
# manifest or segment format adds a fixture of its own (never regenerate an old one).
#
#   scripts/make-savepoint-fixture.sh NAME [JOB [P]]   # e.g. state-v2-meta-v1
#
# JOB (default examples/flights/flights.toml) must live in examples/flights (its grants
# are relative to it); P (default 3) is the parallelism the test restores the fixture at,
# kept in the fixture's `parallelism` file when it is not 3.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/make-savepoint-fixture.sh NAME [JOB [P]]}
src_job=${2:-examples/flights/flights.toml}
restore_p=${3:-3}
dest=host/cli/tests/fixtures/savepoints/$name
[ -e "$dest" ] && { echo "$dest exists; fixtures are never regenerated" >&2; exit 1; }
# The binary of the test build (`cargo test --workspace --no-run`, same features as the
# tests, so wasmtime is not compiled twice); $NOPSTREAM overrides it.
bin=${NOPSTREAM:-target/debug/nopstream}
[ -x "$bin" ] || cargo test -q --workspace --no-run
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
job=examples/flights/.fixture-$$.toml
cp "$src_job" "$job"
trap 'rm -rf "$tmp" "$job"' EXIT
if NOPSTREAM_FAILPOINTS=after-manifest-publish=2 "$bin" run --no-progress --no-echo -p 2 \
  --checkpoint-interval-ms 50 --output "$tmp/out" --work-dir "$tmp/work" "$job"; then
  echo "the failpoint did not fire" >&2; exit 1
fi
"$bin" savepoint promote "$job" --work-dir "$tmp/work" --out "$tmp/sp"
mkdir -p "$dest"
cp -r "$tmp/sp/manifests" "$tmp/sp/segments" "$dest/"
# Paths of this machine are left out of savepoint.json.
sed -e "s#\"source\": \".*\"#\"source\": \"fixture\"#" -e "s#\"dir\": \".*\"#\"dir\": \"\"#" \
  "$tmp/sp/savepoint.json" > "$dest/savepoint.json"
cp "$src_job" "$dest/job.toml"
[ "$restore_p" = 3 ] || echo "$restore_p" > "$dest/parallelism"
echo "wrote $dest"
