#!/usr/bin/env bash
# Builds Tangram's images locally, with no registry: nats-server (the pinned one), the
# scheduler, the CPU worker and the GPU worker, from the workspace's release binaries.
#
#   bash deploy/build-images.sh            # release build, then the four images
#   TANGRAM_BIN_DIR=target/debug bash deploy/build-images.sh   # use binaries built already
#
# Images (tag: the workspace version, or TANGRAM_IMAGE_TAG):
#   tangram/nats:<nats version>     static nats-server on an empty root, as nobody
#   tangram/scheduler:<tag>         empty root + the C runtime, as nobody
#   tangram/worker:<tag>            empty root + the C runtime, as root (host Docker, cgroups)
#   tangram/gpu-worker:<tag>        the sandbox base (Python) + the worker, the reference
#                                   replica and the search stand-in, as nobody
# Every image also holds the `tangram` CLI (health checks: `tangram probe`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
TAG=${TANGRAM_IMAGE_TAG:-$(awk -F'"' '/^\[workspace.package\]/{w=1} w && /^version/{print $2; exit}' Cargo.toml)}
NATS_VERSION=$(awk -F= '/^NATS_SERVER_VERSION=/{split($2,a," "); print a[1]; exit}' deploy/install-tools.sh)
BASE=${TANGRAM_SANDBOX_IMAGE:-tangram/sandbox:poly-v2}

bash deploy/install-tools.sh >/dev/null
bash deploy/build-sandbox-image.sh
bin=${TANGRAM_BIN_DIR:-}
if [ -z "$bin" ]; then
  echo "building release binaries ..."
  cargo build --release --locked --bins -q
  bin=target/release
fi
for b in tangram tangram-scheduler tangram-worker; do
  [ -x "$bin/$b" ] || { echo "$bin/$b is missing" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Copies binaries and the shared libraries they load (as ldd resolves them here) into a
# build context's root/.
stage() {
  local ctx=$1; shift
  mkdir -p "$ctx/root/usr/local/bin"
  for b in "$@"; do
    cp "$b" "$ctx/root/usr/local/bin/"
    # Debug symbols stay on the build host (a debug build's binaries shrink about fivefold).
    if command -v strip >/dev/null; then strip --strip-debug "$ctx/root/usr/local/bin/$(basename "$b")"; fi
    if ldd "$b" >/dev/null 2>&1; then
      for lib in $(ldd "$b" | awk '/=> \// {print $3} /^[ \t]*\/lib/ {print $1}'); do
        mkdir -p "$ctx/root$(dirname "$lib")"
        cp -L "$lib" "$ctx/root$lib"
      done
    fi
  done
  # A passwd and group naming nobody, and a writable /tmp.
  mkdir -p "$ctx/root/etc" "$ctx/root/tmp"
  chmod 1777 "$ctx/root/tmp"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' > "$ctx/root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$ctx/root/etc/group"
}

build() { # name dockerfile context [build args...]
  local image=$1 file=$2 ctx=$3; shift 3
  cp "deploy/images/$file" "$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q --label tangram.build=1 "$@" -t "$image" "$ctx" >/dev/null
  echo "built $image: $(( $(docker image inspect -f '{{.Size}}' "$image") / 1000000 )) MB"
}

mkdir -p "$work/nats/data"
stage "$work/nats" tools/bin/nats-server "$bin/tangram"
build "tangram/nats:$NATS_VERSION" nats.Dockerfile "$work/nats"

stage "$work/scheduler" "$bin/tangram-scheduler" "$bin/tangram"
build "tangram/scheduler:$TAG" scheduler.Dockerfile "$work/scheduler"

stage "$work/worker" "$bin/tangram-worker" "$bin/tangram"
build "tangram/worker:$TAG" worker.Dockerfile "$work/worker"

mkdir -p "$work/gpu/root/usr/local/bin" "$work/gpu/root/opt/tangram"
cp "$bin/tangram-worker" "$bin/tangram" "$work/gpu/root/usr/local/bin/"
if command -v strip >/dev/null; then strip --strip-debug "$work/gpu/root/usr/local/bin/"*; fi
cp services/reference-replica/replica.py services/search-standin/search.py "$work/gpu/root/opt/tangram/"
build "tangram/gpu-worker:$TAG" gpu-worker.Dockerfile "$work/gpu" --build-arg "BASE=$BASE"

# Earlier builds of these tags are left untagged: remove them.
docker image prune -f --filter label=tangram.build=1 >/dev/null
