#!/usr/bin/env bash
# The closing device run: the whole GPU suite (with the shipped tuning database and the sm90
# defaults), the launch-overhead benchmark, then `attngen bench --mode fwd` against the peers.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/benchmarks/results/tmp}"
mkdir -p "$OUT"
start=$SECONDS
ATTNGEN_GPU_SUMMARY="$OUT/gpu_summary.json" timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/gpu 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
echo "tests: $((SECONDS - start)) s"
timeout 90 python3 benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" > "$OUT/launch_overhead.log" 2>&1
python3 -c "import json; d=json.load(open('$OUT/launch_overhead.json')); print(d['host_us'], d['recompiles_while_S_sweeps'])"
echo "overhead: $((SECONDS - start)) s"
if [ "${BENCH:-1}" != 0 ]; then
  timeout $((580 - SECONDS)) python3 -m attngen.cli bench --mode fwd --out "$OUT/bench_fwd.json" 2>&1 | tail -15
fi
echo "all: $((SECONDS - start)) s"
