#!/usr/bin/env bash
# The main job: brings up a local Tangram cluster on loopback from embedded defaults
# (`tangram up`: nats-server, the scheduler, two CPU workers, a GPU worker with 2 declared
# GPUs serving reference reward replicas, a search API stand-in behind the quota manager),
# runs a real agentic-RL rollout workload against it with the default `tangram-v2` policy, then
# under the paper's `tangram` policy and the `static` baseline (per-trajectory sandboxes with fixed cores, services
# pinned to an even split of the GPUs, per-trajectory API rate slices), and prints both
# reports side by side with a picture of ACT per policy (rollout-act.svg).
#
# Works on a fresh machine: installs the pinned tools and builds the sandbox image first.
#
#   bash deploy/local-cluster.sh [--keep] [rollout flags: --trajectories K --turns T --seed S ...]
#
# --keep runs the tangram pass only and leaves that cluster up for the README's tour
# (stop it with `target/debug/tangram down`). State and logs: .tangram/.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
args=()
for a in "$@"; do
  if [ "$a" = "--keep" ]; then keep=1; else args+=("$a"); fi
done
port=${TANGRAM_NATS_PORT:-4222}
url="nats://127.0.0.1:$port"

bash deploy/install-tools.sh
bash deploy/build-sandbox-image.sh
echo "building Tangram ..."
cargo build --locked --bins --quiet

bin="${CARGO_TARGET_DIR:-target}/debug"
tangram=$bin/tangram
export TANGRAM_STATE_DIR=.tangram
up=0
cleanup() { if [ "$up" = 1 ] && [ "$keep" = 0 ]; then $tangram down >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT INT TERM
mkdir -p .tangram

run_pass() {  # policy, extra up flags...
  local policy=$1; shift
  echo
  echo "=== policy: $policy ==="
  $tangram up --nats-port "$port" --policy "$policy" "$@"
  up=1
  # Rollouts authenticate as the `rollout` role (tangram up wrote the seed).
  TANGRAM_NKEY_FILE=.tangram/creds/rollout.nk \
  "$bin/tangram-rollout" --nats-url "$url" --label "$policy" \
    --report ".tangram/report-$policy.json" "${args[@]}"
  $tangram status | sed -n '/service/,$p'
}

run_pass tangram-v2
if [ "$keep" = 1 ]; then
  echo
  echo "cluster still up at $url; try the README's tour, then: $tangram down"
  exit 0
fi
$tangram down
up=0
# The paper's policy, for comparison with ours (tangram-v2 re-sizes running commands).
run_pass tangram
$tangram down
up=0
# The baseline: each trajectory's sandbox holds 1 core for its whole life (this machine's
# workers share its cores), each service keeps its GPUs, each trajectory gets rate / N.
run_pass static --static-cores 1
$tangram down
up=0

echo
echo "=== tangram-v2 vs static ==="
"$bin/tangram-rollout" --compare .tangram/report-tangram-v2.json .tangram/report-static.json \
  --svg rollout-act.svg
echo
echo "=== tangram-v2 vs tangram (the paper's policy) ==="
"$bin/tangram-rollout" --compare .tangram/report-tangram-v2.json .tangram/report-tangram.json
