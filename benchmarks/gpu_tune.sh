#!/usr/bin/env bash
# The tuning run on an H100/H200 (about 7-8 minutes: every phase has its own time limit, and no
# phase starts after 450 s):
#
#   benchmarks/gpu_tune.sh            # writes into $OUT (default benchmarks/results/tmp)
#
#   1. search vs exhaustive: `attngen tune --sampler grid` over the forward space on 3 shapes
#      (llama hd128 causal 4k x 128 heads, 1k x 256; gemma2 hd256 causal+softcap 4k x 32), then TPE
#      with 30 % of the valid configs per shape, compared by `attngen db compare`
#      -> compare_search.json
#   2. the shipped database: the exhaustive results above, plus TPE on llama's backward (2 buckets)
#      and on every bf16 forward kernel of specs/ at q8192_k8192_bh32
#      -> tuning_db/attngen.sqlite (copy it to tuning_db/ and commit), winners.json (its winners)
#   3. `--workers 2` on this one GPU (two processes, one shared storage) -> workers.json
#   and gpu_tune.log (everything printed), env.txt, summary.json (phases, seconds, exit codes).
#
#   PHASES=ship benchmarks/gpu_tune.sh   # only 2., with TPE on llama's forward buckets in place of
#                                        # the exhaustive winners (about 3-4 minutes)
#
# The GPU image has no optuna / SQLAlchemy: their wheels come from shared/wheels/ (downloaded on a
# machine with pip: /work/shared/scripts/gpu_wheels.sh shared/wheels), installed into /tmp.
# The repository goes on PYTHONPATH (no install). Exit status: nonzero if a phase failed.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$ROOT/benchmarks/results/tmp}"
mkdir -p "$OUT/tuning_db"
WORK=$(mktemp -d /tmp/attngen_tune.XXXXXX)

