"""A/B (GPU): the forward's per-tile test of a mask with a parameter gathered along the keys
(`doc[q_idx] == doc[kv_idx]`: attngen.codegen.exprcode.needs_tile_skip's gathered-parameter rule,
tile bounds from the parameter's values along the tile) against the same kernel without it (every
tile of the key range masked), alternated in one process; FlexAttention beside them.

    python3 benchmarks/tools/expr_tile_skip_ab.py > ab.json
"""
import json

import torch
import triton

import attngen
from attngen.codegen import exprcode
from attngen.runtime import api, loader

_ON = exprcode.needs_tile_skip


def _off(n, var):
    """The rule before gathered parameters: only an `or` or a condition over var."""
    for m in exprcode.walk(n):
        if isinstance(m, exprcode.BoolOp) and m.op == "or" and exprcode.uses(m, var):
            return True
        if isinstance(m, (exprcode.IfExp, exprcode.Not)) and exprcode.uses(m, var):
            return True
    return False


def rows(dev, S=8192):
    docs8 = (torch.arange(S, device=dev) // 1024).to(torch.int32)
    ragged = torch.repeat_interleave(torch.arange(6, device=dev, dtype=torch.int32),
                                     torch.tensor([300, 2900, 700, 1800, 1500, 992], device=dev))
    dw = (torch.arange(S, device=dev) // 1500).to(torch.int32)
    return [
        ("docs8_causal_8k", lambda b, h, q, k: (docs8[q] == docs8[k]) & (k <= q)),
        ("docs6_ragged_causal_8k", lambda b, h, q, k: (ragged[q] == ragged[k]) & (k <= q)),
        ("document_window_8k", lambda b, h, q, k: (dw[q] == dw[k]) & (k <= q) & (q - k < 512)),
    ]


def main():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    dev = torch.device("cuda")
    out = {"gpu": torch.cuda.get_device_name(), "rows": []}
    B, Hq, Hkv, S, D = 1, 32, 8, 8192, 128
    torch.manual_seed(0)
    q = torch.randn(B, Hq, S, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    for name, mm in rows(dev, S):
        bm = create_block_mask(mm, B, None, S, S, device=dev)
        with torch.no_grad():
            ref = flex(q, k, v, block_mask=bm, enable_gqa=True)
            row = {"name": name, "flex_fwd_ms": triton.testing.do_bench(
                lambda: flex(q, k, v, block_mask=bm, enable_gqa=True), warmup=25, rep=100)}
            for rnd in range(2):
                for label, rule in (("off", _off), ("on", _ON)):
                    exprcode.needs_tile_skip = rule
                    api.clear_plans()
                    loader.load.cache_clear()  # the module renders again, with the rule
                    o = attngen.attention(q, k, v, mask_mod=mm)
                    row[f"{label}_max_diff_vs_flex"] = (o.float() - ref.float()).abs().max().item()
                    ms = triton.testing.do_bench(lambda: attngen.attention(q, k, v, mask_mod=mm), warmup=25, rep=100)
                    row.setdefault(f"{label}_fwd_ms", []).append(ms)
        exprcode.needs_tile_skip = _ON
        api.clear_plans()
        for label in ("off", "on"):
            row[f"{label}_best_ms"] = min(row[f"{label}_fwd_ms"])
        row["on_vs_off"] = row["off_best_ms"] / row["on_best_ms"]
        row["on_vs_flex"] = row["flex_fwd_ms"] / row["on_best_ms"]
        print(json.dumps(row), flush=True)
        out["rows"].append(row)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
