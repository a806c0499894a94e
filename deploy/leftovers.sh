#!/usr/bin/env bash
# What the test suite must not leave behind: sandbox and fleet containers, processes of the
# project's binaries and tools (nats-server, the scheduler and workers, replicas, the
# registry, Prometheus), second Docker daemons, Docker networks and network namespaces.
#
#   bash deploy/leftovers.sh snapshot FILE   record what exists now (before the suite)
#   bash deploy/leftovers.sh check FILE      name what exists now and did not then, remove
#                                            it, and exit 1 if there was any
#
# Only what appeared during the run counts, so a cluster someone keeps running beside the
# suite (`deploy/local-cluster.sh --keep`) is neither reported nor touched.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target="$root/$target" ;; esac

# One line per thing: "<kind> <id> <what>", sorted. A process is named with its start time,
# so a reused pid is a different line.
inventory() {
  docker ps -a --no-trunc --filter label=tangram.worker --format 'container {{.ID}} {{.Names}}' 2>/dev/null
  docker ps -a --no-trunc --filter label=com.docker.compose.project --format 'container {{.ID}} {{.Names}}' 2>/dev/null \
    | awk '$3 ~ /^tangram/'
  docker network ls --no-trunc --filter label=com.docker.compose.project --format 'network {{.ID}} {{.Name}}' 2>/dev/null \
    | awk '$3 ~ /^tangram/'
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-200)
    case "$exe" in
      "$root"/tools/*|"$target"/debug/*|"$target"/release/*) ;;
      */dockerd) case "$cmd" in *"/tmp/tgd-"*) ;; *) continue ;; esac ;;
      *python*) case "$cmd" in *"$root"/*) ;; *) continue ;; esac ;;
      *) continue ;;
    esac
    start=$(awk '{print $22}' "$p/stat" 2>/dev/null)
    echo "process $pid:$start $cmd"
  done
  ip netns list 2>/dev/null | awk '{print "netns " $1 " " $1}'
}

remove() {
  local kind=$1 id=$2
  case "$kind" in
    container) docker rm -f "$id" >/dev/null 2>&1 ;;
    network) docker network rm "$id" >/dev/null 2>&1 ;;
    process) kill -TERM "${id%%:*}" 2>/dev/null ;;
    netns) ip netns delete "$id" 2>/dev/null ;;
  esac
}

case "${1:-}" in
  snapshot)
    inventory | sort >"$2"
    ;;
  check)
    before=$2
    # What is still stopping gets a few seconds (a worker closing its sandboxes on SIGTERM).
    for _ in $(seq 1 20); do
      left=$(comm -13 "$before" <(inventory | sort))
      [ -z "$left" ] && exit 0
      sleep 0.5
    done
    echo "the test suite left these behind (now removed):" >&2
    echo "$left" | sed 's/^/  /' >&2
    while read -r kind id _; do remove "$kind" "$id"; done <<<"$left"
    exit 1
    ;;
  *)
    echo "usage: $0 snapshot FILE | check FILE" >&2
    exit 2
    ;;
esac
