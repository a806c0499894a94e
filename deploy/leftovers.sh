#!/usr/bin/env bash
# What the test suite must not leave behind: sandbox and fleet containers, processes of the
# project's binaries and tools (nats-server, the scheduler and workers, replicas, the
# registry, Prometheus), second Docker daemons, compose networks and network namespaces.
#
#   bash deploy/leftovers.sh snapshot FILE   record what exists now (before the suite)
#   bash deploy/leftovers.sh check FILE      name what appeared since and is still there,
#                                            remove it, and exit 1 if there was any
#
# Only what the run made counts. What was there before is neither reported nor touched, and
# neither is what it makes meanwhile: a cluster kept running beside the suite
# (`deploy/local-cluster.sh --keep`) may open sandboxes (they carry its cluster's label,
# seen at the snapshot) or start replicas (their parent process predates the run), and an
# editor's helpers are children of processes that predate it too.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target="$root/$target" ;; esac

# "pid:starttime" of a process (a reused pid is another process).
ident() { echo "$1:$(awk '{print $22}' "/proc/$1/stat" 2>/dev/null)"; }
parent() { awk '{print $4}' "/proc/$1/stat" 2>/dev/null; }

# One line per thing: "<kind> <id> <what>".
inventory() {
  docker ps -a --no-trunc --filter label=tangram.worker \
    --format 'container {{.ID}} {{.Names}} cluster={{.Label "tangram.cluster"}}' 2>/dev/null
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
    echo "process $(ident "$pid") $cmd"
  done
  ip netns list 2>/dev/null | awk '$1 ~ /^(tangram|tgd)/ {print "netns " $1 " " $1}'
}

# Every process now, for telling what a kept cluster or an editor starts from what the run left.
everyone() { for p in /proc/[0-9]*; do ident "${p#/proc/}"; done; }

# This script's own ancestors (the suite's shell, CI's runner): a leftover handed to one of
# them, as to init, is still the run's.
ancestors() {
  local p=$$
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do ident "$p"; p=$(parent "$p"); done
}

# True when the process has an ancestor that predates the run and is not one of ours.
started_by_others() {
  local p before=$1 mine=$2
  p=$(parent "${3%%:*}")
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    local id
    id=$(ident "$p")
    if grep -qxF "$id" "$before.all" && ! grep -qxF "$id" <<<"$mine"; then return 0; fi
    p=$(parent "$p")
  done
  return 1
}

leftovers() {
  local before=$1 mine
  mine=$(ancestors)
  comm -13 <(sort "$before") <(inventory | sort) | while read -r kind id rest; do
    case "$kind" in
      container)
        cluster=${rest##*cluster=}
        if [ "$cluster" != "$rest" ] && [ -n "$cluster" ] && grep -qF "cluster=$cluster" "$before"; then continue; fi
        ;;
      process) started_by_others "$before" "$mine" "$id" && continue ;;
    esac
    echo "$kind $id $rest"
  done
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
    everyone | sort >"$2.all"
    ;;
  check)
    before=$2
    [ -f "$before.all" ] || touch "$before.all"
    # What is still stopping gets a few seconds (a worker closing its sandboxes on SIGTERM).
    for _ in $(seq 1 20); do
      left=$(leftovers "$before")
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
