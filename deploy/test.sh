#!/usr/bin/env bash
# Runs Tangram's whole test suite against a real nats-server and the real Docker daemon.
# Installs what it needs first (pinned nats-server, the sandbox image), so it works on a
# fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-tools.sh
bash deploy/install-prometheus.sh
bash deploy/install-registry.sh
bash deploy/build-sandbox-image.sh
cargo build --locked --bins
profile=default
[ -n "${CI:-}" ] && profile=ci
# The suite ends by checking that it left nothing running (deploy/leftovers.sh).
before=$(mktemp)
trap 'rm -f "$before" "$before.all"' EXIT
bash deploy/leftovers.sh snapshot "$before"
rc=0
cargo nextest run --locked --workspace --profile "$profile" "$@" || rc=$?
if ! bash deploy/leftovers.sh check "$before"; then
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
