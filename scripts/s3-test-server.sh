#!/usr/bin/env bash
# A throwaway S3-compatible server (moto, from PyPI) on loopback for the object-store
# checkpoint, registry and cluster tests.
#
#   eval "$(scripts/s3-test-server.sh start)"   # prints the exports the tests read
#   scripts/s3-test-server.sh stop "$NOP_TEST_S3_DIR"
#
# `start` installs moto[server] (pinned) into a virtualenv (cached in
# $NOP_S3_VENV, default ~/.cache/nopstream/moto-venv) if it is not there, runs
# moto_server on 127.0.0.1 at a free port with authentication on (after the first four
# requests, which create an IAM user with an access key and the bucket `nop`), and prints
# NOP_TEST_S3_URL (s3://nop?endpoint=...), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION and NOP_TEST_S3_DIR. The secret is in no command line and in no URL.
#
# moto checks If-None-Match and then writes without a lock, so two racing conditional
# creates may both succeed there: races on conditional create are tested on the local and
# in-memory backends (host/storage/tests/backends.rs), wire semantics here.
set -euo pipefail

MOTO_VERSION=5.2.6
VENV="${NOP_S3_VENV:-$HOME/.cache/nopstream/moto-venv}"

ensure_installed() {
  if [ -x "$VENV/bin/moto_server" ] && "$VENV/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    return 0
  fi
  echo "s3-test-server: installing moto[server]==$MOTO_VERSION into $VENV" >&2
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "moto[server]==$MOTO_VERSION" >&2
}

free_port() {
  python3 - <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

start() {
  ensure_installed
  local dir; dir=$(mktemp -d /tmp/nop-s3.XXXXXX)
  local port; port=$(free_port)
  INITIAL_NO_AUTH_ACTION_COUNT=4 nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" \
    >"$dir/server.log" 2>&1 &
  echo $! >"$dir/moto.pid"
  local ep="http://127.0.0.1:$port"
  for _ in $(seq 1 100); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('$ep/moto-api/', timeout=0.3)" 2>/dev/null; then break; fi
    sleep 0.1
  done
  umask 077
  "$VENV/bin/python" - "$ep" >"$dir/credentials" <<'PY'
import boto3, json, sys
ep = sys.argv[1]
anon = dict(endpoint_url=ep, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **anon)
iam.create_user(UserName="nop")
iam.put_user_policy(UserName="nop", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="nop")["AccessKey"]
boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=k["AccessKeyId"],
             aws_secret_access_key=k["SecretAccessKey"]).create_bucket(Bucket="nop")
print(k["AccessKeyId"], k["SecretAccessKey"])
PY
  local key secret; read -r key secret <"$dir/credentials"
  echo "export NOP_TEST_S3_URL='s3://nop?endpoint=$ep'"
  echo "export AWS_ACCESS_KEY_ID='$key'"
  echo "export AWS_SECRET_ACCESS_KEY='$secret'"
  echo "export AWS_REGION='us-east-1'"
  echo "export NOP_TEST_S3_DIR='$dir'"
  echo "s3-test-server: moto $MOTO_VERSION on $ep (bucket nop), files in $dir" >&2
}

stop() {
  local dir="${1:-${NOP_TEST_S3_DIR:-}}"
  [ -n "$dir" ] && [ -f "$dir/moto.pid" ] || { echo "s3-test-server: no server dir given" >&2; exit 1; }
  local pid; pid=$(cat "$dir/moto.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start | stop [dir]" >&2; exit 2 ;;
esac
