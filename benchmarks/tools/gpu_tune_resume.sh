#!/usr/bin/env bash
# Continue the shipped database's studies on the GPU with a larger budget (`attngen tune --resume`),
# for the kernels and buckets given; one device run.
#
#   KERNELS=attn_bwd_bf16_hd128_gqa4_causal_sm90 SHAPES=q4096_k4096_bh128 TRIALS=30 LIMIT=240 \
#     benchmarks/tools/gpu_tune_resume.sh          # writes into $OUT: attngen.sqlite, tune.log
#
# The shipped tuning_db/attngen.sqlite is copied, resumed, and the copy returned: commit it into
# tuning_db/ when it is wanted. Optuna / SQLAlchemy come from shared/wheels/ when the GPU image
# lacks them (as benchmarks/gpu_tune.sh).
set -uo pipefail
: "${KERNELS:?set KERNELS (a glob of kernel uris)}" "${SHAPES:?set SHAPES (comma-separated buckets)}"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$ROOT/benchmarks/results/tmp}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import optuna, sqlalchemy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/attngen_site shared/wheels/*.whl || exit 2
  export PYTHONPATH="/tmp/attngen_site:$PYTHONPATH"
fi
DB=/tmp/attngen_resume.sqlite
cp tuning_db/attngen.sqlite "$DB"
specs=()
for s in specs/*.yaml; do specs+=(--spec "$s"); done
timeout $((${LIMIT:-240} + 30)) python3 -m attngen.cli tune --device h100 "${specs[@]}" \
  --kernels "$KERNELS" --shapes "$SHAPES" --trials "${TRIALS:-30}" --resume --storage "$DB" \
  --timeout "${LIMIT:-240}" > "$OUT/tune.log" 2>&1
rc=$?
cp "$DB" "$OUT/attngen.sqlite"
grep "done\|winner" "$OUT/tune.log" | cut -c1-220
exit "$rc"
