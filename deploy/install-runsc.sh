#!/usr/bin/env bash
# Installs gVisor's runsc (Debian's package, pinned) and registers it with the local Docker
# daemon as the runtime "runsc", so that a worker's `[sandbox] runtime = "runsc"` runs its
# sandboxes under gVisor. Idempotent: does nothing when both are already so.
#
# The runtime is registered with `--network=none` (sandboxes have no network, and runsc's
# own network stack refuses to start in the namespace Docker gives a container with
# `network_mode = "none"`) and `--oci-seccomp` (Docker's seccomp profile applies to the
# sandboxed processes inside gVisor too: without it, unshare and keyctl succeed there). The daemon re-reads its runtimes on SIGHUP, so running containers
# are not touched.
set -euo pipefail
# Debian's gVisor, from bookworm-backports: bookworm's own (0.0~20221219) refuses statx with
# AT_NO_AUTOMOUNT, so coreutils' ls and stat fail with EINVAL on every path in a Debian 12
# image (ours among them).
RUNSC_DEB_VERSION=0.0~20240729.0-4~bpo12+2
BACKPORTS="deb http://deb.debian.org/debian bookworm-backports main"
runsc_bin=/usr/bin/runsc
config=${DOCKER_DAEMON_CONFIG:-/etc/docker/daemon.json}

has_runsc() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

if [ "$(id -u)" != 0 ]; then
  has_runsc && exit 0
  echo "install-runsc.sh: needs root (apt-get, $config, signalling dockerd)" >&2
  exit 1
fi

if [ "$(dpkg-query -W -f '${Version}' runsc 2>/dev/null || true)" != "$RUNSC_DEB_VERSION" ]; then
  if ! apt-cache madison runsc 2>/dev/null | grep -qF " $RUNSC_DEB_VERSION "; then
    grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/ ||
      echo "$BACKPORTS" > /etc/apt/sources.list.d/tangram-bookworm-backports.list
    apt-get update -qq
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "runsc=$RUNSC_DEB_VERSION" >/dev/null
  echo "runsc $RUNSC_DEB_VERSION installed"
fi

# Merges {"runtimes": {"runsc": ...}} into the daemon's configuration, keeping the rest.
mkdir -p "$(dirname "$config")"
changed=$(python3 - "$config" "$runsc_bin" <<'PY'
import json, os, sys
path, binary = sys.argv[1], sys.argv[2]
conf = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        conf = json.load(f)
want = {"path": binary, "runtimeArgs": ["--network=none", "--oci-seccomp"]}
if conf.get("runtimes", {}).get("runsc") == want:
    print("no")
else:
    conf.setdefault("runtimes", {})["runsc"] = want
    with open(path + ".tmp", "w") as f:
        json.dump(conf, f, indent=2)
    os.replace(path + ".tmp", path)
    print("yes")
PY
)

if [ "$changed" = yes ] || ! has_runsc; then
  pidfile=/var/run/docker.pid
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill -HUP "$(cat "$pidfile")"
  elif command -v systemctl >/dev/null && systemctl is-active --quiet docker 2>/dev/null; then
    systemctl reload docker
  else
    echo "install-runsc.sh: dockerd is not running; it will load runsc from $config when it starts" >&2
    exit 0
  fi
  # The reload is asynchronous: at most 20 s for the daemon to list the runtime.
  for _ in $(seq 1 100); do
    has_runsc && break
    sleep 0.2
  done
  if ! has_runsc; then
    echo "install-runsc.sh: dockerd did not load the runsc runtime from $config" >&2
    exit 1
  fi
  echo "runsc registered with the Docker daemon (runtime \"runsc\", --network=none --oci-seccomp)"
fi
