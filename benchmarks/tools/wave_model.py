"""How long the Gluon dK/dV pass's programs keep the GPU busy in launch order (CPU only): a model,
not a measurement. Each program (one KV head's BLOCK_N keys) costs the query blocks it sees times
the GQA group; the SMs take programs in launch order, one at a time each (the pass's shared
memory allows one program per SM), a free SM the next one. Prints the makespan over the ideal
(the total work spread evenly) for the program orders of the codegen option dkdv_order:
"grouped" (each KV head's key blocks side by side, heaviest first) and "lpt" (every head's
heaviest block first), and "chunksK" (the key blocks in K chunks, grouped inside each chunk) for
comparison. Causal masks, square sequences.

    python3 benchmarks/tools/wave_model.py --sms 132 --case 1,8,4,8192 --case 4,16,1,4096
"""

from __future__ import annotations

import argparse
import heapq


def makespan(works: list[int], sms: int) -> int:
    """The finish time of the last SM when `sms` SMs take the programs in order."""
    free = [0] * sms
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def orders(kv_heads: int, gqa: int, seqlen: int, block_n: int = 128, block_m: int = 64) -> dict[str, list[int]]:
    """Per-program work (query blocks x GQA) in each launch order, causal."""
    nkb, step = seqlen // block_n, block_n // block_m
    nq = nkb * step

    def work(n: int) -> int:
        return gqa * (nq - step * n)

    out = {"grouped": [work(n) for _ in range(kv_heads) for n in range(nkb)],
           "lpt": [work(n) for n in range(nkb) for _ in range(kv_heads)]}
    for k in (2, 4, 8):
        c = max(nkb // k, 1)
        out[f"chunks{k}"] = [work(n) for lo in range(0, nkb, c) for _ in range(kv_heads) for n in range(lo, min(lo + c, nkb))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--case", action="append", default=[],
                    help="B,Hq,GQA,S (default: the bwd_ab cases GQA 32/8 S8192 and B4 H16 S4096)")
    args = ap.parse_args()
    for case in args.case or ["1,32,4,8192", "4,16,1,4096"]:
        b, hq, gqa, s = map(int, case.split(","))
        runs = orders(b * hq // gqa, gqa, s)
        ideal = sum(runs["grouped"]) / args.sms
        print(f"B{b} Hq{hq} GQA{gqa} S{s}: " + ", ".join(
            f"{name} {makespan(w, args.sms) / ideal:.3f}" for name, w in runs.items()))


if __name__ == "__main__":
    main()
