"""Launch configs of expression kernels on rows of `attngen bench --mode mods` (GPU): each
candidate forward / backward config forced (attngen.runtime.dispatch.forced_config) on the row's
mask_mod / score_mod, forward and forward+backward times (median of do_bench) beside
FlexAttention's on the same tensors, in one process. What the defaults of expression kernels
(attngen.families.fwd / bwd: `expr` tables) are chosen from.

    python3 benchmarks/tools/expr_config_sweep.py [--bwd] [ROW ...] > sweep.jsonl   (--bwd: backward configs only)
"""
import json
import sys

import torch
import triton

import attngen
from attngen.bench import mods
from attngen.families.bwd import BwdConfig
from attngen.families.fwd import FwdConfig
from attngen.runtime import api, dispatch

FWD = {
    128: [FwdConfig(64, 64, 4, 3, tma=True, q_regs=True), FwdConfig(128, 64, 8, 2, tma=True),
          FwdConfig(128, 128, 8, 2, tma=True), FwdConfig(128, 64, 8, 3, tma=True, q_regs=True)],
    256: [FwdConfig(64, 64, 4, 3, tma=True, lazy_rescale=True), FwdConfig(128, 64, 8, 2, tma=True),
          FwdConfig(64, 64, 4, 2, tma=True)],
    64: [FwdConfig(64, 64, 4, 3, tma=True, q_regs=True), FwdConfig(128, 64, 8, 3, tma=True),
         FwdConfig(128, 128, 8, 2, tma=True)],
}
BWD = {
    128: [BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, tma=True), BwdConfig(64, 128, 8, 2, 128, 64, 8, 3, tma=True),
          BwdConfig(32, 128, 8, 2, 128, 64, 8, 3, tma=True), BwdConfig(32, 64, 4, 2, 128, 64, 8, 3, tma=True),
          BwdConfig(64, 128, 8, 2, 128, 128, 8, 2, tma=True), BwdConfig(64, 64, 4, 3, 64, 64, 4, 2, tma=True),
          BwdConfig(64, 128, 8, 2, 128, 64, 8, 3, tma=True, split_dkdv=True)],
    256: [BwdConfig(32, 64, 4, 2, 64, 64, 4, 2, tma=True, split_dkdv=True),
          BwdConfig(64, 64, 8, 2, 64, 64, 4, 2, tma=True, split_dkdv=True),
          BwdConfig(32, 128, 8, 2, 64, 64, 4, 2, tma=True, split_dkdv=True),
          BwdConfig(64, 128, 8, 1, 64, 64, 4, 2, tma=True, split_dkdv=True),
          BwdConfig(64, 64, 8, 2, 128, 64, 8, 2, tma=True, split_dkdv=True),
          BwdConfig(32, 64, 4, 2, 64, 64, 4, 2, tma=True)],
}
# the warp-specialized Gluon forward (expressions since 2026-12-06; not where a parameter is
# subscripted by a tile index: families/fwd.py _gathers)
FWD[128] += [FwdConfig(128, 64, 4, 2, tma=True, consumers=2), FwdConfig(128, 128, 4, 2, tma=True, consumers=2)]
FWD[64] += [FwdConfig(128, 64, 4, 2, tma=True, consumers=2), FwdConfig(128, 128, 4, 2, tma=True, consumers=2)]
FWD[256] += [FwdConfig(128, 64, 4, 2, tma=True, consumers=2)]
BWD[64] = list(BWD[128])
# the warp-specialized Gluon passes (expressions since 2026-12-06): both, the dK/dV pass alone, and
# the split roles (hd256); dq_consumers needs a call without sinks or learnable parameters
WS = [BwdConfig(64, 128, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, dq_consumers=2),
      BwdConfig(64, 128, 4, 2, 128, 64, 8, 3, tma=True, consumers=2),
      BwdConfig(64, 64, 4, 2, 128, 64, 4, 3, tma=True, consumers=2, roles=True, dq_consumers=2)]
BWD[128] = BWD[128] + WS
BWD[64] = BWD[64] + WS
BWD[256] = BWD[256] + [BwdConfig(64, 64, 4, 2, 64, 64, 4, 2, tma=True, consumers=2, roles=True)]


def _ms(fn, rep=60):
    return triton.testing.do_bench(fn, warmup=10, rep=rep)


def main(names):
    kinds = ("bwd",) if "--bwd" in names else ("fwd", "bwd")
    names = [n for n in names if n != "--bwd"]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    flex = torch.compile(flex_attention, dynamic=False)
    dev = torch.device("cuda")
    print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
    for name, B, Hq, Hkv, S, D, kind in mods.ROWS:
        if names and name not in names:
            continue
        torch.manual_seed(0)
        q = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        mask_mod, score_mod, sinks = mods._mods(kind, B, Hq, S, dev)
        g = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16)
        call = lambda: attngen.attention(q, k, v, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)  # noqa: E731
        both = lambda f: (lambda: torch.autograd.grad(f(), (q, k, v), g))  # noqa: E731
        row = {"name": name}
        try:
            bm = create_block_mask(mask_mod, B, None, S, S, device=dev) if mask_mod is not None else None
            fcall = lambda: flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=Hq != Hkv)  # noqa: E731
            with torch.no_grad():
                row["flex_fwd_ms"] = _ms(fcall)
            row["flex_fwdbwd_ms"] = _ms(both(fcall))
        except Exception as e:  # noqa: BLE001
            row["flex_error"] = str(e)[:200]
        ref = call().float()
        for kind_, table, fam in (("fwd", FWD, "fwd"), ("bwd", BWD, "bwd")):
            if kind_ not in kinds:
                continue
            res = []
            api.clear_plans()  # the default first: what the runtime picks for this call
            with (torch.no_grad() if kind_ == "fwd" else torch.enable_grad()):
                ms = _ms(call if kind_ == "fwd" else both(call))
            ex = attngen.explain(q, k, v, mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)
            dflt = ex["config"] if kind_ == "fwd" else (ex.get("backward") or {}).get("config")
            res.append({"cfg": "default", "default_cfg": dflt, "ms": round(ms, 4)})
            print(json.dumps({"row": name, kind_: res[-1]}), flush=True)
            for cfg in table[D]:
                api.clear_plans()
                try:
                    with dispatch.forced_config(**{fam: cfg}):
                        out = call()
                        err = (out.float() - ref).abs().max().item()
                        if kind_ == "fwd":
                            with torch.no_grad():
                                ms = _ms(call)
                        else:
                            ms = _ms(both(call))
                    res.append({"cfg": cfg.as_dict(), "ms": round(ms, 4), "max_diff": err})
                except Exception as e:  # noqa: BLE001 -- a config that fails is recorded
                    res.append({"cfg": cfg.as_dict(), "error": f"{type(e).__name__}: {str(e)[:160]}"})
                print(json.dumps({"row": name, kind_: res[-1]}), flush=True)
            row[kind_] = res
        api.clear_plans()
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
