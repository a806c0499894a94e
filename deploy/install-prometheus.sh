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
if ! command -v apt-get >/dev/null; then
  echo "install-prometheus.sh needs apt-get (a Debian or Ubuntu host) to fetch prometheus $PROMETHEUS_VERSION" >&2
  exit 1
fi
candidate=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ "$candidate" != "$PROMETHEUS_VERSION" ] && [ "$(id -u)" = 0 ]; then
  # A fresh machine may have no package lists yet.
  apt-get update -q >/dev/null 2>&1 || true
  candidate=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
fi
if [ "$candidate" != "$PROMETHEUS_VERSION" ]; then
  echo "apt offers prometheus ${candidate:-none}, not the pinned $PROMETHEUS_VERSION;" \
    "run apt-get update, or change the pin after checking the new version" >&2
  exit 1
fi
work=$(mktemp -d)
chmod 755 "$work"   # apt downloads as its own user
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "prometheus=$PROMETHEUS_VERSION" >/dev/null)
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
rm -rf "$dest"
mkdir -p "$dest/bin"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$dest/bin/"
echo "$PROMETHEUS_VERSION" > "$stamp"
"$dest/bin/prometheus" --version | head -1
