"""A/B (GPU): the paged prefill's copy-engine path (PrefillPagedConfig.tma) against the pointer
gather on the rows of `attngen bench --mode prefill-paged` whose default keeps the gather (GQA-packed
tiles, hd64), pages of 64 tokens, the two alternated in one process; median of do_bench (ms).

    python3 benchmarks/tools/prefill_paged_tma_ab.py > ab.jsonl
"""
import dataclasses
import json

import torch

from attngen.bench import prefill_paged as pp
from attngen.families import family
from attngen.runtime import api


def main():
    fam = family("prefill_paged")
    orig = fam.default
    print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
    for case in pp.CASES:
        fn = pp._providers(case, torch.bfloat16, torch.device("cuda"))["attngen-paged64"]
        row = {"case": case.name}
        outs = {}
        for rep in range(2):
            for tma in (False, True):
                object.__setattr__(fam, "default", lambda *a, _t=tma, **k: dataclasses.replace(orig(*a, **k), tma=_t))
                api.clear_plans()
                outs[tma] = fn().float()
                ms = pp._do_bench(fn, {"warmup_ms": 25, "rep_ms": 200})
                row.setdefault(f"tma{int(tma)}_ms", []).append(round(ms, 4))
        object.__setattr__(fam, "default", orig)
        row["max_diff"] = (outs[True] - outs[False]).abs().max().item()
        row["flops"] = case.flops
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
