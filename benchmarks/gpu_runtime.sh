#!/usr/bin/env bash
# One device run for the runtime and edge issues: GPU tests, launch overhead, edge benchmark, and
# the forward benchmark against peers. Results into $OUT (default benchmarks/results/tmp).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/benchmarks/results/tmp}"
mkdir -p "$OUT"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())' | tee "$OUT/env.txt"
start=$SECONDS
ATTNGEN_GPU_SUMMARY="$OUT/gpu_summary.json" timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/gpu 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
echo "tests: $((SECONDS - start)) s"
timeout 120 python3 benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" 2>&1 | tail -30
echo "overhead: $((SECONDS - start)) s"
timeout 150 python3 benchmarks/edges_bench.py --out "$OUT/edges.json" 2>&1 | tail -10
echo "edges: $((SECONDS - start)) s"
