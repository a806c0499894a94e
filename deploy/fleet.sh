#!/usr/bin/env bash
# A Tangram fleet on this Docker host (deploy/compose/docker-compose.yml): three clustered
# nats-servers, a scheduler and its standby, N CPU workers, a GPU worker, the search
# stand-in. Each component is a container on a private network; only the three servers'
# client ports are published, on 127.0.0.1.
#
#   bash deploy/fleet.sh up [N]        build what is missing, start with N CPU workers (2)
#   bash deploy/fleet.sh rollout [...] run the main job's rollout against the fleet
#   bash deploy/fleet.sh status        tangram status, and the containers
#   bash deploy/fleet.sh scale N       N CPU workers; going down drains the ones removed
#   bash deploy/fleet.sh drain ID      drain one worker (tangram drain), leave it cordoned
#   bash deploy/fleet.sh uncordon ID   lift a worker's cordon or drain
#   bash deploy/fleet.sh env           the variables a shell needs to use the fleet
#   bash deploy/fleet.sh logs [SVC]    the containers' logs
#   bash deploy/fleet.sh compose ...   docker-compose on the fleet's project (kill, start...)
#   bash deploy/fleet.sh down          stop everything, remove its containers and volumes
#
# Settings (environment): TANGRAM_FLEET_DIR (.tangram-fleet), TANGRAM_FLEET_PROJECT
# (tangram-fleet), TANGRAM_FLEET_PORT (4222: the servers get it and the next two),
# TANGRAM_FLEET_POOL (8: CPU worker ids cpu-1..cpu-8, the most `scale` can reach),
# TANGRAM_FLEET_POLICY (tangram), TANGRAM_FLEET_CPU_MEM_MB (4096 per worker),
# TANGRAM_FLEET_REBUILD (set: rebuild the images on `up` even if present),
# TANGRAM_FLEET_EFFECTS (set: sandboxes mount effects/sandbox, for the fault suite),
# TANGRAM_FLEET_SEARCH_RATE (200 requests/s), TANGRAM_FLEET_LOG (RUST_LOG in containers),
# TANGRAM_FLEET_ID_PREFIX (put before every worker id, for two fleets on one host: worker
# ids must be unique per Docker host, since a starting worker removes the sandboxes
# labelled with its id), TANGRAM_BIN_DIR (binaries for the images: target/debug, built if
# missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
FLEET_DIR=${TANGRAM_FLEET_DIR:-$root/.tangram-fleet}
mkdir -p "$FLEET_DIR"
FLEET_DIR=$(cd "$FLEET_DIR" && pwd)
PROJECT=${TANGRAM_FLEET_PROJECT:-tangram-fleet}
PORT=${TANGRAM_FLEET_PORT:-4222}
P=${TANGRAM_FLEET_ID_PREFIX:-}
GPU_ID=${P}gpu-1
POOL=${TANGRAM_FLEET_POOL:-8}
BIN=${TANGRAM_BIN_DIR:-$root/target/debug}
tangram=$BIN/tangram

export TANGRAM_FLEET_DIR=$FLEET_DIR
export TANGRAM_FLEET_PORT_1=$PORT TANGRAM_FLEET_PORT_2=$((PORT + 1)) TANGRAM_FLEET_PORT_3=$((PORT + 2))
export TANGRAM_IMAGE_TAG=${TANGRAM_IMAGE_TAG:-$(awk -F'"' '/^\[workspace.package\]/{w=1} w && /^version/{print $2; exit}' "$root/Cargo.toml")}
export TANGRAM_NATS_TAG=${TANGRAM_NATS_TAG:-$(awk -F= '/^NATS_SERVER_VERSION=/{split($2,a," "); print a[1]; exit}' "$root/deploy/install-tools.sh")}
export TANGRAM_FLEET_SEARCH_RATE=${TANGRAM_FLEET_SEARCH_RATE:-200}
URL="nats://127.0.0.1:$PORT,nats://127.0.0.1:$((PORT + 1)),nats://127.0.0.1:$((PORT + 2))"

compose() { docker-compose -p "$PROJECT" -f "$root/deploy/compose/docker-compose.yml" "$@"; }
# The tangram CLI as the fleet's operator.
op() { TANGRAM_NATS_URL=$URL TANGRAM_NKEY_FILE=$FLEET_DIR/creds/operator.nk "$tangram" "$@"; }
die() { echo "fleet: $*" >&2; exit 1; }

pool_ids() { seq -f "${P}cpu-%g" 1 "$POOL" | paste -sd, -; }

