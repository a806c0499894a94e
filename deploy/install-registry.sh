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
. "$root/deploy/pinned-deb.sh"
unpack_pinned_deb docker-registry "$REGISTRY_VERSION"
rm -rf "$dest"
mkdir -p "$dest/bin"
cp "$work/root/usr/bin/docker-registry" "$dest/bin/"
echo "$REGISTRY_VERSION" > "$stamp"
echo "docker-registry $REGISTRY_VERSION installed in $dest"
