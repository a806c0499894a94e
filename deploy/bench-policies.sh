#!/usr/bin/env bash
# tangram-v2 against tangram (and the baselines) on every workload of issue 14's targets, in
# one run: ai-coding at 1,280 and 1,536, bursty at 1,024, 2,048 and 4,096, mopd at 10 GPUs
# (with the pool-size sweep) and deepsearch at 2,048. Writes each run's JSON and picture
# under OUT (default: a temporary folder) and prints a markdown table of the targets.
#
#   bash deploy/bench-policies.sh [OUT]
#
# About 8 minutes on two cores (release build).
set -euo pipefail
out="$(realpath -m "${1:-$(mktemp -d)}")"
mkdir -p "$out"
cd "$(dirname "$0")/.."
cargo build --release --locked -p tangram-cli >&2
t="${CARGO_TARGET_DIR:-target}/release/tangram"
export TANGRAM_NO_PROGRESS=1

run() {
    local name=$1
    shift
    echo "== $name: tangram simulate $*" >&2
    "$t" simulate "$@" --json --svg "$out/$name.svg" >"$out/$name.json"
}

for b in 1280 1536; do
    run "ai-coding-$b" --workload ai-coding --batch "$b" \
        --policies tangram-v2,tangram,static,k8s,fifo-dop-4,equal-split
done
for b in 1024 2048 4096; do
    run "bursty-$b" --workload bursty --batch "$b" \
        --policies tangram-v2,tangram,static,fifo-dop-4,equal-split
done
run mopd-2048 --workload mopd --batch 2048 --gpus 10 --policies tangram-v2,tangram,static --gpu-sweep
run deepsearch-2048 --workload deepsearch --batch 2048 --policies tangram-v2,tangram,static

python3 - "$out" <<'EOF'
import json, sys, os
out = sys.argv[1]
rows = []
for name in ["ai-coding-1280", "ai-coding-1536", "bursty-1024", "bursty-2048", "bursty-4096",
             "mopd-2048", "deepsearch-2048"]:
    d = json.load(open(os.path.join(out, name + ".json")))
    ps = {p["name"].split("@")[0]: p for p in d["policies"]}
    v2, t = ps["tangram-v2"], ps["tangram"]
    gain = 1 - v2["mean_act_s"] / t["mean_act_s"]
    rows.append(
        f"| {name} | {v2['mean_act_s']:.3f} s | {t['mean_act_s']:.3f} s | {gain * 100:.1f}% "
        f"| {v2['p99_act_s']:.2f} / {t['p99_act_s']:.2f} s "
        f"| {v2['max_queue_s']:.2f} / {t['max_queue_s']:.2f} s "
        f"| {v2['step_time_s']:.1f} / {t['step_time_s']:.1f} s |")
    others = ", ".join(f"`{n}` {p['mean_act_s']:.3f} s" for n, p in ps.items()
                       if not n.startswith("tangram"))
    if others:
        rows.append(f"|  | others: {others} | | | | | |")
    if "gpu_sweep" in d:
        fewest = d.get("fewest_gpus_matching_static")
        rows.append(f"|  | fewest GPUs matching static (tangram-v2): {fewest} | | | | | |")
print("| workload | `tangram-v2` mean | `tangram` mean | gain | p99 v2 / tangram | longest wait v2 / tangram | step v2 / tangram |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
print(f"\n(JSON and pictures in {out})")
EOF