# Images and the CLI, when missing.
ensure_built() {
  if [ ! -x "$tangram" ] || [ ! -x "$BIN/tangram-worker" ] || [ ! -x "$BIN/tangram-rollout" ]; then
    [ -n "${TANGRAM_BIN_DIR:-}" ] && die "$BIN lacks the binaries"
    (cd "$root" && cargo build --locked --bins --quiet)
  fi
  if [ -n "${TANGRAM_FLEET_REBUILD:-}" ]; then
    TANGRAM_BIN_DIR=$BIN bash "$root/deploy/build-images.sh"
    return
  fi
  local img
  for img in "tangram/nats:$TANGRAM_NATS_TAG" "tangram/scheduler:$TANGRAM_IMAGE_TAG" \
    "tangram/worker:$TANGRAM_IMAGE_TAG" "tangram/gpu-worker:$TANGRAM_IMAGE_TAG"; do
    if ! docker image inspect "$img" >/dev/null 2>&1; then
      TANGRAM_BIN_DIR=$BIN bash "$root/deploy/build-images.sh"
      return
    fi
  done
}

# Credentials (kept across runs) and the rendered configs.
prepare() {
  local creds=$FLEET_DIR/creds
  "$tangram" creds --dir "$creds" --workers "$(pool_ids),$GPU_ID" --jobs "${TANGRAM_FLEET_JOBS:-}" >/dev/null
  [ -s "$creds/search.key" ] || { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; echo; } > "$creds/search.key"
  # The pool's folder holds the CPU workers' seeds and nothing else; the GPU worker's
  # folder its own seed.
  rm -rf "$creds/pool" "$creds/gpu" && mkdir -m 0700 "$creds/pool" "$creds/gpu"
  local id
  for id in $(pool_ids | tr , ' '); do cp -p "$creds/worker-$id.nk" "$creds/pool/"; done
  cp -p "$creds/worker-$GPU_ID.nk" "$creds/gpu/"
  # The scheduler, the GPU worker and the search stand-in run as nobody (65534): their
  # files are theirs. The folder itself stays the operator's, mode 0700.
  local f
  for f in scheduler.nk "gpu/worker-$GPU_ID.nk" search.key; do
    if [ "$(id -u)" = 0 ]; then chown 65534:65534 "$creds/$f"; chmod 0400 "$creds/$f"
    else chmod 0644 "$creds/$f"; fi
  done
  if [ "$(id -u)" = 0 ]; then chown 65534:65534 "$creds/gpu"; else chmod 0755 "$creds/gpu"; fi
  mkdir -p "$FLEET_DIR/config" "$FLEET_DIR/effects/sandbox"
  chmod 0777 "$FLEET_DIR/effects" "$FLEET_DIR/effects/sandbox"
  # Only the fault suite gives sandboxes a shared folder (for the marks its execs leave);
  # a fleet for real rollouts mounts nothing into them.
  local mounts=""
  if [ -n "${TANGRAM_FLEET_EFFECTS:-}" ]; then
    mounts="mounts = [\"$FLEET_DIR/effects/sandbox:/effects:rw\"]"
  fi
  local c=$root/deploy/compose
  cp "$c/nats.conf" "$FLEET_DIR/config/nats.conf"
  sed "s|@POLICY@|${TANGRAM_FLEET_POLICY:-tangram}|" "$c/scheduler.toml" > "$FLEET_DIR/config/scheduler.toml"
  sed -e "s|@CPU_MEM_MB@|${TANGRAM_FLEET_CPU_MEM_MB:-4096}|" -e "s|@SANDBOX_MOUNTS@|$mounts|" \
    -e "s|@ID_PREFIX@|$P|" \
    "$c/cpu-worker.toml" > "$FLEET_DIR/config/cpu-worker.toml"
  local services="" s
  for s in ${TANGRAM_FLEET_SERVICES:-judge teacher-code teacher-style}; do
    services+="
[[service]]
name = \"$s\"
driver = \"reference\"
command = [\"python3\", \"/opt/tangram/replica.py\", \"--service\", \"{service}\", \"--port\", \"{port}\", \"--request-log\", \"/effects/replica.log\"]
gpus = 1
restore_ms = 20
slots = 8
start_timeout_ms = 30000
"
  done
  python3 - "$c/gpu-worker.toml" "$FLEET_DIR/config/gpu-worker.toml" "$services" "$TANGRAM_FLEET_SEARCH_RATE" "$GPU_ID" <<'PY'
import sys
src, dst, services, rate, gpu_id = sys.argv[1:]
text = open(src).read().replace("@SERVICES@", services).replace("@SEARCH_RATE@", str(float(rate)))
text = text.replace("@GPU_ID@", gpu_id)
open(dst, "w").write(text)
PY
}

# Waits (bounded) until the scheduler leads and knows `n` CPU workers and the GPU worker.
wait_ready() {
  local n=$1 deadline=$((SECONDS + ${TANGRAM_FLEET_WAIT_S:-180})) seen=""
  while [ $SECONDS -lt $deadline ]; do
    if seen=$(op status --json 2>/dev/null | python3 -c '
import json, sys
st = json.load(sys.stdin)
ids = [w["id"] for w in st["workers"] if not w.get("draining")]
cpu = [i for i in ids if i.startswith(sys.argv[1] + "cpu-")]
print(len(cpu), sys.argv[1] + "gpu-1" in ids, ",".join(sorted(ids)))' "$P" 2>/dev/null); then
      set -- $seen
      if [ "$1" -ge "$n" ] && [ "$2" = True ]; then echo "workers: $3"; return 0; fi
    fi
    sleep 1
  done
  compose ps >&2 || true
  die "the fleet did not come up within ${TANGRAM_FLEET_WAIT_S:-180} s (last seen: ${seen:-no answer}); see: bash deploy/fleet.sh logs"
}

# The CPU worker containers, oldest first: "<container> <worker id>" per line.
cpu_containers() {
  local c ids
  ids=$(compose ps -q cpu-worker) || die "listing the CPU worker containers failed"
  for c in $ids; do
    local num id
    num=$(docker inspect -f '{{index .Config.Labels "com.docker.compose.container-number"}}' "$c")
    id=$(docker exec "$c" /usr/local/bin/tangram probe 127.0.0.1:9475 /healthz 2>/dev/null \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["worker"])' 2>/dev/null || echo "?")
    echo "$num $c $id"
  done | sort -n | cut -d' ' -f2-
}

print_env() {
  cat <<EOF
export TANGRAM_NATS_URL=$URL
export TANGRAM_NKEY_FILE=$FLEET_DIR/creds/operator.nk   # rollouts: $FLEET_DIR/creds/rollout.nk
EOF
}

cmd=${1:-}
shift || true
case "$cmd" in
  up)
    n=${1:-2}
    [ "$n" -le "$POOL" ] || die "$n CPU workers asked, the pool has $POOL ids (TANGRAM_FLEET_POOL)"
    bash "$root/deploy/install-tools.sh" >/dev/null
    ensure_built
    prepare
    compose up -d --remove-orphans --scale cpu-worker="$n"
    wait_ready "$n"
    echo "fleet $PROJECT is up"
    echo "  NATS:        $URL"
    echo "  rollouts:    TANGRAM_NKEY_FILE=$FLEET_DIR/creds/rollout.nk"
    echo "  operator:    TANGRAM_NKEY_FILE=$FLEET_DIR/creds/operator.nk"
    echo "  try:         bash deploy/fleet.sh rollout | status | scale 4 | drain cpu-2 | down"
    ;;
  rollout)
    TANGRAM_NKEY_FILE=$FLEET_DIR/creds/rollout.nk "$BIN/tangram-rollout" --nats-url "$URL" \
      --label "fleet" --report "$FLEET_DIR/report.json" "$@"
    ;;
  status)
    op status "$@"
    echo
    compose ps
    ;;
  scale)
    n=${1:?scale N}
    [ "$n" -le "$POOL" ] || die "$n CPU workers asked, the pool has $POOL ids (TANGRAM_FLEET_POOL)"
    listing=$(cpu_containers)
    rows=()
    [ -n "$listing" ] && mapfile -t rows <<<"$listing"
    removed=()
    if [ "${#rows[@]}" -gt "$n" ]; then
      # The newest containers go: each is drained, then stopped and removed here (not left
      # to compose, whose choice of which to remove differs between versions).
      for row in "${rows[@]:$n}"; do
        c=${row%% *} id=${row#* }
        [ "$id" = "?" ] && die "container $c does not say which worker it is (not ready?); not removing it undrained"
        echo "draining $id ..."
        op drain "$id" --deadline-s "${TANGRAM_FLEET_DRAIN_S:-120}"
        docker stop -t 40 "$c" >/dev/null
        docker rm "$c" >/dev/null
        removed+=("$id")
      done
    fi
    compose up -d --no-recreate --scale cpu-worker="$n"
    # An id whose container is gone returns to the pool: lift its cordon for the next holder.
    for id in "${removed[@]}"; do op uncordon "$id" >/dev/null; done
    wait_ready "$n"
    ;;
  drain)
    op drain "${1:?drain WORKER_ID}" "${@:2}"
    ;;
  uncordon)
    op uncordon "${1:?uncordon WORKER_ID}"
    ;;
  env)
    print_env
    ;;
  logs)
    compose logs --no-color "$@"
    ;;
  compose)
    compose "$@"
    ;;
  down)
    compose down -v --remove-orphans -t 40 || true
    # Sandboxes are the host engine's containers: remove any a killed worker left.
    for id in $(pool_ids | tr , ' ') "$GPU_ID"; do
      docker ps -aq --filter "label=tangram.worker=$id" | xargs -r docker rm -f >/dev/null
    done
    echo "fleet $PROJECT is down (credentials kept in $FLEET_DIR/creds)"
    ;;
  *)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ -z "$cmd" ] || exit 64
    ;;
esac
