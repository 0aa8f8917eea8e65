#!/usr/bin/env bash
# The one script to run on the GPU machine: the GPU test suite, then `attngen bench`.
#
#   benchmarks/run_gpu.sh [fwd|fwdbwd|both|decode] [more `attngen bench` arguments, e.g. --quick]
#
# Writes into $OUT (default: benchmarks/results/tmp): gpu_summary.json, gpu_tests.log, env.txt,
# gpu_correctness_grid.json and gpu_grid.log (the correctness grid; GRID=0 skips it),
# bench_<mode>.json and bench_<mode>.log per mode (decode: bench_decode.png too). TESTS=0 skips the
# tests, BENCH=0 the benchmark; TEST_WORKERS=N runs the GPU suite over N processes (default 1);
# SANITIZE=1 adds compute-sanitizer's memcheck over a sample of the grid;
# OVERHEAD=1 adds the launch-overhead benchmark (launch_overhead.json), EDGES=1 the edge-shape one
# (edges.json).
# No install step: the repository is put on PYTHONPATH. Exit status: nonzero if the tests or a
# benchmark run failed (the benchmark runs even when a test fails).
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/benchmarks/results/tmp}"
mkdir -p "$OUT"
mode="${1:-fwd}"
[ "$#" -gt 0 ] && shift
case "$mode" in
  fwd|fwdbwd) modes="$mode" ;;
  both) modes="fwd fwdbwd" ;;
  decode) modes="decode" ;;
  *) echo "usage: $0 [fwd|fwdbwd|both|decode] [attngen bench args...]" >&2; exit 2 ;;
esac

{
  if commit=$(git rev-parse HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit (+ local changes)"
  else
    commit="unknown (no git checkout)"
  fi
  echo "commit: $commit"
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda); print("triton", triton.__version__); print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null || true
} | tee "$OUT/env.txt"

status=0
if [ "${TESTS:-1}" != 0 ]; then
  start=$SECONDS
  set +e
  ATTNGEN_GPU_SUMMARY="$OUT/gpu_summary.json" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -n "${TEST_WORKERS:-1}" --ignore tests/gpu/test_gpu_grid.py tests/gpu 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "GPU tests: exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || status=1
fi

# the correctness grid (tests/gpu/test_gpu_grid.py), spread over GRID_WORKERS processes; its
# records go to gpu_correctness_grid.json. SANITIZE=1 then runs compute-sanitizer's memcheck over
# the forced paths at SANITIZE_K's head dims (each tensor its own allocation, so a read past one
# is caught)
if [ "${GRID:-1}" != 0 ]; then
  start=$SECONDS
  set +e
  ATTNGEN_GRID_RESULTS="$OUT/gpu_correctness_grid.json" python3 -m pytest -q -m gpu -p no:cacheprovider \
    -n "${GRID_WORKERS:-14}" tests/gpu/test_gpu_grid.py 2>&1 | tee "$OUT/gpu_grid.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "GPU grid: exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || status=1
fi
if [ "${SANITIZE:-0}" != 0 ]; then
  start=$SECONDS
  set +e
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 20 --target-processes all \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_grid.py \
    -k "${SANITIZE_K:-test_forced_path and (hd72- or hd64- or hd203-)}" 2>&1 | tee "$OUT/gpu_correctness_grid_sanitizer.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "sanitizer: exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || status=1
fi

for extra in OVERHEAD:launch_overhead EDGES:edges; do
  var=${extra%%:*} name=${extra#*:}
  [ "${!var:-0}" != 0 ] || continue
  script=benchmarks/${name/edges/edges_bench}.py
  set +e
  python3 "$script" --out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "$script: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done

if [ "${BENCH:-1}" != 0 ]; then
  for m in $modes; do
    start=$SECONDS
    set +e
    plot=(); [ "$m" = decode ] && plot=(--plot "$OUT/bench_decode.png")
    python3 -m attngen.cli bench --mode "$m" --out "$OUT/bench_$m.json" "${plot[@]}" "$@" 2>&1 \
      | tee "$OUT/bench_$m.log"
    rc=${PIPESTATUS[0]}
    set -e
    echo "bench --mode $m: exit $rc in $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || status=1
  done
fi
echo "results in $OUT"
exit "$status"
