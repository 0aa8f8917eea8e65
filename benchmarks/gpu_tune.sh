#!/usr/bin/env bash
# The tuning run on an H100/H200 (every phase has its own time limit, and no phase starts after
# $LATEST_START s, default 450; a device call of 600 s fits one of the PHASES lines below):
#
#   benchmarks/gpu_tune.sh            # writes into $OUT (default benchmarks/results/tmp)
#
#   1. search vs exhaustive over each kernel's whole search space (PHASES=grid,search: about 4-5
#      minutes with the configs compiled ahead by all cores but two): `attngen tune --sampler grid`
#      on 3 shapes (llama hd128 causal 4k x 128 heads, 1k x 256; gemma2 hd256 causal+softcap
#      4k x 32), then TPE with 30 % of the valid configs per shape -> compare_grid.sqlite,
#      compare_tpe.sqlite; `attngen db compare` on them (phase compare_db, or on any machine)
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
  # LSHAPES / GSHAPES set to "none" leave that kernel out of the comparison
  local LSHAPES=${LSHAPES:-q4096_k4096_bh128,q1024_k1024_bh256} GSHAPES=${GSHAPES:-q4096_k4096_bh32}
  local SHIP_SHAPES=${SHIP_SHAPES:-q8192_k8192_bh32} WORKER_SHAPES=${WORKER_SHAPES:-q2048_k2048_bh128}
  local GRID=$WORK/grid.sqlite TPE=$WORK/tpe.sqlite SHIP=$OUT/tuning_db/attngen.sqlite
  run() {  # run NAME LIMIT_S CMD...: one phase, its seconds and exit code into summary.json
    local name=$1 limit=$2
    shift 2
    if (( SECONDS > ${LATEST_START:-450} )); then
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
  # The comparison runs over each kernel's whole search space, the one `attngen tune` searches
  # (hd128: the Triton pointer and TMA kernels and the Gluon kernels, 292 valid configs; hd256:
  # 184), and gives TPE 30 % of its valid configs. budget SPEC URI -> that number.
  budget() {
    python3 - "$1" "$2" <<'PY'
import sys
from attngen.tuning import targets
t = targets.plan(targets.TuneOptions(device="h100", specs=[sys.argv[1]], kernels=sys.argv[2]))[0]
print(max(1, int(0.3 * targets.valid_count(t.spec, targets.space_for(t.spec)))))
PY
  }
  local BL BG
  BL=$(budget specs/llama.yaml "$L")
  BG=$(budget specs/gemma2.yaml "$G")
  echo "comparison over the whole spaces: TPE budget $BL ($L), $BG ($G)"

  # PHASES: compare = grid + search + compare_db (the comparison itself replays samplers on the
  # CPU for minutes: `attngen db compare` runs on any machine from the two databases). GRID_DB /
  # TPE_DB name databases to continue (a grid cut by its time limit resumes; measured configs are
  # not measured again)
  local PHASES=${PHASES:-compare,ship,workers}
  [[ ,$PHASES, == *,compare,* ]] && PHASES="$PHASES,grid,search,compare_db"
  [ -n "${GRID_DB:-}" ] && cp "$GRID_DB" "$GRID"
  [ -n "${TPE_DB:-}" ] && cp "$TPE_DB" "$TPE"
  local CW=(--compile-workers $(( $(nproc) > 4 ? $(nproc) - 2 : 2 )))  # all cores but two compile
  if [[ ,$PHASES, == *,grid,* ]]; then
  # 1. search vs exhaustive (the grid runs first: its compile processes put every config into
  #    Triton's cache, so the search after it measures without compiling)
  [ "$LSHAPES" = none ] || run grid_llama "${GRID_LLAMA_S:-300}" "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" \
    --shapes "$LSHAPES" --sampler grid --trials 1000 --storage "$GRID" --resume "${CW[@]}" \
    --timeout $(( ${GRID_LLAMA_S:-300} - 15 ))
  [ "$GSHAPES" = none ] || run grid_gemma "${GRID_GEMMA_S:-160}" "${TUNE[@]}" --spec specs/gemma2.yaml --kernels "$G" \
    --shapes "$GSHAPES" --sampler grid --trials 1000 --storage "$GRID" --resume "${CW[@]}" \
    --timeout $(( ${GRID_GEMMA_S:-160} - 15 ))
  cp "$GRID" "$OUT/compare_grid.sqlite"
  CW=(--compile-workers 0)
  fi
  if [[ ,$PHASES, == *,search,* ]]; then
  [ "$LSHAPES" = none ] || run tpe_llama 100 "${TUNE[@]}" --spec specs/llama.yaml --kernels "$L" --shapes "$LSHAPES" \
    --trials "$BL" --storage "$TPE" --timeout 85 "${CW[@]}"
  [ "$GSHAPES" = none ] || run tpe_gemma 60 "${TUNE[@]}" --spec specs/gemma2.yaml --kernels "$G" --shapes "$GSHAPES" \
    --trials "$BG" --storage "$TPE" --timeout 45 "${CW[@]}"
  cp "$TPE" "$OUT/compare_tpe.sqlite"  # `db compare` reruns anywhere
  fi
  if [[ ,$PHASES, == *,compare_db,* ]]; then
  run compare 120 python3 -m $CLI db compare --exhaustive "$GRID" --search "$TPE" --seeds 20 \
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
