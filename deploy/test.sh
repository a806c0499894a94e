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
cargo nextest run --locked --workspace --profile "$profile" "$@"
