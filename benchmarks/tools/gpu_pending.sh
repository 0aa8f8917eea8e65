#!/usr/bin/env bash
# The GPU runs issue 48 still owes (docs/notes.md, session 58), one step per argument, each sized
# for one device call; everything goes to $OUT (default benchmarks/results/tmp/), logs whole.
#
#   benchmarks/tools/gpu_pending.sh ab-hd192      # ~90 s: hd192's backward, the new default (split roles
#                                                 # + Gluon dQ) against the Triton passes it replaced
#   benchmarks/tools/gpu_pending.sh dq-lpt        # ~120 s: the Gluon dQ pass in LPT order (tile_order)
#   benchmarks/tools/gpu_pending.sh ima           # ~150-400 s: the 20,000-document case beside a memory hog,
#                                                 # plain and under compute-sanitizer memcheck
#   benchmarks/tools/gpu_pending.sh ima-concurrent  # ~120 s: the same case in four processes at once, 3 rounds
#   benchmarks/tools/gpu_pending.sh sanitize      # 300+ s (cold compiles under memcheck): the grid's forced paths (a sample)
#   benchmarks/tools/gpu_pending.sh sanitize-suites  # ~400 s (compiles under memcheck are slow): the decode
#                                                 # and fp8 GPU suites under memcheck
#   benchmarks/tools/gpu_pending.sh bench-hd192   # ~60 s: the bench's hd192 row on this tree
#   benchmarks/tools/gpu_pending.sh tune-mha-decode  # ~260 s: winners for the MHA hd128 decode kernels
#                                                 # (specs/llama2.yaml) at the bench's two MHA buckets, into
#                                                 # a copy of the shipped database ($OUT/attngen.sqlite);
#                                                 # needs optuna / SQLAlchemy (their wheels, as gpu_tune.sh)
#   benchmarks/tools/gpu_pending.sh tune-hd64-decode  # ~150 s: the same for the hd64 GQA 32/8 decode kernel
#                                                 # (specs/llama3_2_1b.yaml) at the bench's hd64 bucket
#   benchmarks/tools/gpu_pending.sh tune-b1-decode  # ~150 s: the GQA 32/8 hd128 B1 buckets again, with 64
#                                                 # splits in the space (four programs per SM)
#   benchmarks/tools/gpu_pending.sh decode-splits  # ~60 s: decode split counts by rule (ceil / floor /
#                                                 # balanced per SM) against the runtime's, 8 shapes
#   benchmarks/tools/gpu_pending.sh bench-decode-db  # ~90 s: the decode bench reading the tune steps'
#                                                 # database ($TUNE_DB, default $OUT/attngen.sqlite)
#
# Steps run in the order given. Exit status: nonzero if any step failed. The fp8 bench's cuDNN
# column needs nvidia-cudnn-frontend, which the device image lacks: carry its wheel (docs/notes.md).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/benchmarks/results/tmp}"
mkdir -p "$OUT"
# the tune steps' database (a copy of the shipped one unless it exists) and the one bench-decode-db reads
DB="${TUNE_DB:-$OUT/attngen.sqlite}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/env.txt"
git log --oneline -1 >> "$OUT/env.txt" 2>/dev/null

# the Triton passes hd192 ran before session 58 (default_bwd_config's d > 128 table) and
# WS_BWD_ROLES_DQ, its default since; --config keeps every field it does not name from the default
OLD_HD192=32,64,4,2,64,64,4,2,split_dkdv=True,consumers=0,dq_consumers=0,roles=False
NEW_HD192=64,64,4,2,128,64,4,2,consumers=2,roles=True,dq_consumers=2,split_dkdv=False

hog() {  # a process holding all but $1 GiB of the GPU's memory, for $2 seconds
  python3 - "$1" "$2" <<'PY' &
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(max(free - (int(sys.argv[1]) << 30), 0), dtype=torch.uint8, device="cuda")
print(f"hog: {x.numel() / 2**30:.1f} GiB held", flush=True)
time.sleep(float(sys.argv[2]))
PY
  HOG=$!
  sleep 8
}