if python3 -c "import optuna, sqlalchemy" 2>/dev/null; then
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  ls shared/wheels/*.whl >/dev/null 2>&1 || { echo "no optuna here and no wheels in shared/wheels/" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/attngen_site shared/wheels/*.whl || exit 2
  export PYTHONPATH="/tmp/attngen_site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi

main() {
  local status=0 t0 rc
  declare -A secs codes
  {
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ local changes)')"
    python3 -c 'import sys, torch, triton, optuna, sqlalchemy; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda); print("triton", triton.__version__); print("optuna", optuna.__version__, "sqlalchemy", sqlalchemy.__version__); print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null || true
  } | tee "$OUT/env.txt"

  # TUNE_EXTRA and the *_SHAPES variables exist for a dry run of this script on a CPU (tiny shapes,
  # the fake GPU and timer of tests/tuning/fakes.py); leave them unset on the GPU.
  local TUNE=(python3 -m attngen.cli tune --device h100 ${TUNE_EXTRA:-})
  local CLI=attngen.cli
  local L=attn_fwd_bf16_hd128_gqa4_causal_sm90 G=attn_fwd_bf16_hd256_gqa2_causal_softcap_sm90
  local LSHAPES=${LSHAPES:-q4096_k4096_bh128,q1024_k1024_bh256} GSHAPES=${GSHAPES:-q4096_k4096_bh32}
  local SHIP_SHAPES=${SHIP_SHAPES:-q8192_k8192_bh32} WORKER_SHAPES=${WORKER_SHAPES:-q2048_k2048_bh128}
  local GRID=$WORK/grid.sqlite TPE=$WORK/tpe.sqlite SHIP=$OUT/tuning_db/attngen.sqlite
  run() {  # run NAME LIMIT_S CMD...: one phase, its seconds and exit code into summary.json
    local name=$1 limit=$2
    shift 2
    if (( SECONDS > 450 )); then
      echo "== $name: skipped, the run is at ${SECONDS} s"
      codes[$name]=skipped
      return
    fi
    echo "== $name ($(date +%T), limit ${limit} s): $*"
    t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$limit" "$@"
    rc=$?
    secs[$name]=$((SECONDS - t0))
    codes[$name]=$rc
    echo "== $name: exit $rc in ${secs[$name]} s"
    [ "$rc" -eq 0 ] || status=1
  }
  # The comparison runs over the Triton TMA forward kernel's space: the sm90-only knobs that
  # TARGET_SPACES adds pinned (tma on, q_regs as the kernel's default, the Gluon kernel's
  # consumers / pair_tiles off: its own space is a handful of configs, too few for a 30 % budget
  # to mean anything) and lazy_rescale at the kernel's default, so the exhaustive grid fits the
  # time; the TPE budget is 30 % of that space's valid configs.
  # compare_args SPEC URI -> "BUDGET --fix F=V ...".
  compare_args() {
    python3 - "$1" "$2" <<'PY'
import dataclasses, sys
from attngen.tuning import space, tuner
t = tuner.plan(tuner.TuneOptions(device="h100", specs=[sys.argv[1]], kernels=sys.argv[2]))[0]
dflt = tuner.default_config(t.spec, "cuda", t.bucket.seqlen_q)
fixed = {k: getattr(dflt, k) for k in space.TARGET_SPACES.get(("fwd", t.spec.target), {})}
fixed.update(tma=True, consumers=0, pair_tiles=False, lazy_rescale=dflt.lazy_rescale)
sp = tuner.space_for(t.spec, fixed)
print(max(1, int(0.3 * tuner.valid_count(t.spec, sp))), *(f"--fix {k}={v}" for k, v in fixed.items()))
PY
  }
  local ARGS_L ARGS_G BL BG PIN_L PIN_G
  read -r -a ARGS_L < <(compare_args specs/llama.yaml "$L")
  read -r -a ARGS_G < <(compare_args specs/gemma2.yaml "$G")
  BL=${ARGS_L[0]:-13}
  BG=${ARGS_G[0]:-9}
  PIN_L=("${ARGS_L[@]:1}")
  PIN_G=("${ARGS_G[@]:1}")
  echo "comparison: $L pins ${PIN_L[*]:-none}, TPE budget $BL; $G pins ${PIN_G[*]:-none}, TPE budget $BG"

  local PHASES=${PHASES:-compare,ship,workers}
  if [[ ,$PHASES, == *,compare,* ]]; then
  # 1. search vs exhaustive (the grid runs first: it compiles every config once for both)
  run grid_llama 200 "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" --shapes "$LSHAPES" \
    --sampler grid --trials 1000 --storage "$GRID" --timeout 185 "${PIN_L[@]}"
  run grid_gemma 130 "${TUNE[@]}" --spec specs/gemma2.yaml --kernels "$G" --shapes "$GSHAPES" \
    --sampler grid --trials 1000 --storage "$GRID" --timeout 115 "${PIN_G[@]}"
  run tpe_llama 80 "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" --shapes "$LSHAPES" \
    --trials "$BL" --storage "$TPE" "${PIN_L[@]}"
  run tpe_gemma 50 "${TUNE[@]}" --spec specs/gemma2.yaml --kernels "$G" --shapes "$GSHAPES" \
    --trials "$BG" --storage "$TPE" "${PIN_G[@]}"
  cp "$GRID" "$OUT/compare_grid.sqlite"; cp "$TPE" "$OUT/compare_tpe.sqlite"  # `db compare` reruns anywhere
  run compare 90 python3 -m $CLI db compare --exhaustive "$GRID" --search "$TPE" --seeds 20 \
    --out "$OUT/compare_search.json"
  fi

  if [[ ,$PHASES, == *,ship,* ]]; then
  # 2. the shipped database: the exhaustive winners, then more kernels and buckets with TPE
  rm -f "$SHIP"
  if [[ ,$PHASES, == *,compare,* ]]; then
    run ship_import 30 bash -c "python3 -m $CLI db export --storage '$GRID' --out '$WORK/grid.json' && \
      python3 -m $CLI db import '$WORK/grid.json' --storage '$SHIP'"
  else
    run ship_llama 80 "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" --shapes "$LSHAPES" \
      --trials 14 --storage "$SHIP" --timeout 65
  fi
  run ship_bwd 90 "${TUNE[@]}" --spec specs/llama.yaml --kernels attn_bwd_bf16_hd128_gqa4_causal_sm90 \
    --shapes "$LSHAPES" --trials 8 --storage "$SHIP" --timeout 75
  run ship_fwd 100 "${TUNE[@]}" --spec specs/llama.yaml --spec specs/mistral.yaml --spec specs/gemma2.yaml \
    --spec specs/phi3.yaml --kernels 'attn_fwd_bf16_*_sm90' --shapes "$SHIP_SHAPES" \
    --trials 6 --storage "$SHIP" --timeout 85
  run ship_show 30 bash -c "python3 -m $CLI db show --storage '$SHIP' && \
    python3 -m $CLI db export --storage '$SHIP' --winners-only --out '$OUT/winners.json'"
  fi

  [[ ,$PHASES, == *,workers,* ]] || { write_summary; echo "done in ${SECONDS} s; results in $OUT"; return $status; }
  # 3. two tuning processes on one storage (one GPU here: they share it, so their timings are
  #    not for keeping; this checks the distributed mode: one winner, no trial lost)
  run workers 50 "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" --shapes "$WORKER_SHAPES" \
    --trials 8 --workers 2 --storage "$WORK/workers.sqlite" --timeout 35
  run workers_export 20 python3 -m $CLI db export --storage "$WORK/workers.sqlite" --out "$OUT/workers.json"

  write_summary
  echo "done in ${SECONDS} s; results in $OUT"
  return $status
}

write_summary() {
  python3 - "$OUT/summary.json" "$SECONDS" <<PY
import json, sys
secs = {$(for k in "${!secs[@]}"; do printf '"%s": %s, ' "$k" "${secs[$k]}"; done)}
codes = {$(for k in "${!codes[@]}"; do printf '"%s": "%s", ' "$k" "${codes[$k]}"; done)}
json.dump({"seconds_total": int(sys.argv[2]), "phase_seconds": secs, "phase_exit": codes},
          open(sys.argv[1], "w"), indent=1)
PY
}

main 2>&1 | tee "$OUT/gpu_tune.log"
exit "${PIPESTATUS[0]}"
