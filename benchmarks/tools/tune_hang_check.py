"""The tuner against a real deadlock on an sm90 GPU (benchmarks/results/h200_tune_hang_2026-12-04.log):
the validity filter is relaxed to let the Gluon dQ pass's one-slot ring (dq_num_stages=1, which
never finishes) back in, and HANG_S is 10 s. The seeded search proposes that config second; the
run must stop with exit status 1 and a failed trial, and a second run with --resume must finish
without running it again.
  python3 benchmarks/tools/tune_hang_check.py DB; python3 benchmarks/tools/tune_hang_check.py DB --resume"""
import sys
from attngen.families import bwd
from attngen.tuning import objective

from attngen.cli import main

orig = bwd.check_ws_bwd


def relaxed(spec, cfg):
    why = orig(spec, cfg)
    return None if why and why.startswith("dq_consumers: dq_num_stages") else why


bwd.check_ws_bwd = relaxed
objective.HANG_S = 10.0
sys.exit(main(["tune", "--device", "h100", "--spec", "specs/llama.yaml", "--family", "bwd",
               "--kernels", "attn_bwd_bf16_hd128_gqa4_causal_sm90", "--shapes", "q1024_k1024_bh256",
               "--trials", "4", "--compile-workers", "0", "--storage", sys.argv[1], *sys.argv[2:]]))