status=0
for step in "$@"; do
  start=$SECONDS
  case "$step" in
    ab-hd192)
      python3 benchmarks/tools/bwd_ab.py --out "$OUT/ab_bwd_hd192.json" --cases 8 --rounds 2 --kernel-times \
        --config "$OLD_HD192" --config "$NEW_HD192" 2>&1 | tee "$OUT/ab_bwd_hd192.log"; rc=${PIPESTATUS[0]} ;;
    dq-lpt)
      python3 benchmarks/tools/bwd_ab.py --out "$OUT/ab_bwd_dq_lpt.json" --cases 2,0 --rounds 2 --kernel-times \
        --switch tile_order=grouped,lpt 2>&1 | tee "$OUT/ab_bwd_dq_lpt.log"; rc=${PIPESTATUS[0]} ;;
    ima)
      # 12 GiB left: the case needs about 4 (inputs, gradients, the float32 references of 2,000 documents)
      hog 12 400
      python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_gpu_edges.py -k 20000_documents \
        2>&1 | tee "$OUT/ima_plain.log"; rc=${PIPESTATUS[0]}
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 50 \
        python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_gpu_edges.py -k 20000_documents \
        2>&1 | tee "$OUT/ima_memcheck.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      kill "$HOG" 2>/dev/null; wait "$HOG" 2>/dev/null ;;
    ima-concurrent)
      # the case in four processes at once, three rounds: the two failures so far came with eight
      # test processes time-slicing the GPU, none with the case alone
      rc=0
      for round in 1 2 3; do
        pids=()
        for w in 1 2 3 4; do
          python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_edges.py -k 20000_documents \
            > "$OUT/ima_concurrent_r${round}_p${w}.log" 2>&1 &
          pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || rc=1; done
        echo "round $round: $(grep -h -E 'passed|failed' "$OUT"/ima_concurrent_r${round}_p*.log | tr '\n' ' ')"
      done 2>&1 | tee "$OUT/ima_concurrent.txt"
      grep -q failed "$OUT/ima_concurrent.txt" && rc=1 ;;
    sanitize)
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 20 --target-processes all \
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_grid.py \
        -k "test_forced_path and (hd72- or hd64- or hd192- or hd203-)" 2>&1 | tee "$OUT/sanitizer_grid.log"
      rc=${PIPESTATUS[0]} ;;
    sanitize-suites)
      # the decode and fp8 GPU suites under memcheck. Without the caching allocator (so a read past
      # a tensor is not hidden inside a cached block) but for the CUDA-graph tests: capture needs the
      # caching allocator (without it torch.empty calls cudaMalloc inside the capture, which CUDA
      # refuses: error 900, a failure of the test, not of a kernel)
      S="compute-sanitizer --tool memcheck --print-limit 20 --target-processes all"
      SUITES="tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_fp8.py tests/gpu/test_gpu_fp8_ws.py"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 $S python3 -m pytest -v -m gpu -p no:cacheprovider $SUITES -k "not graph" \
        2>&1 | tee "$OUT/sanitizer_suites.log"; rc=${PIPESTATUS[0]}
      $S python3 -m pytest -v -m gpu -p no:cacheprovider $SUITES -k graph 2>&1 | tee "$OUT/sanitizer_suites_graphs.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    bench-hd192)
      python3 -m attngen.cli bench --mode both --cases causal-hd192-4k --providers attngen,cudnn,flex \
        --out "$OUT/bench_hd192.json" 2>&1 | tee "$OUT/bench_hd192.log"; rc=${PIPESTATUS[0]} ;;
    tune-mha-decode)
      [ -f "$DB" ] || cp tuning_db/attngen.sqlite "$DB"
      timeout 260 python3 -m attngen.cli tune --device auto --spec specs/llama2.yaml --family decode \
        --kernels 'attn_decode_bf16_hd128_gqa1_causal_sm90' --shapes q1_k32768_bh32,q1_k8192_bh256 \
        --trials 24 --storage "$DB" 2>&1 | tee "$OUT/tune_mha_decode.log"
      rc=${PIPESTATUS[0]} ;;
    tune-hd64-decode)
      [ -f "$DB" ] || cp tuning_db/attngen.sqlite "$DB"
      timeout 150 python3 -m attngen.cli tune --device auto --spec specs/llama3_2_1b.yaml --family decode \
        --kernels 'attn_decode_bf16_hd64_gqa4_causal_sm90' --shapes q1_k32768_bh256 \
        --trials 16 --storage "$DB" 2>&1 | tee "$OUT/tune_hd64_decode.log"
      rc=${PIPESTATUS[0]} ;;
    tune-b1-decode)
      [ -f "$DB" ] || cp tuning_db/attngen.sqlite "$DB"
      timeout 150 python3 -m attngen.cli tune --device auto --family decode \
        --kernels 'attn_decode_bf16_hd128_gqa4_causal_sm90' --shapes q1_k131072_bh32,q1_k32768_bh32 \
        --trials 12 --storage "$DB" 2>&1 | tee "$OUT/tune_b1_decode.log"
      rc=${PIPESTATUS[0]} ;;
    decode-splits)
      python3 benchmarks/tools/decode_splits_ab.py --rounds 2 --out "$OUT/ab_decode_splits.json" 2>&1 \
        | tee "$OUT/ab_decode_splits.log"; rc=${PIPESTATUS[0]} ;;
    bench-decode-db)
      # the decode bench with the winners the tune steps above wrote to $OUT/attngen.sqlite
      ATTNGEN_DB="$DB" python3 -m attngen.cli bench --mode decode \
        --out "$OUT/bench_decode.json" 2>&1 | tee "$OUT/bench_decode.log"; rc=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step (ab-hd192 | dq-lpt | ima | ima-concurrent | sanitize | sanitize-suites | bench-hd192 | tune-mha-decode | tune-hd64-decode | tune-b1-decode | decode-splits | bench-decode-db)" >&2; status=2; continue ;;
  esac
  echo "$step: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
