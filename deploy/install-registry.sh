#!/usr/bin/env bash
# Installs a pinned container registry (Debian's docker-registry, the CNCF distribution
# server) into tools/registry/ from the distribution's package, without installing it on the
# system: the .deb is downloaded and unpacked, never configured, so no service starts and
# nothing outside tools/ changes. Idempotent: does nothing when the pinned version is there.
#
# Used by the image-pull tests (tests/tests/pulls.rs): a registry with basic auth on
# loopback, started and stopped by each test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/tools/registry"
REGISTRY_VERSION=2.8.2+ds1-1   # Debian bookworm's package (apt-cache policy docker-registry)

stamp="$dest/.tangram-version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$REGISTRY_VERSION" ] && [ -x "$dest/bin/docker-registry" ]; then
  echo "docker-registry $REGISTRY_VERSION already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-registry.sh needs apt-get (a Debian or Ubuntu host) to fetch docker-registry $REGISTRY_VERSION" >&2
  exit 1
fi
candidate=$(apt-cache policy docker-registry 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ "$candidate" != "$REGISTRY_VERSION" ] && [ "$(id -u)" = 0 ]; then
  apt-get update -q >/dev/null 2>&1 || true
  candidate=$(apt-cache policy docker-registry 2>/dev/null | awk '/Candidate:/ {print $2}')
fi
if [ "$candidate" != "$REGISTRY_VERSION" ]; then
  echo "apt offers docker-registry ${candidate:-none}, not the pinned $REGISTRY_VERSION;" \
    "run apt-get update, or change the pin after checking the new version" >&2
  exit 1
fi
work=$(mktemp -d)
chmod 755 "$work"   # apt downloads as its own user
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "docker-registry=$REGISTRY_VERSION" >/dev/null)
dpkg-deb -x "$work"/docker-registry_*.deb "$work/root"
rm -rf "$dest"
mkdir -p "$dest/bin"
cp "$work/root/usr/bin/docker-registry" "$dest/bin/"
echo "$REGISTRY_VERSION" > "$stamp"
echo "docker-registry $REGISTRY_VERSION installed in $dest"
