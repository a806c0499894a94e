#!/usr/bin/env bash
# Installs a pinned Prometheus (server and promtool) into tools/prometheus/ from the
# distribution's package, without installing it on the system: the .deb is downloaded and
# unpacked, never configured, so no service starts and nothing outside tools/ changes.
# Idempotent: does nothing when the pinned version is already there.
#
# Used by the metrics tests (tests/tests/prometheus.rs, tests/tests/prometheus_config.rs):
# promtool checks deploy/prometheus.yml and deploy/alerts.yml, and a real server scrapes a
# test cluster.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/tools/prometheus"
PROMETHEUS_VERSION=2.42.0+ds-5+deb12u1   # Debian bookworm's package (apt-cache policy prometheus)

stamp="$dest/.tangram-version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PROMETHEUS_VERSION" ] \
  && [ -x "$dest/bin/prometheus" ] && [ -x "$dest/bin/promtool" ]; then
  echo "prometheus $PROMETHEUS_VERSION already installed"
  exit 0
fi
. "$root/deploy/pinned-deb.sh"
unpack_pinned_deb prometheus "$PROMETHEUS_VERSION"
rm -rf "$dest"
mkdir -p "$dest/bin"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$dest/bin/"
echo "$PROMETHEUS_VERSION" > "$stamp"
"$dest/bin/prometheus" --version | head -1
