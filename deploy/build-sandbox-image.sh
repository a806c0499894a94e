#!/usr/bin/env bash
# Builds Tangram's default sandbox image locally: a minimal Debian root made with debootstrap,
# imported with `docker import`. No container registry is needed. Polyglot: Python 3, C and
# C++ (gcc, g++), Java (OpenJDK 17), Go, Node.js and Rust, as Debian's release packages them,
# so code in those languages runs with no custom image (about 1.6 GB).
# Go builds `go run`'s program in GOTMPDIR: /work, since /tmp is mounted noexec in a sandbox.
# Reuses the image when it already exists; pass --force to rebuild.
set -euo pipefail
IMAGE=${TANGRAM_SANDBOX_IMAGE:-tangram/sandbox:poly-v2}
SUITE=${TANGRAM_DEBIAN_SUITE:-bookworm}
# The toolchains (Debian package names); dependencies come with them.
PACKAGES=${TANGRAM_SANDBOX_PACKAGES:-python3,procps,gcc,g++,libc6-dev,make,default-jdk-headless,golang-go,nodejs,rustc}

if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "sandbox image $IMAGE present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then echo "building the sandbox image needs root (debootstrap)" >&2; exit 1; fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The Debian mirror this machine's apt already uses (override with TANGRAM_DEBIAN_MIRROR).
mirror=${TANGRAM_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '/^URIs:/ && $2 !~ /security/ && $2 ~ /debian/ {print $2; exit}')
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$2 !~ /security/ && $2 ~ /debian/ {print $2; exit}')
fi
[ -n "$mirror" ] || { echo "no Debian mirror found; set TANGRAM_DEBIAN_MIRROR" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "debootstrap $SUITE (minbase + $PACKAGES) ..."
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" "$mirror" >"$work/log" 2>&1 \
  || { tail -n 30 "$work/log" >&2; exit 1; }
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* \
       "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/locale"
mkdir -p "$work/root/work"
chmod 1777 "$work/root/work"
tar -C "$work/root" -c . | docker import \
  -c 'WORKDIR /work' -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
  -c 'ENV HOME=/work GOCACHE=/work/.cache/go-build GOPATH=/work/.cache/go GOFLAGS=-buildvcs=false GOTMPDIR=/work' \
  -c 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
echo "built $IMAGE: $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"
