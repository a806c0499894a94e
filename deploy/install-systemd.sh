#!/usr/bin/env bash
# Lays down Tangram on a bare host for systemd: binaries, unit files and configuration
# templates (never overwriting a configuration that exists). Run as root:
#
#   sudo bash deploy/install-systemd.sh                 # from target/release (cargo build --release)
#   sudo bash deploy/install-systemd.sh --bin-dir DIR   # binaries from elsewhere
#
# Then, per host (DEPLOY.md): fill in /etc/tangram/nats.conf, scheduler.toml or
# worker-<id>.toml, put the host's seeds in /etc/tangram/creds, and
#   systemctl enable --now tangram-nats | tangram-scheduler | tangram-worker@<id>
#
# Options for packaging and tests: --prefix (binaries go to PREFIX/bin, default /usr/local),
# --etc (default /etc/tangram), --units (default /etc/systemd/system), --no-user (do not
# create the `tangram` system user), --no-reload (do not run systemctl daemon-reload).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$root/target/release prefix=/usr/local etc=/etc/tangram units=/etc/systemd/system
make_user=1 reload=1
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --etc) etc=$2; shift 2 ;;
    --units) units=$2; shift 2 ;;
    --no-user) make_user=0; shift ;;
    --no-reload) reload=0; shift ;;
    *) echo "unknown option $1 (see the head of $0)" >&2; exit 64 ;;
  esac
done
nats=$root/tools/bin/nats-server
[ -x "$nats" ] || bash "$root/deploy/install-tools.sh" >/dev/null
for b in "$bin_dir/tangram" "$bin_dir/tangram-scheduler" "$bin_dir/tangram-worker" "$nats"; do
  [ -x "$b" ] || { echo "$b is missing (cargo build --release --bins, or --bin-dir)" >&2; exit 1; }
done

install -d -m 0755 "$prefix/bin" "$units"
install -m 0755 "$bin_dir/tangram" "$bin_dir/tangram-scheduler" "$bin_dir/tangram-worker" "$nats" "$prefix/bin/"
for unit in tangram-nats.service tangram-scheduler.service 'tangram-worker@.service'; do
  sed "s|@BIN@|$prefix/bin|g" "$root/deploy/systemd/$unit" > "$units/$unit"
  chmod 0644 "$units/$unit"
done

if [ "$make_user" = 1 ] && ! id tangram >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /var/lib/tangram --shell /usr/sbin/nologin tangram
fi
install -d -m 0755 "$etc"
# Seeds: the directory is traversable by the `tangram` group (the scheduler runs as
# tangram, so its seed is chowned to it); each seed stays 0600.
if id tangram >/dev/null 2>&1; then
  install -d -m 0750 -g tangram "$etc/creds"
else
  install -d -m 0700 "$etc/creds"
fi
for f in nats.conf scheduler.toml; do
  [ -e "$etc/$f" ] || install -m 0644 "$root/deploy/systemd/$f" "$etc/$f"
done
[ -e "$etc/worker.toml.example" ] || install -m 0644 "$root/deploy/systemd/worker.toml" "$etc/worker.toml.example"

if [ "$reload" = 1 ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed: $prefix/bin/{tangram,tangram-scheduler,tangram-worker,nats-server}, units in $units, configuration in $etc"
