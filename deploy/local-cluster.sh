#!/usr/bin/env bash
# Brings up a local Tangram cluster on loopback (nats-server, the scheduler, two CPU workers)
# on embedded defaults, runs a small real rollout workload against it, prints the report and
# stops everything. Works on a fresh machine: installs the pinned nats-server and builds the
# sandbox image first.
#
#   bash deploy/local-cluster.sh [--keep] [rollout flags: --trajectories K --turns T --seed S ...]
#
# --keep leaves the cluster running after the workload (stop it with Ctrl-C).
# Logs: .tangram/logs/. NATS data: .tangram/nats/ (removed at start).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
args=()
for a in "$@"; do
  if [ "$a" = "--keep" ]; then keep=1; else args+=("$a"); fi
done
port=${TANGRAM_NATS_PORT:-4222}
monitor=${TANGRAM_NATS_MONITOR_PORT:-8222}
url="nats://127.0.0.1:$port"

bash deploy/install-tools.sh
bash deploy/build-sandbox-image.sh
echo "building Tangram ..."
cargo build --locked --bins --quiet

state=.tangram
rm -rf "$state/nats"
mkdir -p "$state/logs" "$state/nats"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "port $port is taken (another cluster?); set TANGRAM_NATS_PORT" >&2
  exit 1
fi
tools/bin/nats-server -c nats/server.conf -a 127.0.0.1 -p "$port" -m "$monitor" -sd "$state/nats" \
  >"$state/logs/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

export TANGRAM_NATS_URL="$url"
target/debug/tangram-scheduler --metrics-addr 127.0.0.1:9464 >"$state/logs/scheduler.log" 2>&1 &
pids+=($!)
ncpu=$(nproc)
cores="0-$((ncpu - 1))"
# Two workers; on a small machine they share the host's cores (each grants all of them).
for i in 0 1; do
  target/debug/tangram-worker --id "cpu-$i" --cores "$cores" --mem-mb 4096 \
    --metrics-addr "127.0.0.1:$((9465 + i))" >"$state/logs/worker-$i.log" 2>&1 &
  pids+=($!)
done
echo "cluster up: nats $url (monitoring http://127.0.0.1:$monitor), scheduler metrics :9464, workers cpu-0 cpu-1 (cores $cores)"
sleep 1.5

target/debug/tangram-rollout --nats-url "$url" "${args[@]}"
status=$?
if [ "$keep" = 1 ]; then
  echo "cluster still running; Ctrl-C to stop"
  wait
fi
exit $status
