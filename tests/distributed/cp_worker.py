"""One rank of the context-parallel tests (test_cp.py starts `world` of them): gloo over a file
rendezvous, attngen's kernels through Triton's interpreter (--device cuda: NCCL, GPU rank r,
tests/gpu/test_gpu_cp.py). Runs every case of its world
size forward and backward on its shard and saves out, lse and the gradients of its rows to
<out>/rank<r>.pt.

    python3 -m tests.distributed.cp_worker --world 2 --rank 0 --init file:///tmp/x --out /tmp/d
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--only", default="", help="comma-separated case names (default: all of this world size)")
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank raises after joining the group (tests)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args(argv)

    from attngen import env

    env.setup_interpreter()  # before anything imports triton
    if env.interpreting():
        from attngen.interp import patch_interpreter

        patch_interpreter()
    import torch
    import torch.distributed as dist

    import attngen.distributed as agd
    from tests.distributed.cases import cases_for

    torch.set_num_threads(1)
    if a.device == "cuda":
        torch.cuda.set_device(a.rank)
    # a collective whose peer died fails after this long instead of gloo's default 30 minutes
    dist.init_process_group("gloo" if a.device == "cpu" else "nccl", init_method=a.init, rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    results, times = {}, {}
    try:
        if a.rank == a.crash_rank:
            raise RuntimeError("crash requested (--crash-rank)")
        for case in cases_for(a.world):
            if a.only and case.name not in a.only.split(","):
                continue
            t0 = time.perf_counter()
            q, k, v, dout = (x.to(a.device) for x in case.inputs(a.world))
            dim = 2 if case.layout == "bhsd" else 1
            local = [agd.shard(x if case.layout == "bhsd" else x.transpose(1, 2), seq_dim=dim,
                               load_balance=case.load_balance) for x in (q, k, v, dout)]
            ql, kl, vl = (x.detach().requires_grad_(True) for x in local[:3])
            out, lse = agd.attention(ql, kl, vl, layout=case.layout, load_balance=case.load_balance,
                                     cu_seqlens=case.documents(a.world), return_lse=True, **case.kwargs(a.world))
            out.backward(local[3])
            res = {"out": out.detach(), "lse": lse, "dq": ql.grad, "dk": kl.grad, "dv": vl.grad,
                   "unshard": agd.unshard(out.detach(), seq_dim=dim, load_balance=case.load_balance),
                   "positions": agd.positions(case.seqlen(a.world), load_balance=case.load_balance)}
            results[case.name] = {n: x.cpu() for n, x in res.items()}
            times[case.name] = time.perf_counter() - t0
        torch.save({"results": results, "times": times}, f"{a.out}/rank{a.rank}.pt")
        # no rank tears its group down while another still works: a peer that exits closes its
        # gloo connections, and a rank still between its last collective and its save (seconds in
        # the interpreter) died of that once under CI's load ("terminate called without an active
        # exception", session 64)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
