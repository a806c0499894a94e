#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU, its driver, and torch with CUDA:
#   1. the worker's NVML inventory (device count, memory, NVLink groups);
#   2. the reference replica on CUDA: wake (host memory -> GPU) and sleep (GPU -> dropped)
#      times, and scoring throughput, over HTTP as the worker drives it.
# Prints JSON lines; writes them to ${OUT:-.}/gpu-check.json as well.
#
#   bash deploy/gpu-check.sh            # builds tangram-worker if target/release lacks it
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu-check.json"
: > "$out"

echo "== nvidia-smi"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || echo "nvidia-smi not found"

echo "== NVML inventory (tangram-worker --print-gpus)"
bin=target/release/tangram-worker
if [[ ! -x "$bin" ]]; then
    cargo build --release --locked -p tangram-worker
fi
TANGRAM_WORKER_CONFIG= "$bin" --print-gpus | tee -a "$out"
"$bin" --print-gpus | python3 -c 'import json,sys; g=json.load(sys.stdin)["gpus"]; assert g and g["source"]=="nvml", "NVML inventory missing: %r" % g; print("ok: %d GPUs in %d NVLink group(s) from NVML" % (sum(map(len,g["groups"])), len(g["groups"])))'

echo "== torch"
python3 -c 'import torch; assert torch.cuda.is_available(), "torch has no CUDA"; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

echo "== reference replica on CUDA: wake/sleep and scoring"
# Three sizes of weights: 64 MiB, 512 MiB, 2 GiB of float32.
for spec in "262144 64" "1048576 128" "2097152 256"; do
    set -- $spec
    python3 services/reference-replica/bench.py --vocab "$1" --dim "$2" --cycles 10 --batch 64 --batches 20 \
        | tee /dev/stderr | head -1 >> "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cuda = [r for r in rows if "device" in r]
assert cuda and all(r["device"].startswith("cuda") for r in cuda), "the replica did not run on CUDA: %r" % cuda
print("ok: reference replica ran on", cuda[0]["device"])
PY
echo "results: $out"
