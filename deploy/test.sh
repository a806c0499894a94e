#!/usr/bin/env bash
# Runs Tangram's whole test suite against a real nats-server and the real Docker daemon.
# Installs what it needs first (pinned nats-server, the sandbox image), so it works on a
# fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# Incremental caches roughly double target/ and buy nothing in a one-shot build.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The build and the test binaries took 4.5 GiB of target/ when measured (docs/RELIABILITY.md,
# "a CI build killed by a full disk"); a linker that runs out of space dies of SIGBUS, which
# reads like a compiler bug. Warn plainly first (a warning, not a stop: a smaller disk may do).
min_free_gib="${TANGRAM_MIN_FREE_GIB:-8}"
mkdir -p target
free_gib=$(df -Pk target | awk 'NR==2 {print int($4 / 1048576)}')
if [ "$free_gib" -lt "$min_free_gib" ]; then
  echo "deploy/test.sh: warning: only ${free_gib} GiB free under target/; the build and the test" >&2
  echo "  binaries need about ${min_free_gib} GiB with room to spare. A linker killed by SIGBUS below means a full disk." >&2
fi
bash deploy/install-tools.sh
bash deploy/install-prometheus.sh
bash deploy/install-registry.sh
# gVisor for the probes under runsc: a failure here (no root, no package mirror, another
# runsc already installed) fails those tests, with this script named, not the whole suite.
bash deploy/install-runsc.sh || echo "deploy/test.sh: warning: deploy/install-runsc.sh failed; the gVisor tests will fail" >&2
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
