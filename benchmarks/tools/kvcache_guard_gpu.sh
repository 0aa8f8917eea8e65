#!/usr/bin/env bash
# Issue 51 on the GPU: KV-cache metadata out of range.
#
#   benchmarks/tools/kvcache_guard_gpu.sh            # PHASES="tests sanitize bench" by default
#   PHASES=bench BASE=f95a7e8 benchmarks/tools/kvcache_guard_gpu.sh
#
# Writes into $OUT (default: benchmarks/results/tmp):
#   tests     kvcache_guard_tests.log: tests/gpu/test_gpu_kvcache_guard.py and test_gpu_decode.py
#             (the append kernel, CUDA graphs, e4m3 caches) without the sanitizer
#   sanitize  kvcache_guard_sanitizer.log: test_gpu_kvcache_guard.py under compute-sanitizer's
#             memcheck (each tensor its own allocation, so a read past one is caught); the run
#             must end with "ERROR SUMMARY: 0 errors"
#   bench     the guards' cost: `attngen bench --mode decode` for attngen's three layouts
#             (contiguous, paged by 16, e4m3 cache) on the tree of commit $BASE (before the guards;
#             default: the parent of the first issue-51 commit) and on this tree, twice each,
#             alternating, with no tuning database (ATTNGEN_DB names a missing file: both trees run
#             the family's default configs, so the A/B isolates the guards: the shipped decode
#             winners are keyed by the old kernel hashes and need a retune); bench_decode_{base,guard}_{1,2}.json
#             and guard_cost.txt (GB/s guard / base per row and layout, best of the two runs each);
#             append_step_{base,guard}_{1,2}.json: a decode step with an append (us, do_bench median),
#             torch indexing (base) against the append kernel
# CASES=<comma-separated decode bench cases> limits the bench (default: all).
# Needs git history for BASE (or BASE_TREE=<a checkout of the base tree>).
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/benchmarks/results/tmp}"
mkdir -p "$OUT"
PHASES="${PHASES:-tests sanitize bench}"
status=0

if [[ " $PHASES " == *" tests "* ]]; then
  set +e
  PYTHONPATH="$ROOT" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_kvcache_guard.py \
    tests/gpu/test_gpu_decode.py 2>&1 | tee "$OUT/kvcache_guard_tests.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "tests: exit $rc"
  [ "$rc" -eq 0 ] || status=1
fi

if [[ " $PHASES " == *" sanitize "* ]]; then
  set +e
  PYTHONPATH="$ROOT" PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 50 \
    --target-processes all python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_kvcache_guard.py \
    -k "not torch_compile and not cuda_graph" 2>&1 | tee "$OUT/kvcache_guard_sanitizer.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "sanitizer: exit $rc"
  grep -q "ERROR SUMMARY: 0 errors" "$OUT/kvcache_guard_sanitizer.log" || status=1
  [ "$rc" -eq 0 ] || status=1
fi

if [[ " $PHASES " == *" bench "* ]]; then
  base_tree="${BASE_TREE:-}"
  if [ -z "$base_tree" ] && ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "bench: no git history here: give BASE_TREE=<a checkout of the tree before the guards>" >&2
    exit 2
  fi
  if [ -z "$base_tree" ]; then
    base="${BASE:-$(git log --format=%H --grep='(issue 51)' | tail -1)^}"
    base_tree="$(mktemp -d)/base"
    mkdir -p "$base_tree"
    git archive "$base" | tar -x -C "$base_tree"
    echo "base tree: $base ($(git rev-parse "$base")) in $base_tree"
  fi
  scratch="$(mktemp -d)"  # Triton / attngen caches of both trees, outside $OUT (its file count is limited)
  nodb="$scratch/no_tuning_db.sqlite"  # missing: every lookup is None, the defaults serve
  providers="attngen,attngen-paged,attngen-fp8kv"
  for round in 1 2; do
    for which in base guard; do
      tree="$ROOT"
      [ "$which" = base ] && tree="$base_tree"
      (cd "$tree" && PYTHONPATH="$tree" ATTNGEN_DB="$nodb" ATTNGEN_CACHE_DIR="$scratch/cache_$which" TRITON_CACHE_DIR="$scratch/triton_$which" \
        python3 -m attngen.cli bench --mode decode --providers "$providers" ${CASES:+--cases "$CASES"} \
        --out "$OUT/bench_decode_${which}_${round}.json") 2>&1 | tee "$OUT/bench_decode_${which}_${round}.log"
    done
  done
  # a decode step with an append (the bench reads only): torch indexing (base) vs the append kernel
  for round in 1 2; do
    for which in base guard; do
      tree="$ROOT"
      [ "$which" = base ] && tree="$base_tree"
      (cd "$tree" && PYTHONPATH="$tree" ATTNGEN_DB="$nodb" ATTNGEN_CACHE_DIR="$scratch/cache_$which" TRITON_CACHE_DIR="$scratch/triton_$which" python3 - <<'EOF'
import json, torch, attngen
from triton.testing import do_bench
res = {}
for B, S, page in ((1, 32768, 0), (8, 32768, 0), (8, 32768, 16), (64, 4096, 16)):
    Hq, Hkv, D = 32, 8, 128
    g = dict(device="cuda", dtype=torch.bfloat16)
    q, kn, vn = torch.randn(B, 1, Hq, D, **g), torch.randn(B, 1, Hkv, D, **g), torch.randn(B, 1, Hkv, D, **g)
    rows = B * S // page if page else B
    kc, vc = torch.randn(rows, page or S, Hkv, D, **g), torch.randn(rows, page or S, Hkv, D, **g)
    bt = torch.randperm(rows, device="cuda").to(torch.int32).reshape(B, -1) if page else None
    lens = torch.full((B,), S - 1, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        fn = lambda: attngen.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn, block_table=bt)
        res[f"b{B}-kv{S // 1024}k{'-paged' if page else ''}"] = round(do_bench(fn, warmup=100, rep=500) * 1e3, 2)
print(json.dumps(res))
EOF
      ) 2>&1 | tail -1 | tee "$OUT/append_step_${which}_${round}.json"
    done
  done
  python3 - "$OUT" <<'EOF' | tee "$OUT/guard_cost.txt"
import json, sys
out = sys.argv[1]
def best(which):
    rows = {}
    for r in (1, 2):
        for row in json.load(open(f"{out}/bench_decode_{which}_{r}.json"))["rows"]:
            for prov, gbps in row["GBps"].items():
                key = (row["case"], prov)
                rows[key] = max(rows.get(key, 0.0), gbps)
    return rows
base, guard = best("base"), best("guard")
print(f"{'case':28s} {'provider':16s} {'base GB/s':>10s} {'guard GB/s':>10s} {'guard/base':>10s}")
worst = 1e9
for key in sorted(base):
    if key in guard:
        ratio = guard[key] / base[key]
        worst = min(worst, ratio)
        print(f"{key[0]:28s} {key[1]:16s} {base[key]:10.1f} {guard[key]:10.1f} {ratio:10.3f}")
print(f"worst guard/base: {worst:.3f} (goal: >= 0.98)")
steps = {w: [json.load(open(f"{out}/append_step_{w}_{r}.json")) for r in (1, 2)] for w in ("base", "guard")}
print("decode step with an append, us a call (best of two runs): base / guard")
for k in steps["base"][0]:
    b, g = (min(run[k] for run in steps[w]) for w in ("base", "guard"))
    print(f"  {k:20s} {b:8.2f} {g:8.2f}  guard/base {g / b:.3f}")
EOF
fi
exit $status
