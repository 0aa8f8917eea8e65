#!/usr/bin/env bash
# One device run for the sm90 backward's TMA dQ reduce-add: the backward config A/B
# (benchmarks/bwd_ab.py --configs), the GPU backward tests (the TMA kernel forced, and the runtime's
# choice), and a re-tune of the shipped backward kernel on the changed template, merged with the
# forward winners of the shipped database (BASE, a `db export` without the stale backward rows).
#   attngen db export --out base.json      # then drop the stale backward rows (kernels, trials
#                                          # and winners of family "bwd") from base.json
#   BASE=base.json benchmarks/gpu_bwd_tma.sh                     # writes into $OUT
set -uo pipefail
: "${BASE:?set BASE to a db export without the stale backward rows (see the top of this file)}"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$ROOT/benchmarks/results/tmp}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
S=$SECONDS
timeout 120 python3 benchmarks/bwd_ab.py --configs --out "$OUT/bwd_configs.json" > "$OUT/bwd_configs.log" 2>&1
echo "bwd_ab: exit $? at $((SECONDS - S)) s"
ATTNGEN_GPU_SUMMARY="$OUT/gpu_bwd_summary.json" timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/gpu/test_gpu_bwd.py > "$OUT/gpu_bwd.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_bwd.log") at $((SECONDS - S)) s"
if ! python3 -c "import optuna, sqlalchemy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/attngen_site shared/wheels/*.whl || exit 2
  export PYTHONPATH="/tmp/attngen_site:$PYTHONPATH"
fi
DB=/tmp/attngen_ship.sqlite
rm -f "$DB"
python3 -m attngen.cli db import "$BASE" --storage "$DB" > "$OUT/tune_bwd.log" 2>&1
timeout 90 python3 -m attngen.cli tune --device h100 --spec specs/llama.yaml \
  --kernels attn_bwd_bf16_hd128_gqa4_causal_sm90 --shapes q4096_k4096_bh128,q1024_k1024_bh256 \
  --trials 10 --storage "$DB" --timeout 70 >> "$OUT/tune_bwd.log" 2>&1
echo "tune: exit $? at $((SECONDS - S)) s"
cp "$DB" "$OUT/attngen.sqlite"
grep "done\|winner" "$OUT/tune_bwd.log" | cut -c1-220
